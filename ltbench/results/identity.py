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

Execution settings (``EXECUTION_SETTINGS``) are removed before hashing. A dataset whose files live under an
execution setting (a ``root`` folder whose contents the user chooses) says what identifies its data through
``DatasetBuilder.data_identity``; that value is stored in the configuration as ``data_identity`` and hashed
like any other field.

The hash covers the *fully resolved* configuration (every default explicit, the sampler too) under
``IDENTITY_VERSION``, which is hashed with it. Changing what identifies a run means bumping that version and
adding a step to ltbench/results/migrate.py that rewrites recorded configurations and ids; nothing here ever
reads an older record differently.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ltbench.results import code, safe_read

#: Part of every hashed identity: bump it (with a migration step) when what identifies a run changes.
IDENTITY_VERSION = 2

# Paths and local checks: where the data are found, how the process shows progress, how many threads, and how
# the same computation is executed (equal up to float rounding of kernels, or bit for bit).
EXECUTION_SETTINGS: frozenset[tuple[str, str]] = frozenset({
    ("data", "root"), ("data", "split_dir"), ("data", "download"), ("data", "check_images"),
    ("backbone", "weights"),  # where a pretrained backbone's weights file is; its sha256 is BACKBONE_IDENTITY
    ("train", "threads"), ("train", "progress"), ("train", "log_every"),
    ("train", "channels_last"), ("train", "compile"), ("train", "cudnn_benchmark"),
    # DataLoader processes: every sample's augmentation is seeded by (seed, epoch, index)
    ("train", "num_workers"),
    # timed mid-epoch checkpoints: a resumed run replays the same batches
    ("train", "checkpoint_minutes"),
    # where scalars are also written (TensorBoard, W&B): not what is computed
    ("train", "loggers"),
})
# The core train: fields that change what a run computes or records (every train: field is declared here or above).
TRAIN_COMPUTATION = frozenset({"precision", "eval_every", "augment_on", "augment_scheme"})
DATA_IDENTITY = "data_identity"  # top-level config key: what identifies a dataset's files, when its options do not
BACKBONE_IDENTITY = "backbone_identity"  # top-level config key: the sha256 of a pretrained backbone's weights file
# Identities of files the user chooses (they may change without the recipe changing): never cached.
FILE_IDENTITIES = (DATA_IDENTITY, BACKBONE_IDENTITY)


def is_execution_setting(section: str, key: str) -> bool:
    return (section, key) in EXECUTION_SETTINGS


def identity_of(config: dict) -> dict:
    """What a run computes: its resolved configuration less the execution settings. Sections are copied, so
    ``config`` is left as it is."""
    identity = {k: (dict(v) if isinstance(v, dict) else v) for k, v in config.items()}
    for section, key in EXECUTION_SETTINGS:
        if isinstance(identity.get(section), dict):
            identity[section].pop(key, None)
    return identity


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _versioned(identity_text: str) -> bytes:
    return f"ltbench identity {IDENTITY_VERSION}\n{identity_text}".encode()


def id_of_identity_text(text: str) -> str:
    """12 hex digits: sha1 of the identity version and ``text``, the canonical JSON of an identity."""
    return hashlib.sha1(_versioned(text)).hexdigest()[:12]


def run_id(config: dict) -> str:
    """The run's folder name: sha1 of the identity version and the canonical JSON of its identity, 12 hex
    digits. ValueError for NaN or infinity (a free-form plugin option): such a config has no id."""
    return id_of_identity_text(canonical_json(identity_of(config)))


def row_key(config: dict) -> tuple[str, dict]:
    """A table row's identity: the run's identity less the seed. Returns (sha1 of it, 16 hex digits; the
    identity). ``default=str`` keeps a damaged record (a non-JSON value) hashable instead of raising."""
    identity = identity_of(config)
    identity.pop("seed", None)
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(_versioned(text)).hexdigest()[:16], identity


def posthoc_id(spec: dict) -> str:
    """The folder name of a resolved stage-2 setting: sha1 of its canonical JSON, 12 hex digits."""
    return hashlib.sha1(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]


def stage2_run_id(run_id_: str, spec: dict) -> str:
    """The id of a stage-2 result: '<run id>+<stage-2 id>', unique in a results folder."""
    return f"{run_id_}+{posthoc_id(spec)}"


def config_id(config: dict) -> str:
    """The id a configuration hashes to: ``run_id``, and for a stage-2 configuration (a ``posthoc`` section)
    ``<run id>+<stage-2 id>`` (``stage2_run_id``). ValueError or TypeError when it has none."""
    stage2 = config.get("posthoc")
    if stage2 is None:
        return run_id(config)
    return stage2_run_id(run_id({k: v for k, v in config.items() if k != "posthoc"}), stage2)


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
# Stale code: a result records every module its computation executed (ltbench/results/code.py); it is
# 'stale' when one of them has changed since, normalised (docstrings and comments never count), and its
# code is 'unknown' when the record cannot say (no record, an older partial one, a file gone).


