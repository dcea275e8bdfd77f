"""docs/results.md is the output of the commands printed in it: regenerate and compare (tables only)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_results_doc_matches_the_commands_in_it():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "results_doc.py"), "--check"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
