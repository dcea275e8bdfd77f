"""The training loop every method shares, readable top to bottom.

To follow one run, start at ``train`` (the last function): ``start_session`` builds the run,
``CheckpointSaver.resume`` restores it (ltbench/train/checkpoint.py), then per epoch ``train_epoch`` (one
``train_step`` per batch) -> ``epoch_record`` (log row, optional test metrics) -> the epoch-end
checkpoint; finally ``final_outcome``: ``evaluate``, ``selection.select_model`` and predictions.npz.
What it returns (``record.TrainOutcome``) becomes part of result.json (docs/results-schema.md).

Determinism and resume: the sample order of epoch e comes from a generator seeded with (seed, e) and
the augmentations of sample i in epoch e from torch's RNG reseeded with (seed, e, i). So a run
restarted from a checkpoint taken at (e, step) replays exactly the batches an uninterrupted run would
have seen, and ends with the same weights on CPU; no RNG state needs to be checkpointed. The same
holds with DataLoader workers (any number, persistent for the whole run) and, up to BatchNorm
statistics, with several processes. The speed options keep this, with one caveat each:
train.channels_last and train.threads change float summation order (results equal up to rounding,
so they are not part of the run id); train.compile and, on GPU, cudnn_benchmark choose kernels by
code generation or timing, so two runs, or a run and its resumed copy, may differ in the last bits;
fp16 keeps its loss scale in the checkpoint, so resume stays exact wherever fp32 is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
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

from ltbench.train import distributed
from ltbench.results import store
from ltbench.train.checkpoint import CHECKPOINT_FORMAT, CheckpointSaver, load_checkpoint, save_checkpoint  # noqa: F401
from ltbench.config import EvalConfig, OptimConfig, TrainConfig, from_dict
from ltbench.data import batch_augment, device_decode, transforms
from ltbench.data.base import LTData, MultiView
from ltbench.errors import MethodContractError, NonFiniteLossError
from ltbench.evaluation import label_prior, summarize, target_prior_metrics
from ltbench.train.loggers import create_loggers
from ltbench.method import Method, MethodContext, build_method_model, create_method
from ltbench.results.predictions import PREDICTION_ARRAYS, save_predictions
from ltbench.results.record import TrainOutcome, data_record
from ltbench.registry import BACKBONES, DATASETS
from ltbench.results.runspec import RunSpec
from ltbench.samplers import Sampler, SamplerContext, create_sampler
from ltbench.samplers.uniform import uniform_order
from ltbench.train.selection import headline, select_model
from ltbench.seeding import derive_seed  # noqa: F401 - engine.derive_seed stays importable




def set_threads(train: TrainConfig) -> int:
    threads = train.threads or int(os.environ.get("SLURM_CPUS_PER_TASK", "0") or 0)
    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


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
        run.compiled = torch.compile(run.backbone, backend=cfg.compile)


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
    eval_sets: dict = field(default_factory=dict)  # source name -> (MultiView, labels); see eval_sources
    loader: Loader | None = None  # set by train(); evaluate() falls back to a worker-less one
    compiled: Callable | None = None  # torch.compile'd backbone (train.compile), else None
    sampler: Sampler | None = None  # the epoch order (ltbench/samplers/); None: uniform
    device_views: list | None = None  # train.augment_on: batch: one BatchPipeline per view (see make_loader)
    decode_on_device: bool = False  # the loader hands over encoded files, decoded on the device (device_decode)
    decode_stats: device_decode.DecodeStats = field(default_factory=device_decode.DecodeStats)  # log: decode_*


def backbone_features(run: Run, x: torch.Tensor) -> torch.Tensor:
    """The backbone on a batch, in the memory format and (compiled or not) form the run asked for."""
    if run.train.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return (run.compiled if run.compiled is not None else run.backbone)(x)


def dataset_builder(config: dict):
    return DATASETS.build(config["data"], where="data")


def load_data(config: dict) -> LTData:
    return dataset_builder(config).load()


def build_run(config: dict, data: LTData | None = None) -> Run:
    builder = dataset_builder(config)
    data = data if data is not None else builder.load()
    backbone = BACKBONES.build(config["backbone"], in_channels=data.image.channels, where="backbone")
    backbone = build_method_model(config["method"], backbone)  # the backbone itself, or e.g. a multi-expert net
    optim = from_dict(OptimConfig, config["optim"], "optim")
    ctx = MethodContext(
        num_classes=data.num_classes,
        class_counts=torch.as_tensor(data.class_counts, dtype=torch.long),
        feature_dim=backbone.feature_dim,
        epochs=optim.epochs,
    )
    method = create_method(config["method"], ctx)
    model = nn.ModuleDict({"backbone": backbone, "method": method})
    run = Run(builder, data, backbone, method, model, optim,
              from_dict(TrainConfig, config["train"], "train"), from_dict(EvalConfig, config["eval"], "eval"))
    run.eval_sets = eval_sources(run)
    run.sampler = create_sampler(config.get("sampler"), SamplerContext(data.train_labels, data.num_classes, optim.epochs))
    return run


def make_optimizer(run: Run) -> torch.optim.Optimizer:
    o = run.optim
    groups = run.method.param_groups() or []
    grouped = {id(p) for g in groups for p in g["params"]}
    rest = [p for p in run.model.parameters() if id(p) not in grouped and p.requires_grad]
    return torch.optim.SGD([{"params": rest}, *groups], lr=o.lr, momentum=o.momentum,
                           nesterov=o.nesterov, weight_decay=o.weight_decay)


def lr_factor(o: OptimConfig, iteration: int, iters_per_epoch: int) -> float:
    """Learning-rate multiplier at a global iteration: linear warm-up, then cosine / step / constant."""
    warmup = int(round(o.warmup_epochs * iters_per_epoch))
    total = o.epochs * iters_per_epoch
    if iteration < warmup:
        return (iteration + 1) / warmup
    if o.schedule == "cosine":
        progress = (iteration - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
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
    if run.sampler is None:
        return epoch_batches(n, run.optim.batch_size, seed, epoch)
    order = np.asarray(run.sampler.epoch_order(seed, epoch), dtype=np.int64)
    if order.shape != (n,) or (n and (order.min() < 0 or order.max() >= n)):
        name = getattr(run.sampler, "registered_name", "?")
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

    def eval_keys(self, source: str, batch_size: int) -> list[list]:
        """Keys of one test source in order, in batches. One hash per source, not per image: test passes
        are long and their pipelines usually deterministic."""
        base, n = derive_seed(self.seed, "augment", source), len(self.sources[source])
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
    tf = transforms.build("eval", run.data.image, run.data.pipelines)
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
def view_features(run: Run, device: torch.device, source: str, batch_size: int = 512) -> list[torch.Tensor]:
    """Backbone features of every view of one source, one (N, feature_dim) tensor per view."""
    run.model.eval()
    loader = run.loader if run.loader is not None else make_loader(run, 0, 0, device)
    per_batch = [[backbone_features(run, v.to(device, non_blocking=True)).float() for v in views]
                 for views, _ in loader.run(loader.samples.eval_keys(source, batch_size))]
    return [torch.cat(per_view) for per_view in zip(*per_batch)]


def adapt_to(run: Run, device: torch.device, source: str, record: dict) -> None:
    """Test-time adaptation of the method to one test source (Method.adapt), when it asks for it."""
    run.method.reset_adaptation()
    if run.method.test_time_views():
        with torch.enable_grad():
            record[source] = run.method.adapt(view_features(run, device, f"{source}{ADAPT_SUFFIX}"))


def make_loader(run: Run, seed: int, workers: int, device: torch.device) -> Loader:
    """The run's loader over its training views and all its test sets (see ``Loader``). With
    train.augment_on: batch the loader hands over each training image once, as uint8, and the views are
    built on the device (``augment_on_device``)."""
    names, image, aliases = run.method.views(), run.data.image, run.data.pipelines
    if run.train.augment_on == "batch":
        run.device_views = [batch_augment.build_batch(v, image, aliases) for v in names]
        encoded = device_decode.encoded_source(run.data.train, run.train.augment_on, image.kind, device)
        run.decode_on_device = encoded is not None
        decoded = MultiView(run.data.train, [batch_augment.as_uint8_tensor])
        sources = {"train": encoded if encoded is not None else decoded}
    else:
        sources = {"train": MultiView(run.data.train, [transforms.build(v, image, aliases) for v in names])}
    sources.update({name: ds for name, (ds, _) in run.eval_sets.items()})
    return Loader(SeededSamples(sources, seed), workers, pin_memory=device.type == "cuda")


# ------------------------------------------------------------------------------------------------
# Evaluation


@torch.no_grad()
def test_features(run: Run, device: torch.device, source: str = "test", batch_size: int = 512) -> torch.Tensor:
    """Backbone features of one test source (see eval_sources), loaded through the run's loader, so
    decoding and transforms run in its worker processes when it has any."""
    run.model.eval()
    loader = run.loader if run.loader is not None else make_loader(run, 0, 0, device)
    keys = loader.samples.eval_keys(source, batch_size)
    feats = [backbone_features(run, views[0].to(device, non_blocking=True)).float() for views, _ in loader.run(keys)]
    return torch.cat(feats) if feats else torch.zeros(0, run.backbone.feature_dim, device=device)


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
        return run.method.predict(feats, target_prior=prior_tensor(prior, device)).argmax(1).cpu().numpy()

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
        prediction, s = score_summary(run, run.method.predict(set_feats, target_prior=prior_tensor(prior, device)),
                                      set_labels)
        arrays[f"set:{name}:labels"], arrays[f"set:{name}:head:main"] = set_labels, prediction
        out[name] = {"size": int(len(set_labels)), **headline(s)}
    return out


@torch.no_grad()
def evaluate(run: Run, device: torch.device) -> dict:
    """Metrics on the test set under the uniform target prior, per head, under shifted priors and on
    extra test sets. The argmax per test image behind them (for paired tests, ltbench.results.predictions)
    travels under PREDICTION_ARRAYS; train() takes it out of the metrics and saves it."""
    feats = test_features(run, device)
    labels, k = run.data.test_labels, run.data.num_classes
    adaptation: dict = {}
    adapt_to(run, device, "test", adaptation)
    uniform = torch.full((k,), 1.0 / k, device=device)
    scores = run.method.predict(feats, target_prior=uniform)
    check_scores(scores, len(feats), k, getattr(run.method, "registered_name", "?"), "predict()")
    main_prediction, out = score_summary(run, scores, labels)
    heads = run.method.head_predictions(feats, target_prior=uniform)
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
    scores = run.method.predict(test_features(run, device, "val"), target_prior=None)
    _, summary = score_summary(run, scores, labels)
    return {**headline(summary), "per_class": summary["per_class"], "size": int(len(labels))}


BEST_VAL = "best_val.pt"  # the model of the best validation epoch so far (eval.select: best_val)


def track_best_val(s: Session, row: dict, epoch: int) -> None:
    """eval.select best_val: validate after each epoch; when validation All beats every earlier logged
    epoch (ties keep the earlier), rank 0 saves the model to RUN_DIR/best_val.pt. Done before the log row
    and the epoch checkpoint, so a resumed run replays the epoch and rewrites the same file."""
    row["val"] = headline(evaluate_val(s.run, s.device))
    if not s.main:
        return
    run_dir = Path(s.spec.run_dir)
    earlier = [r["val"]["all"] for r in store.read_jsonl(run_dir / store.LOG) if "val" in r and r["epoch"] <= epoch]
    if row["val"]["all"] is not None and all(row["val"]["all"] > a for a in earlier if a is not None):
        tmp = run_dir / f".{BEST_VAL}.tmp-{os.getpid()}"
        torch.save({"epoch": epoch + 1, "model": s.run.model.state_dict(),
                    "method_extra": s.run.method.extra_state()}, tmp)
        os.replace(tmp, run_dir / BEST_VAL)


def load_best_val(s: Session) -> None:
    """Put the best validation epoch's weights back into the model before the final evaluation."""
    distributed.barrier()
    state = torch.load(Path(s.spec.run_dir) / BEST_VAL, map_location=s.device, weights_only=False)
    s.run.model.load_state_dict(state["model"])
    s.run.method.load_extra_state(state.get("method_extra", {}))


