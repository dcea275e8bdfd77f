"""The four foundation-track recipes dry-run against generated data trees, with backbone.weights pointing at a
saved random-weight file (a dry run hashes the file but builds no model), and the CLI lists what they use."""

from __future__ import annotations

import pytest
import torch
from torchvision.io import write_jpeg

from ltbench.cli import main
from pretrained_kit import tiny_weights  # noqa: F401
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
    code = main(["run", str(ROOT / "recipes" / f"{recipe}.yaml"), "--dry-run", "--results", str(tmp_path / "r"),
                 f"data.root={data}", f"backbone.weights={tiny_weights['clip']}"])
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
        from ltbench.pretrained import WeightsMissingError
        from ltbench.registry import BACKBONES

        with pytest.raises(WeightsMissingError, match="backbone vit_s16_in21k: .*vit_small_patch16_224.augreg_in21k"):
            BACKBONES.build({"name": "vit_s16_in21k"}, in_channels=3, where="backbone")
