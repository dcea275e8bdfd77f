"""The training loop every method shares, readable top to bottom.

To follow one run, start at ``train`` (the last function): ``start_session`` builds the run,
``CheckpointSaver.resume`` restores it (ltbench/train/checkpoint.py), then per epoch ``train_epoch`` (one
``epoch_step`` per batch: ``train_step``, micro-batch by micro-batch, on the batch issued ahead, the meters
on the device, the next batch issued, bookkeeping) -> ``epoch_record`` (log row, optional test metrics) ->
the epoch-end checkpoint;
finally ``final_outcome``: ``evaluate``, ``selection.select_model`` and predictions.npz.
What it returns (``record.TrainOutcome``) becomes part of result.json (docs/results-schema.md).

Determinism and resume: the sample order of epoch e comes from a generator seeded with (seed, e) and
the augmentations of sample i in epoch e from torch's RNG reseeded with (seed, e, i). So a run
restarted from a checkpoint taken at (e, step) replays exactly the batches an uninterrupted run would
have seen, and ends with the same weights on CPU; no RNG state needs to be checkpointed. The same
holds with DataLoader workers (any number, persistent for the whole run) and, up to BatchNorm
statistics, with several processes. The speed options keep this, with one caveat each:
train.channels_last and train.threads change float summation order, which over a long run moves
results by as much as the seed spread: they are not part of the run id (they say how, not what, is
computed), but every result records its numerics (``set_threads``, ``session_numerics``) and two
results of one run id stand for each other only when those match (docs/architecture.md, "Run
identity"); on the CPU the thread count is 1 unless train.threads says otherwise. train.compile and,
on GPU, cudnn_benchmark choose kernels by code generation or timing, so two runs, or a run and its
resumed copy, may differ in the last bits; fp16 keeps its loss scale in the checkpoint, so resume
stays exact wherever fp32 is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn as nn

from ltbench.train import distributed, feed
from ltbench.train.meters import EpochMeter, first_non_finite_everywhere
from ltbench.results import provenance, store
from ltbench.train import checkpoint
from ltbench.train.checkpoint import CheckpointSaver
from ltbench.config import EvalConfig, OptimConfig, TrainConfig, from_dict
from ltbench.data import batch_augment, device_decode, transforms
from ltbench.data.base import ArrayImages, LTData, MultiView, check_loaded
from ltbench.errors import MethodContractError, NonFiniteLossError
from ltbench.evaluation import label_prior, summarize, target_prior_metrics
from ltbench.train.heartbeat import PhaseBeat, write_beat
from ltbench.train.loggers import create_loggers
from ltbench.method import Method, MethodContext, TestTimeViews, build_method_model, create_method
from ltbench.results.predictions import PREDICTION_ARRAYS, save_predictions
from ltbench.results.record import TrainOutcome, data_record
from ltbench.registry import BACKBONES, DATASETS
from ltbench.results.runspec import RunSpec
from ltbench.samplers import DEFAULT_SAMPLER, Sampler, SamplerContext, create_sampler
from ltbench.samplers.uniform import uniform_order
from ltbench.train.selection import headline, select_model
from ltbench.seeding import derive_seed




def set_threads(train: TrainConfig, device: torch.device) -> tuple[int, str]:
    """Set torch's intra-op thread count by ``provenance.thread_count`` (on the CPU 1 unless train.threads
    says otherwise, so a run's numbers never depend on the machine's core count or launcher.jobs); returns
    (the effective count, which rule set it), both recorded in the result's ``numerics``."""
    threads, rule = provenance.thread_count(train.threads, device.type, os.environ)
    torch.set_num_threads(threads)
    return torch.get_num_threads(), rule


def session_numerics(s: Session, log: list[dict]) -> dict:
    """``provenance.numerics`` of this session; when the run's epochs were trained under several thread
    counts (resumed with another train.threads), ``threads_per_epoch`` says so, and the result then matches
    no other (``identity.numerics_difference``)."""
    t = s.run.train
    numerics = provenance.numerics(s.device, precision=t.precision, compile=t.compile, channels_last=t.channels_last,
                                   threads_from=s.threads_from, world_size=s.world)
    seen = sorted({row["threads"] for row in log if isinstance(row.get("threads"), int)})
    if len(seen) > 1:
        numerics["threads_per_epoch"] = [row.get("threads") for row in log]
    return numerics


def pick_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def prepare_for_device(run: Run, device: torch.device) -> None:
    """Move the model to the device and apply the run's speed options (train.channels_last,
    train.cudnn_benchmark, train.compile). cuDNN autotuning and compilation pick kernels by timing or
    code generation, so with either a run is not bit-reproducible on GPU (exact resume still restores
    the same state; the following steps may differ in the last bits)."""
    cfg = run.train
    run.model.to(device)
    if cfg.channels_last:
        run.model.to(memory_format=torch.channels_last)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = cfg.cudnn_benchmark
    if cfg.compile != "off":
        compile_for_training(run, cfg.compile)


def compile_for_training(run: Run, setting: str) -> None:
    """train.compile: the backbone and the method's loss (its head, loss and their backward) through
    ``torch.compile``, so that a step is a few fused kernels rather than hundreds of small ones (what a GPU
    pays per launch: docs/performance.md); the batched views follow in ``make_loader`` (``compiled_views``).
    Not ``fullgraph``: a method's host-side code (a plugin's Python) becomes a graph break, not an error.
    ``reduce-overhead``: Inductor with CUDA graphs (one replay instead of a launch per kernel) and static shapes,
    so an epoch's last, smaller batch is a second graph, not a dynamic one; off CUDA, Inductor skips the
    graphs and this is ``inductor`` with static shapes. Each run's regions have their own recompile budget
    (``isolate_recompiles``): a grid's runs in one process would otherwise share one, then run eagerly."""
    backend, options = compile_options(setting)
    run.compiled = torch.compile(run.backbone, backend=backend, isolate_recompiles=True, **options)
    run.compiled_loss = torch.compile(run.method.loss, backend=backend, isolate_recompiles=True, **options)


def compile_options(setting: str) -> tuple[str, dict]:
    """(backend, torch.compile keyword arguments) of a train.compile value."""
    if setting == "reduce-overhead":
        return "inductor", {"mode": "reduce-overhead", "dynamic": False}
    return setting, {}


def compiled_views(pipelines: list, setting: str) -> list:
    """The batched view pipelines under train.compile, each compiled whole (``fullgraph=True``: they have no
    host-side branch or read, tests/test_gpu_augment.py) and with static shapes (the last batch of an epoch is
    a second graph). Never CUDA graphs, also under reduce-overhead: a batch's views are built one step ahead
    on the feeder's side stream and must outlive the next call, which a graph's static output buffers would
    overwrite."""
    backend, _ = compile_options(setting)
    return [batch_augment.CompiledPipeline(p, backend) for p in pipelines]


# ------------------------------------------------------------------------------------------------
# Building the pieces of a run


