"""The runs a recipe expects (run id, configuration, seed), in grid order, for status and tables.

Expanding a recipe validates every run against the plugins' Config classes, which imports the method
modules and therefore torch (about 2 s). ``status`` and tables must not pay that each time, so the expansion
is kept in one cache (``.ltbench-expansion-<name>-<overrides hash>.json`` in the results folder, or where
``store.cache_file`` says) by whichever command expanded the recipe (run, --dry-run, status, table, report),
holding what both read: the run specs status shows, and the rows and expected runs a table reads.
It is valid when its seal is (ltbench/results/caches.py), the seal being keyed by what the expansion is a
function of (``expansion.expansion_inputs``). A recipe whose dataset names its data by a digest of its files
is never cached (its files may change). ``ltbench table --no-cache`` expands it again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ltbench.results import caches, identity, store
from ltbench.errors import ConfigError, LtbenchError
from ltbench.recipe.expansion import RecipeFile, expansion_cache_path, expansion_inputs, read_recipe
from ltbench.recipe.selection import matches, select_where, where_tokens
from ltbench.results.identity import FILE_IDENTITIES
from ltbench.recipe import Recipe, load_recipe, no_results_message, results_elsewhere
from ltbench.results.runspec import RunSpec
from ltbench.report import index
from ltbench.report.index import config_key
from ltbench.report.build import build_table
from ltbench.report.rows import flatten
from ltbench.recipe.tables import TableSpec, parse_tables

SPEC_KEYS = ("recipe", "run_id", "config", "grid", "run_dir")  # what status reads of a run spec


@dataclass
class RecipeRuns:
    name: str
    path: Path
    root: Path  # results/<name>
    expected: list[dict]  # run_id, key, seed, flat (configuration less seed, flattened)
    tables: dict[str, TableSpec]
    seeds: list


def expected_of(runs: list[RunSpec], posthoc: list[dict] = ()) -> list[dict]:
    """The rows' runs in grid order: every run, then every (run, stage-2 setting) of the recipe's
    ``posthoc:`` grid, whose config is the run's plus a ``posthoc`` section (ltbench/stage2/posthoc_runs.py)."""
    return expected_from(table_part(runs, posthoc))


def table_part(runs: list[RunSpec], posthoc: list[dict] = ()) -> dict:
    """{rows: row key -> the row's configuration less the seed, expected: [run id, row key, seed, trial]}."""
    expected, rows = [], {}
    pairs = [(spec.run_id, spec) for spec in runs]
    pairs += [(identity.stage2_run_id(spec.run_id, stage2), spec, stage2) for stage2 in posthoc for spec in runs]
    for run_id, spec, *stage2 in pairs:
        key, row_identity = config_key({**spec.config, "posthoc": stage2[0]} if stage2 else spec.config)
        rows.setdefault(key, row_identity)
        expected.append([run_id, key, spec.seed, None if stage2 else (spec.grid or {}).get("search")])
    return {"rows": rows, "expected": expected}


def expected_from(part: dict) -> list[dict]:
    flats = {key: flatten(row) for key, row in part["rows"].items()}
    return [{"run_id": r, "key": k, "seed": s, "flat": flats[k], "search": t} for r, k, s, t in part["expected"]]


def expansion_value(recipe: Recipe) -> dict:
    """What status and tables read of an expansion, as the cache keeps it. The run specs (status's part, the
    bulk of it: each run's whole configuration) are kept as JSON text, so a table does not parse them."""
    runs = json.dumps([{k: getattr(spec, k) for k in SPEC_KEYS} for spec in recipe.runs], allow_nan=False)
    return {"override_keys": list(recipe.override_keys), "runs": runs, **table_part(recipe.runs, recipe.posthoc)}


def expansion(path: str | Path, overrides: list[str] = (), results: str | Path | None = None,
              refresh: bool = False, where: dict | None = None) -> tuple[RecipeFile, dict, Recipe | None]:
    """(the recipe file, its expansion as ``expansion_value`` gives it, the Recipe when this call expanded it):
    from the cache (``caches.memo``) when its inputs are unchanged, else expanded (load_recipe and the table
    check: plugins, torch) and kept. ``refresh``: expand and keep anyway (``run`` needs the Recipe). The inputs
    are read before expanding, so a file edited meanwhile makes the next call miss. Not kept: a recipe whose
    dataset names its data by a digest of its files, or whose results folder is not where its file says.
    ``where`` (--where): the part of the grid kept, a cache entry of its own."""
    path = Path(path)
    try:
        recipe_file = read_recipe(path, overrides, results)
    except LtbenchError:
        load_checked(path, overrides, results, where)  # a broken recipe file: load_recipe reports it, in its words
        raise
    made: list[Recipe] = []

    def compute() -> dict | None:
        made.append(load_checked(path, overrides, results, where))
        keep = made[0].root == recipe_file.root and \
            not any(key in spec.config for spec in made[0].runs for key in FILE_IDENTITIES)
        return expansion_value(made[0]) if keep else None

    key = list(overrides) + where_tokens(where or {})  # what names this expansion beside the recipe file
    value = caches.memo(expansion_cache_path(recipe_file, key), expansion_inputs(recipe_file, key), compute, refresh)
    return recipe_file, value if value is not None else expansion_value(made[0]), made[0] if made else None


