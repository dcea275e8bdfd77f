"""Paper-style tables from result files: pandas to group, tabulate to print. Never imports torch.

A row is a (dataset, imbalance factor, backbone, method variant); a cell is the mean over seeds
± the sample standard deviation (ddof=1), in percent; ``n`` counts the seeds. The best mean per
column is bold. Failed runs are left out and counted in a footnote.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from ltbench import store
from ltbench.errors import LtbenchError
from ltbench.recipe import run_label

METRICS = ("many", "medium", "few", "all")
HEADERS = {"many": "Many", "medium": "Medium", "few": "Few", "all": "All"}
ROW_KEYS = ("dataset", "imb_factor", "backbone", "method")


def collect(root: Path) -> pd.DataFrame:
    """One row per result.json below ``root``: keys, status and the headline metrics (fractions)."""
    rows = []
    for r in store.iter_results(Path(root)):
        data = r.get("config", {}).get("data", {})
        metrics = (r.get("metrics") or {})
        row = {
            "recipe": r.get("recipe"),
            "run_id": r.get("run_id"),
            "status": r.get("status"),
            "dataset": data.get("name"),
            "imb_factor": data.get("imb_factor"),
            "backbone": r.get("config", {}).get("backbone", {}).get("name"),
            "method": run_label(r),
            "seed": r.get("seed"),
            "subset_hash": (r.get("data") or {}).get("subset_hash"),
            "wall_seconds": r.get("wall_seconds"),
        }
        for m in METRICS:
            row[m] = metrics.get(m)
        for head, values in (metrics.get("heads") or {}).items():
            for m in METRICS:
                row[f"{head}:{m}"] = values.get(m)
        for prior, values in (metrics.get("target_priors") or {}).items():
            row[f"prior:{prior}"] = values.get("all")
        for name, values in (metrics.get("test_sets") or {}).items():
            row[f"set:{name}"] = values.get("all")
        rows.append(row)
    return pd.DataFrame(rows)


def with_heads(df: pd.DataFrame, pattern: str) -> pd.DataFrame:
    """Add one row per run and per head whose name matches ``pattern`` (fnmatch, comma-separated
    alternatives allowed), labelled 'method · head': e.g. every distribution-adjustment mode of BAPE."""
    import fnmatch

    patterns = [p.strip() for p in pattern.split(",") if p.strip()]
    heads = sorted({c.split(":", 1)[0] for c in df.columns if ":" in c and not c.startswith(("prior:", "set:"))})
    chosen = [h for h in heads if any(fnmatch.fnmatch(h, p) for p in patterns)]
    if not chosen:
        raise LtbenchError(f"no head matches '{pattern}'; heads in these results: {', '.join(heads) or '(none)'}")
    parts = [df]
    for head in chosen:
        part = df[df[f"{head}:all"].notna()].copy()
        for m in METRICS:
            part[m] = part.get(f"{head}:{m}")
        part["method"] = part["method"] + " · " + head
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def aggregate(df: pd.DataFrame, metrics=METRICS) -> pd.DataFrame:
    """Mean, std (ddof=1) and n over seeds for each row key; only runs with status 'done'."""
    done = df[df["status"] == "done"].copy()
    if done.empty:
        return pd.DataFrame()
    keys = [k for k in ROW_KEYS if k in done.columns]
    done[keys] = done[keys].fillna("-")
    values = done[keys + [m for m in metrics if m in done.columns]].copy()
    for m in metrics:
        if m in values:
            values[m] = pd.to_numeric(values[m], errors="coerce") * 100.0
    grouped = values.groupby(keys, sort=False, dropna=False)
    out = grouped.agg(["mean", "std", "count"])
    out.columns = [f"{m}_{stat}" for m, stat in out.columns]
    out["n"] = grouped.size()
    return out.reset_index()


def _cell(mean: float, std: float, n_valid: int, digits: int, latex: bool) -> str:
    if n_valid == 0 or mean is None or math.isnan(mean):
        return "–" if not latex else "--"
    text = f"{mean:.{digits}f}"
    if n_valid > 1 and not math.isnan(std):
        text += (r" $\pm$ " if latex else " ± ") + f"{std:.{digits}f}"
    return text


def _bold(text: str, latex: bool) -> str:
    return rf"\textbf{{{text}}}" if latex else f"**{text}**"


def _latex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("_", r"\_"), ("%", r"\%"), ("&", r"\&"), ("#", r"\#")):
        text = text.replace(a, b)
    return text


def table(df: pd.DataFrame, fmt: str = "markdown", digits: int = 2, metrics=METRICS) -> str:
    """Render the aggregated table as markdown, latex or csv."""
    agg = aggregate(df, metrics)
    if agg.empty:
        raise LtbenchError("no finished runs to tabulate (none with status 'done')")
    if fmt == "csv":
        return agg.to_csv(index=False, float_format=f"%.{digits + 2}f")
    latex = fmt == "latex"
    keys = [k for k in ROW_KEYS if k in agg.columns and (k == "method" or agg[k].nunique() > 1)]
    best = {m: agg[f"{m}_mean"].max() for m in metrics if f"{m}_mean" in agg}
    rows = []
    for _, r in agg.iterrows():
        row = [(_latex_escape(str(r[k])) if latex else str(r[k])) for k in keys]
        for m in metrics:
            if f"{m}_mean" not in agg:
                row.append("--" if latex else "–")
                continue
            text = _cell(r[f"{m}_mean"], r[f"{m}_std"], int(r[f"{m}_count"]), digits, latex)
            if len(agg) > 1 and not math.isnan(r[f"{m}_mean"]) and abs(r[f"{m}_mean"] - best[m]) < 1e-9:
                text = _bold(text, latex)
            row.append(text)
        row.append(str(int(r["n"])))
        rows.append(row)
    headers = [k.replace("_", " ").capitalize() for k in keys] + [HEADERS.get(m, m) for m in metrics] + ["n"]
    if latex:
        body = tabulate(rows, headers=headers, tablefmt="latex_raw", colalign=["left"] * len(keys) + ["right"] * (len(headers) - len(keys)))
        return _booktabs(body)
    text = tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)
    failed = int((df["status"] == "failed").sum())
    running = int((~df["status"].isin(["done", "failed"])).sum())
    notes = ["Top-1 accuracy (%), mean ± sample std (ddof=1) over n seeds"]
    if failed:
        notes.append(f"{failed} failed run(s) left out")
    if running:
        notes.append(f"{running} unfinished run(s) left out")
    return text + "\n\n" + "; ".join(notes) + "."


def _booktabs(body: str) -> str:
    """tabulate's latex_raw uses \\hline; turn the three rules into booktabs ones."""
    lines = body.splitlines()
    rules = [i for i, line in enumerate(lines) if line.strip() == r"\hline"]
    names = [r"\toprule", r"\midrule", r"\bottomrule"]
    for i, name in zip(rules, names if len(rules) == 3 else names[:1] + names[1:2] * (len(rules) - 2) + names[2:]):
        lines[i] = name
    return "\n".join(lines)
