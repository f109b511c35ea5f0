/* Products with int8 activations (the optional fast mode; kernels/quant_int8.py): as
 * llama.cpp's dot products do, each activation row is quantized per 32 values to int8 with
 * one float32 scale (d = max|x| / 127, q = x / d rounded to nearest, ties to even), and each
 * weight block of a 32-weight format (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) meets it in integer
 * multiply-adds: sum_i wq_i * xq_i in int32, then one float scale per block pair. Exact
 * integer sums; the float rounding is a block's scale product and the sum over blocks (a
 * float64 reference over the same integers checks them). The K-quants (Q4_K, Q5_K, Q6_K: 256
 * weights a super-block) meet the same int8 rows sub-block by sub-block: a 32-weight
 * sub-block's integers (Q6_K's less its offset of 32, so signed) times the rows' int8 block,
 * scaled by the sub-block's own scale (Q6_K: one for each half of 16) with Q4_K/Q5_K's min
 * term as the five formats' is. Built -O3 -march=native: the
 * integer loops compile to the CPU's dot-product instructions (AVX512-VNNI's vpdpbusd,
 * AVX2's vpmaddubsw/vpmaddwd) where it has them, and where it has AMX-INT8 whole tiles of
 * 16 rows by 16 outputs go through tdpbssd (int8_tiles.h; emulated elsewhere, for tests).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "half_float.h"
#include "int8_tiles.h"

/* kernels/quant_blocks.py's codes for these eight */
enum { Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K };
#define QK 32
static const int BLOCK_BYTES[] = {18, 20, 22, 24, 34, 144, 176, 210};
#define ROWS 4 /* activation rows sharing one unpacked weight block */
#define QK_K 256
#define SUBS (QK_K / QK) /* a K-quant super-block's sub-blocks of 32 weights */

static inline int is_k_quant(int fmt) { return fmt >= Q4_K && fmt <= Q6_K; }


/* One block of 32 activations v as int8 values q, its scale *d and the sum of its values. */
static inline void quantize_block(const float *v, int8_t *q, float *d, int32_t *sum) {
    float amax = 0.0f;
    for (int i = 0; i < QK; ++i) amax = fmaxf(amax, fabsf(v[i]));
    *d = amax / 127.0f;
    *sum = 0;
    for (int i = 0; i < QK; ++i) {
        q[i] = *d == 0.0f ? 0 : (int8_t)lrintf(v[i] / *d);
        *sum += q[i];
    }
}

/* A weight block's integers (0..15 or 0..31 for Q4/Q5, -128..127 for Q8_0, in int16 so one
 * loop takes both), its scale and its min-or-offset term: w_i = d * q_i + mn for Q4_1/Q5_1,
 * d * (q_i - off) for Q4_0/Q5_0 (so mn = -off * d there), d * q_i for Q8_0 (mn = 0). */
static inline void unpack(int fmt, const uint8_t *b, int16_t q[QK], float *d, float *mn) {
    if (fmt == Q8_0) {
        *d = half_to_float(b);
        *mn = 0.0f;
        for (int i = 0; i < QK; ++i) q[i] = (int8_t)b[2 + i];
        return;
    }
    const int has_min = fmt == Q4_1 || fmt == Q5_1, five = fmt == Q5_0 || fmt == Q5_1;
    *d = half_to_float(b);
    const uint8_t *qh = b + (has_min ? 4 : 2);
    const uint8_t *qs = qh + (five ? 4 : 0);
    uint32_t high = 0;
    if (five) memcpy(&high, qh, 4);
    for (int i = 0; i < 16; ++i) {
        q[i] = (int16_t)((qs[i] & 0x0F) | (five ? ((high >> i) & 1u) << 4 : 0));
        q[i + 16] = (int16_t)((qs[i] >> 4) | (five ? ((high >> (i + 16)) & 1u) << 4 : 0));
    }
    *mn = has_min ? half_to_float(b + 2) : -(float)(five ? 16 : 8) * *d;
}

static inline int32_t idot_n(const int16_t *q, const int8_t *xq, int n) {
    int32_t s = 0;
    for (int i = 0; i < n; ++i) s += (int32_t)q[i] * (int32_t)xq[i];
    return s;
}

/* Q4_K/Q5_K's sub-block j: its 6-bit scale and 6-bit min, from the 12 packed bytes s (the
 * first four of each in the low six bits of bytes 0-7, the last four split between the
 * low and high nibbles of bytes 8-11 and the top two bits of bytes 0-7). */
