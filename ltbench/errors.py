"""User-facing errors: the CLI prints them as one line and exits non-zero, without a traceback."""

import reprlib

#: How much of a bad value an error message may echo: enough to recognise it, never a 39 MB line.
ECHO_LIMIT = 200

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = ECHO_LIMIT
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 8
_repr.maxlevel = 3


def is_control(ch: str) -> bool:
    """A C0 or C1 control character or DEL (ESC, BEL, CR, NUL, a newline...): never printed as it is."""
    return ord(ch) < 32 or 127 <= ord(ch) < 160


def one_line(text: str) -> str:
    """``text`` with every control character a space: what a terminal, a markdown cell or a CSV cell may show
    (an ESC sequence would move the cursor or recolour the screen, a newline would add a forged row)."""
    text = str(text)
    return "".join(" " if is_control(ch) else ch for ch in text) if any(map(is_control, text)) else text


def shorten(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` on one line (control characters are spaces), cut to about ``limit`` characters, with its length
    and hash when cut (two long values that differ never read alike): the one bound on any text from the
    environment or the disk that reaches a message or a note (a 100 kB variable is not printed in full)."""
    text = one_line(text)
    if len(text) <= limit:
        return text
    import hashlib

    mark = f"... ({len(text)} characters, sha256 {hashlib.sha256(text.encode(errors='replace')).hexdigest()[:12]})"
    return text[: max(limit - len(mark), 8)] + mark


def short_repr(value: object, limit: int = ECHO_LIMIT) -> str:
    """repr() of a user's value, bounded in time and length however big or nested the value is."""
    return shorten(_repr.repr(value), limit)


class LtbenchError(Exception):
    """A problem the user can fix (bad recipe, missing data, unwritable directory...)."""


class ConfigError(LtbenchError):
    """A recipe or override does not validate; the message names the file and the dotted field."""


class DataMissingError(LtbenchError):
    """A dataset's files are not where they should be; the message says which files and how to get them."""


class NonFiniteLossError(LtbenchError):
    """Training produced a NaN or infinite loss."""


class DiskFullError(LtbenchError):
    """A write failed for lack of space; the message names the path and the space needed."""


class MethodContractError(LtbenchError):
    """A method's loss() or predict() returned something the engine cannot use (see docs/adding-a-method.md)."""


class WriteError(LtbenchError, OSError):
    """A file could not be written (EFBIG, EROFS, EACCES, EIO...): one line naming the file. Also an
    OSError, so code that treats a failed write as "no cache this time" keeps doing so."""

    def __init__(self, path, exc: OSError):
        OSError.__init__(self, exc.errno, exc.strerror or str(exc), str(path))
        self.message = f"cannot write {path} ({exc.strerror or exc}); free space, fix its permissions or choose " \
                       f"another folder, then run the same command again"

    def __str__(self) -> str:
        return self.message


class CorruptFileError(LtbenchError):
    """A dataset plugin found a file it cannot read (a truncated image, a damaged archive member).

    Raise it from a dataset's loading code with the file's path; the core reports it as one line naming
    that file (never "internal error"), and a run that meets it fails with that line as its error.
    docs/adding-a-dataset.md, "Corrupt files"."""

    def __init__(self, path, reason: str = "cannot be read"):
        self.path, self.reason = str(path), reason
        super().__init__(f"{path}: {reason} (a damaged dataset file: download or extract it again)")
