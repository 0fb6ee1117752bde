// posenc's fused CPU attention with a relative-position table (Shaw et al. 2018; Transformer-XL,
// Dai et al. 2019): scores, the relative terms, softmax, the weighted sum and the value table in
// one pass per (batch, head), and the backward in one more (probabilities recomputed from the
// saved log-sum-exp, as FlashAttention does). Every (B, H) slice of q, k, v (T x D each) and its
// (Tq, Tk) scores stay in L1/L2 while they are used, where the eager backend makes a dozen
// passes over (B, H, Tq, Tk) tensors in memory.
//
// The math, per (b, h), with z_ij the logit before the scale:
//   z_ij = q_i . k_j + (q_i + a) . E[r(i, j)] + u . k_j,      r(i, j) = clamp(j - i + offset, 0, R - 1)
//   p_ij = softmax_j(scale * z_ij)  over the visible keys (causal: j <= i + Tk - Tq; else all)
//   o_i  = sum_j p_ij (v_j + F[r(i, j)])
// E (R, D): the key table (Shaw's w^K, shared by the heads; Transformer-XL's W R_d, one per
// head), a and u (D,) per head (Transformer-XL's r_r_bias and r_w_bias; Shaw: none), F (R, D)
// the value table shared by the heads (Shaw's w^V; Transformer-XL: none). The backward returns
// dq, dk, dv and adds the gradients of E, a, u and F into one buffer per thread.
//
// Two terms added after the scale (the score biases of T5, Kerple, ALiBi and FoX, whose
// training would otherwise keep every tile of the bias's autograd):
//   scale * z_ij + B[r(i, j)] + (hi_i' - hi_j + lo_i') - lo_j,      i' = i + Tk - Tq (the query's own key)
// B (H, R): a scalar per head and table row (a bias as a function of the clipped distance);
// hi, lo (B, H, Tk): FoX's cumulative log forget gates in two float parts (the difference of
// the high parts is exact near the diagonal, and the low parts restore what one float would
// lose). Their gradients: B's per table row, hi's per key (lo carries none).
//
// And a third (FIRE's, Li et al. 2024, whose bias depends on the query's position as well as the
// distance): a piecewise-linear function of a normalized distance,
//   f_h(x_ij),   x_ij = N[r(i, j)] / den_i,   f_h(x) = slope[h, s] x + intercept[h, s],  s = #{bends <= x}
// N (R,) per table row, den (Tq,) per query row, bends (S - 1,) sorted and shared by the heads,
// slope and intercept (H, S). Each chunk of keys finds the segments its x spans (mostly one,
// the previous chunk's: x is monotone along a causal row). Gradients: slope's and intercept's
// per segment (the sums of d s and d s x), N's per table row, den's per query row.
// Compiled at first use by posenc.kernels.relpos_cpu (torch.utils.cpp_extension, -O3
// -march=native) and called through ctypes: this file includes no torch header.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

// 64-byte vectors in GCC's (and Clang's) vector extension: W = 16 floats or 8 doubles. The
// compiler lowers them to the host's registers (-march=native: one AVX-512 register, two AVX2
// ones, ...), so no intrinsics and no per-ISA code.
template <class T>
struct Vec {
    typedef T type __attribute__((vector_size(64)));
};
template <class T>
using VT = typename Vec<T>::type;
typedef int32_t VI32 __attribute__((vector_size(64)));

template <class T>
constexpr int64_t lanes() { return 64 / sizeof(T); }

