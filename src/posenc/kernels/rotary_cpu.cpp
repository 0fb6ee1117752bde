// posenc's fused CPU rotation (RoPE, half-split or interleaved pairs): one pass over memory per
// element. Each row is loaded in its own dtype, rotated in float32 registers and stored once,
// rounded to the output dtype (round-to-nearest-even, as torch rounds). Compiled at first use
// by posenc.kernels.rotary_cpu (torch.utils.cpp_extension, -O3 -march=native) and called through
// ctypes: this file includes no torch header, so the build takes seconds, not a minute.
//
// The arithmetic is the torch path's (posenc/kernels/rotary_torch.py, _rotate_pairs), operation
// for operation: out_1 = x_1 c_1 - x_2 s_1 and out_2 = x_2 c_2 + x_1 s_2, the product with cos
// rounded to float32 and the sin term added by one fused multiply-add when torch's addcmul_
// fuses it on this CPU (POSENC_ROTARY_FMA = 1, probed by the Python side before the build),
// else a rounded product and an add. So the results are bit-identical to the torch path.

#include <cstdint>
#include <cstring>
#include <cmath>

#ifndef POSENC_ROTARY_FMA
#define POSENC_ROTARY_FMA 1
#endif

namespace {

// acc + a * s, fused or not as torch's addcmul_ is on this CPU.
inline float add_product(float acc, float a, float s) {
#if POSENC_ROTARY_FMA
    return std::fma(a, s, acc);
#else
    return acc + a * s;
#endif
}

inline float bf16_to_f32(uint16_t v) {
    uint32_t u = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Round to nearest even, as c10::BFloat16; a NaN stays a (quiet) NaN.
inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return (u & 0x7FFFFFFFu) > 0x7F800000u ? static_cast<uint16_t>(0x7FC0u) : static_cast<uint16_t>(rounded);
}

struct F32 {
    using T = float;
    static inline float load(float v) { return v; }
    static inline float store(float v) { return v; }
};
struct BF16 {
    using T = uint16_t;
    static inline float load(uint16_t v) { return bf16_to_f32(v); }
    static inline uint16_t store(float v) { return f32_to_bf16(v); }
};
#ifdef __FLT16_MANT_DIG__
struct F16 {
    using T = _Float16;
    static inline float load(_Float16 v) { return static_cast<float>(v); }
    static inline _Float16 store(float v) { return static_cast<_Float16>(v); }
};
#endif

// One row of D = 2h values, pairs (j, j + h) (half-split) or (2j, 2j + 1) (interleaved). x and
// out may be the same row (an in-place rotation): both members of a pair are read before either
// is written, and no other element is touched.
template <class K, bool Interleaved>
inline void rotate_row(const typename K::T* x, typename K::T* out, const float* c, const float* s, int64_t h) {
    constexpr int64_t step = Interleaved ? 2 : 1;
    const int64_t second = Interleaved ? 1 : h;
#pragma GCC ivdep
    for (int64_t j = 0; j < h; ++j) {
        const int64_t i1 = j * step, i2 = j * step + second;
        const float a = K::load(x[i1]);
        const float b = K::load(x[i2]);
        const float o1 = add_product(a * c[i1], -b, s[i1]);
        const float o2 = add_product(b * c[i2], a, s[i2]);
        out[i1] = K::store(o1);
        out[i2] = K::store(o2);
    }
}

// Rows t in [t_begin, t_end) of heads g in [g_begin, g_end) of x viewed as (n0, n1, T, D);
// strides in elements, the last dimension contiguous. Rows go in blocks of `block` positions
// across every head, so that a block of cos and sin stays in L1 while all heads read it.
template <class K, bool Interleaved>
void rotate_rows(const void* xv, void* ov, const float* c, const float* s, int64_t n1, int64_t D,
                 const int64_t* xs, const int64_t* os, const int64_t* cs, const int64_t* ss,
                 int64_t g_begin, int64_t g_end, int64_t t_begin, int64_t t_end, int64_t block) {
    using T = typename K::T;
    const T* x = static_cast<const T*>(xv);
    T* out = static_cast<T*>(ov);
    const int64_t h = D / 2;
    for (int64_t t0 = t_begin; t0 < t_end; t0 += block) {
        const int64_t t1 = t0 + block < t_end ? t0 + block : t_end;
        for (int64_t g = g_begin; g < g_end; ++g) {
            const int64_t i0 = g / n1, i1 = g % n1;
            const T* xr = x + i0 * xs[0] + i1 * xs[1];
            T* orow = out + i0 * os[0] + i1 * os[1];
            const float* cr = c + i0 * cs[0] + i1 * cs[1];
            const float* sr = s + i0 * ss[0] + i1 * ss[1];
            // The common head sizes get a loop of known length (fully unrolled, no remainder).
            if (h == 64) {
                for (int64_t t = t0; t < t1; ++t) {
                    rotate_row<K, Interleaved>(xr + t * xs[2], orow + t * os[2], cr + t * cs[2], sr + t * ss[2], 64);
                }
            } else if (h == 32) {
                for (int64_t t = t0; t < t1; ++t) {
                    rotate_row<K, Interleaved>(xr + t * xs[2], orow + t * os[2], cr + t * cs[2], sr + t * ss[2], 32);
                }
            } else {
                for (int64_t t = t0; t < t1; ++t) {
                    rotate_row<K, Interleaved>(xr + t * xs[2], orow + t * os[2], cr + t * cs[2], sr + t * ss[2], h);
                }
            }
        }
    }
}

template <bool Interleaved>
int dispatch(int dtype, const void* x, void* out, const float* cos, const float* sin, int64_t n1, int64_t D,
             const int64_t* st, int64_t g_begin, int64_t g_end, int64_t t_begin, int64_t t_end, int64_t block) {
    switch (dtype) {
        case 0:
            rotate_rows<F32, Interleaved>(x, out, cos, sin, n1, D, st, st + 3, st + 6, st + 9, g_begin, g_end,
                                          t_begin, t_end, block);
            return 0;
        case 1:
            rotate_rows<BF16, Interleaved>(x, out, cos, sin, n1, D, st, st + 3, st + 6, st + 9, g_begin, g_end,
                                           t_begin, t_end, block);
            return 0;
#ifdef __FLT16_MANT_DIG__
        case 2:
            rotate_rows<F16, Interleaved>(x, out, cos, sin, n1, D, st, st + 3, st + 6, st + 9, g_begin, g_end,
                                          t_begin, t_end, block);
            return 0;
#endif
        default:
            return -1;
    }
}

}  // namespace

extern "C" {

// dtype: 0 float32, 1 bfloat16, 2 float16; strides: x's, out's, cos's and sin's strides over
// (n0, n1, T), in elements, 12 in all. Returns 0 when done, -1 for a dtype this build lacks.
int posenc_rotary_cpu(int dtype, int interleaved, const void* x, void* out, const float* cos, const float* sin,
                      int64_t n1, int64_t D, const int64_t* strides, int64_t g_begin, int64_t g_end, int64_t t_begin,
                      int64_t t_end, int64_t block) {
    if (interleaved) {
        return dispatch<true>(dtype, x, out, cos, sin, n1, D, strides, g_begin, g_end, t_begin, t_end, block);
    }
    return dispatch<false>(dtype, x, out, cos, sin, n1, D, strides, g_begin, g_end, t_begin, t_end, block);
}

// Which dtypes this build rotates (bit i: dtype i above).
int posenc_rotary_cpu_dtypes() {
#ifdef __FLT16_MANT_DIG__
    return 7;
#else
    return 3;
#endif
}

}  // extern "C"
