"""bape_refit: BAPE's classifier recomputed in closed form from frozen features, under any prior and DA.

Why it is cheap: BAPE's class parameters are a MAP estimate from sufficient statistics (count and mean
unit feature per class) under a conjugate vMF prior (Du et al., "BAPE: Learning an Explicit Bayes
Classifier for Long-tailed Visual Recognition", arXiv 2506.23280; docs/bape.md). So a new alpha_hat,
beta_hat, prior on/off, distribution-adjustment (DA) mode or kappa solver is a few milliseconds of
arithmetic, not a training run.

The classifier is a ``BAPE`` instance built with the refit settings, so every score goes through
``BAPE.class_scores`` (methods/bape.py), the one place a BAPE score is computed:
* a BAPE run: its projection head, its learned prior directions m0 and, with ``statistics: run``, its own
  training statistics (cumulative over every epoch and view); with ``statistics: features`` the statistics
  of the cached clean-view z of the training set (each image counted once);
* any other run: the L2-normalised backbone features are the unit features (p = feature size), the
  statistics are theirs, and m0 is by default the run's normalised linear-head weights (learned class
  directions in the same space, as BAPE's m0 is learned), or a simplex ETF drawn from the stage-2 seed
  (``prior_dirs: etf``). That is a closed-form vMF Bayes classifier on frozen features. Why not the ETF by
  default: ReLU features are non-negative, so their unit vectors share one orthant and a random ETF
  direction points away from every class; on Fashion-MNIST-LT CE features the ETF prior at alpha_hat 40
  gives 29% where the head directions give 71% (docs/posthoc.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from ltbench.config import check_range
from ltbench.errors import LtbenchError
from ltbench.method import MethodContext, create_method
from ltbench.posthoc import FrozenRun, PosthocMethod, SplitInputs
from ltbench.registry import POSTHOC

from ._vmf import simplex_etf, spread_directions
from .bape import BAPE
from .posthoc_linear import linear_head


@dataclass
class BapeRefitConfig:
    alpha_hat: float = 40.0
    """Prior pseudo-count per training image (alpha0_y = alpha_hat N_y); 0: no prior (maximum likelihood)."""
    beta_ratio: float = 0.2
    """beta_hat / alpha_hat, the prior's mean resultant length R0 (beta_hat = beta_ratio * alpha_hat); < 1."""
    da_mode: Literal["none", "shared_kappa", "map_test_prior", "debiased"] = "shared_kappa"
    """Distribution adjustment at prediction (docs/bape.md)."""
    kappa_solver: Literal["sra", "newton"] = "sra"
    """kappa = A_p^-1(R) by Sra's approximation (the paper's) or the exact root (Newton)."""
    statistics: Literal["features", "run"] = "features"
    """Class statistics from the cached clean training features, or the BAPE run's own (BAPE runs only)."""
    prior_dirs: Literal["auto", "etf", "head"] = "auto"
    """m0. 'auto': the BAPE run's learned m0; for other runs the normalised rows of their trained linear head
    (an ETF when there is none). 'etf': a simplex ETF from the stage-2 seed. 'head': non-BAPE runs only."""
    ensemble: Literal["bape", "sum"] = "bape"
    """'bape' alone, or 'sum': + the run's balanced linear scores (a BAPE run: its auxiliary method's)."""
    max_kappa: float = 1e5
    """Upper clamp of kappa (a class seen once without a prior has R = 1)."""

    def validate(self) -> None:
        check_range("alpha_hat", self.alpha_hat, 0, 1e12)
        check_range("beta_ratio", self.beta_ratio, 0, 1, high_open=True)
        check_range("max_kappa", self.max_kappa, 1e-6, 1e12, low_open=True)


def unit_features(frozen: FrozenRun, inputs: SplitInputs) -> torch.Tensor:
    """BAPE's z for a BAPE run, else the L2-normalised backbone features."""
    if isinstance(frozen.method, BAPE):
        return inputs.z.float()
    return F.normalize(inputs.features.float(), dim=1)


def refit_spec(cfg: BapeRefitConfig, frozen: FrozenRun, dim: int) -> dict:
    """The BAPE method config of the refit classifier (the run's own, for a BAPE run, with the refit settings)."""
    if isinstance(frozen.method, BAPE):
        spec = dict(frozen.config["method"])
    else:  # only the classifier is used: a minimal projection and a CE auxiliary that never trains
        spec = {"name": "bape", "aux": {"name": "ce"}, "proj_dim": dim, "hidden_dim": 1}
    prior = cfg.alpha_hat > 0
    spec.update(alpha_hat=cfg.alpha_hat if prior else 1.0, beta_hat=cfg.alpha_hat * cfg.beta_ratio if prior else 0.0,
                prior=prior, da_mode=cfg.da_mode, kappa_solver=cfg.kappa_solver, max_kappa=cfg.max_kappa)
    return spec


