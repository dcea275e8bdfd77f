"""The rules every cache of ltbench follows: a cache can only make a command faster, never change what it shows.

Three caches live beside a results folder (or under $LTBENCH_CACHE_DIR): the index of result summaries
(ltbench/report/index.py), the expansion a table reads (ltbench/report/expected.py) and the one ``status``
reads (ltbench/recipe/expansion.py). Each is a file anyone can edit and any disk can damage, and each
holds what a command then shows as data (a row's method, a seed, an accuracy). So:

* **Read back checked.** Before any entry is used it is checked against what it claims, with the rules
  the data it stands for must pass: a run id is 12 hex digits and the hash of its configuration
  (``identity.run_id``; a stage-2 id is that plus the stage-2 id), a row key is the hash of its row's
  configuration (``identity.row_key``), a configuration validates as a recipe's does (:func:`config_problem`),
  values pass result.json's checks (ltbench/results/schema.py). A cache with an entry that fails is
  discarded and rebuilt from the files it summarises.
* **Sealed: a pure function of what it caches.** Every cache file is written as ``ltbench-cache sha256:<hex>``
  and its bytes, the hex being the sha256 of the code version (:func:`code_version`: size and mtime of every
  Python file of ltbench and of its checkout's other packages) and the bytes; each cache's own key adds what it depends on
  (a recipe's bytes and path, the overrides, the plugin code: ``recipe/expansion.py``). A file whose digest does
  not match (an entry dropped, added, swapped or edited in place, however self-consistent) or that was written
  by other code is rebuilt, never read. What a seal cannot catch: someone with write access who recomputes it,
  as they could equally write a result.json by hand; the entry checks above still bound what such a file can
  make a command do (no run folder outside the results folder, no value result.json could not hold).
  docs/trust.md says the same for users.
* **Written best effort.** A cache write that fails for any reason (a full disk, which ltbench reports as
  ``DiskFullError``; a file too large; a read-only or foreign folder) is skipped: the command's output is
  the same, and one note on stderr (at most one per process) says why the next call will be slower.

No torch: status and tables use these on a login node.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable

from ltbench.config import EvalConfig, OptimConfig, TrainConfig
from ltbench.errors import LtbenchError, shorten
from ltbench.results import identity, safe_read, schema, store

RUN_ID = re.compile(r"[0-9a-f]{12}")
STAGE2_RUN_ID = re.compile(r"[0-9a-f]{12}\+[0-9a-f]{12}")
CORE_SECTIONS = {"optim": OptimConfig, "train": TrainConfig, "eval": EvalConfig}
PLUGIN_SECTIONS = ("data", "backbone", "method")
OPTIONAL_SECTIONS = ("sampler", "posthoc")  # {name, **options} when present
TOP_KEYS = {*CORE_SECTIONS, *PLUGIN_SECTIONS, *OPTIONAL_SECTIONS, "seed", identity.DATA_IDENTITY}
MAX_SEED = 2**32 - 1  # a recipe's bound (recipe.RecipeConfig.validate)


# ------------------------------------------------------------------------------------------------
# Writing: best effort, one note

_noted: list[str] = []


SEAL = b"ltbench-cache sha256:"


def code_version() -> str:
    """What the running ltbench is, for a cache's seal: size and mtime of every Python file of ltbench and of
    its checkout's other packages (``code_signature``), taken once per process."""
    if not _code_version:
        _code_version.append(code_signature([]))
    return _code_version[0]


_code_version: list[str] = []


def sealed(data: bytes) -> bytes:
    """``data`` as a cache file holds it: the seal line (sha256 of the code version and the bytes), then the bytes."""
    digest = hashlib.sha256(code_version().encode() + b"\n" + data).hexdigest().encode()
    return SEAL + digest + b"\n" + data


def unsealed(blob: bytes) -> bytes | None:
    """The bytes a cache file seals, or None when its seal is missing or is not theirs under this code."""
    if not blob.startswith(SEAL):
        return None
    digest, newline, data = blob[len(SEAL):].partition(b"\n")
    return data if newline and sealed(data) == blob else None


def read_cache_bytes(path: Path, limit: int = safe_read.MAX_JSON_BYTES) -> bytes | None:
    """A cache file's bytes when it is a regular file within ``limit`` and its seal is intact; None otherwise
    (missing, damaged, edited, or written by other code: the caller rebuilds it)."""
    try:
        return unsealed(safe_read.read_bytes(path, limit))
    except safe_read.UnusableFile:
        return None


