"""The Method contract, checked for every registered method (methods added later are covered automatically).

On the synthetic dataset with a ResNet-8: default config validates, views resolve, one training step gives a
finite loss and backbone gradients, predictions have shape (B, K) for any target prior, and a checkpoint
(``model.state_dict()`` + ``method.extra_state()``, through ``torch.save``/``torch.load(weights_only=True)``
as the engine does) restores identical predictions in a freshly built run.
"""

from __future__ import annotations

import io

import pytest
import torch

from ltbench.train import engine
from ltbench.config import from_dict
from ltbench.data import transforms
from ltbench.data.base import MultiView
from ltbench.recipe import resolve_run_config
from ltbench.registry import METHODS

DATA = {"name": "synthetic_lt"}
EPOCHS = 2
# The foundation track's methods need a pretrained backbone's text tower by default: lift is checked here with its
# random head initialisation; zero_shot trains nothing (optim.epochs 0), so tests/test_foundation_e2e.py covers it.
OPTIONS = {"lift": {"init": "random"}}
NAMES = [name for name in METHODS.names() if name != "zero_shot"]


@pytest.fixture(scope="module")
def data():
    return engine.load_data({"data": DATA})


def build(name: str, data, init_seed: int) -> engine.Run:
    cfg = resolve_run_config({"data": DATA, "backbone": {"name": "resnet8"}, "method": {"name": name, **OPTIONS.get(name, {})},
                              "optim": {"epochs": EPOCHS, "warmup_epochs": 0}}, seed=0, where="test")
    torch.manual_seed(init_seed)
    return engine.build_run(cfg, data=data)


def train_batch(run: engine.Run, data, seed: int = 0):
    """Two images of every class through the method's views, collated as the engine does."""
    labels = torch.as_tensor(data.train_labels)
    idx = torch.cat([torch.nonzero(labels == c).flatten()[:2] for c in range(data.num_classes)]).tolist()
    views = [transforms.build(v, data.image, data.pipelines) for v in run.method.views()]
    dataset = MultiView(data.train, views)
    torch.manual_seed(seed)
    return engine.collate([dataset[i] for i in idx])


def step(run: engine.Run, views, labels, epoch: int) -> dict:
    run.model.train()
    run.method.on_epoch_start(epoch)
    features = run.backbone(torch.cat(views)).float().split(len(labels))
    return run.method.loss(list(features), labels, epoch=epoch)


@torch.no_grad()
def eval_features(run: engine.Run, data, n: int = 12) -> torch.Tensor:
    run.model.eval()
    tf = transforms.build("eval", data.image, data.pipelines)
    x = torch.stack([tf(data.test[i][0]) for i in range(0, len(data.test), max(1, len(data.test) // n))][:n])
    return run.backbone(x).float()


def priors(k: int) -> dict:
    gen = torch.Generator().manual_seed(1)
    rand = torch.rand(k, generator=gen) + 0.05
    return {"none": None, "uniform": torch.full((k,), 1.0 / k), "random": rand / rand.sum()}


@pytest.mark.parametrize("name", NAMES)
def test_config_defaults_and_views(name, data):
    cls = METHODS.get(name)
    cfg = from_dict(cls.Config, OPTIONS.get(name, {}), f"method[{name}]")
    run = build(name, data, 0)
    assert type(run.method.cfg) is type(cfg)
    views = run.method.views()
    assert isinstance(views, list) and views, f"{name}: views() must name at least one view"
    image, _ = data.train[0]
    for v in views:
        out = transforms.build(v, data.image, data.pipelines)(image)
        assert torch.is_tensor(out) and out.dtype == torch.float32, f"{name}: view {v!r} gives {type(out)}"
        assert tuple(out.shape) == (data.image.channels, data.image.size, data.image.size), (v, out.shape)


@pytest.mark.parametrize("name", NAMES)
def test_training_step(name, data):
    run = build(name, data, 0)
    views, labels = train_batch(run, data)
    assert len(views) == len(run.method.views())
    k = data.num_classes
    for epoch in (0, EPOCHS - 1):
        run.model.zero_grad(set_to_none=True)
        out = step(run, views, labels, epoch)
        loss = out["loss"]
        assert loss.ndim == 0 and torch.isfinite(loss), f"{name}: loss {loss} at epoch {epoch}"
        if "logits" in out:
            assert out["logits"].shape == (len(labels), k)
        for key, value in out.items():
            if key not in ("loss", "logits"):
                assert torch.is_tensor(value) and torch.isfinite(value).all(), f"{name}: logged '{key}'"
        loss.backward()
        grads = [p.grad for p in run.backbone.parameters() if p.grad is not None]
        assert grads and any(float(g.abs().sum()) > 0 for g in grads), f"{name}: no gradient reaches the backbone"
        assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("name", NAMES)
def test_predictions_shape(name, data):
    run = build(name, data, 0)
    feats = eval_features(run, data)
    k = data.num_classes
    with torch.no_grad():
        for label, prior in priors(k).items():
            scores = run.method.predict(feats, target_prior=prior)
            assert scores.shape == (len(feats), k), f"{name}: predict under {label} prior"
            assert torch.isfinite(scores).all()
            for head, s in run.method.head_predictions(feats, target_prior=prior).items():
                assert s.shape == (len(feats), k), f"{name}: head '{head}' under {label} prior"


@pytest.mark.parametrize("name", NAMES)
def test_state_round_trip(name, data):
    run = build(name, data, 0)
    optimizer = engine.make_optimizer(run)
    views, labels = train_batch(run, data)
    for epoch in range(EPOCHS):  # change weights, BatchNorm statistics and any per-epoch state
        out = step(run, views, labels, epoch)
        optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        optimizer.step()
    buffer = io.BytesIO()
    torch.save({"model": run.model.state_dict(), "method_extra": run.method.extra_state()}, buffer)
    buffer.seek(0)
    state = torch.load(buffer, map_location="cpu", weights_only=True)

    fresh = build(name, data, 12345)
    feats = eval_features(run, data)
    assert not torch.equal(feats, eval_features(fresh, data))  # the test is meaningful: the fresh run differs
    fresh.model.load_state_dict(state["model"])
    fresh.method.load_extra_state(state["method_extra"])

    feats_fresh = eval_features(fresh, data)
    assert torch.equal(feats, feats_fresh)
    with torch.no_grad():
        for label, prior in priors(data.num_classes).items():
            a = run.method.predict(feats, target_prior=prior)
            b = fresh.method.predict(feats_fresh, target_prior=prior)
            assert torch.equal(a, b), f"{name}: predictions differ after a state round-trip ({label} prior)"
            ha = run.method.head_predictions(feats, target_prior=prior)
            hb = fresh.method.head_predictions(feats_fresh, target_prior=prior)
            assert ha.keys() == hb.keys()
            for head in ha:
                assert torch.equal(ha[head], hb[head]), f"{name}: head '{head}' differs ({label} prior)"
