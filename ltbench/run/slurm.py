"""Grids on Slurm through submitit: job arrays of plain-data run specs (the 'slurm' launcher, and the
submission the 'debug' launcher shares with it; the registry of launchers is ``launch.LAUNCHERS``).

Each array task calls ``runner.run_one(spec)``, the same function the local launcher calls. The
callable is submitit-Checkpointable and its ``checkpoint()`` only resubmits: all state lives in the
engine's atomic per-epoch (and timed) checkpoint, so a requeued or preempted task resumes from disk.
Run states are read from the results directory, never from ``sacct`` (a one-node cluster without
accounting has none, and submitit then reports every state as UNKNOWN).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

import submitit

from ltbench.results import provenance, status_rule, store
from ltbench.errors import LtbenchError
from ltbench.recipe import LauncherConfig, Recipe, load_recipe
from ltbench.search import SAMPLERS
from ltbench.runner import prepare_run_dir, run_one
from ltbench.results.runspec import RunSpec


CLAIM_WAIT_S = 180.0  # > the default NFSv4 lease (90 s)


class RunJob(submitit.helpers.Checkpointable):
    """What a Slurm task executes: one run spec (plain data), resumed from its checkpoint if any."""

    def __call__(self, spec: dict, redo: tuple[str, ...] = ()) -> str:
        # On a cluster, a requeued task may find the lock of its previous, crashed node still held
        # until the NFS lease expires: wait for it rather than skip the run.
        wait = CLAIM_WAIT_S if os.environ.get("SLURM_JOB_ID") else 0.0
        return run_one(spec, say=lambda msg: print(msg, flush=True), redo=tuple(redo), claim_wait_s=wait)

    def checkpoint(self, spec: dict, redo: tuple[str, ...] = ()) -> submitit.helpers.DelayedSubmission:
        # Called inside submitit's signal handler: no I/O here, the engine's checkpoint is on disk.
        # A requeued task resumes (redo is moot by then: the old result was set aside at its start).
        return submitit.helpers.DelayedSubmission(RunJob(), spec, redo)


class PosthocJob(submitit.helpers.Checkpointable):
    """What a Slurm task executes for ``ltbench posthoc``: one finished run's stage-2 grid, its features first."""

    def __call__(self, run_dir: str, specs: list[dict], dtype: str = "float32", redo_failed: bool = False,
                 redo_stale: bool = False) -> dict:
        from ltbench.stage2.posthoc_runs import posthoc_one_run  # lazy: keeps status and submission free of torch

        return posthoc_one_run(run_dir, specs, dtype, redo_failed, say=lambda msg: print(msg, flush=True),
                               redo_stale=redo_stale)

    def checkpoint(self, *args) -> submitit.helpers.DelayedSubmission:
        # Each stage-2 result is stored as soon as it is fitted: a requeued task skips the stored ones.
        return submitit.helpers.DelayedSubmission(PosthocJob(), *args)


class SearchJob(submitit.helpers.Checkpointable):
    """What a Slurm task of a search whose sampler asks executes: one worker of the shared studies (its
    ``SearchSampler.runner``), the recipe loaded again from its file (the sampler's state says what is left)."""

    def __call__(self, recipe_path: str, overrides: list[str], results: str) -> dict:
        recipe = load_recipe(recipe_path, overrides, results)
        runner = SAMPLERS[recipe.found.config.sampler].module("runner")
        return runner.work(recipe, out=lambda msg: print(msg, flush=True))

    def checkpoint(self, *args) -> submitit.helpers.DelayedSubmission:
        # A requeued worker takes its unfinished trial over again (its run resumes from its checkpoint).
        return submitit.helpers.DelayedSubmission(SearchJob(), *args)


def submit_search(recipe: Recipe, tasks: int, cluster: str) -> list:
    """``tasks`` workers of a search whose sampler asks, as one job array ('slurm', or 'debug': in this process)."""
    if cluster == "slurm":
        require_sbatch()
    path, results = str(Path(recipe.path).resolve()), str(recipe.results_dir)
    jobs = _map_array(make_executor(recipe, cluster), SearchJob(), [path] * tasks, [list(recipe.overrides)] * tasks,
                      [results] * tasks)
    print(f"submitted {tasks} {recipe.found.config.sampler} worker(s) as {cluster} job array {str(jobs[0].job_id).split('_')[0]}")
    return jobs


