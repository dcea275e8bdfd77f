"""Decoding on the training device (ltbench/data/device_decode.py): the CPU fallback and the routing are
tested here; nvJPEG itself in tests/test_gpu.py (``pytest -m gpu``)."""

import threading
import warnings

import numpy as np
import pytest
import torch
from torchvision.io import encode_jpeg, encode_png

from ltbench.data.device_decode import (DecodeStats, EncodedFiles, decode_batch, decode_cpu, is_jpeg,
                                        uses_device_decode)
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


def jpeg_bytes(n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [encode_jpeg(torch.randint(0, 256, (3, 16 + i, 24 - i), dtype=torch.uint8, generator=gen), quality=90)
            for i in range(n)]


class RefusingDecoder:
    """Stands for nvJPEG on a CPU: decodes like the CPU (flipped, so the test sees who decoded what) and
    raises, like torchvision does, on any call that contains one of the ``refused`` files."""

    def __init__(self, refused: list[torch.Tensor] = (), refuse_all: bool = False, mark: bool = True):
        self.refused, self.refuse_all, self.mark, self.calls = list(refused), refuse_all, mark, []

    def __call__(self, jpegs):
        assert jpegs, "the device decoder is never called with no file"
        self.calls.append(len(jpegs))
        if self.refuse_all or any(torch.equal(j, r) for j in jpegs for r in self.refused if len(j) == len(r)):
            raise RuntimeError("Error while decoding JPEG images: Unknown chroma subsampling")
        return [decode_cpu(j).flip(-1) if self.mark else decode_cpu(j) for j in jpegs]


@pytest.fixture
def fresh_warnings():
    from ltbench.data import device_decode

    device_decode._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
    device_decode._warned.clear()


def test_only_the_refused_files_go_to_the_cpu(fresh_warnings):
    """One file nvJPEG refuses no longer sends the batch to the CPU: the batch is split in halves down to
    that file (1 + 2 log2(16) = 9 calls for one bad file among 16), counted, with one warning."""
    batch = jpeg_bytes(16)
    decoder = RefusingDecoder([batch[5]])
    stats = DecodeStats()
    out = decode_batch(batch, torch.device("cpu"), jpeg_decoder=decoder, stats=stats)
    for i, (data, image) in enumerate(zip(batch, out)):
        assert torch.equal(image, decode_cpu(data) if i == 5 else decode_cpu(data).flip(-1)), i
    assert decoder.calls == [16, 8, 4, 4, 2, 1, 1, 2, 8]  # depth first: halves with the bad file split on
    assert (stats.fallbacks, stats.not_jpeg, stats.device_calls, stats.device_off) == (1, 0, 9, False)
    two_bad = RefusingDecoder([batch[0], batch[15]])
    out = decode_batch(batch, torch.device("cpu"), jpeg_decoder=two_bad, stats=stats)
    assert [torch.equal(image, decode_cpu(data)) for data, image in zip(batch, out)] == [i in (0, 15) for i in range(16)]
    assert stats.fallbacks == 3 and len(two_bad.calls) == 15
    assert stats.take_epoch() == {"decode_fallbacks": 3, "decode_not_jpeg": 0}
    assert stats.take_epoch() == {"decode_fallbacks": 0, "decode_not_jpeg": 0}  # per epoch
    messages = [str(w.message) for w in fresh_warnings if "refused" in str(w.message)]
    assert len(messages) == 1 and "Unknown chroma subsampling" in messages[0] and "decode_fallbacks" in messages[0]


def test_a_decoder_that_refuses_every_file_is_given_up(fresh_warnings, tmp_path):
    """A batch refused file by file means the decoder is broken (an old driver), not the files: the CPU
    decodes everything from then on, without asking the device again; every such JPEG is a fallback."""
    files = write_files(tmp_path, ["jpeg", "png", "jpeg", "jpeg"])
    batch = [EncodedFiles(files)[i][0] for i in range(4)]
    decoder, stats = RefusingDecoder(refuse_all=True), DecodeStats()
    for _ in range(2):
        out = decode_batch(batch, torch.device("cpu"), jpeg_decoder=decoder, stats=stats)
        assert all(torch.equal(image, files[i][0]) for i, image in enumerate(out))
    assert decoder.calls == [3, 1, 2, 1, 1]  # the first batch only
    assert stats.device_off and stats.take_epoch() == {"decode_fallbacks": 6, "decode_not_jpeg": 2}
    assert any("rest of this run" in str(w.message) for w in fresh_warnings)


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
    from scripts.imagenet_tree import TreeSpec, write_tree
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


def seeded_loader(batches: list[list[torch.Tensor]], events: list):
    """Stands for the loader without workers: loading a batch reseeds torch's CPU generator, as
    SeededSamples does per sample, so a lookahead would change the random state a step sees."""
    for k, encoded in enumerate(batches):
        torch.random.default_generator.manual_seed(100 + k)
        events.append(("load", k))
        yield [encoded], torch.full((len(encoded),), k)


def consume(batches, events: list) -> list[tuple]:
    """What a training step keeps of each batch: the labels, the decoded images, a CPU random draw."""
    out = []
    for k, (views, labels) in enumerate(batches):
        events.append(("train", k))
        out.append((labels, views[0], torch.rand(4)))
    return out


def test_decode_ahead_hands_over_the_same_batches_and_random_state(tmp_path, monkeypatch):
    """Decoding batch k+1 in a background thread while batch k trains changes nothing the step sees: the
    same images in the same order and the same CPU random state as decoding in the loop. Batch k+1 is
    loaded (in this thread) before batch k is handed over, and decoded in the 'ltbench-decode' thread."""
    from ltbench.data import device_decode

    files = write_files(tmp_path, ["jpeg", "png", "jpeg"])
    batches = [jpeg_bytes(5)[:3], [EncodedFiles(files)[i][0] for i in range(3)], jpeg_bytes(7)[2:7]]
    threads: dict[str, set] = {}
    decoder = RefusingDecoder([batches[2][1]])

    def device_decoder(device):
        return lambda jpegs: threads[mode].add(threading.current_thread().name) or decoder(jpegs)

    monkeypatch.setattr(device_decode, "device_jpeg_decoder", device_decoder)
    cpu, runs = torch.device("cpu"), {}
    for mode in ("in the loop", "ahead, same thread", "ahead, threaded"):
        events, stats, threads[mode] = [], DecodeStats(), set()
        loaded = seeded_loader(batches, events)
        if mode == "in the loop":
            loaded = (([decode_batch(views[0], cpu, stats=stats)], labels) for views, labels in loaded)
        else:
            loaded = device_decode.decode_ahead(loaded, cpu, stats, threaded=mode.endswith("threaded"))
        runs[mode] = consume(loaded, events), events, stats.take_epoch()
    reference, events, counts = runs["in the loop"]
    assert counts == {"decode_fallbacks": 1, "decode_not_jpeg": 1}
    for mode in ("ahead, same thread", "ahead, threaded"):
        got, got_events, got_counts = runs[mode]
        assert got_counts == counts
        for (labels, images, draw), (ref_labels, ref_images, ref_draw) in zip(got, reference, strict=True):
            assert torch.equal(labels, ref_labels) and torch.equal(draw, ref_draw), mode
            assert len(images) == len(ref_images) and all(torch.equal(a, b) for a, b in zip(images, ref_images))
        assert got_events.index(("load", 1)) < got_events.index(("train", 0)), mode
    assert threads == {"in the loop": {"MainThread"}, "ahead, same thread": {"MainThread"},
                       "ahead, threaded": {"ltbench-decode_0"}}


def test_a_decode_error_ahead_surfaces_at_its_batch(tmp_path):
    """A file no decoder can read fails where its batch is handed over, in the training thread, not in the
    background; the batches before it are handed over first."""
    from ltbench.data.device_decode import decode_ahead

    broken = torch.tensor([0xFF, 0xD8, 0xFF, 0, 1, 2, 3], dtype=torch.uint8)  # JPEG magic, then nothing
    batches = [jpeg_bytes(2), [broken], jpeg_bytes(3)]
    seen = []
    with pytest.raises(RuntimeError):
        for views, labels in decode_ahead(seeded_loader(batches, []), torch.device("cpu")):
            seen.append(int(labels[0]))
    assert seen == [0]


def test_a_run_with_refused_files_trains_as_the_worker_decoded_run_and_logs_them(tmp_path, monkeypatch):
    """End to end on the CPU, standing for nvJPEG with a decoder that refuses two of the six training files:
    decoding on the device (ahead, in the background thread, with per-file fallback) trains bit for bit as
    the worker-decoded batched run does, and each epoch's log row counts the two refused files."""
    from ltbench.data import device_decode
    from scripts.imagenet_tree import TreeSpec, write_tree
    from ltbench.recipe import resolve_run_config
    from ltbench.results import store
    from ltbench.train import engine

    write_tree(tmp_path / "tree", TreeSpec(num_classes=3, train_images=6, val_per_class=0, test_per_class=1,
                                           scale=0.15), say=lambda msg: None)
    config = resolve_run_config({"data": {"name": "imagenet_lt", "root": str(tmp_path / "tree"), "num_classes": 3},
                                 "backbone": {"name": "resnet8"}, "method": {"name": "ce"},
                                 "train": {"augment_on": "batch", "progress": False},
                                 "optim": {"batch_size": 4, "epochs": 1, "warmup_epochs": 0}}, seed=0, where="t")
    train_files = engine.load_data(config).train
    refused = [EncodedFiles(train_files)[i][0] for i in (1, 4)]
    rows, results = {}, {}
    for on_device in (False, True):
        monkeypatch.setattr(device_decode, "uses_device_decode", lambda *args: on_device)
        monkeypatch.setattr(device_decode, "device_jpeg_decoder", lambda device: RefusingDecoder(refused, mark=False))
        run_dir = tmp_path / f"run-{on_device}"
        run_dir.mkdir()
        outcome = engine.train({"recipe": "t", "run_id": "x", "config": config}, run_dir, say=lambda msg: None)
        rows[on_device] = store.read_jsonl(run_dir / store.LOG)
        results[on_device] = outcome.metrics
    assert [r["decode_fallbacks"] for r in rows[True]] == [2]
    assert [r["decode_not_jpeg"] for r in rows[True]] == [0]
    timing = ("seconds", "images_per_s", "decode_fallbacks", "decode_not_jpeg")
    strip = lambda r: {k: v for k, v in r.items() if k not in timing}  # noqa: E731
    assert [strip(r) for r in rows[True]] == [strip(r) for r in rows[False]]
    assert "decode_fallbacks" not in rows[False][0]
    assert results[True]["all"] == results[False]["all"]


def test_the_stream_that_reads_decoded_images_is_the_one_that_waited_for_them(monkeypatch):
    """The feeder takes a decoded batch inside its side stream's context, so ``_hand_over`` makes the side
    stream (which builds the views from the images) wait for the decode and marks the images as used there;
    taken on the training stream, the views could read images still being decoded, and the allocator could
    reuse their memory while the views read it. Streams and images are recording fakes (no CUDA here)."""
    import contextlib
    from concurrent.futures import Future

    from ltbench.data import device_decode
    from ltbench.train import feed

    class Stream:
        def __init__(self, name):
            self.name, self.waited = name, []

        def wait_event(self, event):
            self.waited.append(event)

    class Image:
        def __init__(self):
            self.used_on = []

        def record_stream(self, stream):
            self.used_on.append(stream.name)

    training, side = Stream("training"), Stream("side")
    current = [training]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[0])

    class Side:
        @contextlib.contextmanager
        def issuing(self):
            current[0] = side
            try:
                yield
            finally:
                current[0] = training

        def handoff(self):
            return "views ready"

        def receive(self, event, tensors):
            current[0].wait_event(event)

    images, readers = [Image(), Image()], []

    def decoded():
        future = Future()
        future.set_result((images, "decoded"))
        yield device_decode._hand_over((future, [], torch.tensor([0, 1]), torch.random.get_rng_state()),
                                       torch.device("cpu"))

    def build_views(first_view, keys):
        readers.append(current[0].name)  # the stream the views' kernels would be queued on
        return [torch.zeros(2, 1)]

    feeder = feed.Feeder(zip(decoded(), [[("train", 0, 1), ("train", 1, 2)]]), torch.device("cpu"), build_views,
                         decode=True)
    feeder.side = Side()
    feeder.take(feeder.prepare())
    assert readers == ["side"]
    assert side.waited == ["decoded"] and training.waited == ["views ready"]
    assert [im.used_on for im in images] == [["side"], ["side"]]
