"""Recipes: a YAML file that expands into runs (grid x seeds), each named by a hash of its config.

A recipe has a base configuration (``data``, ``backbone``, ``method``, ``optim``, ``train``,
``eval``), a ``grid`` of dotted keys -> lists of values (or a list of such grids, whose runs are
joined), and ``seeds``. Each run's configuration is validated against the core's dataclasses and
the ``Config`` of the named plugins. The run id is a sha1 of the resolved configuration without
paths or launcher settings, so the same experiment always lands in the same directory.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ltbench import registry
from ltbench.config import ConfigError, EvalConfig, OptimConfig, TrainConfig, from_dict, to_dict
from ltbench.registry import BACKBONES, DATASETS, RegistryError

# Configuration fields that do not change what a run computes (paths, local resources).
NOT_IN_RUN_ID = {("data", "root"), ("data", "split_dir"), ("data", "download"), ("data", "check_images"),
                 ("train", "threads"), ("train", "progress"),
                 # how the same computation is executed (like threads: equal up to float rounding)
                 ("train", "channels_last"), ("train", "compile"), ("train", "cudnn_benchmark")}


@dataclass
class LauncherConfig:
    name: Literal["local", "slurm", "debug"] = "local"
    jobs: int = 1  # local: worker processes
    max_array_size: int = 1000  # slurm: runs per job array
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time_min: int = 60
    cpus_per_task: int = 2
    mem_gb: float = 4.0
    gpus_per_node: int = 0
    nodes: int = 1
    array_parallelism: int = 32
    setup: list[str] = field(default_factory=list)  # shell lines run before the job
    additional: dict[str, Any] = field(default_factory=dict)  # extra sbatch options
    max_requeues: int = 3


@dataclass
class RecipeConfig:
    name: str | None = None
    description: str = ""
    plugins: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [0])
    grid: Any = None  # dict[dotted key, list] or list of such dicts
    data: dict[str, Any] = field(default_factory=dict)
    backbone: dict[str, Any] = field(default_factory=dict)
    method: dict[str, Any] = field(default_factory=dict)
    optim: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    eval: dict[str, Any] = field(default_factory=dict)
    launcher: dict[str, Any] = field(default_factory=dict)
    results_dir: str = "results"


@dataclass
class Recipe:
    name: str
    path: Path
    raw: dict
    runs: list[dict]  # run specs (plain data; what a launcher hands to a worker)
    launcher: LauncherConfig
    results_dir: Path
    plugins: list[str]

    @property
    def root(self) -> Path:
        return self.results_dir / self.name


def parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ConfigError(f"override '{text}': expected key=value, e.g. optim.lr=0.05")
    key, value = text.split("=", 1)
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return key.strip(), parsed


def set_dotted(tree: dict, key: str, value: Any, where: str) -> None:
    parts = key.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{where}: cannot set '{key}': '{'.'.join(parts[: i + 1])}' is not a mapping")
        node = child
    node[parts[-1]] = copy.deepcopy(value)


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def run_id_of(config: dict) -> str:
    identity = copy.deepcopy(config)
    for section, key in NOT_IN_RUN_ID:
        identity.get(section, {}).pop(key, None)
    return hashlib.sha1(canonical_json(identity).encode()).hexdigest()[:12]


def _grid_points(grid: Any, where: str) -> list[dict]:
    if grid is None:
        return [{}]
    grids = grid if isinstance(grid, list) else [grid]
    points = []
    for i, g in enumerate(grids):
        gwhere = _join(where, "grid") + (f"[{i}]" if isinstance(grid, list) else "")
        if not isinstance(g, dict):
            raise ConfigError(f"{gwhere}: expected a mapping of dotted keys to lists of values")
        for key, values in g.items():
            if not isinstance(values, list) or not values:
                raise ConfigError(f"{gwhere}.{key}: expected a non-empty list of values, got {values!r}")
        keys = list(g)
        for combo in itertools.product(*(g[k] for k in keys)):
            points.append(dict(zip(keys, combo)))
    return points


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _component(section: str, spec: Any, reg: registry.Registry, where: str) -> dict:
    where = _join(where, section)
    if not isinstance(spec, dict) or "name" not in spec:
        raise ConfigError(f"{where}: expected a mapping with a 'name' key (known: {', '.join(reg.names())})")
    options = dict(spec)
    name = options.pop("name")
    if not isinstance(name, str):
        raise ConfigError(f"{where}.name: expected a string, got {name!r}")
    try:
        cls = reg.get(name)
    except RegistryError as exc:
        raise ConfigError(f"{where}.name: {exc}") from None
    return {"name": name, **to_dict(from_dict(cls.Config, options, where))}


def resolve_run_config(raw: dict, seed: int, where: str) -> dict:
    """Validate one run's configuration into plain, fully defaulted data."""
    from ltbench.method import resolved_method_spec

    method = raw.get("method")
    mwhere = _join(where, "method")
    if not isinstance(method, dict) or "name" not in method:
        raise ConfigError(f"{mwhere}: expected a mapping with a 'name' key")
    try:
        method_resolved = resolved_method_spec(method, mwhere)
    except RegistryError as exc:
        raise ConfigError(f"{mwhere}.name: {exc}") from None
    return {
        "data": _component("data", raw.get("data"), DATASETS, where),
        "backbone": _component("backbone", raw.get("backbone"), BACKBONES, where),
        "method": method_resolved,
        "optim": to_dict(from_dict(OptimConfig, raw.get("optim"), _join(where, "optim"))),
        "train": to_dict(from_dict(TrainConfig, raw.get("train"), _join(where, "train"))),
        "eval": to_dict(from_dict(EvalConfig, raw.get("eval"), _join(where, "eval"))),
        "seed": seed,
    }


