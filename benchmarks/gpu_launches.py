"""What one training step would cost a GPU, counted on this CPU: kernel launches, host-device syncs, loop turns.

A GPU pays about 5-10 us of host time per kernel launch and stops queueing ahead at every host-device sync,
whatever the kernels do; CPU seconds per core say neither. This script runs one steady-state training step
(the second of an epoch: the first also checks the method contract) of real ltbench runs with their tensors
on an emulated CUDA device (benchmarks/devtools/gpu_cost.py), and counts, per 256-image batch:

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

The bare loop is counted at steady state (its step 1, after SGD made its momentum buffers), as the method
side is; both use SGD(fused=True), as CUDA runs do (``engine.make_optimizer``). ``compiled_step``: the step as
``train.compile: inductor`` runs it, views included (``count_compiled_step``; minutes of compiling on a CPU,
``--no-compiled-step`` skips it). ``fp16_step`` (CE): the step with fp16's GradScaler (autocast's casts are not
counted).

The predicted GPU ratio is a **prediction from a stated cost model, not a measurement**: the bare loop's
step on one H100 (measured in an earlier review: about 7.7 ms of launch-bound fixed cost plus about 2.4 ms
of GPU work per 256 images per view, bf16 + channels_last, ResNet-32) is taken as the floor; every launch
beyond the bare loop's own (counted here the same way) costs ``launch_us`` of host time (5, 10 or 20), and
every sync 100 us (the device idles while the host refills its queue). Ratio = bare step / predicted step;
a step with fewer launches than the bare loop is predicted at 1.

    python benchmarks/gpu_launches.py            # the table
    python benchmarks/gpu_launches.py --json     # {"bare": {...}, "ce"|"la_strong"|"bape_la": {"augment": ...,
                                                 #  "step": ..., "compiled_step": ..., "predicted_ratio": ...}}

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
LAUNCH_US, SYNC_US = (5.0, 10.0, 20.0), 100.0


def step_config(method: dict, root: Path, batch: int) -> dict:
    from ltbench.recipe import resolve_run_config

    raw = {"data": {"name": "cifar100_lt", "root": str(root), "imb_factor": 1.0}, "backbone": {"name": "resnet32"},
           "method": method, "train": {"augment_on": "batch", "num_workers": 0, "progress": False, "threads": 1},
           "optim": {"lr": 0.1, "batch_size": batch, "epochs": 2, "warmup_epochs": 0}}
    return resolve_run_config(raw, seed=0, where="gpu_launches")


def count_step(config: dict, tmp: Path, loops: bool = True) -> dict:
    """Launches and syncs of the second step of an epoch (``engine.epoch_step``, the whole per-step body of
    ``engine.train_epoch``: this step's training, the next batch's copies and augmentation, the meters and the
    host's bookkeeping; counted by benchmarks/devtools/step_cost.py), by phase, plus loop iterations; and the
    eager launches of the regions train.compile compiles (``model``, ``loss_alone``, ``views_alone``)."""
    from benchmarks.devtools.step_cost import counted_epoch_step

    with counted_epoch_step(config, tmp, step=1, loops=loops) as (c, s, loop, loop_counter):
        views = loop.upcoming.views
        model = count_model_alone(s.run, views, c)
        loss = count_loss_alone(s.run, len(views), len(loop.upcoming.labels), c)
    out = summarize(c, model, loop_counter)
    out["step"]["loss_alone"] = loss
    out["augment"]["views_alone"] = out["augment"]["launches"] - 1  # less the seeds' copy, which stays eager
    return out


def count_loss_alone(run, views: int, batch: int, c) -> int:
    """The method's loss and its backward into the features, alone, less the backward's seed (which stays
    eager under train.compile)."""
    import torch

    from benchmarks.devtools import gpu_cost

    g = torch.Generator().manual_seed(0)
    features = [gpu_cost.to_device(torch.randn(batch, run.backbone.feature_dim, generator=g).requires_grad_())
                for _ in range(views)]
    labels = gpu_cost.to_device(torch.randint(0, run.data.num_classes, (batch,), generator=g))
    before = c.launch_count()
    with c.phase("loss_alone"):
        run.method.loss(features, labels, epoch=0)["loss"].backward()
    return c.launch_count() - before - 1


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
            "loop_iterations": loops.total() if loops is not None else None, "sync_sites": sites,
            "pageable_copies": [{"phase": p, "site": site, "count": n} for p in ("copies", "augment", *STEP_PHASES)
                                for site, n in c.pageable_sites(p)]}


def count_bare(config: dict, views: int) -> dict:
    """Launches and syncs of one steady-state step of the bare loop (gpu_throughput.BareLoop) on the emulated
    device: step 1, after step 0 created SGD's momentum buffers (one clone per parameter); fused SGD, as on CUDA."""
    import torch

    from benchmarks.devtools import gpu_cost
    from benchmarks.devtools.step_cost import fused_sgd_allowed

    bare = BareLoop(config, torch.device("cpu"), views)
    bare.images, bare.labels = bare.images[:bare.batch], bare.labels[:bare.batch]
    with gpu_cost.counting() as c, fused_sgd_allowed():
        bare.images, bare.labels = gpu_cost.to_device(torch.as_tensor(bare.images)), gpu_cost.to_device(bare.labels)
        bare.mean, bare.std = gpu_cost.to_device(bare.mean), gpu_cost.to_device(bare.std)
        bare.model.to(gpu_cost.DEVICE)
        bare.opt = torch.optim.SGD(bare.model.parameters(), lr=0.1, momentum=0.9, fused=True)
        bare.device = gpu_cost.DEVICE
        step = _one_bare_step(bare)
        step()  # step 0: SGD's momentum buffers
        c.clear()
        step()
    return {"launches": c.launch_count(), "syncs": c.sync_count()}


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
    from benchmarks.devtools import gpu_cost

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


def compiled_kernels(fn, *args) -> int:
    """Kernel launches of ``fn(*args)`` (forward and, when it calls backward, backward) from the code Inductor
    generates on this CPU: each call line of a graph's wrapper (fused kernels, library calls, ATen fallbacks) is
    one launch per step. On CUDA Inductor emits Triton kernels for the same fused nodes, so the count carries
    over up to the backends' fusion choices."""
    from torch._inductor.utils import run_and_get_code

    from ltbench.data.batch_augment import _KERNEL_CALL

    _, codes = run_and_get_code(fn, *args)
    return sum(len(_KERNEL_CALL.findall(code[code.find("def call("):])) for code in codes if "def call(" in code)


COMPILE_BATCH = 32  # static shapes: Inductor's kernels per call do not depend on the batch size, its compile time does


def count_compiled_step(config: dict, counts: dict, backbone_cache: dict) -> dict:
    """The step as ``train.compile: inductor`` runs it, views included: the eagerly counted step with the
    regions that train.compile compiles (the backbone's forward and backward, the method's loss and its
    backward, each batched view) replaced by Inductor's kernels for them, compiled on this CPU at batch
    ``COMPILE_BATCH``. What stays eager (copies, the optimizer, the meters, concatenations, bookkeeping) keeps its
    eager count. Minutes of compiling on a CPU; the backbone's count is shared by the settings."""
    import torch

    from ltbench.data import batch_augment
    from ltbench.train import engine

    torch.manual_seed(0)
    run = engine.build_run(config)
    run.model.train()
    run.method.on_epoch_start(0)
    views, b = len(run.method.views()), COMPILE_BATCH
    g = torch.Generator().manual_seed(0)
    torch._dynamo.reset()
    key = (type(run.backbone).__name__, sum(p.numel() for p in run.backbone.parameters()))
    if key not in backbone_cache:
        x = torch.randn(b, 3, 32, 32, generator=g)
        backbone = torch.compile(run.backbone, backend="inductor")
        backbone_cache[key] = compiled_kernels(lambda: backbone(x).float().sum().backward())
    features = [torch.randn(b, run.backbone.feature_dim, generator=g, requires_grad=True) for _ in range(views)]
    labels = torch.randint(0, run.data.num_classes, (b,), generator=g)
    loss = torch.compile(run.method.loss, backend="inductor")
    loss_kernels = compiled_kernels(lambda: loss(features, labels, epoch=0)["loss"].backward())
    images = torch.randint(0, 256, (b, 3, 32, 32), dtype=torch.uint8, generator=g)
    seeds = torch.randint(0, 2**31, (b,), generator=g)
    pipelines = [batch_augment.build_batch(v, run.data.image, run.data.pipelines) for v in run.method.views()]
    view_kernels = sum(batch_augment.compiled_kernel_count(p, images, seeds, v)["total"]
                       for v, p in enumerate(pipelines))
    eager_rest = (counts["step"]["launches"] - counts["step"]["model"] - counts["step"]["loss_alone"]
                  + counts["augment"]["launches"] - counts["augment"]["views_alone"])
    torch._dynamo.reset()
    return {"launches": eager_rest + backbone_cache[key] + loss_kernels + view_kernels,
            "syncs": counts["step"]["syncs"] + counts["augment"]["syncs"],
            "eager_rest": eager_rest, "backbone": backbone_cache[key], "loss": loss_kernels,
            "views": view_kernels}


def predicted_ratios(launches: int, syncs: int, bare_launches: int, views: int) -> dict:
    """Bare step / predicted step at 5, 10 and 20 us per launch beyond the bare loop's (a sync: 100 us); a
    step with fewer launches than the bare loop is predicted at 1 (the model cannot say more)."""
    bare_ms = BARE_FIXED_MS + BARE_PER_VIEW_MS * views
    return {f"{us:g}": round(bare_ms / (bare_ms + (max(launches - bare_launches, 0) * us + syncs * SYNC_US) / 1000), 2)
            for us in LAUNCH_US}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the counts as JSON")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--no-compiled-step", action="store_true",
                    help="skip the step as train.compile: inductor runs it (minutes of compiling on a CPU)")
    ap.add_argument("--loops", action="store_true", help="also count Python loop iterations (slow: a line tracer)")
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
        bare, backbone_cache = None, {}
        for name in args.settings:
            if name in LARGE_SETTINGS:
                results[name] = count_large(LARGE_SETTINGS[name], args.batch)
                continue
            config = step_config(STEP_SETTINGS[name], root, args.batch)
            if bare is None:
                bare = {"one_view": count_bare(config, 1)["launches"], "three_views": count_bare(config, 3)["launches"]}
                results["bare"] = bare
            counts = count_step(config, Path(tmp), loops=args.loops)
            views = views_of(config)
            reference = bare["one_view"] if views == 1 else bare["three_views"] if views == 3 else \
                count_bare(config, views)["launches"]
            counts["bare_loop_launches"] = reference
            eager = counts["augment"]["launches"] + counts["step"]["launches"]
            counts["predicted_ratio"] = {"eager": predicted_ratios(
                eager, counts["augment"]["syncs"] + counts["step"]["syncs"], reference, views)}
            if not args.no_compiled_step:
                counts["compiled_step"] = count_compiled_step(config, counts, backbone_cache)
                counts["predicted_ratio"]["compiled"] = predicted_ratios(
                    counts["compiled_step"]["launches"], counts["compiled_step"]["syncs"], reference, views)
            if name == "ce":
                fp16 = step_config(STEP_SETTINGS[name], root, args.batch)
                fp16["train"]["precision"] = "fp16"
                counted = count_step(fp16, Path(tmp), loops=False)
                counts["fp16_step"] = {"launches": counted["augment"]["launches"] + counted["step"]["launches"],
                                       "syncs": counted["augment"]["syncs"] + counted["step"]["syncs"]}
            results[name] = counts
    if args.pipelines:
        results["pipelines"] = count_pipelines(args.batch, args.compiled)
    return results


