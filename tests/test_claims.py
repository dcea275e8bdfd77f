"""Claims, ``ltbench verify``, ``ltbench plan`` and the protocol id (docs/claims.md, docs/significance.md)."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ltbench import report
from ltbench.cli import main
from ltbench.results.protocol import protocol_id, verify_files
from ltbench.report.claims import NO_OFFICIAL_CODE, Claim, load_claims
from ltbench.report.plan import comparisons, detectable, plan_lines, power, seeds_for
from ltbench.report.verify import export, judge, verify

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference-results"
CLAIMS = ROOT / "ltbench" / "claims"
OWN = {"25-ltbench-reference-quickstart": "quickstart", "26-ltbench-reference-fmnist-bape": "fmnist_bape",
       "27-ltbench-reference-fmnist-schedule": "fmnist_schedule",
       "28-ltbench-reference-fmnist-schedule-r32": "fmnist_schedule_r32"}


def records(folder: str) -> list[dict]:
    return report.source(str(REFERENCE / folder), None, True, [])[0]


@pytest.mark.parametrize("claims, folder", OWN.items())
def test_own_claims_reproduce_on_the_reference_results_of_the_machine_type_that_made_them(claims, folder):
    rows = verify(load_claims(CLAIMS / claims), records(folder))
    assert rows and {r.verdict for r in rows} == {"REPRODUCED"}
    assert all(r.protocol.endswith("(exact)") and "(claim:" not in r.numerics and "paired" in r.rule for r in rows)


def shifted(claim: Claim, points: float, per_seed: bool = True) -> Claim:
    return dataclasses.replace(claim, metrics={k: v + points for k, v in claim.metrics.items()},
                               per_seed={k: [x + points for x in v] for k, v in claim.per_seed.items()} if per_seed else {})


def test_a_claim_shifted_by_two_points_is_not_reproduced():
    claims = load_claims(CLAIMS / "28-ltbench-reference-fmnist-schedule-r32")
    runs = records("fmnist_schedule_r32")
    assert {r.verdict for r in verify([shifted(c, 2.0) for c in claims], runs)} == {"NOT REPRODUCED"}  # paired
    unpaired = verify([shifted(c, -2.0, per_seed=False) for c in claims], runs)  # Welch, the claims' own spread
    assert {r.verdict for r in unpaired if r.metric == "all"} == {"NOT REPRODUCED"}


def test_one_seed_claim_against_one_seed_is_inconclusive():
    assert judge(74.62, [73.36])[0] == "INCONCLUSIVE"  # no spread at all
    assert judge(74.62, [74.62])[0] == "INCONCLUSIVE"  # even equal: one seed cannot tell
    verdict, d, low, high, how = judge(74.62, [73.36], reference_sd=1.54, reference_n=3)  # the README's claim
    assert verdict == "INCONCLUSIVE" and low < -1 and high > 1 and "reference spread" in how
    one = dataclasses.replace(load_claims(CLAIMS / "25-ltbench-reference-quickstart")[0], seeds=[0], per_seed={},
                              spread={})
    runs = [r for r in records("quickstart") if r["seed"] == 0]
    assert {r.verdict for r in verify([one], runs)} == {"INCONCLUSIVE"}


def test_every_bape_paper_row_is_untested_with_its_protocol_id_and_no_official_code():
    method = {c.path: c.method for c in load_claims()}
    rows = [r for r in verify(load_claims(), records("quickstart")) if r.source.startswith("BAPE paper")]
    assert len(rows) == 118 and {r.verdict for r in rows} == {"UNTESTED"}
    assert all(r.protocol.split(" ")[0].split("-")[0] in ("cifar10_lt", "cifar100_lt", "imagenet_lt", "inat2018")
               for r in rows)
    assert all((r.implementation == NO_OFFICIAL_CODE) == method[r.claim].startswith("bape") for r in rows)
    assert sum(r.implementation == NO_OFFICIAL_CODE for r in rows) == 22  # Tables 1-6: 6 + 3 + 2 + 2 + 5 + 4


def simulated_rates(n_claim, n_ours, sd=1.0, margin=1.0, reps=2000, paired=False, seed=0):
    """(true match called NOT REPRODUCED, a margin-sized gap called REPRODUCED, true match REPRODUCED)."""
    rng = np.random.default_rng(seed)
    out = []
    for gap in (0.0, margin):
        verdicts = []
        for _ in range(reps):
            claim = rng.normal(0, sd, n_claim)
            ours = list(rng.normal(gap, sd, n_ours))
            if paired:
                verdicts.append(judge(float(claim.mean()), ours, margin, paired=list(claim))[0])
            else:
                spread = float(claim.std(ddof=1)) if n_claim > 1 else None
                verdicts.append(judge(float(claim.mean()), ours, margin, spread, n_claim)[0])
        out.append(verdicts)
    return (np.mean([v == "NOT REPRODUCED" for v in out[0]]), np.mean([v == "REPRODUCED" for v in out[1]]),
            np.mean([v == "REPRODUCED" for v in out[0]]))


# docs/claims.md publishes these (seed-to-seed sd 1 point, margin 1 point, 2,000 draws each)
ERROR_RATES = {(3, 3, False): (0.004, 0.010, 0.018), (5, 5, False): (0.004, 0.016, 0.061),
               (1, 3, False): (0.025, 0.014, 0.014), (5, 5, True): (0.004, 0.032, 0.081),
               (10, 10, False): (0.000, 0.050, 0.397)}


@pytest.mark.parametrize("case", ERROR_RATES)
def test_the_verdict_rules_error_rates_as_published(case):
    false_alarm, false_match, confirmed = simulated_rates(*case[:2], paired=case[2])
    assert false_alarm <= 0.06 and false_match <= 0.06  # under alpha = 0.05, give or take 2,000 draws' error
    assert (round(false_alarm, 3), round(false_match, 3), round(confirmed, 3)) == ERROR_RATES[case]


def test_export_writes_claims_that_verify_as_reproduced(tmp_path):
    runs = records("fmnist_bape")
    written = export(runs, tmp_path / "mine", cite="my runs")
    claims = load_claims(tmp_path / "mine")
    assert len(written) == len(claims) == 4 and all(c.kind == "user" and c.seeds == [0, 1, 2] for c in claims)
    assert {r.verdict for r in verify(claims, runs)} == {"REPRODUCED"}


def test_verify_command_prints_markdown_csv_json_and_lines(capsys, tmp_path):
    folder = str(REFERENCE / "fmnist_bape")
    assert main(["verify", folder, "--claims", str(CLAIMS / "26-ltbench-reference-fmnist-bape"), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 16 and {r["verdict"] for r in rows} == {"REPRODUCED"}
    assert main(["verify", folder, "--claims", str(CLAIMS / "26-ltbench-reference-fmnist-bape"), "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("verdict,claim,source,metric,claimed,ours,d,interval,rule,protocol")
    assert main(["verify", folder, "--claims", str(CLAIMS / "26-ltbench-reference-fmnist-bape")]) == 0
    assert "16 REPRODUCED, 0 NOT REPRODUCED, 0 INCONCLUSIVE, 0 UNTESTED" in capsys.readouterr().out
    assert main(["verify", folder, "--claims", str(CLAIMS / "29-ltbench-readme-quickstart"), "--format", "lines"]) == 0
    assert "every claim UNTESTED" in capsys.readouterr().out
    assert main(["verify", folder, "--export", str(tmp_path / "out")]) == 0 and len(list((tmp_path / "out").iterdir())) == 4
    assert main(["verify", folder, "--margin", "-1"]) == 2 and "expected a positive number" in capsys.readouterr().err


def test_protocol_id_follows_what_defines_the_protocol():
    base = {"data.name": "cifar100_lt", "data.imb_factor": 100.0, "backbone.name": "resnet32"}
    same = {**base, "optim.lr": 0.05, "method.name": "la", "data.data_seed": 0, "eval.tte": "none"}
    assert protocol_id(base) == protocol_id(same)  # the paper's defaults, and what is not protocol
    for change in ({"data.data_seed": 1}, {"data.val_per_class": 20}, {"eval.tte": "tencrop"}, {"data.imb_factor": 50},
                   {"data.imb_type": "step"}):
        assert protocol_id({**base, **change}) != protocol_id(base), change
    lists = {"test": "0" * 40}
    assert protocol_id({"data.name": "imagenet_lt"}, lists) != protocol_id({"data.name": "imagenet_lt"})


def test_data_verify_names_a_generated_variant_and_calls_a_one_byte_change_unknown(tmp_path):
    import hashlib

    for name, content in (("a/train.bin", b"train" * 100), ("test.txt", b"x 1\ny 2\n")):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    files = {"a/train.bin": "sha256:" + hashlib.sha256(b"train" * 100).hexdigest(),
             "test.txt": "md5:" + hashlib.md5(b"x 1\ny 2\n").hexdigest()}
    table = {"toy": [{"variant": "toy v1", "source": "generated", "files": files}]}
    assert verify_files(tmp_path, "toy", table)[0] == "toy v1"
    data = bytearray((tmp_path / "test.txt").read_bytes())
    data[3] ^= 1
    (tmp_path / "test.txt").write_bytes(bytes(data))
    variant, lines = verify_files(tmp_path, "toy", table)
    assert variant is None and lines == ["test.txt: digest differs from toy v1"]


def test_data_verify_command_on_fashion_mnist_files(tmp_path, capsys):
    real = Path("/usr/share/datasets/fashion-mnist")
    if not (real / "train-labels-idx1-ubyte.gz").is_file():
        pytest.skip("Fashion-MNIST files not on this machine")
    assert main(["data", "verify", str(real), "--dataset", "fashion_mnist_lt"]) == 0
    assert "Debian package" in capsys.readouterr().out
    copy = tmp_path / "fm"
    copy.mkdir()
    data = bytearray((real / "train-labels-idx1-ubyte.gz").read_bytes())
    data[-1] ^= 1
    (copy / "train-labels-idx1-ubyte.gz").write_bytes(bytes(data))
    assert main(["data", "verify", str(copy), "--dataset", "fashion_mnist_lt"]) == 1
    assert "unknown variant" in capsys.readouterr().out


def test_plan_states_power_that_a_simulation_confirms_on_fmnist_baselines():
    """Per comparison of recipes/fmnist_baselines.yaml's tables (spreads of its reference runs), the power at the
    printed detectable difference, found by Welch's test on simulated seeds, is 80 % within 3 points."""
    from scipy.stats import ttest_ind

    tables = report.tables(str(ROOT / "recipes" / "fmnist_baselines.yaml"), str(REFERENCE))
    pairs = [(np.std(a, ddof=1), np.std(b, ddof=1)) for _, _, _, a, b in comparisons(tables[0]) if len(a) > 1 < len(b)]
    assert len(pairs) == 24
    rng = np.random.default_rng(0)
    for sd_a, sd_b in pairs[::2]:
        d = detectable(sd_a, sd_b, 3)
        a, b = rng.normal(d, sd_a, (4000, 3)), rng.normal(0, sd_b, (4000, 3))
        found = float(np.mean(ttest_ind(a, b, axis=1, equal_var=False).pvalue < 0.05))
        assert abs(found - 0.8) <= 0.03, (sd_a, sd_b, d, found)
    lines = plan_lines(tables, 3, detect=1.0)
    assert "LDAM-DRW vs CE (sd 1.50 / 0.57): detects 4.57 points; 1 point(s) need 22 seeds per row" in "\n".join(lines)


