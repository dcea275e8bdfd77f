"""The runs a recipe expects (run id, configuration, seed), in grid order, for tables.

Expanding a recipe validates every run against the plugins' Config classes, which imports the
method modules and therefore torch (about 2 s). A table must not pay that each time, so the
expansion is cached in the results folder (``.ltbench-recipe-<name>.json``), keyed by
``expansion.expansion_signature``: the recipe file's path and bytes, the overrides, the results folder,
$LTBENCH_PLUGIN_PATH and the size and mtime of every Python file of ltbench, the built-in methods, the
recipe's plugin folders and the $LTBENCH_PLUGIN_PATH folders: editing any of them expands it again. A
recipe whose dataset names its data by a digest of its files is never cached (its files may change).
A method installed from another package and upgraded in place is not seen; delete the cache file
(or run ``ltbench table --no-cache``) after such an upgrade.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ltbench.results import safe_read, store
from ltbench.errors import ConfigError, LtbenchError
from ltbench.recipe.expansion import expansion_signature, read_recipe
from ltbench.results.identity import FILE_IDENTITIES
from ltbench.recipe import Recipe, load_recipe, no_results_message, results_elsewhere
from ltbench.results.runspec import RunSpec
from ltbench.report import index
from ltbench.report.index import cache_file, config_key
from ltbench.report.build import build_table
from ltbench.report.rows import flatten
from ltbench.recipe.tables import TableSpec, parse_tables

CACHE_VERSION = 2


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
    out = []
    for spec in runs:
        key, identity = config_key(spec.config)
        out.append({"run_id": spec.run_id, "key": key, "seed": spec.seed, "flat": flatten(identity)})
    for stage2 in posthoc:
        for spec in runs:
            key, identity = config_key({**spec.config, "posthoc": stage2})
            out.append({"run_id": store.stage2_run_id(spec.run_id, stage2), "key": key, "seed": spec.seed,
                        "flat": flatten(identity)})
    return out


def expansion_cache_problem(cached: dict) -> str:
    """'' when an expansion cache has the types recipe_runs relies on (read back under the same rule as
    every other file ltbench wrote: forged or damaged content is expanded again, never shown)."""
    seeds, expected, flats = cached.get("seeds"), cached.get("expected"), cached.get("flats")
    if not (isinstance(seeds, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
        return "seeds"
    if not (isinstance(flats, dict) and all(isinstance(v, dict) for v in flats.values())):
        return "flats"
    if not isinstance(expected, list):
        return "expected"
    for entry in expected:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str) and isinstance(entry[1], str) and entry[1] in flats
                and isinstance(entry[2], int) and not isinstance(entry[2], bool)):
            return "expected"
    return ""


def recipe_runs(path: str | Path, results: str | Path | None = None, use_cache: bool = True,
                overrides: list[str] = ()) -> RecipeRuns:
    """Expected runs and declared tables of a recipe file (with the same dotted overrides as
    ``ltbench run``), from the cache when nothing changed."""
    path = Path(path)
    recipe_file = read_recipe(path, overrides, results)
    raw, name, root = recipe_file.raw, recipe_file.name, recipe_file.root
    signature = expansion_signature(recipe_file, overrides)
    cache_path = cache_file(root, f".ltbench-recipe-{name}-"
                                  f"{hashlib.sha1(json.dumps(list(overrides)).encode()).hexdigest()[:8]}.json")
    if use_cache:
        try:
            cached = safe_read.load_json(cache_path)
            if isinstance(cached, dict) and cached.get("version") == CACHE_VERSION \
                    and cached.get("signature") == signature and not expansion_cache_problem(cached):
                tables = parse_tables(raw.get("tables"), f"{path}: tables")
                flats = cached["flats"]
                expected = [{"run_id": r, "key": k, "seed": s, "flat": flats[k]} for r, k, s in cached["expected"]]
                return RecipeRuns(name, path, root, expected, tables, cached["seeds"])
        except safe_read.UnusableFile:
            pass  # missing or damaged: expanded again below and rewritten
    recipe = load_recipe(path, list(overrides), results_dir=results)
    check_recipe_tables(recipe)
    expected = expected_of(recipe.runs, recipe.posthoc)
    seeds = list(dict.fromkeys(e["seed"] for e in expected))
    # A dataset that names its data by a digest of its files (identity.DATA_IDENTITY) can change without
    # any file this cache watches: such a recipe is expanded every time, never read from or written to the cache.
    volatile = any(key in spec.config for spec in recipe.runs for key in FILE_IDENTITIES)
    if root.is_dir() and not volatile:  # also with --no-cache: a damaged cache is replaced by a good one
        try:
            compact = {"version": CACHE_VERSION, "signature": signature, "seeds": seeds,
                       "expected": [[e["run_id"], e["key"], e["seed"]] for e in expected],
                       "flats": {e["key"]: e["flat"] for e in expected}}  # one flat config per row, not per seed
            store.atomic_write_bytes(cache_path, json.dumps(compact).encode())
        except (OSError, TypeError, ValueError):
            pass
    return RecipeRuns(recipe.name, path, recipe.root, expected, recipe.tables, seeds)


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


def source(path, results=None, use_cache: bool = True, overrides: list[str] = ()):
    """(records, RecipeRuns or None, root) for a results folder or a recipe file."""
    p = Path(path)
    if p.is_file() and p.suffix in (".yaml", ".yml"):
        recipe = recipe_runs(p, results, use_cache=use_cache, overrides=overrides)
        records = index.scan(recipe.root, use_cache) if recipe.root.is_dir() else []
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
    return index.scan(p, use_cache), None, p
