"""Issue 22: damaged state never stops healthy work, never crashes, never shows as data.

One test (or one parametrized family) per class of the issue, each failing on the code before it
(f4af738). Real runs where the class is about runs (a tiny tree trained once per module; those tests
are marked slow); hand-written result trees (tests/reportkit.py) where it is about reading results.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from ltbench.stage2 import features
from ltbench import report
from ltbench.results import store
from ltbench.errors import ConfigError, LtbenchError
from cachekit import index_parts, read_json_cache, write_index, write_json_cache
from reportkit import populate
from tests.conftest import ROOT, TINY, caches_in_the_results_folder, deep_update, run_cli


@pytest.fixture(scope="module", autouse=True)
def _caches_in_the_results_folder():
    with caches_in_the_results_folder():  # tests/conftest.py says why
        yield

STAGE2 = [{"name": "la_posthoc", "tau": [1.0]}]


def cli_main(*args) -> tuple[int, str, str]:
    """``ltbench ARGS`` in this process (torch is imported once for the module): rc, stdout, stderr."""
    import contextlib

    from ltbench.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """Three tiny finished runs (seeds 0-2) with their feature caches and one stage-2 setting each."""
    tmp = tmp_path_factory.mktemp("faults")
    recipe = deep_update(TINY, {"name": "f", "results_dir": str(tmp / "results"), "seeds": [0, 1, 2],
                                "optim": {"epochs": 1}, "posthoc": STAGE2})
    path = tmp / "f.yaml"
    path.write_text(yaml.safe_dump(recipe))
    for args in (["run", path], ["posthoc", path]):
        rc, out, err = cli_main(*args)
        assert rc == 0, out + err
    return tmp


@pytest.fixture
def tree(pristine, tmp_path):
    """A fresh copy of the pristine tree: (recipe path, run folders by seed)."""
    shutil.copytree(pristine / "results", tmp_path / "results", symlinks=True)
    text = (pristine / "f.yaml").read_text().replace(str(pristine / "results"), str(tmp_path / "results"))
    (tmp_path / "f.yaml").write_text(text)
    from ltbench.recipe import load_recipe

    recipe = load_recipe(tmp_path / "f.yaml")
    return tmp_path / "f.yaml", {s.config["seed"]: Path(s.run_dir) for s in recipe.runs}


def drop_stage2(run_dir: Path) -> None:
    """Remove a run's stage-2 results, so 'ltbench posthoc' has work to do on it."""
    shutil.rmtree(run_dir / "posthoc")


def stage2_states(run_dir: Path) -> list[str]:
    return [store.check_result(p.parent).state for p in sorted(run_dir.glob("posthoc/*/result.json"))]


# ------------------------------------------------------------------------------------------------
# 1. One damaged run never stops a stage-2 grid; the printed remedy rebuilds the checkpoint


@pytest.mark.slow  # trains the module's tiny tree (and, here, two runs again)
def test_a_lost_checkpoint_skips_only_its_run_and_the_printed_remedy_rebuilds_it(tree):
    recipe, dirs = tree
    for run_dir in dirs.values():
        drop_stage2(run_dir)
        shutil.rmtree(run_dir / "features")
    (dirs[0] / store.CHECKPOINT).unlink()
    ckpt = dirs[1] / store.CHECKPOINT
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    rc, out, err = cli_main("posthoc", recipe, "--jobs", "1")
    assert rc == 1 and not err, out + err
    assert stage2_states(dirs[2]) == ["done"]  # the healthy run went on, with --jobs 1
    assert "2 run(s) SKIPPED" in out and dirs[0].name in out and dirs[1].name in out
    summary = out.split("SKIPPED (their")[1].splitlines()
    hint = next(line for line in summary if dirs[0].name in line and "--rebuild-checkpoints" in line)
    assert f"ltbench run {recipe} --rebuild-checkpoints" in hint
    rc, out, err = cli_main("run", recipe, "--rebuild-checkpoints")  # what the hint says
    assert rc == 0, out + err
    assert (dirs[0] / "result.json.no-checkpoint").is_file()
    rc, out, err = cli_main("posthoc", recipe)
    assert rc == 0, out + err
    assert all(stage2_states(d) == ["done"] for d in dirs.values())


