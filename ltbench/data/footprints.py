"""What the built-in datasets hold in memory, from their options alone (``DatasetBuilder.footprint`` for them).

Kept out of the dataset modules on purpose: a result records the sha256 of its dataset's module (the stale
rule, ltbench/results/identity.py), so adding a method there would mark every recorded result of that
dataset stale though nothing it computes changed. A plugin dataset defines ``footprint()`` on its class
(docs/adding-a-dataset.md); ``footprint_of`` asks the class first, then this table.
"""

from __future__ import annotations

from typing import Any, Callable

from ltbench.data.base import DataFootprint, DatasetBuilder
from ltbench.data.cifar import CIFARLT
from ltbench.data.fashion_mnist import FashionMNISTLT
from ltbench.data.splitlist import SplitListDataset
from ltbench.data.synthetic import SyntheticLT


def _synthetic(builder: Any) -> DataFootprint:
    """Every split in memory as uint8, and while the largest is drawn about 24 bytes per value of it
    (float32 patterns, shifts, noise and their sum before the cast)."""
    cfg = builder.cfg
    pixels = cfg.channels * cfg.image_size ** 2
    splits = [cfg.max_per_class * cfg.num_classes, cfg.test_per_class * cfg.num_classes,
              cfg.val_per_class * cfg.num_classes]
    return DataFootprint(cfg.num_classes, cfg.channels, cfg.image_size, pixels * (sum(splits) + 24 * max(splits)))


def _cifar(builder: Any) -> DataFootprint:
    """The full training pool and the test set as uint8, twice (the batches read, the subset's copy)."""
    layout = builder.layout
    return DataFootprint(layout.num_classes, 3, 32, 2 * (layout.full_train + 10_000) * 3 * 32 * 32)


def _fashion_mnist(builder: Any) -> DataFootprint:
    """The 70,000 images as uint8, twice (the IDX arrays and the subset's copy)."""
    return DataFootprint(10, 1, 28, 2 * 70_000 * 28 * 28)


def _split_list(builder: Any) -> DataFootprint:
    """Images are read from files as the loader needs them: only the lists stay in memory."""
    return DataFootprint(builder.cfg.num_classes or builder.bench.num_classes, 3, 224, 0)


BUILT_IN: list[tuple[type, Callable[[Any], DataFootprint]]] = [
    (SyntheticLT, _synthetic), (CIFARLT, _cifar), (FashionMNISTLT, _fashion_mnist), (SplitListDataset, _split_list)]


def footprint_of(builder: Any) -> Callable[[], DataFootprint | None]:
    """The footprint hook of a built dataset: its class's own ``footprint()`` when it defines one, else the
    built-in table's entry for its class (a subclass that overrides ``load`` has its own footprint: None)."""
    own = type(builder).footprint
    if own is not DatasetBuilder.footprint:
        return builder.footprint
    for cls, fn in BUILT_IN:
        if isinstance(builder, cls) and type(builder).load is cls.load:
            return lambda: fn(builder)
    return lambda: None
