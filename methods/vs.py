"""Vector-scaling (VS) loss (Kini, Paraskevas, Oymak, Thrampoulidis, "Label-Imbalanced and Group-Sensitive
Classification under Overparameterization", NeurIPS 2021).

As ``VSLoss`` in orparask/VS-Loss (class_imbalance/losses.py; compared in docs/protocols.md §8), with
n_j the training counts and π_j = n_j / Σn:

    Δ_j = (n_max / n_j)**γ        multiplicative adjustment, = n_j^-γ / min_k n_k^-γ (1 for the largest class)
    ι_j = τ · log π_j             additive adjustment (logit adjustment's)
    L   = CE_w(z / Δ + ι, y)

γ = 0 gives the logit-adjusted loss, τ = 0 CDT's multiplicative loss alone. ``w`` are optional DRW weights
(the official ``--train_rule DRW``: effective-number weights with β = 0.9999 from epoch 160 of 200; off by
default, as the official default ``--train_rule None``).

Prediction: the official code evaluates the argmax of the raw logits z (the adjustments are training-time
only), so ``predict`` returns z, treated as balanced scores, plus log(K·p_t) for a target prior p_t (as LDAM).
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


def vs_adjustments(class_counts: torch.Tensor, gamma: float, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(Δ, ι) in float32, computed in float64: Δ_j = (n_max/n_j)**γ, ι_j = τ·log(n_j/Σn); empty classes count as 1."""
    counts = torch.as_tensor(class_counts, dtype=torch.float64).clamp_min(1.0)
    delta = (1.0 / counts) ** gamma
    delta = delta / delta.min()
    iota = tau * torch.log(counts / counts.sum())
    return delta.float(), iota.float()


@dataclass
class VSConfig:
    gamma: float = 0.3  # multiplicative exponent (the official argparse default; README CIFAR-10-LT example: 0.2)
    tau: float = 1.0  # additive (logit-adjustment) temperature (official default; README CIFAR-10-LT example: 1.2)
    drw: bool = False  # deferred re-weighting (official --train_rule DRW)
    drw_epoch: int | None = None  # 0-indexed switch epoch; None: round(0.8 * epochs)
    beta: float = 0.9999  # effective-number beta of the DRW weights
    views: list[str] | None = None  # default: one 'default' view

    def validate(self) -> None:
        check_range("gamma", self.gamma, 0, 10)
        check_range("tau", self.tau, 0, 100)
        check_range("beta", self.beta, 0, 1, high_open=True)
        check_range("drw_epoch", self.drw_epoch, 0, MAX_EPOCHS)
        check_views(self.views)


@METHODS.register("vs", display="VS")
class VectorScaling(Method):
    """CE_w(z/Δ + ι, y) on a linear head; predicts z + log(K·p_t) (module doc)."""

    Config = VSConfig
    search_space = {"gamma": {"uniform": [0.05, 0.4]}, "tau": {"uniform": [0.5, 1.5]}}  # official defaults and README (docs/methods.md)

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)
        nn.init.kaiming_normal_(self.head.weight)
        delta, iota = vs_adjustments(ctx.class_counts, cfg.gamma, cfg.tau)
        self.register_buffer("delta", delta, persistent=False)
        self.register_buffer("iota", iota, persistent=False)
        self.drw = DRW(ctx.class_counts, beta=cfg.beta, drw_epoch=cfg.drw_epoch, epochs=ctx.epochs,
                       enabled=cfg.drw)

    def on_epoch_start(self, epoch):
        self.drw.set_epoch(epoch)

    def loss(self, features, labels, *, epoch):
        logits = self.head(features[0])
        adjusted = logits / self.delta.to(logits.dtype) + self.iota.to(logits.dtype)
        out = {"loss": self.drw.loss(adjusted, labels, epoch), "logits": logits.detach()}
        if self.drw.enabled:
            out["drw_active"] = torch.tensor(float(self.drw.active))
        return out

    def predict(self, features, *, target_prior=None):
        logits = self.head(features)
        return logits + self.target_shift(target_prior, logits)

    def result_extras(self) -> dict:
        return {"weight_norm": class_weight_norms(self.head), "vs_delta": self.delta.tolist(),
                "vs_iota": self.iota.tolist()}
