"""What a row is, and the numbers in it.

A row is one distinct resolved configuration: everything that enters the run id except the seed
(with a pivot, less the pivoted keys, which become column groups). Runs with the same run id count
once (a copied run folder never changes n); n counts distinct seeds. Given a recipe, only the
recipe's own runs are shown, each row knows the seeds it expects, and every seed that is missing,
failed, still pending or damaged is named in a note. A different configuration never shares a row:
an explicit row whose selector matches two configurations is an error, not an average.

Labels come from the fields in which rows differ (method parameters are compared only between rows
of the same method), written canonically (1 and 1.0 both print as 1), so ``la (tau=1)`` reads the
same however the YAML was written. Rows keep the recipe's grid order.
"""

from __future__ import annotations

import fnmatch
import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ltbench.config import value_text
from ltbench.errors import ConfigError
from ltbench.results.identity import DATA_IDENTITY, numerics_contrast
from ltbench.results.store import OLDER
from ltbench.priors import prior_order
from ltbench.search import trial_problem
from ltbench.recipe.selection import matches
from ltbench.recipe.tables import ALL_PRIORS, TEMPLATE_FIELD, TableSpec, column_metric, versus_targets
AUTO_GROUP_KEYS = ("data.name", "data.imb_factor", "backbone.name")


# ------------------------------------------------------------------------------------------------
# Values and labels


@functools.lru_cache(maxsize=65536, typed=True)  # typed: 1, 1.0 and True are three keys
def _scalar_text(v) -> str:
    return value_text(v)


def _text(v: Any) -> str:
    """``value_text``, remembered for scalars: labels and row keys of 1,000 rows ask it 100,000 times about
    a few hundred distinct values."""
    return value_text(v) if isinstance(v, (list, tuple, dict)) else _scalar_text(v)


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def short_key(key: str) -> str:
    if key == "sampler.name":  # 'sampler=class_balanced', not 'name=class_balanced'
        return "sampler"
    return key.split(".", 1)[1] if "." in key else key


STAGE2 = "posthoc."  # the config section of a stage-2 result (ltbench/stage2/posthoc_runs.py)


def default_labels(flats: list[dict[str, Any]], skip: set[str], displays: list[str | None] | None = None) -> list[str]:
    """'run label' or, for a stage-2 result, 'run label + stage-2 label': each is a name plus the fields
    in which the row differs from the others (fields compared between rows of the same name). A run's name is
    its method's display name (``displays``, from its results' ``method_display``: "LDAM-DRW"), else its id."""
    runs = [{k: v for k, v in f.items() if not k.startswith(STAGE2)} for f in flats]
    labels = _named_labels(runs, skip, displays)
    stage2 = [{("method." + k[len(STAGE2):]): v for k, v in f.items() if k.startswith(STAGE2)} for f in flats]
    which = [i for i, f in enumerate(stage2) if f]
    for i, text in zip(which, _named_labels([stage2[i] for i in which], set())):
        labels[i] += " + " + text
    return labels


def _named_labels(flats: list[dict[str, Any]], skip: set[str], displays: list[str | None] | None = None) -> list[str]:
    """Method name (or its display name) plus the fields in which a row differs from the others (method
    fields compared only between rows of the same method). Linear in rows x fields: tables of 1,000 rows stay fast."""
    names = [str(f.get("method.name", "?")) for f in flats]
    keys = sorted(k for k in {k for f in flats for k in f} - skip - {"method.name"}
                  if not k.startswith("search."))  # a tuned row's budget: its [tuned] mark and the caption say it
    texts = [{k: _text(f[k]) if k in f else "<absent>" for k in keys} for f in flats]
    varying_all = {k for k in keys if not k.startswith("method.") and len({t[k] for t in texts}) > 1}
    seen_by_method: dict[str, dict[str, set]] = {}
    for name, t in zip(names, texts):
        per = seen_by_method.setdefault(name, {})
        for k in keys:
            if k.startswith("method."):
                per.setdefault(k, set()).add(t[k])
    varying_method = {name: {k for k, v in per.items() if len(v) > 1} for name, per in seen_by_method.items()}
    labels = []
    for f, name, t, display in zip(flats, names, texts, displays or [None] * len(flats)):
        parts = [f"{short_key(k)}={t[k]}" for k in keys
                 if k in f and (k in varying_all or k in varying_method[name])]
        labels.append((display or name) + (f" ({', '.join(parts)})" if parts else ""))
    return labels


