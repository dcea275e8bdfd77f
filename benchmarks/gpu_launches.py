"""What one training step would cost a GPU, counted on this CPU: kernel launches, host-device syncs, loop turns.

A GPU pays about 5-10 us of host time per kernel launch and stops queueing ahead at every host-device sync,
whatever the kernels do; CPU seconds per core say neither. This script runs one steady-state training step
(the second of an epoch: the first also checks the method contract) of real ltbench runs with their tensors
on an emulated CUDA device (ltbench/devtools/gpu_cost.py), and counts, per 256-image batch:

- ``augment``: building the views on the device (``train.augment_on: batch``), the per-sample seeds included;
- ``step``: everything else in the step (copies, forward, loss, backward, optimizer, meters), split into
  ``model`` (the backbone's forward and backward on the same input, counted alone), ``optimizer`` (SGD's
  update, counted with ``foreach=True`` as CUDA's default picks) and ``method`` (the rest: the method's
  loss and head, their backward, meters and bookkeeping);
- the syncs' source lines, and Python loop iterations in ltbench/ and methods/ code.

Settings: CE (crop+flip), LA on the strong view (AutoAugment + Cutout) and BAPE+LA with the paper's views
(strong for LA, two SimAug views for BAPE), ResNet-32 on CIFAR-100-format files (random pixels), batch 256;
and the ImageNet-size training views alone (``imagenet_train``; BAPE's RandAugment + SimAug views) on 256
images of 300-500 px sides.

The predicted GPU ratio is a **prediction from a stated cost model, not a measurement**: the bare loop's
step on one H100 (measured in an earlier review: about 7.7 ms of launch-bound fixed cost plus about 2.4 ms
of GPU work per 256 images per view, bf16 + channels_last, ResNet-32) is taken as the floor; every launch
beyond the bare loop's own (counted here the same way) costs ``launch_us`` of host time, and every sync
``sync_us`` (the device idles while the host refills its queue). Ratio = bare step / predicted step, given
for launch_us in {5, 10} and sync_us in {20, 100}.

    python benchmarks/gpu_launches.py            # the table
    python benchmarks/gpu_launches.py --json     # {"ce"|"la_strong"|"bape_la": {"augment": {...}, "step": {...}}}

Augmentation section (``--pipelines``, ``--compiled``): every batched pipeline alone (CIFAR-size RGB batch; the
ImageNet-size ones on a list of 300-500 px images), launches and syncs in eager mode; with ``--compiled``
also the kernels one call runs once ``torch.compile``'d by Inductor on this CPU
(``batch_augment.compiled_kernel_count``: fused C++ kernels plus the ops left to ATen; a proxy for CUDA's
Triton count, since the two backends fuse differently). JSON key ``"pipelines"``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_throughput import BAPE_LA, BareLoop, write_cifar100  # noqa: E402

STEP_SETTINGS = {"ce": {"name": "ce"}, "la_strong": {"name": "la", "tau": 1.0, "views": ["strong"]},
                 "bape_la": BAPE_LA}
LARGE_SETTINGS = {"imagenet_ce": ["imagenet_train"], "imagenet_bape": ["randaugment", "simaug", "simaug"]}
BARE_FIXED_MS, BARE_PER_VIEW_MS = 7.7, 2.4  # H100, ResNet-32, batch 256, bf16 + channels_last (earlier review)
LAUNCH_US, SYNC_US = (5.0, 10.0), (20.0, 100.0)


def step_config(method: dict, root: Path, batch: int) -> dict:
    from ltbench.recipe import resolve_run_config

    raw = {"data": {"name": "cifar100_lt", "root": str(root), "imb_factor": 1.0}, "backbone": {"name": "resnet32"},
           "method": method, "train": {"augment_on": "batch", "num_workers": 0, "progress": False, "threads": 1},
           "optim": {"lr": 0.1, "batch_size": batch, "epochs": 2, "warmup_epochs": 0}}
    return resolve_run_config(raw, seed=0, where="gpu_launches")


def count_step(config: dict, tmp: Path) -> dict:
    """Launches and syncs of the second step of an epoch (``engine.epoch_step``, the whole per-step body of
    ``engine.train_epoch``: this step's training, the next batch's copies and augmentation, the meters and the
    host's bookkeeping; counted by ltbench/devtools/step_cost.py), by phase, plus loop iterations."""
    from ltbench.devtools.step_cost import counted_epoch_step

    with counted_epoch_step(config, tmp, step=1, loops=True) as (c, s, loop, loops):
        model = count_model_alone(s.run, loop.upcoming.views, c)
    return summarize(c, model, loops)


def count_model_alone(run, views, c) -> int:
    """The backbone's forward and backward on the step's views, alone (what the model costs in the step)."""
    import torch

    from ltbench.train import engine

    run.model.zero_grad(set_to_none=True)  # fresh gradients, as in the step (no accumulation kernels)
    before = c.launch_count()
    with c.phase("model_alone"):
        features = engine.backbone_features(run, torch.cat(views) if len(views) > 1 else views[0])
        features.float().sum().backward()
    run.model.zero_grad(set_to_none=True)
    return c.launch_count() - before - 2  # less the probe's own sum and its ones_like gradient


STEP_PHASES = ("copies", "step", "optimizer", "other")  # everything but the augmentation ("other": bookkeeping)


def summarize(c, model: int, loops) -> dict:
    augment = c.launch_count("augment")
    step_all = sum(c.launch_count(p) for p in STEP_PHASES)
    optimizer = c.launch_count("optimizer")
    step_syncs = sum(c.sync_count(p) for p in STEP_PHASES)
    sites = [{"phase": p, "kind": kind, "op": op, "site": site, "count": n}
             for p in ("copies", "augment", "step", "optimizer", "other")
             for kind, op, site, n in c.sync_sites(p)]
    return {"augment": {"launches": augment, "syncs": c.sync_count("augment")},
            "step": {"launches": step_all, "syncs": step_syncs, "model": model, "optimizer": optimizer,
                     "method": step_all - model - optimizer, "besides_model": step_all - model},
            "loop_iterations": loops.total(), "sync_sites": sites}


def count_bare(config: dict, views: int) -> int:
    """Launches of one step of the bare loop (gpu_throughput.BareLoop) on the emulated device."""
    import torch

    from ltbench.devtools import gpu_cost

    bare = BareLoop(config, torch.device("cpu"), views)
    bare.images, bare.labels = bare.images[:bare.batch], bare.labels[:bare.batch]
    with gpu_cost.counting() as c:
        bare.images, bare.labels = gpu_cost.to_device(torch.as_tensor(bare.images)), gpu_cost.to_device(bare.labels)
        bare.mean, bare.std = gpu_cost.to_device(bare.mean), gpu_cost.to_device(bare.std)
        bare.model.to(gpu_cost.DEVICE)
        bare.opt = torch.optim.SGD(bare.model.parameters(), lr=0.1, momentum=0.9, foreach=True)
        bare.device = gpu_cost.DEVICE
        c.launches.clear(), c.syncs.clear()
        bare.train_epoch = _one_bare_step(bare)
        bare.train_epoch()
    return c.launch_count() - c.sync_count()  # its one end-of-epoch .item() is not per step


def _one_bare_step(bare):
    import torch
    import torch.nn.functional as F

    def step():
        x, y = bare.images, bare.labels
        logits = bare.model(torch.cat([bare.view(x) for _ in range(bare.views)])).float()
        loss = sum(F.cross_entropy(z, y) for z in logits.split(len(y)))
        bare.opt.zero_grad(set_to_none=True)
        loss.backward()
        bare.opt.step()
    return step


def count_large(names: list[str], n: int) -> dict:
    """Launches and syncs of ImageNet-size training views on ``n`` decoded images of 300-500 px sides, in a
    steady-state batch (the second: the first also puts the pipelines' constants on the device, once)."""
    import torch

    from ltbench.data import batch_augment
    from ltbench.data.base import ImageSpec
    from ltbench.devtools import gpu_cost

    spec = ImageSpec(224, 3, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), kind="large")
    g = torch.Generator().manual_seed(0)
    sides = torch.randint(300, 501, (n, 2), generator=g).tolist()
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in sides]
    seeds = torch.randint(0, 2**31, (n,), generator=g)
    pipelines = [batch_augment.build_batch(name, spec) for name in names]
    with gpu_cost.counting() as c:
        on_device = [gpu_cost.to_device(im) for im in images]
        device_seeds = gpu_cost.to_device(seeds)
        for v, pipeline in enumerate(pipelines):  # the first batch also puts the constants on the device
            pipeline(on_device, device_seeds, view=v)
        c.launches.clear(), c.syncs.clear()
        with gpu_cost.LoopCounter() as loops, c.phase("augment"):
            for v, pipeline in enumerate(pipelines):
                pipeline(on_device, device_seeds, view=v)
    return {"augment": {"launches": c.launch_count("augment"), "syncs": c.sync_count("augment")},
            "loop_iterations": loops.total(),
            "sync_sites": [{"phase": "augment", "kind": k, "op": o, "site": s, "count": m}
                           for k, o, s, m in c.sync_sites("augment")]}


