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

import functools
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ltbench.errors import shorten
from ltbench.results import code, schema, store

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


STUDY_VERSION = 2  # 2: one study per grid point over its tuning seeds (1: one per grid point and report seed)


def study_id(method: str, fixed_id: str, seed: int, tuning_seeds: list[int], space_text: str, prune: bool) -> str:
    """A study's name in its sampler's state, 'la-<12 hex>': the hash covers the run id of the configuration less
    its searched options (``fixed_id``), the search's seed and tuning seeds, its space and whether it prunes;
    changing any of them is another study. The number of trials is left out: raising it continues the study."""
    key = json.dumps([STUDY_VERSION, fixed_id, seed, list(tuning_seeds), space_text, prune], sort_keys=True)
    return f"{method}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"


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


def _by_stat(cache: dict, path, compute):
    """``compute(path)`` cached per (path, size, mtime): ``ltbench status`` of 10,000 runs reads each file once;
    None when it cannot be read (a FIFO or a device never is: the store's reader)."""
    try:
        st = os.stat(path)
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in cache:
            cache[key] = compute(path)
        return cache[key]
    except (OSError, TypeError, ValueError, store.UnusableFile):
        return None


def file_sha256(path, limit: int | None = None, follow: bool = True) -> str | None:
    """sha256 of a file's bytes, None when it cannot be read or is over ``limit`` bytes."""
    return _by_stat(_sha_cache, path, lambda p: store.sha256_of(p, limit=limit, follow=follow))


def normalized_file_hash(path) -> str | None:
    """``code.normalized_hash`` of a source file now (None: unreadable, or not Python)."""
    return _by_stat(_normalized_cache, path,
                    lambda p: code.normalized_hash(store.read_bounded(p, limit=MAX_SOURCE_BYTES, follow=True)))


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
    rel = entry.get("path") or code.module_path(module)
    return inside_package(base, rel, module.split(".")[0]) if base is not None and isinstance(rel, str) else None


MAX_SOURCE_BYTES = 16 * store.MiB  # a module's source
MAX_DATA_BYTES = 64 * store.MiB  # a data file a module names (class names, prompts, a split list): hashed up to this


@functools.lru_cache(maxsize=None)  # status of 10,000 runs asks for the same few hundred paths
def inside_package(base: Path, rel: str, top: str | None = None) -> Path | None:
    """``base / rel`` when, resolved, it lies inside the top-level package ``top`` (``rel``'s first part) below
    ``base`` (its folder, or the module ``top.py``); None when the path is absolute or leads out (``..``, a link).
    A path read from a record is data: it never names a file outside the package it names."""
    top = top or rel.split("/")[0].removesuffix(".py")
    path, real = base / rel, (base / rel).resolve()
    package = (base / top).resolve()
    if real == (base / f"{top}.py").resolve() or (real.is_relative_to(package) and real != package):
        return path
    return None


def _package_parent(top: str, plugin_dirs: list[str] = ()) -> Path | None:
    """The folder holding the top-level package or module ``top`` here: a plugin folder's parent, where this
    process imported it from, a plugin folder's sibling (the registry puts their parent on sys.path), or where
    Python finds it; None when it is nowhere. Never imports anything."""
    for folder in plugin_dirs:
        if Path(folder).name == top:
            return Path(folder).parent
    loaded = sys.modules.get(top)
    if loaded is not None:
        locations = list(getattr(loaded, "__path__", []) or [])
        if locations:
            return Path(locations[0]).parent
        if getattr(loaded, "__file__", None):
            return Path(loaded.__file__).parent
    for folder in plugin_dirs:
        parent = Path(folder).parent
        if (parent / top / "__init__.py").is_file() or (parent / f"{top}.py").is_file():
            return parent
    import importlib.util  # lazy: only for a package this process has not imported

    try:
        spec = importlib.util.find_spec(top)  # finds, does not import, a top-level package
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]).parent
    return Path(spec.origin).parent if spec.origin and spec.origin.endswith(".py") else None


# ------------------------------------------------------------------------------------------------
# Where a run's code comes from: what is hashed (every module that is not installed), what is recorded by its
# version (an installed distribution), and the data files a hashed module names. One rule for the record
# (provenance.modules_code) and the check (code_state).

