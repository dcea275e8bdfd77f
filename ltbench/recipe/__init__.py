"""Recipes: a YAML file that expands into runs (grid x seeds), each named by a hash of its config.

A recipe has a base configuration (``data``, ``backbone``, ``method``, ``optim``, ``train``,
``eval``), a ``grid`` of dotted keys -> lists of values (or a list of such grids, whose runs are
joined), and ``seeds``. Each run's configuration is validated against the core's dataclasses and
the ``Config`` of the named plugins. Dotted overrides of a run's configuration are set on every grid
point after the grid (the command line wins) or refused. The run id is ``identity.run_id``: a sha1 of the
resolved configuration less its execution settings (ltbench/results/identity.py), so the same experiment always
lands in the same directory.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ltbench.results import identity, store
from ltbench import registry
from ltbench.config import ConfigError, EvalConfig, OptimConfig, TrainConfig, check_range, from_dict, join_path, to_dict, value_text
from ltbench.errors import short_repr
from ltbench.registry import BACKBONES, DATASETS, PIPELINES, RegistryError
from ltbench.data.validation import declares_validation
from ltbench.recipe.tables import parse_tables
from ltbench.recipe.selection import matches, select_where
from ltbench.recipe.trials import (Study, check_space_used, check_tuning_seeds, finished_choice, parse_search,
                                   plan_lines, point_space, trial_configs, trial_record, with_values)
from ltbench.results.runspec import RunSpec
from ltbench.search import SAMPLERS, probe_values, space_text
from ltbench.samplers import DEFAULT_SAMPLER, resolve_sampler

# Bounds on what a recipe may ask for, each far above any real use: a recipe is read before anything
# runs, so a typo (a grid of 10^6 points, a log file given as the recipe) is refused at once.
MAX_RECIPE_BYTES = 512 * 1024  # the largest recipe in recipes/ is a few KB
MAX_OVERRIDE_CHARS = 10_000
MAX_RUNS = 10_000  # runs a recipe may expand into (grid points x seeds)
MAX_SEEDS = 1_000
# Sections of a run's configuration: the only things a grid key or an override below the top may set.
RUN_SECTIONS = ("data", "backbone", "method", "optim", "train", "eval", "sampler")
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,99}")
DOTTED_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")



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
    # local: runs trained at once on each visible GPU (small models do not fill a GPU); the pool then has
    # (visible GPUs x runs_per_gpu) workers, placed round-robin (launch.gpu_slots)
    runs_per_gpu: int = 1

    def validate(self) -> None:
        check_range("jobs", self.jobs, 1, 4096)
        check_range("runs_per_gpu", self.runs_per_gpu, 1, 64)
        check_range("max_array_size", self.max_array_size, 1, 1_000_000)
        check_range("time_min", self.time_min, 1, 525_600, unit=" (minutes)")
        check_range("cpus_per_task", self.cpus_per_task, 1, 4096)
        check_range("mem_gb", self.mem_gb, 0, 1_000_000, low_open=True)
        check_range("gpus_per_node", self.gpus_per_node, 0, 1024)
        check_range("nodes", self.nodes, 1, 100_000)
        check_range("array_parallelism", self.array_parallelism, 1, 1_000_000)
        check_range("max_requeues", self.max_requeues, 0, 1000)


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
    tables: dict[str, Any] = field(default_factory=dict)  # named tables (ltbench/recipe/tables.py)
    posthoc: Any = None  # stage-2 settings over the finished runs (ltbench.posthoc.expand_posthoc)
    sampler: dict[str, Any] = field(default_factory=dict)  # training sampler {name, **options} (ltbench/samplers/)
    search: Any = None  # random search over each method's space (ltbench/recipe/trials.py, docs/tuning.md)

    def validate(self) -> None:
        if self.name is not None:
            check_plain_name(self.name, "name")
        if not self.seeds:
            raise ValueError("seeds: expected a non-empty list of integers, e.g. [0, 1, 2]")
        if len(self.seeds) > MAX_SEEDS:
            raise ValueError(f"seeds: at most {MAX_SEEDS} seeds, got {len(self.seeds)}")
        for seed in self.seeds:
            check_range("seeds[...]", seed, 0, 2**32 - 1)
        twice = next((seed for i, seed in enumerate(self.seeds) if seed in self.seeds[:i]), None)
        if twice is not None:  # the second would be the same run: silently one run fewer than listed
            raise ValueError(f"seeds: {twice} is listed twice; each seed is one run, list it once")


@dataclass
class Recipe:
    name: str
    path: Path
    raw: dict
    runs: list[RunSpec]  # run specs (a worker gets each as plain data: RunSpec.to_dict)
    launcher: LauncherConfig
    results_dir: Path
    plugins: list[str]
    tables: dict = field(default_factory=dict)  # name -> ltbench.recipe.tables.TableSpec
    posthoc: list = field(default_factory=list)  # resolved stage-2 specs (``ltbench posthoc``)
    override_keys: list = field(default_factory=list)  # dotted keys the command line set in every run
    overrides: list = field(default_factory=list)  # the overrides as typed (what `ltbench table` is given too)
    results_arg: str | None = None  # --results as given (None: the recipe's results_dir)
    where: dict = field(default_factory=dict)  # --where: the part of the grid this command runs (recipe/selection.py)
    search: list = field(default_factory=list)  # what --dry-run says of the search (trials.plan_lines)
    studies: list = field(default_factory=list)  # a sampler that asks (search.SAMPLERS): one trials.Study per grid point
    probes: list = field(default_factory=list)  # its run specs checked before any run, never run
    found: Any = None  # the parsed search: section (trials.Search), None without one
    identities: dict = field(default_factory=dict)  # data and weights identities asked so far (_run_config)
    seeds: list = field(default_factory=list)  # the report seeds (a search's stage 2 runs on them)

    @property
    def root(self) -> Path:
        return self.results_dir / self.name


def check_plain_name(name: str, what: str) -> None:
    """A recipe name is one folder under the results root: no separator, no '..', not '.', not absolute."""
    if not PLAIN_NAME.fullmatch(name) or ".." in name:
        raise ValueError(f"{what}: {short_repr(name)} is not a plain name; use letters, digits and _ . + - "
                         f"(no '/', no '..', at most 100 characters), e.g. cifar10_lt_ldam")


def parse_override(text: str) -> tuple[str, Any]:
    """'optim.lr=0.05' -> ('optim.lr', 0.05): the value is read as YAML, with the recipe file's limits."""
    if len(text) > MAX_OVERRIDE_CHARS:
        raise ConfigError(f"override {short_repr(text)}: longer than {MAX_OVERRIDE_CHARS} characters")
    if "=" not in text:
        raise ConfigError(f"override {short_repr(text)}: expected key=value, e.g. optim.lr=0.05")
    key, value = text.split("=", 1)
    key = key.strip()
    if not DOTTED_KEY.fullmatch(key):
        raise ConfigError(f"override {short_repr(text)}: {short_repr(key)} is not a dotted key such as optim.lr")
    try:
        parsed = parse_yaml(value, f"override {short_repr(text, 60)}") if value.strip() else ""
    except ConfigError as exc:
        if "not valid YAML" not in str(exc):
            raise
        parsed = value  # a plain string such as a path with a colon
    return key, parsed


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




