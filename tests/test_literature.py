"""Published numbers as claims (ltbench/claims/): values checked by hand against the papers, validation, matching."""

import sys
from pathlib import Path

import pytest
import yaml

from ltbench.errors import LtbenchError
from ltbench.report.claims import Claim, NO_OFFICIAL_CODE, is_metric, load_claims, match

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def entries() -> list[Claim]:
    return load_claims()


def one(entries, **fields) -> Claim:
    source = fields.pop("source")
    found = [e for e in match(entries, **fields) if e.source == source]
    assert len(found) == 1, (fields, found)
    return found[0]


# Values read by hand from the BAPE paper's LaTeX source, one or more cells per table.
HAND_CHECKED = [
    ({"source": "BAPE paper, Table 1", "dataset": "cifar100_lt", "imb_factor": 50, "method": "causal_model"},
     {"all": 50.3}),
    ({"source": "BAPE paper, Table 1", "dataset": "cifar10_lt", "imb_factor": 10, "method": "bape"}, {"all": 92.2}),
    ({"source": "BAPE paper, Table 1", "dataset": "cifar10_lt", "imb_factor": 100, "method": "gcl"}, {"all": 82.7}),
    ({"source": "BAPE paper, Table 2", "dataset": "imagenet_lt", "backbone": "resnext50_32x4d", "method": "reslt"},
     {"all": 56.1}),
    ({"source": "BAPE paper, Table 2", "dataset": "inat2018", "method": "la"}, {"all": 71.0}),
    ({"source": "BAPE paper, Table 3", "dataset": "imagenet_lt", "epochs": 180, "method": "bape"},
     {"many": 67.5, "medium": 55.3, "few": 37.9, "all": 57.6}),
    ({"source": "BAPE paper, Table 3", "dataset": "imagenet_lt", "epochs": 90, "method": "dro_lt"},
     {"many": 64.0, "medium": 49.8, "few": 33.1, "all": 53.5}),
    ({"source": "BAPE paper, Table 4", "dataset": "cifar100_lt", "epochs": 400, "method": "la"},
     {"many": 68.1, "medium": 53.0, "few": 32.4, "all": 52.1}),
    ({"source": "BAPE paper, Table 5", "dataset": "cifar100_lt", "method": "bape_la_normalised_test"},
     {"many": 67.5, "medium": 48.6, "few": 25.7, "all": 48.3}),
    ({"source": "BAPE paper, Table 6", "dataset": "cifar100_lt", "method": "bape_without_prior"},
     {"many": 64.2, "medium": 49.9, "few": 27.2, "all": 48.1}),
    ({"source": "LDAM-DRW paper (Cao et al., 2019)", "dataset": "cifar10_lt", "imb_factor": 100, "method": "ce"},
     {"all": 70.36}),
    ({"source": "SADE code README (Zhang et al., 2022)", "dataset": "cifar100_lt", "method": "sade"},
     {"forward50": 65.9, "forward10": 58.3, "uniform": 49.8, "backward10": 43.9, "backward50": 42.4}),
]


@pytest.mark.parametrize("fields, metrics", HAND_CHECKED)
def test_values_read_by_hand_from_the_sources(entries, fields, metrics):
    assert one(entries, **fields).metrics == metrics


def test_dashes_in_the_paper_are_absent_not_zero(entries):
    # VS has only CIFAR-100 rho=100 and CIFAR-10 rho=100 in Table 1.
    vs = match(entries, dataset="cifar100_lt", method="vs") + match(entries, dataset="cifar10_lt", method="vs")
    assert sorted((e.dataset, e.imb_factor) for e in vs) == [("cifar100_lt", 100.0), ("cifar10_lt", 100.0)]
    assert match(entries, dataset="cifar10_lt", method="lade") == []


def test_table_sizes(entries):
    count = {}
    for e in entries:
        count[e.source] = count.get(e.source, 0) + 1
    # Table 1: 14 rows x 6 columns less 13 dashes; Table 2: 10 rows x 3 columns less 6 dashes.
    assert [count[f"BAPE paper, Table {n}"] for n in range(1, 7)] == [71, 24, 8, 6, 5, 4]


def test_every_entry_is_valid(entries):
    from ltbench.registry import BACKBONES, DATASETS, METHODS, discover

    discover()
    for e in entries:
        assert e.dataset in DATASETS and e.backbone in BACKBONES, e
        assert e.metrics and all(is_metric(k) and 0 <= v <= 100 for k, v in e.metrics.items()), e
        assert e.imb_factor is None or e.imb_factor >= 1
        assert e.epochs is None or e.epochs > 0
        assert e.source and e.label and "../" not in e.source, e
        if e.kind == "reference":  # this project's own numbers: docs/results.md and the README name them
            assert e.seeds and e.numerics and e.protocol_match == "exact" and ("docs/results.md" in e.source
                                                                              or "README.md" in e.source), e
            continue
        assert ".md" not in e.source, e
        if e.settings:  # ablation variants of BAPE: their switches are real options of ltbench's BAPE
            assert e.method.startswith("bape"), e
            assert set(e.settings) <= set(METHODS.get("bape").Config.__dataclass_fields__), e


