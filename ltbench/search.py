"""Search spaces: the distributions a hyper-parameter is drawn from, and the random-search draws.

Its own module (layer 0, no torch) because a method declares its space next to its Config and the recipe
expands a ``search:`` section with it: both must read the same grammar. A distribution is one mapping:
``{log_uniform: [low, high]}`` (0 < low < high), ``{uniform: [low, high]}``, ``{int_uniform: [low, high]}``
(both ends included) or ``{choice: [v1, v2, ...]}``.

Draws are deterministic (``derive_seed('search', S, m, k, key)`` per trial and option), so every trial is known
before anything runs and adding an option leaves the others' draws unchanged. Continuous draws keep 4
significant digits, so a run id does not depend on the last bits of a float.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from ltbench.errors import ConfigError, short_repr
from ltbench.results.identity import EXECUTION_SETTINGS
from ltbench.seeding import derive_seed

KINDS = ("log_uniform", "uniform", "int_uniform", "choice")
MAX_TRIALS = 1000
DIGITS = 4  # significant digits of a continuous draw

# The core's options every search tunes unless the recipe removes them (``search.space: {optim.lr: null}``).
# optim.lr: SGD's peak rate around the harness's 0.1 (LDAM-DRW, LA and BALMS train CIFAR-LT at 0.1 with batch
# 128; 0.2 for batch 512 on ImageNet-LT). optim.weight_decay: the range Alshammari et al. (CVPR 2022,
# "Long-tailed recognition via weight balancing") found decisive for long-tailed CIFAR, 5e-4 to 5e-3, widened
# down to 1e-4. docs/methods.md lists every method's space with its source.
CORE_SPACE = {
    "optim.lr": {"log_uniform": [0.01, 0.4]},
    "optim.weight_decay": {"log_uniform": [1e-4, 5e-3]},
}
CORE_KEYS = ("optim", "train", "data", "backbone", "sampler")  # sections a space may name besides method


@dataclass(frozen=True)
class SearchSampler:
    """A search sampler as the core sees it (the core never names one). ``asks``: its draws are asked when each
    trial starts (they depend on the results before it), so a recipe's trials are those its state in the
    results folder holds, and its launches go through ``runner`` (a module with ``launch``, ``work``,
    ``progress_line``, ``refuse_redo``); ``hooks`` is a module with ``check(where)`` and
    ``recorded_trials(root, studies, trials)``. ``prunes``: it can stop a trial on its validation curve.
    Both modules are imported only when a recipe uses the sampler."""
    name: str
    doc: str
    asks: bool = False
    prunes: bool = False
    hooks: str = ""
    runner: str = ""
    startup: int = 0  # draws made at random before the sampler's model guides any (TPE: Optuna's default 10)

    def random_at(self, trials: int) -> bool:
        """Whether fewer than half of ``trials`` draws are guided: the sampler is then random search."""
        return self.startup > 0 and trials - min(self.startup, trials) < trials / 2

    def module(self, which: str):
        import importlib

        return importlib.import_module(getattr(self, which))


SAMPLERS: dict[str, SearchSampler] = {}


def register_sampler(sampler: SearchSampler) -> SearchSampler:
    SAMPLERS[sampler.name] = sampler
    return sampler


register_sampler(SearchSampler("random", "every draw made in advance from the seed (this module)"))
register_sampler(SearchSampler("tpe", "Optuna's TPE, asked trial by trial", asks=True, prunes=True,
                               hooks="ltbench.recipe.tpe", runner="ltbench.run.tpe", startup=10))


def random_note(sampler: str, trials: int) -> str:
    """'tpe is random search at this budget (...)' when fewer than half of its draws are guided, else ''."""
    entry = SAMPLERS.get(sampler)
    if entry is None or not entry.random_at(trials):
        return ""
    return (f"{sampler} is random search at this budget: its first {min(entry.startup, trials)} of {trials} draws "
            f"per study are random start-up draws, so fewer than half are guided")


def probe_values(space: dict) -> list[dict]:
    """Two sets of values every draw lies between: each option at its low end, then at its high end (a
    choice's first and last value). Checked at load like a random draw, so a space a plugin refuses is said
    before any run, though an asking sampler draws its values only when each trial starts."""
    def end(dist, i):
        return dist.args[i] if dist.kind in ("choice", "int_uniform") else _round(dist.args[i])

    return [{k: end(d, i) for k, d in sorted(space.items())} for i in (0, -1)]


@dataclass(frozen=True)
class Distribution:
    kind: str
    args: tuple

    def draw(self, rng: random.Random) -> Any:
        low, high = (self.args + (None, None))[:2]
        if self.kind == "log_uniform":
            return _round(math.exp(rng.uniform(math.log(low), math.log(high))))
        if self.kind == "uniform":
            return _round(rng.uniform(low, high))
        if self.kind == "int_uniform":
            return rng.randint(low, high)
        return self.args[rng.randrange(len(self.args))]

    def holds(self, value: Any) -> bool:
        """Whether ``value`` is a draw of this distribution (a recorded draw read back is data: checked)."""
        if self.kind == "choice":
            return any(type(value) is type(a) and value == a for a in self.args)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.kind == "int_uniform":
            return isinstance(value, int) and self.args[0] <= value <= self.args[1]
        return _round(self.args[0]) <= value <= _round(self.args[1]) or self.args[0] <= value <= self.args[1]

    def text(self) -> str:
        return f"{self.kind}[{', '.join(_value_text(a) for a in self.args)}]"


def _round(x: float) -> float:
    return float(f"{x:.{DIGITS}g}")


def _value_text(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_distribution(raw: Any, where: str) -> Distribution:
    """One distribution from its YAML form, or a one-line ConfigError naming ``where``."""
    expected = (f"expected one of {{{', '.join(f'{k}: [...]' for k in KINDS)}}}, e.g. {{log_uniform: [0.01, 0.5]}}")
    if not isinstance(raw, dict) or len(raw) != 1:
        raise ConfigError(f"{where}: {short_repr(raw, 80)} is not a distribution; {expected}")
    kind, args = next(iter(raw.items()))
    if kind not in KINDS:
        raise ConfigError(f"{where}: unknown distribution {short_repr(kind, 40)}; {expected}")
    if not isinstance(args, list) or not args:
        raise ConfigError(f"{where}.{kind}: expected a list, got {short_repr(args, 60)}")
    if kind == "choice":
        if not all(v is None or isinstance(v, (str, int, float, bool)) for v in args):
            raise ConfigError(f"{where}.choice: expected plain values (numbers, strings, true/false, null), "
                              f"got {short_repr(args, 60)}")
        return Distribution(kind, tuple(args))
    if len(args) != 2 or not all(_is_number(v) for v in args) or not args[0] < args[1]:
        raise ConfigError(f"{where}.{kind}: expected [low, high] with low < high, got {short_repr(args, 60)}")
    if kind == "log_uniform" and args[0] <= 0:
        raise ConfigError(f"{where}.log_uniform: low must be above 0, got {short_repr(args, 60)}")
    if kind == "int_uniform" and not all(isinstance(v, int) for v in args):
        raise ConfigError(f"{where}.int_uniform: expected two integers, got {short_repr(args, 60)}")
    return Distribution(kind, tuple(float(v) if kind != "int_uniform" else v for v in args))


def parse_space(raw: Any, where: str, prefix: str = "") -> dict[str, Distribution | None]:
    """A space (dotted key -> distribution; None removes a key from the default space), each checked."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of dotted options to distributions, got {short_repr(raw, 60)}")
    out: dict[str, Distribution | None] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not key or not all(part.isidentifier() for part in key.split(".")):
            raise ConfigError(f"{where}: {short_repr(key, 60)} is not a dotted option name such as optim.lr")
        out[prefix + key] = None if value is None else parse_distribution(value, f"{where}.{key}")
    return out


