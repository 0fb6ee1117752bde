"""Rotary position embedding (RoPE; Su et al. 2021, "RoFormer", section 3.4).

Shapes: B batch, H heads, T sequence length, D head_dim, r rotary_dim (r <= D, even).

Conventions (they differ between codebases):
- ``half-split`` (default; GPT-NeoX, Hugging Face Llama): dimension i pairs with i + r/2;
  cos and sin are full width, the half repeated: [c_0 .. c_{r/2-1}, c_0 .. c_{r/2-1}].
- ``interleaved`` (RoFormer paper, GPT-J, Meta's original Llama): dimension 2i pairs with
  2i+1; cos and sin duplicate each pair: [c_0, c_0, c_1, c_1, ...].
- Partial rotary, Hugging Face ``partial_rotary_factor`` semantics: only ``x[..., :r]``
  rotates, with frequencies built from r (base^(-2i/r)); ``x[..., r:]`` passes through.
- Angles ``position * inv_freq`` are computed in float64 and rounded once, whatever the
  activation dtype; the rotation itself runs in float32 or wider and is cast back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from .base import PositionalEncoding, check_even
from .rope_scaling import compute_rope_parameters


def rope_frequencies(
    head_dim: int,
    *,
    base: float = 10000.0,
    scaling: Mapping[str, Any] | None = None,
    seq_len: int | None = None,
) -> tuple[Tensor, float]:
    """RoPE inverse frequencies and attention factor.

    ``inv_freq[i] = base^(-2i/head_dim)`` for i < head_dim / 2 (RoFormer eq. 15), modified by
    ``scaling``, a Hugging Face ``rope_scaling`` dict (``{"rope_type": ..., "factor": ...}``).
    Pass the rotary dimension as ``head_dim`` for partial rotary.

    Returns:
        (inv_freq, attention_factor): float32 tensor (head_dim // 2,) in radians per token,
        and the float that Hugging Face multiplies cos and sin by (1.0 without scaling).

    Raises:
        ValueError: ``head_dim`` not a positive even integer, ``base`` <= 1, or an unknown
            rope_type. KeyError: a required scaling key is missing.
    """
    check_even(head_dim, "head_dim")
    if not isinstance(base, (int, float)) or not base > 1:
        raise ValueError(f"base (rope_theta) must be a number > 1, got {base!r}")
    return compute_rope_parameters(head_dim, float(base), scaling, seq_len)


def rotate_half(x: Tensor) -> Tensor:
    """(x_1, x_2) -> (-x_2, x_1) on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x: Tensor) -> Tensor:
    """(x_0, x_1, x_2, x_3, ...) -> (-x_1, x_0, -x_3, x_2, ...)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


#: Elements per chunk of :func:`apply_rotary`'s fast path (2 MiB of float32): big enough
#: that the per-op overhead of the few ops per chunk is small, small enough that a chunk
#: stays in cache between those ops, so each element crosses main memory about once each
#: way. Measured best of 2^15 .. 2^24 on a 2-core AVX2 CPU (benchmarks/bench_rope.py).
_CHUNK_ELEMENTS = 1 << 19


def _pair_views(t: Tensor, interleaved: bool) -> tuple[Tensor, Tensor]:
    """The two members of each rotated pair, as views: halves (i, i + D/2) or (2i, 2i+1)."""
    if interleaved:
        return t[..., 0::2], t[..., 1::2]
    half = t.shape[-1] // 2
    return t[..., :half], t[..., half:]


def _rows(t: Tensor, start: int, stop: int, num_rows: int) -> Tensor:
    """Rows start:stop of dimension -2 when t has all num_rows of them (else t broadcasts)."""
    if t.dim() >= 2 and t.shape[-2] == num_rows:
        return t[..., start:stop, :]
    return t


def _rotate_into(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor, interleaved: bool) -> Tensor:
    """out = x * cos + rotate(x) * sin, chunked over dimension -2, no autograd.

    Per chunk: one product over the full width, then one ``addcmul_`` per pair member,
    ``out_1 -= x_2 * sin_1`` and ``out_2 += x_1 * sin_2``: the products and sums of the
    formula without building rotate(x). Narrower inputs (bf16, fp16) are widened per chunk
    into a cache-sized scratch, reused across chunks, and the result is rounded once into
    ``out``.
    """
    wide = torch.promote_types(x.dtype, torch.promote_types(cos.dtype, sin.dtype))
    cos, sin = cos.to(wide), sin.to(wide)
    if x.dim() < 2:  # a single row
        x, out, cos, sin = x.unsqueeze(0), out.unsqueeze(0), cos.unsqueeze(0), sin.unsqueeze(0)
    num_rows = x.shape[-2]
    step = max(1, min(num_rows, _CHUNK_ELEMENTS * num_rows // max(1, x.numel())))
    chunk_shape = x.shape[:-2] + (step, x.shape[-1])
    widen = x.dtype != wide
    direct = out.dtype == wide and out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    x_scratch = torch.empty(chunk_shape, dtype=wide, device=x.device) if widen else None
    out_scratch = None if direct else torch.empty(chunk_shape, dtype=wide, device=x.device)
    for start in range(0, num_rows, step):
        stop = min(num_rows, start + step)
        xs, os_ = x[..., start:stop, :], out[..., start:stop, :]
        c, s = _rows(cos, start, stop, num_rows), _rows(sin, start, stop, num_rows)
        if widen:
            xs = x_scratch[..., : stop - start, :].copy_(xs)
        dst = os_ if direct else out_scratch[..., : stop - start, :]
        torch.mul(xs, c, out=dst)
        x1, x2 = _pair_views(xs, interleaved)
        d1, d2 = _pair_views(dst, interleaved)
        s1, s2 = _pair_views(s, interleaved)
        d1.addcmul_(x2, s1, value=-1)
        d2.addcmul_(x1, s2)
        if not direct:
            os_.copy_(dst)
    return out


class _ApplyRotary(torch.autograd.Function):
    """The fast path with its gradient: the transpose of a rotation, itself a rotation."""

    @staticmethod
    def forward(ctx, x, cos, sin, interleaved):
        ctx.save_for_backward(cos, sin)
        ctx.interleaved = interleaved
        return _rotate_into(x, cos, sin, torch.empty_like(x, memory_format=torch.contiguous_format), interleaved)

    @staticmethod
    def backward(ctx, grad_out):
        cos, sin = ctx.saved_tensors
        # out_1 = x_1 c_1 - x_2 s_1, out_2 = x_2 c_2 + x_1 s_2  =>  grad_x_1 = g_1 c_1 + g_2 s_2,
        # grad_x_2 = g_2 c_2 - g_1 s_1: the same rotation with sin' = -(s_2, s_1) (swapped members).
        s1, s2 = _pair_views(sin, ctx.interleaved)
        sin_t = torch.empty_like(sin, memory_format=torch.contiguous_format)
        t1, t2 = _pair_views(sin_t, ctx.interleaved)
        torch.neg(s2, out=t1)
        torch.neg(s1, out=t2)
        grad = _rotate_into(grad_out, cos, sin_t, torch.empty_like(grad_out), ctx.interleaved)
        return grad, None, None, None


def apply_rotary(
    x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False, out: Tensor | None = None
) -> Tensor:
    """Rotate pairs of x's last dimension: ``x * cos + rotate(x) * sin``.

    ``rotate`` is ``rotate_half`` (half-split: (x_1, x_2) -> (-x_2, x_1)) or, interleaved,
    ``rotate_every_two`` ((x_0, x_1, ...) -> (-x_1, x_0, ...)). The fast path computes the
    same products and sums without building ``rotate(x)``: one pass over x per chunk of
    rows, so it runs near memory bandwidth (``benchmarks/bench_rope.py``).

    Args:
        x: (..., T, D), D even.
        cos, sin: broadcastable to x, full width D: half-split repeats the half
            ``[c_0 .. c_{D/2-1}, c_0 .. c_{D/2-1}]``; interleaved duplicates each pair
            ``[c_0, c_0, c_1, c_1, ...]``. Every entry is read, as in the formula.
        interleaved: pair (2i, 2i+1) instead of (i, i + D/2).
        out: optional preallocated result of x's shape and dtype (no autograd); it may be x
            itself, for an in-place rotation.

    Returns:
        A new tensor of x's shape and dtype (or ``out``); the arithmetic runs in the widest
        of x's, cos's and sin's dtypes (float32 for a bf16 x with float32 tables) and is
        rounded to x's dtype once. Differentiable in x; if cos or sin require grad, the
        plain formula runs instead.

    Raises:
        ValueError: odd D, cos/sin whose last dimension is not D or that do not broadcast to
            x's shape, or an ``out`` of another shape or dtype.
    """
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"x: the last dimension must be even to form pairs, got {d}")
    if cos.shape[-1] != d or sin.shape[-1] != d:
        raise ValueError(f"cos and sin must have last dimension {d} (full width), got {cos.shape[-1]} and {sin.shape[-1]}")
    try:
        shape = torch.broadcast_shapes(x.shape, cos.shape, sin.shape)
    except RuntimeError as err:
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must broadcast to x {tuple(x.shape)}") from err
    if shape != x.shape:
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must broadcast to x {tuple(x.shape)}")
    if out is not None:
        if out.shape != x.shape or out.dtype != x.dtype:
            raise ValueError(f"out must have x's shape {tuple(x.shape)} and dtype {x.dtype}, got {tuple(out.shape)}, {out.dtype}")
        return _rotate_into(x, cos, sin, out, interleaved)
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        rotated = rotate_every_two(x) if interleaved else rotate_half(x)
        return (x * cos + rotated * sin).to(x.dtype)
    if torch.is_grad_enabled() and x.requires_grad:
        return _ApplyRotary.apply(x, cos, sin, interleaved)
    return _rotate_into(x, cos, sin, torch.empty_like(x, memory_format=torch.contiguous_format), interleaved)


def _full_width(half: Tensor, interleaved: bool) -> Tensor:
    """(..., r/2) -> (..., r) in the layout's order."""
    if interleaved:
        return half.repeat_interleave(2, dim=-1)
    return torch.cat((half, half), dim=-1)


