"""The feature cache of a finished run: clean-view features, extracted once, for a second stage.

Why: a stage-2 method (docs/posthoc.md) only needs the frozen backbone's features, never the images.
Extracting them costs one forward pass over the training and test sets; every stage-2 setting after
that costs milliseconds to seconds. So they are extracted once and kept in the run folder:

    RUN_DIR/features/
      meta.json              what was extracted, from which checkpoint (written last)
      train.npz              'features' (N, d), 'labels' (N,), and for BAPE 'z' (N, p)
      test.npz               the main test set, same arrays
      test_set-<name>.npz    each configured shifted test set (eval.test_sets)

Every view is the dataset's "eval" pipeline (no augmentation), the one the run's own evaluation uses.
Each split file is written atomically on its own, so a killed extraction resumes at the first split
that is missing; a second call with everything present does nothing. float16 halves the size and is
refused for BAPE's z (its class statistics need more than 11 bits; see docs/posthoc.md).

Model selection: runs report the last epoch (``ltbench.selection``), and the engine saves the final
checkpoint (epoch == optim.epochs, step 0) before its final evaluation, which does not change the
weights, so checkpoint.pt of a finished run holds exactly the model its result was computed from.
``load_final_state`` checks the run id, the epoch and the step before anything is extracted.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ltbench import store
from ltbench.checkpoint import load_checkpoint
from ltbench.data import transforms
from ltbench.data.base import MultiView
from ltbench.data.validation import declares_validation
from ltbench.errors import LtbenchError

FEATURES_DIR = "features"
META = "meta.json"
PARTIAL = ".partial.json"  # the origin of split files while an extraction is under way
FEATURES_FORMAT = 1
DTYPES = ("float32", "float16")


def split_file(split: str) -> str:
    """'train' -> 'train.npz', 'test_set:forward50' -> 'test_set-forward50.npz'."""
    return split.replace(":", "-") + ".npz"


def finished_result(run_dir: Path) -> dict:
    """The run's result record; LtbenchError unless it is a usable 'done' result."""
    check = store.check_result(run_dir)
    if check.state != "done":
        why = {"missing": "it has no result.json (not finished)", "failed": "it failed"}.get(
            check.state, f"its result is unusable ({check.reason})")
        raise LtbenchError(f"{run_dir}: cannot extract features: {why}; finish it with 'ltbench run' first")
    if (check.result.get("selection") or {}).get("strategy") == "best_val":
        raise LtbenchError(f"{run_dir}: stage 2 needs the reported model's checkpoint, and a best_val run reports an "
                           f"earlier epoch than its final checkpoint; use eval.select: last for stage-1 runs of a stage 2")
    return check.result


def load_final_state(run_dir: Path, result: dict) -> dict:
    """checkpoint.pt of a finished run, checked to be the model its result was computed from."""
    path = Path(run_dir) / store.CHECKPOINT
    problems: list[str] = []
    state = load_checkpoint(path, result["run_id"], problems.append)
    epochs = result["config"]["optim"]["epochs"]
    if state is None:
        why = problems[0] if problems else "it is missing"
        raise LtbenchError(f"{path}: no usable final checkpoint ({why}); rerun the run to rebuild it")
    if state["epoch"] != epochs or state["step"] != 0:
        raise LtbenchError(f"{path}: the checkpoint is at epoch {state['epoch']}, step {state['step']}, not at the "
                           f"end of the {epochs} epochs the result reports; rerun the run")
    return state


def checkpoint_digest(run_dir: Path) -> str:
    """sha256 of checkpoint.pt: the cache is valid only for the checkpoint it was extracted from."""
    return store.file_sha256(Path(run_dir) / store.CHECKPOINT) or ""


def cached_splits(config: dict) -> list[str]:
    """The splits a run's cache holds: train, test, test_set:<name> for each eval.test_sets, and val when the
    run has a validation split (stage-2 settings are then scored on it too, for ``ltbench table --select val``)."""
    val = ["val"] if declares_validation(config.get("data", {})) else []
    return ["train", "test"] + [f"test_set:{name}" for name in config.get("eval", {}).get("test_sets", [])] + val


def read_meta(run_dir: Path) -> dict | None:
    try:
        meta = json.loads((Path(run_dir) / FEATURES_DIR / META).read_text())
        return meta if isinstance(meta, dict) and meta.get("format") == FEATURES_FORMAT else None
    except (OSError, ValueError):
        return None


def is_complete(run_dir: Path, dtype: str = "float32") -> bool:
    """True when the cache holds every split, in ``dtype``, for the current checkpoint."""
    meta = read_meta(run_dir)
    folder = Path(run_dir) / FEATURES_DIR
    return (meta is not None and meta.get("dtype") == dtype and meta.get("checkpoint_sha256") == checkpoint_digest(run_dir)
            and all((folder / split_file(s)).is_file() for s in meta.get("splits", [])))


