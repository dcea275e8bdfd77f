"""Fashion-MNIST-LT on the real IDX files (Debian's dataset-fashion-mnist), and the IDX reader."""

import gzip
import struct

import numpy as np
import pytest

from ltbench.data.fashion_mnist import DEBIAN_DIR, FashionMNISTLT, FashionMNISTLTConfig, locate
from ltbench.data.idx import read_idx
from ltbench.errors import DataMissingError


def write_idx(path, array: np.ndarray, gz: bool):
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    (gzip.open if gz else open)(path, "wb").write(data)


def test_idx_reader_roundtrip_and_truncation(tmp_path):
    a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "x.gz", a, gz=True)
    write_idx(tmp_path / "y", a, gz=False)
    assert (read_idx(tmp_path / "x.gz") == a).all() and (read_idx(tmp_path / "y") == a).all()
    (tmp_path / "z").write_bytes((tmp_path / "y").read_bytes()[:-3])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "z")


def write_fake_fashion_mnist(root, train_labels: np.ndarray, test_labels: np.ndarray) -> None:
    """The four IDX files in torchvision's layout under ``root``, random images for the given labels (either
    split may be empty: the files are still well formed)."""
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, labels in (("train", train_labels), ("t10k", test_labels)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 255, (len(labels), 28, 28)), gz=False)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", np.asarray(labels), gz=False)


def test_small_fake_copy_in_torchvision_layout(tmp_path):
    write_fake_fashion_mnist(tmp_path, np.repeat(np.arange(10), 30), np.repeat(np.arange(10), 5))
    data = FashionMNISTLT(FashionMNISTLTConfig(imb_factor=10, max_per_class=30, root=str(tmp_path))).load()
    assert data.class_counts.tolist() == [30, 23, 17, 13, 10, 8, 6, 5, 3, 3]
    assert data.train[0][0].shape == (1, 28, 28) and len(data.test) == 50


def test_missing_files_message(tmp_path):
    with pytest.raises(DataMissingError) as info:
        locate(str(tmp_path))
    msg = str(info.value)
    assert str(tmp_path) in msg and "t10k-labels-idx1-ubyte" in msg and "dataset-fashion-mnist" in msg


@pytest.mark.skipif(not __import__("os").path.isdir(DEBIAN_DIR), reason=f"{DEBIAN_DIR} missing (apt-get install dataset-fashion-mnist)")
def test_real_fashion_mnist_lt_profile():
    data = FashionMNISTLT(FashionMNISTLTConfig(imb_factor=100, max_per_class=500)).load()
    assert data.class_counts.tolist() == [500, 299, 179, 107, 64, 38, 23, 13, 8, 5]
    assert data.test_counts.tolist() == [1000] * 10
    full = FashionMNISTLT(FashionMNISTLTConfig(imb_factor=100)).load()
    assert int(full.class_counts.sum()) == 14886
    assert data.subset_hash != full.subset_hash
    # The subset is a function of data_seed only.
    again = FashionMNISTLT(FashionMNISTLTConfig(imb_factor=100, max_per_class=500)).load()
    assert again.subset_hash == data.subset_hash
