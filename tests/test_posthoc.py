"""Stage 2 on frozen features: the feature cache, the stage-2 contract, reproduction of trained heads,
the recipe section, storage next to the run, and tables over stage-2 rows (docs/posthoc.md)."""

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch

from ltbench.stage2 import features
from ltbench.results import identity, store
from ltbench.errors import ConfigError, LtbenchError
from ltbench.posthoc import create_posthoc, expand_posthoc
from ltbench.results.identity import posthoc_id
from ltbench.stage2.posthoc_runs import evaluate_posthoc, load_frozen, run_posthoc
from ltbench.results.predictions import load_predictions
from ltbench.registry import POSTHOC
from tests.test_slurm_submit import fake_sbatch  # noqa: F401 - a fixture: sbatch that records its calls

BAPE = {"name": "bape", "aux": {"name": "la"}, "aux_views": ["default"], "bape_views": ["default", "default"],
        "proj_dim": 8, "hidden_dim": 16, "alpha_hat": 40.0, "beta_hat": 8.0}
GRID = [{"name": "la_posthoc", "tau": [0.0, 1.0]}, {"name": "tau_norm", "tau": [0.0, 1.0]}, {"name": "crt", "epochs": 3},
        {"name": "lws", "epochs": 3}, {"name": "bape_refit", "alpha_hat": [0.0, 10.0], "kappa_solver": ["sra", "newton"]}]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny finished CE, LA and BAPE runs (one seed) with a shifted test set and target priors (a few seconds)."""
    import yaml

    from ltbench.run.local_pool import run_local
    from ltbench.recipe import load_recipe
    from tests.conftest import TINY, deep_update

    tmp = tmp_path_factory.mktemp("posthoc")
    recipe = deep_update(TINY, {"results_dir": str(tmp / "results"),
                                "grid": {"method": [{"name": "ce"}, {"name": "la", "tau": 1.0}, BAPE]},
                                "eval": {"test_sets": ["forward5"], "target_priors": ["forward5", "backward5"]},
                                "posthoc": GRID,
                                "tables": {"t": {"rows": [
                                    {"label": "CE", "where": {"method.name": "ce"}},
                                    {"label": "CE + tau-norm 1", "where": {"method.name": "ce", "posthoc.name": "tau_norm",
                                                                           "posthoc.tau": 1.0}}]}}})
    path = tmp / "tiny.yaml"
    path.write_text(yaml.safe_dump(recipe))
    loaded = load_recipe(path)
    run_local(loaded.runs)
    dirs = {spec.config["method"]["name"]: spec.run_dir for spec in loaded.runs}
    for run_dir in dirs.values():
        features.extract_features(run_dir, say=lambda m: None)
    return {"recipe": loaded, "path": path, "dirs": dirs}


def frozen_of(runs, method):
    return load_frozen(runs["dirs"][method])


# ------------------------------------------------------------------------------------------------
# The feature cache


def test_features_reproduce_the_runs_own_test_predictions(runs):
    """The cache holds the model the result was computed from: the trained head on cached test features
    gives the run's stored argmax on every test image."""
    for name in ("ce", "la", "bape"):
        frozen = frozen_of(runs, name)
        test = frozen.splits["test"]
        k = frozen.num_classes
        pred = frozen.method.predict(test.features, target_prior=torch.full((k,), 1.0 / k)).argmax(1).numpy()
        stored = load_predictions(runs["dirs"][name])
        assert np.array_equal(pred, stored["head:main"])
        assert frozen.train.features.shape[0] == sum(json.loads(
            (features.Path(runs["dirs"][name]) / store.RESULT).read_text())["data"]["class_counts_train"])
    assert frozen_of(runs, "bape").train.z.shape[1] == 8 and frozen_of(runs, "ce").train.spaces == {}


