"""The rotation of RoPE in torch: ``x * cos + rotate(x) * sin`` (Su et al. 2021, RoFormer,
eq. 34), written once (:func:`_rotate_pairs`) and run three ways: chunked through cache-sized
scratch (the uncompiled fast path), on the whole tensor (what ``torch.compile`` fuses, and when
cos or sin need a gradient), and as its own backward (the transpose of a rotation is a
rotation). :func:`rotate_heads` is the encodings' way in. The Triton twin is
:mod:`posenc.kernels.rotary_triton`.

Conventions (they differ between codebases):
- ``half-split`` (default; GPT-NeoX, Hugging Face Llama): dimension i pairs with i + r/2;
  cos and sin are full width, the half repeated: [c_0 .. c_{r/2-1}, c_0 .. c_{r/2-1}].
- ``interleaved`` (RoFormer paper, GPT-J, Meta's original Llama): dimension 2i pairs with
  2i+1; cos and sin duplicate each pair: [c_0, c_0, c_1, c_1, ...].
- The rotation runs in float32 or wider and is cast back to x's dtype.

Layer: kernels (imports torch and ``_validation`` only).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc import kernels as _kernels
from posenc._validation import broadcast_shape, check_bool
from posenc.errors import InvalidArgument, InvalidType

#: Elements per chunk of :func:`apply_rotary`'s fast path when x and out are float32 (1 MiB
#: each); other dtypes scale it so that a chunk touches the same 2 MiB (x, out and the
#: float32 scratches: bf16 chunks hold about 2/3 as many elements). Big enough that the
#: per-op overhead of the few ops per chunk is small, small enough that a chunk stays in a
#: core's L2 between those ops, so each element crosses main memory about once each way.
#: Chosen by timing (docs/results.md, "Measurements behind the code").
_CHUNK_ELEMENTS = 1 << 18


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


def _rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, out: Tensor | None = None) -> Tensor:
    """The rotation, written once: ``x * cos + rotate(x) * sin`` in x's dtype.

    With (x_1, x_2) the members of each pair (i, i + D/2) or (2i, 2i+1): out_1 = x_1 c_1 -
    x_2 s_1, out_2 = x_2 c_2 + x_1 s_2, as one product over the full width and then one
    ``addcmul_`` per member, without building rotate(x). ``out`` None: a new tensor,
    differentiable in x, cos and sin (autograd follows the in-place updates of a fresh
    product) and traced by ``torch.compile``; else written into ``out`` (no autograd), which
    must not share memory with x.
    """
    out = x * cos if out is None else torch.mul(x, cos, out=out)
    x1, x2 = _pair_views(x, interleaved)
    out1, out2 = _pair_views(out, interleaved)
    sin1, sin2 = _pair_views(sin, interleaved)
    out1.addcmul_(x2, sin1, value=-1)
    out2.addcmul_(x1, sin2)
    return out


def _rotate_whole(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """:func:`_rotate_pairs` on the whole tensor, out of place in the wide dtype, cast once:
    the path under ``torch.compile`` (the chunked path's Python loop and ``out=`` writes
    would not trace) and when cos or sin require grad."""
    wide = _wide_dtype(x, cos, sin)
    return _rotate_pairs(x.to(wide), cos.to(wide), sin.to(wide), interleaved).to(x.dtype)


def _rows(t: Tensor, start: int, stop: int, num_rows: int) -> Tensor:
    """Rows start:stop of dimension -2 when t has all num_rows of them (else t broadcasts)."""
    if t.dim() >= 2 and t.shape[-2] == num_rows:
        return t[..., start:stop, :]
    return t


def _chunk_elements(x: Tensor, out: Tensor, wide: torch.dtype, widen: bool, direct: bool) -> int:
    """Elements of x per chunk: the bytes a float32 chunk touches (x and out, 8 per element,
    :data:`_CHUNK_ELEMENTS` of them), divided by the bytes this chunk touches per element."""
    per_element = x.element_size() + out.element_size() + wide.itemsize * (int(widen) + int(not direct))
    return _CHUNK_ELEMENTS * 8 // per_element


def _rotate_into(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor, interleaved: bool) -> Tensor:
    """out = x * cos + rotate(x) * sin, chunked over dimension -2, no autograd.

    Per chunk, :func:`_rotate_pairs` into ``out`` (or a scratch). Narrower inputs (bf16,
    fp16) are widened per chunk into a cache-sized scratch, reused across chunks, and the
    result is rounded once into ``out``.

    On a kernel device (CUDA, with Triton: :func:`posenc.kernels.use_triton`) the whole
    rotation is one Triton launch instead (:func:`posenc.kernels.rotary_triton.rotate_with_tables`);
    on the CPU, once the fused kernel is built (:func:`posenc.kernels.use_cpu_kernel`), one
    pass of :func:`posenc.kernels.rotary_cpu.rotate_with_tables`, bit-identical.
    """
    if _kernels.use_triton(x, cos, sin):
        done = _kernels.rotary_kernels().rotate_with_tables(x, cos, sin, out, interleaved)
        if done is not None:
            return done
    elif _kernels.use_cpu_kernel(x, cos, sin, out):
        done = _kernels.cpu_rotary_kernel().rotate_with_tables(x, cos, sin, out, interleaved)
        if done is not None:
            return done
    wide = _wide_dtype(x, cos, sin)
    cos, sin = cos.to(wide), sin.to(wide)
    result = out  # the caller's tensor, of x's shape (a single row is viewed as one more dimension below)
    if x.dim() < 2:  # a single row
        x, out, cos, sin = x.unsqueeze(0), out.unsqueeze(0), cos.unsqueeze(0), sin.unsqueeze(0)
    num_rows = x.shape[-2]
    widen = x.dtype != wide
    direct = out.dtype == wide and out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    if x.device.type == "cpu":
        step = max(1, min(num_rows, _chunk_elements(x, out, wide, widen, direct) * num_rows // max(1, x.numel())))
    else:  # cache-sized chunks pay on a CPU; on a GPU each chunk is only more launches (bench rope on an H200: 5x)
        step = max(1, num_rows)
    chunk_shape = x.shape[:-2] + (step, x.shape[-1])
    x_scratch = torch.empty(chunk_shape, dtype=wide, device=x.device) if widen else None
    out_scratch = None if direct else torch.empty(chunk_shape, dtype=wide, device=x.device)
    for start in range(0, num_rows, step):
        stop = min(num_rows, start + step)
        xs, os_ = x[..., start:stop, :], out[..., start:stop, :]
        c, s = _rows(cos, start, stop, num_rows), _rows(sin, start, stop, num_rows)
        if widen:
            xs = x_scratch[..., : stop - start, :].copy_(xs)
        dst = _rotate_pairs(xs, c, s, interleaved, out=os_ if direct else out_scratch[..., : stop - start, :])
        if not direct:
            os_.copy_(dst)
    return result


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

    ``rotate`` is Hugging Face's ``rotate_half`` (half-split: (x_1, x_2) -> (-x_2, x_1)) or,
    interleaved, ``rotate_every_two`` ((x_0, x_1, ...) -> (-x_1, x_0, ...)); posenc computes the
    same products and sums on the pair members without building ``rotate(x)``. Uncompiled, it
    makes one pass over x per cache-sized chunk of rows, so each element crosses main memory
    about once each way (timings: docs/results.md, ``benchmarks/bench_rope.py``); its backward
    is again a rotation, differentiable itself (double backward works).

    On CUDA tensors with Triton installed (``pip install posenc[gpu]``) the rotation is one
    Triton launch, the same arithmetic (:func:`posenc.kernels.rotary_triton.rotate_with_tables`;
    ``posenc.kernels.TRITON_ENABLED = False`` or ``POSENC_TRITON=0`` turns it off).

    On the CPU (by default: the kernel built at the first call, or by
    ``posenc.kernels.build_cpu_rotary()``), the rotation of float32, bf16 and fp16 (either
    layout) is one fused C++ pass (:mod:`posenc.kernels.rotary_cpu`), bit-identical to the torch
    path and about the cost of a copy (docs/results.md, "CPU RoPE hot path"); the backward of
    the allocating call uses it too. ``POSENC_CPU_KERNEL=0`` or
    ``posenc.kernels.CPU_KERNEL_ENABLED = False`` keeps the torch path.

    Under ``torch.compile`` (``torch.compiler.is_compiling()``) the same rotation runs on the
    whole tensor at once (no chunks), in the same dtype, and traces with ``fullgraph=True``; with ``dynamic=True`` a
    change of T (or of any other size) does not recompile, except that T = 1 is
    specialized once, as torch does for every size 0 or 1.

    Args:
        x: (..., T, D), D even.
        cos: broadcastable to x, full width D: half-split repeats the half
            ``[c_0 .. c_{D/2-1}, c_0 .. c_{D/2-1}]``; interleaved duplicates each pair
            ``[c_0, c_0, c_1, c_1, ...]``. Every entry is read, as in the formula.
        sin: as cos.
        interleaved: pair (2i, 2i+1) instead of (i, i + D/2).
        out: optional preallocated result of x's shape and dtype (no autograd); it may be x
            itself, for an in-place rotation.

    Returns:
        A new tensor of x's shape and dtype (or ``out``); the arithmetic runs in float32, or
        the widest of x's, cos's and sin's dtypes if that is wider (float64 for float64
        inputs), and is rounded to x's dtype once. Differentiable in x, to any order; if cos
        or sin require grad, the whole-tensor rotation runs instead (the same numbers).

    Raises:
        TypeError: x, cos or sin not a floating-point tensor; interleaved not a bool.
        ValueError: odd D, cos/sin whose last dimension is not D, that do not broadcast to
            x's shape or are on another device, or an ``out`` of another shape or dtype.
    """
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise InvalidType(f"x must be a floating-point torch.Tensor, got {x.dtype if isinstance(x, Tensor) else type(x).__name__}")
    for t in (cos, sin):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            got = t.dtype if isinstance(t, Tensor) else type(t).__name__
            raise InvalidType(f"cos and sin must be floating-point torch.Tensors, got {got}")
    check_bool(interleaved, "interleaved")
    d = x.shape[-1]
    if d % 2:
        raise InvalidArgument(f"x: the last dimension must be even to form pairs, got {d}")
    if cos.shape[-1] != d or sin.shape[-1] != d:
        raise InvalidArgument(f"cos and sin must have last dimension {d} (full width), got {cos.shape[-1]} and {sin.shape[-1]}")
    try:
        shape = broadcast_shape(x.shape, cos.shape, sin.shape)
    except ValueError as err:
        raise InvalidArgument(f"cos and sin must broadcast to x's shape {tuple(x.shape)}, got {tuple(cos.shape)} and {tuple(sin.shape)}") from err
    if shape != x.shape:
        raise InvalidArgument(f"cos and sin must broadcast to x's shape {tuple(x.shape)}, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if cos.device != x.device or sin.device != x.device:
        raise InvalidArgument(f"cos and sin must be on x's device {x.device}, got {cos.device} and {sin.device}")
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype):
        raise InvalidArgument(f"out must have x's shape {tuple(x.shape)} and dtype {x.dtype}, got {tuple(out.shape)}, {out.dtype}")
    if torch.compiler.is_compiling():
        result = _rotate_whole(x, cos, sin, interleaved)
        return result if out is None else out.copy_(result)
    if out is not None:
        return _rotate_into(x, cos, sin, out, interleaved)
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        return _rotate_whole(x, cos, sin, interleaved)
    if torch.is_grad_enabled() and x.requires_grad:
        return _ApplyRotary.apply(x, cos, sin, interleaved)
    return _rotate_into(x, cos, sin, torch.empty_like(x, memory_format=torch.contiguous_format), interleaved)



def rotate_heads(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """x (B, H, T, D) rotated on its first r dimensions, r = cos.shape[-1] <= D; ``x[..., r:]``
    passes through (Hugging Face's partial rotary): the encodings' (RoPE, xPos, M-RoPE, axial
    RoPE) one way into :func:`apply_rotary`.

    cos and sin: (T, r), or (B, T, r) for per-row positions (broadcast over the heads), full
    width in the layout's order. Returns a tensor of x's shape and dtype. Raises as
    :func:`apply_rotary`.
    """
    if cos.dim() == 3:  # (B, T, r) -> (B, 1, T, r)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return apply_rotary(x, cos, sin, interleaved=interleaved)
    return torch.cat((apply_rotary(x[..., :r], cos, sin, interleaved=interleaved), x[..., r:]), dim=-1)
