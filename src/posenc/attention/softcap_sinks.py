"""Logit soft-capping and attention sinks: two changes to the softmax that every backend
derives from the two functions here.

- Soft-capping (Gemma 2, Team Gemma 2024, section 2; Grok-1): each logit s, taken after the
  scale and after the encoding's score bias, content terms and gate bias, and before the
  mask, becomes ``softcap * tanh(s / softcap)``. Reference: transformers
  ``models/gemma2/modeling_gemma2.py`` ``eager_attention_forward`` (scaled scores capped,
  then the additive mask added). Here the mask may already be folded into the logits as
  -inf (the blocked backend's tiles, eager's one additive term): an entry of -inf stays -inf
  (:func:`softcap_logits`), so capping and masking commute and a bias of -inf masks, as
  everywhere else.
- Sinks (gpt-oss, OpenAI 2025; Xiao et al. 2023's attention sinks as a learned logit): per
  query head h a logit s_h joins every row's softmax and takes probability mass without
  contributing a value, ``p = softmax([scores_row, s_h])[:-1]``. Reference: transformers
  ``models/gpt_oss/modeling_gpt_oss.py`` ``eager_attention_forward`` (``module.sinks``,
  ``combined_logits``, ``probs[..., :-1]``). With the row's log-sum-exp L over its keys the
  same output is ``out * sigmoid(L - s_h)`` (:func:`sink_factor`): what a backend that returns
  L does, and what branch-merge attention does once on the merged L.

Shapes: B batch, H query heads, Tq queries.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posenc.errors import InvalidArgument, InvalidType

__all__ = ["check_sinks", "check_softcap", "sink_column", "sink_factor", "softcap_logits"]


def check_softcap(softcap) -> float | None:
    """``softcap`` as a float, or None (no capping).

    Raises:
        InvalidArgument: not a finite real number > 0 (a bool is not a number).
    """
    if softcap is None:
        return None
    ok = isinstance(softcap, (int, float)) and not isinstance(softcap, bool) and math.isfinite(softcap) and softcap > 0
    if not ok:
        raise InvalidArgument(f"softcap must be None or a finite number > 0 (Gemma 2: 50.0), got {softcap!r}")
    return float(softcap)


def check_sinks(sinks, num_heads: int, device: torch.device) -> Tensor | None:
    """``sinks`` checked: a floating (H,) tensor on q's device, one logit per query head.

    Raises:
        InvalidType: not a floating-point tensor. InvalidArgument: not of shape (H,), or on
            another device.
    """
    if sinks is None:
        return None
    if not isinstance(sinks, Tensor) or not sinks.is_floating_point():
        kind = sinks.dtype if isinstance(sinks, Tensor) else type(sinks).__name__
        raise InvalidType(f"sinks must be a floating-point torch.Tensor of shape (H,) = ({num_heads},), "
                          f"one logit per query head, got {kind}")
    if sinks.dim() != 1 or sinks.shape[0] != num_heads:
        raise InvalidArgument(f"sinks must have shape (H,) = ({num_heads},), one logit per query head "
                              f"(with grouped-query heads: per query head), got {tuple(sinks.shape)}")
    if sinks.device != device:
        raise InvalidArgument(f"sinks must be on q's device {device}, got {sinks.device}")
    return sinks


def softcap_logits(scores: Tensor, softcap: float | None) -> Tensor:
    """``softcap * tanh(scores / softcap)`` elementwise, -inf entries (masked) kept -inf; the
    scores themselves when ``softcap`` is None. Out of place; differentiable (the derivative
    is 1 - tanh^2, 0 at the masked entries)."""
    if softcap is None:
        return scores
    capped = torch.tanh(scores / softcap) * softcap
    return torch.where(scores == float("-inf"), scores, capped)


def sink_factor(lse: Tensor, sinks: Tensor) -> Tensor:
    """sigmoid(L - s_h): the share of a row's probability its keys keep beside the sink, (B, H,
    Tq, 1) from the row's log-sum-exp ``lse`` (B, H, Tq) over its keys (-inf for no key: 0)
    and ``sinks`` (H,); computed in lse's dtype (float32 at least)."""
    wide = torch.promote_types(lse.dtype, torch.float32)
    return torch.sigmoid(lse.to(wide) - sinks.to(wide).view(-1, 1)).unsqueeze(-1)


def sink_column(sinks: Tensor, batch: int, num_queries: int) -> Tensor:
    """The sink as one more branch of :func:`posenc.attention.branches.merge_by_lse`: its
    log-sum-exp, s_h for every row, (B, H, Tq); its output is zero."""
    return sinks.view(1, -1, 1).expand(batch, -1, num_queries)
