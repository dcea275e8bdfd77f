"""What every table format prints the same way: numbers, labels, the legend, the numbered notes, p-values,
and LaTeX escaping. Markdown and CSV (``formats``), LaTeX (``latex``) and HTML (``html``) all take their
words from here, so a table says the same thing in each."""

from __future__ import annotations

from ltbench.errors import is_control
from ltbench.report.rows import Row, Table

LATEX_PACKAGES = r"\usepackage{booktabs}\usepackage{amssymb}\usepackage[table]{xcolor}"
SIMILAR_MARK = "≈"
PUBLISHED_MARK = "†"


def number(x: float, digits: int) -> str:
    return f"{x:.{digits}f}"


def delta_text(table: Table, row: Row, gi: int) -> str:
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
    if table.cost:
        parts.append("Cost: device-hours (notes below)")
    if table.comparisons:
        test = f"two-sided {table.comparison_test}" if table.comparison_test else \
            "none (no test asked, or fewer than two seeds / no stored predictions)"
        parts.append(f"differences: a row's mean − its reference row's mean, in points; p: {test}")
    return "; ".join(parts) + "."


def label_text(table: Table, row: Row) -> str:
    """A row's label as printed, before escaping: a published row names its source, ours says so."""
    text = row.label
    if row.published:
        text += f" {PUBLISHED_MARK} ({row.published})"
    if row.highlight and "ours" not in text.lower():
        text += " (ours)"
    return text


def p_text(p: float | None) -> str:
    if p is None:
        return ""
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def comparison_n(comp) -> str:
    """' (n 2 vs 3)' when the two rows' compared cells rest on different seeds, so a difference over an
    incomplete row never passes for a full one; '' when every compared cell has the same seeds on both sides."""
    for gi, ci in sorted(comp.cells):
        a, b = comp.row.cells[(gi, ci)].seeds, comp.reference.cells[(gi, ci)].seeds
        if sorted(a, key=str) != sorted(b, key=str):
            return f" (n {len(a)} vs {len(b)})"
    return ""


def latex_escape(text: str) -> str:
    """Plain text as LaTeX that prints the same characters (a symbol TeX's fonts lack becomes '?'; a control
    character, which pdflatex refuses, a space)."""
    out = []
    specials = {"\\": r"\textbackslash{}", "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$",
                "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                "·": r"$\cdot$", "±": r"$\pm$", "ρ": r"$\rho$", "τ": r"$\tau$", "κ": r"$\kappa$",
                "α": r"$\alpha$", "β": r"$\beta$", "–": "--", "—": "---", "−": "$-$", "≈": r"$\approx$",
                "†": r"$^\dagger$", "Δ": r"$\Delta$", "✓": r"\checkmark", "✗": r"$\times$", "×": r"$\times$",
                "<": r"\textless{}", ">": r"\textgreater{}", "é": r"\'e"}
    for i, ch in enumerate(text):
        out.append(specials.get(ch, " " if is_control(ch) else ch if ord(ch) < 128 else "?"))
        if ch == "-" and text[i + 1:i + 2] == "-":  # '--rerun-stale' stays two hyphens, not an en dash
            out.append("{}")
    return "".join(out)