def read_cache(path: Path, limit: int = safe_read.MAX_JSON_BYTES) -> Any:
    """A JSON cache file's content (``read_cache_bytes``, then ``safe_read.parse_json``); None when unusable."""
    data = read_cache_bytes(path, limit)
    try:
        return None if data is None else safe_read.parse_json(data, path)
    except safe_read.UnusableFile:
        return None


def write_cache(path: Path, data: bytes, say: Callable[[str], None] | None = None) -> bool:
    """Write a cache file atomically; False (and one note per process) when the write fails for any reason.
    Why any reason: a cache is never needed, so no failure to keep one may cost the command its output
    (a full disk raises DiskFullError, which is not an OSError; a read-only folder, EFBIG, EACCES are)."""
    try:
        store.atomic_write_bytes(Path(path), sealed(data))
        return True
    except (OSError, LtbenchError) as exc:
        if not _noted:
            _noted.append(str(path))
            (say or _stderr)(f"ltbench: note: cache not written, the next call will be slower: "
                             f"{shorten(str(exc), 300)}")
        return False


def remembered_for_file(name: str, path: Path, compute: Callable[[Path], Any], valid: Callable[[Any], bool]) -> Any:
    """``compute(path)``, kept in the cache file ``name`` of ``store.cache_home()`` keyed by the file's real path,
    size, mtime, inode and device, so what is derived from a large file (a weights file's sha256, the label
    counts of a dataset's batches) is computed once per version of the file, not at every launch. A cached value
    is used only when ``valid(value)`` (a plain JSON value the caller checks); the 1,000 newest files are kept."""
    st = os.stat(path)
    real, stat = os.path.realpath(path), [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]
    cache_path = store.cache_home() / name
    found = read_cache(cache_path)
    cache = found if isinstance(found, dict) else {}
    entry = cache.get(real)
    if isinstance(entry, dict) and entry.get("stat") == stat and valid(entry.get("value")):
        return entry["value"]
    value = compute(path)
    cache.pop(real, None)
    cache[real] = {"stat": stat, "value": value}
    try:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # unwritable: write_cache says so once, the value is still returned
    write_cache(cache_path, json.dumps(dict(list(cache.items())[-1000:])).encode())
    return value


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def code_signature(plugin_dirs: list[str]) -> str:
    """Size and mtime of every Python file the expansion can run: ltbench, the other packages of its checkout
    (the built-in methods, the plugin packages it ships; an installed copy changes only by an install, which
    ``site_signature`` sees) and the given plugin folders. Only what discovery can import is walked
    (``plugin_code_files``): a plugin folder that is no package name (``/``, say) is refused by discovery and
    never walked here."""
    core = Path(__file__).resolve().parents[1]  # ltbench/ (this file is ltbench/results/caches.py)
    checkout = (core.parent / "pyproject.toml").is_file()
    roots = [core, *sorted(d for d in core.parent.iterdir()
                           if checkout and d != core and (d / "__init__.py").is_file())]
    roots += [Path(p) for p in plugin_dirs]
    h = hashlib.sha1(site_signature().encode())
    for root in roots:
        for path in plugin_code_files(root):
            try:
                st = os.stat(path)
            except OSError:  # gone meanwhile, or unreadable: part of the signature as such
                h.update(f"{path}:gone;".encode())
                continue
            h.update(f"{path}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()


def site_signature() -> str:
    """The mtime of each site-packages folder on sys.path: installing, upgrading or removing a package (a
    plugin registered by an entry point among them) renames a ``*.dist-info`` folder there, which changes it.
    Why not read the entry points: that costs 0.2 s, a fifth of what a cached command may take."""
    out = []
    for folder in sys.path:
        if folder.endswith(("site-packages", "dist-packages")):
            try:
                out.append(f"{folder}:{os.stat(folder).st_mtime_ns}")
            except OSError:
                out.append(f"{folder}:gone")
    return ";".join(out)


def plugin_code_files(root: Path) -> list[str]:
    """The Python files discovery and their imports can reach in a package folder, sorted: its ``*.py`` files
    and, recursively, those of its sub-packages (folders named like a module, holding ``__init__.py``);
    never a symlinked folder, never an editor's file (``.#x.py``, ``#x.py#``: not module names). Empty for a
    folder that is not a package name (discovery refuses it): ``$LTBENCH_PLUGIN_PATH=/`` walks nothing, and
    a folder of data beside the plugins is never walked."""
    root = Path(root)
    if not root.name.isidentifier() or not root.is_dir():
        return []
    out, stack = [], [str(root)]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            stem = e.name[:-3] if e.name.endswith(".py") else None
            if stem is not None and stem.isidentifier() and not e.is_dir(follow_symlinks=False):
                out.append(e.path)
            elif e.name.isidentifier() and e.is_dir(follow_symlinks=False) and os.path.isfile(os.path.join(e.path, "__init__.py")):
                stack.append(e.path)
    return sorted(out)


# ------------------------------------------------------------------------------------------------
# Reading: each entry checked against what it claims


def config_problem(config: Any, where: str = "config", seed: bool = True) -> str:
    """'' when ``config`` is a run configuration as a recipe's expansion makes it: plugin sections with a
    name, the core sections (optim, train, eval) valid under the recipe's own rules (ranges, finite
    numbers, known keys), a seed in the recipe's range (``seed``: required), nothing else at the top.
    The plugins' own options are checked by the run id instead (they are hashed into it)."""
    if not isinstance(config, dict):
        return f"{where} is not an object"
    unknown = sorted(str(k) for k in config if k not in TOP_KEYS)
    if unknown:
        return f"{where}.{unknown[0][:60]} is not a configuration section"
    for section in PLUGIN_SECTIONS + OPTIONAL_SECTIONS:
        value = config.get(section)
        if (value is not None or section in PLUGIN_SECTIONS) and not (
                isinstance(value, dict) and isinstance(value.get("name"), str)):
            return f"{where}.{section} is not an object with a name"
    for section, cls in CORE_SECTIONS.items():
        problem = schema.section_problem(cls, config.get(section), f"{where}.{section}")
        if problem:
            return problem
    if config.get(identity.DATA_IDENTITY) is not None and not isinstance(config[identity.DATA_IDENTITY], str):
        return f"{where}.{identity.DATA_IDENTITY} is not a string"
    if seed or "seed" in config:
        value = config.get("seed")
        if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEED):
            return f"{where}.seed is {str(value)[:40]!r}, expected a whole number in [0, {MAX_SEED}]"
    return ""


