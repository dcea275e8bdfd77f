"""No host-device sync in a training step: every built-in method, with train.augment_on: batch, counted on the
emulated CUDA device (benchmarks/devtools/gpu_cost.py) through ``engine.epoch_step``, the very function
``engine.train_epoch`` runs per step (benchmarks/devtools/step_cost.py).

A sync makes the host wait for the GPU to drain, so the next kernels cannot be queued ahead
(docs/performance.md). The counted step is the second of an epoch (the first also checks the method
contract); it trains on its batch, adds to the meters and issues the next batch's copies and views.
Tiny sizes (ResNet-8, 12x12 images, batch 8) and each method's cheapest views: these tests count, they do not
time. The views' own syncs (ltbench/data/batch_augment.py) are the batched pipelines' business; the last test
counts the whole step with them.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest

import methods  # noqa: F401 - registers the built-in methods
from ltbench.recipe import resolve_run_config
from ltbench.registry import METHODS
from benchmarks.devtools.step_cost import counted_epoch_step

# zero_shot trains nothing (optim.epochs 0): it has no training step to count.
BUILT_IN = sorted(e.name for e in METHODS.entries() if e.obj.__module__.startswith("methods.") and e.name != "zero_shot")
STEP_PHASES = ("copies", "step", "optimizer", "other")  # all but 'augment'
# The cheapest views a method accepts (its defaults otherwise): the step, not the augmentation, is counted here.
PLAIN_VIEWS = {"bape": {"aux_views": ["default"], "bape_views": ["default", "default"]},
               "bcl": {"views": ["default", "default", "default"]},
               "proco": {"views": ["default", "default"]},
               "lift": {"init": "random"}}  # the text init needs a CLIP text tower; the step is the same


def tiny_config(name: str) -> dict:
    raw = {"data": {"name": "synthetic_lt", "num_classes": 4, "max_per_class": 12, "imb_factor": 1,
                    "test_per_class": 1, "image_size": 12},
           "backbone": {"name": "resnet8"}, "method": {"name": name, **PLAIN_VIEWS.get(name, {})},
           "train": {"augment_on": "batch", "progress": False, "threads": 1},
           "optim": {"lr": 0.05, "batch_size": 8, "epochs": 2, "warmup_epochs": 0}}
    return resolve_run_config(raw, seed=0, where="test")


def count_second_step(name: str):
    """The counter of step 1 of a tiny run of method ``name``."""
    with tempfile.TemporaryDirectory(prefix="ltbench-syncs-") as tmp:
        with counted_epoch_step(tiny_config(name), Path(tmp)) as (c, _s, _loop, _):
            return c


counted = functools.lru_cache(maxsize=None)(count_second_step)


def step_syncs(c) -> list[tuple]:
    """(kind, op, file:line, count) of every sync outside the augmentation, and every host/device mix-up."""
    return [site for phase in STEP_PHASES for site in c.sync_sites(phase)] + \
        [("host tensor mixed with device tensors", op, site, n) for (op, site), n in c.mixups.items()]


def test_every_built_in_method_is_counted():
    assert len(BUILT_IN) >= 15 and {"ce", "la", "bape", "proco", "sade", "bcl"} <= set(BUILT_IN)


@pytest.mark.parametrize("name", BUILT_IN)
def test_a_training_step_makes_no_host_device_sync(name):
    c = counted(name)
    assert step_syncs(c) == [], f"{name}: a step of train_epoch waits for the device at {step_syncs(c)}"
    assert c.launch_count("step") > 0 and c.launch_count("copies") > 0  # it did count the step


def test_a_synthetic_item_in_the_loss_is_caught(monkeypatch):
    """What the test above relies on: a method that reads its loss on the host each step is caught, with the
    line that reads it."""
    ce = METHODS.get("ce")
    loss = ce.loss

    def reading_loss(self, features, labels, *, epoch):
        out = loss(self, features, labels, epoch=epoch)
        self.last_loss = out["loss"].item()  # the synthetic sync
        return out

    monkeypatch.setattr(ce, "loss", reading_loss)
    syncs = step_syncs(count_second_step("ce"))
    assert [(kind, op, n) for kind, op, _, n in syncs] == [("value read by the host", "_local_scalar_dense", 1)]
    assert syncs[0][2].startswith("tests/test_step_syncs.py:")


@pytest.mark.parametrize("name", BUILT_IN)
def test_the_whole_step_with_its_augmentation_makes_no_sync(name):
    c = counted(name)
    assert c.sync_count() == 0, c.sync_sites()
