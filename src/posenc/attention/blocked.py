"""Query blocks, each an SDPA call with its own bias tile (posenc.attention.tiling): memory
O(T) instead of the (H, Tq, Tk) bias, keys wholly in a block's future skipped."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.encodings.base import Hook, PositionalEncoding
from posenc.attention.tiling import query_blocks


def unsupported(encoding: PositionalEncoding | None, *, mask: Tensor | None, dropout_p: float = 0.0) -> str | None:
    """Content terms need the whole score matrix (and Shaw's the probabilities)."""
    if encoding is not None and Hook.CONTENT in encoding.hooks:
        return "backend='blocked' has no content terms; use backend='eager' or 'auto'"
    return None


def run(q: Tensor, k: Tensor, v: Tensor, *, encoding: PositionalEncoding | None, q_positions: Tensor,
        k_positions: Tensor, causal: bool, mask: Tensor | None, scale: float, dropout_p: float = 0.0,
        gate_state: object = None) -> Tensor:
    biased = encoding if encoding is not None and Hook.SCORE_BIAS in encoding.hooks else None
    out = torch.empty_like(q)
    blocks = query_blocks(biased, q_positions, k_positions, num_heads=q.shape[1], batch=q.shape[0], causal=causal,
                          mask=mask, dtype=q.dtype, gated=encoding, gate_state=gate_state)
    for block in blocks:
        rows = q[:, :, block.start:block.stop]
        keys, values = k[:, :, :block.key_end], v[:, :, :block.key_end]
        block_out = F.scaled_dot_product_attention(rows.flip(2) if block.descending else rows, keys, values,
                                                   attn_mask=block.mask, scale=scale, dropout_p=dropout_p,
                                                   enable_gqa=k.shape[1] != q.shape[1])
        out[:, :, block.start:block.stop] = block_out.flip(2) if block.descending else block_out
        del block, block_out  # before the next block's tile is made: one tile alive at a time
    return out
