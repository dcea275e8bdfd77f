"""Logit adjustment (Menon et al., ICLR 2021): the logit-adjusted loss and post-hoc logit adjustment.

Formulas (LT_PROTOCOLS.md §3, google-research ``logit_adjustment``), π = training label frequencies:

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

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ltbench.method import Method
from ltbench.registry import METHODS


def log_prior_adjustment(prior: torch.Tensor, tau: float) -> torch.Tensor:
    """log(π**τ + 1e-12), as google-research computes it (float64 internally, float32 out)."""
    return torch.log(prior.double() ** tau + 1e-12).float()


def log_target_shift(method: Method, target_prior: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """log(K·p_t) per class: the Bayes correction from uniform to target prior p_t, zero for the uniform prior.

    ``target_prior`` None, or with all entries equal, gives exact zeros. Otherwise it is normalised to sum to 1
    (a constant shift either way) and clamped at 1e-12 before the log.
    """
    k = method.num_classes
    if target_prior is None:
        return torch.zeros(k, device=like.device, dtype=like.dtype)
    p = target_prior.to(device=like.device, dtype=torch.float64)
    if bool((p == p[0]).all()):
        return torch.zeros(k, device=like.device, dtype=like.dtype)
    p = p / p.sum()
    return (torch.log(p.clamp_min(1e-12)) + math.log(k)).to(like.dtype)


@dataclass
class LAConfig:
    tau: float = 1.0  # temperature of the prior adjustment
    views: list[str] | None = None  # default: one 'default' view


class _LinearHeadMethod(Method):
    """A linear head (Kaiming-normal weight, like ``ce``); subclasses pick the loss and the prediction."""

    Config = LAConfig

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.tau = float(cfg.tau)  # a plain attribute: post-hoc τ can be changed after training
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)
        nn.init.kaiming_normal_(self.head.weight)

    def adjustment(self) -> torch.Tensor:
        """log(π_train**τ + 1e-12) on the head's device."""
        return log_prior_adjustment(self.ctx.train_prior, self.tau).to(self.head.weight.device)


@METHODS.register("la")
class LogitAdjustedLoss(_LinearHeadMethod):
    """Logit-adjusted loss CE(z + τ·log π, y). Predicts z + log(K·p_t): z is already balanced (see module doc)."""

    def loss(self, features, labels, *, epoch):
        logits = self.head(features[0])
        loss = F.cross_entropy(logits + self.adjustment().to(logits.dtype), labels)
        return {"loss": loss, "logits": logits.detach()}

    def predict(self, features, *, target_prior=None):
        z = self.head(features)
        return z + log_target_shift(self, target_prior, z)


@METHODS.register("la_posthoc")
class PostHocLogitAdjustment(_LinearHeadMethod):
    """Plain CE training; predicts z - log(π**τ + 1e-12) + log(K·p_t) (module doc).

    ``head_predictions`` also reports the unadjusted ERM logits ('erm') of the same model.
    """

    def loss(self, features, labels, *, epoch):
        logits = self.head(features[0])
        return {"loss": F.cross_entropy(logits, labels), "logits": logits.detach()}

    def predict(self, features, *, target_prior=None):
        z = self.head(features)
        return z - self.adjustment().to(z.dtype) + log_target_shift(self, target_prior, z)

    def head_predictions(self, features, *, target_prior=None):
        return {"erm": self.head(features)}
