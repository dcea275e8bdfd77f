"""Launchers: decide which runs still need doing (from disk) and hand their specs to workers.

Every launcher ends in ``runner.run_one(spec)``; only where it runs differs. Several launches of
one recipe may run at once (two terminals, a relaunch while a pool still runs, a Slurm array next
to a local run): each run's lock decides who trains it, the others skip it and say so.
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

from ltbench import report, store
from ltbench.errors import ConfigError, DataMissingError
from ltbench.progress import ProgressBoard, finished_line
from ltbench.recipe import Recipe, distinct_data, run_label
from ltbench.registry import DATASETS
from ltbench.runlines import check_results_root, describe_found, other_data_note, run_lines, stage2_state
from ltbench.runner import CLAIMED, EXIT_CODES, FINISHED_ELSEWHERE, failure_line, prepare_run_dir, run_one


def preflight(recipe: Recipe) -> None:
    """Stop before any run starts when a dataset is missing (one message, not one per run)."""
    for spec in distinct_data(recipe.runs):
        check = getattr(DATASETS.build(spec["config"]["data"], where="data"), "check", None)
        if callable(check):
            check()


def is_stale(run_dir: Path) -> bool:
    result = store.read_result(run_dir)
    return bool(result and result.get("status") == "done" and store.changed_code(result)[0])


def runs_to_launch(recipe: Recipe, redo: tuple[str, ...] = ()) -> tuple[list[dict], dict[str, int]]:
    """Runs to launch now, and the count of each status found on disk ('stale' counted apart from
    'done'). ``redo``: 'failed' and/or 'stale' results to run again. The worker re-decides under the
    run's lock, so a run another process finishes meanwhile is not trained twice. Not read-only: a run
    folder whose spec.json is missing gets it written again (``runner.prepare_run_dir``)."""
    statuses, out = [], []
    for spec in recipe.runs:
        run_dir = Path(spec["run_dir"])
        if run_dir.is_dir() and not (run_dir / store.SPEC).exists():
            prepare_run_dir(spec)  # a deleted spec.json is rewritten, whatever the run's state
        status = store.run_status(run_dir)
        if status == "done" and is_stale(run_dir):
            status = "stale"
        if status == "done" and "checkpoint" in redo and set_aside_without_checkpoint(run_dir):
            status = "no checkpoint"
        statuses.append(status)
        if status == "done" or (status in ("failed", "stale") and status not in redo):
            continue
        out.append(spec)
    return out, store.count_statuses(statuses)


def set_aside_without_checkpoint(run_dir: Path) -> bool:
    """--rebuild-checkpoints: a done run whose checkpoint.pt is not its final model (gone, truncated, foreign)
    has its result moved to result.json.no-checkpoint, so the run trains again and writes both anew."""
    from ltbench.features import final_checkpoint_problem  # lazy: keeps status free of torch

    problem = final_checkpoint_problem(run_dir)
    if not problem:
        return False
    moved = store.set_aside(run_dir / store.RESULT, "no-checkpoint")
    print(f"  {run_dir.name}: {problem}; moved its result to {moved.name}: it is trained again")
    return True


def print_plan(recipe: Recipe) -> int:
    """``--dry-run``: every check a real launch makes before training (recipe, results folder, data
    present), then one line per run that names everything in which it differs from the others."""
    check_results_root(recipe.root)
    preflight(recipe)
    lines = run_lines(recipe.runs, recipe.override_keys)
    print(f"recipe {recipe.name}: {len(recipe.runs)} run(s) -> {recipe.root}")
    for spec, line in zip(recipe.runs, lines):
        status = store.run_status(Path(spec["run_dir"]))
        print(f"  {spec['run_id']}  {status:<11} {line}")
    changed = other_data_note(recipe.root, recipe.runs)
    if changed:
        print(changed)
    return 0


def _announce(recipe: Recipe, specs: list[dict], found: dict[str, int], redo: tuple[str, ...]) -> None:
    finished = found.get("done", 0) + sum(found.get(s, 0) for s in ("failed", "stale") if s not in redo)
    print(f"recipe {recipe.name}: {len(recipe.runs)} run(s), {len(specs)} to run, {finished} already finished "
          f"(results in {recipe.root})")
    if found.get("failed") and "failed" not in redo:
        print(f"  {found['failed']} run(s) failed before and are not run again: see their errors with "
              f"'ltbench status {recipe.path}', and add --rerun-failed to run them again")
    if found.get("stale") and "stale" not in redo:
        print(f"  {found['stale']} finished run(s) were computed by plugin code that has changed since; "
              f"add --rerun-stale to run them again")
    if found.get("damaged"):
        print(f"  {found['damaged']} run(s) have an unusable result.json: they run again")
    if found.get("running"):
        print(f"  {found['running']} run(s) look busy in another process: skipped if they still are")
    changed = other_data_note(recipe.root, recipe.runs)
    if changed:
        print(f"  {changed}")


def launch(recipe: Recipe, rerun_failed: bool = False, wait: bool = False, rerun_stale: bool = False,
           rebuild_checkpoints: bool = False) -> dict[str, int]:
    check_runs_per_gpu(recipe)
    preflight(recipe)  # before the results folder is made: a missing dataset leaves no empty results/<recipe>/ behind
    store.ensure_writable(recipe.root)
    redo = ("failed",) * rerun_failed + ("stale",) * rerun_stale + ("checkpoint",) * rebuild_checkpoints
    specs, found = runs_to_launch(recipe, redo)
    _announce(recipe, specs, found, redo)
    name = recipe.launcher.name
    gpus = _visible_gpus() if recipe.launcher.runs_per_gpu > 1 else []  # no torch import otherwise
    if name == "local" and pool_size(recipe.launcher.jobs, recipe.launcher.runs_per_gpu, gpus) > 1 and len(specs) > 1:
        name = "pool"
    elsewhere = LAUNCHERS[name](recipe, specs, redo, wait)
    if elsewhere is None:  # submitted; results come later ('ltbench status' follows them)
        return {"failed": 0}
    report_elsewhere(elsewhere)
    return print_summary(recipe)


# A launcher takes (recipe, specs to run, redo, wait) and returns the specs another process was
# running (skipped here), or None when the runs were only submitted and finish later. Every one ends
# in runner.run_one(spec); only where it runs differs (DomainBed's ``command_launchers``).
def launch_local(recipe: Recipe, specs: list[dict], redo: tuple[str, ...], wait: bool) -> list[dict]:
    """One run after another in this process."""
    with sigterm_as_interrupt():
        return run_local(specs, 1, redo)


def launch_pool(recipe: Recipe, specs: list[dict], redo: tuple[str, ...], wait: bool) -> list[dict]:
    """``launcher.jobs`` worker processes on this machine, or ``runs_per_gpu`` per visible GPU (chosen by
    'local' when that is more than one)."""
    gpus = _visible_gpus()
    workers = pool_size(recipe.launcher.jobs, recipe.launcher.runs_per_gpu, gpus)
    with sigterm_as_interrupt():
        return run_pool(specs, workers, redo, gpu_slots(workers, gpus))


def launch_slurm(recipe: Recipe, specs: list[dict], redo: tuple[str, ...], wait: bool) -> list[dict] | None:
    """Job arrays on a Slurm cluster through submitit; with ``wait``, until every run has a result."""
    from ltbench import slurm  # lazy: keeps status and local launches free of submitit

    slurm.submit(recipe, specs, wait=wait, redo=redo)
    return [] if wait else None


def launch_debug(recipe: Recipe, specs: list[dict], redo: tuple[str, ...], wait: bool) -> list[dict] | None:
    """submitit's debug executor: the same job arrays as 'slurm', run in this process (all chunks)."""
    from ltbench import slurm  # lazy: keeps status and local launches free of submitit

    for job in slurm.submit_arrays(recipe, specs, "debug", redo):
        job.result()  # the debug executor runs a job when its result is asked for
    return [] if wait else None


