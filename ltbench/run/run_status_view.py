"""``ltbench status``: one line per run read from disk (its state, what it is, notes), and a summary.

Read-only and torch-free, so it works on a login node while runs are going on elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

from ltbench.results import schema, status_rule, store
from ltbench.errors import DataMissingError, one_line, shorten
from ltbench.run.runlines import describe_found, other_data_note, run_lines, stage2_state
from ltbench.report.expected import source
from ltbench.results.runspec import RunSpec


def _is_run_dir(folder: Path) -> bool:
    return any((folder / name).exists() for name in store.RUN_FILES)


def _run_dirs_under(root: Path) -> list[Path]:
    """Every folder of a results directory that may be a run (internal ones like _submitit excepted);
    given the top results folder, the runs of each recipe folder in it."""
    if not root.is_dir():
        raise DataMissingError(f"{root}: no such results directory")

    def children(folder: Path) -> list[Path]:
        return sorted(p for p in folder.iterdir()  # symlinks never followed (out of the root, or in a loop)
                      if not p.is_symlink() and p.is_dir() and not p.name.startswith(("_", "."))
                      and p.name not in store.OWNED_DIRS)

    out = []
    for child in children(root):
        inner = [] if _is_run_dir(child) else children(child)
        out += inner if any(_is_run_dir(p) for p in inner) else [child]
    return out


def describe_run(run_dir: Path, listed: bool = False) -> tuple[str, str]:
    """(status, note) of one run folder for 'ltbench status': never raises on damaged contents. The status is
    ``status_rule.run_state``'s (the one rule launch and the runner use too); only a folder found by scanning a
    results directory (not ``listed`` by a recipe) that holds no run file is 'not a run'."""
    if not run_dir.exists():
        return "pending", ""
    if not listed and not _is_run_dir(run_dir):
        empty = not any(run_dir.iterdir())
        return "not a run", ("empty folder" if empty else "no run files in this folder") + "; ignored"
    state = status_rule.run_state(run_dir)
    status, notes = state.status, []
    if status == "failed":
        result = state.check.result
        err = str(result.get("error") or "").strip()
        notes.append(err.splitlines()[-1][:200] if err else "no error recorded")
        if result.get("traceback_file"):
            notes.append(f"traceback: {run_dir / result['traceback_file']}")
    elif status == "damaged":
        notes.append(f"{state.check.reason}; 'ltbench run' runs it again")
    elif status == store.OLDER:
        notes.append(state.check.reason)
    elif status == "stale":
        notes.append(f"code changed since: {', '.join(state.changed)}; 'ltbench run --rerun-stale' runs it again")
    elif status == store.CODE_UNKNOWN:
        notes.append(f"finished; its code cannot be checked: {state.code_reason}")
    elif status in ("running", "interrupted"):
        rows = store.read_jsonl(run_dir / store.LOG)
        owner = state.started
        notes.append(f"epoch {rows[-1].get('epoch')} done" if rows else "no epoch done")
        if owner:
            notes.append(f"pid {shorten(owner.get('pid'), 20)} on {shorten(owner.get('host'), 80)}")
        if status == "interrupted":
            why = str(owner.get("interrupted") or "").split(": ", 1)[-1].split("; it keeps", 1)[0]
            notes.append((f"stopped by {shorten(why)}" if why else "its process is gone") + "; run again to resume")
    if status in ("pending", "running") and os.path.lexists(run_dir / store.SUBMITTED):
        submitted = store.load_json_object(run_dir / store.SUBMITTED)
        notes.append(f"job {shorten(submitted['job_id'], 40)}" if "job_id" in submitted
                     else "submitted.json unreadable")
    for name in (store.SPEC, store.LOG):
        path = run_dir / name
        if name == store.SPEC and not path.exists():
            notes.append("spec.json missing ('ltbench run' on its recipe writes it again)")
        elif path.exists() and not path.is_file():
            notes.append(f"{name} is not a file ('ltbench run' sets it aside)")
    return status, "; ".join(notes)


def print_status(root: Path, specs: list[RunSpec] | None = None, override_keys: list[str] = (),
                 where: dict | None = None) -> int:
    """Each run's state read from disk, and a summary line. ``specs``: the runs of a recipe (so runs
    never launched show as pending); otherwise every folder under ``root``, less those ``where`` (--where)
    leaves out. Each line names the run (method, dataset, imbalance, seed, the settings in which the runs
    differ), its state and notes."""
    root = Path(root)
    run_dirs = _run_dirs_under(root) if specs is None else [Path(s.run_dir) for s in specs]
    if where and specs is None:  # the records the tables would show (report.expected.source: the one rule)
        kept = {rec["dir"] for rec in source(root, where=where)[0]}
        run_dirs = [d for d in run_dirs if os.fspath(d) in kept]
    described = describe_found(root, run_dirs) if specs is None else dict(zip(run_dirs, run_lines(specs, override_keys)))
    statuses, stale_stage2 = [], 0
    for run_dir in run_dirs:
        status, note = describe_run(run_dir, listed=specs is not None)
        statuses.append(status)
        stage2, stale = stage2_state(run_dir) if status in store.FINISHED else ("", 0)
        stale_stage2 += stale
        name = run_dir.relative_to(root) if specs is None else run_dir.name
        what = described.get(run_dir, "") if status != "not a run" else ""
        print(one_line(f"{name}  {status:<{store.STATUS_WIDTH}}" + "".join(f"  {t}" for t in (what, note, stage2) if t)))
    counts = store.count_statuses(statuses)
    print(store.format_counts(counts) or "no runs")
    changed = other_data_note(root, specs) if specs is not None else ""
    if changed:
        print(changed)
    if stale_stage2:
        print(f"{stale_stage2} stage-2 result(s) are stale; to fit them again: ltbench posthoc RECIPE --rerun-stale")
    if counts.get(store.OLDER):
        print(f"{counts[store.OLDER]} run(s) hold records of an older ltbench: "
              f"'{schema.MIGRATE_HINT.format(root=root)}' brings them up to date")
    if counts.get("damaged") or counts.get("interrupted"):
        print("to redo the damaged and resume the interrupted runs: ltbench run RECIPE")
    for kind in ("failed", "stale"):
        if counts.get(kind):
            print(f"to run the {kind} runs again: ltbench run RECIPE --rerun-{kind}")
    return 0
