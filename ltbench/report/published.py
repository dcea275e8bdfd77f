"""Published results beside ours: reference rows marked with a dagger and a delta column.

The numbers and their sources are the claims in ``ltbench/claims/`` (read by ``ltbench.report.claims``).
A row of ours matches a published entry when the dataset, imbalance factor, backbone and epochs of
its configuration agree and the method is the same (claims use ltbench's method names; a
table's ``published_method`` names another one for a row). Each matching entry becomes a reference row
(never bold, no n: it was not run here) and the row of ours gets delta = ours - published on each
matching column.
"""

from __future__ import annotations

from ltbench.results.protocol import protocol_id
from ltbench.report.claims import load_claims, match
from ltbench.config import value_text
from ltbench.report.rows import Cell, Row, Table


def _published_method(table: Table, row: Row, unit) -> str | None:
    name = table.spec.published_method.get(row.label)
    if name:
        return name
    return unit.flat.get("method.name")


def _settings_match(entry, flat: dict) -> bool:
    """An ablation variant (entry.settings, e.g. prior: false) matches only a run with those options."""
    return all(value_text(flat.get(k if "." in k else f"method.{k}", "<absent>")) == value_text(v)
               for k, v in entry.settings.items())


def add_published(table: Table) -> None:
    """Insert, after each row of ours, the published entries that match it: one reference row per
    source (over every column group); a source whose numbers another row already shows is named in
    that row instead of repeating them. Our cells get delta = ours - published (first source)."""
    entries = [c for c in load_claims() if c.kind != "reference"]  # this project's own numbers are not published ones
    out: list[Row] = []
    our_ids: set[str] = set()
    their_ids: set[str] = set()
    used: list = []
    for row in table.rows:
        out.append(row)
        if row.published or not row.units:
            continue
        explicit = row.label in table.spec.published_method
        refs: dict[str, Row] = {}
        for gi, unit in row.units.items():
            f = unit.flat
            found = [e for e in match(entries, dataset=f.get("data.name"), imb_factor=f.get("data.imb_factor"),
                                      backbone=f.get("backbone.name"), epochs=f.get("optim.epochs"),
                                      method=_published_method(table, row, unit))
                     if explicit or (_settings_match(e, f) and not row.head)]
            for entry in found:
                cells = {(gi, ci): float(entry.metrics[_metric(col)]) for ci, (col, _) in enumerate(table.columns)
                         if _metric(col) in entry.metrics}
                if not cells:
                    continue
                used.append(entry)
                ref = refs.setdefault(entry.source, Row(row.label, row.group, published=entry.source))
                ref.units[gi] = unit
                ref.cells.update({k: Cell(values=[v]) for k, v in cells.items()})
                for k, v in cells.items():
                    ours = row.cells.get(k)
                    if ours is not None and ours.mean is not None and ours.delta is None:
                        ours.delta = ours.mean - v
        out.extend(_fold_repeats(list(refs.values())))
        for ref in refs.values():
            our_ids.update(protocol_id(u.flat) for u in row.units.values())
            their_ids.update(f"{e.protocol_id} ({e.protocol_match})" for e in used if e.source in ref.published)
    table.rows = out
    if their_ids:  # the protocols behind the two numbers of a delta (docs/claims.md)
        table.notes.append(f"protocol ids: ours {', '.join(sorted(our_ids))}; published {', '.join(sorted(their_ids))}")


def _metric(col: str) -> str:
    return col.split(":")[1] if col.startswith("prior:") else col


def _fold_repeats(refs: list[Row]) -> list[Row]:
    """Drop a reference row whose every number another row already shows; name its source there."""
    kept: list[Row] = []
    for ref in sorted(refs, key=lambda r: -len(r.cells)):
        values = {k: c.mean for k, c in ref.cells.items()}
        home = next((k for k in kept if all(k.cells.get(x) is not None and k.cells[x].mean == v
                                            for x, v in values.items())), None)
        if home is None:
            kept.append(ref)
        else:
            home.published += f"; {ref.published}"
    order = [r.published.split("; ")[0] for r in refs]
    return sorted(kept, key=lambda r: order.index(r.published.split("; ")[0]))
