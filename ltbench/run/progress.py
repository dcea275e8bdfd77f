"""What `ltbench run` shows while its runs train: per run (a pool slot, or the one run of an in-process
launch) where it is, and over the grid how many runs are done and when the grid should end.

A run is in one of four states, each read from its folder (the worker needs no pipe back, and a run
resumed from a checkpoint shows its true epoch):
- starting: nothing written yet by this launch (importing torch, loading the data, building the model);
- epoch k/N: from ``log.jsonl`` (one row per epoch) and, within an epoch, the training heartbeat in
  ``progress.json`` (step, loss, img/s; ETA from the mean epoch time so far or the running epoch's rate);
- evaluating test set i of M: the phase beat of the final (or an eval_every) evaluation, with the
  evaluation's own ETA (ltbench/train/heartbeat.py);
- writing: predictions and result.json.

On a terminal the state lines sit at the bottom and are redrawn in place by ``screen.Screen``, the one
writer of the terminal while they are shown: started / finished lines and the Ctrl-C messages go
through ``ProgressBoard.write``, and every line fits the terminal's width with its ETA kept. With more
than one run an overall line follows: runs done k/N and the grid's ETA (``grid_eta``). Elsewhere (a
pipe, a CI log) each new epoch, evaluation and end is one plain line, so the progress reaches log files.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ltbench.results import store
from ltbench.results.runspec import RunSpec
from ltbench.run.screen import KEEP, Screen, epoch_lines, fit
from ltbench.train.heartbeat import EVALUATING, HEARTBEAT, WRITING

QUIET_S = 30.0  # not a terminal: a within-epoch line at most this often per slot (the first one at once)


def eta_text(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = max(int(round(seconds)), 0)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60}:{seconds % 60:02d}"


def epoch_eta(rows: list[dict], epochs: int) -> float | None:
    """Seconds left in training after the last logged epoch: the epochs left at the mean epoch time so far."""
    times = [float(r["seconds"]) for r in rows if isinstance(r.get("seconds"), (int, float))]
    done = int(rows[-1].get("epoch", len(rows)))
    return (epochs - done) * sum(times) / len(times) if times else None


def epoch_line(rows: list[dict], epochs: int) -> str:
    """'epoch 3/30 loss 1.2345 812 img/s ETA 1:05' from a run's log rows (ETA: mean epoch time so far)."""
    last = rows[-1]
    return (f"epoch {int(last.get('epoch', len(rows)))}/{epochs} loss {float(last.get('loss', float('nan'))):.4f} "
            f"{float(last.get('images_per_s', 0.0)):.0f} img/s ETA {eta_text(epoch_eta(rows, epochs))}")


def step_eta(beat: dict) -> float:
    """Seconds left in training from a training heartbeat: the running epoch's rate over what is left."""
    epoch, epochs = int(beat["epoch"]), int(beat["epochs"])
    step, steps, seconds = int(beat["step"]), max(int(beat["steps"]), 1), float(beat["seconds"])
    per_epoch = seconds * steps / max(step, 1)
    return per_epoch * (epochs - epoch) + per_epoch - seconds


def loss_text(loss) -> str:
    """A heartbeat's loss, or '–' before the epoch's first read from the device (train.log_every)."""
    return "–" if loss is None else f"{float(loss):.4f}"


def step_line(beat: dict) -> str:
    """'epoch 1/30 step 12/61 loss 2.0312 95 img/s ETA 3:10' from a worker's heartbeat (before an epoch ends)."""
    return (f"epoch {int(beat['epoch'])}/{int(beat['epochs'])} step {int(beat['step'])}/{int(beat['steps'])} "
            f"loss {loss_text(beat.get('loss'))} {float(beat['images_per_s']):.0f} img/s ETA {eta_text(step_eta(beat))}")


