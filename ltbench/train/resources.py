"""The memory a run's configuration asks for, estimated and bounded before the first run.

Why: every option of a recipe is checked against its own range, but options each in range can together
ask for tens of GB (a large validation split, projection heads of 65,536 dimensions, a large batch of
several views). Such a run passed ``--dry-run`` and the launch, then died of an out-of-memory kill (or
swapped the machine to a halt) minutes in. So ``ltbench run`` and ``--dry-run`` (``launch.checks_before_any_run``)
estimate each distinct configuration from what it states, without allocating it:

* **data**: what the dataset's ``load`` holds in host memory, from its options (``DatasetBuilder.footprint``,
  ltbench/data/footprints.py for the built-in datasets; the validation split included);
* **model**: the backbone (or the method's network built from it) and the method, built on PyTorch's
  ``meta`` device (shapes only, no memory): parameters four times (weights, gradients, SGD momentum, and the
  checkpoint's copy), buffers once;
* **step**: the activations one training step keeps for the backward pass: the outputs of every leaf module
  of the network on one image of each view (meta device again; in-place ones skipped), times the batch.

What is not counted (the method's own loss tensors, the evaluation pass, allocator slack) makes this an
estimate from below: a configuration refused here could not have run. It is refused when it exceeds the
memory a run may use: on the training device when that is a GPU (the smallest visible one, shared by
``runs_per_gpu`` runs), in host memory otherwise (this machine's physical memory or cgroup limit shared by
the workers that run at once; on Slurm ``launcher.mem_gb``). ``$LTBENCH_MEMORY_GB`` states the host bound
instead (a login node launching for bigger machines, say). A dataset without a footprint is not estimated, nor
the model of a backbone or method class that sets ``meta_estimate = False`` (one whose constructor reads
weights from files, which a check before every launch must not do).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from ltbench import registry
from ltbench.config import ConfigError
from ltbench.data.base import DataFootprint
from ltbench.data.footprints import footprint_of
from ltbench.method import MethodContext, build_method_model, create_method
from ltbench.registry import BACKBONES, DATASETS, METHODS

MEMORY_ENV = "LTBENCH_MEMORY_GB"
GiB = 1024 ** 3
STATE_COPIES = 4  # weights, gradients, SGD momentum, the checkpoint's serialised copy


@dataclass(frozen=True)
class Estimate:
    """Bytes a run needs: ``data`` in host memory, ``model`` and ``step`` on the training device."""

    data: int
    model: int
    step: int
    batch: int
    views: int

    @property
    def total(self) -> int:
        return self.data + self.model + self.step


_estimates: dict[str, Estimate | None] = {}  # by estimate_key; filled from the launcher's cache (known_estimates)


def estimate_key(config: dict) -> str:
    return repr((config["data"], config["backbone"], config["method"], config["optim"].get("batch_size")))


def known_estimates(known: dict | None = None) -> dict:
    """The estimates made or known so far as plain data ({key: [data, model, step, batch, views] or None}),
    after adding ``known`` ones (ltbench/recipe/expansion.py keeps them between launches)."""
    for key, numbers in (known or {}).items():
        _estimates.setdefault(key, None if numbers is None else Estimate(*numbers))
    return {k: None if e is None else [e.data, e.model, e.step, e.batch, e.views] for k, e in _estimates.items()}


def estimate(config: dict) -> Estimate | None:
    """The memory estimate of one run's configuration (the module docstring says what it counts), or None
    when the dataset does not say its footprint. Plugin code runs here (footprint, constructors on the meta
    device): contained, and a model that cannot be built from the configuration is refused like bad input."""
    key = estimate_key(config)
    if key not in _estimates:
        _estimates[key] = _estimate(config)
    return _estimates[key]


def _estimate(config: dict) -> Estimate | None:
    label = DATASETS.label(config["data"]["name"])
    builder = registry.call_plugin(label, "its constructor", DATASETS.build, config["data"], where="data")
    footprint = registry.call_plugin(label, "footprint()", footprint_of(builder))
    if footprint is None:
        return None
    footprint = registry.checked_return(label, "footprint()", footprint, DataFootprint)
    if footprint.num_classes < 2:
        raise ConfigError(f"data: {label} has {footprint.num_classes} class(es) with these options; a long-tailed "
                          f"benchmark needs at least 2")
    batch = int(config["optim"]["batch_size"])
    built = _meta_network(config, footprint)
    if built is None:
        return Estimate(footprint.memory_bytes, 0, 0, batch, 1)
    network, method = built
    views = max(1, len(registry.call_plugin(f"method '{config['method']['name']}'", "views()", method.views) or []))
    model = sum(STATE_COPIES * p.numel() * p.element_size() for m in (network, method) for p in m.parameters())
    model += sum(b.numel() * b.element_size() for m in (network, method) for b in m.buffers())
    per_image = _activation_bytes(network, footprint)
    return Estimate(footprint.memory_bytes, model, batch * views * per_image, batch, views)


def _meta_network(config: dict, footprint: DataFootprint) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(network, method) built on the meta device from the run's configuration, or None when a plugin cannot
    be built there (an estimate is then data only). A ValueError or TypeError while building is the
    configuration's (SADE's expert_stages beyond the backbone's stages): refused as bad input."""
    method_spec = config["method"]
    plugins = (BACKBONES.get(config["backbone"]["name"]), METHODS.get(method_spec["name"]))
    if any(getattr(cls, "meta_estimate", True) is False for cls in plugins):  # builds from files: not here
        return None
    try:
        with torch.device("meta"):
            backbone = BACKBONES.build(config["backbone"], in_channels=footprint.channels, where="backbone")
            network = build_method_model(method_spec, backbone)
        counts = torch.ones(footprint.num_classes, dtype=torch.long, device="cpu")
        ctx = MethodContext(num_classes=footprint.num_classes, class_counts=counts,
                            feature_dim=network.feature_dim, epochs=int(config["optim"]["epochs"]))
        with torch.device("meta"):
            method = create_method(method_spec, ctx)
        return network, method
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"method: {method_spec['name']} on backbone {config['backbone']['name']}: the model "
                          f"cannot be built from these options: {exc}") from None
    except registry.RegistryError:
        raise
    except Exception:  # noqa: BLE001 - a plugin that needs real tensors to build: not estimated
        return None


