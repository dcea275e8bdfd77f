"""SADE: self-supervised aggregation of diverse experts (test-agnostic long-tailed recognition).

Paper: Zhang, Hong, Hooi, Kang, Feng, "Self-Supervised Aggregation of Diverse Experts for Test-Agnostic
Long-Tailed Recognition" (NeurIPS 2022); official code Vanint/SADE-AgnosticLT (``model/loss.py``
DiverseExpertLoss, ``model/ldam_drw_resnets/expert_resnet_cifar.py``, ``test_training_cifar.py``).

The network is ltbench's general multi-expert model (``ltbench/experts.py``): the backbone's early stages
shared, its last ``expert_stages`` stages copied once per expert (CIFAR ResNet: stages 2 and 3, as SADE's
``layer2s``/``layer3s``; torchvision ResNets: layer3 and layer4), one s·cosine head per expert. With
π the training prior and π̃ the *inverse* prior (the prior's values in reversed rank order), the loss is
    CE(z₁, y) + CE(z₂ + log(π + 1e-9), y) + CE(z₃ + log(π + 1e-9) - τ log(π̃ + 1e-9), y),
so expert 1 fits the long-tailed training prior, expert 2 a uniform one, expert 3 an inverted one.
Prediction: Σ_e w_e z_e with w uniform (the official mean of the experts' logits) or, on each test set, the
weights learned there without labels: w = softmax(a), a optimised by SGD to maximise the cosine similarity
of the aggregated softmax predictions of two augmented views of each test image (official
``test_training``), stopping after an epoch in which a weight (rounded to 2 decimals) falls below 0.05.
A recipe gets experts whose own stages are 3/4 as wide as the backbone's (``expert_width`` 0.75, the official
``reduce_dimension``: 24/48 channels on CIFAR ResNet-32); the official views are the pipelines ``sade_train``
and ``sade_test_time`` below, the latter redrawn every test-time epoch with ``test_time_redraw``. What still differs from
the official code, and why: docs/protocols.md §8.2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import ImageFilter

from ltbench.config import check_range, check_views
from ltbench.data.base import ImageSpec
from ltbench.experts import MultiExpert, split_experts
from ltbench.method import Method
from ltbench.registry import BATCH_PIPELINES, METHODS, PIPELINES

from ._twobranch import classifier_head


@dataclass
class SADEConfig:
    num_experts: int = 3
    """SADE's three experts (forward, uniform, backward); the loss is defined for exactly three."""
    expert_stages: int = 3
    """How many of the backbone's last stages each expert owns (3: CIFAR ResNet stages 2, 3 and the pooling)."""
    expert_width: float = 0.75
    """Channels of the experts' own stages relative to the backbone's. Default 0.75, the official
    reduce_dimension (ResNet-32: 24/48 where the backbone has 32/64; ResNet/ResNeXt-50: planes 192/384 for
    256/512); 1.0: the backbone's widths."""
    tau: float = 2.0
    """Strength of the inverse prior for expert 3 (official tau 2)."""
    tie_order: Literal["stable", "official_cpu"] = "stable"
    """Order of classes with tied training counts in the inverse prior: 'stable' (label order; what the
    official torch.sort gives on recent CUDA builds, unverified here) or 'official_cpu' (the official unstable
    torch.sort run on the CPU, whatever order this torch build gives; docs/protocols.md §8.2)."""
    head: Literal["cosine", "linear"] = "cosine"
    """Expert classifiers: s * cosine (official use_norm true) or linear."""
    s: float = 30.0
    """Scale of the cosine heads (official 30)."""
    views: list[str] | None = None
    """Training view(s); the loss uses the first (default: the dataset's 'default' view)."""
    test_time: Literal["self_supervised", "none"] = "self_supervised"
    """Learn aggregation weights on each test set (SADE's test-time training), or keep them uniform."""
    test_time_views: list[str] = field(default_factory=lambda: ["default", "default"])
    """The two augmentations of each unlabeled test image. 'sade_test_time' is the official one (crop,
    colour jitter, grayscale, blur, flip; the CIFAR and ImageNet-LT recipes use it); the default 'default'
    (crop with padding, flip) is what runs recorded before it used (docs/protocols.md §8.2)."""
    test_time_redraw: bool = False
    """Draw the test-time views afresh for every test-time epoch, as the official loader does (true), or
    draw them once and reuse them (false, the default: what runs recorded before the option did)."""
    test_time_epochs: int = 5
    """Passes over the test set (official 5)."""
    test_time_lr: float = 0.1
    """SGD on the aggregation weights (official: lr 0.1 CIFAR, 0.025 ImageNet-LT, 0.2 iNat; momentum 0.9, Nesterov)."""
    test_time_weight_decay: float = 5e-4
    """Weight decay of that SGD (official 5e-4 CIFAR and ImageNet-LT, 2e-4 iNat, 4e-4 Places-LT)."""
    test_time_batch_size: int = 128
    """Test images per step (official 128)."""
    test_prior: Literal["ignore", "shift"] = "ignore"
    """'ignore': the test-agnostic protocol (a known test prior is not used); 'shift': add log(K p_t)."""

    def validate(self) -> None:
        if self.num_experts != 3:
            raise ValueError(f"num_experts: SADE's loss has exactly 3 experts, got {self.num_experts}")
        check_range("expert_stages", self.expert_stages, 1, 16)
        check_range("expert_width", self.expert_width, 0.5, 4)  # below 1/2 a CIFAR expert would narrow its input
        check_range("tau", self.tau, 0, 100)
        check_range("s", self.s, 0, 1000, low_open=True)
        check_views(self.views)
        check_views(self.test_time_views, "test_time_views")
        if len(self.test_time_views) != 2:
            raise ValueError(f"test_time_views: SADE compares exactly 2 views, got {len(self.test_time_views)}")
        check_range("test_time_epochs", self.test_time_epochs, 1, 1000)
        check_range("test_time_lr", self.test_time_lr, 0, 100, low_open=True)
        check_range("test_time_weight_decay", self.test_time_weight_decay, 0, 1)
        check_range("test_time_batch_size", self.test_time_batch_size, 1, 1 << 20)


