"""What `ltbench run` shows: per run, its state (starting, epoch k/N with loss, img/s and ETA, evaluating test
set i of M, writing) from its log.jsonl and progress.json; on a terminal state lines redrawn in place under the
messages, with an overall line (runs finished, grid ETA); plain lines elsewhere. tests/test_progress_terminal.py
drives the real thing in a pseudo-terminal."""

import io
import json
import os
import sys
import time

import pytest

from ltbench.results import store
from ltbench.run.local_pool import owned_terminal
from ltbench.run.progress import ProgressBoard, epoch_line, eta_text, finished_line, grid_eta, read_heartbeat, run_state
from ltbench.run.screen import KEEP, Screen, columns, fit
from ltbench.train.heartbeat import PhaseBeat
from ltbench.results.runspec import RunSpec


def spec_in(tmp_path, epochs=4, seed=1):
    return RunSpec(recipe="tiny", run_id="abc123", run_dir=str(tmp_path), config={"seed": seed, "optim": {"epochs": epochs}})


def log_epoch(tmp_path, epoch, loss=1.5, seconds=2.0):
    store.append_jsonl(tmp_path / store.LOG, {"epoch": epoch, "loss": loss, "train_acc": 0.5, "lr": 0.1,
                                              "seconds": seconds, "images_per_s": 812.4})


def test_epoch_line_gives_eta_from_the_mean_epoch_time():
    rows = [{"epoch": 1, "loss": 2.0, "seconds": 10.0, "images_per_s": 100.0},
            {"epoch": 2, "loss": 1.23456, "seconds": 20.0, "images_per_s": 120.0}]
    assert epoch_line(rows, 30) == "epoch 2/30 loss 1.2346 120 img/s ETA 7:00"  # 28 epochs x 15 s
    assert eta_text(3725) == "1:02:05" and eta_text(None) == "?"


def test_plain_lines_per_new_epoch_when_not_a_terminal_only_with_verbose(tmp_path, monkeypatch):
    """Issue 51: a log file got 128 epoch lines from the quickstart; now only with --verbose (LTBENCH_VERBOSE)."""
    quiet = io.StringIO()
    board = ProgressBoard(2, tty=False, out=quiet)
    board.start(1, spec_in(tmp_path / "quiet"), "la (tau=1)")
    (tmp_path / "quiet").mkdir()
    log_epoch(tmp_path / "quiet", 1)
    board.poll()
    assert quiet.getvalue() == ""
    monkeypatch.setenv("LTBENCH_VERBOSE", "1")
    out = io.StringIO()
    board = ProgressBoard(2, tty=False, out=out)
    board.start(1, spec_in(tmp_path), "la (tau=1)")
    board.poll()
    assert out.getvalue() == ""  # nothing logged yet: nothing invented
    log_epoch(tmp_path, 1)
    log_epoch(tmp_path, 2, loss=1.25)
    board.poll()
    board.poll()  # the same epochs are not shown twice
    assert out.getvalue().splitlines() == [
        "[slot 1] la (tau=1) seed 1: epoch 1/4 loss 1.5000 812 img/s ETA 0:06",
        "[slot 1] la (tau=1) seed 1: epoch 2/4 loss 1.2500 812 img/s ETA 0:04"]


def screen_of(out: io.StringIO, columns: int = 80, rows: int = 12) -> list[str]:
    """What a terminal shows after the board's output (pyte, a VT100 emulator)."""
    pyte = pytest.importorskip("pyte")
    screen = pyte.Screen(columns, rows)
    pyte.Stream(screen).feed(out.getvalue().replace("\n", "\r\n"))  # a tty's output processing (onlcr)
    return [line.rstrip() for line in screen.display if line.strip()]


def test_state_lines_on_a_terminal_are_redrawn_in_place_with_messages_above(tmp_path):
    out = io.StringIO()
    clock = [100.0]
    board = ProgressBoard(2, tty=True, out=out, total=3, screen=Screen(out, width=80, height=12), clock=lambda: clock[0])
    board.start(0, spec_in(tmp_path), "ce")
    assert screen_of(out) == ["[0] ce seed 1: starting (data, model) ETA ?",
                              "0/3 done · 1 running · 2 queued · grid ETA ?"]
    log_epoch(tmp_path, 1)
    clock[0] += 2.0
    board.poll()
    board.write("started la seed 0 (def456) in slot 1")
    # 3 epochs left at 2 s: 6 s; the 2 queued runs as long as this one (2 s so far + 6 s): 0-8 on the
    # free worker, then 6-14 on this one
    assert screen_of(out) == ["started la seed 0 (def456) in slot 1",
                              "[0] ce seed 1: epoch 1/4 loss 1.5000 812 img/s ETA 0:06",
                              "0/3 done · 1 running · 2 queued · grid ETA 0:14"]
    clock[0] += 6.0
    board.finish(0, "finished ce seed 1 (abc123): done")  # 8 s: the 2 queued runs, one on each worker
    assert screen_of(out) == ["started la seed 0 (def456) in slot 1", "finished ce seed 1 (abc123): done",
                              "1/3 done · 0 running · 2 queued · grid ETA 0:08"]
    board.close()
    assert screen_of(out) == ["started la seed 0 (def456) in slot 1", "finished ce seed 1 (abc123): done"]


