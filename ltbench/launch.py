"""Launchers: decide which runs still need doing (from disk) and hand their specs to workers.

Every launcher ends in ``runner.run_one(spec)``; only where it runs differs.
"""

from __future__ import annotations

from pathlib import Path

from ltbench import store
from ltbench.errors import DataMissingError
from ltbench.recipe import Recipe, distinct_data, run_label


def preflight(recipe: Recipe) -> None:
    """Stop before any run starts when a dataset is missing (one message, not one per run)."""
    from ltbench.config import from_dict
    from ltbench.registry import DATASETS

    for spec in distinct_data(recipe.runs):
        data = dict(spec["config"]["data"])
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
    """Run specs one after another in this process, or in ``jobs`` worker processes."""
    if jobs > 1 and len(specs) > 1:
        return run_pool(specs, jobs)
    from ltbench.runner import run_one

    for i, spec in enumerate(specs, 1):
        c = spec["config"]
        print(f"[{i}/{len(specs)}] {run_label(spec)} on {c['data']['name']} seed {c['seed']} ({spec['run_id']})")
        status = run_one(spec, say=lambda msg: print(f"  {msg}", flush=True))
        if status == "failed":
            result = store.read_result(Path(spec["run_dir"])) or {}
            print(f"  FAILED: {result.get('error', '?')}")


def run_pool(specs: list[dict], jobs: int) -> None:
    """A DomainBed-style pool: ``jobs`` workers (``python -m ltbench.runner spec.json``), each pinned to
    one GPU when there are GPUs and given its share of the CPU threads; output in the run directory."""
    import os
    import subprocess
    import sys
    import time

    from ltbench.runner import prepare_run_dir

    gpus = _visible_gpus()
    threads = max(1, (os.cpu_count() or 1) // jobs)
    queue = list(specs)
    running: list[tuple[subprocess.Popen, dict, object]] = []
    free_slots = list(range(jobs))
    while queue or running:
        while queue and free_slots:
            slot = free_slots.pop(0)
            spec = queue.pop(0)
            run_dir = prepare_run_dir(spec)
            env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = gpus[slot % len(gpus)]
            env["LTBENCH_WORKER_SLOT"] = str(slot)
            log = open(run_dir / "worker.log", "a")
            proc = subprocess.Popen([sys.executable, "-m", "ltbench.runner", str(run_dir / store.SPEC)],
                                    stdout=log, stderr=subprocess.STDOUT, env=env)
            running.append((proc, spec, log, slot))
            print(f"started {run_label(spec)} seed {spec['config']['seed']} ({spec['run_id']}) in slot {slot}")
        time.sleep(0.5)
        for item in list(running):
            proc, spec, log, slot = item
            if proc.poll() is None:
                continue
            running.remove(item)
            log.close()
            free_slots.append(slot)
            status = store.run_status(Path(spec["run_dir"]))
            print(f"finished {spec['run_id']}: {status}")


def _visible_gpus() -> list[str]:
    import os

    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:
        return []


def summarize(recipe: Recipe) -> dict[str, int]:
    counts: dict[str, int] = {}
    for spec in recipe.runs:
        s = store.run_status(Path(spec["run_dir"]))
        counts[s] = counts.get(s, 0) + 1
    from ltbench import report

    text = report.summary_table(recipe)
    if text:
        print()
        print(text)
    print(f"\n{', '.join(f'{v} {k}' for k, v in sorted(counts.items()))}")
    return counts


def print_status(root: Path, specs: list[dict] | None = None) -> int:
    """Each run's state read from disk, and a summary line. ``specs``: the runs of a recipe (so runs
    never launched show as pending); otherwise every run directory under ``root``."""
    root = Path(root)
    if specs is None:
        if not root.exists():
            raise DataMissingError(f"{root}: no such results directory")
        run_dirs = sorted(p for p in root.iterdir() if p.is_dir() and (p / store.SPEC).exists())
    else:
        run_dirs = [Path(s["run_dir"]) for s in specs]
    counts: dict[str, int] = {}
    for run_dir in run_dirs:
        status = store.run_status(run_dir)
        counts[status] = counts.get(status, 0) + 1
        line = f"{run_dir.name}  {status:<8}"
        if status == "failed":
            err = (store.read_result(run_dir) or {}).get("error", "").strip()
            line += f"  {err.splitlines()[-1] if err else ''}"
        elif status == "running":
            rows = store.read_jsonl(run_dir / store.LOG)
            line += f"  epoch {rows[-1].get('epoch')} done" if rows else "  started"
        if status in ("pending", "running") and (run_dir / store.SUBMITTED).exists():
            import json

            line += f"  job {json.loads((run_dir / store.SUBMITTED).read_text()).get('job_id')}"
        print(line)
    print(", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "no runs")
    return 0
