/* 16-lane float vectors (GCC/Clang vector extensions: AVX-512 registers with -march=native
 * where the CPU has them) and loads/stores of float32 and bfloat16 into them. bfloat16 is
 * the top half of a float32, so a load is a shift; a store rounds to nearest even, as torch
 * does, and keeps NaN a NaN. Shared by the native CPU kernels (the .c files beside it). */
#ifndef LORAGATE_CPU_SIMD_H
#define LORAGATE_CPU_SIMD_H
#include <stdint.h>
#include <string.h>

#define W 16
typedef float v16 __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint16_t bf16;

static inline v16 load_f32(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store_f32(float *p, v16 v) { memcpy(p, &v, sizeof v); }

static inline v16 load_bf16(const bf16 *p) {
    v16h h;
    memcpy(&h, p, sizeof h);
    v16u u = __builtin_convertvector(h, v16u) << 16;
    v16 v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static inline void store_bf16(bf16 *p, v16 v) {
    v16u u;
    memcpy(&u, &v, sizeof u);
    v16u rounded = (u + (0x7fffu + ((u >> 16) & 1u))) >> 16;
    v16u is_nan = (v16u)(v != v);
    v16u bits = (rounded & ~is_nan) | (0x7fc0u & is_nan);
    v16h h = __builtin_convertvector(bits, v16h);
    memcpy(p, &h, sizeof h);
}

static inline float get_f32(const float *p) { return *p; }
static inline void put_f32(float *p, float v) { *p = v; }

static inline float get_bf16(const bf16 *p) {
    uint32_t u = (uint32_t)*p << 16;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static inline void put_bf16(bf16 *p, float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    *p = v != v ? 0x7fc0u : (bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float hsum(v16 v) {
    float s = 0.0f;
    for (int i = 0; i < W; ++i) s += v[i];
    return s;
}

/* The same sum as a tree (depth 4, not 15 dependent adds): for short dot products such as
 * one attention score, where the reduction's latency is most of the cost. */
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

static inline float hsum_tree(v16 v) {
    v8 lo, hi;
    memcpy(&lo, &v, sizeof lo);
    memcpy(&hi, (const char *)&v + sizeof lo, sizeof hi);
    const v8 s8 = lo + hi;
    v4 a, b;
    memcpy(&a, &s8, sizeof a);
    memcpy(&b, (const char *)&s8 + sizeof a, sizeof b);
    const v4 s4 = a + b;
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

static inline float hmax(v16 v) {
    float m = v[0];
    for (int i = 1; i < W; ++i) m = v[i] > m ? v[i] : m;
    return m;
}

/* Lanes of a where mask is set (all ones), of b elsewhere. */
static inline v16 select16(v16i mask, v16 a, v16 b) { return (v16)(((v16i)a & mask) | ((v16i)b & ~mask)); }

/* exp(x) per lane to about 2 ulp (Cephes' expf: 2^n times a degree-6 polynomial); exactly 0
 * below -87.3 (where expf is denormal or 0) and for -inf, so masked scores weigh nothing.
 * Inputs above 88 are clamped. No NaN inputs here. */
static inline v16 exp16(v16 x) {
    const v16 zero = {0};
    const v16i under = (v16i)(x < -87.3365447505531f);
    x = select16((v16i)(x > 88.0f), zero + 88.0f, x);
    x = select16(under, zero - 87.3365447505531f, x);
    const v16 fx = x * 1.44269504088896341f + 0.5f;
    v16 n = __builtin_convertvector(__builtin_convertvector(fx, v16i), v16);
    n -= select16((v16i)(n > fx), zero + 1.0f, zero); /* floor(fx) */
    const v16 r = x - n * 0.693359375f + n * 2.12194440e-4f;
    const v16 z = r * r;
    v16 y = 1.9875691500E-4f * r + 1.3981999507E-3f;
    y = y * r + 8.3334519073E-3f;
    y = y * r + 4.1665795894E-2f;
    y = y * r + 1.6666665459E-1f;
    y = y * r + 5.0000001201E-1f;
    y = y * z + r + 1.0f;
    const v16i bits = (__builtin_convertvector(n, v16i) + 127) << 23;
    v16 pow2;
    memcpy(&pow2, &bits, sizeof pow2);
    return select16(under, zero, y * pow2);
}
#endif
