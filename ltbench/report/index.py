"""Finding the runs below a results folder and summarising each one, with a cache.

Why a cache: a table over 10,000 runs must print in well under two seconds, and parsing 10,000
result.json files (or a few hundred iNaturalist ones, 1.5 MB each because of the per-class lists)
costs seconds. result.json stays the record of truth; ``<root>/.ltbench-index.json`` only keeps,
per run folder, the small summary a table needs (status, config, scalar metrics, provenance) and
the size and mtime of the result.json it was read from (one file: a JSON part, then the scalar
metrics as a float64 matrix, because parsing a million floats from JSON text costs seconds). A summary whose file changed size or mtime
is read again, so the cache is never trusted for a file that changed. Deleting the cache is always
safe. When the results folder is not writable the cache is simply not written.

Every run folder yields a record, damaged ones included: a record with status ``damaged`` and a
``note`` that says what is wrong (empty folder, result.json truncated or not UTF-8, no config, ...),
so a table can say it out loud instead of crashing or silently dropping the run.
"""

from __future__ import annotations

import json
import hashlib
import math
import os
import stat
from array import array
from collections.abc import Mapping
from pathlib import Path


from ltbench.results import caches, identity, schema, status_rule, store
from ltbench.results.store import cache_file

INDEX_FILE = ".ltbench-index"
# The cache file's sealed bytes (ltbench/results/caches.py): 8 bytes JSON length, the JSON, a float64 matrix runs x metrics.
SKIP_DIRS = {*store.OWNED_DIRS, "__pycache__"}
PROVENANCE_KEYS = ("git_commit", "git_dirty", "ltbench_version", "torch", "python", "hostname", "gpu_name", "cuda")


config_key = identity.row_key  # a row is a run's identity less the seed (ltbench/results/identity.py)


def flat_metrics(metrics: dict) -> dict[str, float]:
    """Scalar metrics as flat names: 'all', 'many', 'head:<h>:all', 'prior:<p>:all', 'set:<s>:all' ...
    The result was checked by store.check_result, so every value is a fraction or null (left out)."""
    out: dict[str, float] = {}

    def take(prefix: str, values: dict):
        for g in schema.HEADLINE_METRICS:
            if values.get(g) is not None:
                out[prefix + g] = float(values[g])

    take("", metrics)
    take("val:", metrics.get("val") or {})  # the validation split (selection reads 'val:all')
    for section, tag in (("heads", "head"), ("target_priors", "prior"), ("test_sets", "set")):
        for name, values in (metrics.get(section) or {}).items():
            take(f"{tag}:{name}:", values)
    return out


def summarize_result(data: dict) -> dict:
    """The small record a table needs from one usable result (status 'done' or 'failed'). It was checked by
    store.check_result: every field read here is one schema 3 requires of it (tests/test_schema_fields.py)."""
    config = data["config"]
    key, row_identity = config_key(config)
    rec = {
        "status": data["status"],
        "run_id": data["run_id"],
        "recipe": data["recipe"],
        "seed": config.get("seed", data["seed"]),
        "key": key,
        "config": row_identity,
        "grid": data["grid"] or {},
        "method_display": data["method_display"],  # a row's label (report/rows.py); null: never recorded
    }
    prov = data["provenance"] or {}  # null: unrecorded (nothing to show)
    rec["prov"] = {k: prov.get(k) for k in PROVENANCE_KEYS if prov.get(k) is not None}
    run = data["status"] == "done" and data["kind"] is None  # a stage-2 result has no device of its own
    for k in ("wall_seconds", "started", "ended") + (("device", "world_size") if run else ()):
        if data[k] is not None:  # null: listed unrecorded
            rec["prov"][k] = data[k]
    if data["status"] == "done":
        rec["metrics"] = flat_metrics(data["metrics"])
        rec["code"] = {"code": data["code"] or {}, "plugins": data["plugins"] or [],  # null: unrecorded, none known
                       "code_scope": data["code_scope"],
                       "code_source": data["code_source"]}
        rec["numerics"] = identity.numerics_of(data)
        rec["prov"]["device_seconds"] = data["device_seconds"]  # the run's cost, all sessions; null: unrecorded
    else:
        err = data["error"].strip().splitlines()
        rec["error"] = err[-1][:200] if err else ""
    return rec


def _str(v) -> str | None:
    return v if isinstance(v, str) else None


