"""Attention with a positional encoding, through the encoding's hooks only.

``attention(q, k, v, encoding)`` applies the encoding's ``rotate`` hook to q and k, takes
its ``score_bias`` and ``content`` terms, and runs one of the backends; it never looks at
the encoding's name. Shapes: B batch, H heads, Tq queries, Tk keys, D head_dim.

Masking convention: a causal query i sees key j iff j <= i + (Tk - Tq), i.e. the queries
are the last Tq of the Tk keys (bottom-right alignment, as with a KV cache). An optional
boolean ``mask`` (True = may attend: document masks of packed rows, key padding) is combined
with it by logical and. A query left with no key to attend (a left-padding query) gets an
output of zeros, never NaN: see :func:`combine_masks`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..encodings.base import PositionalEncoding
from .._validation import check_positions

BACKENDS = ("auto", "eager", "sdpa", "blocked", "flex")

#: backend="auto" switches from "sdpa" (bias materialized once) to "blocked" when the
#: materialized bias, B_bias * H * Tq * Tk float32 entries, would exceed this many.
AUTO_BLOCKED_MIN_BIAS_ELEMENTS = 1 << 22

#: The "blocked" backend sizes its query blocks so that one bias tile, B_bias * H * block *
#: Tk, holds at most this many float32 entries (16 MiB): memory stays O(T), not O(T^2).
BLOCKED_TILE_ELEMENTS = 1 << 22

#: Query rows per block once the bias tiles are strided views costing no memory (a
#: translation-invariant bias with the causal mask folded in): few enough that the future
#: keys computed and masked inside a block's diagonal stay a small fraction (rows / T),
#: enough that per-call overhead is amortized. Best of 64 .. 1024 at T = 8192, H = 8, D = 64
#: on a 2-core CPU (benchmarks/bench_attention.py).
BLOCKED_VIEW_ROWS = 256

#: backend="flex" compiles FlexAttention (once per shape) only for sequences at least this long.
FLEX_COMPILE_MIN_LENGTH = 128


def causal_mask(num_queries: int, num_keys: int, device: torch.device | None = None) -> Tensor:
    """Boolean (Tq, Tk), True where query i may attend key j (j <= i + Tk - Tq)."""
    q_idx = torch.arange(num_queries, device=device).unsqueeze(-1) + (num_keys - num_queries)
    return torch.arange(num_keys, device=device) <= q_idx


def _check_mask(mask: Tensor, batch: int, heads: int, num_queries: int, num_keys: int) -> Tensor:
    """Validate a user mask and bring it to 4-D (B or 1, H or 1, Tq or 1, Tk)."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        kind = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a boolean tensor (True = may attend), got {kind}")
    allowed = f"(Tq, Tk), (B, Tq, Tk) or (B, H, Tq, Tk) with B={batch}, H={heads}, Tq={num_queries}, Tk={num_keys} (or 1 to broadcast)"
    if mask.dim() not in (2, 3, 4):
        raise ValueError(f"mask must have shape {allowed}, got {tuple(mask.shape)}")
    full = mask[None, None] if mask.dim() == 2 else mask[:, None] if mask.dim() == 3 else mask
    if full.shape[-1] != num_keys or full.shape[-2] not in (1, num_queries) \
            or full.shape[0] not in (1, batch) or full.shape[1] not in (1, heads):
        raise ValueError(f"mask must have shape {allowed}, got {tuple(mask.shape)}")
    return full


