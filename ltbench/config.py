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
from ltbench.priors import parse_prior

#: Integers beyond this are never a sensible setting (and overflow NumPy / torch seeds and counters).
INT_LIMIT = 2**63 - 1


_SIMPLE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", Any: "any value",
                 type(None): "null"}


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp in _SIMPLE_NAMES:
        return _SIMPLE_NAMES[tp]
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
        return _coerce_union(tp, value, path)
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


def _coerce_union(tp: Any, value: Any, path: str) -> Any:
    """The first alternative of ``A | B | None`` that accepts ``value``. When none does but one failed inside
    the value (a list's item, a mapping's field), that error is raised: it names the field to fix
    (``rows[1].versus: expected ...``), where 'rows: expected a list or null' of a list would lead nowhere."""
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    deeper = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return coerce(arg, value, path)
        except ConfigError as exc:
            if str(exc).startswith((f"{path}.", f"{path}[")):
                deeper.append(exc)
    if deeper:
        raise deeper[0]
    raise _fail(path, _type_name(tp), value)


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
        raise ConfigError(f"{join_path(path, key)}: unknown key{hint}; allowed keys: "
                          f"{', '.join(sorted(fields)) or '(none)'}")
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


def check_range(name: str, value: float | int | None, low: float | None = None, high: float | None = None, *,
                low_open: bool = False, high_open: bool = False, unit: str = "") -> None:
    """Raise ValueError('NAME must be ...') when ``value`` is outside [low, high] (or an open side), for the
    ``validate()`` of config classes: the message says the allowed range, so the user knows what to write
    instead. None passes (optional)."""
    if value is None:
        return
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        left = "" if low is None else f"{'>' if low_open else '>='} {value_text(float(low))}"
        right = "" if high is None else f"{'<' if high_open else '<='} {value_text(float(high))}"
        want = " and ".join(x for x in (left, right) if x)
        raise ValueError(f"{name} must be {want}{unit}, got {short_repr(value)}")


def option_default(f: dataclasses.Field) -> Any:
    """The value a recipe that leaves option ``f`` out gets (what an option listing should show)."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def to_dict(obj: Any) -> dict:
    """A config dataclass as plain data, every field explicit: what enters a run's configuration and id."""
    return dataclasses.asdict(obj)


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
    epochs: int = 200  # length of the schedule; 0: evaluate the model as built (zero-shot, features only)
    warmup_epochs: float = 5.0  # linear warm-up from ~0, stepped per iteration
    # cosine: per iteration; cosine_epoch: constant within an epoch, cos over epochs (torch's
    # CosineAnnealingLR stepped once per epoch, as LIFT trains); step; constant
    schedule: Literal["cosine", "cosine_epoch", "step", "constant"] = "cosine"
    milestones: list[int] = field(default_factory=lambda: [160, 180])  # epochs, for "step"
    gamma: float = 0.1  # multiplicative factor per milestone, for "step"
    # Gradient accumulation: each step's batch_size images go through the model in chunks of this many,
    # one optimiser step per batch (LIFT's micro_batch_size; for small GPUs). A different computation where
    # a model has BatchNorm (it sees the chunks), so part of the run id; None: no accumulation.
    micro_batch_size: int | None = None

    def validate(self) -> None:
        check_range("lr", self.lr, 0, 1000, low_open=True)
        check_range("momentum", self.momentum, 0, 1, high_open=True)
        if self.nesterov and self.momentum == 0:
            raise ValueError("nesterov: true needs momentum > 0")
        check_range("weight_decay", self.weight_decay, 0, 1)
        check_range("batch_size", self.batch_size, 2, MAX_BATCH, unit=" (BatchNorm needs 2 images per batch)")
        check_range("epochs", self.epochs, 0, MAX_EPOCHS)
        check_range("warmup_epochs", self.warmup_epochs, 0, self.epochs, unit=" (at most epochs)")
        check_range("gamma", self.gamma, 0, 1e6, low_open=True)
        check_range("micro_batch_size", self.micro_batch_size, 1, self.batch_size, unit=" (at most batch_size)")
        if self.micro_batch_size is not None and self.batch_size % self.micro_batch_size:
            raise ValueError(f"micro_batch_size ({self.micro_batch_size}) must divide batch_size ({self.batch_size})")
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
# ltbench/data/batch_augment.py changes the random numbers or the ops of a batched view (and add a migration
# step if recorded runs must say which scheme they used). 2: one hash call per view, no data-dependent grouping.
BATCH_AUGMENT_SCHEME = 2


