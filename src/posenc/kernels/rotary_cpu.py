"""The fused CPU rotation of RoPE (half-split or interleaved pairs): one pass over memory, x loaded in its dtype,
rotated in float32 registers, stored once rounded to x's dtype (``rotary_cpu.cpp`` beside this
file). The torch path (:mod:`posenc.kernels.rotary_torch`) makes three or five passes per
chunk; this one makes one, so it runs at about the speed of a copy (docs/results.md, "CPU RoPE
hot path (issue 24)").

Built on first request by :func:`build` (``-O3 -march=native``; the source includes no torch
header, so the build takes seconds) through the kernels' one helper (:mod:`posenc.kernels._build`:
a cache folder per source, flags and CPU, a lock across processes) and called through ``ctypes``,
which releases the GIL: with several torch threads the rows are split across a thread pool. The
call is the operator ``torch.ops.posenc.rotary_cpu`` (``x, cos, sin, out!, interleaved -> ()``,
mutating ``out``; no autograd: ``apply_rotary``'s own Function differentiates around it), so the
profiler names it and ``torch.compile`` traces it.

The arithmetic is the torch path's, operation for operation (float32, the product with cos
rounded, the sin term added by a fused multiply-add exactly when torch's ``addcmul_`` fuses on
this CPU, probed before the build), so the results are bit-identical to it; bf16 and fp16 are
rounded once, to nearest even as torch rounds.

:func:`rotate_with_tables` returns None for what it does not cover (float64, a tensor that
requires grad while grad mode is on, a last dimension that is not contiguous, an ``out`` that partly overlaps x, shapes whose leading dimensions do
not merge); the caller then takes the torch path.

Layer: kernels (imports torch only).
"""

from __future__ import annotations

import ctypes
import threading

import torch
from torch import Tensor

from posenc.errors import InvalidArgument
from posenc.kernels import _build
from posenc.kernels._build import KernelUnavailable

#: The C++ source, shipped beside this module (package data).
SOURCE = _build.source("rotary_cpu")

#: Compiler flags: the host's instruction set; no contraction of a * b + c into an FMA
#: beyond the ones the source writes (the rounding must be the torch path's).
CFLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno")

#: Codes of the dtypes in the C entry point.
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

#: Bytes of cos and sin per block of positions (16 positions at D = 128): the block stays in L1
#: while every head reads it. Chosen by timing (docs/results.md, "CPU RoPE hot path (issue 24)").
_BLOCK_BYTES = 16 * 1024

#: Below this many elements a call stays on one thread: handing parts to the pool costs tens of
#: microseconds, small against a call of 2^18 elements (about 0.1 ms even in cache).
_PARALLEL_MIN_ELEMENTS = 1 << 18

_lib: ctypes.CDLL | None = None
_dtypes: frozenset[torch.dtype] = frozenset()
_failed = False
_lock = threading.Lock()
#: The call :func:`rotate_with_tables` is making, (x, cos, sin, out, strides), for the operator's
#: implementation: the same tensor objects reach it through the dispatcher, so the checks (several
#: microseconds, as much as the kernel on a decoding step) run once per call, not twice.
_handoff = threading.local()


def torch_fuses_addcmul() -> bool:
    """Whether torch's CPU ``addcmul_`` rounds ``a + b * c`` once (a fused multiply-add) on
    this machine: with a = -1, b = 1 + 2^-23, c = 1 - 2^-23 the fused result is -2^-46, the
    unfused one 0 (b * c rounds to 1). Read on a vector-length tensor (torch's vector loop)."""
    n = 64
    a = torch.full((n,), -1.0)
    b = torch.full((n,), 1.0 + 2.0**-23)
    c = torch.full((n,), 1.0 - 2.0**-23)
    return bool(a.addcmul_(b, c)[0] != 0)


def _cflags(fma: bool) -> tuple[str, ...]:
    return CFLAGS + (f"-DPOSENC_ROTARY_FMA={int(fma)}",)


def extension_name(fma: bool) -> str:
    """The build's name in the cache: source, flags (the FMA choice among them), torch and CPU in one digest."""
    return _build.extension_name("rotary_cpu", _cflags(fma))


def is_built() -> bool:
    """True once :func:`build` has loaded the kernel in this process."""
    return _lib is not None


def _declare(lib: ctypes.CDLL) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.posenc_rotary_cpu.argtypes = [ctypes.c_int, ctypes.c_int, ptr, ptr, ptr, ptr, i64, i64, ptr, i64, i64, i64, i64, i64]
    lib.posenc_rotary_cpu.restype = ctypes.c_int
    lib.posenc_rotary_cpu_dtypes.restype = ctypes.c_int


