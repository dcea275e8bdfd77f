"""Checkpoints of one run: the file format, and the policy of when to save and how to resume.

``CheckpointSaver`` owns the whole policy, so the training loop
only says "an epoch ended" or "a step ended": it saves at every epoch end, and mid-epoch after
``train.checkpoint_minutes`` of wall time (single process only: under DDP every rank would have to
agree on the moment). On resume it restores model, optimiser, method state and fp16 loss scale, and
cuts log.jsonl back to the lines the checkpoint had seen, so a resumed run logs each epoch once. No
RNG state is saved: the engine derives every random draw from (seed, epoch, index), see
``ltbench.train.engine``.

``best_val.pt`` (eval.select: best_val) is the model of the best validation epoch so far, written in the same
format and read the same way: ``torch.load(weights_only=True)``, so a file planted there is data, never code.
It is part of the run's state: a checkpoint taken after the first epoch is usable only with it.
"""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import Callable

import torch

from ltbench.errors import LtbenchError
from ltbench.results import schema, store

CHECKPOINT_FORMAT = 3  # 2: the seconds the run has taken (its cost); 3: when its first session started (the
#  bound of those seconds); a checkpoint of an earlier format starts its run over


CHECKPOINT_KEYS = ("epoch", "step", "iteration", "seconds", "run_started", "model", "optimizer")
#: The formats whose model a finished run's stage 2 reads: they differ only in what a resume reads (its cost).
MODEL_FORMATS = (2, CHECKPOINT_FORMAT)
BEST_VAL = "best_val.pt"  # RUN_DIR/best_val.pt: the model of the best validation epoch so far
BEST_VAL_KEYS = ("epoch", "model")
MAX_CHECKPOINT_BYTES = 64 * 1024 ** 3  # a checkpoint of the largest backbone with its optimizer state is a few GB


def write_state(path: Path, run, run_id: str, **fields) -> None:
    """``run``'s model and method state with ``fields`` in the checkpoint format, written atomically
    (``run``: an ``engine.Run``)."""
    state = {"format": CHECKPOINT_FORMAT, "run_id": run_id, **fields, "model": run.model.state_dict(),
             "method_extra": run.method.extra_state()}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    store.atomic_write_bytes(path, buffer.getvalue())


def save_checkpoint(path: Path, run, optimizer, *, run_id: str, epoch: int, step: int, iteration: int,
                    log_lines: int, seconds: float, run_started: float,
                    scaler: torch.amp.GradScaler | None = None) -> None:
    """The run's checkpoint: model, optimiser, method state, where the run is and the seconds it has taken
    (all sessions: a resumed run's cost goes on from there) since its first session started."""
    extra = {"scaler": scaler.state_dict()} if scaler is not None and scaler.is_enabled() else {}  # fp16: exact resume
    write_state(path, run, run_id, epoch=epoch,  # the epoch in progress (== epochs done when step == 0)
                step=step, iteration=iteration, log_lines=log_lines, seconds=seconds, run_started=run_started,
                optimizer=optimizer.state_dict(), **extra)


def save_best_val(run_dir: Path, run, *, run_id: str, epoch: int) -> None:
    """The model after ``epoch`` epochs as RUN_DIR/best_val.pt."""
    write_state(run_dir / BEST_VAL, run, run_id, epoch=epoch)


