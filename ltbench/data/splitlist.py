"""ImageNet-LT, Places-LT and iNaturalist 2018 from the published split lists and an image folder.

A split list has one ``<relative image path> <integer label>`` per line; the lists are the standard published
ones (OLTR / classifier-balancing; docs/protocols.md §2), found by their standard file names (ImageNet_LT_*.txt,
Places_LT_*.txt, iNaturalist18_*.txt) in ``split_dir``, else ``root``, else ``$LTBENCH_SPLITS``. ``test_split``
picks the test list ('test', 'val', or e.g. 'forward50' for the shifted-test protocol, docs/protocols.md §6).
Class counts come from the lists alone and images are opened lazily, so ``ltbench data`` works without the
images; ``check()`` (before training) verifies the lists in full and the first few images of each.
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from ltbench.config import check_range
from ltbench.data.base import DatasetBuilder, ImageSpec, LTData, check_split_sizes
from ltbench.data.validation import counts_record, hold_out
from ltbench.errors import CorruptFileError, DataMissingError, LtbenchError
from ltbench.registry import DATASETS

SPLITS_ENV = "LTBENCH_SPLITS"
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
INAT_MEAN, INAT_STD = (0.466, 0.471, 0.380), (0.195, 0.194, 0.192)
VIEW_ALIASES = {"default": "imagenet_train", "strong": "randaugment", "sim": "simaug", "eval": "eval"}
OLTR = "https://github.com/zhmiao/OpenLongTailRecognition-OLTR, Google-Drive folder linked in its README"
CLS_BAL = "https://github.com/facebookresearch/classifier-balancing"
IMAGES_CHECKED = 3  # images per list whose existence check() verifies

# torchvision 0.29 deprecates its image codecs in favour of TorchCodec and warns on every call; the
# decoder is still the one pinned here, so keep that one message from flooding logs (nothing else).
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision are deprecated",
                        category=DeprecationWarning)


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str
    prefix: str  # list file names: <prefix><split>.txt
    subfolder: str  # where the reference repositories keep the lists (data/<subfolder>/)
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    test_list: str  # the list used as the test set when test_split == 'test'
    published: str  # where the lists are published
    images: str  # what the image root must contain
    # line counts of the published lists (docs/protocols.md §2 and §6), recorded and checked
    known_lines: dict[str, int]
    pipelines: dict[str, str] = field(default_factory=dict)  # overrides of the VIEW_ALIASES map

    def list_name(self, split: str) -> str:
        if split == "test":
            split = self.test_list
        return f"{self.prefix}{split}.txt"


IMAGENET_LT = Benchmark(
    name="imagenet_lt", title="ImageNet-LT", prefix="ImageNet_LT_", subfolder="ImageNet_LT", num_classes=1000,
    mean=IMAGENET_MEAN, std=IMAGENET_STD, test_list="test",
    published=f"OLTR ({OLTR}) and classifier-balancing ({CLS_BAL}, data/ImageNet_LT/)",
    images="the ILSVRC-2012 images as train/<wnid>/*.JPEG and val/<wnid>/*.JPEG (val sorted into wnid folders)",
    known_lines={"train": 115846, "val": 20000, "test": 50000, "forward50": 12058, "backward50": 12058,
                 "forward2": 35574},
)
PLACES_LT = Benchmark(
    name="places_lt", title="Places-LT", prefix="Places_LT_", subfolder="Places_LT", num_classes=365,
    mean=IMAGENET_MEAN, std=IMAGENET_STD, test_list="test",
    published=f"OLTR ({OLTR}) and classifier-balancing ({CLS_BAL}, data/Places_LT/)",
    images="the Places365-Standard images as the list paths say (train/<scene>/..., val/...)",
    known_lines={"train": 62500, "test": 36500},
)
INAT2018 = Benchmark(
    name="inat2018", title="iNaturalist 2018", prefix="iNaturalist18_", subfolder="iNaturalist18", num_classes=8142,
    mean=INAT_MEAN, std=INAT_STD, test_list="val",
    published=f"classifier-balancing ({CLS_BAL}, data/iNaturalist18/, made by gen_lists.py from train2018.json/"
              f"val2018.json)",
    images="the extracted iNaturalist 2018 train_val2018/ folder",
    known_lines={"train": 437513, "val": 24426, "forward3": 11147, "backward3": 11137},
    pipelines={"default": "standard"},  # Decoupling's iNat recipe: random resized crop + flip, no colour jitter
)
BENCHMARKS = {b.name: b for b in (IMAGENET_LT, PLACES_LT, INAT2018)}


@dataclass
class SplitListConfig:
    root: str | None = None  # image root the list paths are relative to (required for training)
    split_dir: str | None = None  # folder with the split lists; default: root, then $LTBENCH_SPLITS
    test_split: str = "test"  # 'test', 'val', or a shifted list such as 'forward50' / 'backward50'
    check_images: bool = True  # check() verifies that the first few images of each list exist
    # default: the benchmark's (1000 / 365 / 8142), and the train list must span exactly that many labels;
    # set it only for a reduced or custom list (labels must then be < num_classes)
    num_classes: int | None = None
    # Validation (docs/protocol.md): a published list ('val' for ImageNet-LT and Places-LT), or, where the
    # val list is the test set (iNaturalist 2018), val_per_class images per class held out of the training
    # list (each class keeps at least one; this changes the training set, so it is in the run id).
    val_split: str | None = None
    val_per_class: int = 0  # images per class held out of the training list as validation (0: none)

    def validate(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_]+", self.test_split):
            raise ValueError(f"test_split must be a list name such as test, val or forward50, got {self.test_split!r}")
        if self.test_split == "train":
            raise ValueError("test_split must not be the training list")
        check_range("num_classes", self.num_classes, 2, 1_000_000)
        check_range("val_per_class", self.val_per_class, 0, 100_000)
        if self.val_split is not None:
            if not re.fullmatch(r"[A-Za-z0-9_]+", self.val_split) or self.val_split == "train":
                raise ValueError(f"val_split must name a published list other than train, such as val, got {self.val_split!r}")
            if self.val_per_class:
                raise ValueError("val_split and val_per_class are two validation sets; set one of them")


# --------------------------------------------------------------------------------------------
# Split lists


@dataclass
class SplitList:
    path: Path  # the list file
    paths: list[str]  # relative image paths
    labels: np.ndarray  # int64
    lines: np.ndarray  # 1-based line number of each sample, for messages
    sha1: str  # of the file's bytes


def read_split_list(path: Path) -> SplitList:
    """Parse a ``<relative path> <int label>`` list; a malformed line is an error naming file and line."""
    data = Path(path).read_bytes()
    paths: list[str] = []
    labels: list[int] = []
    lines: list[int] = []
    for n, raw in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        parts = line.rsplit(None, 1)
        if len(parts) != 2 or not re.fullmatch(r"-?\d+", parts[1]):
            raise LtbenchError(f"{path}:{n}: malformed line {raw[:80]!r}; "
                               f"expected '<relative image path> <integer label>'")
        paths.append(parts[0])
        labels.append(int(parts[1]))
        lines.append(n)
    if not paths:
        raise LtbenchError(f"{path}: the split list is empty; expected one '<relative image path> <integer label>' "
                           f"line per image; give the published list, or write its images' lines into it")
    return SplitList(Path(path), paths, np.asarray(labels, dtype=np.int64), np.asarray(lines, dtype=np.int64),
                     hashlib.sha1(data).hexdigest())


def folder_class_names(lst: SplitList, num_classes: int) -> list[str] | None:
    """Class names from the paths' folders ('train/n01440764/x.JPEG' -> 'n01440764'), when consistent."""
    names: dict[int, str] = {}
    for path, label in zip(lst.paths, lst.labels.tolist()):
        parts = path.split("/")
        name = "/".join(parts[1:-1]) if len(parts) > 2 else ""
        if names.setdefault(label, name) != name or not name:
            return None
    return [names.get(c, "") for c in range(num_classes)]


