"""The foundation track's part of ``ltbench check``: the contract of a tune mode, which the core cannot run
(it knows no backbone to apply one to). The core validates the mode's defaults and then asks the mode itself
(``TuneMode.check``, ltbench/contract.py); this module answers, on a tiny random-weight timm ViT."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import torch.nn as nn

from ltbench.contract import ContractError, Skipped
from ltbench.registry import BACKBONES


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise ContractError(message)


def check_tune_mode(cls, name: str) -> str:
    """A tune mode on a tiny random-weight timm ViT (2 blocks, width 32, 16 x 16 images): applied, the backbone
    gives finite (N, width) features and gradients to what it trains; a features-only mode trains nothing; what
    it trains is in the checkpoint and comes back from it (the same features)."""
    try:
        from timm.models.vision_transformer import VisionTransformer  # lazy: timm only for this check
    except ImportError:
        raise Skipped("needs timm (the tiny ViT it is checked on; pip install 'ltbench[foundation]')") from None
    shape = {"image_size": 16, "patch_size": 8, "width": 32, "layers": 2, "heads": 2}
    x = torch.rand(3, 3, 16, 16)
    with tempfile.TemporaryDirectory(prefix="ltbench-check-") as tmp:
        torch.manual_seed(0)
        torch.save(VisionTransformer(img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                                     num_classes=0).state_dict(), Path(tmp) / "vit.pt")

        def tuned(seed: int) -> nn.Module:  # another seed: a resumed run's fresh modules start elsewhere
            torch.manual_seed(seed)
            spec = {"name": "timm_vit", "weights": str(Path(tmp) / "vit.pt"), "tune": name, **shape}
            net = BACKBONES.build(spec, in_channels=3, where=f"tune mode {name}")
            net.apply_tune(num_classes=10)
            return net

        net, fresh = tuned(1), tuned(2)
    trained = [p for p in net.parameters() if p.requires_grad]
    _expect(not (cls.features_only and trained), "a features_only mode must train nothing")
    out = net.train()(x)
    _expect(tuple(out.shape) == (3, 32) and bool(torch.isfinite(out).all()),
            f"the tuned backbone must give finite (N, width) = (3, 32) features, got {tuple(out.shape)}")
    if trained:
        out.square().sum().backward()
        _expect(any(p.grad is not None and bool(p.grad.any()) for p in trained), "nothing it trains gets a gradient")
    with torch.no_grad():
        for p in trained:  # away from the initialisation, so the round trip below is not trivially equal
            p.add_(0.01 * torch.randn_like(p))
        fresh.load_state_dict(net.state_dict())
        _expect(torch.equal(fresh.eval()(x), net.eval()(x)), "a checkpoint (state_dict) must hold what the mode "
                "trains and adds: a fresh backbone that loads it must give the same features")
    return f"{sum(p.numel() for p in trained)} trainable parameters on a 2-block ViT of width 32"
