"""The reference backend: explicit logits in float32 (float64 for float64 inputs), softmax,
weighted sum. Takes every hook, the content terms included."""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.attention.masks import causal_mask
from posenc.attention.softcap_sinks import sink_factor, softcap_logits
from posenc.attention.tiling import dense_bias, dense_gate_bias
from posenc.encodings.base import Hook, PositionalEncoding


def unsupported(encoding: PositionalEncoding | None, *, mask: Tensor | None, dropout_p: float = 0.0,
                softcap: float | None = None, sinks: Tensor | None = None) -> str | None:
    """Every encoding, mask, soft-cap and sink: never a reason to refuse."""
    return None


def run(q: Tensor, k: Tensor, v: Tensor, *, encoding: PositionalEncoding | None, q_positions: Tensor,
        k_positions: Tensor, causal: bool, mask: Tensor | None, scale: float, dropout_p: float = 0.0,
        gate_state: object = None, softcap: float | None = None, sinks: Tensor | None = None) -> Tensor:
    """logits = scale * (q.k^T + content) + bias + gate bias + mask (0 or -inf) (the content term
    after the scale for an encoding with ``content_scaled = False``), soft-capped
    (``softcap``: the masked -inf entries stay -inf) and softmaxed beside the sinks (``sinks``:
    the probabilities times sigmoid(L - s_h)), :mod:`posenc.attention.softcap_sinks`. The terms that are not
    q.k^T are summed first into one additive tensor, which goes into ``baddbmm`` with q.k^T: at
    small head dimensions every pass over the (B, H, Tq, Tk) scores costs as much as the
    product itself, forward and backward (the timing: docs/results.md, "Measurements behind the
    code").
    """
    batch, heads, num_queries, num_keys = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    bias = dense_bias(encoding, q_positions, k_positions, num_heads=heads, batch=batch)
    gate_bias = dense_gate_bias(encoding, gate_state, num_queries, num_keys, causal=causal, device=q.device)
    if gate_bias is not None:
        bias = gate_bias if bias is None else bias + gate_bias
    content = encoding is not None and Hook.CONTENT in encoding.hooks
    if content and k.shape[1] != heads:
        # content terms are per query head and read k (Transformer-XL's u.k_j): one k per head
        k, v = k.repeat_interleave(heads // k.shape[1], dim=1), v.repeat_interleave(heads // v.shape[1], dim=1)
    if content and bias is None and gate_bias is None and mask is None and not dropout_p and softcap is None \
            and sinks is None:
        # the encoding's fused attention, where it has one for this call (a CPU kernel)
        fused = encoding.content_attention(q, k, v, q_positions, k_positions, causal=causal, scale=scale)
        if fused is not None:
            return fused.to(q.dtype)
    # Grouped-query: the G query heads of a key-value head are one (G * Tq)-row product with
    # that head's keys, so k and v are never repeated (query head h = kv * G + g).
    groups = heads // k.shape[1]
    kv_rows = batch * k.shape[1]
    wide = torch.promote_types(q.dtype, torch.float32)
    q3 = q.to(wide).reshape(kv_rows, groups * num_queries, q.shape[-1])
    k3t = k.to(wide).reshape(kv_rows, num_keys, k.shape[-1]).transpose(-2, -1)
    if mask is None and causal:
        mask = causal_mask(num_queries, num_keys, q.device)
    additive = None
    if mask is not None:
        additive = torch.zeros(mask.shape, dtype=wide, device=q.device).masked_fill_(~mask, float("-inf"))
    if bias is not None:
        additive = bias.to(wide) if additive is None else bias.to(wide) + additive
    if content:
        scores = encoding.content_scores(q, k, q_positions, k_positions, mask=mask, gate_state=gate_state)
        if scores is not None:
            scores = scores.to(wide)
            factor = scale if encoding.content_scaled else 1.0
            additive = scores * factor if additive is None else torch.add(additive, scores, alpha=factor)
    if additive is None:
        logits = torch.bmm(q3 * scale, k3t)
    elif groups == 1 and additive.shape[:-2].numel() == 1:  # one (Tq, Tk) term for every row and head
        logits = torch.baddbmm(additive.reshape(additive.shape[-2:]), q3, k3t, alpha=scale)
    elif additive.shape[:-2] == (batch, heads):
        logits = torch.baddbmm(additive.reshape(kv_rows, groups * num_queries, num_keys), q3, k3t, alpha=scale)
    else:  # broadcast over batch or heads: one add after the product
        logits = torch.add(additive, torch.bmm(q3, k3t).view(batch, heads, num_queries, num_keys), alpha=scale)
    logits = softcap_logits(logits.view(batch, heads, num_queries, num_keys), softcap)
    probs = torch.softmax(logits, dim=-1)
    if sinks is not None:
        probs = probs * sink_factor(torch.logsumexp(logits, dim=-1), sinks)
    if dropout_p:
        probs = torch.nn.functional.dropout(probs, p=dropout_p)
    out = torch.bmm(probs.reshape(kv_rows, groups * num_queries, num_keys), v.to(wide).reshape(kv_rows, num_keys, -1))
    out = out.view(batch, heads, num_queries, -1)
    if content and encoding.content_on_values:
        extra = encoding.content_values(probs, q_positions, k_positions)
        if extra is not None:
            out = out + extra.to(wide)
    return out.to(q.dtype)


def run_with_lse(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, scale: float,
                 causal: bool = False, softcap: float | None = None) -> tuple[Tensor, Tensor]:
    """Plain attention (no bias, content or gate: a branch of branch-merge attention) and its
    log-sum-exp, for :func:`posenc.attention.branches.merge_by_lse`; the scaled scores
    soft-capped first when ``softcap`` is given (:func:`~posenc.attention.softcap_sinks.softcap_logits`).

    q (B, H, Tq, D), k and v (B, H_kv, Tk, D); ``mask`` None or bool broadcastable to
    (B, H, Tq, Tk) (True: may attend), the causal mask (bottom-right) added when ``causal``
    and ``mask`` is None. Returns (out (B, H, Tq, D) in the accumulation dtype, float32 or
    float64; lse (B, H, Tq) of the scaled, masked scores, -inf for a row with no key, whose
    output is 0). Scores explicit: (B, H, Tq, Tk) memory.
    """
    batch, heads, num_queries, num_keys = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if mask is None and causal:
        mask = causal_mask(num_queries, num_keys, q.device)
    groups, kv_rows = heads // k.shape[1], batch * k.shape[1]
    wide = torch.promote_types(q.dtype, torch.float32)
    q3 = q.to(wide).reshape(kv_rows, groups * num_queries, q.shape[-1]) * scale
    k3t = k.to(wide).reshape(kv_rows, num_keys, k.shape[-1]).transpose(-2, -1)
    logits = softcap_logits(torch.bmm(q3, k3t).view(batch, heads, num_queries, num_keys), softcap)
    has_key = None
    if mask is not None:
        # a row with no key is opened to every key (a finite softmax, no NaN in any gradient),
        # then its output set to 0 and its lse to -inf
        has_key = mask.any(dim=-1, keepdim=True)
        logits = logits.masked_fill(~(mask | ~has_key), float("-inf"))
    # torch's softmax kernel (its exp of -inf entries is several times faster than torch.exp's
    # on the CPU), and the log-sum-exp read back from its largest probability: p_max =
    # exp(max - lse), so lse = max - log(p_max), with p_max >= 1 / Tk (no loss of precision)
    probs = torch.softmax(logits, dim=-1)
    lse = logits.amax(dim=-1) - probs.amax(dim=-1).log()
    out = torch.bmm(probs.reshape(kv_rows, groups * num_queries, num_keys), v.to(wide).reshape(kv_rows, num_keys, -1))
    out = out.view(batch, heads, num_queries, -1)
    if has_key is not None:
        out = torch.where(has_key, out, torch.zeros((), dtype=out.dtype, device=out.device))
        lse = torch.where(has_key.squeeze(-1), lse, torch.full((), float("-inf"), dtype=lse.dtype, device=lse.device))
    return out, lse
