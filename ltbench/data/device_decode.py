"""JPEG decoding on the training device (nvJPEG through torchvision.io.decode_jpeg) for ImageNet-size data.

Why: with ``train.augment_on: batch`` on a GPU the augmentation leaves the CPU, and what is left there for
ImageNet-size images is decoding (a 500x375 JPEG takes milliseconds per core: 8-16 cores cannot feed
a GPU that trains ResNet-50 at thousands of images/s). DALI and FFCV decode on the GPU or fuse the crop into
decoding for the same reason. So on CUDA the loader's workers only read files: a training sample is its
encoded bytes (a uint8 1-D tensor, pinned by the DataLoader like any batch), and the main process decodes the
whole batch at once on the device, handing a list of uint8 CHW tensors to the batched pipelines
(ltbench/data/batch_augment.py), which crop and resize each image there.

Fallbacks, so a run never fails for the decoder's sake: files that are not JPEG (PNG in some Places /
iNaturalist copies, a renamed file) are decoded on the CPU and moved; if the device decoder raises on a batch
(an unsupported JPEG flavour, an old driver), that batch is decoded on the CPU and a warning says so once. On
a CPU device everything is decoded on the CPU (the same decoder as ``FileImages``), so the result is the
same images whichever device trains; nvJPEG's IDCT may differ from libjpeg's by a grey level or so.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Callable

import torch
from torch.utils.data import Dataset

from ltbench.data.base import MultiView
from ltbench.errors import DataMissingError

JPEG_MAGIC = (0xFF, 0xD8, 0xFF)
_warned: set[str] = set()


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
    return data.numel() >= 3 and tuple(int(b) for b in data[:3]) == JPEG_MAGIC


def decode_cpu(data: torch.Tensor) -> torch.Tensor:
    from torchvision.io import ImageReadMode, decode_image

    return decode_image(data, mode=ImageReadMode.RGB)


def gpu_jpeg_decoder(device: torch.device) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """torchvision's batched nvJPEG decode of CPU byte tensors to RGB uint8 CHW tensors on ``device``."""
    from torchvision.io import ImageReadMode, decode_jpeg

    def decode(batch: list[torch.Tensor]) -> list[torch.Tensor]:
        return decode_jpeg(batch, mode=ImageReadMode.RGB, device=device)

    return decode


def decode_batch(encoded: list[torch.Tensor], device: torch.device,
                 jpeg_decoder: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None) -> list[torch.Tensor]:
    """Decode a batch of encoded images to RGB uint8 CHW tensors on ``device``, in order.

    JPEGs go to ``jpeg_decoder`` (default: nvJPEG on a CUDA device, none on a CPU device) in one call; the
    others, and every image when the device decoder fails, are decoded on the CPU and copied over."""
    if jpeg_decoder is None and device.type == "cuda":
        jpeg_decoder = gpu_jpeg_decoder(device)
    out: list[torch.Tensor | None] = [None] * len(encoded)
    jpegs = [i for i, data in enumerate(encoded) if is_jpeg(data)] if jpeg_decoder is not None else []
    if jpegs:
        try:
            for i, image in zip(jpegs, jpeg_decoder([encoded[i].cpu() for i in jpegs])):
                out[i] = image
        except RuntimeError as exc:
            _warn_once("device", f"decoding JPEGs on {device} failed ({exc}); decoding this batch on the CPU instead")
            out = [None] * len(encoded)
    for i, image in enumerate(out):
        if image is None:
            out[i] = decode_cpu(encoded[i].cpu()).to(device, non_blocking=True)
    return out


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
