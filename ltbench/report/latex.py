r"""LaTeX tables that fit the printed page by their layout, never by scaling.

Venues set tables at 8-9 pt. A tabular shrunk into a column with ``\resizebox`` comes out at 3-6 pt,
which no venue accepts, so this writer never scales. It estimates how wide the tabular will be
(Computer Modern widths, ``latex_widths``) and takes the first layout that fits:

1. the std after the mean in a smaller size (``65.20\,{\scriptsize±1.40}``), 4 pt column separation;
2. as 1, a long label broken onto a second line;
3. the std under the mean, on a second ``\scriptsize`` line of the row;
4. as 3, a long label broken onto that second line; then short headers ('Med.' for 'Medium', a header of
   several words on two lines) and p-values ('.051' for 'p = 0.051'); then 3.5 and 3 pt column
   separation; then labels on up to three, then four lines; then 2 pt column separation.

``width: column`` is a ``table`` that fits ``\columnwidth`` of a two-column article (10 pt body,
``\small`` table), ``width: page`` a ``table*`` that fits ``\textwidth``, and ``width: auto`` (the
default) a column when some layout fits one, else the text width. A table that fits no layout at its
width is written in its most compact one with a comment saying how wide it is (pdflatex then reports an
overfull box, which tests/test_latex_fit.py fails on).

Marks take no column: ≈ (not significantly different from the best) hangs into the gap after its cell
(``\rlap``), so the numbers stay aligned, and every cell of a column with a ≈ keeps just enough room
after it (``\kern``, ``mark_room``) for the mark to stay 3 pt clear of the next column. Best and second
best are the mean in bold and underlined. Shifted-prior columns share a "Forward" / "Backward" header
over their imbalance factors, as test-agnostic papers print them. ``versus`` differences go in a tabular of their own under the main one (``differences:
table``) or in a compact line under the row compared (``differences: rows``), each cell the difference
over its p-value. The legend and notes are ``\footnotesize``, smaller than the table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ltbench.report.build import cost_text, n_text
from ltbench.report.table_text import (LATEX_PACKAGES, comparison_n, delta_text, footnotes, has_delta,
                                       label_text, latex_escape, legend, p_text)
from ltbench.report.latex_widths import text_width
from ltbench.report.rows import Row, Table

COLUMN_PT = 229.5  # \columnwidth of \documentclass[twocolumn]{article} at 10 pt (letter paper: 229.9 pt)
TEXT_PT = 469.0  # its \textwidth (469.75 pt)
TEXT_HEIGHT_PT = 550.0  # its \textheight: a float taller than this is "Float too large" and runs off the page
HEIGHT_SAFETY_PT = 30.0  # the height estimate counts lines, not glue: keep a margin
WIDTHS = {"column": ("table", r"\columnwidth", COLUMN_PT), "page": ("table*", r"\textwidth", TEXT_PT)}
THIN = 1.54  # \, at 9 pt (a sixth of the math quad)
SAFETY_PT = 1.5  # the estimate is within about 1 pt of pdflatex's width (tests/test_latex_fit.py): keep 1.5 in hand
SPLIT_ABOVE_PT = 48.0  # labels narrower than this stay on one line
PRIOR = re.compile(r"^(forward|backward)(\d+)$")


@dataclass(frozen=True)
class Layout:
    """One way to set a table: where the std goes ('after' the mean, 'below' it, or 'none' shown), over
    how many lines a long label may break, the column separation in pt, and whether headers and p-values
    take their short forms."""

    std: str
    label_lines: int  # a long label is broken over up to this many lines
    sep: float
    short: bool = False  # 'Med.' for 'Medium', headers of two words on two lines, '.051' for 'p = 0.051'

    def describe(self) -> str:
        std = {"after": "std after the mean", "below": "std under the mean", "none": "no std"}[self.std]
        labels = f"long labels on up to {self.label_lines} lines" if self.label_lines > 1 else "labels on one line"
        return f"{std}, {labels}, {'short headers, ' if self.short else ''}\\tabcolsep {self.sep:g}pt"


@dataclass
class Cell:
    """One cell of a tabular line: its LaTeX, its estimated width in pt, and how many columns it spans."""

    tex: str = ""
    width: float = 0.0
    span: int = 1


@dataclass
class Line:
    cells: list[Cell]
    end: str = ""  # after the \\ (e.g. "[-1pt]")
    prefix: str = ""  # before the first cell (\rowcolor)


@dataclass
class Tabular:
    """A tabular as lines (or raw rule lines: \\midrule, \\cmidrule...) over ``ncols`` columns."""

    ncols: int
    colspec: str
    items: list = field(default_factory=list)

    def width(self, sep: float) -> float:
        """Natural width: the widest cell of each column plus the gaps between columns (none at the edges,
        which are @{}); a spanning cell wider than its columns widens the table by the excess."""
        widths, spans = [0.0] * self.ncols, []
        for item in self.items:
            if isinstance(item, Line):
                col = 0
                for cell in item.cells:
                    if cell.span == 1:
                        widths[col] = max(widths[col], cell.width)
                    else:
                        spans.append((col, cell.span, cell.width))
                    col += cell.span
        excess = [w - sum(widths[c:c + s]) - 2 * sep * (s - 1) for c, s, w in spans]
        return sum(widths) + 2 * sep * (self.ncols - 1) + max([0.0, *excess])

    def latex(self) -> list[str]:
        out = [rf"\begin{{tabular}}{{{self.colspec}}}", r"\toprule"]
        for item in self.items:
            if isinstance(item, Line):
                out.append(item.prefix + " & ".join(c.tex for c in item.cells) + r" \\" + item.end)
            else:
                out.append(item)
        return out + [r"\bottomrule", r"\end{tabular}"]


def _text(plain: str, font: str = "cmr9") -> Cell:
    return Cell(latex_escape(plain), text_width(plain, font))


def _empty(n: int) -> list[Cell]:
    return [Cell() for _ in range(n)]


def _span_all(ncols: int, tex: str, width: float) -> Cell:
    return Cell(rf"\multicolumn{{{ncols}}}{{@{{}}l}}{{{tex}}}", width, ncols)


# ------------------------------------------------------------------------------------------------
# Cells


MARK, MARK_PT = r"$^{\approx}$", 6.3  # ≈ in script size at 9 pt (cmsy6), and TeX's \scriptspace
CLEARANCE_PT = 3.0  # at least this much white between a hanging ≈ and the next column


def mark_room(sep: float) -> float:
    """What every cell of a column with a ≈ keeps after it, so that the mark, hanging into the gap of
    2 \\tabcolsep after its cell, stays CLEARANCE_PT from the next column: 1.3 pt at 4 pt, 5.3 pt at 2 pt."""
    return max(0.0, MARK_PT + CLEARANCE_PT - 2 * sep)


def _mean_cell(table: Table, row: Row, gi: int, ci: int, std: str, room: float) -> tuple[Cell, Cell]:
    """(the mean's line, the std's line) of one cell; the std's line is empty unless the std goes below.
    ≈ hangs after the cell (``\\rlap``: the numbers stay aligned) and ``room`` pt are kept after every cell
    of a column that has one (``mark_room``; 0 elsewhere)."""
    keep = (rf"\kern{room:g}pt", room) if room else ("", 0.0)
    cell = row.cells.get((gi, ci))
    if cell is None or cell.mean is None:
        return Cell("--" + keep[0], text_width("–") + keep[1]), Cell()
    digits = table.spec.digits
    mean = f"{cell.mean:.{digits}f}"
    tex, width = mean, text_width(mean, "cmbx9" if cell.best else "cmr9")
    if cell.best:
        tex = rf"\textbf{{{mean}}}"
    elif cell.second:
        tex = rf"\underline{{{mean}}}"
    below = Cell()
    if std != "none" and table.spec.std and cell.std is not None:
        spread = f"±{cell.std:.{digits}f}"
        small = Cell(rf"{{\scriptsize{latex_escape(spread)}}}", text_width(spread, "cmr7"))
        if std == "after":
            tex, width = tex + r"\," + small.tex, width + THIN + small.width
        else:
            below = Cell(small.tex + keep[0], small.width + keep[1])
    if cell.similar:
        tex += rf"\rlap{{{MARK}}}"
    return Cell(tex + keep[0], width + keep[1]), below


def _label_cells(table: Table, i: int, row: Row, marks: dict[int, int], lines: int, share: float) -> list[Cell]:
    """The row's label, broken at spaces onto up to ``lines`` lines when it is wider than ``share`` pt;
    a note mark ([k]) ends the label."""
    cells = [_text(part) for part in _wrap(label_text(table, row), lines, share)]
    if i in marks:
        last = cells[-1]
        cells[-1] = Cell(last.tex + rf"$^{{[{marks[i]}]}}$", last.width + text_width(f"[{marks[i]}]", "cmr6") + 0.5)
    return cells


def label_share(table: Table, lines: int) -> float:
    """How wide the label column may be when long labels break over ``lines`` lines: the widest label
    split evenly. Labels narrower than that stay whole, so only the long ones break."""
    if lines < 2 or not table.rows:
        return float("inf")
    return max(SPLIT_ABOVE_PT, max(text_width(label_text(table, r)) for r in table.rows) / lines)


def _wrap(plain: str, lines: int, share: float) -> list[str]:
    """``plain`` on the fewest lines (up to ``lines``) whose widest is within ``share`` (and a little);
    on ``lines`` lines, as even as the words allow, when none is."""
    words = plain.split(" ")
    for k in range(1, min(lines, len(words)) + 1):
        best = _even_lines(words, k)
        if max(map(text_width, best)) <= share * 1.15 or k == min(lines, len(words)):
            return best
    return [plain]


def _even_lines(words: list[str], k: int) -> list[str]:
    """``words`` in ``k`` lines with the widest line as narrow as possible (dynamic programming over the
    cut points, widths from prefix sums: quadratic in the words)."""
    space = text_width(" ")
    prefix = [0.0]
    for word in words:
        prefix.append(prefix[-1] + text_width(word))

    def width(a: int, b: int) -> float:  # words[a:b] on one line
        return prefix[b] - prefix[a] + space * (b - a - 1)

    n = len(words)
    best = {(0, 0): (0.0, [])}  # (words used, lines) -> (widest line, cut points)
    for lines in range(1, k + 1):
        for end in range(lines, n + 1):
            options = [(max(best[(start, lines - 1)][0], width(start, end)), best[(start, lines - 1)][1] + [end])
                       for start in range(lines - 1, end) if (start, lines - 1) in best]
            if options:
                best[(end, lines)] = min(options, key=lambda o: o[0])
    edges = [0, *best[(n, k)][1]]
    return [" ".join(words[a:b]) for a, b in zip(edges, edges[1:])]


def _switch_cell(row: Row, name: str) -> Cell:
    if name not in row.marks:
        return Cell()
    return Cell(r"\checkmark", text_width("✓")) if row.marks[name] else Cell(r"$\times$", text_width("×"))


def marked_cells(table: Table) -> set[tuple[int, int]]:
    """The (column group, column) pairs where some row is marked ≈."""
    return {key for row in table.rows for key, cell in row.cells.items() if cell.similar}


def _row_lines(table: Table, i: int, row: Row, marks: dict[int, int], layout: Layout, share: float) -> list[Line]:
    """A table row as one line, or more: the std under the means, a long label broken over lines."""
    labels = _label_cells(table, i, row, marks, layout.label_lines, share)
    top, bottom = [labels[0]], [labels[1] if len(labels) > 1 else Cell()]
    marked, room = marked_cells(table), mark_room(layout.sep)
    for name in table.spec.switches:
        top.append(_switch_cell(row, name))
        bottom.append(Cell())
    for gi in range(len(table.groups)):
        for ci in range(len(table.columns)):
            mean, below = _mean_cell(table, row, gi, ci, layout.std, room if (gi, ci) in marked else 0.0)
            top.append(mean)
            bottom.append(below)
        if has_delta(table):
            top.append(_text(delta_text(table, row, gi)))
            bottom.append(Cell())
    top.append(Cell() if row.published else _text(n_text(table, row)))
    bottom.append(Cell())
    if table.cost:
        top.append(Cell() if row.published else _text(cost_text(row)))
        bottom.append(Cell())
    rows = [top] + ([bottom] if any(c.tex for c in bottom) else [])
    rows += [[label, *_empty(len(top) - 1)] for label in labels[2:]]
    prefix = r"\rowcolor{gray!15} " if row.highlight else ""
    return [Line(cells, end="[2pt]" if k == len(rows) - 1 and k else ("[-1pt]" if len(rows) > 1 else ""),
                 prefix=prefix) for k, cells in enumerate(rows)]


# ------------------------------------------------------------------------------------------------
# Headers


SHORT_HEADERS = {"Medium": "Med."}


def _metric_header(table: Table, ci: int, compact: bool, short: bool) -> Cell:
    """A column's header: 'Med.' and two words on two lines (``\\shortstack``) when short, the imbalance
    factor alone under a Forward / Backward header (``compact``)."""
    header = table.columns[ci][1]
    header = SHORT_HEADERS.get(header, header) if short else header
    found = PRIOR.match(header) if compact else None
    if found or (compact and header == "uniform"):
        return _text(found.group(2) if found else "Uni.")
    words = header.split(" ")
    if short and len(words) > 1:
        half = (len(words) + 1) // 2
        parts = [_text(" ".join(words[:half])), _text(" ".join(words[half:]))]
        return Cell(rf"\shortstack[r]{{{parts[0].tex}\\{parts[1].tex}}}", max(p.width for p in parts))
    return _text(header)


def _prior_runs(table: Table) -> list[tuple[int, int, str]]:
    """(first column, count, 'Forward' / 'Backward') for each run of shifted-prior columns; empty unless
    the table has at least two prior columns (one 'forward50' column keeps its own header)."""
    kinds = [(PRIOR.match(h).group(1) if PRIOR.match(h) else None) for _, h in table.columns]
    if sum(k is not None for k in kinds) < 2:
        return []
    runs, ci = [], 0
    while ci < len(kinds):
        length = 1
        while kinds[ci] and ci + length < len(kinds) and kinds[ci + length] == kinds[ci]:
            length += 1
        if kinds[ci]:
            runs.append((ci, length, kinds[ci].capitalize()))
        ci += length
    return runs


def _spanning(cells: list[Cell], rules: list[str], col: int, span: int, title: str) -> None:
    """A centred title over ``span`` columns from column ``col`` (1-based in the rule), with its rule."""
    cell = _text(title)
    cells.append(Cell(rf"\multicolumn{{{span}}}{{c}}{{{cell.tex}}}", cell.width, span))
    rules.append(rf"\cmidrule(lr){{{col}-{col + span - 1}}}")


def _pivot_lines(table: Table, lead: int, per_group: int, tail: int) -> list:
    """One header line per pivot level: each run of column groups with the same value under one title."""
    out = []
    for level in range(len(table.pivot)):
        cells, rules, gi = _empty(lead), [], 0
        while gi < len(table.groups):
            span = 1
            key = tuple(table.groups[gi][: level + 1])
            while gi + span < len(table.groups) and tuple(table.groups[gi + span][: level + 1]) == key:
                span += 1
            _spanning(cells, rules, lead + 1 + gi * per_group, span * per_group, table.group_header(level, gi))
            gi += span
        out += [Line(cells + _empty(tail)), " ".join(rules)]
    return out


def _prior_line(table: Table, lead: int, per_group: int, tail: int) -> list:
    """'Forward' and 'Backward' over their imbalance factors, in every column group."""
    runs = _prior_runs(table)
    if not runs:
        return []
    cells, rules = _empty(lead), []
    for gi in range(len(table.groups)):
        ci = 0
        for start, count, title in runs:
            cells += _empty(start - ci)
            _spanning(cells, rules, lead + 1 + gi * per_group + start, count, title)
            ci = start + count
        cells += _empty(per_group - ci)
    return [Line(cells + _empty(tail)), " ".join(rules)]


def _header(table: Table, leaders: list[str], with_delta: bool, with_n: bool, short: bool) -> list:
    """``with_n``: the n column (and the Cost column, when the table has one) after the metrics."""
    per_group = len(table.columns) + (1 if with_delta else 0)
    tail = (1 + table.cost) if with_n else 0
    compact = bool(_prior_runs(table))
    metric = []
    for _ in table.groups:
        metric += [_metric_header(table, ci, compact, short) for ci in range(len(table.columns))]
        metric += [Cell(r"$\Delta$", text_width("Δ"))] if with_delta else []
    last = [_text(s) for s in leaders] + metric + ([Cell("$n$", text_width("n"))] if with_n else []) \
        + ([_text("Cost (device-h)")] if with_n and table.cost else [])
    return (_pivot_lines(table, len(leaders), per_group, tail) + _prior_line(table, len(leaders), per_group, tail)
            + [Line(last), r"\midrule"])


# ------------------------------------------------------------------------------------------------
# Tabulars


def _group_title(ncols: int, title: str) -> Line:
    cell = _text(title, "cmti9")
    return Line([_span_all(ncols, rf"\textit{{{cell.tex}}}", cell.width)])


def main_tabular(table: Table, marks: dict[int, int], layout: Layout) -> Tabular:
    """The table's rows (and, with ``differences: rows``, each compared row's differences under it)."""
    switches = list(table.spec.switches)
    per_group = len(table.columns) + (1 if has_delta(table) else 0)
    ncols = 1 + len(switches) + per_group * len(table.groups) + 1 + table.cost
    colspec = "@{}l" + "c" * len(switches) + "r" * (ncols - 1 - len(switches)) + "@{}"
    tab = Tabular(ncols, colspec, _header(table, ["Method", *switches], has_delta(table), True, layout.short))
    under = table.spec.differences == "rows"
    current, grouped = object(), any(r.group for r in table.rows)
    share = label_share(table, layout.label_lines)
    for i, row in enumerate(table.rows):
        if grouped and row.group != current:
            tab.items += [r"\midrule"] if i else []
            tab.items += [_group_title(ncols, row.group)] if row.group else []
            current = row.group
        tab.items += _row_lines(table, i, row, marks, layout, share)
        for comp in (c for c in table.comparisons if under and c.row is row):
            tab.items += _difference_lines(table, comp, layout, 1 + len(switches), True)
    return tab


def _p_cell(p: float | None, short: bool) -> Cell:
    """A p-value in small type: '$p$ = 0.051' ('$p$ < 0.001'), or with short headers '.051' ('<.001');
    'no test' ('–') where there is none (the notes say why)."""
    if p is None:
        plain, tex = ("–", "--") if short else ("no test", "no test")
    elif short:
        plain = "<.001" if p < 0.001 else f"{p:.3f}".lstrip("0")
        tex = r"$<$.001" if p < 0.001 else plain
    else:
        plain = p_text(p)
        tex = plain.replace("p = ", r"$p$\,=\,").replace("p < ", r"$p$\,<\,")
    return Cell(rf"{{\scriptsize {tex}}}", text_width(plain, "cmr7"))


def _difference_lines(table: Table, comp, layout: Layout, lead: int, under: bool) -> list[Line]:
    """Two lines per comparison: 'A' and '− B (n ...)' (or, under the row, '− B' and the n note) beside
    each cell's difference and, smaller, its p-value ('no test' when there is none: the notes say why)."""
    other = f"− {comp.reference.label}"
    if under:
        first, rest = _text(other), _text(comparison_n(comp).strip())
        first.tex, rest.tex = r"\quad " + first.tex, r"\quad " + rest.tex
        first.width, rest.width = first.width + 9.0, rest.width + 9.0
    else:
        first, rest = _text(comp.row.label), _text(other + comparison_n(comp))
    top, bottom = [first, *_empty(lead - 1)], [rest, *_empty(lead - 1)]
    for gi in range(len(table.groups)):
        for ci in range(len(table.columns)):
            found = comp.cells.get((gi, ci))
            if found is None:
                top.append(Cell())
                bottom.append(Cell())
                continue
            difference, p = found
            top.append(_text(f"{difference:+.{table.spec.digits}f}".replace("-", "−")))
            bottom.append(_p_cell(p, layout.short))
        if has_delta(table) and under:
            top.append(Cell())
            bottom.append(Cell())
    if under:
        top.append(Cell())
        bottom.append(Cell())
    return [Line(top, end="[-1pt]"), Line(bottom, end="[2pt]")]


