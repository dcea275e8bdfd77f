"""The plugin contract, runnable on a user's plugin folder: ``ltbench check FOLDER``.

The repository's own tests check every registered method (tests/test_method_contract.py); a plugin
author has no such suite, so this module runs the same promises on tiny random inputs, in seconds,
and says which one is broken:

* method: ``Config`` defaults validate and ``validate()`` leaves the config unchanged; ``build_model`` gives a
  network with a ``feature_dim`` (checked on a tiny staged backbone); the method is an ``nn.Module``; ``views()`` names views; ``loss()`` returns a dict with a finite 0-dim ``'loss'`` whose
  gradient reaches the features; ``predict()`` returns finite (N, K) scores for any target prior, the same
  for ``None`` and a uniform prior, and does not move predictions *away* from a class the prior favours;
  a ``state_dict`` + ``extra_state`` round trip (as checkpoints do it) gives identical predictions.
* backbone: built as ``cls(cfg, in_channels=...)``, ``feature_dim`` set, forward gives finite (N, feature_dim).
* dataset: ``Config`` defaults validate; ``load()`` gives consistent LTData (or is skipped, with the
  reason, when its files are not on this machine).
* posthoc (stage-2) method: ``Config`` defaults validate; ``fit()`` then ``predict()`` on a tiny frozen run
  gives finite (N, K) scores with the target-prior promises of a method.
* sampler: epochs of len(train) indices, a pure function of (seed, epoch).
* tune mode: ``Config`` defaults validate; the rest is its own ``check(name)`` (the foundation package's: applied
  to a tiny random-weight ViT it gives finite features and gradients to what it trains, and a checkpoint round
  trip gives the same features).
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from ltbench import registry
from ltbench.config import from_dict
from ltbench.data.base import LTData
from ltbench.method import Method, MethodContext
from ltbench.posthoc import FrozenRun, PosthocMethod, SplitInputs
from ltbench.samplers import Sampler, SamplerContext
from ltbench.errors import DataMissingError, LtbenchError, shorten

COUNTS = (40, 20, 10, 5, 2)  # a small long-tailed training set of K = 5 classes
FEATURE_DIM = 16
BATCH = 10


class ContractError(AssertionError):
    """One broken promise of the plugin contract (the message says which and how to fix it)."""


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise ContractError(message)


def default_config(cls: Any, what: str) -> Any:
    """The plugin's default Config, and proof that its validate() only checks (it must not change the config)."""
    config_cls = getattr(cls, "Config", None)
    _expect(config_cls is not None and dataclasses.is_dataclass(config_cls),
            f"{what}: 'Config' must be a dataclass of options (use ltbench.config.EmptyConfig for none)")
    cfg = from_dict(config_cls, {}, what)  # what a recipe gets: types, then validate()
    probe = config_cls()
    before = copy.deepcopy(dataclasses.asdict(probe))
    validate = getattr(probe, "validate", None)
    if callable(validate):
        validate()
    _expect(dataclasses.asdict(probe) == before,
            f"{what}: Config.validate() changed the config; validate must only check "
            f"(fill in derived values in __post_init__)")
    return cfg


# --------------------------------------------------------------------------------------------
# Methods


def _context(feature_dim: int = FEATURE_DIM):
    return MethodContext(num_classes=len(COUNTS), class_counts=torch.tensor(COUNTS), feature_dim=feature_dim,
                         epochs=2)


