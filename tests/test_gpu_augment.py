"""train.augment_on: batch (ltbench/data/batch_augment.py) against the per-image pipelines it replaces.

Three kinds of check, on the CPU here and on CUDA where there is one (the ``device`` parameter):
- each op given the same parameter gives torchvision's output (to one grey level);
- each random draw has the per-image pipeline's distribution: the draws of the per-image pipeline are
  recorded (its op calls patched to record and return the image) and compared with the batched trace
  by a chi-square or Kolmogorov-Smirnov test; every draw is seeded, so each test is deterministic;
- a sample's output depends on its seed only, not on the batch it is in; per-channel output means and
  stds match the per-image pipeline's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from torchvision.transforms import InterpolationMode, v2

from ltbench.results import store
from ltbench.data import batch_augment as B
from ltbench.data import transforms
from ltbench.data.base import ImageSpec
from ltbench.errors import ConfigError

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu,  # selected by `pytest -m gpu`
                                               pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")])]
RGB = ImageSpec(size=16, channels=3, mean=(0.5, 0.45, 0.4), std=(0.25, 0.25, 0.25))
GRAY = ImageSpec(size=16, channels=1, mean=(0.3,), std=(0.35,))
LARGE = ImageSpec(size=24, channels=3, mean=(0.5, 0.45, 0.4), std=(0.25, 0.25, 0.25), kind="large")
P_MIN = 1e-3  # a seeded test either passes or fails every time; this only sets how far apart counts may be


def images(n: int, channels: int, size: int = 16, device: str = "cpu", seed: int = 0) -> torch.Tensor:
    """Smooth random images (a low-resolution pattern upsampled), so crops and flips change pixel statistics."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randint(0, 256, (n, channels, 4, 4), generator=g, dtype=torch.uint8).float()
    return torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear").round().to(torch.uint8).to(device)


def images_like(n: int, spec: ImageSpec) -> torch.Tensor:
    return images(n, spec.channels, spec.size, seed=spec.channels)


def chi2_uniform(values: torch.Tensor, k: int) -> float:
    counts = np.bincount(values.cpu().numpy(), minlength=k)
    assert len(counts) == k, counts
    return stats.chisquare(counts).pvalue


def two_sample_counts(a: Counter, b: Counter) -> float:
    keys = sorted(set(a) | set(b))
    table = np.array([[a[k] for k in keys], [b[k] for k in keys]])
    return stats.chi2_contingency(table).pvalue


def test_every_per_image_pipeline_has_a_batched_one():
    assert B.BATCH_PIPELINES.names() == transforms.PIPELINES.names()
    with pytest.raises(ConfigError, match="has no batched version.*augment_on=worker"):
        B.build_batch("nope", RGB)


@pytest.mark.parametrize("device", DEVICES)
def test_sample_random_depends_on_seed_view_and_name_only(device):
    seeds = torch.arange(20000, device=device) * 7919 % 2**31
    rng = B.SampleRandom(seeds)
    u = rng.uniform("x")
    assert float(u.min()) >= 0 and float(u.max()) < 1
    assert chi2_uniform((u * 20).long(), 20) > P_MIN
    subset = B.SampleRandom(seeds[[5, 3, 19999]]).uniform("x")
    assert torch.equal(subset, u[[5, 3, 19999]])  # the same draw in any batch
    assert not torch.equal(B.SampleRandom(seeds, view=1).uniform("x"), u)
    assert float((rng.uniform("y") - u).abs().mean()) > 0.2  # another name: an unrelated stream
    assert stats.pearsonr(u.cpu().numpy(), rng.uniform("y").cpu().numpy()).statistic < 0.03
    assert chi2_uniform(rng.randint("k", 7), 7) > P_MIN


# ---- each op, same parameter: torchvision's CPU output, bit for bit ----------------------------------


