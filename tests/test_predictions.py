"""Stored per-image predictions: written by a real run, and they reproduce its recorded accuracies."""

import json

import numpy as np
import pytest

from ltbench.results import store
from ltbench.evaluation import summarize
from ltbench.results.predictions import (PREDICTIONS, compact, correct, correct_by_seed, load_predictions,
                                 save_predictions)
from ltbench.report.significance import paired_bootstrap_pvalue


@pytest.fixture(scope="module")
def la_run(tmp_path_factory):
    """Two tiny post-hoc LA runs with an 'erm' head and two shifted test sets (about two seconds)."""
    import yaml

    from ltbench.run.local_pool import run_local
    from ltbench.recipe import load_recipe
    from tests.conftest import TINY, deep_update

    tmp = tmp_path_factory.mktemp("predictions")
    recipe = deep_update(TINY, {"results_dir": str(tmp / "results"), "method": {"name": "la_posthoc"}, "seeds": [0, 1],
                                "eval": {"test_sets": ["forward5", "backward5"]}})
    path = tmp / "tiny.yaml"
    path.write_text(yaml.safe_dump(recipe))
    run_local(load_recipe(path).runs)
    return sorted(p.parent for p in (tmp / "results").rglob(store.RESULT))


def test_run_writes_predictions_that_reproduce_the_recorded_accuracy(la_run):
    for run_dir in la_run:
        result = json.loads((run_dir / store.RESULT).read_text())
        assert result["status"] == "done", result.get("error")
        metrics = result["metrics"]
        arrays = load_predictions(run_dir)
        assert arrays["labels"].dtype == np.uint8 and len(arrays["labels"]) == 4 * 8
        assert float((arrays["head:main"] == arrays["labels"]).mean()) == metrics["all"]
        recomputed = summarize(arrays["head:main"], arrays["labels"], result["data"]["class_counts_train"])
        assert recomputed["per_class"] == metrics["per_class"]
        assert float(correct(run_dir, head="erm").mean()) == metrics["heads"]["erm"]["all"]
        for name in ("forward5", "backward5"):
            assert len(arrays[f"set:{name}:labels"]) == metrics["test_sets"][name]["size"]
            assert float(correct(run_dir, test_set=name).mean()) == metrics["test_sets"][name]["all"]
        assert not list(run_dir.glob(".*tmp*"))


def test_runs_by_seed_for_the_bootstrap(la_run):
    a, b = correct(la_run[0])[None], correct(la_run[1])[None]
    assert a.shape == b.shape == (1, 32) and a.dtype == bool
    assert 0.0 < paired_bootstrap_pvalue(a, b, n_resamples=500) <= 1.0
    by_seed = correct_by_seed({0: la_run[0], 1: la_run[1], 7: la_run[0].parent / "missing"})
    assert sorted(by_seed) == [0, 1] and by_seed[0].tolist() == correct(la_run[0]).tolist()


def test_missing_or_damaged_file_reads_as_none(tmp_path):
    assert load_predictions(tmp_path) is None and correct(tmp_path) is None
    (tmp_path / PREDICTIONS).write_bytes(b"PK\x03\x04 not really a zip")
    assert load_predictions(tmp_path) is None and correct(tmp_path) is None


def test_compact_types_hold_every_class_index():
    assert compact([0, 255], 256).dtype == np.uint8
    assert compact([0, 8141], 8142).dtype == np.uint16
    assert compact([0, 70_000], 70_001).tolist() == [0, 70_000]
