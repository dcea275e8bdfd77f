"""Losses and predictions of the built-in methods against their formulas, written out independently.

Each reference below is plain float64 NumPy on small explicit numbers (K = 3, counts [100, 10, 1]); the
methods compute in float32, so comparisons allow float32 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ltbench.method import MethodContext, create_method
from methods._drw import drw_weights, resolve_switch_epoch, weighted_ce
from methods.ldam import ldam_margins

COUNTS = np.array([100.0, 10.0, 1.0])
PI = COUNTS / COUNTS.sum()
X = np.array([[1.0, 0.5, -0.2],
              [0.3, -1.0, 0.8],
              [-0.5, 0.2, 1.5]])
Y = np.array([0, 2, 2])  # a repeated label: the weighted mean divides by the batch's weight sum
W = np.array([[0.5, -0.3, 0.2],  # linear head weight (out, in)
              [0.1, 0.4, -0.6],
              [-0.2, 0.3, 0.7]])
B = np.array([0.1, -0.2, 0.05])
TARGET = np.array([0.2, 0.3, 0.5])  # a non-uniform target prior
TOL = dict(rtol=1e-5, atol=1e-5)

CIFAR100_R100 = [int(500 * (0.01) ** (i / 99)) for i in range(100)]


def ctx(counts=COUNTS, epochs=200, feature_dim=3) -> MethodContext:
    counts = torch.as_tensor(np.asarray(counts), dtype=torch.long)
    return MethodContext(num_classes=len(counts), class_counts=counts, feature_dim=feature_dim, epochs=epochs)


def make(name: str, context: MethodContext | None = None, **options):
    return create_method({"name": name, **options}, context or ctx())


def t(a) -> torch.Tensor:
    return torch.tensor(np.asarray(a), dtype=torch.float32)


def ce_terms(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-sample -log softmax(z)_y."""
    m = z.max(1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(1, keepdims=True)))[:, 0]
    return lse - z[np.arange(len(y)), y]


def ce_ref(z, y, class_weights=None) -> float:
    terms = ce_terms(z, y)
    if class_weights is None:
        return float(terms.mean())
    w = np.asarray(class_weights)[y]
    return float((w * terms).sum() / w.sum())


def linear_logits() -> np.ndarray:
    return X @ W.T + B


def set_linear(method) -> None:
    with torch.no_grad():
        method.head.weight.copy_(t(W))
        method.head.bias.copy_(t(B))


def loss_of(method, y=Y, epoch=0) -> float:
    method.on_epoch_start(epoch)
    return float(method.loss([t(X)], torch.as_tensor(y), epoch=epoch)["loss"].detach())


def scores(method, prior=None) -> np.ndarray:
    with torch.no_grad():
        out = method.predict(t(X), target_prior=None if prior is None else t(prior))
    return out.double().numpy()


# ------------------------------------------------------------------------------------------------
# ce (the existing baseline), for completeness


def test_ce_loss_and_prediction_ignores_prior():
    m = make("ce")
    set_linear(m)
    z = linear_logits()
    assert loss_of(m) == pytest.approx(ce_ref(z, Y), rel=1e-6)
    np.testing.assert_allclose(scores(m), z, **TOL)
    np.testing.assert_allclose(scores(m, TARGET), z, **TOL)


# ------------------------------------------------------------------------------------------------
# Logit adjustment


@pytest.mark.parametrize("tau", [1.0, 0.5, 2.0])
def test_la_loss(tau):
    m = make("la", tau=tau)
    set_linear(m)
    z = linear_logits()
    expected = ce_ref(z + np.log(PI**tau + 1e-12), Y)
    assert loss_of(m) == pytest.approx(expected, rel=1e-6)


def test_la_tau1_equals_balanced_softmax():
    m = make("la")
    set_linear(m)
    balanced_softmax = ce_ref(linear_logits() + np.log(COUNTS), Y)  # CE(z + log n): log Σn cancels
    assert loss_of(m) == pytest.approx(balanced_softmax, rel=1e-6)


def test_la_prediction():
    m = make("la")
    set_linear(m)
    z = linear_logits()
    np.testing.assert_allclose(scores(m), z, **TOL)  # z is already balanced
    np.testing.assert_array_equal(scores(m, np.full(3, 1 / 3)), scores(m))  # explicit uniform: exactly z
    shifted = scores(m, TARGET)
    np.testing.assert_allclose(shifted, z + np.log(TARGET) + np.log(3), **TOL)
    np.testing.assert_array_equal(shifted.argmax(1), (z + np.log(TARGET)).argmax(1))
    # an unnormalised prior is the same prior
    np.testing.assert_allclose(scores(m, 10 * TARGET), shifted, **TOL)


