"""``ltbench verify``: does a claim reproduce on these finished runs?

The rule (``judge``; its error rates are simulated in tests/test_claims.py and published in docs/claims.md):
an equivalence test at a declared margin (1 point unless the claim says otherwise). d = ours - claimed, with
the 90 % confidence interval of d (two one-sided tests at alpha = 0.05):

* REPRODUCED: the interval lies inside (-margin, +margin);
* NOT REPRODUCED: it lies wholly outside [-margin, +margin];
* INCONCLUSIVE: anything else, and whenever no spread can be estimated (one seed on each side, no
  reference spread): the runs cannot tell;
* UNTESTED: no finished run has the claim's configuration and protocol.

The interval: paired over seeds when the claim lists per-seed values of seeds the runs also have (at
least two); otherwise Welch's with the claim's spread over its seeds, or, for a claim of one seed (or of
unstated seeds, as papers print them), the runs' own spread standing in for the claim's, or a reference
spread the claim declares (``spread`` with ``spread_n`` seeds behind it). Beside each verdict: whether the
protocol matches exactly or approximately (the claim's protocol id, ltbench/results/protocol.py) and every
numerics field that differs from the claim's (CPU, threads, kernel environment: the records hold them).
No torch.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import namedtuple
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ltbench.config import value_text
from ltbench.errors import LtbenchError
from ltbench.results.protocol import SPLIT_LISTS, protocol_id, record_lists
from ltbench import report
from ltbench.report.claims import SETTING, Claim, claim_document, load_claims
from ltbench.report.rows import flatten
from ltbench.results import store
from ltbench.results.identity import NOT_RECORDED, identity_of, numerics_difference, numerics_value

MARGIN = 1.0  # points: the default equivalence margin
ALPHA = 0.05  # each one-sided test; the interval is the 90 % two-sided one
VERDICTS = ("REPRODUCED", "NOT REPRODUCED", "INCONCLUSIVE", "UNTESTED")
CORE = {"data.name": "dataset", "method.name": "method", "backbone.name": "backbone", "data.imb_factor": "imb_factor",
        "optim.epochs": "epochs"}


def judge(claimed: float, ours: list[float], margin: float = MARGIN, claim_sd: float | None = None, claim_n: int = 1,
          paired: list[float] | None = None, reference_sd: float | None = None, reference_n: int = 0
          ) -> tuple[str, float, float | None, float | None, str]:
    """(verdict, d, low, high, how the interval was made). ``paired``: the claim's values of the seeds ``ours``
    lists, in the same order (the paired interval when there are two or more)."""
    from scipy.special import stdtrit

    n = len(ours)
    mean = sum(ours) / n
    d = mean - claimed
    if paired is not None and n >= 2:
        diffs = [a - b for a, b in zip(ours, paired)]
        d = sum(diffs) / n
        se, df, how = _sd(diffs) / math.sqrt(n), n - 1, f"paired over {n} seeds"
    elif claim_sd is not None and claim_n >= 2 and n >= 2:
        va, vb = _sd(ours) ** 2 / n, claim_sd ** 2 / claim_n
        se = math.sqrt(va + vb)
        df = (va + vb) ** 2 / (va ** 2 / (n - 1) + vb ** 2 / (claim_n - 1)) if va + vb > 0 else float(n + claim_n - 2)
        how = f"Welch, {n} seeds against the claim's {claim_n}"
    elif n >= 2:
        se, df = _sd(ours) * math.sqrt(1 / n + 1 / claim_n), n - 1
        how = f"{n} seeds; their spread stands in for the claim's ({claim_n} seed{'s' * (claim_n > 1)})"
    elif reference_sd is not None and reference_n >= 2:
        se, df = reference_sd * math.sqrt(1 + 1 / claim_n), reference_n - 1
        how = f"1 seed; the claim's {'reference ' * (claim_n < 2)}spread ({reference_sd:.2f} over {reference_n} seeds)"
    else:
        return "INCONCLUSIVE", d, None, None, "one seed on each side and no reference spread: no spread to judge by"
    half = float(stdtrit(df, 1 - ALPHA)) * se if se > 0 else 0.0
    low, high = d - half, d + half
    if -margin < low and high < margin:
        return "REPRODUCED", d, low, high, how
    if low > margin or high < -margin:
        return "NOT REPRODUCED", d, low, high, how
    return "INCONCLUSIVE", d, low, high, how


def _sd(values: list[float]) -> float:
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


@dataclass
class Group:
    """The finished runs of one configuration (everything that enters the run id but the seed)."""

    flat: dict
    runs: dict = field(default_factory=dict)  # seed -> summary record

    @property
    def protocol(self) -> str:
        """From the configuration; for split-list data, with the list digests the first result recorded."""
        if self.flat.get("data.name") not in SPLIT_LISTS:
            return protocol_id(self.flat)
        first = next(iter(self.runs.values()))
        return protocol_id(self.flat, record_lists(store.check_result(Path(first["dir"])).result or {}))

    def values(self, metric: str) -> dict:
        key = metric if metric in ("many", "medium", "few", "all") else f"prior:{metric}:all"
        return {s: 100.0 * r["metrics"][key] for s, r in sorted(self.runs.items(), key=lambda x: str(x[0]))
                if isinstance((r.get("metrics") or {}).get(key), (int, float))}


def groups_of(records: list[dict]) -> list[Group]:
    out: dict[str, Group] = {}
    for rec in records:  # stage-2 results (config.posthoc) are another question: not claims of a training run
        if rec.get("status") != "done" or not isinstance(rec.get("config"), dict) or "posthoc" in rec["config"]:
            continue
        flat = {k: v for k, v in flatten(identity_of(rec["config"])).items() if k != "seed"}
        out.setdefault(json.dumps(flat, sort_keys=True, default=str), Group(flat)).runs.setdefault(rec.get("seed"), rec)
    return list(out.values())


def selects(claim: Claim, flat: dict) -> bool:
    """The claim's configuration: its setting, and each of its settings (a bare name is a method option)."""
    for key, name in CORE.items():
        want = getattr(claim, name)
        if name == "imb_factor" and want is None and key not in flat:
            continue
        if want is None or value_text(flat.get(key, "<absent>")) != value_text(want):
            return False
    return all(value_text(flat.get(k if "." in k else f"method.{k}", "<absent>")) == value_text(v)
               for k, v in claim.settings.items())