def noise(n: int, channels: int, size: int = 20, device: str = "cpu", seed: int = 0) -> torch.Tensor:
    """Uniform random pixels: every value and every neighbourhood occurs, not only smooth ones."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, channels, size, size), generator=g, dtype=torch.uint8).to(device)


def policy_entries(space: dict, bins: int, size: int, keep: slice = slice(None)) -> list[tuple[str, float]]:
    """Every (op, signed magnitude) of the ``keep`` bins of a policy with this op space and bin count."""
    out = []
    for name, (fn, signed) in space.items():
        table = fn(bins, size, size)
        values = [0.0] if table is None or table.ndim == 0 else [float(v) for v in table[keep]]
        signs = {-v for v in values} if signed and table is not None else set()
        out += [(name, m) for m in sorted(set(values) | signs) if not (name == "Rotate" and m % 90 == 0 and m % 360)]
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("policy", ["autoaugment", "randaugment"])
def test_every_policy_op_at_every_magnitude_is_torchvisions_bit_for_bit(device, channels, policy, request):
    """All 14 ops at every magnitude bin and sign (AutoAugment's 10 bins; RandAugment's bin 10, the one it
    draws, and every tenth), applied through the batched op table (one warp for the geometric ops, one blend
    for the colour ops, ...), equal torchvision's kernels on the CPU exactly; 20 px images, so the warp's
    grid normalisers (2/20) are not powers of two.

    torchvision's reference grid is an MKL sgemm (``_affine_grid``'s bmm), whose kernel MKL picks from the
    CPU: its AVX-512 kernel rounds the shear ops' coordinates differently, so nearest-neighbour ties fall on
    the other pixel (measured on an AVX-512 Xeon: up to 84 of 4,800 values of ShearY differ, all other ops
    equal). Our warp restates the reproducible kernel, so the comparison runs under MKL_CBWR=COMPATIBLE
    (in a child process when the suite was not started so)."""
    if device == "cpu" and os.environ.get("MKL_CBWR") != "COMPATIBLE":
        child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                                request.node.nodeid], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                               text=True, env={**os.environ, "MKL_CBWR": "COMPATIBLE"}, timeout=600)
        assert child.returncode == 0 and "1 passed" in child.stdout, child.stdout[-3000:] + child.stderr[-2000:]
        return
    reference = v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10) if policy == "autoaugment" else v2.RandAugment()
    space, bins = reference._AUGMENTATION_SPACE, 10 if policy == "autoaugment" else 31
    entries = policy_entries(space, bins, 20, slice(None) if policy == "autoaugment" else slice(0, None, 10))
    x = noise(4, channels, device=device, seed=channels)
    table = B.op_table(("test", policy), lambda h, w: entries, list(space), (channels, 20, 20), x.device)
    every = torch.arange(len(entries), device=x.device).repeat_interleave(4)  # each entry on the 4 images
    got = B.apply_entries(x.repeat(len(entries), 1, 1, 1), every, table).cpu().view(len(entries), 4, channels, 20, 20)
    for k, (name, magnitude) in enumerate(entries):
        want = torch.stack([reference._apply_image_or_video_transform(
            image.cpu(), name, magnitude, fill=reference._fill, interpolation=InterpolationMode.NEAREST) for image in x])
        assert torch.equal(got[k], want), (name, magnitude, int((got[k].int() - want.int()).abs().max()))
    assert {name for name, _ in entries} == set(space) and len(entries) > 3 * len(space)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels", [1, 3])
def test_jitter_ops_and_grayscale_are_torchvisions_bit_for_bit(device, channels):
    x = noise(40, channels, device=device, seed=2)
    g = torch.Generator().manual_seed(2)
    kernels = [v2.functional.adjust_brightness, v2.functional.adjust_contrast, v2.functional.adjust_saturation,
               v2.functional.adjust_hue]
    for op_id, fn in B.JITTER_OPS.items():
        f = torch.rand(40, generator=g) * 0.8 + 0.6 if op_id < 3 else (torch.rand(40, generator=g) - 0.5) * 0.2
        want = torch.stack([kernels[op_id](image.cpu(), float(v)) for image, v in zip(x, f)])
        assert torch.equal(fn(x, f.to(device)).cpu(), want), kernels[op_id].__name__
    gray = B.random_grayscale(1.0)
    batch = B.Batch(x, B.SampleRandom(torch.arange(40, device=device)))
    gray(batch)
    assert torch.equal(batch.images.cpu(), torch.stack([v2.functional.rgb_to_grayscale(image.cpu(), channels)
                                                        for image in x]))


def native_uint8_resize() -> bool:
    """torchvision resizes uint8 with torch's fixed-point kernel on AVX2/AVX512/arm64 CPUs (else in float):
    the batched resize restates the former, so it is exact there and within a grey level elsewhere."""
    from torchvision.transforms.v2.functional._geometry import _do_native_uint8_resize_on_cpu

    return _do_native_uint8_resize_on_cpu(InterpolationMode.BILINEAR)


def assert_same_pixels(got: torch.Tensor, want: torch.Tensor) -> None:
    if native_uint8_resize():
        assert torch.equal(got, want), int((got.int() - want.int()).abs().max())
    else:
        assert int((got.int() - want.int()).abs().max()) <= 1


@pytest.mark.parametrize("device", DEVICES)
def test_resized_crops_are_torchvisions_antialiased_resize(device):
    """Random boxes up- and downscaled (CIFAR-size tensors; ImageNet-size lists of different sizes laid
    into one canvas), against torchvision's resized_crop with antialias=True, image by image."""
    g = torch.Generator().manual_seed(4)
    x = noise(12, 3, 16, device, seed=4)
    boxes = B.resized_crop_boxes(B.SampleRandom(torch.arange(12, device=device)), 16, 16)
    want = torch.stack([v2.functional.resized_crop(x[i].cpu(), *boxes[i].tolist(), [16, 16], antialias=True)
                        for i in range(12)])
    assert_same_pixels(B.ops.resize_boxes(x, boxes, 16, 1.0).cpu(), want)
    sizes = [(90, 80), (75, 120), (64, 64), (200, 150), (66, 300), (41, 50)]
    images = [torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8).to(device) for h, w in sizes]
    canvas, known = B.as_canvas(images)
    assert known.tolist() == [list(s) for s in sizes]
    boxes = B.resized_crop_boxes(B.SampleRandom(torch.arange(6, device=device)), *known.unbind(1))
    want = torch.stack([v2.functional.resized_crop(im.cpu(), *box.tolist(), [48, 48], antialias=True)
                        for im, box in zip(images, boxes)])
    assert_same_pixels(B.ops.resize_boxes(canvas, boxes, 48, 300 / 48).cpu(), want)
    assert (boxes[:, 2:] > 48).any() and (boxes[:, 2:] < 48).any()  # both directions were tried


