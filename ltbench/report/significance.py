"""Is a row's score really below the best one? Two tests a table footnote can name.

* Welch's t-test over seeds (``welch_pvalue``): each seed is one draw of the whole training
  procedure, so the question is whether two rows' seed means differ given the seed-to-seed spread.
  Welch rather than Student because methods differ in how stable they are (unequal variances).
* A paired bootstrap over test images (``paired_bootstrap_pvalue``): with the stored per-image
  predictions of two runs on the same test set, resample the test images and ask how often a
  difference as large as the observed one appears by chance.  It asks a narrower question (is this
  difference a property of these trained models, or of which test images were drawn?) and works
  with a single seed per row.

Only numpy and scipy: tables must not need torch.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

ALPHA = 0.05
WELCH_FOOTNOTE = f"Welch's t-test over seeds, alpha = {ALPHA}"
BOOTSTRAP_FOOTNOTE = f"paired bootstrap over test images, alpha = {ALPHA}"


def _finite(values: Iterable[float]) -> np.ndarray:
    array = np.asarray(list(values), dtype=float).ravel()
    return array[np.isfinite(array)]


def welch_test(a: Iterable[float], b: Iterable[float]) -> tuple[float | None, str | None]:
    """Two-sided Welch t-test of mean(a) == mean(b) over per-seed values: ``(p, None)``, or ``(None,
    reason)`` when the test is undefined and no p-value may be printed:

    * fewer than two finite values on a side (n = 1): no spread to estimate;
    * zero variance on both sides: the standard error is 0 and t is 0/0 or infinite. Two constant but
      different sides are not "p < 0.001": a spread of zero over 2 or 3 seeds says the seeds did not vary
      *here* (e.g. runs that are deterministic on this machine), not that the difference is certain.
    """
    a, b = _finite(a), _finite(b)
    if len(a) < 2 or len(b) < 2:
        return None, f"n = {min(len(a), len(b))} on a side, Welch needs 2 or more"
    if np.ptp(a) == 0 and np.ptp(b) == 0:
        return None, "zero variance on both sides, Welch is undefined"
    # Welch's t and Welch-Satterthwaite degrees of freedom, as scipy.stats.ttest_ind(equal_var=False);
    # scipy.special alone imports in a third of the time of scipy.stats, which tables feel.
    from scipy.special import stdtr

    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return float(min(1.0, 2.0 * stdtr(df, -abs(t)))), None


def welch_pvalue(a: Iterable[float], b: Iterable[float]) -> float:
    """``welch_test``'s p-value, ``nan`` where the test is undefined (n < 2, zero variance on both sides)."""
    p, _ = welch_test(a, b)
    return math.nan if p is None else p


def paired_bootstrap_pvalue(correct_a, correct_b, n_resamples: int = 10_000, seed: int = 0) -> float:
    """Two-sided p-value for "accuracy of a == accuracy of b" by resampling test images.

    ``correct_a`` / ``correct_b``: boolean arrays ``(n_images,)`` or ``(n_pairs, n_images)``, one row
    per seed pair, the same images in the same order.  Every resample draws the same image indices
    for every row, so the statistic is the per-image difference averaged over rows, resampled.
    The null distribution is the bootstrap distribution shifted to zero mean (Efron & Tibshirani's
    shift method); the p-value counts resampled differences at least as far from the observed one
    as the observed one is from zero, with the usual +1 so it is never exactly 0. ``nan`` when the two
    sides are right on exactly the same images (identical predictions): there is no test to make.

    Drawing n images with replacement only matters through how often each distinct per-image
    difference value is drawn, so we draw those counts from one multinomial: the same distribution
    as resampling indices, at a cost independent of the number of images.
    """
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
    """Which rows are statistically tied with the best one (Welch over seeds).

    The best row is the one with the best mean among rows with at least two finite values; it is
    True, as is every row whose Welch p-value against it is >= ``alpha``, or whose values are the best
    row's exactly (both constant and equal).  Rows with fewer than two values are left out, and a row
    with zero variance at a different value from a zero-variance best gets False: we make no claim.
    """
    eligible = {row: _finite(values) for row, values in values_by_row.items()}
    eligible = {row: values for row, values in eligible.items() if len(values) >= 2}
    if not eligible:
        return {}
    sign = 1.0 if higher_is_better else -1.0
    best = max(eligible, key=lambda row: sign * eligible[row].mean())
    verdict = {}
    for row, values in eligible.items():
        p, _ = welch_test(values, eligible[best])
        same = np.ptp(values) == 0 and np.ptp(eligible[best]) == 0 and values[0] == eligible[best][0]
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
