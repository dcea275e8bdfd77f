"""What one training step of a real run would cost a GPU: ``engine.epoch_step`` counted on the emulated device.

Why here and not in the benchmark: benchmarks/gpu_launches.py reports these counts and tests/test_step_syncs.py
asserts on them (no host-device sync in any built-in method's step); both must count exactly what
``engine.train_epoch`` runs, through the same function, so neither keeps a copy of the loop. The loop knows
nothing of this: the phases are attributed by wrapping its functions from outside (``phases``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from ltbench.results.runspec import RunSpec
from benchmarks.devtools import gpu_cost
from ltbench.train import engine
from ltbench.train.checkpoint import CheckpointSaver


def emulated_session(config: dict, run_dir: Path) -> engine.Session:
    """A training session of ``config`` (a resolved run configuration) whose model and optimizer state live on
    the emulated device. Call it inside ``gpu_cost.counting()``: moving a module there outside it would make
    real, empty meta tensors. SGD is told ``foreach=True``, as it picks for CUDA tensors (a wrapper tensor
    would get the per-parameter loop) and ``fused=True``, as ``engine.make_optimizer`` does on CUDA
    (``fused_sgd_allowed``); a GradScaler when train.precision is fp16 (autocast's casts are not counted:
    ``gpu_cost.counting``)."""
    torch.manual_seed(0)
    run = engine.build_run(config)
    run.model.to(gpu_cost.DEVICE)
    optimizer = engine.make_optimizer(run)
    for group in optimizer.param_groups:
        group["fused"], group["foreach"] = True, False
    optimizer._step_supports_amp_scaling = True  # what SGD(fused=True) sets: GradScaler hands it found_inf
    scaler = torch.amp.GradScaler(gpu_cost.DEVICE.type, enabled=run.train.precision == "fp16")
    spec = RunSpec.coerce({"config": config, "run_id": "step-cost", "recipe": "bench", "run_dir": str(run_dir)})
    s = engine.Session(spec, run, gpu_cost.DEVICE, optimizer, scaler, 0, 1, 1, lambda *_: None)
    s.iters_per_epoch = len(engine.sampled_batches(run, 0, 0))
    s.base_lrs = [g["lr"] for g in optimizer.param_groups]
    run.loader = engine.make_loader(run, 0, 0, torch.device("cpu"))
    if run.resident is not None:  # the training array on the emulated device, as on CUDA
        run.resident = tuple(gpu_cost.to_device(t) for t in run.resident)
    return s


def in_phase(c: gpu_cost.Counter, name: str, fn):
    """``fn`` with what it runs attributed to the phase ``name``."""
    def counted(*args, **kwargs):
        with c.phase(name):
            return fn(*args, **kwargs)

    return counted


@contextlib.contextmanager
def phases(c: gpu_cost.Counter, s: engine.Session, loop: engine.EpochLoop):
    """Attribute what a step runs to its phases by wrapping, from outside and for the block only, the functions
    ``engine.epoch_step`` calls: the next batch's ``copies`` (taking it and copying it) and ``augment`` (the
    feeder's), ``step``
    (``engine.train_step`` and the meter) and, inside it, ``optimizer`` (``optimizer.step``). The loop itself
    carries no instrument; what is left is ``other`` (bookkeeping)."""
    wrapped = [(loop.feeder, "copy", "copies"), (loop.feeder, "build_views", "augment"), (loop.meter, "add", "step"),
               (engine, "train_step", "step"), (s.optimizer, "step", "optimizer")]
    saved = [(owner, attr, vars(owner).get(attr, MISSING)) for owner, attr, _ in wrapped]
    for owner, attr, name in wrapped:
        if getattr(owner, attr) is not None:  # a feeder without build_views has no augment phase
            setattr(owner, attr, in_phase(c, name, getattr(owner, attr)))
    batches = loop.feeder.batches  # taking the next batch: a resident training set's gather (feed.resident_batches)
    loop.feeder.batches = iterate_in_phase(c, "copies", batches)
    try:
        yield
    finally:
        loop.feeder.batches = batches
        for owner, attr, before in saved:
            if before is MISSING:
                delattr(owner, attr)  # a method of the class, wrapped on the instance: the class's again
            else:
                setattr(owner, attr, before)


MISSING = object()


def iterate_in_phase(c: gpu_cost.Counter, name: str, items):
    """``items`` with what each ``next`` runs attributed to the phase ``name``."""
    while True:
        with c.phase(name):
            item = next(items, MISSING)
        if item is MISSING:
            return
        yield item


@contextlib.contextmanager
def fused_sgd_allowed():
    """SGD(fused=True) on the emulated device: torch checks the parameters' device type before the step, and the
    emulated one is ``meta``; the fused kernel itself then runs on the held CPU tensors (one launch)."""
    import torch.optim.sgd as sgd

    check = sgd._device_dtype_check_for_fused
    sgd._device_dtype_check_for_fused = lambda *args, **kwargs: None
    try:
        yield
    finally:
        sgd._device_dtype_check_for_fused = check


@contextlib.contextmanager
def counted_epoch_step(config: dict, run_dir: Path, step: int = 1, loops: bool = False):
    """``with counted_epoch_step(config, dir) as (c, s, loop, loop_counter):`` counts ``engine.epoch_step`` at
    ``step`` of the first epoch (the steps before it run uncounted; step 0 also checks the method contract, so
    1 is the steady state). The epoch needs ``step`` + 2 batches: the counted step also issues the next
    batch's copies and augmentation. Inside the block the emulated device still works (count more there).

    Phases (``phases``): ``copies`` and ``augment`` (the next batch's), ``step`` (training, meters), ``optimizer``
    (inside ``step``), ``other`` (bookkeeping). ``loops``: also count Python loop iterations (slow)."""
    with gpu_cost.counting() as c, fused_sgd_allowed():
        s = emulated_session(config, run_dir)
        loop = engine.begin_epoch(s, 0, 0, CheckpointSaver(run_dir, "step-cost", minutes=0, main=True, world=1))
        for earlier in range(step):
            engine.epoch_step(s, loop, earlier)
        c.clear()
        with contextlib.ExitStack() as stack:
            stack.enter_context(phases(c, s, loop))  # first: its own loops are not the step's
            loop_counter = stack.enter_context(gpu_cost.LoopCounter()) if loops else None
            engine.epoch_step(s, loop, step)
        yield c, s, loop, loop_counter