def test_large_images_of_different_sizes_are_batched_as_the_per_image_pipeline():
    spec = ImageSpec(size=64, channels=3, mean=(0.5,) * 3, std=(0.25,) * 3, kind="large")
    g = torch.Generator().manual_seed(3)
    batch = [torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8) for h, w in [(90, 80), (75, 120), (64, 64)]]
    evaluated = B.build_batch("eval", spec)(batch, torch.arange(3))
    want = torch.stack([transforms.build("eval", spec)(im) for im in batch])
    assert torch.equal(evaluated, want) if native_uint8_resize() else torch.allclose(evaluated, want, atol=0.02)
    trace: dict = {}
    out = B.build_batch("imagenet_train", spec)(batch, torch.arange(3), trace=trace)
    assert out.shape == (3, 3, 64, 64) and torch.isfinite(out).all()
    assert (trace["rrc"][0][:, 2:] <= torch.tensor([[90, 80], [75, 120], [64, 64]])).all()


def test_sharpness_blurs_exactly_without_a_convolution(monkeypatch):
    """cuDNN may run a float convolution in TF32 (10-bit mantissa): a blur through conv2d can be a grey
    level off on CUDA. The batched blur is an integer sum S of a 3x3 box plus 4 x the centre, and
    round(S / 13) in float32 is exact for every S a uint8 image gives (13 is odd: no S / 13 is within
    1/26 of a half-integer), which is what torchvision's CPU convolution rounds to."""
    s = torch.arange(13 * 255 + 1, dtype=torch.float32)
    assert torch.equal((s / 13.0).round(), torch.div(2 * s + 13, 26, rounding_mode="floor"))

    def no_conv(*args, **kwargs):
        raise AssertionError("a batched pipeline convolved")

    monkeypatch.setattr(torch.nn.functional, "conv2d", no_conv)
    monkeypatch.setattr(torch, "conv2d", no_conv)
    x = noise(8, 1, 20, seed=5)
    for spec in (RGB, GRAY):
        for name in B.BATCH_PIPELINES.names():
            B.build_batch(name, spec)(noise(8, spec.channels, 16), torch.arange(8))
    table = B.op_table(("test", "sharpness"), lambda h, w: [("Sharpness", 0.9)], ["Sharpness"], (1, 20, 20), x.device)
    want = torch.stack([v2.functional.adjust_sharpness(image, 1.9) for image in x])
    assert torch.equal(B.apply_entries(x, torch.zeros(8, dtype=torch.int64), table), want)


