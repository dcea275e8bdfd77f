"""Significance tests: known p-values, determinism and the edge cases a table meets."""

import math

import numpy as np
import pytest
from scipy import stats

from ltbench.report.significance import (ALPHA, bootstrap_not_different_from_best, not_different_from_best,
                                  paired_bootstrap_pvalue, welch_pvalue)


def test_welch_matches_a_hand_computed_value():
    # t = -2.6112 with Welch-Satterthwaite df = 6.981, worked out by hand from the formula.
    assert welch_pvalue([1, 2, 3, 4], [3, 4, 5, 6, 7]) == pytest.approx(0.0349388, abs=1e-6)
    assert welch_pvalue([3, 4, 5, 6, 7], [1, 2, 3, 4]) == pytest.approx(0.0349388, abs=1e-6)


def test_welch_is_not_student():
    a, b = [10.0, 10.1, 9.9], [8.0, 12.0, 6.0, 14.0, 10.5, 9.0]
    student = stats.ttest_ind(a, b, equal_var=True).pvalue
    assert welch_pvalue(a, b) != pytest.approx(student, rel=1e-3)


def test_welch_edge_cases():
    assert math.isnan(welch_pvalue([1.0], [1.0, 2.0]))
    assert math.isnan(welch_pvalue([1.0, float("nan")], [1.0, 2.0]))  # one finite value left
    assert math.isnan(welch_pvalue([5.0, 5.0], [5.0, 5.0, 5.0]))  # identical constants: undefined
    assert math.isnan(welch_pvalue([5.0, 5.0], [6.0, 6.0]))  # constant but different: undefined, not p = 0
    assert welch_pvalue([1.0, 2.0, float("inf")], [1.0, 2.0]) == pytest.approx(1.0)  # non-finite dropped


def test_bootstrap_identical_and_opposite():
    correct = np.random.default_rng(0).random(200) < 0.7
    assert math.isnan(paired_bootstrap_pvalue(correct, correct))  # identical predictions: no test
    all_right, all_wrong = np.ones(100, bool), np.zeros(100, bool)
    assert paired_bootstrap_pvalue(all_right, all_wrong, n_resamples=999) == pytest.approx(1 / 1000)


