"""Figures of a study: per-class accuracy, per-class statistics, shifted test priors, training curves.

Each ``figure_*`` function draws a tidy frame from ``ltbench.report.load`` (never result files), one line per
table row, mean over its seeds; its ``plot_*`` twin writes it as .png and .pdf. Sized for the page (issue 33):
3.3 in ('column') or 6.9 in ('text') wide, every text at least 7 pt, TrueType fonts (venues reject Type 3),
no title inside: ``figure.ltbench_caption`` says what is drawn and whether a ±1 std band is shown. Built with
``matplotlib.figure.Figure``, never pyplot, so no display or global backend is needed. A row keeps its table
colour and order in every figure; the legend gives its seeds and sits below the axes; where there is nothing
to draw, the figure says so in words.
"""

from __future__ import annotations

import io
import math
from functools import wraps
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ltbench.errors import LtbenchError
from ltbench.results.schema import SHOT_GROUPS
from ltbench.results.store import atomic_write_bytes, make_dirs

FORMATS = ("png", "pdf")
LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
WIDTH_IN = {"column": 3.3, "text": 6.9}  # one column of a two-column paper, and its text width
AXES_IN = {"column": 2.1, "text": 2.5}  # height of one panel's axes area, labels included
LABEL_PT, SMALL_PT = 8.0, 7.0  # axis labels; ticks, legend and notes (venues ask for 7 pt or more)
FONTS = {"font.size": LABEL_PT, "axes.labelsize": LABEL_PT, "xtick.labelsize": SMALL_PT,
         "ytick.labelsize": SMALL_PT, "legend.fontsize": SMALL_PT, "axes.titlesize": LABEL_PT,
         "pdf.fonttype": 42, "ps.fonttype": 42}  # TrueType, not Type 3 (venues reject it)


