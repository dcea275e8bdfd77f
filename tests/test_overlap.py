"""No validation sample is a test sample, for any dataset (docs/protocol.md §4): the validation and test
samples are compared by identity before the first run (list paths, array indices, a plugin's images)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ltbench.config import from_dict
from ltbench.data.base import ArrayImages, DatasetBuilder, ImageSpec, LTData
from ltbench.data.fashion_mnist import DEBIAN_DIR
from ltbench.data.validation import check_disjoint
from ltbench.errors import ConfigError
from ltbench.registry import DATASETS
from tests.test_cifar import write_fake_cifar10, write_fake_cifar100
from tests.test_splitlist import fake_imagenet_lt  # noqa: F401 - a fixture used below


def write_lists(root, prefix: str, lists: dict[str, list[str]]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for split, lines in lists.items():
        (root / f"{prefix}{split}.txt").write_text("\n".join(lines) + "\n")


def inat_tree(root):
    """A generated iNaturalist 2018 tree: a train list and the val list (which is its test set)."""
    write_lists(root, "iNaturalist18_", {"train": [f"train_val2018/c{c}/t{c}_{i}.jpg {c}" for c in range(3) for i in range(4)],
                                         "val": [f"train_val2018/c{c}/v{c}.jpg {c}" for c in range(3)]})
    return root


def places_tree(root):
    write_lists(root, "Places_LT_", {"train": [f"train/s{c}/{i}.jpg {c}" for c in range(3) for i in range(3)],
                                     "val": [f"val/s{c}/v.jpg {c}" for c in range(3)],
                                     "test": [f"test/s{c}/t.jpg {c}" for c in range(3)]})
    return root


def ids(name: str, **options):
    return DATASETS.get(name)(from_dict(DATASETS.get(name).Config, options, "data")).split_ids()


def test_every_built_in_profile_keeps_validation_apart_from_test(tmp_path, fake_imagenet_lt):  # noqa: F811
    write_fake_cifar10(tmp_path / "c10")
    write_fake_cifar100(tmp_path / "c100")
    cases = {
        "cifar10_lt": [dict(root=str(tmp_path / "c10"), imb_factor=10, val_per_class=5)],
        "cifar100_lt": [dict(root=str(tmp_path / "c100"), imb_factor=10, val_per_class=2)],
        "fashion_mnist_lt": [dict(root=DEBIAN_DIR, val_per_class=20)],
        "synthetic_lt": [dict(val_per_class=2)],
        "imagenet_lt": [dict(root=str(fake_imagenet_lt), num_classes=3, val_split="val"),
                        dict(root=str(fake_imagenet_lt), num_classes=3, val_per_class=1)],
        "places_lt": [dict(root=str(places_tree(tmp_path / "places")), num_classes=3, val_split="val")],
        "inat2018": [dict(root=str(inat_tree(tmp_path / "inat")), num_classes=3, val_per_class=1)],
    }
    builtin = {n for n in DATASETS.names() if DATASETS.get(n).__module__.startswith("ltbench.")}
    assert builtin <= set(cases), f"a built-in dataset without an overlap case: {builtin - set(cases)}"
    for name, options in cases.items():
        if name == "fashion_mnist_lt" and not (DEBIAN_DIR and __import__("os").path.isdir(DEBIAN_DIR)):
            continue
        for opts in options:
            val, test = ids(name, **opts)
            assert val and test and not set(val) & set(test), (name, opts)
            check_disjoint((val, test), name)


def test_inat_val_split_val_is_the_test_set_and_is_refused_in_one_line(tmp_path, write_recipe, cli):
    root = inat_tree(tmp_path / "inat")
    val, test = ids("inat2018", root=str(root), num_classes=3, val_split="val")
    assert set(val) == set(test)  # iNat's test list is its val list
    path = write_recipe("inat", {"data": {"name": "inat2018", "root": str(root), "num_classes": 3, "val_split": "val",
                                          "check_images": False}})
    proc = cli("run", path, "--dry-run")
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "\n" not in err, proc.stderr
    assert "3 of the 3 validation samples are test samples" in err and "inat" in err.lower()


def test_a_list_named_twice_overlaps_even_under_another_path_spelling(tmp_path):
    root = tmp_path / "places"
    write_lists(root, "Places_LT_", {"train": [f"train/s{c}/{i}.jpg {c}" for c in range(2) for i in range(3)],
                                     "val": ["val/s0/./a.jpg 0", "val/s1/b.jpg 1"],
                                     "test": ["val/s0/a.jpg 0", "test/s1/t.jpg 1"]})
    with pytest.raises(ConfigError, match="1 of the 2 validation samples are test samples"):
        check_disjoint(ids("places_lt", root=str(root), num_classes=2, val_split="val"), "data: places_lt")


class LeakyPlugin(DatasetBuilder):
    """A plugin dataset whose validation split reuses one test image: no ids, so its images are compared."""

    def load(self) -> LTData:
        x = torch.randint(0, 256, (6, 1, 4, 4), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
        y = np.array([0, 1, 0, 1, 0, 1])
        return LTData("leaky", 2, ImageSpec(4, 1, (0.5,), (0.25,)), ArrayImages(x[:4], y[:4]), y[:4],
                      ArrayImages(x[4:], y[4:]), y[4:], "0", val=ArrayImages(x[3:5], y[3:5]), val_labels=y[3:5])


def test_a_plugin_dataset_is_compared_by_what_load_returns():
    with pytest.raises(ConfigError, match="1 of the 2 validation samples are test samples"):
        check_disjoint(LeakyPlugin(None).split_ids(), "data: leaky")
