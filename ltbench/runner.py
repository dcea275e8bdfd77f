"""``run_one(spec)``: the only function any launcher executes, locally or on a cluster node.

The spec (``ltbench.results.runspec.RunSpec``, or its plain dict form) is plain data (no pickled models, datasets or classes): the worker repeats plugin
discovery from it, so it runs the same in this process, a subprocess or a Slurm job.
``python -m ltbench.runner RUN_DIR/spec.json [--redo failed,stale]`` runs one spec in a fresh
process (also under torchrun); its exit code says what happened (see ``EXIT_CODES``).

Before touching a run, the worker takes the run's lock (``store.claim_run``) and keeps it until the
result is written, so concurrent launches of one recipe share the work: a run is trained by one
process at a time, and its log holds each epoch once. The decision whether the run still needs
doing is re-taken under the lock, since another process may have finished it meanwhile.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path

import yaml

from ltbench.results import provenance, record, schema, status_rule, store
from ltbench import registry
from ltbench.errors import DiskFullError, LtbenchError, shorten
from ltbench.results.runspec import RunSpec

# What run_one returns besides 'done' and 'failed' (this process trained it):
CLAIMED = "claimed"  # another live process holds the run's lock: skipped
FINISHED_ELSEWHERE = "finished elsewhere"  # a usable result was already there: nothing to do
INTERRUPTED = "interrupted"  # an I/O fault stopped it (a pool worker's exit code; in-process: RunInterrupted)
EXIT_CODES = {"done": 0, "failed": 1, CLAIMED: 3, FINISHED_ELSEWHERE: 4, INTERRUPTED: 5}
# The errors of the medium, not of the computation: the disk is full (or the quota), a file too large for
# the filesystem, a read-only or failing device, a permission taken away meanwhile.
IO_FAULTS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM)


class RunInterrupted(LtbenchError):
    """An I/O fault stopped a run: it is interrupted, not failed (no result.json is written), keeps its last
    checkpoint, and the next plain ``ltbench run`` resumes it. The message names the file and the fix."""


def io_fault(exc: BaseException) -> bool:
    """Whether an exception is a fault of the storage (IO_FAULTS, or ltbench's DiskFullError/WriteError),
    which must never be recorded as the run's failure: freeing space does not change the computation."""
    return isinstance(exc, DiskFullError) or (isinstance(exc, OSError) and exc.errno in IO_FAULTS)


def interrupted_message(spec: RunSpec, exc: BaseException) -> str:
    where = f"{exc.filename}: " if isinstance(exc, OSError) and exc.filename and str(exc.filename) not in str(exc) else ""
    return (f"run {spec.run_id} interrupted, not failed: {where}{shorten(str(exc), 400)}; it keeps its last "
            f"checkpoint: fix that, then run the same command again to resume it")


def prepare_run_dir(spec: RunSpec | dict) -> Path:
    """Create the run directory with its spec and readable config (idempotent; a spec.json that is
    missing, unreadable or not this spec is written again, since a pool worker reads it)."""
    spec = RunSpec.coerce(spec)
    plain = {"schema_version": schema.SCHEMA_VERSION, **spec.to_dict()}
    run_dir = Path(spec.run_dir)
    store.guard_writes_under(run_dir.parent)  # a worker's writes (checkpoints, records) stay in the results folder
    store.make_dirs(run_dir)
    try:
        same = store.load_json(run_dir / store.SPEC) == plain
    except store.UnusableFile:  # missing, damaged, a FIFO...: written again (atomic rename replaces it)
        same = False
    if not same:
        store.atomic_write_json(run_dir / store.SPEC, plain)
    if not (run_dir / store.CONFIG).is_file():
        store.atomic_write_bytes(run_dir / store.CONFIG, yaml.safe_dump(spec.config, sort_keys=False).encode())
    return run_dir


def _rank() -> int:
    for var in ("RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def run_one(spec: RunSpec | dict, say=print, redo: tuple[str, ...] = (), claim_wait_s: float = 0.0,
            on_epoch=None) -> str:
    """Run (or resume) one run and write its result.json; returns 'done' or 'failed' when this
    process ran it, else CLAIMED or FINISHED_ELSEWHERE.

    ``redo``: finished results to set aside and run again: 'failed' and/or 'stale' (done by plugin
    code that has changed since). Unusable results are always run again.
    ``claim_wait_s``: how long to wait for a run another process holds (a Slurm task requeued after a
    node crash waits out the dead node's NFS lock lease). Under torchrun only rank 0 takes the lock
    (a duplicate multi-process launch is not guarded).
    ``on_epoch``: engine.train's per-epoch callback (a search's pruning: search.SearchSampler.prunes).
    """
    spec = RunSpec.coerce(spec)
    if _rank() != 0:
        run_dir = Path(spec.run_dir)
        if status_rule.run_status(run_dir) in store.FINISHED:
            return FINISHED_ELSEWHERE
        return _execute(spec, run_dir, say, False, on_epoch)
    run_dir = prepare_run_dir(spec)
    claim = store.claim_run(run_dir, wait_s=claim_wait_s)
    if claim is None:
        owner = store.read_started(run_dir)
        where = f" (pid {shorten(owner.get('pid'), 20)} on {shorten(owner.get('host'), 80)})" if owner else ""
        say(f"skipped: another process is running it{where}")
        return CLAIMED
    with claim:
        try:
            if not _needs_running(spec, run_dir, redo, say):
                return FINISHED_ELSEWHERE
            return _execute(spec, run_dir, say, True, on_epoch)
        except (OSError, DiskFullError) as exc:  # setting a damaged file aside on a full or read-only disk
            if io_fault(exc):
                raise _interrupted(spec, run_dir, interrupted_message(spec, exc)) from None
            raise
        except RunInterrupted as exc:
            raise _interrupted(spec, run_dir, str(exc)) from None


def _interrupted(spec: RunSpec, run_dir: Path, message: str) -> RunInterrupted:
    """Say in started.json that the run stopped (best effort: the disk may be full), so status shows it
    interrupted even while this process lives on (an in-process launch) or ran on another node."""
    started = store.read_started(run_dir)
    if started:
        try:
            store.atomic_write_json(run_dir / store.STARTED, {**started, "interrupted": message})
        except (OSError, DiskFullError):
            pass
    return RunInterrupted(message)


def _needs_running(spec: RunSpec, run_dir: Path, redo: tuple[str, ...], say) -> bool:
    """Under the run's lock: tidy what an interrupted or damaged run left, and decide whether to run."""
    removed = store.remove_stale_tmp(run_dir)
    if removed:
        say(f"removed {len(removed)} temporary file(s) left by an interrupted write: {', '.join(removed)}")
    state = status_rule.run_state(run_dir)  # the one status rule; under the lock, 'running' is a dead owner's leftover
    if not status_rule.to_run(state.status, redo):
        return False
    if state.status == "stale":
        moved = store.set_aside(run_dir / store.RESULT, "stale")
        for name in (store.CHECKPOINT, store.LOG):  # trained by the old code: start over
            (run_dir / name).unlink(missing_ok=True)
        say(f"code changed since this result ({', '.join(state.changed)}): old result kept as {moved.name}; "
            f"training again from scratch")
    elif state.status == "failed":
        (run_dir / store.RESULT).unlink()
    elif state.status == "damaged":
        moved = store.set_aside(run_dir / store.RESULT)
        say(f"{state.check.reason}; moved it to {moved.name} and running again "
            f"(from the checkpoint, if there is a usable one)")
    for name in (store.LOG, store.CHECKPOINT):
        path = run_dir / name
        if os.path.lexists(path) and store.regular_file_problem(path, follow=False):  # a folder, a FIFO, a link
            moved = store.set_aside(path)
            say(f"{name} was not a file; moved it to {moved.name}")
    return True


def _execute(spec: RunSpec, run_dir: Path, say, writes_files: bool, on_epoch=None) -> str:
    """Train the run and write its result.json (assembled by ``ltbench.results.record``). A fault of the
    storage anywhere (started.json, a checkpoint, the log, the result) raises RunInterrupted: the run is
    left interrupted and resumable, never recorded as failed."""
    from ltbench.train import distributed, engine  # lazy: keeps launchers free of torch (only workers train)

    registry.add_plugin_paths(spec.plugins)
    started = time.time()
    info = provenance.collect()
    try:
        if writes_files:
            store.atomic_write_json(run_dir / store.STARTED, {
                "schema_version": schema.SCHEMA_VERSION, "time": started, "host": socket.gethostname(), "pid": os.getpid(),
                "slurm_job_id": info.get("slurm_job_id"), "requeue_count": info.get("requeue_count"),
            })
        result = record.header(spec, started=started, provenance=info, code=provenance.run_code(spec.config))
        _train_into(result, spec, run_dir, say, writes_files, engine, distributed, on_epoch)
        record.finish(result, time.time())
        if writes_files:
            _write_result(run_dir, result)
    except BaseException as exc:
        if io_fault(exc):
            raise RunInterrupted(interrupted_message(spec, exc)) from None
        raise
    return result["status"]


def _train_into(result: dict, spec: RunSpec, run_dir: Path, say, writes_files: bool, engine, distributed,
                on_epoch=None) -> None:
    """engine.train, its outcome or its failure recorded in ``result``. A crash is recorded (the grid goes on);
    a fault of the storage and Ctrl-C are not the computation's and pass through."""
    try:
        with registry.exits_contained(f"a plugin of run {spec.run_id}"):  # a plugin's os._exit fails this run, not the launch
            record.done(result, engine.train(spec, run_dir, say=say, on_epoch=on_epoch))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        if io_fault(exc):
            raise
        if isinstance(exc, LtbenchError):
            record.failed(result, exc)
        elif isinstance(exc, SystemExit):  # plugin code called sys.exit or os._exit: the run fails, the grid goes on
            record.failed(result, registry.PluginError(registry.plugin_call_message(
                f"a plugin of run {spec.run_id}", "training", exc)))
        else:  # any crash is recorded; the grid goes on
            record.failed(result, exc, traceback.format_exc())
            if writes_files:
                store.atomic_write_bytes(run_dir / store.TRACEBACK, result["traceback"].encode())
                result["traceback_file"] = store.TRACEBACK  # in the run's folder (a record holds no machine path)
    finally:
        distributed.shutdown()


def _write_result(run_dir: Path, result: dict) -> None:
    """Write result.json, unless it would be too large to read back (a plugin's huge ``method_extras`` or
    data ``info``): then the run is recorded as failed with a small record saying so, so that no launch
    trains it again forever because its record is unreadable."""
    data = (json.dumps(result, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
    if len(data) > store.MAX_JSON_BYTES:
        sizes = {k: len(json.dumps(v, allow_nan=False)) for k, v in result.items()}
        biggest = max(sizes, key=sizes.get)
        small = {k: v for k, v in result.items() if k not in ("metrics", "method_extras", "data", "selection")}
        record.failed(small, LtbenchError(
            f"the record is {len(data) / store.MiB:.0f} MiB, more than the {store.MAX_JSON_BYTES // store.MiB} "
            f"MiB a result.json may hold ('{biggest}' takes {sizes[biggest] / store.MiB:.0f} MiB); make the "
            f"plugin record less (a per-class list, not per-image values)"))
        data = (json.dumps(small, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
    store.atomic_write_bytes(run_dir / store.RESULT, data)


def failure_line(run_dir: Path) -> str:
    """'error message (traceback: path)' for a failed run, for launchers to print."""
    result = store.read_result(run_dir)
    if result is None:
        return f"the worker ended without a result; see {run_dir / 'worker.log'}"
    error = str(result.get("error") or "?").strip()
    where = result.get("traceback_file")
    return error + (f" (traceback: {run_dir / where})" if where else "")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    redo: tuple[str, ...] = ()
    if len(argv) == 3 and argv[1] == "--redo":
        redo = tuple(x for x in argv[2].split(",") if x)
        argv = argv[:1]
    if len(argv) != 1:
        print("usage: python -m ltbench.runner RUN_DIR/spec.json [--redo failed,stale]", file=sys.stderr)
        return 2
    try:
        spec = store.load_json(argv[0])
        status = run_one(spec, say=lambda msg: print(msg, flush=True), redo=redo)
    except RunInterrupted as exc:  # e.g. the disk filled up: the launcher says so, the next launch resumes
        print(f"ltbench: {exc}", file=sys.stderr)
        return EXIT_CODES[INTERRUPTED]
    except LtbenchError as exc:
        print(f"ltbench: error: {exc}", file=sys.stderr)
        return 1
    return EXIT_CODES.get(status, 1)


if __name__ == "__main__":
    sys.exit(main())
