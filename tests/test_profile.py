import numpy as np
import pytest

from ltbench.data.profile import exponential_counts, ldam_subset, subset_hash
from ltbench.evaluation import shot_groups


def test_fashion_mnist_profile_matches_spec_table():
    # docs/protocols.md §7: Fashion-MNIST with n_max 6000 at rho 100, 50, 10.
    assert exponential_counts(6000, 10, 100) == [6000, 3596, 2156, 1292, 774, 464, 278, 166, 100, 60]
    assert sum(exponential_counts(6000, 10, 50)) == 16796
    assert sum(exponential_counts(6000, 10, 10)) == 24516


def test_cifar100_profile_and_groups():
    counts = exponential_counts(500, 100, 100)
    assert sum(counts) == 10847 and counts[0] == 500 and counts[-1] == 5
    groups = shot_groups(counts)
    assert [(groups == g).sum() for g in ("many", "medium", "few")] == [35, 35, 30]


def test_group_boundaries_are_medium():
    assert list(shot_groups([101, 100, 20, 19])) == ["many", "medium", "medium", "few"]
    assert list(shot_groups([11, 10, 3], many_threshold=10, few_threshold=4)) == ["many", "medium", "few"]


def test_ldam_subset_is_the_legacy_global_rng_procedure_and_leaves_rng_alone():
    labels = np.tile(np.arange(5), 40)
    counts = [40, 20, 10, 5, 2]
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    idx = ldam_subset(labels, counts, seed=0)
    assert (np.random.get_state()[1] == before).all()
    # Independent re-implementation of LDAM-DRW's loop.
    np.random.seed(0)
    expected = []
    for c, n in enumerate(counts):
        where = np.where(labels == c)[0]
        np.random.shuffle(where)
        expected.extend(where[:n])
    assert idx.tolist() == [int(i) for i in expected]
    assert subset_hash(idx) == subset_hash(np.array(expected))
    assert subset_hash(idx) != subset_hash(ldam_subset(labels, counts, seed=1))


def test_profile_rejects_bad_input():
    with pytest.raises(ValueError):
        exponential_counts(100, 10, 0.5)
    with pytest.raises(ValueError, match="fewer"):
        ldam_subset(np.zeros(3, dtype=int), [5], 0)
