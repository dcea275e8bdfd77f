"""``class_balanced``: a class uniformly at random, then one of its images (Kang et al. 2020, q = 0).

A tail class with 5 images is visited as often as a head class with 500, so its images repeat about
100 times per epoch while most head images are not seen at all in a given epoch.
"""

from __future__ import annotations

import numpy as np

from ltbench.registry import SAMPLERS
from ltbench.samplers import ClassLawSampler, power_law


@SAMPLERS.register("class_balanced")
class ClassBalanced(ClassLawSampler):
    """Class drawn uniformly (over classes with training images), then an image of it."""

    def class_probabilities(self, epoch: int) -> np.ndarray:
        return power_law(self.ctx.class_counts, 0.0)
