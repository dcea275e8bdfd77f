"""The runs a recipe expects (run id, configuration, seed), in grid order, for tables.

Expanding a recipe validates every run against the plugins' Config classes, which imports the
method modules and therefore torch (about 2 s). A table must not pay that each time, so the
expansion is cached in the results folder (``.ltbench-recipe-<name>.json``), keyed by the recipe
file's bytes, the results folder and the size and mtime of every Python file of ltbench, the
built-in methods and the recipe's plugin folders: editing any of them expands the recipe again.
A method installed from another package and upgraded in place is not seen; delete the cache file
(or run ``ltbench table --no-cache``) after such an upgrade.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ltbench import store
from ltbench.report.index import cache_file, config_key
from ltbench.report.rows import flatten
from ltbench.report.spec import TableSpec, parse_tables

CACHE_VERSION = 2


@dataclass
class RecipeRuns:
    name: str
    path: Path
    root: Path  # results/<name>
    expected: list[dict]  # run_id, key, seed, flat (configuration less seed, flattened)
    tables: dict[str, TableSpec]
    seeds: list


def _code_signature(plugin_dirs: list[str]) -> str:
    import ltbench

    roots = [Path(ltbench.__file__).parent, Path(ltbench.__file__).parent.parent / "methods"]
    roots += [Path(p) for p in plugin_dirs]
    h = hashlib.sha1()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__pycache__")))
            for f in sorted(filenames):
                if f.endswith(".py"):
                    st = os.stat(os.path.join(dirpath, f))
                    h.update(f"{dirpath}/{f}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()


def _root_of(path: Path, raw: dict, results: str | Path | None) -> tuple[str, Path]:
    name = raw.get("name") if isinstance(raw.get("name"), str) and raw.get("name") else path.stem
    out = Path(results if results is not None else raw.get("results_dir") or "results")
    if not out.is_absolute():
        out = Path.cwd() / out
    return name, out.resolve() / name


def expected_of(runs: list[dict], posthoc: list[dict] = ()) -> list[dict]:
    """The rows' runs in grid order: every run, then every (run, stage-2 setting) of the recipe's
    ``posthoc:`` grid, whose config is the run's plus a ``posthoc`` section (ltbench/posthoc_runs.py)."""
    out = []
    for spec in runs:
        key, identity = config_key(spec["config"])
        out.append({"run_id": spec["run_id"], "key": key, "seed": spec["config"]["seed"], "flat": flatten(identity)})
    for stage2 in posthoc:
        for spec in runs:
            key, identity = config_key({**spec["config"], "posthoc": stage2})
            out.append({"run_id": store.stage2_run_id(spec["run_id"], stage2), "key": key, "seed": spec["config"]["seed"],
                        "flat": flatten(identity)})
    return out


def recipe_runs(path: str | Path, results: str | Path | None = None, use_cache: bool = True,
                overrides: list[str] = ()) -> RecipeRuns:
    """Expected runs and declared tables of a recipe file (with the same dotted overrides as
    ``ltbench run``), from the cache when nothing changed."""
    from ltbench.recipe import load_yaml, parse_override, set_dotted

    path = Path(path)
    raw = load_yaml(path)
    for text in overrides:
        key, value = parse_override(text)
        set_dotted(raw, key, value, f"{path}: override '{text}'")
    name, root = _root_of(path, raw, results)
    plugins = raw.get("plugins") if isinstance(raw.get("plugins"), list) else []
    plugin_dirs = [str((path.parent / p).resolve()) for p in plugins if isinstance(p, str)]
    signature = hashlib.sha1(path.read_bytes() + json.dumps([str(root), list(overrides)]).encode()
                             + _code_signature(plugin_dirs).encode()).hexdigest()
    cache_path = cache_file(root, f".ltbench-recipe-{name}-"
                                  f"{hashlib.sha1(json.dumps(list(overrides)).encode()).hexdigest()[:8]}.json")
    if use_cache:
        try:
            cached = json.loads(cache_path.read_text())
            if cached.get("version") == CACHE_VERSION and cached.get("signature") == signature:
                tables = parse_tables(raw.get("tables"), f"{path}: tables")
                flats = cached["flats"]
                expected = [{"run_id": r, "key": k, "seed": s, "flat": flats[k]} for r, k, s in cached["expected"]]
                return RecipeRuns(name, path, root, expected, tables, cached["seeds"])
        except (OSError, ValueError, KeyError, AttributeError):
            pass
    from ltbench.recipe import load_recipe

    recipe = load_recipe(path, list(overrides), results_dir=results)
    expected = expected_of(recipe.runs, recipe.posthoc)
    seeds = list(dict.fromkeys(e["seed"] for e in expected))
    if use_cache and root.is_dir():
        try:
            compact = {"version": CACHE_VERSION, "signature": signature, "seeds": seeds,
                       "expected": [[e["run_id"], e["key"], e["seed"]] for e in expected],
                       "flats": {e["key"]: e["flat"] for e in expected}}  # one flat config per row, not per seed
            store.atomic_write_bytes(cache_path, json.dumps(compact).encode())
        except (OSError, TypeError, ValueError):
            pass
    return RecipeRuns(recipe.name, path, recipe.root, expected, recipe.tables, seeds)
