"""Stage-2 methods on a run's linear classifier: post-hoc logit adjustment, tau-normalisation, cRT, LWS.

Literature and settings (restated in docs/posthoc.md and docs/protocols.md §3):
* ``la_posthoc``: Menon et al., "Long-tail learning via logit adjustment", ICLR 2021: z - tau log pi.
* ``tau_norm``, ``crt``, ``lws``: Kang et al., "Decoupling representation and classifier for long-tailed
  recognition", ICLR 2020 (code: facebookresearch/classifier-balancing). tau-normalisation divides each
  class weight by ||w_j||^tau and drops the bias; cRT re-trains a freshly initialised linear classifier
  on frozen features with class-balanced sampling (10 epochs, SGD lr 0.2 cosine, momentum 0.9, weight
  decay 5e-4, batch 512); LWS keeps the classifier and learns one scale per class with the same sampling.

"The run's linear classifier" is the method's ``head`` (ce, la, la_posthoc, ...) or, for a BAPE run, its
auxiliary method's head. Every prediction here is a balanced score plus log(K p_t) under a target prior,
the rule of ``Method.target_shift``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ltbench.config import check_range
from ltbench.errors import LtbenchError
from ltbench.posthoc import FrozenRun, PosthocMethod, SplitInputs
from ltbench.registry import POSTHOC

from .la import log_prior_adjustment


def linear_head(frozen: FrozenRun) -> nn.Linear:
    """The run's trained linear classifier (the method's ``head``, or its auxiliary method's)."""
    for owner in (frozen.method, getattr(frozen.method, "aux", None)):
        head = getattr(owner, "head", None)
        if isinstance(head, nn.Linear):
            return head
    name = frozen.config["method"]["name"]
    raise LtbenchError(f"run {frozen.run_id}: method '{name}' has no linear classifier 'head' (nor does its "
                       f"auxiliary method); la_posthoc, tau_norm and lws need one, bape_refit and crt do not")


@dataclass
class TauConfig:
    tau: float = 1.0
    """la_posthoc: the strength of the prior correction; tau_norm: the power of the weight norm."""
    keep_bias: bool = False
    """tau_norm only: keep the head's bias (Kang et al. drop it; with it, tau = 0 is the plain head)."""

    def validate(self) -> None:
        check_range("tau", self.tau, 0, 100)


@POSTHOC.register("la_posthoc")
class PosthocLogitAdjustment(PosthocMethod):
    """The run's head logits z, minus tau log(pi + 1e-12) (google-research's form), plus log(K p_t)."""

    Config = TauConfig

    def predict(self, inputs: SplitInputs, *, target_prior=None):
        z = linear_head(self.frozen)(inputs.features).float()
        adjust = log_prior_adjustment(self.frozen.train_prior, self.cfg.tau).to(z)
        return z - adjust + self.target_shift(target_prior, z)


@POSTHOC.register("tau_norm")
class TauNormalisation(PosthocMethod):
    """Logits x . w_j / ||w_j||^tau (bias dropped unless keep_bias), plus log(K p_t)."""

    Config = TauConfig

    def predict(self, inputs: SplitInputs, *, target_prior=None):
        head = linear_head(self.frozen)
        w = head.weight.float()
        w = w / w.norm(dim=1, keepdim=True).pow(self.cfg.tau)
        z = inputs.features.float() @ w.T
        if self.cfg.keep_bias and head.bias is not None:
            z = z + head.bias.float()
        return z + self.target_shift(target_prior, z)

    def result_extras(self) -> dict:
        return {"weight_norm": linear_head(self.frozen).weight.float().norm(dim=1).tolist()}


@dataclass
class BalancedTrainingConfig:
    epochs: int = 10  # passes over the class-balanced samples of the frozen features
    lr: float = 0.2  # SGD learning rate (cosine schedule)
    batch_size: int = 512  # features per SGD step
    momentum: float = 0.9  # SGD momentum
    weight_decay: float = 5.0e-4  # L2 penalty on the refitted parameters

    def validate(self) -> None:
        check_range("epochs", self.epochs, 1, 10_000)
        check_range("lr", self.lr, 0, 100, low_open=True)
        check_range("batch_size", self.batch_size, 1, 1_000_000)
        check_range("momentum", self.momentum, 0, 1, high_open=True)
        check_range("weight_decay", self.weight_decay, 0, 1)


def class_balanced_order(labels: torch.Tensor, num_classes: int, gen: torch.Generator) -> torch.Tensor:
    """One epoch of class-balanced sampling (len(labels) draws): a class uniformly, then one of its
    images uniformly (classifier-balancing's class-aware sampler, one image per class draw)."""
    members = [torch.nonzero(labels == c).flatten() for c in range(num_classes)]
    present = torch.tensor([c for c in range(num_classes) if len(members[c])])
    classes = present[torch.randint(len(present), (len(labels),), generator=gen)]
    picks = torch.empty(len(labels), dtype=torch.long)
    for c in present.tolist():
        where = classes == c
        picks[where] = members[c][torch.randint(len(members[c]), (int(where.sum()),), generator=gen)]
    return picks


def train_balanced(module: nn.Module, logits_of, train: SplitInputs, cfg: BalancedTrainingConfig,
                   num_classes: int, seed: int) -> None:
    """SGD with a cosine schedule on class-balanced batches of cached features; seeded, so two fits
    with the same seed give the same classifier."""
    gen = torch.Generator().manual_seed(seed)
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    n = len(train)
    steps_per_epoch = max(1, -(-n // cfg.batch_size))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs * steps_per_epoch)
    x, y = train.features.float(), train.labels.long()
    for _ in range(cfg.epochs):
        order = class_balanced_order(y, num_classes, gen)
        for start in range(0, n, cfg.batch_size):
            idx = order[start:start + cfg.batch_size]
            loss = F.cross_entropy(logits_of(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()


@POSTHOC.register("crt")
class ClassifierRetraining(PosthocMethod):
    """cRT: a fresh linear classifier (seeded init) trained on frozen training features, class-balanced."""

    Config = BalancedTrainingConfig

    def fit(self) -> None:
        d = self.frozen.train.features.shape[1]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.head = nn.Linear(d, self.num_classes)
        with torch.enable_grad():
            train_balanced(self.head, self.head, self.frozen.train, self.cfg, self.num_classes, self.seed)
        self.head.eval()

    @torch.no_grad()
    def predict(self, inputs: SplitInputs, *, target_prior=None):
        z = self.head(inputs.features.float())
        return z + self.target_shift(target_prior, z)


@POSTHOC.register("lws")
class LearnableWeightScaling(PosthocMethod):
    """LWS: the run's head frozen, logits (x W^T + b) * s_j with one learnt scale per class (init 1)."""

    Config = BalancedTrainingConfig

    def fit(self) -> None:
        self.head = linear_head(self.frozen)
        self.scales = nn.Parameter(torch.ones(self.num_classes))
        holder = nn.Module()
        holder.scales = self.scales
        with torch.enable_grad():
            train_balanced(holder, self.scaled_logits, self.frozen.train, self.cfg, self.num_classes, self.seed)

    def scaled_logits(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            z = self.head(x).float()
        return z * self.scales

    @torch.no_grad()
    def predict(self, inputs: SplitInputs, *, target_prior=None):
        z = self.scaled_logits(inputs.features.float())
        return z + self.target_shift(target_prior, z)

    def result_extras(self) -> dict:
        return {"scales": self.scales.detach().tolist()}
