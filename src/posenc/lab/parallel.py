"""One run trained on every rank of a torchrun group: ``--parallel data`` (PyTorch's
DistributedDataParallel) and ``--parallel fsdp`` (FSDP2, ``fully_shard``); the group and the
mode come from :mod:`posenc.lab.experiments.distributed`.

What stays the same whatever the number of ranks N (so that a run's results and its
checkpoint do not depend on N): every rank draws the same global batch from the same seeded
generator and trains on its slice of the rows; the loss is the global batch's mean (see
:meth:`ParallelTraining.backward`); the checkpoint holds the whole model and optimizer state in
one process's format, written by rank 0, and resumes on any N.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.lab._amp import autocast_context
from posenc.lab.experiments.distributed import Shard

def param_names(model: nn.Module) -> list[str]:
    """The names of ``model``'s trained parameters in the optimizer's order (posenc.lab.train's
    parameter groups: the decayed matrices first, then the rest)."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    return [n for n, p in named if p.dim() >= 2] + [n for n, p in named if p.dim() < 2]


class ParallelTraining:
    """``model`` trained on the ranks of ``ranks``: :attr:`trained` is the module to run
    (DistributedDataParallel around ``model``, or with ``sharded`` an FSDP2 copy of it, each
    transformer block in ``model.blocks`` a unit); :attr:`optimized` the module whose
    parameters the optimizer takes. Under FSDP2 the copy's weights return to ``model`` at
    :meth:`finish`.

    Memory under FSDP2: while the run trains, ``model`` is parked in host memory and the sharded
    copy is made there, then ``fully_shard`` moves each block to the device and keeps this
    rank's 1/N of it, so a device holds 1/N of the parameters, gradients and AdamW state (plus
    one block's parameters, gathered for its forward and backward), never the whole model and
    its copy; ``model`` returns to ``device`` at :meth:`finish` (the evaluation after training
    runs the whole model on one device). The model is still built whole once per rank, in
    host memory before it reaches here (no meta-device build)."""

    def __init__(self, model: nn.Module, ranks: Shard, device: torch.device, *, sharded: bool) -> None:
        self.model, self.ranks, self.sharded = model, ranks, sharded
        if sharded:
            from torch.distributed.fsdp import fully_shard

            self.home = device
            model.to("cpu")  # the whole model waits in host memory; the device gets shards only
            self.trained = copy.deepcopy(model)
            for block in getattr(self.trained, "blocks", ()):
                fully_shard(block)
            fully_shard(self.trained)
            self.optimized = self.trained
        else:
            from torch.nn.parallel import DistributedDataParallel

            self.trained = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
            self.optimized = model  # DDP trains model's own parameters

    def backward(self, forward, inputs: Tensor, targets: Tensor, positions: Tensor | None, device,
                 autocast: str | None, ignore_index: int) -> Tensor:
        """One step's forward and backward on this rank's rows of the global batch; returns the
        global batch's loss (the same on every rank).

        The global loss is sum(CE over every target) / (number of targets). Each rank sums the
        cross-entropy over its rows and divides by the global count (known to every rank: each
        holds the whole batch), times N, because DDP and FSDP average the ranks' gradients. So
        the gradient is one process's on the whole batch, whatever the split, even where rows
        hold different numbers of targets (a task's prompt tokens carry none)."""
        rows = torch.tensor_split(torch.arange(inputs.shape[0]), self.ranks.world_size)[self.ranks.rank]
        count = (targets != ignore_index).sum().clamp(min=1)
        with autocast_context(device, autocast):
            logits = forward(inputs[rows]) if positions is None else forward(inputs[rows], positions[rows])
            total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets[rows].reshape(-1),
                                    ignore_index=ignore_index, reduction="sum")
        (total * self.ranks.world_size / count).backward()
        summed = total.detach().clone()
        torch.distributed.all_reduce(summed)
        return summed / count

    def states(self, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
        """The whole model's state dict and the optimizer's, in one process's format (the
        optimizer's parameters by index). Under FSDP2 a collective: every rank must call it;
        rank 0 receives the values (in CPU memory), the others empty dicts."""
        if not self.sharded:
            return self.model.state_dict(), optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state = get_model_state_dict(self.trained, options=options)
        by_name = get_optimizer_state_dict(self.trained, optimizer, options=options)
        if not self.ranks.is_main:
            return {}, {}
        index = {name: i for i, name in enumerate(param_names(self.model))}
        return model_state, {
            "state": {index[name]: value for name, value in by_name["state"].items()},
            "param_groups": [{**group, "params": [index[name] for name in group["params"]]}
                             for group in by_name["param_groups"]],
        }

    def load_optimizer(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """``state``, one process's optimizer state dict (parameters by index), into ``optimizer``."""
        if not self.sharded:
            optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        names = param_names(self.model)
        by_name = {
            "state": {names[i]: value for i, value in state["state"].items()},
            "param_groups": [{**group, "params": [names[i] for i in group["params"]]} for group in state["param_groups"]],
        }
        set_optimizer_state_dict(self.trained, optimizer, by_name, options=StateDictOptions(full_state_dict=True))

    def finish(self) -> None:
        """After the last step: under FSDP2 the trained weights back into ``model`` on every rank."""
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            # every rank needs the weights (cpu_offload would hand them to rank 0 alone)
            self.model.load_state_dict(get_model_state_dict(self.trained, options=StateDictOptions(full_state_dict=True)))
            self.model.to(self.home)