# ------------------------------------------------------------------------------------------------
# 2. A damaged feature cache is set aside, named, and extracted again


def _object_array(path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        header = "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }".ljust(117) + "\n"
        zf.writestr("features.npy", b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + b"x" * 32)
    path.write_bytes(buffer.getvalue())


def _wrong_dimension(path: Path) -> None:
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["features"] = arrays["features"][:, :3]
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    path.write_bytes(buffer.getvalue())
    meta = path.parent / features.META
    info = json.loads(meta.read_text())
    info["bytes"]["train"] = path.stat().st_size  # a consistent cache of the wrong width
    meta.write_text(json.dumps(info))


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


FEATURE_DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "byte flipped": _flip,
    "object array": _object_array,
    "wrong dimension": _wrong_dimension,
    "meta wrong types": lambda p: (p.parent / features.META).write_text(json.dumps(
        {**json.loads((p.parent / features.META).read_text()), "splits": "train", "bytes": [1]})),
}


@pytest.mark.slow  # needs the module's trained tree
@pytest.mark.parametrize("how", sorted(FEATURE_DAMAGE))
def test_a_damaged_feature_cache_is_set_aside_and_extracted_again(tree, how):
    from ltbench.stage2.posthoc_runs import run_posthoc
    from ltbench.recipe import load_recipe

    recipe, dirs = tree
    target = dirs[0] / features.FEATURES_DIR / "train.npz"
    FEATURE_DAMAGE[how](target)
    drop_stage2(dirs[0])
    loaded = load_recipe(recipe)
    said = []
    totals = run_posthoc(loaded.runs, loaded.posthoc, say=said.append)
    assert totals.get("skipped", 0) == 0 and totals["done"] == 1, (totals, said)
    assert any("feature cache is unusable" in s and "features.damaged" in s for s in said), said
    assert (dirs[0] / "features.damaged").is_dir() and features.is_complete(dirs[0])
    assert stage2_states(dirs[0]) == ["done"]


# ------------------------------------------------------------------------------------------------
# 3. Caches are checked like results: forged or damaged ones are rebuilt, never shown, never hang


def _forged_index(root: Path, change) -> None:
    from ltbench.report import index

    path = root / index.INDEX_FILE
    meta, blob = index_parts(path)  # a forger who seals it again, without the key: the seal refuses it
    meta, values = change(meta, np.frombuffer(blob, dtype=np.float64).copy())
    write_index(path, meta, values.tobytes())


def _first_run(meta):
    return next(iter(meta["runs"]))


FORGERIES = {
    "run entry a number": lambda m, v: ({**m, "runs": {**m["runs"], _first_run(m): 7}}, v),
    "seed a list": lambda m, v: (m.__setitem__("runs", {k: [e[0], {**e[1], "seed": [0, 1]}, e[2]]
                                                        for k, e in m["runs"].items()}) or m, v),
    "row out of range": lambda m, v: (m.__setitem__("runs", {k: [e[0], e[1], e[2] + 1000]
                                                              for k, e in m["runs"].items()}) or m, v),
    "no status": lambda m, v: (m.__setitem__("runs", {k: [e[0], {x: y for x, y in e[1].items() if x != "status"},
                                                          e[2]] for k, e in m["runs"].items()}) or m, v),
    "deep nesting": lambda m, v: ((json.dumps(m)[:-1] + ', "deep": ' + "[" * 5000 + "]" * 5000 + "}").encode(), v),
    "metric 1.5": lambda m, v: (m, np.full_like(v, 1.5)),
}


@pytest.fixture
def fake_tree(tmp_path, write_recipe):
    from ltbench.recipe import load_recipe

    path = write_recipe(extra={"seeds": [0, 1, 2]})
    recipe = load_recipe(path)
    populate(recipe)
    return path, recipe.root


