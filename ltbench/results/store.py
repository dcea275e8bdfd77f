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

import collections
import contextlib
import errno
import hashlib
import json
import os
import shutil
import socket
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ltbench.results import schema
from ltbench.errors import DiskFullError, LtbenchError, WriteError

SPEC, CONFIG, LOG, CHECKPOINT, RESULT = "spec.json", "config.yaml", "log.jsonl", "checkpoint.pt", "result.json"
STARTED, SUBMITTED = "started.json", "submitted.json"  # worker start (host, pid, Slurm ids); launcher job ids
LOCK, TRACEBACK = "lock", "traceback.txt"
TMP_MARK = ".tmp-"  # temporary files are named .<target>.tmp-XXXX
CODE_UNKNOWN = "code unknown"  # a finished result whose code cannot be checked (identity.code_state)
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
    return dict(collections.Counter(statuses))


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
# The one door to the disk. Every file below a results folder, a cache folder or a journal can be damaged (a
# truncated write), replaced (a FIFO, a symlink to /dev/zero or to a file of the user's, a 20 GB sparse file)
# or forged. So no module opens such a file itself (tests/test_one_door.py): it is read with ``read_bounded``
# (no symlink followed, a FIFO never blocks, regular files only, at most a bound) and written with
# ``atomic_write_bytes`` (a new file beside it, renamed over it: a planted link is replaced, never written
# through), ``open_append`` or ``lock_file``, all refused through a folder that leads out of a guarded root.

MiB = 1024 * 1024
MAX_JSON_BYTES = 64 * MiB  # a JSON record (a result.json of iNaturalist's 8,142 classes is ~1.5 MB)
MAX_JSON_DEPTH = 64  # nesting a record of ltbench ever has is below 10; anything deeper is damage
MAX_SMALL_BYTES = MiB  # progress.json, submitted.json, started.json, a feature cache's metadata


class UnusableFile(LtbenchError):
    """A file ltbench wrote cannot be used as it is; ``reason`` says why (without the path), ``path`` which."""

    def __init__(self, path: Path | str, reason: str):
        self.path, self.reason = Path(path), reason
        super().__init__(f"{path}: {reason}")


def regular_file_problem(path: Path | str, follow: bool = True) -> str:
    """'' when ``path`` is a regular file (after following symlinks when ``follow``: never for a results file), else
    why not; never opens it."""
    try:
        st = os.stat(path, follow_symlinks=follow)
    except (FileNotFoundError, NotADirectoryError):
        return "is missing"
    except OSError as exc:
        return _os_reason(exc)
    return "" if stat.S_ISREG(st.st_mode) else f"is not a regular file ({_kind(st.st_mode)})"


def open_bounded(path: Path | str, limit: int | None = None, follow: bool = False):
    """A binary file object of a regular file of at most ``limit`` bytes, for a reader that parses it itself
    (np.load, torch.load, zipfile); UnusableFile otherwise (missing included). Opened with O_NONBLOCK (a FIFO
    cannot block the open) and, unless ``follow`` (a file the user names: weights, a plugin's source), with
    O_NOFOLLOW (a planted link is refused, not read); checked with fstat, so the file checked is the file read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    except (FileNotFoundError, NotADirectoryError):
        raise UnusableFile(path, "is missing") from None
    except OSError as exc:
        raise UnusableFile(path, _os_reason(exc, follow)) from None
    size, mode = os.fstat(fd).st_size, os.fstat(fd).st_mode
    problem = ("is a directory" if stat.S_ISDIR(mode) else f"is not a regular file ({_kind(mode)})") \
        if not stat.S_ISREG(mode) else _too_big(size, limit) if limit is not None and size > limit else ""
    if problem:
        os.close(fd)
        raise UnusableFile(path, problem)
    return os.fdopen(fd, "rb")


def _too_big(size: int, limit: int) -> str:
    return f"is {size / MiB:.1f} MiB, more than the {limit / MiB:.0f} MiB such a file can hold"


def read_bounded(path: Path | str, limit: int = MAX_JSON_BYTES, follow: bool = False) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (``open_bounded``); UnusableFile otherwise."""
    with open_bounded(path, limit, follow) as f:
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise UnusableFile(path, _os_reason(exc, follow)) from None
    if len(data) > limit:  # it grew while being read
        raise UnusableFile(path, _too_big(len(data), limit))
    return data