def method_space(cls: Any, name: str) -> dict[str, Distribution]:
    """A method's declared ``search_space`` as dotted keys ('method.tau'); plugin data, checked the same way."""
    declared = getattr(cls, "search_space", None) or {}
    return {k: v for k, v in parse_space(declared, f"method '{name}': search_space", "method.").items() if v}


def config_fields(cls: Any) -> set[str]:
    """The option names a Config dataclass has."""
    return set(getattr(cls, "__dataclass_fields__", {}))


def check_space_options(space: dict, config_cls: Any, method: str, where: str) -> None:
    """Every ``method.*`` key of ``space`` names an option of the method's Config (its first part: a nested
    option such as method.aux.tau is checked when the drawn configuration is validated)."""
    known = config_fields(config_cls)
    for key in space:
        if key.startswith("method.") and key.split(".")[1] not in known:
            raise ConfigError(f"{where}.{key}: method '{method}' has no option '{key.split('.')[1]}' (its options: "
                              f"{', '.join(sorted(known)) or 'none'}); search only options the method has")


def check_core_key(key: str, where: str) -> None:
    if key.split(".")[0] not in (*CORE_KEYS, "method") or "." not in key:
        raise ConfigError(f"{where}.{key}: not an option of a run; a space key is a dotted path under "
                          f"method, {', '.join(CORE_KEYS)} (e.g. optim.lr, method.tau)")
    if tuple(key.split(".")) in EXECUTION_SETTINGS:
        raise ConfigError(f"{where}.{key}: an execution setting (how a run is executed, not what it computes: every "
                          f"draw would give the same run id), so it cannot be searched; set it once ({key}: ...)")


