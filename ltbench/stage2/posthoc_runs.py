"""Running a recipe's ``posthoc:`` grid over its finished runs, and storing each stage-2 result.

Layout (docs/results-schema.md, "Stage-2 results"): next to the run it was fitted on,

    RUN_DIR/features/...                 the feature cache (ltbench/stage2/features.py)
    RUN_DIR/posthoc/lock                 held while a process works on this run's stage-2 grid
    RUN_DIR/posthoc/<stage-2 id>/result.json, predictions.npz

The stage-2 id is the sha1 of the resolved stage-2 config (``posthoc_id``), so a setting is computed
once: ``ltbench posthoc`` skips every setting whose result is usable (``store.check_result``, the same
rule as for runs) and resumes the rest. A stage-2 result has the metrics schema of a run (all, groups,
per class, target priors, test sets); its ``config`` is the run's config plus a ``posthoc`` section, so a
table treats it as one more row ("run label + stage-2 label") and can select it by ``posthoc.*`` keys.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, NoReturn

import numpy as np
import torch

from ltbench.stage2 import features
from ltbench.results import identity, schema, status_rule, store
from ltbench import registry
from ltbench.config import EvalConfig, from_dict
from ltbench.errors import DiskFullError, LtbenchError
from ltbench.evaluation import label_prior, summarize, target_prior_metrics
from ltbench.method import MethodContext, create_method
from ltbench.posthoc import FrozenRun, SplitInputs, create_posthoc
from ltbench.results.predictions import save_predictions
from ltbench.results import code
from ltbench.results.provenance import git_state, modules_code, numerics, run_code, usable_cores
from ltbench.registry import POSTHOC
from ltbench.results.runspec import RunSpec
from ltbench.train.selection import headline



# ------------------------------------------------------------------------------------------------
# A finished run, frozen


def trained_method(config: dict, state: dict, class_counts: torch.Tensor, feature_dim: int):
    """The run's method with the final checkpoint's weights, in eval mode (no data, no backbone needed)."""
    ctx = MethodContext(len(class_counts), class_counts, feature_dim, config["optim"]["epochs"])
    with torch.random.fork_rng(devices=[]):  # initialisation draws must not move the caller's RNG
        method = create_method(config["method"], ctx)
    prefix = "method."
    method.load_state_dict({k[len(prefix):]: v for k, v in state["model"].items() if k.startswith(prefix)})
    method.load_extra_state(state.get("method_extra", {}))
    return method.eval()


def load_frozen(run_dir: Path) -> FrozenRun:
    """A finished run with its cached features (extract them first: ``features.extract_features``)."""
    result = features.finished_result(run_dir)
    if not features.is_complete(run_dir, (features.read_meta(run_dir) or {}).get("dtype", "float32")):
        raise LtbenchError(f"{run_dir}: the feature cache is incomplete or stale; run 'ltbench posthoc' to extract it")
    state = features.load_final_state(run_dir, result)
    config = result["config"]
    splits = {}
    for name in features.cached_splits(config):
        arrays = features.load_split(run_dir, name)
        spaces = {k: torch.from_numpy(v) for k, v in arrays.items() if k not in features.RESERVED_ARRAYS}
        splits[name] = SplitInputs(torch.from_numpy(arrays["features"]), torch.from_numpy(arrays["labels"]), spaces)
    if not isinstance(result.get("data"), dict) or not result["data"].get("class_counts_train"):
        raise LtbenchError(f"{Path(run_dir) / store.RESULT}: no data.class_counts_train (a stage-2 fit needs the "
                           f"training counts); run it again with 'ltbench run'")
    counts = torch.as_tensor(result["data"]["class_counts_train"], dtype=torch.long)
    check_splits_agree(run_dir, splits, len(counts))
    try:
        method = trained_method(config, state, counts, splits["train"].features.shape[1])
    except (RuntimeError, ValueError) as exc:  # load_state_dict: the features do not fit the checkpoint's method
        raise store.UnusableFile(Path(run_dir) / features.FEATURES_DIR,
                                     f"does not fit the run's checkpoint ({str(exc).splitlines()[0][:160]})") from None
    check_spaces_declared(run_dir, splits["train"], method)
    return FrozenRun(result["run_id"], config, counts, method, splits)


def check_spaces_declared(run_dir: Path, train: SplitInputs, method) -> None:
    """The cache holds exactly the feature spaces the run's method declares (``Method.feature_spaces``):
    a cache extracted before a method declared a space, or with one it no longer declares, is unusable
    (set aside and extracted again), never read as if it matched."""
    declared, cached = sorted(features.declared_spaces(method)), sorted(train.spaces)
    if declared != cached:
        raise store.UnusableFile(Path(run_dir) / features.FEATURES_DIR / features.split_file("train"),
                                     f"holds the feature spaces [{', '.join(cached)}], the run's method declares "
                                     f"[{', '.join(declared)}]")


def check_splits_agree(run_dir: Path, splits: dict[str, SplitInputs], num_classes: int) -> None:
    """Every split of one cache has the same feature width, the same feature spaces of the same widths, and
    labels that are class indices."""
    folder = Path(run_dir) / features.FEATURES_DIR
    width = splits["train"].features.shape[1]
    space_widths = {k: v.shape[1] for k, v in splits["train"].spaces.items()}
    for name, inputs in splits.items():
        path = folder / features.split_file(name)
        if inputs.features.shape[1] != width or {k: v.shape[1] for k, v in inputs.spaces.items()} != space_widths:
            raise store.UnusableFile(path, f"features of width {inputs.features.shape[1]}, the training split's "
                                               f"are {width}")
        if len(inputs.labels) and (int(inputs.labels.min()) < 0 or int(inputs.labels.max()) >= num_classes):
            raise store.UnusableFile(path, f"labels outside 0..{num_classes - 1}")


# ------------------------------------------------------------------------------------------------
# Evaluation: the same core and the same metrics as engine.evaluate


def checked_scores(clf, inputs: SplitInputs, prior: torch.Tensor, name: str) -> np.ndarray:
    """argmax of the stage-2 scores, after the shape and finiteness checks runs get too."""
    with torch.no_grad():
        scores = clf.predict(inputs, target_prior=prior)
    k = clf.num_classes
    if not isinstance(scores, torch.Tensor) or tuple(scores.shape) != (len(inputs), k):
        raise LtbenchError(f"posthoc '{name}': predict() must return a tensor of shape ({len(inputs)}, {k})")
    if not bool(torch.isfinite(scores).all()):
        raise LtbenchError(f"posthoc '{name}': predict() returned non-finite scores")
    return scores.argmax(1).numpy()


def evaluate_posthoc(clf, frozen: FrozenRun, name: str) -> tuple[dict, dict]:
    """(metrics, prediction arrays) of a fitted stage-2 method: test set under the uniform prior, every
    eval.target_priors (per-class accuracy of the prior-adapted prediction), every eval.test_sets."""
    ev = from_dict(EvalConfig, frozen.config.get("eval", {}), "eval")
    counts, k = frozen.class_counts.numpy(), frozen.num_classes
    test = frozen.splits["test"]
    pred = checked_scores(clf, test, torch.full((k,), 1.0 / k), name)
    metrics = summarize(pred, test.labels.numpy(), counts, ev.many_threshold, ev.few_threshold)
    arrays = {"labels": test.labels.numpy(), "head:main": pred}
    priors = target_prior_metrics(
        ev.target_priors, counts, test.labels.numpy(),
        lambda prior: checked_scores(clf, test, torch.as_tensor(prior, dtype=torch.float32), name),
        ev.many_threshold, ev.few_threshold)
    if priors:
        metrics["target_priors"] = priors
    sets = {}
    for set_name in ev.test_sets:
        inputs = frozen.splits[f"test_set:{set_name}"]
        labels = inputs.labels.numpy()
        prior = torch.as_tensor(label_prior(labels, k), dtype=torch.float32)
        set_pred = checked_scores(clf, inputs, prior, name)
        arrays[f"set:{set_name}:labels"], arrays[f"set:{set_name}:head:main"] = labels, set_pred
        sets[set_name] = {"size": int(len(labels)), **headline(summarize(set_pred, labels, counts, ev.many_threshold,
                                                                          ev.few_threshold))}
    if sets:
        metrics["test_sets"] = sets
    if "val" in frozen.splits:  # the score `ltbench table --select val` chooses settings by
        val = frozen.splits["val"]
        val_pred = checked_scores(clf, val, torch.full((k,), 1.0 / k), name)
        summary = summarize(val_pred, val.labels.numpy(), counts, ev.many_threshold, ev.few_threshold)
        metrics["val"] = {**headline(summary), "per_class": summary["per_class"], "size": int(len(val))}
    return metrics, arrays


# ------------------------------------------------------------------------------------------------
# One stage-2 result


def plugin_code(name: str, run_config: dict | None = None) -> dict:
    """{module: {path, sha256, normalized}} of every module a stage-2 fit executes: the stage-2 driver (with the
    feature cache and the engine it builds the run with), the stage-2 plugin, and the run's own plugins
    (``provenance.run_code``); ``identity.code_state`` compares them with the files now, so any code change
    to that computation, and no docstring or comment edit, makes its results stale."""
    roots = (code.STAGE2_ROOT, POSTHOC.entry(name).module)
    if run_config is None:
        return modules_code(list(roots), with_bytes=False)
    return run_code(run_config, roots, with_bytes=False)


def stage2_numerics(dtype: str) -> dict:
    """The numerics of a stage-2 fit (``provenance.numerics``): on the CPU, the one thread
    ``_posthoc_claimed_run`` sets for the whole grid, and the feature cache's dtype named as a run's precision
    (float32 features: 'fp32'), so a stage-2 row and its run's row read alike when made alike."""
    return numerics(torch.device("cpu"), precision={"float32": "fp32", "float16": "fp16"}.get(dtype, dtype),
                    threads_from="stage 2 fits with one thread")


