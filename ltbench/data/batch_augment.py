"""The built-in augmentation pipelines applied to whole uint8 batches on the training device (``train.augment_on: batch``).

Why: ltbench's per-image path (ltbench/data/transforms.py) augments one image at a time in CPU worker
processes. Multi-view methods (BAPE's three views, PaCo, BCL) spend most of their data time there; a GPU
node has too few cores per GPU to feed them. Here each pipeline is a list of steps, each a few plain torch
ops on a batch (N, C, H, W), so the same code runs on the CPU or on CUDA.

What stays as in the per-image pipelines:
- **per sample**: every random parameter *and every operation choice* (AutoAugment's sub-policy,
  RandAugment's ops, ColorJitter's order) is drawn for each sample. kornia's AutoAugment/RandAugment draw one
  sub-policy per batch and torchvision's transforms on a batch one parameter set, so neither is used
  (docs/performance.md).
- **the same distributions**: policies, magnitude tables and jitter ranges are read from the torchvision
  objects the per-image pipelines use, and each op given the same parameter gives torchvision's CPU output
  bit for bit (ltbench/data/batch_ops.py says how; tests/test_gpu_augment.py checks ops, draws and output
  statistics).
- **seeded per sample**: the draws of a sample come from a counter-based hash of its key's seed (run
  seed, epoch, index: ``SeededSamples.train_keys``), the view's position and the draw's name
  (``SampleRandom``), never from a stateful generator. So a sample's views do not depend on which
  batch it is in, on the device, or on resume.
What differs: the random numbers themselves (a batched run is not bit-identical to a worker run; it is
the same augmentation distribution), hence ``augment_on`` is part of the run id.

What a GPU pays (benchmarks/gpu_launches.py counts it): a view costs a fixed number of kernel launches and no
host-device sync. All of a view's draws come from one hash call over a table of precomputed tag keys; every
op is computed on the whole batch and chosen per sample with ``torch.where`` (one warp for all geometric
ops of a policy slot, one blend for its colour ops); resized-crop tries are drawn at once; no branch depends
on the data; constants live on the device (``batch_ops.device_constant``). So a pipeline also compiles
with ``torch.compile(fullgraph=True)`` (``CompiledPipeline``).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ltbench.data import batch_ops as ops
from ltbench.data.base import ImageSpec
from ltbench.data.batch_ops import device_constant, per_sample
from ltbench.data.transforms import resolve, torchvision_v2
from ltbench.errors import ConfigError
from ltbench.registry import BATCH_PIPELINES

# ------------------------------------------------------------------------------------------------
# Per-sample random numbers: a counter-based hash, the same on any device and in any batch

_MASK32 = 0xFFFFFFFF
_MIX_CONSTANTS = (0x7FEB352D, 0x846CA68B)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32) held in int64, never overflowing int64 (its overflow is
    undefined in C++): a constant c >= 2**31 is used as c - 2**32, which has the same residue and keeps
    |x * c| below 2**63; ``& (2**32 - 1)`` takes the residue of a negative product too (two's complement)."""
    return (x * (c - 2**32 if c >= 2**31 else c)) & _MASK32


def mix32(x: torch.Tensor, masked: bool = False) -> torch.Tensor:
    """A 32-bit integer finaliser (the 'lowbias32' constants of C. Wellons' hash prospector): every input
    bit flips each output bit with probability close to 1/2, so consecutive seeds give unrelated draws.
    ``masked``: x is already in [0, 2**32)."""
    x = x if masked else x & _MASK32
    x = x ^ (x >> 16)
    x = _mul32(x, _MIX_CONSTANTS[0])
    x = x ^ (x >> 15)
    x = _mul32(x, _MIX_CONSTANTS[1])
    return x ^ (x >> 16)


def mix32_int(x: int) -> int:
    """:func:`mix32` of one Python integer (keys of tags and views are made on the host)."""
    x &= _MASK32
    x ^= x >> 16
    x = (x * _MIX_CONSTANTS[0]) & _MASK32
    x ^= x >> 15
    x = (x * _MIX_CONSTANTS[1]) & _MASK32
    return x ^ (x >> 16)


def tag_number(tag: str) -> int:
    return zlib.crc32(tag.encode())


def tag_key(tag: str) -> int:
    """What a draw's name contributes to the hash: mix32(crc32(tag) + a constant), made on the host."""
    return mix32_int(tag_number(tag) + 0x632BE5AB)


