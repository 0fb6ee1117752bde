"""Attention with a learned position bias inside one fused kernel, forward and backward (Triton).

FlashAttention-2's tiling (Dao 2023, "FlashAttention-2", Algorithms 1 and 2): a program holds
one block of queries, walks the blocks of keys with the online softmax and never writes the
(Tq, Tk) scores; the backward recomputes them from the saved log-sum-exp. The bias of each tile
is computed in registers from its positions and a few numbers per head, so that no (Tq, Tk)
tensor exists, forward or backward:

the forms of :mod:`posenc.kernels.fused_bias` (its table: ALiBi's ``linear``, Kerple's
``kerple_log`` / ``kerple_power``, T5's ``buckets``, FoX's ``gate``, FIRE's ``log_distance_mlp``),
each a few tensors with gradients.

The bucket map (int32, 2R + 1 entries, bucket(k_pos - q_pos) for k_pos - q_pos in [-R, R]) is
computed by the encoding's own torch function, so the kernel never re-derives T5's
logarithmic buckets in float32; T5's buckets are constant beyond ``max_distance`` = R, so the
clamp is exact.

The backward runs two kernels, each owning what it writes, so no two programs add into one
address: one per block of keys (and key/value head, looping over the query heads of its group)
writes dK, dV and the gate's column sums; one per block of queries (and query head) writes dQ,
the gate's row sums and its partial sums of the bias parameters' gradient (per head: 1 or 2
numbers; per bucket for T5), which torch sums afterwards (a tiny reduction over the query
blocks and the batch). This is what FlexAttention does not do: it adds a captured parameter's
gradient from every score into the same few addresses with atomics (586x bias-free SDPA for
T5's backward on an H100, docs/results.md "On a GPU").

Conventions are posenc's: the bias is added after the 1/sqrt(D) scale (``scale``); causal means
bottom-right (key j is visible to query row r iff j <= r + Tk - Tq); grouped-query heads (query
head h reads key/value head h // (H / H_kv)); document masks of packed rows by document ids;
positions are explicit integers, (T,) shared or
(B, T) per row. Scores, the softmax and every gradient are accumulated in float32; the
probabilities are cast to v's dtype for the P V product, and dS to q's and k's for theirs, as
FlashAttention does. Float32 inputs use IEEE float32 products (no TF32).

Under Triton's interpreter (``TRITON_INTERPRET=1`` set before this module is imported) the
kernels run on CPU tensors: tests/test_bias_attention_triton.py.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from posenc.errors import InvalidArgument

#: The forms of :class:`posenc.kernels.fused_bias.FusedBias` by name, as the kernels' ``KIND``
#: constant (tests/test_bias_attention_triton.py checks that the two name the same forms).
KINDS = {"none": 0, "linear": 1, "kerple_log": 2, "kerple_power": 3, "buckets": 4, "gate": 5, "log_distance_mlp": 6}

#: At most this many buckets (one partial sum each per program in the backward).
MAX_BUCKETS = 128


def _interpreted() -> bool:
    return not isinstance(_forward_kernel, triton.runtime.JITFunction)


@triton.jit
def _power(dist, p):
    """|d|^p (0 at d = 0) as exp2(p log2 |d|) in float32: 4.8e-7 relative against torch.pow's 5e-8
    (|d| < 30, p = 1.87); float64 here would cost a float64 log and exp per score on GPUs with
    slow float64; the tests see no difference."""
    return tl.where(dist > 0, tl.exp2(p * tl.log2(tl.maximum(dist, 1.0))), 0.0)


@triton.jit
def _fire_input(qp, d, c, threshold, eps):
    """FIRE's x = psi(d) / (psi(max(i, L)) + eps), psi(z) = log(|c z| + 1); and its numerator
    and denominator, for the gradients."""
    numerator = tl.log(tl.abs(c * d) + 1.0)
    denominator = tl.log(tl.abs(c * tl.maximum(qp.to(tl.float32), threshold)) + 1.0) + eps
    return numerator / denominator[:, None], numerator, denominator


@triton.jit
def _bias_tile(KIND: tl.constexpr, SYMMETRIC: tl.constexpr, h, qp, kp, q_key, k_key,
               pa_ptr, pb_ptr, map_ptr, radius, table_ptr, table_stride, hi_ptr, lo_ptr, HAS_LO: tl.constexpr,
               units, num_heads, eps):
    """The bias of one tile (BM, BN), float32; and |d| (float32) for the parameter gradients."""
    d = (qp[:, None] - kp[None, :]).to(tl.float32)
    dist = tl.abs(d)
    if KIND == 1:
        m = tl.load(pa_ptr + h)
        bias = -m * (dist if SYMMETRIC else d)
    elif KIND == 2:
        p = tl.load(pa_ptr + h)
        a = tl.load(pb_ptr + h)
        bias = -p * tl.log(1.0 + a * dist)
    elif KIND == 3:
        p = tl.load(pa_ptr + h)
        a = tl.load(pb_ptr + h)
        bias = -a * _power(dist, p)
    elif KIND == 4:
        rel = tl.minimum(tl.maximum(kp[None, :] - qp[:, None], -radius), radius) + radius
        bucket = tl.load(map_ptr + rel)
        bias = tl.load(table_ptr + bucket * table_stride + h)
    elif KIND == 5:
        bias = tl.load(hi_ptr + q_key)[:, None] - tl.load(hi_ptr + k_key)[None, :]
        if HAS_LO:
            bias += tl.load(lo_ptr + q_key)[:, None] - tl.load(lo_ptr + k_key)[None, :]
    elif KIND == 6:
        # packed: w1 (U), b1 (U), b2 (H), c, L; w2 (H, U) in the table
        c = tl.load(pa_ptr + 2 * units + num_heads)
        threshold = tl.load(pa_ptr + 2 * units + num_heads + 1)
        x, _, _ = _fire_input(qp, d, c, threshold, eps)
        bias = d * 0.0 + tl.load(pa_ptr + 2 * units + h)
        for u in range(units):
            hidden = tl.maximum(tl.load(pa_ptr + u) * x + tl.load(pa_ptr + units + u), 0.0)
            bias += tl.load(table_ptr + h * table_stride + u) * hidden
    else:
        bias = tl.zeros_like(d)
    return bias, dist


@triton.jit
def _fire_partials(ds, qp, d, h, pa_ptr, table_ptr, table_stride, units, num_heads, eps, entries):
    """This tile's sums of dS times the derivative of FIRE's bias by each parameter, at the
    entries [w1 (U), b1 (U), w2[h] (U), b2[h], c, L] of the program's partial vector."""
    c = tl.load(pa_ptr + 2 * units + num_heads)
    threshold = tl.load(pa_ptr + 2 * units + num_heads + 1)
    x, numerator, denominator = _fire_input(qp, d, c, threshold, eps)
    partial = tl.where(entries == 3 * units, tl.sum(tl.sum(ds, 1), 0), 0.0)
    grad_x = ds * 0.0
    for u in range(units):
        w1 = tl.load(pa_ptr + u)
        w2 = tl.load(table_ptr + h * table_stride + u)
        pre = w1 * x + tl.load(pa_ptr + units + u)
        on = pre > 0
        grad_pre = tl.where(on, ds * w2, 0.0)
        grad_x += grad_pre * w1
        partial += tl.where(entries == u, tl.sum(tl.sum(grad_pre * x, 1), 0), 0.0)
        partial += tl.where(entries == units + u, tl.sum(tl.sum(grad_pre, 1), 0), 0.0)
        partial += tl.where(entries == 2 * units + u, tl.sum(tl.sum(tl.where(on, ds * pre, 0.0), 1), 0), 0.0)
    # x = N / D: dN/dc = sign(c d) d / (|c d| + 1); dD/dc = sign(c m) m / (|c m| + 1), m = max(i, L);
    # dD/dL = sign(c m) c / (|c m| + 1) where L > i (half at a tie, as torch.maximum)
    m = tl.maximum(qp.to(tl.float32), threshold)
    cd = c * d
    cm = c * m
    sign_cd = tl.where(cd > 0, 1.0, tl.where(cd < 0, -1.0, 0.0))
    sign_cm = tl.where(cm > 0, 1.0, tl.where(cm < 0, -1.0, 0.0))
    dn_dc = sign_cd * d / (tl.abs(cd) + 1.0)
    dd_dc = sign_cm * m / (tl.abs(cm) + 1.0)
    takes_l = tl.where(threshold > qp.to(tl.float32), 1.0, tl.where(threshold == qp.to(tl.float32), 0.5, 0.0))
    dd_dl = sign_cm * c / (tl.abs(cm) + 1.0) * takes_l
    dx_dc = dn_dc / denominator[:, None] - numerator * (dd_dc / (denominator * denominator))[:, None]
    dx_dl = -numerator * (dd_dl / (denominator * denominator))[:, None]
    partial += tl.where(entries == 3 * units + 1, tl.sum(tl.sum(grad_x * dx_dc, 1), 0), 0.0)
    partial += tl.where(entries == 3 * units + 2, tl.sum(tl.sum(grad_x * dx_dl, 1), 0), 0.0)
    return partial


