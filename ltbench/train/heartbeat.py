"""Where a run is, for the launcher's display: RUN_DIR/progress.json, rewritten as the run moves on.

Why a file: a pool worker's output goes to its worker.log, and the launcher must not depend on a pipe
back (a resumed run, a second launcher or ``ltbench status`` read the same file). The launcher polls it
(``ltbench.run.progress``). Two kinds of beat, both small JSON objects written by rank 0 only:

- a training beat (``engine.heartbeat``, about once a second within an epoch): ``epoch``, ``epochs``,
  ``step``, ``steps``, ``loss``, ``images_per_s``, ``seconds`` (since the epoch started);
- a phase beat (``PhaseBeat``): ``{"phase": "evaluating", "source", "set", "sets", "step", "steps",
  "eta"}`` while the test sets are predicted (the final evaluation took about 45 % of a short run,
  which a bar stuck at 'ETA 0:00' hid), and ``{"phase": "writing"}`` while the predictions and the
  result are written.

Torch-free: the launcher imports the names from here.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ltbench.results import store

HEARTBEAT = "progress.json"
EVALUATING, WRITING = "evaluating", "writing"
MIN_INTERVAL_S = 1.0  # at most one beat a second within a phase: a lost or late beat costs nothing


def write_beat(run_dir: Path, beat: dict) -> None:
    """Replace RUN_DIR/progress.json (renamed into place, not fsynced: the launcher never reads half a beat,
    and a lost beat costs nothing)."""
    store.atomic_write_bytes(Path(run_dir) / HEARTBEAT, json.dumps(beat).encode(), durable=False)


class PhaseBeat:
    """The evaluation and writing phases of one run, as phase beats.

    ``plan`` names the sources one evaluation goes through, with their sizes, so a beat can say 'test set
    i of M' and an ETA for the whole evaluation: the images left in this source and the later ones, at the
    rate measured on this source so far. A source outside the plan (the per-epoch validation of
    ``eval.select: best_val``) is its own set 1 of 1."""

    def __init__(self, run_dir: Path, clock=time.monotonic):
        self.run_dir, self.clock = Path(run_dir), clock
        self.sizes: dict[str, int] = {}
        self.source: str | None = None
        self.source_started = self.last = 0.0

    def plan(self, sizes: dict[str, int]) -> None:
        self.sizes, self.source = dict(sizes), None

    def evaluating(self, source: str, step: int, steps: int) -> None:
        """``step`` of ``steps`` batches of ``source`` are done (0: it starts)."""
        now = self.clock()
        if source != self.source:
            self.source, self.source_started, self.last = source, now, 0.0
        elif step < steps and now - self.last < MIN_INTERVAL_S:
            return
        self.last = now
        sources = list(self.sizes) if source in self.sizes else [source]
        index = sources.index(source)
        write_beat(self.run_dir, {"phase": EVALUATING, "source": source, "set": index + 1, "sets": len(sources),
                                  "step": step, "steps": steps, "eta": self._eta(sources[index + 1:], step, steps, now)})

    def _eta(self, later: list[str], step: int, steps: int, now: float) -> float | None:
        """Seconds left in this evaluation: this source's remaining batches at its own rate, then the later
        sources' images at the same rate per image. None before the first batch is timed."""
        seconds = now - self.source_started
        if step <= 0 or seconds <= 0:
            return None
        per_step = seconds / step
        left = per_step * (steps - step)
        size = self.sizes.get(self.source or "", 0)
        if later and size:
            left += per_step * steps / size * sum(self.sizes[s] for s in later)
        return left

    def writing(self) -> None:
        write_beat(self.run_dir, {"phase": WRITING})
