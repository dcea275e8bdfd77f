"""BAPE (methods/bape.py): logits and loss against an independent float64 reference, statistics, DA modes,
ensemble rule, checkpoints, prior directions.

The reference below is written from the paper's formulas (docs/bape.md: Training and Formulas) with scipy's
Bessel function, not with methods/_vmf.py. The projection head is replaced by the identity where the test
needs hand-made unit features z (feature_dim == proj_dim).
"""

from __future__ import annotations

import io
import json
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from scipy.special import ive

from ltbench.errors import ConfigError
from ltbench.method import MethodContext, create_method


def make(counts=(6, 3, 1), p=4, feat=None, identity=True, seed=0, **opts):
    torch.manual_seed(seed)
    feat = p if feat is None else feat
    ctx = MethodContext(num_classes=len(counts), class_counts=torch.tensor(counts, dtype=torch.long),
                        feature_dim=feat, epochs=3)
    m = create_method({"name": "bape", "proj_dim": p, "hidden_dim": 8, **opts}, ctx)
    if identity:
        assert feat == p
        m.proj = nn.Identity()
    return m


def training_logits(m, z):
    """Training-form logits log π_y + log C_p(κ_y) + κ_y μ_yᵀz, through the module's one scoring function."""
    (scores,), _ = m.class_scores([z], "none", shift=m.log_train_prior.to(torch.float32))
    return scores


def unit(x):
    x = torch.as_tensor(x, dtype=torch.float64)
    return x / x.norm(dim=-1, keepdim=True)


def set_state(m, count, mean, m0):
    with torch.no_grad():
        m.stats.count.copy_(torch.as_tensor(count, dtype=torch.float64))
        m.stats.mean.copy_(torch.as_tensor(mean, dtype=torch.float64))
        m.m0.copy_(torch.as_tensor(m0, dtype=torch.float32))


# -- an independent float64 reference ---------------------------------------------------------------

def ref_log_cp(kappa: np.ndarray, p: int) -> np.ndarray:
    """log C_p(κ) = ν log κ − (p/2) log 2π − log I_ν(κ), density f = C_p exp(κ μᵀz)."""
    nu = p / 2 - 1
    return nu * np.log(kappa) - (p / 2) * np.log(2 * np.pi) - (np.log(ive(nu, kappa)) + kappa)


def ref_params(count, mean, m0, counts_n, a_hat, b_hat, prior=True):
    count, mean, m0 = (np.asarray(x, dtype=np.float64) for x in (count, mean, m0))
    m0 = m0 / np.linalg.norm(m0, axis=1, keepdims=True)
    n_prior = np.asarray(counts_n, dtype=np.float64)
    if prior:
        s = (b_hat * n_prior)[:, None] * m0 + count[:, None] * mean
        alpha = a_hat * n_prior + count
    else:
        s = count[:, None] * mean
        alpha = count
    beta = np.linalg.norm(s, axis=1)
    r = beta / alpha
    p = mean.shape[1]
    return s / beta[:, None], p * r / (1 - r * r)


def ref_logits(z, mu, kappa, log_prior):
    z = np.asarray(z, dtype=np.float64)
    return np.asarray(log_prior)[None, :] + ref_log_cp(kappa, mu.shape[1])[None, :] + kappa[None, :] * (z @ mu.T)


COUNTS = (6, 3, 1)
LOG_PI = np.log(np.array(COUNTS, dtype=np.float64) / sum(COUNTS))
M0 = [[1.0, 0.2, 0.0, -0.3], [-0.4, 1.3, 0.1, 0.0], [0.0, -0.5, -0.9, 0.7]]  # not unit: renormalised
MEAN = [[0.5, 0.1, 0.2, -0.1], [-0.2, 0.6, 0.0, 0.3], [0.1, -0.3, -0.5, 0.4]]
COUNT = [12.0, 5.0, 2.0]
Z = unit([[0.3, 0.1, -0.2, 0.5], [1.0, 0.0, 0.2, 0.1], [-0.5, 0.8, 0.1, 0.0], [0.2, -0.4, -0.7, 0.6],
          [0.0, 0.0, 1.0, 0.0]])


