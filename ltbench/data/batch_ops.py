"""Pixel operations on whole uint8 batches (N, C, H, W), one parameter per sample, for the batched augmentation
pipelines (ltbench/data/batch_augment.py).

Why a module of its own: each op here is a torchvision kernel for one image, restated so that

1. **a batch costs a fixed number of kernel launches and no host-device sync**, whatever its parameters: every
   op runs on the whole batch (no grouping of samples by op, no branch on the data), and its parameters come
   as per-sample tensors (a GPU pays about 5-10 us per launch and stalls at every sync);
2. **the result is the same on every device, bit for bit, and equal to torchvision's CPU kernel**. By
   construction: every float operation is a single IEEE operation (+, -, x, /, compare, round, truncate) in
   its own kernel, in the order torchvision's CPU kernel does it, and those are correctly rounded on any
   device. Where torchvision's CPU kernel fuses a multiply-add (``add`` with ``alpha``), the sum is formed in
   float64, where products of 8-bit pixels and float32 weights and their sums are exact, and rounded once to
   float32: that is what a fused multiply-add computes. Integer sums in float32 are exact below 2**24. No
   convolution, matrix product, interpolation kernel or float mean is used: on CUDA they go through cuDNN /
   cuBLAS (TF32, their own summation order) or kernels that round differently from the CPU's.

tests/test_gpu_augment.py checks (2) against torchvision on the CPU for every op and every magnitude the
policies use; the CUDA tests check CPU = CUDA where a GPU is present.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

# ------------------------------------------------------------------------------------------------
# Constants: built on the CPU once, copied to each device once per process

_CONSTANTS: dict = {}


def device_constant(key: tuple, device: torch.device, build: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``build()`` (a CPU tensor) on ``device``, made once per (key, device) and kept.

    Why: ``torch.tensor(table, device='cuda')`` in every call is a blocking host-to-device copy, i.e. a sync per
    batch. Policy tables, warp grids, mean/std and the hash's tag keys are the same every batch."""
    entry = _CONSTANTS.get((key, device))
    if entry is None:
        entry = _CONSTANTS[(key, device)] = build().to(device)
    return entry


def per_sample(values: torch.Tensor) -> torch.Tensor:
    """(N,) -> (N, 1, 1, 1), to scale whole images."""
    return values.view(-1, 1, 1, 1)


def whole_batch(x: torch.Tensor) -> bool:
    """Compute an op for every sample and pick with ``torch.where`` (True), or for the samples that drew it only?

    On a GPU, and whenever the code is compiled, the whole batch: picking the samples that drew an op is a
    ``nonzero``, a host-device sync, and the number of launches would depend on the draws. In eager mode on a
    CPU a sync costs nothing and the arithmetic is what costs, so only the samples that drew the op. The two
    give the same values bit for bit (every op is computed per sample; tests/test_gpu_augment.py checks)."""
    return x.device.type != "cpu" or torch.compiler.is_compiling()


def choose(chosen: torch.Tensor | None, compute: Callable[..., torch.Tensor], x: torch.Tensor, *params: torch.Tensor,
           out: torch.Tensor, identity_elsewhere: bool = False) -> torch.Tensor:
    """``out`` with sample i replaced by ``compute(x[i], *params[i])`` where ``chosen[i]`` (None: everywhere),
    per :func:`whole_batch`. ``identity_elsewhere``: compute leaves the samples not chosen as ``out`` has them
    (their parameters make it an identity), so the whole-batch way needs no ``torch.where``."""
    if chosen is None or (identity_elsewhere and whole_batch(x)):
        return compute(x, *params)
    if whole_batch(x):
        return torch.where(per_sample(chosen), compute(x, *params), out)
    index = chosen.nonzero().squeeze(1)
    if len(index) == 0:
        return out
    out = out.clone()
    out[index] = compute(x[index], *(p[index] for p in params))
    return out


# ------------------------------------------------------------------------------------------------
# Luma, blends, sharpness: torchvision's colour kernels with a factor per sample

_LUMA = tuple(float(torch.tensor(w, dtype=torch.float32)) for w in (0.2989, 0.587, 0.114))  # as float32


def luma(x: torch.Tensor) -> torch.Tensor:
    """torchvision's grayscale of uint8 RGB as float (N, 1, H, W), floored (its uint8 rule), bit for bit.

    torchvision computes ``r*0.2989`` (one float32 product) then adds ``g*0.587`` and ``b*0.114`` with fused
    multiply-adds (``add_(.., alpha=)`` on the CPU); each of those is formed exactly in float64 (an 8-bit pixel
    times a float32 weight, plus a float32) and rounded once to float32, as the fused operation rounds."""
    if x.shape[1] == 1:
        return x.to(torch.float32)
    r, g, b = x.unbind(dim=1)
    s = (r * _LUMA[0]).to(torch.float64)
    s = torch.add(s, g, alpha=_LUMA[1]).to(torch.float32).to(torch.float64)
    return torch.add(s, b, alpha=_LUMA[2]).to(torch.float32).floor_().unsqueeze(1)


