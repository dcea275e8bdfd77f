"""From run records and a table declaration to a filled table: cells, notes, best and second best.

Best and second best are chosen per column *within each column group and row group*: a table that
puts CIFAR-10 and CIFAR-100 side by side (as column groups, or as row groups) marks each dataset's
own best. Published reference rows never compete. Significance (when asked for) marks cells that
are not significantly different from the best of their column and group.
"""

from __future__ import annotations

from ltbench.report.rows import (SELECTION_TEXT, Cell, Row, Table, Unit, group_values, matches_selector, default_rows, group_title,
                                 expand_columns, expand_heads, explicit_rows, flatten, gather_units)
from ltbench.recipe.tables import TableSpec
from ltbench.errors import shorten
from ltbench.results import identity
from ltbench.report.significance_marks import compare_rows, mark_similar
from ltbench.report.tuned import TUNED_MARK, budget_caption, chosen_note, collapse_trials


def never_run_hint(unit: Unit) -> str:
    """Why a declared seed has no result and the command that makes it (followed in tests/test_hints.py):
    a stage-2 setting (a ``posthoc`` section) is fitted by 'ltbench posthoc', a run by 'ltbench run'."""
    if any(str(k).startswith("posthoc.") for k in unit.flat):
        return "never fitted: 'ltbench posthoc RECIPE' fits it once its run is done"
    return "never run: 'ltbench run RECIPE' runs it"


def build_table(name: str, spec: TableSpec, records: list[dict], expected: list[dict] | None = None,
                where: str = "tables", test: str | None = "welch", correction: str | None = None) -> Table:
    units, notes = gather_units(records, expected)
    units = collapse_trials(units)
    if spec.where:
        before = len(units)
        units = [u for u in units if matches_selector(u.flat, spec.where)]
        if before and not units:
            notes.append(f"where {spec.where} matches no configuration of these runs: the table is empty")
    if spec.rows == []:
        notes.append("rows: [] declares no row: the table is empty")
    pivot = list(spec.pivot)
    groups = group_values(units, pivot, spec) if units else [tuple(None for _ in pivot)]
    if spec.rows is not None:
        rows = explicit_rows(spec, units, groups, pivot, f"{where}.{name}")
    else:
        rows = default_rows(spec, units, groups, pivot, auto_group=spec.group_by is None, by_label=expected is None)
        if spec.heads:
            rows = expand_heads(rows, spec.heads)
    if spec.group_by:
        for r in rows:
            if r.group is None and r.units:
                value = next(iter(r.units.values())).flat.get(spec.group_by)
                r.group = group_title(spec, value)
    rows = _stable_group_order(rows)  # one group per value: a command-line axis never interleaves them
    for switch, key in spec.switch_keys.items():
        for r in rows:
            if switch not in r.marks and r.units:
                r.marks[switch] = bool(next(iter(r.units.values())).flat.get(key))
    spec, mixed = budget_caption(spec, rows)
    for r in rows:
        if mixed and any(u.trials for u in r.units.values()) and "tuned" not in r.label.lower():  # unless it says so
            r.label += TUNED_MARK
    table = Table(name, spec, expand_columns(spec, units), pivot, groups, rows, notes,
                  expected_seeds=expected is not None,
                  cost=spec.cost if spec.cost is not None else any(u.trials for r in rows for u in r.units.values()))
    old_code = old_code_note(rows)
    for row in rows:
        fill_row(table, row, code_notes=not old_code)
    if old_code:
        table.notes.append(old_code)
    seeds_everywhere = sorted({s for r in rows for u in r.units.values() for s in u.runs})
    if expected is None:
        _note_missing_without_recipe(table, seeds_everywhere)
    numerics = table_numerics_note(table)
    if numerics:
        table.notes.append(numerics)
    if table.cost:
        table.notes += cost_notes(table)
    if spec.best:
        mark_best(table)
    if test:
        table.test = mark_similar(table, test)
    if any(r.versus for r in rows):
        table.comparison_test = compare_rows(table, test, correction or spec.correction)
    return table


def _stable_group_order(rows: list[Row]) -> list[Row]:
    order: list = []
    for r in rows:
        if r.group not in order:
            order.append(r.group)
    return sorted(rows, key=lambda r: order.index(r.group))


def metric_key(row: Row, column: str) -> str:
    """The flat metric name a cell reads. A head row reads its head's numbers only: results record a head's
    shot groups on the main test set, not its shifted-prior or test-set accuracy, so such a cell stays
    empty with a 'not recorded' note instead of showing the main prediction's number under the head's label."""
    if row.head:
        return f"head:{row.head}:{column}"
    return column


