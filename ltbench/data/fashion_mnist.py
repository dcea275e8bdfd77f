"""Fashion-MNIST-LT: the real Fashion-MNIST IDX files, long-tailed with the LDAM-DRW procedure.

The files are read directly (gzipped or not) rather than through torchvision's downloader: the
Debian package ``dataset-fashion-mnist`` ships them re-gzipped, so their checksums differ from the
ones torchvision expects, though the images are the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ltbench.config import check_range
from ltbench.data.base import (ArrayImages, DatasetBuilder, ImageSpec, LTData, SMALL_IMAGE_VIEW_ALIASES, check_split_sizes,
                               data_roots)
from ltbench.data.idx import read_idx
from ltbench.data.profile import exponential_counts, ldam_subset, subset_hash
from ltbench.data.validation import counts_record, unused_per_class
from ltbench.errors import DataMissingError, LtbenchError
from ltbench.registry import DATASETS

VIEW_ALIASES = SMALL_IMAGE_VIEW_ALIASES  # view alias -> augmentation pipeline

FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
CLASS_NAMES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
MEAN, STD = (0.2860,), (0.3530,)


@dataclass
class FashionMNISTLTConfig:
    imb_factor: float = 100.0  # rho = n_max / n_min
    max_per_class: int = 6000  # n_max; 500 gives the CIFAR-100-LT profile with all three shot groups
    data_seed: int = 0  # seed of the legacy global NumPy RNG that picks the subset (LDAM-DRW: 0)
    root: str | None = None  # folder with the IDX files; default: search (see candidate_roots)
    val_per_class: int = 0  # balanced validation: images per class drawn from those the subset did not keep (0: none; docs/protocol.md)

    def validate(self) -> None:
        if not 1 <= self.max_per_class <= 6000:
            raise ValueError("max_per_class must be between 1 and 6000 (Fashion-MNIST has 6000 per class)")
        check_range("imb_factor", self.imb_factor, 1, self.max_per_class,
                    unit=" (rho = n_max / n_min; at most max_per_class so the rarest class keeps an image)")
        check_range("data_seed", self.data_seed, 0, 2**32 - 1)
        check_range("val_per_class", self.val_per_class, 0, 6000)


def candidate_roots(root: str | None) -> list[Path]:
    """``root`` if given, else $LTBENCH_DATA/fashion-mnist, ./data/fashion-mnist, Debian's folder."""
    return data_roots(root, "fashion-mnist", DEBIAN_DIR)


def find_file(folder: Path, stem: str) -> Path | None:
    for sub in (folder, folder / "FashionMNIST" / "raw"):
        for name in (stem, stem + ".gz"):
            if (sub / name).is_file():
                return sub / name
    return None


def locate(root: str | None) -> dict[str, Path]:
    for folder in candidate_roots(root):
        found = {key: find_file(folder, stem) for key, stem in FILES.items()}
        if all(found.values()):
            return found  # type: ignore[return-value]
    searched = ", ".join(str(p) for p in candidate_roots(root))
    raise DataMissingError(
        f"Fashion-MNIST not found (searched {searched}); expected {', '.join(s + '[.gz]' for s in FILES.values())}. "
        f"Get them with 'apt-get install dataset-fashion-mnist' (Debian, puts them in {DEBIAN_DIR}) or "
        f"'python -m ltbench.data.fashion_mnist --download data/fashion-mnist' when online, or set data.root"
    )


@DATASETS.register("fashion_mnist_lt")
class FashionMNISTLT(DatasetBuilder):
    Config = FashionMNISTLTConfig

    def check(self) -> None:
        """The files are there, their training labels give the profile's subset, and the test split has images:
        found before the first run from the label files alone (70 KB), not inside every run."""
        files = locate(self.cfg.root)
        self.subset(files, read_idx(files["train_labels"]).astype(np.int64), len(read_idx(files["test_labels"])))

    def subset(self, files: dict[str, Path], train_y: np.ndarray, test_images: int) -> tuple[list[int], np.ndarray]:
        """(profile counts, LDAM-DRW subset indices); one line naming the label file when the files cannot give
        them, or the test split is empty (``check_split_sizes``)."""
        counts = exponential_counts(self.cfg.max_per_class, 10, self.cfg.imb_factor)
        try:
            idx = ldam_subset(train_y, counts, self.cfg.data_seed)
        except ValueError as exc:
            raise LtbenchError(f"{files['train_labels']}: {exc}; give the full Fashion-MNIST files, or a smaller "
                               f"data.max_per_class") from exc
        check_split_sizes(np.bincount(train_y[idx], minlength=10), test_images, str(files["train_labels"]),
                          str(files["test_labels"]))
        return counts, idx

    def load(self) -> LTData:
        cfg = self.cfg
        files = locate(cfg.root)
        arrays = {key: read_idx(path) for key, path in files.items()}
        train_y = arrays["train_labels"].astype(np.int64)
        counts, idx = self.subset(files, train_y, len(arrays["test_labels"]))
        train_x = torch.from_numpy(arrays["train_images"][idx].copy()).unsqueeze(1)
        test_x = torch.from_numpy(arrays["test_images"].copy()).unsqueeze(1)
        test_y = arrays["test_labels"].astype(np.int64)
        data = LTData(
            name="fashion_mnist_lt",
            num_classes=10,
            image=ImageSpec(size=28, channels=1, mean=MEAN, std=STD),
            train=ArrayImages(train_x, train_y[idx]),
            train_labels=train_y[idx],
            test=ArrayImages(test_x, test_y, [("test", j) for j in range(len(test_y))]),
            test_labels=test_y,
            subset_hash=subset_hash(idx),
            pipelines=dict(VIEW_ALIASES),
            class_names=CLASS_NAMES,
            info={"files": {k: str(v) for k, v in files.items()}, "counts_profile": counts},
        )
        if cfg.val_per_class:  # after the subset: the LDAM-DRW draw is exactly as without validation
            val_idx = unused_per_class(train_y, idx, cfg.val_per_class, cfg.data_seed)
            data.val = ArrayImages(torch.from_numpy(arrays["train_images"][val_idx].copy()).unsqueeze(1), train_y[val_idx],
                                   [("train", int(i)) for i in val_idx])
            data.val_labels = train_y[val_idx]
            data.info["validation"] = counts_record(data.val_labels, 10, cfg.val_per_class)
        return data


def download(folder: str) -> None:
    """Fetch the files with torchvision's downloader (needs internet) into ``folder``."""
    from torchvision.datasets import FashionMNIST

    for train in (True, False):
        FashionMNIST(folder, train=train, download=True)
    print(f"Fashion-MNIST is in {Path(folder) / 'FashionMNIST' / 'raw'}; ltbench finds it with data.root={folder}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Download Fashion-MNIST with torchvision")
    parser.add_argument("--download", metavar="FOLDER", required=True)
    download(parser.parse_args().download)
