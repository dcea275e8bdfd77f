"""Running a tpe search: workers that ask Optuna's studies for trials, train each as an ordinary run, and tell.

Every launch of the recipe (terminals, ``--jobs N``, Slurm array tasks) runs ``work``: under the search's lock
(``LOCK``, an flock beside the journal) it first takes over a trial left RUNNING by a launch that died, else
asks a new one (never past ``trials``), trains it through ``runner.run_one`` and tells the study the run's
validation All. So each trial is asked once, trained once (the run's lock) and told once.

A killed launch's trial is resumed from its run's last checkpoint, not failed and asked again, so the study
keeps exactly the trials it asked (TPE's later draws depend on them); a trial whose run had finished is told
from its result. A pruned trial's run is recorded failed (``TrialPruned``); the study says PRUNED.
docs/tuning.md.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from ltbench import report
from ltbench.errors import ConfigError, LtbenchError
from ltbench.recipe import Recipe, asked_trial_spec, load_recipe
from ltbench.recipe import tpe
from ltbench.recipe.trials import Study
from ltbench.results import store
from ltbench.run.local_pool import gpu_slots, sigterm_as_interrupt, visible_gpus, worker_env
from ltbench.run.screen import say
from ltbench.runner import CLAIMED, run_one
from ltbench.search import SAMPLERS
from ltbench.seeding import derive_seed

LOCK = "search-tpe.lock"  # not the journal's name + '.lock': Optuna's own journal lock is that file


class TrialPruned(LtbenchError):
    """Raised from a trial's per-epoch callback when its study prunes it: the run is recorded failed with
    this message, and the worker tells the study PRUNED."""


def search_lock(root: Path):
    """The search's flock (held while a worker looks at the studies and asks, takes over or tells a trial)."""
    return store.lock_file(Path(root) / LOCK)


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (field 22 of /proc/<pid>/stat, in clock ticks since boot), or None
    when there is no such process here (or no /proc). A pid names a process only together with it: the kernel
    reuses pids."""
    try:
        text = store.read_bounded(f"/proc/{int(pid)}/stat", 4096, follow=True).decode("ascii", "replace")
    except (store.UnusableFile, ValueError):
        return None
    fields = text[text.rfind(")") + 2:].split()  # after the command name, which may hold spaces: field 3 on
    return fields[19] if len(fields) > 19 else None


def me() -> dict:
    """This worker as a trial's owner: host, pid and the pid's start time."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": process_start(os.getpid())}


def owner_gone(owner: object) -> bool:
    """Whether a trial's recorded owner is certainly not running it: on this host, no process has its pid, or
    the process that has it started at another time (the pid was reused). An owner on another host, or one
    recorded without a start time, counts as gone: the run's own lock then decides (store.claim_run)."""
    if not isinstance(owner, dict) or owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
        return True
    start = owner.get("start")
    return start is None or process_start(owner["pid"]) != start


