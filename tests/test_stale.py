"""Stale results: a run records the hash of every plugin module it used; status flags finished runs whose
code has changed since, and 'ltbench run --rerun-stale' runs them again from scratch."""

from __future__ import annotations

import json

import pytest

from ltbench.results import identity, store

PLUGIN = '''
import torch.nn as nn
import torch.nn.functional as F

from ltbench.method import Method
from ltbench.registry import METHODS

from {pkg}._helpers import SCALE


@METHODS.register("scaled_ce")
class ScaledCE(Method):
    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)

    def loss(self, features, labels, *, epoch):
        logits = self.head(features[0]) * SCALE
        return {{"loss": F.cross_entropy(logits, labels), "logits": logits.detach()}}

    def predict(self, features, *, target_prior=None):
        return self.head(features)
'''


@pytest.mark.slow
def test_changed_plugin_code_flags_runs_stale_and_rerun_stale_redoes_them(tmp_path, write_recipe, cli):
    pkg = tmp_path / "stale_plugins"
    pkg.mkdir()
    (pkg / "scaled.py").write_text(PLUGIN.format(pkg="stale_plugins"))
    (pkg / "_helpers.py").write_text("SCALE = 1.0\n")
    recipe = write_recipe(extra={"plugins": ["./stale_plugins"], "method": {"name": "scaled_ce"},
                                 "optim": {"epochs": 1}})
    assert cli("run", recipe).returncode == 0
    result_path = next((tmp_path / "results").rglob(store.RESULT))
    code = json.loads(result_path.read_text())["code"]
    # The method's module, the helper module it imports (a private one, never registered), and the
    # built-in dataset and backbone modules.
    used = {"stale_plugins.scaled", "stale_plugins._helpers", "ltbench.data.synthetic", "ltbench.backbones"}
    assert used <= set(code)
    assert code["stale_plugins._helpers"]["sha256"] == identity.file_sha256(pkg / "_helpers.py")

    results_dir = tmp_path / "results" / "tiny"
    assert "1 done" in cli("status", results_dir).stdout
    (pkg / "_helpers.py").write_text("SCALE = 2.0\n")
    status = cli("status", results_dir)
    assert "stale" in status.stdout and "code changed since: stale_plugins._helpers" in status.stdout
    assert "--rerun-stale" in status.stdout

    plain = cli("run", recipe)
    assert "0 to run" in plain.stdout and "add --rerun-stale" in plain.stdout
    assert not (result_path.parent / "result.json.stale").exists()
    redo = cli("run", recipe, "--rerun-stale")
    assert redo.returncode == 0, redo.stdout + redo.stderr
    assert "1 to run" in redo.stdout and "training again from scratch" in redo.stdout
    assert (result_path.parent / "result.json.stale").is_file()
    fresh = json.loads(result_path.read_text())
    assert fresh["code"]["stale_plugins._helpers"]["sha256"] == identity.file_sha256(pkg / "_helpers.py")
    assert [r["epoch"] for r in store.read_jsonl(result_path.parent / store.LOG)] == [1]
    assert "1 done" in cli("status", results_dir).stdout
