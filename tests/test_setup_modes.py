"""`make setup TORCH=system` (scripts/setup-system-torch.sh): a venv that keeps the node's own torch. What is
tested here without installing anything: it refuses when the interpreter has no torch or no torchvision,
the two set-ups never overwrite each other's venv (the venv remembers its mode), a mistyped mode is refused,
and the list installed besides ltbench is pyproject.toml's without torch and torchvision. The install
itself (pip, a minute or more) is not run here; docs/performance.md says how it was checked."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def make(*args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH", "VENV", "PYTHON", "MAKEFLAGS")}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(["make", "--no-print-directory", *args, f"PYTHON={sys.executable}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def fake_packages(folder: Path, torch: str, torchvision: str) -> Path:
    """A folder to put first on PYTHONPATH: packages named torch / torchvision with the given bodies."""
    for name, body in (("torch", torch), ("torchvision", torchvision)):
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(body)
    return folder


def test_system_setup_refuses_an_interpreter_without_torch(tmp_path):
    fakes = fake_packages(tmp_path / "site", "raise ImportError('no torch on this node')", "")
    out = make("setup", "TORCH=system", f"VENV={tmp_path / 'venv'}", pythonpath=fakes)
    assert out.returncode == 2
    assert "make setup TORCH=system:" in out.stderr and "cannot import torch (ImportError: no torch on this node)" \
        in out.stderr and "PYTHON=/path/to/python" in out.stderr
    assert not (tmp_path / "venv").exists()


def test_system_setup_refuses_torch_without_torchvision(tmp_path):
    fakes = fake_packages(tmp_path / "site", "__version__ = '2.99.0+node'", "raise ImportError('none')")
    out = make("setup", "TORCH=system", f"VENV={tmp_path / 'venv'}", pythonpath=fakes)
    assert out.returncode == 2 and "imports torch 2.99.0+node but not torchvision" in out.stderr
    assert not (tmp_path / "venv").exists()


def test_the_pinned_and_the_system_setups_never_overwrite_each_other(tmp_path):
    pinned, system = tmp_path / "pinned", tmp_path / "system"
    pinned.mkdir()
    (pinned / ".installed").touch()
    out = make("setup", "TORCH=system", f"VENV={pinned}")
    assert out.returncode == 2 and "holds ltbench with the pinned torch" in out.stderr
    system.mkdir()
    (system / ".installed-system").touch()
    for target in ("setup", "test"):  # the venv's mode is kept without saying it again: no pip, no pins
        out = make("-n", target, f"VENV={system}")
        assert out.returncode == 0 and "pip install" not in out.stdout and "setup-system-torch" not in out.stdout
    out = make("setup", "TORCH=pinned", f"VENV={system}")
    assert out.returncode == 2 and "keeps the system torch" in out.stderr and "make clean-venv" in out.stderr
    assert sorted(p.name for p in system.iterdir()) == [".installed-system"]


def test_a_mistyped_torch_mode_is_refused(tmp_path):
    out = make("-n", "test", "TORCH=sytem", f"VENV={tmp_path / 'venv'}")
    assert out.returncode == 2 and "TORCH=sytem: expected TORCH=pinned" in out.stderr


def test_the_system_setup_installs_every_dependency_but_torch_and_torchvision():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    expected = [r for r in project["dependencies"] + project["optional-dependencies"]["dev"]
                if not r.startswith(("torch==", "torchvision=="))]
    out = subprocess.run([str(ROOT / "scripts/setup-system-torch.sh"), "--print-requirements"], capture_output=True,
                         text=True, env={**os.environ, "PYTHON": sys.executable}, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == expected and "pandas" in expected
