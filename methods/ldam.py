"""LDAM (label-distribution-aware margin, Cao et al. NeurIPS 2019), with or without deferred re-weighting.

Following kaidic/LDAM-DRW (docs/protocols.md §3):

* classifier: ``NormedLinear`` — weight stored as (in, out), initialised uniform(-1, 1).renorm_(2, 1, 1e-5)
  .mul_(1e5) (unit columns), output = cosine <x/||x||, w_j/||w_j||> (no bias, no scale);
* margins m_j = max_m · n_j^{-1/4} / max_k n_k^{-1/4} (the rarest class gets max_m = 0.5);
* loss L = CE_w(s·(cos - m_y·e_y), y), s = 30: only the true-class cosine is shifted; w = DRW weights
  (all ones before ``drw_epoch``, class-balanced effective-number weights from then on; see ``_drw.py``).

Registered twice: ``ldam`` (drw off by default) and ``ldam_drw`` (drw on by default, switch at 80 % of the
schedule, i.e. epoch 160 of 200, when ``drw_epoch`` is None).

Prediction: LDAM evaluates with argmax of the cosine logits; we return s·cos (same argmax, and on the scale the
softmax was trained at). For a non-uniform target prior p_t we add log(K·p_t) (zero for uniform), i.e. we treat
s·cos as balanced scores, as the margins (and DRW) aim for, and apply Bayes' rule for the shifted prior. The
scale matters: log p_t is added to s·cos, not to cos.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ltbench.config import MAX_EPOCHS, check_range, check_views
from ltbench.method import Method
from ltbench.registry import METHODS

from ._drw import DRW
from ._heads import NormedLinear


def ldam_margins(class_counts: torch.Tensor, max_m: float) -> torch.Tensor:
    """m_j = max_m · n_j^{-1/4} / max_k n_k^{-1/4} (a class with no image counts as one)."""
    inv = torch.as_tensor(class_counts, dtype=torch.float64).clamp_min(1.0) ** -0.25
    return (inv * (max_m / inv.max())).float()


@dataclass
class LDAMConfig:
    max_m: float = 0.5  # margin of the rarest class
    s: float = 30.0  # logit scale applied to (cosine - margin)
    drw: bool = False  # deferred re-weighting
    drw_epoch: int | None = None  # 0-indexed switch epoch; None: round(0.8 * epochs) (160 of 200)
    beta: float = 0.9999  # effective-number beta of the DRW weights
    views: list[str] | None = None  # default: one 'default' view

    def validate(self) -> None:
        check_range("max_m", self.max_m, 0, 2, unit=" (a margin on a cosine)")
        check_range("s", self.s, 0, 1000, low_open=True)
        check_range("beta", self.beta, 0, 1, high_open=True)
        check_range("drw_epoch", self.drw_epoch, 0, MAX_EPOCHS)
        check_views(self.views)


@dataclass
class LDAMDRWConfig(LDAMConfig):
    drw: bool = True


@METHODS.register("ldam", display="LDAM")
class LDAM(Method):
    """LDAM loss on a cosine classifier; predicts s·cos + log(K·p_t) (module doc)."""

    Config = LDAMConfig
    search_space = {"max_m": {"uniform": [0.1, 0.7]}}  # around the paper's 0.5 (docs/methods.md)

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.s = float(cfg.s)
        self.head = NormedLinear(ctx.feature_dim, ctx.num_classes)
        self.register_buffer("margins", ldam_margins(ctx.class_counts, cfg.max_m), persistent=False)
        self.drw = DRW(ctx.class_counts, beta=cfg.beta, drw_epoch=cfg.drw_epoch, epochs=ctx.epochs,
                       enabled=cfg.drw)

    def on_epoch_start(self, epoch):
        self.drw.set_epoch(epoch)

    def loss(self, features, labels, *, epoch):
        cos = self.head(features[0])
        shifted = cos - F.one_hot(labels, self.num_classes).to(cos.dtype) * self.margins[labels].unsqueeze(1)
        out = {"loss": self.drw.loss(self.s * shifted, labels, epoch), "logits": (self.s * cos).detach()}
        if self.drw.enabled:
            out["drw_active"] = torch.tensor(float(self.drw.active))
        return out

    def predict(self, features, *, target_prior=None):
        logits = self.s * self.head(features)
        return logits + self.target_shift(target_prior, logits)


@METHODS.register("ldam_drw", display="LDAM-DRW")
class LDAMDRW(LDAM):
    """LDAM with deferred re-weighting switched on by default (LDAM-DRW)."""

    Config = LDAMDRWConfig
