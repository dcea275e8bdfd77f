"""The first day without guessing: grid axes from the command line (and the declared tables that follow
them), `ltbench run` ending with the recipe's own tables, and a results folder looked for in one
documented place, with a message saying where when it is not there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ltbench import cli
from ltbench.errors import ConfigError
from ltbench.recipe import load_recipe, read_recipe_file
from ltbench.report.expected import check_recipe_tables
from tests.conftest import TINY, deep_update

TABLES = {"main": {"columns": ["all"], "rows": [
    {"label": "CE", "where": {"method.name": "ce"}},
    {"label": "LA", "where": {"method.name": "la"}, "versus": "CE"},
    {"label": "LA rho 6", "where": {"method.name": "la", "data.imb_factor": 6}, "versus": "CE"}]},
    "pivoted": {"columns": ["all"], "pivot": ["data.imb_factor"], "rows": [{"label": "CE", "where": {"method.name": "ce"}}]}}


def two_methods(tmp_path, name: str = "day", tables: dict | None = None, **extra) -> str:
    recipe = deep_update(TINY, {"name": name, "results_dir": str(tmp_path / "results"), "optim": {"epochs": 1},
                                "grid": {"method": [{"name": "ce"}, {"name": "la", "tau": 1.0}]}, **extra})
    if tables is not None:
        recipe["tables"] = tables
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


def axis_values(recipe, key: str) -> list:
    section, field = key.split(".")
    return sorted({spec.config[section][field] for spec in recipe.runs})


def test_grid_axes_are_added_replaced_and_removed_from_the_command_line(tmp_path):
    path = two_methods(tmp_path)
    added = load_recipe(path, ["grid.data.imb_factor=[2,6]"])
    assert len(added.runs) == 4 and axis_values(added, "data.imb_factor") == [2, 6]
    replaced = load_recipe(path, ["grid.data.imb_factor=[2,6]", "grid.method=[{name: ce}]"])
    assert [s.config["method"]["name"] for s in replaced.runs] == ["ce", "ce"]
    removed = load_recipe(path, ["grid.method=null"])
    assert len(removed.runs) == 1 and removed.runs[0].config["method"]["name"] == "ce"  # the base method
    union = two_methods(tmp_path, "union", grid=[{"method": [{"name": "ce"}]}, {"method": [{"name": "la"}]}])
    assert len(load_recipe(union, ["grid.optim.lr=[0.05,0.1]"]).runs) == 4  # added to each grid of the union


@pytest.mark.parametrize("override, message", [
    ("grid.data.imb_factor=6", "expected a non-empty list of values (e.g. grid.data.imb_factor=[10,100]), or null"),
    ("grid.data.imb_factor=null", "has no axis 'data.imb_factor' to remove (its axes: method)"),
    ("grid.seed=[1,2]", "not a configuration key; a grid key is a dotted path under data, backbone"),
])
def test_a_grid_override_that_cannot_take_effect_is_refused(tmp_path, override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_recipe(two_methods(tmp_path), [override])


def test_a_grid_axis_and_an_override_of_the_same_key_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="also sets the grid axis 'data.imb_factor'; give one of the two"):
        read_recipe_file(Path(two_methods(tmp_path)),
                         ["grid.data.imb_factor=[2,6]", "data.imb_factor=2"])


def test_declared_rows_split_by_a_new_axis_and_versus_follows(tmp_path):
    path = two_methods(tmp_path, tables=TABLES)
    recipe = load_recipe(path, ["grid.data.imb_factor=[2,6]"])
    check_recipe_tables(recipe)  # without the split: 'rows[0].where matches 2 different configurations'
    rows = recipe.tables["main"].rows
    assert [(r.label, r.where, r.versus, r.group) for r in rows] == [  # one row group per value (issue 40)
        ("CE (imb_factor=2)", {"method.name": "ce", "data.imb_factor": 2}, None, "imb_factor=2"),
        ("LA (imb_factor=2)", {"method.name": "la", "data.imb_factor": 2}, "CE (imb_factor=2)", "imb_factor=2"),
        ("CE (imb_factor=6)", {"method.name": "ce", "data.imb_factor": 6}, None, "imb_factor=6"),
        ("LA (imb_factor=6)", {"method.name": "la", "data.imb_factor": 6}, "CE (imb_factor=6)", "imb_factor=6"),
        ("LA rho 6", {"method.name": "la", "data.imb_factor": 6}, "CE (imb_factor=6)", "imb_factor=6")]  # names the key
    assert [r.label for r in recipe.tables["pivoted"].rows] == ["CE"]  # the table shows the key already


def test_a_row_that_matches_several_configurations_says_how_to_declare_it(tmp_path):
    path = two_methods(tmp_path, tables={"main": TABLES["main"]}, grid={
        "method": [{"name": "ce"}, {"name": "la", "tau": 1.0}], "data.imb_factor": [2, 6]})
    with pytest.raises(ConfigError, match=re.escape("show each value as a column group (pivot: [data.imb_factor]) "
                                                    "or a row group (group_by: data.imb_factor)")):
        check_recipe_tables(load_recipe(path))


@pytest.mark.slow
def test_run_ends_with_the_tables_that_ltbench_table_prints(tmp_path, capsys):
    path = two_methods(tmp_path, tables={"main": {**TABLES["main"], "caption": "Two methods at rho 2"}})
    overrides = ["grid.data.imb_factor=[2,6]", "grid.method=[{name: ce}]"]  # 2 runs; the rows split by rho
    assert cli.main(["run", path, *overrides]) == 0
    run_out = capsys.readouterr().out
    assert cli.main(["table", path, *overrides]) == 0
    table_out = capsys.readouterr().out.strip()
    assert "| CE (imb_factor=2)" in table_out and "| CE (imb_factor=6)" in table_out
    assert table_out in run_out and run_out.rstrip().endswith("2 done")
    assert "made with the command-line override(s) grid.data.imb_factor=[2,6] grid.method=[{name: ce}]; the " \
           "caption describes the recipe as written" in table_out  # the caption is the recipe's text


def test_a_results_folder_not_found_says_where_it_looked(tmp_path, monkeypatch, capsys):
    """Relative results_dir: from the working directory, for every command; run from elsewhere, the
    command names the folder it tried and the one it found beside the recipe."""
    study = tmp_path / "study"
    study.mkdir()
    recipe = deep_update(TINY, {"name": "away"})
    (study / "away.yaml").write_text(yaml.safe_dump(recipe))
    (study / "results" / "away" / "0123abcd").mkdir(parents=True)  # as if launched from study/
    monkeypatch.chdir(tmp_path)
    assert cli.main(["status", "study/away.yaml"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        f"study/away.yaml: no results folder {tmp_path / 'results' / 'away'} (results_dir 'results' is taken from "
        f"the working directory, {tmp_path}); found {study / 'results' / 'away'}: run the command from {study} "
        f"or add --results {study / 'results'}")
    assert out.splitlines()[-1] == "1 pending"  # the recipe's runs, after the line that says where it looked
    assert cli.main(["table", "study/away.yaml"]) == 2
    assert f"no results folder {tmp_path / 'results' / 'away'}" in capsys.readouterr().err
    monkeypatch.chdir(study)
    assert cli.main(["status", "away.yaml"]) == 0
    assert "no results folder" not in capsys.readouterr().out


def test_the_documented_pivot_over_methods_builds_and_says_when_it_cannot(tmp_path):
    """docs/tables.md, 'Pivoting over methods that have different options': its table, on CE and LA (tau=1)
    at two imbalance factors, has one configuration per cell; a second LA setting is refused by name."""
    from tests.conftest import ROOT

    text = (ROOT / "docs" / "tables.md").read_text()
    section = text[text.index("### Pivoting over methods that have different options"):]
    tables = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S)[1])["tables"]
    grid = {"method": [{"name": "ce"}, {"name": "la", "tau": 1.0}], "data.imb_factor": [10, 100]}
    data = {"max_per_class": 100}
    check_recipe_tables(load_recipe(two_methods(tmp_path, "piv", tables=tables, grid=grid, data=data)))
    grid["method"].append({"name": "la", "tau": 2.0})
    with pytest.raises(ConfigError, match=r"rows\[0\]\.where matches 2 different configurations \(they differ in method\.tau"):
        check_recipe_tables(load_recipe(two_methods(tmp_path, "piv2", tables=tables, grid=grid, data=data)))