DISTRIBUTION = "distribution:"  # code record key of an installed distribution: {'version': ...}
DATA = "data:"  # code record key of a data file a hashed module names: {'sha256': ...}


def _install_folders(kinds=("purelib", "platlib")) -> set[Path]:
    """The folders distributions are installed into (site-packages; with ``kinds`` the standard library's)."""
    import site
    import sysconfig

    paths = {sysconfig.get_paths().get(k) for k in kinds}
    if "purelib" in kinds:
        paths |= set(getattr(site, "getsitepackages", lambda: [])()) | {getattr(site, "getusersitepackages", lambda: None)()}
    return {Path(p).resolve() for p in paths if p}


_where: dict[str, str] = {}


def package_kind(top: str) -> str:
    """'hashed' (ltbench, any package outside the installation folders: a plugin or helper package on
    sys.path, an editable install), 'installed' (under site-packages: recorded by its distribution's version),
    'stdlib', or 'absent' (not importable here: an optional import that did not run)."""
    if top not in _where:
        if top == "ltbench":
            _where[top] = "hashed"
        elif top in sys.stdlib_module_names or top in sys.builtin_module_names:
            _where[top] = "stdlib"
        else:
            parent = _package_parent(top)
            folder = parent.resolve() if parent is not None else None
            _where[top] = ("absent" if folder is None else "installed" if folder in _install_folders()
                           else "stdlib" if folder in _install_folders(("stdlib", "platstdlib")) else "hashed")
    return _where[top]


_distributions: dict | None = None


def distribution_versions(tops: set[str]) -> dict[str, dict]:
    """{'distribution:torch': {'version': '2.14.1'}, ...}: the installed distributions that provide these
    top-level packages (importlib.metadata, read once per process)."""
    names = sorted({d for top in tops for d in distributions_map().get(top, [])})
    return {f"{DISTRIBUTION}{name}": {"version": installed_version(name)} for name in names}


def distributions_map() -> dict[str, list[str]]:
    """{top-level package: [distributions providing it]} of this interpreter (importlib.metadata reads every
    installed distribution's files for it: 0.2-0.4 s), once per process, or as ``known_distributions`` gave it."""
    import importlib.metadata

    global _distributions
    if _distributions is None:
        _distributions = importlib.metadata.packages_distributions()
    return _distributions


def known_distributions(mapping) -> None:
    """Take ``distributions_map`` from a cache made under the same sys.path and site-packages folders, when it is
    the shape that function gives ({name: [names]}); left as it is otherwise."""
    global _distributions
    if isinstance(mapping, dict) and all(isinstance(k, str) and isinstance(v, list) and all(isinstance(d, str) for d in v)
                                         for k, v in mapping.items()):
        _distributions = mapping


_versions: dict[str, str | None] = {}


def installed_version(name: str) -> str | None:
    if name not in _versions:
        import importlib.metadata

        try:
            _versions[name] = importlib.metadata.version(name)
        except (importlib.metadata.PackageNotFoundError, ValueError):
            _versions[name] = None
    return _versions[name]


def data_files(modules: dict[str, tuple[str, bytes]]) -> dict[str, dict]:
    """{'data:my_plugin/classnames/places_lt.txt': {'sha256': ...}}: every file a hashed module
    names by a string constant (``code.file_names``) next to it, a named folder's files included (not its
    Python packages, hidden files or caches): the class-name and prompt lists a text classifier is built from,
    a split list shipped with a plugin."""
    out = {}
    for module, (rel, data) in modules.items():
        base = _package_parent(module.split(".")[0])
        if base is None:
            continue
        folder = (base / rel).parent
        for name in code.file_names(data):
            target = folder / name
            if target.suffix == ".py" or not target.exists() or (target / "__init__.py").exists():
                continue
            for path in sorted(target.rglob("*")) if target.is_dir() else [target]:
                if path.is_file() and not any(part.startswith((".", "__pycache__")) or part.endswith(".pyc")
                                              for part in path.relative_to(base).parts):
                    out[f"{DATA}{path.relative_to(base).as_posix()}"] = {"sha256": file_sha256(path, MAX_DATA_BYTES)}
    return out