@dataclass
class TrainConfig:
    """How a run executes; none of these changes the method, some change numerics (precision)."""

    precision: Literal["fp32", "bf16", "fp16"] = "fp32"  # autocast dtype; bf16/fp16 are faster, change numerics
    num_workers: int = 0  # DataLoader worker processes, kept for the whole run (training and evaluation)
    channels_last: bool = False  # NHWC memory format for model and batches (faster convolutions on GPU)
    # torch.compile backbone, loss and batched views with this backend; reduce-overhead: Inductor + CUDA graphs
    compile: Literal["off", "inductor", "aot_eager", "reduce-overhead"] = "off"
    cudnn_benchmark: bool = True  # let cuDNN time its kernels (CUDA only; not bit-reproducible)
    eval_every: int = 0  # evaluate on the test set every N epochs (0: only at the end)
    checkpoint_minutes: float = 0.0  # also checkpoint mid-epoch every N minutes (0: epoch ends only)
    threads: int | None = None  # torch threads; None or 0: 1 on the CPU, else the worker's share (provenance.thread_count)
    progress: bool = True  # the live progress display on an interactive terminal (every run false: plain lines)
    # Read the training meters (loss, accuracy, extras, the non-finite check) from the device every N steps for
    # the progress line and heartbeat, besides each epoch end; 0: at epoch ends only. Each read is a
    # host-device sync (docs/performance.md), so not every step. An execution setting: same results.
    log_every: int = 20
    loggers: list[str] = field(default_factory=list)  # also log per-epoch scalars to: tensorboard, wandb
    # Where training views are augmented: 'worker' (per image, in the loader: bit-identical to earlier runs) or
    # 'batch' (whole uint8 batches on the training device, random draws per sample; ltbench/data/batch_augment.py).
    # Same distributions, different random numbers, so it is part of the run id.
    augment_on: Literal["worker", "batch"] = "worker"
    # The version of the batched scheme (its random draws and ops) a 'batch' run uses: filled in with
    # BATCH_AUGMENT_SCHEME, so that batch runs made before a change of ltbench/data/batch_augment.py never share
    # an id with runs made after it; null for 'worker' runs. Only the current scheme can be trained.
    augment_scheme: int | None = None

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
    select: Literal["last", "best_val"] = "last"
    # Test-time ensembling (LIFT's): every evaluated image (test, test sets, validation) is resized to
    # size + tte_expand and cut into 5 (fivecrop) or 10 (tencrop: the five and their mirror images) crops;
    # the prediction is the mean of the method's scores over the crops. none: one centre crop.
    tte: Literal["none", "fivecrop", "tencrop"] = "none"
    tte_expand: int = 24

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
        check_range("tte_expand", self.tte_expand, 0, 4096)
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


# --------------------------------------------------------------------------------------------
# Describing a Config's options (`ltbench list methods --options`): from the dataclass itself, so the
# listing cannot drift from what a recipe may set.


@dataclass(frozen=True)
class OptionDoc:
    name: str
    type: str  # as annotated, e.g. 'float', 'int | None'
    default: str  # as a recipe writes it (YAML), or 'required'
    doc: str  # one line: field(metadata={'doc': ...}), else the field's comment in the source


def describe_options(cls: type) -> list[OptionDoc]:
    """Every option of a plugin's ``Config`` dataclass, in declaration order, with the default a recipe that
    leaves it out gets (``option_default``). The doc of a field is its
    ``metadata['doc']``, else the comment on its line (or the comment lines just above it) in the class
    that declares it or, for a field a subclass only re-defaults, in a base class."""
    if not dataclasses.is_dataclass(cls):
        return []
    comments: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # a subclass's comment wins over its base's
        comments.update({k: v for k, v in _field_comments(klass).items() if v})
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            default = "required"
        else:
            default = yaml_text(option_default(f))
        type_text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        type_text = _LITERAL.sub(lambda m: "|".join(v.strip().strip("'\"") for v in m.group(1).split(",")), type_text)
        doc = _first_sentence(repr(str(f.metadata.get("doc") or comments.get(f.name, ""))))
        out.append(OptionDoc(f.name, type_text, default, doc if len(doc) <= DOC_LIMIT else doc[:DOC_LIMIT - 1] + "…"))
    return out


DOC_LIMIT = 120  # characters of an option's doc in 'ltbench list --options' (the source has the rest)
_LITERAL = __import__("re").compile(r"Literal\[([^\]]*)\]")  # Literal['a', 'b'] is listed as a|b


def yaml_text(value: Any) -> str:
    """A default as a recipe would write it: null, true, 0.0001, [default, strong], {}, ''."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value and value.strip() == value and not value[0] in "[{'\"&*!|>%@`#,?:-" else repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_text(v)}" for k, v in value.items()) + "}"
    return repr(value) if isinstance(value, float) else str(value)


def _field_comments(klass: type) -> dict[str, str]:
    """field name -> its doc in ``klass``'s own source: the comment on its line, else the comment lines
    just above it, else the string just below it (an attribute docstring, first sentence); {} when the
    source cannot be read."""
    import inspect  # lazy: only 'ltbench list --options' reads sources
    import io
    import tokenize

    if "__dataclass_fields__" not in vars(klass):
        return {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(inspect.getsource(klass)).readline))
    except (OSError, TypeError, tokenize.TokenError, SyntaxError):
        return {}
    body = min((t.end[1] for t in tokens if t.type == tokenize.INDENT), default=4)  # the class body's indent
    out: dict[str, str] = {}
    above: list[str] = []  # comment lines just above the next field
    field_name, field_line, after_field = None, -1, False
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.COMMENT:
            if tok.start[0] == field_line and field_name and not out[field_name]:
                out[field_name] = tok.string.lstrip("#").strip()  # the comment on the field's own line
            elif tok.line.strip().startswith("#"):
                above.append(tok.string.lstrip("#").strip())
        elif tok.type == tokenize.STRING and tok.start[1] == body and after_field and field_name and not out[field_name]:
            out[field_name] = _first_sentence(tok.string)
        elif tok.type == tokenize.NAME and tok.start[1] == body:
            is_field = i + 1 < len(tokens) and tokens[i + 1].string == ":"
            if is_field:
                field_name, field_line = tok.string, tok.start[0]
                out[field_name] = " ".join(above)
            above = []
        if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            after_field = tok.start[0] == field_line or (tok.type == tokenize.STRING and after_field)
        elif tok.type == tokenize.NEWLINE:
            after_field = tok.start[0] == field_line
    return out


def _first_sentence(literal: str) -> str:
    """The first sentence of a string literal's text, on one line."""
    import ast  # lazy: only 'ltbench list --options' reads sources

    try:
        text = " ".join(str(ast.literal_eval(literal)).split())
    except (ValueError, SyntaxError):
        return ""
    for i in range(len(text) - 2):
        if text[i] == "." and text[i + 1] == " " and text[i + 2].isupper():
            return text[: i + 1]
    return text
