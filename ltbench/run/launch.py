"""Launchers: decide which runs still need doing (from disk) and hand their specs to workers.

Every launcher ends in ``runner.run_one(spec)``; only where it runs differs. Several launches of
one recipe may run at once (two terminals, a relaunch while a pool still runs, a Slurm array next
to a local run): each run's lock decides who trains it, the others skip it and say so.
The worker processes of this machine are ``ltbench.run.local_pool``'s; ``ltbench status`` is
``ltbench.run.run_status_view``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from ltbench.run import local_pool
from ltbench import report
from ltbench.results import identity, status_rule, store
from ltbench.data.validation import check_disjoint, declares_validation
from ltbench.errors import ConfigError, LtbenchError
from ltbench.run.local_pool import gpu_slots, pool_size, run_local, run_pool, sigterm_as_interrupt
from ltbench.recipe import Recipe, distinct_data, load_recipe, run_label
from ltbench.registry import BACKBONES, DATASETS, Registry, call_plugin
from ltbench.search import SAMPLERS
from ltbench.run.screen import for_terminal, say
from ltbench.run.runlines import check_results_root, other_data_note, run_lines
from ltbench.runner import prepare_run_dir
from ltbench.train.loggers import check_loggers
from ltbench.results.runspec import RunSpec


def preflight(recipe: Recipe) -> None:
    """Stop before any run starts when a dataset is missing (one message, not one per run) or a logger cannot
    start (``loggers.check_loggers``), or a dataset could give no benchmark: fewer than two classes by what its
    ``footprint()`` declares, or, when it declares nothing, by what ``load()`` returns (``check_loaded``). The
    dataset's constructor and hooks are plugin code: contained (``registry.call_plugin``)."""
    from ltbench.data.base import check_loaded  # lazy: keeps --help fast
    from ltbench.data.footprints import footprint_of  # lazy: keeps --help fast

    check_loggers(recipe.runs)
    for spec in distinct_data(recipe.runs):
        label = DATASETS.label(spec.config["data"]["name"])
        builder = call_plugin(label, "its constructor", DATASETS.build, spec.config["data"], where="data")
        check = getattr(builder, "check", None)
        if callable(check):
            call_plugin(label, "check()", check)
        declared = call_plugin(label, "footprint()", footprint_of(builder))
        if declared is None:
            check_loaded(call_plugin(label, "load()", builder.load), label)
        elif declared.num_classes < 2:
            raise LtbenchError(f"data: {label}: footprint() declares {declared.num_classes} class(es); expected at "
                               f"least 2; fix the dataset's options or its footprint()")
        if declares_validation(spec.config["data"]):  # no validation sample is a test sample (docs/protocol.md)
            check_disjoint(call_plugin(label, "split_ids()", builder.split_ids), f"data: {label}")


def runs_to_launch(recipe: Recipe, redo: tuple[str, ...] = ()) -> tuple[list[RunSpec], dict[str, int]]:
    """Runs to launch now, and the count of each status found on disk (``status_rule.run_status``, the one rule;
    ``status_rule.to_run`` decides from it). ``redo``: 'failed' and/or 'stale' results to run again. The worker
    re-decides under the run's lock, so a run another process finishes meanwhile is not trained twice. Not
    read-only: a run folder whose spec.json is missing gets it written again (``runner.prepare_run_dir``)."""
    statuses, out = [], []
    for spec in recipe.runs:
        run_dir = Path(spec.run_dir)
        if run_dir.is_dir() and not (run_dir / store.SPEC).exists():
            prepare_run_dir(spec)  # a deleted spec.json is rewritten, whatever the run's state
        status = status_rule.run_status(run_dir)
        if status in ("done", store.CODE_UNKNOWN) and "checkpoint" in redo and set_aside_without_checkpoint(run_dir):
            status = "no checkpoint"
        statuses.append(status)
        if status_rule.to_run(status, redo):
            out.append(spec)
    return out, store.count_statuses(statuses)


