/* Float vectors as wide as the CPU's registers (GCC/Clang vector extensions, -march=native):
 * 16 lanes with AVX-512, 8 otherwise. Wider than the registers, GCC splits every operation
 * through the stack (measured on AVX2: decode attention ran 5-10x slower with 16 lanes).
 * Loads and stores of float32 and bfloat16 into them. bfloat16 is
 * the top half of a float32, so a load is a shift; a store rounds to nearest even, as torch
 * does, and keeps NaN a NaN. Shared by the native CPU kernels (the .c files beside it). */
#ifndef LORAGATE_CPU_SIMD_H
#define LORAGATE_CPU_SIMD_H
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define W 16
#else
#define W 8
#endif
typedef float vf __attribute__((vector_size(W * 4)));
typedef uint32_t vu __attribute__((vector_size(W * 4)));
typedef int32_t vi __attribute__((vector_size(W * 4)));
typedef uint16_t vh __attribute__((vector_size(W * 2)));
typedef uint16_t bf16;

static inline vf load_f32(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store_f32(float *p, vf v) { memcpy(p, &v, sizeof v); }

static inline vf load_bf16(const bf16 *p) {
    vh h;
    memcpy(&h, p, sizeof h);
    vu u = __builtin_convertvector(h, vu) << 16;
    vf v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static inline void store_bf16(bf16 *p, vf v) {
    vu u;
    memcpy(&u, &v, sizeof u);
    vu rounded = (u + (0x7fffu + ((u >> 16) & 1u))) >> 16;
    vu is_nan = (vu)(v != v);
    vu bits = (rounded & ~is_nan) | (0x7fc0u & is_nan);
    vh h = __builtin_convertvector(bits, vh);
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

static inline float hsum(vf v) {
    float s = 0.0f;
    for (int i = 0; i < W; ++i) s += v[i];
    return s;
}

/* The same sum as a tree (depth log2 W, not W - 1 dependent adds): for short dot products
 * such as one attention score, where the reduction's latency is most of the cost. */
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

static inline float hsum_tree(vf v) {
#if W == 16
    v8 lo, hi;
    memcpy(&lo, &v, sizeof lo);
    memcpy(&hi, (const char *)&v + sizeof lo, sizeof hi);
    const v8 s8 = lo + hi;
#else
    v8 s8;
    memcpy(&s8, &v, sizeof s8);
#endif
    v4 a, b;
    memcpy(&a, &s8, sizeof a);
    memcpy(&b, (const char *)&s8 + sizeof a, sizeof b);
    const v4 s4 = a + b;
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

static inline float hmax(vf v) {
    float m = v[0];
    for (int i = 1; i < W; ++i) m = v[i] > m ? v[i] : m;
    return m;
}

/* Lanes of a where mask is set (all ones), of b elsewhere. */
static inline vf vselect(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }

/* exp(x) per lane to about 2 ulp (Cephes' expf: 2^n times a degree-6 polynomial); exactly 0
 * below -87.3 (where expf is denormal or 0) and for -inf, so masked scores weigh nothing.
 * Inputs above 88 are clamped. No NaN inputs here. */
static inline vf vexp(vf x) {
    const vf zero = {0};
    const vi under = (vi)(x < -87.3365447505531f);
    x = vselect((vi)(x > 88.0f), zero + 88.0f, x);
    x = vselect(under, zero - 87.3365447505531f, x);
    const vf fx = x * 1.44269504088896341f + 0.5f;
    vf n = __builtin_convertvector(__builtin_convertvector(fx, vi), vf);
    n -= vselect((vi)(n > fx), zero + 1.0f, zero); /* floor(fx) */
    const vf r = x - n * 0.693359375f + n * 2.12194440e-4f;
    const vf z = r * r;
    vf y = 1.9875691500E-4f * r + 1.3981999507E-3f;
    y = y * r + 8.3334519073E-3f;
    y = y * r + 4.1665795894E-2f;
    y = y * r + 1.6666665459E-1f;
    y = y * r + 5.0000001201E-1f;
    y = y * z + r + 1.0f;
    const vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
    vf pow2;
    memcpy(&pow2, &bits, sizeof pow2);
    return vselect(under, zero, y * pow2);
}
#endif