static inline void k_scale_min(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Sub-block j's scales (its first 16 weights' and its last 16's: one value but for Q6_K)
 * and its min term: w_i = scale * q_i + mn. */
static inline void k_sub_scales(int fmt, const uint8_t *b, int j, float *lo, float *hi,
                                float *mn) {
    if (fmt == Q6_K) {
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = half_to_float(b + 208);
        const int at = 8 * (j / 4) + 2 * (j % 4); /* 16-weight scales of weights 32 j .. */
        *lo = d * (float)sc[at];
        *hi = d * (float)sc[at + 1];
        *mn = 0.0f;
        return;
    }
    int sc, m;
    k_scale_min(j, b + 4, &sc, &m);
    *lo = *hi = half_to_float(b) * (float)sc;
    *mn = -half_to_float(b + 2) * (float)m;
}

/* Sub-block j's 32 integers: Q4_K 0..15, Q5_K 0..31, Q6_K -32..31. In a 64-weight chunk
 * of Q4_K/Q5_K the low nibbles are the first 32 weights and the high ones the next; Q6_K's
 * 128-weight halves take four sub-blocks from 64 bytes of nibbles and 32 of two-bit highs. */
static inline void k_sub_ints(int fmt, const uint8_t *b, int j, int16_t q[QK]) {
    if (fmt == Q6_K) {
        const int half = j / 4, part = j % 4;
        const uint8_t *ql = b + 64 * half + (part & 1) * 32, *qh = b + 128 + 32 * half;
        for (int l = 0; l < QK; ++l) {
            const int low = part < 2 ? ql[l] & 0x0F : ql[l] >> 4;
            q[l] = (int16_t)((low | ((qh[l] >> (2 * part)) & 3) << 4) - 32);
        }
        return;
    }
    const uint8_t *qh = b + 16, *qs = b + (fmt == Q5_K ? 48 : 16) + 32 * (j / 2);
    for (int l = 0; l < QK; ++l) {
        int v = j & 1 ? qs[l] >> 4 : qs[l] & 0x0F;
        if (fmt == Q5_K) v |= ((qh[l] >> j) & 1) << 4;
        q[l] = (int16_t)v;
    }
}

/* ---- AVX2 and AVX512-VNNI (256-bit lanes): a 32-weight block is one register -------------
 * The weights go in as unsigned bytes: Q4/Q5 weights are unsigned nibbles (with the fifth
 * bit spread from its 32-bit word to one byte each); Q8_0's signed weights go in as |w| with
 * the activations' signs flipped where w < 0. AVX512-VNNI's vpdpbusd multiplies the unsigned
 * by the signed bytes and sums each four into an int32 lane; AVX2 does the same in two steps
 * (vpmaddubsw into int16 pairs, which cannot saturate here: |w| <= 128 and |x| <= 127, so a
 * pair is at most 32,512; then vpmaddwd by ones into int32). Eight int32 lanes of partial
 * dot products per block, scaled into eight float lanes, summed once per output. Compiled
 * whatever -march says, each run only where the CPU has it (quant_int8.py reads the flags). */
#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_SIMD_PATHS 1
#include <immintrin.h>
#define AVX2_FN __attribute__((target("avx2,fma,f16c")))
#define VNNI_FN __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))

AVX2_FN static inline float half_f16c(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 0x10 in byte i where bit i of the 32-bit word at qh is set, 0 elsewhere. */
AVX2_FN static inline __m256i fifth_bits(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)h),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

/* The block's weights as bytes, weight i in byte i: unsigned for Q4/Q5, Q8_0's signed ones
 * as they are (signed_bytes: they meet the activations by the sign trick, `meet`). */
AVX2_FN static inline __m256i block_bytes(int fmt, const uint8_t *b) {
    if (fmt == Q8_0) return _mm256_loadu_si256((const __m256i *)(b + 2));
    const int has_min = fmt == Q4_1 || fmt == Q5_1, five = fmt == Q5_0 || fmt == Q5_1;
    const uint8_t *qh = b + (has_min ? 4 : 2);
    const __m128i q = _mm_loadu_si128((const __m128i *)(qh + (five ? 4 : 0)));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    __m256i u = _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
    if (five) u = _mm256_or_si256(u, fifth_bits(qh));
    return u;
}

/* Whether a format's weight bytes (block_bytes, k_sub_bytes) are signed. */
static inline int signed_bytes(int fmt) { return fmt == Q8_0 || fmt == Q6_K; }

/* Weight bytes w meeting activations x as the dot products take them: *u unsigned and *xs
 * signed, so that u_i * xs_i = w_i * x_i (signed weights: |w| and x with w's signs; an
 * activation is zeroed where its weight is 0, whose product is 0 anyway). The part of the
 * sign trick that needs only w (|w|) is `magnitude`, computed once for all rows. */
AVX2_FN static inline __m256i magnitude(int fmt, __m256i w) {
    return signed_bytes(fmt) ? _mm256_sign_epi8(w, w) : w;
}

AVX2_FN static inline __m256i meet(int fmt, __m256i w, __m256i x) {
    return signed_bytes(fmt) ? _mm256_sign_epi8(x, w) : x;
}

/* The block's min-or-offset term as unpack gives it. */
AVX2_FN static inline float block_mn(int fmt, const uint8_t *b, float d) {
    switch (fmt) {
    case Q4_1:
    case Q5_1:
        return half_f16c(b + 2);
    case Q4_0:
        return -8.0f * d;
    case Q5_0:
        return -16.0f * d;
    default:
        return 0.0f;
    }
}

AVX2_FN static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2_FN static inline __m256i dot_avx2(__m256i u, __m256i xs) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, xs), _mm256_set1_epi16(1));
}

VNNI_FN static inline __m256i dot_vnni(__m256i u, __m256i xs) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, xs);
}

/* NAME##_rows for the format F and the chunk's row count, each a constant in the copy it
 * runs, so the accumulators stay in registers (OpenMP outlines a parallel loop once, so
 * the choice is made inside it, per output and chunk of rows). */
