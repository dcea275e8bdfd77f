"""Launchers: submitit's debug executor and the local worker pool produce the same results as the
in-process launcher; a grid on a real (local) Slurm cluster survives a requeue mid-run."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ltbench.results import store
from ltbench.recipe import load_recipe
from tests.conftest import ROOT


def results_by_id(root: Path) -> dict:
    return {json.loads(p.read_text())["run_id"]: json.loads(p.read_text()) for p in root.rglob(store.RESULT)}


def test_debug_executor_and_worker_pool_match_in_process_runs(tmp_path, write_recipe, cli):
    recipe = write_recipe(extra={"seeds": [0, 1]})
    outs = {}
    for name, args in {"inproc": [], "debug": ["--launcher", "debug"], "pool": ["--jobs", "2", "--verbose"]}.items():
        out = cli("run", recipe, "--results", tmp_path / name, *args)
        assert out.returncode == 0, out.stdout + out.stderr
        outs[name] = results_by_id(tmp_path / name)
        assert len(outs[name]) == 2 and all(r["status"] == "done" for r in outs[name].values())
        accuracy = {r["config"]["seed"]: 100 * r["metrics"]["all"] for r in outs[name].values()}
        for seed, acc in accuracy.items() if name != "debug" else ():  # local: method, seed, All accuracy
            assert f"finished ce seed {seed} (" in out.stdout and f"done, All {acc:.2f} %" in out.stdout, name
        if name == "pool":  # not a terminal, --verbose: one plain line per epoch and slot, with loss, img/s and ETA
            assert all(any(line.startswith("[slot ") and f"ce seed {seed}: epoch 2/2 loss " in line and
                           " img/s ETA 0:00" in line for line in out.stdout.splitlines()) for seed in (0, 1)), out.stdout
    for run_id, r in outs["inproc"].items():
        for other in ("debug", "pool"):
            assert outs[other][run_id]["metrics"]["per_class"] == r["metrics"]["per_class"], other
    status = cli("status", recipe, "--results", tmp_path / "pool")
    assert "2 done" in status.stdout


def test_slurm_launcher_without_sbatch_says_so(write_recipe, cli):
    # PATH without the folders that hold sbatch, so the test runs whether Slurm is installed or not.
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep) if not (Path(d) / "sbatch").exists())
    out = cli("run", write_recipe(), "--launcher", "slurm", env={"PATH": path})
    assert out.returncode == 2 and "'sbatch' is not on PATH" in out.stderr


EPOCHS = 4
HELD = '''
import os
import time
from dataclasses import dataclass

import torch.nn as nn
import torch.nn.functional as F

from ltbench.method import Method
from ltbench.registry import METHODS


@dataclass
class HeldConfig:
    gates: str = ""  # folder of the gate file


@METHODS.register("held")
class Held(Method):
    """Cross-entropy; the first process to start a second epoch takes the gate and holds there."""

    Config = HeldConfig

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)

    def on_epoch_start(self, epoch):
        if epoch != 1:
            return
        try:
            fd = os.open(os.path.join(self.cfg.gates, "held"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return  # taken: another run, or this run before its requeue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        deadline = time.monotonic() + 600  # held until the requeue kills the job; never a hung suite
        while time.monotonic() < deadline:
            time.sleep(0.1)

    def loss(self, features, labels, *, epoch):
        logits = self.head(features[0])
        return {"loss": F.cross_entropy(logits, labels), "logits": logits.detach()}

    def predict(self, features, *, target_prior=None):
        return self.head(features)
'''


@pytest.mark.slurm
def test_slurm_grid_with_a_requeued_run(tmp_path, write_recipe, cli):
    if not shutil.which("sbatch") or not os.environ.get("SLURM_CONF"):
        pytest.skip("needs a running cluster: eval $(scripts/slurm-local.sh up)")
    # The first run to start its second epoch holds there (a gate no one opens) until the requeue kills its
    # job: the requeue always lands mid-training, whatever the machine's speed. The restarted job finds the
    # gate taken and trains on.
    plugins, gates = tmp_path / "plugins", tmp_path / "gates"
    plugins.mkdir()
    gates.mkdir()
    (plugins / "held.py").write_text(HELD)
    recipe = write_recipe(extra={
        "seeds": [0, 1, 2], "plugins": [str(plugins)], "method": {"name": "held", "gates": str(gates)},
        "optim": {"epochs": EPOCHS, "batch_size": 8},
        "launcher": {"name": "slurm", "cpus_per_task": 1, "mem_gb": 1, "time_min": 20},
    })
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "ltbench", "run", str(recipe), "--wait"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    held, deadline = gates / "held", time.time() + 300
    while not (held.exists() and held.read_text()) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    if not (held.exists() and held.read_text()):
        proc.kill()
        raise AssertionError("no run reached its second epoch:\n" + proc.communicate()[0])
    pid = int(held.read_text())
    target = next(p.parent for p in (tmp_path / "results").rglob(store.STARTED)
                  if json.loads(p.read_text())["pid"] == pid)
    epochs_before = len(store.read_jsonl(target / store.LOG))
    job_id = json.loads((target / store.SUBMITTED).read_text())["job_id"]
    requeue = subprocess.run(["scontrol", "requeue", str(job_id)], capture_output=True, text=True)
    assert requeue.returncode == 0, requeue.stderr
    out, _ = proc.communicate(timeout=600)
    elapsed = time.time() - t0
    assert proc.returncode == 0, out
    results = results_by_id(tmp_path / "results")
    assert len(results) == 3 and all(r["status"] == "done" for r in results.values()), out
    requeued = json.loads((target / store.RESULT).read_text())
    assert requeued["provenance"]["requeue_count"] == 1
    assert requeued["provenance"]["slurm_job_id"]
    assert [r["epoch"] for r in store.read_jsonl(target / store.LOG)] == list(range(1, EPOCHS + 1))
    assert "Many" in out  # --wait prints the table
    # The resumed run ends exactly where an uninterrupted run of the same spec ends.
    spec = next(s for s in load_recipe(recipe).runs if s.run_id == requeued["run_id"])
    from ltbench.runner import run_one

    import torch

    threads = torch.get_num_threads()
    config = {**spec.config, "train": {**spec.config["train"], "threads": 1}}  # as the Slurm task had
    try:
        run_one({**spec.to_dict(), "config": config, "run_dir": str(tmp_path / "uninterrupted")}, say=lambda m: None)
    finally:
        torch.set_num_threads(threads)
    reference = json.loads((tmp_path / "uninterrupted" / store.RESULT).read_text())
    assert requeued["metrics"]["per_class"] == reference["metrics"]["per_class"]
    print(f"\nslurm grid: {elapsed:.1f}s; requeued {requeued['run_id']} after {epochs_before} epoch(s); "
          f"all={requeued['metrics']['all']:.4f} (uninterrupted {reference['metrics']['all']:.4f})")


def test_debug_launcher_runs_every_array_chunk(tmp_path, write_recipe, cli):
    """max_array_size 1 splits 2 seeds into 2 arrays: both must run (the debug cluster once waited on
    the last array only, so one run never executed)."""
    recipe = write_recipe(extra={"seeds": [0, 1], "optim": {"epochs": 1},
                                 "launcher": {"name": "debug", "max_array_size": 1}})
    out = cli("run", recipe, "--results", tmp_path / "debug")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("submitted 1 run(s) as debug job array") == 2
    results = results_by_id(tmp_path / "debug")
    assert len(results) == 2 and all(r["status"] == "done" for r in results.values())


# ------------------------------------------------------------------------------------------------
# launcher.runs_per_gpu: placement tested on CPU with a faked device list


def test_gpu_slots_place_workers_round_robin():
    from ltbench.run.local_pool import gpu_slots, pool_size

    assert pool_size(jobs=1, runs_per_gpu=3, gpus=["0", "1"]) == 6
    assert pool_size(jobs=4, runs_per_gpu=1, gpus=["0", "1"]) == 4  # jobs as before
    assert pool_size(jobs=2, runs_per_gpu=3, gpus=[]) == 2
    assert gpu_slots(6, ["0", "1"]) == ["0", "1", "0", "1", "0", "1"]
    assert gpu_slots(3, ["4", "7", "2"]) == ["4", "7", "2"]
    assert gpu_slots(2, []) == [None, None]


class FakeWorker:
    """Stands for a worker process: 'done' after a few polls; records what the pool gave it."""

    live: list = []
    started: list = []

    def __init__(self, cmd, env, **kwargs):
        self.gpu, self.polls, self.returncode = env.get("CUDA_VISIBLE_DEVICES"), 0, None
        self.threads = env["OMP_NUM_THREADS"]
        FakeWorker.live.append(self)
        FakeWorker.started.append((self.gpu, [w.gpu for w in FakeWorker.live]))

    def poll(self):
        self.polls += 1
        if self.polls >= 3 and self.returncode is None:
            self.returncode = 0
            FakeWorker.live.remove(self)
        return self.returncode


def test_runs_per_gpu_puts_that_many_runs_on_each_faked_gpu(tmp_path, write_recipe, monkeypatch, capsys):
    from ltbench.run import launch, local_pool

    recipe = load_recipe(write_recipe(extra={"launcher": {"runs_per_gpu": 2}}), ["seeds=[0,1,2,3,4,5,6]"])
    monkeypatch.setattr(local_pool, "visible_gpus", lambda: ["3", "5"])
    monkeypatch.setattr(local_pool.subprocess, "Popen", FakeWorker)
    monkeypatch.setattr(local_pool.time, "sleep", lambda s: None)
    monkeypatch.setattr(launch, "print_summary", lambda recipe: {})
    FakeWorker.live, FakeWorker.started = [], []
    launch.launch(recipe)
    assert len(FakeWorker.started) == 7
    assert [gpu for gpu, _ in FakeWorker.started[:4]] == ["3", "5", "3", "5"]
    for gpu, live in FakeWorker.started:  # never more than 2 runs at once on one GPU
        assert live.count("3") <= 2 and live.count("5") <= 2, live
    assert max(len(live) for _, live in FakeWorker.started) == 4
    out = capsys.readouterr().out
    assert "in slot 0 on GPU 3" in out and "in slot 3 on GPU 5" in out


@pytest.mark.parametrize("launcher, gpus, message", [
    ({"runs_per_gpu": 2}, [], "needs GPUs, but torch sees none here"),
    ({"runs_per_gpu": 2, "jobs": 3}, ["0", "1"], "makes 4 workers, but launcher.jobs (or --jobs) asks for 3"),
    ({"runs_per_gpu": 2, "name": "debug"}, ["0"], "applies to the local launcher only"),
])
def test_runs_per_gpu_is_refused_where_it_cannot_take_effect(write_recipe, monkeypatch, launcher, gpus, message):
    from ltbench.run import launch, local_pool
    from ltbench.errors import ConfigError

    recipe = load_recipe(write_recipe(extra={"launcher": launcher}))
    monkeypatch.setattr(local_pool, "visible_gpus", lambda: gpus)
    with pytest.raises(ConfigError, match="launcher.runs_per_gpu: 2 ") as err:
        launch.launch(recipe)
    assert message in str(err.value)


def test_runs_per_gpu_without_gpus_is_one_line_and_exit_2(write_recipe, cli):
    out = cli("run", write_recipe(extra={"launcher": {"runs_per_gpu": 2}}), env={"CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 2, out.stdout + out.stderr
    assert "launcher.runs_per_gpu: 2 needs GPUs" in out.stderr and "Traceback" not in out.stderr
