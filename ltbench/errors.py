"""User-facing errors: the CLI prints them as one line and exits non-zero, without a traceback."""

import reprlib

#: How much of a bad value an error message may echo: enough to recognise it, never a 39 MB line.
ECHO_LIMIT = 200

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = ECHO_LIMIT
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 8
_repr.maxlevel = 3


def shorten(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` on one line, cut to about ``limit`` characters (with a marker saying so)."""
    text = " ".join(str(text).split("\n"))
    return text if len(text) <= limit else text[: limit - 14] + "... (truncated)"


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
