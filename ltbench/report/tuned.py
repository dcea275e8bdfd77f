"""Tuned rows: a search in two stages becomes one row that reports the chosen configuration on fresh seeds.

Stage 1: every draw runs on the search's tuning seeds (``search.seeds``); the trials of one search over one
configuration (a method on a dataset, with everything the grid fixed) share everything but the searched
options, so they are grouped by their configuration less those options and their search record less the
trial number. One draw is chosen by its mean validation All over the tuning seeds (``search.choose``, the
rule the recipe's expansion uses too). Stage 2: that configuration's runs on the recipe's report seeds,
which took no part in the choice, are the row: its numbers carry no selection bonus (docs/tuning.md). The
caption names both stages ("tuned: 8 draws x 2 tuning seeds on validation (random search, seed 0);
reported: 3 fresh seeds"); the Cost counts every run of both, failed and pruned trials too. In a table that
also has untuned rows, the tuned ones say ``[tuned]``. ``trial_lines`` is ``ltbench table --trials``. No torch.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import yaml

from ltbench.config import value_text
from ltbench.errors import LtbenchError
from ltbench.recipe.tables import TableSpec
from ltbench.recipe import read_recipe_file, set_dotted
from ltbench.results import store
from ltbench.report.rows import Row, Unit, short_key
from ltbench.search import budget_text, choose, draws_per_axis, random_note

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


def _val(rec: dict | None) -> float | None:
    value = ((rec or {}).get("metrics") or {}).get("val:all") if (rec or {}).get("status") == "done" else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _restricted(unit: Unit, seeds: set, **changes) -> Unit:
    """A copy of ``unit`` holding only its runs (and problems, failures) on ``seeds``."""
    keep = lambda d: {s: v for s, v in d.items() if s in seeds}  # noqa: E731
    return replace(unit, runs=keep(unit.runs), problems=keep(unit.problems), failed=keep(unit.failed),
                   stale=keep(unit.stale), code_unknown=keep(unit.code_unknown), elsewhere=keep(unit.elsewhere),
                   borrowed=keep(unit.borrowed), expected=[s for s in unit.expected or [] if s in seeds]
                   if unit.expected is not None else None, **changes)


def tuned_unit(units: list[Unit]) -> Unit:
    """The row of one search: its trials (each unit restricted to the tuning seeds) and the chosen draw's runs
    on the other seeds, once every trial run has ended; until then, no number and a line saying why."""
    units = sorted(units, key=lambda t: t.search["trial"])
    tuning = set().union(*(t.trial_seeds for t in units))
    trials = [_restricted(t, tuning) for t in units]
    ended = all(s in t.runs or s in t.failed for t in trials for s in tuning)
    best = choose([[_val(t.runs.get(s)) for s in sorted(tuning, key=str)] for t in trials]) if ended else None
    searched = set(units[0].search["space"])
    if best is None:
        unit = Unit("tuned:" + units[0].key, {}, units[0].order, expected=[])
        finished = sum(1 for t in trials for s in tuning if s in t.runs or s in t.failed)
        unit.problems["search"] = (f"no configuration chosen yet: {finished} of {len(trials) * len(tuning)} trial runs "
                                   f"ended" if not ended else "no trial has validation on every tuning seed")
    else:
        chosen = units[best]
        report = {s for s in set(chosen.runs) | set(chosen.problems) | set(chosen.expected or []) if s not in tuning}
        unit = _restricted(chosen, report, key="tuned:" + units[0].key, trials=[], search=None, trial_seeds=set())
        unit.chosen = {s: f"trial {chosen.search['trial'] + 1}" for s in unit.runs}
    unit.flat = {k: v for k, v in units[0].flat.items() if k not in searched}
    unit.search = {k: v for k, v in units[0].search.items() if k != "trial"}
    unit.flat.update({f"{SEARCH}.{k}": unit.search[k] for k in SELECTABLE})  # a row selects it: search.trials: 4
    unit.trials, unit.trial_seeds = trials, tuning
    unit.picked = best
    have = len(trials)
    if have < unit.search["trials"]:
        unit.problems.setdefault("search", f"chosen among {have} of {unit.search['trials']} trials "
                                           f"({unit.search['trials'] - have} absent: not run yet, or drew the "
                                           f"configuration of another trial)")
    return unit


def budget_caption(spec: TableSpec, rows: list[Row]) -> tuple[TableSpec, bool]:
    """(the spec with the budget of its tuned rows in the caption, whether the table mixes tuned and untuned
    rows: then each tuned row's label says so). Per method: the search dimension d and the draws per axis."""
    tuned = [u for r in rows for u in r.units.values() if u.trials]
    if not tuned:
        return spec, False
    budgets = list(dict.fromkeys(budget_text(u.search, len(u.trial_seeds), len(u.expected or u.runs)) for u in tuned))
    dims = dict.fromkeys(f"{u.flat.get('method.name', '?')} {len(u.search['space'])} "
                         f"({draws_per_axis(u.search['trials'], len(u.search['space'])):.2g})" for u in tuned)
    text = "; ".join(budgets) + "; search dimension d (draws per axis): " + ", ".join(dims)
    text += "".join(f"; {note}" for note in dict.fromkeys(random_note(u.search["sampler"], u.search["trials"])
                                                           for u in tuned) if note)
    mixed = any(not u.trials for r in rows for u in r.units.values())
    if mixed:
        text += "; rows not marked tuned: the recipe's fixed settings"  # marked: '[tuned]', or a label that says so
    caption = f"{spec.caption.rstrip('. ')}. {text[0].upper()}{text[1:]}" if spec.caption else text[0].upper() + text[1:]
    return replace(spec, caption=caption), mixed


def chosen_note(unit: Unit) -> str:
    """'chosen on validation (mean of tuning seeds 1000, 1001): trial 3 (lr=0.05, weight_decay=0.0002)'."""
    if unit.picked is None:
        return ""
    trial = unit.trials[unit.picked]
    values = ", ".join(f"{short_key(k)}={value_text(trial.flat.get(k))}" for k in trial.search["space"])
    return (f"chosen on validation (mean of tuning seeds {', '.join(map(str, sorted(unit.trial_seeds, key=str)))}): "
            f"trial {trial.search['trial'] + 1} ({values})")


def trial_lines(row: Row, digits: int = 2) -> list[str]:
    """``ltbench table --trials LABEL``: one markdown line per trial: its draws, its validation All on each
    tuning seed and their mean (what chose it; a trial's test numbers are never shown), device-hours, and
    which one the row chose; then the report runs' seeds."""
    units = [u for u in row.units.values() if u.trials]
    if not units:
        raise LtbenchError(f"row '{row.label}' is not tuned (no search: trials); --trials shows a tuned row's trials")
    lines = []
    for unit in units:
        keys, seeds = unit.trials[0].search["space"], sorted(unit.trial_seeds, key=str)
        lines.append(f"{row.label}: {budget_text(unit.search, len(seeds), len(unit.expected or unit.runs))}")
        lines.append("| trial | " + " | ".join(short_key(k) for k in keys) + " | "
                     + " | ".join(f"val All, seed {s}" for s in seeds) + " | mean val All | device-h | chosen |")
        lines.append("|" + "---|" * (len(keys) + len(seeds) + 4))
        for i, trial in enumerate(unit.trials):
            vals = [_val(trial.runs.get(s)) for s in seeds]
            mean = sum(vals) / len(vals) if vals and None not in vals else None
            cost = [c for c in (_seconds(r) for r in [*trial.runs.values(), *trial.failed.values()]) if c is not None]
            lines.append(f"| {trial.search['trial'] + 1} | " + " | ".join(value_text(trial.flat.get(k)) for k in keys)
                         + " | " + " | ".join(_pct(v, digits) if s in trial.runs or s not in trial.failed else "failed"
                                              for v, s in zip(vals, seeds))
                         + f" | {_pct(mean, digits)} | {sum(cost) / 3600:.3g} | {'yes' if i == unit.picked else ''} |")
        reported = ", ".join(map(str, sorted(unit.runs, key=str))) or "none yet"
        lines.append(f"reported: the chosen trial's runs on seeds {reported} (fresh: not among the tuning seeds)")
    return lines


def _seconds(rec: dict) -> float | None:
    cost = (rec.get("prov") or {}).get("device_seconds")
    return cost if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None


def _pct(value, digits: int) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}"


