"""``uniform``: every training image once per epoch, in a random order (instance-balanced sampling).

The order is exactly the one ltbench used before samplers were a registry (``torch.randperm`` with a
generator seeded by (seed, 'order', epoch)), so every run recorded before keeps its batches.
"""

from __future__ import annotations

import numpy as np

from ltbench.registry import SAMPLERS
from ltbench.samplers import Sampler
from ltbench.seeding import derive_seed


def uniform_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of epoch ``epoch``: one generator per (seed, epoch), so no state to checkpoint."""
    import torch  # here, not at the top: recipes resolve samplers on login nodes without torch

    gen = torch.Generator().manual_seed(derive_seed(seed, "order", epoch))
    return torch.randperm(n, generator=gen).numpy()


@SAMPLERS.register("uniform")
class Uniform(Sampler):
    """Each image once per epoch (instance-balanced: class c drawn with probability n_c / n)."""

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        return uniform_order(len(self.ctx.labels), seed, epoch)

    def class_probabilities(self, epoch: int) -> np.ndarray:
        counts = self.ctx.class_counts.astype(np.float64)
        return counts / counts.sum()
