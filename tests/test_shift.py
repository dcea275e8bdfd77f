"""Shifted test sets (docs/protocols.md §6): SADE's and LADE's constructions, the published ImageNet-LT lists."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest
import torch

from ltbench.data.base import ArrayImages, ImageSpec, LTData
from ltbench.data.profile import exponential_counts
from ltbench.data.shift import shifted_counts, shifted_test, shifted_test_indices
from ltbench.data.splitlist import read_split_list

SPLITS = Path("/work/shared/data/splits")
SIZES = {50: 2486, 25: 2956, 10: 3876, 5: 4932, 2: 7166}  # CIFAR-100, forward and backward alike
CIFAR100_TRAIN = exponential_counts(500, 100, 100)


def cifar100_test_labels(seed: int = 3) -> np.ndarray:
    """10,000 test labels, 100 per class, shuffled like the real test batch."""
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(100), 100))


def sade_reference(labels, rho: float, direction: str, seed: int = 0) -> np.ndarray:
    """SADE: the LDAM-DRW constructor on the test split (img_max = len / C, legacy global RNG)."""
    labels = np.asarray(labels)
    c = 100
    img_max = len(labels) / c
    inv = 1.0 / rho
    per_class = [int(img_max * inv ** (((c - 1 - i) if direction == "backward" else i) / (c - 1.0))) for i in range(c)]
    np.random.seed(seed)
    out = []
    for i in range(c):
        idx = np.where(labels == i)[0]
        np.random.shuffle(idx)
        out.extend(idx[: per_class[i]].tolist())
    return np.array(out)


@pytest.mark.parametrize("method", ["sade", "lade"])
@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("rho", sorted(SIZES))
def test_cifar100_shifted_sizes(rho, direction, method):
    idx = shifted_test_indices(cifar100_test_labels(), CIFAR100_TRAIN, rho, direction, method=method)
    assert len(idx) == SIZES[rho] and len(np.unique(idx)) == len(idx)


def test_uniform_is_whole_test_set():
    labels = cifar100_test_labels()
    assert np.array_equal(shifted_test_indices(labels, CIFAR100_TRAIN, 1, "uniform"), np.arange(10000))
    assert len(shifted_test_indices(labels, CIFAR100_TRAIN, 1, "forward")) == 10000


@pytest.mark.parametrize("rho", [50, 10, 2])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_sade_per_class_counts_and_bit_identical_subset(rho, direction):
    labels = cifar100_test_labels()
    np.random.seed(2024)
    before = np.random.get_state()[1].copy()
    idx = shifted_test_indices(labels, CIFAR100_TRAIN, rho, direction, seed=0, method="sade")
    assert np.array_equal(np.random.get_state()[1], before)  # the global RNG is left alone
    np.testing.assert_array_equal(idx, sade_reference(labels, rho, direction, 0))
    counts = np.bincount(labels[idx], minlength=100)
    expo = [(99 - i if direction == "backward" else i) / 99 for i in range(100)]
    assert list(counts) == [int(100 * (1 / rho) ** e) for e in expo]
    assert counts[0 if direction == "forward" else 99] == 100


def test_sade_needs_frequency_ordered_labels():
    with pytest.raises(ValueError, match="lade"):
        shifted_test_indices(cifar100_test_labels(), CIFAR100_TRAIN[::-1], 10, "forward", method="sade")


def test_lade_ranks_by_training_count_and_keeps_first_in_test_order():
    labels = cifar100_test_labels()
    perm = np.random.default_rng(0).permutation(100)
    train = np.asarray(CIFAR100_TRAIN)[perm]  # class perm[j]'s count is at position j: ranks scrambled
    for direction in ("forward", "backward"):
        idx = shifted_test_indices(labels, train, 50, direction, method="lade")
        assert np.all(np.diff(idx) > 0)  # test order
        counts = np.bincount(labels[idx], minlength=100)
        rank = np.empty(100, dtype=int)
        rank[np.argsort(-train, kind="stable")] = np.arange(100)
        profile = shifted_counts(100, 100, 50, direction)
        assert all(counts[c] == profile[rank[c]] for c in range(100))
        for c in range(100):  # the first images of each class in test order
            np.testing.assert_array_equal(idx[labels[idx] == c], np.flatnonzero(labels == c)[: counts[c]])


def test_errors():
    labels = cifar100_test_labels()
    with pytest.raises(ValueError, match="direction"):
        shifted_test_indices(labels, CIFAR100_TRAIN, 10, "sideways")
    with pytest.raises(ValueError, match="method"):
        shifted_test_indices(labels, CIFAR100_TRAIN, 10, "forward", method="ride")
    with pytest.raises(ValueError, match="fewer"):
        shifted_test_indices(labels, CIFAR100_TRAIN, 10, "forward", method="lade", img_max=101)


def test_shifted_test_on_ltdata():
    k = 10
    train_y = np.repeat(np.arange(k), exponential_counts(50, k, 10))
    test_y = np.tile(np.arange(k), 20)
    images = torch.arange(len(test_y), dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 1, 4, 4).contiguous()
    data = LTData("toy", k, ImageSpec(4, 1, (0.5,), (0.5,)), ArrayImages(images[:1].expand(len(train_y), -1, -1, -1),
                  train_y), train_y, ArrayImages(images, test_y), test_y, "h")
    shifted = shifted_test(data, "backward10")
    assert len(shifted.test) == len(shifted.test_labels) == sum(shifted_counts(k, 20, 10, "backward"))
    image, label = shifted.test[3]
    assert label == shifted.test_labels[3] and test_y[int(image[0, 0, 0])] == label
    assert shifted.info["test_shift"]["name"] == "backward10" and len(data.test) == 200


# ------------------------------------------------------------------------------------------
# The published ImageNet-LT shifted lists (SADE data_txt), when present on this machine


def _counts(name: str) -> np.ndarray:
    path = SPLITS / name
    if not path.is_file():
        pytest.skip(f"{path} not present")
    return np.bincount(read_split_list(path).labels, minlength=1000)


@pytest.mark.parametrize("name,rho,direction,total", [
    ("ImageNet_LT_forward50.txt", 50, "forward", 12058),
    ("ImageNet_LT_backward50.txt", 50, "backward", 12058),
    ("ImageNet_LT_forward2.txt", 2, "forward", 35574),
])
def test_published_imagenet_lt_shift_profiles(name, rho, direction, total):
    counts = _counts(name)
    profile = shifted_counts(1000, 50, rho, direction)  # int(50 (1/rho)^(k/999)) by training-count rank
    assert counts.sum() == total == sum(profile)
    assert sorted(counts, reverse=True) == sorted(profile, reverse=True)
    assert sorted(profile, reverse=True) == [int(50 * (1 / rho) ** (k / 999)) for k in range(1000)]


def test_published_imagenet_lt_lists_share_one_ranking():
    """Without the train list, the three lists must still agree on the class ranking: the (forward50,
    backward50, forward2) count of each class is (f50(k), f50(999-k), f2(k)) for one rank k per class."""
    f50, b50, f2 = (_counts(f"ImageNet_LT_{n}.txt") for n in ("forward50", "backward50", "forward2"))
    p50, p2 = shifted_counts(1000, 50, 50, "forward"), shifted_counts(1000, 50, 2, "forward")
    assert collections.Counter(zip(f50, b50, f2)) == collections.Counter(zip(p50, p50[::-1], p2))
    # and the shifted lists are subsets of the 50k test list
    if (SPLITS / "ImageNet_LT_test.txt").is_file():
        test = set(read_split_list(SPLITS / "ImageNet_LT_test.txt").paths)
        assert set(read_split_list(SPLITS / "ImageNet_LT_forward50.txt").paths) <= test
