"""'ltbench run' and 'ltbench status' on damaged run folders: a note per run, never a crash, never a
silent drop; an unusable result is run again (here: re-evaluated from the final checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ltbench.results import store
from ltbench.recipe import load_recipe


def _damage(run_dirs: list[Path], tmp_path: Path) -> dict[str, str]:
    """Damage each run differently; returns run id -> the status line text 'ltbench status' must show."""
    good = json.loads((run_dirs[5] / store.RESULT).read_text())
    (run_dirs[0] / store.RESULT).write_text((run_dirs[0] / store.RESULT).read_text()[:100])  # truncated
    (run_dirs[0] / f".{store.RESULT}{store.TMP_MARK}killed").write_text("{")  # a write killed before its rename
    (run_dirs[1] / store.RESULT).write_text("[]")
    (run_dirs[2] / store.RESULT).write_text("{}")
    (run_dirs[3] / store.RESULT).write_text('{"status": "done"}')
    (run_dirs[4] / store.RESULT).write_bytes(b'{"status": "done", "note": "\xff\xfe"}')
    good["metrics"]["all"] = "0.93"
    (run_dirs[5] / store.RESULT).write_text(json.dumps(good))
    (run_dirs[6] / store.SPEC).unlink()
    (run_dirs[7] / store.RESULT).unlink()
    (run_dirs[7] / store.LOG).unlink()
    (run_dirs[7] / store.LOG).mkdir()
    (tmp_path / "results" / "tiny" / "emptydir").mkdir()
    return {
        run_dirs[0].name: "damaged result.json is not valid JSON",
        run_dirs[1].name: "damaged result.json holds a JSON list",
        run_dirs[2].name: "damaged result.json has no status",
        run_dirs[3].name: "damaged result.json run_id is missing",
        run_dirs[4].name: "damaged result.json is not UTF-8",
        run_dirs[5].name: "damaged result.json metrics.all is '0.93'",
        run_dirs[6].name: "done spec.json missing",
        run_dirs[7].name: "log.jsonl is not a file",
    }


@pytest.mark.slow
def test_run_and_status_survive_damaged_run_folders(tmp_path, write_recipe, cli):
    recipe = write_recipe(extra={"seeds": list(range(8)), "optim": {"epochs": 1}})
    first = cli("run", recipe)
    assert first.returncode == 0, first.stdout + first.stderr
    run_dirs = [Path(s.run_dir) for s in load_recipe(recipe).runs]
    modes = {p.name: p.stat().st_mode & 0o777 for p in run_dirs[0].iterdir()}
    for name in (store.RESULT, store.SPEC, store.CONFIG, store.STARTED, store.CHECKPOINT):
        assert modes[name] == modes[store.LOG] and modes[name] & 0o044, modes  # readable by others

    expected = _damage(run_dirs, tmp_path)
    status = cli("status", tmp_path / "results" / "tiny")  # a results folder: needs no recipe, no torch
    assert status.returncode == 0 and not status.stderr, status.stderr
    lines = status.stdout.splitlines()
    for run_id, text in expected.items():
        line = " ".join(next(l for l in lines if l.startswith(run_id)).split())
        state, note = text.split(" ", 1) if text.startswith(("damaged ", "done ")) else ("", text)
        assert note in line and (not state or line.split()[1] == state) and "running" not in line, line
    assert "emptydir not a run empty folder; ignored" in " ".join(status.stdout.split())

    again = cli("run", recipe)
    assert again.returncode == 0 and not again.stderr, again.stdout + again.stderr
    assert "6 run(s) have an unusable result.json: they run again" in again.stdout
    assert "moved it to result.json.damaged" in again.stdout and "log.jsonl was not a file" in again.stdout
    for run_dir in run_dirs:
        assert store.check_result(run_dir).state == "done", run_dir
        assert [r["epoch"] for r in store.read_jsonl(run_dir / store.LOG)] == [1] or run_dir == run_dirs[7]
    assert (run_dirs[1] / "result.json.damaged").read_text() == "[]"  # kept for a look
    assert (run_dirs[7] / "log.jsonl.damaged").is_dir()
    assert not list(run_dirs[0].glob(f".*{store.TMP_MARK}*"))
    assert (run_dirs[6] / store.SPEC).is_file()
    assert "8 done" in cli("status", tmp_path / "results" / "tiny").stdout
