"""NVIDIA DALI's CPU backend against ltbench's ImageNet-size strong view (RandAugment), run here side by side:
whether DALI's per-sample RandAugment draws what the per-image pipeline draws, which op parameters differ,
and how fast each builds the view on one CPU thread.

Why: DALI (PyPI: nvidia-dali-cuda130) decodes on the GPU, selects RandAugment ops per sample and has
checkpointable readers, the pieces ltbench's ImageNet-size path builds itself (device_decode.py,
batch_augment.py, seeded keys). Its RNG is not torch's, so no bit-for-bit match is possible: this compares
distributions (which op, which sign, per sample) and semantics (each op's parameter at the magnitude used).

Draws: DALI's own ``apply_rand_augment`` selection runs on a suite of probe augmentations that only record
(op, sign), as many as RandAugment's and with the same sign rules; torchvision's RandAugment(2, 10) is run
image by image with its op call recorded (as tests/test_gpu_augment.py does). A chi-square contingency test
compares the (op, sign) counts.

Speed: decode + random-resized crop 224 + flip + colour jitter + RandAugment(2, 10) + normalise, from the
same generated JPEG files, one thread: ltbench per image (``augment_on: worker``), ltbench batched on the
CPU (``augment_on: batch``: decode per image, then ``batch_augment``), DALI's CPU pipeline (synchronous).

    python benchmarks/dali_randaugment.py [--draws 4000] [--seconds 2] [--rounds 3]   (needs nvidia-dali-cuda130)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torchvision.transforms import v2

from data_throughput import IMAGENET, make_jpegs

warnings.filterwarnings("ignore", category=DeprecationWarning)
NAMES = {"translate_x": "TranslateX", "translate_y": "TranslateY", "shear_x": "ShearX", "shear_y": "ShearY",
         "rotate": "Rotate", "brightness": "Brightness", "contrast": "Contrast", "color": "Color",
         "sharpness": "Sharpness", "posterize": "Posterize", "solarize": "Solarize", "equalize": "Equalize",
         "auto_contrast": "AutoContrast", "identity": "Identity"}  # DALI's op names -> torchvision's


def dali_draws(n: int, batch: int = 256) -> tuple[Counter, int]:
    """(op, sign) counts of DALI's RandAugment(2, 10) selection over n samples, and the number of distinct
    (first op, second op) pairs within one batch (1 would mean one selection per batch)."""
    from nvidia.dali import fn, pipeline_def
    from nvidia.dali.auto_aug import rand_augment
    from nvidia.dali.auto_aug.core import augmentation

    suite = rand_augment.get_rand_augment_suite(use_shape=True)
    probes = []
    for k, aug in enumerate(suite):  # op k records +-(k + 1) as one base-100 digit; signs follow DALI's rules
        probes.append(augmentation(lambda data, parameter: data * 100.0 + parameter + 50.0, mag_range=(k + 1, k + 1),
                                   randomly_negate=aug.randomly_negate, name=aug.name))

    @pipeline_def(batch_size=batch, num_threads=1, device_id=None, seed=2024, enable_conditionals=True)
    def pipe():
        data = fn.external_source(source=lambda: [np.zeros((1, 1, 1), np.float32)] * batch, batch=True)
        return rand_augment.apply_rand_augment(probes, data, n=2, m=10, num_magnitude_bins=31)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = pipe()
        p.build()
    counts, distinct = Counter(), 0
    for b in range(-(-n // batch)):
        out, = p.run()
        pairs = []
        for i in range(batch):
            code = int(round(float(np.array(out[i]).ravel()[0])))
            levels = [code // 100 - 50, code % 100 - 50]
            pairs.append(tuple(levels))
            for level in levels:
                counts[(NAMES[suite[abs(level) - 1].name], int(np.sign(level)) if suite[abs(level) - 1].randomly_negate
                        else 0)] += 1
        distinct = len(set(pairs)) if b == 0 else distinct
    return counts, distinct


def torchvision_draws(n: int) -> Counter:
    """(op, sign) counts of v2.RandAugment(2, 10) called image by image, each image seeded as the loader does."""
    reference = v2.RandAugment(num_ops=2, magnitude=10)
    signed = {name for name, (table, signed) in reference._AUGMENTATION_SPACE.items() if signed}
    counts: Counter = Counter()

    def record(image, name, magnitude, interpolation, fill):
        counts[(name, (1 if magnitude > 0 else -1) if name in signed else 0)] += 1
        return image

    reference._apply_image_or_video_transform = record
    image = torch.zeros(3, 16, 16, dtype=torch.uint8)
    for i in range(n):
        torch.manual_seed(i)
        reference(image)
    return counts


def draws_table(n: int) -> None:
    from scipy import stats

    ours, distinct = dali_draws(n)
    theirs = torchvision_draws(n)
    keys = sorted(set(ours) | set(theirs))
    p = stats.chi2_contingency(np.array([[ours[k] for k in keys], [theirs[k] for k in keys]])).pvalue
    print(f"\nRandAugment(2 ops, magnitude 10 of 31) draws, {n} samples each: (op, sign) counts")
    print(f"  {'op, sign':18s} {'DALI':>6s} {'torchvision':>11s}")
    for k in keys:
        print(f"  {k[0] + ('' if k[1] == 0 else ' +' if k[1] > 0 else ' -'):18s} {ours[k]:6d} {theirs[k]:11d}")
    print(f"  chi-square contingency p = {p:.3f} ({len(keys)} cells; same (op, sign) distribution unless p is tiny); "
          f"DALI: {distinct} distinct signed op pairs among one batch's 256 samples (selection per sample)")


def magnitude_table() -> None:
    """Each op's parameter at magnitude bin 10 of 31 on a 224x224 image, torchvision's table against DALI's
    suite, both in torchvision's units (pixels, degrees, factors 1 +- value, bits kept, grey level)."""
    from nvidia.dali.auto_aug import augmentations, rand_augment

    space = {name: make(31, 224, 224) for name, (make, _) in v2.RandAugment._AUGMENTATION_SPACE.items()}
    print("\nparameter at magnitude bin 10 of 31, 224x224 image: torchvision RandAugment | DALI rand_augment suite")
    for aug in rand_augment.get_rand_augment_suite(use_shape=True):
        name, table = NAMES[aug.name], space[NAMES[aug.name]]
        ours = float(table[10]) if table is not None and table.ndim else None
        theirs = None if aug.mag_range is None else aug.mag_range[0] + (aug.mag_range[1] - aug.mag_range[0]) * 10 / 30
        if name.startswith("Translate"):
            theirs *= 224  # DALI: a fraction of the side
        elif name == "Solarize":
            ours *= 255  # torchvision: a fraction of the largest value
        elif name == "Posterize":  # DALI: bits removed from its bin value, as a mask
            theirs = bin(int(augmentations.poster_mask_uint8(theirs))).count("1")
        show = lambda v: "-" if v is None else f"{v:.4g}"  # noqa: E731
        print(f"  {name:13s} {show(ours):>8s} | {show(theirs):>8s}")
    print("  other defaults: torchvision fills with 0 and samples nearest; DALI fills with 128 and interpolates "
          "linearly (both settable in DALI: the speed run below uses torchvision's)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draws", type=int, default=4000, help="samples per side for the draw comparison")
    ap.add_argument("--seconds", type=float, default=2.0, help="timed seconds per path and round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (median reported)")
    args = ap.parse_args()
    try:
        import nvidia.dali as dali
    except ImportError:
        print("DALI is not installed (pip install nvidia-dali-cuda130); nothing to compare")
        return 0
    torch.set_num_threads(1)
    started = time.perf_counter()
    print(f"torch {torch.__version__}, DALI {dali.__version__}, CPU only, 1 thread; load average at start "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    draws_table(args.draws)
    magnitude_table()
    with tempfile.TemporaryDirectory(prefix="ltbench-dali-") as tmp:
        speed_table(make_jpegs(Path(tmp), 32), args.seconds, args.rounds)
    print(f"({time.perf_counter() - started:.0f} s; load average at end {os.getloadavg()[0]:.1f})")
    return 0


def dali_strong_view(batch: int):
    """DALI's CPU pipeline for the strong view, with torchvision's choices where DALI has the option (fill 0,
    nearest interpolation, translation up to 150/331 of the side); a function of a list of paths."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.auto_aug import rand_augment

    pending: list[np.ndarray] = []
    mean, std = [255 * m for m in IMAGENET.mean], [255 * s for s in IMAGENET.std]

    @pipeline_def(batch_size=batch, num_threads=1, device_id=None, exec_async=False, exec_pipelined=False,
                  prefetch_queue_depth=1, seed=7, enable_conditionals=True)
    def pipe():
        data = fn.external_source(source=lambda: pending, batch=True, dtype=types.UINT8)
        images = fn.decoders.image(data, device="cpu", output_type=types.RGB)
        images = fn.random_resized_crop(images, size=(224, 224))
        images = fn.color_twist(images, brightness=fn.random.uniform(range=(0.6, 1.4)),
                                contrast=fn.random.uniform(range=(0.6, 1.4)),
                                saturation=fn.random.uniform(range=(0.6, 1.4)), hue=fn.random.uniform(range=(-36, 36)))
        images = rand_augment.rand_augment(images, n=2, m=10, num_magnitude_bins=31, shape=(224, 224),
                                           fill_value=0, interp_type=types.INTERP_NN, max_translate_rel=150 / 331)
        return fn.crop_mirror_normalize(images, mean=mean, std=std, mirror=fn.random.coin_flip(),
                                        output_layout="CHW", dtype=types.FLOAT)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = pipe()
        p.build()

    def run(paths: list[Path]) -> int:
        pending[:] = [np.fromfile(path, dtype=np.uint8) for path in paths]
        out, = p.run()
        return len(out)

    return run


def ltbench_paths(batch: int) -> dict:
    """ltbench's strong view ('randaugment') per image and batched, as functions of a list of paths."""
    from ltbench.data import batch_augment, transforms
    from ltbench.data.splitlist import FileImages

    per_image = transforms.build("randaugment", IMAGENET)
    batched = batch_augment.build_batch("randaugment", IMAGENET)

    def worker(paths: list[Path]) -> int:
        files = FileImages(paths[0].parent, [p.name for p in paths], np.zeros(len(paths), dtype=np.int64))
        for i in range(len(paths)):
            torch.random.default_generator.manual_seed(i)
            per_image(files[i][0])
        return len(paths)

    def on_batch(paths: list[Path]) -> int:
        files = FileImages(paths[0].parent, [p.name for p in paths], np.zeros(len(paths), dtype=np.int64))
        return len(batched([files[i][0] for i in range(len(paths))], torch.arange(len(paths)), view=0))

    return {"ltbench per image (worker)": worker, "ltbench batched on CPU (batch)": on_batch}


def speed_table(paths: list[Path], seconds: float, rounds: int, batch: int = 32) -> None:
    runs = {**ltbench_paths(batch), "DALI CPU pipeline": dali_strong_view(batch)}
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        for name in (list(runs) if r % 2 == 0 else list(reversed(runs))):
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                done += runs[name](paths[:batch])
            rates[name].append(done / (time.perf_counter() - start))
    base = statistics.median(rates["ltbench per image (worker)"])
    print(f"\nstrong view from {batch} ImageNet-size JPEGs (decode, RRC 224, flip, jitter, RandAugment(2, 10), normalise), "
          f"1 thread, median of {rounds} alternating rounds:")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"  {name:32s} {median:7.1f} img/s  {median / base:5.2f}x   rounds {' '.join(f'{v:.1f}' for v in values)}")


if __name__ == "__main__":
    sys.exit(main())
