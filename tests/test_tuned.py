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

import numpy as np
import pytest
import yaml

from ltbench.recipe import load_recipe
from ltbench.report import index
from ltbench.report.build import build_table
from ltbench.report.tuned import trials_of
from ltbench.recipe.tables import default_table
from tests.conftest import ROOT, TINY, deep_update
from tests.reportkit import fake_metrics, write_run

SEARCH = {"trials": 3, "seed": 5, "seeds": [10, 11]}
# Stage 1, (trial, tuning seed) -> (validation All, test All): trial 2 is best on the test set but never on
# validation; the mean validation over the tuning seeds chooses trial 3 (0.725 against 0.70 and 0.525).
SCORES = {(0, 10): (0.80, 0.60), (1, 10): (0.50, 0.90), (2, 10): (0.70, 0.65),
          (0, 11): (0.60, 0.61), (1, 11): (0.55, 0.95), (2, 11): (0.75, 0.66)}
REPORT = {0: (0.71, 0.62), 1: (0.72, 0.64)}  # stage 2: the chosen configuration on the fresh report seeds


def recipe_file(tmp_path, **extra) -> Path:
    recipe = deep_update(TINY, {"name": "tuned", "results_dir": str(tmp_path / "results"), "seeds": [0, 1],
                                "data": {"val_per_class": 4}, "search": SEARCH, **extra})
    path = tmp_path / "tuned.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def write_scored(spec, val: float, test: float, **fields) -> None:
    metrics = fake_metrics(spec.config, spec.seed)
    metrics.update(all=test, val={"all": val, "many": val, "medium": val, "few": val, "size": 16})
    write_run(spec, metrics=metrics, **fields)


def populate(path: Path, report: bool = True, **fields) -> list:
    """Stage 1's results; then, the recipe read again (its report runs exist once every trial ended), stage 2's."""
    trials = load_recipe(path).runs
    assert all(spec.grid.get("search") for spec in trials)  # before the trials end, no report run exists
    for spec in trials:
        write_scored(spec, *SCORES[(spec.grid["search"]["trial"], spec.seed)], **fields)
    runs = load_recipe(path).runs
    reported = [spec for spec in runs if not spec.grid.get("search")]
    assert len(runs) == len(trials) + len(reported) and {s.seed for s in reported} == {0, 1}
    for spec in reported if report else []:
        write_scored(spec, *REPORT[spec.seed], **fields)
    return runs


def test_tuned_row_chooses_on_tuning_seeds_and_reports_fresh_seeds_only(tmp_path):
    from ltbench import report

    path = recipe_file(tmp_path)
    runs = populate(path)
    (table,) = report.tables(path, test=None)
    (row,) = table.rows
    assert row.cells[(0, table.columns.index(("all", "All")))].values == pytest.approx([62.0, 64.0])  # report runs only
    assert ("Tuned: 3 draws x 2 tuning seeds on validation (random search, seed 5); reported: 2 fresh seeds"
            in table.spec.caption)
    assert "search dimension d (draws per axis): ce 2 (1.7)" in table.spec.caption
    assert "[tuned]" not in row.label  # every row is tuned: the caption says it
    assert any("chosen on validation (mean of tuning seeds 10, 11): trial 3 (" in n for n in row.notes), row.notes
    trials = trials_of([table], "ce").splitlines()
    assert len(trials) == 3 + 3 + 1 and "| val All, seed 10 | val All, seed 11 | mean val All |" in trials[1]
    assert [line.split(" | ")[0] for line in trials if line.endswith("| yes |")] == ["| 3"]
    assert "test" not in " ".join(trials[1:])  # a trial's test numbers are never shown
    chosen = next(s for s in runs if s.grid.get("search") and s.grid["search"]["trial"] == 2 and s.seed == 10)
    reported = [s for s in runs if not s.grid.get("search")]
    fixed = load_recipe(recipe_file(tmp_path, search=None, optim={k: chosen.config["optim"][k]
                                                                  for k in ("lr", "weight_decay")})).runs
    assert sorted(s.run_id for s in reported) == sorted(s.run_id for s in fixed)  # the fixed recipe's run ids


