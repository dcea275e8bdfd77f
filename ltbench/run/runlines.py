"""One line per run, for ``--dry-run`` and ``ltbench status``: what a run is (method and the options its
grid point or the command line set, dataset, imbalance, seed, every other setting in which the runs
differ), the state of its stage-2 results, and the checks a dry run makes without writing anything.
No torch: status works on a login node.
"""

from __future__ import annotations

import os
from pathlib import Path

from ltbench.results import identity, store
from ltbench.config import value_text
from ltbench.errors import LtbenchError, one_line
from ltbench.results.identity import DATA_IDENTITY, differing_settings, identity_of
from ltbench.report.index import scan
from ltbench.report.rows import flatten
from ltbench.results.runspec import RunSpec
from ltbench.search import trial_problem


def check_results_root(root: Path) -> None:
    """What ``store.ensure_writable`` checks, without creating anything: the nearest existing folder on
    the way to the results root must be a writable folder (a dry run writes nothing)."""
    folder = Path(root)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise LtbenchError(f"results directory {root} is not writable ({folder} is not a writable folder); "
                           f"choose another with --results DIR or fix its permissions")


def other_data_note(root: Path, specs: list[RunSpec]) -> str:
    """Say so when run folders of this recipe's results were made from other data than the dataset's files
    hold now (a dataset that names its data, ``identity.DATA_IDENTITY``): they are no longer its runs."""
    import json


    now = {s.config.get(DATA_IDENTITY) for s in specs} - {None}
    if not now or not Path(root).is_dir():
        return ""
    ours, before = {s.run_id for s in specs}, set()
    count = 0
    for folder in sorted(p for p in Path(root).iterdir() if p.is_dir() and p.name not in ours):
        record = store.read_result(folder)
        if record is None:
            try:
                record = store.load_json(folder / store.SPEC)
            except store.UnusableFile:
                continue
        old = (record.get("config") or {}).get(DATA_IDENTITY) if isinstance(record, dict) else None
        if isinstance(old, str) and old not in now:
            count += 1
            before.add(old)
    if not count:
        return ""
    return (f"{count} run folder(s) in {root} were made from other data (data identity {', '.join(sorted(before)[:3])}; "
            f"now {', '.join(sorted(now)[:3])}): the dataset's files have changed since; they are not runs of this "
            f"recipe now")


ALWAYS_SHOWN = ("method.name", "data.name", "data.imb_factor", "seed")


def run_lines(specs: list[RunSpec], override_keys: list[str] = ()) -> list[str]:
    """One text per run: the method with the options its grid point or the command line set (values as
    resolved), the dataset, its imbalance and the seed, then every other setting in which the runs differ
    (method options compared between runs of the same method), so no two runs read alike."""
    flats = [flatten(identity_of(s.config)) for s in specs]
    differ = set(differing_settings([s.config for s in specs]))
    same_method: dict[str, list[dict]] = {}
    for flat in flats:
        same_method.setdefault(str(flat.get("method.name")), []).append(flat)
    varying = {name: _varying_keys(group) for name, group in same_method.items()}
    lines = []
    for spec, flat in zip(specs, flats):
        name = str(flat.get("method.name"))
        named = _method_keys_named(spec.grid or {}) | {k for k in override_keys if k.startswith("method.")}
        options = [k for k in sorted(flat) if k.startswith("method.") and k != "method.name"
                   and (k in varying[name] or k in named or any(k.startswith(n + ".") for n in named))]
        label = name + (f" ({', '.join(f'{k[7:]}={value_text(flat[k])}' for k in options)})" if options else "")
        others = [f"{k}={value_text(flat[k])}" for k in sorted(differ) if k in flat
                  and not k.startswith("method.") and k not in ALWAYS_SHOWN]
        trial = (spec.grid or {}).get("search")
        label = (f"trial {trial['trial'] + 1}/{trial['trials']} " if isinstance(trial, dict) and not trial_problem(trial)
                 else "") + label
        lines.append(one_line(f"{label} on {flat.get('data.name')} rho={value_text(flat.get('data.imb_factor', '-'))} "
                              f"seed={flat.get('seed')}" + (f"  {' '.join(others)}" if others else "")))
    return lines


def _varying_keys(flats: list[dict]) -> set[str]:
    keys = {k for f in flats for k in f}
    return {k for k in keys if len({value_text(f.get(k)) if k in f else "<absent>" for f in flats}) > 1}


def _method_keys_named(grid: dict) -> set[str]:
    """The method options a grid point sets: 'method.tau', or each key of a whole 'method' mapping."""
    keys = {k for k in grid if k.startswith("method.")}
    if isinstance(grid.get("method"), dict):
        keys |= {f"method.{k}" for k in grid["method"] if k != "name"}
    return keys


def describe_found(root: Path, run_dirs: list[Path]) -> dict[Path, str]:
    """Run lines of the folders found under a results directory, from the index the tables use
    (report/index.py: each result.json or spec.json read once, then cached)."""
    wanted = {os.fspath(p) for p in run_dirs}
    specs = {}
    for rec in scan(root):
        config = rec.get("config")
        if rec["dir"] in wanted and isinstance(config, dict) and all(isinstance(config.get(s), dict)
                                                                   for s in ("data", "method")):
            specs[Path(rec["dir"])] = RunSpec(recipe=str(rec.get("recipe") or ""), run_id=str(rec.get("run_id")),
                                              config={**config, "seed": rec.get("seed")},
                                              grid=rec.get("grid") or {}, run_dir=rec["dir"])
    return dict(zip(specs, run_lines(list(specs.values())))) if specs else {}


def stage2_state(run_dir: Path) -> tuple[str, int]:
    """('stage 2: 12 done, 3 stale (code changed: ...)', number stale) of a finished run's stage-2 results
    (RUN_DIR/posthoc/<id>/result.json); ('', 0) when it has none."""
    states, changed = [], set()
    for result_path in sorted((run_dir / store.POSTHOC_DIR).glob(f"*/{store.RESULT}")):
        check = store.check_result(result_path.parent)
        state = check.state if check.usable else "damaged"
        if state == "done":
            verdict = identity.code_state(check.result)  # the run's rule: done, stale or code unknown
            state = verdict.status
            changed.update(verdict.changed)
        states.append(state)
    if not states:
        return "", 0
    counts = store.count_statuses(states)
    text = f"stage 2: {store.format_counts(counts)}"
    if changed:
        text += f" (code changed since: {', '.join(sorted(changed))}; 'ltbench posthoc --rerun-stale' fits them again)"
    return text, counts.get("stale", 0)