def check_labels(lst: SplitList, num_classes: int) -> None:
    bad = np.flatnonzero((lst.labels < 0) | (lst.labels >= num_classes))
    if len(bad):
        i = int(bad[0])
        raise LtbenchError(f"{lst.path}:{lst.lines[i]}: label {lst.labels[i]} out of range 0..{num_classes - 1} "
                           f"({len(bad)} such line(s))")


def split_dirs(cfg: SplitListConfig) -> list[Path]:
    """Folders searched for the lists, in order."""
    if cfg.split_dir:
        bases = [Path(cfg.split_dir).expanduser()]
    else:
        bases = [Path(cfg.root).expanduser()] if cfg.root else []
        if os.environ.get(SPLITS_ENV):
            bases += [Path(p).expanduser() for p in os.environ[SPLITS_ENV].split(os.pathsep) if p.strip()]
    return bases


def find_list(bench: Benchmark, cfg: SplitListConfig, split: str) -> Path:
    name = bench.list_name(split)
    bases = split_dirs(cfg)
    for base in bases:
        for folder in (base, base / bench.subfolder):
            if (folder / name).is_file():
                return folder / name
    where = ", ".join(str(b) for b in bases) or "nowhere: data.root, data.split_dir and $LTBENCH_SPLITS are all unset"
    raise DataMissingError(
        f"{bench.title} split list {name} not found (searched {where}); the lists are published by "
        f"{bench.published}; put them in data.split_dir, data.root or ${SPLITS_ENV}"
    )


