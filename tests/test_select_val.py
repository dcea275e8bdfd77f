"""Selection on validation in tables: a row matching several settings takes, per seed, the setting with the
best validation All and reports its test numbers ('select: val' / ltbench table --select val); choosing on
the test set instead is possible and labelled an oracle."""

from __future__ import annotations

import pytest
import yaml

from ltbench.errors import ConfigError
from ltbench.recipe import load_recipe
from tests.conftest import TINY, deep_update
from tests.reportkit import fake_metrics, write_run

TAUS = [0.5, 1.0, 2.0]
# (tau, seed) -> (validation All, test All): validation prefers tau 0.5 for seed 0 and tau 2 for seeds 1 and 2,
# while the test set always prefers tau 1 (so the validation choice and the oracle differ).
SCORES = {(0.5, 0): (0.80, 0.70), (1.0, 0): (0.75, 0.74), (2.0, 0): (0.60, 0.60),
          (0.5, 1): (0.70, 0.69), (1.0, 1): (0.71, 0.75), (2.0, 1): (0.72, 0.71),
          (0.5, 2): (0.60, 0.65), (1.0, 2): (0.65, 0.77), (2.0, 2): (0.72, 0.73)}


def recipe_file(tmp_path, select="val") -> str:
    table = {"columns": ["all"], "rows": [{"label": "CE", "where": {"method.name": "ce"}},
                                          {"label": "LA", "where": {"method.name": "la"}}]}
    if select:
        table["select"] = select
    recipe = deep_update(TINY, {"name": "sel", "results_dir": str(tmp_path / "results"), "seeds": [0, 1, 2],
                                "data": {"val_per_class": 4},
                                "grid": {"method": [{"name": "ce"}] + [{"name": "la", "tau": t} for t in TAUS]},
                                "tables": {"main": table}})
    path = tmp_path / "sel.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


def populate(path: str) -> None:
    for spec in load_recipe(path).runs:
        c = spec.config
        metrics = fake_metrics(c, c["seed"])
        if c["method"]["name"] == "la":
            val, test = SCORES[(c["method"]["tau"], c["seed"])]
            metrics.update(all=test, val={"all": val, "many": val, "medium": val, "few": val, "size": 16})
        write_run(spec, metrics=metrics)


def la_row(table):
    return next(r for r in table.rows if r.label.startswith("LA"))


def test_select_val_reports_the_test_score_of_the_validation_best_setting(tmp_path):
    from ltbench import report

    path = recipe_file(tmp_path)
    populate(path)
    (table,) = report.tables(path, test=None)
    row = la_row(table)
    assert row.label == "LA [selected on validation]"
    cell = row.cells[(0, 0)]
    assert cell.seeds == [0, 1, 2] and cell.values == pytest.approx([70.0, 71.0, 73.0])  # tau 0.5, 2, 2
    assert any("selected on validation: seed 0: tau=0.5; seed 1: tau=2; seed 2: tau=2" in n for n in row.notes)

    (oracle,) = report.tables(path, test=None, select="test")
    row = la_row(oracle)
    assert row.label == "LA [oracle: best on the test set]"
    assert row.cells[(0, 0)].values == pytest.approx([74.0, 75.0, 77.0])  # tau 1 every time: higher, and not honest
    rendered = report.render(oracle)
    assert "oracle: best on the test set" in rendered


def test_a_row_matching_several_settings_is_refused_without_select(tmp_path):
    from ltbench.cli import load_checked_recipe  # the table check runs after loading (recipe never imports report)

    with pytest.raises(ConfigError, match="select: val"):
        load_checked_recipe(recipe_file(tmp_path, select=None))


def test_runs_without_validation_metrics_are_said_not_silently_skipped(tmp_path):
    from ltbench import report

    path = recipe_file(tmp_path)
    for spec in load_recipe(path).runs:
        write_run(spec)  # no 'val' in the metrics (a run without a validation split)
    (table,) = report.tables(path, test=None)
    row = la_row(table)
    assert row.cells[(0, 0)].values == []
    assert any("no setting has validation metrics" in n and "val_per_class" in n for n in row.notes)


def test_cli_select_val(tmp_path, cli):
    path = recipe_file(tmp_path, select="test")
    populate(path)
    out = cli("table", path, "--select", "val", "--test", "none")
    assert out.returncode == 0, out.stderr
    assert "LA [selected on validation]" in out.stdout and "oracle" not in out.stdout.split("LA [")[1].split("\n")[0]
    assert "71.33" in out.stdout  # mean of 70, 71, 73
