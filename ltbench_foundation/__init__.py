"""The foundation track (docs/foundation.md): pretrained backbones (CLIP, ImageNet-21k ViT) with lightweight
fine-tuning, and the methods built on them (LIFT, zero-shot). A plugin package, installed by the ``foundation``
extra and found by ltbench as any third-party package is, through its entry points (pyproject.toml): the core
never imports it.

Layout: ``weights`` (finding, identifying and reading weights files), ``trunks`` (the library ViTs walked
block by block), ``tuning`` (the tune modes), ``contract`` (their part of ``ltbench check``), ``backbone`` (the shared backbone
class and the Backbone hooks it answers), ``clip`` and ``timm_vit`` (the families, registered there),
``prompts`` (class names and prompt templates shipped with the package), ``methods`` (``lift``, ``zero_shot``).
open_clip and timm are imported only when a backbone is built. Nothing is imported here: each entry point
imports what it registers.
"""
