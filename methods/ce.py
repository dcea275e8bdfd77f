"""Cross-entropy on a linear head: the plain empirical-risk baseline."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn
import torch.nn.functional as F

from ltbench.config import check_views
from ltbench.method import Method
from ltbench.registry import METHODS

from ._heads import class_weight_norms


@dataclass
class CEConfig:
    views: list[str] | None = None  # default: one 'default' view

    def validate(self) -> None:
        check_views(self.views)


@METHODS.register("ce", display="CE")
class CrossEntropy(Method):
    """Softmax cross-entropy. Predicts with raw logits whatever the target prior (the ERM baseline)."""

    Config = CEConfig

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)
        nn.init.kaiming_normal_(self.head.weight)

    def loss(self, features, labels, *, epoch):
        logits = self.head(features[0])
        return {"loss": F.cross_entropy(logits, labels), "logits": logits.detach()}

    def predict(self, features, *, target_prior=None):
        return self.head(features)

    def result_extras(self) -> dict:
        return {"weight_norm": class_weight_norms(self.head)}