def stage2_record(run_result: dict, spec: dict, meta: dict, provenance: dict) -> dict:
    """The header of a stage-2 result: what was fitted on what (docs/results-schema.md)."""
    config = {**run_result["config"], "posthoc": spec}
    return {"schema_version": schema.SCHEMA_VERSION, "identity_version": identity.IDENTITY_VERSION, "kind": "posthoc",
            "run_id": identity.stage2_run_id(run_result["run_id"], spec), "posthoc_of": run_result["run_id"],
            "posthoc": spec, "recipe": run_result.get("recipe"), "grid": run_result.get("grid") or {},
            "config": config, "seed": run_result.get("seed"), "data": run_result.get("data"),
            "features": {k: meta.get(k) for k in ("checkpoint_sha256", "dtype", "view")},
            "code": plugin_code(spec["name"], run_result["config"]), "code_scope": code.CODE_SCOPE,
            "numerics": stage2_numerics(str(meta.get("dtype"))), "plugins": run_result.get("plugins") or [],
            "method_display": run_result["method_display"],  # its run's method, as named
            # a stage-2 result does not count its stage-1 run's cost: a row of it has none (schema.cost_problem)
            "device_seconds": None, "unrecorded": ["device_seconds"] + [u for u in run_result["unrecorded"]
                                                                       if u == "method_display"],
            "code_source": None, "provenance": provenance, "started": time.time()}