template <class T>
inline VT<T> load(const T* p) {
    VT<T> v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
template <class T>
inline void store(T* p, VT<T> v) { std::memcpy(p, &v, sizeof v); }
template <class T>
inline VT<T> splat(T x) { return VT<T>{} + x; }
// Horizontal sum and max by halving the vector (each step one extract and one vector operation;
// the lanes read one by one from memory cost more than the row's arithmetic).
template <class T, int Bytes>
struct Part {
    typedef T type __attribute__((vector_size(Bytes)));
};

template <class T, int Bytes, bool Max>
inline T reduce(typename Part<T, Bytes>::type v) {
    if constexpr (Bytes == 2 * sizeof(T)) {
        return Max ? (v[0] > v[1] ? v[0] : v[1]) : v[0] + v[1];
    } else {
        typename Part<T, Bytes / 2>::type lo, hi;
        std::memcpy(&lo, &v, Bytes / 2);
        std::memcpy(&hi, reinterpret_cast<const char*>(&v) + Bytes / 2, Bytes / 2);
        if constexpr (Max) {
            return reduce<T, Bytes / 2, Max>(hi > lo ? hi : lo);
        } else {
            return reduce<T, Bytes / 2, Max>(lo + hi);
        }
    }
}

template <class T>
inline T hsum(VT<T> v) { return reduce<T, 64, false>(v); }
template <class T>
inline VT<T> iota() {
    VT<T> v;
    for (int64_t l = 0; l < lanes<T>(); ++l) v[l] = static_cast<T>(l);
    return v;
}
template <class T>
inline T hmax(VT<T> v) { return reduce<T, 64, true>(v); }
template <class T>
inline T hmin(VT<T> v) { return -reduce<T, 64, true>(-v); }

// acc + sum_d x[d] m[d * ld .. d * ld + W): W columns of a (D, ld) matrix weighted by the row x,
// in four independent chains (one chain of D fused multiply-adds waits on each one's latency).
template <class T>
inline VT<T> add_row_times_columns(VT<T> acc, const T* x, const T* m, int64_t ld, int64_t D) {
    VT<T> a1{}, a2{}, a3{};
    const int64_t D4 = D - D % 4;
    int64_t d = 0;
    for (; d < D4; d += 4) {
        acc += x[d] * load(m + d * ld);
        a1 += x[d + 1] * load(m + (d + 1) * ld);
        a2 += x[d + 2] * load(m + (d + 2) * ld);
        a3 += x[d + 3] * load(m + (d + 3) * ld);
    }
    for (; d < D; ++d) acc += x[d] * load(m + d * ld);
    return (acc + a1) + (a2 + a3);
}

// C[i][c .. c + W) = sum_d A[i][d] Bt[d][c .. c + W) for the rows i < rows, four rows at a time
// sharing each column load (and two chunks at a time where the span allows: six loads for eight
// fused multiply-adds instead of two loads for one). span(i0, i1, lo, hi) gives the chunk-aligned
// columns [lo, hi) that rows i0 .. i1 need (a row may get more: the caller never reads them).
//
// The columns go in chunks of CHUNK, every row's share of one chunk before the next: the chunk's
// D x CHUNK entries of Bt (64 KiB at D = 64) stay in L2 while all the rows read them, where a
// sweep of each block of four rows over all columns streamed the whole Bt (megabytes at a long
// Tk) from memory once per four rows.
constexpr int64_t CHUNK = 256;

// The schedule of both products: for each chunk of CHUNK columns, for each block of four rows
// (nr of them: fewer at the end), body(i0, nr, lo, hi) over the block's columns span(i0, i1)
// within the chunk, where there are any.
template <class Span, class Body>
inline void by_chunks(int64_t rows, Span span, Body body) {
    std::vector<int64_t> los((rows + 3) / 4), his((rows + 3) / 4);
    int64_t top = 0;
    for (int64_t i0 = 0; i0 < rows; i0 += 4) {
        span(i0, (rows - i0 < 4 ? rows : i0 + 4) - 1, los[i0 / 4], his[i0 / 4]);
        top = his[i0 / 4] > top ? his[i0 / 4] : top;
    }
    for (int64_t c0 = 0; c0 < top; c0 += CHUNK) {
        for (int64_t i0 = 0; i0 < rows; i0 += 4) {
            const int64_t lo = los[i0 / 4] > c0 ? los[i0 / 4] : c0;
            const int64_t hi = his[i0 / 4] < c0 + CHUNK ? his[i0 / 4] : c0 + CHUNK;
            if (lo < hi) body(i0, rows - i0 < 4 ? rows - i0 : 4, lo, hi);
        }
    }
}

template <class T, class Span>
void rows_times_columns(T* C, int64_t ldc, const T* A, int64_t lda, const T* Bt, int64_t ldb, int64_t D,
                        int64_t rows, Span span) {
    constexpr int64_t W = lanes<T>();
    static_assert(CHUNK % (2 * W) == 0, "chunks of whole pairs of vectors");
    by_chunks(rows, span, [=](int64_t i0, int64_t nr, int64_t lo, int64_t hi) {
        if (nr < 4) {
            for (int64_t i = i0; i < i0 + nr; ++i)
                for (int64_t c = lo; c < hi; c += W) store(C + i * ldc + c, add_row_times_columns(VT<T>{}, A + i * lda, Bt + c, ldb, D));
            return;
        }
        const T* a0 = A + i0 * lda;
        const T* a1 = a0 + lda;
        const T* a2 = a1 + lda;
        const T* a3 = a2 + lda;
        T* c0 = C + i0 * ldc;
        int64_t c = lo;
        for (; c + W < hi; c += 2 * W) {
            VT<T> x0{}, x1{}, x2{}, x3{}, y0{}, y1{}, y2{}, y3{};
            for (int64_t d = 0; d < D; ++d) {
                const VT<T> u = load(Bt + d * ldb + c), w = load(Bt + d * ldb + c + W);
                x0 += a0[d] * u; y0 += a0[d] * w;
                x1 += a1[d] * u; y1 += a1[d] * w;
                x2 += a2[d] * u; y2 += a2[d] * w;
                x3 += a3[d] * u; y3 += a3[d] * w;
            }
            store(c0 + c, x0); store(c0 + c + W, y0);
            store(c0 + ldc + c, x1); store(c0 + ldc + c + W, y1);
            store(c0 + 2 * ldc + c, x2); store(c0 + 2 * ldc + c + W, y2);
            store(c0 + 3 * ldc + c, x3); store(c0 + 3 * ldc + c + W, y3);
        }
        for (; c < hi; c += W) {
            VT<T> x0{}, x1{}, x2{}, x3{};
            for (int64_t d = 0; d < D; ++d) {
                const VT<T> u = load(Bt + d * ldb + c);
                x0 += a0[d] * u;
                x1 += a1[d] * u;
                x2 += a2[d] * u;
                x3 += a3[d] * u;
            }
            store(c0 + c, x0);
            store(c0 + ldc + c, x1);
            store(c0 + 2 * ldc + c, x2);
            store(c0 + 3 * ldc + c, x3);
        }
    });
}

// exp(x) for x <= 0, 16 floats at once (Cephes' expf: Cody-Waite reduction, degree-6
// polynomial, within about 1 ulp; glibc's expf does not vectorize without -ffast-math). Below
// -87.3 it returns 0 (exp is then under 1e-38, nothing next to a row's largest probability, 1).
inline VT<float> exp_nonpositive(VT<float> x) {
    const float lo = -87.3f;
    const VT<float> xc = x < lo ? splat(lo) : x;
    const VT<float> n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
    VT<float> r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    VT<float> p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const VI32 bits = (__builtin_convertvector(n, VI32) + 127) << 23;
    return x < lo ? splat(0.0f) : p * (VT<float>)bits;
}

inline VT<double> exp_nonpositive(VT<double> x) {
    for (int64_t l = 0; l < lanes<double>(); ++l) x[l] = std::exp(x[l]);
    return x;
}

struct Strides {
    // (b, h, t) strides in elements; the last dimension is contiguous
    int64_t q[3], k[3], v[3], out[3], dout[3], dq[3], dk[3], dv[3];
};

// The position terms' parameters (contiguous); any of them may be absent (null).
template <class T>
struct Tables {
    const T* key;          // E: (R, D), or (H, R, D) when key_per_head
    bool key_per_head;
    const T* query_bias;   // a: (H, D)
    const T* key_bias;     // u: (H, D)
    const T* value;        // F: (R, D)
    const T* bias;         // B: (H, R), added after the scale
    const T* gate_hi;      // hi, lo: (B, H, Tk)
    const T* gate_lo;
    const T* x_table;      // N: (R,), the piecewise term's numerators
    const T* x_den;        // den: (Tq,)
    const T* bends;        // (S - 1,) sorted
    const T* slopes;       // (H, S)
    const T* intercepts;   // (H, S)
    int64_t pieces;        // S
};

// Their gradients, added into one buffer in the layout posenc_relpos_backward states (E's, a's,
// u's, F's, B's, the piecewise term's, hi's).
template <class T>
struct TableGrads {
    T *key, *query_bias, *key_bias, *value, *bias, *gate, *x_table, *x_den, *slopes, *intercepts;
};

// Where row i's keys fall in rel's columns: j < lo read column 0, lo <= j < hi column j + off,
// j >= hi column R - 1 (the clipped distances of Shaw; Transformer-XL's table covers them all).
struct Segments {
    int64_t n, off, lo, hi;
};

inline Segments segments(int64_t i, int64_t Tq, int64_t Tk, int64_t R, int64_t offset, bool causal) {
    Segments s;
    s.n = causal ? i + Tk - Tq + 1 : Tk;
    if (s.n > Tk) s.n = Tk;
    if (s.n < 0) s.n = 0;
    s.off = offset - i;
    s.lo = -s.off < 0 ? 0 : (-s.off > s.n ? s.n : -s.off);
    s.hi = R - s.off < s.lo ? s.lo : (R - s.off > s.n ? s.n : R - s.off);
    return s;
}

inline int64_t clip(int64_t r, int64_t R) { return r < 0 ? 0 : (r > R - 1 ? R - 1 : r); }

// Row vectors of D values: whole vectors when D is a multiple of the lane count (DC, known at
// compile time for the common head sizes), else one value at a time.
template <class T, int DC>
struct Rows {
    int64_t D;
    static constexpr bool vec = DC != 0 && DC % lanes<T>() == 0;
    inline int64_t dim() const { return DC ? DC : D; }
    // y += a x
    inline void axpy(T* y, T a, const T* x) const {
        if constexpr (vec) {
            for (int64_t d = 0; d < DC; d += lanes<T>()) store(y + d, load(y + d) + a * load(x + d));
        } else {
            for (int64_t d = 0; d < dim(); ++d) y[d] += a * x[d];
        }
    }
    // y += sum_{j < n} a[j] row(j), the sum kept in registers (two chains: an FMA's latency
    // is several cycles, and each row is only D / W of them)
    template <class F>
    inline void add_weighted_rows(T* y, const T* a, int64_t n, F row) const {
        add_weighted_rows(y, a, 1, n, row);
    }
    // the same with the weights a[0], a[as], a[2 as], ... (a column of a row-major matrix)
    template <class F>
    inline void add_weighted_rows(T* y, const T* a, int64_t as, int64_t n, F row) const {
        if constexpr (vec) {
            constexpr int64_t ND = DC / lanes<T>(), L = lanes<T>();
            VT<T> acc0[ND], acc1[ND], acc2[ND], acc3[ND];
            for (int64_t u = 0; u < ND; ++u) {
                acc0[u] = load(y + u * L);
                acc1[u] = acc2[u] = acc3[u] = VT<T>{};
            }
            int64_t j = 0;
            for (; j + 3 < n; j += 4) {
                const T* x0 = row(j);
                const T* x1 = row(j + 1);
                const T* x2 = row(j + 2);
                const T* x3 = row(j + 3);
                for (int64_t u = 0; u < ND; ++u) {
                    acc0[u] += a[j * as] * load(x0 + u * L);
                    acc1[u] += a[(j + 1) * as] * load(x1 + u * L);
                    acc2[u] += a[(j + 2) * as] * load(x2 + u * L);
                    acc3[u] += a[(j + 3) * as] * load(x3 + u * L);
                }
            }
            for (; j < n; ++j) {
                const T* x0 = row(j);
                for (int64_t u = 0; u < ND; ++u) acc0[u] += a[j * as] * load(x0 + u * L);
            }
            for (int64_t u = 0; u < ND; ++u) store(y + u * L, (acc0[u] + acc1[u]) + (acc2[u] + acc3[u]));
        } else {
            for (int64_t j = 0; j < n; ++j) axpy(y, a[j * as], row(j));
        }
    }
    // C[i] += sum_{t0 <= t < t1} A[i ai + t at] B[t] for the rows i < rows, four at a time sharing
    // each load of B[t] ([t0, t1) = range(i0, i1) for the block; A must hold zeros where a row of
    // the block has no term). ai, at: A's strides (A or its transpose).
    // The terms t go in chunks of CHUNK, every row's share of one chunk before the next (B's
    // chunk stays in L2: see rows_times_columns).
    template <class Range>
    inline void add_products(T* C, int64_t ldc, const T* A, int64_t ai, int64_t at, const T* B, int64_t ldb,
                             int64_t rows, Range range) const {
        by_chunks(rows, range, [=](int64_t i0, int64_t nr, int64_t t0, int64_t t1) {
            if constexpr (vec) {
                if (nr == 4) {
                    constexpr int64_t ND = DC / lanes<T>(), L = lanes<T>();
                    VT<T> a0[ND], a1[ND], a2[ND], a3[ND];
                    T* c0 = C + i0 * ldc;
                    for (int64_t u = 0; u < ND; ++u) {
                        a0[u] = load(c0 + u * L);
                        a1[u] = load(c0 + ldc + u * L);
                        a2[u] = load(c0 + 2 * ldc + u * L);
                        a3[u] = load(c0 + 3 * ldc + u * L);
                    }
                    const T* w = A + i0 * ai;
                    for (int64_t t = t0; t < t1; ++t) {
                        const T* wt = w + t * at;
                        for (int64_t u = 0; u < ND; ++u) {
                            const VT<T> bt = load(B + t * ldb + u * L);
                            a0[u] += wt[0] * bt;
                            a1[u] += wt[ai] * bt;
                            a2[u] += wt[2 * ai] * bt;
                            a3[u] += wt[3 * ai] * bt;
                        }
                    }
                    for (int64_t u = 0; u < ND; ++u) {
                        store(c0 + u * L, a0[u]);
                        store(c0 + ldc + u * L, a1[u]);
                        store(c0 + 2 * ldc + u * L, a2[u]);
                        store(c0 + 3 * ldc + u * L, a3[u]);
                    }
                    return;
                }
            }
            for (int64_t i = i0; i < i0 + nr; ++i) {
                const T* w = A + i * ai + t0 * at;
                const T* b0 = B + t0 * ldb;
                add_weighted_rows(C + i * ldc, w, at, t1 - t0, [=](int64_t t) { return b0 + t * ldb; });
            }
        });
    }
    inline T dot(const T* x, const T* y) const {
        if constexpr (vec) {
            VT<T> acc{};
            for (int64_t d = 0; d < DC; d += lanes<T>()) acc += load(x + d) * load(y + d);
            return hsum<T>(acc);
        } else {
            T acc = 0;
            for (int64_t d = 0; d < dim(); ++d) acc += x[d] * y[d];
            return acc;
        }
    }
};

template <class T, int DC>
struct Kernel {
    static constexpr int64_t W = lanes<T>();
    int64_t Tq, Tk, D, R, offset;
    bool causal;
    T scale;
    const Strides* st;

    inline int64_t dim() const { return DC ? DC : D; }
    static inline int64_t padded(int64_t n) { return (n + W - 1) / W * W; }

    // The W entries row[r(i, j)] for keys j = c .. c + W - 1: one load inside the middle segment.
    inline VT<T> gather(const T* row, int64_t c, const Segments& g) const {
        if (c >= g.lo && c + W <= g.hi) return load(row + c + g.off);
        if (c + W <= g.lo) return splat(row[0]);
        if (c >= g.hi) return splat(row[R - 1]);
        VT<T> v;
        for (int64_t l = 0; l < W; ++l) v[l] = row[clip(c + l + g.off, R)];
        return v;
    }

    // The columns r(i, 0) .. r(i, n - 1) of row i (r is monotone in j): [first, last].
    inline void columns(const Segments& g, int64_t& first, int64_t& last) const {
        first = clip(g.off, R);
        last = clip(g.n - 1 + g.off, R);
    }

    // The terms added after the scale for one (b, h): B's row of the head, the gates' parts
    // (copied with zeros past Tk, so that whole chunks load) and query i's own.
    // And the piecewise term's: N, den_i and 1 / den_i, the bends and the head's slopes and intercepts.
    struct After {
        const T* bias;
        const T* hi;
        const T* lo;
        T hi_q, lo_q;
        const T* xt;
        T den, rinv;
        const T* bends;
        int64_t nb;
        const T* slope;
        const T* icpt;
    };

    inline After after_terms(const Tables<T>& tab, int64_t h, const T* hi, const T* lo, int64_t i) const {
        After a{tab.bias != nullptr ? tab.bias + h * R : nullptr, nullptr, nullptr, T(0), T(0),
                nullptr, T(0), T(0), nullptr, 0, nullptr, nullptr};
        if (tab.gate_hi != nullptr) {
            const int64_t own = i + Tk - Tq;
            a.hi = hi;
            a.lo = lo;
            a.hi_q = own >= 0 && own < Tk ? hi[own] : T(0);
            a.lo_q = own >= 0 && own < Tk ? lo[own] : T(0);
        }
        if (tab.x_table != nullptr) {
            a.xt = tab.x_table;
            a.den = tab.x_den[i];
            a.rinv = T(1) / a.den;
            a.bends = tab.bends;
            a.nb = tab.pieces - 1;
            a.slope = tab.slopes + h * tab.pieces;
            a.icpt = tab.intercepts + h * tab.pieces;
        }
        return a;
    }

    // x = N[r] / den_i for the W keys from c: divided, not multiplied by 1 / den_i, so that x is
    // the correctly rounded quotient the torch path computes: which side of a bend an x near it
    // falls on (the slope its gradient takes) is then the torch path's.
    inline VT<T> normalized(const After& a, int64_t c, const Segments& g) const { return gather(a.xt, c, g) / a.den; }

    // The segments [slo, shi] a chunk's x spans; cur: the last chunk's, tried first (x moves
    // little from one chunk to the next, and a segment is mostly many chunks wide).
    static inline void chunk_segments(const After& a, VT<T> x, int64_t& cur, int64_t& slo, int64_t& shi) {
        const T lo = hmin<T>(x), hi = hmax<T>(x);
        const T* b = a.bends;
        if ((cur == 0 || b[cur - 1] <= lo) && (cur == a.nb || hi < b[cur])) {
            slo = shi = cur;
            return;
        }
        slo = std::upper_bound(b, b + a.nb, lo) - b;
        shi = std::upper_bound(b, b + a.nb, hi) - b;
        cur = slo;
    }

    // f_h(x) lane by lane over the segments [slo, shi] (x < bends[s] puts a lane in segment s or below).
    static inline VT<T> piece_values(const After& a, VT<T> x, int64_t slo, int64_t shi) {
        VT<T> f = x * a.slope[shi] + a.icpt[shi];
        for (int64_t s = shi - 1; s >= slo; --s) f = x < a.bends[s] ? x * a.slope[s] + a.icpt[s] : f;
        return f;
    }

    // s holds q_i . k_j on entry (rows_times_columns).
    inline void logits(T* s, const T* rel_row, const T* colp, const Segments& g, int64_t np, const After& a) const {
        const VT<T> lane = iota<T>();
        int64_t cur = 0;  // the piecewise term's segment of the last chunk
        for (int64_t c = 0; c < np; c += W) {
            VT<T> acc = load(s + c);
            if (rel_row != nullptr) acc += gather(rel_row, c, g);
            if (colp != nullptr) acc += load(colp + c);
            acc *= scale;
            if (a.bias != nullptr) acc += gather(a.bias, c, g);
            // eager's order: (hi_i' - hi_j) + lo_i' - lo_j
            if (a.hi != nullptr) acc += ((splat(a.hi_q) - load(a.hi + c)) + a.lo_q) - load(a.lo + c);
            if (a.xt != nullptr) {
                const VT<T> x = normalized(a, c, g);
                int64_t slo, shi;
                chunk_segments(a, x, cur, slo, shi);
                acc += piece_values(a, x, slo, shi);
            }
            store(s + c, lane < static_cast<T>(g.n - c) ? acc : splat(-std::numeric_limits<T>::infinity()));
        }
    }

    // dst[t] += x[t] for t in [lo, hi), into float64 sums.
    static inline void add_wide(double* dst, const T* x, int64_t lo, int64_t hi) {
        int64_t t = lo;
        if constexpr (sizeof(T) == 4) {
            typedef float F8 __attribute__((vector_size(32)));
            for (; t + W <= hi; t += W) {
                F8 a, b;
                std::memcpy(&a, x + t, sizeof a);
                std::memcpy(&b, x + t + 8, sizeof b);
                store(dst + t, load(dst + t) + __builtin_convertvector(a, VT<double>));
                store(dst + t + 8, load(dst + t + 8) + __builtin_convertvector(b, VT<double>));
            }
        }
        for (; t < hi; ++t) dst[t] += x[t];
    }

    // The piecewise term's gradients from one row's d loss / d s_ij (ga, zero past the row's keys),
    // e_ij = ga_ij f_h'(x_ij): the segment sums of ga into gi and of ga x into gs (the head's
    // intercepts' and slopes' gradients), e / den_i by table row into gx, and
    // -sum_j e x / den_i (d x / d den = -x / den) into gden. ex: a row of scratch (Tkp). The sums
    // over rows in float64: c's gradient is the difference of the x_table's and x_den's shares,
    // each several times larger than it, and a float32 sum row after row lost ten times the
    // hooks' error there.
    inline void piecewise_grads(const After& a, const T* ga, const Segments& g, int64_t np, T* ex, double* gx,
                                double* gs, double* gi, double& gden) const {
        VT<T> run_g{}, run_m{}, ax{};
        int64_t run = -1, cur = 0;
        for (int64_t c = 0; c < np; c += W) {
            const VT<T> d = load(ga + c);
            const VT<T> x = normalized(a, c, g);
            int64_t slo, shi;
            chunk_segments(a, x, cur, slo, shi);
            VT<T> fp = splat(a.slope[shi]);
            if (slo == shi) {
                // the common chunk, one segment: its sums run on in registers until the segment changes
                if (slo != run) {
                    if (run >= 0) {
                        gi[run] += hsum<T>(run_g);
                        gs[run] += hsum<T>(run_m);
                    }
                    run_g = run_m = VT<T>{};
                    run = slo;
                }
                run_g += d;
                run_m += d * x;
            } else {
                for (int64_t s = shi; s >= slo; --s) {
                    using Mask = decltype(x < x);
                    Mask in = ~Mask{};  // every lane, then those below bends[s] and from bends[s - 1] on
                    if (s < shi) in = in & (x < a.bends[s]);
                    if (s > slo) in = in & (x >= a.bends[s - 1]);
                    gi[s] += hsum<T>(in ? d : VT<T>{});
                    gs[s] += hsum<T>(in ? d * x : VT<T>{});
                    if (s < shi) fp = x < a.bends[s] ? splat(a.slope[s]) : fp;
                }
            }
            const VT<T> e = d * fp;
            store(ex + c, e * a.rinv);
            ax += e * x;
        }
        if (run >= 0) {
            gi[run] += hsum<T>(run_g);
            gs[run] += hsum<T>(run_m);
        }
        // by table row: the middle segment's keys one column each, the clipped ones into the ends
        add_wide(gx + g.off, ex, g.lo, g.hi);
        T first, last;
        end_sums(ex, g, first, last);
        gx[0] += first;
        gx[R - 1] += last;
        gden -= static_cast<double>(a.rinv) * hsum<T>(ax);
    }

    // One slice's gate parts into padded buffers (zeros past Tk), or nulls without gates.
    inline void gate_rows(const Tables<T>& tab, int64_t gi, T* hi, T* lo, int64_t Tkp, const T*& hip,
                          const T*& lop) const {
        hip = lop = nullptr;
        if (tab.gate_hi == nullptr) return;
        std::memset(hi, 0, sizeof(T) * Tkp);
        std::memset(lo, 0, sizeof(T) * Tkp);
        std::memcpy(hi, tab.gate_hi + gi * Tk, sizeof(T) * Tk);
        std::memcpy(lo, tab.gate_lo + gi * Tk, sizeof(T) * Tk);
        hip = hi;
        lop = lo;
    }

    // tb[r(i, j)] += x[j] over row i's keys (x zero past them): the middle segment a chunk at a
    // time, the clipped keys into the end rows.
    inline void add_by_column(T* tb, const T* x, const Segments& g) const {
        int64_t t = g.lo;
        for (; t + W <= g.hi; t += W) store(tb + t + g.off, load(tb + t + g.off) + load(x + t));
        for (; t < g.hi; ++t) tb[t + g.off] += x[t];
        T first, last;
        end_sums(x, g, first, last);
        tb[0] += first;
        tb[R - 1] += last;
    }

    // The chunk-aligned key columns [0, padded(n)) that query rows i0 .. i1 need (n grows with i).
    inline void key_span(int64_t i0, int64_t i1, int64_t& lo, int64_t& hi) const {
        (void)i0;
        lo = 0;
        hi = padded(segments(i1, Tq, Tk, R, offset, causal).n);
    }

    // The keys of the last row of query i's block of four (the most in the block: n grows with
    // i), and their chunk-aligned count: the row passes run to it, so that the block products
    // read probabilities 0, not stale entries, past a row's own keys.
    inline int64_t block_keys(int64_t i) const {
        const int64_t last = (i | 3) < Tq - 1 ? (i | 3) : Tq - 1;
        return segments(last, Tq, Tk, R, offset, causal).n;
    }

    // The table rows that query rows i0 .. i1 reach, [t0, t1) (no padding: E has R rows).
    inline void table_rows(int64_t i0, int64_t i1, int64_t& t0, int64_t& t1) const {
        t0 = R;
        t1 = 0;
        for (int64_t i = i0; i <= i1; ++i) {
            const Segments g = segments(i, Tq, Tk, R, offset, causal);
            if (g.n == 0) continue;
            int64_t first, last;
            columns(g, first, last);
            t0 = first < t0 ? first : t0;
            t1 = last + 1 > t1 ? last + 1 : t1;
        }
        if (t1 < t0) t1 = t0;
    }

    // The same chunk-aligned: the table columns [lo, hi) of the products (empty at padded(R)
    // where no row has a key).
    inline void table_span(int64_t i0, int64_t i1, int64_t& lo, int64_t& hi) const {
        int64_t t0, t1;
        table_rows(i0, i1, t0, t1);
        if (t1 == t0) {
            lo = hi = padded(R);
            return;
        }
        lo = t0 / W * W;
        hi = padded(t1);
    }

    // Per (b, h) and block of query rows [i0, i0 + nb): X = q + a (rows of D) and REL = X E^T over
    // the columns each row reaches (row i of the block at X + (i - i0) D, REL + (i - i0) Rp).
    inline void relative_rows(T* X, T* REL, int64_t Rp, const T* qb, int64_t qs, const T* qa, const T* et, int64_t i0,
                              int64_t nb) const {
        const int64_t d_n = dim();
        for (int64_t i = 0; i < nb; ++i)
            for (int64_t d = 0; d < d_n; ++d)
                X[i * d_n + d] = qa != nullptr ? qb[(i0 + i) * qs + d] + qa[d] : qb[(i0 + i) * qs + d];
        rows_times_columns(REL, Rp, X, d_n, et, Rp, d_n, nb, [this, i0](int64_t a, int64_t c, int64_t& lo, int64_t& hi) {
            table_span(i0 + a, i0 + c, lo, hi);
        });
    }

    // The query rows of one block (a multiple of four, so that the blocks of four rows that
    // key_span and block_keys describe never straddle two): the score buffers hold this many
    // rows, O(block Tk) memory per thread instead of O(Tq Tk).
    static constexpr int64_t BLOCK = 128;

    // The sums of x[j] over the keys clipped to column 0 (j < lo) and to column R - 1 (j >= hi),
    // x padded with zeros to whole chunks.
    inline void end_sums(const T* x, const Segments& g, T& first, T& last) const {
        const VT<T> lane = iota<T>();
        VT<T> f{}, l{};
        for (int64_t c = 0; c < padded(g.n); c += W) {
            const VT<T> j = lane + static_cast<T>(c), xv = load(x + c);
            f += j < static_cast<T>(g.lo) ? xv : VT<T>{};
            l += j >= static_cast<T>(g.hi) ? xv : VT<T>{};
        }
        first = hsum<T>(f);
        last = hsum<T>(l);
    }

    // The query rows i in [ilo, ihi] whose keys reach table row r: clip(offset - i) <= r (the
    // first key's column) and clip(n_i - 1 + offset - i) >= r (the last key's), n_i > 0.
    inline void rows_reaching(int64_t r, int64_t& ilo, int64_t& ihi) const {
        ilo = r < R - 1 ? offset - r : 0;
        ihi = Tq - 1;
        if (causal) {
            // n_i - 1 - i = Tk - Tq on every row with a key (i >= Tq - Tk)
            ilo = ilo > Tq - Tk ? ilo : Tq - Tk;
            if (r > 0 && Tk - Tq + offset < r) ihi = -1;
        } else if (r > 0) {
            ihi = ihi < Tk - 1 + offset - r ? ihi : Tk - 1 + offset - r;
        }
        ilo = ilo > 0 ? ilo : 0;
    }

    // The per-column sums of a row's x[j]: column j + off gets key j, the clipped keys sum into
    // the end columns, the other columns 0 (col has padded(R) + W entries; x is read up to W
    // entries past padded(n)).
    inline void by_column(T* col, const T* x, const Segments& g) const {
        for (int64_t c = 0; c < padded(R); c += W) store(col + c, VT<T>{});
        for (int64_t t = g.lo; t < g.hi; t += W) store(col + t + g.off, load(x + t));
        if (g.hi > g.lo) store(col + g.hi + g.off, VT<T>{});  // the copy's overshoot: unreached columns
        T first, last;
        end_sums(x, g, first, last);
        col[0] += first;
        col[R - 1] += last;
    }

    // n rows of D from a strided (b, h) slice into dst, contiguous (L1-resident for the products
    // that read them many times); returns dst.
    inline const T* copy_rows(T* dst, const T* src, int64_t stride, int64_t n) const {
        const int64_t d_n = dim();
        for (int64_t t = 0; t < n; ++t) std::memcpy(dst + t * d_n, src + t * stride, sizeof(T) * d_n);
        return dst;
    }

    // k (or v) of one (b, h) transposed into (D, Tkp), zeros past Tk.
    inline void transpose_keys(T* dst, const T* src, int64_t stride, int64_t Tkp) const {
        const int64_t d_n = dim();
        std::memset(dst, 0, sizeof(T) * d_n * Tkp);
        for (int64_t j = 0; j < Tk; ++j)
            for (int64_t d = 0; d < d_n; ++d) dst[d * Tkp + j] = src[j * stride + d];
    }

    // Per call: each head's key table transposed, (H', D, Rp), zeros past R.
    std::vector<T> transposed_tables(const Tables<T>& tab, int64_t H, int64_t Rp) const {
        const int64_t d_n = dim(), heads = tab.key_per_head ? H : 1;
        std::vector<T> et(tab.key != nullptr ? heads * d_n * Rp : 0, T(0));
        for (int64_t h = 0; h < (tab.key != nullptr ? heads : 0); ++h)
            for (int64_t r = 0; r < R; ++r)
                for (int64_t d = 0; d < d_n; ++d) et[(h * d_n + d) * Rp + r] = tab.key[(h * R + r) * d_n + d];
        return et;
    }

    // col[j] = u . k_j for the (b, h) whose k is transposed in kt, zeros past Tk.
    inline void key_bias_terms(T* col, const T* u, const T* kt, int64_t Tkp) const {
        for (int64_t c = 0; c < Tkp; c += W) store(col + c, add_row_times_columns(VT<T>{}, u, kt + c, Tkp, dim()));
    }

    void forward(const T* q, const T* k, const T* v, const Tables<T>& tab, T* out, T* lse, int64_t H, int64_t g_begin,
                 int64_t g_end) const {
        const Rows<T, DC> rows{D};
        const int64_t d_n = dim(), Tkp = padded(Tk > 0 ? Tk : 1), Rp = padded(R), NB = Tq < BLOCK ? Tq : BLOCK;
        const bool rel = tab.key != nullptr;
        std::vector<T> kt_buf(d_n * Tkp), S_buf(NB * Tkp), c_buf(Tkp), O_buf(NB * d_n), REL_buf(rel ? NB * Rp : 0),
            X_buf(rel ? NB * d_n : 0), m_buf(NB > 0 ? NB : 1), l_buf(NB > 0 ? NB : 1), Q_buf(Tq * d_n), V_buf(Tk * d_n),
            hi_buf(tab.gate_hi != nullptr ? Tkp : 0), lo_buf(tab.gate_hi != nullptr ? Tkp : 0);
        const std::vector<T> et_all = transposed_tables(tab, H, Rp);
        T* kt = kt_buf.data();
        for (int64_t gi = g_begin; gi < g_end; ++gi) {
            const int64_t b = gi / H, h = gi % H;
            const T *hi, *lo;
            gate_rows(tab, gi, hi_buf.data(), lo_buf.data(), Tkp, hi, lo);
            const T* qb = copy_rows(Q_buf.data(), q + b * st->q[0] + h * st->q[1], st->q[2], Tq);
            const T* vb = copy_rows(V_buf.data(), v + b * st->v[0] + h * st->v[1], st->v[2], Tk);
            const T* et = tab.key != nullptr ? et_all.data() + (tab.key_per_head ? h * d_n * Rp : 0) : nullptr;
            const T* qa = tab.query_bias != nullptr ? tab.query_bias + h * d_n : nullptr;
            T* ob = out + b * st->out[0] + h * st->out[1];
            T* lb = lse + gi * Tq;
            transpose_keys(kt, k + b * st->k[0] + h * st->k[1], st->k[2], Tkp);
            const T* colp = nullptr;
            if (tab.key_bias != nullptr) {
                key_bias_terms(c_buf.data(), tab.key_bias + h * d_n, kt, Tkp);
                colp = c_buf.data();
            }
            for (int64_t i0 = 0; i0 < Tq; i0 += BLOCK) {
                const int64_t nb = Tq - i0 < BLOCK ? Tq - i0 : BLOCK;
                forward_block(rows, qb, vb, kt, et, qa, colp, tab, h, hi, lo, i0, nb, S_buf.data(), REL_buf.data(),
                              X_buf.data(), O_buf.data(), m_buf.data(), l_buf.data(), ob, lb);
            }
        }
    }

    // The forward of query rows [i0, i0 + nb) of one (b, h): their scores, softmax and outputs.
    void forward_block(const Rows<T, DC>& rows, const T* qb, const T* vb, const T* kt, const T* et, const T* qa,
                       const T* colp, const Tables<T>& tab, int64_t h, const T* hi, const T* lo, int64_t i0, int64_t nb,
                       T* S, T* REL, T* X, T* O, T* m_buf, T* l_buf, T* ob, T* lb) const {
        const int64_t d_n = dim(), Tkp = padded(Tk > 0 ? Tk : 1), Rp = padded(R);
        const bool rel = tab.key != nullptr;
        // q.k and the relative terms of the block's rows, four rows at a time
        rows_times_columns(S, Tkp, qb + i0 * d_n, d_n, kt, Tkp, d_n, nb,
                           [this, i0](int64_t a, int64_t c, int64_t& lo_, int64_t& hi_) { key_span(i0 + a, i0 + c, lo_, hi_); });
        if (rel) relative_rows(X, REL, Rp, qb, d_n, qa, et, i0, nb);
        for (int64_t t = 0; t < nb; ++t) {
            const int64_t i = i0 + t;
            const Segments g = segments(i, Tq, Tk, R, offset, causal);
            const int64_t np = padded(block_keys(i));
            T* s = S + t * Tkp;
            if (g.n == 0) {
                for (int64_t c = 0; c < np; c += W) store(s + c, VT<T>{});
                m_buf[t] = -std::numeric_limits<T>::infinity();
                continue;
            }
            logits(s, rel ? REL + t * Rp : nullptr, colp, g, np, after_terms(tab, h, hi, lo, i));
            VT<T> mv = load(s);
            for (int64_t c = W; c < np; c += W) {
                const VT<T> xv = load(s + c);
                mv = xv > mv ? xv : mv;
            }
            const T m = hmax<T>(mv);
            VT<T> lv{};
            for (int64_t c = 0; c < np; c += W) {
                const VT<T> e = exp_nonpositive(load(s + c) - m);
                store(s + c, e);
                lv += e;
            }
            m_buf[t] = m;
            l_buf[t] = hsum<T>(lv);
        }
        // o_i = sum_j p_ij v_j, four rows at a time; then the value table and 1 / l
        std::memset(O, 0, sizeof(T) * nb * d_n);
        rows.add_products(O, d_n, S, Tkp, 1, vb, d_n, nb,
                          [this, i0](int64_t a, int64_t, int64_t& t0, int64_t& t1) { t0 = 0; t1 = block_keys(i0 + a); });
        for (int64_t t = 0; t < nb; ++t) {
            const int64_t i = i0 + t;
            const Segments g = segments(i, Tq, Tk, R, offset, causal);
            T* oi = ob + i * st->out[2];
            if (g.n == 0) {
                for (int64_t d = 0; d < d_n; ++d) oi[d] = 0;
                lb[i] = -std::numeric_limits<T>::infinity();
                continue;
            }
            const T* s = S + t * Tkp;
            T* o = O + t * d_n;
            const T m = m_buf[t], l = l_buf[t];
            if (tab.value != nullptr) {
                const T* F = tab.value;
                T first, last;
                end_sums(s, g, first, last);
                rows.axpy(o, first, F);
                rows.axpy(o, last, F + (R - 1) * d_n);
                const T* mid = F + (g.lo + g.off) * d_n;
                rows.add_weighted_rows(o, s + g.lo, g.hi - g.lo, [=](int64_t j) { return mid + j * d_n; });
            }
            const T inv = T(1) / l;
            for (int64_t d = 0; d < d_n; ++d) oi[d] = o[d] * inv;
            lb[i] = m + std::log(l);
        }
    }

    // Per (b, h) and block of query rows: a pass over the block's rows recomputes p and computes
    // d z (kept, (block, Tkp) each), dq and the relative terms' per-column sums; then a pass over
    // the keys adds the block's share of dv_j and dk_j down the columns of p and d z, and one over
    // the table rows adds its share of their gradients (each share summed in registers and added
    // once per block: no read-modify-write per (i, j)).
    void backward(const T* q, const T* k, const T* v, const Tables<T>& tab, const T* out, const T* lse, const T* dout,
                  T* dq, T* dk, T* dv, const TableGrads<T>& grads, int64_t H, int64_t g_begin, int64_t g_end) const {
        const Rows<T, DC> rows{D};
        const int64_t d_n = dim(), Tkp = padded(Tk > 0 ? Tk : 1), Rp = padded(R), NB = Tq < BLOCK ? Tq : BLOCK;
        const bool rel = tab.key != nullptr, val = tab.value != nullptr, gated = tab.gate_hi != nullptr;
        const bool pw = tab.x_table != nullptr;
        const bool after = gated || pw || tab.bias != nullptr;  // a term after the scale: its gradient is d loss / d (scale z)
        // P and S: a row per query of the block (W entries of slack at the end, read by
        // by_column); DR and PB: a row of Rw = padded(R) + W per query (by_column's slack)
        const int64_t Rw = Rp + W;
        std::vector<T> kt_buf(d_n * Tkp), vt_buf(d_n * Tkp), P_buf(NB * Tkp + W), S_buf(NB * Tkp + W), dc_buf(Tkp),
            c_buf(Tkp), REL_buf(rel ? NB * Rp : 0), GV_buf(val ? NB * Rp : 0), X_buf(rel ? NB * d_n : 0),
            DR_buf(rel ? NB * Rw : 0), DX_buf(rel ? NB * d_n : 0), PB_buf(val ? NB * Rw : 0), ft_buf(val ? d_n * Rp : 0, T(0)),
            hi_buf(gated ? Tkp : 0), lo_buf(gated ? Tkp : 0), gc_buf(gated ? Tkp : 0), GR_buf(after ? Tkp : 0),
            rs_buf(gated ? (Tq > 0 ? Tq : 1) : 0), EX_buf(pw ? Tkp : 0);
        // the piecewise term's gradients, summed in float64 over this call's slices: N's, den's,
        // then the slopes' and intercepts' (H, S)
        const int64_t NS = tab.pieces;
        std::vector<double> pw_grads(pw ? R + Tq + 2 * H * NS : 0, 0.0);
        const std::vector<T> et_all = transposed_tables(tab, H, Rp);
        T* kt = kt_buf.data();
        T* vt = vt_buf.data();
        T* P = P_buf.data();    // p_ij, row i at P + (i - i0) Tkp
        T* S = S_buf.data();    // d loss / d z_ij
        T* dc = dc_buf.data();  // sum_i d z_ij
        T* X = X_buf.data();    // q_i + a
        T* DR = DR_buf.data();  // d rel: d z summed per table row
        T* DX = DX_buf.data();  // d rel E: the relative term's share of dq, a row per query
        T* PB = PB_buf.data();  // p summed per table row
        T* ft = ft_buf.data();  // the value table transposed (D, Rp), zeros past R
        if (val) {
            for (int64_t r = 0; r < R; ++r)
                for (int64_t d = 0; d < d_n; ++d) ft[d * Rp + r] = tab.value[r * d_n + d];
        }
        // q, k and dO of a slice are copied into contiguous rows (Q, K, G below)
        const int64_t qs = d_n, ks = d_n, dos = d_n;
        std::vector<T> Q_buf(Tq * d_n), K_buf(Tk * d_n), G_buf(Tq * d_n);
        for (int64_t gi = g_begin; gi < g_end; ++gi) {
            const int64_t b = gi / H, h = gi % H;
            const T* qb = copy_rows(Q_buf.data(), q + b * st->q[0] + h * st->q[1], st->q[2], Tq);
            const T* kb = copy_rows(K_buf.data(), k + b * st->k[0] + h * st->k[1], st->k[2], Tk);
            const T* ob = out + b * st->out[0] + h * st->out[1];
            const T* dob = copy_rows(G_buf.data(), dout + b * st->dout[0] + h * st->dout[1], st->dout[2], Tq);
            const T* lb = lse + gi * Tq;
            const T *hi, *lo;
            gate_rows(tab, gi, hi_buf.data(), lo_buf.data(), Tkp, hi, lo);
            if (gated) std::memset(gc_buf.data(), 0, sizeof(T) * Tkp);
            T* gb = tab.bias != nullptr ? grads.bias + h * R : nullptr;
            const int64_t eh = tab.key_per_head ? h : 0;
            const T* et = rel ? et_all.data() + eh * d_n * Rp : nullptr;
            const T* E = rel ? tab.key + eh * R * d_n : nullptr;
            const T* qa = tab.query_bias != nullptr ? tab.query_bias + h * d_n : nullptr;
            T* dqb = dq + b * st->dq[0] + h * st->dq[1];
            T* dkb = dk + b * st->dk[0] + h * st->dk[1];
            T* dvb = dv + b * st->dv[0] + h * st->dv[1];
            transpose_keys(kt, kb, ks, Tkp);
            transpose_keys(vt, v + b * st->v[0] + h * st->v[1], st->v[2], Tkp);
            const T* colp = nullptr;
            if (tab.key_bias != nullptr) {
                key_bias_terms(c_buf.data(), tab.key_bias + h * d_n, kt, Tkp);
                colp = c_buf.data();
            }
            std::memset(dc, 0, sizeof(T) * Tkp);
            for (int64_t j = 0; j < Tk; ++j) {
                std::memset(dvb + j * st->dv[2], 0, sizeof(T) * d_n);
                std::memset(dkb + j * st->dk[2], 0, sizeof(T) * d_n);
            }
            for (int64_t i0 = 0; i0 < Tq; i0 += BLOCK) {
                const int64_t nb = Tq - i0 < BLOCK ? Tq - i0 : BLOCK;
                // q.k, dO.v, the relative terms and dO.F of the block's rows, four rows at a time
                auto keys = [this, i0](int64_t a, int64_t c, int64_t& lo_, int64_t& hi_) { key_span(i0 + a, i0 + c, lo_, hi_); };
                rows_times_columns(P, Tkp, qb + i0 * qs, qs, kt, Tkp, d_n, nb, keys);
                rows_times_columns(S, Tkp, dob + i0 * dos, dos, vt, Tkp, d_n, nb, keys);
                if (rel) relative_rows(X, REL_buf.data(), Rp, qb, qs, qa, et, i0, nb);
                if (val) {
                    rows_times_columns(GV_buf.data(), Rp, dob + i0 * dos, dos, ft, Rp, d_n, nb,
                                       [this, i0](int64_t a, int64_t c, int64_t& lo_, int64_t& hi_) {
                                           table_span(i0 + a, i0 + c, lo_, hi_);
                                       });
                }
                for (int64_t t = 0; t < nb; ++t) {
                    const int64_t i = i0 + t;
                    const Segments g = segments(i, Tq, Tk, R, offset, causal);
                    const T* doi = dob + i * dos;
                    T* dqo = dqb + i * st->dq[2];
                    T* p = P + t * Tkp;
                    T* ds = S + t * Tkp;
                    const int64_t np = padded(block_keys(i));
                    std::memset(dqo, 0, sizeof(T) * d_n);
                    if (gated) rs_buf[i] = T(0);
                    if (g.n == 0) {
                        for (int64_t c = 0; c < np; c += W) {
                            store(p + c, VT<T>{});
                            store(ds + c, VT<T>{});
                        }
                        if (val) by_column(PB + t * Rw, p, g);
                        if (rel) by_column(DR + t * Rw, ds, g);
                        continue;
                    }
                    logits(p, rel ? REL_buf.data() + t * Rp : nullptr, colp, g, np, after_terms(tab, h, hi, lo, i));
                    const T li = lb[i];
                    for (int64_t c = 0; c < np; c += W) store(p + c, exp_nonpositive(load(p + c) - li));
                    // delta_i = sum_j p_ij dp_ij = dO_i . O_i
                    const T delta = rows.dot(doi, ob + i * st->out[2]);
                    const T* gv = val ? GV_buf.data() + t * Rp : nullptr;  // dO_i . F[r]
                    for (int64_t c = 0; c < np; c += W) {
                        VT<T> acc = load(ds + c);  // dO_i . v_j
                        if (val) acc += gather(gv, c, g);
                        // d loss / d (scale z_ij), then d loss / d z_ij; 0 on the padding (p = 0)
                        const VT<T> dav = load(p + c) * (acc - delta);
                        const VT<T> dsv = dav * scale;
                        if (after) store(GR_buf.data() + c, dav);
                        store(ds + c, dsv);
                        store(dc + c, load(dc + c) + dsv);
                    }
                    if (gb != nullptr) add_by_column(gb, GR_buf.data(), g);
                    if (pw) {
                        const After a = after_terms(tab, h, hi, lo, i);
                        double* gw = pw_grads.data();
                        piecewise_grads(a, GR_buf.data(), g, np, EX_buf.data(), gw, gw + R + Tq + h * NS,
                                        gw + R + Tq + H * NS + h * NS, gw[R + i]);
                    }
                    if (gated) {
                        // hi_j's gradient: minus its column's sum; plus the row's sum at the query's own key
                        VT<T> rsum{};
                        for (int64_t c = 0; c < np; c += W) {
                            const VT<T> x = load(GR_buf.data() + c);
                            store(gc_buf.data() + c, load(gc_buf.data() + c) + x);
                            rsum += x;
                        }
                        rs_buf[i] = hsum<T>(rsum);
                    }
                    if (np + W <= Tkp) {
                        // a chunk of zeros past the block's keys: the four-key blocks down the columns read it
                        store(p + np, VT<T>{});
                        store(ds + np, VT<T>{});
                    }
                    if (val) by_column(PB + t * Rw, p, g);
                    if (rel) by_column(DR + t * Rw, ds, g);  // d rel_ir (zeros outside the row's columns)
                }
                if (rel) {
                    // dq_i += sum_r drel_ir E[r] (and the same into da), four rows at a time sharing
                    // each E[r] (one row at a time streamed the whole table from memory per row)
                    std::memset(DX, 0, sizeof(T) * nb * d_n);
                    rows.add_products(DX, d_n, DR, Rw, 1, E, d_n, nb, [this, i0](int64_t a, int64_t c, int64_t& t0, int64_t& t1) {
                        table_rows(i0 + a, i0 + c, t0, t1);
                    });
                    for (int64_t t = 0; t < nb; ++t) {
                        rows.axpy(dqb + (i0 + t) * st->dq[2], T(1), DX + t * d_n);
                        if (grads.query_bias != nullptr) rows.axpy(grads.query_bias + h * d_n, T(1), DX + t * d_n);
                    }
                }
                // dq_i += sum_j d z_ij k_j, four rows at a time
                rows.add_products(dqb + i0 * st->dq[2], st->dq[2], S, Tkp, 1, kb, ks, nb,
                                  [this, i0](int64_t a, int64_t, int64_t& t0, int64_t& t1) { t0 = 0; t1 = block_keys(i0 + a); });
                // down the columns, four keys at a time: query i sees key j from row i0(j) on (causal),
                // every row else (the rows of a group before its last key's i0 hold p = d z = 0 there);
                // the keys that no row of the block sees are skipped
                const int64_t last = i0 + nb - 1;
                const int64_t seen = causal ? (block_keys(last) < Tk ? block_keys(last) : Tk) : Tk;
                auto seen_by = [this, i0, nb](int64_t j0, int64_t, int64_t& t0, int64_t& t1) {
                    const int64_t first = causal && j0 - (Tk - Tq) > i0 ? j0 - (Tk - Tq) - i0 : 0;
                    t0 = first < nb ? first : nb;
                    t1 = nb;
                };
                rows.add_products(dvb, st->dv[2], P, 1, Tkp, dob + i0 * dos, dos, seen, seen_by);
                rows.add_products(dkb, st->dk[2], S, 1, Tkp, qb + i0 * qs, qs, seen, seen_by);
                // the table rows, four at a time: dE[r] += sum_i drel_ir (q_i + a), dF[r] += sum_i pb_ir dO_i
                // over the block's rows i that reach one of the four (the others' entries are 0)
                auto reaching = [this, i0, nb](int64_t r0, int64_t r1, int64_t& t0, int64_t& t1) {
                    t0 = Tq;
                    t1 = 0;
                    for (int64_t r = r0; r <= r1; ++r) {
                        int64_t ilo, ihi;
                        rows_reaching(r, ilo, ihi);
                        if (ihi < ilo) continue;
                        t0 = ilo < t0 ? ilo : t0;
                        t1 = ihi + 1 > t1 ? ihi + 1 : t1;
                    }
                    t0 = t0 - i0 < 0 ? 0 : (t0 - i0 > nb ? nb : t0 - i0);
                    t1 = t1 - i0 < t0 ? t0 : (t1 - i0 > nb ? nb : t1 - i0);
                };
                if (rel) rows.add_products(grads.key + eh * R * d_n, d_n, DR, 1, Rw, X, d_n, R, reaching);
                if (val) rows.add_products(grads.value, d_n, PB, 1, Rw, dob + i0 * dos, dos, R, reaching);
            }
            const T* u = tab.key_bias != nullptr ? tab.key_bias + h * d_n : nullptr;
            if (u != nullptr) {
                for (int64_t j = 0; j < Tk; ++j) rows.axpy(dkb + j * st->dk[2], dc[j], u);  // col_j = u . k_j
                rows.add_weighted_rows(grads.key_bias + h * d_n, dc, Tk, [=](int64_t j) { return kb + j * ks; });
            }
            if (gated) {
                T* dg = grads.gate + gi * Tk;
                for (int64_t j = 0; j < Tk; ++j) dg[j] -= gc_buf[j];
                for (int64_t i = 0; i < Tq; ++i)
                    if (i + Tk - Tq >= 0 && i + Tk - Tq < Tk) dg[i + Tk - Tq] += rs_buf[i];
            }
        }
        if (pw) {
            T* dst[4] = {grads.x_table, grads.x_den, grads.slopes, grads.intercepts};
            const int64_t n[4] = {R, Tq, H * NS, H * NS};
            const double* src = pw_grads.data();
            for (int part = 0; part < 4; src += n[part], ++part)
                for (int64_t e = 0; e < n[part]; ++e) dst[part][e] += static_cast<T>(src[e]);
        }
    }
};

template <class T, int DC>
Kernel<T, DC> make(int64_t Tq, int64_t Tk, int64_t D, int64_t R, int64_t offset, int causal, double scale,
                   const Strides* st) {
    return Kernel<T, DC>{Tq, Tk, D, R, offset, causal != 0, static_cast<T>(scale), st};
}

// The common head sizes get loops of known length (unrolled into whole vectors) in float32;
// float64 (the tests' gradcheck) takes the general loops only, which keeps the build short.
#define POSENC_BY_HEAD_DIM(T, CALL)                                             \
    switch (D) {                                                                \
        case 16: { auto kern = make<T, 16>(Tq, Tk, D, R, offset, causal, scale, st); CALL; break; } \
        case 32: { auto kern = make<T, 32>(Tq, Tk, D, R, offset, causal, scale, st); CALL; break; } \
        case 64: { auto kern = make<T, 64>(Tq, Tk, D, R, offset, causal, scale, st); CALL; break; } \
        default: { auto kern = make<T, 0>(Tq, Tk, D, R, offset, causal, scale, st); CALL; break; }  \
    }
#define POSENC_GENERAL(T, CALL)                                                 \
    {                                                                           \
        auto kern = make<T, 0>(Tq, Tk, D, R, offset, causal, scale, st);       \
        CALL;                                                                   \
    }

}  // namespace