def test_match_filters_on_given_fields_only(entries):
    c100 = match(entries, dataset="cifar100_lt", imb_factor=100, backbone="resnet32", epochs=200)
    assert c100 and all(e.dataset == "cifar100_lt" and e.imb_factor == 100 and e.epochs == 200 for e in c100)
    assert {"bape", "la", "ce", "ldam_drw", "cb_focal"} <= {e.method for e in c100}
    assert len(match(entries, dataset="cifar100_lt")) > len(c100)
    bape = match(entries, dataset="cifar100_lt", imb_factor=100.0, epochs=200, method="bape")
    assert [e.source for e in bape] == [f"BAPE paper, Table {n}" for n in (1, 4, 5, 6)]
    assert {e.metrics["all"] for e in bape} == {52.5}
    # an entry with an unstated schedule never matches a stated one
    assert not [e for e in match(entries, dataset="cifar100_lt", epochs=200) if e.epochs is None]
    assert match(entries, dataset="imagenet_lt", backbone="resnet50", epochs=180, method="la")[0].metrics["all"] == 56.0
    assert match(entries, dataset="places_lt", backbone="resnet50") == []  # Places-LT: LIFT's CLIP rows only
    assert [e.metrics["all"] for e in match(entries, dataset="places_lt", method="lift")] == [52.2]


GOOD = {"source": {"kind": "paper", "cite": "Some paper, Table 9", "row": "CE"},
        "setting": {"method": "ce", "dataset": "cifar10_lt", "imb_factor": 100, "backbone": "resnet32", "epochs": 200},
        "metrics": {"all": 70.0}}


def write_claim(tmp_path, doc) -> Path:
    (tmp_path / "c").mkdir(exist_ok=True)
    (tmp_path / "c" / "one.yaml").write_text(yaml.safe_dump(doc))
    return tmp_path / "c"


def test_a_custom_folder_loads(tmp_path):
    [claim] = load_claims(write_claim(tmp_path, GOOD))
    assert (claim.method, claim.imb_factor, claim.metrics, claim.source, claim.label, claim.path) == \
        ("ce", 100.0, {"all": 70.0}, "Some paper, Table 9", "CE", "one.yaml")


@pytest.mark.parametrize("change, message", [
    ({"metrics": {"top1": 70.0}}, "unknown metric"),
    ({"metrics": {"all": 101.0}}, "not a percentage"),
    ({"color": "red"}, "expected a mapping with source, setting, metrics"),
    ({"setting": {**GOOD["setting"], "epochs": 2.5}}, "epochs must be"),
    ({"setting": {"backbone": "resnet32"}}, "setting.method must be"),
    ({"setting": {**GOOD["setting"], "lr": 0.1}}, "setting: expected keys"),
    ({"source": {"kind": "rumour", "cite": "x"}}, "kind among"),
    ({"seeds": [0, 1], "per_seed": {"all": [70.0]}}, "one value per seed"),
    ({"margin": 0}, "margin must be a positive number"),
])
def test_bad_claims_are_rejected_with_the_file_named(tmp_path, change, message):
    with pytest.raises(LtbenchError, match="one.yaml") as error:
        load_claims(write_claim(tmp_path, {**GOOD, **change}))
    assert message in str(error.value)


def test_every_bape_paper_row_quotes_the_paper_and_says_no_official_code(entries):
    bape = [e for e in entries if e.source.startswith("BAPE paper")]
    assert len(bape) == 118 and all(e.quote and e.protocol_id and e.protocol_match == "approximate" for e in bape)
    assert all((e.implementation == NO_OFFICIAL_CODE) == e.method.startswith("bape") for e in bape)
    table4 = one(entries, source="BAPE paper, Table 4", dataset="cifar100_lt", epochs=400, method="bape")
    assert table4.quote == "BAPE† | 70.2 | 55.0 | 34.1 | 54.1"


def test_the_data_file_ships_with_the_package():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        pytest.skip("tomllib needs Python 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "claims/*/*.yaml" in project["tool"]["setuptools"]["package-data"]["ltbench"]
    assert not list((ROOT / "ltbench" / "claims").rglob("*.yml"))  # the package data pattern ships only .yaml


def test_evidence_modules_import_no_torch():
    """Tables, reports and figures run on a login node: none of these may pull in torch."""
    import subprocess

    code = ("import sys, ltbench.report.claims, ltbench.report.significance, ltbench.results.predictions, ltbench.report.plots; "
            "ltbench.report.claims.load_claims(); assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