def inverse_prior(prior: torch.Tensor, tie_order: str = "stable") -> torch.Tensor:
    """π̃: the class with the r-th smallest prior gets the r-th largest value (official ``inverse_prior``).

    Tied classes (CIFAR-100-LT at ρ 100 has ten groups of equal counts) get different values depending on
    the order the sort leaves them in. 'stable': label order. 'official_cpu': the official call, an unstable
    ``torch.sort``, run on the CPU; torch leaves that order unspecified, so it is what this torch build does
    (2.14.1 on x86-64, ρ 100: mostly descending labels, not all; tests/test_contrastive_experts.py)."""
    if tie_order == "official_cpu":
        values, order = torch.sort(prior.detach().cpu())
        values, order = values.to(prior.device), order.to(prior.device)
    else:
        values, order = torch.sort(prior, stable=True)
    rank = torch.argsort(order, stable=True)
    return values[len(prior) - 1 - rank]


def expert_shifts(prior: torch.Tensor, tau: float, tie_order: str = "stable") -> list[torch.Tensor]:
    """The three experts' logit shifts in the loss: 0, log(π + 1e-9), log(π + 1e-9) - τ log(π̃ + 1e-9)."""
    log_prior = torch.log(prior + 1e-9)
    inverse = inverse_prior(prior, tie_order)
    return [torch.zeros_like(prior), log_prior, log_prior - tau * torch.log(inverse + 1e-9)]


