"""The stage-2 (post-hoc) interface: a classifier fitted on a finished run's frozen features.

Why a fourth plugin kind: the ablations the field asks for are mostly about the classifier (logit
adjustment's tau, tau-normalisation, classifier re-training, a Bayes classifier's prior and distribution
adjustment). A stage-2 method takes a finished run as it is (``FrozenRun``: its config, class counts,
the trained method rebuilt from checkpoint.pt, the cached clean-view features of ltbench/stage2/features.py)
and a seed, fits in closed form or in a few epochs on the cached features, and predicts class scores
under a target prior exactly the way ``Method.predict`` does, so shifted priors and shifted test sets
go through the same evaluation core (ltbench/evaluation.py). docs/posthoc.md describes each built-in.

A stage-2 method that needs more than the backbone features (e.g. the output of the run's projection
head) asks for a feature space by name: the run's method declares the spaces it exposes
(``Method.feature_spaces``), the feature cache holds them, and ``SplitInputs.space`` /
``FrozenRun.require_spaces`` (or the class's ``needs_spaces``) refuse a run whose method provides none
of that name with a ConfigError. The core never knows which method provides what.

Plugins register with ``@POSTHOC.register(name)`` (built-ins live in ``methods/posthoc_*.py``) and are
found by the same discovery as methods (core, entry points ``ltbench.posthoc``, plugin folders).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ltbench.config import EmptyConfig
from ltbench.errors import ConfigError, LtbenchError, short_repr
from ltbench.method import Method
from ltbench.registry import POSTHOC


class MissingFeatureSpace(ConfigError, AttributeError):
    """A stage-2 method asked for a feature space the run's method does not declare. A ConfigError (one
    line, exit 2) and an AttributeError (so ``getattr(inputs, name, None)`` and ``hasattr`` work)."""


@dataclass
class SplitInputs:
    """One cached split: backbone features (N, d), labels (N,), and every feature space the run's method
    declared (``Method.feature_spaces``), by name, each (N, p): ``inputs.space(name)``, or as an attribute
    (``inputs.<name>``), so a stage-2 method reads the space its training method exposes by the name that
    method gave it, and the core names none."""

    features: torch.Tensor
    labels: torch.Tensor
    spaces: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.labels)

    def space(self, name: str) -> torch.Tensor:
        """The feature space ``name``; MissingFeatureSpace (a ConfigError) when the run's method declares none of that name."""
        if name not in self.spaces:
            raise MissingFeatureSpace(
                f"feature space '{name}': the run's method does not provide it (it provides: "
                f"{', '.join(sorted(self.spaces)) or 'none'}); choose a stage-2 setting that does not need it, "
                f"or runs of a method that declares it (Method.feature_spaces)")
        return self.spaces[name]

    def __getattr__(self, name: str) -> torch.Tensor:
        """Only reached for a name that is no field: a declared feature space, else MissingFeatureSpace."""
        if name.startswith("_") or name in ("features", "labels", "spaces"):  # copy/pickle probes, fields not set yet
            raise AttributeError(name)
        return self.space(name)


@dataclass
class FrozenRun:
    """A finished run, frozen: what a stage-2 method may use. ``splits`` holds 'train', 'test' and
    'test_set:<name>'; a stage-2 method fits on 'train' only (never on a test split)."""

    run_id: str
    config: dict
    class_counts: torch.Tensor  # training images per class (int64)
    method: Method  # the trained method, rebuilt from the final checkpoint, in eval mode
    splits: dict[str, SplitInputs] = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.class_counts)

    @property
    def train(self) -> SplitInputs:
        return self.splits["train"]

    @property
    def train_prior(self) -> torch.Tensor:
        counts = self.class_counts.double()
        return (counts / counts.sum()).float()

    def require_spaces(self, names, who: str) -> None:
        """ConfigError naming ``who`` (the stage-2 method) unless the run's method provides every feature
        space in ``names``."""
        provided = set(self.train.spaces) if "train" in self.splits else set()
        missing = [n for n in names if n not in provided]
        if missing:
            raise ConfigError(f"posthoc '{who}' needs the feature space(s) {', '.join(missing)}, which run "
                              f"{self.run_id} (method '{self.config.get('method', {}).get('name', '?')}') does "
                              f"not provide (it provides: {', '.join(sorted(provided)) or 'none'})")


