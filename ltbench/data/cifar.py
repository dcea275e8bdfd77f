"""CIFAR-10-LT and CIFAR-100-LT from the standard CIFAR python pickle batches (LDAM-DRW protocol).

On-disk layout (torchvision's: <root>/cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta},
<root>/cifar-100-python/{train, test, meta}); each batch is a pickle of uint8 ``data`` (N x 3072, channel-planar
RGB) and ``labels`` / ``fine_labels``, with byte-string keys. The training array is the batches concatenated in
order, as torchvision builds it, because the LDAM-DRW subset is defined on indices of that array
(``profile.ldam_subset``, seeded with ``data_seed``). img_max is computed from the data, as LDAM-DRW does, so a
smaller balanced file set gives a proportionally smaller profile; the real files give the counts of
docs/protocols.md §1. The test split is the full balanced CIFAR test set. Nothing is downloaded unless
``download: true``.
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from ltbench.config import check_range
from ltbench.data.base import (ArrayImages, DatasetBuilder, ImageSpec, LTData, SMALL_IMAGE_VIEW_ALIASES, check_split_sizes,
                               data_roots)
from ltbench.data.profile import exponential_counts, ldam_subset, subset_hash
from ltbench.data.validation import counts_record, unused_per_class
from ltbench.errors import DataMissingError, LtbenchError
from ltbench.registry import DATASETS
from ltbench.results import caches

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2023, 0.1994, 0.2010)
VIEW_ALIASES = SMALL_IMAGE_VIEW_ALIASES  # view alias -> augmentation pipeline
ARCHIVES_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
# docs/protocols.md §1: training-set totals of the 'exp' profile on the real files, asserted at load time
KNOWN_TOTALS = {
    10: {10.0: 20431, 50.0: 13996, 100.0: 12406, 200.0: 11203},
    100: {10.0: 19573, 50.0: 12608, 100.0: 10847, 200.0: 9502},
}


@dataclass(frozen=True)
class Layout:
    """Where one CIFAR variant's files are and what their keys are called."""

    name: str  # registered dataset name
    title: str
    num_classes: int
    folder: str  # sub-folder of root created by extracting the archive
    archive: str
    train_files: tuple[str, ...]
    test_file: str
    meta_file: str
    label_key: str
    names_key: str
    full_train: int = 50000
    full_test: int = 10000

    @property
    def files(self) -> tuple[str, ...]:
        return (*self.train_files, self.test_file, self.meta_file)


CIFAR10 = Layout(
    name="cifar10_lt", title="CIFAR-10", num_classes=10, folder="cifar-10-batches-py",
    archive="cifar-10-python.tar.gz", train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
    test_file="test_batch", meta_file="batches.meta", label_key="labels", names_key="label_names",
)
CIFAR100 = Layout(
    name="cifar100_lt", title="CIFAR-100", num_classes=100, folder="cifar-100-python",
    archive="cifar-100-python.tar.gz", train_files=("train",), test_file="test", meta_file="meta",
    label_key="fine_labels", names_key="fine_label_names",
)


@dataclass
class CIFARLTConfig:
    imb_factor: float = 100.0  # rho = n_max / n_min (LDAM-DRW passes 1/rho: 0.01 here is 100)
    imb_type: Literal["exp", "step"] = "exp"  # exponential profile, or step: half the classes many, half few
    data_seed: int = 0  # seed of the legacy global NumPy RNG that picks the subset (LDAM-DRW rand_number: 0)
    root: str | None = None  # folder holding cifar-10-batches-py/ or cifar-100-python/; default: search
    download: bool = False  # fetch the archive with torchvision when missing (needs internet); never by default
    val_per_class: int = 0  # balanced validation: images per class drawn from those the subset did not keep (0: none; docs/protocol.md)

    def validate(self) -> None:
        check_range("imb_factor", self.imb_factor, 1, 500,
                    unit=" (rho = n_max / n_min; above 500 the rarest CIFAR-100 class has no image)")
        check_range("data_seed", self.data_seed, 0, 2**32 - 1)
        check_range("val_per_class", self.val_per_class, 0, 5000)