def image_mean(gray: torch.Tensor) -> torch.Tensor:
    """Per-sample mean (N, 1, 1, 1) of integer-valued float images: an exact integer sum, then one division
    (CPU torch.mean's rule; CUDA's mean multiplies by 1/n instead, which rounds differently)."""
    n = gray.shape[1] * gray.shape[2] * gray.shape[3]
    return gray.sum(dim=(1, 2, 3), keepdim=True) / n


def blend(x: torch.Tensor, ratio: torch.Tensor, luma_weight: torch.Tensor, mean_weight: torch.Tensor,
          gray: torch.Tensor | None = None) -> torch.Tensor:
    """torchvision's ``_blend`` of x with 0 (brightness), its luma (saturation) or its mean luma (contrast), as
    float before clamping: ``x.mul(ratio).add_(other, alpha=1 - ratio)``, whose add is a fused multiply-add
    on the CPU (and on CUDA): formed here in float64 and rounded once. Per sample, ``ratio`` (float32) and the
    float64 weights of the luma and of the mean luma (``1 - ratio`` for the one blended with, 0 otherwise)
    select the op; a zero weight adds an exact zero. The float64 sum is exact for the luma (an integer times a
    float32, plus a float32) and for every factor a policy or ColorJitter draws; only a mean luma times a
    weight can carry more than 53 bits, and then a float32 tie is needed for the result to differ."""
    gray = luma(x) if gray is None else gray
    scaled = (x * per_sample(ratio)).to(torch.float64)
    scaled = torch.addcmul(scaled, gray.to(torch.float64), per_sample(luma_weight))
    mean = image_mean(gray).to(torch.float64)
    return torch.addcmul(scaled, mean, per_sample(mean_weight)).to(torch.float32)


def to_uint8(values: torch.Tensor) -> torch.Tensor:
    """Clamp to [0, 255] and truncate: torchvision's float-to-uint8 step after a blend."""
    return values.clamp_(0, 255).to(torch.uint8)


