"""Which cells are not significantly different from the best of their column and group, how a row differs
from the reference rows it names (``versus``), with the family correction and the power said. The tests live
in ``ltbench.report.significance``; this module picks the cells to compare, records the marks, applies Holm's
correction (``CORRECTIONS``) and notes each comparison's minimum detectable difference. The bootstraps need
saved predictions on the same test images and serve only whole-test-set accuracy columns.
"""

from __future__ import annotations

from pathlib import Path

from ltbench.recipe import tables as recipe_tables
from ltbench.results import predictions
from ltbench.report import significance
from ltbench.report.rows import Comparison, Row, Table

# Holm over which p-values of a comparison block: all of them ('holm'), each row pair's across its columns
# ('holm:row': the shot groups of one pair, a shift table's priors), or each column's across the row pairs
# ('holm:column': versus over several rows).
CORRECTIONS = recipe_tables.CORRECTIONS  # declared with the table schema (a recipe's tables: correction)
TEST_TEXT = {
    "welch": "Welch's t-test over seeds",
    "bootstrap": "two-level bootstrap: seeds resampled per row (jointly for heads of the same runs), then the test "
                 "images, 10,000 resamples (whole-test-set columns only)",
    "image_bootstrap": "paired bootstrap over test images only, seeds held fixed: tests these trained models on this "
                       "test set, not the training procedure; 10,000 resamples (whole-test-set columns only)",
}


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
                if test in ("bootstrap", "image_bootstrap"):
                    used |= _bootstrap(table, rows, gi, ci, col, test)
                else:
                    used |= _welch(rows, gi, ci, significance)
    if not used:
        return None
    note = few_seeds_note(table, test)
    if note and note not in table.notes:
        table.notes.append(note)
    return f"{TEST_TEXT[test]}, α = {significance.ALPHA}"


def _welch(rows: list[Row], gi: int, ci: int, significance) -> bool:
    """The default test's ≈ marks (``significance.not_different_from_best``, which calls ``default_row_test``)."""
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


def _paired_runs(a: Row, b: Row, gi: int) -> bool:
    """Are two rows heads of the same runs (the same run folder for every seed)? Their seeds are then one
    draw each, resampled jointly by the two-level bootstrap."""
    ua, ub = a.units.get(gi), b.units.get(gi)
    if ua is None or ub is None or set(ua.runs) != set(ub.runs):
        return False
    return all(ua.runs[s].get("dir") == ub.runs[s].get("dir") for s in ua.runs)


def _bootstrap(table: Table, rows: list[Row], gi: int, ci: int, col: str, test: str) -> bool:
    """A bootstrap against the best row (two-level, or image-only on the seeds both rows have); only for
    whole-test-set accuracies."""
    correct = {str(i): _whole_set_correct(r, gi, col) for i, r in enumerate(rows)}
    if any(c is None for c in correct.values()):
        return False
    if test == "image_bootstrap":
        verdict = significance.bootstrap_not_different_from_best({k: v for k, v in correct.items() if v})
    else:
        paired = {frozenset((str(i), str(j))) for i, a in enumerate(rows) for j, b in enumerate(rows)
                  if i < j and _paired_runs(a, b, gi)}
        verdict = significance.two_level_not_different_from_best({k: v for k, v in correct.items() if v}, paired)
    if len(verdict) < 2:
        return False
    best_mean = max(r.cells[(gi, ci)].mean for r in rows)
    for k, same in verdict.items():
        cell = rows[int(k)].cells[(gi, ci)]
        cell.similar = bool(same) and cell.mean < best_mean
    return True


def compare_rows(table: Table, test: str | None, correction: str | None = None) -> str | None:
    """Fill ``table.comparisons`` for every row that names reference rows (``versus``): the difference of
    the means in each cell, a two-sided p-value by ``test`` (Welch over seeds; the two-level bootstrap; the
    image-only bootstrap), Holm-adjusted over the ``correction`` family when one is asked, and each row
    pair's minimum detectable difference in the table's notes. Returns the legend's description of the test
    and correction, or None when no p-value could be computed."""
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
            p, reason, mdd = _pvalue(table, row, ref, gi, ci, test) if test else (None, None, None)
            used |= p is not None
            comparison.cells[(gi, ci)] = (cell.mean - other.mean, p)
            if reason:
                comparison.no_test[(gi, ci)] = reason
            if mdd is not None:
                comparison.detectable[(gi, ci)] = mdd
        table.comparisons.append(comparison)
    if not used:
        return None
    for note in (detectable_note(table, test), few_seeds_note(table, test)):
        if note and note not in table.notes:
            table.notes.append(note)
    return TEST_TEXT[test] + (f"; {adjust(table, correction)}" if correction else "; no correction for multiple comparisons")


def adjust(table: Table, correction: str) -> str:
    """Holm's correction over the chosen family of the comparison block's p-values (replaced by the adjusted
    ones; the raw ones kept in ``Comparison.unadjusted``). Returns the legend's words for it."""
    families: dict = {}
    for k, comp in enumerate(table.comparisons):
        for cell, (_, p) in comp.cells.items():
            if p is not None:
                key = {"holm": None, "holm:row": k, "holm:column": cell}[correction]
                families.setdefault(key, []).append((comp, cell))
    for members in families.values():
        adjusted = significance.holm([comp.cells[cell][1] for comp, cell in members])
        for (comp, cell), p in zip(members, adjusted):
            comp.unadjusted[cell] = comp.cells[cell][1]
            comp.cells[cell] = (comp.cells[cell][0], p)
    sizes = sorted({len(m) for m in families.values()})
    size = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    scope = {"holm": "over every p-value of this block", "holm:row": "within each row pair (across its columns)",
             "holm:column": "within each column (across the row pairs)"}[correction]
    return f"p-values Holm-adjusted {scope} (families of {size})"


