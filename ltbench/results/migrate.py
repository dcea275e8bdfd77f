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

What is no ltbench record is never touched: a folder whose spec.json or result.json does not name it (a
project folder), a record of a newer or unknown schema (named: made by a newer ltbench), a damaged record
(named; everything else is migrated). The dry run plans exactly what the real run applies.

To change the record format: bump ``schema.SCHEMA_VERSION`` and add a step numbered with it to ``STEPS`` (or
bump ``identity.IDENTITY_VERSION`` when what identifies a run changes), with a test in tests/test_migrate.py.
docs/architecture.md ("How a record changes format") says the same.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ltbench.errors import shorten
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

#: The numerics fields compared when schema 2 was made: the ones such a record marks ``not recorded`` (the step
#: to schema 3 makes those, and the fields recorded since, null and lists them ``unrecorded``).
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


def explicit_fields(rec: dict) -> None:
    """Schema 3 (issue 48): every field a reader uses is present (``schema.FIELDS``). A field a result lacks
    gets the value schema 2's readers took its absence for where its type allows null (``kind`` null: a run),
    else null listed in ``unrecorded`` (``device_seconds``, ``method_display``): never recorded, so no reader
    guesses. The numerics the same, field by field (``numerics.cpu_id``); the ``not recorded`` marks of step
    'numerics from other fields' become such entries. ``threads_per_epoch`` was written only when the count
    changed by a run that recorded ``threads_from``; a stage-2 fit has no epochs."""
    if "status" not in rec:  # spec.json, started.json: only their version changes
        return
    unrecorded = rec["unrecorded"] = list(rec["unrecorded"]) if isinstance(rec.get("unrecorded"), list) else []
    if rec.get("status") == "done" and "numerics" not in rec:
        rec["numerics"] = {}  # each of its fields unrecorded, below
    for key, kinds in schema.required_fields(rec).items():
        if key not in rec:
            rec[key] = None
            unrecorded += [] if None in kinds else [key]
    numerics = rec.get("numerics")
    if not isinstance(numerics, dict):
        return
    for name in schema.numerics_required(numerics.get("device")):
        if name == "threads_per_epoch" and name not in numerics and (
                "threads_from" in numerics or rec.get("kind") == schema.STAGE2_KIND):
            numerics[name] = None
        elif numerics.get(name, identity.NOT_RECORDED) == identity.NOT_RECORDED:
            numerics[name] = None
            unrecorded.append(f"numerics.{name}")


@dataclass(frozen=True)
class Step:
    to: int  # the schema version this step brings a record to
    name: str
    apply: Callable[[dict], None]


#: Every change of the record format, numbered by the schema version it brings a record to, in the order they
#: apply (Optuna's numbered migrations): a record of version v gets the steps with ``to`` > v.
STEPS = (
    Step(2, "explicit defaults", explicit_defaults),
    Step(2, "sampler explicit", explicit_sampler),
    Step(2, "augment scheme 1", explicit_augment_scheme),
    Step(2, "moved modules", moved_modules),
    Step(2, "portable paths", portable_paths),
    Step(2, "numerics from other fields", numerics_from_other_fields),
    Step(3, "every field explicit", explicit_fields),
)


def migrate_record(rec: dict, version: int = 1) -> dict:
    """A copy of ``rec`` (of schema ``version``) in the current format (its id is set by the caller, who knows
    the folder)."""
    out = copy.deepcopy(rec)
    for step in STEPS:
        if step.to > version:
            step.apply(out)
    out["schema_version"] = schema.SCHEMA_VERSION
    return out


# ------------------------------------------------------------------------------------------------
# A results folder


RECORD_FILES = (store.RESULT, store.SPEC, store.STARTED)


@dataclass
class Report:
    """What a migration changes (a dry run: would change; both are planned alike, so they list the same) and
    every folder it leaves as it is, and why."""

    migrated: int = 0  # records rewritten
    renamed: list[tuple[str, str]] = field(default_factory=list)  # (old folder, new folder), relative
    current: int = 0  # records already in the current format
    left: list[str] = field(default_factory=list)  # one line per record or folder left as it is, and why
    foreign: int = 0  # folders holding a spec.json or result.json that is no ltbench record: never touched

    def lines(self, root: Path, dry_run: bool) -> list[str]:
        verb = "would migrate" if dry_run else "migrated"
        out = [f"{_shown(root)}: {verb} {self.migrated} record(s), {'would rename' if dry_run else 'renamed'} "
               f"{len(self.renamed)} run folder(s) to their new ids; {self.current} already up to date"]
        out += [f"  {old} -> {new}" for old, new in self.renamed[:20]]
        if len(self.renamed) > 20:
            out.append(f"  ... and {len(self.renamed) - 20} more")
        out += [f"  left as it is: {_shown(line)}" for line in self.left]  # names and reasons read from the disk
        if self.foreign:
            out.append(f"  not touched: {self.foreign} folder(s) whose spec.json or result.json is no ltbench record")
        return out


def _shown(text) -> str:
    return shorten(str(text), 400)  # a name read from the disk: never a control character on the terminal


def run_folders(root: Path) -> list[Path]:
    """Every run folder below ``root``: a folder holding a record file that is not a stage-2 result."""
    found = {p.parent for name in RECORD_FILES for p in Path(root).rglob(name)}
    return sorted(d for d in found if d.parent.name != store.POSTHOC_DIR)


