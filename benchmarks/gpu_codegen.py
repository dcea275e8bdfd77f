"""How many kernels a torch.compile'd region would launch on CUDA, counted where there is no GPU.

Inductor writes, for each graph it compiles, a Python wrapper whose ``call()`` launches the graph's kernels one
after the other: generated Triton kernels (``<name>.run(...)``), library calls (``extern_kernels.mm``,
``extern_kernels.convolution``: cuBLAS, cuDNN) and the operations it leaves to ATen. That wrapper depends on the
device: Inductor's CPU backend fuses into C++ loops, its CUDA backend into Triton kernels, and they split the same
graph differently (training-mode BatchNorm, say, is one C++ loop nest but several Triton reductions). So this
counts the CUDA wrapper itself, generated on this CPU for a pretended GPU:

1. Dynamo traces the region on the CPU as torch.compile would; the backend here hands each traced graph to
   Inductor's ``compile_fx`` (AOTAutograd: the joint forward-backward graph, partitioned; the backward is lowered
   at once, not on its first call) and returns the graph itself, so the region still runs eagerly on the CPU.
2. Each partitioned graph reaches ``inner``: its device arguments and constants are moved to ``cuda:0`` and its
   inputs become fake ``cuda:0`` tensors (no memory) of the same shapes, strides and dtypes; then Inductor's own
   ``compile_fx_inner`` lowers it for CUDA while ``pretend_gpu`` makes torch and Triton report one GPU of
   compute capability 9.0 (an H100/H200). Triton is asked for nothing but the target: kernel sources are
   generated, never compiled, and no wrapper is ever called.
3. Every wrapper's kernel calls are counted (``launches``); with ``mode="reduce-overhead"`` Inductor's reasons to
   skip CUDA graphs are kept.

What this cannot see: kernel times; Triton autotuning (off in these modes); how many kernels one library call
is (a cuDNN convolution may be one to three: counted one); anything that depends on tensor values.
"""

from __future__ import annotations

import contextlib
import re
import time
import types
from dataclasses import dataclass, field

import torch

GPU = types.SimpleNamespace(  # what Inductor and Triton ask of a device's properties; an H200's figures
    name="pretended H200 (sm_90)", major=9, minor=0, multi_processor_count=132, total_memory=141 << 30,
    warp_size=32, max_threads_per_multi_processor=2048, max_threads_per_block=1024, regs_per_multiprocessor=65536,
    L2_cache_size=60 << 20, shared_memory_per_block_optin=227 << 10, shared_memory_per_multiprocessor=228 << 10,
    gcnArchName="", uuid="pretended", pci_bus_id=0, is_integrated=False)
CUDA = torch.device("cuda", 0)
# A kernel call in a wrapper: "buf3 = <call>(" or "<call>(" at the start of a line.
CALL = re.compile(r"^[ \t]*(?:[\w, ]+ = )?(\w+\.run|extern_kernels\.\w+|aten\.[\w.]+|torch\.ops\.[\w.]+)\(",
                  re.MULTILINE)


@dataclass
class Counted:
    """What a region's compiled graphs would launch per call on CUDA."""

    launches: int = 0
    triton: int = 0
    library: int = 0  # extern_kernels.*: cuBLAS, cuDNN
    aten: int = 0  # ops Inductor leaves to ATen (sorts, scatters, random draws)
    graphs: int = 0  # Dynamo graphs (more than one: graph breaks)
    wrappers: int = 0  # Inductor wrappers (forward, backward, inference) across the graphs
    cudagraph_skips: list[str] = field(default_factory=list)
    cpu_seconds: float = 0.0

    def as_dict(self) -> dict:
        return dict(vars(self))


def launches(wrapper: str) -> dict:
    """Kernel calls one run of a wrapper makes: those in ``call()`` (and in its ``partition_N`` functions when
    Inductor splits it for CUDA graphs), not the kernel definitions above them nor the benchmark helper below."""
    start = wrapper.find("\ndef partition_")
    start = start if start >= 0 else wrapper.find("def call(")
    end = wrapper.find("\ndef get_args(")
    body = wrapper[start:end if end > start else len(wrapper)]
    calls = CALL.findall(body)
    library = sum(c.startswith("extern_kernels.") for c in calls)
    triton = sum(c.endswith(".run") for c in calls)
    return {"launches": len(calls), "triton": triton, "library": library, "aten": len(calls) - triton - library}


@contextlib.contextmanager
def _patched(pairs):
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in pairs]
    for obj, name, value in pairs:
        setattr(obj, name, value)
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


