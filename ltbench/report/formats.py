"""A filled table as markdown, LaTeX (booktabs, multicolumn headers for pivots) or tidy CSV.

Every format carries the same facts: n per row (n/expected with a recipe), and a numbered note
for every row with missing, failed, pending or damaged seeds, plus the table-wide notes (runs
left out, copies counted once). Nothing is only in markdown.
"""

from __future__ import annotations

import csv
import io

from ltbench.registry import lookup
from ltbench.report.build import n_text
from ltbench.report.rows import Row, Table, value_text

LATEX_PACKAGES = r"\usepackage{booktabs}\usepackage{amssymb}\usepackage{graphicx}\usepackage[table]{xcolor}"
SIMILAR_MARK = "≈"
PUBLISHED_MARK = "†"


def _number(x: float, digits: int) -> str:
    return f"{x:.{digits}f}"


def cell_text(table: Table, row: Row, gi: int, ci: int, latex: bool) -> str:
    cell = row.cells.get((gi, ci))
    if cell is None or cell.mean is None:
        return "--" if latex else "–"
    d = table.spec.digits
    text = _number(cell.mean, d)
    if table.spec.std and cell.std is not None:
        text += (r" $\pm$ " if latex else " ± ") + _number(cell.std, d)
    if cell.best:
        text = rf"\textbf{{{text}}}" if latex else f"**{text}**"
    elif cell.second:
        text = rf"\underline{{{text}}}" if latex else f"<u>{text}</u>"
    if cell.similar:
        text += r"$^{\approx}$" if latex else f" {SIMILAR_MARK}"
    return text


def delta_text(table: Table, row: Row, gi: int, latex: bool) -> str:
    deltas = [row.cells[(gi, ci)].delta for ci in range(len(table.columns))
              if (gi, ci) in row.cells and row.cells[(gi, ci)].delta is not None]
    if not deltas:
        return ""
    return f"{deltas[-1]:+.{table.spec.digits}f}"


def has_delta(table: Table) -> bool:
    """Whether any cell has a published delta (computed once per table: renderers ask per row)."""
    if table.__dict__.get("_has_delta") is None:
        table.__dict__["_has_delta"] = any(c.delta is not None for r in table.rows for c in r.cells.values())
    return table.__dict__["_has_delta"]


def footnotes(table: Table) -> tuple[dict[int, int], list[str]]:
    """Number the rows that carry notes: row index -> note number, and the note lines."""
    marks, lines = {}, []
    for i, row in enumerate(table.rows):
        if row.notes:
            marks[i] = len(lines) + 1
            lines.append(f"[{len(lines) + 1}] {row.label}: " + "; ".join(row.notes) + ".")
    return marks, lines


def legend(table: Table) -> str:
    parts = ["Top-1 accuracy (%)"]
    shown = table.spec.std and any(c.std is not None for r in table.rows for c in r.cells.values())
    parts.append("mean ± sample std (ddof=1) over n seeds" if shown else "mean over n seeds")  # ± only when shown
    if table.expected_seeds:
        parts.append("n = finished seeds / seeds the recipe declares")
    if table.spec.best:
        parts.append("bold: best, underlined: second best, per column within each group")
    if table.test:
        parts.append(f"{SIMILAR_MARK}: not significantly different from the best of its column ({table.test})")
    if any(r.published for r in table.rows):
        parts.append(f"{PUBLISHED_MARK}: published result (source in the row), not run here")
    if has_delta(table):
        parts.append("Δ: ours − published, in points, on the last column")
    if table.comparisons:
        test = f"two-sided {table.comparison_test}" if table.comparison_test else \
            "none (no test asked, or fewer than two seeds / no stored predictions)"
        parts.append(f"differences: a row's mean − its reference row's mean, in points; p: {test}")
    return "; ".join(parts) + "."


def _label(table: Table, i: int, row: Row, marks: dict[int, int], latex: bool) -> str:
    text = row.label
    if row.published:
        text += f" {PUBLISHED_MARK} ({row.published})"
    if row.highlight and "ours" not in text.lower():
        text += " (ours)"
    text = latex_escape(text) if latex else text
    if i in marks:
        text += rf"$^{{[{marks[i]}]}}$" if latex else f" [{marks[i]}]"
    return text


def _switch(row: Row, name: str, latex: bool) -> str:
    if name not in row.marks:
        return ""
    return (r"\checkmark" if row.marks[name] else r"$\times$") if latex else ("✓" if row.marks[name] else "✗")


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


def body_cells(table: Table, row: Row, latex: bool) -> list[str]:
    out = []
    for gi in range(len(table.groups)):
        out += [cell_text(table, row, gi, ci, latex) for ci in range(len(table.columns))]
        if has_delta(table):
            out.append(delta_text(table, row, gi, latex))
    return out


