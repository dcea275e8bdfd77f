"""Malformed recipes, overrides and command lines: each is refused before any run starts.

Every case must give exit 2, exactly one line on stderr naming what is wrong (no traceback), create
nothing at all (no results root, no run directory, nothing outside it), and finish quickly with bounded
memory. Most cases run in this process through ``ltbench.cli.main`` (fast); a few run through the real
command line in a subprocess, where the exit code, stderr and peak memory of the process are measured.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from ltbench import cli, registry

from conftest import ROOT, TINY, deep_update

# A refused input takes milliseconds once torch is imported; the bound only catches work that never ends (an
# quadratic scan), so it is generous: the suite shares its machine (CI, other jobs).
TIME_LIMIT_S = 30.0
MEMORY_LIMIT_MB = 500


def _grid_bomb() -> dict:
    """5 keys x 10 values: 100,000 grid points, more than a recipe may expand into."""
    return {"optim.lr": [0.1 * (i + 1) for i in range(10)], "data.data_seed": list(range(10)),
            "optim.momentum": [0.1 * i for i in range(10)], "optim.weight_decay": [0.0001 * i for i in range(10)],
            "optim.gamma": [0.1 * (i + 1) for i in range(10)]}


# (id, recipe sections merged into TINY, extra command-line arguments, words the error must contain)
RECIPE_CASES = [
    ("lr-nan", {"optim": {"lr": float("nan")}}, [], "optim.lr: expected a finite number"),
    ("lr-inf", {"optim": {"lr": float("inf")}}, [], "optim.lr: expected a finite number"),
    ("lr-negative", {"optim": {"lr": -0.1}}, [], "optim.lr: must be > 0"),
    ("lr-zero", {"optim": {"lr": 0}}, [], "optim.lr: must be > 0"),
    ("epochs-1e12", {"optim": {"epochs": 10**12}}, [], "optim.epochs: must be >= 0 and <= 10000"),
    ("epochs-1e12-string", {"optim": {"epochs": "1e12"}}, [], "optim.epochs: must be >= 0 and <= 10000"),
    ("epochs-huge-int", {"optim": {"epochs": 10**400}}, [], "optim.epochs: expected an integer of at most"),
    ("batch-zero", {"optim": {"batch_size": 0}}, [], "optim.batch_size: must be >= 2"),
    ("batch-one", {"optim": {"batch_size": 1}}, [], "BatchNorm needs 2 images per batch"),
    ("view-unknown", {"method": {"name": "ce", "views": ["sharp"]}}, [], "method.views: unknown view 'sharp'"),
    ("bape-view-unknown", {"method": {"name": "bape", "bape_views": ["sim", "simm"]}}, [],
     "method.bape_views: unknown view 'simm'"),
    ("momentum-1.5", {"optim": {"momentum": 1.5}}, [], "optim.momentum: must be >= 0 and < 1"),
    ("warmup-beyond-epochs", {"optim": {"warmup_epochs": 5}}, [], "optim.warmup_epochs: must be >= 0 and <= 2"),
    ("nesterov-no-momentum", {"optim": {"nesterov": True, "momentum": 0}}, [], "nesterov: true needs momentum > 0"),
    ("milestone-beyond-epochs", {"optim": {"schedule": "step", "milestones": [5]}}, [], "optim.milestones"),
    ("threads-negative", {"train": {"threads": -1}}, [], "train.threads: must be >= 0"),
    ("workers-negative", {"train": {"num_workers": -2}}, [], "train.num_workers: must be >= 0"),
    ("precision-fp8", {"train": {"precision": "fp8"}}, [], "one of 'fp32', 'bf16', 'fp16'"),
    ("imb-factor-zero", {"data": {"imb_factor": 0}}, [], "data.imb_factor: must be >= 1"),
    ("imb-factor-negative", {"data": {"imb_factor": -5}}, [], "data.imb_factor: must be >= 1"),
    ("num-classes-one", {"data": {"num_classes": 1}}, [], "data.num_classes: must be >= 2"),
    ("max-per-class-zero", {"data": {"max_per_class": 0}}, [], "data.max_per_class: must be >= 1"),
    ("image-size-huge", {"data": {"image_size": 100000}}, [], "data.image_size: must be >= 4 and <= 256"),
    ("dataset-unknown", {"data": {"name": "synthetik"}}, [], "unknown dataset 'synthetik'"),
    ("data-unknown-key", {"data": {"colour": "red"}}, [], "data.colour: unknown key"),
    ("ldam-s-zero", {"method": {"name": "ldam", "s": 0}}, [], "method.s: must be > 0"),
    ("ldam-max-m-negative", {"method": {"name": "ldam", "max_m": -1}}, [], "method.max_m: must be >= 0"),
    ("ldam-drw-beta-one", {"method": {"name": "ldam_drw", "beta": 1.0}}, [], "method.beta: must be >= 0 and < 1"),
    ("ce-drw-beta-two", {"method": {"name": "ce_drw", "beta": 2}}, [], "method.beta: must be >= 0 and < 1"),
    ("drw-epoch-negative", {"method": {"name": "ce_drw", "drw_epoch": -1}}, [], "method.drw_epoch: must be >= 0"),
    ("drw-epoch-past-the-end", {"method": {"name": "ce_drw", "drw_epoch": 2}}, [],
     "method.drw_epoch: 2 is not before the end of the schedule (optim.epochs 2"),
    ("drw-epoch-past-an-override", {"method": {"name": "vs", "drw": True, "drw_epoch": 1}}, ["optim.epochs=1"],
     "method.drw_epoch: 1 is not before the end of the schedule (optim.epochs 1"),
    ("drw-epoch-without-drw", {"method": {"name": "ldam", "drw_epoch": 0}}, [],
     "method.drw_epoch: 0 has no effect, method.drw is false"),
    # options that cannot act in any run of the recipe (recipe.idle_options), in run and --dry-run alike
    ("milestones-without-step", {"optim": {"milestones": [1]}}, [],
     "optim.milestones: [1] has no effect: optim.schedule is cosine"),
    ("gamma-without-step", {"optim": {"schedule": "cosine_epoch", "gamma": 0.5}}, ["--dry-run"],
     "optim.gamma: 0.5 has no effect: optim.schedule is cosine_epoch"),
    ("tte-expand-without-tte", {"eval": {"tte_expand": 32}}, [], "eval.tte_expand: 32 has no effect, eval.tte is none"),
    ("eval-every-past-the-end", {"train": {"eval_every": 3}}, ["--dry-run"],
     "train.eval_every: 3 is not before the end of the schedule (optim.epochs 2)"),
    ("eval-every-at-the-end-by-override", {"train": {"eval_every": 1}}, ["optim.epochs=1"],
     "train.eval_every: 1 is not before the end of the schedule (optim.epochs 1)"),
    ("micro-batch-the-whole-batch", {"optim": {"micro_batch_size": 16}}, [],
     "optim.micro_batch_size: 16 is optim.batch_size, so each batch is one chunk"),
    ("best-val-of-one-epoch", {"optim": {"epochs": 1}, "data": {"val_per_class": 2}, "eval": {"select": "best_val"}},
     ["--dry-run"], "eval.select: best_val has no epoch to choose with optim.epochs 1"),
    ("lr-without-training", {"optim": {"epochs": 0, "warmup_epochs": 0}}, [],
     "optim.lr: 0.05 has no effect: optim.epochs is 0, so the model is evaluated as built"),
    ("weight-decay-without-training-by-override", {"optim": {"warmup_epochs": 0}}, ["optim.epochs=0", "--dry-run"],
     "optim.lr: 0.05 has no effect: optim.epochs is 0"),
    ("seed-twice", {"seeds": [0, 1, 0]}, [], "seeds: 0 is listed twice"),
    ("grid-value-twice", {"grid": {"optim.lr": [0.1, 0.2, 0.1]}}, ["--dry-run"], "grid.optim.lr: 0.1 is listed twice"),
    ("grid-method-twice", {"grid": {"method": [{"name": "la", "tau": 1.0}, {"tau": 1.0, "name": "la"}]}}, [],
     "grid.method: {'name': 'la', 'tau': 1.0} is listed twice"),
    ("milestones-idle-in-every-grid-point", {"optim": {"milestones": [1]}, "grid": {"optim.schedule": ["cosine", "constant"]}},
     [], "optim.milestones: [1] has no effect"),
    ("cosine-s-negative", {"method": {"name": "cosine", "s": -3}}, [], "method.s: must be > 0"),
    ("la-tau-nan", {"method": {"name": "la", "tau": float("nan")}}, [], "method.tau: expected a finite number"),
    ("la-tau-string", {"method": {"name": "la", "tau": ".nan"}}, [], "method.tau: expected a number, got '.nan'"),
    ("la-tau-negative", {"method": {"name": "la", "tau": -1}}, [], "method.tau: must be >= 0"),
    ("la-no-views", {"method": {"name": "la", "views": []}}, [], "method.views: must name 1 to 8 views"),
    ("bape-alpha-zero", {"method": {"name": "bape", "alpha_hat": 0, "beta_hat": 0}}, [], "method.alpha_hat"),
    ("bape-beta-above-alpha", {"method": {"name": "bape", "beta_hat": 50}}, [], "need beta_hat < alpha_hat"),
    ("bape-aux-unknown", {"method": {"name": "bape", "aux": {"name": "nope"}}}, [], "unknown method 'nope'"),
    ("bape-aux-views-count", {"method": {"name": "bape", "aux_views": ["strong", "strong"]}}, [],
     "method.aux_views: names 2 view(s) but the auxiliary method 'la' takes 1"),
    ("bape-eta-negative", {"method": {"name": "bape", "eta": -1}}, [], "method.eta: must be >= 0"),
    ("bape-da-mode", {"method": {"name": "bape", "da_mode": "magic"}}, [], "method.da_mode: expected one of"),
    ("method-unknown", {"method": {"name": "focal"}}, [], "unknown method 'focal'"),
    ("method-not-mapping", {"method": "ce"}, [], "method: expected a mapping, got 'ce'"),
    ("method-name-null", {"method": {"name": None}}, [], "method.name: expected a string"),
    ("target-prior-unknown", {"eval": {"target_priors": ["sideways"]}}, [], "unknown target prior 'sideways'"),
    ("target-prior-rho-zero", {"eval": {"target_priors": ["forward0"]}}, [], "unknown target prior 'forward0'"),
    ("test-set-nan", {"eval": {"test_sets": ["forwardnan"]}}, [], "eval.test_sets[0]"),
    ("test-set-path", {"eval": {"test_sets": ["../x"]}}, [], "eval.test_sets"),
    ("few-above-many", {"eval": {"few_threshold": 200}}, [], "eval.few_threshold: must not exceed many_threshold"),
    ("grid-key-foo", {"grid": {"foo": [1, 2]}}, [], "grid.foo: not a configuration key"),
    ("grid-key-seeds", {"grid": {"seeds": [[0, 1]]}}, [], "grid.seeds: not a configuration key"),
    ("grid-key-name", {"grid": {"name": ["a", "b"]}}, [], "grid.name: not a configuration key"),
    ("grid-not-list", {"grid": {"optim.lr": 0.1}}, [], "grid.optim.lr: expected a non-empty list"),
    ("grid-empty-list", {"grid": []}, [], "grid: an empty list of grids gives no run"),
    ("grid-empty-values", {"grid": {"optim.lr": []}}, [], "grid.optim.lr: expected a non-empty list"),
    ("threads-float", {"train": {"threads": 1.5}}, [], "train.threads: expected an integer or null, got 1.5"),
    ("seeds-huge", {"seeds": [2**40]}, [], "seeds[...]: must be >= 0 and <= 4294967295"),
    ("grid-second-point-bad", {"grid": {"optim.lr": [0.1, float("nan")]}}, [], "optim.lr: expected a finite number"),
    ("grid-unknown-subkey", {"grid": {"optim.lrr": [0.1]}}, [], "optim.lrr: unknown key"),
    ("grid-too-many-points", {"grid": _grid_bomb()}, [], "at most 10000 runs"),
    ("seeds-empty", {"seeds": []}, [], "seeds: expected a non-empty list"),
    ("seeds-negative", {"seeds": [-1]}, [], "seeds[...]: must be >= 0"),
    ("seeds-string", {"seeds": "x" * 5000}, [], "seeds: expected a list"),
    ("name-parent", {"name": "../../escape"}, [], "name: '../../escape' is not a plain name"),
    ("name-absolute", {"name": "/tmp/escape"}, [], "is not a plain name"),
    ("name-dot", {"name": "."}, [], "is not a plain name"),
    ("name-separator", {"name": "a/b"}, [], "is not a plain name"),
    ("name-not-string", {"name": ["x"]}, [], "name: expected a string"),
    ("name-report", {"name": "report"}, [], "name: 'report' is a folder name ltbench keeps for its own files"),
    ("name-posthoc", {"name": "posthoc"}, [], "name: 'posthoc' is a folder name ltbench keeps"),
    ("name-underscore", {"name": "_submitit"}, [], "name: '_submitit' is a folder name ltbench keeps"),
    ("grid-threads", {"grid": {"train.threads": [1, 2]}}, [], "grid.train.threads: an execution setting"),
    ("grid-compile", {"grid": {"train.compile": ["off", "default"]}}, [], "grid.train.compile: an execution setting"),
    ("cb-gamma-softmax", {"method": {"name": "cb", "gamma": 2.0}}, [],
     "method.gamma: 2.0 has no effect: the focal exponent is read by loss_type focal only"),
    ("cb-gamma-sigmoid-grid", {"method": {"name": "cb", "loss_type": "sigmoid"}, "grid": {"method.gamma": [1.0, 2.0]}},
     [], "method.gamma: 1.0 has no effect"),
    ("launcher-jobs-zero", {"launcher": {"jobs": 0}}, [], "launcher.jobs: must be >= 1"),
    ("launcher-slurm-time", {"launcher": {"name": "slurm", "time_min": 0}}, [], "launcher.time_min: must be >= 1"),
    ("top-level-unknown", {"colour": "red"}, [], "colour: unknown key"),
    ("top-level-int-key", {1: "x"}, [], "1: unknown key"),
    ("plugin-folder-missing", {"plugins": ["./no_such_plugins"]}, [], "does not exist"),
    # overrides and options, on a valid recipe
    ("override-no-equals", {}, ["optim.lr"], "expected key=value"),
    ("override-bad-key", {}, ["optim..lr=1"], "is not a dotted key"),
    ("override-name-escape", {}, ["name=../x"], "is not a plain name"),
    ("override-lr-nan", {}, ["--dry-run", "optim.lr=.nan"], "optim.lr: expected a finite number"),
    ("override-after-option", {}, ["--results", "RESULTS", "seeds=[-3]"], "seeds[...]: must be >= 0"),
    ("override-huge", {}, ["description=" + "y" * 20000], "longer than 10000 characters"),
    ("jobs-zero", {}, ["--jobs", "0"], "argument --jobs: must be >= 1"),
    ("jobs-text", {}, ["--jobs", "many"], "argument --jobs: expected a whole number"),
    ("launcher-unknown", {}, ["--launcher", "cloud"], "argument --launcher: invalid choice"),
    ("unknown-option", {}, ["--bogus"], "unrecognized arguments: --bogus"),
]

# (id, raw bytes of the recipe file, words)
FILE_CASES = [
    ("yaml-invalid", b"data: {name: [\n", "not valid YAML at line 2"),
    ("yaml-control-char", b"name: a\x07b\n", "not valid YAML: character"),
    ("not-utf8", b"name: caf\xe9\n", "not UTF-8 text (byte 0xe9"),
    ("too-large", b"description: '" + b"x" * (600 * 1024) + b"'\n", "larger than 512 KiB"),
    ("not-a-mapping", b"- 1\n- 2\n", "must be a YAML mapping at the top level"),
]


def snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture(scope="module", autouse=True)
def warm_registry():
    registry.discover()  # import torch and the plugins once, so the time limit measures the input alone
    import ltbench.data.transforms  # noqa: F401 - torchvision, imported by the view-name checks


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """tmp/cwd is the working directory and tmp/cwd/results the results root; nothing may appear anywhere."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return tmp_path, cwd


