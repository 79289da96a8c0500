"""torch.distributed set-up for runs launched by ``torchrun`` (DDP; gloo on CPU, NCCL on CUDA).

A plain ``python -m prodip.train train`` is a world of one and touches no process group. Under
torchrun a world of one joins a group too when ``--parallel`` is given (``ddp`` or ``fsdp``), so
one GPU can exercise NCCL, DDP under compile and FSDP2.

    torchrun --nproc_per_node 2 -m prodip.train train --config configs/demo.toml --device cpu
    torchrun --nproc_per_node 1 -m prodip.train train --config configs/demo.toml --device cpu --parallel fsdp
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from prodip.base.errors import InvalidInput


@dataclass(frozen=True)
class DistInfo:
    """This process's place: ``rank`` of ``world_size``, on ``device``; ``grouped``: in a process group."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    grouped: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(device: str, *, group: bool = False) -> DistInfo:
    """Join the process group if launched by torchrun with ``WORLD_SIZE`` > 1, or with
    ``WORLD_SIZE`` = 1 when ``group`` (an explicit ``--parallel``). Without torchrun (no
    ``MASTER_ADDR`` in the environment) a world of one never joins a group.

    Args:
        device: ``"auto"`` (CUDA if available, else CPU), ``"cpu"``, ``"cuda"``.
        group: join a group at world size 1 too (under torchrun).
    Returns:
        DistInfo; under torchrun with CUDA each rank gets ``cuda:{LOCAL_RANK}``.
    Raises:
        ValueError: ``device="cuda"`` without CUDA, or an unknown device.
    """
    if device not in ("auto", "cpu", "cuda"):
        raise InvalidInput(f"TrainConfig.device must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise InvalidInput("TrainConfig.device = 'cuda' but torch sees no CUDA device; use --device cpu")
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device(f"cuda:{local}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    launched = "MASTER_ADDR" in os.environ and "WORLD_SIZE" in os.environ  # torchrun sets both
    if (world > 1 or (group and launched)) and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return DistInfo(rank, world, local, dev, grouped=dist.is_initialized())


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_gather_floats(value: float, device: torch.device) -> list[float]:
    """Every rank's ``value``, in rank order (one collective on ``device``; a world of one: ``[value]``)."""
    if not dist.is_initialized():
        return [value]
    mine = torch.tensor([value], dtype=torch.float64, device=device)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return torch.cat(out).tolist()


def broadcast_flag(flag: bool, device: torch.device) -> bool:
    """Rank 0's ``flag`` on every rank (a decision taken on one clock, e.g. a time-based save)."""
    if not dist.is_initialized():
        return flag
    t = torch.tensor([int(flag)], dtype=torch.int32, device=device)
    dist.broadcast(t, src=0)
    return bool(t.item())


def any_flag(flag: bool, device: torch.device) -> bool:
    """True on every rank when ``flag`` is true on any rank (an all-reduce MAX; a world of one: ``flag``)."""
    if not dist.is_initialized():
        return flag
    t = torch.tensor([int(flag)], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def teardown(clean: bool = True) -> None:
    """Leave the process group.

    After a clean run every rank first frees what still references the group (DDP reducers hold
    gloo work whose destruction at interpreter exit can abort the process: "terminate called
    without an active exception", pytorch/pytorch#190489), meets the others at a barrier, and then
    destroys the group together with them. After an error the group is left alone: destroying it
    while another rank waits inside a collective can deadlock (pytorch/torchtitan#1342); torchrun
    tears the other ranks down.

    Args:
        clean: True when this rank's run finished without an exception.
    """
    if not dist.is_initialized() or not clean:
        return
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
