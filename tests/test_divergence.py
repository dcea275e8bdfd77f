"""A diverging run is reported as divergence (the loss or the scores non-finite at epoch e; lower optim.lr),
whether or not train.eval_every asked for evaluations during training; a method is blamed only when its
own contract check fails on finite inputs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from ltbench.errors import MethodContractError, NonFiniteLossError
from ltbench.method import Method, MethodContext
from ltbench.results import store
from ltbench.train import engine


class Linear(Method):
    def __init__(self, ctx, poison: bool = False):
        super().__init__(None, ctx)
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)
        self.poison = poison

    def loss(self, features, labels, *, epoch):
        logits = self.head(features[0])
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits.detach()}

    def predict(self, features, *, target_prior=None):
        return self.head(features) * (float("nan") if self.poison else 1.0)


def method_and_batch(poison: bool = False):
    ctx = MethodContext(num_classes=3, class_counts=torch.tensor([5, 3, 1]), feature_dim=4, epochs=2)
    method = Linear(ctx, poison)
    features = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    return method, [features], labels, method.loss([features], labels, epoch=0)


def test_the_method_is_blamed_only_on_finite_inputs():
    method, features, labels, out = method_and_batch(poison=True)
    with pytest.raises(MethodContractError, match="predict\\(\\) returned non-finite scores .* on finite features"):
        engine.check_method_contract(method, out, features, labels)
    healthy, _, _, out = method_and_batch()
    broken_input = [torch.full((6, 4), float("nan"))]
    with pytest.raises(NonFiniteLossError, match="backbone's features are non-finite") as caught:
        engine.check_method_contract(healthy, out, broken_input, labels)
    assert not isinstance(caught.value, MethodContractError) and "optim.lr" in str(caught.value)


def test_non_finite_scores_after_training_are_divergence(monkeypatch):
    """The evaluation after an epoch (eval_every, or the final one): the contract passed at the first step,
    so NaN scores now mean the model blew up, and the message names the epoch and the learning rate."""
    model = nn.ModuleDict({"backbone": nn.Linear(2, 2)})
    with torch.no_grad():
        model["backbone"].weight[0, 0] = float("inf")
    session = SimpleNamespace(run=SimpleNamespace(model=model, optim=SimpleNamespace(epochs=30, lr=1000.0)),
                              device=torch.device("cpu"), spec=SimpleNamespace(config={"method": {"name": "focal"}}))

    def nan_scores(run, device):
        raise engine.NonFiniteScores("method 'focal': predict() returned non-finite scores (NaN or inf)")

    monkeypatch.setattr(engine, "evaluate", nan_scores)
    with pytest.raises(NonFiniteLossError) as caught:
        engine.evaluate_after(session, 3)
    text = str(caught.value)
    assert "at the evaluation after epoch 3/30" in text and "training diverged" in text
    assert "lower optim.lr (now 1000)" in text and "weights non-finite (backbone.weight)" in text
    assert "contract" not in text


def test_a_non_finite_loss_blames_the_method_only_before_any_update():
    nan = torch.tensor(float("nan"))
    first = engine.non_finite_loss_message(nan, 0, 0, "fp32", "focal", 0.1)
    later = engine.non_finite_loss_message(nan, 2, 7, "fp32", "focal", 0.1)
    assert "before any update" in first and "method 'focal'" in first and "optim.lr" not in first
    assert "at epoch 3, step 8" in later and "training diverged; lower optim.lr (now 0.1)" in later


@pytest.mark.slow
@pytest.mark.parametrize("settings", [{"train": {"eval_every": 1, "progress": False}},  # scores go first
                                      {"optim": {"batch_size": 4}}], ids=["eval_every", "no_eval_every"])
def test_a_real_divergence_is_reported_as_such(tmp_path, write_recipe, settings):
    """lr 1000 on the tiny recipe: with eval_every the evaluation after epoch 1 meets NaN scores (weights
    around 1e18 but finite); without it, smaller batches take the loss to NaN in epoch 2. Either way the
    run fails as divergence and never as a broken method contract."""
    from ltbench.recipe import load_recipe
    from ltbench.run.local_pool import run_local

    extra = {"optim": {"lr": 1000.0, "epochs": 3, **settings.get("optim", {})}, **{k: v for k, v in settings.items()
                                                                                  if k != "optim"}}
    recipe = load_recipe(write_recipe(extra=extra))
    run_local(recipe.runs)
    result = json.loads((tmp_path / "results" / "tiny" / recipe.runs[0].run_id / store.RESULT).read_text())
    assert result["status"] == "failed" and result["error_type"] == "NonFiniteLossError", result["error"]
    assert "training diverged" in result["error"] and "lower optim.lr (now 1000)" in result["error"]
    assert "contract" not in result["error"]