Row = namedtuple("Row", "verdict claim source metric claimed ours d interval rule protocol numerics implementation")


def verify(claims: list[Claim], records: list[dict], margin: float | None = None) -> list[Row]:
    groups = groups_of(records)
    rows: list[Row] = []
    for c in claims:
        found = [g for g in groups if selects(c, g.flat)]
        same = [g for g in found if not c.protocol_id or g.protocol == c.protocol_id]
        if not same:
            why = (f"runs of this configuration use protocol {found[0].protocol}" if found else "no finished run")
            rows.append(Row("UNTESTED", c.path, _cite(c), ", ".join(c.metrics), None, why, None, "", "",
                            f"{c.protocol_id or 'unknown'} ({c.protocol_match})", "", c.implementation))
        for g in same:
            for metric, claimed in c.metrics.items():
                rows.append(_judged(c, g, metric, claimed, c.margin if margin is None else margin))
    order = {v: i for i, v in enumerate(VERDICTS)}
    return sorted(rows, key=lambda r: order[r.verdict])


def _judged(c: Claim, g: Group, metric: str, claimed: float, margin: float) -> Row:
    by_seed = g.values(metric)
    protocol = f"{c.protocol_id or 'unknown'} ({c.protocol_match if c.protocol_id else 'unknown'})"
    if not by_seed:
        return Row("UNTESTED", c.path, _cite(c), metric, claimed, f"{metric} not recorded", None, "", "", protocol, "",
                   c.implementation)
    seeds, ours = list(by_seed), list(by_seed.values())
    per = dict(zip(c.seeds or [], c.per_seed.get(metric, [])))
    paired = [per[s] for s in seeds] if per and all(s in per for s in seeds) else None
    n_claim = len(c.seeds) if c.seeds else 1
    sd = c.spread.get(metric)
    verdict, d, low, high, how = judge(claimed, ours, margin if margin is not None else MARGIN,
                                       sd if n_claim >= 2 else None, n_claim, paired,
                                       sd, c.spread_n if n_claim < 2 else n_claim)
    mean = sum(ours) / len(ours)
    text = f"{mean:.2f}" + (f" ± {_sd(ours):.2f}" if len(ours) > 1 else "") + f" (n={len(ours)}, seeds {', '.join(map(str, seeds))})"
    interval = "" if low is None else f"[{low:+.2f}, {high:+.2f}] vs ±{margin if margin is not None else MARGIN:g}"
    return Row(verdict, c.path, _cite(c), metric, claimed, text, round(d, 4), interval, how, protocol,
               _numerics(c.numerics, [r.get("numerics") or {} for r in g.runs.values()]), c.implementation)


def _cite(c: Claim) -> str:
    return f"{c.source}: {c.label or c.method}" + (f" ({', '.join(f'{k}={v}' for k, v in c.settings.items())})" if c.settings and c.kind != "reference" else "")


