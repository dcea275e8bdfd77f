"""Per-image augmentation (train.augment_on: worker) against per-sample augmentation of whole batches (batch).

Three measurements, each side by side in one process, with one torch thread and CPU time
(``time.process_time``), which other processes on a busy machine barely change:

1. **Images/s per core** for every built-in pipeline and for BAPE's three views (strong + 2 sim), on
   CIFAR-size (3x32x32) and Fashion-MNIST-size (1x28x28) images: the per-image pipeline as a loader worker
   runs it (seed, then transform, image by image) against ``batch_augment`` on batches of ``--batch``.
   Rounds alternate between the two; the median round is reported.
2. ``--kornia`` (needs kornia importable): kornia.augmentation's nearest equivalents on the same batches,
   for the library-or-plain-torch decision (docs/performance.md). Its AutoAugment draws one sub-policy per
   batch, so it is timed but not an equivalent.
3. ``--baseline REF``: the batched pipelines of this tree against those of git commit REF (its
   ``ltbench/data/batch_augment.py`` loaded beside the current one), CPU time per batch of ``--batch``, BAPE's
   three views and every pipeline, alternating rounds in one process: a before/after of a change to the
   batched path measured side by side.
4. ``--epoch-share``: a BAPE+LA epoch on the quickstart data (Fashion-MNIST-LT, ResNet-8, batch 64, three
   views; recipes/fmnist_augment_on.yaml's configuration) with augment_on worker (no loader workers: the
   views are built in the training process) and batch, against the same steps on views built beforehand
   (pre-augmented tensors). The augmentation share of an epoch = (epoch - pre-augmented epoch) / epoch.

    .venv/bin/python benchmarks/augment_throughput.py [--rounds 5] [--batch 256] [--kornia] [--epoch-share]
        [--baseline main --skip-throughput]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ltbench.data import batch_augment, transforms  # noqa: E402
from ltbench.data.base import ImageSpec  # noqa: E402

SPECS = {
    "CIFAR": ImageSpec(32, 3, (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "Fashion-MNIST": ImageSpec(28, 1, (0.286,), (0.353,)),
}
BAPE_VIEWS = ["autoaug_cutout", "simaug", "simaug"]
CLOCK = time.process_time


def source_images(spec: ImageSpec, n: int) -> torch.Tensor:
    """Natural-looking test images: smooth random blobs (AutoAugment's equalize/autocontrast see real ranges)."""
    g = torch.Generator().manual_seed(0)
    coarse = torch.randint(0, 256, (n, spec.channels, 8, 8), generator=g).float()
    fine = torch.nn.functional.interpolate(coarse, size=(spec.size, spec.size), mode="bicubic")
    return fine.clamp(0, 255).round().to(torch.uint8)


def per_image_seconds(views: list, images: torch.Tensor, seed0: int) -> float:
    t0 = CLOCK()
    for i in range(len(images)):
        torch.random.default_generator.manual_seed(seed0 + i)  # as SeededSamples does per sample
        for tf in views:
            tf(images[i])
    return CLOCK() - t0


def batched_seconds(views: list, images: torch.Tensor, seed0: int, batch: int) -> float:
    t0 = CLOCK()
    for start in range(0, len(images), batch):
        x = images[start:start + batch]
        seeds = torch.arange(seed0 + start, seed0 + start + len(x))
        for v, pipeline in enumerate(views):
            pipeline(x, seeds, view=v)
    return CLOCK() - t0


def compare(spec: ImageSpec, names: list[str], n: int, batch: int, rounds: int) -> tuple[float, float]:
    """Median images/s per core of (per-image, batched) over alternating rounds."""
    per = [transforms.build(name, spec) for name in names]
    bat = [batch_augment.build_batch(name, spec) for name in names]
    images = source_images(spec, n)
    batched_seconds(bat, images[:batch], 0, batch)  # warm-up (first calls allocate)
    per_image_seconds(per, images[:32], 0)
    a, b = [], []
    for r in range(rounds):
        a.append(n / per_image_seconds(per, images, 1000 * r))
        b.append(n / batched_seconds(bat, images, 1000 * r, batch))
    return statistics.median(a), statistics.median(b)


def throughput(args) -> None:
    print(f"torch {torch.__version__}, 1 thread, CPU time; batch {args.batch}; median of {args.rounds} alternating "
          f"rounds of {args.images} images")
    print(f"{'images':14s} {'pipeline':22s} {'per-image img/s':>16s} {'batched img/s':>14s} {'speed-up':>9s}")
    for data, spec in SPECS.items():
        cases = [[name] for name in sorted(transforms.PIPELINES.names()) if name != "imagenet_eval"] + [BAPE_VIEWS]
        for names in cases:
            label = "BAPE 3 views" if names is BAPE_VIEWS else names[0]
            per, bat = compare(spec, names, args.images, args.batch, args.rounds)
            print(f"{data:14s} {label:22s} {per:16.0f} {bat:14.0f} {bat / per:8.2f}x", flush=True)


def kornia_pipelines(spec: ImageSpec) -> dict:
    """kornia.augmentation's closest equivalents (float input in [0, 1]; parameters per sample except in
    its AutoAugment, whose sub-policy is one per call)."""
    import kornia.augmentation as K

    size = spec.size
    color = [K.ColorJitter(0.4, 0.4, 0.4, 0.1, p=0.8), K.RandomGrayscale(p=0.2)] if spec.channels == 3 else \
        [K.ColorJitter(0.4, 0.4, p=0.8)]
    out = {
        "standard": K.AugmentationSequential(K.RandomCrop((size, size), padding=4), K.RandomHorizontalFlip()),
        "simaug": K.AugmentationSequential(K.RandomResizedCrop((size, size)), K.RandomHorizontalFlip(), *color),
    }
    if spec.channels == 3:
        from kornia.augmentation.auto import AutoAugment

        out["autoaug_cutout (1 policy/batch)"] = K.AugmentationSequential(
            K.RandomCrop((size, size), padding=4), K.RandomHorizontalFlip(), AutoAugment("cifar10"),
            K.RandomErasing(scale=(0.25, 0.25), ratio=(1.0, 1.0), p=1.0))
    return out


def kornia_rates(args) -> None:
    print(f"\nkornia (same batches, float input, 1 thread, CPU time; median of {args.rounds} rounds), against "
          f"ltbench's batched path")
    for data, spec in SPECS.items():
        images = source_images(spec, args.images)
        for name, aug in kornia_pipelines(spec).items():
            ours = batch_augment.build_batch(name.split(" ")[0], spec)
            rates, own = [], []
            for r in range(args.rounds + 1):
                t0 = CLOCK()
                for start in range(0, len(images), args.batch):
                    aug(images[start:start + args.batch].float().div_(255))
                k = CLOCK() - t0
                o = batched_seconds([ours], images, 1000 * r, args.batch)
                if r:  # round 0 warms up
                    rates.append(len(images) / k)
                    own.append(len(images) / o)
            kr, orate = statistics.median(rates), statistics.median(own)
            print(f"{data:14s} {name:32s} kornia {kr:8.0f} img/s   ltbench batched {orate:8.0f} img/s", flush=True)


# ------------------------------------------------------------------------------------------------
# The augmentation share of a BAPE+LA epoch


def bape_sessions(tmp: str) -> dict:
    """Two sessions of the quickstart BAPE+LA run (recipes/fmnist_augment_on.yaml, seed 0): worker and batch."""
    from ltbench.train import engine
    from ltbench.recipe import load_recipe
    from ltbench.results.runspec import RunSpec

    runs = load_recipe(ROOT / "recipes" / "fmnist_augment_on.yaml").runs
    out = {}
    for mode in ("worker", "batch"):
        run = next(r for r in runs if r.config["method"]["name"] == "bape" and r.config["seed"] == 0
                   and r.config["train"].get("augment_on", "worker") == mode)
        spec = dataclasses.replace(RunSpec.coerce(run), run_dir=f"{tmp}/{mode}")
        s = engine.start_session(spec, lambda msg: None)
        s.run.loader = engine.make_loader(s.run, s.seed, 0, s.device)
        out[mode] = s
    return out


def timed_epoch(s, epoch: int, prepared: list | None = None) -> tuple[float, float]:
    """(augmentation and loading CPU seconds, step CPU seconds) of one epoch; ``prepared``: ready views."""
    from ltbench.train import engine

    run = s.run
    run.model.train()
    batches = engine.epoch_batches(len(run.data.train), run.optim.batch_size, s.seed, epoch)
    keys = run.loader.samples.train_keys(batches, 0, epoch)
    source = iter(prepared) if prepared is not None else zip(run.loader.run(keys), keys)
    augment = step = 0.0
    for i in range(len(keys)):
        t0 = CLOCK()
        (views, labels), batch_keys = next(source)
        if run.device_views is not None and prepared is None:
            views = engine.augment_on_device(run, views[0], batch_keys, s.device)
        t1 = CLOCK()
        engine.train_step(s, views, labels, epoch, i)
        augment, step = augment + t1 - t0, step + CLOCK() - t1
    return augment, step


def epoch_share(args) -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="ltbench-augshare-") as tmp:
        sessions = bape_sessions(tmp)
        w = sessions["worker"]
        keys = w.run.loader.samples.train_keys(engine_batches(w, 0), 0, 0)
        prepared = list(zip(w.run.loader.run(keys), keys))  # epoch 0's views, built once
        totals: dict = {k: [] for k in ("worker", "batch", "pre-augmented")}
        for epoch in range(args.share_epochs + 1):
            for mode in ("worker", "batch", "pre-augmented"):
                s = sessions["worker" if mode == "pre-augmented" else mode]
                result = timed_epoch(s, 0 if mode == "pre-augmented" else epoch,
                                     prepared if mode == "pre-augmented" else None)
                if epoch:  # epoch 0 warms up
                    totals[mode].append(result)
    pre = statistics.median(a + b for a, b in totals["pre-augmented"])
    print(f"\nBAPE+LA epoch, quickstart data ({len(w.run.data.train)} images, 3 views, ResNet-8, batch 64), 1 thread, "
          f"CPU s per epoch (median of {args.share_epochs}):")
    print(f"  pre-augmented views: {pre:6.2f} s")
    for mode in ("worker", "batch"):
        total = statistics.median(a + b for a, b in totals[mode])
        aug = statistics.median(a for a, _ in totals[mode])
        print(f"  augment_on {mode:6s}:   {total:6.2f} s, of which building the views {aug:5.2f} s; "
              f"augmentation share (epoch - pre-augmented) / epoch = {100 * (total - pre) / total:4.1f}%")


