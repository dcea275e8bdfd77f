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
    the modules whose composition in order is ``forward``, ``init_stage(module)``, how a fresh copy of a
    stage is initialised (the backbone's own initialisation), and ``expert_branch(count, width)``, fresh
    last stages at a narrower width (RIDE's and SADE's ``reduce_dimension``)."""

    Config: ClassVar[type] = EmptyConfig
    feature_dim: int

    def stages(self) -> list[nn.Module]:
        raise NotImplementedError(f"backbone {type(self).__name__} does not split into stages (stages())")

    def init_stage(self, module: nn.Module) -> None:
        """Re-initialise a copied stage: every submodule's own reset_parameters()."""
        for sub in module.modules():
            if hasattr(sub, "reset_parameters"):
                sub.reset_parameters()

    def expert_branch(self, count: int, width: float) -> tuple[nn.Module, int]:
        """(a freshly initialised copy of the last ``count`` stages with every channel count of theirs
        scaled by ``width``, its feature width). Why: RIDE and SADE give each expert narrower later stages
        than the backbone's (``reduce_dimension``: 3/4 of the channels), so that three experts cost less
        than three networks. Only backbones that know their widths can; the others refuse."""
        raise NotImplementedError(f"backbone {type(self).__name__} cannot build narrower expert stages "
                                  f"(expert_branch()); use the full width (1.0)")


def scaled_width(channels: int, width: float) -> int:
    """round(channels * width), at least 1: SADE's 3/4 turns 32/64 into 24/48 and 256/512 into 192/384."""
    return max(1, int(round(channels * width)))


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
    """Parameter-free shortcut: subsample by 2 and zero-pad (planes - in_planes) / 2 channels on each side
    (planes // 4 when the width doubles; 4 for SADE's narrower 16 -> 24; an odd difference puts the extra
    channel after)."""

    def __init__(self, in_planes: int, planes: int):
        super().__init__()
        if planes < in_planes:
            raise ValueError(f"an option-A shortcut cannot narrow {in_planes} channels to {planes}")
        self.pad = ((planes - in_planes) // 2, (planes - in_planes + 1) // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, *self.pad))


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = ShortcutA(in_planes, planes) if stride != 1 or in_planes != planes else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


def _blocks(in_planes: int, planes: int, count: int, stride: int) -> list[BasicBlock]:
    """One stage: ``count`` BasicBlocks to ``planes`` channels, the first from ``in_planes`` with ``stride``."""
    return [BasicBlock(in_planes if b == 0 else planes, planes, stride if b == 0 else 1) for b in range(count)]


class CifarResNet(Backbone):
    """3 stages of ``blocks`` BasicBlocks (widths 16, 32, 64), global average pooling: 64-d features."""

    def __init__(self, blocks: int, in_channels: int = 3, widths: tuple[int, int, int] = (16, 32, 64)):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.layers = nn.Sequential(*(block for stage, planes in enumerate(widths)
                                      for block in _blocks(widths[max(stage - 1, 0)], planes, blocks, 2 if stage else 1)))
        self.blocks, self.widths, self.feature_dim = blocks, tuple(widths), widths[-1]
        self.apply(kaiming_init)

    def stages(self) -> list[nn.Module]:
        """[stem, stage 1, stage 2, stage 3, pool]: RIDE/SADE give each expert its own stages 2 and 3."""
        b = self.blocks
        groups = [nn.Sequential(*self.layers[i * b:(i + 1) * b]) for i in range(3)]
        return [_Stem(self.conv1, self.bn1), *groups, GlobalAvgPool()]

    def init_stage(self, module: nn.Module) -> None:
        super().init_stage(module)
        module.apply(kaiming_init)

    def expert_branch(self, count: int, width: float) -> tuple[nn.Module, int]:
        """The last ``count`` stages (of stem, stages 1-3, pooling) rebuilt with ``width`` times the channels,
        Kaiming-initialised; the first block takes the trunk's channels (SADE's CIFAR experts: 16 -> 24 -> 48)."""
        first = 4 - count + 1  # the first expert-owned residual stage, 1..3 (count 1: pooling alone)
        in_planes = self.widths[first - 2] if first >= 2 else self.widths[0]
        parts = []
        for stage in range(max(first, 1), 4):
            planes = scaled_width(self.widths[stage - 1], width)
            parts.append(nn.Sequential(*_blocks(in_planes, planes, self.blocks, 2 if stage > 1 else 1)))
            in_planes = planes
        branch = nn.Sequential(*parts, GlobalAvgPool())
        branch.apply(kaiming_init)
        return branch, in_planes

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

    def expert_branch(self, count: int, width: float) -> tuple[nn.Module, int]:
        """The last ``count`` stages (of stem, layer1-4, pooling) rebuilt by torchvision's own ``_make_layer``
        with ``width`` times the planes (SADE's ImageNet experts: layer3/layer4 planes 192/384 for 256/512)."""
        n, first = self.net, 6 - count  # stages: 0 stem, 1-4 layer1-4, 5 pool
        if first < 1:
            raise ValueError("expert_branch: the stem cannot be an expert's own stage")
        layers = [n.layer1, n.layer2, n.layer3, n.layer4]
        block = type(layers[0][0])
        saved = n.inplanes
        n.inplanes = 64 if first == 1 else _out_channels(layers[first - 2])
        try:
            parts = [n._make_layer(block, scaled_width(64 * 2 ** (i - 1), width), len(layers[i - 1]),
                                   stride=1 if i == 1 else 2) for i in range(first, 5)]
            out = n.inplanes
        finally:
            n.inplanes = saved
        branch = nn.Sequential(*parts, GlobalAvgPool())
        self.init_stage(branch)
        return branch, out


def _out_channels(layer: nn.Sequential) -> int:
    """Output channels of a torchvision ResNet layer: its last block's last BatchNorm."""
    return [m for m in layer[-1].modules() if isinstance(m, nn.BatchNorm2d)][-1].num_features


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