# ------------------------------------------------------------------------------------------------
# The method contract, checked at the first step so a broken method fails in seconds, not at the end

CONTRACT_DOC = "the method contract is in docs/adding-a-method.md"


def check_scores(scores, n: int, k: int, method: str, what: str, finite: bool = True) -> None:
    """Scores from predict() must be a finite tensor of shape (n, k); extra heads need the shape only."""
    if not isinstance(scores, torch.Tensor) or tuple(scores.shape) != (n, k):
        shape = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise MethodContractError(f"method '{method}': {what} returned {shape}, expected a tensor of shape "
                                  f"({n}, {k}) (one score per test image and class); {CONTRACT_DOC}")
    if finite and not bool(torch.isfinite(scores).all()):
        raise MethodContractError(f"method '{method}': {what} returned non-finite scores (NaN or inf); "
                                  f"{CONTRACT_DOC}")


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
        finally:
            method.train(was_training)


def non_finite_loss_message(loss: torch.Tensor, epoch: int, step: int, precision: str, method: str, lr: float) -> str:
    where = f"non-finite loss ({loss.item()}) at epoch {epoch + 1}, step {step + 1}"
    if precision == "bf16":
        return (f"{where} under bf16 autocast: try train.precision=fp32 (bf16 has 8 bits of mantissa), "
                f"or a lower optim.lr (now {lr:g})")
    return (f"{where} in fp32: check the loss of method '{method}' (log of 0, division by a zero count, "
            f"an unbounded margin or scale), or lower optim.lr (now {lr:g})")


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
    threads = set_threads(train_cfg)
    rank, world = distributed.init_from_env()
    if rank != 0:
        say = lambda msg: None  # noqa: E731 - only rank 0 talks and writes
    device = pick_device()
    torch.manual_seed(derive_seed(spec.seed, "init"))
    run = build_run(spec.config)
    prepare_for_device(run, device)
    optimizer = make_optimizer(run)
    scaler = torch.amp.GradScaler(device.type, enabled=run.train.precision == "fp16")
    o = run.optim
    if o.batch_size < world:
        raise ValueError(f"optim.batch_size ({o.batch_size}) must be at least the number of processes ({world})")
    s = Session(spec, run, device, optimizer, scaler, rank, world, threads, say)
    s.iters_per_epoch = len(sampled_batches(run, spec.seed, 0))
    s.base_lrs = [g["lr"] for g in optimizer.param_groups]
    return s