def test_views_param_groups_and_config_errors():
    m = make()
    assert m.views() == ["strong", "sim", "sim"]
    groups = m.param_groups()
    assert groups[0]["params"] == [m.m0] and groups[0]["weight_decay"] == 0.0
    assert m.cfg.aux["name"] == "la" and "tau" in m.cfg.aux  # aux defaults resolved into the config
    with pytest.raises(ConfigError, match="method.aux.*unknown method 'nosuch'"):
        make(aux={"name": "nosuch"})
    with pytest.raises(ConfigError, match="method.aux.taux"):
        make(aux={"name": "la", "taux": 1.0})
    with pytest.raises(ConfigError, match="aux_views"):
        make(aux_views=["strong", "strong"])
    with pytest.raises(ConfigError, match="beta_hat"):
        make(alpha_hat=1.0, beta_hat=2.0)


def test_infinite_prior_reduces_to_cosine_classifier():
    scale = 1e9
    m = make(alpha_hat=40.0 * scale, beta_hat=8.0 * scale)
    set_state(m, COUNT, MEAN, M0)
    z = Z.float()
    with torch.no_grad():
        logits = training_logits(m, z).double()
    p = 4
    r0 = 8.0 / 40.0
    kappa0 = p * r0 / (1 - r0 * r0)
    m0 = unit(M0)
    for i in range(3):
        for j in range(3):
            expected = kappa0 * (z.double() @ (m0[i] - m0[j])) + LOG_PI[i] - LOG_PI[j]
            torch.testing.assert_close(logits[:, i] - logits[:, j], expected, atol=1e-4, rtol=0)


def test_logits_and_loss_match_float64_reference():
    a_hat, b_hat, eta = 5.0, 2.0, 0.5
    m = make(alpha_hat=a_hat, beta_hat=b_hat, eta=eta)
    set_state(m, COUNT, MEAN, M0)
    mu, kappa = ref_params(COUNT, MEAN, M0, COUNTS, a_hat, b_hat)
    with torch.no_grad():
        logits = training_logits(m, Z.float())
    np.testing.assert_allclose(logits.double().numpy(), ref_logits(Z, mu, kappa, LOG_PI), rtol=1e-5, atol=1e-5)

    # One training step: both views update the statistics first, then the mean CE over the two views.
    labels = torch.tensor([0, 1, 2, 0, 1])
    z1 = Z
    z2 = unit(Z.numpy()[::-1].copy() + 0.3)
    h_aux = torch.randn(5, 4)
    out = m.loss([h_aux, z1.float(), z2.float()], labels, epoch=0)
    count, mean = np.array(COUNT), np.array(MEAN)
    total = count[:, None] * mean
    for z in (z1.numpy(), z2.numpy()):
        for i, y in enumerate(labels.tolist()):
            total[y] += z[i]
            count[y] += 1
    new_mean = total / count[:, None]
    np.testing.assert_allclose(m.stats.count.numpy(), count)
    np.testing.assert_allclose(m.stats.mean.numpy(), new_mean, atol=1e-6)
    mu, kappa = ref_params(count, new_mean, M0, COUNTS, a_hat, b_hat)
    ce = []
    for z in (z1, z2):
        lg = torch.from_numpy(ref_logits(z, mu, kappa, LOG_PI))
        ce.append(float(F.cross_entropy(lg, labels)))
    ref_bape = sum(ce) / 2
    assert float(out["loss_bape"]) == pytest.approx(ref_bape, rel=1e-5)
    with torch.no_grad():
        aux_loss = float(m.aux.loss([h_aux], labels, epoch=0)["loss"])
    assert float(out["loss_aux"]) == pytest.approx(aux_loss, rel=1e-6)
    assert float(out["loss"].detach()) == pytest.approx(ref_bape + eta * aux_loss, rel=1e-5)
    assert float(out["kappa_mean"]) == pytest.approx(kappa.mean(), rel=1e-5)
    for key in ("loss_bape", "loss_aux", "kappa_mean"):
        assert out[key].ndim == 0 and not out[key].requires_grad
    assert out["logits"].shape == (5, 3) and not out["logits"].requires_grad