def print_table(results: dict, batch: int) -> None:
    print(f"Per training step of {batch} images, counted on the CPU with CUDA emulated (benchmarks/devtools/gpu_cost.py)")
    print(f"{'setting':<14} {'aug launches':>12} {'aug syncs':>9} {'step launches':>13} {'model':>6} "
          f"{'optim':>6} {'method':>6} {'step syncs':>10} {'loop iters':>10}")
    steps = {name: r for name, r in results.items() if name != "bare"}
    for name, r in steps.items():
        st = r.get("step", {})
        print(f"{name:<14} {r['augment']['launches']:>12} {r['augment']['syncs']:>9} {st.get('launches', '-'):>13} "
              f"{st.get('model', '-'):>6} {st.get('optimizer', '-'):>6} {st.get('method', '-'):>6} "
              f"{st.get('syncs', '-'):>10} {str(r['loop_iterations']):>10}")
    print("\nSyncs by source line:")
    for name, r in steps.items():
        for site in r["sync_sites"]:
            print(f"  {name:<14} {site['phase']:<9} x{site['count']:<4} {site['kind']} ({site['op']}) at {site['site']}")
    if "bare" in results:
        print(f"\nBare loop at steady state (step 1): {results['bare']['one_view']} launches per step with one view, "
              f"{results['bare']['three_views']} with three")
    for name, r in steps.items():
        if "compiled_step" in r:
            cs = r["compiled_step"]
            print(f"  {name:<14} with train.compile: {cs['launches']} launches, {cs['syncs']} syncs (eager rest "
                  f"{cs['eager_rest']}, backbone {cs['backbone']}, loss {cs['loss']}, views {cs['views']})")
        if "fp16_step" in r:
            print(f"  {name:<14} fp16 step: {r['fp16_step']['launches']} launches, {r['fp16_step']['syncs']} syncs")
    print("\nPREDICTED ratio to the H100 bare loop at 5 / 10 / 20 us per launch (a cost model, not a measurement):")
    for name, r in steps.items():
        if "predicted_ratio" in r:
            spread = "; ".join(f"{mode} " + " / ".join(str(v) for v in ratios.values())
                               for mode, ratios in r["predicted_ratio"].items())
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
    from benchmarks.devtools import gpu_cost

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
