"""Pretrained backbones: weights files (formats, sha256 in the run id, the missing-file line), the model's own
preprocessing, and the tune modes (what trains, how many parameters, what a checkpoint holds)."""

from __future__ import annotations

import shutil

import pytest
import torch
import yaml

from ltbench.config import ConfigError
from ltbench_foundation.weights import WeightsMissingError
from ltbench.registry import TUNE_MODES
from pretrained_kit import CLIP_SHAPE, build, clip_backbone, timm_backbone, tiny_weights  # noqa: F401

from tests.conftest import run_cli

X = torch.rand(3, 3, 32, 32)


def test_every_weights_format_gives_the_same_model(tiny_weights):
    """OpenAI's TorchScript archive, a pickled state dict and safetensors load to identical features."""
    outs = {}
    for key in ("clip", "clip_jit", "clip_safetensors"):
        net, _ = build(clip_backbone(tiny_weights[key]))
        outs[key] = net.eval()(X)
    assert torch.equal(outs["clip"], outs["clip_jit"]) and torch.equal(outs["clip"], outs["clip_safetensors"])
    other, _ = build(clip_backbone(tiny_weights["clip_other"]))
    assert not torch.allclose(other.eval()(X), outs["clip"])


def test_weights_of_another_shape_are_one_line(tiny_weights):
    with pytest.raises(ConfigError, match=r"do not fit backbone clip_vit \('visual.class_embedding' has shape \(64,\), the model \(32,\)"):
        build(clip_backbone(tiny_weights["clip"], width=32, heads=1))


