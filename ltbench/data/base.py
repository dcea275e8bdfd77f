"""The one shape every dataset takes once loaded, and the dataset plugin interface."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ltbench.config import EmptyConfig, check_prior_name
from ltbench.data.shift import shifted_test
from ltbench.errors import LtbenchError


# The view aliases methods ask for ("default", "strong", "sim", "eval") mapped to the augmentation
# pipelines of small-image datasets (CIFAR, Fashion-MNIST, synthetic); a dataset's own map is its
# VIEW_ALIASES (ImageNet-scale split lists have theirs in splitlist.py).
SMALL_IMAGE_VIEW_ALIASES = {"default": "standard", "strong": "autoaug_cutout", "sim": "simaug", "eval": "eval"}


@dataclass(frozen=True)
class ImageSpec:
    """What augmentation pipelines need to know about the images."""

    size: int  # side of the (square) training crop
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    kind: str = "small"  # "small": CIFAR-like arrays; "large": ImageNet-like files (resize/crop 224)
    # How "large" images are resized (random resized crop, evaluation resize) and the evaluation centre-crop
    # ratio (resize to size / crop_pct, crop size; None: 224/256). A pretrained backbone sets its own.
    interpolation: str = "bilinear"
    crop_pct: float | None = None


@dataclass
class LTData:
    """A loaded long-tailed dataset: training split, balanced (or given) test split, metadata."""

    name: str
    num_classes: int
    image: ImageSpec
    train: Dataset  # items: (image, label); image a uint8 CHW tensor
    train_labels: np.ndarray
    test: Dataset
    test_labels: np.ndarray
    subset_hash: str  # sha1 of the training indices (or of the split list)
    # named pipelines this dataset uses for the aliases methods ask for ("default", "strong", "sim", "eval")
    pipelines: dict[str, str] = field(default_factory=dict)
    class_names: list[str] | None = None
    info: dict[str, Any] = field(default_factory=dict)  # recorded in the result (files, checksums, ...)
    # A validation split (ltbench/data/validation.py), never trained on and never the test set; None: none.
    val: Dataset | None = None
    val_labels: np.ndarray | None = None

    @property
    def class_counts(self) -> np.ndarray:
        return np.bincount(self.train_labels, minlength=self.num_classes)

    @property
    def test_counts(self) -> np.ndarray:
        return np.bincount(self.test_labels, minlength=self.num_classes)

    @property
    def val_counts(self) -> np.ndarray | None:
        return None if self.val_labels is None else np.bincount(self.val_labels, minlength=self.num_classes)


def check_split_sizes(train_counts: Sequence[int] | np.ndarray, test_images: int, train_where: str,
                      test_where: str) -> None:
    """Refuse, in one line, a dataset no run can be benchmarked on: fewer than two classes with a training image
    (nothing to rank by frequency, and methods that divide by class counts would crash inside the run), or a test
    set of no image (every metric would be undefined and the run's record damaged). Built-in datasets call it from
    ``check()`` with counts read cheaply (lists, label files), so a launch stops before its first run; the engine
    calls it again on what ``load()`` returned, so a plugin dataset gets the same line from its run."""
    counts = np.asarray(train_counts)
    classes = int((counts > 0).sum())
    if classes < 2:
        raise LtbenchError(f"{train_where}: the training set has images of {classes} class(es) ({int(counts.sum())} "
                           f"image(s) in all); expected at least 2 classes with a training image; give files whose "
                           f"training split holds several classes, or other data: options")
    if int(test_images) == 0:
        raise LtbenchError(f"{test_where}: the test set holds no image; expected at least one test image (every "
                           f"metric is measured on it); give a test split with images, or other data: options")


def check_loaded(data: LTData, label: str) -> None:
    """``check_split_sizes`` on a loaded dataset (any plugin's), named by its registry label."""
    check_split_sizes(data.class_counts, len(data.test_labels), f"data: {label}", f"data: {label}")


@dataclass(frozen=True)
class DataFootprint:
    """What a dataset will hold, known from its options without loading it (``DatasetBuilder.footprint``):
    ltbench.train.resources estimates a run's memory from it before the first run (docs/adding-a-dataset.md)."""

    num_classes: int
    channels: int
    image_size: int  # the side of the training crop the backbone sees
    memory_bytes: int  # host memory load() holds at its peak (images kept in memory, temporaries); 0 for files


class DatasetBuilder:
    """Plugin interface: ``Config`` holds the recipe's ``data:`` options; ``load`` returns LTData
    (see docs/adding-a-dataset.md).

    ``load`` raises DataMissingError (listing the expected files and how to get them) when the
    data are not on disk.
    """

    Config: ClassVar[type] = EmptyConfig
    # (few, many): the shot-group thresholds this dataset suggests (few: fewer than `few` training images,
    # many: more than `many`). A recipe's eval.few_threshold / eval.many_threshold override them. The
    # field's convention (Liu et al., OLTR, CVPR 2019) is (20, 100); a dataset whose classes are all
    # smaller or larger may suggest its own, so Many / Medium / Few are not empty by construction.
    shot_thresholds: ClassVar[tuple[int, int]] = (20, 100)

    def __init__(self, cfg: Any):
        self.cfg = cfg

    def check(self) -> None:
        """Called once per distinct data config before any run starts: raise DataMissingError when the
        files are missing, so a grid stops with one message instead of failing in every run. Keep it cheap."""

    def split_ids(self) -> tuple[list, list] | None:
        """(validation sample ids, test sample ids), compared before the first run so that no validation
        sample is a test sample (validation.check_disjoint); None without a validation split. Default: what
        ``load()`` returns (validation.sample_ids). A dataset that can say it from its lists overrides it."""
        from ltbench.data.validation import sample_ids  # lazy: keeps data.base free of an import cycle

        data = self.load()
        return None if data.val is None else (sample_ids(data.val), sample_ids(data.test))

    def load(self) -> LTData:  # pragma: no cover - interface
        raise NotImplementedError

    def footprint(self) -> DataFootprint | None:
        """Classes, image shape and the memory ``load`` will take, from the options alone (no file read), so a
        configuration that cannot fit is refused before the first run (``ltbench.train.resources``); None when
        unknown (the run is then not estimated). Keep it cheap: it is called at every launch and --dry-run."""
        return None

    def data_identity(self) -> str | None:
        """What identifies this dataset's data beyond its options, or None when the options do.

        Options such as ``root`` are execution settings (ltbench/results/identity.py): they say where files are,
        not what they hold, so they are left out of the run id. A dataset whose files the user chooses
        (an image folder, an .npz under ``data.root``) returns a digest of them here (``digest_files``),
        so results of different data never share a run id or a table row. Called when a recipe is
        loaded (once per distinct ``data:`` configuration): keep it cheap, and raise DataMissingError
        when the files are missing. The built-in datasets return None: their files are fixed and
        checksummed (CIFAR, Fashion-MNIST) or named by published split lists.
        """
        return None

    @classmethod
    def check_test_set_name(cls, name: str) -> None:
        """Raise ValueError when ``name`` cannot name an extra test set of this dataset.

        Called when a recipe is loaded, so an unknown ``eval.test_sets`` name stops the recipe before
        any run trains (not after the whole training, at evaluation). Default: the SADE names below.
        """
        check_prior_name(name, "")

    def test_set(self, name: str, data: LTData) -> tuple[Dataset, np.ndarray]:
        """An extra test set by name, for ``eval.test_sets`` (the test-agnostic protocol).

        Default: the SADE construction (docs/protocols.md §6): 'forward<rho>' / 'backward<rho>' /
        'uniform' subsets of the balanced test split, drawn with the legacy global NumPy RNG seeded 0.
        Datasets with published shifted lists override this to read them.
        """
        shifted = shifted_test(data, name)
        return shifted.test, shifted.test_labels


def digest_files(paths: Sequence[Path], root: Path | None = None, content: bool = True) -> str:
    """sha256 (16 hex digits) of files, for ``DatasetBuilder.data_identity``: their names (relative to
    ``root`` when given, so a copy of a folder elsewhere has the same digest) and their bytes, or only
    their sizes with ``content=False`` (for large image folders, where reading every file would cost
    minutes: a removed, added, renamed or resized file still changes it)."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted(Path(p) for p in paths):
        name = path.relative_to(root).as_posix() if root is not None else path.name
        h.update(f"{name}\0{path.stat().st_size}\0".encode())
        if content:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()[:16]


def data_roots(root: str | None, folder: str, *extra: str) -> list[Path]:
    """Where to look for a dataset: ``root`` when given, else $LTBENCH_DATA/<folder>, ./data/<folder>
    and any ``extra`` system locations, in that order."""
    if root:
        return [Path(root).expanduser()]
    out = [Path(os.environ["LTBENCH_DATA"]) / folder] if os.environ.get("LTBENCH_DATA") else []
    return out + [Path("data") / folder] + [Path(e) for e in extra]


class ArrayImages(Dataset):
    """Images held in memory as a uint8 tensor (N, C, H, W)."""

    def __init__(self, images: torch.Tensor, labels: np.ndarray, ids: Sequence | None = None):
        assert images.dtype == torch.uint8 and images.ndim == 4
        self.images = images
        self.labels = np.asarray(labels, dtype=np.int64)
        self.ids = ids  # each image's identity, e.g. ('train', 17): its pool and index (validation.sample_ids)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.images[i], int(self.labels[i])


class MultiView(Dataset):
    """Applies several transforms to the same image: item = (tuple of views, label)."""

    def __init__(self, base: Dataset, transforms: Sequence[Callable]):
        self.base = base
        self.transforms = list(transforms)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        image, label = self.base[i]
        return tuple([t(image) for t in self.transforms]), label  # a list is cheaper than a generator here
