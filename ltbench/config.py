"""Typed configuration: stdlib dataclasses validated from plain YAML data.

Every error names the dotted field and what was expected, so the CLI can print
``recipes/x.yaml: method.tau: expected a number, got 'abc' (str)`` and nothing else.
Method, dataset and backbone hyper-parameters are validated against the ``Config`` dataclass
of the registered plugin, so a plugin gets the same checking as the core for free.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from ltbench.errors import ConfigError


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
    return ConfigError(f"{path}: expected {expected}, got {value!r} ({type(value).__name__})")


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
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _fail(path, "an integer", value)
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "5e-4" as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise _fail(path, "a number", value)
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
    unknown = sorted(set(data) - set(fields))
    if unknown:
        import difflib

        key = unknown[0]
        close = difflib.get_close_matches(str(key), list(fields), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(
            f"{_join(path, key)}: unknown key{hint}; allowed keys: {', '.join(sorted(fields)) or '(none)'}"
        )
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = coerce(hints[name], data[name], _join(path, name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{_join(path, name)}: required field is missing")
    try:
        obj = cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    validate = getattr(obj, "validate", None)
    if callable(validate):
        try:
            validate()
        except ValueError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    return obj


def to_dict(obj: Any) -> dict:
    return dataclasses.asdict(obj)


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


@dataclass
class EmptyConfig:
    """For plugins without hyper-parameters."""


# --------------------------------------------------------------------------------------------
# The core's own sections of a run configuration.


@dataclass
class OptimConfig:
    lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 5e-4
    batch_size: int = 128
    epochs: int = 200
    warmup_epochs: float = 5.0  # linear warm-up from ~0, stepped per iteration
    schedule: Literal["cosine", "step", "constant"] = "cosine"
    milestones: list[int] = field(default_factory=lambda: [160, 180])  # epochs, for "step"
    gamma: float = 0.1  # multiplicative factor per milestone, for "step"

    def validate(self) -> None:
        if self.lr <= 0 or self.batch_size <= 0 or self.epochs <= 0:
            raise ValueError("lr, batch_size and epochs must be positive")
        if self.warmup_epochs < 0 or self.warmup_epochs > self.epochs:
            raise ValueError("warmup_epochs must be between 0 and epochs")


@dataclass
class TrainConfig:
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"  # autocast dtype; bf16/fp16 are faster, change numerics
    num_workers: int = 0  # DataLoader worker processes, kept for the whole run (training and evaluation)
    channels_last: bool = False  # NHWC memory format for model and batches (faster convolutions on GPU)
    compile: Literal["off", "inductor", "aot_eager"] = "off"  # torch.compile the backbone with this backend
    cudnn_benchmark: bool = True  # let cuDNN time its kernels (CUDA only; not bit-reproducible)
    eval_every: int = 0  # evaluate on the test set every N epochs (0: only at the end)
    checkpoint_minutes: float = 0.0  # also checkpoint mid-epoch every N minutes (0: epoch ends only)
    threads: int | None = None  # torch threads; default: SLURM_CPUS_PER_TASK or torch's default
    progress: bool = True  # progress bar on an interactive terminal


@dataclass
class EvalConfig:
    many_threshold: int = 100  # many-shot: more than this many training images
    few_threshold: int = 20  # few-shot: fewer than this many training images
    target_priors: list[str] = field(default_factory=list)  # e.g. forward50, backward10 (shifted tests)
    # Extra test sets by name (e.g. forward50): the dataset's published shifted list, or the SADE subset of
    # the balanced test split; predicted with their (known) class prior.
    test_sets: list[str] = field(default_factory=list)

    def validate(self) -> None:
        if self.few_threshold > self.many_threshold:
            raise ValueError("few_threshold must not exceed many_threshold")
