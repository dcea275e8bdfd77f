"""Numerics (issue 31): which thread count a run gets, and how tables treat results of one run id made under
different numerics. Fast: no training (the tiny-run versions are in tests/test_identity.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ltbench import report
from ltbench.recipe import load_recipe
from ltbench.results import identity, provenance, status_rule, store
from ltbench.run import local_pool
from tests.reportkit import FAKE_NUMERICS, complete_result, write_run


def test_a_cpu_run_gets_one_thread_whatever_the_machine_and_the_launcher_say():
    env = {"SLURM_CPUS_PER_TASK": "8", provenance.THREADS_ENV: "4"}
    assert provenance.thread_count(None, "cpu", env)[0] == 1
    assert provenance.thread_count(0, "cpu", env)[0] == 1
    assert provenance.thread_count(3, "cpu", env) == (3, "train.threads")  # asked for: taken, and recorded
    assert provenance.thread_count(3, "cuda", env) == (3, "train.threads")


def test_a_pool_worker_on_a_gpu_takes_its_share_not_the_inherited_slurm_allocation(monkeypatch):
    """Issue 30 step 5: runs_per_gpu workers inherited SLURM_CPUS_PER_TASK (the whole allocation), which the
    engine preferred to their share. The pool now hands each worker its share of the cores this process may
    use (the affinity mask, not cpu_count), and the thread rule prefers it."""
    monkeypatch.setattr(provenance.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7}, raising=False)
    monkeypatch.setattr(provenance.os, "cpu_count", lambda: 64)
    assert provenance.usable_cores() == 8
    env = local_pool.worker_env({"SLURM_CPUS_PER_TASK": "8", "PATH": "/bin"}, jobs=4)
    assert env[provenance.THREADS_ENV] == env["OMP_NUM_THREADS"] == "2" and env["PATH"] == "/bin"
    assert provenance.thread_count(None, "cuda", env) == (2, "the pool worker's share of the cores")
    assert provenance.thread_count(None, "cuda", {"SLURM_CPUS_PER_TASK": "8"}) == (8, "SLURM_CPUS_PER_TASK")
    assert provenance.thread_count(None, "cuda", {}) == (8, "the cores this process may use")
    assert provenance.thread_count(None, "cpu", env)[0] == 1  # a CPU run's numbers never depend on jobs


def test_the_pool_gives_each_worker_its_share(tmp_path, write_recipe, monkeypatch):
    started = []

    class Worker:
        def __init__(self, cmd, env, **kwargs):
            started.append(env)
            self.returncode = 0

        def poll(self):
            return 0

    recipe = load_recipe(write_recipe(), ["seeds=[0,1]"])
    monkeypatch.setattr(provenance.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(local_pool.subprocess, "Popen", Worker)
    monkeypatch.setattr(local_pool.time, "sleep", lambda s: None)
    local_pool.run_pool(recipe.runs, jobs=2, devices=[None, None])
    assert [e[provenance.THREADS_ENV] for e in started] == ["2", "2"]


def _numerics(threads: int, cpu: str = "a test CPU") -> dict:
    return {**FAKE_NUMERICS, "threads": threads, "cpu_model": cpu}


def _write(spec, folder: Path, numerics: dict, all_: float) -> Path:
    """``spec``'s result in ``folder`` (a recipe's results folder) with these numerics and All accuracy."""
    run_dir = write_run({**spec.to_dict(), "run_dir": str(folder / spec.run_id)})
    result = json.loads((run_dir / store.RESULT).read_text())
    result["numerics"] = numerics
    result["metrics"].update(all=all_)  # with per-class values that agree
    del result["metrics"]["per_class"], result["data"]["class_counts_test"]
    (run_dir / store.RESULT).write_text(json.dumps(complete_result(result)))
    return run_dir


def test_tables_never_choose_between_results_of_one_run_id_by_folder_order(tmp_path, write_recipe):
    """Seed 0 of the recipe is in two sibling folders, made with 1 and 2 threads; the recipe's own seed 1
    was made with 2 threads. The 2-thread one is borrowed whatever the folders are called, the other is
    named; without an own result to match, none is borrowed and both are named."""
    path = write_recipe("mine", {"seeds": [0, 1]})
    recipe = load_recipe(path)
    seed0, seed1 = recipe.runs[:2]
    results = Path(recipe.root).parent
    _write(seed1, results / "mine", _numerics(2), 0.61)
    _write(seed0, results / "a_first", _numerics(1), 0.55)  # first in folder order
    _write(seed0, results / "b_second", _numerics(2), 0.60)
    (table,) = report.tables(path, use_cache=False)
    unit = next(iter(table.rows[0].units.values()))
    assert unit.runs[0]["numerics"]["threads"] == 2 and unit.runs[0]["borrowed"] == "b_second"
    notes = " ".join(table.rows[0].notes)
    assert "read from b_second/" in notes and "numerics differs from this recipe's own runs'" in notes
    assert "a_first/ holds another result of this run id, made under other numerics: threads 1 against 2 " \
           "(All 55.00 against 60.00 in b_second/, the run's main prediction)" in notes, notes
    (Path(recipe.root) / seed1.run_id / store.RESULT).unlink()
    (Path(recipe.root) / seed1.run_id / store.SPEC).unlink()
    (table,) = report.tables(path, use_cache=False)
    unit = next(iter(table.rows[0].units.values()))
    assert 0 not in unit.runs and "none is used" in unit.problems[0] and "a_first/" in unit.problems[0]


def test_seeds_of_one_row_made_under_different_numerics_are_said(tmp_path, write_recipe):
    path = write_recipe("r", {"seeds": [0, 1, 2]})
    recipe = load_recipe(path)
    for spec, threads in zip(recipe.runs, (2, 1, 1)):
        _write(spec, Path(recipe.root), _numerics(threads), 0.6)
    (table,) = report.tables(path, use_cache=False)
    assert "seeds made under different numerics (threads): seed 0: CPU a test CPU (DEFAULT), 2 threads; " \
           "seeds 1, 2: CPU a test CPU (DEFAULT), 1 thread" in table.rows[0].notes
    assert any(n.startswith("results made under different numerics") for n in table.notes)


def test_a_result_without_a_code_record_reads_code_unknown_in_tables(tmp_path, write_recipe):
    path = write_recipe("r")
    recipe = load_recipe(path)
    run_dir = write_run(recipe.runs[0])
    result = json.loads((run_dir / store.RESULT).read_text())
    result.update(code=None, code_scope=None)
    (run_dir / store.RESULT).write_text(json.dumps(result))
    assert status_rule.run_status(run_dir) == store.CODE_UNKNOWN
    (table,) = report.tables(path, use_cache=False)
    assert "seed(s) 0: code unknown (no code record); counted" in table.rows[0].notes


@pytest.mark.parametrize("older", [True, False])
def test_records_made_before_numerics_were_recorded_never_match(older):
    """The migration gives an older record what its other fields say; the rest is 'not recorded', which
    never matches: two such records are no difference known, and no match either."""
    from ltbench.results.migrate import migrate_record

    old = {"status": "done", "device": "cpu", "threads": 2, "provenance": {"torch": "2.14.1", "cpu_model": None},
           "config": {}}
    read = identity.numerics_of(migrate_record(old) if older else {"numerics": _numerics(2), "unrecorded": []})
    other = identity.numerics_of(migrate_record(old) if older else {"numerics": _numerics(2), "unrecorded": []})
    differ, unknown = identity.numerics_difference(read, other)
    assert differ == [] and bool(unknown) is older
    assert "cpu_capability" in unknown if older else not unknown
    assert ("CPU capability not recorded" in identity.numerics_text(read)) is older


def test_a_kernel_environment_difference_keeps_results_apart_and_is_named(tmp_path, write_recipe):
    """Issue 44: MKL_CBWR=COMPATIBLE changed the numbers of tiny runs with no recorded field differing. The
    kernel environment is recorded now, and one comparison decides borrowing and writes the notes."""
    cbwr = {**_numerics(1), "kernel_env": {"MKL_CBWR": "COMPATIBLE"}}
    plain = {**_numerics(1), "kernel_env": {}}
    assert identity.numerics_difference(cbwr, plain) == (["kernel_env"], [])
    path = write_recipe("mine", {"seeds": [0, 1, 2]})
    recipe = load_recipe(path)
    results = Path(recipe.root).parent
    _write(recipe.runs[1], results / "mine", plain, 0.61)
    _write(recipe.runs[2], results / "mine", plain, 0.62)
    _write(recipe.runs[0], results / "a_first", cbwr, 0.55)  # first in folder order
    _write(recipe.runs[0], results / "b_second", plain, 0.60)
    (table,) = report.tables(path, use_cache=False)
    unit = next(iter(table.rows[0].units.values()))
    assert unit.runs[0]["borrowed"] == "b_second"
    notes = " ".join(table.rows[0].notes)
    assert "a_first/ holds another result of this run id, made under other numerics: kernel environment " \
           "MKL_CBWR=COMPATIBLE against unset (All 55.00 against 60.00 in b_second/" in notes, notes
    assert table.notes[-1] == "numerics of every result shown: CPU a test CPU (DEFAULT), 1 thread (3 results)"


@pytest.mark.parametrize("field, values, shown", [
    ("torch", ("2.14.1", "2.13.0"), "torch 2.13.0"),
    ("channels_last", (False, True), "channels_last on"),
    ("cpu_id", ("GenuineIntel 6/85/7 flags aaa", "GenuineIntel 6/207/2 flags bbb"), "cpu_id GenuineIntel 6/207/2"),
    ("kernel_env", ({}, {"ONEDNN_MAX_CPU_ISA": "SSE41"}), "kernel environment ONEDNN_MAX_CPU_ISA=SSE41"),
])
def test_every_field_that_differs_is_named_in_the_notes(tmp_path, write_recipe, field, values, shown):
    """The table note used to print CPU, capability, threads, precision and compile only: a torch version or
    channels_last difference on one seed read 'numerics of every result shown: ... (3 results)'."""
    path = write_recipe("r", {"seeds": [0, 1, 2]})
    recipe = load_recipe(path)
    for spec, value in zip(recipe.runs, (values[0], values[0], values[1])):
        _write(spec, Path(recipe.root), {**_numerics(1), field: value}, 0.6)
    (table,) = report.tables(path, use_cache=False)
    assert any(n.startswith(f"seeds made under different numerics ({field}): ") and shown in n
               for n in table.rows[0].notes), table.rows[0].notes
    table_note = next(n for n in table.notes if "numerics" in n)
    assert table_note.startswith(f"results made under different numerics ({field};") and shown in table_note


def test_the_notes_group_results_exactly_as_the_borrowing_rule_compares_them():
    """Two results that stand for each other (numerics_difference: nothing differs, nothing unknown) share a
    class; two in different classes always have a field the notes name; within a class nothing differs."""
    base = _numerics(1)
    variants = [base, {**base, "torch": "y"}, {**base, "kernel_env": {}}, {**base, "kernel_env": {"MKL_CBWR": "AVX2"}},
                {**base, "threads": identity.NOT_RECORDED}, dict(base)]
    classes, differ, unknown = identity.numerics_classes(variants)
    together = {i: k for k, (_, members) in enumerate(classes) for i in members}
    for i, a in enumerate(variants):
        for j, b in enumerate(variants):
            d, u = identity.numerics_difference(a, b)
            if not d and not u:
                assert together[i] == together[j]
            if together[i] != together[j]:
                assert set(d) | set(u) <= set(differ) | set(unknown) and (d or u)
            else:
                assert not d and all(a.get(f) == b.get(f) for f in u)
    assert differ == ["kernel_env", "torch"] and unknown == ["threads"]


def test_a_run_records_the_kernel_environment_cpu_identity_and_libraries(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the effective count is recorded as threads, not the variable
    n = provenance.numerics(torch.device("cpu"), precision="fp32", threads_from="test")
    assert n["kernel_env"] == {"MKL_CBWR": "COMPATIBLE"}
    assert set(n) >= set(identity.NUMERICS_FIELDS["cpu"]) - {"threads_per_epoch"}
    if Path("/proc/cpuinfo").is_file():
        assert " flags " in n["cpu_id"]
    assert provenance.kernel_libraries("BLAS_INFO=mkl, x\n Intel(R) oneAPI Math Kernel Library Version 2024.2-Product "
                                       "Build 1 for Intel(R) 64\n Intel(R) MKL-DNN v3.12.0 (Git Hash 80afa71049cd)") \
        == {"blas": "mkl 2024.2-Product Build 1", "onednn": "v3.12.0 80afa710"}
