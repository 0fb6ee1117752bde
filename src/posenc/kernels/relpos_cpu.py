"""Fused CPU attention with a relative-position table, forward and backward (``relpos_cpu.cpp``
beside this file): the attention of Shaw et al. (2018) and of Transformer-XL (Dai et al. 2019)
in one pass per (batch, head) slice over cache-resident data, where the eager backend makes a
dozen passes over (B, H, Tq, Tk) tensors (timings: docs/results.md, "CPU attention hot paths
(issue 24)").

Per (b, h), z_ij the logit before the scale (the formula of ``relpos_cpu.cpp``):

    z_ij = q_i . k_j + (q_i + a) . E[r(i, j)] + u . k_j,     r(i, j) = clamp(j - i + offset, 0, R - 1),
    s_ij = scale z_ij + B[h, r(i, j)] + (hi_i' - hi_j + lo_i') - lo_j + f_h(N[r(i, j)] / den_i),   i' = i + Tk - Tq,
    p_ij = softmax_j(s_ij) over the visible keys (causal: j <= i + Tk - Tq),
    o_i  = sum_j p_ij (v_j + F[r(i, j)]).

Shaw: E = w^K, F = w^V (R = 2k + 1, shared by the heads), no a or u. Transformer-XL: E = W R_d
per head over the call's distances, a = r_r_bias, u = r_w_bias, no F. The score biases (issue
38): B (H, R) a bias per head and table row (T5, ALiBi, Kerple: :func:`bias_arguments`), hi and
lo (B, H, Tk) FoX's cumulative log forget gates in two float parts, and f_h piecewise linear
(slopes and intercepts (H, S) between the sorted bends (S - 1,), shared by the heads) of
N (R,) / den (Tq,): FIRE's MLP of its normalized distance. The gradients of q, k, v and of the
tables (lo and the bends excepted) come from one backward pass that recomputes the probabilities
from the saved log-sum-exp (FlashAttention's scheme); both passes take the query rows in blocks
of 128, so their buffers are O(128 Tk) per thread, and their products in chunks of 256 keys or
table rows. float32 (exp by a polynomial within about 1 ulp) and float64 (for gradcheck).

Built as the fused RoPE kernel is, through the kernels' one helper (:mod:`posenc.kernels._build`:
no torch header, seconds; a cache folder per source, flags and CPU; a lock across processes),
called through ``ctypes`` (several torch threads: the (b, h) slices split across the kernels'
pool). The calls are two operators, ``torch.ops.posenc.relpos_attention_cpu`` (-> out and the
log-sum-exp per row) and ``torch.ops.posenc.relpos_attention_cpu_backward``, the first with the
second as its registered autograd formula (once differentiable), so the profiler names them and
``torch.compile`` traces them. The same switch: built at the first call by default (or now by
:func:`posenc.kernels.build_cpu_relpos`), never used with ``POSENC_CPU_KERNEL=0`` /
``posenc.kernels.CPU_KERNEL_ENABLED = False``. Under ``torch.compile`` the
encodings keep their torch path (:func:`usable` says no).

Layer: kernels (imports torch and the kernels package only).
"""

from __future__ import annotations

import ctypes
import math
import threading

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from posenc import kernels
from posenc.errors import InvalidArgument
from posenc.kernels import _build
from posenc.kernels._build import KernelUnavailable
from posenc.kernels.fused_bias import FusedBias, relu_pieces

#: The C++ source, shipped beside this module (package data).
SOURCE = _build.source("relpos_cpu")

#: Compiler flags: the host's instruction set (the results need not match torch's bits: the
#: softmax is this kernel's own, checked against float64 by the tests).
CFLAGS = ("-O3", "-march=native", "-fno-math-errno")

_DTYPE_CODES = {torch.float32: 0, torch.float64: 1}

#: Below this many score entries (B H Tq Tk) a call stays on one thread: handing parts to the
#: pool costs tens of microseconds.
_PARALLEL_MIN_ENTRIES = 1 << 18

_lib: ctypes.CDLL | None = None
_failed = False
_lock = threading.Lock()


def extension_name() -> str:
    """The build's name in the cache: source, flags, torch and CPU in one digest."""
    return _build.extension_name("relpos_cpu", CFLAGS)