class PosthocMethod:
    """Base class of every stage-2 method: set ``Config``; implement ``fit`` and ``predict``.

    ``predict`` returns scores (N, K) for a split's inputs; like ``Method.predict``, scores for
    ``target_prior`` None or uniform are the balanced prediction, and a target prior p_t adds the Bayes
    term log(K p_t) (``target_shift``) to balanced scores.
    """

    Config: ClassVar[type] = EmptyConfig
    registered_name: ClassVar[str] = "?"
    # Feature spaces (``Method.feature_spaces``) every fit needs, by name: a run whose method provides
    # them not is refused before fitting. A need that depends on the run is checked in ``fit`` instead.
    needs_spaces: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg: Any, frozen: FrozenRun, seed: int):
        self.cfg, self.frozen, self.seed = cfg, frozen, int(seed)
        self.num_classes = frozen.num_classes

    def fit(self) -> None:
        """Fit on ``self.frozen.train`` (closed form or a few epochs); the default has nothing to fit."""

    def predict(self, inputs: SplitInputs, *, target_prior: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def target_shift(self, target_prior: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        """log(K p_t), zero for None or uniform: the one rule of ``Method.target_shift``, reused."""
        return Method.target_shift(self, target_prior, like)

    def result_extras(self) -> dict:
        """JSON-able facts about the fitted classifier (e.g. a per-class statistic) for the stage-2 result."""
        return {}


def resolved_posthoc_spec(spec: dict, where: str = "posthoc") -> dict:
    """``{'name': ..., **options}`` with every default filled in: what a stage-2 result is named by."""
    return POSTHOC.resolved(spec, where)


def create_posthoc(spec: dict, frozen: FrozenRun, seed: int, where: str = "posthoc") -> PosthocMethod:
    """Build and fit a stage-2 method from ``{'name': ..., **options}``."""
    frozen.require_spaces(POSTHOC.get(spec["name"]).needs_spaces, spec["name"])
    method = POSTHOC.build(spec, frozen, seed, where=where)
    method.fit()
    return method


MAX_SETTINGS = 100_000  # stage-2 settings a recipe may declare (each is milliseconds to seconds per run)


def expand_posthoc(entries, where: str = "posthoc") -> list[dict]:
    """A recipe's ``posthoc:`` list -> resolved stage-2 specs, in order, duplicates once.

    Each entry is ``{name: ..., option: value, ...}``; an option given as a list is a grid axis, so
    ``{name: tau_norm, tau: [0, 0.5, 1]}`` is three settings and two list options give their product.
    """
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: expected a list of stage-2 settings, e.g. [{{name: tau_norm, tau: [0, 1]}}], "
                          f"got {short_repr(entries)}")
    out, seen, declared = [], set(), 0
    for i, entry in enumerate(entries):
        here = f"{where}[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ConfigError(f"{here}: expected a mapping with a stage-2 method 'name', got {short_repr(entry)}")
        declared += _entry_size(entry, here)  # bounded from the axis lengths, before anything is expanded
        if declared > MAX_SETTINGS:
            raise ConfigError(f"{where}: {declared} stage-2 settings up to {here}; at most {MAX_SETTINGS} "
                              f"(split the grid into several recipes)")
        for point in _entry_points(entry):
            try:
                spec = resolved_posthoc_spec(point, here)
            except ConfigError:
                raise
            except LtbenchError as exc:  # an unknown name: the registry lists the known ones
                raise ConfigError(f"{here}.name: {exc}") from None
            text = json.dumps(spec, sort_keys=True)
            if text not in seen:
                seen.add(text)
                out.append(spec)
        if len(out) > MAX_SETTINGS:
            raise ConfigError(f"{where}: more than {MAX_SETTINGS} stage-2 settings; split the grid")
    return out


def _entry_size(entry: dict, where: str) -> int:
    """How many settings an entry declares: the product of its list options' lengths. An empty list would
    silently drop the whole entry, so it is refused."""
    size = 1
    for key, values in entry.items():
        if isinstance(values, list) and key != "name":
            if not values:
                raise ConfigError(f"{where}.{key}: an empty list gives no setting (and would drop this entry); "
                                  f"give at least one value")
            size *= len(values)
    return size


def _entry_points(entry: dict) -> list[dict]:
    axes = {k: v for k, v in entry.items() if isinstance(v, list) and k != "name"}
    fixed = {k: v for k, v in entry.items() if k not in axes}
    return [{**fixed, **dict(zip(axes, values))} for values in itertools.product(*axes.values())]
