/* Products with weights in llama.cpp's block formats and loragate's integer ones
 * (kernels/quant_blocks.py says the layouts), on the CPU: y[r, n] = sum_k x[r, k] w[n, k] (+ bias[n]), each block of w read
 * once in its quantized form and dequantized in registers, the activations kept in float32
 * (never quantized). Every weight is the float32 value the `gguf` package dequantizes it to
 * (a scale times an integer is exact in float32; where a min is added, one rounding, as
 * there), so the sums differ from a float32 matmul over the dequantized weight only in their
 * order. Two paths, chosen per call: 8-lane vectors (GCC vector extensions; AVX2 and FMA
 * with -march=native on x86) and plain scalar loops, each the other's cross-check.
 * Also: rows dequantized into float32 (the panels prefill-sized products multiply, and
 * embedding lookups). Built by kernels/quant_cpu.py.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, I8_CH, I4_G32, I4_G64, I4_G128, NUM_FORMATS };
static const int BLOCK_SIZE[NUM_FORMATS] = {32, 32, 32, 32, 32, 256, 256, 256, 32, 32, 64, 128};
static const int BLOCK_BYTES[NUM_FORMATS] = {18, 20, 22, 24, 34, 144, 176, 210, 32, 21, 37, 69};
/* I8_CH rows start with their float32 scale; every other format's rows are blocks alone. */
#define ROW_HEADER(fmt) ((fmt) == I8_CH ? 4 : 0)
#define IS_K_QUANT(fmt) ((fmt) >= Q4_K && (fmt) <= Q6_K)
#define MAX_BLOCK 256
#define ROWS 4 /* activation rows sharing one dequantized block */

#include "half_float.h"

static inline float f32_at(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

/* Q4_K / Q5_K: the eight 6-bit scales and mins of a block's 12 bytes. */
static inline void k_scales(const uint8_t *q, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 4; ++j) {
        sc[j] = q[j] & 63;
        mn[j] = q[j + 4] & 63;
        sc[j + 4] = (q[j + 8] & 0x0F) | ((q[j] >> 6) << 4);
        mn[j + 4] = (q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4);
    }
}

/* ---- the scalar path: one weight at a time --------------------------------------------- */
/* Block ``blk`` of the row starting at ``row``, as float32 weights. */
static void dequant_block_scalar(int fmt, const uint8_t *row, int64_t blk, float *out) {
    const uint8_t *b = row + ROW_HEADER(fmt) + blk * BLOCK_BYTES[fmt];
    switch (fmt) {
    case Q4_0:
    case Q4_1:
    case Q5_0:
    case Q5_1: {
        const int has_min = fmt == Q4_1 || fmt == Q5_1, five = fmt == Q5_0 || fmt == Q5_1;
        const float d = half_to_float(b), m = has_min ? half_to_float(b + 2) : 0.0f;
        const uint8_t *qh = b + (has_min ? 4 : 2);
        const uint8_t *qs = qh + (five ? 4 : 0);
        uint32_t high = 0;
        if (five) memcpy(&high, qh, 4);
        const int offset = has_min ? 0 : (five ? 16 : 8);
        for (int j = 0; j < 32; ++j) {
            int q = j < 16 ? qs[j] & 0x0F : qs[j - 16] >> 4;
            if (five) q |= (int)((high >> j) & 1u) << 4;
            out[j] = has_min ? d * (float)q + m : d * (float)(q - offset);
        }
        break;
    }
    case Q8_0: {
        const float d = half_to_float(b);
        for (int j = 0; j < 32; ++j) out[j] = d * (float)(int8_t)b[2 + j];
        break;
    }
    case Q4_K:
    case Q5_K: {
        const float d = half_to_float(b), dmin = half_to_float(b + 2);
        uint8_t sc[8], mn[8];
        k_scales(b + 4, sc, mn);
        const uint8_t *qh = b + 16, *qs = b + (fmt == Q5_K ? 48 : 16);
        for (int j = 0; j < 8; ++j) {
            const float ds = d * (float)sc[j], dm = dmin * (float)mn[j];
            for (int l = 0; l < 32; ++l) {
                int q = (qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0x0F;
                if (fmt == Q5_K) q |= ((qh[l] >> j) & 1) << 4;
                out[j * 32 + l] = ds * (float)q - dm;
            }
        }
        break;
    }
    case Q6_K: {
        const float d = half_to_float(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int e = 0; e < 256; ++e) {
            const int half = e / 128, s = (e % 128) / 32, l = e % 32;
            const uint8_t lowbyte = b[half * 64 + (s % 2) * 32 + l];
            const int low = s < 2 ? lowbyte & 0x0F : lowbyte >> 4;
            const int high = (b[128 + half * 32 + l] >> (2 * s)) & 3;
            out[e] = d * (float)sc[e / 16] * (float)((low | high << 4) - 32);
        }
        break;
    }
    case I8_CH: {
        const float d = f32_at(row);
        for (int j = 0; j < 32; ++j) out[j] = d * (float)(int8_t)b[j];
        break;
    }
    case I4_G32:
    case I4_G64:
    case I4_G128: {
        const int bs = BLOCK_SIZE[fmt], half = bs / 2;
        const float d = f32_at(b);
        const int z = b[4];
        for (int j = 0; j < bs; ++j) {
            const int q = j < half ? b[5 + j] & 0x0F : b[5 + j - half] >> 4;
            out[j] = (float)(q - z) * d;
        }
        break;
    }
    }
}

/* ---- the vector path: eight weights per operation --------------------------------------- */
typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));
typedef uint32_t u8v __attribute__((vector_size(32)));
typedef uint8_t b8 __attribute__((vector_size(8)));
typedef int8_t s8 __attribute__((vector_size(8)));

/* Eight bytes to eight int32 lanes: one instruction with AVX2 (GCC lowers the generic
 * conversion of an 8-byte vector one lane at a time). */