def is_built() -> bool:
    """True once :func:`build` has loaded the kernel in this process."""
    return _lib is not None


def _declare(lib: ctypes.CDLL) -> None:
    i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    head = [c_int, i64, i64, i64, i64, i64, i64, c_int, ctypes.c_double]
    # q, k, v, E, E per head, a, u, F, B, hi, lo, N, den, bends, slopes, intercepts, S
    tables = [ptr, ptr, ptr, ptr, c_int, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, i64]
    lib.posenc_relpos_forward.argtypes = head + tables + [ptr, ptr, ptr, i64, i64]
    lib.posenc_relpos_forward.restype = c_int
    lib.posenc_relpos_backward.argtypes = head + tables + [ptr] * 7 + [ptr, i64, i64]
    lib.posenc_relpos_backward.restype = c_int


def build(verbose: bool = False) -> bool:
    """Compile the kernel (or load it from the cache: :mod:`posenc.kernels._build`) into this process.

    Returns True when it is loaded. On failure (no compiler, no ninja, an unwritable cache) it
    warns once (``RuntimeWarning``) and returns False; the encodings then keep their torch path.
    Thread-safe, and safe across processes.
    """
    global _lib, _failed
    with _lock:
        if _lib is None and not _failed:
            _lib = _build.load_or_warn("relpos_cpu", CFLAGS, _declare, what="relative-position attention",
                                       fallback="Shaw and Transformer-XL keep their torch path", verbose=verbose)
            _failed = _lib is None
        return _lib is not None


def usable(*tensors: Tensor) -> bool:
    """Whether the kernel should serve a call on these tensors: the switch
    ``posenc.kernels.CPU_KERNEL_ENABLED`` is on, not under ``torch.compile``, every tensor on the
    CPU, all float32 or all float64, and the kernel is built (or built now: the default,
    ``posenc.kernels.CPU_KERNEL_AUTOBUILD``). Reads no tensor values."""
    if not kernels.CPU_KERNEL_ENABLED or torch.compiler.is_compiling():
        return False
    dtype = tensors[0].dtype
    if dtype not in _DTYPE_CODES or any(t.device.type != "cpu" or t.dtype != dtype for t in tensors):
        return False
    return _lib is not None or (kernels.CPU_KERNEL_AUTOBUILD and build())


def serves(*tensors: Tensor) -> bool:
    """Whether an encoding should hand a call to the kernel: :func:`usable` on float32 tensors.
    float64 calls keep the hooks' path: the reference dtype, exact torch operations and second
    derivatives, which the kernel's backward does not have."""
    return tensors[0].dtype == torch.float32 and usable(*tensors)


def _rows(t: Tensor) -> list[int]:
    """The strides of t's (b, h, t) dimensions."""
    return list(t.stride()[:3])


