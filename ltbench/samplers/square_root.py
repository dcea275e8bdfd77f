"""``square_root``: class c drawn with probability proportional to sqrt(n_c) (Kang et al. 2020, q = 1/2;
Mahajan et al. 2018 used it for hashtag pre-training): half way, on a log scale, between
instance-balanced and class-balanced sampling."""

from __future__ import annotations

import numpy as np

from ltbench.registry import SAMPLERS
from ltbench.samplers import ClassLawSampler, power_law


@SAMPLERS.register("square_root")
class SquareRoot(ClassLawSampler):
    """Class drawn with probability proportional to n_c^(1/2), then an image of it."""

    def class_probabilities(self, epoch: int) -> np.ndarray:
        return power_law(self.ctx.class_counts, 0.5)
