"""What a code path would cost a GPU, counted on the CPU: kernel launches and host-device syncs.

A CPU machine cannot time a GPU, but it can count the two things a GPU's host side pays for. Each kernel
launch costs about 5-10 us of host time whatever the kernel does, and each host-device sync (``.item()``,
``bool(t)``, ``nonzero``, a blocking copy) makes the host wait for the device to drain, so nothing queues
ahead. CPU time per core says neither, which is why the project counts them (benchmarks/gpu_launches.py,
tests/test_gpu_cost.py, docs/performance.md).

How: tensors "on the device" are :class:`OnDevice` wrappers that hold a CPU tensor and report the ``meta``
device (standing for ``cuda:0``: a real ``cuda`` device would make torch initialise a driver that is not
there). Inside :func:`counting`, a dispatch mode runs every op on the held CPU tensors, so results are the
CPU's bit for bit, and records

* a **launch** for every op with an output on the device, except views and allocations (no kernel runs);
* a **sync** for ``_local_scalar_dense`` (``item``/``bool``/``int``/``float``), ops whose output size
  depends on the data (``nonzero``, ``unique``, ``masked_select``, boolean-mask indexing), ops that read a
  device value in their own host code (``IN_KERNEL_SYNC``: ``repeat_interleave`` without ``output_size``,
  ``multinomial``), a blocking copy either way (``.tolist()``/``.numpy()`` included), and ``torch.tensor``-style
  creation of Python data on the device; each with the line of project code that asked for it;
* a **pageable copy** for a non-blocking host-to-device copy from memory that is not pinned: CUDA stages it
  through a pinned buffer and the host waits for that, so it overlaps nothing (flagged, not a sync: nothing can
  be pinned without CUDA, so on the emulated device every such copy is pageable; ``pageable_sites``);
* a **mix-up** for a device tensor combined with a host tensor of dim > 0 (a RuntimeError on CUDA).

Launches are attributed to the phase named by :meth:`Counter.phase` (augmentation, model, ...). What this
cannot see: kernel run times, cuDNN/cuBLAS algorithm choices, CUDA rounding, nvJPEG, the caching allocator.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

DEVICE = torch.device("meta")  # what an emulated tensor reports as its device (stands for cuda:0)

# Output size depends on the values: the host must wait for the device to know it.
DATA_DEPENDENT = frozenset({"nonzero", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
                            "masked_select", "is_nonzero", "equal", "_local_scalar_dense",
                            "bincount"})  # CUDA's bincount reads the largest value on the host to size its output
# Ops whose host code reads a device value (a sync inside the op, which no dispatch-level data dependency
# shows): name -> (when, given the op's arguments; what it reads). CUDA's repeat_interleave sums the repeats to
# size its output unless output_size says it; multinomial checks its probabilities on the host for one sample
# or sampling without replacement; linalg's error checks read the info tensor.
IN_KERNEL_SYNC = {
    "repeat_interleave": (lambda args, kw: kw.get("output_size") is None,
                          "repeat_interleave without output_size (sums the repeats on the host)"),
    "multinomial": (lambda args, kw: (args[1] if len(args) > 1 else kw.get("num_samples")) == 1
                    or not (args[2] if len(args) > 2 else kw.get("replacement", False)),
                    "multinomial (checks its probabilities on the host)"),
    "_linalg_check_errors": (lambda args, kw: True, "linalg error check (reads the info tensor)"),
}
# Ops that refuse a host tensor among device ones even when it is 0-dim (TensorIterator ops accept those).
WHOLE_TENSOR_INPUTS = frozenset({"cat", "stack"})
# No kernel runs: memory is only reserved, or the op is a no-op on its input.
NO_KERNEL = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh",
                       "_to_copy_noop", "detach", "alias", "set_", "resize_", "_local_scalar_dense"})
INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})
COPIES = frozenset({"_to_copy", "copy_"})
_HERE = Path(__file__).resolve()
_ROOT = _HERE.parents[2]
_TOOLS = str(_HERE.parent) + "/"  # benchmarks/devtools/: the instruments' own frames are not counted


class OnDevice(torch.Tensor):
    """A tensor on the emulated device: a wrapper around the CPU tensor that holds its values."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(), dtype=elem.dtype,
                                                  device=DEVICE, storage_offset=elem.storage_offset(),
                                                  requires_grad=elem.requires_grad)

    def __init__(self, elem: torch.Tensor):
        self.elem = elem

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self) -> str:
        return f"OnDevice({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError("an emulated device tensor was used outside gpu_cost.counting()")


def to_device(t: torch.Tensor) -> OnDevice:
    """Put a CPU tensor on the emulated device (no copy is counted: the data is assumed there already)."""
    return t if isinstance(t, OnDevice) else OnDevice(t.detach().clone().requires_grad_(t.requires_grad))


def held(t: torch.Tensor) -> torch.Tensor:
    """The CPU tensor an emulated one holds (the tensor itself when it is a plain one)."""
    return t.elem if isinstance(t, OnDevice) else t