LAUNCHERS = {"local": launch_local, "pool": launch_pool, "slurm": launch_slurm, "debug": launch_debug}


def launch_posthoc(recipe: Recipe, jobs: int | None = None, dtype: str = "float32",
                   redo_failed: bool = False, redo_stale: bool = False) -> dict[str, int]:
    """``ltbench posthoc`` through the recipe's launcher: 'local' fits the stage-2 grid here (``jobs`` runs at a
    time); 'slurm' submits one array task per finished run and returns (run the command again, or
    ``ltbench table``, once they end: stored settings are skipped); 'debug' runs those tasks in this process.
    Returns summed counts ('unfinished', 'done', 'failed', 'already', 'busy'; 'submitted' on Slurm)."""
    from ltbench.posthoc_runs import add_counts, ready_run_dirs, run_posthoc  # lazy: keeps status free of torch

    name = recipe.launcher.name
    if name not in ("slurm", "debug"):
        return run_posthoc(recipe.runs, recipe.posthoc, jobs or recipe.launcher.jobs, dtype, redo_failed,
                           redo_stale=redo_stale)
    from ltbench import slurm  # lazy: keeps status and local launches free of submitit

    if name == "slurm":
        slurm.require_sbatch()
    run_dirs, totals = ready_run_dirs(recipe.runs)
    submitted = slurm.submit_posthoc(recipe, run_dirs, recipe.posthoc, name, dtype, redo_failed, redo_stale)
    if name == "slurm":
        return {**totals, "submitted": len(run_dirs)}
    for job in submitted:  # the debug executor runs a task when its result is asked for
        add_counts(totals, job.result())
    return totals


