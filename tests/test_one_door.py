"""The one door to the disk (ltbench/results/store.py): every read of a results folder, cache or journal is bounded
(regular files only, no symlink followed, a FIFO never blocks, a size bound), every write is atomic or no-follow
and inside the root; one flock helper, which names the mount where locks do not work; code-record paths stay in
their package; the TorchScript reader decompresses each member once; text from the environment is bounded."""

from __future__ import annotations

import ast
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from ltbench.errors import shorten
from ltbench.results import identity, store

ROOT = Path(__file__).resolve().parents[1]

# Calls that open a file by its path. Outside the store they are allowed only on a file object the store opened
# (``store.open_bounded``) or an in-memory buffer, or where the file is not a results file (the list below).
OPENERS = {"open", "os.open", "read_text", "write_text", "read_bytes", "write_bytes", "np.load", "torch.load",
           "zipfile.ZipFile"}
NOT_RESULTS = {  # (file, call): why the file it opens is no results file
    ("ltbench/recipe/__init__.py", "open"): "the recipe the user names (code: docs/trust.md)",
    ("ltbench/train/resources.py", "open"): "cgroup and /proc files (the CPU and memory this process may use)",
    ("ltbench/results/provenance.py", "open"): "/proc/cpuinfo",
    ("ltbench/results/caches.py", "os.open"): "the user's cache key (config folder: made O_EXCL 0600, read O_NOFOLLOW, "
                                              "its owner, mode and size checked)",
    ("ltbench/results/provenance.py", "read_text"): "an installed package's version.py",
    ("ltbench/results/protocol.py", "read_text"): "known_files.yaml, shipped with ltbench",
    ("ltbench_foundation/prompts.py", "read_text"): "prompt lists shipped with the package",
    ("ltbench_foundation/weights.py", "np.load"): "a weights file the user names (checked: regular, bounded)",
    ("ltbench_foundation/weights.py", "torch.load"): "a weights file the user names (checked: regular, bounded)",
    ("ltbench_foundation/scripted.py", "zipfile.ZipFile"): "a weights file the user names (checked first)",
    ("ltbench/data/base.py", "open"): "a dataset file the user names",
    ("ltbench/data/cifar.py", "open"): "a dataset file the user names",
    ("ltbench/data/splitlist.py", "read_bytes"): "a split list the user names",
}


def _call_name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        base = func.value
        if isinstance(base, ast.Name) and f"{base.id}.{func.attr}" in OPENERS:
            return f"{base.id}.{func.attr}"
        return func.attr if func.attr in ("read_text", "write_text", "read_bytes", "write_bytes") else ""
    return ""


