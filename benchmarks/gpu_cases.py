"""The GPU check's cases in one compile mode (benchmarks/gpu_check.sh runs one process per mode).

Each case is a training loop at batch 256 on CIFAR-100-format data written here (random pixels, 100 x 256 images:
every batch full, so a compiled step has one shape) with ResNet-32 and ``augment_on: batch``:

- ``bare_1``, ``bare_3``: gpu_throughput.BareLoop with 1 and 3 views (in a compiled mode its model, head and
  cross-entropy are compiled, in the same mode);
- ``ce``, ``la_strong``, ``bape_la``: ltbench's own loop (``engine.epoch_step``: feeder, views, step, meters),
  each against the bare loop with as many views;
- ``ce_micro`` (eager and inductor): CE with ``optim.micro_batch_size: 64``, four accumulated micro-batches
  (reduce-overhead refuses them at load; that refusal is checked instead);
- ``eval_check`` (eager: a self-check): test-set features of a trained run through the compiled backbone against
  the eager backbone's (under reduce-overhead each batch must be copied out of the graph's buffer).

Per case: compile seconds (the first ``WARM`` steps less as many steady steps: Dynamo, Inductor, Triton and CUDA-
graph recording), then ``ROUNDS`` rounds of ``STEPS`` steps alternating with the bare loop (median img/s of each; a bare case alone),
then ``PROFILED`` steps under torch.profiler: kernel launches (``cudaLaunchKernel`` and kin, ``cudaGraphLaunch``)
and host waits (synchronising CUDA calls) per step. Writes one JSON object to --out.

    python benchmarks/gpu_cases.py --mode eager|inductor|reduce-overhead --out FILE [--cases ...]
    python benchmarks/gpu_cases.py --mode eager --out FILE --smoke   # on the CPU, tiny: the code runs (CI)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_throughput import BAPE_LA, BareLoop, views_of, write_cifar100  # noqa: E402

BATCH, PER_CLASS, WARM, STEPS, ROUNDS, PROFILED = 256, 256, 4, 40, 3, 10
SMOKE = {"BATCH": 16, "PER_CLASS": 16, "WARM": 1, "STEPS": 2, "ROUNDS": 1, "PROFILED": 1}  # --smoke: figures mean nothing
METHODS = {"ce": {"name": "ce"}, "la_strong": {"name": "la", "tau": 1.0, "views": ["strong"]}, "bape_la": BAPE_LA,
           "ce_micro": {"name": "ce"}}
# In order of what a part that runs out of time should have done first (the report lists them in its own order).
CASES = ("bare_1", "ce", "eval_check", "bare_3", "bape_la", "la_strong", "ce_micro")
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
                "cudaLaunchCooperativeKernel")
WAIT_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cudaStreamWaitEvent")  # cudaStreamWaitEvent is a device-side wait, listed apart below


def config_for(case: str, root: Path, mode: str) -> dict:
    from ltbench.recipe import resolve_run_config

    import torch

    gpu = torch.cuda.is_available()
    train = {"augment_on": "batch", "num_workers": 0, "progress": False, "precision": "bf16" if gpu else "fp32",
             "channels_last": gpu, "log_every": 0}
    if mode != "eager":
        train["compile"] = mode
    optim = {"lr": 0.1, "batch_size": BATCH, "epochs": 100, "warmup_epochs": 0}
    if case == "ce_micro":
        optim["micro_batch_size"] = BATCH // 4
    raw = {"data": {"name": "cifar100_lt", "root": str(root), "imb_factor": 1.0}, "backbone": {"name": "resnet32"},
           "method": METHODS.get(case, {"name": "ce"}), "train": train, "optim": optim}
    return resolve_run_config(raw, seed=0, where=case)


class LtbenchSteps:
    """ltbench's training steps, as engine.train_epoch runs them, one at a time across epochs."""

    def __init__(self, config: dict, tmp: Path):
        from ltbench.results.runspec import RunSpec
        from ltbench.train import engine
        from ltbench.train.checkpoint import CheckpointSaver

        tmp.mkdir(parents=True, exist_ok=True)
        spec = RunSpec.coerce({"config": config, "run_id": "gpu-case", "recipe": "bench", "run_dir": str(tmp)})
        self.engine, self.s = engine, engine.start_session(spec, lambda message: None)
        self.s.run.loader = engine.make_loader(self.s.run, self.s.seed, 0, self.s.device)
        self.saver = CheckpointSaver(tmp, "gpu-case", minutes=0, main=True, world=1)
        self.epoch, self.loop, self.step = 0, None, 0
        self.images_per_step = config["optim"]["batch_size"]

    def __call__(self) -> None:
        if self.loop is None or self.step == self.loop.steps:
            if self.loop is not None:
                self.engine.read_meter(self.s, self.loop)
                self.epoch += 1
            self.loop, self.step = self.engine.begin_epoch(self.s, self.epoch, 0, self.saver), 0
        self.engine.epoch_step(self.s, self.loop, self.step)
        self.step += 1