def read_result_file(path: Path) -> dict:
    """One result.json as a summary record; never raises on a damaged file. Whether a result is usable
    is decided by store.check_result, the rule `ltbench run` and `status` apply too, so a table never
    counts a run that a relaunch would redo. A damaged one keeps its row when spec.json names it."""
    run_dir = path.parent
    check = store.check_result(run_dir)
    if check.usable:
        return summarize_result(check.result)
    if check.state == store.OLDER:
        return {"run_id": run_dir.name, "status": store.OLDER, "note": check.reason}
    return {"run_id": run_dir.name, **_identity_from_spec(run_dir), "status": "damaged",
            "note": f"{check.reason or 'result.json is missing'}; 'ltbench run' runs it again"}


def _identity_from_spec(run_dir: Path) -> dict:
    """The row a run belongs to, read from its spec.json ({} when that is missing or damaged)."""
    try:
        spec = store.load_json(run_dir / store.SPEC)
        key, identity = config_key(spec["config"])
        seed = spec["config"].get("seed")
        if not (seed is None or _is_int(seed)):
            return {}
    except (store.UnusableFile, KeyError, TypeError, AttributeError, ValueError):
        return {}
    grid = spec.get("grid") if isinstance(spec.get("grid"), dict) else {}
    run_id = spec.get("run_id") if isinstance(spec.get("run_id"), str) else run_dir.name
    return dict(key=key, config=identity, seed=seed, recipe=_str(spec.get("recipe")), grid=grid, run_id=run_id)


def _unfinished_record(run_dir: Path, names: set[str]) -> dict:
    """A run folder without result.json: running, interrupted, pending, or damaged (empty / no spec.json)."""
    if not names:
        return {"status": "damaged", "note": "empty run folder (no spec.json, no result.json)"}
    if store.RESULT in names:  # there, but no regular file (a FIFO, a device, a symlink loop): damaged, named
        return read_result_file(run_dir / store.RESULT)
    status = status_rule.unfinished_state(run_dir)[0] if store.STARTED in names else "pending"  # status's own rule
    rec = {"status": status, "run_id": run_dir.name}
    if store.SPEC not in names:
        rec["note"] = "no spec.json (the launch never completed, or it was deleted)"
        if status == "pending":
            rec["status"] = "damaged"
        return rec
    identity = _identity_from_spec(run_dir)
    rec.update(identity)
    if not identity:
        rec["note"] = "spec.json is damaged"
    return rec


def find_run_dirs(root: Path) -> list[tuple[str, set[str], os.stat_result | None]]:
    """Run folders below ``root``: a folder holding result.json or another run file, or a leaf folder
    (an empty run folder is a run that lost its files). ``report`` and hidden folders are skipped.
    Returns (folder, file names, stat of result.json or None). A folder whose result.json exists is
    recognised by one stat() call, without listing it: that is what keeps 10,000 runs fast."""
    root_s = os.fspath(root)
    out = []
    stack = [root_s]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        files = {e.name for e in entries if not _is_dir(e)}
        # Symlinked folders are never followed: one pointing out of the root would pull in foreign runs,
        # one pointing back in ('ln -s . latest') would loop; every run inside is reached by its real path.
        subdirs = [e.path for e in entries if _is_dir(e) and not e.is_symlink() and not e.name.startswith(".")
                   and e.name not in SKIP_DIRS]
        if not files.isdisjoint(store.RUN_FILES) or (not subdirs and folder != root_s):
            out.append((folder, files, _stat(os.path.join(folder, store.RESULT)) if store.RESULT in files else None))
            out += stage2_dirs(folder)
            continue
        for sub in subdirs:
            st = _stat(os.path.join(sub, store.RESULT))
            if st is not None:
                out.append((sub, {store.RESULT}, st))
                out += stage2_dirs(sub)
            else:
                stack.append(sub)
    out.sort(key=lambda item: item[0])
    return out


def stage2_dirs(run_dir: str) -> list[tuple[str, set[str], os.stat_result]]:
    """The stage-2 results of a run (RUN_DIR/posthoc/<id>/result.json, ltbench/stage2/posthoc_runs.py): rows of
    their own. A run without a posthoc folder costs one failed scandir."""
    try:
        entries = list(os.scandir(os.path.join(run_dir, store.POSTHOC_DIR)))
    except OSError:
        return []
    out = []
    for e in entries:
        st = _stat(os.path.join(e.path, store.RESULT)) if _is_dir(e) and not e.is_symlink() else None
        if st is not None:
            out.append((e.path, {store.RESULT}, st))
    return out


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # ELOOP: a symlink loop is no folder
        return False


