"""Cosine classifier trained with plain cross-entropy.

Logits z_j = s · <x/||x||, w_j/||w_j||>: normalised features and class weights, no bias, scale s (default 30, the
LDAM-family CIFAR value; docs/protocols.md §3). The weights use LDAM's ``NormedLinear`` (unit-column init). With
``learn_scale`` the scale is a parameter initialised to s (kept out of weight decay, which would only shrink it).

Prediction. The model is trained with plain CE, so its scores estimate the *training* posterior. Default
(``posthoc_tau = 0``): raw z whatever the target prior — the ERM prediction, like ``ce``. With ``posthoc_tau`` τ > 0
post-hoc logit adjustment is applied as in ``la_posthoc``: z - log(π_train**τ + 1e-12) + log(K·p_t) (the Bayes
rule for a target prior p_t when τ = 1; the last term is zero for the uniform prior).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ltbench.config import check_range, check_views
from ltbench.method import Method
from ltbench.registry import METHODS

from .la import log_prior_adjustment
from ._heads import NormedLinear, class_weight_norms


@dataclass
class CosineConfig:
    s: float = 30.0  # logit scale (initial value when learn_scale)
    learn_scale: bool = False  # learn s (no weight decay on it)
    posthoc_tau: float = 0.0  # 0: raw argmax; > 0: post-hoc logit adjustment with this τ
    views: list[str] | None = None  # default: one 'default' view

    def validate(self) -> None:
        check_range("s", self.s, 0, 1000, low_open=True)
        check_range("posthoc_tau", self.posthoc_tau, 0, 100)
        check_views(self.views)


@METHODS.register("cosine", display="Cosine")
class CosineClassifier(Method):
    """CE on s·cos; predicts s·cos, or its post-hoc logit-adjusted form when posthoc_tau > 0."""

    Config = CosineConfig
    search_space = {"s": {"uniform": [10.0, 40.0]}}  # around the usual 30 (docs/methods.md)

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.head = NormedLinear(ctx.feature_dim, ctx.num_classes)
        if cfg.learn_scale:
            self.scale = nn.Parameter(torch.tensor(float(cfg.s)))
        else:
            self.register_buffer("scale", torch.tensor(float(cfg.s)), persistent=False)
        self.posthoc_tau = float(cfg.posthoc_tau)

    def param_groups(self):
        if isinstance(self.scale, nn.Parameter):
            return [{"params": [self.scale], "weight_decay": 0.0}]
        return None

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.scale * self.head(features)

    def loss(self, features, labels, *, epoch):
        logits = self.logits(features[0])
        out = {"loss": F.cross_entropy(logits, labels), "logits": logits.detach()}
        if isinstance(self.scale, nn.Parameter):
            out["scale"] = self.scale.detach().clone()
        return out

    @torch.no_grad()
    def result_extras(self) -> dict:
        """Per-class norms of the raw class weights (they do not enter s·cos, but show how training moved each
        class) and the logit scale s, the one norm the prediction uses (learned when learn_scale)."""
        return {"weight_norm": class_weight_norms(self.head), "scale": float(self.scale)}

    def predict(self, features, *, target_prior=None):
        z = self.logits(features)
        if self.posthoc_tau == 0:
            return z
        adjustment = log_prior_adjustment(self.ctx.train_prior, self.posthoc_tau).to(z)
        return z - adjustment + self.target_shift(target_prior, z)
