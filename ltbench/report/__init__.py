"""Paper tables and tidy data from result files. Never imports torch; pandas only in ``load``.

Modules, one concept each:
  index     find run folders, summarise each result.json (damaged ones too), cache the summaries
  expected  the runs a recipe expects, in grid order (cached so a table does not import torch)
  spec      the ``tables:`` section of a recipe (validated when the recipe is loaded)
  rows      what a row is: configuration identity, labels, seeds found / missing / failed
  build     a filled table: cells, notes, best and second best per group
  render    markdown, LaTeX, tidy CSV
  frames    ``load(path)``: tidy pandas DataFrames (runs, heads, shift, per_class, class_stats, curves)
  published reference rows and a delta column from the literature file
  document  ``ltbench report``: every table and figure in one folder

Python API::

    from ltbench import report
    frames = report.load("results/quickstart")         # dict of DataFrames, see frames.load
    for t in report.tables("recipes/quickstart.yaml"):  # Table objects
        print(report.render(t, "markdown"))
"""

from __future__ import annotations

from pathlib import Path

from ltbench.errors import LtbenchError

FORMATS = ("markdown", "latex", "csv")


def load(path, results=None):
    """Tidy pandas DataFrames of every run below ``path`` (a results folder or a recipe file)."""
    from ltbench.report.frames import load as _load

    return _load(path, results=results)


def render(table, fmt: str = "markdown") -> str:
    from ltbench.report.render import render as _render

    return _render(table, fmt)


def source(path, results=None, use_cache: bool = True):
    """(records, RecipeRuns or None, root) for a results folder or a recipe file."""
    from ltbench.report import expected as exp
    from ltbench.report import index

    p = Path(path)
    if p.is_file() and p.suffix in (".yaml", ".yml"):
        recipe = exp.recipe_runs(p, results, use_cache=use_cache)
        records = index.scan(recipe.root, use_cache) if recipe.root.is_dir() else []
        return records, recipe, recipe.root
    if not p.is_dir():
        raise LtbenchError(f"{p}: no such results directory or recipe file")
    return index.scan(p, use_cache), None, p


def tables(path, results=None, name: str | None = None, heads: list[str] | None = None,
           test: str | None = "welch", use_cache: bool = True, published: bool | None = None) -> list:
    """The declared tables of a recipe (or the one named), or the default table."""
    from ltbench.report.build import build_table
    from ltbench.report.spec import default_table

    records, recipe, _ = source(path, results, use_cache)
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
        if published is not None:
            spec.published = published
        table = build_table(table_name, spec, records, expected, where=where, test=test)
        if spec.published:
            from ltbench.report.published import add_published

            add_published(table)
        out.append(table)
    return out


def check_tables(tables_by_name: dict, runs: list[dict], where: str) -> None:
    """Raise ConfigError when a declared table cannot be built from a recipe's runs (a selector that
    matches two configurations, ...): called when the recipe is loaded, before any run starts."""
    from ltbench.report.build import build_table
    from ltbench.report.expected import expected_of

    expected = expected_of(runs)
    for name, spec in tables_by_name.items():
        build_table(name, spec, [], expected, where=where, test=None)


def summary_table(recipe) -> str | None:
    """The default table of a recipe's own runs, for the end of ``ltbench run``; None without results."""
    from ltbench.report import index
    from ltbench.report.build import build_table
    from ltbench.report.expected import expected_of
    from ltbench.report.render import to_markdown
    from ltbench.report.spec import default_table

    if not Path(recipe.root).is_dir():
        return None
    records = index.scan(recipe.root)
    if not any(r["status"] == "done" for r in records):
        return None
    return to_markdown(build_table("default", default_table(), records, expected_of(recipe.runs)))
