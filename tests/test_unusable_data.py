"""A dataset no run can be benchmarked on is refused before the first run, for every kind of dataset files.

An empty test set used to train to the end and leave a damaged record (exit 0); a training split without
images of two classes crashed inside the run. Now each is one line naming the file, exit 2, from ``run`` and
``run --dry-run`` alike, and nothing is written. The files are generated here in each format: CIFAR pickled
batches, Fashion-MNIST IDX files, split lists over an image folder tree, and the synthetic dataset's options.
A plugin dataset is checked by the classes its ``footprint()`` declares or, declaring none, by what ``load()``
returns: refused before the first run too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import TINY, deep_update
from tests.test_bad_input import assert_refused, run_in_process, warm_registry  # noqa: F401 - a module fixture
from tests.test_cifar import write_fake_cifar10
from tests.test_fashion_mnist import write_fake_fashion_mnist


def cifar(root: Path, train_per_class: int, test_per_class: int) -> dict:
    write_fake_cifar10(root, per_class=train_per_class, test_per_class=test_per_class)
    return {"name": "cifar10_lt", "root": str(root), "imb_factor": 2}


def fashion(root: Path, train_labels: np.ndarray, test_labels: np.ndarray) -> dict:
    write_fake_fashion_mnist(root, train_labels, test_labels)
    return {"name": "fashion_mnist_lt", "root": str(root), "imb_factor": 2, "max_per_class": 4}


def tree(root: Path, train_labels: list[int], test_labels: list[int], classes: int = 3) -> dict:
    """A folder tree root/train/c<k>/*.png, root/val/c<k>/*.png and its ImageNet-LT split lists."""
    from torchvision.io import write_png
    import torch

    for split, labels in (("train", train_labels), ("test", test_labels)):
        lines = []
        for i, label in enumerate(labels):
            rel = f"{'train' if split == 'train' else 'val'}/c{label}/{split}_{i}.png"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            write_png(torch.full((3, 8, 8), 40 * label, dtype=torch.uint8), str(root / rel))
            lines.append(f"{rel} {label}\n")
        (root / f"ImageNet_LT_{split}.txt").write_text("".join(lines))
    return {"name": "imagenet_lt", "root": str(root), "num_classes": classes}


# (id, data section builder, words of the one line). Each builder writes the files under the folder it gets.
CASES = [
    ("cifar-empty-test", lambda d: cifar(d, 20, 0), "test_batch: the test set holds no image"),
    ("cifar-no-training-image", lambda d: cifar(d, 0, 5),
     "data_batch_1: the training set has images of 0 class(es)"),
    ("fashion-empty-test", lambda d: fashion(d, np.arange(100) % 10, np.zeros(0)),
     "t10k-labels-idx1-ubyte: the test set holds no image"),
    ("fashion-no-training-image", lambda d: fashion(d, np.zeros(0), np.arange(20) % 10),
     "train-labels-idx1-ubyte: class 0 has 0 images, fewer than the 4 the profile asks for"),
    ("tree-empty-test", lambda d: tree(d, [0, 0, 1, 2], []), "ImageNet_LT_test.txt: the split list is empty"),
    ("tree-no-training-image", lambda d: tree(d, [], [0, 1, 2]), "ImageNet_LT_train.txt: the split list is empty"),
    ("tree-one-class", lambda d: tree(d, [1, 1, 1], [0, 1, 2]),
     "ImageNet_LT_train.txt: the training set has images of 1 class(es)"),
    ("synthetic-empty-test", lambda d: {"name": "synthetic_lt", "test_per_class": 0},
     "data.test_per_class: must be >= 1"),
    ("synthetic-zero-classes", lambda d: {"name": "synthetic_lt", "num_classes": 0}, "data.num_classes: must be >= 2"),
]


def recipe(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "unusable.yaml"
    path.write_text(yaml.safe_dump(deep_update(TINY, {"data": data, "results_dir": str(tmp_path / "results")})))
    return path


@pytest.mark.parametrize("mode", [["--dry-run"], []], ids=["dry-run", "run"])
@pytest.mark.parametrize("name,make,words", CASES, ids=[c[0] for c in CASES])
def test_unusable_data_is_one_line_before_any_run(name, make, words, mode, tmp_path, capsys):
    (tmp_path / "data").mkdir()
    path = recipe(tmp_path, make(tmp_path / "data"))
    code, _, err, elapsed, peak = run_in_process(["run", str(path), *mode], capsys)
    assert_refused(code, err, words, elapsed, peak)
    assert "expected" in err or "must be" in err or "fewer than" in err  # says what would be right
    assert not (tmp_path / "results").exists()  # refused before anything was written


def test_usable_files_of_each_kind_still_pass_the_check(tmp_path, capsys):
    """The same generators with images in both splits: the check lets them through (the refusals above are
    about the sizes, not the generated formats)."""
    for kind, make in (("cifar", lambda d: cifar(d, 20, 2)),
                       ("fashion", lambda d: fashion(d, np.arange(100) % 10, np.arange(20) % 10)),
                       ("tree", lambda d: tree(d, [0, 0, 1, 2], [0, 1, 2]))):
        folder = tmp_path / kind
        (folder / "data").mkdir(parents=True)
        code, out, err, _, _ = run_in_process(["run", str(recipe(folder, make(folder / "data"))), "--dry-run"], capsys)
        assert code == 0, f"{kind}: {err}"
        assert "1 run(s)" in out


HOLLOW_PLUGIN = '''
import numpy as np
import torch
from ltbench.data.base import ArrayImages, DataFootprint, DatasetBuilder, ImageSpec, LTData
from ltbench.registry import DATASETS


@DATASETS.register("hollow")
class Hollow(DatasetBuilder):
    """Training images of CLASSES class(es) and TEST test images; DECLARES declares its classes."""

    def footprint(self):
        return DataFootprint(1, 3, 8, 0) if DECLARES else None

    def load(self):
        labels = np.array([0] * 8 + [1] * 4) if CLASSES == 2 else np.zeros(12, dtype=np.int64)
        images = torch.zeros(len(labels), 3, 8, 8, dtype=torch.uint8)
        test = labels[:TEST]
        return LTData(name="hollow", num_classes=2, image=ImageSpec(8, 3, (0.5,) * 3, (0.25,) * 3),
                      train=ArrayImages(images, labels), train_labels=labels,
                      test=ArrayImages(images[:TEST], test), test_labels=test, subset_hash="0")
'''


@pytest.mark.parametrize("classes, test, declares, words", [
    (2, 0, False, "the test set holds no image"),
    (1, 4, False, "the training set has images of 1 class(es)"),
    (2, 4, True, "footprint() declares 1 class(es); expected at least 2"),
], ids=["empty-test", "one-class-loaded", "one-class-declared"])
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_a_plugin_dataset_no_run_can_use_is_refused_before_the_first_run(classes, test, declares, words, dry_run,
                                                                        tmp_path, capsys):
    """A plugin dataset's classes come from what its footprint() declares or, when it declares none, from what
    load() returns: checked before the first run, by --dry-run too, in one line, exit 2, nothing written."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "hollow_data.py").write_text(HOLLOW_PLUGIN.replace("CLASSES", str(classes)).replace("TEST", str(test))
                                            .replace("DECLARES", str(declares)))
    path = tmp_path / "hollow.yaml"
    path.write_text(yaml.safe_dump(deep_update(TINY, {"data": {"name": "hollow"}, "plugins": [str(plugins)],
                                                      "optim": {"epochs": 1}, "results_dir": str(tmp_path / "r")})))
    from conftest import registries_restored

    with registries_restored():
        code, out, err, _, _ = run_in_process(["run", str(path), *(["--dry-run"] if dry_run else [])], capsys)
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and "dataset 'hollow'" in err and words in err, err
    assert not list((tmp_path / "r").rglob("result.json"))
