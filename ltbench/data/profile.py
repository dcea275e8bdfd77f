"""Long-tail profiles: the exponential decay, per-class counts, the LDAM-DRW subset.

The subset procedure reproduces kaidic/LDAM-DRW ``imbalance_cifar.py`` bit for bit (legacy global
NumPy RNG seeded once, per-class shuffle in label order, first n kept), because every CIFAR-LT
paper reuses that exact subset. The global RNG state is restored afterwards so nothing else in the
process is disturbed.
"""

from __future__ import annotations

import hashlib

import numpy as np


def exponential_decay(position, num_classes: int, imb_factor: float):
    """(1/rho) ** (position / (C - 1)): the one exponential long-tail formula, shared by the training
    profile (LDAM-DRW), the shifted test sets and the shifted test priors (LADE/SADE). ``position``
    (an int or a NumPy array) runs 0..C-1, head first; C must be at least 2."""
    return (1.0 / imb_factor) ** (position / (num_classes - 1))


def exponential_counts(n_max: int, num_classes: int, imb_factor: float) -> list[int]:
    """n_i = int(n_max * (1/rho) ** (i / (C - 1))), truncated toward zero as in LDAM-DRW."""
    if imb_factor < 1:
        raise ValueError(f"imb_factor must be >= 1 (rho = n_max / n_min), got {imb_factor}")
    if num_classes == 1:
        return [int(n_max)]
    return [int(n_max * exponential_decay(i, num_classes, imb_factor)) for i in range(num_classes)]


def ldam_subset(targets: np.ndarray, counts: list[int], seed: int = 0) -> np.ndarray:
    """Indices of the LDAM-DRW long-tailed subset, grouped by class (class 0 first)."""
    targets = np.asarray(targets)
    saved = np.random.get_state()
    try:
        np.random.seed(seed)
        keep = []
        for c, n in enumerate(counts):
            idx = np.where(targets == c)[0]
            if len(idx) < n:
                raise ValueError(f"class {c} has {len(idx)} images, fewer than the {n} the profile asks for")
            np.random.shuffle(idx)
            keep.append(idx[:n])
    finally:
        np.random.set_state(saved)
    return np.concatenate(keep).astype(np.int64) if keep else np.zeros(0, dtype=np.int64)


def subset_hash(indices: np.ndarray) -> str:
    """sha1 of the chosen indices (int64, in order): which images a run trained on."""
    return hashlib.sha1(np.asarray(indices, dtype=np.int64).tobytes()).hexdigest()

