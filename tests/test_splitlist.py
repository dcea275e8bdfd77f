"""ImageNet-LT / Places-LT / iNat 2018 from split lists: a tiny fake ImageNet-LT, errors, the real lists."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torchvision.io import write_jpeg, write_png

from ltbench.config import from_dict
from ltbench.data import transforms
from ltbench.evaluation import shot_groups
from ltbench.data.splitlist import (
    FileImages, INat2018, ImageNetLT, PlacesLT, SplitListConfig, list_counts, read_split_list,
)
from ltbench.errors import ConfigError, DataMissingError, LtbenchError
from ltbench.registry import DATASETS

# torchvision 0.29 deprecates its image codecs (pytest resets the filter splitlist installs)
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")
ROOT = Path(__file__).resolve().parents[1]
SPLITS = Path("/work/shared/data/splits")  # the published lists, when this machine has them
WNIDS = ["n01440764", "n01443537", "n01484850"]
TRAIN_PER_CLASS = [5, 3, 2]


def _image(seed: int, channels: int = 3, h: int = 40, w: int = 52) -> torch.Tensor:
    return torch.randint(0, 256, (channels, h, w), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


@pytest.fixture
def fake_imagenet_lt(tmp_path):
    """root/train/<wnid>/<wnid>_<n>.JPEG, root/val/<wnid>/ILSVRC2012_val_<n>.JPEG and the three lists."""
    root = tmp_path / "imagenet"
    train_lines, val_lines, test_lines = [], [], []
    for label, (wnid, n) in enumerate(zip(WNIDS, TRAIN_PER_CLASS)):
        (root / "train" / wnid).mkdir(parents=True)
        (root / "val" / wnid).mkdir(parents=True)
        for i in range(n):
            rel = f"train/{wnid}/{wnid}_{100 + i}.JPEG"
            write_jpeg(_image(label * 10 + i), str(root / rel), quality=90)
            (val_lines if i == 0 else train_lines).append(f"{rel} {label}")
        for i in range(2):
            rel = f"val/{wnid}/ILSVRC2012_val_{label * 2 + i:08d}.JPEG"
            if label == 2 and i == 1:  # a grayscale PNG behind a .JPEG name: decoded by content, made RGB
                write_png(_image(99, channels=1, h=30, w=20), str(root / rel))
            else:
                write_jpeg(_image(50 + label * 2 + i), str(root / rel))
            test_lines.append(f"{rel} {label}")
    for split, lines in (("train", train_lines), ("val", val_lines), ("test", test_lines)):
        (root / f"ImageNet_LT_{split}.txt").write_text("\n".join(lines) + "\n")
    return root


def config(**options) -> SplitListConfig:
    return from_dict(SplitListConfig, options, "data")


def one_line(exc_info) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg
    return msg


def test_registered():
    assert DATASETS.get("imagenet_lt") is ImageNetLT
    assert DATASETS.get("places_lt") is PlacesLT
    assert DATASETS.get("inat2018") is INat2018


def test_fake_imagenet_lt_loads(fake_imagenet_lt):
    root = fake_imagenet_lt
    builder = ImageNetLT(config(root=str(root), num_classes=3))
    builder.check()
    data = builder.load()
    assert data.num_classes == 3
    assert list(data.class_counts) == [n - 1 for n in TRAIN_PER_CLASS]  # one image per class went to val
    assert list(data.test_counts) == [2, 2, 2]
    assert len(data.train) == 7 and len(data.test) == 6
    image, label = data.train[0]
    assert image.dtype == torch.uint8 and image.shape == (3, 40, 52) and label == 0
    gray, label = data.test[5]  # the grayscale PNG comes out as 3 channels
    assert gray.shape == (3, 30, 20) and label == 2 and torch.equal(gray[0], gray[1])
    assert data.image.size == 224 and data.image.kind == "large" and data.image.mean == (0.485, 0.456, 0.406)
    assert data.pipelines == {"default": "imagenet_train", "strong": "randaugment", "sim": "simaug", "eval": "eval"}
    assert data.info["lists"]["train"]["lines"] == 7 and len(data.subset_hash) == 40
    assert data.class_names == WNIDS
    out = transforms.build("eval", data.image, data.pipelines)(image)
    assert out.shape == (3, 224, 224) and out.dtype == torch.float32


def test_counts_from_lists_alone(fake_imagenet_lt, tmp_path):
    """Without an image root the lists still give counts (ltbench data); opening an image says why it fails."""
    data = ImageNetLT(config(split_dir=str(fake_imagenet_lt), num_classes=3)).load()
    assert list(data.class_counts) == [4, 2, 1]
    with pytest.raises(DataMissingError, match="data.root is not set"):
        data.train[0]
    with pytest.raises(DataMissingError, match="data.root"):
        ImageNetLT(config(split_dir=str(fake_imagenet_lt), num_classes=3)).check()


def test_split_dir_search_and_test_split(fake_imagenet_lt, tmp_path, monkeypatch):
    lists = tmp_path / "splits" / "ImageNet_LT"  # the reference repositories' data/ImageNet_LT/ layout
    lists.mkdir(parents=True)
    for f in fake_imagenet_lt.glob("*.txt"):
        (lists / f.name).write_text(f.read_text())
        f.unlink()
    (lists / "ImageNet_LT_forward50.txt").write_text("val/n01440764/ILSVRC2012_val_00000000.JPEG 0\n")
    monkeypatch.setenv("LTBENCH_SPLITS", str(tmp_path / "splits"))
    data = ImageNetLT(config(root=str(fake_imagenet_lt), num_classes=3, test_split="forward50")).load()
    assert len(data.test) == 1 and data.info["lists"]["forward50"]["file"].endswith("ImageNet_LT_forward50.txt")
    assert ImageNetLT(config(root=str(fake_imagenet_lt), num_classes=3, test_split="val")).load().test_counts.sum() == 3
    with pytest.raises(ConfigError, match="test_split"):
        config(test_split="../etc/passwd")


def test_expected_number_of_classes(fake_imagenet_lt):
    with pytest.raises(LtbenchError) as err:
        ImageNetLT(config(root=str(fake_imagenet_lt))).load()
    msg = one_line(err)
    assert "ImageNet_LT_train.txt" in msg and "3 classes" in msg and "1000" in msg
    # a list whose labels reach 999 has the benchmark's 1000 classes
    train = fake_imagenet_lt / "ImageNet_LT_train.txt"
    train.write_text(train.read_text().replace(" 2\n", " 999\n"))
    with pytest.warns(UserWarning, match="published list has"):
        data = ImageNetLT(config(root=str(fake_imagenet_lt))).load()
    assert data.num_classes == 1000 and data.class_counts[999] == 1 and data.class_counts.sum() == 7


def test_missing_list(tmp_path):
    (tmp_path / "imgs").mkdir()
    with pytest.raises(DataMissingError) as err:
        ImageNetLT(config(root=str(tmp_path / "imgs"))).check()
    msg = one_line(err)
    assert "ImageNet_LT_train.txt" in msg and str(tmp_path / "imgs") in msg
    assert "OLTR" in msg and "classifier-balancing" in msg
    with pytest.raises(DataMissingError, match="iNaturalist18_train.txt"):
        INat2018(config(split_dir=str(tmp_path))).load()


def test_missing_image(fake_imagenet_lt):
    first = fake_imagenet_lt / "train" / WNIDS[0] / f"{WNIDS[0]}_101.JPEG"  # line 1 of the train list
    later = fake_imagenet_lt / "train" / WNIDS[1] / f"{WNIDS[1]}_102.JPEG"  # line 6: past the checked few
    later.unlink()
    builder = ImageNetLT(config(root=str(fake_imagenet_lt), num_classes=3))
    builder.check()  # only the first few images are checked up front
    data = builder.load()
    with pytest.raises(DataMissingError) as err:
        data.train[5]
    assert str(later) in one_line(err) and "ImageNet_LT_train.txt:6" in str(err.value)
    first.unlink()
    with pytest.raises(DataMissingError) as err:
        builder.check()
    assert str(first) in one_line(err) and "ImageNet_LT_train.txt:1" in str(err.value)
    # check_images: false skips the up-front check
    ImageNetLT(config(root=str(fake_imagenet_lt), num_classes=3, check_images=False)).check()


def test_malformed_line(fake_imagenet_lt):
    train = fake_imagenet_lt / "ImageNet_LT_train.txt"
    lines = train.read_text().splitlines()
    lines[3] = "train/n01440764/n01440764_104.JPEG"  # label missing
    train.write_text("\n".join(lines) + "\n")
    with pytest.raises(LtbenchError) as err:
        ImageNetLT(config(root=str(fake_imagenet_lt), num_classes=3)).check()
    assert f"{train}:4: malformed line" in one_line(err)
    lines[3] = "train/n01440764/n01440764_104.JPEG zero"
    train.write_text("\n".join(lines) + "\n")
    with pytest.raises(LtbenchError, match=r"ImageNet_LT_train.txt:4: malformed"):
        read_split_list(train)


def test_label_out_of_range(fake_imagenet_lt):
    test = fake_imagenet_lt / "ImageNet_LT_test.txt"
    lines = test.read_text().splitlines()
    lines[4] = lines[4].rsplit(" ", 1)[0] + " 3"
    test.write_text("\n".join(lines) + "\n")
    with pytest.raises(LtbenchError) as err:
        ImageNetLT(config(root=str(fake_imagenet_lt), num_classes=3)).load()
    assert f"{test}:5: label 3 out of range 0..2" in one_line(err)


def test_corrupt_image(fake_imagenet_lt):
    bad = fake_imagenet_lt / "train" / WNIDS[0] / f"{WNIDS[0]}_101.JPEG"
    bad.write_bytes(b"not an image")
    data = ImageNetLT(config(root=str(fake_imagenet_lt), num_classes=3)).load()
    with pytest.raises(LtbenchError, match="cannot be decoded"):
        data.train[0]


def test_file_images_standalone(fake_imagenet_lt):
    ds = FileImages(fake_imagenet_lt, [f"train/{WNIDS[2]}/{WNIDS[2]}_101.JPEG"], np.array([2]))
    image, label = ds[0]
    assert image.shape == (3, 40, 52) and label == 2


def test_cli_run_without_data_stops_at_once(tmp_path):
    recipe = {
        "results_dir": str(tmp_path / "results"),
        "data": {"name": "imagenet_lt", "root": str(tmp_path / "no-images")},
        "backbone": {"name": "resnet50"},
        "method": {"name": "ce"},
        "optim": {"epochs": 1, "warmup_epochs": 0},
        "train": {"progress": False},
        "seeds": [0],
    }
    path = tmp_path / "imagenet.yaml"
    path.write_text(yaml.safe_dump(recipe))
    env = {k: v for k, v in os.environ.items() if k not in ("LTBENCH_SPLITS", "LTBENCH_DATA")}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "ltbench", "run", str(path)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert err.startswith("ltbench: error: ") and "\n" not in err
    assert "ImageNet_LT_train.txt" in err and "OLTR" in err
    assert time.monotonic() - start < 300  # refused before any image is read: a bound only a hang exceeds
    assert not list((tmp_path / "results").rglob("result.json"))


# ------------------------------------------------------------------------------------------
# The published lists (docs/protocols.md §2), when present on this machine


def _published(name: str) -> Path:
    path = SPLITS / name
    if not path.is_file():
        pytest.skip(f"{path} not present")
    return path


def test_places_lt_train_list_counts_and_groups():
    _published("Places_LT_train.txt")
    counts = list_counts("places_lt", str(SPLITS))
    assert counts.sum() == 62500 and len(counts) == 365 and counts.max() == 4980 and counts.min() == 5
    groups = shot_groups(counts)
    assert [int((groups == g).sum()) for g in ("many", "medium", "few")] == [131, 163, 71]
    test = list_counts("places_lt", str(SPLITS), "test")
    assert test.sum() == 36500 and set(test) == {100}


def test_imagenet_lt_and_inat_test_lists():
    _published("ImageNet_LT_test.txt")
    _published("iNaturalist18_val.txt")
    test = list_counts("imagenet_lt", str(SPLITS), "test")
    assert test.sum() == 50000 and set(test) == {50}
    assert set(list_counts("imagenet_lt", str(SPLITS), "val")) == {20}
    inat = list_counts("inat2018", str(SPLITS), "test")  # 'test' is the iNaturalist18_val.txt list
    assert inat.sum() == 24426 and len(inat) == 8142 and set(inat) == {3}
    lst = read_split_list(SPLITS / "ImageNet_LT_test.txt")
    assert lst.paths[0].startswith("val/n") and lst.paths[0].endswith(".JPEG")


def test_places_lt_loads_from_published_lists():
    _published("Places_LT_train.txt")
    _published("Places_LT_test.txt")
    data = PlacesLT(config(split_dir=str(SPLITS))).load()
    assert data.num_classes == 365 and len(data.train) == 62500 and len(data.test) == 36500
    assert data.info["lists"]["train"]["published_lines"] == 62500
    assert data.class_names[0] == "airfield" and len(data.class_names) == 365
