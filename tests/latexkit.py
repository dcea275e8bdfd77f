"""Compile LaTeX table fragments with pdflatex in a two-column article and read what its log says:
overfull boxes (a table wider than its column or the page) and, on request, each tabular's real width."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ltbench.report.formats import latex_document

TABULAR = re.compile(r"(\\begin\{tabular\}.*?\\end\{tabular\})", re.S)


def needs_pdflatex() -> None:
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed (Debian: apt-get install texlive-latex-base "
                    "texlive-latex-recommended; make test installs them as root); the LaTeX output was not compiled")


def compile_fragments(fragments: list[str], folder: Path, measure: bool = False) -> str:
    """pdflatex on a two-column article around the fragments; returns the log (fails on a LaTeX error).
    ``measure``: each tabular is boxed first and its width written to the log (``tabular_widths``)."""
    document = latex_document(fragments)
    if measure:
        document = TABULAR.sub(lambda m: r"\setbox0\hbox{" + m.group(1) + r"}\typeout{TABULAR-WIDTH=\the\wd0}\box0", document)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tables.tex").write_text(document)
    out = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "tables.tex"],
                         cwd=folder, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:]
    assert (folder / "tables.pdf").stat().st_size > 1000
    return (folder / "tables.log").read_text(errors="replace")


def overfull_boxes(log: str) -> list[str]:
    """Every 'Overfull \\hbox' line of a pdflatex log: something set wider than the line it is in."""
    return [line for line in log.splitlines() if line.startswith("Overfull \\hbox")]


def tabular_widths(log: str) -> list[float]:
    return [float(w) for w in re.findall(r"TABULAR-WIDTH=([\d.]+)pt", log)]


def estimates(fragment: str) -> float:
    """The width the writer estimated, from its comment line."""
    return float(re.search(r"about (\d+) pt wide", fragment).group(1))