class _StagedBackbone(nn.Module):
    """A tiny backbone with six ``stages()`` (as torchvision's ResNets: stem, 4 stages, pooling) and features
    of FEATURE_DIM, for a method's ``build_model``."""

    feature_dim = FEATURE_DIM

    def __init__(self):
        super().__init__()
        widths = (6, 8, 8, 12, 12, FEATURE_DIM)
        self.parts = nn.ModuleList([nn.Sequential(nn.Linear(a, b), nn.Tanh()) for a, b in zip(widths, widths[1:])])
        self.parts.append(nn.Identity())

    def stages(self) -> list[nn.Module]:
        return list(self.parts)

    def init_stage(self, module: nn.Module) -> None:
        for sub in module.modules():
            if hasattr(sub, "reset_parameters"):
                sub.reset_parameters()

    def expert_branch(self, count: int, width: float) -> tuple[nn.Module, int]:
        """The last ``count`` stages at ``width`` times their widths (a narrower multi-expert branch)."""
        widths = (6, 8, 8, 12, 12, FEATURE_DIM)
        first = len(widths) - count  # stages[first:] are the branch's: linear stages first..4, then the Identity
        dims = [widths[first]] + [max(1, round(w * width)) for w in widths[first + 1:]]
        parts = [nn.Sequential(nn.Linear(a, b), nn.Tanh()) for a, b in zip(dims, dims[1:])]
        return nn.Sequential(*parts, nn.Identity()), dims[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for part in self.parts:
            x = part(x)
        return x


def model_feature_dim(cls: Any, cfg: Any) -> int:
    """The feature width the method's ``build_model`` gives on a tiny staged backbone (FEATURE_DIM for a
    method that takes the backbone as it is), after checking that the model runs."""
    model = cls.build_model(cfg, _StagedBackbone())
    dim = getattr(model, "feature_dim", None)
    _expect(isinstance(model, nn.Module) and isinstance(dim, int) and dim > 0,
            "build_model() must return an nn.Module with a positive int feature_dim")
    with torch.no_grad():
        out = model.eval()(torch.randn(3, 6))
    _expect(tuple(out.shape) == (3, dim), f"build_model()'s network must give (N, feature_dim) = {(3, dim)}")
    return dim


def _build_method(cls: Any, cfg: Any, seed: int):
    torch.manual_seed(seed)
    method = cls(cfg, _context(model_feature_dim(cls, cfg)))
    _expect(isinstance(method, Method) and isinstance(method, nn.Module),
            "the method must subclass ltbench.method.Method (an nn.Module)")
    return method


def check_training_step(method: Any) -> None:
    k = len(COUNTS)
    views = method.views()
    _expect(isinstance(views, list) and views and all(isinstance(v, str) and v for v in views),
            f"views() must return a non-empty list of view names, got {views!r}")
    labels = torch.arange(BATCH) % k
    for epoch in (0, 1):
        method.train()
        method.on_epoch_start(epoch)
        features = [torch.randn(BATCH, method.ctx.feature_dim, requires_grad=True) for _ in views]
        out = method.loss(features, labels, epoch=epoch)
        _expect(isinstance(out, dict) and "loss" in out,
                f"loss() must return a dict with the key 'loss', got {type(out).__name__} "
                f"{sorted(out) if isinstance(out, dict) else ''}")
        loss = out["loss"]
        _expect(torch.is_tensor(loss) and loss.ndim == 0 and bool(torch.isfinite(loss)),
                f"loss()['loss'] must be a finite 0-dim tensor, got {shorten(repr(loss), 80)} at epoch {epoch}")
        if "logits" in out:
            _expect(tuple(out["logits"].shape) == (BATCH, k),
                    f"loss()['logits'] must be (batch, num_classes) = {(BATCH, k)}, got {tuple(out['logits'].shape)}")
        for key, value in out.items():
            if key not in ("loss", "logits"):
                _expect(torch.is_tensor(value) and value.numel() == 1 and bool(torch.isfinite(value).all()),
                        f"loss()['{key}'] is logged, so it must be a finite scalar tensor")
        loss.backward()
        grads = [f.grad for f in features if f.grad is not None]
        _expect(bool(grads) and all(bool(torch.isfinite(g).all()) for g in grads)
                and any(float(g.abs().sum()) > 0 for g in grads),
                "the loss gradient must reach the backbone features (finite, non-zero)")


def _predict(method: Any, feats: torch.Tensor, prior: torch.Tensor | None, label: str) -> torch.Tensor:
    k = len(COUNTS)
    with torch.no_grad():
        scores = method.predict(feats, target_prior=prior)
        _expect(torch.is_tensor(scores) and tuple(scores.shape) == (len(feats), k),
                f"predict() must return (N, num_classes) = {(len(feats), k)} scores, got "
                f"{tuple(scores.shape) if torch.is_tensor(scores) else type(scores).__name__} ({label} prior)")
        _expect(bool(torch.isfinite(scores).all()), f"predict() returned non-finite scores ({label} prior)")
        for head, s in method.head_predictions(feats, target_prior=prior).items():
            _expect(tuple(s.shape) == (len(feats), k), f"head_predictions()['{head}'] must be (N, num_classes)")
    return scores


def check_prediction(method: Any) -> None:
    k = len(COUNTS)
    method.eval()
    feats = torch.randn(64, method.ctx.feature_dim, generator=torch.Generator().manual_seed(1))
    balanced = _predict(method, feats, None, "None")
    uniform = _predict(method, feats, torch.full((k,), 1.0 / k), "uniform")
    _expect(torch.allclose(balanced, uniform, atol=1e-5, rtol=1e-5),
            "predict() must give the same scores for target_prior=None and a uniform prior (both mean a balanced "
            "test set); use self.target_shift(target_prior, scores), which is zero for both")
    for c in range(k):
        peaked = torch.full((k,), 1e-3)
        peaked[c] = 1.0
        shifted = _predict(method, feats, peaked / peaked.sum(), f"peaked on class {c}")
        _expect(int((shifted.argmax(1) == c).sum()) >= int((balanced.argmax(1) == c).sum()),
                f"a target prior favouring class {c} made fewer predictions of class {c}; the target-prior "
                f"term has the wrong sign (add log p_t, i.e. self.target_shift)")


def check_state_round_trip(cls: Any, cfg: Any, method: Any) -> None:
    buffer = io.BytesIO()
    torch.save({"model": method.state_dict(), "extra": method.extra_state()}, buffer)
    buffer.seek(0)
    try:
        state = torch.load(buffer, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ContractError(f"extra_state() must hold only tensors and plain data (checkpoints load with "
                            f"weights_only=True): {shorten(str(exc), 120)}") from None
    fresh = _build_method(cls, cfg, seed=12345)
    fresh.load_state_dict(state["model"])
    fresh.load_extra_state(state["extra"])
    fresh.eval()
    method.eval()
    feats = torch.randn(16, method.ctx.feature_dim, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        same = torch.equal(method.predict(feats), fresh.predict(feats))
    _expect(same, "predictions differ after a state_dict/extra_state round trip; register state as buffers "
                  "or return it from extra_state()")
    try:
        json.dumps(method.result_extras())
    except (TypeError, ValueError) as exc:
        raise ContractError(f"result_extras() must be JSON data: {exc}") from None


def check_adaptation(method: Any) -> None:
    """For a method with test_time_views(): adapt() on unlabeled features returns JSON data, predictions stay
    finite (N, K), and reset_adaptation() restores the trained model's predictions."""
    views = method.test_time_views()
    if not views:
        return
    method.eval()
    gen = torch.Generator().manual_seed(3)
    feats = torch.randn(32, method.ctx.feature_dim, generator=gen)
    before = _predict(method, feats, None, "None")
    with torch.enable_grad():
        record = method.adapt([feats + 0.1 * torch.randn(feats.shape, generator=gen) for _ in views])
    try:
        json.dumps(record)
    except (TypeError, ValueError) as exc:
        raise ContractError(f"adapt() must return JSON data: {exc}") from None
    _predict(method, feats, None, "None, after adapt()")
    method.reset_adaptation()
    _expect(torch.equal(_predict(method, feats, None, "None"), before),
            "reset_adaptation() must restore the predictions of the trained model")


def check_method(cls: Any, name: str) -> None:
    cfg = default_config(cls, f"method {name}")
    method = _build_method(cls, cfg, seed=0)
    check_training_step(method)
    check_prediction(method)
    check_adaptation(method)
    check_state_round_trip(cls, cfg, method)


# --------------------------------------------------------------------------------------------
# Stage-2 (posthoc) methods


class ContractLinearHead(Method):
    """The trained method of the contract's FrozenRun: one linear head whose scores are balanced, the shape
    of most runs' classifier (stage-2 methods find it as ``method.head``). The core's own, not registered,
    so checking a stage-2 plugin needs no particular built-in method (it used to build the built-in LA)."""

    registered_name = "contract_linear_head"

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)

    def predict(self, features, *, target_prior=None):
        scores = self.head(features)
        return scores + self.target_shift(target_prior, scores)


def tiny_frozen_run():
    """A FrozenRun of random features under an untrained linear head: enough for the stage-2 promises."""
    gen = torch.Generator().manual_seed(0)
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate(COUNTS)])
    split = lambda y: SplitInputs(torch.rand(len(y), FEATURE_DIM, generator=gen), y)  # noqa: E731
    torch.manual_seed(0)
    method = ContractLinearHead(None, _context()).eval()
    config = {"method": {"name": method.registered_name}, "eval": {}, "seed": 0}
    test = torch.arange(len(COUNTS)).repeat(4)
    return FrozenRun("contract", config, torch.tensor(COUNTS), method, {"train": split(labels), "test": split(test)})