def _refuse_repeated_value(values: list, where: str) -> None:
    """A grid value listed twice gives the same runs twice, which a launch runs once: refused, so the plan has
    the runs the list seems to ask for."""
    seen = set()
    for value in values:
        text = json.dumps(value, sort_keys=True, default=repr)
        if text in seen:
            raise ConfigError(f"{where}: {short_repr(value)} is listed twice; each value gives its runs once, list it once")
        seen.add(text)


def _grid_points(grid: Any, where: str) -> list[dict]:
    if grid is None:
        return [{}]
    grids = grid if isinstance(grid, list) else [grid]
    if not grids:
        raise ConfigError(f"{join_path(where, 'grid')}: an empty list of grids gives no run; remove 'grid:' or add a grid")
    checked = []
    for i, g in enumerate(grids):
        gwhere = join_path(where, "grid") + (f"[{i}]" if isinstance(grid, list) else "")
        if not isinstance(g, dict):
            raise ConfigError(f"{gwhere}: expected a mapping of dotted keys to lists of values")
        for key, values in g.items():
            check_grid_key(key, gwhere)
            if not isinstance(values, list) or not values:
                raise ConfigError(f"{gwhere}.{key}: expected a non-empty list of values, got {short_repr(values)}")
            _refuse_repeated_value(values, f"{gwhere}.{key}")
        checked.append(g)
    total = sum(math.prod(len(v) for v in g.values()) for g in checked)
    if total > MAX_RUNS:
        raise ConfigError(f"{join_path(where, 'grid')}: expands into {total} points; at most {MAX_RUNS} runs per recipe "
                          f"(split it into several recipes)")
    points = []
    for g in checked:
        keys = list(g)
        for combo in itertools.product(*(g[k] for k in keys)):
            points.append(dict(zip(keys, combo)))
    return points


def check_grid_key(key: Any, where: str) -> None:
    """A grid key is a dotted path into a run's configuration; anything else would be silently ignored."""
    if not isinstance(key, str) or len(key) > 200 or not DOTTED_KEY.fullmatch(key) \
            or key.split(".")[0] not in RUN_SECTIONS:
        shown = key if isinstance(key, str) and len(key) < 100 else short_repr(key, 60)
        raise ConfigError(f"{where}.{shown}: not a configuration key; a grid key is a dotted path under "
                          f"{', '.join(RUN_SECTIONS)} (e.g. optim.lr); seeds go under 'seeds:', not the grid")
    if tuple(key.split(".")) in identity.EXECUTION_SETTINGS - FILE_LOCATIONS:
        raise ConfigError(f"{where}.{key}: an execution setting (how a run is executed, not what it computes: every "
                          f"value gives the same run id), so it cannot be a grid axis; set it once ({key}: ...) or "
                          f"on the command line")


# Execution settings that name files: different values may hold different data or weights, which the run id
# covers through the files' identity (identity.FILE_IDENTITIES), so they may vary over a grid.
FILE_LOCATIONS = frozenset({("data", "root"), ("data", "split_dir"), ("backbone", "weights")})


def _component(section: str, spec: Any, reg: registry.Registry, where: str) -> dict:
    where = join_path(where, section)
    if not isinstance(spec, dict) or "name" not in spec:
        raise ConfigError(f"{where}: expected a mapping with a 'name' key (known: {', '.join(reg.names())})")
    name = spec["name"]
    if not isinstance(name, str):
        raise ConfigError(f"{where}.name: expected a string, got {short_repr(name)}")
    try:
        reg.get(name)
    except RegistryError as exc:
        raise ConfigError(f"{where}.name: {exc}") from None
    return reg.resolved(spec, where)


def resolve_run_config(raw: dict, seed: int, where: str) -> dict:
    """Validate one run's configuration into plain, fully defaulted data."""
    from ltbench.method import resolved_method_spec  # lazy: keeps table and status free of torch

    method = raw.get("method")
    mwhere = join_path(where, "method")
    if not isinstance(method, dict) or "name" not in method:
        raise ConfigError(f"{mwhere}: expected a mapping with a 'name' key")
    if not isinstance(method["name"], str):
        raise ConfigError(f"{mwhere}.name: expected a string, got {short_repr(method['name'])}")
    try:
        method_resolved = resolved_method_spec(method, mwhere)
    except RegistryError as exc:
        raise ConfigError(f"{mwhere}.name: {exc}") from None
    config = {
        "data": _component("data", raw.get("data"), DATASETS, where),
        "backbone": _component("backbone", raw.get("backbone"), BACKBONES, where),
        "method": method_resolved,
        "optim": to_dict(from_dict(OptimConfig, raw.get("optim"), join_path(where, "optim"))),
        "train": to_dict(from_dict(TrainConfig, raw.get("train"), join_path(where, "train"))),
        "eval": to_dict(from_dict(EvalConfig, raw.get("eval"), join_path(where, "eval"))),
        "seed": seed,
    }
    _check_view_names(method_resolved, mwhere)
    _plugin_run_checks(config, where)
    _epoch_options_check(config, where)
    micro = config["optim"]["micro_batch_size"]  # under CUDA graphs each backward replay overwrites the last's gradients
    if config["train"]["compile"] == "reduce-overhead" and micro and micro < config["optim"]["batch_size"]:
        raise ConfigError(f"{join_path(where, 'optim.micro_batch_size')}: {micro} "
                          f"accumulates gradients over CUDA-graph replays, which train.compile: reduce-overhead "
                          f"cannot; use train.compile: inductor, or leave micro_batch_size out")
    config["sampler"] = resolve_sampler(raw.get("sampler"), getattr(registry.METHODS.get(method["name"]), "sampler", None),
                                         method["name"], join_path(where, "sampler"))
    if config["eval"]["select"] == "best_val" and not declares_validation(config["data"]):
        raise ConfigError(f"{join_path(where, 'eval.select')}: best_val needs a validation split; set data.val_per_class "
                          f"(e.g. 20) or data.val_split (e.g. val for ImageNet-LT); docs/protocol.md")
    builder = DATASETS.get(config["data"]["name"])
    _dataset_shot_thresholds(config["eval"], raw.get("eval"), builder, join_path(where, "eval"))
    for i, name in enumerate(config["eval"]["test_sets"]):
        try:
            registry.call_plugin(DATASETS.label(config["data"]["name"]), "check_test_set_name()",
                                 builder.check_test_set_name, name, passes=(ValueError,))
        except ValueError as exc:
            raise ConfigError(f"{join_path(where, 'eval.test_sets')}[{i}]: {exc} (dataset {config['data']['name']})") from None
    return config