def _require(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise LtbenchError(f"{what}: the data has no column(s) {', '.join(missing)}")
    if df.empty:
        raise LtbenchError(f"{what}: nothing to plot (no runs with these values)")


def row_order(df: pd.DataFrame) -> list[str]:
    """The rows in table order (``row_order`` from ``ltbench.report.load``), else in first-appearance order."""
    if "row_order" in df.columns and df["row_order"].notna().all():
        return list(df.drop_duplicates("row").sort_values("row_order", kind="stable")["row"])
    return list(pd.unique(df["row"]))


def _row_styles(df: pd.DataFrame) -> dict[str, dict]:
    """Colour, line style and marker each cycle with the row (periods 10, 4 and 7), so that two rows whose
    lines coincide (two BAPE variants with the same kappa) both stay visible, also in greyscale print (the
    markers are hollow, so one shape does not cover another), and up to 140 rows differ in at least one.
    The index is the row's place in the table when known: a row missing from one figure does not change the
    others' styles."""
    rows = row_order(df)
    if "row_order" in df.columns and df["row_order"].notna().all():
        index = dict(zip(df["row"], df["row_order"].astype(int)))
    else:
        index = {row: i for i, row in enumerate(rows)}
    return {row: {"color": f"C{index[row] % 10}", "linestyle": LINE_STYLES[index[row] % len(LINE_STYLES)],
                  "marker": MARKERS[index[row] % len(MARKERS)], "markerfacecolor": "none"} for row in rows}


def _by_row(df: pd.DataFrame, x: str, y: str, scale: float = 1.0):
    """Per row, in table order: (row, label with n seeds, x, mean and std over seeds, n seeds)."""
    for row in row_order(df):
        part = df[df["row"] == row]
        n_seeds = part["seed"].nunique()
        per_x = part.groupby(x, sort=True)[y].agg(["mean", "std"])
        yield (row, f"{row} (n={n_seeds})", per_x.index.to_numpy(), per_x["mean"].to_numpy() * scale,
               per_x["std"].fillna(0.0).to_numpy() * scale, n_seeds)


def _draw_rows(ax: Axes, df: pd.DataFrame, x: str, y: str, scale: float = 1.0, band: bool = True,
               markers: bool = False) -> bool:
    """One line per row (mean over seeds), with its row's marker at each point when ``markers`` (always
    for a single point, which a line alone would not show); returns whether a ±1 std band was drawn (some
    row has n > 1)."""
    styles = _row_styles(df)
    banded = False
    for row, label, xs, mean, std, n_seeds in _by_row(df, x, y, scale):
        style = dict(styles[row])
        if not markers and len(xs) > 1:
            style["marker"] = None
        ax.plot(xs, mean, label=label, markersize=3.5, **style)
        if band and n_seeds > 1:
            ax.fill_between(xs, mean - std, mean + std, color=style["color"], alpha=0.15, linewidth=0)
            banded = True
    ax.grid(True, alpha=0.3)
    return banded


def new_figure(size: str, panels: int = 1) -> Figure:
    """A figure ``size`` wide ('column': 3.3 in, 'text': 6.9 in) with room for ``panels`` axes: side by
    side at the text width, one above the other in a column (two 1.6 in panels side by side are unreadable).
    Constrained layout keeps every label inside the page, so the saved page is exactly this wide."""
    if size not in WIDTH_IN:
        raise LtbenchError(f"figure size '{size}': expected one of {', '.join(WIDTH_IN)}")
    rows = panels if size == "column" else 1
    figure = Figure(figsize=(WIDTH_IN[size], AXES_IN[size] * rows), layout="constrained")
    figure.ltbench_size = size
    return figure


def _panels(figure: Figure, panels: int) -> list[Axes]:
    if panels == 1:
        return [figure.add_subplot()]
    stacked = getattr(figure, "ltbench_size", "column") == "column"
    return [figure.add_subplot(panels, 1, i + 1) if stacked else figure.add_subplot(1, panels, i + 1)
            for i in range(panels)]


def legend_below(figure: Figure, ax: Axes) -> None:
    """The legend under the axes, across the figure, never over the data, in the order the rows were drawn
    (table order), in as many columns as its longest entry allows; the figure grows by its height so the
    axes keep theirs."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    width_pt = figure.get_figwidth() * 72
    entry_pt = max(len(label) for label in labels) * 0.56 * SMALL_PT + 3.5 * SMALL_PT  # text, line, spacing
    ncols = max(1, min(len(labels), int(width_pt * 0.95 // entry_pt)))
    figure.legend(handles, labels, loc="outside lower center", ncols=ncols, fontsize=SMALL_PT, frameon=False,
                  handlelength=1.8, columnspacing=1.0)
    rows = math.ceil(len(labels) / ncols)
    figure.set_figheight(figure.get_figheight() + (rows * SMALL_PT * 1.4 + 6) / 72)


def set_caption(figure: Figure, text: str) -> None:
    """What a paper's caption should say about the figure (no title is drawn in it)."""
    figure.ltbench_caption = text


def _sentence(text: str) -> str:
    """A caption's first letter in capitals, unless its first word is an acronym written so (vMF)."""
    first = text.split(" ", 1)[0]
    return text if any(ch.isupper() for ch in first) else text[:1].upper() + text[1:]


def caption(figure: Figure) -> str:
    return " ".join(x for x in [getattr(figure, "ltbench_caption", ""), *getattr(figure, "ltbench_notes", [])] if x)


def seeds_phrase(df: pd.DataFrame, banded: bool) -> str:
    """'mean over seeds (n per row in the legend), band: ±1 std' only when true; 'one seed per row' at n = 1."""
    if df.empty or df.groupby("row")["seed"].nunique().max() <= 1:
        return "one seed per row, no spread"
    return "mean over seeds, n per row in the legend" + (", band: ±1 std" if banded else "")


def note_in_caption(ax: Axes, text: str) -> None:
    """Say why something is not drawn in the figure's caption (``caption``), after what it shows: an axis
    label names its axis, and a sentence set there reads as part of it."""
    ax.figure.ltbench_notes = [*getattr(ax.figure, "ltbench_notes", []), _sentence(text).rstrip(".") + "."]


def _log_axis(ax: Axes, which: str = "x") -> None:
    """Log axis labelled 5, 10, 200 (not 2x10^1); minor ticks labelled only within one decade; a y axis of
    under three decades gets its labels at 1, 2 and 5 of each decade (a value axis needs more than one)."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    low, high = ax.get_xlim() if which == "x" else ax.get_ylim()
    span = high / max(low, 1e-12)
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    if which == "y" and span < 1000:  # under three decades: ticks at 1, 2 and 5 of each
        axis.set_major_locator(LogLocator(10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(plain)
    axis.set_minor_formatter(plain if span < 10 else NullFormatter())


def save_figure(figure: Figure, out_base: str | Path) -> list[Path]:
    """Write ``out_base``.png and .pdf, each atomically (no half-written figure after a crash). The PDF's
    page is the figure's size (3.3 or 6.9 in wide), so a paper includes it at 100 %."""
    out_base = Path(out_base)
    make_dirs(out_base.parent)
    written = []
    for fmt in FORMATS:
        buffer = io.BytesIO()
        metadata = {"CreationDate": None} if fmt == "pdf" else {}
        with rc_context(FONTS):  # the page is the figure's size: never cropped ('tight'), never scaled
            figure.savefig(buffer, format=fmt, dpi=150, metadata=metadata)
        path = out_base.with_name(f"{out_base.name}.{fmt}")
        atomic_write_bytes(path, buffer.getvalue())
        written.append(path)
    return written


# ------------------------------------------------------------------------------------------------
# Per class, against training count


def _class_means(df: pd.DataFrame, value: str) -> pd.DataFrame:
    """Mean over seeds per class, then classes sharing a training count averaged into one point:
    ImageNet-LT has hundreds of classes per count, and a vertical zigzag at each count hides the trend."""
    rows = ["row"] + (["row_order"] if "row_order" in df.columns and df["row_order"].notna().all() else [])
    per_class = df.groupby([*rows, "seed", "class_index", "train_count"], sort=False)[value].mean().reset_index()
    return per_class.groupby([*rows, "seed", "train_count"], sort=False)[value].mean().reset_index()


def shot_thresholds(df: pd.DataFrame) -> list[float]:
    """Where the shot groups meet on the training-count axis: the runs' own thresholds (few: fewer than
    ``few_threshold`` images, many: more than ``many_threshold``; 20 and 100 by default) when the frame
    carries them and every run used the same; else halfway (geometrically) between neighbouring groups."""
    if {"few_threshold", "many_threshold"} <= set(df.columns):
        pairs = df[["few_threshold", "many_threshold"]].dropna().drop_duplicates()
        if len(pairs) == 1:
            return [float(pairs.iloc[0, 0]), float(pairs.iloc[0, 1])]
    return shot_boundaries_from_groups(df)


def shot_boundaries_from_groups(df: pd.DataFrame) -> list[float]:
    """Halfway (geometrically) between the largest count of a group and the smallest of the next one up:
    the fallback for frames that do not say which thresholds their runs used."""
    bounds = []
    present = [g for g in reversed(SHOT_GROUPS) if (df["group"] == g).any()]  # few, medium, many
    for lower, upper in zip(present, present[1:]):
        top = df.loc[df["group"] == lower, "train_count"].max()
        bottom = df.loc[df["group"] == upper, "train_count"].min()
        bounds.append(float(np.sqrt(max(top, 1) * max(bottom, 1))))
    return bounds


def _name_shot_groups(ax: Axes, bounds: list[float], groups: list[str]) -> None:
    """Write few / medium / many at the top of their regions (when the boundaries separate them)."""
    if len(groups) != len(bounds) + 1:
        return
    low, high = ax.get_xlim()
    edges = [low, *sorted(bounds), high]
    for group, left, right in zip(groups, edges, edges[1:]):
        ax.text(float(np.sqrt(left * right)), 0.98, group, transform=ax.get_xaxis_transform(), ha="center",
                va="top", fontsize=SMALL_PT, color="0.35")


def sized(draw):
    """Build the figure under the report's font sizes: matplotlib fixes a text's size when it creates it."""

    @wraps(draw)
    def build(*args, **kwargs) -> Figure:
        with rc_context(FONTS):
            return draw(*args, **kwargs)

    return build


@sized
def figure_per_class(df: pd.DataFrame, shot_boundaries: Sequence[float] | None = None,
                     size: str = "column") -> Figure:
    _require(df, ["row", "seed", "class_index", "train_count", "group", "accuracy"], "per-class figure")
    figure = new_figure(size)
    ax = figure.add_subplot()
    means = _class_means(df.dropna(subset=["accuracy"]), "accuracy")
    _draw_rows(ax, means, "train_count", "accuracy", scale=100.0, band=False, markers=True)
    bounds = shot_thresholds(df) if shot_boundaries is None else list(shot_boundaries)
    for bound in bounds:
        ax.axvline(bound, color="0.4", linestyle=":", linewidth=1)
    _log_axis(ax, "x")
    groups = [g for g in reversed(SHOT_GROUPS) if (df["group"] == g).any()]
    if len(bounds) == 2:  # two thresholds always make three regions, even if one holds no class
        groups = ["few", "medium", "many"]
    low, high = ax.get_ylim()
    ax.set_ylim(low, high + 0.12 * (high - low))  # headroom: the group names sit above the data
    _name_shot_groups(ax, bounds, groups)
    where = " and ".join(f"{b:g}" for b in bounds)
    ax.set_xlabel("training images per class (log)")
    ax.set_ylabel("class accuracy (%)")
    set_caption(figure, "Per-class test accuracy against the class's number of training images (log scale), "
                f"classes with the same count averaged; {seeds_phrase(df, False)}"
                + (f"; dotted: the shot-group thresholds ({where} images)." if bounds else "."))
    legend_below(figure, ax)
    return figure


def plot_per_class(df: pd.DataFrame, out_base, shot_boundaries: Sequence[float] | None = None,
                   size: str = "column") -> list[Path]:
    """Per-class test accuracy against the class's training count, one line per row."""
    return save_figure(figure_per_class(df, shot_boundaries, size), out_base)


# Per-class statistics are named by what they measure, not by the method that records them: a method
# records any list of num_classes numbers in result_extras (``class_statistics``), and every one can be
# drawn by name (``plot_class_stat``). These labels only make the usual names readable on an axis; an
# unlisted statistic is labelled by its name.
STAT_LABELS = {"kappa": "vMF concentration κ", "kappa_da_uniform": "κ after distribution adjustment",
               "weight_norm": "classifier weight norm", "aux.weight_norm": "auxiliary classifier weight norm",
               "mean_norm": "norm of the class's mean embedding"}
# What the report's class-statistics figure draws when not told (fnmatch patterns, in this order): the
# concentration of a vMF class model and the norms of classifier weights, never bookkeeping lists like n.
DRAWN_CLASS_STATS = ("kappa", "*weight_norm")


def class_statistics(method_extras: dict, num_classes: int, prefix: str = "") -> dict[str, list[float]]:
    """The per-class statistics (any list of ``num_classes`` numbers) a run recorded in ``method_extras``, by
    name, nested mappings flattened with a dotted prefix (``aux.weight_norm``): every method that records a
    list gets plotted without the core knowing the method."""
    found: dict[str, list[float]] = {}
    for key, value in (method_extras or {}).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            found.update(class_statistics(value, num_classes, prefix=f"{name}."))
        elif isinstance(value, list) and len(value) == num_classes and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            found[name] = [float(v) for v in value]
    return found


@sized
def figure_class_stat(df: pd.DataFrame, stat: str = "kappa", all_rows: Sequence[str] = (),
                      size: str = "column") -> Figure:
    """``all_rows``: every row of the study; those that recorded no ``stat`` are named in the figure,
    so a method left out (LDAM-DRW records no weight norm) is said to be left out, with the reason."""
    _require(df, ["row", "seed", "class_index", "train_count", "stat", "value"], f"class statistic '{stat}'")
    chosen = df[df["stat"] == stat].dropna(subset=["value"])
    if chosen.empty:
        known = ", ".join(sorted(df["stat"].unique()))
        raise LtbenchError(f"class statistic '{stat}': no run recorded it (recorded: {known or 'none'})")
    figure = new_figure(size)
    ax = figure.add_subplot()
    means = _class_means(chosen, "value")
    _draw_rows(ax, means, "train_count", "value", band=False, markers=True)
    _log_axis(ax, "x")
    log_y = spans_a_decade(means["value"])
    if log_y:  # a prior-free BAPE's kappa of ~2000 beside ~100 would flatten every other row onto the axis
        _log_axis(ax, "y")
    name = STAT_LABELS.get(stat, stat)
    ax.set_xlabel("training images per class (log)")
    ax.set_ylabel(name)
    left_out = [r for r in all_rows if r not in set(chosen["row"])]
    if left_out:
        note_in_caption(ax, f"not drawn (their runs record no per-class {stat}): {', '.join(left_out)}")
    set_caption(figure, f"{_sentence(name)} per class against the class's number of training images "
                        f"({'both axes log scale' if log_y else 'log scale'}), classes with the same count averaged; "
                        f"{seeds_phrase(chosen, False)}.")
    legend_below(figure, ax)
    return figure


def spans_a_decade(values: pd.Series) -> bool:
    """Whether positive values range over a factor of 10 or more: then a log axis shows every row's shape."""
    values = values.dropna()
    return bool(len(values)) and bool((values > 0).all()) and float(values.max()) >= 10 * float(values.min())


def plot_class_stat(df: pd.DataFrame, out_base, stat: str = "kappa", all_rows: Sequence[str] = (),
                    size: str = "column") -> list[Path]:
    """One per-class statistic (a concentration, a classifier's weight norm...) against training count."""
    return save_figure(figure_class_stat(df, stat, all_rows, size), out_base)


def plot_class_stats(df: pd.DataFrame, out_dir, all_rows: Sequence[str] = (), patterns: Sequence[str] = DRAWN_CLASS_STATS,
                     size: str = "column") -> tuple[list[Path], str | None, dict[str, str]]:
    """One figure per recorded statistic matching ``patterns``, in their order, each file named by the
    statistic (``weight_norm.png`` in a study that records no concentration); rows that do not record it
    are named in its figure. Returns (written paths, why nothing was drawn, caption by file stem)."""
    from fnmatch import fnmatchcase

    stats = [] if df.empty else sorted(set(df["stat"]))
    wanted = list(dict.fromkeys(s for pattern in patterns for s in stats if fnmatchcase(s, pattern)))
    if not wanted:
        return [], (f"no data for the class-statistics figure in these runs (none of {', '.join(patterns)} "
                    f"recorded per class)"), {}
    paths, captions = [], {}
    for stat in wanted:
        base = Path(out_dir) / stat.replace(".", "_")
        figure = figure_class_stat(df[df["stat"] == stat], stat, all_rows, size)
        paths += save_figure(figure, base)
        captions[base.name] = caption(figure)
    return paths, None, captions


# ------------------------------------------------------------------------------------------------
# Shifted test priors, training curves


@sized
def figure_shift(df: pd.DataFrame, size: str = "column") -> Figure:
    _require(df, ["row", "seed", "prior", "position", "accuracy"], "shifted-prior figure")
    df = df.dropna(subset=["accuracy"])
    order = df.drop_duplicates("prior").sort_values("position")
    rank = {prior: i for i, prior in enumerate(order["prior"])}
    figure = new_figure(size)
    ax = figure.add_subplot()
    banded = _draw_rows(ax, df.assign(rank=df["prior"].map(rank)), "rank", "accuracy", scale=100.0, markers=True)
    ax.set_xticks(range(len(rank)), list(rank), rotation=45, ha="right", rotation_mode="anchor")
    ax.set_xlabel("test class prior")
    ax.set_ylabel("test accuracy (%)")
    set_caption(figure, "Test accuracy under shifted test class priors, from forward (the training imbalance, "
                        "by the factor named) through uniform to backward (reversed); "
                        f"{seeds_phrase(df, banded)}.")
    legend_below(figure, ax)
    return figure


def plot_shift(df: pd.DataFrame, out_base, size: str = "column") -> list[Path]:
    """Accuracy from forward rho through uniform to backward rho, one line per row."""
    return save_figure(figure_shift(df, size), out_base)


ACCURACY_KEYS = ("test.all", "train_acc")  # the curves' accuracy panel: test accuracy when logged, else train


def _normalised(df: pd.DataFrame, y: str) -> pd.DataFrame:
    """``y`` divided by its row's mean at the first logged epoch: losses of different scales (LDAM's
    scaled margins against CE) start at 1 and can share one axis without one hiding the others."""
    first = df[df["epoch"] == df.groupby("row")["epoch"].transform("min")].groupby("row")[y].mean()
    return df.assign(**{y: df[y] / df["row"].map(first).where(lambda v: v != 0)})


@sized
def figure_curves(df: pd.DataFrame, y: str = "loss", size: str = "column") -> Figure:
    """A loss (name containing 'loss'): two panels, the loss normalised by its row's first epoch and
    the accuracy (``test.all`` when logged, else ``train_acc``). Any other key: one panel, as logged."""
    _require(df, ["row", "seed", "epoch", y], f"training curves of '{y}'")
    numeric = df.dropna(subset=[y])
    if numeric.empty:
        raise LtbenchError(f"training curves of '{y}': no run logged it")
    is_loss = "loss" in y
    accuracy = next((k for k in ACCURACY_KEYS if is_loss and k in df.columns and df[k].notna().any()), None)
    figure = new_figure(size, panels=2 if accuracy else 1)
    axes = _panels(figure, 2 if accuracy else 1)
    banded = _draw_rows(axes[0], _normalised(numeric, y) if is_loss else numeric, "epoch", y)
    axes[0].set_xlabel("epoch")
    axes[0].set_ylabel(f"{y} / first-epoch {y}" if is_loss else y)
    what = f"{y} per epoch" + (", divided by its row's value at the first epoch" if is_loss else "")
    if accuracy:
        _draw_rows(axes[1], df.dropna(subset=[accuracy]), "epoch", accuracy, scale=100.0)
        axes[1].set_xlabel("epoch")
        which = "test" if accuracy == "test.all" else "training"
        axes[1].set_ylabel(f"{which} accuracy (%)")
        first, second = ("top", "bottom") if size == "column" else ("left", "right")
        what += f" ({first}), and {which} accuracy ({second})"
    if numeric["epoch"].nunique() < 2:
        note_in_caption(axes[0], "only one epoch logged: a curve needs two (the points are that epoch)")
    set_caption(figure, f"{_sentence(what)}; {seeds_phrase(numeric, banded)}.")
    legend_below(figure, axes[-1])
    return figure


def plot_curves(df: pd.DataFrame, out_base, y: str = "loss", size: str = "column") -> list[Path]:
    """One logged quantity per epoch (from log.jsonl), one line per row; a loss with the accuracy beside it."""
    return save_figure(figure_curves(df, y, size), out_base)


def search_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """One line per finished trial run of a search (read from its result, data: store.check_result): its method,
    trial, tuning seed, validation All, device-hours and each drawn value (columns 'draw:<key>')."""
    from ltbench.results.store import check_result  # lazy: keeps --help fast
    from ltbench.search import trial_problem  # lazy: keeps --help fast

    lines = []
    for run_dir in runs.loc[runs["status"] == "done", "dir"] if not runs.empty else []:
        data = check_result(Path(run_dir)).result or {}
        trial, config = (data.get("grid") or {}).get("search"), data.get("config") or {}
        val = ((data.get("metrics") or {}).get("val") or {}).get("all")
        if trial_problem(trial) or not isinstance(val, (int, float)):
            continue
        line = {"method": config["method"]["name"], "trial": trial["trial"], "seed": data.get("seed"),
                "val": float(val), "hours": float(data.get("device_seconds") or 0.0) / 3600}
        for key in trial["space"]:
            node = config
            for part in key.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            line[f"draw:{key}"] = node
        lines.append(line)
    return pd.DataFrame(lines)


def figure_search(df: pd.DataFrame, size: str = "column") -> Figure:
    """Left: each trial's validation All (mean over its tuning seeds) against each searched option, one panel
    per option; right: the anytime curve, the best mean validation All so far against the cumulative
    device-hours of the trials in their order, per method (``df``: search_frame). Validation only: the test set
    chose nothing."""
    if df.empty:
        raise LtbenchError("search figure: no finished trial run of a search: run a recipe with search:")
    keys = sorted(c for c in df.columns if c.startswith("draw:"))
    trials = df.groupby(["method", "trial"], as_index=False).agg(
        val=("val", "mean"), hours=("hours", "sum"), **{k: (k, "first") for k in keys})
    figure = new_figure(size, panels=len(keys) + 1)
    axes = _panels(figure, len(keys) + 1)
    for ax, key in zip(axes, keys):
        for method, part in trials.dropna(subset=[key]).groupby("method"):
            values = pd.to_numeric(part[key], errors="coerce")
            ax.plot(values if values.notna().all() else part[key].astype(str), 100 * part["val"], "o", label=method)
        ax.set_xlabel(key.removeprefix("draw:"))
        ax.set_ylabel("validation All (%)")
    anytime = axes[-1]
    for method, part in trials.sort_values("trial").groupby("method"):
        anytime.step(part["hours"].cumsum(), 100 * part["val"].cummax(), where="post", label=method)
    anytime.set_xlabel("device-hours (cumulative)")
    anytime.set_ylabel("best validation All so far (%)")
    seeds = df["seed"].nunique()
    set_caption(figure, f"Validation All of each draw (mean over {seeds} tuning seed{'s' * (seeds != 1)}) against each "
                        f"searched option, and the best so far against the search's cumulative device-hours.")
    legend_below(figure, anytime)
    return figure