def combine_masks(causal: Tensor | None, mask: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """The mask the backends get, and which query rows have no key at all.

    Returns ``(combined, has_key)``: ``combined`` = causal and mask, 4-D when a user mask is
    given (a 2-D mask reaching a backend is the plain causal mask, which SDPA may run as
    ``is_causal``); ``has_key`` (..., Tq, 1) is None when every query sees at least one key.
    Rows without a key are opened to every key so that no backend computes a softmax over
    nothing (NaN); :func:`attention` then sets their output to zero.
    """
    if mask is None:
        return causal, None
    combined = mask if causal is None else mask & causal
    has_key = combined.any(dim=-1, keepdim=True)
    if bool(has_key.all()):
        return combined, None
    return combined | ~has_key, has_key


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
    weighted sum.

    logits = scale * (q.k^T + content) + bias + mask (0 or -inf): the terms that are not q.k^T
    are summed first into one additive tensor, which goes into ``baddbmm`` with q.k^T: at
    small head dimensions every pass over the (B, H, Tq, Tk) scores costs as much as the
    product itself, forward and backward (3.2 ms against 5.3-6.5 ms for product, scale,
    masked_fill at B=32, H=4, T=64, D=16).
    """
    wide = torch.promote_types(q.dtype, torch.float32)
    batch, heads, num_queries, num_keys = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    q3, k3t = q.to(wide).flatten(0, 1), k.to(wide).flatten(0, 1).transpose(-2, -1)
    additive = None
    if mask is not None:
        additive = torch.zeros(mask.shape, dtype=wide, device=q.device).masked_fill_(~mask, float("-inf"))
    if bias is not None:
        additive = bias.to(wide) if additive is None else bias.to(wide) + additive
    if content_scores is not None:
        content = content_scores(q, k).to(wide)
        additive = content * scale if additive is None else torch.add(additive, content, alpha=scale)
    if additive is None:
        logits = torch.bmm(q3 * scale, k3t)
    elif additive.shape[:-2].numel() == 1:  # one (Tq, Tk) term for every row and head
        logits = torch.baddbmm(additive.reshape(additive.shape[-2:]), q3, k3t, alpha=scale)
    elif additive.shape[:-2] == (batch, heads):
        logits = torch.baddbmm(additive.reshape(-1, *additive.shape[-2:]), q3, k3t, alpha=scale)
    else:  # broadcast over batch or heads: one add after the product
        logits = torch.add(additive, torch.bmm(q3, k3t).view(batch, heads, num_queries, num_keys), alpha=scale)
    probs = torch.softmax(logits.view(batch, heads, num_queries, num_keys), dim=-1)
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
        # a 2-D mask is the plain causal one (combine_masks makes user masks 4-D)
        is_causal = mask is not None and mask.dim() == 2 and q.shape[2] == k.shape[2]
        attn_mask = None if is_causal else mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
    extra = _finite_in(extra, q.dtype)
    if mask is not None:
        extra = extra.masked_fill(~mask, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=_as_4d(extra.to(q.dtype)), scale=scale)


def _finite_in(bias: Tensor, dtype: torch.dtype) -> Tensor:
    """The float mask must be in q's dtype: a bias past its range (ALiBi at a distance of a
    million in float16) is clamped to the largest finite value, a zero weight either way, so
    that only masked entries are -inf (docs/precision.md)."""
    limit = torch.finfo(dtype).max
    if not bias.is_floating_point() or limit >= torch.finfo(bias.dtype).max:
        return bias  # the cast cannot overflow
    return torch.where(bias == float("-inf"), bias, bias.clamp(-limit, limit))  # a folded-in mask stays -inf


def _as_4d(mask: Tensor) -> Tensor:
    """(Tq, Tk) or (H, Tq, Tk) -> 4-D: torch 2.13 on CPU sends a 3-D float mask to the slow
    math kernel of SDPA (materializing the scores) and a 4-D one to its flash kernel."""
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    return mask


def _blocked(q, k, v, *, score_bias, q_positions, k_positions, causal, scale, user_mask=None) -> Tensor:
    """Query blocks: per block, SDPA with a bias tile from the encoding's ``score_bias`` hook
    on that block's positions, never the whole (H, Tq, Tk) bias.

    Under a causal mask a block's queries see only keys ``< block end + Tk - Tq``: later key
    blocks are skipped. When the queries are the last keys (default positions, a KV cache)
    the hook is asked for the bias with the causal mask folded in (``causal=True``), and for
    the block's queries in descending order: a translation-invariant bias (ALiBi, T5,
    Kerple) then comes back as a strided view of its Tq + Tk - 1 values, no tile in memory,
    and blocks grow to ``BLOCKED_VIEW_ROWS``. Otherwise the block's diagonal slab of the
    tile gets the -inf mask. ``user_mask`` (4-D boolean, the causal mask already folded in)
    is sliced per block.
    """
    _, num_heads, num_queries, _ = q.shape
    num_keys = k.shape[2]
    offset = num_keys - num_queries
    bias_rows = q.shape[0] if (q_positions.dim() == 2 or k_positions.dim() == 2) else 1
    # at least 2 rows, so that a strided (overlapping) tile can show itself: see _is_compact
    block = min(num_queries, max(2, BLOCKED_TILE_ELEMENTS // max(1, bias_rows * num_heads * num_keys)))
    has_bias = score_bias is not None
    fold = has_bias and causal and user_mask is None and _queries_are_last_keys(q_positions, k_positions)
    descending = has_bias and user_mask is None and q_positions.dim() == 1 and (fold or not causal)
    out = torch.empty_like(q)
    start = 0
    while start < num_queries:
        stop = min(num_queries, start + block)
        key_end = stop + offset if causal else num_keys
        q_pos, q_rows = q_positions[..., start:stop], q[:, :, start:stop]
        if descending:
            q_pos, q_rows = q_pos.flip(-1), q_rows.flip(2)
        k_pos = k_positions[..., :key_end]
        tile = None
        if has_bias:
            tile = score_bias(q_pos, k_pos, causal=True) if fold else score_bias(q_pos, k_pos)
        mask = _block_mask(tile, start, stop, key_end, causal=causal and not fold, user_mask=user_mask,
                           dtype=q.dtype, device=q.device)
        if tile is not None and _is_compact(mask):
            block = max(block, BLOCKED_VIEW_ROWS)  # the tile costs no memory: fewer, larger calls
        block_out = F.scaled_dot_product_attention(q_rows, k[:, :, :key_end], v[:, :, :key_end], attn_mask=mask,
                                                   scale=scale)
        out[:, :, start:stop] = block_out.flip(2) if descending else block_out
        del tile, mask, block_out  # before the next block's tile is made: one tile alive at a time
        start = stop
    return out


def _queries_are_last_keys(q_positions: Tensor, k_positions: Tensor) -> bool:
    """True when the positional causal mask (key position <= query position) is the
    index one (j <= i + Tk - Tq): 1-D positions, keys strictly increasing, and the queries'
    positions those of the last Tq keys (default positions, a KV cache)."""
    if q_positions.dim() != 1 or k_positions.dim() != 1:
        return False
    num_queries, num_keys = q_positions.shape[0], k_positions.shape[0]
    if num_keys > 1 and not bool((k_positions.diff() > 0).all()):
        return False
    return bool(torch.equal(q_positions, k_positions[num_keys - num_queries:]))


def _block_mask(tile, start, stop, key_end, *, causal, user_mask, dtype, device) -> Tensor | None:
    """The SDPA mask of query rows start:stop (ascending) from their bias tile (or None):
    user mask or causal -inf added, finite in ``dtype``, 4-D."""
    if user_mask is not None:
        allowed = (user_mask if user_mask.shape[-2] == 1 else user_mask[..., start:stop, :])[..., :key_end]
        if tile is None:
            return allowed
        return _as_4d(_finite_in(tile, dtype).masked_fill(~allowed, float("-inf")).to(dtype))
    if tile is None:
        return causal_mask(stop - start, key_end, device) if causal else None
    tile = _finite_in(tile, dtype)
    if causal:
        tile = _mask_future(tile, stop - start, key_end)
    return _as_4d(tile.to(dtype))


def _is_compact(tile: Tensor) -> bool:
    """A tile held in less memory than its size: its entries overlap (a strided view of the
    distinct values of a Toeplitz bias) or broadcast, so more rows cost no more memory."""
    return tile.untyped_storage().nbytes() < tile.numel() * tile.element_size()


def _mask_future(tile: Tensor, rows: int, key_end: int) -> Tensor:
    """-inf on a block's future keys (bottom-right alignment): only the last ``rows`` keys.

    In place when the tile is a full-shape dense tensor outside autograd (``score_bias``
    returns a new tensor each call); otherwise out of place.
    """
    first = key_end - rows  # keys before ``first`` are visible to every query of the block
    future = torch.arange(rows, device=tile.device) > torch.arange(rows, device=tile.device).unsqueeze(-1)
    dense = tile.is_contiguous() and tile.shape[-2:] == (rows, key_end) and tile.is_floating_point()
    if dense and not (torch.is_grad_enabled() and tile.requires_grad):
        tile[..., first:].masked_fill_(future, float("-inf"))
        return tile
    full = torch.zeros(rows, key_end, dtype=torch.bool, device=tile.device)
    full[:, first:] = future
    return tile.masked_fill(full, float("-inf"))


_compiled_flex_attention: Callable[..., Tensor] | None = None


def _flex(q, k, v, *, score_mod, q_positions, k_positions, causal, scale) -> Tensor:
    """torch's FlexAttention (compiled once per process, lazily) with the encoding's
    ``score_mod`` and a causal block mask; keys wholly in the future are skipped by blocks."""
    global _compiled_flex_attention
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as err:  # pragma: no cover - torch < 2.5
        raise ValueError("backend='flex' needs torch.nn.attention.flex_attention (torch >= 2.5)") from err
    num_queries, num_keys = q.shape[2], k.shape[2]
    if min(num_queries, num_keys) < FLEX_COMPILE_MIN_LENGTH:
        # torch 2.13's compiled CPU kernel is wrong for sequences shorter than a 64-row
        # block; the uncompiled flex_attention (scores materialized, small here) is exact.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            mask = None
            if causal:
                offset = num_keys - num_queries
                mask = create_block_mask(lambda b, h, i, j: j <= i + offset, None, None, num_queries, num_keys,
                                         device=q.device)
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale)
    if _compiled_flex_attention is None:
        # dynamic=True fails to compile in torch 2.13 on CPU (an inductor codegen error).
        _compiled_flex_attention = torch.compile(flex_attention, dynamic=False)
    block_mask = None
    if causal:
        offset = num_keys - num_queries

        def causal_mod(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx + offset

        block_mask = create_block_mask(causal_mod, None, None, num_queries, num_keys, device=q.device)
    return _compiled_flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


_BACKEND_FNS: dict[str, Callable[..., Tensor]] = {"eager": _eager, "sdpa": _sdpa}

#: Backends that take the bias lazily (a function of position slices, or a ``score_mod``)
#: instead of a materialized (H, Tq, Tk) tensor; they have no content terms.
_LAZY_BIAS_BACKEND_FNS: dict[str, Callable[..., Tensor]] = {"blocked": _blocked, "flex": _flex}


def _resolve_backend(
    backend: str, encoding: PositionalEncoding | None, bias_elements: int = 0, device: torch.device | None = None
) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "auto":
        return backend
    if encoding is not None and "content" in encoding.hooks:
        return "eager"
    if encoding is not None and "score_bias" in encoding.hooks:
        if bias_elements >= AUTO_BLOCKED_MIN_BIAS_ELEMENTS:
            return "blocked"
        if _learns_bias_on_cpu(encoding, device):
            return "eager"
    return "sdpa"


def _learns_bias_on_cpu(encoding: PositionalEncoding, device: torch.device | None) -> bool:
    """A learned bias (T5, Kerple, FIRE) in training on the CPU: torch's CPU SDPA kernels give
    no gradient for a float mask, so SDPA runs its math path; the eager backend is the same
    computation with fewer passes (6.4 against 7.5-8.9 ms per call at B=32, H=4, T=64, D=16)."""
    on_cpu = device is None or torch.device(device).type == "cpu"
    return on_cpu and torch.is_grad_enabled() and any(p.requires_grad for p in encoding.parameters())


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
    mask: Tensor | None = None,
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
            no bias), "blocked" (query blocks, each with its own bias tile from the encoding's
            ``score_bias`` on that block's positions; memory O(T), future key blocks skipped),
            "flex" (torch FlexAttention with the encoding's ``score_mod`` and a causal block
            mask; compiled on first use per shape) or "auto": "eager" for content encodings,
            "blocked" when the materialized bias would hold at least
            ``AUTO_BLOCKED_MIN_BIAS_ELEMENTS`` (4M) entries (on every device: blocked was
            1.1-1.2x bias-free causal SDPA at T=4096-8192 on CPU for ALiBi, T5 and Kerple,
            against 5-9x for the materialized bias, and flex needs a compile), "eager" for a
            learned bias training on the CPU (CPU SDPA gives no gradient for a float mask), else
            "sdpa". "blocked" and "flex" take no content encodings; "blocked" may write into a
            contiguous tensor ``score_bias`` returns.
        mask: optional boolean tensor, True where query i may attend key j, of shape
            (Tq, Tk), (B, Tq, Tk) or (B, H, Tq, Tk), any of B, H, Tq may be 1 to broadcast
            (a key-padding mask is (B, 1, Tk)). Combined with the causal mask by logical and.
            Used for document masks of packed rows and for padding
            (:func:`posenc.model.document_mask`, :func:`posenc.model.key_padding_mask`).
            A query that may attend no key at all (e.g. a left-padding query) gets an output
            of zeros, Shaw's value term included: no NaN. Every backend but "flex" takes it.

    Returns:
        (B, H, Tq, D) in q's dtype.

    Raises:
        ValueError: wrong ranks or mismatched shapes, dtypes or devices; causal with Tq > Tk;
            negative or mis-shaped positions; a mis-shaped mask; an unknown backend.
            TypeError: q/k/v not floating-point tensors, float positions, a mask that is not
            boolean, causal not a bool, an encoding that is not a PositionalEncoding. NaN or
            inf in q, k, v are not checked (that would synchronize the device on every call):
            they propagate to the outputs they reach.
    """
    _check_qkv(q, k, v, causal)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    if encoding is not None and not isinstance(encoding, PositionalEncoding):
        raise TypeError(
            f"encoding must be a posenc.PositionalEncoding (posenc.create(name, ...)) or None, got {type(encoding).__name__}"
        )
    batch, num_heads, num_queries, head_dim = q.shape
    num_keys = k.shape[2]
    q_positions = _default_positions(q_positions, num_queries, num_keys - num_queries, q.device, "q_positions", batch)
    k_positions = _default_positions(k_positions, num_keys, 0, q.device, "k_positions", batch)
    bias_rows = batch if q_positions.dim() == 2 or k_positions.dim() == 2 else 1
    name = _resolve_backend(backend, encoding, bias_rows * num_heads * num_queries * num_keys, q.device)
    lazy = name in _LAZY_BIAS_BACKEND_FNS
    has_key = None
    if mask is not None:
        mask = _check_mask(mask, batch, num_heads, num_queries, num_keys).to(q.device)
        mask, has_key = combine_masks(causal_mask(num_queries, num_keys, q.device) if causal else None, mask)
    elif causal and not lazy:
        mask = causal_mask(num_queries, num_keys, q.device)
    if lazy:
        # never the (Tq, Tk) causal mask: these backends mask each block themselves
        out = _lazy_bias_attention(name, q, k, v, encoding, causal, q_positions, k_positions, mask)
    else:
        out = _hooked_attention(name, q, k, v, encoding, q_positions, k_positions, mask)
    return out if has_key is None else out.masked_fill(~has_key, 0.0)


