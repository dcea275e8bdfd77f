"""Tuned rows (ltbench/report/tuned.py): per seed, the trial with the best validation All, its test numbers
reported; the budget in the caption; tuned and untuned rows told apart; ``ltbench table --trials``; and a tiny
search on synthetic_lt that runs methods x trials x seeds and resumes after kill -9 without redoing a trial."""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import replace
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ltbench.recipe import load_recipe
from ltbench.report import index
from ltbench.report.build import build_table
from ltbench.report.tuned import trials_of
from ltbench.recipe.tables import default_table
from tests.conftest import ROOT, TINY, deep_update
from tests.reportkit import fake_metrics, write_run

SEARCH = {"trials": 3, "seed": 5}
# (trial, seed) -> (validation All, test All): trial 2 is best on the test set for both seeds but never on
# validation; validation picks trial 1 for seed 0 and trial 3 for seed 1.
SCORES = {(0, 0): (0.80, 0.60), (1, 0): (0.50, 0.90), (2, 0): (0.70, 0.65),
          (0, 1): (0.60, 0.61), (1, 1): (0.55, 0.95), (2, 1): (0.75, 0.66)}


def recipe_file(tmp_path, **extra) -> Path:
    recipe = deep_update(TINY, {"name": "tuned", "results_dir": str(tmp_path / "results"), "seeds": [0, 1],
                                "data": {"val_per_class": 4}, "search": SEARCH, **extra})
    path = tmp_path / "tuned.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def populate(path: Path, **fields) -> list:
    runs = load_recipe(path).runs
    for spec in runs:
        val, test = SCORES[(spec.grid["search"]["trial"], spec.seed)]
        metrics = fake_metrics(spec.config, spec.seed)
        metrics.update(all=test, val={"all": val, "many": val, "medium": val, "few": val, "size": 16})
        write_run(spec, metrics=metrics, **fields)
    return runs


def test_tuned_row_selects_on_validation_never_on_test_and_names_its_budget(tmp_path):
    from ltbench import report

    path = recipe_file(tmp_path)
    populate(path)
    (table,) = report.tables(path, test=None)
    (row,) = table.rows
    assert row.cells[(0, table.columns.index(("all", "All")))].values == pytest.approx([60.0, 66.0])  # never 90, 95
    assert "Tuned: 3 trials per method on the validation split (random search, seed 5)" in table.spec.caption
    assert "[tuned]" not in row.label  # every row is tuned: the caption says it
    assert any("chosen on validation: seed 0: trial 1 (" in n and "seed 1: trial 3 (" in n for n in row.notes)
    text = report.render(table, "markdown")
    assert "Tuned: 3 trials" in text and "63.00" in text  # the mean of 60 and 66
    trials = trials_of([table], "ce").splitlines()
    assert len(trials) == 3 + 3 * 2 and "| val All | test All | device-h | chosen |" in trials[1]
    chosen = [line for line in trials if line.endswith("| yes |")]
    assert [line.split(" | ")[0] for line in chosen] == ["| 1", "| 3"]


def test_missing_trials_are_said_and_mixed_tables_mark_tuned_rows(tmp_path):
    path = recipe_file(tmp_path)
    runs = populate(path)
    for spec in runs:
        if spec.grid["search"]["trial"] == 0 and spec.seed == 0:
            os.remove(Path(spec.run_dir) / "result.json")  # trial 1, seed 0: pending
    untuned = load_recipe(recipe_file(tmp_path, search=None, grid={"method.name": ["la"]})).runs
    for spec in untuned:
        write_run(spec)
    records = index.scan(tmp_path / "results" / "tuned", use_cache=False)
    table = build_table("main", default_table(), records, None, test=None)
    labels = sorted(r.label for r in table.rows)
    assert labels == ["ce [tuned]", "la (lr=0.05, weight_decay=0.0005)"], labels  # untuned: its fixed values
    assert "rows not marked tuned: the recipe's fixed settings" in table.spec.caption
    ce = next(r for r in table.rows if r.label == "ce [tuned]")
    assert any("selected among 2 of 3" in n for n in ce.notes)
    cell = ce.cells[(0, 3)]  # All: seed 0 among trials 2 and 3 (validation picks 3), seed 1 among all three
    assert cell.seeds == [0, 1] and cell.values == pytest.approx([65.0, 66.0])


def costed_runs(tmp_path) -> list[dict]:
    """Tuned ce (3 trials x 2 seeds, 600 s each) and untuned la (2 seeds, 900 s each)."""
    path = recipe_file(tmp_path)
    populate(path, device_seconds=600.0)
    for spec in load_recipe(recipe_file(tmp_path, search=None, grid={"method.name": ["la"]})).runs:
        write_run(spec, device_seconds=900.0)
    return index.scan(tmp_path / "results" / "tuned", use_cache=False)


