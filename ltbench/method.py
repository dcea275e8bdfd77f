"""The method interface: the long-tail-specific part of a run, and nothing else.

The engine owns data, backbone, optimiser, schedule, checkpoints and evaluation. A method owns its
head(s) (as submodules), its loss, the augmented views it needs per image, and a prediction that takes
a target class prior. See docs/adding-a-method.md.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
import torch.distributed as dist
import torch.nn as nn

from ltbench.config import EmptyConfig
from ltbench.registry import METHODS


@dataclass(frozen=True)
class MethodContext:
    """What a method may know about the run: training-set facts only, never the test set.

    Two class priors, on purpose: ``train_prior`` (and the method's ``log_train_prior`` buffer) is the
    training *set's* class frequencies, whatever the sampler: what "long-tailed" means and what the
    published formulas (LA, Balanced Softmax, LDAM margins, CB weights) are written in. ``sampled_prior(epoch)``
    is the class distribution the loss actually sees under the run's sampler. A prior correction belongs to
    the prior the loss is trained under: a logit-adjusted (or balanced) loss combined with a re-balancing
    sampler corrects twice if it uses ``log_train_prior`` (docs/adding-a-method.md, "Samplers and the prior")."""

    num_classes: int
    class_counts: torch.Tensor  # training images per class (int64)
    feature_dim: int  # backbone feature size
    epochs: int  # length of the schedule, for epoch-switched methods (DRW)
    # For methods that start from what a pretrained backbone knows (a classifier initialised from the
    # text embeddings of the class names, a zero-shot classifier): the dataset's registered name, its class
    # names (None when it has none) and the run's backbone (read it; the engine trains it).
    dataset: str | None = None
    class_names: tuple[str, ...] | None = None
    backbone: nn.Module | None = dataclasses.field(default=None, compare=False, repr=False)
    # The run's sampler's class law per epoch (Sampler.class_probabilities); None: the default sampler
    # (every image once per epoch), whose law is train_prior.
    sampling: Callable[[int], Any] | None = None

    @property
    def train_prior(self) -> torch.Tensor:
        counts = self.class_counts.double()
        return (counts / counts.sum()).float()

    def sampled_prior(self, epoch: int) -> torch.Tensor | None:
        """The class distribution of epoch ``epoch``'s draws under the run's sampler, float32 (K,):
        ``train_prior`` for the default (uniform over images), uniform over the classes with images for
        class_balanced, proportional to sqrt(n_c) for square_root, moving for progressive. None when the
        sampler does not declare its class law (``Sampler.class_probabilities``)."""
        law = self.train_prior if self.sampling is None else self.sampling(epoch)
        return None if law is None else torch.as_tensor(law, dtype=torch.float32)


def missed_epoch_start(started: int | None, epoch: int) -> bool:
    """Whether a ``loss`` call sees an epoch whose ``on_epoch_start`` did not run (a direct call, as in a test),
    so the method should catch up. Always False inside ``torch.compile``: the engine calls ``on_epoch_start``
    before every epoch, and a loss that compared Python ints there would make Dynamo guard on their values,
    compiling the loss again every epoch until its recompile limit, then running it eagerly for the rest of the
    run (tests/test_recompiles.py)."""
    return not torch.compiler.is_compiling() and epoch != started


class Method(nn.Module):
    """Base class of every method. Subclasses set ``Config`` and implement ``loss`` and ``predict``."""

    Config: ClassVar[type] = EmptyConfig
    registered_name: ClassVar[str] = "?"
    # The training sampler the method needs, as a recipe would write it (e.g. {"name": "class_balanced"}),
    # or None: the recipe's `sampler:` section decides (default uniform). A recipe naming another is refused.
    sampler: ClassVar[dict | None] = None
    # How a ``search:`` section tunes the method by default: option name -> distribution (ltbench/search.py),
    # from its paper's or official code's range, stated with the source in docs/methods.md. Not part of the
    # computation: changing it leaves finished runs current (results/code.py DECLARATIONS).
    search_space: ClassVar[dict] = {}

    def __init__(self, cfg: Any, ctx: MethodContext):
        super().__init__()
        self.cfg = cfg
        self.ctx = ctx
        self.num_classes = ctx.num_classes
        self.register_buffer("log_train_prior", torch.log(ctx.train_prior.clamp_min(1e-12)), persistent=False)

    @classmethod
    def idle_options(cls, cfg: Any) -> dict[str, str]:
        """Options of ``cfg`` that cannot act under its other options: {option: why, with the fix}. A recipe that
        gives one of them, and nowhere gives it a setting in which it acts, is refused at load (two run ids for
        one computation otherwise). Default: none."""
        return {}

    # -- the network ---------------------------------------------------------------------------
    @classmethod
    def build_model(cls, cfg: Any, backbone: nn.Module) -> nn.Module:
        """The network whose features this method takes, built from the run's backbone before the method.

        Default: the backbone itself. A multi-expert method returns ``ltbench.experts.MultiExpert(backbone,
        ...)`` (shared early stages, one branch per expert); the engine trains and checkpoints what is
        returned in the backbone's place, and ``ctx.feature_dim`` is its ``feature_dim``.
        """
        return backbone

    # -- training ------------------------------------------------------------------------------
    def views(self) -> list[str]:
        """Pipeline names (or dataset aliases) of the views the method wants per training image."""
        return list(getattr(self.cfg, "views", None) or ["default"])

    def loss(self, features: list[torch.Tensor], labels: torch.Tensor, *, epoch: int) -> dict[str, torch.Tensor]:
        """Backbone features of each view -> {'loss': scalar, optional 'logits' (for train accuracy), scalars to log}.
        Under train.compile this is compiled: keep epoch state out of it (``missed_epoch_start``)."""
        raise NotImplementedError

    def on_epoch_start(self, epoch: int) -> None:
        """Called before each training epoch (e.g. DRW switches its class weights here). It runs eagerly, also
        under train.compile: the place for a method's epoch bookkeeping."""

    def param_groups(self) -> list[dict] | None:
        """Optimizer parameter groups for the method's own parameters; None: one group, default settings."""
        return None

    # -- prediction ----------------------------------------------------------------------------
    def predict(self, features: torch.Tensor, *, target_prior: torch.Tensor | None = None) -> torch.Tensor:
        """Class scores for clean test features; ``target_prior`` (None: uniform) is the test class prior."""
        raise NotImplementedError

    def head_predictions(
        self, features: torch.Tensor, *, target_prior: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """Scores of individual heads, when the prediction combines several (reported separately)."""
        return {}

    # -- test-time adaptation (optional) -------------------------------------------------------
    def test_time_views(self) -> list[str]:
        """Views of the *unlabeled* test images the method adapts on before predicting each test set
        (e.g. two augmentations for a self-supervised objective); [] (the default): no adaptation."""
        return []

    def adapt(self, views: list[torch.Tensor]) -> dict:
        """Adapt to one test set from its images' features under ``test_time_views()`` (no labels). Called
        before ``predict`` on that set; returns JSON data recording what was learned (result.json).
        ``views`` is a ``TestTimeViews``: one (N, feature_dim) tensor per view, and ``views.redraw(epoch)``
        for the same views augmented afresh, for a method that makes several passes (SADE's official code
        draws new augmentations every pass)."""
        return {}

    def reset_adaptation(self) -> None:
        """Forget what ``adapt`` learned: the next test set starts from the trained model."""

    def target_shift(self, target_prior: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        """log(K * p_t) per class: the Bayes correction from balanced scores to target prior p_t.

        Exactly zero for None or a uniform prior (so balanced scores are returned unchanged); otherwise
        ``p_t`` is normalised and clamped at 1e-12. Add it to scores that estimate log p(x|y) + const.
        """
        k = self.num_classes
        if target_prior is None:
            return torch.zeros(k, device=like.device, dtype=like.dtype)
        p = target_prior.to(device=like.device, dtype=torch.float64)
        if bool((p == p[0]).all()):
            return torch.zeros(k, device=like.device, dtype=like.dtype)
        p = p / p.sum()
        return (torch.log(p.clamp_min(1e-12)) + math.log(k)).to(like.dtype)

    # -- what a second stage may use (optional) ------------------------------------------------
    def feature_spaces(self) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        """Extra feature spaces the method exposes to stage-2 methods, by name: each maps backbone
        features (N, d) to (N, p) (e.g. a projection head's output). Why declared here: the core caches
        whatever a method declares (ltbench/stage2/features.py) without knowing any method, and a stage-2 method
        asks for a space by name (``posthoc.SplitInputs.space``), refused clearly when the run's method
        does not provide it. Names are identifiers other than ``features`` and ``labels``; default: none."""
        return {}

    # -- state ---------------------------------------------------------------------------------
    def extra_state(self) -> dict:
        """Non-tensor state to checkpoint (tensors registered as buffers are saved already)."""
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    def result_extras(self) -> dict:
        """JSON-able data to add to the run's result (e.g. per-class statistics)."""
        return {}

    # -- distributed ---------------------------------------------------------------------------
    @staticmethod
    def all_gather(t: torch.Tensor) -> torch.Tensor:
        """Concatenate ``t`` from every process along dim 0 (identity when not distributed).

        Methods with global state (class statistics) call this on what they accumulate, so that
        every process keeps the same state.
        """
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return t
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts, 0)


class TestTimeViews(list):
    """Features of one test source's images under each of ``Method.test_time_views()`` (a list of (N, d)
    tensors: the draw of test-time epoch 0), plus ``redraw(epoch)``: the same views augmented afresh for a
    later pass. Why a list: a method that adapts once reads it as the plain list it always was. Each image's
    augmentation is seeded by (run seed, source, epoch, index), as training views are by (seed, epoch,
    index), so a redraw is reproducible and independent of batching; epoch 0 is the first draw."""

    __test__ = False  # not a pytest class

    def __init__(self, first: list[torch.Tensor], draw: Callable[[int], list[torch.Tensor]] | None = None):
        super().__init__(first)
        self._draw = draw

    def redraw(self, epoch: int) -> list[torch.Tensor]:
        """The views of test-time epoch ``epoch`` (epoch 0, or no redraw available: the first draw)."""
        return list(self) if epoch == 0 or self._draw is None else self._draw(epoch)


def create_method(spec: dict, ctx: MethodContext, where: str = "method") -> Method:
    """Build a method from ``{'name': ..., **hyper-parameters}`` (also used to build auxiliary methods)."""
    return METHODS.build(spec, ctx, where=where)


def build_method_model(spec: dict, backbone: nn.Module, where: str = "method") -> nn.Module:
    """The method's ``build_model`` on the run's backbone (the backbone itself for most methods)."""
    name = spec["name"]
    model = METHODS.get(name).build_model(METHODS.config(spec, where), backbone)
    if not isinstance(getattr(model, "feature_dim", None), int):
        raise TypeError(f"method {name}: build_model() must return a module with an int feature_dim")
    return model


def resolved_method_spec(spec: dict, where: str = "method") -> dict:
    return METHODS.resolved(spec, where)
