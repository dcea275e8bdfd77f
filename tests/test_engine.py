"""The training loop: schedule, determinism, resume after a kill, bad checkpoints, NaN, skipping."""

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
from ltbench.config import OptimConfig
from ltbench.train.engine import epoch_batches, lr_factor
from tests.conftest import ROOT


def test_lr_schedule_warmup_then_cosine_and_step():
    o = OptimConfig(lr=1.0, epochs=10, warmup_epochs=2, schedule="cosine")
    f = [lr_factor(o, i, 10) for i in range(100)]
    assert f[0] == pytest.approx(0.05) and f[19] == pytest.approx(1.0)
    assert f[20] == pytest.approx(1.0) and f[-1] < 0.01
    assert all(a >= b for a, b in zip(f[20:], f[21:]))
    s = OptimConfig(lr=1.0, epochs=200, warmup_epochs=5, schedule="step", milestones=[160, 180], gamma=0.01)
    assert lr_factor(s, 159 * 10, 10) == 1.0
    assert lr_factor(s, 160 * 10, 10) == pytest.approx(0.01)
    assert lr_factor(s, 180 * 10, 10) == pytest.approx(1e-4)


def test_epoch_order_depends_on_seed_and_epoch_only():
    a = epoch_batches(50, 16, seed=0, epoch=3)
    assert [b.tolist() for b in a] == [b.tolist() for b in epoch_batches(50, 16, seed=0, epoch=3)]
    assert a[0].tolist() != epoch_batches(50, 16, seed=0, epoch=4)[0].tolist()
    assert sorted(x for b in a for x in b) == list(range(50))
    assert [len(b) for b in epoch_batches(33, 16, 0, 0)] == [16, 16]  # a last batch of one is dropped


def _only_result(results: Path) -> dict:
    files = list(results.rglob(store.RESULT))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


LONGER = {"data": {"max_per_class": 120}, "optim": {"epochs": 4, "batch_size": 8}}


@pytest.mark.slow
def test_killed_run_resumes_and_matches_an_uninterrupted_run(tmp_path, write_recipe, cli):
    """The kill lands inside epoch 3 by an event, not a timing: the method pauses there (LTBENCH_TEST_PAUSE,
    CRASH_PLUGIN) after touching a file the test waits for, so a loaded machine changes nothing."""
    (tmp_path / "crash_plugins").mkdir()
    (tmp_path / "crash_plugins" / "crash.py").write_text(CRASH_PLUGIN)
    recipe = write_recipe(extra={**LONGER, "plugins": ["./crash_plugins"], "method": {"name": "ce_crash_once"}})
    reference = cli("run", recipe, "--results", tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr
    expected = _only_result(tmp_path / "reference")

    results, paused = tmp_path / "killed", tmp_path / "paused-in-epoch-3"
    proc = subprocess.Popen([sys.executable, "-m", "ltbench", "run", str(recipe), "--results", str(results)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "LTBENCH_TEST_PAUSE": str(paused)})
    try:
        deadline = time.monotonic() + 600  # generous: only a run that never gets there waits this long
        while not paused.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert paused.exists() and proc.poll() is None, "the run never reached its pause in epoch 3"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    (run_dir,) = {p.parent for p in results.rglob(store.LOG)}
    assert not (run_dir / store.RESULT).exists()
    assert (run_dir / store.CHECKPOINT).exists() and len(store.read_jsonl(run_dir / store.LOG)) == 2
    kept = torch.load(run_dir / store.CHECKPOINT, weights_only=True)["seconds"]  # the killed session's cost so far

    status = cli("status", results / "tiny")
    assert "interrupted" in status.stdout and "run again to resume" in status.stdout  # its process is gone

    resumed = cli("run", recipe, "--results", results)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from checkpoint: epoch 2, step 0" in resumed.stdout
    got = _only_result(results)
    assert got["device_seconds"] > kept and got["device_seconds"] > got["train_seconds_this_session"]  # both sessions
    assert got["metrics"]["per_class"] == expected["metrics"]["per_class"]
    assert got["metrics"]["all"] == expected["metrics"]["all"]
    log = store.read_jsonl(run_dir / store.LOG)
    assert [row["epoch"] for row in log] == list(range(1, 5))
    ref_log = store.read_jsonl(next((tmp_path / "reference").rglob(store.LOG)))
    assert [r["loss"] for r in log] == [r["loss"] for r in ref_log]


def test_corrupt_checkpoint_starts_the_run_over(tmp_path, write_recipe, cli):
    recipe = write_recipe()
    from ltbench.recipe import load_recipe

    spec = load_recipe(recipe).runs[0]
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / store.CHECKPOINT).write_bytes(b"PK\x03\x04 truncated zip")
    out = cli("run", recipe)
    assert out.returncode == 0, out.stderr
    assert "is unusable" in out.stdout and "starting this run over" in out.stdout
    assert _only_result(tmp_path / "results")["status"] == "done"