class EpochMeter:
    """Sums over one epoch's steps (loss, accuracy of the training logits, scalar extras), per image."""

    def __init__(self):
        self.sums = {"loss": 0.0, "correct": 0, "seen": 0}
        self.extra: dict[str, float] = {}
        self.t0 = time.perf_counter()

    def add(self, out: dict, loss: torch.Tensor, labels: torch.Tensor) -> None:
        n = len(labels)
        self.sums["loss"] += loss.item() * n
        self.sums["seen"] += n
        if "logits" in out:
            self.sums["correct"] += int((out["logits"].argmax(1) == labels).sum())
        for key, value in out.items():
            if key not in ("loss", "logits") and value.numel() == 1:
                self.extra[key] = self.extra.get(key, 0.0) + float(value) * n

    def show(self, bar) -> None:
        if not bar.disable:  # refresh=False: the bar redraws at most every 0.1 s, in update()
            sums = self.sums
            rate = sums["seen"] / max(time.perf_counter() - self.t0, 1e-9)
            bar.set_postfix(loss=f"{sums['loss'] / sums['seen']:.3f}",
                            acc=f"{sums['correct'] / sums['seen']:.3f}", img_s=f"{rate:.0f}", refresh=False)
        bar.update(1)

    def all_reduce(self, world: int) -> None:
        """Sum over processes (every process then holds the totals)."""
        if world > 1:
            extra_keys = sorted(self.extra)
            totals = distributed.all_reduce_sum([self.sums["loss"], self.sums["correct"], self.sums["seen"]]
                                                + [self.extra[k] for k in extra_keys])
            self.sums = {"loss": totals[0], "correct": int(totals[1]), "seen": int(totals[2])}
            self.extra = dict(zip(extra_keys, totals[3:]))

    def row(self, epoch: int, lr: float) -> dict:
        """The epoch's log.jsonl row (before any test metrics)."""
        seconds = time.perf_counter() - self.t0
        seen = max(self.sums["seen"], 1)
        row = {"epoch": epoch + 1, "loss": self.sums["loss"] / seen, "train_acc": self.sums["correct"] / seen,
               "lr": lr, "seconds": seconds, "images_per_s": self.sums["seen"] / max(seconds, 1e-9)}
        row.update({k: v / seen for k, v in self.extra.items()})
        return row


