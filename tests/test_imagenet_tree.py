"""The generated ImageNet-LT tree (scripts/imagenet_tree.py): the published list sizes at full scale,
and a small tree that the ImageNet-LT dataset reads like the real one (lists, images, shifted lists)."""

import numpy as np

from scripts.imagenet_tree import TreeSpec, plan_lists, train_profile, write_tree
from ltbench.data.splitlist import IMAGENET_LT, ImageNetLT, SplitListConfig


def test_full_scale_lists_have_the_published_sizes():
    plan = plan_lists(TreeSpec()).lists
    for split, lines in IMAGENET_LT.known_lines.items():
        assert len(plan[split][0]) == lines, split
    counts = np.bincount(plan["train"][1], minlength=1000)
    assert counts.max() == 1280 and counts.min() == 5
    assert not np.all(np.diff(counts) <= 0)  # labels are not in frequency order, as in the published list
    assert set(plan["forward50"][0]) <= set(plan["test"][0])
    forward = np.bincount(plan["forward50"][1], minlength=1000)
    assert forward[np.argmax(counts)] == 50 and forward[np.argmin(counts)] == 1  # head classes stay, tail shrinks


def test_subset_profile_keeps_one_image_per_class():
    counts = train_profile(1000, 3000)
    assert counts.min() == 1 and 3000 <= counts.sum() <= 3600 and counts.max() == 33


def test_small_tree_loads_as_imagenet_lt(tmp_path):
    spec = TreeSpec(num_classes=6, train_images=12, val_per_class=1, test_per_class=2, scale=0.1)
    write_tree(tmp_path, spec, say=lambda msg: None)
    builder = ImageNetLT(SplitListConfig(root=str(tmp_path), num_classes=6))
    builder.check()
    data = builder.load()
    assert data.num_classes == 6 and len(data.test) == 12 and data.class_names[0] == "n90000000"
    image, label = data.train[0]
    assert image.dtype.is_floating_point is False and image.shape[0] == 3 and image.shape[1] >= 8
    shifted, labels = builder.test_set("forward50", data)
    assert len(shifted) == len(labels) and 0 < len(labels) < len(data.test)


def test_the_generator_script_helps_without_torch_and_agrees_on_the_full_size():
    """Issue 40: ``scripts/make_imagenet_lt.py --help`` answers where torch cannot be imported, names every
    option's default, and its full training size is the tree module's."""
    import runpy
    import subprocess
    import sys
    from pathlib import Path

    from scripts.imagenet_tree import FULL_TRAIN

    script = Path(__file__).resolve().parents[1] / "scripts" / "make_imagenet_lt.py"
    out = subprocess.run([sys.executable, "-c", "import sys, runpy; sys.modules['torch'] = None; "
                          f"sys.argv = ['make_imagenet_lt.py', '--help']; runpy.run_path({str(script)!r}, run_name='__main__')"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for option in ("--classes", "--train-images", "--val-per-class", "--test-per-class", "--seed", "--scale"):
        assert option in out.stdout
    assert runpy.run_path(str(script))["FULL_TRAIN"] == FULL_TRAIN
