"""benchmarks/gpu_throughput.py --quick runs on the CPU (CI smoke test: its figures mean nothing). Two of its
settings, one epoch each: the multi-view CIFAR-format one and the ImageNet-size JPEG one, so both data
generators, both bare loops and the ltbench side are exercised; the GPU run is in tests/test_gpu.py."""

import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow  # about 10 s of CPU, most of it importing torch and building two runs
def test_quick_mode_prints_a_ratio_per_setting():
    out = subprocess.run([sys.executable, "benchmarks/gpu_throughput.py", "--quick", "--device", "cpu", "--epochs", "1",
                          "--settings", "cifar_bape_la", "imagenet_resnet50"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "device cpu" in out.stdout and "--quick: tiny sizes" in out.stdout
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()
            if line.startswith(("cifar_", "imagenet_"))}
    assert set(rows) == {"cifar_bape_la", "imagenet_resnet50"}
    assert rows["cifar_bape_la"][1:3] == ["resnet32", "3"]  # BAPE+LA: three views through ResNet-32
    for row in rows.values():
        ltbench, bare, ratio = map(float, row[4:7])
        assert ltbench > 0 and bare > 0
        # the printed img/s are rounded to 0.1 and the ratio to 0.01: under load both can be a few img/s,
        # so the ratio is checked against the interval the rounded figures allow, not their quotient
        low, high = (ltbench - 0.05) / (bare + 0.05), (ltbench + 0.05) / max(bare - 0.05, 1e-9)
        assert low - 0.005 <= ratio <= high + 0.005
    assert re.search(r"imagenet_resnet50\s+resnet8\s+1\s+\d+", out.stdout)  # --quick swaps in ResNet-8


def test_cuda_asked_without_cuda_is_refused():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = subprocess.run([sys.executable, "benchmarks/gpu_throughput.py", "--quick", "--device", "cuda"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "torch.cuda.is_available() is False" in out.stderr


def test_the_gpu_check_stops_at_once_without_cuda(tmp_path):
    """benchmarks/gpu_check.sh needs a GPU: without CUDA it says so in one line and exits 2, writing nothing."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = subprocess.run(["bash", "benchmarks/gpu_check.sh", str(tmp_path / "out")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**__import__("os").environ, "PYTHON": sys.executable})
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and "no CUDA device" in out.stderr
    assert not (tmp_path / "out").exists()
    usage = subprocess.run(["bash", "benchmarks/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "usage: benchmarks/gpu_check.sh OUTDIR" in usage.stderr
