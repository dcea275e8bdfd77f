"""A compiled loss is compiled once or twice per run, not once per epoch; a process compiles as many runs as a grid
has, each within its own recompile budget.

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


def tiny_run(name: str, options: dict | None = None, train: dict | None = None):
    raw = {"data": {"name": "synthetic_lt", "num_classes": 4, "max_per_class": 6, "imb_factor": 1,
                    "test_per_class": 1, "image_size": 12},
           "backbone": {"name": "resnet8"}, "method": {"name": name, **(OPTIONS.get(name, {}) if options is None else options)},
           "train": {"progress": False, "threads": 1, **(train or {})},
           "optim": {"lr": 0.05, "batch_size": 8, "epochs": EPOCHS, "warmup_epochs": 0}}
    torch.manual_seed(0)
    return engine.build_run(resolve_run_config(raw, seed=0, where="test"))


def graphs_per_epoch(name: str) -> tuple[list[int], dict]:
    run = tiny_run(name)
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


def test_a_grid_compiles_every_built_in_methods_views_in_one_process():
    """Every built-in method's batched views (its own defaults: BAPE's and ProCo's strong and SimAug views
    included), compiled as a run under train.compile compiles them (``fullgraph=True``, static shapes), all in one
    process as a grid with ``launcher.jobs: 1`` would. All pipelines share the code of ``BatchPipeline.__call__``;
    before each got its own recompile budget, the ninth graph raised ``FailOnRecompileLimitHit``. Dynamo's eager
    backend: the limit is Dynamo's, code generation adds nothing to the check."""
    from ltbench.data import batch_augment

    torch._dynamo.reset()
    images = torch.randint(0, 256, (4, 3, 12, 12), dtype=torch.uint8)
    seeds, compiled = torch.arange(4), 0
    for name in BUILT_IN:
        run = tiny_run(name, options={"init": "random"} if name == "lift" else {})
        pipelines = [batch_augment.build_batch(v, run.data.image, run.data.pipelines) for v in run.method.views()]
        for v, (eager, view) in enumerate(zip(pipelines, engine.compiled_views(pipelines, "eager"))):
            view(images, seeds, v)  # the first call runs eagerly (device constants)
            assert torch.equal(view(images, seeds, v), eager(images, seeds, v)), (name, v)
            compiled += 1
    assert compiled > 2 * torch._dynamo.config.recompile_limit, compiled
    torch._dynamo.reset()


def test_more_runs_than_the_recompile_limit_each_compile_their_backbone_and_loss(monkeypatch):
    """compile_for_training in run after run of one process (one backbone class, one method), each with another
    batch size under static shapes, as reduce-overhead compiles (a grid over batch sizes or datasets): every run's
    backbone and loss are compiled graphs. Before each run had its own budget, the runs after torch's recompile
    limit ran eagerly, with only a warning. Dynamo's limit is lowered to 2 to keep this short; the views' test
    above keeps torch's own."""
    aot_eager, graphs = lookup_backend("aot_eager"), []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    monkeypatch.setattr(engine, "compile_options", lambda setting: (counting, {"dynamic": False}))
    torch._dynamo.reset()
    per_run = []
    with torch._dynamo.config.patch(recompile_limit=2):  # torch's 8, made small to keep the test short
        for batch in range(2, torch._dynamo.config.recompile_limit + 4):
            run, before = tiny_run("ce"), len(graphs)
            engine.compile_for_training(run, "reduce-overhead")
            features = engine.backbone_features(run, torch.randn(batch, 3, 12, 12)).float()
            run.compiled_loss([features], torch.arange(batch) % 4, epoch=0)["loss"].backward()
            per_run.append(len(graphs) - before)
    assert min(per_run) >= 2, per_run
    torch._dynamo.reset()
