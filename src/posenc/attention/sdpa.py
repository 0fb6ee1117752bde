"""torch's scaled_dot_product_attention: the bias (and mask, and content scores) go in as
one float mask, materialized; ``is_causal`` when there is nothing to add.

Sinks (gpt-oss): on the CPU when nothing but the sinks needs a gradient, through a merged
log-sum-exp: torch's CPU flash kernel returns each row's log-sum-exp L, and the output is
scaled by sigmoid(L - s_h) (no (Tq, Tk) tensor for a causal call with Tq = Tk). Otherwise (a
gradient for q, k, v or a bias, dropout, CUDA, torch.compile) as one more key: k and v zero,
its column of the float mask s_h, so its logit is s_h and its value nothing, the softmax over
[scores, s_h] of the reference, with SDPA's own backward for q, k, v, the bias and the sinks.
Soft-capping cannot go in (SDPA takes no function of the scores): refused by name."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.attention.eager import run_with_lse as _eager_with_lse
from posenc.attention.masks import as_4d, causal_mask, finite_in
from posenc.attention.softcap_sinks import sink_factor
from posenc.attention.tiling import dense_bias, dense_gate_bias
from posenc.encodings.base import Hook, PositionalEncoding
from posenc.errors import InvalidArgument


def unsupported(encoding: PositionalEncoding | None, *, mask: Tensor | None, dropout_p: float = 0.0,
                softcap: float | None = None, sinks: Tensor | None = None) -> str | None:
    """SDPA returns no probabilities: a content term on the values (Shaw) cannot be added; it
    takes no function of the scores: no soft-capping."""
    if encoding is not None and Hook.CONTENT in encoding.hooks and encoding.content_on_values:
        return "backend='sdpa' cannot add a content term to the values; use backend='eager' or 'auto'"
    if softcap is not None:
        return ("backend='sdpa' cannot apply softcap (torch's scaled_dot_product_attention takes no function of the "
                "scores); use backend='eager', 'blocked', 'flex' or 'auto'")
    return None


def run(q: Tensor, k: Tensor, v: Tensor, *, encoding: PositionalEncoding | None, q_positions: Tensor,
        k_positions: Tensor, causal: bool, mask: Tensor | None, scale: float, dropout_p: float = 0.0,
        gate_state: object = None, softcap: float | None = None, sinks: Tensor | None = None) -> Tensor:
    if softcap is not None:
        raise InvalidArgument(unsupported(encoding, mask=mask, softcap=softcap))
    num_queries, num_keys = q.shape[2], k.shape[2]
    if encoding is not None and Hook.CONTENT in encoding.hooks and k.shape[1] != q.shape[1]:
        # content terms are per query head and read k (Transformer-XL's u.k_j): one k per head
        k, v = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1), v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    sdpa = functools.partial(F.scaled_dot_product_attention, scale=scale, dropout_p=dropout_p,
                             enable_gqa=k.shape[1] != q.shape[1])
    extra = None
    if encoding is not None and Hook.CONTENT in encoding.hooks:
        visible = causal_mask(num_queries, num_keys, q.device) if mask is None and causal else mask
        scores = encoding.content_scores(q, k, q_positions, k_positions, mask=visible, gate_state=gate_state)
        if scores is not None:
            extra = scores.to(torch.promote_types(scores.dtype, torch.float32))  # float64 stays float64
            if encoding.content_scaled:
                extra = extra * scale
    bias = dense_bias(encoding, q_positions, k_positions, num_heads=q.shape[1], batch=q.shape[0])
    gate_bias = dense_gate_bias(encoding, gate_state, num_queries, num_keys, causal=causal, device=q.device)
    if gate_bias is not None:
        bias = gate_bias if bias is None else bias + gate_bias
    if bias is not None:
        extra = bias if extra is None else extra + bias
    if sinks is not None and _lse_kernel_serves(q, k, v, extra, dropout_p):
        return _with_sinks_merged(q, k, v, extra=extra, mask=mask, causal=causal, scale=scale, sinks=sinks)
    if sinks is not None:
        return _with_sink_key(sdpa, q, k, v, extra=extra, mask=mask, causal=causal, sinks=sinks)
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


def _lse_kernel_serves(q: Tensor, k: Tensor, v: Tensor, extra: Tensor | None, dropout_p: float) -> bool:
    """Whether torch's CPU flash kernel (its log-sum-exp has no derivative) can serve a call
    with sinks: CPU, no dropout, outside torch.compile, and no gradient wanted for q, k, v or
    the bias (the sinks' own gradient needs none: L does not depend on them), and one head size
    for q, k and v (the kernel refuses a value head narrower than the query's: MiMo-V2-Flash, Hy V4)."""
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, extra))
    return (q.device.type == "cpu" and not dropout_p and not needs_grad and not torch.compiler.is_compiling()
            and _one_head_size(q, k, v))


def _one_head_size(q: Tensor, k: Tensor, v: Tensor) -> bool:
    return q.shape[-1] == k.shape[-1] == v.shape[-1]


