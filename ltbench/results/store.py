"""The results store: one directory per run, files written atomically, status read from disk.

Layout (``results/<recipe name>/<run id>/``):
  spec.json      what the worker executes (written at launch)
  config.yaml    the resolved configuration, for people
  lock           held (flock) by the one process that runs this run, for the run's whole lifetime
  log.jsonl      one line per epoch (appended; a reader ignores a torn last line)
  checkpoint.pt  the last epoch-end (or timed) checkpoint
  predictions.npz  argmax per test image per head, for paired tests (written just before result.json)
  result.json    the final record; status 'done' or 'failed'
  traceback.txt  the traceback of a run that failed with an unexpected exception
  started.json   written by the worker when it starts (host, pid, Slurm job id, requeue count)
  submitted.json written by a cluster launcher (job ids), so status can say 'pending'

Every file a reader may open whole is written to a temporary file in the same directory, fsynced
and renamed over the target, so a crash leaves the old version or the new one, never half of one.
Files are created readable by others (0666 minus the umask, like any file ``open()`` creates).
Whether a result.json can be trusted is decided in one place, :func:`check_result`; everything that
reads results (run, status, tables) goes through it.
This module imports no torch, so status and tables work on a login node.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ltbench.results import identity, safe_read, schema
from ltbench.errors import DiskFullError, LtbenchError, WriteError

SPEC, CONFIG, LOG, CHECKPOINT, RESULT = "spec.json", "config.yaml", "log.jsonl", "checkpoint.pt", "result.json"
STARTED, SUBMITTED = "started.json", "submitted.json"  # worker start (host, pid, Slurm ids); launcher job ids
LOCK, TRACEBACK = "lock", "traceback.txt"
TMP_MARK = ".tmp-"  # temporary files are named .<target>.tmp-XXXX
CODE_UNKNOWN = identity.CODE_UNKNOWN  # a finished result whose code cannot be checked (identity.code_state)
OLDER = "older"  # a run folder whose record has an earlier schema: ``ltbench migrate`` brings it up to date
STATUSES = ("pending", "running", "interrupted", "damaged", "done", CODE_UNKNOWN, "stale", "failed", OLDER)  # run_status
STATUS_WIDTH = max(len(x) for x in (*STATUSES, "not a run"))  # the status column of status and --dry-run
# A usable result of a run that went to its end (stale: made by code that has changed since; code unknown:
# made by code that cannot be compared with the files now). Only 'done' says the code is the same.
FINISHED = ("done", CODE_UNKNOWN, "stale")


POSTHOC_DIR = "posthoc"  # RUN_DIR/posthoc/<stage-2 id>/result.json: stage-2 results (ltbench/stage2/posthoc_runs.py)
# Folders ltbench itself writes beside the run folders of a recipe (``ltbench report``): never runs.
# (Names starting with '_' or '.', such as _submitit and the caches, are skipped as well.)
OWNED_DIRS = ("report",)
# The files that make a folder a run's (any one of them): status lists such folders, the table index reads them.
RUN_FILES = (SPEC, CONFIG, LOG, CHECKPOINT, RESULT, STARTED, SUBMITTED, LOCK)


def count_statuses(statuses) -> dict[str, int]:
    """How many runs are in each status: the one tally every launcher, status and report line uses."""
    counts: dict[str, int] = {}
    for status in statuses:
        counts[status] = counts.get(status, 0) + 1
    return counts


def format_counts(counts: dict[str, int], order: tuple[str, ...] | None = None) -> str:
    """'2 done, 1 failed': statuses in ``order`` (STATUSES, say), alphabetically without one."""
    keys = sorted(counts, key=order.index) if order else sorted(counts)
    return ", ".join(f"{counts[k]} {k}" for k in keys)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Read once at import (os.umask can only be read by setting it; doing it per write would race threads).
FILE_MODE = 0o666 & ~_umask()


# ------------------------------------------------------------------------------------------------
# Writing


def _disk_full(path: Path, exc: OSError, needed: int) -> DiskFullError:
    try:
        free = f"{shutil.disk_usage(path.parent).free / 1e6:.1f} MB free now"
    except OSError:
        free = "free space unknown"
    return DiskFullError(
        f"no space left writing {path} ({exc.strerror}): it needs about {needed / 1e6:.1f} MB free in "
        f"{path.parent} ({free}); free some space or choose another --results folder, then run the same "
        f"command again to resume")


_guarded_roots: set[str] = set()


class OutsideRootError(LtbenchError):
    """A write under a results root whose folder, through a symlink, is elsewhere: refused (one line, exit 2)."""


def guard_writes_under(root: Path) -> None:
    """From now on, in this process, no file under ``root`` (a recipe's results folder) is written, and no folder
    made, through a symlinked folder that leads out of it (``check_inside``). The commands call it once they know
    the root (run, posthoc, table, report, plot; every run in its worker), so every writer is covered: reports,
    figures, tables, feature caches, checkpoints, records. A symlinked *file* is replaced by the atomic rename,
    never written through; a root that is itself a symlink (a results folder on another disk) is fine."""
    _guarded_roots.add(os.path.abspath(root))


def check_inside(path: Path) -> None:
    """OutsideRootError when ``path`` lies under a guarded root by name but its folder resolves outside it."""
    where = os.path.abspath(path)
    for root in _guarded_roots:
        if where.startswith(root + os.sep):
            real, real_root = os.path.realpath(os.path.dirname(where)), os.path.realpath(root)
            if real != real_root and not real.startswith(real_root + os.sep):
                raise OutsideRootError(f"{path}: refused: a symlinked folder leads out of the results folder {root} "
                                       f"(to {real}); nothing is written outside it (replace the link by a folder)")


def make_dirs(folder: Path) -> Path:
    """``folder.mkdir(parents=True, exist_ok=True)``, after ``check_inside`` (an empty folder is a write too)."""
    folder = Path(folder)
    check_inside(folder / "x")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it over ``path`` (``check_inside`` first).

    Until the rename both the old and the new file exist, so the space needed is their sum (twice the
    size for a checkpoint rewritten every epoch); a full disk is reported with that figure.
    """
    path = Path(path)
    check_inside(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}{TMP_MARK}")
    try:
        os.fchmod(fd, FILE_MODE)  # mkstemp creates 0600; results are meant to be shared
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            old = path.stat().st_size if path.is_file() else 0
            raise _disk_full(path, exc, len(data) + old) from None
        if isinstance(exc, OSError) and not isinstance(exc, LtbenchError):
            raise WriteError(path, exc) from None  # EFBIG, EROFS, EIO...: the target is named
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode())