def _numerics(claimed: dict, ours: list[dict]) -> str:
    """Every numerics field of the runs that differs from the claim's, or that one side did not record."""
    if not claimed:
        return "claim's numerics not recorded"
    parts: list[str] = []
    for n in ours:
        differ, unknown = numerics_difference(n, claimed)
        parts += [f"{numerics_value(f, n.get(f))} (claim: {numerics_value(f, claimed.get(f))})" for f in differ]
        parts += [f"{f} not recorded" + (" by the claim" if n.get(f) not in (None, NOT_RECORDED) else "") for f in unknown]
    return "; ".join(dict.fromkeys(parts)) or "same numerics"


def render(rows: list[Row], fmt: str = "markdown") -> str:
    if fmt == "json":
        return json.dumps([r._asdict() for r in rows], indent=1)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(Row._fields)
        writer.writerows(rows)
        return out.getvalue()
    if fmt == "lines":  # one line per judged number (make quickstart prints these)
        return "\n".join(f"{r.source} {r.metric}: ours {r.ours} against {r.claimed:.2f}: {r.verdict} (Δ {r.d:+.2f}, 90 % CI "
                         f"{r.interval or 'none'}; {r.rule}); numerics: {r.numerics}" for r in rows if r.d is not None) \
            or "no claim of these runs' configuration and protocol was tested (every claim UNTESTED)"
    counts = {v: sum(r.verdict == v for r in rows) for v in VERDICTS}
    lines = ["| verdict | claim | source | metric | claimed | ours | Δ, 90 % CI | protocol | numerics | implementation |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        claimed = "" if r.claimed is None else f"{r.claimed:.2f}"
        delta = "" if r.d is None else f"{r.d:+.2f} {r.interval} ({r.rule})"
        lines.append(f"| {r.verdict} | {r.claim} | {r.source} | {r.metric} | {claimed} | {r.ours} | {delta} | "
                     f"{r.protocol} | {r.numerics} | {r.implementation} |")
    return ("\n".join(lines) + "\n\n" + ", ".join(f"{n} {v}" for v, n in counts.items()) + f" ({len(rows)} rows). Rule: "
            "REPRODUCED when the 90 % interval of Δ = ours − claimed lies inside ± the margin (two one-sided tests, "
            "α = 0.05), NOT REPRODUCED when it lies outside, INCONCLUSIVE otherwise (docs/claims.md).")


def export(records: list[dict], folder: Path, cite: str, kind: str = "user") -> list[Path]:
    """Each configuration of these finished runs as a claim file under ``folder`` (ready to send upstream)."""
    written = []
    for i, g in enumerate(groups_of(records), 1):
        first = next(iter(g.runs.values()))
        setting = {name: g.flat.get(key) for key, name in CORE.items() if g.flat.get(key) is not None}
        seeds = sorted(g.runs, key=str)
        metrics = [m for m in ("many", "medium", "few", "all") if len(g.values(m)) == len(seeds)]
        per_seed = {m: list(g.values(m).values()) for m in metrics}
        claim = Claim(**{k: setting.get(k) for k in SETTING}, kind=kind, source=cite,
                      label=str(g.flat.get("method.name")),
                      metrics={m: sum(v) / len(v) for m, v in per_seed.items()}, seeds=seeds, per_seed=per_seed,
                      spread={m: round(_sd(v), 4) for m, v in per_seed.items() if len(v) > 1},
                      settings={k: v for k, v in g.flat.items() if k not in CORE},
                      protocol_id=g.protocol, protocol_match="exact", numerics=first.get("numerics") or {},
                      implementation=f"ltbench at commit {(first.get('prov') or {}).get('git_commit') or 'not recorded'}")
        path = Path(folder) / f"{i:03d}-{setting.get('method')}-{first.get('run_id', '')}.yaml"
        store.make_dirs(path.parent)
        store.atomic_write_bytes(path, yaml.safe_dump(claim_document(claim), sort_keys=False, allow_unicode=True,
                                                      width=200).encode())
        written.append(path)
    return written


def command(args) -> int:
    """``ltbench verify PATH [--claims DIR] [--format F] [--margin M] [--export DIR]``."""
    if args.margin is not None and not args.margin > 0:
        raise LtbenchError(f"--margin {args.margin}: expected a positive number of points, e.g. --margin 1")
    records, _, root = report.source(args.path, args.results, True, args.overrides)
    if args.export:
        written = export(records, Path(args.export), cite=f"ltbench runs in {root}")
        print(f"{len(written)} claim file(s) written to {args.export} (one per configuration of the finished runs)")
        return 0
    print(render(verify(load_claims(Path(args.claims) if args.claims else None), records, args.margin), args.format))
    return 0