NAN_PLUGIN = '''
from dataclasses import dataclass
import torch
import torch.nn as nn
from ltbench.method import Method
from ltbench.registry import METHODS

@METHODS.register("nan_loss")
class NanLoss(Method):
    """Finite until epoch 2, step 2 (counted from 1); NaN from there on."""

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)

    def on_epoch_start(self, epoch):
        self.epoch, self.step = epoch, 0

    def loss(self, features, labels, *, epoch):
        self.step += 1
        scale = float("nan") if (self.epoch, self.step) >= (1, 2) else 1e-3
        return {"loss": self.head(features[0]).sum() * scale}

    def predict(self, features, *, target_prior=None):
        return self.head(features)
'''


def test_nan_loss_fails_that_run_and_the_grid_goes_on(tmp_path, write_recipe, cli):
    """The loss is read from the device only now and then (train.log_every, before a checkpoint, at the epoch
    end: ltbench/train/meters.py), yet the message names the step where it went non-finite, and no checkpoint
    holds an update made from it (one is due after every step here)."""
    (tmp_path / "nan_plugins").mkdir()
    (tmp_path / "nan_plugins" / "nan_method.py").write_text(NAN_PLUGIN)
    grid = {"method": [{"name": "nan_loss"}, {"name": "ce"}]}
    recipe = write_recipe(extra={"plugins": ["./nan_plugins"], "grid": grid,
                                 "train": {"checkpoint_minutes": 1.0e-9, "log_every": 1000}})
    out = cli("run", recipe)
    assert out.returncode == 1
    results = sorted((json.loads(p.read_text()) for p in (tmp_path / "results").rglob(store.RESULT)),
                     key=lambda r: r["config"]["method"]["name"])
    assert [r["status"] for r in results] == ["done", "failed"]
    assert "non-finite loss (nan) at epoch 2, step 2 " in results[1]["error"]
    assert results[1]["error_type"] == "NonFiniteLossError"
    run_dir = next(p.parent for p in (tmp_path / "results").rglob(store.RESULT) if "nan_loss" in p.read_text())
    import torch

    state = torch.load(run_dir / store.CHECKPOINT, map_location="cpu", weights_only=True)
    assert (state["epoch"], state["step"]) == (1, 1)  # after epoch 2's first step, the last healthy one
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
    assert [row["epoch"] for row in store.read_jsonl(run_dir / store.LOG)] == [1]
    status = cli("status", tmp_path / "results" / "tiny")
    assert "failed" in status.stdout and "non-finite loss" in status.stdout
    # Relaunching skips both: the finished one and the failed one (unless asked).
    again = cli("run", recipe)
    assert "0 to run, 2 already finished" in again.stdout


def test_finished_runs_are_skipped(tmp_path, write_recipe, cli):
    recipe = write_recipe()
    first = cli("run", recipe)
    assert first.returncode == 0, first.stderr
    assert "| CE " in first.stdout and "Many" in first.stdout  # ce's display name
    mtime = next((tmp_path / "results").rglob(store.RESULT)).stat().st_mtime
    second = cli("run", recipe)
    assert "0 to run, 1 already finished" in second.stdout
    assert next((tmp_path / "results").rglob(store.RESULT)).stat().st_mtime == mtime


