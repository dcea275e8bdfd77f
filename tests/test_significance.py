"""Significance tests: known p-values, determinism and the edge cases a table meets."""

import math

import numpy as np
import pytest
from scipy import stats

from ltbench.report.significance import (ALPHA, bootstrap_not_different_from_best, holm, minimum_detectable_difference,
                                  not_different_from_best, paired_bootstrap_pvalue, two_level_bootstrap,
                                  two_level_bootstrap_test, welch_test)


def welch_pvalue(a, b) -> float:
    """welch_test's p-value, nan where the test is undefined (n < 2, zero variance on both sides)."""
    p, _ = welch_test(a, b)
    return math.nan if p is None else p


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
        write_run(spec, metrics={**fake_metrics(spec.config, 0), **dict.fromkeys(("all", "many", "medium", "few"), accuracy)})
    (table,) = report.tables(path, name="t", test="welch")
    for fmt in ("markdown", "latex", "csv"):
        text = report.render(table, fmt)
        assert "no test: zero variance on both sides, Welch is undefined" in text, fmt
        assert "p < 0.001" not in text and "p = " not in text, fmt
    assert "-50.00 (no test: zero variance" in report.render(table, "markdown")


# ------------------------------------------------------------------------------------------------
# Issue 31: the two-level bootstrap (seeds, then test images), Holm, minimum detectable differences


def _seed_dominated(rng, n_images=2000):
    """Two rows of 5 seeds on one test set: each seed's model is right on a random ~p_seed of the images,
    where p_seed spreads by several points between seeds and row a's mean is 1.5 points above row b's. The
    images are plenty (the image-level noise is small), the seeds few: seed variance dominates."""
    def row(means):
        return {s: rng.random(n_images) < m for s, m in enumerate(means)}
    return row([0.70, 0.66, 0.74, 0.68, 0.72]), row([0.69, 0.64, 0.71, 0.66, 0.685])


def _direct_two_level(a: dict, b: dict, paired: bool, n: int, rng) -> float:
    """The two-level bootstrap written out with image indices: per resample, draw each row's seeds, then the
    test images (one draw for every seed), and compare the rows' mean accuracies (shift-method p-value)."""
    A, B = np.stack([a[s] for s in sorted(a)]), np.stack([b[s] for s in sorted(b)])
    observed = A.mean(axis=1).mean() - B.mean(axis=1).mean()
    diffs = np.empty(n)
    for r in range(n):
        sa = rng.integers(0, len(A), len(A))
        sb = sa if paired else rng.integers(0, len(B), len(B))
        images = rng.integers(0, A.shape[1], A.shape[1])
        diffs[r] = A[sa][:, images].mean() - B[sb][:, images].mean()
    return float((np.sum(np.abs(diffs - observed) >= abs(observed) - 1e-12) + 1) / (n + 1))


@pytest.mark.parametrize("paired", [False, True])
def test_two_level_bootstrap_matches_a_direct_computation_where_seed_variance_dominates(paired):
    rng = np.random.default_rng(3)
    a, b = _seed_dominated(rng)
    diff, p, resampled = two_level_bootstrap(a, b, paired_seeds=paired)
    direct = _direct_two_level(a, b, paired, 4000, np.random.default_rng(4))
    assert diff == pytest.approx(np.mean([a[s].mean() for s in a]) - np.mean([b[s].mean() for s in b]))
    assert abs(p - direct) < 0.04, (p, direct)  # Monte Carlo error of 4,000 and 10,000 resamples
    # Seeds dominate: resampling the images alone (seeds held fixed) finds the 1.5-point gap decisive,
    # the two-level bootstrap (the question 'is this training procedure better') does not.
    image_only = paired_bootstrap_pvalue(np.stack([a[s] for s in a]), np.stack([b[s] for s in b]))
    assert image_only < 0.01 and p > 0.05
    assert np.std(resampled) > 2 * np.std([paired_bootstrap_spread(a, b)])