def project_site() -> str:
    """``file:line`` of the innermost frame of project code (not torch, not this module)."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename)
        if path == _HERE or "torch" in path.parts or "site-packages" in path.parts:
            continue
        try:
            return f"{path.resolve().relative_to(_ROOT)}:{frame.lineno}"
        except ValueError:
            return f"{path.name}:{frame.lineno}"
    return "?"


@dataclass
class Counter:
    """What one :func:`counting` block recorded."""

    launches: collections.Counter = field(default_factory=collections.Counter)  # (phase, op) -> n
    syncs: collections.Counter = field(default_factory=collections.Counter)  # (phase, kind, op, site) -> n
    mixups: collections.Counter = field(default_factory=collections.Counter)  # (op, site) -> n
    pageable: collections.Counter = field(default_factory=collections.Counter)  # (phase, site) -> n
    current: str = "other"

    @contextlib.contextmanager
    def phase(self, name: str):
        """Attribute what runs inside to ``name`` (phases nest; the innermost wins)."""
        before, self.current = self.current, name
        try:
            yield self
        finally:
            self.current = before

    def launch_count(self, phase: str | None = None) -> int:
        return sum(n for (p, _), n in self.launches.items() if phase is None or p == phase)

    def sync_count(self, phase: str | None = None) -> int:
        return sum(n for (p, *_), n in self.syncs.items() if phase is None or p == phase)

    def sync_sites(self, phase: str | None = None) -> list[tuple[str, str, str, int]]:
        """``(kind, op, site, count)`` of every sync, most frequent first."""
        rows = [(kind, op, site, n) for (p, kind, op, site), n in self.syncs.items() if phase in (None, p)]
        return sorted(rows, key=lambda r: (-r[3], r[2]))

    def pageable_sites(self, phase: str | None = None) -> list[tuple[str, int]]:
        """``(site, count)`` of every non-blocking copy from pageable host memory (see the module doc)."""
        return sorted(((site, n) for (p, site), n in self.pageable.items() if phase in (None, p)),
                      key=lambda r: (-r[1], r[0]))

    def clear(self) -> None:
        """Forget what was counted so far (the warm-up before a steady-state step)."""
        for counts in (self.launches, self.syncs, self.mixups, self.pageable):
            counts.clear()

    def note_sync(self, kind: str, op: str) -> None:
        self.syncs[(self.current, kind, op, project_site())] += 1


def _is_emulated_device(value) -> bool:
    """A ``device=`` value naming the emulated device (a string only where a device is expected)."""
    if isinstance(value, str):
        value = torch.device(value) if value.split(":")[0] in ("cpu", "cuda", "meta") else None
    return isinstance(value, torch.device) and value.type == DEVICE.type


class _Dispatch(TorchDispatchMode):
    """Runs each op on the CPU tensors held by emulated ones and records what a GPU would pay."""

    def __init__(self, counter: Counter):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = func._schema.name.split("::")[-1]
        flat, _ = tree_flatten((args, kwargs))
        on_device = any(isinstance(t, OnDevice) for t in flat)
        wants_device = any(_is_emulated_device(v) for v in flat)
        out_on_device = self._records(func, name, args, kwargs, flat, on_device, wants_device)
        cpu = lambda v: held(v) if isinstance(v, torch.Tensor) else (  # noqa: E731
            torch.device("cpu") if _is_emulated_device(v) else v)
        result = func(*tree_map(cpu, args), **tree_map(cpu, kwargs))
        if name == "copy_" or (_writes_first(func) and isinstance(args[0], OnDevice)):
            return args[0]
        if not out_on_device:
            return result
        return tree_map(lambda t: OnDevice(t) if isinstance(t, torch.Tensor) else t, result)

    def _records(self, func, name, args, kwargs, flat, on_device, wants_device) -> bool:
        """Record the op's launch, sync or mix-up; returns whether its output lives on the device."""
        c = self.counter
        if name in COPIES:
            return self._copy(name, args, kwargs)
        out_on_device = on_device or wants_device
        if on_device and name in IN_KERNEL_SYNC and IN_KERNEL_SYNC[name][0](args, kwargs):
            c.note_sync(IN_KERNEL_SYNC[name][1], name)
        if on_device and name in DATA_DEPENDENT:
            c.note_sync("value read by the host" if name in ("_local_scalar_dense", "is_nonzero", "equal")
                        else "output size depends on the data", name)
        if on_device and name in INDEXING:
            self._indexing(name, args)
        elif on_device and any(isinstance(t, torch.Tensor) and not isinstance(t, OnDevice)
                               and (t.dim() > 0 or name in WHOLE_TENSOR_INPUTS) for t in flat):
            c.mixups[(name, project_site())] += 1
        if out_on_device and not func.is_view and name not in NO_KERNEL:
            c.launches[(c.current, name)] += 1
        return out_on_device and name not in ("_local_scalar_dense", "is_nonzero", "equal")

    def _indexing(self, name: str, args) -> None:
        for index in args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ():
            if not isinstance(index, torch.Tensor):
                continue
            if index.dtype == torch.bool:
                self.counter.note_sync("boolean-mask index (nonzero)", name)
            elif not isinstance(index, OnDevice) and index.dim() > 0:
                self.counter.note_sync("host index tensor copied to the device", name)

    def _copy(self, name: str, args, kwargs) -> bool:
        """A copy between host and device: counted as a launch when asynchronous, a sync when blocking."""
        if name == "copy_":
            dst_on, src, non_blocking = isinstance(args[0], OnDevice), args[1], bool(
                kwargs.get("non_blocking", args[2] if len(args) > 2 else False))
        else:
            src, non_blocking = args[0], bool(kwargs.get("non_blocking", False))
            target = kwargs.get("device")
            dst_on = _is_emulated_device(target) if target is not None else isinstance(src, OnDevice)
        src_on = isinstance(src, OnDevice)
        c = self.counter
        if src_on != dst_on and not (non_blocking and dst_on):
            c.note_sync("blocking copy to the " + ("device" if dst_on else "host"), name)
        elif dst_on:
            c.launches[(c.current, "copy (host to device)" if not src_on else name)] += 1
            if not src_on and isinstance(src, torch.Tensor) and not src.is_pinned():
                c.pageable[(c.current, project_site())] += 1
        return dst_on


