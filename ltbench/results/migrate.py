"""Older records brought up to date: the one home of ltbench's record history.

Why a migration and not read-time special cases: every rule that once kept old records readable (options
left out of a configuration while at their default, a sampler implied by its absence, ids hashed with some
execution settings pinned, modules under their old names, numerics guessed from other fields) had to be
known by every reader, and a reader that forgot one silently mis-selected rows. Here each change of the
record format is one small, named step, applied once, in order, by ``ltbench migrate RESULTS_DIR``; the
readers know only the current format (``schema.SCHEMA_VERSION``) and name an older record in one line.

What a migration changes and what it never does: it rewrites the *format* (explicit values where a record
relied on an implied one, portable paths, the id under the current identity rule, with the old id kept as
``migrated_from``); it never changes the evidence: metrics, per-class values, code records (an old result
stays 'stale' or 'code unknown' exactly as before), times, provenance values. Folders are renamed to their
new ids atomically, one at a time, after their files are written, so an interrupted migration is resumed
by running it again (idempotent). A folder whose new id is already taken, or whose records cannot be read,
is left as it is and named.

To change the record format: add a step to ``STEPS`` (and bump ``schema.SCHEMA_VERSION``, or
``identity.IDENTITY_VERSION`` when what identifies a run changes), with a test in tests/test_migrate.py.
docs/architecture.md ("How a record changes format") says the same.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ltbench.results import identity, schema, store
from ltbench.results.code import module_path
from ltbench.results.provenance import portable

# ------------------------------------------------------------------------------------------------
# The history, as data. Each table is what a step needs; none of it is read anywhere else.

#: Options added after results were recorded, with the value those results ran with (the runs of that time
#: left them out of their configuration to keep their ids). Core sections by (section, key); plugin options
#: by the plugin's registered name. A method's table applies to a nested method spec too (BAPE's ``aux``).
ADDED_CORE = {("optim", "micro_batch_size"): None, ("train", "augment_on"): "worker",
              ("eval", "select"): "last", ("eval", "tte"): "none", ("eval", "tte_expand"): 24}
ADDED_DATA = {**{name: {"val_per_class": 0} for name in ("cifar10_lt", "cifar100_lt", "fashion_mnist_lt",
                                                          "synthetic_lt")},
              **{name: {"val_per_class": 0, "val_split": None} for name in ("imagenet_lt", "inat2018", "places_lt")}}
ADDED_METHOD = {"bape": {"kappa_solver": "sra"}, "la": {"loss_views": "first"}, "la_posthoc": {"loss_views": "first"},
                "proco": {"unseen": "zero"},
                # expert_width: the runs made before it existed had the backbone's widths (1.0); a recipe that
                # leaves it out now gets the official 0.75
                "sade": {"expert_width": 1.0, "tie_order": "stable", "test_time_redraw": False,
                         "test_time_weight_decay": 5e-4}}

#: Modules that moved into sub-packages (issue 21): old name -> new name.
MOVED_MODULES = {
    **{f"ltbench.{m}": f"ltbench.train.{m}" for m in ("engine", "checkpoint", "distributed", "selection", "loggers")},
    **{f"ltbench.{m}": f"ltbench.stage2.{m}" for m in ("features", "posthoc_runs")},
    **{f"ltbench.{m}": f"ltbench.results.{m}" for m in ("identity", "predictions", "provenance", "record", "runspec",
                                                          "safe_read", "store")},
    **{f"ltbench.{m}": f"ltbench.run.{m}" for m in ("launch", "local_pool", "progress", "run_status_view", "runlines")},
    **{f"ltbench.{m}": f"ltbench.report.{m}" for m in ("literature", "plots", "significance")},
    "ltbench.expansion": "ltbench.recipe.expansion", "ltbench.recipe_tables": "ltbench.recipe.tables",
}

#: The numerics fields compared when schema 2 was made: the ones such a record marks ``not recorded``. Fields
#: recorded since are absent from it, which ``identity.numerics_difference`` reads as unknown too.
_SCHEMA2_COMMON = ("device", "torch", "torchvision", "precision", "compile", "channels_last", "world_size")
SCHEMA2_NUMERICS = {
    "cpu": _SCHEMA2_COMMON + ("cpu_model", "cpu_capability", "threads"),
    "cuda": _SCHEMA2_COMMON + ("device_model", "cuda", "cudnn", "deterministic", "tf32_matmul", "tf32_cudnn",
                               "float32_matmul_precision", "cudnn_benchmark"),
}


# ------------------------------------------------------------------------------------------------
# The steps: each takes a record (result.json, spec.json or started.json, parsed) and changes it in place.


def _set_missing(section: dict, defaults: dict) -> None:
    for key, value in defaults.items():
        section.setdefault(key, value)


def _method_specs(spec):
    """A method spec and every method spec nested in it (a dict with a 'name' that is a registered-looking
    method, such as BAPE's ``aux``)."""
    if isinstance(spec, dict) and isinstance(spec.get("name"), str):
        yield spec
        for value in spec.values():
            yield from _method_specs(value)


def explicit_defaults(rec: dict) -> None:
    """Options added after a run was recorded get, explicitly, the value that run used."""
    config = rec.get("config")
    if not isinstance(config, dict):
        return
    for (section, key), value in ADDED_CORE.items():
        if isinstance(config.get(section), dict):
            config[section].setdefault(key, value)
    data = config.get("data")
    if isinstance(data, dict):
        _set_missing(data, ADDED_DATA.get(data.get("name"), {}))
    for spec in _method_specs(config.get("method")):
        _set_missing(spec, ADDED_METHOD.get(spec["name"], {}))


def explicit_sampler(rec: dict) -> None:
    """A configuration without a sampler ran the default one, uniform (it has no options)."""
    config = rec.get("config")
    if isinstance(config, dict) and not config.get("sampler"):
        config["sampler"] = {"name": "uniform"}


def explicit_augment_scheme(rec: dict) -> None:
    """Batched-augmentation runs recorded before the scheme had a version used scheme 1; worker runs have none."""
    train = (rec.get("config") or {}).get("train") if isinstance(rec.get("config"), dict) else None
    if isinstance(train, dict) and "augment_scheme" not in train:
        train["augment_scheme"] = 1 if train.get("augment_on") == "batch" else None


def moved_modules(rec: dict) -> None:
    """Code entries recorded under a module's old name are filed under its current one (same hashes: a
    changed file still reads 'stale')."""
    code = rec.get("code")
    if not isinstance(code, dict):
        return
    for old in [m for m in code if m in MOVED_MODULES and MOVED_MODULES[m] not in code]:
        entry = code.pop(old)
        if isinstance(entry, dict):
            entry = {**entry, "path": module_path(MOVED_MODULES[old])}
        code[MOVED_MODULES[old]] = entry


def _relative_code(code: dict) -> None:
    for module, entry in code.items():
        if isinstance(entry, dict) and str(entry.get("path")).startswith("/"):
            entry["path"] = identity.relative_code_path(module, entry["path"])


def portable_paths(rec: dict) -> None:
    """No path of the machine that made a record: code paths relative to the package's folder, any other
    absolute path from its project folder ('ltbench/...', 'results/...') or reduced to its name. The
    configuration keeps what the user typed."""
    for key in ("code", "code_as_recorded"):
        if isinstance(rec.get(key), dict):
            _relative_code(rec[key])
    for key, value in list(rec.items()):
        if key != "config":
            rec[key] = portable(value)


def numerics_from_other_fields(rec: dict) -> None:
    """A finished record made before ``numerics`` was recorded gets what its other fields say; the fields they
    cannot say are ``identity.NOT_RECORDED``, so such a result never stands for another, it can only differ."""
    if rec.get("status") != "done" or isinstance(rec.get("numerics"), dict):
        return
    prov = rec.get("provenance") if isinstance(rec.get("provenance"), dict) else {}
    config = rec.get("config") if isinstance(rec.get("config"), dict) else {}
    train = config.get("train") if isinstance(config.get("train"), dict) else {}
    device = str(rec.get("device") or "").split(":")[0] or None
    known = {"device": device, "cpu_model": prov.get("cpu_model"), "threads": rec.get("threads"),
             "torch": prov.get("torch"), "torchvision": prov.get("torchvision"), "cuda": prov.get("cuda"),
             "device_model": prov.get("gpu_name") if device == "cuda" else prov.get("cpu_model"),
             "precision": train.get("precision", "fp32"), "compile": train.get("compile", "off"),
             "channels_last": train.get("channels_last", False), "world_size": rec.get("world_size")}
    wanted = set(SCHEMA2_NUMERICS.get(device, SCHEMA2_NUMERICS["cpu"]))
    numerics = {k: v for k, v in known.items() if v is not None}
    numerics.update({k: identity.NOT_RECORDED for k in wanted if numerics.get(k) is None})
    rec["numerics"] = numerics


@dataclass(frozen=True)
class Step:
    name: str
    apply: Callable[[dict], None]


#: Every change of the record format since schema 1, in the order they apply. Each is safe on a record it
#: does not concern (it changes nothing there).
STEPS = (
    Step("explicit defaults", explicit_defaults),
    Step("sampler explicit", explicit_sampler),
    Step("augment scheme 1", explicit_augment_scheme),
    Step("moved modules", moved_modules),
    Step("portable paths", portable_paths),
    Step("numerics from other fields", numerics_from_other_fields),
)


def migrate_record(rec: dict) -> dict:
    """A copy of ``rec`` in the current format (its id is set by the caller, who knows the folder)."""
    out = copy.deepcopy(rec)
    for step in STEPS:
        step.apply(out)
    out["schema_version"] = schema.SCHEMA_VERSION
    return out


# ------------------------------------------------------------------------------------------------
# A results folder


RECORD_FILES = (store.RESULT, store.SPEC, store.STARTED)


@dataclass
class Report:
    migrated: int = 0  # records rewritten
    renamed: list[tuple[str, str]] = field(default_factory=list)  # (old folder, new folder), relative
    current: int = 0  # records already in the current format
    left: list[str] = field(default_factory=list)  # one line per folder left as it is, and why

    def lines(self, root: Path, dry_run: bool) -> list[str]:
        verb = "would migrate" if dry_run else "migrated"
        out = [f"{root}: {verb} {self.migrated} record(s), {'would rename' if dry_run else 'renamed'} "
               f"{len(self.renamed)} run folder(s) to their new ids; {self.current} already up to date"]
        out += [f"  {old} -> {new}" for old, new in self.renamed[:20]]
        if len(self.renamed) > 20:
            out.append(f"  ... and {len(self.renamed) - 20} more")
        out += [f"  left as it is: {line}" for line in self.left]
        return out


def run_folders(root: Path) -> list[Path]:
    """Every run folder below ``root``: a folder holding a record file that is not a stage-2 result."""
    found = {p.parent for name in RECORD_FILES for p in Path(root).rglob(name)}
    return sorted(d for d in found if d.parent.name != store.POSTHOC_DIR)


def _load(path: Path) -> dict | None:
    obj = store.load_json(path) if path.is_file() else None
    if obj is not None and not isinstance(obj, dict):
        raise store.UnusableFile(path, "is not a JSON object")
    return obj


def _new_ids(result: dict | None, spec: dict | None, folder: Path) -> tuple[str, str]:
    """(old id, new id) of a run folder, from its result or else its spec (migrated)."""
    rec = result if result is not None else spec
    old = rec.get("migrated_from") or rec.get("run_id") or folder.name
    return str(old), identity.run_id(rec["config"])


def migrate_folder(root: Path, dry_run: bool = False) -> Report:
    """Bring every record below ``root`` to the current format; see the module docstring."""
    report = Report()
    for folder in run_folders(root):
        try:
            plan = _plan(folder)
        except (store.UnusableFile, KeyError, TypeError, ValueError) as exc:
            report.left.append(f"{folder.relative_to(root)}: its records cannot be read ({exc}); nothing changed")
            continue
        records, new_id = plan
        target = folder.parent / new_id
        if new_id != folder.name and target.exists():
            report.left.append(f"{folder.relative_to(root)}: its new id {new_id} is taken by another folder; "
                               f"nothing changed (compare the two and remove one)")
            continue
        changed = [(path, rec) for path, rec, was_current in records if not was_current]
        report.current += len(records) - len(changed)
        report.migrated += len(changed)
        if new_id != folder.name:
            report.renamed.append((str(folder.relative_to(root)), str(target.relative_to(root))))
        if dry_run:
            continue
        for path, rec in changed:
            store.atomic_write_json(path, rec)
        if new_id != folder.name:
            os.rename(folder, target)  # atomic on one file system; the records already carry the new id
    return report


def _plan(folder: Path) -> tuple[list[tuple[Path, dict, bool]], str]:
    """The run folder's records in the current format, with whether each already was, and its new id."""
    loaded = {name: _load(folder / name) for name in RECORD_FILES}
    result, spec = loaded[store.RESULT], loaded[store.SPEC]
    if result is None and spec is None:
        raise KeyError("no result.json or spec.json with a configuration")
    current = {name: rec is not None and not schema.is_older(rec, missing=None if name == store.RESULT else 1)
               for name, rec in loaded.items()}
    new = {name: (rec if current[name] else migrate_record(rec)) for name, rec in loaded.items() if rec is not None}
    old_id, new_id = _new_ids(new.get(store.RESULT), new.get(store.SPEC), folder)
    out = []
    for name, rec in new.items():
        if name != store.STARTED and not current[name]:
            rec["run_id"] = new_id
            if old_id != new_id:
                rec["migrated_from"] = old_id
        out.append((folder / name, rec, current[name]))
    for path in sorted((folder / store.POSTHOC_DIR).glob(f"*/{store.RESULT}")):
        rec = _load(path)
        if rec is None or not schema.is_older(rec):
            out.append((path, rec, True))
            continue
        new_rec = migrate_record(rec)
        new_rec["posthoc_of"] = new_id
        new_rec["run_id"] = identity.stage2_run_id(new_id, new_rec["posthoc"])
        if new_rec["run_id"] != rec.get("run_id"):
            new_rec["migrated_from"] = rec.get("run_id")
        out.append((path, new_rec, False))
    return out, new_id