def candidate_roots(root: str | None) -> list[Path]:
    """``root`` if given, else $LTBENCH_DATA/cifar and ./data/cifar."""
    return data_roots(root, "cifar")


def _folder_with_files(layout: Layout, root: Path) -> Path | None:
    # <root>/<folder>/... (torchvision layout), or root pointing at the extracted folder itself
    for folder in (root / layout.folder, root):
        if all((folder / f).is_file() for f in layout.files):
            return folder
    return None


def missing_message(layout: Layout, roots: list[Path]) -> str:
    searched = ", ".join(str(r / layout.folder) for r in roots)
    return (
        f"{layout.title} not found (searched {searched}); expected {layout.folder}/{{{','.join(layout.files)}}} "
        f"under data.root. Get them with data.download=true (needs internet; torchvision fetches {layout.archive}), "
        f"or download {layout.archive} (python version) from {ARCHIVES_URL} and extract it under data.root "
        f"(or $LTBENCH_DATA/cifar)"
    )


def locate(layout: Layout, root: str | None, download: bool = False) -> Path:
    roots = candidate_roots(root)
    for r in roots:
        found = _folder_with_files(layout, r)
        if found is not None:
            return found
    if download:
        target = roots[0]
        fetch(layout, target)
        found = _folder_with_files(layout, target)
        if found is not None:
            return found
    raise DataMissingError(missing_message(layout, roots))


def fetch(layout: Layout, root: Path) -> None:
    """Download and extract the archive with torchvision (only called when data.download is true)."""
    from torchvision.datasets import CIFAR10 as TV10, CIFAR100 as TV100

    cls = TV10 if layout.num_classes == 10 else TV100
    root.mkdir(parents=True, exist_ok=True)
    try:
        for train in (True, False):
            cls(str(root), train=train, download=True)
    except Exception as exc:  # no network, bad checksum, ...
        raise DataMissingError(
            f"could not download {layout.archive} into {root} ({type(exc).__name__}: {exc}); "
            f"download it from {ARCHIVES_URL} and extract it there"
        ) from exc


def _text(x: Any) -> Any:
    return x.decode("latin1") if isinstance(x, bytes) else x


# The only globals a CIFAR batch refers to: numpy array reconstruction (numpy 1 and 2 module names, pickle
# protocols 2-5) and, in batches re-pickled by Python 3 at protocol 2, codecs.encode for byte strings.
# Everything else (dicts, lists, str, bytes, int) needs no global at all.
ALLOWED_GLOBALS = {
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"), ("codecs", "encode"),
    ("__builtin__", "bytes"), ("builtins", "bytes"),  # an empty array's data at protocol 2: bytes() (no_argument_bytes)
}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles what a CIFAR batch holds and refuses any other class or function.

    A pickle can call any importable function while it loads; a tampered "data_batch_1" would otherwise
    run code with the user's rights as soon as a recipe names the dataset.
    """

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"refused global {module}.{name}: a CIFAR batch holds only dicts, lists, "
                                         f"str, bytes, int and numpy arrays")
        if module in ("numpy.core.multiarray", "numpy._core.multiarray"):
            return _numpy_attr("multiarray", name)
        if module in ("numpy.core.numeric", "numpy._core.numeric"):
            return _numpy_attr("numeric", name)
        if name == "bytes":
            return no_argument_bytes
        return super().find_class(module, name)


def no_argument_bytes(*args: Any) -> bytes:
    """``bytes()`` as an empty array's pickle calls it, and nothing else: ``bytes(n)`` would allocate n bytes."""
    if args:
        raise pickle.UnpicklingError("refused bytes() with arguments: a CIFAR batch calls it only for an empty array")
    return b""


def _numpy_attr(submodule: str, name: str) -> Any:
    """numpy.core was renamed numpy._core in numpy 2; old files name the old module."""
    import importlib

    for base in ("numpy._core", "numpy.core"):
        try:
            return getattr(importlib.import_module(f"{base}.{submodule}"), name)
        except (ImportError, AttributeError):
            continue
    raise pickle.UnpicklingError(f"numpy has no {submodule}.{name}")


