"""Data-parallel training on CPU with gloo: gradient averaging is exact, and a 2-process run agrees
with a 1-process run at the same global batch (they differ only through per-process BatchNorm
statistics)."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from ltbench.results import store
from ltbench.recipe import load_recipe
from tests.conftest import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, argv: list[str], timeout: float = 600) -> list[subprocess.CompletedProcess]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, *argv], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        outs.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return outs


GRAD_SCRIPT = textwrap.dedent("""
    import sys, torch
    from ltbench.train import distributed
    rank, world = distributed.init_from_env()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    x, y = torch.randn(8, 5), torch.randint(0, 3, (8,))
    full = torch.nn.functional.cross_entropy(model(x), y)
    reference = torch.autograd.grad(full, list(model.parameters()))
    loss = torch.nn.functional.cross_entropy(model(x[rank::world]), y[rank::world])
    loss.backward()
    distributed.average_gradients(model.parameters())
    err = max((p.grad - g).abs().max().item() for p, g in zip(model.parameters(), reference))
    # channels_last parameters keep channels_last gradients, averaged in place (no NCHW copies)
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 3))
    conv.to(memory_format=torch.channels_last)
    images = torch.randn(8, 3, 6, 6).contiguous(memory_format=torch.channels_last)
    reference = torch.autograd.grad(torch.nn.functional.cross_entropy(conv(images), y), list(conv.parameters()))
    torch.nn.functional.cross_entropy(conv(images[rank::world]), y[rank::world]).backward()
    before = [p.grad.data_ptr() for p in conv.parameters()]
    distributed.average_gradients(conv.parameters())
    err = max([err] + [(p.grad - g).abs().max().item() for p, g in zip(conv.parameters(), reference)])
    assert all(p.grad.stride() == p.stride() for p in conv.parameters()), [p.grad.stride() for p in conv.parameters()]
    assert [p.grad.data_ptr() for p in conv.parameters()] == before  # written back in place
    print(f"maxerr {err:.3e}")
    distributed.shutdown()
""")


def test_gradient_averaging_equals_the_global_batch_gradient(tmp_path):
    script = tmp_path / "grad.py"
    script.write_text(GRAD_SCRIPT)
    outs = launch(2, [str(script)], timeout=120)
    for out in outs:
        assert out.returncode == 0, out.stderr
        assert float(out.stdout.split("maxerr")[1]) < 1e-6


@pytest.mark.slow
def test_two_gloo_processes_agree_with_one_process(tmp_path, write_recipe):
    recipe = write_recipe(extra={
        "data": {"max_per_class": 96, "test_per_class": 100, "imb_factor": 4},
        "optim": {"epochs": 4, "batch_size": 32, "lr": 0.05},
    })
    spec = load_recipe(recipe).runs[0]
    results = {}
    for world in (1, 2):
        run_dir = tmp_path / f"world{world}"
        s = {**spec.to_dict(), "run_dir": str(run_dir)}
        run_dir.mkdir()
        (run_dir / "spec.json").write_text(json.dumps(s))
        outs = launch(world, ["-m", "ltbench.runner", str(run_dir / "spec.json")])
        for out in outs:
            assert out.returncode == 0, out.stdout + out.stderr
        results[world] = json.loads((run_dir / store.RESULT).read_text())
        assert results[world]["world_size"] == world
        assert not list(run_dir.glob(".*tmp*"))
    one, two = results[1], results[2]
    # Same data, same augmentations, same global batch and averaged gradients: only BatchNorm batch
    # statistics differ (16 vs 32 samples), so the loss curves stay close and the accuracies agree.
    loss1 = [r["loss"] for r in store.read_jsonl(tmp_path / "world1" / store.LOG)]
    loss2 = [r["loss"] for r in store.read_jsonl(tmp_path / "world2" / store.LOG)]
    assert loss1[0] == pytest.approx(loss2[0], rel=0.05)
    assert abs(one["metrics"]["all"] - two["metrics"]["all"]) <= 0.05, (one["metrics"]["all"], two["metrics"]["all"])
    print("world1", one["metrics"]["all"], loss1, "world2", two["metrics"]["all"], loss2)


def test_a_slurm_task_picks_its_gpu_by_local_rank_not_cuda_visible_devices(monkeypatch):
    """CUDA reads CUDA_VISIBLE_DEVICES once, when it initialises, which may already have happened when a Slurm
    task joins its group: so the environment submitit exports must not set it (the task would silently keep
    every GPU and use GPU 0); the device comes from LOCAL_RANK (``distributed.local_device_index``)."""
    import submitit

    from ltbench.train import distributed

    calls = []

    class Environment:
        def export(self, **kwargs):
            calls.append(kwargs)
            monkeypatch.setenv("WORLD_SIZE", "1")  # one task: no process group to join
            monkeypatch.setenv("LOCAL_RANK", "3")

    monkeypatch.setattr(submitit.helpers, "TorchDistributedEnvironment", Environment)
    for key, value in {"SUBMITIT_EXECUTOR": "slurm", "SLURM_NTASKS": "2"}.items():
        monkeypatch.setenv(key, value)
    for key in ("WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.setenv(key, "")  # so that the teardown restores what was there (or its absence)
        monkeypatch.delenv(key)
    assert distributed.init_from_env() == (0, 1)
    assert calls == [{"set_cuda_visible_devices": False}] and "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.setattr(distributed.torch.cuda, "device_count", lambda: 2)
    assert distributed.local_device_index() == 1  # LOCAL_RANK 3 on a node with 2 GPUs