@pytest.mark.parametrize("how", sorted(FORGERIES))
def test_a_forged_index_cache_is_rebuilt_not_shown(fake_tree, how):
    from ltbench.report import index

    path, root = fake_tree
    clean = [report.render(report.tables(p)[0], "markdown") for p in (path, root)]
    report.tables(root)  # the cache, written by a table of the folder alone
    _forged_index(root, FORGERIES[how])
    assert [report.render(report.tables(p)[0], "markdown") for p in (root, path)] == clean[::-1]
    meta, _, values = index._load_cache(root / index.INDEX_FILE, str(root))
    assert not meta.get("unusable") and values is not None  # rewritten


@pytest.mark.parametrize("how", ["fifo", "devzero", "expansion forged"])
def test_a_cache_that_is_a_fifo_dev_zero_or_forged_neither_hangs_nor_crashes(fake_tree, how):
    from ltbench.report import index

    path, root = fake_tree
    report.tables(path)
    cache = root / index.INDEX_FILE
    if how == "fifo":
        cache.unlink()
        os.mkfifo(cache)
    elif how == "devzero":
        cache.unlink()
        cache.symlink_to("/dev/zero")
    else:
        (expansion,) = root.glob(".ltbench-expansion-*")
        forged = read_json_cache(expansion)
        forged["rows"] = {k: 5 for k in forged["rows"]}
        forged["expected"] = [[0]]
        write_json_cache(expansion, forged)
    got = run_cli("table", path, timeout=60)  # the old code hung on the FIFO and ate memory on /dev/zero
    assert got.returncode == 0 and "| ce" in got.stdout, got.stderr
    assert not got.stderr
    if how != "expansion forged":
        assert cache.is_file() and not cache.is_symlink()  # replaced by a good cache


def test_no_cache_repairs_the_cache_and_report_accepts_it(fake_tree):
    from ltbench.report import index

    path, root = fake_tree
    report.tables(path)
    _forged_index(root, FORGERIES["metric 1.5"])
    report.tables(path, use_cache=False)
    values = index._load_cache(root / index.INDEX_FILE, str(root))[2]
    assert values is not None and all(v != 1.5 for v in values)
    rc, out, err = cli_main("report", path, "--no-cache", "--test", "none")
    assert rc == 0, out + err


# ------------------------------------------------------------------------------------------------
# 4. Grids are bounded from the product of the axis lengths, before any expansion


def _peak_mb(fn) -> float:
    """Peak memory allocated by ``fn()`` (MB): what a grid expanded before it is bounded would show, measured
    without a clock (a timed test fails on a loaded machine: docs, 'the suite under load')."""
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return peak


def test_a_posthoc_grid_of_a_million_settings_is_refused_before_it_is_expanded():
    from ltbench.posthoc import expand_posthoc

    hundred = list(range(100))

    def refused():
        with pytest.raises(ConfigError, match=r"posthoc: 1000000 stage-2 settings"):
            expand_posthoc([{"name": "la_posthoc", "tau": hundred, "a": hundred, "b": hundred}])
        with pytest.raises(ConfigError, match="at most 100000"):
            expand_posthoc([{"name": "la_posthoc", **{f"k{i}": list(range(10)) for i in range(8)}}])

    assert _peak_mb(refused) < 20  # a million expanded settings take hundreds of MB


def test_a_million_setting_recipe_is_refused_by_the_command_before_it_is_expanded(write_recipe):
    hundred = list(range(100))
    path = write_recipe(extra={"posthoc": [{"name": "la_posthoc", "tau": hundred, "a": hundred, "b": hundred}]})
    got = []
    assert _peak_mb(lambda: got.append(cli_main("posthoc", path))) < 50
    rc, out, err = got[0]
    assert rc == 2 and "1000000 stage-2 settings" in err


# ------------------------------------------------------------------------------------------------
# 5. Work or evidence never disappears without a word


def test_an_empty_option_list_in_a_later_posthoc_entry_is_refused():
    from ltbench.posthoc import expand_posthoc

    with pytest.raises(ConfigError, match=r"posthoc\[1\]\.tau: an empty list"):
        expand_posthoc([{"name": "la_posthoc", "tau": [1.0]}, {"name": "tau_norm", "tau": []}])