def _activation_bytes(network: torch.nn.Module, footprint: DataFootprint) -> int:
    """Bytes of the outputs of every leaf module on one image (meta device), in-place ones skipped (they
    share their input's memory): what autograd keeps of one image for the backward pass, about."""
    total = 0

    def add(module, inputs, output):
        nonlocal total
        if isinstance(output, torch.Tensor) and not getattr(module, "inplace", False):
            total += output.numel() * output.element_size()

    leaves = [m for m in network.modules() if not any(True for _ in m.children())]
    hooks = [m.register_forward_hook(add) for m in leaves]
    try:
        with torch.no_grad():
            network(torch.empty(1, footprint.channels, footprint.image_size, footprint.image_size, device="meta"))
    except Exception:  # noqa: BLE001 - a network that cannot run on the meta device: not estimated
        return 0
    finally:
        for h in hooks:
            h.remove()
    return total


# ------------------------------------------------------------------------------------------------
# The bounds, and the check a launch makes


def host_memory() -> int:
    """This machine's physical memory, or the container's cgroup limit when that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(path).read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def bounds(launcher: Any, runs_at_once: int) -> tuple[int, str, int | None, str]:
    """(host bytes per run, where that bound comes from, device bytes per run or None, where from)."""
    if os.environ.get(MEMORY_ENV):
        try:
            host, said = int(float(os.environ[MEMORY_ENV]) * GiB), f"${MEMORY_ENV}"
        except ValueError:
            raise ConfigError(f"${MEMORY_ENV}: expected a number of GiB, got {os.environ[MEMORY_ENV][:40]!r}") from None
    elif launcher.name == "slurm":
        host, said = int(launcher.mem_gb * GiB), "launcher.mem_gb"
    else:
        share = max(1, runs_at_once)
        host = host_memory() // share
        said = f"this machine's {host_memory() / GiB:.1f} GiB" + (f" shared by the {share} runs at once" if share > 1 else "")
    if launcher.name != "local" or not torch.cuda.is_available() or not torch.cuda.device_count():
        return host, said, None, ""
    smallest = min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
    per_gpu = max(1, launcher.runs_per_gpu)
    return host, said, smallest // per_gpu, f"the GPU's {smallest / GiB:.1f} GiB" + (
        f" shared by {per_gpu} runs (runs_per_gpu)" if per_gpu > 1 else "")


def check_data(specs, launcher, where: str) -> None:
    """``ltbench data`` loads each distinct dataset in this process: its footprint against this machine's memory
    first, so a huge split is one line, not an allocation failure (the model is not built there)."""
    host, said, _, _ = bounds(launcher, 1)
    for spec in specs:
        est = estimate(spec.config)
        if est is not None and est.data > host:
            raise ConfigError(f"{where}: data: loading it needs about {est.data / GiB:.1f} GiB of memory, more than {said}; "
                              f"lower the data: options ({_options(spec.config['data'])}), or set "
                              f"${MEMORY_ENV} if this machine has more")


def check_recipe(recipe) -> None:
    """Refuse, before any run, a configuration whose estimate exceeds the memory a run may use: one
    ConfigError naming the run, the parts of the estimate, the bound and the settings that drive it."""
    runs_at_once = min(len(recipe.runs), recipe.launcher.jobs) if recipe.launcher.name == "local" else 1
    host, host_said, device, device_said = bounds(recipe.launcher, runs_at_once)
    for spec in recipe.runs:
        try:
            est = estimate(spec.config)
        except ConfigError as exc:  # the model cannot be built from the run's options: named with the recipe
            raise ConfigError(f"{recipe.path}: {exc}") from None
        if est is None:
            continue
        on_device = device is not None and (est.model + est.step) > device
        if est.data > host or (device is None and est.total > host) or on_device:
            bound, said = (device, device_said) if on_device else (host, host_said)
            raise ConfigError(refusal(recipe, spec, est, bound, said))


def refusal(recipe, spec, est: Estimate, bound: int, said: str) -> str:
    parts = {"data": est.data, "model": est.model, "step": est.step}
    biggest = max(parts, key=parts.get)
    settings = {"data": f"the data: options (data: {_options(spec.config['data'])})",
                "model": f"the method and backbone options (method: {_options(spec.config['method'])}; backbone: "
                         f"{spec.config['backbone']['name']})",
                "step": f"optim.batch_size ({est.batch}), the method's views ({est.views}) or the image size"}[biggest]
    return (f"{recipe.path}: run {spec.run_id} needs about {est.total / GiB:.1f} GiB of memory (data "
            f"{est.data / GiB:.1f}, model {est.model / GiB:.1f}, one training step {est.step / GiB:.1f} GiB at batch "
            f"{est.batch} x {est.views} view(s)), more than {said} ({bound / GiB:.1f} GiB for it); lower {settings}, "
            f"or set ${MEMORY_ENV} if the machine that trains it has more")


def _options(section: dict) -> str:
    text = ", ".join(f"{k}={v}" for k, v in section.items() if k != "name" and not isinstance(v, (dict, list)))
    return f"{section['name']}" + (f", {text}" if text else "")[:200]
