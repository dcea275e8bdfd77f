"""Tables show what was run (issue 40): ``--where KEY=VALUE[,VALUE]`` selects part of a recipe's grid for run,
--dry-run, status and table, and finished runs that no declared table shows are counted with the command that
shows them."""

from __future__ import annotations

import pytest

from conftest import deep_update
from ltbench import cli
from ltbench.errors import ConfigError
from ltbench.recipe.expansion import parse_where, select_where

GRID = {"grid": {"method": [{"name": "ce"}, {"name": "la", "tau": 1.0}], "data.imb_factor": [4, 6]}}


def test_where_keeps_the_runs_with_one_of_the_values_and_compares_values_as_labels_spell_them():
    configs = [{"method": {"name": m}, "data": {"imb_factor": float(r)}, "seed": 0} for m in ("ce", "la") for r in (4, 6)]
    assert select_where(configs, parse_where(["method.name=ce,la", "data.imb_factor=6"])) == [False, True, False, True]
    assert select_where([{"method.name": "ce"}], parse_where(["method.name=ce"])) == [True]  # a flattened config
    with pytest.raises(ConfigError, match="no run of this recipe has this key"):
        select_where(configs, parse_where(["methd.name=ce"]))
    with pytest.raises(ConfigError, match="no run has this value; the runs have method.name = ce, la"):
        select_where(configs, parse_where(["method.name=bape"]))
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_where(["method.name"])


def test_where_on_dry_run_and_status_and_an_unknown_key_is_one_line_exit_2(write_recipe, capsys):
    path = write_recipe("grid", GRID)
    assert cli.main(["run", str(path), "--dry-run", "--where", "method.name=la"]) == 0
    out = capsys.readouterr().out
    assert "2 run(s)" in out and "ce" not in out.split("run(s)")[1].replace("rho", "")
    assert cli.main(["status", str(path), "--where", "data.imb_factor=6", "--where", "method.name=ce"]) == 0
    assert capsys.readouterr().out.strip().endswith("1 pending")
    assert cli.main(["status", str(path), "--where", "optim.lrr=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--where optim.lrr: no run of this recipe has this key" in err


@pytest.mark.slow  # trains one tiny run (torch)
def test_finished_runs_outside_every_declared_table_are_counted_with_the_command_that_shows_them(write_recipe, capsys):
    tables = {"tables": {"main": {"columns": ["all"], "where": {"optim.epochs": 2}}}}
    path = write_recipe("smoke", deep_update(GRID, tables))
    assert cli.main(["run", str(path), "optim.epochs=1", "--where", "method.name=ce", "--where", "data.imb_factor=4"]) == 0
    assert "| la" not in capsys.readouterr().out  # the tables at the end show the part it ran (la, never run: its id)
    assert cli.main(["table", str(path)]) == 0  # the declared table selects 2 epochs; the run made 1
    out = capsys.readouterr().out
    assert "1 finished run(s) in" in out and "are in none of these tables" in out and "'ltbench table " in out
    folder = out.split("'ltbench table ")[1].split("'")[0]
    assert cli.main(["table", folder]) == 0  # the command the note gives shows the run
    assert "| CE" in capsys.readouterr().out  # the display name the run recorded


def test_table_where_keeps_the_rows_of_the_selected_runs(write_recipe, capsys):
    path = write_recipe("rows", GRID)
    (path.parent / "results" / "rows").mkdir(parents=True)
    assert cli.main(["table", str(path), "--where", "method.name=la"]) == 0
    out = capsys.readouterr().out
    assert "| la" in out and "| ce" not in out and "not runs of this recipe" not in out
