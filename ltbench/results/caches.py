"""The one cache rule: a cache file is valid when its seal verifies, and nothing else decides it.

ltbench keeps what it would otherwise redo at every call: a recipe's expansion (which imports torch,
ltbench/recipe/expansion.py), the index of result summaries (ltbench/report/index.py), the plugin listing,
memory estimates, source parses (ltbench/results/provenance.py) and digests of large files
(:func:`remembered_for_file`). Each is a file anyone can edit and any disk can damage. So every cache file is
``ltbench-cache hmac-sha256:<hex>`` and its bytes, the hex being an HMAC-SHA256 under this user's key
(:func:`user_key`) of the code version (:func:`code_version`), the cache's own key inputs (what its value is a
function of: for an expansion, the recipe less its tables, the overrides, the plugin folders' code, the
installed plugin packages) and the bytes. A file whose seal does not verify (edited, truncated, made by other
code, for other inputs, under another user's or machine's key, or re-sealed by someone without the key) is
rebuilt from what it summarises, never read. There is no cache version and no re-check of entries: a change
of format changes the code version. One check stays where a cache names a folder: a cached run folder must lie
inside its results root. A change that cannot alter a cache's value (a table caption, an unrelated package
installed) is in no cache's inputs, so it keeps the cache. docs/trust.md says what the key protects.

Written best effort: a cache write (or key) that fails for any reason is skipped, the command's output is
the same, and one note on stderr (at most one per process) says why the next call will be slower.
No torch: status and tables use these on a login node.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import sys
from pathlib import Path
from typing import Any, Callable

from ltbench.errors import LtbenchError, shorten
from ltbench.results import store

SEAL = b"ltbench-cache hmac-sha256:"
KEY_ENV = "LTBENCH_CACHE_KEY"  # the key file's path (tests set it); default: the user's config folder
KEY_BYTES = 32
_noted: list[str] = []
_keys: dict[Path, bytes] = {}  # key file -> key, read once per process
_code_version: list[str] = []


class KeyRefused(LtbenchError):
    """The key file is not a regular 0600 file of this user: no cache is read or written."""


def key_path() -> Path:
    """$LTBENCH_CACHE_KEY, else ``cache.key`` in ``$XDG_CONFIG_HOME/ltbench`` (``~/.config/ltbench``)."""
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV])
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "ltbench" / "cache.key"


def user_key() -> bytes:
    """This user's cache key: read from :func:`key_path`, made there once (random, mode 0600) when absent. Made
    atomically: written under a temporary name and linked into place, so two processes end with one key.
    KeyRefused when the file is not a regular file of this user with mode 0600 (a link, a FIFO, a key others
    can read or replace): a key someone else can read lets them forge caches."""
    path = key_path()
    if path in _keys:
        return _keys[path]
    if not os.path.lexists(path):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
            os.close(fd)
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another process made it first: its key is the key
        finally:
            os.unlink(tmp)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o600 \
                or st.st_size != KEY_BYTES:
            raise KeyRefused(f"{path}: not a regular file of this user with mode 0600 holding {KEY_BYTES} bytes; "
                             f"caches are not used (fix: remove it, the next call makes a new one)")
        _keys[path] = os.read(fd, KEY_BYTES)
    finally:
        os.close(fd)
    return _keys[path]


def code_version() -> str:
    """What the running ltbench is: size and mtime of every Python file of ltbench and the built-in methods, and
    in a checkout of every package beside them (the plugin packages it ships), taken once per process."""
    if not _code_version:
        core = Path(__file__).resolve().parents[1]  # ltbench/ (this file is ltbench/results/caches.py)
        checkout = [d for d in sorted(core.parent.iterdir())
                    if (core.parent / "pyproject.toml").is_file() and (d / "__init__.py").is_file()]
        _code_version.append(code_signature([str(d) for d in checkout or [core, core.parent / "methods"]]) + sys.version)
    return _code_version[0]


def _digest(data: bytes, inputs: Any) -> bytes:
    message = json.dumps([code_version(), inputs], default=repr).encode() + b"\0" + data
    return hmac.new(user_key(), message, hashlib.sha256).hexdigest().encode()


def sealed(data: bytes, inputs: Any) -> bytes:
    """``data`` as a cache file holds it: the seal line (the HMAC of the code version, ``inputs`` and the bytes)."""
    return SEAL + _digest(data, inputs) + b"\n" + data


def unsealed(blob: bytes, inputs: Any) -> bytes | None:
    """The bytes a cache file seals, or None when its seal is missing or is not theirs under these inputs,
    this code and this user's key."""
    if not blob.startswith(SEAL):
        return None
    digest, newline, data = blob[len(SEAL):].partition(b"\n")
    return data if newline and hmac.compare_digest(digest, _digest(data, inputs)) else None


