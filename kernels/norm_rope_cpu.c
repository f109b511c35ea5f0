/* RMSNorm (optionally after the residual add) and in-place RoPE on the CPU: each one pass
 * over the rows, where torch runs five to seven small ops with a temporary each.
 *
 * Numerics follow HF Llama as kernels/norm.py and kernels/rope.py do: the norm sums squares in
 * float32, rounds x * rsqrt to the input dtype, then multiplies by the weight (rounding
 * again); the residual sum is rounded to the dtype before it is normalised. RoPE computes
 * x * cos + rotate_half(x) * sin in float32 and rounds once. float32 (f32) and bfloat16 (bf16).
 * Built by kernels/norm_rope_cpu.py.
 */
#include <math.h>

#include "cpu_simd.h"

#define DEFINE_NORM(NAME, E, LOAD, STORE, GET, PUT)                                          \
    static inline float NAME##_round(float v) {                                             \
        E e;                                                                                \
        PUT(&e, v);                                                                         \
        return GET(&e);                                                                     \
    }                                                                                       \
    /* out = weight * norm(x + residual); summed = x + residual. residual may be NULL. */     \
    void NAME(const E *x, int64_t x_row, const E *residual, int64_t residual_row,            \
              const E *weight, E *out, int64_t out_row, E *summed, int64_t summed_row,       \
              int64_t rows, int64_t hidden, float eps, int32_t threads) {                    \
        _Pragma("omp parallel for num_threads(threads) schedule(static) if (threads > 1)")   \
        for (int64_t t = 0; t < rows; ++t) {                                                \
            const E *xt = x + t * x_row;                                                    \
            const E *src = xt;                                                              \
            if (residual) {                                                                 \
                const E *rt = residual + t * residual_row;                                  \
                E *st = summed + t * summed_row;                                            \
                int64_t i = 0;                                                              \
                for (; i + W <= hidden; i += W) STORE(st + i, LOAD(xt + i) + LOAD(rt + i)); \
                for (; i < hidden; ++i) PUT(st + i, GET(xt + i) + GET(rt + i));             \
                src = st;                                                                   \
            }                                                                               \
            vf sq = {0};                                                                   \
            int64_t i = 0;                                                                  \
            for (; i + W <= hidden; i += W) {                                               \
                const vf v = LOAD(src + i);                                                \
                sq += v * v;                                                                \
            }                                                                               \
            float total = hsum(sq);                                                         \
            for (; i < hidden; ++i) total += GET(src + i) * GET(src + i);                   \
            const float inv = 1.0f / sqrtf(total / (float)hidden + eps);                    \
            E *ot = out + t * out_row;                                                      \
            for (i = 0; i < hidden; ++i)                                                    \
                PUT(ot + i, GET(weight + i) * NAME##_round(GET(src + i) * inv));            \
        }                                                                                   \
    }

DEFINE_NORM(rms_norm_f32, float, load_f32, store_f32, get_f32, put_f32)
DEFINE_NORM(rms_norm_bf16, bf16, load_bf16, store_bf16, get_bf16, put_bf16)

/* x[t, h] rotated in place by table[positions[t]] = [cos (D), sin (D)] (HF layout: the D/2
 * frequencies twice), for `heads` heads of size D at stride head_row within a row. */
#define DEFINE_ROPE(NAME, E, GET, PUT)                                                       \
    void NAME(E *x, int64_t x_row, int64_t head_row, int64_t rows, int64_t heads, int64_t d, \
              const E *table, int64_t table_row, const int64_t *positions, int32_t threads) { \
        const int64_t half = d / 2;                                                         \
        _Pragma("omp parallel for num_threads(threads) schedule(static) if (threads > 1)")   \
        for (int64_t t = 0; t < rows; ++t) {                                                \
            const E *cos = table + positions[t] * table_row;                                \
            const E *sin = cos + d;                                                         \
            for (int64_t h = 0; h < heads; ++h) {                                           \
                E *xh = x + t * x_row + h * head_row;                                       \
                for (int64_t i = 0; i < half; ++i) {                                        \
                    const float x1 = GET(xh + i), x2 = GET(xh + half + i);                  \
                    PUT(xh + i, x1 * GET(cos + i) - x2 * GET(sin + i));                     \
                    PUT(xh + half + i, x2 * GET(cos + half + i) + x1 * GET(sin + half + i)); \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
    }

DEFINE_ROPE(rope_f32, float, get_f32, put_f32)
DEFINE_ROPE(rope_bf16, bf16, get_bf16, put_bf16)
