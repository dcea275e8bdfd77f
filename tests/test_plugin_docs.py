"""The plugin docs' examples run as written, and ``ltbench check`` finds each broken promise of the contract.

The code blocks of docs/adding-a-*.md that start with ``# folder/file.py`` are written to that path
in a temporary directory and used as a plugin user would: ``ltbench check FOLDER``, then a short run.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from conftest import ROOT, TINY, registries_restored
from pretrained_kit import clip_backbone, tiny_weights  # noqa: F401 - a fixture used below
from ltbench import cli, contract
from ltbench.config import from_dict
from ltbench.registry import BACKBONES, DATASETS, METHODS

BLOCK = re.compile(r"```python\n# (?P<path>[\w/]+\.py)\n(?P<code>.*?)```", re.S)


@pytest.fixture(autouse=True)
def restore_registries():
    """The doc examples register plugins ('focal', ...) in this process: put everything back after each
    test (conftest.registries_restored), so a later test file that expects 'focal' to be unknown passes."""
    with registries_restored():
        yield


def write_doc_example(doc: str, where: Path) -> Path:
    """Write the doc's first file block to where/<its path>; return the plugin folder."""
    match = BLOCK.search((ROOT / "docs" / doc).read_text())
    assert match, f"docs/{doc} has no '# folder/file.py' python block"
    target = where / match["path"]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(match["code"])
    return target.parent


def run_cli(argv, capsys) -> tuple[int, str, str]:
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def tiny_recipe(path: Path, **sections) -> Path:
    recipe = {**TINY, "optim": {**TINY["optim"], "epochs": 1}, "results_dir": str(path.parent / "results"), **sections}
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_method_doc_example_passes_the_contract_and_trains(tmp_path, capsys):
    folder = write_doc_example("adding-a-method.md", tmp_path)
    code, out, err = run_cli(["check", folder], capsys)
    assert code == 0, out + err
    assert "ok    method focal" in out
    recipe = tiny_recipe(tmp_path / "focal.yaml", plugins=[str(folder)], method={"name": "focal", "gamma": 1.5})
    code, out, err = run_cli(["run", recipe], capsys)
    assert code == 0 and "1 done" in out, out + err
    code, out, err = run_cli(["run", recipe, "method.gamma=-1"], capsys)
    assert code == 2 and "method.gamma: must be >= 0" in err


def test_backbone_doc_example_passes_the_contract_and_trains(tmp_path, capsys):
    folder = write_doc_example("adding-a-backbone.md", tmp_path)
    code, out, err = run_cli(["check", folder], capsys)
    assert code == 0 and "ok    backbone small_cnn" in out, out + err
    net = BACKBONES.get("small_cnn")(from_dict(BACKBONES.get("small_cnn").Config, {"width": 8}, "b"), in_channels=3)
    assert net(torch.rand(2, 3, 12, 12)).shape == (2, 32)
    recipe = tiny_recipe(tmp_path / "cnn.yaml", plugins=[str(folder)], backbone={"name": "small_cnn", "width": 8})
    code, out, err = run_cli(["run", recipe], capsys)
    assert code == 0 and "1 done" in out, out + err
    code, out, err = run_cli(["run", recipe, "backbone.width=2"], capsys)
    assert code == 2 and "backbone.width: must be >= 4" in err


