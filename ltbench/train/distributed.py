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

        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=torch.cuda.is_available())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def average_gradients(parameters) -> None:
    """All-reduce the mean gradient over processes in one flat buffer."""
    params = [p for p in parameters if p.requires_grad]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n


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