def display_name(units) -> str | None:
    """The display name the results of a row's units record for their method (``method_display``), None when
    every one lists it unrecorded (migrated from before methods declared one: the label is then the method's
    id, as those results' tables showed it). Several (results of code versions that named it differently):
    the one sorted first, so a label never depends on file order."""
    names = {rec["method_display"] for u in units for rec in u.runs.values()} - {None}
    return min(names) if names else None


def group_title(spec: TableSpec, value) -> str:
    """The section title of a ``group_by`` value: from ``group_labels``, else 'epochs=200'."""
    labels = {value_text(k) if not isinstance(k, str) else k: v for k, v in spec.group_labels.items()}
    return labels.get(value_text(value), f"{short_key(spec.group_by)}={value_text(value)}")


def template_label(template: str, flat: dict[str, Any]) -> str:
    return TEMPLATE_FIELD.sub(lambda m: value_text(flat[m.group(1)]) if m.group(1) in flat else "?", template)


# ------------------------------------------------------------------------------------------------
# The table model


@dataclass
class Cell:
    seeds: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)  # percent, one per seed
    best: bool = False
    second: bool = False
    similar: bool = False  # not significantly different from the best of its column and group
    delta: float | None = None  # ours - published, when a published entry matches

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return sum(self.values) / len(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        if len(self.values) < 2:
            return None
        m = self.mean
        return math.sqrt(sum((v - m) ** 2 for v in self.values) / (len(self.values) - 1))


@dataclass
class Row:
    label: str
    group: str | None = None
    highlight: bool = False
    head: str | None = None
    marks: dict[str, bool] = field(default_factory=dict)
    units: dict[int, "Unit"] = field(default_factory=dict)  # column group index -> configuration
    cells: dict[tuple[int, int], Cell] = field(default_factory=dict)  # (column group, column) -> cell
    notes: list[str] = field(default_factory=list)
    published: str | None = None  # source, for a published reference row
    versus: list["Row"] = field(default_factory=list)  # rows this one is compared with (spec: versus)


@dataclass
class Comparison:
    """A row against a reference row it names: per cell (column group, column), the difference of the
    means in points and a p-value (None: the test could not be made, e.g. fewer than two seeds)."""
    row: Row
    reference: Row
    cells: dict[tuple[int, int], tuple[float, float | None]] = field(default_factory=dict)
    no_test: dict[tuple[int, int], str] = field(default_factory=dict)  # cell -> why it has no p-value
    unadjusted: dict[tuple[int, int], float] = field(default_factory=dict)  # cell -> p before Holm (when applied)
    detectable: dict[tuple[int, int], float] = field(default_factory=dict)  # cell -> minimum detectable difference


@dataclass
class Unit:
    """One configuration: its flat identity, the seeds a recipe expects and the runs found."""
    key: str
    flat: dict[str, Any]
    order: int
    expected: list[int] | None = None
    runs: dict[int, dict] = field(default_factory=dict)  # seed -> record (done preferred)
    problems: dict[int, str] = field(default_factory=dict)  # seed -> status text (failed, pending, ...)
    borrowed: dict[int, str] = field(default_factory=dict)  # seed -> sibling recipe folder it was read from
    stale: dict[int, list] = field(default_factory=dict)  # seed -> modules changed since its result was made
    code_unknown: dict[int, str] = field(default_factory=dict)  # seed -> why its result's code cannot be checked
    elsewhere: dict[int, list] = field(default_factory=dict)  # seed -> notes on other results of its run id
    chosen: dict[int, str] = field(default_factory=dict)  # seed -> the setting a selected row took (select:)
    search: dict | None = None  # a trial's record (grid['search']); a tuned unit's: the same less the trial
    trials: list = field(default_factory=list)  # a tuned unit: the trial units it selected among (report/tuned.py)
    trial_seeds: set = field(default_factory=set)  # seeds on which this configuration ran as a search's trial
    failed: dict[int, dict] = field(default_factory=dict)  # seed -> a failed record (a search's cost counts it)
    picked: int | None = None  # a tuned unit: the index in ``trials`` of the draw chosen on validation


@dataclass
class Table:
    name: str
    spec: TableSpec
    columns: list[tuple[str, str]]  # (metric key, header)
    pivot: list[str]
    groups: list[tuple]  # pivot values per column group (one empty tuple without a pivot)
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    test: str | None = None  # significance test used, if any
    expected_seeds: bool = False  # rows show n/expected (a recipe was given)
    comparisons: list[Comparison] = field(default_factory=list)  # rows' ``versus``, in row order
    comparison_test: str | None = None  # the test behind the comparisons' p-values
    cost: bool = False  # a 'Cost' column (device-hours, report/build.py: cost_text)

    def scope_of(self, row: Row):
        """The rows a row competes with for best and is tested against: its row group, unless the table
        says across the whole table (``best_scope: table``)."""
        return None if self.spec.best_scope == "table" else row.group

    def scopes(self) -> list:
        return list(dict.fromkeys(self.scope_of(r) for r in self.rows))

    def group_header(self, level: int, gi: int) -> str:
        key, value = self.pivot[level], self.groups[gi][level]
        labels = {value_text(k) if not isinstance(k, str) else k: v
                  for k, v in (self.spec.pivot_labels.get(key) or {}).items()}
        return labels.get(value_text(value), value_text(value))


# ------------------------------------------------------------------------------------------------
# From records to units


def gather_units(records: list[dict], expected: list[dict] | None) -> tuple[list[Unit], list[str]]:
    """Group run records by configuration. ``expected``: a recipe's runs (run_id, key, seed, flat)
    in grid order; records of other runs are left out and said so. Returns (units, global notes)."""
    units: dict[str, Unit] = {}
    by_run: dict[str, tuple[str, int]] = {}
    notes: list[str] = []
    if expected is not None:
        for i, e in enumerate(expected):
            u = units.setdefault(e["key"], Unit(e["key"], e["flat"], i, expected=[], search=e.get("search")))
            if e["seed"] not in u.expected:
                u.expected.append(e["seed"])
            if e.get("search") is not None:
                u.search = u.search or e["search"]
                u.trial_seeds.add(e["seed"])
            by_run[e["run_id"]] = (e["key"], e["seed"])
    foreign, seen_runs, older = [], {}, []
    for rec in records:
        if rec["status"] == OLDER:
            older.append(rec)
            continue
        run_id = rec.get("run_id") or rec["dir"].rstrip("/").rsplit("/", 1)[-1]
        if expected is not None:
            target = by_run.get(run_id) or by_run.get(rec["dir"].rstrip("/").rsplit("/", 1)[-1])
            if target is None or ("key" in rec and rec["key"] != target[0]):
                foreign.append(rec)
                continue
            key, seed = target
        elif "key" in rec:
            key, seed = rec["key"], rec.get("seed")
            if key not in units:
                trial = (rec.get("grid") or {}).get("search")
                units[key] = Unit(key, flatten(rec["config"]), len(units), search=None if trial_problem(trial) else trial)
            trial = (rec.get("grid") or {}).get("search")
            if not trial_problem(trial):
                units[key].search = units[key].search or trial
                units[key].trial_seeds.add(seed)
        else:
            notes.append(f"{_name(rec)}: {rec.get('note', 'unreadable run folder')}; left out")
            continue
        unit = units[key]
        if run_id in seen_runs and rec["status"] == "done" and unit.runs.get(seed, {}).get("status") == "done":
            notes.append(duplicate_note(rec, unit.runs[seed], run_id, seen_runs[run_id]))
            continue
        seen_runs.setdefault(run_id, _name(rec))
        _place(unit, seed, rec)
    if older:
        notes.append(f"{len(older)} run folder(s) left out ({', '.join(_name(r) for r in older[:3])}"
                     f"{', ...' if len(older) > 3 else ''}): {older[0]['note']}")
    if foreign:  # one sentence, no run ids (they would fill a paper's float): the command that shows them
        folder = shown_path(foreign[0]["dir"].rstrip("/").rsplit("/", 1)[0])
        notes.append(f"{len(foreign)} run folder(s) in {folder} are not runs of this recipe as written (other "
                     f"settings, e.g. command-line overrides, or another version of it) and are in none of these "
                     f"tables: 'ltbench table {folder}' shows them")
        notes += other_data_notes(foreign, expected)
    return sorted(units.values(), key=lambda u: u.order), notes


def duplicate_note(rec: dict, kept: dict, run_id: str, kept_name: str) -> str:
    """A second result of one run id in the results read: a copy (counted once), or, when its numerics or its
    numbers differ, another result that is named and not counted (identity.numerics_difference)."""
    mine, theirs = rec.get("numerics") or {}, kept.get("numerics") or {}
    contrast = numerics_contrast(mine, theirs) if isinstance(mine, dict) and isinstance(theirs, dict) else ""
    same_numbers = (rec.get("metrics") or {}).get("all") == (kept.get("metrics") or {}).get("all")
    if not contrast and same_numbers:
        return f"{_name(rec)} is a copy of run {run_id} ({kept_name}): counted once"
    how = f"other numerics ({contrast})" if contrast else "other numbers"
    return f"{_name(rec)} is another result of run {run_id}, made under {how}: not counted ({kept_name} is)"


def other_data_notes(foreign: list[dict], expected: list[dict]) -> list[str]:
    """Say when left-out runs were made from other data than the recipe's now (a dataset that names its
    data by a digest of its files, identity.DATA_IDENTITY): the files under data.root have changed."""
    now = {e["flat"].get(DATA_IDENTITY) for e in expected} - {None}
    before = [r for r in foreign if (r.get("config") or {}).get(DATA_IDENTITY) not in (None, *now)]
    if not now or not before:
        return []
    old = sorted({r["config"][DATA_IDENTITY] for r in before})
    return [f"{len(before)} of them were made from other data (data identity {', '.join(old[:3])}; this "
            f"recipe's data now: {', '.join(sorted(now)[:3])}): the dataset's files changed since those runs"]


def shown_path(path) -> str:
    """A folder as a command line would name it: relative to the working directory when inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return str(path)


def _name(rec: dict) -> str:
    return rec.get("name") or rec["dir"].rstrip("/").rsplit("/", 1)[-1]


def _place(unit: Unit, seed, rec: dict) -> None:
    status = rec["status"]
    if status == "done" and not (rec.get("note") and not rec.get("metrics")):
        old = unit.runs.get(seed)
        if old is None or old["status"] != "done":
            unit.runs[seed] = rec
            unit.problems.pop(seed, None)
        if rec.get("note"):
            unit.problems.setdefault(seed, f"seed {seed}: {rec['note']}")
        if unit.runs[seed] is rec:
            for name in ("stale", "code_unknown", "elsewhere"):
                getattr(unit, name).pop(seed, None)
                if rec.get(name):
                    getattr(unit, name)[seed] = rec[name]
        if rec.get("borrowed"):
            unit.borrowed[seed] = rec["borrowed"] + (f": {rec['borrowed_why']}" if rec.get("borrowed_why") else "")
        return
    if seed in unit.runs and unit.runs[seed]["status"] == "done":
        return
    if status == "failed":
        unit.failed[seed] = rec
    text = {"failed": f"seed {seed} failed" + (f" ({rec['error']})" if rec.get("error") else ""),
            "running": f"seed {seed} still running", "pending": f"seed {seed} pending",
            "interrupted": f"seed {seed} interrupted (ltbench run resumes it)",
            "conflict": f"seed {seed}: {rec.get('note')}"}.get(
        status, f"seed {seed} damaged: {rec.get('note', 'unreadable')} ({_name(rec)})")
    unit.problems[seed] = text


# ------------------------------------------------------------------------------------------------
# Columns and rows


def metric_names(units: list[Unit], prefix: str) -> set[str]:
    """Names of the metrics starting with ``prefix`` that some run of these units recorded."""
    out: set[str] = set()
    for u in units:
        for r in u.runs.values():
            m = r.get("metrics") or {}
            names = m.names(prefix) if hasattr(m, "names") else [k for k in m if k.startswith(prefix)]
            out.update(names)
    return out


def expand_columns(spec: TableSpec, units: list[Unit]) -> list[tuple[str, str]]:
    cols = []
    for name in spec.columns:
        if name == ALL_PRIORS:
            priors = sorted({k.split(":")[1] for k in metric_names(units, "prior:")}, key=prior_order)
            cols += [column_metric(p) for p in priors]
        else:
            cols.append(column_metric(name))
    return cols


def group_values(units: list[Unit], pivot: list[str], spec: TableSpec) -> list[tuple]:
    seen = []
    for u in units:
        g = tuple(u.flat.get(k) for k in pivot)
        if g not in seen:
            seen.append(g)

    def rank(g: tuple) -> tuple:
        out = []
        for level, key in enumerate(pivot):
            order = [value_text(k) if not isinstance(k, str) else k for k in (spec.pivot_labels.get(key) or {})]
            text = value_text(g[level])
            out.append(order.index(text) if text in order else len(order))
        return tuple(out)

    return sorted(seen, key=lambda g: (rank(g), seen.index(g)))


def matches_selector(flat: dict, where: dict) -> bool:
    """Every selector key equal. A stage-2 result is selected only by a selector that names a
    ``posthoc.*`` key, so {method.name: ce} picks the trained run, not every stage 2 fitted on it."""
    if any(k.startswith(STAGE2) for k in flat) and not any(k.startswith(STAGE2) for k in where):
        return False
    return matches(flat, {k: [v] for k, v in where.items()})  # the one selector rule (recipe/selection.py)


def explicit_rows(spec: TableSpec, units: list[Unit], groups: list[tuple], pivot: list[str],
                  where: str) -> list[Row]:
    rows = []
    for i, rs in enumerate(spec.rows):
        row = Row(rs.label or f"row {i + 1}", rs.group, rs.highlight, rs.head, dict(rs.marks))
        for gi, g in enumerate(groups):
            hits = [u for u in units if tuple(u.flat.get(k) for k in pivot) == g and matches_selector(u.flat, rs.where)]
            if len(hits) > 1 and spec.select:
                row.units[gi] = selected_unit(hits, spec.select)
                if not row.label.endswith("]"):
                    row.label += f" [{SELECTION_TEXT[spec.select]}]"
                continue
            if len(hits) > 1:
                differ = sorted(k for k in set().union(*(h.flat for h in hits))
                                if len({value_text(h.flat.get(k)) for h in hits}) > 1)
                raise ConfigError(f"{where}.rows[{i}].where matches {len(hits)} different configurations "
                                  f"(they differ in {', '.join(differ[:6])}): add one of these keys to the selector, "
                                  f"show each value as a column group (pivot: [{differ[0]}]) or a row group "
                                  f"(group_by: {differ[0]}), or choose among them per seed with 'select: val' "
                                  f"(ltbench table --select val)")
            if hits:
                row.units[gi] = hits[0]
        if not row.units:
            row.notes.append("no configuration of this recipe matches this row's selector")
        rows.append(row)
    for i, row in enumerate(rows):
        row.versus = [rows[j] for j in versus_targets(spec.rows, i, f"{where}.rows[{i}].versus")]
    return rows


SELECTED_BY = {"val": "val:all", "test": "all"}
SELECTION_TEXT = {"val": "selected on validation", "test": "oracle: best on the test set"}


def selected_unit(hits: list[Unit], select: str) -> Unit:
    """One configuration per seed out of several a row matches: per seed, the finished setting with the best
    validation All ('val') or test All ('test', an oracle), the earliest of ties in grid order. The result is
    a Unit like any other (cells, n, significance read it unchanged); its ``chosen`` says what was picked."""
    metric = SELECTED_BY[select]
    differ = sorted(k for k in set().union(*(h.flat for h in hits)) if len({value_text(h.flat.get(k)) for h in hits}) > 1)
    flat = {k: v for k, v in hits[0].flat.items() if k not in differ}
    expected = sorted(set().union(*(h.expected or [] for h in hits)), key=str) if hits[0].expected is not None else None
    unit = Unit("select:" + ",".join(h.key for h in hits), flat, hits[0].order, expected)
    for seed in sorted(set().union(*(h.runs for h in hits), *(h.problems for h in hits)), key=str):
        scored = [(h.runs[seed]["metrics"][metric], -i, h) for i, h in enumerate(hits)
                  if h.runs.get(seed, {}).get("status") == "done" and h.runs[seed].get("metrics", {}).get(metric) is not None]
        if not scored:
            unit.problems[seed] = (f"seed {seed}: no setting has {'validation' if select == 'val' else 'test'} metrics to "
                                   f"select on" + (" (set data.val_per_class or data.val_split)" if select == "val" else ""))
            continue
        # the settings that have this seed at all
        among = [h for h in hits if seed in h.runs or seed in h.problems or seed in (h.expected or [])]
        _, _, best = max(scored, key=lambda x: (x[0], x[1]))
        unit.runs[seed] = best.runs[seed]
        for name in ("stale", "code_unknown", "elsewhere", "borrowed"):  # what the chosen result's notes say
            if seed in getattr(best, name):
                getattr(unit, name)[seed] = getattr(best, name)[seed]
        unit.chosen[seed] = ", ".join(f"{short_key(k)}={value_text(best.flat.get(k))}" for k in differ)
        if len(scored) < len(among):
            unit.problems[seed] = f"seed {seed}: selected among {len(scored)} of {len(among)} settings (the others unfinished or unscored)"
    return unit


def natural_key(text: str) -> list:
    """'backward10' after 'backward2'; 'ρ=10' before 'ρ=100'."""
    return [(0, float(t), "") if re.fullmatch(r"\d+(\.\d+)?", t) else (1, 0.0, t)
            for t in re.findall(r"\d+(?:\.\d+)?|\D+", text or "")]


def default_rows(spec: TableSpec, units: list[Unit], groups: list[tuple], pivot: list[str],
                 auto_group: bool, by_label: bool = False) -> list[Row]:
    """One row per configuration (less the pivot keys): in grid order with a recipe, else by label."""
    skip = set(pivot) | ({spec.group_by} if spec.group_by else set())
    grouped_by = [k for k in AUTO_GROUP_KEYS if auto_group and len({value_text(u.flat.get(k)) for u in units}) > 1
                  and k not in skip]
    skip |= set(grouped_by)
    identities: dict[str, dict] = {}
    members: dict[str, dict[int, Unit]] = {}
    for u in units:
        ident = {k: v for k, v in u.flat.items() if k not in pivot}
        rk = repr(sorted((k, _text(v)) for k, v in ident.items()))
        identities.setdefault(rk, ident)
        gi = groups.index(tuple(u.flat.get(k) for k in pivot))
        members.setdefault(rk, {})[gi] = u
    keys = list(identities)
    flats = [identities[k] for k in keys]
    labels = [template_label(spec.row_label, f) for f in flats] if spec.row_label else \
        default_labels(flats, skip, [display_name(members[rk].values()) for rk in keys])
    rows = []
    for rk, label, flat in zip(keys, labels, flats):
        group = group_title(spec, flat.get(spec.group_by)) if spec.group_by else None
        if grouped_by:
            group = ", ".join(f"{short_key(k)}={value_text(flat.get(k))}" if k != "data.name"
                              else value_text(flat.get(k)) for k in grouped_by)
        rows.append(Row(label, group, units=members[rk]))
    _disambiguate(rows)
    if by_label:
        rows.sort(key=lambda r: (natural_key(r.group or ""), natural_key(r.label)))
    return rows


def _disambiguate(rows: list[Row]) -> None:
    """Two rows never print the same label: a template that ignores a differing field gets a suffix."""
    counts: dict[tuple, int] = {}
    for r in rows:
        counts[(r.group, r.label)] = counts.get((r.group, r.label), 0) + 1
    for r in rows:
        if counts[(r.group, r.label)] > 1:
            r.label += " #" + next(iter(r.units.values())).key[:6]


def expand_heads(rows: list[Row], patterns: list[str]) -> list[Row]:
    """One row per row and per head whose name matches a pattern (fnmatch): 'label · head'."""
    out = []
    for row in rows:
        heads = sorted({k.split(":")[1] for k in metric_names(list(row.units.values()), "head:")})
        for h in heads:
            if any(fnmatch.fnmatch(h, p) for p in patterns):
                out.append(Row(f"{row.label} · {h}", row.group, row.highlight, h, dict(row.marks), row.units))
    if rows and not out and any(u.runs for r in rows for u in r.units.values()):
        all_heads = sorted({k.split(":")[1] for k in metric_names([u for r in rows for u in r.units.values()],
                                                                    "head:")})
        raise ConfigError(f"no head matches '{','.join(patterns)}'; heads in these results: "
                          f"{', '.join(all_heads) or '(none)'}")
    return out
