"""Wall time of a stage-2 grid over one finished run whose features are cached (docs/posthoc.md).

The target (issue 12): at least 50 stage-2 settings over one finished Fashion-MNIST-LT run in under one
minute on 2 cores, once its features are cached. What is timed is everything `ltbench posthoc` does per
setting after extraction: loading the frozen run (features + trained method from checkpoint.pt, once), and
for each setting fit, evaluation (test set, every target prior, every shifted test set) and writing
result.json + predictions.npz. Results go to a temporary folder, so the run's own posthoc/ is untouched.

    .venv/bin/python benchmarks/posthoc_grid.py RUN_DIR [--threads 1] [--settings bape|mixed]

RUN_DIR: a finished run with a complete feature cache (``ltbench posthoc`` makes one), e.g.
results/fmnist_posthoc/<run id>. 'bape': the 56 bape_refit settings alpha_hat in {5..160} x beta_ratio
x {sra, newton} with shared_kappa plus the 8 ML ones; 'mixed' adds tau sweeps, cRT and LWS.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from ltbench.stage2 import features
from ltbench.posthoc import expand_posthoc
from ltbench.results.identity import posthoc_id
from ltbench.stage2.posthoc_runs import fit_and_record, load_frozen

BAPE_GRID = [
    {"name": "bape_refit", "alpha_hat": 0.0, "da_mode": ["none", "shared_kappa", "map_test_prior", "debiased"],
     "kappa_solver": ["sra", "newton"]},
    {"name": "bape_refit", "alpha_hat": [5.0, 10.0, 20.0, 40.0, 80.0, 160.0], "beta_ratio": [0.05, 0.1, 0.2, 0.4],
     "kappa_solver": ["sra", "newton"]},
]
MIXED_EXTRA = [{"name": "la_posthoc", "tau": [0.0, 0.5, 1.0, 1.5, 2.0]}, {"name": "tau_norm", "tau": [0.0, 0.5, 1.0, 1.5, 2.0]},
               {"name": "crt"}, {"name": "lws"}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: stage-2 tensors are small, more threads mostly add overhead)")
    parser.add_argument("--settings", choices=["bape", "mixed"], default="mixed")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    run_dir = Path(args.run_dir)
    specs = expand_posthoc(BAPE_GRID + (MIXED_EXTRA if args.settings == "mixed" else []))
    if not features.is_complete(run_dir):
        raise SystemExit(f"{run_dir}: no complete feature cache; run 'ltbench posthoc' on its recipe first")
    t0 = time.perf_counter()
    frozen, result, meta = load_frozen(run_dir), features.finished_result(run_dir), features.read_meta(run_dir)
    loaded = time.perf_counter()
    per_kind: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in specs:
            s0 = time.perf_counter()
            status = fit_and_record(frozen, result, spec, meta, Path(tmp) / posthoc_id(spec), {})
            assert status == "done", spec
            per_kind.setdefault(spec["name"], []).append(time.perf_counter() - s0)
    total = time.perf_counter() - t0
    print(f"run {result['run_id']} ({result['config']['method']['name']}), torch threads {torch.get_num_threads()}")
    print(f"load frozen run (features + method): {loaded - t0:.2f} s")
    for name, times in per_kind.items():
        print(f"  {name:<11} {len(times):>3} setting(s)  {sum(times):6.2f} s  ({1000 * sum(times) / len(times):.0f} ms each)")
    print(f"{len(specs)} stage-2 settings in {total:.1f} s (target: >= 50 settings < 60 s)")


if __name__ == "__main__":
    main()
