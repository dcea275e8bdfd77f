"""Claims: one YAML file per number someone says a method reaches, with where it was said and under what.

A claim holds its source, setting, numbers (percent; seeds and spread when known), protocol id (exact or
approximate), implementation and, for numbers made here, numerics (layout and sources: docs/claims.md). The
shipped claims are in ``ltbench/claims/``, ordered by path (a table that shows several uses the first for its
delta); ``ltbench verify`` judges them and tables show them as reference rows. No torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ltbench.errors import LtbenchError
from ltbench.results import store
from ltbench.priors import is_prior_name
from ltbench.results.schema import SHOT_GROUPS

KEYS = {"source", "setting", "settings", "metrics", "seeds", "per_seed", "spread", "spread_n", "protocol",
        "implementation", "numerics", "note", "margin"}
SETTING = ("method", "dataset", "imb_factor", "backbone", "epochs")
KINDS = ("paper", "code", "listing", "reference", "user")
NO_OFFICIAL_CODE = "no official code; ltbench re-implementation"


@dataclass(frozen=True)
class Claim:
    """One claim file. ``metrics``: percent by metric (``many`` ... ``all``, or a shifted prior such as
    ``forward50``); ``per_seed``: metric -> the value of each of ``seeds``; ``spread``: metric -> sample std
    over seeds (for a claim of one seed, a reference spread over ``spread_n`` seeds); ``settings``: method options
    (bare names) or dotted configuration keys its runs have; ``numerics``: the recorded numerics of the runs behind a number made with ltbench."""

    method: str
    dataset: str
    imb_factor: float | None
    backbone: str
    epochs: int | None
    metrics: dict[str, float]
    source: str  # the citation, e.g. "BAPE paper, Table 1"
    kind: str = "paper"
    label: str = ""  # the row as printed in the source
    note: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    quote: str = ""
    column: str = ""
    protocol_id: str = ""
    protocol_match: str = "approximate"
    implementation: str = ""
    seeds: list | None = None
    per_seed: dict[str, list[float]] = field(default_factory=dict)
    spread: dict[str, float] = field(default_factory=dict)
    spread_n: int = 0  # a one-seed claim's reference spread: the seeds it was measured over
    numerics: dict = field(default_factory=dict)
    margin: float | None = None
    path: str = ""


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def is_metric(key: str) -> bool:
    return key in (*SHOT_GROUPS, "all") or is_prior_name(key)


def load_claims(folder: Path | None = None) -> list[Claim]:
    """Every claim below ``folder`` (the shipped ``ltbench/claims`` unless given), in path order, validated."""
    folder = Path(folder) if folder is not None else Path(str(resources.files("ltbench") / "claims"))
    if not folder.is_dir():
        raise LtbenchError(f"{folder}: no such claims folder (--claims DIR: a folder of claim YAML files)")
    return [read_claim(p, p.relative_to(folder).as_posix()) for p in sorted(folder.rglob("*.yaml"))]


def read_claim(path: Path, name: str = "") -> Claim:
    try:
        doc = yaml.safe_load(store.read_bounded(path, store.MiB, follow=True).decode("utf-8"))
    except (OSError, store.UnusableFile, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise LtbenchError(f"{path}: cannot read claim ({exc})") from None

    def need(ok, text: str) -> None:
        if not ok:
            raise LtbenchError(f"{path}: {text}")

    need(isinstance(doc, dict) and not set(doc) - KEYS and {"source", "setting", "metrics"} <= set(doc),
         f"expected a mapping with source, setting, metrics (and optionally {', '.join(sorted(KEYS))}); see docs/claims.md")
    src, setting, metrics, proto = doc["source"], doc["setting"], doc["metrics"], doc.get("protocol") or {}
    need(isinstance(src, dict) and src.get("cite") and src.get("kind", "paper") in KINDS,
         f"source must be a mapping with 'cite' and a kind among {', '.join(KINDS)}")
    need(isinstance(setting, dict) and not set(setting) - set(SETTING), f"setting: expected keys among {', '.join(SETTING)}")
    for key in ("method", "dataset", "backbone"):
        need(isinstance(setting.get(key), str) and setting[key], f"setting.{key} must be a non-empty name")
    need(isinstance(metrics, dict) and metrics, "metrics must map metric names to percentages")
    for metric, value in metrics.items():
        need(isinstance(metric, str) and is_metric(metric),
             f"unknown metric {metric!r}; use many, medium, few, all, forward<rho>, uniform or backward<rho>")
        need(_number(value) and 0 <= value <= 100, f"{setting['method']} {metric} = {value!r} is not a percentage in [0, 100]")
    imb, epochs = setting.get("imb_factor"), setting.get("epochs")
    need(imb is None or _number(imb) and imb >= 1, f"setting.imb_factor must be a number >= 1 or null, got {imb!r}")
    need(epochs is None or _number(epochs) and isinstance(epochs, int) and epochs >= 1,
         f"setting.epochs must be a positive integer or null, got {epochs!r}")
    seeds, per_seed = doc.get("seeds"), doc.get("per_seed") or {}
    need(all(isinstance(v, list) and seeds is not None and len(v) == len(seeds) for v in per_seed.values()),
         "per_seed must give one value per seed listed in 'seeds'")
    need(doc.get("margin") is None or _number(doc["margin"]) and doc["margin"] > 0, "margin must be a positive number of points")
    need(isinstance(doc.get("settings") or {}, dict) and proto.get("match", "approximate") in ("exact", "approximate"),
         "settings must be a mapping of method options; protocol.match exact or approximate")
    return Claim(method=setting["method"], dataset=setting["dataset"], imb_factor=None if imb is None else float(imb),
                 backbone=setting["backbone"], epochs=epochs, metrics={k: float(v) for k, v in metrics.items()},
                 source=str(src["cite"]), kind=src.get("kind", "paper"), label=str(src.get("row", "")),
                 note=str(doc.get("note", "")), settings=dict(doc.get("settings") or {}), quote=str(src.get("quote", "")),
                 column=str(src.get("column", "")), protocol_id=str(proto.get("id", "")),
                 protocol_match=proto.get("match", "approximate"), implementation=str(doc.get("implementation", "")),
                 seeds=seeds, per_seed={k: [float(x) for x in v] for k, v in per_seed.items()},
                 spread={k: float(v) for k, v in (doc.get("spread") or {}).items()}, spread_n=int(doc.get("spread_n") or 0), numerics=doc.get("numerics") or {},
                 margin=doc.get("margin"), path=name or str(path))


def claim_document(c: Claim) -> dict:
    """A claim as its file holds it (``ltbench verify --export``)."""
    setting = {k: getattr(c, k) for k in SETTING if getattr(c, k) is not None}
    doc = {"source": {k: v for k, v in (("kind", c.kind), ("cite", c.source), ("row", c.label), ("column", c.column),
                                        ("quote", c.quote)) if v},
           "setting": setting, "settings": c.settings, "metrics": c.metrics, "seeds": c.seeds, "per_seed": c.per_seed,
           "spread": c.spread, "spread_n": c.spread_n, "protocol": {"id": c.protocol_id, "match": c.protocol_match},
           "implementation": c.implementation, "numerics": c.numerics, "note": c.note, "margin": c.margin}
    return {k: v for k, v in doc.items() if v not in (None, "", {}, [], 0)}


def match(claims: list[Claim], *, dataset: str, imb_factor: float | None = None, backbone: str | None = None,
          epochs: int | None = None, method: str | None = None) -> list[Claim]:
    """Claims for this setting, in path order. ``None`` means "any value"; a claim whose own field is unknown
    (null) never matches a given value: a number of unstated schedule is no evidence about a 200-epoch run."""
    wanted = {"imb_factor": None if imb_factor is None else float(imb_factor), "backbone": backbone,
              "epochs": epochs, "method": method}
    return [c for c in claims if c.dataset == dataset
            and all(value is None or getattr(c, name) == value for name, value in wanted.items())]