def test_stage2_doc_example_passes_the_contract_and_its_grid_runs(tmp_path, capsys):
    """docs/adding-a-stage2-method.md: check, a tiny run, then `ltbench posthoc` with a list option (a grid
    axis: two settings) and a fixed one; each setting is a stage-2 result and a table row."""
    import json

    folder = write_doc_example("adding-a-stage2-method.md", tmp_path)
    code, out, err = run_cli(["check", folder], capsys)
    assert code == 0 and "ok    posthoc method ncm" in out, out + err
    recipe = tiny_recipe(tmp_path / "ncm.yaml", plugins=[str(folder)],
                         posthoc=[{"name": "ncm", "temperature": [8.0, 16.0]}, {"name": "ncm", "normalise": False}])
    code, out, err = run_cli(["run", recipe], capsys)
    assert code == 0 and "1 done" in out, out + err
    code, out, err = run_cli(["posthoc", recipe], capsys)
    assert code == 0, out + err
    results = [json.loads(p.read_text()) for p in (tmp_path / "results").rglob("posthoc/*/result.json")]
    assert sorted((r["config"]["posthoc"]["temperature"], r["config"]["posthoc"]["normalise"]) for r in results) \
        == [(8.0, True), (16.0, False), (16.0, True)]
    assert all(r["status"] == "done" and 0 <= r["metrics"]["all"] <= 1 for r in results)
    assert all(len(r["method_extras"]["class_mean_norm"]) == 4 for r in results)
    code, out, err = run_cli(["table", recipe], capsys)
    assert code == 0 and "CE + ncm (normalise=true, temperature=8)" in out, out + err  # CE: ce's display name
    code, out, err = run_cli(["posthoc", recipe, "posthoc=[{name: ncm, temperature: -1}]"], capsys)
    assert code == 2 and "posthoc[0].temperature: must be > 0" in err, err


def write_npz(folder: Path, k: int = 4, per_class: int = 30, size: int = 12) -> None:
    rng = np.random.default_rng(0)
    y_train = np.repeat(np.arange(k), per_class)
    y_test = np.repeat(np.arange(k), 8)
    x_train = rng.integers(0, 256, (len(y_train), size, size, 3), dtype=np.uint8)
    x_test = rng.integers(0, 256, (len(y_test), size, size, 3), dtype=np.uint8)
    folder.mkdir(parents=True)
    np.savez(folder / "images.npz", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def test_dataset_doc_example_passes_the_contract_and_trains(tmp_path, capsys, monkeypatch):
    folder = write_doc_example("adding-a-dataset.md", tmp_path)
    monkeypatch.setenv("LTBENCH_DATA", str(tmp_path / "nowhere"))
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["check", folder], capsys)
    # no data yet: 'skipped' (nothing was loaded, so nothing was checked), never 'ok'
    assert code == 0 and "skipped dataset npz_lt" in out and "nothing loaded, its files are not here" in out, out
    assert "ok    dataset" not in out and "1 skipped (nothing loaded: not checked)" in out
    write_npz(tmp_path / "npz")
    code, out, err = run_cli(["check", folder, "--data-root", tmp_path / "npz"], capsys)
    assert code == 0 and "ok    dataset npz_lt" in out and "loaded: 4 classes" in out, out + err
    data = {"name": "npz_lt", "imb_factor": 10, "root": str(tmp_path / "npz")}
    recipe = tiny_recipe(tmp_path / "npz.yaml", plugins=[str(folder)], data=data)
    code, out, err = run_cli(["check", recipe], capsys)  # the recipe's data: section (its root, imbalance)
    assert code == 0 and "ok    dataset npz_lt" in out and "52 train" in out, out + err
    code, out, err = run_cli(["data", recipe], capsys)
    assert code == 0 and "train 52 images" in out, out + err  # int(30 * 0.1 ** (i / 3)): 30 + 13 + 6 + 3
    code, out, err = run_cli(["run", recipe], capsys)
    assert code == 0 and "1 done" in out, out + err
    code, out, err = run_cli(["run", recipe, "data.root=" + str(tmp_path / "empty")], capsys)
    assert code == 2 and "images.npz not found" in err


