"""Named augmentation pipelines, built on torchvision.transforms.v2.

A method asks for views by name; a name is either a pipeline below or an alias the dataset maps to
one (``default``, ``strong``, ``sim``, ``eval``), so the same method runs on CIFAR and ImageNet.
Only Cutout is written here: torchvision has no DeVries-style Cutout (RandomErasing keeps its patch
inside the image; Cutout's centre is uniform over the image and the square is clipped at borders).
Inputs are uint8 CHW tensors (or PIL images for file datasets); outputs are normalised float tensors.
torchvision is imported where a transform of it is built (``torchvision_v2``), never by importing this module.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from ltbench.data.base import ImageSpec
from ltbench.errors import ConfigError
from ltbench.registry import PIPELINES

pipeline = PIPELINES.register  # @pipeline("name"): ImageSpec -> transform; a name taken twice is refused


@functools.cache
def torchvision_v2():
    """torchvision.transforms.v2, imported by the first pipeline built from its transforms. Why not at the top:
    importing torchvision costs 1.7 s (torch._dynamo, through torchvision.ops), more than all the rest of a
    Fashion-MNIST worker's start, whose crop, flip and eval views never run a torchvision transform
    (``SmallTensorFastPath``). Cached: the per-image paths below ask for it on every call."""
    from torchvision.transforms import v2

    return v2


class Cutout(torch.nn.Module):
    """DeVries & Taylor (2017): zero one square of side ``length`` centred uniformly in the image."""

    def __init__(self, n_holes: int = 1, length: int = 16):
        super().__init__()
        self.n_holes, self.length = n_holes, length

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        h, w = img.shape[-2:]
        mask = torch.ones((h, w), dtype=img.dtype)
        for _ in range(self.n_holes):
            y = int(torch.randint(h, ()))
            x = int(torch.randint(w, ()))
            y1, y2 = max(0, y - self.length // 2), min(h, y + self.length // 2)
            x1, x2 = max(0, x - self.length // 2), min(w, x + self.length // 2)
            mask[y1:y2, x1:x2] = 0
        return img * mask


class SmallTensorFastPath:
    """The plain crop + flip and eval pipelines done directly on a small uint8 CHW tensor: the same operations
    and random draws in the same order, so the same tensor bit for bit (tests/test_transforms.py). Why: v2's
    machinery costs more than the arithmetic on a 28x28 or 32x32 image (about 0.1 ms per transform and sample).
    Anything else goes to the v2 pipeline, ``reference``, built (and torchvision imported) only then."""

    def __init__(self, spec: ImageSpec, crop_padding: int | None, flip: bool):
        self.spec, self.size, self.padding, self.flip = spec, spec.size, crop_padding, flip
        self.mean = torch.as_tensor(spec.mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.as_tensor(spec.std, dtype=torch.float32).view(-1, 1, 1)

    def __call__(self, img):
        if type(img) is not torch.Tensor or img.dtype != torch.uint8 or img.ndim != 3:
            return self.reference(img)
        if self.padding is not None:
            img = self._crop(img)
        if self.flip and not bool(torch.rand(1) >= 0.5):
            img = img.flip(-1)
        return img.to(torch.float32).mul_(1.0 / 255).sub_(self.mean).div_(self.std)

    @functools.cached_property
    def reference(self) -> Callable:
        """The v2.Compose this path stands for: ToImage, RandomCrop(size, padding) when it crops, a horizontal
        flip when it flips, then ToDtype and Normalize."""
        v2 = torchvision_v2()
        crop = [] if self.padding is None else [v2.RandomCrop(self.size, padding=self.padding)]
        flip = [v2.RandomHorizontalFlip()] if self.flip else []
        return v2.Compose([v2.ToImage(), *crop, *flip, *_to_float(self.spec)])

    def _crop(self, img: torch.Tensor) -> torch.Tensor:
        """v2.RandomCrop(size, padding): the crop of the zero-padded image, without building it."""
        c, h, w = img.shape
        pad, size = self.padding, self.size
        top = int(torch.randint(0, h + 2 * pad - size + 1, size=())) if h + 2 * pad > size else 0
        left = int(torch.randint(0, w + 2 * pad - size + 1, size=())) if w + 2 * pad > size else 0
        y0, x0 = top - pad, left - pad  # the crop's corner in the unpadded image
        out = img.new_zeros((c, size, size))
        ys, ye = max(0, y0), min(h, y0 + size)
        xs, xe = max(0, x0), min(w, x0 + size)
        if ys < ye and xs < xe:
            out[:, ys - y0 : ye - y0, xs - x0 : xe - x0] = img[:, ys:ye, xs:xe]
        return out


class DirectPipeline:
    """A v2.Compose applied transform by transform to a uint8 tensor, without v2's per-call bookkeeping (as costly
    as the pixel work on a 32x32 image): each transform's ``make_params`` and ``transform`` are called directly,
    after the random draws ``forward`` makes, so output and RNG state are bit-identical to the Compose
    (tests/test_transforms.py). ToImage is skipped; other transforms and inputs go through as they are."""

    def __init__(self, compose: Callable):
        self.reference = compose

    def __call__(self, img):
        if type(img) is not torch.Tensor or img.dtype != torch.uint8:
            return self.reference(img)
        return _apply_all(self.reference.transforms, img)


def _apply_all(steps, img: torch.Tensor) -> torch.Tensor:
    for t in steps:
        img = _apply_one(t, img)
    return img


def _apply_one(t, img: torch.Tensor) -> torch.Tensor:
    v2 = torchvision_v2()
    kind = type(t)
    if kind is v2.ToImage:
        return img
    if kind is v2.RandomApply:
        return img if torch.rand(1) >= t.p else _apply_all(t.transforms, img)
    if kind is v2.AutoAugment:
        return _autoaugment(t, img)
    random_apply = v2._transform._RandomApplyTransform
    if isinstance(t, random_apply) and kind.forward is random_apply.forward:
        return img if torch.rand(1) >= t.p else t.transform(img, t.make_params([img]))
    if isinstance(t, v2.Transform) and kind.forward is v2.Transform.forward:
        return t.transform(img, t.make_params([img]))
    return t(img)


def _autoaugment(t, img: torch.Tensor) -> torch.Tensor:
    """v2.AutoAugment.forward on one image tensor: the same draws in the same order."""
    height, width = img.shape[-2:]
    policy = t._policies[int(torch.randint(len(t._policies), ()))]
    for transform_id, probability, magnitude_idx in policy:
        if not torch.rand(()) <= probability:
            continue
        magnitudes_fn, signed = t._AUGMENTATION_SPACE[transform_id]
        magnitudes = magnitudes_fn(10, height, width)
        magnitude = 0.0
        if magnitudes is not None:
            magnitude = float(magnitudes[magnitude_idx])
            if signed and torch.rand(()) <= 0.5:
                magnitude *= -1
        img = t._apply_image_or_video_transform(img, transform_id, magnitude, interpolation=t.interpolation,
                                                fill=t._fill)
    return img


def _to_float(spec: ImageSpec) -> list:
    v2 = torchvision_v2()
    return [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(spec.mean, spec.std)]


def _color(spec: ImageSpec, p: float = 0.8) -> list:
    """ColorJitter(0.4, 0.4, 0.4, 0.1) with p, then grayscale with p=0.2 (colour images only)."""
    v2 = torchvision_v2()
    if spec.channels == 1:
        return [v2.RandomApply([v2.ColorJitter(0.4, 0.4)], p=p)]
    return [v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=p), v2.RandomGrayscale(p=0.2)]


def _interpolation(spec: ImageSpec):
    return torchvision_v2().InterpolationMode(spec.interpolation)


def _crop(spec: ImageSpec) -> list:
    v2 = torchvision_v2()
    if spec.kind == "large":
        return [v2.RandomResizedCrop(spec.size, interpolation=_interpolation(spec), antialias=True)]
    return [v2.RandomCrop(spec.size, padding=4)]


@pipeline("eval")
def eval_pipeline(spec: ImageSpec):
    """Small images: as they are. Large: resize 256 (short side) and centre crop 224."""
    if spec.kind != "large":
        return SmallTensorFastPath(spec, crop_padding=None, flip=False)
    v2 = torchvision_v2()
    resize = int(round(spec.size * 256 / 224)) if spec.crop_pct is None else int(spec.size / spec.crop_pct + 1e-6)
    return DirectPipeline(v2.Compose([v2.ToImage(), v2.Resize(resize, interpolation=_interpolation(spec), antialias=True),
                                      v2.CenterCrop(spec.size)] + _to_float(spec)))


@pipeline("standard")
def standard(spec: ImageSpec):
    """Random crop with 4-pixel padding and horizontal flip (LDAM-DRW); RRC + flip for large images."""
    if spec.kind != "large":
        return SmallTensorFastPath(spec, crop_padding=4, flip=True)
    v2 = torchvision_v2()
    return DirectPipeline(v2.Compose([v2.ToImage()] + _crop(spec) + [v2.RandomHorizontalFlip()] + _to_float(spec)))


@pipeline("autoaug_cutout")
def autoaug_cutout(spec: ImageSpec):
    """Crop + flip + AutoAugment (CIFAR10 policy) + Cutout(1, 16): the 'regular' view of PaCo/ProCo/BAPE.

    torchvision's AutoAugment uses the same 25 CIFAR sub-policies but is not bit-identical to the
    DeepVoltaire code (fill, interpolation); see docs.
    """
    v2 = torchvision_v2()
    cut = max(1, round(16 * spec.size / 32))
    return DirectPipeline(v2.Compose(
        [v2.ToImage()]
        + _crop(spec)
        + [v2.RandomHorizontalFlip(), v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10),
           v2.ToDtype(torch.float32, scale=True), Cutout(1, cut),  # black square in [0, 1], as DeVries
           v2.Normalize(spec.mean, spec.std)]
    ))


@pipeline("randaugment")
def randaugment(spec: ImageSpec):
    """Crop + flip + colour jitter + torchvision RandAugment (2 ops, magnitude 10)."""
    v2 = torchvision_v2()
    return DirectPipeline(v2.Compose(
        [v2.ToImage()]
        + _crop(spec)
        + [v2.RandomHorizontalFlip()]
        + _color(spec, p=1.0)[:1]
        + [v2.RandAugment(num_ops=2, magnitude=10)]
        + _to_float(spec)
    ))


@pipeline("simaug")
def simaug(spec: ImageSpec):
    """SimCLR-style view (ProCo augmentation_sim_cifar): RRC, flip, jitter p=0.8, grayscale p=0.2."""
    v2 = torchvision_v2()
    return DirectPipeline(v2.Compose(
        [v2.ToImage(), v2.RandomResizedCrop(spec.size, antialias=True), v2.RandomHorizontalFlip()]
        + _color(spec)
        + _to_float(spec)
    ))


@pipeline("imagenet_train")
def imagenet_train(spec: ImageSpec):
    """Random resized crop 224, flip, ColorJitter(0.4, 0.4, 0.4, 0) (Decoupling's ImageNet-LT recipe)."""
    v2 = torchvision_v2()
    return DirectPipeline(v2.Compose(
        [v2.ToImage(), v2.RandomResizedCrop(spec.size, antialias=True), v2.RandomHorizontalFlip()]
        + ([v2.ColorJitter(0.4, 0.4, 0.4, 0.0)] if spec.channels == 3 else [])
        + _to_float(spec)
    ))


@pipeline("imagenet_eval")
def imagenet_eval(spec: ImageSpec):
    return eval_pipeline(ImageSpec(spec.size, spec.channels, spec.mean, spec.std, kind="large"))


def resolve(name: str, aliases: dict[str, str]) -> str:
    return aliases.get(name, name)


def build(name: str, spec: ImageSpec, aliases: dict[str, str] | None = None) -> Callable:
    concrete = resolve(name, aliases or {})
    if concrete not in PIPELINES:
        raise ConfigError(PIPELINES.unknown_message(name, also=aliases or {}))
    return PIPELINES.get(concrete)(spec)


class CropEnsemble:
    """Test-time ensembling views (LIFT's TTE): resize the short side to size + expand, then the five crops
    (four corners and centre) of torchvision's FiveCrop, or ten (TenCrop: and their horizontal mirrors),
    each normalised; one (crops, C, size, size) tensor per image. The engine averages the method's scores
    over the crops (ltbench/train/engine.py, ``predict_scores``)."""

    def __init__(self, spec: ImageSpec, mode: str, expand: int):
        v2 = torchvision_v2()
        crop = v2.FiveCrop(spec.size) if mode == "fivecrop" else v2.TenCrop(spec.size)
        self.resize = v2.Compose([v2.ToImage(), v2.Resize(spec.size + expand, interpolation=_interpolation(spec),
                                                          antialias=True)])
        self.crop, self.to_float = crop, v2.Compose(_to_float(spec)[1:])

    def __call__(self, img) -> torch.Tensor:
        return torch.stack([self.to_float(c) for c in self.crop(self.resize(img))])
