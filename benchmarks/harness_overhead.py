"""ltbench's training and evaluation throughput against a bare PyTorch loop doing the same work.

Same data (the dataset plugin's tensors), same model (the registered backbone + a linear head, same
initialisation), same batch size, same per-sample augmentation objects, same SGD with the same
per-step learning rate, same torch threads and the same number of DataLoader workers. What differs
is only the harness: per-sample seeding, the shared loader, the method interface, bookkeeping,
logging, the progress bar (when stderr is a terminal) and the epoch-end checkpoint.

The two are interleaved epoch by epoch in this one process: ``engine.train`` runs a real run (in a
temporary directory) and, each time it reports an epoch, this script runs one bare epoch before
handing control back, so load from other processes hits both alike. An ltbench epoch is the time
between two reports minus the bare epoch run in between (so it includes the checkpoint save and log
write of the previous epoch); the first epoch of each is a warm-up and is dropped. Evaluation:
``engine.evaluate`` (main test set through the run's loader, metrics by shot group) against a bare
loop over the same test images (eval transform, forward in batches of 512, accuracy), alternated.

Settings: ``resnet8_fmnist`` is the quickstart's real data (Fashion-MNIST-LT, rho 100, n_max 500:
1,236 training images, 10,000 test images) with ResNet-8, batch 64, crop+flip; ``resnet32_cifar`` is
synthetic CIFAR-shaped data (3x32x32 uint8, 10 classes, ltbench's synthetic_lt generator: the pixel
values do not matter for speed) with ResNet-32, batch 128, crop+flip.

    .venv/bin/python benchmarks/harness_overhead.py [--settings resnet8_fmnist resnet32_cifar]
        [--epochs 6] [--eval-rounds 5] [--threads 2] [--workers 0]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ltbench.train import checkpoint, engine
from ltbench.data import transforms
from ltbench.recipe import resolve_run_config

SETTINGS = {
    "resnet8_fmnist": {
        "data": {"name": "fashion_mnist_lt", "imb_factor": 100, "max_per_class": 500},
        "backbone": {"name": "resnet8"},
        "optim": {"lr": 0.1, "batch_size": 64, "warmup_epochs": 0, "weight_decay": 5.0e-4},
    },
    "resnet32_cifar": {
        "data": {"name": "synthetic_lt", "num_classes": 10, "imb_factor": 10, "max_per_class": 150,
                 "test_per_class": 100, "image_size": 32, "channels": 3},
        "backbone": {"name": "resnet32"},
        "optim": {"lr": 0.1, "batch_size": 128, "warmup_epochs": 0, "weight_decay": 2.0e-4},
    },
}


def run_config(name: str, epochs: int, threads: int, workers: int) -> dict:
    raw = dict(SETTINGS[name], method={"name": "ce"})
    raw["optim"] = dict(raw["optim"], epochs=epochs, schedule="cosine")
    raw["train"] = {"threads": threads, "num_workers": workers}
    return resolve_run_config(raw, seed=0, where=name)


class BareLoop:
    """The plain PyTorch loop: a shuffled index order, per-sample transform, forward, CE, SGD."""

    def __init__(self, config: dict, workers: int):
        torch.manual_seed(0)
        run = engine.build_run(config)  # only for the backbone and data the harness would use
        self.data, o = run.data, run.optim
        self.model = nn.Sequential(run.backbone, nn.Linear(run.backbone.feature_dim, run.data.num_classes))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=o.lr, momentum=o.momentum, nesterov=o.nesterov,
                                   weight_decay=o.weight_decay)
        self.lr, self.epochs, self.batch = o.lr, o.epochs, o.batch_size
        self.train_tf = transforms.build("default", run.data.image, run.data.pipelines)
        self.eval_tf = transforms.build("eval", run.data.image, run.data.pipelines)
        self.workers, self.iteration = workers, 0
        self.train_loader = self._loader(self.data.train, self.train_tf, self.batch, True)
        self.test_loader = self._loader(self.data.test, self.eval_tf, 512, False)

    def _loader(self, dataset, tf, batch: int, shuffle: bool):
        if not self.workers:
            return None
        return torch.utils.data.DataLoader(Transformed(dataset, tf), batch_size=batch, shuffle=shuffle,
                                           num_workers=self.workers, persistent_workers=True)

    def batches(self, dataset, tf, batch: int, shuffle: bool, loader):
        if loader is not None:
            yield from loader
            return
        order = torch.randperm(len(dataset)) if shuffle else torch.arange(len(dataset))
        for s in range(0, len(order), batch):
            items = [dataset[int(i)] for i in order[s : s + batch]]
            yield torch.stack([tf(x) for x, _ in items]), torch.as_tensor([y for _, y in items])

    def train_epoch(self) -> float:
        self.model.train()
        total = self.epochs * math.ceil(len(self.data.train) / self.batch)
        t0 = time.perf_counter()
        for x, y in self.batches(self.data.train, self.train_tf, self.batch, True, self.train_loader):
            for g in self.opt.param_groups:
                g["lr"] = self.lr * 0.5 * (1 + math.cos(math.pi * min(self.iteration / total, 1.0)))
            loss = F.cross_entropy(self.model(x), y)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            loss.item()
            self.iteration += 1
        return time.perf_counter() - t0

    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        t0 = time.perf_counter()
        preds = [self.model(x).argmax(1) for x, _ in self.batches(self.data.test, self.eval_tf, 512, False,
                                                                   self.test_loader)]
        float((torch.cat(preds).numpy() == self.data.test_labels).mean())
        return time.perf_counter() - t0


class Transformed(torch.utils.data.Dataset):
    def __init__(self, base, tf):
        self.base, self.tf = base, tf

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        x, y = self.base[i]
        return self.tf(x), y


def measure_training(config: dict, bare: BareLoop) -> tuple[list[float], list[float]]:
    """Per-epoch seconds (ltbench, bare), interleaved epoch by epoch, warm-up epochs dropped."""
    ltbench_s, bare_s = [], []
    marks = {"last": None}

    def on_epoch_report(message: str) -> None:
        if not message.startswith("epoch "):
            return
        now = time.perf_counter()
        if marks["last"] is not None:
            ltbench_s.append(now - marks["last"])
        bare_s.append(bare.train_epoch())
        marks["last"] = time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="ltbench-overhead-") as tmp:
        spec = {"config": config, "run_id": "harness-overhead", "recipe": "bench"}
        engine.train(spec, Path(tmp), say=on_epoch_report)
    return ltbench_s, bare_s[1:]


def measure_evaluation(config: dict, bare: BareLoop, rounds: int, workers: int) -> tuple[list[float], list[float]]:
    torch.manual_seed(0)
    run = engine.build_run(config)
    device = torch.device("cpu")
    run.loader = engine.make_loader(run, 0, workers, device)
    ltbench_s, bare_s = [], []
    for r in range(rounds + 1):  # round 0 warms both up
        for which in ("ltbench", "bare") if r % 2 == 0 else ("bare", "ltbench"):
            t0 = time.perf_counter()
            if which == "ltbench":
                engine.evaluate(run, device)
                seconds = time.perf_counter() - t0
            else:
                seconds = bare.evaluate()
            if r:
                (ltbench_s if which == "ltbench" else bare_s).append(seconds)
    run.loader.close()
    return ltbench_s, bare_s


def epoch_end_cost(config: dict, rounds: int = 5) -> float:
    """Median seconds of what ltbench does at every epoch end besides training: the checkpoint
    (serialise, write, fsync, rename, fsync the folder) and the log line (append, fsync)."""
    from ltbench.results import store

    run = engine.build_run(config)
    optimizer = engine.make_optimizer(run)
    times = []
    with tempfile.TemporaryDirectory(prefix="ltbench-ckpt-") as tmp:
        for _ in range(rounds):
            t0 = time.perf_counter()
            store.append_jsonl(Path(tmp) / "log.jsonl", {"epoch": 1, "loss": 1.0})
            checkpoint.save_checkpoint(Path(tmp) / "checkpoint.pt", run, optimizer, run_id="x", epoch=1, step=0,
                                       iteration=1, log_lines=len(store.read_jsonl(Path(tmp) / "log.jsonl")),
                                       seconds=1.0, run_started=time.time() - 1.0)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def report(what: str, images: int, ltbench_s: list[float], bare_s: list[float]) -> float:
    ratios = [b / a for a, b in zip(ltbench_s, bare_s)]
    lt, bare = images / statistics.median(ltbench_s), images / statistics.median(bare_s)
    print(f"  {what:10s} ltbench {lt:7.0f} img/s   bare {bare:7.0f} img/s   ratio ltbench/bare: "
          f"median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}, "
          f"n={len(ratios)} paired)")
    return statistics.median(ratios)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--epochs", type=int, default=6, help="epochs per run; the first is a warm-up (default 6)")
    ap.add_argument("--eval-rounds", type=int, default=5, help="timed evaluations of each (default 5)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for both (default 2)")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers for both (default 0)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, {args.workers} workers, CPU")
    for name in args.settings:
        config = run_config(name, args.epochs, args.threads, args.workers)
        bare = BareLoop(config, args.workers)
        n_train, n_test = len(bare.data.train), len(bare.data.test)
        print(f"{name}: {n_train} training images/epoch, {n_test} test images, batch {config['optim']['batch_size']}")
        ltbench_s, bare_s = measure_training(config, bare)
        report("training", n_train, ltbench_s, bare_s)
        end = epoch_end_cost(config)
        print(f"  {'':10s} of which epoch-end checkpoint + log line: {end * 1e3:.0f} ms = "
              f"{100 * end / statistics.median(ltbench_s):.1f}% of a median ltbench epoch")
        report("evaluation", n_test, *measure_evaluation(config, bare, args.eval_rounds, args.workers))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
