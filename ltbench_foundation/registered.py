"""The pretrained foundation backbones, registered (docs/foundation.md), and what the engine and the recipe ask of
any backbone about them: ``bind_data``, ``backbone_identity``, ``parameter_counts``.

Why here and not in ltbench/backbones.py: a result records the sha256 of its backbone's module, so adding
these to that file would mark every recorded ResNet run as stale (made by changed code); this module is one of
the registry's core modules (``registry.CORE_MODULES``) instead.
"""

from __future__ import annotations

import torch.nn as nn

from ltbench import pretrained
from ltbench.backbones import Backbone
from ltbench.registry import BACKBONES
from ltbench.results.identity import BACKBONE_IDENTITY


# Pretrained foundation backbones (ltbench/pretrained/, docs/foundation.md). Weights come from
# ``backbone.weights`` or the library's cache, never from the network; open_clip and timm are imported
# only when one of these is built.


@BACKBONES.register("clip_vit_b16")
class ClipViTB16(pretrained.ClipViTB16, Backbone):
    """OpenAI CLIP ViT-B/16 image tower (768-d features) with its text tower (zero-shot, text-initialised heads)."""
    meta_estimate = False  # its constructor reads the weights file: the memory check (train/resources.py) does not build it


@BACKBONES.register("clip_vit")
class ClipViT(pretrained.ClipViT, Backbone):
    """OpenAI CLIP ViT of any shape given in the backbone options (ViT-L/14, or the tests' tiny models)."""
    meta_estimate = False  # its constructor reads the weights file: the memory check (train/resources.py) does not build it


@BACKBONES.register("vit_b16_in21k")
class ViTB16In21k(pretrained.ViTB16In21k, Backbone):
    """timm ViT-B/16 pretrained on ImageNet-21k (768-d features)."""
    meta_estimate = False  # its constructor reads the weights file: the memory check (train/resources.py) does not build it


@BACKBONES.register("timm_vit")
class TimmViT(pretrained.TimmViT, Backbone):
    """timm ViT (class token) of any shape given in the backbone options."""
    meta_estimate = False  # its constructor reads the weights file: the memory check (train/resources.py) does not build it


def bind_data(backbone: nn.Module, data):
    """The data as the backbone takes them: a pretrained backbone fixes its input (resolution,
    interpolation, normalisation) and sizes its tune mode for the number of classes (``bind_data``);
    any other backbone takes the dataset's images as they are. Called once per run, before the method."""
    bind = getattr(backbone, "bind_data", None)
    return bind(data) if callable(bind) else data


def backbone_identity(spec: dict) -> str | None:
    """What identifies a backbone beyond its options: the sha256 of a pretrained backbone's weights file
    ('sha256:...'), None for backbones built from scratch. Asked when a recipe is loaded."""
    ask = getattr(BACKBONES.get(spec["name"]), "weights_identity", None)
    return ask(BACKBONES.config(spec, "backbone")) if callable(ask) else None


def check_weights(configs: list[dict]) -> None:
    """Each distinct weights file of these run configurations checked once (``check_weights`` of its backbone:
    readable, fitting, finite), before the first run; a backbone without a weights file has nothing to check."""
    seen = set()
    for config in configs:
        weights = config.get(BACKBONE_IDENTITY)
        ask = getattr(BACKBONES.get(config["backbone"]["name"]), "check_weights", None)
        key = (weights, repr(sorted((k, str(v)) for k, v in config["backbone"].items())))
        if weights and callable(ask) and key not in seen:
            seen.add(key)
            ask(BACKBONES.config(config["backbone"], "backbone"))


def parameter_counts(backbone: nn.Module, method: nn.Module) -> dict:
    """result.json 'parameters': what a row's model costs. Total and trainable parameters of the backbone (the
    network: for SADE, the experts it built) and of the method's own modules (heads, projections; a parameter
    shared by both counted once, in the backbone), their sums, and a pretrained backbone's tuning report."""
    seen = {id(p) for p in backbone.parameters()}
    own = [p for p in method.parameters() if id(p) not in seen]
    out = {"backbone": {"total": sum(p.numel() for p in backbone.parameters()),
                        "trainable": sum(p.numel() for p in backbone.parameters() if p.requires_grad)},
           "method": {"total": sum(p.numel() for p in own), "trainable": sum(p.numel() for p in own if p.requires_grad)}}
    out["total"] = out["backbone"]["total"] + out["method"]["total"]
    out["trainable"] = out["backbone"]["trainable"] + out["method"]["trainable"]
    report = getattr(backbone, "parameter_report", None)
    if callable(report):
        out["backbone_tuning"] = report()
    return out
