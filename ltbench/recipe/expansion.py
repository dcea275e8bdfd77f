"""What the plugins answered, cached, so that ``status``, ``table`` and ``list`` need no torch when nothing changed.

Expanding a recipe validates every run against the plugins' Config classes, which imports the method
modules and therefore torch (and listing the plugins imports them too). ``status`` only needs what the
expansion produced (each run's id, folder, configuration and grid point, and the keys the command line
set), and ``list`` only the names, docs and options discovery found; so both are kept after one
expansion or discovery: ``.ltbench-runs-<name>-<overrides hash>.json`` where ``store.cache_file`` puts a
results folder's caches (the folder itself, or the user's cache folder when it is not writable, is part of
the source tree or does not exist yet), ``.ltbench-plugins-<hash>.json`` in the user's cache folder. Both are
keyed by everything they depend on that a file can show (``expansion_signature``, ``listing_signature``):
the recipe file's path and bytes, the overrides, the results root, and the size and mtime of every Python
file of ltbench, the built-in methods, the recipe's plugin folders and the $LTBENCH_PLUGIN_PATH folders,
and the mtime of each site-packages folder (a plugin package installed, upgraded or removed changes it).
Any change there expands the recipe again (with torch), so a stale cache never changes what a command
shows. Not cached: a recipe whose dataset names its data by a digest of its files
(``identity.DATA_IDENTITY``; the files may change without any of the above).
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
from ltbench import registry
from ltbench.config import describe_options
from ltbench.registry import PLUGIN_PATH_ENV
from ltbench.recipe.tpe import JOURNAL
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
    h.update(journal_signature(recipe).encode())
    return h.hexdigest()


def journal_signature(recipe: RecipeFile) -> str:
    """A tpe search's runs are the trials its journal holds (ltbench/recipe/tpe.py): its size and mtime are
    part of what the expansion depends on ('' for other recipes, and before the first trial)."""
    found = recipe.raw.get("search")
    if not (isinstance(found, dict) and found.get("sampler") == "tpe"):
        return ""
    try:
        info = (recipe.root / JOURNAL).stat()
    except OSError:
        return "no journal"
    return f"{info.st_size}:{info.st_mtime_ns}"


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
    if recipe.root != recipe_file.root \
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


# ------------------------------------------------------------------------------------------------
# ``ltbench list``: what discovery found, by kind

LISTING_VERSION = 1


def plugin_listing(plugin_dirs: list[str]) -> dict[str, list[dict]]:
    """Every registered plugin of every kind (``registry.REGISTRIES``), as ``ltbench list`` shows it: name, the
    first line of its docstring, where it comes from, its module and its options (``config.describe_options``).
    From the cache when no file discovery depends on changed (``listing_signature``), else discovered
    (imports the plugins, hence torch) and cached. The cache holds text only, and is shown as text."""
    dirs = [str(Path(p).expanduser().resolve()) for p in plugin_dirs]
    signature = listing_signature(dirs)
    tag = hashlib.sha1(json.dumps(dirs).encode()).hexdigest()[:8]
    path = store.cache_home() / f".ltbench-plugins-{tag}.json"
    cached = caches.read_cache(path)  # sealed: None when missing, damaged or edited
    if isinstance(cached, dict) and cached.get("version") == LISTING_VERSION \
            and cached.get("signature") == signature and not listing_problem(cached.get("kinds")):
        return cached["kinds"]
    kinds = discovered_listing(dirs)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # the write below fails and says so once: the listing is shown all the same
    caches.write_cache(path, json.dumps({"version": LISTING_VERSION, "signature": signature,
                                         "kinds": kinds}).encode())
    return kinds


def listing_signature(plugin_dirs: list[str]) -> str:
    h = hashlib.sha1(json.dumps([plugin_dirs, os.environ.get(PLUGIN_PATH_ENV, "")]).encode())
    h.update(caches.code_signature(plugin_dirs + env_plugin_dirs()).encode())
    return h.hexdigest()


def discovered_listing(plugin_dirs: list[str]) -> dict[str, list[dict]]:
    registry.add_plugin_paths(plugin_dirs)
    kinds = {}
    for kind, reg in registry.REGISTRIES.items():
        kinds[kind] = []
        for e in reg.entries():
            doc = (getattr(e.obj, "__doc__", None) or "").strip().splitlines()
            options = describe_options(getattr(e.obj, "Config", None) or object)
            kinds[kind].append({"name": e.name, "doc": doc[0] if doc else "", "source": e.source, "module": e.module,
                                "options": [[o.name, o.type, o.default, o.doc] for o in options]})
    return kinds


def listing_problem(kinds: object) -> str:
    """'' when a listing cache holds text where text is expected (it is only ever printed), else what is wrong."""
    if not isinstance(kinds, dict):
        return "kinds"
    for entries in kinds.values():
        if not isinstance(entries, list):
            return "entries"
        for e in entries:
            if not (isinstance(e, dict) and all(isinstance(e.get(k), str) for k in ("name", "doc", "source", "module"))
                    and isinstance(e.get("options"), list)
                    and all(isinstance(o, list) and len(o) == 4 and all(isinstance(x, str) for x in o)
                            for o in e["options"])):
                return "an entry is malformed"
    return ""


# ------------------------------------------------------------------------------------------------
# The memory estimates of ``run`` and ``--dry-run`` (ltbench/train/resources.py)

ESTIMATES_VERSION = 1
ESTIMATE_FIELDS = 5  # data, model, step (bytes), batch, views: resources.Estimate


def cached_estimates(plugin_dirs: list[str]) -> tuple[str, dict]:
    """(signature, {configuration key: the five numbers of its estimate, or None}) kept from earlier launches,
    when no Python file they depend on changed. Why: an estimate builds the model on the meta device and runs
    it on one image there, and torch's meta-device kernels import ``torch._dynamo`` (1.5 s), on every ``--dry-run``. An
    estimate depends only on the configuration and the code, never on the machine (the bounds are taken anew)."""
    signature = caches.code_signature(list(plugin_dirs) + env_plugin_dirs())
    cached = caches.read_cache(store.cache_home() / ".ltbench-estimates.json")  # sealed, like every cache
    good = isinstance(cached, dict) and cached.get("version") == ESTIMATES_VERSION \
        and cached.get("signature") == signature and isinstance(cached.get("estimates"), dict) \
        and all(v is None or (isinstance(v, list) and len(v) == ESTIMATE_FIELDS
                              and all(type(x) is int and x >= 0 for x in v)) for v in cached["estimates"].values())
    return signature, (cached["estimates"] if good else {})


def save_estimates(signature: str, estimates: dict) -> None:
    folder = store.cache_home()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # the write below fails and says so once
    caches.write_cache(folder / ".ltbench-estimates.json", json.dumps(
        {"version": ESTIMATES_VERSION, "signature": signature, "estimates": estimates}).encode())
