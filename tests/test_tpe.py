"""``search: {sampler: tpe}`` (ltbench/recipe/tpe.py, ltbench/run/tpe.py): one Optuna study per method in a
journal in the results folder, each trial an ordinary run on every tuning seed, the choice run on the report
seeds; concurrent launches share the studies; a killed launch's trial is taken over (a dead owner, a reused
pid) and finished trials are never trained again; the journal is data (forged draws, torn lines)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

optuna = pytest.importorskip("optuna")  # the 'tune' extra (in 'dev'): CI installs it

from ltbench.errors import ConfigError
from ltbench.recipe import asked_trial_spec, load_recipe
from ltbench.recipe import tpe as tpe_recipe
from ltbench.results import identity, store
from ltbench.run import tpe
from ltbench.runner import run_one
from ltbench.search import probe_values
from tests.conftest import ROOT, TINY, deep_update

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
SEARCH = {"sampler": "tpe", "trials": 3, "seed": 0, "seeds": [7]}


def recipe_file(tmp_path: Path, **extra) -> Path:
    recipe = deep_update(TINY, {"name": "tpe", "results_dir": str(tmp_path / "results"), "seeds": [0],
                                "data": {"val_per_class": 3}, "optim": {"epochs": 1}, "search": SEARCH, **extra})
    path = tmp_path / "tpe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def ltbench(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ltbench", *map(str, args)], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def journal_trials(path: Path) -> dict[str, list]:
    """Study name -> its trials, read back through Optuna (after checking every line is plain JSON)."""
    journal = load_recipe(path).root / tpe_recipe.JOURNAL
    for line in journal.read_bytes().splitlines():
        json.loads(line)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    return {s.study_name: storage.get_all_trials(s._study_id) for s in storage.get_all_studies()}


def trained_epochs(run_dir: Path) -> list[int]:
    return [row["epoch"] for row in store.read_jsonl(run_dir / store.LOG)]


def test_tiny_tpe_search_runs_methods_x_trials_x_tuning_seeds_then_the_choice_on_report_seeds(tmp_path):
    path = recipe_file(tmp_path, grid={"method.name": ["ce", "la"]}, seeds=[0, 1])
    plan = ltbench("run", path, "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert "2 studies (one per method) x 3 trials" in plan.stdout and "0 asked" in plan.stdout
    assert "each draw is asked from its study when the trial starts" in plan.stdout
    out = ltbench("run", path)
    assert out.returncode == 0, out.stderr
    assert "6 asked (6 complete)" in out.stdout and "report runs on fresh seeds (stage 2)" in out.stdout
    recipe = load_recipe(path)
    trial_runs = [s for s in recipe.runs if s.grid.get("search")]
    reported = [s for s in recipe.runs if not s.grid.get("search")]
    assert len(trial_runs) == 2 * 3 * 1 and len(reported) == 2 * 2 and len(recipe.studies) == 2
    assert {s.seed for s in trial_runs} == {7} and {s.seed for s in reported} == {0, 1}
    for spec in recipe.runs:  # each run a normal run folder, its id the hash of its resolved configuration
        result = store.read_result(Path(spec.run_dir))
        assert result["status"] == "done" and result["run_id"] == spec.run_id == identity.run_id(result["config"])
        assert trained_epochs(Path(spec.run_dir)) == [1]
    trials = journal_trials(path)
    assert sorted(len(t) for t in trials.values()) == [3, 3]
    for study in recipe.studies:  # the study was told each trial's validation All, and drew in its space
        for t in trials[study.name]:
            spec = next(s for s in trial_runs if s.grid["search"]["trial"] == t.number
                        and s.config["method"]["name"] == study.method)
            assert t.state.name == "COMPLETE"
            assert t.value == store.read_result(Path(spec.run_dir))["metrics"]["val"]["all"]
            assert 0.01 <= spec.config["optim"]["lr"] <= 0.4
    table = ltbench("table", path, "--test", "none")
    assert table.returncode == 0, table.stderr
    assert "Tuned: 3 draws x 1 tuning seed on validation (tpe search, seed 0); reported: 2 fresh seeds" in table.stdout
    assert "tpe is random search at this budget" in table.stdout and "tpe is random search" in plan.stdout
    assert "chosen on validation" in table.stdout and "chosen among" not in table.stdout
    again = ltbench("run", path)  # nothing left: no trial asked or trained again
    assert again.returncode == 0 and "6 asked (6 complete)" in again.stdout
    assert sorted(len(t) for t in journal_trials(path).values()) == [3, 3]


def test_two_concurrent_launches_share_one_study_each_trial_trained_once(tmp_path):
    path = recipe_file(tmp_path, search={**SEARCH, "trials": 4}, optim={"epochs": 2})
    procs = [subprocess.Popen([sys.executable, "-m", "ltbench", "run", str(path)], cwd=ROOT, env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    (trials,) = journal_trials(path).values()
    assert [t.number for t in trials] == [0, 1, 2, 3] and all(t.state.name == "COMPLETE" for t in trials)
    runs = load_recipe(path).runs
    assert len(runs) == 4 + 1  # 4 trials on tuning seed 7, the choice on report seed 0
    for spec in runs:  # trained once: each epoch logged once, one session
        assert trained_epochs(Path(spec.run_dir)) == [1, 2]
        assert store.read_result(Path(spec.run_dir))["status"] == "done"


def test_local_jobs_share_the_studies(tmp_path):
    path = recipe_file(tmp_path, grid={"method.name": ["ce", "la"]}, search={**SEARCH, "trials": 2})
    out = ltbench("run", path, "--jobs", "2")
    assert out.returncode == 0, out.stderr
    assert "4 asked (4 complete)" in out.stdout  # which worker trained which trial depends on the machine
    assert "[worker 1]" in out.stdout or "[worker 2]" in out.stdout
    assert all(trained_epochs(Path(s.run_dir)) == [1] for s in load_recipe(path).runs)


def test_a_killed_launch_resumes_without_retraining_finished_trials(tmp_path):
    path = recipe_file(tmp_path, search={**SEARCH, "trials": 4}, optim={"epochs": 2})
    proc = subprocess.Popen([sys.executable, "-m", "ltbench", "run", str(path)], cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    root = tmp_path / "results" / "tpe"
    deadline = time.time() + 300
    while time.time() < deadline and len(list(root.glob("*/result.json"))) < 1 and proc.poll() is None:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {p: p.stat().st_mtime_ns for p in root.glob("*/result.json")}
    assert 1 <= len(finished) < 4
    out = ltbench("run", path)
    assert out.returncode == 0, out.stderr
    (trials,) = journal_trials(path).values()
    assert [t.number for t in trials] == [0, 1, 2, 3] and all(t.state.name == "COMPLETE" for t in trials)
    assert {p: p.stat().st_mtime_ns for p in finished} == finished  # no finished trial trained again
    assert all(trained_epochs(Path(s.run_dir)) == [1, 2] for s in load_recipe(path).runs)


def test_a_trial_left_running_by_a_dead_worker_is_taken_over_not_asked_again(tmp_path):
    """A worker that died after asking (its owner pid gone) leaves its trial RUNNING: the next worker trains that
    trial, with its draw, and the study ends with exactly the budget."""
    path = recipe_file(tmp_path, search={**SEARCH, "trials": 2})
    recipe = load_recipe(path)
    (study,) = recipe.studies
    store.make_dirs(recipe.root)
    storage = tpe_recipe.open_journal(tpe_recipe.journal_path(recipe.root), optuna)
    live = tpe.load_study(optuna, storage, study, recipe, 0)
    trial = live.ask()
    trial.set_user_attr("owner", {"host": tpe.me()["host"], "pid": dead_pid()})
    values = tpe_recipe.suggest(trial, study.space)
    trial.set_user_attr("values", values)
    told = tpe.work(load_recipe(path), out=lambda msg: None)
    assert told == {"COMPLETE": 2}
    (trials,) = journal_trials(path).values()
    assert [(t.number, t.state.name) for t in trials] == [(0, "COMPLETE"), (1, "COMPLETE")]
    assert trials[0].user_attrs["values"] == values


def test_a_trial_whose_owner_pid_now_names_another_process_is_taken_over(tmp_path):
    """Owners are host + pid + the pid's start time: a killed worker whose pid now belongs to an unrelated live
    process (faked: this test's own pid, recorded with another start time) owns nothing; a live owner keeps it."""
    path = recipe_file(tmp_path, search={**SEARCH, "trials": 1})
    recipe = load_recipe(path)
    (study,) = recipe.studies
    store.make_dirs(recipe.root)
    storage = tpe_recipe.open_journal(tpe_recipe.journal_path(recipe.root), optuna)
    trial = tpe.load_study(optuna, storage, study, recipe, 0).ask()
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    owner = {"host": tpe.me()["host"], "pid": killed.pid, "start": tpe.process_start(killed.pid)}
    assert owner["start"] is not None and not tpe.owner_gone(owner)  # alive: its trial is its own
    killed.kill()
    killed.wait()
    assert tpe.owner_gone(owner)
    reused = {**owner, "pid": os.getpid()}  # the pid reused by an unrelated live process, started at another time
    assert not tpe.owner_gone({**reused, "start": tpe.process_start(os.getpid())}) and tpe.owner_gone(reused)
    trial.set_user_attr("owner", reused)
    trial.set_user_attr("values", tpe_recipe.suggest(trial, study.space))
    assert tpe.work(load_recipe(path), out=lambda msg: None) == {"COMPLETE": 1}
    (trials,) = journal_trials(path).values()
    assert [(t.number, t.state.name) for t in trials] == [(0, "COMPLETE")]


def test_a_forged_draw_is_refused_and_a_torn_last_line_is_cut_before_any_append(tmp_path):
    path = recipe_file(tmp_path, search={**SEARCH, "trials": 1})
    recipe = load_recipe(path)
    (study,) = recipe.studies
    store.make_dirs(recipe.root)
    journal = tpe_recipe.journal_path(recipe.root)
    storage = tpe_recipe.open_journal(journal, optuna)
    trial = tpe.load_study(optuna, storage, study, recipe, 0).ask()
    trial.set_user_attr("owner", {"host": "elsewhere", "pid": 1})
    trial.set_user_attr("values", {**tpe_recipe.suggest(trial, study.space), "optim.lr": 50.0})  # space [0.01, 0.4]
    for command in (("status", path), ("run", path)):
        out = ltbench(*command)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "optim.lr is 50.0, not a draw of its space log_uniform[0.01, 0.4]" in out.stderr
    journal.unlink()
    assert ltbench("run", path).returncode == 0
    whole = journal.read_bytes()
    journal.write_bytes(whole + b'{"op_code": 5, "trial_id": 0, "us')  # a writer killed mid-append
    said = []
    tpe_recipe.cut_torn_tail(journal, said.append)
    assert journal.read_bytes() == whole and "cut a torn last line" in said[0]
    tpe_recipe.cut_torn_tail(journal, said.append)  # a whole journal is left as it is
    assert journal.read_bytes() == whole and len(said) == 1


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_pruning_reports_the_validation_curve_and_stops_a_trial_below_the_median(tmp_path):
    path = recipe_file(tmp_path, search={**SEARCH, "trials": 2, "prune": True}, train={"eval_every": 1},
                       optim={"epochs": 2})
    out = ltbench("run", path)
    assert out.returncode == 0, out.stderr
    (trials,) = journal_trials(path).values()
    assert all(set(t.intermediate_values) == {1} for t in trials)  # epoch 1 of 2: the curve before the end
    # the rule itself, on a study whose earlier trials were all better at epoch 1
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner(n_startup_trials=1))
    for value in (0.8, 0.9):
        t = study.ask()
        t.report(value, 1)
        study.tell(t, value)
    low = study.ask()
    on_epoch = tpe.pruning(optuna, study, low.number, prune=True)
    on_epoch({"epoch": 1, "loss": 1.0})  # no validation in the row: nothing reported
    with pytest.raises(tpe.TrialPruned, match="pruned by the tpe search after epoch 1"):
        on_epoch({"epoch": 1, "val": {"all": 0.2}})
    # a pruned run stops after the epoch that reported, is recorded failed saying why, and the study is told PRUNED
    recipe = load_recipe(path)
    (study,) = recipe.studies
    spec = asked_trial_spec(recipe, study, 1, probe_values(study.space)[0], 7)

    def prune_now(row):
        raise tpe.TrialPruned(f"pruned by the tpe search after epoch {row['epoch']}")

    assert run_one(spec, say=lambda msg: None, on_epoch=prune_now) == "failed"
    assert tpe.outcome(Path(spec.run_dir)) == ("PRUNED", None) and trained_epochs(Path(spec.run_dir)) == [1]
    assert store.read_result(Path(spec.run_dir))["error"] == "pruned by the tpe search after epoch 1"


