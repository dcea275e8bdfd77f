"""Cross-entropy with deferred re-weighting (CE-DRW, Cao et al. 2019) on a linear head.

Plain CE until ``drw_epoch`` (0-indexed; None: round(0.8 · epochs), LDAM-DRW's 160 of 200), then CE weighted by
the class-balanced effective-number weights w_j ∝ (1 - β)/(1 - β^{n_j}), normalised to sum to K, with torch's
weighted mean (divides by Σ_batch w_{y_i}). The switch happens in ``on_epoch_start``; it is a function of the
epoch, so nothing needs checkpointing.

Prediction: raw logits z, plus log(K·p_t) for a non-uniform target prior p_t (zero for uniform). The re-weighted
phase targets the balanced risk, so z is treated as balanced scores and Bayes' rule for the shifted prior adds
log p_t (the same rule as ``ldam_drw``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ltbench.config import MAX_EPOCHS, check_range, check_views
from ltbench.method import Method
from ltbench.registry import METHODS

from ._drw import DRW
from ._heads import class_weight_norms


@dataclass
class CEDRWConfig:
    drw_epoch: int | None = None  # 0-indexed switch epoch; None: round(0.8 * epochs) (160 of 200)
    beta: float = 0.9999  # effective-number beta
    views: list[str] | None = None  # default: one 'default' view

    def validate(self) -> None:
        check_range("beta", self.beta, 0, 1, high_open=True)
        check_range("drw_epoch", self.drw_epoch, 0, MAX_EPOCHS)
        check_views(self.views)


@METHODS.register("ce_drw", display="CE-DRW")
class CrossEntropyDRW(Method):
    """CE on a linear head (Kaiming-normal weight), class weights switched on at ``drw_epoch``."""

    Config = CEDRWConfig
    search_space = {"beta": {"choice": [0.99, 0.999, 0.9999]}}  # around LDAM-DRW's 0.9999 (docs/methods.md)

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)
        nn.init.kaiming_normal_(self.head.weight)
        self.drw = DRW(ctx.class_counts, beta=cfg.beta, drw_epoch=cfg.drw_epoch, epochs=ctx.epochs)

    def on_epoch_start(self, epoch):
        self.drw.set_epoch(epoch)

    def loss(self, features, labels, *, epoch):
        logits = self.head(features[0])
        return {"loss": self.drw.loss(logits, labels, epoch), "logits": logits.detach(),
                "drw_active": torch.tensor(float(self.drw.active))}

    def predict(self, features, *, target_prior=None):
        z = self.head(features)
        return z + self.target_shift(target_prior, z)

    def result_extras(self) -> dict:
        return {"weight_norm": class_weight_norms(self.head)}
