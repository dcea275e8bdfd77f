"""The CUDA path. Every test here is marked ``gpu`` and skips without CUDA; on a GPU machine

    .venv/bin/python -m pytest -q -m gpu

gives the verdict: a CUDA training run, pinned non-blocking batches, resume after kill -9, bf16, fp16 with its
GradScaler, channels_last and torch.compile, torchrun + NCCL at world size 1 (and 2 with two GPUs), JPEG
decoding with nvJPEG, each batched augmentation pipeline on the GPU, and the GPU benchmark's quick mode.
Set LTBENCH_REQUIRE_GPU=1 to make a missing GPU a failure instead of a skip (for a GPU CI job).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ltbench.results import store
from tests.conftest import ROOT

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA and os.environ.get("LTBENCH_REQUIRE_GPU") == "1":
    raise RuntimeError("LTBENCH_REQUIRE_GPU=1 but torch.cuda.is_available() is False: no usable CUDA device")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (run `pytest -m gpu` on a GPU machine)")]

@pytest.fixture(autouse=True)
def cudnn_benchmark_restored():
    """engine.prepare_for_device sets torch.backends.cudnn.benchmark for the whole process (train.cudnn_benchmark,
    default on); a test here that prepares a run in-process must not leave it on for the tests after it, whose
    kernels would then be chosen by timing (not reproducible)."""
    saved = torch.backends.cudnn.benchmark
    yield
    torch.backends.cudnn.benchmark = saved


# Long enough to kill mid-run and to see the loss scale move; ResNet-8 on 12x12 images takes seconds on a GPU.
CUDA_RUN = {"data": {"max_per_class": 200, "test_per_class": 20}, "optim": {"epochs": 4, "batch_size": 16},
            "train": {"cudnn_benchmark": False}}


def only_result(results: Path) -> dict:
    files = list(results.rglob(store.RESULT))
    assert len(files) == 1, files
    result = json.loads(files[0].read_text())
    assert result["status"] == "done", result.get("error")
    return result


def run_recipe(write_recipe, cli, tmp_path, name: str, extra: dict) -> tuple[dict, Path]:
    recipe = write_recipe(name, extra={**CUDA_RUN, **extra, "train": {**CUDA_RUN["train"], **extra.get("train", {})}})
    out = cli("run", recipe, "--results", tmp_path / name)
    assert out.returncode == 0, out.stdout + out.stderr
    result = only_result(tmp_path / name)
    return result, next((tmp_path / name).rglob(store.RESULT)).parent


def test_a_training_run_uses_the_gpu(tmp_path, write_recipe, cli):
    result, run_dir = run_recipe(write_recipe, cli, tmp_path, "fp32", {})
    assert result["device"].startswith("cuda"), result["device"]
    assert result["provenance"]["gpu_name"], result["provenance"]
    assert 0 <= result["metrics"]["all"] <= 1
    assert len(store.read_jsonl(run_dir / store.LOG)) == 4


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_arrive_pinned_and_views_train_on_the_gpu(write_recipe, workers):
    from ltbench.train import engine
    from ltbench.recipe import load_recipe

    run = engine.build_run(load_recipe(write_recipe()).runs[0].config)
    device = torch.device("cuda")
    engine.prepare_for_device(run, device)
    loader = engine.make_loader(run, 0, workers, device)
    batches = engine.epoch_batches(len(run.data.train), 8, 0, 0)
    for views, labels in loader.run(loader.samples.train_keys(batches, 0, 0)):
        assert views[0].is_pinned() and labels.is_pinned()  # so .to(device, non_blocking=True) is asynchronous
        on_gpu = views[0].to(device, non_blocking=True)
        assert on_gpu.is_cuda and torch.isfinite(run.backbone(on_gpu)).all()
    loader.close()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_on_the_gpu(tmp_path, write_recipe, cli, precision):
    result, run_dir = run_recipe(write_recipe, cli, tmp_path, precision, {"train": {"precision": precision}})
    assert result["device"].startswith("cuda")
    losses = [row["loss"] for row in store.read_jsonl(run_dir / store.LOG)]
    assert all(l == l and l < 1e3 for l in losses), losses  # finite (NaN != NaN)
    state = torch.load(run_dir / store.CHECKPOINT, map_location="cpu", weights_only=True)
    if precision == "fp16":  # the GradScaler ran and its scale is checkpointed for exact resume
        assert "scaler" in state and 0 < state["scaler"]["scale"] < float("inf")
    else:
        assert "scaler" not in state  # bf16 needs no loss scaling


@pytest.mark.parametrize("compile_backend", ["off", "inductor"])
def test_channels_last_and_compile_on_the_gpu(tmp_path, write_recipe, cli, compile_backend):
    result, _ = run_recipe(write_recipe, cli, tmp_path, f"cl-{compile_backend}",
                           {"train": {"channels_last": True, "compile": compile_backend, "precision": "bf16"}})
    assert result["device"].startswith("cuda") and 0 <= result["metrics"]["all"] <= 1


def test_a_killed_gpu_run_resumes_from_its_checkpoint(tmp_path, write_recipe, cli):
    """kill -9 during epoch 3, then run again: it resumes from the last checkpoint and ends with all six epochs
    logged once. On a GPU, kernels are not bit-reproducible, so losses are compared to an uninterrupted run
    within a tolerance (exact on CPU: tests/test_engine.py). Epochs of about a second (4,400 images, the
    per-image augmentation on the CPU) leave time to kill the run mid-way."""
    extra = {**CUDA_RUN, "data": {"max_per_class": 2000, "test_per_class": 20}, "optim": {"epochs": 6, "batch_size": 16}}
    recipe = write_recipe("kill", extra=extra)
    reference = cli("run", recipe, "--results", tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr
    expected = only_result(tmp_path / "reference")
    results = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "ltbench", "run", str(recipe), "--results", str(results)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline, logs = time.time() + 300, []
    while time.time() < deadline and proc.poll() is None:
        logs = list(results.rglob(store.LOG))
        if logs and len(store.read_jsonl(logs[0])) >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed; make CUDA_RUN longer"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    run_dir = logs[0].parent
    assert (run_dir / store.CHECKPOINT).exists() and not (run_dir / store.RESULT).exists()
    resumed = cli("run", recipe, "--results", results)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming from checkpoint: epoch" in resumed.stdout
    got = only_result(results)
    log = store.read_jsonl(run_dir / store.LOG)
    assert [row["epoch"] for row in log] == [1, 2, 3, 4, 5, 6]
    ref_log = store.read_jsonl(next((tmp_path / "reference").rglob(store.LOG)))
    assert [r["loss"] for r in log] == pytest.approx([r["loss"] for r in ref_log], rel=0.05)
    assert abs(got["metrics"]["all"] - expected["metrics"]["all"]) <= 0.1


NCCL_SCRIPT = """
import torch, torch.distributed as dist
from ltbench.train import distributed
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(rank % torch.cuda.device_count())
model = torch.nn.Linear(4, 3).cuda()
model(torch.full((2, 4), float(rank + 1), device="cuda")).sum().backward()
expected = sum(2.0 * (r + 1) for r in range(world)) / world  # d/dW of sum(W x): 2 rows of x = r + 1
distributed.average_gradients(model.parameters())
assert torch.allclose(model.weight.grad, torch.full_like(model.weight.grad, expected)), model.weight.grad
assert distributed.all_reduce_sum([1.0, float(rank)]) == [float(world), float(sum(range(world)))]
distributed.barrier()
print("nccl ok", rank, world)
distributed.shutdown()
"""


def torchrun(nproc: int, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *argv]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("world", [1, pytest.param(2, marks=pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs two GPUs"))])
def test_torchrun_nccl_collectives(tmp_path, world):
    script = tmp_path / "nccl.py"
    script.write_text(NCCL_SCRIPT)
    out = torchrun(world, str(script))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("nccl ok") == world


def test_torchrun_trains_a_run_on_the_gpu(tmp_path, write_recipe):
    from ltbench.recipe import load_recipe

    spec = load_recipe(write_recipe(extra=CUDA_RUN)).runs[0]
    run_dir = tmp_path / "torchrun"
    run_dir.mkdir()
    (run_dir / store.SPEC).write_text(json.dumps({**spec.to_dict(), "run_dir": str(run_dir)}))
    out = torchrun(1, "-m", "ltbench.runner", str(run_dir / store.SPEC))
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads((run_dir / store.RESULT).read_text())
    assert result["status"] == "done" and result["world_size"] == 1 and result["device"].startswith("cuda")


def test_nvjpeg_decodes_like_the_cpu(tmp_path):
    import numpy as np

    from ltbench.data.device_decode import decode_batch, decode_cpu
    from scripts.imagenet_tree import random_jpeg

    rng = np.random.default_rng(0)
    encoded = [random_jpeg(rng, scale=0.5) for _ in range(6)]
    device = torch.device("cuda")
    decoded = decode_batch(encoded, device)
    for data, image in zip(encoded, decoded):
        reference = decode_cpu(data)
        assert image.is_cuda and image.shape == reference.shape and image.dtype == torch.uint8
        assert (image.cpu().float() - reference.float()).abs().mean() < 2.0  # IDCTs differ by a grey level at most


@pytest.mark.parametrize("augment_on", ["worker", "batch"])
def test_gpu_benchmark_quick_mode_runs_on_the_gpu(augment_on):
    """Both augmentation paths: ``batch`` (views built on the GPU) is the one made for GPUs."""
    out = subprocess.run([sys.executable, "benchmarks/gpu_throughput.py", "--quick", "--device", "cuda",
                          "--augment-on", augment_on], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ratio" in out.stdout and "cuda" in out.stdout and f"augment_on {augment_on}" in out.stdout


def test_each_batched_pipeline_on_cuda_agrees_with_the_cpu():
    """Every batched pipeline (train.augment_on: batch) on the GPU gives the CPU's views exactly: the same
    per-sample draws (counter-based, device-independent) and ops made of single IEEE operations, integer
    arithmetic and float64 sums that are exact (ltbench/data/batch_ops.py), no cuDNN/cuBLAS (TF32) kernel.
    The one float function that is not correctly rounded everywhere is exp in the resized-crop's aspect:
    a box could differ only if sqrt(area * aspect) fell within ~1e-15 of a half-integer."""
    from ltbench.data.base import ImageSpec
    from ltbench.data.batch_augment import BATCH_PIPELINES

    small = ImageSpec(32, 3, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    large = ImageSpec(224, 3, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), kind="large")
    gen = torch.Generator().manual_seed(0)
    cifar = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, generator=gen)
    files = [torch.randint(0, 256, (3, 300 + 7 * i, 400 - 5 * i), dtype=torch.uint8, generator=gen) for i in range(8)]
    seeds = torch.arange(1000, 1064, dtype=torch.int64)
    for name, build in ((e.name, e.obj) for e in BATCH_PIPELINES.entries()):
        for spec, images in ((small, cifar), (large, files)):
            pipeline = build(spec)
            n = len(images)
            on_cpu = pipeline(images, seeds[:n], view=1)
            on_gpu = pipeline(images.cuda() if isinstance(images, torch.Tensor) else [im.cuda() for im in images],
                              seeds[:n].cuda(), view=1)
            assert on_gpu.is_cuda and on_gpu.shape == on_cpu.shape == (n, 3, spec.size, spec.size), name
            assert torch.equal(on_gpu.cpu(), on_cpu), (name, spec.kind, float((on_gpu.cpu() - on_cpu).abs().max()))


@pytest.mark.parametrize("data", ["small", "jpeg"])
def test_a_batched_augmentation_run_on_the_gpu(tmp_path, write_recipe, cli, data):
    """train.augment_on: batch on CUDA end to end: BAPE+LA's three views built on the GPU; with ImageNet-size
    JPEGs the workers read bytes and nvJPEG decodes them (ltbench/data/device_decode.py)."""
    extra = {"method": {"name": "bape", "aux": {"name": "la", "tau": 1.0}, "aux_views": ["strong"],
                        "bape_views": ["sim", "sim"]},
             "train": {"augment_on": "batch", "num_workers": 2, "precision": "bf16", "channels_last": True}}
    if data == "jpeg":
        from scripts.imagenet_tree import TreeSpec, write_tree

        write_tree(tmp_path / "inet", TreeSpec(num_classes=5, train_images=40, val_per_class=0, test_per_class=2),
                   say=lambda msg: None)
        extra["data"] = {"name": "imagenet_lt", "root": str(tmp_path / "inet"), "num_classes": 5}
        extra["optim"] = {"epochs": 2, "batch_size": 8}
    result, run_dir = run_recipe(write_recipe, cli, tmp_path, f"batch-{data}", extra)
    assert result["device"].startswith("cuda") and result["config"]["train"]["augment_on"] == "batch"
    assert len(result["views"]) == 3
