"""Where a result came from: versions, code revision, host, scheduler ids."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

import ltbench


def git_state(folder: Path) -> dict:
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"git_commit": None, "git_dirty": None}
    return {"git_commit": commit, "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def collect() -> dict:
    import torch
    import torchvision

    info = {
        "ltbench_version": ltbench.__version__,
        **git_state(Path(ltbench.__file__).resolve().parent.parent),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "gpu_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "argv": sys.argv,
    }
    for key, env in (("slurm_job_id", "SLURM_JOB_ID"), ("slurm_array_job_id", "SLURM_ARRAY_JOB_ID"),
                     ("slurm_array_task_id", "SLURM_ARRAY_TASK_ID"), ("requeue_count", "SLURM_RESTART_COUNT")):
        value = os.environ.get(env)
        info[key] = int(value) if value and value.isdigit() else value
    if info["requeue_count"] is None and info["slurm_job_id"] is not None:
        info["requeue_count"] = 0
    return info
