"""BAPE: an explicit Bayes classifier with vMF class conditionals, trained beside an auxiliary method.

Paper: Du, Wang, Song, Huang, "BAPE: Learning an Explicit Bayes Classifier for Long-tailed Visual Recognition"
(arXiv 2506.23280). Every formula (MAP estimate, training logits, gradient flow, prediction rule, the four
distribution adjustments and what each promises, statistics windows) is in docs/bape.md; the numerics
(log C_p, Sra's κ, ETF, MAP) live in ``methods/_vmf.py``. This module wires them into the Method
interface, and ``BAPE.class_scores`` is the one place a BAPE score is computed.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from ltbench.config import check_range, check_views
from ltbench.errors import ConfigError, LtbenchError, short_repr
from ltbench.method import Method, create_method, missed_epoch_start, resolved_method_spec
from ltbench.registry import METHODS

from ._vmf import KAPPA_SOLVERS, OnlineClassMeans, log_cp, map_estimate, simplex_etf, spread_directions

DA_MODES = ("none", "shared_kappa", "map_test_prior", "debiased")
UNIT_SPACE = "z"  # the feature space BAPE exposes to stage 2 (Method.feature_spaces): its projected unit features


@dataclass
class BAPEConfig:
    aux: dict[str, Any] = field(default_factory=lambda: {"name": "la"})
    """Auxiliary method trained beside BAPE: any registered method with its own hyper-parameters,
    e.g. {name: la, tau: 1.0}. Its defaults are filled in at validation (so they are part of the run id)."""
    eta: float = 1.0
    """Weight of the auxiliary loss: L = L_BAPE + eta * L_aux."""
    hidden_dim: int = 512
    """Hidden width of the projection head (ResNet-50 recipes: 2048)."""
    proj_dim: int = 128
    """p, the dimension of the sphere the vMF classifier lives on (ResNet-50 recipes: 1024)."""
    alpha_hat: float = 40.0
    """Prior pseudo-count per training image: alpha0_y = alpha_hat * N_y (CIFAR 40, ImageNet-LT 20, iNat 10)."""
    beta_hat: float = 8.0
    """Prior resultant length per training image: beta0_y = beta_hat * N_y (CIFAR 8, ImageNet-LT 0.6, iNat 0.3)."""
    prior: bool = True
    """Use the conjugate prior (MAP); false: plain maximum likelihood (the ablation 'w/o Prior')."""
    stats_window: Literal["cumulative", "proco_two_epoch"] = "cumulative"
    """Which features the statistics hold: all since the start, or ProCo's previous + current epoch."""
    da_mode: Literal["none", "shared_kappa", "map_test_prior", "debiased"] = "shared_kappa"
    """Distribution adjustment at prediction (docs/bape.md gives each formula and what it promises)."""
    da_train: bool = False
    """Apply the distribution adjustment (for a uniform target) to the training logits too (Table 5 ablation)."""
    ensemble: Literal["sum", "bape", "aux"] = "sum"
    """Prediction: aux balanced scores + BAPE log-likelihoods + log(K p_t) ('sum'), or one head alone."""
    aux_views: list[str] = field(default_factory=lambda: ["strong"])
    """Views fed to the auxiliary method (as many as it asks for; the engine batches them first)."""
    bape_views: list[str] = field(default_factory=lambda: ["sim", "sim"])
    """Views whose projected features train BAPE and feed the statistics (each view adds 1 to n_y)."""
    max_kappa: float = 1e5
    """Upper clamp of kappa (a class seen once without a prior has R = 1)."""
    kappa_grad: bool = True
    """Let the gradient reach m0 through kappa as well as mu (false: kappa is detached)."""
    prior_dirs: Literal["etf", "spread"] = "etf"
    """Initial m0: simplex ETF (needs K-1 <= p; switches to 'spread' with a note otherwise) or spread directions."""
    kappa_solver: Literal["sra", "newton"] = "sra"
    """How kappa = A_p^{-1}(R) is solved: Sra's closed form (the paper's; about R^2/p relative too high) or
    Newton's method on the exact A_p (the maximum-likelihood root). Left out of the run id at 'sra'."""

    def __post_init__(self) -> None:
        # Normalising, not checking: the auxiliary method's defaults are filled in here, at construction,
        # so that they are part of the run id; validate() below only checks and never changes the config.
        if not isinstance(self.aux, dict) or not isinstance(self.aux.get("name"), str):
            raise ConfigError(f"method.aux: expected a mapping with a method 'name', got {short_repr(self.aux)}")
        if self.aux["name"] == "bape":
            raise ConfigError("method.aux: BAPE cannot be its own auxiliary method")
        try:
            self.aux = resolved_method_spec(self.aux, where="method.aux")
        except ConfigError:
            raise
        except LtbenchError as exc:  # unknown name: the registry's message lists the known ones
            raise ConfigError(f"method.aux: {exc}") from exc

    def validate(self) -> None:
        check_range("eta", self.eta, 0, 1000)
        check_range("hidden_dim", self.hidden_dim, 1, 65536)
        check_range("proj_dim", self.proj_dim, 2, 65536)
        check_range("alpha_hat", self.alpha_hat, 0, 1e12, low_open=True)
        check_range("beta_hat", self.beta_hat, 0, 1e12)
        if self.prior and not self.beta_hat < self.alpha_hat:
            raise ValueError(f"need beta_hat < alpha_hat (so that R < 1), got {self.beta_hat}, {self.alpha_hat}")
        check_views(self.aux_views, "aux_views")
        check_views(self.bape_views, "bape_views")
        check_range("max_kappa", self.max_kappa, 1e-6, 1e12, low_open=True)
        aux_cls = METHODS.get(self.aux["name"])
        if aux_cls.views is Method.views:  # the auxiliary method takes its views from its config
            wanted = len(self.aux.get("views") or ["default"])
            if wanted != len(self.aux_views):
                raise ValueError(f"aux_views names {len(self.aux_views)} view(s) but the auxiliary method "
                                 f"'{self.aux['name']}' takes {wanted}; give aux_views {wanted} name(s)")


