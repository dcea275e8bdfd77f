"""The feature cache of a finished run: clean-view features, extracted once, for a second stage.

Why: a stage-2 method (docs/posthoc.md) only needs the frozen backbone's features, never the images.
Extracting them costs one forward pass over the training and test sets; every stage-2 setting after
that costs milliseconds to seconds. So they are extracted once and kept in the run folder:

    RUN_DIR/features/
      meta.json              what was extracted, from which checkpoint (written last)
      train.npz              'features' (N, d), 'labels' (N,), and one (N, p) array per feature space
                             the run's method declares (``Method.feature_spaces``), named by it
      test.npz               the main test set, same arrays
      test_set-<name>.npz    each configured shifted test set (eval.test_sets)

Every view is the dataset's "eval" pipeline (no augmentation), the one the run's own evaluation uses.
Each split file is written atomically on its own, so a killed extraction resumes at the first split
that is missing; a second call with everything present does nothing. float16 halves the size of the
backbone features only: a method's declared spaces stay float32 (a space may feed class statistics that
need more than 11 bits; see docs/posthoc.md).

Model selection: runs report the last epoch (``ltbench.train.selection``), and the engine saves the final
checkpoint (epoch == optim.epochs, step 0) before its final evaluation, which does not change the
weights, so checkpoint.pt of a finished run holds exactly the model its result was computed from.
``load_final_state`` checks the run id, the epoch and the step before anything is extracted.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ltbench.results import identity, store
from ltbench.train.checkpoint import MODEL_FORMATS, read_state
from ltbench.data import transforms
from ltbench.data.base import MultiView
from ltbench.data.validation import declares_validation
from ltbench.train.engine import build_run
from ltbench import registry
from ltbench.errors import LtbenchError
from ltbench.results.predictions import MAX_NPZ_BYTES, npz_problem

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
    if "optim" not in check.result["config"]:  # optional in the schema (hand-made records), needed here
        raise LtbenchError(f"{run_dir / store.RESULT}: config.optim is missing; stage 2 needs the run's schedule "
                           f"(its epochs, to know the final checkpoint): run it again with 'ltbench run'")
    if (check.result.get("selection") or {}).get("strategy") == "best_val":
        raise LtbenchError(f"{run_dir}: stage 2 needs the reported model's checkpoint, and a best_val run reports an "
                           f"earlier epoch than its final checkpoint; use eval.select: last for stage-1 runs of a stage 2")
    return check.result


def load_final_state(run_dir: Path, result: dict) -> dict:
    """checkpoint.pt of a finished run, checked to be the model its result was computed from."""
    path = Path(run_dir) / store.CHECKPOINT
    epochs = result["config"]["optim"]["epochs"]
    try:  # its model only: a checkpoint of the format before ltbench kept the run's start serves too
        state = read_state(path, result["run_id"], ("epoch", "step", "model"), formats=MODEL_FORMATS)
    except ValueError as exc:
        raise LtbenchError(f"{path}: no usable final checkpoint ({str(exc)[:200]}); {REBUILD_HINT}") from None
    if state["epoch"] != epochs or state["step"] != 0:
        raise LtbenchError(f"{path}: the checkpoint is at epoch {state['epoch']}, step {state['step']}, not at the "
                           f"end of the {epochs} epochs the result reports; {REBUILD_HINT}")
    return state


#: The remedy for a finished run whose checkpoint is gone: ``launch.runs_to_launch`` sets its result aside
#: (result.json.no-checkpoint) and trains it again, which rebuilds checkpoint.pt (tests/test_faults.py).
REBUILD_HINT = "rebuild it with 'ltbench run RECIPE --rebuild-checkpoints' (trains the run again)"


def final_checkpoint_problem(run_dir: Path) -> str:
    """'' when a done run's checkpoint.pt holds its final model, else why not (the rule of load_final_state)."""
    check = store.check_result(run_dir)
    if check.state != "done":
        return ""
    try:
        load_final_state(Path(run_dir), check.result)
    except LtbenchError as exc:
        return str(exc).split("; rebuild it")[0]
    return ""


def checkpoint_digest(run_dir: Path) -> str:
    """sha256 of checkpoint.pt: the cache is valid only for the checkpoint it was extracted from."""
    return identity.file_sha256(Path(run_dir) / store.CHECKPOINT) or ""


def cached_splits(config: dict) -> list[str]:
    """The splits a run's cache holds: train, test, test_set:<name> for each eval.test_sets, and val when the
    run has a validation split (stage-2 settings are then scored on it too, for ``ltbench table --select val``)."""
    val = ["val"] if declares_validation(config.get("data", {})) else []
    return ["train", "test"] + [f"test_set:{name}" for name in config.get("eval", {}).get("test_sets", [])] + val