def test_one_worker_draws_the_same_trials_in_a_fresh_folder(tmp_path):
    """Each ask is seeded by (search seed, study, trial number): one worker, from scratch, asks the same draws
    (concurrent workers do not: docs/tuning.md)."""
    draws = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        path = recipe_file(tmp_path / folder, search={**SEARCH, "trials": 4})
        assert ltbench("run", path).returncode == 0
        (trials,) = journal_trials(path).values()
        draws.append([t.user_attrs["values"] for t in trials])
    assert draws[0] == draws[1] and len({json.dumps(d) for d in draws[0]}) == 4


@pytest.mark.parametrize("extra, words", [
    ({"search": {**SEARCH, "prune": True}}, "search.prune: true stops a trial on its validation curve"),
    ({"search": {**SEARCH, "prune": True}, "train": {"eval_every": 1}, "optim": {"epochs": 1}}, "validate only at the end"),
    ({"search": {**SEARCH, "prune": True, "sampler": "random"}}, "set sampler: tpe"),
])
def test_prune_without_a_validation_curve_is_refused_before_any_run(tmp_path, extra, words):
    with pytest.raises(ConfigError, match=words):
        load_recipe(recipe_file(tmp_path, **extra))


def test_without_optuna_tpe_is_refused_in_one_line_naming_the_extra(tmp_path):
    path = recipe_file(tmp_path)
    code = ("import sys; sys.modules['optuna'] = None; from ltbench.cli import main; "
            f"sys.exit(main(['run', {str(path)!r}]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "sampler: tpe needs Optuna" in out.stderr and "pip install 'ltbench[tune]'" in out.stderr
    assert not (tmp_path / "results").exists()


def test_the_journal_is_json_lines_and_a_damaged_one_is_one_line_exit_2(tmp_path):
    from optuna.storages.journal import JournalFileBackend
    from optuna.storages.journal._base import BaseJournalSnapshot

    # Optuna's file backend keeps no pickled snapshot: reading the journal is json.loads only
    assert not isinstance(JournalFileBackend(str(tmp_path / "j")), BaseJournalSnapshot)
    path = recipe_file(tmp_path, search={**SEARCH, "trials": 1})
    assert ltbench("run", path).returncode == 0
    journal = tmp_path / "results" / "tpe" / tpe_recipe.JOURNAL
    lines = journal.read_bytes().splitlines(keepends=True)
    damages = (b'{"op_code": 5, "trial_id": \n', b'{"op_code": 99}\n', b'[1, 2]\n')
    commands = (("status", path), ("run", path, "--dry-run"), ("table", path))
    for damage, command in zip(damages, commands):
        journal.write_bytes(lines[0] + damage + b"".join(lines[1:]))
        out = ltbench(*command)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, (damage, command, out.stderr)
        assert "not a usable Optuna journal" in out.stderr and "Traceback" not in out.stderr


def test_redo_flags_and_where_are_refused_for_a_tpe_search(tmp_path):
    path = recipe_file(tmp_path)
    for args, words in ((("--rerun-failed",), "do not apply to a tpe search"),
                        (("--where", "method.name=ce"), "--where does not apply to a tpe search")):
        out = ltbench("run", path, *args)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and words in out.stderr, out.stderr
    assert not (tmp_path / "results" / "tpe" / tpe_recipe.JOURNAL).exists()
