"""Which cells are not significantly different from the best of their column and group, and how a row
differs from the reference rows it names (``versus``).

The tests themselves live in ``ltbench.report.significance`` (Welch's t-test over seeds; a paired bootstrap
over test images from the per-run predictions in ``ltbench.results.predictions``); this module only decides
which cells to compare and records the marks. A row needs at least two seeds for Welch (rows with
fewer make no claim); the bootstrap needs saved predictions of the same seeds on the same test
images and is used only for columns that are whole-test-set accuracies (all, a head's all).
"""

from __future__ import annotations

from pathlib import Path

from ltbench.results import predictions
from ltbench.report import significance
from ltbench.report.rows import Comparison, Row, Table

TESTS = ("welch", "bootstrap")


def mark_similar(table: Table, test: str) -> str | None:
    """Set ``Cell.similar``; returns a description of the test for the footnote, or None when nothing
    could be tested (fewer than two seeds everywhere, or no saved predictions)."""
    if test == "welch" and sum(1 for r in table.rows if not r.published
                               and any(len(c.values) >= 2 for c in r.cells.values())) < 2:
        return None  # nothing to test: spare the numpy/scipy import
    used = False
    for gi in range(len(table.groups)):
        for ci, (col, _) in enumerate(table.columns):
            for group in table.scopes():
                rows = [r for r in table.rows if table.scope_of(r) == group and not r.published
                        and r.cells.get((gi, ci)) is not None and r.cells[(gi, ci)].mean is not None]
                if len(rows) < 2:
                    continue
                if test == "bootstrap":
                    used |= _bootstrap(table, rows, gi, ci, col, significance)
                else:
                    used |= _welch(rows, gi, ci, significance)
    if not used:
        return None
    if test == "bootstrap":
        return (f"paired bootstrap over test images, 10,000 resamples, seeds paired, α = {significance.ALPHA}; "
                f"only whole-test-set columns")
    return f"Welch's t-test over seeds, α = {significance.ALPHA}"


def _welch(rows: list[Row], gi: int, ci: int, significance) -> bool:
    values = {str(i): r.cells[(gi, ci)].values for i, r in enumerate(rows) if len(r.cells[(gi, ci)].values) >= 2}
    if len(values) < 2:
        return False
    verdict = significance.not_different_from_best(values)
    best_mean = max(rows[int(k)].cells[(gi, ci)].mean for k in values)
    for k, same in verdict.items():
        cell = rows[int(k)].cells[(gi, ci)]
        cell.similar = bool(same) and cell.mean < best_mean
    return True


def _whole_set_correct(row: Row, gi: int, col: str) -> dict | None:
    """Per-seed correctness arrays behind a whole-test-set accuracy cell ('all', a head's 'all', a named
    test set's 'all'), from the stored predictions; None for any other column."""
    parts = col.split(":")
    if col == "all":
        head, test_set = row.head or "main", None
    elif parts[0] == "head" and parts[2] == "all":
        head, test_set = parts[1], None
    elif parts[0] == "set" and parts[2] == "all":
        head, test_set = "main", parts[1]
    else:
        return None
    runs = row.units[gi].runs
    found = predictions.correct_by_seed({s: rec["dir"] for s, rec in runs.items()}, head=head, test_set=test_set)
    lacking = [s for s in runs if s not in found]
    if lacking:  # a seed without usable predictions leaves the bootstrap: said, never silent
        note = (f"seed(s) {', '.join(map(str, lacking))}: predictions.npz missing or unusable "
                f"({', '.join(Path(runs[s]['dir']).name for s in lacking)}), left out of the bootstrap")
        if note not in row.notes:
            row.notes.append(note)
    return found


def _bootstrap(table: Table, rows: list[Row], gi: int, ci: int, col: str, significance) -> bool:
    """Paired bootstrap over test images against the best row, on the seeds both rows have; only
    for whole-test-set accuracies."""
    correct = {str(i): _whole_set_correct(r, gi, col) for i, r in enumerate(rows)}
    if any(c is None for c in correct.values()):
        return False
    verdict = significance.bootstrap_not_different_from_best({k: v for k, v in correct.items() if v})
    if len(verdict) < 2:
        return False
    best_mean = max(r.cells[(gi, ci)].mean for r in rows)
    for k, same in verdict.items():
        cell = rows[int(k)].cells[(gi, ci)]
        cell.similar = bool(same) and cell.mean < best_mean
    return True


def compare_rows(table: Table, test: str | None) -> str | None:
    """Fill ``table.comparisons`` for every row that names reference rows (``versus``): the
    difference of the means in each cell, and a two-sided p-value. Welch over seeds (each row's
    seeds as independent draws of its training), or with ``test='bootstrap'`` the paired bootstrap
    over test images on the seeds both rows have (whole-test-set columns only). Returns the test's
    description for the legend, or None when no p-value could be computed."""
    pairs = [(row, ref) for row in table.rows for ref in row.versus]
    if not pairs:
        return None
    used = False
    for row, ref in pairs:
        comparison = Comparison(row, ref)
        for (gi, ci), cell in row.cells.items():
            other = ref.cells.get((gi, ci))
            if cell.mean is None or other is None or other.mean is None:
                continue
            p, reason = _pvalue(table, row, ref, gi, ci, test, significance) if test else (None, None)
            used |= p is not None
            comparison.cells[(gi, ci)] = (cell.mean - other.mean, p)
            if reason:
                comparison.no_test[(gi, ci)] = reason
        table.comparisons.append(comparison)
    if not used:
        return None
    if test == "bootstrap":
        return "paired bootstrap over test images on the seeds both rows have, 10,000 resamples (whole-test-set columns only)"
    return "Welch's t-test over seeds"


def _pvalue(table: Table, row: Row, ref: Row, gi: int, ci: int, test: str,
            significance) -> tuple[float | None, str | None]:
    """(p, None), or (None, why no test was made): a difference never shows a p-value the test cannot give."""
    if test == "bootstrap":
        col = table.columns[ci][0]
        a, b = _whole_set_correct(row, gi, col), _whole_set_correct(ref, gi, col)
        if a is None or b is None:  # a shot-group column (the legend says: whole-test-set columns only)
            return None, None if "all" not in col.split(":") else "no stored predictions"
        common = sorted(set(a) & set(b), key=str)
        if not common:
            return None, "no stored predictions of a common seed"
        if any(a[s].shape != b[s].shape for s in common):
            return None, "predictions on different test sets"
        import numpy as np

        return significance.paired_bootstrap_test(np.stack([a[s] for s in common]), np.stack([b[s] for s in common]))
    return significance.welch_test(row.cells[(gi, ci)].values, ref.cells[(gi, ci)].values)
