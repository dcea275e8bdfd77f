"""Pretrained weights: where they are found, what identifies them, and how they are read.

Why a file the user brings: our machines (and many clusters) cannot download, so weights come the way
data do, from ``backbone.weights: PATH`` or from the cache a library already filled on this machine
(``cache_candidates``). Nothing here ever downloads.

Identity: the sha256 of the weights file enters the run's configuration as ``backbone_identity``
(ltbench/results/identity.py), so results of different weights never share a run id or a table row,
while the path itself is an execution setting (moving the file changes nothing).

Formats read (``read_state_dict``), none of them by running code from the file: OpenAI's TorchScript ``.pt``
archives (as OpenAI's ``clip`` package downloads them; read as data, ltbench_foundation/scripted.py), pickled state dicts (``.pt``/``.pth``/``.bin``, open_clip's and timm's, optionally
wrapped in ``{'state_dict': ...}`` or ``{'model': ...}`` and with DataParallel's ``module.`` prefix, read
with ``weights_only=True``), safetensors, and Google's ViT ``.npz`` (through timm's own reader, by the
backbone that knows the layout).
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ltbench.errors import ConfigError, DataMissingError, LtbenchError, shorten
from ltbench.results import caches, store
from ltbench_foundation import scripted


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


MAX_WEIGHTS_ENV = "LTBENCH_MAX_WEIGHTS_GB"  # set: a larger (or smaller) bound on a weights file, in GB
MAX_WEIGHTS_GB = 16.0  # ViT-G/14 in float32 is ~7.5 GB; a file past this is refused, not hashed for minutes
SHOW_PROGRESS_BYTES = 512 * store.MiB  # hashing a larger file says how far it is
SHA_CACHE_FILE = "weights-sha256.json"


class WeightsFileError(LtbenchError):
    """A weights file that cannot be used: one line naming the file and what is wrong with it (exit 2)."""

    def __init__(self, path, what: str):
        super().__init__(f"{path}: {what}; check backbone.weights")


def size_limit_gb() -> float:
    raw = os.environ.get(MAX_WEIGHTS_ENV, "")
    try:
        return float(raw) if raw else MAX_WEIGHTS_GB
    except ValueError:
        raise ConfigError(f"${MAX_WEIGHTS_ENV}={raw[:40]!r}: expected a number of GB") from None


def checked_stat(path: Path) -> os.stat_result:
    """The file's stat, when it is a regular file within the size bound; WeightsFileError otherwise."""
    problem = store.regular_file_problem(path)
    if problem:
        raise WeightsFileError(path, f"it {problem}")
    st = os.stat(path)
    if st.st_size > size_limit_gb() * 1e9:
        raise WeightsFileError(path, f"it is {st.st_size / 1e9:.1f} GB, over the {size_limit_gb():g} GB bound on a "
                                     f"weights file (set ${MAX_WEIGHTS_ENV} to allow it)")
    if st.st_size == 0:
        raise WeightsFileError(path, "it is empty")
    return st


def weights_identity(path: Path) -> str:
    """'sha256:<hex>' of the weights file. Computed once per file: kept in ``weights-sha256.json`` of the cache
    folder keyed by (real path, size, mtime, inode, device) (``caches.remembered_for_file``), so a status of a CLIP
    grid does not read 600 MB per call; a file over ``SHOW_PROGRESS_BYTES`` says how far the hashing is on stderr."""
    checked_stat(path)
    digest = caches.remembered_for_file(SHA_CACHE_FILE, path, _sha256)
    return f"sha256:{digest}"


def _sha256(path: Path) -> str:
    show = _Progress(path) if os.stat(path).st_size > SHOW_PROGRESS_BYTES else None
    try:
        return store.sha256_of(path, show)
    except store.UnusableFile as exc:
        raise WeightsFileError(path, f"it {exc.reason}") from None
    finally:
        if show:
            show.end()