def test_a_line_fits_any_width_and_keeps_its_eta():
    parts = [("epoch 3/30", KEEP), ("step 12/61", 6), ("loss 1.2345", 4), ("812 img/s", 3)]
    head = "[0] la (tau=1, sampler=class_balanced[alpha=0.5]) seed 0:"
    for width in range(12, 140):
        line = fit(head, parts, "ETA 1:05", width)
        assert columns(line) <= width and line.endswith(" ETA 1:05"), (width, line)
        if width >= 40:
            assert "epoch 3/30" in line  # the state stays; the label is what is shortened
    assert fit(head, parts, "ETA 1:05", 89) == ("[0] la (tau=1, sampler=class_balanced[alpha=0.5]) seed 0: epoch 3/30 "
                                                "step 12/61 ETA 1:05")  # img/s, then loss, go first
    assert fit("ce:", parts, "ETA 1:05", 200) == "ce: epoch 3/30 step 12/61 loss 1.2345 812 img/s ETA 1:05"
    assert columns("τ漢") == 3 and columns(fit("漢字" * 30, [], "ETA 0:01", 30)) <= 30


def test_grid_eta_gives_queued_runs_to_the_first_free_worker():
    assert grid_eta([10.0, 30.0], queued=3, run_seconds=20.0, workers=2) == 50.0  # 10+20 -> 30+20 | 30 -> 50
    assert grid_eta([5.0], queued=0, run_seconds=None, workers=2) == 5.0
    assert grid_eta([None, 5.0], queued=0, run_seconds=20.0, workers=2) is None
    assert grid_eta([5.0], queued=1, run_seconds=None, workers=2) is None


def test_evaluation_and_writing_are_states_with_their_own_eta(tmp_path):
    ticks = iter([0.0, 2.0, 2.5, 6.0])
    beat = PhaseBeat(tmp_path, clock=lambda: next(ticks))
    beat.plan({"test": 1000, "test_set:forward50": 500, "val": 200})
    beat.evaluating("test", 0, 10)
    assert read_heartbeat(tmp_path)["eta"] is None  # nothing timed yet
    beat.evaluating("test", 4, 10)  # 2 s for 4 of 10 batches: 3 s more here, then 700 images at 200/s
    state = run_state([{"epoch": 4, "seconds": 1.0}], read_heartbeat(tmp_path), 4, beat_is_newer=True)
    assert state.parts[0] == ("evaluating test set 1/3", KEEP) and state.eta == pytest.approx(3.0 + 3.5)
    beat.evaluating("test", 5, 10)  # 0.5 s after the last beat: not written (at most one a second)
    assert read_heartbeat(tmp_path)["step"] == 4
    beat.evaluating("test_set:forward50", 0, 1)
    state = run_state([], read_heartbeat(tmp_path), 4, beat_is_newer=True)
    assert state.plain == "evaluating test set 2/3 (forward50)"
    beat.writing()
    assert run_state([], read_heartbeat(tmp_path), 4, beat_is_newer=True).plain == "writing results"
    # an evaluation beat older than the last epoch row (eval_every, then the row): the epoch is shown
    assert run_state([{"epoch": 1, "loss": 1.0, "seconds": 1.0}], read_heartbeat(tmp_path), 4,
                     beat_is_newer=False).key == ("epoch", 1)


def test_plain_lines_say_each_phase_once(tmp_path):
    out = io.StringIO()
    board = ProgressBoard(2, tty=False, out=out)
    board.start(0, spec_in(tmp_path), "ce")
    phase = PhaseBeat(tmp_path)
    phase.plan({"test": 100})
    for step in range(3):
        phase.evaluating("test", step, 3)
        board.poll()
    phase.writing()
    board.poll()
    board.poll()
    assert out.getvalue().splitlines() == ["[slot 0] ce seed 1: evaluating test set 1/1",
                                           "[slot 0] ce seed 1: writing results"]


def test_a_heartbeat_left_by_an_earlier_launch_is_not_shown(tmp_path):
    beat = {"phase": "writing"}
    store.atomic_write_bytes(tmp_path / "progress.json", json.dumps(beat).encode())
    old = time.time() - 3600
    os.utime(tmp_path / "progress.json", (old, old))
    assert read_heartbeat(tmp_path, since=time.time() - 1.0) is None
    assert read_heartbeat(tmp_path) == beat


def test_in_process_runs_print_through_the_one_writer(tmp_path):
    """While a run trains in this process, whatever it prints comes out as whole lines above the state line."""
    out = io.StringIO()
    board = ProgressBoard(1, tty=True, out=out, total=1, screen=Screen(out, width=80, height=12))
    with owned_terminal(board, every_s=0.01):
        board.start(0, spec_in(tmp_path), "ce")
        print("a plugin says hello", end="")
        print(" in two parts")
        print("warning: something", file=sys.stderr)
        assert not sys.stdout.isatty()  # so the engine's own tqdm bar stays off
    assert screen_of(out) == ["a plugin says hello in two parts", "warning: something"]


