"""No write through a symlinked folder that leads out of a results folder, for every writer: the report (its
tables and its figures), `ltbench plot`, a run's checkpoints and records, stage-2 feature caches and results
(store.check_inside, called by store.atomic_write_bytes, store.make_dirs and store.ensure_writable)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ltbench.results import store
from reportkit import populate

from tests.conftest import run_cli


@pytest.fixture
def tree(tmp_path, write_recipe):
    from ltbench.recipe import load_recipe

    path = write_recipe(extra={"seeds": [0, 1]})
    recipe = load_recipe(path)
    populate(recipe)
    outside = tmp_path / "outside"
    outside.mkdir()
    return Path(path), recipe, outside


def _nothing_written(outside: Path) -> None:
    assert not list(outside.rglob("*")), list(outside.rglob("*"))


@pytest.mark.parametrize("link, command", [
    ("report", ["report", "--test", "none"]),  # the report's tables (.md, .tex, .csv) and summary
    ("report/figures", ["plot", "--kind", "per_class"]),
    ("report/figures", ["report", "--test", "none"]),  # the report's figures
])
def test_a_report_or_plot_folder_linked_out_of_the_results_is_refused(tree, link, command):
    path, recipe, outside = tree
    target = recipe.root / link
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(outside, target_is_directory=True)
    got = run_cli(command[0], path, *command[1:], timeout=240)
    assert got.returncode == 2, got.stdout + got.stderr
    (line,) = [x for x in got.stderr.splitlines() if x.strip()]
    assert "a symlinked folder leads out of the results folder" in line and "Traceback" not in line, line
    _nothing_written(outside)


def test_checkpoints_records_and_stage2_files_are_not_written_through_a_linked_folder(tree):
    path, recipe, outside = tree
    store.guard_writes_under(recipe.root)
    run_dir = Path(recipe.runs[0].run_dir)
    for name in ("features", "posthoc", "elsewhere"):
        (run_dir / name).symlink_to(outside, target_is_directory=True)
    with pytest.raises(store.OutsideRootError):  # a checkpoint or result.json (train/checkpoint.py, runner.py)
        store.atomic_write_bytes(run_dir / "elsewhere" / store.CHECKPOINT, b"x")
    with pytest.raises(store.OutsideRootError):  # stage-2 results: RUN_DIR/posthoc/<id>/
        store.make_dirs(run_dir / "posthoc" / "0123456789ab")
    from ltbench.stage2 import features
    with pytest.raises(store.OutsideRootError):  # a feature cache's split file
        features.save_split(run_dir / "features" / "test.npz", {"features": np.zeros((2, 3))})
    linked_run = recipe.root / "0123456789ab"  # a run folder that is itself a link
    linked_run.symlink_to(outside, target_is_directory=True)
    with pytest.raises(store.OutsideRootError):
        store.atomic_write_json(linked_run / store.RESULT, {"status": "done"})
    _nothing_written(outside)
    real = recipe.root.parent / "real_results"  # a results folder that is itself a link to another disk: fine
    real.mkdir()
    linked_root = recipe.root.parent / "linked_root"
    linked_root.symlink_to(real, target_is_directory=True)
    store.guard_writes_under(linked_root)
    store.atomic_write_bytes(linked_root / "run" / "x", b"x") if (linked_root / "run").mkdir() is None else None
    assert (real / "run" / "x").read_bytes() == b"x"


def test_a_run_folder_linked_out_is_refused_by_run(tree, tmp_path):
    path, recipe, outside = tree
    run_dir = Path(recipe.runs[0].run_dir)
    for child in run_dir.iterdir():
        child.unlink()
    run_dir.rmdir()
    run_dir.symlink_to(outside, target_is_directory=True)
    got = run_cli("run", path, timeout=300)  # refused before any run (recipe: run folders inside the root)
    assert got.returncode == 2 and "outside the results root" in got.stderr, got.stdout + got.stderr
    _nothing_written(outside)