def _epoch_options_check(config: dict, where: str) -> None:
    """An option that cannot act is refused, not ignored. The plugins' convention: ``<x>_epoch`` is the 0-indexed
    epoch at which ``<x>`` starts (LDAM-DRW's ``drw_epoch``), and a boolean ``<x>`` switches it on. So, for any
    method or sampler: ``<x>_epoch`` at or past ``optim.epochs`` never comes (DRW would never start), and
    ``<x>_epoch`` set while ``<x>`` is false does nothing."""
    epochs = config["optim"]["epochs"]
    for section in ("method", "sampler"):
        options = config.get(section) or {}
        for key, value in options.items():
            if not (key.endswith("_epoch") and isinstance(value, int) and not isinstance(value, bool)):
                continue
            switch = options.get(key[:-len("_epoch")])
            here = f"{where + ': ' if where else ''}{section}.{key}"
            if switch is False:
                raise ConfigError(f"{here}: {value} has no effect, {section}.{key[:-len('_epoch')]} is false; "
                                  f"remove it or set {section}.{key[:-len('_epoch')]}: true")
            if value >= epochs:
                raise ConfigError(f"{here}: {value} is not before the end of the schedule (optim.epochs {epochs}: "
                                  f"epochs 0-{max(epochs - 1, 0)}), so it never starts; give {key} < {epochs}, or "
                                  f"leave it out (the method's default share of the schedule)")


def idle_options(config: dict) -> dict[str, str]:
    """The core's options that cannot act in a run's resolved configuration, each with why and the fix (the
    value itself is in the message): the optimiser's options when optim.epochs is 0 (nothing is trained), the step
    schedule's milestones and gamma under another schedule, a test-time crop margin without test-time crops, a
    mid-run evaluation period that no epoch before the last reaches (the end is always evaluated), micro-batches as
    large as the batch (one chunk: no accumulation), and choosing the best epoch on validation when there is at
    most one epoch to choose from."""
    optim, train, ev = config["optim"], config["train"], config["eval"]
    epochs, idle = optim["epochs"], {}
    for key in UNTRAINED_IDLE if epochs == 0 else ():
        idle[f"optim.{key}"] = (f"{short_repr(optim[key])} has no effect: optim.epochs is 0, so the model is evaluated "
                                f"as built and nothing is trained; remove it, or give optim.epochs > 0")
    if optim["schedule"] != "step" and epochs:
        for key in ("milestones", "gamma"):
            idle[f"optim.{key}"] = (f"{short_repr(optim[key])} has no effect: optim.schedule is {optim['schedule']}, and "
                                    f"{key} is read by schedule: step only; remove it or set optim.schedule: step")
    if ev["tte"] == "none":
        idle["eval.tte_expand"] = (f"{ev['tte_expand']} has no effect, eval.tte is none (the margin is that of "
                                   f"test-time crops); remove it or set eval.tte: fivecrop or tencrop")
    if train["eval_every"] and train["eval_every"] >= epochs:
        idle["train.eval_every"] = (f"{train['eval_every']} is not before the end of the schedule (optim.epochs "
                                    f"{epochs}), so no evaluation comes of it (the end is always evaluated); give "
                                    f"eval_every < {epochs}, or leave it out")
    if optim["micro_batch_size"] is not None and optim["micro_batch_size"] >= optim["batch_size"] and epochs:
        idle["optim.micro_batch_size"] = (f"{optim['micro_batch_size']} is optim.batch_size, so each batch is one "
                                          f"chunk and nothing is accumulated; give a divisor of {optim['batch_size']} "
                                          f"smaller than it, or leave it out")
    if ev["select"] == "best_val" and epochs < 2:
        idle["eval.select"] = (f"best_val has no epoch to choose with optim.epochs {epochs} (the last is the only "
                               f"one); set eval.select: last, or train for more epochs")
    declared = getattr(registry.METHODS.get(config["method"]["name"]), "idle_options", None)
    for option, why in (declared(registry.METHODS.config(config["method"], "method")) if declared else {}).items():
        idle[f"method.{option}"] = why
    return idle


def _note_idle_options(raw: dict, config: dict, idle: dict[str, str], acting: set[str]) -> None:
    """Sort the options this run was given (by the recipe, its grid point or an override) that ``idle_options``
    knows into those that cannot act in it (``idle``: the first run's reason) and those that do (``acting``)."""
    found = idle_options(config)
    given_method = raw.get("method") if isinstance(raw.get("method"), dict) else {}
    for key in (*IDLE_CHECKED, *(f"method.{option}" for option in given_method)):
        section, option = key.split(".")
        if not (isinstance(raw.get(section), dict) and option in raw[section]):
            continue
        if key in found:
            idle.setdefault(key, found[key])
        else:
            acting.add(key)


# The optimiser's options that only training reads (batch_size also sets the evaluation batches; warmup_epochs must
# be 0 for 0 epochs, so it is checked there already).
UNTRAINED_IDLE = ("lr", "momentum", "nesterov", "weight_decay", "schedule", "milestones", "gamma", "micro_batch_size")
IDLE_CHECKED = (*(f"optim.{key}" for key in UNTRAINED_IDLE), "eval.tte_expand", "train.eval_every", "eval.select")


def refuse_idle_options(idle: dict[str, str], acting: set[str]) -> None:
    """An option given that acts in none of the recipe's runs is refused, not ignored: one line naming it. One
    that acts in some run stays (a grid over optim.schedule may give milestones for its step runs only)."""
    for key, why in idle.items():
        if key not in acting:
            raise ConfigError(f"{key}: {why}")


def _plugin_run_checks(config: dict, where: str) -> None:
    """A backbone or method may refuse a run configuration across sections (``check_run_config(config)``
    raising ValueError('<dotted field>: why')): a frozen pretrained backbone with training epochs, zero-shot
    with a backbone that has no text tower. Checked at load, so --dry-run and Slurm stop there too."""
    for section, reg in (("backbone", BACKBONES), ("method", registry.METHODS)):
        check = getattr(reg.get(config[section]["name"]), "check_run_config", None)
        if callable(check):
            try:
                check(config)
            except ValueError as exc:
                raise ConfigError(f"{where + ': ' if where else ''}{exc}") from None