def _with_sinks_merged(q: Tensor, k: Tensor, v: Tensor, *, extra: Tensor | None, mask: Tensor | None, causal: bool,
                       scale: float, sinks: Tensor) -> Tensor:
    """SDPA's output and log-sum-exp L from ``aten._scaled_dot_product_flash_attention_for_cpu``
    (grouped-query k and v as they are; its ``is_causal`` is top-left aligned, so only for
    Tq = Tk without a float mask), the output times sigmoid(L - s_h). Rows without a key were
    opened to every key by :func:`posenc.attention` (and are zeroed there)."""
    num_queries, num_keys = q.shape[2], k.shape[2]
    is_causal = causal and mask is None and extra is None and num_queries == num_keys
    if mask is None and causal and not is_causal:
        mask = causal_mask(num_queries, num_keys, q.device)
    float_mask = None
    if extra is not None or mask is not None:
        float_mask = torch.zeros((), dtype=q.dtype, device=q.device) if extra is None else finite_in(extra, q.dtype).to(q.dtype)
        if mask is not None:
            float_mask = torch.where(mask, float_mask, torch.full((), float("-inf"), dtype=q.dtype, device=q.device))
        float_mask = as_4d(float_mask)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, is_causal, attn_mask=float_mask, scale=scale)
    return (out * sink_factor(lse, sinks)).to(q.dtype)


def _with_sink_key(sdpa, q: Tensor, k: Tensor, v: Tensor, *, extra: Tensor | None, mask: Tensor | None, causal: bool,
                   sinks: Tensor) -> Tensor:
    """SDPA over the keys and one sink key: k and v padded with a zero row (B, H_kv, Tk + 1, D),
    the float mask (1 or B, H, Tq, Tk + 1) the bias and mask as :func:`run` makes them, then
    the column s_h (q.0 * scale + s_h = s_h; its value 0 adds nothing). The mask is always
    materialized (there is no ``is_causal`` with one more key)."""
    batch, heads, num_queries, num_keys = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if mask is None and causal:
        mask = causal_mask(num_queries, num_keys, q.device)
    logits = torch.zeros((), dtype=q.dtype, device=q.device) if extra is None else finite_in(extra, q.dtype).to(q.dtype)
    if mask is not None:
        logits = torch.where(mask, logits, torch.full((), float("-inf"), dtype=q.dtype, device=q.device))
    logits = as_4d(logits)
    rows = logits.shape[0]
    logits = logits.expand(rows, heads, num_queries, num_keys)
    sink = sinks.to(q.dtype).view(1, heads, 1, 1).expand(rows, heads, num_queries, 1)
    zero = q.new_zeros(())
    k = torch.cat([k, zero.expand(batch, k.shape[1], 1, k.shape[-1])], dim=2)
    v = torch.cat([v, zero.expand(batch, v.shape[1], 1, v.shape[-1])], dim=2)
    return sdpa(q, k, v, attn_mask=torch.cat([logits, sink], dim=-1))



def run_with_lse(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, scale: float,
                 causal: bool = False, softcap: float | None = None) -> tuple[Tensor, Tensor]:
    """Plain attention and its log-sum-exp (a branch of branch-merge attention), as
    :func:`posenc.attention.eager.run_with_lse` (same arguments and returns; out in q's dtype).

    On the CPU without a gradient to take: torch's flash kernel for the CPU,
    ``aten._scaled_dot_product_flash_attention_for_cpu``, which returns the log-sum-exp (the
    mask goes in as a 0 / -inf float mask in q's dtype; grouped-query k and v as they are);
    its lse of a row with no key is 0, set to -inf here. ``causal`` with a ``mask``: the mask is
    taken to hold the causal mask already (as :func:`posenc.attention` and
    :func:`~posenc.attention.branches.run_branches` hand it); with Tq = Tk the kernel is told
    too, so that it skips the key blocks above the diagonal (half the work of a prefill; the
    kernel's causal mask is top-left, the same as ours only when Tq = Tk). Elsewhere (CUDA: torch exposes no
    public SDPA with a log-sum-exp and an arbitrary mask), and whenever q, k or v need a
    gradient (the CPU kernel's lse output has no derivative): the eager computation, explicit
    (B, H, Tq, Tk) scores. docs/fast_attention.md, "Branch-merge attention". ``softcap``
    is refused (:func:`unsupported`): SDPA cannot cap.
    """
    if softcap is not None:
        raise InvalidArgument(unsupported(None, mask=mask, softcap=softcap))
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if q.device.type != "cpu" or needs_grad or not _one_head_size(q, k, v):
        out, lse = _eager_with_lse(q, k, v, mask=mask, scale=scale, causal=causal)
        return out.to(q.dtype), lse
    num_queries, num_keys = q.shape[2], k.shape[2]
    if mask is None and causal:
        mask = causal_mask(num_queries, num_keys, q.device)
    float_mask = None
    if mask is not None:
        float_mask = as_4d(torch.where(mask, torch.zeros((), dtype=q.dtype), torch.full((), float("-inf"), dtype=q.dtype)))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal and num_queries == num_keys, attn_mask=float_mask, scale=scale)
    if mask is not None:
        lse = lse.masked_fill(~as_4d(mask).any(dim=-1), float("-inf"))
    return out, lse