def meta_problem(meta) -> str:
    """'' when a parsed meta.json has every field with its type, else which field is wrong."""
    if not isinstance(meta, dict):
        return f"holds a JSON {type(meta).__name__}, expected an object"
    if meta.get("format") != FEATURES_FORMAT:
        return f"format is {str(meta.get('format'))[:20]!r}, expected {FEATURES_FORMAT}"
    for key in ("run_id", "checkpoint_sha256"):
        if not isinstance(meta.get(key), str):
            return f"{key} is not a string"
    if meta.get("dtype") not in DTYPES:
        return f"dtype is {str(meta.get('dtype'))[:20]!r}, expected one of {', '.join(DTYPES)}"
    splits, sizes = meta.get("splits"), meta.get("bytes")
    if not (isinstance(splits, list) and splits and all(isinstance(x, str) for x in splits)):
        return "splits is not a list of split names"
    if not (isinstance(sizes, dict) and all(isinstance(sizes.get(x), int) and not isinstance(sizes.get(x), bool)
                                            for x in splits)):
        return "bytes does not give a whole number of bytes for every split"
    return ""


def read_meta(run_dir: Path) -> dict | None:
    """meta.json when it is usable (``meta_problem``), else None."""
    meta = store.load_json_object(Path(run_dir) / FEATURES_DIR / META)
    return None if not meta or meta_problem(meta) else meta


def cache_problem(run_dir: Path, meta: dict) -> str:
    """'' when every split file meta.json lists is a regular file of the size meta.json recorded."""
    folder = Path(run_dir) / FEATURES_DIR
    for split in meta["splits"]:
        path = folder / split_file(split)
        problem = store.regular_file_problem(path, follow=False)
        if problem:
            return f"{path.name} {problem}"
        if path.stat().st_size != meta["bytes"][split]:
            return f"{path.name} is {path.stat().st_size} bytes, meta.json recorded {meta['bytes'][split]} (truncated?)"
    return ""


def is_complete(run_dir: Path, dtype: str = "float32") -> bool:
    """True when the cache holds every split, in ``dtype``, for the current checkpoint, at the recorded sizes."""
    meta = read_meta(run_dir)
    return (meta is not None and meta.get("dtype") == dtype and meta.get("checkpoint_sha256") == checkpoint_digest(run_dir)
            and not cache_problem(run_dir, meta))


def set_aside_damaged_cache(run_dir: Path, say: Callable[[str], None]) -> None:
    """A cache that claims to be finished but is not usable (meta.json unreadable or of the wrong types,
    a split file truncated, replaced or missing) is moved to features.damaged and extracted again: every
    later call would otherwise trust it and fail the same way."""
    folder = Path(run_dir) / FEATURES_DIR
    meta_path = folder / META
    if not os.path.lexists(meta_path):
        return  # no finished extraction: a partial one resumes (start_fresh_if_foreign)
    try:
        problem = meta_problem(store.load_json(meta_path, limit=store.MiB))
    except store.UnusableFile as exc:
        problem = f"meta.json {exc.reason}"
    else:
        problem = problem and f"meta.json {problem}"
    meta = read_meta(run_dir)
    if not problem and meta is not None and meta["checkpoint_sha256"] == checkpoint_digest(run_dir):
        problem = cache_problem(run_dir, meta)
    if problem:
        moved = store.set_aside(folder)
        say(f"{Path(run_dir).name}: the feature cache is unusable ({problem}); moved it to {moved.name} and "
            f"extracting the features again")


def rebuild_run(config: dict, state: dict):
    """The run's data, backbone and method (``engine.Run``) with the final checkpoint's weights, in eval mode."""
    run = build_run(config)
    run.model.load_state_dict(state["model"])
    run.method.load_extra_state(state.get("method_extra", {}))
    run.model.eval()
    return run


def split_sources(run) -> dict[str, tuple[MultiView, np.ndarray]]:
    """Every split as (clean-view dataset, labels): the training set through the "eval" pipeline, plus the
    run's own test sources (``engine.eval_sources``)."""
    tf = transforms.build("eval", run.data.image, run.data.pipelines)
    clean = {name: (MultiView(source.base, [tf]), labels)  # one clean view even under eval.tte
             for name, (source, labels) in run.eval_sets.items() if not name.endswith(":adapt")}
    return {"train": (MultiView(run.data.train, [tf]), np.asarray(run.data.train_labels)), **clean}


RESERVED_ARRAYS = ("features", "labels")  # the arrays every split file holds; no feature space may take their names