#define ROWS_CASES(NAME, F)                                                                    \
    switch (rows) {                                                                            \
    case 1: NAME##_rows(F, 1, x, d, s, k, row, b, out, ldy); break;                            \
    case 2: NAME##_rows(F, 2, x, d, s, k, row, b, out, ldy); break;                            \
    case 3: NAME##_rows(F, 3, x, d, s, k, row, b, out, ldy); break;                            \
    default: NAME##_rows(F, 4, x, d, s, k, row, b, out, ldy); break;                           \
    }

/* A float16 at p, as its bits. */
static inline short half_bits(const uint8_t *p) {
    short h;
    memcpy(&h, p, 2);
    return h;
}

/* Eight blocks' scales and min-or-offset terms (block_mn's) as vectors, from the float16s
 * of the blocks at b, b + bytes, ... */
AVX2_FN static inline void eight_scales(int fmt, const uint8_t *b, int bytes, __m256 *d,
                                        __m256 *mn) {
#define EIGHT_HALVES(at)                                                                       \
    _mm256_cvtph_ps(_mm_setr_epi16(half_bits(b + (at)), half_bits(b + bytes + (at)),          \
                                   half_bits(b + 2 * bytes + (at)), half_bits(b + 3 * bytes + (at)), \
                                   half_bits(b + 4 * bytes + (at)), half_bits(b + 5 * bytes + (at)), \
                                   half_bits(b + 6 * bytes + (at)), half_bits(b + 7 * bytes + (at))))
    *d = EIGHT_HALVES(0);
    switch (fmt) {
    case Q4_1:
    case Q5_1:
        *mn = EIGHT_HALVES(2);
        break;
    case Q4_0:
        *mn = _mm256_mul_ps(*d, _mm256_set1_ps(-8.0f));
        break;
    case Q5_0:
        *mn = _mm256_mul_ps(*d, _mm256_set1_ps(-16.0f));
        break;
    default:
        *mn = _mm256_setzero_ps();
    }
#undef EIGHT_HALVES
}

/* One function per path, the same loops around its DOT: eight blocks at a time, their
 * scales and min-or-offset terms read once into vectors (the terms of all eight in one
 * vector product per row), then each block's dot product scaled into one of two
 * accumulators per row (even and odd blocks add independently); blocks past the last
 * eight one at a time. */
#define DEFINE_BLOCK_ROWS(NAME, FN, DOT)                                                      \
    FN static inline __attribute__((always_inline)) void NAME##_blocks_rows(                          \
        const int fmt, const int rows, const int8_t *xq, const float *xd, const int32_t *xs,   \
        int64_t k, const uint8_t *row, float bias, float *y, int64_t ldy) {                    \
        const int64_t nb = k / QK;                                                             \
        const int bytes = BLOCK_BYTES[fmt];                                                    \
        __m256 acc[ROWS][2], terms[ROWS];                                                      \
        float extra[ROWS];                                                                     \
        for (int r = 0; r < ROWS; ++r) {                                                       \
            acc[r][0] = acc[r][1] = terms[r] = _mm256_setzero_ps();                            \
            extra[r] = 0.0f;                                                                   \
        }                                                                                      \
        int64_t b = 0;                                                                         \
        for (; b + 8 <= nb; b += 8) {                                                          \
            const uint8_t *blk = row + b * bytes;                                              \
            __m256 d, mn;                                                                      \
            eight_scales(fmt, blk, bytes, &d, &mn);                                            \
            __m256 scale[ROWS];                                                                \
            for (int r = 0; r < rows; ++r) {                                                   \
                const __m256 xdv = _mm256_loadu_ps(xd + r * nb + b);                           \
                scale[r] = _mm256_mul_ps(d, xdv);                                              \
                if (fmt != Q8_0) {                                                             \
                    const __m256 sums = _mm256_cvtepi32_ps(                                    \
                        _mm256_loadu_si256((const __m256i *)(xs + r * nb + b)));               \
                    terms[r] = _mm256_fmadd_ps(_mm256_mul_ps(mn, xdv), sums, terms[r]);        \
                }                                                                              \
            }                                                                                  \
            for (int i = 0; i < 8; ++i) {                                                      \
                const __m256i w = block_bytes(fmt, blk + i * bytes), u = magnitude(fmt, w);    \
                for (int r = 0; r < rows; ++r) {                                               \
                    const __m256i x =                                                          \
                        _mm256_loadu_si256((const __m256i *)(xq + r * k + (b + i) * QK));      \
                    acc[r][i & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT(u, meet(fmt, w, x))), \
                                                    _mm256_permutevar8x32_ps(scale[r], _mm256_set1_epi32(i)), \
                                                    acc[r][i & 1]);                            \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        for (; b < nb; ++b) {                                                                  \
            const uint8_t *blk = row + b * bytes;                                              \
            const float d = half_f16c(blk), mn = block_mn(fmt, blk, d);                        \
            const __m256i w = block_bytes(fmt, blk), u = magnitude(fmt, w);                    \
            for (int r = 0; r < rows; ++r) {                                                   \
                const int64_t at = r * nb + b;                                                 \
                const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + r * k + b * QK));  \
                acc[r][b & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT(u, meet(fmt, w, x))),   \
                                                _mm256_set1_ps(d * xd[at]), acc[r][b & 1]);    \
                extra[r] += mn * xd[at] * (float)xs[at];                                       \
            }                                                                                  \
        }                                                                                      \
        for (int r = 0; r < rows; ++r) {                                                       \
            const __m256 all = _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), terms[r]);   \
            y[r * ldy] = hsum8(all) + extra[r] + bias;                                         \
        }                                                                                      \
    }
