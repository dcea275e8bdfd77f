"""The caches of a recipe's expansion (ltbench/recipe/expansion.py): ``ltbench status RECIPE`` reads its runs from
the cache, so it runs where torch cannot be imported; anything the expansion depends on changing makes it
(and the tables' cache, report/expected.py) expand again."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cachekit import read_json_cache, runs_edit, sealed_as_owner
from conftest import ROOT, caches_in_the_results_folder, run_cli

NO_TORCH = "import sys; sys.modules['torch'] = None; from ltbench.cli import main; raise SystemExit(main(sys.argv[1:]))"
IN_RESULTS = {"LTBENCH_CACHE_DIR": ""}  # the cache in the (temporary) results folder, where the test can see it


def status_without_torch(*args) -> subprocess.CompletedProcess:
    """``ltbench status ARGS`` in a process where ``import torch`` raises ImportError."""
    return subprocess.run([sys.executable, "-c", NO_TORCH, "status", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, **IN_RESULTS}, timeout=120)


def expands(*args) -> bool:
    """Whether status had to expand the recipe (it failed on importing torch)."""
    result = status_without_torch(*args)
    return result.returncode != 0 and "import of torch halted" in result.stderr


@pytest.mark.slow  # 11 ltbench processes, three of them import torch (about 6 s on an idle machine)
def test_status_of_a_recipe_needs_no_torch_once_cached_and_never_shows_a_stale_cache(write_recipe, tmp_path):
    plugins = tmp_path / "plug"
    plugins.mkdir()
    (plugins / "helpers.py").write_text("SCALE = 1\n")
    recipe = write_recipe("tiny", {"plugins": [str(plugins)]})
    (tmp_path / "results" / "tiny").mkdir(parents=True)

    assert expands(recipe)  # nothing cached yet: the expansion imports the plugins, hence torch
    first = run_cli("status", recipe, env=IN_RESULTS)
    assert first.returncode == 0 and "1 pending" in first.stdout, first.stderr
    cached = status_without_torch(recipe)
    assert cached.returncode == 0, cached.stderr
    assert cached.stdout == first.stdout

    recipe.write_text(recipe.read_text().replace("- 0", "- 0\n- 1"))  # seeds: [0, 1]
    assert expands(recipe)  # the recipe changed: the cache is not used
    second = run_cli("status", recipe, env=IN_RESULTS)
    assert "2 pending" in second.stdout, second.stderr
    assert status_without_torch(recipe).stdout == second.stdout
    assert expands(recipe, "optim.epochs=3")  # other overrides: not cached yet

    (plugins / "helpers.py").write_text("SCALE = 2\n")  # plugin code changed
    assert expands(recipe)
    assert run_cli("status", recipe, env=IN_RESULTS).stdout == second.stdout
    assert status_without_torch(recipe).stdout == second.stdout


def test_a_cached_run_folder_outside_the_results_root_is_expanded_again(write_recipe, tmp_path, monkeypatch):
    """The one check of a cache's entries (ltbench/results/caches.py): even under a good seal, a run folder
    that does not lie inside the results root sends the command back to the expansion."""
    from ltbench.recipe import expansion
    from ltbench.report import expected

    path = write_recipe("tiny")
    (tmp_path / "results" / "tiny").mkdir(parents=True)
    with caches_in_the_results_folder():
        recipe = expected.load_and_remember(path)
        recipe_file = expansion.read_recipe(path, [], None)
        (cache,) = recipe.root.glob(".ltbench-expansion-tiny-*.json")
        loads = []
        real = expected.load_recipe
        monkeypatch.setattr(expected, "load_recipe", lambda *a, **k: loads.append(a) or real(*a, **k))
        assert expected.status_runs(path)[1][0].run_dir == recipe.runs[0].run_dir and not loads
        saved = read_json_cache(cache)
        for where in (str(tmp_path / "elsewhere"), str(recipe.root / ".." / recipe.runs[0].run_id)):
            runs_edit(lambda runs: runs[0].__setitem__("run_dir", where))(saved)
            cache.write_bytes(sealed_as_owner(json.dumps(saved).encode(), expansion.expansion_inputs(recipe_file, [])))
            assert expected.status_runs(path)[1][0].run_dir == recipe.runs[0].run_dir and loads
            loads.clear()


def test_the_table_cache_sees_a_change_in_a_plugin_path_folder(write_recipe, tmp_path, monkeypatch):
    """The tables' expansion cache (report/expected.py) takes the same signature: a method defined in a
    $LTBENCH_PLUGIN_PATH folder can change every run id of a recipe, so editing it expands again."""
    from ltbench.recipe import load_recipe
    from ltbench.registry import PLUGIN_PATH_ENV
    from ltbench.report import expected

    path = write_recipe("tiny")
    (tmp_path / "results" / "tiny").mkdir(parents=True)
    recipe = load_recipe(path)
    folder = tmp_path / "env_plugins"
    folder.mkdir()
    (folder / "defaults.py").write_text("TAU = 1.0\n")
    monkeypatch.setenv(PLUGIN_PATH_ENV, str(folder))
    expansions = []
    monkeypatch.setattr(expected, "load_recipe", lambda *a, **k: expansions.append(a) or recipe)
    with caches_in_the_results_folder():
        for _ in range(2):
            assert [e["run_id"] for e in expected.recipe_runs(path).expected] == [r.run_id for r in recipe.runs]
        assert len(expansions) == 1  # the second read came from the cache
        (folder / "defaults.py").write_text("TAU = 2.0\n")
        expected.recipe_runs(path)
        assert len(expansions) == 2


NO_TORCH_AT_ALL = ("import sys; sys.modules['torch'] = sys.modules['torchvision'] = None; from ltbench.cli import main; "
                   "code = main(sys.argv[1:]); assert 'torch' not in sys.modules or sys.modules['torch'] is None; "
                   "raise SystemExit(code)")


@pytest.mark.slow  # one ltbench process imports torch (the launch), four do not
def test_after_any_expansion_status_table_and_list_of_a_recipe_import_no_torch(write_recipe, tmp_path):
    """Issue 40: whichever command expanded a recipe (here ``run --dry-run``, before the results folder
    exists), ``status``, ``table`` and ``list`` then answer in a process where importing torch or torchvision
    fails; a recipe never launched is cached in the cache folder, not in a results folder."""
    recipe = write_recipe("tiny")
    cache = tmp_path / "cache"
    env = {**os.environ, "LTBENCH_CACHE_DIR": str(cache)}
    dry = subprocess.run([sys.executable, "-m", "ltbench", "run", str(recipe), "--dry-run"], capture_output=True,
                         text=True, cwd=ROOT, env=env, timeout=300)
    assert dry.returncode == 0, dry.stderr
    assert not (tmp_path / "results").exists()
    (tmp_path / "results" / "tiny").mkdir(parents=True)  # a launch makes it; the caches stay where they were made
    for args in (["status", recipe], ["table", recipe], ["list", "methods"], ["list", "datasets", "--options"]):
        if args[0] == "list":  # discovery once, then the listing from the cache
            assert run_cli(*args, env={"LTBENCH_CACHE_DIR": str(cache)}).returncode == 0
        out = subprocess.run([sys.executable, "-c", NO_TORCH_AT_ALL, *map(str, args)], capture_output=True,
                             text=True, cwd=ROOT, env=env, timeout=120)
        assert out.returncode == 0, (args, out.stderr)
        assert ("1 pending" in out.stdout) if args[0] == "status" else ("ce" in out.stdout or "synthetic" in out.stdout)