def read_sealed(path: Path, inputs: Any, limit: int = store.MAX_JSON_BYTES) -> bytes | None:
    """A cache file's bytes when it is a regular file within ``limit`` and its seal verifies; None otherwise
    (the caller rebuilds it)."""
    try:
        return unsealed(store.read_bounded(path, limit), inputs)
    except store.UnusableFile:
        return None
    except (OSError, LtbenchError) as exc:  # no usable key
        _note("cache not used", exc)
        return None


def write_sealed(path: Path, inputs: Any, data: bytes) -> bool:
    """Write a cache file atomically (its folder made first); False, and one note per process, when that
    fails for any reason. Why any reason: a cache is never needed, so no failure to keep one may cost the
    command its output (a full disk raises DiskFullError, which is not an OSError)."""
    try:
        store.make_dirs(Path(path).parent)
        store.atomic_write_bytes(Path(path), sealed(data, inputs))
        return True
    except (OSError, LtbenchError) as exc:
        _note("cache not written", exc)
        return False


def memo(path: Path, inputs: Any, compute: Callable[[], Any], refresh: bool = False) -> Any:
    """The JSON value kept in cache file ``path`` for ``inputs`` (what the value is a function of, besides the
    code), or ``compute()`` kept there (unless it is None) when the file is missing, unusable, or sealed for
    other inputs. ``refresh``: compute and keep without reading (a caller that had to do the work anyway)."""
    if not refresh:
        data = read_sealed(path, inputs)
        if data is not None:
            try:
                return store.parse_json(data, path)
            except store.UnusableFile:
                pass
    value = compute()
    if value is not None:
        try:
            data = json.dumps(value, allow_nan=False).encode()
        except (TypeError, ValueError):
            return value
        write_sealed(path, inputs, data)
    return value


def remembered_for_file(name: str, path: Path, compute: Callable[[Path], Any]) -> Any:
    """``compute(path)``, kept in ``store.cache_home()/files/`` for this file's real path, size, mtime, inode and
    device, so what is derived from a large file (a weights file's sha256, the label counts of a dataset's
    batches) is computed once per version of the file, not at every launch."""
    st = os.stat(path)
    real = os.path.realpath(path)
    inputs = [name, real, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]
    tag = hashlib.sha1(f"{name}\0{real}".encode()).hexdigest()[:16]
    return memo(store.cache_home() / "files" / f"{tag}.json", inputs, lambda: compute(path))


def _note(what: str, exc: BaseException) -> None:
    if not _noted:
        _noted.append(str(exc))
        print(f"ltbench: note: {what}, the next call will be slower: {shorten(str(exc), 300)}", file=sys.stderr)


def code_signature(folders: list[str]) -> str:
    """Size and mtime of every Python file discovery can import from these package folders
    (``plugin_code_files``)."""
    h = hashlib.sha1()
    for root in folders:
        for path in plugin_code_files(Path(root)):
            try:
                st = os.stat(path)
            except OSError:  # gone meanwhile, or unreadable: part of the signature as such
                h.update(f"{path}:gone;".encode())
                continue
            h.update(f"{path}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()


def installed_plugins() -> list[str]:
    """The installed distributions on sys.path that register ltbench plugins (an entry-point group
    ``ltbench.*``), each as its ``*.dist-info`` name (name and version) and the sha1 of its entry points: a
    plugin package installed, upgraded or removed changes this; any other package does not. Reads one
    small file per distribution that has one, not the 0.2 s of ``importlib.metadata.entry_points``."""
    out = []
    # Only *.dist-info: what pip installs, editable installs included. A checkout's *.egg-info (left by an
    # editable install in the working directory, on sys.path under python -m but not python -c) would make two
    # processes of one installation disagree.
    for folder in dict.fromkeys(p for p in sys.path if p and os.path.isdir(p)):
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".dist-info"))
        except OSError:
            continue
        for name in names:
            try:
                text = store.read_bounded(Path(folder, name, "entry_points.txt"), store.MiB, follow=True)
            except (store.UnusableFile, OSError):
                continue
            if b"[ltbench." in text:
                out.append(f"{folder}/{name}:{hashlib.sha1(text).hexdigest()}")
    return out


def plugin_code_files(root: Path) -> list[str]:
    """The Python files discovery and their imports can reach in a package folder, sorted: its ``*.py`` files
    and, recursively, those of its sub-packages (folders named like a module, holding ``__init__.py``);
    never a symlinked folder, never an editor's file (``.#x.py``, ``#x.py#``: not module names). Empty for a
    folder that is not a package name (discovery refuses it): ``$LTBENCH_PLUGIN_PATH=/`` walks nothing, and
    a folder of data beside the plugins is never walked."""
    root = Path(root)
    if not root.name.isidentifier() or not root.is_dir():
        return []
    out, stack = [], [str(root)]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            stem = e.name[:-3] if e.name.endswith(".py") else None
            if stem is not None and stem.isidentifier() and not e.is_dir(follow_symlinks=False):
                out.append(e.path)
            elif e.name.isidentifier() and e.is_dir(follow_symlinks=False) and os.path.isfile(os.path.join(e.path, "__init__.py")):
                stack.append(e.path)
    return sorted(out)