@triton.jit
def _load_queries(Q, QP, QS, b, h, offs_m, offs_d, sqb, sqh, sqm, sqd, sqpb, sqsb, num_queries, num_keys,
                  head_dim, HAS_SEG: tl.constexpr):
    """One block of queries of head h: q (BM, BD), their positions, document ids and own key
    indices (query row r is key r + Tk - Tq, clamped into range for the rows past the end)."""
    row_ok = offs_m < num_queries
    d_ok = offs_d < head_dim
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    qp = tl.load(QP + b * sqpb + offs_m, mask=row_ok, other=0)
    qs = tl.load(QS + b * sqsb + offs_m, mask=row_ok & HAS_SEG, other=0)
    return q, qp, qs, tl.minimum(tl.maximum(offs_m + (num_keys - num_queries), 0), num_keys - 1)


@triton.jit
def _load_row_grads(DO, LSE, DELTA, b, h, row, offs_m, offs_d, sdob, sdoh, sdom, sdod, num_queries, head_dim):
    """The backward's per-row inputs of one query block: dO (BM, BD), the log-sum-exp and
    delta = rowsum(dO * O) (``row``: the (batch, head) row of LSE and DELTA)."""
    row_ok = offs_m < num_queries
    do = tl.load(DO + b * sdob + h * sdoh + offs_m[:, None] * sdom + offs_d[None, :] * sdod,
                 mask=(row_ok[:, None]) & (offs_d < head_dim)[None, :], other=0.0)
    lse = tl.load(LSE + row * num_queries + offs_m, mask=row_ok, other=float("-inf"))
    delta = tl.load(DELTA + row * num_queries + offs_m, mask=row_ok, other=0.0)
    return do, lse, delta