def source_reader(plugin_dirs: list[str] = ()) -> code.Reader:
    """A ``code.Reader`` over the files of this machine: 'pkg/mod.py' below the folder that holds ``pkg``
    (a plugin folder of the run, or a package Python finds), None when there is no such file."""
    def read(rel: str) -> bytes | None:
        base = _package_parent(rel.split("/")[0], plugin_dirs)
        try:
            path = inside_package(base, rel) if base is not None else None
            return store.read_bounded(path, limit=MAX_SOURCE_BYTES, follow=True) if path is not None else None
        except store.UnusableFile:
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


CODE_UNKNOWN = store.CODE_UNKNOWN  # the status of a finished result whose code cannot be checked


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
        recorded_value, now = _recorded_and_now(module, entry, plugin_dirs)
        if recorded_value is None or now is None:
            unknown.append(module)
        elif now != recorded_value:
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


def _recorded_and_now(key: str, entry, plugin_dirs: list[str]) -> tuple[str | None, str | None]:
    """(what the record says, what this machine says now) of one code entry: a module's normalised hash, a
    data file's sha256, an installed distribution's version; None where either cannot be told."""
    if not isinstance(entry, dict):
        return None, None
    if key.startswith(DISTRIBUTION):
        return entry.get("version"), installed_version(key[len(DISTRIBUTION):])
    if key.startswith(DATA):
        rel = key[len(DATA):]
        base = _package_parent(rel.split("/")[0], plugin_dirs)
        path = inside_package(base, rel) if base is not None else None
        return entry.get("sha256"), file_sha256(path, MAX_DATA_BYTES) if path is not None else None
    if not entry.get("normalized"):
        return None, None
    path = code_file(key, entry, plugin_dirs)
    return entry["normalized"], normalized_file_hash(path) if path is not None else None


def changed_code(result: dict) -> tuple[list[str], list[str]]:
    """(modules whose normalised source differs from the record, recorded modules that cannot be checked):
    the pieces of ``code_state`` for callers that list them."""
    state = code_state(result)
    return list(state.changed), list(state.unknown)


# ------------------------------------------------------------------------------------------------
# Numerics: what decides a result's floating-point numbers besides its run id (provenance.numerics).
# The run id names the computation; execution settings stay out of it so that recorded ids hold. Two
# results of one run id stand for each other only when their numerics match, and ``numerics_classes`` (the
# table notes) groups results by the same comparison, so a note never calls two results alike that the
# borrowing rule keeps apart, nor leaves out a field that differs. docs/results-schema.md says why each is here.

#: Environment variables that choose the kernels MKL, oneDNN, OpenMP or cuBLAS run, or how they round
#: (docs/results-schema.md, "numerics", with the libraries' documentation). Recorded when set; unset is the
#: library default. Thread counts are not here: the effective count is recorded as ``threads``.
KERNEL_ENV = ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
              "ONEDNN_CPU_ISA_HINTS", "DNNL_CPU_ISA_HINTS", "ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE",
              "KMP_DETERMINISTIC_REDUCTION", "NVIDIA_TF32_OVERRIDE", "CUBLAS_WORKSPACE_CONFIG")

NUMERICS_FIELDS, _COMMON = schema.NUMERICS_FIELDS, schema.NUMERICS_COMMON  # compared by device (schema: recorded)
NOT_RECORDED = "not recorded"  # in memory only: a numerics field the record lists ``unrecorded`` (never a match)


def numerics_of(result: dict) -> dict:
    """A checked done result's ``numerics`` (provenance.numerics), each field it lists ``unrecorded`` as
    ``NOT_RECORDED``."""
    unrecorded = schema.unrecorded_numerics(result)
    return {k: NOT_RECORDED if k in unrecorded else v for k, v in result["numerics"].items()}


def _compared(n: dict) -> tuple[str, ...]:
    return NUMERICS_FIELDS.get(n.get("device"), _COMMON)


def numerics_difference(a: dict, b: dict) -> tuple[list[str], list[str]]:
    """(fields known on both sides that differ, fields that matter but one side does not know). They match
    only when both lists are empty; ``NOT_RECORDED`` on either side is unknown (every result records every
    field, schema 3: null is a value, such as ``threads_per_epoch`` of a run trained under one thread count)."""
    fields = sorted(set(_compared(a)) | set(_compared(b)))
    differ, unknown = [], []
    for name in fields:
        va, vb = a.get(name), b.get(name)
        if NOT_RECORDED in (va, vb):
            unknown.append(name)
        elif va != vb:
            differ.append(name)
    return differ, unknown


