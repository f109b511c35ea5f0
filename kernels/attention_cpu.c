/* Paged decode attention on the CPU: one query token per sequence over its cached context,
 * read in place through the block table (no gathered copy of K/V), with an online softmax
 * one KV block at a time and float32 sums whatever the cache dtype (float32 or bfloat16).
 *
 * One task per (sequence, KV head) computes the G = H / H_kv query heads that share that KV
 * head (GQA), so each key and value row is loaded once for all G of them. Tasks are spread
 * over OpenMP threads dynamically (contexts differ in length). Only positions below each
 * sequence's length are read: stale cache slots and table padding past its end never are.
 * A sliding window (window > 0) reads only the last `window` positions of each context: the
 * blocks before them are never touched. Built by kernels/attention_cpu.py.
 */
#include <math.h>

#include "cpu_simd.h"

#define DEFINE_DECODE(NAME, E, LOAD, STORE, GET, PUT)                                        \
    static inline float NAME##_dot(const float *q, const E *k, int64_t d) {                  \
        vf s = {0};                                                                        \
        int64_t i = 0;                                                                      \
        for (; i + W <= d; i += W) s += load_f32(q + i) * LOAD(k + i);                      \
        float r = hsum_tree(s);                                                             \
        for (; i < d; ++i) r += q[i] * GET(k + i);                                          \
        return r;                                                                           \
    }                                                                                       \
    static inline void NAME##_axpy(float *acc, float w, const E *v, int64_t d) {            \
        int64_t i = 0;                                                                      \
        for (; i + W <= d; i += W) store_f32(acc + i, load_f32(acc + i) + w * LOAD(v + i)); \
        for (; i < d; ++i) acc[i] += w * GET(v + i);                                        \
    }                                                                                       \
    void NAME(const E *q, int64_t q_seq, int64_t q_head, const E *k_cache,                   \
              const E *v_cache, int64_t c_block, int64_t c_pos, int64_t c_head,              \
              const int32_t *tables, int64_t table_row, const int32_t *lens, E *out,         \
              int64_t out_seq, int64_t out_head, int64_t batch, int64_t heads,               \
              int64_t kv_heads, int64_t d, int64_t block_size, float scale,                  \
              int64_t window, int32_t threads) {                                             \
        const int64_t group = heads / kv_heads;                                             \
        const int64_t padded = (block_size + W - 1) / W * W;                                \
        _Pragma("omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1)") \
        for (int64_t task = 0; task < batch * kv_heads; ++task) {                           \
            const int64_t b = task / kv_heads, kvh = task % kv_heads;                       \
            const int64_t len = lens[b];                                                    \
            const int64_t from = window > 0 && len > window ? len - window : 0;             \
            float qs[group * d], acc[group * d], scores[group * padded];                    \
            float m[group], l[group];                                                       \
            for (int64_t g = 0; g < group; ++g) {                                           \
                const E *qg = q + b * q_seq + (kvh * group + g) * q_head;                   \
                for (int64_t i = 0; i < d; ++i) qs[g * d + i] = GET(qg + i) * scale;        \
                m[g] = -INFINITY, l[g] = 0.0f;                                              \
            }                                                                               \
            memset(acc, 0, sizeof acc);                                                     \
            for (int64_t first = from; first < len;) {                                      \
                const int64_t next = (first / block_size + 1) * block_size;                 \
                const int64_t n = (len < next ? len : next) - first;                        \
                const int64_t block = tables[b * table_row + first / block_size];           \
                const int64_t offset = (first % block_size) * c_pos + kvh * c_head;         \
                const E *kb = k_cache + block * c_block + offset;                           \
                const E *vb = v_cache + block * c_block + offset;                           \
                first = next;                                                               \
                for (int64_t p = 0; p < n; ++p)                                             \
                    for (int64_t g = 0; g < group; ++g)                                     \
                        scores[g * padded + p] = NAME##_dot(qs + g * d, kb + p * c_pos, d);  \
                for (int64_t g = 0; g < group; ++g) {                                       \
                    float *sg = scores + g * padded;                                        \
                    float top = m[g];                                                       \
                    for (int64_t p = 0; p < n; ++p) top = sg[p] > top ? sg[p] : top;        \
                    for (int64_t p = n; p < padded; ++p) sg[p] = -INFINITY;                 \
                    const vf shift = (vf){0} + top;                                      \
                    vf total = {0};                                                        \
                    for (int64_t p = 0; p < padded; p += W) {                               \
                        const vf w = vexp(load_f32(sg + p) - shift);                      \
                        store_f32(sg + p, w);                                               \
                        total += w;                                                         \
                    }                                                                       \
                    const float rescale = m[g] == -INFINITY ? 0.0f : expf(m[g] - top);      \
                    if (rescale != 1.0f)                                                    \
                        for (int64_t i = 0; i < d; ++i) acc[g * d + i] *= rescale;          \
                    l[g] = l[g] * rescale + hsum_tree(total);                                    \
                    m[g] = top;                                                             \
                }                                                                           \
                for (int64_t p = 0; p < n; ++p)                                             \
                    for (int64_t g = 0; g < group; ++g)                                     \
                        NAME##_axpy(acc + g * d, scores[g * padded + p], vb + p * c_pos, d); \
            }                                                                               \
            for (int64_t g = 0; g < group; ++g) {                                           \
                E *og = out + b * out_seq + (kvh * group + g) * out_head;                   \
                const float inv = 1.0f / l[g];                                              \
                for (int64_t i = 0; i < d; ++i) PUT(og + i, acc[g * d + i] * inv);          \
            }                                                                               \
        }                                                                                   \
    }

DEFINE_DECODE(paged_decode_f32, float, load_f32, store_f32, get_f32, put_f32)
DEFINE_DECODE(paged_decode_bf16, bf16, load_bf16, store_bf16, get_bf16, put_bf16)