def test_the_cost_column_counts_a_tuned_rows_whole_search_in_every_format(tmp_path):
    """A tuned row costs all its trials (3 trials x 2 seeds x 600 s = 1 h), an untuned row its own runs
    (2 x 900 s = 0.5 h); a run with no recorded cost makes its row's cost unknown, never a partial sum."""
    from ltbench import report
    from ltbench.report.formats import to_csv, to_latex, to_markdown

    records = costed_runs(tmp_path)
    table = build_table("main", default_table(), records, None, test=None)  # cost: unset, shown (a tuned row)
    markdown = to_markdown(table)
    header = next(line for line in markdown.splitlines() if line.startswith("| Method"))
    assert header.rstrip(" |").endswith("| n   | Cost"), header
    rows = {line.split("|")[1].strip().removesuffix(" [1]"): line.split("|")[-2].strip()  # [1]: its row note
            for line in markdown.splitlines() if line.startswith("| ce") or line.startswith("| la")}
    assert rows == {"ce [tuned]": "1.0", "la (lr=0.05, weight_decay=0.0005)": "0.50"}, rows
    assert "a tuned row's cost is its whole search" in markdown and "on CPU" in markdown
    costs = {line["row"]: line["cost_device_hours"] for line in csv.DictReader(io.StringIO(to_csv(table)))
             if line["row"]}
    assert costs == {"ce [tuned]": "1", "la (lr=0.05, weight_decay=0.0005)": "0.5"}
    latex = to_latex(table)
    assert "Cost" in latex and " 1.0 " in latex and " 0.50 " in latex

    seconds_unknown = next(Path(r["dir"]) for r in records if r["config"]["method"]["name"] == "la")
    result = json.loads((seconds_unknown / "result.json").read_text())
    result.update(device_seconds=None, unrecorded=["device_seconds"])  # a run recorded before ltbench kept its cost
    (seconds_unknown / "result.json").write_text(json.dumps(result))
    records = index.scan(tmp_path / "results" / "tuned", use_cache=False)
    table = build_table("main", default_table(), records, None, test=None)
    la = next(r for r in table.rows if r.label.startswith("la"))
    assert "| – " in next(line for line in to_markdown(table).splitlines() if line.startswith("| la"))
    assert any("cost is unknown (1 result(s)" in n for n in table.notes), table.notes
    hidden = build_table("main", replace(default_table(), cost=False), records, None, test=None)
    assert "Cost" not in to_markdown(hidden).splitlines()[0] and la.label


def test_the_cost_column_still_fits_a_two_column_article_unscaled(tmp_path):
    from latexkit import compile_fragments, needs_pdflatex, overfull_boxes
    from ltbench.report.formats import to_latex

    table = build_table("main", replace(default_table(), caption="Tuned and untuned"), costed_runs(tmp_path), None,
                        test=None)
    text = to_latex(table)
    assert "Cost" in text and "resizebox" not in text and "scalebox" not in text
    needs_pdflatex()
    assert overfull_boxes(compile_fragments([text], tmp_path / "tex")) == []


def test_declared_rows_tell_a_tuned_method_from_the_same_method_at_fixed_settings_and_compare_them(tmp_path):
    """search.trials selects the tuned row (only a tuned row has it); the fixed one is selected by its settings;
    'versus' then gives the difference and its p-value."""
    from ltbench.recipe.tables import RowSpec

    populate(recipe_file(tmp_path))
    for spec in load_recipe(recipe_file(tmp_path, search=None)).runs:  # ce at the recipe's fixed settings
        write_run(spec, metrics={**fake_metrics(spec.config, spec.seed), "all": 0.5})
    records = index.scan(tmp_path / "results" / "tuned", use_cache=False)
    rows = [RowSpec(label="CE", where={"method.name": "ce", "optim.lr": 0.05}),
            RowSpec(label="CE (tuned)", where={"method.name": "ce", "search.trials": 3}, versus="CE")]
    table = build_table("main", replace(default_table(), rows=rows), records, None, test="welch")
    fixed, tuned = table.rows
    column = table.columns.index(("all", "All"))
    assert fixed.cells[(0, column)].values == pytest.approx([50.0, 50.0])
    assert tuned.cells[(0, column)].values == pytest.approx([60.0, 66.0])  # chosen on validation
    (comparison,) = table.comparisons
    assert comparison.cells[(0, column)][0] == pytest.approx(13.0)
    assert fixed.label == "CE" and tuned.label == "CE (tuned)"  # its label says so: no [tuned] mark added


def test_tiny_search_runs_every_trial_and_resumes_after_kill_9_without_redoing_one(tmp_path):
    """methods x trials x seeds real runs on synthetic_lt; a launch killed with SIGKILL after its first results
    leaves them finished: the next launch trains only the rest, and the table selects on validation."""
    path = recipe_file(tmp_path, grid={"method.name": ["ce", "la"]}, search={"trials": 2, "seed": 0},
                       optim={"epochs": 1})
    runs = load_recipe(path).runs
    assert len(runs) == 2 * 2 * 2
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "ltbench", "run", str(path)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    results = [Path(r.run_dir) / "result.json" for r in runs]
    deadline = time.time() + 240
    while time.time() < deadline and sum(p.exists() for p in results) < 2 and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {p: p.stat().st_mtime_ns for p in results if p.exists()}
    assert 2 <= len(finished) < len(results)
    out = subprocess.run([sys.executable, "-m", "ltbench", "run", str(path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert f"{len(results) - len(finished)} to run" in out.stdout or f"{len(finished)} already finished" in out.stdout
    assert all(p.exists() for p in results)
    assert {p: p.stat().st_mtime_ns for p in finished} == finished  # no finished trial trained again
    table = subprocess.run([sys.executable, "-m", "ltbench", "table", str(path), "--test", "none"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    assert table.returncode == 0, table.stderr
    assert "Tuned: 2 trials per method on the validation split (random search, seed 0)" in table.stdout
    assert "chosen on validation" in table.stdout and "2/2" in table.stdout
    assert all(json.loads(p.read_text())["grid"]["search"]["trials"] == 2 for p in results)


def test_the_trials_behind_a_tuned_row_are_never_called_runs_in_no_table(tmp_path):
    from ltbench import report

    path = recipe_file(tmp_path, tables={"main": {"columns": ["all"]}})
    populate(path)
    (table,) = report.tables(path, test=None)
    assert table.rows and not any("in none of these tables" in n for n in table.notes), table.notes
