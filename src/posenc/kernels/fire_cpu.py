"""The fused CPU forward of FIRE attention (``fire_cpu.cpp`` beside this file): softmax(scale
q.k^T + b) v with FIRE's bias b computed inside the attention from its per-distance table, its
per-row normalizer and its MLP's piecewise-linear pieces, online softmax per query block
(FlashAttention's forward, Dao et al. 2022, Algorithm 1): no (H, Tq, Tk) bias tile is written
or read. Measured in docs/results.md, "CPU attention hot paths (issue 24)".

Built as :mod:`posenc.kernels.rotary_cpu` is, through the kernels' one helper
(:mod:`posenc.kernels._build`: ``-O3 -march=native``, no torch header: seconds; a cache folder per
source, flags and CPU; a lock across processes; called through ``ctypes``, which releases the
GIL, so with several torch threads the query blocks are split across the kernels' pool), under
the same switch (:data:`posenc.kernels.CPU_KERNEL_ENABLED`, ``POSENC_CPU_KERNEL``):
:func:`use_kernel`. The call is the operator ``torch.ops.posenc.fire_attention_cpu`` (no
autograd), so the profiler names it and ``torch.compile`` traces it.

The encoding decides the math (:meth:`posenc.encodings.fire.FIRE.fused_attention`); this module
only runs it. Float32 only, forward only (no autograd), head sizes 32, 64 and 128.

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
SOURCE = _build.source("fire_cpu")

#: Compiler flags: the host's instruction set, multiply-adds fused (the result is compared with
#: the float64 formula, not bit for bit with a torch path).
CFLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fno-math-errno")

#: The head sizes the kernel is compiled for.
HEAD_DIMS = (32, 64, 128)

_lib: ctypes.CDLL | None = None
_block_keys = 64  # keys per block of the kernel (BK in the source), read from the library
_block_queries = 128  # query rows per block (BQ): the unit split across threads
_failed = False
_lock = threading.Lock()
_scratch = threading.local()
#: The largest key buffer kept per thread (entries): 64 MiB of float32.
_SCRATCH_ENTRIES = 1 << 24


def extension_name() -> str:
    """The build's name in the cache: source, flags, torch and CPU in one digest."""
    return _build.extension_name("fire_cpu", CFLAGS)


def is_built() -> bool:
    """True once :func:`build` has loaded the kernel in this process."""
    return _lib is not None


def _declare(lib: ctypes.CDLL) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.posenc_fire_attention_cpu.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, i64, ptr, ptr,
                                              ptr, i64, ptr, ptr, ctypes.c_float, ctypes.c_int, i64, i64]
    lib.posenc_fire_attention_cpu.restype = ctypes.c_int
    lib.posenc_fire_cpu_block_keys.restype = ctypes.c_int
    lib.posenc_fire_cpu_block_queries.restype = ctypes.c_int


def build(verbose: bool = False) -> bool:
    """Compile the kernel (or load it from the cache: :mod:`posenc.kernels._build`) into this
    process; True when loaded. On failure (no compiler, no ninja, an unwritable cache) one
    ``RuntimeWarning`` and False, and FIRE keeps its blocked path. Thread-safe, and safe across
    processes."""
    global _lib, _block_keys, _block_queries, _failed
    with _lock:
        if _lib is None and not _failed:
            lib = _build.load_or_warn("fire_cpu", CFLAGS, _declare, what="FIRE attention",
                                      fallback="FIRE keeps its blocked path", verbose=verbose)
            if lib is not None:
                _block_keys = int(lib.posenc_fire_cpu_block_keys())
                _block_queries = int(lib.posenc_fire_cpu_block_queries())
            _lib, _failed = lib, lib is None
        return _lib is not None


def unload() -> None:
    """Forget the loaded kernel in this process: calls take the blocked path again until the
    next :func:`build` (which loads it back from the cache). For tests that must leave the
    process as they found it."""
    global _lib
    with _lock:
        _lib = None