def canonical_line(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, allow_nan=False) + "\n"


def append_jsonl(path: Path, obj: Any) -> None:
    line = canonical_line(obj)
    try:
        with open(path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _disk_full(Path(path), exc, len(line)) from None
        raise WriteError(path, exc) from None


MAX_LOG_BYTES = 256 * safe_read.MiB  # one line per epoch: a few MB for the longest schedules


def read_jsonl(path: Path) -> list[dict]:
    """Read a JSON-lines log, ignoring a torn (partially written) last line. A log that is not a
    readable file (a directory, say) reads as empty: the run that owns it sets it aside."""
    try:
        text = safe_read.read_bytes(path, limit=MAX_LOG_BYTES).decode("utf-8", errors="replace")
    except safe_read.UnusableFile:  # missing, not a regular file (a FIFO never blocks), too big
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # a torn last line, or damage (a line of 200,000 '[')
            break
        if not isinstance(row, dict):
            break
        rows.append(row)
    return rows


def ensure_writable(folder: Path) -> Path:
    """Create ``folder`` if needed and prove we can write there; one clear error otherwise."""
    folder = Path(folder)
    check_inside(folder / "x")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob(".write-probe-*"):  # left by a launch killed mid-probe
            if time.time() - old.stat().st_mtime > 60:
                old.unlink(missing_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise LtbenchError(
            f"results directory {folder} is not writable ({exc.strerror or exc}); "
            f"choose another with --results DIR or fix its permissions"
        ) from None
    return folder


def set_aside(path: Path, tag: str = "damaged") -> Path:
    """Rename a file or folder to ``<name>.<tag>`` (``.<tag>-2``...) so it is kept for a look but no
    longer read (a damaged result, a stale one being redone); returns the new path."""
    path = Path(path)
    for i in range(1, 1000):
        target = path.with_name(f"{path.name}.{tag}" + (f"-{i}" if i > 1 else ""))
        if not target.exists():
            os.replace(path, target)
            return target
    raise LtbenchError(f"{path}: too many .{tag} copies beside it; clean them up")


def remove_stale_tmp(run_dir: Path, min_age_s: float = 60.0) -> list[str]:
    """Delete temporary files left by a write that was killed before its rename.

    Called by the run's owner (who holds the run's lock): the files only it writes (log, checkpoint,
    result, started) cannot be in flight elsewhere; the others (spec, config, submitted), which a
    launcher may be writing right now, are deleted only once older than ``min_age_s``.
    """
    owned = {LOG, CHECKPOINT, RESULT, STARTED, TRACEBACK}
    removed = []
    now = time.time()
    for p in Path(run_dir).glob(f".*{TMP_MARK}*"):
        target = p.name[1:].split(TMP_MARK)[0]
        try:
            if target in owned or now - p.stat().st_mtime > min_age_s:
                p.unlink()
                removed.append(p.name)
        except FileNotFoundError:
            pass
    return removed


# ------------------------------------------------------------------------------------------------
# One owner per run


class RunClaim:
    """An exclusive ``flock`` on ``RUN_DIR/lock``, held while this process runs the run.

    The kernel drops the lock when the holder exits in any way (kill -9, OOM, Slurm cancel), so a
    run whose owner died is free again without any cleanup.
    Shared filesystems: Linux NFS clients (since 2.6.12) turn flock into whole-file NFS byte-range
    locks, which exclude across nodes with NFSv4 or NFSv3 + lockd; after a node *crash* the server
    frees its locks only when the client's lease expires (NFSv4: 90 s by default) or, for NFSv3,
    when the node reboots, so a Slurm task requeued elsewhere waits for the claim (``wait_s``).
    With the NFS mount option ``nolock`` or ``local_lock=flock|all`` locks are per node and do NOT
    exclude across nodes; Lustre needs its ``flock`` mount option. Where the filesystem refuses
    locks altogether, the run goes on unguarded (``locked`` False) and the worker says so.
    """

    def __init__(self, run_dir: Path, fd: int | None):
        self.run_dir, self._fd = Path(run_dir), fd
        self.locked = fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None

    def __enter__(self) -> "RunClaim":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def claim_run(run_dir: Path, wait_s: float = 0.0) -> RunClaim | None:
    """Take the run's lock, retrying for up to ``wait_s`` seconds; None when another process holds it."""
    import fcntl

    path = Path(run_dir) / LOCK
    if path.exists() and not path.is_file():
        set_aside(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return RunClaim(run_dir, fd)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)  # ENOLCK, ENOSYS, EOPNOTSUPP...: this filesystem has no usable locks
                return RunClaim(run_dir, None)
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
        time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))


