"""Failures that tell the user what to do: a method breaking its contract fails at its first step with
a message about the contract, a crash says where its traceback is, a relaunch mentions --rerun-failed,
and a non-finite loss blames bf16 only when bf16 is on."""

from __future__ import annotations

import json

import pytest
import torch

from ltbench.results import store
from ltbench.train.engine import non_finite_loss_message

BROKEN = '''
import pytest
import torch
import torch.nn as nn

from ltbench.method import Method
from ltbench.registry import METHODS


class Linear(Method):
    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)

    def loss(self, features, labels, *, epoch):
        logits = self.head(features[0])
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits.detach()}

    def predict(self, features, *, target_prior=None):
        return self.head(features)


@METHODS.register("no_loss_key")
class NoLossKey(Linear):
    def loss(self, features, labels, *, epoch):
        return {"total": super().loss(features, labels, epoch=epoch)["loss"]}


@METHODS.register("narrow_predict")
class NarrowPredict(Linear):
    def predict(self, features, *, target_prior=None):
        return self.head(features)[:, :3]


@METHODS.register("nan_predict")
class NanPredict(Linear):
    def predict(self, features, *, target_prior=None):
        return self.head(features) * float("nan")


@METHODS.register("crashes")
class Crashes(Linear):
    def loss(self, features, labels, *, epoch):
        raise RuntimeError("boom in the plugin")
'''


@pytest.mark.slow
def test_broken_methods_fail_at_their_first_step_with_the_contract(tmp_path, write_recipe, cli):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "methods_broken.py").write_text(BROKEN)
    names = ["no_loss_key", "narrow_predict", "nan_predict", "crashes"]
    recipe = write_recipe(extra={"plugins": ["./broken"], "optim": {"epochs": 3},
                                 "grid": {"method": [{"name": n} for n in names]}})
    out = cli("run", recipe)
    assert out.returncode == 1 and not out.stderr, out.stdout + out.stderr
    results = {r["config"]["method"]["name"]: (r, path.parent)
               for path in (tmp_path / "results").rglob(store.RESULT) for r in [json.loads(path.read_text())]}
    assert {n: r["status"] for n, (r, _) in results.items()} == dict.fromkeys(names, "failed")
    expected = {
        "no_loss_key": "loss() must return a dict with a 'loss' entry",
        "narrow_predict": "predict() returned (16, 3), expected a tensor of shape (16, 4)",
        "nan_predict": "predict() returned non-finite scores",
    }
    for name, text in expected.items():
        result, run_dir = results[name]
        assert result["error_type"] == "MethodContractError" and text in result["error"], result["error"]
        assert "docs/adding-a-method.md" in result["error"]
        assert store.read_jsonl(run_dir / store.LOG) == []  # failed at the first step, not after training
    crash, crash_dir = results["crashes"]
    assert crash["traceback_file"] == store.TRACEBACK and (crash_dir / store.TRACEBACK).is_file()
    assert "boom in the plugin" in (crash_dir / store.TRACEBACK).read_text()
    assert f"(traceback: {crash_dir / store.TRACEBACK})" in out.stdout
    assert "add --rerun-failed to run the failed runs again" in out.stdout

    again = cli("run", recipe)
    assert "4 run(s) failed before and are not run again" in again.stdout and "--rerun-failed" in again.stdout
    status = cli("status", tmp_path / "results" / "tiny")
    assert status.stdout.count("failed") >= 4 and f"traceback: {crash_dir / store.TRACEBACK}" in status.stdout


def test_non_finite_loss_mentions_precision_only_under_bf16():
    loss = torch.tensor(float("nan"))
    bf16 = non_finite_loss_message(loss, 0, 4, "bf16", "ldam", 0.1)
    fp32 = non_finite_loss_message(loss, 0, 4, "fp32", "ldam", 0.1)
    assert "train.precision=fp32" in bf16 and "optim.lr (now 0.1)" in bf16
    assert "precision" not in fp32 and "bf16" not in fp32
    assert "method 'ldam'" in fp32 and "optim.lr (now 0.1)" in fp32 and "epoch 1, step 5" in fp32
