"""ProCo: probabilistic contrastive learning with per-class von Mises-Fisher distributions.

Paper: Du, Wang, Song, Huang, "Probabilistic Contrastive Learning for Long-Tailed Visual Recognition"
(TPAMI 2024, arXiv 2403.06726); official code LeapLabTHU/ProCo (``ProCo_cifar/loss/proco.py``). The vMF
numerics (log C_p, Sra's κ, the running class means) are BAPE's, shared from ``methods/_vmf.py``.

Per contrastive view, with unit projections z (B, p), class means z̄_y of the window (previous + current
epoch, updated with this batch first) and T the temperature:
    κ_y = Sra(|z̄_y|) = p R/(1 - R²),  μ_y = z̄_y/|z̄_y|,
    logit_{n,y} = log C_p(κ_y) - log C_p(|κ_y μ_y + z_n / T|),
the closed form of E_{z'~vMF(μ_y, κ_y)}[exp(z_nᵀz'/T)] (up to a constant), i.e. the contrastive loss over
infinitely many samples. The ProCo loss is the logit-adjusted CE of these logits, averaged over the views;
the total is LA-CE(classifier, first view) + α · ProCo. Prediction: the classifier alone (as the official
``validate``). A class with no feature in the window has mean 0 (κ 1e-6, the uniform density) or, with
``unseen: official``, the official random direction of length 0.9. Where ltbench differs from the official
code, and by how much: docs/protocols.md §8.2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F

from ltbench.config import check_range, check_views
from ltbench.method import Method, missed_epoch_start
from ltbench.registry import METHODS
from ltbench.seeding import derive_seed

from ._heads import class_weight_norms
from ._twobranch import TwoBranch
from ._vmf import OnlineClassMeans, log_cp, sra_kappa


@dataclass
class ProCoConfig:
    alpha: float = 1.0
    """Weight of the ProCo loss: L = LA-CE + alpha * ProCo (official --alpha, 1.0)."""
    temperature: float = 0.1
    """T of the contrastive logits (official --temp, 0.1)."""
    proj_dim: int = 128
    """p, the sphere of the vMF distributions (official --feat_dim, 128)."""
    hidden_dim: int = 512
    """Hidden width of the projection MLP (official: 512 for ResNet-32, 2048 for ResNet-50)."""
    tau: float = 1.0
    """Prior exponent of both logit-adjusted losses (official LogitAdjust, tau 1)."""
    head: Literal["linear", "cosine"] = "linear"
    """Classifier: linear (CIFAR) or s * cosine (official ImageNet-LT/iNat, --use_norm True)."""
    s: float = 30.0
    """Scale of the cosine classifier."""
    max_kappa: float = 1e5
    """Upper clamp of kappa (official 1e5)."""
    views: list[str] = field(default_factory=lambda: ["strong", "sim", "sim"])
    """First view: the classifier's; the others: the contrastive views (official: AutoAugment+Cutout, 2 x sim)."""
    unseen: Literal["zero", "official"] = "zero"
    """A class with no feature in the statistics window: mean 0 and kappa 1e-6, the uniform density ('zero');
    or, as the official EstimatorCV, a random direction with R = 0.9 redrawn at each epoch's reset, seeded
    per run ('official'; docs/protocols.md §8.2)."""

    def validate(self) -> None:
        check_range("alpha", self.alpha, 0, 1000)
        check_range("temperature", self.temperature, 0, 100, low_open=True)
        check_range("proj_dim", self.proj_dim, 2, 65536)
        check_range("hidden_dim", self.hidden_dim, 1, 65536)
        check_range("tau", self.tau, 0, 100)
        check_range("s", self.s, 0, 1000, low_open=True)
        check_range("max_kappa", self.max_kappa, 1e-3, 1e12)
        check_views(self.views)
        if len(self.views) < 2:
            raise ValueError(f"views: ProCo needs the classifier's view and at least one contrastive view, "
                             f"got {self.views}")


def proco_logits(z: torch.Tensor, mean: torch.Tensor, temperature: float, max_kappa: float) -> tuple:
    """ProCo's contrastive logits (B, K) for unit features z (B, p) and class means z̄ (K, p).

    Returns (logits float32, κ (K,) float64). The class parameters are statistics (no gradient); the
    gradient reaches z through |κ_y μ_y + z/T|: d/dκ̃ [-log C_p(κ̃)] = A_p(κ̃), as the official backward."""
    p = z.shape[1]
    mean = mean.detach().double()
    kappa = sra_kappa(mean.norm(dim=1), p, max_kappa=max_kappa)
    mu = F.normalize(mean, dim=1)
    with torch.autocast(device_type=z.device.type, enabled=False):
        tilde = (kappa[:, None] * mu)[None] + z.double()[:, None, :] / temperature  # (B, K, p)
        logits = log_cp(kappa, p)[None] - log_cp(tilde.norm(dim=2), p)
    return logits.float(), kappa


