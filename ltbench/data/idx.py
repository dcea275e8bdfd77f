"""Reader for the IDX format (MNIST, Fashion-MNIST), gzipped or not."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from ltbench.errors import CorruptFileError

_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class CorruptIDXError(CorruptFileError, ValueError):
    """A damaged IDX file: one line naming it (CorruptFileError), and a ValueError as before."""


def read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:  # a truncated or damaged download
        raise CorruptIDXError(path, f"cannot be decompressed ({type(exc).__name__}: {exc})") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _DTYPES:
        raise CorruptIDXError(path, "not an IDX file (bad magic number)")
    ndim = data[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_DTYPES[data[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(data) - header != expected:
        raise CorruptIDXError(path, f"truncated IDX file ({len(data) - header} bytes of data, expected {expected})")
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