def read_heartbeat(run_dir: Path, since: float | None = None) -> dict | None:
    """The run's progress.json: a training beat or a phase beat (ltbench/train/heartbeat.py); None when it
    is missing, unreadable, or older than ``since`` (a beat left by an earlier, interrupted launch)."""
    path = Path(run_dir) / HEARTBEAT
    try:
        if since is not None and path.stat().st_mtime < since:
            return None
    except OSError:
        return None
    beat = store.load_json_object(path)  # a FIFO never blocks, a 20 GB file is never read
    if beat.get("phase") == EVALUATING and {"source", "set", "sets", "step", "steps"} <= set(beat):
        return beat
    if beat.get("phase") == WRITING or {"epoch", "epochs", "step", "steps", "loss", "images_per_s", "seconds"} <= set(beat):
        return beat
    return None


def finished_line(spec: RunSpec, label: str, status: str) -> str:
    """'finished la (tau=1) seed 0 (abc123): done, All 67.20 %' (the accuracy when the run is done); a search's
    trial shows its validation All only ('validation All 70.10 %'): the test set chooses nothing."""
    line = f"finished {label} seed {spec.config['seed']} ({spec.run_id}): {status}"
    accuracy, trial = None, bool((spec.grid or {}).get("search"))
    if status == "done":
        result = store.load_json_object(Path(spec.run_dir) / store.RESULT, store.MAX_JSON_BYTES)
        metrics = result.get("metrics") if isinstance(result.get("metrics"), dict) else {}
        accuracy = (metrics.get("val") or {}).get("all") if trial and isinstance(metrics.get("val"), dict) \
            else None if trial else metrics.get("all")
    name = "validation All" if trial else "All"
    return line + (f", {name} {100.0 * float(accuracy):.2f} %" if isinstance(accuracy, (int, float)) else "")


@dataclass(frozen=True)
class State:
    """Where one run is: ``parts`` (text, priority: screen.fit drops the lowest first), its ETA in seconds
    (None: unknown), the plain line for logs, and ``key``: a plain line is printed when the key changes."""

    parts: list[tuple[str, int]]
    eta: float | None
    plain: str
    key: tuple


STARTING = State([("starting (data, model)", KEEP)], None, "starting", ("starting",))


def run_state(rows: list[dict], beat: dict | None, epochs: int, beat_is_newer: bool) -> State:
    """The state of a run from its log rows (this launch's and earlier) and its newest heartbeat."""
    if beat is not None and beat_is_newer and beat.get("phase") == WRITING:
        return State([("writing results", KEEP)], 0.0, "writing results", ("writing",))
    if beat is not None and beat_is_newer and beat.get("phase") == EVALUATING:
        where = f"test set {beat['set']}/{beat['sets']}" if beat["source"] != "val" else "validation"
        text = f"evaluating {where}"
        name = beat["source"].split(":", 1)[-1]
        parts = [(text, KEEP)] + ([(f"({name})", 2)] if beat["source"] not in ("test", "val") else [])
        parts.append((f"batch {beat['step']}/{beat['steps']}", 5))
        return State(parts, beat.get("eta"), f"{text}" + (f" ({name})" if len(parts) > 2 else ""),
                     ("evaluating", beat["source"], beat["set"]))
    if beat is not None and "phase" not in beat and int(beat["epoch"]) > len(rows):
        parts = [(f"epoch {int(beat['epoch'])}/{int(beat['epochs'])}", KEEP),
                 (f"step {int(beat['step'])}/{int(beat['steps'])}", 6), (f"loss {loss_text(beat.get('loss'))}", 4),
                 (f"{float(beat['images_per_s']):.0f} img/s", 3)]
        return State(parts, step_eta(beat), step_line(beat),
                     ("step", beat["epoch"], beat["step"], beat.get("loss") is not None))
    if rows:
        last = rows[-1]
        parts = [(f"epoch {int(last.get('epoch', len(rows)))}/{epochs}", KEEP),
                 (f"loss {float(last.get('loss', float('nan'))):.4f}", 4),
                 (f"{float(last.get('images_per_s', 0.0)):.0f} img/s", 3)]
        return State(parts, epoch_eta(rows, epochs), epoch_line(rows, epochs), ("epoch", len(rows)))
    return STARTING