#if defined(__AVX2__)
#include <immintrin.h>
static inline i8 widen(const uint8_t *p) {
    return (i8)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

static inline i8 widen_signed(const uint8_t *p) {
    return (i8)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
#else
static inline i8 widen(const uint8_t *p) {
    b8 v;
    memcpy(&v, p, 8);
    return __builtin_convertvector(v, i8);
}

static inline i8 widen_signed(const uint8_t *p) {
    s8 v;
    memcpy(&v, p, 8);
    return __builtin_convertvector(v, i8);
}
#endif

static inline f8 to_f8(i8 v) { return __builtin_convertvector(v, f8); }
static inline void put8(float *p, f8 v) { memcpy(p, &v, 32); }
static inline f8 get8(const float *p) {
    f8 v;
    memcpy(&v, p, 32);
    return v;
}

static const i8 LANE = {0, 1, 2, 3, 4, 5, 6, 7};

/* Weights 0-31 of a 32-weight block from its nibbles (and fifth bits, 0 where none). */
static inline void small_block(const uint8_t *qs, uint32_t high, f8 d, f8 m, int offset,
                               float *out) {
    for (int g = 0; g < 4; ++g) {
        i8 q = widen(qs + (g % 2) * 8);
        q = g < 2 ? q & 0x0F : q >> 4;
        const u8v bits = ((u8v){0} + high) >> (u8v)(LANE + 8 * g);
        q |= (i8)((bits & 1u) << 4);
        put8(out + 8 * g, d * to_f8(q - offset) + m);
    }
}

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Weights ``group``/2 .. of an int4 group: 8 bytes of nibbles give 8 low and 8 high. */
ALWAYS_INLINE void int4_group(const uint8_t *b, const int bs, float *out) {
    const f8 d = (f8){0} + f32_at(b);
    const i8 z = (i8){0} + (int32_t)b[4];
    const int half = bs / 2;
    for (int g = 0; g < half; g += 8) {
        const i8 q = widen(b + 5 + g);
        put8(out + g, to_f8((q & 0x0F) - z) * d);
        put8(out + half + g, to_f8((q >> 4) - z) * d);
    }
}

/* Block ``blk`` of the row starting at ``row``, as float32 weights. */
ALWAYS_INLINE void dequant_block_vector(const int fmt, const uint8_t *row, const int64_t blk,
                                        float *out) {
    const f8 zero = {0};
    const uint8_t *b = row + ROW_HEADER(fmt) + blk * BLOCK_BYTES[fmt];
    switch (fmt) {
    case Q4_0:
        small_block(b + 2, 0, zero + half_to_float(b), zero, 8, out);
        break;
    case Q4_1:
        small_block(b + 4, 0, zero + half_to_float(b), zero + half_to_float(b + 2), 0, out);
        break;
    case Q5_0: {
        uint32_t high;
        memcpy(&high, b + 2, 4);
        small_block(b + 6, high, zero + half_to_float(b), zero, 16, out);
        break;
    }
    case Q5_1: {
        uint32_t high;
        memcpy(&high, b + 4, 4);
        small_block(b + 8, high, zero + half_to_float(b), zero + half_to_float(b + 2), 0, out);
        break;
    }
    case Q8_0: {
        const f8 d = zero + half_to_float(b);
        for (int g = 0; g < 4; ++g) put8(out + 8 * g, d * to_f8(widen_signed(b + 2 + 8 * g)));
        break;
    }
    case Q4_K:
    case Q5_K: {
        const float d = half_to_float(b), dmin = half_to_float(b + 2);
        uint8_t sc[8], mn[8];
        k_scales(b + 4, sc, mn);
        const uint8_t *qh = b + 16, *qs = b + (fmt == Q5_K ? 48 : 16);
        for (int j = 0; j < 8; ++j) {
            const f8 ds = zero + d * (float)sc[j], dm = zero + dmin * (float)mn[j];
            const uint8_t *chunk = qs + (j / 2) * 32;
            for (int g = 0; g < 4; ++g) {
                i8 q = (widen(chunk + 8 * g) >> (4 * (j % 2))) & 0x0F;
                if (fmt == Q5_K) q |= ((widen(qh + 8 * g) >> j) & 1) << 4;
                put8(out + 32 * j + 8 * g, ds * to_f8(q) - dm);
            }
        }
        break;
    }
    case Q6_K: {
        const float d = half_to_float(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int half = 0; half < 2; ++half) {
            const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
            for (int s = 0; s < 4; ++s) {
                for (int g = 0; g < 4; ++g) {
                    const int e = 128 * half + 32 * s + 8 * g;
                    i8 low = widen(ql + (s % 2) * 32 + 8 * g);
                    low = s < 2 ? low & 0x0F : low >> 4;
                    const i8 high = (widen(qh + 8 * g) >> (2 * s)) & 3;
                    const f8 ds = zero + d * (float)sc[e / 16];
                    put8(out + e, ds * to_f8((low | high << 4) - 32));
                }
            }
        }
        break;
    }
    case I8_CH: {
        const f8 d = zero + f32_at(row);
        for (int g = 0; g < 4; ++g) put8(out + 8 * g, d * to_f8(widen_signed(b + 8 * g)));
        break;
    }
    case I4_G32:
        int4_group(b, 32, out);
        break;
    case I4_G64:
        int4_group(b, 64, out);
        break;
    case I4_G128:
        int4_group(b, 128, out);
        break;
    }
}

/* Sub-block j (weights 32 j .. 32 j + 31) of a k-quant block, into four registers: ds / dm
 * hold the block's scales (d times each 6-bit scale, dmin times each min; Q6_K: d times each
 * of its sixteen int8 scales), decoded once per block. The same values as
 * dequant_block_vector's. */
ALWAYS_INLINE void k_sub_block(const int fmt, const uint8_t *b, const int j, const float *ds,
                               const float *dm, f8 w[4]) {
    const f8 zero = {0};
    if (fmt == Q6_K) {
        const uint8_t *ql = b + 64 * (j / 4) + 32 * (j % 2), *qh = b + 128 + 32 * (j / 4);
        const int s = j % 4;
        for (int g = 0; g < 4; ++g) {
            i8 low = widen(ql + 8 * g);
            low = s < 2 ? low & 0x0F : low >> 4;
            const i8 high = (widen(qh + 8 * g) >> (2 * s)) & 3;
            w[g] = (zero + ds[2 * j + g / 2]) * to_f8((low | high << 4) - 32);
        }
        return;
    }
    const uint8_t *qh = b + 16, *chunk = b + (fmt == Q5_K ? 48 : 16) + (j / 2) * 32;
    for (int g = 0; g < 4; ++g) {
        i8 q = (widen(chunk + 8 * g) >> (4 * (j % 2))) & 0x0F;
        if (fmt == Q5_K) q |= ((widen(qh + 8 * g) >> j) & 1) << 4;
        w[g] = (zero + ds[j]) * to_f8(q) - (zero + dm[j]);
    }
}

/* A k-quant block's scales as k_sub_block takes them. */
ALWAYS_INLINE void k_block_scales(const int fmt, const uint8_t *b, float *ds, float *dm) {
    if (fmt == Q6_K) {
        const float d = half_to_float(b + 208);
        for (int i = 0; i < 16; ++i) ds[i] = d * (float)(int8_t)b[192 + i];
        return;
    }
    const float d = half_to_float(b), dmin = half_to_float(b + 2);
    uint8_t sc[8], mn[8];
    k_scales(b + 4, sc, mn);
    for (int j = 0; j < 8; ++j) {
        ds[j] = d * (float)sc[j];
        dm[j] = dmin * (float)mn[j];
    }
}

/* y[r, n] for rows r0..r0+rows (rows <= ROWS) and one output n, from its row of blocks;
 * inlined once per format, so the block's size, bytes and layout are constants. Two
 * accumulators per row keep the additions from waiting on each other. */
ALWAYS_INLINE void dot_rows_vector(const int fmt, const uint8_t *wrow, int64_t k,
                                   const float *x, int64_t ldx, const int rows, float *sums) {
    const int bs = BLOCK_SIZE[fmt], bb = BLOCK_BYTES[fmt]; /* constants once inlined */
    f8 acc[ROWS][2] = {{{0}}};
    float w[MAX_BLOCK] __attribute__((aligned(32)));
    const int64_t blocks = k / bs;
    if (IS_K_QUANT(fmt)) { /* k-quants: each sub-block dequantized in registers and used there */
        float ds[16], dm[8];
        for (int64_t blk = 0; blk < blocks; ++blk) {
            const uint8_t *b = wrow + blk * bb;
            k_block_scales(fmt, b, ds, dm);
#pragma GCC unroll 8
            for (int j = 0; j < 8; ++j) {
                f8 v[4];
                k_sub_block(fmt, b, j, ds, dm, v);
                for (int r = 0; r < rows; ++r) {
                    const float *xr = x + r * ldx + blk * bs + 32 * j;
                    acc[r][0] += v[0] * get8(xr) + v[2] * get8(xr + 16);
                    acc[r][1] += v[1] * get8(xr + 8) + v[3] * get8(xr + 24);
                }
            }
        }
    }
    for (int64_t blk = 0; !IS_K_QUANT(fmt) && blk < blocks; ++blk) {
        dequant_block_vector(fmt, wrow, blk, w);
        for (int r = 0; r < rows; ++r) {
            const float *xr = x + r * ldx + blk * bs;
            for (int i = 0; i < bs; i += 16) {
                acc[r][0] += get8(w + i) * get8(xr + i);
                acc[r][1] += get8(w + i + 8) * get8(xr + i + 8);
            }
        }
    }
    for (int r = 0; r < rows; ++r) {
        const f8 a = acc[r][0] + acc[r][1];
        float s = 0.0f;
        for (int i = 0; i < 8; ++i) s += a[i];
        sums[r] = s;
    }
}

static inline void dot_rows_scalar(int fmt, const uint8_t *wrow, int64_t k, const float *x,
                                   int64_t ldx, int rows, float *sums) {
    const int bs = BLOCK_SIZE[fmt];
    float w[MAX_BLOCK];
    for (int r = 0; r < rows; ++r) sums[r] = 0.0f;
    for (int64_t kb = 0; kb < k; kb += bs) {
        dequant_block_scalar(fmt, wrow, kb / bs, w);
        for (int r = 0; r < rows; ++r) {
            const float *xr = x + r * ldx + kb;
            float s = sums[r];
            for (int i = 0; i < bs; ++i) s += w[i] * xr[i];
            sums[r] = s;
        }
    }
}

/* y [m, n] (row stride ldy) = x [m, k] (row stride ldx) times w^T, w [n, k] as rows of
 * blocks row_stride bytes apart; bias [n] or NULL. vector: 1 for the vector path, 0 for
 * the scalar one. Returns 0, or -1 for an unknown format or k not whole blocks. */
/* One function per format, each with its own parallel loop: GCC outlines an OpenMP region
 * before it inlines, so a format passed into a shared region would stay a variable. */
#define DEFINE_LINEAR_VECTOR(F)                                                               \
    static void linear_vector_##F(const float *x, int64_t ldx, int64_t m, int64_t k,          \
                                  const uint8_t *w, int64_t row_stride, int64_t n,            \
                                  const float *bias, float *y, int64_t ldy, int threads) {    \
        _Pragma("omp parallel for num_threads(threads) schedule(static) if (threads > 1 && m * n * k > 65536)") \
        for (int64_t j = 0; j < n; ++j) {                                                     \
            float sums[ROWS];                                                                 \
            for (int64_t r0 = 0; r0 < m; r0 += ROWS) {                                        \
                const int rows = m - r0 < ROWS ? (int)(m - r0) : ROWS;                        \
                const uint8_t *wj = w + j * row_stride;                                       \
                const float *xr = x + r0 * ldx;                                               \
                switch (rows) { /* a constant count: the accumulators stay in registers */    \
                case 1: dot_rows_vector(F, wj, k, xr, ldx, 1, sums); break;                   \
                case 2: dot_rows_vector(F, wj, k, xr, ldx, 2, sums); break;                   \
                case 3: dot_rows_vector(F, wj, k, xr, ldx, 3, sums); break;                   \
                default: dot_rows_vector(F, wj, k, xr, ldx, 4, sums); break;                  \
                }                                                                             \
                for (int r = 0; r < rows; ++r)                                                \
                    y[(r0 + r) * ldy + j] = bias ? sums[r] + bias[j] : sums[r];               \
            }                                                                                 \
        }                                                                                     \
    }
DEFINE_LINEAR_VECTOR(Q4_0)
DEFINE_LINEAR_VECTOR(Q4_1)
DEFINE_LINEAR_VECTOR(Q5_0)
DEFINE_LINEAR_VECTOR(Q5_1)
DEFINE_LINEAR_VECTOR(Q8_0)
DEFINE_LINEAR_VECTOR(Q4_K)
DEFINE_LINEAR_VECTOR(Q5_K)
DEFINE_LINEAR_VECTOR(Q6_K)
DEFINE_LINEAR_VECTOR(I8_CH)
DEFINE_LINEAR_VECTOR(I4_G32)
DEFINE_LINEAR_VECTOR(I4_G64)
DEFINE_LINEAR_VECTOR(I4_G128)

static void linear_scalar(int fmt, const float *x, int64_t ldx, int64_t m, int64_t k,
                          const uint8_t *w, int64_t row_stride, int64_t n, const float *bias,
                          float *y, int64_t ldy, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && m * n * k > 65536)
    for (int64_t j = 0; j < n; ++j) {
        float sums[ROWS];
        for (int64_t r0 = 0; r0 < m; r0 += ROWS) {
            const int rows = m - r0 < ROWS ? (int)(m - r0) : ROWS;
            dot_rows_scalar(fmt, w + j * row_stride, k, x + r0 * ldx, ldx, rows, sums);
            for (int r = 0; r < rows; ++r)
                y[(r0 + r) * ldy + j] = bias ? sums[r] + bias[j] : sums[r];
        }
    }
}