def check_posthoc(cls: Any, name: str) -> None:
    """Default config validates; fit(); predict() gives finite (N, K) scores, the same for None and a
    uniform prior, and a prior favouring a class never moves predictions away from it."""
    cfg = default_config(cls, f"posthoc {name}")
    frozen = tiny_frozen_run()
    clf = cls(cfg, frozen, 0)
    _expect(isinstance(clf, PosthocMethod), "a stage-2 method must subclass ltbench.posthoc.PosthocMethod")
    clf.fit()
    test, k = frozen.splits["test"], frozen.num_classes
    with torch.no_grad():
        scores = clf.predict(test, target_prior=None)
        _expect(torch.is_tensor(scores) and tuple(scores.shape) == (len(test), k),
                f"predict() must return (N, K) = {(len(test), k)} scores")
        _expect(bool(torch.isfinite(scores).all()), "predict() returned non-finite scores")
        _expect(torch.allclose(scores, clf.predict(test, target_prior=torch.full((k,), 1.0 / k))),
                "predict() must give the same scores for target_prior None and a uniform prior")
        favour = torch.full((k,), 1e-3)
        favour[k - 1] = 1.0
        moved = clf.predict(test, target_prior=favour).argmax(1)
        _expect(int((moved == k - 1).sum()) >= int((scores.argmax(1) == k - 1).sum()),
                "a target prior favouring a class must not move predictions away from it")


