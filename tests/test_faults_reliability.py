"""Issue 32: reliability by mechanism. One test (or one parametrized family) per mechanism, each on a case the
issue does not list, each failing on the code before it (main 2199fab): caches that can only speed a command
up, one result schema, I/O faults that leave a run resumable, plugin calls contained, memory and devices
checked before the first run, hints that lead somewhere, and a launch's report that does not depend on the
order of events."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ltbench import report
from ltbench.errors import DiskFullError
from ltbench.recipe import load_recipe
from ltbench.results import caches, identity, status_rule, store
from cachekit import edit_json_cache, edit_keeping_seal, index_parts, runs_edit, write_index
from reportkit import populate, write_run
from tests.conftest import ROOT, caches_in_the_results_folder, registries_restored


@pytest.fixture(autouse=True)
def _caches_in_the_results_folder():
    with caches_in_the_results_folder():  # tests/conftest.py says why
        yield


def cli_main(*args, env: dict | None = None) -> tuple[int, str, str]:
    """``ltbench ARGS`` in this process: rc, stdout, stderr."""
    from ltbench.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([str(a) for a in args])
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def fake_tree(write_recipe):
    """A recipe of 2 methods x 3 seeds whose runs are hand-written results with real run ids."""
    path = write_recipe(extra={"seeds": [0, 1, 2], "grid": {"method": [{"name": "ce"}, {"name": "la", "tau": 1.0}]}})
    recipe = load_recipe(path)
    populate(recipe)
    return path, recipe


# ------------------------------------------------------------------------------------------------
# 1. A cache can only make a command faster: one whose seal does not verify (forged without the key, edited with
#    its seal kept) is rebuilt, never shown; writes best effort


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _tables_cache_moves_a_seed(root: Path) -> None:
    (cache,) = root.glob(".ltbench-expansion-*")
    edit_json_cache(cache, lambda d: d["expected"][0].__setitem__(2, 2))  # seed 0's run claims seed 2


def _tables_cache_edits_a_row(root: Path) -> None:
    (cache,) = root.glob(".ltbench-expansion-*")

    def edit(d):  # rows of configurations (now), or flattened ones (the cache of 2199fab)
        if "rows" in d:
            next(iter(d["rows"].values()))["optim"]["epochs"] = 7
        else:
            next(iter(d["flats"].values()))["optim.epochs"] = 7
    edit_json_cache(cache, edit)


def _index_gives_a_run_another_runs_id(root: Path) -> None:
    from ltbench.report import index

    path = root / index.INDEX_FILE
    meta, values = index_parts(path)
    first, second = list(meta["runs"].values())[:2]
    first[1]["run_id"] = second[1]["run_id"]  # one seed counted twice, another missing
    write_index(path, meta, values)


@pytest.mark.parametrize("forge", [_tables_cache_moves_a_seed, _tables_cache_edits_a_row, _index_gives_a_run_another_runs_id])
def test_a_forged_cache_entry_is_rebuilt_and_never_shown(fake_tree, forge):
    path, recipe = fake_tree
    clean = report.render(report.tables(path)[0], "markdown")
    forge(recipe.root)
    assert report.render(report.tables(path)[0], "markdown") == clean


def test_a_runs_cache_with_an_edited_option_is_expanded_again(fake_tree):
    path, recipe = fake_tree
    clean = cli_main("status", path)
    (cache,) = recipe.root.glob(".ltbench-expansion-*")
    edit_json_cache(cache, runs_edit(lambda runs: runs[0]["config"]["data"].__setitem__("imb_factor", 2.0)))
    assert cli_main("status", path) == clean
    edit_json_cache(cache, runs_edit(lambda runs: runs[0]["config"]["train"].__setitem__("threads", -3)))
    assert cli_main("status", path) == clean


def _foreign_run(runs):
    """A self-consistent entry the recipe never had: seed 31337, lr 0.5, its own id and folder."""
    spec = json.loads(json.dumps(runs[0]))
    spec["config"]["seed"], spec["config"]["optim"]["lr"] = 31337, 0.5
    spec["run_id"] = identity.config_id(spec["config"])
    spec["run_dir"] = str(Path(spec["run_dir"]).parent / spec["run_id"])
    runs[-1] = spec


@pytest.mark.parametrize("edit", ["drop", "swap"])
def test_a_runs_cache_edited_with_its_seal_kept_is_rebuilt_and_status_agrees_with_run(fake_tree, edit):
    path, recipe = fake_tree
    clean = cli_main("status", path)
    (cache,) = recipe.root.glob(".ltbench-expansion-*")
    edit_keeping_seal(cache, runs_edit((lambda runs: runs.pop()) if edit == "drop" else _foreign_run))
    rc, out, err = cli_main("status", path)
    assert (rc, out, err) == clean and "31337" not in out
    listed = {line.split()[0] for line in out.splitlines()[:-1]}
    planned = {line.split()[0] for line in cli_main("run", path, "--dry-run")[1].splitlines()[1:]}
    assert listed == planned == {spec.run_id for spec in recipe.runs}


@pytest.mark.parametrize("cache_kind", ["tables", "index"])
def test_a_table_cache_edited_with_its_seal_kept_is_rebuilt(fake_tree, cache_kind):
    from ltbench.report import index

    path, recipe = fake_tree
    clean = report.render(report.tables(path)[0], "markdown")
    if cache_kind == "tables":
        (cache,) = recipe.root.glob(".ltbench-expansion-*")
        edit_keeping_seal(cache, lambda d: d["expected"].pop())  # 'la' shown 2/3, or gone
    else:
        cache = recipe.root / index.INDEX_FILE
        seal = cache.read_bytes().partition(b"\n")[0]
        meta, values = index_parts(cache)
        first, second = list(meta["runs"].values())[:2]
        second[1] = dict(first[1])  # a self-consistent record in another run's place: one seed twice
        write_index(cache, meta, values)
        cache.write_bytes(seal + b"\n" + cache.read_bytes().partition(b"\n")[2])
    assert report.render(report.tables(path)[0], "markdown") == clean


@pytest.mark.parametrize("fault", [errno.EDQUOT, errno.EACCES, "disk full"])
def test_a_cache_write_that_fails_leaves_the_output_unchanged_with_one_note(fake_tree, monkeypatch, fault):
    path, recipe = fake_tree
    expected = {cmd: cli_main(cmd, path)[1] for cmd in ("table", "status")}
    for cache in recipe.root.glob(".ltbench-*"):
        cache.unlink()
    real = store.atomic_write_bytes

    def refuse(target, data):
        if Path(target).name.startswith(".ltbench-"):
            if fault == "disk full":
                raise DiskFullError(f"no space left writing {target}")
            raise OSError(fault, os.strerror(fault), str(target))
        return real(target, data)

    monkeypatch.setattr(store, "atomic_write_bytes", refuse)
    rules = sys.modules.get("ltbench.results.caches")  # loaded by the commands above: its note not yet given
    if rules is not None:
        monkeypatch.setattr(rules, "_noted", [])
    notes = []
    for cmd in ("table", "status", "table"):
        rc, out, err = cli_main(cmd, path)
        assert rc == 0 and out == expected[cmd], err
        notes += err.splitlines()
    assert len(notes) == 1 and "cache not written" in notes[0], notes  # at most one note per process
    assert not list(recipe.root.glob(".ltbench-*"))


# ------------------------------------------------------------------------------------------------
# 2. One schema, every field any command reads: a damaged result is named, healthy rows still print


@pytest.mark.parametrize("change, field", [
    (lambda r: r["metrics"].__setitem__("test_sets", ["forward50"]), "metrics.test_sets"),
    (lambda r: (r["metrics"].__setitem__("val", {"all": 0.5, "per_class": [0.5, 2.0, 0.5, 0.5]}),
                r["data"].__setitem__("class_counts_val", [1, 1, 1, 1])), "metrics.val.per_class"),
    (lambda r: r.__setitem__("selection", {"strategy": "oracle", "epoch": 2}), "selection.strategy"),
    (lambda r: r["metrics"].__setitem__("groups", {"many_threshold": "10"}), "metrics.groups.many_threshold"),
    (lambda r: r.__setitem__("code", {"methods.la": {"path": 5, "sha256": "x"}}), "code.methods.la"),
    (lambda r: r["config"]["optim"].__setitem__("batch_size", 1), "config.optim.batch_size"),
])
def test_a_result_damaged_in_any_field_is_named_and_the_healthy_rows_print(fake_tree, change, field):
    path, recipe = fake_tree
    spec = next(s for s in recipe.runs if s.config["method"]["name"] == "la" and s.seed == 1)
    result = Path(spec.run_dir) / store.RESULT
    _edit_json(result, change)
    check = store.check_result(Path(spec.run_dir))
    assert check.state == "unusable" and field in check.reason, check
    for cmd in ("table", "status"):
        rc, out, err = cli_main(cmd, path)
        assert rc == 0 and not err, err
        assert field in out and "damaged" in out or "seed(s) 1" in out, out
    rc, out, _ = cli_main("table", path)
    assert "| ce " in out and "3/3" in out and "2/3" in out  # CE whole, LA counted without its damaged seed


def _extras(value):
    return lambda r: r.__setitem__("method_extras", {"weight_norm": [1.0, 2.0, value, 1.5], "note": "x"})


@pytest.mark.parametrize("change, reason", [
    (lambda r: (r["data"].__setitem__("class_counts_test", [10, 10, 10, 10]), r["metrics"].__setitem__("all", 0.99)),
     "metrics.all is 0.99, its per-class accuracies give"),
    (lambda r: r["metrics"].__setitem__("medium", 0.9), "metrics.medium is 0.9, its classes' accuracies give"),
    (lambda r: r["data"].__setitem__("class_counts_train", [9, 8, 6, 3]), "but no many-shot class has test images"),
    (lambda r: r["metrics"].__setitem__("macro", 0.2), "metrics.macro is 0.2"),
    (_extras(float("nan")), "method_extras.weight_norm holds nan"),
    (_extras(1e308), "method_extras.weight_norm holds 1e+308"),
    (_extras(-5.0), "method_extras.weight_norm holds -5.0, expected a number >= 0"),
])
def test_a_record_that_contradicts_itself_is_damaged_named_once_and_never_shown(fake_tree, change, reason):
    from ltbench.report import frames

    path, recipe = fake_tree
    spec = next(s for s in recipe.runs if s.config["method"]["name"] == "la" and s.seed == 1)
    for s in recipe.runs:  # every record with healthy extras, so a figure would draw them
        _edit_json(Path(s.run_dir) / store.RESULT, _extras(2.5))
    _edit_json(Path(spec.run_dir) / store.RESULT, change)
    check = store.check_result(Path(spec.run_dir))
    assert check.state == "unusable" and reason in check.reason, check.reason
    rc, out, err = cli_main("status", path)
    assert rc == 0 and out.count(reason) == 1 and "damaged" in out, out
    rc, out, _ = cli_main("table", path)
    assert "| ce " in out and "3/3" in out and "2/3" in out  # LA counted without its damaged seed
    stats = frames.load(path).class_stats
    assert set(stats["seed"][stats["row"].str.startswith("la")]) == {0, 2}  # never plotted


@pytest.mark.parametrize("how", ["owner gone", "stopped by a fault"])
def test_status_and_table_agree_that_a_stopped_run_is_interrupted(fake_tree, how):
    import socket

    path, recipe = fake_tree
    spec = next(s for s in recipe.runs if s.config["method"]["name"] == "ce" and s.seed == 2)
    (Path(spec.run_dir) / store.RESULT).unlink()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    started = {"pid": int(gone.stdout), "host": socket.gethostname()}
    if how == "stopped by a fault":
        started = {"pid": os.getpid(), "host": socket.gethostname(), "interrupted": "EIO: an I/O fault"}
    (Path(spec.run_dir) / store.STARTED).write_text(json.dumps(started))
    rc, out, _ = cli_main("status", path)
    assert f"{spec.run_id}  interrupted" in out, out
    rc, out, _ = cli_main("table", path)
    assert "seed 2 interrupted" in out and "still running" not in out, out


# ------------------------------------------------------------------------------------------------
# 3. A run's failure is the computation's: I/O faults interrupt, loggers never fail a run, no endless redo


@pytest.mark.parametrize("fault", [errno.EIO, errno.EFBIG])
def test_an_io_fault_on_a_checkpoint_leaves_the_run_interrupted_and_the_advised_command_resumes_it(
        write_recipe, monkeypatch, fault):
    real_fsync, seen = os.fsync, []

    def fsync(fd):  # the device fails while the second epoch's checkpoint is written
        target = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else ""
        if ".checkpoint.pt.tmp-" in target:
            seen.append(target)
            if len(seen) == 2:
                raise OSError(fault, os.strerror(fault))
        return real_fsync(fd)

    path = write_recipe(extra={"optim": {"epochs": 3}})
    (spec,) = load_recipe(path).runs
    run_dir = Path(spec.run_dir)
    monkeypatch.setattr(os, "fsync", fsync)
    rc, out, err = cli_main("run", path)
    assert rc == 2 and "interrupted, not failed" in err and "checkpoint.pt" in err, out + err
    assert os.strerror(fault) in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (run_dir / store.RESULT).exists()
    rc, out, _ = cli_main("status", path)
    assert "interrupted  " in out and "stopped by" in out and "ltbench run RECIPE" in out, out
    assert err.strip().endswith("it keeps its last checkpoint: fix that, then run the same command again to resume it")
    monkeypatch.undo()  # the device healthy again
    rc, out, err = cli_main("run", path)  # the same command
    assert rc == 0 and "resuming from checkpoint: epoch 1, step 0" in out, out + err
    assert status_rule.run_status(run_dir) == "done"


def test_a_logger_that_fails_while_logging_is_dropped_and_the_run_is_done(write_recipe, monkeypatch):
    from ltbench.train import loggers

    class Broken:
        def __init__(self, run_dir, spec):
            pass

        def log(self, values, step):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            raise RuntimeError("already gone")

    monkeypatch.setitem(loggers.LOGGERS, "tensorboard", Broken)
    path = write_recipe(extra={"train": {"loggers": ["tensorboard"]}})
    rc, out, err = cli_main("run", path)
    assert rc == 0, out + err
    assert "tensorboard failed in log() (OSError" in out and "goes on without it" in out
    (spec,) = load_recipe(path).runs
    assert status_rule.run_status(Path(spec.run_dir)) == "done"


def test_an_unusable_tensorboard_folder_is_refused_before_training(write_recipe):
    path = write_recipe(extra={"train": {"loggers": ["tensorboard"]}})
    (spec,) = load_recipe(path).runs
    Path(spec.run_dir).mkdir(parents=True)
    (Path(spec.run_dir) / "tensorboard").symlink_to("/dev/null")
    for args in (["--dry-run"], []):
        rc, out, err = cli_main("run", path, *args)
        assert rc == 2 and "'tensorboard' writes into" in err and "not a folder" in err, err
    assert not (Path(spec.run_dir) / store.STARTED).exists()


HUGE_EXTRAS = '''
from ltbench.registry import METHODS
from methods.ce import CrossEntropy as CE

@METHODS.register("ce_huge_extras")
class CEHugeExtras(CE):
    """Cross-entropy that reports 70 MB about itself: more than a result.json may hold."""

    def result_extras(self):
        return {"blob": "x" * 70_000_000}
'''


def test_a_record_too_large_to_read_back_is_a_small_failed_record_never_redone(tmp_path, write_recipe):
    (tmp_path / "hugeplug").mkdir()
    (tmp_path / "hugeplug" / "huge.py").write_text(HUGE_EXTRAS)
    path = write_recipe(extra={"plugins": ["./hugeplug"], "method": {"name": "ce_huge_extras"},
                               "optim": {"epochs": 1}})
    rc, out, err = cli_main("run", path)
    assert rc == 1, out + err
    (spec,) = load_recipe(path).runs
    check = store.check_result(Path(spec.run_dir))
    assert check.state == "failed" and "'method_extras' takes 67 MiB" in check.result["error"], check
    assert (Path(spec.run_dir) / store.RESULT).stat().st_size < 1_000_000
    rc, out, err = cli_main("run", path)
    assert "0 to run" in out  # recorded once, not trained again on every launch


# ------------------------------------------------------------------------------------------------
# 4. Plugin calls contained: one line naming plugin and hook, exit 2; returns checked; discovery bounded


BAD_DATASETS = '''
import os, sys
from dataclasses import dataclass
from ltbench.config import check_range
from ltbench.data.synthetic import SyntheticLT, SyntheticLTConfig
from ltbench.registry import DATASETS, METHODS
from methods.ce import CEConfig, CrossEntropy as CE

@DATASETS.register("check_keyerror")
class CheckKeyError(SyntheticLT):
    def check(self):
        return {}["root"]

@DATASETS.register("identity_too_long")
class IdentityTooLong(SyntheticLT):
    def data_identity(self):
        return "f" * 5000

@DATASETS.register("identity_exits_in_check")
class ExitsInCheck(SyntheticLT):
    def check(self):
        sys.exit(3)

@dataclass
class StrictConfig(CEConfig):
    def validate(self):
        raise LookupError("no such table")

@METHODS.register("ce_strict")
class CEStrict(CE):
    Config = StrictConfig
'''


@pytest.mark.parametrize("section, words", [
    ({"data": {"name": "check_keyerror"}}, "dataset 'check_keyerror' (module badplugs.bad): check() raised KeyError"),
    ({"data": {"name": "identity_too_long"}}, "data_identity() returned 5000 items or characters, at most 1000"),
    ({"data": {"name": "identity_exits_in_check"}}, "check() called sys.exit(3)"),
    ({"method": {"name": "ce_strict"}}, "method 'ce_strict' (module badplugs.bad): Config / validate() raised LookupError"),
])
def test_a_plugin_hook_that_raises_exits_or_returns_junk_is_one_line_naming_it(tmp_path, write_recipe, section, words):
    (tmp_path / "badplugs").mkdir()
    (tmp_path / "badplugs" / "bad.py").write_text(BAD_DATASETS)
    path = write_recipe(extra={"plugins": [str(tmp_path / "badplugs")], **section})
    with registries_restored():
        for args in (["run", path, "--dry-run"], ["run", path]):
            rc, out, err = cli_main(*args)
            assert rc == 2 and words in err, out + err
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not list((tmp_path / "results").rglob(store.STARTED))


def test_discovery_skips_editor_files_and_walks_no_folder_it_cannot_import(tmp_path, write_recipe, monkeypatch):
    from ltbench.recipe import expansion

    folder = tmp_path / "edplugs"
    folder.mkdir()
    (folder / "real.py").write_text("from ltbench.registry import METHODS\nfrom methods.ce import CrossEntropy as CE\n"
                                    "METHODS.register('ce_real')(type('CEReal', (CE,), {}))\n")
    (folder / "#real.py").write_text("raise SystemExit('an autosave was imported')\n")
    (folder / "real.py~").write_text("raise SystemExit('a backup was imported')\n")
    os.symlink("someone@host.1234:1700000000", folder / ".#real.py")  # emacs' lock: a dangling symlink
    data = folder / "data" / "deep"  # a folder of data beside the plugins: no package, never walked
    data.mkdir(parents=True)
    for i in range(50):
        (data / f"s{i}.py").write_text("")
    path = write_recipe(extra={"plugins": [str(folder)], "method": {"name": "ce_real"}})
    walked = []
    real_scandir = os.scandir
    monkeypatch.setattr(expansion.os, "scandir", lambda p: walked.append(str(p)) or real_scandir(p))
    assert not [p for p in caches.plugin_code_files(folder) if "deep" in p or "#" in p or "~" in p]
    assert str(data) not in walked
    assert caches.plugin_code_files(Path("/")) == []  # LTBENCH_PLUGIN_PATH=/: nothing walked
    with registries_restored():
        for args in (["run", path, "--dry-run"], ["status", path], ["table", path]):
            rc, out, err = cli_main(*args)
            # a table of a never-launched recipe says there is no results folder (exit 2), after discovery
            expected = (2, "no results folder") if args[0] == "table" else (0, "")
            assert rc == expected[0] and expected[1] in err and "imported" not in err, (args, out + err)


# ------------------------------------------------------------------------------------------------
# 5 and 6. Memory and devices: --dry-run refuses what run refuses, before the first run


@pytest.mark.parametrize("extra, words", [
    ({"backbone": {"name": "resnet32"}, "data": {"image_size": 256}, "optim": {"batch_size": 8192}},
     "lower optim.batch_size (8192)"),
    # a test split under the synthetic dataset's own 1 GiB bound, whose drawing (float32 noise) takes about 18 GiB
    ({"data": {"num_classes": 1000, "test_per_class": 1000, "image_size": 16}}, "lower the data: options"),
])
def test_a_configuration_that_cannot_fit_in_memory_is_refused_by_dry_run_and_run(write_recipe, extra, words):
    path = write_recipe(extra=extra)
    for args in (["--dry-run"], []):
        rc, out, err = cli_main("run", path, *args, env={"LTBENCH_MEMORY_GB": "8"})
        assert rc == 2 and words in err and "more than $LTBENCH_MEMORY_GB (8.0 GiB" in err, err
        assert len(err.strip().splitlines()) == 1
    rc, out, err = cli_main("run", path, "--dry-run", env={"LTBENCH_MEMORY_GB": "100000"})  # the hint, followed
    assert rc == 0, err


def test_gpus_are_what_torch_sees_and_dry_run_refuses_a_gpu_pool_without_them(write_recipe, monkeypatch):
    import torch

    from ltbench.run import local_pool

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5e1f,1")
    if not torch.cuda.is_available():
        assert local_pool.visible_gpus() == []
        path = write_recipe(extra={"launcher": {"runs_per_gpu": 2}})
        rc, out, err = cli_main("run", path, "--dry-run")
        assert rc == 2 and "runs_per_gpu: 2 needs GPUs, but torch sees none" in err, out + err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert local_pool.visible_gpus() == ["GPU-5e1f"]  # the variable names which; torch says how many
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert local_pool.visible_gpus() == ["0"]


# ------------------------------------------------------------------------------------------------
# 7. Messages that lead somewhere


def test_a_nested_field_error_names_the_field_inside(write_recipe):
    from ltbench.errors import ConfigError

    bad = {"t": {"rows": [{"label": "CE", "where": {"method.name": "ce"}},
                          {"label": "LA", "where": {"method.name": "la"}, "marks": {"x": "yes"}, "versus": [["CE"]]}]}}
    with pytest.raises(ConfigError, match=r"tables\.t\.rows\[1\]\.versus\[0\]: expected a string"):
        load_recipe(write_recipe(extra={"tables": bad, "grid": {"method": [{"name": "ce"}, {"name": "la"}]}}))


def test_wandb_without_credentials_is_refused_and_the_advised_setting_starts_it(write_recipe, monkeypatch, tmp_path):
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    path = write_recipe(extra={"train": {"loggers": ["wandb"]}})
    rc, out, err = cli_main("run", path, "--dry-run")
    assert rc == 2 and "set WANDB_MODE=offline" in err, err
    rc, out, err = cli_main("run", path, "--dry-run", env={"WANDB_MODE": "offline"})
    assert rc == 0, err


def test_posthoc_over_best_val_runs_is_refused_where_it_would_lead_nowhere(write_recipe):
    from ltbench.errors import ConfigError

    path = write_recipe(extra={"data": {"val_per_class": 2}, "eval": {"select": "best_val"},
                               "posthoc": [{"name": "la_posthoc", "tau": [1.0]}]})
    with pytest.raises(ConfigError, match="set eval.select: last"):
        load_recipe(path)
    load_recipe(path, ["eval.select=last"])  # what the message says


# ------------------------------------------------------------------------------------------------
# 8. A launch's report does not depend on the order of events (locks, not timing)


def test_a_launch_reports_only_the_runs_held_elsewhere_whatever_was_finished_before(write_recipe):
    path = write_recipe(extra={"seeds": [0, 1, 2, 3], "optim": {"epochs": 1}})
    runs = load_recipe(path).runs
    for spec in runs[:2]:  # finished before this launch started
        write_run(spec)
    Path(runs[2].run_dir).mkdir(parents=True)
    holder = subprocess.Popen(  # another process holds run 2 for as long as this test needs
        [sys.executable, "-c", "import sys; from ltbench.results import store; c = store.claim_run(sys.argv[1]); "
         "print('held', flush=True); sys.stdin.read()", runs[2].run_dir],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        rc, out, err = cli_main("run", path)
    finally:
        holder.stdin.close()
        holder.wait()
    assert rc == 0, out + err
    assert "4 run(s), 2 to run, 2 already finished" in out
    assert "\n1 run(s) were being run by another process" in out, out  # run 2; runs 0, 1 were finished before