def make_executor(recipe: Recipe, cluster: str) -> submitit.AutoExecutor:
    c: LauncherConfig = recipe.launcher
    folder = recipe.root / "_submitit" / "%j"
    ex = submitit.AutoExecutor(folder=folder, cluster=cluster, slurm_max_num_timeout=c.max_requeues)
    params = dict(name=f"ltbench-{recipe.name}", timeout_min=c.time_min, cpus_per_task=c.cpus_per_task,
                  mem_gb=c.mem_gb, nodes=c.nodes)
    if cluster == "slurm":
        tasks = max(1, c.gpus_per_node)
        params.update(gpus_per_node=c.gpus_per_node, tasks_per_node=tasks,
                      slurm_array_parallelism=c.array_parallelism, slurm_setup=list(c.setup),
                      slurm_additional_parameters=dict(c.additional), slurm_signal_delay_s=120)
        for key in ("partition", "account", "qos", "constraint"):
            value = getattr(c, key)
            if value:
                params["slurm_" + key] = value
    ex.update_parameters(**params)
    return ex


def submit(recipe: Recipe, specs: list[RunSpec], wait: bool = False, redo: tuple[str, ...] = ()) -> list[str]:
    """Submit ``specs`` to Slurm as job arrays of at most ``launcher.max_array_size``; returns the job
    ids. ``wait``: block until every run has a result (or its job left the queue)."""
    require_sbatch()
    idle = idle_cpus_note(recipe.launcher, specs)
    if idle:
        print(idle)
    jobs = submit_arrays(recipe, specs, "slurm", redo)
    job_ids = [str(job.job_id) for job in jobs]
    if wait and job_ids:
        wait_for(recipe, specs, job_ids)
    return job_ids


def idle_cpus_note(c: LauncherConfig, specs: list[RunSpec]) -> str | None:
    """A line when a CPU grid asks Slurm for more CPUs per task than its runs use. A CPU run computes with
    the torch threads ``provenance.thread_count`` gives it (``train.threads``, unset: 1) plus
    ``train.num_workers`` loader processes, whatever the allocation; the rest of ``cpus_per_task`` is
    reserved and idle. Said, not changed: either number may be what the user meant (the default is 2)."""
    if c.gpus_per_node or not specs:
        return None
    train = [spec.config.get("train", {}) for spec in specs]
    threads = max(provenance.thread_count(t.get("threads"), "cpu", {})[0] for t in train)
    workers = max(int(t.get("num_workers") or 0) for t in train)
    if c.cpus_per_task <= threads + workers:
        return None
    return (f"note: launcher.cpus_per_task is {c.cpus_per_task}, but each run of this CPU grid uses at most "
            f"{threads + workers} CPU(s): {threads} torch thread(s) (train.threads; unset: 1 on the CPU) and "
            f"{workers} loader process(es) (train.num_workers); {c.cpus_per_task - threads - workers} CPU(s) of "
            f"every task stay idle. Set launcher.cpus_per_task: {threads + workers} to leave them to others, or "
            f"train.threads to use them (a result records its thread count, and tables keep results made with "
            f"other thread counts apart).")


def require_sbatch() -> None:
    if shutil.which("sbatch") is None:
        raise LtbenchError("launcher slurm: 'sbatch' is not on PATH; run on a Slurm login node "
                           "(or start a local cluster: scripts/slurm-local.sh up) or use --launcher local")


def submit_posthoc(recipe: Recipe, run_dirs: list[str], specs: list[dict], cluster: str, dtype: str = "float32",
                   redo_failed: bool = False, redo_stale: bool = False) -> list:
    """One array task per finished run, fitting the stage-2 grid ``specs`` on it (``cluster``: 'slurm' or
    'debug'), in arrays of at most ``launcher.max_array_size``. Returns the jobs."""
    if not run_dirs:
        return []
    ex, jobs = make_executor(recipe, cluster), []
    for chunk in _array_chunks(recipe, run_dirs):
        n = len(chunk)
        jobs += _map_array(ex, PosthocJob(), chunk, [specs] * n, [dtype] * n, [redo_failed] * n, [redo_stale] * n)
        print(f"submitted the stage-2 grid of {n} run(s) as {cluster} job array {str(jobs[-1].job_id).split('_')[0]}")
    return jobs