def load_yaml(path: Path) -> dict:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: recipe file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read recipe ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{at}: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a YAML mapping at the top level")
    return data


def load_recipe(path: str | Path, overrides: list[str] = (), results_dir: str | Path | None = None) -> Recipe:
    path = Path(path)
    raw = load_yaml(path)
    where = str(path)
    for text in overrides:
        key, value = parse_override(text)
        set_dotted(raw, key, value, f"{where}: override '{text}'")
    # Errors carry the file name in front of the dotted field.
    try:
        top = from_dict(RecipeConfig, raw, "")
        return _expand(path, raw, top, results_dir)
    except ConfigError as exc:
        msg = str(exc)
        raise ConfigError(msg if msg.startswith(where) else f"{where}: {msg}") from None


def _expand(path: Path, raw: dict, top: RecipeConfig, results_dir) -> Recipe:
    name = top.name or path.stem
    plugins = [str((path.parent / p).resolve()) if not Path(p).is_absolute() else p for p in top.plugins]
    try:
        registry.add_plugin_paths(plugins)
    except RegistryError as exc:
        raise ConfigError(f"plugins: {exc}") from None
    launcher = from_dict(LauncherConfig, top.launcher, "launcher")
    out_dir = Path(results_dir if results_dir is not None else top.results_dir)
    if not out_dir.is_absolute() and results_dir is None:
        out_dir = Path.cwd() / out_dir
    out_dir = out_dir.resolve()
    if not top.seeds:
        raise ConfigError("seeds: expected a non-empty list of integers")
    base = {k: raw.get(k, {}) for k in ("data", "backbone", "method", "optim", "train", "eval")}
    runs, seen = [], set()
    for point in _grid_points(top.grid, ""):
        cfg = copy.deepcopy(base)
        for key, value in point.items():
            set_dotted(cfg, key, value, f"grid.{key}")
        for seed in top.seeds:
            config = resolve_run_config(cfg, seed, "")
            run_id = run_id_of(config)
            if run_id in seen:
                continue
            seen.add(run_id)
            runs.append(
                {
                    "recipe": name,
                    "run_id": run_id,
                    "config": config,
                    "grid": point,
                    "plugins": registry.plugin_paths(),
                    "run_dir": str(out_dir / name / run_id),
                }
            )
    return Recipe(name, path, raw, runs, launcher, out_dir, plugins)


def run_label(run: dict) -> str:
    """Short human label of a run spec or result: the method name plus the method values the grid varies,
    a method mapping rendered as name[key=value,...]."""
    grid = run.get("grid") or {}
    extras = [f"{k.split('.', 1)[1]}={_short(v)}" for k, v in grid.items()
              if k.startswith("method.") and k != "method.name"]
    if isinstance(grid.get("method"), dict):
        extras += [f"{k}={_short(v)}" for k, v in grid["method"].items() if k != "name"]
    return run["config"]["method"]["name"] + (f" ({', '.join(extras)})" if extras else "")


def _short(v: Any) -> str:
    if isinstance(v, dict):
        rest = ",".join(f"{k}={_short(x)}" for k, x in v.items() if k != "name")
        return f"{v.get('name', '?')}[{rest}]" if rest else str(v.get("name", v))
    return str(v)


def distinct_data(runs: list[dict]) -> list[dict]:
    """One run spec per distinct data configuration (to check or describe each dataset once)."""
    seen, out = set(), []
    for spec in runs:
        key = canonical_json(spec["config"]["data"])
        if key not in seen:
            seen.add(key)
            out.append(spec)
    return out