def fit_and_record(frozen: FrozenRun, run_result: dict, spec: dict, meta: dict, out_dir: Path,
                   provenance: dict) -> str:
    """Fit one stage-2 setting, evaluate it, write its result.json (and predictions.npz); 'done' or 'failed'.
    A failing setting is recorded as failed and never stops the grid."""
    record = stage2_record(run_result, spec, meta, provenance)
    store.make_dirs(out_dir)
    t0 = time.perf_counter()
    try:
        clf = create_posthoc(spec, frozen, seed=int(run_result["config"].get("seed", 0)))
        fitted = time.perf_counter()
        metrics, arrays = evaluate_posthoc(clf, frozen, spec["name"])
        save_predictions(out_dir, arrays, frozen.num_classes)
        record.update(status="done", metrics=metrics, method_extras=clf.result_extras(),
                      fit_seconds=fitted - t0, eval_seconds=time.perf_counter() - fitted)
    except (OSError, DiskFullError) as exc:  # an I/O fault is no property of the setting: not stored, retried
        raise_io_fault(out_dir, exc)
    except LtbenchError as exc:
        record.update(status="failed", error=str(exc), error_type=type(exc).__name__, traceback_file=None)
    except Exception as exc:  # a plugin's own bug: kept with its traceback, the grid goes on
        record.update(status="failed", error=f"{type(exc).__name__}: {exc}", error_type=type(exc).__name__,
                      traceback=traceback.format_exc(), traceback_file=None)
    record["ended"] = time.time()
    record["wall_seconds"] = record["ended"] - record["started"]
    try:
        write_compact_json(out_dir / store.RESULT, record)
    except (OSError, DiskFullError) as exc:
        raise_io_fault(out_dir, exc)
    return record["status"]


