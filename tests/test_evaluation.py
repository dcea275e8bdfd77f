import numpy as np
import pytest

from ltbench.evaluation import accuracy_under_prior, longtail_prior, parse_prior_name, summarize


def test_summary_groups_are_macro_means_over_classes():
    train_counts = [500, 200, 50, 30, 10, 5]  # many, many, medium, medium, few, few
    labels = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5])
    pred = np.array([0, 0, 1, 0, 2, 0, 0, 0, 4, 0, 0, 0])
    s = summarize(pred, labels, train_counts)
    assert s["all"] == pytest.approx(5 / 12)
    assert s["many"] == pytest.approx((1.0 + 0.5) / 2)
    assert s["medium"] == pytest.approx((0.5 + 0.0) / 2)
    assert s["few"] == pytest.approx((0.5 + 0.0) / 2)
    assert s["per_class"] == [1.0, 0.5, 0.5, 0.0, 0.5, 0.0]


def test_classes_without_test_samples_are_excluded_and_counted_and_empty_group_is_none():
    train_counts = [500, 50, 60]  # no few-shot class at all
    labels = np.array([0, 0, 1])  # class 2 has no test sample
    pred = np.array([0, 1, 1])
    s = summarize(pred, labels, train_counts)
    assert s["few"] is None
    assert s["medium"] == pytest.approx(1.0)  # class 2 excluded, not counted as 0 or NaN
    assert s["per_class"][2] is None
    assert s["groups"]["n_classes"]["medium"] == 2
    assert s["groups"]["n_classes_evaluated"]["medium"] == 1
    assert s["groups"]["classes_without_test_samples"] == 1


def test_accuracy_under_prior():
    acc = [1.0, 0.5, 0.0]
    assert accuracy_under_prior(acc, [1 / 3] * 3) == pytest.approx(0.5)
    assert accuracy_under_prior(acc, [0.5, 0.5, 0.0]) == pytest.approx(0.75)
    assert accuracy_under_prior([None, 0.5, 0.0], [0.5, 0.25, 0.25]) == pytest.approx(0.25)


def test_longtail_prior_follows_training_rank():
    counts = [10, 1000, 100]  # rank: class 1, class 2, class 0
    fwd = longtail_prior(counts, 100, "forward")
    assert fwd[1] > fwd[2] > fwd[0]
    assert fwd[1] / fwd[0] == pytest.approx(100)
    bwd = longtail_prior(counts, 100, "backward")
    assert bwd[0] / bwd[1] == pytest.approx(100)
    assert np.allclose(longtail_prior(counts, 5, "uniform"), 1 / 3)
    assert parse_prior_name("backward25") == ("backward", 25.0)
    with pytest.raises(ValueError):
        parse_prior_name("sideways3")