/* ---- the AVX-512 path: sixteen weights per operation ------------------------------------
 * Compiled for AVX-512 (F, BW, VL) whatever -march says, and run only where the CPU has it
 * (kernels/quant_cpu.py reads the flags): every format dequantized sixteen lanes at a time
 * into the same float32 values as the other paths (the k-quants a 32-weight sub-block at a
 * time, in registers), and multiplied in sixteen lanes. */
#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_AVX512_PATH 1
#include <immintrin.h>
#define AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define AVX512_INLINE static inline __attribute__((always_inline)) AVX512_FN
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));

AVX512_INLINE v16i widen16(const uint8_t *p) {
    return (v16i)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}

AVX512_INLINE v16i widen16_signed(const uint8_t *p) {
    return (v16i)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
}

AVX512_INLINE v16f to_v16f(v16i v) { return __builtin_convertvector(v, v16f); }
AVX512_INLINE void put16(float *p, v16f v) { memcpy(p, &v, 64); }
AVX512_INLINE v16f get16(const float *p) {
    v16f v;
    memcpy(&v, p, 64);
    return v;
}

/* Q4_0 .. Q5_1: 16 bytes of nibbles (and 32 fifth bits, 0 where none) -> 32 weights. */
AVX512_INLINE void small_block16(const uint8_t *qs, uint32_t high, float d, float m,
                                 int offset, float *out) {
    const v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const v16i q = widen16(qs);
    const v16f dv = (v16f){0} + d, mv = (v16f){0} + m;
    for (int h = 0; h < 2; ++h) {
        v16i v = h == 0 ? q & 0x0F : q >> 4;
        const v16u bits = ((v16u){0} + high) >> (v16u)(lane + 16 * h);
        v |= (v16i)((bits & 1u) << 4);
        put16(out + 16 * h, dv * to_v16f(v - offset) + mv);
    }
}

