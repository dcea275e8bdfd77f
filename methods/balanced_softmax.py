"""Balanced Softmax (Ren et al., "Balanced Meta-Softmax for Long-Tailed Visual Recognition", NeurIPS 2020).

The loss is cross-entropy on logits shifted by the log of the training class counts,

    L = CE(z + log n, y),

as ``balanced_softmax_loss`` in jiawei-ren/BalancedMetaSoftmax-Classification computes it (docs/methods.md;
the comparison with that code is in docs/protocols.md §8). The shift makes the softmax of z an estimate of
p(y|x) under a uniform label prior, so the raw logits z are the balanced scores that ``predict`` returns
(the official code also tests with the raw logits), plus log(K·p_t) for a target prior p_t.

Only the loss is implemented, not the Meta Sampler of BALMS (a learned re-sampling schedule): the method
is the "Balanced Softmax" row of the papers that compare against it. With τ = 1, ``la`` trains with
CE(z + log(π + 1e-12), y), which differs from this only by the constant log Σn (which softmax ignores)
and the 1e-12.

A class with no training image would get log 0 = -inf in the official code; here its count is taken as
one (as ``_drw.drw_weights`` does), so its logit stays finite. Every dataset ltbench ships has no empty class.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ltbench.config import check_views
from ltbench.method import Method
from ltbench.registry import METHODS

from ._heads import class_weight_norms


def log_class_counts(class_counts: torch.Tensor) -> torch.Tensor:
    """log n_j in float32 (an empty class counts as one image, see the module doc)."""
    return torch.as_tensor(class_counts, dtype=torch.float64).clamp_min(1.0).log().float()


@dataclass
class BalancedSoftmaxConfig:
    views: list[str] | None = None  # default: one 'default' view

    def validate(self) -> None:
        check_views(self.views)


@METHODS.register("balanced_softmax", display="Balanced Softmax")
class BalancedSoftmax(Method):
    """CE(z + log n, y) on a linear head; predicts z + log(K·p_t) (module doc)."""

    Config = BalancedSoftmaxConfig

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)
        nn.init.kaiming_normal_(self.head.weight)
        self.register_buffer("log_counts", log_class_counts(ctx.class_counts), persistent=False)

    def loss(self, features, labels, *, epoch):
        logits = self.head(features[0])
        loss = F.cross_entropy(logits + self.log_counts.to(logits.dtype), labels)
        return {"loss": loss, "logits": logits.detach()}

    def predict(self, features, *, target_prior=None):
        logits = self.head(features)
        return logits + self.target_shift(target_prior, logits)

    def result_extras(self) -> dict:
        return {"weight_norm": class_weight_norms(self.head)}
