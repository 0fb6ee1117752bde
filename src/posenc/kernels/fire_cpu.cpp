// posenc's fused CPU forward of FIRE attention (Li et al., ICLR 2024): softmax(scale q.k^T + b) v
// with FIRE's bias b(h, i, j) = f_h(psi(i - j) / den(i)) computed inside the attention, tile by
// tile, as FlashAttention computes softmax (Dao et al. 2022, Algorithm 1; online softmax with a
// running maximum and sum per query row): no (H, Tq, Tk) bias or score tensor is written.
//
// Inputs made by posenc.kernels.fire_cpu (float32): psi(d) once per distance, the per-row
// normalizer den(i) = psi(max(L, i)) + eps, and FIRE's MLP as the piecewise-linear function it is
// (bends, per-head slopes and intercepts, float64). Per (query block, key block) tile x = psi / den
// is computed once for every head (the same division as the torch path's), and f_h is written
// from the tile's top segment over the K bends inside the tile's range of x:
//     f_h(x) = slope[h, top] x + intercept[h, top] + sum_k C[h, k] (beta_k - min(x, beta_k))
// (FIRE._piecewise_bias), K + 2 vector operations per score. Far from the diagonal a tile spans
// a narrow range of x, so K is mostly 0 or 1.
//
// Plain C++ (GCC vector extensions, no intrinsics, no torch header): the build takes seconds and
// the compiler picks the host's vector width (-march=native). Called through ctypes.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));

constexpr int BQ = 64;        // query rows per block
constexpr int BK = 64;        // keys per block
constexpr int NC = BK / 16;   // vectors per row of a tile
constexpr int MR = 4;         // rows per register block of the products

// every lane a (written out: `v16{} + a` costs a scalar add and a register shuffle per use)
inline v16 splat(float a) { return (v16){a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a}; }
inline v16 load(const float* p) { v16 r; std::memcpy(&r, p, sizeof r); return r; }
inline void store(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }
inline v16 vmin(v16 a, v16 b) { return a < b ? a : b; }
inline v16 vmax(v16 a, v16 b) { return a > b ? a : b; }
inline float hmax(v16 a) { float m = a[0]; for (int i = 1; i < 16; ++i) m = std::max(m, a[i]); return m; }
inline float hsum(v16 a) { float s = 0; for (int i = 0; i < 16; ++i) s += a[i]; return s; }

// exp(x) for x <= 0 (Cephes expf: round to n = x / ln 2, a degree-5 polynomial on the rest,
// 2^n by the exponent bits; about 1 ulp). x below log(FLT_MIN) (-inf included) gives 0.
inline v16 vexp(v16 x) {
    const v16 lo = splat(-87.33654f);
    vi16 under = x < lo;
    x = vmax(x, lo);
    const v16 magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
    v16 n = (x * splat(1.44269504088896341f) + magic) - magic;
    v16 r = x - n * splat(0.693359375f);
    r = r - n * splat(-2.12194440e-4f);
    v16 y = splat(1.9875691500e-4f);
    y = y * r + splat(1.3981999507e-3f);
    y = y * r + splat(8.3334519073e-3f);
    y = y * r + splat(4.1665795894e-2f);
    y = y * r + splat(1.6666665459e-1f);
    y = y * r + splat(5.0000001201e-1f);
    y = y * (r * r) + r + splat(1.0f);
    vi16 bits = (__builtin_convertvector(n, vi16) + 127) << 23;
    v16 two_n;
    std::memcpy(&two_n, &bits, sizeof two_n);
    y = y * two_n;
    return under ? splat(0.0f) : y;
}

struct Problem {
    const float* q;          // (BH, Tq, D), scaled here by `scale`
    const float* kt;         // (BH, D, Tkp): keys transposed, zero-padded to whole key blocks
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

// One tile's MLP for every head: f_h(x) = cst[h] + slope[h] x + sum_k w[h][k] min(x, cap[k]).
struct Pieces {
    int k = 0;
    std::vector<float> cst, slope, w, cap;
    explicit Pieces(int64_t heads, int64_t nb) : cst(heads), slope(heads), w(heads * (nb + 1)), cap(nb + 1) {}

