"""Figures: files written, not blank, one line per row with the mean over seeds, natural prior order."""

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread

from ltbench.errors import LtbenchError
from ltbench.report.plots import (caption, save_figure, class_statistics, figure_class_stat, figure_curves, figure_per_class,
                                  figure_shift, plot_class_stat, plot_curves, plot_per_class, plot_shift)
from ltbench.priors import prior_position
from tests.conftest import ROOT

COUNTS = [500, 200, 120, 80, 40, 25, 12, 5]  # many: 3 classes, medium: 3, few: 2


def group(count: int) -> str:
    return "many" if count > 100 else "few" if count < 20 else "medium"


def per_class_frame(rows=("ce", "la", "bape"), seeds=(0, 1)) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame([
        {"row": row, "seed": seed, "class_index": c, "train_count": n, "group": group(n),
         "accuracy": float(np.clip(0.3 + 0.1 * np.log10(n) + 0.05 * r + rng.normal(0, 0.02), 0, 1))}
        for r, row in enumerate(rows) for seed in seeds for c, n in enumerate(COUNTS)])


def data_lines(figure):
    return [line for line in figure.axes[0].get_lines() if not line.get_label().startswith("_")]


def assert_written_and_not_blank(paths, out_base):
    assert [p.name for p in paths] == [f"{out_base.name}.png", f"{out_base.name}.pdf"]
    image = imread(paths[0])
    assert image.shape[0] > 100 and image.shape[1] > 100
    colours = np.unique(image.reshape(-1, image.shape[-1]).round(2), axis=0)
    assert len(colours) > 10, "the PNG is (nearly) one colour"
    pdf = paths[1].read_bytes()
    assert pdf.startswith(b"%PDF") and len(pdf) > 2000
    assert not list(out_base.parent.glob(".*tmp*"))


def test_per_class_figure(tmp_path):
    df = per_class_frame()
    figure = figure_per_class(df)
    lines = data_lines(figure)
    assert [line.get_label() for line in lines] == ["ce (n=2)", "la (n=2)", "bape (n=2)"]
    expected = df[df.row == "la"].groupby("train_count")["accuracy"].mean().to_numpy() * 100
    assert np.allclose(lines[1].get_ydata(), expected)
    assert list(lines[0].get_xdata()) == sorted(COUNTS)
    assert figure.axes[0].get_xscale() == "log"
    boundaries = [line.get_xdata()[0] for line in figure.axes[0].get_lines() if line.get_label().startswith("_")]
    assert boundaries == pytest.approx([np.sqrt(12 * 25), np.sqrt(80 * 120)])  # no thresholds in the frame
    with_thresholds = figure_per_class(df.assign(few_threshold=20, many_threshold=100))
    drawn = [line.get_xdata()[0] for line in with_thresholds.axes[0].get_lines() if line.get_label().startswith("_")]
    assert drawn == [20, 100]  # the runs' real thresholds, not points between the groups' classes
    out = tmp_path / "figs" / "per_class"
    assert_written_and_not_blank(plot_per_class(df, out, shot_boundaries=[20, 100]), out)


def test_classes_sharing_a_count_become_one_point():
    df = per_class_frame(rows=("ce",), seeds=(0,))
    df.loc[df.class_index == 1, "train_count"] = 500  # two classes with 500 images
    line = data_lines(figure_per_class(df))[0]
    assert len(line.get_xdata()) == len(COUNTS) - 1
    assert line.get_ydata()[-1] == pytest.approx(100 * df[df.train_count == 500]["accuracy"].mean())


def test_class_stat_figure(tmp_path):
    base = per_class_frame(rows=("bape", "la"))
    df = pd.concat([base.assign(stat="kappa", value=base.train_count * 0.1),
                    base.assign(stat="weight_norm", value=np.log(base.train_count))]).drop(columns="accuracy")
    kappa = figure_class_stat(df, "kappa")
    assert len(data_lines(kappa)) == 2
    assert np.allclose(data_lines(kappa)[0].get_ydata(), np.sort(COUNTS) * 0.1)
    assert kappa.axes[0].get_yscale() == "log" and "both axes log scale" in caption(kappa)  # 0.5 to 50
    norms = figure_class_stat(df, "weight_norm")  # 1.6 to 6.2: under a decade, a linear axis
    assert norms.axes[0].get_yscale() == "linear" and "both axes" not in caption(norms)
    out = tmp_path / "kappa"
    assert_written_and_not_blank(plot_class_stat(df, out, stat="weight_norm"), out)
    with pytest.raises(LtbenchError, match="recorded: kappa, weight_norm"):
        figure_class_stat(df, "cosine_scale")


