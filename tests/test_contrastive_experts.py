"""ProCo, BCL and SADE against their official code (golden values), and the multi-expert / test-time machinery.

The golden numbers were computed by running the official implementations (LeapLabTHU/ProCo af9e78e,
FlamieZhu/Balanced-Contrastive-Learning f72d070, Vanint/SADE-AgnosticLT cba11b8) on exactly the inputs the
helpers below build, on CPU; the figures and the reasons for each difference are in docs/protocols.md §8.
No official code is in this repository: only its outputs.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from ltbench.config import from_dict
from ltbench.experts import MultiExpert, split_experts
from ltbench.method import MethodContext
from ltbench.registry import BACKBONES, METHODS, discover

discover()
COUNTS = [500, 300, 180, 108, 65, 39, 23, 14, 8, 5]
K = len(COUNTS)


def method(name: str, feature_dim: int, **options):
    cls = METHODS.get(name)
    ctx = MethodContext(num_classes=K, class_counts=torch.tensor(COUNTS), feature_dim=feature_dim, epochs=2)
    return cls(from_dict(cls.Config, options, "method"), ctx)


# -------------------------------------------------------------------------------------------------
# ProCo


def proco_inputs(seed: int, b: int = 40, p: int = 128):
    """Unit features of two views, every class present, clustered around per-class directions."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.cat([torch.arange(K), torch.randint(0, K, (b - K,), generator=g)])
    centres = torch.randn(K, p, generator=torch.Generator().manual_seed(99))
    f2 = F.normalize(torch.randn(b, p, generator=g) + 0.8 * centres[labels], dim=1)
    f3 = F.normalize(f2 + 0.3 * torch.randn(b, p, generator=g), dim=1)
    return labels, f2, f3


# Official ProCoLoss + LogitAdjust, (f2, f3) per step, steps (epoch, seed): (0, 1), (0, 2), (1, 3).
PROCO_OFFICIAL = [
    {"loss": 0.9104896769879445, "grad_sum": -0.5410920551157972, "grad_abs_sum": 24.341608935934516},
    {"loss": 1.2534298383324023, "grad_sum": -1.5182465567910413, "grad_abs_sum": 27.708594844587424},
    {"loss": 1.6209858596234519, "grad_sum": -1.9219979013007205, "grad_abs_sum": 30.653122351594128},
]
PROCO_OFFICIAL_KAPPA_STEP2 = [71.5903, 69.2349, 75.571, 70.1366, 66.812, 72.2246, 70.5611, 81.7169, 77.8035, 71.9226]


def test_proco_loss_gradient_and_kappa_match_the_official_code():
    """The method itself (its epoch window, update order and logits), with the projection replaced by the
    identity so that the official loss sees the same unit features."""
    m = method("proco", 128, alpha=1.0)
    m.branches.project = lambda h: h  # the inputs are unit vectors already
    for step, (epoch, seed) in enumerate([(0, 1), (0, 2), (1, 3)]):
        labels, f2, f3 = proco_inputs(seed)
        m.on_epoch_start(epoch)
        z2, z3 = f2.clone().requires_grad_(), f3.clone().requires_grad_()
        out = m.loss([torch.zeros(len(labels), 128), z2, z3], labels, epoch=epoch)
        out["loss"].backward()
        official = PROCO_OFFICIAL[step]
        assert float(out["loss_proco"]) == pytest.approx(official["loss"], abs=5e-6)
        grads = torch.cat([z2.grad, z3.grad]).double()
        assert float(grads.sum()) == pytest.approx(official["grad_sum"], abs=1e-4)
        assert float(grads.abs().sum()) == pytest.approx(official["grad_abs_sum"], rel=1e-5)
    kappa = torch.tensor(m.result_extras()["kappa"])
    assert kappa.tolist() == pytest.approx(PROCO_OFFICIAL_KAPPA_STEP2, rel=2e-6)


def test_proco_epoch_window_keeps_previous_and_current_epoch():
    m = method("proco", 8, proj_dim=8)
    labels = torch.arange(K)
    z = F.normalize(torch.randn(K, 8), dim=1)
    m.on_epoch_start(0)
    m.update_statistics(z, labels)
    m.on_epoch_start(1)
    assert m.stats.count.tolist() == [1.0] * K and m.stats_current.count.tolist() == [0.0] * K
    m.update_statistics(z, labels)
    assert m.stats.count.tolist() == [2.0] * K
    m.on_epoch_start(1)  # a second call for the same epoch (resume) changes nothing
    assert m.stats.count.tolist() == [2.0] * K


