"""JPEG decoding on the training device (nvJPEG through torchvision.io.decode_jpeg) for ImageNet-size data.

Why: with ``train.augment_on: batch`` on a GPU, decoding is what is left on the CPU, and 8-16 cores cannot
decode fast enough to feed a GPU training ResNet-50 (DALI and FFCV decode on the GPU for the same reason). So
on CUDA the workers only read files (a sample is its encoded bytes) and the main process decodes the whole
batch on the device. nvJPEG waits for its own stream, so the engine decodes batch k+1 in a background thread
while batch k trains (``decode_ahead``); images, order and random state are the same as without the thread.

Fallbacks, per file, so a run never fails for the decoder's sake: files that are not JPEG are decoded on the
CPU; a batch nvJPEG refuses is split in halves and retried down to single files (2 log2(n) more calls for one
refused file in n), and a batch refused file by file turns the device decoder off for the run. The counts
are log.jsonl's ``decode_fallbacks`` and ``decode_not_jpeg`` (``DecodeStats``). On a CPU device everything is
decoded on the CPU, as ``FileImages`` does; nvJPEG's IDCT may differ from libjpeg's by a grey level or so.
"""

from __future__ import annotations

import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch
from torch.utils.data import Dataset

from ltbench.data.base import MultiView
from ltbench.errors import DataMissingError

JPEG_MAGIC = (0xFF, 0xD8, 0xFF)
_warned: set[str] = set()
Decoder = Callable[[list[torch.Tensor]], list[torch.Tensor]]


def uses_device_decode(augment_on: str, image_kind: str, device: torch.device) -> bool:
    """Decode on the device: batched augmentation of ImageNet-size files on CUDA (elsewhere workers decode)."""
    return augment_on == "batch" and image_kind == "large" and device.type == "cuda"


def encoded_source(dataset: Dataset, augment_on: str, image_kind: str, device: torch.device):
    """The training source for the loader when the device decodes: ``MultiView`` of the files' bytes (one view,
    the bytes as they are); None when workers decode (``uses_device_decode`` is false, or the dataset is not
    read from files, e.g. CIFAR arrays)."""
    if not uses_device_decode(augment_on, image_kind, device) or not callable(getattr(dataset, "file", None)):
        return None
    return MultiView(EncodedFiles(dataset), [encoded_view])


class EncodedFiles(Dataset):
    """The files of a ``FileImages`` dataset as their encoded bytes: item = (uint8 1-D tensor, label)."""

    def __init__(self, files):
        self.files = files  # ltbench.data.splitlist.FileImages (anything with .file(i), .where(i), .labels)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        from torchvision.io import read_file

        path = Path(self.files.file(i))
        if not path.is_file():
            raise DataMissingError(f"image {path} not found{self.files.where(i)}")
        return read_file(str(path)), int(self.files.labels[i])


def encoded_view(item: torch.Tensor) -> torch.Tensor:
    """The one 'view' of an encoded sample: its bytes as they are (decoding waits for the device)."""
    return item


def is_jpeg(data: torch.Tensor) -> bool:
    return data.numel() >= 3 and tuple(data[:3].tolist()) == JPEG_MAGIC


def is_encoded(images) -> bool:
    """Whether a batch is still the files' bytes (1-D rows in a list, or a 2-D stack of rows of one length)
    rather than decoded CHW images; read from shapes only, so it costs no device sync."""
    return images[0].ndim == 1 if isinstance(images, (list, tuple)) else images.ndim == 2


def decode_cpu(data: torch.Tensor) -> torch.Tensor:
    from torchvision.io import ImageReadMode, decode_image

    return decode_image(data, mode=ImageReadMode.RGB)


def gpu_jpeg_decoder(device: torch.device) -> Decoder:
    """torchvision's batched nvJPEG decode of CPU byte tensors to RGB uint8 CHW tensors on ``device``."""
    from torchvision.io import ImageReadMode, decode_jpeg

    def decode(batch: list[torch.Tensor]) -> list[torch.Tensor]:
        return decode_jpeg(batch, mode=ImageReadMode.RGB, device=device)

    return decode