def test_missing_weights_name_backbone_path_and_source(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(WeightsMissingError) as err:
        build({"name": "clip_vit_b16"})
    text = str(err.value)
    assert "backbone clip_vit_b16: weights file not found" in text and str(tmp_path / ".cache/clip/ViT-B-16.pt") in text
    assert "OpenAI publishes ViT-B-16.pt" in text and "\n" not in text
    with pytest.raises(WeightsMissingError, match=r"backbone vit_b16_in21k: .*augreg_in21k"):
        build({"name": "vit_b16_in21k"})
    with pytest.raises(WeightsMissingError, match=str(tmp_path / "nope.pt")):
        build({"name": "clip_vit_b16", "weights": str(tmp_path / "nope.pt")})


def test_library_cache_is_found_without_a_path(tmp_path, monkeypatch, tiny_weights):
    snapshot = tmp_path / "hub/models--timm--vit_base_patch16_224.augreg_in21k/snapshots/abc"
    snapshot.mkdir(parents=True)
    shutil.copy(tiny_weights["timm"], snapshot / "model.safetensors")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    from ltbench_foundation.timm_vit import ViTB16In21k
    from ltbench_foundation.weights import find_weights

    assert find_weights(None, ViTB16In21k.source) == snapshot / "model.safetensors"


def recipe_with(tmp_path, weights, **optim) -> str:
    recipe = {"name": "w", "results_dir": str(tmp_path / "results"), "seeds": [0],
              "data": {"name": "synthetic_lt", "num_classes": 4, "max_per_class": 8, "imb_factor": 4, "test_per_class": 2,
                       "image_size": 12},
              "backbone": clip_backbone(weights), "method": {"name": "la"},
              "optim": {"epochs": 1, "warmup_epochs": 0, "batch_size": 8, **optim}, "train": {"progress": False}}
    path = tmp_path / f"r{len(list(tmp_path.glob('r*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


def test_weights_sha256_is_the_identity_not_the_path(tmp_path, tiny_weights):
    from ltbench.recipe import load_recipe

    def run_of(weights):
        (spec,) = load_recipe(recipe_with(tmp_path, weights)).runs
        return spec

    a = run_of(tiny_weights["clip"])
    moved = tmp_path / "elsewhere.pt"
    shutil.copy(tiny_weights["clip"], moved)
    b = run_of(moved)
    c = run_of(tiny_weights["clip_other"])
    assert a.config["backbone_identity"].startswith("sha256:") and len(a.config["backbone_identity"]) == 71
    assert a.run_id == b.run_id and a.run_id != c.run_id


def test_dry_run_stops_at_missing_weights(tmp_path):
    result = run_cli("run", recipe_with(tmp_path, tmp_path / "absent.pt"), "--dry-run")
    assert result.returncode == 2, result.stderr
    (line,) = [x for x in result.stderr.splitlines() if x.strip()]
    assert "backbone clip_vit: weights file not found" in line and "absent.pt" in line


def test_frozen_and_linear_are_two_computations(tmp_path, tiny_weights):
    """frozen = features only (epochs 0), linear = a head trained on them: never two names for one run."""
    from ltbench.recipe import load_recipe

    with pytest.raises(ConfigError, match="backbone.tune: 'frozen' is features only"):
        load_recipe(recipe_with(tmp_path, tiny_weights["clip"]), ["backbone.tune=frozen"])
    with pytest.raises(ConfigError, match="optim.epochs: 0 trains nothing"):
        load_recipe(recipe_with(tmp_path, tiny_weights["clip"], epochs=0))
    with pytest.raises(ConfigError, match=r"backbone.tune.rank: unknown key"):
        load_recipe(recipe_with(tmp_path, tiny_weights["clip"]), ["backbone.tune={name: adaptformer, rank: 4}"])


def test_model_preprocessing_is_its_own(tiny_weights):
    """CLIP: bicubic, resize to the crop (ratio 1); timm ViT: bicubic, crop 0.9; both overridable (LIFT:
    bilinear, 8/7); the model's mean/std are applied inside forward, a gray image repeated to RGB first."""
    clip, data = build(clip_backbone(tiny_weights["clip"]), in_channels=1)
    assert (data.image.size, data.image.interpolation, data.image.crop_pct, data.image.kind) == (32, "bicubic", 1.0, "large")
    assert data.image.mean == (0.0,) and data.pipelines["default"] == "standard"
    gray = torch.rand(2, 1, 32, 32)
    rgb_net, _ = build(clip_backbone(tiny_weights["clip"]))
    assert torch.allclose(clip.eval()(gray), rgb_net.eval()(gray.expand(-1, 3, -1, -1)), atol=1e-6)
    _, vit = build(timm_backbone(tiny_weights["timm"]))
    assert (vit.image.interpolation, vit.image.crop_pct) == ("bicubic", 0.9)
    _, lift = build(clip_backbone(tiny_weights["clip"], interpolation="bilinear", crop_pct=0.875))
    assert (lift.image.interpolation, lift.image.crop_pct) == ("bilinear", 0.875)
    from ltbench.data import transforms

    image = torch.randint(0, 255, (3, 40, 50), dtype=torch.uint8)
    assert transforms.build("eval", lift.image, lift.pipelines)(image).shape == (3, 32, 32)


def trainable(net) -> dict[str, int]:
    return {n: p.numel() for n, p in net.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("family", ["clip", "timm"])
def test_tune_modes_train_what_they_say(tiny_weights, family):
    """Counts follow from the shapes: D = 64, L = 2 blocks, K = 10 classes -> LIFT's bottleneck r = 2."""
    spec = clip_backbone if family == "clip" else timm_backbone
    weights = tiny_weights[family]
    d, layers, r = 64, 2, 2
    counts = {}
    for tune in ("frozen", "linear", "full", "bitfit", "lora", "adaptformer", "vpt", {"name": "vpt", "depth": "deep"},
                 {"name": "full", "scope": "all"}):
        net, _ = build(spec(weights, tune))
        label = tune if isinstance(tune, str) else f"{tune['name']}_{list(tune.values())[1]}"
        counts[label] = sum(trainable(net).values())
        assert net.parameter_report()["trainable"] == counts[label]
    block = 12 * d * d + 13 * d  # 2 LN (4d), qkv (3d^2 + 3d), out (d^2 + d), fc1 (4d^2 + 4d), fc2 (4d^2 + d)
    assert counts["frozen"] == counts["linear"] == 0
    assert counts["full"] == layers * block
    assert counts["bitfit"] == layers * (2 * d + 3 * d + d + 4 * d + d)
    assert counts["lora"] == layers * 2 * (2 * d * r)  # q and v: A (d, r), B (r, d)
    assert counts["adaptformer"] == layers * (2 * d + d * r + r + r * d + d + 1)  # LN, down, up, scale
    assert counts["vpt"] == 10 * d and counts["vpt_deep"] == layers * 10 * d
    assert counts["full_all"] > counts["full"]


def test_adapters_start_as_the_identity_and_checkpoints_hold_what_trains(tiny_weights):
    """AdaptFormer (up = 0) and LoRA (B = 0) leave the features unchanged at initialisation; VPT does not.
    state_dict() leaves frozen pretrained weights out and load_state_dict() takes such a dict back."""
    base, _ = build(clip_backbone(tiny_weights["clip"]))
    ref = base.eval()(X)
    for tune in ("adaptformer", "lora"):
        net, _ = build(clip_backbone(tiny_weights["clip"], tune))
        assert torch.allclose(net.eval()(X), ref, atol=1e-5), tune
        state = net.state_dict()
        assert state and all(("adapt" in k or "delta" in k or "tuned" in k) for k in state), sorted(state)[:3]
        torch.manual_seed(0)
        with torch.no_grad():  # random moves (a constant one would only shift tokens, which LayerNorm removes)
            for p in net.parameters():
                if p.requires_grad:
                    p.add_(0.1 * torch.randn_like(p))
        moved = net.eval()(X)
        fresh, _ = build(clip_backbone(tiny_weights["clip"], tune))
        fresh.load_state_dict(net.state_dict())
        assert torch.equal(fresh.eval()(X), moved) and not torch.allclose(moved, ref)
    net, _ = build(clip_backbone(tiny_weights["clip"], "vpt"))
    assert not torch.allclose(net.eval()(X), ref)
    assert base.state_dict() == {} and net.state_dict().keys() == {"prompts.prompts"}


@pytest.mark.parametrize("n, micro, sizes", [(8, 4, [4, 4]), (7, 4, [4, 3]), (7, 2, [2, 2, 3]), (3, 4, [3])])
def test_gradient_accumulation_equals_the_full_batch_step(tiny_weights, tmp_path, n, micro, sizes):
    """optim.micro_batch_size: the batch in micro-batches, one optimiser step, the same gradients and update as
    the whole batch (a LayerNorm model: equal up to float rounding), also for a short last batch of an epoch
    (7 of batch_size 8: each micro-batch weighted by its share of the 7, a last one of 1 joined to its
    predecessor); the loss and logits read as the whole batch's."""
    from ltbench.recipe import resolve_run_config
    from ltbench.results.runspec import RunSpec
    from ltbench.train import engine

    assert [c.stop - c.start for c in engine.micro_batches(n, micro)] == sizes

    def one_step(micro):
        raw = {"data": {"name": "synthetic_lt", "num_classes": 4, "max_per_class": 8, "imb_factor": 2, "image_size": 12},
               "backbone": clip_backbone(tiny_weights["clip"], "adaptformer"), "method": {"name": "la"},
               "optim": {"epochs": 1, "warmup_epochs": 0, "batch_size": 8, "micro_batch_size": micro}}
        config = resolve_run_config(raw, seed=0, where="t")
        torch.manual_seed(0)
        run = engine.build_run(config)
        optimizer = engine.make_optimizer(run)
        spec = RunSpec.coerce({"config": config, "run_id": "x", "recipe": "t", "run_dir": str(tmp_path)})
        s = engine.Session(spec, run, torch.device("cpu"), optimizer, torch.amp.GradScaler("cpu", enabled=False),
                           0, 1, 1, lambda *_: None)
        s.iters_per_epoch, s.base_lrs = 1, [g["lr"] for g in optimizer.param_groups]
        torch.manual_seed(1)
        views, labels = [torch.rand(8, 3, 32, 32)[:n]], torch.tensor([0, 1, 2, 3, 0, 1, 0, 0])[:n]
        run.model.train()
        out = engine.train_step(s, views, labels, 0, 0)
        trained = [p for p in run.model.parameters() if p.requires_grad]
        return out, [p.grad.clone() for p in trained], [p.detach().clone() for p in trained]

    full, full_grads, full_params = one_step(None)
    chunked, chunked_grads, chunked_params = one_step(micro)
    assert chunked["logits"].shape == (n, 4) and torch.allclose(chunked["loss"], full["loss"], atol=1e-6)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(full_grads, chunked_grads))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(full_params, chunked_params))


