"""Tables: golden files on checked-in results, and the report code never needs torch."""

import subprocess
import sys
from pathlib import Path

import pytest

from ltbench import report

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("fmt", ["markdown", "latex", "csv"])
def test_table_matches_golden_file(fmt):
    df = report.collect(GOLDEN / "results" / "demo")
    text = report.table(df, fmt=fmt)
    assert text.strip() == (GOLDEN / f"demo.{fmt}.txt").read_text().strip()


def test_aggregate_statistics():
    df = report.collect(GOLDEN / "results" / "demo")
    agg = report.aggregate(df).set_index("method")
    assert agg.loc["ce", "all_mean"] == pytest.approx((60.0 + 60.4 + 59.8) / 3)
    assert agg.loc["ce", "all_std"] == pytest.approx(0.30550504633, rel=1e-6)  # ddof=1
    assert agg.loc["ce", "n"] == 3
    assert agg.loc["cosine (s=16)", "few_count"] == 0
    assert "ldam" not in agg.index  # failed runs are left out


def test_cli_table_on_a_results_dir(cli):
    out = cli("table", GOLDEN / "results" / "demo")
    assert out.returncode == 0 and "**65.53 ± 0.55**" in out.stdout
    missing = cli("table", GOLDEN / "nope")
    assert missing.returncode == 2 and "no such results directory" in missing.stderr


def test_report_and_store_never_import_torch():
    code = ("import sys, ltbench.report, ltbench.store, ltbench.launch; "
            "ltbench.report.table(ltbench.report.collect(sys.argv[1])); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    out = subprocess.run([sys.executable, "-c", code, str(GOLDEN / "results" / "demo")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
