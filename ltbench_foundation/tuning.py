"""Fine-tuning modes of a pretrained ViT (``backbone.tune``): what trains, and the modules added for it.

Why a registry: LIFT's trainer switches about ten modules with if/elif on config keys; here each mode is a
``TuneMode`` registered by name (``TUNE_MODES``, a plugin kind like methods: ``ltbench list tune_modes``,
docs/adding-a-tune-mode.md) with its own options dataclass, so an option of another mode is refused rather
than silently ignored, and a new mode is one class. The modules follow LIFT (github shijxcs/LIFT,
``models/peft_modules.py`` and ``models/peft_vit.py``), re-stated here, checked against a re-statement of
its arithmetic in tests/test_pretrained_equality.py:

* ``frozen``: nothing trains; features only (zero-shot, a base for stage 2). Needs ``optim.epochs: 0``.
* ``linear``: nothing in the backbone trains; the method's head does (a linear probe with ``la``/``ce``,
  LIFT's "classifier fine-tuning" with ``lift``). Needs ``optim.epochs`` >= 1.
* ``full``: the transformer blocks train (``scope: blocks``, LIFT's ``full_tuning``: embeddings and the
  final LayerNorm stay frozen), or every parameter of the image tower (``scope: all``).
* ``bitfit``: the biases inside the transformer blocks (LIFT's ``bias_tuning``; LayerNorm biases included).
* ``lora``: low-rank updates of the query and value projections, W x + (alpha / r) B A x, A ~ U(-1/sqrt(r),
  1/sqrt(r)) as LIFT initialises it (kaiming_uniform with a = sqrt(5) on an (in, r) matrix), B = 0.
* ``adaptformer``: LIFT's AdaptFormer, beside each block's MLP: x + MLP(LN2(x)) + s * up(ReLU(down(LN_a(x)))),
  with its own LayerNorm, down initialised kaiming_normal(a = sqrt(5)), up and both biases zero, s learnable
  from 1 (or a fixed number).
* ``vpt``: learnable prompt tokens appended to the sequence before the first block (``shallow``) or
  replacing the previous layer's prompts before every block (``deep``), U(-v, v) with v = sqrt(6 / (3 P^2 + D)).

The bottleneck (adapter width, LoRA rank) defaults to LIFT's rule 2 ** max(0, floor(log2(K / (2 L)))) for K
classes and L blocks (ImageNet-LT 32, Places-LT 8, iNaturalist 2018 256, CIFAR-100 4 with ViT-B/16).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from ltbench.config import EmptyConfig, check_range
from ltbench.errors import ConfigError, short_repr
from ltbench.registry import TUNE_MODES


class TuneMode:
    """A way to fine-tune a pretrained ViT, registered with ``@TUNE_MODES.register(name)`` and built from
    ``backbone.tune`` = ``{name, **options}`` (its ``Config`` dataclass, like every plugin's).

    ``apply`` runs once, when the backbone meets the data (it may size itself by the number of classes), on a
    backbone whose every pretrained parameter is frozen: it unfreezes some (``backbone.trunk``: the blocks,
    their biases, the whole image tower) or adds modules, into ``backbone.tuned[name]`` (saved in checkpoints)
    or as ``backbone.prompts`` (tokens inserted before blocks). Frozen pretrained weights stay out of
    checkpoints; whatever trains is in them."""

    Config: ClassVar[type] = EmptyConfig
    features_only: ClassVar[bool] = False  # nothing trains at all, so a run trains no epoch (optim.epochs 0)
    pretrained_in_train_mode: ClassVar[bool] = False  # the library model in train mode while training (dropout)

    def __init__(self, cfg: Any):
        self.cfg = cfg

    def apply(self, backbone, num_classes: int) -> dict:
        """Unfreeze or add what this mode trains; returns entries for result.json's
        ``parameters.backbone_tuning`` (e.g. ``{'bottleneck': 8}``)."""
        return {}

    @classmethod
    def check(cls, name: str) -> str:
        """``ltbench check`` on this mode, after the core validated its defaults (ltbench/contract.py asks the
        mode: the core knows no backbone to apply it to)."""
        # Imported by name, not by an import statement: the check is no part of what a run computes, so it stays
        # out of the runs' code record (results/code.py reads import statements), as ltbench.contract does.
        return importlib.import_module("ltbench_foundation.contract").check_tune_mode(cls, name)


def resolve_tune(value: Any, where: str = "backbone.tune") -> dict:
    """'adaptformer' or {name: adaptformer, bottleneck: 8} -> {'name': ..., every option filled}: what enters
    the run id. Unknown modes and options of another mode are ConfigErrors naming the field."""
    spec = {"name": value} if isinstance(value, str) else value
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ConfigError(f"{where}: expected a mode name or a mapping with 'name' ({', '.join(TUNE_MODES.names())}), "
                          f"got {short_repr(value)}")
    if spec["name"] not in TUNE_MODES:
        raise ConfigError(f"{where}.name: {TUNE_MODES.unknown_message(spec['name'])}")
    return TUNE_MODES.resolved(spec, where)


def per_block(backbone, name: str, make, attach) -> None:
    """One new module per block of the trunk, kept in ``backbone.tuned[name]`` (so checkpoints hold it) and wired
    into its block by ``attach(block, module)`` (LoRA's q/v deltas, AdaptFormer's parallel adapters)."""
    backbone.tuned[name] = nn.ModuleList(make() for _ in backbone.trunk.blocks)
    for block, module in zip(backbone.trunk.blocks, backbone.tuned[name]):
        attach(block, module)


def rule_of_thumb_bottleneck(num_classes: int, layers: int) -> int:
    """LIFT's default adapter width and LoRA rank: 2 ** max(0, floor(log2(K / (2 L))))."""
    return 2 ** max(0, int(math.log2(num_classes / (layers * 2))))


# ------------------------------------------------------------------------------------------------
# The built-in modes


@TUNE_MODES.register("frozen")
class Frozen(TuneMode):
    """Nothing trains: features only (zero-shot, a base for stage 2); needs optim.epochs: 0."""

    features_only = True


@TUNE_MODES.register("linear")
class Linear(TuneMode):
    """Nothing in the backbone trains; the method's head does (a linear probe)."""


@dataclass
class FullConfig:
    scope: Literal["blocks", "all"] = "blocks"  # blocks: LIFT's full fine-tuning; all: every image-tower weight


@TUNE_MODES.register("full")
class Full(TuneMode):
    """The transformer blocks train (LIFT's full_tuning), or the whole image tower."""

    Config = FullConfig
    pretrained_in_train_mode = True

    def apply(self, backbone, num_classes: int) -> dict:
        trunk = backbone.trunk
        for p in trunk.module.parameters() if self.cfg.scope == "all" else (q for b in trunk.blocks for q in b.parameters()):
            p.requires_grad_(True)
        return {}


@TUNE_MODES.register("bitfit")
class BitFit(TuneMode):
    """The biases inside the transformer blocks train, LayerNorm's too (LIFT's bias_tuning)."""

    def apply(self, backbone, num_classes: int) -> dict:
        for p in backbone.trunk.block_biases():
            p.requires_grad_(True)
        return {}


@dataclass
class LoRAConfig:
    rank: int | None = None  # None: LIFT's bottleneck rule
    alpha: float = 1.0  # the update is scaled by alpha / rank (LIFT: 1 / rank)
    targets: list[str] = field(default_factory=lambda: ["q", "v"])  # which projections get an update, of q, k, v

    def validate(self) -> None:
        check_range("rank", self.rank, 1, 65536)
        check_range("alpha", self.alpha, 0, 1e6, low_open=True)
        if not self.targets or any(t not in ("q", "k", "v") for t in self.targets) \
                or len(set(self.targets)) != len(self.targets):
            raise ValueError(f"targets must name some of q, k, v once each, got {short_repr(self.targets)}")


@TUNE_MODES.register("lora")
class LoRA(TuneMode):
    """Low-rank updates of the query and value projections in every block (LIFT's LoRA)."""

    Config = LoRAConfig

    def apply(self, backbone, num_classes: int) -> dict:
        trunk = backbone.trunk
        rank = self.cfg.rank or rule_of_thumb_bottleneck(num_classes, len(trunk.blocks))
        per_block(backbone, "lora", lambda: QKVLowRank(trunk.width, rank, self.cfg.alpha, self.cfg.targets),
                  trunk.add_qkv_delta)
        return {"bottleneck": rank}


@dataclass
class AdaptFormerConfig:
    bottleneck: int | None = None  # None: LIFT's bottleneck rule
    scale: float | None = None  # None: learnable, initialised to 1 (LIFT); a number: fixed

    def validate(self) -> None:
        check_range("bottleneck", self.bottleneck, 1, 65536)


@TUNE_MODES.register("adaptformer")
class AdaptFormerMode(TuneMode):
    """LIFT's AdaptFormer: a bottleneck adapter beside every block's MLP (zero at the start)."""

    Config = AdaptFormerConfig

    def apply(self, backbone, num_classes: int) -> dict:
        trunk = backbone.trunk
        bottleneck = self.cfg.bottleneck or rule_of_thumb_bottleneck(num_classes, len(trunk.blocks))
        per_block(backbone, "adaptformer", lambda: AdaptFormer(trunk.width, bottleneck, self.cfg.scale),
                  trunk.add_parallel_adapter)
        return {"bottleneck": bottleneck}


@dataclass
class VPTConfig:
    length: int = 10  # prompt tokens per layer (LIFT's default)
    depth: Literal["shallow", "deep"] = "shallow"  # shallow: prompts before the first block; deep: before every block

    def validate(self) -> None:
        check_range("length", self.length, 1, 4096)


@TUNE_MODES.register("vpt")
class VPT(TuneMode):
    """Visual prompt tuning: learnable tokens before the first block, or before every block."""

    Config = VPTConfig

    def apply(self, backbone, num_classes: int) -> dict:
        trunk = backbone.trunk
        layers = len(trunk.blocks) if self.cfg.depth == "deep" else 1
        backbone.prompts = Prompts(layers, self.cfg.length, trunk.width, trunk.patch, trunk.tokens)
        return {}


# ------------------------------------------------------------------------------------------------
# The modules


class AdaptFormer(nn.Module):
    """s * up(ReLU(down(LN(x)))): LIFT's AdaptFormer branch (zero at initialisation: up is zero)."""

    def __init__(self, width: int, bottleneck: int, scale: float | None):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.down = nn.Linear(width, bottleneck)
        self.up = nn.Linear(bottleneck, width)
        nn.init.kaiming_normal_(self.down.weight, a=math.sqrt(5))
        for p in (self.up.weight, self.down.bias, self.up.bias):
            nn.init.zeros_(p)
        if scale is None:
            self.scale = nn.Parameter(torch.ones(1))
        else:
            self.register_buffer("scale", torch.tensor([float(scale)]), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(F.relu(self.down(self.ln(x)))) * self.scale


class ParallelAdapterMLP(nn.Module):
    """A block's MLP with the adapter beside it: norm and MLP of the block (its modules, not copies), so
    ``x + MLP(norm(x))`` becomes ``x + MLP(norm(x)) + adapter(x)`` once the block's own norm is an Identity."""

    def __init__(self, norm: nn.Module, mlp: nn.Module, adapter: nn.Module):
        super().__init__()
        self.norm, self.mlp, self.adapter = norm, mlp, adapter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.norm(x)) + self.adapter(x)


class LowRank(nn.Module):
    """(alpha / r) * x A B, A (in, r) ~ U(-1/sqrt(r), 1/sqrt(r)) and B = 0, as LIFT's LoRA module."""

    def __init__(self, width: int, rank: int, alpha: float):
        super().__init__()
        self.a = nn.Parameter(torch.empty(width, rank))
        self.b = nn.Parameter(torch.zeros(rank, width))
        nn.init.kaiming_uniform_(self.a, a=math.sqrt(5))
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.a @ self.b) * self.scaling


