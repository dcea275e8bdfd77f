"""The one status rule (launch, status, tables, the runner and stage 2 ask it). Not in the store, which reads the
files: the rule asks ``identity.code_state``, and identity reads files through the store."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ltbench.results import identity, store


@dataclass(frozen=True)
class RunState:
    """A run's status and what it was decided from, so a caller can say why without reading again.

    ``changed``: for 'stale', the modules whose source changed since the result was made; ``code_reason``:
    for 'code unknown', why its code cannot be checked; ``check``: the result.json read.
    """

    status: str
    check: store.ResultCheck
    changed: tuple[str, ...] = ()
    code_reason: str = ""
    started: dict = field(default_factory=dict)


def run_state(run_dir: Path) -> RunState:
    """The one rule for a run's status, read from disk (launch, status, the runner and stage 2 all ask it):
    'done'             a usable result.json of a finished run whose recorded code is unchanged (every
                       module its computation executed, normalised: ``identity.code_state``);
    'code unknown'     the same, but its code cannot be checked (no record, an older partial one, a file gone);
    'stale'            a finished result made by code that has changed since;
    'failed'           a usable result.json of a run that failed;
    'damaged'          a result.json that is unusable (``store.check_result`` says why); run again to redo it;
    'running'          started, no result, and its process is alive (or ran on another host: unknown);
    'interrupted'      started, no result, and its process is gone (this host) or said it stopped (an I/O
                       fault, runner.RunInterrupted); run again to resume;
    'pending'          submitted or never started.
    """
    check = store.check_result(run_dir)
    if check.state == "done":
        verdict = identity.code_state(check.result)
        return RunState(verdict.status, check, verdict.changed, verdict.reason)
    if check.usable or check.state == store.OLDER:
        return RunState(check.state, check)
    if check.state == "unusable":
        return RunState("damaged", check)
    status, started = unfinished_state(run_dir)
    return RunState(status, check, started=started)


def unfinished_state(run_dir: Path) -> tuple[str, dict]:
    """('running' | 'interrupted' | 'pending', started.json) of a run without a usable result: the one rule
    ``status`` (through run_state) and tables (report/index.py) both ask, so they never disagree."""
    started = store.read_started(run_dir)
    if started or (Path(run_dir) / store.STARTED).exists():
        stopped = bool(started.get("interrupted")) or store.owner_alive(started) is False  # an I/O fault, or a dead owner
        return ("interrupted" if stopped else "running"), started
    return "pending", started


def run_status(run_dir: Path) -> str:
    """One word from disk (:func:`run_state` says which and why)."""
    return run_state(run_dir).status


def to_run(status: str, redo: tuple[str, ...] = ()) -> bool:
    """Does a launch run a run in this status? A 'done' or 'code unknown' one never (its result is usable; only
    its code cannot be compared); a 'failed' or 'stale' one only when asked (``redo`` names it); the others
    (pending, interrupted, damaged, running) always, since the worker decides again under the run's lock (a
    run still running elsewhere is then skipped)."""
    if status in ("done", store.CODE_UNKNOWN):
        return False
    return status in redo if status in ("failed", "stale") else True