@pytest.mark.slow  # needs the module's trained tree
def test_an_io_fault_while_writing_a_setting_is_not_stored_as_failed_and_is_retried(tree, monkeypatch):
    from ltbench.stage2 import posthoc_runs
    from ltbench.recipe import load_recipe

    recipe, dirs = tree
    drop_stage2(dirs[0])
    loaded = load_recipe(recipe)

    def broken(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error", str(dirs[0] / "posthoc" / "x" / "predictions.npz"))

    monkeypatch.setattr(posthoc_runs, "save_predictions", broken)
    said = []
    totals = posthoc_runs.run_posthoc(loaded.runs, loaded.posthoc, say=said.append)
    assert totals["skipped"] == 1 and "predictions.npz" in " ".join(said)
    assert stage2_states(dirs[0]) == []  # nothing recorded as failed
    monkeypatch.undo()
    totals = posthoc_runs.run_posthoc(loaded.runs, loaded.posthoc, say=said.append)
    assert totals["done"] == 1 and stage2_states(dirs[0]) == ["done"]


def _tables_recipe(write_recipe, tables: dict, name: str = "tiny") -> Path:
    return write_recipe(name, {"seeds": [0, 1, 2], "grid": {"method": [{"name": "ce"}, {"name": "la", "tau": 1.0}]},
                               "tables": tables})


@pytest.mark.parametrize("spec, note", [
    ({"where": {"method.name": "focal"}}, "matches no configuration"),
    ({"where": {"method.name": ["ce"]}}, "matches no configuration"),  # a list matches list-valued fields only
    ({"rows": []}, "declares no row"),
])
def test_a_table_matching_nothing_says_so(write_recipe, spec, note):
    from ltbench.recipe import load_recipe

    path = _tables_recipe(write_recipe, {"t": spec})
    populate(load_recipe(path))
    (table,) = report.tables(path)
    assert any(note in n for n in table.notes), table.notes


@pytest.mark.parametrize("spec, message", [
    ({"where": {"method.tau": float("nan")}}, "tables.t.where.method.tau"),
    ({"where": {"method.name": {"a": 1}}}, "tables.t.where.method.name"),
    ({"rows": [{"label": "CE", "where": {"method.name": "ce"}},
               {"label": "LA", "where": {"method.name": "la"}, "versus": ["CE", "CE"]}]}, "rows[1].versus"),
    ({"pivot": ["data.imb_factor"], "pivot_labels": {"data.imb_factor": [1]}}, "tables.t.pivot_labels.data.imb_factor"),
    ({"published_method": {"CE": 3}}, "tables.t.published_method.CE"),
    ({"label": "}\\end{document}"}, "tables.t.label"),
])
def test_table_spec_fields_are_type_checked_with_their_path(write_recipe, spec, message):
    from ltbench.recipe import load_recipe

    with pytest.raises(ConfigError) as info:
        load_recipe(_tables_recipe(write_recipe, {"t": spec}))
    assert message in str(info.value)


def test_a_table_including_its_own_recipe_or_a_folder_is_one_line(write_recipe, tmp_path):
    from ltbench.recipe import load_recipe

    path = _tables_recipe(write_recipe, {"t": {"include": ["tiny.yaml"]}})
    populate(load_recipe(path))
    with pytest.raises(LtbenchError, match=r"include\[0\]: 'tiny.yaml' is this recipe itself"):
        report.tables(path)
    (tmp_path / "folder.yaml").mkdir()
    path = _tables_recipe(write_recipe, {"t": {"include": ["folder.yaml"]}}, name="other")
    rc, out, err = cli_main("table", path)
    assert rc == 2 and "folder.yaml is not a regular file (a directory)" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------------
# 6. Symlinks inside a results root are not followed out of it, and loops are harmless


def test_symlinks_in_a_results_root_are_neither_looped_nor_followed_out(fake_tree, tmp_path):
    path, root = fake_tree
    clean = report.tables(path)[0]
    (root / "latest").symlink_to(".")
    (root / "elsewhere").symlink_to("/usr")
    (root / "loop").symlink_to("loop")
    table = report.tables(path, use_cache=False)[0]
    assert table.notes == clean.notes and report.render(table, "csv") == report.render(clean, "csv")
    rc, out, err = cli_main("status", root)
    assert rc == 0 and "latest" not in out and "elsewhere" not in out, out + err


# ------------------------------------------------------------------------------------------------
# 7. result.json is checked whole: ranges, lengths, counts, depth


def _result_with(tmp_path: Path, change) -> Path:
    from ltbench.recipe import load_recipe

    spec = load_recipe(ROOT / "recipes" / "quickstart.yaml").runs[0]
    from reportkit import write_run

    run_dir = write_run({**spec.to_dict(), "run_dir": str(tmp_path / "run")})
    result = json.loads((run_dir / store.RESULT).read_text())
    change(result)
    (run_dir / store.RESULT).write_text(json.dumps(result))
    return run_dir


@pytest.mark.parametrize("change, reason", [
    (lambda r: r["metrics"].__setitem__("per_class", [1.5, 0.5, 0.5, 0.5]), "per_class"),
    (lambda r: r["metrics"].__setitem__("per_class", [0.5, 0.5]), "2 values for 4 classes"),
    (lambda r: r["data"].__setitem__("class_counts_train", [24, -12, 6, 3]), "class_counts_train"),
    (lambda r: r["data"].__setitem__("class_counts_train", ["24", 12, 6, 3]), "class_counts_train"),
    (lambda r: r["config"].__setitem__("seed", [0]), "config.seed"),
])
def test_result_json_is_checked_in_full(tmp_path, change, reason):
    check = store.check_result(_result_with(tmp_path, change))
    assert check.state == "unusable" and reason in check.reason, check


def test_a_deeply_nested_result_json_is_damaged_not_a_recursion_error(tmp_path):
    (tmp_path / store.RESULT).write_text("[" * 200_000 + "]" * 200_000)
    check = store.check_result(tmp_path)
    assert check.state == "unusable" and "nested" in check.reason


def test_per_class_values_out_of_range_never_reach_a_figure(tmp_path):
    run_dir = _result_with(tmp_path, lambda r: r["metrics"].__setitem__("per_class", [1.5, 0.5, 0.5, 0.5]))
    frames = report.load(run_dir.parent)
    assert not (frames["per_class"]["accuracy"] > 1).any() if len(frames["per_class"]) else True
    assert frames["runs"].empty or "status" not in frames["runs"] or not (frames["runs"]["status"] == "done").any()
    rc, out, err = cli_main("plot", run_dir.parent, "--kind", "per_class", "--out", tmp_path / "figs")
    assert "internal error" not in err and rc == 2 and len(err.strip().splitlines()) == 1, err


# ------------------------------------------------------------------------------------------------
# 8. Everything else is one line naming the file, exit 2


def test_a_corrupt_predictions_file_reads_as_absent(tmp_path):
    from ltbench.results.predictions import load_predictions, save_predictions

    save_predictions(tmp_path, {"labels": np.arange(2000) % 4, "head:main": np.arange(2000) % 3}, 4)
    path = tmp_path / "predictions.npz"
    with zipfile.ZipFile(path) as zf:
        info = zf.infolist()[0]
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename) + 20
    data[start:start + 8] = b"\xff" * 8  # a bad deflate stream
    path.write_bytes(bytes(data))
    assert load_predictions(tmp_path) is None
    buffer = io.BytesIO()
    header = "{'descr': '<u1', 'fortran_order': False, 'shape': (1000000000000,), }".ljust(117) + "\n"
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("labels.npy", b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + b"\0" * 8)
    path.write_bytes(buffer.getvalue())
    assert load_predictions(tmp_path) is None