# --------------------------------------------------------------------------------------------
# Images


class FileImages(Dataset):
    """Images read lazily from files: item = (uint8 CHW RGB tensor, label)."""

    def __init__(self, root: str | Path | None, paths: list[str], labels: np.ndarray, source: str = "",
                 lines: np.ndarray | None = None):
        self.root = Path(root) if root is not None else None
        self.paths = list(paths)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.source = source  # the list file, for messages
        self.lines = lines

    def __len__(self) -> int:
        return len(self.labels)

    def file(self, i: int) -> Path:
        if self.root is None:
            raise DataMissingError(
                f"data.root is not set: images of {self.source or 'the split list'} cannot be opened")
        return self.root / self.paths[i]

    @property
    def ids(self) -> list[str]:
        """Each image's identity: its path under the image root, normalised ('a/./b' is 'a/b')."""
        return [os.path.normpath(p) for p in self.paths]

    def where(self, i: int) -> str:
        if not self.source:
            return ""
        line = f":{self.lines[i]}" if self.lines is not None else ""
        return f" (listed at {self.source}{line})"

    def __getitem__(self, i: int):
        from torchvision.io import ImageReadMode, decode_image

        path = self.file(i)
        if not path.is_file():
            raise DataMissingError(f"image {path} not found{self.where(i)}")
        try:
            image = decode_image(str(path), mode=ImageReadMode.RGB)
        except Exception as exc:
            raise CorruptFileError(path, f"cannot be decoded as an image ({type(exc).__name__}: {exc}){self.where(i)}") \
                from exc
        return image, int(self.labels[i])


# --------------------------------------------------------------------------------------------
# The dataset plugin