def sha256_of(path: Path | str, progress=None, limit: int | None = None, follow: bool = True) -> str:
    """sha256 of a regular file's bytes, read in chunks (a checkpoint may be hundreds of MB); UnusableFile for
    anything else (a FIFO never blocks, /dev/zero is never read) and for a file over ``limit`` bytes (a data file
    a code record names: a 200 GB sparse file is refused, not hashed). ``progress(done, total)``, when given, is
    called after each chunk (bytes)."""
    with open_bounded(path, limit, follow) as f:
        total, digest, done = os.fstat(f.fileno()).st_size, hashlib.sha256(), 0
        try:
            while (chunk := f.read(4 * MiB)) and (limit is None or done <= limit):
                digest.update(chunk)
                done += len(chunk)
                if progress is not None:
                    progress(done, total)
        except OSError as exc:
            raise UnusableFile(path, _os_reason(exc, follow)) from None
    if limit is not None and done > limit:
        raise UnusableFile(path, _too_big(done, limit))
    return digest.hexdigest()


def parse_json(raw: bytes, path: Path | str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse JSON bytes; UnusableFile (naming ``path``) when they are not UTF-8, not JSON, or nested
    deeper than ``max_depth``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UnusableFile(path, "is not UTF-8 text") from None
    try:
        value = json.loads(text)
    except RecursionError:  # the C parser stops at the interpreter's recursion limit: caught, never fatal
        raise UnusableFile(path, f"is nested more than {max_depth} levels deep") from None
    except ValueError as exc:
        what = "empty" if not text.strip() else f"not valid JSON, truncated? ({getattr(exc, 'msg', exc)})"
        raise UnusableFile(path, f"is {what}") from None
    if isinstance(value, (dict, list)) and _too_deep(raw, max_depth):
        raise UnusableFile(path, f"is nested more than {max_depth} levels deep")
    return value


def load_json(path: Path | str, limit: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """:func:`read_bounded` then :func:`parse_json`: the only way ltbench reads a JSON file back."""
    return parse_json(read_bounded(path, limit), path, max_depth)


def load_json_object(path: Path | str, limit: int = MAX_SMALL_BYTES) -> dict:
    """A small JSON object (progress.json, submitted.json, started.json); {} when it is missing or unusable."""
    try:
        value = load_json(path, limit)
    except UnusableFile:
        return {}
    return value if isinstance(value, dict) else {}


# The depth bound, read from the text of a document that parsed (so its brackets nest properly and the kind of
# bracket does not matter): all but brackets and quotes dropped, '{}' read as '[]'.
_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKET_OR_QUOTE = bytes(b for b in range(256) if b not in b'[]{}"')


def _too_deep(raw: bytes, max_depth: int) -> bool:
    """True when the containers of a valid JSON text nest deeper than ``max_depth``: it takes one pass per level
    to remove every innermost ``[]`` pair of the brackets outside strings. Escaped backslashes, then escaped
    quotes go first, so every quote left opens or closes a string; two adjacent quotes bound an empty piece
    (an empty string, or the ',' between two strings), and dropping them joins two pieces that are both inside
    or both outside strings; the strings are then the odd pieces between quotes. A few passes of C over the
    text, where walking the parsed values cost a Python step per value (the index cache of 10,000 runs holds
    half a million)."""
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    text = text.translate(_SQUARE, _NOT_BRACKET_OR_QUOTE).replace(b'""', b"")
    brackets = b"".join(text.split(b'"')[::2])
    for _ in range(max_depth):
        if not brackets:
            return False
        brackets = brackets.replace(b"[]", b"")
    return bool(brackets)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a file"


def _os_reason(exc: OSError, follow: bool = True) -> str:
    if exc.errno == errno.ELOOP:
        return "is a symlink loop" if follow else "is a symlink (never followed in a results folder)"
    if exc.errno == errno.EISDIR:
        return "is not a regular file (a directory)"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "cannot be read (permission denied)"
    return f"cannot be read ({exc.strerror or exc})"


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
    """From now on, in this process, no file under ``root`` (a recipe's results folder, a cache folder) is
    written, and no folder made, through a symlinked folder that leads out of it (``check_inside``). The
    commands call it once they know the root (run, posthoc, table, report, plot; every run in its worker), so
    every writer is covered. A symlinked *file* is never written through (replaced by the atomic rename,
    refused by O_NOFOLLOW); a root that is itself a symlink (a results folder on another disk) is fine."""
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


def atomic_write_bytes(path: Path, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to a temporary file beside ``path`` (O_EXCL | O_NOFOLLOW: mkstemp) and rename it over
    ``path`` (``check_inside`` first): a crash leaves the old file or the new one, and a symlink at ``path`` is
    replaced, never written through. ``durable``: fsynced (not for a heartbeat: a lost beat costs nothing).

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
            if durable:
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
    if durable:
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


def _open_for_writing(path: Path, flags: int) -> int:
    """A descriptor of the regular file ``path``, created when missing (FILE_MODE): O_NOFOLLOW, so a planted
    link is refused (ELOOP), never written through; ``check_inside`` first. OSError as ``os.open`` raises it."""
    check_inside(path)
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symlink is there, never written through; move it away") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"is not a regular file ({_kind(mode)})")
    return fd


def open_append(path: Path):
    """``path`` opened for appending in binary (a worker's log, a run's log.jsonl), created when missing; a
    symlink, a FIFO or a folder there is refused (WriteError naming the file)."""
    try:
        return os.fdopen(_open_for_writing(Path(path), os.O_WRONLY | os.O_APPEND), "ab")
    except OSError as exc:
        raise WriteError(path, exc) from None


def append_jsonl(path: Path, obj: Any) -> None:
    line = canonical_line(obj).encode()
    try:
        with open_append(path) as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _disk_full(Path(path), exc, len(line)) from None
        raise WriteError(path, exc) from None


MAX_LOG_BYTES = 256 * MiB  # one line per epoch: a few MB for the longest schedules


def read_jsonl(path: Path) -> list[dict]:
    """Read a JSON-lines log, ignoring a torn (partially written) last line. A log that is not a
    readable file (a directory, say) reads as empty: the run that owns it sets it aside."""
    try:
        text = read_bounded(path, limit=MAX_LOG_BYTES).decode("utf-8", errors="replace")
    except UnusableFile:  # missing, not a regular file (a FIFO never blocks), too big
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
    """Create ``folder`` if needed and prove we can write there and take a lock there (before the first run's
    lock: ``_probe_lock`` names the mount where locks do not work); one clear error otherwise."""
    folder = Path(folder)
    check_inside(folder / "x")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob(".write-probe-*"):  # left by a launch killed mid-probe
            if time.time() - old.stat().st_mtime > 60:
                old.unlink(missing_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-probe-")
        try:
            _probe_lock(fd, folder)
        finally:
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
# The one flock: a run's lock, the search's lock and the TPE journal's lock


class LocksUnsupported(LtbenchError):
    """The filesystem of a results folder refuses file locks (ENOLCK, ENOSYS, EOPNOTSUPP): one line, exit 2."""


_NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


def mount_of(path: Path) -> tuple[str, str]:
    """(mount point, filesystem type) holding ``path``, from /proc/self/mounts; ('?', '?') where unknown."""
    real, best = os.path.realpath(path), ("?", "?")
    with contextlib.suppress(OSError), open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
        for point, kind in (line.split()[1:3] for line in f if line.count(" ") >= 2):
            point = point.replace("\\040", " ")
            if os.path.commonpath([real, point]) == point and len(point) >= len(best[0]):
                best = (point, kind)
    return best


def _probe_lock(fd: int, folder: Path) -> None:
    """LocksUnsupported, naming the mount and what to do, when ``flock`` fails on ``fd`` (a file in ``folder``)
    as it does on a filesystem without locks (NFS mounted ``nolock`` without local locks, Lustre without
    ``-o flock``, some FUSE filesystems: optuna#1300 'OSError: [Errno 38] Function not implemented')."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in _BUSY:
            return
        if exc.errno not in _NO_LOCKS:
            raise
        point, kind = mount_of(folder)
        raise LocksUnsupported(
            f"{folder}: file locks do not work on its filesystem ({point}, {kind}: {exc.strerror or exc}); ltbench "
            f"needs them so that two launches never train one run twice: use a --results folder on a disk with "
            f"locks (a local disk), or mount {point} with locking (NFS: without 'nolock'; Lustre: -o flock)") from None


def lock_file(path: Path, wait_s: float | None = None):
    """A file object holding an exclusive ``flock`` on ``path`` (created no-follow inside the root: the lock a run
    folder, a search and a journal have); closing it drops the lock, and the kernel drops it when the holder
    dies in any way (kill -9, OOM, Slurm cancel), so nothing is left to clean up. ``wait_s`` None: wait as long
    as it takes; else None once ``wait_s`` seconds passed with another process holding it.
    Shared filesystems: Linux NFS clients (since 2.6.12) turn flock into whole-file NFS byte-range locks, which
    exclude across nodes with NFSv4 or NFSv3 + lockd; after a node *crash* the server frees its locks only when
    the client's lease expires (NFSv4: 90 s by default) or, for NFSv3, when the node reboots, so a Slurm task
    requeued elsewhere waits for the claim (``wait_s``). With the NFS mount option ``nolock`` or
    ``local_lock=flock|all`` locks are per node and do NOT exclude across nodes; Lustre needs its ``flock``
    mount option. Where the filesystem refuses locks altogether: LocksUnsupported, naming the mount."""
    import fcntl

    path = Path(path)
    try:
        fd = _open_for_writing(path, os.O_RDWR)
    except OSError as exc:
        raise WriteError(path, exc) from None
    deadline = None if wait_s is None else time.monotonic() + wait_s
    lock = os.fdopen(fd, "rb")  # closing it drops the lock
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                return lock
            except OSError as exc:
                if exc.errno not in _BUSY:
                    _probe_lock(fd, path.parent)  # names the mount when it has no locks
                    raise
                if time.monotonic() >= deadline:
                    lock.close()
                    return None
            time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
    except BaseException:
        lock.close()
        raise


def claim_run(run_dir: Path, wait_s: float = 0.0):
    """Take the run's lock (``lock_file``), retrying for up to ``wait_s`` seconds: a file to close (or use in a
    ``with`` block) when the run is done; None when another process holds it."""
    path = Path(run_dir) / LOCK
    if os.path.islink(path) or (path.exists() and not path.is_file()):  # a planted link or a folder: kept aside
        set_aside(path)
    return lock_file(path, wait_s)


def read_started(run_dir: Path) -> dict:
    return load_json_object(Path(run_dir) / STARTED)


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
        obj = load_json(path)
    except UnusableFile as exc:
        if exc.reason == "is missing" and not os.path.lexists(path):
            return ResultCheck("missing")
        return ResultCheck("unusable", reason=f"result.json {exc.reason}")
    problem = schema.older_problem(obj) if schema.is_older(obj) else ""  # an older record migrate cannot read
    if schema.is_older(obj) and not problem:
        return ResultCheck("older", reason=older_note(Path(run_dir).parent))
    problem = problem or schema.result_problem(obj)
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
            obj = load_json(rec)
            if schema.is_older(obj, missing=1 if rec.name == SPEC else None) and not schema.older_problem(obj) \
                    and schema.names_folder(obj, rec.parent.name) and rec.parent not in out:  # a damaged one: damaged
                out.append(rec.parent)
        except UnusableFile:
            continue
    return out


def read_result(run_dir: Path) -> dict | None:
    """The usable result record of a run ('done' or 'failed'), or None (missing or unusable)."""
    return check_result(run_dir).result


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
        guard_writes_under(root)
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
    home = Path(os.environ.get(CACHE_DIR_ENV) or user_cache_dir())
    guard_writes_under(home)
    return home


def user_cache_dir() -> Path:
    """The per-user cache folder: ``$XDG_CACHE_HOME/ltbench``, else ``~/.cache/ltbench`` (a temporary folder
    of the user's when there is no home)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):
        base = os.path.join(tempfile.gettempdir(), f"ltbench-cache-{os.getuid()}")
    return Path(base) / "ltbench"