def _writes_first(func) -> bool:
    args = func._schema.arguments
    return bool(args) and args[0].alias_info is not None and args[0].alias_info.is_write


class _Creation(TorchFunctionMode):
    """``torch.tensor(data, device=...)`` and friends: built on the host, then a blocking copy. torch's own
    copy inside these factories does not pass through dispatch modes, so they are caught here."""

    FACTORIES = ("tensor", "as_tensor", "new_tensor", "asarray")
    READS = ("tolist", "numpy")  # a device tensor's values to the host: a blocking copy

    def __init__(self, counter: Counter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name in self.READS and args and isinstance(args[0], OnDevice):
            self.counter.note_sync("blocking copy to the host", name)
            return func(held(args[0]), *args[1:], **kwargs)
        if name not in self.FACTORIES:
            return func(*args, **kwargs)
        data = args[1] if name == "new_tensor" else args[0]
        device = kwargs.get("device", args[0].device if name == "new_tensor" else None)
        if not _is_emulated_device(device) or isinstance(data, OnDevice):
            return func(*args, **kwargs)
        kwargs["device"] = "cpu"
        if name == "new_tensor":
            kwargs.setdefault("dtype", args[0].dtype)
            out = torch.tensor(held(data) if isinstance(data, torch.Tensor) else data, **kwargs)
        else:
            out = func(held(data) if isinstance(data, torch.Tensor) else data, *args[1:], **kwargs)
        self.counter.note_sync("blocking copy of host data to the device", name)
        return OnDevice(held(out))


@contextlib.contextmanager
def counting():
    """``with counting() as c:`` run code whose tensors are :class:`OnDevice`; ``c`` holds the counts.
    ``torch.autocast`` on the emulated device type becomes a no-op inside (torch has no autocast for it):
    count fp32 paths, or say that the mixed-precision casts are not counted."""
    counter = Counter()
    real_autocast = torch.autocast

    def autocast(device_type, *args, **kwargs):
        if device_type == DEVICE.type:
            return contextlib.nullcontext()
        return real_autocast(device_type, *args, **kwargs)

    torch.autocast = autocast
    try:
        with _Creation(counter), _Dispatch(counter):
            yield counter
    finally:
        torch.autocast = real_autocast


class LoopCounter:
    """Python loop iterations in project code (``ltbench/``, ``methods/``; not these instruments): each backward
    jump of a frame's line number is one iteration, so a per-sample loop over a batch of 256 shows as 256."""

    def __init__(self, roots: tuple[str, ...] = ("ltbench", "methods")):
        self.prefixes = tuple(str(_ROOT / r) + "/" for r in roots)
        self.iterations: collections.Counter = collections.Counter()
        self._last: dict[int, int] = {}

    def _trace(self, frame, event, arg):
        if not frame.f_code.co_filename.startswith(self.prefixes) or frame.f_code.co_filename.startswith(_TOOLS):
            return None
        if event == "line":
            last = self._last.get(id(frame))
            if last is not None and frame.f_lineno < last:
                where = f"{Path(frame.f_code.co_filename).relative_to(_ROOT)}:{frame.f_lineno}"
                self.iterations[where] += 1
            self._last[id(frame)] = frame.f_lineno
        elif event == "return":
            self._last.pop(id(frame), None)
        return self._trace

    def __enter__(self):
        self._previous = sys.gettrace()
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc):
        sys.settrace(self._previous)

    def total(self) -> int:
        return sum(self.iterations.values())
