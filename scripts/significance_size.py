"""Type-I error of the tests a table offers, by seeds per row: how often each calls two rows "different"
at nominal alpha = 0.05 when both are the same training procedure (docs/significance.md prints the table).

The null model, in the shape of Fashion-MNIST-LT (docs/reference-results/fmnist_baselines):
* a test set of 10,000 images (Fashion-MNIST's), each with its own difficulty q ~ Beta(3, 1) (mean accuracy
  75 %), drawn once per simulated comparison and shared by every model of both rows;
* each seed's model has an ability shift u ~ Normal(0, SPREAD points), the same distribution for both rows
  (the null: one procedure), and is right on image j when U_ij < q_j + u (U uniform, independent per model
  and image). A seed's accuracy on the test set then spreads by ~sqrt(SPREAD^2 + 0.39^2) points.
SPREAD = 1.5 points: the seed-to-seed standard deviation of All over fmnist_baselines' seven rows ranges
0.7-3.5, median 0.9, root mean square 1.7.

Also: how far the minimum detectable difference, a plug-in of the observed spread, strays from the true
one (the same formula with the true standard deviation), by seeds per row.

Usage: python scripts/significance_size.py [--reps N] [--bootstrap-reps N]   (287 s on a loaded 2-core machine)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ltbench.report import significance as sig  # noqa: E402

SPREAD = 1.5  # points
N_IMAGES = 10_000
SEEDS = (2, 3, 5)
RESAMPLES = 2_000  # per bootstrap test in the simulation (the tables use 10,000; size is unaffected)


def simulate(rng, n: int) -> tuple[dict, dict]:
    """Two rows of n seeds each, one procedure: {seed: correctness per test image}."""
    q = rng.beta(3.0, 1.0, N_IMAGES)

    def row():
        return {s: rng.random(N_IMAGES) < q + rng.normal(0.0, SPREAD / 100) for s in range(n)}
    return row(), row()


def sizes(reps: int, boot_reps: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for n in SEEDS:
        rejected = {"default": [], "bootstrap": [], "image_bootstrap": []}
        mdd_ratio = []
        for r in range(reps):
            a, b = simulate(rng, n)
            va, vb = [100 * c.mean() for c in a.values()], [100 * c.mean() for c in b.values()]
            p, _ = sig.default_row_test(va, vb)
            rejected["default"].append(p is not None and p < sig.ALPHA)
            mdd = sig.minimum_detectable_difference(va, vb)
            true_sd = math.sqrt(SPREAD ** 2 + 0.39 ** 2)
            mdd_ratio.append(mdd / (true_sd * math.sqrt(2 / n) * 2.80))  # 2.80 = z_0.975 + z_0.8
            if r < boot_reps:
                p, _ = sig.two_level_bootstrap_test(a, b, n_resamples=RESAMPLES, seed=r)
                rejected["bootstrap"].append(p is not None and p < sig.ALPHA)
                p, _ = sig.paired_bootstrap_test(np.stack(list(a.values())), np.stack(list(b.values())),
                                                 n_resamples=RESAMPLES, seed=r)
                rejected["image_bootstrap"].append(p is not None and p < sig.ALPHA)
        out[n] = {k: (float(np.mean(v)), len(v)) for k, v in rejected.items()}
        out[n]["mdd"] = tuple(float(x) for x in np.percentile(mdd_ratio, [5, 50, 95]))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=4000, help="simulated comparisons per seed count (Welch)")
    parser.add_argument("--bootstrap-reps", type=int, default=1000, help="of which also bootstrapped")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = sizes(args.reps, args.bootstrap_reps)
    names = {"default": "default_row_test (Welch over seeds)", "bootstrap": "two-level bootstrap",
             "image_bootstrap": "image-only bootstrap"}
    print(f"Type-I error at nominal alpha = {sig.ALPHA}, seed spread {SPREAD} points, {N_IMAGES:,} test images\n")
    print("| test | " + " | ".join(f"{n} seeds" for n in SEEDS) + " | simulated comparisons |")
    print("|---|" + "---:|" * len(SEEDS) + "---:|")
    for key, name in names.items():
        cells = [f"{100 * result[n][key][0]:.1f} %" for n in SEEDS]
        print(f"| {name} | " + " | ".join(cells) + f" | {result[SEEDS[0]][key][1]:,} per column |")
    print("\nminimum detectable difference / its true value (5th, 50th, 95th percentile): " + "; ".join(
        f"{n} seeds {lo:.2f}, {mid:.2f}, {hi:.2f}" for n, (lo, mid, hi) in ((n, result[n]['mdd']) for n in SEEDS)))
    print(f"\n{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
