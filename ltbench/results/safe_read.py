"""The one rule for reading back a file ltbench wrote: a regular file, of bounded size, parsed with bounded depth.

Why: every file below a results folder can be damaged (a truncated write, a flipped byte), replaced
(a FIFO, a symlink to /dev/zero, a symlink loop) or forged (a cache that parses but holds nonsense).
Reading any of them must never hang, never eat the memory, never raise past the caller, and always
say which file is wrong. So no reader opens such a file itself: it asks :func:`read_bytes` (which
opens without blocking, refuses anything that is not a regular file and reads at most a bound) and
:func:`load_json` (which bounds nesting depth, so a ``[[[[...`` file cannot end in RecursionError).
A failure is an :class:`UnusableFile` whose message names the file and says why; callers set the
file aside, redo what it held, or report it, each in its own words.

This module is layer 0: no torch, no numpy, nothing of ltbench but errors.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

from ltbench.errors import LtbenchError

MiB = 1024 * 1024
#: Default bound for a JSON record (a result.json of iNaturalist's 8,142 classes is ~1.5 MB).
MAX_JSON_BYTES = 64 * MiB
#: Nesting a record of ltbench ever has is below 10; anything deeper is damage.
MAX_JSON_DEPTH = 64


class UnusableFile(LtbenchError):
    """A file ltbench wrote cannot be used as it is; ``reason`` says why (without the path), ``path`` which."""

    def __init__(self, path: Path | str, reason: str):
        self.path, self.reason = Path(path), reason
        super().__init__(f"{path}: {reason}")


def regular_file_problem(path: Path | str) -> str:
    """'' when ``path`` is a regular file (after following symlinks), else why not; never opens it."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "is missing"
    except OSError as exc:
        return _os_reason(exc)
    return "" if stat.S_ISREG(st.st_mode) else f"is not a regular file ({_kind(st.st_mode)})"


def _open_nonblocking(path: Path | str) -> int:
    """A read-only descriptor opened with O_NONBLOCK, so a FIFO cannot block the open; UnusableFile when it
    cannot be opened (missing included). The callers check what it is with fstat on the descriptor."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise UnusableFile(path, "is missing") from None
    except OSError as exc:
        raise UnusableFile(path, _os_reason(exc)) from None


def read_bytes(path: Path | str, limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; UnusableFile otherwise (missing included).

    Opened with O_NONBLOCK, so a FIFO cannot block the open, and checked with fstat on the open
    descriptor, so the file read is the file checked (no race with a rename in between).
    """
    fd = _open_nonblocking(path)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UnusableFile(path, "is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise UnusableFile(path, f"is not a regular file ({_kind(st.st_mode)})")
        if st.st_size > limit:
            raise UnusableFile(path, f"is {st.st_size / MiB:.1f} MiB, more than the {limit / MiB:.0f} MiB such a file "
                                     f"can hold")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, MiB))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:  # it grew while being read
            raise UnusableFile(path, f"is more than the {limit / MiB:.0f} MiB such a file can hold")
        return data
    except OSError as exc:
        raise UnusableFile(path, _os_reason(exc)) from None
    finally:
        os.close(fd)


def sha256_of(path: Path | str, progress=None) -> str:
    """sha256 of a regular file's bytes, read in chunks (a checkpoint may be hundreds of MB); UnusableFile
    for anything else (a FIFO never blocks, /dev/zero is never read). ``progress(done, total)``, when given,
    is called after each chunk (bytes)."""
    import hashlib

    fd = _open_nonblocking(path)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnusableFile(path, f"is not a regular file ({_kind(st.st_mode)})")
        digest = hashlib.sha256()
        done = 0
        while chunk := os.read(fd, 4 * MiB):
            digest.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, st.st_size)
        return digest.hexdigest()
    except OSError as exc:
        raise UnusableFile(path, _os_reason(exc)) from None
    finally:
        os.close(fd)


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
    """:func:`read_bytes` then :func:`parse_json`: the only way ltbench reads a JSON file back."""
    return parse_json(read_bytes(path, limit), path, max_depth)


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
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


def _os_reason(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "is a symlink loop"
    if exc.errno == errno.EISDIR:
        return "is not a regular file (a directory)"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "cannot be read (permission denied)"
    return f"cannot be read ({exc.strerror or exc})"