AVX512_INLINE void int4_group16(const uint8_t *b, const int bs, float *out) {
    const v16f d = (v16f){0} + f32_at(b);
    const v16i z = (v16i){0} + (int32_t)b[4];
    const int half = bs / 2;
    for (int g = 0; g < half; g += 16) {
        const v16i q = widen16(b + 5 + g);
        put16(out + g, to_v16f((q & 0x0F) - z) * d);
        put16(out + half + g, to_v16f((q >> 4) - z) * d);
    }
}

/* k_sub_block in sixteen lanes: sub-block j of a k-quant block as two registers. */
AVX512_INLINE void k_sub_block16(const int fmt, const uint8_t *b, const int j, const float *ds,
                                 const float *dm, v16f w[2]) {
    if (fmt == Q6_K) {
        const uint8_t *ql = b + 64 * (j / 4) + 32 * (j % 2), *qh = b + 128 + 32 * (j / 4);
        const int s = j % 4;
        for (int g = 0; g < 2; ++g) {
            v16i low = widen16(ql + 16 * g);
            low = s < 2 ? low & 0x0F : low >> 4;
            const v16i high = (widen16(qh + 16 * g) >> (2 * s)) & 3;
            w[g] = ((v16f){0} + ds[2 * j + g]) * to_v16f((low | high << 4) - 32);
        }
        return;
    }
    const uint8_t *qh = b + 16, *chunk = b + (fmt == Q5_K ? 48 : 16) + (j / 2) * 32;
    for (int g = 0; g < 2; ++g) {
        v16i q = (widen16(chunk + 16 * g) >> (4 * (j % 2))) & 0x0F;
        if (fmt == Q5_K) q |= ((widen16(qh + 16 * g) >> j) & 1) << 4;
        w[g] = ((v16f){0} + ds[j]) * to_v16f(q) - ((v16f){0} + dm[j]);
    }
}

/* Block ``blk`` of the row at ``row`` as float32 weights. */
AVX512_INLINE void dequant_block_v16(const int fmt, const uint8_t *row, const int64_t blk,
                                     float *out) {
    const uint8_t *b = row + ROW_HEADER(fmt) + blk * BLOCK_BYTES[fmt];
    uint32_t high;
    switch (fmt) {
    case Q4_0:
        small_block16(b + 2, 0, half_to_float(b), 0.0f, 8, out);
        break;
    case Q4_1:
        small_block16(b + 4, 0, half_to_float(b), half_to_float(b + 2), 0, out);
        break;
    case Q5_0:
        memcpy(&high, b + 2, 4);
        small_block16(b + 6, high, half_to_float(b), 0.0f, 16, out);
        break;
    case Q5_1:
        memcpy(&high, b + 4, 4);
        small_block16(b + 8, high, half_to_float(b), half_to_float(b + 2), 0, out);
        break;
    case Q8_0:
    case I8_CH: {
        const v16f d = (v16f){0} + (fmt == Q8_0 ? half_to_float(b) : f32_at(row));
        const uint8_t *q = fmt == Q8_0 ? b + 2 : b;
        for (int g = 0; g < 2; ++g) put16(out + 16 * g, d * to_v16f(widen16_signed(q + 16 * g)));
        break;
    }
    case I4_G32:
        int4_group16(b, 32, out);
        break;
    case I4_G64:
        int4_group16(b, 64, out);
        break;
    case I4_G128:
        int4_group16(b, 128, out);
        break;
    case Q4_K:
    case Q5_K:
    case Q6_K: {
        float ds[16], dm[8];
        k_block_scales(fmt, b, ds, dm);
        for (int j = 0; j < 8; ++j) {
            v16f v[2];
            k_sub_block16(fmt, b, j, ds, dm, v);
            put16(out + 32 * j, v[0]);
            put16(out + 32 * j + 16, v[1]);
        }
        break;
    }
    }
}