IO_ERRORS = ("OSError", "DiskFullError", "PermissionError", "WriteError")  # error_type of a failure that is retried


def raise_io_fault(out_dir: Path, exc: BaseException) -> NoReturn:
    """Raise the fault as one line naming the file: the caller skips the run's remaining settings and says so;
    nothing is recorded for this setting, so the next 'ltbench posthoc' fits it again."""
    where = getattr(exc, "filename", None) or out_dir
    reason = getattr(exc, "strerror", None) or str(exc)
    raise LtbenchError(f"I/O error writing {where} ({reason}); nothing was recorded for this setting, "
                       f"run 'ltbench posthoc' again once the cause is fixed")


def write_compact_json(path: Path, record: dict) -> None:
    """result.json without indentation: a stage-2 grid writes hundreds per run (6.5 KB indented, 4.3 KB not)."""
    text = json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n"
    store.atomic_write_bytes(path, text.encode())


# ------------------------------------------------------------------------------------------------
# A run's grid, and a recipe's


def pending_settings(run_dir: Path, specs: list[dict], checkpoint_sha256: str, redo_failed: bool = False,
                     redo_stale: bool = False, stale: list | None = None,
                     say: Callable[[str], None] = print) -> list[dict]:
    """The settings of ``specs`` without a usable result below RUN_DIR/posthoc: failed ones count as done
    unless ``redo_failed``; damaged ones, and results fitted on another checkpoint's features (the run was
    trained again), are set aside (``result.json.damaged`` / ``.stale``) and redone. Results whose stage-2
    plugin code has changed since (``identity.changed_code``) are set aside and redone with ``redo_stale``,
    else kept and appended to ``stale``, so the caller says so.

    Not ``status_rule.run_state``: a stage-2 setting is another object than a run (no started.json, so no running
    or interrupted state; one lock for the whole grid of a run; stale also when fitted on another checkpoint).
    It is decided from the same pieces: ``store.check_result`` and ``identity.changed_code``."""
    todo = []
    for spec in specs:
        out = Path(run_dir) / store.POSTHOC_DIR / identity.posthoc_id(spec)
        check = store.check_result(out)
        if check.state == "unusable":
            moved = store.set_aside(out / store.RESULT)
            say(f"{Path(run_dir).name}: stage-2 {out.name}: {check.reason}; moved it to {moved.name}, fitting it again")
        elif check.usable and (check.result.get("features") or {}).get("checkpoint_sha256") != checkpoint_sha256:
            store.set_aside(out / store.RESULT, "stale")
        elif check.state == "done" and identity.changed_code(check.result)[0]:
            if not redo_stale:
                if stale is not None:
                    stale.append(spec)
                continue
            store.set_aside(out / store.RESULT, "stale")
        elif check.state == "failed" and check.result.get("error_type") in IO_ERRORS:
            store.set_aside(out / store.RESULT, "io-error")  # recorded by an older ltbench: retried
        elif check.state == "done" or (check.state == "failed" and not redo_failed):
            continue
        todo.append(spec)
    return todo


