"""The foundation track against the official code, on identical inputs and identical random weights.

* CLIP: a functional re-statement (ours) of OpenAI's clip/model.py (VisionTransformer.forward, CLIP.encode_text:
  LND layout, nn.MultiheadAttention maths, QuickGELU, ln_post on the class token, the projections, the causal
  text mask, the end-of-text token), applied to the state dict of a full-width ViT-B/16 reduced to one block per
  tower (the code path is the same at any depth; 12 blocks would only make the test slower).
* timm: the ViT-B/16 shape (one block) against timm's own forward_features / forward_head(pre_logits=True).
* LIFT (github shijxcs/LIFT): re-statements of its AdaptFormer block arithmetic (models/peft_vit.py, which calls
  F.scaled_dot_product_attention on the block's weights, and models/peft_modules.py), its text initialisation
  (trainer.init_head_text_feat), its LogitAdjustedLoss (utils/losses.py) and its five-crop TTE (transform and
  mean of the logits over crops, trainer.test), each against ltbench's code.

The maximum absolute differences are in docs/foundation.md; the bounds here are a few float32 ulps of the values.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pretrained_kit import build, clip_backbone, timm_backbone

B16_ONE_BLOCK = {"image_size": 224, "patch_size": 16, "width": 768, "layers": 1, "heads": 12, "embed_dim": 512,
                 "text_width": 512, "text_heads": 8, "text_layers": 1}


@pytest.fixture(scope="module")
def b16(tmp_path_factory):
    """A CLIP ViT-B/16 shape (one block per tower) with random weights, saved and loaded as a user's file."""
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg

    torch.manual_seed(0)
    s = B16_ONE_BLOCK
    model = CLIP(s["embed_dim"], quick_gelu=True,
                 vision_cfg=CLIPVisionCfg(layers=1, width=768, head_width=64, patch_size=16, image_size=224),
                 text_cfg=CLIPTextCfg(width=512, heads=8, layers=1))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln" in name:
                p.add_(0.05 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("b16") / "b16.pt"
    state = model.state_dict()
    torch.save(state, path)
    net, _ = build({**clip_backbone(path), **s})
    return net.eval(), {k: v.float() for k, v in state.items()}, path


def within(what: str, ours: torch.Tensor, ref: torch.Tensor, bound: float) -> bool:
    """max |ours - ref| <= bound; printed (pytest -s) for the table in docs/foundation.md."""
    diff = float((ours.detach() - ref.detach()).abs().max())
    print(f"max abs difference, {what}: {diff:.2g} (bound {bound:g})")
    return diff <= bound


def ln(x, sd, key, eps=1e-5):
    return F.layer_norm(x, x.shape[-1:], sd[f"{key}.weight"], sd[f"{key}.bias"], eps)


def openai_block(x, sd, key, heads, mask=None):
    """OpenAI's ResidualAttentionBlock on (L, N, D): x + attn(ln_1(x)); x + c_proj(QuickGELU(c_fc(ln_2(x))))."""
    length, n, d = x.shape
    h = ln(x, sd, f"{key}.ln_1")
    q, k, v = F.linear(h, sd[f"{key}.attn.in_proj_weight"], sd[f"{key}.attn.in_proj_bias"]).chunk(3, -1)
    split = lambda t: t.reshape(length, n * heads, d // heads).transpose(0, 1)  # noqa: E731
    scores = split(q) / math.sqrt(d // heads) @ split(k).transpose(1, 2)
    if mask is not None:
        scores = scores + mask
    out = (scores.softmax(-1) @ split(v)).transpose(0, 1).reshape(length, n, d)
    x = x + F.linear(out, sd[f"{key}.attn.out_proj.weight"], sd[f"{key}.attn.out_proj.bias"])
    h = F.linear(ln(x, sd, f"{key}.ln_2"), sd[f"{key}.mlp.c_fc.weight"], sd[f"{key}.mlp.c_fc.bias"])
    h = h * torch.sigmoid(1.702 * h)
    return x + F.linear(h, sd[f"{key}.mlp.c_proj.weight"], sd[f"{key}.mlp.c_proj.bias"])


def openai_image(images, sd, heads=12):
    """OpenAI's VisionTransformer.forward up to ln_post (the features) and after the projection."""
    x = F.conv2d(images, sd["visual.conv1.weight"], stride=sd["visual.conv1.weight"].shape[-1])
    x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
    x = torch.cat([sd["visual.class_embedding"] + torch.zeros(x.shape[0], 1, x.shape[-1]), x], dim=1)
    x = ln(x + sd["visual.positional_embedding"], sd, "visual.ln_pre").permute(1, 0, 2)
    blocks = sorted({k.split(".")[3] for k in sd if k.startswith("visual.transformer.resblocks.")})
    for b in blocks:
        x = openai_block(x, sd, f"visual.transformer.resblocks.{b}", heads)
    features = ln(x.permute(1, 0, 2)[:, 0, :], sd, "visual.ln_post")
    return features, features @ sd["visual.proj"]


def openai_text(tokens, sd, heads=8):
    """OpenAI's CLIP.encode_text: causal mask, ln_final, the end-of-text token, text_projection."""
    length = tokens.shape[1]
    mask = torch.empty(length, length).fill_(float("-inf")).triu_(1)
    x = (sd["token_embedding.weight"][tokens] + sd["positional_embedding"]).permute(1, 0, 2)
    blocks = sorted({k.split(".")[2] for k in sd if k.startswith("transformer.resblocks.")})
    for b in blocks:
        x = openai_block(x, sd, f"transformer.resblocks.{b}", heads, mask)
    x = ln(x.permute(1, 0, 2), sd, "ln_final")
    return x[torch.arange(len(x)), tokens.argmax(-1)] @ sd["text_projection"]


def test_clip_image_and_text_towers_equal_openai(b16):
    net, sd, _ = b16
    torch.manual_seed(1)
    pixels = torch.rand(2, 3, 224, 224)
    mean, std = torch.tensor(net.preprocess.mean).view(1, 3, 1, 1), torch.tensor(net.preprocess.std).view(1, 3, 1, 1)
    with torch.no_grad():
        ours = net(pixels)
        ref, ref_embedded = openai_image((pixels - mean) / std, sd)
        assert within("CLIP image features", ours, ref, 2e-4)
        assert within("CLIP image embeddings", net.image_embeddings(ours), ref_embedded, 2e-4)
        from open_clip.tokenizer import SimpleTokenizer

        prompts = [["a photo of a tench.", "a photo of the tench."], ["a photo of a goldfish."]]
        tokens = SimpleTokenizer()([p for c in prompts for p in c])
        unit = F.normalize(openai_text(tokens, sd), dim=-1)
        ref_text = torch.stack([unit[:2].mean(0), unit[2]])
        assert within("CLIP text embeddings", net.text_embeddings(prompts), ref_text, 1e-5)


def test_timm_vit_equals_timm_forward(tmp_path):
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(img_size=224, patch_size=16, embed_dim=768, depth=1, num_heads=12, num_classes=21843)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name or "token" in name:
                p.add_(0.05 * torch.randn_like(p))
    torch.save(model.state_dict(), tmp_path / "vit.pth")  # with its 21k head, which the backbone drops
    net, _ = build(timm_backbone(tmp_path / "vit.pth", image_size=224, patch_size=16, width=768, layers=1, heads=12))
    pixels = torch.rand(2, 3, 224, 224)
    with torch.no_grad():
        ref = model.eval().forward_head(model.forward_features((pixels - 0.5) / 0.5), pre_logits=True)
        assert within("timm ViT features", net.eval()(pixels), ref, 1e-4)


def lift_block_with_adaptformer(x, sd, key, heads, adapter):
    """LIFT's Peft_ViT loop body for one CLIP block with its AdaptFormer (no other tuner), on (L, N, D):
    x = x + out_proj(SDPA(q, k, v)); then x = x + c_proj(act(c_fc(ln_2(x)))) + adaptformer(x)."""
    length, n, d = x.shape
    identity = x
    q, k, v = F.linear(ln(x, sd, f"{key}.ln_1"), sd[f"{key}.attn.in_proj_weight"],
                       sd[f"{key}.attn.in_proj_bias"]).chunk(3, -1)
    split = lambda t: t.contiguous().view(length, n * heads, d // heads).transpose(0, 1)  # noqa: E731
    x = F.scaled_dot_product_attention(split(q), split(k), split(v)).transpose(0, 1).contiguous().view(-1, d)
    x = F.linear(x, sd[f"{key}.attn.out_proj.weight"], sd[f"{key}.attn.out_proj.bias"]).view(length, n, d) + identity
    identity = x
    h = F.linear(ln(x, sd, f"{key}.ln_2"), sd[f"{key}.mlp.c_fc.weight"], sd[f"{key}.mlp.c_fc.bias"])
    h = F.linear(h * torch.sigmoid(1.702 * h), sd[f"{key}.mlp.c_proj.weight"], sd[f"{key}.mlp.c_proj.bias"])
    a = F.layer_norm(identity, (d,), adapter["ln.weight"], adapter["ln.bias"])
    a = F.linear(F.relu(F.linear(a, adapter["down.weight"], adapter["down.bias"])), adapter["up.weight"],
                 adapter["up.bias"]) * adapter["scale"]
    return h + a + identity


def test_adaptformer_block_equals_lift(tiny_weights_b16_adapter):
    net, sd, pixels = tiny_weights_b16_adapter
    adapter = {k.split("adaptformer.0.", 1)[1]: v for k, v in net.tuned.state_dict().items()}
    mean, std = torch.tensor(net.preprocess.mean).view(1, 3, 1, 1), torch.tensor(net.preprocess.std).view(1, 3, 1, 1)
    with torch.no_grad():
        x = F.conv2d((pixels - mean) / std, sd["visual.conv1.weight"], stride=16)
        x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
        x = torch.cat([sd["visual.class_embedding"].expand(len(x), 1, -1), x], dim=1)
        x = ln(x + sd["visual.positional_embedding"], sd, "visual.ln_pre").permute(1, 0, 2)
        x = lift_block_with_adaptformer(x, sd, "visual.transformer.resblocks.0", 12, adapter)
        ref = ln(x.permute(1, 0, 2)[:, 0], sd, "visual.ln_post")
        assert within("AdaptFormer block (LIFT)", net(pixels), ref, 2e-4)


@pytest.fixture(scope="module")
def tiny_weights_b16_adapter(b16):
    """The one-block ViT-B/16 with an AdaptFormer of LIFT's ImageNet-LT width (32) and random, non-zero weights."""
    _, sd, path = b16
    net, _ = build({**clip_backbone(path, {"name": "adaptformer", "bottleneck": 32}), **B16_ONE_BLOCK})
    torch.manual_seed(2)
    with torch.no_grad():
        for p in net.tuned.parameters():
            p.copy_(0.1 * torch.randn_like(p))
    return net.eval(), sd, torch.rand(2, 3, 224, 224)


def test_lift_text_init_loss_and_tte_equal_lift(b16):
    """The classifier initialisation, the loss and the five-crop aggregation, each against LIFT's arithmetic."""
    from ltbench.method import MethodContext
    from ltbench.data.base import ImageSpec
    from ltbench.data.transforms import CropEnsemble
    from ltbench_foundation.methods.lift import LIFT, LIFTConfig

    net, sd, _ = b16
    counts = torch.tensor([40, 10, 3])
    ctx = MethodContext(3, counts, 768, 10, dataset="cifar100_lt_subset", class_names=("tench", "goldfish", "great_white"),
                        backbone=net)
    method = LIFT(LIFTConfig(templates="cifar100"), ctx)  # 18 templates: the ensemble path, cheaper than 80
    # trainer.init_head_text_feat's 'ensemble' arithmetic: mean of unit text features, @ proj.t(), normalise
    from ltbench_foundation import prompts
    from open_clip.tokenizer import SimpleTokenizer

    templates = prompts.templates("cifar100", None)
    names = ["tench", "goldfish", "great white"]  # LIFT replaces '_' by ' '
    with torch.no_grad():
        per_template = [F.normalize(openai_text(SimpleTokenizer()([t.format(c) for c in names]), sd), dim=-1)
                        for t in templates]
        ref_w = F.normalize(torch.stack(per_template).mean(0) @ sd["visual.proj"].t(), dim=-1)
    assert within("text-initialised head (LIFT)", method.head.weight, ref_w, 1e-5)
    # utils/losses.py LogitAdjustedLoss (tau 1): CE(logit + log(n / sum n), y), logit = 25 * cos
    torch.manual_seed(3)
    h, y = torch.randn(6, 768), torch.tensor([0, 1, 2, 0, 0, 1])
    logit = F.linear(F.normalize(h, dim=-1), F.normalize(method.head.weight, dim=-1)) * 25
    ref_loss = F.cross_entropy(logit + torch.log(counts / counts.sum()), y)
    assert within("LIFT loss", method.loss([h], y, epoch=0)["loss"].detach(), ref_loss, 1e-5)
    # TTE: Resize(224 + 24) and FiveCrop(224) of the uint8 image, each crop normalised; mean of the crops' logits
    from torchvision.transforms import v2

    image = torch.randint(0, 256, (3, 260, 300), dtype=torch.uint8)
    spec = ImageSpec(224, 3, (0.0,) * 3, (1.0,) * 3, kind="large", interpolation="bilinear")
    crops = CropEnsemble(spec, "fivecrop", 24)(image)
    resized = v2.Resize(248, antialias=True)(image)
    ref_crops = torch.stack([c.float() / 255 for c in v2.FiveCrop(224)(resized)])
    assert crops.shape == (5, 3, 224, 224) and within("TTE crops", crops, ref_crops, 1e-6)
    from ltbench.train.engine import predict_scores

    class _Run:  # what predict_scores reads of a run
        pass

    run = _Run()
    run.method = method.eval()
    feats = torch.randn(2, 5, 768)
    ref_scores = method.predict(feats.reshape(10, 768)).view(2, 5, -1).mean(1)
    assert within("TTE aggregation", predict_scores(run, feats, None), ref_scores, 1e-6)