def aggregate(logits: list[torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
    """Σ_e w_e z_e, summed expert by expert in order (as the official code writes it)."""
    out = weights[0] * logits[0]
    for w, z in zip(weights[1:], logits[1:]):
        out = out + w * z
    return out


ViewLogits = tuple[list[torch.Tensor], list[torch.Tensor]]  # the experts' logits under view a, under view b


def self_supervised_weights(draw: Callable[[int], ViewLogits], epochs: int, lr: float, batch_size: int,
                            generator: torch.Generator, momentum: float = 0.9, weight_decay: float = 5e-4,
                            min_weight: float = 0.05) -> tuple[torch.Tensor, int]:
    """SADE's test-time aggregation (official ``test_training``): raw weights a (init 1/E), w = softmax(a);
    per batch, maximise the mean cosine similarity of softmax(Σ w_e z_e) between the two views; stop after
    an epoch in which a weight, rounded to 2 decimals, is below ``min_weight``. ``draw(epoch)`` gives that
    epoch's expert logits of both views (the same ones every epoch when the views are drawn once; fresh
    augmentations each epoch as the official loader does). Returns (w, epochs run)."""
    raw, done = None, 0
    for done in range(1, epochs + 1):
        view_a, view_b = draw(done - 1)
        if raw is None:
            e = len(view_a)
            raw = torch.full((e,), 1.0 / e, requires_grad=True)
            opt = torch.optim.SGD([raw], lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=True)
        for idx in torch.randperm(view_a[0].shape[0], generator=generator).split(batch_size):
            w = F.softmax(raw, dim=0)
            p_a = F.softmax(aggregate([z[idx] for z in view_a], w), dim=1)
            p_b = F.softmax(aggregate([z[idx] for z in view_b], w), dim=1)
            loss = -F.cosine_similarity(p_a, p_b, dim=1, eps=1e-6).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        rounded = torch.round(F.softmax(raw.detach(), dim=0) * 100) / 100
        if bool((rounded < min_weight).any()):
            break
    return F.softmax(raw.detach(), dim=0), done


@METHODS.register("sade", display="SADE")
class SADE(Method):
    """Three experts on a shared trunk with forward/uniform/inverse prior losses; test-time aggregation."""

    Config = SADEConfig
    search_space = {"tau": {"uniform": [1.0, 3.0]}}  # around the official 2 (docs/methods.md)

    @classmethod
    def build_model(cls, cfg: SADEConfig, backbone: nn.Module) -> nn.Module:
        return MultiExpert(backbone, cfg.num_experts, cfg.expert_stages, cfg.expert_width)

    def __init__(self, cfg: SADEConfig, ctx):
        super().__init__(cfg, ctx)
        e = cfg.num_experts
        if ctx.feature_dim % e:
            raise ValueError(f"sade: feature_dim {ctx.feature_dim} is not {e} experts' features side by side")
        self.expert_dim = ctx.feature_dim // e
        self.heads = nn.ModuleList([classifier_head(self.expert_dim, ctx.num_classes, cfg.head, cfg.s)
                                    for _ in range(e)])
        shifts = expert_shifts(ctx.train_prior.float(), cfg.tau, cfg.tie_order)
        self.register_buffer("loss_shifts", torch.stack(shifts), persistent=False)
        self.register_buffer("weights", torch.full((e,), 1.0 / e), persistent=False)  # uniform until adapt()

    def expert_logits(self, features: torch.Tensor) -> list[torch.Tensor]:
        return [head(h) for head, h in zip(self.heads, split_experts(features, self.cfg.num_experts))]

    def loss(self, features, labels, *, epoch):
        logits = self.expert_logits(features[0])
        losses = [F.cross_entropy(z + shift.to(z.dtype), labels) for z, shift in zip(logits, self.loss_shifts)]
        out = {"loss": torch.stack(losses).sum(), "logits": torch.stack(logits).mean(0).detach()}
        out.update({f"loss_expert{i}": loss.detach() for i, loss in enumerate(losses)})
        return out

    def predict(self, features, *, target_prior=None):
        scores = aggregate(self.expert_logits(features), self.weights.to(features.device))
        if self.cfg.test_prior == "shift":
            scores = scores + self.target_shift(target_prior, scores)
        return scores

    def head_predictions(self, features, *, target_prior=None):
        logits = self.expert_logits(features)
        heads = {f"expert{i}": z for i, z in enumerate(logits)}
        heads["mean"] = torch.stack(logits).mean(0)
        return heads

    # -- test-time aggregation -----------------------------------------------------------------
    def test_time_views(self) -> list[str]:
        return list(self.cfg.test_time_views) if self.cfg.test_time == "self_supervised" else []

    @torch.no_grad()
    def view_logits(self, views: list[torch.Tensor]) -> ViewLogits:
        """The experts' logits (on the CPU, where the three weights are learned) under each of the two views."""
        view_a, view_b = ([z.cpu() for z in self.expert_logits(v)] for v in views)
        return view_a, view_b

    def adapt(self, views: list[torch.Tensor]) -> dict:
        """Learn the aggregation weights on one test source; with ``test_time_redraw`` every epoch after the
        first asks the engine for freshly augmented views (``TestTimeViews.redraw``), as the official loader
        draws new augmentations each epoch. A plain list (no redraw available) is reused every epoch."""
        cfg = self.cfg
        first = self.view_logits(list(views))
        redraw = getattr(views, "redraw", None) if cfg.test_time_redraw else None

        def draw(epoch: int) -> ViewLogits:
            return first if epoch == 0 or redraw is None else self.view_logits(redraw(epoch))

        generator = torch.Generator().manual_seed(0)
        weights, epochs = self_supervised_weights(draw, cfg.test_time_epochs, cfg.test_time_lr,
                                                  cfg.test_time_batch_size, generator,
                                                  weight_decay=cfg.test_time_weight_decay)
        self.weights.copy_(weights.to(self.weights.device))
        return {"weights": [round(float(w), 6) for w in weights], "epochs": epochs}

    def reset_adaptation(self) -> None:
        self.weights.fill_(1.0 / self.cfg.num_experts)


# -- the official test-time augmentation -------------------------------------------------------------


class PILGaussianBlur:
    """SimCLR's blur as SADE's test-time views apply it: PIL's ``GaussianBlur(radius=σ)``, σ ~ U(0.1, 2.0).
    σ comes from torch's generator, which the engine seeds per image (the official code draws it from
    Python's global ``random``, which no per-image seed reaches)."""

    def __init__(self, sigma: tuple[float, float] = (0.1, 2.0)):
        self.sigma = sigma

    def __call__(self, img):
        sigma = float(torch.empty(1).uniform_(self.sigma[0], self.sigma[1]))
        return img.filter(ImageFilter.GaussianBlur(radius=sigma))


class PILPipeline:
    """A v2.Compose run as it is, on PIL images (it converts a uint8 tensor first), for SADE's views, whose
    official pixels come from PIL's kernels (colour jitter, PIL's Gaussian blur, rotation). There is no tensor
    fast path, so ``reference``, the Compose a fast path would have to equal (tests/test_transforms.py), is
    the pipeline itself."""

    def __init__(self, compose):
        self.reference = compose

    def __call__(self, img) -> torch.Tensor:
        return self.reference(img).as_subclass(torch.Tensor)  # a plain tensor, as every pipeline gives


@PIPELINES.register("sade_test_time")
def sade_test_time(spec: ImageSpec):
    """SADE's official test-time view (``test_training_cifar.py`` / ``test_training_imagenet.py``): small
    images random crop with padding 4, large ones random resized crop with scale (0.2, 1); then colour
    jitter (0.4, 0.4, 0.4, 0.1) with p 0.8, grayscale with p 0.2, Gaussian blur σ ∈ [0.1, 2] with p 0.2
    (small) or 0.5 (large), flip, normalise. Done on PIL images, as the official torchvision pipeline is, so
    a draw gives the official pixels (tests/test_contrastive_experts.py); one-channel images get brightness
    and contrast jitter only."""
    from torchvision.transforms import v2  # lazy: keeps status and list free of torchvision

    large = spec.kind == "large"
    crop = v2.RandomResizedCrop(spec.size, scale=(0.2, 1.0)) if large else v2.RandomCrop(spec.size, padding=4)
    if spec.channels == 1:
        colour = [v2.RandomApply([v2.ColorJitter(0.4, 0.4)], p=0.8)]
    else:
        colour = [v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), v2.RandomGrayscale(p=0.2)]
    return PILPipeline(v2.Compose([v2.ToPILImage(), crop, *colour,
                                   v2.RandomApply([PILGaussianBlur()], p=0.5 if large else 0.2),
                                   v2.RandomHorizontalFlip(), v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                                   v2.Normalize(spec.mean, spec.std)]))


@PIPELINES.register("sade_train")
def sade_train(spec: ImageSpec):
    """SADE's official training view (``data_loader/cifar_data_loaders.py``): small images random crop with
    padding 4, flip, random rotation up to 15 degrees, on PIL images as officially; large images are the
    official ImageNet-LT view, the same as ltbench's ``imagenet_train`` (random resized crop, flip, jitter)."""
    from torchvision.transforms import v2  # lazy: keeps status and list free of torchvision

    if spec.kind == "large":
        return PIPELINES.get("imagenet_train")(spec)
    return PILPipeline(v2.Compose([v2.ToPILImage(), v2.RandomCrop(spec.size, padding=4), v2.RandomHorizontalFlip(),
                                   v2.RandomRotation(15), v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                                   v2.Normalize(spec.mean, spec.std)]))


# -- the same views on whole batches (train.augment_on: batch) ----------------------------------------


def _rotation(degrees: float) -> B.Step:
    """v2.RandomRotation(degrees) per sample: angle uniform in [-degrees, degrees], nearest, zero fill; the
    inverse matrix torchvision's rotate builds (about the centre), as a per-sample warp (no host sync)."""
    from ltbench.data import batch_augment as B  # lazy: keeps status and list free of torchvision

    def step(b) -> None:
        x = b.images
        angle = b.rng.uniform("rotate", -degrees, degrees)
        b.record("rotate", angle)
        r = torch.deg2rad(-angle.to(torch.float64))  # rotate(img, a) inverts the rotation by -a
        c, s, z = torch.cos(r), torch.sin(r), torch.zeros_like(r)
        matrix = torch.stack([c, s, z, -s, c, z], 1).to(torch.float32).view(-1, 2, 3)
        h, w = x.shape[-2:]
        half = B.ops.device_constant(("rotation half size", h, w), x.device,  # made once per device
                                     lambda: torch.tensor([[0.5 * w], [0.5 * h]], dtype=torch.float32))
        b.images = B.ops.warp(x, (matrix / half).view(-1, 6))  # batch_ops.affine_theta, per sample

    return B.Step(step, ("rotate",))


def _blur(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Separable Gaussian blur of uint8 images, σ per sample, radius 6, edges replicated, as 13 shifted
    multiply-adds per axis (no convolution: cuDNN may run one in TF32, and the result would depend on the
    device)."""
    n, c, h, w = x.shape
    offsets = torch.arange(-6, 7, device=x.device, dtype=torch.float32)
    kernel = torch.exp(-offsets[None] ** 2 / (2 * sigma[:, None] ** 2))
    kernel = (kernel / kernel.sum(1, keepdim=True)).view(n, 13, 1, 1, 1).unbind(1)
    padded = F.pad(x.to(torch.float32), (6, 6, 6, 6), mode="replicate")
    rows = sum(kernel[t] * padded[:, :, t:t + h, :] for t in range(13))
    out = sum(kernel[t] * rows[:, :, :, t:t + w] for t in range(13))
    return out.round_().clamp_(0, 255).to(torch.uint8)


def _gaussian_blur(p: float, sigma: tuple[float, float] = (0.1, 2.0)) -> B.Step:
    """With probability p per sample, a Gaussian blur of σ ~ U(0.1, 2) (``_blur``): what PIL's
    GaussianBlur(radius=σ) in the per-image view approximates by box blurs (on random 32 x 32 images the two
    differ by about one grey level on average, at most 32 at σ 2)."""
    from ltbench.data import batch_augment as B  # lazy: keeps status and list free of torchvision


    def step(b) -> None:
        applied, s = b.rng.chance("blur.apply", p), b.rng.uniform("blur.sigma", *sigma)
        b.record("blur", (applied, s))
        b.images = B.ops.choose(applied, _blur, b.images, s, out=b.images)

    return B.Step(step, ("blur.apply", "blur.sigma"))


@BATCH_PIPELINES.register("sade_test_time")
def sade_test_time_batch(spec: ImageSpec):
    """``sade_test_time`` on a whole batch: the same steps and distributions (docs/performance.md: batched
    views are the same augmentation, not the same random numbers)."""
    from torchvision.transforms import v2  # lazy: keeps status and list free of torchvision

    from ltbench.data import batch_augment as B  # lazy: keeps status and list free of torchvision

    large = spec.kind == "large"
    crop = B.random_resized_crop(spec.size, (0.2, 1.0)) if large else B.random_crop(spec.size, 4)
    if spec.channels == 1:
        colour = [B.color_jitter(v2.ColorJitter(0.4, 0.4), 0.8)]
    else:
        colour = [B.color_jitter(v2.ColorJitter(0.4, 0.4, 0.4, 0.1), 0.8), B.random_grayscale(0.2)]
    steps = [crop, *colour, _gaussian_blur(0.5 if large else 0.2), B.horizontal_flip()]
    return B.BatchPipeline(steps, spec)


@BATCH_PIPELINES.register("sade_train")
def sade_train_batch(spec: ImageSpec):
    """``sade_train`` on a whole batch: crop with padding 4, flip, rotation up to 15 degrees (large images:
    ``imagenet_train``'s batch pipeline)."""
    from ltbench.data import batch_augment as B  # lazy: keeps status and list free of torchvision

    if spec.kind == "large":
        return BATCH_PIPELINES.get("imagenet_train")(spec)
    return B.BatchPipeline([B.random_crop(spec.size, 4), B.horizontal_flip(), _rotation(15)], spec)
