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

HEADLINE_METRICS = ("all", "many", "medium", "few")
RESULT_STATUSES = ("done", "failed")
SELECTION_STRATEGIES = ("last", "best_val")
#: Optional header fields and the JSON type each must have when present (null counts as absent).
OPTIONAL_TYPES = {"recipe": str, "grid": dict, "plugins": (dict, list), "provenance": dict, "error": str,
                  "error_type": str, "traceback_file": str, "method_extras": dict, "kind": str, "posthoc_of": str,
                  "posthoc": dict, "features": dict, "views": list}
TYPE_NAMES = {str: "a string", dict: "an object", list: "a list", (dict, list): "an object or a list"}


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_fraction(x: Any) -> bool:
    return is_number(x) and 0 <= x <= 1


def is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _shown(value: Any) -> str:
    return repr(str(value)[:40]) if not isinstance(value, (dict, list)) else type(value).__name__


def result_problem(obj: Any) -> str:
    """Why a parsed result.json is not a usable record ('' when it is): the header of every record, then
    the outcome of a done one (a failed record has no metrics to read)."""
    if not isinstance(obj, dict):
        return f"holds a JSON {type(obj).__name__}, expected an object"
    if "status" not in obj:
        return "has no status (an empty or partial record)"
    if obj.get("status") not in RESULT_STATUSES:
        return f"status is {_shown(obj.get('status'))}, expected 'done' or 'failed'"
    if not isinstance(obj.get("run_id"), str) or not obj["run_id"]:
        return "run_id is missing"
    for check in (_config_problem, _header_problem, code_problem):
        problem = check(obj)
        if problem:
            return problem
    if obj["status"] == "failed":
        return ""
    problem = metrics_problem(obj.get("metrics"), obj.get("data"))
    return problem or selection_problem(obj.get("selection"))


def _config_problem(obj: dict) -> str:
    """The run's configuration: the plugin names every row and label reads, the seed, and ``optim``
    validated as a recipe's is (stage 2 reads its epochs; a table shows its values)."""
    config = obj.get("config")
    sections = ("data", "backbone", "method")
    if not isinstance(config, dict) or not all(
            isinstance(config.get(s), dict) and isinstance(config[s].get("name"), str) for s in sections):
        return "config (data, backbone, method names) is missing"
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