def sharpness(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """torchvision's adjust_sharpness as float before clamping: inside a 1-pixel border,
    ``x + alpha * (blur - x)`` with ``alpha = 1 - factor`` (float64, per sample; fused on torchvision's CPU:
    formed in float64 here, where it is exact), the blur the 3x3 kernel (1s around a 5, /13) rounded.

    The blur is exact: the weighted sum S is an integer (a float32 box sum of integers plus 4 x centre), and
    S/13 is never within 1/26 of a half-integer (13 is odd), so rounding S/13 in float32 gives round(S/13)
    on any device. torchvision's float conv gets the same; cuDNN with TF32 would not."""
    xf = x.to(torch.float32)
    _, _, h, w = x.shape
    if h <= 2 or w <= 2:
        return xf
    centre = xf[..., 1:-1, 1:-1]
    rows = xf[..., :-2] + xf[..., 1:-1] + xf[..., 2:]  # a 3x3 box sum in two passes (avg_pool2d is slow on CPUs)
    box = rows[..., :-2, :] + rows[..., 1:-1, :] + rows[..., 2:, :]
    blurred = torch.add(box, centre, alpha=4.0).div_(13.0).round_()  # integers: the alpha-add is exact
    delta = F.pad(blurred - centre, [1, 1, 1, 1])  # zero on the border: x stays there
    return torch.addcmul(x.to(torch.float64), delta, per_sample(alpha)).to(torch.float32)


def bitwise_ops(x: torch.Tensor, threshold: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Solarize, Invert and Posterize in one: invert the pixels at or above ``threshold`` (float per sample;
    0 inverts all, 256 none), then keep the bits in ``mask`` (uint8 per sample; 255 keeps all)."""
    return torch.where(x >= per_sample(threshold), x.bitwise_not(), x) & per_sample(mask)


def autocontrast(x: torch.Tensor) -> torch.Tensor:
    """torchvision's autocontrast_image, with ``torch.where`` for its boolean-mask assignments (a mask index
    is a host-device sync on CUDA)."""
    xf = x.to(torch.float32)
    low, high = torch.aminmax(xf.flatten(2), dim=-1)
    low, high = low[..., None, None], high[..., None, None]
    flat = high == low
    inv_scale = torch.where(flat, 1.0, (high - low) * (1.0 / 255))
    return to_uint8((xf - torch.where(flat, 0.0, low)) / inv_scale)


def equalize(x: torch.Tensor) -> torch.Tensor:
    """torchvision's equalize_image (PIL's rule) restated with fewer kernels; integer arithmetic throughout.

    Per channel: the histogram, its cumulative sum, ``step = (pixels - count of the largest value) // 255``;
    the lookup table maps v > 0 to (cum[v-1] + step // 2) // step, clamped, and 0 to 0; a channel with
    step 0 stays as it is."""
    n, c, h, w = x.shape
    flat = x.reshape(n, c, h * w).to(torch.int64)
    hist = torch.zeros(n, c, 256, dtype=torch.int64, device=x.device).scatter_add_(2, flat, torch.ones_like(flat))
    cum = hist.cumsum(dim=2)
    top = hist.gather(2, cum.argmax(dim=2, keepdim=True))  # how many pixels hold the largest value present
    step = torch.div(h * w - top, 255, rounding_mode="floor")
    lut = torch.div(F.pad(cum[..., :-1], [1, 0]) + torch.div(step, 2, rounding_mode="floor"), step.clamp(min=1),
                    rounding_mode="floor").clamp_(0, 255).to(torch.uint8)  # lut[0] = (step // 2) // step = 0
    return torch.where(step != 0, lut.gather(2, flat), x.reshape(n, c, h * w)).view(n, c, h, w)


# ------------------------------------------------------------------------------------------------
# Hue: torchvision's HSV round trip, with its vpqt selection table kept on the device


def _rgb_to_hsv(image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torchvision's _rgb_to_hsv (float RGB in [0, 1], (N, 3, H, W)): the same float operations in the same
    order. Its hue sums three terms of which two are masked to zero; ``torch.where`` picks the third."""
    r, g, _ = image.unbind(dim=1)
    minc, maxc = torch.aminmax(image, dim=1)
    eqc = maxc == minc
    channels_range = maxc - minc
    s = channels_range / torch.where(eqc, 1.0, maxc)
    rc, gc, bc = ((maxc.unsqueeze(1) - image) / torch.where(eqc, 1.0, channels_range).unsqueeze(1)).unbind(dim=1)
    h = torch.where(maxc != r, torch.where(maxc == g, rc + 2.0 - bc, gc + 4.0 - rc), bc - gc)
    return (h * (1.0 / 6.0) + 1.0).fmod_(1.0), s, maxc


_VPQT_TO_RGB = [[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]]


def _hsv_to_rgb(h: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """torchvision's _hsv_to_rgb, its selection table kept on the device (it copies it there per call)."""
    h6 = h * 6
    i = torch.floor(h6)
    f = h6 - i
    sxf = s * f
    one_minus_s = 1.0 - s
    q = ((1.0 - sxf) * v).clamp_(0.0, 1.0)
    t = ((sxf + one_minus_s) * v).clamp_(0.0, 1.0)
    p = (one_minus_s * v).clamp_(0.0, 1.0)
    table = device_constant(("vpqt",), h.device, lambda: torch.tensor(_VPQT_TO_RGB, dtype=torch.int64))
    select = table[:, i.to(torch.int64).remainder_(6)].movedim(0, 1)  # (N, 3, H, W)
    return torch.stack((v, p, q, t), dim=1).gather(1, select)


def adjust_hue(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's adjust_hue_image with a factor per sample (grey images are left as they are, as there)."""
    if x.shape[1] == 1:
        return x
    h, s, v = _rgb_to_hsv(x * (1.0 / 255))
    h = (h + factor.to(torch.float32).view(-1, 1, 1)).remainder_(1.0)
    return (_hsv_to_rgb(h, s, v) * (255 + 1.0 - 1e-3)).to(torch.uint8)  # to_dtype_image's float -> uint8


# ------------------------------------------------------------------------------------------------
# Affine warps (nearest, zero fill) from per-sample matrices built on the host


def affine_theta(matrix: list[float], height: int, width: int) -> list[float]:
    """torchvision's inverse affine ``matrix`` (6 numbers, as _get_inverse_affine_matrix gives) as its
    _affine_grid uses it: float32, each output coordinate's row divided by half the image size (float32).
    Returns (ax, bx, cx, ay, by, cy): grid_x = X*ax + Y*bx + cx on centred pixel coordinates X, Y."""
    theta = torch.tensor(matrix, dtype=torch.float32).view(2, 3)
    scaled = theta / torch.tensor([[0.5 * width], [0.5 * height]], dtype=torch.float32)
    return scaled.flatten().tolist()


def _warp_constants(height: int, width: int, device: torch.device) -> torch.Tensor:
    """(4, max(H, W)) float32, cached: torchvision's centred pixel coordinates (its linspace base grid) for x
    and y, then the sizes (W, H) and the largest indices (W - 1, H - 1) in the first two columns."""
    def build() -> torch.Tensor:
        out = torch.zeros(4, max(height, width))
        out[0, :width] = torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, steps=width)
        out[1, :height] = torch.linspace((1.0 - height) * 0.5, (height - 1.0) * 0.5, steps=height)
        out[2, :2] = torch.tensor([width, height])
        out[3, :2] = torch.tensor([width - 1, height - 1])
        return out
    return device_constant(("warp", height, width), device, build)


def warp(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Nearest-neighbour affine warp with zero fill, per-sample ``theta`` (N, 6) from :func:`affine_theta`.

    torchvision builds the grid with a (H*W, 3) x (3, 2) matrix product, which on the CPU is
    ``(X*ax + Y*bx) + cx`` with each step rounded (separate kernels here do the same on any device; cuBLAS
    would not), then grid_sample takes the pixel at ((g + 1) * size - 1) / 2 rounded half to even; here that
    pixel is gathered directly, both axes at once."""
    n, c, h, w = x.shape
    k = _warp_constants(h, w, x.device)
    t = theta.reshape(n, 2, 3, 1, 1)
    grid = k[0, :w].view(1, 1, 1, w) * t[:, :, 0] + k[1, :h].view(1, 1, h, 1) * t[:, :, 1] + t[:, :, 2]
    source = (((grid + 1.0) * k[2, :2].view(1, 2, 1, 1) - 1.0) / 2.0).round_()
    clamped = torch.minimum(source.clamp(min=0), k[3, :2].view(1, 2, 1, 1))
    inside = (clamped == source).all(dim=1, keepdim=True)
    index = (clamped[:, 1] * w + clamped[:, 0]).to(torch.int64).view(n, 1, h * w).expand(n, c, h * w)
    out = x.reshape(n, c, h * w).gather(2, index).view(n, c, h, w)
    return torch.where(inside, out, 0)


# ------------------------------------------------------------------------------------------------
# Antialiased bilinear resize of per-sample boxes: torch's uint8 CPU kernel (fixed point), batched


def _steps(device: torch.device, count: int, offset: float = 0.0) -> torch.Tensor:
    """0 .. count-1 (+ offset) in float64, cached."""
    return device_constant(("steps", count, offset), device,
                           lambda: torch.arange(count, dtype=torch.float64) + offset)


_POWERS_OF_TWO = [2.0 ** k for k in range(24)]


def _powers_of_two(device: torch.device) -> torch.Tensor:
    """2**0 .. 2**23 in float64, exact (a pow kernel on a device need not be)."""
    return device_constant(("powers of two",), device, lambda: torch.tensor(_POWERS_OF_TWO, dtype=torch.float64))


def _aa_taps(in_len: torch.Tensor, out_len, span: int, taps: int, upscale: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """_compute_indices_min_size_weights_aa of torch's CPU kernel in float64 for output indices 0 .. span-1 of
    a resize of ``in_len`` to ``out_len``: first source index and normalised weights (.., span, taps).
    ``upscale``: every in_len <= out_len (support 1, no rescaling of the filter)."""
    device = in_len.device
    scale = (in_len / out_len).unsqueeze(-1)
    if upscale:
        support, invscale, largest_taps = 1.0, None, None
    else:
        down = scale >= 1.0
        support, invscale = torch.where(down, scale, 1.0), torch.where(down, 1.0 / scale, 1.0)
        largest_taps = support.ceil() * 2 + 1
    centre = scale * _steps(device, span, 0.5)
    xmin = ((centre - support) + 0.5).trunc_().clamp_(min=0)
    xsize = (torch.minimum(((centre + support) + 0.5).trunc_(), in_len.unsqueeze(-1)) - xmin).clamp_(min=0)
    xsize = xsize if upscale else torch.minimum(xsize, largest_taps)
    j = _steps(device, taps)
    arg = ((j + xmin.unsqueeze(-1)) - centre.unsqueeze(-1)) + 0.5
    arg = arg if upscale else arg * invscale.unsqueeze(-1)
    weights = (1.0 - arg.abs()).clamp_(min=0) * (j < xsize.unsqueeze(-1))
    total = weights[..., 0]
    for k in range(1, taps):  # torch's order (a reduction's order is the device's choice)
        total = total + weights[..., k]
    return xmin, weights / torch.where(total != 0, total, 1.0).unsqueeze(-1)


def aa_weights(in_len: torch.Tensor, size: int, taps: int, upscale: bool, crop: tuple | None = None) -> tuple:
    """torch's antialiased bilinear taps for per-sample resizes to ``size``, as its uint8 CPU kernel uses them:
    the float64 weights scaled to integers by 2**precision, the precision the largest that keeps the
    largest weight of the whole axis below 2**15.

    ``in_len`` (float64, (N, 2)): the boxes' heights and widths. ``crop``: (out_total (N, 2) float64,
    out_offset (N, 2) int64, span): resize to out_total and keep ``size`` outputs from out_offset (resize
    then centre crop; the largest weight runs over all out_total outputs, ``span`` >= all of them).
    Returns the first source index (N, 2, size) int64, int32 weights (N, 2, size, taps), precision (N, 2)."""
    out_len, span = (size, size) if crop is None else (crop[0], crop[2])
    xmin, weights = _aa_taps(in_len, out_len, span, taps, upscale)
    largest = weights.amax(dim=-1)
    if crop is not None:
        largest = largest * (_steps(in_len.device, span) < crop[0].unsqueeze(-1))
    powers = _powers_of_two(in_len.device)
    precision = ((largest.amax(dim=-1, keepdim=True) * powers[1:23] + 0.5).trunc_() < 2 ** 15).sum(dim=-1)
    scaled = ((weights * powers[precision].view(*precision.shape, 1, 1)) + 0.5).trunc_()
    if crop is not None:
        keep = crop[1].unsqueeze(-1) + torch.arange(size, device=in_len.device)
        xmin, scaled = xmin.gather(-1, keep), scaled.gather(-2, keep.unsqueeze(-1).expand(*keep.shape, taps))
    return xmin.to(torch.int64), scaled.to(torch.int32), precision


def _resample(source: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, precision: torch.Tensor,
              rounding: torch.Tensor, dim: int) -> torch.Tensor:
    """One pass of the fixed-point kernel along ``dim`` (3: columns, 2: rows): per output position,
    2**(p-1) + sum_k pixel[index_k] * weight_k, shifted right by p, clamped to uint8 (int32 arithmetic, so
    exact everywhere). ``index``/``weights``: (N, S, taps); ``precision``/``rounding``: (N,) int32."""
    n = source.shape[0]
    shape = (n, 1, 1, -1) if dim == 3 else (n, 1, -1, 1)
    out_shape = list(source.shape)
    out_shape[dim] = index.shape[1]
    acc = rounding.view(n, 1, 1, 1)
    for k in range(index.shape[2]):
        picked = source.gather(dim, index[..., k].reshape(shape).expand(out_shape))
        acc = torch.addcmul(acc, picked, weights[..., k].reshape(shape))
    return (acc >> precision.view(n, 1, 1, 1)).clamp_(0, 255).to(torch.uint8)


def resize_boxes(canvas: torch.Tensor, boxes: torch.Tensor, size: int, largest_scale: float,
                 crop: tuple | None = None) -> torch.Tensor:
    """Crop each sample's box (top, left, height, width: (N, 4) int64) out of ``canvas`` (uint8 (N, C, H, W))
    and resize it to size x size with torch's antialiased bilinear uint8 kernel, the one torchvision's
    resized_crop / resize run on the CPU: the same int16 weights, columns first, then rows from the uint8
    intermediate, so the result is torchvision's bit for bit, on any device (integer arithmetic).
    ``largest_scale``: a bound on box / output length (how many taps); ``crop``: see :func:`aa_weights`."""
    _, _, h, w = canvas.shape
    taps = 2 if largest_scale <= 1.0 else 2 * math.ceil(largest_scale) + 1  # at most 2 non-zero upsampling
    first, weights, precision = aa_weights(boxes[:, 2:4].to(torch.float64), size, taps, largest_scale <= 1.0, crop)
    limits = device_constant(("resize limits", h, w), canvas.device,
                             lambda: torch.tensor([h - 1, w - 1], dtype=torch.int64).view(1, 2, 1, 1))
    index = torch.minimum(boxes[:, :2, None, None] + first.unsqueeze(-1) + torch.arange(taps, device=canvas.device),
                          limits)
    rounding = _powers_of_two(canvas.device)[precision - 1].to(torch.int32)
    precision = precision.to(torch.int32)
    columns = _resample(canvas, index[:, 1], weights[:, 1], precision[:, 1], rounding[:, 1], dim=3)
    return _resample(columns, index[:, 0], weights[:, 0], precision[:, 0], rounding[:, 0], dim=2)