DEFINE_BLOCK_ROWS(linear_avx2, AVX2_FN, dot_avx2)
DEFINE_BLOCK_ROWS(linear_vnni, VNNI_FN, dot_vnni)

/* A K-quant's sub-block j as bytes: Q4_K/Q5_K's unsigned integers, Q6_K's less 32 (signed:
 * they meet the activations by the sign trick, as Q8_0's do). */
AVX2_FN static inline __m256i k_sub_bytes(int fmt, const uint8_t *b, int j) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    if (fmt == Q6_K) {
        const int half = j / 4, part = j % 4;
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * half + (part & 1) * 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * half));
        const __m256i low = _mm256_and_si256(part < 2 ? ql : _mm256_srli_epi16(ql, 4), nibble);
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * part), _mm256_set1_epi8(3));
        return _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)),
                               _mm256_set1_epi8(32));
    }
    const __m256i q = _mm256_loadu_si256(
        (const __m256i *)(b + (fmt == Q5_K ? 48 : 16) + 32 * (j / 2)));
    __m256i u = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(q, 4) : q, nibble);
    if (fmt == Q5_K) {
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
        const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1));
        u = _mm256_or_si256(u, _mm256_slli_epi16(bit, 4));
    }
    return u;
}

/* A super-block's scales, read once for all its sub-blocks and rows: each sub-block's two
 * halves' scales and its min term (k_sub_scales' values) as vectors of the eight. Q4_K and
 * Q5_K's twelve bytes as three little-endian words: the first four scales are the low six
 * bits of word 0 and the first four mins those of word 1; the last four scales are word 2's
 * low nibbles with word 0's top two bits above them, the last four mins word 2's high
 * nibbles with word 1's. Q6_K's sixteen scales: the even ones the halves' first. */
AVX2_FN static inline void k_scales_simd(int fmt, const uint8_t *b, __m256 *lo, __m256 *hi,
                                         __m256 *mn) {
    if (fmt == Q6_K) {
        const __m128i sc = _mm_loadu_si128((const __m128i *)(b + 192));
        const __m128i split =
            _mm_shuffle_epi8(sc, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
        const __m256 d = _mm256_set1_ps(half_f16c(b + 208));
        *lo = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(split)));
        *hi = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(split, 8))));
        *mn = _mm256_setzero_ps();
        return;
    }
    uint32_t word[3];
    memcpy(word, b + 4, 12);
    const uint32_t six = 0x3f3f3f3fu, nibbles = 0x0f0f0f0fu, twos = 0x03030303u;
    const uint32_t scales[2] = {word[0] & six, (word[2] & nibbles) | ((word[0] >> 6) & twos) << 4};
    const uint32_t mins[2] = {word[1] & six, ((word[2] >> 4) & nibbles) | ((word[1] >> 6) & twos) << 4};
    const __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)scales));
    const __m256i m = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)mins));
    *lo = *hi = _mm256_mul_ps(_mm256_set1_ps(half_f16c(b)), _mm256_cvtepi32_ps(sc));
    *mn = _mm256_mul_ps(_mm256_set1_ps(-half_f16c(b + 2)), _mm256_cvtepi32_ps(m));
}

/* The K-quants' loops: each output's super-blocks in order, their scales read once for up
 * to ROWS rows; a dot product's int32 lanes 0-3 hold its first 16 weights and lanes 4-7 its
 * last 16, so one vector of the two halves' scales (times the rows' block scale) scales
 * both. The min terms of a super-block's eight sub-blocks go in one vector product. Each
 * output's chunk of rows runs a copy of the loops for its format and row count (both
 * constants in each, so the accumulators stay in registers: OpenMP outlines the parallel
 * loop once, so the choice is made inside it). ROWS_CASES picks the copy. */
