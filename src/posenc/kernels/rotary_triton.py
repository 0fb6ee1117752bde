"""Fused rotary position embedding (RoPE) in Triton: q and k in one launch, forward and backward.

Two entry points:

- :func:`fused_rope` rotates q (B, H, Tq, D) and k (B, H_kv, Tk, D) from integer positions
  and float64 inverse frequencies, the angles computed inside the kernel, in one launch for
  both tensors. It is what :meth:`posenc.RoPE.rotate` runs on CUDA tensors.
- :func:`rotate_with_tables` is :func:`posenc.apply_rotary`'s kernel: it reads cos and sin
  tables given by the caller (xPos, user code), one tensor per launch.

Conventions are posenc's (docs/encodings.md, :mod:`posenc.kernels.rotary_torch`): half-split
pairs (i, i + r/2) (GPT-NeoX, Hugging Face Llama) or interleaved pairs (2i, 2i+1) (RoFormer,
GPT-J), r = rotary_dim = 2 * len(inv_freq) <= D; ``x[..., r:]`` passes through (Hugging Face's
``partial_rotary_factor``). A pair rotates as

    out_a = x_a cos - x_b sin,    out_b = x_b cos + x_a sin

with cos and sin multiplied by ``attention_factor`` (YaRN's mscale), as Hugging Face does.

Precision (docs/precision.md), the same numbers as :meth:`posenc.RoPE.cos_sin` computes:
the angle ``position * inv_freq`` is formed in float64 from int64 positions and float64
frequencies, its cos and sin taken in float64 and multiplied by the attention factor in
float64, then rounded once to float32 (float64 for float64 activations); the rotation runs in
float32 (float64) and is rounded once to the activation dtype (fp32, bf16, fp16). Computing
cos/sin in the kernel means no (T, r) tables are written or read; the float64 work is per
(token, pair) and per head block, small next to the memory traffic of q and k.

The gradient of a rotation is the rotation by the opposite angle (its transpose): the backward
is this kernel again with sin negated, so it costs what the forward costs, and it is itself
differentiable (double backward).

Tensors are addressed through their strides: q and k may be views (a (B, T, H, D) projection
transposed to (B, H, T, D), a slice of a fused qkv), never copied. In place (``inplace=True``)
writes the result into q and k.

Under Triton's interpreter (``TRITON_INTERPRET=1``, set before this module is imported) the
kernels run on CPU tensors; posenc's tests do that. The interpreter truncates float32 ->
bfloat16 conversions (a GPU rounds them to nearest even), so under the interpreter the kernel
rounds to bfloat16 in integer arithmetic, round-to-nearest-even as the GPU's conversion does;
on a GPU the native conversion runs.

Reference code with the same math: Liger-Kernel's ``liger_rotary_pos_emb`` and flash-attn's
``apply_rotary_emb`` (both read precomputed cos/sin tables); Hugging Face's
``apply_rotary_pos_emb`` (eager formula).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from torch import Tensor
from posenc.errors import InvalidArgument, InvalidType

#: Pairs per tile: a program of the fused kernel takes BLOCK_T tokens of one batch row of q or
#: k, computes their angles once, and loops over the heads BLOCK_H at a time, each tile
#: (BLOCK_H, BLOCK_T, pairs) of about this many pairs (a few KiB of q or k). Computing the
#: float64 cos/sin once per token block rather than per head keeps the float64 work small even
#: on GPUs with slow float64. Not tuned on a GPU yet (none was available when the kernel was
#: written); ``benchmarks/bench_rope.py --device cuda`` times it.
TILE_PAIRS = 2048

#: At most this many heads per tile.
MAX_BLOCK_H = 8

# Both kernels are launched with enable_fp_fusion=True: x_a cos - x_b sin may be one fused
# multiply-add (one rounding fewer than two products and a sum; the error bounds of
# docs/precision.md hold either way). Stated explicitly, so Triton >= 3.9 does not warn
# about its default changing.


def _interpreted() -> bool:
    """Whether the kernels of this module were built for Triton's interpreter."""
    return not isinstance(_rope_qk_kernel, triton.runtime.JITFunction)


