"""train.loggers: TensorBoard event files that tensorboard's own reader loads, W&B in offline mode;
off by default, and never part of the run id."""

import json
from pathlib import Path

import pytest

from ltbench.recipe import load_recipe


def run_with(write_recipe, loggers, **extra):
    from ltbench.run.local_pool import run_local

    spec = load_recipe(write_recipe(extra={"train": {"progress": False, "eval_every": 1, "loggers": loggers},
                                           **extra})).runs[0]
    run_local([spec])
    run_dir = Path(spec.run_dir)
    assert json.loads((run_dir / "result.json").read_text())["status"] == "done"
    return spec, run_dir, [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]


def test_tensorboard_event_files_load_in_tensorboards_reader(write_recipe):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, run_dir, log = run_with(write_recipe, ["tensorboard"], optim={"epochs": 3})
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"loss", "lr", "images_per_s", "train_acc", "test/all"} <= tags
    loss = events.Scalars("loss")
    assert [e.step for e in loss] == [1, 2, 3]
    assert [e.value for e in loss] == pytest.approx([row["loss"] for row in log], rel=1e-6)
    # eval_every=1 logs test metrics after epochs 1 and 2 (the final evaluation follows epoch 3)
    assert [e.step for e in events.Scalars("test/all")] == [1, 2]


def wandb_history(path: Path) -> list[dict]:
    """The history rows of an offline ``.wandb`` file: a 7-byte header (':W&B', magic, version), then
    LevelDB-log records (crc32c, length, type; FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4) in 32 KiB blocks,
    each a protobuf ``Record`` (wandb's own schema)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, block, pos, pieces, records = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        pieces, pos = pieces + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            records.append(pieces)
            pieces = b""
    rows = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


@pytest.mark.slow
def test_wandb_offline_run_holds_the_scalars(write_recipe, monkeypatch, tmp_path):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    spec, run_dir, log = run_with(write_recipe, ["wandb"])
    (offline,) = list((run_dir / "wandb").glob(f"offline-run-*-{spec.run_id}"))
    history = wandb_history(offline / f"run-{spec.run_id}.wandb")
    assert [row["_step"] for row in history] == [1, 2]
    assert [row["loss"] for row in history] == pytest.approx([row["loss"] for row in log])
    assert history[0]["test/all"] == pytest.approx(log[0]["test"]["all"])


def test_loggers_are_off_by_default_and_not_in_the_run_id(write_recipe):
    plain = load_recipe(write_recipe("plain")).runs[0]
    logged = load_recipe(write_recipe("logged", extra={"train": {"loggers": ["tensorboard", "wandb"]}})).runs[0]
    assert plain.config["train"]["loggers"] == []
    assert plain.run_id == logged.run_id


@pytest.mark.parametrize("loggers,message", [(["mlflow"], "unknown logger 'mlflow'"),
                                             (["wandb", "wandb"], "a logger is named twice")])
def test_bad_logger_names_are_one_line_errors(write_recipe, loggers, message):
    from ltbench.errors import ConfigError

    with pytest.raises(ConfigError, match=f"train.loggers: {message}"):
        load_recipe(write_recipe(extra={"train": {"loggers": loggers}}))


def test_a_missing_logger_package_is_refused_before_training_and_dropped_at_the_start(monkeypatch, tmp_path,
                                                                                        write_recipe):
    import builtins
    import importlib.util

    from ltbench.errors import ConfigError
    from ltbench.train import loggers

    runs = load_recipe(write_recipe(extra={"train": {"loggers": ["wandb"]}})).runs
    real_find, real_import = importlib.util.find_spec, builtins.__import__
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real_find(name, *a))
    with pytest.raises(ConfigError, match=r"'wandb' needs the wandb package; install it with pip install wandb"):
        loggers.check_loggers(runs)  # at launch and --dry-run, before any run trains

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    said = []
    started = loggers.create_loggers(["wandb"], tmp_path, None, say=said.append)  # what the check cannot see
    assert started.loggers == [] and "'wandb' could not start" in said[0] and "goes on without it" in said[0]
