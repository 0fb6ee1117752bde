"""Validation loss at many evaluation lengths ("train short, test long").

Non-overlapping evaluation (Press et al. 2022, section 4): the validation bytes are cut into
consecutive windows of the evaluation length; each window is one forward pass from position
0. Two averages per length: over every token of the window, and over only the last
``train_len`` tokens of each window (the tokens that have seen more context than in training).
Every length reads the same prefix of the validation data, so the lengths are comparable.

Sliding-window evaluation (Press et al. 2022 report it beside the non-overlapping one; Press
et al. 2021, "Shortformer", define it; Hugging Face's "Perplexity of fixed-length models"
recipe is the same), with
``stride`` S: windows of the evaluation length start every S tokens; the first window scores
all its tokens, every later one only its last S, the tokens no earlier window predicted. Each
token is then predicted once, after at least length - S tokens of context (S = 1: Press et
al.'s most expensive setting, every token after length - 1). A window costs a forward pass
of the full length for S new tokens: length / S times the non-overlapping cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.lab._amp import autocast_context
from posenc.errors import InvalidArgument


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
        raise InvalidArgument(
            f"the validation data ({data.numel()} bytes, eval budget {max_tokens} tokens) holds no window of {length}"
        )
    starts = torch.arange(count) * length
    return data[starts.unsqueeze(1) + torch.arange(length + 1)].long()


def sliding_windows(data: Tensor, length: int, stride: int, max_tokens: int) -> tuple[Tensor, Tensor]:
    """Windows (N, length + 1) starting every ``stride`` tokens within the first ``max_tokens``
    predicted bytes, and the index of each window's first scored target (N,): 0 for the
    first window, length - stride for the others (see the module docstring).

    Raises:
        ValueError: stride not in [1, length], or not even one window fits in the data.
    """
    if isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride <= length:
        raise InvalidArgument(f"stride must be an integer in [1, length={length}], got {stride!r}")
    usable = min(max_tokens, data.numel() - 1)
    if usable < length:
        raise InvalidArgument(
            f"the validation data ({data.numel()} bytes, eval budget {max_tokens} tokens) holds no window of {length}"
        )
    count = (usable - length) // stride + 1
    starts = torch.arange(count) * stride
    first = torch.full((count,), length - stride)
    first[0] = 0
    return data[starts.unsqueeze(1) + torch.arange(length + 1)].long(), first


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
    stride: int | None = None,
    autocast: str | None = None,
) -> LengthResult:
    """Mean next-byte loss (nats) at evaluation length ``length`` on ``data`` (uint8 bytes).

    Args:
        model: maps tokens (B, T) -> logits (B, T, V).
        length: window length in tokens.
        train_len: the training length L; ``loss_last`` averages the last L positions.
        max_tokens: how many validation tokens to read (the same prefix for every length).
        tokens_per_batch: bounds memory: windows per forward pass = tokens_per_batch // length.
        on_batch: called with the number of windows done after each batch.
        stride: None: non-overlapping windows; an integer S in [1, length]: sliding windows
            (:func:`sliding_windows`), ``loss`` over the scored tokens, ``loss_last`` over
            those among the last L positions of their window, ``tokens`` the scored count.
        autocast: None (float32) or "bfloat16": the forward passes under ``torch.autocast``.

    Raises:
        ValueError: no window fits in the data; a bad stride.
    """
    model.eval()
    device = next(model.parameters()).device
    if stride is not None:
        return _evaluate_sliding(model, data, length, train_len, max_tokens=max_tokens, tokens_per_batch=tokens_per_batch,
                                 on_batch=on_batch, stride=stride, autocast=autocast, device=device)
    windows = evaluation_windows(data, length, max_tokens)
    per_batch = max(1, tokens_per_batch // length)
    last = min(train_len, length)
    total = total_last = 0.0
    for begin in range(0, windows.shape[0], per_batch):
        chunk = windows[begin : begin + per_batch].to(device)
        with autocast_context(device, autocast):
            logits = model(chunk[:, :-1])
        nll = F.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none")  # (b, length)
        total += nll.double().sum().item()
        total_last += nll[:, -last:].double().sum().item()
        if on_batch is not None:
            on_batch(min(begin + per_batch, windows.shape[0]))
    count = windows.shape[0]
    return LengthResult(length, total / (count * length), total_last / (count * last), count, count * length)


def _evaluate_sliding(model, data, length, train_len, *, max_tokens, tokens_per_batch, on_batch, stride, autocast,
                      device) -> LengthResult:
    windows, first = sliding_windows(data, length, stride, max_tokens)
    per_batch = max(1, tokens_per_batch // length)
    last = min(train_len, length)
    position = torch.arange(length, device=device)
    total = total_last = 0.0
    scored = scored_last = 0
    for begin in range(0, windows.shape[0], per_batch):
        chunk = windows[begin : begin + per_batch].to(device)
        with autocast_context(device, autocast):
            logits = model(chunk[:, :-1])
        nll = F.cross_entropy(logits.float().transpose(1, 2), chunk[:, 1:], reduction="none").double()  # (b, length)
        keep = position >= first[begin : begin + per_batch].to(device).unsqueeze(1)
        keep_last = keep & (position >= length - last)
        total += nll[keep].sum().item()
        total_last += nll[keep_last].sum().item()
        scored += int(keep.sum())
        scored_last += int(keep_last.sum())
        if on_batch is not None:
            on_batch(min(begin + per_batch, windows.shape[0]))
    return LengthResult(length, total / scored, total_last / scored_last, windows.shape[0], scored)
