"""The one cache rule (ltbench/results/caches.py): a cache is valid when its seal verifies, and the seal is an
HMAC under this user's key of the code version, the cache's own inputs and its bytes. So a change that cannot
alter the expansion (a table caption, an unrelated package installed) keeps it: ``status`` and ``table`` then
import no torch. A cache made under another key, or forged by someone without the key, is rebuilt."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cachekit import edit_json_cache, sealed_as_owner
from conftest import ROOT, caches_in_the_results_folder, run_cli
from ltbench.results import caches

NO_TORCH = ("import sys; sys.modules['torch'] = sys.modules['torchvision'] = None; from ltbench.cli import main; "
            "raise SystemExit(main(sys.argv[1:]))")  # any import of torch raises ImportError


def without_torch(*args, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_TORCH, *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, **env}, timeout=300)


@pytest.fixture
def quickstart(tmp_path):
    """recipes/quickstart.yaml copied to a temporary folder (with an empty results folder), expanded once by
    ``status``: (recipe path, the environment, status's output, table's output)."""
    path = tmp_path / "quickstart.yaml"
    shutil.copy(ROOT / "recipes" / "quickstart.yaml", path)
    (tmp_path / "results" / "quickstart").mkdir(parents=True)
    env = {"LTBENCH_CACHE_DIR": str(tmp_path / "cache")}
    first = run_cli("status", path, cwd=tmp_path, env=env)
    assert first.returncode == 0 and "4 pending" in first.stdout, first.stderr
    table = without_torch("table", path, cwd=tmp_path, env=env)  # the status above made the one expansion cache
    assert table.returncode == 0 and "| ce" in table.stdout, table.stderr
    return path, env, first.stdout, table.stdout


def test_a_caption_edit_keeps_the_expansion(quickstart):
    path, env, status, table = quickstart
    text = path.read_text()
    assert 'caption: "Fashion-MNIST-LT' in text
    path.write_text(text.replace('caption: "Fashion-MNIST-LT', 'caption: "Edited: Fashion-MNIST-LT'))
    got = [without_torch(cmd, path, cwd=path.parent, env=env) for cmd in ("status", "table")]
    assert [g.returncode for g in got] == [0, 0], [g.stderr for g in got]
    assert got[0].stdout == status
    assert "**Edited: Fashion-MNIST-LT" in got[1].stdout and got[1].stdout != table  # the new caption is shown


def test_an_unrelated_install_keeps_the_expansion(quickstart, tmp_path):
    """A new distribution on sys.path that neither ltbench nor a plugin imports (what ``pip install`` leaves: a
    ``*.dist-info`` folder and a module) is in no cache's inputs. Named site-packages: ltbench before the key
    took the mtime of every such folder on sys.path, so this install cost it a torch import."""
    path, env, status, _ = quickstart
    site = tmp_path / "site-packages"
    info = site / "unrelated_pkg-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: unrelated-pkg\nVersion: 1.0\n")
    (info / "RECORD").write_text("unrelated_pkg.py,,\nunrelated_pkg-1.0.dist-info/METADATA,,\n")
    (info / "entry_points.txt").write_text("[console_scripts]\nunrelated = unrelated_pkg:main\n")
    (site / "unrelated_pkg.py").write_text("def main():\n    return 0\n")
    env = {**env, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    got = [without_torch(cmd, path, cwd=path.parent, env=env) for cmd in ("status", "table")]
    assert [g.returncode for g in got] == [0, 0], [g.stderr for g in got]
    assert got[0].stdout == status


def test_a_change_that_alters_the_expansion_expands_it_again(quickstart):
    """The control of the two tests above: what the runs depend on (the seeds) is an input, so the cache misses
    and the command imports torch (here: refused)."""
    path, env, _, _ = quickstart
    path.write_text(path.read_text().replace("seeds: [0]", "seeds: [0, 1]"))
    got = without_torch("status", path, cwd=path.parent, env=env)
    assert got.returncode != 0 and "torch" in got.stderr


def test_installed_plugins_names_plugin_packages_only(tmp_path, monkeypatch):
    site = tmp_path / "site"
    for name, entry_points in (("unrelated-1.0", "[console_scripts]\nx = y:z\n"), ("quiet-2.0", None),
                               ("ltplug-0.1", "[ltbench.methods]\nmine = ltplug:Mine\n")):
        info = site / f"{name}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Name: {name}\n")
        if entry_points:
            (info / "entry_points.txt").write_text(entry_points)
    before = caches.installed_plugins()
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    found = caches.installed_plugins()
    assert [f for f in found if f not in before] == [f for f in found if "ltplug-0.1.dist-info" in f] != []


# ------------------------------------------------------------------------------------------------
# The seal only this user can make (issue 52)


def cli_main(*args) -> tuple[int, str, str]:
    from ltbench.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def four_done(write_recipe, monkeypatch):
    """A recipe of 2 methods x 2 seeds whose 4 runs are finished (hand-written results with real run ids),
    its caches in its results folder; ``loads`` counts the expansions."""
    from ltbench.recipe import load_recipe
    from ltbench.report import expected
    from reportkit import populate

    path = write_recipe(extra={"seeds": [0, 1], "grid": {"method": [{"name": "ce"}, {"name": "la", "tau": 1.0}]}})
    recipe = load_recipe(path)
    populate(recipe)
    loads = []
    real = expected.load_recipe
    monkeypatch.setattr(expected, "load_recipe", lambda *a, **k: loads.append(a) or real(*a, **k))
    with caches_in_the_results_folder():
        yield path, recipe, loads


def _done(out: str) -> int:
    """Lines of finished runs (a run id, then 'done')."""
    return sum(1 for line in out.splitlines() if len(line.split()[0]) == 12 and line.split()[1:2] == ["done"])


def test_a_cache_copied_from_another_key_is_rebuilt(four_done, tmp_path, monkeypatch):
    path, recipe, loads = four_done
    clean = cli_main("status", path)
    assert _done(clean[1]) == 4 and len(loads) == 1
    assert cli_main("status", path) == clean and len(loads) == 1  # the cache, under this key
    monkeypatch.setenv(caches.KEY_ENV, str(tmp_path / "another user" / "cache.key"))  # the file, another key
    assert cli_main("status", path) == clean and len(loads) == 2  # not trusted: expanded again, sealed anew
    assert cli_main("status", path) == clean and len(loads) == 2


@pytest.mark.parametrize("scheme", ["old scheme", "wrong key"])
def test_a_cache_forged_without_the_key_is_not_trusted(four_done, scheme):
    """``runs: []`` sealed as ltbench sealed caches before the key (size and mtime of its files: anyone can
    compute it), or under another key: status still shows the 4 finished runs. Sealed with the key, the same
    edit is trusted (the control: the seal is what decides)."""
    from ltbench.recipe import expansion

    path, recipe, loads = four_done
    clean = cli_main("status", path)
    (cache,) = recipe.root.glob(".ltbench-expansion-*")
    inputs = expansion.expansion_inputs(expansion.read_recipe(path), [])
    edit_json_cache(cache, lambda d: d.__setitem__("runs", "[]"), inputs, scheme)
    got = cli_main("status", path)
    assert got == clean and _done(got[1]) == 4 and len(loads) == 2
    edit_json_cache(cache, lambda d: d.__setitem__("runs", "[]"), inputs, scheme)
    data = cache.read_bytes().partition(b"\n")[2]
    cache.write_bytes(sealed_as_owner(data, inputs))
    assert _done(cli_main("status", path)[1]) == 0 and len(loads) == 2


def test_the_key_is_made_once_mode_0600_and_refused_otherwise(tmp_path, monkeypatch, capsys):
    key = tmp_path / "config" / "ltbench" / "cache.key"
    monkeypatch.setenv(caches.KEY_ENV, str(key))
    monkeypatch.setattr(caches, "_keys", {})
    made = caches.user_key()
    assert len(made) == caches.KEY_BYTES and oct(key.stat().st_mode & 0o777) == "0o600"
    monkeypatch.setattr(caches, "_keys", {})
    assert caches.user_key() == made  # read, not made again
    assert caches.memo(tmp_path / "c.json", ["a"], lambda: 1) == 1
    assert caches.memo(tmp_path / "c.json", ["a"], lambda: 2) == 1  # kept
    assert caches.memo(tmp_path / "c.json", ["b"], lambda: 3) == 3  # other inputs: computed again
    for refused in ("group-readable", "a link", "a fifo"):
        monkeypatch.setattr(caches, "_keys", {})
        monkeypatch.setattr(caches, "_noted", [])
        bad = tmp_path / refused / "cache.key"
        bad.parent.mkdir()
        if refused == "group-readable":
            bad.write_bytes(made)
            bad.chmod(0o640)
        elif refused == "a link":
            bad.symlink_to(key)
        else:
            os.mkfifo(bad, 0o600)
        monkeypatch.setenv(caches.KEY_ENV, str(bad))
        assert caches.memo(tmp_path / "c.json", ["b"], lambda: 4) == 4  # no cache without a usable key
        assert "cache not used" in capsys.readouterr().err


def test_processes_that_make_the_key_at_once_end_with_one_key(tmp_path):
    """The key is linked into place from a private temporary file: of several first calls at once, one makes
    it and every other reads that one (none is left with a key whose caches the next call cannot read)."""
    env = {**os.environ, caches.KEY_ENV: str(tmp_path / "config" / "cache.key")}
    code = "from ltbench.results import caches; print(caches.user_key().hex())"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(4)]
    keys = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert len(keys) == 1 and (tmp_path / "config" / "cache.key").read_bytes().hex() in keys
    assert sorted(p.name for p in (tmp_path / "config").iterdir()) == ["cache.key"]  # no temporary file left


def test_the_key_lives_in_the_users_config_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(caches.KEY_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert caches.key_path() == tmp_path / "xdg" / "ltbench" / "cache.key"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert caches.key_path() == tmp_path / "home" / ".config" / "ltbench" / "cache.key"
