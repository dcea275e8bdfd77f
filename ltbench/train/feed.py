"""Batches onto the training device without stopping it: non-blocking copies, seeds through pinned memory,
and the next batch's copy and augmentation issued on a side CUDA stream while the current step trains.

Why: a GPU step is queued by the host and runs later; anything that makes the host wait (a blocking copy,
a read) or that runs on the training stream between two steps (copying the next batch, building its views
with ``train.augment_on: batch``) leaves the GPU idle or serialises work that could overlap. So
``Feeder.prepare`` issues batch k+1's work on a side stream right after step k is queued, and
``Feeder.take`` makes the training stream wait for it (an event, not a host wait) when step k+1 starts.

On the CPU and on the emulated device of ltbench/train/gpu_cost.py the same code runs with the stream
parts as no-ops (no stream, nothing pinned): one code path, tested on the CPU (tests/test_engine.py).
Memory: one batch more on the device (its views), the price of the overlap.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator

import torch


def seeds_on_device(batch_keys: list[tuple] | torch.Tensor, device: torch.device) -> torch.Tensor:
    """The per-sample seeds of a batch (a key's third item) on ``device`` without a blocking copy: built on
    the host, pinned on a real CUDA device so that the copy is asynchronous, then sent non-blocking
    (``torch.tensor(..., device=cuda)`` would wait for the copy). Seeds already on the device (a resident
    training set's batches, ``resident_batches``) pass through."""
    if isinstance(batch_keys, torch.Tensor):
        return batch_keys
    seeds = torch.tensor([key[2] for key in batch_keys], dtype=torch.int64)
    if device.type == "cuda":
        seeds = seeds.pin_memory()
    return seeds.to(device, non_blocking=True)


def resident_batches(images: torch.Tensor, labels: torch.Tensor, batch_keys: list[list], device: torch.device):
    """The batches of an epoch gathered from a training set held on the device (``engine.resident_data``):
    per batch, its indices and seeds in one host tensor (pinned on CUDA), one non-blocking copy, then a gather
    on the device, so no image crosses the bus and the host neither collates nor pins. The same images, labels
    and seeds as the loader's batches of these keys. Yields ``(([images], labels), seeds)``, the seeds on the
    device standing for the keys (``seeds_on_device`` passes them through). Taken by ``Feeder.prepare`` in its
    side stream's context, so the gather runs there too."""
    for keys in batch_keys:
        packed = torch.tensor([[key[1] for key in keys], [key[2] for key in keys]], dtype=torch.int64)
        if device.type == "cuda":
            packed = packed.pin_memory()
        packed = packed.to(device, non_blocking=True)
        index = packed[0]
        yield ([images.index_select(0, index)], labels.index_select(0, index)), packed[1]


def to_device(images, device: torch.device):
    """A batch's images (a tensor, or a list of images of different sizes) on the device, non-blocking."""
    if isinstance(images, list):
        return [im.to(device, non_blocking=True) for im in images]
    return images.to(device, non_blocking=True)


class SideStream:
    """A CUDA stream beside the training stream, or nothing where there is no CUDA (CPU, emulated device)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def issuing(self):
        """Context in which work is queued on the side stream (a no-op without CUDA). The side stream does not
        wait for the training stream (that would undo the overlap): what it reads is host data and what it
        creates itself (constants cached per device are made on first use, on this stream)."""
        if self.stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.stream)

    def handoff(self):
        """An event marking the end of the work just issued (None without CUDA)."""
        if self.stream is None:
            return None
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def receive(self, event, tensors: list) -> None:
        """The training stream waits (on the device) for the side stream's work, and the caching allocator
        learns that these tensors are used on the training stream (so it does not reuse their memory early)."""
        if self.stream is None or event is None:
            return
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)
        for t in tensors:
            for part in t if isinstance(t, (list, tuple)) else [t]:
                part.record_stream(current)


@dataclass
class DeviceBatch:
    """A batch issued to the device: its views, labels, and the event that says they are ready."""

    views: list[torch.Tensor]
    labels: torch.Tensor
    ready: object = None


class Feeder:
    """Host batches (``(views, labels), keys`` in order) -> device batches, one issued ahead.

    ``build_views(images, keys)``: the views on the device from the copied first view (``train.augment_on:
    batch``), or None when the loader's views are final. ``decode``: the loader hands over encoded files that
    the device decodes (copies are then the decoder's business).
    """

    def __init__(self, batches: Iterator, device: torch.device, build_views: Callable | None = None,
                 decode: bool = False):
        self.batches, self.device, self.build_views, self.decode = batches, device, build_views, decode
        self.side = SideStream(device)

    def prepare(self) -> DeviceBatch | None:
        """Issue the next host batch's copy (and views) on the side stream; None when the epoch has no more."""
        with self.side.issuing():  # the next batch taken here too: a device decoder hands its images to this stream
            item = next(self.batches, None)
            if item is None:
                return None
            (views, labels), keys = item
            views, labels = self.copy(views, labels)
            if self.build_views is not None:
                views = self.build_views(views[0], keys)
            return DeviceBatch(views, labels, self.side.handoff())

    def copy(self, views: list, labels: torch.Tensor) -> tuple[list, torch.Tensor]:
        """The host batch's copies to the device, non-blocking (encoded files stay: the decoder's business)."""
        return (views if self.decode else [to_device(v, self.device) for v in views]), \
            labels.to(self.device, non_blocking=True)

    def take(self, batch: DeviceBatch) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The batch's views and labels, usable on the training stream."""
        self.side.receive(batch.ready, [*batch.views, batch.labels])
        return batch.views, batch.labels