def _ptr(t: Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


def _dense_like(x: Tensor) -> Tensor:
    """An uninitialized tensor of x's shape whose memory runs in the order of x's strides (the
    gradient of a transposed view of a projection comes back in the projection's layout, so
    the backward of the view and of the split costs no copy)."""
    order = sorted(range(x.dim()), key=lambda d: (-x.stride(d), -d))
    strides, step = [0] * x.dim(), 1
    for d in reversed(order):
        strides[d] = step
        step *= x.shape[d]
    return torch.empty_strided(x.shape, strides, dtype=x.dtype, device=x.device)


def _last_contiguous(t: Tensor) -> Tensor:
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _strides(*tensors: Tensor) -> ctypes.Array:
    """The kernel's Strides struct: (b, h, t) strides of q, k, v, out, dout, dq, dk, dv."""
    values = [st for t in tensors for st in _rows(t)]
    return (ctypes.c_int64 * 24)(*(values + [0] * (24 - len(values))))


def _threads(slices: int, entries: int) -> int:
    """Threads for a call: torch's, at most one per (b, h) slice; one below
    :data:`_PARALLEL_MIN_ENTRIES` score entries (the pool's hand-off costs more)."""
    return 1 if entries < _PARALLEL_MIN_ENTRIES else max(1, min(torch.get_num_threads(), slices))


def _run(fn, args, threads: int, slices: int) -> None:
    """fn(*args(part), g_begin, g_end) over the (b, h) slices split in ``threads`` parts, one on
    this thread and the rest on the pool (ctypes releases the GIL)."""
    if threads <= 1:
        fn(*args(0), 0, slices)
        return
    cuts = [slices * i // threads for i in range(threads + 1)]
    pool = _build.thread_pool(threads)
    futures = [pool.submit(fn, *args(i), cuts[i], cuts[i + 1]) for i in range(1, threads)]
    fn(*args(0), cuts[0], cuts[1])
    for f in futures:
        f.result()


def _require_lib(name: str) -> ctypes.CDLL:
    if _lib is None and not build():
        raise KernelUnavailable(f"posenc::{name}: the fused CPU relative-position attention kernel is not built "
                                f"here (posenc.kernels.build_cpu_relpos() returned False: see its warning)")
    return _lib


def _width(tables: list[Tensor | None]) -> int:
    """R, the table rows: E's (R, D) or (H, R, D), else F's (R, D), else B's (H, R), else N's (R,);
    1 without a table."""
    key_table, _, _, value_table, bias_table = tables[:5]
    x_table = tables[7]
    if key_table is not None:
        return key_table.shape[-2]
    if value_table is not None:
        return value_table.shape[0]
    if bias_table is not None:
        return bias_table.shape[-1]
    return x_table.shape[0] if x_table is not None else 1


def _common(q: Tensor, k: Tensor, v: Tensor, tables: list[Tensor | None], offset: int, causal: bool,
            scale: float) -> tuple:
    """The arguments both entry points start with: sizes, switches and the inputs' pointers."""
    _, heads, num_queries, dim = q.shape
    head = (_DTYPE_CODES[q.dtype], heads, num_queries, k.shape[2], dim, _width(tables), offset, int(causal), scale)
    pieces = tables[10].shape[-1] if tables[10] is not None else 0
    return (head + (_ptr(q), _ptr(k), _ptr(v), _ptr(tables[0]), int(tables[0] is not None and tables[0].dim() == 3))
            + tuple(_ptr(t) for t in tables[1:]) + (pieces,))


def _inputs(q, k, v, *tables):
    """q, k, v with their last dimension contiguous and the tables contiguous (the kernel's layout)."""
    q, k, v = _last_contiguous(q), _last_contiguous(k), _last_contiguous(v)
    return q, k, v, [t.contiguous() if t is not None else None for t in tables]


def _check(name: str, q: Tensor, k: Tensor, v: Tensor, tables: list[Tensor | None], *per_query: Tensor) -> None:
    """Raise unless the shapes and dtypes are the ones the kernel trusts (the operators are public:
    a wrong shape must not reach the C++): q (B, H, Tq, D), k and v (B, H, Tk, D), E (R, D) or
    (H, R, D), a and u (H, D), F (R, D), B (H, R), hi and lo (B, H, Tk) (both or neither),
    ``per_query`` tensors of q's shape (out, grad_out), all CPU tensors of one dtype, float32 or
    float64."""
    tensors = [q, k, v, *per_query, *(t for t in tables if t is not None)]
    if q.dtype not in _DTYPE_CODES or any(t.dtype != q.dtype or t.device.type != "cpu" for t in tensors):
        raise InvalidArgument(f"posenc::{name}: q, k, v and the tables must be CPU tensors of one dtype, float32 or "
                              f"float64, got {sorted({f'{t.dtype} on {t.device}' for t in tensors})}")
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or (q.shape[0], q.shape[1], q.shape[3]) != (
            k.shape[0], k.shape[1], k.shape[3]) or any(t.shape != q.shape for t in per_query):
        raise InvalidArgument(f"posenc::{name}: q must be (B, H, Tq, D) and k, v (B, H, Tk, D), got "
                              f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    heads, dim = q.shape[1], q.shape[3]
    key_table, query_bias, key_bias, value_table, bias_table, gate_hi, gate_lo = tables[:7]
    widths = {t.shape[-2] for t in (key_table, value_table) if t is not None}
    widths |= {bias_table.shape[-1]} if bias_table is not None else set()
    widths |= {tables[7].shape[0]} if tables[7] is not None and tables[7].dim() == 1 else set()
    gates = (q.shape[0], heads, k.shape[2])
    shapes_ok = (len(widths) <= 1 and all(t is None or t.shape == (heads, dim) for t in (query_bias, key_bias))
                 and (key_table is None or key_table.shape[-1:] == (dim,) and key_table.dim() in (2, 3)
                      and (key_table.dim() == 2 or key_table.shape[0] == heads))
                 and (value_table is None or value_table.dim() == 2 and value_table.shape[-1] == dim)
                 and (bias_table is None or bias_table.dim() == 2 and bias_table.shape[0] == heads)
                 and (gate_hi is None) == (gate_lo is None)
                 and all(t is None or t.shape == gates for t in (gate_hi, gate_lo)))
    if not shapes_ok:
        got = ", ".join(str(tuple(t.shape)) if t is not None else "None" for t in tables)
        raise InvalidArgument(f"posenc::{name}: key_table must be (R, {dim}) or ({heads}, R, {dim}), query_bias and "
                              f"key_bias ({heads}, {dim}), value_table (R, {dim}), bias_table ({heads}, R) with one R, "
                              f"gate_hi and gate_lo both {gates} or both None; got {got}")
    _check_piecewise(name, heads, q.shape[2], widths, tables[7:])


def _check_piecewise(name: str, heads: int, num_queries: int, widths: set, piecewise: list[Tensor | None]) -> None:
    """The piecewise term's five tensors: all absent, or x_table (R,) of the other tables' R, x_den
    (Tq,), bends (S - 1,), slopes and intercepts (H, S)."""
    x_table, x_den, bends, slopes, intercepts = piecewise
    if all(t is None for t in piecewise):
        return
    pieces = slopes.shape[-1] if slopes is not None and slopes.dim() == 2 else -1
    if (any(t is None for t in piecewise) or x_table.dim() != 1 or len(widths) != 1 or x_den.shape != (num_queries,)
            or pieces < 1 or bends.shape != (pieces - 1,) or slopes.shape != (heads, pieces)
            or intercepts.shape != (heads, pieces)):
        got = ", ".join(str(tuple(t.shape)) if t is not None else "None" for t in piecewise)
        raise InvalidArgument(f"posenc::{name}: x_table must be (R,) with the other tables' R, x_den ({num_queries},), "
                              f"bends (S - 1,), slopes and intercepts ({heads}, S), all five or none; got {got}")


def _forward(q, k, v, *tables_and_options):
    """``posenc::relpos_attention_cpu`` on CPU tensors: (out, lse)."""
    lib = _require_lib("relpos_attention_cpu")
    tables, (offset, causal, scale) = list(tables_and_options[:_NUM_TABLES]), tables_and_options[_NUM_TABLES:]
    _check("relpos_attention_cpu", q, k, v, tables)
    q, k, v, tables = _inputs(q, k, v, *tables)
    batch, heads, num_queries = q.shape[:3]
    out = _dense_like(q)  # q's layout: for the LM's (B, T, H, D) projection, the reshape after is free
    lse = q.new_empty(batch, heads, num_queries)
    common = _common(q, k, v, tables, offset, causal, scale)
    strides = _strides(q, k, v, out)
    slices = batch * heads
    _run(lib.posenc_relpos_forward, lambda part: common + (_ptr(out), _ptr(lse), strides),
         _threads(slices, slices * num_queries * k.shape[2]), slices)
    return out, lse


def _forward_fake(q, k, v, *tables_and_options):
    q = _last_contiguous(q)  # the layout _forward's out follows
    return _dense_like(q), q.new_empty(q.shape[:3])


def _backward(grad_out, q, k, v, out, lse, *tables_and_options):
    """``posenc::relpos_attention_cpu_backward`` on CPU tensors: dq, dk, dv and the tables'
    gradients flattened one after the other into one vector (the present tables only; the
    gates' one, hi's: lo carries none)."""
    lib = _require_lib("relpos_attention_cpu_backward")
    tables, (offset, causal, scale) = list(tables_and_options[:_NUM_TABLES]), tables_and_options[_NUM_TABLES:]
    _check("relpos_attention_cpu_backward", q, k, v, tables, out, grad_out)
    if lse.shape != q.shape[:3] or lse.dtype != q.dtype:
        raise InvalidArgument(f"posenc::relpos_attention_cpu_backward: lse must be (B, H, Tq) = {tuple(q.shape[:3])} "
                              f"of q's dtype, got {tuple(lse.shape)} {lse.dtype}")
    q, k, v, tables = _inputs(q, k, v, *tables)
    grad_out = _last_contiguous(grad_out)
    dq, dk, dv = _dense_like(q), _dense_like(k), _dense_like(v)
    batch, heads, num_queries = q.shape[:3]
    slices = batch * heads
    threads = _threads(slices, slices * num_queries * k.shape[2])
    grads = q.new_zeros(threads, max(_table_entries(tables), 1))
    common = _common(q, k, v, tables, offset, causal, scale)
    strides = _strides(q, k, v, out, grad_out, dq, dk, dv)
    tail = (_ptr(out), _ptr(lse), _ptr(grad_out), _ptr(dq), _ptr(dk), _ptr(dv))
    _run(lib.posenc_relpos_backward, lambda part: common + tail + (_ptr(grads[part]), strides), threads, slices)
    return dq, dk, dv, grads.sum(0) if threads > 1 else grads[0]


def _backward_fake(grad_out, q, k, v, out, lse, *tables_and_options):
    q, k, v, tables = _inputs(q, k, v, *tables_and_options[:_NUM_TABLES])  # the layouts _backward's follow
    return _dense_like(q), _dense_like(k), _dense_like(v), q.new_empty(max(_table_entries(tables), 1))


#: The operators' optional tables, in their order.
TABLE_NAMES = ("key_table", "query_bias", "key_bias", "value_table", "bias_table", "gate_hi", "gate_lo", "x_table",
               "x_den", "bends", "slopes", "intercepts")
_NUM_TABLES = len(TABLE_NAMES)
#: The order of the tables' gradients in the backward's flat vector (the kernel's layout: hi's,
#: (B, H, Tk), last; lo and the bends carry none).
_GRAD_ORDER = tuple(TABLE_NAMES.index(n) for n in ("key_table", "query_bias", "key_bias", "value_table", "bias_table",
                                                   "x_table", "x_den", "slopes", "intercepts", "gate_hi"))


def _table_entries(tables) -> int:
    """The gradient vector's length: every present table's entries, lo's and the bends' excepted."""
    return sum(tables[i].numel() for i in _GRAD_ORDER if tables[i] is not None)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, *tables = inputs[:3 + _NUM_TABLES]
    ctx.save_for_backward(q, k, v, output[0], output[1], *tables)
    ctx.options = tuple(inputs[3 + _NUM_TABLES:])


@once_differentiable
def _autograd_backward(ctx, grad_out, grad_lse):
    """The kernel's backward (no derivative of its own: a second derivative raises)."""
    q, k, v, out, lse, *tables = ctx.saved_tensors
    dq, dk, dv, flat = torch.ops.posenc.relpos_attention_cpu_backward(grad_out, q, k, v, out, lse, *tables,
                                                                      *ctx.options)
    table_grads, start = [None] * _NUM_TABLES, 0
    for index in _GRAD_ORDER:
        t = tables[index]
        if t is not None:
            table_grads[index] = flat[start:start + t.numel()].view(t.shape)
            start += t.numel()
    return (dq, dk, dv, *table_grads, None, None, None)


_TABLES = ", ".join(f"Tensor? {name}" for name in TABLE_NAMES)
_OPTIONS = "int offset, bool causal, float scale"
OP = _build.define_op(f"relpos_attention_cpu(Tensor q, Tensor k, Tensor v, {_TABLES}, {_OPTIONS}) -> (Tensor, Tensor)",
                      _forward, _forward_fake)
BACKWARD_OP = _build.define_op(f"relpos_attention_cpu_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, "
                               f"Tensor lse, {_TABLES}, {_OPTIONS}) -> (Tensor, Tensor, Tensor, Tensor)",
                               _backward, _backward_fake)
_build.register_autograd(OP, _autograd_backward, _setup_context)


def attention(q: Tensor, k: Tensor, v: Tensor, *, key_table: Tensor | None = None, query_bias: Tensor | None = None,
              key_bias: Tensor | None = None, value_table: Tensor | None = None, bias_table: Tensor | None = None,
              gate_hi: Tensor | None = None, gate_lo: Tensor | None = None, x_table: Tensor | None = None,
              x_den: Tensor | None = None, bends: Tensor | None = None, slopes: Tensor | None = None,
              intercepts: Tensor | None = None, offset: int, causal: bool, scale: float) -> Tensor:
    """softmax(scale (q_i.k_j + (q_i + a).E[r] + u.k_j) + B[h, r] + (c_i' - c_j) + f_h(N[r] / den_i))
    @ (v_j + F[r]) with autograd, r = r(i, j) = clamp(j - i + offset, 0, R - 1), c = hi + lo (the
    formula: the module docstring).

    q (B, H, Tq, D); k, v (B, H, Tk, D); key_table E (R, D) shared by the heads or (H, R, D);
    query_bias a and key_bias u (H, D); value_table F (R, D); bias_table B (H, R) (a score bias
    per head and table row: T5's, Kerple's, ALiBi's as a function of the distance); gate_hi and
    gate_lo (B, H, Tk) (FoX's cumulative log gates in two parts; the query's own key
    i' = i + Tk - Tq; lo gets no gradient); the piecewise-linear term (FIRE's): x_table N (R,),
    x_den (Tq,) > 0, bends (S - 1,) sorted ascending, slopes and intercepts (H, S), f_h(x) =
    slopes[h, s] x + intercepts[h, s] with s the number of bends <= x (the bends get no
    gradient; all five or none); each may be None (no term). All of one dtype,
    float32 or float64, on the CPU (:func:`usable` says so); the last dimensions of q, k, v
    contiguous or copied. ``causal``: query i sees the keys j <= i + Tk - Tq (queries at the
    end of the keys); a row without keys gets zeros. Returns (B, H, Tq, D) in that dtype, its
    memory in the order of q's (a transposed view of (B, Tq, H, D) for the LM's q). The caller
    checks shapes (the kernel trusts them: the tables of one R) and that the kernel is built.
    The work is the operator ``torch.ops.posenc.relpos_attention_cpu``; its gradient, once
    differentiable (a second derivative raises ``RuntimeError``),
    ``torch.ops.posenc.relpos_attention_cpu_backward``.
    """
    return torch.ops.posenc.relpos_attention_cpu(q, k, v, key_table, query_bias, key_bias, value_table, bias_table,
                                                 gate_hi, gate_lo, x_table, x_den, bends, slopes, intercepts,
                                                 int(offset), bool(causal), float(scale))[0]


def bias_arguments(bias: FusedBias, *, q_start: int, k_start: int, num_queries: int, num_keys: int) -> dict | None:
    """The kernel's arguments for a score bias stated as a :class:`~posenc.kernels.fused_bias.FusedBias`
    on consecutive positions (query i at ``q_start + i``, key j at ``k_start + j``): ``bias_table``
    and ``offset``, or ``gate_hi`` and ``gate_lo``, or the piecewise term's five tensors; None for a
    form the kernel has no term for.

    - ``buckets`` (T5): B[h, r] = W[bucket_map[r], h] over the 2R + 1 clipped distances
      k_pos - q_pos in [-R, R], r = clamp(j - i + k_start - q_start + R, 0, 2R): the kernel's clip
      is the buckets' own (constant beyond R).
    - ``linear``, ``kerple_log``, ``kerple_power`` (ALiBi, Kerple): the bias of every distance
      d = q_pos - k_pos the call has, Tq + Tk - 1 of them, r = j - i + Tq - 1 (no clipping), by
      the formulas of :mod:`posenc.kernels.fused_bias` (those of the encodings' ``bias``).
    - ``gate`` (FoX): its (hi, lo), lo zeros where absent.
    - ``log_distance_mlp`` (FIRE): x = psi(d) / (psi(max(i, L)) + eps) with psi(z) = log(|c z| + 1)
      over the call's Tq + Tk - 1 distances (x_table) and query positions i (x_den), and the MLP
      f = w2 relu(w1 x + b1) + b2 as the piecewise-linear function it is: the bends -b1_u / w1_u
      sorted, and per segment the units on there (read at a point inside it, in float64, without
      autograd), slopes (on * w1) @ w2^T and intercepts (on * b1) @ w2^T + b2 made by torch
      operations, so that autograd carries the kernel's per-segment gradients to w1, b1, w2 and
      b2 (relu' = 0 exactly at a bend, as torch's, up to which side of the bend a rounded x
      falls). None where a psi or a normalizer is not finite or den <= 0 (c = eps = 0).

    Torch operations on the encoding's parameters: autograd carries the table's gradient (the
    kernel's, per row) back to them. The table is (H, R), float32 for float32 parameters."""
    tensors = bias.tensors
    if bias.form == "gate":
        hi, lo = tensors["hi"], tensors["lo"]
        return {"gate_hi": hi, "gate_lo": lo if lo is not None else torch.zeros_like(hi), "offset": 0}
    if bias.form == "buckets":
        table = tensors["weight"][tensors["bucket_map"]].transpose(0, 1)  # (H, 2R + 1)
        return {"bias_table": table, "offset": k_start - q_start + bias.radius}
    first = next(iter(tensors.values()))
    row = torch.arange(num_queries + num_keys - 1, device=first.device)
    d = (q_start - k_start + num_queries - 1 - row).to(first.dtype)
    if bias.form == "log_distance_mlp":
        return _piecewise_arguments(tensors, d, q_start, num_queries, bias.eps)
    distance_form = _DISTANCE_FORMS.get(bias.form)
    if distance_form is None:
        return None
    return {"bias_table": distance_form(tensors, d, bias.symmetric), "offset": num_queries - 1}


def _piecewise_arguments(tensors: dict, d: Tensor, q_start: int, num_queries: int, eps: float) -> dict | None:
    """FIRE's ``log_distance_mlp`` as the kernel's piecewise term (:func:`bias_arguments`)."""
    c, threshold = tensors["c"], tensors["threshold"]
    w1, b1, w2, b2 = tensors["w1"], tensors["b1"], tensors["w2"], tensors["b2"]
    x_table = torch.log((c * d).abs() + 1.0)
    i = torch.arange(q_start, q_start + num_queries, device=d.device).to(d.dtype)
    x_den = torch.log((c * torch.maximum(i, threshold)).abs() + 1.0) + eps
    with torch.no_grad():
        if not (bool(torch.isfinite(x_table).all()) and bool(torch.isfinite(x_den).all()) and bool((x_den > 0).all())):
            return None
    bends, on, rising = relu_pieces(w1, b1)
    on = on.to(w1.dtype)  # (S, U)
    slopes = (on * w1) @ w2.t()  # (S, H)
    intercepts = (on * b1) @ w2.t() + b2
    return {"x_table": x_table, "x_den": x_den, "bends": _kernel_bends(bends, rising, w1.dtype), "slopes": slopes.t(),
            "intercepts": intercepts.t(), "offset": num_queries - 1}


def _kernel_bends(bends: Tensor, rising: Tensor, dtype: torch.dtype) -> Tensor:
    """The bends in the kernel's dtype, where x < bends[s] puts x in segment s or below: a rising
    unit's bend one ulp up, so that an x equal to it (as rounded) falls below it, where the unit
    is off, as torch's relu'(0) = 0 has it (seen: one of 8.4 million entries at T = 4096 hit a
    bend exactly, and took the other slope); kept non-decreasing."""
    rounded = bends.to(dtype)
    nudged = torch.where(rising, torch.nextafter(rounded, torch.full_like(rounded, math.inf)), rounded)
    return torch.cummax(nudged, 0).values if nudged.numel() else nudged


#: The forms that are functions of d = q_pos - k_pos alone, as (tensors, d, symmetric) -> (H, len(d)):
#: the formulas of :mod:`posenc.kernels.fused_bias` (those of ALiBi's and Kerple's ``bias``).
_DISTANCE_FORMS = {
    "linear": lambda t, d, symmetric: -t["slopes"][:, None] * (d.abs() if symmetric else d),
    "kerple_log": lambda t, d, symmetric: -t["p"][:, None] * torch.log1p(t["a"][:, None] * d.abs()),
    "kerple_power": lambda t, d, symmetric: -t["a"][:, None] * d.abs().pow(t["p"][:, None]),
}
