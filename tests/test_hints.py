"""Every hint ltbench prints is followed here: running the command it names (RECIPE = the recipe file)
fixes the state it describes. Tiny synthetic runs, in this process."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ltbench import cli
from ltbench.recipe import load_recipe
from tests.conftest import TINY, deep_update
from tests.reportkit import write_run


def main(argv, capsys) -> tuple[int, str]:
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out + err


def follow(hint_text: str, recipe: Path, capsys) -> tuple[int, str]:
    """Run the command a hint names, with RECIPE replaced by the recipe file."""
    command = hint_text.split("'ltbench ", 1)[1].split("'", 1)[0]
    words = [str(recipe) if w == "RECIPE" else w for w in command.split()]
    return main(words, capsys)


@pytest.fixture
def recipe(tmp_path) -> Path:
    raw = deep_update(TINY, {"results_dir": str(tmp_path / "results"), "seeds": [0, 1],
                             "optim": {"epochs": 1}, "posthoc": [{"name": "la_posthoc", "tau": 1.0}],
                             "method": {"name": "la"}})
    path = tmp_path / "hints.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.slow
def test_missing_seed_hints_name_run_then_posthoc_and_following_them_fills_the_table(recipe, capsys):
    code, out = main(["run", recipe, "seeds=[0]"], capsys)  # seed 1 never run
    assert code == 0
    code, out = main(["table", recipe], capsys)
    run_hint = next(line for line in out.splitlines() if "seed(s) 1 missing (never run" in line)
    assert "'ltbench run RECIPE' runs it" in run_hint
    code, _ = follow(run_hint, recipe, capsys)
    assert code == 0
    code, out = main(["table", recipe], capsys)
    assert "never run" not in out
    fit_hint = next(line for line in out.splitlines() if "missing (never fitted" in line)
    assert "'ltbench posthoc RECIPE' fits it" in fit_hint
    code, _ = follow(fit_hint, recipe, capsys)
    assert code == 0
    code, out = main(["table", recipe], capsys)
    assert "missing" not in out, out


@pytest.mark.slow
def test_posthoc_on_a_failed_run_names_rerun_failed_and_that_fixes_it(recipe, capsys):
    runs = load_recipe(recipe).runs
    assert main(["run", recipe, "seeds=[0]"], capsys)[0] == 0
    write_run(runs[1], "failed")  # seed 1 failed: a plain 'ltbench run' would skip it
    code, out = main(["posthoc", recipe], capsys)
    assert code == 1
    hint = next(line for line in out.splitlines() if "is failed: no stage-2 results" in line)
    assert "'ltbench run RECIPE --rerun-failed'" in hint
    assert "0 to run" in main(["run", recipe], capsys)[1]  # why the hint cannot be a plain 'ltbench run'
    code, _ = follow(hint, recipe, capsys)
    assert code == 0
    code, out = main(["posthoc", recipe], capsys)
    assert code == 0 and "unfinished" not in out, out


def test_status_hint_for_failed_runs_is_followed(recipe, capsys):
    runs = load_recipe(recipe).runs
    write_run(runs[0], "failed")
    code, out = main(["status", recipe], capsys)
    hint = next(line for line in out.splitlines() if line.startswith("to run the failed runs again"))
    follow_text = hint.replace("ltbench run RECIPE --rerun-failed", "'ltbench run RECIPE --rerun-failed'")
    assert follow(follow_text, recipe, capsys)[0] == 0
    assert "failed" not in main(["status", recipe], capsys)[1]