def _door_names(tree: ast.AST) -> set[str]:
    """Names bound to a file object the store opened or to an in-memory buffer (``with ... as f``, ``f = ...``)."""
    def is_door(value) -> bool:
        return isinstance(value, ast.Call) and ast.unparse(value.func) in ("store.open_bounded", "io.BytesIO")
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.withitem) and is_door(node.context_expr) and isinstance(node.optional_vars, ast.Name):
            names.add(node.optional_vars.id)
        if isinstance(node, ast.Assign) and is_door(node.value):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def test_no_file_is_opened_by_path_outside_the_store():
    found, used = [], set()
    for path in sorted([*ROOT.glob("ltbench/**/*.py"), *ROOT.glob("methods/**/*.py"), *ROOT.glob("ltbench_foundation/**/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "ltbench/results/store.py":
            continue
        tree = ast.parse(path.read_text())
        door = _door_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or _call_name(node.func) not in OPENERS:
                continue
            name, first = _call_name(node.func), node.args[0] if node.args else None
            if isinstance(first, ast.Name) and first.id in door:
                continue
            if (rel, name) in NOT_RESULTS:
                used.add((rel, name))
                continue
            found.append(f"{rel}:{node.lineno}: {name}(...) (read with store.read_bounded / open_bounded, write with "
                         f"store.atomic_write_bytes / open_append)")
    assert not found, "\n".join(found)
    assert used == set(NOT_RESULTS), f"allow-list entries no longer needed: {set(NOT_RESULTS) - used}"


# ------------------------------------------------------------------------------------------------
# Reads: a FIFO or a 20 GB sparse file where a small file belongs neither hangs nor fills the memory

HOSTILE_READS = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from ltbench.results import caches, store
    from ltbench.run.progress import read_heartbeat
    from ltbench.run.run_status_view import describe_run

    run_dir, kind = Path(sys.argv[1]), sys.argv[2]
    def plant(path):
        if kind == "fifo":
            os.mkfifo(path)
        else:
            with open(path, "wb") as f:
                f.truncate(20 * 1024 ** 3)  # sparse: 20 GB long, no block on the disk
    for name in ("progress.json", "submitted.json", "started.json", "cache.json"):
        plant(run_dir / name)
    assert read_heartbeat(run_dir) is None
    assert store.read_started(run_dir) == {}
    status, note = describe_run(run_dir, listed=True)
    assert "submitted.json unreadable" in note, (status, note)
    assert caches.read_sealed(run_dir / "cache.json", inputs=[]) is None
    # VmHWM: this process's own peak (ru_maxrss survives exec, so it would count the forking pytest worker's)
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    peak_mb = int(hwm.split()[1]) / 1024
    assert peak_mb < 1000, peak_mb  # nothing of the 20 GB was read
    print("ok", status)
""")


@pytest.mark.parametrize("kind", ["fifo", "sparse"])
def test_a_fifo_or_a_huge_file_as_progress_submitted_or_a_cache_is_refused_without_reading(tmp_path, kind):
    run_dir = tmp_path / "results" / "abc123"
    run_dir.mkdir(parents=True)
    # the timeout only guards the suite against a hang (the old read_text blocked on a FIFO for ever)
    got = subprocess.run([sys.executable, "-c", HOSTILE_READS, str(run_dir), kind], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert got.returncode == 0 and got.stdout.startswith("ok "), got.stdout + got.stderr


def test_a_symlink_is_never_read_as_a_results_file(tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text('{"job_id": "from outside"}')
    (tmp_path / store.SUBMITTED).symlink_to(secret)
    with pytest.raises(store.UnusableFile, match="is a symlink"):
        store.load_json(tmp_path / store.SUBMITTED)
    assert store.read_bounded(secret) == secret.read_bytes()  # the file itself reads


# ------------------------------------------------------------------------------------------------
# Writes: a planted link to a file outside the results root is never written through


@pytest.fixture
def planted(tmp_path):
    """(results root, a run folder in it, the file outside that every planted link points to)."""
    root, outside = tmp_path / "results", tmp_path / "outside"
    run_dir = root / "recipe" / "abc123"
    run_dir.mkdir(parents=True)
    outside.mkdir()
    victim = outside / "precious.txt"
    victim.write_text("keep me")
    store.guard_writes_under(root)
    return root, run_dir, victim


def _untouched(victim: Path) -> None:
    assert victim.read_text() == "keep me" and [p.name for p in victim.parent.iterdir()] == [victim.name]


def test_the_heartbeat_a_report_and_a_cache_replace_a_planted_link(planted):
    from ltbench.results import caches
    from ltbench.train.heartbeat import HEARTBEAT, write_beat

    root, run_dir, victim = planted
    links = {run_dir / HEARTBEAT: b'{"phase": "writing"}',
             run_dir / f"{HEARTBEAT}.tmp": None,  # where the old heartbeat wrote its temporary file
             root / "recipe" / "report" / "table.md": b"| a |",
             root / "recipe" / ".ltbench-index": b"{}"}
    for link in links:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(victim)
    write_beat(run_dir, {"phase": "writing"})
    store.atomic_write_bytes(root / "recipe" / "report" / "table.md", b"| a |")
    caches.write_sealed(root / "recipe" / ".ltbench-index", [], b"{}")
    _untouched(victim)
    for link, data in links.items():
        if data is not None:
            assert not link.is_symlink() and data in link.read_bytes()


def test_appends_locks_and_the_journal_refuse_a_planted_link(planted):
    from ltbench.recipe import tpe as recipe_tpe
    from ltbench.run import tpe as run_tpe

    root, run_dir, victim = planted
    for name in (store.LOG, store.LOCK, run_tpe.LOCK):
        (run_dir / name).symlink_to(victim)
    (run_dir / "worker.log").symlink_to(victim.parent / "created.txt")  # dangling: O_CREAT would make its target
    with pytest.raises(OSError, match="symlink"):
        store.open_append(run_dir / "worker.log")  # the launcher's worker log (run/local_pool.py)
    with pytest.raises(OSError, match="symlink"):
        store.append_jsonl(run_dir / store.LOG, {"epoch": 1})
    with pytest.raises(OSError, match="symlink"):  # the search's lock (run/tpe.py)
        with run_tpe.search_lock(run_dir):
            pass
    claim = store.claim_run(run_dir)  # the run's lock: the link is set aside, a lock file of its own made
    assert claim is not None and not (run_dir / store.LOCK).is_symlink()
    claim.close()
    journal = recipe_tpe.journal_path(run_dir)
    journal.symlink_to(victim)
    with pytest.raises(recipe_tpe.ConfigError, match="not a usable Optuna journal.*symlink"):
        recipe_tpe.open_journal(journal, pytest.importorskip("optuna"))
    _untouched(victim)


def test_a_write_through_a_folder_linked_out_of_the_root_is_refused_for_appends_and_locks(planted):
    root, run_dir, victim = planted
    (run_dir / "elsewhere").symlink_to(victim.parent, target_is_directory=True)
    for write in (lambda p: store.open_append(p), lambda p: store.lock_file(p)):
        with pytest.raises(store.OutsideRootError):
            write(run_dir / "elsewhere" / "x")
    _untouched(victim)


# ------------------------------------------------------------------------------------------------
# Code records: a path read from a record stays in its package, a data file is hashed within a bound


def test_code_record_paths_stay_inside_their_package_and_data_hashes_are_bounded(tmp_path):
    plug = tmp_path / "plug"
    plug.mkdir()
    (plug / "__init__.py").write_text("")
    (plug / "names.txt").write_text("cat\ndog\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("cat\ndog\n")
    with open(plug / "big.bin", "wb") as f:
        f.truncate(200 * 1024 ** 3)  # a 200 GB sparse file a record names as data
    good = identity.file_sha256(plug / "names.txt")
    plugins = {"plug": f"{identity.PLUGIN_FOLDER_SOURCE}{plug}"}

    def state(code: dict) -> identity.CodeState:
        return identity.code_state({"code": code, "plugins": plugins, "code_scope": identity.code.CODE_SCOPE})

    assert state({"data:plug/names.txt": {"sha256": good}}).status == "done"
    for key in ("data:plug/../outside.txt", "data:plug/big.bin", f"data:plug/../../{outside.relative_to('/')}"):
        verdict = state({key: {"sha256": good}})  # never followed out, never hashed in full: unknown, not stale
        assert verdict.status == identity.CODE_UNKNOWN and verdict.unknown == (key,), (key, verdict)
    assert identity.code_file("plug.x", {"path": "../outside.txt"}, [str(plug)]) is None
    assert identity.code_file("plug.x", {"path": str(outside)}, [str(plug)]) is None
    assert identity.code_file("plug", {"path": "plug/__init__.py"}, [str(plug)]) == plug / "__init__.py"


# ------------------------------------------------------------------------------------------------
# The TorchScript reader: each member decompressed once, the total bounded by the file's size


def _archive(path: Path, refs: int, numel: int, compress: int) -> Path:
    """A TorchScript-shaped zip whose data.pkl names one float member ``refs`` times (as parameters p0, p1...)."""
    import collections
    import io
    import pickle

    import torch

    class Storage:
        pass

    storage = Storage()

    class Tensor:
        def __reduce__(self):
            return (torch._utils._rebuild_tensor_v2, (storage, 0, (numel,), (1,), False, collections.OrderedDict()))

    module = type(sys)("__torch__")
    module.M = type("M", (), {"__module__": "__torch__",
                              "__getstate__": lambda self: {f"p{i}": Tensor() for i in range(refs)}})
    module.M.__qualname__ = "M"
    sys.modules["__torch__"] = module
    try:
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=2)
        pickler.persistent_id = lambda obj: ("storage", torch.FloatStorage, "0", "cpu", numel) \
            if obj is storage else None
        pickler.dump(module.M())
    finally:
        del sys.modules["__torch__"]
    params = ", ".join(f"'p{i}'" for i in range(refs))
    with zipfile.ZipFile(path, "w", compression=compress) as z:
        z.writestr("a/data.pkl", buffer.getvalue())
        z.writestr("a/code/__torch__.py", f"class M:\n  __parameters__ = [{params}]\n")
        z.writestr("a/data/0", bytes(4 * numel))
    return path


def test_a_torchscript_member_named_many_times_is_decompressed_once(tmp_path, monkeypatch):
    scripted = pytest.importorskip("ltbench_foundation.scripted")
    reads = []
    original = zipfile.ZipFile.read
    monkeypatch.setattr(zipfile.ZipFile, "read", lambda self, name, *a: reads.append(name) or original(self, name, *a))
    state = scripted.read_torchscript(_archive(tmp_path / "x.pt", refs=2000, numel=1024, compress=zipfile.ZIP_STORED))
    assert len(state) == 2000 and reads.count("a/data/0") == 1  # 2000 tensors over one 4 kB member, read once
    assert len({t.untyped_storage().data_ptr() for t in state.values()}) == 1


def test_a_torchscript_member_inflating_past_the_files_size_is_refused(tmp_path):
    scripted = pytest.importorskip("ltbench_foundation.scripted")
    bomb = _archive(tmp_path / "bomb.pt", refs=1, numel=16 * 2**20, compress=zipfile.ZIP_DEFLATED)  # 64 MB of zeros
    assert bomb.stat().st_size < 2**20
    with pytest.raises(scripted.ArchiveError, match="more than 4 times the file's size"):
        scripted.read_torchscript(bomb)


# ------------------------------------------------------------------------------------------------
# The flock probe: on a filesystem without locks, one line names the mount and says what to do

NO_LOCKS = ("import errno, fcntl, sys\n"
            "def refuse(fd, op):\n"
            "    raise OSError(errno.ENOSYS, 'Function not implemented')  # as on a mount without locks\n"
            "fcntl.flock = refuse\n"
            "from ltbench.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")


def test_a_results_folder_without_file_locks_is_named_with_its_mount_before_any_run(write_recipe):
    path = write_recipe()
    got = subprocess.run([sys.executable, "-c", NO_LOCKS, "run", str(path)], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    lines = [x for x in got.stderr.splitlines() if x.strip()]
    assert got.returncode == 2 and len(lines) == 1 and "Traceback" not in got.stderr, got.stdout + got.stderr
    point, kind = store.mount_of(path.parent)
    assert f"file locks do not work on its filesystem ({point}, {kind}: Function not implemented)" in lines[0]
    assert f"mount {point} with locking" in lines[0] and "--results" in lines[0]
    assert not list((path.parent / "results").rglob("started.json"))  # no run started


# ------------------------------------------------------------------------------------------------
# Bounded text: a value from the environment or the disk reaches a note cut, with its length and hash


def test_a_huge_environment_value_reaches_a_numerics_note_bounded_with_its_hash():
    big, other = "AVX512_CORE_AMX" * 7000, "AVX512_CORE_AMX" * 6999 + "AVX2"
    note = identity.numerics_value("kernel_env", {"ONEDNN_MAX_CPU_ISA": big, "MKL_CBWR": "COMPATIBLE"})
    assert len(note) < 200 and "MKL_CBWR=COMPATIBLE" in note and f"{len(big)} characters, sha256" in note
    assert note != identity.numerics_value("kernel_env", {"ONEDNN_MAX_CPU_ISA": other, "MKL_CBWR": "COMPATIBLE"})
    assert shorten("short") == "short" and "\x1b" not in shorten("a\x1b[2J" * 100, 50)
    contrast = identity.numerics_contrast({"device": "cpu", "kernel_env": {"X": big}},
                                          {"device": "cpu", "kernel_env": {}})
    assert 0 < len(contrast) < 200, contrast


def test_the_launcher_sets_a_planted_worker_log_aside_and_writes_its_own(write_recipe, tmp_path, monkeypatch):
    from ltbench.recipe import load_recipe
    from ltbench.run import local_pool

    (spec,) = load_recipe(write_recipe()).runs[:1]
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True)
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    (run_dir / "worker.log").symlink_to(victim)
    monkeypatch.setattr(local_pool.subprocess, "Popen", lambda cmd, stdout, **kw: stdout.write(b"worker output\n"))
    local_pool._start_worker(spec, slot=1, jobs=2, redo=(), gpu=None, write=lambda line: None)
    assert victim.read_text() == "keep me" and (run_dir / "worker.log.damaged").is_symlink()
    assert (run_dir / "worker.log").read_bytes() == b"worker output\n"
    os.unlink(run_dir / "worker.log")
    os.mkfifo(run_dir / "worker.log")  # a FIFO there never blocks the launcher (the alarm only guards the suite)
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("opening a FIFO as worker.log blocked"))
    signal.alarm(60)
    try:
        local_pool._start_worker(spec, slot=1, jobs=2, redo=(), gpu=None, write=lambda line: None)
    finally:
        signal.alarm(0)
    assert (run_dir / "worker.log").read_bytes() == b"worker output\n"
