"""What the plugins answered, as the caches' inputs name it, so that ``status``, ``table``, ``list`` and
``--dry-run`` need no torch when nothing changed.

Expanding a recipe validates every run against the plugins' Config classes, which imports the method
modules and therefore torch (and listing the plugins imports them too). So the expansion, the plugin listing
and the memory estimates are cached (ltbench/results/caches.py: one rule, the seal). What each is a function
of besides ltbench's own code (:func:`expansion_inputs`, :func:`plugin_inputs`): the recipe as read (its
YAML less ``tables:``, which no run depends on), its path, the overrides, the results root,
$LTBENCH_PLUGIN_PATH, the size and mtime of every Python file of the recipe's plugin folders and the
$LTBENCH_PLUGIN_PATH folders, the installed packages that register ltbench plugins
(``caches.installed_plugins``), and a search's results and sampler state (recipe.trials.search_signature). Not in them, so they keep the caches: a table's
caption or rows, an unrelated package installed.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ltbench.results import caches, store
from ltbench.recipe import read_recipe_file, recipe_name, results_root, RecipeConfig
from ltbench import registry
from ltbench.config import describe_options
from ltbench.registry import PLUGIN_PATH_ENV
from ltbench.recipe.trials import search_signature
from ltbench.results.runspec import RunSpec


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


def plugin_inputs(plugin_dirs: list[str]) -> list:
    """What the plugins a command can import are, as files show it: $LTBENCH_PLUGIN_PATH, the code of these
    folders and of its folders, and the installed plugin packages."""
    return [os.environ.get(PLUGIN_PATH_ENV, ""), caches.code_signature(list(plugin_dirs) + env_plugin_dirs()),
            caches.installed_plugins()]


def expansion_inputs(recipe: RecipeFile, overrides: list[str]) -> list:
    """Everything the expansion is a function of besides ltbench's code (the module docstring lists it). The
    recipe enters as read (``repr`` keeps the YAML's order and types), less ``tables:``."""
    raw = repr({k: v for k, v in recipe.raw.items() if k != "tables"})
    return ["expansion", str(recipe.path.resolve()), raw, str(recipe.root.resolve()), list(overrides),
            search_signature(recipe.raw, recipe.root), *plugin_inputs(recipe.plugin_dirs)]


def expansion_cache_path(recipe: RecipeFile, overrides: list[str]) -> Path:
    tag = hashlib.sha1(json.dumps(list(overrides)).encode()).hexdigest()[:8]
    return store.cache_file(recipe.root, f".ltbench-expansion-{recipe.name}-{tag}.json")


# ------------------------------------------------------------------------------------------------
# ``ltbench list``: what discovery found, by kind


def plugin_listing(plugin_dirs: list[str]) -> dict[str, list[dict]]:
    """Every registered plugin of every kind (``registry.REGISTRIES``), as ``ltbench list`` shows it: name, the
    first line of its docstring, where it comes from, its module and its options (``config.describe_options``).
    Discovered (imports the plugins, hence torch) only when the cache's inputs changed (``caches.memo``)."""
    dirs = [str(Path(p).expanduser().resolve()) for p in plugin_dirs]
    tag = hashlib.sha1(json.dumps(dirs).encode()).hexdigest()[:8]
    return caches.memo(store.cache_home() / f".ltbench-plugins-{tag}.json", ["listing", dirs, *plugin_inputs(dirs)],
                       lambda: discovered_listing(dirs))


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


# ------------------------------------------------------------------------------------------------
# The memory estimates of ``run`` and ``--dry-run`` (ltbench/train/resources.py)

ESTIMATES_FILE = ".ltbench-estimates.json"


def cached_estimates(plugin_dirs: list[str]) -> tuple[list, dict]:
    """(the cache's inputs, {configuration key: the five numbers of its estimate, or None}) kept from earlier
    launches under the same plugins. Why: an estimate builds the model on the meta device and runs it on one
    image there, and torch's meta-device kernels import ``torch._dynamo`` (1.5 s), on every ``--dry-run``. An
    estimate depends only on the configuration and the code, never on the machine (the bounds are taken anew)."""
    inputs = ["estimates", *plugin_inputs(plugin_dirs)]
    return inputs, caches.memo(store.cache_home() / ESTIMATES_FILE, inputs, lambda: None) or {}


def save_estimates(inputs: list, estimates: dict) -> None:
    caches.memo(store.cache_home() / ESTIMATES_FILE, inputs, lambda: estimates, refresh=True)
