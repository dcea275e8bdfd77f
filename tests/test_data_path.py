"""The data path: one persistent worker pool for training and evaluation, and the speed options
(channels_last, fp16 with a loss scaler, torch.compile) giving the same results as the plain path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from ltbench.results import store
from ltbench.data.base import MultiView
from ltbench.train.engine import Loader, SeededSamples


class WhoLoads(torch.utils.data.Dataset):
    """Item i = (the loading process id, i): shows which process built a sample."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.tensor([os.getpid(), i]), i


def _pids(loader, keys) -> set[int]:
    return {int(p) for views, _ in loader.run(keys) for p in views[0][:, 0]}


def test_workers_persist_across_epochs_and_serve_evaluation_too():
    sources = {"train": MultiView(WhoLoads(), [lambda x: x]), "test": MultiView(WhoLoads(), [lambda x: x])}
    samples = SeededSamples(sources, seed=0)
    loader = Loader(samples, workers=2)
    batches = [np.arange(0, 5), np.arange(5, 10)]
    first = _pids(loader, samples.train_keys(batches, 0, epoch=0))
    second = _pids(loader, samples.train_keys(batches, 0, epoch=1))
    evaluation = _pids(loader, samples.eval_keys("test", 4))
    assert os.getpid() not in first and len(first) == 2
    assert second == first and evaluation <= first  # the same processes, not new ones
    labels = [int(y) for _, ys in loader.run(samples.eval_keys("test", 4)) for y in ys]
    assert labels == list(range(10))  # every test item once, in order
    resumed = [int(y) for _, ys in loader.run(samples.train_keys(batches, 1, epoch=2)) for y in ys]
    assert resumed == list(range(5, 10))  # a pass can start mid-epoch (resume)
    loader.close()


def test_a_sample_is_the_same_whichever_process_builds_it():
    from ltbench.data import transforms
    from ltbench.data.synthetic import SyntheticLT, SyntheticLTConfig

    data = SyntheticLT(SyntheticLTConfig(num_classes=3, max_per_class=12)).load()
    views = [transforms.build(v, data.image, data.pipelines) for v in ("default", "strong", "sim")]
    samples = SeededSamples({"train": MultiView(data.train, views)}, seed=3)
    batches = [np.arange(len(data.train))]
    inline = next(Loader(samples, 0).run(samples.train_keys(batches, 0, epoch=1)))[0]
    pooled = next(Loader(samples, 2).run(samples.train_keys(batches, 0, epoch=1)))[0]
    other_epoch = next(Loader(samples, 0).run(samples.train_keys(batches, 0, epoch=2)))[0]
    assert all(torch.equal(a, b) for a, b in zip(inline, pooled))
    assert not torch.equal(inline[1], other_epoch[1])


def _run(tmp_path: Path, write_recipe, name: str, train: dict, extra: dict | None = None) -> tuple[dict, list]:
    from ltbench.run.local_pool import run_local
    from ltbench.recipe import load_recipe

    recipe = write_recipe(name, extra={"train": {"progress": False, **train}, **(extra or {}),
                                       "results_dir": str(tmp_path / name)})
    spec = load_recipe(recipe).runs[0]
    run_local([spec])
    result = json.loads((Path(spec.run_dir) / store.RESULT).read_text())
    assert result["status"] == "done", result.get("error")
    return result, store.read_jsonl(Path(spec.run_dir) / store.LOG)


SHIFTED = {"method": {"name": "la"}, "eval": {"target_priors": ["forward5"], "test_sets": ["forward5", "backward5"]},
           "data": {"max_per_class": 40}}


def test_training_and_evaluation_with_workers_equal_the_inline_path(tmp_path, write_recipe):
    plain, plain_log = _run(tmp_path, write_recipe, "inline", {"num_workers": 0, "eval_every": 1}, SHIFTED)
    pooled, pooled_log = _run(tmp_path, write_recipe, "pooled", {"num_workers": 2, "eval_every": 1}, SHIFTED)
    assert [r["loss"] for r in pooled_log] == [r["loss"] for r in plain_log]
    assert [r.get("test") for r in pooled_log] == [r.get("test") for r in plain_log]  # eval_every, via the workers
    assert "test" in pooled_log[0]
    assert pooled["metrics"] == plain["metrics"]  # main test set, heads, target priors and shifted test sets
    assert set(pooled["metrics"]["test_sets"]) == {"forward5", "backward5"}


def test_channels_last_gives_the_same_metrics_up_to_float_rounding(tmp_path, write_recipe):
    plain, plain_log = _run(tmp_path, write_recipe, "nchw", {})
    nhwc, nhwc_log = _run(tmp_path, write_recipe, "nhwc", {"channels_last": True})
    assert nhwc["config"]["train"]["channels_last"] is True
    assert nhwc["run_id"] == plain["run_id"]  # an execution choice, like threads: not part of the run id
    assert [r["loss"] for r in nhwc_log] == pytest.approx([r["loss"] for r in plain_log], rel=1e-4)
    n_test = sum(nhwc["data"]["class_counts_test"])
    assert nhwc["metrics"]["all"] == pytest.approx(plain["metrics"]["all"], abs=1.5 / n_test)


def test_fp16_trains_with_a_loss_scaler_and_keeps_its_state_in_the_checkpoint(tmp_path, write_recipe):
    result, log = _run(tmp_path, write_recipe, "fp16", {"precision": "fp16"})
    assert all(np.isfinite(r["loss"]) for r in log)
    state = torch.load(next((tmp_path / "fp16").rglob(store.CHECKPOINT)), weights_only=True)
    assert state["scaler"]["scale"] > 0


@pytest.mark.slow
def test_compiled_backbone_trains_and_matches_eager(tmp_path, write_recipe):
    plain, plain_log = _run(tmp_path, write_recipe, "eager", {})
    compiled, compiled_log = _run(tmp_path, write_recipe, "compiled", {"compile": "aot_eager"})
    assert [r["loss"] for r in compiled_log] == pytest.approx([r["loss"] for r in plain_log], rel=1e-4)
