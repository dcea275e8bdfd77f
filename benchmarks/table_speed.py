"""How long ``ltbench table`` takes on large result trees (target: 10,000 results, warm index cache, in at
most 1.5 s wall on an idle 2-core machine).

Generates, once, under --root (default /tmp/ltbench-table-speed):
  * many/   a recipe of 10,000 runs (synthetic_lt; 1,000 configurations x 10 seeds) with one
            result.json each, shaped like a real one (10 heads, 11 shifted priors, 100 classes);
  * inat/   a recipe of 1,000 runs whose result.json has iNaturalist 2018's 8,142 classes
            (per-class accuracy, counts, names, kappa: about 1.5 MB each, 1.5 GB in all);
then times ``python -m ltbench table`` in a fresh process, min and median of 3 runs, for:
  cold  no index cache (every result.json parsed; the cache is then written),
  warm  index cache present (what every later call costs),
on the results folder and on the recipe file (whose expansion is cached too).

    python benchmarks/table_speed.py [--root DIR] [--runs 3] [--skip-inat]

Timings depend on the machine and on what else runs; the numbers in docs/performance.md say
under which load they were taken.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from ltbench.results import schema

PRIORS = ["forward50", "forward25", "forward10", "forward5", "forward2", "uniform",
          "backward2", "backward5", "backward10", "backward25", "backward50"]
HEADS = [f"{e}_da_{m}" for e in ("sum", "bape") for m in ("none", "shared_kappa", "debiased", "map_test_prior")] + \
        ["aux", "bape"]


def recipe_text(name: str, num_classes: int, lrs: int, taus: int, seeds: int) -> dict:
    return {"name": name, "results_dir": "results",
            "data": {"name": "synthetic_lt", "num_classes": num_classes, "max_per_class": 24, "imb_factor": 6,
                     "test_per_class": 2, "image_size": 8},
            "backbone": {"name": "resnet8"}, "method": {"name": "la"},
            "optim": {"epochs": 1, "batch_size": 16, "warmup_epochs": 0},
            "eval": {"target_priors": PRIORS},
            "grid": {"optim.lr": [round(0.01 * (i + 1), 4) for i in range(lrs)],
                     "method.tau": [round(0.1 * (i + 1), 3) for i in range(taus)]},
            "seeds": list(range(seeds))}


def fake_result(spec: dict, k: int, rng: random.Random) -> dict:
    """A record that agrees with itself (schema.agreement_problem): the headline metrics are what its
    per-class values give, as a real run's are; the heads' and priors' numbers are free."""
    groups = lambda: {g: rng.random() for g in ("all", "many", "medium", "few")}  # noqa: E731
    counts = sorted((rng.randint(2, 1000) for _ in range(k)), reverse=True)
    per_class = [rng.random() for _ in range(k)]
    member = {g: [a for a, c in zip(per_class, counts) if (c > 100, c < 20) == w]
              for g, w in (("many", (True, False)), ("medium", (False, False)), ("few", (False, True)))}
    headline = {"all": sum(per_class) / k, **{g: (sum(v) / len(v) if v else None) for g, v in member.items()}}
    metrics = {**headline, "macro": sum(per_class) / k, "per_class": per_class,
               "groups": {"many_threshold": 100, "few_threshold": 20, "n_classes": {g: len(v) for g, v in member.items()}},
               "heads": {h: groups() for h in HEADS},
               "target_priors": {p: {"all": rng.random(), "many": rng.random(), "medium": rng.random(),
                                     "few": rng.random()} for p in PRIORS}}
    return {"schema_version": schema.SCHEMA_VERSION, "run_id": spec.run_id, "recipe": spec.recipe, "status": "done",
            "seed": spec.config["seed"], "grid": spec.grid, "config": spec.config, "metrics": metrics,
            "data": {"num_classes": k, "class_counts_train": counts, "class_counts_test": [3] * k,
                     "class_names": [f"Plantae Tracheophyta Magnoliopsida species number {c:05d}" for c in range(k)],
                     "subset_hash": "0" * 40},
            "method_extras": {"kappa": [rng.uniform(10, 200) for _ in range(k)],
                              "n": [float(c) for c in counts]},
            "provenance": {"git_commit": "0" * 40, "ltbench_version": "0.1.0", "torch": "2.14.1", "hostname": "bench"},
            "device": "cpu", "wall_seconds": 100.0, "selection": {"strategy": "last", "epoch": 1}}