    void make(const Problem& p, float low, float high) {
        const double* b = p.bends;
        int first = static_cast<int>(std::upper_bound(b, b + p.nb, static_cast<double>(low)) - b);
        int top = static_cast<int>(std::upper_bound(b, b + p.nb, static_cast<double>(high)) - b);
        k = top - first;
        const int64_t s = p.nb + 1;
        for (int i = 0; i < k; ++i) cap[i] = static_cast<float>(b[first + i]);
        for (int64_t h = 0; h < p.heads; ++h) {
            const double* sl = p.slopes + h * s;
            double c = p.intercepts[h * s + top];
            for (int i = 0; i < k; ++i) {
                double hinge = sl[first + i + 1] - sl[first + i];
                c += hinge * b[first + i];
                w[h * s + i] = static_cast<float>(-hinge);
            }
            cst[h] = static_cast<float>(c);
            slope[h] = static_cast<float>(sl[top]);
        }
    }
};

template <int D>
void run_block(const Problem& p, int64_t qb, std::vector<float>& qbuf, std::vector<float>& obuf,
               std::vector<float>& mrow, std::vector<float>& lrow, float* x, float* s, Pieces& pieces) {
    constexpr int DV = D / 16;
    const int64_t q0 = qb * BQ;
    const int nq = static_cast<int>(std::min<int64_t>(BQ, p.tq - q0));
    const int rows = (nq + MR - 1) / MR * MR;
    const int64_t offset = p.tk - p.tq;
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int64_t bh = 0; bh < p.bh; ++bh) {
        float* qd = qbuf.data() + bh * BQ * D;
        const float* src = p.q + (bh * p.tq + q0) * D;
        for (int r = 0; r < BQ; ++r)
            for (int d = 0; d < D; ++d) qd[r * D + d] = r < nq ? src[r * D + d] * p.scale : 0.0f;
        std::fill(obuf.begin() + bh * BQ * D, obuf.begin() + (bh + 1) * BQ * D, 0.0f);
        std::fill(mrow.begin() + bh * BQ, mrow.begin() + (bh + 1) * BQ, ninf);
        std::fill(lrow.begin() + bh * BQ, lrow.begin() + (bh + 1) * BQ, 0.0f);
    }
    const int64_t kend = p.causal ? std::min<int64_t>(p.tk, q0 + nq + offset) : p.tk;
    const v16 iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    int64_t limit[BQ];  // the last visible key of each row
    for (int r = 0; r < BQ; ++r) {
        int64_t i = std::min<int64_t>(q0 + r, p.tq - 1);
        limit[r] = p.causal ? std::min<int64_t>(i + offset, p.tk - 1) : p.tk - 1;
    }
    for (int64_t k0 = 0; k0 < kend; k0 += BK) {
        const int kc = static_cast<int>(std::min<int64_t>(BK, kend - k0));
        // x of the tile, shared by the heads, and its range (rows past Tq repeat the last row)
        v16 lo = splat(std::numeric_limits<float>::infinity()), hi = -lo;
        for (int r = 0; r < rows; ++r) {
            int64_t i = std::min<int64_t>(q0 + r, p.tq - 1);
            const float* ps = p.psi + (p.tq - 1 - i) + k0;
            v16 dv = splat(p.den[i]);
            for (int c = 0; c < NC; ++c) {
                v16 xv = load(ps + c * 16) / dv;
                store(x + r * BK + c * 16, xv);
                lo = vmin(lo, xv);
                hi = vmax(hi, xv);
            }
        }
        float low = -hmax(-lo), high = hmax(hi);
        pieces.make(p, low, high);
        const bool masked = k0 + BK - 1 > limit[0] || kc < BK;
        for (int64_t bh = 0; bh < p.bh; ++bh) {
            const int64_t h = bh % p.heads;
            const int64_t s_ = p.nb + 1;
            const float cst = pieces.cst[h], slope = pieces.slope[h];
            const float* w = pieces.w.data() + h * s_;
            const float* cap = pieces.cap.data();
            const int nk = pieces.k;
            const float* qd = qbuf.data() + bh * BQ * D;
            const float* kt = p.kt + bh * D * p.tkp + k0;
            float* m = mrow.data() + bh * BQ;
            float* l = lrow.data() + bh * BQ;
            float* o = obuf.data() + bh * BQ * D;
            // scores: (rows, BK) = q (rows, D) x kt (D, BK) + bias, masked; row maxima
            for (int r0 = 0; r0 < rows; r0 += MR) {
                v16 acc[MR][NC];
                for (int r = 0; r < MR; ++r)
                    for (int c = 0; c < NC; ++c) acc[r][c] = splat(0.0f);
                for (int d = 0; d < D; ++d) {
                    v16 kv[NC];
                    for (int c = 0; c < NC; ++c) kv[c] = load(kt + d * p.tkp + c * 16);
                    for (int r = 0; r < MR; ++r) {
                        v16 a = splat(qd[(r0 + r) * D + d]);
                        for (int c = 0; c < NC; ++c) acc[r][c] += a * kv[c];
                    }
                }
                for (int r = 0; r < MR; ++r) {
                    const int row = r0 + r;
                    v16 top = splat(ninf);
                    const v16 last = splat(static_cast<float>(std::min<int64_t>(limit[row] - k0, kc - 1)));
                    for (int c = 0; c < NC; ++c) {
                        v16 xv = load(x + row * BK + c * 16);
                        v16 b = splat(cst) + splat(slope) * xv;
                        for (int j = 0; j < nk; ++j) b += splat(w[j]) * vmin(xv, splat(cap[j]));
                        v16 sv = acc[r][c] + b;
                        if (masked) sv = (iota + splat(static_cast<float>(c * 16))) > last ? splat(ninf) : sv;
                        store(s + row * BK + c * 16, sv);
                        top = vmax(top, sv);
                    }
                    // online softmax: new maximum, rescale the running sum and output row
                    const float m_new = std::max(m[row], hmax(top));
                    const float alpha = m[row] == ninf ? 0.0f : std::exp(m[row] - m_new);
                    const v16 mv = splat(m_new);
                    v16 sum = splat(0.0f);
                    for (int c = 0; c < NC; ++c) {
                        v16 pv = vexp(load(s + row * BK + c * 16) - mv);
                        store(s + row * BK + c * 16, pv);
                        sum += pv;
                    }
                    l[row] = l[row] * alpha + hsum(sum);
                    m[row] = m_new;
                    if (alpha != 1.0f)
                        for (int d = 0; d < DV; ++d) store(o + row * D + d * 16, load(o + row * D + d * 16) * splat(alpha));
                }
            }
            // o (rows, D) += P (rows, kc) x v (kc, D)
            const float* vv = p.v + (bh * p.tk + k0) * D;
            for (int r0 = 0; r0 < rows; r0 += MR) {
                v16 acc[MR][DV];
                for (int r = 0; r < MR; ++r)
                    for (int d = 0; d < DV; ++d) acc[r][d] = load(o + (r0 + r) * D + d * 16);
                for (int j = 0; j < kc; ++j) {
                    v16 vr[DV];
                    for (int d = 0; d < DV; ++d) vr[d] = load(vv + j * D + d * 16);
                    for (int r = 0; r < MR; ++r) {
                        v16 a = splat(s[(r0 + r) * BK + j]);
                        for (int d = 0; d < DV; ++d) acc[r][d] += a * vr[d];
                    }
                }
                for (int r = 0; r < MR; ++r)
                    for (int d = 0; d < DV; ++d) store(o + (r0 + r) * D + d * 16, acc[r][d]);
            }
        }
    }
    for (int64_t bh = 0; bh < p.bh; ++bh) {
        const float* o = obuf.data() + bh * BQ * D;
        const float* l = lrow.data() + bh * BQ;
        float* dst = p.out + (bh * p.tq + q0) * D;
        for (int r = 0; r < nq; ++r) {
            const float inv = 1.0f / l[r];
            for (int d = 0; d < D; ++d) dst[r * D + d] = o[r * D + d] * inv;
        }
    }
}

template <int D>
void run(const Problem& p, int64_t part, int64_t parts) {
    std::vector<float> qbuf(p.bh * BQ * D), obuf(p.bh * BQ * D), mrow(p.bh * BQ), lrow(p.bh * BQ);
    std::vector<float> x(BQ * BK), s(BQ * BK);
    Pieces pieces(p.heads, p.nb);
    const int64_t blocks = (p.tq + BQ - 1) / BQ;
    // blocks taken round-robin: under a causal mask later blocks see more keys
    for (int64_t qb = part; qb < blocks; qb += parts) run_block<D>(p, qb, qbuf, obuf, mrow, lrow, x.data(), s.data(), pieces);
}

}  // namespace

extern "C" {

// The key-block width the caller pads the transposed keys and the psi table to.
int posenc_fire_cpu_block_keys() { return BK; }

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