def read_started(run_dir: Path) -> dict:
    try:
        info = safe_read.load_json(Path(run_dir) / STARTED, limit=safe_read.MiB)
    except safe_read.UnusableFile:
        return {}
    return info if isinstance(info, dict) else {}


def owner_alive(started: dict) -> bool | None:
    """Is the process that started a run alive? True/False on this host; None when it ran elsewhere
    (another node: only its lock or the scheduler knows). Read-only: never touches the lock, so a
    status query can never make a launcher believe a run is taken."""
    pid = started.get("pid")
    if started.get("host") != socket.gethostname() or not isinstance(pid, int):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ------------------------------------------------------------------------------------------------
# Reading results: the one rule for "is this result usable"


@dataclass(frozen=True)
class ResultCheck:
    """What a run's result.json holds.

    state: 'missing' (no file), 'done' or 'failed' (a usable record), 'older' (a record of an earlier
    schema: ``ltbench migrate`` brings it up to date; never read on the fly), 'unusable' (unreadable,
    truncated, or not a result: ``reason`` says why; the run must be run again, never counted).
    """

    state: str
    result: dict | None = None
    reason: str = ""

    @property
    def usable(self) -> bool:
        return self.state in ("done", "failed")




def check_result(run_dir: Path) -> ResultCheck:
    """Read and check ``RUN_DIR/result.json`` against the one schema (ltbench/results/schema.py). Run, status,
    tables, plots and stage 2 all decide with this."""
    path = Path(run_dir) / RESULT
    try:
        obj = safe_read.load_json(path)
    except safe_read.UnusableFile as exc:
        if exc.reason == "is missing" and not os.path.lexists(path):
            return ResultCheck("missing")
        return ResultCheck("unusable", reason=f"result.json {exc.reason}")
    if schema.is_older(obj):
        return ResultCheck("older", reason=older_note(Path(run_dir).parent))
    problem = schema.result_problem(obj)
    if problem:
        return ResultCheck("unusable", reason=f"result.json {problem}")
    return ResultCheck(obj["status"], obj)


