"""What you type is what runs: overrides apply after the grid or are refused, dry-run checks what a run
checks and shows what differs, status takes a recipe's overrides, one prior-name grammar everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from ltbench import cli
from ltbench.errors import ConfigError
from ltbench.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "recipes" / "quickstart.yaml"


def run_cli(argv, capsys) -> tuple[int, str, str]:
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_an_override_wins_over_the_grid_on_every_run_that_has_the_key():
    plain = load_recipe(QUICKSTART)
    tau2 = load_recipe(QUICKSTART, ["method.tau=2.0"])
    methods = {r.config["method"]["name"]: r for r in tau2.runs}
    assert methods["la"].config["method"]["tau"] == 2.0  # the grid says tau 1.0: the command line wins
    assert "tau" not in methods["ce"].config["method"]
    changed = {r.run_id for r in tau2.runs} ^ {r.run_id for r in plain.runs}
    assert len(changed) == 2  # only the LA run is another run
    assert tau2.override_keys == ["method.tau"]
    lr = load_recipe(QUICKSTART, ["optim.lr=0.05"])
    assert {r.config["optim"]["lr"] for r in lr.runs} == {0.05}


@pytest.mark.parametrize("override, words", [
    ("method.tau=-1", "method.tau: must be >= 0"),
    ("method.name=foo", "method.name: unknown method 'foo'"),
    ("method.gamma=-1", "no run of this recipe has 'method.gamma' (its method plugins: ce, cosine, la, ldam_drw)"),
    ("method.taus=2", "no run of this recipe has 'method.taus'"),
    ("optim.lrr=0.1", "optim.lrr: unknown key (did you mean 'lr'?)"),
])
def test_a_bad_override_is_one_line_exit_2(override, words, capsys):
    code, out, err = run_cli(["run", QUICKSTART, "--dry-run", override], capsys)
    assert code == 2 and words in err and err.count("\n") == 1 and not out, err


def test_dry_run_shows_the_overridden_value_and_every_setting_that_differs(capsys, tmp_path):
    code, out, err = run_cli(["run", QUICKSTART, "--dry-run", "method.tau=2.0", "--results", tmp_path], capsys)
    assert code == 0, err
    assert "la (tau=2) on fashion_mnist_lt rho=100 seed=0" in out
    recipe = load_recipe(ROOT / "recipes" / "cifar100_lt.yaml", ["seeds=[0]"])
    from ltbench.run.runlines import run_lines

    lines = run_lines(recipe.runs, recipe.override_keys)
    assert len(set(lines)) == len(lines)  # no two runs read alike
    la = [line for line in lines if line.startswith("la (tau=1) on cifar100_lt rho=100 ")]
    assert len(la) == 2  # the 200- and 400-epoch runs differ exactly by the epochs they show
    assert sorted(la)[0].replace("optim.epochs=200", "optim.epochs=400") == sorted(la)[1]
    assert "optim.epochs=200" in sorted(la)[0]


def test_an_execution_setting_override_keeps_the_run_ids(capsys, tmp_path):
    plain = [r.run_id for r in load_recipe(QUICKSTART).runs]
    for override in ("train.num_workers=3", "train.checkpoint_minutes=10", "train.threads=1"):
        assert [r.run_id for r in load_recipe(QUICKSTART, [override]).runs] == plain, override
    code, out, _ = run_cli(["run", QUICKSTART, "--dry-run", "train.num_workers=3", "--results", tmp_path], capsys)
    assert code == 0 and all(run_id in out for run_id in plain)


def test_dry_run_stops_where_a_run_would_when_the_data_is_missing(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LTBENCH_DATA", str(tmp_path / "nowhere"))
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["run", ROOT / "recipes" / "cifar100_lt.yaml", "--dry-run"], capsys)
    assert code == 2 and "CIFAR-100 not found" in err and "cifar-100-python" in err and not out, err
    assert not (tmp_path / "results").exists()  # a dry run writes nothing


def test_status_takes_a_recipe_and_its_overrides_and_names_each_run(capsys, tmp_path):
    code, out, err = run_cli(["status", QUICKSTART, "seeds=[0,1]", "--results", tmp_path], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 10 and lines[-1] == "8 pending"
    assert lines[0].startswith(f"{QUICKSTART}: no results folder {tmp_path / 'quickstart'}")  # where it looked
    assert any("pending" in line and "la (tau=1) on fashion_mnist_lt rho=100 seed=1" in line for line in lines)
    code, _, err = run_cli(["status", tmp_path, "seeds=[0]"], capsys)
    assert code == 2 and "need a recipe file" in err


def test_report_and_other_ltbench_folders_are_not_runs(capsys, tmp_path, write_recipe):
    from tests.reportkit import populate

    recipe = load_recipe(write_recipe(extra={"seeds": [0, 1]}))
    populate(recipe)
    (recipe.root / "report" / "figures").mkdir(parents=True)
    (recipe.root / "report" / "table.md").write_text("x")
    (recipe.root / "_submitit" / "123").mkdir(parents=True)
    (recipe.root / "emptyrun").mkdir()
    code, out, err = run_cli(["status", recipe.root], capsys)
    assert code == 0, err
    assert "report" not in out and "_submitit" not in out and "emptyrun  not a run" in out
    assert "ce on synthetic_lt rho=6 seed=1" in out and "2 done, 1 not a run" in out


# ------------------------------------------------------------------------------------------------
# One prior-name grammar


@pytest.mark.parametrize("name", ["forward1e2", "forward 50", "forward+50", "forward5_0", "forwardinf", "forward0.5",
                                  "Forward50", "backward"])
def test_a_prior_name_outside_the_grammar_is_refused_everywhere(name, write_recipe):
    from ltbench.report.claims import is_metric
    from ltbench.recipe.tables import check_column

    with pytest.raises(ConfigError, match="unknown target prior"):
        load_recipe(write_recipe(extra={"eval": {"target_priors": [name]}}))
    with pytest.raises(ConfigError, match="unknown column|not a prior name"):
        check_column(name if " " not in name else name, "tables.t.columns[0]")
    with pytest.raises(ConfigError, match="not a prior name"):
        check_column(f"prior:{name}", "tables.t.columns[0]")
    assert not is_metric(name)


@pytest.mark.parametrize("name", ["forward50", "backward2.5", "uniform", "forward1"])
def test_a_prior_name_inside_the_grammar_is_accepted_everywhere(name, write_recipe):
    from ltbench.report.claims import is_metric
    from ltbench.recipe.tables import check_column

    load_recipe(write_recipe(extra={"eval": {"target_priors": [name]}}))
    check_column(name, "c")
    check_column(f"prior:{name}", "c")
    assert is_metric(name)


def test_prior_names_sort_from_forward_to_backward_in_tables_and_figures():
    from ltbench.priors import prior_order, prior_position

    names = ["backward10", "uniform", "forward2", "backward2.5", "forward50", "forward10"]
    by_table = sorted(names, key=prior_order)
    assert by_table == ["forward50", "forward10", "forward2", "uniform", "backward2.5", "backward10"]
    assert sorted(names, key=prior_position) == by_table
    assert prior_order("forward1e2") > prior_order("backward50")  # outside the grammar: last, never as uniform
