"""Zero-shot CLIP (Radford et al., 2021) as a row: no training, the class names' text embeddings are the classifier.

score_y(x) = exp(logit_scale) * cos(P^T h(x), t_y) + log(K p_t): h the image feature (class token after
ln_post), P CLIP's image projection, t_y the unit mean over the prompt templates of class y's unit text
embeddings (CLIP's prompt ensembling), logit_scale CLIP's learned temperature (100 for OpenAI's models).
Default prompts 'a photo of a {}.' (LIFT's zero-shot row, its ``zsclip`` configs); ``templates: dataset``
takes the set CLIP used for the dataset (80 for ImageNet). The scores are treated as balanced (a uniform
prior over the classes), so a target prior p_t adds log(K p_t), as for every other method.

A run of this method trains nothing: it needs ``optim.epochs: 0`` and ``backbone.tune: frozen`` (checked when
the recipe is loaded). The text classifier and the projection are buffers, so the final checkpoint holds them
and stage 2 (``ltbench posthoc``) can use the run without a text tower.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ltbench.method import Method
from ltbench.registry import METHODS
from ltbench_foundation import prompts

from .lift import text_classifier, text_tower_check


@dataclass
class ZeroShotConfig:
    templates: str = "photo"  # prompt set (ltbench_foundation/prompts.py): photo, imagenet80, dataset, ...

    def validate(self) -> None:
        if self.templates not in prompts.TEMPLATE_SETS:
            raise ValueError(f"templates must be one of {', '.join(prompts.TEMPLATE_SETS)}, got {self.templates!r}")


@METHODS.register("zero_shot", display="Zero-shot")
class ZeroShot(Method):
    """CLIP's zero-shot classifier from the class names (module docstring)."""

    Config = ZeroShotConfig
    BUFFERS = ("text", "proj", "scale")

    def __init__(self, cfg: ZeroShotConfig, ctx):
        super().__init__(cfg, ctx)
        backbone = ctx.backbone
        if backbone is None:  # rebuilt for stage 2: the checkpoint holds the buffers (_load_from_state_dict)
            text, proj, scale = torch.zeros(0), torch.zeros(0), torch.zeros(())
        else:
            text = text_classifier(ctx, cfg.templates).cpu()
            proj = backbone.model.visual.proj.detach().float().cpu().clone()
            scale = torch.tensor(backbone.logit_scale)
        self.register_buffer("text", text)
        self.register_buffer("proj", proj)
        self.register_buffer("scale", scale)

    @classmethod
    def check_run_config(cls, config: dict) -> None:
        text_tower_check(config, "name: zero_shot")
        if config["optim"]["epochs"] or config["backbone"]["tune"]["name"] != "frozen":
            raise ValueError("method.name: zero_shot trains nothing; set optim.epochs: 0 (and warmup_epochs: 0) "
                             "and backbone.tune: frozen")

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in self.BUFFERS:  # take the checkpoint's shapes (a stage-2 rebuild starts from empty ones)
            if prefix + name in state_dict:
                setattr(self, name, torch.empty_like(state_dict[prefix + name]))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def loss(self, features, labels, *, epoch):
        raise RuntimeError("zero_shot trains nothing (optim.epochs: 0)")

    def predict(self, features, *, target_prior=None):
        with torch.autocast(device_type=features.device.type, enabled=False):
            image = F.normalize(features.float() @ self.proj, dim=-1)
            z = self.scale * image @ self.text.T
        return z + self.target_shift(target_prior, z)