def fill_row(table: Table, row: Row, code_notes: bool = True) -> None:
    """Cells (percent, one value per seed with the metric) and the row's notes: seeds missing, failed,
    pending or damaged, values not recorded, stale or unknown code (unless ``old_code_note`` says it once for
    the table). Notes shared by several column groups are said once."""
    notes: dict[str, list[str]] = {}
    for gi, unit in sorted(row.units.items()):
        where = " / ".join(table.group_header(lv, gi) for lv in range(len(table.pivot)))
        for ci, (col, header) in enumerate(table.columns):
            cell = Cell()
            key = metric_key(row, col)
            lacking = []
            for seed in sorted(unit.runs, key=lambda s: (str(type(s)), s)):
                value = unit.runs[seed].get("metrics", {}).get(key)
                if value is None:
                    lacking.append(seed)
                    continue
                cell.seeds.append(seed)
                cell.values.append(100.0 * value)
            row.cells[(gi, ci)] = cell
            if lacking:
                notes.setdefault(f"{header} not recorded for seed(s) {', '.join(map(str, lacking))}", []).append(where)
        if unit.expected is not None:
            missing = [s for s in unit.expected if s not in unit.runs and s not in unit.problems]
            if missing:
                notes.setdefault(f"seed(s) {', '.join(map(str, missing))} missing ({never_run_hint(unit)})",
                                 []).append(where)
        for seed in sorted(unit.problems, key=str):
            notes.setdefault(unit.problems[seed], []).append(where)
        for text in (stale_notes(unit) + code_unknown_notes(unit)) * code_notes + numerics_notes(unit):
            notes.setdefault(text, []).append(where)
        for seed in sorted(unit.elsewhere, key=str):
            for text in unit.elsewhere[seed]:
                notes.setdefault(f"seed {seed}: {text}", []).append(where)
        if unit.trials:
            for text in [chosen_note(unit)] if chosen_note(unit) else []:
                notes.setdefault(text, []).append(where)
        elif unit.chosen:
            picks = "; ".join(f"seed {s}: {c}" for s, c in sorted(unit.chosen.items(), key=lambda x: str(x[0])))
            notes.setdefault(f"{SELECTION_TEXT[table.spec.select]}: {picks}", []).append(where)
        for source in sorted(set(unit.borrowed.values())):  # 'folder' or 'folder: why this one'
            seeds = [str(s) for s, f in sorted(unit.borrowed.items(), key=str) if f == source]
            folder, _, why = source.partition(": ")
            notes.setdefault(f"seed(s) {', '.join(seeds)} read from {folder}/ (the same run id, absent from this "
                             f"recipe's folder{'; ' + why if why else ''})", []).append(where)
    multi = len(table.groups) > 1
    for text, places in notes.items():
        if not multi:
            row.notes.append(text)
        elif len(places) == len(table.groups):
            row.notes.append(f"{text} (every column group)")
        else:
            row.notes.append(f"{', '.join(places)}: {text}")
    if multi and row.units and len(row.units) < len(table.groups):
        absent = [gi for gi in range(len(table.groups)) if gi not in row.units]
        row.notes.append("no configuration for " + ", ".join(
            " / ".join(table.group_header(lv, gi) for lv in range(len(table.pivot))) for gi in absent))


