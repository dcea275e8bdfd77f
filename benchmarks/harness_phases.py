"""Where a ResNet-8 epoch's time goes, in ltbench and in the bare loop: building batches against steps.

``harness_overhead.py`` gives the ratio; this splits it. Each epoch is cut into the time spent getting
the next batch (keys, seeding, augmentation, collate) and the time of the optimisation step, for
``engine.train_step`` on the run's own loader and for the bare loop of ``harness_overhead.BareLoop``,
alternating epoch by epoch in one process. With one thread it reports CPU time (``process_time``), which
other processes on the machine barely change; with more threads, wall time.

    .venv/bin/python benchmarks/harness_phases.py [--threads 1] [--epochs 6]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness_overhead as H  # noqa: E402

from ltbench.train import engine  # noqa: E402
from ltbench.results.runspec import RunSpec  # noqa: E402


def timed_batches(batches, clock, totals: collections.Counter, key: str):
    """Yield from ``batches``, adding the time each ``next`` takes to ``totals[key]``."""
    it = iter(batches)
    while True:
        t0 = clock()
        try:
            batch = next(it)
        except StopIteration:
            return
        totals[key] += clock() - t0
        yield batch


def ltbench_epoch(s, epoch: int, clock, totals: collections.Counter) -> None:
    run = s.run
    run.model.train()
    t0 = clock()
    batches = engine.epoch_batches(len(run.data.train), run.optim.batch_size, s.seed, epoch)
    keys = run.loader.samples.train_keys(batches, 0, epoch)
    totals["ltbench: plan keys"] += clock() - t0
    for views, labels in timed_batches(run.loader.run(keys), clock, totals, "ltbench: build batches"):
        t0 = clock()
        out = engine.train_step(s, views, labels, epoch, 0)
        meter = engine.EpochMeter()
        meter.add(out, out["loss"], labels)
        totals["ltbench: steps (+ meter)"] += clock() - t0


def bare_epoch(bare: H.BareLoop, clock, totals: collections.Counter) -> None:
    bare.model.train()
    source = bare.batches(bare.data.train, bare.train_tf, bare.batch, True, None)
    for x, y in timed_batches(source, clock, totals, "bare:    build batches"):
        t0 = clock()
        loss = F.cross_entropy(bare.model(x), y)
        bare.opt.zero_grad(set_to_none=True)
        loss.backward()
        bare.opt.step()
        loss.item()
        totals["bare:    steps"] += clock() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=6, help="epochs of each; the first is a warm-up")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    config = H.run_config("resnet8_fmnist", args.epochs, args.threads, 0)
    bare = H.BareLoop(config, 0)
    with tempfile.TemporaryDirectory(prefix="ltbench-phases-") as tmp:
        spec = dataclasses.replace(RunSpec.coerce({"config": config, "run_id": "phases", "recipe": "bench"}),
                                   run_dir=tmp)
        s = engine.start_session(spec, lambda msg: None)
        s.run.loader = engine.make_loader(s.run, s.seed, 0, s.device)
        totals: collections.Counter = collections.Counter()
        for epoch in range(args.epochs):
            ltbench_epoch(s, epoch, clock, totals)
            bare_epoch(bare, clock, totals)
            if epoch == 0:
                totals.clear()  # warm-up
    what = "CPU" if clock is time.process_time else "wall"
    print(f"ResNet-8, Fashion-MNIST-LT, batch 64, {args.threads} thread(s): {what} ms per epoch "
          f"(mean of {args.epochs - 1})")
    for key in sorted(totals):
        print(f"  {key:28s} {1000 * totals[key] / (args.epochs - 1):8.1f}")


if __name__ == "__main__":
    main()