def differences_tabular(table: Table, layout: Layout) -> Tabular | None:
    """``versus`` differences in a tabular of their own (the default), row groups titled as in the table."""
    if not table.comparisons or table.spec.differences == "rows":
        return None
    ncols = 1 + len(table.columns) * len(table.groups)
    tab = Tabular(ncols, "@{}l" + "r" * (ncols - 1) + "@{}", _header(table, ["Difference"], False, False, layout.short))
    current, grouped = object(), any(c.row.group for c in table.comparisons)
    for comp in table.comparisons:
        if grouped and comp.row.group != current:
            current = comp.row.group
            tab.items += [_group_title(ncols, current)] if current else []
        tab.items += _difference_lines(table, comp, layout, 1, False)
    return tab


# ------------------------------------------------------------------------------------------------
# The float


def candidate_layouts(table: Table) -> list[Layout]:
    """Layouts from the most natural to the most compact; the first that fits is taken."""
    shows_std = table.spec.std and any(c.std is not None for r in table.rows for c in r.cells.values())
    if shows_std:
        natural = [Layout("after", 1, 4), Layout("after", 2, 4), Layout("below", 1, 4)]
    else:
        natural = [Layout("none", 1, 4)]
    std = natural[-1].std
    return natural + [Layout(std, 2, 4), Layout(std, 2, 4, True), Layout(std, 2, 3.5, True), Layout(std, 2, 3, True),
                      Layout(std, 3, 3, True), Layout(std, 4, 3, True), Layout(std, 4, 2, True)]