def test_plot_out_onto_a_file_or_into_a_read_only_folder_is_one_line(fake_tree, tmp_path):
    path, _ = fake_tree
    (tmp_path / "afile").write_text("x")
    rc, out, err = cli_main("plot", path, "--kind", "per_class", "--out", tmp_path / "afile")
    assert rc == 2 and "afile" in err and len(err.strip().splitlines()) == 1 and "internal" not in err, err
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        rc, out, err = cli_main("plot", path, "--kind", "per_class", "--out", ro)
        assert rc == 2 and "ro" in err and "internal" not in err, err


def test_efbig_names_the_file(tmp_path, monkeypatch):
    real_fdopen = os.fdopen

    class Refusing(io.RawIOBase):
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.EFBIG, "File too large")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(os, "fdopen", lambda fd, mode="r", *a, **k: Refusing(real_fdopen(fd, mode, *a, **k)))
    with pytest.raises(LtbenchError, match=r"cannot write .*big\.json \(File too large\)") as info:
        store.atomic_write_json(tmp_path / "big.json", {"a": 1})
    assert isinstance(info.value, OSError)  # callers treating a failed cache write as "no cache" still do


@pytest.mark.parametrize("body", ["raise KeyboardInterrupt", "raise GeneratorExit('odd')"])
def test_a_plugin_raising_a_base_exception_on_import_is_one_line(tmp_path, write_recipe, body):
    folder = tmp_path / "badplug"
    folder.mkdir()
    (folder / "__init__.py").write_text(body + "\n")
    got = run_cli("run", write_recipe(extra={"plugins": [str(folder)]}), "--dry-run", timeout=120)
    assert got.returncode == 2 and "badplug" in got.stderr and "Traceback" not in got.stderr, got.stderr
    assert len(got.stderr.strip().splitlines()) == 1


