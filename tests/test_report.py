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


def test_head_rows():
    import pandas as pd

    df = pd.DataFrame([{"status": "done", "dataset": "d", "imb_factor": 1, "backbone": "b", "method": "bape",
                        "seed": s, "all": 0.5, "many": 0.6, "medium": 0.5, "few": 0.4,
                        "sum_da_none:all": 0.45 + s / 100, "sum_da_none:many": 0.7, "sum_da_none:medium": 0.4,
                        "sum_da_none:few": 0.2, "aux:all": 0.3, "aux:many": 0.3, "aux:medium": 0.3,
                        "aux:few": 0.3} for s in (0, 1)])
    text = report.table(report.with_heads(df, "sum_da_*"))
    assert "bape · sum_da_none" in text and "45.50 ± 0.71" in text and "aux" not in text
    with pytest.raises(Exception, match="heads in these results: aux, sum_da_none"):
        report.with_heads(df, "nothing*")
