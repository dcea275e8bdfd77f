"""What `ltbench run --jobs N` shows: per slot, the run's epoch, loss, img/s and ETA from its log.jsonl
(tqdm bars on a terminal, plain lines elsewhere), and finished lines with method, seed and accuracy."""

import io
import json

from ltbench.results import store
from ltbench.run.progress import ProgressBoard, epoch_line, eta_text, finished_line
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


def test_plain_lines_per_new_epoch_when_not_a_terminal(tmp_path):
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


def test_a_tqdm_bar_per_slot_on_a_terminal(tmp_path):
    out = io.StringIO()
    board = ProgressBoard(2, tty=True, out=out)
    board.start(0, spec_in(tmp_path), "ce")
    assert "ce seed 1: 0/4 epochs" in out.getvalue() and "starting" in out.getvalue()
    log_epoch(tmp_path, 1)
    board.poll()
    assert "ce seed 1: 1/4 epochs" in out.getvalue() and "loss 1.5000 812 img/s ETA 0:06" in out.getvalue()
    board.finish(0, "finished ce seed 1 (abc123): done")
    assert out.getvalue().rstrip().endswith("finished ce seed 1 (abc123): done")


def test_a_resumed_run_starts_its_bar_at_the_epochs_already_logged(tmp_path):
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


def test_within_an_epoch_the_heartbeat_is_shown_before_the_epoch_ends(tmp_path):
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
    bars = ProgressBoard(1, tty=True, out=tty)
    bars.start(0, spec_in(tmp_path), "ce")
    bars.poll()
    assert "step 10/40 loss 2.2500 95 img/s ETA 1:15" in tty.getvalue()
    bars.close()
