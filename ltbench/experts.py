"""Several experts on one registered backbone: shared early stages, each expert its own later stages.

RIDE (Wang et al., ICLR 2021), SADE (Zhang et al., NeurIPS 2022), NCL and BalPoE share this shape: one
trunk computed once per image, then E branches, each ending in its own features and head. A method that
wants it returns ``MultiExpert(backbone, num_experts, expert_stages, expert_width)`` from ``Method.build_model``; the
engine then trains, checkpoints and evaluates that network in the backbone's place, and the method's
``loss`` / ``predict`` receive the experts' features side by side, (N, E * d), which ``split_experts``
cuts back into E tensors of (N, d). The core knows nothing about any particular method: it only asks the
backbone for ``stages()`` (and ``expert_branch()`` for narrower experts; docs/adding-a-backbone.md) and
the method for ``build_model``.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn


class MultiExpert(nn.Module):
    """``num_experts`` branches of a backbone's last ``expert_stages`` stages on one shared trunk.

    At full width (``expert_width`` 1) expert 0 keeps the backbone's own (already initialised) stages and
    experts 1.. are deep copies that the backbone re-initialises (``init_stage``), so the experts start from
    different weights as in RIDE/SADE, where every expert branch is initialised independently. At another
    width every expert is a fresh branch from ``backbone.expert_branch`` (RIDE's and SADE's
    ``reduce_dimension`` is 0.75: the official SADE CIFAR experts have 24/48 channels where ResNet-32 has
    32/64) and the backbone's own later stages are dropped. ``feature_dim`` is ``num_experts * expert_dim``.
    """

    def __init__(self, backbone: nn.Module, num_experts: int, expert_stages: int, expert_width: float = 1.0):
        super().__init__()
        stages = list(backbone.stages())
        if not 1 <= expert_stages < len(stages):
            raise ValueError(f"expert_stages must be 1 to {len(stages) - 1} for {type(backbone).__name__} "
                             f"({len(stages)} stages), got {expert_stages}")
        if num_experts < 1:
            raise ValueError(f"num_experts must be >= 1, got {num_experts}")
        self.shared = nn.Sequential(*stages[:-expert_stages])
        if expert_width == 1.0:
            branch = nn.Sequential(*stages[-expert_stages:])
            copies = [copy.deepcopy(branch) for _ in range(num_experts - 1)]
            for c in copies:
                backbone.init_stage(c)
            branches, expert_dim = [branch, *copies], int(backbone.feature_dim)
        else:
            built = [backbone.expert_branch(expert_stages, expert_width) for _ in range(num_experts)]
            branches, expert_dim = [b for b, _ in built], int(built[0][1])
        self.experts = nn.ModuleList(branches)
        self.num_experts, self.expert_dim = int(num_experts), expert_dim
        self.feature_dim = self.num_experts * self.expert_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        trunk = self.shared(x)
        return torch.cat([expert(trunk) for expert in self.experts], dim=1)


def split_experts(features: torch.Tensor, num_experts: int) -> list[torch.Tensor]:
    """(N, E * d) features of a MultiExpert -> E tensors (N, d), expert 0 first."""
    if features.shape[1] % num_experts:
        raise ValueError(f"features of width {features.shape[1]} do not split into {num_experts} experts")
    return list(features.chunk(num_experts, dim=1))
