"""The training loop: AdamW, linear warm-up then cosine decay, gradient clipping.

It trains on random windows of a byte corpus, or on the batches of a :data:`BatchSource`
(e.g. synthetic task instances, :mod:`posenc.lab.experiments.lengthgen`) whose targets mark with
:data:`IGNORE_INDEX` the tokens that carry no loss.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Union
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.lab.fields import only_when_set
from posenc.lab import checkpoint
from posenc.lab.checkpoint import load_checkpoint
from posenc.lab.data import random_windows
from posenc.lab.experiments import distributed
from posenc.lab.parallel import ParallelTraining
from posenc.lab.model import TransformerLM
from posenc.lab._amp import autocast_context, check_autocast
from posenc._validation import check_bool, check_number, check_positive_int, is_real_number
from posenc.errors import InvalidArgument


#: A target that carries no loss (F.cross_entropy's ``ignore_index``): a prompt token, padding.
IGNORE_INDEX = -100

#: Makes one training batch: ``(batch_size, generator) -> (inputs, targets)``, both int64
#: (B, T); ``targets`` holds :data:`IGNORE_INDEX` where no loss is taken; or ``(inputs,
#: targets, positions)``, positions int64 (B, T): the tokens' position ids (a task's structured
#: positions, :mod:`posenc.lab.experiments.task_positions`). It must draw its randomness from
#: ``generator`` alone: the generator's state is checkpointed, so a resumed run sees the
#: batches an uninterrupted one would.
BatchSource = Callable[[int, torch.Generator], "tuple[Tensor, ...]"]


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of :func:`train_lm`. ``lr`` is the peak learning rate.

    The learning rate warms up linearly over ``warmup_frac`` of the steps, stays at ``lr`` for
    a further ``stable_frac`` of them, then follows a cosine down to ``min_lr_frac * lr`` at the
    last step (:func:`lr_at`). ``stable_frac`` 0 (default) is plain warm-up + cosine; > 0 is a
    warmup-stable-decay schedule, for tasks whose learning comes in a sudden phase transition
    that a decaying rate can postpone past the last step.

    ``randomized_positions``: None (default) trains at positions 0 .. seq_len - 1. An integer
    N >= seq_len trains with randomized positional encodings (Ruoss et al. 2023, "Randomized
    Positional Encodings Boost Length Generalization of Transformers", arXiv 2305.16843,
    section 3): each row's positions are a sorted sample of seq_len distinct integers from
    [0, N), drawn afresh every step, so the encoding sees positions up to N - 1 while the windows
    stay seq_len long; evaluation then uses ordinary positions. Any encoding works (the model
    takes explicit positions); a learned table must hold N positions.

    ``autocast``: None (default, float32) or "bfloat16": forward and loss under
    ``torch.autocast`` (weights and optimizer stay float32). ``compile``: train through
    ``torch.compile(model)`` (the checkpoint holds the model's own weights either way). Both
    change the numbers a run gives, so both are in its fingerprint, only when set.
    """

    steps: int = 1500
    batch_size: int = 32
    seq_len: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.1
    warmup_frac: float = 0.05
    min_lr_frac: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    randomized_positions: int | None = None
    autocast: str | None = None
    compile: bool = False
    stable_frac: float = 0.0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len"):
            check_positive_int(getattr(self, name), name)
        check_number(self.lr, "lr", gt=0)
        if not (is_real_number(self.warmup_frac) and 0 <= self.warmup_frac < 1):
            raise InvalidArgument(f"warmup_frac must be in [0, 1), got {self.warmup_frac!r}")
        if not (is_real_number(self.stable_frac) and 0 <= self.stable_frac and self.warmup_frac + self.stable_frac < 1):
            raise InvalidArgument(f"stable_frac must be >= 0 with warmup_frac + stable_frac < 1, got {self.stable_frac!r}")
        if not (is_real_number(self.min_lr_frac) and 0 <= self.min_lr_frac <= 1):
            raise InvalidArgument(f"min_lr_frac must be in [0, 1], got {self.min_lr_frac!r}")
        check_number(self.grad_clip, "grad_clip", gt=0)
        check_number(self.weight_decay, "weight_decay", ge=0)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise InvalidArgument(f"seed must be an integer >= 0, got {self.seed!r}")
        if self.randomized_positions is not None:
            check_positive_int(self.randomized_positions, "randomized_positions")
            if self.randomized_positions < self.seq_len:
                raise InvalidArgument(
                    f"randomized_positions={self.randomized_positions} must be >= seq_len={self.seq_len} "
                    "(seq_len distinct positions are drawn from [0, randomized_positions))"
                )
        check_autocast(self.autocast, "autocast")
        check_bool(self.compile, "compile")

    def to_dict(self) -> dict:
        """The fields as plain data; ``randomized_positions``, ``autocast``, ``compile`` and
        ``stable_frac`` only when set, so that a run's fingerprint from before they existed
        reads the same."""
        return only_when_set(asdict(self), {"randomized_positions": None, "autocast": None, "compile": False,
                                            "stable_frac": 0.0})