# -------------------------------------------------------------------------------------------------
# BCL


def bcl_inputs(seed: int, b: int = 24, d: int = 32):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (b,), generator=g) if seed == 3 else torch.randint(0, K, (b,), generator=g)
    z1 = F.normalize(torch.randn(b, d, generator=g), dim=1)
    z2 = F.normalize(z1 + 0.5 * torch.randn(b, d, generator=g), dim=1)
    centres = F.normalize(torch.randn(K, d, generator=g), dim=1)
    return labels, z1, z2, centres


# Official BalSCL(temperature 0.07): loss, sum of the feature gradients, |gradient| summed over the centres.
BCL_OFFICIAL = {1: (4.773648262023926, 0.22337874564982485, 8.653614724767976),
                2: (5.010443210601807, -0.3556537976837717, 9.412032018430182),
                3: (4.563861846923828, -2.6104853016440757, 12.046295539897983)}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_bcl_loss_and_gradients_match_the_official_code(seed):
    from methods.bcl import bcl_loss

    labels, z1, z2, centres = (t.clone() for t in bcl_inputs(seed))
    for t in (z1, z2, centres):
        t.requires_grad_()
    loss = bcl_loss(centres, z1, z2, labels, 0.07)
    loss.backward()
    official_loss, grad_sum, centre_abs = BCL_OFFICIAL[seed]
    assert float(loss.detach()) == pytest.approx(official_loss, rel=1e-6)  # bit-equal on the machine that made them
    assert float(z1.grad.double().sum() + z2.grad.double().sum()) == pytest.approx(grad_sum, abs=1e-5)
    assert float(centres.grad.double().abs().sum()) == pytest.approx(centre_abs, rel=1e-6)


def test_bcl_class_averaging_divides_by_class_counts_in_batch():
    """With one sample per class in each view, class-averaging divides every negative by |B_c| = 3 (two
    views and the centre) and the anchor's own class by 2: the same as plain SupCon scaled per class."""
    from methods.bcl import bcl_loss

    labels = torch.arange(K)
    z1 = F.normalize(torch.randn(K, 6), dim=1)
    z2 = F.normalize(torch.randn(K, 6), dim=1)
    c = F.normalize(torch.randn(K, 6), dim=1)
    feats, targets = torch.cat([z1, z2, c]), torch.cat([labels, labels, labels])
    logits = torch.cat([z1, z2]) @ feats.T / 0.1
    weight = torch.full_like(logits, 3.0)
    same = labels.repeat(2)[:, None] == targets[None]
    self_mask = torch.zeros_like(logits, dtype=torch.bool)
    self_mask[torch.arange(2 * K), torch.arange(2 * K)] = True
    weight[same & ~self_mask] = 2.0
    denom = (logits.exp() / weight).masked_fill(self_mask, 0).sum(1, keepdim=True)
    pos = (same & ~self_mask).float()
    expected = -((pos * (logits - denom.log())).sum(1) / pos.sum(1)).mean()
    assert float(bcl_loss(c, z1, z2, labels, 0.1)) == pytest.approx(float(expected), rel=1e-5)


# -------------------------------------------------------------------------------------------------
# SADE


SADE_INVERSE_PRIOR = [0.004025764763355255, 0.006441223900765181, 0.011272141709923744, 0.018518518656492233,
                      0.03140096738934517, 0.05233494192361832, 0.08695652335882187, 0.14492753148078918,
                      0.2415459007024765, 0.4025764763355255]


def test_sade_loss_and_inverse_prior_match_the_official_code():
    from methods.sade import expert_shifts, inverse_prior

    g = torch.Generator().manual_seed(5)
    labels = torch.randint(0, K, (32,), generator=g)
    logits = [(30 * torch.tanh(torch.randn(32, K, generator=g))).requires_grad_() for _ in range(3)]
    prior = torch.tensor(COUNTS, dtype=torch.float32) / sum(COUNTS)
    assert inverse_prior(prior).tolist() == pytest.approx(SADE_INVERSE_PRIOR, rel=1e-6)
    loss = sum(F.cross_entropy(z + s, labels) for z, s in zip(logits, expert_shifts(prior, 2.0)))
    loss.backward()
    assert float(loss.detach()) == pytest.approx(78.3245620727539, rel=1e-6)  # official DiverseExpertLoss(tau=2)
    assert float(sum(z.grad.double().abs().sum() for z in logits)) == pytest.approx(5.270993301325021, rel=1e-6)