/* Each row's two accumulators summed across their lanes. */
AVX512_INLINE void row_sums16(v16f acc[ROWS][2], const int rows, float *sums) {
    for (int r = 0; r < rows; ++r) {
        const v16f a = acc[r][0] + acc[r][1];
        float s = 0.0f;
        for (int i = 0; i < 16; ++i) s += a[i];
        sums[r] = s;
    }
}

/* The k-quants' sums: each sub-block dequantized in registers and used there. */
AVX512_INLINE void dot_rows_v16_k(const int fmt, const uint8_t *wrow, int64_t k, const float *x,
                                  int64_t ldx, const int rows, float *sums) {
    v16f acc[ROWS][2];
    for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = (v16f){0};
    float ds[16], dm[8];
    for (int64_t blk = 0; blk < k / 256; ++blk) {
        const uint8_t *b = wrow + blk * BLOCK_BYTES[fmt];
        k_block_scales(fmt, b, ds, dm);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
            v16f v[2];
            k_sub_block16(fmt, b, j, ds, dm, v);
            for (int r = 0; r < rows; ++r) {
                const float *xr = x + r * ldx + blk * 256 + 32 * j;
                acc[r][0] += v[0] * get16(xr);
                acc[r][1] += v[1] * get16(xr + 16);
            }
        }
    }
    row_sums16(acc, rows, sums);
}

/* The 4-bit formats' sums (Q4_0, Q4_1, I4_G*): a block's (or group's) sixteen possible
 * weights, one per nibble value, are one register (Q4_0: d (i - 8); Q4_1: d i + m; I4_G*:
 * d (i - z)), and each 16 bytes of nibbles become two registers of weights by permuting it
 * (vpermps reads an index's low four bits: the low nibbles need no mask), used where they
 * are made. The same values as dequantizing, in fewer instructions: at one row the product
 * was bound by them, not by memory. */
AVX512_INLINE __m512 nibble_table16(const int fmt, const uint8_t *b) {
    const v16i nibble = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    switch (fmt) {
    case Q4_0:
        return (__m512)(to_v16f(nibble - 8) * half_to_float(b));
    case Q4_1:
        return (__m512)(to_v16f(nibble) * half_to_float(b) + half_to_float(b + 2));
    default: /* I4_G*: d f32, z u8 */
        return (__m512)(to_v16f(nibble - (int32_t)b[4]) * f32_at(b));
    }
}

AVX512_INLINE void dot_rows_v16_nibbles(const int fmt, const uint8_t *wrow, int64_t k,
                                        const float *x, int64_t ldx, const int rows,
                                        float *sums) {
    const int bs = BLOCK_SIZE[fmt], half = bs / 2;
    const int at = fmt == Q4_0 ? 2 : fmt == Q4_1 ? 4 : 5; /* where the nibbles start */
    v16f acc[ROWS][2];
    for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = (v16f){0};
    for (int64_t blk = 0; blk < k / bs; ++blk) {
        const uint8_t *b = wrow + blk * BLOCK_BYTES[fmt];
        const __m512 table = nibble_table16(fmt, b);
        for (int g = 0; g < half; g += 16) {
            const v16i q = widen16(b + at + g);
            const v16f low = (v16f)_mm512_permutexvar_ps((__m512i)q, table);
            const v16f high = (v16f)_mm512_permutexvar_ps((__m512i)(q >> 4), table);
            for (int r = 0; r < rows; ++r) {
                const float *xr = x + r * ldx + blk * bs;
                acc[r][0] += low * get16(xr + g);
                acc[r][1] += high * get16(xr + half + g);
            }
        }
    }
    row_sums16(acc, rows, sums);
}

/* dot_rows_vector's sums in sixteen lanes, two accumulators per row. */
AVX512_INLINE void dot_rows_v16(const int fmt, const uint8_t *wrow, int64_t k, const float *x,
                                int64_t ldx, const int rows, float *sums) {
    if (IS_K_QUANT(fmt)) {
        dot_rows_v16_k(fmt, wrow, k, x, ldx, rows, sums);
        return;
    }
    if (fmt == Q4_0 || fmt == Q4_1 || fmt == I4_G32 || fmt == I4_G64 || fmt == I4_G128) {
        dot_rows_v16_nibbles(fmt, wrow, k, x, ldx, rows, sums);
        return;
    }
    const int bs = BLOCK_SIZE[fmt];
    v16f acc[ROWS][2];
    for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = (v16f){0};
    float w[MAX_BLOCK] __attribute__((aligned(64)));
    for (int64_t blk = 0; blk < k / bs; ++blk) {
        dequant_block_v16(fmt, wrow, blk, w);
        for (int r = 0; r < rows; ++r) {
            const float *xr = x + r * ldx + blk * bs;
            for (int i = 0; i < bs; i += 32) {
                acc[r][0] += get16(w + i) * get16(xr + i);
                acc[r][1] += get16(w + i + 16) * get16(xr + i + 16);
            }
        }
    }
    row_sums16(acc, rows, sums);
}

#define DEFINE_LINEAR_V16(F)                                                                  \
    AVX512_FN static void linear_v16_##F(const float *x, int64_t ldx, int64_t m, int64_t k,   \
                                         const uint8_t *w, int64_t row_stride, int64_t n,     \
                                         const float *bias, float *y, int64_t ldy,            \
                                         int threads) {                                       \
        _Pragma("omp parallel for num_threads(threads) schedule(static) if (threads > 1 && m * n * k > 65536)") \
        for (int64_t j = 0; j < n; ++j) {                                                     \
            float sums[ROWS];                                                                 \
            for (int64_t r0 = 0; r0 < m; r0 += ROWS) {                                        \
                const int rows = m - r0 < ROWS ? (int)(m - r0) : ROWS;                        \
                const uint8_t *wj = w + j * row_stride;                                       \
                const float *xr = x + r0 * ldx;                                               \
                switch (rows) {                                                               \
                case 1: dot_rows_v16(F, wj, k, xr, ldx, 1, sums); break;                      \
                case 2: dot_rows_v16(F, wj, k, xr, ldx, 2, sums); break;                      \
                case 3: dot_rows_v16(F, wj, k, xr, ldx, 3, sums); break;                      \
                default: dot_rows_v16(F, wj, k, xr, ldx, 4, sums); break;                     \
                }                                                                             \
                for (int r = 0; r < rows; ++r)                                                \
                    y[(r0 + r) * ldy + j] = bias ? sums[r] + bias[j] : sums[r];               \
            }                                                                                 \
        }                                                                                     \
    }

