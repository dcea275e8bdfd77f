"""Typed configuration: stdlib dataclasses validated from plain YAML data.

Every error names the dotted field and what was expected, so the CLI can print
``recipes/x.yaml: method.tau: expected a number, got 'abc' (str)`` and nothing else.
Method, dataset and backbone hyper-parameters are validated against the ``Config`` dataclass
of the registered plugin, so a plugin gets the same checking as the core for free.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from ltbench.errors import ConfigError, short_repr
from ltbench.results.identity import DROPPED, identity_of
from ltbench.priors import parse_prior

# Which configuration fields are execution settings (not part of what a run computes) is declared in
# ltbench/results/identity.py, the one home of run identity; these names are kept for the code that imports them.
NOT_IN_RUN_ID = DROPPED
without_local_fields = identity_of

#: Integers beyond this are never a sensible setting (and overflow NumPy / torch seeds and counters).
INT_LIMIT = 2**63 - 1


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if tp is Any:
        return "any value"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        return "a list"
    if origin is dict:
        return "a mapping"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    return str(tp)


def _fail(path: str, expected: str, value: Any) -> ConfigError:
    return ConfigError(f"{path}: expected {expected}, got {short_repr(value)} ({type(value).__name__})")


def coerce(tp: Any, value: Any, path: str) -> Any:
    """Check ``value`` against the type annotation ``tp`` and return it, normalised."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(arg, value, path)
            except ConfigError:
                pass
        raise _fail(path, _type_name(tp), value)
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise _fail(path, _type_name(tp), value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _fail(path, "true or false", value)
    if tp is int:
        if isinstance(value, str) and len(value) < 100 and "e" in value.lower():  # YAML 1.1: "1e12" is a string
            number = _as_float(value)
            value = value if number is None or not math.isfinite(number) else number
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > INT_LIMIT:
                raise _fail(path, "an integer of at most 2^63 - 1 in size", value)
            return value
        raise _fail(path, "an integer", value)
    if tp is float:
        number = _as_float(value)
        if number is None:
            raise _fail(path, "a number", value)
        if not math.isfinite(number):  # NaN passes every `x <= 0` check, so it is refused here, once
            raise _fail(path, "a finite number (not NaN or infinity)", value)
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise _fail(path, "a string", value)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _fail(path, _type_name(tp), value)
        (item_tp,) = typing.get_args(tp)[:1] or (Any,)
        return [coerce(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise _fail(path, "a mapping", value)
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    raise ConfigError(f"{path}: unsupported annotation {tp!r} in the config class")


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an int with hundreds of digits
            return math.inf
    if isinstance(value, str) and len(value) < 100:  # YAML 1.1 reads "5e-4" as a string
        try:
            return float(value)
        except ValueError:
            return None
    return None


def from_dict(cls: type, data: Any, path: str) -> Any:
    """Build dataclass ``cls`` from a mapping; unknown keys and wrong types are errors."""
    if data is None:
        data = {}
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise _fail(path, "a mapping", data)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted((k for k in data if k not in fields), key=str)
    if unknown:
        import difflib

        key = short_repr(unknown[0], 60) if not isinstance(unknown[0], str) else short_repr(unknown[0], 60).strip("'")
        close = difflib.get_close_matches(str(key), list(fields), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(
            f"{join_path(path, key)}: unknown key{hint}; allowed keys: {', '.join(sorted(fields)) or '(none)'}"
        )
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = coerce(hints[name], data[name], join_path(path, name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{join_path(path, name)}: required field is missing")
    try:
        obj = cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(_field_message(path, str(exc), fields)) from exc
    validate = getattr(obj, "validate", None)
    if callable(validate):
        try:
            validate()
        except ValueError as exc:
            raise ConfigError(_field_message(path, str(exc), fields)) from None
    return obj


def _field_message(path: str, message: str, fields: dict) -> str:
    """'optim' + 'lr must be > 0' -> 'optim.lr: must be > 0', so every message starts with the dotted field."""
    head, _, rest = message.partition(" ")
    name = head.rstrip(":").split("[")[0]
    if name in fields and rest:
        return f"{join_path(path, head.rstrip(':'))}: {rest}"
    return f"{path}: {message}" if path else message


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def check_range(name: str, value: float | int | None, low: float | None = None, high: float | None = None, *,
                low_open: bool = False, high_open: bool = False, unit: str = "") -> None:
    """Raise ValueError('NAME must be ...') when ``value`` is outside [low, high] (or an open side).

    For the ``validate()`` of config classes: one call per field keeps the bounds readable, and the
    message says the allowed range, so the user knows what to write instead. None passes (optional).
    """
    if value is None:
        return
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        left = "" if low is None else f"{'>' if low_open else '>='} {_number(low)}"
        right = "" if high is None else f"{'<' if high_open else '<='} {_number(high)}"
        want = " and ".join(x for x in (left, right) if x)
        raise ValueError(f"{name} must be {want}{unit}, got {short_repr(value)}")


def added_later(default: Any) -> Any:
    """A dataclass field added to a config after results were recorded, whose default is what those runs did.

    Why: the run id hashes the resolved config, so a new option would otherwise change the id of every earlier
    run (and split its table rows). ``to_dict`` leaves such a field out while it holds its default; the id
    changes only for runs that use the new option."""
    return dataclasses.field(default=default, metadata={"added_later": True})


def to_dict(obj: Any) -> dict:
    """A config dataclass as plain data, less ``added_later`` fields that hold their default."""
    data = dataclasses.asdict(obj)
    for f in dataclasses.fields(obj):
        if f.metadata.get("added_later") and data[f.name] == f.default:
            del data[f.name]
    return data


def value_text(v: Any) -> str:
    """Canonical short text of a config value: 1.0 -> '1', True -> 'true', [a, b] -> '[a,b]'. The one spelling
    of a value in labels, so progress lines and table rows name a run alike ('la (tau=1)')."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:g}"
    if v is None:
        return "none"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(value_text(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}={value_text(x)}" for k, x in sorted(v.items())) + "}"
    return str(v)


def join_path(path: str, key: Any) -> str:
    """'a.b' + 'c' -> 'a.b.c': the field path an error message names (the one helper recipe.py uses too)."""
    return f"{path}.{key}" if path else str(key)


@dataclass
class EmptyConfig:
    """For plugins without hyper-parameters."""


# --------------------------------------------------------------------------------------------
# The core's own sections of a run configuration.


# Bounds on sizes: far beyond any real benchmark (ImageNet-LT trains 90-200 epochs at batch 256-512), so a
# typo such as `epochs: 1e12` is refused before anything runs instead of "running" for ever.
MAX_EPOCHS = 10_000
MAX_BATCH = 65_536


@dataclass
class OptimConfig:
    """SGD and its learning-rate schedule (every run uses the same optimiser, so methods compare fairly)."""

    lr: float = 0.1  # peak learning rate (after warm-up), for a batch of batch_size
    momentum: float = 0.9  # SGD momentum, in [0, 1)
    nesterov: bool = False  # Nesterov momentum (needs momentum > 0)
    weight_decay: float = 5e-4  # L2 penalty of SGD (methods may exempt their own parameters via param_groups)
    batch_size: int = 128  # images per optimiser step (per process under distributed training)
    epochs: int = 200  # length of the schedule
    warmup_epochs: float = 5.0  # linear warm-up from ~0, stepped per iteration
    schedule: Literal["cosine", "step", "constant"] = "cosine"
    milestones: list[int] = field(default_factory=lambda: [160, 180])  # epochs, for "step"
    gamma: float = 0.1  # multiplicative factor per milestone, for "step"

    def validate(self) -> None:
        check_range("lr", self.lr, 0, 1000, low_open=True)
        check_range("momentum", self.momentum, 0, 1, high_open=True)
        if self.nesterov and self.momentum == 0:
            raise ValueError("nesterov: true needs momentum > 0")
        check_range("weight_decay", self.weight_decay, 0, 1)
        check_range("batch_size", self.batch_size, 2, MAX_BATCH, unit=" (BatchNorm needs 2 images per batch)")
        check_range("epochs", self.epochs, 1, MAX_EPOCHS)
        check_range("warmup_epochs", self.warmup_epochs, 0, self.epochs, unit=" (at most epochs)")
        check_range("gamma", self.gamma, 0, 1e6, low_open=True)
        for m in self.milestones if self.schedule == "step" else ():  # the default [160, 180] is unused otherwise
            check_range("milestones[...]", m, 1, self.epochs, unit=" (an epoch of the schedule)")
        if list(self.milestones) != sorted(self.milestones):
            raise ValueError(f"milestones must be increasing, got {short_repr(self.milestones)}")


# The experiment trackers ``train.loggers`` may name, and the PyPI package each needs. The names are a
# validation rule of the train section, so they live here; ltbench/train/loggers.py builds the loggers.
LOGGER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


def check_logger_names(names) -> None:
    """``train.loggers`` validation (at recipe load): known names, each once."""
    for name in names:
        if name not in LOGGER_PACKAGES:
            raise ValueError(f"loggers: unknown logger {name!r}; expected any of {', '.join(LOGGER_PACKAGES)}")
    if len(set(names)) != len(names):
        raise ValueError(f"loggers: a logger is named twice: {list(names)}")


# The batched augmentation scheme (train.augment_on: batch) this code implements. Bump it whenever
# ltbench/data/batch_augment.py changes the random numbers or the ops of a batched view. 1: before issue 30
# (recorded configs of that time have no augment_scheme); 2: one hash call per view, no data-dependent grouping.
BATCH_AUGMENT_SCHEME = 2


@dataclass
class TrainConfig:
    """How a run executes; none of these changes the method, some change numerics (precision)."""

    precision: Literal["fp32", "bf16", "fp16"] = "fp32"  # autocast dtype; bf16/fp16 are faster, change numerics
    num_workers: int = 0  # DataLoader worker processes, kept for the whole run (training and evaluation)
    channels_last: bool = False  # NHWC memory format for model and batches (faster convolutions on GPU)
    compile: Literal["off", "inductor", "aot_eager"] = "off"  # torch.compile the backbone with this backend
    cudnn_benchmark: bool = True  # let cuDNN time its kernels (CUDA only; not bit-reproducible)
    eval_every: int = 0  # evaluate on the test set every N epochs (0: only at the end)
    checkpoint_minutes: float = 0.0  # also checkpoint mid-epoch every N minutes (0: epoch ends only)
    threads: int | None = None  # torch threads; None or 0: SLURM_CPUS_PER_TASK or torch's default
    progress: bool = True  # progress bar on an interactive terminal
    # Read the training meters (loss, accuracy, extras, the non-finite check) from the device every N steps for
    # the progress line and heartbeat, besides each epoch end; 0: at epoch ends only. Each read is a
    # host-device sync (docs/performance.md), so not every step. An execution setting: same results.
    log_every: int = 20
    loggers: list[str] = field(default_factory=list)  # also log per-epoch scalars to: tensorboard, wandb
    # Where training views are augmented: 'worker' (per image, in the loader: bit-identical to earlier runs) or
    # 'batch' (whole uint8 batches on the training device, random draws per sample; ltbench/data/batch_augment.py).
    # Same distributions, different random numbers, so it is part of the run id.
    augment_on: Literal["worker", "batch"] = added_later("worker")
    # The version of the batched scheme (its random draws and ops) a 'batch' run uses: filled in with
    # BATCH_AUGMENT_SCHEME, so that batch runs made before a change of ltbench/data/batch_augment.py never share
    # an id with runs made after it. Absent for 'worker' runs, and in the configs of batch runs recorded before
    # the field existed (scheme 1: their ids stay). Only the current scheme can be trained.
    augment_scheme: int | None = added_later(None)

    def __post_init__(self) -> None:
        if self.augment_on == "batch" and self.augment_scheme is None:
            self.augment_scheme = BATCH_AUGMENT_SCHEME

    def validate(self) -> None:
        check_logger_names(self.loggers)
        check_range("num_workers", self.num_workers, 0, 256)
        check_range("eval_every", self.eval_every, 0, MAX_EPOCHS)
        check_range("checkpoint_minutes", self.checkpoint_minutes, 0, 100_000)
        check_range("threads", self.threads, 0, 4096, unit=" (0 or null: the default)")
        check_range("log_every", self.log_every, 0, INT_LIMIT, unit=" (0: epoch ends only)")
        if self.augment_on != "batch" and self.augment_scheme is not None:
            raise ValueError("augment_scheme applies to augment_on: batch only; leave it out")
        if self.augment_scheme is not None and self.augment_scheme != BATCH_AUGMENT_SCHEME:
            raise ValueError(f"augment_scheme: this ltbench implements batched scheme {BATCH_AUGMENT_SCHEME} only "
                             f"(got {self.augment_scheme}); leave it out to use it (docs/performance.md, versions)")


@dataclass
class EvalConfig:
    """How a run is evaluated: shot groups and extra (shifted) test priors and test sets."""

    many_threshold: int = 100  # many-shot: more than this many training images
    few_threshold: int = 20  # few-shot: fewer than this many training images
    target_priors: list[str] = field(default_factory=list)  # e.g. forward50, backward10 (shifted tests)
    # Extra test sets by name (e.g. forward50): the dataset's published shifted list, or the SADE subset of
    # the balanced test split; predicted with their (known) class prior.
    test_sets: list[str] = field(default_factory=list)
    # Which epoch's model the run reports: the last (common practice), or the one with the best validation
    # All (needs a validation split, data.val_per_class or data.val_split; docs/protocol.md).
    select: Literal["last", "best_val"] = added_later("last")

    def validate(self) -> None:
        check_range("few_threshold", self.few_threshold, 0, INT_LIMIT)
        check_range("many_threshold", self.many_threshold, 0, INT_LIMIT)
        if self.few_threshold > self.many_threshold:
            raise ValueError("few_threshold must not exceed many_threshold")
        for name in self.target_priors:
            check_prior_name(name, "target_priors")
        for name in self.test_sets:
            if not isinstance(name, str) or not name.replace("_", "").isalnum() or len(name) > 100:
                raise ValueError(f"test_sets: {short_repr(name)} is not a test set name (letters, digits, _), "
                                 f"e.g. forward50, backward10, uniform")
        for what, names in (("target_priors", self.target_priors), ("test_sets", self.test_sets)):
            if len(set(names)) != len(names):
                raise ValueError(f"{what} names a prior twice: {short_repr(names)}")


def check_views(views: list[str] | None, what: str = "views") -> None:
    """A method's view list: None (the default view) or 1-8 pipeline / alias names."""
    if views is None:
        return
    if not 1 <= len(views) <= 8:
        raise ValueError(f"{what} must name 1 to 8 views (e.g. [default] or [strong, sim]), got {len(views)}")
    for v in views:
        if not v or not v.replace("_", "").isalnum():
            raise ValueError(f"{what}: {short_repr(v)} is not a view name such as default, strong or sim")


def check_prior_name(name: str, where: str) -> tuple[str, float]:
    """'forward50' -> ('forward', 50.0): the one prior grammar of ltbench/priors.py, with ``where`` in front."""
    try:
        return parse_prior(name)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}" if where else str(exc)) from None


def omitted_default(key: str) -> tuple[bool, Any]:
    """(True, default) when the dotted ``key`` names an ``added_later`` field of a core section (optim, train,
    eval): a run config that lacks the key ran with that default. Table selectors use it, so
    ``where: {train.augment_on: worker}`` picks the runs recorded before (or without) the option."""
    section, _, name = key.partition(".")
    cls = {"optim": OptimConfig, "train": TrainConfig, "eval": EvalConfig}.get(section)
    for f in dataclasses.fields(cls) if cls is not None else ():
        if f.name == name and f.metadata.get("added_later"):
            return True, f.default
    return False, None
