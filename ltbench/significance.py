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


def welch_pvalue(a: Iterable[float], b: Iterable[float]) -> float:
    """Two-sided Welch t-test p-value for mean(a) == mean(b), over per-seed values.

    ``nan`` when either side has fewer than two finite values (no spread, no test) or when both
    sides are constant and equal.  Two constant but different sides give 0.0: scipy would divide
    by a zero standard error, yet the samples are as different as samples can be.
    """
    a, b = _finite(a), _finite(b)
    if len(a) < 2 or len(b) < 2:
        return math.nan
    if np.ptp(a) == 0 and np.ptp(b) == 0:
        return math.nan if a[0] == b[0] else 0.0
    # Welch's t and Welch-Satterthwaite degrees of freedom, as scipy.stats.ttest_ind(equal_var=False);
    # scipy.special alone imports in a third of the time of scipy.stats, which tables feel.
    from scipy.special import stdtr

    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return float(min(1.0, 2.0 * stdtr(df, -abs(t))))


def paired_bootstrap_pvalue(correct_a, correct_b, n_resamples: int = 10_000, seed: int = 0) -> float:
    """Two-sided p-value for "accuracy of a == accuracy of b" by resampling test images.

    ``correct_a`` / ``correct_b``: boolean arrays ``(n_images,)`` or ``(n_pairs, n_images)``, one row
    per seed pair, the same images in the same order.  Every resample draws the same image indices
    for every row, so the statistic is the per-image difference averaged over rows, resampled.
    The null distribution is the bootstrap distribution shifted to zero mean (Efron & Tibshirani's
    shift method); the p-value counts resampled differences at least as far from the observed one
    as the observed one is from zero, with the usual +1 so it is never exactly 0.

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
    if observed == 0:
        return 1.0
    values, counts = np.unique(per_image, return_counts=True)
    n_images = per_image.size
    draws = np.random.default_rng(seed).multinomial(n_images, counts / n_images, size=n_resamples)
    resampled = draws @ values / n_images
    extreme = np.abs(resampled - observed) >= abs(observed) - 1e-12
    return float((extreme.sum() + 1) / (n_resamples + 1))


def not_different_from_best(values_by_row: dict[str, list[float]], higher_is_better: bool = True,
                            alpha: float = ALPHA) -> dict[str, bool]:
    """Which rows are statistically tied with the best one (Welch over seeds).

    The best row is the one with the best mean among rows with at least two finite values; it is
    True, as is every row whose Welch p-value against it is >= ``alpha`` (or undefined because both
    are identical constants).  Rows with fewer than two values are left out: we make no claim.
    """
    eligible = {row: _finite(values) for row, values in values_by_row.items()}
    eligible = {row: values for row, values in eligible.items() if len(values) >= 2}
    if not eligible:
        return {}
    sign = 1.0 if higher_is_better else -1.0
    best = max(eligible, key=lambda row: sign * eligible[row].mean())
    verdict = {}
    for row, values in eligible.items():
        p = welch_pvalue(values, eligible[best])
        verdict[row] = row == best or math.isnan(p) or p >= alpha
    return verdict


def bootstrap_not_different_from_best(correct_by_row: dict[str, dict[int, np.ndarray]], alpha: float = ALPHA,
                                      n_resamples: int = 10_000, seed: int = 0) -> dict[str, bool]:
    """``not_different_from_best`` with the paired bootstrap: ``correct_by_row[row][seed]`` is a
    boolean array per test image (``ltbench.predictions.correct``), rows on the same test set.

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
        verdict[row] = p >= alpha
    return verdict
