"""Class-balanced loss (Cui, Jia, Lin, Song, Belongie, "Class-Balanced Loss Based on Effective Number of
Samples", CVPR 2019), over softmax, sigmoid or focal loss.

As richardaecn/class-balanced-loss (TensorFlow, ``src/cifar_main.py`` and ``src/model_base.py``; compared in
docs/protocols.md §8), with n_j the training counts, B the batch size and K the number of classes:

    w_j = (1 - β) / (1 - β**n_j),  then  w <- w · K / Σw           (``_drw.drw_weights``)
    softmax:  L = Σ_i w_{y_i} CE(z_i, y_i) / B
    sigmoid:  L = Σ_i Σ_j w_{y_i} BCE(z_ij, [j = y_i]) / B
    focal:    L = Σ_i Σ_j w_{y_i} m_ij BCE(z_ij, [j = y_i]) / B,   m_ij = (1 - p_t)**γ, p = sigmoid(z)

Note the batch normalisation: every reduction divides by B (TensorFlow's SUM_BY_NONZERO_WEIGHTS for softmax,
"number of positive labels" for sigmoid / focal), not by Σ_i w_{y_i} as torch's weighted cross-entropy (and
DRW) does. With sigmoid or focal the official classifier's bias starts at -log(K - 1) (the paper's prior
π = 1/K for the rare positives) and is exempt from weight decay; both are reproduced.

The focal modulator is computed as exp(-γ·y·z - γ·softplus(-z)), the official numerically stable form with
softplus in place of log1p(exp(-z)): the official form overflows for z < -88 in float32 and then gives a
modulator of 0 instead of 1 for a positive label (docs/protocols.md §8 has the numbers).

Prediction: the official code predicts the argmax of the raw logits for all three losses; ``predict``
returns z, treated as balanced scores (the weights aim for that), plus log(K·p_t) for a target prior p_t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from ltbench.config import check_range, check_views
from ltbench.method import Method
from ltbench.registry import METHODS

from ._drw import drw_weights
from ._heads import class_weight_norms


def class_balanced_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, loss_type: str,
                        gamma: float) -> torch.Tensor:
    """The CB loss of one batch (module doc); ``weights`` are the per-class w_j."""
    per_sample = weights.to(logits.dtype)[labels]  # w_{y_i}
    batch = logits.shape[0]
    if loss_type == "softmax":
        return (per_sample * F.cross_entropy(logits, labels, reduction="none")).sum() / batch
    onehot = F.one_hot(labels, logits.shape[1]).to(logits.dtype)
    bce = F.binary_cross_entropy_with_logits(logits, onehot, reduction="none")
    if loss_type == "focal" and gamma != 0.0:
        bce = torch.exp(-gamma * onehot * logits - gamma * F.softplus(-logits)) * bce
    return (per_sample[:, None] * bce).sum() / batch


@dataclass
class CBConfig:
    beta: float = 0.9999
    """Effective-number beta (0: plain, unweighted loss; the official scripts use 0.9999, its flag 0)."""
    loss_type: Literal["softmax", "sigmoid", "focal"] = "softmax"
    """Loss the weights multiply (official --loss-type default 'softmax'; CB-Focal is 'focal')."""
    gamma: float = 1.0
    """Focal-loss exponent, loss_type focal only (official --gamma 1.0)."""
    views: list[str] | None = None
    """Training view (default: the dataset's 'default' view)."""

    def validate(self) -> None:
        check_range("beta", self.beta, 0, 1, high_open=True)
        check_range("gamma", self.gamma, 0, 10)
        check_views(self.views)


@METHODS.register("cb", display="CB")
class ClassBalanced(Method):
    """Class-balanced softmax / sigmoid / focal loss on a linear head; predicts z + log(K·p_t) (module doc)."""

    Config = CBConfig
    search_space = {"beta": {"choice": [0.9, 0.99, 0.999, 0.9999]}}  # the paper's grid (docs/methods.md)

    @classmethod
    def idle_options(cls, cfg):
        if cfg.loss_type == "focal":
            return {}
        return {"gamma": f"{cfg.gamma} has no effect: the focal exponent is read by loss_type focal only (here "
                         f"{cfg.loss_type}); remove it or set method.loss_type: focal"}

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)
        nn.init.kaiming_normal_(self.head.weight)
        if cfg.loss_type != "softmax" and ctx.num_classes > 1:
            nn.init.constant_(self.head.bias, -math.log(ctx.num_classes - 1))
        self.register_buffer("weights", drw_weights(ctx.class_counts, cfg.beta), persistent=False)

    def param_groups(self):
        """Sigmoid / focal: the classifier bias (initialised to the prior) is not decayed, as officially."""
        if self.cfg.loss_type == "softmax":
            return None
        return [{"params": [self.head.bias], "weight_decay": 0.0}]

    def loss(self, features, labels, *, epoch):
        logits = self.head(features[0])
        loss = class_balanced_loss(logits, labels, self.weights, self.cfg.loss_type, self.cfg.gamma)
        return {"loss": loss, "logits": logits.detach()}

    def predict(self, features, *, target_prior=None):
        logits = self.head(features)
        return logits + self.target_shift(target_prior, logits)

    def result_extras(self) -> dict:
        return {"weight_norm": class_weight_norms(self.head), "cb_weights": self.weights.tolist()}
