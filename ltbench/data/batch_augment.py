"""The built-in augmentation pipelines applied to whole uint8 batches on the training device (``train.augment_on: batch``).

Why: ltbench's per-image path (ltbench/data/transforms.py) augments one image at a time in CPU worker
processes. Multi-view methods (BAPE's three views, PaCo, BCL) spend most of their data time there; a GPU
node has too few cores per GPU to feed them. Here each pipeline is a list of steps, each a few plain torch
ops on a batch (N, C, H, W), so the same code runs on the CPU or on CUDA.

What stays as in the per-image pipelines:
- **per sample**: every random parameter *and every operation choice* (AutoAugment's sub-policy,
  RandAugment's ops, ColorJitter's order) is drawn for each sample; ops are applied to the subgroup of the
  batch that chose them (``apply_grouped``). kornia's AutoAugment/RandAugment draw one sub-policy per
  batch and torchvision's transforms on a batch one parameter set, so neither is used (docs/performance.md).
- **the same distributions**: policies, magnitude tables and jitter ranges are read from the torchvision
  objects the per-image pipelines use; each op given the same parameter gives torchvision's output (to one
  grey level; tests/test_gpu_augment.py checks ops, draws and output statistics).
- **seeded per sample**: the draws of a sample come from a counter-based hash of its key's seed (run
  seed, epoch, index: ``SeededSamples.train_keys``), the view's position and the draw's name
  (``SampleRandom``), never from a stateful generator. So a sample's views do not depend on which
  batch it is in, on the device, or on resume.
What differs: the random numbers themselves (a batched run is not bit-identical to a worker run; it is
the same augmentation distribution), hence ``augment_on`` is part of the run id.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF
from torchvision.transforms.v2.functional._color import _hsv_to_rgb, _rgb_to_hsv

from ltbench.data.base import ImageSpec
from ltbench.data.transforms import resolve
from ltbench.errors import ConfigError
from ltbench.registry import BATCH_PIPELINES

# ------------------------------------------------------------------------------------------------
# Per-sample random numbers: a counter-based hash, the same on any device and in any batch

_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32) held in int64, without int64 overflow (split in 16-bit halves)."""
    low = (x & 0xFFFF) * c
    high = (((x >> 16) * c) & 0xFFFF) << 16
    return (low + high) & _MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (the 'lowbias32' constants of C. Wellons' hash prospector): every input
    bit flips each output bit with probability close to 1/2, so consecutive seeds give unrelated draws."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def tag_number(tag: str) -> int:
    return zlib.crc32(tag.encode())


class SampleRandom:
    """Random numbers for a batch, one independent stream per (sample seed, view, draw name).

    ``uniform('crop.top')`` gives one number per sample, a function of that sample's seed only: the same
    sample gets the same crop in a batch of 1 or of 256, on CPU or CUDA, first run or resumed. Each name
    is a fresh stream, so adding a draw never shifts the others."""

    def __init__(self, seeds: torch.Tensor, view: int = 0):
        self.seeds = mix32(seeds.to(torch.int64) ^ mix32(torch.full_like(seeds, view, dtype=torch.int64) + 0x9E3779B9))
        self.device = seeds.device

    def __len__(self) -> int:
        return len(self.seeds)

    def bits(self, tag: str) -> torch.Tensor:
        return mix32(self.seeds ^ mix32(self.seeds.new_tensor(tag_number(tag)) + 0x632BE5AB))

    def uniform(self, tag: str, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
        """float32 in [low, high): 24 random bits, as torch.rand has for float32."""
        u = (self.bits(tag) >> 8).to(torch.float32) * (1.0 / 2**24)
        return u * (high - low) + low

    def randint(self, tag: str, high) -> torch.Tensor:
        """int64 in [0, high) (``high`` a number or one per sample), from 32 random bits."""
        u = self.bits(tag).to(torch.float64) * (1.0 / 2**32)
        return (u * torch.as_tensor(high, device=self.device)).floor().to(torch.int64)

    def chance(self, tag: str, p: float) -> torch.Tensor:
        """True with probability p (per sample)."""
        return self.uniform(tag) < p

    def permutation(self, tag: str, k: int) -> torch.Tensor:
        """(N, k): a uniformly random order of range(k) per sample (argsort of k uniforms)."""
        keys = torch.stack([self.uniform(f"{tag}.{i}") for i in range(k)], dim=1)
        return keys.argsort(dim=1)


@dataclass
class Batch:
    """What a step works on: the images (uint8 (N, C, H, W), or a list of CHW tensors of different
    sizes before the first crop of large images), their random streams, and an optional trace of draws
    (tests read it to compare op frequencies with the per-image pipeline)."""

    images: torch.Tensor | list
    rng: SampleRandom
    trace: dict | None = None

    def record(self, name: str, value) -> None:
        if self.trace is not None:
            self.trace.setdefault(name, []).append(value)


Step = Callable[[Batch], None]


# ------------------------------------------------------------------------------------------------
# Pixel ops on a (sub)batch with one parameter per sample; each is torchvision's op for that parameter


def _per_sample(values: torch.Tensor) -> torch.Tensor:
    return values.to(torch.float32).view(-1, 1, 1, 1)


def blend(image1: torch.Tensor, image2: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """torchvision's _blend with a ratio per sample: ratio*a + (1-ratio)*b, clamped, truncated to uint8."""
    r = _per_sample(ratio)
    return (image1.to(torch.float32) * r + image2 * (1.0 - r)).clamp_(0, 255).to(torch.uint8)


def grayscale_float(x: torch.Tensor) -> torch.Tensor:
    """ITU-R 601 luma as torchvision weights it, floored (its uint8 rule), as float (N, 1, H, W)."""
    r, g, b = x.to(torch.float32).unbind(dim=1)
    return (r * 0.2989 + g * 0.587 + b * 0.114).floor_().unsqueeze(1)


def adjust_brightness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return (x.to(torch.float32) * _per_sample(factor)).clamp_(0, 255).to(torch.uint8)


def adjust_saturation(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return x if x.shape[1] == 1 else blend(x, grayscale_float(x), factor)


def adjust_contrast(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    gray = grayscale_float(x) if x.shape[1] == 3 else x.to(torch.float32)
    return blend(x, gray.mean(dim=(1, 2, 3), keepdim=True), factor)


def adjust_sharpness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Blend with the 3x3 smoothing kernel (1s around a 5, /13) inside a 1-pixel border, as torchvision."""
    n, c, h, w = x.shape
    if h <= 2 or w <= 2:
        return x
    kernel = torch.full((3, 3), 1.0 / 13.0, device=x.device)
    kernel[1, 1] = 5.0 / 13.0
    out = x.to(torch.float32)
    blurred = F.conv2d(out, kernel.expand(c, 1, 3, 3), groups=c).round_()
    inner = out[..., 1:-1, 1:-1]
    inner.add_((blurred - inner) * (1.0 - _per_sample(factor)))
    return out.clamp_(0, 255).to(torch.uint8)


def adjust_hue(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Shift the hue in HSV (torchvision's conversion functions, which take batches), back to uint8."""
    if x.shape[1] == 1:
        return x
    hsv = _rgb_to_hsv(x.to(torch.float32).mul_(1.0 / 255))
    h, s, v = hsv.unbind(dim=1)
    h = (h + factor.to(torch.float32).view(-1, 1, 1)).remainder_(1.0)
    rgb = _hsv_to_rgb(torch.stack((h, s, v), dim=1))
    return TF.to_dtype(rgb, torch.uint8, scale=True)


def posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    mask = (255 << (8 - bits.to(torch.int64).clamp(0, 8))) & 255
    return x & mask.to(torch.uint8).view(-1, 1, 1, 1)


def solarize(x: torch.Tensor, fraction: torch.Tensor) -> torch.Tensor:
    """Invert the pixels at or above 255 * fraction (AutoAugment's Solarize magnitude)."""
    return torch.where(x.to(torch.float32) >= _per_sample(fraction) * 255.0, 255 - x, x)


def inverse_affine(angle, translate_x, translate_y, shear_x, shear_y, center_x, center_y) -> torch.Tensor:
    """torchvision's _get_inverse_affine_matrix (scale 1) for a batch of parameters (degrees, pixels): (N, 2, 3)."""
    rot, sx, sy = torch.deg2rad(angle), torch.deg2rad(shear_x), torch.deg2rad(shear_y)
    a = torch.cos(rot - sy) / torch.cos(sy)
    b = -torch.cos(rot - sy) * torch.tan(sx) / torch.cos(sy) - torch.sin(rot)
    c = torch.sin(rot - sy) / torch.cos(sy)
    d = -torch.sin(rot - sy) * torch.tan(sx) / torch.cos(sy) + torch.cos(rot)
    m0, m1, m3, m4 = d, -b, -c, a
    m2 = m0 * (-center_x - translate_x) + m1 * (-center_y - translate_y) + center_x
    m5 = m3 * (-center_x - translate_x) + m4 * (-center_y - translate_y) + center_y
    return torch.stack([m0, m1, m2, m3, m4, m5], dim=1).view(-1, 2, 3)


def warp_nearest(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Apply inverse affine matrices (N, 2, 3) with nearest sampling and zero fill, on torchvision's pixel
    grid (its _affine_grid: centred pixel coordinates, normalised after the matrix)."""
    n, c, h, w = x.shape
    xs = torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, w, device=x.device)
    ys = torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, h, device=x.device)
    base = torch.stack([xs.expand(h, w), ys.unsqueeze(1).expand(h, w), torch.ones(h, w, device=x.device)], -1)
    scaled = theta.to(torch.float32).transpose(1, 2) / torch.tensor([0.5 * w, 0.5 * h], device=x.device)
    grid = base.view(1, h * w, 3).expand(n, -1, -1).bmm(scaled).view(n, h, w, 2)
    out = F.grid_sample(x.to(torch.float32), grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return out.round_().to(torch.uint8)


def _affine(x: torch.Tensor, *, angle=None, tx=None, ty=None, shear_x=None, shear_y=None, corner=False) -> torch.Tensor:
    n, _, h, w = x.shape
    zero = torch.zeros(n, dtype=torch.float64, device=x.device)
    pick = lambda v: zero if v is None else v.to(torch.float64)  # noqa: E731
    cx, cy = (zero - w * 0.5, zero - h * 0.5) if corner else (zero, zero)
    theta = inverse_affine(pick(angle), pick(tx), pick(ty), pick(shear_x), pick(shear_y), cx, cy)
    return warp_nearest(x, theta)


def _shear_degrees(m: torch.Tensor) -> torch.Tensor:
    return torch.rad2deg(torch.atan(m.to(torch.float64)))


# AutoAugment / RandAugment ops by torchvision's names, as its _apply_image_or_video_transform applies them
# (shears about the top-left corner by atan(magnitude), translations truncated to whole pixels, rotate by
# -angle in the affine convention, colour ops with factor 1 + magnitude).
AUTO_OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "Identity": lambda x, m: x,
    "ShearX": lambda x, m: _affine(x, shear_x=_shear_degrees(m), corner=True),
    "ShearY": lambda x, m: _affine(x, shear_y=_shear_degrees(m), corner=True),
    "TranslateX": lambda x, m: _affine(x, tx=m.trunc()),
    "TranslateY": lambda x, m: _affine(x, ty=m.trunc()),
    "Rotate": lambda x, m: _affine(x, angle=-m),
    "Brightness": lambda x, m: adjust_brightness(x, 1.0 + m),
    "Color": lambda x, m: adjust_saturation(x, 1.0 + m),
    "Contrast": lambda x, m: adjust_contrast(x, 1.0 + m),
    "Sharpness": lambda x, m: adjust_sharpness(x, 1.0 + m),
    "Posterize": lambda x, m: posterize(x, m.to(torch.int64)),
    "Solarize": lambda x, m: solarize(x, m),
    "AutoContrast": lambda x, m: TF.autocontrast_image(x),
    "Equalize": lambda x, m: TF.equalize_image(x),
    "Invert": lambda x, m: TF.invert_image(x),
}


def apply_grouped(x: torch.Tensor, op_ids: torch.Tensor, magnitudes: torch.Tensor, names: list[str]) -> torch.Tensor:
    """Apply op ``names[op_ids[i]]`` with ``magnitudes[i]`` to sample i: one call per op on its subgroup.
    An op id outside ``names`` (-1) leaves the sample as it is."""
    out = x.clone()
    for k, name in enumerate(names):
        idx = (op_ids == k).nonzero().squeeze(1)
        if idx.numel():
            out[idx] = AUTO_OPS[name](x[idx], magnitudes[idx])
    return out


# ------------------------------------------------------------------------------------------------
# Geometry: crops (per-sample boxes gathered from the batch), flips


def random_crop(size: int, padding: int) -> Step:
    """v2.RandomCrop(size, padding) with zero padding: top and left uniform in [0, H + 2p - size]."""

    def step(b: Batch) -> None:
        x = b.images
        n, _, h, w = x.shape
        top = b.rng.randint("crop.top", max(h + 2 * padding - size, 0) + 1)
        left = b.rng.randint("crop.left", max(w + 2 * padding - size, 0) + 1)
        b.record("crop", torch.stack([top, left], 1))
        windows = F.pad(x, [padding] * 4).unfold(2, size, 1).unfold(3, size, 1)  # (N, C, H', W', size, size) view
        b.images = windows[torch.arange(n, device=x.device), :, top, left]

    return step


def horizontal_flip(p: float = 0.5) -> Step:
    def step(b: Batch) -> None:
        flip = b.rng.chance("flip", p)
        b.record("flip", flip)
        b.images = torch.where(flip.view(-1, 1, 1, 1), b.images.flip(-1), b.images)

    return step


def resized_crop_boxes(rng: SampleRandom, heights: torch.Tensor, widths: torch.Tensor,
                       scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> torch.Tensor:
    """v2.RandomResizedCrop.make_params per sample: ten tries of (area fraction, log aspect), the first
    that fits is taken, else the centre crop clamped to the ratio range. Returns (N, 4): top, left, h, w."""
    heights, widths = heights.to(torch.float64), widths.to(torch.float64)
    area, log_lo, log_hi = heights * widths, math.log(ratio[0]), math.log(ratio[1])
    found = torch.zeros(len(rng), dtype=torch.bool, device=rng.device)
    box_h, box_w = torch.zeros_like(heights), torch.zeros_like(widths)
    for attempt in range(10):
        if bool(found.all()):
            break
        target = area * rng.uniform(f"rrc.scale{attempt}", *scale).to(torch.float64)
        aspect = torch.exp(rng.uniform(f"rrc.ratio{attempt}", log_lo, log_hi)).to(torch.float64)
        w, h = torch.sqrt(target * aspect).round(), torch.sqrt(target / aspect).round()
        fits = ~found & (w > 0) & (w <= widths) & (h > 0) & (h <= heights)
        box_h, box_w, found = torch.where(fits, h, box_h), torch.where(fits, w, box_w), found | fits
    in_ratio = widths / heights
    fallback_w = torch.where(in_ratio > ratio[1], (heights * ratio[1]).round(), widths)
    fallback_h = torch.where(in_ratio < ratio[0], (widths / ratio[0]).round(), heights)
    box_h, box_w = torch.where(found, box_h, fallback_h), torch.where(found, box_w, fallback_w)
    top = torch.where(found, rng.randint("rrc.top", heights - box_h + 1).to(torch.float64),
                      ((heights - box_h) / 2).floor())
    left = torch.where(found, rng.randint("rrc.left", widths - box_w + 1).to(torch.float64),
                       ((widths - box_w) / 2).floor())
    return torch.stack([top, left, box_h, box_w], 1).to(torch.int64)


def _interpolation_matrix(start: torch.Tensor, length: torch.Tensor, size: int, extent: int) -> torch.Tensor:
    """(N, size, extent): row i holds the bilinear weights (align_corners=False, source index clamped to the
    box, torch's upsampling rule) with which output row i of a resize of [start, start+length) to ``size``
    reads the input rows; the resize is then two batched matrix products."""
    dst = torch.arange(size, device=start.device, dtype=torch.float32)
    length_f = length.to(torch.float32).view(-1, 1)
    src = ((dst + 0.5) * (length_f / size) - 0.5).clamp_(min=0)
    low = src.floor()
    high = torch.minimum(low + 1, length_f - 1)
    weight_high = src - low
    base = start.view(-1, 1)
    matrix = torch.zeros(len(start), size, extent, device=start.device)
    matrix.scatter_add_(2, (base + low.to(torch.int64)).unsqueeze(2), (1.0 - weight_high).unsqueeze(2))
    matrix.scatter_add_(2, (base + high.to(torch.int64)).unsqueeze(2), weight_high.unsqueeze(2))
    return matrix


def resize_boxes_up(x: torch.Tensor, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """Crop each sample's box and resize it to size x size, bilinear, for boxes no larger than ``size``
    (upsampling, where torchvision's antialiased resize is plain bilinear): rows @ image @ columns^T."""
    n, c, h, w = x.shape
    rows = _interpolation_matrix(boxes[:, 0], boxes[:, 2], size, h)  # (N, S, H)
    cols = _interpolation_matrix(boxes[:, 1], boxes[:, 3], size, w)  # (N, S, W)
    # two large batched products instead of N*C small ones: channels ride along in the matrix width
    by_rows = rows.bmm(x.to(torch.float32).permute(0, 2, 1, 3).reshape(n, h, c * w))  # (N, S, C*W)
    out = by_rows.view(n, size * c, w).bmm(cols.transpose(1, 2)).view(n, size, c, size).permute(0, 2, 1, 3)
    return out.round_().clamp_(0, 255).to(torch.uint8).contiguous()


def _sizes(images) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(images, torch.Tensor):
        n, _, h, w = images.shape
        return torch.full((n,), h), torch.full((n,), w)
    return torch.tensor([im.shape[-2] for im in images]), torch.tensor([im.shape[-1] for im in images])


def random_resized_crop(size: int) -> Step:
    """v2.RandomResizedCrop(size, antialias=True) per sample. Boxes that need no downsampling (all of them on
    CIFAR-size images) are resized together; the others (ImageNet-size images) one by one with torchvision's
    antialiased resize, which is the per-image op itself."""

    def step(b: Batch) -> None:
        heights, widths = _sizes(b.images)
        boxes = resized_crop_boxes(b.rng, heights.to(b.rng.device), widths.to(b.rng.device))
        b.record("rrc", boxes)
        up = (boxes[:, 2] <= size) & (boxes[:, 3] <= size)
        if isinstance(b.images, torch.Tensor) and bool(up.all()):
            b.images = resize_boxes_up(b.images, boxes, size)
            return
        b.images = torch.stack([TF.resized_crop(im, *[int(v) for v in box], [size, size], antialias=True)
                                for im, box in zip(b.images, boxes.cpu())])

    return step


def resize_center_crop(resize: int, size: int) -> Step:
    """The large-image eval pipeline (deterministic): short side to ``resize``, centre crop ``size``; per image
    (sizes differ), with torchvision's own kernels."""

    def step(b: Batch) -> None:
        b.images = torch.stack([TF.center_crop(TF.resize(im, resize, antialias=True), [size, size])
                                for im in b.images])

    return step


# ------------------------------------------------------------------------------------------------
# Policies and colour: operation choices drawn per sample


def policy_tables(policies: list, space: dict, height: int, width: int, num_bins: int = 10):
    """AutoAugment's sub-policies as tensors (P, 2): op index into the op list, probability, magnitude,
    signed; read from torchvision's own policy list and magnitude table, so they match by construction."""
    names = list(space)
    ops, probs, mags, signed = [], [], [], []
    for policy in policies:
        for name, p, idx in policy:
            fn, is_signed = space[name]
            table = fn(num_bins, height, width)
            ops.append(names.index(name))
            probs.append(p)
            mags.append(float(table[idx]) if table is not None else 0.0)
            signed.append(bool(is_signed and table is not None))
    shape = (len(policies), 2)
    return (names, torch.tensor(ops).view(shape), torch.tensor(probs).view(shape),
            torch.tensor(mags).view(shape), torch.tensor(signed).view(shape))


def autoaugment(policy: v2.AutoAugmentPolicy = v2.AutoAugmentPolicy.CIFAR10) -> Step:
    """v2.AutoAugment per sample: a sub-policy drawn uniformly, each of its two ops applied with its
    probability, signed magnitudes negated with probability 1/2."""
    reference = v2.AutoAugment(policy)

    def step(b: Batch) -> None:
        x = b.images
        names, ops, probs, mags, signed = (t.to(x.device) if isinstance(t, torch.Tensor) else t for t in
                                           policy_tables(reference._policies, reference._AUGMENTATION_SPACE,
                                                         x.shape[-2], x.shape[-1]))
        chosen = b.rng.randint("aa.policy", len(reference._policies))
        b.record("aa.policy", chosen)
        for slot in range(2):
            applied = b.rng.uniform(f"aa.apply{slot}") <= probs[chosen, slot]
            negate = signed[chosen, slot] & (b.rng.uniform(f"aa.sign{slot}") <= 0.5)
            magnitude = torch.where(negate, -mags[chosen, slot], mags[chosen, slot])
            op = torch.where(applied, ops[chosen, slot], torch.full_like(chosen, -1))
            b.record("aa.op", (op, magnitude))
            x = apply_grouped(x, op, magnitude, names)
        b.images = x

    return step


def randaugment(num_ops: int = 2, magnitude: int = 10, num_bins: int = 31) -> Step:
    """v2.RandAugment per sample: each of ``num_ops`` ops drawn uniformly from its op table (Identity
    included), at the fixed magnitude bin, sign drawn for signed ops."""
    space = v2.RandAugment._AUGMENTATION_SPACE
    names = list(space)

    def step(b: Batch) -> None:
        x = b.images
        table = torch.tensor([float(fn(num_bins, x.shape[-2], x.shape[-1])[magnitude])
                              if fn(num_bins, x.shape[-2], x.shape[-1]) is not None else 0.0
                              for fn, _ in space.values()], device=x.device)
        signed = torch.tensor([s for _, s in space.values()], device=x.device)
        for slot in range(num_ops):
            op = b.rng.randint(f"ra.op{slot}", len(names))
            negate = signed[op] & (b.rng.uniform(f"ra.sign{slot}") <= 0.5)
            mag = torch.where(negate, -table[op], table[op])
            b.record("ra.op", (op, mag))
            x = apply_grouped(x, op, mag, names)
        b.images = x

    return step


_JITTER_OPS = {0: adjust_brightness, 1: adjust_contrast, 2: adjust_saturation, 3: adjust_hue}


def color_jitter(reference: v2.ColorJitter, p: float = 1.0) -> Step:
    """v2.ColorJitter (inside RandomApply(p)) per sample: the four factors uniform in the reference's
    ranges and applied in a random order drawn per sample (pass k applies each sample's k-th op)."""
    ranges = [reference.brightness, reference.contrast, reference.saturation, reference.hue]

    def step(b: Batch) -> None:
        x = b.images
        applied = b.rng.chance("jitter.apply", p) if p < 1.0 else torch.ones(len(x), dtype=torch.bool, device=x.device)
        order = b.rng.permutation("jitter.order", 4)
        factors = [None if r is None else b.rng.uniform(f"jitter.f{k}", float(r[0]), float(r[1]))
                   for k, r in enumerate(ranges)]
        b.record("jitter", (applied, factors))
        for k in range(4):
            for op_id, fn in _JITTER_OPS.items():
                if factors[op_id] is None:
                    continue
                idx = ((order[:, k] == op_id) & applied).nonzero().squeeze(1)
                if idx.numel():
                    x = x.clone() if x is b.images else x
                    x[idx] = fn(x[idx], factors[op_id][idx])
        b.images = x

    return step


def random_grayscale(p: float = 0.2) -> Step:
    def step(b: Batch) -> None:
        gray = b.rng.chance("gray", p)
        b.record("gray", gray)
        luma = TF.rgb_to_grayscale_image(b.images, num_output_channels=3)
        b.images = torch.where(gray.view(-1, 1, 1, 1), luma, b.images)

    return step


def cutout(length: int) -> Step:
    """Cutout (DeVries & Taylor 2017) as ltbench's per-image Cutout: centre uniform over the image, the
    square [c - L//2, c + L//2) clipped at the borders, zeroed (zero in uint8 is zero in [0, 1])."""

    def step(b: Batch) -> None:
        x = b.images
        n, _, h, w = x.shape
        cy, cx = b.rng.randint("cutout.y", h), b.rng.randint("cutout.x", w)
        b.record("cutout", torch.stack([cy, cx], 1))
        ys = torch.arange(h, device=x.device).view(1, h, 1)
        xs = torch.arange(w, device=x.device).view(1, 1, w)
        half = length // 2
        inside = ((ys >= (cy - half).view(-1, 1, 1)) & (ys < (cy + half).view(-1, 1, 1))
                  & (xs >= (cx - half).view(-1, 1, 1)) & (xs < (cx + half).view(-1, 1, 1)))
        b.images = x * (~inside).unsqueeze(1).to(x.dtype)

    return step


# ------------------------------------------------------------------------------------------------
# Pipelines: the batch counterparts of transforms.PIPELINES, under the same names


class BatchPipeline:
    """Steps on a uint8 batch, then uint8 -> float in [0, 1] -> normalised, as ToDtype + Normalize."""

    def __init__(self, steps: list[Step], spec: ImageSpec):
        self.steps, self.spec = steps, spec

    def __call__(self, images, seeds: torch.Tensor, view: int = 0, trace: dict | None = None) -> torch.Tensor:
        """``images``: uint8 (N, C, H, W) (or a list of CHW tensors for large images) on the device that
        trains; ``seeds``: each sample's seed (int64, N); ``view``: the view's position (its own streams)."""
        device = images.device if isinstance(images, torch.Tensor) else images[0].device
        batch = Batch(images, SampleRandom(seeds.to(device), view), trace)
        for step in self.steps:
            step(batch)
        mean = torch.as_tensor(self.spec.mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        std = torch.as_tensor(self.spec.std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        return batch.images.to(torch.float32).mul_(1.0 / 255).sub_(mean).div_(std)


batch_pipeline = BATCH_PIPELINES.register  # @batch_pipeline("name"): ImageSpec -> BatchPipeline; no name twice


def _crop_steps(spec: ImageSpec) -> list[Step]:
    return [random_resized_crop(spec.size)] if spec.kind == "large" else [random_crop(spec.size, 4)]


def _color_steps(spec: ImageSpec, p: float = 0.8) -> list[Step]:
    """transforms._color: ColorJitter(0.4, 0.4[, 0.4, 0.1]) with p, grayscale p=0.2 for colour images."""
    if spec.channels == 1:
        return [color_jitter(v2.ColorJitter(0.4, 0.4), p)]
    return [color_jitter(v2.ColorJitter(0.4, 0.4, 0.4, 0.1), p), random_grayscale(0.2)]


@batch_pipeline("eval")
def eval_batch(spec: ImageSpec) -> BatchPipeline:
    if spec.kind == "large":
        return BatchPipeline([resize_center_crop(int(round(spec.size * 256 / 224)), spec.size)], spec)
    return BatchPipeline([], spec)


@batch_pipeline("standard")
def standard_batch(spec: ImageSpec) -> BatchPipeline:
    return BatchPipeline(_crop_steps(spec) + [horizontal_flip()], spec)


@batch_pipeline("autoaug_cutout")
def autoaug_cutout_batch(spec: ImageSpec) -> BatchPipeline:
    cut = max(1, round(16 * spec.size / 32))
    return BatchPipeline(_crop_steps(spec) + [horizontal_flip(), autoaugment(), cutout(cut)], spec)


@batch_pipeline("randaugment")
def randaugment_batch(spec: ImageSpec) -> BatchPipeline:
    return BatchPipeline(_crop_steps(spec) + [horizontal_flip()] + _color_steps(spec, p=1.0)[:1] + [randaugment()],
                         spec)


@batch_pipeline("simaug")
def simaug_batch(spec: ImageSpec) -> BatchPipeline:
    return BatchPipeline([random_resized_crop(spec.size), horizontal_flip()] + _color_steps(spec), spec)


@batch_pipeline("imagenet_train")
def imagenet_train_batch(spec: ImageSpec) -> BatchPipeline:
    jitter = [color_jitter(v2.ColorJitter(0.4, 0.4, 0.4, 0.0))] if spec.channels == 3 else []
    return BatchPipeline([random_resized_crop(spec.size), horizontal_flip()] + jitter, spec)


@batch_pipeline("imagenet_eval")
def imagenet_eval_batch(spec: ImageSpec) -> BatchPipeline:
    return eval_batch(ImageSpec(spec.size, spec.channels, spec.mean, spec.std, kind="large"))


def build_batch(name: str, spec: ImageSpec, aliases: dict[str, str] | None = None) -> BatchPipeline:
    """The batch pipeline for a view name (or alias), as transforms.build gives the per-image one."""
    concrete = resolve(name, aliases or {})
    if concrete not in BATCH_PIPELINES:
        raise ConfigError(f"train.augment_on: batch: the augmentation pipeline '{concrete}' (view '{name}') has no "
                          f"batched version; batched pipelines: {', '.join(BATCH_PIPELINES.names())}; "
                          f"fix: train.augment_on=worker")
    return BATCH_PIPELINES.get(concrete)(spec)


def as_uint8_tensor(image) -> torch.Tensor:
    """What the loader hands over with augment_on: batch: the decoded image as a uint8 CHW tensor."""
    if isinstance(image, torch.Tensor):
        return image
    return TF.pil_to_tensor(image)
