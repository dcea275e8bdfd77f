"""Search spaces (ltbench/search.py) and a recipe's ``search:`` section (ltbench/recipe/trials.py).

The contract part runs over every registered method, so a method added later with a space naming an option
its Config lacks, or a malformed distribution, fails here.
"""

from __future__ import annotations

import random
import re

import pytest

from ltbench import search
from ltbench.config import OptimConfig
from ltbench.errors import ConfigError
from ltbench.recipe import load_recipe, resolve_run_config
from ltbench.registry import METHODS
from tests.conftest import ROOT


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_space_names_its_own_options_and_valid_distributions(name):
    cls = METHODS.get(name)
    space = search.method_space(cls, name)  # parses every distribution (ConfigError otherwise)
    search.check_space_options(space, cls.Config, name, "search_space")
    assert "search_space" not in vars(cls.Config), "declare the space on the method class, beside Config"
    if name == "zero_shot":  # trains nothing (optim.epochs 0) and needs a text tower: nothing to tune
        assert not space
        return
    options = {"lift": {"init": "random"}}.get(name, {})
    # every draw of the space (and of the core's) is a configuration the method and the core accept
    full = {**search.parse_space(search.CORE_SPACE, "core"), **space}
    for values in search.draw_trials(full, 0, name, 3):
        method = {"name": name, **options, **{k[len("method."):]: v for k, v in values.items() if k.startswith("method.")}}
        optim = {k[len("optim."):]: v for k, v in values.items() if k.startswith("optim.")}
        resolve_run_config({"data": {"name": "synthetic_lt"}, "backbone": {"name": "resnet8"}, "method": method,
                            "optim": optim}, 0, "test")


def test_core_space_names_optim_options():
    fields = set(OptimConfig.__dataclass_fields__)
    for key, dist in search.CORE_SPACE.items():
        assert key.split(".")[0] == "optim" and key.split(".")[1] in fields
        search.parse_distribution(dist, key)


@pytest.mark.parametrize("raw, words", [
    ({"normal": [0, 1]}, "unknown distribution 'normal'"),
    ({"uniform": [1, 0]}, "low < high"),
    ({"log_uniform": [0, 1]}, "above 0"),
    ({"int_uniform": [1.5, 3]}, "two integers"),
    ({"choice": []}, "expected a list"),
    ({"uniform": [0, 1], "choice": [1]}, "not a distribution"),
    (0.1, "not a distribution"),
])
def test_bad_distributions_are_one_line_errors(raw, words):
    with pytest.raises(ConfigError, match=words):
        search.parse_distribution(raw, "search.space.optim.lr")


def test_draws_stay_in_range_are_deterministic_and_independent_per_key():
    space = search.parse_space({"a": {"log_uniform": [0.01, 0.5]}, "b": {"uniform": [-1, 1]},
                                "c": {"int_uniform": [2, 4]}, "d": {"choice": ["x", "y"]}}, "s")
    draws = search.draw_trials(space, 7, "la", 50)
    assert draws == search.draw_trials(space, 7, "la", 50)
    assert draws != search.draw_trials(space, 8, "la", 50) and draws != search.draw_trials(space, 7, "ce", 50)
    assert all(0.01 <= d["a"] <= 0.5 and -1 <= d["b"] <= 1 and d["c"] in (2, 3, 4) and d["d"] in "xy" for d in draws)
    assert {d["c"] for d in draws} == {2, 3, 4}
    fewer = search.draw_trials({"a": space["a"]}, 7, "la", 50)  # adding keys leaves a key's draws unchanged
    assert [d["a"] for d in fewer] == [d["a"] for d in draws]
    assert all(len(f"{d['a']:.10g}".replace(".", "").lstrip("0")) <= search.DIGITS for d in draws)
    assert isinstance(search.parse_distribution({"log_uniform": [1, 2]}, "x").draw(random.Random(0)), float)


