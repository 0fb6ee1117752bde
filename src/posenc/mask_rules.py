"""FlexAttention's forms and the elementwise position rules that encodings and masks share.

The ground floor under both the encodings (iRoPE's chunked layers state their mask with
:func:`same_chunk`; every encoding's ``score_mod`` and ``mask_mod`` read positions with
:func:`position_at`) and the user-facing masks (:mod:`posenc.masks`: the sliding-window and
chunked mask_mods), so that each rule is written once. It imports only torch.

- :data:`ScoreMod`, :data:`MaskMod`: FlexAttention's function types (torch's
  ``torch.nn.attention.flex_attention``: ``score_mod(score, b, h, q_idx, kv_idx)``,
  ``mask_mod(b, h, q_idx, kv_idx)``).
- :func:`value_at`, :func:`position_at`: a per-token tensor read at token ``idx`` of batch row
  ``b``, the lookup a score_mod or mask_mod makes to go from row indices to positions
  (document ids, padding flags).
- :func:`same_chunk`, :func:`in_sliding_window`: the local-attention rules on positions,
  elementwise on broadcastable integer tensors (grids or the 0-d tensors of FlexAttention).
- :func:`causal_rule`, :func:`causal_mask`: the causal mask, written once: elementwise on row
  indices (FlexAttention's causal mask_mod) and as the boolean (Tq, Tk) grid every other
  backend, the branch-merge attention and the position maps use.

Shapes: B batch rows, T tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

#: FlexAttention's form of a score bias: ``score_mod(score, b, h, q_idx, kv_idx) -> score``.
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]

#: FlexAttention's form of a mask: ``mask_mod(b, h, q_idx, kv_idx) -> bool tensor`` (True = may
#: attend), elementwise on broadcastable integer tensors.
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def value_at(values: Tensor | None, b: Tensor, idx: Tensor) -> Tensor:
    """``values`` at token ``idx`` of batch row ``b``, in ``values``' dtype: (T,) and (1, T) are
    shared by every row, (B, T) is per row; None: ``idx`` itself (the row index is the value).

    Elementwise on broadcastable integer index tensors (0-d inside FlexAttention, grids in
    :func:`posenc.attention.masks.mask_from_mod`); no value is read on the host, so it traces
    under torch.compile.
    """
    if values is None:
        return idx
    if values.dim() == 1:
        return values[idx]
    if values.shape[0] == 1:  # one row for the batch: row b of the call reads it
        return values[0][idx]
    return values[b, idx]


def position_at(positions: Tensor | None, b: Tensor, idx: Tensor) -> Tensor:
    """The int64 position of token ``idx`` of batch row ``b``: :func:`value_at` on integer
    positions (T,), (1, T) or (B, T); without positions, the index itself. FlexAttention passes
    int32 indices; encodings' ``bias`` and ``attention_mask`` take int64 like every other caller."""
    return value_at(positions, b, idx).long()


def same_chunk(q_positions: Tensor, k_positions: Tensor, attention_chunk_size: int) -> Tensor:
    """Chunked (block-local) attention: True where a query and a key lie in the same chunk of
    ``attention_chunk_size`` positions, ``q // C == k // C``, elementwise on broadcastable
    integer tensors of non-negative positions -> bool of their broadcast shape.

    Llama 4's ``attention_chunk_size`` (the RoPE layers of iRoPE; Hugging Face's
    ``chunked_overlay``). Chunks follow positions, not row indices, so a left-padded or packed
    row chunks from its own position 0.
    """
    return torch.div(q_positions, attention_chunk_size, rounding_mode="floor") == \
        torch.div(k_positions, attention_chunk_size, rounding_mode="floor")


def in_sliding_window(q_positions: Tensor, k_positions: Tensor, sliding_window: int) -> Tensor:
    """Sliding-window (local) attention: True where ``q - k < sliding_window``, elementwise on
    broadcastable integer tensors -> bool of their broadcast shape.

    Mistral's ``sliding_window`` (Jiang et al. 2023, section 2; Hugging Face's
    ``sliding_window_overlay``, ``kv_idx > q_idx - sliding_window``). One-sided: with the causal
    mask a query sees itself and the previous sliding_window - 1 positions; keys after the query
    are the causal mask's business.
    """
    return q_positions - k_positions < sliding_window


def causal_rule(q_idx: Tensor, kv_idx: Tensor, offset: Tensor | int) -> Tensor:
    """The causal mask, elementwise: True where key row ``kv_idx`` is at or before query row
    ``q_idx``, the queries being the last Tq of the Tk keys: ``kv_idx <= q_idx + offset`` with
    ``offset = Tk - Tq`` (bottom-right alignment, as a KV cache; Hugging Face's
    ``causal_mask_function`` with its cache position, flash-attn >= 2.1's ``causal``).

    On broadcastable integer tensors (index grids, or FlexAttention's 0-d tensors, where
    ``offset`` should be a 0-d tensor too so that a compiled kernel does not specialize on it)
    -> bool of their broadcast shape. Row indices, not positions: packed or padded rows are the
    user mask's and the positions' business.
    """
    return kv_idx <= q_idx + offset


def causal_mask(num_queries: int, num_keys: int, device: torch.device | None = None) -> Tensor:
    """Boolean (Tq, Tk), True where query i may attend key j: :func:`causal_rule` on the index
    grid, j <= i + Tk - Tq."""
    q_idx = torch.arange(num_queries, device=device).unsqueeze(-1)
    return causal_rule(q_idx, torch.arange(num_keys, device=device), num_keys - num_queries)


__all__ = ["MaskMod", "ScoreMod", "causal_mask", "causal_rule", "in_sliding_window", "position_at", "same_chunk",
           "value_at"]