class _NotRun:
    """A Triton kernel that is generated, never compiled or launched."""

    def __init__(self, *args, **kwargs):
        pass

    def run(self, *args, **kwargs):
        raise RuntimeError("gpu_codegen: a pretended GPU's kernel was called")

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class _TritonTarget:
    """The Triton driver's answers that code generation needs: an sm_90 CUDA target, device 0, stream 0."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_device_interface(self):
        return torch.cuda

    def get_active_torch_device(self):
        return CUDA


@contextlib.contextmanager
def pretend_gpu():
    """torch.cuda, Dynamo's CUDA device interface and Triton's driver report one GPU (``GPU``); Triton kernels
    are generated but not compiled. Leaves everything as it was."""
    import torch._dynamo.device_interface as interface
    import torch._inductor.async_compile as async_compile
    import torch._inductor.graph as graph
    import torch.utils._triton as triton_utils
    from torch._subclasses.fake_tensor import FakeTensor
    from triton.runtime.driver import driver

    const = lambda value: (lambda *a, **k: value)  # noqa: E731
    cuda = torch.cuda
    same_tensor = graph.is_same_tensor
    pairs = [(cuda, name, value) for name, value in {
        "is_available": const(True), "device_count": const(1), "current_device": const(0),
        "get_device_properties": const(GPU), "get_device_capability": const((9, 0)),
        "get_device_name": const(GPU.name), "set_device": const(None), "_lazy_init": const(None),
        "is_bf16_supported": const(True), "synchronize": const(None), "set_rng_state": const(None),
        "get_rng_state": lambda *a, **k: torch.zeros(16, dtype=torch.uint8),
        "_exchange_device": const(0), "_maybe_exchange_device": const(0)}.items()]
    pairs += [(interface.CudaInterface, name, staticmethod(value)) for name, value in {
        "is_available": const(True), "current_device": const(0), "device_count": const(1),
        "set_device": const(None), "get_device_properties": const(GPU), "get_compute_capability": const(90),
        "is_bf16_supported": const(True), "synchronize": const(None), "exchange_device": const(0),
        "maybe_exchange_device": const(0)}.items()]
    pairs += [(interface.CudaInterface.Worker, "get_device_properties", staticmethod(const(GPU))),
              (interface.CudaInterface.Worker, "current_device", staticmethod(const(0))),
              # constants moved to the fake device have no storage whose address Inductor could compare
              (graph, "is_same_tensor", lambda a, b: a is b if isinstance(a, FakeTensor) or isinstance(b, FakeTensor)
               else same_tensor(a, b)),
              (async_compile.AsyncCompile, "triton", lambda self, name, source, *a, **k: _NotRun()),
              (async_compile.AsyncCompile, "wait", lambda self, scope: None),
              (driver, "_active", _TritonTarget())]

    def forget():  # has_triton() and its kin are cached: asked again inside and after
        for value in vars(triton_utils).values():
            getattr(value, "cache_clear", lambda: None)()

    with _patched(pairs):
        forget()
        try:
            yield
        finally:
            forget()
    forget()


def _to_gpu(value):
    return CUDA if isinstance(value, torch.device) and value.type == "cpu" else value


def _moved(gm, inputs, fake_mode):
    """The partitioned graph with its device arguments and tensor constants on cuda:0, and fake cuda:0
    versions of its inputs (same shapes, strides, dtypes, requires_grad)."""
    import torch.utils._pytree as pytree

    for node in gm.graph.nodes:
        node.args, node.kwargs = pytree.tree_map(_to_gpu, node.args), pytree.tree_map(_to_gpu, node.kwargs)
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                with fake_mode:
                    setattr(gm, node.target, torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                                                 device=CUDA))
    gm.recompile()
    with fake_mode:
        fake = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=CUDA, requires_grad=t.requires_grad)
                if isinstance(t, torch.Tensor) else t for t in inputs]
    return gm, fake


def count(fn, *args, mode: str | None = None, fullgraph: bool = False, dynamic: bool | None = None,
          **kwargs) -> Counted:
    """Run ``fn(*args, **kwargs)`` once under torch.compile on the CPU (eagerly: only the code generation is
    for the GPU) and count what each call of its compiled graphs would launch on CUDA. ``mode``: torch.compile's
    (``"reduce-overhead"``: Inductor's CUDA-graph checks run, their skip reasons are kept)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import detect_fake_mode
    from torch._inductor import cudagraph_utils
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner
    from torch._inductor.graph import GraphLowering
    from torch._inductor.utils import BoxedBool

    out, wrappers = Counted(), []
    graphed = mode == "reduce-overhead"

    def inner(gm, inputs, **kw):
        gm, fake = _moved(gm, inputs, detect_fake_mode(inputs))
        if graphed:
            kw["cudagraphs"] = BoxedBool(True)
        with pretend_gpu():
            return compile_fx_inner(gm, fake, **kw)

    def backend(gm, inputs):
        out.graphs += 1
        compile_fx(gm, inputs, inner_compile=inner, config_patches={"triton.cudagraphs": graphed})
        return gm.forward

    skip = cudagraph_utils.log_cudagraph_skip_and_bump_counter

    def skipped(message):
        out.cudagraph_skips.append(message.splitlines()[0][:200])
        return skip(message)

    settings = {"fx_graph_cache": False, "fx_graph_remote_cache": False, "autotune_local_cache": False,
                "compile_threads": 1, "freezing": False}
    started = time.process_time()
    torch._dynamo.reset()
    with _patched([(GraphLowering, "save_output_code", wrappers.append),
                   (cudagraph_utils, "log_cudagraph_skip_and_bump_counter", skipped)]), \
            inductor_config.patch(settings), \
            functorch_config.patch(force_non_lazy_backward_lowering=True, enable_autograd_cache=False):
        torch.compile(fn, backend=backend, fullgraph=fullgraph, dynamic=dynamic)(*args, **kwargs)
    torch._dynamo.reset()
    for wrapper in wrappers:
        for key, value in launches(wrapper).items():
            setattr(out, key, getattr(out, key) + value)
    out.wrappers, out.cpu_seconds = len(wrappers), round(time.process_time() - started, 1)
    return out