def tuned_row(tables: list, label: str) -> Row:
    """The first tuned row labelled ``label`` (with or without its [tuned] mark), or a one-line error."""
    rows = [r for t in tables for r in t.rows if label in (r.label, r.label.removesuffix(TUNED_MARK))
            and any(u.trials for u in r.units.values())]
    if not rows:
        known = sorted({r.label for t in tables for r in t.rows if any(u.trials for u in r.units.values())})
        raise LtbenchError(f"--trials {label!r}: no tuned row has this label (tuned rows: {', '.join(known) or 'none'})")
    return rows[0]


def trials_of(tables: list, label: str, digits: int = 2) -> str:
    """``ltbench table --trials LABEL``: the trials of the first tuned row so labelled."""
    return "\n".join(trial_lines(tuned_row(tables, label), digits))


def export_recipe(tables: list, label: str, recipe_path: Path, overrides: list[str], path: Path) -> str:
    """``ltbench table RECIPE --trials ROW --export FILE.yaml``: the recipe without its search, its grid point
    and drawn values set, on the row's report seeds, so its runs have the tuned row's run ids (the same recipe
    name and results folder: they are found, never trained again). A row whose search has not chosen yet, or
    that holds several searches, is refused in one line."""
    units = [u for u in tuned_row(tables, label).units.values() if u.trials]
    if len(units) != 1 or not units[0].runs or not Path(recipe_path).is_file():
        why = ("is not one tuned row" if len(units) != 1 else "has no report run yet (its search has not chosen)"
               if not units[0].runs else "needs the recipe file, not a results folder")
        raise LtbenchError(f"--export {path}: row {label!r} {why}; export a tuned row of a recipe once its report "
                           f"runs are done ('ltbench table RECIPE --trials ROW' shows them)")
    unit = units[0]
    rec, trial = unit.runs[min(unit.runs, key=str)], unit.trials[unit.picked]
    raw, run_overrides = read_recipe_file(Path(recipe_path), overrides)
    for key in ("search", "grid", "tables"):
        raw.pop(key, None)
    chosen = {**{ov.key: ov.value for ov in run_overrides}, **(rec.get("grid") or {}),
              **{k: trial.flat.get(k) for k in trial.search["space"]}}
    for key, value in chosen.items():
        set_dotted(raw, key, value, str(path))
    raw.update(name=rec["recipe"], results_dir=str(Path(rec["dir"]).parent.parent), seeds=sorted(unit.runs, key=str))
    text = f"# {label!r} without its search: {chosen_note(unit)}\n" + yaml.safe_dump(raw, sort_keys=False)
    store.atomic_write_bytes(path, text.encode())
    return f"wrote {path}: {label} at its chosen configuration on seeds {raw['seeds']}"
