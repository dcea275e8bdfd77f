"""Data-parallel training inside one run, without a wrapper: one process per GPU (or CPU slot).

A process group is joined when the environment says there are several processes: torchrun's
variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or a Slurm job with several tasks started by
submitit (its TorchDistributedEnvironment exports the same variables). NCCL on GPUs, gloo on CPU.
Gradients are averaged explicitly after backward (one flat all-reduce), so the training loop stays
one readable loop; only rank 0 writes files.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init_from_env() -> tuple[int, int]:
    """(rank, world size), joining the process group if there is more than one process."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if os.environ.get("SUBMITIT_EXECUTOR") == "slurm" and int(os.environ.get("SLURM_NTASKS", "1")) > 1 \
            and "WORLD_SIZE" not in os.environ:
        import submitit

        # Not CUDA_VISIBLE_DEVICES: CUDA reads it once, when it initialises, and by now it may have (provenance,
        # torch.cuda.is_available()); so every task sees the node's GPUs and picks its own by LOCAL_RANK below.
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(local_device_index())
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def local_device_index() -> int:
    """This process's GPU on its node: LOCAL_RANK (torchrun and submitit set it) modulo the GPUs it sees."""
    return int(os.environ.get("LOCAL_RANK", "0")) % max(torch.cuda.device_count(), 1)


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def average_gradients(parameters) -> None:
    """All-reduce the mean gradient over processes in one flat buffer, written back into each gradient in place.

    Each gradient is flattened in its own memory order, so a channels_last parameter keeps a channels_last
    gradient (``reshape(-1)`` would copy it into NCHW order, and a gradient rebuilt from the buffer would be
    NCHW, unlike its parameter); the only copies are into the buffer and back."""
    params = [p for p in parameters if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)  # keeps the parameter's layout
        elif memory_order_view(p.grad) is None:  # not dense (rare): a dense copy in the parameter's layout
            p.grad = p.grad.clone(memory_format=torch.preserve_format)
    views = [memory_order_view(p.grad) for p in params]
    flat = torch.cat(views)
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    torch._foreach_copy_(views, list(flat.split([v.numel() for v in views])))


def memory_order_view(t: torch.Tensor) -> torch.Tensor | None:
    """A 1-D view of a dense tensor's elements in the order they lie in memory (None if it has gaps or
    overlaps): its dimensions sorted by stride, then viewed flat."""
    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))
    permuted = t.permute(order) if order else t
    return permuted.reshape(-1) if permuted.is_contiguous() else None


def all_reduce_min(values: list[float]) -> list[float]:
    """Element-wise minimum over processes (values as they are with one process)."""
    if world_size() == 1:
        return values
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return t.tolist()


def all_reduce_sum(values: list[float]) -> list[float]:
    if world_size() == 1:
        return values
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
