"""``ltbench report RECIPE``: ``results/<recipe>/report/`` with every declared table as md/tex/csv,
a standalone LaTeX document of all tables, every figure (PNG and PDF), and ``report.md`` showing them
together with a provenance summary (commits, versions, devices, wall time, runs failed or missing).

Figures are drawn by ``ltbench.plots`` from the tidy frames of ``ltbench.report.load``; a figure
whose data the runs do not have (no shifted priors, no per-class kappa, no log) is skipped and the
report says so.
"""

from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path

from ltbench import plots, report, store
from ltbench.report.formats import latex_document, render

FIGURES = {  # kind -> (frame, plotting function, keyword arguments, what it shows)
    "per_class": ("per_class", "plot_per_class", {}, "per-class accuracy against training count"),
    "kappa": ("class_stats", "plot_class_stat", {"stat": "kappa"},
              "per-class statistics the runs record (BAPE's κ, classifier weight norms) against training count"),
    "shift": ("shift", "plot_shift", {}, "accuracy from forward through uniform to backward test priors"),
    "curves": ("curves", "plot_curves", {"y": "loss"}, "training loss per epoch"),
}
# The files a kind writes, as glob patterns without the extension: 'kappa' writes one figure per recorded
# statistic, each named by it (kappa, weight_norm, aux_weight_norm), never 'kappa' for a weight norm.
FIGURE_FILES = {"kappa": ("kappa", "*weight_norm")}


def draw(kind: str, frames, out_base: Path) -> tuple[list[str], str | None]:
    """Draw one kind of figure; returns (written paths, reason when nothing was drawn)."""
    frame_name, func_name, kwargs, _ = FIGURES[kind]
    df = frames[frame_name]
    if kind == "kappa":  # BAPE's kappa, and beside it the per-class weight norms LA / cosine heads record
        return _class_stats(plots, df, out_base, _study_rows(frames))
    if df.empty:
        return [], f"no data for the {kind} figure in these runs"
    out_base.parent.mkdir(parents=True, exist_ok=True)
    return [str(p) for p in getattr(plots, func_name)(df, str(out_base), **kwargs)], None


def _class_stats(plots, df, out_base: Path, all_rows: list[str]) -> tuple[list[str], str | None]:
    """One figure per recorded statistic, each file named by what it draws (``weight_norm.png`` in a study
    without BAPE, never ``kappa``); rows that do not record the statistic are named in the figure."""
    stats = [] if df.empty else sorted(set(df["stat"]))
    wanted = [s for s in stats if s == "kappa"] + [s for s in stats if s.endswith("weight_norm")]
    if not wanted:
        return [], "no data for the kappa figure in these runs (no kappa or per-class weight norms recorded)"
    out_base.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for stat in wanted:
        base = out_base.with_name(stat.replace(".", "_"))
        paths += [str(p) for p in plots.plot_class_stat(df[df["stat"] == stat], str(base), stat=stat,
                                                        all_rows=all_rows)]
    return paths, None


def _study_rows(frames) -> list[str]:
    """Every row of the study with a finished run, in table order (for 'not drawn: ...' notes)."""
    runs = frames["runs"]
    if runs.empty or "row" not in runs.columns:
        return []
    done = runs[(runs["status"] == "done") & runs["row"].notna()]
    return list(dict.fromkeys(done["row"]))


def provenance_summary(records: list[dict]) -> list[str]:
    prov = [r.get("prov") or {} for r in records if r.get("status") == "done"]
    commits = Counter(f"{p.get('git_commit', '?')[:12]}{' (dirty)' if p.get('git_dirty') else ''}" for p in prov)
    lines = [f"- runs found: {store.format_counts(store.count_statuses(r['status'] for r in records)) or 'none'}",
             f"- code commits: {', '.join(f'{c} ({n} runs)' for c, n in commits.most_common()) or 'unknown'}"]
    for key, title in (("ltbench_version", "ltbench"), ("torch", "torch"), ("python", "python"),
                       ("device", "devices"), ("gpu_name", "GPUs"), ("hostname", "hosts")):
        values = Counter(str(p[key]) for p in prov if p.get(key) is not None)
        if values:
            lines.append(f"- {title}: {', '.join(f'{v} ({n})' for v, n in values.most_common())}")
    wall = sum(float(p.get("wall_seconds") or 0) for p in prov)
    lines.append(f"- wall time of the finished runs: {wall / 3600:.2f} h in total")
    return lines


def _write(path: Path, text: str) -> None:
    store.atomic_write_bytes(path, text.encode())


def write_report(recipe_path, results=None, test: str | None = "welch", overrides=(), use_cache: bool = True) -> Path:
    records, recipe, root = report.source(recipe_path, results, use_cache, overrides=overrides)
    if recipe is None:
        raise report.LtbenchError(f"{recipe_path}: 'ltbench report' needs a recipe file")
    out = store.ensure_writable(Path(root) / "report")
    built = report.tables(recipe_path, results, test=test, overrides=overrides, use_cache=use_cache)
    command = "ltbench table " + " ".join(shlex.quote(str(a)) for a in [recipe_path, *overrides])
    md = [f"# Report: {recipe.name}", "", f"Recipe `{recipe_path}`; results in `{root}`.", "", "## Tables", ""]
    fragments = []
    for t in built:
        for fmt, ext in (("markdown", "md"), ("latex", "tex"), ("csv", "csv")):
            _write(out / f"{t.name}.{ext}", render(t, fmt) + "\n")
        fragments.append(render(t, "latex"))
        md += [f"### {t.name}", "", f"`{command} --table {t.name}` (also [{t.name}.tex]({t.name}.tex), "
               f"[{t.name}.csv]({t.name}.csv))", "", render(t, "markdown"), ""]
    _write(out / "tables_document.tex", latex_document(fragments))
    md += ["## Figures", ""]
    frames = report.load(recipe_path, results, overrides=overrides)
    for kind, (_, _, _, what) in FIGURES.items():
        paths, reason = draw(kind, frames, out / "figures" / kind)
        if paths:
            png = [p for p in paths if p.endswith(".png")]
            md += [f"**{kind}**: {what} (`ltbench plot {recipe_path} --kind {kind}`)", "",
                   *(f"![{kind}](figures/{Path(p).name})" for p in png), ""]
        else:
            md += [f"**{kind}**: not drawn: {reason}.", ""]
    md += ["## Provenance", "", *provenance_summary(records), ""]
    _write(out / "report.md", "\n".join(md))
    return out
