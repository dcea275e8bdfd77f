"""ProCo, BCL and SADE against their official code (golden values), and the multi-expert / test-time machinery.

The golden numbers were computed by running the official implementations (LeapLabTHU/ProCo af9e78e,
FlamieZhu/Balanced-Contrastive-Learning f72d070, Vanint/SADE-AgnosticLT cba11b8) on exactly the inputs the
helpers below build, on CPU; the figures and the reasons for each difference are in docs/protocols.md §8.
No official code is in this repository: only its outputs.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
import torch.nn as nn
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


def proco_inputs_absent(seed: int, classes: list[int], b: int = 40, p: int = 128):
    """As proco_inputs, but only ``classes`` occur in the batch (the others are absent)."""
    g = torch.Generator().manual_seed(seed)
    present = torch.tensor(classes)
    labels = torch.cat([present, present[torch.randint(0, len(classes), (b - len(classes),), generator=g)]])
    centres = torch.randn(K, p, generator=torch.Generator().manual_seed(99))
    f2 = F.normalize(torch.randn(b, p, generator=g) + 0.8 * centres[labels], dim=1)
    f3 = F.normalize(f2 + 0.3 * torch.randn(b, p, generator=g), dim=1)
    return labels, f2, f3


# Official ProCoLoss (ProCo_cifar/loss/proco.py, af9e78e) + LogitAdjust on steps (epoch, seed, classes in the
# batch) with absent classes, its EstimatorCV's random means for unseen classes set to ltbench's draws
# (unseen_directions with the run seed below, at construction and at each epoch's reset): the ProCo loss (mean of
# the two views' LA-CE) and the gradient w.r.t. both views' features. Measured differences to ltbench: loss
# <= 4.0e-6, gradient entries <= 4.6e-7, kappa relative 7e-7 (float32 official, float64 ltbench); with unseen 'zero'
# the loss differs by up to 4.5e-3 and the logits by up to 2.3.
PROCO_UNSEEN_STEPS = [(0, 1, [0, 1, 2, 3, 4, 5]), (0, 2, [0, 1, 2, 3, 7]), (1, 3, [0, 1, 2, 3, 4]), (2, 4, [0, 1, 6])]
PROCO_UNSEEN_SEED = 1932800489
PROCO_UNSEEN_OFFICIAL = [
    {"loss": 0.6667803181052542, "grad_sum": 0.519874913779546, "grad_abs_sum": 19.246100532700694},
    {"loss": 0.7496986096093923, "grad_sum": -0.06222647442121243, "grad_abs_sum": 20.149204410029288},
    {"loss": 0.8108687788137448, "grad_sum": -1.066091953094002, "grad_abs_sum": 21.376737643565974},
    {"loss": 0.9027271550334242, "grad_sum": 0.6905069159144546, "grad_abs_sum": 21.62792662307521},
]
PROCO_UNSEEN_KAPPA = [73.9877, 66.2883, 80.1202, 84.2066, 68.7608, 606.3152, 73.4137, 606.3156, 606.3156, 606.3156]


def test_proco_unseen_official_matches_the_official_code_on_batches_with_absent_classes():
    m = method("proco", 128, alpha=1.0, unseen="official")
    m.branches.project = lambda h: h
    m.unseen_seed.fill_(PROCO_UNSEEN_SEED)
    for step, (epoch, seed, classes) in enumerate(PROCO_UNSEEN_STEPS):
        labels, f2, f3 = proco_inputs_absent(seed, classes)
        m.on_epoch_start(epoch)
        z2, z3 = f2.clone().requires_grad_(), f3.clone().requires_grad_()
        out = m.loss([torch.zeros(len(labels), 128), z2, z3], labels, epoch=epoch)
        (out["loss"] - out["loss_ce"]).backward()
        official = PROCO_UNSEEN_OFFICIAL[step]
        assert float(out["loss_proco"]) == pytest.approx(official["loss"], abs=1e-5)
        grads = torch.cat([z2.grad, z3.grad]).double()
        assert float(grads.sum()) == pytest.approx(official["grad_sum"], abs=1e-4)
        assert float(grads.abs().sum()) == pytest.approx(official["grad_abs_sum"], rel=1e-5)
    assert m.result_extras()["kappa"] == pytest.approx(PROCO_UNSEEN_KAPPA, rel=2e-6)  # unseen: p 0.9 / 0.19


def test_proco_unseen_zero_is_the_default_and_official_draws_are_seeded_per_run():
    zero = method("proco", 8, proj_dim=8)
    assert not hasattr(zero, "unseen_seed") and "unseen_seed" not in zero.state_dict()
    torch.manual_seed(5)
    a = method("proco", 8, proj_dim=8, unseen="official")
    torch.manual_seed(5)
    b = method("proco", 8, proj_dim=8, unseen="official")
    torch.manual_seed(5)
    z = method("proco", 8, proj_dim=8)
    assert torch.equal(a.unseen_seed, b.unseen_seed)  # seeded by the run (the engine seeds torch first)
    assert all(torch.equal(x, y) for x, y in zip(z.parameters(), a.parameters()))  # drawn after the heads
    for m in (a, b):
        m.on_epoch_start(3)
    assert torch.equal(a.unseen_mean, b.unseen_mean)
    assert a.unseen_mean.norm(dim=1).tolist() == pytest.approx([0.9] * K, rel=1e-6)
    first = a.unseen_mean.clone()
    a.on_epoch_start(4)
    assert not torch.allclose(first, a.unseen_mean)  # redrawn at each reset, as officially


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


# SADE's official CIFAR network. A re-statement, in this test's own words, of Vanint/SADE-AgnosticLT (cba11b8)
# model/ldam_drw_resnets/expert_resnet_cifar.py ResNet_s(BasicBlock, [5, 5, 5], num_experts=3,
# reduce_dimension=True, use_norm=True, s=30): stem and layer1 shared; per expert layer2 (24 channels) and layer3
# (48), option-A shortcuts padding (planes - in_planes) // 2 channels on each side, avg_pool2d over the whole
# map, NormedLinear (weight (in, K), both sides normalised) times s. Run beside the official module on the same
# weights (CPU, outside the repository) it is bit-equal (max abs diff 0) and has the same 783,856 parameters.


class OfficialBlock(nn.Module):
    def __init__(self, cin: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.pad = (planes - cin) // 2 if stride != 1 or cin != planes else None

    def forward(self, x):
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        short = x if self.pad is None else F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad))
        return F.relu(out + short)


def official_layer(cin: int, planes: int, stride: int, blocks: int = 5) -> nn.Sequential:
    return nn.Sequential(OfficialBlock(cin, planes, stride), *[OfficialBlock(planes, planes, 1) for _ in range(blocks - 1)])


class OfficialExpertResNet32(nn.Module):
    def __init__(self, num_classes: int, widths=(16, 24, 48), experts: int = 3, s: float = 30.0):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.layer1 = official_layer(widths[0], widths[0], 1)
        self.layer2s = nn.ModuleList([official_layer(widths[0], widths[1], 2) for _ in range(experts)])
        self.layer3s = nn.ModuleList([official_layer(widths[1], widths[2], 2) for _ in range(experts)])
        self.linears = nn.ParameterList([nn.Parameter(torch.randn(widths[2], num_classes)) for _ in range(experts)])
        self.s = s

    def forward(self, x):  # the official 'logits' output, (N, experts, K)
        out = self.layer1(F.relu(self.bn1(self.conv1(x))))
        logits = []
        for l2, l3, w in zip(self.layer2s, self.layer3s, self.linears):
            h = l3(l2(out))
            h = F.avg_pool2d(h, h.size()[3]).flatten(1)
            logits.append(F.normalize(h, dim=1).mm(F.normalize(w, dim=0)) * self.s)
        return torch.stack(logits, dim=1)


OFFICIAL_NAMES = [(r"^shared\.0\.conv\.", "conv1."), (r"^shared\.0\.bn\.", "bn1."), (r"^shared\.1\.", "layer1."),
                  (r"^experts\.(\d+)\.0\.", r"layer2s.\1."), (r"^experts\.(\d+)\.1\.", r"layer3s.\1."),
                  (r"^heads\.(\d+)\.cos\.weight$", r"linears.\1")]


def official_state(*state_dicts) -> dict:
    """ltbench's MultiExpert + SADE heads state, renamed to the official module's names (every key mapped)."""
    out = {}
    for key, value in (item for sd in state_dicts for item in sd.items()):
        for pattern, name in OFFICIAL_NAMES:
            if re.match(pattern, key):
                out[re.sub(pattern, name, key)] = value
                break
        else:
            raise KeyError(f"{key} has no official counterpart")
    return out


def test_sade_cifar_network_is_the_official_reduced_network():
    """expert_width 0.75 on ResNet-32 is the official reduce_dimension network: the same parameter count, and
    with the same weights (random BatchNorm statistics) the same expert logits up to float32 summation order."""
    counts = [int(500 * 0.01 ** (i / 99)) for i in range(100)]
    torch.manual_seed(1)
    cfg = from_dict(METHODS.get("sade").Config, {"expert_width": 0.75}, "method")
    net = METHODS.get("sade").build_model(cfg, BACKBONES.get("resnet32")(None, in_channels=3))
    sade = METHODS.get("sade")(cfg, MethodContext(100, torch.tensor(counts), net.feature_dim, 2))
    for bn in (m for m in net.modules() if isinstance(m, nn.BatchNorm2d)):
        bn.running_mean.normal_(0, 0.1), bn.running_var.uniform_(0.5, 1.5), bn.weight.data.uniform_(0.5, 1.5)
    official = OfficialExpertResNet32(100)
    official.load_state_dict(official_state(net.state_dict(), sade.state_dict()), strict=True)
    assert sum(p.numel() for p in official.parameters()) == 783_856
    assert sum(p.numel() for p in [*net.parameters(), *sade.parameters()]) == 783_856
    x = torch.randn(8, 3, 32, 32)
    with torch.no_grad():
        ours = torch.stack(sade.expert_logits(net.eval()(x)), 1)
        theirs = official.eval()(x)
    assert (ours - theirs).abs().max() < 2e-5  # measured 3.8e-6 on logits up to 13
    full = METHODS.get("sade").build_model(from_dict(METHODS.get("sade").Config, {"expert_width": 1.0}, "m"),
                                           BACKBONES.get("resnet32")(None, in_channels=3))
    assert sum(p.numel() for p in full.parameters()) + 3 * 64 * 100 == 1_362_064  # expert_width 1.0: full widths


# CIFAR-100-LT at rho 100 (LDAM-DRW counts int(500 * 0.01 ** (i / 99))) has ten groups of tied counts. The
# official DiverseExpertLoss.inverse_prior run on the CPU (cba11b8, torch 2.14.1, x86-64) orders each group so:
OFFICIAL_CPU_TIES = {5: [99, 98, 97, 96], 6: [95, 94, 93, 92], 7: [91, 90, 89], 8: [87, 88], 9: [86, 85],
                     10: [84, 83], 11: [82, 81], 12: [80, 79], 13: [78, 77], 15: [75, 74]}


def test_sade_inverse_prior_tie_order_on_cifar100_rho100():
    from methods.sade import expert_shifts, inverse_prior

    counts = [int(500 * 0.01 ** (i / 99)) for i in range(100)]
    prior = torch.tensor([c / sum(counts) for c in counts], dtype=torch.float64).float()  # as the official prior

    def order_of_ties(inverse):  # each tied group, from the class given the largest inverse value down
        groups = {}
        for i in sorted(range(100), key=lambda i: float(inverse[i]), reverse=True):
            groups.setdefault(counts[i], []).append(i)
        return {c: g for c, g in groups.items() if len(g) > 1}

    stable, official = inverse_prior(prior, "stable"), inverse_prior(prior, "official_cpu")
    assert order_of_ties(official) == OFFICIAL_CPU_TIES
    assert all(g == sorted(g) for g in order_of_ties(stable).values())  # ties in label order
    assert sorted(stable.tolist()) == sorted(official.tolist())  # the same values, assigned differently
    assert int((stable != official).sum()) == 22  # all tied classes but 87/88, where both orders agree
    third = [expert_shifts(prior, 2.0, order)[2] for order in ("stable", "official_cpu")]
    assert float((third[0] - third[1]).abs().max()) == pytest.approx(0.2831, abs=1e-3)  # 2 * |log ratio| of 500/434
    assert torch.equal(inverse_prior(torch.tensor(COUNTS, dtype=torch.float32) / sum(COUNTS), "official_cpu"),
                       inverse_prior(torch.tensor(COUNTS, dtype=torch.float32) / sum(COUNTS)))  # no ties: equal


def test_sade_pipelines_give_the_official_augmentation():
    """'sade_test_time' against the official test-time transform restated with torchvision (v1) on PIL images
    (test_training_cifar.py / test_training_imagenet.py), the blur's sigma drawn from torch as ltbench does
    (officially Python's random), and 'sade_train' against the official CIFAR training transform: the same
    pixels, up to the float rounding of scaling to [0, 1] (measured: 7.2e-7)."""
    from PIL import Image, ImageFilter
    from torchvision import transforms as T

    from ltbench.data.base import ImageSpec
    from ltbench.registry import PIPELINES

    class Blur:
        def __call__(self, img):
            return img.filter(ImageFilter.GaussianBlur(radius=float(torch.empty(1).uniform_(0.1, 2.0))))

    def official(crop, blur_p, mean, std):
        return T.Compose([crop, T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), T.RandomGrayscale(p=0.2),
                          T.RandomApply([Blur()], p=blur_p), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(mean, std)])

    mean, std = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
    g = torch.Generator().manual_seed(0)
    cases = [(ImageSpec(32, 3, mean, std), official(T.RandomCrop(32, padding=4), 0.2, mean, std),
              [torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8, generator=g) for _ in range(40)]),
             (ImageSpec(64, 3, mean, std, kind="large"), official(T.RandomResizedCrop(64, scale=(0.2, 1.0)), 0.5, mean, std),
              [torch.randint(0, 256, (3, 80, 72), dtype=torch.uint8, generator=g) for _ in range(10)])]
    small = cases[0][0]
    train = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.RandomRotation(15), T.ToTensor(),
                       T.Normalize(mean, std)])  # the official CIFAR training view (data_loader/cifar_data_loaders.py)
    for name, spec, reference, images in [("sade_test_time", *cases[0]), ("sade_test_time", *cases[1]),
                                          ("sade_train", small, train, cases[0][2])]:
        ours = PIPELINES.get(name)(spec)
        for i, img in enumerate(images):
            torch.manual_seed(i)
            a = ours(img if spec.kind == "small" else Image.fromarray(img.permute(1, 2, 0).numpy()))
            torch.manual_seed(i)
            b = reference(Image.fromarray(img.permute(1, 2, 0).numpy()))
            assert a.shape == b.shape and (a - b).abs().max() < 2e-6


def test_test_time_views_are_redrawn_per_epoch_with_seeds_from_seed_source_epoch_and_index():
    from ltbench.train.engine import SeededSamples

    samples = SeededSamples({"test:adapt": list(range(10))}, seed=3)
    first, again = samples.eval_keys("test:adapt", 4), samples.eval_keys("test:adapt", 4, epoch=0)
    later, other = samples.eval_keys("test:adapt", 4, epoch=1), samples.eval_keys("test:adapt", 4, epoch=2)
    seeds = [[k[2] for batch in keys for k in batch] for keys in (first, later, other)]
    assert first == again and [k[1] for b in later for k in b] == list(range(10))  # same images, same order
    assert len({s for row in seeds for s in row}) == 30  # every (epoch, image) its own seed
    assert SeededSamples({"test:adapt": list(range(10))}, seed=4).eval_keys("test:adapt", 4, epoch=1) != later


def test_sade_recipes_get_the_official_width_and_recorded_runs_say_theirs():
    """expert_width was added after SADE results were recorded, with a new default: a recipe that leaves it
    out gets 0.75 written into the run's configuration; the recorded runs say 1.0 (their migration wrote
    it), the recipe that made them pins it, and 1.0 builds the full-width network they ran."""
    from pathlib import Path

    from ltbench.method import build_method_model, resolved_method_spec
    from ltbench.recipe import load_recipe

    default, full = resolved_method_spec({"name": "sade"}), resolved_method_spec({"name": "sade", "expert_width": 1.0})
    assert default["expert_width"] == 0.75 and full["expert_width"] == 1.0
    assert resolved_method_spec(default) == default  # resolving a resolved configuration changes nothing
    widths = {w: build_method_model(spec, BACKBONES.get("resnet8")(None, in_channels=1)).expert_dim
              for w, spec in ((0.75, default), (1.0, full))}
    assert widths == {0.75: 48, 1.0: 64}
    root = Path(__file__).resolve().parents[1]
    recipe = load_recipe(root / "recipes" / "fmnist_baselines_b.yaml")
    recorded = {p.name for p in (root / "docs" / "reference-results" / "fmnist_baselines_b").iterdir()}
    assert {r.run_id for r in recipe.runs} <= recorded


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
    with pytest.raises(ValueError, match="cannot narrow 16 channels to 12"):  # stage 1 keeps the stem's 16
        MultiExpert(backbone, 3, 4, 0.75)
    odd = MultiExpert(backbone, 2, 3, 0.8)  # 26 and 51 channels: the 25 padded channels split 12 / 13
    assert odd(torch.randn(2, 1, 16, 16)).shape == (2, 2 * 51)


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
def test_narrow_torchvision_experts_have_the_official_imagenet_parameter_count():
    """SADE's ImageNet-LT network (official Expert_ResNeXt, reduce_dimension: layer3/layer4 planes 192/384 per
    expert, NormedLinear heads, 1000 classes): 42,889,024 parameters, counted on the official module."""
    torch.manual_seed(0)
    network = MultiExpert(BACKBONES.get("resnext50_32x4d")(None, in_channels=3), 3, 3, 0.75)
    assert network.expert_dim == 1536
    assert sum(p.numel() for p in network.parameters()) + 3 * 1536 * 1000 == 42_889_024
    with torch.no_grad():
        assert network.eval()(torch.randn(1, 3, 64, 64)).shape == (1, 3 * 1536)


@pytest.mark.slow
def test_sade_run_adapts_on_every_test_set(tmp_path, write_recipe):
    """End to end: the engine builds SADE's multi-expert network, trains it, and before predicting each test
    source learns the aggregation weights there; result.json records them and the per-expert heads."""
    from conftest import ROOT  # noqa: F401  (conftest path set-up)
    from ltbench.results import store
    from ltbench.run.local_pool import run_local
    from ltbench.recipe import load_recipe

    sade = {"name": "sade", "test_time_epochs": 2, "test_time_redraw": True,
            "test_time_views": ["sade_test_time", "sade_test_time"]}  # the official views, redrawn each epoch
    spec = load_recipe(write_recipe(extra={"method": sade, "eval": {"test_sets": ["forward5", "backward5"]}})).runs[0]
    assert spec.config["method"]["expert_width"] == 0.75  # the official narrower experts, written out
    run_local([spec])
    result = json.loads(next((tmp_path / "results").rglob(store.RESULT)).read_text())
    assert result["status"] == "done", result.get("error")
    adapted = result["metrics"]["test_time_adaptation"]
    assert set(adapted) == {"test", "test_set:forward5", "test_set:backward5"}
    for record in adapted.values():
        assert sum(record["weights"]) == pytest.approx(1.0, abs=1e-5) and 1 <= record["epochs"] <= 2
    assert set(result["metrics"]["heads"]) == {"expert0", "expert1", "expert2", "mean"}
    network = MultiExpert(BACKBONES.get("resnet8")(None, in_channels=3), 3, 3, 0.75)
    counts = result["parameters"]
    assert counts["backbone"]["total"] == sum(p.numel() for p in network.parameters())
    assert counts["method"] == {"total": 3 * 48 * 4, "trainable": 3 * 48 * 4}
    assert counts["total"] == counts["trainable"] == counts["backbone"]["total"] + counts["method"]["total"]