@dataclass
class Choice:
    width: str  # 'column' or 'page'
    layout: Layout
    tabulars: list[Tabular]
    estimate: float  # pt
    fits: bool


def choose(table: Table, marks: dict[int, int]) -> Choice:
    """The first layout that fits the table's width (``auto``: a column, else the page), else the most
    compact layout at the widest width allowed, marked as not fitting."""
    asked = table.spec.width
    widths = ["column", "page"] if asked == "auto" else [asked]
    choice = None
    for width in widths:
        for layout in candidate_layouts(table):
            tabulars = [t for t in (main_tabular(table, marks, layout), differences_tabular(table, layout)) if t]
            estimate = max(t.width(layout.sep) for t in tabulars)
            choice = Choice(width, layout, tabulars, estimate, estimate + SAFETY_PT <= WIDTHS[width][2])
            if choice.fits:
                return choice
    return choice


def _latex_notes(table: Table, choice: Choice) -> list[str]:
    """The legend (with what this layout adds: where the std is, the prior headers, the p-values under the
    differences), the numbered row notes, the comparisons without a test and why, and the table notes."""
    marks, notes = footnotes(table)
    extra = []
    if choice.layout.std in ("after", "below"):
        extra.append(f"the std is in small type {'after' if choice.layout.std == 'after' else 'under'} the mean")
    if _prior_runs(table):
        extra.append("Forward / Backward k: test class prior with imbalance factor k, following / reversing "
                     "the training imbalance; Uni.: uniform")
    if table.comparisons:
        extra.append("under each difference, its p-value")
    text = legend(table)
    if extra:
        text = text[:-1] + "; " + "; ".join(extra) + "."
    untested = []
    for comp in table.comparisons:
        reasons = {}
        for (gi, ci), why in sorted(getattr(comp, "no_test", {}).items()):
            reasons.setdefault(why, []).append(" · ".join(
                [table.group_header(lv, gi) for lv in range(len(table.pivot))] + [table.columns[ci][1]]))
        for why, where in reasons.items():
            untested.append(f"{comp.row.label} − {comp.reference.label} ({', '.join(where)}): no test: {why}.")
    return [text] + notes + untested + [f"Note: {n}" for n in table.notes]


