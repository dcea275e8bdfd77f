"""Smoke test against a real Slurm cluster (e.g. the one scripts/slurm-local.sh runs).

Run it with:

    eval "$(sudo scripts/slurm-local.sh up)"   # as root: scripts/slurm-local.sh up
    pytest -m slurm tests/test_slurm_local.py
    sudo scripts/slurm-local.sh down

Skipped when `sbatch` is not on PATH or SLURM_CONF is not set.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

SBATCH_TIMEOUT_S = 120


def _require_slurm() -> None:
    if shutil.which("sbatch") is None:
        pytest.skip("sbatch not on PATH (start a cluster with scripts/slurm-local.sh up)")
    conf = os.environ.get("SLURM_CONF")
    if not conf:
        pytest.skip('SLURM_CONF not set (run: eval "$(scripts/slurm-local.sh up)")')
    if not Path(conf).is_file():
        pytest.skip(f"SLURM_CONF={conf} does not exist (is the local cluster up?)")


def test_sbatch_wait_wrap_completes(tmp_path: Path) -> None:
    _require_slurm()
    out = tmp_path / "job-%j.out"
    proc = subprocess.run(
        [
            "sbatch",
            "--wait",
            "--parsable",
            "--job-name=ltbench-smoke",
            "--time=2",
            "--ntasks=1",
            "--cpus-per-task=1",
            "--mem=100M",
            f"--chdir={tmp_path}",
            f"--output={out}",
            "--wrap",
            'echo "ltbench-slurm-ok job=$SLURM_JOB_ID"',
        ],
        capture_output=True,
        text=True,
        timeout=SBATCH_TIMEOUT_S,
    )
    assert proc.returncode == 0, f"sbatch --wait failed ({proc.returncode}): {proc.stderr}"
    # --parsable prints "jobid" or "jobid;cluster"
    job_id = proc.stdout.strip().split(";")[0]
    assert re.fullmatch(r"\d+", job_id), f"unexpected sbatch output: {proc.stdout!r}"

    log = tmp_path / f"job-{job_id}.out"
    assert log.is_file(), f"job output {log} missing; dir has {sorted(os.listdir(tmp_path))}"
    assert f"ltbench-slurm-ok job={job_id}" in log.read_text()

    # No accounting storage on the local cluster, so ask slurmctld (not sacct);
    # finished jobs stay visible for MinJobAge seconds.
    show = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if show.returncode == 0:
        assert "JobState=COMPLETED" in show.stdout, show.stdout
        assert "ExitCode=0:0" in show.stdout, show.stdout
