"""train.compile: reduce-overhead under CUDA graphs' rules, checked on the CPU.

A CUDA graph's replay writes its outputs into buffers the graph owns, and the next replay of it overwrites them
(torch's cudagraph trees). Evaluation keeps every batch's features until the end of a test set, so each must be
a copy; gradients accumulated over micro-batches would live in the backward graph's buffers, so accumulation is
refused at load. On the CPU Inductor records no graph, so a replaying stand-in plays the graph here: one output
buffer per input shape, overwritten by every call.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ltbench.errors import ConfigError
from ltbench.recipe import resolve_run_config
from ltbench.train import engine
from tests.conftest import TINY


class ReplayedGraph(nn.Module):
    """The backbone as a CUDA graph replays it: the output of a call is the graph's buffer for that shape,
    overwritten by the next call of the same shape."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone, self.buffers_by_shape = backbone, {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.backbone(x)
        buffer = self.buffers_by_shape.setdefault(tuple(x.shape), torch.empty_like(out))
        return buffer.copy_(out)


def tiny_run(compile_setting: str):
    raw = {**TINY, "train": {"progress": False, "threads": 1, "compile": compile_setting}}
    torch.manual_seed(0)
    return engine.build_run(resolve_run_config(raw, seed=0, where="test"))


@pytest.mark.parametrize("features", [engine.test_features, engine.view_features])
def test_evaluation_under_cuda_graphs_keeps_every_batch(features):
    """Features of a test set in batches of 5 (32 images: six full batches and a short one) through the
    replaying stand-in equal the eager backbone's; without the copy every full batch would read the last one."""
    run = tiny_run("reduce-overhead")
    device = torch.device("cpu")
    eager = features(run, device, "test", batch_size=5)
    run.compiled = ReplayedGraph(run.backbone)
    graphed = features(run, device, "test", batch_size=5)
    assert len(run.compiled.buffers_by_shape) == 2  # the stand-in did replay: full batches and the last one
    for a, b in zip(graphed if isinstance(graphed, list) else [graphed], eager if isinstance(eager, list) else [eager]):
        assert len(a) == 32 and torch.equal(a, b)


def test_training_reads_the_compiled_backbone_without_a_copy():
    """The copy is evaluation's: a training step's features feed its own loss and backward before the next
    replay, so under gradients the compiled backbone's output is used as it is."""
    run = tiny_run("reduce-overhead")
    run.compiled = ReplayedGraph(run.backbone)
    x = torch.randn(4, 3, 12, 12)
    assert engine.backbone_features(run, x) is run.compiled.buffers_by_shape[(4, 3, 12, 12)]
    with torch.no_grad():
        assert engine.backbone_features(run, x) is not run.compiled.buffers_by_shape[(4, 3, 12, 12)]


def test_micro_batches_under_cuda_graphs_are_refused_at_load():
    raw = {**TINY, "train": {"progress": False, "compile": "reduce-overhead"},
           "optim": {**TINY["optim"], "micro_batch_size": 8}}
    with pytest.raises(ConfigError, match=r"test.optim.micro_batch_size: 8 accumulates gradients over CUDA-graph "
                                          r"replays.*use train.compile: inductor"):
        resolve_run_config(raw, seed=0, where="test")
    for allowed in ({"compile": "inductor", "micro_batch_size": 8}, {"compile": "reduce-overhead", "micro_batch_size": 16}):
        raw = {**TINY, "train": {"progress": False, "compile": allowed["compile"]},
               "optim": {**TINY["optim"], "micro_batch_size": allowed["micro_batch_size"]}}
        resolve_run_config(raw, seed=0, where="test")


def test_the_refusal_is_one_line_and_exit_2_before_any_run(tmp_path, write_recipe, cli):
    recipe = write_recipe(extra={"train": {"progress": False, "compile": "reduce-overhead"},
                                 "optim": {**TINY["optim"], "micro_batch_size": 8}})
    out = cli("run", recipe)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "optim.micro_batch_size: 8 accumulates gradients over CUDA-graph replays" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the GPU check runs it)")
def test_evaluation_through_real_cuda_graphs_agrees_with_the_eager_backbone():
    """On CUDA, with the graphs recorded and replayed: 32 test images in batches of 5 through the compiled
    backbone agree with the eager backbone, and no two full batches are the same buffer's contents."""
    run, device = tiny_run("reduce-overhead"), torch.device("cuda")
    benchmark = torch.backends.cudnn.benchmark
    try:
        engine.prepare_for_device(run, device)
        graphed = engine.test_features(run, device, "test", batch_size=5)
        run.compiled = None
        eager = engine.test_features(run, device, "test", batch_size=5)
    finally:
        torch.backends.cudnn.benchmark = benchmark
    torch.testing.assert_close(graphed, eager, rtol=1e-3, atol=1e-3)
    assert not torch.equal(graphed[:5], graphed[5:10])
