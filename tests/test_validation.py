"""Validation splits (ltbench/data/validation.py) and selection on them: validation images are never
training images, the published subsets stay bit-identical, best_val reports the validation-best epoch."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from ltbench.results import store
from ltbench.config import from_dict
from ltbench.data import cifar
from ltbench.data.cifar import CIFAR10LT, CIFAR100LT
from ltbench.data.fashion_mnist import DEBIAN_DIR, FashionMNISTLT, FashionMNISTLTConfig
from ltbench.data.profile import exponential_counts, ldam_subset, subset_hash
from ltbench.data.validation import hold_out, unused_per_class
from ltbench.errors import ConfigError
from ltbench.train.selection import select_model
from tests.conftest import ROOT
from tests.test_splitlist import fake_imagenet_lt  # noqa: F401 - a fixture used below
from tests.test_cifar import C100_RHO100, _index_of, real_size_labels, reference_subset, write_fake_cifar10, \
    write_fake_cifar100


def load(builder, **options):
    return builder(from_dict(builder.Config, options, "data")).load()


def test_cifar10_validation_comes_from_unused_images_and_leaves_the_subset_alone(tmp_path):
    labels, _ = write_fake_cifar10(tmp_path)  # 50 per class; rho 10 keeps 50 ... 5
    plain = load(CIFAR10LT, root=str(tmp_path), imb_factor=10)
    np.random.seed(7)
    before = np.random.get_state()[1].copy()
    data = load(CIFAR10LT, root=str(tmp_path), imb_factor=10, val_per_class=20)
    assert np.array_equal(np.random.get_state()[1], before)  # the legacy global RNG is not touched
    expected, per_class = reference_subset(labels, 10, 0.1, 0)
    assert data.subset_hash == plain.subset_hash == subset_hash(expected)  # the LDAM-DRW subset, bit for bit
    np.testing.assert_array_equal(_index_of(data.train.images), expected)
    val_index = _index_of(data.val.images)  # each fake image encodes its index in the training file
    assert not set(val_index.tolist()) & set(expected.tolist())  # never a training image
    assert len(set(val_index.tolist())) == len(val_index)
    np.testing.assert_array_equal(labels[val_index], data.val_labels)
    # class 0 keeps all its 50 images: nothing left to validate on; the others give min(20, unused)
    assert data.val_counts.tolist() == [min(20, 50 - n) for n in per_class] and data.val_counts[0] == 0
    assert data.info["validation"] == {"per_class_asked": 20, "size": int(data.val_counts.sum()), "short_classes": [0, 1]}
    again = load(CIFAR10LT, root=str(tmp_path), imb_factor=10, val_per_class=20)
    np.testing.assert_array_equal(_index_of(again.val.images), val_index)  # fixed by the data config


def test_cifar100_lt_subset_at_real_size_is_unchanged_by_a_validation_split(tmp_path, monkeypatch):
    write_fake_cifar100(tmp_path, per_class=1, test_per_class=1)
    targets = real_size_labels(100, seed=4)

    def fake_read_split(layout, paths):
        if paths[0].name == "train":
            return np.broadcast_to(np.zeros((1, 3, 32, 32), np.uint8), (len(targets), 3, 32, 32)), targets
        return np.zeros((100, 3, 32, 32), np.uint8), np.arange(100)

    monkeypatch.setattr(cifar, "read_split", fake_read_split)
    data = load(CIFAR100LT, root=str(tmp_path), imb_factor=100, val_per_class=20)
    expected, per_class = reference_subset(targets, 100, 0.01, 0)
    assert per_class == C100_RHO100 and len(data.train) == 10847 and data.subset_hash == subset_hash(expected)
    val = unused_per_class(targets, expected, 20, 0)
    assert not np.isin(val, expected).any()
    assert data.val_counts.tolist() == [0] + [20] * 99  # the head class keeps all 500 of its images


@pytest.mark.skipif(not os.path.isdir(DEBIAN_DIR), reason=f"{DEBIAN_DIR} missing (apt-get install dataset-fashion-mnist)")
def test_fashion_mnist_lt_validation_is_disjoint_balanced_and_keeps_the_published_subset():
    from ltbench.data.fashion_mnist import locate
    from ltbench.data.idx import read_idx

    data = FashionMNISTLT(FashionMNISTLTConfig(imb_factor=100, max_per_class=500, val_per_class=20)).load()
    reference = json.loads(next((ROOT / "docs" / "reference-results" / "quickstart").rglob("result.json")).read_text())
    assert data.subset_hash == reference["data"]["subset_hash"]  # the subset every reference result trained on
    assert data.class_counts.tolist() == [500, 299, 179, 107, 64, 38, 23, 13, 8, 5]
    assert data.val_counts.tolist() == [20] * 10
    train_y = read_idx(locate(None)["train_labels"]).astype(np.int64)
    kept = ldam_subset(train_y, exponential_counts(500, 10, 100), 0)
    val = unused_per_class(train_y, kept, 20, 0)
    assert not np.isin(val, kept).any()
    images = read_idx(locate(None)["train_images"])
    np.testing.assert_array_equal(data.val.images[:, 0].numpy(), images[val])


def test_synthetic_validation_leaves_train_and_test_as_they_were():
    from ltbench.data.synthetic import SyntheticLT

    plain = load(SyntheticLT, num_classes=3, max_per_class=12)
    data = load(SyntheticLT, num_classes=3, max_per_class=12, val_per_class=4)
    assert data.subset_hash == plain.subset_hash and np.array_equal(data.test.images.numpy(), plain.test.images.numpy())
    assert data.val_counts.tolist() == [4, 4, 4]


def test_held_out_validation_keeps_every_class_and_is_disjoint():
    labels = np.repeat(np.arange(4), [10, 3, 2, 1])
    train, val = hold_out(labels, 2, 0)
    assert not set(train) & set(val) and sorted([*train, *val]) == list(range(len(labels)))
    assert np.bincount(labels[val], minlength=4).tolist() == [2, 2, 1, 0]  # a class always keeps one image
    assert np.bincount(labels[train], minlength=4).tolist() == [8, 1, 1, 1]


def test_a_validation_list_that_is_the_test_list_is_refused(fake_imagenet_lt):  # noqa: F811
    from ltbench.data.splitlist import ImageNetLT, SplitListConfig
    from ltbench.data.validation import check_disjoint
    from tests.test_splitlist import config

    same = ImageNetLT(config(root=str(fake_imagenet_lt), num_classes=3, test_split="val", val_split="val"))
    with pytest.raises(ConfigError, match="choosing on them is choosing on the test set"):
        check_disjoint(same.split_ids(), "data")  # compared by samples before the first run (tests/test_overlap.py)
    with pytest.raises(ConfigError, match="set one of them"):
        from_dict(SplitListConfig, {"val_split": "val", "val_per_class": 5}, "data")


def test_imagenet_lt_uses_the_published_val_list(fake_imagenet_lt):
    from ltbench.data.splitlist import ImageNetLT
    from tests.test_splitlist import config

    root = fake_imagenet_lt
    plain = ImageNetLT(config(root=str(root), num_classes=3)).load()
    data = ImageNetLT(config(root=str(root), num_classes=3, val_split="val")).load()
    assert data.subset_hash == plain.subset_hash and data.val_counts.tolist() == [1, 1, 1]
    assert not set(data.val.paths) & set(data.train.paths) and not set(data.val.paths) & set(data.test.paths)
    held = ImageNetLT(config(root=str(root), num_classes=3, val_per_class=1)).load()
    assert held.subset_hash != plain.subset_hash and len(held.train) + len(held.val) == len(plain.train)
    assert not set(held.val.paths) & set(held.train.paths)


def test_select_model_best_val_takes_the_earliest_best_and_keeps_the_oracle_apart():
    rows = [{"epoch": 1, "val": {"all": 0.5}}, {"epoch": 2, "val": {"all": 0.7}, "test": {"all": 0.9, "many": 1, "medium": 1, "few": 1}},
            {"epoch": 3, "val": {"all": 0.7}}, {"epoch": 4, "val": {"all": 0.6}}]
    final = {"all": 0.6, "many": 0.7, "medium": 0.6, "few": 0.5}
    sel = select_model(final, rows, 4, "best_val")
    assert sel["strategy"] == "best_val" and sel["epoch"] == 2 and sel["val"] == {"all": 0.7}
    assert "oracle_best_on_test" not in sel  # the selected epoch's test is the final metrics, not an oracle
    assert select_model(final, rows, 4)["epoch"] == 4


def test_best_val_needs_a_validation_split(write_recipe, cli):
    out = cli("run", write_recipe(extra={"eval": {"select": "best_val"}}), "--dry-run")
    assert out.returncode == 2 and "eval.select: best_val needs a validation split" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow  # a 5-epoch training run: ~10 s
def test_best_val_reports_the_validation_best_epoch(tmp_path, write_recipe, cli):
    recipe = write_recipe(extra={"data": {"val_per_class": 8, "max_per_class": 48}, "eval": {"select": "best_val"},
                                 "optim": {"epochs": 5, "batch_size": 8, "lr": 0.05}, "sampler": {"name": "class_balanced"}})
    out = cli("run", recipe)
    assert out.returncode == 0, out.stderr
    run_dir = next((tmp_path / "results").rglob("result.json")).parent
    result = json.loads((run_dir / "result.json").read_text())
    log = store.read_jsonl(run_dir / store.LOG)
    scores = [r["val"]["all"] for r in log]
    best = scores.index(max(scores)) + 1
    assert result["selection"]["strategy"] == "best_val" and result["selection"]["epoch"] == best
    # the reported model is that epoch's: evaluated again at the end, it scores what was logged then
    assert result["metrics"]["val"]["all"] == result["selection"]["val"]["all"] == max(scores)
    assert result["data"]["class_counts_val"] == [8, 8, 8, 8]
    assert (run_dir / "best_val.pt").is_file()


@pytest.mark.slow  # two short training runs: ~10 s
def test_a_validation_split_changes_no_training_number(tmp_path, write_recipe, cli):
    """Validation images come from outside the training set and are only evaluated: the same run with and
    without them trains identically (same losses, same test predictions); only metrics.val is added."""
    plain = write_recipe("plain")
    validated = write_recipe("validated", extra={"data": {"val_per_class": 6}})
    for recipe in (plain, validated):
        out = cli("run", recipe)
        assert out.returncode == 0, out.stderr
    results = {p.parent.parent.name: p.parent for p in (tmp_path / "results").rglob("result.json")}
    a, b = (json.loads((results[n] / "result.json").read_text()) for n in ("plain", "validated"))
    assert a["run_id"] != b["run_id"] and "val" not in a["metrics"] and b["metrics"]["val"]["size"] == 24
    assert a["metrics"]["per_class"] == b["metrics"]["per_class"]
    loss = [[r["loss"] for r in store.read_jsonl(results[n] / store.LOG)] for n in ("plain", "validated")]
    assert loss[0] == loss[1]


class PlantedPickle:
    """What a planted best_val.pt could hold: a pickle that runs code when unpickled (here: writes a marker)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