def to_latex(table: Table) -> str:
    """booktabs only (no vertical rules), unscaled: a ``table`` or ``table*`` in the first layout that fits,
    the notes under it in a minipage of the line width, in type smaller than the table's. The notes are
    budgeted like the width: ``notes: auto`` keeps them whole while the float fits the page's height, else
    writes them short (``notes_text``); what is left out stays in the file as comment lines."""
    marks, _ = footnotes(table)
    choice = choose(table, marks)
    env, line_width, target = WIDTHS[choice.width]
    verdict = "fits" if choice.fits else "does NOT fit"
    advice = "" if choice.fits else (" (width: page, or fewer columns)" if choice.width == "column"
                                     else " (split it into narrower tables)")
    full = _latex_notes(table, choice)
    level = table.spec.notes
    if level == "auto":
        level = "full" if float_height(table, choice, full, target) <= TEXT_HEIGHT_PT - HEIGHT_SAFETY_PT else "short"
    notes = notes_text(full, level, target)
    height = float_height(table, choice, notes, target)
    tall = "" if height <= TEXT_HEIGHT_PT - HEIGHT_SAFETY_PT else \
        f"; more than the {TEXT_HEIGHT_PT - HEIGHT_SAFETY_PT:g} pt this estimate allows (the page less " \
        f"{HEIGHT_SAFETY_PT:g} pt of margin): set notes: short or none"
    out = [f"% ltbench table '{table.name}'; needs {LATEX_PACKAGES}",
           f"% {verdict} {line_width} ({target:g} pt in a two-column article){advice}: about "
           f"{choice.estimate:.0f} pt wide; {choice.layout.describe()}",
           f"% notes: {level} (about {height:.0f} pt tall with them, {TEXT_HEIGHT_PT:g} pt the page){tall}",
           rf"\begin{{{env}}}[t]", r"\centering"]
    if table.spec.caption:
        out += [rf"\caption{{{latex_escape(table.spec.caption)}}}", r"\par\medskip"]  # a gap above the top rule
    if table.spec.label:
        out.append(rf"\label{{{table.spec.label}}}")
    out.append(rf"\small\setlength{{\tabcolsep}}{{{choice.layout.sep:g}pt}}")
    for k, tabular in enumerate(choice.tabulars):
        out += ([r"\par\medskip"] if k else []) + tabular.latex()
    if notes:
        out += [r"\par\smallskip", r"\begin{minipage}{\linewidth}\footnotesize\raggedright"]
        out += [latex_escape(line) + r"\par" for line in notes]
        out.append(r"\end{minipage}")
    out.append(rf"\end{{{env}}}")
    left_out = [line for line in full if line not in notes]
    if left_out:
        out += ["% notes left out of the float (notes: full prints them):"] + [f"%   {line}" for line in left_out]
    return "\n".join(out)


