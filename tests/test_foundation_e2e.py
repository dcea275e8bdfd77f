"""The foundation track end to end, with tiny random-weight models of the real architectures: zero-shot CLIP on
Fashion-MNIST-LT, LIFT (AdaptFormer, text-initialised cosine head, LA loss, per-epoch cosine, gradient
accumulation, five-crop TTE) and BAPE with LIFT as its auxiliary method on synthetic data, then stage 2 on the
frozen features. Weights are loaded from saved files; nothing is downloaded."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch
import yaml

from pretrained_kit import FMNIST_SHAPE, clip_backbone, tiny_weights  # noqa: F401

from ltbench.cli import main
from tests.conftest import registries_restored

PLUGIN = '''"""synthetic_lt with class names, for text prompts (the built-in one has none)."""
from ltbench.data.synthetic import SyntheticLT
from ltbench.registry import DATASETS


@DATASETS.register("named_synthetic_lt")
class NamedSyntheticLT(SyntheticLT):
    def load(self):
        data = super().load()
        data.class_names = [f"pattern_{i}" for i in range(data.num_classes)]
        return data
'''
SYNTH = {"name": "named_synthetic_lt", "num_classes": 4, "max_per_class": 16, "imb_factor": 4, "test_per_class": 4,
         "image_size": 20, "channels": 3}
FMNIST = {"name": "fashion_mnist_lt", "imb_factor": 10, "max_per_class": 10}
TRAIN = {"lr": 0.01, "batch_size": 8, "epochs": 2, "warmup_epochs": 0, "schedule": "cosine_epoch",
         "micro_batch_size": 4}


@pytest.fixture(scope="module")
def foundation_runs(tiny_weights, tmp_path_factory):
    """One recipe, four rows (zero-shot on Fashion-MNIST-LT; LIFT, BAPE+LIFT and LA on LoRA on synthetic data),
    trained once for the module, and a stage-2 grid on every run's frozen features."""
    folder = tmp_path_factory.mktemp("foundation")
    (folder / "named_data").mkdir()
    (folder / "named_data" / "__init__.py").write_text(PLUGIN)
    recipe = {
        "name": "tiny_foundation", "results_dir": str(folder / "results"), "seeds": [0], "plugins": ["./named_data"],
        "train": {"progress": False},
        "grid": [
            {"data": [FMNIST], "backbone": [clip_backbone(tiny_weights["clip28"], "frozen", **FMNIST_SHAPE)],
             "method": [{"name": "zero_shot"}], "optim": [{"epochs": 0, "warmup_epochs": 0}]},
            {"data": [SYNTH], "backbone": [clip_backbone(tiny_weights["clip"], "adaptformer")],
             "method": [{"name": "lift"},
                        {"name": "bape", "aux": {"name": "lift"}, "aux_views": ["default"], "bape_views": ["default"],
                         "hidden_dim": 16, "proj_dim": 8, "alpha_hat": 4.0, "beta_hat": 0.8}],
             "optim": [TRAIN], "eval": [{"tte": "fivecrop", "tte_expand": 8}]},
            {"data": [SYNTH], "backbone": [clip_backbone(tiny_weights["clip"], "lora")], "method": [{"name": "la"}],
             "optim": [TRAIN]},
        ],
        "posthoc": [{"name": "crt", "epochs": 2}],
    }
    path = folder / "tiny_foundation.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with registries_restored():  # in this process (a worker process would import torch and open_clip again)
        for command in ("run", "posthoc"):
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                code = main([command, str(path)])
            assert code == 0, out.getvalue()[-3000:]
    results = [json.loads(p.read_text()) for p in (folder / "results" / "tiny_foundation").glob("*/result.json")]
    return {r["config"]["method"]["name"]: r for r in results}, folder


def test_every_row_finishes_with_its_parameter_counts(foundation_runs):
    runs, _ = foundation_runs
    assert set(runs) == {"zero_shot", "lift", "bape", "la"} and all(r["status"] == "done" for r in runs.values())
    zs, lift, bape = runs["zero_shot"], runs["lift"], runs["bape"]
    assert zs["parameters"]["backbone"]["trainable"] == 0 and zs["parameters"]["method"]["trainable"] == 0
    assert zs["data"]["class_names"][0] == "T-shirt/top" and zs["selection"]["epoch"] == 0
    tuning = lift["parameters"]["backbone_tuning"]
    d, r = 64, 1  # LIFT's rule for K = 4 classes and 2 blocks: 2 ** max(0, floor(log2(4 / 4))) = 1
    image_tower = 3 * 8 * 8 * d + d + 17 * d + 2 * d + 2 * (12 * d * d + 13 * d) + 2 * d + d * 32  # conv .. proj
    assert tuning == {"tune": "adaptformer", "bottleneck": r, "trainable": 2 * (2 * d + d * r + r + r * d + d + 1),
                      "pretrained_image_tower": image_tower}
    assert lift["parameters"]["method"] == {"total": 4 * d, "trainable": 4 * d}  # the cosine head, no bias
    assert runs["la"]["parameters"]["backbone_tuning"]["trainable"] == 2 * 2 * (2 * d * 1)  # LoRA q, v; K = 4: r = 1
    assert bape["parameters"]["backbone_tuning"]["trainable"] == tuning["trainable"]
    assert "aux" in bape["metrics"]["heads"] and "bape" in bape["metrics"]["heads"]
    for r_ in runs.values():
        assert 0.0 <= r_["metrics"]["all"] <= 1.0


def test_checkpoints_hold_only_what_trains(foundation_runs):
    runs, folder = foundation_runs
    state = torch.load(folder / "results/tiny_foundation" / runs["lift"]["run_id"] / "checkpoint.pt",
                       weights_only=True)["model"]
    backbone_keys = [k for k in state if k.startswith("backbone.")]
    assert backbone_keys and all("adapter" in k or "tuned" in k for k in backbone_keys)


def test_stage2_fits_on_frozen_clip_features(foundation_runs):
    runs, folder = foundation_runs
    stage2 = [json.loads(p.read_text()) for p in (folder / "results/tiny_foundation").glob("*/posthoc/*/result.json")]
    fitted = {(s["config"]["method"]["name"], s["posthoc"]["name"]) for s in stage2 if s["status"] == "done"}
    assert fitted == {("zero_shot", "crt"), ("lift", "crt"), ("bape", "crt"), ("la", "crt")}, fitted