def test_result_is_self_describing(tmp_path, write_recipe):
    from ltbench.run.local_pool import run_local
    from ltbench.recipe import load_recipe

    spec = load_recipe(write_recipe()).runs[0]
    run_local([spec])
    r = _only_result(tmp_path / "results")
    assert r["status"] == "done" and r["run_id"] == spec.run_id
    for key in ("ltbench_version", "git_commit", "git_dirty", "python", "torch", "torchvision", "hostname", "cpu_model"):
        assert key in r["provenance"]
    assert r["data"]["class_counts_train"] == [24, 13, 7, 4]
    assert len(r["data"]["subset_hash"]) == 40
    assert len(r["metrics"]["per_class"]) == 4
    assert r["wall_seconds"] > 0 and r["seed"] == 0
    run_dir = Path(spec.run_dir)
    for name in (store.SPEC, store.CONFIG, store.LOG, store.CHECKPOINT):
        assert (run_dir / name).exists(), name
    assert not list(run_dir.glob(".*tmp*"))


def test_unwritable_results_directory_is_one_clear_line(tmp_path, write_recipe, cli):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the results directory should be")
    out = cli("run", write_recipe(), "--results", blocker / "sub")
    assert out.returncode == 2
    assert "not writable" in out.stderr and "--results" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_missing_dataset_says_which_files_and_how(tmp_path, write_recipe, cli):
    recipe = write_recipe(extra={"data": {"name": "fashion_mnist_lt", "root": str(tmp_path / "nowhere")}})
    out = cli("run", recipe)
    assert out.returncode == 2
    assert "train-images-idx3-ubyte" in out.stderr and "apt-get install dataset-fashion-mnist" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not list((tmp_path / "results").rglob(store.RESULT))
    assert not (tmp_path / "results" / "tiny").exists()  # no empty results/<recipe>/ left behind


def test_bf16_autocast_trains(tmp_path, write_recipe):
    from ltbench.run.local_pool import run_local
    from ltbench.recipe import load_recipe

    spec = load_recipe(write_recipe(extra={"train": {"precision": "bf16", "eval_every": 1}})).runs[0]
    run_local([spec])
    r = _only_result(tmp_path / "results")
    assert r["status"] == "done", r.get("error")
    assert r["config"]["train"]["precision"] == "bf16"
    assert r["selection"]["strategy"] == "last" and r["selection"]["oracle_best_on_test"]["epoch"] in (1, 2)


