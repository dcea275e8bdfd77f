"""ltbench's training throughput against a bare loop doing the same work on the same device, side by side.

For each setting, a real ltbench run (``engine.train`` on generated data, in a temporary folder) and a bare
PyTorch loop alternate epoch by epoch in this one process (as in harness_overhead.py), so load from other
processes hits both alike; the first epoch of each is a warm-up and is dropped. Printed: source images per
second of each and their ratio (ltbench / bare; 1.0 = ltbench costs nothing over the bare loop).

Settings (batch 256 unless --quick):
- ``cifar_ce``, ``cifar_la_strong``, ``cifar_bape_la``: ResNet-32 on data written in the exact CIFAR-100
  python-pickle format (random pixels, real file layout, read by the cifar100_lt plugin, rho 100: 10,847
  training images at full size) with CE (crop+flip), LA on the strong view (AutoAugment + Cutout) and BAPE+LA
  with the paper's views (strong for LA, two SimAug views for BAPE); ``cifar_sade``: SADE, whose bare loop runs
  SADE's own three-expert network (the ratio that compares a multi-expert method with its own network).
  The bare loop holds the training images on the device as uint8 and does, per view, a per-sample random
  crop (padding 4) and flip there with tensor ops, then one backbone pass over all views, a linear head's
  CE per view and SGD: the compute limit of the model at that batch (the issue's "bare loop"). With
  ``--compile`` it compiles its model, head and cross-entropy in the same mode as the ltbench side.
- ``imagenet_resnet50``, ``imagenet_resnext50``: ResNet-50 / ResNeXt-50 (32x4d) with CE on an ImageNet-LT
  tree of generated ImageNet-size JPEGs (scripts/imagenet_tree.py; 100 classes, --imagenet-images
  training images) read from disk by ltbench (decode, random resized crop 224, flip, colour jitter). The
  bare loop holds 224x224 uint8 crops on the device (decoding and resizing already done) and flips them:
  again the model's limit, so the ratio says how far loading and augmentation hold the run back.
On a GPU both sides use bf16 autocast and channels_last (``--precision``/``--no-channels-last`` to change).
``--quick`` shrinks everything (a few hundred CIFAR-format images, batch 16; a few small JPEGs and ResNet-8
in place of the ImageNet backbones) so that CI can run the whole script on a CPU in seconds: its figures
say nothing about speed. Data are written to a temporary folder and deleted afterwards.

    python benchmarks/gpu_throughput.py                       # every setting, full size, on the GPU if any
    python benchmarks/gpu_throughput.py --settings cifar_bape_la --workers 12 --augment-on batch
    python benchmarks/gpu_throughput.py --quick --device cpu  # the CI smoke test
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BAPE_LA = {"name": "bape", "alpha_hat": 40.0, "beta_hat": 8.0, "aux": {"name": "la", "tau": 1.0},
           "aux_views": ["strong"], "bape_views": ["sim", "sim"]}
CIFAR_METHODS = {"cifar_ce": {"name": "ce"}, "cifar_la_strong": {"name": "la", "tau": 1.0, "views": ["strong"]},
                 "cifar_bape_la": BAPE_LA, "cifar_sade": {"name": "sade"}}
IMAGENET_BACKBONES = {"imagenet_resnet50": "resnet50", "imagenet_resnext50": "resnext50_32x4d"}
SETTINGS = [*CIFAR_METHODS, *IMAGENET_BACKBONES]


@dataclass
class Sizes:
    cifar_per_class: int  # balanced training images per class in the generated CIFAR-100 files
    cifar_test_per_class: int
    cifar_rho: float
    cifar_batch: int
    imagenet_classes: int
    imagenet_images: int
    imagenet_scale: float  # JPEG side multiplier (1: ImageNet size)
    imagenet_batch: int
    epochs: int


FULL = Sizes(500, 100, 100.0, 256, 100, 3000, 1.0, 256, 4)
QUICK = Sizes(2, 1, 2.0, 16, 4, 8, 0.2, 4, 2)


def write_cifar100(root: Path, per_class: int, test_per_class: int, seed: int = 0) -> Path:
    """CIFAR-100's python-pickle files (train, test, meta) with random pixels, balanced classes."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for name, n in (("train", per_class), ("test", test_per_class)):
        labels = np.tile(np.arange(100), n)
        data = rng.integers(0, 256, (len(labels), 3072), dtype=np.uint8)
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": data, b"fine_labels": labels.tolist()}, f, protocol=2)
    with open(folder / "meta", "wb") as f:
        pickle.dump({b"fine_label_names": [f"class{i}".encode() for i in range(100)]}, f, protocol=2)
    return root