# ---- draws: the per-image pipeline's distributions --------------------------------------------------


def record_draws(step, x: torch.Tensor, seeds: torch.Tensor) -> dict:
    trace: dict = {}
    step(B.Batch(x, B.SampleRandom(seeds), trace))
    return trace


@pytest.mark.parametrize("device", DEVICES)
def test_crop_offsets_flips_cutout_centres_and_grayscale_rates(device):
    n, seeds = 6000, torch.arange(6000, device=device)
    x = torch.zeros(n, 3, 8, 8, dtype=torch.uint8, device=device)
    crop = record_draws(B.random_crop(8, 4), x, seeds)["crop"][0]
    assert chi2_uniform(crop[:, 0], 9) > P_MIN and chi2_uniform(crop[:, 1], 9) > P_MIN  # RandomCrop: 0..2p
    flips = record_draws(B.horizontal_flip(), x, seeds)["flip"][0]
    assert stats.binomtest(int(flips.sum()), n, 0.5).pvalue > P_MIN
    centres = record_draws(B.cutout(4), x, seeds)["cutout"][0]
    assert chi2_uniform(centres[:, 0], 8) > P_MIN and chi2_uniform(centres[:, 1], 8) > P_MIN
    gray = record_draws(B.random_grayscale(0.2), x, seeds)["gray"][0]
    assert stats.binomtest(int(gray.sum()), n, 0.2).pvalue > P_MIN


def test_cutout_zeroes_the_clipped_square_of_the_per_image_cutout():
    x = torch.full((1, 1, 10, 10), 200, dtype=torch.uint8)
    for seed in range(30):
        trace: dict = {}
        batch = B.Batch(x, B.SampleRandom(torch.tensor([seed])), trace)
        B.cutout(4)(batch)
        cy, cx = (int(v) for v in trace["cutout"][0][0])
        want = torch.full((10, 10), 200, dtype=torch.uint8)
        want[max(0, cy - 2):min(10, cy + 2), max(0, cx - 2):min(10, cx + 2)] = 0
        assert torch.equal(batch.images[0, 0], want)