class TrainingDiverged(InvalidArgument):
    """The training loss became NaN or infinite (a learning rate too high, most often): the run
    stops, and nothing of it is stored as finished."""


def random_positions(batch_size: int, seq_len: int, num_positions: int, generator: torch.Generator) -> Tensor:
    """Per row, a sorted sample of ``seq_len`` distinct positions from [0, num_positions)
    (Ruoss et al. 2023, section 3), int64 (batch_size, seq_len), drawn with ``generator``."""
    scores = torch.rand(batch_size, num_positions, generator=generator)
    return scores.argsort(dim=-1)[:, :seq_len].sort(dim=-1).values


def lr_at(step: int, config: TrainConfig) -> float:
    """Learning rate at ``step`` (0-based): linear warm-up, ``lr`` for ``stable_frac`` of the
    steps, then cosine to min_lr_frac * lr."""
    warmup = max(1, int(config.warmup_frac * config.steps))
    if step < warmup:
        return config.lr * (step + 1) / warmup
    decay_start = warmup + int(config.stable_frac * config.steps)
    if step < decay_start:
        return config.lr
    progress = (step - decay_start) / max(1, config.steps - decay_start)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return config.lr * (config.min_lr_frac + (1 - config.min_lr_frac) * cosine)


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only; biases, norms and 1-D position parameters are not decayed."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def train_lm(
    model: nn.Module,
    data: Union[Tensor, BatchSource],
    config: TrainConfig,
    on_step: Callable[[int, float], None] | None = None,
    *,
    checkpoint_path: Path | None = None,
    checkpoint_every: int = 250,
    fingerprint: dict | None = None,
    on_resume: Callable[[int], None] | None = None,
    timing: dict | None = None,
) -> list[float]:
    """Train ``model`` for next-byte prediction on random windows of ``data`` (uint8 bytes),
    or on the batches a :data:`BatchSource` ``data`` makes.

    The loss is the mean cross-entropy over the targets that are not :data:`IGNORE_INDEX`.

    Args:
        model: maps tokens (B, T) -> logits (B, T, V); with ``config.randomized_positions``,
            or batches that carry positions, it is called as ``model(tokens, positions)``,
            positions (B, T) int64.
        data: 1-D uint8 tensor of training bytes (windows of ``config.seq_len``), or a
            :data:`BatchSource` (batches of any width T; ``config.seq_len`` is not read).
        config: steps, batch size, window length, optimizer settings, seed.
        on_step: called after each step with (step, loss in nats per token).
        checkpoint_path: if given, the model, optimizer, batch generator and losses are saved
            there atomically every ``checkpoint_every`` steps and at the end, and a run finds
            and continues from it: an interrupted run resumes where it stopped, with the same
            batches, so it ends where an uninterrupted run would. For a
            :class:`~posenc.lab.model.TransformerLM` the file also holds its config and encoding
            spec, so :meth:`~posenc.lab.model.TransformerLM.from_checkpoint` rebuilds it
            (:mod:`posenc.lab.checkpoint` has the format); every field is plain data or a tensor,
            read back with ``weights_only=True``.
        fingerprint: what the checkpoint must have been made with (arguments, version).
        on_resume: called once with the step training starts from (0 when fresh).
        timing: if given, filled with ``earlier_seconds``: the training seconds of the steps
            done before this call, from the checkpoint it resumed (0.0 when fresh; None for a
            checkpoint written before posenc kept them), so that the whole run's time is known
            across resumes. The checkpoint stores the seconds of every step it holds.

    Returns:
        The training loss (nats per token) of every step.

    Raises:
        posenc.lab.checkpoint.CheckpointMismatch: a checkpoint made with other arguments, or corrupt.
        TrainingDiverged: the loss of a step is NaN or infinite (an InvalidArgument: the CLI
            exits 2 naming the step and the learning rate).
        ValueError: checkpoint_path given for a TransformerLM whose encoding cannot be rebuilt
            (:meth:`~posenc.lab.model.TransformerLM.encoding_spec`), before any step.
    """
    ranks = distributed.data_parallel()
    if ranks is not None and config.batch_size < ranks.world_size:
        raise InvalidArgument(f"--batch-size {config.batch_size} is smaller than the {ranks.world_size} ranks of "
                              "--parallel data/fsdp: every rank needs at least one row of the global batch")
    generator = torch.Generator().manual_seed(config.seed)
    device = next(model.parameters()).device
    losses: list[float] = []
    start, state = 0, None
    fingerprint = {"train": config.to_dict(), **(fingerprint or {})}
    describes_itself = checkpoint_path is not None and isinstance(model, TransformerLM)
    model_spec = {"config": model.config.to_dict(), "encoding": model.encoding_spec()} if describes_itself \
        else {"config": None, "encoding": None}
    earlier_seconds: float | None = 0.0
    if checkpoint_path is not None and Path(checkpoint_path).exists():
        state = load_checkpoint(checkpoint_path, fingerprint)
        model.load_state_dict(state["model"])
        generator.set_state(state["generator"])
        losses, start = list(state["losses"]), state["step"]
        earlier_seconds = state.get("train_seconds")
    if timing is not None:
        timing["earlier_seconds"] = earlier_seconds
    # several ranks: the module that runs (DDP, or an FSDP2 copy) and the one the optimizer takes
    parallel = None if ranks is None else ParallelTraining(model, ranks, device, sharded=distributed.sharded())
    optimized = model if parallel is None else parallel.optimized
    optimizer = torch.optim.AdamW(_param_groups(optimized, config.weight_decay), lr=config.lr, betas=(0.9, 0.95))
    if state is not None:
        if parallel is None:
            optimizer.load_state_dict(state["optimizer"])
        else:
            parallel.load_optimizer(optimizer, state["optimizer"])

    def save(step: int) -> None:
        model_state, optimizer_state = (model.state_dict(), optimizer.state_dict()) if parallel is None \
            else parallel.states(optimizer)  # every rank: a collective under FSDP2
        if not distributed.writes_records():  # data-parallel: rank 0 writes the one checkpoint
            return
        # the seconds of every step the checkpoint holds, across resumes (a step lost to a kill is not counted)
        seconds = (earlier_seconds or 0.0) + time.perf_counter() - leg_started
        checkpoint.save(
            checkpoint_path, model_state, **model_spec, fingerprint=fingerprint, step=step, losses=losses,
            optimizer=optimizer_state, generator=generator.get_state(), train_seconds=seconds,
        )

    leg_started = time.perf_counter()
    if on_resume is not None:
        on_resume(start)
    trained = model if parallel is None else parallel.trained
    forward = torch.compile(trained) if config.compile else trained
    trained.train()
    for step in range(start, config.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        positions = None
        if callable(data):
            inputs, targets, *given = data(config.batch_size, generator)
            positions = given[0] if given else None
        else:
            inputs, targets = random_windows(data, config.batch_size, config.seq_len, generator)
        inputs, targets = inputs.to(device), targets.to(device)
        if positions is not None and config.randomized_positions is not None:
            raise InvalidArgument("randomized_positions: the batches carry their own positions; give one or the other")
        if config.randomized_positions is not None:
            positions = random_positions(*inputs.shape, config.randomized_positions, generator)
        positions = positions.to(device) if positions is not None else None
        optimizer.zero_grad(set_to_none=True)
        if parallel is None:
            with autocast_context(device, config.autocast):
                logits = forward(inputs) if positions is None else forward(inputs, positions)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)
            loss.backward()
            loss = loss.detach()
        else:
            loss = parallel.backward(forward, inputs, targets, positions, device, config.autocast, IGNORE_INDEX)
        nn.utils.clip_grad_norm_(optimized.parameters(), config.grad_clip)
        optimizer.step()
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):  # before a checkpoint or record could store it
            raise TrainingDiverged(f"training diverged at step {step + 1} of {config.steps}: loss {losses[-1]} "
                                   f"(lr {config.lr}); lower the learning rate (--lr); no checkpoint of the diverged weights is kept")
        if on_step is not None:
            on_step(step, losses[-1])
        if checkpoint_path is not None and ((step + 1) % checkpoint_every == 0 or step + 1 == config.steps):
            save(step + 1)
    if parallel is not None:
        parallel.finish()
        distributed.barrier()  # rank 0's last checkpoint is on disk before any rank reads it
    model.eval()
    return losses