@triton.jit
def _load_keys(K, V, KP, KS, b, hk, offs_n, offs_d, skb, skh, skn, skd, svb, svh, svn, svd, skpb, sksb, num_keys,
               head_dim, HAS_SEG: tl.constexpr):
    """One block of keys: k, v (BN, BD), their positions, document ids and key indices (clamped
    into range: rows past the end are masked, their loads stay in bounds)."""
    col_ok = offs_n < num_keys
    d_ok = offs_d < head_dim
    k = tl.load(K + b * skb + hk * skh + offs_n[:, None] * skn + offs_d[None, :] * skd,
                mask=col_ok[:, None] & d_ok[None, :], other=0.0)
    v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svn + offs_d[None, :] * svd,
                mask=col_ok[:, None] & d_ok[None, :], other=0.0)
    kp = tl.load(KP + b * skpb + offs_n, mask=col_ok, other=0)
    ks = tl.load(KS + b * sksb + offs_n, mask=col_ok & HAS_SEG, other=0)
    return k, v, kp, ks, tl.minimum(offs_n, num_keys - 1)


@triton.jit
def _dot(a, b, WIDEN: tl.constexpr):
    """a @ b accumulated in float32. ``WIDEN``: the operands widened to float32 first (Triton's
    interpreter multiplies bfloat16 operands wrongly; on a GPU they go to the tensor cores)."""
    if WIDEN:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _visible(offs_m, offs_n, num_queries, num_keys, qs, ks, CAUSAL: tl.constexpr, HAS_SEG: tl.constexpr):
    ok = (offs_m < num_queries)[:, None] & (offs_n < num_keys)[None, :]
    if CAUSAL:
        ok = ok & (offs_n[None, :] <= offs_m[:, None] + (num_keys - num_queries))
    if HAS_SEG:
        ok = ok & (qs[:, None] == ks[None, :])
    return ok


