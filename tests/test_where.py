"""Tables show what was run (issue 40): ``--where KEY=VALUE[,VALUE]`` selects part of a recipe's grid for run,
--dry-run, status and table, and finished runs that no declared table shows are counted with the command that
shows them."""

from __future__ import annotations

import pytest

from conftest import run_cli, deep_update
from ltbench import cli
from ltbench.errors import ConfigError
from ltbench.recipe.selection import parse_where, select_where

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
    assert "1 run folder(s) in" in out and "are in none of these tables" in out and "'ltbench table " in out
    assert out.count("are in none of these tables") == 1  # one note per fact (issue 51)
    folder = out.split("'ltbench table ")[1].split("'")[0]
    assert cli.main(["table", folder]) == 0  # the command the note gives shows the run
    assert "| CE" in capsys.readouterr().out  # the display name the run recorded


def test_table_where_keeps_the_rows_of_the_selected_runs(write_recipe, capsys):
    path = write_recipe("rows", GRID)
    (path.parent / "results" / "rows").mkdir(parents=True)
    assert cli.main(["table", str(path), "--where", "method.name=la"]) == 0
    out = capsys.readouterr().out
    assert "| la" in out and "| ce" not in out and "not runs of this recipe" not in out


LDAM_GRID = {"grid": {"method": [{"name": "ce"}, {"name": "la", "tau": 1.0}, {"name": "ldam_drw", "drw_epoch": 24}]},
             "optim": {"epochs": 30}}
NO_TORCH_BEFORE_SELECTION = """
import sys
import ltbench.recipe as recipe
seeds_where = recipe._seeds_where
def spy(*args):
    print("torch before the selection:", "torch" in sys.modules)
    return seeds_where(*args)
recipe._seeds_where = spy
from ltbench import cli
code = cli.main(sys.argv[1:])
print("exit", code)
"""


def test_where_narrows_before_any_run_is_validated_and_before_torch(write_recipe, tmp_path):
    """Issue 51: a run --where leaves out is never validated (ldam_drw's drw_epoch 24 is past optim.epochs=2),
    the selection happens before torch is imported, and a malformed --where costs no import at all."""
    import subprocess
    import sys

    path = write_recipe("ldam", LDAM_GRID)
    args = ["run", str(path), "optim.epochs=2", "--where", "method.name=ce,la", "--dry-run"]
    done = subprocess.run([sys.executable, "-c", NO_TORCH_BEFORE_SELECTION, *args], capture_output=True, text=True)
    assert "torch before the selection: False" in done.stdout and "exit 0" in done.stdout, done.stderr
    assert "2 run(s)" in done.stdout and "ldam_drw" not in done.stdout
    bad = "import sys; from ltbench import cli; code = cli.main(sys.argv[1:]); print('torch', 'torch' in sys.modules, code)"
    done = subprocess.run([sys.executable, "-c", bad, "run", str(path), "--where", "method.name", "--dry-run"],
                          capture_output=True, text=True)
    assert "torch False 2" in done.stdout and "expected KEY=VALUE" in done.stderr