def test_a_bad_plugin_path_folder_is_blamed_on_the_variable(tmp_path, write_recipe):
    bad = tmp_path / "not-a-package"
    bad.mkdir()
    got = run_cli("run", write_recipe(), "--dry-run", env={"LTBENCH_PLUGIN_PATH": str(bad)}, timeout=120)
    assert got.returncode == 2 and "$LTBENCH_PLUGIN_PATH" in got.stderr and "plugins:" not in got.stderr, got.stderr


def test_a_dataset_plugin_reports_a_corrupt_file_as_one_line_naming_it(tmp_path, write_recipe):
    folder = tmp_path / "corruptdata"
    folder.mkdir()
    (folder / "__init__.py").write_text(
        "from dataclasses import dataclass\n"
        "from ltbench.errors import CorruptFileError\n"
        "from ltbench.registry import DATASETS\n"
        "from ltbench.data.synthetic import SyntheticLT\n\n"
        "@DATASETS.register('corrupt_lt')\n"
        "class CorruptLT(SyntheticLT):\n"
        "    def load(self):\n"
        "        raise CorruptFileError('/data/corrupt/img_0007.png', 'image file is truncated')\n")
    path = write_recipe(extra={"plugins": [str(folder)], "data": {"name": "corrupt_lt"}})
    got = run_cli("data", path, timeout=120)
    assert got.returncode == 2 and "/data/corrupt/img_0007.png: image file is truncated" in got.stderr, got.stderr
    assert len(got.stderr.strip().splitlines()) == 1 and "internal" not in got.stderr


def test_a_missing_predictions_file_is_noted_when_the_bootstrap_leaves_its_seed_out(write_recipe):
    from ltbench.results import predictions
    from ltbench.recipe import load_recipe

    path = _tables_recipe(write_recipe, {"t": {"rows": [{"label": "CE", "where": {"method.name": "ce"}},
                                                        {"label": "LA", "where": {"method.name": "la"},
                                                         "versus": "CE"}]}})
    recipe = load_recipe(path)
    populate(recipe)
    labels = np.arange(400) % 4
    for spec in recipe.runs:
        predictions.save_predictions(Path(spec.run_dir), {"labels": labels, "head:main": labels}, 4)
    gone = next(s for s in recipe.runs if s.config["method"]["name"] == "ce" and s.config["seed"] == 1)
    (Path(gone.run_dir) / "predictions.npz").unlink()
    (table,) = report.tables(path, test="bootstrap")
    ce = next(r for r in table.rows if r.label == "CE")
    assert any("seed(s) 1: predictions.npz missing" in n and gone.run_id in n for n in ce.notes), ce.notes
