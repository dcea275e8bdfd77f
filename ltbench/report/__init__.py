"""Paper tables and tidy data from result files. Never imports torch; pandas only in ``load``.

Modules, one concept each:
  index     find run folders, summarise each result.json (damaged ones too), cache the summaries
  expected  the runs a recipe expects, in grid order (cached so a table does not import torch)
  rows      what a row is: configuration identity, labels, seeds found / missing / failed
  build     a filled table: cells, notes, best and second best per group
  formats   markdown, LaTeX, tidy CSV
  frames    ``load(path)``: tidy pandas DataFrames (runs, heads, shift, per_class, class_stats, curves)
  published reference rows and a delta column from the claims (ltbench/claims/, report/claims.py)
  document  ``ltbench report``: every table and figure in one folder

Python API::

    from ltbench import report
    frames = report.load("results/quickstart")         # dict of DataFrames, see frames.load
    for t in report.tables("recipes/quickstart.yaml"):  # Table objects
        print(report.render(t, "markdown"))
"""

from __future__ import annotations

from pathlib import Path

from ltbench.config import value_text
from ltbench.errors import LtbenchError
from ltbench.recipe.expansion import read_recipe
from ltbench.recipe.tables import default_table
from ltbench.report import index
from ltbench.report.build import build_table
from ltbench.report.expected import source  # (records, RecipeRuns or None, root) of a results folder or recipe
from ltbench.report.formats import render
from ltbench.report.frames import load
from ltbench.report.published import add_published
from ltbench.report.rows import shown_path
from ltbench.results.store import regular_file_problem

FORMATS = ("markdown", "latex", "csv")
__all__ = ["FORMATS", "load", "render", "render_all", "source", "tables", "recipe_tables_text"]


def tables(path, results=None, name: str | None = None, heads: list[str] | None = None,
           test: str | None = "welch", use_cache: bool = True, published: bool | None = None,
           overrides: list[str] = (), digits: int | None = None, select: str | None = None,
           correction: str | None = None, where: dict | None = None, notes: str | None = None) -> list:
    """The declared tables of a recipe (or the one named), or the default table; ``where``: only the runs
    with these values (``ltbench table --where``, recipe/selection.py), of a recipe or of a results folder."""
    records, recipe, _ = source(path, results, use_cache, overrides, where)
    kept = _kept_axis_values(path, overrides, results, where) if recipe is not None and where else ""
    declared = dict(recipe.tables) if recipe is not None else {}
    if name is not None and name not in declared:
        known = ", ".join(declared) or "none declared"
        raise LtbenchError(f"{path}: no table named '{name}' (tables: {known})")
    if heads:
        specs = {"default": default_table(heads)}
    elif name is not None:
        specs = {name: declared[name]}
    else:
        specs = declared or {"default": default_table()}
    if not records and recipe is None:
        raise LtbenchError(f"{path}: no run folders found below this directory")
    expected = recipe.expected if recipe is not None else None
    where = f"{recipe.path}: tables" if recipe is not None else "tables"
    out = []
    for table_name, spec in specs.items():
        if kept and spec.caption:  # the caption describes the whole grid: say which part of an axis is shown
            spec.caption = f"{spec.caption.rstrip()} ({kept})"
        if published is not None:
            spec.published = published
        if digits is not None:
            spec.digits = digits
        if select is not None:  # ltbench table --select val|test
            spec.select = select
        if notes is not None:  # ltbench table --notes: the LaTeX notes (latex.notes_text)
            spec.notes = notes
        recs, exp = records, expected
        if spec.include and recipe is not None:  # e.g. CIFAR-10-LT beside CIFAR-100-LT in one table
            recs, exp = list(records), list(expected)
            for i, other_path in enumerate(spec.include):
                other_file = _included_recipe(recipe.path, other_path, f"{where}.{table_name}.include[{i}]")
                other_records, other, _ = source(other_file, results, use_cache)
                recs += other_records
                exp += other.expected
        table = build_table(table_name, spec, recs, exp, where=where, test=test, correction=correction)
        if overrides and spec.caption:  # the caption is the recipe's text: say what the command line changed
            table.notes.append(f"the runs shown were made with the command-line override(s) {' '.join(overrides)}; "
                               f"the caption describes the recipe as written")
        if spec.published:
            add_published(table)
        out.append(table)
    if recipe is not None and out and specs is declared:  # every declared table built: what none of them shows
        _note_runs_in_no_table(out, records, recipe)
    return out