def test_an_error_a_command_line_override_causes_names_the_override(write_recipe, capsys):
    path = write_recipe("ldam", LDAM_GRID)
    assert cli.main(["run", str(path), "optim.epochs=2", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "command-line override 'optim.epochs=2': method.drw_epoch: 24 is not before the end" in err
    assert str(path) not in err  # the recipe file is not at fault
    assert cli.main(["run", str(path), "--where", "method.name=bape", "--dry-run"]) == 2
    assert "command-line --where method.name=bape: no run has this value" in capsys.readouterr().err


@pytest.mark.slow  # trains two tiny runs (torch)
def test_status_and_table_of_a_results_folder_take_where(write_recipe, capsys):
    path = write_recipe("folder", GRID)
    assert cli.main(["run", str(path), "--where", "data.imb_factor=4"]) == 0
    folder = path.parent / "results" / "folder"
    capsys.readouterr()
    assert cli.main(["status", str(folder), "--where", "method.name=la"]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("1 done") and " la " in out and " ce " not in out
    assert cli.main(["table", str(folder), "--where", "method.name=ce"]) == 0
    out = capsys.readouterr().out
    assert "| ce" in out.lower() and "| la" not in out.lower()
    assert cli.main(["status", str(folder), "--where", "method.name=bape"]) == 2
    assert "no run has this value; the runs have method.name = ce, la" in capsys.readouterr().err


def test_where_and_the_tables_where_are_one_rule_an_absent_key_matches_nothing():
    """One selector rule (issue 48): --where and a table's where: both use recipe/selection.matches."""
    from ltbench.recipe.selection import matches
    from ltbench.report.rows import matches_selector

    flat = {"method.name": "la", "method.tau": 1.0, "data.imb_factor": 100}
    for selector in ({"method.tau": 1}, {"method.tau": 2}, {"method.gamma": 1}, {"data.imb_factor": 100.0}):
        assert matches_selector(flat, selector) == matches(flat, {k: [v] for k, v in selector.items()})
    assert matches(flat, {"method.gamma": [1]}) is False  # absent: no match, in both
    assert matches(flat, {"method.gamma": [1]}, absent=None) is None  # undecided only before the plugins' defaults
    assert matches(flat, {"method.gamma": [1], "method.name": ["ce"]}, absent=None) is False


def test_a_command_line_axis_gives_one_group_per_value_and_a_kept_value_is_named(write_recipe, capsys):
    """Issue 51: rows split by a command-line grid axis stay together under one group line per value (markdown and
    LaTeX); --where keeping one value of a grid axis names it in the caption, which describes the whole grid."""
    tables = {"tables": {"main": {"caption": "Synthetic-LT (rho 4)", "columns": ["all"]}}}
    path = write_recipe("axes", tables)
    (path.parent / "results" / "axes").mkdir(parents=True)
    axes = ["grid.method=[{name: ce}, {name: la, tau: 1.0}]", "grid.data.imb_factor=[4,6]"]
    for fmt, group in (("markdown", "*imb_factor={}*"), ("latex", "\\textit{{imb\\_factor={}}}")):
        assert cli.main(["table", str(path), *axes, "--format", fmt]) == 0
        lines = capsys.readouterr().out.splitlines()
        at = [i for i, line in enumerate(lines) if group.format(4) in line or group.format(6) in line]
        assert len(at) == 2, lines  # two group lines, each above its two rows
        for block in (lines[at[0]:at[1]], lines[at[1]:at[1] + 4]):
            assert sum(line.lower().startswith(("| ce", "| la", "ce", "la")) for line in block) == 2, block
    assert cli.main(["table", str(path), *axes, "--where", "data.imb_factor=6"]) == 0
    assert "**Synthetic-LT (rho 4) (imb_factor=6 only)**" in capsys.readouterr().out


def test_did_you_mean_for_an_option_and_an_override_key(write_recipe, capsys):
    """Issue 51's small things: '--were' and 'data.nam=' get a suggestion; a far-off key gets none."""
    path = write_recipe("typo", GRID)
    with pytest.raises(SystemExit):
        cli.main(["run", str(path), "--were", "method.name=ce"])
    assert "(did you mean --where?)" in capsys.readouterr().err
    assert cli.main(["run", str(path), "method.nam=x", "--dry-run"]) == 2
    assert "did you mean 'method.name'?" in capsys.readouterr().err
    assert cli.main(["run", str(path), "method.gamma=1", "--dry-run"]) == 2
    assert "did you mean" not in capsys.readouterr().err


def test_an_unknown_method_is_said_in_a_short_line(write_recipe, capsys):
    """Issue 51: the unknown-method error listed every core module ltbench searched (about 900 characters)."""
    path = write_recipe("unknown", GRID)
    got = run_cli("run", path, "grid.method=[{name: focall}]", "--dry-run")  # a fresh process: no other test's plugins
    assert got.returncode == 2, got.stderr
    err = got.stderr
    assert "unknown method 'focall'" in err and "Searched: ltbench's own modules" in err
    assert "ltbench.samplers.progressive" not in err and len(err) < 900  # no list of every core module