#define DEFINE_DEQUANTIZE_V16(F, BS)                                                          \
    AVX512_FN static void dequantize_v16_##F(const uint8_t *w, int64_t row_stride, int64_t n,  \
                                             int64_t k, float *out, int64_t ldo,              \
                                             int threads) {                                   \
        _Pragma("omp parallel for num_threads(threads) schedule(static) if (threads > 1 && n * k > 65536)") \
        for (int64_t j = 0; j < n; ++j)                                                       \
            for (int64_t blk = 0; blk < k / BS; ++blk)                                        \
                dequant_block_v16(F, w + j * row_stride, blk, out + j * ldo + blk * BS);      \
    }

#define V16_FORMATS(X) X(Q4_0, 32) X(Q4_1, 32) X(Q5_0, 32) X(Q5_1, 32) X(Q8_0, 32) \
    X(Q4_K, 256) X(Q5_K, 256) X(Q6_K, 256) X(I8_CH, 32) X(I4_G32, 32) X(I4_G64, 64)  \
    X(I4_G128, 128)
#define LINEAR_V16(F, BS) DEFINE_LINEAR_V16(F)
#define DEQUANTIZE_V16(F, BS) DEFINE_DEQUANTIZE_V16(F, BS)
V16_FORMATS(LINEAR_V16)
V16_FORMATS(DEQUANTIZE_V16)

/* Runs the 16-lane path for ``fmt``: 1 if it ran, 0 for a format without one. */
static int linear_v16(int fmt, const float *x, int64_t ldx, int64_t m, int64_t k,
                      const uint8_t *w, int64_t row_stride, int64_t n, const float *bias,
                      float *y, int64_t ldy, int threads) {
#define CASE(F, BS)                                                            \
    case F:                                                                    \
        linear_v16_##F(x, ldx, m, k, w, row_stride, n, bias, y, ldy, threads); \
        return 1;
    switch (fmt) { V16_FORMATS(CASE) }
#undef CASE
    return 0;
}

static int dequantize_v16(int fmt, const uint8_t *w, int64_t row_stride, int64_t n, int64_t k,
                          float *out, int64_t ldo, int threads) {
#define CASE(F, BS)                                                      \
    case F:                                                              \
        dequantize_v16_##F(w, row_stride, n, k, out, ldo, threads);      \
        return 1;
    switch (fmt) { V16_FORMATS(CASE) }
#undef CASE
    return 0;
}
#else
#define HAVE_AVX512_PATH 0
static int linear_v16(int fmt, const float *x, int64_t ldx, int64_t m, int64_t k,
                      const uint8_t *w, int64_t row_stride, int64_t n, const float *bias,
                      float *y, int64_t ldy, int threads) {
    return 0;
}
static int dequantize_v16(int fmt, const uint8_t *w, int64_t row_stride, int64_t n, int64_t k,
                          float *out, int64_t ldo, int threads) {
    return 0;
}
#endif

/* Whether this build has the AVX-512 path (x86 with GCC's target attributes). */
int quant_has_avx512_path(void) { return HAVE_AVX512_PATH; }

/* y [m, n] (row stride ldy) = x [m, k] (row stride ldx) times w^T, w [n, k] as rows of
 * blocks row_stride bytes apart; bias [n] or NULL. vector: the path, 2 the AVX-512 one (where
 * the build has it; the 8-lane path otherwise), 1 the 8-lane vector path, 0 the scalar one.
 * Returns 0, or -1 for an unknown format or k not whole blocks. */
int quant_linear(int fmt, const float *x, int64_t ldx, int64_t m, int64_t k, const uint8_t *w,
                 int64_t row_stride, int64_t n, const float *bias, float *y, int64_t ldy,
                 int vector, int threads) {
    if (fmt < 0 || fmt >= NUM_FORMATS || k % BLOCK_SIZE[fmt]) return -1;
    if (vector == 2 && linear_v16(fmt, x, ldx, m, k, w, row_stride, n, bias, y, ldy, threads))
        return 0;
    if (!vector) {
        linear_scalar(fmt, x, ldx, m, k, w, row_stride, n, bias, y, ldy, threads);
        return 0;
    }
#define CASE(F)                                                                  \
    case F:                                                                      \
        linear_vector_##F(x, ldx, m, k, w, row_stride, n, bias, y, ldy, threads); \
        break;
    switch (fmt) {
        CASE(Q4_0) CASE(Q4_1) CASE(Q5_0) CASE(Q5_1) CASE(Q8_0) CASE(Q4_K) CASE(Q5_K) CASE(Q6_K)
        CASE(I8_CH) CASE(I4_G32) CASE(I4_G64) CASE(I4_G128)
    }
#undef CASE
    return 0;
}

/* ---- many rows: panels of dequantized outputs reused across every row -------------------
 * Each thread dequantizes a panel of P output rows (sized to stay in L2) into its own
 * buffer, then multiplies every activation row by it, four rows by three outputs at a time
 * (twelve accumulators; loads of 4 + 3 vectors per 12 fused multiply-adds). Outputs past
 * the weight's last row read zeros; rows past the last activation row repeat it and are
 * not stored. */
#define PANEL_COLS 3
#define PANEL_ROWS_X 4

static inline void panel_tile(const float *x, int64_t ldx, int64_t r0, int64_t m, const float *w,
                              int64_t k, int64_t j0, int64_t cols, const float *bias, float *y,
                              int64_t ldy) {
    const float *xr[PANEL_ROWS_X];
    for (int r = 0; r < PANEL_ROWS_X; ++r) xr[r] = x + (r0 + r < m ? r0 + r : m - 1) * ldx;
    const float *w0 = w, *w1 = w + k, *w2 = w + 2 * k;
    f8 a00 = {0}, a01 = {0}, a02 = {0}, a10 = {0}, a11 = {0}, a12 = {0};
    f8 a20 = {0}, a21 = {0}, a22 = {0}, a30 = {0}, a31 = {0}, a32 = {0};
    for (int64_t i = 0; i < k; i += 8) {
        const f8 v0 = get8(w0 + i), v1 = get8(w1 + i), v2 = get8(w2 + i);
        f8 u = get8(xr[0] + i);
        a00 += u * v0, a01 += u * v1, a02 += u * v2;
        u = get8(xr[1] + i);
        a10 += u * v0, a11 += u * v1, a12 += u * v2;
        u = get8(xr[2] + i);
        a20 += u * v0, a21 += u * v1, a22 += u * v2;
        u = get8(xr[3] + i);
        a30 += u * v0, a31 += u * v1, a32 += u * v2;
    }
    const f8 acc[PANEL_ROWS_X][PANEL_COLS] = {
        {a00, a01, a02}, {a10, a11, a12}, {a20, a21, a22}, {a30, a31, a32}};
    for (int r = 0; r < PANEL_ROWS_X && r0 + r < m; ++r)
        for (int c = 0; c < cols; ++c) {
            float s = 0.0f;
            for (int l = 0; l < 8; ++l) s += acc[r][c][l];
            y[(r0 + r) * ldy + j0 + c] = bias ? s + bias[j0 + c] : s;
        }
}