@POSTHOC.register("bape_refit")
class BapeRefit(PosthocMethod):
    """BAPE's MAP vMF classifier recomputed from statistics of frozen features (module doc)."""

    Config = BapeRefitConfig

    def fit(self) -> None:
        frozen, cfg = self.frozen, self.cfg
        is_bape = isinstance(frozen.method, BAPE)
        if not is_bape and (cfg.statistics == "run"):
            raise LtbenchError(f"bape_refit: statistics 'run' needs a BAPE run; run {frozen.run_id} is "
                               f"'{frozen.config['method']['name']}' (use statistics: features)")
        if is_bape and cfg.prior_dirs == "head":
            raise LtbenchError("bape_refit: prior_dirs 'head' is for non-BAPE runs (a BAPE run's z is not in the "
                               "linear head's space); use auto or etf")
        train_unit = unit_features(frozen, frozen.train)
        dim = train_unit.shape[1]
        ctx = frozen.method.ctx if is_bape else MethodContext(frozen.num_classes, frozen.class_counts, dim, 1)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.clf = create_method(refit_spec(cfg, frozen, dim), ctx, where="posthoc")
        if is_bape:
            self.clf.load_state_dict(frozen.method.state_dict())
        self.set_prior_dirs(dim)
        if cfg.statistics == "features":
            self.clf.stats.reset()
            self.clf.stats.update(train_unit, frozen.train.labels)
        self.clf.eval()
        self.clf.class_params = self.memoized(self.clf.class_params)

    @staticmethod
    def memoized(class_params):
        """``BAPE.class_params`` computed once per (DA mode, target prior when the mode uses it): the
        statistics are frozen, so every split and prior reuses one MAP estimate (Newton's kappa costs
        tens of milliseconds); ``BAPE.class_scores`` still computes every score."""
        cache: dict = {}

        def cached(da_mode="none", target_prior=None, stats=None):
            prior_key = None if da_mode != "map_test_prior" or target_prior is None else tuple(target_prior.tolist())
            key = (da_mode, prior_key, id(stats))
            if key not in cache:
                cache[key] = class_params(da_mode, target_prior, stats)
            return cache[key]

        return cached

    @torch.no_grad()
    def set_prior_dirs(self, dim: int) -> None:
        """m0 per ``prior_dirs`` (module doc); ``self.prior_dirs`` records what was used."""
        k, how = self.num_classes, self.cfg.prior_dirs
        if how == "auto":
            how = "run" if isinstance(self.frozen.method, BAPE) else "head" if self.has_head() else "etf"
        self.prior_dirs = how
        if how == "run":
            return  # the BAPE run's learned m0, loaded with its state
        if how == "head":
            self.clf.m0.copy_(F.normalize(linear_head(self.frozen).weight.float(), dim=1))
            return
        gen = torch.Generator().manual_seed(self.seed)
        dirs = simplex_etf(k, dim, generator=gen) if k - 1 <= dim else spread_directions(k, dim, generator=gen)
        self.clf.m0.copy_(dirs.float())

    def has_head(self) -> bool:
        try:
            linear_head(self.frozen)
            return True
        except LtbenchError:
            return False

    @torch.no_grad()
    def predict(self, inputs: SplitInputs, *, target_prior=None):
        z = self.units(inputs)
        shift = self.clf.target_shift(target_prior, z)
        (scores,), _ = self.clf.class_scores([z], self.cfg.da_mode, target_prior, shift)
        if self.cfg.ensemble == "sum":
            method = self.frozen.method
            base = method.aux if isinstance(method, BAPE) else method
            uniform = torch.full((self.num_classes,), 1.0 / self.num_classes)
            scores = scores + base.predict(inputs.features.float(), target_prior=uniform).float()
        return scores

    def units(self, inputs: SplitInputs) -> torch.Tensor:
        """The split's unit features, normalised once per split (a split is predicted under several priors)."""
        cache = self.__dict__.setdefault("_units", {})
        key = id(inputs.features)
        if key not in cache:
            cache[key] = (inputs.features, unit_features(self.frozen, inputs))  # keeps the key's tensor alive
        return cache[key][1]

    @torch.no_grad()
    def result_extras(self) -> dict:
        _, kappa = self.clf.class_params("none")
        _, kappa_da = self.clf.class_params(self.cfg.da_mode, None)
        return {"prior_dirs": self.prior_dirs, "kappa": kappa.tolist(), "kappa_da_uniform": kappa_da.tolist(),
                "mean_norm": self.clf.stats.mean.norm(dim=1).tolist(), "n": self.clf.stats.count.tolist()}