@dataclass
class Run:
    builder: object  # the dataset plugin instance (for extra test sets)
    data: LTData
    backbone: nn.Module
    method: Method
    model: nn.ModuleDict  # {'backbone', 'method'}: what is optimised and checkpointed
    optim: OptimConfig
    train: TrainConfig
    eval: EvalConfig
    sampler: Sampler  # the epoch order (ltbench/samplers/; the default is 'uniform')
    eval_sets: dict = field(default_factory=dict)  # source name -> (MultiView, labels); see eval_sources
    loader: Loader | None = None  # set by train(); evaluate() falls back to a worker-less one
    compiled: Callable | None = None  # torch.compile'd backbone (train.compile), else None
    compiled_loss: Callable | None = None  # torch.compile'd method.loss (train.compile), else None
    device_views: list | None = None  # train.augment_on: batch: one BatchPipeline per view (see make_loader)
    resident: tuple | None = None  # augment_on: batch, in-memory uint8 data: (images, labels) on the device
    decode_on_device: bool = False  # the loader hands over encoded files, decoded on the device (device_decode)
    progress: PhaseBeat | None = None  # rank 0 of train(): evaluation and writing phases for the launcher's display
    decode_stats: device_decode.DecodeStats = field(default_factory=device_decode.DecodeStats)  # log: decode_*


def backbone_features(run: Run, x: torch.Tensor) -> torch.Tensor:
    """The backbone on a batch, in the memory format and (compiled or not) form the run asked for. Evaluation
    (no gradients) under ``reduce-overhead`` clones each batch's features: a CUDA graph's replay writes its
    output into the graph's own buffer, which the next replay overwrites, and evaluation keeps every batch."""
    if run.train.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    if run.compiled is None:
        return run.backbone(x)
    if run.train.compile != "reduce-overhead" or torch.is_grad_enabled():
        return run.compiled(x)
    torch.compiler.cudagraph_mark_step_begin()
    return run.compiled(x).clone()


def dataset_builder(config: dict):
    return DATASETS.build(config["data"], where="data")


def load_data(config: dict) -> LTData:
    return dataset_builder(config).load()


def build_run(config: dict, data: LTData | None = None) -> Run:
    builder = dataset_builder(config)
    if data is None:
        data = builder.load()
        check_loaded(data, DATASETS.label(config["data"]["name"]))  # a plugin's empty test set: one line, no damaged record
    backbone = BACKBONES.build(config["backbone"], in_channels=data.image.channels, where="backbone")
    bind = getattr(backbone, "bind_data", None)  # Backbone hook: the input it takes, sized for the classes
    data = bind(data) if callable(bind) else data
    backbone = build_method_model(config["method"], backbone)  # the backbone itself, or e.g. a multi-expert net
    optim = from_dict(OptimConfig, config["optim"], "optim")
    sampler = create_sampler(config["sampler"], SamplerContext(data.train_labels, data.num_classes, optim.epochs))
    ctx = MethodContext(
        num_classes=data.num_classes,
        class_counts=torch.as_tensor(data.class_counts, dtype=torch.long),
        feature_dim=backbone.feature_dim,
        epochs=optim.epochs,
        dataset=config["data"]["name"],
        class_names=tuple(data.class_names) if data.class_names else None,
        backbone=backbone,
        sampling=sampler.class_probabilities if config["sampler"]["name"] != DEFAULT_SAMPLER else None,  # ctx.sampled_prior(epoch)
    )
    method = create_method(config["method"], ctx)
    model = nn.ModuleDict({"backbone": backbone, "method": method})
    run = Run(builder, data, backbone, method, model, optim,
              from_dict(TrainConfig, config["train"], "train"), from_dict(EvalConfig, config["eval"], "eval"), sampler)
    run.eval_sets = eval_sources(run)
    return run


def make_optimizer(run: Run) -> torch.optim.Optimizer:
    """SGD over the model's parameters and the method's own groups. On CUDA the fused kernel (``fused=True``):
    one launch per device and dtype instead of a handful of foreach launches, and with fp16 it takes
    GradScaler's ``found_inf`` on the device, so a step no longer reads it on the host. It computes the same
    update as the foreach one (weight decay, momentum, Nesterov, elementwise in the parameters' dtype), exact up
    to the compiler's contraction of multiply-adds, i.e. in the last bit, like any other CUDA kernel choice.
    On the CPU torch's default (bit-identical results there stay as they were)."""
    o = run.optim
    groups = run.method.param_groups() or []
    grouped = {id(p) for g in groups for p in g["params"]}
    rest = [p for p in run.model.parameters() if id(p) not in grouped and p.requires_grad]
    fused = True if any(p.is_cuda for p in run.model.parameters()) else None
    return torch.optim.SGD([{"params": rest}, *groups], lr=o.lr, momentum=o.momentum,
                           nesterov=o.nesterov, weight_decay=o.weight_decay, fused=fused)


