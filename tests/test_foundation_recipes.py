"""The four foundation-track recipes dry-run against generated data trees, with backbone.weights pointing at a
saved random-weight file (a dry run hashes the file but builds no model), and the CLI lists what they use."""

from __future__ import annotations

import pytest
import torch
from torchvision.io import write_jpeg

from ltbench.cli import main
from pretrained_kit import CLIP_SHAPE, tiny_weights  # noqa: F401
from tests.conftest import ROOT
from tests.test_cifar import write_fake_cifar100

IMAGE = torch.zeros(3, 8, 8, dtype=torch.uint8)


def split_list_tree(root, prefix: str, classes: int, splits: tuple[str, ...]) -> None:
    """A published-format split-list tree: one listed image per class and split; check() opens the first few."""
    root.mkdir(parents=True)
    for split in splits:
        lines = [f"{split}/c{k}/{k}.jpg {k}" for k in range(classes)]
        for line in lines[:3]:
            (root / line.split()[0]).parent.mkdir(parents=True, exist_ok=True)
            write_jpeg(IMAGE, str(root / line.split()[0]))
        (root / f"{prefix}{split}.txt").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("recipe,tree", [
    ("imagenet_lt_clip", ("ImageNet_LT_", 1000, ("train", "test"))),
    ("places_lt_clip", ("Places_LT_", 365, ("train", "test"))),
    ("inat2018_clip", ("iNaturalist18_", 8142, ("train", "val"))),
    ("cifar100_lt_clip", None),
])
def test_recipe_dry_runs(recipe, tree, tmp_path, tiny_weights, capsys):
    data = tmp_path / "data"
    if tree is None:
        write_fake_cifar100(data, per_class=20)
    else:
        split_list_tree(data, *tree)
    # the tiny file as the shape-configurable CLIP: the weights check (before any run) fits them to the model
    shape = ["backbone.name=clip_vit", *[f"backbone.{k}={v}" for k, v in CLIP_SHAPE.items()]]
    code = main(["run", str(ROOT / "recipes" / f"{recipe}.yaml"), "--dry-run", "--results", str(tmp_path / "r"),
                 f"data.root={data}", f"backbone.weights={tiny_weights['clip']}", *shape])
    out = capsys.readouterr().out
    assert code == 0, out
    for row in ("zero_shot", "la", "lift", "bape"):
        assert f"\n  {row}" in out or f" {row} " in out or f"{row} (" in out, (row, out[-1500:])
    assert out.count(recipe) >= 1 and "6 run(s)" in out, out[-1500:]


def test_list_shows_the_foundation_track(capsys):
    assert main(["list", "backbones"]) == 0
    backbones = capsys.readouterr().out
    assert all(name in backbones for name in ("clip_vit_b16", "vit_b16_in21k", "clip_vit", "timm_vit"))
    assert main(["list", "methods"]) == 0
    methods = capsys.readouterr().out
    assert "lift" in methods and "zero_shot" in methods


def test_pretrained_doc_example_registers_and_names_its_weights(tmp_path, monkeypatch, capsys):
    """docs/adding-a-backbone.md's pretrained example: it registers, `ltbench check` skips it without weights
    (not a failure), and a run without the file is the one line naming where it is published."""
    import re

    from tests.conftest import registries_restored

    text = (ROOT / "docs" / "adding-a-backbone.md").read_text()
    match = re.search(r"```python\n# (my_backbones/vit_s16\.py)\n(.*?)```", text, re.S)
    assert match
    (tmp_path / "my_backbones").mkdir()
    (tmp_path / match[1]).write_text(match[2])
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with registries_restored():
        assert main(["check", str(tmp_path / "my_backbones")]) == 0
        assert "skipped backbone vit_s16_in21k" in capsys.readouterr().out
        from ltbench_foundation.weights import WeightsMissingError
        from ltbench.registry import BACKBONES

        with pytest.raises(WeightsMissingError, match="backbone vit_s16_in21k: .*vit_small_patch16_224.augreg_in21k"):
            BACKBONES.build({"name": "vit_s16_in21k"}, in_channels=3, where="backbone")


# The rates LIFT ran, read in its official code (github shijxcs/LIFT, commit 661ead9):
# - full fine-tuning: scripts/run_tab6_peft_methods.sh runs `full_tuning True lr 0.0005` on ImageNet-LT and
#   `lr 0.001` on Places-LT ("best lr for full fine-tuning, searched from fig. 10"); none for iNat or CIFAR, where
#   the recipes take the rate of the searched dataset nearest in training-set size (docs/foundation.md);
# - classifier fine-tuning: scripts/run_fig2_zsclip.sh runs `lr 0.02` on ImageNet-LT and Places-LT only; elsewhere
#   LIFT's default, utils/config.py `lr = 0.01` (also configs/model/clip_vit_b16.yaml), which LIFT itself uses;
# - TTE: LIFT evaluates its trained rows with `tte True` (run_tab1to4_main_results.sh, run_tab6_peft_methods.sh);
#   zero-shot without it in run_fig2_zsclip.sh.
LIFT_RATES = {  # recipe: (LIFT / AdaptFormer, full fine-tuning, classifier fine-tuning)
    "imagenet_lt_clip": (0.01, 0.0005, 0.02),
    "places_lt_clip": (0.01, 0.001, 0.02),
    "inat2018_clip": (0.01, 0.0005, 0.01),
    "cifar100_lt_clip": (0.01, 0.001, 0.01),
}


@pytest.mark.parametrize("recipe", sorted(LIFT_RATES))
def test_foundation_recipes_train_at_lifts_rates(recipe, tiny_weights):
    from ltbench.recipe import load_recipe

    runs = load_recipe(ROOT / "recipes" / f"{recipe}.yaml", [f"backbone.weights={tiny_weights['clip']}"]).runs
    by_row = {(r.config["method"]["name"], r.config["backbone"]["tune"]["name"]): r.config for r in runs}
    lift, full, classifier = LIFT_RATES[recipe]
    assert by_row[("lift", "adaptformer")]["optim"]["lr"] == lift
    assert by_row[("bape", "adaptformer")]["optim"]["lr"] == lift
    assert by_row[("lift", "full")]["optim"]["lr"] == full
    assert by_row[("lift", "linear")]["optim"]["lr"] == classifier
    assert by_row[("zero_shot", "frozen")]["eval"].get("tte", "none") == "none"  # none: the default, left out
    assert all(c["eval"]["tte"] == "fivecrop" for row, c in by_row.items() if row[1] != "frozen")
    text = (ROOT / "recipes" / f"{recipe}.yaml").read_text()
    assert f"full fine-tuning (lr {full:g})" in text  # the caption says it
