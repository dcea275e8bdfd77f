"""Weights files are data: nothing in one is executed, and a bad one is one line before the first run.

TorchScript archives are read by ltbench_foundation/scripted.py (never ``torch.jit.load``); every weights file
is checked by ``PretrainedViT.check_weights`` in ``launch.checks_before_any_run`` (``run`` and ``--dry-run``
alike); its sha256 is cached across processes by (path, size, mtime, inode) and a file over the size bound
is refused. The subprocess timeouts below are a net against a hang, never a measured duration.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import yaml

from ltbench_foundation import scripted
from ltbench_foundation import weights as W
from pretrained_kit import clip_backbone, tiny_weights  # noqa: F401

from tests.conftest import ROOT, run_cli


def recipe_with(tmp_path, weights, name="w") -> Path:
    recipe = {"name": name, "results_dir": str(tmp_path / "results"), "seeds": [0, 1],
              "grid": {"method": [{"name": "ce"}, {"name": "la"}]},
              "data": {"name": "synthetic_lt", "num_classes": 4, "max_per_class": 8, "imb_factor": 4,
                       "test_per_class": 2, "image_size": 12},
              "backbone": clip_backbone(weights), "method": {"name": "la"},
              "optim": {"epochs": 1, "warmup_epochs": 0, "batch_size": 8}, "train": {"progress": False}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


class _SetstateLoops(nn.Module):
    """A TorchScript module whose ``__setstate__`` never returns: ``torch.jit.load`` of it hangs."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))

    def forward(self, x):
        return x

    @torch.jit.export
    def __getstate__(self):
        return (self.w, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[torch.Tensor, bool]):
        self.w = state[0]
        self.training = state[1]
        i = 0
        while True:
            i += 1


class _Marker:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def looping_archive(path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(_SetstateLoops()), str(path))
    return path


def marker_archive(good: Path, path: Path, marker: Path) -> Path:
    """A copy of a real TorchScript archive whose data.pkl, unpickled by a plain pickle, runs ``touch MARKER``."""
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("/data.pkl"):
                data = pickle.dumps(_Marker(marker), protocol=2)
            dst.writestr(info, data)
    return path


def test_no_torch_jit_load_in_ltbench():
    """Every torch.load of ltbench says weights_only=True; nothing calls torch.jit.load."""
    for path in (ROOT / "ltbench").rglob("*.py"):
        text = path.read_text()
        assert "jit.load(" not in text, path
        for line in text.splitlines():
            if "torch.load(" in line:
                assert "weights_only=True" in line, f"{path}: {line.strip()}"


def test_a_torchscript_archive_is_read_as_data(tiny_weights):
    state = W.read_state_dict(tiny_weights["clip_jit"])
    plain = torch.load(tiny_weights["clip"], weights_only=True)
    assert set(state) - set(plain) == {"input_resolution"}
    assert all(torch.equal(state[k], plain[k]) for k in plain)


def test_an_archive_whose_setstate_loops_is_never_run(tmp_path):
    archive = looping_archive(tmp_path / "loop.pt")
    assert scripted.is_torchscript(archive)
    assert W.read_state_dict(archive) == {}  # its state is not a module's attributes: nothing taken, nothing run
    got = run_cli("run", recipe_with(tmp_path, archive), "--dry-run", timeout=240)
    assert got.returncode == 2 and "Traceback" not in got.stderr, got.stderr
    (line,) = [x for x in got.stderr.splitlines() if x.strip()]
    assert str(archive) in line and "do not fit backbone clip_vit" in line and "missing" in line


def test_an_archive_whose_pickle_calls_a_function_is_refused_before_the_call(tmp_path, tiny_weights):
    marker = tmp_path / "marker"
    archive = marker_archive(tiny_weights["clip_jit"], tmp_path / "evil.pt", marker)
    with pytest.raises(W.WeightsFileError, match="system.*not a tensor"):
        W.read_state_dict(archive)
    got = run_cli("run", recipe_with(tmp_path, archive), timeout=240)
    assert got.returncode == 2 and not marker.exists(), got.stderr
    assert str(archive) in got.stderr and "Traceback" not in got.stderr


def _truncated(src: Path, dst: Path) -> Path:
    dst.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    return dst


def _nan(src: Path, dst: Path) -> Path:
    state = torch.load(src, weights_only=True)
    state["visual.proj"] = state["visual.proj"].clone().fill_(float("nan"))
    torch.save(state, dst)
    return dst


def _pickled_object(src: Path, dst: Path) -> Path:
    with open(dst, "wb") as f:
        pickle.dump(_Marker(dst.parent / "marker"), f)
    return dst


