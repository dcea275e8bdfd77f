"""Class names and prompt templates for text towers (zero-shot CLIP, LIFT's text-initialised classifier).

Why shipped: a dataset's own class names are folder names (WordNet ids for ImageNet, category ids for
iNaturalist), not words a text encoder reads. ltbench ships, for ImageNet-LT, Places-LT, iNaturalist 2018
and CIFAR-100-LT, one name per label in label order, each file with its source in its header
(ltbench_foundation/classnames/). Where the dataset names its classes (class folders, CIFAR's meta file),
each shipped key is checked against that name, so a list in another label order is refused instead of
silently pairing images with another class's name (LIFT's own Places-LT list does that for five classes;
docs/foundation.md). Other datasets use their own class names, with '_' read as a space, as LIFT does.

Templates: ``photo`` ('a photo of a {}.', LIFT's default and its zero-shot row), ``imagenet80`` (CLIP's 80
ImageNet templates, LIFT's 'ensemble'), ``cifar100`` (CLIP's 18), ``sun397`` (CLIP's 2 scene templates,
for Places-LT), ``classname`` ('{}'), or ``dataset``: the set CLIP used for that dataset (``DATASET_TEMPLATES``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from ltbench.errors import ConfigError
from ltbench.registry import lookup

FOLDER = Path(__file__).with_name("classnames")
NAME_FILES = {"imagenet_lt": "imagenet_lt.txt", "places_lt": "places_lt.txt", "inat2018": "inat2018.txt",
              "cifar100_lt": "cifar100_lt.txt"}
TEMPLATE_SETS = ("photo", "imagenet80", "cifar100", "sun397", "classname", "dataset")
DATASET_TEMPLATES = {"imagenet_lt": "imagenet80", "places_lt": "sun397", "cifar100_lt": "cifar100"}


def _lines(name: str) -> list[str]:
    return [line.rstrip("\n") for line in (FOLDER / name).read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]


@lru_cache(maxsize=None)
def shipped_names(dataset: str) -> tuple[tuple[str, str], ...] | None:
    """((key, prompt name) per label) shipped for ``dataset``, or None."""
    if dataset not in NAME_FILES:
        return None
    return tuple(tuple(line.split("\t", 1)) for line in _lines(NAME_FILES[dataset]))


def _same_class(own: str, key: str) -> bool:
    """The dataset's class folder ('a/apartment_building/outdoor', 'train_val2018/Plantae/7477', 'n01440764')
    names the shipped key ('apartment_building-outdoor', '7477', 'n01440764')."""
    flat = own.strip("/").replace("/", "-")
    return flat == key or flat.endswith("-" + key)


def class_names(dataset: str | None, own: tuple[str, ...] | None, num_classes: int) -> list[str]:
    """The name of each class as a text prompt says it (module docstring)."""
    shipped = shipped_names(dataset) if dataset else None
    if shipped is not None and len(shipped) == num_classes:
        for label, ((key, _), name) in enumerate(zip(shipped, own or ())):
            if name and not _same_class(name, key):
                raise ConfigError(f"class names of {dataset}: label {label} is '{name}' in the data but "
                                  f"'{key}' in ltbench_foundation/classnames/{NAME_FILES[dataset]}; the split lists "
                                  f"use another label order than the published ones")
        return [name for _, name in shipped]
    if own and len(own) == num_classes and all(own):
        return [n.strip("/").split("/")[-1].replace("_", " ") for n in own]
    raise ConfigError(f"dataset {dataset}: no class names for a text prompt ({num_classes} classes); a dataset "
                      f"must set LTData.class_names, or ship them in ltbench_foundation/classnames/")


def templates(name: str, dataset: str | None) -> list[str]:
    """The prompt templates of set ``name`` ('dataset': the set CLIP used for that dataset, else 'photo')."""
    lookup({n: n for n in TEMPLATE_SETS}, name, "template set")
    if name == "dataset":
        name = DATASET_TEMPLATES.get(dataset or "", "photo")
    if name == "classname":
        return ["{}"]
    return _lines(f"templates_{name}.txt")


def class_prompts(names: list[str], template_list: list[str]) -> list[list[str]]:
    """For each class, its prompt under every template."""
    return [[t.format(n) for t in template_list] for n in names]
