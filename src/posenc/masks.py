"""Positions and attention masks for padded and packed batches, the Hugging Face way.

Positions are explicit (DESIGN.md), so a left-padded batch and packed documents go through
the same model code as a plain batch; only the positions and the ``mask`` differ:

- left padding: :func:`positions_from_padding_mask` (cumsum(padding_mask) - 1) and
  :func:`key_padding_mask` (pad keys hidden);
- packing: :func:`positions_from_document_ids` (positions restart at 0 in each document) and
  :func:`document_mask` (no attention across documents).

Shapes: B batch, T tokens; Tq and Tk query and key tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_padding_mask(padding_mask: Tensor) -> Tensor:
    """The (B, T) padding mask as bool (True = a real token).

    Raises:
        ValueError: not a (B, T) boolean or 0/1 integer tensor.
    """
    if not isinstance(padding_mask, Tensor) or padding_mask.dim() != 2 or padding_mask.is_floating_point():
        got = tuple(padding_mask.shape) if isinstance(padding_mask, Tensor) else type(padding_mask).__name__
        raise ValueError(f"padding_mask must be a (B, T) boolean or 0/1 integer tensor, got {got}")
    if padding_mask.dtype != torch.bool and not bool(((padding_mask == 0) | (padding_mask == 1)).all()):
        raise ValueError("padding_mask must hold only 0 (pad) and 1 (token)")
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
        raise ValueError(f"{argname} must be an integer tensor (T,) or (B, T), got {got}")


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
        :meth:`posenc.model.TransformerLM.forward`.

    Raises:
        ValueError: not integer tensors of rank 1 or 2.
    """
    _check_document_ids(q_document_ids, "q_document_ids")
    k_document_ids = q_document_ids if k_document_ids is None else k_document_ids
    _check_document_ids(k_document_ids, "k_document_ids")
    return q_document_ids.unsqueeze(-1) == k_document_ids.unsqueeze(-2)


__all__ = ["positions_from_padding_mask", "key_padding_mask", "positions_from_document_ids", "document_mask"]