def declared_spaces(method) -> dict[str, Callable]:
    """``method.feature_spaces()``, checked: the names become array names in the split files."""
    label = f"method '{getattr(method, 'registered_name', type(method).__name__)}'"
    spaces = registry.checked_return(label, "feature_spaces()", registry.call_plugin(label, "feature_spaces()",
                                     method.feature_spaces), dict, 64, "a dict of at most 64 name -> callable")
    for name in spaces:
        if not (isinstance(name, str) and name.isidentifier()) or name in RESERVED_ARRAYS:
            raise LtbenchError(f"method {method.registered_name}: feature_spaces() names {name!r}; a feature space "
                               f"is named by an identifier other than {' and '.join(RESERVED_ARRAYS)}")
        if not callable(spaces[name]):
            raise registry.PluginError(f"{label}: feature_spaces() maps {name!r} to {type(spaces[name]).__name__}, "
                                       f"expected a callable (features -> (N, p) tensor); fix the plugin")
    return spaces


@torch.no_grad()
def extract_split(run, dataset: MultiView, batch_size: int = 512) -> dict[str, np.ndarray]:
    """Backbone features (and every feature space the run's method declares) of one clean-view dataset, in order."""
    spaces = declared_spaces(run.method)
    feats, mapped = [], {name: [] for name in spaces}
    for start in range(0, len(dataset), batch_size):
        views = [dataset[i][0][0] for i in range(start, min(start + batch_size, len(dataset)))]
        h = run.backbone(torch.stack(views)).float()
        feats.append(h)
        for name, space in spaces.items():
            mapped[name].append(space(h).float())
    return {"features": torch.cat(feats).numpy(), **{name: torch.cat(parts).numpy() for name, parts in mapped.items()}}


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
    set_aside_damaged_cache(run_dir, say)
    if is_complete(run_dir, dtype):
        return read_meta(run_dir)
    state = load_final_state(run_dir, result)
    config, digest = result["config"], checkpoint_digest(run_dir)
    folder = run_dir / FEATURES_DIR
    if os.path.lexists(folder) and not folder.is_dir() or folder.is_symlink():
        store.set_aside(folder)
    store.make_dirs(folder)
    start_fresh_if_foreign(folder, {"checkpoint_sha256": digest, "dtype": dtype})
    run = None
    for split in cached_splits(config):
        target = folder / split_file(split)
        if target.is_file() and not target.is_symlink():
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
    if known is None:
        known = store.load_json_object(folder / PARTIAL)
    if known and all(known.get(k) == v for k, v in origin.items()):
        return
    (folder / META).unlink(missing_ok=True)
    for f in folder.glob("*.npz"):
        if f.is_dir() and not f.is_symlink():
            store.set_aside(f)
        else:
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
    """The cached arrays of one split (features as float32), checked: UnusableFile (naming the file) when
    it cannot be read or holds anything but (N, d) float features, (N,) integer labels and (N, p) float
    feature spaces."""
    path = Path(run_dir) / FEATURES_DIR / split_file(split)
    problem = npz_problem(path)
    if problem:
        raise store.UnusableFile(path, problem)
    try:
        with store.open_bounded(path, MAX_NPZ_BYTES) as f, np.load(f, allow_pickle=False) as data:
            out = {k: data[k] for k in data.files}
    except Exception as exc:  # BadZipFile, zlib.error (a flipped byte), object arrays, a forged header...
        raise store.UnusableFile(path, f"cannot be read as arrays ({type(exc).__name__}: "
                                           f"{str(exc)[:120]})") from None
    problem = split_arrays_problem(out)
    if problem:
        raise store.UnusableFile(path, problem)
    out["features"] = out["features"].astype(np.float32)
    return out


def split_arrays_problem(arrays: dict[str, np.ndarray]) -> str:
    """'' when a split's arrays have the shapes and dtypes extract_features writes, else what is wrong."""
    feats, labels = arrays.get("features"), arrays.get("labels")
    if feats is None or labels is None:
        return "has no 'features' or no 'labels' array"
    if feats.ndim != 2 or feats.dtype.kind != "f" or feats.shape[1] == 0:
        return f"features are {feats.dtype} of shape {feats.shape}, expected a float (N, d) matrix"
    if labels.ndim != 1 or labels.dtype.kind not in "iu" or len(labels) != len(feats):
        return f"labels are {labels.dtype} of shape {labels.shape}, expected {len(feats)} integers"
    for name, space in arrays.items():
        if name not in RESERVED_ARRAYS and (space.ndim != 2 or space.dtype.kind != "f" or len(space) != len(feats)):
            return f"{name} is {space.dtype} of shape {space.shape}, expected a float ({len(feats)}, p) matrix"
    if not np.isfinite(feats).all():
        return "features hold NaN or infinite values"
    return ""