PRIORS = ["forward50", "forward5", "uniform", "backward5", "backward50"]


def shift_frame() -> pd.DataFrame:
    rows = [{"row": row, "seed": seed, "prior": p, "position": prior_position(p),
             "accuracy": 0.5 + 0.05 * seed + (0.1 * i if row == "la" else -0.1 * i)}
            for row in ("ce", "la") for seed in (0, 1, 2) for i, p in enumerate(PRIORS)]
    return pd.DataFrame(rows).sample(frac=1.0, random_state=0)  # any input order


def test_shift_figure_in_natural_prior_order(tmp_path):
    df = shift_frame()
    figure = figure_shift(df)
    assert [t.get_text() for t in figure.axes[0].get_xticklabels()] == PRIORS
    lines = data_lines(figure)
    assert [line.get_label() for line in lines] == [f"{r} (n=3)" for r in pd.unique(df.row)]
    la = lines[[line.get_label() for line in lines].index("la (n=3)")]
    assert np.allclose(la.get_ydata(), [100 * (0.55 + 0.1 * i) for i in range(5)])
    out = tmp_path / "shift"
    assert_written_and_not_blank(plot_shift(df, out), out)


def test_prior_position_is_the_natural_order():
    assert sorted(PRIORS + ["forward2", "backward25"], key=prior_position) == [
        "forward50", "forward5", "forward2", "uniform", "backward5", "backward25", "backward50"]


def curves_frame() -> pd.DataFrame:
    return pd.DataFrame([{"row": row, "seed": seed, "epoch": e, "loss": 2.0 / e + 0.1 * seed + k,
                          "train_acc": 0.1 * e}
                         for k, row in enumerate(("ce", "la")) for seed in (0, 1) for e in range(1, 6)])


def test_curves_figure(tmp_path):
    df = curves_frame()
    figure = figure_curves(df, "loss")
    lines = data_lines(figure)
    assert len(lines) == 2 and list(lines[0].get_xdata()) == [1, 2, 3, 4, 5]
    raw = [2.0 / e + 0.05 for e in range(1, 6)]
    assert np.allclose(lines[0].get_ydata(), [v / raw[0] for v in raw])  # normalised by the first epoch
    accuracy = [line for line in figure.axes[1].get_lines() if not line.get_label().startswith("_")]
    assert np.allclose(accuracy[0].get_ydata(), [10.0 * e for e in range(1, 6)])  # train_acc in %
    assert "band: ±1 std" in caption(figure) and figure._suptitle is None
    out = tmp_path / "curves"
    assert_written_and_not_blank(plot_curves(df, out, y="train_acc"), out)
    with pytest.raises(LtbenchError, match="no column"):
        figure_curves(df, "val_loss")


def test_empty_data_is_a_clear_error():
    with pytest.raises(LtbenchError, match="nothing to plot"):
        figure_per_class(per_class_frame().iloc[0:0])


def test_plotting_needs_no_display_and_no_pyplot(tmp_path):
    code = ("import sys, pandas as pd; from ltbench.report.plots import plot_curves; "
            "df = pd.DataFrame({'row': ['a', 'a'], 'seed': [0, 0], 'epoch': [1, 2], 'loss': [2.0, 1.0]}); "
            f"plot_curves(df, {str(tmp_path / 'c')!r}); assert 'matplotlib.pyplot' not in sys.modules")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "c.png").is_file() and (tmp_path / "c.pdf").is_file()


def test_class_statistics_finds_per_class_lists_at_any_depth():
    extras = {"kappa": [1.0, 2.0, 3.0], "n": [10, 5, 1], "kappa0": 4.0, "da_mode": "none", "prior_dirs": "fixed",
              "notes": ["a", "b", "c"], "flags": [True, False, True], "short": [1.0, 2.0],
              "aux": {"weight_norm": [0.5, 0.4, 0.3], "aux": {"weight_norm": [1, 1, 1]}}}
    assert class_statistics(extras, 3) == {"kappa": [1.0, 2.0, 3.0], "n": [10.0, 5.0, 1.0],
                                           "aux.weight_norm": [0.5, 0.4, 0.3], "aux.aux.weight_norm": [1.0, 1.0, 1.0]}
    assert class_statistics({}, 3) == {} and class_statistics(None, 3) == {}


def _fonts_of(pdf: bytes) -> list[bytes]:
    """The /Subtype of every font dictionary in a PDF (matplotlib writes them uncompressed)."""
    import re

    return re.findall(rb"/Type\s*/Font\b[^>]*?/Subtype\s*/(\w+)", pdf) + \
        re.findall(rb"/Subtype\s*/(\w+)[^>]*?/Type\s*/Font\b", pdf)


