"""Write an ImageNet-LT tree of generated JPEGs at the published list paths (for timing and smoke tests).

The images are random colour fields and the class folders made-up names: accuracies on this tree are
chance and are never results (scripts/imagenet_tree.py says what matches the real benchmark).

    python scripts/make_imagenet_lt.py OUT                      # full size: 115,846 + 20,000 + 50,000 JPEGs
    python scripts/make_imagenet_lt.py OUT --classes 32 --train-images 64 --val-per-class 1 --test-per-class 4

then ``ltbench run recipes/imagenet_lt.yaml data.root=OUT`` (a tree with fewer than 1000 classes also
needs ``data.num_classes=<classes>``: the published lists span exactly 1000).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FULL_TRAIN = 115_846  # ImageNet-LT's training images (scripts.imagenet_tree.FULL_TRAIN, checked by a test)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[4:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the image root; the list files ImageNet_LT_{train,val,test,...}.txt "
                                          "are written into it too (data.root=OUT)")
    ap.add_argument("--classes", type=int, default=1000,
                    help="number of classes (default 1000, the benchmark's; fewer also needs data.num_classes)")
    ap.add_argument("--train-images", type=int, default=FULL_TRAIN,
                    help=f"training images, ImageNet-LT's long-tailed profile scaled to about this many "
                         f"(default {FULL_TRAIN:,}, the published count)")
    ap.add_argument("--val-per-class", type=int, default=20, help="validation images per class (default 20, as published)")
    ap.add_argument("--test-per-class", type=int, default=50,
                    help="balanced test images per class (default 50, as published); the shifted test lists "
                         "(forward/backward) are drawn from them")
    ap.add_argument("--seed", type=int, default=0, help="seed of the lists and of the image content (default 0)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="image side multiplier (default 1: ILSVRC's sizes, about 400x350; 0.25 for a quick tree)")
    args = ap.parse_args(argv)
    if args.classes < 2 or args.train_images < 1 or args.test_per_class < 1 or args.val_per_class < 0 \
            or not 0 < args.scale <= 4:
        print("make_imagenet_lt.py: --classes >= 2, --train-images >= 1, --test-per-class >= 1, "
              "--val-per-class >= 0 and 0 < --scale <= 4", file=sys.stderr)
        return 2
    from scripts.imagenet_tree import TreeSpec, write_tree  # lazy: keeps --help free of torch

    spec = TreeSpec(num_classes=args.classes, train_images=args.train_images, val_per_class=args.val_per_class,
                    test_per_class=args.test_per_class, seed=args.seed, scale=args.scale)
    started = time.perf_counter()
    plan = write_tree(args.out, spec)
    sizes = ", ".join(f"{name} {len(paths)}" for name, (paths, _) in plan.lists.items())
    print(f"{args.out}: generated JPEGs (random content, not results); lists: {sizes} "
          f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
