"""BAPE: an explicit Bayes classifier with vMF class conditionals, trained beside an auxiliary method.

Paper: Du, Wang, Song, Huang, "BAPE: Learning an Explicit Bayes Classifier for Long-tailed Visual Recognition"
(arXiv 2506.23280); formulas and design choices: docs/bape.md. Numerics (log C_p, Sra's κ, ETF, MAP) live in
``methods/_vmf.py``; this module only wires them into the Method interface.

Model
-----
A projection head g = Linear(feat, hidden) → BatchNorm1d → ReLU → Linear(hidden, proj), L2-normalised, maps
backbone features h to z = g(h)/‖g(h)‖ ∈ S^{p-1}, p = proj_dim. Class y has a vMF density with mean direction μ_y
and concentration κ_y, estimated (never trained by gradient descent) from per-class running statistics
(count n_y, mean z̄_y of the detached BAPE-view features) by MAP under the conjugate prior (spec §2.4)

    α0_y = α̂0·N_y,  β0_y = β̂0·N_y,  S_y = β0_y m0_y + n_y z̄_y,  μ_y = S_y/‖S_y‖,  R_y = ‖S_y‖/(α0_y + n_y),
    κ_y = p R_y / (1 − R_y²)   (clamped to [1e-6, max_kappa]),

N_y = training images of class y, m0_y = the learnable prior direction (renormalised every forward pass).
With ``prior: false`` it is plain maximum likelihood (S_y = n_y z̄_y, R_y = ‖z̄_y‖).

Training logits of a BAPE view (Eq. 6, sign convention of ``_vmf.log_cp``):

    ℓ_y(z) = log π_y^train + log C_p(κ_y) + κ_y μ_yᵀz,
    L = ½ Σ_{v ∈ 2 BAPE views} CE(ℓ(z_v), y) + η · L_aux,

where L_aux is the auxiliary method's own ``loss`` on its views (default: ``la``, logit-adjusted CE on a linear
head). The statistics are updated with both BAPE views of the step (all-gathered under DDP) *before* μ, κ are
computed, so every image adds 2 to n_y per epoch. (ProCo interleaves: update with view 1, logits of view 1,
update with view 2, logits of view 2; here both views use the estimate after both updates — one MAP per step.)

Gradient flow
-------------
* backbone and projection head: through z in both losses (∂ℓ_y/∂z = κ_y μ_y) and through h in L_aux;
* statistics (n, z̄): detached, updated in ``torch.no_grad``;
* m0: through μ_y and κ_y (``kappa_grad: true``) or through μ_y only (``kappa_grad: false``: κ is detached, so
  the log C_p(κ) term gives no gradient either); excluded from weight decay by ``param_groups``;
* the auxiliary method's parameters: only through η·L_aux.
The BAPE classifier runs in float32/float64 even under bf16 autocast (κ ≈ 10²–10³ makes bf16 logits useless).

Prediction (clean view, target prior p_t; s(z) = the class-conditional scores after distribution adjustment)
------------------------------------------------------------------------------------------------------------
    s_y(z) = log C_p(κ'_y) + κ'_y μ'_yᵀz,          (μ', κ') = DA(μ, κ; da_mode, p_t)
    shift_y = log(K · p_t,y)                       (normalised p_t; exactly 0 for None or a uniform prior)

    ensemble 'bape': s(z) + shift
    ensemble 'aux' : aux.predict(h, target_prior=p_t)                      (the aux method's own rule)
    ensemble 'sum' : aux.predict(h, target_prior=uniform) + s(z) + shift   (default)

'sum' adds the target-prior term exactly once: the aux part is the aux method's *balanced* score (its prediction
under the uniform prior; for ``la`` the raw head logits), BAPE contributes the log-likelihood, and log(K·p_t) is the
Bayes correction (the constant log K makes the uniform-prior scores free of any prior term, as in ``la``). So for
a uniform test prior 'bape' = plain training logits − log π_train. ``head_predictions`` reports 'aux' and 'bape'
(and the aux method's own heads as 'aux_<name>').

Distribution adjustment ``da_mode`` (test time; also in training with ``da_train``)
-----------------------------------------------------------------------------------
* ``none``: (μ', κ') = (μ, κ). Pure label-shift Bayes rule: the class conditionals are those learned, only the
  prior changes. Promises: uniform p_t gives training logits − log π_train; for any two priors the scores differ
  by exactly log p_t − log p_t' (prior-consistent); p_t = π_train gives the training posterior (+ log K).
* ``shared_kappa`` (spec DA-A, default): κ'_y = κ̄ = mean_y κ_y, μ' = μ. Then s_y = const + κ̄ μ_yᵀz: a cosine
  classifier over the BAPE means with a common scale (the "post-hoc normalisation" reading of the paper).
  Promises: prior-consistent; identical to ``none`` when all κ_y are already equal; otherwise it changes the
  prediction even when p_t = π_train.
* ``map_test_prior`` (spec DA-B): re-run the MAP with pseudo-counts Ñ_y = N_total·p_t,y in place of N_y (data
  statistics unchanged). Promises: p_t = π_train gives exactly ``none`` (Ñ = N); uniform p_t gives every class the
  same prior strength, which pulls tail (μ, κ) towards (m0, κ0). With ``prior: false`` it equals ``none``. Not
  prior-consistent: the class conditionals themselves depend on p_t.
* ``debiased`` (ours): finite-sample correction of the resultant length. For N i.i.d. unit vectors with
  ‖E z‖ = R, E‖z̄‖² = R² + (1 − R²)/N exactly, so R̂² = ‖z̄‖² − (1 − ‖z̄‖²)/(N − 1) is unbiased. The running mean
  of class y averages augmented views of only N_y distinct images, so its length overstates the concentration of
  unseen images, most for the tail (this is the over-concentration DA is meant to fix). The mode rescales z̄_y to
  length sqrt(max(R̂², 0)) with N = N_y (z̄ unchanged when N_y < 2), then runs the same MAP. Promises:
  prior-consistent (p(z|y) does not depend on the test prior, as label shift assumes); a class with many images
  is practically unchanged (the correction is O(1/N_y)); κ'_y ≤ κ_y for every class (the MAP R is increasing in
  ‖z̄‖); independent of the target prior.

``da_train: true`` (the paper's Table-5 "train + test" row) applies the same adjustment to the training logits,
computed for the uniform target prior (balanced test sets); the logits keep log π_train. With ``none`` it does
nothing.

Statistics window: ``cumulative`` (default) keeps every feature since the start of training; ``proco_two_epoch``
keeps ProCo's pair: at each epoch start old ← current, current ← empty; both are updated every step and the
logits (and predictions) use old, i.e. the previous and the current epoch. The epoch of the last rotation is a
buffer, so a mid-epoch resume (which calls ``on_epoch_start`` again for the same epoch) does not rotate twice.
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
from ltbench.method import Method, create_method, resolved_method_spec
from ltbench.registry import METHODS

from ._vmf import OnlineClassMeans, log_cp, map_estimate, simplex_etf, spread_directions

DA_MODES = ("none", "shared_kappa", "map_test_prior", "debiased")


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
    """Distribution adjustment at prediction (module docstring gives each formula and what it promises)."""
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


@METHODS.register("bape")
class BAPE(Method):
    """Explicit vMF Bayes classifier (MAP-estimated) on a projection head, plus an auxiliary method (module doc)."""

    Config = BAPEConfig

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
        if epoch > int(self.stats_epoch):
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
                                 use_prior=cfg.prior, max_kappa=cfg.max_kappa)
        if not cfg.kappa_grad:
            kappa = kappa.detach()
        if da_mode == "shared_kappa":
            kappa = kappa.mean().expand_as(kappa)
        return mu, kappa

    def debiased_mean(self, mean: torch.Tensor) -> torch.Tensor:
        """z̄ rescaled to the unbiased resultant length from N_y distinct images (module doc, 'debiased')."""
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

    def bape_logits(self, z: torch.Tensor, log_prior: torch.Tensor | None = None,
                    da_mode: str = "none", target_prior: torch.Tensor | None = None) -> torch.Tensor:
        """Training-form logits log π_y + log C_p(κ_y) + κ_y μ_yᵀz for unit features z (π = training prior)."""
        mu, kappa = self.class_params(da_mode, target_prior)
        log_prior = self.log_train_prior if log_prior is None else log_prior
        return self.log_likelihoods(z, mu, kappa) + log_prior.to(device=z.device, dtype=torch.float32)

    @torch.no_grad()
    def update_statistics(self, z: torch.Tensor, labels: torch.Tensor) -> None:
        """Add one view's detached features (gathered over processes) to the running statistics."""
        z = self.all_gather(z.detach().contiguous())
        labels = self.all_gather(labels.contiguous())
        self.stats.update(z, labels)
        if self.cfg.stats_window == "proco_two_epoch":
            self.stats_current.update(z, labels)

    # -- training ------------------------------------------------------------------------------
    def loss(self, features, labels, *, epoch):
        cfg = self.cfg
        if epoch > int(self.stats_epoch):  # defensive: the engine calls on_epoch_start first
            self.on_epoch_start(epoch)
        n_aux = len(cfg.aux_views)
        if len(features) != n_aux + len(cfg.bape_views):
            raise ValueError(f"bape: expected {n_aux + len(cfg.bape_views)} views of features, got {len(features)}")
        aux_out = self.aux.loss(list(features[:n_aux]), labels, epoch=epoch)

        views = features[n_aux:]
        b = len(labels)
        z_all = self.project(torch.cat(list(views)))  # one pass: BatchNorm sees every BAPE view
        zs = z_all.split(b)
        for z in zs:  # statistics first, so this step's logits include this step's features
            self.update_statistics(z, labels)
        mu, kappa = self.class_params(cfg.da_mode if cfg.da_train else "none", None)
        scores = [self.log_likelihoods(z, mu, kappa) for z in zs]
        log_prior = self.log_train_prior.to(device=z_all.device, dtype=torch.float32)
        loss_bape = torch.stack([F.cross_entropy(s + log_prior, labels) for s in scores]).mean()
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
        bape_scores = torch.stack(scores).mean(0).detach()
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
        mu, kappa = self.class_params(self.cfg.da_mode, target_prior)
        return self.log_likelihoods(z, mu, kappa) + self.target_shift(target_prior, z)

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
            mu, kappa = self.class_params(mode, target_prior)
            bape = self.log_likelihoods(z, mu, kappa) + shift
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
            "kappa0": None if r0 is None else self.p * r0 / (1.0 - r0 * r0),
            "da_mode": cfg.da_mode,
            "da_train": cfg.da_train,
            "ensemble": cfg.ensemble,
            "stats_window": cfg.stats_window,
            "prior_dirs": self.prior_dirs,
            "notes": list(self.notes),
            "aux": self.aux.result_extras(),
        }
