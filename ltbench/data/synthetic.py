"""A small synthetic long-tailed image dataset for fast tests (never a benchmark result).

Each class is a fixed random low-frequency pattern; images are that pattern plus noise and a random
shift, so a small CNN learns it in a few epochs but not trivially.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ltbench.config import check_range
from ltbench.data.base import ArrayImages, DatasetBuilder, ImageSpec, LTData, SMALL_IMAGE_VIEW_ALIASES
from ltbench.data.profile import exponential_counts
from ltbench.registry import DATASETS

VIEW_ALIASES = SMALL_IMAGE_VIEW_ALIASES  # view alias -> augmentation pipeline


@dataclass
class SyntheticLTConfig:
    num_classes: int = 5  # classes, each a fixed random low-frequency pattern
    imb_factor: float = 10.0  # rho = n_max / n_min of the exponential profile
    max_per_class: int = 64  # training images of the largest class
    test_per_class: int = 20  # balanced test set
    image_size: int = 16  # height and width in pixels
    channels: int = 3  # image channels (1: grey, 3: colour)
    noise: float = 0.35  # std of the pixel noise around each class's pattern (higher: harder)
    data_seed: int = 0  # seed of the generated images (the run's seed does not change the data)
    val_per_class: int = 0  # validation images per class, generated after train and test

    def validate(self) -> None:
        check_range("num_classes", self.num_classes, 2, 100_000)  # iNat-sized label spaces included
        check_range("max_per_class", self.max_per_class, 1, 10_000)
        check_range("imb_factor", self.imb_factor, 1, self.max_per_class,
                    unit=" (rho = n_max / n_min; at most max_per_class so the rarest class keeps an image)")
        check_range("test_per_class", self.test_per_class, 1, 10_000)
        check_range("image_size", self.image_size, 4, 256)
        check_range("channels", self.channels, 1, 4)
        check_range("noise", self.noise, 0, 100)
        check_range("data_seed", self.data_seed, 0, 2**32 - 1)
        check_range("val_per_class", self.val_per_class, 0, 10_000)
        images = self.num_classes * (self.max_per_class + self.test_per_class)
        if images * self.channels * self.image_size**2 > 2**30:
            raise ValueError(f"{images} images of {self.channels}x{self.image_size}x{self.image_size} need more than "
                             f"1 GiB; the synthetic dataset is for quick tests, make it smaller")


@DATASETS.register("synthetic_lt")
class SyntheticLT(DatasetBuilder):
    Config = SyntheticLTConfig

    def load(self) -> LTData:
        cfg = self.cfg
        gen = torch.Generator().manual_seed(cfg.data_seed)
        k, s, c = cfg.num_classes, cfg.image_size, cfg.channels
        low = torch.rand(k, c, 4, 4, generator=gen)
        patterns = F.interpolate(low, size=(s, s), mode="bilinear", align_corners=False)
        counts = exponential_counts(cfg.max_per_class, k, cfg.imb_factor)

        def sample(per_class: list[int]) -> tuple[torch.Tensor, np.ndarray]:
            labels = np.repeat(np.arange(k), per_class)
            base = patterns[torch.from_numpy(labels)]
            shifts = torch.randint(-2, 3, (len(labels), 2), generator=gen)
            base = torch.stack([torch.roll(b, (int(dx), int(dy)), dims=(1, 2)) for b, (dx, dy) in zip(base, shifts)])
            x = base + cfg.noise * torch.randn(base.shape, generator=gen)
            return (x.clamp(0, 1) * 255).round().to(torch.uint8), labels

        train_x, train_y = sample(counts)
        test_x, test_y = sample([cfg.test_per_class] * k)
        digest = hashlib.sha1(train_x.numpy().tobytes() + train_y.tobytes()).hexdigest()
        val = sample([cfg.val_per_class] * k) if cfg.val_per_class else None  # drawn last: train and test unchanged
        return LTData(
            name="synthetic_lt",
            num_classes=k,
            image=ImageSpec(size=s, channels=c, mean=(0.5,) * c, std=(0.25,) * c),
            train=ArrayImages(train_x, train_y),
            train_labels=train_y,
            test=ArrayImages(test_x, test_y, [("test", j) for j in range(len(test_y))]),
            test_labels=test_y,
            subset_hash=digest,
            pipelines=dict(VIEW_ALIASES),
            info={"counts_profile": counts},
            val=ArrayImages(*val, [("val", j) for j in range(len(val[1]))]) if val else None,
            val_labels=val[1] if val else None,
        )
