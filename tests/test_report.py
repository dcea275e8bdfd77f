"""Tables: what a row is, n and seeds, notes that never stay silent, damaged run folders, the index
cache, the tidy frames, recipe validation of ``tables:``, and no torch in the table code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ltbench import report
from ltbench.errors import ConfigError
from ltbench.results import store
from ltbench.cli import load_checked_recipe
from ltbench.recipe import load_recipe
from reportkit import complete_result, populate, run_key, write_run

GOLDEN = Path(__file__).parent / "golden"
LA_GRID = {"grid": {"method": [{"name": "ce"}, {"name": "la", "tau": 1.0}]}, "seeds": [0, 1, 2]}


def table_of(path, **kw):
    (table,) = report.tables(path, **kw)
    return table


def rows_by_label(table):
    return {r.label: r for r in table.rows}


# ------------------------------------------------------------------------------------------------
# A results folder without a recipe (golden files)


@pytest.mark.parametrize("fmt", ["markdown", "latex", "csv"])
def test_results_folder_table_matches_golden_file(fmt, tmp_path):
    root = tmp_path / "demo"
    shutil.copytree(GOLDEN / "results" / "demo", root)
    text = report.render(table_of(root), fmt).strip() + "\n"
    golden = GOLDEN / f"demo.{fmt}.txt"
    if os.environ.get("LTBENCH_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


def test_statistics_are_sample_std_over_distinct_seeds(tmp_path):
    root = tmp_path / "demo"
    shutil.copytree(GOLDEN / "results" / "demo", root)
    ce = rows_by_label(table_of(root))["ce"]
    cell = ce.cells[(0, 3)]  # All
    assert cell.mean == pytest.approx((60.0 + 60.4 + 59.8) / 3)
    assert cell.std == pytest.approx(0.30550504633, rel=1e-6)  # ddof=1
    assert cell.n == 3 and cell.seeds == [0, 1, 2]


# ------------------------------------------------------------------------------------------------
# What a row is


def test_different_configurations_never_share_a_row(write_recipe, tmp_path):
    """Runs that differ only in optim.epochs (or lr, ...) are different rows, with or without a recipe."""
    path = write_recipe("r", {**LA_GRID, "grid": {"optim.epochs": [1, 4], "method": [{"name": "ce"}]}})
    recipe = load_recipe(path)
    populate(recipe)
    for source in (path, recipe.root):
        table = table_of(source)
        assert sorted(r.label for r in table.rows) == ["ce (epochs=1)", "ce (epochs=4)"]
        assert all(r.cells[(0, 3)].n == 3 for r in table.rows)
        keys = [{u.key for u in r.units.values()} for r in table.rows]
        assert keys[0].isdisjoint(keys[1])


def test_a_selector_matching_two_configurations_is_an_error(write_recipe):
    tables = {"t": {"rows": [{"label": "LA", "where": {"method.name": "ce"}}]}}
    path = write_recipe("r", {"grid": {"optim.epochs": [1, 4]}, "tables": tables})
    with pytest.raises(ConfigError, match=r"r\.yaml: tables\.t\.rows\[0\]\.where matches 2 different configurations "
                                          r"\(they differ in optim\.epochs\)"):
        load_checked_recipe(path)  # what every command runs: the recipe's load, then the table check


def test_a_copied_run_folder_does_not_change_n(write_recipe):
    path = write_recipe("r", LA_GRID)
    recipe = load_recipe(path)
    populate(recipe)
    before = rows_by_label(table_of(recipe.root))["la"].cells[(0, 3)]
    some_la = next(s for s in recipe.runs if s.config["method"]["name"] == "la")
    shutil.copytree(some_la.run_dir, recipe.root / "copy-of-a-run")
    shutil.copytree(some_la.run_dir, recipe.root / "nested" / some_la.run_id)
    for source in (recipe.root, path):
        table = table_of(source)
        after = rows_by_label(table)["la"].cells[(0, 3)]
        assert (after.n, after.mean, after.std) == (before.n, before.mean, before.std)
    text = report.render(table_of(recipe.root), "markdown")
    assert "copy-of-a-run is a copy of run" in text and "counted once" in text


def test_missing_seed_is_reported_in_every_format(write_recipe):
    path = write_recipe("r", LA_GRID)
    recipe = load_recipe(path)
    populate(recipe, skip={("la", 1.0, 6.0, 2, 2)})
    table = table_of(path)
    la = rows_by_label(table)["la"]
    assert la.cells[(0, 3)].n == 2
    for fmt in ("markdown", "latex", "csv"):
        assert "seed(s) 2 missing (never run: 'ltbench run RECIPE' runs it)" in report.render(table, fmt)
    assert "| la [1]" in report.render(table, "markdown") and "2/3" in report.render(table, "markdown")


def test_every_run_of_a_method_deleted_still_shows_the_row(write_recipe):
    path = write_recipe("r", LA_GRID)
    recipe = load_recipe(path)
    populate(recipe, skip={("ce", None, 6.0, 2, s) for s in (0, 1, 2)})
    ce = rows_by_label(table_of(path))["ce"]
    assert ce.cells[(0, 3)].mean is None and "seed(s) 0, 1, 2 missing (never run: 'ltbench run RECIPE' runs it)" in ce.notes


def test_without_a_recipe_a_row_lacking_seeds_others_have_is_said(write_recipe):
    path = write_recipe("r", LA_GRID)
    recipe = load_recipe(path)
    populate(recipe, skip={("ce", None, 6.0, 2, 1)})
    ce = rows_by_label(table_of(recipe.root))["ce"]
    assert "no run for seed(s) 1 (other rows have them)" in ce.notes


def test_labels_are_canonical_and_rows_keep_grid_order(write_recipe):
    grid = {"method": [{"name": "la", "tau": 2}, {"name": "ce"}, {"name": "la", "tau": 1}]}
    path = write_recipe("r", {"grid": grid, "seeds": [0]})
    populate(load_recipe(path))
    assert [r.label for r in table_of(path).rows] == ["la (tau=2)", "ce", "la (tau=1)"]
    path2 = write_recipe("r2", {"grid": {"method": [{"name": "la", "tau": 1.0}, {"name": "la", "tau": 2.0}]}})
    assert load_recipe(path2).runs[0].run_id == load_recipe(path).runs[2].run_id  # 1 and 1.0 are one run


def test_only_the_recipes_own_runs_and_the_others_are_named(write_recipe):
    path = write_recipe("r", LA_GRID)
    recipe = load_recipe(path)
    populate(recipe)
    old = load_recipe(write_recipe("r", {**LA_GRID, "optim": {"epochs": 1}}))  # same results folder, other runs
    populate(old)
    path = write_recipe("r", LA_GRID)
    table = table_of(path)
    assert all(c.n == 3 for r in table.rows for c in r.cells.values())
    assert any("6 run folder(s) in" in n and "are not runs of this recipe as written" in n for n in table.notes)
    assert not any(r.run_id in n for r in old.runs for n in table.notes)  # no run ids in a paper's float


def test_best_is_chosen_within_each_dataset(write_recipe):
    grid = {"data.imb_factor": [6, 20], "method": [{"name": "ce"}, {"name": "la", "tau": 1.0}]}
    path = write_recipe("r", {"grid": grid, "seeds": [0]})
    recipe = load_recipe(path)
    populate(recipe)
    table = table_of(recipe.root)  # no pivot: rows grouped by imbalance factor automatically
    groups = {r.group for r in table.rows}
    assert groups == {"imb_factor=6", "imb_factor=20"}
    for g in groups:
        assert sum(r.cells[(0, 3)].best for r in table.rows if r.group == g) == 1


def test_heads_rows_do_not_repeat_the_main_rows(write_recipe):
    path = write_recipe("r", {**LA_GRID, "seeds": [0, 1]})
    populate(load_recipe(path))
    table = table_of(path, heads=["au*"])
    assert [r.label for r in table.rows] == ["ce · aux", "la · aux"]
    with pytest.raises(ConfigError, match="heads in these results: aux"):
        table_of(path, heads=["nothing*"])


# ------------------------------------------------------------------------------------------------
# Damaged run folders: a note per run, never a crash, never a silent drop

DAMAGE = {
    "empty": (None, "empty run folder"),
    "truncated": (b'{"status": "done", "config": {"meth', "not valid JSON"),
    "list": (b"[]", "holds a JSON list, expected an object"),
    "empty_object": (b"{}", "has no status"),
    "status_only": (b'{"status": "done"}', "run_id is missing"),
    "latin1": ('{"status": "done", "note": "caf\u00e9"}'.encode("latin-1"), "not UTF-8"),
}


def test_damaged_run_folders_are_named_not_fatal(write_recipe, cli):
    path = write_recipe("r", LA_GRID)
    recipe = load_recipe(path)
    populate(recipe)
    for name, (content, _) in DAMAGE.items():
        (recipe.root / name).mkdir()
        if content is not None:
            (recipe.root / name / "result.json").write_bytes(content)
    bad_metric = next(s for s in recipe.runs if run_key(s) == ("la", 1.0, 6.0, 2, 0))
    data = json.loads((Path(bad_metric.run_dir) / "result.json").read_text())
    data["metrics"]["few"] = "n/a"
    (Path(bad_metric.run_dir) / "result.json").write_text(json.dumps(data))
    no_spec = next(s for s in recipe.runs if run_key(s) == ("ce", None, 6.0, 2, 2))
    for f in Path(no_spec.run_dir).iterdir():
        f.unlink()
    (Path(no_spec.run_dir) / "log.jsonl").write_text('{"epoch": 1}\n')
    for source in (recipe.root, path):
        out = cli("table", source)
        assert out.returncode == 0, out.stderr
        if source == recipe.root:
            for name, (_, says) in DAMAGE.items():
                assert f"{name}: " in out.stdout and says in out.stdout, name
        assert "metrics.few is 'n/a', expected a fraction" in out.stdout
        assert "no spec.json" in out.stdout
    csv_out = cli("table", recipe.root, "--format", "csv").stdout
    assert "empty run folder" in csv_out and "not UTF-8" in csv_out


# ------------------------------------------------------------------------------------------------
# The index cache


def test_the_cache_is_invalidated_by_a_changed_result(write_recipe):
    from ltbench.report import index

    path = write_recipe("r", {**LA_GRID, "seeds": [0]})
    recipe = load_recipe(path)
    populate(recipe)
    assert rows_by_label(table_of(path))["la"].cells[(0, 3)].mean == pytest.approx(63.4)
    assert store.cache_file(recipe.root, index.INDEX_FILE).exists()
    spec = next(s for s in recipe.runs if s.config["method"]["name"] == "la")
    result = Path(spec.run_dir) / "result.json"
    data = json.loads(result.read_text())
    data["metrics"]["all"] = 0.5  # and per-class values that agree with it
    del data["metrics"]["per_class"], data["data"]["class_counts_test"]
    result.write_text(json.dumps(complete_result(data)))  # another size: read again
    assert rows_by_label(table_of(path))["la"].cells[(0, 3)].mean == pytest.approx(50.0)
    cached = index.scan(recipe.root)
    assert {r["status"] for r in cached} == {"done"} and all("config" in r for r in cached)


def test_table_code_never_imports_torch(write_recipe):
    path = write_recipe("r", {**LA_GRID, "seeds": [0]})
    recipe = load_recipe(path)
    populate(recipe)
    report.tables(path)  # fills the recipe cache; the next process must not need torch
    code = ("import sys; from ltbench import report; from ltbench.results import store; "
            "[report.render(t, f) for src in sys.argv[1:] for t in report.tables(src) for f in ('markdown', 'latex', 'csv')]; "
            "assert 'torch' not in sys.modules, 'torch imported'; assert 'pandas' not in sys.modules, 'pandas imported'")
    out = subprocess.run([sys.executable, "-c", code, str(recipe.root), str(path)], capture_output=True, text=True,
                         cwd=path.parent)
    assert out.returncode == 0, out.stderr


# ------------------------------------------------------------------------------------------------
# The tidy frames, the recipe's tables section, the CLI


def test_load_returns_tidy_frames(write_recipe):
    path = write_recipe("r", {**LA_GRID, "seeds": [0, 1], "eval": {"target_priors": ["uniform", "forward10"]}})
    recipe = load_recipe(path)
    populate(recipe)
    f = report.load(path)
    assert set(f.keys()) == {"runs", "heads", "shift", "test_sets", "per_class", "class_stats", "curves"}
    assert len(f.runs) == 4 and set(f.runs["row"]) == {"ce", "la"}
    assert list(f.per_class.columns) == ["row", "seed", "class_index", "train_count", "group", "accuracy",
                                         "few_threshold", "many_threshold", "row_order"]
    assert set(zip(f.per_class["row"], f.per_class["row_order"])) == {("ce", 0), ("la", 1)}  # table order
    assert len(f.per_class) == 4 * 4 and set(f.per_class["group"]) == {"many", "medium", "few"}
    shift = f.shift[(f.shift["row"] == "la") & (f.shift["seed"] == 0)].sort_values("position")
    assert list(shift["prior"]) == ["forward50", "forward10", "uniform", "backward10", "backward50"]
    assert list(f.heads.columns) == ["row", "seed", "head", "group", "accuracy", "row_order"]


@pytest.mark.parametrize("tables,says", [
    ({"t": {"columns": ["al"]}}, "tables.t.columns[0]: unknown column 'al'"),
    ({"t": {"pivot": ["imb_factor"]}}, "tables.t: 'imb_factor' is not a dotted config key"),
    ({"t": {"rows": [{"label": "x", "marks": {"P": True}}]}}, "tables.t.rows[0].marks: 'P' is not a declared switch"),
    ({"t": {"digits": 9}}, "tables.t.digits: expected 0 to 6"),
    ({"t": {"colums": ["all"]}}, "tables.t.colums: unknown key (did you mean 'columns'?)"),
    ([1, 2], "tables: expected a mapping"),
])
def test_bad_tables_section_is_rejected_at_load_with_file_and_field(write_recipe, cli, tables, says):
    path = write_recipe("r", {"tables": tables})
    with pytest.raises(ConfigError) as err:
        load_recipe(path)
    assert str(err.value).startswith(str(path)) and says in str(err.value)
    out = cli("run", path, "--dry-run")
    assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr


def test_cli_table_names_and_formats(write_recipe, cli):
    path = write_recipe("r", {**LA_GRID, "tables": {"main": {"columns": ["all"]}, "few": {"columns": ["few"]}}})
    populate(load_recipe(path))
    both = cli("table", path)
    assert both.returncode == 0 and "### main" in both.stdout and "### few" in both.stdout
    one = cli("table", path, "--table", "few", "--format", "latex")
    assert one.returncode == 0 and r"\toprule" in one.stdout and "Few" in one.stdout and "All" not in one.stdout
    bad = cli("table", path, "--table", "nope")
    assert bad.returncode == 2 and "no table named 'nope' (tables: few, main)" in bad.stderr
    missing = cli("table", GOLDEN / "nope")
    assert missing.returncode == 2 and "no such results directory" in missing.stderr


def test_cli_report_writes_every_table_and_a_summary(write_recipe, cli):
    path = write_recipe("r", {**LA_GRID, "tables": {"main": {"columns": ["many", "all"]}}})
    recipe = load_recipe(path)
    populate(recipe)
    out = cli("report", path)
    assert out.returncode == 0, out.stderr
    folder = recipe.root / "report"
    for name in ("main.md", "main.tex", "main.csv", "tables_document.tex", "report.md"):
        assert (folder / name).stat().st_size > 0, name
    text = (folder / "report.md").read_text()
    assert "ltbench table" in text and "## Provenance" in text and "6 done" in text
    assert (folder / "figures" / "per_class.png").stat().st_size > 1000 and "![per_class]" in text
    assert "**class_stats**: not drawn: no data" in text  # said, not silently missing (fake runs record no norms)


@pytest.mark.slow
def test_cli_plot_writes_png_and_pdf_or_says_why_not(write_recipe, cli, tmp_path):
    path = write_recipe("r", {**LA_GRID, "eval": {"target_priors": ["uniform", "forward10"]}})
    populate(load_recipe(path))
    out = cli("plot", path, "--kind", "per_class", "--out", tmp_path / "figs")
    assert out.returncode == 0, out.stderr
    for ext in ("png", "pdf"):
        assert (tmp_path / "figs" / f"per_class.{ext}").stat().st_size > 1000
    shift = cli("plot", path, "--kind", "shift", "--out", tmp_path / "figs")
    assert shift.returncode == 0 and (tmp_path / "figs" / "shift.png").exists()
    kappa = cli("plot", path, "--kind", "kappa", "--out", tmp_path / "figs")  # no method records kappa here
    assert kappa.returncode == 2 and "no data for the class-statistics figure" in kappa.stderr


def test_include_joins_another_recipes_runs_as_column_groups(write_recipe):
    table_spec = {"include": ["b.yaml"], "pivot": ["data.imb_factor"], "columns": ["all"]}
    b = load_recipe(write_recipe("b", {**LA_GRID, "data": {"imb_factor": 10}}))
    a_path = write_recipe("a", {**LA_GRID, "tables": {"both": table_spec}})
    populate(load_recipe(a_path))
    populate(b)
    table = table_of(a_path)
    assert [table.group_header(0, g) for g in range(len(table.groups))] == ["6", "10"]
    assert [r.label for r in table.rows] == ["ce", "la"]
    assert all(r.cells[(g, 0)].n == 3 for r in table.rows for g in (0, 1))


def test_published_reference_rows_and_delta(write_recipe, monkeypatch):
    from ltbench.report import claims
    from ltbench.report import published

    entry = claims.Claim(method="la", dataset="synthetic_lt", imb_factor=6.0, backbone="resnet8",
                                 epochs=2, metrics={"all": 60.0, "few": 30.0}, source="A paper, Table 9")
    monkeypatch.setattr(published, "load_claims", lambda folder=None: [entry])  # the name report uses
    path = write_recipe("r", {**LA_GRID, "tables": {"t": {"columns": ["few", "all"], "published": True}}})
    populate(load_recipe(path))
    table = table_of(path)
    assert [(r.label, r.published) for r in table.rows] == [("ce", None), ("la", None), ("la", "A paper, Table 9")]
    la = table.rows[1]
    assert la.cells[(0, 1)].delta == pytest.approx(la.cells[(0, 1)].mean - 60.0)
    assert not table.rows[2].cells[(0, 1)].best  # a published row never competes
    md = report.render(table, "markdown")
    assert "la † (A paper, Table 9)" in md and "Δ" in md and "ours − published" in md


def test_bootstrap_marks_come_from_stored_predictions(write_recipe):
    import numpy as np

    from ltbench.results import predictions

    path = write_recipe("r", {**LA_GRID, "seeds": [0, 1]})
    recipe = load_recipe(path)
    populate(recipe)
    labels = np.arange(400) % 4
    for spec in recipe.runs:
        wrong = 160 if spec.config["method"]["name"] == "ce" else 156  # 60.0% vs 61.0%: a tie
        pred = labels.copy()
        pred[:wrong] = (pred[:wrong] + 1) % 4
        predictions.save_predictions(Path(spec.run_dir), {"labels": labels, "head:main": pred}, 4)
    for test, words in (("bootstrap", "two-level bootstrap"), ("image_bootstrap", "paired bootstrap over test images only")):
        table = table_of(path, test=test)
        ce = rows_by_label(table)["ce"]
        assert ce.cells[(0, 3)].similar and not ce.cells[(0, 0)].similar  # only whole-test-set columns
        assert words in report.render(table, "markdown")


def test_a_head_row_never_shows_the_main_predictions_shifted_numbers(write_recipe):
    # results record heads' shot groups only; a head row's prior column stays empty with a note,
    # never the main prediction's forward50 accuracy under the head's label
    tables = {"t": {"heads": ["aux"], "columns": ["all", "prior:forward50"]}}
    path = write_recipe("r", {**LA_GRID, "seeds": [0, 1], "tables": tables})
    populate(load_recipe(path))
    table = table_of(path)
    head_rows = [r for r in table.rows if r.head == "aux"]
    assert head_rows and all(r.cells[(0, 0)].values for r in head_rows)
    assert all(not r.cells[(0, 1)].values for r in head_rows)
    assert any("not recorded" in note for r in head_rows for note in r.notes)
    main_rows = [r for r in table.rows if not r.head]
    assert all(r.cells[(0, 1)].values for r in main_rows)


# ------------------------------------------------------------------------------------------------
# Row labels: the method's display name its results record


def _record_display(recipe, method: str, display: str) -> None:
    """What a run of a method registered with ``display=`` writes (results/record.py: method_display)."""
    for spec in recipe.runs:
        if spec.config["method"]["name"] == method:
            path = Path(spec.run_dir) / "result.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), "method_display": display}))


def test_row_labels_are_the_display_names_results_record_in_every_format(write_recipe):
    """A row is labelled with the display name its results record ("LA"), in markdown, LaTeX and CSV; a row whose
    results record none (made before methods declared one) keeps the method's id, and the fields in which rows
    differ still follow the name."""
    path = write_recipe("r", {"grid": {"method": [{"name": "ce"}, {"name": "la", "tau": 1.0}, {"name": "la", "tau": 2.0}]},
                              "seeds": [0, 1]})
    recipe = load_recipe(path)
    populate(recipe)
    _record_display(recipe, "la", "LA")
    table = table_of(path)
    assert [r.label for r in table.rows] == ["ce", "LA (tau=1)", "LA (tau=2)"]
    markdown, latex, csv = (report.render(table, f) for f in ("markdown", "latex", "csv"))
    assert "| LA (tau=1) " in markdown and "| ce " in markdown and "| la " not in markdown
    assert "LA (tau=1) &" in latex and "la (tau" not in latex
    assert "LA (tau=1)" in csv and "la (tau=1)" not in csv


def test_a_damaged_display_name_makes_the_record_damaged(write_recipe):
    """method_display is read under result.json's rule (schema.display_name_problem): a 200-character or
    multi-line one is no label: its result is unusable (named, and run again), never printed."""
    from ltbench.results import schema

    path = write_recipe("r", {**LA_GRID, "seeds": [0]})
    recipe = load_recipe(path)
    populate(recipe)
    _record_display(recipe, "la", "L\nA")
    la_dir = next(Path(s.run_dir) for s in recipe.runs if s.config["method"]["name"] == "la")
    assert "method_display" in schema.result_problem(json.loads((la_dir / "result.json").read_text()))
    assert not store.check_result(la_dir).usable
    assert schema.display_name_problem("x" * 41) and schema.display_name_problem(" ") \
        and not schema.display_name_problem("Balanced Softmax")


def test_a_run_records_its_methods_display_name_from_its_registration():
    """The built-in methods declare display names where they register; a result records it (record.header),
    and a method registered without one records its id (which labels its rows). A bad display name is refused
    when the method registers."""
    from ltbench.registry import METHODS, Registry, RegistryError
    from ltbench.results import record

    assert record.method_display({"method": {"name": "ldam_drw"}}) == "LDAM-DRW"
    assert record.method_display({"method": {"name": "balanced_softmax"}}) == "Balanced Softmax"
    assert all(e.display for e in METHODS.entries() if e.module.startswith("methods."))
    with pytest.raises(RegistryError, match="display name"):
        Registry("method", None).register("x", display="two\nlines")


def test_table_on_a_terminal_shows_bold_and_underline_as_ansi_and_markdown_elsewhere(write_recipe, capsys, monkeypatch):
    """`ltbench table` to a terminal prints what `ltbench run` prints at its end (screen.for_terminal: no `**` or
    `<u>`); to a file or a pipe, and with an explicit --format markdown, the markdown itself."""
    from ltbench import cli
    from ltbench.run.screen import for_terminal

    path = write_recipe("r", LA_GRID)
    populate(load_recipe(path))
    assert cli.main(["table", str(path)]) == 0
    piped = capsys.readouterr().out
    assert "**" in piped and "\x1b[" not in piped
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert cli.main(["table", str(path)]) == 0
    shown = capsys.readouterr().out
    assert shown == for_terminal(piped) and "\x1b[1m" in shown and "**" not in shown
    assert cli.main(["table", str(path), "--format", "markdown"]) == 0
    assert capsys.readouterr().out == piped


@pytest.mark.parametrize("damage", ["metrics.per_class", "data.class_counts_test", "data.class_counts_train",
                                    "device_seconds=1e308", "device_seconds=NaN"])
def test_a_record_that_cannot_prove_itself_is_named_once_and_never_tabled(write_recipe, damage):
    """Issue 52's reproducers: ``all: 0.99`` with its per-class values or class counts deleted was tabled as
    "62.00 ± 52.33" in bold (a record without training counts showed "Many 90.00" with no many-shot class), and
    a cost of 1e308 printed 305 digits. Each is a damaged record now: named once, its seed not counted."""
    path = write_recipe("r", {**LA_GRID, "seeds": [0, 1, 2]})
    recipe = load_recipe(path)
    populate(recipe)
    spec = next(s for s in recipe.runs if s.config["method"]["name"] == "la" and s.config["seed"] == 1)
    result = Path(spec.run_dir) / "result.json"
    data = json.loads(result.read_text())
    data["metrics"].update(all=0.99, many=0.9)
    if "=" in damage:
        key, value = damage.split("=")
        data[key] = float(value)
    else:
        section, key = damage.split(".")
        del data[section][key]
    result.write_text(json.dumps(data))
    row = rows_by_label(table_of(path, use_cache=False))["la"]
    all_cell, many_cell = row.cells[(0, 3)], row.cells[(0, 0)]
    assert all_cell.seeds == [0, 2] and all_cell.mean < 70 and many_cell.mean < 90
    text = report.render(table_of(path, use_cache=False), "markdown")
    assert text.count("damaged") == 1 and "99.00" not in text and "e+" not in text
