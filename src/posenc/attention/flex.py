"""torch's FlexAttention with the encoding's ``score_mod`` and a causal block mask (keys wholly
in the future skipped by blocks), and'ed with the encoding's ``mask_mod`` when it has the
``mask`` hook; compiled once per process, lazily, per shape."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from ..encodings.base import PositionalEncoding

#: Compile FlexAttention only for sequences at least this long: torch 2.13's compiled CPU
#: kernel is wrong for sequences shorter than a 64-row block.
FLEX_COMPILE_MIN_LENGTH = 128

_compiled_flex_attention: Callable[..., Tensor] | None = None


def unsupported(encoding: PositionalEncoding | None, *, mask: Tensor | None, dropout_p: float = 0.0) -> str | None:
    """No content terms (no hook for them in a score_mod that sees one score), no user mask, no dropout."""
    if encoding is not None and "content" in encoding.hooks:
        return "backend='flex' has no content terms; use backend='eager' or 'auto'"
    if encoding is not None and "gate" in encoding.hooks:
        return "backend='flex' has no gate bias; use backend='blocked', 'sdpa', 'eager' or 'auto'"
    if mask is not None:
        return "backend='flex' does not take mask=; use backend='blocked', 'sdpa', 'eager' or 'auto'"
    if dropout_p:
        return "backend='flex' has no attention dropout (dropout_p); use backend='blocked', 'sdpa', 'eager' or 'auto'"
    return None


def run(q: Tensor, k: Tensor, v: Tensor, *, encoding: PositionalEncoding | None, q_positions: Tensor,
        k_positions: Tensor, causal: bool, mask: Tensor | None, scale: float, dropout_p: float = 0.0,
        gate_state: object = None) -> Tensor:
    global _compiled_flex_attention
    score_mod = None
    if encoding is not None and "score_bias" in encoding.hooks:
        score_mod = encoding.score_mod(q_positions, k_positions)
        if score_mod is None:
            raise ValueError(f"backend='flex' needs the encoding's score_mod(); {type(encoding).__name__} has none")
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as err:  # pragma: no cover - torch < 2.5
        raise ValueError("backend='flex' needs torch.nn.attention.flex_attention (torch >= 2.5)") from err
    num_queries, num_keys = q.shape[2], k.shape[2]
    gqa = k.shape[1] != q.shape[1]
    mask_mod, mask_rows = _mask_mod(encoding, q_positions, k_positions, causal=causal, offset=num_keys - num_queries,
                                    batch=q.shape[0])

    def make_block_mask():
        if mask_mod is None:
            return None
        return create_block_mask(mask_mod, mask_rows, None, num_queries, num_keys, device=q.device)

    if torch.compiler.is_compiling():
        # inside the caller's torch.compile, flex_attention is traced as one higher-order op
        # and compiled with the caller's graph: no nested compile, no warnings context
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=make_block_mask(), scale=scale, enable_gqa=gqa)
    if min(num_queries, num_keys) < FLEX_COMPILE_MIN_LENGTH:
        # the uncompiled flex_attention (scores materialized, small here) is exact
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=make_block_mask(), scale=scale, enable_gqa=gqa)
    if _compiled_flex_attention is None:
        # dynamic=True fails to compile in torch 2.13 on CPU (an inductor codegen error).
        _compiled_flex_attention = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex_attention(q, k, v, score_mod=score_mod, block_mask=make_block_mask(), scale=scale,
                                    enable_gqa=gqa)


def _mask_mod(encoding: PositionalEncoding | None, q_positions: Tensor, k_positions: Tensor, *, causal: bool,
              offset: int, batch: int) -> tuple[Callable | None, int | None]:
    """The block mask's ``mask_mod``: the causal one (key index <= query index + Tk - Tq) and'ed
    with the encoding's (its ``mask`` hook, read at the positions), or None for neither; and its
    batch size for ``create_block_mask`` (None: one mask for every row; B when the encoding's
    mask reads (B, T) positions)."""
    positional = encoding.mask_mod(q_positions, k_positions) if encoding is not None else None

    def causal_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    if positional is None:
        return (causal_mod if causal else None), None
    rows = batch if q_positions.dim() == 2 or k_positions.dim() == 2 else None
    if not causal:
        return positional, rows

    def causal_and_positional(b, h, q_idx, kv_idx):
        return causal_mod(b, h, q_idx, kv_idx) & positional(b, h, q_idx, kv_idx)

    return causal_and_positional, rows
