"""The ``tables:`` section of a recipe: what a table shows, checked when the recipe is loaded.

A table names its rows (each a display label plus a selector on config values, optionally a
prediction head; or a label template over config values), its columns (metrics: many / medium /
few / all, shifted priors such as forward50 ... uniform ... backward50, named test sets, heads),
an optional pivot of config keys into column groups (dataset x imbalance factor, backbone, ...),
switch columns shown as check marks, row groups, rows compared with a reference row (``versus``: a
difference and a p-value per cell), and how numbers are printed. Example::

    tables:
      ablation:
        caption: Ablation (BAPE paper, Table 6 shape)
        columns: [many, medium, few, all]
        switches: [Prior, DA]
        rows:
          - {label: "w/o Prior & DA", where: {method.prior: false}, head: sum_da_none, marks: {Prior: false, DA: false}}
          - {label: Ours, where: {method.prior: true}, head: sum_da_shared_kappa, marks: {Prior: true, DA: true}, highlight: true}

Everything here is plain data (no torch, no pandas), so a recipe is validated before any run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from ltbench.config import from_dict
from ltbench.errors import ConfigError, short_repr
from ltbench.priors import HINT, is_prior_name
from ltbench.results.schema import SHOT_GROUPS

# posthoc: stage-2 results (ltbench/stage2/posthoc_runs.py); search: a tuned row's budget (search.trials, .sampler, .seed;
# report/tuned.py), which only tuned rows have, so {method.name: ce, search.trials: 4} tells the tuned CE from the fixed one
SECTIONS = ("data", "backbone", "method", "optim", "train", "eval", "posthoc", "sampler", "search")
GROUPS = (*SHOT_GROUPS, "all")  # the group columns, in table order
HEADERS = {"many": "Many", "medium": "Medium", "few": "Few", "all": "All"}
TEMPLATE_FIELD = re.compile(r"\{([A-Za-z_][\w.]*)\}")


@dataclass
class RowSpec:
    label: str | None = None
    where: dict[str, Any] = field(default_factory=dict)  # dotted config key -> value
    head: str | None = None  # read this prediction head's metrics instead of the main prediction
    group: str | None = None  # row group (section) this row belongs to
    highlight: bool = False  # shaded as "ours"
    marks: dict[str, bool] = field(default_factory=dict)  # switch column name -> check / cross
    versus: str | list[str] | None = None  # label(s) of rows this one is compared with (difference, p-value)


@dataclass
class TableSpec:
    caption: str = ""
    label: str = ""  # LaTeX \label
    include: list[str] = field(default_factory=list)  # other recipe files (relative to this one) whose runs join
    where: dict[str, Any] = field(default_factory=dict)  # only configurations with these values
    rows: list[RowSpec] | None = None  # None: one row per distinct configuration, in grid order
    row_label: str | None = None  # template over config values, e.g. "{method.name} (tau={method.tau})"
    columns: list[str] = field(default_factory=lambda: list(GROUPS))
    pivot: list[str] = field(default_factory=list)  # config keys whose values become column groups
    pivot_labels: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> value -> header text
    switches: list[str] = field(default_factory=list)  # check-mark columns; values from rows' marks
    switch_keys: dict[str, str] = field(default_factory=dict)  # switch name -> config key (truthiness)
    group_by: str | None = None  # config key whose values make row groups
    group_labels: dict[str, str] = field(default_factory=dict)  # group value -> section title
    heads: list[str] = field(default_factory=list)  # one row per configuration and per head (fnmatch)
    digits: int = 2
    std: bool = True
    best: bool = True  # bold best, underline second best per column within each column group
    best_scope: str = "group"  # 'group': also within each row group (epoch sections); 'table': across row groups
    published: bool = False  # add matching published results as reference rows (dagger) and a delta column
    published_method: dict[str, str] = field(default_factory=dict)  # row label -> published method name
    # A row whose selector matches several configurations (a tau sweep, the stage-2 settings of one run) is
    # one selected cell per seed: 'val' takes the setting with the best validation All and reports its test
    # numbers; 'test' takes the best on the test set itself, and the row says it is an oracle. None: refused.
    select: str | None = None
    # LaTeX, never scaled: 'column' (a table in one column), 'page' (a table* across both) or 'auto' (a column
    # when some layout fits one, else the page); ltbench/report/latex.py
    width: str = "auto"
    # LaTeX notes under the table: 'full', 'short' (the legend, each row note cut to two lines, where the rest is),
    # 'none', or 'auto' (full when the float fits the page's height, else short); ltbench/report/latex.py
    notes: Literal["auto", "full", "short", "none"] = "auto"
    differences: str = "table"  # LaTeX: versus differences in a tabular of their own ('table') or under each row ('rows')
    # Holm's correction of the versus comparisons' p-values: over the whole block ('holm'), within each row
    # pair ('holm:row': shot groups, priors) or within each column ('holm:column'); None: uncorrected.
    correction: str | None = None
    # A 'Cost' column: the device-hours of the runs behind each row (a tuned row: of its whole search). None: shown
    # when the table has a tuned row (report/build.py, row_cost_seconds).
    cost: bool | None = None

    def validate(self) -> None:
        if not 0 <= self.digits <= 6:
            raise ValueError(f"digits: expected 0 to 6, got {self.digits}")
        if self.rows is not None and self.row_label is not None:
            raise ValueError("give either rows (explicit) or row_label (a template), not both")
        if self.best_scope not in ("group", "table"):
            raise ValueError(f"best_scope: expected 'group' or 'table', got {self.best_scope!r}")
        if self.width not in ("auto", "column", "page"):
            raise ValueError(f"width: expected 'auto', 'column' (one column of the page) or 'page' (table*), "
                             f"got {self.width!r}")
        if self.differences not in ("table", "rows"):
            raise ValueError(f"differences: expected 'table' (a tabular of their own) or 'rows' (under each row "
                             f"compared), got {self.differences!r}")
        if self.rows is not None and self.heads:
            raise ValueError("heads expands default rows; with explicit rows give each row its own head")
        if self.select not in (None, "val", "test"):
            raise ValueError(f"select: expected val (the validation split) or test (an oracle), got {self.select!r}")
        if self.correction not in (None, *CORRECTIONS):
            raise ValueError(f"correction: expected one of {', '.join(CORRECTIONS)} (Holm's correction of the "
                             f"versus p-values), got {self.correction!r}")


CORRECTIONS = ("holm", "holm:row", "holm:column")  # the families of report.significance_marks.adjust


def row_label(rows: list[RowSpec], i: int) -> str:
    return rows[i].label or f"row {i + 1}"


def versus_targets(rows: list[RowSpec], i: int, where: str) -> list[int]:
    """Indices of the rows that row ``i`` names in ``versus``. A label is looked up in the row's own
    row group first (labels are unique there), then in the whole table, where it must be unique."""
    out, versus = [], rows[i].versus
    for label in [versus] if isinstance(versus, str) else versus or []:
        same = [j for j, r in enumerate(rows) if row_label(rows, j) == label]
        local = [j for j in same if rows[j].group == rows[i].group]
        hits = local or same
        if not hits:
            raise ConfigError(f"{where}: no row is labelled {label!r}; expected the label of another row of "
                              f"this table")
        if len(hits) > 1:
            raise ConfigError(f"{where}: {label!r} labels rows in {len(hits)} row groups; give the rows "
                              f"distinct labels")
        if hits[0] == i:
            raise ConfigError(f"{where}: a row cannot be compared with itself ({label!r})")
        out.append(hits[0])
    return out


def check_key(key: str, where: str) -> None:
    parts = key.split(".")
    if len(parts) < 2 or parts[0] not in SECTIONS or not all(parts):
        raise ConfigError(f"{where}: '{key}' is not a dotted config key; expected <section>.<field> with section "
                          f"one of {', '.join(SECTIONS)} (e.g. method.tau, data.imb_factor)")


ALL_PRIORS = "priors"  # the column that expands into one column per recorded shifted prior


def check_column(name: str, where: str) -> None:
    if name != ALL_PRIORS:
        column_metric(name, where)


def column_metric(name: str, where: str = "column") -> tuple[str, str]:
    """The one grammar of a table column other than ``priors``: (the metric key in a run's flat metrics, the
    header). A group (many, medium, few, all), a shifted prior name, prior:<prior>[:<group>], set:<test
    set>[:<group>] or head:<head>[:<group>]. ConfigError naming ``where`` for anything else."""
    if name in GROUPS:
        return name, HEADERS[name]
    if is_prior_name(name):
        return f"prior:{name}:all", name
    parts = name.split(":")
    if parts[0] in ("prior", "set", "head") and len(parts) in (2, 3) and all(parts) and \
            (len(parts) == 2 or parts[2] in GROUPS):
        if parts[0] == "prior" and not is_prior_name(parts[1]):
            raise ConfigError(f"{where}: '{parts[1]}' is not a prior name; {HINT}")
        title = f"{parts[1]} subset" if parts[0] == "set" else parts[1]
        key = name if len(parts) == 3 else f"{name}:all"
        return key, title if len(parts) == 2 or parts[2] == "all" else f"{title} {parts[2]}"
    raise ConfigError(f"{where}: unknown column '{name}'; expected one of {', '.join(GROUPS)}, a shifted prior "
                      f"(forward50, uniform, backward10, or 'priors' for all), set:<test set>[:<group>] or "
                      f"head:<head>:<group>")


LATEX_LABEL = re.compile(r"^[A-Za-z0-9:_.\-]{1,200}$")


def _is_scalar(value: Any) -> bool:
    """A value a config field can hold after flattening: a string, a number (not NaN, which equals nothing),
    a boolean, null, or a list of those (list-valued fields such as method.aux_views). A mapping never
    matches: flattened configs hold no mappings, their fields are selected by dotted keys."""
    if isinstance(value, float):
        return value == value
    if isinstance(value, list):
        return all(_is_scalar(v) for v in value)
    return value is None or isinstance(value, (str, int, bool))


def check_selector(selector: dict, where: str) -> None:
    for key, value in selector.items():
        if not isinstance(key, str):
            raise ConfigError(f"{where}: key {short_repr(key)} is not a dotted config key")
        check_key(key, where)
        if not _is_scalar(value):
            raise ConfigError(f"{where}.{key}: {short_repr(value)} can match no run; expected the value of a "
                              f"config field (a string, a number, true/false, null or a list of those; select "
                              f"inside a mapping with a dotted key, e.g. method.aux.name)")


def check_text_mapping(mapping: dict, where: str, nested: bool = False) -> None:
    """A mapping of names to display texts (or, ``nested``, to such mappings), every entry type-checked."""
    for key, value in mapping.items():
        here = f"{where}.{key}"
        if nested:
            if not isinstance(value, dict):
                raise ConfigError(f"{here}: expected a mapping of values to header texts, got {short_repr(value)}")
            check_text_mapping(value, here)
        elif not _is_scalar(key) or not isinstance(value, str):
            raise ConfigError(f"{here}: expected a text, got {short_repr(value)}")


def check_field_types(spec: TableSpec, where: str) -> None:
    """The fields from_dict checks only at the top level (mappings' values), and the LaTeX label."""
    check_text_mapping(spec.pivot_labels, f"{where}.pivot_labels", nested=True)
    for name in ("published_method", "group_labels", "switch_keys"):
        check_text_mapping(getattr(spec, name), f"{where}.{name}")
    if spec.label and not LATEX_LABEL.match(spec.label):
        raise ConfigError(f"{where}.label: {short_repr(spec.label)} is not a LaTeX label; use letters, digits "
                          f"and : _ . - only (e.g. tab:main)")
    check_selector(spec.where, f"{where}.where")
    for i, row in enumerate(spec.rows or []):
        check_selector(row.where, f"{where}.rows[{i}].where")
        versus = [row.versus] if isinstance(row.versus, str) else row.versus or []
        if not all(isinstance(v, str) for v in versus):
            raise ConfigError(f"{where}.rows[{i}].versus: expected row labels, got {short_repr(row.versus)}")
        if len(set(versus)) != len(versus):
            raise ConfigError(f"{where}.rows[{i}].versus: a row is named twice ({short_repr(row.versus)}); "
                              f"name each reference row once")


def parse_table(name: str, raw: Any, where: str) -> TableSpec:
    spec = from_dict(TableSpec, raw, where)
    if spec.rows is not None:
        spec.rows = [r if isinstance(r, RowSpec) else from_dict(RowSpec, r, f"{where}.rows[{i}]")
                     for i, r in enumerate(spec.rows)]
        for i, row in enumerate(spec.rows):
            for key in row.where:
                check_key(key, f"{where}.rows[{i}].where")
            unknown = set(row.marks) - set(spec.switches)
            if unknown:
                raise ConfigError(f"{where}.rows[{i}].marks: '{sorted(unknown)[0]}' is not a declared switch "
                                  f"(switches: {', '.join(spec.switches) or 'none'})")
        check_field_types(spec, where)
        labels = [(r.group, r.label) for r in spec.rows if r.label]
        dup = {x for x in labels if labels.count(x) > 1}
        if dup:
            raise ConfigError(f"{where}.rows: label '{sorted(dup, key=str)[0][1]}' is used twice in one row group")
        for i, row in enumerate(spec.rows):
            versus_targets(spec.rows, i, f"{where}.rows[{i}].versus")
            for name, mark in row.marks.items():
                if not isinstance(mark, bool):
                    raise ConfigError(f"{where}.rows[{i}].marks.{name}: expected true or false, got {mark!r}")
    if spec.rows is None:
        check_field_types(spec, where)
    for i, col in enumerate(spec.columns):
        check_column(col, f"{where}.columns[{i}]")
    if not spec.columns:
        raise ConfigError(f"{where}.columns: expected at least one column")
    for key in spec.pivot + ([spec.group_by] if spec.group_by else []) + list(spec.switch_keys.values()) \
            + list(spec.where):
        check_key(key, f"{where}")
    for i, inc in enumerate(spec.include):
        if not inc.endswith((".yaml", ".yml")) or inc.startswith("/") or ".." in inc.split("/"):
            raise ConfigError(f"{where}.include[{i}]: '{inc}' must be a recipe file next to this one (e.g. cifar10_lt.yaml)")
    for key in spec.pivot_labels:
        if key not in spec.pivot:
            raise ConfigError(f"{where}.pivot_labels: '{key}' is not one of the pivot keys ({', '.join(spec.pivot)})")
    for switch in spec.switch_keys:
        if switch not in spec.switches:
            raise ConfigError(f"{where}.switch_keys: '{switch}' is not a declared switch")
    if spec.row_label:
        for ref in TEMPLATE_FIELD.findall(spec.row_label):
            check_key(ref, f"{where}.row_label")
    return spec


def parse_tables(raw: Any, where: str = "tables") -> dict[str, TableSpec]:
    """Validate a recipe's ``tables:`` mapping (name -> table); errors name the dotted field."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of table names to tables, got {type(raw).__name__}")
    out = {}
    for name, table in raw.items():
        if not isinstance(name, str) or not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", name):
            raise ConfigError(f"{where}: table name {name!r} must be letters, digits, '_', '-', '.'")
        check_no_control(table, f"{where}.{name}")
        out[name] = parse_table(name, table, f"{where}.{name}")
    return out


def check_no_control(value: Any, where: str) -> None:
    """Every text of a table (captions, labels, headers, group titles, selectors) on one line of printable
    characters: a control character (ESC, BEL, CR, NUL, a newline) could forge a markdown row, move a terminal's
    cursor or break pdflatex, so it is refused here, naming the field, instead of being printed."""
    stack = [(value, where)]
    while stack:
        node, here = stack.pop()
        if isinstance(node, dict):
            for key, child in node.items():
                check_no_control(key, here) if isinstance(key, str) else None
                stack.append((child, f"{here}.{key}"))
        elif isinstance(node, list):
            stack += [(child, f"{here}[{i}]") for i, child in enumerate(node)]
        elif isinstance(node, str) and any(ord(c) < 32 or 127 <= ord(c) < 160 for c in node):
            bad = next(c for c in node if ord(c) < 32 or 127 <= ord(c) < 160)
            raise ConfigError(f"{here}: {short_repr(node, 80)} holds the control character U+{ord(bad):04X}; "
                              f"write it as one line of printable text")


def default_table(heads: list[str] | None = None) -> TableSpec:
    """The table shown for a results folder or a recipe that declares none."""
    return TableSpec(heads=list(heads or []))
