"""torch's scaled_dot_product_attention: the bias (and mask, and content scores) go in as
one float mask, materialized; ``is_causal`` when there is nothing to add."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.encodings.base import Hook, PositionalEncoding
from posenc.attention.masks import as_4d, causal_mask, finite_in
from posenc.attention.eager import run_with_lse as _eager_with_lse
from posenc.attention.tiling import dense_bias, dense_gate_bias


def unsupported(encoding: PositionalEncoding | None, *, mask: Tensor | None, dropout_p: float = 0.0) -> str | None:
    """SDPA returns no probabilities: a content term on the values (Shaw) cannot be added."""
    if encoding is not None and Hook.CONTENT in encoding.hooks and encoding.content_on_values:
        return "backend='sdpa' cannot add a content term to the values; use backend='eager' or 'auto'"
    return None


def run(q: Tensor, k: Tensor, v: Tensor, *, encoding: PositionalEncoding | None, q_positions: Tensor,
        k_positions: Tensor, causal: bool, mask: Tensor | None, scale: float, dropout_p: float = 0.0,
        gate_state: object = None) -> Tensor:
    num_queries, num_keys = q.shape[2], k.shape[2]
    if encoding is not None and Hook.CONTENT in encoding.hooks and k.shape[1] != q.shape[1]:
        # content terms are per query head and read k (Transformer-XL's u.k_j): one k per head
        k, v = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1), v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    sdpa = functools.partial(F.scaled_dot_product_attention, scale=scale, dropout_p=dropout_p,
                             enable_gqa=k.shape[1] != q.shape[1])
    extra = None
    if encoding is not None and Hook.CONTENT in encoding.hooks:
        visible = causal_mask(num_queries, num_keys, q.device) if mask is None and causal else mask
        scores = encoding.content_scores(q, k, q_positions, k_positions, mask=visible)
        if scores is not None:
            extra = scores.to(torch.promote_types(scores.dtype, torch.float32)) * scale  # float64 stays float64
    bias = dense_bias(encoding, q_positions, k_positions, num_heads=q.shape[1], batch=q.shape[0])
    gate_bias = dense_gate_bias(encoding, gate_state, num_queries, num_keys, causal=causal, device=q.device)
    if gate_bias is not None:
        bias = gate_bias if bias is None else bias + gate_bias
    if bias is not None:
        extra = bias if extra is None else extra + bias
    if mask is None and causal:
        if extra is None and num_queries == num_keys:
            return sdpa(q, k, v, is_causal=True)
        mask = causal_mask(num_queries, num_keys, q.device)
    if extra is None:
        return sdpa(q, k, v, attn_mask=mask)
    extra = finite_in(extra, q.dtype)
    if mask is not None:
        extra = extra.masked_fill(~mask, float("-inf"))
    return sdpa(q, k, v, attn_mask=as_4d(extra.to(q.dtype)))



def run_with_lse(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, scale: float,
                 causal: bool = False) -> tuple[Tensor, Tensor]:
    """Plain attention and its log-sum-exp (a branch of branch-merge attention), as
    :func:`posenc.attention.eager.run_with_lse` (same arguments and returns; out in q's dtype).

    On the CPU without a gradient to take: torch's flash kernel for the CPU,
    ``aten._scaled_dot_product_flash_attention_for_cpu``, which returns the log-sum-exp (the
    mask goes in as a 0 / -inf float mask in q's dtype; grouped-query k and v as they are);
    its lse of a row with no key is 0, set to -inf here. Elsewhere (CUDA: torch exposes no
    public SDPA with a log-sum-exp and an arbitrary mask), and whenever q, k or v need a
    gradient (the CPU kernel's lse output has no derivative): the eager computation, explicit
    (B, H, Tq, Tk) scores. docs/fast_attention.md, "Branch-merge attention".
    """
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if q.device.type != "cpu" or needs_grad:
        out, lse = _eager_with_lse(q, k, v, mask=mask, scale=scale, causal=causal)
        return out.to(q.dtype), lse
    num_queries, num_keys = q.shape[2], k.shape[2]
    if mask is None and causal:
        mask = causal_mask(num_queries, num_keys, q.device)
    float_mask = None
    if mask is not None:
        float_mask = as_4d(torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf")))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, False, attn_mask=float_mask, scale=scale)
    if mask is not None:
        lse = lse.masked_fill(~as_4d(mask).any(dim=-1), float("-inf"))
    return out, lse