@pytest.mark.parametrize("tau", [1.0, 1.5])
def test_la_posthoc(tau):
    m = make("la_posthoc", tau=tau)
    set_linear(m)
    z = linear_logits()
    assert loss_of(m) == pytest.approx(ce_ref(z, Y), rel=1e-6)  # plain CE training
    adjusted = z - np.log(PI**tau + 1e-12)
    np.testing.assert_allclose(scores(m), adjusted, **TOL)
    np.testing.assert_allclose(scores(m, np.full(3, 1 / 3)), adjusted, **TOL)
    np.testing.assert_allclose(scores(m, TARGET), adjusted + np.log(TARGET) + np.log(3), **TOL)
    with torch.no_grad():
        heads = m.head_predictions(t(X))
    np.testing.assert_allclose(heads["erm"].double().numpy(), z, **TOL)


@pytest.mark.parametrize("name", ["la", "la_posthoc"])
def test_loss_views_all_averages_the_loss_over_every_view(name):
    # loss_views: all is the compute-matched LA control for BAPE+LA (three views per image); 'first' is the published loss
    x2 = X[::-1] * 0.5
    shift = np.log(PI + 1e-12) if name == "la" else 0.0
    per_view = [ce_ref(X @ W.T + B + shift, Y), ce_ref(x2 @ W.T + B + shift, Y)]
    for mode, expected in (("first", per_view[0]), ("all", np.mean(per_view))):
        m = make(name, loss_views=mode)
        set_linear(m)
        out = m.loss([t(X), t(x2)], torch.as_tensor(Y), epoch=0)
        assert float(out["loss"].detach()) == pytest.approx(expected, rel=1e-6), mode
        np.testing.assert_allclose(out["logits"].double().numpy(), linear_logits(), **TOL)  # first view's logits


def test_loss_views_is_explicit_in_the_run_config():
    from ltbench.config import to_dict

    assert to_dict(make("la").cfg)["loss_views"] == "first"
    assert to_dict(make("la", loss_views="all").cfg)["loss_views"] == "all"


def test_la_posthoc_tau_changes_after_training():
    m = make("la_posthoc")
    set_linear(m)
    m.tau = 0.5
    np.testing.assert_allclose(scores(m), linear_logits() - np.log(PI**0.5 + 1e-12), **TOL)


# ------------------------------------------------------------------------------------------------
# DRW pieces


def drw_ref(counts, beta) -> np.ndarray:
    counts = np.asarray(counts, dtype=np.float64)
    w = (1 - beta) / (1 - beta**counts)
    return w * len(counts) / w.sum()


def test_drw_weights_small():
    np.testing.assert_allclose(drw_weights(COUNTS, 0.9999).double().numpy(), drw_ref(COUNTS, 0.9999), rtol=1e-6)
    np.testing.assert_array_equal(drw_weights(COUNTS, 0.0).numpy(), np.ones(3))


def test_drw_weights_cifar100_rho100():
    w = drw_weights(CIFAR100_R100, 0.9999).double().numpy()
    assert CIFAR100_R100[0] == 500 and CIFAR100_R100[-1] == 5
    assert round(w[0], 4) == 0.0449
    assert round(w[-1], 3) == 4.378
    assert w.sum() == pytest.approx(100.0, rel=1e-6)
    np.testing.assert_allclose(w, drw_ref(CIFAR100_R100, 0.9999), rtol=1e-6)


def test_weighted_ce_mean_divides_by_weight_sum():
    z = np.array([[2.0, -1.0, 0.5], [0.0, 1.0, -0.5], [1.5, 1.5, -2.0]])
    y = np.array([0, 2, 2])
    w = np.array([0.5, 1.0, 3.0])
    terms = ce_terms(z, y)
    expected = (w[y] * terms).sum() / w[y].sum()  # = (0.5 l0 + 3 l1 + 3 l2) / 6.5
    got = float(weighted_ce(t(z), torch.as_tensor(y), t(w)))
    assert got == pytest.approx(expected, rel=1e-6)
    assert got != pytest.approx((w[y] * terms).sum() / len(y), rel=1e-3)
    assert float(weighted_ce(t(z), torch.as_tensor(y), None)) == pytest.approx(terms.mean(), rel=1e-6)


def test_drw_switch_epoch_default():
    assert resolve_switch_epoch(None, 200) == 160
    assert resolve_switch_epoch(None, 2) == 2
    assert resolve_switch_epoch(7, 200) == 7


