"""Data-parallel training under torchrun: process group, rank-aware helpers, collectives.

Outside torchrun (no WORLD_SIZE in the environment, or 1) every helper is a no-op, so the same
code path trains on one device.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from .errors import TmtError


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    try:
        return int(value) if value is not None else default
    except ValueError:
        raise TmtError(f"environment variable {name}={value!r} is not an integer") from None


def init_distributed(device_name: str) -> tuple[DistInfo, str]:
    """Join the torchrun process group if there is one. Returns the rank info and the device
    name this process should use (cuda:LOCAL_RANK on GPUs, one process per device)."""
    info = DistInfo(_env_int("RANK", 0), _env_int("LOCAL_RANK", 0), _env_int("WORLD_SIZE", 1))
    if not info.enabled:
        return info, device_name
    use_cuda = torch.cuda.is_available() and device_name in ("auto", "cuda")
    if use_cuda:
        devices = torch.cuda.device_count()
        if info.local_rank >= devices:
            # Otherwise set_device fails with CUDA's "invalid device ordinal" traceback.
            raise TmtError(f"torchrun started local rank {info.local_rank}, but this machine has "
                           f"{devices} CUDA device(s): start one process per GPU "
                           f"(--nproc_per_node={devices}), or set train.device: cpu")
        torch.cuda.set_device(info.local_rank)
        device_name = f"cuda:{info.local_rank}"
    elif device_name == "auto":
        device_name = "cpu"
    global _joined
    _joined = True
    if not dist.is_initialized():
        # A generous timeout: rank 0 alone prepares the data while the others wait.
        dist.init_process_group("nccl" if use_cuda else "gloo",
                                timeout=datetime.timedelta(minutes=60))
    return info, device_name


_joined = False     # whether this process ever joined a process group


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def joined() -> bool:
    return _joined


def exit_process(code: int) -> NoReturn:
    """End a process that took part in a process group, skipping the interpreter's teardown.

    After destroy_process_group, gloo's C++ threads can still be torn down by static
    destructors at exit, which now and then ends the process with "terminate called without an
    active exception" (SIGABRT, seen about once in 20 two-rank runs on a loaded machine) after
    all its work was done, and torchrun then fails the whole job. Everything this process wrote
    (checkpoints, events, logs) is closed or flushed by now; flush the rest and leave at once."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):     # a closed pipe: nothing more can be said there
            pass
    os._exit(code)


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    if active():
        dist.barrier()


def sum_across_ranks(value: float, device: torch.device) -> float:
    """Sum of a number over all ranks (the value itself when training alone)."""
    if not active():
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return float(tensor.item())


def max_across_ranks(value: float, device: torch.device) -> float:
    """The largest of a number over all ranks (the value itself when training alone)."""
    if not active():
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank if it is True on any rank (e.g. one rank received SIGTERM)."""
    return sum_across_ranks(float(flag), device) > 0


def broadcast_from_main(obj: Any) -> Any:
    """Rank 0's value of a picklable object, on every rank."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_to_main(obj: Any) -> list[Any] | None:
    """Every rank's object, as a list on rank 0 (None elsewhere)."""
    if not active():
        return [obj]
    boxes = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, boxes, dst=0)
    return boxes