@pytest.mark.parametrize("kappa_grad", [True, False])
def test_m0_gradient_through_mu_and_kappa(kappa_grad):
    """m0's gradient matches autograd of the float64 reference loss, with κ detached or not."""
    a_hat, b_hat = 5.0, 2.0
    m = make(alpha_hat=a_hat, beta_hat=b_hat, kappa_grad=kappa_grad, eta=0.0)
    set_state(m, COUNT, MEAN, M0)
    labels = torch.tensor([0, 1, 2, 0, 1])
    out = m.loss([torch.randn(5, 4), Z.float(), Z.float()], labels, epoch=0)
    out["loss"].backward()

    m0 = torch.tensor(M0, dtype=torch.float64, requires_grad=True)
    m0n = m0 / m0.norm(dim=1, keepdim=True)
    n = m.stats.count.clone()
    s = (b_hat * torch.tensor(COUNTS, dtype=torch.float64))[:, None] * m0n + n[:, None] * m.stats.mean
    alpha = a_hat * torch.tensor(COUNTS, dtype=torch.float64) + n
    beta = s.norm(dim=1)
    r = beta / alpha
    kappa = 4 * r / (1 - r * r)
    if not kappa_grad:
        kappa = kappa.detach()
    mu = s / beta[:, None]
    # log C_4(κ) from scipy on the detached κ, plus a term carrying its derivative −A_4(κ) = −I_2(κ)/I_1(κ).
    k_np = kappa.detach().numpy()
    a_p = ive(2, k_np) / ive(1, k_np)
    log_c = torch.from_numpy(ref_log_cp(k_np, 4)) + (-torch.from_numpy(a_p)) * (kappa - kappa.detach())
    logits = torch.from_numpy(LOG_PI)[None] + log_c[None] + kappa[None] * (Z @ mu.T)
    F.cross_entropy(logits, labels).backward()
    torch.testing.assert_close(m.m0.grad.double(), m0.grad, rtol=1e-4, atol=1e-6)


def test_statistics_update_before_logits_two_views():
    m = make(prior=False, ensemble="bape")
    labels = torch.tensor([0, 1, 2, 0])
    seen = {c: [] for c in range(3)}
    for step in range(2):
        g = torch.Generator().manual_seed(step)
        z1, z2 = unit(torch.randn(4, 4, generator=g)), unit(torch.randn(4, 4, generator=g))
        out = m.loss([torch.randn(4, 4), z1.float(), z2.float()], labels, epoch=0)
        for z in (z1, z2):
            for i, y in enumerate(labels.tolist()):
                seen[y].append(z[i])
        count = np.array([len(seen[c]) for c in range(3)], dtype=np.float64)
        mean = np.stack([torch.stack(seen[c]).mean(0).numpy() for c in range(3)])
        np.testing.assert_allclose(m.stats.count.numpy(), count)
        np.testing.assert_allclose(m.stats.mean.numpy(), mean, atol=1e-6)
        # The step's logits already use its own features (plain ML from everything seen, this step included).
        mu, kappa = ref_params(count, mean, M0, COUNTS, 0, 0, prior=False)
        expected = (ref_logits(z1, mu, kappa, np.zeros(3)) + ref_logits(z2, mu, kappa, np.zeros(3))) / 2
        np.testing.assert_allclose(out["logits"].double().numpy(), expected, rtol=1e-5, atol=1e-4)
    assert m.stats.count.tolist() == [8.0, 4.0, 4.0]  # 2 per image per step