@pytest.mark.parametrize("device", DEVICES)
def test_resized_crop_boxes_follow_torchvision_make_params(device):
    n, h, w = 3000, 32, 24
    rrc = v2.RandomResizedCrop(16, antialias=True)
    torch.manual_seed(0)
    ref = np.array([list(rrc.make_params([torch.zeros(3, h, w)]).values())[:4] for _ in range(n)], dtype=float)
    got = B.resized_crop_boxes(B.SampleRandom(torch.arange(n, device=device)), torch.full((n,), h, device=device),
                               torch.full((n,), w, device=device)).cpu().numpy().astype(float)
    for name, f in {"area": lambda b: b[:, 2] * b[:, 3], "aspect": lambda b: b[:, 3] / b[:, 2],
                    "top": lambda b: b[:, 0] / (h - b[:, 2] + 1), "left": lambda b: b[:, 1] / (w - b[:, 3] + 1)}.items():
        assert stats.ks_2samp(f(ref), f(got)).pvalue > P_MIN, name
    assert (got[:, 2] <= h).all() and (got[:, 3] <= w).all() and (got[:, :2] >= 0).all()


def per_image_policy_calls(transform, n: int, size: int = 16) -> Counter:
    """(op, magnitude) of every op call the per-image AutoAugment / RandAugment makes on n seeded images."""
    calls: Counter = Counter()

    def record(image, transform_id, magnitude, interpolation, fill):
        calls[(transform_id, round(float(magnitude), 4))] += 1
        return image

    transform._apply_image_or_video_transform = record
    image = torch.zeros(3, size, size, dtype=torch.uint8)
    for i in range(n):
        torch.manual_seed(i)
        transforms._apply_one(transform, image)
    return calls


def batched_policy_calls(step, trace_name: str, n: int, names: list[str], size: int = 16) -> Counter:
    trace = record_draws(step, torch.zeros(n, 3, size, size, dtype=torch.uint8), torch.arange(n))
    calls: Counter = Counter()
    for ops, mags in trace[trace_name]:
        for op, m in zip(ops.tolist(), mags.tolist()):
            if op >= 0:
                calls[(names[op], round(m, 4))] += 1
    return calls


def test_autoaugment_subpolicies_ops_and_magnitudes_as_per_image():
    n = 700
    reference = v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10)
    trace = record_draws(B.autoaugment(), torch.zeros(n, 3, 16, 16, dtype=torch.uint8), torch.arange(n))
    assert chi2_uniform(trace["aa.policy"][0], len(reference._policies)) > P_MIN  # sub-policies uniform
    ours = batched_policy_calls(B.autoaugment(), "aa.op", n, list(reference._AUGMENTATION_SPACE))
    theirs = per_image_policy_calls(reference, n)
    possible = set()
    for policy in reference._policies:
        for op, _, idx in policy:
            fn, signed = reference._AUGMENTATION_SPACE[op]
            table = fn(10, 16, 16)
            m = round(float(table[idx]), 4) if table is not None else 0.0
            possible |= {(op, m), (op, -m)} if signed and table is not None else {(op, m)}
    assert set(ours) <= possible and set(theirs) <= possible and len(set(ours) & set(theirs)) > 0.9 * len(possible)
    assert two_sample_counts(ours, theirs) > P_MIN
    assert abs(sum(ours.values()) - sum(theirs.values())) < 4 * np.sqrt(sum(theirs.values()))  # apply rates


def test_randaugment_ops_and_magnitudes_as_per_image():
    n = 400
    reference = v2.RandAugment(num_ops=2, magnitude=10)
    ours = batched_policy_calls(B.randaugment(), "ra.op", n, list(reference._AUGMENTATION_SPACE))
    theirs = per_image_policy_calls(reference, n)
    assert set(ours) == set(theirs) and sum(ours.values()) == sum(theirs.values()) == 2 * n
    assert two_sample_counts(ours, theirs) > P_MIN


