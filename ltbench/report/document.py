"""``ltbench report RECIPE``: ``results/<recipe>/report/`` with every declared table as md/tex/csv,
a standalone LaTeX document of all tables, every figure (PNG and PDF, sized for a column or the text
width), and ``report.md`` and ``report.html`` showing them together with their captions, the runs and a
provenance summary (commits, versions, devices, wall time, runs failed or missing). report.html is
self-contained (``ltbench.report.html``).

Figures are drawn by ``ltbench.report.plots`` from the tidy frames of ``ltbench.report.load``; a figure
whose data the runs do not have (no shifted priors, no per-class statistics, no log) is skipped and
the report says so.
"""

from __future__ import annotations

import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ltbench import report
from ltbench.results import store
from ltbench.registry import lookup
from ltbench.report.formats import latex_document, render
from ltbench.report.html import FigureShown, report_html

@dataclass(frozen=True)
class FigureKind:
    """One kind of figure: the frame it draws from, how, and what it shows (the report's caption)."""

    frame: str
    draw: Callable[..., "Drawn"]  # (plots module, frame, out_base, study rows, size) -> Drawn
    what: str


@dataclass
class Drawn:
    """What drawing a kind wrote: the files, each figure's caption by file stem, or why nothing was drawn."""

    paths: list[str]
    reason: str | None = None
    captions: dict[str, str] = field(default_factory=dict)


def _one_figure(function: str, needs: str = "", **options):
    """A kind drawn by one ``plots.figure_*`` function into ``out_base``; an empty frame is said, not drawn,
    with what would produce its data (``needs``)."""

    def draw(plots, df, out_base: Path, all_rows, size: str) -> Drawn:
        if df.empty:
            return Drawn([], f"no data for the {out_base.name} figure in these runs" + (f": {needs}" if needs else ""))
        store.make_dirs(out_base.parent)
        figure = getattr(plots, function)(df, size=size, **options)
        paths = plots.save_figure(figure, str(out_base))
        return Drawn([str(p) for p in paths], None, {out_base.name: plots.caption(figure)})

    return draw


def _class_stats(plots, df, out_base: Path, all_rows, size: str) -> Drawn:
    """One figure per recorded per-class statistic the plots draw by default (``plots.DRAWN_CLASS_STATS``),
    each file named by it beside ``out_base``."""
    store.make_dirs(out_base.parent)
    paths, reason, captions = plots.plot_class_stats(df, out_base.parent, all_rows, size=size)
    return Drawn([str(p) for p in paths], reason, captions)


def _search(plots, df, out_base: Path, all_rows, size: str) -> Drawn:
    """A search's figure from its trial runs' results (plots.search_frame), or why there is none."""
    trials = plots.search_frame(df)
    if trials.empty:
        return Drawn([], "no finished trial run of a search in these runs (a recipe with search:, docs/tuning.md)")
    return _one_figure("figure_search")(plots, trials, out_base, all_rows, size)


FIGURES = {  # kind -> FigureKind; looked up by ``figure_kind`` (one rule, did-you-mean)
    "per_class": FigureKind("per_class", _one_figure("figure_per_class"), "per-class accuracy against training count"),
    "class_stats": FigureKind("class_stats", _class_stats, "per-class statistics the runs record (a vMF "
                              "concentration κ, classifier weight norms) against training count"),
    "shift": FigureKind("shift", _one_figure("figure_shift", needs=(
        "it needs accuracies under shifted test priors, which runs record when their recipe sets "
        "eval.target_priors (e.g. [forward50, forward10, uniform, backward10, backward50]) or eval.test_sets; "
        "they are part of the run id, so 'ltbench run' then trains those runs (docs/recipes.md)")), "accuracy from forward through uniform to backward test priors"),
    "curves": FigureKind("curves", _one_figure("figure_curves", y="loss"), "training loss per epoch"),
    "search": FigureKind("runs", _search, "a search's validation against each searched option, "
                         "and its anytime curve (best validation so far against cumulative device-hours)"),
}
# Earlier names of a kind, still accepted: 'kappa' drew the class statistics before it was named for
# what it draws (docs/results.md and users' commands say --kind kappa).
FIGURE_ALIASES = {"kappa": "class_stats"}
# The files a kind writes, as glob patterns without the extension (scripts/results_doc.py): the class
# statistics write one figure per recorded statistic, named by it; the patterns are plots.DRAWN_CLASS_STATS
# (not imported here: matplotlib is loaded only to draw; tests/test_lookup_tables.py checks they agree).
FIGURE_FILES = {"class_stats": ("kappa", "*weight_norm")}
FIGURE_FILES.update({alias: FIGURE_FILES[kind] for alias, kind in FIGURE_ALIASES.items()})
FIGURE_SIZES = ("column", "text")  # plots.WIDTH_IN: 3.3 in and 6.9 in wide


