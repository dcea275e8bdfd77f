"""The GPU benchmarks' pieces that run without a GPU: the CUDA kernel counter (benchmarks/gpu_codegen.py), the
launch cost model (benchmarks/gpu_launches.py) and the GPU check's report (benchmarks/gpu_report.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_codegen  # noqa: E402
import gpu_launches  # noqa: E402
import gpu_report  # noqa: E402

WRAPPER = '''
async_compile.wait(globals())
class Runner:
    def call(self, args):
        buf0 = extern_kernels.convolution(a, b, stride=(1, 1))
        triton_poi_fused_relu_0.run(buf0, 64, stream=stream0)
        buf1 = empty_strided_cuda((4, ), (1, ), torch.float32)
        torch.ops.aten.sort.stable(buf1)
        buf2, buf3 = aten.topk.default(buf1, 2)
        return (buf0, )
def get_args():
    triton_poi_fused_relu_0.run(x, 1)
'''


def test_the_wrapper_parser_counts_each_kernel_call_of_call_only():
    assert gpu_codegen.launches(WRAPPER) == {"launches": 4, "triton": 1, "library": 1, "aten": 2}


def test_a_conv_bn_block_is_counted_from_its_cuda_code_forward_and_backward():
    """Generated for the pretended GPU: Triton kernels and a cuDNN convolution, in a forward and a backward
    wrapper; nothing ran on a GPU, and torch reports no GPU again afterwards."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    counted = gpu_codegen.count(model, torch.randn(4, 3, 10, 10))
    assert counted.wrappers == 2 and counted.graphs == 1
    assert counted.triton >= 2 and counted.library == 1 and counted.aten == 1  # the convolution and its backward
    assert counted.launches == counted.triton + counted.library + counted.aten
    assert not torch.cuda.is_available()
    with torch.no_grad():
        inference = gpu_codegen.count(model.eval(), torch.randn(4, 3, 10, 10))
    assert inference.wrappers == 1 and inference.launches < counted.launches


def test_the_cost_model_has_no_cap_and_anchors_on_the_eager_bare_loop():
    modes = {"eager": {"launches": 400, "syncs": 0}, "inductor": {"launches": 300, "syncs": 0}}
    bare = {"eager": 350, "inductor": 320}
    p = gpu_launches.predictions(modes, bare, anchor_launches=350, views=1)
    anchor = gpu_launches.BARE_FIXED_MS + gpu_launches.BARE_PER_VIEW_MS
    assert p["eager"]["vs_bare_eager"]["10"] == round(anchor / (anchor + 50 * 0.01), 2)
    assert p["inductor"]["vs_bare_eager"]["10"] > 1  # fewer launches than the eager bare loop: above 1
    assert p["inductor"]["vs_bare_same_mode"]["10"] == round((anchor - 0.3) / (anchor - 0.5), 2)
    slow = gpu_launches.predictions({"eager": {"launches": 350, "syncs": 2}}, bare, 350, 1)
    assert slow["eager"]["vs_bare_eager"]["5"] == round(anchor / (anchor + 0.2), 2)


def test_the_report_names_every_case_and_mode_and_what_did_not_run(tmp_path):
    eager = {"cases": {"bare_1": {"views": 1, "images_per_s": 1000.0, "compile_s": 0.0, "launches_per_step": 300,
                                  "graph_replays_per_step": 0, "host_waits_per_step": 0},
                       "ce": {"views": 1, "images_per_s": 900.0, "bare_images_per_s": 1000.0, "ratio_same_mode": 0.9,
                              "compile_s": 0.0, "launches_per_step": 330, "host_waits_per_step": 0},
                       "ce_micro": {"error": "RuntimeError: boom"}}}
    graphs = {"cases": {"ce_micro": {"refused": True, "passed": True},
                        "eval_check": {"passed": True, "max_abs_difference": 1e-4}}}
    (tmp_path / "cases_eager.json").write_text(json.dumps(eager))
    (tmp_path / "cases_reduce-overhead.json").write_text(json.dumps(graphs))
    assert gpu_report.main([str(tmp_path), "GPU X", "0", "0"]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    by = {(r["case"], r["mode"]): r for r in report["rows"]}
    assert len(by) == 6 * 3
    assert by[("ce", "eager")]["ratio_same_mode"] == 0.9 and by[("ce", "eager")]["ratio_eager_bare"] == 0.9
    assert by[("ce", "inductor")]["status"] == "part not run"
    assert by[("bape_la", "eager")]["status"] == "not run"
    assert by[("ce_micro", "eager")]["status"] == "RuntimeError: boom"
    assert by[("ce_micro", "reduce-overhead")]["status"] == "refused at load"
    assert report["eval_check"]["reduce-overhead"]["passed"] is True and report["eval_check"]["inductor"] is None
    md = (tmp_path / "gpu_check.md").read_text()
    assert md.startswith("GPU X\n") and "| ce | eager | 900 | 0.90 | 0.90 |" in md


@pytest.mark.parametrize("script", ["gpu_cases.py --mode eager --out x.json"])
def test_the_gpu_cases_stop_without_cuda(script, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = subprocess.run([sys.executable, *f"benchmarks/{script}".split()], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "no CUDA device" in out.stderr and not (ROOT / "x.json").exists()


@pytest.mark.slow  # about 30 s of CPU: two processes, ResNet-32 at batch 16
def test_the_gpu_cases_run_on_the_cpu_in_smoke_mode_and_report(tmp_path):
    """The GPU check's case code, run on the CPU at tiny sizes (its figures mean nothing): ltbench's and the bare
    loop's steps, the ratio, the evaluation check, and the refusal of micro-batches under reduce-overhead, then
    the report over both parts."""
    for mode, cases in (("eager", ["ce", "eval_check"]), ("reduce-overhead", ["ce_micro"])):
        out = subprocess.run([sys.executable, "benchmarks/gpu_cases.py", "--smoke", "--mode", mode, "--cases", *cases,
                              "--out", str(tmp_path / f"cases_{mode}.json")], cwd=ROOT, capture_output=True,
                             text=True, timeout=900)
        assert out.returncode == 0, out.stdout + out.stderr
    eager = json.loads((tmp_path / "cases_eager.json").read_text())["cases"]
    assert eager["ce"]["images_per_s"] > 0 and eager["ce"]["bare_images_per_s"] > 0 and "error" not in eager["ce"]
    assert eager["eval_check"]["passed"] and eager["eval_check"]["max_abs_difference"] == 0.0
    graphs = json.loads((tmp_path / "cases_reduce-overhead.json").read_text())["cases"]
    assert graphs["ce_micro"]["refused"] and "micro_batch_size" in graphs["ce_micro"]["message"]
    assert gpu_report.main([str(tmp_path), "smoke", "0", "0"]) == 0
    md = (tmp_path / "gpu_check.md").read_text()
    assert "| ce | eager |" in md and "| ce_micro | reduce-overhead |" in md and "refused at load" in md
