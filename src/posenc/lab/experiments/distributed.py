"""Sweeps on torchrun: split an experiment's runs across processes, or train each run on all.

Under ``torchrun --nproc-per-node N posenc extrapolate ...`` (``WORLD_SIZE`` > 1),
:func:`init_from_env` starts torch.distributed (gloo on CPU, NCCL on CUDA, one GPU per
process by ``LOCAL_RANK``), in one of the :data:`PARALLEL` modes:

- ``runs`` (the default): each rank takes every N-th (encoding, seed) run, writes its own run
  records (atomically, under ``out/runs/``), and waits at a :func:`barrier`; rank 0 then reads
  every record and writes the merged results.
- ``data``: every rank takes every run, trained data-parallel with PyTorch's
  DistributedDataParallel (:func:`posenc.lab.train.train_lm`): each rank draws the same global
  batch from the same seeded generator and trains on its slice of the rows, so the global
  batch, the learning-rate schedule and the checkpoint (written by rank 0 alone, resumable on
  any N) do not depend on N. Only rank 0 writes records and figures.
- ``fsdp``: as ``data``, with the model's parameters, gradients and optimizer state sharded
  across the ranks by PyTorch's FSDP2 (``fully_shard``, each transformer block a unit): for a
  model whose training state does not fit one device. The checkpoint holds the whole model and
  optimizer state, in the same format as one process's.

torchrun is the engine: it starts the processes and, if one fails, stops the others; there is
no scheduler here. Without torchrun (or with one process) everything is a no-op and rank 0 of 1
does all runs.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from posenc.errors import InvalidArgument

T = TypeVar("T")

#: How long a rank that finished its share waits at the barrier for the slowest one (a sweep
#: is split by runs, so shares can differ by a whole training run). torch's default (30 min
#: for gloo, 10 min for NCCL) is too short for that.
BARRIER_TIMEOUT = timedelta(hours=72)


#: How the ranks of a torchrun group share an experiment (``--parallel``).
PARALLEL = ("runs", "data", "fsdp")

_parallel = "runs"


@dataclass(frozen=True)
class Shard:
    """This process's place in the group: rank r of world_size."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def take(self, items: Sequence[T]) -> list[T]:
        """This rank's share of ``items``: every world_size-th item from index rank."""
        return list(items[self.rank :: self.world_size])


def current() -> Shard:
    """The running process group's rank and size, or rank 0 of 1 when there is none."""
    if dist.is_available() and dist.is_initialized():
        return Shard(dist.get_rank(), dist.get_world_size())
    return Shard()


def runs_share() -> Shard:
    """How the runs are split: by :func:`current` in ``runs`` mode; in ``data`` and ``fsdp``
    modes every rank takes every run (rank 0 of 1 for the split)."""
    return current() if _parallel == "runs" else Shard()


def data_parallel() -> Shard | None:
    """The group each run trains on: the current group in ``data`` or ``fsdp`` mode with more
    than one rank, else None (one process trains the run alone)."""
    shard = current()
    return shard if _parallel != "runs" and shard.world_size > 1 else None


def sharded() -> bool:
    """Whether runs train with FSDP2 (``fsdp`` mode) rather than DistributedDataParallel."""
    return _parallel == "fsdp"


def barrier() -> None:
    """Wait for every rank (nothing to wait for without a process group)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def writes_records() -> bool:
    """Whether this rank writes run records and checkpoints: every rank its own in ``runs``
    mode, rank 0 alone in ``data`` and ``fsdp`` modes (every rank computes the same run)."""
    return _parallel == "runs" or current().is_main


def init_from_env(device: str, parallel: str = "runs") -> str:
    """Start torch.distributed when launched by torchrun with more than one process.

    Reads torchrun's environment (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``,
    ``MASTER_PORT``); gloo on CPU, NCCL when ``device`` is CUDA. Idempotent, and a no-op with
    one process. The group is destroyed when the process exits. ``parallel`` (one of
    :data:`PARALLEL`) is how the ranks share the experiment.

    Returns:
        The device this rank uses: ``device`` itself, or ``cuda:LOCAL_RANK`` under NCCL.

    Raises:
        InvalidArgument: ``parallel`` not one of :data:`PARALLEL`.
    """
    global _parallel
    if parallel not in PARALLEL:
        raise InvalidArgument(f"--parallel must be one of {', '.join(PARALLEL)}, got {parallel!r}")
    _parallel = parallel
    world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world_size <= 1 or not dist.is_available():
        return device
    if torch.device(device).type == "cuda":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl", timeout=BARRIER_TIMEOUT, device_id=torch.device(device))
    elif not dist.is_initialized():
        dist.init_process_group("gloo", timeout=BARRIER_TIMEOUT)
    atexit.register(_destroy)
    return device


def _destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