@triton.jit
def _round_bf16(v):
    """float32 -> bfloat16, round to nearest even, in integer arithmetic (NaN stays NaN)."""
    bits = v.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(v != v, 0x7FC0, rounded)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _store(ptr, value, mask, SOFT_BF16: tl.constexpr):
    """Store value rounded once to the pointer's dtype."""
    if SOFT_BF16:
        tl.store(ptr, _round_bf16(value.to(tl.float32)), mask=mask)
    else:
        tl.store(ptr, value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _pair_offsets(p, half, INTERLEAVED: tl.constexpr):
    """Offsets (along D) of the two members of pair p: (2p, 2p+1) or (p, p + half)."""
    if INTERLEAVED:
        return 2 * p, 2 * p + 1
    return p, p + half


@triton.jit
def _rope_block(
    job, x_ptr, o_ptr, sxb, sxh, sxt, sxd, sob, soh, sot, sod,
    pos_ptr, spa, spb, spt, axis_ptr, freq_ptr, sfb, sft, sfp, attention_factor,
    H, T, half, D, jobs_t,
    INTERLEAVED: tl.constexpr, INVERSE: tl.constexpr, HAS_AXIS: tl.constexpr, COPY_TAIL: tl.constexpr,
    WIDE: tl.constexpr, SOFT_BF16: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_TAIL: tl.constexpr,
):
    """Rotate BLOCK_T tokens of one batch row of one tensor, every head (BLOCK_H at a time)."""
    t_blk = job % jobs_t
    b = (job // jobs_t).to(tl.int64)
    t = t_blk.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    p = tl.arange(0, BLOCK_P)
    t_mask, p_mask = t < T, p < half
    tp_mask = t_mask[:, None] & p_mask[None, :]

    # The angles, in float64 from int64 positions and float64 frequencies, once for all heads.
    if HAS_AXIS:  # M-RoPE: pair p reads position row axis[p]
        axis = tl.load(axis_ptr + p, mask=p_mask, other=0).to(tl.int64)
        pos = tl.load(pos_ptr + axis[None, :] * spa + b * spb + t[:, None] * spt, mask=tp_mask, other=0)
    else:
        pos = tl.load(pos_ptr + b * spb + t * spt, mask=t_mask, other=0)[:, None]
    freq = tl.load(freq_ptr + b * sfb + t[:, None] * sft + p[None, :] * sfp, mask=tp_mask, other=0.0)
    angle = pos.to(tl.float64) * freq.to(tl.float64)
    compute = tl.float64 if WIDE else tl.float32
    cos = (tl.cos(angle) * attention_factor).to(compute)[None, :, :]
    sin = (tl.sin(angle) * attention_factor).to(compute)[None, :, :]
    d_a, d_b = _pair_offsets(p, half, INTERLEAVED)
    e = 2 * half + tl.arange(0, BLOCK_TAIL)

    for h0 in range(0, H, BLOCK_H):
        h = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)
        mask = (h < H)[:, None, None] & tp_mask[None, :, :]
        x_row = x_ptr + b * sxb + h[:, None, None] * sxh + t[None, :, None] * sxt
        o_row = o_ptr + b * sob + h[:, None, None] * soh + t[None, :, None] * sot
        x_a = tl.load(x_row + d_a[None, None, :] * sxd, mask=mask, other=0.0).to(compute)
        x_b = tl.load(x_row + d_b[None, None, :] * sxd, mask=mask, other=0.0).to(compute)
        if INVERSE:  # the transpose: rotation by -angle
            out_a = x_a * cos + x_b * sin
            out_b = x_b * cos - x_a * sin
        else:
            out_a = x_a * cos - x_b * sin
            out_b = x_b * cos + x_a * sin
        _store(o_row + d_a[None, None, :] * sod, out_a, mask, SOFT_BF16)
        _store(o_row + d_b[None, None, :] * sod, out_b, mask, SOFT_BF16)
        if COPY_TAIL:  # out of place with rotary_dim < D: the tail passes through
            tail_mask = ((h < H)[:, None, None] & t_mask[None, :, None]) & (e < D)[None, None, :]
            tail = tl.load(x_row + e[None, None, :] * sxd, mask=tail_mask, other=0.0)
            tl.store(o_row + e[None, None, :] * sod, tail, mask=tail_mask)


@triton.jit
def _rope_qk_kernel(
    q_ptr, qo_ptr, k_ptr, ko_ptr, qpos_ptr, kpos_ptr, axis_ptr, qfreq_ptr, kfreq_ptr,
    attention_factor: "tl.float64",
    Hq, Tq, Hk, Tk, half, D, q_jobs_t, k_jobs_t, n_q_jobs,
    sqb, sqh, sqt, sqd, sqob, sqoh, sqot, sqod,
    skb, skh, skt, skd, skob, skoh, skot, skod,
    sqpa, sqpb, sqpt, skpa, skpb, skpt,
    sqfb, sqft, sqfp, skfb, skft, skfp,
    INTERLEAVED: tl.constexpr, INVERSE: tl.constexpr, HAS_AXIS: tl.constexpr, COPY_TAIL: tl.constexpr,
    Q_WIDE: tl.constexpr, K_WIDE: tl.constexpr, Q_SOFT_BF16: tl.constexpr, K_SOFT_BF16: tl.constexpr,
    Q_BLOCK_H: tl.constexpr, Q_BLOCK_T: tl.constexpr, K_BLOCK_H: tl.constexpr, K_BLOCK_T: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_TAIL: tl.constexpr,
):
    """One launch for q and k: programs [0, n_q_jobs) rotate token blocks of q, the rest of k."""
    pid = tl.program_id(0)
    if pid < n_q_jobs:
        _rope_block(
            pid, q_ptr, qo_ptr, sqb, sqh, sqt, sqd, sqob, sqoh, sqot, sqod,
            qpos_ptr, sqpa, sqpb, sqpt, axis_ptr, qfreq_ptr, sqfb, sqft, sqfp, attention_factor,
            Hq, Tq, half, D, q_jobs_t,
            INTERLEAVED, INVERSE, HAS_AXIS, COPY_TAIL, Q_WIDE, Q_SOFT_BF16, Q_BLOCK_H, Q_BLOCK_T, BLOCK_P, BLOCK_TAIL,
        )
    else:
        _rope_block(
            pid - n_q_jobs, k_ptr, ko_ptr, skb, skh, skt, skd, skob, skoh, skot, skod,
            kpos_ptr, skpa, skpb, skpt, axis_ptr, kfreq_ptr, skfb, skft, skfp, attention_factor,
            Hk, Tk, half, D, k_jobs_t,
            INTERLEAVED, INVERSE, HAS_AXIS, COPY_TAIL, K_WIDE, K_SOFT_BF16, K_BLOCK_H, K_BLOCK_T, BLOCK_P, BLOCK_TAIL,
        )


@triton.jit
def _tables_kernel(
    x_ptr, o_ptr, cos_ptr, sin_ptr, H, T, half, jobs_t, jobs_h,
    sxb, sxh, sxt, sxd, sob, soh, sot, sod, scb, sch, sct, scd, ssb, ssh, sst, ssd,
    INTERLEAVED: tl.constexpr, WIDE: tl.constexpr, SOFT_BF16: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr,
):
    """apply_rotary's formula with given full-width tables: out_a = x_a c_a - x_b s_a,
    out_b = x_b c_b + x_a s_b (every table entry read, as in the formula)."""
    job = tl.program_id(0)
    h_blk = job % jobs_h
    rest = job // jobs_h
    t_blk = rest % jobs_t
    b = (rest // jobs_t).to(tl.int64)
    h = (h_blk.to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H))[:, None, None]
    t = (t_blk.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T))[None, :, None]
    p = tl.arange(0, BLOCK_P)
    mask = (h < H) & (t < T) & (p < half)[None, None, :]
    d_a, d_b = _pair_offsets(p, half, INTERLEAVED)
    d_a, d_b = d_a[None, None, :], d_b[None, None, :]
    compute = tl.float64 if WIDE else tl.float32
    x_row = x_ptr + b * sxb + h * sxh + t * sxt
    c_row = cos_ptr + b * scb + h * sch + t * sct
    s_row = sin_ptr + b * ssb + h * ssh + t * sst
    x_a = tl.load(x_row + d_a * sxd, mask=mask, other=0.0).to(compute)
    x_b = tl.load(x_row + d_b * sxd, mask=mask, other=0.0).to(compute)
    c_a = tl.load(c_row + d_a * scd, mask=mask, other=0.0).to(compute)
    c_b = tl.load(c_row + d_b * scd, mask=mask, other=0.0).to(compute)
    s_a = tl.load(s_row + d_a * ssd, mask=mask, other=0.0).to(compute)
    s_b = tl.load(s_row + d_b * ssd, mask=mask, other=0.0).to(compute)
    o_row = o_ptr + b * sob + h * soh + t * sot
    _store(o_row + d_a * sod, x_a * c_a - x_b * s_a, mask, SOFT_BF16)
    _store(o_row + d_b * sod, x_b * c_b + x_a * s_b, mask, SOFT_BF16)


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(1, n))


