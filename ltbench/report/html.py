"""``report.html``: the whole report in one file to open in a browser (issue 33).

Self-contained on purpose: the tables, the figures (PNG inlined as base64 data), their captions, the
notes, every run with its status and the provenance summary are in the file, with its CSS and a small
script, so it can be mailed, archived or opened offline and never reaches the network. A Content
Security Policy in the page forbids every outside resource, so a browser refuses (and reports) any that
slipped in. Clicking a column header sorts the rows of each row group by that column (again: the other
way); a table's notes, marks and n are those of the markdown and LaTeX tables (``table_text``).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from html import escape
from pathlib import Path

from ltbench.results import store
from ltbench.report.build import cost_text, n_text
from ltbench.report.rows import Row, Table
from ltbench.report.table_text import (SIMILAR_MARK, comparison_n, delta_text, footnotes, has_delta, label_text,
                                       legend, number, p_text)

POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:72em;padding:0 1em;
color:#222;line-height:1.4}
h1{font-size:1.6em}h2{font-size:1.3em;margin-top:2em;border-bottom:1px solid #ccc}h3{font-size:1.1em}
table.lt{border-collapse:collapse;margin:.5em 0;font-variant-numeric:tabular-nums}
table.lt th,table.lt td{padding:.2em .6em;border-bottom:1px solid #e4e4e4;text-align:right;white-space:nowrap}
table.lt th:first-child,table.lt td:first-child{text-align:left}
table.lt thead th{border-bottom:2px solid #444;cursor:pointer;user-select:none}
table.lt thead tr.span th{border-bottom:1px solid #999;text-align:center;cursor:default}
table.lt thead th[aria-sort=ascending]::after{content:' \\25B2'}
table.lt thead th[aria-sort=descending]::after{content:' \\25BC'}
table.lt tr.group th{text-align:left;font-style:italic;background:#f4f4f4;cursor:default}
table.lt tr.ours{background:#eef3ff}.std{color:#666;font-size:.85em}.mark{color:#a33}
p.notes{font-size:.85em;color:#444;max-width:60em}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.9em;color:#444;
max-width:60em}
.status-done{color:#276b27}.status-failed,.status-damaged{color:#b00;font-weight:bold}
.status-pending,.status-running{color:#8a6d00}
"""
SCRIPT = """
(function () {
  function key(cell) {
    if (!cell) return null;
    var v = cell.getAttribute('data-value');
    if (v === null) v = cell.textContent.trim();
    var x = parseFloat(v);
    return isNaN(x) ? v.toLowerCase() : x;
  }
  function compare(a, b) {
    if (a === b) return 0;
    if (a === null || a === '') return 1;
    if (b === null || b === '') return -1;
    if (typeof a === typeof b) return a < b ? -1 : 1;
    return typeof a === 'number' ? -1 : 1;
  }
  function sort(table, col, th) {
    var down = th.getAttribute('aria-sort') !== 'descending';
    table.querySelectorAll('thead th[aria-sort]').forEach(function (h) { h.removeAttribute('aria-sort'); });
    th.setAttribute('aria-sort', down ? 'descending' : 'ascending');
    table.querySelectorAll('tbody').forEach(function (body) {
      var rows = Array.prototype.filter.call(body.rows, function (r) { return !r.classList.contains('group'); });
      rows.sort(function (a, b) {
        var c = compare(key(a.cells[col]), key(b.cells[col]));
        return down ? -c : c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  }
  document.querySelectorAll('table.lt').forEach(function (table) {
    table.querySelectorAll('thead tr:last-child th').forEach(function (th, col) {
      th.title = 'sort by this column';
      th.addEventListener('click', function () { sort(table, col, th); });
    });
  });
  document.body.setAttribute('data-sortable-tables', String(document.querySelectorAll('table.lt').length));
})();
"""


@dataclass
class FigureShown:
    """One figure of the report: its kind, the PNG file, and its caption (or why it was not drawn)."""

    kind: str
    png: Path | None
    caption: str