def _dataset_shot_thresholds(resolved: dict, raw: Any, builder: Any, where: str) -> None:
    """Thresholds the recipe leaves out come from the dataset's ``shot_thresholds`` (20, 100 unless it
    suggests others); a threshold the recipe gives always wins."""
    given = raw if isinstance(raw, dict) else {}
    thresholds = getattr(builder, "shot_thresholds", (20, 100))
    if not (isinstance(thresholds, (tuple, list)) and len(thresholds) == 2
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in thresholds)):
        raise registry.PluginError(f"{DATASETS.label(builder.registered_name)}: shot_thresholds is "
                                   f"{short_repr(thresholds, 60)}, expected (few, many) whole numbers; fix the plugin")
    few, many = thresholds
    if "few_threshold" not in given:
        resolved["few_threshold"] = int(few)
    if "many_threshold" not in given:
        resolved["many_threshold"] = int(many)
    if resolved["few_threshold"] > resolved["many_threshold"]:
        raise ConfigError(f"{where}: few_threshold {resolved['few_threshold']} exceeds many_threshold "
                          f"{resolved['many_threshold']} (the dataset suggests {few} and {many}); give both")


STANDARD_VIEW_ALIASES = ("default", "strong", "sim", "eval")  # what every built-in dataset maps to a pipeline


def _check_view_names(method: dict, where: str) -> None:
    """Names in a method's ``views`` / ``*_views`` options (and an auxiliary method's) must be a dataset alias
    or a pipeline, or every run would fail when it builds its augmentations."""
    for key, value in method.items():
        if isinstance(value, dict) and "name" in value:
            _check_view_names(value, join_path(where, key))
        if not (key == "views" or key.endswith("_views")) or not isinstance(value, list):
            continue
        unknown = [v for v in value if v not in STANDARD_VIEW_ALIASES]
        if unknown:
            bad = [v for v in unknown if v not in PIPELINES]  # discovery imports the pipelines (torch)
            if bad:
                known = ", ".join([*STANDARD_VIEW_ALIASES, *PIPELINES.names()])
                raise ConfigError(f"{join_path(where, key)}: unknown view {short_repr(bad[0])}; known: {known}")


def load_yaml(path: Path) -> dict:
    """A recipe file as a mapping: at most MAX_RECIPE_BYTES, UTF-8, YAML within the limits of parse_yaml."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_RECIPE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{path}: recipe file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a recipe file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read recipe ({exc.strerror})") from None
    if len(raw) > MAX_RECIPE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_RECIPE_BYTES // 1024} KiB; a recipe is a short YAML file "
                          f"(generate long grids with 'grid:' lists instead)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                          f"save the recipe as UTF-8") from None
    data = parse_yaml(text, str(path))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a YAML mapping at the top level")
    return data


def parse_yaml(text: str, where: str) -> Any:
    """YAML text -> data with the safe loader. A recipe is code (docs/trust.md): a file that is bad YAML is
    refused in one line; one written to exhaust the loader is its author's own problem."""
    try:
        return yaml.safe_load(text)
    except yaml.reader.ReaderError as exc:
        raise ConfigError(f"{where}: not valid YAML: character {exc.character!r} at position {exc.position} "
                          f"is not allowed in YAML") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{where}: not valid YAML{at}: {short_repr(getattr(exc, 'problem', None) or exc)}") from None


def load_recipe(path: str | Path, overrides: list[str] = (), results_dir: str | Path | None = None,
                where: dict | None = None) -> Recipe:
    """A recipe file with dotted overrides. An override of a run's configuration (data, backbone, method,
    optim, train, eval) applies to every run, after the grid: the command line wins, as in Hydra. One under
    a plugin's section (method.tau) applies to the runs whose plugin has that option and must fit at
    least one of them; any other override (seeds, launcher.jobs, grid...) edits the recipe itself.
    ``where`` (--where, recipe/selection.py): only these runs, chosen before any run is validated."""
    path = Path(path)
    raw, run_overrides = read_recipe_file(path, overrides)
    named = str(path)
    # Errors carry the file name in front of the dotted field.
    try:
        top = from_dict(RecipeConfig, raw, "")
        recipe = _expand(path, raw, top, results_dir, run_overrides, where or {})
        recipe.overrides, recipe.results_arg = list(overrides), None if results_dir is None else str(results_dir)
        recipe.where = where or {}
        return recipe
    except ConfigError as exc:
        msg = str(exc)
        if msg.startswith(("override ", "--where ")):  # the command line's fault, not the file's
            raise ConfigError(f"command-line {msg}") from None
        raise ConfigError(msg if msg.startswith(named) else f"{named}: {msg}") from None


def read_recipe_file(path: Path, overrides: list[str] = ()) -> tuple[dict, list[RunOverride]]:
    """The recipe file's YAML with the overrides that edit the recipe itself (seeds, tables, results_dir...)
    set, and the overrides of a run's configuration, which _expand sets per grid point. One rule for
    load_recipe and for report/expected.py, which needs the name, results root and tables without
    expanding the runs (that imports the plugins, hence torch)."""
    raw = load_yaml(path)
    run_overrides, axes = [], {}
    for text in overrides:
        key, value = parse_override(text)
        where = f"{path}: override {short_repr(text, 80)}"
        if key.startswith("grid."):
            axes[key[len("grid."):]] = set_grid_axis(raw, key[len("grid."):], value, where)
        elif key.split(".")[0] in RUN_SECTIONS:
            run_overrides.append(RunOverride(key, value, text))
        else:
            set_dotted(raw, key, value, where)
    for ov in run_overrides:
        clash = next((a for a in axes if ov.key == a or ov.key.startswith(a + ".") or a.startswith(ov.key + ".")), None)
        if clash is not None:
            raise ConfigError(f"{path}: override {short_repr(ov.text, 80)}: the command line also sets the grid axis "
                              f"'{clash}'; give one of the two (an axis of one value is the same as the override)")
    split_table_rows(raw, {a: v for a, v in axes.items() if v is not None}, str(path))
    return raw, run_overrides


def set_grid_axis(raw: dict, axis: str, values: Any, where: str) -> list | None:
    """``grid.<key>=[...]`` adds the axis to the recipe's grid (to each grid of a list of grids) or replaces
    its values; ``grid.<key>=null`` removes it. Returns the values (None: removed)."""
    check_grid_key(axis, where)
    if values is not None and (not isinstance(values, list) or not values):
        raise ConfigError(f"{where}: expected a non-empty list of values (e.g. grid.{axis}=[10,100]), or null to "
                          f"remove the axis; got {short_repr(values)}")
    grid = raw.get("grid")
    grids = grid if isinstance(grid, list) else [grid] if isinstance(grid, dict) else None
    if grid is not None and (grids is None or not all(isinstance(g, dict) for g in grids)):
        raise ConfigError(f"{where}: the recipe's grid is not a mapping of dotted keys to lists (or a list of such "
                          f"mappings); fix 'grid:' first")
    if values is None:
        if not grids or not any(axis in g for g in grids):
            axes = sorted({k for g in grids or [] for k in g})
            raise ConfigError(f"{where}: the recipe's grid has no axis '{axis}' to remove (its axes: "
                              f"{', '.join(axes) or 'none'})")
        for g in grids:
            g.pop(axis, None)
        return None
    if grids is None:  # no grid yet: this axis is the grid
        raw["grid"] = {}
        grids = [raw["grid"]]
    for g in grids:
        g[axis] = copy.deepcopy(values)
    return values