def test_data_command_prints_counts_and_groups(write_recipe, cli):
    out = cli("data", write_recipe(extra={"data": {"num_classes": 4, "max_per_class": 200, "imb_factor": 20}}),
              "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)[0]
    assert [c["train"] for c in report["classes"]] == [200, 73, 27, 10]
    assert [c["group"] for c in report["classes"]] == ["many", "medium", "medium", "few"]
    assert report["groups"] == {"many": 1, "medium": 2, "few": 1}
    text = cli("data", write_recipe())
    assert "groups: many 0, medium 1, few 3" in text.stdout and "class" in text.stdout


def test_shifted_test_protocol_records_target_priors_and_test_sets(tmp_path, write_recipe):
    from ltbench.data.shift import shifted_counts
    from ltbench.run.local_pool import run_local
    from ltbench.recipe import load_recipe

    spec = load_recipe(write_recipe(extra={"method": {"name": "la"}, "eval": {
        "target_priors": ["forward5", "uniform", "backward5"], "test_sets": ["forward5", "backward5"]}})).runs[0]
    run_local([spec])
    m = _only_result(tmp_path / "results")["metrics"]
    assert set(m["target_priors"]) == {"forward5", "uniform", "backward5"}
    assert m["target_priors"]["uniform"]["all"] == pytest.approx(m["all"])
    assert m["test_sets"]["forward5"]["size"] == sum(shifted_counts(4, 8, 5, "forward"))
    assert m["test_sets"]["backward5"]["size"] == sum(shifted_counts(4, 8, 5, "backward"))
    import numpy

    from ltbench.results.predictions import load_predictions

    saved = load_predictions(next((tmp_path / "results").rglob(store.RESULT)).parent)
    for name, direction in (("forward5", "forward"), ("backward5", "backward")):
        labels, pred = saved[f"set:{name}:labels"], saved[f"set:{name}:head:main"]
        # the set holds the shifted counts per class (SADE's protocol: by label), and its accuracy is
        # the one of the predictions saved for it, not of the full test split
        assert numpy.bincount(labels, minlength=4).tolist() == shifted_counts(4, 8, 5, direction)
        assert m["test_sets"][name]["all"] == float((pred == labels).mean())


CRASH_PLUGIN = '''
import os
import signal
import time
import torch.nn as nn
import torch.nn.functional as F
from ltbench.method import Method
from ltbench.registry import METHODS

@METHODS.register("ce_crash_once")
class CECrashOnce(Method):
    """Cross-entropy that kills its process at epoch 2, step 3 while LTBENCH_TEST_CRASH is set, and waits to be
    killed at epoch 3, step 2 while LTBENCH_TEST_PAUSE names a file (touched first, for the test to see)."""

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)
        self.steps = 0

    def on_epoch_start(self, epoch):
        self.epoch, self.steps = epoch, 0

    def loss(self, features, labels, *, epoch):
        self.steps += 1
        if os.environ.get("LTBENCH_TEST_CRASH") and epoch == 1 and self.steps == 4:
            os.kill(os.getpid(), signal.SIGKILL)  # like a node failure: no cleanup, no result (a plugin's os._exit now only fails its run)
        if os.environ.get("LTBENCH_TEST_PAUSE") and epoch == 2 and self.steps == 2:
            open(os.environ["LTBENCH_TEST_PAUSE"], "w").close()
            time.sleep(3600)  # until the test kills the process
        logits = self.head(features[0])
        return {"loss": F.cross_entropy(logits, labels), "logits": logits.detach()}

    def predict(self, features, *, target_prior=None):
        return self.head(features)
'''


def crash_mid_epoch_then_resume(tmp_path: Path, write_recipe, cli, **extra) -> tuple[dict, dict]:
    """Train a tiny recipe once uninterrupted (the reference), then again with a crash after the third step
    of epoch 1 (a checkpoint after every step) and a relaunch; returns (resumed result, reference result).
    ``extra``: recipe sections merged over the tiny CE-with-a-crash recipe (a sampler, train settings)."""
    (tmp_path / "crash_plugins").mkdir()
    (tmp_path / "crash_plugins" / "crash.py").write_text(CRASH_PLUGIN)
    train = {"checkpoint_minutes": 1.0e-9, **extra.pop("train", {})}  # a checkpoint after every step
    recipe = write_recipe(extra={"plugins": ["./crash_plugins"], "method": {"name": "ce_crash_once"},
                                 "data": {"max_per_class": 60}, "optim": {"epochs": 3, "batch_size": 8},
                                 "train": train, **extra})
    reference = cli("run", recipe, "--results", tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr
    crashed = cli("run", recipe, env={"LTBENCH_TEST_CRASH": "1"})
    assert crashed.returncode == -signal.SIGKILL
    resumed = cli("run", recipe)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from checkpoint: epoch 1, step 3" in resumed.stdout
    return _only_result(tmp_path / "results"), _only_result(tmp_path / "reference")


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_timed_checkpoint_resumes_mid_epoch_exactly(tmp_path, write_recipe, cli, workers):
    got, expected = crash_mid_epoch_then_resume(tmp_path, write_recipe, cli,
                                                train={"num_workers": workers})  # prefetched batches are not lost
    assert got["metrics"]["per_class"] == expected["metrics"]["per_class"]


def test_epoch_meter_sums_on_the_device_and_names_the_first_non_finite_step():
    """What train_epoch reads every train.log_every steps: the same per-image sums the host used to add up
    (bit for bit: float64, value * n, in step order), extras that come and go, host extras, and the first
    non-finite loss with its step (counted from the epoch's first step, here 5: a resumed epoch)."""
    import torch

    from ltbench.train.meters import EpochMeter

    meter = EpochMeter("cpu", steps=2, first_step=5)  # fewer slots than steps: it grows
    losses = [0.5, 0.25, float("nan"), float("inf"), 1.0]
    labels = torch.tensor([0, 1, 1])
    expected_loss = expected_extra = 0.0
    for i, value in enumerate(losses):
        loss = torch.tensor(value, dtype=torch.float32)
        out = {"loss": loss, "logits": torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]),
               "on_host": torch.tensor(2.0)}
        if i % 2:
            out["odd"] = torch.tensor(0.1 * i, dtype=torch.float32)
            expected_extra += float(out["odd"]) * 3
        meter.add(out, loss, labels)
        expected_loss += float(loss) * 3
        if i == 1:
            assert meter.read() is None and meter.sums == {"loss": 2.25, "correct": 4, "seen": 6}
    step, value = meter.read()
    assert step == 7 and value != value  # the NaN of the third step, not the inf after it
    assert meter.sums["correct"] == 10 and meter.sums["seen"] == meter.images == 15
    assert meter.extra["odd"] == expected_extra and meter.extra["on_host"] == 30.0
    assert str(meter.sums["loss"]) == str(expected_loss)  # nan, as the host sum would be


