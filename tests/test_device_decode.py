"""Decoding on the training device (ltbench/data/device_decode.py): the CPU fallback and the routing are
tested here; nvJPEG itself in tests/test_gpu.py (``pytest -m gpu``)."""

import warnings

import numpy as np
import pytest
import torch
from torchvision.io import encode_jpeg, encode_png

from ltbench.data.device_decode import EncodedFiles, decode_batch, decode_cpu, is_jpeg, uses_device_decode
from ltbench.data.splitlist import FileImages
from ltbench.errors import DataMissingError


def images(n: int = 3) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (3, 20 + 4 * i, 30 - 2 * i), dtype=torch.uint8, generator=gen) for i in range(n)]


def write_files(tmp_path, kinds: list[str]) -> FileImages:
    paths = []
    for i, (kind, image) in enumerate(zip(kinds, images(len(kinds)))):
        data = encode_jpeg(image, quality=95) if kind == "jpeg" else encode_png(image)
        path = tmp_path / f"im{i}.{kind}"
        path.write_bytes(data.numpy().tobytes())
        paths.append(path.name)
    return FileImages(tmp_path, paths, np.arange(len(kinds)), source="list.txt", lines=np.arange(1, len(kinds) + 1))


def test_cpu_device_decodes_like_the_worker_path(tmp_path):
    files = write_files(tmp_path, ["jpeg", "png", "jpeg"])
    encoded = EncodedFiles(files)
    batch = [encoded[i][0] for i in range(3)]
    assert [encoded[i][1] for i in range(3)] == [0, 1, 2]
    assert all(b.dtype == torch.uint8 and b.ndim == 1 for b in batch)
    decoded = decode_batch(batch, torch.device("cpu"))
    for i, image in enumerate(decoded):
        assert torch.equal(image, files[i][0])  # the same decoder as FileImages: bit-identical
    assert torch.equal(decoded[1], images(3)[1])  # PNG is lossless


def test_jpegs_go_to_the_device_decoder_in_one_call_and_the_rest_to_the_cpu(tmp_path):
    files = write_files(tmp_path, ["png", "jpeg", "jpeg", "png"])
    batch = [EncodedFiles(files)[i][0] for i in range(4)]
    calls = []

    def fake_device_decoder(jpegs):
        calls.append(len(jpegs))
        return [decode_cpu(data).flip(-1) for data in jpegs]  # marked, so the test sees who decoded what

    out = decode_batch(batch, torch.device("cpu"), jpeg_decoder=fake_device_decoder)
    assert calls == [2]
    assert [is_jpeg(b) for b in batch] == [False, True, True, False]
    for i in (1, 2):
        assert torch.equal(out[i], files[i][0].flip(-1))
    for i in (0, 3):
        assert torch.equal(out[i], files[i][0])


def test_a_failing_device_decoder_falls_back_to_the_cpu_with_one_warning(tmp_path):
    files = write_files(tmp_path, ["jpeg", "jpeg"])
    batch = [EncodedFiles(files)[i][0] for i in range(2)]

    def broken(jpegs):
        raise RuntimeError("nvjpeg: unsupported")

    from ltbench.data import device_decode

    device_decode._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = decode_batch(batch, torch.device("cpu"), jpeg_decoder=broken)
        decode_batch(batch, torch.device("cpu"), jpeg_decoder=broken)
    assert [torch.equal(o, files[i][0]) for i, o in enumerate(out)] == [True, True]
    messages = [str(w.message) for w in caught if "decoding JPEGs" in str(w.message)]
    assert len(messages) == 1 and "nvjpeg: unsupported" in messages[0]


def test_a_missing_file_names_its_list_line(tmp_path):
    files = FileImages(tmp_path, ["gone.JPEG"], np.array([0]), source="ImageNet_LT_train.txt", lines=np.array([7]))
    with pytest.raises(DataMissingError, match=r"gone.JPEG not found \(listed at ImageNet_LT_train.txt:7\)"):
        EncodedFiles(files)[0]


def test_device_decode_only_for_batched_large_images_on_cuda():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert uses_device_decode("batch", "large", cuda)
    assert not uses_device_decode("worker", "large", cuda)
    assert not uses_device_decode("batch", "small", cuda)
    assert not uses_device_decode("batch", "large", cpu)


def test_engine_decodes_encoded_batches_into_the_same_views(tmp_path, monkeypatch):
    """The engine's wiring of device decoding, exercised on the CPU: with decoding moved to the device the
    loader hands over the files' bytes and the views built from them equal those of the worker-decoded
    batched path (same decoder on a CPU, same per-sample draws)."""
    from ltbench.train import engine
    from ltbench.data import device_decode
    from ltbench.data.imagenet_tree import TreeSpec, write_tree
    from ltbench.recipe import resolve_run_config

    write_tree(tmp_path, TreeSpec(num_classes=3, train_images=6, val_per_class=0, test_per_class=1, scale=0.15),
               say=lambda msg: None)
    config = resolve_run_config({"data": {"name": "imagenet_lt", "root": str(tmp_path), "num_classes": 3},
                                 "backbone": {"name": "resnet8"}, "method": {"name": "la", "views": ["default", "sim"]},
                                 "train": {"augment_on": "batch"}, "optim": {"batch_size": 4}}, seed=0, where="t")
    cpu = torch.device("cpu")
    views = {}
    for decode_here in (False, True):
        monkeypatch.setattr(device_decode, "uses_device_decode", lambda *args: decode_here)
        run = engine.build_run(config)
        loader = engine.make_loader(run, 0, 0, cpu)
        assert run.decode_on_device is decode_here
        keys = loader.samples.train_keys(engine.epoch_batches(len(run.data.train), 4, 0, 0), 0, 0)[:1]
        (batch, labels), = list(loader.run(keys))
        if decode_here:
            assert all(b.ndim == 1 for b in batch[0])  # bytes, not pixels
        views[decode_here] = engine.augment_on_device(run, batch[0], keys[0], cpu)
    assert len(views[True]) == 2 and views[True][0].shape == (4, 3, 224, 224)
    for a, b in zip(views[False], views[True]):
        assert torch.equal(a, b)