def p_text(p: float | None) -> str:
    if p is None:
        return ""
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def _difference_text(found: tuple[float, float | None] | None, digits: int, no_test: str | None = None) -> str:
    """'+1.05 (p = 0.262)'; '-50.00 (no test: zero variance on both sides, ...)' where the test is undefined."""
    if found is None:
        return ""
    difference, p = found
    note = f" ({p_text(p)})" if p is not None else (f" (no test: {no_test})" if no_test else "")
    return f"{difference:+.{digits}f}" + note


def comparison_n(comp) -> str:
    """' (n 2 vs 3)' when the two rows' compared cells rest on different seeds, so a difference over an
    incomplete row never passes for a full one; '' when every compared cell has the same seeds on both sides."""
    for gi, ci in sorted(comp.cells):
        a, b = comp.row.cells[(gi, ci)].seeds, comp.reference.cells[(gi, ci)].seeds
        if sorted(a, key=str) != sorted(b, key=str):
            return f" (n {len(a)} vs {len(b)})"
    return ""


def comparison_rows(table: Table, latex: bool) -> list[list[str]]:
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
            title = latex_escape(current or "") if latex else current or ""
            lines.append([(rf"\textit{{{title}}}" if latex else f"*{title}*") if title else ""] + [""] * width)
        label = f"{comp.row.label} − {comp.reference.label}" + comparison_n(comp)
        cells = []
        for gi in range(len(table.groups)):
            for ci in range(len(table.columns)):
                text = _difference_text(comp.cells.get((gi, ci)), d, getattr(comp, "no_test", {}).get((gi, ci)))
                cells.append(latex_escape(text) if latex else text)
            if has_delta(table):
                cells.append("")
        lines.append([latex_escape(label) if latex else label] + cells)
    return lines


def _markdown_comparisons(table: Table) -> str:
    from tabulate import tabulate

    if not table.comparisons:
        return ""
    headers = ["Difference (points)"] + _header_cells(table)
    return "\n\n" + tabulate(comparison_rows(table, False), headers=headers, tablefmt="github", disable_numparse=True)


def to_markdown(table: Table) -> str:
    from tabulate import tabulate

    marks, notes = footnotes(table)
    headers = ["Method"] + list(table.spec.switches) + _header_cells(table) + ["n"]
    lines, current = [], object()
    grouped = any(r.group for r in table.rows)
    for i, row in enumerate(table.rows):
        if row.group != current and grouped:
            if row.group:
                lines.append([f"*{row.group}*"] + [""] * (len(headers) - 1))
            current = row.group
        lines.append([_label(table, i, row, marks, False)] + [_switch(row, s, False) for s in table.spec.switches]
                     + body_cells(table, row, False) + ["" if row.published else n_text(table, row)])
    text = tabulate(lines, headers=headers, tablefmt="github", disable_numparse=True) + _markdown_comparisons(table)
    tail = [legend(table)] + notes + [f"Note: {n}" for n in table.notes]
    caption = f"**{table.spec.caption}**\n\n" if table.spec.caption else ""
    return caption + text + "\n\n" + "\n".join(tail)


def latex_escape(text: str) -> str:
    out = []
    specials = {"\\": r"\textbackslash{}", "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$",
                "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                "·": r"$\cdot$", "±": r"$\pm$", "ρ": r"$\rho$", "τ": r"$\tau$", "κ": r"$\kappa$",
                "α": r"$\alpha$", "β": r"$\beta$", "–": "--", "—": "---", "−": "$-$", "≈": r"$\approx$",
                "†": r"$^\dagger$", "Δ": r"$\Delta$", "✓": r"\checkmark", "✗": r"$\times$", "×": r"$\times$",
                "<": r"\textless{}", ">": r"\textgreater{}", "é": r"\'e"}
    for ch in text:
        out.append(specials.get(ch, ch if ord(ch) < 128 else "?"))
    return "".join(out)


def _latex_header(table: Table, n_lead: int) -> list[str]:
    per_group = len(table.columns) + (1 if has_delta(table) else 0)
    lines = []
    for level in range(len(table.pivot)):
        cells, rules, col = [], [], n_lead + 1
        gi = 0
        while gi < len(table.groups):
            span_groups = 1
            key = tuple(table.groups[gi][: level + 1])
            while gi + span_groups < len(table.groups) and tuple(table.groups[gi + span_groups][: level + 1]) == key:
                span_groups += 1
            width = span_groups * per_group
            title = latex_escape(table.group_header(level, gi))
            cells.append(rf"\multicolumn{{{width}}}{{c}}{{{title}}}")
            rules.append(rf"\cmidrule(lr){{{col}-{col + width - 1}}}")
            col += width
            gi += span_groups
        lines.append(" & " * (n_lead - 1) + " & " + " & ".join(cells) + r" & \\")
        lines.append(" ".join(rules))
    leaders = ["Method"] + [latex_escape(s) for s in table.spec.switches]
    metric = []
    for _ in table.groups:
        metric += [latex_escape(h) for _, h in table.columns] + ([r"$\Delta$"] if has_delta(table) else [])
    lines.append(" & ".join(leaders + metric + ["$n$"]) + r" \\")
    return lines