@triton.jit
def _forward_kernel(
    Q, K, V, O, LSE, QP, KP, QS, KS, PA, PB, MAP, TABLE, HI, LO,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
    sqpb, skpb, sqsb, sksb, table_stride, gate_b, gate_h,
    num_heads, groups, num_queries, num_keys, head_dim, scale, radius, units, eps,
    KIND: tl.constexpr, SYMMETRIC: tl.constexpr, HAS_LO: tl.constexpr, CAUSAL: tl.constexpr, HAS_SEG: tl.constexpr,
    WIDEN: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    hk = h // groups
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    row_ok = offs_m < num_queries
    d_ok = offs_d < head_dim
    q, qp, qs, q_key = _load_queries(Q, QP, QS, b, h, offs_m, offs_d, sqb, sqh, sqm, sqd, sqpb, sqsb, num_queries,
                                     num_keys, head_dim, HAS_SEG)
    offset = num_keys - num_queries
    gate = b * gate_b + h * gate_h
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BD], tl.float32)
    end = num_keys
    if CAUSAL:
        end = tl.minimum(num_keys, (pid_m + 1) * BM + offset)
    for start_n in range(0, end, BN):
        offs_n = start_n + tl.arange(0, BN)
        k, v, kp, ks, k_key = _load_keys(K, V, KP, KS, b, hk, offs_n, offs_d, skb, skh, skn, skd, svb, svh, svn, svd,
                                         skpb, sksb, num_keys, head_dim, HAS_SEG)
        bias, _ = _bias_tile(KIND, SYMMETRIC, h, qp, kp, q_key, k_key, PA, PB, MAP, radius, TABLE, table_stride,
                             HI + gate, LO + gate, HAS_LO, units, num_heads, eps)
        s = _dot(q, tl.trans(k), WIDEN) * scale + bias
        s = tl.where(_visible(offs_m, offs_n, num_queries, num_keys, qs, ks, CAUSAL, HAS_SEG), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, WIDEN)
        m_i = m_new
    has_key = l_i > 0
    out = acc / tl.where(has_key, l_i, 1.0)[:, None]
    lse = tl.where(has_key, m_i + tl.log(tl.where(has_key, l_i, 1.0)), float("-inf"))
    tl.store(O + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod, out.to(O.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])
    tl.store(LSE + pid_bh * num_queries + offs_m, lse, mask=row_ok)


@triton.jit
def _probabilities(q, k, bias, lse, offs_m, offs_n, num_queries, num_keys, qs, ks, scale, CAUSAL: tl.constexpr,
                   HAS_SEG: tl.constexpr, WIDEN: tl.constexpr):
    s = _dot(q, tl.trans(k), WIDEN) * scale + bias
    ok = _visible(offs_m, offs_n, num_queries, num_keys, qs, ks, CAUSAL, HAS_SEG) & (lse > float("-inf"))[:, None]
    # masked entries exponentiate -inf: no overflow computed and then discarded
    return tl.exp(tl.where(ok, s - lse[:, None], float("-inf")))