def read_batch(path: Path) -> dict[str, Any]:
    """One pickled batch as a dict with str keys (the original files have byte-string keys)."""
    try:
        with open(path, "rb") as f:
            raw = RestrictedUnpickler(f, encoding="latin1").load()
    except Exception as exc:
        raise LtbenchError(f"{path}: not a readable CIFAR pickle batch ({type(exc).__name__}: {exc})") from exc
    if not isinstance(raw, dict):
        raise LtbenchError(f"{path}: not a CIFAR batch (expected a pickled dict, got {type(raw).__name__})")
    return {_text(k): v for k, v in raw.items()}


def read_split(layout: Layout, paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 3, 32, 32) uint8 and labels (N,) int64 of the batches, concatenated in order."""
    xs, ys = [], []
    for path in paths:
        batch = read_batch(path)
        if "data" not in batch or layout.label_key not in batch:
            raise LtbenchError(f"{path}: missing key 'data' or '{layout.label_key}' (keys: {sorted(batch)})")
        x = np.asarray(batch["data"])
        y = np.asarray(batch[layout.label_key], dtype=np.int64)
        if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3072 or len(x) != len(y):
            raise LtbenchError(f"{path}: expected data uint8 (N, 3072) and N labels, got data {x.dtype} "
                               f"{x.shape} and {len(y)} labels")
        if len(y) and (y.min() < 0 or y.max() >= layout.num_classes):
            raise LtbenchError(f"{path}: labels must be in 0..{layout.num_classes - 1}, found {y.min()}..{y.max()}")
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs).reshape(-1, 3, 32, 32), np.concatenate(ys)


LABEL_COUNTS_CACHE = "cifar-label-counts.json"


def batch_label_counts(layout: Layout, path: Path) -> list[int]:
    """Images per class in one batch file (``read_split``'s checks included), remembered by file version."""
    return caches.remembered_for_file(
        f"{LABEL_COUNTS_CACHE}:{layout.num_classes}", path, lambda p: np.bincount(read_split(layout, [p])[1], minlength=layout.num_classes).tolist())


def class_names(layout: Layout, folder: Path) -> list[str]:
    meta = read_batch(folder / layout.meta_file)
    names = [_text(n) for n in meta.get(layout.names_key, [])]
    if len(names) != layout.num_classes:
        raise LtbenchError(f"{folder / layout.meta_file}: expected {layout.num_classes} names under "
                           f"'{layout.names_key}', found {len(names)}")
    return names


def lt_counts(num_classes: int, img_max: float, imb_factor: float, imb_type: str = "exp") -> list[int]:
    """LDAM-DRW ``get_img_num_per_cls`` with rho = imb_factor (n_max / n_min)."""
    if imb_type == "exp":
        return exponential_counts(img_max, num_classes, imb_factor)  # type: ignore[arg-type]
    if imb_type == "step":
        half = num_classes // 2
        return [int(img_max)] * half + [int(img_max * (1.0 / imb_factor))] * half
    raise ValueError(f"imb_type must be 'exp' or 'step', got {imb_type!r}")


def ldam_img_max(train_labels: np.ndarray, num_classes: int) -> float:
    """LDAM-DRW: ``img_max = len(data) / cls_num`` (5000.0 / 500.0 for the real CIFAR train sets)."""
    return len(train_labels) / num_classes


class CIFARLT(DatasetBuilder):
    Config = CIFARLTConfig
    layout: Layout = CIFAR10

    def check(self) -> None:
        """The files are there, their training pool holds the profile's subset, and the test split has images
        (``check_split_sizes``): found before the first run, not inside every run. The labels sit in the pickled
        batches beside the images, so each batch's label counts are kept in the cache folder by file version
        (``caches.remembered_for_file``): read whole once, not at every launch."""
        lay = self.layout
        folder = locate(lay, self.cfg.root, self.cfg.download)
        pool = sum(np.asarray(batch_label_counts(lay, folder / f)) for f in lay.train_files)
        counts = lt_counts(lay.num_classes, pool.sum() / lay.num_classes, self.cfg.imb_factor, self.cfg.imb_type)
        short = [c for c in range(lay.num_classes) if pool[c] < counts[c]]
        if short:
            c = short[0]
            raise LtbenchError(f"{folder}: class {c} has {pool[c]} images, fewer than the {counts[c]} the profile asks for")
        check_split_sizes(counts, sum(batch_label_counts(lay, folder / lay.test_file)),
                          f"{folder / lay.train_files[0]}", f"{folder / lay.test_file}")

    def load(self) -> LTData:
        cfg, lay = self.cfg, self.layout
        folder = locate(lay, cfg.root, cfg.download)
        train_x, train_y = read_split(lay, [folder / f for f in lay.train_files])
        test_x, test_y = read_split(lay, [folder / lay.test_file])
        img_max = ldam_img_max(train_y, lay.num_classes)
        counts = lt_counts(lay.num_classes, img_max, cfg.imb_factor, cfg.imb_type)
        try:
            idx = ldam_subset(train_y, counts, cfg.data_seed)
        except ValueError as exc:
            raise LtbenchError(f"{folder}: {exc}") from exc
        check_split_sizes(np.bincount(train_y[idx], minlength=lay.num_classes), len(test_y),
                          f"{folder / lay.train_files[0]}", f"{folder / lay.test_file}")
        standard = len(train_y) == lay.full_train and len(test_y) == lay.full_test and bool(
            (np.bincount(train_y, minlength=lay.num_classes) == lay.full_train // lay.num_classes).all())
        known = KNOWN_TOTALS[lay.num_classes].get(float(cfg.imb_factor)) if cfg.imb_type == "exp" else None
        if standard and known is not None and len(idx) != known:  # would be a floating-point regression
            raise LtbenchError(f"{lay.name} rho={cfg.imb_factor}: {len(idx)} training images, the protocol has {known}")
        sub_y = train_y[idx]
        data = LTData(
            name=lay.name,
            num_classes=lay.num_classes,
            image=ImageSpec(size=32, channels=3, mean=MEAN, std=STD, kind="small"),
            train=ArrayImages(torch.from_numpy(train_x[idx]), sub_y),
            train_labels=sub_y,
            test=ArrayImages(torch.from_numpy(test_x), test_y, [("test", j) for j in range(len(test_y))]),
            test_labels=test_y,
            subset_hash=subset_hash(idx),
            pipelines=dict(VIEW_ALIASES),
            class_names=class_names(lay, folder),
            info={
                "folder": str(folder),
                "files": list(lay.files),
                "img_max": img_max,
                "counts_profile": counts,
                "full_train_size": int(len(train_y)),
                "standard_files": standard,  # False: a reduced file set (e.g. tests), not the benchmark
                "train_labels_sha1": hashlib.sha1(train_y.astype(np.int64).tobytes()).hexdigest(),
            },
        )
        if cfg.val_per_class:  # after the subset, with its own generator: the LDAM-DRW subset is untouched
            val_idx = unused_per_class(train_y, idx, cfg.val_per_class, cfg.data_seed)
            data.val = ArrayImages(torch.from_numpy(train_x[val_idx]), train_y[val_idx], [("train", int(i)) for i in val_idx])
            data.val_labels = train_y[val_idx]
            data.info["validation"] = counts_record(data.val_labels, lay.num_classes, cfg.val_per_class)
        return data


@DATASETS.register("cifar10_lt")
class CIFAR10LT(CIFARLT):
    """CIFAR-10-LT (LDAM-DRW subset of the CIFAR-10 python batches; balanced 10k test set)."""

    layout = CIFAR10


@DATASETS.register("cifar100_lt")
class CIFAR100LT(CIFARLT):
    """CIFAR-100-LT (LDAM-DRW subset of the CIFAR-100 python batches; balanced 10k test set)."""

    layout = CIFAR100


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Download CIFAR-10/100 (python version) with torchvision")
    parser.add_argument("--download", metavar="FOLDER", required=True)
    parser.add_argument("--which", choices=["10", "100", "both"], default="both")
    args = parser.parse_args()
    for lay in {"10": [CIFAR10], "100": [CIFAR100], "both": [CIFAR10, CIFAR100]}[args.which]:
        fetch(lay, Path(args.download))
        print(f"{lay.title} is in {Path(args.download) / lay.folder}; ltbench finds it with data.root={args.download}")
