"""What a method knows of the class prior under a sampler: ``log_train_prior`` is always the training set's
frequencies (the published formulas are written in them), and ``ctx.sampled_prior(epoch)`` is what the loss
sees under the run's sampler, so a method that corrects for the training prior can correct for the right
one (docs/adding-a-method.md, "Samplers and the prior")."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ltbench.recipe import load_recipe
from ltbench.train import engine


def built(write_recipe, sampler: dict | None):
    extra = {"optim": {"epochs": 4}} | ({"sampler": sampler} if sampler else {})
    return engine.build_run(load_recipe(write_recipe(extra=extra)).runs[0].config)


@pytest.mark.parametrize("sampler", [None, {"name": "class_balanced"}, {"name": "square_root"}, {"name": "progressive"}])
def test_log_train_prior_is_the_training_set_s_and_sampled_prior_the_sampler_s(write_recipe, sampler):
    run = built(write_recipe, sampler)
    ctx, counts = run.method.ctx, run.data.class_counts.astype(np.float64)
    train_prior = counts / counts.sum()
    assert torch.allclose(run.method.log_train_prior, torch.log(torch.tensor(train_prior, dtype=torch.float32)))
    for epoch in range(4):
        sampled = ctx.sampled_prior(epoch)
        law = run.sampler.class_probabilities(epoch)
        assert sampled.dtype == torch.float32 and torch.allclose(sampled, torch.tensor(law, dtype=torch.float32))
        # the draws of an epoch follow that law (stratified: up to rounding)
        drawn = np.bincount(run.data.train_labels[run.sampler.epoch_order(0, epoch)], minlength=len(counts))
        assert np.abs(drawn / drawn.sum() - law).max() <= 1.0 / drawn.sum() + 1e-12
    if sampler is None:
        assert torch.allclose(ctx.sampled_prior(0), ctx.train_prior)
    elif sampler["name"] == "class_balanced":
        assert torch.allclose(ctx.sampled_prior(0), torch.full((len(counts),), 1.0 / len(counts)))
    elif sampler["name"] == "progressive":  # instance-balanced at the start, moving towards uniform
        assert torch.allclose(ctx.sampled_prior(0), ctx.train_prior)
        assert ctx.sampled_prior(3)[0] < ctx.sampled_prior(0)[0]


def test_a_sampler_without_a_class_law_gives_none():
    from ltbench.method import MethodContext

    ctx = MethodContext(3, torch.tensor([5, 3, 1]), 4, 2, sampling=lambda epoch: None)
    assert ctx.sampled_prior(0) is None
    assert torch.allclose(MethodContext(3, torch.tensor([5, 3, 1]), 4, 2).sampled_prior(1), torch.tensor([5, 3, 1]) / 9.0)


def test_the_sampler_doc_example_registers_lists_checks_and_draws_its_law(tmp_path, capsys):
    """docs/adding-a-method.md's sampler file, as a user would use it: the decorator registers it, `ltbench list
    samplers --options` shows its option, `ltbench check` passes, and a run's context reads its law."""
    import re

    import yaml

    from ltbench import cli
    from tests.conftest import ROOT, TINY, deep_update, registries_restored

    block = re.search(r"```python\n# (my_samplers/\w+\.py)\n(.*?)```", (ROOT / "docs" / "adding-a-method.md").read_text(), re.S)
    target = tmp_path / block[1]
    target.parent.mkdir()
    target.write_text(block[2])
    with registries_restored():
        assert cli.main(["list", "samplers", "power", "--options", "--plugins", str(target.parent)]) == 0
        assert re.search(r"^ +q +float +0\.25 +class c drawn with probability proportional to n_c \*\* q$",
                         capsys.readouterr().out, re.M)
        assert cli.main(["check", str(target.parent)]) == 0, capsys.readouterr()
        assert "ok" in capsys.readouterr().out
        recipe = tmp_path / "r.yaml"
        recipe.write_text(yaml.safe_dump(deep_update(TINY, {"plugins": [str(target.parent)], "results_dir": str(tmp_path),
                                                            "sampler": {"name": "power", "q": 0.5}})))
        run = engine.build_run(load_recipe(recipe).runs[0].config)
        counts = torch.tensor(run.data.class_counts, dtype=torch.float64)
        assert torch.allclose(run.method.ctx.sampled_prior(0).double(), counts.sqrt() / counts.sqrt().sum(), atol=1e-6)