def paired_bootstrap_spread(a, b):
    """The image-only standard error of the same difference: mean per-image difference / sqrt(n)."""
    per_image = np.stack([a[s] for s in a]).mean(0).astype(float) - np.stack([b[s] for s in b]).mean(0)
    return per_image.std(ddof=1) / np.sqrt(per_image.size)


def test_two_level_bootstrap_refuses_what_it_cannot_test():
    one = {0: np.ones(5, bool)}
    two = {0: np.ones(5, bool), 1: np.zeros(5, bool)}
    assert two_level_bootstrap_test(one, two) == (None, "n = 1 on a side, the two-level bootstrap needs 2 or more seeds")
    assert two_level_bootstrap_test(two, {0: np.ones(6, bool), 1: np.ones(6, bool)})[1] == "predictions on different test sets"
    same = {0: np.ones(5, bool), 1: np.ones(5, bool)}
    assert two_level_bootstrap_test(same, same)[1] == "identical predictions on every test image"


def test_holm_matches_a_direct_computation():
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = list(rng.random(int(rng.integers(2, 12))) ** 3)
        with_gaps = p[:2] + [None] + p[2:]  # no test: left out of the family, None stays None
        m, order = len(p), np.argsort(p)
        direct = np.empty(m)
        for rank, i in enumerate(order):  # step-down: (m - rank) p, never below the previous one, at most 1
            direct[i] = min(1.0, max((m - k) * p[order[k]] for k in range(rank + 1)))
        got = holm(with_gaps)
        assert got[2] is None
        assert np.allclose([g for g in got if g is not None], direct)
    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])


def test_minimum_detectable_difference_is_welchs_power_equation():
    a, b = [70.1, 68.9, 69.5], [68.2, 69.0, 67.1, 68.4]
    se = math.sqrt(np.var(a, ddof=1) / 3 + np.var(b, ddof=1) / 4)
    va, vb = np.var(a, ddof=1) / 3, np.var(b, ddof=1) / 4
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 3)
    expected = (stats.t.ppf(0.975, df) + stats.t.ppf(0.8, df)) * se
    assert minimum_detectable_difference(a, b) == pytest.approx(expected)
    # the definition: a true difference of that size is found with power ~0.8 (noncentral t)
    power = 1 - stats.nct.cdf(stats.t.ppf(0.975, df), df, expected / se) + stats.nct.cdf(-stats.t.ppf(0.975, df), df, expected / se)
    assert power == pytest.approx(0.8, abs=0.03)
    assert minimum_detectable_difference([1.0], b) is None and minimum_detectable_difference([1, 1], [2, 2]) is None


def test_holm_and_detectable_differences_reach_the_table(write_recipe):
    from ltbench import report
    from ltbench.recipe import load_recipe
    from tests.reportkit import populate

    tables = {"t": {"columns": ["many", "few", "all"], "correction": "holm:row",
                    "rows": [{"label": "CE", "where": {"method.name": "ce"}},
                             {"label": "LA", "where": {"method.name": "la"}, "versus": "CE"}]}}
    path = write_recipe("r", {"grid": {"method": [{"name": "ce"}, {"name": "la", "tau": 1.0}]},
                              "seeds": [0, 1, 2], "tables": tables})
    populate(load_recipe(path))
    (table,) = report.tables(path, use_cache=False)
    (comp,) = table.comparisons
    raw = [comp.unadjusted[c] for c in sorted(comp.cells)]
    assert [comp.cells[c][1] for c in sorted(comp.cells)] == pytest.approx(holm(raw))
    text = report.render(table, "markdown")
    assert "Holm-adjusted within each row pair (across its columns) (families of 3)" in text
    assert "smallest true difference these seeds could detect" in text and "LA − CE: Many " in text


# ------------------------------------------------------------------------------------------------
# Issue 44: the default row test keeps its size at the seeds people run; float noise is no spread