def _stat(path: str) -> os.stat_result | None:
    try:
        st = os.stat(path)
        return st if stat.S_ISREG(st.st_mode) else None
    except OSError:
        return None


class Metrics(Mapping):
    """A run's flat metrics, read from the cache's float matrix without building a dict per run."""

    __slots__ = ("_columns", "_values")

    def __init__(self, columns: dict[str, int], values: memoryview):
        self._columns, self._values = columns, values

    def get(self, key, default=None):
        i = self._columns.get(key)
        if i is None:
            return default
        v = self._values[i]
        return default if v != v else v  # NaN: not recorded

    def __getitem__(self, key):
        v = self.get(key)
        if v is None:
            raise KeyError(key)
        return v

    def __iter__(self):
        return (k for k, i in self._columns.items() if self._values[i] == self._values[i])

    def names(self, prefix: str) -> list[str]:
        """Recorded metric names starting with ``prefix``, without looking at the other columns."""
        return [k for k in _prefixed(self._columns, prefix) if self._values[self._columns[k]] == self._values[self._columns[k]]]

    def __len__(self) -> int:
        return sum(1 for _ in self)


_PREFIXED: dict[tuple[int, str], list[str]] = {}


def _prefixed(columns: dict[str, int], prefix: str) -> list[str]:
    key = (id(columns), prefix)
    if key not in _PREFIXED:
        _PREFIXED[key] = [k for k in columns if k.startswith(prefix)]
    return _PREFIXED[key]


MAX_CACHE_BYTES = 1024 * store.MiB


def _cache_inputs(root: str) -> list[str]:
    """What the index is a function of besides the code and the files it summarises: its results folder."""
    return ["index", os.path.realpath(root)]


def _load_cache(path: Path, root: str) -> tuple[dict, dict[str, int], memoryview | None]:
    """(json part, metric column index, float64 matrix) of the cache file, or empty ones when it is missing
    or its seal does not verify (ltbench/results/caches.py: the cache is then rebuilt and rewritten)."""
    empty = {"runs": {}, "configs": {}, "codes": {}, "metrics": [], "unusable": False}
    blob = caches.read_sealed(path, _cache_inputs(root), MAX_CACHE_BYTES)
    if blob is None:
        return {**empty, "unusable": os.path.lexists(path)}, {}, None
    n = int.from_bytes(blob[:8], "little")
    meta = json.loads(blob[8:8 + n])
    return meta, {name: i for i, name in enumerate(meta["metrics"])}, memoryview(blob[8 + n:]).cast("d")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _save_cache(path: Path, root: str, runs: dict[str, list], metrics: dict[str, Mapping], configs: dict,
                codes: dict | None = None) -> None:
    names = sorted({k for m in metrics.values() for k in m})
    col = {n: i for i, n in enumerate(names)}
    values = array("d", [math.nan]) * (len(names) * len(runs))
    meta_runs = {}
    for row, (rel, entry) in enumerate(runs.items()):
        for k in metrics.get(rel, {}):
            values[row * len(names) + col[k]] = metrics[rel][k]
        meta_runs[rel] = entry + [row]
    try:
        meta = json.dumps({"metrics": names, "runs": meta_runs, "configs": configs,
                           "codes": codes or {}}, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError):
        return
    # best effort (a read-only or full results folder): tables still work, only without the cache
    caches.write_sealed(path, _cache_inputs(root), len(meta).to_bytes(8, "little") + meta + values.tobytes())