def test_a_planted_best_val_pickle_is_never_executed(tmp_path):
    """best_val.pt is read with weights_only=True (train/checkpoint.py): a pickle that runs code is refused as
    one line naming the file, and its code never runs (unpickled, the same object does run it)."""
    import torch

    from ltbench.train import checkpoint

    marker, run_dir = tmp_path / "marker", tmp_path / "run"
    run_dir.mkdir()
    torch.save(PlantedPickle(marker), run_dir / checkpoint.BEST_VAL)
    with pytest.raises(checkpoint.DamagedState) as err:
        checkpoint.load_best_val(run_dir, "rid")
    message = str(err.value)
    assert "\n" not in message and str(run_dir / checkpoint.BEST_VAL) in message and "--rerun-failed" in message
    assert not marker.exists()
    pickle.loads(pickle.dumps(PlantedPickle(marker)))  # what the test guards against: unpickled, it runs
    assert marker.read_text() == "ran"


@pytest.mark.slow  # three short training runs: ~10 s
def test_a_resumed_best_val_run_with_a_planted_best_val_starts_over(tmp_path, write_recipe, cli):
    """A finished best_val run whose result.json is gone is only re-evaluated from its final checkpoint, which
    reads best_val.pt: a planted pickle there is not executed; the run says the file is unusable and starts over,
    training again to the same numbers."""
    import torch

    from ltbench.train import checkpoint

    recipe = write_recipe(extra={"data": {"val_per_class": 4}, "eval": {"select": "best_val"}})
    assert cli("run", recipe).returncode == 0
    run_dir = next((tmp_path / "results").rglob(store.RESULT)).parent
    first = json.loads((run_dir / store.RESULT).read_text())
    (run_dir / store.RESULT).unlink()
    (run_dir / checkpoint.BEST_VAL).unlink()
    missing = cli("run", recipe)  # a best_val.pt that is gone: the same
    assert missing.returncode == 0 and f"{run_dir / checkpoint.BEST_VAL} is unusable (it is missing); starting " \
                                       f"this run over" in missing.stdout, missing.stdout
    (run_dir / store.RESULT).unlink()
    marker = tmp_path / "marker"
    torch.save(PlantedPickle(marker), run_dir / checkpoint.BEST_VAL)
    out = cli("run", recipe)
    assert out.returncode == 0, out.stderr
    assert f"{run_dir / checkpoint.BEST_VAL} is unusable (UnpicklingError" in out.stdout and \
        "starting this run over" in out.stdout, out.stdout
    assert not marker.exists()
    again = json.loads((run_dir / store.RESULT).read_text())
    assert again["status"] == "done" and again["metrics"]["all"] == first["metrics"]["all"]
    assert again["selection"] == first["selection"]