def submit_arrays(recipe: Recipe, specs: list[RunSpec], cluster: str, redo: tuple[str, ...] = ()) -> list:
    """Hand ``specs`` to a submitit executor (``cluster``: 'slurm', or 'debug' for submitit's in-process
    executor) in chunks of ``launcher.max_array_size``; each run gets a submitted.json. Returns the jobs."""
    if not specs:
        return []
    ex = make_executor(recipe, cluster)
    for spec in specs:
        prepare_run_dir(spec)
    all_jobs = []
    for chunk in _array_chunks(recipe, specs):
        jobs = _map_array(ex, RunJob(), [s.to_dict() for s in chunk], [tuple(redo)] * len(chunk))  # pickled: plain data
        all_jobs += jobs
        for job, spec in zip(jobs, chunk):
            store.atomic_write_json(Path(spec.run_dir) / store.SUBMITTED,
                                    {"job_id": job.job_id, "cluster": cluster, "time": time.time(),
                                     "logs": str(recipe.root / "_submitit" / str(job.job_id).split("_")[0])})
        print(f"submitted {len(chunk)} run(s) as {cluster} job array {str(jobs[0].job_id).split('_')[0]}")
    return all_jobs


def _array_chunks(recipe: Recipe, items: list) -> list[list]:
    """``items`` cut into job arrays of at most ``launcher.max_array_size`` tasks."""
    size = max(1, recipe.launcher.max_array_size)
    return [items[start : start + size] for start in range(0, len(items), size)]


def _map_array(ex: submitit.AutoExecutor, job: Callable, *arguments: list) -> list:
    """``ex.map_array(job, *arguments)`` outside any enclosing Slurm job's environment (submitit's clean_env),
    but keeping SLURM_CONF, which says which cluster to talk to."""
    conf = os.environ.get("SLURM_CONF")
    try:
        with submitit.helpers.clean_env():
            if conf:
                os.environ["SLURM_CONF"] = conf
            return ex.map_array(job, *arguments)
    except (submitit.core.utils.FailedJobError, subprocess.CalledProcessError) as exc:
        lines = [l for l in str(exc).splitlines() if l.strip()]
        raise LtbenchError(f"sbatch failed: {lines[-1] if lines else exc}") from None


def queued(job_ids: list[str]) -> set[str]:
    """Job ids (array ids like 12_3 or plain ids) that squeue still lists, pending or running."""
    if not job_ids or shutil.which("squeue") is None:
        return set()
    bases = sorted({j.split("_")[0] for j in job_ids})
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i", "-j", ",".join(bases)], capture_output=True, text=True)
    return {line.strip() for line in out.stdout.splitlines() if line.strip()}


def wait_for(recipe: Recipe, specs: list[RunSpec], job_ids: list[str], poll_s: float = 2.0) -> None:
    """Block until every run has a result on disk, or its job has left the queue without one."""
    last = ""
    gone_since: float | None = None
    while True:
        states = [status_rule.run_status(Path(s.run_dir)) for s in specs]
        left = [s for s, st in zip(specs, states) if st not in (*store.FINISHED, "failed")]
        line = store.format_counts(store.count_statuses(states), order=store.STATUSES)
        if line != last:
            print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)
            last = line
        if not left:
            return
        if queued(job_ids):
            gone_since = None
        else:
            gone_since = gone_since or time.time()
            if time.time() - gone_since > 20:  # results are written before a job leaves the queue
                ids = ", ".join(s.run_id for s in left)
                print(f"{len(left)} run(s) left the queue without a result ({ids}); see their logs under "
                      f"{recipe.root / '_submitit'}; launch the recipe again to resume them", flush=True)
                return
        time.sleep(poll_s)
