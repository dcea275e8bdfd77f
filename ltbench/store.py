"""The results store: one directory per run, files written atomically, status read from disk.

Layout (``results/<recipe name>/<run id>/``):
  spec.json      what the worker executes (written at launch)
  config.yaml    the resolved configuration, for people
  log.jsonl      one line per epoch (appended; a reader ignores a torn last line)
  checkpoint.pt  the last epoch-end (or timed) checkpoint
  predictions.npz  argmax per test image per head, for paired tests (written just before result.json)
  result.json    the final record; status 'done' or 'failed'
  started.json   written by the worker when it starts (host, pid, Slurm job id, requeue count)
  submitted.json written by a cluster launcher (job ids), so status can say 'pending'

Every file a reader may open whole is written to a temporary file in the same directory, fsynced
and renamed over the target, so a crash leaves the old version or the new one, never half of one.
This module imports no torch, so status and tables work on a login node.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ltbench.errors import LtbenchError

SPEC, CONFIG, LOG, CHECKPOINT, RESULT = "spec.json", "config.yaml", "log.jsonl", "checkpoint.pt", "result.json"
STARTED, SUBMITTED = "started.json", "submitted.json"  # worker start (host, pid, Slurm ids); launcher job ids
SCHEMA_VERSION = 1


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode())


def canonical_line(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, allow_nan=False) + "\n"


def append_jsonl(path: Path, obj: Any) -> None:
    with open(path, "a") as f:
        f.write(canonical_line(obj))
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: Path) -> list[dict]:
    """Read a JSON-lines log, ignoring a torn (partially written) last line."""
    if not Path(path).exists():
        return []
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def ensure_writable(folder: Path) -> Path:
    """Create ``folder`` if needed and prove we can write there; one clear error otherwise."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise LtbenchError(
            f"results directory {folder} is not writable ({exc.strerror or exc}); "
            f"choose another with --results DIR or fix its permissions"
        ) from None
    return folder


def read_result(run_dir: Path) -> dict | None:
    path = Path(run_dir) / RESULT
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def run_status(run_dir: Path) -> str:
    """'done' / 'failed' (result.json), 'running' (a worker started it, no result yet; it may also
    have been interrupted: launching again resumes it) or 'pending' (submitted or never started)."""
    result = read_result(run_dir)
    if result is not None:
        return result.get("status", "failed")
    if (Path(run_dir) / STARTED).exists():
        return "running"
    return "pending"


def iter_results(root: Path) -> list[dict]:
    """Every result.json below ``root`` (recursively), each with its run directory added."""
    out = []
    for path in sorted(Path(root).rglob(RESULT)):
        result = read_result(path.parent)
        if result is not None:
            result["run_dir"] = str(path.parent)
            out.append(result)
    return out