# --------------------------------------------------------------------------------------------
# Backbones and datasets


def check_backbone(cls: Any, name: str) -> None:
    cfg = default_config(cls, f"backbone {name}")
    for channels in (3, 1):
        try:
            net = cls(cfg, in_channels=channels)
        except DataMissingError as exc:  # a pretrained backbone whose weights file is not here
            raise Skipped(f"not built: {shorten(str(exc), 160)}") from None
        _expect(isinstance(net, nn.Module), "a backbone must be an nn.Module")
        dim = getattr(net, "feature_dim", None)
        _expect(isinstance(dim, int) and dim > 0, "a backbone must set self.feature_dim (a positive int)")
        net.eval()
        with torch.no_grad():
            out = net(torch.rand(2, channels, 32, 32))
        _expect(torch.is_tensor(out) and tuple(out.shape) == (2, dim),
                f"forward(images) must return (N, feature_dim) = {(2, dim)}, got "
                f"{tuple(out.shape) if torch.is_tensor(out) else type(out).__name__} (in_channels={channels})")
        _expect(bool(torch.isfinite(out).all()), "forward() returned non-finite features")


class Skipped(Exception):
    """A check that could not run (a dataset whose files are not here): printed 'skipped', never 'ok'."""


DATA_OPTIONS: dict[str, list[dict]] = {}  # dataset name -> data options to check it with (check_recipe)
DATA_ROOT: list[str] = []  # --data-root: given to every dataset whose Config has a 'root' option