def unseen_directions(k: int, p: int, seed: int, reset: int) -> torch.Tensor:
    """The official EstimatorCV's mean for classes it has not seen: ``normalize(randn(K, p)) * 0.9`` in float32
    (so R = 0.9, κ = p·0.9/0.19), drawn anew at every reset. ``reset``: the epoch whose start drew it (-1: at
    construction); seeded by the run's ``unseen_seed`` and ``reset``, so a resumed run draws the same."""
    g = torch.Generator().manual_seed(derive_seed(seed, "proco_unseen", reset))
    return (F.normalize(torch.randn(k, p, generator=g), dim=1) * 0.9).double()


@METHODS.register("proco", display="ProCo")
class ProCo(Method):
    """Logit-adjusted classifier + ProCo's closed-form vMF contrastive loss (module doc)."""

    Config = ProCoConfig
    search_space = {"alpha": {"uniform": [0.5, 2.0]}, "temperature": {"log_uniform": [0.05, 0.2]}}  # around the official 1.0, 0.1 (docs/methods.md)

    def __init__(self, cfg: ProCoConfig, ctx):
        super().__init__(cfg, ctx)
        self.branches = TwoBranch(ctx, cfg.head, cfg.s, cfg.hidden_dim, cfg.proj_dim, cfg.tau)
        k, p = ctx.num_classes, cfg.proj_dim
        self.stats = OnlineClassMeans(k, p)  # previous + current epoch: the estimate the logits use
        self.stats_current = OnlineClassMeans(k, p)  # current epoch only
        self.register_buffer("stats_epoch", torch.tensor(-1, dtype=torch.long))
        if cfg.unseen == "official":  # drawn last, so the rest of the initialisation is that of 'zero'
            self.register_buffer("unseen_seed", torch.randint(0, 2**31, (), dtype=torch.long))
            self.register_buffer("unseen_mean", unseen_directions(k, p, int(self.unseen_seed), -1))

    def on_epoch_start(self, epoch: int) -> None:
        """ProCo's _hook_before_epoch: the window becomes the last epoch's statistics; a new epoch starts empty
        (officially with fresh random means for the classes it has not seen yet: they pass to the window here)."""
        self._epoch_started = epoch  # a host copy of the marker: loss() reads it without a device sync
        if epoch > int(self.stats_epoch):
            self.stats.count.copy_(self.stats_current.count)
            self.stats.mean.copy_(self.stats_current.mean)
            self.stats_current.reset()
            if self.cfg.unseen == "official":
                k, p = self.stats.mean.shape
                self.unseen_mean.copy_(unseen_directions(k, p, int(self.unseen_seed), epoch - 1))
            self.stats_epoch.fill_(epoch)

    def window_means(self) -> torch.Tensor:
        """The class means the contrastive logits use: the window's, where a class unseen in it has mean 0
        ('zero') or the official random direction of length 0.9 ('official')."""
        if self.cfg.unseen == "zero":
            return self.stats.mean
        return torch.where(self.stats.count[:, None] > 0, self.stats.mean, self.unseen_mean)

    @torch.no_grad()
    def update_statistics(self, z: torch.Tensor, labels: torch.Tensor) -> None:
        z, labels = self.all_gather(z.detach().contiguous()), self.all_gather(labels.contiguous())
        self.stats.update(z, labels)
        self.stats_current.update(z, labels)

    def loss(self, features, labels, *, epoch):
        cfg = self.cfg
        if missed_epoch_start(getattr(self, "_epoch_started", None), epoch):  # the engine calls on_epoch_start first
            self.on_epoch_start(epoch)
        b = len(labels)
        logits = self.branches.head(features[0])
        loss_ce = self.branches.la_loss(logits, labels)
        zs = self.branches.project(torch.cat(list(features))).split(b)[1:]  # one BatchNorm pass over all views
        losses, kappa = [], None
        for z in zs:  # official order: update with this view, then its logits
            self.update_statistics(z, labels)
            contrast, kappa = proco_logits(z, self.window_means(), cfg.temperature, cfg.max_kappa)
            losses.append(self.branches.la_loss(contrast, labels))
        loss_proco = torch.stack(losses).mean()
        return {"loss": loss_ce + cfg.alpha * loss_proco, "logits": logits.detach(),
                "loss_ce": loss_ce.detach(), "loss_proco": loss_proco.detach(),
                "kappa_mean": kappa.mean().float().detach()}

    def predict(self, features, *, target_prior=None):
        z = self.branches.head(features)
        return z + self.target_shift(target_prior, z)

    @torch.no_grad()
    def result_extras(self) -> dict:
        """Per-class κ of the last window (what the final contrastive logits used) and classifier norms."""
        kappa = sra_kappa(self.window_means().norm(dim=1), self.cfg.proj_dim, max_kappa=self.cfg.max_kappa)
        head = self.branches.head
        return {"kappa": kappa.cpu().tolist(),
                "weight_norm": class_weight_norms(head.cos if hasattr(head, "cos") else head)}