def scan(root: Path, use_cache: bool = True) -> list[dict]:
    """One summary record per run folder below ``root`` (sorted by path), each with ``dir`` and ``name``."""
    root_s = os.fspath(root)
    cache_path = cache_file(Path(root_s), INDEX_FILE)
    meta, columns, values = _load_cache(cache_path, root_s) if use_cache else ({"runs": {}, "configs": {}}, {}, None)
    rebuild = not use_cache or meta.get("unusable", False)  # --no-cache and a damaged cache: rewritten
    cached, configs, codes = meta["runs"], meta["configs"], meta.get("codes") or {}
    width = len(columns)
    fresh: dict[str, list] = {}
    fresh_metrics: dict[str, Mapping] = {}
    changed = False
    records = []
    prefix = len(root_s.rstrip("/")) + 1
    for run_dir, names, st in find_run_dirs(root_s):
        rel = run_dir[prefix:] if len(run_dir) >= prefix else "."
        if st is not None:
            sig = [st.st_size, st.st_mtime_ns]
            hit = cached.get(rel)
            if hit is not None and hit[0] == sig and values is not None:
                rec = dict(hit[1])
                if "metrics" in rec:
                    rec["metrics"] = Metrics(columns, values[hit[2] * width:(hit[2] + 1) * width])
                if hit[1].get("metrics", True) is True and "config" not in hit[1]:
                    fresh[rel] = [sig, hit[1]]  # kept as read: what is built below for a result read again
            else:
                rec = read_result_file(Path(run_dir) / store.RESULT)
                if "code" in rec:  # a few distinct code sets across thousands of runs: stored once each
                    rec["code_key"] = _code_key(rec["code"])
                    codes[rec["code_key"]] = rec.pop("code")
                changed = True
                if "config" in rec:
                    configs[rec["key"]] = rec["config"]
            if "key" in rec:
                rec["config"] = configs.get(rec["key"]) or rec.get("config")
            if rel not in fresh:
                fresh[rel] = [sig, {k: (True if k == "metrics" else v) for k, v in rec.items() if k != "config"}]
            if "metrics" in rec:
                fresh_metrics[rel] = rec["metrics"]
        else:
            rec = _unfinished_record(Path(run_dir), names)
        rec["dir"] = run_dir
        rec["name"] = rel if rel != "." else os.path.basename(run_dir)  # relative to the root, for notes
        records.append(rec)
    if rebuild or changed or len(fresh) != len(cached):
        used = {entry[1].get("key") for entry in fresh.values()}
        used_codes = {entry[1].get("code_key") for entry in fresh.values()}
        _save_cache(cache_path, root_s, fresh, fresh_metrics, {k: v for k, v in configs.items() if k in used},
                    {k: v for k, v in codes.items() if k in used_codes})
    mark_stale(records, codes)
    return records


def _code_key(code: dict) -> str:
    return hashlib.sha1(json.dumps(code, sort_keys=True, default=str).encode()).hexdigest()[:16]


def mark_stale(records: list[dict], codes: dict) -> None:
    """Every finished record gets the stale rule's verdict (``identity.code_state``, the rule status and run
    use), checked once per distinct code set from the files on disk now: ``stale`` (the modules changed since)
    or ``code_unknown`` (why its code cannot be checked: no code record, an older partial one...)."""
    verdict: dict = {}
    for rec in records:
        if rec.get("status") != "done":
            continue
        key = rec.get("code_key")
        if key not in verdict:
            entry = codes.get(key) if isinstance(key, str) else None
            verdict[key] = identity.code_state(entry if isinstance(entry, dict) else {})
        _apply_code_state(rec, verdict[key])


def _apply_code_state(rec: dict, state: identity.CodeState) -> None:
    if state.status == "stale":
        rec["stale"] = list(state.changed)
    elif state.status == identity.CODE_UNKNOWN:
        rec["code_unknown"] = state.reason


def same_runs_elsewhere(root: Path, expected: list[dict], records: list[dict]) -> list[dict]:
    """Results of this recipe's run ids that sit in a sibling recipe's folder (``results/<other>/<run id>``).

    One run id names one computation, but its numbers also depend on the numerics it ran under (threads, CPU
    type: ``identity.numerics_difference``), so two results of one run id stand for each other only when
    those match. Hence, never by folder order:
    * the recipe's own folder wins; a sibling's result of the same run id that differs (other numerics, or
      other numbers) is named on the own result (``elsewhere``), never used;
    * a run the own folder lacks is read from a sibling (``borrowed``) when the siblings' results of it
      agree, or when exactly one of them was made under numerics that match this recipe's own results';
      otherwise none is used, and a ``conflict`` record names them all.
    Returns the records to add (borrowed ones and conflicts); own records get their ``elsewhere`` notes."""
    root = Path(root)
    have = {r.get("run_id") for r in records} | {Path(r["dir"]).name for r in records}
    own = {r.get("run_id"): r for r in records if r.get("status") == "done"}
    found = _sibling_results(root, {e["run_id"] for e in expected if "+" not in e["run_id"]})
    references = [_numerics(r) for r in own.values() if isinstance(r.get("numerics"), dict)]
    out, done = [], set()
    for e in expected:
        run_id = e["run_id"]
        if run_id not in found or run_id in done:
            continue
        done.add(run_id)
        if run_id in own:
            own[run_id].setdefault("elsewhere", []).extend(
                _difference_note(own[run_id], folder, rec, "here") for folder, rec in found[run_id]
                if _differs(own[run_id], rec))
        elif run_id not in have:
            out.append(_borrow(root, e, found[run_id], references))
    return out