# ------------------------------------------------------------------------------------------------
# Tables


def _cell(table: Table, row: Row, gi: int, ci: int) -> str:
    cell = row.cells.get((gi, ci))
    if cell is None or cell.mean is None:
        return '<td data-value="">–</td>'
    d = table.spec.digits
    text = escape(number(cell.mean, d))
    text = f"<strong>{text}</strong>" if cell.best else (f"<u>{text}</u>" if cell.second else text)
    if table.spec.std and cell.std is not None:
        text += f' <span class="std">± {number(cell.std, d)}</span>'
    if cell.similar:
        text += f'<sup class="mark" title="not significantly different from the best">{SIMILAR_MARK}</sup>'
    return f'<td data-value="{cell.mean:.6f}">{text}</td>'


def _headers(table: Table, lead: list[str], with_delta: bool, with_n: bool) -> list[str]:
    """The header rows: one per pivot level (spanning its column groups), then one sortable row."""
    per_group = len(table.columns) + (1 if with_delta else 0)
    lines = []
    for level in range(len(table.pivot)):
        cells = [f'<th colspan="{len(lead)}"></th>']
        for gi in range(len(table.groups)):
            cells.append(f'<th colspan="{per_group}">{escape(table.group_header(level, gi))}</th>')
        lines.append('<tr class="span">' + "".join(cells) + ("<th></th>" * (1 + table.cost) if with_n else "") + "</tr>")
    last = [escape(s) for s in lead]
    for _ in table.groups:
        last += [escape(h) for _, h in table.columns] + (["Δ"] if with_delta else [])
    last += (["n"] + (["Cost"] if table.cost else [])) if with_n else []
    return lines + ["<tr>" + "".join(f"<th>{h}</th>" for h in last) + "</tr>"]


def _body_rows(table: Table, marks: dict[int, int]) -> list[str]:
    """One <tbody> per row group (sorting stays within a group), its title first."""
    out, current, ncols = [], object(), 2 + table.cost + len(table.spec.switches) + len(table.groups) * (
        len(table.columns) + (1 if has_delta(table) else 0))
    for i, row in enumerate(table.rows):
        if row.group != current:
            out.append(("</tbody>" if out else "") + "<tbody>")
            if row.group:
                out.append(f'<tr class="group"><th colspan="{ncols}">{escape(row.group)}</th></tr>')
            current = row.group
        label = escape(label_text(table, row)) + (f"<sup>[{marks[i]}]</sup>" if i in marks else "")
        cells = [f"<td>{label}</td>"]
        cells += [f"<td>{'✓' if row.marks[s] else '✗'}</td>" if s in row.marks else "<td></td>"
                  for s in table.spec.switches]
        for gi in range(len(table.groups)):
            cells += [_cell(table, row, gi, ci) for ci in range(len(table.columns))]
            cells += [f"<td>{escape(delta_text(table, row, gi))}</td>"] if has_delta(table) else []
        cells.append(f"<td>{'' if row.published else escape(n_text(table, row))}</td>")
        if table.cost:
            cells.append(f"<td>{'' if row.published else escape(cost_text(row))}</td>")
        out.append(f'<tr{" class=ours" if row.highlight else ""}>' + "".join(cells) + "</tr>")
    return out + (["</tbody>"] if out else [])