def train_step(s: Session, views: list[torch.Tensor], labels: torch.Tensor, epoch: int, step: int) -> dict:
    """One optimisation step on a batch already on the device: schedule, forward (all views through one backbone pass, so BatchNorm
    sees them together), contract check at the first step, finiteness, backward, update."""
    run, o = s.run, s.run.optim
    for group, base in zip(s.optimizer.param_groups, s.base_lrs):
        group["lr"] = base * lr_factor(o, s.iteration, s.iters_per_epoch)
    with s.autocast():
        batch = views[0] if len(views) == 1 else torch.cat(views)  # one view: no copy
        features = backbone_features(run, batch).float().split(len(labels))
        out = run.method.loss(list(features), labels, epoch=epoch)
    if not s.contract_checked:
        check_method_contract(run.method, out, list(features), labels)
        s.contract_checked = True
    loss = out["loss"]
    finite = bool(torch.isfinite(loss))
    if s.world > 1:  # every process stops together, or the others would wait forever
        finite = distributed.all_reduce_sum([float(not finite)])[0] == 0
    if not finite:
        raise NonFiniteLossError(non_finite_loss_message(loss, epoch, step, run.train.precision,
                                                         s.spec.config["method"]["name"], o.lr))
    s.optimizer.zero_grad(set_to_none=True)
    s.scaler.scale(loss).backward()  # the scaler is a pass-through unless precision is fp16
    if s.world > 1:
        distributed.average_gradients(run.model.parameters())
    s.scaler.step(s.optimizer)
    s.scaler.update()
    s.iteration += 1
    return out