def test_pdfs_embed_truetype_fonts_never_type3(tmp_path):
    df = per_class_frame()
    for paths in (plot_per_class(df, tmp_path / "pc"), plot_shift(shift_frame(), tmp_path / "sh")):
        fonts = _fonts_of(paths[1].read_bytes())
        assert fonts and b"Type3" not in fonts, fonts
        assert b"TrueType" in fonts or b"Type0" in fonts, fonts


def test_a_row_keeps_its_colour_across_figures_and_legends_follow_table_order():
    order = {"ce": 0, "la": 1, "bape": 2}
    full = per_class_frame(rows=("bape", "ce", "la"))
    full = full.assign(row_order=full["row"].map(order))
    only_la = full[full.row != "ce"]  # a figure where CE recorded nothing must not shift LA's colour
    colours = {}
    for frame in (full, only_la):
        figure = figure_per_class(frame)
        labels = [t.get_text() for t in figure.legends[0].get_texts()]
        assert labels == [f"{r} (n=2)" for r in sorted(set(frame.row), key=order.get)]
        for line in data_lines(figure):
            colours.setdefault(line.get_label(), set()).add(line.get_color())
    assert all(len(c) == 1 for c in colours.values()), colours


def test_rows_with_the_same_values_stay_distinguishable():
    """Two BAPE variants with the same kappa drew one line over the other in one colour's place: each row
    now differs from every other in line style and marker too, and markers are hollow."""
    same = per_class_frame(rows=("bape", "bape+la", "bape+la plain", "ce"), seeds=(0,))
    same["accuracy"] = same.groupby("class_index")["accuracy"].transform("first")  # every row the same values
    lines = data_lines(figure_per_class(same))
    looks = {(line.get_color(), line.get_linestyle(), line.get_marker()) for line in lines}
    assert len({look[1] for look in looks}) == len({look[2] for look in looks}) == len(lines) == 4
    assert all(line.get_markerfacecolor() == "none" for line in lines)


@pytest.mark.parametrize("size", ["column", "text"])
def test_the_legend_sits_below_the_axes_inside_the_page(size):
    figure = figure_per_class(per_class_frame(rows=("ce", "la", "bape", "ldam_drw", "balanced_softmax")), size=size)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)  # constrained layout places the legend on drawing
    legend = figure.legends[0].get_window_extent(renderer)
    axes = figure.axes[0].get_tightbbox(renderer)  # the axes with its tick labels and axis labels
    page = figure.bbox
    assert legend.y1 <= axes.y0 + 1 and legend.y0 >= page.y0 - 1, (legend, axes)  # under the data, on the page
    assert legend.x0 >= page.x0 - 1 and legend.x1 <= page.x1 + 1


def test_no_title_in_the_figure_and_captions_are_true_to_n():
    one_seed = figure_shift(shift_frame().query("seed == 0"))
    assert "one seed per row" in caption(one_seed) and "±1 std" not in caption(one_seed)
    assert "mean over seeds" in caption(figure_shift(shift_frame()))
    assert "mean over seeds" not in caption(figure_per_class(per_class_frame(seeds=(0,))))
    for figure in (one_seed, figure_curves(curves_frame()), figure_per_class(per_class_frame())):
        assert figure._suptitle is None and all(not ax.get_title() for ax in figure.axes)


def test_nothing_to_draw_is_said_in_the_caption_not_in_an_axis_label():
    one_epoch = pd.DataFrame({"row": ["ce", "la"], "seed": [0, 0], "epoch": [1, 1], "loss": [2.0, 1.5]})
    curves = figure_curves(one_epoch)
    assert "Only one epoch logged" in caption(curves) and "logged" not in curves.axes[0].get_xlabel()
    base = per_class_frame(rows=("la",)).drop(columns="accuracy").assign(stat="weight_norm", value=1.0)
    figure = figure_class_stat(base, "weight_norm", all_rows=["ce", "la", "ldam_drw"])
    assert "record no per-class weight_norm): ce, ldam_drw." in caption(figure)
    assert "not drawn" not in figure.axes[0].get_xlabel()
    assert "kappa" not in caption(figure) and "κ" not in caption(figure)


