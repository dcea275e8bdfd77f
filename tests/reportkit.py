"""Result trees for table tests: a recipe's runs with made-up but deterministic metrics, written as
the engine writes them (result.json, spec.json), so tables are tested without training anything."""

from __future__ import annotations

import json
from pathlib import Path

from ltbench.results import code, identity, schema
from ltbench.results.runspec import RunSpec

PRIORS = ["forward50", "forward10", "uniform", "backward10", "backward50"]


def fake_metrics(config: dict, seed: int) -> dict:
    m = config["method"]
    base = {"ce": 0.60, "la": 0.64 + 0.01 * float(m.get("tau", 1.0))}.get(m["name"], 0.5)
    base += 0.01 * (config["optim"]["epochs"] - 2) - 0.002 * float(config["data"]["imb_factor"])
    base += (seed - 1) * 0.004 + (0.003 if seed == 2 and m["name"] == "la" else 0.0)
    groups = {"many": base + 0.2, "medium": base, "few": base - 0.25, "all": base}
    priors = {p: {"all": base + (0.1 - 0.05 * i)} for i, p in enumerate(PRIORS)}
    groups = {k: round(v, 4) for k, v in groups.items()}
    per_class = [groups["many"], groups["many"], groups["medium"], groups["few"]]  # agrees with the groups
    return {**groups, "per_class": per_class,
            "groups": {"many_threshold": 10, "few_threshold": 4}, "target_priors": priors,
            "heads": {"aux": {g: round(v - 0.01, 4) for g, v in groups.items()}}}


# Every made-up result records a code record that checks as unchanged (this very file, hashed when it is
# written) and one set of numerics, so the tables' notes are about what each test is about.
def code_entry(module: str, path: str) -> dict:
    """What a result records of one module (as ltbench's code record does): its relative path, the sha256 of
    its bytes and that of its normalised syntax tree."""
    return {"path": identity.relative_code_path(module, path), "sha256": identity.file_sha256(path),
            "normalized": identity.normalized_file_hash(path)}


FAKE_CODE = {"code": {"tests.reportkit": code_entry("tests.reportkit", __file__)},
             "code_scope": code.CODE_SCOPE}
FAKE_NUMERICS = {"device": "cpu", "cpu_model": "a test CPU", "cpu_capability": "DEFAULT", "threads": 1,
                 "torch": "x", "torchvision": "x", "precision": "fp32", "compile": "off", "channels_last": False,
                 "world_size": 1}


def write_run(spec: RunSpec | dict, status: str = "done", metrics: dict | None = None, **fields) -> Path:
    """``spec``: a recipe's run, or the plain form of a made-up one (a stage-2 result's folder, say); ``fields``
    join a result (``device_seconds=60.0``, say)."""
    spec = RunSpec.coerce(spec)
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(json.dumps({"schema_version": schema.SCHEMA_VERSION, **spec.to_dict()}))
    if status in ("done", "failed"):
        result = {"schema_version": schema.SCHEMA_VERSION, "run_id": spec.run_id, "recipe": spec.recipe, "status": status,
                  "seed": spec.config["seed"], "grid": spec.grid, "config": spec.config,
                  "data": {"class_counts_train": [24, 12, 6, 3]},
                  "provenance": {"git_commit": "0" * 40, "ltbench_version": "0.1.0", "torch": "x"},
                  "device": "cpu", "wall_seconds": 1.0, **FAKE_CODE, "numerics": FAKE_NUMERICS, **fields}
        if status == "done":
            result["metrics"] = metrics or fake_metrics(spec.config, spec.config["seed"])
        else:
            result["error"] = "Traceback ...\nRuntimeError: loss is nan at epoch 2"
        (run_dir / "result.json").write_text(json.dumps(result, indent=1))
    elif status == "running":
        (run_dir / "started.json").write_text("{}")
    return run_dir


def populate(recipe, skip=(), status: dict | None = None) -> None:
    """Write every run of ``recipe`` except those whose (label predicate) is in ``skip``; ``status``
    maps (method name, tau or None, imb_factor, epochs, seed) -> 'failed' | 'pending' | 'running'."""
    status = status or {}
    for spec in recipe.runs:
        key = run_key(spec)
        if key in skip:
            continue
        write_run(spec, status.get(key, "done"))


def run_key(spec: dict) -> tuple:
    c = spec.config
    return (c["method"]["name"], c["method"].get("tau"), c["data"]["imb_factor"], c["optim"]["epochs"], c["seed"])
