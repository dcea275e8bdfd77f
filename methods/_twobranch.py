"""What ProCo and BCL share: a logit-adjusted classifier branch beside a contrastive projection branch.

Both official codebases (LeapLabTHU/ProCo, FlamieZhu/Balanced-Contrastive-Learning) train a classifier
head on the first view with the logit-adjusted loss CE(z + τ log π, y) (their ``LogitAdjust``, τ = 1) and a
contrastive loss on the projected, unit-normalised features of the other views; both predict with the
classifier alone. Only the contrastive loss differs, so it is all each method file adds.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .la import _ScaledCosine, log_prior_adjustment


def classifier_head(feature_dim: int, num_classes: int, head: str, s: float) -> nn.Module:
    """'linear': nn.Linear with a Kaiming-normal weight (as ``ce``/``la``); 'cosine': s·cos(h, w_y), the
    NormedLinear the official ImageNet-LT configs use (``use_norm``)."""
    if head == "cosine":
        return _ScaledCosine(feature_dim, num_classes, s)
    linear = nn.Linear(feature_dim, num_classes)
    nn.init.kaiming_normal_(linear.weight)
    return linear


def projection_mlp(feature_dim: int, hidden_dim: int, out_dim: int) -> nn.Sequential:
    """Linear, BatchNorm, ReLU, Linear: the projection head of both codebases (and BAPE's)."""
    return nn.Sequential(nn.Linear(feature_dim, hidden_dim), nn.BatchNorm1d(hidden_dim), nn.ReLU(inplace=True),
                         nn.Linear(hidden_dim, out_dim))


def class_weights_by_row(head: nn.Module) -> torch.Tensor:
    """The classifier's class vectors as rows (K, d), whichever head: BCL feeds them to its centre MLP."""
    if isinstance(head, _ScaledCosine):
        return head.cos.weight.T
    return head.weight


class TwoBranch(nn.Module):
    """Classifier head + projection MLP; ``la_loss`` is the official ``LogitAdjust``: CE(z + τ log π, y)."""

    def __init__(self, ctx, head: str, s: float, hidden_dim: int, proj_dim: int, tau: float):
        super().__init__()
        self.head = classifier_head(ctx.feature_dim, ctx.num_classes, head, s)
        self.proj = projection_mlp(ctx.feature_dim, hidden_dim, proj_dim)
        self.register_buffer("log_prior_tau", log_prior_adjustment(ctx.train_prior, tau), persistent=False)

    def la_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits + self.log_prior_tau.to(logits.dtype), labels)

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """Unit-norm projections, float32 (the contrastive losses divide by small temperatures)."""
        with torch.autocast(device_type=h.device.type, enabled=False):
            return F.normalize(self.proj(h.float()), dim=1)