def notes_text(full: list[str], level: str, width: float) -> list[str]:
    """The notes a float prints: all ('full'); 'short': the legend, each numbered row note and each note the
    legend refers to ('Cost: ... (notes below)') cut at a word to about two lines, and where the rest is; none
    at all ('none')."""
    if level == "full":
        return full
    if level == "none":
        return []
    legend_line, rest = full[0], full[1:]
    cited = ("Note: Cost:",) if "(notes below)" in legend_line else ()  # the legend sends the reader to them
    numbered = [n for n in rest if n.startswith(("[", *cited))]
    per_two = 2 * max(20, int(width / (text_width("x") * FOOTNOTE_SCALE)))  # characters of two lines, about
    short = [n if len(n) <= per_two else n[:per_two - 3].rsplit(" ", 1)[0].rstrip(",;:") + " ..." for n in numbered]
    if len(short) < len(rest) or short != numbered:
        short.append("Notes shortened: 'ltbench table' prints them in full.")
    return [legend_line] + short


FOOTNOTE_SCALE = 8.0 / 9.0  # \footnotesize (8 pt) against the 9 pt widths of latex_widths
SMALL_LEADING_PT, FOOTNOTE_LEADING_PT, CAPTION_LEADING_PT = 11.0, 9.5, 12.0  # \small, \footnotesize, \normalsize