extern "C" {

// dtype 0: float32, 1: float64. q (B, H, Tq, D), k and v (B, H, Tk, D), rows contiguous, strides
// (b, h, t) in `strides` (the Strides struct: q, k, v, out, dout, dq, dk, dv, 24 int64 in
// elements). key_table E (R, D), or (H, R, D) when key_per_head; query_bias a and key_bias u
// (H, D); value_table F (R, D); bias_table B (H, R); gate_hi and gate_lo (B, H, Tk) (both or
// neither): contiguous, each may be null. out (B, H, Tq, D) and lse
// (B H Tq,) are written. The piecewise term: x_table N (R,), x_den (Tq,), bends (pieces - 1,), slopes
// and intercepts (H, pieces), all present or x_table null. Handles the (b, h) slices g in [g_begin, g_end), g = b H + h.
// Returns 0, or -1 for an unknown dtype.
int posenc_relpos_forward(int dtype, int64_t H, int64_t Tq, int64_t Tk, int64_t D, int64_t R, int64_t offset,
                          int causal, double scale, const void* q, const void* k, const void* v, const void* key_table,
                          int key_per_head, const void* query_bias, const void* key_bias, const void* value_table,
                          const void* bias_table, const void* gate_hi, const void* gate_lo, const void* x_table,
                          const void* x_den, const void* bends, const void* slopes, const void* intercepts,
                          int64_t pieces, void* out, void* lse, const int64_t* strides, int64_t g_begin, int64_t g_end) {
    const Strides* st = reinterpret_cast<const Strides*>(strides);
#define POSENC_TABLES(T)                                                                                        \
    Tables<T> tab{static_cast<const T*>(key_table), key_per_head != 0, static_cast<const T*>(query_bias),     \
                  static_cast<const T*>(key_bias), static_cast<const T*>(value_table),                  \
                  static_cast<const T*>(bias_table), static_cast<const T*>(gate_hi), static_cast<const T*>(gate_lo),       \
                  static_cast<const T*>(x_table), static_cast<const T*>(x_den), static_cast<const T*>(bends),           \
                  static_cast<const T*>(slopes), static_cast<const T*>(intercepts), pieces}
    if (dtype == 0) {
        using T = float;
        POSENC_TABLES(T);
        POSENC_BY_HEAD_DIM(T, kern.forward(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                                           tab, static_cast<T*>(out), static_cast<T*>(lse), H, g_begin, g_end))
        return 0;
    }
    if (dtype == 1) {
        using T = double;
        POSENC_TABLES(T);
        POSENC_GENERAL(T, kern.forward(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                                           tab, static_cast<T*>(out), static_cast<T*>(lse), H, g_begin, g_end))
        return 0;
    }
    return -1;
}

// The backward of posenc_relpos_forward: dq, dk, dv (shapes of q, k, v) written; the tables'
// gradients added into `grads` (the caller zeroes it; one buffer per thread), laid out as the
// present tables one after the other: E's (its shape), a's (H, D), u's (H, D), F's (R, D), B's
// (H, R), the piecewise term's (N's (R,), den's (Tq,), slopes' and intercepts' (H, S); the bends
// have none), hi's (B, H, Tk) last (each (b, h) slice adds into its own row only).
// out and lse: the forward's; dout: the gradient of out.
int posenc_relpos_backward(int dtype, int64_t H, int64_t Tq, int64_t Tk, int64_t D, int64_t R, int64_t offset,
                           int causal, double scale, const void* q, const void* k, const void* v, const void* key_table,
                           int key_per_head, const void* query_bias, const void* key_bias, const void* value_table,
                           const void* bias_table, const void* gate_hi, const void* gate_lo, const void* x_table,
                           const void* x_den, const void* bends, const void* slopes, const void* intercepts,
                           int64_t pieces, const void* out, const void* lse, const void* dout, void* dq, void* dk, void* dv,
                           void* grads, const int64_t* strides, int64_t g_begin, int64_t g_end) {
    const Strides* st = reinterpret_cast<const Strides*>(strides);
#define POSENC_GRADS(T)                                                                                         \
    TableGrads<T> tg{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr}; \
    {                                                                                                            \
        T* next = static_cast<T*>(grads);                                                                        \
        if (key_table != nullptr) { tg.key = next; next += (key_per_head ? H : 1) * R * D; }                     \
        if (query_bias != nullptr) { tg.query_bias = next; next += H * D; }                                      \
        if (key_bias != nullptr) { tg.key_bias = next; next += H * D; }                                          \
        if (value_table != nullptr) { tg.value = next; next += R * D; }                                         \
        if (bias_table != nullptr) { tg.bias = next; next += H * R; }                                            \
        if (x_table != nullptr) {                                                                                \
            tg.x_table = next; next += R;                                                                        \
            tg.x_den = next; next += Tq;                                                                         \
            tg.slopes = next; next += H * pieces;                                                                \
            tg.intercepts = next; next += H * pieces;                                                            \
        }                                                                                                        \
        if (gate_hi != nullptr) { tg.gate = next; }                                                              \
    }
#define POSENC_BACKWARD_ARGS(T)                                                                                 \
    static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), tab,                          \
        static_cast<const T*>(out), static_cast<const T*>(lse), static_cast<const T*>(dout), static_cast<T*>(dq), \
        static_cast<T*>(dk), static_cast<T*>(dv), tg, H, g_begin, g_end
    if (dtype == 0) {
        using T = float;
        POSENC_TABLES(T);
        POSENC_GRADS(T);
        POSENC_BY_HEAD_DIM(T, kern.backward(POSENC_BACKWARD_ARGS(T)))
        return 0;
    }
    if (dtype == 1) {
        using T = double;
        POSENC_TABLES(T);
        POSENC_GRADS(T);
        POSENC_GENERAL(T, kern.backward(POSENC_BACKWARD_ARGS(T)))
        return 0;
    }
    return -1;
}

}  // extern "C"
