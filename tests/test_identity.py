"""Run identity (ltbench/results/identity.py): one rule for run ids, table rows, stage-2 ids and stale code."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ltbench.results import code, identity
from tests.reportkit import code_entry
from ltbench.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference-results"


def test_every_reference_result_has_the_id_of_its_configuration():
    """Every committed result (migrated to the current schema) is named by the hash of its configuration
    under the current identity rule, and its folder by that id."""
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
    execution = {k for s, k in identity.EXECUTION_SETTINGS if s == "train"}
    assert names == execution | identity.TRAIN_COMPUTATION
    assert not execution & identity.TRAIN_COMPUTATION


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


def test_code_paths_are_recorded_relative(tmp_path):
    import ltbench.backbones as module

    entry = code_entry("ltbench.backbones", module.__file__)
    assert entry["path"] == "ltbench/backbones.py" and entry["normalized"]
    assert identity.changed_code({"code": {"ltbench.backbones": entry}}) == ([], [])
    assert identity.changed_code({"code": {"ltbench.backbones": {**entry, "normalized": "0" * 64}}}) == (["ltbench.backbones"], [])
    bytes_only = {"path": entry["path"], "sha256": entry["sha256"]}  # recorded before normalised hashes: unknown
    assert identity.changed_code({"code": {"ltbench.backbones": bytes_only}}) == ([], ["ltbench.backbones"])
    pkg = tmp_path / "my_plugins"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "loss.py").write_text("X = 1\n")
    plugin = code_entry("my_plugins.loss", str(pkg / "loss.py"))
    assert plugin["path"] == "my_plugins/loss.py"
    result = {"code": {"my_plugins.loss": plugin}, "plugins": [str(pkg)], "code_scope": code.CODE_SCOPE}
    assert identity.changed_code(result) == ([], []) and identity.code_state(result).status == "done"
    (pkg / "loss.py").write_text('"""A docstring."""\n# a comment\nX = 1  # the same code\n')
    assert identity.code_state(result).status == "done"  # normalised: docstrings and comments do not count
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
    assert set(EXECUTION_VARIANTS) == {k for s, k in identity.EXECUTION_SETTINGS if s == "train"}


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
    # no "not runs of this recipe", no missing seed: only the numerics the result was made under (2 threads)
    assert table.notes == [f"numerics of every result shown: {identity.numerics_text(base['numerics'])} (1 result)"]
    assert [r.notes for r in table.rows] == [["Many not recorded for seed(s) 0"]]  # the tiny data has no many-shot class
    assert next(iter(table.rows[0].units.values())).runs[0]["run_id"] == base["run_id"]
    run_dir = Path(recipe.runs[0].run_dir)
    (run_dir / store.RESULT).unlink()  # as if killed after its last checkpoint: the next launch resumes it
    from ltbench.run.local_pool import run_local

    run_local(recipe.runs)
    assert "resuming from checkpoint" in capsys.readouterr().out
    assert store.read_result(run_dir)["metrics"]["per_class"] == base["metrics"]["per_class"]


# ------------------------------------------------------------------------------------------------
# Numerics: one run id, two thread counts (the 70.06 / 68.86 case of issue 31, on a tiny run)


@pytest.mark.slow
def test_a_one_thread_and_a_two_thread_result_of_one_run_id_never_stand_for_each_other(baseline, tmp_path):
    """The baseline trained with train.threads=2; the same run id trained with one thread (the CPU's default)
    records other numerics. Put in two recipes' folders: each recipe's table uses its own result and names
    the other; a third recipe with neither borrows none (never by folder order) and names both."""
    import shutil

    import yaml

    from ltbench import report
    from tests.conftest import TINY, deep_update

    path, two = baseline
    one = _train_tiny(path, ["train.threads=0"], tmp_path / "default")  # 0: unset, pinned to 1 on the CPU
    assert one["run_id"] == two["run_id"]
    assert (one["numerics"]["threads"], two["numerics"]["threads"]) == (1, 2)
    assert one["numerics"]["threads_from"].startswith("pinned") and two["numerics"]["threads_from"] == "train.threads"
    assert one["numerics"]["cpu_capability"] and one["numerics"]["device"] == "cpu"
    assert identity.numerics_difference(one["numerics"], two["numerics"]) == (["threads"], [])
    results = tmp_path / "results"
    for name, result in (("ones", one), ("twos", two)):
        shutil.copytree(result["run_dir"], results / name / result["run_id"])
    recipes = {}
    for name in ("ones", "twos", "third"):
        recipes[name] = tmp_path / f"{name}.yaml"
        recipes[name].write_text(yaml.safe_dump(deep_update(TINY, {"optim": {"epochs": 2}})))

    def table(name):
        (t,) = report.tables(recipes[name], results, use_cache=False)
        return t, " ".join(t.rows[0].notes + t.notes)

    for name, mine, other in (("ones", 1, 2), ("twos", 2, 1)):
        t, notes = table(name)
        (used,) = next(iter(t.rows[0].units.values())).runs.values()
        assert used["numerics"]["threads"] == mine  # the recipe's own folder wins
        assert f"{'twos' if name == 'ones' else 'ones'}/ holds another result of this run id, made under other " \
               f"numerics: threads {other} against {mine}" in notes, notes
    t, notes = table("third")
    assert not next(iter(t.rows[0].units.values())).runs  # neither is used: n = 0
    assert "disagree" in notes and "ones/" in notes and "twos/" in notes and "none is used" in notes, notes
    assert "same computation" not in notes


@pytest.mark.slow
def test_editing_engine_code_makes_a_finished_run_stale_and_a_method_docstring_does_not(baseline, tmp_path):
    """The stale rule on a real finished run, checked against a copy of the source tree: a docstring or
    comment edit in the run's method file changes nothing; a code change in train/engine.py makes it stale,
    in ``status`` too."""
    import shutil

    from ltbench.results import store
    from ltbench.run.run_status_view import describe_run

    _, base = baseline
    result = json.loads((Path(base["run_dir"]) / "result.json").read_text())
    assert result["code_scope"] == code.CODE_SCOPE
    assert {"ltbench.train.engine", "ltbench.data.transforms", "ltbench.evaluation", "ltbench.seeding",
            "ltbench.samplers.uniform", "ltbench.config", "methods.ce", "ltbench.backbones"} <= set(result["code"])
    assert not any(code.is_excluded(m) for m in result["code"])  # report/, run/, results/ ... never make it stale
    tree = tmp_path / "tree"
    for package in ("ltbench", "methods"):
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    moved = {**result, "plugins": {p: f"{identity.PLUGIN_FOLDER_SOURCE}{tree / p}" for p in ("ltbench", "methods")}}
    assert identity.code_state(moved).status == "done"
    method = tree / "methods" / "ce.py"
    method.write_text(method.read_text().replace('"""Cross-entropy', '"""An edited docstring.\n\nCross-entropy', 1)
                      + "\n# a comment added at the end\n")
    assert identity.code_state(moved).status == "done"
    engine = tree / "ltbench" / "train" / "engine.py"
    assert "s.iteration += 1" in engine.read_text()
    engine.write_text(engine.read_text().replace("s.iteration += 1", "s.iteration += 2", 1))
    assert identity.code_state(moved) == identity.CodeState("stale", ("ltbench.train.engine",))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / store.RESULT).write_text(json.dumps(moved))
    assert describe_run(run_dir, listed=True)[0] == "stale"
    assert "code changed since: ltbench.train.engine" in describe_run(run_dir, listed=True)[1]