def test_the_default_row_test_keeps_its_nominal_size_at_three_seeds():
    """Null simulation (fixed seed): two rows of 3 seeds each from one training procedure, the seed spread of
    Fashion-MNIST-LT's baselines (1.5 points: their All spreads 0.7-3.5, median 0.9, root mean square 1.7).
    At alpha = 0.05 the default test must reject at most 7 % of the time, and must be a test at all."""
    from ltbench.report.significance import default_row_test

    rng = np.random.default_rng(44)
    seeds = rng.normal(75.0, 1.5, size=(4000, 2, 3))
    results = [default_row_test(a, b) for a, b in seeds]
    assert all(p is not None for p, _ in results)
    size = np.mean([p < ALPHA for p, _ in results])
    assert 0.02 <= size <= 0.07, size  # ~0.05 +- 0.0035 (Monte Carlo)


def test_the_default_row_test_reads_per_image_correctness_when_no_seed_values_are_given():
    from ltbench.report.significance import default_row_test, welch_test

    rng = np.random.default_rng(1)
    a = {s: rng.random(1000) < m for s, m in enumerate([0.70, 0.72, 0.69])}
    b = [rng.random(1000) < m for m in [0.65, 0.66, 0.64]]
    values = [100 * c.mean() for c in a.values()], [100 * c.mean() for c in b]
    assert default_row_test(None, None, a, b) == welch_test(*values)
    assert default_row_test(values[0], values[1], a, b) == welch_test(*values)  # seed values given: those
    with pytest.raises(ValueError):
        default_row_test(None, values[1])


@pytest.mark.parametrize("a,b", [
    ([30.0, 0.1 * 100 + 0.2 * 100], [20.0, 20.0]),  # 30 and 30.000000000000004: float noise, not a spread
    ([1e-16, 0.0], [0.0, 0.0]),  # Few accuracies differing by 1e-16
    ([50.0, 50.0 * (1 + 1e-12)], [40.0, 40.0 * (1 - 1e-12)]),
])
def test_float_noise_spreads_give_no_welch_p_value_nor_a_detectable_difference(a, b):
    from ltbench.report.significance import default_row_test, welch_test

    assert welch_test(a, b) == (None, "zero variance on both sides, Welch is undefined")
    assert default_row_test(a, b)[0] is None
    assert minimum_detectable_difference(a, b) is None
    assert welch_test([30.0, 30.01], [20.0, 20.0])[0] is not None  # one image in 10,000 is a real spread


def _two_row_table(write_recipe, seeds, accuracy):
    from ltbench import report
    from ltbench.recipe import load_recipe
    from tests.reportkit import fake_metrics, write_run

    path = write_recipe("r", extra={"seeds": seeds, "grid": {"method": [{"name": "ce"}, {"name": "la"}]},
                                    "tables": {"t": {"columns": ["few", "all"], "rows": [
                                        {"label": "CE", "where": {"method.name": "ce"}},
                                        {"label": "LA", "where": {"method.name": "la"}, "versus": "CE"}]}}})
    for spec in load_recipe(path).runs:
        metrics = fake_metrics(spec.config, spec.config["seed"])
        changed = accuracy(spec.config["method"]["name"], spec.config["seed"], metrics)
        if changed:  # made-up group values: no per-class values they would have to agree with (schema.agreement_problem)
            metrics = {k: v for k, v in metrics.items() if k != "per_class"}
        write_run(spec, metrics={**metrics, **changed})
    (table,) = report.tables(path, name="t", test="welch", use_cache=False)
    return table, report.render(table, "markdown")


def test_the_detectable_difference_note_says_no_test_for_float_noise(write_recipe):
    def few_noise(method, seed, metrics):  # Few: 0.3 vs 0.1 + 0.2 across seeds, the same on the other row
        few = {"ce": [0.3, 0.1 + 0.2, 0.3], "la": [0.5, 0.5, 0.5]}[method][seed]
        return {"few": few, "all": metrics["all"] + 0.01 * seed * (method == "la")}

    table, text = _two_row_table(write_recipe, [0, 1, 2], few_noise)
    assert "no test: zero variance on both sides" in text and "p < 0.001" not in text
    (note,) = [n for n in table.notes if n.startswith("smallest true difference")]
    assert "LA − CE: Few no test, All " in note