def run_in_process(argv: list[str], capsys) -> tuple[int, str, str, float, float]:
    tracemalloc.start()
    start = time.perf_counter()
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    elapsed = time.perf_counter() - start
    peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    out, err = capsys.readouterr()
    return code, out, err, elapsed, peak_mb


def assert_refused(code, err: str, words: str, elapsed: float, peak_mb: float) -> None:
    lines = err.splitlines()
    assert code == 2, f"exit {code}, stderr {err[:500]!r}"
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {err[:500]!r}"
    assert "Traceback" not in err and "internal error" not in err
    assert words in lines[0], f"{words!r} not in {lines[0]!r}"
    assert len(lines[0]) < 1200, f"error line of {len(lines[0])} characters"
    assert elapsed < TIME_LIMIT_S, f"took {elapsed:.1f} s"
    assert peak_mb < MEMORY_LIMIT_MB, f"allocated {peak_mb:.0f} MB"


@pytest.mark.parametrize("case_id, extra, args, words", RECIPE_CASES, ids=[c[0] for c in RECIPE_CASES])
def test_malformed_recipe_or_override_is_refused_before_any_run(case_id, extra, args, words, workspace, capsys):
    tmp, cwd = workspace
    results = cwd / "results"
    recipe = {k: v for k, v in deep_update(TINY, {"results_dir": str(results)}).items()}
    for key, value in extra.items():  # a whole-section replacement, so a 'method' of another name is clean
        recipe[key] = deep_update(recipe[key], value) if isinstance(value, dict) and isinstance(recipe.get(key), dict) \
            and value.get("name", recipe[key].get("name")) == recipe[key].get("name") else value
    path = cwd / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, allow_unicode=True))
    before = snapshot(tmp)
    argv = ["run", str(path), *[str(results) if a == "RESULTS" else a for a in args]]
    code, out, err, elapsed, peak = run_in_process(argv, capsys)
    assert_refused(code, err, words, elapsed, peak)
    assert snapshot(tmp) == before, f"files appeared: {sorted(snapshot(tmp) - before)}"


