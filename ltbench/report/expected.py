"""The runs a recipe expects (run id, configuration, seed), in grid order, for tables.

Expanding a recipe validates every run against the plugins' Config classes, which imports the
method modules and therefore torch (about 2 s). A table must not pay that each time, so the
expansion is cached (``.ltbench-recipe-<name>.json`` in the results folder, or where ``store.cache_file``
says), by whichever command expanded the recipe (``load_and_remember``), keyed by
``expansion.expansion_signature``: the recipe file's path and bytes, the overrides, the results folder,
$LTBENCH_PLUGIN_PATH and the size and mtime of every Python file of ltbench, the built-in methods, the
recipe's plugin folders and the $LTBENCH_PLUGIN_PATH folders, and a tpe search's journal (its trials are its
runs): editing any of them expands it again. A
recipe whose dataset names its data by a digest of its files is never cached (its files may change).
A method installed from another package and upgraded in place is not seen; delete the cache file
(or run ``ltbench table --no-cache``) after such an upgrade.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ltbench.results import caches, identity, store
from ltbench.errors import ConfigError, LtbenchError
from ltbench.recipe.expansion import expansion_signature, read_recipe, save_runs
from ltbench.recipe.selection import matches, select_where, where_tokens
from ltbench.results.identity import FILE_IDENTITIES
from ltbench.recipe import Recipe, load_recipe, no_results_message, results_elsewhere
from ltbench.results.runspec import RunSpec
from ltbench.search import trial_problem
from ltbench.report import index
from ltbench.report.index import cache_file, config_key
from ltbench.report.build import build_table
from ltbench.report.rows import flatten
from ltbench.recipe.tables import TableSpec, parse_tables

CACHE_VERSION = 4  # 3: rows hold configurations, so every cached run id and row key is checked; 4: trials


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
    return expected_rows(runs, posthoc)[0]


def expected_rows(runs: list[RunSpec], posthoc: list[dict] = ()) -> tuple[list[dict], dict[str, dict]]:
    """(expected runs as ``expected_of`` gives them, row key -> the row's configuration less the seed)."""
    out, rows = [], {}
    pairs = [(spec.run_id, spec) for spec in runs]
    pairs += [(identity.stage2_run_id(spec.run_id, stage2), spec, stage2) for stage2 in posthoc for spec in runs]
    for run_id, spec, *stage2 in pairs:
        key, row_identity = config_key({**spec.config, "posthoc": stage2[0]} if stage2 else spec.config)
        if key not in rows:
            rows[key] = row_identity
        out.append({"run_id": run_id, "key": key, "seed": spec.seed, "flat": flatten(rows[key]),
                    "search": None if stage2 else (spec.grid or {}).get("search")})
    return out, rows


def expansion_cache_problem(cached: Any) -> str:
    """'' when an expansion cache holds only what it claims (ltbench/results/caches.py): every row's
    configuration validates as a recipe's and is what its key hashes, every expected run names a row and
    a seed once, and its run id is the hash of that row's configuration with that seed. A forged or damaged
    cache (a row's method swapped, an invented run id, a seed added) is expanded again, never shown."""
    if not isinstance(cached, dict):
        return "not an object"
    rows, expected = cached.get("rows"), cached.get("expected")
    problem = caches.rows_problem(rows, "rows")
    if problem:
        return problem
    if not isinstance(expected, list):
        return "expected"
    seen, ids = set(), {}
    for entry in expected:
        if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[1], str) and entry[1] in rows
                and isinstance(entry[2], int) and not isinstance(entry[2], bool) and entry[0] not in seen
                and (entry[3] is None or not trial_problem(entry[3]))):
            return f"expected entry {str(entry)[:80]} is malformed or repeated"
        seen.add(entry[0])
        ids_of = ids.get(entry[1]) or ids.setdefault(entry[1], caches.SeededIds(rows[entry[1]]))
        problem = caches.run_id_problem(entry[0], {}, expected=ids_of(entry[2]))
        if problem:
            return problem
    return ""


def _cache_path(root: Path, name: str, overrides: list[str]) -> Path:
    tag = hashlib.sha1(json.dumps(list(overrides)).encode()).hexdigest()[:8]
    return cache_file(root, f".ltbench-recipe-{name}-{tag}.json")


