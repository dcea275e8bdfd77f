"""The results store on its own: which result files are usable, file modes, leftover temporary files,
a full disk, and run claims (one owner per run, freed when the owner dies)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ltbench.results import status_rule, store
from ltbench.errors import DiskFullError
from tests.conftest import ROOT
from tests.reportkit import complete_result

HEADER = {"status": "done", "run_id": "abc", "seed": 0,
          "config": {"data": {"name": "synthetic_lt"}, "backbone": {"name": "resnet8"}, "method": {"name": "ce"}}}
GOOD = complete_result({
    **HEADER, "metrics": {"all": 0.5, "many": 0.75, "medium": None, "few": 0.25, "per_class": [0.75, None, 0.25],
                          "groups": {"many_threshold": 100, "few_threshold": 20}},
    "data": {"num_classes": 3, "class_counts_train": [200, 50, 10], "class_counts_test": [1, 0, 1]}})


def _with(**changes) -> bytes:
    out = json.loads(json.dumps(GOOD))
    for dotted, value in changes.items():
        node, *path = out, *dotted.split("__")
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    return json.dumps(out).encode()


def _without(*path: str) -> bytes:
    out = json.loads(json.dumps(GOOD))
    node = out
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]
    return json.dumps(out).encode()


DAMAGED = {
    "truncated": (json.dumps(GOOD).encode()[:40], "not valid JSON"),
    "empty file": (b"", "empty"),
    "a list": (b"[]", "JSON list"),
    "an empty object": (b"{}", "has no status"),
    "status only": (b'{"status": "done"}', "run_id is missing"),
    "non-UTF-8": (b'{"status": "done", "x": "\xff\xfe"}', "not UTF-8"),
    "metric is a string": (_with(metrics__all="0.5"), "metrics.all"),
    "metric out of range": (_with(metrics__few=7), "metrics.few"),
    "metric NaN": (json.dumps({**GOOD, "metrics": {**GOOD["metrics"], "many": float("nan")}}).encode(), "metrics.many"),
    "metrics missing": (_with(metrics=None), "metrics is null"),
    "all is null": (_with(metrics__all=None), "metrics.all is null"),
    "head metric a string": (_with(metrics__heads={"aux": {"all": "x"}}), "metrics.heads.aux.all"),
    "per_class strings": (_with(metrics__per_class=["a"]), "per_class"),
    "unknown status": (_with(status="running"), "status is 'running'"),
    "no config": (_with(config={}), "config"),
    # a done record proves its summary (issue 52): without per-class values or class counts it cannot
    "per_class deleted": (_without("metrics", "per_class"), "metrics.per_class is missing"),
    "test counts deleted": (_without("data", "class_counts_test"), "data.class_counts_test is missing"),
    "train counts deleted": (_without("data", "class_counts_train"), "data.class_counts_train is missing"),
    "groups deleted": (_without("metrics", "groups"), "metrics.groups is missing"),
    "all disagrees": (_with(metrics__all=0.99), "metrics.all is 0.99, its per-class accuracies give 0.5"),
    "many without a many-shot class": (_with(data__class_counts_train=[50, 50, 10]), "metrics.many is 0.75, but no"),
    # cost in the schema: a finite number >= 0 within the run's elapsed time x devices, or null when unrecorded
    **{f"device_seconds {bad!r}": (_with(device_seconds=bad), "device_seconds is")
       for bad in (1e308, float("nan"), -5, "12", True, None, 3 * 24 * 3600)},
    "run_started unrecorded but not listed": (_with(run_started=None), "run_started is null"),
    "unrecorded names a field with a value": (_with(unrecorded=["device_seconds"]), "unrecorded names 'device_seconds'"),
    "numerics field missing": (_without("numerics", "cpu_id"), "numerics.cpu_id is missing"),
    "method_display missing": (_without("method_display"), "method_display is missing"),
    "config section not a mapping": (_with(config__data="synthetic_lt"), "config"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_unusable_results_are_named_and_never_done(tmp_path, case):
    content, reason = DAMAGED[case]
    (tmp_path / store.RESULT).write_bytes(content)
    (tmp_path / store.STARTED).write_text("{}")  # a finished-but-truncated run is not 'running'
    check = store.check_result(tmp_path)
    assert check.state == "unusable" and not check.usable and check.result is None
    assert reason in check.reason, check.reason
    assert store.read_result(tmp_path) is None
    assert status_rule.run_status(tmp_path) == "damaged"


def test_usable_results_and_missing_and_directory(tmp_path):
    (tmp_path / store.RESULT).write_bytes(_with())
    # usable and finished, but it records no code: never plain 'done' (identity.code_state)
    assert store.check_result(tmp_path).state == "done" and status_rule.run_status(tmp_path) == store.CODE_UNKNOWN
    (tmp_path / store.RESULT).write_bytes(json.dumps(complete_result({**HEADER, "status": "failed"})).encode())
    assert status_rule.run_status(tmp_path) == "failed"
    (tmp_path / store.RESULT).unlink()
    assert store.check_result(tmp_path).state == "missing" and status_rule.run_status(tmp_path) == "pending"
    (tmp_path / store.RESULT).mkdir()
    assert store.check_result(tmp_path).reason == "result.json is a directory"


def test_started_run_is_running_while_its_process_lives_and_interrupted_after(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    import socket

    store.atomic_write_json(tmp_path / store.STARTED, {"host": socket.gethostname(), "pid": proc.pid})
    assert status_rule.run_status(tmp_path) == "running"
    proc.kill()
    proc.wait()
    assert status_rule.run_status(tmp_path) == "interrupted"
    store.atomic_write_json(tmp_path / store.STARTED, {"host": "another-node", "pid": proc.pid})
    assert status_rule.run_status(tmp_path) == "running"  # another host: cannot tell, never 'interrupted'


def test_written_files_are_readable_by_others_like_log_jsonl(tmp_path):
    store.atomic_write_json(tmp_path / "a.json", {"x": 1})
    store.atomic_write_bytes(tmp_path / "b.bin", b"x")
    store.append_jsonl(tmp_path / "log.jsonl", {"epoch": 1})
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes["a.json"] == modes["b.bin"] == modes["log.jsonl"] == store.FILE_MODE
    assert store.FILE_MODE & 0o044  # group/other can read under the usual umask (022 or 002)


def test_leftover_temporary_files_are_removed_by_the_owner(tmp_path):
    owned = tmp_path / f".{store.CHECKPOINT}{store.TMP_MARK}abc"
    fresh = tmp_path / f".{store.SPEC}{store.TMP_MARK}new"  # a launcher may be writing this one now
    old = tmp_path / f".{store.CONFIG}{store.TMP_MARK}old"
    for p in (owned, fresh, old):
        p.write_bytes(b"partial")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    removed = store.remove_stale_tmp(tmp_path)
    assert sorted(removed) == sorted([owned.name, old.name])
    assert fresh.exists() and not owned.exists() and not old.exists()


def test_disk_full_names_the_path_and_the_space_needed(tmp_path, monkeypatch):
    target = tmp_path / store.CHECKPOINT
    target.write_bytes(b"x" * 3_000_000)  # the old checkpoint stays until the new one is complete

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(DiskFullError) as info:
        store.atomic_write_bytes(target, b"y" * 2_000_000)
    msg = str(info.value)
    assert str(target) in msg and "5.0 MB" in msg and "MB free now" in msg
    assert [p.name for p in tmp_path.iterdir()] == [store.CHECKPOINT]  # no temporary file left
    with pytest.raises(DiskFullError, match="log.jsonl"):
        store.append_jsonl(tmp_path / "log.jsonl", {"epoch": 1})


def test_a_run_has_one_owner_and_is_free_again_when_the_owner_dies(tmp_path):
    claim = store.claim_run(tmp_path)
    assert claim is not None and store.claim_run(tmp_path) is None  # even from the same process
    claim.close()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from ltbench.results import store; "
         "c = store.claim_run(sys.argv[1]); print('held', flush=True); time.sleep(60)", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert holder.stdout.readline().strip() == "held"
    assert store.claim_run(tmp_path) is None
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    again = store.claim_run(tmp_path)  # the kernel dropped the dead owner's lock: no cleanup needed
    assert again is not None
    again.close()


def test_claim_waits_when_asked_and_names_the_mount_where_locks_are_refused(tmp_path, monkeypatch):
    held = store.claim_run(tmp_path)
    t0 = time.monotonic()
    assert store.claim_run(tmp_path, wait_s=0.3) is None and time.monotonic() - t0 >= 0.3
    held.close()
    import fcntl

    def refuse(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)
    with pytest.raises(store.LocksUnsupported, match="file locks do not work on its filesystem"):
        store.claim_run(tmp_path)
    with pytest.raises(store.LocksUnsupported, match=r"\(/[^,]*, \w+: No locks available\).*mount"):
        store.ensure_writable(tmp_path / "new")