BAD = {  # name: (make it from the good files, words its line holds)
    "wrong shape": (lambda w, d: shutil.copy(w["clip28"], d / "x.pt") and d / "x.pt", "'visual.conv1.weight' has shape"),
    "other keys": (lambda w, d: shutil.copy(w["timm"], d / "x.safetensors") and d / "x.safetensors", "is missing"),
    "NaN values": (lambda w, d: _nan(w["clip"], d / "x.pt"), "'visual.proj' holds NaN"),
    "truncated .pt": (lambda w, d: _truncated(w["clip"], d / "x.pt"), "not a weights file torch reads"),
    "damaged .safetensors": (lambda w, d: _truncated(w["clip_safetensors"], d / "x.safetensors"),
                             "not a readable safetensors file"),
    "empty": (lambda w, d: (d / "x.pt").write_bytes(b"") and None or d / "x.pt", "it is empty"),
    "a pickled object": (lambda w, d: _pickled_object(w["clip"], d / "x.pt"), "not a weights file torch reads"),
}


def cli_main(*args) -> tuple[int, str, str]:
    """``ltbench ARGS`` in this process (a subprocess costs a torch import per case): rc, stdout, stderr."""
    import contextlib

    from ltbench.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def _one_line_before_any_run(tmp_path, bad, words, rc, stderr) -> None:
    assert rc == 2, stderr
    (line,) = [x for x in stderr.splitlines() if x.strip()]
    assert line.startswith(f"ltbench: error: {bad}: ") and words in line, line
    assert "dataset" not in line and "optim.lr" not in line and "Traceback" not in line
    results = tmp_path / "results" / "w"
    assert not results.exists() or not [p for p in results.iterdir() if p.is_dir()]  # no run started
    assert not (tmp_path / "marker").exists()


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_weights_are_one_line_at_dry_run(tmp_path, tiny_weights, case):
    make, words = BAD[case]
    bad = make(tiny_weights, tmp_path)
    rc, _, err = cli_main("run", recipe_with(tmp_path, bad), "--dry-run")
    _one_line_before_any_run(tmp_path, bad, words, rc, err)


@pytest.mark.parametrize("case", ["NaN values", "truncated .pt"])
def test_bad_weights_are_one_line_before_the_first_run(tmp_path, tiny_weights, case):
    make, words = BAD[case]
    bad = make(tiny_weights, tmp_path)
    got = run_cli("run", recipe_with(tmp_path, bad), timeout=240)
    _one_line_before_any_run(tmp_path, bad, words, got.returncode, got.stderr)


def test_each_weights_file_is_checked_once_per_launch(tmp_path, tiny_weights, monkeypatch):
    from ltbench_foundation import backbone
    from ltbench.recipe import load_recipe
    from ltbench.run import launch

    read = []
    real = W.read_state_dict
    monkeypatch.setattr("ltbench_foundation.clip.read_state_dict", lambda p: read.append(p) or real(p))
    recipe = load_recipe(recipe_with(tmp_path, tiny_weights["clip"]))
    assert len(recipe.runs) == 4
    monkeypatch.setattr("ltbench.train.resources.check_recipe", lambda recipe: None)
    launch.checks_before_any_run(recipe)
    assert read == [tiny_weights["clip"]]
    assert backbone.PretrainedViT.check_weights  # the one check, used by run and --dry-run


def test_the_sha256_is_cached_by_path_size_mtime_and_inode(tmp_path, tiny_weights, monkeypatch):
    path = tmp_path / "w.pt"
    shutil.copy(tiny_weights["clip"], path)
    first = W.weights_identity(path)
    monkeypatch.setattr(W.store, "sha256_of", lambda *a, **k: pytest.fail("hashed again"))
    assert W.weights_identity(path) == first  # from weights-sha256.json, in another process too
    os.utime(path, ns=(1, 1))
    monkeypatch.undo()
    assert W.weights_identity(path) == first  # hashed again (the same bytes), not read from the cache
    copy = tmp_path / "copy.pt"  # a new inode at the old path: hashed again
    shutil.copy(tiny_weights["clip_other"], copy)
    os.replace(copy, path)
    os.utime(path, ns=(1, 1))
    assert W.weights_identity(path) != first


def test_a_large_file_shows_progress_and_one_over_the_bound_is_refused(tmp_path, tiny_weights, monkeypatch, capsys):
    path = tmp_path / "w.pt"
    shutil.copy(tiny_weights["clip"], path)
    monkeypatch.setattr(W, "SHOW_PROGRESS_BYTES", 0)
    W.weights_identity(path)
    err = capsys.readouterr().err
    assert f"sha256 of {path} (once per file): 100%" in err
    sparse = tmp_path / "huge.pt"
    with open(sparse, "wb") as f:
        f.truncate(200 * 10**9)  # 200 GB, no disk: refused before a byte is read
    with pytest.raises(W.WeightsFileError, match=r"200\.0 GB, over the 16 GB bound.*LTBENCH_MAX_WEIGHTS_GB"):
        W.weights_identity(sparse)
    monkeypatch.setenv(W.MAX_WEIGHTS_ENV, "0.000001")
    with pytest.raises(W.WeightsFileError, match="over the 1e-06 GB bound"):
        W.weights_identity(path)
    got = run_cli("status", recipe_with(tmp_path, sparse), timeout=240)
    assert got.returncode == 2 and "200.0 GB" in got.stderr, got.stderr
