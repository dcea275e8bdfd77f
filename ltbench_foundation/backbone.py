"""The pretrained-ViT backbone: weights from a file, the model's own preprocessing, a tune mode.

What differs from a backbone trained from scratch, and why:

* weights come from ``backbone.weights`` (or the library's cache; ltbench_foundation/weights.py), their
  sha256 enters the run id (``weights_identity``), and a missing or unfitting file is one line before anything
  runs (``check_weights``);
* the model fixes the images (``bind_data``): its resolution, its resize interpolation and centre-crop
  ratio (``backbone.interpolation`` / ``backbone.crop_pct`` override them, as LIFT uses bilinear), its
  mean and std, applied in ``forward`` (so a 1-channel dataset is repeated to RGB before the model's
  per-channel normalisation, and no dataset's statistics can be used by mistake);
* ``backbone.tune`` decides what trains (ltbench_foundation/tuning.py); it needs the number of classes
  (LIFT's bottleneck rule), so it is applied in ``bind_data``, which the engine calls once the data are
  loaded and before the method is built;
* frozen pretrained weights are left out of ``state_dict()`` (and filled back in when one is loaded): a
  checkpoint holds what training changes, not 600 MB of CLIP per epoch; the weights file, whose sha256
  is in the run id, holds the rest.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn as nn

from ltbench.backbones import Backbone
from ltbench.config import check_range
from ltbench.data.base import ImageSpec
from ltbench.errors import ConfigError
from ltbench.registry import TUNE_MODES
from ltbench_foundation import tuning, weights as weights_mod
from ltbench_foundation.trunks import Trunk


@dataclass
class PretrainedConfig:
    weights: str | None = None  # weights file; None: the library's cache (an execution setting: sha256 in the id)
    tune: Any = "linear"  # a registered tune mode's name, or {name: ..., **options}; normalised at validation
    interpolation: Literal["model", "bicubic", "bilinear"] = "model"  # resize interpolation; model: its own
    crop_pct: float | None = None  # evaluation centre crop / resize ratio; None: the model's own

    def __post_init__(self) -> None:
        self.tune = tuning.resolve_tune(self.tune)  # filled in at construction, so the defaults are in the id

    def validate(self) -> None:
        check_range("crop_pct", self.crop_pct, 0, 1, low_open=True)


@dataclass(frozen=True)
class Preprocess:
    """The model's own input pipeline (what its authors evaluate with)."""

    size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: str
    crop_pct: float


