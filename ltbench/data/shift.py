"""Shifted (long-tailed) test sets: the test-agnostic protocol of LADE and SADE (docs/protocols.md §6).

Two constructions exist and give the same per-class counts but different images:

- ``method='sade'`` (SADE ``cifar_data_loaders.py``): the LDAM-DRW constructor of section 1 applied to
  the *test* split. ``img_max = len(test) / C`` (100 for CIFAR-100), classes in label order (which is
  training-frequency order on CIFAR-LT), ``n_i = int(img_max * (1/rho) ** (i / (C-1)))`` ('forward') or
  exponent ``(C-1-i) / (C-1)`` ('backward'), images picked with the legacy global NumPy RNG seeded with
  ``seed`` (0) and shuffled per class. Indices come back grouped by class, class 0 first, as SADE
  stores them. The global RNG state is restored afterwards.
- ``method='lade'`` (LADE notebooks): classes ranked by training count, descending (ties broken by
  label, which LADE's argsort may not do); the k-th class gets ``int(img_max * (1/rho) ** (k/(C-1)))``
  ('backward': exponent ``(C-1-k)/(C-1)``) and keeps its first images in test order. Indices come back
  in test order.

'uniform' is the whole test set, in order. The published ImageNet-LT and
iNat shifted lists (SADE ``data_txt``) are random subsets with the LADE counts: use them directly as
``test_split: forward50`` with the split-list datasets.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np
from torch.utils.data import Subset

from ltbench.data.profile import exponential_decay, ldam_subset
from ltbench.evaluation import parse_prior_name

DIRECTIONS = ("forward", "backward", "uniform")
if TYPE_CHECKING:  # the type only: data/base.py imports this module (DatasetBuilder.test_set)
    from ltbench.data.base import LTData

SHIFT_PROTOCOLS = ("sade", "lade")  # whose shifted test set: SADE's (by label) or LADE's (by count rank)


def shifted_counts(num_classes: int, img_max: float, imb_factor: float, direction: str) -> list[int]:
    """Test images per position (label for 'sade', training-count rank for 'lade')."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
    if imb_factor < 1:
        raise ValueError(f"imb_factor must be >= 1 (rho), got {imb_factor}")
    c = num_classes
    if direction == "uniform" or c == 1:
        return [int(img_max)] * c
    positions = range(c) if direction == "forward" else range(c - 1, -1, -1)
    return [int(img_max * exponential_decay(k, c, imb_factor)) for k in positions]


def shifted_test_indices(
    test_labels,
    train_counts,
    imb_factor: float,
    direction: str,
    seed: int = 0,
    method: str = "sade",
    img_max: float | None = None,
) -> np.ndarray:
    """Indices into the test split of the shifted test set 'forward<rho>' / 'backward<rho>' / 'uniform'.

    ``img_max`` defaults to ``len(test_labels) / C`` (100 on CIFAR-100, 50 on ImageNet-LT).
    """
    labels = np.asarray(test_labels, dtype=np.int64)
    train_counts = np.asarray(train_counts)
    c = len(train_counts)
    if method not in SHIFT_PROTOCOLS:
        raise ValueError(f"method must be 'sade' or 'lade', got {method!r}")
    if len(labels) and (labels.min() < 0 or labels.max() >= c):
        raise ValueError(f"test labels must be in 0..{c - 1} (len(train_counts) classes)")
    if direction == "uniform":
        shifted_counts(c, 0, 1, direction)  # validates
        return np.arange(len(labels), dtype=np.int64)
    if img_max is None:
        img_max = len(labels) / c
    counts = shifted_counts(c, img_max, imb_factor, direction)
    if method == "sade":
        if np.any(np.diff(train_counts) > 0):
            raise ValueError("method 'sade' ranks classes by label, which must then be training-frequency order "
                             "(non-increasing train counts); use method='lade' to rank by training count")
        return ldam_subset(labels, counts, seed)
    order = np.argsort(-train_counts, kind="stable")  # order[k] = the k-th most frequent class
    keep = []
    for k, cls in enumerate(order):
        idx = np.flatnonzero(labels == cls)
        if len(idx) < counts[k]:
            raise ValueError(f"class {cls} has {len(idx)} test images, fewer than the {counts[k]} asked for")
        keep.append(idx[: counts[k]])
    return np.sort(np.concatenate(keep)).astype(np.int64)


def shifted_test(data: LTData, name: str, method: str = "sade", seed: int = 0) -> LTData:
    """A copy of ``data`` whose test split is the shifted test set ``name`` (e.g. 'forward50')."""
    direction, rho = parse_prior_name(name)
    idx = shifted_test_indices(data.test_labels, data.class_counts, rho, direction, seed=seed, method=method)
    info = {**data.info, "test_shift": {"name": name, "method": method, "seed": seed, "size": int(len(idx))}}
    return dataclasses.replace(data, test=Subset(data.test, idx.tolist()), test_labels=data.test_labels[idx],
                               info=info)
