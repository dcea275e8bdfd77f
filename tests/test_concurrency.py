"""Concurrent launches share the work (each run trained once, each epoch logged once), and SIGTERM or
SIGKILL to the parent of a worker pool stops its workers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ltbench.results import status_rule, store
from ltbench.recipe import load_recipe
from tests.conftest import ROOT


def _launch(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ltbench", "run", "--verbose", *map(str, args)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def trained_here(stdout: str) -> set[str]:
    """Run ids this launch trained itself: in-process blocks that logged an epoch, or pool workers that
    finished with a status (not 'skipped'/'already finished')."""
    ids = set(re.findall(r"^finished .*\((\w{12})\): (?:done|FAILED)", stdout, re.M))  # 'finished la seed 0 (id): done'

    for block in re.split(r"^\[\d+/\d+\] ", stdout, flags=re.M)[1:]:
        match = re.search(r"\((\w{12})\)\n", block)
        if match and re.search(r"^  epoch 1/", block, re.M):
            ids.add(match.group(1))
    return ids


@pytest.mark.slow
def test_three_concurrent_launches_train_each_run_once(tmp_path, write_recipe):
    recipe = write_recipe(extra={"seeds": [0, 1, 2, 3, 4, 5], "optim": {"epochs": 2}})
    procs = [_launch(recipe), _launch(recipe), _launch(recipe, "--jobs", "2")]
    outs = [p.communicate(timeout=480)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n\n".join(outs)
    ids = [s.run_id for s in load_recipe(recipe).runs]
    trained = [trained_here(out) for out in outs]
    for run_id in ids:
        assert sum(run_id in t for t in trained) == 1, (run_id, trained, "\n\n".join(outs))
        run_dir = tmp_path / "results" / "tiny" / run_id
        assert [r["epoch"] for r in store.read_jsonl(run_dir / store.LOG)] == [1, 2]
        assert store.check_result(run_dir).state == "done"
    # Each launch says which runs it left to another process, and what became of them: those it set out to
    # run ('N to run', read from disk when it started) and did not train. Counted from its own output, never
    # assumed from an order of events (a launch that starts late finds some runs finished: not 'to run').
    for out, mine in zip(outs, trained):
        to_run = int(re.search(r"^recipe tiny: 6 run\(s\), (\d+) to run", out, re.M).group(1))
        if to_run > len(mine):
            assert f"\n{to_run - len(mine)} run(s) were being run by another process" in out, out
        else:
            assert "being run by another process" not in out, out
    # every run is finished before the summary of the launch that trained it, so the last summary printed
    # counts all six whatever the order of events
    assert any("\n6 done" in out for out in outs), "\n\n".join(outs)


def _pool_with_two_busy_workers(tmp_path, write_recipe) -> tuple[subprocess.Popen, list[int]]:
    recipe = write_recipe(extra={"seeds": [0, 1, 2], "data": {"max_per_class": 400},
                                 "optim": {"epochs": 50, "batch_size": 8}})
    parent = _launch(recipe, "--jobs", "2")
    deadline, pids = time.time() + 600, []  # generous: two workers importing torch on a loaded machine
    while time.time() < deadline and len(pids) < 2 and parent.poll() is None:
        pids = [store.read_started(p.parent).get("pid") for p in (tmp_path / "results").rglob(store.STARTED)]
        pids = [p for p in pids if isinstance(p, int)]
        time.sleep(0.2)
    assert len(pids) == 2, parent.communicate(timeout=30)[0] if parent.poll() is not None else "no workers started"
    return parent, pids


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.time() + within_s
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_pool_parent_stops_its_workers(tmp_path, write_recipe, sig):
    parent, pids = _pool_with_two_busy_workers(tmp_path, write_recipe)
    parent.send_signal(sig)
    out = parent.communicate(timeout=300)[0]  # bounds far above the 10 s grace period: a loaded machine
    try:
        assert all(_gone(pid, 120) for pid in pids), out
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if sig == signal.SIGTERM:
        assert parent.returncode == 130 and "stopped 2 worker(s)" in out and "run the same command again" in out, out
    for run_dir in {p.parent for p in (tmp_path / "results").rglob(store.STARTED)}:
        claim = store.claim_run(run_dir)  # free again: a relaunch resumes these runs
        assert claim is not None
        claim.close()
        assert status_rule.run_status(run_dir) == "interrupted"
