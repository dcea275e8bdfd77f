"""CIFAR-10-LT / CIFAR-100-LT: the LDAM-DRW profile tables, the exact subset, and the pickle loader.

The real files cannot be downloaded here, so the loader is tested on small files written in the exact
format (pickled dicts with byte-string keys, uint8 (N, 3072) data), and the subset procedure on label
arrays of the real size.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from ltbench.config import from_dict
from ltbench.data import cifar
from ltbench.data.cifar import CIFAR10LT, CIFAR100LT, CIFARLTConfig, ldam_img_max, lt_counts
from ltbench.data.profile import ldam_subset, subset_hash
from ltbench.evaluation import shot_groups
from ltbench.errors import ConfigError, DataMissingError, LtbenchError
from ltbench.registry import DATASETS

# docs/protocols.md §1
C10_LISTS = {
    10: [5000, 3871, 2997, 2320, 1796, 1391, 1077, 834, 645, 500],
    50: [5000, 3237, 2096, 1357, 878, 568, 368, 238, 154, 100],
    100: [5000, 2997, 1796, 1077, 645, 387, 232, 139, 83, 50],
    200: [5000, 2775, 1540, 854, 474, 263, 146, 81, 45, 25],
}
C10_TOTALS = {10: 20431, 50: 13996, 100: 12406, 200: 11203}
C100_TOTALS = {10: 19573, 50: 12608, 100: 10847, 200: 9502}
C100_GROUPS = {10: (69, 31, 0), 50: (41, 41, 18), 100: (35, 35, 30), 200: (30, 31, 39)}
C100_RHO100 = [
    500, 477, 455, 434, 415, 396, 378, 361, 344, 328, 314, 299, 286, 273, 260, 248, 237, 226, 216, 206,
    197, 188, 179, 171, 163, 156, 149, 142, 135, 129, 123, 118, 112, 107, 102, 98, 93, 89, 85, 81, 77, 74, 70, 67, 64,
    61, 58, 56, 53, 51, 48, 46, 44, 42, 40, 38, 36, 35, 33, 32, 30, 29, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
    15, 15, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5,
]
# LDAM-DRW passes imb_factor as the literal 1/rho on the command line
INV_RHO = {10: 0.1, 50: 0.02, 100: 0.01, 200: 0.005}


def reference_subset(targets, num_classes: int, inv_rho: float, seed: int = 0, imb_type: str = "exp"):
    """The LDAM-DRW construction written out from docs/protocols.md §1 (legacy global RNG)."""
    targets = np.array(targets, dtype=np.int64)
    img_max = len(targets) / num_classes
    if imb_type == "exp":
        per_class = [int(img_max * (inv_rho ** (c / (num_classes - 1.0)))) for c in range(num_classes)]
    else:
        half = num_classes // 2
        per_class = [int(img_max)] * half + [int(img_max * inv_rho)] * half
    np.random.seed(seed)
    chosen = []
    for c in range(num_classes):
        where = np.where(targets == c)[0]
        np.random.shuffle(where)
        chosen.extend(where[: per_class[c]].tolist())
    return np.array(chosen, dtype=np.int64), per_class


def real_size_labels(num_classes: int, seed: int = 1) -> np.ndarray:
    """50,000 labels, balanced and shuffled like the real CIFAR train arrays."""
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), 50000 // num_classes))


# ------------------------------------------------------------------------------------------
# Profile tables


@pytest.mark.parametrize("rho", [10, 50, 100, 200])
def test_cifar10_lt_count_tables(rho):
    img_max = ldam_img_max(real_size_labels(10), 10)
    assert img_max == 5000
    counts = lt_counts(10, img_max, rho)
    assert counts == C10_LISTS[rho]
    assert sum(counts) == C10_TOTALS[rho]


@pytest.mark.parametrize("rho", [10, 50, 100, 200])
def test_cifar100_lt_count_tables_and_shot_groups(rho):
    img_max = ldam_img_max(real_size_labels(100), 100)
    assert img_max == 500
    counts = lt_counts(100, img_max, rho)
    assert sum(counts) == C100_TOTALS[rho]
    assert counts[0] == 500 and counts[-1] == 500 // rho
    groups = shot_groups(counts)
    assert tuple(int((groups == g).sum()) for g in ("many", "medium", "few")) == C100_GROUPS[rho]
    if rho == 100:
        assert counts == C100_RHO100


def test_step_profile():
    assert lt_counts(10, 5000.0, 100, "step") == [5000] * 5 + [50] * 5
    assert lt_counts(100, 500.0, 10, "step") == [500] * 50 + [50] * 50


# ------------------------------------------------------------------------------------------
# The subset: bit-identical to LDAM-DRW's procedure at the real size


@pytest.mark.parametrize("num_classes,rho,seed,imb_type", [
    (10, 100, 0, "exp"), (10, 10, 3, "exp"), (100, 100, 0, "exp"), (100, 200, 1, "exp"), (100, 50, 0, "step"),
])
def test_subset_is_bit_identical_to_ldam_procedure(num_classes, rho, seed, imb_type):
    targets = real_size_labels(num_classes)
    expected, per_class = reference_subset(targets, num_classes, INV_RHO[rho], seed, imb_type)
    counts = lt_counts(num_classes, ldam_img_max(targets, num_classes), rho, imb_type)
    assert counts == per_class
    np.random.seed(12345)
    before = np.random.get_state()
    got = ldam_subset(targets, counts, seed)
    after = np.random.get_state()
    np.testing.assert_array_equal(got, expected)
    assert before[0] == after[0] and np.array_equal(before[1], after[1]) and before[2:] == after[2:]


def test_tile_order_labels_give_ldam_subset_too():
    targets = np.tile(np.arange(10), 5000)
    expected, _ = reference_subset(targets, 10, 0.01, 0)
    np.testing.assert_array_equal(ldam_subset(targets, lt_counts(10, 5000.0, 100), 0), expected)


# ------------------------------------------------------------------------------------------
# Fake files in the exact on-disk format


def _dump(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def _images_encoding_index(n: int, offset: int = 0) -> np.ndarray:
    """uint8 (n, 3072); bytes 0 and 1 hold the index in the full split, so a loaded image names its source."""
    rng = np.random.default_rng(offset + 7)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    idx = np.arange(offset, offset + n)
    data[:, 0], data[:, 1] = idx // 256, idx % 256
    return data


def _index_of(images: torch.Tensor) -> np.ndarray:
    flat = images.reshape(len(images), -1).numpy().astype(np.int64)
    return flat[:, 0] * 256 + flat[:, 1]


def write_fake_cifar10(root, per_class: int = 50, test_per_class: int = 10, seed: int = 0):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    labels = np.random.default_rng(seed).permutation(np.repeat(np.arange(10), per_class))
    per_batch = len(labels) // 5
    for b in range(5):
        lo, hi = b * per_batch, (b + 1) * per_batch
        _dump(folder / f"data_batch_{b + 1}", {
            b"batch_label": f"training batch {b + 1} of 5".encode(),
            b"labels": [int(x) for x in labels[lo:hi]],
            b"data": _images_encoding_index(hi - lo, lo),
            b"filenames": [f"img_{i}.png".encode() for i in range(lo, hi)],
        })
    test_labels = np.random.default_rng(seed + 1).permutation(np.repeat(np.arange(10), test_per_class))
    _dump(folder / "test_batch", {b"batch_label": b"testing batch 1 of 1", b"labels": [int(x) for x in test_labels],
                                  b"data": _images_encoding_index(len(test_labels)), b"filenames": []})
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
    _dump(folder / "batches.meta", {b"num_cases_per_batch": per_batch, b"label_names": names, b"num_vis": 3072})
    return labels, test_labels


def write_fake_cifar100(root, per_class: int = 10, test_per_class: int = 2):
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    labels = np.random.default_rng(5).permutation(np.repeat(np.arange(100), per_class))
    _dump(folder / "train", {b"filenames": [], b"batch_label": b"training batch 1 of 1",
                             b"fine_labels": labels.tolist(), b"coarse_labels": (labels // 5).tolist(),
                             b"data": _images_encoding_index(len(labels))})
    test_labels = np.repeat(np.arange(100), test_per_class)
    _dump(folder / "test", {b"fine_labels": test_labels.tolist(), b"coarse_labels": (test_labels // 5).tolist(),
                            b"data": _images_encoding_index(len(test_labels))})
    _dump(folder / "meta", {b"fine_label_names": [f"class{i:02d}".encode() for i in range(100)],
                            b"coarse_label_names": [f"super{i:02d}".encode() for i in range(20)]})
    return labels, test_labels


def load(builder, **options):
    return builder(from_dict(builder.Config, options, "data")).load()


def test_registered():
    assert DATASETS.get("cifar10_lt") is CIFAR10LT
    assert DATASETS.get("cifar100_lt") is CIFAR100LT


def test_cifar10_loader_on_fake_files(tmp_path):
    labels, test_labels = write_fake_cifar10(tmp_path)
    np.random.seed(99)
    before = np.random.get_state()[1].copy()
    data = load(CIFAR10LT, root=str(tmp_path), imb_factor=10, data_seed=0)
    assert np.array_equal(np.random.get_state()[1], before)  # global RNG not disturbed

    expected, per_class = reference_subset(labels, 10, 0.1, 0)
    assert data.info["img_max"] == 50 and data.info["standard_files"] is False
    assert data.info["counts_profile"] == per_class == [50, 38, 29, 23, 17, 13, 10, 8, 6, 5]
    assert list(data.class_counts) == per_class
    # the images really are those of the LDAM indices, in class order
    np.testing.assert_array_equal(_index_of(data.train.images), expected)
    np.testing.assert_array_equal(data.train_labels, labels[expected])
    assert data.subset_hash == subset_hash(expected)
    # test split: the whole balanced test batch, untouched
    assert len(data.test) == 100 and list(data.test_counts) == [10] * 10
    np.testing.assert_array_equal(data.test_labels, test_labels)
    np.testing.assert_array_equal(_index_of(data.test.images), np.arange(100))
    image, label = data.train[0]
    assert image.dtype == torch.uint8 and image.shape == (3, 32, 32) and label == 0
    # channel-planar layout: the first 1024 bytes are the red plane
    first = int(expected[0])
    raw = _images_encoding_index(100, first // 100 * 100)[first % 100]  # batches of 100
    assert torch.equal(image[0].flatten(), torch.from_numpy(raw[:1024]))
    assert data.class_names[:3] == ["airplane", "automobile", "bird"]
    assert data.image.size == 32 and data.image.channels == 3 and data.image.kind == "small"
    assert data.image.mean == (0.4914, 0.4822, 0.4465) and data.image.std == (0.2023, 0.1994, 0.2010)
    assert data.pipelines == {"default": "standard", "strong": "autoaug_cutout", "sim": "simaug", "eval": "eval"}


def test_cifar10_seed_and_step(tmp_path):
    labels, _ = write_fake_cifar10(tmp_path)
    a = load(CIFAR10LT, root=str(tmp_path), imb_factor=10, data_seed=0)
    b = load(CIFAR10LT, root=str(tmp_path), imb_factor=10, data_seed=1)
    assert a.subset_hash != b.subset_hash and list(a.class_counts) == list(b.class_counts)
    s = load(CIFAR10LT, root=str(tmp_path), imb_factor=10, imb_type="step", data_seed=2)
    expected, per_class = reference_subset(labels, 10, 0.1, 2, "step")
    assert list(s.class_counts) == per_class == [50] * 5 + [5] * 5
    np.testing.assert_array_equal(_index_of(s.train.images), expected)


def test_cifar100_loader_on_fake_files(tmp_path):
    labels, _ = write_fake_cifar100(tmp_path)
    data = load(CIFAR100LT, root=str(tmp_path), imb_factor=10)
    expected, per_class = reference_subset(labels, 100, 0.1, 0)
    assert data.num_classes == 100 and data.info["img_max"] == 10
    assert list(data.class_counts) == per_class and per_class[0] == 10 and per_class[-1] == 1
    np.testing.assert_array_equal(_index_of(data.train.images), expected)
    assert len(data.test) == 200
    assert data.class_names[0] == "class00" and len(data.class_names) == 100


def test_loader_at_real_size_matches_ldam(tmp_path, monkeypatch):
    """The whole loader on 50,000 labels (images stubbed so no 150 MB file is written)."""
    write_fake_cifar100(tmp_path, per_class=1, test_per_class=1)
    targets = real_size_labels(100, seed=4)
    test_targets = np.repeat(np.arange(100), 100)

    def fake_read_split(layout, paths):
        if paths[0].name == "train":  # only the subset is copied out of this read-only view
            return np.broadcast_to(np.zeros((1, 3, 32, 32), np.uint8), (len(targets), 3, 32, 32)), targets
        return np.zeros((len(test_targets), 3, 32, 32), np.uint8), test_targets

    monkeypatch.setattr(cifar, "read_split", fake_read_split)
    data = load(CIFAR100LT, root=str(tmp_path), imb_factor=100)
    expected, per_class = reference_subset(targets, 100, 0.01, 0)
    assert data.info["img_max"] == 500 and data.info["standard_files"] is True
    assert per_class == C100_RHO100 and len(data.train) == 10847
    assert data.subset_hash == subset_hash(expected)
    np.testing.assert_array_equal(data.train_labels, targets[expected])


def test_root_may_be_the_extracted_folder_and_env_search(tmp_path, monkeypatch):
    write_fake_cifar10(tmp_path / "cifar")
    assert len(load(CIFAR10LT, root=str(tmp_path / "cifar" / "cifar-10-batches-py")).train) > 0
    monkeypatch.setenv("LTBENCH_DATA", str(tmp_path))
    data = load(CIFAR10LT)  # found under $LTBENCH_DATA/cifar
    assert data.info["folder"] == str(tmp_path / "cifar" / "cifar-10-batches-py")


def test_missing_data_message_and_no_download_by_default(tmp_path, monkeypatch):
    def no_download(*args, **kwargs):  # pragma: no cover - must not be reached
        raise AssertionError("downloaded without data.download=true")

    monkeypatch.setattr(cifar, "fetch", no_download)
    builder = CIFAR100LT(from_dict(CIFARLTConfig, {"root": str(tmp_path)}, "data"))
    with pytest.raises(DataMissingError) as err:
        builder.check()
    msg = str(err.value)
    assert "\n" not in msg
    for part in ("CIFAR-100", str(tmp_path / "cifar-100-python"), "train,test,meta", "data.download=true",
                 "cifar-100-python.tar.gz", "https://www.cs.toronto.edu/~kriz/cifar.html"):
        assert part in msg, part
    monkeypatch.delenv("LTBENCH_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataMissingError, match="data_batch_1,data_batch_2"):
        CIFAR10LT(CIFARLTConfig()).check()


def test_download_only_when_asked(tmp_path, monkeypatch):
    calls = []

    def fake_fetch(layout, root):
        calls.append((layout.name, root))
        write_fake_cifar10(root)

    monkeypatch.setattr(cifar, "fetch", fake_fetch)
    target = tmp_path / "dl"
    CIFAR10LT(CIFARLTConfig(root=str(target), download=True)).check()
    assert calls == [("cifar10_lt", target)]
    CIFAR10LT(CIFARLTConfig(root=str(target), download=True)).check()  # present now: not fetched again
    assert len(calls) == 1


def test_bad_files_and_config(tmp_path):
    write_fake_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(LtbenchError, match="data_batch_3"):
        load(CIFAR10LT, root=str(tmp_path))
    with pytest.raises(ConfigError, match="imb_factor"):
        from_dict(CIFARLTConfig, {"imb_factor": 0.01}, "data")
    with pytest.raises(ConfigError, match="data.imb_type"):
        from_dict(CIFARLTConfig, {"imb_type": "linear"}, "data")


def test_too_few_images_for_profile(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    write_fake_cifar10(tmp_path)
    # unbalanced file set: class 0 gets fewer images than img_max = len / C asks for
    batch = pickle.loads((folder / "data_batch_1").read_bytes(), encoding="latin1")
    batch[b"labels"] = [1] * len(batch[b"labels"])
    _dump(folder / "data_batch_1", batch)
    with pytest.raises(LtbenchError, match="class 0 has"):
        load(CIFAR10LT, root=str(tmp_path))


def test_check_reads_each_batch_once_per_file_version(tmp_path, monkeypatch):
    """check() runs at every launch and --dry-run: the batches' label counts come from the cache folder once
    read (caches.remembered_for_file), and a batch written again (new size, mtime or inode) is read again."""
    import os

    from ltbench.data import cifar

    write_fake_cifar10(tmp_path, per_class=20, test_per_class=2)
    builder = CIFAR10LT(from_dict(CIFAR10LT.Config, {"root": str(tmp_path), "imb_factor": 2}, "data"))
    builder.check()
    real = cifar.read_split
    monkeypatch.setattr(cifar, "read_split", lambda *a: pytest.fail("a batch was read again"))
    builder.check()
    monkeypatch.setattr(cifar, "read_split", real)
    test_batch = tmp_path / "cifar-10-batches-py" / "test_batch"
    _dump(test_batch, {b"labels": [], b"data": np.zeros((0, 3072), np.uint8)})  # an empty array: bytes() at protocol 2
    os.utime(test_batch, ns=(1, 1))
    with pytest.raises(LtbenchError, match="test_batch: the test set holds no image"):
        builder.check()
