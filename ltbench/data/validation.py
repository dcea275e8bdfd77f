"""Validation splits: images to choose on (an epoch, tau, a stage-2 setting) that are neither trained on nor
the test set, since selection on the test set is the most frequent complaint about long-tailed codebases
(docs/protocol.md). Datasets built from a balanced pool (CIFAR-LT, Fashion-MNIST-LT) draw a balanced
validation set from the unused images: the published subset is drawn first, exactly as before, and the
validation draw uses its own generator (never the legacy global NumPy RNG the LDAM-DRW subset depends on).
"""

from __future__ import annotations

import hashlib

import numpy as np

from ltbench.errors import ConfigError, short_repr
from ltbench.seeding import derive_seed


def declares_validation(data_config: dict) -> bool:
    """Whether a resolved ``data`` section asks for a validation split (the option names every built-in
    dataset uses: ``val_per_class`` or ``val_split``); torch-free, for checks when a recipe is loaded."""
    return bool(data_config.get("val_per_class") or data_config.get("val_split"))


def validation_rng(data_seed: int, purpose: str = "validation") -> np.random.Generator:
    """The generator of a dataset's validation draw: fixed by the data configuration, not the run seed,
    so every run (and every seed) of a dataset is validated on the same images."""
    return np.random.Generator(np.random.PCG64(derive_seed(purpose, data_seed)))


def unused_per_class(labels: np.ndarray, kept: np.ndarray, per_class: int, data_seed: int) -> np.ndarray:
    """Up to ``per_class`` indices of each class among the images the training subset did not keep, drawn
    at random with a fixed seed; grouped by class. A class with fewer unused images gives all it has
    (on CIFAR-LT the head class keeps every image, so it gives none: docs/protocol.md)."""
    labels = np.asarray(labels)
    unused = np.ones(len(labels), dtype=bool)
    unused[np.asarray(kept, dtype=np.int64)] = False
    rng = validation_rng(data_seed)
    picks = []
    for c in range(int(labels.max()) + 1 if len(labels) else 0):
        candidates = np.flatnonzero(unused & (labels == c))  # ascending: the draw depends on the data only
        picks.append(rng.permutation(candidates)[:per_class])
    return np.concatenate(picks).astype(np.int64) if picks else np.zeros(0, dtype=np.int64)


def hold_out(labels: np.ndarray, per_class: int, data_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training indices, validation indices) when a dataset has no unused images (a published training
    list): up to ``per_class`` images of each class are held out, always leaving the class at least one
    training image. This changes the training set, so it is part of the run's configuration."""
    labels = np.asarray(labels)
    rng = validation_rng(data_seed, "held-out validation")
    val = []
    for c in range(int(labels.max()) + 1 if len(labels) else 0):
        members = np.flatnonzero(labels == c)
        take = min(per_class, max(len(members) - 1, 0))
        val.append(rng.permutation(members)[:take])
    val_idx = np.sort(np.concatenate(val)).astype(np.int64) if val else np.zeros(0, dtype=np.int64)
    train_idx = np.setdiff1d(np.arange(len(labels)), val_idx).astype(np.int64)
    return train_idx, val_idx


def counts_record(val_labels: np.ndarray, num_classes: int, asked: int) -> dict:
    """What result.json says about a validation split: its size per class, and the classes short of
    what was asked (so a reader sees, e.g., that CIFAR-LT's head class has no validation image)."""
    counts = np.bincount(np.asarray(val_labels, dtype=np.int64), minlength=num_classes)
    return {"per_class_asked": int(asked), "size": int(counts.sum()),
            "short_classes": [int(c) for c in np.flatnonzero(counts < asked)]}


def sample_ids(dataset) -> list:
    """Each sample's identity: the dataset's ``ids`` (a list file's image paths, an array's (pool, index)),
    else the sha1 of the image a plugin's dataset returns for it (its content is all that names it)."""
    ids = getattr(dataset, "ids", None)
    if ids is not None:
        return list(ids)
    return [hashlib.sha1(np.ascontiguousarray(np.asarray(dataset[i][0])).tobytes()).hexdigest()
            for i in range(len(dataset))]


def check_disjoint(ids: tuple[list, list] | None, where: str) -> None:
    """Refuse, in one line, a validation split that shares a sample with the test set: every choice made on
    validation (a search, --select val, eval.select: best_val, pruning) would then be made on the test set."""
    if ids is None:
        return
    test = set(ids[1])
    shared = [v for v in ids[0] if v in test]
    if shared:
        raise ConfigError(f"{where}: {len(shared)} of the {len(ids[0])} validation samples are test samples (e.g. "
                          f"{short_repr(shared[0], 80)}); choosing on them is choosing on the test set; give a "
                          f"validation split apart from the test set (e.g. data.val_per_class instead of data.val_split)")
