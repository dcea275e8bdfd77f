"""Training samplers: which images an epoch visits, in which order (a registry, like methods).

Why a registry: re-sampling is one of the families of long-tailed methods (Kang et al. 2020,
"Decoupling Representation and Classifier", compare instance-balanced, class-balanced, square-root
and progressively-balanced sampling as their main stage-1 variable), and the engine must not know
any of them. A sampler is one file that registers a ``Sampler`` subclass with
``@SAMPLERS.register(name)``: the core ones live here, others in plugin folders or behind an
``ltbench.samplers`` entry point (docs/adding-a-method.md, "A sampler").

The contract, the same for every sampler, is what keeps runs exact:
- ``epoch_order(seed, epoch)`` is a pure function of (seed, epoch) and the training labels: no state,
  so a run resumed mid-epoch replays the same order, and worker processes never see the sampler;
- an epoch is ``len(train)`` draws (the schedule's iterations per epoch do not depend on the sampler);
- the engine cuts the order into global batches and, under DDP, rank r takes positions r, r+W, ... of
  each batch (``engine.SeededSamples.train_keys``): shards are disjoint as positions and together are
  the epoch. A sampler that draws with replacement can repeat an image within an epoch, on one rank
  or two, exactly as it would in one process.

The default sampler, ``uniform``, is left out of a run's configuration (see ``resolve_sampler``), so
the run ids recorded before samplers existed stay what they were.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ltbench.config import EmptyConfig, from_dict, join_path, to_dict
from ltbench.errors import ConfigError, short_repr
from ltbench.registry import SAMPLERS, RegistryError, call_plugin
from ltbench.seeding import derive_seed

DEFAULT_SAMPLER = "uniform"


@dataclass(frozen=True)
class SamplerContext:
    """What a sampler may know: the training labels and the schedule length (never the test set)."""

    labels: np.ndarray  # training label per image, int64
    num_classes: int
    epochs: int

    @property
    def class_counts(self) -> np.ndarray:
        return np.bincount(self.labels, minlength=self.num_classes)


class Sampler:
    """Base class: ``Config`` holds the recipe's ``sampler:`` options; ``epoch_order`` gives an epoch."""

    Config: ClassVar[type] = EmptyConfig
    registered_name: ClassVar[str] = "?"

    def __init__(self, cfg: Any, ctx: SamplerContext):
        self.cfg, self.ctx = cfg, ctx

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        """Indices into the training set, ``len(labels)`` of them, for epoch ``epoch`` (0-based)."""
        raise NotImplementedError

    def class_probabilities(self, epoch: int) -> np.ndarray | None:
        """The law the sampler draws classes from in ``epoch`` (None: not a class-level law). Recorded in
        tests and docs; samplers built on ``ClassLawSampler`` use it to draw."""
        return None


class ClassLawSampler(Sampler):
    """A sampler defined by a class distribution q_c(epoch): draw a class, then one of its images.

    Drawn stratified rather than i.i.d., so an epoch's class frequencies are the law up to rounding
    (class c appears round(n q_c) times, largest remainders, the sum exactly n), not up to sampling
    noise: each class's images come in a fresh random order, cycling when the class is drawn more often
    than it has images, and the epoch is then shuffled as a whole.
    """

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64(derive_seed(seed, "order", epoch)))
        quotas = class_quotas(self.class_probabilities(epoch), len(self.ctx.labels))
        members = self._members()
        parts = [_cycled(rng, members[c], int(q)) for c, q in enumerate(quotas) if q > 0]
        order = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return rng.permutation(order)

    def _members(self) -> list[np.ndarray]:
        if not hasattr(self, "_by_class"):
            labels = self.ctx.labels
            self._by_class = [np.flatnonzero(labels == c) for c in range(self.ctx.num_classes)]
        return self._by_class


def _cycled(rng: np.random.Generator, members: np.ndarray, quota: int) -> np.ndarray:
    """``quota`` images of one class: whole random permutations of its images, then part of one more."""
    if len(members) == 0:
        raise ValueError("a class with no training image was given a non-zero sampling probability")
    rounds = -(-quota // len(members))
    return np.concatenate([rng.permutation(members) for _ in range(rounds)])[:quota]


def class_quotas(probabilities: np.ndarray, n: int) -> np.ndarray:
    """n draws split over classes by ``probabilities``: floor of n p_c, the remainder to the largest
    fractional parts (ties to the lower class index), so the quotas sum to n exactly."""
    p = np.asarray(probabilities, dtype=np.float64)
    p = p / p.sum()
    exact = n * p
    quotas = np.floor(exact).astype(np.int64)
    short = n - int(quotas.sum())
    if short > 0:
        order = np.lexsort((np.arange(len(p)), -(exact - quotas)))
        quotas[order[:short]] += 1
    return quotas


def power_law(counts: np.ndarray, q: float) -> np.ndarray:
    """Kang et al.'s p_c = n_c^q / sum_k n_k^q (q = 1: instance-balanced, 1/2: square root, 0: class-balanced);
    classes with no training image get 0."""
    counts = np.asarray(counts, dtype=np.float64)
    weights = np.where(counts > 0, counts ** q, 0.0)
    return weights / weights.sum()


# ------------------------------------------------------------------------------------------------
# From a recipe's `sampler:` section to a sampler


def sampler_config(name: str, options: dict, where: str) -> Any:
    try:
        cls = SAMPLERS.get(name)
    except RegistryError as exc:
        raise ConfigError(f"{join_path(where, 'name')}: {exc}") from None
    return call_plugin(SAMPLERS.label(name), "Config / validate()", from_dict, cls.Config, options, where)  # plugin code


def _resolved(spec: Any, where: str) -> dict | None:
    """A ``{name, **options}`` mapping validated and defaulted; None when it is empty (not given)."""
    if spec is None or spec == {}:
        return None
    if not isinstance(spec, dict) or "name" not in spec:
        raise ConfigError(f"{where}: expected a mapping with a 'name' key, e.g. {{name: class_balanced}} "
                          f"(known: {', '.join(SAMPLERS.names())})")
    options = dict(spec)
    name = options.pop("name")
    if not isinstance(name, str):
        raise ConfigError(f"{join_path(where, 'name')}: expected a string, got {short_repr(name)}")
    return {"name": name, **to_dict(sampler_config(name, options, where))}


def resolve_sampler(given: Any, declared: Any, method_name: str, where: str = "sampler") -> dict:
    """The sampler a run uses, as it enters the run's configuration: always explicit, the default
    (uniform) included, so a table selector on ``sampler.name: uniform`` matches like any other value.

    ``given`` is the recipe's ``sampler:`` section (None or {} when absent); ``declared`` is the sampler
    the method says it needs (its ``sampler`` class attribute, or None). A recipe that names a sampler
    other than the one its method needs is refused (what the user typed must take effect).
    """
    chosen = _resolved(given, where)
    needed = _resolved(declared, f"method '{method_name}' (its declared sampler)")
    if needed is not None and chosen is not None and chosen != needed:
        raise ConfigError(f"{where}: method '{method_name}' needs sampler {short_repr(needed)}, but the recipe "
                          f"sets {short_repr(chosen)}; remove 'sampler:' for this method or set it to the method's")
    result = chosen if chosen is not None else needed
    return result if result is not None else _resolved({"name": DEFAULT_SAMPLER}, where)


def create_sampler(spec: dict, ctx: SamplerContext) -> Sampler:
    """A run's sampler from its resolved ``sampler`` section."""
    return SAMPLERS.build(spec, ctx, where="sampler")