SEARCH = {"trials": 3, "seed": 0, "space": {"method.tau": {"uniform": [0.5, 1.5]}}}


def tuned(write_recipe, **extra):
    base = {"data": {"val_per_class": 3}, "grid": {"method.name": ["ce", "la"]}, "seeds": [0, 1], "search": SEARCH}
    return write_recipe(extra={**base, **extra})


def test_search_expands_methods_x_trials_x_seeds_with_recorded_trials(write_recipe):
    recipe = load_recipe(tuned(write_recipe))
    assert len(recipe.runs) == 2 * 3 * 2
    ce = [r for r in recipe.runs if r.config["method"]["name"] == "ce"]
    la = [r for r in recipe.runs if r.config["method"]["name"] == "la"]
    assert {r.grid["search"]["trial"] for r in ce} == {0, 1, 2}
    assert la[0].grid["search"] == {"trial": 0, "trials": 3, "seed": 0, "sampler": "random",
                                    "space": ["method.tau", "optim.lr", "optim.weight_decay"]}
    assert ce[0].grid["search"]["space"] == ["optim.lr", "optim.weight_decay"]
    # both seeds of a trial share its draws; trials differ; the trial is not in the identity
    by_trial = {}
    for r in la:
        by_trial.setdefault(r.grid["search"]["trial"], set()).add((r.config["method"]["tau"], r.config["optim"]["lr"]))
    assert all(len(v) == 1 for v in by_trial.values()) and len(set().union(*by_trial.values())) == 3
    assert all(0.5 <= r.config["method"]["tau"] <= 1.5 for r in la)
    assert [r.run_id for r in load_recipe(tuned(write_recipe)).runs] == [r.run_id for r in recipe.runs]


@pytest.mark.parametrize("extra, words", [
    ({"search": {**SEARCH, "space": {"optim.lr": {"normal": [0, 1]}}}}, "search.space.optim.lr: unknown distribution"),
    ({"search": {**SEARCH, "space": {"method.foo": {"uniform": [0, 1]}}}}, "no method of this recipe has the option 'foo'"),
    ({"search": {**SEARCH, "trials": 0}}, "search.trials: must be >= 1"),
    ({"data": {"val_per_class": 0}}, "selected on the validation split, and data 'synthetic_lt' has none"),
    ({"search": {**SEARCH, "sampler": "grid"}}, "search.sampler: expected random, tpe"),
    ({"search": {**SEARCH, "prune": True}}, "search.prune: true .* set sampler: tpe"),
    ({"grid": {"method.name": ["ce"], "optim.lr": [0.1, 0.2]}}, "the grid sets 'optim.lr'"),
    ({"search": {**SEARCH, "space": {"bogus": {"uniform": [0, 1]}}}}, "not an option of a run"),
])
def test_bad_search_is_refused_before_any_run(write_recipe, extra, words):
    with pytest.raises(ConfigError, match=words):
        load_recipe(tuned(write_recipe, **extra))