HEARTBEAT = "progress.json"  # RUN_DIR/progress.json: the running epoch's step, loss, img/s (rank 0)


def heartbeat(s: Session, meter: EpochMeter, epoch: int, steps_done: int, steps: int) -> None:
    """At most once a second, where the epoch is: a launcher shows it before the first epoch ends
    (``ltbench.run.progress``), so a long first epoch is not minutes of silence."""
    now = time.monotonic()
    if not s.main or (now - s.last_heartbeat < 1.0 and steps_done < steps):
        return
    s.last_heartbeat = now
    seen, seconds = max(meter.sums["seen"], 1), time.perf_counter() - meter.t0
    beat = {"epoch": epoch + 1, "epochs": s.run.optim.epochs, "step": steps_done, "steps": steps,
            "loss": meter.sums["loss"] / seen, "images_per_s": meter.sums["seen"] / max(seconds, 1e-9),
            "seconds": seconds}
    path = Path(s.spec.run_dir) / HEARTBEAT
    tmp = path.with_name(HEARTBEAT + ".tmp")  # replaced, not fsynced: a lost beat costs nothing
    tmp.write_text(json.dumps(beat))
    os.replace(tmp, path)


def to_device(images, device: torch.device):
    if isinstance(images, list):
        return [im.to(device, non_blocking=True) for im in images]
    return images.to(device, non_blocking=True)


def augment_on_device(run: Run, images, batch_keys: list[tuple], device: torch.device) -> list[torch.Tensor]:
    """train.augment_on: batch: every view of the batch from its uint8 images, on the training device, each
    sample's draws seeded by its key's seed (run seed, epoch, index), so they do not depend on the batch."""
    seeds = torch.tensor([key[2] for key in batch_keys], dtype=torch.int64, device=device)
    if run.decode_on_device and device_decode.is_encoded(images):  # files' bytes (not decoded ahead) -> uint8
        images = device_decode.decode_batch(list(images), device, stats=run.decode_stats)
    return [pipeline(images, seeds, view=v) for v, pipeline in enumerate(run.device_views)]


def train_epoch(s: Session, epoch: int, start_step: int, saver: CheckpointSaver) -> EpochMeter:
    """The epoch's training steps from ``start_step`` on (a resumed epoch skips the steps it did)."""
    run, o = s.run, s.run.optim
    run.model.train()
    run.method.on_epoch_start(epoch)
    batches = sampled_batches(run, s.seed, epoch)
    meter = EpochMeter()
    bar = progress_bar(len(batches), start_step, run.train.progress and s.main, f"epoch {epoch + 1}/{o.epochs}")
    keys = run.loader.samples.train_keys(batches, start_step, epoch, s.rank, s.world)
    loaded = run.loader.run(keys)
    if run.decode_on_device:  # batch k+1 decoded in a background thread while batch k trains
        loaded = device_decode.decode_ahead(loaded, s.device, run.decode_stats)
    for step, ((views, labels), batch_keys) in enumerate(zip(loaded, keys), start_step):
        views = views if run.decode_on_device else [to_device(v, s.device) for v in views]  # nvJPEG reads host bytes
        labels = labels.to(s.device, non_blocking=True)
        if run.device_views is not None:
            views = augment_on_device(run, views[0], batch_keys, s.device)
        out = train_step(s, views, labels, epoch, step)
        meter.add(out, out["loss"], labels)
        meter.show(bar)
        heartbeat(s, meter, epoch, step + 1, len(batches))
        saver.after_step(run, s.optimizer, s.scaler, epoch=epoch, next_step=step + 1, steps_in_epoch=len(batches),
                         iteration=s.iteration)
    bar.close()
    meter.all_reduce(s.world)
    return meter


