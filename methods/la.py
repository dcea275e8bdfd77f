"""Logit adjustment (Menon et al., ICLR 2021): the logit-adjusted loss and post-hoc logit adjustment.

Formulas (docs/protocols.md §3, google-research ``logit_adjustment``), π = training label frequencies:

* ``la`` (loss):       L = CE(z + log(π**τ + 1e-12), y), τ = 1 by default. With τ = 1 this is Balanced Softmax
                       CE(z + log n, y) (log Σn is a constant shift, which softmax ignores).
* ``la_posthoc``:      trained with plain CE; predicts z - log(π**τ + 1e-12) (+ the target-prior term below).

Prediction under a target class prior p_t. Both methods produce *balanced* scores b (``la``: the raw logits z,
since the loss already absorbed log π; ``la_posthoc``: z - log π**τ), i.e. scores whose softmax estimates
p(y|x) under a uniform label prior. Bayes' rule for a test set with label prior p_t is then
argmax_j b_j + log p_t(j). We return b + log(K·p_t): the extra constant log K makes the scores for the uniform
prior (or None) exactly b, so they equal the raw balanced scores and do not depend on how the uniform prior is
passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from ltbench.config import check_range, check_views
from ltbench.method import Method
from ltbench.registry import METHODS

from ._heads import NormedLinear, class_weight_norms


def log_prior_adjustment(prior: torch.Tensor, tau: float) -> torch.Tensor:
    """log(π**τ + 1e-12), as google-research computes it (float64 internally, float32 out)."""
    return torch.log(prior.double() ** tau + 1e-12).float()


@dataclass
class LAConfig:
    tau: float = 1.0  # temperature of the prior adjustment
    views: list[str] | None = None  # default: one 'default' view
    head: Literal["linear", "cosine"] = "linear"  # cosine: s * cos(h, w_y), as BAPE/ProCo use on ImageNet-LT
    s: float = 30.0  # scale of the cosine head
    # Test-time weight and feature normalisation of a linear head (BAPE Table 5, "LA, test only"):
    # predict with c * cos(h, w_y), c = mean_y ||w_y|| * (running mean of ||h|| over training features),
    # so the logits keep their average magnitude but lose the per-class and per-sample norms.
    test_normalize: bool = False
    # Which views enter the loss: 'first' (the method's first view, as published), or 'all' (the loss averaged
    # over every view in `views`). 'all' with BAPE's three views is the compute-matched LA control for BAPE+LA:
    # the same images through the backbone per step, without the BAPE loss (docs/results.md).
    loss_views: Literal["first", "all"] = "first"

    def validate(self) -> None:
        check_range("tau", self.tau, 0, 100)
        check_range("s", self.s, 0, 1000, low_open=True)
        check_views(self.views)


class _LinearHeadMethod(Method):
    """A linear head (Kaiming-normal weight, like ``ce``); subclasses pick the loss and the prediction."""

    Config = LAConfig

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.tau = float(cfg.tau)  # a plain attribute: post-hoc τ can be changed after training
        if cfg.head == "cosine":
            self.head = _ScaledCosine(ctx.feature_dim, ctx.num_classes, cfg.s)
        else:
            self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)
            nn.init.kaiming_normal_(self.head.weight)
        # running mean of training feature norms, for test_normalize (a buffer: saved in checkpoints)
        self.register_buffer("feature_norm", torch.zeros((), dtype=torch.float64))
        self.register_buffer("feature_count", torch.zeros((), dtype=torch.float64))

    def train_logits(self, h: torch.Tensor) -> torch.Tensor:
        if self.cfg.test_normalize:
            with torch.no_grad():
                norms = h.detach().double().norm(dim=1)
                total = self.feature_count + len(norms)
                self.feature_norm.mul_(self.feature_count / total).add_(norms.sum() / total)
                self.feature_count.copy_(total)
        return self.head(h)

    def test_logits(self, h: torch.Tensor) -> torch.Tensor:
        if not self.cfg.test_normalize or self.cfg.head == "cosine":
            return self.head(h)
        w = self.head.weight.float()
        scale = w.norm(dim=1).mean() * self.feature_norm.float()
        return scale * (F.normalize(h.float(), dim=1) @ F.normalize(w, dim=1).T)

    def view_loss(self, features, labels, shift: torch.Tensor | None) -> dict:
        """CE(z + shift, y) on the first view, or its mean over every view (``loss_views: all``). The logits
        reported for training accuracy are the first view's either way."""
        views = features if self.cfg.loss_views == "all" else features[:1]
        logits = [self.train_logits(h) for h in views]
        losses = [F.cross_entropy(z if shift is None else z + shift.to(z.dtype), labels) for z in logits]
        loss = losses[0] if len(losses) == 1 else torch.stack(losses).mean()
        return {"loss": loss, "logits": logits[0].detach()}

    def adjustment(self) -> torch.Tensor:
        """log(π_train**τ + 1e-12) on the head's device, built once per (device, τ): rebuilt on the host and
        copied every step, it would cost a blocking host-to-device copy per step (docs/performance.md)."""
        key = (self.head.weight.device, self.tau)
        cache = self.__dict__.setdefault("_adjustments", {})
        if key not in cache:
            cache[key] = log_prior_adjustment(self.ctx.train_prior, self.tau).to(key[0])
        return cache[key]

    @torch.no_grad()
    def result_extras(self) -> dict:
        """Per-class weight norms (``class_weight_norms``; with the cosine head only their directions enter the
        logits), and the mean training feature norm that ``test_normalize`` uses."""
        extras = {"weight_norm": class_weight_norms(self.head.cos if self.cfg.head == "cosine" else self.head)}
        if self.feature_count > 0:
            extras["feature_norm_mean"] = float(self.feature_norm)
        return extras


class _ScaledCosine(nn.Module):
    """s · cos(h, w_y) with LDAM's NormedLinear (no bias)."""

    def __init__(self, in_features: int, out_features: int, s: float):
        super().__init__()
        self.cos = NormedLinear(in_features, out_features)
        self.s = s

    @property
    def weight(self) -> torch.Tensor:
        return self.cos.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.s * self.cos(x)


@METHODS.register("la", display="LA")
class LogitAdjustedLoss(_LinearHeadMethod):
    """Logit-adjusted loss CE(z + τ·log π, y). Predicts z + log(K·p_t): z is already balanced (see module doc)."""

    search_space = {"tau": {"uniform": [0.5, 2.0]}}  # around the paper's tau = 1 (docs/methods.md)

    def loss(self, features, labels, *, epoch):
        return self.view_loss(features, labels, self.adjustment())

    def predict(self, features, *, target_prior=None):
        z = self.test_logits(features)
        return z + self.target_shift(target_prior, z)


@METHODS.register("la_posthoc", display="LA post-hoc")
class PostHocLogitAdjustment(_LinearHeadMethod):
    """Plain CE training; predicts z - log(π**τ + 1e-12) + log(K·p_t) (module doc).

    ``head_predictions`` also reports the unadjusted ERM logits ('erm') of the same model.
    """

    search_space = {"tau": {"uniform": [0.5, 2.0]}}  # around the paper's tau = 1 (docs/methods.md)

    def loss(self, features, labels, *, epoch):
        return self.view_loss(features, labels, None)

    def predict(self, features, *, target_prior=None):
        z = self.test_logits(features)
        return z - self.adjustment().to(z.dtype) + self.target_shift(target_prior, z)

    def head_predictions(self, features, *, target_prior=None):
        return {"erm": self.head(features)}