def load_study(optuna, storage, study: Study, recipe: Recipe, number: int):
    """The study (created on first use) with a TPE sampler seeded for its trial ``number``: the seed of each
    ask is a function of (search seed, study, trial number), so one worker's draws repeat across restarts.
    The first ``SearchSampler.startup`` trials (Optuna's default, 10) are TPE's random start: below 20 trials
    fewer than half are guided, and --dry-run and the caption say TPE is random search at that budget;
    constant_liar keeps concurrent workers from asking the same point."""
    c = recipe.found.config
    sampler = optuna.samplers.TPESampler(seed=derive_seed("tpe", c.seed, study.name, number) % 2**32,
                                         n_startup_trials=SAMPLERS[c.sampler].startup, constant_liar=True)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=max(1, min(5, c.trials // 2)), n_warmup_steps=0) \
        if c.prune else optuna.pruners.NopPruner()
    return open_study(optuna, storage, study, sampler, pruner)


def open_study(optuna, storage, study: Study, sampler=None, pruner=None):
    """The study from the journal, created when it is not there yet (under the search's lock: once). Loaded
    first, since Optuna's create_study(load_if_exists) appends a line to the journal on every call."""
    try:
        return optuna.load_study(study_name=study.name, storage=storage, sampler=sampler, pruner=pruner)
    except KeyError:
        return optuna.create_study(storage=storage, study_name=study.name, direction="maximize", sampler=sampler,
                                   pruner=pruner)


def take_trial(optuna, storage, study: Study, recipe: Recipe, skip: set) -> tuple | None:
    """Under the search's lock: (optuna study, trial number, its values) of a trial to train now (one a dead
    worker left RUNNING, else a new one), or None when every trial of the budget is asked and the rest are
    running elsewhere or done."""
    with search_lock(recipe.root):
        trials = open_study(optuna, storage, study).get_trials(deepcopy=False)
        for t in trials:
            if t.state.name == "RUNNING" and t.number < recipe.found.config.trials and t.number not in skip \
                    and owner_gone(t.user_attrs.get("owner")):
                live = load_study(optuna, storage, study, recipe, t.number)
                trial = optuna.trial.Trial(live, t._trial_id)
                values = t.user_attrs.get("values")
                if values is None:  # its owner died between asking and drawing: drawn now
                    values = tpe.suggest(trial, study.space)
                    trial.set_user_attr("values", values)
                trial.set_user_attr("owner", me())
                return live, t.number, tpe.checked_values(values, study, t.number, tpe.journal_path(recipe.root))
        if len(trials) >= recipe.found.config.trials:
            return None
        live = load_study(optuna, storage, study, recipe, len(trials))
        trial = live.ask()
        trial.set_user_attr("owner", me())
        values = tpe.suggest(trial, study.space)
        trial.set_user_attr("values", values)
        return live, trial.number, values


def frozen_trial(live, number: int):
    trial = live.get_trials(deepcopy=False)[number]
    assert trial.number == number
    return trial


def outcome(run_dir: Path) -> tuple[str, float | None]:
    """What a trial's run says for the study: ('COMPLETE', validation All), ('PRUNED', None) or ('FAIL', None)."""
    result = store.read_result(run_dir)
    if result is not None and result.get("status") == "done":
        value = ((result.get("metrics") or {}).get("val") or {}).get("all")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return "COMPLETE", float(value)
    if result is not None and result.get("error_type") == TrialPruned.__name__:
        return "PRUNED", None
    return "FAIL", None


def tell(optuna, live, number: int, root: Path, state: str, value: float | None = None, error: str = "") -> str:
    """Tell the study ``state`` for trial ``number``, once: under the search's lock, only while it is RUNNING
    (a trial another worker told already is left as it is). Returns the trial's state."""
    with search_lock(root):
        frozen = frozen_trial(live, number)
        if frozen.state.name != "RUNNING":
            return frozen.state.name
        if error:
            optuna.trial.Trial(live, frozen._trial_id).set_user_attr("error", error[:1000])
        if state == "COMPLETE":
            live.tell(number, value, skip_if_finished=True)
        else:
            live.tell(number, state=getattr(optuna.trial.TrialState, state), skip_if_finished=True)
    return state


def pruning(optuna, live, number: int, prune: bool):
    """engine.train's per-epoch callback: report the epoch's validation All to the study; with pruning on,
    stop the run when the study prunes it."""
    trial = optuna.trial.Trial(live, frozen_trial(live, number)._trial_id)

    def on_epoch(row: dict) -> None:
        value = (row.get("val") or {}).get("all")
        if value is None:
            return
        trial.report(float(value), int(row["epoch"]))
        if prune and trial.should_prune():
            raise TrialPruned(f"pruned by the tpe search after epoch {row['epoch']}: validation All {value:.4f} is "
                              f"below the median of the earlier trials at that epoch (search.prune: true)")
    return on_epoch


def work(recipe: Recipe, out=print) -> dict[str, int]:
    """Train trials of every study of the recipe until each study's budget is asked and its trials are done
    or running elsewhere: each trial on every tuning seed, its study told the mean validation All. Returns what
    this worker told ('COMPLETE', 'PRUNED', 'FAIL': counts)."""
    optuna = tpe.require_optuna("sampler: tpe")
    store.make_dirs(recipe.root)
    tpe.cut_torn_tail(tpe.journal_path(recipe.root), out)
    storage = tpe.open_journal(tpe.journal_path(recipe.root), optuna)
    wait = 180.0 if os.environ.get("SLURM_JOB_ID") else 0.0  # a requeued task waits out a dead node's NFS lease
    told: dict[str, int] = {}
    c = recipe.found.config
    for study in recipe.studies:
        skip: set[int] = set()
        while (taken := take_trial(optuna, storage, study, recipe, skip)) is not None:
            live, number, values = taken
            drawn = ", ".join(f"{k}={v}" for k, v in values.items())
            try:
                specs = [asked_trial_spec(recipe, study, number, values, seed) for seed in c.seeds]
            except ConfigError as exc:  # a draw a plugin refuses: the trial fails, the search goes on
                out(f"{study.method} trial {number + 1}/{c.trials} ({drawn}): {exc}")
                state = tell(optuna, live, number, recipe.root, "FAIL", error=str(exc))
                told[state] = told.get(state, 0) + 1
                continue
            outcomes = []
            for i, spec in enumerate(specs):  # the first tuning seed's validation curve is the one pruning reads
                out(f"{study.method} trial {number + 1}/{c.trials} ({drawn}), tuning seed {spec.seed}: run {spec.run_id}")
                status = run_one(spec, say=out, claim_wait_s=wait,
                                 on_epoch=pruning(optuna, live, number, c.prune) if i == 0 else None)
                if status == CLAIMED:  # its run is trained by a live process elsewhere: that one tells
                    break
                outcomes.append(outcome(Path(spec.run_dir)))
                if outcomes[-1][0] != "COMPLETE":
                    break
            if len(outcomes) < len(specs) and (not outcomes or outcomes[-1][0] == "COMPLETE"):
                skip.add(number)
                continue
            state, value = outcomes[-1] if outcomes[-1][0] != "COMPLETE" else \
                ("COMPLETE", sum(v for _, v in outcomes) / len(outcomes))
            out(f"{study.method} trial {number + 1}/{c.trials} ({drawn}): " +
                (f"validation All {100 * value:.2f} (mean of {len(outcomes)} tuning seeds)" if value is not None
                 else state.lower()))
            state = tell(optuna, live, number, recipe.root, state, value)
            told[state] = told.get(state, 0) + 1
    return told


def refuse_redo(recipe: Recipe, redo: tuple[str, ...]) -> None:
    if redo:
        raise ConfigError(f"{recipe.path}: --rerun-failed, --rerun-stale and --rebuild-checkpoints do not apply to "
                          f"a tpe search (each trial is told to its study once); move {tpe.JOURNAL} aside to start "
                          f"the studies anew, or use random search")


def launch(recipe: Recipe, wait: bool = False, submit=None) -> dict[str, int]:
    """``ltbench run`` of a tpe search, after the checks of every launch (launch.checks_before_any_run): ``launcher.jobs`` workers here (this process when 1), or an array of
    ``launcher.array_parallelism`` workers on Slurm ('debug': submitit's executor in this process) through
    ``submit`` (slurm.submit_search, passed in by launch.py: run/slurm imports this module). Returns
    {'failed': trials told FAIL} (pruned trials are the search's doing, not failures)."""
    store.refuse_older(recipe.root)
    store.ensure_writable(recipe.root)
    say(f"recipe {recipe.name}: {progress_line(recipe)} (results in {recipe.root})")
    name, c = recipe.launcher.name, recipe.launcher
    if name in ("slurm", "debug"):
        tasks = min(c.array_parallelism, c.max_array_size, recipe.found.config.trials * len(recipe.studies))
        jobs = submit(recipe, tasks, name)
        if name == "slurm" and not wait:
            say(f"follow it with 'ltbench status {recipe.path}'; 'ltbench table {recipe.path}' once it ends")
            return {"failed": 0}
        for job in jobs:
            job.result()
    else:
        with sigterm_as_interrupt():  # SIGTERM stops the workers; their trials stay RUNNING: the next launch takes them over
            if c.jobs > 1:
                run_workers(recipe, c.jobs)
            else:
                work(recipe, out=say)
    return summary(recipe)


def progress_line(recipe: Recipe) -> str:
    """'tpe search, 4 studies x 3 trials; journal: 5 asked (4 complete, 1 running)'."""
    counts = tpe.state_counts(tpe.recorded_trials(recipe.root, recipe.studies, recipe.found.config.trials))
    asked = sum(counts.values())
    states = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
    return (f"tpe search, {len(recipe.studies)} stud{'y' if len(recipe.studies) == 1 else 'ies'} (one per method) x "
            f"{recipe.found.config.trials} trials; journal {tpe.JOURNAL}: {asked} asked" + (f" ({states})" if states else ""))


def run_workers(recipe: Recipe, jobs: int) -> None:
    """``jobs`` worker processes (``python -m ltbench.run.tpe``), each running ``work`` on the shared studies,
    with its share of the cores and its GPU as a pool worker has them (``local_pool.worker_env``,
    ``gpu_slots``: round-robin over the visible GPUs); their lines go to this terminal prefixed with the
    worker. Ctrl-C stops them (their trials are taken over by the next launch)."""
    command = [sys.executable, "-m", "ltbench.run.tpe", str(Path(recipe.path).resolve()), str(recipe.results_dir),
               *recipe.overrides]
    procs = []
    for k, gpu in enumerate(gpu_slots(jobs, visible_gpus())):
        env = worker_env(os.environ, jobs)
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        procs.append(subprocess.Popen(command + [f"--worker={k + 1}"], env=env))
    try:
        codes = [p.wait() for p in procs]
    except BaseException:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        raise
    if any(codes):
        raise LtbenchError(f"{sum(1 for x in codes if x)} of {jobs} tpe worker(s) stopped with an error (their lines "
                           f"above say why); run the same command again to go on")


def summary(recipe: Recipe) -> dict[str, int]:
    """After a launch: the tables (the journal read again) and the studies' states."""
    fresh = load_recipe(recipe.path, recipe.overrides, recipe.results_arg)
    try:
        text = report.recipe_tables_text(fresh)
    except LtbenchError as exc:
        text = f"(the tables cannot be built: {exc}; 'ltbench table {recipe.path}' shows them once fixed)"
    if text:
        print()
        print(text)
    counts = tpe.state_counts(tpe.recorded_trials(fresh.root, fresh.studies, fresh.found.config.trials))
    say(f"\n{progress_line(fresh)}")
    if counts.get("FAIL"):
        say(f"{counts['FAIL']} trial(s) failed: their runs' errors are in 'ltbench status {recipe.path}'")
    return {"failed": counts.get("FAIL", 0)}


def main(argv: list[str] | None = None) -> int:
    """``python -m ltbench.run.tpe RECIPE RESULTS [OVERRIDES...] --worker=K``: one worker of a local pool."""
    argv = sys.argv[1:] if argv is None else argv
    worker = next((a.split("=", 1)[1] for a in argv if a.startswith("--worker=")), "1")
    args = [a for a in argv if not a.startswith("--worker=")]
    if len(args) < 2:
        print("usage: python -m ltbench.run.tpe RECIPE RESULTS [OVERRIDES...] [--worker=K]", file=sys.stderr)
        return 2
    try:
        work(load_recipe(args[0], args[2:], args[1]), out=lambda msg: print(f"[worker {worker}] {msg}", flush=True))
    except LtbenchError as exc:
        print(f"[worker {worker}] ltbench: error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