#define DEFINE_K_ROWS(NAME, FN, DOT)                                                    \
    FN static inline __attribute__((always_inline)) void NAME##_k_rows(                          \
        const int fmt, const int rows, const int8_t *xq, const float *xd, const int32_t *xs,   \
        int64_t k, const uint8_t *row, float bias, float *y, int64_t ldy) {                    \
        const int64_t nb = k / QK, supers = k / QK_K;                                          \
        const int bytes = BLOCK_BYTES[fmt];                                                    \
        __m256 acc[ROWS][2], extra[ROWS];                                                      \
        for (int r = 0; r < ROWS; ++r)                                                         \
            acc[r][0] = acc[r][1] = extra[r] = _mm256_setzero_ps();                            \
        for (int64_t sb = 0; sb < supers; ++sb) {                                              \
            const uint8_t *blk = row + sb * bytes;                                             \
            __m256 lo, hi, mn;                                                                 \
            k_scales_simd(fmt, blk, &lo, &hi, &mn);                                            \
            __m256 slo[ROWS], shi[ROWS];                                                       \
            for (int r = 0; r < rows; ++r) {                                                   \
                const int64_t at = r * nb + sb * SUBS;                                         \
                const __m256 xdv = _mm256_loadu_ps(xd + at);                                   \
                slo[r] = _mm256_mul_ps(lo, xdv);                                               \
                if (fmt == Q6_K) shi[r] = _mm256_mul_ps(hi, xdv);                              \
                else {                                                                         \
                    const __m256 sums =                                                        \
                        _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(xs + at)));    \
                    extra[r] = _mm256_fmadd_ps(_mm256_mul_ps(mn, xdv), sums, extra[r]);        \
                }                                                                              \
            }                                                                                  \
            for (int sub = 0; sub < SUBS; ++sub) {                                             \
                const __m256i w = k_sub_bytes(fmt, blk, sub), u = magnitude(fmt, w);           \
                for (int r = 0; r < rows; ++r) {                                               \
                    const __m256i x = _mm256_loadu_si256(                                      \
                        (const __m256i *)(xq + r * k + sb * QK_K + sub * QK));                 \
                    const __m256i lane = _mm256_set1_epi32(sub);                               \
                    const __m256 scale =                                                       \
                        fmt == Q6_K                                                            \
                            ? _mm256_blend_ps(_mm256_permutevar8x32_ps(slo[r], lane),          \
                                              _mm256_permutevar8x32_ps(shi[r], lane), 0xF0)    \
                            : _mm256_permutevar8x32_ps(slo[r], lane);                          \
                    acc[r][sub & 1] = _mm256_fmadd_ps(                                         \
                        _mm256_cvtepi32_ps(DOT(u, meet(fmt, w, x))), scale, acc[r][sub & 1]);  \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        for (int r = 0; r < rows; ++r)                                                         \
            y[r * ldy] =                                                                       \
                hsum8(_mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), extra[r])) + bias;    \
    }
DEFINE_K_ROWS(linear_avx2, AVX2_FN, dot_avx2)
DEFINE_K_ROWS(linear_vnni, VNNI_FN, dot_vnni)

/* A path's product for any of the eight formats: each output's chunks of rows, each run by
 * the copy of the loops for its format and row count (ROWS_CASES). */
