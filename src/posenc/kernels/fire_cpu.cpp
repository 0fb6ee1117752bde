// posenc's fused CPU forward of FIRE attention (Li et al., ICLR 2024): softmax(scale q.k^T + b) v
// with FIRE's bias b(h, i, j) = f_h(psi(i - j) / den(i)) computed inside the attention, tile by
// tile, as FlashAttention computes softmax (Dao et al. 2022, Algorithm 1; an online softmax
// with a running maximum and sum per query row): no (H, Tq, Tk) bias or score tensor is written.
//
// Inputs made by posenc.kernels.fire_cpu (float32): psi(d) once per distance, the per-row
// normalizer den(i) = psi(max(L, i)) + eps, and FIRE's MLP as the piecewise-linear function it is
// (bends, per-head slopes and intercepts, float64). In the epilogue of each score's product,
// x = psi * (1 / den) (one multiply per score; within an ulp of the torch path's division), and
// f_h written from the tile's top segment over the K bends inside the tile's range of x:
//     f_h(x) = slope[h, top] x + intercept[h, top] + sum_k C[h, k] (beta_k - min(x, beta_k))
// (FIRE._piecewise_bias): K + 2 vector operations per score. The range, and so K, is found once
// per (query block, key block) for every head from psi's extremes over the block's distances and
// the extremes of 1 / den; far from the diagonal a block spans a narrow range of x, and K is
// mostly 0 or 1.
//
// Plain C++ (GCC vector extensions; one AVX-512 intrinsic where the host has it; no torch
// header): the build takes seconds and the compiler picks the host's vector width
// (-march=native). Called through ctypes.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));

#ifndef POSENC_FIRE_BQ
#define POSENC_FIRE_BQ 128
#endif
// Query rows per block: each block reads the keys and values of its past once per head, so
// larger blocks read them less often; smaller ones waste less of the diagonal. Timed against
// bias-free SDPA (one thread, H = 8, D = 64): 64 / 128 / 256 rows 0.86 / 0.84 / 0.88x at
// T = 2048, 1.04 / 0.99 / 0.95x at T = 8192.
constexpr int BQ = POSENC_FIRE_BQ;
static_assert(BQ % 8 == 0, "query blocks of whole register blocks");
constexpr int BK = 64;        // keys per block
constexpr int NC = BK / 16;   // vectors per row of a tile
constexpr int MR = 4;         // rows per register block of the products
constexpr float RESCALE = 8.0f;  // see the online softmax below

