"""Step-time overhead of BAPE + LA against LA alone, on CPU, at the CIFAR-100-LT ResNet-32 setting.

Both models get the same 3×B batch through the backbone (one 'strong' view + two 'sim' views, as BAPE asks):
LA alone is wrapped so that it takes the three views and uses only the first, so the difference between the two
step times is what BAPE itself adds (projection head, statistics update, MAP estimate, log C_p, two BAPE CE
losses and their backward). A step is forward + backward + SGD step. The two models are timed alternately, step
by step, after warm-up steps, so that load from other processes on the machine affects both alike.

    .venv/bin/python benchmarks/bape_overhead.py [--steps 10] [--warmup 2] [--batch 128] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn

from ltbench.data.profile import exponential_counts
from ltbench.method import Method, MethodContext, create_method
from ltbench.registry import BACKBONES


class LAOnThreeViews(Method):
    """LA fed the same three views as BAPE + LA; the extra two views' features are ignored."""

    def __init__(self, ctx: MethodContext):
        super().__init__(None, ctx)
        self.la = create_method({"name": "la"}, ctx)

    def views(self):
        return ["strong", "sim", "sim"]

    def loss(self, features, labels, *, epoch):
        return self.la.loss(list(features[:1]), labels, epoch=epoch)

    def predict(self, features, *, target_prior=None):
        return self.la.predict(features, target_prior=target_prior)


def build(kind: str, ctx: MethodContext, proj_dim: int, seed: int):
    torch.manual_seed(seed)
    backbone = BACKBONES.get("resnet32")(None, in_channels=3)
    if kind == "bape":
        method = create_method({"name": "bape", "proj_dim": proj_dim}, ctx)
    else:
        method = LAOnThreeViews(ctx)
    model = nn.ModuleDict({"backbone": backbone, "method": method})
    groups = method.param_groups() or []
    grouped = {id(p) for g in groups for p in g["params"]}
    rest = [p for p in model.parameters() if id(p) not in grouped]
    opt = torch.optim.SGD([{"params": rest}, *groups], lr=0.05, momentum=0.9, weight_decay=4e-4)
    model.train()
    return model, opt


def head_step(model, feats, labels) -> float:
    """The method's part alone: loss on fixed backbone features (which take a gradient) and its backward."""
    feats = [f.detach().requires_grad_(True) for f in feats]
    t0 = time.perf_counter()
    out = model["method"].loss(feats, labels, epoch=0)
    model["method"].zero_grad(set_to_none=True)
    out["loss"].backward()
    return time.perf_counter() - t0


def train_step(model, opt, x, labels) -> float:
    t0 = time.perf_counter()
    feats = model["backbone"](x).float().split(len(labels))
    out = model["method"].loss(list(feats), labels, epoch=0)
    opt.zero_grad(set_to_none=True)
    out["loss"].backward()
    opt.step()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10, help="timed steps per model (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed warm-up steps per model (default 2)")
    ap.add_argument("--batch", type=int, default=128, help="images per batch; 3 views each (default 128)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    ap.add_argument("--classes", type=int, default=100, help="K (default 100)")
    ap.add_argument("--proj-dim", type=int, default=128, help="p, BAPE's projection dimension (default 128)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    k = args.classes
    counts = torch.tensor(exponential_counts(500, k, 100.0), dtype=torch.long)
    ctx = MethodContext(num_classes=k, class_counts=counts, feature_dim=64, epochs=200)
    models = {"la": build("la", ctx, args.proj_dim, 0), "bape": build("bape", ctx, args.proj_dim, 0)}

    gen = torch.Generator().manual_seed(0)
    b = args.batch
    x = torch.randn(3 * b, 3, 32, 32, generator=gen)
    labels = torch.randint(0, k, (b,), generator=gen)

    for _ in range(args.warmup):
        for model, opt in models.values():
            train_step(model, opt, x, labels)
    times = {name: [] for name in models}
    order = list(models)
    for step in range(args.steps):  # alternate which model goes first, against order effects
        for name in order if step % 2 == 0 else order[::-1]:
            model, opt = models[name]
            times[name].append(train_step(model, opt, x, labels))

    # The method's own cost, measured directly (less sensitive to load than a difference of step times).
    with torch.no_grad():
        feats = list(models["la"][0]["backbone"](x).split(b))
    heads = {name: [] for name in models}
    for step in range(args.warmup + args.steps):
        for name in order if step % 2 == 0 else order[::-1]:
            t = head_step(models[name][0], feats, labels)
            if step >= args.warmup:
                heads[name].append(t)

    mean = {n: statistics.fmean(t) for n, t in times.items()}
    med = {n: statistics.median(t) for n, t in times.items()}
    print(f"ResNet-32, CPU, {torch.get_num_threads()} threads, batch {b} x 3 views, K={k}, p={args.proj_dim}, "
          f"{args.steps} timed steps after {args.warmup} warm-up (alternating)")
    for name, label in (("la", "LA alone (3 views)"), ("bape", "BAPE + LA")):
        print(f"  {label:20s} mean {mean[name] * 1e3:8.1f} ms/step   median {med[name] * 1e3:8.1f} ms/step")
    print(f"  ratio BAPE+LA / LA:  mean {mean['bape'] / mean['la']:.3f}   median {med['bape'] / med['la']:.3f}")
    part = (mean["bape"] - mean["la"]) / mean["bape"]
    part_med = (med["bape"] - med["la"]) / med["bape"]
    print(f"  BAPE part of the BAPE+LA step, from the step times: {100 * part:.1f}% (mean)   "
          f"{100 * part_med:.1f}% (median)")
    head = {n: statistics.median(t) for n, t in heads.items()}
    print(f"  method losses + backward on fixed features (median): LA {head['la'] * 1e3:.1f} ms, "
          f"BAPE+LA {head['bape'] * 1e3:.1f} ms")
    print(f"  BAPE part measured directly: {(head['bape'] - head['la']) * 1e3:.1f} ms = "
          f"{100 * (head['bape'] - head['la']) / med['bape']:.1f}% of the median BAPE+LA step")


if __name__ == "__main__":
    main()