# ------------------------------------------------------------------------------------------------
# Before/after of the batched path: this tree against a git commit, in one process


def baseline_module(ref: str):
    """``ltbench/data/batch_augment.py`` as it is at git ``ref``, loaded as its own module; its pipelines
    register into a private registry (the current module already holds the names)."""
    import importlib.util

    source = subprocess.run(["git", "show", f"{ref}:ltbench/data/batch_augment.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    source = source.replace("from ltbench.registry import BATCH_PIPELINES",
                            "from ltbench.registry import Registry\n"
                            "BATCH_PIPELINES = Registry('baseline batched pipeline', None)")
    spec = importlib.util.spec_from_loader(f"batch_augment_at_{ref}", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source, f"{ref}:ltbench/data/batch_augment.py", "exec"), module.__dict__)
    return module


def per_batch_ms(views: list, images: torch.Tensor, seed0: int, batch: int) -> float:
    """CPU milliseconds per batch of ``batch`` images for all ``views``."""
    return 1000 * batched_seconds(views, images, seed0, batch) / (len(images) // batch)


def against_baseline(args) -> None:
    old = baseline_module(args.baseline)
    spec = SPECS["CIFAR"]
    images = source_images(spec, args.batch * max(1, args.images // args.batch))
    cases = [BAPE_VIEWS] + [[name] for name in sorted(transforms.PIPELINES.names()) if name != "imagenet_eval"]
    print(f"\nBatched path, this tree against {args.baseline} (same process, alternating rounds): CPU ms per batch "
          f"of {args.batch} CIFAR-size images, 1 thread, median of {args.rounds}")
    print(f"{'pipeline':22s} {args.baseline + ' ms':>12s} {'now ms':>10s} {'now / before':>13s}")
    for names in cases:
        before = [old.build_batch(name, spec) for name in names]
        after = [batch_augment.build_batch(name, spec) for name in names]
        for warm_up in (before, after):
            batched_seconds(warm_up, images[:args.batch], 0, args.batch)
        a, b = [], []
        for r in range(args.rounds):
            a.append(per_batch_ms(before, images, 1000 * r, args.batch))
            b.append(per_batch_ms(after, images, 1000 * r, args.batch))
        ma, mb = statistics.median(a), statistics.median(b)
        label = "BAPE 3 views" if names is BAPE_VIEWS else names[0]
        print(f"{label:22s} {ma:12.1f} {mb:10.1f} {mb / ma:12.2f}x", flush=True)


def engine_batches(s, epoch: int):
    from ltbench.train import engine

    return engine.epoch_batches(len(s.run.data.train), s.run.optim.batch_size, s.seed, epoch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--images", type=int, default=512, help="images per round and pipeline")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--kornia", action="store_true", help="also time kornia.augmentation's equivalents")
    ap.add_argument("--epoch-share", action="store_true", help="also measure the augmentation share of a BAPE+LA epoch")
    ap.add_argument("--share-epochs", type=int, default=3)
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--baseline", metavar="REF", help="also time the batched path against git commit REF's")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not args.skip_throughput:
        throughput(args)
    if args.kornia:
        kornia_rates(args)
    if args.baseline:
        against_baseline(args)
    if args.epoch_share:
        epoch_share(args)


if __name__ == "__main__":
    main()