def posthoc_one_run(run_dir: str, specs: list[dict], dtype: str = "float32", redo_failed: bool = False,
                    threads: int = 0, plugins: tuple[str, ...] = (), say: Callable[[str], None] = print,
                    redo_stale: bool = False) -> dict[str, int]:
    """Features (when missing), then every pending setting of one finished run, under the run's
    stage-2 lock. Returns counts: done, failed, already (found done before; 'stale' of them were made by
    stage-2 code that has changed since and are kept unless ``redo_stale``), busy (locked elsewhere).
    A worker process gets the plugin folders the recipe imported (``plugins``)."""
    if threads:
        torch.set_num_threads(threads)
    registry.add_plugin_paths(list(plugins))
    run_dir = Path(run_dir)
    try:
        folder = run_dir / store.POSTHOC_DIR
        if os.path.lexists(folder) and (folder.is_symlink() or not folder.is_dir()):
            say(f"{run_dir.name}: {store.POSTHOC_DIR} was not a folder; moved it to {store.set_aside(folder).name}")
        store.make_dirs(folder)
        claim = store.claim_run(folder)
        if claim is None:
            say(f"{run_dir.name}: skipped: another process is running its stage-2 grid")
            return {"busy": len(specs)}
        with claim:
            return _posthoc_claimed_run(run_dir, specs, dtype, redo_failed, say, redo_stale)
    except Exception as exc:  # this run only: the others go on, whatever --jobs is
        why = str(exc) if isinstance(exc, LtbenchError) else (  # a refused write names its file, never 'internal'
            f"{exc.filename or ''}: {exc.strerror or exc}" if isinstance(exc, OSError)
            else f"internal error: {type(exc).__name__}: {exc}")
        say(f"{run_dir.name}: SKIPPED: {why}")
        return {"skipped": 1, "skipped_runs": [f"{run_dir.name}: {why}"]}


def frozen_with_usable_cache(run_dir: Path, dtype: str, say: Callable[[str], None]) -> tuple[dict, FrozenRun]:
    """(meta, frozen run); a cache whose content proves unusable on loading is set aside and extracted once more."""
    for attempt in (1, 2):
        meta = features.extract_features(run_dir, dtype, say)
        try:
            return meta, load_frozen(run_dir)
        except store.UnusableFile as exc:
            if attempt == 2:
                raise
            moved = store.set_aside(run_dir / features.FEATURES_DIR)
            say(f"{run_dir.name}: the feature cache is unusable ({exc}); moved it to {moved.name} and extracting "
                f"the features again")
    raise AssertionError("unreachable")


def _posthoc_claimed_run(run_dir: Path, specs: list[dict], dtype: str, redo_failed: bool,
                         say: Callable[[str], None], redo_stale: bool = False) -> dict[str, int]:
    """posthoc_one_run's work once the run's stage-2 lock is held."""
    meta = features.extract_features(run_dir, dtype, say)
    stale: list[dict] = []
    todo = pending_settings(run_dir, specs, meta["checkpoint_sha256"], redo_failed, redo_stale, stale, say)
    counts = {"already": len(specs) - len(todo), "done": 0, "failed": 0, **({"stale": len(stale)} if stale else {})}
    if not todo:
        return counts
    meta, frozen = frozen_with_usable_cache(run_dir, dtype, say)
    result = features.finished_result(run_dir)
    provenance = git_state(Path(__file__).resolve().parent.parent)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)  # stage-2 tensors are small: more threads cost more than they give
    try:                      # (benchmarks/posthoc_grid.py: 7x slower with 2 threads on a loaded machine)
        for spec in todo:
            status = fit_and_record(frozen, result, spec, meta, run_dir / store.POSTHOC_DIR / identity.posthoc_id(spec),
                                    provenance)
            counts[status] += 1
    finally:
        torch.set_num_threads(threads_before)
    say(f"{run_dir.name}: {counts['done']} stage-2 setting(s) done, {counts['failed']} failed, "
        f"{counts['already']} already there")
    return counts