def _latex_float(table: Table) -> tuple[str, str]:
    """``table`` (one column of a two-column page) or ``table*`` (the full text width), by the spec's
    ``width``: a paper chooses per table, and a wide pivot belongs across the page, not squeezed."""
    return ("table*", r"\textwidth") if getattr(table.spec, "width", "column") == "page" else ("table", r"\columnwidth")


def _latex_body(table: Table, marks: dict[int, int], width: int) -> list[str]:
    out, current = [], object()
    switches = list(table.spec.switches)
    grouped = any(r.group for r in table.rows)
    for i, row in enumerate(table.rows):
        if row.group != current and grouped:
            if i:
                out.append(r"\midrule")
            if row.group:
                out.append(rf"\multicolumn{{{width}}}{{l}}{{\textit{{{latex_escape(row.group)}}}}} \\")
            current = row.group
        cells = [_label(table, i, row, marks, True)] + [_switch(row, s, True) for s in switches] \
            + body_cells(table, row, True) + ["" if row.published else latex_escape(n_text(table, row))]
        prefix = r"\rowcolor{gray!15} " if row.highlight else ""
        out.append(prefix + " & ".join(cells) + r" \\")
    if table.comparisons:
        out += [r"\midrule", rf"\multicolumn{{{width}}}{{l}}{{\textit{{Differences (points)}}}} \\"]
        for line in comparison_rows(table, True):
            out.append(" & ".join(line[:1] + [""] * len(switches) + line[1:] + [""]) + r" \\")
    return out


def to_latex(table: Table) -> str:
    """booktabs only (no vertical rules). The tabular is scaled down to the column (or, with
    ``width: page``, the text) width only when it is wider, and the notes sit below it in a
    minipage of that width: a note row inside the tabular would stretch the table to the note's width."""
    marks, notes = footnotes(table)
    n_lead = 1 + len(table.spec.switches)
    per_group = len(table.columns) + (1 if has_delta(table) else 0)
    width = n_lead + per_group * len(table.groups) + 1
    colspec = "l" + "c" * len(table.spec.switches) + "r" * (per_group * len(table.groups)) + "r"
    env, line_width = _latex_float(table)
    out = [f"% ltbench table '{table.name}'; needs {LATEX_PACKAGES}", rf"\begin{{{env}}}[t]", r"\centering"]
    if table.spec.caption:
        out.append(rf"\caption{{{latex_escape(table.spec.caption)}}}")
    if table.spec.label:
        out.append(rf"\label{{{table.spec.label}}}")
    out += [r"\small\setlength{\tabcolsep}{4pt}",
            rf"\resizebox{{\ifdim\width>{line_width}{line_width}\else\width\fi}}{{!}}{{%",
            rf"\begin{{tabular}}{{{colspec}}}", r"\toprule"] + _latex_header(table, n_lead) + [r"\midrule"]
    out += _latex_body(table, marks, width)
    out += [r"\bottomrule", r"\end{tabular}}", r"\par\smallskip",
            rf"\begin{{minipage}}{{{line_width}}}\footnotesize\raggedright"]
    out += [latex_escape(line) + r"\par" for line in [legend(table)] + notes + [f"Note: {n}" for n in table.notes]]
    out += [r"\end{minipage}", rf"\end{{{env}}}"]
    return "\n".join(out)


CSV_FIELDS = ["table", "row", "row_group", "column_group", "column", "mean", "std", "n", "expected", "seeds",
              "values", "best", "second_best", "not_different_from_best", "published_source", "delta", "note",
              "versus", "versus_difference", "versus_p"]


def to_csv(table: Table) -> str:
    """Tidy: one line per cell (mean, std, n, seeds, per-seed values), one per compared cell (versus,
    difference, p), then one line per table note."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    d = table.spec.digits + 2
    for row in table.rows:
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
                    "note": "; ".join(row.notes)})
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


def render(table: Table, fmt: str) -> str:
    return lookup(RENDERERS, fmt, "table format")(table)


def latex_document(fragments: list[str]) -> str:
    """A standalone two-column article around table fragments, the layout of most venues (what the
    compile test and the report build): a ``table`` fills one column, a ``width: page`` one spans both."""
    return "\n".join([r"\documentclass[twocolumn]{article}", LATEX_PACKAGES, r"\begin{document}", *fragments,
                      r"\end{document}", ""])


__all__ = ["render", "to_markdown", "to_latex", "to_csv", "latex_document", "value_text"]