def _cached_expected(cache_path: Path, signature: str) -> list[dict] | None:
    """The expected runs of the cache, when it is current (``signature``) and passes its check; else None."""
    cached = caches.read_cache(cache_path)  # None: missing, damaged or edited; expanded again and rewritten
    if not isinstance(cached, dict) or cached.get("version") != CACHE_VERSION \
            or cached.get("signature") != signature or expansion_cache_problem(cached):
        return None
    flats = {key: flatten(row) for key, row in cached["rows"].items()}
    return [{"run_id": r, "key": k, "seed": s, "flat": flats[k], "search": t} for r, k, s, t in cached["expected"]]


def _save_expected(cache_path: Path, signature: str, expected: list[dict], rows: dict) -> None:
    """Keep an expansion for the next table (best effort: caches.write_cache)."""
    try:
        payload = json.dumps({"version": CACHE_VERSION, "signature": signature, "rows": rows,
                              "expected": [[e["run_id"], e["key"], e["seed"], e["search"]] for e in expected]}).encode()
    except (TypeError, ValueError):
        return
    caches.write_cache(cache_path, payload)


def recipe_runs(path: str | Path, results: str | Path | None = None, use_cache: bool = True,
                overrides: list[str] = (), where: dict | None = None) -> RecipeRuns:
    """Expected runs and declared tables of a recipe file (with the same dotted overrides and --where as
    ``ltbench run``), from the cache when nothing changed."""
    path = Path(path)
    recipe_file = read_recipe(path, overrides, results)
    raw, name, root = recipe_file.raw, recipe_file.name, recipe_file.root
    signature = expansion_signature(recipe_file, cache_key(overrides, where))
    cache_path = _cache_path(root, name, cache_key(overrides, where))
    expected = _cached_expected(cache_path, signature) if use_cache else None
    if expected is not None:
        tables = parse_tables(raw.get("tables"), f"{path}: tables")
        return RecipeRuns(name, path, root, expected, tables, list(dict.fromkeys(e["seed"] for e in expected)))
    recipe = load_and_remember(path, overrides, results, (recipe_file, signature), where)
    expected = expected_of(recipe.runs, recipe.posthoc)
    seeds = list(dict.fromkeys(e["seed"] for e in expected))
    return RecipeRuns(recipe.name, path, recipe.root, expected, recipe.tables, seeds)


def cache_key(overrides: list[str], where: dict | None) -> list[str]:
    """What names an expansion in the caches beside the recipe file: its overrides and its --where."""
    return list(overrides) + where_tokens(where or {})


def load_and_remember(path: str | Path, overrides: list[str] = (), results: str | Path | None = None,
                      before: tuple | None = None, where: dict | None = None) -> Recipe:
    """load_recipe, the check that every declared table can be built from its runs, then the expansion kept
    for both ``status`` (recipe/expansion.py) and tables (this module's cache): whichever command expanded a
    recipe (run, --dry-run, status, table, report), the next of any of them needs no torch. ``before``:
    (recipe file, signature) already taken; the signature is always taken before expanding, so a file edited
    meanwhile makes the caches miss."""
    path = Path(path)
    if before is None:
        try:
            recipe_file = read_recipe(path, overrides, results)
            before = recipe_file, expansion_signature(recipe_file, cache_key(overrides, where))
        except LtbenchError:  # a broken recipe file: load_recipe reports it, in its words
            before = None
    recipe = load_recipe(path, list(overrides), results_dir=results, where=where)
    check_recipe_tables(recipe)
    # A dataset that names its data by a digest of its files (identity.DATA_IDENTITY) can change without
    # any file these caches watch: such a recipe is expanded every time, never cached.
    if before is not None and not any(key in spec.config for spec in recipe.runs for key in FILE_IDENTITIES):
        recipe_file, signature = before
        save_runs(recipe_file, cache_key(overrides, where), signature, recipe)
        expected, rows = expected_rows(recipe.runs, recipe.posthoc)
        _save_expected(_cache_path(recipe_file.root, recipe_file.name, cache_key(overrides, where)), signature,
                       expected, rows)
    return recipe


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
