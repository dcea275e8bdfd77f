"""Numerics for the BAPE von Mises-Fisher (vMF) classifier. Pure torch (plus ``math``): nothing here imports
``ltbench`` or another ``methods`` module, so the maths can be tested on its own.

Sign convention (used everywhere in this module)
-------------------------------------------------
The vMF density on the unit sphere S^{p-1} is

    f(z | mu, kappa) = C_p(kappa) * exp(kappa * mu^T z),
    C_p(kappa)       = kappa^nu / ((2 pi)^{p/2} I_nu(kappa)),   nu = p/2 - 1.

``log_cp(kappa, p)`` is ``log C_p(kappa)``, the log of the density's *constant
factor*. Its derivative is ``-A_p(kappa)``.
The paper calls the reciprocal "C_p" (it writes the density as exp(.)/C_p):
``log ∫ exp(kappa mu^T z) dz = -log C_p(kappa)``, whose derivative is ``+A_p(kappa)``.

So the BAPE logit of class y is, without ambiguity,

    logit_y = log pi_y + log_cp(kappa_y, p) + kappa_y * mu_y^T z


A_p(kappa) = I_{p/2}(kappa) / I_{p/2-1}(kappa) is the mean resultant length of
a vMF(mu, kappa) sample; ``_log_iv_scaled_and_ratio`` returns it beside log I_nu (an accurate A_p for
a Newton solve of A_p(kappa) = R starts there). The test-only references (log I_nu, the normaliser,
A_p, Wood's sampler) live in tests/vmf_reference.py.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

__all__ = ["log_cp", "sra_kappa", "simplex_etf", "spread_directions", "map_estimate", "OnlineClassMeans"]

_F64 = torch.float64

# ---------------------------------------------------------------------------
# Bessel functions
# ---------------------------------------------------------------------------

# Debye polynomials u_k(t) of the uniform asymptotic expansion
#   I_nu(nu z) ~ exp(nu eta) / sqrt(2 pi nu) / (1+z^2)^{1/4} * sum_k u_k(t) / nu^k
# (DLMF 10.41.3 and 10.41.10), stored as (power of t, coefficient) pairs. They follow
# from u_{k+1} = t^2 (1-t^2) u_k'/2 + 1/8 ∫_0^t (1-5s^2) u_k(s) ds, u_0 = 1.
# u1..u4 are kept. Measured against mpmath over kappa in [1e-3, 1e5], the maximum
# absolute error in log I_nu is 3e-5 (u1,u2 only), 2.5e-6 (+u3), 1.8e-7 (+u4) at nu = 7,
# and 6e-9 (u1,u2), 8e-11 (+u3), 7e-12 (+u4) at nu = 40.
_DEBYE_U = (
    ((1, 3.0), (3, -5.0), 24.0),
    ((2, 81.0), (4, -462.0), (6, 385.0), 1152.0),
    ((3, 30375.0), (5, -369603.0), (7, 765765.0), (9, -425425.0), 414720.0),
    ((4, 4465125.0), (6, -94121676.0), (8, 349922430.0), (10, -446185740.0), (12, 185910725.0), 39813120.0),
)

# Below this order the truncated expansion loses accuracy (error ~ u5/nu^5). For a
# small nu we therefore evaluate the expansion at order nu + m >= _NU_MIN and recur
# downward, which is stable for I_nu.
_NU_MIN = 40.0


_SERIES_TABLES: dict = {}  # (nu, device) -> (exponents, coefficients): built once, not on every call


def _debye_series_table(nu: float, device: torch.device) -> Tuple[Tensor, Tensor]:
    """The powers j of t in sum_k u_k(t) / nu^(k+1) and their coefficients c_j = sum_k [t^j]u_k / nu^(k+1),
    float64 on ``device``, cached per (nu, device): built on the host, they would be copied (a host-device
    sync on a GPU) at every call."""
    key = (float(nu), torch.device(device))
    if key not in _SERIES_TABLES:
        coefficients: dict[int, float] = {}
        for k, (*terms, denom) in enumerate(_DEBYE_U):
            for power, coef in terms:
                coefficients[power] = coefficients.get(power, 0.0) + coef / denom / nu ** (k + 1)
        powers = sorted(coefficients)
        _SERIES_TABLES[key] = (torch.tensor(powers, dtype=_F64).to(device),
                               torch.tensor([coefficients[j] for j in powers], dtype=_F64).to(device))
    return _SERIES_TABLES[key]


def _debye_series(nu: float, t: Tensor) -> Tensor:
    """sum_k u_k(t) / nu^(k+1) as sum_j c_j t^j: one power and one matrix-vector product (plus their backward),
    where the term-by-term sum took about 60 small kernels forward for each order nu. Equal to it up to
    float64 rounding (the coefficients are summed before the powers are weighted; tests/test_vmf_math.py)."""
    powers, coefficients = _debye_series_table(nu, t.device)
    return (t.unsqueeze(-1) ** powers) @ coefficients


def _log_iv_scaled_debye(nu: float, kappa: Tensor) -> Tensor:
    """log I_nu(kappa) - nu*log(kappa), from the Debye expansion (nu > 0).

    The ``nu*log(kappa)`` term cancels analytically against the expansion's
    ``nu*log(z)``. That cancellation is what makes ``log_cp`` smooth at kappa -> 0.
    Its autograd derivative is -A_p directly, with no ``nu/kappa - nu/kappa`` round-off
    (at p=1024, kappa=1e-3 that difference would be 5e5 - 5e5 ≈ 1e-6).
    """
    z = kappa / nu
    s = torch.sqrt(1.0 + z * z)
    t = 1.0 / s
    series = _debye_series(nu, t)
    # nu*eta - nu*log(kappa), with eta = s + log(z/(1+s)) and log z = log kappa - log nu.
    nu_eta_reg = nu * (s - math.log(nu) - torch.log1p(s))
    return -0.5 * math.log(2.0 * math.pi * nu) + nu_eta_reg - 0.5 * torch.log(s) + torch.log1p(series)


def _log_iv_scaled_and_ratio(nu: float, kappa: Tensor, ratio: bool = True) -> Tuple[Tensor, Optional[Tensor]]:
    """Return (log I_nu(k) - nu log k, I_{nu+1}(k)/I_nu(k)), in float64, for nu > -1.

    If nu < _NU_MIN, start at the order N = nu + m >= _NU_MIN and apply the
    three-term recurrence I_{k-1} = I_{k+1} + (2k/kappa) I_k downward, written for
    g_k = log I_k - k log kappa and r_k = I_{k+1}/I_k:
        g_{k-1} = g_k + log(kappa r_k + 2k),   r_{k-1} = kappa / (kappa r_k + 2k).
    Every quantity is positive, so no precision is lost, and kappa -> 0 is regular.
    ``ratio=False`` (log C_p alone): when no recurrence is needed (nu >= _NU_MIN) the ratio, and with it the
    second expansion, is skipped and None returned; the log is the same, bit for bit.
    """
    m = max(0, math.ceil(_NU_MIN - nu))
    top = nu + m
    g_top = _log_iv_scaled_debye(top, kappa)
    if m == 0 and not ratio:
        return g_top, None
    g_next = _log_iv_scaled_debye(top + 1.0, kappa)
    g = g_top
    r = kappa * torch.exp(g_next - g_top)
    k = top
    for _ in range(m):
        denom = kappa * r + 2.0 * k
        g = g + torch.log(denom)
        r = kappa / denom
        k -= 1.0
    return g, r


def _as_f64(x) -> Tensor:
    if not torch.is_tensor(x):
        return torch.as_tensor(x, dtype=_F64)
    return x.to(_F64)


def log_cp(kappa: Tensor, p: int) -> Tensor:
    """log C_p(kappa) = nu log kappa - (p/2) log 2pi - log I_nu(kappa), with nu = p/2 - 1.

    C_p is the density's constant factor: f(z) = C_p(kappa) exp(kappa mu^T z). So the
    BAPE logit is ``log pi + log_cp(kappa) + kappa mu^T z``. d/dkappa log_cp = -A_p(kappa).
    Computed in float64 and smooth down to kappa = 0, where it is
    -log(area of S^{p-1}). Accurate to about 1e-10 absolute for p <= 2048 and
    kappa <= 1e5.
    """
    kappa = _as_f64(kappa)
    nu = p / 2.0 - 1.0
    g, _ = _log_iv_scaled_and_ratio(nu, kappa, ratio=False)
    return -g - (p / 2.0) * math.log(2.0 * math.pi)


def sra_kappa(r: Tensor, p: int, max_kappa: float = 1e5, min_kappa: float = 1e-6) -> Tensor:
    """Sra's (2012) approximate root of A_p(kappa) = R: kappa = p R / (1 - R^2), clamped.

    R >= 1 (e.g. a class seen once, with no prior) gives max_kappa, with no inf/NaN.
    """
    r = _as_f64(r).clamp(0.0, 1.0)
    denom = (1.0 - r * r).clamp_min(1e-300)
    return (p * r / denom).clamp(min_kappa, max_kappa)


def mean_resultant_length(kappa: Tensor, p: int) -> Tensor:
    """A_p(kappa) = I_{p/2}(kappa) / I_{p/2-1}(kappa): the expected |mean| of vMF(mu, kappa) samples on S^{p-1}."""
    _, ratio = _log_iv_scaled_and_ratio(p / 2.0 - 1.0, _as_f64(kappa))
    return ratio


def newton_kappa(r: Tensor, p: int, max_kappa: float = 1e5, min_kappa: float = 1e-6, steps: int = 12) -> Tensor:
    """The maximum-likelihood kappa, the root of A_p(kappa) = R, by Newton's method from Sra's start.

    Why: Sra's closed form overestimates the root by about R^2/p relative (p = 128, R = 0.87: +0.66%),
    which the BAPE paper accepts; this solves the equation itself. A_p is increasing and concave, so from
    Sra's overestimate the first step lands at or below the root and later steps climb to it monotonically
    with quadratic convergence; 12 steps are far more than needed (tested against mpmath to 1e-8).
    A_p'(k) = 1 - A_p^2 - (p-1) A_p / k. The iterations run without autograd; one last step is taken on the
    detached root, so the gradient reaching R is dkappa/dR = 1/A_p'(kappa) (implicit differentiation) and
    does not pass through the iterations. Clamped like ``sra_kappa``.
    """
    r = _as_f64(r).clamp(0.0, 1.0)
    with torch.no_grad():
        kappa = sra_kappa(r, p, max_kappa=max_kappa, min_kappa=min_kappa)
        for _ in range(steps):
            kappa = (kappa - _newton_step_size(kappa, r, p)).clamp(min_kappa, max_kappa)
    kappa = kappa - _newton_step_size(kappa, r, p)
    return kappa.clamp(min_kappa, max_kappa)


def _newton_step_size(kappa: Tensor, r: Tensor, p: int) -> Tensor:
    a = mean_resultant_length(kappa, p)
    slope = (1.0 - a * a - (p - 1) * a / kappa).clamp_min(1e-300)
    return (a - r) / slope


KAPPA_SOLVERS = {"sra": sra_kappa, "newton": newton_kappa}


# ---------------------------------------------------------------------------
# Prior directions m0
# ---------------------------------------------------------------------------


def _haar_orthonormal(rows: int, cols: int, generator: Optional[torch.Generator]) -> Tensor:
    """A (rows x cols) matrix with orthonormal columns, uniformly (Haar) distributed.

    QR of a Gaussian matrix, with the signs of R's diagonal folded in to make it Haar.
    """
    g = torch.randn(rows, cols, generator=generator, dtype=_F64)
    q, r = torch.linalg.qr(g)
    signs = torch.where(torch.diagonal(r) < 0, -1.0, 1.0).to(_F64)
    return q * signs


def simplex_etf(num_classes: int, dim: int, generator: Optional[torch.Generator] = None,
                dtype: torch.dtype = _F64) -> Tensor:
    """A random simplex equiangular tight frame (ETF) of shape (K, p). Needs p >= K-1.

    Rows are unit vectors with pairwise cosine -1/(K-1), the most spread-out
    arrangement of K directions. The paper uses it as the prior mean m0.
    - p >= K (the paper's formula): M = sqrt(K/(K-1)) U (I_K - 11^T/K), where U (p x K)
      has orthonormal columns (QR of a Gaussian). Row y of the result is column y of M.
    - p = K-1: U does not exist. The centred basis vectors e_y - 1/K span only the
      (K-1)-dim subspace orthogonal to 1, so we write them in an orthonormal basis B
      (K x (K-1)) of that subspace: rows of sqrt(K/(K-1)) B. These have the same Gram
      matrix (B B^T = I - 11^T/K). A random rotation Q then follows.
    For K-1 > p an exact ETF does not exist; use ``spread_directions``.
    """
    K, p = int(num_classes), int(dim)
    if K < 2:
        raise ValueError(f"simplex_etf needs num_classes >= 2, got {K}")
    if K - 1 > p:
        raise ValueError(f"simplex_etf needs dim >= num_classes - 1 (got K={K}, p={p}); "
                         "use spread_directions for K - 1 > p")
    scale = math.sqrt(K / (K - 1))
    centring = torch.eye(K, dtype=_F64) - torch.full((K, K), 1.0 / K, dtype=_F64)
    if p >= K:
        u = _haar_orthonormal(p, K, generator)  # (p, K)
        m = scale * u @ centring  # (p, K), columns are the directions
        out = m.T
    else:
        # The first K-1 left singular vectors of the centring matrix span 1-perp. (Its
        # eigenvalues are 1 (K-1 times) and 0.)
        basis = torch.linalg.svd(centring).U[:, : K - 1]  # (K, K-1)
        q = _haar_orthonormal(p, p, generator)
        out = scale * basis @ q.T
    # Normalising removes O(eps) drift; the ETF is unit-norm by construction.
    out = out / out.norm(dim=1, keepdim=True)
    return out.to(dtype)


def _spread_loss_and_grad(x: Tensor, temperature: float, chunk_size: int) -> Tuple[float, Tensor]:
    """Loss mean_i logsumexp_{j != i}(x_i.x_j / T) and its gradient w.r.t. x (unit rows).

    With E_ij = exp((x_i.x_j - 1)/T) (zero diagonal) and row sums Z_i, the loss is
    mean_i log Z_i + 1/T and dL/dx_i = sum_j E_ij (1/Z_i + 1/Z_j) x_j / (K T).
    Because |x_i.x_j| <= 1, the fixed shift of 1/T replaces the max of a logsumexp:
    E lies in [exp(-2/T), 1] = [4e-13, 1] for T = 0.07, which is safe in float32.
    E is symmetric, so only blocks (I, J) with I <= J are formed. A first pass
    accumulates Z, and a second recomputes each block for the gradient. That is
    2 K^2 p multiply-adds instead of 3, and a peak memory of chunk_size^2, not K^2.
    """
    K = x.shape[0]
    bounds = [(a, min(a + chunk_size, K)) for a in range(0, K, chunk_size)]

    def block(i0, i1, j0, j1):
        e = torch.exp((x[i0:i1] @ x[j0:j1].T - 1.0) / temperature)
        if i0 == j0:
            e.fill_diagonal_(0.0)
        return e

    z = torch.zeros(K, dtype=x.dtype)
    for bi, (i0, i1) in enumerate(bounds):
        for j0, j1 in bounds[bi:]:
            e = block(i0, i1, j0, j1)
            z[i0:i1] += e.sum(dim=1)
            if j0 != i0:
                z[j0:j1] += e.sum(dim=0)
    inv_z = 1.0 / z
    grad = torch.zeros_like(x)
    for bi, (i0, i1) in enumerate(bounds):
        for j0, j1 in bounds[bi:]:
            w = block(i0, i1, j0, j1)
            w *= inv_z[i0:i1, None] + inv_z[None, j0:j1]
            grad[i0:i1] += w @ x[j0:j1]
            if j0 != i0:
                grad[j0:j1] += w.T @ x[i0:i1]
    loss = float(torch.log(z).to(torch.float64).mean()) + 1.0 / temperature
    return loss, grad / (K * temperature)


def spread_directions(num_classes: int, dim: int, steps: Optional[int] = None,
                      generator: Optional[torch.Generator] = None, lr: float = 0.1, temperature: float = 0.07,
                      chunk_size: int = 2048, flop_budget: float = 1.5e12, dtype: torch.dtype = _F64) -> Tensor:
    """K well-spread unit vectors in R^p, for K-1 > p where no simplex ETF exists.

    TSC-style target generation (docs/bape.md, "Training": m0 initialisation; [Li2022a]): start from K random unit
    vectors and run Adam on the free vectors W (x = W/|W|), minimising
        L = mean_i logsumexp_{j != i}(x_i^T x_j / temperature).
    Return the normalised iterate with the lowest L seen.

    Cost: each step costs about 2 K^2 p multiply-adds, in float32, with the K x K
    similarity formed in chunk_size x chunk_size blocks (memory O(chunk_size^2 + K p),
    about 16 MB plus 33 MB of vectors for iNat). The TSC reference runs 10k steps at
    lr 1e-3 on a GPU. That is far too slow on a CPU for K=8142, p=1024: one step takes
    about 2.2 s on 2 cores. So ``steps=None`` picks
    ``min(2000, max(10, flop_budget / (2 K^2 p)))``, which is deterministic and gives
    11 steps (about 25-35 s) for iNat and 2000 steps for small problems. The default lr
    (0.1, on N(0, I)-initialised W) is larger than TSC's so that those few steps still
    move the vectors. Measured for iNat with 11 steps: mean nearest-neighbour cosine
    0.118 -> 0.096, max 0.166 -> 0.122 (the Welch bound is 0.029). For a better
    spread, pass ``steps`` explicitly and cache the result: it only has to be computed
    once per (K, p, seed).
    """
    K, p = int(num_classes), int(dim)
    if K < 2 or p < 1:
        raise ValueError(f"spread_directions needs num_classes >= 2 and dim >= 1, got K={K}, p={p}")
    if steps is None:
        steps = int(min(2000, max(10, flop_budget / (2.0 * K * K * p))))
    w = torch.randn(K, p, generator=generator, dtype=_F64).to(torch.float32)
    w.requires_grad_(True)
    opt = torch.optim.Adam([w], lr=lr)
    best_loss, best = math.inf, None
    for step in range(steps + 1):
        with torch.no_grad():
            norm = w.norm(dim=1, keepdim=True)
            x = w / norm
            loss, gx = _spread_loss_and_grad(x, temperature, chunk_size)
            if loss < best_loss:
                best_loss, best = loss, x.clone()
            if step == steps:
                break
            # Chain rule through x = w/|w|: project out the radial part.
            gw = (gx - (gx * x).sum(dim=1, keepdim=True) * x) / norm
        w.grad = gw
        opt.step()
    best = best.to(_F64)
    return (best / best.norm(dim=1, keepdim=True)).to(dtype)


# ---------------------------------------------------------------------------
# MAP estimation and running statistics
# ---------------------------------------------------------------------------


def map_estimate(count: Tensor, mean: Tensor, prior_dir: Tensor, prior_count: Tensor, alpha_hat: float,
                 beta_hat: float, use_prior: bool = True, max_kappa: float = 1e5, min_kappa: float = 1e-6,
                 kappa_solver: str = "sra") -> Tuple[Tensor, Tensor]:
    """MAP (or ML) vMF parameters per class (docs/bape.md, "Model"). Returns (mu (K,p), kappa (K,)), float64.

    With the conjugate prior (alpha0, beta0, m0) and n observations of mean z̄:
        alpha0 = alpha_hat N_y,  beta0 = beta_hat N_y,  S = beta0 m0 + n z̄,
        alpha = alpha0 + n,  beta = |S|,  mu = S/beta,  R = beta/alpha,  kappa = A_p^{-1}(R),
    with A_p^{-1} by Sra's approximation (the paper's choice) or by Newton's method (``kappa_solver``).
    ``prior_dir`` must already be unit-norm. Gradients reach ``prior_dir`` through both
    mu and kappa (count and mean are statistics, so callers pass them detached).

    ``use_prior=False`` gives plain maximum likelihood: S = n z̄, R = |z̄|.
    Fallback: a class whose estimate is undefined (alpha = 0 or S = 0, e.g. n = 0 without a
    prior) gets mu = prior_dir and kappa = min_kappa. That is the uniform density on the
    sphere: with no data, the class has no preferred direction. Beware that log_cp at
    kappa ≈ 0 is large for large p (+2090 at p=1024, i.e. -log area of S^1023), so
    callers should mask such classes or use the prior.
    """
    n = _as_f64(count)
    zbar = _as_f64(mean)
    m0 = _as_f64(prior_dir)
    p = zbar.shape[-1]
    if use_prior:
        n_prior = _as_f64(prior_count)
        alpha = alpha_hat * n_prior + n
        s = (beta_hat * n_prior)[:, None] * m0 + n[:, None] * zbar
    else:
        alpha = n
        s = n[:, None] * zbar
    beta_sq = (s * s).sum(dim=-1)
    valid = (alpha > 0) & (beta_sq > 0)
    # Double-where: feed safe values to sqrt/division so that invalid rows carry neither
    # NaN values nor NaN gradients.
    beta = torch.sqrt(torch.where(valid, beta_sq, torch.ones_like(beta_sq)))
    safe_alpha = torch.where(valid, alpha, torch.ones_like(alpha))
    mu = torch.where(valid[:, None], s / beta[:, None], m0)
    r = torch.where(valid, beta / safe_alpha, torch.zeros_like(beta))
    kappa = KAPPA_SOLVERS[kappa_solver](r, p, max_kappa=max_kappa, min_kappa=min_kappa)
    kappa = torch.where(valid, kappa, torch.full_like(kappa, min_kappa))
    return mu, kappa


class OnlineClassMeans(nn.Module):
    """Running per-class count n_y and mean z̄_y of features (docs/bape.md, "Model"), float64 buffers.

    ``update`` applies z̄ <- (n z̄ + s z̄')/(n + s), n <- n + s, where s is the batch count
    and z̄' the batch mean of the class. It writes n z̄ + s z̄' as n z̄ + (batch sum), and
    classes absent from the batch stay unchanged. Buffers are part of ``state_dict`` so
    that they are checkpointed (the test-time classifier depends on them). Features are
    used detached; all-gathering across DDP ranks is the caller's job.
    """

    count: Tensor
    mean: Tensor

    def __init__(self, num_classes: int, dim: int, device=None):
        super().__init__()
        self.register_buffer("count", torch.zeros(num_classes, dtype=_F64, device=device))
        self.register_buffer("mean", torch.zeros(num_classes, dim, dtype=_F64, device=device))

    @torch.no_grad()
    def update(self, features: Tensor, labels: Tensor) -> None:
        feats = features.detach().to(device=self.mean.device, dtype=_F64)
        labels = labels.detach().to(device=self.mean.device, dtype=torch.long).flatten()
        if feats.shape[0] != labels.shape[0]:
            raise ValueError(f"features ({feats.shape[0]}) and labels ({labels.shape[0]}) disagree")
        batch_count = torch.zeros_like(self.count).index_add_(0, labels, torch.ones_like(labels, dtype=_F64))
        batch_sum = torch.zeros_like(self.mean).index_add_(0, labels, feats)
        new_count = self.count + batch_count
        present = batch_count > 0
        safe = torch.where(present, new_count, torch.ones_like(new_count))
        new_mean = (self.count[:, None] * self.mean + batch_sum) / safe[:, None]
        self.mean.copy_(torch.where(present[:, None], new_mean, self.mean))
        self.count.copy_(new_count)

    @torch.no_grad()
    def reset(self) -> None:
        self.count.zero_()
        self.mean.zero_()