def test_a_stage2_method_asks_for_a_feature_space_by_name(runs, monkeypatch):
    """The cache holds what the run's method declares (Method.feature_spaces); a stage-2 method needing a
    space the run's method does not provide is refused with a ConfigError naming both, before any fit."""
    ce, bape = frozen_of(runs, "ce"), frozen_of(runs, "bape")
    assert sorted(bape.method.feature_spaces()) == sorted(bape.train.spaces) == ["z"]
    with pytest.raises(ConfigError, match=r"feature space 'z'.*provides: none"):
        ce.train.space("z")
    monkeypatch.setattr(POSTHOC.get("la_posthoc"), "needs_spaces", ("z",))
    with pytest.raises(ConfigError, match=r"posthoc 'la_posthoc' needs the feature space\(s\) z.*method 'ce'"):
        create_posthoc({"name": "la_posthoc"}, ce, seed=0)
    create_posthoc({"name": "la_posthoc"}, bape, seed=0)  # the BAPE run provides z


def test_a_cache_without_a_declared_space_is_unusable_never_misread(runs, tmp_path, monkeypatch):
    """A cache extracted before the method declared a space (or with one it no longer declares) does not
    load as if it matched: UnusableFile, which 'ltbench posthoc' answers by extracting again."""
    from ltbench.results import store

    run_dir = tmp_path / "run"
    shutil.copytree(runs["dirs"]["ce"], run_dir, ignore=shutil.ignore_patterns("posthoc"))
    method_class = type(frozen_of(runs, "ce").method)
    monkeypatch.setattr(method_class, "feature_spaces", lambda self: {"doubled": lambda h: 2 * h}, raising=False)
    with pytest.raises(store.UnusableFile, match=r"feature spaces \[\], the run's method declares \[doubled\]"):
        load_frozen(run_dir)
    shutil.rmtree(run_dir / features.FEATURES_DIR)
    features.extract_features(run_dir, say=lambda m: None)
    frozen = load_frozen(run_dir)
    assert torch.equal(frozen.train.space("doubled"), 2 * frozen.train.features)


def test_a_feature_space_may_not_take_a_reserved_name(runs, monkeypatch):
    method = frozen_of(runs, "ce").method
    monkeypatch.setattr(type(method), "feature_spaces", lambda self: {"labels": lambda h: h}, raising=False)
    with pytest.raises(LtbenchError, match="feature_spaces\\(\\) names 'labels'"):
        features.declared_spaces(method)