#define DEFINE_PANELS_VECTOR(F, BS)                                                         \
    static void panels_vector_##F(const float *x, int64_t ldx, int64_t m, int64_t k,            \
                                  const uint8_t *w, int64_t row_stride, int64_t n,              \
                                  const float *bias, float *y, int64_t ldy, int64_t panel,      \
                                  int threads) {                                                \
        const int64_t panels = (n + panel - 1) / panel;                                         \
        _Pragma("omp parallel num_threads(threads) if (threads > 1)") {                          \
            float *buf = aligned_alloc(32, (size_t)(panel * k * 4 + 32));                       \
            _Pragma("omp for schedule(static)") for (int64_t p = 0; p < panels; ++p) {          \
                const int64_t j0 = p * panel, rows = n - j0 < panel ? n - j0 : panel;            \
                for (int64_t j = 0; j < panel; ++j) {                                           \
                    if (j >= rows) {                                                            \
                        memset(buf + j * k, 0, (size_t)k * 4);                                   \
                        continue;                                                               \
                    }                                                                           \
                    for (int64_t blk = 0; blk < k / BS; ++blk)                                  \
                        dequant_block_vector(F, w + (j0 + j) * row_stride, blk,                 \
                                             buf + j * k + blk * BS);                           \
                }                                                                               \
                for (int64_t c0 = 0; c0 < rows; c0 += PANEL_COLS) {                              \
                    const int64_t cols = rows - c0 < PANEL_COLS ? rows - c0 : PANEL_COLS;       \
                    for (int64_t r0 = 0; r0 < m; r0 += PANEL_ROWS_X)                            \
                        panel_tile(x, ldx, r0, m, buf + c0 * k, k, j0 + c0, cols, bias, y, ldy); \
                }                                                                               \
            }                                                                                   \
            free(buf);                                                                          \
        }                                                                                       \
    }
DEFINE_PANELS_VECTOR(Q4_0, 32)
DEFINE_PANELS_VECTOR(Q4_1, 32)
DEFINE_PANELS_VECTOR(Q5_0, 32)
DEFINE_PANELS_VECTOR(Q5_1, 32)
DEFINE_PANELS_VECTOR(Q8_0, 32)
DEFINE_PANELS_VECTOR(Q4_K, 256)
DEFINE_PANELS_VECTOR(Q5_K, 256)
DEFINE_PANELS_VECTOR(Q6_K, 256)
DEFINE_PANELS_VECTOR(I8_CH, 32)
DEFINE_PANELS_VECTOR(I4_G32, 32)
DEFINE_PANELS_VECTOR(I4_G64, 64)
DEFINE_PANELS_VECTOR(I4_G128, 128)

#if HAVE_AVX512_PATH
/* panel_tile in sixteen lanes (k a multiple of 16: whole blocks always are). */
AVX512_FN static void panel_tile16(const float *x, int64_t ldx, int64_t r0, int64_t m,
                                   const float *w, int64_t k, int64_t j0, int64_t cols,
                                   const float *bias, float *y, int64_t ldy) {
    const float *xr[PANEL_ROWS_X];
    for (int r = 0; r < PANEL_ROWS_X; ++r) xr[r] = x + (r0 + r < m ? r0 + r : m - 1) * ldx;
    const float *w0 = w, *w1 = w + k, *w2 = w + 2 * k;
    v16f a00 = {0}, a01 = {0}, a02 = {0}, a10 = {0}, a11 = {0}, a12 = {0};
    v16f a20 = {0}, a21 = {0}, a22 = {0}, a30 = {0}, a31 = {0}, a32 = {0};
    for (int64_t i = 0; i < k; i += 16) {
        const v16f v0 = get16(w0 + i), v1 = get16(w1 + i), v2 = get16(w2 + i);
        v16f u = get16(xr[0] + i);
        a00 += u * v0, a01 += u * v1, a02 += u * v2;
        u = get16(xr[1] + i);
        a10 += u * v0, a11 += u * v1, a12 += u * v2;
        u = get16(xr[2] + i);
        a20 += u * v0, a21 += u * v1, a22 += u * v2;
        u = get16(xr[3] + i);
        a30 += u * v0, a31 += u * v1, a32 += u * v2;
    }
    const v16f acc[PANEL_ROWS_X][PANEL_COLS] = {
        {a00, a01, a02}, {a10, a11, a12}, {a20, a21, a22}, {a30, a31, a32}};
    for (int r = 0; r < PANEL_ROWS_X && r0 + r < m; ++r)
        for (int c = 0; c < cols; ++c) {
            float s = 0.0f;
            for (int l = 0; l < 16; ++l) s += acc[r][c][l];
            y[(r0 + r) * ldy + j0 + c] = bias ? s + bias[j0 + c] : s;
        }
}

