"""Published accuracies, so a table can show "did my run reproduce the paper?" next to each row.

The numbers live in ``published.yaml`` (package data), one block per table of one source, laid out
like the source table so each value can be checked against it by eye.  This module expands the
blocks into ``Published`` entries, validates every field (a wrong key or a value outside
[0, 100] is a clear error naming the block and row, not a silently missing reference row) and
filters them with ``match``.  No torch: tables and reports import this on a login node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ltbench.errors import LtbenchError
from ltbench.priors import is_prior_name
from ltbench.results.schema import SHOT_GROUPS

GROUP_METRICS = (*SHOT_GROUPS, "all")
ENTRY_FIELDS = ("method", "label", "dataset", "imb_factor", "backbone", "epochs", "note", "settings")
BLOCK_KEYS = {"source", "shared", "columns", "rows"}


@dataclass(frozen=True)
class Published:
    """One method's published numbers in one setting, from one source table.

    ``metrics`` are percent; keys ``many``/``medium``/``few``/``all`` or shifted test priors
    (``forward50`` ... ``uniform`` ... ``backward50``).  ``method`` is ltbench's registry name when
    ltbench implements the method, else a slug; ``label`` is the name printed in the source;
    ``settings`` the method options of an ablation variant, when ltbench has them.
    """

    method: str
    dataset: str
    imb_factor: float | None
    backbone: str
    epochs: int | None
    metrics: dict[str, float]
    source: str
    note: str = ""
    label: str = ""
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def display(self) -> str:
        return self.label or self.method


def default_path() -> Path:
    return Path(str(resources.files("ltbench.report") / "published.yaml"))


def is_metric(key: str) -> bool:
    return key in GROUP_METRICS or is_prior_name(key)


def load_published(path: Path | None = None) -> list[Published]:
    """Every entry of the data file (``ltbench/report/published.yaml`` unless ``path`` is given)."""
    path = Path(path) if path is not None else default_path()
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise LtbenchError(f"{path}: cannot read published numbers ({exc})") from None
    blocks = document.get("blocks") if isinstance(document, dict) else None
    if not isinstance(blocks, list):
        raise LtbenchError(f"{path}: expected a mapping with a list 'blocks'; see docs/published.md")
    entries: list[Published] = []
    for number, block in enumerate(blocks, 1):
        entries.extend(expand_block(block, where=f"{path}: block {number}"))
    return entries


def expand_block(block: Any, where: str) -> list[Published]:
    """One source table -> entries; cells of a row that differ only in metric become one entry."""
    if not isinstance(block, dict) or not BLOCK_KEYS >= set(block) or "source" not in block:
        raise LtbenchError(f"{where}: expected keys source, shared, columns, rows; got {block!r:.80}")
    where = f"{where} ({block['source']})"
    shared, columns = block.get("shared") or {}, block.get("columns") or []
    if not isinstance(shared, dict) or not isinstance(columns, list) \
            or not all(isinstance(c, dict) and "metric" in c for c in columns):
        raise LtbenchError(f"{where}: 'shared' must be a mapping and 'columns' a list of mappings, "
                           f"each with a 'metric'")
    merged: dict[tuple, dict] = {}
    for row_number, row in enumerate(block.get("rows") or [], 1):
        row_where = f"{where}, row {row_number}"
        values = row.get("values") if isinstance(row, dict) else None
        if not isinstance(values, list) or len(values) != len(columns):
            raise LtbenchError(f"{row_where}: 'values' must list one number (or null) per column ({len(columns)})")
        for column, value in zip(columns, values):
            if value is None:
                continue
            fields = {**shared, **{k: v for k, v in column.items() if k != "metric"},
                      **{k: v for k, v in row.items() if k != "values"}}
            metric = column.get("metric")
            key = tuple(sorted((k, repr(v)) for k, v in fields.items()))
            merged.setdefault(key, {"fields": fields, "metrics": {}})["metrics"][metric] = value
    return [make_entry(item["fields"], item["metrics"], block["source"], where) for item in merged.values()]


def make_entry(fields: dict, metrics: dict, source: str, where: str) -> Published:
    unknown = set(fields) - set(ENTRY_FIELDS)
    if unknown:
        raise LtbenchError(f"{where}: unknown field(s) {sorted(unknown)}; known: {', '.join(ENTRY_FIELDS)}")
    for name in ("method", "dataset", "backbone"):
        if not isinstance(fields.get(name), str) or not fields[name]:
            raise LtbenchError(f"{where}: '{name}' must be a non-empty name")
    for metric, value in metrics.items():
        if not isinstance(metric, str) or not is_metric(metric):
            raise LtbenchError(f"{where}: unknown metric {metric!r}; use many, medium, few, all, "
                               f"forward<rho>, uniform or backward<rho>")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100 \
                or math.isnan(value):
            raise LtbenchError(f"{where}: {fields['method']} {metric} = {value!r} is not a percentage in [0, 100]")
    imb, epochs = fields.get("imb_factor"), fields.get("epochs")
    if imb is not None and (isinstance(imb, bool) or not isinstance(imb, (int, float)) or imb < 1):
        raise LtbenchError(f"{where}: imb_factor must be a number >= 1 or null, got {imb!r}")
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
        raise LtbenchError(f"{where}: epochs must be a positive integer or null, got {epochs!r}")
    if not isinstance(fields.get("settings", {}), dict):
        raise LtbenchError(f"{where}: settings must be a mapping of method options")
    return Published(method=fields["method"], dataset=fields["dataset"],
                     imb_factor=None if imb is None else float(imb), backbone=fields["backbone"],
                     epochs=epochs, metrics={k: float(v) for k, v in metrics.items()}, source=str(source),
                     note=str(fields.get("note", "")), label=str(fields.get("label", "")),
                     settings=dict(fields.get("settings", {})))


def match(entries: list[Published], *, dataset: str, imb_factor: float | None = None, backbone: str | None = None,
          epochs: int | None = None, method: str | None = None) -> list[Published]:
    """Entries published for this setting, in file order.  ``None`` means "any value" for that
    field.  An entry whose own field is unknown (null in the file) never matches a given value:
    a number of unstated schedule is not evidence about a 200-epoch run."""
    wanted = {"imb_factor": None if imb_factor is None else float(imb_factor), "backbone": backbone,
              "epochs": epochs, "method": method}
    return [e for e in entries if e.dataset == dataset
            and all(value is None or getattr(e, name) == value for name, value in wanted.items())]
