"""Images per second that one data-loading worker produces, per augmentation pipeline, and how many
workers it takes to feed a GPU.

A DataLoader worker runs with one torch thread, so each pipeline is timed here in one process with
one thread, on the inputs a worker would see: uint8 tensors from memory for CIFAR-shaped (3x32x32)
and Fashion-MNIST-shaped (1x28x28) data; JPEG files decoded from disk (torchvision.io.decode_image,
as ltbench's file datasets do) for the ImageNet pipelines, on generated JPEGs of ImageNet's typical
size (500x375 and 375x500, quality 90, smooth random content plus noise; about 60-100 KB each).
"BAPE 3 views" is one image through BAPE's views (strong = AutoAugment + Cutout, and two SimAug),
counted once per image, as the GPU consumes it.

Each pipeline is timed twice, alternately: as ltbench builds it (the direct path: each transform's
kernels called without torchvision's per-call wrapping; bit-identical outputs) and as the plain
torchvision v2.Compose it replaces; the last column is the speed-up. Workers for a GPU rate R:
ceil(R / images per second per worker) (default R = 3,000 img/s, about ResNet-50 with AMP on one
modern GPU), assuming workers scale linearly, which holds while there are free cores.

    .venv/bin/python benchmarks/data_throughput.py [--seconds 1.5] [--rounds 3] [--gpu-rate 3000]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torchvision.io import ImageReadMode, decode_image, encode_jpeg

from ltbench.data import transforms
from ltbench.data.base import ImageSpec

CIFAR = ImageSpec(size=32, channels=3, mean=(0.4914, 0.4822, 0.4465), std=(0.2023, 0.1994, 0.2010))
FMNIST = ImageSpec(size=28, channels=1, mean=(0.2860,), std=(0.3530,))
IMAGENET = ImageSpec(size=224, channels=3, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), kind="large")


def make_jpegs(folder: Path, n: int) -> list[Path]:
    gen = torch.Generator().manual_seed(0)
    paths = []
    for i in range(n):
        h, w = (375, 500) if i % 2 == 0 else (500, 375)
        low = torch.rand(1, 3, 8, 8, generator=gen)
        image = torch.nn.functional.interpolate(low, size=(h, w), mode="bicubic", align_corners=False)[0]
        image = (image + 0.08 * torch.randn(3, h, w, generator=gen)).clamp(0, 1)
        path = folder / f"{i:03d}.jpg"
        path.write_bytes(encode_jpeg((image * 255).to(torch.uint8), quality=90).numpy().tobytes())
        paths.append(path)
    return paths


def small_images(spec: ImageSpec, n: int = 256) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return list(torch.randint(0, 256, (n, spec.channels, spec.size, spec.size), dtype=torch.uint8, generator=gen))


def pipelines(jpegs: list[Path]) -> dict[str, tuple]:
    """name -> (inputs, load(input) -> image, [transforms]); a BAPE item is one image through 3 views."""
    from_file = lambda p: decode_image(str(p), mode=ImageReadMode.RGB)  # noqa: E731
    in_memory = lambda x: x  # noqa: E731
    cifar, fmnist = small_images(CIFAR), small_images(FMNIST)
    out = {
        "imagenet_train (JPEG decode + RRC 224 + flip + jitter)": (jpegs, from_file, ["imagenet_train"], IMAGENET),
        "imagenet_eval (JPEG decode + resize 256 + crop 224)": (jpegs, from_file, ["imagenet_eval"], IMAGENET),
        "BAPE 3 views, ImageNet (1 decode, strong + 2 sim)": (jpegs, from_file, ["autoaug_cutout", "simaug", "simaug"],
                                                            IMAGENET),
        "CIFAR standard (crop + flip)": (cifar, in_memory, ["standard"], CIFAR),
        "CIFAR eval": (cifar, in_memory, ["eval"], CIFAR),
        "CIFAR autoaug_cutout": (cifar, in_memory, ["autoaug_cutout"], CIFAR),
        "CIFAR simaug": (cifar, in_memory, ["simaug"], CIFAR),
        "CIFAR randaugment": (cifar, in_memory, ["randaugment"], CIFAR),
        "BAPE 3 views, CIFAR (strong + 2 sim)": (cifar, in_memory, ["autoaug_cutout", "simaug", "simaug"], CIFAR),
        "Fashion-MNIST standard (quickstart)": (fmnist, in_memory, ["standard"], FMNIST),
        "BAPE 3 views, Fashion-MNIST": (fmnist, in_memory, ["autoaug_cutout", "simaug", "simaug"], FMNIST),
    }
    return out


def rate(inputs, load, tfs, seconds: float) -> float:
    """Items per second over about ``seconds`` of work (whole passes over a cycling input list)."""
    done, start = 0, time.perf_counter()
    while True:
        for x in inputs:
            image = load(x)
            for tf in tfs:
                tf(image)
            done += 1
            if done % 16 == 0 and time.perf_counter() - start > seconds:
                return done / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=1.5, help="timed seconds per pipeline, path and round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (median reported)")
    ap.add_argument("--gpu-rate", type=float, default=3000.0, help="images/s the GPU consumes (default 3000)")
    ap.add_argument("--only", default="", help="only pipelines whose name contains this text")
    args = ap.parse_args()
    torch.set_num_threads(1)  # what a DataLoader worker has
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ltbench-jpegs-") as tmp:
        jpegs = make_jpegs(Path(tmp), 32)
        kb = statistics.mean(p.stat().st_size for p in jpegs) / 1024
        print(f"torch {torch.__version__}, 1 thread per worker; {len(jpegs)} generated JPEGs, mean {kb:.0f} KB; "
              f"median of {args.rounds} alternating rounds of {args.seconds:g} s")
        print(f"{'pipeline':55s} {'img/s/worker':>12s} {'v2.Compose':>10s} {'speed-up':>8s} "
              f"{'workers for ' + format(args.gpu_rate, ',.0f') + ' img/s':>24s}")
        for name, (inputs, load, names, spec) in pipelines(jpegs).items():
            if args.only not in name:
                continue
            direct = [transforms.build(n, spec) for n in names]
            compose = [getattr(t, "reference", t) for t in direct]
            rates: dict[str, list[float]] = {"direct": [], "compose": []}
            for r in range(args.rounds):
                for path in ("direct", "compose") if r % 2 == 0 else ("compose", "direct"):
                    rates[path].append(rate(inputs, load, direct if path == "direct" else compose, args.seconds))
            d, c = statistics.median(rates["direct"]), statistics.median(rates["compose"])
            print(f"{name:55s} {d:12.0f} {c:10.0f} {d / c:7.2f}x {math.ceil(args.gpu_rate / d):24d}")
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