def detectable_note(table: Table, test: str | None) -> str | None:
    """'smallest difference these seeds could detect (80 % power, α = 0.05, from the observed spread): A − B:
    All 0.85, Few no test; ...' : when a difference is not significant, says whether it could have been. A
    cell without a test reads 'no test'; cells with 2 seeds on a side are not estimated, said once (a 1-2 df
    variance: docs/significance.md measures the plug-in at 0.6-6.4 times the true value there, 5th-95th
    percentile)."""
    if test == "image_bootstrap":  # these trained models: no seed spread to speak of
        return None
    parts, two_seeds = [], False
    for comp in table.comparisons:
        cells = []
        for gi, ci in sorted(comp.cells):
            value = comp.detectable.get((gi, ci))
            if value is not None:
                cells.append(f"{_header(table, gi, ci)} {value:.2f}")
            elif (gi, ci) in comp.no_test:
                cells.append(f"{_header(table, gi, ci)} no test")
            elif comp.cells[(gi, ci)][1] is not None:
                two_seeds = True
        if cells:
            parts.append(f"{comp.row.label} − {comp.reference.label}: {', '.join(cells)}")
    if not parts and not two_seeds:
        return None
    how = "Welch over the seeds' spread" if test == "welch" else "normal approximation to the bootstrap distribution"
    unreliable = ("not estimated where a row has 2 seeds (a spread from 2 seeds can be several times off; "
                  "docs/significance.md)") if two_seeds else ""
    return (f"smallest true difference these seeds could detect, in points (80 % power, two-sided α = "
            f"{significance.ALPHA}, unadjusted; {how}): " + "; ".join(parts + ([unreliable] if unreliable else [])))


def few_seeds_note(table: Table, test: str | None) -> str | None:
    """A bootstrap is liberal with few seeds: the note says by how much, from the null simulation of
    docs/significance.md (``significance.BOOTSTRAP_SIZE``), wherever a row has fewer than 10 seeds. The
    image-only bootstrap holds the seeds fixed, so against "same training procedure" it is liberal at any n."""
    if test not in ("bootstrap", "image_bootstrap"):
        return None
    sizes = [c.n for r in table.rows if not r.published for c in r.cells.values() if c.n >= 2]
    if not sizes or (test == "bootstrap" and min(sizes) >= 10):
        return None
    measured = significance.BOOTSTRAP_SIZE if test == "bootstrap" else significance.IMAGE_BOOTSTRAP_SIZE
    rates = ", ".join(f"{100 * rate:.0f} % with {n} seeds" for n, rate in measured.items())
    name = "two-level bootstrap" if test == "bootstrap" else "image-only bootstrap"
    return (f"the {name} is liberal here (rows with as few as {min(sizes)} seeds): in a null simulation "
            f"(docs/significance.md) it called one training procedure different from itself at nominal "
            f"α = {significance.ALPHA} in {rates} per row; Welch over seeds, the default, stayed within "
            f"{100 * max(significance.DEFAULT_SIZE.values()):.0f} %")


def _header(table: Table, gi: int, ci: int) -> str:
    prefix = " / ".join(table.group_header(lv, gi) for lv in range(len(table.pivot)))
    return f"{prefix} {table.columns[ci][1]}".strip()


def _pvalue(table: Table, row: Row, ref: Row, gi: int, ci: int,
            test: str) -> tuple[float | None, str | None, float | None]:
    """(p, None, detectable difference), or (None, why no test was made, None): a difference never shows a
    p-value the test cannot give."""
    if test == "welch":
        a, b = row.cells[(gi, ci)].values, ref.cells[(gi, ci)].values
        p, reason = significance.default_row_test(a, b)
        reliable = p is not None and min(len(a), len(b)) >= 3  # at n = 2 the plug-in is unreliable: not printed
        return p, reason, significance.minimum_detectable_difference(a, b) if reliable else None
    col = table.columns[ci][0]
    a, b = _whole_set_correct(row, gi, col), _whole_set_correct(ref, gi, col)
    if a is None or b is None:  # a shot-group column (the legend says: whole-test-set columns only)
        return None, None if "all" not in col.split(":") else "no stored predictions", None
    common = sorted(set(a) & set(b), key=str)
    if any(a[s].shape != b[s].shape for s in common) or len({x.shape for x in [*a.values(), *b.values()]}) > 1:
        return None, "predictions on different test sets", None
    import numpy as np

    if test == "image_bootstrap":
        if not common:
            return None, "no stored predictions of a common seed", None
        p, reason = significance.paired_bootstrap_test(np.stack([a[s] for s in common]), np.stack([b[s] for s in common]))
        return p, reason, None
    problem = significance.two_level_problem(a, b)
    if problem:
        return None, problem, None
    _, p, resampled = significance.two_level_bootstrap(a, b, _paired_runs(row, ref, gi))
    reliable = min(len(a), len(b)) >= 3  # two seeds: the resampled spread rests on 2 draws per row
    return p, None, 100 * significance.bootstrap_detectable_difference(resampled) if reliable else None
