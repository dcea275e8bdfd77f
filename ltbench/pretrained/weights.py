"""Pretrained weights: where they are found, what identifies them, and how they are read.

Why a file the user brings: our machines (and many clusters) cannot download, so weights come the way
data do, from ``backbone.weights: PATH`` or from the cache a library already filled on this machine
(``cache_candidates``). Nothing here ever downloads.

Identity: the sha256 of the weights file enters the run's configuration as ``backbone_identity``
(ltbench/results/identity.py), so results of different weights never share a run id or a table row,
while the path itself is an execution setting (moving the file changes nothing).

Formats read (``read_state_dict``): OpenAI's TorchScript ``.pt`` archives (as OpenAI's ``clip`` package
downloads them), pickled state dicts (``.pt``/``.pth``/``.bin``, open_clip's and timm's, optionally
wrapped in ``{'state_dict': ...}`` or ``{'model': ...}`` and with DataParallel's ``module.`` prefix, read
with ``weights_only=True``), safetensors, and Google's ViT ``.npz`` (through timm's own reader, by the
backbone that knows the layout).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ltbench.errors import CorruptFileError, DataMissingError
from ltbench.results import identity, safe_read


@dataclass(frozen=True)
class WeightSource:
    """Where a pretrained backbone's weights may be and how a user gets them (for the missing-file line)."""

    backbone: str  # registered name, for messages
    cache_files: tuple[str, ...] = ()  # paths under the user's home or HF hub cache, '*' allowed in a folder part
    how_to_get: str = ""  # one sentence: where the file is published


class WeightsMissingError(DataMissingError):
    """No weights file: one line naming the backbone, the paths searched and how to get the file (exit 2)."""


def hub_cache() -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub resolves it (without importing it)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = Path(os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    return home.expanduser() / "hub"


def cache_candidates(source: WeightSource) -> list[Path]:
    """The cache files of ``source`` that exist, in order ('{hub}' is the HF hub cache, '~' the home;
    a '*' matches the snapshot folder of a hub cache)."""
    found: list[Path] = []
    for pattern in source.cache_files:
        path = Path(pattern.replace("{hub}", str(hub_cache()))).expanduser()
        matches = sorted(Path(path.anchor).glob(str(path.relative_to(path.anchor)))) if "*" in str(path) else [path]
        found += [p for p in matches if p.is_file()]
    return found


def find_weights(weights: str | None, source: WeightSource) -> Path:
    """The weights file a backbone loads: ``weights`` when given (it must exist), else the first cache
    file found; WeightsMissingError otherwise (one line: backbone, searched paths, how to get it)."""
    if weights:
        path = Path(weights).expanduser()
        if path.is_file():
            return path
        searched = str(path)
    else:
        found = cache_candidates(source)
        if found:
            return found[0]
        shown = [str(Path(p.replace("{hub}", str(hub_cache()))).expanduser()) for p in source.cache_files]
        searched = ", ".join(shown) or "no cache location (set backbone.weights)"
    raise WeightsMissingError(
        f"backbone {source.backbone}: weights file not found (searched {searched}); {source.how_to_get} "
        f"and give its path as backbone.weights (weights are never downloaded)")


def weights_identity(path: Path) -> str:
    """'sha256:<hex>' of the weights file (cached per path, size and mtime within a process)."""
    digest = identity.file_sha256(path)
    if digest is None:
        raise CorruptFileError(path, "cannot be read (not a regular file, or no permission)")
    return f"sha256:{digest}"


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a weights file, by name (see the module docstring for the formats)."""
    problem = safe_read.regular_file_problem(path)
    if problem:
        raise CorruptFileError(path, f"is unusable: it {problem}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file  # a dependency of timm and open_clip

        return load_file(str(path))
    try:
        with warnings.catch_warnings():  # "looks like a TorchScript archive": handled below
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # OpenAI's archives are TorchScript; anything else unreadable is damaged
        state = _torchscript_state(path, exc)
    return _unwrap(state, path)


def _torchscript_state(path: Path, first: Exception) -> dict:
    """OpenAI's CLIP .pt files are TorchScript archives: their parameters, without running their code."""
    try:
        with warnings.catch_warnings():  # torch deprecates TorchScript; OpenAI's files are TorchScript
            warnings.simplefilter("ignore")
            return dict(torch.jit.load(str(path), map_location="cpu").state_dict())
    except Exception:
        raise CorruptFileError(path, f"is neither a state dict nor a TorchScript archive ({type(first).__name__}: "
                                     f"{str(first)[:120]})") from None


def _unwrap(state, path: Path) -> dict[str, torch.Tensor]:
    """Training checkpoints wrap the weights ({'state_dict': ...}); DataParallel prefixes 'module.'."""
    for key in ("state_dict", "model", "module"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CorruptFileError(path, "does not hold a mapping of parameter names to tensors")
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return state