def lr_factor(o: OptimConfig, iteration: int, iters_per_epoch: int) -> float:
    """Learning-rate multiplier at a global iteration: linear warm-up, then cosine / step / constant."""
    warmup = int(round(o.warmup_epochs * iters_per_epoch))
    total = o.epochs * iters_per_epoch
    if iteration < warmup:
        return (iteration + 1) / warmup
    if o.schedule == "cosine":
        progress = (iteration - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    if o.schedule == "cosine_epoch":  # torch's CosineAnnealingLR(T_max=epochs) stepped at each epoch end
        return 0.5 * (1.0 + math.cos(math.pi * min(iteration // iters_per_epoch, o.epochs) / o.epochs))
    if o.schedule == "step":
        epoch = iteration // iters_per_epoch
        return o.gamma ** sum(epoch >= m for m in o.milestones)
    return 1.0


def epoch_batches(n: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The uniform sample order of one epoch, cut into batches (the default sampler's; see cut_batches)."""
    return cut_batches(uniform_order(n, seed, epoch), batch_size)


def cut_batches(order: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """An epoch's order cut into batches (a final batch of 1 is dropped: BatchNorm)."""
    n = len(order)
    batches = [order[i : i + batch_size] for i in range(0, n, batch_size)]
    if len(batches) > 1 and len(batches[-1]) == 1:
        batches.pop()
    return batches


def sampled_batches(run: Run, seed: int, epoch: int) -> list[np.ndarray]:
    """The batches of one training epoch in the order the run's sampler gives (ltbench/samplers/)."""
    n = len(run.data.train)
    order = np.asarray(run.sampler.epoch_order(seed, epoch))
    name = getattr(run.sampler, "registered_name", "?")
    if order.dtype.kind not in "iu":  # a float order (2.7) would be truncated to another sample, silently
        raise MethodContractError(f"sampler '{name}': epoch_order() must give whole-number indices, got dtype "
                                  f"{order.dtype}; see ltbench/samplers/__init__.py")
    order = order.astype(np.int64)
    if order.shape != (n,) or (n and (order.min() < 0 or order.max() >= n)):
        raise MethodContractError(f"sampler '{name}': epoch_order() must give {n} indices in [0, {n}) (one epoch "
                                  f"is len(train) draws), got shape {order.shape}; see ltbench/samplers/__init__.py")
    return cut_batches(order, run.optim.batch_size)


def collate(items: list) -> tuple[list, torch.Tensor]:
    """Stack each view's images; images of different sizes (undecoded-size large images handed to the
    batched augmentation) stay a list."""
    views, labels = zip(*items)
    return [torch.stack(v) if len({t.shape for t in v}) == 1 else list(v) for v in zip(*views)], \
        torch.as_tensor(labels)


class SeededSamples(torch.utils.data.Dataset):
    """Every sample a run loads, training and test alike, addressed by a key (source, index, seed).

    Before building a sample's views it seeds torch's RNG with the key's seed, so a sample's augmentations
    do not depend on batch composition, process count, worker count or on which worker loads it. The seed
    comes from (run seed, epoch, index) for training samples and from (run seed, source) + index for test
    sources. It is derived when the keys are planned (``train_keys`` / ``eval_keys``), in one tight loop in
    the main process, not per sample in the loading path: there the sha1 costs about 14 us per sample on
    this CPU (1.6 us in the tight loop), a few percent of a ResNet-8 epoch (docs/performance.md).
    """

    def __init__(self, sources: dict[str, MultiView], seed: int):
        self.sources, self.seed = sources, seed

    def __len__(self) -> int:
        return sum(len(s) for s in self.sources.values())

    def __getitem__(self, key: tuple[str, int, int]):
        source, i, seed = key
        # The CPU generator only: torch.manual_seed would also queue a CUDA reseed with a stack trace.
        torch.random.default_generator.manual_seed(seed)
        return self.sources[source][i]

    def train_keys(self, batches: list[np.ndarray], start: int, epoch: int, rank: int = 0,
                   world: int = 1) -> list[list]:
        """Keys of the training batches from step ``start`` on. With several processes, process ``rank``
        takes every ``world``-th sample of each global batch. An image drawn again in the same epoch (a
        re-sampler, ltbench/samplers/) gets a fresh augmentation: its k-th repeat is seeded with k too,
        counted over the whole epoch so the seed does not depend on ``start``, ``rank`` or ``world``."""
        seen: dict[int, int] = {}
        keys = []
        for step, b in enumerate(batches):
            row = []
            for position, i in enumerate(b.tolist()):
                k = seen[i] = seen.get(i, -1) + 1
                if step >= start and position % world == rank:
                    parts = (self.seed, "augment", epoch, i) if k == 0 else (self.seed, "augment", epoch, i, k)
                    row.append(("train", i, derive_seed(*parts)))
            if step >= start:
                keys.append(row)
        return keys

    def eval_keys(self, source: str, batch_size: int, epoch: int = 0) -> list[list]:
        """Keys of one test source in order, in batches. One hash per source (and test-time epoch after the
        first: a method's views redrawn for a later pass), not per image: test passes are long and their
        pipelines usually deterministic."""
        parts = (self.seed, "augment", source) if epoch == 0 else (self.seed, "augment", source, epoch)
        base, n = derive_seed(*parts), len(self.sources[source])
        return [[(source, i, (base + i) % 2**31) for i in range(s, min(s + batch_size, n))]
                for s in range(0, n, batch_size)]


def pinned(batch):
    """A batch (tensors in lists and tuples) copied to page-locked memory, so the copy to the GPU
    (``.to(device, non_blocking=True)``) is asynchronous; what DataLoader's pin-memory thread does for
    worker batches, done here for the in-process path (train.num_workers: 0)."""
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, (list, tuple)):
        return type(batch)(pinned(x) for x in batch)
    return batch


class BatchPlan(torch.utils.data.Sampler):
    """The batches of keys the loader yields on its next pass; replaced before each pass."""

    def __init__(self):
        self.batches: list[list[tuple]] = []

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class Loader:
    """One loading path for a whole run: training epochs and every evaluation pass (main test set,
    shifted sets) go through the same DataLoader and its worker processes, started once.

    With ``workers`` = 0 the samples are built in this process (no DataLoader machinery at all);
    otherwise the workers persist across epochs and evaluations, so their start-up cost and the copy
    of the dataset they hold are paid once per run. Batches are pinned when the device is CUDA (``pinned``).
    """

    def __init__(self, samples: SeededSamples, workers: int, pin_memory: bool = False):
        self.samples, self.workers, self.pin_memory = samples, workers, pin_memory
        self.plan = BatchPlan()
        self.loader = None
        if workers:
            self.loader = torch.utils.data.DataLoader(samples, batch_sampler=self.plan, num_workers=workers,
                                                      collate_fn=collate, persistent_workers=True,
                                                      pin_memory=pin_memory)

    def run(self, batches: list[list[tuple]]):
        """Yield (views, labels) for each batch of keys, in order. One pass at a time: exhaust it
        (or drop it) before starting the next."""
        if self.loader is None:
            for keys in batches:
                batch = collate([self.samples[k] for k in keys])
                yield pinned(batch) if self.pin_memory else batch
            return
        self.plan.batches = batches
        yield from self.loader

    def close(self) -> None:
        """Stop the worker processes now (they would also stop when the loader is garbage-collected)."""
        iterator = getattr(self.loader, "_iterator", None)
        if iterator is not None:
            iterator._shutdown_workers()
        self.loader = None


def eval_sources(run: Run) -> dict[str, tuple[MultiView, np.ndarray]]:
    """The test sets a run evaluates on ('test' and each of eval.test_sets), with the eval pipeline,
    built before any worker starts (persistent workers only see what exists when they fork)."""
    tf = transforms.build("eval", run.data.image, run.data.pipelines) if run.eval.tte == "none" else \
        transforms.CropEnsemble(run.data.image, run.eval.tte, run.eval.tte_expand)  # eval.tte: several crops per image
    adapt_views = [transforms.build(v, run.data.image, run.data.pipelines) for v in run.method.test_time_views()]
    out = {"test": (MultiView(run.data.test, [tf]), run.data.test_labels)}
    for name in run.eval.test_sets:
        dataset, labels = run.builder.test_set(name, run.data)
        out[f"test_set:{name}"] = (MultiView(dataset, [tf]), np.asarray(labels))
    if adapt_views:  # the method's test-time views of the same images (ADAPT_SUFFIX: no labels used)
        out.update({f"{source}{ADAPT_SUFFIX}": (MultiView(ds.base, adapt_views), labels)
                    for source, (ds, labels) in list(out.items())})
    if run.data.val is not None:  # the validation split (ltbench/data/validation.py), clean view like test
        out["val"] = (MultiView(run.data.val, [tf]), np.asarray(run.data.val_labels))
    return out


ADAPT_SUFFIX = ":adapt"


@torch.no_grad()
def view_features(run: Run, device: torch.device, source: str, batch_size: int = 512,
                  epoch: int = 0) -> list[torch.Tensor]:
    """Backbone features of every view of one source, one (N, feature_dim) tensor per view; ``epoch``
    > 0 draws the views afresh (a test-time pass, seeded by run seed, source, epoch and index)."""
    run.model.eval()
    loader = run.loader if run.loader is not None else make_loader(run, 0, 0, device)
    per_batch = [[backbone_features(run, v.to(device, non_blocking=True)).float() for v in views]
                 for views, _ in loader.run(loader.samples.eval_keys(source, batch_size, epoch))]
    return [torch.cat(per_view) for per_view in zip(*per_batch)]


def adapt_to(run: Run, device: torch.device, source: str, record: dict) -> None:
    """Test-time adaptation of the method to one test source (Method.adapt), when it asks for it: the
    features of its views, drawn for the first pass, and on request redrawn for later ones."""
    run.method.reset_adaptation()
    if run.method.test_time_views():
        adapt_source = f"{source}{ADAPT_SUFFIX}"
        views = TestTimeViews(view_features(run, device, adapt_source),
                              lambda epoch: view_features(run, device, adapt_source, epoch=epoch))
        with torch.enable_grad():
            record[source] = run.method.adapt(views)


def make_loader(run: Run, seed: int, workers: int, device: torch.device) -> Loader:
    """The run's loader over its training views and all its test sets (see ``Loader``). With
    train.augment_on: batch the loader hands over each training image once, as uint8, and the views are
    built on the device (``augment_on_device``)."""
    names, image, aliases = run.method.views(), run.data.image, run.data.pipelines
    if run.train.augment_on == "batch":
        run.device_views = [batch_augment.build_batch(v, image, aliases) for v in names]
        if run.train.compile != "off":
            run.device_views = compiled_views(run.device_views, run.train.compile)
        encoded = device_decode.encoded_source(run.data.train, run.train.augment_on, image.kind, device)
        run.decode_on_device = encoded is not None
        run.resident = None if encoded is not None else resident_data(run.data.train, device)
        decoded = MultiView(run.data.train, [batch_augment.as_uint8_tensor])
        sources = {"train": encoded if encoded is not None else decoded}
    else:
        sources = {"train": MultiView(run.data.train, [transforms.build(v, image, aliases) for v in names])}
    sources.update({name: ds for name, (ds, _) in run.eval_sets.items()})
    return Loader(SeededSamples(sources, seed), workers, pin_memory=device.type == "cuda")


def resident_data(train, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """With train.augment_on: batch, a training set held in memory as uint8 (CIFAR, Fashion-MNIST, synthetic:
    ``ArrayImages``) is put on the device once, images and labels, and each batch is gathered there
    (``feed.resident_batches``), as the bare loop of benchmarks/gpu_throughput.py does: no collating, pinning or
    copying of images per batch in the training thread. Same keys, so the same order, images and seeds as the
    loader's batches (tests/test_engine.py); the loader still serves the test sets. Costs the training array on
    the device (CIFAR: 150 MB). Other datasets (files, encoded images): None, the loader."""
    if not isinstance(train, ArrayImages):
        return None
    return train.images.to(device), torch.as_tensor(train.labels, dtype=torch.int64).to(device)


# ------------------------------------------------------------------------------------------------
# Evaluation


@torch.no_grad()
def test_features(run: Run, device: torch.device, source: str = "test", batch_size: int = 512) -> torch.Tensor:
    """Backbone features of one test source (see eval_sources), loaded through the run's loader, so
    decoding and transforms run in its worker processes when it has any."""
    run.model.eval()
    loader = run.loader if run.loader is not None else make_loader(run, 0, 0, device)
    keys = loader.samples.eval_keys(source, batch_size)
    feats = []
    for step, (views, _) in enumerate(loader.run(keys)):
        if run.progress is not None:  # 'evaluating test set i of M' with its ETA (ltbench/train/heartbeat.py)
            run.progress.evaluating(source, step, len(keys))
        feats.append(crop_features(run, views[0].to(device, non_blocking=True)))
    if run.progress is not None:
        run.progress.evaluating(source, len(keys), len(keys))
    return torch.cat(feats) if feats else torch.zeros(0, run.backbone.feature_dim, device=device)


def crop_features(run: Run, images: torch.Tensor) -> torch.Tensor:
    """Features of a batch of evaluation images: (N, d), or (N, crops, d) under eval.tte (N, crops, C, H, W)."""
    if images.ndim == 4:
        return backbone_features(run, images).float()
    return backbone_features(run, images.flatten(0, 1)).float().unflatten(0, images.shape[:2])


def predict_scores(run: Run, feats: torch.Tensor, prior: torch.Tensor | None, heads: bool = False):
    """``method.predict`` (or ``head_predictions`` with ``heads``) on test features; with several crops per
    image (eval.tte) the mean of the scores over the crops, as LIFT aggregates them."""
    call = run.method.head_predictions if heads else run.method.predict
    if feats.ndim == 2:
        return call(feats, target_prior=prior)
    n, crops = feats.shape[:2]
    out = call(feats.flatten(0, 1), target_prior=prior)
    mean = lambda s: s.unflatten(0, (n, crops)).mean(1) if torch.is_tensor(s) and s.ndim == 2 else s  # noqa: E731
    return {k: mean(v) for k, v in out.items()} if heads else mean(out)


def score_summary(run: Run, scores: torch.Tensor, labels: np.ndarray) -> tuple[np.ndarray, dict]:
    """The argmax prediction of ``scores`` and its metrics (``evaluation.summarize``) by shot group."""
    prediction = scores.argmax(1).cpu().numpy()
    e = run.eval
    return prediction, summarize(prediction, labels, run.data.class_counts, e.many_threshold, e.few_threshold)


def prior_tensor(prior, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(prior, dtype=torch.float32, device=device)


def evaluate_heads(run: Run, heads: dict, labels: np.ndarray, arrays: dict) -> dict:
    """metrics.heads: each extra prediction head under the uniform prior (shape-checked only)."""
    out = {}
    name = getattr(run.method, "registered_name", "?")
    for head, scores in heads.items():
        check_scores(scores, len(labels), run.data.num_classes, name, f"head '{head}'", finite=False)
        _, s = score_summary(run, scores, labels)
        out[head] = headline(s)
    arrays.update({f"head:{head}": scores.argmax(1).cpu().numpy() for head, scores in heads.items()})
    return out


def evaluate_target_priors(run: Run, feats: torch.Tensor, labels: np.ndarray, device: torch.device) -> dict:
    """metrics.target_priors: the prior-adapted prediction; 'all' is the per-class accuracy weighted
    by the target prior (the test set stays balanced), groups are unweighted."""
    def predict_for(prior):
        return predict_scores(run, feats, prior_tensor(prior, device)).argmax(1).cpu().numpy()

    e = run.eval
    return target_prior_metrics(e.target_priors, run.data.class_counts, labels, predict_for, e.many_threshold,
                                e.few_threshold)


def evaluate_test_sets(run: Run, device: torch.device, arrays: dict, adaptation: dict | None = None) -> dict:
    """metrics.test_sets: each extra test set, predicted with its own (known) class prior."""
    out = {}
    k = run.data.num_classes
    for name in run.eval.test_sets:
        set_labels = run.eval_sets[f"test_set:{name}"][1]
        set_feats = test_features(run, device, source=f"test_set:{name}")
        adapt_to(run, device, f"test_set:{name}", {} if adaptation is None else adaptation)
        prior = label_prior(set_labels, k)
        prediction, s = score_summary(run, predict_scores(run, set_feats, prior_tensor(prior, device)), set_labels)
        arrays[f"set:{name}:labels"], arrays[f"set:{name}:head:main"] = set_labels, prediction
        out[name] = {"size": int(len(set_labels)), **headline(s)}
    return out


@torch.no_grad()
def evaluate(run: Run, device: torch.device) -> dict:
    """Metrics on the test set under the uniform target prior, per head, under shifted priors and on
    extra test sets. The argmax per test image behind them (for paired tests, ltbench.results.predictions)
    travels under PREDICTION_ARRAYS; train() takes it out of the metrics and saves it."""
    if run.progress is not None:  # the sources this evaluation predicts, in order, for 'test set i of M'
        run.progress.plan({s: len(labels) for s, (_, labels) in run.eval_sets.items() if not s.endswith(ADAPT_SUFFIX)})
    feats = test_features(run, device)
    labels, k = run.data.test_labels, run.data.num_classes
    adaptation: dict = {}
    adapt_to(run, device, "test", adaptation)
    uniform = torch.full((k,), 1.0 / k, device=device)
    scores = predict_scores(run, feats, uniform)
    check_scores(scores, len(feats), k, getattr(run.method, "registered_name", "?"), "predict()")
    main_prediction, out = score_summary(run, scores, labels)
    heads = predict_scores(run, feats, uniform, heads=True)
    arrays = {"labels": labels, "head:main": main_prediction}
    if heads:
        out["heads"] = evaluate_heads(run, heads, labels, arrays)
    if run.eval.target_priors:
        out["target_priors"] = evaluate_target_priors(run, feats, labels, device)
    out[PREDICTION_ARRAYS] = arrays
    if run.eval.test_sets:
        out["test_sets"] = evaluate_test_sets(run, device, arrays, adaptation)
    run.method.reset_adaptation()
    if adaptation:
        out["test_time_adaptation"] = adaptation  # what each source's adaptation learned (Method.adapt)
    if "val" in run.eval_sets:  # the model as trained (no test-time adaptation), like selection needs it
        out["val"] = evaluate_val(run, device)
    return out


@torch.no_grad()
def evaluate_val(run: Run, device: torch.device) -> dict:
    """metrics.val: the validation split under the uniform prior, with the test set's shot groups (from
    training counts). What selection may look at; the test metrics never are."""
    labels = run.eval_sets["val"][1]
    scores = predict_scores(run, test_features(run, device, "val"), None)
    _, summary = score_summary(run, scores, labels)
    return {**headline(summary), "per_class": summary["per_class"], "size": int(len(labels))}


def track_best_val(s: Session, row: dict, epoch: int) -> None:
    """eval.select best_val: validate after each epoch; when validation All beats every earlier logged
    epoch (ties keep the earlier), rank 0 saves the model as RUN_DIR/best_val.pt (train/checkpoint.py). Done
    before the log row and the epoch checkpoint, so a resumed run replays the epoch and rewrites the same file."""
    row["val"] = headline(evaluate_val(s.run, s.device))
    if not s.main:
        return
    run_dir = Path(s.spec.run_dir)
    earlier = [r["val"]["all"] for r in store.read_jsonl(run_dir / store.LOG) if "val" in r and r["epoch"] <= epoch]
    if row["val"]["all"] is not None and all(row["val"]["all"] > a for a in earlier if a is not None):
        checkpoint.save_best_val(run_dir, s.run, run_id=s.spec.run_id, epoch=epoch + 1)


def load_best_val(s: Session) -> None:
    """Put the best validation epoch's weights back into the model before the final evaluation."""
    distributed.barrier()
    state = checkpoint.load_best_val(Path(s.spec.run_dir), s.spec.run_id)
    s.run.model.load_state_dict(state["model"])
    s.run.method.load_extra_state(state.get("method_extra", {}))


# ------------------------------------------------------------------------------------------------
# The method contract, checked at the first step so a broken method fails in seconds, not at the end

CONTRACT_DOC = "the method contract is in docs/adding-a-method.md"


class NonFiniteScores(MethodContractError):
    """predict() gave NaN or inf. The method's fault only at its contract check, on finite features of a
    model that has not trained yet (``check_method_contract``); at an evaluation after training steps the
    model diverged, and ``evaluate_after`` says so instead (lower optim.lr), whether or not
    train.eval_every asked for that evaluation."""


def check_scores(scores, n: int, k: int, method: str, what: str, finite: bool = True) -> None:
    """Scores from predict() must be a finite tensor of shape (n, k); extra heads need the shape only."""
    if not isinstance(scores, torch.Tensor) or tuple(scores.shape) != (n, k):
        shape = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise MethodContractError(f"method '{method}': {what} returned {shape}, expected a tensor of shape "
                                  f"({n}, {k}) (one score per test image and class); {CONTRACT_DOC}")
    if finite and not bool(torch.isfinite(scores).all()):
        raise NonFiniteScores(f"method '{method}': {what} returned non-finite scores (NaN or inf) on finite "
                              f"features; {CONTRACT_DOC}")


def weights_state(model: nn.Module) -> str:
    """'weights non-finite (backbone.fc.weight)' or 'weights finite, largest |w| 3.2e+12': what a
    divergence message can say about the model (run only after something went non-finite)."""
    tensors = [(name, t) for name, t in model.state_dict().items() if torch.is_floating_point(t)]
    bad = next((name for name, t in tensors if not bool(torch.isfinite(t).all())), None)
    if bad is not None:
        return f"weights non-finite ({bad})"
    largest = max((float(t.abs().max()) for _, t in tensors if t.numel()), default=0.0)
    return f"weights finite, largest |w| {largest:.3g}"


def evaluate_after(s: Session, epoch: int) -> dict:
    """``evaluate`` after ``epoch`` epochs, non-finite scores reported as divergence: the method passed its
    contract check at the first step, so a model that now scores NaN or inf has blown up."""
    try:
        return evaluate(s.run, s.device)
    except NonFiniteScores:
        method = s.spec.config["method"]["name"]
        raise NonFiniteLossError(
            f"non-finite scores (NaN or inf) at the evaluation after epoch {epoch}/{s.run.optim.epochs} "
            f"({weights_state(s.run.model)}): training diverged; lower optim.lr (now {s.run.optim.lr:g}); if it "
            f"persists, check predict() of method '{method}' (log of 0, division by a zero count)") from None


def check_method_contract(method: Method, out, features: list[torch.Tensor], labels: torch.Tensor) -> None:
    """Check one loss() output and one predict() on the same features; raise MethodContractError."""
    name, n, k = getattr(method, "registered_name", type(method).__name__), len(labels), method.num_classes
    if not isinstance(out, dict) or "loss" not in out:
        got = f"a dict with keys {sorted(out)}" if isinstance(out, dict) else type(out).__name__
        raise MethodContractError(f"method '{name}': loss() must return a dict with a 'loss' entry (a scalar tensor); "
                                  f"it returned {got}; {CONTRACT_DOC}")
    loss = out["loss"]
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
        got = f"a tensor of shape {tuple(loss.shape)}" + ("" if loss.requires_grad else " without grad") \
            if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise MethodContractError(f"method '{name}': loss()['loss'] must be a scalar tensor that depends on the "
                                  f"parameters; got {got}; {CONTRACT_DOC}")
    if "logits" in out and (not isinstance(out["logits"], torch.Tensor) or tuple(out["logits"].shape) != (n, k)):
        raise MethodContractError(f"method '{name}': loss()['logits'] must have shape ({n}, {k}); {CONTRACT_DOC}")
    was_training = method.training
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        method.eval()
        try:
            check_scores(method.predict(features[0].detach().float()), n, k, name, "predict()")
        except NonFiniteScores as exc:
            if bool(torch.isfinite(features[0]).all()):  # finite inputs: the method's own predict() broke its contract
                raise MethodContractError(str(exc)) from None
            raise NonFiniteLossError("the backbone's features are non-finite (NaN or inf) at the first training "
                                     "step of this session, before predict(): the images, the backbone, or "
                                     "checkpointed weights that had diverged (lower optim.lr)") from None
        finally:
            method.train(was_training)


def non_finite_loss_message(loss: torch.Tensor | float, epoch: int, step: int, precision: str, method: str, lr: float) -> str:
    """Divergence once the model has been updated (lower optim.lr first); at the very first step, before any
    update, no learning rate is to blame yet and the method's loss is."""
    where = f"non-finite loss ({float(loss)}) at epoch {epoch + 1}, step {step + 1}"
    if epoch == 0 and step == 0:
        return (f"{where}, before any update: the loss of method '{method}' gives NaN or inf on a fresh model "
                f"(log of 0, division by a zero count, an unbounded margin or scale); {CONTRACT_DOC}")
    if precision == "bf16":
        return (f"{where} under bf16 autocast: training diverged; try train.precision=fp32 (bf16 has 8 bits of "
                f"mantissa), or a lower optim.lr (now {lr:g})")
    return (f"{where} in fp32: training diverged; lower optim.lr (now {lr:g}); if it persists, check the loss of "
            f"method '{method}' (log of 0, division by a zero count, an unbounded margin or scale)")


# ------------------------------------------------------------------------------------------------
# The loop


def progress_bar(total: int, initial: int, enabled: bool, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=not (enabled and sys.stderr.isatty()),
                leave=False, dynamic_ncols=True, unit="batch")


@dataclass
class Session:
    """One process's share of a training run: the run, where it runs, and the optimisation state."""

    spec: RunSpec
    run: Run
    device: torch.device
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    rank: int
    world: int
    threads: int
    say: Callable[[str], None]
    iters_per_epoch: int = 0
    base_lrs: list = field(default_factory=list)
    iteration: int = 0
    contract_checked: bool = False
    loggers: object = None  # ltbench.train.loggers.LoggerSet on rank 0 when train.loggers names any
    last_heartbeat: float = 0.0  # when progress.json was last written (ltbench.run.progress reads it)
    threads_from: str = ""  # which rule set the thread count (provenance.thread_count), for the numerics

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def seed(self) -> int:
        return self.spec.seed

    def autocast(self):
        precision = self.run.train.precision
        if precision == "fp32":  # no autocast context at all: nothing to switch, on any device type
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.float16 if precision == "fp16" else torch.bfloat16,
                              enabled=precision != "fp32")


def start_session(spec: RunSpec, say: Callable[[str], None]) -> Session:
    """Threads, processes, device, then the run built from a seeded init, its optimiser and scaler."""
    train_cfg = from_dict(TrainConfig, spec.config["train"], "train")
    rank, world = distributed.init_from_env()
    if rank != 0:
        say = lambda msg: None  # noqa: E731 - only rank 0 talks and writes
    device = pick_device()
    threads, threads_from = set_threads(train_cfg, device)  # before any tensor work: the count is per device
    torch.manual_seed(derive_seed(spec.seed, "init"))
    run = build_run(spec.config)
    prepare_for_device(run, device)
    optimizer = make_optimizer(run)
    scaler = torch.amp.GradScaler(device.type, enabled=run.train.precision == "fp16")
    o = run.optim
    if o.batch_size < world:
        raise ValueError(f"optim.batch_size ({o.batch_size}) must be at least the number of processes ({world})")
    s = Session(spec, run, device, optimizer, scaler, rank, world, threads, say, threads_from=threads_from)
    s.iters_per_epoch = len(sampled_batches(run, spec.seed, 0))
    s.base_lrs = [g["lr"] for g in optimizer.param_groups]
    return s


def micro_batches(n: int, size: int | None) -> list[slice]:
    """The micro-batches of a batch of ``n`` (optim.micro_batch_size; unset: the whole batch in one). Slices are
    views of the batch, no copy. A last micro-batch of one sample joins its predecessor (BatchNorm needs two,
    as ``cut_batches`` keeps for whole batches)."""
    if not size or size >= n:
        return [slice(0, n)]
    starts = [start for start in range(0, n, size) if start == 0 or n - start > 1]
    return [slice(start, end) for start, end in zip(starts, starts[1:] + [n])]


def train_step(s: Session, views: list[torch.Tensor], labels: torch.Tensor, epoch: int, step: int) -> dict:
    """One optimisation step on a batch already on the device: the schedule, then for each micro-batch
    (``micro_batches``; a run without optim.micro_batch_size has one) forward (all views through one backbone
    pass, so BatchNorm sees them together), the contract check at the first step, and backward of its loss
    weighted by its share of the batch; then one update. For a loss that is a mean over samples the
    accumulated gradient is the whole batch's up to float rounding, a short last batch of an epoch included
    (docs/foundation.md). Nothing here reads a device value: a non-finite loss reaches the epoch's meter
    (``read_meter``)."""
    run, o, n = s.run, s.run.optim, len(labels)
    for group, base in zip(s.optimizer.param_groups, s.base_lrs):
        group["lr"] = base * lr_factor(o, s.iteration, s.iters_per_epoch)
    s.optimizer.zero_grad(set_to_none=True)
    outs = []
    for chunk in micro_batches(n, o.micro_batch_size):
        size = chunk.stop - chunk.start
        with s.autocast():
            batch = views[0][chunk] if len(views) == 1 else torch.cat([v[chunk] for v in views])
            features = backbone_features(run, batch).float().split(size)
            out = (run.compiled_loss or run.method.loss)(list(features), labels[chunk], epoch=epoch)
        if not s.contract_checked:
            check_method_contract(run.method, out, list(features), labels[chunk])
            s.contract_checked = True
        share = size / n
        s.scaler.scale(out["loss"] if size == n else out["loss"] * share).backward()  # scaler: fp16 only
        outs.append((share, out))
    if s.world > 1:
        distributed.average_gradients(run.model.parameters())
    s.scaler.step(s.optimizer)
    s.scaler.update()
    s.iteration += 1
    return outs[0][1] if len(outs) == 1 else merged_output(outs)


def merged_output(outs: list[tuple[float, dict]]) -> dict:
    """The micro-batches' outputs read as one batch's: scalar entries (loss, extras) weighted by each one's
    share, logits concatenated."""
    first = outs[0][1]
    merged = {k: sum(share * out[k].detach() for share, out in outs) for k, v in first.items()
              if k != "logits" and torch.is_tensor(v) and v.numel() == 1}
    if all("logits" in out for _, out in outs):
        merged["logits"] = torch.cat([out["logits"] for _, out in outs])
    return merged


def heartbeat(s: Session, meter: EpochMeter, epoch: int, steps_done: int, steps: int) -> None:
    """At most once a second, where the epoch is: a launcher shows it before the first epoch ends
    (``ltbench.run.progress``), so a long first epoch is not minutes of silence. The loss is the meter's as
    of its last read (every train.log_every steps), so the heartbeat never makes the host wait for the GPU."""
    now = time.monotonic()
    if not s.main or (now - s.last_heartbeat < 1.0 and steps_done < steps):
        return
    s.last_heartbeat = now
    seen, seconds = meter.sums["seen"], time.perf_counter() - meter.t0
    beat = {"epoch": epoch + 1, "epochs": s.run.optim.epochs, "step": steps_done, "steps": steps,
            "loss": meter.sums["loss"] / seen if seen else None,  # None: no read yet this epoch
            "images_per_s": meter.images / max(seconds, 1e-9), "seconds": seconds}
    write_beat(s.spec.run_dir, beat)



def augment_on_device(run: Run, images, batch_keys: list[tuple], device: torch.device) -> list[torch.Tensor]:
    """train.augment_on: batch: every view of the batch from its uint8 images, on the training device, each
    sample's draws seeded by its key's seed (run seed, epoch, index), so they do not depend on the batch. The
    seeds travel through pinned memory, non-blocking (``feed.seeds_on_device``)."""
    seeds = feed.seeds_on_device(batch_keys, device)
    if run.decode_on_device and device_decode.is_encoded(images):  # files' bytes (not decoded ahead) -> uint8
        images = device_decode.decode_batch(list(images), device, stats=run.decode_stats)
    return [pipeline(images, seeds, view=v) for v, pipeline in enumerate(run.device_views)]


@dataclass
class EpochLoop:
    """What the steps of one epoch share: where it is, the meter on the device, the progress bar, the
    checkpoint saver, the feeder and the batch it has issued ahead (see ``epoch_step``)."""

    epoch: int
    steps: int  # batches in the epoch
    meter: EpochMeter
    bar: object
    saver: CheckpointSaver
    feeder: feed.Feeder
    upcoming: feed.DeviceBatch | None = None


def begin_epoch(s: Session, epoch: int, start_step: int, saver: CheckpointSaver) -> EpochLoop:
    """Set the epoch up from ``start_step`` on (a resumed epoch skips the steps it did) and issue its first
    batch to the device."""
    run, o = s.run, s.run.optim
    run.model.train()
    run.method.on_epoch_start(epoch)
    batches = sampled_batches(run, s.seed, epoch)
    keys = run.loader.samples.train_keys(batches, start_step, epoch, s.rank, s.world)
    build = None if run.device_views is None else (lambda images, k: augment_on_device(run, images, k, s.device))
    if run.resident is not None:  # gathered on the device (resident_data)
        host_batches = feed.resident_batches(*run.resident, keys, s.device)
    else:
        loaded = run.loader.run(keys)
        if run.decode_on_device:  # batch k+1 decoded in a background thread while batch k trains
            loaded = device_decode.decode_ahead(loaded, s.device, run.decode_stats)
        host_batches = zip(loaded, keys)
    feeder = feed.Feeder(host_batches, s.device, build, run.decode_on_device)
    bar = progress_bar(len(batches), start_step, run.train.progress and s.main, f"epoch {epoch + 1}/{o.epochs}")
    loop = EpochLoop(epoch, len(batches), EpochMeter(s.device, len(batches) - start_step, start_step), bar, saver,
                     feeder)
    loop.upcoming = feeder.prepare()
    return loop


def epoch_step(s: Session, loop: EpochLoop, step: int) -> None:
    """The whole of one step of ``train_epoch`` (benchmarks/gpu_launches.py counts this function): train on
    the batch issued ahead, add to the meter on the device, issue the next batch's copy and augmentation (a
    side stream on CUDA, so they overlap this step), then the host's bookkeeping. No host-device sync, except
    the meter's read every train.log_every steps and before a checkpoint."""
    views, labels = loop.feeder.take(loop.upcoming)
    out = train_step(s, views, labels, loop.epoch, step)
    loop.meter.add(out, out["loss"], labels)
    loop.upcoming = loop.feeder.prepare()
    done, log_every = step + 1, s.run.train.log_every
    fresh = done < loop.steps and log_every > 0 and (done - loop.meter.first_step) % log_every == 0
    if fresh:
        read_meter(s, loop)
    loop.meter.show(loop.bar, fresh)
    heartbeat(s, loop.meter, loop.epoch, done, loop.steps)
    loop.saver.after_step(s.run, s.optimizer, s.scaler, epoch=loop.epoch, next_step=done, steps_in_epoch=loop.steps,
                          iteration=s.iteration, before_save=lambda: read_meter(s, loop))


def read_meter(s: Session, loop: EpochLoop, agree: bool = True) -> None:
    """Bring the meter's sums to the host (one sync) and stop the run if a loss since the epoch began was not
    finite, naming the step where it first was: a diverged update is never logged, checkpointed or reported as
    healthy. ``agree``: every process stops together (a collective, so all processes must read here)."""
    bad = loop.meter.read()
    if agree:
        bad = first_non_finite_everywhere(bad, s.world)
    if bad is not None:
        step, value = bad
        raise NonFiniteLossError(non_finite_loss_message(value, loop.epoch, step, s.run.train.precision,
                                                         s.spec.config["method"]["name"], s.run.optim.lr))


def train_epoch(s: Session, epoch: int, start_step: int, saver: CheckpointSaver) -> EpochMeter:
    """The epoch's training steps from ``start_step`` on, then the meter read once (summed over processes).
    If a step raises after a loss already went non-finite, the non-finite loss is the error reported."""
    loop = begin_epoch(s, epoch, start_step, saver)
    try:
        for step in range(start_step, loop.steps):
            epoch_step(s, loop, step)
    except NonFiniteLossError:
        raise
    except Exception:
        bad = None
        with contextlib.suppress(Exception):  # a broken device cannot be read: the original error stands
            bad = loop.meter.read()
        if bad is not None:
            read_meter(s, loop, agree=False)  # raises NonFiniteLossError, chained to the original error
        raise
    finally:
        loop.bar.close()
    read_meter(s, loop)
    loop.meter.all_reduce(s.world)
    return loop.meter


def epoch_record(s: Session, meter: EpochMeter, epoch: int) -> dict:
    """The epoch's log row, with test metrics when train.eval_every asks (not after the last epoch:
    the final evaluation follows); logged by rank 0 and reported."""
    run, o = s.run, s.run.optim
    row = meter.row(epoch, s.optimizer.param_groups[0]["lr"])
    row["threads"] = s.threads  # per epoch: a run resumed under another thread count is seen (session_numerics)
    if run.decode_on_device:  # files decoded on the CPU instead of the device this epoch (device_decode)
        row.update(run.decode_stats.take_epoch(distributed.all_reduce_sum))
    if run.eval.select == "best_val":
        track_best_val(s, row, epoch)
    if run.train.eval_every and (epoch + 1) % run.train.eval_every == 0 and epoch + 1 < o.epochs:
        metrics = evaluate_after(s, epoch + 1)
        row["test"] = headline(metrics)
        if "val" in metrics:  # the validation curve (a search's sampler may prune on it), beside the test curve
            row.setdefault("val", headline(metrics["val"]))
    if s.main:
        store.append_jsonl(Path(s.spec.run_dir) / store.LOG, row)
        if s.loggers is not None:
            s.loggers.log(row)
    s.say(f"epoch {epoch + 1}/{o.epochs} loss {row['loss']:.4f} train_acc {row['train_acc']:.3f} "
          f"lr {row['lr']:.4g} {row['images_per_s']:.{0 if row['images_per_s'] >= 10 else 2}f} img/s"
          + (f" test_all {row['test']['all']:.4f}" if "test" in row else ""))
    return row


def parameter_counts(backbone: nn.Module, method: nn.Module) -> dict:
    """result.json 'parameters': what a row's model costs. Total and trainable parameters of the backbone (the
    network: for SADE, the experts it built) and of the method's own modules (heads, projections; a parameter
    shared by both counted once, in the backbone), their sums, and the backbone's ``parameter_report()`` (a
    Backbone hook: what its tuning trains) as 'backbone_tuning'."""
    seen = {id(p) for p in backbone.parameters()}
    own = [p for p in method.parameters() if id(p) not in seen]
    out = {"backbone": {"total": sum(p.numel() for p in backbone.parameters()),
                        "trainable": sum(p.numel() for p in backbone.parameters() if p.requires_grad)},
           "method": {"total": sum(p.numel() for p in own), "trainable": sum(p.numel() for p in own if p.requires_grad)}}
    out["total"] = out["backbone"]["total"] + out["method"]["total"]
    out["trainable"] = out["backbone"]["trainable"] + out["method"]["trainable"]
    report = getattr(backbone, "parameter_report", None)
    if callable(report):
        out["backbone_tuning"] = report()
    return out


def final_outcome(s: Session, started: float, saver: CheckpointSaver) -> TrainOutcome:
    """Final evaluation, model selection, predictions.npz (rank 0), and the measured outcome."""
    run, run_dir = s.run, Path(s.spec.run_dir)
    if run.eval.select == "best_val":
        load_best_val(s)
    metrics = evaluate_after(s, run.optim.epochs)
    run.loader.close()
    log = store.read_jsonl(run_dir / store.LOG) if s.main else []
    selection = select_model(metrics, log, run.optim.epochs, run.eval.select)
    predictions = metrics.pop(PREDICTION_ARRAYS)
    if run.progress is not None:
        run.progress.writing()
    if s.main:
        save_predictions(run_dir, predictions, run.data.num_classes)
    return TrainOutcome(metrics=metrics, selection=selection, method_extras=run.method.result_extras(),
                        data=data_record(run.data), train_seconds_this_session=time.time() - started,
                        device_seconds=saver.seconds() * s.world, run_started=saver.run_started,
                        threads=s.threads, device=str(s.device), world_size=s.world, views=run.method.views(),
                        numerics=session_numerics(s, log), parameters=parameter_counts(run.backbone, run.method))


def train(spec: RunSpec | dict, run_dir: Path, say: Callable[[str], None] = print,
          on_epoch: Callable[[dict], None] | None = None) -> TrainOutcome:
    """Train (resuming from the run's checkpoint when there is a usable one) and evaluate one run:
    resume -> for each epoch: train steps -> epoch stats -> checkpoint -> evaluate -> select -> record.
    ``on_epoch(row)``: called with each epoch's log row once its checkpoint is written (a search's sampler reports
    the validation curve to its study there, and stops a pruned trial by raising)."""
    benchmark = torch.backends.cudnn.benchmark  # set for the process by prepare_for_device (CUDA)
    entered = time.monotonic()  # the session's cost counts from here: data and model building included
    try:
        spec = dataclasses.replace(RunSpec.coerce(spec), run_dir=str(run_dir))
        s = start_session(spec, say)
        s.run.progress = PhaseBeat(Path(run_dir)) if s.main else None
        saver = CheckpointSaver(Path(run_dir), spec.run_id, minutes=s.run.train.checkpoint_minutes, main=s.main,
                                world=s.world, best_val=s.run.eval.select == "best_val", session_start=entered)
        epoch, start_step, s.iteration = saver.resume(s.run, s.optimizer, s.scaler, s.say)
        distributed.barrier()
        s.run.loader = make_loader(s.run, s.seed, s.run.train.num_workers, s.device)
        if s.main and s.run.train.loggers:
            s.loggers = create_loggers(s.run.train.loggers, Path(run_dir), spec)
        saver.restart_clock()
        started = time.time()
        if s.run.optim.epochs == 0 and epoch == 0:  # evaluation only: the model as built is the final checkpoint
            saver.after_epoch(s.run, s.optimizer, s.scaler, epochs_done=0, iteration=0)
        try:
            while epoch < s.run.optim.epochs:
                meter = train_epoch(s, epoch, start_step, saver)
                row = epoch_record(s, meter, epoch)
                epoch, start_step = epoch + 1, 0
                saver.after_epoch(s.run, s.optimizer, s.scaler, epochs_done=epoch, iteration=s.iteration)
                distributed.barrier()
                if on_epoch is not None:
                    on_epoch(row)
                saver.restart_clock()
            return final_outcome(s, started, saver)
        finally:
            if s.loggers is not None:
                s.loggers.close()
    finally:  # an in-process run (tests, notebooks, benchmarks) leaves cuDNN as it found it
        torch.backends.cudnn.benchmark = benchmark