def _hooked_attention(name, q, k, v, encoding, q_positions, k_positions, mask) -> Tensor:
    """Apply the encoding's hooks and run a backend that takes a materialized bias."""
    bias = content_scores = content_values = None
    batch = q.shape[0]
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

    return _BACKEND_FNS[name](
        q, k, v,
        bias=bias, mask=mask, scale=1.0 / math.sqrt(q.shape[-1]),
        content_scores=content_scores, content_values=content_values,
    )


def _lazy_bias_attention(name, q, k, v, encoding, causal, q_positions, k_positions, user_mask) -> Tensor:
    """Dispatch to a backend that evaluates the bias per tile ("blocked") or per score ("flex")."""
    hooks = encoding.hooks if encoding is not None else frozenset()
    if "content" in hooks:
        raise ValueError(f"backend={name!r} has no content terms; use backend='eager' or 'auto'")
    if "rotate" in hooks:
        q, k = encoding.rotate(q, k, q_positions, k_positions)
    scale = 1.0 / math.sqrt(q.shape[-1])
    if name == "flex":
        if user_mask is not None:
            raise ValueError("backend='flex' does not take mask=; use backend='blocked', 'sdpa', 'eager' or 'auto'")
        score_mod = None
        if "score_bias" in hooks:
            if not callable(getattr(encoding, "score_mod", None)):
                raise ValueError(f"backend='flex' needs the encoding's score_mod(); {type(encoding).__name__} has none")
            score_mod = encoding.score_mod(q_positions, k_positions)
        return _flex(q, k, v, score_mod=score_mod, q_positions=q_positions, k_positions=k_positions,
                     causal=causal, scale=scale)
    score_bias = encoding.score_bias if "score_bias" in hooks else None
    return _blocked(q, k, v, score_bias=score_bias, q_positions=q_positions, k_positions=k_positions,
                    causal=causal, scale=scale, user_mask=user_mask)
