"""Golden files for every declared table shape, in markdown and LaTeX, and a LaTeX compile check.

The recipe tests/golden/shapes/shapes.yaml declares a pivot table, a table with check-mark columns
and row groups, a table with sections by schedule length and a shifted-prior table. Its runs get
made-up metrics; one seed is missing, one failed, one pending and one still running, so the
footnotes are in the golden files too. Set LTBENCH_UPDATE_GOLDEN=1 to rewrite the files after an
intended change (and read the diff).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from latexkit import compile_fragments, needs_pdflatex, overfull_boxes
from ltbench import report
from ltbench.recipe import load_recipe
from reportkit import populate

SHAPES = Path(__file__).parent / "golden" / "shapes"
TABLES = ["pivot", "switches", "sections", "shift"]
STATUS = {("la", 2.0, 6.0, 2, 1): "failed", ("la", 2.0, 10.0, 2, 2): "pending", ("la", 1.0, 6.0, 3, 0): "running"}
SKIP = {("ce", None, 10.0, 2, 2)}


@pytest.fixture(scope="module")
def shapes_results(tmp_path_factory):
    results = tmp_path_factory.mktemp("shapes") / "results"
    recipe = load_recipe(SHAPES / "shapes.yaml", results_dir=results)
    populate(recipe, skip=SKIP, status=STATUS)
    return results


def built(results, name, test="welch"):
    (table,) = report.tables(SHAPES / "shapes.yaml", results, name=name, test=test)
    return table


@pytest.mark.parametrize("fmt,ext", [("markdown", "md"), ("latex", "tex")])
@pytest.mark.parametrize("name", TABLES)
def test_declared_shape_matches_golden_file(shapes_results, name, fmt, ext):
    text = report.render(built(shapes_results, name), fmt).strip() + "\n"
    golden = SHAPES / f"{name}.{ext}"
    if os.environ.get("LTBENCH_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


def test_pivot_groups_have_their_own_best(shapes_results):
    table = built(shapes_results, "pivot")
    # column groups follow the order of pivot_labels (the grid says 6, 10)
    assert [table.group_header(0, g) for g in range(len(table.groups))] == ["ρ=10", "ρ=6"]
    for gi in range(len(table.groups)):
        assert sum(row.cells[(gi, 1)].best for row in table.rows) == 1  # one bold per column group


def test_missing_failed_pending_running_seeds_are_footnotes_in_every_format(shapes_results):
    table = built(shapes_results, "pivot")
    for fmt in ("markdown", "latex", "csv"):
        text = report.render(table, fmt)
        assert "seed(s) 2 missing (never run: 'ltbench run RECIPE' runs it)" in text, fmt
        assert "seed 1 failed (RuntimeError: loss is nan at epoch 2)" in text, fmt
        assert "seed 2 pending" in text, fmt
    sections = report.render(built(shapes_results, "sections"), "csv")
    assert "seed 0 still running" in sections


def test_shifted_priors_in_natural_order(shapes_results):
    table = built(shapes_results, "shift")
    assert [h for _, h in table.columns] == ["forward50", "forward10", "uniform", "backward10", "backward50"]


def test_switch_marks_and_heads(shapes_results):
    table = built(shapes_results, "switches")
    by_label = {r.label: r for r in table.rows}
    assert by_label["LA tau 1, 3 epochs"].marks == {"Adjusted": True, "Long": True}
    main, aux = by_label["LA tau 1"], by_label["LA tau 1, aux head"]
    assert main.cells[(0, 3)].mean == pytest.approx(aux.cells[(0, 3)].mean + 1.0)  # aux head is 1 point lower


def test_each_golden_shape_compiles_unscaled_without_an_overfull_box(tmp_path):
    """All four golden shapes in one `article[twocolumn]`: none scaled, none wider than the column (a
    ``table``) or the text width (a ``table*``) it chose, notes included; no vertical rule mixed with booktabs.
    tests/test_latex_fit.py holds the larger shapes and the check failing on a table too wide."""
    texts = [(SHAPES / f"{name}.tex").read_text() for name in TABLES]
    for text in texts:
        assert "|" not in text.split("begin{tabular}{")[1].split("}")[0], "vertical rules in the column spec"
        assert "resizebox" not in text and "scalebox" not in text
    assert [r"\begin{table*}" in t for t in texts] == [False, True, False, True]  # pivot, switches, sections, shift
    needs_pdflatex()
    assert overfull_boxes(compile_fragments(texts, tmp_path)) == []


def test_width_page_makes_a_table_star_that_fits_the_text_width(shapes_results, tmp_path):
    import yaml

    raw = yaml.safe_load((SHAPES / "shapes.yaml").read_text())
    raw["tables"]["pivot"]["width"] = "page"
    path = tmp_path / "shapes.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    (table,) = report.tables(path, shapes_results, name="pivot", test="welch")
    text = report.render(table, "latex")
    assert "\\begin{table*}" in text and "\\end{table*}" in text and "\\textwidth" in text
    if shutil.which("pdflatex") is not None:
        assert overfull_boxes(compile_fragments([text], tmp_path)) == []


def test_bad_width_is_a_one_line_error(tmp_path):
    import yaml

    from ltbench.errors import ConfigError

    raw = yaml.safe_load((SHAPES / "shapes.yaml").read_text())
    raw["tables"]["pivot"]["width"] = "wide"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    with pytest.raises(ConfigError, match="width: expected 'auto', 'column'"):
        load_recipe(path, results_dir=tmp_path / "results")


@pytest.mark.slow
def test_latex_compiles_with_pdflatex(shapes_results, tmp_path):
    needs_pdflatex()
    fragments = [report.render(built(shapes_results, name), "latex") for name in TABLES]
    assert overfull_boxes(compile_fragments(fragments, tmp_path)) == []


def test_versus_rows_give_the_difference_and_welch_p_of_the_seed_values(shapes_results):
    from scipy import stats

    table = built(shapes_results, "switches")
    pairs = {(c.row.label, c.reference.label): c for c in table.comparisons}
    assert list(pairs) == [("LA tau 2", "LA tau 1"), ("LA tau 1, 3 epochs", "Baseline"),
                           ("LA tau 1, 3 epochs", "LA tau 1")]
    comp = pairs[("LA tau 1, 3 epochs", "LA tau 1")]
    for (gi, ci), (difference, p) in comp.cells.items():
        a, b = comp.row.cells[(gi, ci)].values, comp.reference.cells[(gi, ci)].values
        assert len(a) == 2 and len(b) == 3  # seed 0 of the 3-epoch row is still running: its 2 seeds only
        assert difference == pytest.approx(sum(a) / len(a) - sum(b) / len(b))
        assert p == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-9)
    # seed 1 of 'LA tau 2' failed: its difference rests on 2 seeds against 3, and the line says so
    assert "LA tau 2 − LA tau 1 (n 2 vs 3)" in report.render(table, "markdown")
    csv_text = report.render(table, "csv")
    assert "reference seeds: 0 1 2" in csv_text
    assert csv_text.count(",LA tau 1,") >= 4  # one line per compared cell names the reference row


def test_versus_without_a_test_prints_differences_and_says_no_p(shapes_results):
    text = report.render(built(shapes_results, "switches", test=None), "markdown")
    assert "| LA tau 2 − LA tau 1 (n 2 vs 3)           | +1.05 " in text and "(p =" not in text
    assert "p: none (no test asked" in text


@pytest.mark.parametrize("versus,expected", [
    ("LA tau 3", "tables.t.rows[1].versus: no row is labelled 'LA tau 3'"),
    ("B", "tables.t.rows[1].versus: a row cannot be compared with itself ('B')"),
    ("A", "tables.t.rows[1].versus: 'A' labels rows in 2 row groups"),
])
def test_bad_versus_labels_are_one_line_errors_at_load_time(tmp_path, versus, expected):
    import yaml

    from ltbench.errors import ConfigError

    raw = yaml.safe_load((SHAPES / "shapes.yaml").read_text())
    raw["tables"] = {"t": {"rows": [{"label": "A", "group": "x", "where": {"method.name": "ce"}},
                                    {"label": "B", "group": "y", "where": {"method.name": "la"}, "versus": versus},
                                    {"label": "A", "group": "z", "where": {"method.name": "la"}}]}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_recipe(path, results_dir=tmp_path / "results")
