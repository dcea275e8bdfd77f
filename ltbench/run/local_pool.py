"""Runs on this machine: one after another in this process, or a pool of worker processes.

A pool worker is ``python -m ltbench.runner RUN_DIR/spec.json`` in a subprocess of its own, pinned to a
GPU slot and given its share of the cores this process may use (``worker_env``). SIGTERM to the launcher is handled like Ctrl-C (the
workers are stopped, their runs resume at the next launch), and on Linux a worker dies with its
launcher, even one killed by kill -9. Which runs to start is decided by ``ltbench.run.launch``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ltbench.results import store
from ltbench.results.provenance import THREADS_ENV, usable_cores
from ltbench.run.progress import ProgressBoard, finished_line
from ltbench.run.screen import MessageStream, epoch_lines
from ltbench.recipe import run_label
from ltbench.runner import CLAIMED, EXIT_CODES, FINISHED_ELSEWHERE, failure_line, prepare_run_dir, run_one
from ltbench.results.runspec import RunSpec


def run_local(specs: list[RunSpec], jobs: int = 1, redo: tuple[str, ...] = ()) -> list[RunSpec]:
    """Run specs one after another in this process, or in ``jobs`` worker processes. Returns the
    specs another process was running (skipped here). On a terminal the run's state line (and, with
    several runs, the overall line) stays at the bottom, drawn by the one writer of the terminal
    (``owned_terminal``); elsewhere each line is printed as it comes."""
    if jobs > 1 and len(specs) > 1:
        return run_pool(specs, jobs, redo)
    board = ProgressBoard(1, tty=wants_display(specs), total=len(specs))
    if not board.tty:
        return _run_in_process(specs, redo, print, None)
    with owned_terminal(board, every_s=0.25):
        return _run_in_process(specs, redo, board.write, board)


def _run_in_process(specs: list[RunSpec], redo: tuple[str, ...], write, board: ProgressBoard | None) -> list[RunSpec]:
    """The runs one after another here: a header line per run, its engine's lines, how it ended."""
    elsewhere = []
    for i, spec in enumerate(specs, 1):
        c = spec.config
        write(f"[{i}/{len(specs)}] {run_label(spec)} on {c['data']['name']} seed {c['seed']} ({spec.run_id})")
        if board is not None:
            board.start(0, spec, run_label(spec))
        quiet = board is None and not epoch_lines(False)  # plain lines: the engine's epoch lines with --verbose only
        status = run_one(spec, say=lambda msg: None if quiet and msg.startswith("epoch ") else write(f"  {msg}"),
                         redo=redo)
        line = {"done": finished_line(spec, run_label(spec), status),
                "failed": f"  FAILED: {failure_line(Path(spec.run_dir))}",
                FINISHED_ELSEWHERE: "  already finished by another process"}.get(status)
        if status in (CLAIMED, FINISHED_ELSEWHERE):
            elsewhere.append(spec)
        if board is not None:
            board.finish(0, line, status)
        elif line:
            write(line)
    return elsewhere


@contextlib.contextmanager
def owned_terminal(board: ProgressBoard, every_s: float | None = None):
    """While the board shows state lines on a terminal, sys.stdout / sys.stderr print through it
    (``screen.MessageStream``), so a plugin's print or a warning comes out as a whole line above the state
    lines, never inside them; ``every_s``: a thread also redraws the board that often (a run training in
    this process, whose loop cannot poll). The board is erased on the way out. Off a terminal: nothing."""
    if not board.tty:
        yield board
        return
    stop = threading.Event()

    def redraw() -> None:
        while not stop.wait(every_s):
            try:
                board.poll()
            except Exception:  # a half-written file, a run folder removed: the next poll reads again
                pass

    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = stream = MessageStream(board.screen)
    thread = threading.Thread(target=redraw, name="ltbench-progress", daemon=True)
    if every_s is not None:
        thread.start()
    try:
        yield board
    finally:
        stop.set()
        if every_s is not None:
            thread.join()
        stream.close_line()
        sys.stdout, sys.stderr = saved
        board.close()


