"""Backbones with one uniform API: ``forward(images) -> features`` and ``feature_dim``.

A backbone plugin has the shape of a method plugin: a registered ``nn.Module`` class with a ``Config``
dataclass (the recipe's ``backbone:`` options), built as ``cls(cfg, in_channels=...)``; see
docs/adding-a-backbone.md.

Heads belong to methods, so a backbone never has a classifier. The CIFAR ResNets follow kaidic/LDAM-DRW
``models/resnet_cifar.py`` exactly (option-A shortcuts, widths 16/32/64, Kaiming-normal init of every
conv and linear weight); ResNet-32 plus a 10-class linear head has 464,154 parameters.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from ltbench.config import EmptyConfig
from ltbench.registry import BACKBONES


class Backbone(nn.Module):
    """Base class of backbones: ``Config`` options, ``feature_dim``, ``forward(images (N, C, H, W)) -> (N, feature_dim)``.

    Optional, for methods that build several experts on one backbone (ltbench/experts.py): ``stages()``,
    the modules whose composition in order is ``forward``, and ``init_stage(module)``, how a fresh copy of a
    stage is initialised (the backbone's own initialisation)."""

    Config: ClassVar[type] = EmptyConfig
    feature_dim: int

    def stages(self) -> list[nn.Module]:
        raise NotImplementedError(f"backbone {type(self).__name__} does not split into stages (stages())")

    def init_stage(self, module: nn.Module) -> None:
        """Re-initialise a copied stage: every submodule's own reset_parameters()."""
        for sub in module.modules():
            if hasattr(sub, "reset_parameters"):
                sub.reset_parameters()


class _Stem(nn.Module):
    """conv, BatchNorm, ReLU of an existing network (its modules, not copies): stage 0 of ``stages()``."""

    def __init__(self, conv: nn.Module, bn: nn.Module):
        super().__init__()
        self.conv, self.bn = conv, bn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class GlobalAvgPool(nn.Module):
    """(N, C, H, W) -> (N, C): the last stage of every built-in backbone."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(x, 1).flatten(1)


def kaiming_init(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Conv2d)):
        nn.init.kaiming_normal_(module.weight)


class ShortcutA(nn.Module):
    """Parameter-free shortcut: subsample by 2 and zero-pad planes//4 channels on each side."""

    def __init__(self, planes: int):
        super().__init__()
        self.pad = planes // 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad))


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = ShortcutA(planes) if stride != 1 or in_planes != planes else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(Backbone):
    """3 stages of ``blocks`` BasicBlocks (widths 16, 32, 64), global average pooling: 64-d features."""

    def __init__(self, blocks: int, in_channels: int = 3, widths: tuple[int, int, int] = (16, 32, 64)):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        layers, in_planes = [], widths[0]
        for stage, planes in enumerate(widths):
            for b in range(blocks):
                stride = 2 if stage > 0 and b == 0 else 1
                layers.append(BasicBlock(in_planes, planes, stride))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.blocks, self.feature_dim = blocks, widths[-1]
        self.apply(kaiming_init)

    def stages(self) -> list[nn.Module]:
        """[stem, stage 1, stage 2, stage 3, pool]: RIDE/SADE give each expert its own stages 2 and 3."""
        b = self.blocks
        groups = [nn.Sequential(*self.layers[i * b:(i + 1) * b]) for i in range(3)]
        return [_Stem(self.conv1, self.bn1), *groups, GlobalAvgPool()]

    def init_stage(self, module: nn.Module) -> None:
        super().init_stage(module)
        module.apply(kaiming_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layers(out)
        return F.adaptive_avg_pool2d(out, 1).flatten(1)


@BACKBONES.register("resnet32")
class ResNet32(CifarResNet):
    """CIFAR ResNet-32 (LDAM-DRW), 64-d features."""

    def __init__(self, cfg: EmptyConfig | None = None, in_channels: int = 3):
        super().__init__(5, in_channels)


@BACKBONES.register("resnet20")
class ResNet20(CifarResNet):
    """CIFAR ResNet-20, same family, 64-d features."""

    def __init__(self, cfg: EmptyConfig | None = None, in_channels: int = 3):
        super().__init__(3, in_channels)


@BACKBONES.register("resnet8")
class ResNet8(CifarResNet):
    """CIFAR ResNet-8, same family, for quick CPU runs."""

    def __init__(self, cfg: EmptyConfig | None = None, in_channels: int = 3):
        super().__init__(1, in_channels)


class TorchvisionFeatures(Backbone):
    """A torchvision ImageNet network from scratch (no weight download), classifier removed."""

    def __init__(self, net: nn.Module, in_channels: int):
        super().__init__()
        if in_channels != 3:
            old = net.conv1
            net.conv1 = nn.Conv2d(in_channels, old.out_channels, old.kernel_size, old.stride, old.padding, bias=False)
            nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
        self.feature_dim = net.fc.in_features
        net.fc = nn.Identity()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def stages(self) -> list[nn.Module]:
        """[stem (conv1, bn1, relu, maxpool), layer1, ..., layer4, pool]."""
        n = self.net
        stem = nn.Sequential(_Stem(n.conv1, n.bn1), n.maxpool)
        return [stem, n.layer1, n.layer2, n.layer3, n.layer4, GlobalAvgPool()]

    def init_stage(self, module: nn.Module) -> None:
        """torchvision's ResNet initialisation: Kaiming-normal (fan_out) convolutions, BatchNorm 1 and 0."""
        for sub in module.modules():
            if isinstance(sub, nn.Conv2d):
                nn.init.kaiming_normal_(sub.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(sub, nn.BatchNorm2d):
                sub.reset_parameters()


@BACKBONES.register("resnet50")
class ResNet50(TorchvisionFeatures):
    """torchvision ResNet-50 from scratch, 2048-d features."""

    def __init__(self, cfg: EmptyConfig | None = None, in_channels: int = 3):
        from torchvision.models import resnet50 as tv_resnet50

        super().__init__(tv_resnet50(weights=None), in_channels)


@BACKBONES.register("resnext50_32x4d")
class ResNeXt50(TorchvisionFeatures):
    """torchvision ResNeXt-50 (32x4d) from scratch, 2048-d features."""

    def __init__(self, cfg: EmptyConfig | None = None, in_channels: int = 3):
        from torchvision.models import resnext50_32x4d as tv_resnext

        super().__init__(tv_resnext(weights=None), in_channels)
