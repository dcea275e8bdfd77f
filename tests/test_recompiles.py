"""A compiled loss is compiled once or twice per run, not once per epoch.

Under train.compile the engine compiles each method's ``loss`` (ltbench/train/engine.py, ``compile_for_training``).
Epoch state that the loss compares as a Python value makes Dynamo guard on it: one recompile per epoch, and after
torch's recompile limit (8) the loss silently runs eagerly for the rest of the run. Here every built-in method's
loss is compiled as the engine compiles it (backend ``aot_eager``: Dynamo and AOTAutograd, no code generation)
over 10 epochs, with ``on_epoch_start`` called eagerly before each as the engine does, and the graphs are counted.
Two are allowed: an epoch switch a method states as a bool (DRW: before and after its switch epoch), or a
module-level cache filled on the first call (BAPE's series tables).
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd  # noqa: F401 - makes sure aot_eager is registered
from torch._dynamo.backends.registry import lookup_backend

import methods  # noqa: F401 - registers the built-in methods
from ltbench.recipe import resolve_run_config
from ltbench.registry import METHODS
from ltbench.train import engine

EPOCHS = 10
BUILT_IN = sorted(e.name for e in METHODS.entries() if e.obj.__module__.startswith("methods.") and e.name != "zero_shot")
# DRW switches within the 10 epochs (at round(0.8 * 10) = 8) wherever a method has it.
OPTIONS = {"lift": {"init": "random"}, "vs": {"drw": True}, "ldam": {"drw": True},
           "bape": {"aux_views": ["default"], "bape_views": ["default", "default"]},
           "bcl": {"views": ["default", "default", "default"]}, "proco": {"views": ["default", "default"]}}


def graphs_per_epoch(name: str) -> tuple[list[int], dict]:
    raw = {"data": {"name": "synthetic_lt", "num_classes": 4, "max_per_class": 6, "imb_factor": 1,
                    "test_per_class": 1, "image_size": 12},
           "backbone": {"name": "resnet8"}, "method": {"name": name, **OPTIONS.get(name, {})},
           "train": {"progress": False, "threads": 1},
           "optim": {"lr": 0.05, "batch_size": 8, "epochs": EPOCHS, "warmup_epochs": 0}}
    torch.manual_seed(0)
    run = engine.build_run(resolve_run_config(raw, seed=0, where="test"))
    aot_eager, graphs = lookup_backend("aot_eager"), []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    torch._dynamo.reset()
    loss = torch.compile(run.method.loss, backend=counting)
    per_epoch, out, views = [], {}, len(run.method.views())
    for epoch in range(EPOCHS):
        run.method.on_epoch_start(epoch)
        before = len(graphs)
        features = [torch.randn(8, run.backbone.feature_dim, requires_grad=True) for _ in range(views)]
        out = loss(features, torch.arange(8) % 4, epoch=epoch)
        out["loss"].backward()
        per_epoch.append(len(graphs) - before)
    torch._dynamo.reset()
    return per_epoch, out


def test_every_built_in_method_is_covered():
    assert len(BUILT_IN) >= 15 and {"bape", "proco", "ldam_drw", "ce_drw", "vs"} <= set(BUILT_IN)


@pytest.mark.parametrize("name", BUILT_IN)
def test_a_compiled_loss_is_not_recompiled_every_epoch(name):
    per_epoch, _ = graphs_per_epoch(name)
    assert sum(per_epoch) <= 2, f"{name}: graphs compiled per epoch {per_epoch} (at most 2 in all)"


def test_the_drw_switch_still_takes_effect_in_the_compiled_loss():
    """The epoch state left the compiled region, not the loss: after the switch epoch the weights are on."""
    _, out = graphs_per_epoch("ce_drw")
    assert float(out["drw_active"]) == 1.0
