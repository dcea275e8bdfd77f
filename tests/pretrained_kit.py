"""Tiny random-weight models of the foundation track's architectures, saved the ways users bring weights.

A 2-block, 64-wide CLIP ViT (patch 8, 32 x 32 input) with a matching 2-block, 32-wide text tower, and a
2-block, 64-wide timm ViT: the same classes as the full-size backbones (ltbench_foundation/), only their
shape options differ. Files are written once per test session (``weights_dir``), never downloaded.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn

CLIP_SHAPE = {"image_size": 32, "patch_size": 8, "width": 64, "layers": 2, "heads": 2, "embed_dim": 32,
              "text_width": 32, "text_heads": 2, "text_layers": 2}
FMNIST_SHAPE = {"image_size": 28, "patch_size": 7}
TIMM_SHAPE = {"image_size": 32, "patch_size": 8, "width": 64, "layers": 2, "heads": 2}


def tiny_clip(seed: int = 0, **shape) -> nn.Module:
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg

    torch.manual_seed(seed)
    s = {**CLIP_SHAPE, **shape}
    model = CLIP(s["embed_dim"], quick_gelu=True,
                 vision_cfg=CLIPVisionCfg(layers=s["layers"], width=s["width"], head_width=s["width"] // s["heads"],
                                          patch_size=s["patch_size"], image_size=s["image_size"]),
                 text_cfg=CLIPTextCfg(width=s["text_width"], heads=s["text_heads"], layers=s["text_layers"]))
    with torch.no_grad():  # open_clip zero-initialises some biases: random ones make the checks sharper
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.02)
    return model


def tiny_timm(seed: int = 0) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    s = TIMM_SHAPE
    model = VisionTransformer(img_size=s["image_size"], patch_size=s["patch_size"], embed_dim=s["width"],
                              depth=s["layers"], num_heads=s["heads"], num_classes=7)  # a head, as in21k files have
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "cls_token" in name:
                p.normal_(0, 0.02)
    return model


def torchscript_archive(state: dict, path: Path) -> None:
    """Write ``state`` as OpenAI's CLIP files are: a TorchScript archive whose state_dict() holds it."""
    root = nn.Module()
    for key, value in state.items():
        *folders, leaf = key.split(".")
        node = root
        for part in folders:
            if not hasattr(node, part):
                node.add_module(part, nn.Module())
            node = getattr(node, part)
        node.register_parameter(leaf, nn.Parameter(value.clone(), requires_grad=False))
    with warnings.catch_warnings():  # torch deprecates TorchScript; OpenAI's files are TorchScript
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(root), str(path))


def write_weights(folder: Path) -> dict[str, Path]:
    """The tiny models in every format: clip (.pt state dict), clip_jit (OpenAI archive, with the extra
    keys OpenAI's hold), clip_safetensors, clip_other (other random weights), timm (.safetensors)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    clip_state = tiny_clip(0).state_dict()
    out = {"clip": folder / "tiny_clip.pt", "clip28": folder / "tiny_clip_28px.pt", "clip_jit": folder / "tiny_clip_openai.pt",
           "clip_safetensors": folder / "tiny_clip.safetensors", "clip_other": folder / "tiny_clip_seed1.pt",
           "timm": folder / "tiny_vit.safetensors"}
    torch.save(clip_state, out["clip"])
    torchscript_archive({**clip_state, "input_resolution": torch.tensor(32.0)}, out["clip_jit"])
    save_file({k: v.contiguous() for k, v in clip_state.items()}, str(out["clip_safetensors"]))
    torch.save(tiny_clip(1).state_dict(), out["clip_other"])
    torch.save(tiny_clip(0, **FMNIST_SHAPE).state_dict(), out["clip28"])  # Fashion-MNIST's 28 x 28: no resize
    save_file({k: v.contiguous() for k, v in tiny_timm(0).state_dict().items()}, str(out["timm"]))
    return out


def clip_backbone(weights: Path, tune="linear", **extra) -> dict:
    """The ``backbone:`` section of a recipe with the tiny CLIP."""
    return {"name": "clip_vit", "weights": str(weights), "tune": tune, **CLIP_SHAPE, **extra}


def timm_backbone(weights: Path, tune="linear", **extra) -> dict:
    return {"name": "timm_vit", "weights": str(weights), "tune": tune, **TIMM_SHAPE, **extra}


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory) -> dict[str, Path]:
    return write_weights(tmp_path_factory.mktemp("weights"))


def build(spec: dict, in_channels: int = 3, num_classes: int = 10):
    """A registered backbone from its recipe section, bound to a dataset of ``num_classes`` classes."""
    import numpy as np

    from ltbench.data.base import ImageSpec, LTData
    from ltbench.registry import BACKBONES

    net = BACKBONES.build(spec, in_channels=in_channels, where="backbone")
    labels = np.arange(num_classes)
    data = LTData("synthetic_lt", num_classes, ImageSpec(16, in_channels, (0.5,) * in_channels, (0.25,) * in_channels),
                  None, labels, None, labels, "h", {"default": "standard", "eval": "eval"})
    return net, net.bind_data(data)