_sha_cache: dict[tuple, str] = {}
_normalized_cache: dict[tuple, str | None] = {}


def file_sha256(path) -> str | None:
    """sha256 of a file's bytes, None when it cannot be read; cached per (path, size, mtime), since a
    status of a large grid asks for the same few files once per run."""
    try:
        st = os.stat(path)
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in _sha_cache:
            _sha_cache[key] = safe_read.sha256_of(path)  # a FIFO or a device is no file: never read
        return _sha_cache[key]
    except (OSError, TypeError, ValueError, safe_read.UnusableFile):
        return None


def normalized_file_hash(path) -> str | None:
    """``code.normalized_hash`` of a source file now (None: unreadable, or not Python), cached like
    ``file_sha256``: ``ltbench status`` of 10,000 runs parses each module once."""
    try:
        st = os.stat(path)
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in _normalized_cache:
            data = safe_read.read_bytes(path, limit=16 * safe_read.MiB)
            _normalized_cache[key] = code.normalized_hash(data)
        return _normalized_cache[key]
    except (OSError, TypeError, ValueError, safe_read.UnusableFile):
        return None


def code_entry(module: str, path: str) -> dict:
    """What a result records of one module: its path relative to the folder holding its top-level
    package ('ltbench/backbones.py', 'my_plugins/loss.py'), so a committed result checks on any clone,
    the sha256 of its bytes, and that of its normalised syntax tree (the one the stale rule compares)."""
    return {"path": relative_code_path(module, path), "sha256": file_sha256(path),
            "normalized": normalized_file_hash(path)}


def relative_code_path(module: str, path: str) -> str:
    """'ltbench.data.cifar' + '/x/ltbench/data/cifar.py' -> 'ltbench/data/cifar.py': the last components
    of the file's path, as many as the module has parts (a record never stores an absolute path)."""
    parts = Path(path).parts
    depth = module.count(".") + 1 + (Path(path).name == "__init__.py")
    return Path(*parts[-depth:]).as_posix() if len(parts) >= depth else Path(path).as_posix()


def code_file(module: str, entry: dict, plugin_dirs: list[str] = ()) -> Path | None:
    """The file on this machine that a recorded module entry refers to: its relative path below the folder
    that holds the module's top-level package now (imported, findable on sys.path, or one of the run's
    plugin folders); None when that package is not here. An entry without a path is at the one its module's
    name gives (``code.code_record`` leaves it out then)."""
    base = _package_parent(module.split(".")[0], plugin_dirs)
    return base / (entry.get("path") or code.module_path(module)) if base is not None else None


def _package_parent(top: str, plugin_dirs: list[str]) -> Path | None:
    for folder in plugin_dirs:
        if Path(folder).name == top:
            return Path(folder).parent
    loaded = sys.modules.get(top)
    locations = list(getattr(loaded, "__path__", []) or [])
    if not locations:
        import importlib.util  # lazy: only for a package this process has not imported

        try:
            spec = importlib.util.find_spec(top)  # finds, does not import, a top-level package
        except (ImportError, ValueError):
            spec = None
        locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]).parent if locations else None


def source_reader(plugin_dirs: list[str] = ()) -> code.Reader:
    """A ``code.Reader`` over the files of this machine: 'pkg/mod.py' below the folder that holds ``pkg``
    (a plugin folder of the run, or a package Python finds), None when there is no such file."""
    def read(rel: str) -> bytes | None:
        base = _package_parent(rel.split("/")[0], plugin_dirs)
        try:
            return safe_read.read_bytes(base / rel, limit=16 * safe_read.MiB) if base is not None else None
        except safe_read.UnusableFile:
            return None
    return read


PLUGIN_FOLDER_SOURCE = "plugin folder "  # how the registry names a plugin's source (registry._import_plugin_folder)


def recorded_plugin_folders(plugins) -> list[str]:
    """The plugin folders a result names: a list of folders (a run spec), or the result's ``plugins``
    (name -> source, 'plugin folder /path/pkg' for a folder plugin)."""
    if isinstance(plugins, dict):
        plugins = [s[len(PLUGIN_FOLDER_SOURCE):] for s in plugins.values()
                   if isinstance(s, str) and s.startswith(PLUGIN_FOLDER_SOURCE)]
    return [p for p in plugins or [] if isinstance(p, str)]


CODE_UNKNOWN = "code unknown"  # the status of a finished result whose code cannot be checked


@dataclass(frozen=True)
class CodeState:
    """The stale rule's verdict on a finished result: 'done' (every module it executed is unchanged,
    normalised), 'stale' (``changed`` modules differ), or CODE_UNKNOWN (``reason`` says why it cannot tell)."""

    status: str
    changed: tuple[str, ...] = ()
    reason: str = ""
    unknown: tuple[str, ...] = ()  # recorded modules that cannot be checked (file gone, no normalised hash)


