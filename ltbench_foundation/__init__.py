"""Pretrained foundation backbones (CLIP, ImageNet-21k ViT) with lightweight fine-tuning: the second
setting of long-tailed recognition (docs/foundation.md).

Layout: ``weights`` (finding, identifying and reading weights files), ``trunks`` (the library ViTs walked
block by block), ``tuning`` (the tune modes), ``backbone`` (the shared backbone class), ``clip`` and
``timm_vit`` (the families), ``prompts`` (class names and prompt templates shipped with ltbench). The
backbones are registered in ``registered`` (a core module of the registry); open_clip and timm are imported only when one is built.
"""

from ltbench.pretrained.backbone import PretrainedConfig, PretrainedViT
from ltbench.pretrained.clip import ClipViT, ClipViTB16
from ltbench.pretrained.timm_vit import TimmViT, ViTB16In21k
from ltbench.pretrained.tuning import TuneMode, resolve_tune
from ltbench.pretrained.weights import WeightsMissingError, read_state_dict

__all__ = ["ClipViT", "ClipViTB16", "PretrainedConfig", "PretrainedViT", "TimmViT", "TuneMode", "ViTB16In21k",
           "WeightsMissingError", "read_state_dict", "resolve_tune"]
