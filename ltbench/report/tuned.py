"""Tuned rows: the trials of a ``search:`` become one row that reports, per seed, the trial chosen on validation.

A trial is an ordinary configuration (its own unit). The trials of one search over one configuration (a
method on a dataset, with everything the grid fixed) share everything but the searched options, so they are
grouped by their configuration less those options and their search record less the trial number. The group
becomes one unit through ``rows.selected_unit(..., 'val')``: per seed the trial with the best validation All,
its test numbers reported; the test set never chooses (tests/test_tuned.py). The budget goes into the caption
("tuned: 16 trials per method on the validation split (random search, seed 0)"); in a table that also has
untuned rows, the tuned ones say ``[tuned]``. ``trial_lines`` is ``ltbench table --trials``. No torch.
"""

from __future__ import annotations

import json
from dataclasses import replace

from ltbench.config import value_text
from ltbench.errors import LtbenchError
from ltbench.recipe.tables import TableSpec
from ltbench.report.rows import Row, Unit, selected_unit, short_key
from ltbench.search import budget_text

TUNED_MARK = " [tuned]"
SEARCH = "search"  # the selector section of a tuned unit: {method.name: ce, search.trials: 4} is the tuned CE row
SELECTABLE = ("trials", "sampler", "seed")


def collapse_trials(units: list[Unit]) -> list[Unit]:
    """Units with the trials of each search replaced by one tuned unit, in the order of its first trial."""
    groups: dict[str, list[Unit]] = {}
    for u in units:
        if u.search is not None:
            searched = set(u.search["space"])
            rest = {k: value_text(v) for k, v in u.flat.items() if k not in searched}
            budget = {k: v for k, v in u.search.items() if k != "trial"}
            groups.setdefault(json.dumps([rest, budget], sort_keys=True), []).append(u)
    out, done = [], set()
    for u in units:
        if u.search is None:
            out.append(u)
            continue
        key = next(k for k, g in groups.items() if u in g)
        if key in done:
            continue
        done.add(key)
        out.append(tuned_unit(groups[key]))
    return out


def tuned_unit(trials: list[Unit]) -> Unit:
    trials = sorted(trials, key=lambda t: t.search["trial"])
    unit = selected_unit(trials, "val") if len(trials) > 1 else _alone(trials[0])
    searched = set(trials[0].search["space"])
    unit.flat = {k: v for k, v in unit.flat.items() if k not in searched}
    unit.key = "tuned:" + unit.key
    unit.search = {k: v for k, v in trials[0].search.items() if k != "trial"}
    unit.flat.update({f"{SEARCH}.{k}": unit.search[k] for k in SELECTABLE})  # a row selects it: search.trials: 4
    unit.trials = trials
    for seed in unit.expected or []:
        have = sum(1 for t in trials if seed in t.runs or seed in (t.expected or []))  # tpe: each trial has one seed
        missing = unit.search["trials"] - have
        if missing > 0 and seed not in unit.problems:
            unit.problems[seed] = (f"seed {seed}: selected among {have} of {unit.search['trials']} trials "
                                   f"({missing} absent: not run yet, or drew the configuration of another trial)")
    return unit


def _alone(trial: Unit) -> Unit:
    """A search of one trial: nothing to choose, the trial is the row."""
    return replace(trial, chosen={s: f"trial {trial.search['trial'] + 1}" for s in trial.runs})


def budget_caption(spec: TableSpec, rows: list[Row]) -> tuple[TableSpec, bool]:
    """(the spec with the budget of its tuned rows in the caption, whether the table mixes tuned and untuned
    rows: then each tuned row's label says so)."""
    tuned = [u for r in rows for u in r.units.values() if u.trials]
    if not tuned:
        return spec, False
    budgets = list(dict.fromkeys(budget_text(u.search) for u in tuned))
    text = "; ".join(budgets)
    mixed = any(not u.trials for r in rows for u in r.units.values())
    if mixed:
        text += "; rows not marked tuned: the recipe's fixed settings"  # marked: '[tuned]', or a label that says so
    caption = f"{spec.caption.rstrip('. ')}. {text[0].upper()}{text[1:]}" if spec.caption else text[0].upper() + text[1:]
    return replace(spec, caption=caption), mixed


def chosen_note(unit: Unit) -> str:
    """'chosen on validation: seed 0: trial 3 (lr=0.05, weight_decay=0.0002); ...'."""
    picks = []
    for seed in sorted(unit.runs, key=str):
        trial = next((t for t in unit.trials if t.runs.get(seed) is unit.runs[seed]), None)
        if trial is None:
            continue
        values = ", ".join(f"{short_key(k)}={value_text(trial.flat.get(k))}" for k in trial.search["space"])
        picks.append(f"seed {seed}: trial {trial.search['trial'] + 1} ({values})")
    return "chosen on validation: " + "; ".join(picks) if picks else ""


def trial_lines(row: Row, digits: int = 2) -> list[str]:
    """``ltbench table --trials LABEL``: one markdown line per trial and seed: its draws, validation and test
    All, device-hours, and which one the row chose."""
    units = [u for u in row.units.values() if u.trials]
    if not units:
        raise LtbenchError(f"row '{row.label}' is not tuned (no search: trials); --trials shows a tuned row's trials")
    lines = []
    for unit in units:
        keys = unit.trials[0].search["space"]
        lines.append(f"{row.label}: {budget_text(unit.search)}")
        lines.append("| trial | " + " | ".join(short_key(k) for k in keys) + " | seed | val All | test All | device-h | chosen |")
        lines.append("|" + "---|" * (len(keys) + 6))
        for trial in unit.trials:
            for seed in sorted(set(trial.runs) | set(trial.expected or []), key=str):
                rec = trial.runs.get(seed) or {}
                metrics = rec.get("metrics") or {}
                val, test = metrics.get("val:all"), metrics.get("all")
                cost = (rec.get("prov") or {}).get("device_seconds")
                cost = cost if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None
                lines.append(f"| {trial.search['trial'] + 1} | " + " | ".join(value_text(trial.flat.get(k)) for k in keys)
                             + f" | {seed} | {_pct(val, digits)} | {_pct(test, digits)} | "
                             + ("-" if cost is None else f"{cost / 3600:.3g}")
                             + f" | {'yes' if rec and unit.runs.get(seed) is rec else ''} |")
    return lines


def _pct(value, digits: int) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}"


def trials_of(tables: list, label: str, digits: int = 2) -> str:
    """``ltbench table --trials LABEL``: the trials of the tuned row so labelled, in every table that has it."""
    rows = [r for t in tables for r in t.rows if label in (r.label, r.label.removesuffix(TUNED_MARK))]
    tuned = [r for r in rows if any(u.trials for u in r.units.values())]
    if not tuned:
        known = sorted({r.label for t in tables for r in t.rows if any(u.trials for u in r.units.values())})
        raise LtbenchError(f"--trials {label!r}: no tuned row has this label (tuned rows: {', '.join(known) or 'none'})")
    return "\n".join(line for r in tuned[:1] for line in trial_lines(r, digits))
