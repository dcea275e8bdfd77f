"""A filled table as markdown, LaTeX (booktabs, multicolumn headers for pivots) or tidy CSV.

Every format carries the same facts: n per row (n/expected with a recipe), and a numbered note
for every row with missing, failed, pending or damaged seeds, plus the table-wide notes (runs
left out, copies counted once). Nothing is only in markdown.
"""

from __future__ import annotations

import csv
import io

from ltbench.registry import lookup
from ltbench.report.build import cost_text, n_text, row_cost_seconds
from ltbench.report.latex import to_latex
from ltbench.config import value_text
from ltbench.report.rows import Row, Table
from ltbench.report.table_text import (LATEX_PACKAGES, SIMILAR_MARK, comparison_n, delta_text, footnotes,
                                       has_delta, label_text, legend, number, p_text)
from ltbench.errors import one_line



def cell_text(table: Table, row: Row, gi: int, ci: int) -> str:
    """A markdown cell: mean ± std, best in bold, second best underlined, ≈ when not different from the best."""
    cell = row.cells.get((gi, ci))
    if cell is None or cell.mean is None:
        return "–"
    d = table.spec.digits
    text = number(cell.mean, d)
    if table.spec.std and cell.std is not None:
        text += " ± " + number(cell.std, d)
    if cell.best:
        text = f"**{text}**"
    elif cell.second:
        text = f"<u>{text}</u>"
    if cell.similar:
        text += f" {SIMILAR_MARK}"
    return text


def _label(table: Table, i: int, row: Row, marks: dict[int, int]) -> str:
    return label_text(table, row) + (f" [{marks[i]}]" if i in marks else "")


def switch_text(row: Row, name: str) -> str:
    if name not in row.marks:
        return ""
    return "✓" if row.marks[name] else "✗"


def _header_cells(table: Table, sep: str = " · ") -> list[str]:
    out = []
    single = len(table.columns) == 1 and table.pivot
    for gi in range(len(table.groups)):
        prefix = sep.join(table.group_header(lv, gi) for lv in range(len(table.pivot)))
        for _, header in table.columns:
            out.append(prefix if single else (f"{prefix}{sep}{header}" if prefix else header))
        if has_delta(table):
            out.append(f"{prefix}{sep}Δ" if prefix else "Δ")
    return out


def body_cells(table: Table, row: Row) -> list[str]:
    out = []
    for gi in range(len(table.groups)):
        out += [cell_text(table, row, gi, ci) for ci in range(len(table.columns))]
        if has_delta(table):
            out.append(delta_text(table, row, gi))
    return out


def _difference_text(found: tuple[float, float | None] | None, digits: int, no_test: str | None = None) -> str:
    """'+1.05 (p = 0.262)'; '-50.00 (no test: zero variance on both sides, ...)' where the test is undefined."""
    if found is None:
        return ""
    difference, p = found
    note = f" ({p_text(p)})" if p is not None else (f" (no test: {no_test})" if no_test else "")
    return f"{difference:+.{digits}f}" + note


def comparison_rows(table: Table) -> list[list[str]]:
    """One line per (row, reference row) pair: its label, then per cell 'difference (p = ...)', in the
    main table's cell layout (an empty Δ cell per column group when the table has a Δ column). In a
    table with row groups, each group's comparisons follow a line with the group's title."""
    d = table.spec.digits
    lines, current = [], None
    grouped = any(r.group for r in table.rows)
    width = len(table.groups) * (len(table.columns) + (1 if has_delta(table) else 0))
    for comp in table.comparisons:
        if grouped and comp.row.group != current:  # the row group's title, as in the main table
            current = comp.row.group
            lines.append([f"*{current}*" if current else ""] + [""] * width)
        label = f"{comp.row.label} − {comp.reference.label}" + comparison_n(comp)
        cells = []
        for gi in range(len(table.groups)):
            for ci in range(len(table.columns)):
                text = _difference_text(comp.cells.get((gi, ci)), d, getattr(comp, "no_test", {}).get((gi, ci)))
                cells.append(text)
            if has_delta(table):
                cells.append("")
        lines.append([label] + cells)
    return lines


def markdown_text(text: str) -> str:
    """A text in a markdown table or note: one line (control characters and newlines are spaces) and every '|'
    escaped, so a label can neither end its cell nor add a row."""
    return one_line(text).replace("\\", "\\\\").replace("|", "\\|")


def _markdown_table(lines: list[list[str]], headers: list[str]) -> str:
    from tabulate import tabulate

    return tabulate([[markdown_text(c) for c in line] for line in lines], headers=[markdown_text(h) for h in headers],
                    tablefmt="github", disable_numparse=True)


def _markdown_comparisons(table: Table) -> str:
    if not table.comparisons:
        return ""
    headers = ["Difference (points)"] + _header_cells(table)
    return "\n\n" + _markdown_table(comparison_rows(table), headers)


def to_markdown(table: Table) -> str:
    marks, notes = footnotes(table)
    headers = ["Method"] + list(table.spec.switches) + _header_cells(table) + ["n"] + (["Cost"] if table.cost else [])
    lines, current = [], object()
    grouped = any(r.group for r in table.rows)
    for i, row in enumerate(table.rows):
        if row.group != current and grouped:
            if row.group:
                lines.append([f"*{row.group}*"] + [""] * (len(headers) - 1))
            current = row.group
        lines.append([_label(table, i, row, marks)] + [switch_text(row, s) for s in table.spec.switches]
                     + body_cells(table, row) + ["" if row.published else n_text(table, row)]
                     + ([cost_text(row) if not row.published else ""] if table.cost else []))
    text = _markdown_table(lines, headers) + _markdown_comparisons(table)
    tail = [markdown_text(t) for t in [legend(table)] + notes + [f"Note: {n}" for n in table.notes]]
    caption = f"**{markdown_text(table.spec.caption)}**\n\n" if table.spec.caption else ""
    return caption + text + "\n\n" + "\n".join(tail)