def use_kernel(*tensors: Tensor) -> bool:
    """The rule of :func:`posenc.kernels.use_cpu_kernel`, for this kernel: the switch on, every
    tensor on the CPU, not under ``torch.compile``, the kernel built (or built now: the default,
    ``posenc.kernels.CPU_KERNEL_AUTOBUILD``)."""
    from posenc import kernels

    if not kernels.CPU_KERNEL_ENABLED or torch.compiler.is_compiling():
        return False
    if not all(t.device.type == "cpu" for t in tensors):
        return False
    return is_built() or (kernels.CPU_KERNEL_AUTOBUILD and build())


def table_length(num_queries: int, num_keys: int) -> int:
    """How many entries the distance table handed to :func:`attention` must hold: the keys are
    padded to whole key blocks, Tq + Tk' - 1 with Tk' a multiple of the kernel's key block."""
    padded = -(-num_keys // _block_keys) * _block_keys
    return num_queries + padded - 1


def _covers(q: Tensor, k: Tensor, v: Tensor, psi: Tensor, causal: bool) -> bool:
    """Whether the kernel computes this call (a head size it is compiled for, float32 (B, H, T, D)
    tensors of matching shapes, a distance table of :func:`table_length` entries)."""
    if q.dim() != 4 or q.shape[-1] not in HEAD_DIMS or q.dtype != torch.float32:
        return False
    batch, heads, num_queries, head_dim = q.shape
    num_keys = k.shape[2] if k.dim() == 4 else 0
    return not (k.shape != (batch, heads, num_keys, head_dim) or v.shape != k.shape or k.dtype != q.dtype
                or v.dtype != q.dtype or num_queries == 0 or num_keys == 0 or (causal and num_keys < num_queries)
                or psi.numel() != table_length(num_queries, num_keys))


def attention(q: Tensor, k: Tensor, v: Tensor, *, psi: Tensor, den: Tensor, bends: Tensor, slopes: Tensor,
              intercepts: Tensor, scale: float, causal: bool) -> Tensor | None:
    """softmax(scale q.k^T + b + mask) v with b(h, i, j) = f_h(psi[(Tq - 1 - i) + j] / den[i]),
    f_h the piecewise-linear function of ``bends``, ``slopes[h]``, ``intercepts[h]`` (as
    :meth:`~posenc.encodings.fire.FIRE.piecewise_linear_mlp` gives them), the causal mask
    bottom-right aligned (key j visible to query i iff j <= i + Tk - Tq), or None where the
    kernel does not cover the call (another head size, dtype or layout).

    q (B, H, Tq, D), k and v (B, H, Tk, D): float32 CPU tensors; psi (:func:`table_length`,)
    float32, den (Tq,) float32 and > 0; bends (S - 1,) sorted, slopes and intercepts (H, S),
    float64. Returns a new contiguous (B, H, Tq, D) float32 tensor. No autograd. The work is the
    operator ``torch.ops.posenc.fire_attention_cpu``.
    """
    if _lib is None or not _covers(q, k, v, psi, causal):
        return None
    return torch.ops.posenc.fire_attention_cpu(q, k, v, psi, den, bends, slopes, intercepts, float(scale), bool(causal))


def _attention(q, k, v, psi, den, bends, slopes, intercepts, scale, causal):
    """The operator's CPU implementation: the keys in blocks, then one ctypes call per part of
    the query blocks (the parts on the kernels' pool)."""
    if _lib is None and not build():
        raise KernelUnavailable("posenc::fire_attention_cpu: the fused CPU FIRE attention kernel is not built "
                                "here (posenc.kernels.build_cpu_fire() returned False: see its warning)")
    if not _covers(q, k, v, psi, causal):
        raise InvalidArgument(f"posenc::fire_attention_cpu: q, k, v must be float32 (B, H, T, D) with D in "
                              f"{HEAD_DIMS}, Tk >= Tq when causal, and psi of table_length(Tq, Tk) entries; got "
                              f"{tuple(q.shape)} {q.dtype}, {tuple(k.shape)}, {tuple(v.shape)}, psi {psi.numel()}")
    pieces = (q.shape[1], bends.numel() + 1)
    if den.numel() != q.shape[2] or slopes.shape != pieces or intercepts.shape != pieces:
        raise InvalidArgument(f"posenc::fire_attention_cpu: den must have Tq = {q.shape[2]} entries and slopes and "
                              f"intercepts shape (H, S) = {pieces} (S - 1 = bends' length), got {den.numel()}, "
                              f"{tuple(slopes.shape)}, {tuple(intercepts.shape)}")
    batch, heads, num_queries, head_dim = q.shape
    num_keys = k.shape[2]
    padded = table_length(num_queries, num_keys) - num_queries + 1
    q, v = q.contiguous(), v.contiguous()
    kt = _key_blocks(k, padded)
    out = q.new_empty(batch, heads, num_queries, head_dim)
    tensors = [t.contiguous() for t in (psi.float(), den.float(), bends.double(), slopes.double(), intercepts.double())]
    psi, den, bends, slopes, intercepts = tensors
    args = (q.data_ptr(), kt.data_ptr(), v.data_ptr(), out.data_ptr(), batch * heads, slopes.shape[0], num_queries,
            num_keys, padded, head_dim, psi.data_ptr(), den.data_ptr(), bends.data_ptr(), bends.numel(),
            slopes.data_ptr(), intercepts.data_ptr(), float(scale), int(causal))
    blocks = -(-num_queries // _block_queries)
    parts = max(1, min(torch.get_num_threads(), blocks))
    if parts == 1:
        code = _lib.posenc_fire_attention_cpu(*args, 0, 1)
    else:
        pool = _build.thread_pool(parts)
        futures = [pool.submit(_lib.posenc_fire_attention_cpu, *args, part, parts) for part in range(1, parts)]
        code = _lib.posenc_fire_attention_cpu(*args, 0, parts)
        code = min([code] + [f.result() for f in futures])
    if code != 0:  # the head size, checked above: a library that disagrees with HEAD_DIMS
        raise KernelUnavailable(f"posenc::fire_attention_cpu: the kernel refused head size {head_dim} (code {code})")
    return out


def _attention_fake(q, k, v, psi, den, bends, slopes, intercepts, scale, causal):
    return q.new_empty(q.shape)


OP = _build.define_op("fire_attention_cpu(Tensor q, Tensor k, Tensor v, Tensor psi, Tensor den, Tensor bends, "
                      "Tensor slopes, Tensor intercepts, float scale, bool causal) -> Tensor",
                      _attention, _attention_fake)


def _key_blocks(k: Tensor, padded: int) -> Tensor:
    """k (B, H, Tk, D) as (B, H, Tk' / BK, D, BK): each block of BK keys transposed into one
    contiguous 16 KiB slab (at D = 64), the keys past Tk zero. A slab per block, not one (D, Tk')
    matrix: the kernel's product reads a block's D rows, which in a (D, Tk') layout sit Tk' floats
    apart, each on its own page. In a buffer kept per thread (fresh pages cost page faults)."""
    batch, heads, num_keys, head_dim = k.shape
    blocks = padded // _block_keys
    entries = batch * heads * padded * head_dim
    buffer = getattr(_scratch, "keys", None)
    if buffer is None or buffer.numel() < entries or entries > _SCRATCH_ENTRIES:
        buffer = torch.empty(entries)
        if entries <= _SCRATCH_ENTRIES:
            _scratch.keys = buffer
    kt = buffer[:entries].view(batch, heads, blocks, head_dim, _block_keys)
    whole = num_keys // _block_keys
    if whole:
        kt[:, :, :whole].copy_(k[:, :, :whole * _block_keys].view(batch, heads, whole, _block_keys, head_dim)
                               .transpose(-2, -1))
    if whole < blocks:
        tail = num_keys - whole * _block_keys
        kt[:, :, whole].zero_()
        kt[:, :, whole, :, :tail].copy_(k[:, :, whole * _block_keys:].transpose(-2, -1))
    return kt