def count_compiled(config: dict, batch: int) -> dict:
    """train.compile for the method: its loss (head, loss, and their backward into the features) through
    ``torch.compile`` with inductor on this CPU, counted from the code inductor generates: each call line of a
    graph's wrapper is one kernel launch per step (``cpp_fused_*``: fused loops; ``extern_kernels.*``:
    matmuls and other library calls). On CUDA inductor emits Triton kernels for the same fused nodes, so the
    count carries over up to its fusion choices, which differ a little between backends. Also: graphs and
    graph breaks (``torch._dynamo.explain``). Compiling takes a minute or more on this CPU."""
    import re

    import torch
    from torch._inductor.utils import run_and_get_code

    from ltbench.train import engine

    torch.manual_seed(0)
    run = engine.build_run(config)
    run.model.train()
    run.method.on_epoch_start(0)
    g = torch.Generator().manual_seed(0)
    features = [torch.randn(batch, run.backbone.feature_dim, generator=g, requires_grad=True)
                for _ in run.method.views()]
    labels = torch.randint(0, run.data.num_classes, (batch,), generator=g)
    explained = torch._dynamo.explain(run.method.loss)(features, labels, epoch=0)
    torch._dynamo.reset()
    compiled = torch.compile(run.method.loss, backend="inductor")

    def step():
        compiled(features, labels, epoch=0)["loss"].backward()

    _, codes = run_and_get_code(step)
    launches = {"fused": 0, "extern": 0}
    for code in codes:
        body = code[code.index("def call("):].split("\n\n", 1)[0] if "def call(" in code else ""
        launches["fused"] += len(re.findall(r"^\s+cpp_fused_\w+\(", body, re.M))
        launches["extern"] += len(re.findall(r"^\s+extern_kernels\.\w+\(", body, re.M))
    return {"graphs": explained.graph_count, "graph_breaks": explained.graph_break_count,
            "break_reasons": sorted({str(r.reason).splitlines()[0][:120] for r in explained.break_reasons}),
            "launches": launches["fused"] + launches["extern"], **launches}


