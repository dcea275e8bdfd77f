"""LIFT (Shi et al., ICML 2024, "Long-Tail Learning with Foundation Model: Heavy Fine-Tuning Hurts"), the
method half: a cosine classifier initialised from the text embeddings of the class names, trained with the
logit-adjusted loss. The other halves are the backbone's (``backbone: {name: clip_vit_b16, tune: adaptformer}``)
and the recipe's (SGD, lr 0.01, batch 128, 10 epochs or 20 on iNaturalist, per-epoch cosine decay, test-time
ensembling ``eval.tte: fivecrop``): recipes/*_clip.yaml compose them; docs/foundation.md lists each setting
with its place in LIFT's code (github shijxcs/LIFT: trainer.py, models/classifiers.py, utils/losses.py).

* Head: s * cos(h, w_y), s = 25 (LIFT's ``scale``), no bias; h is the backbone's feature (CLIP: the class
  token after ln_post, before the projection).
* Initialisation (``init: text``, LIFT's ``init_head: text_feat``): for each class the mean over the prompt
  templates of the unit text embeddings (one template by default, 'a photo of a {}.'), mapped into the
  feature space by the transposed image projection and renormalised: w_y = normalise(t_y P^T).
  ``init: random``: LIFT's random init (uniform, unit rows), for backbones without a text tower.
* Loss: CE(z + tau * log pi, y) with pi the training class frequencies (LIFT's LogitAdjustedLoss, tau = 1).
* Prediction: z + log(K p_t) (z is balanced; the target-prior term is zero for the uniform prior).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from ltbench.config import check_range, check_views
from ltbench.errors import ConfigError
from ltbench.method import Method
from ltbench.registry import BACKBONES, METHODS
from ltbench_foundation import prompts
from methods.la import log_prior_adjustment


@dataclass
class LIFTConfig:
    s: float = 25.0  # cosine scale (LIFT's default 'scale')
    tau: float = 1.0  # logit-adjustment temperature
    init: Literal["text", "random"] = "text"  # text: from the backbone's text tower (CLIP)
    templates: str = "photo"  # prompt set of the text init (ltbench_foundation/prompts.py); LIFT's 'ensemble': imagenet80
    views: list[str] | None = None  # default: one 'default' view (a pretrained backbone's: random resized crop + flip)

    def validate(self) -> None:
        check_range("s", self.s, 0, 1000, low_open=True)
        check_range("tau", self.tau, 0, 100)
        check_views(self.views)
        if self.templates not in prompts.TEMPLATE_SETS:
            raise ValueError(f"templates must be one of {', '.join(prompts.TEMPLATE_SETS)}, got {self.templates!r}")


def text_tower_check(config: dict, why: str) -> None:
    """ValueError unless the run's backbone has a text tower (``text_embeddings``)."""
    backbone = config["backbone"]["name"]
    if not callable(getattr(BACKBONES.get(backbone), "text_embeddings", None)):
        raise ValueError(f"method.{why} needs a backbone with a text tower (clip_vit_b16, clip_vit); "
                         f"backbone {backbone} has none")


def text_classifier(ctx, template_set: str) -> torch.Tensor:
    """(K, e) unit text embeddings of the class names under the template set (mean over templates,
    renormalised), from the backbone's text tower."""
    names = prompts.class_names(ctx.dataset, ctx.class_names, ctx.num_classes)
    text = ctx.backbone.text_embeddings(prompts.class_prompts(names, prompts.templates(template_set, ctx.dataset)))
    return F.normalize(text, dim=-1)


class CosineHead(nn.Module):
    """s * cos(h, w_y) with w (K, d), as LIFT's CosineClassifier; computed in float32."""

    def __init__(self, in_features: int, classes: int, s: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(classes, in_features).uniform_(-1, 1).renorm_(2, 0, 1e-5).mul_(1e5))
        self.s = s

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=h.device.type, enabled=False):
            return F.linear(F.normalize(h.float(), dim=-1), F.normalize(self.weight.float(), dim=-1)) * self.s


@METHODS.register("lift", display="LIFT")
class LIFT(Method):
    """Text-initialised cosine classifier + logit-adjusted loss (module docstring)."""

    Config = LIFTConfig
    search_space = {"tau": {"uniform": [0.5, 2.0]}}  # around LIFT's 1 (docs/methods.md)

    def __init__(self, cfg: LIFTConfig, ctx):
        super().__init__(cfg, ctx)
        self.head = CosineHead(ctx.feature_dim, ctx.num_classes, cfg.s)
        # tau * log(pi), LIFT's adjustment, kept on the model's device (no host-to-device copy per step)
        self.register_buffer("adjust", log_prior_adjustment(ctx.train_prior, cfg.tau), persistent=False)
        if cfg.init == "text" and ctx.backbone is not None:  # stage 2 rebuilds without it: the checkpoint has w
            if not callable(getattr(ctx.backbone, "text_embeddings", None)):
                raise ConfigError("method.init: text needs a backbone with a text tower (clip_vit_b16, clip_vit)")
            with torch.no_grad():
                text = text_classifier(ctx, cfg.templates)
                self.head.weight.copy_(F.normalize(ctx.backbone.text_to_features(text).float(), dim=-1).cpu())

    @classmethod
    def check_run_config(cls, config: dict) -> None:
        if config["method"]["init"] == "text":
            text_tower_check(config, "init: text")

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(h)

    def loss(self, features, labels, *, epoch):
        z = self.logits(features[0])
        return {"loss": F.cross_entropy(z + self.adjust, labels), "logits": z.detach()}

    def predict(self, features, *, target_prior=None):
        z = self.logits(features)
        return z + self.target_shift(target_prior, z)

    @torch.no_grad()
    def result_extras(self) -> dict:
        return {"weight_norm": self.head.weight.float().norm(dim=1).cpu().tolist()}
