"""The typed records around a run: RunSpec, the result record and its documented schema, model
selection, and the checkpoint policy (CheckpointSaver) on a tiny model."""

import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from ltbench.results import record, schema, store
from ltbench.train.checkpoint import MODEL_FORMATS, CheckpointSaver, load_checkpoint, read_state
from ltbench.results.runspec import RunSpec
from ltbench.train.selection import select_model
from tests.reportkit import FAKE_NUMERICS

SCHEMA_DOC = Path(__file__).resolve().parents[1] / "docs" / "results-schema.md"
CONFIG = {"data": {"name": "synthetic_lt"}, "backbone": {"name": "resnet8"}, "method": {"name": "ce"}, "sampler": {"name": "uniform"},
          "seed": 3}
SPEC = {"recipe": "r", "run_id": "abc", "config": CONFIG, "grid": {"method": {"name": "ce"}}, "plugins": ["p"],
        "run_dir": "/x/r/abc"}


def test_runspec_round_trips_through_json():
    spec = RunSpec.from_dict(json.loads(json.dumps(SPEC)))
    assert spec.seed == 3 and spec.grid == {"method": {"name": "ce"}}
    assert json.loads(json.dumps(spec.to_dict())) == SPEC
    assert list(spec.to_dict()) == ["recipe", "run_id", "config", "grid", "plugins", "run_dir"]
    assert RunSpec.coerce(spec) is spec


def test_runspec_fills_optional_fields_and_rejects_missing_ones():
    spec = RunSpec.from_dict({"recipe": "r", "run_id": "abc", "config": CONFIG})
    assert spec.grid == {} and spec.plugins == [] and spec.run_dir == ""
    with pytest.raises(ValueError, match="run_id"):
        RunSpec.from_dict({"recipe": "r", "config": CONFIG})


def test_runspec_to_dict_is_a_copy():
    spec = RunSpec.from_dict(json.loads(json.dumps(SPEC)))
    spec.to_dict()["config"]["seed"] = 99
    assert spec.seed == 3


def _headline(all_, many=0.5, medium=0.4, few=0.3):
    return {"all": all_, "many": many, "medium": medium, "few": few}


def test_selection_is_the_last_epoch_and_names_the_test_oracle():
    final = {**_headline(0.6), "per_class": [0.6]}
    assert select_model(final, [{"epoch": 1, "loss": 1.0}], epochs=3) == {"strategy": "last", "epoch": 3}
    logged = [{"epoch": 1, "test": _headline(0.5)}, {"epoch": 2, "test": _headline(0.7, many=0.9)}]
    selection = select_model(final, logged, epochs=3)
    assert selection == {"strategy": "last", "epoch": 3, "oracle_best_on_test": {"epoch": 2, **_headline(0.7, many=0.9)}}
    # the final epoch competes too, and a null accuracy never wins
    logged = [{"epoch": 1, "test": _headline(None)}]
    assert select_model(final, logged, epochs=3)["oracle_best_on_test"]["epoch"] == 3


def _documented_fields() -> set[str]:
    return set(re.findall(r"^\| `([a-z_]+)` \|", SCHEMA_DOC.read_text(), flags=re.M))


def _outcome() -> record.TrainOutcome:
    data = SimpleNamespace(num_classes=2, class_counts=[5, 1], test_counts=[3, 3], subset_hash="h",
                           class_names=["a", "b"], info={})
    metrics = {**_headline(0.5, many=None, medium=None, few=0.5), "per_class": [0.25, 0.75],
               "groups": {"many_threshold": 100, "few_threshold": 20}}
    return record.TrainOutcome(metrics=metrics, selection={"strategy": "last", "epoch": 1},
                               method_extras={}, data=record.data_record(data), train_seconds_this_session=1.0,
                               device_seconds=1.5, run_started=10.0,
                               threads=1, device="cpu", world_size=1, views=["default"],
                               numerics=dict(FAKE_NUMERICS))


def test_every_result_field_is_documented_and_a_done_record_is_usable():
    spec = RunSpec.from_dict(SPEC)
    done = record.header(spec, started=10.0, provenance={}, code={})
    record.done(done, _outcome())
    record.finish(done, 12.5)
    assert done["wall_seconds"] == 2.5 and done["status"] == "done" and done["seed"] == 3
    assert schema.result_problem(json.loads(json.dumps(done))) == ""
    failed = record.header(spec, started=10.0, provenance={}, code={})
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        record.failed(failed, exc, "Traceback ...")
    record.finish(failed, 11.0)
    assert failed["error"] == "RuntimeError: boom" and failed["traceback"] == "Traceback ..."
    assert schema.result_problem(failed) == ""
    undocumented = (set(done) | set(failed) | {"traceback_file"}) - _documented_fields()
    assert not undocumented, f"result.json fields missing from docs/results-schema.md: {sorted(undocumented)}"


class _Method(nn.Module):
    def __init__(self):
        super().__init__()
        self.extra = {"calls": 0}

    def extra_state(self):
        return dict(self.extra)

    def load_extra_state(self, state):
        self.extra = dict(state)