def device_jpeg_decoder(device: torch.device) -> Decoder | None:
    """The batched JPEG decoder of ``device``: nvJPEG on CUDA; none on a CPU, where the CPU decoder is the
    device's (the tests replace this to stand for nvJPEG on a CPU)."""
    return gpu_jpeg_decoder(device) if device.type == "cuda" else None


@dataclass
class DecodeStats:
    """What device decoding did, for the epoch log: JPEGs the device decoder refused (decoded on the CPU
    instead: ``fallbacks``), files that are not JPEG (always decoded on the CPU: ``not_jpeg``), and the calls
    made to the device decoder (``device_calls``, cumulative: what the per-file fallback cost). The engine
    keeps one per run (``Run.decode_stats``) and reads it at each epoch's end (``take_epoch``)."""

    fallbacks: int = 0
    not_jpeg: int = 0
    device_calls: int = 0
    device_off: bool = False  # after a batch refused file by file: the decoder, not the files, is broken

    def take_epoch(self, sum_over_processes: Callable[[list[float]], list[float]] = list) -> dict[str, int]:
        """The log.jsonl fields since the last call (summed over processes), and reset them."""
        fallbacks, not_jpeg = sum_over_processes([float(self.fallbacks), float(self.not_jpeg)])
        self.fallbacks = self.not_jpeg = 0
        return {"decode_fallbacks": int(fallbacks), "decode_not_jpeg": int(not_jpeg)}


def decode_batch(encoded: list[torch.Tensor], device: torch.device, jpeg_decoder: Decoder | None = None,
                 stats: DecodeStats | None = None) -> list[torch.Tensor]:
    """Decode a batch of encoded images to RGB uint8 CHW tensors on ``device``, in order.

    JPEGs go to ``jpeg_decoder`` (default: ``device_jpeg_decoder``, nvJPEG on CUDA) in one call, split
    only where it refuses (``decode_each_on_device``); the other files and the refused ones are decoded on
    the CPU and copied over. ``stats`` counts both (``DecodeStats``)."""
    stats = stats if stats is not None else DecodeStats()
    jpeg_decoder = jpeg_decoder if jpeg_decoder is not None else device_jpeg_decoder(device)
    jpegs = [i for i, data in enumerate(encoded) if is_jpeg(data)]
    stats.not_jpeg += len(encoded) - len(jpegs)
    out: list[torch.Tensor | None] = [None] * len(encoded)
    if jpegs and jpeg_decoder is not None:
        if not stats.device_off:
            for i, image in zip(jpegs, decode_each_on_device([encoded[i].cpu() for i in jpegs], jpeg_decoder, stats)):
                out[i] = image
        refused = sum(out[i] is None for i in jpegs)
        stats.fallbacks += refused
        if len(jpegs) > 1 and refused == len(jpegs) and not stats.device_off:
            stats.device_off = True
            _warn_once("off", f"the device decoder refused each of the {len(jpegs)} JPEGs of a batch one by one; "
                              f"decoding on the CPU for the rest of this run")
    for i, image in enumerate(out):
        if image is None:
            out[i] = to_device(decode_cpu(encoded[i].cpu()), device)
    return out


def decode_each_on_device(jpegs: list[torch.Tensor], decoder: Decoder, stats: DecodeStats) -> list[torch.Tensor | None]:
    """The device decoder's images of ``jpegs``, None for each file it refuses.

    One call for the whole list; when it raises, the list is split in halves and each half tried again,
    down to single files. No sync of ours: the cost of a refusal is the repeated calls (about 2 log2(n) for
    one bad file among n) and the CPU decode the caller does for the refused file."""
    stats.device_calls += 1
    try:
        return list(decoder(jpegs))
    except RuntimeError as exc:
        _warn_once("refused", f"the device decoder refused a JPEG ({exc}); each file it refuses is decoded on the "
                              f"CPU (their number per epoch is decode_fallbacks in log.jsonl)")
        if len(jpegs) == 1:
            return [None]
    half = len(jpegs) // 2
    return decode_each_on_device(jpegs[:half], decoder, stats) + decode_each_on_device(jpegs[half:], decoder, stats)


