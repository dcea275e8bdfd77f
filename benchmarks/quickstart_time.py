"""Wall time of the quickstart (what ``make quickstart`` runs once the environment is installed), and
how far it is from the compute limit of this machine.

1. Runs ``python -m ltbench run recipes/quickstart.yaml --results <fresh temporary folder>`` and
   times it from start to exit (process start-up, data loading, 4 runs of 30 epochs, evaluation,
   the table), with the recipe's own launcher settings.
2. The compute limit: ResNet-8 forward + backward + SGD on ready-made 1x28x28 float batches of 64
   (no augmentation, no data loading) and a forward pass over the 10,000 test images, timed in this
   process with all cores as torch threads, and with one thread (times the cores: the limit of one
   one-thread process per core, the quickstart's layout); the better of the two is the training
   rate. limit = (runs x epochs x training images) / training rate + runs x test images / evaluation
   rate.

Measure on an idle machine; anything else running shows up in both numbers.

    .venv/bin/python benchmarks/quickstart_time.py [--skip-run] [--seconds 8] [launcher.jobs=1 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def time_quickstart(overrides: list[str]) -> tuple[float, list[dict]]:
    with tempfile.TemporaryDirectory(prefix="ltbench-quickstart-") as tmp:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "ltbench", "run", "recipes/quickstart.yaml", *overrides,
                               "--results", tmp],
                              cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"the quickstart failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        results = [json.loads(p.read_text()) for p in Path(tmp).rglob("result.json")]
    return wall, results


def compute_limit(seconds: float) -> tuple[float, float, int, int]:
    """(training images/s, evaluation images/s, training images of the whole recipe, test images) on
    pre-made tensors."""
    import torch
    import torch.nn.functional as F

    from ltbench.train import engine
    from ltbench.recipe import load_recipe

    from ltbench.results.provenance import usable_cores

    torch.set_num_threads(usable_cores())  # the cores this process may use (affinity), not the machine's
    runs = load_recipe(ROOT / "recipes/quickstart.yaml").runs
    run = engine.build_run(runs[0].config)
    per_epoch = sum(len(b) for b in engine.epoch_batches(len(run.data.train), 64, 0, 0))
    n_train = sum(per_epoch * spec.config["optim"]["epochs"] for spec in runs)
    n_test = len(runs) * len(run.data.test)
    model = torch.nn.Sequential(run.backbone, torch.nn.Linear(run.backbone.feature_dim, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))

    def train_rate() -> float:
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            done += 64
        return done / (time.perf_counter() - t0)

    train_rate()  # warm-up
    train = train_rate()
    cores = usable_cores()
    if cores > 1:  # the parallel layout's limit: every core running its own one-thread process
        torch.set_num_threads(1)
        train_rate()
        per_core = train_rate()
        print(f"training rate: {train:.0f} img/s with {cores} threads; {per_core:.0f} img/s with 1 thread "
              f"(x {cores} cores = {cores * per_core:.0f})")
        train = max(train, cores * per_core)
        torch.set_num_threads(cores)
    model.eval()
    test = torch.randn(512, 1, 28, 28)

    @torch.no_grad()
    def eval_rate() -> float:
        model(test)
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds / 2:
            model(test)
            done += 512
        return done / (time.perf_counter() - t0)

    evaluation = eval_rate()
    if cores > 1:
        torch.set_num_threads(1)
        evaluation = max(evaluation, cores * eval_rate())
    return train, evaluation, n_train, n_test


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--skip-run", action="store_true", help="only measure the compute limit")
    ap.add_argument("--seconds", type=float, default=8.0, help="timed seconds for the compute-limit rate")
    ap.add_argument("overrides", nargs="*", help="dotted overrides for the run, e.g. launcher.jobs=1")
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPUs; load average before: {os.getloadavg()[0]:.2f}")
    if not args.skip_run:
        wall, results = time_quickstart(args.overrides)
        done = sum(r.get("status") == "done" for r in results)
        print(f"quickstart: {wall:.1f} s wall ({int(wall // 60)} min {wall % 60:04.1f} s), {done}/{len(results)} runs "
              f"done; per run: " + ", ".join(f"{r['config']['method']['name']} {r['wall_seconds']:.0f} s "
                                              f"({r['threads']} threads)" for r in sorted(results, key=lambda r: r["config"]["method"]["name"])))
    train, evaluation, n_train, n_test = compute_limit(args.seconds)
    limit = n_train / train + n_test / evaluation
    print(f"compute limit: {n_train:,} training images at {train:.0f} img/s + {n_test:,} test images at "
          f"{evaluation:.0f} img/s = {limit:.0f} s")
    if not args.skip_run:
        print(f"quickstart / compute limit: {wall / limit:.2f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