@pytest.mark.parametrize("device", DEVICES)
def test_colour_jitter_factors_order_and_rate(device):
    n = 2400
    reference = v2.ColorJitter(0.4, 0.4, 0.4, 0.1)
    trace = record_draws(B.color_jitter(reference, p=0.8), images(n, 3, 4, device=device), torch.arange(n, device=device))
    applied, factors = trace["jitter"][0]
    assert stats.binomtest(int(applied.sum()), n, 0.8).pvalue > P_MIN
    for values, (low, high) in zip(factors, [reference.brightness, reference.contrast, reference.saturation,
                                             reference.hue]):
        v = values.cpu().numpy()
        assert low <= v.min() and v.max() < high
        assert stats.kstest(v, stats.uniform(loc=low, scale=high - low).cdf).pvalue > P_MIN
    order = B.SampleRandom(torch.arange(n, device=device)).permutation("jitter.order", 4).cpu()
    codes = (order * torch.tensor([64, 16, 4, 1])).sum(1)  # 24 orders, each 1/24 as torch.randperm(4)
    counts = Counter(codes.tolist())
    assert len(counts) == 24 and stats.chisquare(list(counts.values())).pvalue > P_MIN


# ---- whole pipelines: batch independence, output statistics -----------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(set(transforms.PIPELINES.names()) - {"imagenet_eval"}))
def test_a_sample_is_the_same_in_any_batch(name, device):
    spec = RGB
    x, seeds = images(24, 3, device=device), torch.arange(100, 124, device=device)
    pipeline = B.build_batch(name, spec)
    whole = pipeline(x, seeds, view=2)
    order = torch.randperm(24, generator=torch.Generator().manual_seed(0)).to(device)
    assert torch.equal(pipeline(x[order], seeds[order], view=2), whole[order])
    assert torch.equal(pipeline(x[5:6], seeds[5:6], view=2), whole[5:6])
    assert whole.shape == (24, 3, 16, 16) and whole.dtype == torch.float32


@pytest.mark.parametrize("spec", [RGB, GRAY], ids=["rgb", "gray"])
@pytest.mark.parametrize("name", sorted(set(transforms.PIPELINES.names()) - {"imagenet_eval"}))
def test_output_means_and_stds_per_channel_match_the_per_image_pipeline(name, spec):
    n = 120
    x = images(n, spec.channels)
    per_image = transforms.build(name, spec)
    theirs = []
    for i in range(n):
        torch.manual_seed(i)
        theirs.append(per_image(x[i]))
    theirs = torch.stack(theirs)
    ours = B.build_batch(name, spec)(x, torch.arange(n))
    for c in range(spec.channels):
        for statistic in (lambda t: t.mean(dim=(1, 2)), lambda t: t.std(dim=(1, 2))):
            a, b = statistic(ours[:, c]).numpy(), statistic(theirs[:, c]).numpy()
            assert stats.ttest_ind(a, b, equal_var=False).pvalue > P_MIN, (name, c)
            assert stats.ks_2samp(a, b).pvalue > P_MIN, (name, c)


# ---- what a GPU pays: no host-device sync, a fixed launch count, no graph break -----------------------


def device_cost(pipelines, images, seeds):
    """Launches and syncs of the pipelines' views on an emulated CUDA device (benchmarks/devtools/gpu_cost.py),
    after a first call that puts their constants on the device (once per process)."""
    from benchmarks.devtools import gpu_cost

    with gpu_cost.counting() as c:
        on_device = ([gpu_cost.to_device(im) for im in images] if isinstance(images, list)
                     else gpu_cost.to_device(images))
        seeds = gpu_cost.to_device(seeds)
        for view, pipeline in enumerate(pipelines):
            pipeline(on_device, seeds, view=view)
        c.launches.clear(), c.syncs.clear(), c.mixups.clear()
        with c.phase("augment"):
            for view, pipeline in enumerate(pipelines):
                out = pipeline(on_device, seeds, view=view)
    assert isinstance(out, gpu_cost.OnDevice) and not c.mixups
    return c


def large_list(n: int = 4) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(6)
    return [torch.randint(0, 256, (3, 40 + 9 * i, 60 - 5 * i), generator=g, dtype=torch.uint8) for i in range(n)]


