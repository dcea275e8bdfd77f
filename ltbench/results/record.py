"""result.json, assembled in one place. Every field is documented in docs/results-schema.md.

A record has three parts, always in this order: the header (what ran: known before training), the
outcome (``TrainOutcome`` when the run is done, the error when it failed), and the wall-clock end.
The worker (``ltbench.runner``) gathers the header, the engine measures the outcome; both hand their
parts here. No torch: the schema is readable without the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ltbench import registry
from ltbench.results import identity, schema
from ltbench.results.code import CODE_SCOPE
from ltbench.results.provenance import portable
from ltbench.results.runspec import RunSpec


@dataclass
class TrainOutcome:
    """What ``engine.train`` measured (the fields of a done record after 'status')."""

    metrics: dict  # test metrics: ltbench.evaluation.summarize plus heads/target_priors/test_sets
    selection: dict  # ltbench.train.selection.select_model
    method_extras: dict  # Method.result_extras()
    data: dict  # data_record(): the data the run actually saw
    train_seconds_this_session: float
    # the run's cost: seconds of every session up to this result (those kept in its checkpoint plus this one's)
    # times the devices it ran on; what a killed session did after its last checkpoint is redone and not counted
    device_seconds: float
    run_started: float  # wall-clock start of the run's first session (kept in its checkpoint): bounds its cost
    threads: int
    device: str
    world_size: int
    views: list
    numerics: dict  # provenance.numerics: device, CPU/GPU model, effective threads, versions, flags
    parameters: dict = field(default_factory=dict)  # train.engine.parameter_counts: backbone, method, total, trainable


def data_record(data) -> dict:
    """The 'data' section from an ``LTData`` (class counts, subset hash, names, dataset info, and the
    validation split's counts when there is one)."""
    out = {
        "num_classes": data.num_classes,
        "class_counts_train": [int(c) for c in data.class_counts],
        "class_counts_test": [int(c) for c in data.test_counts],
        "subset_hash": data.subset_hash,
        "class_names": data.class_names,
        "info": data.info,
    }
    val = getattr(data, "val_counts", None)
    if val is not None:
        out["class_counts_val"] = [int(c) for c in val]
    return out


def plugin_sources(config: dict) -> dict:
    """Where the run's dataset, backbone and method plugins came from (registry entry sources)."""
    names = (config["method"]["name"], config["data"]["name"], config["backbone"]["name"],
             config["sampler"]["name"])
    return {e.name: e.source for reg in registry.REGISTRIES.values() for e in reg.entries() if e.name in names}


def method_display(config: dict) -> str:
    """'LDAM-DRW': the display name the run's method declares (its registration), else its name: how tables
    label its rows, recorded here because table code never imports a method (torch)."""
    return registry.METHODS.entry(config["method"]["name"]).display or config["method"]["name"]


def header(spec: RunSpec, *, started: float, provenance: dict, code: dict) -> dict:
    """The fields known before training starts (plugins must already be discovered)."""
    return {
        "schema_version": schema.SCHEMA_VERSION, "identity_version": identity.IDENTITY_VERSION,
        "run_id": spec.run_id,
        "recipe": spec.recipe,
        "grid": spec.grid,
        "config": spec.config,
        "seed": spec.seed,
        "plugins": plugin_sources(spec.config),
        "method_display": method_display(spec.config),
        "unrecorded": [],  # schema 3: every field is recorded (a migrated record lists those it never had)
        "kind": None,  # a run (a stage-2 result: 'posthoc')
        "code": code,
        "code_source": None,
        "code_scope": CODE_SCOPE,
        "provenance": provenance,
        "started": started,
    }


def done(record: dict, outcome: TrainOutcome) -> None:
    record.update(status="done", **{f.name: getattr(outcome, f.name) for f in fields(outcome)})


def failed(record: dict, exc: BaseException, traceback_text: str | None = None) -> None:
    """A failure: LtbenchError messages stand alone; other exceptions keep their type and traceback."""
    record["traceback_file"] = None  # the worker names the file when it writes one
    if traceback_text is None:
        record.update(status="failed", error=str(exc), error_type=type(exc).__name__)
    else:
        record.update(status="failed", error=f"{type(exc).__name__}: {exc}", error_type=type(exc).__name__,
                      traceback=traceback_text)


def finish(record: dict, ended: float) -> dict:
    """The end time, and every machine path made portable (the configuration keeps what the user typed)."""
    record["ended"] = ended
    record["wall_seconds"] = ended - record["started"]
    record.update({k: v if k == "config" else portable(v) for k, v in record.items()})
    return record