def test_extraction_is_idempotent_and_resumes(runs, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    shutil.copytree(runs["dirs"]["ce"], run_dir, ignore=shutil.ignore_patterns("posthoc", "features"))
    real, calls = features.extract_split, []

    def killed_after_one(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process dies while extracting the second split
        return real(*args, **kwargs)

    monkeypatch.setattr(features, "extract_split", killed_after_one)
    with pytest.raises(KeyboardInterrupt):
        features.extract_features(run_dir, say=lambda m: None)
    folder = run_dir / features.FEATURES_DIR
    assert (folder / "train.npz").is_file() and not (folder / features.META).exists()
    train_mtime = (folder / "train.npz").stat().st_mtime_ns
    monkeypatch.setattr(features, "extract_split", real)
    said = []
    features.extract_features(run_dir, say=said.append)
    assert [m.split("features of ")[1].split(" ")[0] for m in said] == ["test", "test_set:forward5"]  # resumed
    assert (folder / "train.npz").stat().st_mtime_ns == train_mtime and features.is_complete(run_dir)
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    said.clear()
    features.extract_features(run_dir, say=said.append)
    assert said == [] and {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before  # nothing redone


def test_extraction_refuses_unfinished_and_foreign_runs(runs, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(runs["dirs"]["ce"], run_dir, ignore=shutil.ignore_patterns("posthoc", "features"))
    state = torch.load(run_dir / store.CHECKPOINT, weights_only=True)
    torch.save({**state, "run_id": "someoneelse"}, run_dir / store.CHECKPOINT)
    with pytest.raises(LtbenchError, match="belongs to run someoneelse"):
        features.extract_features(run_dir)
    torch.save({**state, "epoch": 1, "step": 3}, run_dir / store.CHECKPOINT)
    with pytest.raises(LtbenchError, match="not at the end"):
        features.extract_features(run_dir)
    record = json.loads((run_dir / store.RESULT).read_text())
    del record["config"]["optim"]  # V14: once KeyError: optim, an internal error
    (run_dir / store.RESULT).write_text(json.dumps(record))
    with pytest.raises(LtbenchError, match="config.optim is missing; stage 2 needs"):
        features.extract_features(run_dir)
    (run_dir / store.RESULT).unlink()
    with pytest.raises(LtbenchError, match="not finished"):
        features.extract_features(run_dir)
    assert not (run_dir / features.FEATURES_DIR).exists()


def test_float16_cache_halves_the_features(runs, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(runs["dirs"]["la"], run_dir, ignore=shutil.ignore_patterns("posthoc", "features"))
    features.extract_features(run_dir, dtype="float16", say=lambda m: None)
    raw = np.load(run_dir / features.FEATURES_DIR / "test.npz")["features"]
    assert raw.dtype == np.float16
    full = np.load(features.Path(runs["dirs"]["la"]) / features.FEATURES_DIR / "test.npz")["features"]
    assert np.allclose(raw.astype(np.float32), full, rtol=2e-3, atol=2e-3)


# ------------------------------------------------------------------------------------------------
# The stage-2 contract and the exactness checks


@pytest.mark.parametrize("name", sorted(POSTHOC.names()))
def test_every_registered_posthoc_method_follows_the_contract(runs, name):
    """Shape, finiteness, and the target-prior rule: None and uniform give the same scores, and a
    one-hot-ish prior moves predictions toward its class."""
    frozen = frozen_of(runs, "la")
    clf = create_posthoc({"name": name}, frozen, seed=0)
    test, k = frozen.splits["test"], frozen.num_classes
    scores = clf.predict(test, target_prior=None)
    assert scores.shape == (len(test), k) and bool(torch.isfinite(scores).all())
    assert torch.equal(scores, clf.predict(test, target_prior=torch.full((k,), 1.0 / k)))
    skewed = torch.full((k,), 1e-3)
    skewed[k - 1] = 1.0
    moved = clf.predict(test, target_prior=skewed).argmax(1)
    assert int((moved == k - 1).sum()) >= int((scores.argmax(1) == k - 1).sum())
    metrics, _ = evaluate_posthoc(clf, frozen, name)
    assert 0 <= metrics["all"] <= 1 and set(metrics["target_priors"]) == {"forward5", "backward5"}


def test_bape_refit_with_the_runs_settings_reproduces_the_trained_bape_head(runs):
    frozen = frozen_of(runs, "bape")
    cfg = frozen.method.cfg
    spec = {"name": "bape_refit", "alpha_hat": cfg.alpha_hat, "beta_ratio": cfg.beta_hat / cfg.alpha_hat,
            "da_mode": cfg.da_mode, "kappa_solver": cfg.kappa_solver, "statistics": "run"}
    assert spec["alpha_hat"] * spec["beta_ratio"] == cfg.beta_hat
    clf = create_posthoc(spec, frozen, seed=0)
    clf_sum = create_posthoc({**spec, "ensemble": "sum"}, frozen, seed=0)
    for split in ("test", "test_set:forward5"):
        inputs = frozen.splits[split]
        for prior in (None, torch.tensor([0.4, 0.3, 0.2, 0.1])):
            trained = frozen.method.head_predictions(inputs.features, target_prior=prior)
            assert torch.equal(clf.predict(inputs, target_prior=prior), trained["bape"])
            assert torch.equal(clf_sum.predict(inputs, target_prior=prior),
                               frozen.method.predict(inputs.features, target_prior=prior))


def test_zero_tau_is_the_plain_head(runs):
    for name in ("ce", "la"):
        frozen = frozen_of(runs, name)
        test = frozen.splits["test"]
        plain = frozen.method.head(test.features)
        la0 = create_posthoc({"name": "la_posthoc", "tau": 0.0}, frozen, seed=0).predict(test)
        tn0 = create_posthoc({"name": "tau_norm", "tau": 0.0, "keep_bias": True}, frozen, seed=0).predict(test)
        assert torch.equal(la0, plain) and torch.equal(tn0, plain)
        dropped = create_posthoc({"name": "tau_norm", "tau": 0.0}, frozen, seed=0).predict(test)
        assert torch.allclose(dropped, plain - frozen.method.head.bias, atol=1e-5)


def test_crt_and_lws_are_deterministic_per_seed(runs):
    frozen = frozen_of(runs, "ce")
    test = frozen.splits["test"]
    for name in ("crt", "lws"):
        a = create_posthoc({"name": name, "epochs": 3}, frozen, seed=0).predict(test)
        b = create_posthoc({"name": name, "epochs": 3}, frozen, seed=0).predict(test)
        c = create_posthoc({"name": name, "epochs": 3}, frozen, seed=1).predict(test)
        assert torch.equal(a, b) and not torch.equal(a, c)


def test_bape_refit_on_a_non_bape_run_is_a_vmf_classifier_on_normalised_features(runs):
    frozen = frozen_of(runs, "ce")
    ml = create_posthoc({"name": "bape_refit", "alpha_hat": 0.0, "da_mode": "none"}, frozen, seed=0)
    unit = torch.nn.functional.normalize(frozen.train.features, dim=1)
    for c in range(frozen.num_classes):
        assert torch.allclose(ml.clf.stats.mean[c].float(), unit[frozen.train.labels == c].mean(0), atol=1e-6)
    newton = create_posthoc({"name": "bape_refit", "alpha_hat": 0.0, "da_mode": "none", "kappa_solver": "newton"},
                            frozen, seed=0)
    assert all(n < s for n, s in zip(newton.result_extras()["kappa"], ml.result_extras()["kappa"]))  # Sra is high
    with pytest.raises(LtbenchError, match="needs a BAPE run"):
        create_posthoc({"name": "bape_refit", "statistics": "run"}, frozen, seed=0)


# ------------------------------------------------------------------------------------------------
# Recipe section, storage, tables


def test_posthoc_section_expands_lists_and_validates():
    specs = expand_posthoc([{"name": "tau_norm", "tau": [0, 1]}, {"name": "tau_norm", "tau": 1.0}])
    assert [s["tau"] for s in specs] == [0, 1]  # the duplicate counted once
    assert specs[0] == {"name": "tau_norm", "tau": 0, "keep_bias": False}
    with pytest.raises(ConfigError, match=r"posthoc\[0\]\.tau"):
        expand_posthoc([{"name": "la_posthoc", "tau": -1.0}])
    with pytest.raises(ConfigError, match=r"posthoc\[0\]\.name: unknown posthoc method 'tau_nrom'.*tau_norm"):
        expand_posthoc([{"name": "tau_nrom"}])
    with pytest.raises(ConfigError, match=r"posthoc\[0\]"):
        expand_posthoc([{"name": "bape_refit", "da_mode": "sideways"}])


def test_posthoc_command_stores_results_next_to_runs_and_is_idempotent(runs):
    recipe = runs["recipe"]
    said = []
    totals = run_posthoc(recipe.runs, recipe.posthoc, say=said.append)
    n = len(recipe.posthoc)
    assert totals == {"unfinished": 0, "already": 0, "done": 3 * n, "failed": 0}
    again = run_posthoc(recipe.runs, recipe.posthoc, say=said.append)
    assert again == {"unfinished": 0, "already": 3 * n, "done": 0, "failed": 0}
    spec = recipe.posthoc[0]
    run = recipe.runs[0]
    result = json.loads((features.Path(run.run_dir) / "posthoc" / posthoc_id(spec) / store.RESULT).read_text())
    assert result["posthoc_of"] == run.run_id and result["config"]["posthoc"] == spec
    assert result["run_id"] == identity.stage2_run_id(run.run_id, spec)
    assert store.check_result(features.Path(run.run_dir) / "posthoc" / posthoc_id(spec)).state == "done"
    assert set(result["metrics"]) >= {"all", "many", "medium", "few", "per_class", "target_priors", "test_sets"}
    out = features.Path(run.run_dir) / "posthoc" / posthoc_id(spec)
    (out / store.RESULT).write_text(json.dumps({**result, "features": {"checkpoint_sha256": "another"}}))
    assert run_posthoc(recipe.runs, recipe.posthoc, say=said.append)["done"] == 1  # fitted on old features: redone
    assert (out / "result.json.stale").is_file() and store.check_result(out).state == "done"


def test_stage2_results_of_changed_stage2_code_are_stale_and_refitted_on_request(runs, cli):
    """The stale rule of runs (identity.changed_code) holds for stage-2 results too: a result whose recorded
    stage-2 module hash differs from the file now is kept and reported, and fitted again with --rerun-stale."""
    recipe = runs["recipe"]
    run_posthoc(recipe.runs, recipe.posthoc, say=lambda m: None)
    spec, run = recipe.posthoc[0], recipe.runs[0]
    out = features.Path(run.run_dir) / "posthoc" / posthoc_id(spec)
    result = json.loads((out / store.RESULT).read_text())
    module = POSTHOC.entry(spec["name"]).module
    code = result["code"]
    assert module in code and not any(features.Path(e.get("path", "")).is_absolute() for e in code.values())
    assert {"ltbench.stage2.posthoc_runs", "ltbench.posthoc", "ltbench.evaluation"} <= set(code)  # all it executed
    assert identity.code_state(result).status == "done" and identity.changed_code(result) == ([], [])
    old = {**result, "code": {**code, module: {**code[module], "normalized": "0" * 64}}}  # fitted by an older version
    (out / store.RESULT).write_text(json.dumps(old))
    kept = run_posthoc(recipe.runs, recipe.posthoc, say=lambda m: None)
    assert kept["stale"] == 1 and kept["done"] == 0 and json.loads((out / store.RESULT).read_text()) == old
    status = cli("status", recipe.path)
    assert "stage 2:" in status.stdout and "1 stale" in status.stdout and module in status.stdout, status.stdout
    assert "1 stage-2 result(s) are stale" in status.stdout and "--rerun-stale" in status.stdout
    redone = run_posthoc(recipe.runs, recipe.posthoc, say=lambda m: None, redo_stale=True)
    assert redone["done"] == 1 and "stale" not in redone
    assert (out / "result.json.stale").is_file() and identity.changed_code(json.loads((out / store.RESULT).read_text())) == ([], [])


def test_unfinished_runs_are_reported_not_skipped(runs, tmp_path):
    recipe = runs["recipe"]
    ghost = dataclasses.replace(recipe.runs[0], run_id="ghost", run_dir=str(tmp_path / "ghost"))
    said = []
    totals = run_posthoc([ghost], recipe.posthoc, say=said.append)
    assert totals == {"unfinished": 1} and "ghost (ce, seed 0) is pending" in said[0]


def test_tables_show_stage2_rows_and_select_them_by_posthoc_keys(runs):
    from ltbench import report

    run_posthoc(runs["recipe"].runs, runs["recipe"].posthoc, say=lambda m: None)
    (table,) = report.tables(runs["path"], use_cache=False)
    plain, tau = table.rows
    assert [u.key for u in plain.units.values()] != [u.key for u in tau.units.values()]
    tau_result = json.loads((features.Path(runs["dirs"]["ce"]) / "posthoc" / posthoc_id(
        {"name": "tau_norm", "tau": 1.0, "keep_bias": False}) / store.RESULT).read_text())
    assert next(iter(tau.units.values())).runs[0]["metrics"]["all"] == tau_result["metrics"]["all"]
    assert table.rows[0].label == "CE" and table.notes[0].startswith("numerics of every result shown")
    assert [n.split(" in ")[0] for n in table.notes[1:]] == ["2 finished run(s) of this recipe"]  # BAPE: in no table
    labels = [r.label for r in report.tables(runs["recipe"].root, use_cache=False)[0].rows]
    assert "CE + tau_norm (tau=1)" in labels and "CE" in labels  # default labels: run label + stage-2 label
    assert "BAPE + bape_refit (alpha_hat=10, kappa_solver=newton)" in labels  # a run's part: its display name


def test_posthoc_command_line_errors_are_one_line(write_recipe, capsys):
    from ltbench.cli import main

    assert main(["posthoc", str(write_recipe("none"))]) == 2
    assert "no stage-2 settings declared" in capsys.readouterr().err
    bad = write_recipe("bad", {"posthoc": [{"name": "crt", "epochz": 3}]})
    assert main(["posthoc", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "posthoc[0]" in err and "epochz" in err and "Traceback" not in err
    assert not (bad.parent / "results").exists()  # nothing written


@pytest.mark.parametrize("name", sorted(POSTHOC.names()))
def test_every_posthoc_method_passes_the_tiny_input_contract_of_ltbench_check(name):
    from ltbench.contract import check_posthoc

    check_posthoc(POSTHOC.get(name), name)


# ------------------------------------------------------------------------------------------------
# Launchers: the same grid through submitit's debug executor, and as a Slurm array (fake sbatch)


def _recipe_with(runs, grid: list[dict], launcher: str):
    import copy

    recipe = copy.deepcopy(runs["recipe"])
    recipe.posthoc, recipe.launcher.name = expand_posthoc(grid), launcher
    return recipe


def test_posthoc_through_the_debug_launcher_stores_what_local_would(runs):
    from ltbench.run.launch import launch_posthoc

    recipe = _recipe_with(runs, [{"name": "la_posthoc", "tau": [0.25, 0.75]}], "debug")
    assert launch_posthoc(recipe) == {"unfinished": 0, "already": 0, "done": 6, "failed": 0}
    for run in recipe.runs:
        for spec in recipe.posthoc:
            assert store.check_result(features.Path(run.run_dir) / "posthoc" / posthoc_id(spec)).state == "done"
    recipe.launcher.name = "local"
    assert launch_posthoc(recipe)["already"] == 6  # the same results, found by the local launcher


def test_posthoc_on_slurm_submits_one_array_task_per_finished_run(runs, fake_sbatch, capsys):
    from ltbench.run.launch import launch_posthoc
    from tests.test_slurm_submit import calls, sbatch_options

    recipe = _recipe_with(runs, [{"name": "tau_norm", "tau": 0.3}], "slurm")
    assert launch_posthoc(recipe) == {"unfinished": 0, "submitted": 3}
    (job_id, script), = calls(fake_sbatch)
    assert sbatch_options(script)["array"] == "0-2%3"  # 3 runs, 3 tasks (parallelism capped at the size)
    assert f"submitted the stage-2 grid of 3 run(s) as slurm job array {job_id}" in capsys.readouterr().out
    spec = recipe.posthoc[0]
    assert not any((features.Path(r.run_dir) / "posthoc" / posthoc_id(spec)).exists() for r in recipe.runs)


def test_figures_frames_leave_stage2_rows_out_unless_asked(runs):
    from ltbench import report

    recipe = runs["recipe"]
    run_posthoc(recipe.runs, recipe.posthoc, say=lambda m: None)  # the declared grid (idempotent)
    trained = set(report.load(runs["path"]).runs["row"].dropna())
    everything = set(report.load(runs["path"], stage2=True).runs["row"].dropna())
    # one row per trained method: figures stay readable; the declared table labels the ce run "CE" (issue 33),
    # the others are labelled with their methods' display names
    assert trained == {"CE", "LA", "BAPE"}
    assert trained < everything and any("la_posthoc" in row for row in everything)
