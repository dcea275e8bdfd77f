"""``ltbench.report.load(path)``: every run below a results folder (or of a recipe) as tidy pandas
DataFrames, one observation per line, for analyses and figures of your own.

Frames (accuracies are fractions in [0, 1]; ``row`` is the row's label, ``seed`` the seed): the label a
recipe's declared table gives the row (``LA (learned tau)``) where one does, else the default table's
(``la_learned_tau``), so figures read like the paper's tables; two configurations never share a label.

  runs         row, run_id, seed, status, recipe, dir, note, error, all, many, medium, few, wall_seconds,
               device, git_commit, ltbench_version, torch, plus config.<dotted key> columns
  heads        row, seed, head, group, accuracy                    (BAPE's DA modes, aux heads, ...)
  shift        row, seed, prior, position, accuracy                (position: forward50 < ... < uniform
                                                                    < ... < backward50)
  test_sets    row, seed, test_set, group, accuracy
  per_class    row, seed, class_index, train_count, group, accuracy, few_threshold, many_threshold
  class_stats  row, seed, class_index, train_count, stat, value    (every per-class list a method
                                                                    records: kappa, weight norms, ...)
  curves       row, seed, epoch, plus one column per numeric key of log.jsonl (test.all, ...)

Every frame but ``runs`` also has ``row_order``, the row's position in the default table: figures colour
and order their legends by it, so a method keeps its colour in every figure of a study.

Only finished runs contribute measurements; ``runs`` lists every run folder, damaged ones included.
per_class / class_stats / curves read the full result.json and log.jsonl (not the index cache).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from ltbench.errors import LtbenchError
from ltbench.results import store
from ltbench.results.schema import HEADLINE_METRICS
from ltbench.recipe.tables import default_table
from ltbench.report.build import build_table
from ltbench.report.expected import source
from ltbench.priors import prior_order
from ltbench.report.rows import flatten


@dataclass
class Frames:
    runs: "object"
    heads: "object"
    shift: "object"
    test_sets: "object"
    per_class: "object"
    class_stats: "object"
    curves: "object"

    def __getitem__(self, name: str):
        return getattr(self, name)

    def keys(self) -> list[str]:
        return [f.name for f in fields(self)]


def row_labels(path, results=None, overrides=(), stage2: bool = False) -> tuple[list[dict], dict[str, str]]:
    """Run records and, for each run folder, the label of the default table's row it belongs to. Stage-2
    results (a ``posthoc`` config section) are left out unless ``stage2``."""
    records, recipe, _ = source(path, results, overrides=overrides)
    if not stage2:
        records = [r for r in records if not (r.get("config") or {}).get("posthoc")]
    expected = recipe.expected if recipe is not None else None
    table = build_table("default", default_table(), records, expected, test=None)
    label_of, group_of = _default_labels(table, records, expected)
    if recipe is not None:
        label_of = _declared_labels(label_of, group_of, _declared_label_of(recipe, records, expected))
    return records, label_of


def _default_labels(table, records: list[dict], expected) -> tuple[dict[str, str], dict[str, str | None]]:
    """Run folder -> its default-table row label (and row group). A run that is not done (failed, pending,
    running) is found by its configuration, so the run list can say which row it would have filled."""
    label_of, group_of, by_key = {}, {}, {}
    for row in table.rows:
        label = row.label if not row.group else f"{row.group}: {row.label}"
        for unit in row.units.values():
            by_key[unit.key] = (label, row.group)
            for rec in unit.runs.values():
                label_of[rec["dir"]], group_of[rec["dir"]] = label, row.group
    key_of_run = {e["run_id"]: e["key"] for e in expected or []}
    for rec in records:
        key = key_of_run.get(rec.get("run_id")) if expected is not None else rec.get("key")
        if rec["dir"] not in label_of and key in by_key:
            label_of[rec["dir"]], group_of[rec["dir"]] = by_key[key]
    return label_of, group_of


def _declared_label_of(recipe, records: list[dict], expected) -> dict[str, str]:
    """Run folder -> the label a declared table gives its row (first table, in the recipe's order, whose
    rows name it). Rows reading another head, and tables that cannot be built, name nothing."""
    found: dict[str, str] = {}
    for name, spec in recipe.tables.items():
        if spec.rows is None and spec.row_label is None:
            continue
        try:
            table = build_table(name, spec, records, expected, test=None)
        except LtbenchError:
            continue
        for row in table.rows:
            if row.head or row.published:
                continue
            for unit in row.units.values():
                for rec in unit.runs.values():
                    found.setdefault(rec["dir"], row.label)
    return found


def _declared_labels(label_of: dict[str, str], group_of: dict[str, str | None],
                     declared: dict[str, str]) -> dict[str, str]:
    """A default row takes the declared label of its runs (``LA (learned tau)``, not ``la_learned_tau``)
    when all its runs that a declared table shows carry the same label and no other row would take it:
    two configurations never share a label, so a declared row covering several (a sweep, several
    datasets) keeps the default labels. The default row's group (the dataset or imbalance factor that
    tells rows apart across the study) stays in front: ``imb_factor=6: Baseline``."""
    by_row: dict[str, set[str]] = {}
    for run_dir, label in label_of.items():
        if run_dir in declared:
            group = group_of.get(run_dir)
            by_row.setdefault(label, set()).add(f"{group}: {declared[run_dir]}" if group else declared[run_dir])
    wanted = {row: next(iter(names)) for row, names in by_row.items() if len(names) == 1}
    taken = [name for name in wanted.values()]
    final = {row: name for row, name in wanted.items()
             if taken.count(name) == 1 and (name == row or name not in label_of.values())}
    return {run_dir: final.get(label, label) for run_dir, label in label_of.items()}


def _full_result(run_dir: str) -> dict:
    """The whole result record, under the same rule as every read (store.check_result); {} when unusable."""
    return store.check_result(Path(run_dir)).result or {}


def _group(count: int, many: int, few: int) -> str:
    return "many" if count > many else ("few" if count < few else "medium")


def _per_class_lines(row: str, seed, data: dict, per_class: list, class_stats: list) -> None:
    metrics = data.get("metrics") or {}
    counts = (data.get("data") or {}).get("class_counts_train") or []
    groups = metrics.get("groups") or {}
    many, few = groups.get("many_threshold", 100), groups.get("few_threshold", 20)
    for c, acc in enumerate(metrics.get("per_class") or []):
        n = counts[c] if c < len(counts) else None
        per_class.append({"row": row, "seed": seed, "class_index": c, "train_count": n,
                          "group": _group(n, many, few) if n is not None else None, "accuracy": acc,
                          "few_threshold": few, "many_threshold": many})
    k = len(counts)

    def walk(tree, prefix):
        for key, value in (tree or {}).items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(value, name + ".")
            elif isinstance(value, list) and k and len(value) == k and \
                    all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
                for c, v in enumerate(value):
                    class_stats.append({"row": row, "seed": seed, "class_index": c, "train_count": counts[c],
                                        "stat": name, "value": float(v)})

    walk(data.get("method_extras"), "")


def _curve_lines(row: str, seed, run_dir: str, curves: list) -> None:
    for line in store.read_jsonl(Path(run_dir) / store.LOG):
        if not isinstance(line, dict) or "epoch" not in line:
            continue
        flat = {"row": row, "seed": seed}
        for key, value in line.items():
            if isinstance(value, dict):
                flat.update({f"{key}.{k}": v for k, v in value.items() if isinstance(v, (int, float))})
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                flat[key] = value
        curves.append(flat)


def load(path, results=None, overrides=(), stage2: bool = False) -> Frames:
    """Tidy pandas DataFrames of every run below ``path`` (a results folder or a recipe file, with the recipe's
    overrides): runs, heads, shift, test_sets, per_class, class_stats, curves (columns: this module's docstring).
    ``stage2``: stage-2 results (ltbench posthoc) as rows too; off by default (a grid adds hundreds per run)."""
    import pandas as pd

    records, label_of = row_labels(path, results, overrides, stage2)
    runs, heads, shift, sets, per_class, class_stats, curves = [], [], [], [], [], [], []
    priors = sorted({k.split(":")[1] for r in records for k in r.get("metrics", {}) if k.startswith("prior:")},
                    key=prior_order)
    for rec in records:
        row = label_of.get(rec["dir"])
        seed = rec.get("seed")
        m = rec.get("metrics", {})
        line = {"row": row, "run_id": rec.get("run_id"), "seed": seed, "status": rec["status"],
                "recipe": rec.get("recipe"), "dir": rec["dir"], "note": rec.get("note"), "error": rec.get("error"),
                **{g: m.get(g) for g in HEADLINE_METRICS}, **(rec.get("prov") or {})}

        line.update({f"config.{k}": v for k, v in flatten(rec.get("config") or {}).items()
                     if not isinstance(v, (list, dict))})
        runs.append(line)
        if row is None or rec["status"] != "done":
            continue
        for key, value in m.items():
            parts = key.split(":")
            if parts[0] == "head":
                heads.append({"row": row, "seed": seed, "head": parts[1], "group": parts[2], "accuracy": value})
            elif parts[0] == "prior" and parts[2] == "all":
                shift.append({"row": row, "seed": seed, "prior": parts[1], "position": priors.index(parts[1]),
                              "accuracy": value})
            elif parts[0] == "set":
                sets.append({"row": row, "seed": seed, "test_set": parts[1], "group": parts[2], "accuracy": value})
        _per_class_lines(row, seed, _full_result(rec["dir"]), per_class, class_stats)
        _curve_lines(row, seed, rec["dir"], curves)
    cols = {"heads": ["row", "seed", "head", "group", "accuracy"],
            "shift": ["row", "seed", "prior", "position", "accuracy"],
            "test_sets": ["row", "seed", "test_set", "group", "accuracy"],
            "per_class": ["row", "seed", "class_index", "train_count", "group", "accuracy", "few_threshold",
                          "many_threshold"],
            "class_stats": ["row", "seed", "class_index", "train_count", "stat", "value"],
            "curves": ["row", "seed", "epoch"]}
    order = {label: i for i, label in enumerate(dict.fromkeys(label_of.values()))}  # table row order

    def frame(lines, name):
        df = pd.DataFrame(lines, columns=None if lines else cols[name])
        return df.assign(row_order=df["row"].map(order))

    return Frames(pd.DataFrame(runs), frame(heads, "heads"), frame(shift, "shift"), frame(sets, "test_sets"),
                  frame(per_class, "per_class"), frame(class_stats, "class_stats"), frame(curves, "curves"))
