"""``progressive``: progressively-balanced sampling (Kang et al. 2020, eq. 2):

    p_c(t) = (1 - t / T) * n_c / n + (t / T) * 1 / K

at epoch t = 0 .. T-1 of a T-epoch schedule: instance-balanced at the start, moving linearly towards
class-balanced (the last epoch is (T-1)/T of the way; Kang et al. write t/T with t counted from 0).
"""

from __future__ import annotations

import numpy as np

from ltbench.registry import SAMPLERS
from ltbench.samplers import ClassLawSampler, power_law


@SAMPLERS.register("progressive")
class Progressive(ClassLawSampler):
    """From instance-balanced (epoch 0) linearly towards class-balanced over the schedule."""

    def class_probabilities(self, epoch: int) -> np.ndarray:
        t = epoch / self.ctx.epochs
        counts = self.ctx.class_counts
        return (1.0 - t) * power_law(counts, 1.0) + t * power_law(counts, 0.0)