def split_table_rows(raw: dict, axes: dict[str, list], where: str) -> None:
    """A grid axis set from the command line splits each explicit row of the recipe's declared tables that
    does not name it: one row per value, labelled 'LA (imb_factor=10)', its ``versus`` following suit. Without
    this a row such as {method.name: la} would match one configuration per value and the table (and the
    launch) would be refused. A table that already shows the key (pivot, group_by, where) is left alone, as
    are rows of a malformed table (the table check reports those) and axes whose values are mappings."""
    tables = raw.get("tables")
    if not isinstance(tables, dict):
        return
    for axis, values in axes.items():
        if len(values) < 2 or not all(v is None or isinstance(v, (str, int, float, bool)) for v in values):
            continue
        for table in tables.values():
            rows = table.get("rows") if isinstance(table, dict) else None
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows) or _shows_key(table, axis):
                continue
            table["rows"] = _split_rows(rows, axis, values)


def _shows_key(table: dict, axis: str) -> bool:
    """Whether a table already separates the values of ``axis`` (column groups, row groups, a filter)."""
    pivot = table.get("pivot") if isinstance(table.get("pivot"), list) else []
    filters = table.get("where") if isinstance(table.get("where"), dict) else {}
    return axis in pivot or table.get("group_by") == axis or any(_related(axis, k) for k in filters)


def _related(axis: str, key: Any) -> bool:
    return isinstance(key, str) and (key == axis or key.startswith(axis + ".") or axis.startswith(key + "."))


def _split_rows(rows: list[dict], axis: str, values: list) -> list[dict]:
    """One row per value of ``axis`` for each row that does not name it, each value's rows one row group
    ('imb_factor=10', inside the row's own group when it has one), so best, second best and ≈ compare rows of one
    value only; ``versus`` of any row that has one value of the axis points at the split row of that value."""
    leaf = axis.rsplit(".", 1)[-1]
    split, kept, by_value = set(), [], {value_text(v): [] for v in values}  # by_value: (row, label suffix)
    for i, row in enumerate(rows):
        selector = row.get("where") if isinstance(row.get("where"), dict) else {}
        if any(_related(axis, k) for k in selector):
            named = value_text(selector[axis]) if axis in selector else None
            (by_value[named] if named in by_value else kept).append((row, f" ({leaf}={named})" if named else None))
            continue
        label = row.get("label") if isinstance(row.get("label"), str) else f"row {i + 1}"
        split.add(label)
        for value in values:
            suffix = f" ({leaf}={value_text(value)})"
            by_value[value_text(value)].append(({**row, "label": label + suffix, "where": {**selector, axis: value}}, suffix))
    out = list(kept)
    for text, pairs in by_value.items():
        for row, suffix in pairs:
            own = row.get("group") if isinstance(row.get("group"), str) else None
            out.append(({**row, "group": f"{own} · {leaf}={text}" if own else f"{leaf}={text}"}, suffix))
    for row, suffix in out:
        versus = row.get("versus")
        if suffix is not None and isinstance(versus, (str, list)):
            named = [versus] if isinstance(versus, str) else versus
            named = [v + suffix if isinstance(v, str) and v in split else v for v in named]
            row["versus"] = named[0] if isinstance(versus, str) else named
    return [row for row, _ in out]


def recipe_name(path: Path, declared: str | None) -> str:
    """The recipe's ``name:``, else its file name's stem, which must then be a plain name as well. Either must not
    be a folder name ltbench gives its own folders in a results root (status and table skip those)."""
    name = declared or path.stem
    if not declared:
        try:
            check_plain_name(name, "name")
        except ValueError as exc:
            raise ConfigError(f"{exc} (taken from the file name; set 'name:' in the recipe)") from None
    if name in (*store.OWNED_DIRS, store.POSTHOC_DIR) or name.startswith("_"):
        source = "name" if declared else "name (taken from the file name)"
        raise ConfigError(f"{source}: {name!r} is a folder name ltbench keeps for its own files in a results folder "
                          f"(report, posthoc, names starting with '_'); choose another, e.g. {name.strip('_')}_lt")
    return name


def results_root(configured: str | Path, results_dir: str | Path | None) -> Path:
    """The results root, absolute: ``--results`` when given, else the recipe's ``results_dir``. The one rule
    for every command: a relative one is taken from the working directory (outputs go where the command
    runs, as with Hydra or make), while what a recipe reads (``plugins:``, a table's ``include:``) is taken
    from the recipe's folder. A command that finds no results folder says so (``no_results_message``)."""
    out_dir = Path(results_dir if results_dir is not None else configured)
    if not out_dir.is_absolute():
        out_dir = Path.cwd() / out_dir
    return out_dir.resolve()


def _given_results_dir(raw: dict, results_dir: str | Path | None) -> tuple[str, str]:
    """(the results folder as given, the words naming where it was given) of a recipe and its --results."""
    configured = raw.get("results_dir") if isinstance(raw.get("results_dir"), str) else RecipeConfig.results_dir
    if results_dir is not None:
        return str(results_dir), f"--results {results_dir}"
    return configured, f"results_dir '{configured}'"


def results_elsewhere(recipe_path: Path, raw: dict, root: Path, results_dir: str | Path | None) -> Path | None:
    """A folder of this recipe's results under the same relative results folder, taken from the recipe's
    folder or one above it (the usual case of a command run from another directory than the launch)."""
    given, _ = _given_results_dir(raw, results_dir)
    if Path(given).is_absolute():
        return None
    folder = Path(recipe_path).resolve().parent
    found = [base / given / root.name for base in [folder, *folder.parents][:8]]
    return next((f for f in found if f.is_dir() and f.resolve() != Path(root).resolve()), None)


def no_results_message(recipe_path: Path, raw: dict, root: Path, results_dir: str | Path | None) -> str:
    """Where a command looked for a recipe's results and found no folder, instead of calling every run
    pending: the rule it applied, and a folder of this recipe's results found beside the recipe or above it."""
    given, rule = _given_results_dir(raw, results_dir)
    text = f"{recipe_path}: no results folder {root}"
    if not Path(given).is_absolute():
        text += f" ({rule} is taken from the working directory, {Path.cwd()})"
    found = results_elsewhere(recipe_path, raw, root, results_dir)
    if found is not None:
        return text + f"; found {found}: run the command from {found.parent.parent} or add --results {found.parent}"
    return text + "; no run of this recipe was launched with this results folder ('ltbench run RECIPE' launches " \
                  "them; --results DIR names where they are)"