def old_code_note(rows: list[Row]) -> str:
    """One note for a table of several rows none of whose results was made by the code here (committed
    reference results, say): where they were made, instead of a stale or code-unknown footnote on every row.
    '' when any result shown is current (then each row says which of its seeds are not)."""
    stale = unknown = 0
    commits: set[str] = set()
    for row in rows:
        for unit in row.units.values():
            for seed, rec in unit.runs.items():
                if seed in unit.stale:
                    stale += 1
                elif seed in unit.code_unknown:
                    unknown += 1
                else:
                    return ""
                commit = (rec.get("prov") or {}).get("git_commit")
                if isinstance(commit, str) and commit:
                    commits.add(commit[:12])
    if len(rows) < 2 or not stale + unknown:
        return ""
    shown = sorted(commits)
    made = (f"made at commit{'s' if len(shown) > 1 else ''} {', '.join(shown[:5])}"
            + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")) if shown else "made by an earlier ltbench"
    parts = ([f"{stale} stale: the code has changed since ('--rerun-stale' redoes them)"] if stale else []) + \
            ([f"{unknown} code unknown: their code cannot be checked"] if unknown else [])
    return f"none of the {stale + unknown} results shown was made by the code here ({made}): {'; '.join(parts)}; " \
        "all are counted ('ltbench status' names the modules)"


def stale_notes(unit) -> list[str]:
    """'seed(s) 0, 1 stale: ...': finished results (counted) made by code that has changed since
    (identity.code_state: a module, an installed version, a data file), one note per set of changes."""
    by_modules: dict[str, list[str]] = {}
    for seed, modules in sorted(unit.stale.items(), key=lambda item: str(item[0])):
        more = f" and {len(modules) - 4} more" if len(modules) > 4 else ""
        by_modules.setdefault(", ".join(modules[:4]) + more, []).append(str(seed))
    redo = "ltbench posthoc --rerun-stale" if any(k.startswith("posthoc.") for k in unit.flat) \
        else "ltbench run --rerun-stale"
    return [f"seed(s) {', '.join(seeds)} stale: made by code that has changed since ({modules}); counted, "
            f"'{redo}' redoes them" for modules, seeds in by_modules.items()]


def code_unknown_notes(unit) -> list[str]:
    """'seed(s) 0, 1: code unknown (...)': finished results (counted) whose code cannot be checked against the
    files now (identity.code_state), one note per reason: such a number is never read as plain 'done'."""
    by_reason: dict[str, list[str]] = {}
    for seed, reason in sorted(unit.code_unknown.items(), key=lambda item: str(item[0])):
        by_reason.setdefault(str(reason), []).append(str(seed))
    return [f"seed(s) {', '.join(seeds)}: code unknown ({reason}); counted" for reason, seeds in by_reason.items()]


def numerics_notes(unit) -> list[str]:
    """A note when the seeds of one row were made under different numerics (identity.numerics_classes, the
    borrowing rule's comparison): 'seeds made under different numerics (threads): seed 0: CPU ..., 2 threads;
    seeds 1, 2: ..., 1 thread'."""
    seeds = sorted(unit.runs, key=str)
    classes, differ, unknown = identity.numerics_classes([_numerics(unit.runs[s]) for s in seeds])
    if len(classes) < 2:
        return []
    listing = "; ".join(f"seed{'s' if len(m) > 1 else ''} {', '.join(str(seeds[i]) for i in m)}: {text}"
                        for text, m in classes)
    if differ:
        return [f"seeds made under different numerics ({', '.join(differ)}): {listing}"]
    return [f"seeds whose numerics cannot be compared fully ({', '.join(unknown)} not recorded for some): {listing}"]


def _numerics(rec: dict) -> dict:
    return rec.get("numerics") if isinstance(rec.get("numerics"), dict) else {}


def table_numerics_note(table: Table) -> str | None:
    """The numerics of every run a table shows, said once: 'numerics of every result shown: CPU ..., 1 thread
    (12 results)', or each class (identity.numerics_classes) with the rows made under it and every field
    that differs between classes, so rows made under different numerics are never read as like for like."""
    recs, labels = [], []
    for row in table.rows:
        for unit in row.units.values():
            for rec in unit.runs.values():
                recs.append(_numerics(rec))
                labels.append(row.label)
    if not recs:
        return None
    classes, differ, unknown = identity.numerics_classes(recs)
    if len(classes) == 1:
        (text, members), = classes
        return f"numerics of every result shown: {text} ({len(members)} result{'s' if len(members) > 1 else ''})"
    parts = [f"{text}: {len(members)} result(s), rows "
             + ", ".join(repr(label) for label in dict.fromkeys(labels[i] for i in members))
             for text, members in classes]
    fields = "; ".join(filter(None, [", ".join(differ), unknown and f"not recorded for some: {', '.join(unknown)}"]))
    return f"results made under different numerics ({fields}; compare across them only through means and " \
        "spreads): " + "; ".join(parts)


def _note_missing_without_recipe(table: Table, seeds: list) -> None:
    """Without a recipe the expected seeds are unknown; still say when a row lacks seeds others have."""
    if len(table.rows) < 2:
        return
    for row in table.rows:
        for gi, unit in row.units.items():
            have = set(unit.runs) | set(unit.problems)
            lacking = [s for s in seeds if s not in have]
            if lacking and have:
                prefix = (" / ".join(table.group_header(lv, gi) for lv in range(len(table.pivot))) + ": ") \
                    if len(table.groups) > 1 else ""
                row.notes.append(f"{prefix}no run for seed(s) {', '.join(map(str, lacking))} (other rows have them)")


def cost_runs(row: Row) -> list[dict]:
    """The runs a row's numbers cost: those it reports and, for a tuned row, every run of its search (the
    budget spent choosing is part of what the row cost), failed and pruned trials included."""
    return [rec for u in row.units.values() for t in ([u, *u.trials] if u.trials else [u])
            for rec in [*t.runs.values(), *(t.failed.values() if u.trials else ())]
            if rec.get("status") in ("done", "failed")]


def run_seconds(rec: dict) -> float | None:
    """A result's device-seconds; a failed one records none, so its last session's wall time x its devices."""
    prov = rec.get("prov") or {}
    if rec.get("status") == "failed" and prov.get("device_seconds") is None:
        wall = prov.get("wall_seconds")
        return wall * (prov.get("world_size") or 1) if isinstance(wall, (int, float)) and wall >= 0 else None
    return prov.get("device_seconds")


def row_cost_seconds(row: Row) -> float | None:
    """Device-seconds of ``cost_runs`` (each result's ``device_seconds``: all its sessions, times its devices);
    None when there is no run, or when any of them has no recorded cost (a partial sum would understate it)."""
    costs = [run_seconds(rec) for rec in cost_runs(row)]
    if not costs or any(c is None for c in costs):
        return None
    return sum(costs)


def hours_text(hours: float) -> str:
    """Device-hours as a table prints them: two significant digits below 1 h, '<0.01' below 36 s."""
    if hours >= 100:
        return f"{hours:.0f}"
    if hours >= 1:
        return f"{hours:.1f}"
    return f"{hours:.2f}" if hours >= 0.01 else "<0.01"


def cost_text(row: Row) -> str:
    seconds = row_cost_seconds(row)
    return "–" if seconds is None else hours_text(seconds / 3600)


def cost_notes(table: Table) -> list[str]:
    """What the Cost column counts, on which devices, and the rows whose cost is unknown."""
    devices, unknown = {}, 0
    for row in table.rows:
        for rec in cost_runs(row):
            if run_seconds(rec) is None:
                unknown += 1
                continue
            numerics = rec.get("numerics") or {}
            name = numerics.get("device_model") or numerics.get("cpu_model") or (rec.get("prov") or {}).get("device")
            kind = str((rec.get("prov") or {}).get("device") or "?").split(":")[0].upper()
            device = shorten(f"{kind} {name}" if name else kind, 100)  # names from the disk: bounded
            devices[device] = devices.get(device, 0) + 1
    notes = []
    if devices:
        where = ", ".join(f"{d} ({n} run{'s' if n > 1 else ''})" for d, n in devices.items())
        notes.append(f"Cost: device-hours of the runs behind each row, every session and device counted; a tuned "
                     f"row's cost is its whole search (every trial on every tuning seed, failed and pruned ones at their "
                     f"last session's wall time, and the report runs); on {where}")
    if unknown:
        notes.append(f"Cost: '–' where a run's cost is unknown ({unknown} result(s) list device_seconds as "
                     f"unrecorded: a stage-2 result, which does not count its stage-1 run, or a run recorded before "
                     f"ltbench kept its cost)")
    return notes


def n_text(table: Table, row: Row) -> str:
    """'3/3' (with a recipe) or '3': distinct seeds with a finished run; a range across column groups."""
    done = [sum(1 for r in u.runs.values() if r["status"] == "done") for u in row.units.values()]
    if not done:
        return "0"
    n = str(done[0]) if min(done) == max(done) else f"{min(done)}–{max(done)}"
    if table.expected_seeds:
        exp = [len(u.expected or []) for u in row.units.values()]
        n += "/" + (str(exp[0]) if min(exp) == max(exp) else f"{min(exp)}–{max(exp)}")
    return n


def mark_best(table: Table) -> None:
    """Bold best, underline second best, per column within each column group and row group. Ties on
    the printed value share the mark. Needs two candidates (three for a second best)."""
    digits = table.spec.digits
    for gi in range(len(table.groups)):
        for ci in range(len(table.columns)):
            for group in table.scopes():
                cells = [r.cells.get((gi, ci)) for r in table.rows if table.scope_of(r) == group and not r.published]
                scored = [c for c in cells if c is not None and c.mean is not None]
                if len(scored) < 2:
                    continue
                distinct = sorted({round(c.mean, digits) for c in scored}, reverse=True)
                for c in scored:
                    c.best = round(c.mean, digits) == distinct[0]
                    c.second = len(scored) >= 3 and len(distinct) > 1 and round(c.mean, digits) == distinct[1]


__all__ = ["build_table", "n_text", "flatten", "Unit"]