def run_config(setting: str, data_root: Path, sizes: Sizes, args) -> dict:
    from ltbench.recipe import resolve_run_config

    if setting in CIFAR_METHODS:
        data = {"name": "cifar100_lt", "root": str(data_root), "imb_factor": sizes.cifar_rho}
        backbone, method, batch = "resnet32", CIFAR_METHODS[setting], sizes.cifar_batch
    else:
        data = {"name": "imagenet_lt", "root": str(data_root), "num_classes": sizes.imagenet_classes,
                "test_split": "val"}
        backbone = "resnet8" if args.quick else IMAGENET_BACKBONES[setting]
        method, batch = {"name": "ce"}, sizes.imagenet_batch
    train = {"num_workers": args.workers, "precision": args.precision, "channels_last": args.channels_last,
             "progress": False, "threads": args.threads}
    if args.augment_on:
        train["augment_on"] = args.augment_on
    if args.compile != "off":
        train["compile"] = args.compile
    raw = {"data": data, "backbone": {"name": backbone}, "method": method, "train": train,
           "optim": {"lr": 0.1, "batch_size": batch, "epochs": sizes.epochs, "warmup_epochs": 0}}
    return resolve_run_config(raw, seed=0, where=setting)


class BareLoop:
    """The plain loop: training images as uint8 on the device, per-sample crop/flip there, one backbone pass
    over all views, a linear head's CE per view, SGD with the same settings; nothing else."""

    def __init__(self, config: dict, device, views: int, compile_mode: str = "off"):
        import torch
        import torch.nn as nn

        from ltbench.train import engine

        torch.manual_seed(0)
        run = engine.build_run(config)
        self.device, self.views, self.cfg = device, views, run.train
        self.batch, self.large = run.optim.batch_size, run.data.image.kind == "large"
        self.images = self._device_images(run.data.train).to(device)
        self.labels = torch.as_tensor(run.data.train_labels, device=device)
        self.mean = torch.tensor(run.data.image.mean, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(run.data.image.std, device=device).view(1, -1, 1, 1)
        self.model = nn.Sequential(run.backbone, nn.Linear(run.backbone.feature_dim, run.data.num_classes)).to(device)
        if self.cfg.channels_last:
            self.model.to(memory_format=torch.channels_last)
        o = run.optim
        self.opt = torch.optim.SGD(self.model.parameters(), lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay,
                                   fused=True if device.type == "cuda" else None)  # as engine.make_optimizer
        self.compiled_loss = self.loss  # in a compiled mode: model, head and cross-entropy as one compiled function
        if compile_mode != "off":
            from ltbench.train import engine

            backend, options = engine.compile_options(compile_mode)
            self.compiled_loss = torch.compile(self.loss, backend=backend, **options)

    def loss(self, x, y):
        """The model on all views at once, then the cross-entropy of each view's logits."""
        import torch.nn.functional as F

        return sum(F.cross_entropy(z, y) for z in self.model(x).float().split(len(y)))

    def step(self, x, y, dtype=None):
        import torch

        with torch.autocast(self.device.type, dtype=dtype or torch.bfloat16, enabled=self.cfg.precision != "fp32"):
            loss = self.compiled_loss(torch.cat([self.view(x) for _ in range(self.views)]), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss

    def _device_images(self, dataset):
        """CIFAR: the uint8 array as it is. Large images: decoded and cut to 224x224 once, before timing."""
        import torch
        from torchvision.transforms.v2 import functional as TF

        if not self.large:
            return dataset.images
        crops = [TF.center_crop(TF.resize(dataset[i][0], 256, antialias=True), 224) for i in range(len(dataset))]
        return torch.stack(crops)

    def view(self, x):
        """Per-sample random crop (padding 4; none for large images) and flip, then normalisation."""
        import torch
        import torch.nn.functional as F

        n, c, size = len(x), x.shape[1], x.shape[-1]
        if not self.large:
            pad = 4
            x = F.pad(x, (pad, pad, pad, pad))
            top = torch.randint(0, 2 * pad + 1, (n, 1), device=x.device) + torch.arange(size, device=x.device)
            left = torch.randint(0, 2 * pad + 1, (n, 1), device=x.device) + torch.arange(size, device=x.device)
            index_n = torch.arange(n, device=x.device).view(n, 1, 1, 1)
            index_c = torch.arange(c, device=x.device).view(1, c, 1, 1)
            x = x[index_n, index_c, top.view(n, 1, size, 1), left.view(n, 1, 1, size)]
        flip = torch.rand(n, device=x.device) < 0.5
        x = torch.where(flip.view(n, 1, 1, 1), x.flip(-1), x)
        x = (x.float() / 255 - self.mean) / self.std
        return x.contiguous(memory_format=torch.channels_last) if self.cfg.channels_last else x

    def train_epoch(self) -> float:
        import torch

        self.model.train()
        t0 = time.perf_counter()
        order = torch.randperm(len(self.labels), device=self.device)
        dtype = torch.float16 if self.cfg.precision == "fp16" else torch.bfloat16
        loss = None
        for s in range(0, len(order) - 1, self.batch):
            idx = order[s: s + self.batch]
            loss = self.step(self.images[idx], self.labels[idx], dtype)
        if loss is not None:
            loss.item()  # waits for the device
        return time.perf_counter() - t0


def measure(config: dict, bare: BareLoop) -> tuple[list[float], list[float]]:
    """Per-epoch seconds (ltbench, bare), interleaved epoch by epoch, warm-up epochs dropped. An ltbench epoch
    is the time between two of its epoch reports less the bare epoch run in between (so it includes the
    epoch-end checkpoint, as a real run does)."""
    from ltbench.train import engine

    ltbench_s, bare_s, marks = [], [], {"last": None}

    def on_report(message: str) -> None:
        if not message.startswith("epoch "):
            return
        if marks["last"] is not None:
            ltbench_s.append(time.perf_counter() - marks["last"])
        bare_s.append(bare.train_epoch())
        marks["last"] = time.perf_counter()

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ltbench-gpu-") as tmp:
        engine.train({"config": config, "run_id": "gpu-throughput", "recipe": "bench"}, Path(tmp), say=on_report)
    if not ltbench_s:  # one epoch only: it is its own warm-up, reported as measured
        ltbench_s = [time.perf_counter() - started - sum(bare_s)]
    return ltbench_s, bare_s[1:] or bare_s


def views_of(config: dict) -> int:
    method = config["method"]
    if method["name"] == "bape":
        return len(method.get("aux_views") or [None]) + len(method.get("bape_views") or [])
    return len(method.get("views") or [None])


def prepare_data(settings: list[str], sizes: Sizes, tmp: Path) -> dict[str, Path]:
    from scripts.imagenet_tree import TreeSpec, write_tree

    roots = {}
    if any(s in CIFAR_METHODS for s in settings):
        roots["cifar"] = write_cifar100(tmp / "cifar", sizes.cifar_per_class, sizes.cifar_test_per_class)
    if any(s in IMAGENET_BACKBONES for s in settings):
        spec = TreeSpec(num_classes=sizes.imagenet_classes, train_images=sizes.imagenet_images, val_per_class=2,
                        test_per_class=1, scale=sizes.imagenet_scale)
        write_tree(tmp / "imagenet", spec, say=lambda msg: None)
        roots["imagenet"] = tmp / "imagenet"
    return roots


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", nargs="+", choices=SETTINGS, default=SETTINGS)
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke test; figures mean nothing)")
    ap.add_argument("--workers", type=int, default=None, help="train.num_workers (default: cores - 1, at most 12)")
    ap.add_argument("--augment-on", choices=["worker", "batch"], default=None, help="train.augment_on (default: the recipe default)")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default=None, help="default: bf16 on GPU, fp32 on CPU")
    ap.add_argument("--no-channels-last", dest="channels_last", action="store_false", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's; 1 with --quick)")
    ap.add_argument("--epochs", type=int, default=None, help="epochs per side (the first is a warm-up)")
    ap.add_argument("--imagenet-images", type=int, default=None, help="training JPEGs of the ImageNet settings")
    ap.add_argument("--compile", choices=["off", "inductor", "reduce-overhead"], default="off",
                    help="train.compile of the ltbench side; the bare loop compiles its model, head and loss "
                         "in the same mode")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch initialises CUDA: the engine picks the CPU
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_throughput.py: --device cuda, but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sizes = QUICK if args.quick else FULL
    sizes = Sizes(**{**sizes.__dict__, **({"epochs": args.epochs} if args.epochs else {}),
                     **({"imagenet_images": args.imagenet_images} if args.imagenet_images else {})})
    gpu = device.type == "cuda"
    args.precision = args.precision or ("bf16" if gpu else "fp32")
    args.channels_last = gpu if args.channels_last is None else args.channels_last
    if args.threads is None and args.quick:
        args.threads = 1
    if args.threads:
        torch.set_num_threads(args.threads)  # the bare loop's; ltbench's run sets its own from train.threads
    if args.workers is None:
        args.workers = 0 if args.quick else min(12, max(0, (os.cpu_count() or 1) - 1))
    name = torch.cuda.get_device_name(device) if gpu else "CPU"
    print(f"device {device} ({name}), {os.cpu_count()} CPU cores, torch threads {torch.get_num_threads()}, "
          f"precision {args.precision}, channels_last {args.channels_last}, workers {args.workers}, "
          f"augment_on {args.augment_on or 'default'}, compile {args.compile}, epochs {sizes.epochs} (first dropped)"
          + (" [--quick: tiny sizes, the figures mean nothing]" if args.quick else ""), flush=True)
    print(f"{'setting':<20} {'backbone':<16} {'views':>5} {'images':>7} {'ltbench img/s':>14} {'bare img/s':>11} "
          f"{'ratio':>6}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ltbench-gpu-data-") as tmp:
        roots = prepare_data(args.settings, sizes, Path(tmp))
        for setting in args.settings:
            root = roots["cifar" if setting in CIFAR_METHODS else "imagenet"]
            config = run_config(setting, root, sizes, args)
            bare = BareLoop(config, device, views_of(config), args.compile)
            ltbench_s, bare_s = measure(config, bare)
            n = len(bare.labels)
            mine, theirs = n / statistics.median(ltbench_s), n / statistics.median(bare_s)
            print(f"{setting:<20} {config['backbone']['name']:<16} {views_of(config):>5} {n:>7} {mine:>14.1f} {theirs:>11.1f} {mine / theirs:>6.2f}"
                  f"  (median of {len(ltbench_s)} and {len(bare_s)} epoch(s))", flush=True)
            rows.append({"setting": setting, "backbone": config["backbone"]["name"], "views": views_of(config),
                         "images": n, "ltbench_images_per_s": mine, "bare_images_per_s": theirs,
                         "ratio": mine / theirs, "ltbench_epochs": len(ltbench_s), "bare_epochs": len(bare_s)})
    if args.json:
        import json

        args.json.write_text(json.dumps({"device": name, "torch": torch.__version__, "cuda": torch.version.cuda,
                                         "precision": args.precision, "channels_last": args.channels_last,
                                         "workers": args.workers, "augment_on": args.augment_on,
                                         "compile": args.compile, "rows": rows}, indent=1))
    print("ratio = ltbench source images/s over the bare loop's (same model, batch, precision and device); "
          "the bare loop keeps its data on the device, so it is the model's limit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