@dataclass(frozen=True)
class RunOverride:
    key: str  # dotted, under one of RUN_SECTIONS
    value: Any
    text: str  # as typed, for messages


PLUGIN_SECTIONS = ("data", "backbone", "method")  # options depend on the plugin a run names


def apply_run_overrides(cfg: dict, overrides: list[RunOverride], used: set[str]) -> None:
    """Set each override in one grid point's configuration (in place), after the grid. An option of a
    plugin section is set only where the run's plugin has it (method.tau: on la, not on ce); ``used``
    collects the overrides that applied, so one that fits no run is refused instead of ignored."""
    for ov in overrides:
        section = ov.key.split(".")[0]
        if section in PLUGIN_SECTIONS and "." in ov.key:
            trial = copy.deepcopy(cfg)
            set_dotted(trial, ov.key, ov.value, f"override {short_repr(ov.text, 80)}")
            try:
                resolve_run_config(trial, 0, "")
            except ConfigError as exc:
                if _is_unknown_key(str(exc), ov.key):
                    continue  # this run's plugin has no such option
            cfg.clear()
            cfg.update(trial)
        else:
            set_dotted(cfg, ov.key, ov.value, f"override {short_repr(ov.text, 80)}")
        used.add(ov.text)


def _is_unknown_key(message: str, key: str) -> bool:
    parts = key.split(".")
    return any(message.startswith(f"{'.'.join(parts[:i])}: unknown key") for i in range(2, len(parts) + 1))


def check_overrides_used(overrides: list[RunOverride], used: set[str], runs: list[RunSpec]) -> None:
    """An override that no run has is an error naming it and the runs' plugins (never silently ignored)."""
    for ov in overrides:
        if ov.text not in used:
            section = ov.key.split(".")[0]
            names = sorted({r.config[section]["name"] for r in runs})
            options = sorted({k for r in runs for k in r.config[section]})
            close = difflib.get_close_matches(ov.key.split(".", 1)[-1], options, n=1, cutoff=0.8)
            hint = f"; did you mean '{section}.{close[0]}'? " if close else "; "
            raise ConfigError(f"override {short_repr(ov.text, 80)}: no run of this recipe has '{ov.key}' (its "
                              f"{section} plugins: {', '.join(names)}){hint}'ltbench list {_LIST_KIND[section]}' "
                              f"and the plugin's Config say which options each has")


_LIST_KIND = {"data": "datasets", "backbone": "backbones", "method": "methods"}


def data_identity(data: dict, cache: dict) -> str | None:
    """What identifies a run's data beyond its options, from the dataset plugin (None: its options do,
    as for the built-in datasets, whose files are fixed and checksummed). Asked once per data config."""
    key = identity.canonical_json(data)
    if key not in cache:
        cls, label = DATASETS.get(data["name"]), DATASETS.label(data["name"])
        ask = getattr(cls, "data_identity", None)
        named = None
        if callable(ask):  # plugin code: contained (registry.call_plugin), its answer checked
            builder = registry.call_plugin(label, "its constructor", DATASETS.build, data, where="data")
            named = registry.call_plugin(label, "data_identity()", ask, builder)
        if named is not None:
            named = registry.checked_return(label, "data_identity()", named, str, MAX_DATA_IDENTITY,
                                            "a short string such as a digest, or None")
        cache[key] = named
    return cache[key]


def backbone_identity(backbone: dict, cache: dict) -> str | None:
    """What identifies a backbone beyond its options (the Backbone hook ``weights_identity(config)``: the sha256
    of the weights file it loads, 'sha256:...'), None for backbones built from scratch; a missing file is the
    backbone's one-line error (exit 2), so --dry-run checks it too."""
    key = "backbone:" + identity.canonical_json(backbone)
    if key not in cache:
        ask = getattr(BACKBONES.get(backbone["name"]), "weights_identity", None)
        cache[key] = ask(BACKBONES.config(backbone, "backbone")) if callable(ask) else None
    return cache[key]


MAX_DATA_IDENTITY = 1000  # characters: a digest is 16; a record must stay far below the result.json read limit


def _run_config(cfg: dict, seed: int, identities: dict) -> dict:
    """One run's resolved configuration, with its ``data_identity`` when its dataset names its data and its
    ``backbone_identity`` when its backbone loads a weights file."""
    config = resolve_run_config(cfg, seed, "")
    named = data_identity(config["data"], identities)
    if named is not None:
        config[identity.DATA_IDENTITY] = named
    weights = backbone_identity(config["backbone"], identities)
    if weights is not None:
        config[identity.BACKBONE_IDENTITY] = weights
    return config