def _comparisons(table: Table) -> list[str]:
    """The ``versus`` differences as a table of their own: difference and p-value per cell."""
    if not table.comparisons:
        return []
    rows = []
    for comp in table.comparisons:
        cells = [f"<td>{escape(comp.row.label + ' − ' + comp.reference.label + comparison_n(comp))}</td>"]
        for gi in range(len(table.groups)):
            for ci in range(len(table.columns)):
                found = comp.cells.get((gi, ci))
                if found is None:
                    cells.append('<td data-value=""></td>')
                    continue
                why = comp.no_test.get((gi, ci))
                p = p_text(found[1]) if found[1] is not None else f"no test: {why}" if why else ""
                cells.append(f'<td data-value="{found[0]:.6f}">{found[0]:+.{table.spec.digits}f}'
                             f' <span class="std">{escape(p)}</span></td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    head = _headers(table, ["Difference (points)"], False, False)
    return ['<table class="lt">', "<thead>", *head, "</thead>", "<tbody>", *rows, "</tbody>", "</table>"]


def table_html(table: Table) -> str:
    """A filled table as a sortable HTML table, its differences and its notes (the same as markdown's)."""
    marks, notes = footnotes(table)
    head = _headers(table, ["Method", *table.spec.switches], has_delta(table), True)
    caption = f"<caption>{escape(table.spec.caption)}</caption>" if table.spec.caption else ""
    lines = [f'<table class="lt" id="table-{escape(table.name)}">{caption}', "<thead>", *head, "</thead>",
             *_body_rows(table, marks), "</table>", *_comparisons(table)]
    tail = [legend(table)] + notes + [f"Note: {n}" for n in table.notes]
    lines.append('<p class="notes">' + "<br>".join(escape(t) for t in tail) + "</p>")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# The page


def _figure(shown: FigureShown) -> str:
    if shown.png is None:
        return f"<p><strong>{escape(shown.kind)}</strong>: not drawn: {escape(shown.caption)}.</p>"
    data = base64.b64encode(store.read_bounded(shown.png, 64 * store.MiB)).decode("ascii")
    return (f'<figure><img alt="{escape(shown.kind)}" src="data:image/png;base64,{data}">'
            f"<figcaption><strong>{escape(shown.png.stem)}</strong>: {escape(shown.caption)}</figcaption></figure>")


def runs_html(runs) -> str:
    """Every run folder of the recipe with its row, seed, status and, for a run that is not done, why."""
    if runs is None or len(runs) == 0:
        return "<p>No run folders found.</p>"
    head = "<tr>" + "".join(f"<th>{h}</th>" for h in ("Row", "Seed", "Status", "Run id", "Note")) + "</tr>"
    lines = []
    records = runs.to_dict("records")
    records.sort(key=lambda r: (not isinstance(r.get("row"), str), str(r.get("row")), str(r.get("seed"))))
    for run in records:
        status = str(run.get("status") or "")
        row = run.get("row") if isinstance(run.get("row"), str) else "(no row of this recipe)"
        note = " ".join(str(run[k]) for k in ("note", "error") if isinstance(run.get(k), str) and run[k])
        cells = [row, run.get("seed"), status, run.get("run_id"), note]
        text = ["" if c is None or c != c else escape(str(c)) for c in cells]  # c != c: NaN
        text[2] = f'<span class="status-{escape(status)}">{text[2]}</span>'
        lines.append("<tr>" + "".join(f"<td>{t}</td>" for t in text) + "</tr>")
    return "\n".join(['<table class="lt" id="runs">', "<thead>", head, "</thead>", "<tbody>", *lines,
                      "</tbody>", "</table>"])


def report_html(title: str, intro: str, tables: list[Table], figures: list[FigureShown], runs,
                provenance: list[str]) -> str:
    """The page: tables, figures, runs and provenance, everything inline (see the module docstring)."""
    body = [f"<h1>{escape(title)}</h1>", f"<p>{escape(intro)}</p>", "<h2>Tables</h2>"]
    for table in tables:
        body += [f"<h3>{escape(table.name)}</h3>", table_html(table)]
    body += ["<h2>Figures</h2>", *(_figure(f) for f in figures), "<h2>Runs</h2>", runs_html(runs),
             "<h2>Provenance</h2>", "<ul>", *(f"<li>{escape(line.lstrip('- '))}</li>" for line in provenance),
             "</ul>"]
    return "\n".join(["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                      f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">',
                      '<meta name="viewport" content="width=device-width, initial-scale=1">',
                      f"<title>{escape(title)}</title>", f"<style>{STYLE}</style>", "</head><body>", *body,
                      f"<script>{SCRIPT}</script>", "</body></html>", ""])