def epoch_record(s: Session, meter: EpochMeter, epoch: int) -> dict:
    """The epoch's log row, with test metrics when train.eval_every asks (not after the last epoch:
    the final evaluation follows); logged by rank 0 and reported."""
    run, o = s.run, s.run.optim
    row = meter.row(epoch, s.optimizer.param_groups[0]["lr"])
    if run.decode_on_device:  # files decoded on the CPU instead of the device this epoch (device_decode)
        row.update(run.decode_stats.take_epoch(distributed.all_reduce_sum))
    if run.eval.select == "best_val":
        track_best_val(s, row, epoch)
    if run.train.eval_every and (epoch + 1) % run.train.eval_every == 0 and epoch + 1 < o.epochs:
        row["test"] = headline(evaluate(run, s.device))
    if s.main:
        store.append_jsonl(Path(s.spec.run_dir) / store.LOG, row)
        if s.loggers is not None:
            s.loggers.log(row)
    s.say(f"epoch {epoch + 1}/{o.epochs} loss {row['loss']:.4f} train_acc {row['train_acc']:.3f} "
          f"lr {row['lr']:.4g} {row['images_per_s']:.{0 if row['images_per_s'] >= 10 else 2}f} img/s"
          + (f" test_all {row['test']['all']:.4f}" if "test" in row else ""))
    return row


def final_outcome(s: Session, started: float) -> TrainOutcome:
    """Final evaluation, model selection, predictions.npz (rank 0), and the measured outcome."""
    run, run_dir = s.run, Path(s.spec.run_dir)
    if run.eval.select == "best_val":
        load_best_val(s)
    metrics = evaluate(run, s.device)
    run.loader.close()
    selection = select_model(metrics, store.read_jsonl(run_dir / store.LOG) if s.main else [], run.optim.epochs,
                             run.eval.select)
    predictions = metrics.pop(PREDICTION_ARRAYS)
    if s.main:
        save_predictions(run_dir, predictions, run.data.num_classes)
    return TrainOutcome(metrics=metrics, selection=selection, method_extras=run.method.result_extras(),
                        data=data_record(run.data), train_seconds_this_session=time.time() - started,
                        threads=s.threads, device=str(s.device), world_size=s.world, views=run.method.views())


def train(spec: RunSpec | dict, run_dir: Path, say: Callable[[str], None] = print) -> TrainOutcome:
    """Train (resuming from the run's checkpoint when there is a usable one) and evaluate one run:
    resume -> for each epoch: train steps -> epoch stats -> checkpoint -> evaluate -> select -> record."""
    spec = dataclasses.replace(RunSpec.coerce(spec), run_dir=str(run_dir))
    s = start_session(spec, say)
    saver = CheckpointSaver(Path(run_dir), spec.run_id, minutes=s.run.train.checkpoint_minutes, main=s.main,
                            world=s.world)
    epoch, start_step, s.iteration = saver.resume(s.run, s.optimizer, s.scaler, s.say)
    distributed.barrier()
    s.run.loader = make_loader(s.run, s.seed, s.run.train.num_workers, s.device)
    if s.main and s.run.train.loggers:
        s.loggers = create_loggers(s.run.train.loggers, Path(run_dir), spec)
    saver.restart_clock()
    started = time.time()
    try:
        while epoch < s.run.optim.epochs:
            meter = train_epoch(s, epoch, start_step, saver)
            epoch_record(s, meter, epoch)
            epoch, start_step = epoch + 1, 0
            saver.after_epoch(s.run, s.optimizer, s.scaler, epochs_done=epoch, iteration=s.iteration)
            distributed.barrier()
            saver.restart_clock()
        return final_outcome(s, started)
    finally:
        if s.loggers is not None:
            s.loggers.close()