def test_a_heartbeat_before_the_first_read_shows_no_loss():
    """Mid-epoch, the loss comes from the meter's last read (every train.log_every steps); before the first, the
    heartbeat carries none and the progress line says so instead of printing 0."""
    from ltbench.run.progress import step_line

    beat = {"epoch": 1, "epochs": 30, "step": 3, "steps": 20, "loss": None, "images_per_s": 11.0, "seconds": 2.0}
    assert "step 3/20 loss – 11 img/s" in step_line(beat)
    assert "loss 0.5000" in step_line({**beat, "loss": 0.5})


def test_the_feeder_issues_a_batch_ahead_with_streams_as_no_ops_on_the_cpu():
    """The overlap's code path on the CPU: ``prepare`` takes the next host batch and builds its views at once
    (on CUDA: on a side stream), ``take`` hands it to the step (on CUDA: the training stream waits for an
    event); without CUDA there is no stream and no event, and the seeds are not pinned."""
    import torch

    from ltbench.train import feed

    events = []

    def host_batches():
        for i in range(2):
            events.append(f"load {i}")
            yield ([torch.full((2, 1, 3, 3), i, dtype=torch.uint8)], torch.tensor([i, i])), [("train", i, 10 + i)] * 2

    def views(images, keys):
        seeds = feed.seeds_on_device(keys, torch.device("cpu"))
        events.append(f"views {seeds.tolist()}")
        assert not seeds.is_pinned()
        return [images.float(), images.float() + 1]

    feeder = feed.Feeder(host_batches(), torch.device("cpu"), views)
    assert feeder.side.stream is None and feeder.side.handoff() is None
    batch = feeder.prepare()
    assert batch.ready is None and events == ["load 0", "views [10, 10]"]
    got, labels = feeder.take(batch)
    assert [v.tolist() for v in got] == [torch.zeros(2, 1, 3, 3).tolist(), torch.ones(2, 1, 3, 3).tolist()]
    assert feeder.prepare() is not None and events[-1] == "views [11, 11]"
    assert feeder.prepare() is None  # the epoch is over