def predicted_ratios(counts: dict, bare_launches: int, views: int) -> dict:
    """Bare step / predicted step for each (launch_us, sync_us) of the stated cost model."""
    bare_ms = BARE_FIXED_MS + BARE_PER_VIEW_MS * views
    launches = counts["augment"]["launches"] + counts["step"]["launches"]
    syncs = counts["augment"]["syncs"] + counts["step"]["syncs"]
    out = {}
    for launch_us in LAUNCH_US:
        for sync_us in SYNC_US:
            extra_ms = (max(launches - bare_launches, 0) * launch_us + syncs * sync_us) / 1000
            out[f"launch {launch_us:g} us, sync {sync_us:g} us"] = round(bare_ms / (bare_ms + extra_ms), 2)
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the counts as JSON")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--compile", action="store_true",
                    help="also compile each method's loss with inductor and count the compiled graph's kernels")
    ap.add_argument("--settings", nargs="+", choices=[*STEP_SETTINGS, *LARGE_SETTINGS],
                    default=[*STEP_SETTINGS, *LARGE_SETTINGS])
    ap.add_argument("--pipelines", action="store_true", help="also count every batched pipeline alone")
    ap.add_argument("--compiled", action="store_true",
                    help="with --pipelines: also the kernel count under torch.compile (Inductor; minutes on a CPU)")
    return ap.parse_args(argv)