class BareSteps:
    """gpu_throughput.BareLoop's steps, one at a time, over its device-resident data."""

    def __init__(self, config: dict, views: int, mode: str):
        import torch

        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.torch, self.bare = torch, BareLoop(config, self.device, views, mode)
        self.order, self.at, self.images_per_step = torch.randperm(len(self.bare.labels), device=self.device), 0, BATCH
        self.bare.model.train()

    def __call__(self) -> None:
        if self.at + BATCH > len(self.order):
            self.order, self.at = self.torch.randperm(len(self.bare.labels), device=self.device), 0
        idx = self.order[self.at:self.at + BATCH]
        self.bare.step(self.bare.images[idx], self.bare.labels[idx])
        self.at += BATCH


def sync(torch) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(torch, steps, n: int) -> float:
    sync(torch)
    start = time.perf_counter()
    for _ in range(n):
        steps()
    sync(torch)
    return time.perf_counter() - start


def profiled(torch, steps, n: int) -> dict:
    """Kernel launches and host waits per step, from the CUDA runtime calls torch.profiler records."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        for _ in range(n):
            steps()
        sync(torch)
    names = [e.name for e in prof.events()]
    waits = [name for name in names if name in WAIT_CALLS and name != "cudaStreamWaitEvent"]
    return {"launches_per_step": round(sum(name in LAUNCH_CALLS for name in names) / n, 1),
            "graph_replays_per_step": round(names.count("cudaGraphLaunch") / n, 1),
            "host_waits_per_step": round(len(waits) / n, 2),
            "host_waits_by_call": {call: waits.count(call) for call in sorted(set(waits))}}


def warm(torch, steps) -> tuple[float, float]:
    """(seconds of the first WARM steps, seconds of WARM steady steps after them)."""
    first = timed(torch, steps, WARM)
    return first, timed(torch, steps, WARM)


def measure_pair(torch, case_steps, bare_steps) -> dict:
    """Rounds of STEPS steps, the case and its bare loop alternating; median images per second of each."""
    mine, theirs = [], []
    for _ in range(ROUNDS):
        if bare_steps is not None:
            theirs.append(bare_steps.images_per_step * STEPS / timed(torch, bare_steps, STEPS))
        mine.append(case_steps.images_per_step * STEPS / timed(torch, case_steps, STEPS))
    out = {"images_per_s": round(statistics.median(mine), 1), "rounds": ROUNDS, "steps_per_round": STEPS}
    if theirs:
        out["bare_images_per_s"] = round(statistics.median(theirs), 1)
    return out


def eval_check(torch, config: dict, tmp: Path) -> dict:
    """Test-set features (100 x 20 images, batches of 256 and a short last one) of a run trained for WARM steps,
    through the compiled backbone and through the eager one."""
    steps = LtbenchSteps(config, tmp)
    for _ in range(WARM):
        steps()
    run, device = steps.s.run, steps.s.device
    started = time.perf_counter()
    compiled = steps.engine.test_features(run, device, "test", batch_size=BATCH)
    sync(torch)
    seconds = time.perf_counter() - started
    kept, run.compiled = run.compiled, None
    eager = steps.engine.test_features(run, device, "test", batch_size=BATCH)
    run.compiled = kept
    diff = (compiled - eager).abs().max().item()
    scale = eager.abs().max().item()
    first, last = compiled[:BATCH], compiled[-BATCH:]
    return {"features": list(compiled.shape), "max_abs_difference": diff, "max_abs_feature": scale,
            "batches_distinct": not torch.equal(first, last), "seconds_with_compile": round(seconds, 1),
            "passed": bool(diff <= 1e-2 * max(scale, 1.0)) and not torch.equal(first, last)}


def run_case(case: str, mode: str, root: Path, tmp: Path, bare_cache: dict) -> dict:
    import torch

    from ltbench.errors import ConfigError

    if case == "ce_micro" and mode == "reduce-overhead":
        try:
            config_for(case, root, mode)
            return {"refused": False, "passed": False}
        except ConfigError as exc:
            return {"refused": True, "message": str(exc), "passed": True}
    if case == "eval_check":
        return eval_check(torch, config_for("ce", root, mode), tmp / case)  # eager: the check checks itself
    views = int(case.split("_")[1]) if case.startswith("bare_") else views_of(config_for(case, root, mode))
    if views not in bare_cache:
        bare_cache[views] = BareSteps(config_for("ce", root, mode), views, mode)
        bare_cache[(views, "warm")] = warm(torch, bare_cache[views])
    bare = bare_cache[views]
    if case.startswith("bare_"):
        first, steady = bare_cache[(views, "warm")]
        out = {"views": views, "compile_s": round(max(first - steady, 0.0), 1) if mode != "eager" else None}
        out.update(measure_pair(torch, bare, None))
        out.update(profiled(torch, bare, PROFILED))
        return out
    started = time.perf_counter()
    steps = LtbenchSteps(config_for(case, root, mode), tmp / case)
    build_s = time.perf_counter() - started
    first, steady = warm(torch, steps)
    out = {"views": views, "build_s": round(build_s, 1),
           "compile_s": round(max(first - steady, 0.0), 1) if mode != "eager" else None}
    out.update(measure_pair(torch, steps, bare))
    out["ratio_same_mode"] = round(out["images_per_s"] / out["bare_images_per_s"], 3)
    out.update(profiled(torch, steps, PROFILED))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["eager", "inductor", "reduce-overhead"], required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    ap.add_argument("--smoke", action="store_true", help="on the CPU at tiny sizes: the code runs, figures mean nothing")
    args = ap.parse_args(argv)
    import torch

    if args.smoke:
        globals().update(SMOKE)
    elif not torch.cuda.is_available():
        print("gpu_cases.py: no CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    result = {"mode": args.mode, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
              "torch": torch.__version__, "cuda": torch.version.cuda, "batch": BATCH, "smoke": args.smoke, "cases": {}}
    with tempfile.TemporaryDirectory(prefix="ltbench-gpu-cases-") as tmp:
        root = write_cifar100(Path(tmp) / "cifar", PER_CLASS, 20)
        bare_cache: dict = {}
        for case in args.cases:
            started = time.perf_counter()
            try:
                result["cases"][case] = run_case(case, args.mode, root, Path(tmp), bare_cache)
            except Exception as exc:  # noqa: BLE001 - one failed case is reported, the others still run
                result["cases"][case] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
            result["cases"][case]["wall_s"] = round(time.perf_counter() - started, 1)
            args.out.write_text(json.dumps(result, indent=1))  # after every case: a timeout keeps what was done
            print(f"{args.mode} {case}: {json.dumps(result['cases'][case])[:300]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