def _expand(path: Path, raw: dict, top: RecipeConfig, results_dir, run_overrides: list[RunOverride] = (),
            where: dict | None = None) -> Recipe:
    name = recipe_name(path, top.name)
    tables = parse_tables(top.tables, "tables")  # checked before any run, like every other field
    plugins = [str((path.parent / p).resolve()) if not Path(p).is_absolute() else p for p in top.plugins]
    launcher = from_dict(LauncherConfig, top.launcher, "launcher")
    out_dir = results_root(top.results_dir, results_dir)
    points = _grid_points(top.grid, "")
    found = parse_search(top.search)
    check_tuning_seeds(found, top.seeds)
    per_point = found.config.trials * len(found.config.seeds) + len(top.seeds) if found else len(top.seeds)
    if len(points) * per_point > MAX_RUNS:
        raise ConfigError(f"grid x {'(search.trials x search.seeds + seeds)' if found else 'seeds'}: {len(points)} x "
                          f"{per_point} runs; at most {MAX_RUNS} per recipe (split it into several recipes)")
    declared = _declared({k: raw.get(k, {}) for k in RUN_SECTIONS}, points, run_overrides) if where else []
    seeds_of = _seeds_where(declared, points, top.seeds, where, found)  # before any plugin (torch)
    try:
        registry.add_plugin_paths(plugins)
    except RegistryError as exc:  # a bad $LTBENCH_PLUGIN_PATH folder is not the recipe's plugins: fault
        raise ConfigError(str(exc) if isinstance(exc, registry.EnvPluginError) else f"plugins: {exc}") from None
    base = {k: raw.get(k, {}) for k in RUN_SECTIONS}
    runs, seen, used, identities, studies, probes = [], set(), set(), {}, [], []
    asks = found is not None and SAMPLERS[found.config.sampler].asks
    idle, acting = {}, set()  # options given that cannot act in a run (key: why), and those that act in one
    def point_cfg(point: dict) -> dict:
        cfg = copy.deepcopy(base)
        for key, value in point.items():
            set_dotted(cfg, key, value, f"grid.{key}")
        apply_run_overrides(cfg, list(run_overrides), used)
        return cfg

    if found and found.config.budget == "per_dim":  # every method the same draws per axis as the smallest space
        found.smallest = min(len(point_space(found, point_cfg(p), p, [ov.key for ov in run_overrides], "search"))
                             for p in points) or None
    for point, seeds in zip(points, seeds_of):
        if not seeds:
            continue
        cfg = point_cfg(point)
        if asks:
            space = point_space(found, cfg, point, [ov.key for ov in run_overrides], "search")
            study, checked = _study(found, cfg, point, space, identities, name, out_dir)
            studies.append(study)
            probes += checked
            for probe in checked:
                _note_idle_options(cfg, probe.config, idle, acting)
            continue
        drawn = []  # (configuration, its runs on the tuning seeds) per draw; the point alone without a search
        for trial_cfg, trial in trial_configs(found, cfg, point, [ov.key for ov in run_overrides]):
            drawn.append((trial_cfg, []))
            for seed in found.config.seeds if found else seeds:
                config = _blamed(run_overrides, _trial_config, trial_cfg, seed, identities, trial)
                _note_idle_options(trial_cfg, config, idle, acting)
                drawn[-1][1].append(_add_run(runs, seen, _spec(name, out_dir, config, point, trial)))
        if found:
            _add_report_runs(runs, seen, name, out_dir, point, identities, top.seeds, drawn)
    check_overrides_used(list(run_overrides), used, runs + probes)
    if where:  # the full configurations decide (a key only a plugin's default sets); refused if none is kept
        left_out = [{**c, "seed": s} for c, seeds in zip(declared, seeds_of) for s in top.seeds if s not in seeds]
        runs = [r for r, kept in zip(runs, select_where([r.config for r in runs] + left_out, where)) if kept]
    refuse_idle_options(idle, acting)
    if found:
        check_space_used(found, [spec.config["method"]["name"] for spec in runs + probes], "search")
    posthoc = expand_posthoc(top.posthoc, "posthoc")
    if posthoc and any(spec.config["eval"]["select"] == "best_val" for spec in runs):
        raise ConfigError("posthoc: stage 2 fits each run's final checkpoint, but eval.select: best_val reports an "
                          "earlier epoch's model, so 'ltbench posthoc' could fit none of these runs; set eval.select: "
                          "last in a recipe with a posthoc: grid (docs/posthoc.md)")
    # Whether each declared table can be built from these runs is checked by the caller
    # (report.expected.check_recipe_tables, called by the CLI): the recipe never imports report.
    recipe = Recipe(name, path, raw, runs, launcher, out_dir, plugins, tables, posthoc,
                    [ov.key for ov in run_overrides], search=plan_lines(found, top.seeds), studies=studies, probes=probes,
                    found=found, identities=identities, seeds=list(top.seeds))
    if asks:
        recipe.runs = asked_runs(recipe)
    return recipe


def _declared(base: dict, points: list[dict], run_overrides: list[RunOverride]) -> list[dict]:
    """Each grid point's configuration as the recipe and the command line write it, before any plugin fills in
    its defaults or checks it: what --where can decide on without the plugins (torch)."""
    out = []
    for point in points:
        cfg = copy.deepcopy(base)
        for key, value in [*point.items(), *((ov.key, ov.value) for ov in run_overrides)]:
            set_dotted(cfg, key, value, f"grid.{key}")
        out.append(cfg)
    return out


def _seeds_where(declared: list[dict], points: list[dict], seeds: list, where: dict | None, found) -> list[list]:
    """The seeds of each grid point that --where may keep, decided on the declared configurations: what it
    leaves out is never validated, so it cannot block a launch (a key only a default sets: decided later)."""
    if not where:
        return [list(seeds)] * len(points)
    if found is not None and SAMPLERS[found.config.sampler].asks:
        raise ConfigError(f"--where does not apply to a {found.config.sampler} search (its workers share every "
                          f"study); narrow the grid with an override instead (grid.<key>=[...])")
    out = [[s for s in seeds if matches({**cfg, "seed": s}, where, absent=None) is not False] for cfg in declared]
    if not any(out):
        select_where([{**cfg, "seed": s} for cfg in declared for s in seeds], where)  # raises, naming the values
    return out


def _add_run(runs: list, seen: set, spec: RunSpec) -> RunSpec:
    """Append ``spec`` unless a run of the same id is already listed; returns it."""
    if spec.run_id not in seen:
        seen.add(spec.run_id)
        runs.append(spec)
    return spec


def _add_report_runs(runs: list, seen: set, name: str, out_dir: Path, point: dict, identities: dict,
                     seeds: list[int], drawn: list[tuple[dict | None, list | None]]) -> None:
    """Stage 2 of a search: once every draw's runs on the tuning seeds have ended, the chosen configuration
    (search.choose) on each report seed, as a plain run with no trial record: its run id is the one a fixed
    recipe with those values gives, so a run made without a search is reused, never trained twice."""
    k = finished_choice([specs for _, specs in drawn])
    if k is None:
        return
    for seed in seeds:
        _add_run(runs, seen, _spec(name, out_dir, _run_config(drawn[k][0], seed, identities), point, None))


def _spec(name: str, out_dir: Path, config: dict, point: dict, trial: dict | None) -> RunSpec:
    """The run spec of one resolved configuration: its id the hash of the configuration."""
    try:
        run_id = identity.run_id(config)
    except ValueError as exc:  # NaN or infinity inside a free-form (Any) plugin option
        raise ConfigError(f"grid point {short_repr(point)}: the configuration cannot be hashed ({exc}); "
                          f"remove NaN and infinite values") from None
    return RunSpec(recipe=name, run_id=run_id, config=config, grid=point if trial is None else {**point, "search": trial},
                   plugins=registry.plugin_paths(), run_dir=str(inside_results(out_dir, name, run_id)))


def _study(found, cfg: dict, point: dict, space: dict, identities: dict, name: str,
           out_dir: Path) -> tuple[Study, list[RunSpec]]:
    """One study of a search whose sampler asks (a grid point over its tuning seeds) and its probes: the configurations at
    the low and high ends of its space, validated as a random draw would be (their specs are checked, never run)."""
    seed = found.config.seeds[0]
    probes = [_spec(name, out_dir, _trial_config(with_values(cfg, values), seed, identities,
                                                 trial_record(found, 0, space)), point, trial_record(found, 0, space))
              for values in probe_values(space)]
    if found.config.prune and not validation_curve(probes[0].config):
        raise ConfigError(f"search.prune: true stops a trial on its validation curve, and the runs of method "
                          f"'{cfg['method']['name']}' validate only at the end; set train.eval_every: 1 (validation "
                          f"after each epoch; below optim.epochs) or eval.select: best_val, or remove prune")
    fixed = copy.deepcopy(probes[0].config)
    for key in space:
        node = fixed
        for part in key.split(".")[:-1]:
            node = node.get(part, {})
        node.pop(key.rsplit(".", 1)[1], None)
    method = cfg["method"]["name"]
    c = found.config
    study = identity.study_id(method, identity.run_id(fixed), c.seed, c.seeds, space_text(space), c.prune)
    return Study(study, method, cfg, point, space), probes