def older_note(root: Path) -> str:
    """The one line every command gives for a record of an earlier schema."""
    return (f"older records (schema_version < {schema.SCHEMA_VERSION}): "
            f"'{schema.MIGRATE_HINT.format(root=root)}' brings them up to date")


def refuse_older(root: Path) -> None:
    """A command that writes into ``root`` (a launch, stage 2) stops before anything runs when a run folder
    there holds an older record: its id was made by an older identity rule, so the two would not meet."""
    older = older_records(root)
    if older:
        raise LtbenchError(f"{root}: {len(older)} run folder(s) hold records of an older ltbench (e.g. "
                           f"{older[0].name}); '{schema.MIGRATE_HINT.format(root=root)}' brings them up to date first")


def older_records(root: Path) -> list[Path]:
    """The run folders directly below ``root`` whose result.json or spec.json has an earlier schema: a
    launch refuses to start beside them (their ids were made by an older identity rule)."""
    out = []
    for rec in sorted(p for name in (RESULT, SPEC) for p in Path(root).glob(f"*/{name}")):
        try:
            if schema.is_older(safe_read.load_json(rec), missing=1 if rec.name == SPEC else None) \
                    and rec.parent not in out:
                out.append(rec.parent)
        except safe_read.UnusableFile:
            continue
    return out


def read_result(run_dir: Path) -> dict | None:
    """The usable result record of a run ('done' or 'failed'), or None (missing or unusable)."""
    return check_result(run_dir).result


@dataclass(frozen=True)
class RunState:
    """A run's status and what it was decided from, so a caller can say why without reading again.

    ``changed``: for 'stale', the modules whose source changed since the result was made; ``code_reason``:
    for 'code unknown', why its code cannot be checked; ``check``: the result.json read.
    """

    status: str
    check: ResultCheck
    changed: tuple[str, ...] = ()
    code_reason: str = ""
    started: dict = field(default_factory=dict)


def run_state(run_dir: Path) -> RunState:
    """The one rule for a run's status, read from disk (launch, status, the runner and stage 2 all ask it):
    'done'             a usable result.json of a finished run whose recorded code is unchanged (every
                       module its computation executed, normalised: ``identity.code_state``);
    'code unknown'     the same, but its code cannot be checked (no record, an older partial one, a file gone);
    'stale'            a finished result made by code that has changed since;
    'failed'           a usable result.json of a run that failed;
    'damaged'          a result.json that is unusable (``check_result`` says why); run again to redo it;
    'running'          started, no result, and its process is alive (or ran on another host: unknown);
    'interrupted'      started, no result, and its process is gone (this host) or said it stopped (an I/O
                       fault, runner.RunInterrupted); run again to resume;
    'pending'          submitted or never started.
    """
    check = check_result(run_dir)
    if check.state == "done":
        verdict = identity.code_state(check.result)
        return RunState(verdict.status, check, verdict.changed, verdict.reason)
    if check.usable or check.state == OLDER:
        return RunState(check.state, check)
    if check.state == "unusable":
        return RunState("damaged", check)
    status, started = unfinished_state(run_dir)
    return RunState(status, check, started=started)


