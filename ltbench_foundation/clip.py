"""CLIP backbones: OpenAI's CLIP built with open_clip, the image tower as features, the text tower for
class-name embeddings (zero-shot classification, a classifier initialised from text).

Why open_clip: it builds OpenAI's architecture from its state dict keys unchanged (QuickGELU, ln_pre,
batch-first blocks), ships CLIP's BPE tokenizer and vocabulary, and is maintained; it is imported only
when a CLIP backbone is built, and never asked to download (we construct ``open_clip.model.CLIP`` and
load the user's file ourselves). The features are LIFT's: the class token after ``ln_post``, before
the projection to the joint space (width 768 for ViT-B/16); ``image_embeddings`` applies the projection.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ltbench.registry import BACKBONES
from ltbench_foundation.backbone import PretrainedConfig, PretrainedViT, Preprocess
from ltbench_foundation.trunks import OpenClipTrunk
from ltbench_foundation.weights import WeightSource, load_exactly, read_state_dict

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)  # OpenAI's clip/clip.py _transform
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
TEXT_BATCH = 1000  # prompts encoded at once (LIFT splits at 1000 too)


@dataclass
class ClipArch:
    """An OpenAI CLIP ViT's shape: image tower, joint embedding and text tower (defaults: ViT-B/16)."""

    image_size: int = 224  # input resolution in pixels (a multiple of patch_size)
    patch_size: int = 16  # side of the square patches
    width: int = 768  # transformer width of the image tower
    layers: int = 12  # transformer blocks of the image tower
    heads: int = 12  # attention heads of the image tower
    embed_dim: int = 512  # joint image-text embedding size (the projection)
    context_length: int = 77  # text tokens per prompt
    vocab_size: int = 49408  # text tokenizer vocabulary
    text_width: int = 512  # transformer width of the text tower
    text_heads: int = 8  # attention heads of the text tower
    text_layers: int = 12  # transformer blocks of the text tower


@dataclass
class ClipViTConfig(PretrainedConfig, ClipArch):
    """``clip_vit``: any CLIP ViT shape (ViT-L/14: width 1024, layers 24, heads 16, patch_size 14,
    embed_dim 768, text_width 768, text_heads 12), and the tiny random-weight models of the tests."""

    def validate(self) -> None:
        super().validate()
        for name in ("width", "layers", "heads", "patch_size", "image_size", "embed_dim", "text_width",
                     "text_heads", "text_layers", "context_length", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.width % self.heads or self.text_width % self.text_heads:
            raise ValueError("width must be a multiple of heads (and text_width of text_heads)")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size ({self.image_size}) must be a multiple of patch_size ({self.patch_size})")


@BACKBONES.register("clip_vit")
class ClipViT(PretrainedViT):
    """OpenAI CLIP ViT of any shape given in the backbone options (ViT-L/14, or the tests' tiny models); the text
    tower stays frozen."""

    Config = ClipViTConfig
    source = WeightSource("clip_vit", (), "give the CLIP checkpoint (OpenAI .pt, open_clip .bin/.safetensors)")

    def arch(self) -> ClipArch:
        return self.cfg

    def build(self, cfg):
        from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg  # lazy: keeps discovery free of open_clip

        a = self.arch()
        model = CLIP(a.embed_dim, quick_gelu=True,
                     vision_cfg=CLIPVisionCfg(layers=a.layers, width=a.width, head_width=a.width // a.heads,
                                              patch_size=a.patch_size, image_size=a.image_size),
                     text_cfg=CLIPTextCfg(context_length=a.context_length, vocab_size=a.vocab_size,
                                          width=a.text_width, heads=a.text_heads, layers=a.text_layers))
        preprocess = Preprocess(a.image_size, OPENAI_MEAN, OPENAI_STD, "bicubic", 1.0)
        return model, OpenClipTrunk(model.visual), preprocess

    def weights_state(self, path) -> dict:
        state = read_state_dict(path)
        for key in ("input_resolution", "context_length", "vocab_size"):  # OpenAI's archives hold these
            state.pop(key, None)
        return state

    def load(self, path) -> None:
        state = self.weights_state(path)
        load_exactly(self.model, {k: v.float() for k, v in state.items()}, path, self.source.backbone)

    # -- the text side (zero-shot, text-initialised classifiers) -------------------------------
    @torch.no_grad()
    def text_embeddings(self, prompts: list[list[str]]) -> torch.Tensor:
        """(K, embed_dim): for each class, the mean over its prompts of the unit text embeddings (LIFT's
        and CLIP's prompt ensembling, before any renormalisation). Encoded in float32, on the GPU when
        there is one (ImageNet's 80 templates are 80,000 prompts)."""
        from open_clip.tokenizer import SimpleTokenizer  # lazy: keeps discovery free of open_clip

        tokenizer = SimpleTokenizer(context_length=self.arch().context_length)
        device = torch.device("cuda") if torch.cuda.is_available() else self.mean.device
        self.model.to(device)
        flat = [p for class_prompts in prompts for p in class_prompts]
        parts = [F.normalize(self.model.encode_text(tokenizer(flat[i:i + TEXT_BATCH]).to(device)).float(), dim=-1)
                 for i in range(0, len(flat), TEXT_BATCH)]
        unit = torch.cat(parts)
        sizes = [len(class_prompts) for class_prompts in prompts]
        return torch.stack([chunk.mean(0) for chunk in unit.split(sizes)])

    def image_embeddings(self, features: torch.Tensor) -> torch.Tensor:
        """Backbone features (after ln_post) -> the joint image-text space (CLIP's projection)."""
        return features @ self.model.visual.proj.to(features.dtype)

    def text_to_features(self, text: torch.Tensor) -> torch.Tensor:
        """Text embeddings -> the feature space, through the transposed projection (LIFT's head init)."""
        return text @ self.model.visual.proj.to(text.dtype).T

    @property
    def logit_scale(self) -> float:
        return float(self.model.logit_scale.exp())


VIT_B16 = ClipArch()


@BACKBONES.register("clip_vit_b16")
class ClipViTB16(ClipViT):
    """OpenAI CLIP ViT-B/16 (LIFT's backbone): 768-d features, 512-d joint space, 224 x 224 input, with its text
    tower (zero-shot, text-initialised heads)."""

    Config = PretrainedConfig
    source = WeightSource(
        "clip_vit_b16",
        ("~/.cache/clip/ViT-B-16.pt",
         "{hub}/models--timm--vit_base_patch16_clip_224.openai/snapshots/*/open_clip_model.safetensors",
         "{hub}/models--timm--vit_base_patch16_clip_224.openai/snapshots/*/open_clip_pytorch_model.bin"),
        "OpenAI publishes ViT-B-16.pt (its URL is in _MODELS of OpenAI's clip/clip.py; open_clip's 'openai' "
        "tag and the Hugging Face repository timm/vit_base_patch16_clip_224.openai hold the same weights)")

    def arch(self) -> ClipArch:
        return VIT_B16
