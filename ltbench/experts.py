"""Several experts on one registered backbone: shared early stages, each expert its own later stages.

RIDE, SADE, NCL and BalPoE share this shape: one trunk computed once per image, then E branches with their own
features and heads. A method returns a ``MultiExpert`` from ``Method.build_model``; the engine uses it in the
backbone's place, and ``loss`` / ``predict`` receive the experts' features side by side, (N, E * d), which
``split_experts`` cuts back. The core names no method: it asks the backbone for ``stages()`` (and
``expert_branch()`` for narrower experts; docs/adding-a-backbone.md).
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn


class MultiExpert(nn.Module):
    """``num_experts`` branches of a backbone's last ``expert_stages`` stages on one shared trunk.

    At full width expert 0 keeps the backbone's own stages and experts 1.. are copies the backbone
    re-initialises (``init_stage``), so the experts start from different weights as in RIDE/SADE. At another
    width (RIDE's and SADE's ``reduce_dimension``, 0.75) every expert is a fresh ``backbone.expert_branch``."""

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