def report_elsewhere(specs: list[dict]) -> None:
    """Say what became of the runs another process was running when this one reached them."""
    if not specs:
        return
    states = [store.run_status(Path(s["run_dir"])) for s in specs]
    parts = store.format_counts(store.count_statuses(states))
    print(f"\n{len(specs)} run(s) were being run by another process: now {parts}"
          + ("; 'ltbench status' follows them" if any(s in ("running", "pending") for s in states) else ""))


def run_local(specs: list[dict], jobs: int = 1, redo: tuple[str, ...] = ()) -> list[dict]:
    """Run specs one after another in this process, or in ``jobs`` worker processes. Returns the
    specs another process was running (skipped here)."""
    if jobs > 1 and len(specs) > 1:
        return run_pool(specs, jobs, redo)

    elsewhere = []
    for i, spec in enumerate(specs, 1):
        c = spec["config"]
        print(f"[{i}/{len(specs)}] {run_label(spec)} on {c['data']['name']} seed {c['seed']} ({spec['run_id']})")
        status = run_one(spec, say=lambda msg: print(f"  {msg}", flush=True), redo=redo)
        if status == "done":
            print(finished_line(spec, run_label(spec), status), flush=True)
        elif status == "failed":
            print(f"  FAILED: {failure_line(Path(spec['run_dir']))}")
        elif status in (CLAIMED, FINISHED_ELSEWHERE):
            if status == FINISHED_ELSEWHERE:
                print("  already finished by another process")
            elsewhere.append(spec)
    return elsewhere


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


def _stop_workers(running: list, grace_s: float = 10.0) -> None:
    """SIGTERM every live worker, then SIGKILL what is left after ``grace_s``. A killed run keeps
    its last checkpoint and its lock dies with it, so the next launch resumes it."""
    live = [item for item in running if item[0].poll() is None]
    for proc, *_ in live:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc, spec, *_ in live:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if live:
        print(f"stopped {len(live)} worker(s): {', '.join(spec['run_id'] for _, spec, *_ in live)}", flush=True)


def check_runs_per_gpu(recipe: Recipe) -> None:
    """``launcher.runs_per_gpu`` > 1 takes effect or is refused: it needs the local launcher, visible GPUs,
    and no conflicting ``jobs`` (the pool size is then GPUs x runs_per_gpu)."""
    cfg = recipe.launcher
    if cfg.runs_per_gpu == 1:
        return
    where = f"{recipe.path}: launcher.runs_per_gpu"
    if cfg.name != "local":
        raise ConfigError(f"{where}: {cfg.runs_per_gpu} applies to the local launcher only (launcher.name is "
                          f"{cfg.name}); on Slurm set launcher.gpus_per_node, or remove runs_per_gpu")
    gpus = _visible_gpus()
    if not gpus:
        raise ConfigError(f"{where}: {cfg.runs_per_gpu} needs GPUs, but none is visible (CUDA_VISIBLE_DEVICES / "
                          f"torch.cuda); on CPU use launcher.jobs (or --jobs) instead")
    if cfg.jobs not in (1, len(gpus) * cfg.runs_per_gpu):
        raise ConfigError(f"{where}: {cfg.runs_per_gpu} runs on each of {len(gpus)} GPU(s) makes "
                          f"{len(gpus) * cfg.runs_per_gpu} workers, but launcher.jobs (or --jobs) asks for {cfg.jobs}; "
                          f"set one of the two")


def pool_size(jobs: int, runs_per_gpu: int, gpus: list[str]) -> int:
    """Workers at once: ``jobs``, or ``runs_per_gpu`` on each visible GPU when that is asked for."""
    return len(gpus) * runs_per_gpu if runs_per_gpu > 1 and gpus else jobs