def rebuild_run(config: dict, state: dict):
    """The run's data, backbone and method (``engine.Run``) with the final checkpoint's weights, in eval mode."""
    from ltbench.engine import build_run

    run = build_run(config)
    run.model.load_state_dict(state["model"])
    run.method.load_extra_state(state.get("method_extra", {}))
    run.model.eval()
    return run


def split_sources(run) -> dict[str, tuple[MultiView, np.ndarray]]:
    """Every split as (clean-view dataset, labels): the training set through the "eval" pipeline, plus the
    run's own test sources (``engine.eval_sources``)."""
    tf = transforms.build("eval", run.data.image, run.data.pipelines)
    clean = {name: source for name, source in run.eval_sets.items() if not name.endswith(":adapt")}
    return {"train": (MultiView(run.data.train, [tf]), np.asarray(run.data.train_labels)), **clean}


@torch.no_grad()
def extract_split(run, dataset: MultiView, batch_size: int = 512) -> dict[str, np.ndarray]:
    """Backbone features (and BAPE's projected z) of one clean-view dataset, in order."""
    feats, zs = [], []
    project = getattr(run.method, "project", None)
    for start in range(0, len(dataset), batch_size):
        views = [dataset[i][0][0] for i in range(start, min(start + batch_size, len(dataset)))]
        h = run.backbone(torch.stack(views)).float()
        feats.append(h)
        if project is not None:
            zs.append(project(h).float())
    out = {"features": torch.cat(feats).numpy()}
    if zs:
        out["z"] = torch.cat(zs).numpy()
    return out


def save_split(path: Path, arrays: dict[str, np.ndarray]) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    store.atomic_write_bytes(path, buffer.getvalue())


def extract_features(run_dir: Path, dtype: str = "float32", say: Callable[[str], None] = print) -> dict:
    """Fill RUN_DIR/features/ for a finished run (idempotent, resumable); returns meta.json's content."""
    run_dir = Path(run_dir)
    if dtype not in DTYPES:
        raise LtbenchError(f"features dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    result = finished_result(run_dir)
    if is_complete(run_dir, dtype):
        return read_meta(run_dir)
    state = load_final_state(run_dir, result)
    config, digest = result["config"], checkpoint_digest(run_dir)
    folder = run_dir / FEATURES_DIR
    folder.mkdir(exist_ok=True)
    start_fresh_if_foreign(folder, {"checkpoint_sha256": digest, "dtype": dtype})
    run = None
    for split in cached_splits(config):
        target = folder / split_file(split)
        if target.is_file():
            continue
        run = run or rebuild_run(config, state)
        dataset, labels = split_sources(run)[split]
        arrays = extract_split(run, dataset)
        if dtype == "float16":
            arrays["features"] = arrays["features"].astype(np.float16)
        save_split(target, {**arrays, "labels": np.asarray(labels, dtype=np.int64)})
        say(f"{run_dir.name}: features of {split} ({len(labels)} images) -> {target.name}")
    return write_meta(run_dir, result, digest, dtype)


def start_fresh_if_foreign(folder: Path, origin: dict) -> None:
    """Keep split files only when they were extracted from this checkpoint in this dtype (as told by
    meta.json or, mid-extraction, by .partial.json); otherwise delete them and mark the new origin."""
    known = read_meta(folder.parent)
    if known is None and (folder / PARTIAL).is_file():
        try:
            known = json.loads((folder / PARTIAL).read_text())
        except (OSError, ValueError):
            known = None
    if known is not None and all(known.get(k) == v for k, v in origin.items()):
        return
    (folder / META).unlink(missing_ok=True)
    for f in folder.glob("*.npz"):
        f.unlink()
    store.atomic_write_json(folder / PARTIAL, origin)


def write_meta(run_dir: Path, result: dict, digest: str, dtype: str) -> dict:
    folder = Path(run_dir) / FEATURES_DIR
    splits = cached_splits(result["config"])
    sizes = {s: (folder / split_file(s)).stat().st_size for s in splits}
    meta = {"format": FEATURES_FORMAT, "run_id": result["run_id"], "checkpoint_sha256": digest, "dtype": dtype,
            "view": "eval", "splits": splits, "bytes": sizes}
    store.atomic_write_json(folder / META, meta)
    (folder / PARTIAL).unlink(missing_ok=True)
    return meta


def load_split(run_dir: Path, split: str) -> dict[str, np.ndarray]:
    """The cached arrays of one split (features as float32)."""
    with np.load(Path(run_dir) / FEATURES_DIR / split_file(split)) as data:
        out = {k: data[k] for k in data.files}
    out["features"] = out["features"].astype(np.float32)
    return out