def _discordant(n_images: int, a_only: int, b_only: int) -> tuple[np.ndarray, np.ndarray]:
    a = np.zeros(n_images, bool)
    b = np.zeros(n_images, bool)
    a[:a_only] = True
    b[a_only:a_only + b_only] = True
    both = slice(a_only + b_only, n_images // 2)
    a[both] = b[both] = True
    return a, b


def test_bootstrap_agrees_with_the_normal_approximation():
    # 10 vs 8 discordant images: the resampled difference in correct images S has mean 2, sd sqrt(18);
    # "as far from 2 as 2 is from 0" is S <= 0 or S >= 4, i.e. with a continuity correction
    # p = 2 * Phi(-1.5 / sqrt(18)) = 0.724.
    a, b = _discordant(1000, 10, 8)
    assert paired_bootstrap_pvalue(a, b) == pytest.approx(0.724, abs=0.02)
    # 40 vs 5: z = 35 / sqrt(45) = 5.2, far below alpha.
    a, b = _discordant(1000, 40, 5)
    assert paired_bootstrap_pvalue(a, b) < 0.001


def test_bootstrap_matches_resampling_indices_directly():
    rng = np.random.default_rng(1)
    a = rng.random((3, 300)) < 0.62
    b = rng.random((3, 300)) < 0.58
    per_image = a.mean(0) - b.mean(0)
    observed = per_image.mean()
    idx = np.random.default_rng(5).integers(0, 300, size=(4000, 300))
    boot = per_image[idx].mean(1)
    direct = (np.sum(np.abs(boot - observed) >= abs(observed)) + 1) / 4001
    assert paired_bootstrap_pvalue(a, b, n_resamples=4000) == pytest.approx(direct, abs=0.03)


def test_bootstrap_is_deterministic_per_seed():
    rng = np.random.default_rng(2)
    a, b = rng.random(500) < 0.6, rng.random(500) < 0.55
    assert paired_bootstrap_pvalue(a, b, seed=3) == paired_bootstrap_pvalue(a, b, seed=3)
    p0, p1 = paired_bootstrap_pvalue(a, b, seed=0), paired_bootstrap_pvalue(a, b, seed=1)
    assert p0 != p1 and p0 == pytest.approx(p1, abs=0.03)


def test_bootstrap_rejects_unpaired_shapes():
    with pytest.raises(ValueError):
        paired_bootstrap_pvalue(np.ones(10, bool), np.ones(11, bool))
    with pytest.raises(ValueError):
        paired_bootstrap_pvalue(np.ones(0, bool), np.ones(0, bool))


def test_not_different_from_best():
    verdict = not_different_from_best({
        "best": [80.0, 80.5, 79.5],
        "tied": [79.8, 80.9, 78.9],
        "worse": [70.0, 70.2, 69.8],
        "one seed": [99.0],
        "no seeds": [],
    })
    assert verdict == {"best": True, "tied": True, "worse": False}


def test_not_different_from_best_lower_is_better_and_alpha():
    errors = {"low": [1.0, 1.1, 0.9], "high": [1.6, 1.5, 1.7]}
    assert not_different_from_best(errors, higher_is_better=False) == {"low": True, "high": False}
    assert not_different_from_best(errors, higher_is_better=True) == {"low": False, "high": True}
    p = welch_pvalue(errors["low"], errors["high"])
    assert ALPHA == 0.05 and p < ALPHA
    assert not_different_from_best(errors, higher_is_better=False, alpha=p / 2)["high"] is True


def test_not_different_from_best_identical_rows_tie():
    assert not_different_from_best({"a": [5.0, 5.0], "b": [5.0, 5.0]}) == {"a": True, "b": True}
    assert not_different_from_best({"a": [5.0]}) == {}


def test_bootstrap_not_different_from_best_pairs_common_seeds():
    rng = np.random.default_rng(4)
    truth = rng.random(2000)
    best = {0: truth < 0.70, 1: truth < 0.71}
    swapped = best[0].copy()
    swapped[np.flatnonzero(swapped)[:12]] = False  # 12 images now wrong, 10 others now right
    swapped[np.flatnonzero(~best[0])[:10]] = True
    tied = {0: swapped, 2: truth < 0.5}  # only seed 0 in common with the best row
    worse = {0: truth < 0.55, 1: truth < 0.56}
    verdict = bootstrap_not_different_from_best({"best": best, "tied": tied, "worse": worse,
                                                 "other seeds": {5: truth < 0.7}, "none": {}}, n_resamples=2000)
    assert verdict == {"best": True, "tied": True, "worse": False}
    assert bootstrap_not_different_from_best({}) == {}


@pytest.mark.parametrize("a,b,reason", [
    ([50.0, 50.0], [100.0, 100.0], "zero variance on both sides, Welch is undefined"),
    ([5.0, 5.0], [5.0, 5.0, 5.0], "zero variance on both sides, Welch is undefined"),
    ([70.0], [60.0, 61.0], "n = 1 on a side, Welch needs 2 or more"),
])
def test_undefined_welch_gives_no_p_value_and_says_why(a, b, reason):
    from ltbench.report.significance import welch_test

    assert welch_test(a, b) == (None, reason)
    assert welch_test([1.0, 2.0], [3.0, 3.0])[0] is not None  # one side constant: still defined


def test_identical_predictions_give_no_bootstrap_test():
    from ltbench.report.significance import paired_bootstrap_test

    correct = np.random.default_rng(0).random(500) < 0.6
    assert paired_bootstrap_test(correct, correct) == (None, "identical predictions on every test image")
    swapped = correct.copy()
    swapped[np.flatnonzero(correct)[0]], swapped[np.flatnonzero(~correct)[0]] = False, True
    p, reason = paired_bootstrap_test(correct, swapped)  # same accuracy, different images: a test, p = 1
    assert reason is None and p == pytest.approx(1.0)


def test_constant_but_different_rows_make_no_tie_claim():
    assert not_different_from_best({"a": [50.0, 50.0], "b": [100.0, 100.0]}) == {"a": False, "b": True}


def test_a_table_difference_over_zero_variance_says_no_test_not_a_p_value(write_recipe):
    from ltbench import report
    from ltbench.recipe import load_recipe
    from tests.reportkit import fake_metrics, write_run

    path = write_recipe("zero", extra={"seeds": [0, 1], "grid": {"method": [{"name": "ce"}, {"name": "la"}]},
                                       "tables": {"t": {"columns": ["all"], "rows": [
                                           {"label": "CE", "where": {"method.name": "ce"}},
                                           {"label": "LA", "where": {"method.name": "la"}, "versus": "CE"}]}}})
    for spec in load_recipe(path).runs:  # every seed gives the same accuracy: zero variance on both sides
        accuracy = 0.5 if spec.config["method"]["name"] == "la" else 1.0
        write_run(spec, metrics={**fake_metrics(spec.config, 0), "all": accuracy})
    (table,) = report.tables(path, name="t", test="welch")
    for fmt in ("markdown", "latex", "csv"):
        text = report.render(table, fmt)
        assert "no test: zero variance on both sides, Welch is undefined" in text, fmt
        assert "p < 0.001" not in text and "p = " not in text, fmt
    assert "-50.00 (no test: zero variance" in report.render(table, "markdown")