def test_ce_drw_switch_at_160_of_200():
    m = make("ce_drw", ctx(CIFAR100_R100, epochs=200, feature_dim=3))
    m.on_epoch_start(159)
    np.testing.assert_array_equal(m.drw.weights.numpy(), np.ones(100))
    m.on_epoch_start(160)
    np.testing.assert_allclose(m.drw.weights.double().numpy(), drw_ref(CIFAR100_R100, 0.9999), rtol=1e-6)
    m.on_epoch_start(199)
    assert m.drw.active


def test_ce_drw_loss_and_prediction():
    m = make("ce_drw")
    set_linear(m)
    z = linear_logits()
    assert loss_of(m, epoch=159) == pytest.approx(ce_ref(z, Y), rel=1e-6)
    assert loss_of(m, epoch=160) == pytest.approx(ce_ref(z, Y, drw_ref(COUNTS, 0.9999)), rel=1e-5)
    # the switch also follows the epoch passed to loss when on_epoch_start was not called
    out = m.loss([t(X)], torch.as_tensor(Y), epoch=3)
    assert float(out["loss"].detach()) == pytest.approx(ce_ref(z, Y), rel=1e-6) and float(out["drw_active"]) == 0.0
    m2 = make("ce_drw", drw_epoch=2, beta=0.99)
    set_linear(m2)
    assert loss_of(m2, epoch=1) == pytest.approx(ce_ref(z, Y), rel=1e-6)
    assert loss_of(m2, epoch=2) == pytest.approx(ce_ref(z, Y, drw_ref(COUNTS, 0.99)), rel=1e-5)
    np.testing.assert_allclose(scores(m), z, **TOL)
    np.testing.assert_allclose(scores(m, TARGET), z + np.log(3 * TARGET), **TOL)


# ------------------------------------------------------------------------------------------------
# LDAM

V = np.array([[0.6, -0.8, 0.1],  # cosine-layer weight, stored (in, out) as in LDAM
              [0.3, 0.5, -0.9],
              [-0.4, 0.2, 0.7]])


def cosines() -> np.ndarray:
    xn = X / np.linalg.norm(X, axis=1, keepdims=True)
    vn = V / np.linalg.norm(V, axis=0, keepdims=True)
    return xn @ vn


def ldam_margins_ref(counts, max_m=0.5) -> np.ndarray:
    inv = np.asarray(counts, dtype=np.float64) ** -0.25
    return max_m * inv / inv.max()


def set_cosine(method) -> None:
    with torch.no_grad():
        method.head.weight.copy_(t(V))


def ldam_loss_ref(max_m=0.5, s=30.0, class_weights=None) -> float:
    z = cosines().copy()
    m = ldam_margins_ref(COUNTS, max_m)
    z[np.arange(len(Y)), Y] -= m[Y]  # margin on the true class only
    return ce_ref(s * z, Y, class_weights)


def test_ldam_margins_cifar100_rho100():
    m = ldam_margins(CIFAR100_R100, 0.5).double().numpy()
    assert round(m[0], 3) == 0.158
    assert m[-1] == pytest.approx(0.5)
    np.testing.assert_allclose(m, ldam_margins_ref(CIFAR100_R100), rtol=1e-6)


def test_ldam_small_margins():
    np.testing.assert_allclose(make("ldam").margins.double().numpy(), [0.5 * 10**-0.5, 0.5 * 10**-0.25, 0.5],
                               rtol=1e-6)


def test_normed_linear_init_unit_columns():
    m = make("ldam", ctx(feature_dim=8))
    assert tuple(m.head.weight.shape) == (8, 3)
    np.testing.assert_allclose(m.head.weight.detach().norm(dim=0).numpy(), np.ones(3), rtol=1e-5)


def test_ldam_loss_without_drw():
    m = make("ldam")
    set_cosine(m)
    assert not m.cfg.drw
    assert loss_of(m, epoch=0) == pytest.approx(ldam_loss_ref(), rel=1e-5)
    assert loss_of(m, epoch=190) == pytest.approx(ldam_loss_ref(), rel=1e-5)  # never re-weighted
    m2 = make("ldam", max_m=0.3, s=10.0)
    set_cosine(m2)
    assert loss_of(m2) == pytest.approx(ldam_loss_ref(max_m=0.3, s=10.0), rel=1e-5)


def test_ldam_drw_loss():
    m = make("ldam_drw")
    set_cosine(m)
    assert m.cfg.drw and m.drw.switch_epoch == 160
    assert loss_of(m, epoch=159) == pytest.approx(ldam_loss_ref(), rel=1e-5)
    assert loss_of(m, epoch=160) == pytest.approx(ldam_loss_ref(class_weights=drw_ref(COUNTS, 0.9999)), rel=1e-5)


