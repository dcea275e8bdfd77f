"""Adding a method without touching the core: a plugin folder, and an installed package's entry point."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FOCAL = '''
"""Focal loss, as a user would add it: one file, no core edit."""
from dataclasses import dataclass

import torch.nn as nn
import torch.nn.functional as F

from ltbench.method import Method
from ltbench.registry import METHODS


@dataclass
class FocalConfig:
    gamma: float = 2.0


@METHODS.register("{name}")
class Focal(Method):
    Config = FocalConfig

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)

    def loss(self, features, labels, *, epoch):
        logits = self.head(features[0])
        logp = F.log_softmax(logits, 1).gather(1, labels[:, None]).squeeze(1)
        loss = (-(1 - logp.exp()) ** self.cfg.gamma * logp).mean()
        return {{"loss": loss, "logits": logits.detach()}}

    def predict(self, features, *, target_prior=None):
        return self.head(features)
'''


def _result(results: Path) -> dict:
    files = list(results.rglob("result.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


def test_method_in_a_plugin_folder_trains_end_to_end(tmp_path, write_recipe, cli):
    folder = tmp_path / "my_plugins"
    folder.mkdir()
    (folder / "focal.py").write_text(FOCAL.format(name="focal_folder"))
    recipe = write_recipe(extra={"plugins": ["./my_plugins"], "method": {"name": "focal_folder", "gamma": 1.5}})
    listing = cli("list", "methods", "--plugins", str(folder))
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    at = next(i for i, l in enumerate(lines) if l.startswith("focal_folder"))
    assert f"from plugin folder {folder}" in lines[at + 1]  # what it is, then where it comes from
    assert all(len(l) <= 100 for l in lines if not l.lstrip().startswith("from "))
    out = cli("run", recipe)
    assert out.returncode == 0, out.stdout + out.stderr
    result = _result(tmp_path / "results")
    assert result["status"] == "done"
    assert result["config"]["method"] == {"name": "focal_folder", "gamma": 1.5}
    assert "plugin folder" in result["plugins"]["focal_folder"]
    # The same folder through the environment variable instead of the recipe.
    env_listing = cli("list", "methods", env={"LTBENCH_PLUGIN_PATH": str(folder)})
    assert "focal_folder" in env_listing.stdout


def test_method_from_an_installed_package_entry_point(tmp_path, cli):
    pkg = tmp_path / "src"
    (pkg / "ltb_focal").mkdir(parents=True)
    (pkg / "ltb_focal" / "__init__.py").write_text("")
    (pkg / "ltb_focal" / "focal.py").write_text(FOCAL.format(name="focal_ep"))
    (pkg / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "ltb-focal"
        version = "1.2.3"
        [project.entry-points."ltbench.methods"]
        focal = "ltb_focal.focal"
        [tool.setuptools]
        packages = ["ltb_focal"]
    """))
    site = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                              "--no-index", "--target", str(site), str(pkg)], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr
    env = {"PYTHONPATH": str(site)}
    listing = cli("list", "methods", env=env)
    lines = listing.stdout.splitlines()
    at = next(i for i, l in enumerate(lines) if l.startswith("focal_ep"))
    assert "ltb-focal 1.2.3" in lines[at + 1]
    recipe = tmp_path / "r.yaml"
    from tests.conftest import TINY, deep_update
    import yaml

    recipe.write_text(yaml.safe_dump(deep_update(TINY, {"method": {"name": "focal_ep"},
                                                        "results_dir": str(tmp_path / "results")})))
    out = cli("run", recipe, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert _result(tmp_path / "results")["status"] == "done"


def test_name_collision_between_plugins_is_an_error(tmp_path, write_recipe, cli):
    for sub in ("plugins_a", "plugins_b"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "focal.py").write_text(FOCAL.format(name="focal_twice"))
    recipe = write_recipe(extra={"plugins": ["./plugins_a", "./plugins_b"], "method": {"name": "focal_twice"}})
    out = cli("run", recipe, "--dry-run")
    assert out.returncode == 2
    assert "registered twice" in out.stderr and "focal_twice" in out.stderr
    assert "Traceback" not in out.stderr


def test_broken_plugin_names_itself(tmp_path, write_recipe, cli):
    (tmp_path / "broken_plugins").mkdir()
    (tmp_path / "broken_plugins" / "oops.py").write_text("import no_such_module_xyz\n")
    out = cli("run", write_recipe(extra={"plugins": ["./broken_plugins"]}), "--dry-run")
    assert out.returncode == 2
    assert "broken_plugins" in out.stderr and "no_such_module_xyz" in out.stderr


def test_registry_unknown_name_message():
    from ltbench.registry import METHODS, RegistryError

    with pytest.raises(RegistryError) as info:
        METHODS.get("c")
    assert "Known: " in str(info.value) and "Searched: " in str(info.value)


def test_a_plugin_file_given_for_its_folder_is_named_with_the_folder_to_give(tmp_path):
    from ltbench import registry

    (tmp_path / "my_methods").mkdir()
    plugin = tmp_path / "my_methods" / "focal.py"
    plugin.write_text("")
    with pytest.raises(registry.RegistryError, match=r"is a file; give the folder that holds it \(.*my_methods\)"):
        registry.add_plugin_paths([str(plugin)])