def _tiny_run(seed: int):
    torch.manual_seed(seed)
    method = _Method()
    model = nn.ModuleDict({"backbone": nn.Linear(3, 2), "method": method})
    return SimpleNamespace(model=model, method=method), torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def test_saver_resumes_state_and_cuts_the_log_back(tmp_path):
    run, optimizer = _tiny_run(0)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    saver = CheckpointSaver(tmp_path, "rid", minutes=0, main=True, world=1)
    assert saver.resume(run, optimizer, scaler, say=lambda m: None) == (0, 0, 0)
    store.append_jsonl(tmp_path / store.LOG, {"epoch": 1})
    run.method.extra = {"calls": 7}
    saver.after_epoch(run, optimizer, scaler, epochs_done=1, iteration=4)
    store.append_jsonl(tmp_path / store.LOG, {"epoch": 2})  # written after the checkpoint: must go

    fresh, fresh_optimizer = _tiny_run(1)
    messages = []
    resumed = CheckpointSaver(tmp_path, "rid", minutes=0, main=True, world=1)
    assert resumed.resume(fresh, fresh_optimizer, scaler, say=messages.append) == (1, 0, 4)
    assert messages == ["resuming from checkpoint: epoch 1, step 0"]
    assert store.read_jsonl(tmp_path / store.LOG) == [{"epoch": 1}]
    assert fresh.method.extra == {"calls": 7}
    for a, b in zip(run.model.parameters(), fresh.model.parameters()):
        assert torch.equal(a, b)
    # a checkpoint of another run is refused, and without one the old log goes
    assert load_checkpoint(tmp_path / store.CHECKPOINT, "other", say=messages.append) is None
    assert "belongs to run rid" in messages[-1]
    other = CheckpointSaver(tmp_path, "other", minutes=0, main=True, world=1)
    assert other.resume(fresh, fresh_optimizer, scaler, say=lambda m: None) == (0, 0, 0)
    assert not (tmp_path / store.LOG).exists()


def test_a_runs_cost_goes_on_across_sessions_from_what_its_checkpoint_kept(tmp_path):
    """device_seconds = the seconds its checkpoint kept + this session's: a session that began 100 s ago saves
    at least 100 s, and the next session starts counting from there. Clocks are given, never waited for."""
    run, optimizer = _tiny_run(0)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    first = CheckpointSaver(tmp_path, "rid", minutes=0, main=True, world=1, session_start=time.monotonic() - 100)
    first.resume(run, optimizer, scaler, say=lambda m: None)
    first.after_epoch(run, optimizer, scaler, epochs_done=1, iteration=1)
    kept = torch.load(tmp_path / store.CHECKPOINT, weights_only=True)["seconds"]
    assert kept >= 100
    second = CheckpointSaver(tmp_path, "rid", minutes=0, main=True, world=1, session_start=time.monotonic())
    second.resume(run, optimizer, scaler, say=lambda m: None)
    assert kept <= second.seconds() < kept + 100
    fresh = CheckpointSaver(tmp_path / "other", "rid", minutes=0, main=True, world=1, session_start=time.monotonic())
    assert fresh.seconds() < 100  # no checkpoint: this session alone

    # a checkpoint is data: a count that is no number, or more than the time since its run's first session
    # started allows (the bound of a result's device_seconds), starts the run over, named once
    started = torch.load(tmp_path / store.CHECKPOINT, weights_only=True)["run_started"]
    assert time.time() - 200 < started <= time.time() - 100  # the first session's start, on the wall clock
    for bad in ("ten", "12", True, float("nan"), -1.0, float("inf"), 1e308, time.time() - started + 3600):
        state = torch.load(tmp_path / store.CHECKPOINT, weights_only=True)
        state["seconds"] = bad
        torch.save(state, tmp_path / store.CHECKPOINT)
        messages = []
        assert load_checkpoint(tmp_path / store.CHECKPOINT, "rid", say=messages.append) is None
        assert len(messages) == 1 and "not a number of seconds" in messages[0], messages
    for bad in (time.time() + 3600, "0", float("nan")):  # a first session that starts in the future, or never
        state.update(seconds=1.0, run_started=bad)
        torch.save(state, tmp_path / store.CHECKPOINT)
        messages = []
        assert load_checkpoint(tmp_path / store.CHECKPOINT, "rid", say=messages.append) is None
        assert "'run_started' is" in messages[0], messages
    state.update(format=2, seconds=5.0)  # the format before the first session's start was kept
    torch.save(state, tmp_path / store.CHECKPOINT)
    messages = []
    assert load_checkpoint(tmp_path / store.CHECKPOINT, "rid", say=messages.append) is None
    assert "unknown checkpoint format" in messages[0]
    del state["run_started"]  # a finished run's checkpoint of that format still gives stage 2 its model
    torch.save(state, tmp_path / store.CHECKPOINT)
    assert "model" in read_state(tmp_path / store.CHECKPOINT, "rid", ("epoch", "model"), formats=MODEL_FORMATS)


def test_saver_times_mid_epoch_checkpoints_for_one_process_only(tmp_path):
    run, optimizer = _tiny_run(0)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    path = tmp_path / store.CHECKPOINT
    off = CheckpointSaver(tmp_path, "rid", minutes=0, main=True, world=1)
    off.after_step(run, optimizer, scaler, epoch=0, next_step=1, steps_in_epoch=5, iteration=1)
    assert not path.exists()  # checkpoint_minutes 0: epoch ends only
    due = CheckpointSaver(tmp_path, "rid", minutes=1e-9, main=True, world=2)
    time.sleep(0.01)
    due.after_step(run, optimizer, scaler, epoch=0, next_step=1, steps_in_epoch=5, iteration=1)
    assert not path.exists()  # several processes: no timed checkpoints
    due = CheckpointSaver(tmp_path, "rid", minutes=1e-9, main=True, world=1)
    time.sleep(0.01)
    due.after_step(run, optimizer, scaler, epoch=0, next_step=5, steps_in_epoch=5, iteration=5)
    assert not path.exists()  # the epoch's last step: the epoch-end checkpoint follows
    due.after_step(run, optimizer, scaler, epoch=0, next_step=2, steps_in_epoch=5, iteration=2)
    state = load_checkpoint(path, "rid", say=print)
    assert (state["epoch"], state["step"], state["iteration"]) == (0, 2, 2)