def _kept_axis_values(path, overrides: list[str], results, where: dict) -> str:
    """'imb_factor=10 only' when --where keeps one value of an axis of the recipe's grid (its caption, written for
    the whole grid, cannot say which); '' otherwise."""
    grid = read_recipe(path, overrides, results).raw.get("grid")
    axes = {a for g in (grid if isinstance(grid, list) else [grid]) if isinstance(g, dict) for a in g}
    picked = [f"{k.rsplit('.', 1)[-1]}={value_text(v[0])}" for k, v in where.items()
              if len(v) == 1 and any(k == a or k.startswith(a + ".") for a in axes)]
    return f"{', '.join(picked)} only" if picked else ""


def _run_id(rec: dict) -> str:
    return rec.get("run_id") or rec["dir"].rstrip("/").rsplit("/", 1)[-1]


def _note_runs_in_no_table(built: list, records: list[dict], recipe) -> None:
    """Finished runs of the recipe that no table shows (a table's ``where:`` selects 90 epochs, a grid holds 180
    too) are counted on the last table, with the command that shows them, so that 'never run' on a declared row
    is never all the user sees. Runs of other settings (command-line overrides) have rows.gather_units' note."""
    units = [v for t in built for row in t.rows for u in row.units.values() for v in [u, *u.trials]]  # tuned: its trials
    shown = {key for u in units  # a 'select:' unit names its settings
             for key in (u.key.split(":", 1)[1].split(",") if u.key.startswith("select:") else [u.key])}
    ours = {e["run_id"] for e in recipe.expected}  # the others have their note (rows.gather_units): one per fact
    hidden = {_run_id(r) for r in records if r.get("status") == "done" and r.get("key") and r["key"] not in shown
              and "+" not in _run_id(r) and _run_id(r) in ours}  # trained runs: a stage-2 sweep's settings are chosen among
    if hidden:
        folder = shown_path(recipe.root)
        built[-1].notes.append(f"{len(hidden)} finished run(s) of this recipe in {folder} are in none of these tables "
                               f"(their where: selects other settings): 'ltbench table {folder}' shows them")


def _included_recipe(recipe_path: Path, other: str, where: str) -> Path:
    """An ``include:`` entry as a recipe file: a regular file that is not the including recipe itself
    (which would count its folders twice and call each run a copy of itself)."""
    path = Path(recipe_path).parent / other
    problem = regular_file_problem(path)
    if problem:
        raise LtbenchError(f"{where}: {path} {problem}; expected a recipe file next to this one")
    if path.resolve() == Path(recipe_path).resolve():
        raise LtbenchError(f"{where}: '{other}' is this recipe itself; its runs are in the table already")
    return path


def render_all(built: list, fmt: str = "markdown") -> str:
    """Tables as ``ltbench table`` prints them: one after another, each under '### name' when there are
    several (markdown)."""
    parts = []
    for table in built:
        title = f"### {table.name}\n\n" if len(built) > 1 and fmt == "markdown" else ""
        parts.append(title + render(table, fmt).rstrip("\n"))
    return "\n\n".join(parts)


def recipe_tables_text(recipe) -> str | None:
    """What ``ltbench table RECIPE`` prints for a loaded recipe (its overrides, its --results): the declared
    tables, else the default one. For the end of ``ltbench run``; None before any run is done."""
    if not Path(recipe.root).is_dir() or not any(r["status"] == "done" for r in index.scan(recipe.root)):
        return None
    return render_all(tables(recipe.path, recipe.results_arg, overrides=list(recipe.overrides), where=recipe.where))