class RoPE(PositionalEncoding):
    """Rotary position embedding (Su et al. 2021, RoFormer, section 3.4.2, eq. 34).

    q_m and k_n are rotated by angles m * theta_i and n * theta_i, so q_m . k_n depends on
    positions only through m - n.

    Args:
        head_dim: D, the per-head width of q and k (positive, even).
        rotary_dim: r, how many leading dimensions rotate (even, <= head_dim); default D.
        partial_rotary_factor: alternatively r = int(head_dim * factor) (Hugging Face).
        base: rope_theta, 10000 in the paper.
        interleaved: pair (2i, 2i+1) (RoFormer / GPT-J) instead of (i, i + r/2) (NeoX / HF).
        scaling: a Hugging Face ``rope_scaling`` dict, or None.

    Hook: ``rotate``. Raises ValueError on an odd head_dim or rotary_dim, or rotary_dim >
    head_dim.
    """

    name = "rope"
    hooks = frozenset({"rotate"})

    def __init__(
        self,
        head_dim: int,
        *,
        rotary_dim: int | None = None,
        partial_rotary_factor: float | None = None,
        base: float = 10000.0,
        interleaved: bool = False,
        scaling: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        check_even(head_dim, "head_dim")
        if rotary_dim is not None and partial_rotary_factor is not None:
            raise ValueError("give rotary_dim or partial_rotary_factor, not both")
        if partial_rotary_factor is not None:
            if not 0 < partial_rotary_factor <= 1:
                raise ValueError(f"partial_rotary_factor must be in (0, 1], got {partial_rotary_factor!r}")
            rotary_dim = int(head_dim * partial_rotary_factor)
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        check_even(rotary_dim, "rotary_dim")
        if rotary_dim > head_dim:
            raise ValueError(f"rotary_dim must be <= head_dim={head_dim}, got {rotary_dim}")
        self.head_dim, self.rotary_dim = head_dim, rotary_dim
        self.base, self.interleaved = float(base), bool(interleaved)
        self.scaling = dict(scaling) if scaling is not None else None
        inv_freq, self.attention_factor = rope_frequencies(rotary_dim, base=base, scaling=self.scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._cache: dict[tuple[torch.device, torch.dtype], tuple[Tensor, Tensor]] = {}

    @classmethod
    def for_model(cls, *, d_model, num_heads, head_dim, max_positions, causal=True, **kwargs):
        return cls(head_dim, **kwargs)

    def _tables(self, num_positions: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin for positions 0 .. n-1, full width r, built once and grown by doubling."""
        key = (device, dtype)
        cached = self._cache.get(key)
        if cached is not None and cached[0].shape[0] >= num_positions:
            return cached
        n = max(num_positions, 2 * cached[0].shape[0] if cached is not None else 0, 256)
        inv_freq = self.inv_freq.to(device=device, dtype=torch.float64)
        angles = torch.arange(n, device=device, dtype=torch.float64).unsqueeze(-1) * inv_freq
        cos = _full_width(angles.cos() * self.attention_factor, self.interleaved)
        sin = _full_width(angles.sin() * self.attention_factor, self.interleaved)
        self._cache[key] = (cos.to(dtype), sin.to(dtype))
        return self._cache[key]

    def cos_sin(self, positions: Tensor, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """cos and sin (attention factor included) at integer positions (T,) or (B, T).

        Returns two tensors (T, r) or (B, T, r) of ``dtype`` in this encoding's layout.
        """
        n = int(positions.max()) + 1 if positions.numel() else 1
        cos, sin = self._tables(n, positions.device, dtype)
        return cos[positions], sin[positions]

    def _rotate_one(self, x: Tensor, positions: Tensor) -> Tensor:
        cos, sin = self.cos_sin(positions, torch.promote_types(x.dtype, torch.float32))
        if positions.dim() == 2:  # (B, T, r) -> (B, 1, T, r) to broadcast over heads
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        r = self.rotary_dim
        if r == x.shape[-1]:
            return apply_rotary(x, cos, sin, interleaved=self.interleaved)
        rotated = apply_rotary(x[..., :r], cos, sin, interleaved=self.interleaved)
        return torch.cat((rotated, x[..., r:]), dim=-1)

    def rotate(self, q, k, q_positions, k_positions):
        if q.shape[-1] != self.head_dim or k.shape[-1] != self.head_dim:
            raise ValueError(f"q and k must have head_dim={self.head_dim}, got {q.shape[-1]} and {k.shape[-1]}")
        return self._rotate_one(q, q_positions), self._rotate_one(k, k_positions)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"interleaved={self.interleaved}, scaling={self.scaling}"
        )