def set_aside_without_checkpoint(run_dir: Path) -> bool:
    """--rebuild-checkpoints: a done run whose checkpoint.pt is not its final model (gone, truncated, foreign)
    has its result moved to result.json.no-checkpoint, so the run trains again and writes both anew."""
    from ltbench.stage2.features import final_checkpoint_problem  # lazy: keeps status free of torch

    problem = final_checkpoint_problem(run_dir)
    if not problem:
        return False
    moved = store.set_aside(run_dir / store.RESULT, "no-checkpoint")
    print(f"  {run_dir.name}: {problem}; moved its result to {moved.name}: it is trained again")
    return True


def checks_before_any_run(recipe: Recipe) -> None:
    """Every check a launch makes before the first run, in one place, so ``--dry-run`` refuses exactly what
    ``run`` refuses: the launcher settings against the GPUs torch sees, loggers and datasets (``preflight``),
    weights files (``check_weights``), and the memory the configurations ask for (``ltbench.train.resources``)."""
    from ltbench.train import resources  # lazy: keeps status and table free of torch (the meta-device models)
    from ltbench.recipe.expansion import cached_estimates, save_estimates  # lazy: keeps --help fast

    if recipe.probes:  # a sampler that asks: its draws are unknown yet, its probes span them (recipe._study)
        recipe = dataclasses.replace(recipe, runs=recipe.probes + recipe.runs)
    check_runs_per_gpu(recipe)
    preflight(recipe)  # before the results folder is made: a missing dataset leaves no empty results/<recipe>/ behind
    check_weights([spec.config for spec in recipe.runs])  # each weights file once: readable, fitting, finite
    signature, known = cached_estimates(recipe.plugins)
    known_before = resources.known_estimates(known)
    resources.check_recipe(recipe)
    if resources.known_estimates() != known_before:
        save_estimates(signature, resources.known_estimates())


def check_weights(configs: list[dict]) -> None:
    """Each distinct weights file of these run configurations checked once by its backbone (the Backbone hook
    ``check_weights(config)``: readable, fitting, finite), before the first run; a backbone whose configuration
    names no weights file (no ``backbone_identity``) has nothing to check."""
    seen = set()
    for config in configs:
        ask = getattr(BACKBONES.get(config["backbone"]["name"]), "check_weights", None)
        key = (config.get(identity.BACKBONE_IDENTITY), repr(sorted((k, str(v)) for k, v in config["backbone"].items())))
        if key[0] and callable(ask) and key not in seen:
            seen.add(key)
            ask(BACKBONES.config(config["backbone"], "backbone"))


def print_plan(recipe: Recipe) -> int:
    """``--dry-run``: every check a real launch makes before training (recipe, results folder, launcher,
    loggers, data present, memory), then one line per run that names everything in which it differs from
    the others."""
    check_results_root(recipe.root)
    checks_before_any_run(recipe)
    lines = run_lines(recipe.runs, recipe.override_keys)
    if recipe.studies:  # a sampler that asks: its runs are the trials its state holds so far
        progress = SAMPLERS[recipe.found.config.sampler].module("runner").progress_line(recipe)
        print(f"recipe {recipe.name}: {progress}; {len(recipe.runs)} run(s) drawn so far -> {recipe.root}")
    else:
        print(f"recipe {recipe.name}: {len(recipe.runs)} run(s) -> {recipe.root}")
    for text in recipe.search:
        print(text)
    for spec, line in zip(recipe.runs, lines):
        status = status_rule.run_status(Path(spec.run_dir))
        print(f"  {spec.run_id}  {status:<{store.STATUS_WIDTH}} {line}")
    changed = other_data_note(recipe.root, recipe.runs)
    if changed:
        print(changed)
    return 0


