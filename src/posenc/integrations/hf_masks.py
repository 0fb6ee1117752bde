"""Hugging Face attention masks as posenc's, written once.

posenc's masks are boolean, True = may attend (:func:`posenc.attention`'s ``mask=``).
transformers hands an attention function one of three kinds, and the adapter families' own
attention modules a fourth:

- a boolean mask, True = may attend (``sdpa_mask``, which posenc registers for its attention);
- an additive float mask: 0 (or a bias folded in: Falcon's ALiBi) where allowed, the dtype's
  minimum where not (eager masks, BLOOM, OPT, Falcon);
- None: plain causal, the queries the last of the keys (``sdpa_mask`` drops a mask that SDPA's
  ``is_causal`` covers);
- MPT's boolean mask with the opposite sense, True = masked.

:func:`boolean_mask` reads the first, second and fourth as posenc's; :func:`additive_mask` writes
posenc's (or None) as the additive mask an eager attention function adds to its logits.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["additive_mask", "boolean_mask"]


def boolean_mask(mask: Tensor | None, *, true_masks: bool = False) -> Tensor | None:
    """transformers' mask as posenc's (True = may attend), any shape, None kept.

    Args:
        mask: boolean (True = may attend; with ``true_masks``, True = masked, as MPT spells
            it), or additive float (allowed where above half the dtype's minimum: a bias
            folded into the allowed entries, Falcon's ALiBi, stays allowed), or None.
        true_masks: the boolean mask's True means masked (MPT).

    Returns:
        bool of the mask's shape, or None for None.
    """
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return ~mask if true_masks else mask
    return mask > torch.finfo(mask.dtype).min / 2


def additive_mask(mask: Tensor | None, query: Tensor, key: Tensor, causal: bool) -> Tensor | None:
    """The mask eager attention adds to its logits, in query's dtype: 0 where allowed, the
    dtype's minimum where not (transformers' eager convention).

    Args:
        mask: posenc's boolean mask (True = may attend); None is the plain causal mask with the
            queries the last Tq of the Tk keys (or no mask when ``causal`` is False); an
            additive float mask is returned as it is.
        query: (B, H, Tq, D), for Tq, the dtype and the device. key: (B, H_kv, Tk, D), for Tk.
        causal: whether None means causal.

    Returns:
        float of query's dtype, the mask's shape ((1, 1, Tq, Tk) for None), or None.
    """
    if mask is not None and mask.dtype != torch.bool:
        return mask
    if mask is None:
        if not causal:
            return None
        num_queries, num_keys = query.shape[2], key.shape[2]
        rows = torch.arange(num_queries, device=query.device).unsqueeze(-1) + (num_keys - num_queries)
        mask = (torch.arange(num_keys, device=query.device) <= rows)[None, None]
    zero = torch.zeros((), dtype=query.dtype, device=query.device)
    return torch.where(mask, zero, torch.finfo(query.dtype).min)