class SampleRandom:
    """Random numbers for a batch, one independent stream per (sample seed, view, draw name).

    ``uniform(('crop.top',))`` gives one number per sample, a function of that sample's seed only: the same
    sample gets the same crop in a batch of 1 or of 256, on CPU or CUDA, first run or resumed. Each name
    is a fresh stream, so adding a draw never shifts the others. The draws named in ``tags`` (a pipeline's
    whole list) are made at once, in one hash over an (N, K) table; a name outside it is hashed when asked."""

    def __init__(self, seeds: torch.Tensor, view: int = 0, tags: tuple[str, ...] = ()):
        self.device = seeds.device
        self.raw, self.view = seeds, view
        self._seeds: torch.Tensor | None = None
        self.tags = tuple(tags)
        self.column = {tag: k for k, tag in enumerate(self.tags)}
        self.table = self._hash(self.tags) if self.tags else None

    @property
    def seeds(self) -> torch.Tensor:
        """Each sample's stream seed for this view (hashed when first needed: a pipeline with no draws pays
        nothing)."""
        if self._seeds is None:
            self._seeds = mix32(self.raw.to(torch.int64) ^ mix32_int(self.view + 0x9E3779B9))
        return self._seeds

    def __len__(self) -> int:
        return len(self.raw)

    def _hash(self, tags: tuple[str, ...]) -> torch.Tensor:
        keys = device_constant(("tag keys", tags), self.device,
                               lambda: torch.tensor([tag_key(t) for t in tags], dtype=torch.int64))
        return mix32(self.seeds.unsqueeze(1) ^ keys, masked=True)

    def block(self, tags: tuple[str, ...]) -> torch.Tensor:
        """(N, len(tags)) 32-bit draws: a slice of the table when the tags are in it, in this order."""
        start = self.column.get(tags[0]) if self.table is not None else None
        if start is not None and self.tags[start:start + len(tags)] == tuple(tags):
            return self.table[:, start:start + len(tags)]
        return self._hash(tuple(tags))

    def bits(self, tag: str) -> torch.Tensor:
        return self.block((tag,))[:, 0]

    def uniform(self, tags, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
        """float32 in [low, high): 24 random bits, as torch.rand has for float32 ((N,) for one tag name,
        (N, K) for a tuple of names)."""
        bits = self.bits(tags) if isinstance(tags, str) else self.block(tags)
        u = (bits >> 8).to(torch.float32) * (1.0 / 2**24)
        return u if (low, high) == (0.0, 1.0) else u * (high - low) + low

    def randint(self, tags, high) -> torch.Tensor:
        """int64 in [0, high) (``high`` a number or one per sample), from 32 random bits."""
        bits = self.bits(tags) if isinstance(tags, str) else self.block(tags)
        return (bits.to(torch.float64) * (1.0 / 2**32) * high).floor_().to(torch.int64)

    def chance(self, tag: str, p: float) -> torch.Tensor:
        """True with probability p (per sample): ``uniform(tag) < p`` decided on the bits themselves."""
        return self.bits(tag) < below_threshold(p)

    def permutation(self, tag: str, k: int) -> torch.Tensor:
        """(N, k): a uniformly random order of range(k) per sample (a stable argsort of k uniforms, done on
        their 24 bits)."""
        return (self.block(permutation_tags(tag, k)) >> 8).sort(dim=1, stable=True).indices


def below_threshold(p: float, inclusive: bool = False) -> int:
    """t such that ``bits < t`` is ``u < p`` (or ``u <= p``) for u = (bits >> 8) / 2**24 compared in float32, as
    a float32 tensor compares with a Python float: u = k / 2**24 < float32(p) iff k < ceil(float32(p) * 2**24)."""
    scaled = float(torch.tensor(p, dtype=torch.float32)) * 2**24
    return (math.floor(scaled) + 1 if inclusive else math.ceil(scaled)) * 256


def permutation_tags(tag: str, k: int) -> tuple[str, ...]:
    return tuple(f"{tag}.{i}" for i in range(k))


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


@dataclass(frozen=True)
class Step:
    """One step of a pipeline and the names of its draws (the pipeline hashes all of them at once)."""

    run: Callable[[Batch], None]
    tags: tuple[str, ...] = ()

    def __call__(self, batch: Batch) -> None:
        self.run(batch)


# ------------------------------------------------------------------------------------------------
# Geometry: crops (per-sample boxes gathered from the batch), flips


def random_crop(size: int, padding: int) -> Step:
    """v2.RandomCrop(size, padding) with zero padding: top and left uniform in [0, H + 2p - size]."""
    tags = ("crop.top", "crop.left")

    def step(b: Batch) -> None:
        x = b.images
        n, _, h, w = x.shape
        ranges = [max(h + 2 * padding - size, 0) + 1, max(w + 2 * padding - size, 0) + 1]
        corner = b.rng.randint(tags, device_constant(("crop ranges", *ranges), x.device,
                                                     lambda: torch.tensor(ranges, dtype=torch.float64)))
        b.record("crop", corner)
        windows = F.pad(x, [padding] * 4).unfold(2, size, 1).unfold(3, size, 1)  # (N, C, H', W', size, size) view
        b.images = windows[torch.arange(n, device=x.device), :, corner[:, 0], corner[:, 1]]

    return Step(step, tags)


def horizontal_flip(p: float = 0.5) -> Step:
    """v2.RandomHorizontalFlip(p) per sample."""

    def step(b: Batch) -> None:
        flip = b.rng.chance("flip", p)
        b.record("flip", flip)
        b.images = torch.where(per_sample(flip), b.images.flip(-1), b.images)

    return Step(step, ("flip",))


RRC_TAGS = (tuple(f"rrc.scale{i}" for i in range(10)) + tuple(f"rrc.ratio{i}" for i in range(10))
            + ("rrc.top", "rrc.left"))


def resized_crop_boxes(rng: SampleRandom, heights, widths, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> torch.Tensor:
    """v2.RandomResizedCrop.make_params per sample: ten tries of (area fraction, log aspect), all drawn at
    once, the first that fits taken, else the centre crop clamped to the ratio range. ``heights``/``widths``:
    Python ints (a tensor batch) or int64 tensors (N,) (a list of sizes). Returns (N, 4): top, left, h, w."""
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    ranges = device_constant(("rrc ranges", scale, ratio), rng.device, lambda: torch.tensor(
        [[scale[1] - scale[0]] * 10 + [log_ratio[1] - log_ratio[0]] * 10, [scale[0]] * 10 + [log_ratio[0]] * 10],
        dtype=torch.float32))
    tries = (rng.uniform(RRC_TAGS[:20]) * ranges[0] + ranges[1]).to(torch.float64)
    static = isinstance(heights, int)
    hs, ws = (heights, widths) if static else (heights.to(torch.float64).unsqueeze(1),
                                               widths.to(torch.float64).unsqueeze(1))
    target, aspect = hs * ws * tries[:, :10], torch.exp(tries[:, 10:])  # math.exp of the float draw, as there
    w, h = torch.sqrt(target * aspect).round_(), torch.sqrt(target / aspect).round_()
    fits = (w.clamp(1, ws) == w) & (h.clamp(1, hs) == h) if static else (w > 0) & (w <= ws) & (h > 0) & (h <= hs)
    first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)  # the first try that fits (or 0 when none does)
    box = torch.stack([h, w], 1).gather(2, first.unsqueeze(1).expand(-1, 2, 1)).squeeze(2)
    fallback, corner = _fallback_box(hs, ws, ratio, rng.device)
    found = fits.any(dim=1, keepdim=True)
    box = torch.where(found, box, fallback)
    size = device_constant(("rrc size", heights, widths), rng.device, lambda: torch.tensor(
        [heights, widths], dtype=torch.float64)) if static else torch.cat([hs, ws], 1)
    room = size - box
    top_left = torch.where(found, rng.randint(RRC_TAGS[20:], room + 1).to(torch.float64), corner)
    return torch.cat([top_left, box], 1).to(torch.int64)


def _fallback_box(heights, widths, ratio, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """torchvision's fallback: the whole image, clamped to the aspect range, centred ((N|1, 2) box and
    corner, float64); made on the host when the sizes are Python ints."""
    if isinstance(heights, int):
        in_ratio = widths / heights
        w = round(heights * ratio[1]) if in_ratio > ratio[1] else widths
        h = round(widths / ratio[0]) if in_ratio < ratio[0] else heights
        both = device_constant(("rrc fallback", heights, widths, ratio), device, lambda: torch.tensor(
            [[h, w], [(heights - h) // 2, (widths - w) // 2]], dtype=torch.float64))
        return both[0:1], both[1:2]
    in_ratio = widths / heights
    w = torch.where(in_ratio > ratio[1], (heights * ratio[1]).round(), widths)
    h = torch.where(in_ratio < ratio[0], (widths / ratio[0]).round(), heights)
    box = torch.cat([h, w], 1)
    return box, ((torch.cat([heights, widths], 1) - box) / 2).floor_()


def as_canvas(images) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A batch as one uint8 tensor (N, C, H, W) and, for a list of images of different sizes, their sizes
    (N, 2) on the device (None for a tensor: every sample is H x W).

    A list is laid into the top-left corners of a Hmax x Wmax canvas with one concatenation and one gather
    (a sliding-window view over the concatenated pixels), not one copy per image; the sizes travel in one
    non-blocking copy. What lies right of or below an image is never read by the resize."""
    if isinstance(images, torch.Tensor):
        return images, None
    device, channels = images[0].device, images[0].shape[0]
    sizes = [tuple(im.shape[-2:]) for im in images]
    hmax, wmax = max(h for h, _ in sizes), max(w for _, w in sizes)
    offsets = [0]
    for h, w in sizes[:-1]:
        offsets.append(offsets[-1] + channels * h * w)
    meta = host_to_device([[o, h, w] for o, (h, w) in zip(offsets, sizes)], device)
    flat = torch.cat([im.reshape(-1) for im in images] + [images[0].new_zeros(wmax)])
    windows = flat.as_strided((flat.numel() - wmax + 1, wmax), (1, 1))
    offset, height, width = (v.view(-1, 1, 1) for v in meta.unbind(1))
    rows = torch.minimum(torch.arange(hmax, device=device).view(1, 1, hmax), height - 1)
    start = offset + torch.arange(channels, device=device).view(1, -1, 1) * (height * width) + rows * width
    return windows[start], meta[:, 1:]


def host_to_device(rows: list, device: torch.device) -> torch.Tensor:
    """Host numbers (int64) on the device without a sync: from pinned memory, non-blocking, on CUDA."""
    table = torch.tensor(rows, dtype=torch.int64)
    if device.type == "cuda":
        table = table.pin_memory()
    return table.to(device, non_blocking=True)


def random_resized_crop(size: int, scale: tuple[float, float] = (0.08, 1.0)) -> Step:
    """v2.RandomResizedCrop(size, scale, antialias=True) per sample: the boxes drawn at once, then one batched
    antialiased resize (``batch_ops.resize_boxes``: torch's uint8 CPU kernel, so torchvision's output bit for
    bit), for CIFAR-size tensors and for lists of ImageNet-size images alike."""

    def step(b: Batch) -> None:
        canvas, sizes = as_canvas(b.images)
        _, _, h, w = canvas.shape
        boxes = resized_crop_boxes(b.rng, h, w, scale) if sizes is None else \
            resized_crop_boxes(b.rng, *sizes.unbind(1), scale)
        b.record("rrc", boxes)
        b.images = ops.resize_boxes(canvas, boxes, size, max(h, w) / size)

    return Step(step, RRC_TAGS)


def resize_center_crop(resize: int, size: int) -> Step:
    """The large-image eval pipeline (deterministic): short side to ``resize`` (antialiased), centre crop
    ``size``, as v2.Resize + v2.CenterCrop, batched: only the kept outputs of each resize are computed."""

    def step(b: Batch) -> None:
        canvas, _ = as_canvas(b.images)
        shapes = [tuple(canvas.shape[-2:])] * len(canvas) if canvas is b.images else [im.shape[-2:] for im in b.images]
        plan = [_resize_crop_plan(h, w, resize, size) for h, w in shapes]
        geometry = host_to_device([[0, 0, h, w, *p[:4]] for (h, w), p in zip(shapes, plan)], canvas.device)
        crop = (geometry[:, 4:6].to(torch.float64), geometry[:, 6:8], max(max(p[:2]) for p in plan))
        b.images = ops.resize_boxes(canvas, geometry[:, :4], size, max(p[4] for p in plan), crop)

    return Step(step)


def _resize_crop_plan(h: int, w: int, resize: int, size: int) -> tuple[int, int, int, int, float]:
    """torchvision's resized size (new_h, new_w), centre-crop corner (top, left) and the larger scale."""
    geometry = torchvision_v2().functional._geometry
    _compute_resized_output_size, _center_crop_compute_crop_anchor = \
        geometry._compute_resized_output_size, geometry._center_crop_compute_crop_anchor
    new_h, new_w = _compute_resized_output_size((h, w), size=[resize], max_size=None)
    if new_h < size or new_w < size:
        raise ValueError(f"resize_center_crop: a {h}x{w} image resized to {new_h}x{new_w} is smaller than {size}")
    top, left = _center_crop_compute_crop_anchor(size, size, new_h, new_w)
    return new_h, new_w, top, left, max(h / new_h, w / new_w)


# ------------------------------------------------------------------------------------------------
# Policies (AutoAugment, RandAugment): each (op, magnitude, sign) an entry of a host-made table

# what an entry does; columns of the float table: ratio, luma weight, mean weight, sharpness alpha,
# solarize threshold, then the warp's six numbers
NONE, WARP, BLEND, SHARP, BITWISE, AUTOCONTRAST, EQUALIZE = range(7)
_IDENTITY_ROW = [1.0, 0.0, 0.0, 0.0, 256.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]


def op_entry(name: str, magnitude: float, height: int, width: int, channels: int) -> tuple[int, int, list[float]]:
    """(kind, posterize mask, float row) of torchvision's AutoAugment/RandAugment op ``name`` at
    ``magnitude`` (a Python float, as _apply_image_or_video_transform receives it), with the numbers its
    kernels see: a ratio is float(1 + m) cast to float32, and 1 - ratio is formed in float64 (= -m)."""
    row = list(_IDENTITY_ROW)
    if name == "Identity" or (name == "Rotate" and magnitude % 360 == 0) or (name == "Color" and channels == 1):
        return NONE, 255, row  # rotate(0) is a copy; adjust_saturation leaves grey images as they are
    geometric = _geometric_matrix(name, magnitude, height, width)
    if geometric is not None:
        row[5:] = ops.affine_theta(geometric, height, width)
        return WARP, 255, row
    ratio = 1.0 + magnitude
    if name in ("Brightness", "Color", "Contrast"):
        row[0] = ratio
        if name != "Brightness":
            row[1 if name == "Color" else 2] = 1.0 - ratio
        return BLEND, 255, row
    if name == "Sharpness":
        row[3] = 1.0 - ratio
        return SHARP, 255, row
    if name == "Posterize":
        bits = int(magnitude)
        return BITWISE, (((1 << bits) - 1) << (8 - bits)) if bits < 8 else 255, row
    if name in ("Solarize", "Invert"):
        row[4] = 255.0 * magnitude if name == "Solarize" else 0.0
        return BITWISE, 255, row
    return {"AutoContrast": AUTOCONTRAST, "Equalize": EQUALIZE}[name], 255, row


def _geometric_matrix(name: str, magnitude: float, height: int, width: int) -> list[float] | None:
    """The inverse affine matrix torchvision's geometric op builds (its own _get_inverse_affine_matrix, the
    arguments as AutoAugment's _apply_image_or_video_transform passes them), or None for other ops."""
    _get_inverse_affine_matrix = torchvision_v2().functional._geometry._get_inverse_affine_matrix
    corner = [-width * 0.5, -height * 0.5]  # affine's centre=[0, 0], relative to the image centre
    if name in ("ShearX", "ShearY"):
        shear = math.degrees(math.atan(magnitude))
        return _get_inverse_affine_matrix(corner, 0.0, [0.0, 0.0], 1.0,
                                          [shear, 0.0] if name == "ShearX" else [0.0, shear])
    if name in ("TranslateX", "TranslateY"):
        shift = [float(int(magnitude)), 0.0] if name == "TranslateX" else [0.0, float(int(magnitude))]
        return _get_inverse_affine_matrix([0.0, 0.0], 0.0, shift, 1.0, [0.0, 0.0])
    if name == "Rotate":
        angle = magnitude % 360
        if angle in (90, 180, 270):
            raise ValueError("Rotate by a multiple of 90 degrees takes torchvision's rot90 path, not restated here")
        return _get_inverse_affine_matrix([0.0, 0.0], -angle, [0.0, 0.0], 1.0, [0.0, 0.0])
    return None


@dataclass(frozen=True)
class OpTable:
    """A policy's entries on the device: flags (E, 5) (warp, sharpness, blend or sharpness, autocontrast,
    equalize), posterize mask (E,), float row (E, 11); for traces the op's index in the policy's op list (-1:
    none) and its signed magnitude. The last entry does nothing."""

    flags: torch.Tensor
    masks: torch.Tensor
    rows: torch.Tensor
    op_index: torch.Tensor
    magnitudes: torch.Tensor

    @property
    def none(self) -> int:
        return len(self.masks) - 1


_TABLES: dict = {}


def op_table(key: tuple, make_entries: Callable[[int, int], list[tuple[str, float]]], names: list[str],
             shape: tuple[int, int, int], device: torch.device) -> OpTable:
    """A policy's entries ``(op name, signed magnitude)`` (``make_entries(height, width)``) for images of
    ``shape`` (C, H, W): made on the host on first use and kept on ``device`` (so a compiled pipeline only
    looks them up)."""
    cached = _TABLES.get((key, shape, device))
    if cached is not None:
        return cached
    channels, height, width = shape
    entries = make_entries(height, width)
    built = [op_entry(name, m, height, width, channels) for name, m in entries] + [(NONE, 255, _IDENTITY_ROW)]
    flags = [[k == WARP, k == SHARP, k in (BLEND, SHARP), k == AUTOCONTRAST, k == EQUALIZE] for k, _, _ in built]
    table = OpTable(flags=torch.tensor(flags, dtype=torch.bool),
                    masks=torch.tensor([m for _, m, _ in built], dtype=torch.uint8),
                    rows=torch.tensor([r for _, _, r in built], dtype=torch.float32),
                    op_index=torch.tensor([names.index(name) for name, _ in entries] + [-1]),
                    magnitudes=torch.tensor([m for _, m in entries] + [0.0], dtype=torch.float32))
    table = OpTable(**{f: getattr(table, f).to(device) for f in ("flags", "masks", "rows", "op_index", "magnitudes")})
    _TABLES[(key, shape, device)] = table
    return table


def apply_entries(x: torch.Tensor, entry: torch.Tensor, table: OpTable) -> torch.Tensor:
    """Sample i gets table entry ``entry[i]``. On a GPU every op family runs on the whole batch and
    ``torch.where`` picks (one warp for all geometric ops, one blend for Brightness/Color/Contrast/Sharpness,
    one bitwise step for Posterize/Solarize/Invert), so the launches do not depend on which ops were drawn;
    on a CPU each family runs on the samples that drew it (``batch_ops.choose``)."""
    flags = table.flags[entry].unbind(dim=1)
    row = table.rows[entry]
    out = ops.bitwise_ops(x, row[:, 4], table.masks[entry])
    out = ops.choose(flags[0], ops.warp, x, row[:, 5:], out=out)
    out = ops.choose(flags[2], _colour, x, flags[1], row[:, :4], out=out)
    out = ops.choose(flags[3], ops.autocontrast, x, out=out)
    return ops.choose(flags[4], ops.equalize, x, out=out)


def _colour(x: torch.Tensor, sharp: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    """Brightness / Color / Contrast (a blend) or, where ``sharp``, Sharpness; ``row``: ratio, luma weight,
    mean weight, sharpness alpha."""
    blended = ops.blend(x, row[:, 0], row[:, 1], row[:, 2])
    return ops.to_uint8(torch.where(per_sample(sharp), ops.sharpness(x, row[:, 3]), blended))


AA_TAGS = ("aa.policy", "aa.apply0", "aa.apply1", "aa.sign0", "aa.sign1")


def autoaugment_entries(reference, height: int, width: int) -> list[tuple[str, float]]:
    """Entry (policy p, slot s, negated g) at (2p + s) * 2 + g: the op and its signed magnitude, read from
    torchvision's own policy list and magnitude table (10 bins), so they match by construction."""
    entries = []
    for policy in reference._policies:
        for name, _, idx in policy:
            fn, signed = reference._AUGMENTATION_SPACE[name]
            table = fn(10, height, width)
            m = float(table[idx]) if table is not None else 0.0
            entries += [(name, m), (name, -m if signed and table is not None else m)]
    return entries


def autoaugment(policy_name: str = "cifar10") -> Step:
    """v2.AutoAugment per sample (``policy_name``: a value of v2.AutoAugmentPolicy): a sub-policy drawn
    uniformly, each of its two ops applied with its probability, signed magnitudes negated with probability 1/2."""
    v2 = torchvision_v2()
    policy = v2.AutoAugmentPolicy(policy_name)
    reference = v2.AutoAugment(policy)
    names = list(reference._AUGMENTATION_SPACE)
    ops_of_cells = [reference._policies[p][s] for p in range(len(reference._policies)) for s in range(2)]
    half = below_threshold(0.5, inclusive=True)

    def step(b: Batch) -> None:
        x = b.images
        _, c, h, w = x.shape
        table = op_table(("autoaugment", policy.value), lambda hh, ww: autoaugment_entries(reference, hh, ww), names,
                         (c, h, w), x.device)
        cells = device_constant(("autoaugment cells", policy.value, h, w), x.device, lambda: torch.tensor(
            [[below_threshold(op[1], inclusive=True), half if _signed(reference, op, h, w) else 0]
             for op in ops_of_cells], dtype=torch.int64))
        chosen = b.rng.randint(AA_TAGS[:1], len(reference._policies))[:, 0]
        bits = b.rng.block(AA_TAGS[1:])  # apply0, apply1, sign0, sign1: uniform <= p decided on the bits
        b.record("aa.policy", chosen)
        for slot in range(2):
            cell = chosen * 2 + slot
            thresholds = cells[cell]
            negate = bits[:, 2 + slot] < thresholds[:, 1]
            entry = torch.where(bits[:, slot] < thresholds[:, 0], cell * 2 + negate, table.none)
            _trace_entries(b, "aa.op", table, entry)
            x = apply_entries(x, entry, table)
        b.images = x

    return Step(step, AA_TAGS)


def _signed(reference, op: tuple, height: int, width: int) -> bool:
    fn, signed = reference._AUGMENTATION_SPACE[op[0]]
    return bool(signed and fn(10, height, width) is not None)


def _trace_entries(b: Batch, name: str, table: OpTable, entry: torch.Tensor) -> None:
    if b.trace is not None:
        b.record(name, (table.op_index[entry], table.magnitudes[entry]))


def randaugment(num_ops: int = 2, magnitude: int = 10, num_bins: int = 31) -> Step:
    """v2.RandAugment per sample: each of ``num_ops`` ops drawn uniformly from its op table (Identity
    included), at the fixed magnitude bin, sign drawn for signed ops."""
    space = torchvision_v2().RandAugment._AUGMENTATION_SPACE
    names = list(space)
    tags = tuple(f"ra.{kind}{slot}" for slot in range(num_ops) for kind in ("op", "sign"))
    half = below_threshold(0.5, inclusive=True)

    def entries(height: int, width: int) -> list[tuple[str, float]]:
        out = []
        for name, (fn, signed) in space.items():
            table = fn(num_bins, height, width)
            m = float(table[magnitude]) if table is not None and table.ndim > 0 else 0.0
            out += [(name, m), (name, -m if signed and table is not None else m)]
        return out

    def step(b: Batch) -> None:
        x = b.images
        _, c, h, w = x.shape
        table = op_table(("randaugment", num_bins, magnitude), entries, names, (c, h, w), x.device)
        signs = device_constant(("randaugment signed",), x.device, lambda: torch.tensor(
            [half if signed else 0 for _, signed in space.values()], dtype=torch.int64))
        for slot in range(num_ops):
            op = b.rng.randint(tags[2 * slot:2 * slot + 1], len(names))[:, 0]
            entry = op * 2 + (b.rng.bits(tags[2 * slot + 1]) < signs[op])  # uniform <= 0.5 for signed ops
            _trace_entries(b, "ra.op", table, entry)
            x = apply_entries(x, entry, table)
        b.images = x

    return Step(step, tags)


# ------------------------------------------------------------------------------------------------
# Colour: ColorJitter with a random op order per sample, grayscale, Cutout

_JITTER_NAMES = ("brightness", "contrast", "saturation", "hue")


def jitter_blend(op_id: int, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """ColorJitter's brightness (0), contrast (1) or saturation (2) with a factor per sample: torchvision's
    kernels, as one blend (saturation leaves grey images as they are)."""
    if op_id == 2 and x.shape[1] == 1:
        return x
    f = factor.to(torch.float32)
    zero = torch.zeros_like(f)
    luma_weight = 1.0 - f if op_id == 2 else zero
    mean_weight = 1.0 - f if op_id == 1 else zero
    return ops.to_uint8(ops.blend(x, f, luma_weight, mean_weight))


JITTER_OPS = {0: lambda x, f: jitter_blend(0, x, f), 1: lambda x, f: jitter_blend(1, x, f),
              2: lambda x, f: jitter_blend(2, x, f), 3: ops.adjust_hue}


def jitter_schedule(order: torch.Tensor, present: tuple[bool, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Blend passes equivalent to applying each sample's ops in its ``order`` (N, 4; op ids, 3 = hue).

    Brightness, contrast and saturation are one blend each, so a pass can give every sample its own one;
    hue is not. Without hue: one pass per blend op present, pass j applying each sample's j-th. With hue (all
    four present): three passes for the blend ops before it (a sample with hue at position q has ops in
    the first q), the hue pass, three for those after (positions q+1 ..); a pass a sample has no op in is
    a factor-1 blend (an exact identity). Returns the pass ops (N, P) and which are active (None: all)."""
    device = order.device
    if not present[3]:
        absent = device_constant(("jitter absent ops", present), device,
                                 lambda: torch.tensor([not p for p in present], dtype=torch.uint8))
        k = sum(present[:3])
        return order.gather(1, absent[order].sort(dim=1, stable=True).indices[:, :k]), None
    if not all(present):
        raise ValueError("color_jitter: a hue range needs brightness, contrast and saturation ranges here")
    steps = device_constant(("jitter steps",), device, lambda: torch.arange(4).view(1, 4))
    q = (order == 3).to(torch.uint8).argmax(dim=1, keepdim=True)  # blend ops before hue
    after = q + steps[:, 1:]
    index = torch.cat([steps[:, :3].expand(len(order), 3), after.clamp(max=3)], dim=1)
    return order.gather(1, index), torch.cat([steps[:, :3] < q, after <= 3], dim=1)


def color_jitter(reference, p: float = 1.0) -> Step:
    """v2.ColorJitter (inside RandomApply(p)) per sample: the factors uniform in the reference's ranges, the
    four ops in a random order drawn per sample (``jitter_schedule`` turns the orders into a fixed sequence
    of whole-batch passes)."""
    ranges = [reference.brightness, reference.contrast, reference.saturation, reference.hue]
    present = tuple(r is not None for r in ranges)
    factor_tags = tuple(f"jitter.f{k}" for k in range(4) if present[k])
    tags = (("jitter.apply",) if p < 1.0 else ()) + permutation_tags("jitter.order", 4) + factor_tags
    used = [r for r in ranges if r is not None]
    bounds = [[float(r[1]) - float(r[0]) for r in used], [float(r[0]) for r in used]]  # span, low per drawn factor

    def step(b: Batch) -> None:
        x = b.images
        applied = b.rng.chance("jitter.apply", p) if p < 1.0 else None
        order = b.rng.permutation("jitter.order", 4)
        scale = device_constant(("jitter ranges", str(bounds)), x.device, lambda: torch.tensor(bounds))
        drawn = b.rng.uniform(factor_tags) * scale[0] + scale[1]
        used = iter(drawn.unbind(1))
        factors = [next(used) if present[k] else None for k in range(4)]
        b.record("jitter", (applied if applied is not None else torch.ones_like(order[:, 0], dtype=torch.bool),
                            factors))
        pass_ops, active = jitter_schedule(order, present)
        if applied is not None:
            active = applied.unsqueeze(1) if active is None else active & applied.unsqueeze(1)
        ratio, luma_w, mean_w = _jitter_coefficients(drawn, present, pass_ops, active)
        for j in range(pass_ops.shape[1]):
            if present[3] and j == 3:
                x = ops.choose(applied, ops.adjust_hue, x, factors[3], out=x)
            chosen = None if active is None else active[:, min(j, active.shape[1] - 1)]
            x = ops.choose(chosen, _jitter_pass, x, ratio[:, j], luma_w[:, j], mean_w[:, j], out=x,
                           identity_elsewhere=True)  # not chosen: a factor-1 blend
        b.images = x

    return Step(step, tags)


def _jitter_coefficients(drawn: torch.Tensor, present: tuple[bool, ...], pass_ops: torch.Tensor, active) -> tuple:
    """Per pass and sample, the blend's ratio and luma / mean-luma weights (N, P) for the op it applies:
    brightness (f, 0, 0), contrast (f, 0, 1 - f), saturation (f, 1 - f, 0); inactive: (1, 0, 0)."""
    column = pass_ops
    if not all(present):  # the drawn column of each op id present (absent ops never run)
        columns = device_constant(("jitter columns", present), drawn.device, lambda: (
            torch.tensor(present).cumsum(0) - 1).clamp(min=0))
        column = columns[pass_ops]
    chosen = drawn.gather(1, column)
    one_minus = 1.0 - chosen
    ratio = chosen if active is None else torch.where(active, chosen, 1.0)
    on = (lambda t: t) if active is None else (lambda t: t & active)  # noqa: E731
    return (ratio, torch.where(on(pass_ops == 2), one_minus, 0.0), torch.where(on(pass_ops == 1), one_minus, 0.0))


def _jitter_pass(x: torch.Tensor, ratio: torch.Tensor, luma_w: torch.Tensor, mean_w: torch.Tensor) -> torch.Tensor:
    return ops.to_uint8(ops.blend(x, ratio, luma_w, mean_w))


def _grayscale(x: torch.Tensor) -> torch.Tensor:
    return ops.luma(x).to(torch.uint8).expand_as(x)


def random_grayscale(p: float = 0.2) -> Step:
    """v2.RandomGrayscale(p) per sample (torchvision's luma, all three channels)."""

    def step(b: Batch) -> None:
        gray = b.rng.chance("gray", p)
        b.record("gray", gray)
        b.images = ops.choose(gray, _grayscale, b.images, out=b.images)

    return Step(step, ("gray",))


def cutout(length: int) -> Step:
    """Cutout (DeVries & Taylor 2017) as ltbench's per-image Cutout: centre uniform over the image, the
    square [c - L//2, c + L//2) clipped at the borders, zeroed (zero in uint8 is zero in [0, 1])."""
    tags = ("cutout.y", "cutout.x")

    def step(b: Batch) -> None:
        x = b.images
        n, _, h, w = x.shape
        centre = b.rng.randint(tags, device_constant(("cutout ranges", h, w), x.device,
                                                     lambda: torch.tensor([h, w], dtype=torch.float64)))
        b.record("cutout", centre)
        half = length // 2
        offset = torch.arange(max(h, w), device=x.device).view(1, 1, -1) - (centre - half).unsqueeze(2)
        inside = (offset >= 0) & (offset < 2 * half)
        square = inside[:, 0, :h].unsqueeze(2) & inside[:, 1, :w].unsqueeze(1)
        b.images = torch.where(square.unsqueeze(1), 0, x)

    return Step(step, tags)


# ------------------------------------------------------------------------------------------------
# Pipelines: the batch counterparts of transforms.PIPELINES, under the same names


class BatchPipeline:
    """Steps on a uint8 batch, then uint8 -> float in [0, 1] -> normalised, as ToDtype + Normalize."""

    def __init__(self, steps: list[Step], spec: ImageSpec):
        self.steps, self.spec = steps, spec
        self.tags = tuple(dict.fromkeys(tag for s in steps for tag in s.tags))  # every draw, hashed at once

    def __call__(self, images, seeds: torch.Tensor, view: int = 0, trace: dict | None = None) -> torch.Tensor:
        """``images``: uint8 (N, C, H, W) (or a list of CHW tensors for large images) on the device that
        trains; ``seeds``: each sample's seed (int64, N); ``view``: the view's position (its own streams)."""
        device = images.device if isinstance(images, torch.Tensor) else images[0].device
        batch = Batch(images, SampleRandom(seeds.to(device), view, self.tags), trace)
        for step in self.steps:
            step(batch)
        return self.normalise(batch.images)

    def normalise(self, images: torch.Tensor) -> torch.Tensor:
        stats = device_constant(("normalise", tuple(self.spec.mean), tuple(self.spec.std)), images.device,
                                lambda: torch.tensor([self.spec.mean, self.spec.std], dtype=torch.float32))
        mean, std = stats[0].view(1, -1, 1, 1), stats[1].view(1, -1, 1, 1)
        return images.to(torch.float32).mul_(1.0 / 255).sub_(mean).div_(std)


batch_pipeline = BATCH_PIPELINES.register  # @batch_pipeline("name"): ImageSpec -> BatchPipeline; no name twice


def _crop_steps(spec: ImageSpec) -> list[Step]:
    return [random_resized_crop(spec.size)] if spec.kind == "large" else [random_crop(spec.size, 4)]


def _color_steps(spec: ImageSpec, p: float = 0.8) -> list[Step]:
    """transforms._color: ColorJitter(0.4, 0.4[, 0.4, 0.1]) with p, grayscale p=0.2 for colour images."""
    v2 = torchvision_v2()
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
    jitter = [color_jitter(torchvision_v2().ColorJitter(0.4, 0.4, 0.4, 0.0))] if spec.channels == 3 else []
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
    return torchvision_v2().functional.pil_to_tensor(image)


class CompiledPipeline:
    """A batched pipeline through ``torch.compile(fullgraph=True, dynamic=False)`` (train.compile;
    ``engine.compiled_views``). Its first call runs eagerly, so the device constants it caches
    (``batch_ops.device_constant``) are made outside the graph; a list of differently sized images
    (ImageNet-size data) always runs eagerly, since every size would be a graph.

    ``isolate_recompiles``: every pipeline shares the code of ``BatchPipeline.__call__``, so without it all of a
    process's pipelines (a grid's runs with ``launcher.jobs: 1``, a benchmark's settings) share one Dynamo cache
    of torch's recompile limit (8) and the ninth graph fails under ``fullgraph`` (tests/test_recompiles.py)."""

    def __init__(self, pipeline: BatchPipeline, backend: str):
        self.pipeline, self.warm = pipeline, False
        self.compiled = torch.compile(pipeline.__call__, fullgraph=True, dynamic=False, backend=backend,
                                      isolate_recompiles=True)

    def __call__(self, images, seeds: torch.Tensor, view: int = 0) -> torch.Tensor:
        if not self.warm or not isinstance(images, torch.Tensor):
            self.warm = isinstance(images, torch.Tensor)
            return self.pipeline(images, seeds, view)
        return self.compiled(images, seeds, view)