def test_prior_false_is_plain_maximum_likelihood():
    m = make(prior=False)
    set_state(m, COUNT, MEAN, M0)
    mu, kappa = m.class_params("none")
    mean = np.array(MEAN)
    r = np.linalg.norm(mean, axis=1)
    np.testing.assert_allclose(mu.detach().numpy(), mean / r[:, None], atol=1e-12)
    np.testing.assert_allclose(kappa.detach().numpy(), 4 * r / (1 - r * r), rtol=1e-12)
    m0_before = m.m0.detach().clone()
    m.loss([torch.randn(2, 4), Z[:2].float(), Z[:2].float()], torch.tensor([0, 1]), epoch=0)["loss"].backward()
    assert m.m0.grad is None or float(m.m0.grad[:2].abs().sum()) == 0.0  # seen classes: m0 plays no part
    assert torch.equal(m.m0.detach(), m0_before)


def random_prior(k, seed=3):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(k, generator=g) + 0.1
    return p / p.sum()


def test_da_none_is_bayes_rule_with_target_prior():
    m = make(da_mode="none", ensemble="bape")
    set_state(m, COUNT, MEAN, M0)
    m.eval()
    z = Z.float()
    uniform = torch.full((3,), 1 / 3)
    with torch.no_grad():
        plain = training_logits(m, z)
        for prior in (None, uniform):
            torch.testing.assert_close(m.predict(z, target_prior=prior), plain - m.log_train_prior)
        pt = random_prior(3)
        shifted = m.predict(z, target_prior=pt)
        torch.testing.assert_close(shifted - m.predict(z, target_prior=uniform),
                                   (torch.log(pt) + math.log(3)).expand(5, 3), atol=1e-5, rtol=0)
        # p_t = π_train: the training posterior (up to the constant log K).
        train = m.predict(z, target_prior=m.ctx.train_prior)
        torch.testing.assert_close(train, plain + math.log(3), atol=1e-5, rtol=0)


def test_da_map_test_prior_is_identity_for_training_prior():
    base = make(da_mode="none", ensemble="bape")
    m = make(da_mode="map_test_prior", ensemble="bape")
    for x in (base, m):
        set_state(x, COUNT, MEAN, M0)
        x.eval()
    z = Z.float()
    pi_train = m.ctx.train_prior
    with torch.no_grad():
        torch.testing.assert_close(m.predict(z, target_prior=pi_train), base.predict(z, target_prior=pi_train))
        # For a balanced target it differs: pseudo-counts N_total/K for every class.
        assert not torch.allclose(m.predict(z, target_prior=None), base.predict(z, target_prior=None))
        mu, kappa = ref_params(COUNT, MEAN, M0, [10 / 3] * 3, 40.0, 8.0)
        expected = ref_logits(Z, mu, kappa, np.zeros(3))
        np.testing.assert_allclose(m.predict(z, target_prior=None).double().numpy(), expected, rtol=1e-5, atol=1e-5)


def test_da_shared_kappa():
    m = make(da_mode="shared_kappa", ensemble="bape")
    set_state(m, COUNT, MEAN, M0)
    m.eval()
    z = Z.float()
    with torch.no_grad():
        mu, kappa = ref_params(COUNT, MEAN, M0, COUNTS, 40.0, 8.0)
        kbar = kappa.mean()
        expected = ref_log_cp(np.array([kbar]), 4)[0] + kbar * (Z.numpy() @ mu.T)
        np.testing.assert_allclose(m.predict(z).double().numpy(), expected, rtol=1e-5, atol=1e-5)
        pt = random_prior(3)
        torch.testing.assert_close(m.predict(z, target_prior=pt) - m.predict(z),
                                   (torch.log(pt) + math.log(3)).expand(5, 3), atol=1e-5, rtol=0)
    # When every κ_y is already equal, shared_kappa changes nothing.
    r = 0.6
    eq_mean = (unit(MEAN) * r).numpy()
    eq = {mode: make(prior=False, da_mode=mode, ensemble="bape") for mode in ("none", "shared_kappa")}
    with torch.no_grad():
        for x in eq.values():
            set_state(x, COUNT, eq_mean, M0)
            x.eval()
        torch.testing.assert_close(eq["shared_kappa"].predict(z), eq["none"].predict(z))


