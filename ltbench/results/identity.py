"""A run's identity: the one rule for "is this the same computation?". No torch, no other ltbench module.

Everything that names a result goes through here: the run id (the folder name of a run), the key of a
table row (the run id's identity less the seed), the id of a stage-2 result, and the rule that says a
finished result is stale because the plugin code that made it has changed since.

Every field of a run's configuration is one of two kinds:

* **computation** (the default): it changes what a run computes or records, so it is part of the id.
  That includes ``train.precision`` (numerics) and ``train.eval_every`` (the record gets the test curve
  and the test-oracle best epoch), every method, backbone and optimiser option, and every dataset option
  not listed below.
* **execution setting**: how the same computation is executed or where its inputs are found. Two runs
  that differ only there compute the same thing, so they get one id, resume and skip each other's
  folders, and share a table row (tests/test_identity.py trains a tiny run under each setting and
  compares the metrics).

Execution settings come in two groups, for one reason only: ids already recorded must stay.
``DROPPED`` fields were never hashed (they are removed); ``NORMALISED`` fields were hashed by earlier
versions, so they are set to their default before hashing instead of removed (removing them would
change every recorded id). A dataset whose files live under an execution setting (a ``root`` folder
whose contents the user chooses) says what identifies its data through ``DatasetBuilder.data_identity``;
that value is stored in the configuration as ``data_identity`` and hashed like any other field.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from ltbench.results import safe_read

# Paths and local checks: where the data are found, how the process shows progress, how many threads.
DROPPED: frozenset[tuple[str, str]] = frozenset({
    ("data", "root"), ("data", "split_dir"), ("data", "download"), ("data", "check_images"),
    ("train", "threads"), ("train", "progress"), ("train", "log_every"),
    # how the same computation is executed (equal up to float rounding of kernels)
    ("train", "channels_last"), ("train", "compile"), ("train", "cudnn_benchmark"),
    # where scalars are also written (TensorBoard, W&B): not what is computed
    ("train", "loggers"),
})
# Declared execution settings after results recording them had been made: hashed at their default value.
# train.num_workers: DataLoader processes; every sample's augmentation is seeded by (seed, epoch, index).
# train.checkpoint_minutes: timed mid-epoch checkpoints; a resumed run replays the same batches.
NORMALISED: dict[tuple[str, str], Any] = {("train", "num_workers"): 0, ("train", "checkpoint_minutes"): 0.0}
# The core train: fields that change what a run computes or records (every train: field is declared here or above).
TRAIN_COMPUTATION = frozenset({"precision", "eval_every", "augment_on", "augment_scheme"})
DATA_IDENTITY = "data_identity"  # top-level config key: what identifies a dataset's files, when its options do not


def is_execution_setting(section: str, key: str) -> bool:
    return (section, key) in DROPPED or (section, key) in NORMALISED


def identity_of(config: dict) -> dict:
    """What a run computes: its resolved configuration less the dropped execution settings, with the
    normalised ones at their default. Sections are copied, so ``config`` is left as it is."""
    identity = {k: (dict(v) if isinstance(v, dict) else v) for k, v in config.items()}
    for section, key in DROPPED:
        if isinstance(identity.get(section), dict):
            identity[section].pop(key, None)
    for (section, key), default in NORMALISED.items():
        if isinstance(identity.get(section), dict) and key in identity[section]:
            identity[section][key] = default
    return identity


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def run_id(config: dict) -> str:
    """The run's folder name: sha1 of the canonical JSON of its identity, 12 hex digits.
    ValueError for NaN or infinity (a free-form plugin option): such a config has no id."""
    return hashlib.sha1(canonical_json(identity_of(config)).encode()).hexdigest()[:12]


def row_key(config: dict) -> tuple[str, dict]:
    """A table row's identity: the run's identity less the seed. Returns (sha1 of it, 16 hex digits; the
    identity). ``default=str`` keeps a damaged record (a non-JSON value) hashable instead of raising."""
    identity = identity_of(config)
    identity.pop("seed", None)
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16], identity


def posthoc_id(spec: dict) -> str:
    """The folder name of a resolved stage-2 setting: sha1 of its canonical JSON, 12 hex digits."""
    return hashlib.sha1(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]


def stage2_run_id(run_id_: str, spec: dict) -> str:
    """The id of a stage-2 result: '<run id>+<stage-2 id>', unique in a results folder."""
    return f"{run_id_}+{posthoc_id(spec)}"


def differing_settings(configs: list[dict]) -> list[str]:
    """Dotted keys (seed left out) whose values differ between these run configurations, in sorted order:
    what a line per run must show so that no two lines of different runs read alike."""
    flats = [_flatten(identity_of(c)) for c in configs]
    keys = sorted({k for f in flats for k in f} - {"seed"})
    return [k for k in keys
            if len({json.dumps(f[k], sort_keys=True, default=str) if k in f else "<absent>" for f in flats}) > 1]


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# ------------------------------------------------------------------------------------------------
# Stale code: a result records {module: {path, sha256}} of the plugin code that made it


_sha_cache: dict[tuple, str] = {}


def file_sha256(path) -> str | None:
    """sha256 of a file's bytes, None when it cannot be read; cached per (path, size, mtime), since a
    status of a large grid asks for the same few plugin files once per run."""
    try:
        st = os.stat(path)
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in _sha_cache:
            _sha_cache[key] = safe_read.sha256_of(path)  # a FIFO or a device is no file: never read
        return _sha_cache[key]
    except (OSError, TypeError, ValueError, safe_read.UnusableFile):
        return None


def code_entry(module: str, path: str) -> dict:
    """What a result records of one module: its path relative to the folder holding its top-level
    package ('ltbench/backbones.py', 'my_plugins/loss.py'), so a committed result checks on any clone,
    and the sha256 of its bytes."""
    return {"path": relative_code_path(module, path), "sha256": file_sha256(path)}


def relative_code_path(module: str, path: str) -> str:
    """'ltbench.data.cifar' + '/x/ltbench/data/cifar.py' -> 'ltbench/data/cifar.py'. Old records hold
    absolute paths: their last components (as many as the module has parts) are this relative path."""
    parts = Path(path).parts
    depth = module.count(".") + 1 + (Path(path).name == "__init__.py")
    return Path(*parts[-depth:]).as_posix() if len(parts) >= depth else Path(path).as_posix()


def code_file(module: str, entry: dict, plugin_dirs: list[str] = ()) -> Path | None:
    """The file on this machine that a recorded module entry refers to: its relative path below the folder
    that holds the module's top-level package now (imported, findable on sys.path, or one of the run's
    plugin folders). An old absolute path is mapped the same way; it is used as it is only when the
    package cannot be found here."""
    recorded = str(entry.get("path") or "")
    if not recorded:
        return None
    relative = relative_code_path(module, recorded)
    base = _package_parent(module.split(".")[0], plugin_dirs)
    if base is not None:
        return base / relative
    return Path(recorded) if Path(recorded).is_absolute() else None


def _package_parent(top: str, plugin_dirs: list[str]) -> Path | None:
    for folder in plugin_dirs:
        if Path(folder).name == top:
            return Path(folder).parent
    loaded = sys.modules.get(top)
    locations = list(getattr(loaded, "__path__", []) or [])
    if not locations:
        import importlib.util

        try:
            spec = importlib.util.find_spec(top)  # finds, does not import, a top-level package
        except (ImportError, ValueError):
            spec = None
        locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]).parent if locations else None


PLUGIN_FOLDER_SOURCE = "plugin folder "  # how the registry names a plugin's source (registry._import_plugin_folder)


def recorded_plugin_folders(plugins) -> list[str]:
    """The plugin folders a result names: a list of folders (a run spec), or the result's ``plugins``
    (name -> source, 'plugin folder /path/pkg' for a folder plugin)."""
    if isinstance(plugins, dict):
        plugins = [s[len(PLUGIN_FOLDER_SOURCE):] for s in plugins.values()
                   if isinstance(s, str) and s.startswith(PLUGIN_FOLDER_SOURCE)]
    return [p for p in plugins or [] if isinstance(p, str)]


def changed_code(result: dict) -> tuple[list[str], list[str]]:
    """(modules whose source differs from the hash in ``result['code']``, modules whose file is gone).

    The stale rule for runs and stage-2 results alike; comparing files on disk needs no import, so
    status and tables can say which finished results are stale without torch.
    """
    changed, gone = [], []
    plugin_dirs = recorded_plugin_folders(result.get("plugins"))
    for module, entry in sorted((result.get("code") or {}).items()):
        if not isinstance(entry, dict):
            continue
        path = code_file(module, entry, plugin_dirs)
        now = file_sha256(path) if path is not None else None
        if now is None:
            gone.append(module)
        elif now != entry.get("sha256"):
            changed.append(module)
    return changed, gone
