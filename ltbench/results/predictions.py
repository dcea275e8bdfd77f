"""Per-image test predictions of a run, kept so two runs can be compared image by image.

Accuracy alone cannot say whether two runs differ by more than the luck of the test draw; the
argmax per test image can (a paired bootstrap over images, see ``ltbench.report.significance``).  The
engine writes ``predictions.npz`` next to ``result.json`` at final evaluation:

  labels                     true labels of the main test set, in evaluation order
  head:<name>                argmax per test image of one prediction head; ``head:main`` is the
                             method's own prediction under the uniform prior (the numbers in
                             ``metrics.all``), other heads are those of ``metrics.heads``
  set:<name>:labels          labels of a named (shifted) test set from ``eval.test_sets``
  set:<name>:head:main       the method's prediction on that set

Arrays use the smallest unsigned integer type that holds the class indices and the file is
compressed, so a 10,000-image test set with a few heads costs tens of kilobytes.  numpy only:
tables and reports read these without torch.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Mapping

import numpy as np

from ltbench.results import store
from ltbench.results.store import atomic_write_bytes

PREDICTIONS = "predictions.npz"
PREDICTION_ARRAYS = "_prediction_arrays"  # where engine.evaluate hands the arrays to engine.train
MAIN_HEAD = "main"


def head_key(head: str = MAIN_HEAD, test_set: str | None = None) -> str:
    return f"head:{head}" if test_set is None else f"set:{test_set}:head:{head}"


def labels_key(test_set: str | None = None) -> str:
    return "labels" if test_set is None else f"set:{test_set}:labels"


def compact(values, num_classes: int) -> np.ndarray:
    """Class indices as the smallest unsigned integer type that holds ``num_classes - 1``."""
    return np.asarray(values).astype(np.min_scalar_type(max(int(num_classes) - 1, 0)), copy=False)


def save_predictions(run_dir: Path, arrays: Mapping[str, np.ndarray], num_classes: int) -> Path:
    """Write ``arrays`` (keys as in the module docstring) compressed and atomically into ``run_dir``."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **{key: compact(value, num_classes) for key, value in arrays.items()})
    path = Path(run_dir) / PREDICTIONS
    atomic_write_bytes(path, buffer.getvalue())
    return path


MAX_NPZ_MEMBER_BYTES = 8 * 1024 ** 3  # a (N, d) feature matrix of ImageNet-LT's training set is ~1 GB
MAX_NPZ_BYTES = 32 * 1024 ** 3  # a feature cache's split file; predictions are far smaller


def npz_problem(path: Path, max_member_bytes: int = MAX_NPZ_MEMBER_BYTES) -> str:
    """'' when ``path`` is a regular .npz whose members are plain (no object) arrays whose headers agree with
    their stored sizes, else what is wrong. Reads the headers only: a forged header claiming 10^12 entries
    is refused before numpy allocates anything."""
    try:
        f = store.open_bounded(path, MAX_NPZ_BYTES)
    except store.UnusableFile as exc:
        return exc.reason
    try:
        with f, zipfile.ZipFile(f) as zf:
            for info in zf.infolist():
                if info.file_size > max_member_bytes:
                    return f"member {info.filename[:60]} claims {info.file_size} bytes"
                with zf.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                        np.lib.format.read_array_header_2_0
                    shape, _, dtype = read(member)
                if dtype.hasobject:
                    return f"member {info.filename[:60]} holds Python objects"
                if int(np.prod(shape, dtype=object)) * dtype.itemsize > info.file_size:
                    return f"member {info.filename[:60]} claims shape {shape}, more than it stores"
    except Exception as exc:  # BadZipFile, a bad magic or header, zlib.error...
        return f"cannot be read as arrays ({type(exc).__name__}: {str(exc)[:120]})"
    return ""


def load_predictions(run_dir: Path) -> dict[str, np.ndarray] | None:
    """Every stored array, or None when the file is missing or damaged (never a traceback, never a hang:
    a FIFO, a forged header or a bad deflate stream all read as "no predictions")."""
    path = Path(run_dir) / PREDICTIONS
    if npz_problem(path):
        return None
    try:
        with store.open_bounded(path, MAX_NPZ_BYTES) as f, np.load(f, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except Exception:  # zlib.error on a flipped byte inside the stream, CRC errors, EOFError...
        return None


def _labels_and_correct(run_dir: Path, head: str, test_set: str | None):
    arrays = load_predictions(run_dir)
    if arrays is None:
        return None
    labels, pred = arrays.get(labels_key(test_set)), arrays.get(head_key(head, test_set))
    if labels is None or pred is None or labels.shape != pred.shape:
        return None
    return labels, pred == labels


def correct(run_dir: Path, head: str = MAIN_HEAD, test_set: str | None = None) -> np.ndarray | None:
    """Boolean per test image: was ``head`` right?  None when the predictions are not stored."""
    found = _labels_and_correct(run_dir, head, test_set)
    return None if found is None else found[1]


def correct_by_seed(run_dirs: Mapping[int, Path], head: str = MAIN_HEAD,
                    test_set: str | None = None) -> dict[int, np.ndarray]:
    """``correct`` of each seed's run, leaving out runs without stored predictions: the input of
    ``ltbench.report.significance.bootstrap_not_different_from_best``."""
    found = {seed: correct(run_dir, head, test_set) for seed, run_dir in run_dirs.items()}
    return {seed: c for seed, c in found.items() if c is not None}

