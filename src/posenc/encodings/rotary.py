"""Rotary position embedding (RoPE; Su et al. 2021, "RoFormer", section 3.4) and xPos
(Sun et al. 2022), RoPE with a per-pair exponential decay.

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

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from .base import PositionalEncoding
from .. import kernels as _kernels
from .._validation import broadcast_shape, check_bool, check_even, check_number, is_real_number
from .rope_interop import read_hf_config, write_hf_config
from .rope_scaling import compute_rope_parameters, rope_type_record


def rope_frequencies(
    head_dim: int,
    *,
    base: float = 10000.0,
    scaling: Mapping[str, Any] | None = None,
    seq_len: int | None = None,
) -> tuple[Tensor, float]:
    """RoPE inverse frequencies and attention factor.

    ``inv_freq[i] = base^(-2i/head_dim)`` for i < head_dim / 2 (RoFormer eq. 15), modified by
    ``scaling``, a Hugging Face ``rope_scaling`` dict (``{"rope_type": ..., "factor": ...}``):
    ``linear``, ``ntk``, ``dynamic``, ``yarn``, ``llama3``, ``longrope`` (formulas, sources and
    where posenc departs from Hugging Face: :mod:`posenc.encodings.rope_scaling`). ``seq_len``,
    the current length, matters for ``dynamic`` (frequencies recomputed for seq_len > L0) and
    ``longrope`` (long factors for seq_len > L0); None means "within L0". Pass the rotary
    dimension as ``head_dim`` for partial rotary.

    Returns:
        (inv_freq, attention_factor): float32 tensor (head_dim // 2,) in radians per token,
        and the float that Hugging Face multiplies cos and sin by (1.0 without scaling).

    Raises:
        ValueError: ``head_dim`` not a positive even integer, ``base`` <= 1, an unknown
            rope_type (the message lists the known ones), a bad scaling value (factor < 1,
            beta_fast < beta_slow, ...; the message names the key) or seq_len < 1.
        KeyError: a required scaling key is missing (the message names it).
    """
    check_even(head_dim, "head_dim")
    check_number(base, "base (rope_theta)", gt=1)
    return compute_rope_parameters(head_dim, float(base), scaling, seq_len)


#: Values of ``RoPE(dynamic_cache=...)``.
DYNAMIC_CACHE_MODES = ("rerotate", "frozen")

#: The regime of RoPE(dynamic_cache="frozen"): per-position frequencies (the record's
#: ``per_position``), not those of one length.
_FROZEN_REGIME = ("frozen", None)


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


def _join_pairs(first: Tensor, second: Tensor, interleaved: bool) -> Tensor:
    """The inverse of :func:`_pair_views`: a new tensor whose pair members are first, second."""
    if interleaved:
        return torch.stack((first, second), dim=-1).flatten(-2)
    return torch.cat((first, second), dim=-1)


def _wide_dtype(x: Tensor, cos: Tensor, sin: Tensor) -> torch.dtype:
    """The arithmetic dtype: float32, or the widest of x's, cos's and sin's dtypes if wider."""
    return torch.promote_types(torch.promote_types(x.dtype, torch.float32), torch.promote_types(cos.dtype, sin.dtype))


def _rotate_formula(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """x * cos + rotate(x) * sin with plain differentiable ops in the wide dtype, cast once.

    The path under ``torch.compile`` (the compiler fuses it; the chunked kernel's Python loop
    and ``out=`` writes would not trace) and when cos or sin require grad.
    """
    wide = _wide_dtype(x, cos, sin)
    xw = x.to(wide)
    rotated = rotate_every_two(xw) if interleaved else rotate_half(xw)
    return (xw * cos.to(wide) + rotated * sin.to(wide)).to(x.dtype)


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

    On a kernel device (CUDA, with Triton: :func:`posenc.kernels.use_triton`) the whole
    rotation is one Triton launch instead (:func:`posenc.kernels.rotary_triton.rotate_with_tables`).
    """
    if _kernels.use_triton(x, cos, sin):
        done = _kernels.rotary_kernels().rotate_with_tables(x, cos, sin, out, interleaved)
        if done is not None:
            return done
    wide = _wide_dtype(x, cos, sin)
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
        sin_t = _join_pairs(-s2, -s1, ctx.interleaved)
        if torch.is_grad_enabled():
            # create_graph=True (double backward): the gradient must itself be differentiable,
            # and it is again a rotation, so it goes through this Function once more.
            return _ApplyRotary.apply(grad_out, cos, sin_t, ctx.interleaved), None, None, None
        grad = _rotate_into(grad_out, cos, sin_t, torch.empty_like(grad_out, memory_format=torch.contiguous_format), ctx.interleaved)
        return grad, None, None, None


def apply_rotary(
    x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False, out: Tensor | None = None
) -> Tensor:
    """Rotate pairs of x's last dimension: ``x * cos + rotate(x) * sin``.

    ``rotate`` is ``rotate_half`` (half-split: (x_1, x_2) -> (-x_2, x_1)) or, interleaved,
    ``rotate_every_two`` ((x_0, x_1, ...) -> (-x_1, x_0, ...)). Uncompiled, the fast path
    computes the same products and sums without building ``rotate(x)``: one pass over x per
    chunk of rows, so it runs near memory bandwidth (``benchmarks/bench_rope.py``); its
    backward is again a rotation, differentiable itself (double backward works).

    On CUDA tensors with Triton installed (``pip install posenc[gpu]``) the rotation is one
    Triton launch, the same arithmetic (:func:`posenc.kernels.rotary_triton.rotate_with_tables`;
    ``posenc.kernels.TRITON_ENABLED = False`` or ``POSENC_TRITON=0`` turns it off).

    Under ``torch.compile`` (``torch.compiler.is_compiling()``) the plain formula runs
    instead, in the same dtype, and traces with ``fullgraph=True``; with ``dynamic=True`` a
    change of T (or of any other size) does not recompile, except that T = 1 is
    specialized once, as torch does for every size 0 or 1.

    Args:
        x: (..., T, D), D even.
        cos, sin: broadcastable to x, full width D: half-split repeats the half
            ``[c_0 .. c_{D/2-1}, c_0 .. c_{D/2-1}]``; interleaved duplicates each pair
            ``[c_0, c_0, c_1, c_1, ...]``. Every entry is read, as in the formula.
        interleaved: pair (2i, 2i+1) instead of (i, i + D/2).
        out: optional preallocated result of x's shape and dtype (no autograd); it may be x
            itself, for an in-place rotation.

    Returns:
        A new tensor of x's shape and dtype (or ``out``); the arithmetic runs in float32, or
        the widest of x's, cos's and sin's dtypes if that is wider (float64 for float64
        inputs), and is rounded to x's dtype once. Differentiable in x, to any order; if cos
        or sin require grad, the plain formula runs instead.

    Raises:
        TypeError: x, cos or sin not a floating-point tensor; interleaved not a bool.
        ValueError: odd D, cos/sin whose last dimension is not D, that do not broadcast to
            x's shape or are on another device, or an ``out`` of another shape or dtype.
    """
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating-point torch.Tensor, got {x.dtype if isinstance(x, Tensor) else type(x).__name__}")
    for t in (cos, sin):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            got = t.dtype if isinstance(t, Tensor) else type(t).__name__
            raise TypeError(f"cos and sin must be floating-point torch.Tensors, got {got}")
    check_bool(interleaved, "interleaved")
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"x: the last dimension must be even to form pairs, got {d}")
    if cos.shape[-1] != d or sin.shape[-1] != d:
        raise ValueError(f"cos and sin must have last dimension {d} (full width), got {cos.shape[-1]} and {sin.shape[-1]}")
    try:
        shape = broadcast_shape(x.shape, cos.shape, sin.shape)
    except ValueError as err:
        raise ValueError(f"cos and sin must broadcast to x's shape {tuple(x.shape)}, got {tuple(cos.shape)} and {tuple(sin.shape)}") from err
    if shape != x.shape:
        raise ValueError(f"cos and sin must broadcast to x's shape {tuple(x.shape)}, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if cos.device != x.device or sin.device != x.device:
        raise ValueError(f"cos and sin must be on x's device {x.device}, got {cos.device} and {sin.device}")
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype):
        raise ValueError(f"out must have x's shape {tuple(x.shape)} and dtype {x.dtype}, got {tuple(out.shape)}, {out.dtype}")
    if torch.compiler.is_compiling():
        result = _rotate_formula(x, cos, sin, interleaved)
        return result if out is None else out.copy_(result)
    if out is not None:
        return _rotate_into(x, cos, sin, out, interleaved)
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        return _rotate_formula(x, cos, sin, interleaved)
    if torch.is_grad_enabled() and x.requires_grad:
        return _ApplyRotary.apply(x, cos, sin, interleaved)
    return _rotate_into(x, cos, sin, torch.empty_like(x, memory_format=torch.contiguous_format), interleaved)


def _full_width(half: Tensor, interleaved: bool) -> Tensor:
    """(..., r/2) -> (..., r) in the layout's order."""
    if interleaved:
        return half.repeat_interleave(2, dim=-1)
    return torch.cat((half, half), dim=-1)


def _short_repr(scaling: Mapping[str, Any] | None) -> str:
    """The scaling dict with its long lists (longrope factors) abbreviated."""
    if scaling is None:
        return "None"
    items = (f"{k!r}: [{len(v)} values]" if isinstance(v, (list, tuple)) else f"{k!r}: {v!r}" for k, v in scaling.items())
    return "{" + ", ".join(items) + "}"


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
        scaling: a Hugging Face ``rope_scaling`` dict, or None (see :func:`rope_frequencies`).
            cos and sin are multiplied by its attention_factor, as Hugging Face does.
        dynamic_cache: for the length-dependent scalings (``dynamic``, ``longrope``), which
            frequencies rotate a token (other types ignore it):

            - ``"rerotate"`` (default): every q and k of a call is rotated with the
              frequencies of the current length L = max(q and k positions) + 1. Exact for a
              full forward pass; under a KV cache, cache *unrotated* keys (as
              :func:`posenc.attention` does: it rotates all the keys it is given) so that old
              keys are re-rotated with the frequencies of the moment.
              In a multi-layer model that is exact for the first layer only: deeper layers'
              keys and values come from hidden states computed at a shorter length, so
              :attr:`call_invariant` is False and posenc's ``generate()`` re-runs the prefix.
            - ``"frozen"``: the token at position p is rotated with the frequencies at length
              p + 1, whatever the call; a key's rotation never changes, so caching rotated
              keys is exact. This is what Hugging Face computes when decoding token by token
              (it caches rotated keys); a Hugging Face prefill longer than L0 uses the
              prefill's length for all its tokens instead.
        hf_layout: how a Hugging Face config.json spelled these fields (the layout of
            :func:`~posenc.encodings.rope_interop.read_hf_config`); :meth:`to_hf_dict`
            writes them back in that spelling. None (default): the plain spelling.
            Set by :func:`posenc.rope.from_hf_config`.
        max_position_embeddings: the config's context length, or None; informational
            (the scalings read L0 from ``scaling``). Set by :func:`posenc.rope.from_hf_config`.

    Hook: ``rotate``. Raises ValueError on an odd head_dim or rotary_dim, rotary_dim >
    head_dim, or an unknown dynamic_cache; scaling errors as :func:`rope_frequencies`.
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
        dynamic_cache: str = "rerotate",
        hf_layout: Mapping[str, Any] | None = None,
        max_position_embeddings: int | None = None,
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
        self.base, self.interleaved = float(base), check_bool(interleaved, "interleaved")
        self.scaling = dict(scaling) if scaling is not None else None
        inv_freq, self.attention_factor = rope_frequencies(rotary_dim, base=base, scaling=self.scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        if dynamic_cache not in DYNAMIC_CACHE_MODES:
            raise ValueError(f"dynamic_cache must be one of {DYNAMIC_CACHE_MODES}, got {dynamic_cache!r}")
        self.dynamic_cache = dynamic_cache
        self._rope_type = rope_type_record(self.scaling)  # how the frequencies follow the length
        self.length_dependent = self._rope_type.length_dependent
        self.hf_layout, self.max_position_embeddings = hf_layout, max_position_embeddings
        # Frequencies in float64, kept off the module's .to() (which would round them): cos and
        # sin are computed from them for exactly the positions asked, so memory follows the
        # number of positions in a call, never the largest position.
        self._inv_freq_f64, _ = compute_rope_parameters(rotary_dim, self.base, self.scaling, None, dtype=torch.float64)
        of_length = self._rope_type.of_length
        self._of_length = (
            of_length(rotary_dim, self.base, self.scaling) if self.length_dependent and of_length is not None else None
        )
        self._freq_on: dict[torch.device, Tensor] = {}
        # (device, float64, regime) -> frequencies, for a length-dependent record without of_length
        self._cache: dict[tuple, Tensor] = {}

    @classmethod
    def for_model(cls, *, d_model, num_heads, head_dim, max_positions, causal=True, num_layers=1, **kwargs):
        return cls(head_dim, **kwargs)

    @property
    def call_invariant(self) -> bool:
        """False for dynamic / longrope in "rerotate" mode: a longer call changes the
        frequencies of every token, so hidden states cached at a shorter length go stale."""
        return not (self.length_dependent and self.dynamic_cache == "rerotate")

    def _regime(self, seq_len: int | None) -> tuple:
        """Which frequencies a call of length ``seq_len`` uses, (key, seq_len to compute them
        at). The rope_type's record decides, except in the "frozen" mode, where every
        position has its own frequencies whatever the call."""
        if self.length_dependent and self.dynamic_cache == "frozen":
            return _FROZEN_REGIME
        return self._rope_type.regime(self.scaling, seq_len)

    def _static_frequencies(self, device: torch.device) -> Tensor:
        """The length-independent float64 frequencies (r/2,) on ``device``."""
        if torch.compiler.is_compiling():
            return self._inv_freq_f64.to(device)
        freq = self._freq_on.get(device)
        if freq is None:
            freq = self._freq_on[device] = self._inv_freq_f64.to(device)
        return freq

    def _frequencies_at(self, seq_len: int, device: torch.device) -> Tensor:
        """float64 frequencies (r/2,) at one length from the record's regime and inv_freq: the
        uncompiled fallback for a length-dependent record without ``of_length``. One entry per
        regime; only the last few length regimes are kept."""
        regime = self._rope_type.regime(self.scaling, seq_len)  # the length's own, in either mode
        key = (device, torch.float64, regime)
        freq = self._cache.get(key)
        if freq is None:
            freq, _ = compute_rope_parameters(self.rotary_dim, self.base, self.scaling, regime[1], dtype=torch.float64)
            if regime[1] is not None:
                stale = [k for k in self._cache if k[2][1] is not None]
                for k in stale[: max(0, len(stale) - 3)]:
                    del self._cache[k]
            freq = self._cache[key] = freq.to(device)
        return freq

    def _frequencies(self, positions: Tensor, seq_len: int | Tensor | None) -> Tensor:
        """float64 frequencies for ``positions``: (r/2,) shared by the call, or one row per
        position ((T, r/2) or (B, T, r/2)) in the "frozen" mode.

        Length-dependent types take L = max(max(positions) + 1, seq_len) as a tensor and their
        record's ``of_length``, so no value leaves the device (nothing to sync, nothing for
        ``torch.compile`` to break on).
        """
        device = positions.device
        if not self.length_dependent:
            return self._static_frequencies(device)
        if self.dynamic_cache == "frozen":
            lengths = positions + 1
            if self._of_length is not None:
                return self._of_length(lengths.to(torch.float64))
            unique, inverse = torch.unique(lengths, return_inverse=True)
            rows = [self._frequencies_at(n, device) for n in unique.tolist()]
            return torch.stack(rows)[inverse] if rows else self._static_frequencies(device)
        length = None if seq_len is None else torch.as_tensor(seq_len, dtype=torch.long, device=device)
        if positions.numel():
            furthest = positions.max().to(torch.long) + 1
            length = furthest if length is None else torch.maximum(furthest, length)
        if length is None:  # no positions: nothing is rotated, any frequencies do
            return self._static_frequencies(device)
        if self._of_length is not None:
            return self._of_length(length.to(torch.float64))
        return self._frequencies_at(int(length), device)

    def cos_sin(
        self, positions: Tensor, dtype: torch.dtype = torch.float32, seq_len: int | Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """cos and sin (attention factor included) at integer positions (T,) or (B, T).

        ``seq_len``: the current length for the length-dependent scalings (dynamic,
        longrope; an int or a 0-d integer tensor); the length used is
        max(max(positions) + 1, seq_len). Ignored by the other types and in the "frozen"
        mode (position p uses length p + 1).

        The angles are ``positions`` (int64 -> float64, exact below 2^53) times the float64
        frequencies, their cos and sin taken in float64 and rounded once to ``dtype``
        (docs/precision.md), computed for the positions asked only: memory and time follow
        the number of positions, whatever their values (a decoding step at 2^31 - 1 builds a
        few hundred bytes). Traces under ``torch.compile(fullgraph=True)`` for every rope_type
        whose record has ``of_length`` (all built-in ones).

        Returns two tensors (T, r) or (B, T, r) of ``dtype`` in this encoding's layout.
        """
        angles = positions.to(torch.float64).unsqueeze(-1) * self._frequencies(positions, seq_len)
        cos, sin = angles.cos(), angles.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return _full_width(cos.to(dtype), self.interleaved), _full_width(sin.to(dtype), self.interleaved)

    def _rotate_one(self, x: Tensor, positions: Tensor, seq_len: int | Tensor | None = None) -> Tensor:
        cos, sin = self.cos_sin(positions, torch.promote_types(x.dtype, torch.float32), seq_len)
        return self._apply_tables(x, cos, sin)

    def _apply_tables(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Rotate x (B, H, T, D) with cos/sin (T, r) or (B, T, r); the tail past r passes through."""
        if cos.dim() == 3:  # (B, T, r) -> (B, 1, T, r) to broadcast over heads
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        r = self.rotary_dim
        if r == x.shape[-1]:
            return apply_rotary(x, cos, sin, interleaved=self.interleaved)
        rotated = apply_rotary(x[..., :r], cos, sin, interleaved=self.interleaved)
        return torch.cat((rotated, x[..., r:]), dim=-1)

    def rotate(self, q, k, q_positions, k_positions):
        """q (B, H, Tq, D) and k (B, H_kv, Tk, D) rotated at q_positions and k_positions ((T,) or
        (B, T) integers), each returned in its own dtype; the rotation runs in float32 (float64
        for float64 inputs). Traces under ``torch.compile(fullgraph=True)`` (see :meth:`cos_sin`).

        On CUDA with Triton (outside ``torch.compile``), q and k are rotated in one fused launch
        from the positions and the float64 frequencies (:meth:`kernel_angles`;
        :func:`posenc.kernels.rotary_triton.fused_rope`): the same cos and sin, no tables.

        Raises:
            ValueError: q or k whose last dimension is not head_dim.
        """
        if q.shape[-1] != self.head_dim or k.shape[-1] != self.head_dim:
            raise ValueError(f"q and k must have head_dim={self.head_dim}, got {q.shape[-1]} and {k.shape[-1]}")
        seq_len = self._seq_len(q_positions, k_positions)
        if _kernels.use_triton(q, k):
            fused = self._rotate_fused(q, k, q_positions, k_positions, seq_len)
            if fused is not None:
                return fused
        q_dtype, k_dtype = torch.promote_types(q.dtype, torch.float32), torch.promote_types(k.dtype, torch.float32)
        cos_q, sin_q = self.cos_sin(q_positions, q_dtype, seq_len)
        if k_positions is q_positions and k_dtype == q_dtype:  # self-attention: one computation
            cos_k, sin_k = cos_q, sin_q
        else:
            cos_k, sin_k = self.cos_sin(k_positions, k_dtype, seq_len)
        return self._apply_tables(q, cos_q, sin_q), self._apply_tables(k, cos_k, sin_k)

    def kernel_angles(self, positions: Tensor, seq_len: int | Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None] | None:
        """The angles of :meth:`cos_sin` as the fused kernel's inputs, or None if it cannot compute them.

        Returns ``(positions, inv_freq, pair_axis)`` with angle[..., i] =
        positions[pair_axis[i]] * inv_freq[..., i] (``pair_axis`` None: one row of positions):
        ``inv_freq`` float64, (r/2,) or one row per position ((T, r/2), (B, T, r/2): the
        "frozen" mode of the length-dependent scalings); the kernel multiplies cos and sin by
        :attr:`attention_factor`. A subclass whose angles differ (M-RoPE's per-axis positions)
        overrides this together with :meth:`cos_sin`; one that overrides only :meth:`cos_sin`
        gets None here, so it keeps the table path rather than silently losing its change.
        """
        if type(self).cos_sin is not RoPE.cos_sin:
            return None
        return positions, self._frequencies(positions, seq_len), None

    def _rotate_fused(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor, seq_len) -> tuple[Tensor, Tensor] | None:
        """q and k rotated by the Triton kernel in one launch, or None when it does not apply."""
        if q.dim() != 4 or k.dim() != 4:
            return None
        q_in, k_in = self.kernel_angles(q_positions, seq_len), self.kernel_angles(k_positions, seq_len)
        if q_in is None or k_in is None:
            return None
        (q_pos, q_freq, pair_axis), (k_pos, k_freq, _) = q_in, k_in
        return _kernels.rotary_kernels().fused_rope(
            q, k, q_pos, k_pos, q_freq, k_inv_freq=k_freq, pair_axis=pair_axis, interleaved=self.interleaved,
            attention_factor=self.attention_factor,
        )

    def _seq_len(self, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        """The call's length for the length-dependent scalings in "rerotate" mode, as a 0-d
        int64 tensor (the furthest query or key position + 1), else None."""
        if self.length_dependent and self.dynamic_cache == "rerotate" and q_positions.numel() and k_positions.numel():
            return torch.maximum(q_positions.max(), k_positions.max()).to(torch.long) + 1
        return None

    def to_hf_dict(self) -> dict[str, Any]:
        """The RoPE fields of a Hugging Face config.json (rope_theta, rope_scaling, head_dim, ...).

        An encoding built by :func:`posenc.rope.from_hf_config` (its ``hf_layout``) writes
        them back in the config's own spelling (v4 or v5), so the round trip is the identity;
        see :func:`~posenc.encodings.rope_interop.write_hf_config`.
        """

        return write_hf_config(
            head_dim=self.head_dim, rotary_dim=self.rotary_dim, base=self.base, scaling=self.scaling,
            layout=self.hf_layout,
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"interleaved={self.interleaved}, scaling={_short_repr(self.scaling)}"
            + (f", dynamic_cache={self.dynamic_cache!r}" if self.length_dependent else "")
        )


def from_hf_config(config: Mapping[str, Any], *, layer_type: str | None = None, **kwargs: Any) -> RoPE:
    """The :class:`RoPE` of a Hugging Face model config (a parsed ``config.json``).

    Reads rope_theta, rope_scaling (v4) or rope_parameters (v5), head_dim (or hidden_size //
    num_attention_heads), partial_rotary_factor and max_position_embeddings, filling in what
    Hugging Face takes from the config rather than the rope dict (see :func:`read_hf_config`).
    Hugging Face's layout: half-split pairs (i, i + r/2), cos and sin multiplied by the
    attention factor.

    Args:
        config: the config dict.
        layer_type: for a v5 per-layer ``rope_parameters`` dict, which layer type to read.
        kwargs: more :class:`RoPE` options (``interleaved``, ``dynamic_cache``).

    Returns:
        A RoPE whose :meth:`RoPE.to_hf_dict` gives back the config's RoPE fields unchanged
        (its ``hf_layout`` is the layout read); ``rope.max_position_embeddings`` holds the
        config's value (or None).

    Raises:
        TypeError, KeyError, ValueError: as :func:`read_hf_config` and :class:`RoPE`.
    """
    rope_kwargs, layout = read_hf_config(config, layer_type=layer_type)
    return RoPE(**rope_kwargs, **kwargs, hf_layout=layout, max_position_embeddings=config.get("max_position_embeddings"))


def to_hf_dict(rope: RoPE) -> dict[str, Any]:
    """The RoPE fields of a Hugging Face config for ``rope`` (same as ``rope.to_hf_dict()``)."""
    if not isinstance(rope, RoPE):
        raise TypeError(f"rope must be a posenc RoPE, got {type(rope).__name__}")
    return rope.to_hf_dict()


class ProportionalRoPE(RoPE):
    """Proportional RoPE, p-RoPE (Barbero et al. 2024, "Round and Round We Go! What makes
    Rotary Positional Encodings useful?", arXiv 2410.06205, section 6; Gemma 4's global layers):
    the rope_type ``proportional`` as an encoding of its own, for training from scratch.

    The frequencies of the whole head, theta_i = base^(-2i/d) for i < d/2, of which only the
    first ``int(partial_rotary_factor * d // 2)`` (the fastest) are kept; the others are 0, so
    those pairs pass through unrotated and carry content only (the paper's "semantic
    channels"). Equal to ``RoPE(head_dim, base=base, scaling={"rope_type": "proportional",
    "partial_rotary_factor": p})``; GPT-NeoX partial rotary (``RoPE(partial_rotary_factor=p)``)
    computes its frequencies over the rotated width instead (docs/encodings.md, "proportional vs
    NeoX").

    Args:
        head_dim: D, even.
        partial_rotary_factor: p in [0, 1], the share of frequency pairs kept; default 0.25,
            Gemma 4's (its config: ``{"rope_type": "proportional", "partial_rotary_factor": 0.25}``).
        base: rope_theta, default 10000.
        interleaved: the pair layout, as :class:`RoPE`.

    Hook: ``rotate``. Raises ValueError: an odd head_dim, p outside [0, 1], base not > 0.
    """

    name = "p_rope"

    def __init__(self, head_dim: int, *, partial_rotary_factor: float = 0.25, base: float = 10000.0,
                 interleaved: bool = False) -> None:
        if not is_real_number(partial_rotary_factor) or not 0 <= partial_rotary_factor <= 1:
            raise ValueError(f"partial_rotary_factor must be a number in [0, 1], got {partial_rotary_factor!r}")
        super().__init__(head_dim, base=base, interleaved=interleaved,
                         scaling={"rope_type": "proportional", "partial_rotary_factor": partial_rotary_factor})
        self.partial_rotary_factor = partial_rotary_factor


def xpos_zeta(rotary_dim: int, gamma: float = 0.4) -> Tensor:
    """xPos per-pair decay rates, float64 (rotary_dim // 2,).

    zeta_i = (2i / r + gamma) / (1 + gamma), i = 0 .. r/2 - 1 (Sun et al. 2022, section 3.2;
    torchscale's ``(arange(0, r, 2) + 0.4 r) / (1.4 r)``): from gamma / (1 + gamma) ~ 0.286 for
    the fastest-rotating pair up to ~0.986 for the slowest one, which therefore decays least.
    """
    check_even(rotary_dim, "rotary_dim")
    return (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim + gamma) / (1.0 + gamma)


#: Headroom (as a natural log) kept below the dtype's range for the size of q and k themselves:
#: a scale factor of at most finfo.max / 256 (and at least finfo.tiny * 256) is accepted.
_XPOS_HEADROOM = math.log(256.0)

#: The named centres of :class:`XPos` (an int is a fixed centre).
XPOS_CENTERS = ("query", "call")


class XPos(RoPE):
    """Extrapolatable position embedding, xPos (Sun et al. 2022, "A Length-Extrapolatable
    Transformer", section 3.2, eq. for f_q / f_k).

    RoPE with a per-pair exponential decay: with zeta_i = (2i/r + gamma)/(1 + gamma)
    (:func:`xpos_zeta`), query n and key m get

        q'_n = R(n theta) q_n * zeta^((n - c)/B),    k'_m = R(m theta) k_m * zeta^(-(m - c)/B),

    so q'_n . k'_m = sum_i zeta_i^((n - m)/B) [rotation by (n - m) theta_i]: a function of n - m
    only, decaying with distance for n >= m (causal use, as in the paper).

    The centre c cancels in q'.k' as long as the queries and keys of a score were scaled with
    the *same* c, so c is a choice about floating-point range, not about the math. The paper
    writes c = 0, which overflows past ~33,000 positions in float32/bfloat16 (zeta_0^(-n/B)
    with zeta_0 ~ 0.286 grows by e^1.25 every B = 512 positions); torchscale centres each call
    at len // 2. posenc's default, ``center="query"``, centres each call at the midpoint of its
    *query* positions (per batch row for (B, T) positions): every key before the query block is
    then only ever *decayed*, zeta^((c - m)/B) <= 1, and a factor that underflows to 0 is the
    correct limit of a vanishing weight; only the query block's own half-span (and keys inside
    it) can grow a factor, by at most zeta_0^(-span/(2B)). So a decoding step at position
    1,048,576 over a cache of a million keys is finite in float32, bfloat16 and float16, and a
    block of queries may span about 68,000 positions in float32/bfloat16 and about 4,500 in
    float16 (positions of its keys unrestricted). Past that, ``rotate`` raises ValueError
    naming the argument, never inf or NaN (docs/precision.md). Because c follows the queries,
    keys must be re-scaled with each call's queries: a KV cache holds *unrotated* keys and
    passes them all to :func:`posenc.attention`, which rotates every key it is given.

    Other centres: an int is a **fixed** centre (``center=0`` is the paper's): keys rotated
    once into a cache stay exact for later queries, but
    |position - center| must stay under ~33,000 (float32/bfloat16) or ~2,200 (float16) for the
    growing side. ``center="call"`` is torchscale's: the midpoint of all the call's query and
    key positions, exact only within one call.

    Args:
        head_dim: D (positive, even).
        scale_base: B, 512 in the paper.
        gamma: 0.4 in the paper.
        center: "query" (default: the midpoint of each call's query positions), an int (a
            fixed centre) or "call" (the midpoint of the call's query and key positions).
        rotary_dim, partial_rotary_factor, base, interleaved, scaling: as :class:`RoPE`;
            zeta uses r = rotary_dim and the tail past r is neither rotated nor scaled.
            Default layout half-split (x-transformers); torchscale pairs (2i, 2i+1)
            (``interleaved=True``). The layouts are the same map up to a permutation.

    Hook: ``rotate``. Shapes as :class:`RoPE`; the scale is computed in float64 and the
    product in float32 (or wider), cast back to x's dtype.

    Raises:
        ValueError: scale_base <= 0, gamma <= 0, a bad center (at construction); positions so
            far on the growing side of the centre that a scale factor would leave x's dtype's
            range (at call). A decaying factor is never an error: it may underflow to 0. The
            range check reads the positions' values, so it is skipped under
            ``torch.compile`` (the compiled graph would break on it): check positions with
            an uncompiled call.
    """

    name = "xpos"

    def __init__(
        self,
        head_dim: int,
        *,
        scale_base: float = 512.0,
        gamma: float = 0.4,
        center: int | str = "query",
        **rope_kwargs: Any,
    ) -> None:
        super().__init__(head_dim, **rope_kwargs)
        check_number(scale_base, "scale_base", gt=0)
        check_number(gamma, "gamma", gt=0)
        if not (center in XPOS_CENTERS or (isinstance(center, int) and not isinstance(center, bool))):
            raise ValueError(f"center must be an int (a fixed centre) or one of {XPOS_CENTERS}, got {center!r}")
        self.scale_base, self.gamma, self.center = float(scale_base), float(gamma), center
        self._log_zeta = xpos_zeta(self.rotary_dim, self.gamma).log()  # float64, kept off the module's .to()

    def _centre(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """The centre c as an int64 tensor: 0-d, or (B, 1) per row for "query" with (B, T) positions."""
        if self.center == "query":
            if q_positions.numel() == 0:
                return torch.zeros((), dtype=torch.long, device=q_positions.device)
            lo = q_positions.min(dim=-1, keepdim=True).values if q_positions.dim() == 2 else q_positions.min()
            hi = q_positions.max(dim=-1, keepdim=True).values if q_positions.dim() == 2 else q_positions.max()
            return (lo + hi).div(2, rounding_mode="floor")
        if self.center == "call":
            lo = torch.minimum(q_positions.min(), k_positions.min()).to(torch.long)
            hi = torch.maximum(q_positions.max(), k_positions.max()).to(torch.long)
            return (lo + hi).div(2, rounding_mode="floor")
        return torch.tensor(self.center, device=q_positions.device)

    def _check_range(self, growth: Tensor, dtype: torch.dtype, argname: str, centre: Tensor) -> None:
        """Raise if a growing factor zeta_0^(-growth/B) (growth = positions on the growing side
        of the centre) would leave ``dtype``'s range; decaying factors may underflow to 0.

        Skipped under ``torch.compile``: it needs a value (``int(growth.max())``), which
        would break the graph; run a compiled model once uncompiled to check its positions."""
        if not growth.numel() or torch.compiler.is_compiling():
            return
        farthest = int(growth.max())
        limit = math.log(torch.finfo(dtype).max) - _XPOS_HEADROOM
        if farthest / self.scale_base * float(-self._log_zeta[0]) > limit:
            max_offset = int(limit / float(-self._log_zeta[0]) * self.scale_base)
            raise ValueError(
                f"{argname}: xPos scale zeta^((n - center)/{self.scale_base:g}) leaves the {dtype} range: a position "
                f"{farthest} away on the growing side of the center ({self.center!r}: "
                f"{centre.flatten()[:4].tolist()}; at most {max_offset} is safe); "
                "use center='query' with shorter query blocks, or a float32 dtype"
            )

    def xpos_scale(self, positions: Tensor, centre: Tensor | int, sign: float, dtype: torch.dtype) -> Tensor:
        """zeta^(sign (n - centre) / B) at positions (T,) or (B, T) -> (T, r) or (B, T, r) of dtype,
        full width in this encoding's layout; sign +1 for queries, -1 for keys. ``centre`` is an
        int or an integer tensor broadcastable to positions ((B, 1) per row). The offset is taken
        in int64 and the power in float64, so a factor is exact to float64 rounding before the cast."""
        offset = positions - centre  # int64: exact at any position
        exponent = offset.to(torch.float64) * (sign / self.scale_base)
        log_scale = exponent.unsqueeze(-1) * self._log_zeta.to(positions.device)
        return _full_width(log_scale.exp(), self.interleaved).to(dtype)

    def _rotate_scaled(self, x: Tensor, positions: Tensor, centre: Tensor, sign: float, seq_len: int | None) -> Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)
        cos, sin = self.cos_sin(positions, dtype, seq_len)
        scale = self.xpos_scale(positions, centre, sign, dtype)
        return self._apply_tables(x, cos * scale, sin * scale)

    def rotate(self, q, k, q_positions, k_positions):
        if q.shape[-1] != self.head_dim or k.shape[-1] != self.head_dim:
            raise ValueError(f"q and k must have head_dim={self.head_dim}, got {q.shape[-1]} and {k.shape[-1]}")
        centre = self._centre(q_positions, k_positions)
        # zeta < 1: a query grows when it is before the centre, a key when it is after it.
        self._check_range(centre - q_positions, q.dtype, "q_positions", centre)
        self._check_range(k_positions - centre, k.dtype, "k_positions", centre)
        seq_len = self._seq_len(q_positions, k_positions)
        return (
            self._rotate_scaled(q, q_positions, centre, 1.0, seq_len),
            self._rotate_scaled(k, k_positions, centre, -1.0, seq_len),
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scale_base={self.scale_base}, gamma={self.gamma}, center={self.center!r}"
