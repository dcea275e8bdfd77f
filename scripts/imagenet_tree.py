"""An ImageNet-LT tree of generated JPEGs at the published list paths, for timing and smoke tests only.

Why: the headline command (``ltbench run recipes/imagenet_lt.yaml``) and ``benchmarks/gpu_throughput.py``
need ImageNet-size JPEGs under the published split-list names, on machines without ImageNet (CI, a fresh
GPU node). The images are random colour fields (smooth blobs plus noise), the class names are made-up
wnid-like folder names (``n9xxxxxxx``, no real synset starts with 9), and nothing trained on them means
anything: their accuracies are chance and must never be reported as results.

What matches the real benchmark (docs/protocols.md §2, §6):
- the list files ``ImageNet_LT_{train,val,test}.txt`` and the shifted ``ImageNet_LT_{forward,backward}{2,5,10,25,50}.txt``,
  one ``<relative path> <label>`` per line; train and val images under ``train/<wnid>/``, test (the
  ILSVRC-2012 validation images) under ``val/<wnid>/``;
- at full scale the line counts: 115,846 train (max 1,280, min 5 per class), 20,000 val (20 per class),
  50,000 test (50 per class), and the shifted lists by LADE's construction (forward50 = 12,058 lines);
- labels are not in frequency order (as in the published lists), so shifted lists rank classes by count;
- image sizes drawn from the common ILSVRC sizes (500x375, 375x500, 500x333, ...), baseline JPEG.
A subset (``train_images``, ``test_per_class``, ``num_classes``) scales the training profile down,
keeping at least one image per class; such a tree needs ``data.num_classes`` when it has fewer than 1000 classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ltbench.data.shift import shifted_test_indices

FULL_TRAIN, FULL_MAX, FULL_MIN = 115_846, 1280, 5
SHIFT_RHOS = (2, 5, 10, 25, 50)
# (width, height) of frequent ILSVRC-2012 image sizes, with rough weights
IMAGE_SIZES = ((500, 375), (375, 500), (500, 333), (333, 500), (500, 400), (640, 480))
SIZE_WEIGHTS = (0.45, 0.15, 0.15, 0.05, 0.1, 0.1)


@dataclass
class TreeSpec:
    num_classes: int = 1000
    train_images: int = FULL_TRAIN  # the profile is scaled to about this many (at least one per class)
    val_per_class: int = 20
    test_per_class: int = 50
    seed: int = 0
    quality: int = 90
    scale: float = 1.0  # image side multiplier (1.0: ImageNet size; smaller only for quick smoke tests)


def train_profile(num_classes: int, total: int) -> np.ndarray:
    """Per-rank training counts from FULL_MAX down to FULL_MIN, ``MIN * (MAX/MIN) ** ((1 - x) ** q)`` at
    rank fraction x, with q chosen so that the full-scale sum is 115,846 (ImageNet-LT's) for 1000 classes;
    scaled to ``total`` with at least one image per class."""
    x = np.arange(num_classes, dtype=np.float64) / max(1, num_classes - 1)

    def counts(q: float) -> np.ndarray:
        return np.round(FULL_MIN * (FULL_MAX / FULL_MIN) ** ((1 - x) ** q))

    low, high = 0.1, 50.0
    target = FULL_TRAIN * num_classes / 1000
    for _ in range(60):  # bisection: the sum falls as q grows
        mid = (low + high) / 2
        low, high = (mid, high) if counts(mid).sum() > target else (low, mid)
    full = counts((low + high) / 2)
    if total >= full.sum():
        return full.astype(np.int64)
    return np.maximum(1, np.round(full * total / full.sum())).astype(np.int64)


def wnid(label: int) -> str:
    return f"n9{label:07d}"


@dataclass
class TreeLists:
    """Every list of the tree: name (train, val, test, forward50, ...) -> (paths, labels)."""

    lists: dict[str, tuple[list[str], np.ndarray]]


def plan_lists(spec: TreeSpec) -> TreeLists:
    """The list contents (no image written): labels are a random permutation of the count ranks."""
    rng = np.random.default_rng(spec.seed)
    k = spec.num_classes
    by_rank = train_profile(k, spec.train_images)
    label_of_rank = rng.permutation(k)
    counts = np.zeros(k, dtype=np.int64)
    counts[label_of_rank] = by_rank
    train = [(f"train/{wnid(c)}/{wnid(c)}_{i}.JPEG", c) for c in range(k) for i in range(counts[c])]
    val = [(f"train/{wnid(c)}/{wnid(c)}_val{i}.JPEG", c) for c in range(k) for i in range(spec.val_per_class)]
    test = [(f"val/{wnid(c)}/ILSVRC2012_val_{c * spec.test_per_class + i + 1:08d}.JPEG", c)
            for c in range(k) for i in range(spec.test_per_class)]
    out = {name: _columns(rows) for name, rows in (("train", train), ("val", val), ("test", test))}
    test_labels = out["test"][1]
    for rho in SHIFT_RHOS:
        for direction in ("forward", "backward"):
            idx = shifted_test_indices(test_labels, counts, rho, direction, method="lade")
            out[f"{direction}{rho}"] = ([out["test"][0][i] for i in idx], test_labels[idx])
    return TreeLists(out)


def _columns(rows: list[tuple[str, int]]) -> tuple[list[str], np.ndarray]:
    return [p for p, _ in rows], np.asarray([c for _, c in rows], dtype=np.int64)


def random_jpeg(rng: np.random.Generator, scale: float = 1.0, quality: int = 90):
    """One JPEG (uint8 byte tensor) of an ILSVRC-like size: smooth random colour blobs plus noise, so it
    compresses like a photograph (tens of KB), not like white noise."""
    import torch
    import torch.nn.functional as F
    from torchvision.io import encode_jpeg

    w, h = IMAGE_SIZES[rng.choice(len(IMAGE_SIZES), p=SIZE_WEIGHTS)]
    w, h = max(8, int(w * scale)), max(8, int(h * scale))
    coarse = torch.from_numpy(rng.random((1, 3, 6, 8), dtype=np.float32))
    field = F.interpolate(coarse, size=(h, w), mode="bicubic", align_corners=False)[0]
    noise = torch.from_numpy(rng.normal(0, 0.04, (3, h, w)).astype(np.float32))
    image = ((field + noise).clamp(0, 1) * 255).to(torch.uint8)
    return encode_jpeg(image, quality=quality)


def write_tree(root: Path, spec: TreeSpec, say=print) -> TreeLists:
    """Write the lists into ``root`` and every listed image under it (each file once, val and test
    images shared by the lists that name them). Returns the lists."""
    root = Path(root)
    plan = plan_lists(spec)
    rng = np.random.default_rng(spec.seed + 1)
    files = sorted({p for paths, _ in plan.lists.values() for p in paths})
    for n, rel in enumerate(files, 1):
        path = root / rel
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(random_jpeg(rng, spec.scale, spec.quality).numpy().tobytes())
        if n % 2000 == 0:
            say(f"  {n}/{len(files)} images")
    for name, (paths, labels) in plan.lists.items():
        lines = "".join(f"{p} {int(c)}\n" for p, c in zip(paths, labels))
        (root / f"ImageNet_LT_{name}.txt").write_text(lines)
    return plan