class QKVLowRank(nn.Module):
    """The low-rank updates of the q, k and v parts of a fused (3D)-wide projection, zeros elsewhere."""

    def __init__(self, width: int, rank: int, alpha: float, targets: list[str]):
        super().__init__()
        self.width = width
        self.parts = nn.ModuleDict({t: LowRank(width, rank, alpha) for t in targets})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        zero = x.new_zeros(*x.shape[:-1], self.width)
        return torch.cat([self.parts[t](x) if t in self.parts else zero for t in ("q", "k", "v")], dim=-1)


class LinearWithDelta(nn.Module):
    """A Linear layer (the block's own) plus an additive update of its output: timm's fused qkv + LoRA."""

    def __init__(self, linear: nn.Linear, delta: nn.Module):
        super().__init__()
        self.linear, self.delta = linear, delta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.delta(x)


class AttentionWithDelta(nn.Module):
    """nn.MultiheadAttention (batch first, self-attention, as open_clip's blocks call it) with an additive
    update of its fused qkv projection: the MHA's own weights, then scaled dot-product attention."""

    def __init__(self, mha: nn.MultiheadAttention, delta: nn.Module):
        super().__init__()
        self.mha, self.delta = mha, delta

    def forward(self, q_x, k_x=None, v_x=None, need_weights=False, attn_mask=None):
        m = self.mha
        n, length, width = q_x.shape
        qkv = F.linear(q_x, m.in_proj_weight, m.in_proj_bias) + self.delta(q_x)
        heads = [t.reshape(n, length, m.num_heads, width // m.num_heads).transpose(1, 2) for t in qkv.chunk(3, -1)]
        out = F.scaled_dot_product_attention(*heads, attn_mask=attn_mask)
        return m.out_proj(out.transpose(1, 2).reshape(n, length, width)), None


class Prompts(nn.Module):
    """VPT: ``length`` learnable tokens per prompted layer, appended after the image tokens (as LIFT does;
    without positional embeddings their place in the sequence does not change any output token)."""

    def __init__(self, layers: int, length: int, width: int, patch: int, tokens: int):
        super().__init__()
        bound = math.sqrt(6.0 / float(3 * patch * patch + width))
        self.tokens = tokens  # image tokens (class token included): what a deeper layer keeps
        self.prompts = nn.Parameter(torch.empty(layers, length, width).uniform_(-bound, bound))

    def insert(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        if layer >= len(self.prompts):
            return x
        return torch.cat([x[:, : self.tokens], self.prompts[layer].to(x.dtype).expand(len(x), -1, -1)], dim=1)
