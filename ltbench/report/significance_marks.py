"""Which cells are not significantly different from the best of their column and group.

The tests themselves live in ``ltbench.significance`` (Welch's t-test over seeds; a paired bootstrap
over test images from the per-run predictions in ``ltbench.predictions``); this module only decides
which cells to compare and records the marks. A row needs at least two seeds for Welch (rows with
fewer make no claim); the bootstrap needs saved predictions of the same seeds on the same test
images and is used only for columns that are whole-test-set accuracies (all, a head's all).
"""

from __future__ import annotations

from ltbench.report.build import scope_of, scopes
from ltbench.report.rows import Row, Table

TESTS = ("welch", "bootstrap")


def mark_similar(table: Table, test: str) -> str | None:
    """Set ``Cell.similar``; returns a description of the test for the footnote, or None when nothing
    could be tested (fewer than two seeds everywhere, or no saved predictions)."""
    if test == "welch" and sum(1 for r in table.rows if not r.published
                               and any(len(c.values) >= 2 for c in r.cells.values())) < 2:
        return None  # nothing to test: spare the numpy/scipy import
    try:
        from ltbench import significance
    except ImportError:  # the significance module is not installed in this build
        return None
    used = False
    for gi in range(len(table.groups)):
        for ci, (col, _) in enumerate(table.columns):
            for group in scopes(table):
                rows = [r for r in table.rows if scope_of(table, r) == group and not r.published
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


def _bootstrap(table: Table, rows: list[Row], gi: int, ci: int, col: str, significance) -> bool:
    """Paired bootstrap over test images against the best row, on the seeds both rows have; only
    for whole-test-set accuracies: 'all', a head's 'all', a named test set's 'all'."""
    parts = col.split(":")
    if col == "all":
        head_of, test_set = (lambda r: r.head or "main"), None
    elif parts[0] == "head" and parts[2] == "all":
        head_of, test_set = (lambda r: parts[1]), None
    elif parts[0] == "set" and parts[2] == "all":
        head_of, test_set = (lambda r: "main"), parts[1]
    else:
        return False
    try:
        from ltbench import predictions
    except ImportError:
        return False
    correct = {str(i): predictions.correct_by_seed({s: rec["dir"] for s, rec in r.units[gi].runs.items()},
                                                   head=head_of(r), test_set=test_set)
               for i, r in enumerate(rows)}
    verdict = significance.bootstrap_not_different_from_best({k: v for k, v in correct.items() if v})
    if len(verdict) < 2:
        return False
    best_mean = max(r.cells[(gi, ci)].mean for r in rows)
    for k, same in verdict.items():
        cell = rows[int(k)].cells[(gi, ci)]
        cell.similar = bool(same) and cell.mean < best_mean
    return True