def _dataset_configs(cls: Any, name: str) -> list[Any]:
    """The configs to load a dataset with: the recipe's data sections for it (``check RECIPE``), else its
    defaults, with ``--data-root`` as ``root`` when the dataset takes one."""
    default_config(cls, f"dataset {name}")  # the defaults validate without changing, whatever is loaded
    options = DATA_OPTIONS.get(name) or [{}]
    fields = {f.name for f in dataclasses.fields(cls.Config)}
    if DATA_ROOT and "root" in fields:
        options = [{**o, "root": DATA_ROOT[0]} for o in options]
    return [from_dict(cls.Config, o, f"dataset {name}") for o in options]


def check_dataset(cls: Any, name: str) -> str:
    notes = []
    for cfg in _dataset_configs(cls, name):
        try:
            data = cls(cfg).load()
        except DataMissingError as exc:
            raise Skipped(f"nothing loaded, its files are not here ({shorten(str(exc), 120)}); give "
                          f"--data-root DIR, or check the recipe that uses it (ltbench check RECIPE)") from None
        notes.append(_check_loaded(data))
    return "; ".join(notes)


def _check_loaded(data: Any) -> str:
    import numpy as np


    _expect(isinstance(data, LTData), f"load() must return ltbench.data.LTData, got {type(data).__name__}")
    k = data.num_classes
    for split, labels, dataset in (("train", data.train_labels, data.train), ("test", data.test_labels, data.test)):
        labels = np.asarray(labels)
        _expect(len(dataset) == len(labels) > 0, f"{split}: len(dataset) must equal len({split}_labels) > 0")
        _expect(int(labels.min()) >= 0 and int(labels.max()) < k, f"{split} labels must be in 0..{k - 1}")
        image, label = dataset[0]
        _expect(torch.is_tensor(image) and image.dtype == torch.uint8 and image.ndim == 3
                and image.shape[0] == data.image.channels,
                f"{split}[0] must be (uint8 tensor C x H x W with C = image.channels, label)")
        _expect(int(label) == int(labels[0]), f"{split}[0] label differs from {split}_labels[0]")
    return f"loaded: {k} classes, {len(data.train_labels)} train / {len(data.test_labels)} test images"


def check_sampler(cls: Any, name: str) -> str:
    """A sampler's epoch is len(train) indices into the training set, a pure function of (seed, epoch):
    the same from a fresh instance (no hidden state, so resume and DDP ranks agree) and different across
    epochs or seeds (so it is not one fixed order)."""
    import numpy as np


    _expect(isinstance(cls, type) and issubclass(cls, Sampler), "a sampler must subclass ltbench.samplers.Sampler")
    labels = np.repeat(np.arange(5), [40, 20, 9, 4, 2])
    ctx = SamplerContext(labels, 5, epochs=10)
    cfg = default_config(cls, "sampler")
    orders = {(s, e): np.asarray(cls(cfg, ctx).epoch_order(s, e)) for s in (0, 1) for e in (0, 9)}
    first = orders[(0, 0)]
    _expect(first.shape == (len(labels),), f"epoch_order() must give len(train) = {len(labels)} indices, got shape {first.shape}")
    _expect(np.issubdtype(first.dtype, np.integer) and first.min() >= 0 and first.max() < len(labels),
            "epoch_order() must give integer indices into the training set")
    _expect(np.array_equal(cls(cfg, ctx).epoch_order(0, 0), first), "epoch_order(seed, epoch) must not depend on "
            "earlier calls or instances (a pure function of seed and epoch)")
    _expect(len({o.tobytes() for o in orders.values()}) > 1, "epoch_order() gives the same order for every seed and epoch")
    law = cls(cfg, ctx).class_probabilities(0)
    if law is not None:
        _expect(len(law) == 5 and abs(float(np.sum(law)) - 1.0) < 1e-6 and min(law) >= 0,
                "class_probabilities() must be a distribution over the classes")
    return f"epochs of {len(labels)} draws, seeded per (seed, epoch)"


def check_tune_mode(cls: Any, name: str) -> str:
    """A tune mode changes backbones the core does not know: its defaults validate here, the rest is the
    ``check(name)`` its base class gives (the package that defines the backbones it tunes knows how to build one)."""
    _expect(callable(getattr(cls, "check", None)), "a tune mode must subclass the TuneMode of the backbones it "
            "tunes (docs/adding-a-tune-mode.md), which gives its check(name)")
    default_config(cls, f"tune mode {name}")
    return cls.check(name)


