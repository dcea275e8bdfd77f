"""timm ViTs: the ImageNet-21k ViT-B/16 of the foundation track (and any timm ViT shape with a class token).

Why timm: it is the library the weights are published for (``vit_base_patch16_224.augreg_in21k`` on the
Hugging Face hub, Google's original ``.npz`` read by timm's own converter), and LIFT builds its ViT from
it too. Built with ``pretrained=False`` semantics (we construct ``VisionTransformer`` and load the user's
file), so timm never downloads.

Preprocessing is the weights' own (timm's config of the augreg checkpoints): mean = std = 0.5, bicubic,
centre crop 0.9. LIFT normalises with 0.5 as well and resizes bilinearly (``backbone.interpolation``).
Note: LIFT's "IN21K-ViT-B/16" was ``timm.vit_base_patch16_224(pretrained=True)`` of timm 0.6.12, whose
default weights are the ImageNet-21k checkpoint *fine-tuned on ImageNet-1k* (``augreg_in21k_ft_in1k``);
to reproduce LIFT's rows give that file as ``backbone.weights`` (its sha256 keeps the runs apart).
"""

from __future__ import annotations

from dataclasses import dataclass

from ltbench.registry import BACKBONES
from ltbench_foundation.backbone import PretrainedConfig, PretrainedViT, Preprocess
from ltbench_foundation.trunks import TimmTrunk
from ltbench_foundation.weights import WeightSource, load_exactly, npz_arrays, read_state_dict

HALF = (0.5, 0.5, 0.5)
HEAD_KEYS = ("head.", "fc_norm.", "pre_logits.")  # classifier parts of a checkpoint: not features


@dataclass
class TimmArch:
    image_size: int = 224  # input resolution in pixels (a multiple of patch_size)
    patch_size: int = 16  # side of the square patches
    width: int = 768  # transformer width
    layers: int = 12  # transformer blocks
    heads: int = 12  # attention heads


@dataclass
class TimmViTConfig(PretrainedConfig, TimmArch):
    """``timm_vit``: a timm ViT of any shape (class token, token pooling), e.g. the tests' tiny ones."""

    def validate(self) -> None:
        super().validate()
        if min(self.width, self.layers, self.heads, self.patch_size, self.image_size) < 1:
            raise ValueError("width, layers, heads, patch_size and image_size must be >= 1")
        if self.width % self.heads or self.image_size % self.patch_size:
            raise ValueError("width must be a multiple of heads, image_size of patch_size")


@BACKBONES.register("timm_vit")
class TimmViT(PretrainedViT):
    """timm ViT (class token) of any shape given in the backbone options."""

    Config = TimmViTConfig
    source = WeightSource("timm_vit", (), "give the timm checkpoint (.safetensors, .pth/.bin, or Google's .npz)")

    def arch(self) -> TimmArch:
        return self.cfg

    def build(self, cfg):
        from timm.models.vision_transformer import VisionTransformer  # lazy: keeps discovery free of timm

        a = self.arch()
        model = VisionTransformer(img_size=a.image_size, patch_size=a.patch_size, embed_dim=a.width, depth=a.layers,
                                  num_heads=a.heads, num_classes=0, global_pool="token", class_token=True)
        return model, TimmTrunk(model), Preprocess(a.image_size, HALF, HALF, "bicubic", 0.9)

    def load(self, path) -> None:
        if str(path).endswith(".npz"):  # Google's JAX checkpoints: timm's own converter
            from timm.models.vision_transformer import _load_weights  # lazy: keeps discovery free of timm

            _load_weights(self.model, str(path))
            return
        load_exactly(self.model, self.weights_state(path), path, self.source.backbone, ignore=HEAD_KEYS)

    def weights_state(self, path) -> dict:
        if str(path).endswith(".npz"):  # Google's layout: timm's converter checks its keys when it loads
            return npz_arrays(path)
        from timm.models.vision_transformer import checkpoint_filter_fn  # lazy: keeps discovery free of timm

        state = checkpoint_filter_fn(read_state_dict(path), self.model)
        return {k: v for k, v in state.items() if not k.startswith(HEAD_KEYS)}


@BACKBONES.register("vit_b16_in21k")
class ViTB16In21k(TimmViT):
    """timm ViT-B/16 pretrained on ImageNet-21k (augreg): 768-d features, 224 x 224 input."""

    Config = PretrainedConfig
    source = WeightSource(
        "vit_b16_in21k",
        ("{hub}/models--timm--vit_base_patch16_224.augreg_in21k/snapshots/*/model.safetensors",
         "{hub}/models--timm--vit_base_patch16_224.augreg_in21k/snapshots/*/pytorch_model.bin"),
        "timm publishes it as vit_base_patch16_224.augreg_in21k (Hugging Face repository "
        "timm/vit_base_patch16_224.augreg_in21k; Google's original is the augreg B_16 i21k .npz)")

    def arch(self) -> TimmArch:
        return TimmArch()
