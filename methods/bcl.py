"""BCL: balanced contrastive learning (class-averaging, class-complement) beside logit compensation.

Paper: Zhu, Wang, Chen, Chen, Jiang, "Balanced Contrastive Learning for Long-Tailed Visual Recognition"
(CVPR 2022); official code FlamieZhu/Balanced-Contrastive-Learning (``loss/contrastive.py`` BalSCL,
``models/resnext.py`` BCLModel, ``loss/logitadjust.py``).

* Logit compensation: the classifier branch is trained with CE(z + τ log π, y) (τ = 1) on the first view.
* Class-complement: the K class centres c_y = normalize(MLP_c(w_y)), with w_y the classifier's class
  vectors, join the batch's 2B projected features z (two contrastive views), so every class appears.
* Class-averaging: for anchor i (one of the 2B features) with class y_i, every other sample j of class c
  enters the denominator divided by |B_c|, the count of class c among the 2B features and K centres
  (minus one, the anchor itself, when c = y_i):
      L_i = -1/|P_i| Σ_{p∈P_i} log [ exp(z_i·z_p/T) / Σ_{j≠i} exp(z_i·z_j/T) / |B_{y_j}| ],
  P_i the other features and the centre of class y_i. L_BCL is the mean over the 2B anchors.
Total: alpha · LA-CE + beta · L_BCL; prediction: the classifier alone (balanced scores, + log(K p_t)).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F

from ltbench.config import check_range, check_views
from ltbench.method import Method
from ltbench.registry import METHODS

from ._heads import class_weight_norms
from ._twobranch import TwoBranch, class_weights_by_row, projection_mlp


@dataclass
class BCLConfig:
    alpha: float = 1.0
    """Weight of the logit-adjusted CE (official --alpha, 1.0)."""
    beta: float = 0.35
    """Weight of the BCL loss (official --beta, 0.35)."""
    temperature: float = 0.07
    """T of the contrastive logits (official --temp, 0.07)."""
    proj_dim: int = 1024
    """Output of both projection MLPs (official --feat_dim default 1024; its code configures only ImageNet-LT/iNat)."""
    hidden_dim: int | None = None
    """Hidden width of both MLPs; None: the backbone's feature width (official: dim_in)."""
    tau: float = 1.0
    """Prior exponent of the logit compensation (official LogitAdjust, tau 1)."""
    head: Literal["linear", "cosine"] = "cosine"
    """Classifier: s * cosine (official default --use_norm True) or linear."""
    s: float = 30.0
    """Scale of the cosine classifier (official NormedLinear, 30)."""
    views: list[str] = field(default_factory=lambda: ["strong", "sim", "sim"])
    """The classifier's view, then exactly two contrastive views (official: RandAugment, sim, sim)."""

    def validate(self) -> None:
        check_range("alpha", self.alpha, 0, 1000)
        check_range("beta", self.beta, 0, 1000)
        check_range("temperature", self.temperature, 0, 100, low_open=True)
        check_range("proj_dim", self.proj_dim, 1, 65536)
        check_range("hidden_dim", self.hidden_dim, 1, 65536)
        check_range("tau", self.tau, 0, 100)
        check_range("s", self.s, 0, 1000, low_open=True)
        check_views(self.views)
        if len(self.views) != 3:
            raise ValueError(f"views: BCL takes the classifier's view and two contrastive views (3 names), "
                             f"got {len(self.views)}: {self.views}")


def class_counts_in_batch(targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    """|B_c|: how often class c occurs among the 2B features and the K centres (every class >= 1)."""
    # index_add_, not bincount: on CUDA bincount reads the largest label on the host (a sync per step)
    ones = torch.ones_like(targets, dtype=torch.float32)
    return torch.zeros(num_classes, device=targets.device).index_add_(0, targets, ones)


def bcl_loss(centers: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor, labels: torch.Tensor,
             temperature: float) -> torch.Tensor:
    """L_BCL (module doc) for unit features of two views (B, d) and unit class centres (K, d)."""
    k, b = centers.shape[0], len(labels)
    targets = torch.cat([labels, labels, torch.arange(k, device=labels.device)])
    feats = torch.cat([z1, z2, centers])
    anchors = feats[:2 * b]
    same = (labels.repeat(2)[:, None] == targets[None, :]).float()
    not_self = torch.ones_like(same)
    not_self.fill_diagonal_(0.0)  # (i, i) for i < 2B; host index tensors would be copied every step
    positives = same * not_self
    logits = anchors @ feats.T / temperature
    logits = logits - logits.max(dim=1, keepdim=True).values.detach()  # the official stabiliser
    per_sample = class_counts_in_batch(targets, k)[targets][None, :] - positives  # class-averaging weights
    denominator = (logits.exp() * not_self / per_sample).sum(dim=1, keepdim=True)
    log_prob = logits - denominator.log()
    mean_log_prob_pos = (positives * log_prob).sum(1) / positives.sum(1)
    return -mean_log_prob_pos.mean()


@METHODS.register("bcl", display="BCL")
class BCL(Method):
    """Logit-adjusted classifier + balanced contrastive loss with class centres (module doc)."""

    Config = BCLConfig
    search_space = {"beta": {"uniform": [0.1, 0.6]}, "temperature": {"log_uniform": [0.05, 0.2]}}  # around the official 0.35, 0.07 (docs/methods.md)

    def __init__(self, cfg: BCLConfig, ctx):
        super().__init__(cfg, ctx)
        hidden = cfg.hidden_dim or ctx.feature_dim
        self.branches = TwoBranch(ctx, cfg.head, cfg.s, hidden, cfg.proj_dim, cfg.tau)
        self.center_mlp = projection_mlp(ctx.feature_dim, hidden, cfg.proj_dim)  # official head_fc

    def centers(self) -> torch.Tensor:
        """Class-complement centres: normalize(MLP_c(w_y)), one per class, differentiable w.r.t. the classifier."""
        w = class_weights_by_row(self.branches.head).float()
        with torch.autocast(device_type=w.device.type, enabled=False):
            return F.normalize(self.center_mlp(w), dim=1)

    def loss(self, features, labels, *, epoch):
        cfg = self.cfg
        if len(features) != 3:
            raise ValueError(f"bcl: expected 3 views of features, got {len(features)}")
        b = len(labels)
        logits = self.branches.head(features[0])
        loss_ce = self.branches.la_loss(logits, labels)
        _, z1, z2 = self.branches.project(torch.cat(list(features))).split(b)  # BatchNorm over all views
        loss_bcl = bcl_loss(self.centers(), z1, z2, labels, cfg.temperature)
        return {"loss": cfg.alpha * loss_ce + cfg.beta * loss_bcl, "logits": logits.detach(),
                "loss_ce": loss_ce.detach(), "loss_bcl": loss_bcl.detach()}

    def predict(self, features, *, target_prior=None):
        z = self.branches.head(features)
        return z + self.target_shift(target_prior, z)

    @torch.no_grad()
    def result_extras(self) -> dict:
        head = self.branches.head
        return {"weight_norm": class_weight_norms(head.cos if hasattr(head, "cos") else head)}
