"""The closed name -> object tables (figure kinds, table formats, kappa solvers) share one lookup rule
(ltbench.registry.lookup): an unknown name is an LtbenchError with the closest known name and all of them."""

import pytest

from ltbench.errors import LtbenchError
from ltbench.registry import lookup


def test_lookup_finds_a_name_and_refuses_an_unknown_one_with_a_hint():
    table = {"markdown": 1, "latex": 2, "csv": 3}
    assert lookup(table, "latex", "table format") == 2
    with pytest.raises(LtbenchError, match=r"unknown table format 'latx'\. Did you mean 'latex'\? Known: csv, latex, "
                                           r"markdown"):
        lookup(table, "latx", "table format")
    with pytest.raises(LtbenchError, match=r"unknown table format 3\. Known"):
        lookup(table, 3, "table format")


def test_figure_kinds_and_formats_use_it_and_kappa_solvers_are_checked_at_load():
    from ltbench.report.document import FIGURES, figure_kind
    from ltbench.report.formats import render
    from methods._vmf import KAPPA_SOLVERS
    from methods.bape import BAPEConfig
    from methods.posthoc_bape import BapeRefitConfig

    from ltbench.report.plots import DRAWN_CLASS_STATS
    from ltbench.report.document import FIGURE_FILES

    assert figure_kind("kappa") is figure_kind("class_stats") is FIGURES["class_stats"]  # the earlier name
    assert FIGURE_FILES["kappa"] == FIGURE_FILES["class_stats"] == DRAWN_CLASS_STATS
    with pytest.raises(LtbenchError, match="unknown figure kind 'shfit'. Did you mean 'shift'"):
        figure_kind("shfit")
    with pytest.raises(LtbenchError, match="unknown table format 'html'.*Known: csv, latex, markdown"):
        render(None, "html")

    # The kappa solvers are reached only through a config field typed Literal[...KAPPA_SOLVERS names], which
    # refuses any other name when the recipe is loaded; the table and the Literal must name the same solvers.
    import typing
    from dataclasses import fields

    for config in (BAPEConfig, BapeRefitConfig):
        field = next(f for f in fields(config) if f.name == "kappa_solver")
        assert set(typing.get_args(typing.get_type_hints(config)[field.name])) == set(KAPPA_SOLVERS)