def test_da_debiased():
    m = make(prior=False, da_mode="debiased", ensemble="bape")
    set_state(m, COUNT, MEAN, M0)
    with torch.no_grad():
        _, k_none = m.class_params("none")
        _, k_deb = m.class_params("debiased")
    r2 = (np.array(MEAN) ** 2).sum(1)
    n = np.array(COUNTS, dtype=np.float64)
    r_hat = np.sqrt(np.maximum(r2 - (1 - r2) / np.maximum(n - 1, 1), 0))
    r_hat[n < 2] = np.sqrt(r2[n < 2])  # one image: no correction possible
    np.testing.assert_allclose(k_deb.numpy(), np.maximum(4 * r_hat / (1 - r_hat**2), 1e-6), rtol=1e-10)
    assert (k_deb <= k_none + 1e-12).all()
    # Many images per class: practically unchanged; and prior-consistent.
    big = make(counts=(100000, 50000, 20000), da_mode="debiased", ensemble="bape")
    ref = make(counts=(100000, 50000, 20000), da_mode="none", ensemble="bape")
    for x in (big, ref):
        set_state(x, [2e6, 1e6, 4e5], MEAN, M0)
        x.eval()
    z = Z.float()
    with torch.no_grad():
        torch.testing.assert_close(big.predict(z), ref.predict(z), atol=2e-3, rtol=1e-4)
        pt = random_prior(3)
        torch.testing.assert_close(big.predict(z, target_prior=pt) - big.predict(z),
                                   (torch.log(pt) + math.log(3)).expand(5, 3), atol=1e-5, rtol=0)


def test_da_train_uses_adjusted_parameters():
    labels = torch.tensor([0, 1, 2, 0, 1])
    losses = {}
    for mode, da_train in (("none", False), ("shared_kappa", False), ("shared_kappa", True)):
        m = make(da_mode=mode, da_train=da_train, eta=0.0)
        set_state(m, COUNT, MEAN, M0)
        out = m.loss([torch.randn(5, 4), Z.float(), Z.float()], labels, epoch=0)
        losses[(mode, da_train)] = float(out["loss_bape"])
        if da_train:
            mu, kappa = m.class_params("shared_kappa")
            lg = m.log_likelihoods(Z.float(), mu, kappa) + m.log_train_prior
            assert float(out["loss_bape"]) == pytest.approx(float(F.cross_entropy(lg, labels).detach()), rel=1e-6)
    assert losses[("none", False)] == pytest.approx(losses[("shared_kappa", False)], rel=1e-7)
    assert losses[("shared_kappa", True)] != pytest.approx(losses[("none", False)], rel=1e-4)


def test_ensemble_rule():
    ms = {e: make(ensemble=e, feat=6, identity=False, seed=0) for e in ("sum", "bape", "aux")}
    h = torch.randn(5, 6)
    for x in ms.values():
        x.eval()
        set_state(x, COUNT, MEAN, M0)
    uniform = torch.full((3,), 1 / 3)
    pt = random_prior(3)
    with torch.no_grad():
        heads = ms["sum"].head_predictions(h, target_prior=pt)
        assert set(heads) >= {"aux", "bape"}
        torch.testing.assert_close(ms["bape"].predict(h, target_prior=pt), heads["bape"])
        torch.testing.assert_close(ms["aux"].predict(h, target_prior=pt), heads["aux"])
        expected = ms["sum"].aux.predict(h, target_prior=uniform) + heads["bape"]
        torch.testing.assert_close(ms["sum"].predict(h, target_prior=pt), expected)
        # the target-prior term is added once
        torch.testing.assert_close(ms["sum"].predict(h, target_prior=pt) - ms["sum"].predict(h, target_prior=uniform),
                                   (torch.log(pt) + math.log(3)).expand(5, 3), atol=1e-4, rtol=0)