// every lane a (written out: `v16{} + a` costs a scalar add and a register shuffle per use)
inline v16 splat(float a) { return (v16){a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a}; }
inline v16 load(const float* p) { v16 r; std::memcpy(&r, p, sizeof r); return r; }
inline void store(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }
inline v16 vmin(v16 a, v16 b) { return a < b ? a : b; }
inline v16 vmax(v16 a, v16 b) { return a > b ? a : b; }
// horizontal max and sum: four halvings
inline float hmax(v16 a) {
    a = vmax(a, __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
    a = vmax(a, __builtin_shufflevector(a, a, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
    a = vmax(a, __builtin_shufflevector(a, a, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
    a = vmax(a, __builtin_shufflevector(a, a, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
    return a[0];
}
inline float hsum(v16 a) { float s = 0; for (int i = 0; i < 16; ++i) s += a[i]; return s; }

// exp(x) for x <= 8 (Cephes expf: n = round(x / ln 2), a degree-6 polynomial for exp of the rest
// r = x - n ln 2 in [-ln 2 / 2, ln 2 / 2], times 2^n; about 1 ulp). x below log(FLT_MIN)
// (-inf included) gives 0. With AVX-512, 2^n by vscalefps (two instructions fewer).
inline v16 exp_rest(v16 r) {
    v16 y = splat(1.9875691500e-4f);
    y = y * r + splat(1.3981999507e-3f);
    y = y * r + splat(8.3334519073e-3f);
    y = y * r + splat(4.1665795894e-2f);
    y = y * r + splat(1.6666665459e-1f);
    y = y * r + splat(5.0000001201e-1f);
    return y * (r * r) + r + splat(1.0f);
}

inline v16 vexp(v16 x) {
    const v16 lo = splat(-87.33654f);
    const v16 magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
#if defined(__AVX512F__)
    __m512 xv = reinterpret_cast<__m512>(x);
    __mmask16 keep = _mm512_cmp_ps_mask(xv, reinterpret_cast<__m512>(lo), _CMP_GE_OQ);
    v16 n = (x * splat(1.44269504088896341f) + magic) - magic;
    v16 r = x - n * splat(0.693359375f);
    r = r - n * splat(-2.12194440e-4f);
    return reinterpret_cast<v16>(_mm512_maskz_scalef_ps(keep, reinterpret_cast<__m512>(exp_rest(r)),
                                                        reinterpret_cast<__m512>(n)));
#else
    vi16 under = x < lo;
    x = vmax(x, lo);
    v16 n = (x * splat(1.44269504088896341f) + magic) - magic;
    v16 r = x - n * splat(0.693359375f);
    r = r - n * splat(-2.12194440e-4f);
    vi16 bits = (__builtin_convertvector(n, vi16) + 127) << 23;
    v16 two_n;
    std::memcpy(&two_n, &bits, sizeof two_n);
    return under ? splat(0.0f) : exp_rest(r) * two_n;
#endif
}

struct Problem {
    const float* q;          // (BH, Tq, D), scaled here by `scale`
    const float* kt;         // (BH, Tkp / BK, D, BK): each key block transposed, zero-padded
    const float* v;          // (BH, Tk, D)
    float* out;              // (BH, Tq, D)
    int64_t bh, heads, tq, tk, tkp;
    const float* psi;        // psi(q_pos[i] - k_pos[j]) at m = (Tq - 1 - i) + j, m < Tq + Tkp - 1
    const float* den;        // (Tq,)
    const double* bends;     // (nb,) sorted
    int64_t nb;
    const double* slopes;    // (heads, nb + 1)
    const double* intercepts;
    float scale;
    int causal;              // key j visible to query i iff j <= i + Tk - Tq
};

// The bends inside one tile's range of x: first .. top - 1 (searchsorted, right).
struct Span {
    int first, top;
};

inline Span span_of(const Problem& p, float low, float high) {
    const double* b = p.bends;
    return {static_cast<int>(std::upper_bound(b, b + p.nb, static_cast<double>(low)) - b),
            static_cast<int>(std::upper_bound(b, b + p.nb, static_cast<double>(high)) - b)};
}

// One head's MLP on one tile: f(x) = cst + slope x + sum_k w[k] min(x, cap[k]) (float64 sums).
struct Pieces {
    int k = 0;
    float cst = 0, slope = 0;
    std::vector<float> w, cap;
    explicit Pieces(int64_t nb) : w(nb + 1), cap(nb + 1) {}

    void make(const Problem& p, int64_t h, Span span) {
        const double* b = p.bends;
        const double* sl = p.slopes + h * (p.nb + 1);
        double c = p.intercepts[h * (p.nb + 1) + span.top];
        k = span.top - span.first;
        for (int i = 0; i < k; ++i) {
            double hinge = sl[span.first + i + 1] - sl[span.first + i];
            c += hinge * b[span.first + i];
            w[i] = static_cast<float>(-hinge);
            cap[i] = static_cast<float>(b[span.first + i]);
        }
        cst = static_cast<float>(c);
        slope = static_cast<float>(sl[span.top]);
    }
};

// Rows of the P V product per register block: MR_PV x (D / 16) accumulators, at most 16.
template <int D>
constexpr int mr_pv() { return D >= 128 ? 2 : (D == 64 ? 4 : 8); }

// One block of BQ query rows, every head, written to out.
template <int D>
void run_block(const Problem& p, int64_t qb, float* qd, float* o, float* s, float* rinv, std::vector<Span>& spans,
               Pieces& pieces) {
    constexpr int DV = D / 16;
    constexpr int MP = mr_pv<D>();
    const int64_t q0 = qb * BQ;
    const int nq = static_cast<int>(std::min<int64_t>(BQ, p.tq - q0));
    const int rows = (nq + 7) / 8 * 8;  // whole register blocks of both products (MR and MP divide 8)
    const int64_t offset = p.tk - p.tq;
    const float ninf = -std::numeric_limits<float>::infinity();
    const int64_t kend = p.causal ? std::min<int64_t>(p.tk, q0 + nq + offset) : p.tk;
    const v16 iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    int64_t limit[BQ];  // the last visible key of each row (rows past Tq repeat the last row)
    int64_t base[BQ];   // psi's index of each row's key 0
    for (int r = 0; r < BQ; ++r) {
        int64_t i = std::min<int64_t>(q0 + r, p.tq - 1);
        limit[r] = p.causal ? std::min<int64_t>(i + offset, p.tk - 1) : p.tk - 1;
        base[r] = p.tq - 1 - i;
        rinv[r] = 1.0f / p.den[i];
    }
    // each key block's bends, shared by the heads: x = psi * rinv over the block lies within
    // [min psi * min rinv, max psi * max rinv] (psi >= 0, rinv > 0; rounding is monotone)
    float rlo = rinv[0], rhi = rinv[0];
    for (int r = 1; r < nq; ++r) rlo = std::min(rlo, rinv[r]), rhi = std::max(rhi, rinv[r]);
    spans.clear();
    for (int64_t k0 = 0; k0 < kend; k0 += BK) {
        const float* ps = p.psi + base[nq - 1] + k0;
        const int64_t n = (base[0] - base[nq - 1]) + BK;
        float lo = ps[0], hi = ps[0];
        for (int64_t m = 1; m < n; ++m) lo = std::min(lo, ps[m]), hi = std::max(hi, ps[m]);
        spans.push_back(span_of(p, lo * rlo, hi * rhi));
    }
    for (int64_t bh = 0; bh < p.bh; ++bh) {
        const int64_t h = bh % p.heads;
        const float* src = p.q + (bh * p.tq + q0) * D;
        for (int r = 0; r < BQ; ++r)
            for (int d = 0; d < D; ++d) qd[r * D + d] = r < nq ? src[r * D + d] * p.scale : 0.0f;
        std::fill(o, o + BQ * D, 0.0f);
        float m[BQ];
        v16 l[BQ];  // each row's running sum, lane by lane: one horizontal sum at the end
        std::fill(m, m + BQ, ninf);
        std::fill(l, l + BQ, splat(0.0f));
        for (int64_t k0 = 0; k0 < kend; k0 += BK) {
            const int kc = static_cast<int>(std::min<int64_t>(BK, kend - k0));
            const bool masked = k0 + BK - 1 > limit[0] || kc < BK;
            pieces.make(p, h, spans[k0 / BK]);
            const float cst = pieces.cst, slope = pieces.slope;
            const float* w = pieces.w.data();
            const float* cap = pieces.cap.data();
            const int nk = pieces.k;
            const float* kt = p.kt + (bh * p.tkp + k0) * D;
            // scores (rows, BK) = q (rows, D) x kt (D, BK) + bias, masked; then the online
            // softmax of each row: new maximum, the running sum and output row rescaled
            for (int r0 = 0; r0 < rows; r0 += MR) {
                v16 acc[MR][NC];
                for (int r = 0; r < MR; ++r)
                    for (int c = 0; c < NC; ++c) acc[r][c] = splat(0.0f);
                for (int d = 0; d < D; ++d) {
                    v16 kv[NC];
                    for (int c = 0; c < NC; ++c) kv[c] = load(kt + d * BK + c * 16);
                    for (int r = 0; r < MR; ++r) {
                        v16 a = splat(qd[(r0 + r) * D + d]);
                        for (int c = 0; c < NC; ++c) acc[r][c] += a * kv[c];
                    }
                }
                for (int r = 0; r < MR; ++r) {
                    const int row = r0 + r;
                    const float* ps = p.psi + base[row] + k0;
                    const v16 ri = splat(rinv[row]);
                    v16 top = splat(ninf);
                    const v16 last = splat(static_cast<float>(std::min<int64_t>(limit[row] - k0, kc - 1)));
                    for (int c = 0; c < NC; ++c) {
                        v16 xv = load(ps + c * 16) * ri;
                        v16 b = splat(cst) + splat(slope) * xv;
                        for (int j = 0; j < nk; ++j) b += splat(w[j]) * vmin(xv, splat(cap[j]));
                        acc[r][c] += b;
                        if (masked) acc[r][c] = (iota + splat(static_cast<float>(c * 16))) > last ? splat(ninf) : acc[r][c];
                        top = vmax(top, acc[r][c]);
                    }
                    // the row's reference maximum moves only when a score passes it by more than
                    // RESCALE: most tiles then rescale nothing (the result is the same for any
                    // reference; exp stays below e^RESCALE, far from overflow)
                    const float mx = hmax(top);
                    if (mx > m[row] + RESCALE) {
                        const float alpha = m[row] == ninf ? 0.0f : std::exp(m[row] - mx);
                        l[row] = l[row] * splat(alpha);
                        for (int d = 0; d < DV; ++d) store(o + row * D + d * 16, load(o + row * D + d * 16) * splat(alpha));
                        m[row] = mx;
                    }
                    const v16 mv = splat(m[row]);
                    v16 sum = l[row];
                    for (int c = 0; c < NC; ++c) {
                        v16 pv = vexp(acc[r][c] - mv);
                        store(s + row * BK + c * 16, pv);
                        sum += pv;
                    }
                    l[row] = sum;
                }
            }
            // o (rows, D) += P (rows, kc) x v (kc, D)
            const float* vv = p.v + (bh * p.tk + k0) * D;
            for (int r0 = 0; r0 < rows; r0 += MP) {
                v16 acc[MP][DV];
                for (int r = 0; r < MP; ++r)
                    for (int d = 0; d < DV; ++d) acc[r][d] = load(o + (r0 + r) * D + d * 16);
                for (int j = 0; j < kc; ++j) {
                    v16 vr[DV];
                    for (int d = 0; d < DV; ++d) vr[d] = load(vv + j * D + d * 16);
                    for (int r = 0; r < MP; ++r) {
                        v16 a = splat(s[(r0 + r) * BK + j]);
                        for (int d = 0; d < DV; ++d) acc[r][d] += a * vr[d];
                    }
                }
                for (int r = 0; r < MP; ++r)
                    for (int d = 0; d < DV; ++d) store(o + (r0 + r) * D + d * 16, acc[r][d]);
            }
        }
        float* dst = p.out + (bh * p.tq + q0) * D;
        for (int r = 0; r < nq; ++r) {
            const float inv = 1.0f / hsum(l[r]);
            for (int d = 0; d < D; ++d) dst[r * D + d] = o[r * D + d] * inv;
        }
    }
}

template <int D>
void run(const Problem& p, int64_t part, int64_t parts) {
    std::vector<float> qd(BQ * D), o(BQ * D), s(BQ * BK), rinv(BQ);
    std::vector<Span> spans;
    Pieces pieces(p.nb);
    const int64_t blocks = (p.tq + BQ - 1) / BQ;
    // blocks taken round-robin: under a causal mask later blocks see more keys
    for (int64_t qb = part; qb < blocks; qb += parts)
        run_block<D>(p, qb, qd.data(), o.data(), s.data(), rinv.data(), spans, pieces);
}

}  // namespace

extern "C" {

// The key-block width the caller pads the transposed keys and the psi table to.
int posenc_fire_cpu_block_keys() { return BK; }

// The query-block height (the unit the caller splits across threads).
int posenc_fire_cpu_block_queries() { return BQ; }

// Returns 0, or -1 for a head size this build has no kernel for (the caller then keeps its path).
int posenc_fire_attention_cpu(const float* q, const float* kt, const float* v, float* out, int64_t bh, int64_t heads,
                              int64_t tq, int64_t tk, int64_t tkp, int64_t head_dim, const float* psi, const float* den,
                              const double* bends, int64_t nb, const double* slopes, const double* intercepts,
                              float scale, int causal, int64_t part, int64_t parts) {
    Problem p{q, kt, v, out, bh, heads, tq, tk, tkp, psi, den, bends, nb, slopes, intercepts, scale, causal};
    switch (head_dim) {
        case 32: run<32>(p, part, parts); return 0;
        case 64: run<64>(p, part, parts); return 0;
        case 128: run<128>(p, part, parts); return 0;
        default: return -1;
    }
}

}  // extern "C"
