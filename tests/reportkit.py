"""Result trees for table tests: a recipe's runs with made-up but deterministic metrics, written as
the engine writes them (result.json, spec.json), so tables are tested without training anything."""

from __future__ import annotations

import itertools
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
    return {**groups, "target_priors": priors,  # write_run adds per-class values that agree (``agreeing``)
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
                 "world_size": 1, "device_model": "a test CPU", "cpu_id": "test 1/2/3 flags 0", "blas": "x",
                 "onednn": "x", "mkldnn": {"enabled": True}, "kernel_env": {}, "float32_matmul_precision": "highest",
                 "threads_per_epoch": None}
TRAIN_COUNTS = [24, 12, 6, 3]  # with thresholds 10 and 4: two many-shot classes, one medium, one few
THRESHOLDS = {"many_threshold": 10, "few_threshold": 4}


def agreeing(values: dict) -> tuple[list, list]:
    """(per-class accuracies, test counts) of the four classes of ``TRAIN_COUNTS`` that give exactly the summary
    ``values`` (all, many, medium, few; a group missing: equal to all; null: the group has no test images), as
    schema.agreement_problem checks it: the many-shot pair is split around its mean to carry ``all``."""
    a = values["all"]
    m, d, f = (values.get(g, a) for g in ("many", "medium", "few"))
    smaller = [(1, 1), (1, 3), (3, 1), (3, 3), (1, 9), (9, 1), (9, 9), (1, 29), (29, 1), (29, 29)]
    for (jd, jf), t0, t1 in itertools.product(smaller, range(1, 61), range(1, 61)):
        if t0 == t1:
            continue
        tests = [t0, t1, jd if d is not None else 0, jf if f is not None else 0]
        delta = (sum(tests) * a - (t0 + t1) * m - (d or 0) * tests[2] - (f or 0) * tests[3]) / (t0 - t1)
        per_class = [m + delta, m - delta, d, f]
        if all(v is None or 0 <= v <= 1 for v in per_class):
            return per_class, tests
    raise ValueError(f"no four classes give {values}")


def complete_result(result: dict) -> dict:
    """``result`` with every field schema 3 requires that it does not set, as a training run records it (a
    stage-2 result as stage 2 does), and per-class values and class counts that agree with its metrics."""
    done, stage2 = result.get("status") == "done", result.get("kind") == schema.STAGE2_KIND
    out = {"schema_version": schema.SCHEMA_VERSION, "recipe": None, "grid": {}, "plugins": {}, "seed": 0,
           "provenance": {}, "method_display": result["config"]["method"]["name"], "unrecorded": [], "code": {},
           "code_scope": None, "code_source": None, "kind": None, "started": 1000.0, "ended": 1001.0,
           "wall_seconds": 1.0, **result}
    if done:
        out.setdefault("method_extras", {})
        out.setdefault("numerics", dict(FAKE_NUMERICS))
        out.setdefault("device_seconds", None if stage2 else 1.0)
        if stage2 and out["device_seconds"] is None and "device_seconds" not in out["unrecorded"]:
            out["unrecorded"] = [*out["unrecorded"], "device_seconds"]
        if not stage2:
            elapsed = (out["device_seconds"] or 0) / out.get("world_size", 1) + 1.0  # within the cost's bound
            out = {"device": "cpu", "world_size": 1, "threads": 1, "run_started": out["ended"] - elapsed,
                   "views": ["default"],
                   "selection": {"strategy": "last"}, "parameters": {}, **out}
        metrics = out["metrics"] = dict(out["metrics"])
        data = out["data"] = {"num_classes": 4, "class_counts_train": TRAIN_COUNTS, **(out.get("data") or {})}
        metrics.setdefault("groups", THRESHOLDS)
        if "per_class" not in metrics:
            metrics["per_class"], data["class_counts_test"] = agreeing(metrics)
        if isinstance(metrics.get("val"), dict) and "per_class" not in metrics["val"]:
            metrics["val"] = dict(metrics["val"])
            metrics["val"]["per_class"], data["class_counts_val"] = agreeing(metrics["val"])
    elif result.get("status") == "failed":
        out = {"error": "", "error_type": None, "traceback_file": None, **out}
    return out


def write_run(spec: RunSpec | dict, status: str = "done", metrics: dict | None = None, **fields) -> Path:
    """``spec``: a recipe's run, or the plain form of a made-up one (a stage-2 result's folder, say); ``fields``
    join a result (``device_seconds=60.0``, say)."""
    spec = RunSpec.coerce(spec)
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(json.dumps({"schema_version": schema.SCHEMA_VERSION, **spec.to_dict()}))
    if status in ("done", "failed"):
        result = {"run_id": spec.run_id, "recipe": spec.recipe, "status": status,
                  "seed": spec.config["seed"], "grid": spec.grid, "config": spec.config,
                  "provenance": {"git_commit": "0" * 40, "ltbench_version": "0.1.0", "torch": "x"},
                  "device": "cpu", "wall_seconds": 1.0, **FAKE_CODE, **fields}
        if status == "done":
            result["metrics"] = metrics or fake_metrics(spec.config, spec.config["seed"])
        else:
            result["error"] = "Traceback ...\nRuntimeError: loss is nan at epoch 2"
        (run_dir / "result.json").write_text(json.dumps(complete_result(result), indent=1))
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