@pytest.mark.parametrize("extra", [
    {"optim": {"milestones": [1]}, "grid": {"optim.schedule": ["cosine", "step"]}},
    {"eval": {"tte": "fivecrop", "tte_expand": 8}, "grid": {"eval.tte": ["none", "fivecrop"]}},
    {"train": {"eval_every": 1}, "grid": {"optim.epochs": [1, 2]}},
    {"optim": {"micro_batch_size": 8}, "grid": {"optim.batch_size": [8, 16]}},
    {"method": {"name": "cb", "gamma": 2.0}, "grid": {"method.loss_type": ["softmax", "focal"]}},
], ids=["milestones", "tte-expand", "eval-every", "micro-batch", "cb-gamma"])
def test_an_option_that_acts_in_some_run_of_the_grid_is_accepted(extra, workspace, capsys):
    """Refused is an option that acts in none of the recipe's runs: a grid may give milestones for its step
    runs and leave them idle in its cosine ones (as recipes/imagenet_lt_clip.yaml does tte_expand)."""
    tmp, cwd = workspace
    path = cwd / "recipe.yaml"
    path.write_text(yaml.safe_dump(deep_update(TINY, {"results_dir": str(cwd / "results"), **extra})))
    code, out, err, _, _ = run_in_process(["run", str(path), "--dry-run"], capsys)
    assert code == 0, err
    assert "2 run(s)" in out


