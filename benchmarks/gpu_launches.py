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
(strong for LA, two SimAug views for BAPE), ProCo and SADE with their default views, ResNet-32 on
CIFAR-100-format files (random pixels), batch 256; and the ImageNet-size training views alone (``imagenet_train``; BAPE's RandAugment + SimAug views) on 256
images of 300-500 px sides.

The bare loop is counted at steady state (its step 1, after SGD made its momentum buffers), as the method
side is; both use SGD(fused=True), as CUDA runs do (``engine.make_optimizer``). Each setting has its own bare
loop: the same backbone (SADE: its multi-expert network), the same number of views.

Compiled modes (``--no-compiled-step`` skips them): the regions ``train.compile`` compiles (the backbone's
forward and backward, the method's loss and its backward, each batched view) are counted from the CUDA (Triton)
code Inductor generates for them on this CPU with a pretended GPU (benchmarks/gpu_codegen.py), at the batch
size asked (default 256, the CIFAR recipes'); what stays eager (copies, optimizer, meters, bookkeeping) keeps its
eager count. ``inductor``: each compiled kernel is a launch. ``reduce-overhead``: each compiled backbone or loss
graph (forward, backward) is one CUDA-graph replay, the views stay compiled kernels (never graphed). The bare
loop in a compiled mode compiles its model, head and cross-entropy as one function, forward and backward.

The predicted GPU ratio is a **prediction from a stated cost model, not a measurement**. The eager bare loop's
step on one H100 (an earlier review: about 7.7 ms of launch-bound fixed cost plus 2.4 ms of GPU work per 256
images per view, bf16 + channels_last, ResNet-32) is the anchor; a step with L launches and S syncs is predicted
at anchor + (L - the eager bare loop's launches) x launch_us + S x 100 us (the host refills the queue after a
sync), at 5, 10 and 20 us per launch, and never below the anchor's GPU work. A bare loop of another backbone
(SADE's) is anchored the same way from ResNet-32's, by its launches: its extra GPU work is not modelled, which
makes its ratios lower than they would be. Ratios: bare / method, against the bare loop in the same mode and
against the eager bare loop; no cap (above 1: fewer launches than that bare loop).

    python benchmarks/gpu_launches.py                          # the table
    python benchmarks/gpu_launches.py --settings proco sade   # fewer settings per call (CPU time)
    python benchmarks/gpu_launches.py --json                   # per setting: "eager", "inductor",
        # "reduce-overhead" (launches, syncs), "bare" (launches per mode), "regions", "predicted"

Augmentation section (``--pipelines``, ``--compiled``): every batched pipeline alone (CIFAR-size RGB batch; the
ImageNet-size ones on a list of 300-500 px images), launches and syncs in eager mode; with ``--compiled``
also the CUDA kernels one compiled call launches (gpu_codegen.py). JSON key ``"pipelines"``.
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
                 "bape_la": BAPE_LA, "proco": {"name": "proco"}, "sade": {"name": "sade"}}
MODES = ("eager", "inductor", "reduce-overhead")
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
    device: step 1, after step 0 created SGD's momentum buffers (one clone per parameter); fused SGD, as on CUDA.
    ``region``: the launches of the part a compiled bare loop compiles (model, head and cross-entropy, forward
    and backward), less the backward's seed, which stays eager."""
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
        bare.step(bare.images, bare.labels)  # step 0: SGD's momentum buffers
        x = torch.cat([bare.view(bare.images) for _ in range(views)])
        bare.opt.zero_grad(set_to_none=True)
        c.clear()
        bare.loss(x, bare.labels).backward()
        region = c.launch_count() - 1  # less the backward's seed, which stays eager
        bare.opt.zero_grad(set_to_none=True)
        c.clear()
        bare.step(bare.images, bare.labels)
    return {"launches": c.launch_count(), "syncs": c.sync_count(), "region": region,
            "backbone": type(bare.model[0]).__name__, "parameters": sum(p.numel() for p in bare.model.parameters())}


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


def compiled_regions(config: dict, batch: int, cache: dict) -> dict:
    """CUDA launches of the regions train.compile compiles for ``config`` at ``batch`` (gpu_codegen.count):
    the backbone's forward and backward on all views at once, the method's loss and its backward, each view.
    ``cache`` keeps counts that settings share (a backbone on as many views, a view pipeline)."""
    import torch

    import gpu_codegen
    from ltbench.data import batch_augment
    from ltbench.train import engine

    torch.manual_seed(0)
    run = engine.build_run(config)
    run.model.train()
    run.method.on_epoch_start(0)
    names, g = run.method.views(), torch.Generator().manual_seed(0)
    key = ("backbone", type(run.backbone).__name__, sum(p.numel() for p in run.backbone.parameters()), len(names))
    if key not in cache:
        cache[key] = gpu_codegen.count(run.backbone, torch.randn(len(names) * batch, 3, 32, 32, generator=g))
    features = [torch.randn(batch, run.backbone.feature_dim, generator=g, requires_grad=True) for _ in names]
    labels = torch.randint(0, run.data.num_classes, (batch,), generator=g)
    loss = gpu_codegen.count(run.method.loss, features, labels, epoch=0)
    images = torch.randint(0, 256, (batch, 3, 32, 32), dtype=torch.uint8, generator=g)
    seeds = torch.randint(0, 2**31, (batch,), generator=g)
    views = []
    for v, name in enumerate(names):
        pipeline = batch_augment.build_batch(name, run.data.image, run.data.pipelines)
        if ("view", name) not in cache:
            pipeline(images, seeds, v)  # its constants, made eagerly, as CompiledPipeline's first call does
            cache[("view", name)] = gpu_codegen.count(pipeline.__call__, images, seeds, v, fullgraph=True,
                                                      dynamic=False)
        views.append(cache[("view", name)])
    return {"backbone": cache[key].as_dict(), "loss": loss.as_dict(), "views": [v.as_dict() for v in views]}


def compiled_bare(config: dict, views: int, batch: int, cache: dict):
    """CUDA launches of the compiled part of the bare loop: model, head and cross-entropy, forward and backward."""
    import torch

    import gpu_codegen

    bare = BareLoop(config, torch.device("cpu"), views)
    key = ("bare", type(bare.model[0]).__name__, sum(p.numel() for p in bare.model.parameters()), views)
    if key not in cache:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(views * batch, 3, 32, 32, generator=g)
        cache[key] = gpu_codegen.count(bare.loss, x, torch.randint(0, 100, (batch,), generator=g))
    return cache[key]


def step_modes(counts: dict, regions: dict | None) -> dict:
    """Launches and syncs of the step in each mode: eager as counted; compiled modes as the eager step with the
    compiled regions' eager launches replaced by their CUDA count (inductor) or by one CUDA-graph replay per
    compiled backbone or loss graph, the views' kernels as compiled (reduce-overhead)."""
    step, augment = counts["step"], counts["augment"]
    syncs = step["syncs"] + augment["syncs"]
    out = {"eager": {"launches": step["launches"] + augment["launches"], "syncs": syncs}}
    if regions is None:
        return out
    rest = step["launches"] - step["model"] - step["loss_alone"] + augment["launches"] - augment["views_alone"]
    views = sum(v["launches"] for v in regions["views"])
    out["inductor"] = {"launches": rest + regions["backbone"]["launches"] + regions["loss"]["launches"] + views,
                       "syncs": syncs, "eager_rest": rest}
    out["reduce-overhead"] = {"launches": rest + regions["backbone"]["wrappers"] + regions["loss"]["wrappers"] + views,
                              "syncs": syncs, "eager_rest": rest}
    return out


def bare_modes(bare: dict, compiled) -> dict:
    rest = bare["launches"] - bare["region"]
    out = {"eager": bare["launches"]}
    if compiled is not None:
        out.update({"inductor": rest + compiled.launches, "reduce-overhead": rest + compiled.wrappers})
    return out


def predicted_ms(launches: int, syncs: int, anchor_launches: int, views: int, us: float) -> float:
    """A step's predicted milliseconds on the H100 (the module's cost model): the eager ResNet-32 bare loop's
    measured step, plus the launches beyond its own at ``us`` each and 100 us per sync; never below its GPU work."""
    anchor_ms = BARE_FIXED_MS + BARE_PER_VIEW_MS * views
    return max(BARE_PER_VIEW_MS * views, anchor_ms + ((launches - anchor_launches) * us + syncs * SYNC_US) / 1000)


def predictions(modes: dict, bare: dict, anchor_launches: int, views: int) -> dict:
    """Bare / method predicted step time, per mode and launch cost: against the bare loop in the same mode and
    against the eager bare loop. No cap: above 1 when the method launches fewer kernels than that bare loop."""
    out = {}
    for mode, step in modes.items():
        same, eager = {}, {}
        for us in LAUNCH_US:
            ms = predicted_ms(step["launches"], step["syncs"], anchor_launches, views, us)
            same[f"{us:g}"] = round(predicted_ms(bare[mode], 0, anchor_launches, views, us) / ms, 2)
            eager[f"{us:g}"] = round(predicted_ms(bare["eager"], 0, anchor_launches, views, us) / ms, 2)
        out[mode] = {"vs_bare_same_mode": same, "vs_bare_eager": eager}
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the counts as JSON")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--no-compiled-step", action="store_true",
                    help="skip the compiled modes (CUDA code generation: minutes of CPU per setting)")
    ap.add_argument("--loops", action="store_true", help="also count Python loop iterations (slow: a line tracer)")
    ap.add_argument("--settings", nargs="+", choices=[*STEP_SETTINGS, *LARGE_SETTINGS],
                    default=[*STEP_SETTINGS, *LARGE_SETTINGS])
    ap.add_argument("--pipelines", action="store_true", help="also count every batched pipeline alone")
    ap.add_argument("--compiled", action="store_true",
                    help="with --pipelines: also the CUDA kernel count under torch.compile (minutes of CPU)")
    return ap.parse_args(argv)


def measure(args) -> dict:
    import time

    import torch

    from gpu_throughput import views_of

    torch.set_num_threads(1)
    started, results, cache, bare_counts = time.process_time(), {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="ltbench-launches-") as tmp:
        root = write_cifar100(Path(tmp) / "cifar", max(1, -(-args.batch * 3 // 100)), 1)  # 3 batches: steps 0, 1
        # and the batch that step 1 prepares
        for name in args.settings:
            if name in LARGE_SETTINGS:
                results[name] = count_large(LARGE_SETTINGS[name], args.batch)
                continue
            config = step_config(STEP_SETTINGS[name], root, args.batch)
            views = views_of(config)
            counts = count_step(config, Path(tmp), loops=args.loops)
            bare = count_bare(config, views)
            anchor = step_config(STEP_SETTINGS["ce"], root, args.batch)  # the ResNet-32 bare loop: the cost anchor
            anchor_key = ("resnet32", views)
            if anchor_key not in bare_counts:
                bare_counts[anchor_key] = bare if name != "sade" else count_bare(anchor, views)
            regions = None if args.no_compiled_step else compiled_regions(config, args.batch, cache)
            compiled = None if args.no_compiled_step else compiled_bare(config, views, args.batch, cache)
            counts["regions"] = regions
            counts.update(step_modes(counts, regions))
            counts["bare"] = {**bare_modes(bare, compiled), "backbone": bare["backbone"],
                              "parameters": bare["parameters"], "syncs": bare["syncs"]}
            counts["predicted"] = predictions({m: counts[m] for m in MODES if m in counts}, counts["bare"],
                                              bare_counts[anchor_key]["launches"], views)
            if name == "ce":
                fp16 = step_config(STEP_SETTINGS[name], root, args.batch)
                fp16["train"]["precision"] = "fp16"
                counted = count_step(fp16, Path(tmp), loops=False)
                counts["fp16_step"] = {"launches": counted["augment"]["launches"] + counted["step"]["launches"],
                                       "syncs": counted["augment"]["syncs"] + counted["step"]["syncs"]}
            results[name] = counts
    if args.pipelines:
        results["pipelines"] = count_pipelines(args.batch, args.compiled)
    results["cpu_seconds"] = round(time.process_time() - started, 1)
    return results


def print_table(results: dict, batch: int) -> None:
    print(f"Per training step of {batch} images, counted on the CPU with CUDA emulated (benchmarks/devtools/gpu_cost.py)")
    print(f"{'setting':<14} {'aug launches':>12} {'aug syncs':>9} {'step launches':>13} {'model':>6} "
          f"{'optim':>6} {'method':>6} {'step syncs':>10} {'loop iters':>10}")
    steps = {name: r for name, r in results.items() if isinstance(r, dict)}
    for name, r in steps.items():
        st = r.get("step", {})
        print(f"{name:<14} {r['augment']['launches']:>12} {r['augment']['syncs']:>9} {st.get('launches', '-'):>13} "
              f"{st.get('model', '-'):>6} {st.get('optimizer', '-'):>6} {st.get('method', '-'):>6} "
              f"{st.get('syncs', '-'):>10} {str(r['loop_iterations']):>10}")
    print("\nSyncs by source line:")
    for name, r in steps.items():
        for site in r["sync_sites"]:
            print(f"  {name:<14} {site['phase']:<9} x{site['count']:<4} {site['kind']} ({site['op']}) at {site['site']}")
    print("\nLaunches per step by mode (compiled regions: CUDA code generated for a pretended sm_90 GPU; "
          "reduce-overhead: one replay per graph), and the bare loop of the same backbone and views:")
    print(f"{'setting':<14} {'mode':<16} {'launches':>9} {'syncs':>6} {'bare':>6}  regions (launches / wrappers)")
    for name, r in steps.items():
        if "bare" not in r:
            continue
        regions = r.get("regions") or {}
        detail = ", ".join(f"{k} {v['launches']}/{v['wrappers']}" for k, v in
                           [("backbone", regions.get("backbone")), ("loss", regions.get("loss"))] if v)
        detail += f", views {sum(v['launches'] for v in regions['views'])}" if regions else ""
        for mode in MODES:
            if mode in r:
                print(f"{name:<14} {mode:<16} {r[mode]['launches']:>9} {r[mode]['syncs']:>6} {r['bare'][mode]:>6}  "
                      f"{detail if mode == 'inductor' else ''}")
        if "fp16_step" in r:
            print(f"{name:<14} {'eager fp16':<16} {r['fp16_step']['launches']:>9} {r['fp16_step']['syncs']:>6}")
    print("\nPREDICTED ratio (bare / method step) at 5 / 10 / 20 us per launch, a cost model, not a measurement:")
    for name, r in steps.items():
        for mode, p in r.get("predicted", {}).items():
            same, eager = (" / ".join(str(v) for v in p[k].values()) for k in ("vs_bare_same_mode", "vs_bare_eager"))
            print(f"  {name:<14} {mode:<16} vs bare loop, same mode: {same:<18} vs eager bare loop: {eager}")
    if "cpu_seconds" in results:
        print(f"\nCPU time of this count: {results['cpu_seconds']} s")


def print_pipelines(pipelines: dict, batch: int) -> None:
    print(f"\nEach batched pipeline alone, batch {batch} (eager; 'compiled': CUDA kernels per call under "
          f"torch.compile, generated for a pretended GPU):")
    print(f"{'pipeline':<36} {'launches':>9} {'syncs':>6} {'compiled':>9} {'(triton + aten)':>15} {'CPU s':>8}")
    for name, r in pipelines.items():
        c = r.get("compiled")
        extra = f"{c['launches']:>9} {c['triton']:>7} + {c['aten']:<5} {c['cpu_seconds']:>8}" if c else ""
        print(f"{name:<36} {r['launches']:>9} {r['syncs']:>6} {extra}")


def count_pipelines(batch: int, compiled: bool) -> dict:
    """Launches and syncs of every batched pipeline alone (a second call: the first puts its constants on the
    device) on CIFAR-size RGB images, the ImageNet-size ones on a list of 300-500 px images; BAPE's three
    views together; with ``compiled``, the CUDA kernels of one compiled call (gpu_codegen.count)."""
    import torch

    import gpu_codegen

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
        if compiled and spec is cifar:
            for v, pipeline in enumerate(pipelines):  # constants made eagerly, as CompiledPipeline's first call does
                pipeline(images, seeds, v)
            counts = [gpu_codegen.count(p.__call__, images, seeds, v, fullgraph=True, dynamic=False).as_dict()
                      for v, p in enumerate(pipelines)]
            out[label]["compiled"] = {k: round(sum(c[k] for c in counts), 1) for k in ("launches", "triton", "aten",
                                                                                        "cpu_seconds")}
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