@pytest.mark.parametrize("name", TUNE_MODES.names())
def test_every_registered_tune_mode_passes_the_contract(name):
    """The contract `ltbench check` runs on a plugin's tune mode (ltbench/contract.py), over every registered one."""
    from ltbench import contract

    note = contract.check_tune_mode(TUNE_MODES.get(name), name)
    assert note.endswith("trainable parameters on a 2-block ViT of width 32")
    assert note.startswith("0 ") == (name in ("frozen", "linear"))


def test_the_tune_mode_contract_catches_what_a_checkpoint_would_lose():
    """A mode whose added module is frozen by mistake (checkpoints leave frozen weights out, so its random
    initialisation is not restored on resume) is caught, and so is a features-only mode that trains something."""
    import torch.nn as nn

    from ltbench import contract
    from ltbench_foundation.tuning import TuneMode
    from tests.conftest import registries_restored

    class Forgotten(TuneMode):
        def apply(self, backbone, num_classes):
            shift = nn.Linear(backbone.trunk.width, backbone.trunk.width).requires_grad_(False)
            backbone.trunk.add_parallel_adapter(backbone.trunk.blocks[0], shift)
            return {}

    class Liar(TuneMode):
        features_only = True

        def apply(self, backbone, num_classes):
            for p in backbone.trunk.block_biases():
                p.requires_grad_(True)
            return {}

    with registries_restored():
        TUNE_MODES.register("forgotten")(Forgotten)
        TUNE_MODES.register("liar")(Liar)
        with pytest.raises(contract.ContractError, match="a fresh backbone that loads it must give the same features"):
            contract.check_tune_mode(Forgotten, "forgotten")
        with pytest.raises(contract.ContractError, match="a features_only mode must train nothing"):
            contract.check_tune_mode(Liar, "liar")
    assert "liar" not in TUNE_MODES