def test_an_unfinished_search_reports_nothing_and_says_why(tmp_path):
    path = recipe_file(tmp_path)
    for spec in load_recipe(path).runs[:-1]:
        write_scored(spec, *SCORES[(spec.grid["search"]["trial"], spec.seed)])
    assert all(spec.grid.get("search") for spec in load_recipe(path).runs)  # stage 2 waits for the last trial run
    records = index.scan(tmp_path / "results" / "tuned", use_cache=False)
    table = build_table("main", default_table(), records, None, test=None)
    (row,) = table.rows
    assert any("no configuration chosen yet: 5 of 6 trial runs ended" in n for n in row.notes), row.notes
    assert row.cells[(0, 3)].values == []


def costed_runs(tmp_path) -> list[dict]:
    """Tuned ce (3 trials x 2 tuning seeds + 2 report seeds, 450 s each) and untuned la (2 seeds, 900 s each)."""
    path = recipe_file(tmp_path)
    populate(path, device_seconds=450.0)
    for spec in load_recipe(recipe_file(tmp_path, search=None, grid={"method.name": ["la"]})).runs:
        write_run(spec, device_seconds=900.0)
    return index.scan(tmp_path / "results" / "tuned", use_cache=False)


def test_the_cost_column_counts_a_tuned_rows_whole_search_in_every_format(tmp_path):
    """A tuned row costs both stages (3 trials x 2 tuning seeds + 2 report runs, x 450 s = 1 h), an untuned row its own runs
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
    assert tuned.cells[(0, column)].values == pytest.approx([62.0, 64.0])  # the chosen draw on fresh seeds
    (comparison,) = table.comparisons
    assert comparison.cells[(0, column)][0] == pytest.approx(13.0)
    assert fixed.label == "CE" and tuned.label == "CE (tuned)"  # its label says so: no [tuned] mark added


def test_tiny_search_runs_trials_on_tuning_seeds_then_the_choice_on_fresh_seeds_and_resumes_after_kill_9(tmp_path):
    """methods x trials x tuning seeds real runs on synthetic_lt, then each method's chosen draw on the report
    seeds: trials x tuning seeds + report seeds runs per method, no reported run a trial, the Cost counting them
    all (a failed trial too). A launch killed with SIGKILL after its first results leaves them finished: the
    next launch trains only the rest."""
    from ltbench import report
    from ltbench.report.build import cost_runs

    path = recipe_file(tmp_path, grid={"method.name": ["ce", "la"]}, search={"trials": 2, "seed": 0, "seeds": [7, 8]},
                       optim={"epochs": 1})
    runs = load_recipe(path).runs
    assert len(runs) == 2 * 2 * 2 and all(spec.grid.get("search") for spec in runs)
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
    assert f"{len(finished)} already finished" in out.stdout and "report runs on fresh seeds (stage 2)" in out.stdout
    assert "the search has chosen, by mean validation All over its tuning seeds: ce (trial " in out.stdout
    trial_lines = [line for line in out.stdout.splitlines() if line.lstrip().startswith("finished") and "(trial " in line]
    assert trial_lines and all(", validation All " in line and "optim.lr=" in line for line in trial_lines), out.stdout
    assert {p: p.stat().st_mtime_ns for p in finished} == finished  # no finished trial trained again
    every = load_recipe(path).runs
    reported = [spec for spec in every if not spec.grid.get("search")]
    assert len(every) == 2 * (2 * 2 + 2) and len(reported) == 2 * 2 and {s.seed for s in reported} == {0, 1}
    assert all((Path(s.run_dir) / "result.json").exists() for s in every)
    assert not {s.run_id for s in reported} & {s.run_id for s in runs}  # no reported run is a trial
    assert all(json.loads(p.read_text())["grid"]["search"]["trials"] == 2 for p in results)
    assert all("search" not in json.loads((Path(s.run_dir) / "result.json").read_text())["grid"] for s in reported)
    chosen = {json.dumps([s.config["method"], s.config["optim"]]) for s in reported}
    other = next(Path(s.run_dir) / "result.json" for s in runs
                 if json.dumps([s.config["method"], s.config["optim"]]) not in chosen)
    failed = json.loads(other.read_text())  # a failed trial still costs: its device time is counted
    failed.update(status="failed", error="boom", error_type="RuntimeError", traceback_file=None)
    other.write_text(json.dumps(failed))
    (table,) = report.tables(path, test=None)
    assert "Tuned: 2 draws x 2 tuning seeds on validation (random search, seed 0); reported: 2 fresh seeds" \
        in table.spec.caption
    assert sorted(len(cost_runs(row)) for row in table.rows) == [6, 6]  # 2 trials x 2 tuning seeds + 2 report runs
    text = report.render(table, "markdown")
    assert "chosen on validation" in text and "2/2" in text


def test_the_trials_behind_a_tuned_row_are_never_called_runs_in_no_table(tmp_path):
    from ltbench import report

    path = recipe_file(tmp_path, tables={"main": {"columns": ["all"]}})
    populate(path)
    (table,) = report.tables(path, test=None)
    assert table.rows and not any("in none of these tables" in n for n in table.notes), table.notes


def simulated_rejections(trials: int, tuning: int, report: int, replicates: int, two_stages: bool) -> float:
    """How often Welch's test finds 'tuned != fixed' at alpha = 0.05 when tuning changes nothing: every
    configuration has the same true accuracy, and each run's validation and test share its training noise
    (correlation 0.6, as measured in docs/tuning.md's audit: +0.36 to +0.89). Two stages: ``search.choose``
    picks a draw on the tuning seeds, and the row is that draw on fresh report seeds. One stage (the old rule,
    for contrast): per report seed, the test score of the run that won on validation."""
    from ltbench.report.significance import welch_test
    from ltbench.search import choose

    rng = np.random.default_rng(12345)
    cov = [[1.0, 0.6], [0.6, 1.0]]
    hits = 0
    for _ in range(replicates):
        fixed = rng.multivariate_normal([0, 0], cov, size=report)[:, 1]
        if two_stages:
            val = rng.multivariate_normal([0, 0], cov, size=(trials, tuning))[..., 0]
            assert choose(val.tolist()) is not None  # the choice is made; its fresh runs are independent of it
            tuned = rng.multivariate_normal([0, 0], cov, size=report)[:, 1]
        else:
            runs = rng.multivariate_normal([0, 0], cov, size=(trials, report))  # trial x seed x (val, test)
            tuned = runs[np.argmax(runs[..., 0], axis=0), np.arange(report), 1]
        p, _ = welch_test(tuned.tolist(), fixed.tolist())
        hits += p is not None and p < 0.05
    return hits / replicates


def test_when_tuning_changes_nothing_tuned_versus_fixed_rejects_at_its_nominal_size():
    """3000 replicates: the rate's standard error at 5 % is 0.4 points, so 7 % is 5 of them away; the old
    one-stage rule, simulated the same way, rejects far more often (the winner's curse this protocol removes)."""
    for trials, tuning, report in ((4, 2, 3), (16, 2, 5)):
        assert simulated_rejections(trials, tuning, report, 3000, two_stages=True) <= 0.07
    assert simulated_rejections(16, 2, 5, 1000, two_stages=False) > 0.15


def test_export_writes_a_fixed_recipe_whose_runs_are_the_tuned_rows_report_runs(tmp_path, cli):
    path = recipe_file(tmp_path)
    runs = populate(path)
    reported = sorted(s.run_id for s in runs if not s.grid.get("search"))
    out = cli("table", path, "--trials", "ce", "--export", tmp_path / "fixed.yaml")
    assert out.returncode == 0, out.stderr
    exported = load_recipe(tmp_path / "fixed.yaml")
    assert "search" not in yaml.safe_load((tmp_path / "fixed.yaml").read_text())
    assert sorted(s.run_id for s in exported.runs) == reported  # round trip: the tuned row's run ids
    assert exported.root == load_recipe(path).root  # found where the search left them: nothing trains again
    refused = cli("table", path, "--export", tmp_path / "x.yaml")
    assert refused.returncode == 2 and "--trials ROW" in refused.stderr
