"""User-facing errors: the CLI prints them as one line and exits non-zero, without a traceback."""


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