def gpu_slots(workers: int, gpus: list[str]) -> list[str | None]:
    """The CUDA_VISIBLE_DEVICES of each worker slot: GPUs round-robin (slot s on gpus[s % len(gpus)]), so
    with ``workers`` = GPUs x k every GPU holds k runs; None for every slot when there is no GPU."""
    return [gpus[slot % len(gpus)] if gpus else None for slot in range(workers)]


def run_pool(specs: list[dict], jobs: int, redo: tuple[str, ...] = (), devices: list | None = None) -> list[dict]:
    """A DomainBed-style pool: ``jobs`` workers (``python -m ltbench.runner spec.json``), worker slot s
    pinned to ``devices[s]`` (by default the visible GPUs round-robin, ``gpu_slots``) and given its share
    of the CPU threads; output in the run directory, progress (epoch, loss, img/s, ETA per slot) on the
    terminal (``ltbench.progress``). A slot keeps its GPU for every run it takes, so each GPU holds at most
    its share of runs at once. Ctrl-C or SIGTERM to this process stops the workers too. Returns the specs
    run elsewhere."""
    devices = devices if devices is not None else gpu_slots(jobs, _visible_gpus())
    queue, running, elsewhere = list(specs), [], []
    free_slots = list(range(jobs))
    board = ProgressBoard(jobs)
    with sigterm_as_interrupt():
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
                    if _report_worker_end(item[0], item[1], lambda line, slot=item[2]: board.finish(slot, line)):
                        elsewhere.append(item[1])
        finally:
            board.close()
            _stop_workers(running)
    return elsewhere


def _start_worker(spec: dict, slot: int, jobs: int, redo: tuple[str, ...], gpu: str | None,
                  write=print) -> subprocess.Popen:
    run_dir = prepare_run_dir(spec)
    threads = max(1, (os.cpu_count() or 1) // jobs)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    cmd = [sys.executable, "-m", "ltbench.runner", str(run_dir / store.SPEC)]
    cmd += ["--redo", ",".join(redo)] if redo else []
    linux = sys.platform.startswith("linux")
    with open(run_dir / "worker.log", "a") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=_die_with_parent if linux else None)
    write(f"started {run_label(spec)} seed {spec['config']['seed']} ({spec['run_id']}) in slot {slot}"
          + (f" on GPU {gpu}" if gpu is not None else ""))
    return proc


def _report_worker_end(proc: subprocess.Popen, spec: dict, write=print) -> bool:
    """Say how a worker ended (a finished run with its method, seed and All accuracy); True when
    another process had the run (claimed or finished)."""
    status = {code: status for status, code in EXIT_CODES.items()}.get(proc.returncode)
    run_dir, run_id = Path(spec["run_dir"]), spec["run_id"]
    if status == CLAIMED:
        write(f"{run_id}: skipped: another process is running it")
    elif status == FINISHED_ELSEWHERE:
        write(f"{run_id}: already finished elsewhere")
    elif status == "failed":
        write(finished_line(spec, run_label(spec), f"FAILED: {failure_line(run_dir)}"))
    elif status is None:
        write(f"{run_id}: worker exited with code {proc.returncode}; see {run_dir / 'worker.log'}")
    else:
        write(finished_line(spec, run_label(spec), status))
    return status in (CLAIMED, FINISHED_ELSEWHERE)


def _visible_gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:
        return []


def print_summary(recipe: Recipe) -> dict[str, int]:
    """Print the recipe's summary table and status counts after a launch; return the counts."""
    counts = store.count_statuses(store.run_status(Path(spec["run_dir"])) for spec in recipe.runs)

    text = report.summary_table(recipe)
    if text:
        print()
        print(text)
    print(f"\n{store.format_counts(counts)}")
    if counts.get("failed"):
        print(f"see the errors with 'ltbench status {recipe.path}'; add --rerun-failed to run the failed runs again")
    return counts


RUN_FILES = (store.SPEC, store.CONFIG, store.LOG, store.CHECKPOINT, store.RESULT, store.STARTED, store.SUBMITTED,
             store.LOCK)


def _is_run_dir(folder: Path) -> bool:
    return any((folder / name).exists() for name in RUN_FILES)


