"""Launchers: decide which runs still need doing (from disk) and hand their specs to workers.

Every launcher ends in ``runner.run_one(spec)``; only where it runs differs.
"""

from __future__ import annotations

from pathlib import Path

from ltbench import store
from ltbench.errors import DataMissingError
from ltbench.recipe import Recipe, run_label


def preflight(recipe: Recipe) -> None:
    """Stop before any run starts when a dataset is missing (one message, not one per run)."""
    import json

    from ltbench.config import from_dict
    from ltbench.registry import DATASETS

    seen = set()
    for spec in recipe.runs:
        data = dict(spec["config"]["data"])
        key = json.dumps(data, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        builder = DATASETS.get(data.pop("name"))
        check = getattr(builder(from_dict(builder.Config, data, "data")), "check", None)
        if callable(check):
            check()


def todo(recipe: Recipe, rerun_failed: bool) -> tuple[list[dict], dict[str, int]]:
    """Runs to launch now, and the count of each status found on disk."""
    counts: dict[str, int] = {}
    out = []
    for spec in recipe.runs:
        status = store.run_status(Path(spec["run_dir"]))
        counts[status] = counts.get(status, 0) + 1
        if status == "done" or (status == "failed" and not rerun_failed):
            continue
        if status == "failed":
            (Path(spec["run_dir"]) / store.RESULT).unlink()
        out.append(spec)
    return out, counts


def print_plan(recipe: Recipe) -> int:
    print(f"recipe {recipe.name}: {len(recipe.runs)} run(s) -> {recipe.root}")
    for spec in recipe.runs:
        c = spec["config"]
        status = store.run_status(Path(spec["run_dir"]))
        print(f"  {spec['run_id']}  {status:<8} {c['data']['name']} rho={c['data'].get('imb_factor', '-')} "
              f"{c['backbone']['name']} {run_label(spec)} seed={c['seed']}")
    return 0


def launch(recipe: Recipe, rerun_failed: bool = False, wait: bool = False) -> dict[str, int]:
    store.ensure_writable(recipe.root)
    preflight(recipe)
    specs, found = todo(recipe, rerun_failed)
    skipped = found.get("done", 0) + (0 if rerun_failed else found.get("failed", 0))
    print(f"recipe {recipe.name}: {len(recipe.runs)} run(s), {len(specs)} to run, {skipped} already finished "
          f"(results in {recipe.root})")
    name = recipe.launcher.name
    if name == "local":
        run_local(specs, recipe.launcher.jobs)
    else:
        from ltbench import slurm

        slurm.submit(recipe, specs, wait=wait)
        if not wait:
            return {"failed": 0}
    return summarize(recipe)


def run_local(specs: list[dict], jobs: int = 1) -> None:
    from ltbench.runner import run_one

    for i, spec in enumerate(specs, 1):
        c = spec["config"]
        print(f"[{i}/{len(specs)}] {run_label(spec)} on {c['data']['name']} seed {c['seed']} ({spec['run_id']})")
        status = run_one(spec, say=lambda msg: print(f"  {msg}", flush=True))
        if status == "failed":
            result = store.read_result(Path(spec["run_dir"])) or {}
            print(f"  FAILED: {result.get('error', '?')}")


def summarize(recipe: Recipe) -> dict[str, int]:
    counts: dict[str, int] = {}
    for spec in recipe.runs:
        s = store.run_status(Path(spec["run_dir"]))
        counts[s] = counts.get(s, 0) + 1
    from ltbench import report

    df = report.collect(recipe.root)
    ids = {s["run_id"] for s in recipe.runs}
    if not df.empty:
        df = df[df["run_id"].isin(ids)]
    if not df.empty and (df["status"] == "done").any():
        print()
        print(report.table(df))
    print(f"\n{', '.join(f'{v} {k}' for k, v in sorted(counts.items()))}")
    return counts


def print_status(root: Path) -> int:
    root = Path(root)
    if not root.exists():
        raise DataMissingError(f"{root}: no such results directory")
    counts: dict[str, int] = {}
    for run_dir in sorted(p for p in root.iterdir() if p.is_dir() and (p / store.SPEC).exists()):
        status = store.run_status(run_dir)
        counts[status] = counts.get(status, 0) + 1
        line = f"{run_dir.name}  {status}"
        if status == "failed":
            err = (store.read_result(run_dir) or {}).get("error", "")
            line += f"  {err.strip().splitlines()[-1] if err.strip() else ''}"
        elif status == "running":
            rows = store.read_jsonl(run_dir / store.LOG)
            if rows:
                line += f"  epoch {rows[-1].get('epoch')}"
        print(line)
    print(", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "no runs")
    return 0
