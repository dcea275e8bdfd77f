"""report.html (issue 33): self-contained, and it renders in a real browser.

The report of the golden shapes recipe (a pivot, check marks with row groups and differences, sections,
shifted priors; one seed missing, one failed, one pending, one running) is written once. The file is read
as HTML: nothing in it may point outside the file. Then Debian's chromium opens it headless: no console
message may appear (a script error, a resource the page's Content Security Policy refused), the sort
script must reorder a table when its header is clicked, and the screenshot must show a page, not a blank.
"""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from ltbench.recipe import load_recipe
from ltbench.report.document import write_report
from reportkit import populate
from test_report_shapes import SHAPES, SKIP, STATUS

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0", "--window-size=1100,1600"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    results = tmp_path_factory.mktemp("html") / "results"
    populate(load_recipe(SHAPES / "shapes.yaml", results_dir=results), skip=SKIP, status=STATUS)
    return results


@pytest.fixture(scope="module")
def report_dir(results):
    return write_report(SHAPES / "shapes.yaml", results)


def test_figures_use_the_declared_labels_where_they_name_one_configuration(results):
    """The 'switches' table labels the imbalance-6 runs (Baseline, LA tau 1...); figures say so, with the
    imbalance factor that tells them from the imbalance-10 runs, which no declared row labels."""
    from ltbench import report

    frames = report.load(SHAPES / "shapes.yaml", results)
    rows = list(dict.fromkeys(frames.per_class.sort_values("row_order")["row"]))
    assert rows == ["imb_factor=6: Baseline", "imb_factor=6: LA tau 1", "imb_factor=6: LA tau 2",  # groups together
                    "imb_factor=6: LA tau 1, 3 epochs", "imb_factor=10: ce (epochs=2)",
                    "imb_factor=10: la (tau=1, epochs=2)", "imb_factor=10: la (tau=2, epochs=2)"]
    failed = frames.runs[frames.runs.status == "failed"].iloc[0]
    assert failed["row"] == "imb_factor=6: LA tau 2" and "loss is nan" in failed["error"]


class Links(HTMLParser):
    """Every tag with its attributes, to find anything that would load from outside the file."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_report_html_is_self_contained_and_complete(report_dir):
    text = (report_dir / "report.html").read_text()
    parser = Links()
    parser.feed(text)
    sources = [a.get("src") or a.get("href") for _, a in parser.tags if a.get("src") or a.get("href")]
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources), sources
    assert "http://" not in text and "https://" not in text and "<link" not in text
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    pngs = sorted((report_dir / "figures").glob("*.png"))
    assert len([t for t, _ in parser.tags if t == "img"]) == len(pngs) == 2  # per_class, shift
    for name in ("pivot", "switches", "sections", "shift"):
        assert f'id="table-{name}"' in text
    assert "Difference (points)" in text and "seed 1 failed (RuntimeError: loss is nan at epoch 2)" in text
    for status in ("failed", "pending", "running", "done"):
        assert f'class="status-{status}"' in text
    assert "runs found: 17 done, 1 failed, 1 pending, 1 running" in text
    assert "not drawn: no data for the curves figure" in text and "dotted: the shot-group thresholds" in text


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; make test installs it as root); "
                    "report.html was not opened in a browser")
    return found


def open_in_chromium(page: Path, folder: Path) -> tuple[str, list[str], np.ndarray]:
    """(the DOM after the page's scripts ran, the console lines, the screenshot as an RGB array)."""
    from matplotlib.image import imread

    shot = folder / "shot.png"
    done = subprocess.run([_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={folder / 'profile'}",
                           f"--screenshot={shot}", "--dump-dom", page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, console, imread(shot)[..., :3]


CHECK_SORT = """<script>
(function () {
  var table = document.getElementById('table-pivot');
  var label = function () { return Array.prototype.map.call(table.tBodies[0].rows, function (r) {
    return r.cells[0].textContent; }).join('|'); };
  var before = label();
  var all = table.querySelectorAll('thead tr:last-child th')[2];  // rho=10 / All
  all.click();
  var first = label();
  all.click();
  document.body.setAttribute('data-sort-check', [before, first, label(), all.getAttribute('aria-sort')].join(' / '));
})();
</script></body>"""


def test_report_html_renders_in_headless_chromium(report_dir, tmp_path):
    page = tmp_path / "report.html"  # a copy with a script that clicks a header, as a reader would
    page.write_text((report_dir / "report.html").read_text().replace("</body>", CHECK_SORT))
    dom, console, shot = open_in_chromium(page, tmp_path)
    assert console == [], console
    assert 'data-sortable-tables="6"' in dom  # the page's script ran: 4 tables, 1 difference table, the runs
    assert '<table class="lt" id="table-pivot">' in dom and "LA tau 1, 3 epochs (ours)" in dom
    check = dom.split('data-sort-check="')[1].split('"')[0].replace("&amp;", "&")
    before, first, second, state = check.split(" / ")
    assert before.startswith("ce") and first.startswith("la (tau=2)") and state == "ascending", check
    assert second.split("|")[0].startswith("ce")  # ascending: the lowest All first
    assert shot.shape[0] >= 1000 and shot.shape[1] >= 1000
    ink = (shot.mean(axis=2) < 0.6).mean()  # share of dark pixels: text, rules, figure lines
    assert shot.std() > 0.1 and 0.01 < ink < 0.5, (shot.std(), ink)


def test_the_browser_check_sees_console_errors_and_refused_resources(tmp_path):
    """What the test above relies on: a script error and a resource the policy refuses are reported."""
    from ltbench.report.html import report_html

    page = tmp_path / "bad.html"
    page.write_text(report_html("t", "x", [], [], None, []).replace(
        "</body>", '<img src="http://127.0.0.1:9/x.png"><script>undefinedFunction();</script></body>'))
    _, console, _ = open_in_chromium(page, tmp_path)
    assert any("undefinedFunction" in line for line in console), console
    assert any("Content Security Policy" in line for line in console), console


def test_a_declared_label_never_merges_two_configurations():
    from ltbench.report.frames import _declared_labels

    label_of = {"a": "la (tau=1)", "b": "la (tau=2)", "c": "ce", "d": "cosine", "e": "ldam"}
    declared = {"a": "LA", "b": "LA", "c": "Baseline", "d": "ldam"}  # a sweep row; a label another row has
    assert _declared_labels(label_of, {}, declared) == {
        "a": "la (tau=1)", "b": "la (tau=2)", "c": "Baseline", "d": "cosine", "e": "ldam"}


def test_plot_size_text_makes_a_text_wide_pdf_and_prints_its_caption(results, tmp_path, capsys):
    from ltbench.cli import main
    from test_plots import _pdf_page_and_font_sizes

    assert main(["plot", str(SHAPES / "shapes.yaml"), "--results", str(results), "--kind", "shift",
                 "--size", "text", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    (width, _), sizes = _pdf_page_and_font_sizes((tmp_path / "shift.pdf").read_bytes())
    assert width == pytest.approx(6.9 * 72, abs=0.5) and min(sizes) >= 7
    assert "caption (shift): Test accuracy under shifted test class priors" in printed
