"""Balanced Softmax, CB, VS and LADE against golden values computed by their official code (issue 24).

The official loss code was run, unmodified, in a scratch directory outside the repository on the inputs below
(docs/protocols.md §8 has the commands, repositories, commits and the full comparison); only its numbers are
carried over here. Inputs: K = 10 classes with the Fashion-MNIST-LT counts (rho 100, n_max 500), a batch of
32 logits drawn from NumPy's legacy RandomState(0) (stable across NumPy versions) in which the three rarest
classes but two are absent; float32. Each method's head is set to the identity so that its loss sees exactly
these logits, and gradients are taken with respect to them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ltbench.method import MethodContext, create_method
from methods._drw import drw_weights
from methods.balanced_softmax import log_class_counts
from methods.cb import class_balanced_loss
from methods.lade import lade_regulariser
from methods.vs import vs_adjustments

COUNTS = [500, 299, 179, 107, 64, 38, 23, 13, 8, 5]


def official_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    rs = np.random.RandomState(0)
    logits = rs.normal(0.0, 3.0, size=(32, 10))
    labels = rs.randint(0, 7, size=32)
    labels[:3] = [9, 8, 0]
    return torch.tensor(logits, dtype=torch.float32, requires_grad=True), torch.tensor(labels)


def identity_method(name: str, **options):
    ctx = MethodContext(num_classes=10, class_counts=torch.tensor(COUNTS), feature_dim=10, epochs=200)
    method = create_method({"name": name, **options}, ctx)
    with torch.no_grad():
        method.head.weight.copy_(torch.eye(10))
        method.head.bias.zero_()
    return method


def loss_and_grad(fn) -> tuple[float, np.ndarray]:
    x, y = official_inputs()
    loss = fn(x, y)
    loss.backward()
    return loss.item(), x.grad.numpy().astype(np.float64)


def method_loss(name: str, epoch: int = 0, **options):
    method = identity_method(name, **options)
    method.on_epoch_start(epoch)
    return loss_and_grad(lambda x, y: method.loss([x], y, epoch=epoch)["loss"])


# (official loss, official gradient row 0, official sum of |gradient|), float32 runs of the official code.
GOLDEN = {
    # BalancedMetaSoftmax-Classification loss/BalancedSoftmaxLoss.py, balanced_softmax_loss(..., 'mean')
    "balanced_softmax": (5.4794206619262695,
                         [0.0147573678, 0.000147473329, 0.000500862836, 0.013203539, 0.00257676211,
                          3.00738293e-07, 5.90563432e-05, 1.22582082e-06, 8.7154973e-07, -0.0312474556],
                         1.7158708496901323),
    # VS-Loss class_imbalance/losses.py VSLoss(cls_num_list, gamma=0.2, tau=1.2)
    "vs": (4.930948734283447,
           [0.0271101333, 0.000196141045, 0.000353650859, 0.00219921721, 0.000314647041, 6.41857298e-07,
            8.53733218e-06, 6.61759657e-07, 3.64527125e-07, -0.0124404961],
           1.3153067277445132),
    # VSLoss(gamma=0.05, tau=0.75, weight=train.py's DRW weights with beta 0.9999)
    "vs_drw": (6.4534711837768555,
               [0.109096311, 0.00117203896, 0.00392556237, 0.080685392, 0.0166248325, 5.30591706e-06,
                0.000538129709, 2.02827487e-05, 1.56094848e-05, -0.175295919],
               1.6866243781500252),
    # LADE loss/PriorCELoss.py + 0.1 * loss/LADELoss.py (remine_lambda 0.1), as config/CIFAR100_LT/lade.yaml
    "lade": (5.8920063972473145,
             [0.0282868519, 0.000284096895, 0.000806913129, 0.0208825748, 0.00366659742, 6.9893224e-07,
              0.000213368738, 3.35037544e-06, 1.4256741e-06, -0.03164858],
             1.933341813950613),
    # LADE loss/LADELoss.py alone
    "lader": (4.125859260559082,
              [0.135294899, 0.00136623613, 0.00306050596, 0.0767903402, 0.010898347, 3.98194243e-06,
               0.00154312421, 2.12455561e-05, 5.54125245e-06, -0.00401122682],
              2.258307696830622),
    # CB, beta 0.9999: the official TensorFlow code (src/cifar_main.py: the weights of main(), the loss section
    # of _tower_fn() and focal_loss(), run through tensorflow.compat.v1 2.21 in eager mode)
    "cb_softmax": (3.024268627166748,
                   [0.0181788746, 0.000303787907, 0.00172343093, 0.0760037526, 0.0247983504, 4.87453462e-06,
                    0.00158149144, 5.80779961e-05, 6.71011876e-05, -0.122719727],
                   1.03822626248336),
    "cb_sigmoid": (9.816829681396484,
                   [0.122417308, 0.0945643708, 0.116833277, 0.122885309, 0.122581102, 0.0062257438,
                    0.116307251, 0.0477852449, 0.0520674661, -0.0277891755],
                   3.1475895835612846),
    "cb_focal_1": (8.825875282287598,
                   [0.12505056, 0.104709551, 0.128537118, 0.123730674, 0.124655887, 0.000621963525,
                    0.12842913, 0.0329287723, 0.0385605246, -0.011784127],
                   3.1070202163469545),
    "cb_focal_2": (8.242262840270996,
                   [0.127654374, 0.105096564, 0.138764709, 0.124573834, 0.126713753, 4.70038831e-05,
                    0.138878077, 0.0183702502, 0.0233123899, -0.00390560459],
                   3.046691980786633),
}


def check(key: str, loss: float, grad: np.ndarray, *, rtol: float):
    ref_loss, ref_row0, ref_abs = GOLDEN[key]
    assert loss == pytest.approx(ref_loss, rel=rtol, abs=0)
    np.testing.assert_allclose(grad[0], ref_row0, rtol=max(rtol, 1e-7), atol=1e-8)
    assert np.abs(grad).sum() == pytest.approx(ref_abs, rel=max(rtol, 1e-6))


def test_balanced_softmax_is_bit_equal_to_the_official_loss():
    check("balanced_softmax", *method_loss("balanced_softmax"), rtol=0)


def test_vs_matches_the_official_loss_with_and_without_drw():
    check("vs", *method_loss("vs", gamma=0.2, tau=1.2), rtol=0)
    check("vs_drw", *method_loss("vs", gamma=0.05, tau=0.75, drw=True, drw_epoch=0), rtol=0)


def test_lade_matches_the_official_prior_ce_plus_lader():
    check("lade", *method_loss("lade", alpha=0.1, remine_lambda=0.1), rtol=0)
    prior = torch.tensor(COUNTS, dtype=torch.float32) / sum(COUNTS)
    check("lader", *loss_and_grad(lambda x, y: lade_regulariser(x, y, prior, 0.1)), rtol=0)


@pytest.mark.parametrize("loss_type, gamma, key", [("softmax", 1.0, "cb_softmax"), ("sigmoid", 1.0, "cb_sigmoid"),
                                                 ("focal", 1.0, "cb_focal_1"), ("focal", 2.0, "cb_focal_2")])
def test_cb_matches_the_official_tensorflow_code_to_float32_rounding(loss_type, gamma, key):
    # TensorFlow's and torch's kernels round differently (gradients within 2e-8), and the focal modulator uses
    # softplus(-z) in place of log1p(exp(-z)) (module doc of methods/cb.py): one float32 rounding apart at most.
    method = identity_method("cb", loss_type=loss_type, beta=0.9999, gamma=gamma)
    assert (method.head.bias == 0).all()  # identity_method zeroed the -log(K-1) start of sigmoid / focal
    method.on_epoch_start(0)
    check(key, *loss_and_grad(lambda x, y: method.loss([x], y, epoch=0)["loss"]), rtol=2e-7)


def test_cb_sigmoid_and_focal_start_the_bias_at_the_official_prior():
    ctx = MethodContext(num_classes=10, class_counts=torch.tensor(COUNTS), feature_dim=4, epochs=2)
    for loss_type, bias in [("softmax", None), ("sigmoid", -math.log(9)), ("focal", -math.log(9))]:
        method = create_method({"name": "cb", "loss_type": loss_type}, ctx)
        if bias is None:
            assert method.param_groups() is None
        else:
            assert torch.allclose(method.head.bias, torch.full((10,), bias))
            assert method.param_groups() == [{"params": [method.head.bias], "weight_decay": 0.0}]


def test_per_class_quantities_equal_the_official_ones():
    delta, iota = vs_adjustments(torch.tensor(COUNTS), gamma=0.2, tau=1.2)
    # VSLoss.Delta_list / iota_list (float32 from NumPy float64), bit for bit
    assert delta.tolist() == [1.0, 1.1083061695098877, 1.2280707359313965, 1.3611853122711182, 1.5085440874099731,
                              1.6743154525756836, 1.8511791229248047, 2.074939012527466, 2.286525249481201,
                              2.5118863582611084]
    assert iota.tolist() == [-1.0860331058502197, -1.7030304670333862, -2.318699836730957, -2.9361681938171387,
                             -3.552903175354004, -4.178459167480469, -4.780969619750977, -5.465623378753662,
                             -6.0482330322265625, -6.612237453460693]
    # CB's and VS train.py's effective-number weights (beta 0.9999), float64 from NumPy; both official losses use
    # them in float32, where ltbench's are bit-equal
    official = [0.04035304627360199, 0.06680967007460042, 0.11093330904567567, 0.18491468814083753,
                0.30849118869811015, 0.5188896524828343, 0.8566535111789191, 1.5148603204704907,
                2.4610327625952793, 3.9370618510396493]
    assert drw_weights(COUNTS, 0.9999).tolist() == torch.tensor(official, dtype=torch.float32).tolist()
    # LADE's calculate_prior(10, img_max=500, prior=0.01) counts and prior (float32)
    assert [int(500 * 0.01 ** (i / 9)) for i in range(10)] == COUNTS
    assert identity_method("lade").prior.tolist() == [
        0.40453073382377625, 0.24190938472747803, 0.14482200145721436, 0.08656957745552063, 0.051779936999082565,
        0.030744336545467377, 0.018608413636684418, 0.01051779929548502, 0.006472492124885321, 0.004045307636260986]
    assert torch.equal(identity_method("balanced_softmax").log_counts, log_class_counts(torch.tensor(COUNTS)))


def test_cb_focal_stays_right_where_the_official_modulator_overflows():
    # A positive label with logit -100: the focal modulator (1 - p)**gamma is 1; the official
    # exp(-g*z - g*log1p(exp(-z))) overflows to exp(-inf) = 0 in float32 and drops the sample's loss.
    z = torch.tensor([[-100.0, 0.0]], requires_grad=True)
    loss = class_balanced_loss(z, torch.tensor([0]), torch.ones(2), "focal", 1.0)
    expected = 100.0 + math.log1p(math.exp(0.0)) * 0.5  # BCE(-100, 1) * 1 + BCE(0, 0) * sigmoid(0)**1
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    official = torch.exp(-1.0 * z - 1.0 * torch.log1p(torch.exp(-z)))[0, 0]
    assert official.item() == 0.0  # the overflow this avoids


def test_cb_softmax_and_sigmoid_reduce_over_the_batch_size_not_the_weight_sum():
    x, y = official_inputs()
    w = drw_weights(COUNTS, 0.9999)
    ce = torch.nn.functional.cross_entropy(x, y, reduction="none")
    assert class_balanced_loss(x, y, w, "softmax", 0.0).item() == pytest.approx((w[y] * ce).sum().item() / 32,
                                                                               rel=1e-6)
    onehot = torch.nn.functional.one_hot(y, 10).float()
    bce = torch.nn.functional.binary_cross_entropy_with_logits(x, onehot, reduction="none")
    assert class_balanced_loss(x, y, w, "sigmoid", 0.0).item() == pytest.approx(
        (w[y][:, None] * bce).sum().item() / 32, rel=1e-6)
    assert class_balanced_loss(x, y, w, "focal", 0.0).item() == class_balanced_loss(x, y, w, "sigmoid", 0.0).item()


# Published numbers of the authors' own material, read by hand from the official repositories (ltbench/claims/)
AUTHORS_NUMBERS = [
    ({"source": "LADE code, CVPR 2021 poster (Hong et al., 2021), Table 1", "dataset": "cifar100_lt", "imb_factor": 100,
      "method": "lade"}, {"all": 45.4}),
    ({"source": "LADE code, CVPR 2021 poster (Hong et al., 2021), Table 1", "dataset": "inat2018", "method": "pc_softmax"},
     {"all": 69.3}),
    ({"source": "LADE code, CVPR 2021 poster (Hong et al., 2021), Table 2", "dataset": "imagenet_lt", "method": "lade"},
     {"forward50": 67.4, "forward25": 64.8, "forward10": 61.3, "forward5": 58.6, "forward2": 55.2, "uniform": 53.0,
      "backward2": 51.2, "backward5": 49.8, "backward10": 49.2, "backward25": 49.3, "backward50": 50.0}),
    ({"source": "Class-balanced loss code README (richardaecn), results figure", "dataset": "cifar10_lt",
      "method": "cb_focal"}, {"all": 79.42}),
]


@pytest.mark.parametrize("fields, metrics", AUTHORS_NUMBERS)
def test_published_numbers_from_the_official_repositories(fields, metrics):
    from ltbench.report.claims import load_claims, match

    fields = dict(fields)
    source = fields.pop("source")
    found = [e for e in match(load_claims(), **fields) if e.source == source]
    assert len(found) == 1 and found[0].metrics == metrics


@pytest.mark.parametrize("name", ["balanced_softmax", "cb", "vs", "lade"])
def test_prediction_is_the_raw_logits_plus_the_target_prior_shift(name):
    method = identity_method(name)
    x, _ = official_inputs()
    x = x.detach()
    target = torch.tensor([0.3, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05, 0.04, 0.03, 0.03])
    assert torch.equal(method.predict(x), x)
    torch.testing.assert_close(method.predict(x, target_prior=target), x + torch.log(10 * target))


@pytest.mark.parametrize("options, message", [
    ({"name": "cb", "beta": 1.0}, "beta"), ({"name": "cb", "loss_type": "hinge"}, "loss_type"),
    ({"name": "cb", "gamma": -1.0}, "gamma"), ({"name": "vs", "gamma": -0.1}, "gamma"),
    ({"name": "vs", "tau": -1.0}, "tau"), ({"name": "vs", "beta": 1.0}, "beta"),
    ({"name": "lade", "alpha": -0.1}, "alpha"), ({"name": "lade", "remine_lambda": -1.0}, "remine_lambda"),
    ({"name": "balanced_softmax", "tau": 1.0}, "tau"),
])
def test_bad_options_are_refused_when_the_config_is_read(options, message):
    from ltbench.method import resolved_method_spec

    with pytest.raises(Exception, match=message):
        resolved_method_spec(options)


def test_the_cifar100_and_imagenet_recipes_list_the_four_methods():
    from pathlib import Path

    from ltbench.recipe import load_recipe

    root = Path(__file__).resolve().parents[1] / "recipes"
    for recipe, expected in [("cifar100_lt.yaml", {"vs": {"gamma": 0.05, "tau": 0.75},
                                                   "lade": {"alpha": 0.1, "remine_lambda": 0.01}}),
                             ("imagenet_lt.yaml", {"vs": {"gamma": 0.3, "tau": 1.0},
                                                   "lade": {"alpha": 0.05, "remine_lambda": 0.5}})]:
        methods = {r.config["method"]["name"]: r.config["method"] for r in load_recipe(root / recipe).runs}
        assert {"balanced_softmax", "cb", "vs", "lade"} <= set(methods)
        assert methods["cb"]["loss_type"] == "focal" and methods["cb"]["beta"] == 0.9999
        for name, options in expected.items():
            assert {k: methods[name][k] for k in options} == options


def test_ltbench_check_methods_finds_the_built_in_folder():
    """`ltbench check methods` checks the repository's own methods (registered through the built-in entry
    point, not as a plugin folder): the folder test that selects them."""
    from pathlib import Path

    import methods.cb  # noqa: F401  (imported by the registry anyway)
    from ltbench.contract import _defined_in

    folder = Path(__file__).resolve().parents[1] / "methods"
    assert _defined_in("methods.cb", folder) and _defined_in("methods.lade", folder)
    assert not _defined_in("ltbench.train.engine", folder) and not _defined_in("no.such.module", folder)


def uncommented_authors_schedules(text: str) -> str:
    """recipes/cifar100_lt.yaml with its commented blocks of the authors' own schedules switched on: between
    the '# >>>' and '# <<<' lines, '  #- ' and '  #  ' become '  - ' and '    ' (what a user does by hand)."""
    out, inside = [], False
    for line in text.splitlines():
        inside = (inside or line.strip().startswith("# >>>")) and not line.strip().startswith("# <<<")
        if inside and (line.startswith("  #- ") or line.startswith("  #  ")):
            line = "  " + line[3:]
        out.append(line)
    return "\n".join(out) + "\n"


def test_cifar100_dry_run_shows_the_authors_settings_and_schedules(tmp_path, capsys):
    """The CIFAR-100-LT recipe's dry run, on generated CIFAR-100 files in the exact format: every new baseline's
    row carries its authors' hyper-parameters on the shared schedule; with the commented blocks switched on,
    each method also runs on its authors' own CIFAR schedule."""
    import shutil
    import sys
    from pathlib import Path

    from ltbench import cli
    from ltbench.recipe import load_recipe

    sys.path.insert(0, str(Path(__file__).parent))
    from test_cifar import write_fake_cifar100

    write_fake_cifar100(tmp_path / "cifar")
    recipes = Path(__file__).resolve().parents[1] / "recipes"
    shutil.copy(recipes / "cifar10_lt.yaml", tmp_path)  # table1 includes it
    path = tmp_path / "cifar100_lt.yaml"
    path.write_text(uncommented_authors_schedules((recipes / "cifar100_lt.yaml").read_text()))
    overrides = ["seeds=[0]", f"data.root={tmp_path / 'cifar'}"]
    assert cli.main(["run", str(path), "--dry-run", "--results", str(tmp_path / "r"), *overrides]) in (0, None)
    lines = [line for line in capsys.readouterr().out.splitlines() if "rho=100 seed=0" in line]
    sade = [line for line in lines if " sade (" in line]
    assert len(sade) == 2 and all("expert_width=0.75" in line and "test_time_redraw=true" in line
                                  and "test_time_views=[sade_test_time,sade_test_time]" in line
                                  and "views=[sade_train]" in line for line in sade)
    assert any("optim.batch_size=128" in line and "optim.nesterov=true" in line for line in sade)
    assert any("unseen=official" in line for line in lines if " proco (" in line)
    assert any("proj_dim=1024" in line for line in lines if " bcl (" in line)
    runs = {}
    for run in load_recipe(path, overrides).runs:
        if run.config["data"]["imb_factor"] == 100:
            runs.setdefault(run.config["method"]["name"], []).append(run.config["optim"])
    shared = {"lr": 0.3, "batch_size": 256, "weight_decay": 4e-4, "schedule": "cosine"}
    authors = {"balanced_softmax": {"lr": 0.1, "batch_size": 512, "epochs": 614, "schedule": "cosine"},
               "cb": {"lr": 0.1, "batch_size": 128, "weight_decay": 2e-4, "schedule": "step", "gamma": 0.01},
               "vs": {"lr": 0.1, "batch_size": 128, "weight_decay": 2e-4, "schedule": "step", "gamma": 0.01},
               "lade": {"lr": 0.2, "batch_size": 256, "milestones": [120, 160], "gamma": 0.01},
               "proco": {"lr": 0.3, "weight_decay": 2e-4, "schedule": "step", "milestones": [160, 180]},
               "sade": {"lr": 0.1, "batch_size": 128, "nesterov": True, "weight_decay": 5e-4, "schedule": "step"}}
    for name, expected in authors.items():
        optims = runs[name]
        assert len(optims) == 2, name  # the equal-recipe row and the authors' schedule
        assert any(all(o[k] == v for k, v in shared.items()) for o in optims), name
        assert any(all(o[k] == v for k, v in expected.items()) for o in optims), name