@pytest.mark.parametrize("spec", [RGB, GRAY, LARGE], ids=["rgb", "gray", "large-list"])
def test_no_batched_pipeline_syncs_the_device(spec):
    """Every batched pipeline on a batch of 6 (a list of images of different sizes for ImageNet-size data):
    not one host-device sync (.item(), bool(), nonzero, a blocking copy), whatever ops were drawn."""
    images = large_list(6) if spec is LARGE else images_like(6, spec)
    for name in B.BATCH_PIPELINES.names():
        c = device_cost([B.build_batch(name, spec)], images, torch.arange(6) * 7919)
        assert c.sync_count() == 0, (name, c.sync_sites())
        assert c.launch_count() > 0


def test_the_sync_check_catches_a_synthetic_item():
    """The check above can fail: a step that reads one value back (as a data-dependent early exit would)
    shows as one sync, with its line."""

    def early_exit(b: B.Batch) -> None:
        if float(b.images.float().mean()) > 300:  # the synthetic sync: never true, but read every batch
            b.images = b.images * 0

    pipeline = B.build_batch("simaug", RGB)
    pipeline.steps.append(B.Step(early_exit))
    c = device_cost([pipeline], images_like(6, RGB), torch.arange(6))
    (kind, _, site, count), = c.sync_sites()
    assert (kind, count) == ("value read by the host", 1) and site.startswith("tests/test_gpu_augment.py:")


def test_bape_views_launch_a_fixed_number_of_kernels_within_the_target():
    """BAPE's three CIFAR views (AutoAugment + Cutout, SimAug, SimAug) in at most 1,000 launches (issue 30's
    target for a batch of 256): the count does not depend on the batch size or on the ops drawn."""
    views = [B.build_batch(v, ImageSpec(32, 3, RGB.mean, RGB.std)) for v in ("autoaug_cutout", "simaug", "simaug")]
    counts = {n: device_cost(views, images(n, 3, 32, seed=n), torch.arange(n) + 5 * n).launch_count() for n in (2, 5)}
    assert counts[2] == counts[5] <= 1000, counts


def test_every_batched_pipeline_compiles_without_graph_breaks():
    """torch.compile(fullgraph=True) of each pipeline (dynamo's eager backend: the check is that the whole
    pipeline is one graph, i.e. no data-dependent branch, .item() or nonzero is left), and the compiled
    pipeline gives the same views."""
    torch._dynamo.reset()
    x, seeds = images(4, 3), torch.arange(4)
    cases = [(name, RGB, x) for name in B.BATCH_PIPELINES.names()] + [("imagenet_train", LARGE, large_list(3))]
    for name, spec, batch in cases:
        pipeline = B.build_batch(name, spec)
        eager = pipeline(batch, seeds[:len(batch)], view=1)
        torch._dynamo.reset()
        compiled = torch.compile(pipeline.__call__, fullgraph=True, backend="eager")
        assert torch.equal(compiled(batch, seeds[:len(batch)], view=1), eager), name


def test_train_compile_runs_the_views_compiled_in_the_run():
    """Under train.compile the run's views are the compiled pipelines (whole graphs, static shapes), after a
    first eager call that makes their constants: the same views (aot_eager: no code generation), one graph per
    pipeline and batch size; a list of ImageNet-size images stays eager."""
    from torch._dynamo.utils import counters

    from ltbench.train import engine

    eager_views = [B.build_batch(v, ImageSpec(16, 3, RGB.mean, RGB.std)) for v in ("autoaug_cutout", "simaug")]
    views = engine.compiled_views(eager_views, "aot_eager")
    torch._dynamo.reset()
    counters.clear()
    for n in (4, 4, 4, 3):  # full batches, then an epoch's smaller last batch
        x, seeds = images(n, 3, seed=n), torch.arange(n) + 7
        for v, (compiled, eager) in enumerate(zip(views, eager_views)):
            assert torch.equal(compiled(x, seeds, view=v), eager(x, seeds, view=v))
    assert counters["stats"]["unique_graphs"] == 2 * len(views)  # batch sizes 4 and 3, per pipeline
    ragged = engine.compiled_views([B.build_batch("imagenet_train", LARGE)], "aot_eager")[0]
    for _ in range(2):
        ragged(large_list(3), torch.arange(3))
    assert counters["stats"]["unique_graphs"] == 2 * len(views)


