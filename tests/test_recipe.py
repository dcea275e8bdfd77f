import pytest
import yaml

from ltbench.errors import ConfigError
from ltbench.recipe import load_recipe
from ltbench.results.identity import run_id


def test_grid_and_seeds_expand_into_runs(write_recipe):
    path = write_recipe(extra={"seeds": [0, 1], "grid": {"optim.lr": [0.1, 0.05], "data.imb_factor": [5, 10, 20]}})
    recipe = load_recipe(path)
    assert len(recipe.runs) == 12
    assert len({r.run_id for r in recipe.runs}) == 12
    lrs = sorted({r.config["optim"]["lr"] for r in recipe.runs})
    assert lrs == [0.05, 0.1]


def test_list_of_grids_is_a_union_and_method_values_replace_the_subtree(write_recipe):
    path = write_recipe(extra={"method": {"name": "la", "tau": 2.0},
                               "grid": [{"method": [{"name": "ce"}]}, {"optim.lr": [0.2, 0.3]}]})
    recipe = load_recipe(path)
    configs = [(r.config["method"], r.config["optim"]["lr"]) for r in recipe.runs]
    base_lr = load_recipe(write_recipe("base")).runs[0].config["optim"]["lr"]
    # the first grid replaces the whole method subtree (la's tau does not leak into ce); the second
    # keeps the recipe's method and varies only the learning rate: a union of 1 + 2 runs, not a product
    assert configs[0][0]["name"] == "ce" and "tau" not in configs[0][0] and configs[0][1] == base_lr
    assert [lr for _, lr in configs[1:]] == [0.2, 0.3]
    assert all(method["name"] == "la" and method["tau"] == 2.0 for method, _ in configs[1:])
    assert len({r.run_id for r in recipe.runs}) == 3


def test_run_id_is_stable_and_ignores_paths(write_recipe, tmp_path):
    a = load_recipe(write_recipe("a"))
    b = load_recipe(write_recipe("b", {"train": {"threads": 1, "progress": True}}), results_dir=tmp_path / "other")
    assert a.runs[0].run_id == b.runs[0].run_id
    fm = {"data": {"name": "fashion_mnist_lt"}}
    d = load_recipe(write_recipe("d", fm))
    e = load_recipe(write_recipe("e", {"data": {"name": "fashion_mnist_lt", "root": "/elsewhere"}}))
    assert d.runs[0].run_id == e.runs[0].run_id != a.runs[0].run_id
    assert a.runs[0].run_id == run_id(a.runs[0].config)
    c = load_recipe(write_recipe("c", {"optim": {"lr": 0.01}}))
    assert c.runs[0].run_id != a.runs[0].run_id


def test_overrides_are_parsed_as_yaml(write_recipe):
    recipe = load_recipe(write_recipe(), ["optim.lr=0.5", "seeds=[3, 4]", "method.name=ce"])
    assert [r.config["seed"] for r in recipe.runs] == [3, 4]
    assert recipe.runs[0].config["optim"]["lr"] == 0.5


@pytest.mark.parametrize(
    "extra, field, words",
    [
        ({"optim": {"lrr": 0.1}}, "optim.lrr", "did you mean 'lr'"),
        ({"optim": {"lr": "fast"}}, "optim.lr", "expected a number"),
        ({"optim": {"epochs": 2.5}}, "optim.epochs", "expected an integer"),
        ({"method": {"name": "ce", "tau": 1}}, "method.tau", "unknown key"),
        ({"method": {"name": "crossentropy"}}, "method.name", "unknown method 'crossentropy'"),
        ({"data": {"name": "synthetic"}}, "data.name", "Did you mean 'synthetic_lt'"),
        ({"backbone": {"name": "resnet33"}}, "backbone.name", "Known: "),
        ({"colour": "red"}, "colour", "unknown key"),
        ({"train": {"precision": "fp8"}}, "train.precision", "one of 'fp32', 'bf16', 'fp16'"),
        ({"grid": {"optim.lr": 0.1}}, "grid.optim.lr", "non-empty list"),
    ],
)
def test_bad_recipes_name_the_file_and_the_dotted_field(write_recipe, extra, field, words):
    path = write_recipe(extra=extra)
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    msg = str(info.value)
    assert msg.startswith(str(path)), msg
    assert f" {field}:" in msg or f": {field}:" in msg, msg
    assert words in msg, msg
    assert "\n" not in msg


