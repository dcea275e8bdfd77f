"""One rule for a run's status (``status_rule.run_state``): the launcher, 'ltbench status' and the runner under the
run's lock reach the same verdict on every state a run folder can be in, stale included."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ltbench.results import status_rule, store
from ltbench.run.launch import runs_to_launch
from ltbench.recipe import load_recipe
from ltbench.run.run_status_view import describe_run, print_status
from ltbench.runner import _needs_running
from ltbench.results.runspec import RunSpec
from tests.reportkit import write_run


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _make_state(spec: dict, state: str) -> None:
    """Put the run folder of ``spec`` in ``state`` as a real run would leave it."""
    if state == "pending":
        return
    if state in ("done", "failed", "stale", store.CODE_UNKNOWN):
        run_dir = write_run(spec, "failed" if state == "failed" else "done")
        result = json.loads((run_dir / store.RESULT).read_text())
        if state == "stale":  # recorded with a normalised hash the module's file no longer has
            result["code"] = {"ltbench.results.store": {"path": "ltbench/results/store.py", "normalized": "0" * 64}}
        elif state == store.CODE_UNKNOWN:  # recorded before ltbench recorded code at all
            result.update(code=None, code_scope=None)
        (run_dir / store.RESULT).write_text(json.dumps(result))
        return
    run_dir = write_run(spec, "pending")
    if state == "damaged":
        (run_dir / store.RESULT).write_text('{"status": "done"}')
    else:  # a worker started it: alive (this process) or gone (a finished process's pid)
        pid = os.getpid() if state == "running" else _dead_pid()
        (run_dir / store.STARTED).write_text(json.dumps({"host": socket.gethostname(), "pid": pid}))


KEPT = {"done", "failed", "stale", store.CODE_UNKNOWN}  # what a plain launch leaves alone


@pytest.mark.parametrize("redo", [(), ("failed", "stale")])
@pytest.mark.parametrize("state", ["pending", "done", "failed", "stale", store.CODE_UNKNOWN, "damaged",
                                   "interrupted", "running"])
def test_launcher_status_and_runner_agree(tmp_path, write_recipe, capsys, state, redo):
    recipe = load_recipe(write_recipe())
    spec = recipe.runs[0]
    recipe.runs = [spec]
    run_dir = Path(spec.run_dir)
    _make_state(spec, state)

    assert status_rule.run_status(run_dir) == state
    todo, found = runs_to_launch(recipe, redo)
    assert found == {state: 1}
    assert describe_run(run_dir, listed=True)[0] == state
    capsys.readouterr()
    print_status(recipe.root, recipe.runs)
    assert f"{spec.run_id}  {state:<11}" in capsys.readouterr().out

    expected_to_run = state not in KEPT or state in redo
    assert (todo == [spec]) is expected_to_run
    assert status_rule.to_run(state, redo) is expected_to_run
    runner_runs = _needs_running(RunSpec.coerce(spec), run_dir, redo, say=lambda msg: None)
    assert runner_runs is expected_to_run  # decided last: a run to redo has its old result set aside


def test_an_empty_folder_of_a_recipe_run_is_pending_like_the_launcher_says(tmp_path, write_recipe):
    """A run folder the recipe names, but empty (made by hand, or emptied): the launcher runs it, so status
    says 'pending'; only a folder found by scanning a results directory is 'not a run'."""
    recipe = load_recipe(write_recipe())
    run_dir = Path(recipe.runs[0].run_dir)
    run_dir.mkdir(parents=True)
    assert describe_run(run_dir, listed=True)[0] == "pending"
    assert describe_run(run_dir)[0] == "not a run"
