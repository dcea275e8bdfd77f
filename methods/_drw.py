"""Deferred re-weighting (DRW, Cao et al. 2019), as a piece any method can use.

Class-balanced "effective number" weights (Cui et al. 2019), as in kaidic/LDAM-DRW ``cifar_train.py``:
w_j = (1 - beta) / (1 - beta ** n_j), then w <- w * C / sum(w), switched on at epoch ``switch_epoch``
(0-indexed; LDAM-DRW: 160 of 200). The weighted cross-entropy divides by the batch's weight sum, as torch's
``F.cross_entropy(weight=w)`` does (docs/protocols.md §3). The weights are a function of the epoch only, so
there is nothing to checkpoint. Private module: the ``methods`` package does not register it as a method.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ltbench.errors import ConfigError
from ltbench.method import missed_epoch_start

LDAM_DRW_FRACTION = 0.8  # LDAM-DRW switches at epoch 160 of 200


def drw_weights(class_counts: torch.Tensor | Sequence[int], beta: float) -> torch.Tensor:
    """Effective-number class weights, normalised to sum to the number of classes (float32).

    ``beta = 0`` gives all ones. A class with no training image is treated as having one (its weight only
    matters through the normalisation, since it never occurs as a label).
    """
    if not 0.0 <= beta < 1.0:
        raise ConfigError(f"DRW beta must be in [0, 1), got {beta}")
    counts = torch.as_tensor(class_counts, dtype=torch.float64).clamp_min(1.0)
    weights = (1.0 - beta) / (1.0 - torch.pow(torch.tensor(beta, dtype=torch.float64), counts))
    weights = weights * len(counts) / weights.sum()
    return weights.float()


def weighted_ce(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """Class-weighted cross-entropy, mean = sum_i w_{y_i} l_i / sum_i w_{y_i} (torch's weighted mean)."""
    return F.cross_entropy(logits, labels, weight=None if weights is None else weights.to(logits.dtype))


def resolve_switch_epoch(drw_epoch: int | None, epochs: int) -> int:
    """The configured switch epoch, or LDAM-DRW's 80 % of the schedule (160 of 200) when None."""
    if drw_epoch is None:
        return int(round(LDAM_DRW_FRACTION * epochs))
    if drw_epoch < 0:
        raise ConfigError(f"method.drw_epoch must be >= 0, got {drw_epoch}")
    return int(drw_epoch)


class DRW(nn.Module):
    """Epoch-switched class weights for a weighted cross-entropy.

    ``weights`` (a non-persistent buffer, so it follows the method to its device) holds the weights of the
    current epoch: all ones before ``switch_epoch`` (or always, when ``enabled`` is False), the
    effective-number weights from ``switch_epoch`` on.
    """

    def __init__(self, class_counts: torch.Tensor, *, beta: float, drw_epoch: int | None, epochs: int,
                 enabled: bool = True):
        super().__init__()
        self.enabled = enabled
        self.beta = beta
        self.switch_epoch = resolve_switch_epoch(drw_epoch, epochs)
        k = len(class_counts)
        self.register_buffer("balanced", drw_weights(class_counts, beta) if enabled else torch.ones(k),
                             persistent=False)
        self.register_buffer("weights", torch.ones(k), persistent=False)
        self.epoch: int | None = None
        # Whether the weights are on this epoch: a bool the loss branches on, so a compiled loss is specialised
        # twice (before and after the switch), not once per epoch as a branch on ``epoch`` would be.
        self.active = False

    def active_at(self, epoch: int) -> bool:
        return self.enabled and epoch >= self.switch_epoch

    def weights_at(self, epoch: int) -> torch.Tensor:
        return self.balanced if self.active_at(epoch) else torch.ones_like(self.balanced)

    def set_epoch(self, epoch: int) -> None:
        with torch.no_grad():
            self.weights.copy_(self.weights_at(epoch))
        self.epoch, self.active = epoch, self.active_at(epoch)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, epoch: int) -> torch.Tensor:
        if missed_epoch_start(self.epoch, epoch):  # on_epoch_start was not called for this epoch (a direct call)
            self.set_epoch(epoch)
        # Before the switch the weights are all ones: plain (unweighted) cross-entropy, computed as such.
        return weighted_ce(logits, labels, self.weights if self.active else None)