def float_height(table: Table, choice: Choice, notes: list[str], width: float) -> float:
    """The float's height, about: the caption's lines (and the skips around it), every tabular row and rule,
    and the notes' lines wrapped at ``width``. Lines, not glue: within about 10% of pdflatex."""
    height = 0.0
    if table.spec.caption:
        height += 10.0 + 6.0 + CAPTION_LEADING_PT * _lines(table.spec.caption, width, 10.0 / 9.0)
    for k, tabular in enumerate(choice.tabulars):
        height += 6.0 if k else 0.0
        for line in tabular.latex():
            if line.rstrip().endswith("]") and "\\\\[" in line or line.rstrip().endswith("\\\\"):
                extra = re.search(r"\\\\\[(-?[\d.]+)pt\]\s*$", line)
                height += SMALL_LEADING_PT + (float(extra.group(1)) if extra else 0.0)
            elif line.startswith((r"\toprule", r"\midrule", r"\bottomrule")):
                height += 4.0
            elif line.startswith(r"\cmidrule"):
                height += 2.0
    if notes:
        height += 3.0 + FOOTNOTE_LEADING_PT * sum(_lines(n, width, FOOTNOTE_SCALE) for n in notes)
    return height


def _lines(text: str, width: float, scale: float) -> int:
    """Lines ``text`` takes in ragged-right type at ``scale`` × 9 pt: words filled greedily."""
    lines, used, space = 1, 0.0, text_width(" ") * scale
    for word in text.split():
        w = text_width(word) * scale
        if used and used + space + w > width:
            lines, used = lines + 1, w
        else:
            used += (space if used else 0.0) + w
    return lines