#define DEFINE_PANELS_V16(F, BS)                                                                \
    AVX512_FN static void panels_v16_##F(const float *x, int64_t ldx, int64_t m, int64_t k,     \
                                         const uint8_t *w, int64_t row_stride, int64_t n,       \
                                         const float *bias, float *y, int64_t ldy,              \
                                         int64_t panel, int threads) {                          \
        const int64_t panels = (n + panel - 1) / panel;                                         \
        _Pragma("omp parallel num_threads(threads) if (threads > 1)") {                          \
            float *buf = aligned_alloc(64, (size_t)(panel * k * 4 + 64));                       \
            _Pragma("omp for schedule(static)") for (int64_t p = 0; p < panels; ++p) {          \
                const int64_t j0 = p * panel, rows = n - j0 < panel ? n - j0 : panel;            \
                for (int64_t j = 0; j < panel; ++j) {                                           \
                    if (j >= rows) {                                                            \
                        memset(buf + j * k, 0, (size_t)k * 4);                                   \
                        continue;                                                               \
                    }                                                                           \
                    for (int64_t blk = 0; blk < k / BS; ++blk)                                  \
                        dequant_block_v16(F, w + (j0 + j) * row_stride, blk,                    \
                                          buf + j * k + blk * BS);                              \
                }                                                                               \
                for (int64_t c0 = 0; c0 < rows; c0 += PANEL_COLS) {                              \
                    const int64_t cols = rows - c0 < PANEL_COLS ? rows - c0 : PANEL_COLS;       \
                    for (int64_t r0 = 0; r0 < m; r0 += PANEL_ROWS_X)                            \
                        panel_tile16(x, ldx, r0, m, buf + c0 * k, k, j0 + c0, cols, bias, y,    \
                                     ldy);                                                      \
                }                                                                               \
            }                                                                                   \
            free(buf);                                                                          \
        }                                                                                       \
    }
V16_FORMATS(DEFINE_PANELS_V16)

static int panels_v16(int fmt, const float *x, int64_t ldx, int64_t m, int64_t k,
                      const uint8_t *w, int64_t row_stride, int64_t n, const float *bias,
                      float *y, int64_t ldy, int64_t panel, int threads) {
#define CASE(F, BS)                                                                    \
    case F:                                                                            \
        panels_v16_##F(x, ldx, m, k, w, row_stride, n, bias, y, ldy, panel, threads);  \
        return 1;
    switch (fmt) { V16_FORMATS(CASE) }
#undef CASE
    return 0;
}
#else
static int panels_v16(int fmt, const float *x, int64_t ldx, int64_t m, int64_t k,
                      const uint8_t *w, int64_t row_stride, int64_t n, const float *bias,
                      float *y, int64_t ldy, int64_t panel, int threads) {
    return 0;
}
#endif

/* y [m, n] = x [m, k] times w^T (+ bias) over dequantized panels of ``panel`` output rows (a
 * multiple of 3), on a vector path (``vector`` 2: AVX-512 where the build has it, else 8
 * lanes): for many rows. Returns 0, or -1 as quant_linear. */
int quant_linear_panels(int fmt, const float *x, int64_t ldx, int64_t m, int64_t k,
                        const uint8_t *w, int64_t row_stride, int64_t n, const float *bias,
                        float *y, int64_t ldy, int64_t panel, int vector, int threads) {
    if (fmt < 0 || fmt >= NUM_FORMATS || k % BLOCK_SIZE[fmt] || panel < 3 || panel % 3)
        return -1;
    if (vector == 2 &&
        panels_v16(fmt, x, ldx, m, k, w, row_stride, n, bias, y, ldy, panel, threads))
        return 0;
#define CASE(F)                                                                         \
    case F:                                                                             \
        panels_vector_##F(x, ldx, m, k, w, row_stride, n, bias, y, ldy, panel, threads); \
        break;
    switch (fmt) {
        CASE(Q4_0) CASE(Q4_1) CASE(Q5_0) CASE(Q5_1) CASE(Q8_0) CASE(Q4_K) CASE(Q5_K) CASE(Q6_K)
        CASE(I8_CH) CASE(I4_G32) CASE(I4_G64) CASE(I4_G128)
    }
#undef CASE
    return 0;
}

#define DEFINE_DEQUANTIZE_VECTOR(F, BS)                                                  \
    static void dequantize_vector_##F(const uint8_t *w, int64_t row_stride, int64_t n,         \
                                      int64_t k, float *out, int64_t ldo, int threads) {       \
        _Pragma("omp parallel for num_threads(threads) schedule(static) if (threads > 1 && n * k > 65536)") \
        for (int64_t j = 0; j < n; ++j)                                                        \
            for (int64_t blk = 0; blk < k / BS; ++blk)                                         \
                dequant_block_vector(F, w + j * row_stride, blk, out + j * ldo + blk * BS);   \
    }
DEFINE_DEQUANTIZE_VECTOR(Q4_0, 32)
DEFINE_DEQUANTIZE_VECTOR(Q4_1, 32)
DEFINE_DEQUANTIZE_VECTOR(Q5_0, 32)
DEFINE_DEQUANTIZE_VECTOR(Q5_1, 32)
DEFINE_DEQUANTIZE_VECTOR(Q8_0, 32)
DEFINE_DEQUANTIZE_VECTOR(Q4_K, 256)
DEFINE_DEQUANTIZE_VECTOR(Q5_K, 256)
DEFINE_DEQUANTIZE_VECTOR(Q6_K, 256)
DEFINE_DEQUANTIZE_VECTOR(I8_CH, 32)
DEFINE_DEQUANTIZE_VECTOR(I4_G32, 32)
DEFINE_DEQUANTIZE_VECTOR(I4_G64, 64)
DEFINE_DEQUANTIZE_VECTOR(I4_G128, 128)

/* out [n, k] (row stride ldo) = the n rows of w dequantized to float32; ``vector`` the path,
 * as quant_linear's. */
int quant_dequantize(int fmt, const uint8_t *w, int64_t row_stride, int64_t n, int64_t k,
                     float *out, int64_t ldo, int vector, int threads) {
    if (fmt < 0 || fmt >= NUM_FORMATS || k % BLOCK_SIZE[fmt]) return -1;
    if (vector == 2 && dequantize_v16(fmt, w, row_stride, n, k, out, ldo, threads)) return 0;
    if (vector) {
#define CASE(F)                                                             \
    case F:                                                                 \
        dequantize_vector_##F(w, row_stride, n, k, out, ldo, threads);      \
        break;
        switch (fmt) {
            CASE(Q4_0) CASE(Q4_1) CASE(Q5_0) CASE(Q5_1) CASE(Q8_0) CASE(Q4_K) CASE(Q5_K) CASE(Q6_K)
            CASE(I8_CH) CASE(I4_G32) CASE(I4_G64) CASE(I4_G128)
        }
#undef CASE
        return 0;
    }
    const int bs = BLOCK_SIZE[fmt];
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && n * k > 65536)
    for (int64_t j = 0; j < n; ++j)
        for (int64_t blk = 0; blk < k / bs; ++blk)
            dequant_block_scalar(fmt, w + j * row_stride, blk, out + j * ldo + blk * bs);
    return 0;
}
