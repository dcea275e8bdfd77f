"""Generated fault injection (issue 22): a real small results tree (6 tiny runs, their stage-2 results,
feature caches, index and expansion caches), and for every file kind ltbench reads back, each damage
(truncated, a byte flipped, a FIFO, a symlink loop, a huge header, a symlink to /dev/zero), then
``table``, ``status``, ``report``, ``plot``, ``posthoc`` and ``run`` on it. Asserted per case: no internal
error, no traceback, no hang; the healthy run still done and counted; the damaged file named where a
command reads it.

Cost: the commands run in-process in one driver subprocess (one torch import), every command under an
alarm (a hang is a failure, not a stuck suite); the tree is trained once per module.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, TINY, caches_in_the_results_folder, deep_update

SEEDS = 7  # seeds 0-5 take one damage each, seed 6 stays healthy
DAMAGES = ("truncate", "flip", "fifo", "loop", "huge", "devzero")
@pytest.fixture(scope="module", autouse=True)
def _caches_in_the_results_folder():
    with caches_in_the_results_folder():  # tests/conftest.py says why
        yield


PER_RUN_KINDS = {  # case -> files inside a run folder; the command that must name a damaged run it did not repair
    "result": (("result.json",), ("table", "status", "run")),
    "checkpoint": (("checkpoint.pt",), ("posthoc",)),
    "features": (("features/train.npz",), ("posthoc",)),
    "features_meta": (("features/meta.json",), ("posthoc",)),
    "stage2_result": (("posthoc/*/result.json",), ("posthoc",)),
    # files no command must name (a table reads none of them), damaged together to keep the test short
    "predictions_log_spec_started": (("predictions.npz", "log.jsonl", "spec.json", "started.json"), ()),
}
ROOT_KINDS = ("caches",)  # the index and the expansion caches of the recipe's results folder, damaged together
ROOT_FILES = (".ltbench-index", ".ltbench-expansion-*")
COMMANDS = ("table", "status", "report", "plot", "posthoc", "run")
ALARM_S = 120  # far above any command here (seconds), far below the test's timeout


def damage(path: Path, how: str) -> None:
    """Replace ``path`` by a damaged version of itself."""
    data = path.read_bytes() if path.is_file() else b""
    if how not in ("truncate", "flip"):
        path.unlink()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "flip":
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:])
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "loop":
        os.symlink(path.name, path)
    elif how == "devzero":
        os.symlink("/dev/zero", path)
    elif how == "huge":
        path.write_bytes(huge_header(path.name))


def huge_header(name: str) -> bytes:
    """Content whose header claims far more than it holds: deep JSON, an npz member of 10^12 entries,
    an index cache whose JSON part claims 2^60 bytes."""
    if name.endswith((".json", ".jsonl")) or name.startswith(".ltbench-expansion"):
        return b"[" * 200_000
    if name == ".ltbench-index":
        return b"LTBENCH-INDEX\n" + (2 ** 60).to_bytes(8, "little") + b"{}"
    import io

    header = "{'descr': '<u1', 'fortran_order': False, 'shape': (1000000000000,), }".ljust(117) + "\n"
    member = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + b"\x00" * 16
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for key in ("features.npy", "labels.npy", "head:main.npy"):
            zf.writestr(key, member)
    return buffer.getvalue()


# ------------------------------------------------------------------------------------------------
# The driver: runs in a subprocess, in-process CLI calls under an alarm


class Hang(BaseException):
    """Raised by the alarm: a BaseException, so no 'except Exception' on the way can swallow a hang."""


def _alarm(signum, frame):
    raise Hang()


def call(args: list[str], alarm_s: int = ALARM_S) -> dict:
    """One CLI command in this process: exit code and output, or 'hang' after ``alarm_s`` (0: no alarm)."""
    import contextlib
    import io

    from ltbench.cli import main

    out, err = io.StringIO(), io.StringIO()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(alarm_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(args)
    except Hang:
        rc = "hang"
    except BaseException as exc:  # noqa: BLE001 - anything escaping main is what this test looks for
        rc = f"escaped {type(exc).__name__}: {exc}"
    finally:
        signal.alarm(0)
    return {"rc": rc, "out": out.getvalue()[-6000:], "err": err.getvalue()[-3000:]}


def commands(recipe: Path, results: Path, figures: Path) -> dict:
    base = ["--results", str(results)]
    argv = {"table": ["table", str(recipe), *base], "status": ["status", str(recipe), *base],
            "report": ["report", str(recipe), *base, "--test", "none"],
            "plot": ["plot", str(recipe), *base, "--kind", "per_class", "--out", str(figures)],
            "posthoc": ["posthoc", str(recipe), *base], "run": ["run", str(recipe), *base]}
    return {name: call(argv[name]) for name in COMMANDS}


def build(tree: Path) -> Path:
    """Train the tiny runs, fit their stage-2 grid, write the caches; returns the recipe path."""
    recipe = deep_update(TINY, {"name": "faults", "results_dir": str(tree / "results"), "seeds": list(range(SEEDS)),
                                "optim": {"epochs": 1}, "posthoc": [{"name": "la_posthoc", "tau": [1.0]}]})
    path = tree / "faults.yaml"
    path.write_text(yaml.safe_dump(recipe))
    for args in (["run", str(path)], ["posthoc", str(path)], ["table", str(path)]):
        got = call(args, alarm_s=0)  # training on a loaded machine may take minutes: no alarm
        assert got["rc"] == 0, got
    return path


def run_ids(results: Path) -> list[str]:
    specs = sorted((results / "faults").glob("*/spec.json"))
    by_seed = {json.loads(p.read_text())["config"]["seed"]: p.parent.name for p in specs}
    return [by_seed[s] for s in range(SEEDS)]


def drive(tree: Path) -> dict:
    recipe = build(tree)
    pristine = tree / "results"
    ids = run_ids(pristine)
    cases = {}
    for kind, (patterns, _) in PER_RUN_KINDS.items():
        results = tree / f"r-{kind}"
        shutil.copytree(pristine, results, symlinks=True)
        for run_id, how in zip(ids, DAMAGES[:SEEDS - 1]):
            for pattern in patterns:
                (target,) = (results / "faults" / run_id).glob(pattern)
                damage(target, how)
        cases[kind] = commands(recipe, results, tree / f"fig-{kind}")
        cases[kind]["after"] = after_state(results, ids)
    for kind in ROOT_KINDS:
        for how in DAMAGES:
            results = tree / f"r-{kind}-{how}"
            shutil.copytree(pristine, results, symlinks=True)
            call(["table", str(recipe), "--results", str(results)])  # caches for this folder
            call(["status", str(recipe), "--results", str(results)])  # the runs cache (ltbench/recipe/expansion.py)
            for pattern in ROOT_FILES:
                (target,) = (results / "faults").glob(pattern)
                damage(target, how)
            cases[f"{kind}-{how}"] = commands(recipe, results, tree / f"fig-{kind}-{how}")
            cases[f"{kind}-{how}"]["after"] = after_state(results, ids)
    return {"ids": ids, "cases": cases}


def after_state(results: Path, ids: list[str]) -> dict:
    """What is usable on disk once every command ran: run results and stage-2 results, per run id."""
    from ltbench.results import store

    out = {}
    for run_id in ids:
        run_dir = results / "faults" / run_id
        stage2 = [store.check_result(p.parent).state for p in sorted(run_dir.glob("posthoc/*/result.json"))]
        out[run_id] = {"run": store.check_result(run_dir).state, "stage2": stage2}
    return out


# ------------------------------------------------------------------------------------------------
# The tests


@pytest.fixture(scope="module")
def driven(tmp_path_factory):
    tree = tmp_path_factory.mktemp("faults")
    code = f"import json, sys; from pathlib import Path; from tests.test_fault_injection import drive; " \
           f"json.dump(drive(Path({str(tree)!r})), open({str(tree / 'out.json')!r}, 'w'))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=1500,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tree / "out.json").read_text())


CASES = list(PER_RUN_KINDS) + [f"{kind}-{how}" for kind in ROOT_KINDS for how in DAMAGES]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_damaged_files_never_crash_hang_or_hide_healthy_runs(driven, case):
    got = driven["cases"][case]
    ids = driven["ids"]
    healthy = ids[-1]
    for name in COMMANDS:
        result = got[name]
        text = result["out"] + result["err"]
        assert result["rc"] in (0, 1, 2), (name, result)  # never 'hang', never an escaped exception
        assert "internal error" not in text and "Traceback" not in text, (name, text)
        assert len(result["err"].strip().splitlines()) <= 1 or result["rc"] != 2, (name, result["err"])
    status = got["status"]["out"]
    assert any(line.startswith(healthy) and " done" in line for line in status.splitlines()), status
    assert got["after"][healthy] == {"run": "done", "stage2": ["done"]}, got["after"]
    # After 'posthoc' and 'run', every damaged run is whole again (redone, re-extracted, refitted) or named.
    kind = case if case in PER_RUN_KINDS else None
    for name in PER_RUN_KINDS[kind][1] if kind else ():
        said = got[name]["out"] + got[name]["err"]
        for run_id in ids[:-1]:
            whole = got["after"][run_id] == {"run": "done", "stage2": ["done"]} and name == "posthoc"
            assert run_id in said or whole, (name, run_id, said)
    if kind == "result":  # the first table, before 'run' repaired them: each damaged seed named, never 'running'
        assert "running" not in got["table"]["out"] and "| 1/7 |" in got["table"]["out"], got["table"]["out"]
    if kind != "checkpoint":  # a lost checkpoint needs --rebuild-checkpoints (tested in test_faults.py)
        assert all(state == {"run": "done", "stage2": ["done"]} for state in got["after"].values()), got["after"]
    table = got["table"]["out"]
    assert got["table"]["rc"] == 0 and "| CE" in table, table  # ce's display name, recorded by the run
