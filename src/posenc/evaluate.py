"""Validation loss at many evaluation lengths ("train short, test long").

Non-overlapping evaluation (Press et al. 2022, section 4): the validation bytes are cut into
consecutive windows of the evaluation length; each window is one forward pass from position
0. Two averages per length: over every token of the window, and over only the last
``train_len`` tokens of each window (the tokens that have seen more context than in training).
Every length reads the same prefix of the validation data, so the lengths are comparable.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class LengthResult:
    """Loss at one evaluation length, in nats per token."""

    length: int
    loss: float
    loss_last: float
    windows: int
    tokens: int

    @property
    def ppl(self) -> float:
        return math.exp(self.loss)

    @property
    def bits_per_byte(self) -> float:
        return self.loss / math.log(2)


def evaluation_windows(data: Tensor, length: int, max_tokens: int) -> Tensor:
    """Non-overlapping windows (N, length + 1) of the first ``max_tokens`` predicted bytes.

    Raises:
        ValueError: not even one window fits in the data.
    """
    usable = min(max_tokens, data.numel() - 1)
    count = usable // length
    if count < 1:
        raise ValueError(
            f"the validation data ({data.numel()} bytes, eval budget {max_tokens} tokens) holds no window of {length}"
        )
    starts = torch.arange(count) * length
    return data[starts.unsqueeze(1) + torch.arange(length + 1)].long()


@torch.no_grad()
def evaluate_length(
    model: nn.Module,
    data: Tensor,
    length: int,
    train_len: int,
    *,
    max_tokens: int = 65536,
    tokens_per_batch: int = 16384,
    on_batch: Callable[[int], None] | None = None,
) -> LengthResult:
    """Mean next-byte loss (nats) at evaluation length ``length`` on ``data`` (uint8 bytes).

    Args:
        model: maps tokens (B, T) -> logits (B, T, V).
        length: window length in tokens.
        train_len: the training length L; ``loss_last`` averages the last L positions.
        max_tokens: how many validation tokens to read (the same prefix for every length).
        tokens_per_batch: bounds memory: windows per forward pass = tokens_per_batch // length.
        on_batch: called with the number of windows done after each batch.
    """
    model.eval()
    device = next(model.parameters()).device
    windows = evaluation_windows(data, length, max_tokens)
    per_batch = max(1, tokens_per_batch // length)
    last = min(train_len, length)
    total = total_last = 0.0
    for begin in range(0, windows.shape[0], per_batch):
        chunk = windows[begin : begin + per_batch].to(device)
        logits = model(chunk[:, :-1])
        nll = F.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none")  # (b, length)
        total += nll.double().sum().item()
        total_last += nll[:, -last:].double().sum().item()
        if on_batch is not None:
            on_batch(min(begin + per_batch, windows.shape[0]))
    count = windows.shape[0]
    return LengthResult(length, total / (count * length), total_last / (count * last), count, count * length)
