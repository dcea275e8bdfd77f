import pytest
import torch
import torch.nn as nn

from ltbench.registry import BACKBONES


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("classes, expected", [(10, 464_154), (100, 470_004)])
def test_resnet32_parameter_count_matches_ldam_drw(classes, expected):
    backbone = BACKBONES.get("resnet32")(None, in_channels=3)
    assert n_params(backbone) + n_params(nn.Linear(backbone.feature_dim, classes)) == expected


@pytest.mark.parametrize("name", ["resnet8", "resnet20", "resnet32"])
@pytest.mark.parametrize("channels, size", [(1, 28), (3, 32)])
def test_cifar_resnets_uniform_api(name, channels, size):
    backbone = BACKBONES.get(name)(None, in_channels=channels)
    out = backbone(torch.randn(2, channels, size, size))
    assert out.shape == (2, backbone.feature_dim) == (2, 64)


def test_kaiming_init_and_option_a_shortcut_have_no_parameters():
    backbone = BACKBONES.get("resnet32")(None, in_channels=3)
    shortcuts = [m.shortcut for m in backbone.layers]
    assert sum(n_params(s) for s in shortcuts) == 0
    w = backbone.conv1.weight
    assert w.std().item() == pytest.approx((2 / (3 * 9)) ** 0.5, rel=0.25)


@pytest.mark.parametrize("name, params", [("resnet50", 23_508_032), ("resnext50_32x4d", 22_979_904)])
def test_torchvision_backbones_from_scratch(name, params):
    backbone = BACKBONES.get(name)(None, in_channels=3)
    assert backbone.feature_dim == 2048
    assert n_params(backbone) == params  # torchvision's counts minus the 1000-way fc
    assert backbone(torch.randn(1, 3, 64, 64)).shape == (1, 2048)
