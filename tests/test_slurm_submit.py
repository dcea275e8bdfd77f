"""The Slurm launcher against a fake ``sbatch`` (as submitit tests itself): what ltbench submits, without
a cluster. The fake records each call's arguments and submission script, and answers with a job id.
The end-to-end runs on a real one-node cluster stay in test_launchers.py / test_slurm_local.py (-m slurm)."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from ltbench.results import status_rule, store
from ltbench.run.launch import LAUNCHERS, launch
from ltbench.recipe import load_recipe

FAKE_SBATCH = """#!/bin/sh
# record the arguments and the submission script; answer like sbatch does
n=$(ls "$FAKE_SBATCH_LOG" | wc -l)
id=$((4200 + n))
mkdir -p "$FAKE_SBATCH_LOG/$id"
printf '%s\\n' "$@" > "$FAKE_SBATCH_LOG/$id/args"
cp "$1" "$FAKE_SBATCH_LOG/$id/script"
echo "Submitted batch job $id"
"""


@pytest.fixture
def fake_sbatch(tmp_path, monkeypatch):
    """A fake sbatch first on PATH; returns the folder where each call leaves <job id>/{args,script}."""
    bin_dir, log = tmp_path / "bin", tmp_path / "sbatch-calls"
    bin_dir.mkdir()
    log.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("srun", "#!/bin/sh\nexit 1\n")):  # submitit looks for srun
        exe = bin_dir / name
        exe.write_text(text)
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SBATCH_LOG", str(log))
    return log


def calls(log: Path) -> list[tuple[str, str]]:
    """(job id, submission script) per sbatch call, in submission order."""
    return [(d.name, (d / "script").read_text()) for d in sorted(log.iterdir(), key=lambda d: int(d.name))]


def sbatch_options(script: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)=?(.*)$", script, flags=re.M))


def slurm_recipe(write_recipe, seeds, **launcher):
    return load_recipe(write_recipe(extra={"seeds": seeds, "launcher": {"name": "slurm", **launcher}}))


def test_registry_names_the_four_launchers():
    assert LAUNCHERS.names() == ["debug", "local", "pool", "slurm"]


def test_every_launcher_a_recipe_or_the_command_line_may_name_is_in_the_registry():
    """recipe.LauncherConfig.name and 'ltbench run/posthoc --launcher' offer the same names, each a registered
    launcher ('pool' is the one 'local' picks for more than one worker, never named by a user)."""
    import typing

    from ltbench import cli
    from ltbench.recipe import LauncherConfig

    offered = set(typing.get_args(typing.get_type_hints(LauncherConfig)["name"]))
    parser = cli.build_parser()
    for command in ("run", "posthoc"):
        sub = next(a for a in parser._subparsers._group_actions[0].choices[command]._actions
                   if a.dest == "launcher")
        assert set(sub.choices) == offered
    assert offered | {"pool"} == set(LAUNCHERS.names())


def test_an_unknown_launcher_name_is_refused_with_a_suggestion():
    from ltbench.registry import RegistryError

    with pytest.raises(RegistryError, match="unknown launcher 'slrum'. Did you mean 'slurm'\\? Known: debug, local, pool, slurm.$"):
        LAUNCHERS.get("slrum")


def test_one_array_with_the_recipe_options(fake_sbatch, write_recipe, capsys):
    recipe = slurm_recipe(write_recipe, [0, 1, 2], cpus_per_task=3, mem_gb=5, time_min=42, partition="gpu",
                          array_parallelism=2)
    assert launch(recipe) == {"failed": 0}  # submitted, not waited for
    (job_id, script), = calls(fake_sbatch)
    opts = sbatch_options(script)
    assert opts["array"] == "0-2%2"  # three runs, at most two at once
    assert opts["cpus-per-task"] == "3" and opts["partition"] == "gpu" and opts["time"] == "42"
    assert opts["mem"] == "5GB" and opts["job-name"] == f"ltbench-{recipe.name}"
    assert "submitit" in script and "srun" in script  # each task runs submitit's unpickler
    for i, spec in enumerate(recipe.runs):
        submitted = json.loads((Path(spec.run_dir) / store.SUBMITTED).read_text())
        assert submitted["job_id"] == f"{job_id}_{i}" and submitted["cluster"] == "slurm"
        assert status_rule.run_status(Path(spec.run_dir)) == "pending"
    assert f"submitted 3 run(s) as slurm job array {job_id}" in capsys.readouterr().out


@pytest.mark.parametrize("launcher, train, idle", [
    ({}, {}, 1),  # the default cpus_per_task 2 against one torch thread
    ({"cpus_per_task": 1}, {}, None),
    ({"cpus_per_task": 4}, {"threads": 2, "num_workers": 1}, 1),
    ({"cpus_per_task": 4}, {"threads": 2, "num_workers": 2}, None),
    ({"cpus_per_task": 8, "gpus_per_node": 1}, {}, None),  # a GPU run's host threads take the allocation
])
def test_a_cpu_grid_asking_for_cpus_it_does_not_use_is_told_so(fake_sbatch, write_recipe, capsys, launcher, train,
                                                                 idle):
    """A CPU run computes with train.threads (unset: 1) plus its loader processes whatever Slurm allocates;
    the rest of cpus_per_task would sit idle on a shared cluster without a word."""
    recipe = load_recipe(write_recipe(extra={"seeds": [0], "launcher": {"name": "slurm", **launcher},
                                             "train": {"progress": False, **train}}))
    launch(recipe)
    out = capsys.readouterr().out
    if idle is None:
        assert "stay idle" not in out
    else:
        assert f"{idle} CPU(s) of every task stay idle" in out and "launcher.cpus_per_task:" in out
    assert len(calls(fake_sbatch)) == 1  # said, and submitted as asked


def test_chunks_of_max_array_size(fake_sbatch, write_recipe):
    recipe = slurm_recipe(write_recipe, [0, 1, 2, 3, 4], max_array_size=2)
    launch(recipe)
    submitted = calls(fake_sbatch)
    arrays = [sbatch_options(script).get("array") for _, script in submitted]
    assert arrays == ["0-1%2", "0-1%2", None]  # 2 + 2 + 1 runs (parallelism capped at the size); 1 run: a plain job
    ids = [json.loads((Path(s.run_dir) / store.SUBMITTED).read_text())["job_id"] for s in recipe.runs]
    first, second, third = (job_id for job_id, _ in submitted)
    assert ids == [f"{first}_0", f"{first}_1", f"{second}_0", f"{second}_1", third]


def test_finished_runs_are_not_submitted_again(fake_sbatch, write_recipe):
    from ltbench.run.local_pool import run_local

    recipe = slurm_recipe(write_recipe, [0, 1])
    run_local([recipe.runs[0]])  # seed 0 finishes here (a few seconds on the tiny recipe)
    assert status_rule.run_status(Path(recipe.runs[0].run_dir)) == "done"
    launch(recipe)
    (job_id, script), = calls(fake_sbatch)
    assert "array" not in sbatch_options(script)  # one run left: a plain job
    assert not (Path(recipe.runs[0].run_dir) / store.SUBMITTED).exists()
    assert json.loads((Path(recipe.runs[1].run_dir) / store.SUBMITTED).read_text())["job_id"] == job_id


def test_a_grid_failing_validation_submits_nothing(fake_sbatch, write_recipe, cli):
    recipe = write_recipe(extra={"seeds": [0, 1], "launcher": {"name": "slurm"},
                                 "grid": {"optim.lr": [0.1, -1.0]}})
    out = cli("run", recipe, env={"PATH": os.environ["PATH"], "FAKE_SBATCH_LOG": str(fake_sbatch)})
    assert out.returncode == 2 and "lr" in out.stderr, out.stderr
    assert calls(fake_sbatch) == []
    assert not (Path(recipe).parent / "results").exists()