def test_unknown_registry_name_lists_known_names_and_searched_places(write_recipe):
    with pytest.raises(ConfigError) as info:
        load_recipe(write_recipe(extra={"method": {"name": "cee"}}))
    msg = str(info.value)
    assert "Did you mean 'ce'" in msg and "Known: " in msg and "Searched: " in msg and "entry point" in msg


def test_invalid_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        load_recipe(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_recipe(tmp_path / "none.yaml")


def test_dry_run_lists_runs_with_ids(cli, write_recipe):
    path = write_recipe(extra={"seeds": [0, 1, 2]})
    out = cli("run", path, "--dry-run")
    assert out.returncode == 0, out.stderr
    ids = [r.run_id for r in load_recipe(path).runs]
    for run_id in ids:
        assert run_id in out.stdout
    assert "3 run(s)" in out.stdout
    assert not (path.parent / "results").exists()


def test_cli_bad_recipe_is_one_line_without_traceback(cli, write_recipe):
    out = cli("run", write_recipe(extra={"optim": {"lr": "fast"}}))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "optim.lr: expected a number" in out.stderr


def test_recipes_in_the_repo_validate():
    from pathlib import Path

    for path in sorted(Path(__file__).parents[1].joinpath("recipes").glob("*.yaml")):
        # A pretrained backbone's weights file is the user's (its sha256 enters the run id, no model is built
        # at load): any file stands in for it here.
        pretrained = yaml.safe_load(path.read_text()).get("backbone", {}).get("name") in ("clip_vit_b16", "vit_b16_in21k")
        recipe = load_recipe(path, [f"backbone.weights={__file__}"] if pretrained else [])
        assert recipe.runs, path
        assert yaml.safe_load(path.read_text())


def test_every_option_is_explicit_in_the_resolved_config(write_recipe):
    """A recipe that leaves an option out gets its default written into the run's configuration (and id):
    the same run as one that writes the default out, core sections, plugins, nested specs and the sampler."""
    bape = {"name": "bape", "aux": {"name": "la"}, "aux_views": ["default"], "bape_views": ["default", "default"]}
    implicit = load_recipe(write_recipe("i", {"method": bape})).runs[0]
    explicit = load_recipe(write_recipe("e", {"method": {**bape, "kappa_solver": "sra"}})).runs[0]
    newton = load_recipe(write_recipe("n", {"method": {**bape, "kappa_solver": "newton"}})).runs[0]
    assert implicit.config["method"]["kappa_solver"] == "sra"
    assert implicit.config["method"]["aux"]["loss_views"] == "first"
    assert implicit.config["sampler"] == {"name": "uniform"}
    assert implicit.config["train"]["augment_on"] == "worker" and implicit.config["eval"]["select"] == "last"
    assert implicit.run_id == explicit.run_id != newton.run_id
    assert newton.config["method"]["kappa_solver"] == "newton"


def test_reference_bape_runs_keep_their_recorded_run_ids():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    recipe = load_recipe(root / "recipes" / "fmnist_bape.yaml")
    recorded = {p.name for p in (root / "docs" / "reference-results" / "fmnist_bape").iterdir()}
    assert {r.run_id for r in recipe.runs} <= recorded


def test_progress_labels_spell_values_as_table_rows_do(write_recipe):
    # one spelling of a value everywhere: the dry-run / progress label and a table row both say 'la (tau=1)'
    from ltbench.recipe import run_label
    from ltbench.report.rows import default_labels

    recipe = load_recipe(write_recipe(extra={"grid": {"method": [{"name": "la", "tau": 1.0}, {"name": "la", "tau": 2}]}}))
    assert [run_label(r) for r in recipe.runs] == ["la (tau=1)", "la (tau=2)"]
    flats = [{"method.name": "la", "method.tau": 1.0}, {"method.name": "la", "method.tau": 2}]
    assert default_labels(flats, set()) == ["la (tau=1)", "la (tau=2)"]