def _announce(recipe: Recipe, specs: list[RunSpec], found: dict[str, int], redo: tuple[str, ...]) -> None:
    finished = found.get("done", 0) + found.get(store.CODE_UNKNOWN, 0) \
        + sum(found.get(s, 0) for s in ("failed", "stale") if s not in redo)
    say(f"recipe {recipe.name}: {len(recipe.runs)} run(s), {len(specs)} to run, {finished} already finished "
        f"(results in {recipe.root})")
    if found.get("failed") and "failed" not in redo:
        say(f"  {found['failed']} run(s) failed before and are not run again: see their errors with "
            f"'ltbench status {recipe.path}', and add --rerun-failed to run them again")
    if found.get("stale") and "stale" not in redo:
        say(f"  {found['stale']} finished run(s) were computed by code that has changed since; "
            f"add --rerun-stale to run them again")
    if found.get(store.CODE_UNKNOWN):
        say(f"  {found[store.CODE_UNKNOWN]} finished run(s) have code that cannot be checked (see 'ltbench status'); "
            f"they are not run again")
    if found.get("damaged"):
        say(f"  {found['damaged']} run(s) have an unusable result.json: they run again")
    if found.get("running"):
        say(f"  {found['running']} run(s) look busy in another process: skipped if they still are")
    changed = other_data_note(recipe.root, recipe.runs)
    if changed:
        say(f"  {changed}")


def launch(recipe: Recipe, rerun_failed: bool = False, wait: bool = False, rerun_stale: bool = False,
           rebuild_checkpoints: bool = False) -> dict[str, int]:
    """Run the recipe's runs; a search's report runs (stage 2) exist once its trials have ended, so after a
    launch that finished here the recipe is read again and launched on while it has new runs."""
    outcome = launch_once(recipe, rerun_failed, wait, rerun_stale, rebuild_checkpoints)
    while recipe.found is not None and (wait or recipe.launcher.name not in ("slurm",)):
        fresh = load_recipe(recipe.path, recipe.overrides, recipe.results_arg, where=recipe.where)
        plain = [s for s in fresh.runs if not (s.grid or {}).get("search")]
        if not runs_to_launch(dataclasses.replace(fresh, runs=plain))[0]:
            break
        say("\nthe search has chosen, by mean validation All over its tuning seeds: " + "; ".join(chosen_labels(fresh.runs))
            + "\nits report runs on fresh seeds (stage 2)")
        recipe = dataclasses.replace(fresh, runs=plain, studies=[], probes=[])
        outcome = launch_once(recipe, False, wait, False, False)
    return outcome


def chosen_labels(runs: list[RunSpec]) -> list[str]:
    """'la (trial 3/8 (optim.lr=0.05, ...))' for each search's chosen draw: the trial whose configuration, less
    its seed, is a report run's."""
    trials = {json.dumps({**s.config, "seed": None}, sort_keys=True): s for s in runs if (s.grid or {}).get("search")}
    picked = [trials.get(json.dumps({**s.config, "seed": None}, sort_keys=True)) for s in runs
              if not (s.grid or {}).get("search")]
    return list(dict.fromkeys(run_label(t) for t in picked if t is not None))


def launch_once(recipe: Recipe, rerun_failed: bool = False, wait: bool = False, rerun_stale: bool = False,
                rebuild_checkpoints: bool = False) -> dict[str, int]:
    redo = ("failed",) * rerun_failed + ("stale",) * rerun_stale + ("checkpoint",) * rebuild_checkpoints
    if recipe.studies:  # a sampler that asks: its workers ask its studies for trials (SearchSampler.runner)
        runner = SAMPLERS[recipe.found.config.sampler].module("runner")
        runner.refuse_redo(recipe, redo)
        checks_before_any_run(recipe)
        submit = None
        if recipe.launcher.name in ("slurm", "debug"):
            from ltbench.run import slurm  # lazy: keeps status and local launches free of submitit

            submit = slurm.submit_search
        return runner.launch(recipe, wait, submit)
    checks_before_any_run(recipe)
    store.refuse_older(recipe.root)
    store.ensure_writable(recipe.root)
    specs, found = runs_to_launch(recipe, redo)
    _announce(recipe, specs, found, redo)
    name = recipe.launcher.name
    gpus = local_pool.visible_gpus() if recipe.launcher.runs_per_gpu > 1 else []  # no torch import otherwise
    if name == "local" and pool_size(recipe.launcher.jobs, recipe.launcher.runs_per_gpu, gpus) > 1 and len(specs) > 1:
        name = "pool"
    elsewhere = LAUNCHERS.get(name)(recipe, specs, redo, wait)
    if elsewhere is None:  # submitted; results come later ('ltbench status' follows them)
        return {"failed": 0}
    report_elsewhere(elsewhere)
    return print_summary(recipe)


