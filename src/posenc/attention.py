"""Attention with a positional encoding, through the encoding's hooks only.

``attention(q, k, v, encoding)`` applies the encoding's ``rotate`` hook to q and k, takes
its ``score_bias`` and ``content`` terms, and runs one of the backends; it never looks at
the encoding's name. Shapes: B batch, H heads, Tq queries, Tk keys, D head_dim.

Masking convention: a causal query i sees key j iff j <= i + (Tk - Tq), i.e. the queries
are the last Tq of the Tk keys (bottom-right alignment, as with a KV cache).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .encodings.base import PositionalEncoding, check_positions

BACKENDS = ("auto", "eager", "sdpa")


def causal_mask(num_queries: int, num_keys: int, device: torch.device | None = None) -> Tensor:
    """Boolean (Tq, Tk), True where query i may attend key j (j <= i + Tk - Tq)."""
    q_idx = torch.arange(num_queries, device=device).unsqueeze(-1) + (num_keys - num_queries)
    return torch.arange(num_keys, device=device) <= q_idx


def _default_positions(positions: Tensor | None, length: int, offset: int, device, argname: str, batch: int) -> Tensor:
    if positions is None:
        return torch.arange(offset, offset + length, device=device)
    check_positions(positions, argname)
    if positions.shape[-1] != length or (positions.dim() == 2 and positions.shape[0] not in (1, batch)):
        raise ValueError(f"{argname} must have shape ({length},) or ({batch}, {length}), got {tuple(positions.shape)}")
    return positions.to(device)


def _check_qkv(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> None:
    for argname, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{argname} must be a floating-point torch.Tensor (B, H, T, D), got {type(x).__name__}")
        if x.dim() != 4:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{argname} must be a 4-D tensor (B, H, T, D), got {shape}")
        if not x.is_floating_point():
            raise TypeError(f"{argname} must be a floating-point tensor, got {x.dtype}")
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"q (B, H, Tq, D), k and v (B, H, Tk, D) disagree: got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share head_dim, got {q.shape[-1]} and {k.shape[-1]}")
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise ValueError("q, k and v must share one dtype and one device")
    if causal and q.shape[2] > k.shape[2]:
        raise ValueError(f"causal attention needs Tq <= Tk (queries are the last keys), got Tq={q.shape[2]}, Tk={k.shape[2]}")


def _eager(q, k, v, *, bias, mask, scale, content_scores, content_values) -> Tensor:
    """Reference backend: explicit logits in float32 (float64 for float64 inputs), softmax,
    weighted sum."""
    wide = torch.promote_types(q.dtype, torch.float32)
    logits = q.to(wide) @ k.to(wide).transpose(-2, -1)
    if content_scores is not None:
        logits = logits + content_scores(q, k).to(wide)
    logits = logits * scale
    if bias is not None:
        logits = logits + bias
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    out = probs @ v.to(wide)
    if content_values is not None:
        extra = content_values(probs)
        if extra is not None:
            out = out + extra.to(wide)
    return out.to(q.dtype)


def _sdpa(q, k, v, *, bias, mask, scale, content_scores, content_values) -> Tensor:
    """torch's scaled_dot_product_attention; the bias (and mask) go in as one float mask."""
    if content_values is not None:
        raise ValueError("backend='sdpa' cannot add a content term to the values; use backend='eager' or 'auto'")
    extra = None
    if content_scores is not None:
        extra = content_scores(q, k).float() * scale
    if bias is not None:
        extra = bias if extra is None else extra + bias
    if extra is None:
        is_causal = mask is not None and q.shape[2] == k.shape[2]
        attn_mask = None if is_causal else mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
    # The float mask must be in q's dtype: a bias past its range (ALiBi at a distance of a
    # million in float16) is clamped to the largest finite value, a zero weight either way,
    # so that only masked entries are -inf (docs/precision.md).
    limit = torch.finfo(q.dtype).max
    extra = extra.clamp(-limit, limit)
    if mask is not None:
        extra = extra.masked_fill(~mask, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=extra.to(q.dtype), scale=scale)


_BACKEND_FNS: dict[str, Callable[..., Tensor]] = {"eager": _eager, "sdpa": _sdpa}


def _resolve_backend(backend: str, encoding: PositionalEncoding | None) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "auto":
        return backend
    if encoding is not None and "content" in encoding.hooks:
        return "eager"
    return "sdpa"


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    encoding: PositionalEncoding | None = None,
    *,
    causal: bool = True,
    q_positions: Tensor | None = None,
    k_positions: Tensor | None = None,
    backend: str = "auto",
) -> Tensor:
    """Scaled dot-product attention with a positional encoding.

    softmax((rotate(q) . rotate(k)^T + content) / sqrt(D) + bias + mask) @ v (+ content on v),
    the encoding contributing through its hooks (``rotate``, ``score_bias``, ``content``).

    Args:
        q: (B, H, Tq, D). k, v: (B, H, Tk, D). One floating dtype and device.
        encoding: a :class:`~posenc.PositionalEncoding` (``posenc.create(...)``) or None.
        causal: mask keys after each query, queries aligned to the end of the keys.
        q_positions: integer positions (Tq,) or (B, Tq); default ``arange(Tk - Tq, Tk)``.
        k_positions: integer positions (Tk,) or (B, Tk); default ``arange(Tk)``.
        backend: "eager" (explicit float32 reference), "sdpa" (torch's
            scaled_dot_product_attention, the bias as a float mask, ``is_causal`` when there is
            no bias) or "auto".

    Returns:
        (B, H, Tq, D) in q's dtype.

    Raises:
        ValueError: wrong ranks or mismatched shapes, dtypes or devices; causal with Tq > Tk;
            negative or mis-shaped positions; an unknown backend. TypeError: q/k/v not
            floating-point tensors, float positions, causal not a bool, an encoding that is
            not a PositionalEncoding. NaN or inf in q, k, v are not checked (that would
            synchronize the device on every call): they propagate to the outputs they reach.
    """
    _check_qkv(q, k, v, causal)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    if encoding is not None and not isinstance(encoding, PositionalEncoding):
        raise TypeError(
            f"encoding must be a posenc.PositionalEncoding (posenc.create(name, ...)) or None, got {type(encoding).__name__}"
        )
    name = _resolve_backend(backend, encoding)
    batch, _, num_queries, head_dim = q.shape
    num_keys = k.shape[2]
    q_positions = _default_positions(q_positions, num_queries, num_keys - num_queries, q.device, "q_positions", batch)
    k_positions = _default_positions(k_positions, num_keys, 0, q.device, "k_positions", batch)

    bias = content_scores = content_values = None
    if encoding is not None:
        if "rotate" in encoding.hooks:
            q, k = encoding.rotate(q, k, q_positions, k_positions)
        if "score_bias" in encoding.hooks:
            bias = encoding.score_bias(q_positions, k_positions)
            if bias is not None and bias.dim() == 4 and bias.shape[0] == 1 and batch != 1:
                bias = bias.expand(batch, -1, -1, -1)
        if "content" in encoding.hooks:
            def content_scores(q_, k_):
                return encoding.content_scores(q_, k_, q_positions, k_positions)

            if encoding.content_on_values:
                def content_values(probs):
                    return encoding.content_values(probs, q_positions, k_positions)

    mask = causal_mask(num_queries, num_keys, q.device) if causal else None
    return _BACKEND_FNS[name](
        q, k, v,
        bias=bias, mask=mask, scale=1.0 / math.sqrt(head_dim),
        content_scores=content_scores, content_values=content_values,
    )