def test_a_resumed_run_starts_its_bar_at_the_epochs_already_logged(tmp_path, monkeypatch):
    monkeypatch.setenv("LTBENCH_VERBOSE", "1")  # plain epoch lines: --verbose
    log_epoch(tmp_path, 1)
    out = io.StringIO()
    board = ProgressBoard(1, tty=False, out=out)
    board.start(0, spec_in(tmp_path), "ce")
    board.poll()
    assert out.getvalue() == ""  # epoch 1 was before this launch
    log_epoch(tmp_path, 2)
    board.poll()
    assert "epoch 2/4" in out.getvalue()


def test_finished_line_names_method_seed_and_all_accuracy(tmp_path):
    (tmp_path / store.RESULT).write_text(json.dumps({"status": "done", "metrics": {"all": 0.67204}}))
    assert finished_line(spec_in(tmp_path), "ldam_drw", "done") == "finished ldam_drw seed 1 (abc123): done, All 67.20 %"
    assert finished_line(spec_in(tmp_path), "ldam_drw", "FAILED: x") == "finished ldam_drw seed 1 (abc123): FAILED: x"


def test_within_an_epoch_the_heartbeat_is_shown_before_the_epoch_ends(tmp_path, monkeypatch):
    monkeypatch.setenv("LTBENCH_VERBOSE", "1")  # plain epoch lines: --verbose
    beat = {"epoch": 1, "epochs": 4, "step": 10, "steps": 40, "loss": 2.25, "images_per_s": 95.0, "seconds": 5.0}
    store.atomic_write_bytes(tmp_path / "progress.json", json.dumps(beat).encode())
    out = io.StringIO()
    board = ProgressBoard(1, tty=False, out=out)
    board.start(0, spec_in(tmp_path), "ce")
    board.poll()
    board.poll()  # the same heartbeat once
    # 20 s per epoch: 15 s left in this one, 3 more epochs
    assert out.getvalue().splitlines() == ["[slot 0] ce seed 1: epoch 1/4 step 10/40 loss 2.2500 95 img/s ETA 1:15"]
    tty = io.StringIO()
    bars = ProgressBoard(1, tty=True, out=tty, screen=Screen(tty, width=80, height=12))
    bars.start(0, spec_in(tmp_path), "ce")
    bars.poll()
    assert screen_of(tty) == ["ce seed 1: epoch 1/4 step 10/40 loss 2.2500 95 img/s ETA 1:15"]
    bars.close()


def test_a_training_run_s_eta_includes_the_evaluation_the_ended_runs_took(tmp_path):
    """The bar used to sit at 'ETA 0:00' through the final evaluation: once a run has ended here, the time
    from its last epoch to its end is added to the ETA of the runs still training."""
    clock = [0.0]
    out = io.StringIO()
    board = ProgressBoard(2, tty=True, out=out, total=2, screen=Screen(out, width=80, height=12), clock=lambda: clock[0])
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    board.start(0, spec_in(first, epochs=2), "ce")
    board.start(1, spec_in(second, epochs=4), "la")
    for epoch in (1, 2):
        log_epoch(first, epoch)
    log_epoch(second, 1)
    clock[0] = 10.0
    board.poll()  # the first run has logged every epoch: evaluating and writing follow
    clock[0] = 25.0
    board.finish(0, "finished ce seed 1 (abc123): done")  # 15 s after its last epoch
    # 3 epochs of 2 s left, then 15 s of evaluation and writing
    assert "[1] la seed 1: epoch 1/4 loss 1.5000 812 img/s ETA 0:21" in screen_of(out)


def test_ctrl_c_in_an_in_process_run_leaves_a_clean_screen(tmp_path):
    out = io.StringIO()
    board = ProgressBoard(1, tty=True, out=out, total=2, screen=Screen(out, width=80, height=12))
    saved = sys.stdout, sys.stderr
    with pytest.raises(KeyboardInterrupt):
        with owned_terminal(board, every_s=0.01):
            board.start(0, spec_in(tmp_path), "ce")
            print("  epoch 1/4 loss 1.5 (the engine's line)")
            raise KeyboardInterrupt
    assert (sys.stdout, sys.stderr) == saved  # the real streams are back for the CLI's 'interrupted' line
    assert screen_of(out) == ["  epoch 1/4 loss 1.5 (the engine's line)"]  # state lines erased, the message kept


def test_a_heartbeat_before_the_epoch_s_first_meter_read_shows_no_loss():
    """The loss lives on the device until train.log_every steps have passed (ltbench/train/meters.py): the
    heartbeat then carries loss None, which the state line and the plain line show as '–'."""
    beat = {"epoch": 1, "epochs": 2, "step": 3, "steps": 10, "loss": None, "images_per_s": 50.0, "seconds": 1.5}
    state = run_state([], beat, 2, beat_is_newer=True)
    assert ("loss –", 4) in state.parts and "loss –" in state.plain
    assert ("loss 0.5000", 4) in run_state([], {**beat, "loss": 0.5}, 2, beat_is_newer=True).parts