@METHODS.register("bape", display="BAPE")
class BAPE(Method):
    """Explicit vMF Bayes classifier (MAP-estimated) on a projection head, plus an auxiliary method (docs/bape.md)."""

    Config = BAPEConfig
    search_space = {"alpha_hat": {"log_uniform": [10.0, 40.0]}, "beta_hat": {"log_uniform": [0.3, 8.0]}}  # the paper's per-dataset values inside (docs/methods.md)

    def __init__(self, cfg: BAPEConfig, ctx):
        super().__init__(cfg, ctx)
        k, p = ctx.num_classes, int(cfg.proj_dim)
        self.p = p
        self.notes: list[str] = []
        try:
            self.aux = create_method(dict(cfg.aux), ctx, where="method.aux")
        except ConfigError:
            raise
        except LtbenchError as exc:
            raise ConfigError(f"method.aux: {exc}") from exc
        if len(self.aux.views()) != len(cfg.aux_views):
            raise ConfigError(
                f"method.aux_views: the auxiliary method '{cfg.aux['name']}' takes {len(self.aux.views())} view(s), "
                f"but aux_views names {len(cfg.aux_views)}: {cfg.aux_views}"
            )
        self.proj = nn.Sequential(
            nn.Linear(ctx.feature_dim, cfg.hidden_dim),
            nn.BatchNorm1d(cfg.hidden_dim),
            nn.ReLU(inplace=True),
            nn.Linear(cfg.hidden_dim, p),
        )

        self.prior_dirs = cfg.prior_dirs
        if cfg.prior_dirs == "etf" and k - 1 > p:
            self.prior_dirs = "spread"
            note = (f"bape: K-1 = {k - 1} > p = {p}, so no simplex ETF exists; m0 is initialised with "
                    f"spread_directions (TSC-style, [Li2022a]) instead")
            self.notes.append(note)
            warnings.warn(note, stacklevel=2)
        if self.prior_dirs == "etf":
            m0 = simplex_etf(k, p)
        else:
            m0 = spread_directions(k, p)
        self.m0 = nn.Parameter(m0.float())

        self.stats = OnlineClassMeans(k, p)  # the statistics the classifier uses
        if cfg.stats_window == "proco_two_epoch":
            self.stats_current = OnlineClassMeans(k, p)  # ProCo's "current epoch" estimator
        self.register_buffer("stats_epoch", torch.tensor(-1, dtype=torch.long))  # last epoch started
        counts = ctx.class_counts.to(torch.float64)
        self.register_buffer("prior_count", counts.clamp_min(1.0), persistent=False)  # N_y (≥ 1)
        self.n_total = float(counts.sum())

    # -- views and parameters ----------------------------------------------------------------------
    def views(self) -> list[str]:
        return list(self.cfg.aux_views) + list(self.cfg.bape_views)

    def param_groups(self):
        return [{"params": [self.m0], "weight_decay": 0.0}] + list(self.aux.param_groups() or [])

    def on_epoch_start(self, epoch: int) -> None:
        self._epoch_started = epoch  # a host copy of the marker: loss() reads it without a device sync
        if epoch > int(self.stats_epoch):  # the buffer (checkpointed) is read once per epoch
            if self.cfg.stats_window == "proco_two_epoch":
                self.stats.count.copy_(self.stats_current.count)
                self.stats.mean.copy_(self.stats_current.mean)
                self.stats_current.reset()
            self.stats_epoch.fill_(epoch)
        self.aux.on_epoch_start(epoch)

    # -- the classifier ------------------------------------------------------------------------
    def project(self, h: torch.Tensor) -> torch.Tensor:
        """Backbone features -> unit vectors z on S^{p-1}."""
        return F.normalize(self.proj(h).float(), dim=1)

    def feature_spaces(self) -> dict:
        """The unit features z, cached for stage 2 under UNIT_SPACE (methods/posthoc_bape.py refits on them)."""
        return {UNIT_SPACE: self.project}

    def prior_directions(self) -> torch.Tensor:
        """m0 renormalised to unit rows (float32, differentiable)."""
        return F.normalize(self.m0, dim=1)

    def class_params(self, da_mode: str = "none", target_prior: torch.Tensor | None = None,
                     stats: OnlineClassMeans | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(μ (K,p), κ (K,)) in float64 from the statistics, after distribution adjustment ``da_mode``.

        ``target_prior`` matters only for 'map_test_prior' (None = uniform). Differentiable w.r.t. m0.
        """
        stats = self.stats if stats is None else stats
        cfg = self.cfg
        count, mean = stats.count, stats.mean
        prior_count = self.prior_count.to(count.device)
        if da_mode == "map_test_prior":
            k = self.num_classes
            if target_prior is None:
                pt = torch.full((k,), 1.0 / k, dtype=torch.float64, device=count.device)
            else:
                pt = target_prior.to(device=count.device, dtype=torch.float64)
                pt = pt / pt.sum()
            prior_count = self.n_total * pt
        elif da_mode == "debiased":
            mean = self.debiased_mean(mean)
        elif da_mode not in DA_MODES:
            raise ConfigError(f"method.da_mode: unknown mode {da_mode!r}; known: {', '.join(DA_MODES)}")
        mu, kappa = map_estimate(count, mean, self.prior_directions(), prior_count, cfg.alpha_hat, cfg.beta_hat,
                                 use_prior=cfg.prior, max_kappa=cfg.max_kappa,
                                 kappa_solver=cfg.kappa_solver)
        if not cfg.kappa_grad:
            kappa = kappa.detach()
        if da_mode == "shared_kappa":
            kappa = kappa.mean().expand_as(kappa)
        return mu, kappa

    def debiased_mean(self, mean: torch.Tensor) -> torch.Tensor:
        """z̄ rescaled to the unbiased resultant length from N_y distinct images (docs/bape.md, 'debiased')."""
        n_img = self.ctx.class_counts.to(device=mean.device, dtype=torch.float64)
        r2 = (mean * mean).sum(dim=1)
        unbiased = (r2 - (1.0 - r2) / (n_img - 1.0).clamp_min(1.0)).clamp_min(0.0)
        r2_new = torch.where(n_img >= 2, unbiased, r2)
        scale = torch.where(r2 > 0, torch.sqrt(r2_new / torch.where(r2 > 0, r2, torch.ones_like(r2))),
                            torch.zeros_like(r2))
        return mean * scale[:, None]

    def log_likelihoods(self, z: torch.Tensor, mu: torch.Tensor, kappa: torch.Tensor) -> torch.Tensor:
        """s_y(z) = log C_p(κ_y) + κ_y μ_yᵀz, (B, K) float32; class terms built in float64."""
        with torch.autocast(device_type=z.device.type, enabled=False):
            weight = (kappa[:, None] * mu).to(torch.float32)
            bias = log_cp(kappa, self.p).to(torch.float32)
            return z.float() @ weight.T + bias

    def class_scores(self, zs: list[torch.Tensor], da_mode: str, target_prior: torch.Tensor | None = None,
                     shift: torch.Tensor | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The one BAPE score, used by the loss, the prediction and every head: for each batch of unit
        features z in ``zs``, s_y(z) = log C_p(κ'_y) + κ'_y μ'_yᵀz (+ ``shift``_y), with (μ', κ') =
        DA(μ, κ; da_mode, p_t) estimated once for all batches (so a step's views share one MAP and one
        gradient path to m0). Returns (the scores, κ')."""
        mu, kappa = self.class_params(da_mode, target_prior)
        scores = [self.log_likelihoods(z, mu, kappa) for z in zs]
        if shift is not None:
            scores = [s + shift for s in scores]
        return scores, kappa

    @torch.no_grad()
    def update_statistics(self, z: torch.Tensor, labels: torch.Tensor) -> None:
        """Add detached features (one or more views' rows, gathered over processes) to the running statistics."""
        z = self.all_gather(z.detach().contiguous())
        labels = self.all_gather(labels.contiguous())
        self.stats.update(z, labels)
        if self.cfg.stats_window == "proco_two_epoch":
            self.stats_current.update(z, labels)

    # -- training ------------------------------------------------------------------------------
    def loss(self, features, labels, *, epoch):
        cfg = self.cfg
        if missed_epoch_start(getattr(self, "_epoch_started", None), epoch):  # the engine calls on_epoch_start first
            self.on_epoch_start(epoch)
        n_aux = len(cfg.aux_views)
        if len(features) != n_aux + len(cfg.bape_views):
            raise ValueError(f"bape: expected {n_aux + len(cfg.bape_views)} views of features, got {len(features)}")
        aux_out = self.aux.loss(list(features[:n_aux]), labels, epoch=epoch)

        views = features[n_aux:]
        b = len(labels)
        z_all = self.project(torch.cat(list(views)))  # one pass: BatchNorm sees every BAPE view
        labels_all = labels.repeat(len(views))
        # Statistics first, so this step's logits include this step's features; each view adds 1 to n_y. All
        # views at once, and every view's scores in one product and one cross-entropy over all rows (the mean
        # of the per-view means, as each view has b rows): a third of the kernels of a per-view loop, equal
        # to it up to float rounding (tests/test_bape.py).
        self.update_statistics(z_all, labels_all)
        (scores_all,), kappa = self.class_scores([z_all], cfg.da_mode if cfg.da_train else "none")
        log_prior = self.log_train_prior.to(device=z_all.device, dtype=torch.float32)
        loss_bape = F.cross_entropy(scores_all + log_prior, labels_all)
        loss_aux = aux_out["loss"]
        out = {
            "loss": loss_bape + cfg.eta * loss_aux,
            "loss_bape": loss_bape.detach(),
            "loss_aux": loss_aux.detach(),
            "kappa_mean": kappa.detach().mean().float(),
        }
        for key, value in aux_out.items():
            if key not in ("loss", "logits") and torch.is_tensor(value) and value.numel() == 1:
                out[f"aux_{key}"] = value.detach().reshape(())
        # Train accuracy: the prediction rule under the uniform prior, on the training views.
        bape_scores = scores_all.detach().view(len(views), b, -1).mean(0)
        aux_logits = aux_out.get("logits")
        if cfg.ensemble == "bape" or aux_logits is None:
            out["logits"] = bape_scores
        elif cfg.ensemble == "aux":
            out["logits"] = aux_logits.detach()
        else:
            out["logits"] = aux_logits.detach().float() + bape_scores
        return out

    # -- prediction ----------------------------------------------------------------------------
    def bape_scores(self, features: torch.Tensor, target_prior: torch.Tensor | None = None) -> torch.Tensor:
        """BAPE's own prediction: s(z) after DA, + log(K p_t)."""
        z = self.project(features)
        (scores,), _ = self.class_scores([z], self.cfg.da_mode, target_prior, self.target_shift(target_prior, z))
        return scores

    def _uniform(self, like: torch.Tensor) -> torch.Tensor:
        return torch.full((self.num_classes,), 1.0 / self.num_classes, device=like.device, dtype=torch.float32)

    def predict(self, features, *, target_prior=None):
        if self.cfg.ensemble == "aux":
            return self.aux.predict(features, target_prior=target_prior).float()
        bape = self.bape_scores(features, target_prior)
        if self.cfg.ensemble == "bape":
            return bape
        return self.aux.predict(features, target_prior=self._uniform(features)).float() + bape

    def head_predictions(self, features, *, target_prior=None):
        """'aux', 'bape' (the configured DA mode), and the ensemble and BAPE head under *every* DA mode
        ('sum_da_<mode>', 'bape_da_<mode>'): DA is test-time only, so one trained model compares them all."""
        heads = {"aux": self.aux.predict(features, target_prior=target_prior).float(),
                 "bape": self.bape_scores(features, target_prior)}
        for name, scores in self.aux.head_predictions(features, target_prior=target_prior).items():
            heads[f"aux_{name}"] = scores
        aux_balanced = self.aux.predict(features, target_prior=self._uniform(features)).float()
        z = self.project(features)
        shift = self.target_shift(target_prior, z)
        for mode in DA_MODES:
            (bape,), _ = self.class_scores([z], mode, target_prior, shift)
            heads[f"bape_da_{mode}"] = bape
            heads[f"sum_da_{mode}"] = aux_balanced + bape
        return heads

    # -- state and results ---------------------------------------------------------------------
    def extra_state(self) -> dict:
        return {"aux": self.aux.extra_state()}  # statistics, m0 and the epoch marker are in state_dict()

    def load_extra_state(self, state: dict) -> None:
        self.aux.load_extra_state(state.get("aux", {}))

    @torch.no_grad()
    def result_extras(self) -> dict:
        cfg = self.cfg
        _, kappa = self.class_params("none")
        _, kappa_da = self.class_params(cfg.da_mode, None)
        r0 = cfg.beta_hat / cfg.alpha_hat if cfg.prior else None
        return {
            "kappa": kappa.cpu().tolist(),
            "kappa_da_uniform": kappa_da.cpu().tolist(),
            "mean_norm": self.stats.mean.norm(dim=1).cpu().tolist(),
            "n": self.stats.count.cpu().tolist(),
            "kappa0": None if r0 is None else KAPPA_SOLVERS[cfg.kappa_solver](torch.tensor(r0, dtype=torch.float64), self.p).item(),
            "da_mode": cfg.da_mode,
            "da_train": cfg.da_train,
            "ensemble": cfg.ensemble,
            "stats_window": cfg.stats_window,
            "prior_dirs": self.prior_dirs,
            "notes": list(self.notes),
            "aux": self.aux.result_extras(),
        }