def generate(folder: Path, name: str, num_classes: int, lrs: int, taus: int, seeds: int) -> Path:
    recipe_path = folder / f"{name}.yaml"
    marker = folder / ".complete"
    if marker.exists():
        return recipe_path
    from ltbench.recipe import load_recipe

    folder.mkdir(parents=True, exist_ok=True)
    recipe_path.write_text(yaml.safe_dump(recipe_text(name, num_classes, lrs, taus, seeds)))
    os.chdir(folder)
    recipe = load_recipe(recipe_path)
    rng = random.Random(0)
    t0 = time.perf_counter()
    for spec in recipe.runs:
        run_dir = Path(spec.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "result.json").write_text(json.dumps(fake_result(spec, num_classes, rng), indent=2))
    marker.write_text("")
    size = sum(p.stat().st_size for p in (folder / "results" / name).rglob("result.json"))
    print(f"generated {len(recipe.runs)} results in {time.perf_counter() - t0:.0f} s, "
          f"{size / len(recipe.runs) / 1e6:.2f} MB each")
    return recipe_path


def time_table(target: Path, cwd: Path, runs: int, cold: bool) -> tuple[list[float], list[float]]:
    """Wall and CPU (user + system of the child) seconds of each run: on a shared machine the
    wall time includes waiting for a core, the CPU time does not."""
    root = cwd / "results" / target.stem if target.suffix == ".yaml" else target
    walls, cpus = [], []
    for _ in range(runs):
        if cold:
            (root / ".ltbench-index").unlink(missing_ok=True)
        before = os.times()
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "ltbench", "table", str(target), "--format", "csv"],
                             cwd=cwd, capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        after = os.times()
        cpus.append(after.children_user - before.children_user + after.children_system - before.children_system)
        if out.returncode != 0:
            raise SystemExit(f"ltbench table failed: {out.stderr}")
    return walls, cpus


def report_line(label: str, measured: tuple[list[float], list[float]]) -> None:
    walls, cpus = measured
    print(f"{label:<40} wall min {min(walls):6.2f} s  median {statistics.median(walls):6.2f} s   "
          f"CPU min {min(cpus):6.2f} s  median {statistics.median(cpus):6.2f} s   "
          f"(load average {os.getloadavg()[0]:.1f})", flush=True)


def bench(folder: Path, name: str, runs: int) -> None:
    recipe_path = folder / f"{name}.yaml"
    results = folder / "results" / name
    n = sum(1 for _ in results.iterdir() if _.is_dir())
    report_line(f"{name} ({n} runs): folder, cold cache", time_table(results, folder, runs, cold=True))
    report_line(f"{name} ({n} runs): folder, warm cache", time_table(results, folder, runs, cold=False))
    time_table(recipe_path, folder, 1, cold=False)  # expands the recipe once (imports torch), then cached
    report_line(f"{name} ({n} runs): recipe, warm caches", time_table(recipe_path, folder, runs, cold=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default="/tmp/ltbench-table-speed")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-inat", action="store_true")
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", "")
    root = Path(args.root)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    generate(root / "many", "many", num_classes=100, lrs=100, taus=10, seeds=10)
    bench(root / "many", "many", args.runs)
    if not args.skip_inat:
        generate(root / "inat", "inat", num_classes=8142, lrs=10, taus=10, seeds=10)
        bench(root / "inat", "inat", args.runs)


if __name__ == "__main__":
    main()