@pytest.mark.parametrize("case_id, content, words", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_malformed_recipe_file_is_refused_quickly(case_id, content, words, workspace, capsys):
    tmp, cwd = workspace
    path = cwd / "recipe.yaml"
    path.write_bytes(content)
    before = snapshot(tmp)
    code, out, err, elapsed, peak = run_in_process(["run", str(path)], capsys)
    assert_refused(code, err, words, elapsed, peak)
    assert str(path) in err  # the message names the file
    assert snapshot(tmp) == before


@pytest.mark.parametrize("argv, words", [
    (["run", "missing.yaml"], "recipe file not found"),
    (["run", "."], "is a directory, not a recipe file"),
    (["data", "recipe.yaml", "data.imb_factor=0"], "data.imb_factor: must be >= 1"),
    (["data", "recipe.yaml", "eval.target_priors=[sideways]"], "unknown target prior"),
    (["data", "recipe.yaml", "data.num_classes=1000", "data.val_per_class=10000", "data.image_size=64",
      "data.max_per_class=1", "data.imb_factor=1", "data.test_per_class=1"],  # 491 GB of validation images
     "recipe.yaml: data: loading it needs about"),
    (["status", "recipe.yaml", "--results", "elsewhere", "--debug", "--bogus"], "unrecognized arguments"),
    (["run", "recipe.yaml", "--launcher", "slurm", "optim.lr=-1"], "optim.lr: must be > 0"),
    (["run", "recipe.yaml", "--launcher", "debug", "launcher.max_array_size=0"], "launcher.max_array_size"),
])
def test_other_commands_validate_too(argv, words, workspace, capsys, write_recipe):
    tmp, cwd = workspace
    (cwd / "recipe.yaml").write_text(yaml.safe_dump({**TINY, "results_dir": str(cwd / "results")}))
    before = snapshot(tmp)
    code, out, err, elapsed, peak = run_in_process(argv, capsys)
    assert_refused(code, err, words, elapsed, peak)
    assert snapshot(tmp) == before


def test_run_directory_may_not_resolve_outside_the_results_root(workspace, capsys):
    tmp, cwd = workspace
    outside = tmp / "outside"
    outside.mkdir()
    (cwd / "results").mkdir()
    (cwd / "results" / "tiny").symlink_to(outside)
    (cwd / "tiny.yaml").write_text(yaml.safe_dump({**TINY, "results_dir": str(cwd / "results")}))
    code, out, err, elapsed, peak = run_in_process(["run", "tiny.yaml"], capsys)
    assert_refused(code, err, "outside the results root", elapsed, peak)
    assert list(outside.iterdir()) == []


def test_options_and_overrides_are_accepted_anywhere(workspace, capsys):
    tmp, cwd = workspace
    (cwd / "tiny.yaml").write_text(yaml.safe_dump({**TINY, "results_dir": str(cwd / "results")}))
    for argv in (["run", "tiny.yaml", "--dry-run", "--debug"],
                 ["--debug", "run", "tiny.yaml", "--dry-run"],
                 ["run", "tiny.yaml", "--results", str(tmp / "r2"), "seeds=[0,1]", "--dry-run"],
                 ["run", "--dry-run", "tiny.yaml", "optim.lr=0.01", "--debug", "seeds=[0,1]"]):
        assert cli.main(argv) == 0, argv
        out = capsys.readouterr().out
        assert "run(s)" in out
    assert "2 run(s)" in out and not (tmp / "r2").exists()  # a dry run writes nothing


# -------------------------------------------------------------------------------------------------
# Through the real command line: exit status, stderr and the peak memory of the process


# `python -m ltbench ARGS`, then the process's own peak RSS (VmHWM) written to a file at exit. getrusage() of a
# child is no use here: Linux carries the forking pytest process's peak RSS over into the child's.
MEASURED = """
import atexit, runpy, sys
out = sys.argv[1]
def peak():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            open(out, 'w').write(line.split()[1])
atexit.register(peak)
sys.argv = ['ltbench'] + sys.argv[2:]
runpy.run_module('ltbench', run_name='__main__')
"""


def run_measured(args: list[str], cwd: Path) -> tuple[int, str, float, float]:
    """Run ``python -m ltbench ARGS``; return (exit code, stderr, seconds, peak RSS in MB of that process)."""
    if not Path("/proc/self/status").exists():
        pytest.skip("needs Linux /proc to measure a process's peak memory")
    peak_path = cwd.parent / "peak_kb.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", MEASURED, str(peak_path), *args], cwd=cwd, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    peak_mb = int(peak_path.read_text()) / 1024
    peak_path.unlink()
    return proc.returncode, proc.stderr, elapsed, peak_mb


