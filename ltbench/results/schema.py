"""The one schema of result.json, field by field: what every command may rely on once a record passed it.

Why one schema: every command reads a different part of a record (a table the headline and validation
metrics, ``--select val`` ``metrics.val.all``, a figure the per-class values and ``method_extras``, stage 2
``config.optim`` and ``selection``, status and run the recorded ``code``). When each reader guards only what
it reads, a record damaged in a field one reader skips is data to one command and an internal error to
another (``metrics.val`` as a string, a stage-2 ``code: 5``). So a record is checked whole, here, before
any command reads it (``store.check_result`` calls :func:`result_problem`): a record that fails any field
is *damaged* and named with the field; one that passes is safe for every reader. docs/results-schema.md
lists the fields; the caches hold values that pass the same checks (ltbench/results/caches.py).

No torch, no numpy: status and tables use it on a login node.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ltbench.config import ConfigError, OptimConfig, from_dict

#: The format of every record ltbench writes (result.json, spec.json, started.json). A record of another
#: version is never read on the fly: ltbench/results/migrate.py brings an older one up to date.
SCHEMA_VERSION = 3
MIGRATE_HINT = "ltbench migrate {root}"  # what brings an older record up to date

SHOT_GROUPS = ("many", "medium", "few")  # the one list of shot groups (ltbench/evaluation.py defines them)
HEADLINE_METRICS = ("all", *SHOT_GROUPS)
RESULT_STATUSES = ("done", "failed")
SELECTION_STRATEGIES = ("last", "best_val")
STAGE2_KIND = "posthoc"  # ``kind`` of a stage-2 result (ltbench/stage2/posthoc_runs.py); a run's is null

NUMBER, WHOLE = "a finite number", "a whole number"  # JSON types a Python type cannot name (bool is no number)
#: Every field a reader uses, by the records that have it: required there (present, even when null), with the
#: JSON types it may hold (None: null is one of its values). A field of any type may also be null when the
#: record lists it in ``unrecorded``: its value was never recorded (a record migrated from before it existed),
#: so no reader guesses it from an absent key. A new field: add it here, bump SCHEMA_VERSION, add a
#: migration step (docs/architecture.md, "How a record changes format").
FIELDS = {
    "every": {"schema_version": (WHOLE,), "run_id": (str,), "status": (str,), "config": (dict,), "seed": (WHOLE, None),
              "recipe": (str, None), "grid": (dict, None), "plugins": (dict, list), "provenance": (dict,),
              "method_display": (str,), "unrecorded": (list,), "code": (dict, None), "code_scope": (str, None),
              "code_source": (str, None), "kind": (str, None), "started": (NUMBER,), "ended": (NUMBER,),
              "wall_seconds": (NUMBER,)},
    "done": {"metrics": (dict,), "data": (dict,), "numerics": (dict,), "method_extras": (dict,),
             "device_seconds": (NUMBER,)},
    "failed": {"error": (str,), "error_type": (str, None), "traceback_file": (str, None)},
    "run done": {"device": (str,), "world_size": (WHOLE,), "threads": (WHOLE,), "run_started": (NUMBER,),
                 "selection": (dict,), "views": (list,), "parameters": (dict,)},
    "stage2": {"posthoc": (dict,), "posthoc_of": (str,), "features": (dict,)},
}
TYPE_NAMES = {str: "a string", dict: "an object", list: "a list", None: "null", NUMBER: NUMBER, WHOLE: WHOLE}


def required_fields(obj: dict) -> dict:
    """The fields ``FIELDS`` requires of this record (by its status and kind), with their types."""
    stage2 = obj.get("kind") == STAGE2_KIND
    parts = ["every", obj.get("status")] + (["stage2"] if stage2 else ["run done"] if obj.get("status") == "done" else [])
    return {k: v for part in parts for k, v in FIELDS.get(part, {}).items()}


def _typed(value: Any, kinds: tuple) -> bool:
    return any(value is None if k is None else is_number(value) if k == NUMBER else
               (isinstance(value, int) and not isinstance(value, bool)) if k == WHOLE else isinstance(value, k)
               for k in kinds)


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_fraction(x: Any) -> bool:
    return is_number(x) and 0 <= x <= 1


def is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _number(value: float | None) -> str:
    return "null" if value is None else f"{value:.6g}"


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    return repr(str(value)[:40]) if not isinstance(value, (dict, list)) else type(value).__name__


def version_of(obj: Any, missing: int | None = None) -> int | None:
    """The ``schema_version`` of a parsed record; ``missing`` when it has none (result.json always had one;
    spec.json and started.json had none before schema 2: 1), None when it is not a whole number."""
    if not isinstance(obj, dict):
        return None
    v = obj.get("schema_version", missing)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def is_older(obj: Any, missing: int | None = None) -> bool:
    """A record written under an earlier schema (ltbench migrate brings it up to date). A result.json without
    a version is no record of any schema (damaged); pass ``missing=1`` for spec.json and started.json."""
    v = version_of(obj, missing)
    return v is not None and v < SCHEMA_VERSION


def names_folder(obj: Any, folder_name: str) -> bool:
    """ltbench names a run folder by its run's id: a spec.json or result.json that names neither its folder
    nor the one it was migrated from is someone else's file (a project folder's spec.json), never migrated."""
    return isinstance(obj, dict) and folder_name in (obj.get("run_id"), obj.get("migrated_from"))


def older_problem(obj: dict) -> str:
    """Why a record of an earlier schema cannot be migrated ('' when it can): ``ltbench migrate`` names it and
    leaves it, and every command reads it as damaged, never as 'older' (which a migration would end)."""
    problem = _names_problem(obj.get("config"))
    if not problem and obj.get("kind") == STAGE2_KIND and _names_problem(obj, ("posthoc",)):
        return "posthoc (the stage-2 method) is missing"
    try:
        return problem or json.dumps(obj["config"], allow_nan=False) and ""
    except ValueError:
        return "config holds a NaN or an infinity"


def _names_problem(config: Any, sections=("data", "backbone", "method")) -> str:
    if isinstance(config, dict) and all(isinstance(config.get(s), dict) and isinstance(config[s].get("name"), str)
                                        for s in sections):
        return ""
    return f"config ({', '.join(sections)} names) is missing"


def result_problem(obj: Any) -> str:
    """Why a parsed result.json is not a usable record ('' when it is): the fields ``FIELDS`` requires of it,
    the header of every record, then the outcome of a done one (a failed record has no metrics to read)."""
    if not isinstance(obj, dict):
        return f"holds a JSON {type(obj).__name__}, expected an object"
    if "status" not in obj:
        return "has no status (an empty or partial record)"
    if obj.get("status") not in RESULT_STATUSES:
        return f"status is {_shown(obj.get('status'))}, expected 'done' or 'failed'"
    if not isinstance(obj.get("run_id"), str) or not obj["run_id"]:
        return "run_id is missing"
    if version_of(obj) != SCHEMA_VERSION:
        return (f"schema_version is {_shown(obj.get('schema_version'))}, expected {SCHEMA_VERSION}"
                + (" (made by a newer ltbench: upgrade ltbench)" if (version_of(obj) or 0) > SCHEMA_VERSION else ""))
    for check in (fields_problem, _config_problem, _display_problem, code_problem):
        problem = check(obj)
        if problem:
            return problem
    if obj["status"] == "failed":
        return ""
    for key in ("data", "numerics"):  # a done record's own evidence: never only listed unrecorded
        if not isinstance(obj[key], dict):
            return f"{key} is {_shown(obj[key])}, expected an object"
    return (metrics_problem(obj["metrics"], obj["data"]) or cost_problem(obj)
            or numerics_problem(obj["numerics"], unrecorded_numerics(obj))
            or selection_problem(obj.get("selection")) or extras_problem(obj["method_extras"]))


def fields_problem(obj: dict) -> str:
    """Every required field present and of its type; null only where its type allows it or the record lists
    it in ``unrecorded``; ``unrecorded`` names only fields of this record (``numerics.<field>`` for one of
    the numerics) that are null."""
    unrecorded = obj.get("unrecorded")
    if not (isinstance(unrecorded, list) and all(isinstance(u, str) for u in unrecorded)):
        return f"unrecorded is {_shown(unrecorded)}, expected a list of field names"
    required = required_fields(obj)
    for key, kinds in required.items():
        if key not in obj:
            return f"{key} is missing"
        if not (_typed(obj[key], kinds) or (obj[key] is None and key in unrecorded)):
            return f"{key} is {_shown(obj[key])}, expected " + " or ".join(TYPE_NAMES[k] for k in kinds)
    for name in unrecorded:
        section, _, key = name.rpartition(".")
        holder = obj.get(section) if section else obj
        if not ((section or name) in required and isinstance(holder, dict) and key in holder and holder[key] is None):
            return f"unrecorded names {_shown(name)}, which is no null field of this record"
    return ""


#: The numerics fields two results of one run id are compared on, by device (``identity.numerics_difference``,
#: the borrowing rule; docs/results-schema.md says why each is here), and those a note shows first beside them.
NUMERICS_COMMON = ("device", "torch", "torchvision", "precision", "compile", "channels_last", "world_size",
                   "threads_per_epoch", "kernel_env", "float32_matmul_precision")
NUMERICS_FIELDS = {
    "cpu": NUMERICS_COMMON + ("cpu_model", "cpu_id", "cpu_capability", "threads", "blas", "onednn", "mkldnn"),
    # On a GPU the threads only run host-side work: they are recorded, not compared.
    "cuda": NUMERICS_COMMON + ("device_model", "cuda", "cudnn", "deterministic", "tf32_matmul", "tf32_cudnn",
                               "cudnn_benchmark"),
}
NUMERICS_SHOWN = ("device_model", "cpu_model", "cpu_capability", "threads")


def numerics_required(device) -> tuple[str, ...]:
    """The numerics fields a result on ``device`` records (``numerics_problem``): the ones compared on that
    device (on any device when its device is unrecorded: it may be compared with either) and the ones a note
    shows."""
    compared = NUMERICS_FIELDS[device] if device in NUMERICS_FIELDS else sum(NUMERICS_FIELDS.values(), ())
    return tuple(dict.fromkeys(("device", *compared, *NUMERICS_SHOWN)))


def unrecorded_numerics(obj: dict) -> set[str]:
    """The numerics fields a record lists as never recorded (``unrecorded``: 'numerics.cpu_id')."""
    return {u.removeprefix("numerics.") for u in obj["unrecorded"] if u.startswith("numerics.")}


def numerics_problem(numerics: dict, unrecorded: set[str]) -> str:
    """``numerics`` (provenance.numerics): a known device (or one listed unrecorded) and every field
    ``numerics_required`` names for it, present (null where the machine had no such thing, e.g.
    ``cuda`` on a CPU, or listed unrecorded)."""
    device = numerics.get("device")
    if device not in NUMERICS_FIELDS and not (device is None and "device" in unrecorded):
        return f"numerics.device is {_shown(device)}, expected one of {', '.join(NUMERICS_FIELDS)}"
    missing = [f for f in numerics_required(device) if f not in numerics]
    return f"numerics.{missing[0]} is missing" if missing else ""


#: How far a run's cost may exceed what its own times allow (wall and monotonic clocks drift apart a little).
COST_SLACK = (1.01, 60.0)  # (factor, seconds)


def cost_bound(seconds: float, since: float, until: float) -> bool:
    """Can a run (or a checkpoint) have taken ``seconds`` of one device between wall-clock times ``since``
    and ``until``? Sessions never overlap, so their elapsed times sum to at most ``until - since``."""
    return is_number(seconds) and seconds >= 0 and seconds <= COST_SLACK[0] * max(until - since, 0) + COST_SLACK[1]


def cost_problem(obj: dict) -> str:
    """``device_seconds``: a finite number >= 0, at most the record's own elapsed time (its first session's
    start, ``run_started``, to its end) times its devices; null only when listed unrecorded (a stage-2 result,
    whose stage-1 run's cost it does not count, or a record migrated from before ltbench kept it). A run
    migrated from schema 2 has no ``run_started``: its bound is the weakest one, from 1970."""
    seconds = obj["device_seconds"]
    if seconds is None:
        return ""
    world = obj.get("world_size") if obj.get("kind") != STAGE2_KIND else 1
    since = obj.get("run_started")
    if not cost_bound(seconds / max(world, 1), 0.0 if since is None else since, obj["ended"]):
        return f"device_seconds is {_shown(seconds)}, more than the run's elapsed time x {world} device(s) allows"
    return ""


def _config_problem(obj: dict) -> str:
    """The run's configuration: the plugin names every row and label reads, the seed, and ``optim``
    validated as a recipe's is (stage 2 reads its epochs; a table shows its values)."""
    config = obj["config"]
    if _names_problem(config):
        return _names_problem(config)
    for seed, where in ((config.get("seed"), "config.seed"), (obj.get("seed"), "seed")):
        if seed is not None and not (isinstance(seed, int) and not isinstance(seed, bool)):
            return f"{where} is {_shown(seed)}, expected a whole number"
    for section in ("posthoc", "sampler"):
        value = config.get(section)
        if value is not None and not (isinstance(value, dict) and isinstance(value.get("name"), str)):
            return f"config.{section} is {_shown(value)}, expected an object with a name"
    if config.get("data_identity") is not None and not isinstance(config["data_identity"], str):
        return "config.data_identity is not a string"
    return section_problem(OptimConfig, config["optim"], "config.optim") if "optim" in config else ""


_sections: dict[tuple, str] = {}


def section_problem(cls: type, value: Any, where: str) -> str:
    """'' when ``value`` validates as the core section ``cls`` (a recipe's own rules), else the one-line error
    naming ``where``. Remembered by content: 10,000 results of one grid hold a few distinct sections, and a
    table or a cache check must not validate the same one 10,000 times."""
    try:
        key = (cls.__name__, json.dumps(value, sort_keys=True, default=repr))
    except (TypeError, ValueError, RecursionError):
        key = None
    if key is None or key not in _sections:
        try:
            from_dict(cls, value, _HERE)
            problem = ""
        except ConfigError as exc:
            problem = str(exc)
        if key is None:
            return problem.replace(_HERE, where, 1)
        if len(_sections) > 10_000:
            _sections.clear()
        _sections[key] = problem
    return _sections[key].replace(_HERE, where, 1)


_HERE = "<section>"  # the path in a remembered message, replaced by the caller's


def _display_problem(obj: dict) -> str:
    problem = display_name_problem(obj["method_display"]) if obj["method_display"] is not None else ""
    return problem and f"method_display {problem}"


DISPLAY_NAME_LIMIT = 40


def display_name_problem(value: Any) -> str:
    """Why ``value`` cannot be a method's display name ('' when it can): the one rule of its registration
    (``Registry.register(display=...)``), result.json's ``method_display`` and the table index. A table prints
    it as a row label, so it is a short single line: 1 to 40 printable characters, not all spaces."""
    if not isinstance(value, str):
        return f"is {_shown(value)}, expected a string"
    if not value.strip() or len(value) > DISPLAY_NAME_LIMIT or not value.isprintable():
        return f"is {_shown(value)}, expected 1 to {DISPLAY_NAME_LIMIT} printable characters on one line"
    return ""


def code_problem(obj: dict) -> str:
    """``code``: module -> {normalized, path, sha256} (results/code.code_record; older records {path, sha256}),
    'data:<path>' -> {sha256}, 'distribution:<name>' -> {version} (provenance.modules_code): what status, run
    and tables compare with this machine now (the stale rule, identity.code_state). Every field is optional
    (a record without a hash is 'code unknown'), but each present one is a string."""
    code = obj.get("code")
    if code is None:
        return ""
    if not isinstance(code, dict):
        return f"code is {_shown(code)}, expected an object of module -> {{normalized, path, sha256}}"
    for module, entry in code.items():
        if not (isinstance(entry, dict) and entry
                and all(entry.get(k) is None or isinstance(entry[k], str) for k in ("normalized", "path", "sha256", "version"))):
            return f"code.{str(module)[:60]} is {_shown(entry)}, expected {{normalized, path, sha256}} strings"
    return ""


def metric_problem(values: Any, where: str, required: tuple[str, ...] = ()) -> str:
    """A shot-group record {all, many, medium, few}: fractions in [0, 1] or null, ``required`` ones present."""
    if not isinstance(values, dict):
        return f"{where} is {type(values).__name__}, expected an object"
    for key in required:
        if key not in values:
            return f"{where}.{key} is missing"
    for key in HEADLINE_METRICS:
        v = values.get(key)
        if v is not None and not is_fraction(v):
            return f"{where}.{key} is {_shown(v)}, expected a fraction in [0, 1] or null"
    if values.get("size") is not None and not is_count(values["size"]):
        return f"{where}.size is {_shown(values['size'])}, expected a whole number >= 0"
    return ""


def metrics_problem(metrics: Any, data: Any) -> str:
    """``metrics`` of a done record: the headline (``all`` measured), ``macro``, ``groups``, every head, prior
    and test set, the validation split (what ``--select val`` reads), and the per-class accuracies with the
    class counts they are checked against: a record that cannot show its summary is what its classes give
    is damaged (issue 52: without them ``all: 0.99`` was tabled beside per-class values averaging 0.62)."""
    problem = metric_problem(metrics, "metrics", required=(*HEADLINE_METRICS, "per_class", "groups"))
    if problem:
        return problem
    if not is_number(metrics["all"]):
        return "metrics.all is null"
    if metrics.get("macro") is not None and not is_fraction(metrics["macro"]):
        return f"metrics.macro is {_shown(metrics['macro'])}, expected a fraction in [0, 1]"
    for section in ("heads", "target_priors", "test_sets"):
        entries = metrics.get(section)
        if entries is not None and not isinstance(entries, dict):
            return f"metrics.{section} is {type(entries).__name__}, expected an object of name -> metrics"
        for name, values in (entries or {}).items():
            problem = metric_problem(values, f"metrics.{section}.{str(name)[:60]}")
            if problem:
                return problem
    problem = _groups_problem(metrics["groups"]) or class_counts_problem(data, val=metrics.get("val") is not None)
    if problem:
        return problem
    if metrics.get("val") is not None:
        problem = metric_problem(metrics["val"], "metrics.val", required=("all", "per_class")) \
            or per_class_problem(metrics["val"]["per_class"], data["class_counts_val"], "metrics.val.per_class") \
            or agreement_problem({**metrics["val"], "groups": metrics["groups"]}, data, "metrics.val", "class_counts_val")
        if problem:
            return problem
    return per_class_problem(metrics["per_class"], data["class_counts_test"], "metrics.per_class") \
        or agreement_problem(metrics, data, "metrics", "class_counts_test")


#: How far a recorded mean may be from the one its per-class values give (float sums in another order).
AGREEMENT_TOLERANCE = 1e-6


def agreement_problem(metrics: dict, data: dict, where: str, test_counts_key: str) -> str:
    """'' when the summary metrics are what the record's own per-class accuracies give (ltbench/evaluation.py):
    ``all`` the test-count-weighted mean, ``macro`` the mean, Many/Medium/Few the mean over the classes of each
    group (from training counts and the recorded thresholds) and null exactly when the group has no class with
    test images. A record that contradicts itself (all 0.99 beside per-class values averaging 0.25; Many 0.90
    with no many-shot class) is damaged: no table may show it. The caller checked the lists' lengths."""
    per_class, test, train = metrics["per_class"], data[test_counts_key], data["class_counts_train"]
    if any((n > 0) != (a is not None) for n, a in zip(test, per_class)):
        return f"{where}.per_class has a value for a class without test images, or none for one with them"
    scored = [(i, a) for i, a in enumerate(per_class) if a is not None]
    if not scored:
        return f"{where}.all is {metrics['all']!r}, but no class has test images"
    got = sum(a * test[i] for i, a in scored) / sum(test)
    if metrics["all"] is None or abs(got - metrics["all"]) > AGREEMENT_TOLERANCE:
        return f"{where}.all is {_number(metrics['all'])}, its per-class accuracies give {got:.6g}"
    if metrics.get("macro") is not None and abs(sum(a for _, a in scored) / len(scored) - metrics["macro"]) \
            > AGREEMENT_TOLERANCE:
        return f"{where}.macro is {metrics['macro']:.6g}, its per-class accuracies give " \
               f"{sum(a for _, a in scored) / len(scored):.6g}"
    many, few = metrics["groups"]["many_threshold"], metrics["groups"]["few_threshold"]
    for group, member in (("many", lambda n: n > many), ("medium", lambda n: few <= n <= many),
                          ("few", lambda n: n < few)):
        values = [a for i, a in scored if member(train[i])]
        recorded = metrics.get(group)
        if not values and recorded is not None:
            return f"{where}.{group} is {recorded:.6g}, but no {group}-shot class has test images"
        if values and (recorded is None or abs(sum(values) / len(values) - recorded) > AGREEMENT_TOLERANCE):
            return f"{where}.{group} is {_number(recorded)}, its classes' accuracies give {sum(values) / len(values):.6g}"
    return ""


#: The float32 range: every method extra comes from a float32 tensor or a count, so a larger one is damage.
FLOAT32_MAX = 3.4028234663852886e38


def extras_problem(extras: Any) -> str:
    """``method_extras``: every number finite and within float32's range, a norm, concentration or count never
    negative (a figure plots them as they are: NaN, 1e308 or a norm of -5 is damage, never a point)."""
    stack = [(extras, "method_extras")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, dict):
            stack += [(v, f"{where}.{str(k)[:40]}") for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(v, where) for v in value]
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
                return f"{where} holds {value!r}, expected a finite number"
            name = where.rsplit(".", 1)[-1]
            if value < 0 and (name == "n" or name.startswith("kappa") or name.endswith("norm")):
                return f"{where} holds {value!r}, expected a number >= 0"
    return ""


def _groups_problem(groups: Any) -> str:
    if not isinstance(groups, dict):
        return f"metrics.groups is {type(groups).__name__}, expected an object"
    for key in ("many_threshold", "few_threshold"):
        if not is_count(groups.get(key)):
            return f"metrics.groups.{key} is {_shown(groups.get(key))}, expected a whole number >= 0"
    return ""


def class_counts_problem(data: dict, val: bool) -> str:
    """Class counts: training and test (and validation when the record has validation metrics) lists of whole
    numbers >= 0 of one length, ``num_classes`` their number, so a plot or a stage-2 fit may read them as they
    are and the agreement check can weigh every class."""
    keys = ("class_counts_train", "class_counts_test") + (("class_counts_val",) if val else ())
    for key in keys:
        values = data.get(key)
        if not (isinstance(values, list) and values and all(is_count(v) for v in values)):
            return f"data.{key} is {'missing' if values is None else 'not a list of whole numbers >= 0'}"
    counts = data["class_counts_train"]
    for key in keys[1:]:
        if len(data[key]) != len(counts):
            return f"data.{key} has {len(data[key])} classes, class_counts_train {len(counts)}"
    if data.get("num_classes") is not None and data["num_classes"] != len(counts):
        return f"data.num_classes is {_shown(data['num_classes'])}, not the number of class counts"
    return ""


def per_class_problem(per_class: Any, counts: list, where: str) -> str:
    """Per-class accuracies: fractions (or null for a class without images), one per class."""
    if not (isinstance(per_class, list) and all(v is None or is_fraction(v) for v in per_class)):
        return f"{where} is not a list of fractions in [0, 1]"
    if len(per_class) != len(counts):
        return f"{where} has {len(per_class)} values for {len(counts)} classes"
    return ""


def selection_problem(selection: Any) -> str:
    """``selection``: which model the metrics are of (stage 2 reads the strategy: a best_val run's final
    checkpoint is not its reported model)."""
    if selection is None:
        return ""
    if not isinstance(selection, dict):
        return f"selection is {type(selection).__name__}, expected an object"
    if selection.get("strategy") not in SELECTION_STRATEGIES:
        return f"selection.strategy is {_shown(selection.get('strategy'))}, expected 'last' or 'best_val'"
    if selection.get("epoch") is not None and not is_count(selection["epoch"]):
        return f"selection.epoch is {_shown(selection['epoch'])}, expected a whole number"
    for key in ("val", "oracle_best_on_test"):
        if selection.get(key) is not None:
            problem = metric_problem(selection[key], f"selection.{key}")
            if problem:
                return problem
    return ""