# A launcher takes (recipe, specs to run, redo, wait) and returns the specs another process was
# running (skipped here), or None when the runs were only submitted and finish later. Every one ends
# in runner.run_one(spec); only where it runs differs (DomainBed's ``command_launchers``). The table is
# the core's own (no plugin discovery); 'pool' is chosen by 'local', the others by launcher.name.
LAUNCHERS = Registry("launcher", None, hint_cutoff=0.0)


@LAUNCHERS.register("local")
def launch_local(recipe: Recipe, specs: list[RunSpec], redo: tuple[str, ...], wait: bool) -> list[RunSpec]:
    """One run after another in this process."""
    with sigterm_as_interrupt():
        return run_local(specs, 1, redo)


@LAUNCHERS.register("pool")
def launch_pool(recipe: Recipe, specs: list[RunSpec], redo: tuple[str, ...], wait: bool) -> list[RunSpec]:
    """``launcher.jobs`` worker processes on this machine, or ``runs_per_gpu`` per visible GPU (chosen by
    'local' when that is more than one)."""
    gpus = local_pool.visible_gpus()
    workers = pool_size(recipe.launcher.jobs, recipe.launcher.runs_per_gpu, gpus)
    with sigterm_as_interrupt():
        return run_pool(specs, workers, redo, gpu_slots(workers, gpus))


@LAUNCHERS.register("slurm")
def launch_slurm(recipe: Recipe, specs: list[RunSpec], redo: tuple[str, ...], wait: bool) -> list[RunSpec] | None:
    """Job arrays on a Slurm cluster through submitit; with ``wait``, until every run has a result."""
    from ltbench.run import slurm  # lazy: keeps status and local launches free of submitit

    slurm.submit(recipe, specs, wait=wait, redo=redo)
    return [] if wait else None


@LAUNCHERS.register("debug")
def launch_debug(recipe: Recipe, specs: list[RunSpec], redo: tuple[str, ...], wait: bool) -> list[RunSpec] | None:
    """submitit's debug executor: the same job arrays as 'slurm', run in this process (all chunks)."""
    from ltbench.run import slurm  # lazy: keeps status and local launches free of submitit

    for job in slurm.submit_arrays(recipe, specs, "debug", redo):
        job.result()  # the debug executor runs a job when its result is asked for
    return [] if wait else None


