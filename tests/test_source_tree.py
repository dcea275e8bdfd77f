"""Tests never write into the checkout: conftest.py compares the tree before and after the whole run; here,
that its comparison sees a write, that it fails the run without blaming a test (a write under results/, where an
``ltbench run`` in the checkout writes meanwhile, is a note), and that table caches follow $LTBENCH_CACHE_DIR."""

import os
from pathlib import Path

from types import SimpleNamespace

import pytest

from tests import conftest
from tests.conftest import source_tree_state


def test_the_tree_check_sees_a_new_and_a_changed_file(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("a")
    before = source_tree_state(tmp_path)
    (tmp_path / "docs" / ".ltbench-index").write_text("cache")
    (tmp_path / "docs" / "a.md").write_text("changed")
    after = source_tree_state(tmp_path)
    assert sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p)) == \
        ["docs/.ltbench-index", "docs/a.md"]


def test_table_caches_go_to_ltbench_cache_dir(tmp_path, monkeypatch):
    from ltbench import report
    from ltbench.report.index import cache_file

    reference = Path(__file__).resolve().parents[1] / "docs" / "reference-results" / "quickstart"
    monkeypatch.setenv("LTBENCH_CACHE_DIR", str(tmp_path / "cache"))
    assert report.tables(reference)  # reads the reference results, writes its index cache elsewhere
    assert cache_file(reference, ".ltbench-index").is_file()
    assert str(cache_file(reference, ".ltbench-index")).startswith(str(tmp_path / "cache"))
    assert not (reference / ".ltbench-index").exists()
    monkeypatch.delenv("LTBENCH_CACHE_DIR")
    assert cache_file(tmp_path, "x") == tmp_path / "x"  # by default, in the results folder itself
    assert os.environ.get("LTBENCH_CACHE_DIR") is None


def test_a_write_fails_the_run_as_a_whole_and_one_under_results_is_only_a_note(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest, "source_tree_state", lambda: source_tree_state(tmp_path))
    (tmp_path / "docs").mkdir()
    session = SimpleNamespace(config=SimpleNamespace(), exitstatus=0)
    conftest.pytest_sessionstart(session)
    (tmp_path / "results" / "quickstart").mkdir(parents=True)
    (tmp_path / "results" / "quickstart" / "result.json").write_text("{}")  # another process's ltbench run
    conftest.pytest_sessionfinish(session, 0)
    assert session.exitstatus == 0 and session.config._tree_changes == ([], ["results/quickstart/result.json"])
    (tmp_path / "docs" / ".ltbench-index").write_text("cache")
    conftest.pytest_sessionfinish(session, 0)
    assert session.exitstatus == pytest.ExitCode.TESTS_FAILED
    assert session.config._tree_changes[0] == ["docs/.ltbench-index"]


def test_without_a_cache_dir_the_source_tree_and_a_missing_folder_are_cached_in_the_users_cache(tmp_path, monkeypatch):
    """Issue 40: 'ltbench table docs/reference-results/x' writes no cache into the docs, and a recipe never run
    (no results folder) is cached too, in $XDG_CACHE_HOME/ltbench; a writable results folder keeps its own."""
    from ltbench.results.store import cache_file

    reference = Path(__file__).resolve().parents[1] / "docs" / "reference-results" / "quickstart"
    monkeypatch.delenv("LTBENCH_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_file(reference, ".ltbench-index").is_relative_to(tmp_path / "xdg" / "ltbench")
    assert cache_file(tmp_path / "never-run", "x").is_relative_to(tmp_path / "xdg" / "ltbench")
    (tmp_path / "results").mkdir()
    assert cache_file(tmp_path / "results", "x") == tmp_path / "results" / "x"