def figure_kind(kind: str) -> FigureKind:
    return lookup(FIGURES, FIGURE_ALIASES.get(kind, kind), "figure kind")


def draw(kind: str, frames, out_base: Path, size: str = "column") -> Drawn:
    """Draw one kind of figure at one size: the written paths and captions, or why nothing was drawn."""
    figure = figure_kind(kind)
    from ltbench.report import plots  # lazy: keeps tables and status free of matplotlib

    return figure.draw(plots, frames[figure.frame], out_base, _study_rows(frames), size)


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


def write_report(recipe_path, results=None, test: str | None = "welch", overrides=(), use_cache: bool = True,
                 size: str = "column") -> Path:
    """``results/<recipe>/report/``: every table (md, tex, csv), tables_document.tex, the figures at ``size``,
    report.md and report.html (the same, self-contained, to open in a browser)."""
    records, recipe, root = report.source(recipe_path, results, use_cache, overrides=overrides)
    if recipe is None:
        raise report.LtbenchError(f"{recipe_path}: 'ltbench report' needs a recipe file")
    out = store.ensure_writable(Path(root) / "report")
    built = report.tables(recipe_path, results, test=test, overrides=overrides, use_cache=use_cache)
    where = f"results in `{Path(root).name}/`, the folder above this report's `report/`"  # no machine's absolute path
    md = [f"# Report: {recipe.name}", "", f"Recipe `{shown_path(recipe_path)}`; {where}.", "", "## Tables", ""]
    md += _write_tables(built, out, recipe_path, overrides)
    frames = report.load(recipe_path, results, overrides=overrides)
    lines, shown = _draw_figures(frames, out, recipe_path, size)
    provenance = provenance_summary(records)
    md += ["## Figures", "", *lines, "## Provenance", "", *provenance, ""]
    _write(out / "report.md", "\n".join(md))
    intro = f"Recipe {shown_path(recipe_path)}; {where.replace('`', '')}. Tables, figures and notes as in report.md; click a " \
            f"column header to sort."
    _write(out / "report.html", report_html(f"Report: {recipe.name}", intro, built, shown, frames["runs"],
                                            provenance))
    return out


def shown_path(path) -> str:
    """A recipe path as a report shows it: as given when relative, else relative to the working directory when
    inside it, else its file name (a report is shared; the machine's absolute paths are not its business)."""
    p = Path(path)
    if not p.is_absolute():
        return str(p)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return p.name


def _write_tables(built: list, out: Path, recipe_path, overrides) -> list[str]:
    """Each table as .md, .tex and .csv, all of them in tables_document.tex; returns report.md's lines."""
    command = "ltbench table " + " ".join(shlex.quote(str(a)) for a in [shown_path(recipe_path), *overrides])
    md, fragments = [], []
    for t in built:
        for fmt, ext in (("markdown", "md"), ("latex", "tex"), ("csv", "csv")):
            _write(out / f"{t.name}.{ext}", render(t, fmt) + "\n")
        fragments.append(render(t, "latex"))
        md += [f"### {t.name}", "", f"`{command} --table {t.name}` (also [{t.name}.tex]({t.name}.tex), "
               f"[{t.name}.csv]({t.name}.csv))", "", render(t, "markdown"), ""]
    _write(out / "tables_document.tex", latex_document(fragments))
    return md


def _draw_figures(frames, out: Path, recipe_path, size: str) -> tuple[list[str], list[FigureShown]]:
    """Every kind of figure, or why it is not drawn: report.md's lines and report.html's figures."""
    md, shown = [], []
    for kind, figure in FIGURES.items():
        drawn = draw(kind, frames, out / "figures" / kind, size)
        png = [Path(p) for p in drawn.paths if p.endswith(".png")]
        if not png:
            md += [f"**{kind}**: not drawn: {drawn.reason}.", ""]
            shown.append(FigureShown(kind, None, drawn.reason or "nothing to draw"))
            continue
        md += [f"**{kind}**: {figure.what} (`ltbench plot {shown_path(recipe_path)} --kind {kind} --size {size}`)", ""]
        for path in png:
            text = drawn.captions.get(path.stem, "")
            md += [f"![{kind}](figures/{path.name})", "", f"*{path.stem}*: {text}", ""]
            shown.append(FigureShown(kind, path, text))
    return md, shown