def run_id_problem(run_id: Any, config: dict, expected: str | None = None) -> str:
    """'' when ``run_id`` is 12 hex digits (or the stage-2 form) and the hash of ``config`` (``expected``:
    that hash, when the caller computed it already, see :class:`SeededIds`)."""
    if not isinstance(run_id, str) or not (RUN_ID.fullmatch(run_id) or STAGE2_RUN_ID.fullmatch(run_id)):
        return f"run id {str(run_id)[:40]!r} is not 12 hex digits"
    try:
        want = expected if expected is not None else identity.config_id(config)
    except (ValueError, TypeError):
        return f"run {run_id}: its configuration cannot be hashed"
    return "" if run_id == want else f"run id {run_id} is not the hash of its configuration ({want})"


class SeededIds:
    """The run ids of one row's configuration (a run's identity less its seed) for many seeds: the same
    ids as ``identity.config_id`` on ``{**row, 'seed': seed}`` (tests/test_faults_reliability.py checks it),
    from one serialisation of the row, so checking the ids of 10,000 cached runs costs milliseconds."""

    MARKER = "ltbench-seed-marker-6b1f"

    def __init__(self, row: dict):
        config = dict(row)
        self.stage2 = config.pop("posthoc", None)
        config["seed"] = self.MARKER
        text = identity.canonical_json(identity.identity_of(config))
        self.head, _, self.tail = text.partition(f'"seed":"{self.MARKER}"')
        self.suffix = "" if self.stage2 is None else "+" + identity.posthoc_id(self.stage2)

    def __call__(self, seed: int) -> str:
        text = f'{self.head}"seed":{int(seed)}{self.tail}'
        return identity.id_of_identity_text(text) + self.suffix


def row_problem(key: Any, row: Any, where: str) -> str:
    """'' when ``row`` (a run's identity less its seed) validates as a configuration and ``key`` is its hash
    (``identity.row_key``): a cache's row can then only be the row its key names."""
    problem = config_problem(row, where, seed=False)
    if problem:
        return problem
    try:
        actual = identity.row_key(row)[0]
    except (ValueError, TypeError):
        return f"{where} cannot be hashed"
    return "" if actual == key else f"{where}: its key {str(key)[:20]!r} is not the hash of its configuration"


def rows_problem(rows: Any, where: str) -> str:
    """Every row of a cache's ``key -> row configuration`` map (:func:`row_problem`)."""
    if not (isinstance(rows, dict) and all(isinstance(k, str) for k in rows)):
        return f"{where} is not an object of row key -> configuration"
    for key, row in rows.items():
        problem = row_problem(key, row, f"{where}.{key[:20]}")
        if problem:
            return problem
    return ""