def test_proco_two_epoch_window_and_resume_safety():
    m = make(stats_window="proco_two_epoch", prior=False)
    labels = torch.tensor([0, 1, 2])

    def step(epoch, seed):
        z = unit(torch.randn(3, 4, generator=torch.Generator().manual_seed(seed))).float()
        m.on_epoch_start(epoch)
        m.loss([torch.randn(3, 4), z, z], labels, epoch=epoch)
        return z.double()

    a = step(0, 0)
    assert m.stats.count.tolist() == [2.0, 2.0, 2.0]
    b = step(1, 1)  # old = epoch 0 + epoch 1, current = epoch 1
    assert m.stats.count.tolist() == [4.0, 4.0, 4.0]
    torch.testing.assert_close(m.stats.mean, (a + b) / 2)
    torch.testing.assert_close(m.stats_current.mean, b)
    m.on_epoch_start(1)  # a resumed run calls it again for the same epoch: no rotation
    assert m.stats.count.tolist() == [4.0, 4.0, 4.0]
    c = step(2, 2)  # reset at epoch start: epoch 0 is gone
    assert m.stats.count.tolist() == [4.0, 4.0, 4.0]
    torch.testing.assert_close(m.stats.mean, (b + c) / 2)
    torch.testing.assert_close(m.stats_current.mean, c)
    cum = make(prior=False)
    for e in range(3):
        cum.on_epoch_start(e)
        cum.loss([torch.randn(3, 4), a.float(), a.float()], labels, epoch=e)
    assert cum.stats.count.tolist() == [6.0, 6.0, 6.0]


def test_checkpoint_round_trip_identical_predictions():
    def build(seed):
        return make(counts=(9, 4, 2), p=6, feat=5, identity=False, seed=seed, stats_window="proco_two_epoch")

    m = build(0)
    opt = torch.optim.SGD([{"params": [p for n, p in m.named_parameters() if n != "m0"]}, *m.param_groups()],
                          lr=0.1, momentum=0.9)
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 0, 1])
    for epoch in range(2):
        m.on_epoch_start(epoch)
        out = m.loss([torch.randn(8, 5) for _ in range(3)], labels, epoch=epoch)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
    buffer = io.BytesIO()
    torch.save({"model": m.state_dict(), "extra": m.extra_state()}, buffer)
    buffer.seek(0)
    state = torch.load(buffer, map_location="cpu", weights_only=True)
    assert {"m0", "stats.count", "stats.mean", "stats_current.count", "stats_epoch"} <= set(state["model"])

    fresh = build(123)
    m.eval()
    fresh.eval()
    h = torch.randn(7, 5)
    with torch.no_grad():
        assert not torch.equal(m.predict(h), fresh.predict(h))
        fresh.load_state_dict(state["model"])
        fresh.load_extra_state(state["extra"])
        for prior in (None, random_prior(3)):
            assert torch.equal(m.predict(h, target_prior=prior), fresh.predict(h, target_prior=prior))
            for key, value in m.head_predictions(h, target_prior=prior).items():
                assert torch.equal(value, fresh.head_predictions(h, target_prior=prior)[key])
    assert int(fresh.stats_epoch) == 1


def test_spread_directions_when_k_minus_1_exceeds_p():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = make(counts=tuple(range(40, 20, -1)), p=8, feat=8)
    assert any("spread_directions" in str(w.message) for w in caught)
    assert m.prior_dirs == "spread"
    m0 = m.prior_directions().detach().double()
    torch.testing.assert_close(m0.norm(dim=1), torch.ones(20, dtype=torch.float64))
    cos = m0 @ m0.T
    cos.fill_diagonal_(-1.0)
    assert float(cos.max()) < 0.5  # well spread (random unit vectors in R^8: about 0.75)
    extras = m.result_extras()
    assert extras["prior_dirs"] == "spread" and extras["notes"]
    json.dumps(extras)
    # K-1 <= p: an exact simplex ETF
    e = make(counts=(5, 4, 3, 2, 1), p=4).prior_directions().detach().double()
    g = e @ e.T
    torch.testing.assert_close(g, torch.full((5, 5), -0.25, dtype=torch.float64) + 1.25 * torch.eye(5,
                               dtype=torch.float64), atol=1e-6, rtol=0)