def _pdf_page_and_font_sizes(pdf: bytes) -> tuple[tuple[float, float], list[float]]:
    """The page's width and height in pt (MediaBox) and every font size the page's text is set in (the
    'Tf' operators of its content streams, inflated where compressed): what a paper's reader sees."""
    import re
    import zlib

    box = [float(v) for v in re.search(rb"/MediaBox\s*\[\s*([\d.\s-]+)\]", pdf).group(1).split()]
    sizes = []
    for stream in re.findall(rb"stream\r?\n(.*?)\r?\nendstream", pdf, re.S):
        try:
            text = zlib.decompress(stream)
        except zlib.error:
            text = stream
        sizes += [float(v) for v in re.findall(rb"/F\d+\s+([\d.]+)\s+Tf", text)]
    return (box[2] - box[0], box[3] - box[1]), sizes


FIGURES = {"per_class": lambda size: figure_per_class(per_class_frame(), size=size),
           "shift": lambda size: figure_shift(shift_frame(), size=size),
           "curves": lambda size: figure_curves(curves_frame(), size=size),
           "class_stat": lambda size: figure_class_stat(
               per_class_frame(rows=("la",)).drop(columns="accuracy").assign(stat="weight_norm", value=1.0),
               "weight_norm", all_rows=["ce", "la", "ldam_drw"], size=size)}


@pytest.mark.parametrize("size,width_in", [("column", 3.3), ("text", 6.9)])
@pytest.mark.parametrize("kind", list(FIGURES))
def test_a_figure_is_as_wide_as_the_page_asks_and_no_text_is_under_7pt(tmp_path, kind, size, width_in):
    """The PDF's page is the figure (3.3 in for a column, 6.9 in for the text width: included at 100 %),
    and both matplotlib's texts and the fonts the PDF sets are 7 pt or more."""
    from matplotlib.text import Text

    figure = FIGURES[kind](size)
    texts = [t for t in figure.findobj(Text) if t.get_visible() and t.get_text().strip()]
    assert texts and min(t.get_fontsize() for t in texts) >= 7.0
    (width, height), sizes = _pdf_page_and_font_sizes(save_figure(figure, tmp_path / kind)[1].read_bytes())
    assert width == pytest.approx(width_in * 72, abs=0.5) and 1.5 * 72 <= height <= 6 * 72
    assert sizes and min(sizes) >= 7.0, sorted(set(sizes))


def test_the_font_check_sees_a_small_font(tmp_path):
    """The PDF reader above is not blind: a 5 pt label is found."""
    figure = figure_shift(shift_frame())
    figure.axes[0].set_xlabel("tiny", fontsize=5)
    _, sizes = _pdf_page_and_font_sizes(save_figure(figure, tmp_path / "tiny")[1].read_bytes())
    assert min(sizes) == 5.0


def test_an_unknown_size_is_a_clear_error():
    with pytest.raises(LtbenchError, match="figure size 'poster': expected one of column, text"):
        figure_shift(shift_frame(), size="poster")


def test_a_shift_figure_without_shifted_priors_says_what_would_produce_them(tmp_path):
    """Issue 40: 'ltbench plot --kind shift' on runs without target priors names the recipe keys that record them."""
    from ltbench.report import document, plots

    drawn = document.FIGURES["shift"].draw(plots, pd.DataFrame(), tmp_path / "shift", [], "column")
    assert drawn.paths == [] and "eval.target_priors" in drawn.reason and "eval.test_sets" in drawn.reason


def test_search_figure_shows_validation_against_each_option_and_the_anytime_curve(tmp_path):
    """From a search's trial runs (tests/test_tuned.py's populate): one panel per searched option, then the best
    validation so far against cumulative device-hours; a study without a search says why nothing is drawn."""
    from pathlib import Path

    from ltbench import report
    from ltbench.report import document, plots
    from tests.test_tuned import populate, recipe_file

    path = recipe_file(tmp_path)
    populate(path, device_seconds=360.0)
    frames = report.load(path)
    drawn = document.draw("search", frames, tmp_path / "figs" / "search")
    assert sorted(Path(p).suffix for p in drawn.paths) == [".pdf", ".png"], drawn.reason
    assert "against each searched option" in drawn.captions["search"] and "2 tuning seeds" in drawn.captions["search"]
    trials = plots.search_frame(frames["runs"])
    assert len(trials) == 3 * 2 and {"draw:optim.lr", "draw:optim.weight_decay"} <= set(trials.columns)
    figure = plots.figure_search(trials)
    anytime = figure.axes[-1]
    assert anytime.get_xlabel() == "device-hours (cumulative)" and len(figure.axes) >= 3
    empty = document.FIGURES["search"].draw(plots, frames["runs"].iloc[0:0], tmp_path / "s", [], "column")
    assert not empty.paths and "no finished trial run of a search" in empty.reason