def numerics_key(n: dict) -> str:
    """The compared fields of one result's numerics as text: equal keys without ``NOT_RECORDED`` are exactly
    the pairs ``numerics_difference`` matches."""
    return json.dumps({f: n.get(f) for f in _compared(n)}, sort_keys=True, default=str)


def numerics_classes(items: list[dict]) -> tuple[list[tuple[str, list[int]]], list[str], list[str]]:
    """Results grouped by their numerics: ([(text, indices of ``items``)], fields that differ between two
    groups, fields one group cannot tell). Each text names every field in those two lists, so a note built
    from it names whatever keeps two groups apart."""
    groups: dict[str, list[int]] = {}
    for i, n in enumerate(items):
        groups.setdefault(numerics_key(n), []).append(i)
    firsts = [items[members[0]] for members in groups.values()]
    differ, unknown = set(), set()
    for i, a in enumerate(firsts):
        for b in firsts[i + 1:]:
            d, u = numerics_difference(a, b)
            differ |= set(d)
            unknown |= set(u)
    named = sorted(differ | unknown)
    return ([(numerics_text(items[m[0]], named), m) for m in groups.values()],
            sorted(differ), sorted(unknown - differ))


def numerics_value(name: str, value) -> str:
    """One field as a note shows it: 'torch 2.14.1', 'channels_last on', 'kernel environment MKL_CBWR=COMPATIBLE',
    'cpu_id not recorded'."""
    if value == NOT_RECORDED:
        return f"{name} not recorded"
    if value is None:
        return f"{name} none"
    if name == "kernel_env" and isinstance(value, dict):  # values from the environment, names from the disk:
        return "kernel environment " + (" ".join(f"{shorten(k, 40)}={shorten(v, 60)}"  # bounded (errors.shorten)
                                                 for k, v in sorted(value.items())) or "unset")
    if isinstance(value, bool):
        return f"{name} {'on' if value else 'off'}"
    if isinstance(value, dict):
        return f"{name} " + ", ".join(f"{shorten(k, 40)} {shorten(v, 60)}" for k, v in sorted(value.items()))
    return f"{name} {shorten(value, 100)}"


def numerics_contrast(a: dict, b: dict) -> str:
    """'threads 1 against 2, kernel environment MKL_CBWR=COMPATIBLE against unset': each field that differs
    (``numerics_difference``), ``a``'s value first; '' when none does."""
    def value(name, v):
        return numerics_value(name, v).removeprefix("kernel environment " if name == "kernel_env" else f"{name} ")
    return ", ".join(f"{numerics_value(f, a.get(f))} against {value(f, b.get(f))}" for f in numerics_difference(a, b)[0])


_IN_HEADLINE = frozenset({"device", "device_model", "cpu_model", "cpu_capability", "threads"})


def numerics_text(n: dict, also: list[str] = ()) -> str:
    """'CPU Intel(R) Xeon(R) Processor (AVX512), 1 thread' / 'CPU model not recorded, 2 threads (CPU capability
    not recorded)': the fields a reader compares first, then each field of ``also`` (those that differ
    elsewhere in the same note) as ``numerics_value`` writes it."""
    shown = {k: shorten(v, 100) if isinstance(v, str) else v for k, v in n.items() if v != NOT_RECORDED}
    device = shown.get("device") or "device not recorded"
    if device == "cuda":
        where = f"GPU {shown.get('device_model') or 'model not recorded'}"
    else:
        model, cap = shown.get("cpu_model"), shown.get("cpu_capability")
        where = (f"CPU {model}" if model else "CPU model not recorded") + (f" ({cap})" if cap else " (CPU capability not recorded)")
    threads = shown.get("threads")
    parts = [where, f"{threads} thread{'s' if threads != 1 else ''}" if threads is not None else "threads not recorded"]
    if shown.get("threads_per_epoch"):
        parts.append("thread count changed during the run")
    if shown.get("precision") not in (None, "fp32") and "precision" not in also:
        parts.append(str(shown["precision"]))
    if shown.get("compile") not in (None, "off") and "compile" not in also:
        parts.append(f"compile {shown['compile']}")
    parts += [numerics_value(f, n.get(f)) for f in also if f not in _IN_HEADLINE]
    return ", ".join(parts)