@pytest.mark.parametrize("name, content, args, words", [
    ("latin1", b"name: caf\xe9\n", [], "not UTF-8 text"),
    ("escape", yaml.safe_dump({**TINY, "name": "../../escape"}).encode(), ["--dry-run"], "is not a plain name"),
    ("grid", yaml.safe_dump({**TINY, "grid": {"seeds": [[1]]}}).encode(), [], "grid.seeds: not a configuration key"),
    ("jobs", yaml.safe_dump(TINY).encode(), ["--jobs", "0"], "argument --jobs: must be >= 1"),
])
def test_real_cli_refuses_with_bounded_time_and_memory(name, content, args, words, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "r.yaml").write_bytes(content)
    before = snapshot(tmp_path)
    code, err, elapsed, rss_mb = run_measured(["run", "r.yaml", *args], cwd)
    assert code == 2 and len(err.splitlines()) == 1 and words in err, err[:500]
    assert "Traceback" not in err
    assert snapshot(tmp_path) == before
    # these inputs are refused before torch is imported, so the whole process stays small
    assert rss_mb < MEMORY_LIMIT_MB, f"peak RSS {rss_mb:.0f} MB"
    assert elapsed < 4 * TIME_LIMIT_S, f"{elapsed:.1f} s"  # a fresh interpreter on a loaded machine: generous


@pytest.mark.parametrize("code_line, said, command", [
    ("import sys\nsys.exit(0)\n", "called sys.exit(0)", "run"),
    # os._exit would end ltbench at once with the plugin's code and no word: contained as during training
    ("import os\nos._exit(3)\n", "called os._exit(3)", "run"),
    ("import os\nos._exit(3)\n", "called os._exit(3)", "list"),
], ids=["sys-exit-run", "os-exit-run", "os-exit-list"])
def test_plugin_exiting_on_import_is_one_line_naming_it(code_line, said, command, tmp_path):
    plugins = tmp_path / "exiting_plugins"
    plugins.mkdir()
    (plugins / "__init__.py").write_text("")
    (plugins / "quitter.py").write_text(code_line)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "r.yaml").write_text(yaml.safe_dump({**TINY, "plugins": [str(plugins)], "results_dir": "results"}))
    args = ["run", "r.yaml"] if command == "run" else ["list", "methods", "--plugins", str(plugins)]
    code, err, _, _ = run_measured(args, cwd)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert said in err and "exiting_plugins" in err
    assert not (cwd / "results").exists()