def build(verbose: bool = False) -> bool:
    """Compile the kernel (or load it from the cache: :mod:`posenc.kernels._build`) into this process.

    The first build on a machine takes seconds (g++ and ninja, as torch's C++ extensions need);
    later processes load the cached library. On failure (no compiler, no ninja, an unwritable
    cache) it warns once (``RuntimeWarning``) and returns False; every call then keeps the torch
    path. Thread-safe, and safe across processes (a lock file; a build killed midway blocks
    nobody); returns True when the kernel is loaded.
    """
    global _lib, _dtypes, _failed
    with _lock:
        if _lib is None and not _failed:
            lib = _build.load_or_warn("rotary_cpu", _cflags(torch_fuses_addcmul()), _declare, what="RoPE",
                                      fallback="apply_rotary keeps its torch path", verbose=verbose)
            if lib is not None:
                mask = lib.posenc_rotary_cpu_dtypes()
                _dtypes = frozenset(dt for dt, code in _DTYPE_CODES.items() if mask >> code & 1)
            _lib, _failed = lib, lib is None
        return _lib is not None


def _leading_strides(shape: torch.Size, t: Tensor) -> list[int] | None:
    """The strides of t broadcast to ``shape`` (0 where t broadcasts), for ``shape`` viewed as
    (n0, n1, T, D): size-1 dimensions added in front, extra leading ones merged into n0 (None
    when their strides do not merge). Returns the first three; computed on ints, no views."""
    nd, own = len(shape), t.shape
    strides = [0] * (nd - len(own)) + [st if n != 1 else 0 for st, n in zip(t.stride(), own)]
    if nd <= 4:  # nothing to merge (RoPE's q and k): the common case, kept short
        return ([0] * (4 - nd) + strides)[:3]
    sizes = list(shape)
    while len(sizes) > 4:  # merge dimension 0 into 1: stride_0 = stride_1 * size_1, or one is a broadcast
        if sizes[0] == 1 or strides[0] == strides[1] * sizes[1]:
            merged = strides[1]
        elif sizes[1] == 1:
            merged = strides[0]
        else:
            return None
        sizes[:2], strides[:2] = [sizes[0] * sizes[1]], [merged]
    return ([0] * (4 - len(sizes)) + strides)[:3]


def _view_4d(shape: torch.Size) -> tuple[int, int, int, int]:
    """``shape`` as (n0, n1, T, D)."""
    sizes = (1,) * (4 - len(shape)) + tuple(shape)
    n0 = 1
    for n in sizes[:-3]:
        n0 *= n
    return n0, sizes[-3], sizes[-2], sizes[-1]


