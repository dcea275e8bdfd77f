"""``run_one(spec)``: the only function any launcher executes, locally or on a cluster node.

The spec is plain data (no pickled models, datasets or classes): the worker repeats plugin
discovery from it, so it runs the same in this process, a subprocess or a Slurm job.
"""

from __future__ import annotations

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


def run_one(spec: dict, say=print) -> str:
    """Run (or resume) one run and write its result.json; returns the run's status."""
    run_dir = prepare_run_dir(spec)
    if store.run_status(run_dir) == "done":
        return "done"
    from ltbench import engine, provenance  # torch is imported only by workers

    registry.add_plugin_paths(spec.get("plugins", []))
    started = time.time()
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
        "provenance": provenance.collect(),
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
    result["ended"] = time.time()
    result["wall_seconds"] = result["ended"] - started
    store.atomic_write_json(run_dir / store.RESULT, result)
    return result["status"]