def sade_views(skew, n=1000, seed=11):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, K, generator=g)
    experts = [10 * (base + 0.7 * torch.randn(n, K, generator=g) + s) for s in skew]
    view_a = [z + torch.randn(n, K, generator=g) for z in experts]
    view_b = [z + torch.randn(n, K, generator=g) for z in experts]
    return view_a, view_b


# Official test_training loop (5 epochs, batch 128, stop when a rounded weight < 0.05) on these logits.
SADE_OFFICIAL_WEIGHTS = {
    ("forward", 0.1): ([0.307934045791626, 0.3538844883441925, 0.3381814956665039], 5),
    ("backward", 0.1): ([0.3367883861064911, 0.3462841212749481, 0.3169274926185608], 5),
    ("backward", 20.0): ([0.0029009145218878984, 0.9941272735595703, 0.0029718424193561077], 1),
}


@pytest.mark.parametrize("direction,lr", list(SADE_OFFICIAL_WEIGHTS))
def test_sade_test_time_weights_match_the_official_code(direction, lr):
    from methods.sade import self_supervised_weights

    log_prior = torch.log(torch.tensor(COUNTS, dtype=torch.float64) / sum(COUNTS)).float()
    sign = 1.0 if direction == "forward" else -1.0
    views = sade_views([sign * log_prior, 0 * log_prior, -sign * log_prior])
    weights, epochs = self_supervised_weights(lambda epoch: views, 5, lr, 128, torch.Generator().manual_seed(0))
    expected, expected_epochs = SADE_OFFICIAL_WEIGHTS[(direction, lr)]
    assert weights.tolist() == pytest.approx(expected, abs=1e-6)
    assert epochs == expected_epochs