def _run_dirs_under(root: Path) -> list[Path]:
    """Every folder of a results directory that may be a run (internal ones like _submitit excepted);
    given the top results folder, the runs of each recipe folder in it."""
    if not root.is_dir():
        raise DataMissingError(f"{root}: no such results directory")

    def children(folder: Path) -> list[Path]:
        return sorted(p for p in folder.iterdir()  # symlinks never followed (out of the root, or in a loop)
                      if not p.is_symlink() and p.is_dir() and not p.name.startswith(("_", "."))
                      and p.name not in store.OWNED_DIRS)

    out = []
    for child in children(root):
        inner = [] if _is_run_dir(child) else children(child)
        out += inner if any(_is_run_dir(p) for p in inner) else [child]
    return out


def describe_run(run_dir: Path) -> tuple[str, str]:
    """(status, note) of one run folder for 'ltbench status': never raises on damaged contents."""
    if not run_dir.exists():
        return "pending", ""
    if not _is_run_dir(run_dir):
        empty = not any(run_dir.iterdir())
        return "not a run", ("empty folder" if empty else "no run files in this folder") + "; ignored"
    status = store.run_status(run_dir)
    notes = []
    if status == "failed":
        result = store.read_result(run_dir) or {}
        err = str(result.get("error") or "").strip()
        notes.append(err.splitlines()[-1][:200] if err else "no error recorded")
        if result.get("traceback_file"):
            notes.append(f"traceback: {result['traceback_file']}")
    elif status == "damaged":
        notes.append(f"{store.check_result(run_dir).reason}; 'ltbench run' runs it again")
    elif status == "done":
        changed, gone = store.changed_code(store.read_result(run_dir))
        if changed:
            status = "stale"
            notes.append(f"code changed since: {', '.join(changed)}; 'ltbench run --rerun-stale' runs it again")
        elif gone:
            notes.append(f"cannot check its code, files gone: {', '.join(gone)}")
    elif status in ("running", "interrupted"):
        rows = store.read_jsonl(run_dir / store.LOG)
        owner = store.read_started(run_dir)
        notes.append(f"epoch {rows[-1].get('epoch')} done" if rows else "no epoch done")
        if owner:
            notes.append(f"pid {owner.get('pid')} on {owner.get('host')}")
        if status == "interrupted":
            notes.append("its process is gone; run again to resume")
    if status in ("pending", "running") and (run_dir / store.SUBMITTED).is_file():
        try:
            import json

            notes.append(f"job {json.loads((run_dir / store.SUBMITTED).read_text()).get('job_id')}")
        except (ValueError, OSError, AttributeError):
            notes.append("submitted.json unreadable")
    for name in (store.SPEC, store.LOG):
        path = run_dir / name
        if name == store.SPEC and not path.exists():
            notes.append("spec.json missing ('ltbench run' on its recipe writes it again)")
        elif path.exists() and not path.is_file():
            notes.append(f"{name} is not a file ('ltbench run' sets it aside)")
    return status, "; ".join(notes)


def print_status(root: Path, specs: list[dict] | None = None, override_keys: list[str] = ()) -> int:
    """Each run's state read from disk, and a summary line. ``specs``: the runs of a recipe (so runs
    never launched show as pending); otherwise every folder under ``root``. Each line names the run
    (method, dataset, imbalance, seed, the settings in which the runs differ), its state and notes."""
    root = Path(root)
    run_dirs = _run_dirs_under(root) if specs is None else [Path(s["run_dir"]) for s in specs]
    described = describe_found(root, run_dirs) if specs is None else dict(zip(run_dirs, run_lines(specs, override_keys)))
    statuses, stale_stage2 = [], 0
    for run_dir in run_dirs:
        status, note = describe_run(run_dir)
        statuses.append(status)
        stage2, stale = stage2_state(run_dir) if status in ("done", "stale") else ("", 0)
        stale_stage2 += stale
        name = run_dir.relative_to(root) if specs is None else run_dir.name
        what = described.get(run_dir, "") if status != "not a run" else ""
        print(f"{name}  {status:<11}" + "".join(f"  {t}" for t in (what, note, stage2) if t))
    counts = store.count_statuses(statuses)
    print(store.format_counts(counts) or "no runs")
    changed = other_data_note(root, specs) if specs is not None else ""
    if changed:
        print(changed)
    if stale_stage2:
        print(f"{stale_stage2} stage-2 result(s) are stale; to fit them again: ltbench posthoc RECIPE --rerun-stale")
    if counts.get("damaged") or counts.get("interrupted"):
        print("to redo the damaged and resume the interrupted runs: ltbench run RECIPE")
    for kind in ("failed", "stale"):
        if counts.get(kind):
            print(f"to run the {kind} runs again: ltbench run RECIPE --rerun-{kind}")
    return 0