def test_multi_expert_doc_example_passes_the_contract_and_trains(tmp_path, capsys):
    """docs/adding-a-method.md, 'Multi-expert methods': the two-expert example is checked, then trained
    on ResNet-8 split into a shared trunk and two experts (the engine builds it through build_model)."""
    blocks = {m["path"]: m["code"] for m in BLOCK.finditer((ROOT / "docs" / "adding-a-method.md").read_text())}
    target = tmp_path / "my_experts" / "two_experts.py"
    target.parent.mkdir()
    target.write_text(blocks["my_experts/two_experts.py"])
    code, out, err = run_cli(["check", target.parent], capsys)
    assert code == 0 and "ok    method two_experts" in out, out + err
    recipe = tiny_recipe(tmp_path / "experts.yaml", plugins=[str(target.parent)], method={"name": "two_experts"})
    code, out, err = run_cli(["run", recipe], capsys)
    assert code == 0 and "1 done" in out, out + err
    result = next((tmp_path / "results").rglob("result.json")).read_text()
    assert '"expert0"' in result and '"expert1"' in result
    code, out, err = run_cli(["run", recipe, "method.expert_stages=9"], capsys)
    assert code == 2 and "method.expert_stages: must be >= 1 and <= 4" in err


# -------------------------------------------------------------------------------------------------
# ltbench check on broken plugins


BROKEN = '''
from dataclasses import dataclass
import torch, torch.nn as nn, torch.nn.functional as F
from ltbench.method import Method
from ltbench.registry import METHODS

class Base(Method):
    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)
    def loss(self, features, labels, *, epoch):
        return {"loss": F.cross_entropy(self.head(features[0]), labels)}
    def predict(self, features, *, target_prior=None):
        z = self.head(features) - self.log_train_prior
        return z + self.target_shift(target_prior, z)

@METHODS.register("chk_good")
class Good(Base):
    pass

@METHODS.register("chk_three_columns")
class ThreeColumns(Base):
    def predict(self, features, *, target_prior=None):
        return super().predict(features, target_prior=target_prior)[:, :3]

@METHODS.register("chk_no_loss_key")
class NoLossKey(Base):
    def loss(self, features, labels, *, epoch):
        return {"total": super().loss(features, labels, epoch=epoch)["loss"]}

@METHODS.register("chk_wrong_sign")
class WrongSign(Base):
    def predict(self, features, *, target_prior=None):
        z = self.head(features) - self.log_train_prior
        return z - 10 * self.target_shift(target_prior, z)

@METHODS.register("chk_none_not_uniform")
class NoneNotUniform(Base):
    def predict(self, features, *, target_prior=None):
        z = self.head(features)
        return z if target_prior is None else z + torch.log(target_prior)

@dataclass
class MutatingConfig:
    views: list = None
    def validate(self):
        self.views = ["default"]

@METHODS.register("chk_mutating_config")
class Mutating(Base):
    Config = MutatingConfig

@METHODS.register("chk_nan")
class NaNScores(Base):
    def predict(self, features, *, target_prior=None):
        return super().predict(features, target_prior=target_prior) * float("nan")
'''


def test_check_names_each_broken_promise(tmp_path, capsys):
    folder = tmp_path / "chk_plugins"
    folder.mkdir()
    (folder / "methods.py").write_text(BROKEN)
    code, out, err = run_cli(["check", folder], capsys)
    assert code == 1, out + err
    lines = {line.split()[2]: line for line in out.splitlines() if line.startswith(("ok", "FAIL"))}
    assert lines["chk_good"].startswith("ok")
    expected = {
        "chk_three_columns": "predict() must return (N, num_classes) = (64, 5) scores, got (64, 3)",
        "chk_no_loss_key": "loss() must return a dict with the key 'loss'",
        "chk_wrong_sign": "the target-prior term has the wrong sign",
        "chk_none_not_uniform": "same scores for target_prior=None and a uniform prior",
        "chk_mutating_config": "Config.validate() changed the config",
        "chk_nan": "predict() returned non-finite scores",
    }
    for name, words in expected.items():
        assert lines[name].startswith("FAIL") and words in lines[name], lines[name]
    assert "1 of 7 plugin(s) pass the contract" in out