def measure(args) -> dict:
    import torch

    from gpu_throughput import views_of

    torch.set_num_threads(1)
    results = {}
    with tempfile.TemporaryDirectory(prefix="ltbench-launches-") as tmp:
        root = write_cifar100(Path(tmp) / "cifar", max(1, -(-args.batch * 3 // 100)), 1)  # 3 batches: steps 0, 1
        # and the batch that step 1 prepares
        for name in args.settings:
            if name in LARGE_SETTINGS:
                results[name] = count_large(LARGE_SETTINGS[name], args.batch)
                continue
            config = step_config(STEP_SETTINGS[name], root, args.batch)
            counts = count_step(config, Path(tmp))
            bare = count_bare(config, views_of(config))
            counts["bare_loop_launches"] = bare
            counts["predicted_ratio"] = predicted_ratios(counts, bare, views_of(config))
            if args.compile:
                counts["compiled_method"] = count_compiled(config, args.batch)
            results[name] = counts
    if args.pipelines:
        results["pipelines"] = count_pipelines(args.batch, args.compiled)
    return results


def print_table(results: dict, batch: int) -> None:
    print(f"Per training step of {batch} images, counted on the CPU with CUDA emulated (ltbench/devtools/gpu_cost.py)")
    print(f"{'setting':<14} {'aug launches':>12} {'aug syncs':>9} {'step launches':>13} {'model':>6} "
          f"{'optim':>6} {'method':>6} {'step syncs':>10} {'loop iters':>10}")
    for name, r in results.items():
        st = r.get("step", {})
        print(f"{name:<14} {r['augment']['launches']:>12} {r['augment']['syncs']:>9} {st.get('launches', '-'):>13} "
              f"{st.get('model', '-'):>6} {st.get('optimizer', '-'):>6} {st.get('method', '-'):>6} "
              f"{st.get('syncs', '-'):>10} {r['loop_iterations']:>10}")
    print("\nSyncs by source line:")
    for name, r in results.items():
        for site in r["sync_sites"]:
            print(f"  {name:<14} {site['phase']:<9} x{site['count']:<4} {site['kind']} ({site['op']}) at {site['site']}")
    compiled = {name: r["compiled_method"] for name, r in results.items() if "compiled_method" in r}
    if compiled:
        print("\nThe method's loss with train.compile (inductor on this CPU; launches per step of its forward and "
              "backward, against eager's 'method' column):")
        for name, cm in compiled.items():
            print(f"  {name:<14} {cm['launches']} launches ({cm['fused']} fused kernels, {cm['extern']} library "
                  f"calls), {cm['graphs']} graph(s), {cm['graph_breaks']} break(s) {cm['break_reasons'] or ''}")
    print("\nPREDICTED ratio to the H100 bare loop (a cost model, not a measurement; see the docstring):")
    for name, r in results.items():
        if "predicted_ratio" in r:
            spread = ", ".join(f"{k}: {v}" for k, v in r["predicted_ratio"].items())
            print(f"  {name:<14} bare loop {r['bare_loop_launches']} launches/step; {spread}")


def print_pipelines(pipelines: dict, batch: int) -> None:
    print(f"\nEach batched pipeline alone, batch {batch} (eager; 'compiled': kernels per call under torch.compile, "
          f"Inductor on this CPU, a proxy for CUDA's count):")
    print(f"{'pipeline':<36} {'launches':>9} {'syncs':>6} {'compiled':>9} {'(fused + aten)':>15} {'compile s':>10}")
    for name, r in pipelines.items():
        c = r.get("compiled")
        extra = f"{c['total']:>9} {c['fused']:>7} + {c['aten']:<5} {c['compile_seconds']:>10}" if c else ""
        print(f"{name:<36} {r['launches']:>9} {r['syncs']:>6} {extra}")


def count_pipelines(batch: int, compiled: bool) -> dict:
    """Launches and syncs of every batched pipeline alone (a second call: the first puts its constants on the
    device) on CIFAR-size RGB images, the ImageNet-size ones on a list of 300-500 px images; BAPE's three
    views together; with ``compiled``, Inductor's kernel count per call (on plain CPU tensors)."""
    import torch

    from ltbench.data import batch_augment
    from ltbench.data.base import ImageSpec
    from ltbench.devtools import gpu_cost

    cifar = ImageSpec(32, 3, (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))
    large = ImageSpec(224, 3, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), kind="large")
    g = torch.Generator().manual_seed(0)
    small = torch.randint(0, 256, (batch, 3, 32, 32), dtype=torch.uint8, generator=g)
    sides = torch.randint(300, 501, (batch, 2), generator=g).tolist()
    files = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in sides]
    seeds = torch.randint(0, 2**31, (batch,), generator=g)
    cases = {name: ([name], cifar, small) for name in batch_augment.BATCH_PIPELINES.names()}
    cases["BAPE views (aa+cutout, 2 simaug)"] = (["autoaug_cutout", "simaug", "simaug"], cifar, small)
    cases.update({f"{name} (ImageNet-size list)": ([name], large, files)
                  for name in ("imagenet_train", "imagenet_eval")})
    out = {}
    for label, (names, spec, images) in cases.items():
        pipelines = [batch_augment.build_batch(n, spec) for n in names]
        with gpu_cost.counting() as c:
            on_device = ([gpu_cost.to_device(im) for im in images] if isinstance(images, list)
                         else gpu_cost.to_device(images))
            device_seeds = gpu_cost.to_device(seeds)
            for repeat in range(2):
                c.launches.clear(), c.syncs.clear()
                for v, pipeline in enumerate(pipelines):
                    pipeline(on_device, device_seeds, view=v)
        out[label] = {"launches": c.launch_count(), "syncs": c.sync_count()}
        if compiled and len(names) == 1 and spec is cifar:
            out[label]["compiled"] = batch_augment.compiled_kernel_count(pipelines[0], images, seeds)
        if compiled and len(names) > 1:
            counts = [batch_augment.compiled_kernel_count(p, images, seeds, v) for v, p in enumerate(pipelines)]
            out[label]["compiled"] = {k: round(sum(c[k] for c in counts), 1) for k in counts[0]}
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    results = measure(args)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        pipelines = results.get("pipelines")
        print_table({k: v for k, v in results.items() if k != "pipelines"}, args.batch)
        if pipelines:
            print_pipelines(pipelines, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
