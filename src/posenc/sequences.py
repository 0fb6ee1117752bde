"""Sequences of a batch: padded, packed into documents, or read through a local window; the
positions and attention masks each layout needs, the Hugging Face way. Imported as
:mod:`posenc.masks` (the documented name; this module is its home, named for what it holds).

Positions are explicit (DESIGN.md), so a left-padded batch and packed documents go through
the same model code as a plain batch; only the positions and the ``mask`` differ:

- left padding: :func:`positions_from_padding_mask` (cumsum(padding_mask) - 1) and
  :func:`key_padding_mask` (pad keys hidden);
- packing: :func:`positions_from_document_ids` (positions restart at 0 in each document) and
  :func:`document_mask` (no attention across documents).

The same masks, and the local-attention masks of long-context models, also come as
FlexAttention **mask_mods**, ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (True = may attend):
:func:`document_mask_mod`, :func:`key_padding_mask_mod`, :func:`sliding_window_mask_mod`
(Mistral's ``sliding_window``), :func:`chunked_mask_mod` (Llama 4's ``attention_chunk_size``).
A mask_mod is elementwise on broadcastable integer tensors, so one function serves every
backend: ``posenc.attention(..., mask=mask_mod)`` hands it to FlexAttention's block mask on
``backend="flex"`` (no (Tq, Tk) tensor anywhere) and evaluates it on index grids for the other
backends (:func:`posenc.attention.masks.mask_from_mod`), as Hugging Face's ``masking_utils``
does with its mask functions. Combine them with torch's
``torch.nn.attention.flex_attention.and_masks`` / ``or_masks``. ``q_idx`` and ``kv_idx`` are
the rows of q and k (0 .. Tq - 1, 0 .. Tk - 1); a mask about positions looks them up in the
position tensors it was built with (default: the index is the position). The lookup and the
window and chunk rules are :mod:`posenc.mask_rules`', shared with the encodings (iRoPE's
chunked layers).

Shapes: B batch, T tokens; Tq and Tk query and key tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.errors import InvalidArgument
from posenc.mask_rules import MaskMod, in_sliding_window, position_at, same_chunk, value_at


def check_padding_mask(padding_mask: Tensor) -> Tensor:
    """The (B, T) padding mask as bool (True = a real token).

    Raises:
        ValueError: not a (B, T) boolean or 0/1 integer tensor.
    """
    if not isinstance(padding_mask, Tensor) or padding_mask.dim() != 2 or padding_mask.is_floating_point():
        got = tuple(padding_mask.shape) if isinstance(padding_mask, Tensor) else type(padding_mask).__name__
        raise InvalidArgument(f"padding_mask must be a (B, T) boolean or 0/1 integer tensor, got {got}")
    if padding_mask.dtype != torch.bool and not bool(((padding_mask == 0) | (padding_mask == 1)).all()):
        raise InvalidArgument("padding_mask must hold only 0 (pad) and 1 (token)")
    return padding_mask.bool()


def positions_from_padding_mask(padding_mask: Tensor) -> Tensor:
    """Position ids of a padded batch, Hugging Face's convention for left padding.

    ``position_ids = cumsum(padding_mask) - 1`` along T, so each row's first real token is at
    position 0 whatever the padding before it; pad slots get position 1, as Hugging Face
    fills them (any value would do: pads are masked as keys by :func:`key_padding_mask`).

    Args:
        padding_mask: (B, T) bool or 0/1 integer, True / 1 for a real token, False / 0 for a pad.

    Returns:
        LongTensor (B, T).

    Raises:
        ValueError: not a (B, T) boolean or 0/1 tensor.
    """
    real = check_padding_mask(padding_mask)
    positions = real.long().cumsum(-1) - 1
    return positions.masked_fill(~real, 1)


def key_padding_mask(padding_mask: Tensor) -> Tensor:
    """The attention ``mask`` that hides pad keys: (B, T) -> (B, 1, T) bool, broadcast over the
    queries (True = a real token, may be attended). Pad *queries* then see no key and
    :func:`posenc.attention` gives them a zero output; their logits are finite and meaningless.

    Raises:
        ValueError: not a (B, T) boolean or 0/1 tensor.
    """
    return check_padding_mask(padding_mask).unsqueeze(1)


def _check_document_ids(document_ids: Tensor, argname: str) -> None:
    if not isinstance(document_ids, Tensor) or document_ids.dim() not in (1, 2) or document_ids.is_floating_point() \
            or document_ids.dtype == torch.bool:
        got = tuple(document_ids.shape) if isinstance(document_ids, Tensor) else type(document_ids).__name__
        raise InvalidArgument(f"{argname} must be an integer tensor (T,) or (B, T), got {got}")


def positions_from_document_ids(document_ids: Tensor) -> Tensor:
    """Positions of packed rows: they restart at 0 where a new document begins.

    A document is a run of equal consecutive ids (e.g. ``[0, 0, 0, 1, 1, 2]`` gives positions
    ``[0, 1, 2, 0, 1, 0]``), as Hugging Face's ``DataCollatorWithFlattening`` writes
    ``position_ids``. With :func:`document_mask` each document is then computed as if alone.

    Args:
        document_ids: integer tensor (T,) or (B, T).

    Returns:
        LongTensor of the same shape.

    Raises:
        ValueError: not an integer tensor of rank 1 or 2.
    """
    _check_document_ids(document_ids, "document_ids")
    index = torch.arange(document_ids.shape[-1], device=document_ids.device).expand_as(document_ids)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[..., 1:] = document_ids[..., 1:] != document_ids[..., :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=-1).values  # start of each token's run
    return index - first


def document_mask(q_document_ids: Tensor, k_document_ids: Tensor | None = None) -> Tensor:
    """The attention ``mask`` of packed rows: query i may attend key j iff they share a document.

    Args:
        q_document_ids: integer (Tq,) or (B, Tq).
        k_document_ids: integer (Tk,) or (B, Tk); default the same as the queries' (a full pass).

    Returns:
        bool (Tq, Tk), or (B, Tq, Tk) if either side is per row; combine it with the causal
        mask by passing it as ``mask=`` to :func:`posenc.attention` or
        :meth:`posenc.lab.model.TransformerLM.forward`.

    Raises:
        ValueError: not integer tensors of rank 1 or 2.
    """
    _check_document_ids(q_document_ids, "q_document_ids")
    k_document_ids = q_document_ids if k_document_ids is None else k_document_ids
    _check_document_ids(k_document_ids, "k_document_ids")
    return q_document_ids.unsqueeze(-1) == k_document_ids.unsqueeze(-2)


def document_ids_from_positions(positions: Tensor) -> Tensor:
    """Document ids of packed rows from their positions alone: a document starts wherever a
    position is not the previous one plus 1 (Hugging Face's ``find_packed_sequence_indices``
    rule), e.g. positions ``[0, 1, 2, 0, 1, 0]`` give ids ``[0, 0, 0, 1, 1, 2]``. The inverse of
    :func:`positions_from_document_ids` for documents whose positions start at 0.

    Args:
        positions: integer (T,) or (B, T).

    Returns:
        LongTensor of the same shape, 0 for each row's first document.

    Raises:
        ValueError: not an integer tensor of rank 1 or 2.
    """
    _check_document_ids(positions, "positions")
    starts = torch.zeros_like(positions, dtype=torch.long)
    starts[..., 1:] = (positions[..., 1:] != positions[..., :-1] + 1).long()
    return starts.cumsum(-1)


# -- FlexAttention mask_mods ---------------------------------------------------------------

def _check_index_tensor(values: Tensor | None, argname: str) -> None:
    if values is not None:
        _check_document_ids(values, argname)


def _check_window(value: int, argname: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgument(f"{argname} must be an integer >= 1 (tokens), got {value!r}")


def document_mask_mod(q_document_ids: Tensor, k_document_ids: Tensor | None = None) -> MaskMod:
    """:func:`document_mask` as a mask_mod: query i may attend key j iff they share a document.

    Args:
        q_document_ids: integer (Tq,) or (B, Tq), e.g. Hugging Face's packed ``seq_idx``, or
            :func:`document_ids_from_positions` of the packed rows' positions.
        k_document_ids: integer (Tk,) or (B, Tk); default the queries' (a full pass).

    Raises:
        ValueError: not integer tensors of rank 1 or 2.
    """
    _check_document_ids(q_document_ids, "q_document_ids")
    k_document_ids = q_document_ids if k_document_ids is None else k_document_ids
    _check_document_ids(k_document_ids, "k_document_ids")

    def mask_mod(b, h, q_idx, kv_idx):
        return value_at(q_document_ids, b, q_idx) == value_at(k_document_ids, b, kv_idx)

    # the ids themselves, for a kernel that compares them per tile (the "triton" backend)
    mask_mod.document_ids = (q_document_ids, k_document_ids)
    return mask_mod


def key_padding_mask_mod(padding_mask: Tensor) -> MaskMod:
    """:func:`key_padding_mask` as a mask_mod: key j may be attended iff it is a real token.

    Args:
        padding_mask: (B, Tk) bool or 0/1, True / 1 for a real token (Hugging Face's ``attention_mask``).

    Raises:
        ValueError: not a (B, T) boolean or 0/1 tensor.
    """
    real = check_padding_mask(padding_mask)

    def mask_mod(b, h, q_idx, kv_idx):
        return value_at(real, b, kv_idx)

    return mask_mod


def sliding_window_mask_mod(sliding_window: int, q_positions: Tensor | None = None,
                            k_positions: Tensor | None = None) -> MaskMod:
    """Sliding-window (local) attention as a mask_mod: a query at position p may attend the keys
    at positions p' with p - p' < ``sliding_window``, i.e. itself and the previous
    sliding_window - 1 positions once combined with the causal mask (Mistral's
    ``sliding_window``, Jiang et al. 2023, section 2; Hugging Face's ``sliding_window_overlay``,
    ``kv_idx > q_idx - sliding_window``). One-sided: keys after the query are the causal mask's
    business (``causal=True``). The rule is :func:`posenc.mask_rules.in_sliding_window`.

    Args:
        sliding_window: W >= 1 tokens.
        q_positions, k_positions: integer (T,), (1, T) or (B, T) positions of the query and key rows;
            default: the row indices (then with a KV cache, Tq < Tk, pass the positions, as
            :func:`posenc.attention` aligns the queries to the end of the keys).

    Raises:
        ValueError: sliding_window not an integer >= 1; positions not integer tensors of rank 1 or 2.
    """
    _check_window(sliding_window, "sliding_window")
    _check_index_tensor(q_positions, "q_positions")
    _check_index_tensor(k_positions, "k_positions")

    def mask_mod(b, h, q_idx, kv_idx):
        return in_sliding_window(position_at(q_positions, b, q_idx), position_at(k_positions, b, kv_idx), sliding_window)

    return mask_mod


def chunked_mask_mod(attention_chunk_size: int, q_positions: Tensor | None = None,
                     k_positions: Tensor | None = None) -> MaskMod:
    """Chunked (block-local) attention as a mask_mod: query and key may meet iff their positions
    fall in the same chunk, p // C == p' // C (Llama 4's ``attention_chunk_size``, the local
    layers of iRoPE; Hugging Face's ``chunked_overlay``). Chunks follow positions, so a
    left-padded or packed row chunks from its own position 0. The rule is
    :func:`posenc.mask_rules.same_chunk`, the one iRoPE's chunked layers state.

    Args:
        attention_chunk_size: C >= 1 tokens.
        q_positions, k_positions: as :func:`sliding_window_mask_mod`.

    Raises:
        ValueError: attention_chunk_size not an integer >= 1; positions not integer tensors of rank 1 or 2.
    """
    _check_window(attention_chunk_size, "attention_chunk_size")
    _check_index_tensor(q_positions, "q_positions")
    _check_index_tensor(k_positions, "k_positions")

    def mask_mod(b, h, q_idx, kv_idx):
        return same_chunk(position_at(q_positions, b, q_idx), position_at(k_positions, b, kv_idx), attention_chunk_size)

    return mask_mod


__all__ = [
    "positions_from_padding_mask", "key_padding_mask", "positions_from_document_ids", "document_mask",
    "document_ids_from_positions", "MaskMod", "document_mask_mod", "key_padding_mask_mod", "sliding_window_mask_mod",
    "chunked_mask_mod",
]
