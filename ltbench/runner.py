"""``run_one(spec)``: the only function any launcher executes, locally or on a cluster node.

The spec is plain data (no pickled models, datasets or classes): the worker repeats plugin
discovery from it, so it runs the same in this process, a subprocess or a Slurm job.
``python -m ltbench.runner RUN_DIR/spec.json`` runs one spec in a fresh process (also under torchrun).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path

import yaml

from ltbench import registry, store
from ltbench.errors import LtbenchError


def prepare_run_dir(spec: dict) -> Path:
    """Create the run directory with its spec and readable config (idempotent)."""
    run_dir = Path(spec["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / store.SPEC).exists():
        store.atomic_write_json(run_dir / store.SPEC, spec)
    if not (run_dir / store.CONFIG).exists():
        store.atomic_write_bytes(run_dir / store.CONFIG, yaml.safe_dump(spec["config"], sort_keys=False).encode())
    return run_dir


def _rank() -> int:
    for var in ("RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def run_one(spec: dict, say=print) -> str:
    """Run (or resume) one run and write its result.json; returns the run's status."""
    main = _rank() == 0
    run_dir = prepare_run_dir(spec) if main else Path(spec["run_dir"])
    if store.run_status(run_dir) in ("done",):
        return "done"
    from ltbench import distributed, engine, provenance  # torch is imported only by workers

    registry.add_plugin_paths(spec.get("plugins", []))
    started = time.time()
    info = provenance.collect()
    if main:
        store.atomic_write_json(run_dir / store.STARTED, {
            "time": started, "host": socket.gethostname(), "pid": os.getpid(),
            "slurm_job_id": info.get("slurm_job_id"), "requeue_count": info.get("requeue_count"),
        })
    result = {
        "schema_version": store.SCHEMA_VERSION,
        "run_id": spec["run_id"],
        "recipe": spec["recipe"],
        "grid": spec.get("grid", {}),
        "config": spec["config"],
        "seed": spec["config"]["seed"],
        "plugins": {e.name: e.source for reg in registry.REGISTRIES.values() for e in reg.entries()
                    if e.name in (spec["config"]["method"]["name"], spec["config"]["data"]["name"],
                                  spec["config"]["backbone"]["name"])},
        "provenance": info,
        "started": started,
    }
    try:
        out = engine.train(spec, run_dir, say=say)
        result.update(status="done", **out)
    except KeyboardInterrupt:
        raise
    except LtbenchError as exc:
        result.update(status="failed", error=str(exc), error_type=type(exc).__name__)
    except Exception as exc:  # any crash is recorded; the grid goes on
        result.update(status="failed", error=f"{type(exc).__name__}: {exc}", error_type=type(exc).__name__,
                      traceback=traceback.format_exc())
    finally:
        distributed.shutdown()
    result["ended"] = time.time()
    result["wall_seconds"] = result["ended"] - started
    if main:
        store.atomic_write_json(run_dir / store.RESULT, result)
    return result["status"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m ltbench.runner RUN_DIR/spec.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    return 0 if run_one(spec) == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