def to_device(image: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU-decoded image on ``device``; on CUDA through pinned memory, so the copy does not block the host."""
    if device.type != "cuda":
        return image.to(device)
    return image.pin_memory().to(device, non_blocking=True)


# ------------------------------------------------------------------------------------------------
# Decoding the next batch while this one trains


def decode_ahead(batches: Iterable[tuple[list, torch.Tensor]], device: torch.device, stats: DecodeStats | None = None,
                 threaded: bool = True) -> Iterator[tuple[list, torch.Tensor]]:
    """The loader's ``(views, labels)`` batches with the encoded view decoded on ``device`` (``decode_batch``),
    the decode of batch k+1 running in a background thread while the caller trains on batch k.

    The same images in the same order as decoding in the loop. Batches are still loaded (``next``) in the
    calling thread and in order: a loader without workers seeds torch's CPU generator per sample
    (``SeededSamples``), which a thread would do at unpredictable moments. Loading one batch ahead leaves
    the generator as batch k+1's loading left it, so the state after loading batch k is put back when batch
    k is handed over: each step sees the CPU random state it sees without the lookahead. ``threaded=False``
    decodes in the calling thread at the same points (the reference the tests compare with). Costs one more
    decoded batch on the device (144 MB of uint8 for 256 images of 500x375)."""
    stats = stats if stats is not None else DecodeStats()
    side = torch.cuda.Stream(device) if device.type == "cuda" else None
    pool = ThreadPoolExecutor(1, thread_name_prefix="ltbench-decode") if threaded else None
    try:
        loaded = iter(batches)
        pending = _load_and_start(loaded, pool, device, stats, side)
        while pending is not None:
            following = _load_and_start(loaded, pool, device, stats, side)
            yield _hand_over(pending, device)
            pending = following
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _load_and_start(loaded: Iterator, pool: ThreadPoolExecutor | None, device: torch.device, stats: DecodeStats,
                    side) -> tuple | None:
    """Load the next batch in this thread (None after the last) and start decoding it."""
    batch = next(loaded, None)
    if batch is None:
        return None
    views, labels = batch
    rng = torch.random.get_rng_state()  # as this batch's loading left it (see decode_ahead)
    encoded = list(views[0])
    if pool is not None:
        future = pool.submit(_decode_on_stream, encoded, device, stats, side)
    else:
        future = Future()
        future.set_result(_decode_on_stream(encoded, device, stats, side))
    return future, list(views[1:]), labels, rng


def _decode_on_stream(encoded: list[torch.Tensor], device: torch.device, stats: DecodeStats, side):
    """``decode_batch`` on the side stream (CUDA), with an event that marks the images ready."""
    if side is None:
        return decode_batch(encoded, device, stats=stats), None
    with torch.cuda.stream(side):
        images = decode_batch(encoded, device, stats=stats)
        ready = torch.cuda.Event()
        ready.record(side)
    return images, ready


def _hand_over(pending: tuple, device: torch.device) -> tuple[list, torch.Tensor]:
    """Wait for a batch's decode; on CUDA the current stream, the one that reads the images next (the feeder's
    side stream, which takes the batch in its context: ltbench/train/feed.py), waits for the decode's stream (on
    the device, not the host) and the images are marked as used there, so their memory is not reused while
    it still reads them."""
    future, rest, labels, rng = pending
    images, ready = future.result()
    if ready is not None:
        stream = torch.cuda.current_stream(device)
        stream.wait_event(ready)
        for image in images:
            image.record_stream(stream)
    torch.random.set_rng_state(rng)
    return [images, *rest], labels


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
