"""A plugin that ends the process while a run trains in the single-process launcher (``--jobs 1``).

``os._exit(n)`` used to end ltbench at once with the plugin's code and no word: no record, no summary, the
other runs of the grid never started. Now the run fails with one line naming it and the call, and the grid
goes on; from a thread of its own (which cannot unwind the run) ltbench says which run's plugin ended it.
Run through the real command line: were the containment missing, the process would end with code 7.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

EXITER = '''
import os
import sys
import threading

import torch.nn as nn
import torch.nn.functional as F

from ltbench.method import Method
from ltbench.registry import METHODS


@METHODS.register("exiter")
class Exiter(Method):
    """Cross-entropy whose first loss ends the process the way HOW says."""

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)

    def loss(self, features, labels, *, epoch):
        HOW
        logits = self.head(features[0])
        return {"loss": F.cross_entropy(logits, labels), "logits": logits.detach()}

    def predict(self, features, *, target_prior=None):
        return self.head(features)
'''

HOW = {
    "os._exit": "os._exit(7)",
    "sys.exit": "sys.exit(7)",
    "thread": "t = threading.Thread(target=os._exit, args=(7,), name='quitter'); t.start(); t.join()",
}


def _launch(tmp_path: Path, write_recipe, cli, how: str, workers: int = 0):
    folder = tmp_path / "exit_plugins"
    folder.mkdir()
    (folder / "exiter.py").write_text(EXITER.replace("HOW", HOW[how]))
    recipe = write_recipe(extra={"plugins": [str(folder)], "grid": {"method.name": ["exiter", "ce"]},
                                 "optim": {"epochs": 1}, "train": {"num_workers": workers, "progress": False}})
    return cli("run", recipe, "--jobs", "1", timeout=600)


def _records(results: Path) -> dict[str, dict]:
    out = {}
    for path in results.rglob("result.json"):
        record = json.loads(path.read_text())
        out[record["config"]["method"]["name"]] = record
    return out


@pytest.mark.parametrize("how", ["os._exit", "sys.exit"])
def test_a_plugin_ending_the_process_fails_its_run_and_the_grid_goes_on(tmp_path, write_recipe, cli, how):
    out = _launch(tmp_path, write_recipe, cli, how, workers=1 if how == "os._exit" else 0)
    assert out.returncode == 1, out.stdout + out.stderr  # a failed run, not the plugin's 7
    records = _records(tmp_path / "results")
    assert records["ce"]["status"] == "done"  # the other run of the grid went on (its loader workers exited)
    failed = records["exiter"]
    assert failed["status"] == "failed"
    assert f"a plugin of run {failed['run_id']}: training called {how}(7)" in failed["error"]
    failed_lines = [line for line in out.stdout.splitlines() if "FAILED" in line]
    assert len(failed_lines) == 1 and f"{how}(7)" in failed_lines[0], out.stdout
    assert "Traceback" not in out.stdout + out.stderr


def test_os_exit_from_a_plugin_thread_ends_ltbench_with_one_line_naming_the_run(tmp_path, write_recipe, cli):
    out = _launch(tmp_path, write_recipe, cli, "thread")
    assert out.returncode == 7
    said = [line for line in out.stderr.splitlines() if "os._exit" in line]
    assert len(said) == 1, out.stderr
    assert "a plugin of run " in said[0] and "thread 'quitter'" in said[0] and "resumes at the next launch" in said[0]