def test_check_on_a_folder_without_plugins_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "empty_plugins").mkdir()
    code, out, err = run_cli(["check", tmp_path / "empty_plugins"], capsys)
    assert code == 2 and "registers no method, backbone or dataset" in err
    code, out, err = run_cli(["check", tmp_path / "missing"], capsys)
    assert code == 2 and "does not exist" in err


@pytest.mark.parametrize("registry", [METHODS, BACKBONES, DATASETS], ids=["methods", "backbones", "datasets"])
def test_validate_never_changes_a_config(registry):
    """The rule of docs/adding-a-method.md, for every registered plugin and the core's configs."""
    for name in registry.names():
        if registry.entry(name).source.startswith("plugin folder"):
            continue  # the deliberately broken plugins of the test above
        cls = registry.get(name)
        contract.default_config(cls, f"{registry.kind} {name}")  # raises ContractError if validate() mutates


def test_core_configs_validate_without_changing():
    from ltbench.config import EvalConfig, OptimConfig, TrainConfig
    from ltbench.recipe import LauncherConfig, RecipeConfig

    for cls in (OptimConfig, TrainConfig, EvalConfig, LauncherConfig, RecipeConfig):
        cfg = from_dict(cls, {}, cls.__name__)
        before = dataclasses.asdict(cfg)
        cfg.validate()
        assert dataclasses.asdict(cfg) == before


@pytest.mark.slow
def test_builtin_methods_pass_the_check_contract():
    """No false alarm: every built-in method and CIFAR ResNet passes what `ltbench check` demands."""
    for name in METHODS.names():
        # zero_shot trains nothing (optim.epochs 0; its loss refuses): tests/test_foundation_e2e.py covers it
        if METHODS.entry(name).source.startswith("plugin folder") or name == "zero_shot":
            continue
        contract.check_method(METHODS.get(name), name)
    for name in ("resnet8", "resnet32"):
        contract.check_backbone(BACKBONES.get(name), name)


def test_tune_mode_doc_example_passes_the_contract_and_trains(tmp_path, capsys, tiny_weights):
    """docs/adding-a-tune-mode.md's plugin, as written: checked, then a run on the tiny random-weight CLIP that
    trains its adapters (counted in parameters.backbone_tuning) and records its module in the run's code."""
    folder = write_doc_example("adding-a-tune-mode.md", tmp_path)
    code, out, err = run_cli(["check", folder], capsys)
    assert code == 0 and "ok    tune mode parallel_adapter" in out, out + err
    code, out, err = run_cli(["list", "tune_modes", "--plugins", folder], capsys)
    assert code == 0 and "parallel_adapter" in out and "vpt" in out, out + err
    tune = {"name": "parallel_adapter", "bottleneck": 4}
    recipe = tiny_recipe(tmp_path / "adapter.yaml", plugins=[str(folder)], method={"name": "la"},
                         backbone=clip_backbone(tiny_weights["clip"], tune))
    code, out, err = run_cli(["run", recipe], capsys)
    assert code == 0 and "1 done" in out, out + err
    result = yaml.safe_load(next((tmp_path / "results").rglob("result.json")).read_text())
    assert result["config"]["backbone"]["tune"] == {**tune, "scale": 4.0}
    width, blocks = 64, 2  # the tiny CLIP: down (64 x 4 + 4), up (4 x 64 + 64) per block
    tuning = result["parameters"]["backbone_tuning"]
    assert (tuning["tune"], tuning["bottleneck"]) == ("parallel_adapter", 4)
    assert tuning["trainable"] == blocks * (width * 4 + 4 + 4 * width + width)
    assert "parallel_adapter" in " ".join(result["code"])  # its module is in the run's code record
    code, out, err = run_cli(["run", recipe, "backbone.tune.bottleneck=0"], capsys)
    assert code == 2 and "backbone.tune.bottleneck" in err, err