def code_state(result: dict) -> CodeState:
    """The one stale rule, for runs and stage-2 results alike. Comparing files on disk needs no import,
    so status and tables say it without torch. A known change wins over anything unknown."""
    recorded = result.get("code")
    source = result.get("code_source") if isinstance(result.get("code_source"), str) else None
    if not isinstance(recorded, dict) or not recorded:
        return CodeState(CODE_UNKNOWN, reason=source or "no code record")
    changed, unknown = [], []
    plugin_dirs = recorded_plugin_folders(result.get("plugins"))
    for module, entry in sorted(recorded.items()):
        if not isinstance(entry, dict) or not entry.get("normalized"):
            unknown.append(module)
            continue
        path = code_file(module, entry, plugin_dirs)
        now = normalized_file_hash(path) if path is not None else None
        if now is None:
            unknown.append(module)
        elif now != entry["normalized"]:
            changed.append(module)
    if changed:
        return CodeState("stale", tuple(changed), unknown=tuple(unknown))
    if result.get("code_scope") != code.CODE_SCOPE:
        why = source or "recorded before ltbench hashed every module a run executes: only its plugins' files"
        return CodeState(CODE_UNKNOWN, reason=why, unknown=tuple(unknown))
    if unknown:
        return CodeState(CODE_UNKNOWN, reason=f"cannot check {', '.join(unknown[:4])}"
                                              + (f" and {len(unknown) - 4} more" if len(unknown) > 4 else "")
                                              + ": file gone or not hashed", unknown=tuple(unknown))
    return CodeState("done")


def changed_code(result: dict) -> tuple[list[str], list[str]]:
    """(modules whose normalised source differs from the record, recorded modules that cannot be checked):
    the pieces of ``code_state`` for callers that list them."""
    state = code_state(result)
    return list(state.changed), list(state.unknown)


# ------------------------------------------------------------------------------------------------
# Numerics: what decides a result's floating-point numbers besides its run id (provenance.numerics).
# The run id names the computation; execution settings stay out of it so that recorded ids hold. Two
# results of one run id stand for each other only when their numerics match: same device and model,
# CPU capability, intra-op threads (on the CPU), versions, precision and kernel choices.

_COMMON = ("device", "torch", "torchvision", "precision", "compile", "channels_last", "world_size",
           "threads_per_epoch")
NUMERICS_FIELDS = {
    "cpu": _COMMON + ("cpu_model", "cpu_capability", "threads"),
    # On a GPU the threads only run host-side work: they are recorded, not compared.
    "cuda": _COMMON + ("device_model", "cuda", "cudnn", "deterministic", "tf32_matmul", "tf32_cudnn",
                       "float32_matmul_precision", "cudnn_benchmark"),
}
NOT_RECORDED = "not recorded"  # a numerics field the record cannot tell (made before it was recorded): never a match


def numerics_of(result: dict) -> dict:
    """A result's ``numerics`` (provenance.numerics; ltbench/results/migrate.py fills them in for older records)."""
    recorded = result.get("numerics")
    return dict(recorded) if isinstance(recorded, dict) else {}


def numerics_difference(a: dict, b: dict) -> tuple[list[str], list[str]]:
    """(fields known on both sides that differ, fields that matter but one side does not know). They match
    only when both lists are empty; a field absent on both sides (``threads_per_epoch`` of two runs trained
    in one go) is no difference, one ``NOT_RECORDED`` on either side is unknown."""
    fields = sorted(set(NUMERICS_FIELDS.get(a.get("device"), _COMMON)) | set(NUMERICS_FIELDS.get(b.get("device"), _COMMON)))
    differ, unknown = [], []
    for name in fields:
        va, vb = a.get(name), b.get(name)
        if NOT_RECORDED in (va, vb) or (va is None) != (vb is None):
            unknown.append(name)
        elif va is not None and va != vb:
            differ.append(name)
    return differ, unknown


def numerics_text(n: dict) -> str:
    """'CPU Intel(R) Xeon(R) Processor (AVX512), 1 thread' / 'CPU model not recorded, 2 threads (CPU capability
    not recorded)': the fields a reader compares first; versions only when not the common torch ones."""
    n = {k: v for k, v in n.items() if v != NOT_RECORDED}
    device = n.get("device") or "device not recorded"
    if device == "cuda":
        where = f"GPU {n.get('device_model') or 'model not recorded'}"
    else:
        model = n.get("cpu_model")
        cap = n.get("cpu_capability")
        where = (f"CPU {model}" if model else "CPU model not recorded") + (f" ({cap})" if cap else " (CPU capability not recorded)")
    threads = n.get("threads")
    parts = [where, f"{threads} thread{'s' if threads != 1 else ''}" if threads is not None else "threads not recorded"]
    if n.get("threads_per_epoch"):
        parts.append("thread count changed during the run")
    if n.get("precision") not in (None, "fp32"):
        parts.append(str(n["precision"]))
    if n.get("compile") not in (None, "off"):
        parts.append(f"compile {n['compile']}")
    return ", ".join(parts)