def test_reduce_overhead_is_inductor_with_cuda_graphs_and_static_shapes(monkeypatch):
    from ltbench.config import TrainConfig, from_dict
    from ltbench.train import engine

    assert from_dict(TrainConfig, {"compile": "reduce-overhead"}, "train").compile == "reduce-overhead"
    assert engine.compile_options("reduce-overhead") == ("inductor", {"mode": "reduce-overhead", "dynamic": False})
    assert engine.compile_options("inductor") == ("inductor", {})
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    views = engine.compiled_views([B.build_batch("standard", RGB)], "reduce-overhead")
    assert seen == [{"fullgraph": True, "dynamic": False, "backend": "inductor",  # views: no CUDA graph,
                     "isolate_recompiles": True}]  # and a recompile budget of their own (tests/test_recompiles.py)
    assert isinstance(views[0], B.CompiledPipeline)


# ---- the engine: augment_on is part of the run id; a batched run trains ---------------------------


def test_an_unknown_augment_on_is_refused_with_the_choices(write_recipe):
    from ltbench.recipe import load_recipe

    with pytest.raises(ConfigError, match="train.augment_on: expected one of 'worker', 'batch', got 'gpu'"):
        load_recipe(write_recipe(extra={"train": {"augment_on": "gpu"}}))


@pytest.mark.slow
def test_augment_on_batch_is_its_own_run_and_trains_every_view(tmp_path, write_recipe):
    from ltbench.run.local_pool import run_local
    from ltbench.recipe import load_recipe

    bape = {"method": {"name": "bape", "aux": {"name": "la", "tau": 1.0}}, "optim": {"epochs": 1}}
    worker = load_recipe(write_recipe("w", extra=bape)).runs[0]
    batch = load_recipe(write_recipe("b", extra={**bape, "train": {"progress": False, "augment_on": "batch"}})).runs[0]
    assert worker.run_id != batch.run_id
    assert worker.config["train"]["augment_on"] == "worker"
    run_local([batch])
    result = json.loads((Path(batch.run_dir) / store.RESULT).read_text())
    assert result["status"] == "done", result.get("error")
    assert result["config"]["train"]["augment_on"] == "batch" and len(result["views"]) == 3


@pytest.mark.slow
def test_a_batched_run_killed_mid_epoch_resumes_exactly(tmp_path, write_recipe, cli):
    """Draws depend on the sample's key seed only, so a resumed epoch replays the same views."""
    from tests.test_engine import CRASH_PLUGIN, _only_result

    (tmp_path / "crash_plugins").mkdir()
    (tmp_path / "crash_plugins" / "crash.py").write_text(CRASH_PLUGIN)
    recipe = write_recipe(extra={"plugins": ["./crash_plugins"], "method": {"name": "ce_crash_once"},
                                 "data": {"max_per_class": 60}, "optim": {"epochs": 3, "batch_size": 8},
                                 "train": {"checkpoint_minutes": 1.0e-9, "augment_on": "batch", "threads": 1}})
    reference = cli("run", recipe, "--results", tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr
    assert cli("run", recipe, env={"LTBENCH_TEST_CRASH": "1"}).returncode == -signal.SIGKILL
    resumed = cli("run", recipe)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from checkpoint: epoch 1, step 3" in resumed.stdout
    got, want = _only_result(tmp_path / "results"), _only_result(tmp_path / "reference")
    assert got["config"]["train"]["augment_on"] == "batch"
    assert got["metrics"]["per_class"] == want["metrics"]["per_class"]