def test_batched_runs_carry_their_augmentation_scheme_in_the_id(write_recipe):
    """Batched runs made before a change of the batched scheme's random draws or ops never share an id with
    runs made after it; worker runs say they have none; the committed batch results say scheme 1 (their
    migration wrote it) and this code refuses to train that scheme."""
    from ltbench.config import BATCH_AUGMENT_SCHEME, TrainConfig, from_dict
    from ltbench.errors import ConfigError
    from ltbench.recipe import load_recipe
    from ltbench.results import identity

    batch = load_recipe(write_recipe("b", extra={"train": {"augment_on": "batch"}})).runs[0]
    worker = load_recipe(write_recipe("w")).runs[0]
    assert batch.config["train"]["augment_scheme"] == BATCH_AUGMENT_SCHEME >= 2
    assert worker.config["train"]["augment_scheme"] is None
    folder = ROOT / "docs/reference-results/fmnist_augment_on"
    committed = [json.loads(p.read_text()) for p in folder.glob(f"*/{store.RESULT}")]
    batched = [r for r in committed if r["config"]["train"]["augment_on"] == "batch"]
    old_batch = [r for r in batched if r["config"]["train"]["augment_scheme"] == 1]  # issue 20's, before versions
    assert len(old_batch) == 6 and len(batched) == 12
    for r in old_batch:
        now = {**r["config"], "train": {**r["config"]["train"], "augment_scheme": BATCH_AUGMENT_SCHEME}}
        assert identity.run_id(now) != r["run_id"] == identity.run_id(r["config"])
        with pytest.raises(ConfigError, match="implements batched scheme 2 only"):
            from_dict(TrainConfig, r["config"]["train"], "train")


def test_an_in_process_run_leaves_cudnn_benchmark_as_it_found_it(tmp_path, write_recipe, monkeypatch):
    """prepare_for_device sets torch.backends.cudnn.benchmark for the process (on CUDA, from
    train.cudnn_benchmark); ``engine.train`` puts it back when the run ends, also when it fails. No CUDA here:
    the setting is simulated by flipping the flag where prepare_for_device runs."""
    import torch

    from ltbench.recipe import load_recipe
    from ltbench.train import engine

    prepare, before = engine.prepare_for_device, torch.backends.cudnn.benchmark

    def flipping(run, device):
        prepare(run, device)
        torch.backends.cudnn.benchmark = not before

    monkeypatch.setattr(engine, "prepare_for_device", flipping)
    spec = load_recipe(write_recipe()).runs[0]
    (tmp_path / "run").mkdir()
    (tmp_path / "failed").mkdir()
    engine.train(spec, tmp_path / "run", say=lambda line: None)
    assert torch.backends.cudnn.benchmark == before
    monkeypatch.setattr(engine, "make_loader", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        engine.train(spec, tmp_path / "failed", say=lambda line: None)
    assert torch.backends.cudnn.benchmark == before


def test_a_resident_training_set_gives_the_same_run_as_the_loader(tmp_path, monkeypatch):
    """augment_on: batch with in-memory uint8 data: the training array lives on the device and each batch is
    gathered there (engine.resident_data, feed.resident_batches): the same order, images and seeds as the
    loader's batches, so the same losses and metrics, bit for bit on the CPU."""
    import methods  # noqa: F401
    from ltbench.recipe import resolve_run_config
    from ltbench.train import engine, feed

    raw = {"data": {"name": "synthetic_lt", "num_classes": 4, "max_per_class": 12, "imb_factor": 2,
                    "test_per_class": 2, "image_size": 12},
           "backbone": {"name": "resnet8"}, "method": {"name": "la", "views": ["strong"]},
           "train": {"augment_on": "batch", "progress": False, "threads": 1},
           "optim": {"lr": 0.05, "batch_size": 8, "epochs": 2, "warmup_epochs": 0}}
    config = resolve_run_config(raw, seed=0, where="test")

    def run(name):
        outcome = engine.train({"config": config, "recipe": "t", "run_id": name}, tmp_path / name, say=lambda _: None)
        return outcome.metrics["all"], (tmp_path / name / "log.jsonl").read_text().count('"loss"'), \
            [json.loads(line)["loss"] for line in (tmp_path / name / "log.jsonl").read_text().splitlines()]

    gathered = []
    resident_batches = feed.resident_batches
    monkeypatch.setattr(feed, "resident_batches", lambda *a: gathered.append(1) or resident_batches(*a))
    for name in ("resident", "loader"):
        (tmp_path / name).mkdir()
    resident = run("resident")
    assert gathered  # the resident path ran
    monkeypatch.setattr(engine, "resident_data", lambda train, device: None)
    assert run("loader") == resident
