"""Text outputs cannot be forged: a recipe's texts hold no control character (refused at load, naming the
field); a text that comes from data (a result.json's configuration, an error) is one line in markdown with its
'|' escaped, neutralised in CSV when a spreadsheet would read it as a formula (OWASP's rule, text cells only),
and never brings a control character to the terminal or the .tex (docs/tables.md, docs/trust.md)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import yaml

from ltbench import report
from ltbench.errors import ConfigError
from ltbench.recipe import load_recipe
from reportkit import complete_result, populate

from tests.conftest import run_cli

FORGED = "1+2|\n| forged | 99.00 | 1 |\x1b[2J\x07\r\x00"
CONTROLS = ("\x1b", "\x07", "\r", "\x00")


def _recipe(tmp_path: Path, tables: dict | None = None) -> Path:
    recipe = {"name": "t", "results_dir": str(tmp_path / "results"), "seeds": [0, 1],
              "grid": {"method": [{"name": "ce"}, {"name": "la", "tau": 1.0}]},
              "data": {"name": "synthetic_lt", "num_classes": 4, "max_per_class": 8, "imb_factor": 4,
                       "test_per_class": 2},
              "backbone": {"name": "resnet8"}, "method": {"name": "ce"},
              "optim": {"epochs": 1, "warmup_epochs": 0}, **({"tables": tables} if tables else {})}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.mark.parametrize("field, value", [
    ("caption", "Main\x1b[31m results"),
    ("rows", [{"label": "CE\n| forged |", "where": {"method.name": "ce"}}]),
    ("group_labels", {"x": "title\x07"}),
    ("pivot_labels", {"data.imb_factor": {"4": "rho\r=4"}}),
])
def test_a_control_character_in_a_table_text_is_refused_at_load(tmp_path, field, value):
    table = {"caption": "Main", field: value} if field != "pivot_labels" else {"pivot": ["data.imb_factor"], field: value}
    if field == "group_labels":
        table["group_by"] = "method.name"
    path = _recipe(tmp_path, {"main": table})
    with pytest.raises(ConfigError, match=rf"tables\.main\.{field}.*control character U\+00"):
        load_recipe(path)
    got = run_cli("run", path, "--dry-run", timeout=240)
    assert got.returncode == 2 and len([x for x in got.stderr.splitlines() if x.strip()]) == 1, got.stderr
    assert "control character" in got.stderr and "Traceback" not in got.stderr


FORMULA = '=HYPERLINK("http://x.invalid")'


@pytest.fixture
def forged_folder(tmp_path) -> Path:
    """A results folder whose records carry texts a table prints: a method option with '|', a newline and
    control characters, a method name a spreadsheet would run, a failed run's error with ESC sequences."""
    recipe = load_recipe(_recipe(tmp_path))
    populate(recipe)
    specs = recipe.runs
    edits = {specs[-1].run_dir: lambda d: d["config"]["method"].__setitem__("tau", FORGED),
             specs[0].run_dir: lambda d: (d["config"]["method"].__setitem__("name", FORMULA),
                                          d.update(method_display=FORMULA)),
             specs[1].run_dir: lambda d: d.update(status="failed", error="boom\x1b[2J\x1b]0;title\x07")}
    for run_dir, edit in edits.items():
        path = Path(run_dir) / "result.json"
        record = json.loads(path.read_text())
        edit(record)
        if record["status"] == "failed":
            record.pop("metrics")
        path.write_text(json.dumps(complete_result(record)))
    return recipe.root


def test_markdown_escapes_the_pipe_and_keeps_one_row_per_row(forged_folder):
    text = report.render(report.tables(forged_folder)[0], "markdown")
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + 4  # header, rule, four rows (the formula, ce, la, the forged la): none added
    assert "\\| forged \\| 99.00 \\|" in text and not any(c in text for c in CONTROLS)


def test_csv_neutralises_formulas_in_text_cells_only(forged_folder):
    text = report.render(report.tables(forged_folder)[0], "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    labels = {r["row"] for r in rows if r["row"]}
    assert "'=HYPERLINK(\"http://x.invalid\")" in labels and not any(label.startswith("=") for label in labels)
    assert not any(c in text for c in CONTROLS) and all(len(r) == len(rows[0]) for r in rows)
    assert all(r["mean"] == "" or float(r["mean"]) >= 0 for r in rows)  # numbers stay numbers (no quote)


def test_a_negative_number_is_not_quoted():
    from ltbench.report.formats import CSV_NUMBERS, csv_text

    assert "versus_difference" in CSV_NUMBERS and "delta" in CSV_NUMBERS
    assert csv_text("-1.25 shot") == "'-1.25 shot" and csv_text("@SUM(A1)") == "'@SUM(A1)"
    assert csv_text("\tx") == "' x" and csv_text("plain") == "plain"


def test_no_control_character_reaches_the_tex_or_the_terminal(forged_folder):
    tex = report.render(report.tables(forged_folder)[0], "latex")
    assert not any(c in tex for c in CONTROLS)
    for args in (["table", forged_folder], ["status", forged_folder], ["table", forged_folder, "--format", "csv"]):
        got = run_cli(*args, timeout=240)
        assert got.returncode == 0, got.stderr
        assert not any(c in got.stdout + got.stderr for c in CONTROLS), (args, got.stdout)