def test_power_is_welchs_own_not_an_approximation():
    from scipy.stats import nct, t

    assert 0.03 < power(0.0, 1, 1, 3, 3) < 0.04  # size: Welch is conservative at 3 seeds (simulated: 3.5 %)
    n = seeds_for(1.0, 1.0, 1.0)
    assert power(1.0, 1, 1, n, n) >= 0.8 > power(1.0, 1, 1, n - 1, n - 1)
    normal = (1.959964 + 0.841621) * (2 / 3) ** 0.5  # the normal approximation's detectable difference at 3 seeds
    assert power(normal, 1, 1, 3, 3) < 0.6 and detectable(1, 1, 3) > normal
    # the noncentral t at the true spreads (df 4 here) states 80 % where Welch's test, estimating them, has less
    d, critical = detectable(1, 1, 3), t.ppf(0.975, 4)
    shift = d / (2 / 3) ** 0.5
    assert nct.sf(critical, 4, shift) + nct.cdf(-critical, 4, shift) > 0.85 > power(d, 1, 1, 3, 3)


def test_verify_and_plan_import_no_torch():
    code = ("import sys, ltbench.report.verify, ltbench.report.plan, ltbench.results.protocol; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_make_quickstart_line_on_another_machine_type(tmp_path, capsys):
    """A user's quickstart (made-up results of the recipe's runs: LDAM-DRW at 73.36, as a fresh clone on an AMD
    EPYC gave) against the README's claim: one line per number, INCONCLUSIVE, naming the numerics difference."""
    from reportkit import FAKE_NUMERICS, write_run

    from ltbench.recipe import load_recipe

    recipe = load_recipe(ROOT / "recipes" / "quickstart.yaml", results_dir=tmp_path)
    for spec in recipe.runs:
        all_ = 0.7336 if spec.config["method"]["name"] == "ldam_drw" else 0.70
        write_run(spec, metrics=dict.fromkeys(("many", "medium", "few", "all"), all_),  # per-class values: agreeing
                  numerics={**FAKE_NUMERICS, "cpu_model": "AMD EPYC 7B13", "cpu_capability": "AVX2"})
    assert main(["verify", str(ROOT / "recipes" / "quickstart.yaml"), "--results", str(tmp_path), "--claims",
                 str(CLAIMS / "29-ltbench-readme-quickstart"), "--format", "lines"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 16
    ldam = next(line for line in lines if "LDAM-DRW all:" in line)
    assert "ours 73.36 (n=1, seeds 0) against 74.62: INCONCLUSIVE (Δ -1.26" in ldam
    assert "CE many: ours 70.00 (n=1, seeds 0) against 90.75: NOT REPRODUCED (Δ -20.75" in "\n".join(lines)
    assert "cpu_model AMD EPYC 7B13 (claim: cpu_model Intel(R) Xeon(R) Processor)" in ldam


def test_plan_command_and_the_same_lines_in_dry_run(capsys):
    recipe, results = str(ROOT / "recipes" / "fmnist_schedule_r32.yaml"), str(REFERENCE)
    assert main(["plan", recipe, "--results", results, "--detect", "1"]) == 0
    out = capsys.readouterr().out
    assert "main, All: BAPE+LA (paper's views) vs LA, strong view (sd 0.52 / 0.40): detects 0.97 points; " \
           "1 point(s) need 5 seeds per row" in out and "5 seed(s) per row declared" in out
    if not Path("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz").is_file():
        pytest.skip("--dry-run checks the Fashion-MNIST files, not on this machine")
    assert main(["run", str(ROOT / "recipes" / "fmnist_bape.yaml"), "--results", results, "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert "main, All: BAPE+LA vs BAPE+LA, LA on the plain view (sd 0.72 / 0.72): detects 2.54 points" in dry


def test_one_run_seed_against_a_claim_with_a_spread_uses_the_claims_spread():
    verdict, d, low, high, how = judge(75.0, [75.1], claim_sd=0.2, claim_n=5, reference_sd=0.2, reference_n=5)
    assert verdict == "REPRODUCED" and how.startswith("1 seed; the claim's spread (0.20 over 5 seeds)")
    assert judge(75.0, [78.0], claim_sd=0.2, claim_n=5, reference_sd=0.2, reference_n=5)[0] == "NOT REPRODUCED"
