"""Small promises of the first hour: a dataset's suggested shot thresholds, run --help, list width."""

from __future__ import annotations

import pytest

from ltbench.recipe import load_recipe


def test_a_dataset_may_suggest_its_shot_thresholds_and_the_recipe_wins(write_recipe, monkeypatch):
    from ltbench.registry import DATASETS

    builder = DATASETS.get("synthetic_lt")
    plain = load_recipe(write_recipe("plain")).runs[0]
    assert (plain.config["eval"]["few_threshold"], plain.config["eval"]["many_threshold"]) == (20, 100)
    monkeypatch.setattr(builder, "shot_thresholds", (5, 15), raising=False)
    suggested = load_recipe(write_recipe("suggested")).runs[0].config["eval"]
    assert (suggested["few_threshold"], suggested["many_threshold"]) == (5, 15)
    given = load_recipe(write_recipe("given", extra={"eval": {"many_threshold": 30}})).runs[0].config["eval"]
    assert (given["few_threshold"], given["many_threshold"]) == (5, 30)
    from ltbench.errors import ConfigError

    monkeypatch.setattr(builder, "shot_thresholds", (30, 200), raising=False)
    with pytest.raises(ConfigError, match="few_threshold 30 exceeds many_threshold 25"):
        load_recipe(write_recipe("bad", extra={"eval": {"many_threshold": 25}}))


def test_default_thresholds_keep_existing_run_ids(write_recipe):
    """(20, 100) from the dataset resolves to the same config, so every existing id stays."""
    explicit = load_recipe(write_recipe("a", extra={"eval": {"few_threshold": 20, "many_threshold": 100}})).runs[0]
    assert load_recipe(write_recipe("b")).runs[0].run_id == explicit.run_id


def test_run_help_describes_recipe_and_launcher(capsys):
    from ltbench import cli

    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "recipe a recipe file (YAML)" in text
    assert "--launcher {local,slurm,debug} where the runs execute" in text