def _float32_tables(cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """cos and sin as the kernel reads them: float32 (bf16/fp16 widened exactly), each
    contiguous in its last dimension (a no-op for RoPE's tables)."""
    if cos.dtype != torch.float32:
        cos = cos.to(torch.float32)
    if sin.dtype != torch.float32:
        sin = sin.to(torch.float32)
    if cos.stride(-1) != 1:
        cos = cos.contiguous()
    if sin.stride(-1) != 1:
        sin = sin.contiguous()
    return cos, sin


def _plan(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor) -> list[list[int]] | str:
    """The strides the kernel reads (x's, out's, cos's and sin's over (n0, n1, T)), or why it
    cannot rotate these tensors (cos and sin as :func:`_float32_tables` gives them)."""
    if x.dtype not in _dtypes or out.dtype != x.dtype:
        return f"x and out must share a dtype among {sorted(map(str, _dtypes))}, got {x.dtype} and {out.dtype}"
    if cos.dtype not in _DTYPE_CODES or sin.dtype not in _DTYPE_CODES:
        return f"cos and sin must be float32, bfloat16 or float16, got {cos.dtype} and {sin.dtype}"
    if out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() and (
            out.data_ptr() != x.data_ptr() or out.stride() != x.stride()):
        return "out must be x itself or not overlap it"
    if x.shape[-1] > 1 and (x.stride(-1) != 1 or out.stride(-1) != 1):
        return "x and out must be contiguous in their last dimension"
    strides = [_leading_strides(x.shape, t) for t in (x, out, cos, sin)]
    if any(st is None for st in strides):
        return "the leading dimensions of x, out, cos and sin must merge into (n0, n1)"
    return strides


def _broadcasts_to(shape: torch.Size, t: Tensor) -> bool:
    """Whether t broadcasts to ``shape`` (on ints: torch.broadcast_shapes costs tens of microseconds)."""
    return t.dim() <= len(shape) and all(n == m or n == 1 for n, m in zip(reversed(t.shape), reversed(shape)))


def rotate_with_tables(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor, interleaved: bool) -> Tensor | None:
    """out = x * cos + rotate(x) * sin in one pass (no autograd; pairs (i, i + D/2), or (2i, 2i+1)
    when interleaved), or None when this kernel does not cover the call (see the module
    docstring) and the torch path must run.

    x: (..., T, D) float32, bfloat16 or float16 on the CPU, last dimension contiguous; cos, sin:
    broadcastable to x (checked by the caller), float32 (bf16/fp16 tables are widened first,
    exactly); out: x's shape and dtype, x itself or not overlapping it. The work is the operator
    ``torch.ops.posenc.rotary_cpu``.
    """
    if _lib is None or x.dtype not in _dtypes or out.dtype != x.dtype:
        return None
    if cos.dtype not in _DTYPE_CODES or sin.dtype not in _DTYPE_CODES:
        return None  # a float64 table: the torch path computes in float64
    if torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad or out.requires_grad):
        return None  # writing into out records no gradient: the torch path raises, as torch's out= ops do
    if x.numel() == 0:
        return out
    cos, sin = _float32_tables(cos, sin)
    strides = _plan(x, cos, sin, out)
    if isinstance(strides, str):
        return None
    _handoff.call = (x, cos, sin, out, strides)
    try:
        _OVERLOAD(x, cos, sin, out, interleaved)
    finally:
        _handoff.call = None
    return out


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor, interleaved: bool) -> None:
    """The operator's CPU implementation: checks what the kernel trusts (a call from
    :func:`rotate_with_tables` was checked there), then runs it."""
    call = getattr(_handoff, "call", None)
    if call is not None and call[0] is x and call[1] is cos and call[2] is sin and call[3] is out:
        _run(x, cos, sin, out, interleaved, call[4])  # checked by rotate_with_tables a moment ago
        return
    if _lib is None and not build():
        raise KernelUnavailable("posenc::rotary_cpu: the fused CPU RoPE kernel is not built here "
                                "(posenc.kernels.build_cpu_rotary() returned False: see its warning)")
    if out.shape != x.shape or not (_broadcasts_to(x.shape, cos) and _broadcasts_to(x.shape, sin)):
        raise InvalidArgument(f"posenc::rotary_cpu: out must have x's shape {tuple(x.shape)} and cos and sin "
                              f"broadcast to it, got {tuple(out.shape)}, {tuple(cos.shape)}, {tuple(sin.shape)}")
    if cos.dtype in _DTYPE_CODES and sin.dtype in _DTYPE_CODES:
        cos, sin = _float32_tables(cos, sin)
    strides = _plan(x, cos, sin, out)
    if isinstance(strides, str):
        raise InvalidArgument(f"posenc::rotary_cpu: {strides}")
    if x.numel():
        _run(x, cos, sin, out, interleaved, strides)


def _run(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor, interleaved: bool, strides: list[list[int]]) -> None:
    """The kernel on checked tensors: one ctypes call, or one per part on the kernels' pool."""
    _, n1, length, d = _view_4d(x.shape)
    heads = x.numel() // (length * d)
    block = max(1, _BLOCK_BYTES // (8 * d))
    args = (_DTYPE_CODES[x.dtype], int(interleaved), x.data_ptr(), out.data_ptr(), cos.data_ptr(), sin.data_ptr(), n1, d,
            (ctypes.c_int64 * 12)(*strides[0], *strides[1], *strides[2], *strides[3]))
    threads = torch.get_num_threads()
    if threads > 1 and x.numel() >= _PARALLEL_MIN_ELEMENTS:
        _run_split(args, heads, length, block, threads)
    else:
        _lib.posenc_rotary_cpu(*args, 0, heads, 0, length, block)


def _run_split(args: tuple, heads: int, length: int, block: int, threads: int) -> None:
    """The rows split into ``threads`` parts (by positions when there are enough, else by
    heads), one run on this thread and the rest on the pool (ctypes releases the GIL)."""
    if length >= threads * block:
        cuts = [length * i // threads for i in range(threads + 1)]
        parts = [(0, heads, cuts[i], cuts[i + 1]) for i in range(threads)]
    else:
        cuts = [heads * i // threads for i in range(threads + 1)]
        parts = [(cuts[i], cuts[i + 1], 0, length) for i in range(threads) if cuts[i + 1] > cuts[i]]
    pool = _build.thread_pool(threads)
    futures = [pool.submit(_lib.posenc_rotary_cpu, *args, *p, block) for p in parts[1:]]
    _lib.posenc_rotary_cpu(*args, *parts[0], block)
    for f in futures:
        f.result()


def _rotate_fake(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor, interleaved: bool) -> None:
    """Tracing: the operator writes ``out`` and returns nothing."""


OP = _build.define_op("rotary_cpu(Tensor x, Tensor cos, Tensor sin, Tensor(a!) out, bool interleaved) -> ()",
                      _rotate, _rotate_fake)
_OVERLOAD = torch.ops.posenc.rotary_cpu.default  # called as is: the packet's overload lookup costs per call