def unfinished_state(run_dir: Path) -> tuple[str, dict]:
    """('running' | 'interrupted' | 'pending', started.json) of a run without a usable result: the one rule
    ``status`` (through run_state) and tables (report/index.py) both ask, so they never disagree."""
    started = read_started(run_dir)
    if started or (Path(run_dir) / STARTED).exists():
        stopped = bool(started.get("interrupted")) or owner_alive(started) is False  # an I/O fault, or a dead owner
        return ("interrupted" if stopped else "running"), started
    return "pending", started


def run_status(run_dir: Path) -> str:
    """One word from disk (:func:`run_state` says which and why)."""
    return run_state(run_dir).status


def to_run(status: str, redo: tuple[str, ...] = ()) -> bool:
    """Does a launch run a run in this status? A 'done' or 'code unknown' one never (its result is usable; only
    its code cannot be compared); a 'failed' or 'stale' one only when asked (``redo`` names it); the others
    (pending, interrupted, damaged, running) always, since the worker decides again under the run's lock (a
    run still running elsewhere is then skipped)."""
    if status in ("done", CODE_UNKNOWN):
        return False
    return status in redo if status in ("failed", "stale") else True


def iter_result_checks(root: Path) -> list[tuple[Path, ResultCheck]]:
    """(run directory, check) for every result.json below ``root``, usable or not."""
    return [(p.parent, check_result(p.parent)) for p in sorted(Path(root).rglob(RESULT))]


# The caches ltbench keeps for a results folder (table index, recipe expansions) live in the folder itself
# when ltbench may write there, else in a per-user cache folder (cache_file).
CACHE_DIR_ENV = "LTBENCH_CACHE_DIR"  # set: every cache lives there, never in a results folder
SOURCE_TREE = Path(__file__).resolve().parents[2]  # the folder holding the ltbench package (a checkout's root)


def cache_file(root: Path, name: str) -> Path:
    """Where a results folder's cache file ``name`` lives: in the folder itself when it exists, is writable
    and is not part of the source tree (inside the checkout only its ``results/`` folder qualifies); else in
    the user's cache folder (``$XDG_CACHE_HOME/ltbench``, ``~/.cache/ltbench``), in a subfolder named after the
    folder's absolute path. Why: ``ltbench table docs/reference-results/x`` must never write into the docs, a
    shared or read-only results folder must still get a cache, and a recipe never run yet (no folder) is
    cached too, so its second ``status`` needs no torch. With $LTBENCH_CACHE_DIR set (the tests set it) every
    cache lives there."""
    root = Path(root)
    if not os.environ.get(CACHE_DIR_ENV) and _caches_beside(root):
        beside = root / name
        # A recipe cached before its first launch made the folder keeps its cache where it was made.
        if beside.exists() or not _in_cache_dir(user_cache_dir(), root, name, make=False).exists():
            return beside
    return _in_cache_dir(cache_home(), root, name)


def _in_cache_dir(home: Path, root: Path, name: str, make: bool = True) -> Path:
    folder = home / hashlib.sha1(os.fspath(root.resolve()).encode()).hexdigest()[:16]
    if make:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass  # unwritable: the cache is skipped when saved, tables still work
    return folder / name


def _caches_beside(root: Path) -> bool:
    resolved = root.resolve()
    in_source = resolved.is_relative_to(SOURCE_TREE) and not resolved.is_relative_to(SOURCE_TREE / "results")
    return not in_source and resolved.is_dir() and os.access(resolved, os.W_OK)


def cache_home() -> Path:
    """Where caches that belong to no results folder live (``ltbench list``'s): $LTBENCH_CACHE_DIR, else the
    user's cache folder."""
    return Path(os.environ.get(CACHE_DIR_ENV) or user_cache_dir())


def user_cache_dir() -> Path:
    """The per-user cache folder: ``$XDG_CACHE_HOME/ltbench``, else ``~/.cache/ltbench`` (a temporary folder
    of the user's when there is no home)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):
        base = os.path.join(tempfile.gettempdir(), f"ltbench-cache-{os.getuid()}")
    return Path(base) / "ltbench"
