"""Shared fixtures: a tiny synthetic recipe and a CLI runner in a subprocess."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SKIP_IN_TREE = {".git", ".venv", "__pycache__", ".pytest_cache", "build", "data"}


def pytest_configure(config):
    """Table caches go to a temporary folder (ltbench.report.index.cache_file), also for the ltbench
    processes tests start: reading docs/reference-results must not write into the source tree."""
    import tempfile

    if "LTBENCH_CACHE_DIR" not in os.environ:
        config._ltbench_cache_dir = os.environ["LTBENCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="ltbench-test-cache-")
    if "LTBENCH_CACHE_KEY" not in os.environ:  # the caches' key (ltbench/results/caches.py), never the user's own
        os.environ["LTBENCH_CACHE_KEY"] = os.path.join(tempfile.mkdtemp(prefix="ltbench-test-key-"), "cache.key")


@contextlib.contextmanager
def caches_in_the_results_folder():
    """For tests that damage the caches where ltbench keeps them by default, in the results folder (a
    temporary one): $LTBENCH_CACHE_DIR, set for the rest of the suite, is unset while they run."""
    saved = os.environ.pop("LTBENCH_CACHE_DIR", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["LTBENCH_CACHE_DIR"] = saved


def pytest_unconfigure(config):
    import shutil

    folder = getattr(config, "_ltbench_cache_dir", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop("LTBENCH_CACHE_DIR", None)


def source_tree_state(root: Path = ROOT) -> dict[str, tuple[int, int]]:
    """Every file of the checkout (path -> size, mtime) outside .git, the venv and Python caches."""
    state = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_IN_TREE and not d.endswith(".egg-info")]
        for name in files:
            path = Path(folder, name)
            try:
                info = path.lstat()
            except OSError:
                continue
            state[path.relative_to(root).as_posix()] = (info.st_size, info.st_mtime_ns)
    return state


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the whole run's view: xdist's controller, or the one process
        session.config._tree_before = source_tree_state()


def pytest_sessionfinish(session, exitstatus):
    """The checkout must be as it was: a test that wrote into it (caches in docs/reference-results, figures,
    results/ ...) fails the run (LTBENCH_UPDATE_GOLDEN=1 may rewrite tests/golden). Checked once for the whole
    run, not in a test's teardown: the tree cannot tell which test wrote a file, nor whether another process
    did (an ``ltbench run`` in this checkout while the suite runs writes results/<recipe>/, which only gets a
    note: the tests never write there but through ltbench, whose runs here all go to temporary folders)."""
    before = getattr(session.config, "_tree_before", None)
    if before is None:
        return
    after = source_tree_state()
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p)
                     and not (os.environ.get("LTBENCH_UPDATE_GOLDEN") and p.startswith("tests/golden/")))
    elsewhere = [p for p in changed if not p.startswith("results/")]
    session.config._tree_changes = (elsewhere, [p for p in changed if p.startswith("results/")])
    if elsewhere:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    elsewhere, results = getattr(config, "_tree_changes", ([], []))
    if elsewhere:
        terminalreporter.section("the checkout changed while the tests ran", red=True)
        terminalreporter.write_line(f"FAILED: written by a test, or by another process in this checkout: {elsewhere[:20]}")
    if results:
        terminalreporter.section("results/ changed while the tests ran", yellow=True)
        terminalreporter.write_line(f"note: {len(results)} file(s) under results/ (an 'ltbench run' in this checkout "
                                    f"meanwhile? the tests write none there): {results[:5]}")


TINY = {
    "data": {"name": "synthetic_lt", "num_classes": 4, "max_per_class": 24, "imb_factor": 6, "test_per_class": 8,
             "image_size": 12},
    "backbone": {"name": "resnet8"},
    "method": {"name": "ce"},
    "optim": {"lr": 0.05, "batch_size": 16, "epochs": 2, "warmup_epochs": 0, "weight_decay": 5.0e-4},
    "train": {"progress": False},
    "seeds": [0],
}


def deep_update(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and v.get("name", out[k].get("name")) != out[k].get("name"):
            out[k] = v  # another plugin: its options replace the old ones
            continue
        out[k] = deep_update(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.fixture
def write_recipe(tmp_path):
    """write_recipe(name, **sections) -> path of a tiny synthetic recipe in tmp_path."""

    def make(name: str = "tiny", extra: dict | None = None) -> Path:
        recipe = deep_update(TINY, {"results_dir": str(tmp_path / "results"), **(extra or {})})
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(recipe))
        return path

    return make


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 300):
    """Run ``python -m ltbench ARGS`` in a fresh process, as a user would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "ltbench", *map(str, args)], capture_output=True, text=True,
                          env=full_env, cwd=cwd or ROOT, timeout=timeout)


@pytest.fixture
def cli():
    return run_cli


@contextlib.contextmanager
def registries_restored():
    """Plugins registered inside the block (a doc example's folder, say) are gone after it: the registries,
    the list of loaded plugin folders and the imported plugin modules are put back as they were, so a
    later test that expects such a name to be unknown, or imports another folder of that name, passes."""
    from ltbench import registry

    regs = list(registry.DISCOVERED)
    for reg in regs:  # the core and entry points first (the pipelines' core too): they must survive the restore
        reg.names()
    saved = {reg: dict(reg._entries) for reg in regs}
    folders = list(registry._plugin_paths)
    try:
        yield
    finally:
        for reg, entries in saved.items():
            reg._entries.clear()
            reg._entries.update(entries)
        added = [f for f in registry._plugin_paths if f not in folders]
        registry._plugin_paths[:] = folders
        for name, module in list(sys.modules.items()):
            if any(Path(w).resolve().is_relative_to(f) for w in _module_places(module) for f in added):
                del sys.modules[name]


def _module_places(module) -> list[str]:
    """A module's file, or a namespace package's folders (a plugin folder without __init__.py)."""
    places = [getattr(module, "__file__", None)]
    try:
        places += list(getattr(getattr(module, "__spec__", None), "submodule_search_locations", None) or [])
    except TypeError:  # an odd module whose spec is not a plain ModuleSpec
        pass
    return [p for p in places if isinstance(p, str)]