@triton.jit
def _delta_kernel(O, DO, DELTA, sob, soh, som, sod, sdob, sdoh, sdom, sdod, num_heads, num_queries, head_dim,
                  BM: tl.constexpr, BD: tl.constexpr):
    """delta_i = sum_d dO_id O_id, the softmax backward's row term, summed in float64: it is
    subtracted from every dP_ij of the row, so its float32 summation error (the terms of
    both signs cancel) would reach each bias parameter's gradient times the bias's derivative,
    e.g. Kerple's |d|^p in the hundreds (a gradient 9x eager's float32 error, measured)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    ok = (offs_m < num_queries)[:, None] & (offs_d < head_dim)[None, :]
    o = tl.load(O + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod, mask=ok, other=0.0)
    do = tl.load(DO + b * sdob + h * sdoh + offs_m[:, None] * sdom + offs_d[None, :] * sdod, mask=ok, other=0.0)
    delta = tl.sum(o.to(tl.float64) * do.to(tl.float64), 1)
    tl.store(DELTA + pid_bh * num_queries + offs_m, delta.to(tl.float32), mask=offs_m < num_queries)


@triton.jit
def _key_block_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DCOL, QP, KP, QS, KS, PA, PB, MAP, TABLE, HI, LO,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdob, sdoh, sdom, sdod,
    sdkb, sdkh, sdkn, sdkd, sdvb, sdvh, sdvn, sdvd,
    sqpb, skpb, sqsb, sksb, table_stride, gate_b, gate_h,
    num_heads, num_kv_heads, groups, num_queries, num_keys, head_dim, scale, radius, units, eps,
    KIND: tl.constexpr, SYMMETRIC: tl.constexpr, HAS_LO: tl.constexpr, CAUSAL: tl.constexpr, HAS_SEG: tl.constexpr,
    WIDEN: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
):
    """dK and dV of one block of keys (and the gate's column sums), over every query head of
    its key/value head and every query block that sees it."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_kv_heads
    hk = pid_bh % num_kv_heads
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    col_ok = offs_n < num_keys
    d_ok = offs_d < head_dim
    k, v, kp, ks, k_key = _load_keys(K, V, KP, KS, b, hk, offs_n, offs_d, skb, skh, skn, skd, svb, svh, svn, svd,
                                     skpb, sksb, num_keys, head_dim, HAS_SEG)
    offset = num_keys - num_queries
    dk = tl.zeros([BN, BD], tl.float32)
    dv = tl.zeros([BN, BD], tl.float32)
    start = 0
    if CAUSAL:
        start = tl.maximum(pid_n * BN - offset, 0) // BM * BM
    for g in range(groups):
        h = hk * groups + g
        gate = b * gate_b + h * gate_h
        dcol = tl.zeros([BN], tl.float32)
        for start_m in range(start, num_queries, BM):
            offs_m = start_m + tl.arange(0, BM)
            q, qp, qs, q_key = _load_queries(Q, QP, QS, b, h, offs_m, offs_d, sqb, sqh, sqm, sqd, sqpb, sqsb,
                                             num_queries, num_keys, head_dim, HAS_SEG)
            do, lse, delta = _load_row_grads(DO, LSE, DELTA, b, h, b * num_heads + h, offs_m, offs_d, sdob, sdoh,
                                             sdom, sdod, num_queries, head_dim)
            bias, _ = _bias_tile(KIND, SYMMETRIC, h, qp, kp, q_key, k_key, PA, PB, MAP, radius, TABLE, table_stride,
                                 HI + gate, LO + gate, HAS_LO, units, num_heads, eps)
            p = _probabilities(q, k, bias, lse, offs_m, offs_n, num_queries, num_keys, qs, ks, scale, CAUSAL, HAS_SEG,
                          WIDEN)
            dv += _dot(tl.trans(p).to(do.dtype), do, WIDEN)
            dp = _dot(do, tl.trans(v), WIDEN)
            ds = p * (dp - delta[:, None])
            dk += _dot(tl.trans(ds).to(q.dtype), q, WIDEN)
            if KIND == 5:
                dcol -= tl.sum(ds, 0)
        if KIND == 5:
            tl.store(DCOL + (b * num_heads + h) * num_keys + offs_n, dcol, mask=col_ok)
    tl.store(DK + b * sdkb + hk * sdkh + offs_n[:, None] * sdkn + offs_d[None, :] * sdkd,
             (dk * scale).to(DK.dtype.element_ty), mask=col_ok[:, None] & d_ok[None, :])
    tl.store(DV + b * sdvb + hk * sdvh + offs_n[:, None] * sdvn + offs_d[None, :] * sdvd,
             dv.to(DV.dtype.element_ty), mask=col_ok[:, None] & d_ok[None, :])


@triton.jit
def _query_block_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, DROW, PARTIAL, QP, KP, QS, KS, PA, PB, MAP, TABLE, HI, LO,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdob, sdoh, sdom, sdod,
    sdqb, sdqh, sdqm, sdqd,
    sqpb, skpb, sqsb, sksb, table_stride, gate_b, gate_h,
    num_heads, groups, num_queries, num_keys, head_dim, scale, radius, units, eps, num_entries,
    KIND: tl.constexpr, SYMMETRIC: tl.constexpr, HAS_LO: tl.constexpr, CAUSAL: tl.constexpr, HAS_SEG: tl.constexpr,
    WIDEN: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BE: tl.constexpr,
):
    """dQ of one block of queries, the gate's row sums, and this program's partial sums of the
    bias parameters' gradients: PARTIAL[(b, h), block, entry]."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    hk = h // groups
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    row_ok = offs_m < num_queries
    d_ok = offs_d < head_dim
    q, qp, qs, q_key = _load_queries(Q, QP, QS, b, h, offs_m, offs_d, sqb, sqh, sqm, sqd, sqpb, sqsb, num_queries,
                                     num_keys, head_dim, HAS_SEG)
    do, lse, delta = _load_row_grads(DO, LSE, DELTA, b, h, pid_bh, offs_m, offs_d, sdob, sdoh, sdom, sdod,
                                     num_queries, head_dim)
    offset = num_keys - num_queries
    gate = b * gate_b + h * gate_h
    dq = tl.zeros([BM, BD], tl.float32)
    drow = tl.zeros([BM], tl.float32)
    entries = tl.arange(0, BE)
    partial = tl.zeros([BE], tl.float32)
    end = num_keys
    if CAUSAL:
        end = tl.minimum(num_keys, (pid_m + 1) * BM + offset)
    for start_n in range(0, end, BN):
        offs_n = start_n + tl.arange(0, BN)
        k, v, kp, ks, k_key = _load_keys(K, V, KP, KS, b, hk, offs_n, offs_d, skb, skh, skn, skd, svb, svh, svn, svd,
                                         skpb, sksb, num_keys, head_dim, HAS_SEG)
        bias, dist = _bias_tile(KIND, SYMMETRIC, h, qp, kp, q_key, k_key, PA, PB, MAP, radius, TABLE, table_stride,
                                HI + gate, LO + gate, HAS_LO, units, num_heads, eps)
        p = _probabilities(q, k, bias, lse, offs_m, offs_n, num_queries, num_keys, qs, ks, scale, CAUSAL, HAS_SEG,
                          WIDEN)
        dp = _dot(do, tl.trans(v), WIDEN)
        ds = p * (dp - delta[:, None])
        dq += _dot(ds.to(k.dtype), k, WIDEN)
        if KIND == 1:
            d = (qp[:, None] - kp[None, :]).to(tl.float32)
            partial += tl.where(entries == 0, tl.sum(tl.sum(-ds * (dist if SYMMETRIC else d), 1), 0), 0.0)
        elif KIND == 2:
            p_h = tl.load(PA + h)
            a_h = tl.load(PB + h)
            g_p = tl.sum(tl.sum(-ds * tl.log(1.0 + a_h * dist), 1), 0)
            g_a = tl.sum(tl.sum(-ds * p_h * dist / (1.0 + a_h * dist), 1), 0)
            partial += tl.where(entries == 0, g_p, tl.where(entries == 1, g_a, 0.0))
        elif KIND == 3:
            p_h = tl.load(PA + h)
            a_h = tl.load(PB + h)
            log_dist = tl.log(tl.maximum(dist, 1.0))
            power = _power(dist, p_h)
            g_p = tl.sum(tl.sum(-ds * a_h * power * log_dist, 1), 0)
            g_a = tl.sum(tl.sum(-ds * power, 1), 0)
            partial += tl.where(entries == 0, g_p, tl.where(entries == 1, g_a, 0.0))
        elif KIND == 4:
            rel = tl.minimum(tl.maximum(kp[None, :] - qp[:, None], -radius), radius) + radius
            bucket = tl.load(MAP + rel)
            for e in range(num_entries):
                partial += tl.where(entries == e, tl.sum(tl.sum(tl.where(bucket == e, ds, 0.0), 1), 0), 0.0)
        elif KIND == 5:
            drow += tl.sum(ds, 1)
        elif KIND == 6:
            partial += _fire_partials(ds, qp, (qp[:, None] - kp[None, :]).to(tl.float32), h, PA, TABLE, table_stride, units, num_heads, eps, entries)
    tl.store(DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqm + offs_d[None, :] * sdqd,
             (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    if KIND == 5:
        tl.store(DROW + pid_bh * num_queries + offs_m, drow, mask=row_ok)
    if KIND >= 1 and KIND <= 4 or KIND == 6:
        tl.store(PARTIAL + (pid_bh * tl.num_programs(0) + pid_m) * BE + entries, partial, mask=entries < num_entries)


def _pow2(n: int) -> int:
    return max(16, 1 << max(n - 1, 0).bit_length())


def _blocks(head_dim: int) -> tuple[int, int]:
    """(BM, BN): 16 under the interpreter (small tiles, fast tests); 64 on a GPU for D <= 64,
    else 32 (registers). Not tuned on a GPU yet."""
    if _interpreted():
        return 16, 16
    return (64, 64) if head_dim <= 64 else (32, 32)


def _positions_2d(positions: Tensor, batch: int) -> tuple[Tensor, int]:
    """(positions as int32 (B or 1, T), its batch stride: 0 when shared)."""
    positions = positions.to(torch.int32)
    if positions.dim() == 1:
        return positions.unsqueeze(0).contiguous(), 0
    return positions.contiguous(), positions.shape[-1]


class _Form(NamedTuple):
    """The fields of a FusedBias the kernels read (the attention layer does not import kernels/)."""

    form: str
    tensors: dict
    symmetric: bool
    radius: int
    eps: float


class _Launch:
    """The shared arguments of the three kernels for one call."""

    def __init__(self, q, k, v, bias, q_positions, k_positions, causal: bool, scale: float,
                 document_ids: tuple[Tensor, Tensor] | None = None):
        self.batch, self.heads, self.num_queries, self.head_dim = q.shape
        self.kv_heads, self.num_keys = k.shape[1], k.shape[2]
        self.groups = self.heads // self.kv_heads
        self.causal, self.scale = causal, float(scale)
        self.qp, self.sqpb = _positions_2d(q_positions, self.batch)
        self.kp, self.skpb = _positions_2d(k_positions, self.batch)
        self.has_seg = document_ids is not None
        if self.has_seg:
            self.qs, self.sqsb = _positions_2d(document_ids[0].to(q.device), self.batch)
            self.ks, self.sksb = _positions_2d(document_ids[1].to(q.device), self.batch)
        else:
            self.qs, self.sqsb, self.ks, self.sksb = self.qp, 0, self.kp, 0
        self.bm, self.bn = _blocks(self.head_dim)
        self.widen = q.dtype == torch.bfloat16 and _interpreted()
        self.bd = _pow2(self.head_dim)
        if bias is not None and bias.form not in KINDS:
            raise InvalidArgument(f"bias: form must be one of {sorted(KINDS)}, got {bias.form!r}")
        self.form = "none" if bias is None else bias.form
        self.kind = KINDS[self.form]
        self.symmetric = bias is not None and bias.symmetric
        self.radius = 0 if bias is None else bias.radius
        empty = torch.zeros(1, dtype=torch.float32, device=q.device)
        t = {} if bias is None else bias.tensors
        self.pa = self._param(t.get("slopes", t.get("p")), empty)
        self.pb = self._param(t.get("a"), empty)
        self.table = self._param(t.get("weight", t.get("w2")), empty)
        self.table_stride = self.table.stride(0) if self.table.dim() == 2 else 0
        self.map = t["bucket_map"].to(torch.int32).contiguous() if "bucket_map" in t else empty.to(torch.int32)
        self.num_entries = {1: 1, 2: 2, 3: 2, 4: self.table.shape[0] if self.table.dim() == 2 else 0}.get(self.kind, 0)
        if self.num_entries > MAX_BUCKETS:
            raise InvalidArgument(f"bias: at most {MAX_BUCKETS} buckets in the fused kernel, got {self.num_entries}")
        self.units, self.eps = 0, 0.0 if bias is None else float(bias.eps)
        if self.kind == 6:  # FIRE: w1, b1, b2, c, L packed; w2 the table
            self.units = t["w1"].numel()
            self.pa = torch.cat([t[n].detach().reshape(-1).to(torch.float32) for n in ("w1", "b1", "b2", "c", "threshold")])
            self.table_stride = self.units
            self.num_entries = 3 * self.units + 3
            if self.num_entries > MAX_BUCKETS:
                raise InvalidArgument(f"bias: FIRE's MLP may have at most {(MAX_BUCKETS - 3) // 3} hidden units in the "
                                      f"fused kernel, got {self.units}")
        self.hi = self._param(t.get("hi"), empty)
        self.has_lo = t.get("lo") is not None
        self.lo = t["lo"].to(torch.float32).contiguous() if self.has_lo else empty
        self.gate_b = self.hi.stride(0) if self.kind == 5 else 0
        self.gate_h = self.hi.stride(1) if self.kind == 5 else 0

    @staticmethod
    def _param(x, empty):
        return empty if x is None else x.detach().to(torch.float32).contiguous()

    def common(self):
        return (self.qp, self.kp, self.qs, self.ks, self.pa, self.pb, self.map, self.table, self.hi, self.lo)

    def sizes(self):
        return (self.sqpb, self.skpb, self.sqsb, self.sksb, self.table_stride, self.gate_b, self.gate_h)

    def constants(self):
        return {"KIND": self.kind, "SYMMETRIC": self.symmetric, "HAS_LO": self.has_lo, "CAUSAL": self.causal,
                "HAS_SEG": self.has_seg, "WIDEN": self.widen, "BM": self.bm, "BN": self.bn, "BD": self.bd}


def _forward(q, k, v, launch: _Launch) -> tuple[Tensor, Tensor]:
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
    lse = torch.empty(launch.batch * launch.heads, launch.num_queries, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(launch.num_queries, launch.bm), launch.batch * launch.heads)
    _forward_kernel[grid](
        q, k, v, out, lse, *launch.common(),
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), *launch.sizes(),
        launch.heads, launch.groups, launch.num_queries, launch.num_keys, launch.head_dim, launch.scale, launch.radius,
        launch.units, launch.eps, **launch.constants(),
    )
    return out, lse


def _backward(q, k, v, out, lse, grad_out, launch: _Launch):
    grad_out = grad_out.contiguous()
    delta = torch.empty(launch.batch * launch.heads, launch.num_queries, dtype=torch.float32, device=q.device)
    _delta_kernel[(triton.cdiv(launch.num_queries, launch.bm), launch.batch * launch.heads)](
        out, grad_out, delta, *out.stride(), *grad_out.stride(), launch.heads, launch.num_queries, launch.head_dim,
        BM=launch.bm, BD=launch.bd,
    )
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    gated = launch.kind == 5
    rows = (launch.batch, launch.heads)
    dcol = torch.zeros(rows + (launch.num_keys,), dtype=torch.float32, device=q.device) if gated else lse
    drow = torch.zeros(rows + (launch.num_queries,), dtype=torch.float32, device=q.device) if gated else lse
    q_blocks = triton.cdiv(launch.num_queries, launch.bm)
    entries = _pow2(launch.num_entries) if launch.num_entries else 16
    partial = torch.zeros(launch.batch * launch.heads, q_blocks, entries, dtype=torch.float32, device=q.device)
    common, sizes, constants = launch.common(), launch.sizes(), launch.constants()
    _key_block_kernel[(triton.cdiv(launch.num_keys, launch.bn), launch.batch * launch.kv_heads)](
        q, k, v, grad_out, lse, delta, dk, dv, dcol, *common,
        *q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *dk.stride(), *dv.stride(), *sizes,
        launch.heads, launch.kv_heads, launch.groups, launch.num_queries, launch.num_keys, launch.head_dim,
        launch.scale, launch.radius, launch.units, launch.eps, **constants,
    )
    _query_block_kernel[(q_blocks, launch.batch * launch.heads)](
        q, k, v, grad_out, lse, delta, dq, drow, partial, *common,
        *q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *dq.stride(), *sizes,
        launch.heads, launch.groups, launch.num_queries, launch.num_keys, launch.head_dim, launch.scale,
        launch.radius, launch.units, launch.eps, max(launch.num_entries, 1), BE=entries, **constants,
    )
    per_head = partial.view(launch.batch, launch.heads, q_blocks, entries).sum(dim=(0, 2))  # (H, entries)
    grads = {}
    if launch.kind == 1:
        grads["slopes"] = per_head[:, 0]
    elif launch.kind in (2, 3):
        grads["p"], grads["a"] = per_head[:, 0], per_head[:, 1]
    elif launch.kind == 4:
        grads["weight"] = per_head[:, : launch.num_entries].t()
    elif launch.kind == 6:
        units = launch.units
        grads["w1"], grads["b1"] = per_head[:, :units].sum(0), per_head[:, units:2 * units].sum(0)
        grads["w2"], grads["b2"] = per_head[:, 2 * units:3 * units], per_head[:, 3 * units]
        grads["c"], grads["threshold"] = per_head[:, 3 * units + 1].sum(0), per_head[:, 3 * units + 2].sum(0)
    elif gated:
        offset = launch.num_keys - launch.num_queries
        dcol[..., offset:] += drow  # the query row r is the key r + Tk - Tq
        grads["hi"] = dcol
    return dq, dk, dv, grads


_NAMES = ("slopes", "p", "a", "weight", "bucket_map", "hi", "lo", "w1", "b1", "w2", "b2", "c", "threshold")


class _BiasAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, q_positions, k_positions, document_ids, meta, *tensors):
        bias = _Form(meta[0], {n: t for n, t in zip(_NAMES, tensors) if t is not None}, meta[1], meta[2], meta[5])
        launch = _Launch(q, k, v, bias, q_positions, k_positions, meta[3], meta[4], document_ids)
        out, lse = _forward(q, k, v, launch)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.launch = launch
        ctx.shapes = [(t.shape, t.dtype) if t is not None else None for t in tensors]
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv, grads = _backward(q, k, v, out, lse, grad_out, ctx.launch)
        extra = []
        for name, shape in zip(_NAMES, ctx.shapes):
            g = grads.get(name)
            extra.append(None if g is None or shape is None else g.reshape(shape[0]).to(shape[1]))
        return (dq, dk, dv, None, None, None, None, *extra)


def bias_attention(q: Tensor, k: Tensor, v: Tensor, bias, *, q_positions: Tensor,
                   k_positions: Tensor, causal: bool = True, scale: float | None = None,
                   document_ids: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """softmax(scale q.k^T + b + causal mask + document mask) v in one fused kernel, with
    autograd to q, k, v and the bias's tensors.

    Args:
        q: (B, H, Tq, D); k, v: (B, H_kv, Tk, D), H_kv dividing H; float32, bfloat16 or float16,
            on a CUDA device (or on the CPU under ``TRITON_INTERPRET=1``).
        bias: a :class:`posenc.kernels.fused_bias.FusedBias` (an encoding's ``fused_bias``; read
            by its fields: form, tensors, symmetric, radius, eps) or None (no bias).
        q_positions, k_positions: integer (Tq,) / (Tk,) or (B, Tq) / (B, Tk).
        causal: bottom-right causal mask.
        scale: default 1/sqrt(D).
        document_ids: (query ids, key ids), integer (T,) or (B, T) each: query i sees key j
            only when their ids are equal (packed rows, :func:`posenc.masks.document_mask_mod`);
            a query that sees no key gets zeros. None: no document mask.

    Returns:
        (B, H, Tq, D) in q's dtype.

    Raises:
        InvalidArgument: more than :data:`MAX_BUCKETS` buckets (or FIRE units past it), an
            unknown form.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    bias = bias if bias is not None else _Form("none", {}, False, 0, 0.0)
    tensors = [bias.tensors.get(n) for n in _NAMES]
    meta = (bias.form, bias.symmetric, bias.radius, causal, scale, bias.eps)
    return _BiasAttention.apply(q, k, v, q_positions, k_positions, document_ids, meta, *tensors)