class Left(Exception):
    """A folder or record migrate leaves as it is: the one line says why."""


@dataclass
class Plan:
    """One run folder's changes: records to write (path, record) and its new id (None: no ltbench run folder)."""

    writes: list[tuple[Path, dict]] = field(default_factory=list)
    current: int = 0
    new_id: str | None = None
    left: list[str] = field(default_factory=list)  # stage-2 records left as they are, and why


def migrate_folder(root: Path, dry_run: bool = False) -> Report:
    """Bring every ltbench record below ``root`` to the current format; see the module docstring. The real
    run applies exactly the plan the dry run lists; a folder it cannot change is named, never an error."""
    report, taken = Report(), set()
    for folder in run_folders(root):
        name = _shown(folder.relative_to(root))
        try:
            plan = _plan(folder)
        except Left as exc:
            report.left.append(f"{name}: {exc}; nothing changed")
            continue
        if plan.new_id is None:
            report.foreign += 1
            continue
        target = folder.parent / plan.new_id
        if plan.new_id != folder.name and (target.exists() or target in taken):
            report.left.append(f"{name}: its new id {plan.new_id} is taken by another folder; "
                               f"nothing changed (compare the two and remove one)")
            continue
        try:
            if not dry_run:
                for path, rec in plan.writes:
                    store.atomic_write_json(path, rec)
                if plan.new_id != folder.name:
                    os.rename(folder, target)  # atomic on one file system; the records already carry the new id
        except OSError as exc:  # read-only, a concurrent migrate renamed it first: named, the others go on
            report.left.append(f"{name}: {_shown(exc.strerror or exc)}; run 'ltbench migrate' again")
            continue
        taken.add(target)
        report.current += plan.current
        report.migrated += len(plan.writes)
        report.left += [f"{name}/{line}" for line in plan.left]
        if plan.new_id != folder.name:
            report.renamed.append((name, _shown(target.relative_to(root))))
    return report


def _current(path: Path, name: str) -> tuple[dict | None, bool]:
    """(the record in ``path`` in the current format, whether it already was); (None, True) when absent.
    ``Left`` when it is unreadable, of a newer or unknown schema, or too damaged to migrate."""
    if not os.path.lexists(path):
        return None, True
    try:
        rec = store.load_json(path)
    except store.UnusableFile as exc:
        raise Left(f"{name} {exc.reason}") from None
    version = schema.version_of(rec, missing=None if name == store.RESULT else 1)
    if not isinstance(rec, dict) or version is None or version > schema.SCHEMA_VERSION:
        raise Left(f"{name} is not a JSON object" if not isinstance(rec, dict) else
                   f"{name} has schema_version {_shown(repr(rec.get('schema_version')))[:40]}, which this ltbench "
                   f"(schema {schema.SCHEMA_VERSION}) does not know: made by a newer ltbench (upgrade it), or damaged")
    if version == schema.SCHEMA_VERSION:
        return rec, True
    problem = schema.older_problem(rec)
    try:
        new = migrate_record(rec, version)
        json.dumps(new, allow_nan=False)  # what the write will need: planned, so the dry run names it too
    except ValueError:
        problem = problem or "it holds a NaN or an infinity"
    if problem:
        raise Left(f"{name} is damaged ({problem})")
    return new, False


def _plan(folder: Path) -> Plan:
    """The run folder's records in the current format and its new id; an empty plan (no id) when it holds no
    ltbench record."""
    if _foreign(folder):
        return Plan()
    new = {name: _current(folder / name, name) for name in RECORD_FILES}
    main = (new[store.RESULT][0] or new[store.SPEC][0])
    old_id = main.get("migrated_from") or main.get("run_id") or folder.name
    try:
        plan = Plan(new_id=identity.run_id(main["config"]))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise Left(f"its configuration has no id ({_shown(exc)})") from None
    for name, (rec, was_current) in new.items():
        if rec is not None and was_current:
            plan.current += 1
        elif rec is not None:
            if name != store.STARTED:
                rec.update(run_id=plan.new_id, **({"migrated_from": old_id} if old_id != plan.new_id else {}))
            plan.writes.append((folder / name, rec))
    for path in sorted((folder / store.POSTHOC_DIR).glob(f"*/{store.RESULT}")):
        try:
            rec, was_current = _current(path, store.RESULT)
            if not was_current:
                old = rec.get("migrated_from") or rec.get("run_id")
                rec.update(posthoc_of=plan.new_id, run_id=identity.stage2_run_id(plan.new_id, rec["posthoc"]))
                rec.update({"migrated_from": old} if old != rec["run_id"] else {})
                plan.writes.append((path, rec))
            plan.current += was_current
        except (Left, ValueError, TypeError) as exc:  # one stage-2 result: named, the run and the others migrated
            plan.left.append(f"{store.POSTHOC_DIR}/{_shown(path.parent.name)}: {_shown(exc)}; nothing changed")
    return plan


def _foreign(folder: Path) -> bool:
    """Whether the folder's spec.json and result.json are readable and neither names it: someone else's files
    (an unreadable one may be ltbench's: it is named, never touched)."""
    for name in (store.RESULT, store.SPEC):
        try:
            rec = store.load_json(folder / name) if os.path.lexists(folder / name) else None
        except store.UnusableFile:
            return False
        if schema.names_folder(rec, folder.name):
            return False
    return True
