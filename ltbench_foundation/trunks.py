"""The two ViT families a pretrained backbone walks: open_clip's image tower and timm's VisionTransformer.

Why a walk of our own: VPT inserts tokens between blocks, so the blocks are called one by one here; every
block, embedding and norm is still the library's own module with the library's own forward, so the features
equal the library's (tests/test_pretrained_equality.py checks them against OpenAI's clip/model.py, restated,
and timm's ``forward_features``). A ``Trunk`` names, per family, the few places a tune mode edits.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ltbench_foundation import tuning


class Trunk:
    """Uniform access to a library ViT: embed -> blocks -> pooled class token after the final norm."""

    module: nn.Module  # the library's image model (its parameters are the backbone's)
    width: int
    patch: int
    tokens: int  # sequence length before any prompt (class token + patches)

    @property
    def blocks(self) -> list[nn.Module]:
        raise NotImplementedError

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def block_biases(self) -> list[nn.Parameter]:
        return [p for block in self.blocks for name, p in block.named_parameters() if name.endswith("bias")]

    def add_parallel_adapter(self, block: nn.Module, adapter: nn.Module) -> None:
        """x + MLP(norm2(x)) -> x + MLP(norm2(x)) + adapter(x), keeping the block's forward."""
        norm_name = self.norm2_name
        setattr(block, "mlp", tuning.ParallelAdapterMLP(getattr(block, norm_name), block.mlp, adapter))
        setattr(block, norm_name, nn.Identity())

    def add_qkv_delta(self, block: nn.Module, delta: nn.Module) -> None:
        raise NotImplementedError


class OpenClipTrunk(Trunk):
    """open_clip's ``VisionTransformer`` (OpenAI's CLIP layout): conv1, class and positional embedding,
    ln_pre, ``transformer.resblocks`` (batch first), ln_post on the class token."""

    norm2_name = "ln_2"

    def __init__(self, visual: nn.Module):
        self.module = visual
        self.width = visual.class_embedding.shape[0]
        self.patch = visual.conv1.kernel_size[0]
        self.tokens = visual.positional_embedding.shape[0]

    @property
    def blocks(self) -> list[nn.Module]:
        return list(self.module.transformer.resblocks)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.module._embeds(x)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        return self.module.ln_post(x[:, 0])

    def add_qkv_delta(self, block: nn.Module, delta: nn.Module) -> None:
        block.attn = tuning.AttentionWithDelta(block.attn, delta)


class TimmTrunk(Trunk):
    """timm's ``VisionTransformer`` with a class token: patch_embed, _pos_embed, norm_pre, blocks, norm."""

    norm2_name = "norm2"

    def __init__(self, model: nn.Module):
        self.module = model
        self.width = model.embed_dim
        self.patch = model.patch_embed.patch_size[0]
        self.tokens = model.pos_embed.shape[1]

    @property
    def blocks(self) -> list[nn.Module]:
        return list(self.module.blocks)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        m = self.module
        return m.norm_pre(m.patch_drop(m._pos_embed(m.patch_embed(x))))

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        return self.module.norm(x[:, 0])  # LayerNorm is per token: norm then pool equals pool then norm

    def add_qkv_delta(self, block: nn.Module, delta: nn.Module) -> None:
        block.attn.qkv = tuning.LinearWithDelta(block.attn.qkv, delta)