# --------------------------------------------------------------------------------------------
# The command


CHECKS: dict[str, Callable[[Any, str], Any]] = {"methods": check_method, "backbones": check_backbone,
                                               "datasets": check_dataset, "posthoc": check_posthoc,
                                               "samplers": check_sampler, "tune_modes": check_tune_mode}


def _defined_in(module: str, folder: Path) -> bool:
    """Whether ``module`` was loaded from a file inside ``folder``. Why: the repository's own ``methods/`` folder
    is registered through the built-in entry point, not as a plugin folder, and `ltbench check methods` must
    still check what it defines."""
    file = getattr(sys.modules.get(module), "__file__", None)
    return file is not None and Path(file).resolve().is_relative_to(folder)


def check_plugin_folder(folder: str | Path, data_root: str | None = None) -> int:
    """Import a plugin folder and run the contract on everything it registers; 0 if all pass, 1 if not.
    A dataset whose files are not here is 'skipped' (nothing was loaded, so nothing was checked)."""
    path = Path(folder).expanduser().resolve()
    registry.add_plugin_paths([path])
    label = f"plugin folder {path}"
    found = [(kind, e) for kind, reg in registry.REGISTRIES.items() for e in reg.entries()
             if e.source == label or _defined_in(e.module, path)]
    if not found:
        raise LtbenchError(f"{folder}: registers no method, backbone or dataset, nor a sampler, a stage-2 method or "
                           f"a tune mode (a module in it must use @METHODS.register / @BACKBONES.register / "
                           f"@DATASETS.register / @SAMPLERS.register / @POSTHOC.register / @TUNE_MODES.register; modules whose name "
                           f"starts with '_' are not imported)")
    DATA_ROOT[:] = [str(Path(data_root).expanduser())] if data_root else []
    return _run_checks(found)


def check_recipe(recipe: Any, data_root: str | None = None) -> int:
    """``ltbench check RECIPE`` (``recipe``: a loaded ``ltbench.recipe.Recipe``, so its plugins are imported):
    the contract on every plugin the recipe's folders register, each dataset loaded with the recipe's own
    data sections (its root, split, imbalance), so 'loaded' means this recipe's data."""
    DATA_OPTIONS.clear()
    for spec in recipe.runs:
        data = dict(spec.config["data"])
        options = DATA_OPTIONS.setdefault(data.pop("name"), [])
        if data not in options:
            options.append(data)
    DATA_ROOT[:] = [str(Path(data_root).expanduser())] if data_root else []
    folders = {f"plugin folder {Path(p).resolve()}" for p in recipe.plugins}
    found = [(kind, e) for kind, reg in registry.REGISTRIES.items() for e in reg.entries()
             if e.source in folders or (kind == "datasets" and e.name in DATA_OPTIONS)]
    try:
        return _run_checks(found)
    finally:
        DATA_OPTIONS.clear()


def _run_checks(found: list) -> int:
    failures = skipped = 0
    for kind, entry in found:
        what = f"{registry.REGISTRIES[kind].kind} {entry.name} ({entry.module})"
        try:
            note = CHECKS[kind](entry.obj, entry.name)
            print(f"ok    {what}" + (f": {note}" if note else ""))
        except Skipped as exc:
            skipped += 1
            print(f"skipped {what}: {exc}")
        except (ContractError, LtbenchError) as exc:
            failures += 1
            print(f"FAIL  {what}: {exc}")
        except Exception as exc:  # the plugin's own code raised: name where
            failures += 1
            print(f"FAIL  {what}: raised {type(exc).__name__}: {shorten(str(exc), 200)}")
    passed = len(found) - failures - skipped
    print(f"{passed} of {len(found)} plugin(s) pass the contract"
          + (f", {skipped} skipped (nothing loaded: not checked)" if skipped else ""))
    return 0 if failures == 0 else 1