def test_ldam_prediction():
    for name in ("ldam", "ldam_drw"):
        m = make(name)
        set_cosine(m)
        raw = 30.0 * cosines()
        np.testing.assert_allclose(scores(m), raw, **TOL)
        np.testing.assert_array_equal(scores(m, np.full(3, 1 / 3)), scores(m))
        np.testing.assert_allclose(scores(m, TARGET), raw + np.log(TARGET) + np.log(3), rtol=1e-5, atol=1e-4)


# ------------------------------------------------------------------------------------------------
# Cosine classifier


def test_cosine_loss_and_prediction():
    m = make("cosine")
    set_cosine(m)
    z = 30.0 * cosines()
    assert loss_of(m) == pytest.approx(ce_ref(z, Y), rel=1e-5)
    np.testing.assert_allclose(scores(m), z, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(scores(m, TARGET), z, rtol=1e-5, atol=1e-4)  # posthoc_tau 0: raw argmax
    assert "scale" not in dict(m.named_parameters()) and "scale" not in m.state_dict()


def test_cosine_posthoc():
    m = make("cosine", s=16.0, posthoc_tau=1.0)
    set_cosine(m)
    z = 16.0 * cosines() - np.log(PI + 1e-12)
    np.testing.assert_allclose(scores(m), z, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(scores(m, TARGET), z + np.log(3 * TARGET), rtol=1e-5, atol=1e-4)


def test_cosine_learnable_scale_gets_gradient():
    m = make("cosine", learn_scale=True, s=10.0)
    set_cosine(m)
    assert isinstance(m.scale, torch.nn.Parameter) and float(m.scale.detach()) == 10.0
    out = m.loss([t(X)], torch.as_tensor(Y), epoch=0)
    assert float(out["loss"].detach()) == pytest.approx(ce_ref(10.0 * cosines(), Y), rel=1e-5)
    out["loss"].backward()
    assert m.scale.grad is not None and float(m.scale.grad.abs()) > 0
    # analytic d/ds CE(s·c, y) = mean_i (softmax(s c_i) · c_i - c_{i,y_i})
    c = cosines()
    p = np.exp(10 * c) / np.exp(10 * c).sum(1, keepdims=True)
    grad = ((p * c).sum(1) - c[np.arange(3), Y]).mean()
    assert float(m.scale.grad) == pytest.approx(grad, rel=1e-4)
    groups = m.param_groups()
    assert groups and groups[0]["params"][0] is m.scale and groups[0]["weight_decay"] == 0.0
    assert "scale" in m.state_dict()


def test_la_test_normalize_predicts_with_a_rescaled_cosine():
    from ltbench.method import MethodContext, create_method

    torch.manual_seed(0)
    ctx = MethodContext(num_classes=3, class_counts=torch.tensor([100, 10, 1]), feature_dim=4, epochs=2)
    la = create_method({"name": "la", "test_normalize": True}, ctx)
    h = torch.randn(6, 4, dtype=torch.float32) * 3
    la.loss([h], torch.tensor([0, 1, 2, 0, 1, 2]), epoch=0)
    assert float(la.feature_norm) == pytest.approx(h.double().norm(dim=1).mean().item(), rel=1e-6)
    w = la.head.weight.detach().double()
    x = torch.randn(5, 4, dtype=torch.float64)
    expected = (w.norm(dim=1).mean() * h.double().norm(dim=1).mean()) * (
        (x / x.norm(dim=1, keepdim=True)) @ (w / w.norm(dim=1, keepdim=True)).T)
    got = la.predict(x.float())
    assert torch.allclose(got.double(), expected, atol=1e-4)
    plain = create_method({"name": "la"}, ctx)
    plain.load_state_dict(la.state_dict())
    assert not torch.allclose(plain.predict(x.float()), got)


def test_la_cosine_head():
    from ltbench.method import MethodContext, create_method

    ctx = MethodContext(num_classes=3, class_counts=torch.tensor([100, 10, 1]), feature_dim=4, epochs=2)
    la = create_method({"name": "la", "head": "cosine", "s": 10.0}, ctx)
    x = torch.randn(5, 4)
    w = la.head.weight.detach()
    expected = 10.0 * (x / x.norm(dim=1, keepdim=True)) @ (w / w.norm(dim=0, keepdim=True))
    assert torch.allclose(la.predict(x), expected, atol=1e-5)
