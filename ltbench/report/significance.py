"""Is a row's score really different from another's? The tests a table can name, each answering one question:
Welch's t-test over seeds (the default: it keeps its size at 2-5 seeds, ``DEFAULT_SIZE``), the two-level
bootstrap (seeds, then test images; liberal with few seeds, ``BOOTSTRAP_SIZE``) and the image-only paired
bootstrap (these trained models on this test set; it ignores the seed-to-seed spread). Holm's correction for
families, and the minimum detectable difference, so "no significant difference" can be read as "equal" or as
"too few seeds to tell". docs/significance.md states each test's question and measured size.

Only numpy and scipy: tables must not need torch.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

ALPHA = 0.05
POWER = 0.8  # the power the minimum detectable difference is stated at
RESAMPLES = 10_000
SEED_DRAWS = 5  # seed draws per image draw in the two-level bootstrap (the image draw is the costly one)
# Below this spread (relative to the values' magnitude, at least 1 point) a side is constant: float noise,
# e.g. two seeds whose Few accuracy differs in the 16th digit, is not a spread Welch may divide by. Any real
# difference between two seeds' accuracies is at least one test image, 100 / n_images points.
SPREAD_RTOL = 1e-9
# Measured size at nominal alpha = 0.05 under a true null ("same training procedure"), by seeds per row:
# ``python scripts/significance_size.py`` (its table and settings in docs/significance.md). Captions quote it.
BOOTSTRAP_SIZE = {2: 0.211, 3: 0.140, 5: 0.099}  # the two-level bootstrap: liberal with few seeds
IMAGE_BOOTSTRAP_SIZE = {2: 0.586, 3: 0.613, 5: 0.601}  # the image-only bootstrap asks another question: see above
DEFAULT_SIZE = {2: 0.026, 3: 0.042, 5: 0.043}  # default_row_test (Welch)


def _finite(values: Iterable[float]) -> list[float]:
    """The finite values as plain floats (a table's cells hold a handful: numpy per call costs more than the test)."""
    return [x for x in map(float, values) if math.isfinite(x)]


def _no_spread(a: list[float], b: list[float]) -> bool:
    """Both sides constant up to float noise (``SPREAD_RTOL`` of the values' magnitude, at least 1 point)."""
    tolerance = SPREAD_RTOL * max(1.0, max(map(abs, a)), max(map(abs, b)))
    return max(a) - min(a) <= tolerance and max(b) - min(b) <= tolerance


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def _squared_se(values: list[float]) -> float:
    """The squared standard error of the mean: the unbiased variance (ddof = 1) over n."""
    mean = _mean(values)
    return math.fsum((x - mean) ** 2 for x in values) / (len(values) - 1) / len(values)


def default_row_test(a_seeds: Iterable[float] | None, b_seeds: Iterable[float] | None, a_images=None,
                     b_images=None) -> tuple[float | None, str | None]:
    """THE test a table uses to compare two rows by default: Welch's over per-seed values in points, the one
    that keeps its size at 2, 3 and 5 seeds per row. ``(p, None)``, or ``(None, reason)`` when no test is
    possible. Per-seed image correctness (``a_images`` / ``b_images``) stands in for missing seed values."""
    def values(seeds, images):
        if seeds is not None:
            return seeds
        if images is None:
            raise ValueError("default_row_test needs per-seed values or per-seed image correctness for each row")
        items = images.values() if isinstance(images, dict) else images
        return [100.0 * float(np.mean(np.asarray(c, dtype=float))) for c in items]

    return welch_test(values(a_seeds, a_images), values(b_seeds, b_images))


def welch_test(a: Iterable[float], b: Iterable[float]) -> tuple[float | None, str | None]:
    """Two-sided Welch t-test of mean(a) == mean(b) over per-seed values, as scipy.stats.ttest_ind(equal_var=False)
    on plain floats (a table makes thousands): ``(p, None)``, or ``(None, reason)`` with fewer than two values
    on a side or zero variance on both (up to ``SPREAD_RTOL``): two constant but different sides are not
    "p < 0.001", since seeds that did not vary *here* do not make a difference certain."""
    a, b = _finite(a), _finite(b)
    if len(a) < 2 or len(b) < 2:
        return None, f"n = {min(len(a), len(b))} on a side, Welch needs 2 or more"
    if _no_spread(a, b):
        return None, "zero variance on both sides, Welch is undefined"
    va, vb = _squared_se(a), _squared_se(b)
    t = (_mean(a) - _mean(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return min(1.0, student_t_two_sided(t, df)), None


def student_t_two_sided(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` (real, > 0) degrees of freedom: ``2 * stdtr(df, -|t|)``.
    scipy.special is imported here, not at module level, so a table that makes no Welch test does not pay
    for it (about 0.3 s)."""
    from scipy.special import stdtr

    return float(2.0 * stdtr(df, -abs(t)))


def paired_bootstrap_pvalue(correct_a, correct_b, n_resamples: int = 10_000, seed: int = 0) -> float:
    """Two-sided p-value for "accuracy of a == accuracy of b" by resampling test images (Efron & Tibshirani's
    shift method, +1 so it is never exactly 0); ``nan`` for identical predictions (no test to make).

    ``correct_a`` / ``correct_b``: boolean ``(n_images,)`` or ``(n_pairs, n_images)``, one row per seed pair,
    the same images in the same order. Only how often each distinct per-image difference is drawn matters, so
    the draw is one multinomial over those values: the same distribution as resampling indices, at a cost
    independent of the number of images."""
    a, b = np.atleast_2d(np.asarray(correct_a, dtype=bool)), np.atleast_2d(np.asarray(correct_b, dtype=bool))
    if a.shape != b.shape or a.ndim != 2 or a.shape[1] == 0:
        raise ValueError(f"paired bootstrap needs two equal, non-empty shapes; got {a.shape} and {b.shape}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    per_image = a.astype(float).mean(axis=0) - b.astype(float).mean(axis=0)
    observed = per_image.mean()
    if not per_image.any():  # identical predictions: nothing to resample, no test (paired_bootstrap_test)
        return math.nan
    if observed == 0:
        return 1.0
    values, counts = np.unique(per_image, return_counts=True)
    n_images = per_image.size
    draws = np.random.default_rng(seed).multinomial(n_images, counts / n_images, size=n_resamples)
    resampled = draws @ values / n_images
    extreme = np.abs(resampled - observed) >= abs(observed) - 1e-12
    return float((extreme.sum() + 1) / (n_resamples + 1))


def paired_bootstrap_test(correct_a, correct_b, n_resamples: int = 10_000, seed: int = 0
                          ) -> tuple[float | None, str | None]:
    """``(p, None)``, or ``(None, reason)`` when both sides are right on exactly the same test images."""
    p = paired_bootstrap_pvalue(correct_a, correct_b, n_resamples, seed)
    return (None, "identical predictions on every test image") if math.isnan(p) else (p, None)


def not_different_from_best(values_by_row: dict[str, list[float]], higher_is_better: bool = True,
                            alpha: float = ALPHA) -> dict[str, bool]:
    """Which rows are statistically tied with the best one (``default_row_test``: Welch over seeds).

    The best row is the one with the best mean among rows with at least two finite values; it is
    True, as is every row whose p-value against it is >= ``alpha``, or whose values are the best
    row's (both constant and equal, up to float noise).  Rows with fewer than two values are left out, and a row
    with zero variance at a different value from a zero-variance best gets False: we make no claim.
    """
    eligible = {row: _finite(values) for row, values in values_by_row.items()}
    eligible = {row: values for row, values in eligible.items() if len(values) >= 2}
    if not eligible:
        return {}
    sign = 1.0 if higher_is_better else -1.0
    best = max(eligible, key=lambda row: sign * _mean(eligible[row]))
    verdict = {}
    for row, values in eligible.items():
        p, _ = default_row_test(values, eligible[best])
        same = p is None and _no_spread(values + eligible[best], values[:1])
        verdict[row] = row == best or same or (p is not None and p >= alpha)
    return verdict


def bootstrap_not_different_from_best(correct_by_row: dict[str, dict[int, np.ndarray]], alpha: float = ALPHA,
                                      n_resamples: int = 10_000, seed: int = 0) -> dict[str, bool]:
    """``not_different_from_best`` with the paired bootstrap: ``correct_by_row[row][seed]`` is a
    boolean array per test image (``ltbench.results.predictions.correct``), rows on the same test set.

    The best row has the highest accuracy over all its stored images; every other row is paired
    with it on the seeds both have.  Rows with no stored predictions, or no seed in common with the
    best row, or evaluated on a different number of images, are absent (no claim).
    """
    rows = {row: {s: np.asarray(c, dtype=bool) for s, c in by_seed.items() if c is not None}
            for row, by_seed in correct_by_row.items()}
    rows = {row: by_seed for row, by_seed in rows.items() if by_seed}
    if not rows:
        return {}
    best = max(rows, key=lambda row: np.mean([c.mean() for c in rows[row].values()]))
    verdict = {best: True}
    for row, by_seed in rows.items():
        common = sorted(set(by_seed) & set(rows[best]))
        if row == best or not common or any(by_seed[s].shape != rows[best][s].shape for s in common):
            continue
        p = paired_bootstrap_pvalue(np.stack([by_seed[s] for s in common]),
                                    np.stack([rows[best][s] for s in common]), n_resamples, seed)
        verdict[row] = math.isnan(p) or p >= alpha  # nan: identical predictions, tied by definition
    return verdict


# ------------------------------------------------------------------------------------------------
# The two-level bootstrap: seeds, then test images


def _stack(by_seed: dict) -> tuple[list, np.ndarray]:
    seeds = sorted(by_seed, key=str)
    return seeds, np.stack([np.asarray(by_seed[s], dtype=bool) for s in seeds]) if seeds else np.zeros((0, 0), bool)


def two_level_bootstrap(correct_a: dict, correct_b: dict, paired_seeds: bool = False,
                        n_resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float, np.ndarray]:
    """(observed difference, p, resampled differences) of mean accuracy, row a - row b, as fractions.

    ``correct_a`` / ``correct_b``: {seed: boolean array per test image}, all on the same images. Each resample
    draws each row's seeds with replacement (one draw for both when ``paired_seeds``: heads of the same runs
    share their seed's backbone), then the test images once for all seeds; the p-value is the shift method's
    (``paired_bootstrap_pvalue``). An image draw is one multinomial over the distinct right/wrong patterns
    across seeds; it is the costly part, so each serves ``SEED_DRAWS`` seed draws (10,000 resamples in about
    a quarter of a second).
    """
    seeds_a, a = _stack(correct_a)
    seeds_b, b = _stack(correct_b)
    if len(seeds_a) < 2 or len(seeds_b) < 2 or a.shape[1] != b.shape[1] or a.shape[1] == 0:
        raise ValueError("the two-level bootstrap needs two or more seeds per row on one test set")
    if paired_seeds and seeds_a != seeds_b:
        raise ValueError("paired seeds need the same seeds on both rows")
    observed = a.mean(axis=1).mean() - b.mean(axis=1).mean()
    patterns, counts = np.unique(np.vstack([a, b]).T, axis=0, return_counts=True)  # (k, na + nb), (k,)
    rng = np.random.default_rng(seed)
    n_images, na, nb = a.shape[1], len(seeds_a), len(seeds_b)
    draws = -(-n_resamples // SEED_DRAWS)
    weights = rng.multinomial(n_images, counts / n_images, size=draws) / n_images
    accuracy = np.repeat(weights @ patterns.astype(float), SEED_DRAWS, axis=0)[:n_resamples]  # (r, na + nb)
    pick_a = rng.integers(0, na, size=(n_resamples, na))
    pick_b = pick_a if paired_seeds else rng.integers(0, nb, size=(n_resamples, nb))
    rows = np.arange(n_resamples)[:, None]
    out = accuracy[rows, pick_a].mean(axis=1) - accuracy[rows, na + pick_b].mean(axis=1)
    extreme = np.abs(out - observed) >= abs(observed) - 1e-12
    p = 1.0 if observed == 0 else float((extreme.sum() + 1) / (n_resamples + 1))
    return float(observed), p, out


def two_level_bootstrap_test(correct_a: dict, correct_b: dict, paired_seeds: bool = False,
                             n_resamples: int = RESAMPLES, seed: int = 0) -> tuple[float | None, str | None]:
    """``(p, None)``, or ``(None, reason)`` when the test cannot be made (``two_level_problem``)."""
    problem = two_level_problem(correct_a, correct_b)
    if problem:
        return None, problem
    return two_level_bootstrap(correct_a, correct_b, paired_seeds, n_resamples, seed)[1], None


def two_level_problem(correct_a: dict, correct_b: dict) -> str | None:
    """Why the two-level bootstrap cannot compare these rows (fewer than two seeds on a side, predictions on
    different test sets, identical predictions everywhere), or None."""
    na, nb = len(correct_a), len(correct_b)
    if min(na, nb) < 2:
        return f"n = {min(na, nb)} on a side, the two-level bootstrap needs 2 or more seeds"
    shapes = {np.asarray(c).shape for c in [*correct_a.values(), *correct_b.values()]}
    if len(shapes) != 1:
        return "predictions on different test sets"
    _, a = _stack(correct_a)
    _, b = _stack(correct_b)
    if (a == a[0]).all() and (b == a[0]).all():
        return "identical predictions on every test image"
    return None


def two_level_not_different_from_best(correct_by_row: dict[str, dict], paired: set[frozenset] = frozenset(),
                                      alpha: float = ALPHA) -> dict[str, bool]:
    """``not_different_from_best`` with the two-level bootstrap: the best row has the highest mean accuracy
    over its seeds; a row with fewer than two seeds, or on other test images than the best, gets no claim.
    ``paired``: the pairs of row names that are heads of the same runs (seeds drawn jointly)."""
    rows = {row: by_seed for row, by_seed in correct_by_row.items() if by_seed and len(by_seed) >= 2}
    if not rows:
        return {}
    best = max(rows, key=lambda row: np.mean([np.asarray(c).mean() for c in rows[row].values()]))
    verdict = {best: True}
    for row, by_seed in rows.items():
        if row == best:
            continue
        p, reason = two_level_bootstrap_test(by_seed, rows[best], frozenset((row, best)) in paired)
        if p is not None or reason == "identical predictions on every test image":
            verdict[row] = p is None or p >= alpha
    return verdict


# ------------------------------------------------------------------------------------------------
# Families of comparisons, and what a test could have found


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values, in the order given (None: no test, left out of the family).

    Sorted ascending, the i-th smallest of m p-values becomes max over j <= i of min(1, (m - j + 1) p_(j)):
    rejecting where the adjusted value is below alpha keeps the chance of any false rejection in the
    family at most alpha, like Bonferroni, while never rejecting less."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    out: list[float | None] = [None] * len(pvalues)
    running, m = 0.0, len(tested)
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def minimum_detectable_difference(a: Iterable[float], b: Iterable[float], alpha: float = ALPHA,
                                  power: float = POWER) -> float | None:
    """The smallest true difference of means that Welch's test over these seeds would detect with probability
    ``power`` at two-sided ``alpha``, from the spread observed: (t_{1-alpha/2} + t_{power}) x SE, with the
    Welch-Satterthwaite degrees of freedom. None when there is no spread to estimate (n < 2 on a side, or
    zero variance on both, up to float noise). With 2 seeds on a side it is a plug-in of a 1-2 df variance
    and can be several times off (docs/significance.md measures how far): tables do not print it there."""
    a, b = _finite(a), _finite(b)
    if len(a) < 2 or len(b) < 2 or _no_spread(a, b):
        return None
    from scipy.special import stdtrit

    va, vb = _squared_se(a), _squared_se(b)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return float((stdtrit(df, 1 - alpha / 2) + stdtrit(df, power)) * math.sqrt(va + vb))


def bootstrap_detectable_difference(resampled: np.ndarray, alpha: float = ALPHA, power: float = POWER) -> float:
    """The same for a bootstrap test: (z_{1-alpha/2} + z_{power}) x the standard deviation of the resampled
    differences (the normal approximation to the bootstrap distribution)."""
    from scipy.special import ndtri

    return float((ndtri(1 - alpha / 2) + ndtri(power)) * np.std(resampled, ddof=1))