def test_the_detectable_difference_is_not_printed_from_two_seeds(write_recipe):
    table, text = _two_row_table(write_recipe, [0, 1], lambda method, seed, m: {})
    (note,) = [n for n in table.notes if n.startswith("smallest true difference")]
    assert note.endswith("Welch over the seeds' spread): not estimated where a row has 2 seeds (a spread from 2 "
                         "seeds can be several times off; docs/significance.md)"), note
    assert "p = " in text or "p < " in text  # the test itself is made


def test_tables_compare_rows_with_the_default_row_test(write_recipe, monkeypatch):
    from ltbench.report import significance

    calls = []

    def sentinel(a, b, a_images=None, b_images=None):
        calls.append((list(a), list(b)))
        return 0.0123, None
    monkeypatch.setattr(significance, "default_row_test", sentinel)
    table, text = _two_row_table(write_recipe, [0, 1, 2], lambda method, seed, m: {})
    assert "p = 0.012" in text and calls


def test_the_bootstrap_caption_gives_its_measured_size():
    from ltbench.report import significance, significance_marks
    from ltbench.report.rows import Cell, Row, Table
    from ltbench.recipe.tables import TableSpec

    row = Row(label="A", cells={(0, 0): Cell(values=[1.0, 2.0, 3.0])})
    table = Table("t", TableSpec(), [("all", "All")], [], [()], [row])
    note = significance_marks.few_seeds_note(table, "bootstrap")
    assert f"{100 * significance.BOOTSTRAP_SIZE[3]:.0f} % with 3 seeds" in note and "liberal" in note
    assert significance.BOOTSTRAP_SIZE[3] > 0.07 >= max(significance.DEFAULT_SIZE.values())


def test_docs_give_the_simulated_sizes_the_captions_quote():
    from pathlib import Path

    from ltbench.report import significance

    text = (Path(__file__).resolve().parent.parent / "docs" / "significance.md").read_text()
    for name, sizes in (("default_row_test (Welch over seeds)", significance.DEFAULT_SIZE),
                        ("two-level bootstrap", significance.BOOTSTRAP_SIZE),
                        ("image-only bootstrap", significance.IMAGE_BOOTSTRAP_SIZE)):
        line = next(line for line in text.splitlines() if line.startswith(f"| {name} |"))
        assert [f"{100 * sizes[n]:.1f} %" for n in (2, 3, 5)] == [c.strip() for c in line.split("|")[2:5]], line


def test_the_student_t_tail_has_its_closed_forms():
    # Cauchy (df = 1) and df = 2 have closed forms; a huge |t| has no tail left.
    from ltbench.report.significance import student_t_two_sided

    for t in (0.3, 1.0, 7.0):
        for sign in (1, -1):
            assert student_t_two_sided(sign * t, 1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, rel=1e-12)
            assert student_t_two_sided(sign * t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-12)
    assert student_t_two_sided(float("inf"), 3) == 0.0


def test_welch_on_plain_floats_matches_scipys_ttest():
    rng = np.random.default_rng(3)
    for na, nb in ((2, 2), (2, 5), (3, 3), (5, 10), (10, 10)):
        for _ in range(20):
            a, b = rng.normal(50, rng.uniform(0.1, 20), na), rng.normal(52, rng.uniform(0.1, 20), nb)
            expected = stats.ttest_ind(a, b, equal_var=False).pvalue
            assert welch_pvalue(a, b) == pytest.approx(expected, rel=1e-9, abs=1e-12)
            assert welch_pvalue(list(a), list(b)) == welch_pvalue(a, b)  # arrays or lists: the same floats