def wants_display(specs: list[RunSpec]) -> bool | None:
    """None (the live display when stdout and stderr are a terminal) unless every run says ``train.progress: false``,
    which asks for plain lines instead (False)."""
    return None if any(s.config.get("train", {}).get("progress", True) for s in specs) else False


class Terminated(KeyboardInterrupt):
    """SIGTERM received: handled like Ctrl-C (workers stopped, 'run again to resume')."""


def _raise_terminated(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM raises Terminated (a KeyboardInterrupt) while launching, so claims are released, pool
    workers stopped and the CLI says 'run again to resume' (only the main thread can set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _die_with_parent() -> None:
    """In a pool worker, before exec (Linux): the kernel sends it SIGTERM when the launcher dies,
    even by kill -9, so no orphan keeps training a run nobody waits for."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except Exception:
        pass


def _stop_workers(running: list, grace_s: float = 10.0, write=print) -> None:
    """SIGTERM every live worker, then SIGKILL what is left after ``grace_s``. A killed run keeps
    its last checkpoint and its lock dies with it, so the next launch resumes it. Every worker still
    counted as running is named, also one the terminal's Ctrl-C (SIGINT to the whole process group)
    ended first. ``write``: the board's, so the messages come out whole above the state lines."""
    if not running:
        return
    live = [item for item in running if item[0].poll() is None]
    if live:
        write(f"stopping {len(live)} worker(s) (SIGTERM, then SIGKILL after {grace_s:g} s)")
    for proc, *_ in live:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc, *_ in live:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    write(f"stopped {len(running)} worker(s): {', '.join(spec.run_id for _, spec, *_ in running)}; their runs "
          f"resume from their last checkpoint at the next launch")


def pool_size(jobs: int, runs_per_gpu: int, gpus: list[str]) -> int:
    """Workers at once: ``jobs``, or ``runs_per_gpu`` on each visible GPU when that is asked for."""
    return len(gpus) * runs_per_gpu if runs_per_gpu > 1 and gpus else jobs


def gpu_slots(workers: int, gpus: list[str]) -> list[str | None]:
    """The CUDA_VISIBLE_DEVICES of each worker slot: GPUs round-robin (slot s on gpus[s % len(gpus)]), so
    with ``workers`` = GPUs x k every GPU holds k runs; None for every slot when there is no GPU."""
    return [gpus[slot % len(gpus)] if gpus else None for slot in range(workers)]


def run_pool(specs: list[RunSpec], jobs: int, redo: tuple[str, ...] = (), devices: list | None = None) -> list[RunSpec]:
    """A DomainBed-style pool: ``jobs`` workers (``python -m ltbench.runner spec.json``), worker slot s
    pinned to ``devices[s]`` (by default the visible GPUs round-robin, ``gpu_slots``) and given its share
    of the CPU threads; output in the run directory, progress (epoch, loss, img/s, ETA per slot) on the
    terminal (``ltbench.run.progress``). A slot keeps its GPU for every run it takes, so each GPU holds at most
    its share of runs at once. Ctrl-C or SIGTERM to this process stops the workers too. Returns the specs
    run elsewhere."""
    devices = devices if devices is not None else gpu_slots(jobs, visible_gpus())
    queue, running, elsewhere = list(specs), [], []
    free_slots = list(range(jobs))
    board = ProgressBoard(jobs, tty=wants_display(specs), total=len(specs))
    with sigterm_as_interrupt(), owned_terminal(board):
        try:
            while queue or running:
                while queue and free_slots:
                    slot, spec = free_slots.pop(0), queue.pop(0)
                    running.append((_start_worker(spec, slot, jobs, redo, devices[slot], board.write), spec, slot))
                    board.start(slot, spec, run_label(spec))
                time.sleep(0.2)
                board.poll()
                for item in [item for item in running if item[0].poll() is not None]:
                    running.remove(item)
                    free_slots.append(item[2])
                    status, line = _worker_end(item[0], item[1])
                    board.finish(item[2], line, status)
                    if status in (CLAIMED, FINISHED_ELSEWHERE):
                        elsewhere.append(item[1])
        finally:
            _stop_workers(running, write=board.write)  # said through the board, before owned_terminal erases it
    return elsewhere


def _start_worker(spec: RunSpec, slot: int, jobs: int, redo: tuple[str, ...], gpu: str | None,
                  write=print) -> subprocess.Popen:
    run_dir = prepare_run_dir(spec)
    env = worker_env(os.environ, jobs)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    cmd = [sys.executable, "-m", "ltbench.runner", str(run_dir / store.SPEC)]
    cmd += ["--redo", ",".join(redo)] if redo else []
    linux = sys.platform.startswith("linux")
    if store.regular_file_problem(run_dir / "worker.log", follow=False) not in ("", "is missing"):
        store.set_aside(run_dir / "worker.log")  # a planted link or a FIFO: kept aside, never written through
    with store.open_append(run_dir / "worker.log") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=_die_with_parent if linux else None)
    write(f"started {run_label(spec)} seed {spec.config['seed']} ({spec.run_id}) in slot {slot}"
          + (f" on GPU {gpu}" if gpu is not None else ""))
    return proc


def worker_env(parent: dict, jobs: int) -> dict:
    """A pool worker's environment: its share of the cores this process may use (``usable_cores``, the
    affinity mask, not the machine's cpu_count) as ``LTBENCH_THREADS``, which ``provenance.thread_count``
    prefers to an inherited ``SLURM_CPUS_PER_TASK`` (the whole allocation, not this worker's part of it),
    and as ``OMP_NUM_THREADS`` for the libraries that read it. A CPU run still trains with one thread
    unless train.threads says otherwise (its numbers must not depend on ``jobs``)."""
    share = str(max(1, usable_cores() // max(1, jobs)))
    return {**parent, THREADS_ENV: share, "OMP_NUM_THREADS": share}


def _worker_end(proc: subprocess.Popen, spec: RunSpec) -> tuple[str, str]:
    """(status, the line that says how a worker ended: a finished run with its method, seed and All
    accuracy). Status: the runner's (EXIT_CODES), or 'failed' for a worker that died without one."""
    status = {code: status for status, code in EXIT_CODES.items()}.get(proc.returncode)
    run_dir, run_id = Path(spec.run_dir), spec.run_id
    if status == CLAIMED:
        return status, f"{run_id}: skipped: another process is running it"
    if status == FINISHED_ELSEWHERE:
        return status, f"{run_id}: already finished elsewhere"
    if status == "failed":
        return status, finished_line(spec, run_label(spec), f"FAILED: {failure_line(run_dir)}")
    if status is None:
        return "failed", f"{run_id}: worker exited with code {proc.returncode}; see {run_dir / 'worker.log'}"
    return status, finished_line(spec, run_label(spec), status)


def visible_gpus() -> list[str]:
    """The GPUs this process can use, as the CUDA_VISIBLE_DEVICES entries a worker is pinned to. How many is
    torch's answer (``torch.cuda.is_available()``, ``device_count()``), never the variable's alone: on a machine
    without a GPU, CUDA_VISIBLE_DEVICES=0 (or -1) names none. The variable only says which physical ids those are."""
    try:
        import torch  # lazy: keeps status and the launch decisions free of torch unless a GPU pool is asked for

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken CUDA install: no GPU, the runs train on the CPU
        return []
    env = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    ids = env if "CUDA_VISIBLE_DEVICES" in os.environ and len(env) >= count else [str(i) for i in range(count)]
    return ids[:count]