def _sibling_results(root: Path, wanted: set[str]) -> dict[str, list[tuple[str, dict]]]:
    """run id -> [(sibling folder name, its done record)], siblings in name order, each listed once (so a
    table of 10,000 runs costs one listing per sibling, and a read only where a run id is shared)."""
    if not wanted or not root.parent.is_dir():
        return {}
    siblings = sorted(p for p in root.parent.iterdir()  # a symlinked sibling may lead anywhere: not followed
                      if not p.is_symlink() and p.is_dir() and p != root and not p.name.startswith("."))
    out: dict[str, list[tuple[str, dict]]] = {}
    for sib in siblings:
        try:
            names = set(os.listdir(sib)) & wanted
        except OSError:
            continue
        for run_id in sorted(names):
            path = sib / run_id / store.RESULT
            if not path.is_file():
                continue
            rec = read_result_file(path)
            if rec.get("status") == "done":
                _apply_code_state(rec, identity.code_state(rec.pop("code", None) or {}))
                rec.update(dir=str(path.parent), name=f"../{sib.name}/{run_id}")
                out.setdefault(run_id, []).append((sib.name, rec))
    return out


def _numerics(rec: dict) -> dict:
    """A record's numerics, {} when absent or not an object (a damaged cache entry never crashes a table)."""
    value = rec.get("numerics")
    return value if isinstance(value, dict) else {}


def _differs(a: dict, b: dict) -> bool:
    """Two done records of one run id that cannot stand for each other: numerics known to differ, or other
    numbers (the All accuracy)."""
    differ, _ = identity.numerics_difference(_numerics(a), _numerics(b))
    return bool(differ) or (a.get("metrics") or {}).get("all") != (b.get("metrics") or {}).get("all")


def _difference_note(mine: dict, folder: str, other: dict, where: str) -> str:
    """'fmnist_augment_on/ holds another result of this run id, made under other numerics: threads 1 against
    2 (All 68.86 against 70.06 here, the run's main prediction): not used'."""
    theirs, ours = _numerics(other), _numerics(mine)
    contrast = identity.numerics_contrast(theirs, ours)
    how = f"other numerics: {contrast}" if contrast else "numerics that cannot be compared fully"
    a, b = (other.get("metrics") or {}).get("all"), (mine.get("metrics") or {}).get("all")
    # the run's main prediction: a row reading another head of the run (e.g. 'sum_da_none') shows other numbers
    numbers = (f" (All {100 * a:.2f} against {100 * b:.2f} {where}, the run's main prediction)"
               if a is not None and b is not None else "")
    return f"{folder}/ holds another result of this run id, made under {how}{numbers}: not used"


def _borrow(root: Path, expected: dict, found: list[tuple[str, dict]], references: list[dict]) -> dict:
    """The record a missing run is read from (see same_runs_elsewhere), or a ``conflict`` record naming
    every disagreeing result when none may be chosen."""
    agree = all(not _differs(found[0][1], rec) for _, rec in found[1:])
    matching = [(f, r) for f, r in found
                if any(not identity.numerics_difference(_numerics(r), ref)[0] for ref in references)]
    if not agree and matching and all(not _differs(matching[0][1], r) for _, r in matching[1:]):
        chosen, why = matching[0], "no recorded field of its numerics differs from this recipe's own runs'"
    elif agree:
        chosen, why = found[0], ("the results in " + ", ".join(f"{f}/" for f, _ in found) + " agree") \
            if len(found) > 1 else ""
    else:
        texts = "; ".join(f"{f}/: {identity.numerics_text(_numerics(r))}, All "
                          f"{100 * (r.get('metrics') or {}).get('all', float('nan')):.2f}" for f, r in found)
        return {"status": "conflict", "run_id": expected["run_id"], "key": expected["key"], "seed": expected["seed"],
                "dir": str(root / expected["run_id"]), "name": expected["run_id"],
                "note": f"results of run {expected['run_id']} in other recipes' folders disagree ({texts}) and none "
                        f"was made under this recipe's own runs' numerics: none is used; run it here with "
                        f"'ltbench run RECIPE'"}
    folder, rec = chosen
    rec = dict(rec, borrowed=folder)
    notes = [_difference_note(rec, f, r, f"in {folder}/") for f, r in found if f != folder and _differs(rec, r)]
    mine = _numerics(rec)
    if references and all(identity.numerics_difference(mine, ref)[0] for ref in references):
        why = "; ".join(filter(None, [why, "made under other numerics than this recipe's own runs"]))
    if why:
        rec["borrowed_why"] = why
    if notes:
        rec["elsewhere"] = notes
    return rec