def test_bad_search_exits_2_with_one_line_and_dry_run_lists_the_draws(cli, write_recipe):
    out = cli("run", tuned(write_recipe, search={**SEARCH, "space": {"method.foo": {"uniform": [0, 1]}}}))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    path = tuned(write_recipe)
    out = cli("run", path, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "search: 3 draw(s) per method x 2 tuning seed(s) [1000, 1001], random search, seed 0" in out.stdout
    assert "la: 3 draws, d = 3, 1.4 draws per axis: method.tau ~ uniform[0.5, 1.5], optim.lr ~ log_uniform[0.01, 0.4]" in out.stdout
    for r in load_recipe(path).runs:
        line = next(l for l in out.stdout.splitlines() if r.run_id in l)
        assert f"trial {r.grid['search']['trial'] + 1}/3" in line and f"optim.lr={r.config['optim']['lr']:g}" in line


def test_null_removes_a_key_and_the_recipe_value_then_stays(write_recipe):
    recipe = load_recipe(tuned(write_recipe, search={**SEARCH, "space": {"optim.lr": None}}))
    assert {r.config["optim"]["lr"] for r in recipe.runs} == {0.05}
    assert "optim.lr" not in recipe.runs[0].grid["search"]["space"]


def test_a_search_space_is_left_out_of_the_code_hash_like_a_docstring():
    from ltbench.results.code import normalized_hash

    plain = b"class M:\n    Config = int\n\n    def f(self):\n        return 1\n"
    spaced = b"class M:\n    Config = int\n    search_space = {'tau': {'uniform': [0.5, 2.0]}}\n\n    def f(self):\n        return 1\n"
    assert normalized_hash(plain) == normalized_hash(spaced)
    assert normalized_hash(plain) != normalized_hash(plain.replace(b"return 1", b"return 2"))
    assert normalized_hash(b"search_space = 1\n") != normalized_hash(b"\n")  # only a class's declaration


def test_no_search_sampler_is_named_outside_its_own_modules():
    """Samplers are a registry (search.SAMPLERS): the core reaches a sampler through its entry, never by name.
    Every name and string (docstrings included) of the product is read; only the registry's home and the
    sampler's own modules may say 'tpe' or 'optuna' (a cited issue, 'optuna#1300', names no sampler)."""
    import io
    import tokenize

    own = {"ltbench/search.py", "ltbench/recipe/tpe.py", "ltbench/run/tpe.py"}
    found = []
    for path in sorted(ROOT.glob("ltbench/**/*.py")) + sorted(ROOT.glob("methods/**/*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in own:
            continue
        for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if tok.type in (tokenize.NAME, tokenize.STRING) and re.search(r"\btpe\b|optuna(?!#\d)", tok.string, re.I):
                found.append(f"{rel}:{tok.start[0]}")
    assert not found, found
    from ltbench import search
    assert set(search.SAMPLERS) >= {"random", "tpe"} and search.SAMPLERS["tpe"].asks


def test_a_forged_draw_of_an_asking_sampler_is_refused():
    from ltbench.search import parse_distribution

    lr = parse_distribution({"log_uniform": [0.01, 0.4]}, "x")
    assert lr.holds(0.05) and not lr.holds(50.0) and not lr.holds(True) and not lr.holds(float("nan"))
    pick = parse_distribution({"choice": [1, "a"]}, "x")
    assert pick.holds(1) and pick.holds("a") and not pick.holds(True) and not pick.holds(1.5)
    n = parse_distribution({"int_uniform": [1, 3]}, "x")
    assert n.holds(3) and not n.holds(4) and not n.holds(2.0)


def test_budget_per_dim_gives_every_method_the_same_draws_per_axis(write_recipe):
    """ce searches 2 options and la 3: with budget per_dim, 4 draws for ce (2 per axis) make 8 for la (2 per
    axis); the dry run says each method's d and draws per axis."""
    recipe = load_recipe(tuned(write_recipe, search={**SEARCH, "trials": 4, "budget": "per_dim", "seeds": [5]}))
    trials = {}
    for r in recipe.runs:
        trials.setdefault(r.config["method"]["name"], set()).add(r.grid["search"]["trial"])
        assert r.grid["search"]["trials"] == {"ce": 4, "la": 8}[r.config["method"]["name"]]
    assert {m: len(t) for m, t in trials.items()} == {"ce": 4, "la": 8}
    lines = "\n".join(recipe.search)
    assert "ce: 4 draws, d = 2, 2 draws per axis" in lines and "la: 8 draws, d = 3, 2 draws per axis" in lines
    assert search.draws_per_axis(8, 3) == pytest.approx(2.0)


def test_tpe_below_twenty_draws_is_said_to_be_random_search():
    assert search.random_note("tpe", 8).startswith("tpe is random search at this budget: its first 8 of 8 draws")
    assert search.random_note("tpe", 16) and not search.random_note("tpe", 20) and not search.random_note("random", 4)
