"""One epoch's training meters, kept on the training device and read by the host only now and then.

Why on the device: reading a device value every step (``loss.item()``, ``int(correct)``, ``float(extra)``,
``bool(isfinite(loss))``) makes the host wait for the GPU to drain each time, so it can never queue the
next step's kernels ahead (docs/performance.md, "Launches and syncs"). So each step adds its values to
device tensors with a few kernels and no sync; the host reads them all in one copy at a *read*: every
``train.log_every`` steps (for the progress line and the heartbeat), before a mid-epoch checkpoint, and at
the epoch end. The non-finite check rides on the same read: each step's loss is kept in a per-step slot,
and a read reports the first non-finite one, so the step named is the one that diverged, however late the
read comes.

Exactness: the sums are float64 and each step adds ``value * n`` in the same order as the host sums did
(float32 losses widen exactly), so the epoch rows are bit-identical to reading every step.
"""

from __future__ import annotations

import math
import time

import torch

from ltbench.train import distributed

_F64 = torch.float64


class EpochMeter:
    """Per-image sums over one epoch's steps (loss, accuracy of the training logits, scalar extras).

    ``add`` queues device work only; ``read`` copies everything to the host in one transfer and returns
    (step, loss value) of the first non-finite loss since the epoch began, or None. ``sums`` and ``extra``
    hold the host values as of the last read (``seen``: images counted in them); ``images`` counts every
    image added, read or not (the host knows batch sizes without asking the device).
    """

    def __init__(self, device: torch.device | str = "cpu", steps: int = 1, first_step: int = 0):
        self.device, self.first_step = torch.device(device), first_step
        self.losses = torch.zeros(max(steps, 1), dtype=_F64, device=self.device)  # one slot per step
        self.totals = torch.zeros(1, dtype=_F64, device=self.device)  # loss * n, then each extra * n
        self.correct = torch.zeros((), dtype=torch.int64, device=self.device)
        self.zero = torch.zeros((), dtype=_F64, device=self.device)  # an extra a step did not report
        self.extra_keys: list[str] = []
        self.host_extra: dict[str, float] = {}  # extras a method returned as host (CPU) tensors
        self.steps = self.images = 0
        self.sums = {"loss": 0.0, "correct": 0, "seen": 0}
        self.extra: dict[str, float] = {}
        self.t0 = time.perf_counter()

    def add(self, out: dict, loss: torch.Tensor, labels: torch.Tensor) -> None:
        """Queue one step's contribution (no host-device sync)."""
        n = len(labels)
        if self.steps == len(self.losses):  # more steps than planned (a caller that did not say): grow
            self.losses = torch.cat([self.losses, torch.zeros_like(self.losses)])
        self.losses[self.steps].copy_(loss.detach().reshape(()))
        keys = [k for k, v in out.items() if k not in ("loss", "logits") and v.numel() == 1]
        for k in [k for k in keys if out[k].device != self.device]:  # a host scalar: read it here, no sync
            keys.remove(k)
            self.host_extra[k] = self.host_extra.get(k, 0.0) + float(out[k]) * n
        new = [k for k in keys if k not in self.extra_keys]
        if new:  # a key seen for the first time this epoch: its running sum starts at zero
            self.extra_keys += new
            self.totals = torch.cat([self.totals, self.totals.new_zeros(len(new))])
        if "logits" in out:
            self.correct.add_((out["logits"].argmax(1) == labels).sum())
        parts = [loss.detach()] + [out[k].detach() if k in out else self.zero for k in self.extra_keys]
        values = torch.stack([p.reshape(()).to(_F64) for p in parts])
        self.totals.add_(values.mul_(n))
        self.steps += 1
        self.images += n

    def read(self) -> tuple[int, float] | None:
        """Copy the sums to the host (one transfer); the first non-finite loss as (step, value), or None."""
        if self.steps == 0:
            return None
        done = self.losses[: self.steps]
        bad = ~torch.isfinite(done)
        first = torch.where(bad.any(), bad.to(torch.uint8).argmax(), -1)
        value = done.index_select(0, first.clamp_min(0).reshape(1))
        host = torch.cat([self.totals, self.correct.to(_F64).reshape(1), first.to(_F64).reshape(1), value]).tolist()
        self.sums = {"loss": host[0], "correct": int(host[-3]), "seen": self.images}
        self.extra = {**dict(zip(self.extra_keys, host[1:-3])), **self.host_extra}
        return None if host[-2] < 0 else (self.first_step + int(host[-2]), host[-1])

    def show(self, bar, fresh: bool) -> None:
        """Advance the progress bar; its loss and accuracy change when a read has just refreshed them."""
        if not bar.disable and fresh and self.sums["seen"]:  # refresh=False: the bar redraws in update()
            sums = self.sums
            rate = self.images / max(time.perf_counter() - self.t0, 1e-9)
            bar.set_postfix(loss=f"{sums['loss'] / sums['seen']:.3f}",
                            acc=f"{sums['correct'] / sums['seen']:.3f}", img_s=f"{rate:.0f}", refresh=False)
        bar.update(1)

    def all_reduce(self, world: int) -> None:
        """Sum the last read's values over processes (every process then holds the totals)."""
        if world > 1:
            extra_keys = sorted(self.extra)
            totals = distributed.all_reduce_sum([self.sums["loss"], self.sums["correct"], self.sums["seen"]]
                                                + [self.extra[k] for k in extra_keys])
            self.sums = {"loss": totals[0], "correct": int(totals[1]), "seen": int(totals[2])}
            self.extra = dict(zip(extra_keys, totals[3:]))

    def row(self, epoch: int, lr: float) -> dict:
        """The epoch's log.jsonl row (before any test metrics), from the last read."""
        seconds = time.perf_counter() - self.t0
        seen = max(self.sums["seen"], 1)
        row = {"epoch": epoch + 1, "loss": self.sums["loss"] / seen, "train_acc": self.sums["correct"] / seen,
               "lr": lr, "seconds": seconds, "images_per_s": self.sums["seen"] / max(seconds, 1e-9)}
        row.update({k: v / seen for k, v in self.extra.items()})
        return row


def first_non_finite_everywhere(local: tuple[int, float] | None, world: int) -> tuple[int, float] | None:
    """The earliest non-finite loss over all processes, so that every process stops at the same read
    (the others would wait forever in the next collective). Its value is the sum of the values the
    processes saw at that step (one process: its own)."""
    if world <= 1:
        return local
    step = distributed.all_reduce_min([math.inf if local is None else float(local[0])])[0]
    if math.isinf(step):
        return None
    mine = local is not None and local[0] == step
    value = distributed.all_reduce_sum([local[1] if mine else 0.0])[0]
    return int(step), value