def sade_views_per_epoch(skew, epochs: int, n: int = 1000, seed: int = 11):
    """The experts' logits of two views of n test images, the views drawn afresh for each test-time epoch."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, K, generator=g)
    experts = [10 * (base + 0.7 * torch.randn(n, K, generator=g) + s) for s in skew]
    return [([z + torch.randn(n, K, generator=g) for z in experts], [z + torch.randn(n, K, generator=g) for z in experts])
            for _ in range(epochs)]


# The official test_training (test_training_cifar.py, cba11b8), one call per epoch with the main loop's stop rule,
# SGD(lr, weight decay, momentum 0.9, Nesterov), fed each epoch's views in ltbench's batch order (permutations of a
# generator seeded 0): softmax of the learned weights and the epochs run. Bit-equal to ltbench on the machine
# that made them (max abs diff 0 in all four cases).
SADE_OFFICIAL_REDRAWN = {
    ("forward", 0.1, 5e-4): ([0.307780385017395, 0.32822486758232117, 0.3639947175979614], 5),
    ("backward", 0.1, 5e-4): ([0.355998158454895, 0.32353338599205017, 0.3204685151576996], 5),
    ("backward", 20.0, 5e-4): ([0.0029009145218878984, 0.9941272735595703, 0.0029718424193561077], 1),
    ("forward", 0.2, 2e-4): ([0.30065178871154785, 0.3141738772392273, 0.38517430424690247], 5),
}


@pytest.mark.parametrize("direction,lr,weight_decay", list(SADE_OFFICIAL_REDRAWN))
def test_sade_weights_on_views_redrawn_each_epoch_match_the_official_code(direction, lr, weight_decay):
    from methods.sade import self_supervised_weights

    log_prior = torch.log(torch.tensor(COUNTS, dtype=torch.float64) / sum(COUNTS)).float()
    sign = 1.0 if direction == "forward" else -1.0
    per_epoch = sade_views_per_epoch([sign * log_prior, 0 * log_prior, -sign * log_prior], 5)
    asked = []
    weights, epochs = self_supervised_weights(lambda epoch: asked.append(epoch) or per_epoch[epoch], 5, lr, 128,
                                              torch.Generator().manual_seed(0), weight_decay=weight_decay)
    expected, expected_epochs = SADE_OFFICIAL_REDRAWN[(direction, lr, weight_decay)]
    assert weights.tolist() == pytest.approx(expected, abs=1e-6)
    assert epochs == expected_epochs and asked == list(range(expected_epochs))  # no draw after the stop


def test_sade_adapt_asks_for_fresh_views_each_epoch_only_with_test_time_redraw():
    from ltbench.method import TestTimeViews

    feats = torch.randn(50, 24)
    for redraw, expected in ((True, [1, 2]), (False, [])):
        m = method("sade", 24, test_time_redraw=redraw, test_time_epochs=3).eval()
        asked = []
        views = TestTimeViews([feats, feats + 0.1], lambda epoch: asked.append(epoch) or [feats + epoch, feats - epoch])
        record = m.adapt(views)
        assert asked == expected[:record["epochs"] - 1]
        assert views.redraw(0)[0] is feats  # epoch 0 is the first draw itself


def test_sade_predicts_the_weighted_sum_and_resets_after_a_test_set():
    m = method("sade", 3 * 8).eval()
    feats = torch.randn(20, 24)
    experts = m.expert_logits(feats)
    assert torch.allclose(m.predict(feats), sum(experts) / 3, atol=1e-5)  # the official mean of the experts
    m.adapt([feats, feats + 0.01 * torch.randn(20, 24)])
    assert not torch.equal(m.weights, torch.full((3,), 1 / 3))
    m.reset_adaptation()
    assert torch.equal(m.weights, torch.full((3,), 1 / 3))
    skewed = torch.tensor([0.7, 0.1, 0.1, 0.05, 0.05, 0, 0, 0, 0, 0]) + 1e-3
    assert torch.equal(m.predict(feats, target_prior=skewed), m.predict(feats))  # test-agnostic by default


# -------------------------------------------------------------------------------------------------
# The general multi-expert model


def test_multi_expert_shares_the_trunk_and_expert_zero_is_the_backbone():
    torch.manual_seed(0)
    backbone = BACKBONES.get("resnet8")(None, in_channels=1).eval()
    x = torch.randn(3, 1, 16, 16)
    with torch.no_grad():
        alone = backbone(x)
    multi = MultiExpert(backbone, num_experts=3, expert_stages=3).eval()
    with torch.no_grad():
        out = multi(x)
    assert out.shape == (3, 3 * backbone.feature_dim) and multi.feature_dim == 192
    first, second, third = split_experts(out, 3)
    assert torch.equal(first, alone)  # expert 0 keeps the backbone's own stages
    assert not torch.allclose(second, first) and not torch.allclose(third, second)  # copies re-initialised
    shared = {id(p) for p in multi.shared.parameters()}
    assert all(id(p) not in shared for p in multi.experts.parameters())
    stem_and_stage1 = sum(p.numel() for p in multi.shared.parameters())
    assert stem_and_stage1 == sum(p.numel() for p in backbone.conv1.parameters()) + sum(
        p.numel() for p in backbone.bn1.parameters()) + sum(p.numel() for p in backbone.layers[0].parameters())


def test_multi_expert_refuses_a_split_the_backbone_does_not_have():
    backbone = BACKBONES.get("resnet8")(None, in_channels=1)
    with pytest.raises(ValueError, match="expert_stages must be 1 to 4"):
        MultiExpert(backbone, 3, 5)


@pytest.mark.slow
def test_torchvision_stages_compose_to_the_backbone():
    torch.manual_seed(0)
    backbone = BACKBONES.get("resnet50")(None, in_channels=3).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        y = x
        for stage in backbone.stages():
            y = stage(y)
        assert torch.equal(y, backbone(x))


@pytest.mark.slow
def test_sade_run_adapts_on_every_test_set(tmp_path, write_recipe):
    """End to end: the engine builds SADE's multi-expert network, trains it, and before predicting each test
    source learns the aggregation weights there; result.json records them and the per-expert heads."""
    from conftest import ROOT  # noqa: F401  (conftest path set-up)
    from ltbench.results import store
    from ltbench.run.local_pool import run_local
    from ltbench.recipe import load_recipe

    spec = load_recipe(write_recipe(extra={"method": {"name": "sade", "test_time_epochs": 2},
                                           "eval": {"test_sets": ["forward5", "backward5"]}})).runs[0]
    run_local([spec])
    result = json.loads(next((tmp_path / "results").rglob(store.RESULT)).read_text())
    assert result["status"] == "done", result.get("error")
    adapted = result["metrics"]["test_time_adaptation"]
    assert set(adapted) == {"test", "test_set:forward5", "test_set:backward5"}
    for record in adapted.values():
        assert sum(record["weights"]) == pytest.approx(1.0, abs=1e-5) and 1 <= record["epochs"] <= 2
    assert set(result["metrics"]["heads"]) == {"expert0", "expert1", "expert2", "mean"}
