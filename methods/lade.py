"""LADE: label distribution disentangling (Hong, Han, Choi, Cho, Yoo, Kim, "Disentangling Label Distribution
for Long-tailed Visual Recognition", CVPR 2021), with its post-hoc prior.

As hyperconnect/LADE (``loss/PriorCELoss.py``, ``loss/LADELoss.py``, ``run_networks.py``; compared in
docs/protocols.md §8). With π the training prior, z the (N, K) logits of a batch, N_j the batch's images of
class j, and the official constants 1e-9 and 1e-8:

    LADE-CE:  L_CE = CE(z + log(π + 1e-9), y)                                (the PriorCE loss)
    LADER:    T_j  = Σ_{i: y_i = j} z_ij / (N_j + 1e-8)
              S_j  = logsumexp_i (z_ij - log(π_j + 1e-9) + log(1/K + 1e-9)) - log N
              R    = -Σ_j π_j (T_j - S_j - λ S_j²)
    loss:     L_CE + α R        (α = 0.1, λ = 0.1 in the official config files; the README's commands
                                 override them: CIFAR-100-LT α 0.1, λ 0.01; ImageNet-LT α 0.05, λ 0.5)

R is the regularised DV (ReMINE) lower bound of the KL divergence between p(x|y) and the balanced data
distribution, weighted by π; as officially, a class absent from the batch still enters through -S_j - λS_j².

Post-hoc prior: the logits z estimate log p(x|y) up to a per-sample constant (the label distribution was
disentangled by L_CE), so the official evaluation adds the log of the test split's class prior to z.
``predict`` does the same through ``target_shift``: z + log(K·p_t), which is z for a uniform prior.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ltbench.config import check_range, check_views
from ltbench.method import Method
from ltbench.registry import METHODS

from ._heads import class_weight_norms


def lade_regulariser(logits: torch.Tensor, labels: torch.Tensor, prior: torch.Tensor,
                     remine_lambda: float) -> torch.Tensor:
    """LADER, R of the module doc (the official ``LADELoss.forward``)."""
    batch, k = logits.shape
    onehot = F.one_hot(labels, k).to(logits.dtype)
    first = (logits * onehot).sum(0) / (onehot.sum(0) + 1e-8)
    spread = logits - torch.log(prior + 1e-9) + math.log(1.0 / k + 1e-9)
    second = torch.logsumexp(spread, dim=0) - math.log(batch)
    bound = first - second - remine_lambda * second ** 2
    return -(bound * prior).sum()


@dataclass
class LADEConfig:
    alpha: float = 0.1
    """Weight of LADER (the official config files' RouteWeightLoss weight; README: 0.1 CIFAR-100, 0.05 ImageNet-LT)."""
    remine_lambda: float = 0.1
    """ReMINE λ of the bound (official config files 0.1; README commands: 0.01 CIFAR-100, 0.5 ImageNet-LT)."""
    views: list[str] | None = None
    """Training view (default: the dataset's 'default' view)."""

    def validate(self) -> None:
        check_range("alpha", self.alpha, 0, 100)
        check_range("remine_lambda", self.remine_lambda, 0, 100)
        check_views(self.views)


@METHODS.register("lade", display="LADE")
class LADE(Method):
    """LADE-CE + α·LADER on a linear head; predicts z + log(K·p_t) (module doc)."""

    Config = LADEConfig
    search_space = {"alpha": {"log_uniform": [0.02, 0.5]}, "remine_lambda": {"log_uniform": [0.005, 1.0]}}  # official values inside (docs/methods.md)

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)
        nn.init.kaiming_normal_(self.head.weight)
        self.register_buffer("prior", ctx.train_prior.clone(), persistent=False)

    def loss(self, features, labels, *, epoch):
        logits = self.head(features[0])
        prior = self.prior.to(logits.dtype)
        prior_ce = F.cross_entropy(logits + torch.log(prior + 1e-9), labels)
        regulariser = lade_regulariser(logits, labels, prior, self.cfg.remine_lambda)
        loss = prior_ce + self.cfg.alpha * regulariser
        return {"loss": loss, "logits": logits.detach(), "prior_ce": prior_ce.detach(),
                "lader": regulariser.detach()}

    def predict(self, features, *, target_prior=None):
        logits = self.head(features)
        return logits + self.target_shift(target_prior, logits)

    def result_extras(self) -> dict:
        return {"weight_norm": class_weight_norms(self.head)}