def read_state(path: Path, run_id: str, keys: tuple[str, ...], formats: tuple[int, ...] = (CHECKPOINT_FORMAT,)) -> dict:
    """The state in ``path`` (of one of ``formats``, this run's, holding ``keys``); ValueError saying why not."""
    try:  # torch.load on a FIFO would block, on /dev/zero never end, through a link read the user's file
        f = store.open_bounded(path, MAX_CHECKPOINT_BYTES)
    except store.UnusableFile as exc:
        raise ValueError(f"it {exc.reason}") from None
    try:
        with f:
            state = torch.load(f, map_location="cpu", weights_only=True)  # tensors and plain data only, never code
    except Exception as exc:  # truncated zip, a pickle of anything but tensors and plain data
        raise ValueError(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    if not isinstance(state, dict) or state.get("format") not in formats:
        raise ValueError("unknown checkpoint format")
    if state.get("run_id") != run_id:
        raise ValueError(f"it belongs to run {state.get('run_id')}")
    missing = [key for key in keys if key not in state]
    if missing:
        raise ValueError(f"missing '{missing[0]}'")
    return state


def load_checkpoint(path: Path, run_id: str, say: Callable[[str], None]) -> dict | None:
    """The checkpoint's state, or None (with a message) when it is absent, unreadable or foreign."""
    if not os.path.lexists(path):
        return None
    try:
        state = read_state(path, run_id, CHECKPOINT_KEYS)
        started, now = state["run_started"], time.time()
        if not (schema.is_number(started) and started <= now):
            raise ValueError(f"'run_started' is {str(started)[:40]!r}, not a time before now")
        if not schema.cost_bound(state["seconds"], started, now):  # the rule of a result's device_seconds
            raise ValueError(f"'seconds' is {str(state['seconds'])[:40]!r}, not a number of seconds since the run "
                             f"started at {started:.0f}")
        return state
    except ValueError as exc:  # all mean "start over"
        say(f"checkpoint {path} is unusable ({exc}); starting this run over")
        return None


def load_best_val(run_dir: Path, run_id: str) -> dict:
    """RUN_DIR/best_val.pt's state; a ``DamagedState`` (one line) when it is missing or unusable."""
    path = run_dir / BEST_VAL
    try:
        return read_state(path, run_id, BEST_VAL_KEYS)
    except ValueError as exc:
        raise DamagedState(f"{path} is unusable ({exc}): the best validation epoch's model is lost; run the recipe "
                           f"again with --rerun-failed (this run starts over)") from None


class DamagedState(LtbenchError):
    """A file of a run's state that the run cannot go on without (best_val.pt) is missing or unusable."""


class CheckpointSaver:
    """When to save, what to restore. Only the main process (rank 0) writes files."""

    def __init__(self, run_dir: Path, run_id: str, *, minutes: float, main: bool, world: int, best_val: bool = False,
                 session_start: float | None = None):
        self.path, self.log_path = run_dir / store.CHECKPOINT, run_dir / store.LOG
        self.run_id, self.minutes, self.main, self.world = run_id, minutes, main, world
        self.best_val = best_val  # eval.select: best_val (best_val.pt is part of the run's state)
        self.last_save = time.monotonic()
        self.seconds_before = 0.0  # seconds of the earlier sessions, as the checkpoint resumed from kept them
        self.session_start = time.monotonic() if session_start is None else session_start  # time.monotonic()
        self.run_started = time.time() - (time.monotonic() - self.session_start)  # wall clock; a resume keeps the first

    def seconds(self) -> float:
        """Seconds of this run so far: the earlier sessions' plus this one's (from its start)."""
        return self.seconds_before + time.monotonic() - self.session_start

    def resume(self, run, optimizer, scaler, say: Callable[[str], None]) -> tuple[int, int, int]:
        """Restore the run from its checkpoint if usable; (epoch, step, iteration) to start from.
        Without one, any old log is removed (the run starts over)."""
        state = load_checkpoint(self.path, self.run_id, say)
        if state is not None and self.best_val and state["epoch"] > 0:
            best = self.path.parent / BEST_VAL  # a best epoch was saved before this checkpoint: the run needs it
            try:
                read_state(best, self.run_id, BEST_VAL_KEYS)
            except ValueError as exc:
                say(f"{best} is unusable ({exc}); starting this run over")
                state = None
        if state is None:
            if self.main and self.log_path.exists():
                self.log_path.unlink()
            return 0, 0, 0
        run.model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        run.method.load_extra_state(state.get("method_extra", {}))
        if "scaler" in state:
            scaler.load_state_dict(state["scaler"])
        self.seconds_before, self.run_started = float(state["seconds"]), float(state["run_started"])
        say(f"resuming from checkpoint: epoch {state['epoch']}, step {state['step']}")
        if self.main:  # the log lines written after this checkpoint will be written again
            rows = store.read_jsonl(self.log_path)[: state.get("log_lines", 0)]
            store.atomic_write_bytes(self.log_path, "".join(store.canonical_line(r) for r in rows).encode())
        return state["epoch"], state["step"], state["iteration"]

    def _save(self, run, optimizer, scaler, epoch: int, step: int, iteration: int) -> None:
        save_checkpoint(self.path, run, optimizer, run_id=self.run_id, epoch=epoch, step=step, iteration=iteration,
                        log_lines=len(store.read_jsonl(self.log_path)), seconds=self.seconds(),
                        run_started=self.run_started, scaler=scaler)

    def after_step(self, run, optimizer, scaler, *, epoch: int, next_step: int, steps_in_epoch: int,
                   iteration: int, before_save: Callable[[], None] | None = None) -> None:
        """The timed mid-epoch checkpoint (none at the epoch's last step: the epoch-end one follows).
        ``before_save`` runs first when one is due (the engine checks there that no loss went non-finite)."""
        if self.minutes and time.monotonic() - self.last_save > 60 * self.minutes \
                and next_step < steps_in_epoch and self.world == 1:
            if before_save is not None:
                before_save()
            self._save(run, optimizer, scaler, epoch, next_step, iteration)
            self.last_save = time.monotonic()

    def after_epoch(self, run, optimizer, scaler, *, epochs_done: int, iteration: int) -> None:
        if self.main:
            self._save(run, optimizer, scaler, epochs_done, 0, iteration)

    def restart_clock(self) -> None:
        """Start the mid-epoch interval now (after an epoch-end save and at the start of training)."""
        self.last_save = time.monotonic()