def unfinished_runs(runs: list[RunSpec]) -> list[tuple[RunSpec, str]]:
    """(run spec, status) of every run of the recipe that is not done: reported, never silently skipped."""
    out = []
    for spec in runs:
        state = status_rule.run_status(Path(spec.run_dir))
        if state not in store.FINISHED:  # a stale run's model is still its own: stage 2 fits on it
            out.append((spec, state))
    return out


def finish_hint(state: str) -> str:
    """What makes an unfinished run usable for stage 2 (each hint is followed in tests/test_hints.py):
    a failed run is skipped by a plain 'ltbench run', so its hint names --rerun-failed."""
    if state == "failed":
        return "run it again with 'ltbench run RECIPE --rerun-failed', then run this again"
    if state == "running":
        return "run this again when it has finished ('ltbench status RECIPE')"
    return "'ltbench run RECIPE' runs (or resumes) it; then run this again"


def ready_run_dirs(runs: list[RunSpec], say: Callable[[str], None] = print) -> tuple[list[str], dict[str, int]]:
    """The folders of the finished runs among ``runs``, and {'unfinished': n}; each unfinished run is named."""
    missing = unfinished_runs(runs)
    for spec, state in missing:
        say(f"{spec.run_id} ({spec.config['method']['name']}, seed {spec.seed}) is {state}: "
            f"no stage-2 results for it; {finish_hint(state)}")
    unfinished_ids = {spec.run_id for spec, _ in missing}
    return [s.run_dir for s in runs if s.run_id not in unfinished_ids], {"unfinished": len(missing)}


def add_counts(totals: dict[str, int], counts: dict[str, int]) -> dict[str, int]:
    for key, value in counts.items():
        totals[key] = totals.get(key, type(value)()) + value  # counts, and lists of skipped runs
    return totals


def _worker_counts(future, run_dir: str, say: Callable[[str], None]) -> dict:
    """A worker's counts; a worker that died (killed, out of memory) skips its run, never the others."""
    try:
        return future.result()
    except Exception as exc:
        why = f"its worker process ended ({type(exc).__name__}: {exc})"
        say(f"{Path(run_dir).name}: SKIPPED: {why}")
        return {"skipped": 1, "skipped_runs": [f"{Path(run_dir).name}: {why}"]}


def run_posthoc(runs: list[RunSpec], specs: list[dict], jobs: int = 1, dtype: str = "float32",
                redo_failed: bool = False, say: Callable[[str], None] = print, redo_stale: bool = False) -> dict[str, int]:
    """The stage-2 grid ``specs`` over every finished run of ``runs`` (recipe run specs), ``jobs`` runs at a
    time (worker processes with cores/jobs torch threads each). Returns summed counts, 'unfinished' included."""
    ready, totals = ready_run_dirs(runs, say)
    if jobs <= 1 or len(ready) <= 1:
        results = [posthoc_one_run(d, specs, dtype, redo_failed, say=say, redo_stale=redo_stale) for d in ready]
    else:
        threads = max(1, usable_cores() // jobs)  # the cores this process may use, not the machine's
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            plugins = tuple(registry.plugin_paths())
            futures = [pool.submit(posthoc_one_run, d, specs, dtype, redo_failed, threads, plugins, print, redo_stale)
                       for d in ready]
            results = [_worker_counts(f, d, say) for f, d in zip(futures, ready)]
    for counts in results:
        add_counts(totals, counts)
    return totals
