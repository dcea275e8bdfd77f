"""Classifier layers shared by several built-in methods."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class NormedLinear(nn.Module):
    """LDAM's cosine layer: returns the raw cosine between features and class weights (float32).

    Computed with autocast disabled: with s = 30 a bf16 cosine would move logits by ~0.1.
    """

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.weight.data.uniform_(-1, 1).renorm_(2, 1, 1e-5).mul_(1e5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            return F.normalize(x.float(), dim=1) @ F.normalize(self.weight.float(), dim=0)


@torch.no_grad()
def class_weight_norms(head: nn.Module) -> list[float]:
    """||w_y|| per class of a linear (weight: classes x features) or NormedLinear (features x classes) head.

    Recorded in result.json beside BAPE's kappa (the paper's Figure 3 shape): under plain CE these norms grow
    with class frequency, the bias that logit adjustment and cosine classifiers remove."""
    weight = head.weight.float()
    return weight.norm(dim=0 if isinstance(head, NormedLinear) else 1).cpu().tolist()