#define DEFINE_LINEAR_SIMD(NAME, FN)                                                           \
    FN static void NAME(int fmt, const int8_t *xq, const float *xd, const int32_t *xs,        \
                        int64_t m, int64_t k, const uint8_t *w, int64_t row_stride, int64_t n, \
                        const float *bias, float *y, int64_t ldy, int threads) {               \
        const int64_t nb = k / QK;                                                             \
        _Pragma("omp parallel for num_threads(threads) schedule(static) if (threads > 1 && m * n * k > 65536)") \
        for (int64_t j = 0; j < n; ++j) {                                                      \
            const uint8_t *row = w + j * row_stride;                                           \
            const float b = bias ? bias[j] : 0.0f;                                             \
            for (int64_t r0 = 0; r0 < m; r0 += ROWS) {                                         \
                const int rows = m - r0 < ROWS ? (int)(m - r0) : ROWS;                         \
                const int8_t *x = xq + r0 * k;                                                 \
                const float *d = xd + r0 * nb;                                                 \
                const int32_t *s = xs + r0 * nb;                                               \
                float *out = y + r0 * ldy + j;                                                 \
                switch (fmt) {                                                                 \
                case Q4_0: ROWS_CASES(NAME##_blocks, Q4_0) break;                              \
                case Q4_1: ROWS_CASES(NAME##_blocks, Q4_1) break;                              \
                case Q5_0: ROWS_CASES(NAME##_blocks, Q5_0) break;                              \
                case Q5_1: ROWS_CASES(NAME##_blocks, Q5_1) break;                              \
                case Q8_0: ROWS_CASES(NAME##_blocks, Q8_0) break;                              \
                case Q4_K: ROWS_CASES(NAME##_k, Q4_K) break;                                   \
                case Q5_K: ROWS_CASES(NAME##_k, Q5_K) break;                                   \
                default: ROWS_CASES(NAME##_k, Q6_K) break;                                     \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }
DEFINE_LINEAR_SIMD(linear_avx2, AVX2_FN)
DEFINE_LINEAR_SIMD(linear_vnni, VNNI_FN)
#else
#define HAVE_SIMD_PATHS 0
#endif

/* Whether this build has the AVX2 and AVX512-VNNI paths (x86 with GCC's target attributes). */
int q8_has_simd_paths(void) { return HAVE_SIMD_PATHS; }

#if HAVE_SIMD_PATHS
/* quantize_block in 8-lane vectors, the same values: the same division (not a multiply by
 * its inverse, which rounds differently), and the conversion rounds to nearest, ties to
 * even, as lrintf does in the default rounding mode. */
AVX2_FN static inline void quantize_block_avx2(const float *v, int8_t *q, float *d,
                                               int32_t *sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 x[4], amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
        x[i] = _mm256_loadu_ps(v + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, x[i]));
    }
    __m128 top = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    top = _mm_max_ps(top, _mm_movehl_ps(top, top));
    top = _mm_max_ss(top, _mm_movehdup_ps(top));
    *d = _mm_cvtss_f32(top) / 127.0f;
    if (*d == 0.0f) {
        memset(q, 0, QK);
        *sum = 0;
        return;
    }
    const __m256 dv = _mm256_set1_ps(*d);
    __m256i n[4];
    for (int i = 0; i < 4; ++i) n[i] = _mm256_cvtps_epi32(_mm256_div_ps(x[i], dv));
    const __m256i total = _mm256_add_epi32(_mm256_add_epi32(n[0], n[1]), _mm256_add_epi32(n[2], n[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    *sum = _mm_cvtsi128_si32(s4);
    /* int32 -> int16 -> int8 packs interleave the 128-bit lanes: put them back in order. */
    const __m256i words = _mm256_packs_epi32(n[0], n[1]), words2 = _mm256_packs_epi32(n[2], n[3]);
    const __m256i bytes = _mm256_packs_epi16(words, words2);
    _mm256_storeu_si256((__m256i *)q,
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

AVX2_FN static void quantize_rows_avx2(const float *x, int64_t ldx, int64_t m, int64_t k,
                                       int8_t *xq, float *xd, int32_t *xs) {
    const int64_t nb = k / QK;
    for (int64_t r = 0; r < m; ++r)
        for (int64_t b = 0; b < nb; ++b)
            quantize_block_avx2(x + r * ldx + b * QK, xq + r * k + b * QK, xd + r * nb + b,
                                xs + r * nb + b);
}
#endif

/* xq [m, k] int8, xd [m, k / 32] scales, xs [m, k / 32] sums of each block's int8 values,
 * from x [m, k] (row stride ldx): in vectors where the CPU has AVX2 (the same values). */
void q8_quantize_rows(const float *x, int64_t ldx, int64_t m, int64_t k, int8_t *xq, float *xd,
                      int32_t *xs) {
#if HAVE_SIMD_PATHS
    if (__builtin_cpu_supports("avx2")) {
        quantize_rows_avx2(x, ldx, m, k, xq, xd, xs);
        return;
    }
#endif
    const int64_t nb = k / QK;
    for (int64_t r = 0; r < m; ++r)
        for (int64_t b = 0; b < nb; ++b)
            quantize_block(x + r * ldx + b * QK, xq + r * k + b * QK, xd + r * nb + b,
                           xs + r * nb + b);
}

/* ---- AMX-INT8: tiles of 16 rows by 16 outputs (int8_tiles.h) ------------------------------
 * Each thread takes 16 outputs at a time: it unpacks their weight blocks once into its
 * scratch, as tdpbssd's right operand (weight i of an output at group i / 4, byte i % 4 of
 * the output's word; Q4/Q5 integers are 0..31, so signed bytes hold them and Q8_0's as they
 * are: no sign flips), with each block's scale and min-or-offset term per output (zero past
 * the last output). Then for every 16 rows (the last, fewer, from a copy padded with zero
 * rows) and every block, one product of the rows' int8 block by the packed block gives
 * 16 x 16 exact int32 dot products, and each is scaled into float32 sums as the portable
 * loops scale theirs (xd * (d * dot + mn * xs), blocks in order); two sets of tiles take
 * the blocks in turn, so that one block's product runs while the last one's sums are
 * scaled. The tiles' configuration and the tile state are per thread and per process: each
 * thread loads the configuration, and the process asks for the tile state once
 * (q8_tiles_ready) before a native tile path may run. */

/* A block's 32 integers as signed bytes (unpack's values), its scale and min-or-offset. */
static inline void block_i8(int fmt, const uint8_t *b, int8_t q[QK], float *d, float *mn) {
#if HAVE_SIMD_PATHS && defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
    *d = half_f16c(b);
    *mn = block_mn(fmt, b, *d);
    if (fmt == Q8_0) {
        memcpy(q, b + 2, QK);
        return;
    }
    _mm256_storeu_si256((__m256i *)q, block_bytes(fmt, b));
#else
    int16_t wide[QK];
    unpack(fmt, b, wide, d, mn);
    for (int i = 0; i < QK; ++i) q[i] = (int8_t)wide[i];
#endif
}

#define PACKED_BLOCK (QK * Q8_TILE) /* bytes of one block of 16 outputs, packed */

static inline int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

/* Bytes of one thread's scratch: the packed blocks, then their scales and terms. */
static size_t tile_scratch_bytes(int64_t nb) {
    return (size_t)round_up(nb * (PACKED_BLOCK + 2 * Q8_TILE * (int64_t)sizeof(float)), 64);
}

/* `cols` (at most 16) weight rows from `row` (row_stride apart) packed into `packed`, with
 * their scales wd and terms wmn ([nb][16] each), all zero past `cols`. */
static void pack_outputs(int fmt, const uint8_t *row, int64_t row_stride, int cols, int64_t nb,
                         int8_t *packed, float *wd, float *wmn) {
    memset(packed, 0, (size_t)(nb * PACKED_BLOCK));
    memset(wd, 0, (size_t)nb * Q8_TILE * sizeof(float));
    memset(wmn, 0, (size_t)nb * Q8_TILE * sizeof(float));
    const int bytes = BLOCK_BYTES[fmt];
    for (int c = 0; c < cols; ++c) {
        const uint8_t *blocks = row + c * row_stride;
        for (int64_t b = 0; b < nb; ++b) {
            int8_t q[QK];
            block_i8(fmt, blocks + b * bytes, q, wd + b * Q8_TILE + c, wmn + b * Q8_TILE + c);
            uint32_t words[QK / 4], *dst = (uint32_t *)(packed + b * PACKED_BLOCK);
            memcpy(words, q, sizeof words);
            for (int g = 0; g < QK / 4; ++g) dst[g * Q8_TILE + c] = words[g];
        }
    }
}

/* sums[r][c] += xd * (wd[c] * dots[r][c] + wmn[c] * xs) for the block's first `rows` rows. */
static inline void scale_block(const int32_t dots[Q8_TILE][Q8_TILE], const float *wd,
                               const float *wmn, const float *xd, const int32_t *xs, int64_t nb,
                               int rows, float sums[Q8_TILE][Q8_TILE]) {
    for (int r = 0; r < rows; ++r) {
        const float d = xd[r * nb], s = (float)xs[r * nb];
        for (int c = 0; c < Q8_TILE; ++c)
            sums[r][c] += d * (wd[c] * (float)dots[r][c] + wmn[c] * s);
    }
}

/* One block's product on one set of tiles (int8_tiles.h): sums, rows and weights tiles. */
#define BLOCK_PRODUCT(SUMS, LEFT, RIGHT, left, stride, right) \
    do {                                                       \
        q8_tile_zero(SUMS);                                    \
        q8_tile_load(LEFT, left, stride);                      \
        q8_tile_load(RIGHT, right, Q8_TILE_BYTES);             \
        q8_tile_dot(SUMS, LEFT, RIGHT);                        \
    } while (0)

/* 16 rows (`left`, rows `stride` apart; `rows` of them real) by the packed outputs, every
 * block, into sums. */
static void tile_rows(const int8_t *left, int64_t stride, const int8_t *packed, const float *wd,
                      const float *wmn, const float *xd, const int32_t *xs, int64_t nb, int rows,
                      float sums[Q8_TILE][Q8_TILE]) {
    _Alignas(64) int32_t dots[Q8_TILE][Q8_TILE];
    memset(sums, 0, sizeof(float) * Q8_TILE * Q8_TILE);
    BLOCK_PRODUCT(0, 1, 2, left, stride, packed);
    for (int64_t b = 0; b < nb; ++b) {
        const int64_t next = b + 1;
        const int8_t *next_left = left + next * QK, *next_right = packed + next * PACKED_BLOCK;
        if (b & 1) {
            if (next < nb) BLOCK_PRODUCT(0, 1, 2, next_left, stride, next_right);
            q8_tile_store(3, dots, Q8_TILE_BYTES);
        } else {
            if (next < nb) BLOCK_PRODUCT(3, 4, 5, next_left, stride, next_right);
            q8_tile_store(0, dots, Q8_TILE_BYTES);
        }
        scale_block((const int32_t(*)[Q8_TILE])dots, wd + b * Q8_TILE, wmn + b * Q8_TILE,
                    xd + b, xs + b, nb, rows, sums);
    }
}

/* Whether this process may run the native tiles (set by q8_tiles_ready). */
static int tiles_granted;

/* 1 where the tiles are AMX-INT8 and Linux lent the tile state, 0 where it refused, 2 where
 * the tiles are emulated (for tests: slow). */
int q8_tiles_ready(void) {
#if Q8_TILES_NATIVE
    tiles_granted = request_tile_state();
    return tiles_granted;
#else
    tiles_granted = 1;
    return 2;
#endif
}

/* q8_linear on the tiles; -1 where memory ran out or the tiles are not granted. */
static int linear_tiles(int fmt, const int8_t *xq, const float *xd, const int32_t *xs,
                        int64_t m, int64_t k, const uint8_t *w, int64_t row_stride, int64_t n,
                        const float *bias, float *y, int64_t ldy, int threads) {
    if (!tiles_granted) return -1;
    const int64_t nb = k / QK, groups = (n + Q8_TILE - 1) / Q8_TILE, whole = m / Q8_TILE * Q8_TILE;
    const int workers = threads > 1 && m * n * k > 65536 ? threads : 1;
    const size_t each = tile_scratch_bytes(nb);
    const size_t tail_bytes = (size_t)round_up(Q8_TILE * k, 64);
    char *scratch = aligned_alloc(64, tail_bytes + each * (size_t)workers);
    if (!scratch) return -1;
    int8_t *tail = (int8_t *)scratch; /* the last rows short of a tile, padded with zero rows */
    memset(tail, 0, tail_bytes);
    memcpy(tail, xq + whole * k, (size_t)((m - whole) * k));
#pragma omp parallel num_threads(workers) if (workers > 1)
    {
        char *mine = scratch + tail_bytes + each * (size_t)omp_get_thread_num();
        int8_t *packed = (int8_t *)mine;
        float *wd = (float *)(mine + nb * PACKED_BLOCK), *wmn = wd + nb * Q8_TILE;
        q8_tiles_begin();
#pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; ++g) {
            const int64_t j0 = g * Q8_TILE;
            const int cols = n - j0 < Q8_TILE ? (int)(n - j0) : Q8_TILE;
            pack_outputs(fmt, w + j0 * row_stride, row_stride, cols, nb, packed, wd, wmn);
            for (int64_t r0 = 0; r0 < m; r0 += Q8_TILE) {
                const int rows = m - r0 < Q8_TILE ? (int)(m - r0) : Q8_TILE;
                float sums[Q8_TILE][Q8_TILE];
                tile_rows(r0 < whole ? xq + r0 * k : tail, k, packed, wd, wmn, xd + r0 * nb,
                          xs + r0 * nb, nb, rows, sums);
                for (int r = 0; r < rows; ++r)
                    for (int c = 0; c < cols; ++c)
                        y[(r0 + r) * ldy + j0 + c] = bias ? sums[r][c] + bias[j0 + c] : sums[r][c];
            }
        }
        q8_tiles_end();
    }
    free(scratch);
    return 0;
}


/* y [m, n] (row stride ldy) = dequant(w) [n, k] times the int8 rows; bias [n] or NULL.
 * path: 0 the portable loops, 1 AVX512-VNNI, 2 AVX2 (these two where the build has them),
 * 3 the AMX-INT8 tiles (AMX or their emulation: after q8_tiles_ready; not the K-quants);
 * the caller asks only for what the CPU runs. Returns 0, or -1 for a format outside the
 * eight, k not whole blocks, an unknown path, tiles not granted or memory short for them. */
int q8_linear(int fmt, const int8_t *xq, const float *xd, const int32_t *xs, int64_t m,
              int64_t k, const uint8_t *w, int64_t row_stride, int64_t n, const float *bias,
              float *y, int64_t ldy, int path, int threads) {
    if (fmt < Q4_0 || fmt > Q6_K || k % QK || path < 0 || path > 3) return -1;
    if (is_k_quant(fmt) && (k % QK_K || path == 3)) return -1;
    if (path == 3)
        return linear_tiles(fmt, xq, xd, xs, m, k, w, row_stride, n, bias, y, ldy, threads);
#if HAVE_SIMD_PATHS
    if (path == 1) {
        linear_vnni(fmt, xq, xd, xs, m, k, w, row_stride, n, bias, y, ldy, threads);
        return 0;
    }
    if (path == 2) {
        linear_avx2(fmt, xq, xd, xs, m, k, w, row_stride, n, bias, y, ldy, threads);
        return 0;
    }
#else
    if (path) return -1;
#endif
    /* The portable loops, a 32-weight block (a K-quant's sub-block) at a time: its
     * integers, the scales of its two halves of 16 (one value but for Q6_K) and its
     * min-or-offset term. */
    const int64_t nb = k / QK;
    const int k_quant = is_k_quant(fmt), bytes = BLOCK_BYTES[fmt];
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && m * n * k > 65536)
    for (int64_t j = 0; j < n; ++j) {
        const uint8_t *row = w + j * row_stride;
        for (int64_t r0 = 0; r0 < m; r0 += ROWS) {
            const int rows = m - r0 < ROWS ? (int)(m - r0) : ROWS;
            float sums[ROWS] = {0};
            for (int64_t b = 0; b < nb; ++b) {
                int16_t q[QK];
                float lo, hi, mn;
                if (k_quant) {
                    const uint8_t *super = row + b / SUBS * bytes;
                    k_sub_ints(fmt, super, (int)(b % SUBS), q);
                    k_sub_scales(fmt, super, (int)(b % SUBS), &lo, &hi, &mn);
                } else {
                    unpack(fmt, row + b * bytes, q, &lo, &mn);
                    hi = lo;
                }
                for (int r = 0; r < rows; ++r) {
                    const int64_t at = (r0 + r) * nb + b;
                    const int8_t *x = xq + (r0 + r) * k + b * QK;
                    const float dot = lo * (float)idot_n(q, x, QK / 2) +
                                      hi * (float)idot_n(q + QK / 2, x + QK / 2, QK / 2);
                    sums[r] += xd[at] * (dot + mn * (float)xs[at]);
                }
            }
            for (int r = 0; r < rows; ++r)
                y[(r0 + r) * ldy + j] = bias ? sums[r] + bias[j] : sums[r];
        }
    }
    return 0;
}

/* Bytes of the scratch q8_linear_rows quantizes m rows of k activations into: the int8
 * values, then their scales and sums (64-byte aligned parts). */
int64_t q8_rows_scratch_bytes(int64_t m, int64_t k) {
    return round_up(m * k, 64) + round_up(m * (k / QK) * 8, 64);
}

/* q8_linear of x [m, k] float32 (row stride ldx) itself: its rows quantized (as
 * q8_quantize_rows does) into `scratch` (q8_rows_scratch_bytes, 64-byte aligned), then
 * multiplied, in one call. */
int q8_linear_rows(int fmt, const float *x, int64_t ldx, int64_t m, int64_t k, uint8_t *scratch,
                   const uint8_t *w, int64_t row_stride, int64_t n, const float *bias, float *y,
                   int64_t ldy, int path, int threads) {
    if (k % QK) return -1;
    int8_t *xq = (int8_t *)scratch;
    float *xd = (float *)(scratch + round_up(m * k, 64));
    int32_t *xs = (int32_t *)(xd + m * (k / QK));
    q8_quantize_rows(x, ldx, m, k, xq, xd, xs);
    return q8_linear(fmt, xq, xd, xs, m, k, w, row_stride, n, bias, y, ldy, path, threads);
}