def test_result_extras():
    m = make()
    set_state(m, COUNT, MEAN, M0)
    extras = m.result_extras()
    json.dumps(extras)
    assert len(extras["kappa"]) == len(extras["mean_norm"]) == len(extras["n"]) == 3
    assert extras["n"] == COUNT
    assert extras["da_mode"] == "shared_kappa" and extras["ensemble"] == "sum"
    np.testing.assert_allclose(extras["mean_norm"], np.linalg.norm(MEAN, axis=1))
    _, kappa = ref_params(COUNT, MEAN, M0, COUNTS, 40.0, 8.0)
    np.testing.assert_allclose(extras["kappa"], kappa, rtol=1e-6)  # m0 is a float32 parameter
    np.testing.assert_allclose(extras["kappa_da_uniform"], [np.mean(extras["kappa"])] * 3, rtol=1e-12)


def test_newton_kappa_solver_gives_the_maximum_likelihood_root():
    # kappa_solver: newton solves A_p(kappa) = R exactly, Sra's closed form sits above that root
    from methods._vmf import mean_resultant_length

    sra, newton = make(prior=False), make(prior=False, kappa_solver="newton")
    for m in (sra, newton):
        set_state(m, COUNT, MEAN, M0)
    r = torch.tensor(np.linalg.norm(np.array(MEAN), axis=1))
    _, k_sra = sra.class_params("none")
    _, k_newton = newton.class_params("none")
    torch.testing.assert_close(mean_resultant_length(k_newton.detach(), 4), r, rtol=1e-10, atol=0)
    assert (k_sra > k_newton).all()


def test_the_batched_head_equals_the_per_view_formulas_up_to_rounding():
    """loss() scores all BAPE views at once (one statistics update, one log C_p and one product, one
    cross-entropy over all rows) to save GPU launches (docs/performance.md). Restated here the way it was
    written per view: update the statistics view by view, score each view, average the per-view CEs. Loss,
    statistics and every gradient agree up to float rounding."""
    import copy

    from methods._vmf import log_cp

    torch.manual_seed(1)
    m = make(counts=(9, 5, 2), p=16, feat=12, identity=False, aux={"name": "la"}, aux_views=["default"],
             bape_views=["default", "default"])
    reference = copy.deepcopy(m)
    labels = torch.tensor([0, 1, 2, 0, 0, 1])
    features = [torch.randn(6, 12) for _ in range(3)]
    m.on_epoch_start(0), reference.on_epoch_start(0)
    got = m.loss(features, labels, epoch=0)
    got["loss"].backward()

    r = reference
    aux = r.aux.loss(features[:1], labels, epoch=0)
    zs = r.project(torch.cat(features[1:])).split(6)
    for z in zs:
        r.update_statistics(z, labels)
    mu, kappa = r.class_params("none")
    weight, bias = (kappa[:, None] * mu).float(), log_cp(kappa, r.p).float()
    scores = [z @ weight.T + bias for z in zs]
    loss_bape = torch.stack([F.cross_entropy(s + r.log_train_prior, labels) for s in scores]).mean()
    (loss_bape + aux["loss"]).backward()

    torch.testing.assert_close(got["loss"], loss_bape + aux["loss"], rtol=1e-6, atol=0)
    torch.testing.assert_close(m.stats.count, r.stats.count, rtol=0, atol=0)
    torch.testing.assert_close(m.stats.mean, r.stats.mean, rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(got["logits"], aux["logits"] + torch.stack(scores).mean(0).detach(), rtol=1e-6,
                               atol=1e-5)
    for (name, a), b in zip(m.named_parameters(), r.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7, msg=name)
