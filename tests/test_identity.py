"""Run identity (ltbench/results/identity.py): one rule for run ids, table rows, stage-2 ids and stale code."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ltbench.results import identity
from ltbench.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference-results"


def test_every_reference_result_keeps_its_recorded_id():
    """The committed results (and every study made before identity.py) keep their ids: the new
    execution settings are normalised to their default, never removed."""
    checked = 0
    for path in sorted(REFERENCE.rglob("result.json")):
        result = json.loads(path.read_text())
        if result.get("kind") == "posthoc":
            run_config = {k: v for k, v in result["config"].items() if k != "posthoc"}
            assert identity.run_id(run_config) == result["posthoc_of"], path
            assert identity.stage2_run_id(result["posthoc_of"], result["posthoc"]) == result["run_id"], path
        else:
            assert identity.run_id(result["config"]) == result["run_id"] == path.parent.name, path
        checked += 1
    assert checked > 3000


def test_every_train_field_is_declared_computation_or_execution_setting():
    """A new train: field must be declared in identity.py, one way or the other."""
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    execution = {k for s, k in identity.DROPPED | set(identity.NORMALISED) if s == "train"}
    assert names == execution | identity.TRAIN_COMPUTATION
    assert not execution & identity.TRAIN_COMPUTATION
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    for (section, key), value in identity.NORMALISED.items():
        assert section == "train" and defaults[key] == value and type(defaults[key]) is type(value)


def test_execution_settings_leave_the_id_and_the_row_alone():
    config = {"data": {"name": "x", "root": "/a"}, "train": {"num_workers": 0, "checkpoint_minutes": 0.0,
                                                             "eval_every": 0, "threads": None}, "seed": 1}
    other = json.loads(json.dumps(config))
    other["data"]["root"], other["train"].update(num_workers=3, checkpoint_minutes=5.0, threads=2)
    assert identity.run_id(config) == identity.run_id(other)
    assert identity.row_key(config) == identity.row_key(other)
    assert config["train"]["num_workers"] == 0 and other["train"]["num_workers"] == 3  # not modified
    evaluated = json.loads(json.dumps(config))
    evaluated["train"]["eval_every"] = 1  # records the test curve and the oracle epoch: another computation
    assert identity.run_id(evaluated) != identity.run_id(config)
    assert identity.differing_settings([config, other, evaluated]) == ["train.eval_every"]


def test_code_paths_are_recorded_relative_and_old_absolute_ones_are_mapped(tmp_path):
    import ltbench.backbones as module

    entry = identity.code_entry("ltbench.backbones", module.__file__)
    assert entry["path"] == "ltbench/backbones.py"
    assert identity.changed_code({"code": {"ltbench.backbones": entry}}) == ([], [])
    old = {"path": "/some/other/clone/ltbench/backbones.py", "sha256": entry["sha256"]}
    assert identity.changed_code({"code": {"ltbench.backbones": old}}) == ([], [])
    assert identity.changed_code({"code": {"ltbench.backbones": {**old, "sha256": "0" * 64}}}) == (["ltbench.backbones"], [])
    pkg = tmp_path / "my_plugins"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "loss.py").write_text("X = 1\n")
    plugin = identity.code_entry("my_plugins.loss", str(pkg / "loss.py"))
    assert plugin["path"] == "my_plugins/loss.py"
    result = {"code": {"my_plugins.loss": plugin}, "plugins": [str(pkg)]}
    assert identity.changed_code(result) == ([], [])
    (pkg / "loss.py").write_text("X = 2\n")
    assert identity.changed_code(result) == (["my_plugins.loss"], [])
    as_recorded = {"code": {"my_plugins.loss": plugin}, "plugins": {"my_loss": f"plugin folder {pkg}"}}
    assert identity.changed_code(as_recorded) == (["my_plugins.loss"], [])  # a result's name -> source form
    assert identity.changed_code({"code": {"my_plugins.loss": plugin}}) == ([], ["my_plugins.loss"])


# ------------------------------------------------------------------------------------------------
# Data identity: a dataset whose files live under data.root names them


@pytest.fixture
def restore_registries():
    from tests.conftest import registries_restored

    with registries_restored():
        yield


@pytest.mark.slow
@pytest.mark.usefixtures("restore_registries")  # the doc's plugin is registered in this process: put it back
def test_two_folders_with_different_contents_never_share_a_run_id_or_a_row(tmp_path, capsys, monkeypatch):
    """The folder dataset of docs/adding-a-dataset.md: data.root is an execution setting, so the plugin's
    data_identity() (a digest of its file) keeps two folders apart, and a copy of one folder together."""
    import shutil

    import numpy as np

    from tests.test_plugin_docs import run_cli, tiny_recipe, write_doc_example, write_npz

    folder = write_doc_example("adding-a-dataset.md", tmp_path)
    write_npz(tmp_path / "first")
    shutil.copytree(tmp_path / "first", tmp_path / "copy")
    write_npz(tmp_path / "other")
    with np.load(tmp_path / "other" / "images.npz") as f:  # 10 head-class images fewer, as in the issue
        arrays = {k: f[k] for k in f.files}
    keep = np.r_[10:len(arrays["y_train"])]
    np.savez(tmp_path / "other" / "images.npz", **{**arrays, "x_train": arrays["x_train"][keep],
                                                   "y_train": arrays["y_train"][keep]})
    recipes = {name: tiny_recipe(tmp_path / f"{name}.yaml", name=name, plugins=[str(folder)],
                                 data={"name": "npz_lt", "imb_factor": 2, "root": str(tmp_path / name)})
               for name in ("first", "copy", "other")}
    from ltbench.recipe import load_recipe

    ids = {name: load_recipe(path).runs[0].run_id for name, path in recipes.items()}
    assert ids["first"] == ids["copy"] != ids["other"]
    code, out, err = run_cli(["run", recipes["first"]], capsys)
    assert code == 0 and "1 done" in out, out + err
    code, out, err = run_cli(["table", recipes["other"]], capsys)  # never "read from first/ (same run id)"
    assert code == 0 and "read from" not in out and "0/1" in out and "never run" in out, out + err
    code, out, err = run_cli(["table", recipes["copy"]], capsys)  # the same data elsewhere: the same run
    assert code == 0 and "read from first/" in out, out + err
    shutil.copy(tmp_path / "other" / "images.npz", tmp_path / "first" / "images.npz")  # the data changed
    code, out, err = run_cli(["table", recipes["first"]], capsys)
    assert code == 0 and "were made from other data" in out and "0/1" in out, out + err
    for command in (["run", recipes["first"], "--dry-run"], ["status", recipes["first"]]):
        code, out, err = run_cli(command, capsys)
        assert code == 0 and "1 run folder(s)" in out and "were made from other data" in out, out + err


# ------------------------------------------------------------------------------------------------
# Execution settings: provably not part of what a run computes


EXECUTION_VARIANTS = {  # every train: execution setting of identity.py, set away from its default
    "num_workers": ["train.num_workers=1"],
    "checkpoint_minutes": ["train.checkpoint_minutes=0.0001"],  # a mid-epoch checkpoint after (nearly) every step
    "threads": ["train.threads=1"],
    "progress": ["train.progress=true"],
    "channels_last": ["train.channels_last=true"],
    "cudnn_benchmark": ["train.cudnn_benchmark=false"],
    "compile": ["train.compile=aot_eager"],
    "loggers": ["train.loggers=[tensorboard]"],  # scalars also written to TensorBoard event files
    "log_every": ["train.log_every=1"],  # the meters read from the device every step
}


def _train_tiny(recipe_path, overrides, results_dir) -> dict:
    from ltbench.run.local_pool import run_local
    from ltbench.recipe import load_recipe
    from ltbench.results.store import read_result

    recipe = load_recipe(recipe_path, overrides, results_dir=results_dir)
    run_local(recipe.runs)
    (spec,) = recipe.runs
    result = read_result(Path(spec.run_dir))
    assert result and result["status"] == "done", result
    return {**result, "run_dir": spec.run_dir}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    import yaml

    from tests.conftest import TINY, deep_update

    tmp = tmp_path_factory.mktemp("execution")
    path = tmp / "tiny.yaml"
    path.write_text(yaml.safe_dump(deep_update(TINY, {"optim": {"epochs": 2}, "train": {"threads": 2}})))
    return path, _train_tiny(path, [], tmp / "baseline")


def test_the_variants_cover_every_train_execution_setting():
    assert set(EXECUTION_VARIANTS) == {k for s, k in identity.DROPPED | set(identity.NORMALISED) if s == "train"}


@pytest.mark.slow
@pytest.mark.parametrize("setting", sorted(EXECUTION_VARIANTS))
def test_an_execution_setting_changes_neither_the_id_nor_the_metrics(setting, baseline, tmp_path):
    """Trained under the setting, a tiny run has the baseline's run id and the same per-class accuracy and
    test predictions, bit for bit on this CPU. (Threads and compile change float summation order in
    general; on this tiny network the numbers are equal, and README says they may drift on longer runs.)"""
    path, base = baseline
    if setting == "compile":
        pytest.importorskip("torch._dynamo")
    other = _train_tiny(path, EXECUTION_VARIANTS[setting], tmp_path / setting)
    assert other["run_id"] == base["run_id"]
    assert other["metrics"]["per_class"] == base["metrics"]["per_class"], setting
    assert other["metrics"]["all"] == base["metrics"]["all"]


@pytest.mark.slow
def test_a_results_tree_made_under_one_setting_skips_resumes_and_tables_under_another(baseline, tmp_path, capsys):
    import shutil

    from ltbench import report
    from ltbench.results import store
    from ltbench.run.launch import runs_to_launch
    from ltbench.recipe import load_recipe

    path, base = baseline
    results = tmp_path / "results"
    shutil.copytree(Path(base["run_dir"]).parent.parent, results)  # results/<recipe>/<run id>
    other = ["train.num_workers=1", "train.checkpoint_minutes=30", "train.threads=1"]
    recipe = load_recipe(path, other, results_dir=results)
    todo, found = runs_to_launch(recipe)
    assert todo == [] and found == {"done": 1}  # skipped: the same run
    (table,) = report.tables(path, results, overrides=other, use_cache=False)
    assert not table.notes  # no "not runs of this recipe", no missing seed
    assert [r.notes for r in table.rows] == [["Many not recorded for seed(s) 0"]]  # the tiny data has no many-shot class
    assert next(iter(table.rows[0].units.values())).runs[0]["run_id"] == base["run_id"]
    run_dir = Path(recipe.runs[0].run_dir)
    (run_dir / store.RESULT).unlink()  # as if killed after its last checkpoint: the next launch resumes it
    from ltbench.run.local_pool import run_local

    run_local(recipe.runs)
    assert "resuming from checkpoint" in capsys.readouterr().out
    assert store.read_result(run_dir)["metrics"]["per_class"] == base["metrics"]["per_class"]
