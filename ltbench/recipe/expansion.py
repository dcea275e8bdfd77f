"""A recipe's expanded runs, cached so that ``ltbench status RECIPE`` needs no torch when nothing changed.

Expanding a recipe validates every run against the plugins' Config classes, which imports the method
modules and therefore torch. ``status`` only needs what the expansion produced (each run's id, folder,
configuration and grid point, and the keys the command line set), so after one expansion it is kept in
the results folder (``.ltbench-runs-<name>-<overrides hash>.json``, or under $LTBENCH_CACHE_DIR),
keyed by everything the expansion depends on that a file can show (``expansion_signature``): the
recipe file's path and bytes, the overrides, the results root, and the size and mtime of every Python
file of ltbench, the built-in methods, the recipe's plugin folders and the $LTBENCH_PLUGIN_PATH
folders. Any change there expands the recipe again (with torch), so a stale cache never changes
what status reports. Not cached: a recipe whose dataset names its data by a digest of its files
(``identity.DATA_IDENTITY``; the files may change without any of the above), and a recipe whose
results folder does not exist yet. Not seen: a plugin installed as a package (entry point) and
upgraded in place; delete the cache file after such an upgrade.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ltbench.results import caches, store
from ltbench.results.identity import FILE_IDENTITIES
from ltbench.recipe import Recipe, RecipeConfig, read_recipe_file, recipe_name, results_root
from ltbench.registry import PLUGIN_PATH_ENV
from ltbench.results.runspec import RunSpec

RUNS_CACHE_VERSION = 1
SPEC_KEYS = ("recipe", "run_id", "config", "grid", "run_dir")  # what status reads of a run spec


def env_plugin_dirs() -> list[str]:
    """The folders of $LTBENCH_PLUGIN_PATH (registry.py imports them into every expansion)."""
    return [p for p in os.environ.get(PLUGIN_PATH_ENV, "").split(os.pathsep) if p]


@dataclass
class RecipeFile:
    """What the recipe file alone says, without expanding it (no plugins imported, no torch)."""
    path: Path
    raw: dict  # the YAML with the recipe-level overrides set
    name: str
    root: Path  # results/<name>
    plugin_dirs: list[str]  # the recipe's plugins:, absolute


def read_recipe(path: str | Path, overrides: list[str] = (), results: str | Path | None = None) -> RecipeFile:
    """The recipe's name, results folder and plugin folders by the recipe's own rules, from its file."""
    path = Path(path)
    raw, _ = read_recipe_file(path, list(overrides))
    declared = raw.get("name") if isinstance(raw.get("name"), str) else None
    configured = raw.get("results_dir") if isinstance(raw.get("results_dir"), str) else RecipeConfig.results_dir
    name = recipe_name(path, declared)
    plugins = raw.get("plugins") if isinstance(raw.get("plugins"), list) else []
    plugin_dirs = [str((path.parent / p).resolve()) for p in plugins if isinstance(p, str)]
    return RecipeFile(path, raw, name, results_root(configured, results) / name, plugin_dirs)


def expansion_signature(recipe: RecipeFile, overrides: list[str]) -> str:
    """Everything a file can show that the expansion depends on (the module docstring lists it)."""
    h = hashlib.sha1(recipe.path.read_bytes())
    h.update(json.dumps([str(recipe.path.resolve()), str(recipe.root), list(overrides),
                         os.environ.get(PLUGIN_PATH_ENV, "")]).encode())
    h.update(caches.code_signature(recipe.plugin_dirs + env_plugin_dirs()).encode())
    return h.hexdigest()


def _runs_cache_path(recipe: RecipeFile, overrides: list[str]) -> Path:
    tag = hashlib.sha1(json.dumps(list(overrides)).encode()).hexdigest()[:8]
    return store.cache_file(recipe.root, f".ltbench-runs-{recipe.name}-{tag}.json")


def runs_cache_problem(cached: object, root: Path, name: str = "") -> str:
    """'' when a runs cache holds only what it claims (ltbench/results/caches.py), else what is wrong: a
    forged or damaged cache is expanded again, never shown. Each run: its recipe's name, a configuration
    that validates as a recipe's, a run id that is 12 hex digits and the hash of that configuration (so a
    changed method, seed or learning rate, or an id such as '../../etc', is caught), its folder directly
    under the results folder and named by that id, and no run twice."""
    if not isinstance(cached, dict):
        return "not a mapping"
    keys, runs = cached.get("override_keys"), cached.get("runs")
    if not (isinstance(keys, list) and all(isinstance(k, str) for k in keys)):
        return "override_keys"
    if not isinstance(runs, list):
        return "runs"
    seen: set[str] = set()
    for spec in runs:
        if not (isinstance(spec, dict) and set(spec) == set(SPEC_KEYS) and isinstance(spec["grid"], dict)
                and (not name or spec["recipe"] == name)):
            return "runs: an entry is malformed"
        problem = caches.config_problem(spec["config"]) or caches.run_id_problem(spec["run_id"], spec["config"])
        if problem:
            return f"runs: {problem}"
        if spec["run_dir"] != str(root / spec["run_id"]) or spec["run_id"] in seen:
            return f"runs: run {spec['run_id']} is listed twice or its folder is not {root / spec['run_id']}"
        seen.add(spec["run_id"])
    return ""


def cached_runs(recipe: RecipeFile, overrides: list[str], signature: str) -> tuple[list[RunSpec], list[str]] | None:
    """(run specs, override keys) of the recipe's last expansion when nothing it depends on changed since
    (``signature``: expansion_signature, taken before); None otherwise (then the caller expands the
    recipe, and saves it with ``save_runs``)."""
    cached = caches.read_cache(_runs_cache_path(recipe, overrides))
    if not isinstance(cached, dict) or cached.get("version") != RUNS_CACHE_VERSION \
            or cached.get("signature") != signature \
            or runs_cache_problem(cached, recipe.root, recipe.name):
        return None
    return [RunSpec.from_dict(spec) for spec in cached["runs"]], cached["override_keys"]


def save_runs(recipe_file: RecipeFile, overrides: list[str], signature: str, recipe: Recipe) -> None:
    """Keep an expansion for the next status (best effort, caches.write_cache: an unwritable folder only
    costs the next one torch). ``signature`` was taken before expanding, so a file edited meanwhile makes the cache miss."""
    if recipe.root != recipe_file.root or not recipe.root.is_dir() \
            or any(key in spec.config for spec in recipe.runs for key in FILE_IDENTITIES):
        return
    payload = {"version": RUNS_CACHE_VERSION, "signature": signature,
               "override_keys": list(recipe.override_keys),
               "runs": [{k: getattr(spec, k) for k in SPEC_KEYS} for spec in recipe.runs]}
    try:
        data = json.dumps(payload).encode()
    except (TypeError, ValueError):
        return
    caches.write_cache(_runs_cache_path(recipe_file, overrides), data)