def grid_eta(remaining: list[float | None], queued: int, run_seconds: float | None, workers: int) -> float | None:
    """When the grid should end: each running run's remaining seconds, then ``queued`` runs of
    ``run_seconds`` each given to the first free worker (list scheduling). None when a number is unknown."""
    if any(r is None for r in remaining) or (queued and run_seconds is None):
        return None
    free = sorted([float(r) for r in remaining] + [0.0] * max(workers - len(remaining), 0))
    for _ in range(queued):
        free[0] += run_seconds
        free.sort()
    return max(free, default=0.0)


@dataclass
class _Slot:
    spec: RunSpec
    label: str
    epochs: int
    since: float  # wall time the slot started: older heartbeats are an earlier launch's
    started: float  # self.clock() when the slot started
    shown: int = 0  # log rows shown (not a terminal)
    state: State = STARTING
    said: float | None = None  # when a within-epoch line was last printed (not a terminal)
    trained: float | None = None  # self.clock() when every epoch was logged (evaluation and writing follow)


class ProgressBoard:
    """The launcher's view of its runs. ``tty``: state lines redrawn in place (default: when stdout and stderr
    are both a terminal; output sent to a file gets plain lines, all of them); ``total``: runs this launch will start (for the overall line); ``screen``: where a terminal
    board draws, ``clock``: how run lengths are timed (tests give a fixed-size screen and a fixed clock)."""

    def __init__(self, jobs: int, tty: bool | None = None, out=None, total: int | None = None,
                 screen: Screen | None = None, clock=time.monotonic):
        self.tty = (sys.stderr.isatty() and sys.stdout.isatty()) if tty is None else tty
        self.out = out or (sys.stderr if self.tty else sys.stdout)
        self.screen = screen or (Screen(self.out) if self.tty else None)
        self.jobs, self.total, self.clock = jobs, total, clock
        self.slots: dict[int, _Slot] = {}
        self.ended: list[float] = []  # wall seconds of each run that trained here (done or failed)
        self.tails: list[float] = []  # seconds from a run's last epoch to its end (evaluating, writing)
        self.failed = self.skipped = 0  # skipped: another process had the run
        self.said_eta = ""  # plain lines: the grid ETA last printed, never repeated

    def write(self, line: str) -> None:
        """A line above the state lines (on a terminal), or a plain printed line."""
        if self.screen is not None:
            self.screen.message(line)
        else:
            print(line, file=self.out, flush=True)

    def start(self, slot: int, spec: RunSpec, label: str) -> None:
        entry = _Slot(spec, f"{label} seed {spec.config['seed']}", int(spec.config["optim"]["epochs"]),
                      since=time.time() - 1.0, started=self.clock())
        entry.shown = len(_log_rows(spec))  # resumed: earlier epochs are not news
        self.slots[slot] = entry
        self.poll()

    def poll(self) -> None:
        """Read every run's log and heartbeat; redraw (terminal) or print what is new (plain lines)."""
        for slot, entry in self.slots.items():
            rows = _log_rows(entry.spec)
            run_dir = Path(entry.spec.run_dir)
            beat = read_heartbeat(run_dir, since=entry.since)
            state = run_state(rows, beat, entry.epochs, beat is not None and _newer(run_dir / HEARTBEAT, run_dir / store.LOG))
            if self.screen is None:
                self._print_news(slot, entry, rows, state)
            entry.state = state
            if entry.trained is None and len(rows) >= entry.epochs:
                entry.trained = self.clock()
        if self.screen is not None:
            self.screen.update(self.lines())

    def lines(self) -> list[str]:
        """The state lines: one per running run, then the overall line when the launch has several runs."""
        width = self.screen.size()[0] - 1 if self.screen is not None else 200
        out = [fit(f"[{slot}] {e.label}:" if self.jobs > 1 else f"{e.label}:", e.state.parts,
                   f"ETA {eta_text(self._remaining(e))}", width) for slot, e in sorted(self.slots.items())]
        if (self.total or 0) > 1:
            out.append(self.overall(width))
        return out

    def overall(self, width: int = 200) -> str:
        """'1/4 done (1 failed) · 2 running · 1 queued · grid ETA 3:10': runs that ended in this launch
        (failed ones and ones another process had, said), and when the grid should end (``grid_eta``)."""
        done, running = len(self.ended) + self.skipped, len(self.slots)
        queued = max((self.total or 0) - done - running, 0)
        notes = ", ".join(f"{n} {what}" for n, what in ((self.failed, "failed"), (self.skipped, "skipped")) if n)
        parts = [(f"{done}/{self.total} done", KEEP), (f"({notes})", 8) if notes else ("", 0),
                 (f"· {running} running", 6), (f"· {queued} queued", 5) if queued else ("", 0)]
        per_run, now = self._run_seconds(), self.clock()
        remaining = [self._remaining(e) if e.state.eta is not None else  # starting: a typical run less its time so far
                     None if per_run is None else max(per_run - (now - e.started), 0.0) for e in self.slots.values()]
        eta = grid_eta(remaining, queued, per_run, self.jobs)
        return fit("", [p for p in parts if p[0]], f"· grid ETA {eta_text(eta)}", width)

    def _run_seconds(self) -> float | None:
        """A queued run's expected length: the mean of the runs ended here, else of the running runs'
        estimates (elapsed + their ETA)."""
        if self.ended:
            return sum(self.ended) / len(self.ended)
        now = self.clock()
        known = [now - e.started + self._remaining(e) for e in self.slots.values() if e.state.eta is not None]
        return sum(known) / len(known) if known else None

    def _remaining(self, entry: _Slot) -> float | None:
        """Seconds until a run ends: its state's ETA and, while it trains, the evaluation and writing that
        follow its last epoch, as long as they took the runs that ended here (0 before any did)."""
        if entry.state.eta is None or entry.state.key[0] not in ("step", "epoch"):
            return entry.state.eta
        return entry.state.eta + (sum(self.tails) / len(self.tails) if self.tails else 0.0)

    def _print_news(self, slot: int, entry: _Slot, rows: list[dict], state: State) -> None:
        """Not a terminal: each new epoch (``QUIET_S`` apart within an epoch) and each new phase, once."""
        prefix = f"[slot {slot}] {entry.label}:"
        for i in range(entry.shown + 1, len(rows) + 1) if epoch_lines(False) else ():
            self.write(f"{prefix} {epoch_line(rows[:i], entry.epochs)}")
        entry.shown = max(entry.shown, len(rows))
        if state.key == entry.state.key or state.key[0] in ("epoch", "starting"):
            return
        if state.key[0] == "step" and not epoch_lines(False):  # within an epoch: --verbose only
            return
        if state.key[0] == "step" and not state.key[3]:  # no loss read yet this epoch: 'loss –' is no news
            return
        if state.key[0] == "step" and entry.said is not None and time.monotonic() - entry.said < QUIET_S:
            return
        entry.said = time.monotonic() if state.key[0] == "step" else entry.said
        self.write(f"{prefix} {state.plain}")

    def finish(self, slot: int, line: str | None, status: str = "done") -> None:
        """A run ended (``status``: done, failed, or another process had it): its last news, its line, and
        the overall count."""
        self.poll()
        entry = self.slots.pop(slot, None)
        if entry is not None and status in ("done", "failed"):
            self.ended.append(self.clock() - entry.started)
            self.failed += status == "failed"
            if entry.trained is not None and status == "done":
                self.tails.append(self.clock() - entry.trained)
        elif entry is not None:
            self.skipped += 1
        if line:
            self.write(line)
        if self.screen is not None:
            self.screen.update(self.lines())
        elif (self.total or 0) > 1:
            line, _, eta = self.overall().partition(" · grid ETA ")
            self.write(line if eta == self.said_eta else f"{line} · grid ETA {eta}")
            self.said_eta = eta

    def close(self) -> None:
        """Erase the state lines (the table or the Ctrl-C message follows on a clean line)."""
        self.slots.clear()
        if self.screen is not None:
            self.screen.close()


def _log_rows(spec: RunSpec) -> list[dict]:
    return [r for r in store.read_jsonl(Path(spec.run_dir) / store.LOG) if isinstance(r, dict) and "epoch" in r]


def _newer(a: Path, b: Path) -> bool:
    """Whether file ``a`` was written after ``b`` (or ``b`` does not exist)."""
    try:
        return os.stat(a).st_mtime_ns >= os.stat(b).st_mtime_ns
    except FileNotFoundError:
        return True
    except OSError:
        return False