#: CSV columns that hold numbers ltbench formats; every other column is text, neutralised by ``csv_text``.
CSV_NUMBERS = {"mean", "std", "n", "expected", "values", "best", "second_best", "not_different_from_best", "delta",
               "versus_difference", "versus_p", "cost_device_hours"}
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # OWASP's CSV injection rule


def csv_text(text) -> str:
    """A text cell as a spreadsheet may open it: one line, and a leading quote when it starts as a formula would
    (OWASP's rule: =, +, -, @, tab, CR). Numbers ltbench formats (``CSV_NUMBERS``) are written as they are, so
    a difference of -1.25 stays a number."""
    text = str(text)
    text = "'" + text if text.startswith(FORMULA_START) else text
    return one_line(text)


class _CsvWriter(csv.DictWriter):
    def writerow(self, row: dict):
        return super().writerow({k: (v if k in CSV_NUMBERS else csv_text(v)) for k, v in row.items()})


CSV_FIELDS = ["table", "row", "row_group", "column_group", "column", "mean", "std", "n", "expected", "seeds",
              "values", "best", "second_best", "not_different_from_best", "published_source", "delta", "note",
              "versus", "versus_difference", "versus_p", "cost_device_hours"]


def to_csv(table: Table) -> str:
    """Tidy: one line per cell (mean, std, n, seeds, per-seed values), one per compared cell (versus,
    difference, p), then one line per table note."""
    buf = io.StringIO()
    w = _CsvWriter(buf, CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    d = table.spec.digits + 2
    for row in table.rows:
        seconds = row_cost_seconds(row) if table.cost and not row.published else None
        cost = "" if seconds is None else f"{seconds / 3600:.6g}"  # the row's, on each of its lines
        for gi in range(len(table.groups)):
            unit = row.units.get(gi)
            group = " / ".join(table.group_header(lv, gi) for lv in range(len(table.pivot)))
            for ci, (col, header) in enumerate(table.columns):
                cell = row.cells.get((gi, ci))
                w.writerow({
                    "table": table.name, "row": row.label, "row_group": row.group or "", "column_group": group,
                    "column": header, "mean": "" if not cell or cell.mean is None else f"{cell.mean:.{d}f}",
                    "std": "" if not cell or cell.std is None else f"{cell.std:.{d}f}",
                    "n": cell.n if cell else 0,
                    "expected": len(unit.expected) if unit is not None and unit.expected is not None else "",
                    "seeds": " ".join(map(str, cell.seeds)) if cell else "",
                    "values": " ".join(f"{v:.{d}f}" for v in cell.values) if cell else "",
                    "best": int(bool(cell and cell.best)), "second_best": int(bool(cell and cell.second)),
                    "not_different_from_best": int(bool(cell and cell.similar)),
                    "published_source": row.published or "",
                    "delta": "" if not cell or cell.delta is None else f"{cell.delta:.{d}f}",
                    "note": "; ".join(row.notes), "cost_device_hours": cost})
    _csv_comparisons(table, w)
    for note in table.notes:
        w.writerow({"table": table.name, "note": note})
    return buf.getvalue()


def _csv_comparisons(table: Table, w: csv.DictWriter) -> None:
    """One line per compared cell: the row, its reference row (versus), the difference and p, and the seeds
    of both sides (the row's in 'seeds', the reference row's in 'note')."""
    d = table.spec.digits + 2
    for comp in table.comparisons:
        for (gi, ci), (difference, p) in sorted(comp.cells.items()):
            w.writerow({"table": table.name, "row": comp.row.label, "row_group": comp.row.group or "",
                        "column_group": " / ".join(table.group_header(lv, gi) for lv in range(len(table.pivot))),
                        "column": table.columns[ci][1], "versus": comp.reference.label,
                        "versus_difference": f"{difference:.{d}f}", "versus_p": "" if p is None else f"{p:.6g}",
                        "seeds": " ".join(map(str, comp.row.cells[(gi, ci)].seeds)),
                        "note": f"reference seeds: {' '.join(map(str, comp.reference.cells[(gi, ci)].seeds))}"
                                + (f"; no test: {comp.no_test[(gi, ci)]}" if (gi, ci) in comp.no_test else "")})


RENDERERS = {"markdown": to_markdown, "latex": to_latex, "csv": to_csv}  # table format -> renderer


def render(table: Table, fmt: str = "markdown") -> str:
    return lookup(RENDERERS, fmt, "table format")(table)


def latex_document(fragments: list[str]) -> str:
    """A standalone two-column article around table fragments, the layout of most venues (what the
    compile test and the report build): a ``table`` fills one column, a ``width: page`` one spans both."""
    return "\n".join([r"\documentclass[twocolumn]{article}", LATEX_PACKAGES, r"\begin{document}", *fragments,
                      r"\end{document}", ""])


__all__ = ["render", "to_markdown", "to_latex", "to_csv", "latex_document", "value_text"]