def draw_trials(space: dict[str, Distribution], seed: int, method: str, trials: int) -> list[dict[str, Any]]:
    """The values of every trial, in trial order: a pure function of (seed, method, trial, key)."""
    return [{key: dist.draw(random.Random(derive_seed("search", seed, method, k, key)))
             for key, dist in sorted(space.items())} for k in range(trials)]


def space_text(space: dict[str, Distribution]) -> str:
    return ", ".join(f"{k} ~ {d.text()}" for k, d in sorted(space.items())) or "(empty)"


# What a trial records in its run spec and result (``grid['search']``), so tables and status know which
# trial of which search a run is without putting the trial into the run's identity.
TRIAL_FIELDS = {"trial": int, "trials": int, "seed": int, "sampler": str, "space": list}


def trial_problem(info: Any) -> str:
    """'' when ``info`` is a trial record of the shape above (read back from disk or a cache: data, checked)."""
    if not isinstance(info, dict) or set(info) != set(TRIAL_FIELDS):
        return "not a trial record"
    for name, kind in TRIAL_FIELDS.items():
        value = info[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"trial record field {name}"
    if not (0 <= info["trial"] < info["trials"] <= MAX_TRIALS) or not all(isinstance(k, str) for k in info["space"]):
        return "trial record values"
    return ""


def choose(vals: list[list[float | None]]) -> int | None:
    """The one selection rule of a search: the index of the draw with the best mean validation All over the
    tuning seeds, among the draws with a value on every tuning seed (the earliest of ties); None when no draw
    has. Its report runs are fresh seeds that took no part in it, so their test numbers carry no selection
    bonus (tests/test_tuned.py simulates it: the tuned-versus-fixed test keeps its nominal size)."""
    scored = [(sum(v) / len(v), -i) for i, v in enumerate(vals) if v and all(x is not None for x in v)]
    return -max(scored)[1] if scored else None


def draws_per_axis(trials: int, dimension: int) -> float:
    """trials ** (1/d): how finely a random search of ``trials`` draws covers each of d options."""
    return float(trials) ** (1.0 / max(dimension, 1))


def budget_text(info: dict, tuning: int, report: int) -> str:
    """'tuned: 8 draws x 2 tuning seeds on validation (random search, seed 0); reported: 3 fresh seeds'."""
    return (f"tuned: {info['trials']} draws x {tuning} tuning seed{'s' * (tuning != 1)} on validation "
            f"({info['sampler']} search, seed {info['seed']}); reported: {report} fresh seed{'s' * (report != 1)}")