def _tile(num_heads: int, num_tokens: int, block_p: int) -> tuple[int, int]:
    """(BLOCK_H, BLOCK_T): up to MAX_BLOCK_H heads, then as many tokens as fill TILE_PAIRS."""
    block_h = min(_pow2(num_heads), MAX_BLOCK_H)
    block_t = max(1, min(_pow2(num_tokens), TILE_PAIRS // (block_h * block_p)))
    return block_h, block_t


def _num_warps(block_h: int, block_t: int, block_p: int) -> int:
    """One warp per 256 pairs of a tile, 1 to 8: the 2048-pair tile of head_dim 128 gets 8
    (compiled for sm_90: 64 registers per thread, no spills; 4 warps would need 106)."""
    return max(1, min(8, block_h * block_t * block_p // 256))


def _soft_bf16(dtype: torch.dtype) -> bool:
    return dtype == torch.bfloat16 and _interpreted()


def _wide(dtype: torch.dtype) -> bool:
    return dtype == torch.float64


@dataclass(frozen=True)
class _Angles:
    """What the kernel needs besides q and k, normalized: positions as (A, B, T) strides,
    frequencies as (B, T, P) strides (0 where broadcast)."""

    q_positions: Tensor
    k_positions: Tensor
    q_freq: Tensor
    k_freq: Tensor
    pair_axis: Tensor | None
    interleaved: bool
    attention_factor: float
    inverse: bool = False
    inplace: bool = False


def _position_strides(positions: Tensor, has_axis: bool) -> tuple[int, int, int]:
    """(axis, batch, token) strides of positions (T,), (B, T), (A, T) or (A, B, T); 0 where absent
    or of size 1 (broadcast)."""
    shape, strides = positions.shape, positions.stride()
    if has_axis:
        if positions.dim() == 2:
            return strides[0], 0, strides[1]
        return strides[0], (strides[1] if shape[1] != 1 else 0), strides[2]
    if positions.dim() == 1:
        return 0, 0, strides[0]
    return 0, (strides[0] if shape[0] != 1 else 0), strides[1]


def _freq_strides(freq: Tensor) -> tuple[int, int, int]:
    """(batch, token, pair) strides of frequencies (P,), (T, P) or (B, T, P); 0 where broadcast."""
    sizes = (1,) * (3 - freq.dim()) + tuple(freq.shape)
    strides = (0,) * (3 - freq.dim()) + tuple(freq.stride())
    return tuple(0 if n == 1 else s for n, s in zip(sizes, strides))


def _launch(q: Tensor, k: Tensor, q_out: Tensor, k_out: Tensor, a: _Angles) -> None:
    """Rotate q into q_out and k into k_out (either pair may have no rows) in one launch."""
    half = a.q_freq.shape[-1]
    d = q.shape[-1]
    copy_tail = 2 * half < d and not a.inplace
    block_p = _pow2(half)
    qbh, qbt = _tile(q.shape[1], q.shape[2], block_p)
    kbh, kbt = _tile(k.shape[1], k.shape[2], block_p)
    q_jobs_t, k_jobs_t = triton.cdiv(q.shape[2], qbt), triton.cdiv(k.shape[2], kbt)
    n_q = q.shape[0] * q_jobs_t if q.numel() else 0
    n_k = k.shape[0] * k_jobs_t if k.numel() else 0
    if n_q + n_k == 0:
        return
    has_axis = a.pair_axis is not None
    axis = a.pair_axis if has_axis else a.q_positions  # any pointer; not read without the axis
    _rope_qk_kernel[(n_q + n_k,)](
        q, q_out, k, k_out, a.q_positions, a.k_positions, axis, a.q_freq, a.k_freq,
        float(a.attention_factor),
        q.shape[1], q.shape[2], k.shape[1], k.shape[2], half, d, q_jobs_t, k_jobs_t, n_q,
        *q.stride(), *q_out.stride(), *k.stride(), *k_out.stride(),
        *_position_strides(a.q_positions, has_axis), *_position_strides(a.k_positions, has_axis),
        *_freq_strides(a.q_freq), *_freq_strides(a.k_freq),
        INTERLEAVED=a.interleaved, INVERSE=a.inverse, HAS_AXIS=has_axis, COPY_TAIL=copy_tail,
        Q_WIDE=_wide(q.dtype), K_WIDE=_wide(k.dtype), Q_SOFT_BF16=_soft_bf16(q.dtype), K_SOFT_BF16=_soft_bf16(k.dtype),
        Q_BLOCK_H=qbh, Q_BLOCK_T=qbt, K_BLOCK_H=kbh, K_BLOCK_T=kbt,
        BLOCK_P=block_p, BLOCK_TAIL=_pow2(d - 2 * half), enable_fp_fusion=True,
        num_warps=max(_num_warps(qbh, qbt, block_p), _num_warps(kbh, kbt, block_p)),
    )


def _rotated(q: Tensor | None, k: Tensor | None, a: _Angles) -> tuple[Tensor | None, Tensor | None]:
    """Launch on whichever of q, k is given (a gradient may be None); new tensors unless in place."""
    present = q if q is not None else k
    if present is None:
        return None, None
    empty = present.new_empty((0, 0, 0, present.shape[-1]))
    qi, ki = (q if q is not None else empty), (k if k is not None else empty)
    if a.inplace:
        qo, ko = qi, ki
    else:
        qo = torch.empty_like(qi) if qi.numel() else qi
        ko = torch.empty_like(ki) if ki.numel() else ki
    _launch(qi, ki, qo, ko, a)
    return (qo if q is not None else None), (ko if k is not None else None)


class _FusedRope(torch.autograd.Function):
    """q and k rotated in one launch; the gradient is the rotation by -angle, the same kernel."""

    @staticmethod
    def forward(ctx, q, k, angles: _Angles):
        ctx.angles = angles
        ctx.set_materialize_grads(False)
        q_out, k_out = _rotated(q, k, angles)
        if angles.inplace:
            ctx.mark_dirty(q, k)
        return q_out, k_out

    @staticmethod
    def backward(ctx, grad_q, grad_k):
        back = replace(ctx.angles, inverse=not ctx.angles.inverse, inplace=False)
        if torch.is_grad_enabled():  # create_graph=True: the gradient is itself a rotation
            grad_q, grad_k = _FusedRope.apply(grad_q, grad_k, back)
            return grad_q, grad_k, None
        grad_q, grad_k = _rotated(grad_q, grad_k, back)
        return grad_q, grad_k, None


def _check_rotated(x: Tensor, argname: str) -> None:
    if not isinstance(x, Tensor) or not x.is_floating_point():
        got = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise InvalidType(f"{argname} must be a floating-point torch.Tensor, got {got}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        raise InvalidArgument(f"{argname} must be float32, bfloat16, float16 or float64, got {x.dtype}")
    if x.dim() != 4:
        raise InvalidArgument(f"{argname} must have shape (B, H, T, D), got {tuple(x.shape)}")


def _check_positions(positions: Tensor, x: Tensor, argname: str, num_axes: int | None) -> None:
    if not isinstance(positions, Tensor) or positions.dtype.is_floating_point or positions.dtype.is_complex \
            or positions.dtype == torch.bool:
        got = positions.dtype if isinstance(positions, Tensor) else type(positions).__name__
        raise InvalidType(f"{argname} must be an integer torch.Tensor, got {got}")
    batch, tokens = x.shape[0], x.shape[2]
    shape = tuple(positions.shape)
    if num_axes is None:
        ok = shape == (tokens,) or (len(shape) == 2 and shape[1] == tokens and shape[0] in (1, batch))
        allowed = f"({tokens},) or ({batch}, {tokens})"
    else:
        ok = (len(shape) == 2 and shape[1] == tokens) or (len(shape) == 3 and shape[2] == tokens and shape[1] in (1, batch))
        ok = ok and shape[0] == num_axes
        allowed = f"({num_axes}, {tokens}) or ({num_axes}, {batch}, {tokens}) (one row per axis of pair_axis)"
    if not ok:
        raise InvalidArgument(f"{argname} must have shape {allowed} for {tuple(x.shape)}, got {shape}")
    if positions.device != x.device:
        raise InvalidArgument(f"{argname} must be on {x.device}, got {positions.device}")


def _check_freq(freq: Tensor, x: Tensor, argname: str) -> None:
    if not isinstance(freq, Tensor) or not freq.is_floating_point():
        got = freq.dtype if isinstance(freq, Tensor) else type(freq).__name__
        raise InvalidType(f"{argname} must be a floating-point torch.Tensor (float64), got {got}")
    pairs, batch, tokens = freq.shape[-1] if freq.dim() else 0, x.shape[0], x.shape[2]
    shape = tuple(freq.shape)
    ok = freq.dim() in (1, 2, 3) and 1 <= pairs and 2 * pairs <= x.shape[-1]
    ok = ok and (freq.dim() < 2 or shape[-2] in (1, tokens)) and (freq.dim() < 3 or shape[0] in (1, batch))
    if not ok:
        raise InvalidArgument(
            f"{argname} must have shape (P,), ({tokens}, P) or ({batch}, {tokens}, P) with 1 <= P <= D/2 = "
            f"{x.shape[-1] // 2} (P = rotary_dim / 2), got {shape}"
        )
    if freq.device != x.device:
        raise InvalidArgument(f"{argname} must be on {x.device}, got {freq.device}")
    if freq.requires_grad and torch.is_grad_enabled():
        raise InvalidArgument(f"{argname} must not require grad: the kernel gives no gradient to the frequencies")


def fused_rope(
    q: Tensor,
    k: Tensor,
    q_positions: Tensor,
    k_positions: Tensor,
    inv_freq: Tensor,
    *,
    k_inv_freq: Tensor | None = None,
    pair_axis: Tensor | None = None,
    interleaved: bool = False,
    attention_factor: float = 1.0,
    inplace: bool = False,
) -> tuple[Tensor, Tensor]:
    """Rotate q and k by RoPE angles ``positions * inv_freq`` in one kernel launch.

    Pair i of a token at position p turns by ``p * inv_freq[i]`` (RoFormer, Su et al. 2021,
    eq. 34); the first r = 2 * len(inv_freq) dimensions rotate (half-split pairs (i, i + r/2),
    or interleaved (2i, 2i+1)) and ``x[..., r:]`` passes through. An inv_freq entry of 0
    leaves its pair unrotated (proportional RoPE). cos and sin are multiplied by
    ``attention_factor`` (YaRN's mscale; Hugging Face's convention). See the module docstring
    for the precision: the same angles, cos and sin as :meth:`posenc.RoPE.cos_sin`.

    Args:
        q: (B, H, Tq, D), float32, bfloat16, float16 or float64; any strides.
        k: (B, H_kv, Tk, D), H_kv may differ from H (GQA/MQA); same B and D.
        q_positions, k_positions: integer positions (T,) shared by the batch or (B, T) per row
            (B may be 1). With ``pair_axis``: (A, T) or (A, B, T), one row per position axis
            (M-RoPE's temporal, height, width: A = 3). Values are not read on the host (no
            device sync): they must be >= 0, as :func:`posenc.attention` checks.
        inv_freq: float64 frequencies, radians per token: (P,) shared, or (T, P) / (B, T, P)
            per position (length-dependent scalings in the "frozen" mode); P = rotary_dim / 2.
            A float32 tensor is widened (exactly) to float64 in the kernel.
        k_inv_freq: the keys' frequencies when they differ from the queries' (per-position
            frequencies); default ``inv_freq``.
        pair_axis: None, or an integer tensor (P,) mapping each pair to a row of the positions
            (M-RoPE's mrope_section as a per-pair axis). Values in [0, A); not checked on CUDA
            (a device sync), checked on the CPU.
        interleaved: pair (2i, 2i+1) instead of (i, i + r/2).
        attention_factor: multiplies cos and sin (1.0: none).
        inplace: write the result into q and k (returned); autograd records it as an
            in-place operation (q and k must not be leaves that require grad).

    Returns:
        (q', k'), each of its input's shape and dtype (new tensors with the input's layout, or
        q and k themselves in place). Differentiable in q and k, to any order.

    Raises:
        TypeError: q or k not floating point, positions not integer, inv_freq not floating.
        ValueError: shapes that do not fit (the message gives the allowed ones), tensors on
            different devices, an inv_freq requiring grad, pair_axis values out of range
            (CPU), a non-finite attention_factor.
    """
    _check_rotated(q, "q")
    _check_rotated(k, "k")
    if k.shape[0] != q.shape[0] or k.shape[-1] != q.shape[-1]:
        raise InvalidArgument(f"k must have q's batch size and head_dim {q.shape[0]}, {q.shape[-1]}, got {tuple(k.shape)}")
    if k.device != q.device:
        raise InvalidArgument(f"k must be on q's device {q.device}, got {k.device}")
    if not isinstance(interleaved, bool):
        raise InvalidType(f"interleaved must be a bool, got {type(interleaved).__name__}")
    if not isinstance(inplace, bool):
        raise InvalidType(f"inplace must be a bool, got {type(inplace).__name__}")
    if isinstance(attention_factor, bool) or not isinstance(attention_factor, (int, float)) \
            or not float(attention_factor) == float(attention_factor) or abs(float(attention_factor)) == float("inf"):
        raise InvalidArgument(f"attention_factor must be a finite number, got {attention_factor!r}")
    num_axes = None
    if pair_axis is not None:
        if not isinstance(pair_axis, Tensor) or pair_axis.dtype.is_floating_point or pair_axis.dtype == torch.bool:
            raise InvalidType("pair_axis must be an integer torch.Tensor (P,)")
        if not isinstance(q_positions, Tensor) or q_positions.dim() not in (2, 3):
            raise InvalidArgument("with pair_axis, q_positions must have shape (A, T) or (A, B, T)")
        num_axes = q_positions.shape[0]
        if pair_axis.device != q.device:
            raise InvalidArgument(f"pair_axis must be on {q.device}, got {pair_axis.device}")
    _check_positions(q_positions, q, "q_positions", num_axes)
    _check_positions(k_positions, k, "k_positions", num_axes)
    k_inv_freq = inv_freq if k_inv_freq is None else k_inv_freq
    _check_freq(inv_freq, q, "inv_freq")
    _check_freq(k_inv_freq, k, "k_inv_freq")
    if k_inv_freq.shape[-1] != inv_freq.shape[-1]:
        raise InvalidArgument(f"k_inv_freq must have inv_freq's {inv_freq.shape[-1]} pairs, got {k_inv_freq.shape[-1]}")
    if pair_axis is not None:
        if tuple(pair_axis.shape) != (inv_freq.shape[-1],):
            raise InvalidArgument(f"pair_axis must have shape ({inv_freq.shape[-1]},) (one axis per pair), got {tuple(pair_axis.shape)}")
        if pair_axis.device.type == "cpu" and pair_axis.numel() and not (0 <= int(pair_axis.min()) and int(pair_axis.max()) < num_axes):
            raise InvalidArgument(f"pair_axis values must be in [0, {num_axes}) (rows of the positions), got {pair_axis.tolist()}")
    angles = _Angles(
        q_positions, k_positions, inv_freq.detach(), k_inv_freq.detach(), pair_axis, interleaved, float(attention_factor),
        inplace=inplace,
    )
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        return _FusedRope.apply(q, k, angles)
    return _rotated(q, k, angles)


def rotate_with_tables(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor, interleaved: bool) -> Tensor:
    """``out = x * cos + rotate(x) * sin`` with given full-width tables, one launch, no autograd.

    :func:`posenc.apply_rotary`'s fast path on a kernel device (its checks have run: cos and sin
    broadcast to x, full width). x of up to 4 dimensions (more: None is returned and the caller
    takes the torch path); the arithmetic runs in float32, or float64 if x, cos or sin is
    float64, rounded once into ``out`` (which may be x).
    """
    if x.dim() > 4:
        return None
    wide = torch.promote_types(torch.promote_types(x.dtype, torch.float32), torch.promote_types(cos.dtype, sin.dtype))
    x4, o4, c4, s4 = x, out, cos.expand(x.shape), sin.expand(x.shape)  # views: broadcast dims get stride 0
    for _ in range(4 - x.dim()):
        x4, o4, c4, s4 = x4.unsqueeze(0), o4.unsqueeze(0), c4.unsqueeze(0), s4.unsqueeze(0)
    if x4.numel() == 0:
        return out
    half = x4.shape[-1] // 2
    block_p = _pow2(half)
    bh, bt = _tile(x4.shape[1], x4.shape[2], block_p)
    jobs_t, jobs_h = triton.cdiv(x4.shape[2], bt), triton.cdiv(x4.shape[1], bh)
    _tables_kernel[(x4.shape[0] * jobs_t * jobs_h,)](
        x4, o4, c4, s4, x4.shape[1], x4.shape[2], half, jobs_t, jobs_h,
        *x4.stride(), *o4.stride(), *c4.stride(), *s4.stride(),
        INTERLEAVED=interleaved, WIDE=wide == torch.float64, SOFT_BF16=_soft_bf16(out.dtype),
        BLOCK_H=bh, BLOCK_T=bt, BLOCK_P=block_p, enable_fp_fusion=True, num_warps=_num_warps(bh, bt, block_p),
    )
    return out


__all__ = ["fused_rope", "rotate_with_tables", "TILE_PAIRS", "MAX_BLOCK_H"]