class _Progress:
    """'sha256 of FILE: 40% of 3.2 GB' on stderr: in place on a terminal, every 25% otherwise."""

    def __init__(self, path: Path):
        self.path, self.shown, self.tty = path, -1, sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        percent = 100 * done // max(total, 1)
        step = 1 if self.tty else 25
        if percent // step != self.shown // step:
            self.shown = percent
            end = "\r" if self.tty else "\n"
            print(f"ltbench: sha256 of {self.path} (once per file): {percent}% of {total / 1e9:.1f} GB",
                  end=end, file=sys.stderr, flush=True)

    def end(self) -> None:
        if self.tty:
            print(file=sys.stderr)


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a weights file, by name (see the module docstring for the formats); nothing in the file
    is executed. WeightsFileError naming the file when it cannot be read as weights."""
    checked_stat(path)
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError  # a dependency of timm and open_clip
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise WeightsFileError(path, f"it is not a readable safetensors file ({shorten(str(exc), 120)})") from None
    if scripted.is_torchscript(path):  # OpenAI's CLIP files: read as data (ltbench_foundation/scripted.py)
        try:
            return _unwrap(scripted.read_torchscript(path), path)
        except scripted.ArchiveError as exc:
            raise WeightsFileError(path, f"TorchScript archive: {exc}") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds for a file that is not its format
        raise WeightsFileError(path, f"it is not a weights file torch reads without running code "
                                     f"({type(exc).__name__}: {shorten(str(exc), 120)})") from None
    return _unwrap(state, path)


def non_finite(state: dict[str, torch.Tensor]) -> str:
    """The first floating tensor holding NaN or infinity ('' when none): such weights never train."""
    for key, value in state.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return key
    return ""


def _unwrap(state, path: Path) -> dict[str, torch.Tensor]:
    """Training checkpoints wrap the weights ({'state_dict': ...}); DataParallel prefixes 'module.'."""
    for key in ("state_dict", "model", "module"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsFileError(path, "it does not hold a mapping of parameter names to tensors")
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return state


def npz_arrays(path: Path) -> dict[str, torch.Tensor]:
    """The arrays of a ``.npz`` weights file (Google's ViT checkpoints), read without pickles."""
    import numpy as np  # lazy: only Google's checkpoints need it here

    checked_stat(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {k: torch.from_numpy(np.asarray(archive[k])) for k in archive.files}
    except (OSError, ValueError, EOFError, KeyError) as exc:
        raise WeightsFileError(path, f"it is not a readable .npz file ({shorten(str(exc), 120)})") from None


def load_exactly(model: nn.Module, state: dict, path, backbone: str, ignore: tuple[str, ...] = ()) -> None:
    """load_state_dict, strict, with one line naming the first keys that do not fit (a wrong file, or a file of
    another architecture), instead of PyTorch's page of mismatches."""
    state = {k: v for k, v in state.items() if not k.startswith(ignore)}
    problem = fit_problem(model, state)
    if problem:
        raise ConfigError(f"{path}: these weights do not fit backbone {backbone} ({problem}); check "
                          f"backbone.weights and the backbone's shape options")
    model.load_state_dict(state)


def fit_problem(model: nn.Module, state: dict) -> str:
    """'' when ``state`` has exactly the model's keys with its shapes (the model may be on the meta device), else
    what differs: the first three keys of another shape, missing or unexpected, and how many of each."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if not (missing or extra or wrong):
        return ""
    shown = [f"'{k}' has shape {tuple(state[k].shape)}, the model {tuple(own[k].shape)}" for k in wrong[:3]]
    shown += [f"'{k}' is missing" for k in missing[:3 - len(shown)]]
    shown += [f"'{k}' is not a parameter of the model" for k in extra[:3 - len(shown)]]
    return f"{'; '.join(shown)}; {len(missing)} missing, {len(extra)} unexpected, {len(wrong)} of another shape"
