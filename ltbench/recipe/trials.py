"""A recipe's ``search:`` section (``trials``, ``seed``, an optional ``space`` of overrides; docs/tuning.md):
every grid point becomes ``trials`` configurations drawn at random, known before anything runs, so a Slurm
array runs them and a rerun skips the finished ones. Each trial is an ordinary run: which trial of which
search it is goes into its ``grid['search']``, never into its id. A grid point's space is the core's
(``search.CORE_SPACE``), its method's ``search_space`` and the recipe's ``space``; a ``method.*`` key must fit
at least one method. A sampler that asks (``search.SAMPLERS``) draws each trial when it starts: the recipe
lists the trials its state already holds (``Study``: one per grid point).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ltbench import registry, search
from ltbench.config import check_range, from_dict, join_path
from ltbench.errors import ConfigError, short_repr
from ltbench.results import store


@dataclass
class SearchConfig:
    trials: int = 0
    seed: int = 0
    # Stage 1 runs every draw on these seeds and chooses on them; stage 2 runs the choice on the recipe's
    # seeds, which must not be among them (docs/tuning.md: fresh seeds carry no selection bonus).
    seeds: list[int] = field(default_factory=lambda: [1000, 1001])
    sampler: str = "random"
    space: dict[str, Any] = field(default_factory=dict)
    # equal: every method gets ``trials`` draws; per_dim: a method with a d-option space gets trials ** (d / d0)
    # (d0: the grid's smallest space), so every method gets the same draws per axis (search.draws_per_axis)
    budget: str = "equal"
    prune: bool = False  # a sampler that prunes: stop a trial whose validation curve falls below the median of earlier trials

    def validate(self) -> None:
        check_range("trials", self.trials, 1, search.MAX_TRIALS, unit=" (the number of configurations per method)")
        check_range("seed", self.seed, 0, 2**32 - 1)
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: expected a non-empty list of distinct tuning seeds, e.g. [1000, 1001], got "
                             f"{short_repr(self.seeds, 60)}")
        for seed in self.seeds:
            check_range("seeds[...]", seed, 0, 2**32 - 1)
        if self.sampler not in search.SAMPLERS:
            raise ValueError(f"sampler: expected {', '.join(search.SAMPLERS)}, got {short_repr(self.sampler, 40)}")
        if self.budget not in ("equal", "per_dim"):
            raise ValueError(f"budget: expected equal or per_dim, got {short_repr(self.budget, 40)}")
        sampler = search.SAMPLERS[self.sampler]
        if self.prune and not sampler.prunes:
            pruners = ", ".join(s.name for s in search.SAMPLERS.values() if s.prunes)
            raise ValueError(f"prune: true stops trials that fall behind on the validation curve of the trials before "
                             f"them, which needs a sampler that asks trial by trial ({pruners}); {self.sampler} "
                             f"draws every trial in advance; remove prune or set sampler: {pruners}")
        if self.budget == "per_dim" and sampler.asks:
            raise ValueError(f"budget: per_dim scales each method's draws before any run, and {self.sampler} asks one "
                             f"study per method trial by trial with one budget; use budget: equal with it, or a "
                             f"sampler that draws in advance ({', '.join(s.name for s in search.SAMPLERS.values() if not s.asks)})")
        if sampler.hooks:
            sampler.module("hooks").check(f"sampler: {self.sampler}")


@dataclass
class Study:
    """One grid point of a search whose sampler asks (search.SearchSampler.asks): ``trials`` trials asked from
    it, each run on every tuning seed."""

    name: str  # the study's name in the sampler's state (identity.study_id)
    method: str
    cfg: dict  # the grid point's configuration (grid and overrides set), without the drawn values
    point: dict  # the grid point, recorded in each run's spec as its grid
    space: dict  # dotted key -> search.Distribution


@dataclass
class Search:
    config: SearchConfig
    space: dict  # the recipe's overrides: dotted key -> Distribution or None (removed)
    used: set = field(default_factory=set)  # recipe keys that applied to some grid point
    spaces: dict = field(default_factory=dict)  # method name -> its resolved space (for --dry-run)
    trials: dict = field(default_factory=dict)  # method name -> its draws (budget: per_dim scales them)
    smallest: int | None = None  # budget per_dim: the smallest space's dimension over the grid (set before drawing)


def parse_search(raw: Any, where: str = "search") -> Search | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or "trials" not in raw:
        raise ConfigError(f"{where}: expected a mapping with 'trials' (e.g. {{trials: 16, seed: 0}}), got "
                          f"{short_repr(raw, 60)}")
    config = from_dict(SearchConfig, raw, where)
    space = search.parse_space(config.space, join_path(where, "space"))
    for key in space:
        search.check_core_key(key, join_path(where, "space"))
    return Search(config, space)


def point_space(found: Search, cfg: dict, point: dict, override_keys: list[str], where: str) -> dict:
    """The space of one grid point (its method's): core, declared, then the recipe's; checked against what
    the grid point and the command line set, since a drawn key they also set would be silently overwritten."""
    name = cfg.get("method", {}).get("name") if isinstance(cfg.get("method"), dict) else None
    cls = registry.METHODS.get(name)
    space = {**search.parse_space(search.CORE_SPACE, "search.CORE_SPACE"), **search.method_space(cls, name)}
    search.check_space_options(search.method_space(cls, name), cls.Config, name, f"method '{name}': search_space")
    options = search.config_fields(cls.Config)
    for key, dist in found.space.items():
        if key.startswith("method.") and key.split(".")[1] not in options:
            continue  # another method's option (refused when no method has it: check_space_used)
        found.used.add(key)
        if dist is None:
            space.pop(key, None)
        else:
            space[key] = dist
    set_by = [(f"{k}.{sub}" if isinstance(v, dict) else k, "the grid") for k, v in point.items()
              for sub in (v if isinstance(v, dict) else [None])]
    for key in space:
        for setter, what in set_by + [(k, "the command line") for k in override_keys]:
            if setter == key or key.startswith(setter + ".") or setter.startswith(key + "."):
                raise ConfigError(f"{join_path(where, 'space')}: {what} sets '{setter}', which the search draws for "
                                  f"method '{name}'; give it in one place (search.space: {{{key}: null}} keeps "
                                  f"{what}'s value)")
    if not space and found.config.trials > 1:
        raise ConfigError(f"{join_path(where, 'space')}: nothing is left to search for method '{name}' (every option "
                          f"is set to null or by the grid), so its {found.config.trials} trials would be one run; "
                          f"give options to search, or search.trials: 1")
    found.spaces[name] = space
    return space


def check_tuning_seeds(found: Search | None, report_seeds: list[int], where: str = "search") -> None:
    """The report seeds never take part in the choice: a seed in both lists is refused."""
    shared = sorted(set(found.config.seeds) & set(report_seeds)) if found else []
    if shared:
        raise ConfigError(f"{where}.seeds: seed(s) {', '.join(map(str, shared))} are also report seeds (seeds:); the "
                          f"configuration is chosen on the tuning seeds and reported on fresh ones, so give seeds that "
                          f"are not in seeds: (e.g. search.seeds: [1000, 1001])")


def validation_all(result: dict | None) -> float | None:
    """A done result's validation All (a finite number), else None."""
    if not result or result.get("status") != "done":
        return None
    value = ((result.get("metrics") or {}).get("val") or {}).get("all")
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def finished_choice(trials: list[list | None]) -> int | None:
    """Stage 1's choice once it has ended: ``trials`` holds, per draw, its runs on the tuning seeds (None: a
    draw that ended without a run, e.g. refused by its plugin). Each run's result is read from its folder (data:
    store.read_result); None while any run has no result yet, or when no draw has validation on every seed."""
    vals = []
    for specs in trials:
        results = [store.read_result(Path(spec.run_dir)) for spec in specs or []]
        if any(r is None for r in results):
            return None
        vals.append([validation_all(r) for r in results] if specs else [None])
    return search.choose(vals)


def search_signature(raw: dict, root: Path) -> str:
    """What a search's runs depend on besides its recipe: its trials' results (its report runs exist once they
    have ended) and a sampler's state file: the name, size and mtime of each file of the
    results folder and of each run folder's result.json, for the expansion caches' signature ('' without a
    search). One stat per run: a cache that waits for results must not miss them."""
    if not isinstance(raw.get("search"), dict):
        return ""
    seen = []
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return "no results yet"
    for entry in entries:
        path = Path(entry.path) / "result.json" if entry.is_dir(follow_symlinks=False) else Path(entry.path)
        try:
            info = path.lstat()
        except OSError:
            continue
        seen.append([str(path.relative_to(root)), info.st_size, info.st_mtime_ns])
    return hashlib.sha1(json.dumps(seen).encode()).hexdigest()


def check_space_used(found: Search, methods: list[str], where: str) -> None:
    for key in found.space:
        if key not in found.used:
            raise ConfigError(f"{join_path(where, 'space')}.{key}: no method of this recipe has the option "
                              f"'{key.split('.', 1)[1]}' (its methods: {', '.join(sorted(set(methods)))}); search "
                              f"only options a method has ('ltbench list methods --options')")


def trial_configs(found: Search | None, cfg: dict, point: dict, override_keys: list[str],
                  where: str = "search") -> list[tuple[dict, dict | None]]:
    """(configuration, its trial record or None) for each trial of one grid point; the point alone without
    a search."""
    if found is None:
        return [(cfg, None)]
    space = point_space(found, cfg, point, override_keys, where)
    c, method = found.config, cfg["method"]["name"]
    found.trials[method] = trials = draws_for(found, len(space))
    return [(with_values(cfg, values), trial_record(found, k, space, trials))
            for k, values in enumerate(search.draw_trials(space, c.seed, method, trials))]


def draws_for(found: Search, dimension: int) -> int:
    """A method's draws: ``trials``, or under budget per_dim trials ** (d / d0), at most search.MAX_TRIALS."""
    c = found.config
    if c.budget == "equal" or not found.smallest:
        return c.trials
    return min(search.MAX_TRIALS, max(1, round(c.trials ** (dimension / found.smallest))))


def with_values(cfg: dict, values: dict) -> dict:
    """A copy of a grid point's configuration with each drawn value set at its dotted key."""
    trial = copy.deepcopy(cfg)
    for key, value in values.items():
        node = trial
        for part in key.split(".")[:-1]:
            node = node.setdefault(part, {})
        node[key.rsplit(".", 1)[1]] = value
    return trial


def trial_record(found: Search, k: int, space: dict, trials: int | None = None) -> dict:
    """What a trial's run records of its search (``search.TRIAL_FIELDS``)."""
    c = found.config
    return {"trial": k, "trials": trials or c.trials, "seed": c.seed, "sampler": c.sampler, "space": sorted(space)}


def plan_lines(found: Search | None, report_seeds: list[int] = ()) -> list[str]:
    """What ``--dry-run`` says about the search before its runs: both stages, and each method's budget and space."""
    if found is None:
        return []
    c = found.config
    per = "draw(s) per method" if c.budget == "equal" else "draw(s) for the smallest space, scaled per dimension"
    head = (f"search: {c.trials} {per} x {len(c.seeds)} tuning seed(s) {list(c.seeds)}, {c.sampler} search, "
            f"seed {c.seed}; chosen on validation, reported on the recipe's seeds")
    lines = [head + (", pruning on the validation curve" if c.prune else ""),
             f"  stage 2: once a method's trial runs have ended, its chosen configuration on the {len(report_seeds)} "
             f"report seed(s) {list(report_seeds)} ({len(report_seeds) * len(found.spaces)} runs, listed below once chosen)"]
    if search.SAMPLERS[c.sampler].asks:
        lines.append("  each draw is asked from its study when the trial starts (it depends on the results before "
                     "it): the runs below are the trials its state holds so far")
    for name, space in found.spaces.items():
        n = found.trials.get(name, c.trials)
        lines.append(f"  {name}: {n} draws, d = {len(space)}, {search.draws_per_axis(n, len(space)):.2g} draws per "
                     f"axis: {search.space_text(space)}")
        if search.random_note(c.sampler, n):
            lines.append(f"    {search.random_note(c.sampler, n)}")
    return lines