@pytest.mark.parametrize("doc, names", [("methods.md", ["balanced_softmax", "cb", "vs", "lade"]),
                                        ("methods-contrastive-experts.md", ["proco", "bcl", "sade"])])
def test_the_docs_option_tables_show_every_option_and_its_default(doc, names):
    """Each method's option table (one option per row) lists every Config field with the default a recipe
    gets (config.option_default: for an option added later with a new default, that one), so the docs
    cannot drift from the code."""
    import dataclasses
    from pathlib import Path

    from ltbench.config import option_default, value_text
    from ltbench.registry import METHODS

    text = (Path(__file__).resolve().parents[1] / "docs" / doc).read_text()
    for name in names:
        section = text.split(f"## `{name}`:", 1)[1].split("\n## ", 1)[0]
        table = section.split("| option | default | meaning |\n|---|---|---|\n", 1)[1].split("\n\n", 1)[0]
        rows = [[c.strip() for c in line.split("|")[1:3]] for line in table.splitlines()]
        documented = {cell.strip("`"): default for cell, default in rows}
        fields = {f.name: f for f in dataclasses.fields(METHODS.get(name).Config)}
        assert set(documented) == set(fields), name
        for option, default in documented.items():
            expected = value_text(option_default(fields[option]))
            assert default.replace(" ", "") == expected.replace(" ", ""), (name, option, default, expected)