def validation_curve(config: dict) -> bool:
    """Whether a run validates before its end: after every epoch under eval.select best_val, every
    train.eval_every epochs otherwise (engine.epoch_record logs the validation headline then)."""
    every, epochs = config["train"]["eval_every"], config["optim"]["epochs"]
    return (config["eval"]["select"] == "best_val" and epochs > 1) or 0 < every < epochs


def asked_trial_spec(recipe: Recipe, study: Study, number: int, values: dict, seed: int) -> RunSpec:
    """The run of trial ``number`` of a study on tuning seed ``seed``, with its drawn ``values``: an
    ordinary run, its id the hash of its resolved configuration; its trial record in ``grid['search']``. A
    value a plugin refuses is a ConfigError naming the trial."""
    record = trial_record(recipe.found, number, study.space)
    config = _trial_config(with_values(study.cfg, values), seed, recipe.identities, record)
    return _spec(recipe.name, recipe.results_dir, config, study.point, record)


def asked_runs(recipe: Recipe) -> list[RunSpec]:
    """The runs of the trials an asking sampler's state holds so far (none before its first launch), each on
    every tuning seed; and, once a study has told all its trials, its report runs (stage 2)."""
    c = recipe.found.config
    hooks = SAMPLERS[c.sampler].module("hooks")
    recorded = hooks.recorded_trials(recipe.root, recipe.studies, c.trials)
    runs, seen = [], set()
    for study in recipe.studies:
        drawn, told = [], sorted(recorded.get(study.name, []), key=lambda t: t[0])
        for number, state, values in told:
            if values is None:
                drawn.append((None, None))
                continue
            try:
                specs = [_add_run(runs, seen, asked_trial_spec(recipe, study, number, values, seed)) for seed in c.seeds]
            except ConfigError as exc:
                if state == "FAIL":  # a draw its plugin refused: told FAIL, never run
                    drawn.append((None, None))
                    continue
                raise hooks.damaged(recipe.root, f"trial {number} of study {study.name}: {exc}") from None
            drawn.append((with_values(study.cfg, values), specs))
        if len(told) == c.trials and all(state != "RUNNING" for _, state, _ in told):  # every trial told
            _add_report_runs(runs, seen, recipe.name, recipe.results_dir, study.point, recipe.identities,
                             recipe.seeds, drawn)
    return runs


def _blamed(run_overrides: list[RunOverride], check, *args):
    """``check(*args)``, its refusal naming the command-line overrides it quotes (optim.epochs=2 makes
    LDAM-DRW's drw_epoch 24 too late): the fix is on the command line, not in the recipe file."""
    try:
        return check(*args)
    except ConfigError as exc:
        given = [ov.text for ov in run_overrides if re.search(rf"\b{re.escape(ov.key.rsplit('.', 1)[-1])}\b", str(exc))]
        if not given:
            raise
        raise ConfigError(f"override {short_repr(' '.join(given), 80)}: {exc}") from None


def _trial_config(cfg: dict, seed: int, identities: dict, trial: dict | None) -> dict:
    """``_run_config`` of one trial: its errors name the trial (a draw a plugin refuses), and a search, which
    selects on validation, needs a validation split."""
    if trial is None:
        return _run_config(cfg, seed, identities)
    where = f"search: trial {trial['trial']} of method {cfg['method']['name']}"
    try:
        config = _run_config(cfg, seed, identities)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not declares_validation(config["data"]):
        raise ConfigError(f"search: the trials are selected on the validation split, and data "
                          f"'{config['data']['name']}' has none; set data.val_per_class (e.g. 20) or data.val_split "
                          f"(e.g. val for ImageNet-LT); docs/tuning.md")
    return config


def expand_posthoc(entries: Any, where: str) -> list[dict]:
    """The recipe's ``posthoc:`` grid, resolved and validated like a method config (ltbench/posthoc.py)."""
    if entries is None:
        return []
    from ltbench.posthoc import expand_posthoc as expand  # lazy: keeps table and status free of torch

    return expand(entries, where)


def inside_results(out_dir: Path, *parts: str) -> Path:
    """out_dir/parts, refused when it would resolve outside out_dir (a '..' or a symlink out)."""
    target = out_dir.joinpath(*parts)
    resolved = target.resolve()
    if not resolved.is_relative_to(out_dir) or resolved == out_dir:
        raise ConfigError(f"run directory {short_repr(str(target))} resolves to {short_repr(str(resolved))}, outside "
                          f"the results root {out_dir}; use a plain recipe name and no symlink out of the root")
    return target


def run_label(run: RunSpec) -> str:
    """Short human label of a run spec: the method name plus the method options the grid varies,
    with the values the run has (a command-line override wins over the grid), a mapping rendered as
    name[key=value,...]."""
    grid = run.grid or {}
    method = run.config["method"]
    keys = [k.split(".", 1)[1] for k in grid if k.startswith("method.") and k != "method.name"]
    if isinstance(grid.get("method"), dict):
        keys += [k for k in grid["method"] if k != "name"]
    extras = []
    for key in keys:
        value = method
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        extras.append(f"{key}={_short(value)}")
    sampler = run.config["sampler"]
    if sampler["name"] != DEFAULT_SAMPLER:
        extras.append(f"sampler={_short(sampler)}")
    trial = grid.get("search")
    if isinstance(trial, dict):  # 'trial 3/8 (optim.lr=0.05, method.tau=1.2)': which draw, and what it drew
        drawn = ", ".join(f"{k}={_short(_dotted(run.config, k))}" for k in trial.get("space") or [])
        extras.append(f"trial {trial.get('trial', 0) + 1}/{trial.get('trials')} ({drawn})")
    return method["name"] + (f" ({', '.join(extras)})" if extras else "")


def _dotted(config: dict, key: str) -> Any:
    for part in key.split("."):
        config = config.get(part) if isinstance(config, dict) else None
    return config


def _short(v: Any) -> str:
    if isinstance(v, dict):
        rest = ",".join(f"{k}={_short(x)}" for k, x in v.items() if k != "name")
        return f"{v.get('name', '?')}[{rest}]" if rest else str(v.get("name", v))
    return value_text(v)


def distinct_data(runs: list[RunSpec]) -> list[RunSpec]:
    """One run spec per distinct data configuration (to check or describe each dataset once)."""
    seen, out = set(), []
    for spec in runs:
        key = identity.canonical_json(spec.config["data"])
        if key not in seen:
            seen.add(key)
            out.append(spec)
    return out
