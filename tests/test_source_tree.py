"""Tests never write into the checkout: the session fixture in conftest.py compares the tree before and
after; here, that its comparison sees a write, and that table caches follow $LTBENCH_CACHE_DIR."""

import os
from pathlib import Path

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
