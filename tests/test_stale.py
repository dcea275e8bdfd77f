"""Stale results: a run records the hash of every module it executed that is not installed (ltbench, its
plugins, helper packages), the version of each installed distribution, and the data files its modules name;
status flags finished runs whose code has changed since, and 'ltbench run --rerun-stale' runs them again."""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys

import pytest

from ltbench.results import code as code_module
from ltbench.results import identity, provenance, store

PLUGIN = '''
import torch.nn as nn
import torch.nn.functional as F

from ltbench.method import Method
from ltbench.registry import METHODS

from {pkg}._helpers import SCALE
from stale_helpers import OFFSET  # a package of the user's beside the plugin folder, not installed


@METHODS.register("scaled_ce")
class ScaledCE(Method):
    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)

    def loss(self, features, labels, *, epoch):
        logits = self.head(features[0]) * SCALE + OFFSET
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
    (tmp_path / "stale_helpers").mkdir()
    (tmp_path / "stale_helpers" / "__init__.py").write_text("OFFSET = 0.0\n")
    recipe = write_recipe(extra={"plugins": ["./stale_plugins"], "method": {"name": "scaled_ce"},
                                 "optim": {"epochs": 1}})
    assert cli("run", recipe).returncode == 0
    result_path = next((tmp_path / "results").rglob(store.RESULT))
    code = json.loads(result_path.read_text())["code"]
    # The method's module, the helper module it imports (a private one, never registered), and the
    # built-in dataset and backbone modules.
    used = {"stale_plugins.scaled", "stale_plugins._helpers", "ltbench.data.synthetic", "ltbench.backbones",
            "stale_helpers", "distribution:torch"}
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
    (tmp_path / "stale_helpers" / "__init__.py").write_text("OFFSET = 0.5\n")
    assert "code changed since: stale_helpers" in cli("status", results_dir).stdout


def _state(code: dict, plugins=None) -> str:
    identity._sha_cache.clear(), identity._normalized_cache.clear()
    return identity.code_state({"code": code, "code_scope": code_module.CODE_SCOPE, "plugins": plugins or {}})


def test_a_helper_package_outside_the_plugin_folder_is_hashed_and_its_change_makes_the_run_stale(tmp_path, monkeypatch):
    """Issue 44: a plugin importing a helper package next to it (on sys.path, not installed) changed the loss
    and the run stayed 'done': only ltbench and the plugin folders were followed."""
    (tmp_path / "plug44").mkdir()
    (tmp_path / "plug44" / "__init__.py").write_text("")
    (tmp_path / "plug44" / "loss.py").write_text("from helper44.scale import SCALE\n")
    (tmp_path / "helper44").mkdir()
    (tmp_path / "helper44" / "__init__.py").write_text("")
    (tmp_path / "helper44" / "scale.py").write_text("SCALE = 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    recorded = provenance.modules_code(["plug44.loss"])
    assert {"plug44.loss", "helper44", "helper44.scale"} <= set(recorded)
    plugins = {"x": identity.PLUGIN_FOLDER_SOURCE + str(tmp_path / "plug44")}
    assert _state(recorded, plugins).status == "done"
    (tmp_path / "helper44" / "scale.py").write_text("SCALE = 2.0\n")
    assert _state(recorded, plugins).changed == ("helper44.scale",)
    # status in a process where the helper is not on sys.path finds it next to the run's plugin folder
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    for name in ("helper44", "helper44.scale", "plug44", "plug44.loss"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert _state(recorded, plugins).changed == ("helper44.scale",)


def test_installed_distributions_are_recorded_by_version_and_a_new_version_makes_the_run_stale(monkeypatch):
    recorded = provenance.modules_code([code_module.TRAINING_ROOT])
    assert recorded["distribution:torch"] == {"version": importlib.metadata.version("torch")}
    assert not any(m.split(".")[0] in ("torch", "numpy") for m in recorded)  # installed: never read or hashed
    assert _state(recorded).status == "done"
    monkeypatch.setitem(identity._versions, "torch", "0.0.1")
    state = _state(recorded)
    assert state.status == "stale" and state.changed == ("distribution:torch",)
    monkeypatch.setitem(identity._versions, "torch", None)  # uninstalled: cannot be checked, never 'done'
    assert _state(recorded).status == identity.CODE_UNKNOWN


def test_data_files_a_module_names_are_hashed_and_their_change_makes_the_run_stale(tmp_path, monkeypatch):
    """The CLIP class-name and prompt lists decide the text classifier: a run that builds one records them."""
    recorded = provenance.modules_code(["ltbench_foundation.prompts"])
    assert {"data:ltbench_foundation/classnames/places_lt.txt",
            "data:ltbench_foundation/classnames/templates_photo.txt"} <= set(recorded)
    # the same rule on a copy that can be edited: a plugin reading prompt files from a folder next to it
    (tmp_path / "text44").mkdir()
    (tmp_path / "text44" / "__init__.py").write_text("")
    (tmp_path / "text44" / "prompts.py").write_text(
        "from pathlib import Path\nFOLDER = Path(__file__).with_name('lists')\n")
    (tmp_path / "text44" / "lists").mkdir()
    (tmp_path / "text44" / "lists" / "photo.txt").write_text("a photo of a {}.\n")
    (tmp_path / "text44" / "README.md").write_text("not named by the code: not recorded\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    recorded = provenance.modules_code(["text44.prompts"])
    assert [k for k in recorded if k.startswith("data:")] == ["data:text44/lists/photo.txt"]
    assert _state(recorded).status == "done"
    (tmp_path / "text44" / "lists" / "photo.txt").write_text("a blurry photo of a {}.\n")
    assert _state(recorded).changed == ("data:text44/lists/photo.txt",)


def test_a_workers_code_record_is_the_same_with_the_parses_an_earlier_process_kept(tmp_path):
    """provenance.modules_code keeps each source's parse (by its sha256) and the distribution map between
    processes (.ltbench-code-work.json), so a worker's start skips 0.6 s of it; what a result records is the
    same with the cache as without it, and a parse kept in the cache's JSON is the parse."""
    import subprocess

    code = ("import json, sys; from ltbench.results import code, provenance; "
            "out = provenance.modules_code([code.TRAINING_ROOT]); "
            "print(json.dumps([out, code.made_new_parses()], sort_keys=True))")
    env = {**os.environ, "LTBENCH_CACHE_DIR": str(tmp_path)}
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                      check=True).stdout) for _ in range(2)]
    assert runs[0][0] == runs[1][0] and runs[0][1] and not runs[1][1]  # the second process parsed nothing
    assert (tmp_path / provenance.CODE_WORK_CACHE).is_file()

    code_module.normalized_hash(b"import os.path\nfrom . import x\nfrom .a.b import *\nOPEN = 'classnames'\n")
    code_module.normalized_hash(b"def broken(:\n")
    entries = json.loads(json.dumps(code_module.parse_entries()))  # as the cache keeps them
    saved = dict(code_module._parsed)
    code_module._parsed.clear()
    code_module.known_parses(entries)
    assert code_module._parsed == saved  # a round trip through the cache's JSON
