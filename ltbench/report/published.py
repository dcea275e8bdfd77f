"""Published results beside ours: reference rows marked with a dagger and a delta column.

The numbers and their sources live in ``ltbench/published.yaml`` (read by ``ltbench.literature``).
A row of ours matches a published entry when the dataset, imbalance factor, backbone and epochs of
its configuration agree and the method is the same (after mapping ltbench's method names to the
names the literature file uses). Each matching entry becomes a reference row (never bold, no n: it
was not run here) and the row of ours gets delta = ours - published on each matching column.
"""

from __future__ import annotations

from ltbench.report.rows import Cell, Row, Table

# ltbench method names (and BAPE's ensemble heads) as the literature file names them.
METHOD_NAMES = {"la": "la", "bape": "bape", "ce": "ce", "ldam_drw": "ldam_drw", "cosine": "cosine",
                "la_posthoc": "la_posthoc", "ce_drw": "ce_drw"}


def _published_method(table: Table, row: Row, unit) -> str | None:
    name = table.spec.published_method.get(row.label)
    if name:
        return name
    method = unit.flat.get("method.name")
    return METHOD_NAMES.get(method, method)


def add_published(table: Table) -> None:
    """Insert matching published entries after the row they match; set deltas on our cells."""
    try:
        from ltbench.literature import load_published, match
    except ImportError:
        table.notes.append("published results are not available in this build (no ltbench.literature)")
        return
    entries = load_published()
    out: list[Row] = []
    for row in table.rows:
        out.append(row)
        if row.published or not row.units:
            continue
        refs: dict[str, Row] = {}
        for gi, unit in row.units.items():
            f = unit.flat
            found = match(entries, dataset=f.get("data.name"), imb_factor=f.get("data.imb_factor"),
                          backbone=f.get("backbone.name"), epochs=f.get("optim.epochs"),
                          method=_published_method(table, row, unit))
            for entry in found:
                ref = refs.setdefault(entry.source, Row(row.label, row.group, published=entry.source))
                ref.units[gi] = unit
                for ci, (col, _) in enumerate(table.columns):
                    value = entry.metrics.get(col.split(":")[1] if col.startswith("prior:") else col)
                    if value is None:
                        continue
                    ref.cells[(gi, ci)] = Cell(values=[float(value)])
                    ours = row.cells.get((gi, ci))
                    if ours is not None and ours.mean is not None and ours.delta is None:
                        ours.delta = ours.mean - float(value)
        out.extend(refs.values())
    table.rows = out
