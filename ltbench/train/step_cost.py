"""What one training step of a real run would cost a GPU: ``engine.epoch_step`` counted on the emulated device.

Why here and not in the benchmark: benchmarks/gpu_launches.py reports these counts and tests/test_step_syncs.py
asserts on them (no host-device sync in any built-in method's step); both must count exactly what
``engine.train_epoch`` runs, through the same function, so neither keeps a copy of the loop.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from ltbench.results.runspec import RunSpec
from ltbench.train import engine, gpu_cost
from ltbench.train.checkpoint import CheckpointSaver


def emulated_session(config: dict, run_dir: Path) -> engine.Session:
    """A training session of ``config`` (a resolved run configuration) whose model and optimizer state live on
    the emulated device. Call it inside ``gpu_cost.counting()``: moving a module there outside it would make
    real, empty meta tensors. SGD is told ``foreach=True``, as it picks for CUDA tensors (a wrapper tensor
    would get the per-parameter loop); fp32, so no GradScaler."""
    torch.manual_seed(0)
    run = engine.build_run(config)
    run.model.to(gpu_cost.DEVICE)
    optimizer = engine.make_optimizer(run)
    for group in optimizer.param_groups:
        group["foreach"] = True
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    spec = RunSpec.coerce({"config": config, "run_id": "step-cost", "recipe": "bench", "run_dir": str(run_dir)})
    s = engine.Session(spec, run, gpu_cost.DEVICE, optimizer, scaler, 0, 1, 1, lambda *_: None)
    s.iters_per_epoch = len(engine.sampled_batches(run, 0, 0))
    s.base_lrs = [g["lr"] for g in optimizer.param_groups]
    run.loader = engine.make_loader(run, 0, 0, torch.device("cpu"))
    return s


@contextlib.contextmanager
def optimizer_phase(s: engine.Session, c: gpu_cost.Counter):
    """Attribute the optimizer's update to the phase ``optimizer`` (wraps this session's optimizer.step)."""
    step = s.optimizer.step

    def counted_step(*args, **kwargs):
        with c.phase("optimizer"):
            return step(*args, **kwargs)

    s.optimizer.step = counted_step
    try:
        yield
    finally:
        s.optimizer.step = step


@contextlib.contextmanager
def counted_epoch_step(config: dict, run_dir: Path, step: int = 1, loops: bool = False):
    """``with counted_epoch_step(config, dir) as (c, s, loop, loop_counter):`` counts ``engine.epoch_step`` at
    ``step`` of the first epoch (the steps before it run uncounted; step 0 also checks the method contract, so
    1 is the steady state). The epoch needs ``step`` + 2 batches: the counted step also issues the next
    batch's copies and augmentation. Inside the block the emulated device still works (count more there).

    Phases: ``copies`` and ``augment`` (the next batch's), ``step`` (training, meters), ``optimizer`` (inside
    ``step``), ``other`` (bookkeeping). ``loops``: also count Python loop iterations (slow)."""
    with gpu_cost.counting() as c:
        s = emulated_session(config, run_dir)
        s.phase = c.phase
        loop = engine.begin_epoch(s, 0, 0, CheckpointSaver(run_dir, "step-cost", minutes=0, main=True, world=1))
        for earlier in range(step):
            engine.epoch_step(s, loop, earlier)
        c.launches.clear(), c.syncs.clear(), c.mixups.clear()
        with contextlib.ExitStack() as stack:
            loop_counter = stack.enter_context(gpu_cost.LoopCounter()) if loops else None
            stack.enter_context(optimizer_phase(s, c))
            engine.epoch_step(s, loop, step)
        yield c, s, loop, loop_counter