def status_runs(path: str | Path, overrides: list[str] = (), results: str | Path | None = None,
                where: dict | None = None) -> tuple[Path, list[RunSpec], list[str]]:
    """(results folder, run specs, override keys) of a recipe file for ``status``: from the expansion cache
    when its inputs are unchanged (no torch), else expanded. A cached run folder outside the results root
    sends it back to the expansion (the one check of a cache's entries, ``_outside``)."""
    for refresh in (False, True):
        recipe_file, value, recipe = expansion(path, overrides, results, refresh, where)
        if recipe is not None:
            return recipe.root, recipe.runs, recipe.override_keys
        runs = json.loads(value["runs"])
        if not any(_outside(spec, recipe_file.root) for spec in runs):
            return recipe_file.root, [RunSpec.from_dict(spec) for spec in runs], value["override_keys"]
    raise AssertionError("a refreshed expansion always holds its Recipe")


def _outside(spec: dict, root: Path) -> bool:
    """The one check of a cache's entries: a cached run's folder must be a folder directly in the results root."""
    run_id = spec["run_id"]
    return spec["run_dir"] != str(root / run_id) or Path(run_id).name != run_id or run_id == ".."


def load_checked(path: str | Path, overrides: list[str] = (), results: str | Path | None = None,
                 where: dict | None = None) -> Recipe:
    """load_recipe, then the check that every declared table can be built from its runs."""
    recipe = load_recipe(Path(path), list(overrides), results_dir=results, where=where)
    check_recipe_tables(recipe)
    return recipe


def load_and_remember(path: str | Path, overrides: list[str] = (), results: str | Path | None = None,
                      where: dict | None = None) -> Recipe:
    """load_checked, with the expansion kept for the next status and table: whichever command expanded a
    recipe, the next of any of them needs no torch."""
    return expansion(path, overrides, results, refresh=True, where=where)[2]


def recipe_runs(path: str | Path, results: str | Path | None = None, use_cache: bool = True,
                overrides: list[str] = (), where: dict | None = None) -> RecipeRuns:
    """Expected runs and declared tables of a recipe file (with the same dotted overrides and --where as
    ``ltbench run``), from the cache when nothing changed."""
    recipe_file, value, recipe = expansion(path, overrides, results, refresh=not use_cache, where=where)
    expected = expected_from(value)
    seeds = list(dict.fromkeys(e["seed"] for e in expected))
    if recipe is not None:
        return RecipeRuns(recipe.name, recipe.path, recipe.root, expected, recipe.tables, seeds)
    tables = parse_tables(recipe_file.raw.get("tables"), f"{recipe_file.path}: tables")
    return RecipeRuns(recipe_file.name, recipe_file.path, recipe_file.root, expected, tables, seeds)


def check_tables(tables_by_name: dict, runs: list[RunSpec], where: str, posthoc: list[dict] = ()) -> None:
    """Raise ConfigError when a declared table cannot be built from a recipe's runs and stage-2 settings
    (a selector that matches two configurations, ...), before any run starts."""
    expected = expected_of(runs, posthoc)
    for name, spec in tables_by_name.items():
        build_table(name, spec, [], expected, where=where, test=None)


def check_recipe_tables(recipe: Recipe) -> None:
    """The table check of a loaded recipe, its errors named like load_recipe's (``FILE: tables.NAME...``).
    The recipe cannot run it itself (recipe never imports report): the CLI calls it after load_recipe."""
    if not recipe.tables:
        return
    where = str(recipe.path)
    try:
        check_tables(recipe.tables, recipe.runs, "tables", recipe.posthoc)
    except ConfigError as exc:
        msg = str(exc)
        raise ConfigError(msg if msg.startswith(where) else f"{where}: {msg}") from None


def source(path, results=None, use_cache: bool = True, overrides: list[str] = (), where: dict | None = None):
    """(records, RecipeRuns or None, root) for a results folder or a recipe file; ``where`` (--where): only the
    runs it selects (recipe/selection.py), in the expansion and among the records. Writes under the root are
    guarded from here on (``store.guard_writes_under``): a report, a figure or a cache never goes through a
    symlinked folder out of it."""
    p = Path(path)
    if p.is_file() and p.suffix in (".yaml", ".yml"):
        recipe = recipe_runs(p, results, use_cache=use_cache, overrides=overrides, where=where)
        store.guard_writes_under(recipe.root)
        records = _where(index.scan(recipe.root, use_cache), where) if recipe.root.is_dir() else []
        records += index.same_runs_elsewhere(recipe.root, recipe.expected, records)
        if not records and not recipe.root.is_dir():  # launched from elsewhere? say where it looked
            raw = read_recipe(p, overrides, results).raw
            if not recipe.root.parent.is_dir() or results_elsewhere(p, raw, recipe.root, results) is not None:
                raise LtbenchError(no_results_message(p, raw, recipe.root, results))
        return records, recipe, recipe.root
    if overrides:
        raise LtbenchError(f"{p}: overrides ({overrides[0]}, ...) need a recipe file, not a results folder")
    if not p.is_dir():
        raise LtbenchError(f"{p}: no such results directory or recipe file")
    store.guard_writes_under(p)
    records = index.scan(p, use_cache)
    if where:  # a results folder: every run there, less those --where leaves out (refused if it keeps none)
        select_where([_config(r) for r in records], where)
    return _where(records, where), None, p


def _where(records: list[dict], where: dict | None) -> list[dict]:
    """The records --where keeps, by the rule of the expansion (a damaged record, without a configuration, is
    kept: it is said out loud, never dropped)."""
    return [r for r in records if not where or not r.get("config") or matches(_config(r), where)]


def _config(record: dict) -> dict:
    return {**(record.get("config") or {}), "seed": record.get("seed")}
