"""What `ltbench run --jobs N` shows while its workers train: one line per slot with the run's epoch,
loss, img/s and ETA, and a line per finished run naming its method, seed and All accuracy.

Workers write their output to ``worker.log`` and one row per epoch to ``log.jsonl``; this module only
reads ``log.jsonl`` (the launcher polls it a few times a second), so a worker needs no pipe back and a
run resumed from a checkpoint shows its true epoch. On a terminal each slot is a tqdm bar (one line
per slot, redrawn in place); elsewhere (a pipe, a CI log) each new epoch is one plain line, so the
progress reaches log files too.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ltbench.results import store
from ltbench.results.runspec import RunSpec


def eta_text(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60}:{seconds % 60:02d}"


def epoch_line(rows: list[dict], epochs: int) -> str:
    """'epoch 3/30 loss 1.2345 812 img/s ETA 1:05' from a run's log rows (ETA: mean epoch time so far)."""
    last = rows[-1]
    times = [float(r["seconds"]) for r in rows if isinstance(r.get("seconds"), (int, float))]
    done = int(last.get("epoch", len(rows)))
    eta = (epochs - done) * sum(times) / len(times) if times else None
    return (f"epoch {done}/{epochs} loss {float(last.get('loss', float('nan'))):.4f} "
            f"{float(last.get('images_per_s', 0.0)):.0f} img/s ETA {eta_text(eta)}")


HEARTBEAT = "progress.json"  # written by the engine (ltbench.train.engine.HEARTBEAT) about once a second
QUIET_S = 30.0  # not a terminal: a within-epoch line at most this often per slot (the first one at once)


def step_line(beat: dict) -> str:
    """'epoch 1/30 step 12/61 loss 2.0312 95 img/s ETA 3:10' from a worker's heartbeat (before an epoch ends)."""
    epoch, epochs = int(beat["epoch"]), int(beat["epochs"])
    step, steps, seconds = int(beat["step"]), max(int(beat["steps"]), 1), float(beat["seconds"])
    per_epoch = seconds * steps / max(step, 1)
    eta = per_epoch * (epochs - epoch) + per_epoch - seconds
    loss = "–" if beat.get("loss") is None else f"{float(beat['loss']):.4f}"  # None: not read from the device yet
    return (f"epoch {epoch}/{epochs} step {step}/{steps} loss {loss} "
            f"{float(beat['images_per_s']):.0f} img/s ETA {eta_text(eta)}")


def read_heartbeat(run_dir: Path) -> dict | None:
    try:
        beat = json.loads((Path(run_dir) / HEARTBEAT).read_text())
        return beat if isinstance(beat, dict) and {"epoch", "epochs", "step", "steps"} <= set(beat) else None
    except (OSError, ValueError):
        return None


def finished_line(spec: RunSpec, label: str, status: str) -> str:
    """'finished la (tau=1) seed 0 (abc123): done, All 67.20 %' (the accuracy when the run is done)."""
    line = f"finished {label} seed {spec.config['seed']} ({spec.run_id}): {status}"
    accuracy = None
    if status == "done":
        try:
            result = json.loads((Path(spec.run_dir) / store.RESULT).read_text())
            accuracy = (result.get("metrics") or {}).get("all")
        except (OSError, ValueError, AttributeError):
            accuracy = None
    return line + (f", All {100.0 * float(accuracy):.2f} %" if isinstance(accuracy, (int, float)) else "")


@dataclass
class _Slot:
    spec: RunSpec
    label: str
    epochs: int
    shown: int = 0  # log rows already shown
    bar: object = None
    said: float | None = None  # when a within-epoch line was last printed (not a terminal)
    beat: tuple | None = None  # (epoch, step) of the last heartbeat shown


class ProgressBoard:
    """The launcher's view of its slots. ``tty``: tqdm bars (default: whether stderr is a terminal)."""

    def __init__(self, jobs: int, tty: bool | None = None, out=None):
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.out = out or (sys.stderr if self.tty else sys.stdout)
        self.slots: dict[int, _Slot] = {}

    def write(self, line: str) -> None:
        """A line above the bars (tqdm.write keeps the bars intact), or a plain printed line."""
        if self.tty:
            from tqdm import tqdm

            tqdm.write(line, file=self.out)
        else:
            print(line, file=self.out, flush=True)

    def start(self, slot: int, spec: RunSpec, label: str) -> None:
        epochs = int(spec.config["optim"]["epochs"])
        entry = _Slot(spec, f"{label} seed {spec.config['seed']}", epochs)
        entry.shown = len(store.read_jsonl(Path(spec.run_dir) / store.LOG))  # resumed: earlier epochs
        if self.tty:
            from tqdm import tqdm

            entry.bar = tqdm(total=epochs, initial=entry.shown, position=slot, desc=entry.label, unit="epoch",
                             leave=False, dynamic_ncols=True, file=self.out,
                             bar_format="{desc}: {n_fmt}/{total_fmt} epochs |{bar}| {postfix}")
            entry.bar.set_postfix_str("starting (data, model)")
        self.slots[slot] = entry

    def poll(self) -> None:
        """Show every epoch logged since the last poll, else where the running epoch is."""
        for slot, entry in self.slots.items():
            rows = [r for r in store.read_jsonl(Path(entry.spec.run_dir) / store.LOG)
                    if isinstance(r, dict) and "epoch" in r]
            if len(rows) > entry.shown:
                self._show_epochs(slot, entry, rows)
            else:
                self._show_heartbeat(slot, entry, read_heartbeat(Path(entry.spec.run_dir)), len(rows))

    def _show_epochs(self, slot: int, entry: _Slot, rows: list[dict]) -> None:
        if entry.bar is not None:
            entry.bar.n = min(int(rows[-1]["epoch"]), entry.epochs)
            entry.bar.set_postfix_str(epoch_line(rows, entry.epochs).split(" ", 2)[2], refresh=True)
        else:
            for i in range(entry.shown + 1, len(rows) + 1):
                self.write(f"[slot {slot}] {entry.label}: {epoch_line(rows[:i], entry.epochs)}")
        entry.shown = len(rows)

    def _show_heartbeat(self, slot: int, entry: _Slot, beat: dict | None, logged: int) -> None:
        """The running epoch (one not in log.jsonl yet), at most one new line per QUIET_S off a terminal."""
        if beat is None or int(beat["epoch"]) <= logged or (beat["epoch"], beat["step"]) == entry.beat:
            return
        entry.beat = (beat["epoch"], beat["step"])
        if entry.bar is not None:
            entry.bar.set_postfix_str(step_line(beat).split(" ", 2)[2], refresh=True)
        elif entry.said is None or time.monotonic() - entry.said >= QUIET_S:
            entry.said = time.monotonic()
            self.write(f"[slot {slot}] {entry.label}: {step_line(beat)}")

    def finish(self, slot: int, line: str) -> None:
        self.poll()
        entry = self.slots.pop(slot, None)
        if entry is not None and entry.bar is not None:
            entry.bar.close()
        self.write(line)

    def close(self) -> None:
        for slot in list(self.slots):
            entry = self.slots.pop(slot)
            if entry.bar is not None:
                entry.bar.close()