def launch_posthoc(recipe: Recipe, jobs: int | None = None, dtype: str = "float32",
                   redo_failed: bool = False, redo_stale: bool = False) -> dict[str, int]:
    """``ltbench posthoc`` through the recipe's launcher: 'local' fits the stage-2 grid here (``jobs`` runs at a
    time); 'slurm' submits one array task per finished run and returns (run the command again, or
    ``ltbench table``, once they end: stored settings are skipped); 'debug' runs those tasks in this process.
    Returns summed counts ('unfinished', 'done', 'failed', 'already', 'busy'; 'submitted' on Slurm)."""
    from ltbench.stage2.posthoc_runs import add_counts, ready_run_dirs, run_posthoc  # lazy: keeps status free of torch

    name = recipe.launcher.name
    if recipe.root.is_dir():  # stage 2 writes beside every run: a read-only root is one line, not one per run
        store.refuse_older(recipe.root)
        store.ensure_writable(recipe.root)
    if name not in ("slurm", "debug"):
        return run_posthoc(recipe.runs, recipe.posthoc, jobs or recipe.launcher.jobs, dtype, redo_failed,
                           redo_stale=redo_stale)
    from ltbench.run import slurm  # lazy: keeps status and local launches free of submitit

    if name == "slurm":
        slurm.require_sbatch()
    run_dirs, totals = ready_run_dirs(recipe.runs)
    submitted = slurm.submit_posthoc(recipe, run_dirs, recipe.posthoc, name, dtype, redo_failed, redo_stale)
    if name == "slurm":
        return {**totals, "submitted": len(run_dirs)}
    for job in submitted:  # the debug executor runs a task when its result is asked for
        add_counts(totals, job.result())
    return totals


def report_elsewhere(specs: list[RunSpec]) -> None:
    """Say what became of the runs another process was running when this one reached them."""
    if not specs:
        return
    states = [status_rule.run_status(Path(s.run_dir)) for s in specs]
    parts = store.format_counts(store.count_statuses(states))
    say(f"\n{len(specs)} run(s) were being run by another process: now {parts}"
          + ("; 'ltbench status' follows them" if any(s in ("running", "pending") for s in states) else ""))


def check_runs_per_gpu(recipe: Recipe) -> None:
    """``launcher.runs_per_gpu`` > 1 takes effect or is refused: it needs the local launcher, visible GPUs,
    and no conflicting ``jobs`` (the pool size is then GPUs x runs_per_gpu)."""
    cfg = recipe.launcher
    if cfg.runs_per_gpu == 1:
        return
    where = f"{recipe.path}: launcher.runs_per_gpu"
    if cfg.name != "local":
        raise ConfigError(f"{where}: {cfg.runs_per_gpu} applies to the local launcher only (launcher.name is "
                          f"{cfg.name}); on Slurm set launcher.gpus_per_node, or remove runs_per_gpu")
    gpus = local_pool.visible_gpus()
    if not gpus:
        raise ConfigError(f"{where}: {cfg.runs_per_gpu} needs GPUs, but torch sees none here "
                          f"(torch.cuda.is_available() is False); on CPU use launcher.jobs (or --jobs) instead")
    if cfg.jobs not in (1, len(gpus) * cfg.runs_per_gpu):
        raise ConfigError(f"{where}: {cfg.runs_per_gpu} runs on each of {len(gpus)} GPU(s) makes "
                          f"{len(gpus) * cfg.runs_per_gpu} workers, but launcher.jobs (or --jobs) asks for {cfg.jobs}; "
                          f"set one of the two")


def print_summary(recipe: Recipe) -> dict[str, int]:
    """After a launch: the recipe's tables exactly as ``ltbench table RECIPE`` (same overrides, same --results)
    prints them, and the status counts; returns the counts. A table that cannot be built now is said in
    one line: the runs themselves are done, and their exit status is theirs."""
    counts = store.count_statuses(status_rule.run_status(Path(spec.run_dir)) for spec in recipe.runs)
    try:
        text = report.recipe_tables_text(recipe)
    except LtbenchError as exc:
        text = f"(the tables cannot be built: {exc}; 'ltbench table {recipe.path}' shows them once fixed)"
    if text:  # markdown in a file or a pipe, ANSI bold and underline on a terminal
        print()
        print(for_terminal(text) if sys.stdout.isatty() else text)
    say(f"\n{store.format_counts(counts)}")
    if counts.get("failed"):
        say(f"see the errors with 'ltbench status {recipe.path}'; add --rerun-failed to run the failed runs again")
    if counts.get("interrupted"):  # an I/O fault stopped a pool worker's run (its worker.log says which file)
        say(f"to resume the interrupted runs once their cause is fixed: ltbench run {recipe.path}")
    return counts