class SplitListDataset(DatasetBuilder):
    Config = SplitListConfig
    bench: Benchmark = IMAGENET_LT

    @classmethod
    def check_test_set_name(cls, name: str) -> None:
        """Any list name (a published shifted list such as forward50); the file is looked up at load."""
        if not re.fullmatch(r"[A-Za-z0-9_]+", name) or name == "train":
            raise ValueError(f"{name!r} is not a test list name such as forward50 or val")

    def lists(self) -> tuple[SplitList, SplitList, int]:
        """(train list, test list, num_classes), validated."""
        cfg, bench = self.cfg, self.bench
        train = read_split_list(find_list(bench, cfg, "train"))
        test = read_split_list(find_list(bench, cfg, cfg.test_split))
        k = int(train.labels.max()) + 1
        if cfg.num_classes is None:
            check_labels(train, bench.num_classes)
            if k != bench.num_classes:
                raise LtbenchError(
                    f"{train.path}: labels span 0..{k - 1} ({k} classes) but {bench.title} has {bench.num_classes}; "
                    f"use the published list, or set data.num_classes for a reduced one"
                )
        else:
            k = cfg.num_classes
            check_labels(train, k)
        check_labels(test, k)
        return train, test, k

    def root(self) -> Path:
        cfg, bench = self.cfg, self.bench
        if not cfg.root:
            raise DataMissingError(
                f"{bench.title}: data.root (the image folder) is not set; it must hold {bench.images}")
        root = Path(cfg.root).expanduser()
        if not root.is_dir():
            raise DataMissingError(f"{bench.title}: image root {root} does not exist; it must hold {bench.images}")
        return root

    def check(self) -> None:
        train, test, k = self.lists()
        check_split_sizes(np.bincount(train.labels, minlength=k), len(test.paths), str(train.path), str(test.path))
        if self.cfg.val_split:  # an empty or malformed validation list stops the launch, not every run
            check_labels(read_split_list(find_list(self.bench, self.cfg, self.cfg.val_split)), k)
        root = self.root()
        if not self.cfg.check_images:
            return
        for lst in (train, test):
            for i in range(min(IMAGES_CHECKED, len(lst.paths))):
                if not (root / lst.paths[i]).is_file():
                    raise DataMissingError(
                        f"image {root / lst.paths[i]} not found (listed at {lst.path}:{lst.lines[i]}); "
                        f"{self.bench.title} needs {self.bench.images} under data.root"
                    )

    def split_ids(self) -> tuple[list, list] | None:
        """The validation and test images' paths, from the lists alone (no image opened)."""
        cfg = self.cfg
        if not (cfg.val_split or cfg.val_per_class):
            return None
        train, test, _ = self.lists()
        if cfg.val_split:
            val = read_split_list(find_list(self.bench, cfg, cfg.val_split)).paths
        else:
            val = [train.paths[i] for i in hold_out(train.labels, cfg.val_per_class, 0)[1]]
        return [os.path.normpath(p) for p in val], FileImages(None, test.paths, test.labels).ids

    def test_set(self, name: str, data: LTData):
        """A published shifted list (e.g. ImageNet_LT_forward50.txt, from SADE) when it can be found."""
        lst = read_split_list(find_list(self.bench, self.cfg, name))
        check_labels(lst, data.num_classes)
        root = Path(self.cfg.root).expanduser() if self.cfg.root else None
        return FileImages(root, lst.paths, lst.labels, str(lst.path), lst.lines), lst.labels

    def load(self) -> LTData:
        cfg, bench = self.cfg, self.bench
        train, test, k = self.lists()
        root = Path(cfg.root).expanduser() if cfg.root else None
        info_lists = {}
        for split, lst in (("train", train), (cfg.test_split, test)):
            known = bench.known_lines.get(bench.test_list if split == "test" else split)
            info_lists[split] = {"file": str(lst.path), "lines": len(lst.paths), "sha1": lst.sha1,
                                 "published_lines": known}
            if cfg.num_classes is None and known is not None and known != len(lst.paths):
                warnings.warn(f"{lst.path}: {len(lst.paths)} samples, the published list has {known}", stacklevel=2)
        if cfg.val_per_class or cfg.val_split:
            return self.with_validation(train, test, k, root, info_lists)
        return LTData(
            name=bench.name,
            num_classes=k,
            image=ImageSpec(size=224, channels=3, mean=bench.mean, std=bench.std, kind="large"),
            train=FileImages(root, train.paths, train.labels, str(train.path), train.lines),
            train_labels=train.labels,
            test=FileImages(root, test.paths, test.labels, str(test.path), test.lines),
            test_labels=test.labels,
            subset_hash=train.sha1,  # the training split is the list itself
            pipelines={**VIEW_ALIASES, **bench.pipelines},
            class_names=folder_class_names(train, k),
            info={"root": str(root) if root else None, "test_split": cfg.test_split, "lists": info_lists},
        )


    def with_validation(self, train: SplitList, test: SplitList, k: int, root, info_lists: dict) -> LTData:
        """The dataset with its validation split: the published ``val_split`` list, or ``val_per_class``
        images per class held out of the training list (the training set is then the rest)."""
        cfg, bench = self.cfg, self.bench
        subset_hash = train.sha1
        if cfg.val_split:
            val = read_split_list(find_list(bench, cfg, cfg.val_split))
            check_labels(val, k)
            info_lists[cfg.val_split] = {"file": str(val.path), "lines": len(val.paths), "sha1": val.sha1,
                                         "published_lines": bench.known_lines.get(cfg.val_split)}
            val_paths, val_labels, val_lines, source = val.paths, val.labels, val.lines, str(val.path)
        else:
            keep, held = hold_out(train.labels, cfg.val_per_class, 0)
            val_paths, val_labels, val_lines = [train.paths[i] for i in held], train.labels[held], train.lines[held]
            source = f"{train.path} (held out)"
            subset_hash = hashlib.sha1((train.sha1 + ":" + ",".join(map(str, keep))).encode()).hexdigest()
            train = SplitList(train.path, [train.paths[i] for i in keep], train.labels[keep], train.lines[keep], train.sha1)
        return LTData(
            name=bench.name, num_classes=k,
            image=ImageSpec(size=224, channels=3, mean=bench.mean, std=bench.std, kind="large"),
            train=FileImages(root, train.paths, train.labels, str(train.path), train.lines), train_labels=train.labels,
            test=FileImages(root, test.paths, test.labels, str(test.path), test.lines), test_labels=test.labels,
            subset_hash=subset_hash, pipelines={**VIEW_ALIASES, **bench.pipelines},
            class_names=folder_class_names(train, k),
            info={"root": str(root) if root else None, "test_split": cfg.test_split, "lists": info_lists,
                  "validation": counts_record(val_labels, k, cfg.val_per_class)},
            val=FileImages(root, val_paths, val_labels, source, val_lines), val_labels=np.asarray(val_labels),
        )


@DATASETS.register("imagenet_lt")
class ImageNetLT(SplitListDataset):
    """ImageNet-LT (OLTR split lists, 1000 classes; test = the 50k ILSVRC-2012 val images)."""

    bench = IMAGENET_LT


@DATASETS.register("places_lt")
class PlacesLT(SplitListDataset):
    """Places-LT (OLTR split lists, 365 classes; test 100 per class)."""

    bench = PLACES_LT


@DATASETS.register("inat2018")
class INat2018(SplitListDataset):
    """iNaturalist 2018 (classifier-balancing lists, 8142 classes; the val list is the test set)."""

    bench = INAT2018


def list_counts(name: str, split_dir: str, split: str = "train", num_classes: int | None = None) -> np.ndarray:
    """Per-class counts of one published list, without any image (e.g. list_counts('places_lt', dir))."""
    bench = BENCHMARKS[name]
    lst = read_split_list(find_list(bench, SplitListConfig(split_dir=split_dir), split))
    k = num_classes or bench.num_classes
    check_labels(lst, k)
    return np.bincount(lst.labels, minlength=k)


__all__ = ["BENCHMARKS", "FileImages", "SplitListConfig", "list_counts", "read_split_list"]