class PretrainedViT(Backbone):
    """Base of the pretrained ViT backbones; a subclass builds the library model (``build``) and loads a
    state dict into it (``load``). What the core asks of it are the optional Backbone hooks (``bind_data``,
    ``weights_identity``, ``check_weights``, ``parameter_report``, ``check_run_config``: docs/adding-a-backbone.md)."""

    Config: ClassVar[type] = PretrainedConfig
    source: ClassVar[weights_mod.WeightSource]
    meta_estimate = False  # its constructor reads the weights file: the memory check (train/resources.py) does not build it

    def __init__(self, cfg: PretrainedConfig, in_channels: int = 3):
        super().__init__()
        self.cfg, self.in_channels = cfg, in_channels
        path = weights_mod.find_weights(cfg.weights, self.source)
        model, self.trunk, self.preprocess = _built(self, cfg)
        self.model = model  # the library model: the image tower, and for CLIP its text tower
        self.load(path)
        self.model.float()
        for p in self.parameters():
            p.requires_grad_(False)
        self.feature_dim = self.trunk.width
        self.tune_mode: tuning.TuneMode = TUNE_MODES.build(cfg.tune, where="backbone.tune")
        self.prompts: tuning.Prompts | None = None
        self.tuned = nn.ModuleDict()  # the modules a tune mode added (adapters, LoRA, prompts)
        self.tune_report: dict = {"tune": cfg.tune["name"]}
        self.register_buffer("mean", torch.tensor(self.preprocess.mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(self.preprocess.std).view(1, 3, 1, 1), persistent=False)
        self.register_state_dict_post_hook(_drop_frozen)
        self.register_load_state_dict_pre_hook(_fill_frozen)

    # -- what a subclass provides --------------------------------------------------------------
    def build(self, cfg) -> tuple[nn.Module, Trunk, Preprocess]:
        raise NotImplementedError

    def load(self, path) -> None:
        raise NotImplementedError

    @classmethod
    def weights_identity(cls, cfg: PretrainedConfig) -> str:
        """'sha256:<hex>' of the weights file this configuration loads (WeightsMissingError when none)."""
        return weights_mod.weights_identity(weights_mod.find_weights(cfg.weights, cls.source))

    @classmethod
    def check_weights(cls, cfg: PretrainedConfig) -> None:
        """Before the first run (``launch.checks_before_any_run``): the weights file is readable without running
        code, its keys and shapes fit this configuration's model (built on the meta device: no memory), and its
        values are finite; else one line naming the file and what is wrong (exit 2), before any worker starts."""
        path = weights_mod.find_weights(cfg.weights, cls.source)
        probe = cls.__new__(cls)
        nn.Module.__init__(probe)
        probe.cfg = cfg
        with torch.device("meta"):
            probe.model = _built(probe, cfg)[0]
        state = probe.weights_state(path)
        # Google's .npz names its arrays in its own layout: timm's converter checks them when a run loads them
        problem = "" if str(path).endswith(".npz") else weights_mod.fit_problem(probe.model, state)
        if problem:
            raise weights_mod.WeightsFileError(path, f"these weights do not fit backbone {cls.source.backbone} "
                                                     f"({problem}); check the backbone's shape options")
        bad = weights_mod.non_finite(state)
        if bad:
            raise weights_mod.WeightsFileError(path, f"'{bad}' holds NaN or infinite values (a damaged or diverged "
                                                     f"file)")

    def weights_state(self, path) -> dict:
        """The file's tensors as the model's state dict names them (what ``load`` loads)."""
        raise NotImplementedError

    @classmethod
    def check_run_config(cls, config: dict) -> None:
        """A features-only mode (``frozen``) trains no epoch (optim.epochs 0); every other mode trains (epochs
        >= 1), so no two tune names describe one computation."""
        mode, epochs = config["backbone"]["tune"]["name"], config["optim"]["epochs"]
        if TUNE_MODES.get(mode).features_only and epochs:
            raise ValueError(f"backbone.tune: '{mode}' is features only (zero-shot, a base for stage 2) and needs "
                             f"optim.epochs: 0 (got {epochs}); to train a head on the frozen backbone use 'linear'")
        if not TUNE_MODES.get(mode).features_only and not epochs:
            raise ValueError(f"optim.epochs: 0 trains nothing, so tune '{mode}' would be 'frozen'; use tune: frozen")

    # -- the data side -------------------------------------------------------------------------
    def image_spec(self, data_image: ImageSpec) -> ImageSpec:
        """The images the model takes: its resolution, resize interpolation and crop ratio, as floats in
        [0, 1] (mean 0, std 1: the model's own normalisation is the first step of ``forward``)."""
        p, c = self.preprocess, data_image.channels
        interpolation = p.interpolation if self.cfg.interpolation == "model" else self.cfg.interpolation
        return ImageSpec(size=p.size, channels=c, mean=(0.0,) * c, std=(1.0,) * c, kind="large",
                         interpolation=interpolation, crop_pct=self.cfg.crop_pct or p.crop_pct)

    def bind_data(self, data):
        """The data as this model sees them (``image_spec``; 'default' training view: random resized crop
        and flip, LIFT's), and the tune mode applied for ``data.num_classes`` classes."""
        self.apply_tune(data.num_classes)
        if data.image.channels not in (1, 3):
            raise ConfigError(f"backbone {self.source.backbone}: images with {data.image.channels} channels; "
                              f"a pretrained RGB model takes 1 (repeated) or 3")
        return dataclasses.replace(data, image=self.image_spec(data.image),
                                   pipelines={**data.pipelines, "default": "standard", "eval": "eval"})

    # -- tuning --------------------------------------------------------------------------------
    def apply_tune(self, num_classes: int) -> None:
        """Add the tune mode's modules and unfreeze what it trains (once; ``TuneMode.apply``)."""
        if not self.tune_report.get("applied"):
            self.tune_report.update(self.tune_mode.apply(self, num_classes), applied=True)

    def parameter_report(self) -> dict:
        """result.json 'parameters.backbone_tuning': the tune mode, its bottleneck, and the trainable
        parameters it added or unfroze (the pretrained total is in 'parameters.backbone')."""
        out = {k: v for k, v in self.tune_report.items() if k != "applied"}
        out["trainable"] = sum(p.numel() for p in self.parameters() if p.requires_grad)
        out["pretrained_image_tower"] = sum(p.numel() for p in self.trunk.module.parameters() if not _is_tuned(p, self))
        return out

    def train(self, mode: bool = True):
        """The pretrained model stays in eval mode unless its tune mode says its own weights train (``full``): what LIFT does
        (only its tuner is put in train mode); it matters for dropout and BatchNorm, not LayerNorm."""
        super().train(mode)
        if not self.tune_mode.pretrained_in_train_mode:
            self.model.eval()
            self.tuned.train(mode)
        return self

    # -- the forward pass ----------------------------------------------------------------------
    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        return (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.trunk.embed(self.normalise(x))
        for i, block in enumerate(self.trunk.blocks):
            if self.prompts is not None:
                x = self.prompts.insert(x, i)
            x = block(x)
        return self.trunk.pool(x)


def _built(backbone: PretrainedViT, cfg) -> tuple[nn.Module, Trunk, Preprocess]:
    """``backbone.build(cfg)``, or one line (exit 2) naming the extra that installs its library (open_clip, timm)."""
    try:
        return backbone.build(cfg)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"backbone {backbone.source.backbone} needs {exc.name}, which is not installed: "
                          f"pip install 'ltbench[foundation]'") from None


def _is_tuned(p: torch.Tensor, backbone: PretrainedViT) -> bool:
    return any(p is q for q in backbone.tuned.parameters()) or (
        backbone.prompts is not None and p is backbone.prompts.prompts)


def _frozen_names(module: nn.Module) -> set[str]:
    return {name for name, p in module.named_parameters() if not p.requires_grad}


def _drop_frozen(module, state_dict, prefix, local_metadata) -> None:
    """state_dict post-hook: frozen pretrained parameters stay in the weights file, not the checkpoint."""
    for name in _frozen_names(module):
        state_dict.pop(prefix + name, None)


def _fill_frozen(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    """load pre-hook: a checkpoint without the frozen parameters keeps the ones loaded from the weights."""
    own = dict(module.named_parameters())
    for name in _frozen_names(module):
        state_dict.setdefault(prefix + name, own[name].detach())
