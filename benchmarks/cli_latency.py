"""How long the everyday commands take, and how much memory, beside ``python -c pass``.

Each command is a fresh process, timed from spawn to exit (wall time) with its peak RSS and its own CPU time
(user + system) from ``os.wait4``, the median of ``--repeat`` calls after one warm-up call (the warm-up fills the caches a user's
second call finds; its own time is printed as "first call"). The commands:

- ``status`` and ``table`` of recipes/quickstart.yaml, whose results folder holds a copy of the committed
  reference results (docs/reference-results/quickstart), so both show real runs;
- ``list methods``;
- ``run --dry-run`` of recipes/quickstart.yaml into an empty results folder (it checks datasets, memory and
  the GPUs torch sees, so it imports torch by design);
- a worker, from its spawn to its first optimisation step: ``python -m ltbench.runner spec.json`` of the
  quickstart's first run (ResNet-8, Fashion-MNIST-LT), stopped at its first ``engine.train_step``.

Targets (issue 40, an idle 2-core machine): status/table/list <= 1.0 s and <= 150 MB; run --dry-run <= 4 s;
worker to first step <= 5 s. The machine's load (/proc/loadavg) is printed before and after: wall times taken
under load are not comparable with idle ones; CPU times move much less with the load than wall times (a loaded
machine's shared caches still slow them), so compare those between measurements made at different loads.

    .venv/bin/python benchmarks/cli_latency.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "quickstart.yaml"
REFERENCE = ROOT / "docs" / "reference-results" / "quickstart"
TARGETS = {"status": (1.0, 150), "table": (1.0, 150), "list methods": (1.0, 150), "run --dry-run": (4.0, None),
           "worker to first step": (5.0, None)}
FIRST_STEP = """
import sys
from os import _exit  # bound before the run: the runner contains os._exit calls made through os (a plugin's)
from ltbench.train import engine
def first_step(*args, **kwargs):
    print("first step", flush=True)
    _exit(0)
engine.train_step = first_step
from ltbench.runner import main
main([sys.argv[1]])
_exit(3)  # never reached: the first step exits
"""


def timed(argv: list[str], env: dict, expect: str = "") -> tuple[float, float, float]:
    """(wall seconds, peak RSS in MB, CPU seconds) of one process, reaped with os.wait4 for its own rusage; it must exit 0
    (and print ``expect`` when given). Output goes to files, so no pipe can stall it."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0 or expect.encode() not in out.read():
            raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {err.read().decode()[-2000:]}")
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def measure(argv: list[str], env: dict, repeat: int, expect: str = "") -> dict:
    first = timed(argv, env, expect)
    runs = [timed(argv, env, expect) for _ in range(repeat)]
    return {"first": first[0], "wall": statistics.median(r[0] for r in runs), "rss": max(r[1] for r in runs),
            "cpu": statistics.median(r[2] for r in runs)}


def worker_spec(tmp: Path, env: dict) -> Path:
    """spec.json of the quickstart's first run, made by the recipe's own expansion."""
    code = ("import json, sys; from ltbench.recipe import load_recipe; "
            "r = load_recipe(sys.argv[1], results_dir=sys.argv[2]); "
            "print(json.dumps(r.runs[0].to_dict()))")
    out = subprocess.run([sys.executable, "-c", code, str(RECIPE), str(tmp / "worker")], capture_output=True,
                         text=True, env=env, cwd=ROOT, check=True).stdout
    path = tmp / "spec.json"
    path.write_text(out)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"load before: {Path('/proc/loadavg').read_text().strip()}  ({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory(prefix="ltbench-cli-latency-") as tmp_s:
        tmp = Path(tmp_s)
        shutil.copytree(REFERENCE, tmp / "results" / "quickstart")
        # Caches in a temporary folder: each measurement starts from none, and nothing is left behind.
        env = {**os.environ, "PYTHONPATH": str(ROOT), "LTBENCH_CACHE_DIR": str(tmp / "cache")}
        ltbench = [sys.executable, "-m", "ltbench"]
        rows = {"python -c pass": measure([sys.executable, "-c", "pass"], env, args.repeat)}
        rows["status"] = measure(ltbench + ["status", str(RECIPE), "--results", str(tmp / "results")], env,
                                 args.repeat, "ce on fashion_mnist_lt")
        rows["table"] = measure(ltbench + ["table", str(RECIPE), "--results", str(tmp / "results")], env,
                                args.repeat, "ldam")
        rows["list methods"] = measure(ltbench + ["list", "methods"], env, args.repeat, "ldam_drw")
        rows["run --dry-run"] = measure(ltbench + ["run", str(RECIPE), "--results", str(tmp / "empty"), "--dry-run"],
                                        env, args.repeat, "pending")
        spec = worker_spec(tmp, env)
        rows["worker to first step"] = measure([sys.executable, "-c", FIRST_STEP, str(spec)], env, args.repeat,
                                               "first step")
    base = rows["python -c pass"]["wall"]
    print(f"{'command':<22} {'first call':>10} {'median':>8} {'x pass':>7} {'CPU':>7} {'peak RSS':>9}  target")
    for name, r in rows.items():
        target = TARGETS.get(name)
        verdict = ""
        if target:
            ok = r["wall"] <= target[0] and (target[1] is None or r["rss"] <= target[1])
            verdict = f"<= {target[0]} s" + (f", <= {target[1]} MB" if target[1] else "") + ("  ok" if ok else "  MISSED")
        print(f"{name:<22} {r['first']:>9.2f}s {r['wall']:>7.2f}s {r['wall'] / base:>7.0f} {r['cpu']:>6.2f}s "
              f"{r['rss']:>6.0f} MB  {verdict}")
    print(f"load after: {Path('/proc/loadavg').read_text().strip()}")
    print(json.dumps({k: {m: round(v, 3) for m, v in r.items()} for k, r in rows.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
