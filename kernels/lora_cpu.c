/* Batched LoRA on the CPU for decode-sized batches (Punica's BGMV): each token reads its own
 * slot's weights, so many adapters in one batch cost what one does. torch's grouped matmul
 * pays ~10 us per adapter group per call; these loops pay nothing per group.
 *
 * Threads split the output columns (rank rows for shrink, chunks of d_out for expand) and
 * walk the tokens in order, so when the batch is sorted by slot the weight rows a thread
 * reads stay in cache from one token to the next. Sums run in float32 16-lane vectors.
 *
 * Two element types, one code: float32 (suffix f32) and bfloat16 (suffix bf16: bf16 in and
 * out, float32 sums, and in lora_apply_bf16 a float32 intermediate x A^T), so a bf16 model
 * converts nothing around its LoRA calls. Where the CPU has AVX512-BF16, the bf16 dot
 * products run on vdpbf16ps (bf16 pairs into float32 sums) and lora_apply_bf16's expand
 * rounds the intermediate to bf16 to pair it. The last dimension of every tensor is contiguous,
 * other strides are passed. Rows whose slot is negative (base model only) are skipped: shrink
 * writes zeros there and expand leaves `out` untouched. Built by kernels/lora_cpu.py.
 *
 * The loops read each slot's weights through a pointer per slot and a rank per slot, so a
 * slot's rows can live anywhere: in the stacked slot tensors (the entry points that take a
 * stack and a slot stride build the pointers), or, on the CPU, in the CPU tier's own copy of
 * an adapter (adapters/slots.py), which makes putting an adapter in a slot a pointer change
 * rather than a copy. A NULL pointer is a slot that adds nothing.
 */
#include <omp.h>
#include <stdlib.h>

#include "cpu_simd.h"
#include "lora_tiles.h"

/* Pointers to each slot of a stack, and one rank for all: what the stacked entry points
 * hand to the per-slot loops. Sized by the largest slot the batch uses. */
typedef struct {
    const void **at;
    int64_t *ranks;
} slot_table;

static slot_table stacked_slots(const char *base, int64_t slot_bytes, int64_t rank,
                                const int64_t *slots, int64_t num_tokens) {
    int64_t count = 1;
    for (int64_t t = 0; t < num_tokens; ++t)
        if (slots[t] + 1 > count) count = slots[t] + 1;
    slot_table table = {malloc(count * sizeof(void *)), malloc(count * sizeof(int64_t))};
    for (int64_t s = 0; s < count; ++s) {
        table.at[s] = base + s * slot_bytes;
        table.ranks[s] = rank;
    }
    return table;
}

static void free_slots(slot_table table) {
    free(table.at);
    free(table.ranks);
}

/* Four dot products sharing the loads of x: x . a0, x . a1, x . a2, x . a3. */
#define DEFINE_DOT(E, LOAD, GET)                                                            \
    static inline void dot4_##E(const E *x, const E *a0, const E *a1, const E *a2,          \
                                const E *a3, int64_t n, float *out) {                       \
        vf s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};                                         \
        int64_t k = 0;                                                                      \
        for (; k + W <= n; k += W) {                                                        \
            const vf xv = LOAD(x + k);                                                     \
            s0 += xv * LOAD(a0 + k);                                                        \
            s1 += xv * LOAD(a1 + k);                                                        \
            s2 += xv * LOAD(a2 + k);                                                        \
            s3 += xv * LOAD(a3 + k);                                                        \
        }                                                                                   \
        float r0 = hsum(s0), r1 = hsum(s1), r2 = hsum(s2), r3 = hsum(s3);                   \
        for (; k < n; ++k) {                                                                \
            const float xk = GET(x + k);                                                    \
            r0 += xk * GET(a0 + k);                                                         \
            r1 += xk * GET(a1 + k);                                                         \
            r2 += xk * GET(a2 + k);                                                         \
            r3 += xk * GET(a3 + k);                                                         \
        }                                                                                   \
        out[0] = r0, out[1] = r1, out[2] = r2, out[3] = r3;                                 \
    }                                                                                       \
    static inline float dot1_##E(const E *x, const E *a, int64_t n) {                       \
        vf s = {0};                                                                        \
        int64_t k = 0;                                                                      \
        for (; k + W <= n; k += W) s += LOAD(x + k) * LOAD(a + k);                          \
        float r = hsum(s);                                                                  \
        for (; k < n; ++k) r += GET(x + k) * GET(a + k);                                    \
        return r;                                                                           \
    }                                                                                       \
    /* dot4 for two tokens of one slot: each row of a is loaded once for both. */           \
    static inline void dot4x2_##E(const E *x, const E *z, const E *a0, const E *a1,         \
                                  const E *a2, const E *a3, int64_t n, float *out,          \
                                  float *out2) {                                            \
        vf s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, u0 = {0}, u1 = {0}, u2 = {0}, u3 = {0};  \
        int64_t k = 0;                                                                      \
        for (; k + W <= n; k += W) {                                                        \
            const vf xv = LOAD(x + k), zv = LOAD(z + k);                                    \
            const vf v0 = LOAD(a0 + k), v1 = LOAD(a1 + k);                                  \
            const vf v2 = LOAD(a2 + k), v3 = LOAD(a3 + k);                                  \
            s0 += xv * v0, s1 += xv * v1, s2 += xv * v2, s3 += xv * v3;                     \
            u0 += zv * v0, u1 += zv * v1, u2 += zv * v2, u3 += zv * v3;                     \
        }                                                                                   \
        float r[8] = {hsum(s0), hsum(s1), hsum(s2), hsum(s3),                               \
                      hsum(u0), hsum(u1), hsum(u2), hsum(u3)};                              \
        const E *rows[4] = {a0, a1, a2, a3};                                                \
        for (; k < n; ++k)                                                                  \
            for (int i = 0; i < 4; ++i) {                                                   \
                r[i] += GET(x + k) * GET(rows[i] + k);                                      \
                r[4 + i] += GET(z + k) * GET(rows[i] + k);                                  \
            }                                                                               \
        for (int i = 0; i < 4; ++i) out[i] = r[i], out2[i] = r[4 + i];                      \
    }                                                                                       \
    /* dot4 for three tokens of one slot (a run of a prompt's rows): twelve sums, so the    \
     * FMAs never wait on each other, each row of a loaded once for all three. Every sum is \
     * dot4's own, term by term: the results are bit-equal to it. */                        \
    static inline void dot4x3_##E(const E *const *xs, const E *const *rows, int64_t n,      \
                                  float *out) {                                             \
        vf s[3][4] = {{{0}}};                                                              \
        int64_t k = 0;                                                                      \
        for (; k + W <= n; k += W) {                                                        \
            const vf v[4] = {LOAD(rows[0] + k), LOAD(rows[1] + k), LOAD(rows[2] + k),       \
                             LOAD(rows[3] + k)};                                            \
            _Pragma("GCC unroll 3") for (int t = 0; t < 3; ++t) {                          \
                const vf xv = LOAD(xs[t] + k);                                              \
                _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) s[t][i] += xv * v[i];   \
            }                                                                               \
        }                                                                                   \
        for (int t = 0; t < 3; ++t)                                                         \
            for (int i = 0; i < 4; ++i) {                                                   \
                float r = hsum(s[t][i]);                                                    \
                for (int64_t m = k; m < n; ++m) r += GET(xs[t] + m) * GET(rows[i] + m);    \
                out[4 * t + i] = r;                                                         \
            }                                                                               \
    }

typedef float f32;
DEFINE_DOT(f32, load_f32, get_f32)
#if defined(__AVX512BF16__)
/* bfloat16 pairs multiplied and summed into float32 lanes by one instruction (vdpbf16ps):
 * 32 elements per step, no conversion of either side. */
#include <immintrin.h>
static inline __m512bh load_bh(const bf16 *p) { return (__m512bh)_mm512_loadu_si512(p); }
static inline void dot4_bf16(const bf16 *x, const bf16 *a0, const bf16 *a1, const bf16 *a2,
                             const bf16 *a3, int64_t n, float *out) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t k = 0;
    for (; k + 32 <= n; k += 32) {
        const __m512bh xv = load_bh(x + k);
        s0 = _mm512_dpbf16_ps(s0, xv, load_bh(a0 + k));
        s1 = _mm512_dpbf16_ps(s1, xv, load_bh(a1 + k));
        s2 = _mm512_dpbf16_ps(s2, xv, load_bh(a2 + k));
        s3 = _mm512_dpbf16_ps(s3, xv, load_bh(a3 + k));
    }
    float r0 = _mm512_reduce_add_ps(s0), r1 = _mm512_reduce_add_ps(s1);
    float r2 = _mm512_reduce_add_ps(s2), r3 = _mm512_reduce_add_ps(s3);
    for (; k < n; ++k) {
        const float xk = get_bf16(x + k);
        r0 += xk * get_bf16(a0 + k);
        r1 += xk * get_bf16(a1 + k);
        r2 += xk * get_bf16(a2 + k);
        r3 += xk * get_bf16(a3 + k);
    }
    out[0] = r0, out[1] = r1, out[2] = r2, out[3] = r3;
}
static inline float dot1_bf16(const bf16 *x, const bf16 *a, int64_t n) {
    float out[4];
    dot4_bf16(x, a, a, a, a, n, out);
    return out[0];
}
static inline void dot4x2_bf16(const bf16 *x, const bf16 *z, const bf16 *a0, const bf16 *a1,
                               const bf16 *a2, const bf16 *a3, int64_t n, float *out,
                               float *out2) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    __m512 u0 = s0, u1 = s0, u2 = s0, u3 = s0;
    int64_t k = 0;
    for (; k + 32 <= n; k += 32) {
        const __m512bh xv = load_bh(x + k), zv = load_bh(z + k);
        const __m512bh v0 = load_bh(a0 + k), v1 = load_bh(a1 + k);
        const __m512bh v2 = load_bh(a2 + k), v3 = load_bh(a3 + k);
        s0 = _mm512_dpbf16_ps(s0, xv, v0), u0 = _mm512_dpbf16_ps(u0, zv, v0);
        s1 = _mm512_dpbf16_ps(s1, xv, v1), u1 = _mm512_dpbf16_ps(u1, zv, v1);
        s2 = _mm512_dpbf16_ps(s2, xv, v2), u2 = _mm512_dpbf16_ps(u2, zv, v2);
        s3 = _mm512_dpbf16_ps(s3, xv, v3), u3 = _mm512_dpbf16_ps(u3, zv, v3);
    }
    float r[8] = {_mm512_reduce_add_ps(s0), _mm512_reduce_add_ps(s1),
                  _mm512_reduce_add_ps(s2), _mm512_reduce_add_ps(s3),
                  _mm512_reduce_add_ps(u0), _mm512_reduce_add_ps(u1),
                  _mm512_reduce_add_ps(u2), _mm512_reduce_add_ps(u3)};
    const bf16 *rows[4] = {a0, a1, a2, a3};
    for (; k < n; ++k)
        for (int i = 0; i < 4; ++i) {
            r[i] += get_bf16(x + k) * get_bf16(rows[i] + k);
            r[4 + i] += get_bf16(z + k) * get_bf16(rows[i] + k);
        }
    for (int i = 0; i < 4; ++i) out[i] = r[i], out2[i] = r[4 + i];
}
/* Three tokens as two and one: the same sums as dot4 and dot4x2 (vdpbf16ps). */
static inline void dot4x3_bf16(const bf16 *const *xs, const bf16 *const *rows, int64_t n,
                               float *out) {
    dot4x2_bf16(xs[0], xs[1], rows[0], rows[1], rows[2], rows[3], n, out, out + 4);
    dot4_bf16(xs[2], rows[0], rows[1], rows[2], rows[3], n, out + 8);
}
#else
DEFINE_DOT(bf16, load_bf16, get_bf16)
#endif

/* y[t, j] = sum_k x[t, k] * a[slot[t]][j, k] for j < rank, zero past the slot's own rank;
 * x and a of type E, y of type Y. The stacked entry point NAME takes a[s] = a + s * a_slot.
 * NAME##_quad computes rank rows 4q..4q+3 for tokens first..end-1, three or two tokens of
 * one slot at a time where it can (a prompt chunk's rows: 1.1-1.2x the speed of two at a
 * time for ranks 16-64 over 150 rows, benchmarks/lora_kernel_ab.py). Threads split the
 * quads; one thread alone goes run by run (the tokens of one slot), each run through all
 * its quads: a slot's A is then read front to back in one go (a decode batch of one token
 * per slot streams each A whole, where quad by quad over the batch it read 4 rows of each
 * slot in turn), and a long run still reads each quad's rows from L1 for all its tokens.
 * Each y[t, j] is the same sum either way: the groups never span two slots, and each
 * token's sums are the one-token path's. */
#define DEFINE_SHRINK(NAME, E, Y, PUT)                                                      \
    static inline void NAME##_quad(const E *x, int64_t x_row, const void *const *a,          \
                                   const int64_t *ranks, int64_t a_row, Y *y, int64_t y_row, \
                                   const int64_t *slots, int64_t first, int64_t end,         \
                                   int64_t q, int64_t rank, int64_t d_in) {                  \
        const int64_t j = 4 * q;                                                            \
        for (int64_t t = first; t < end; ++t) {                                             \
            const int64_t s = slots[t];                                                     \
            Y *yt = y + t * y_row + j;                                                      \
            float sums[4] = {0.0f, 0.0f, 0.0f, 0.0f};                                       \
            const int64_t n = rank - j < 4 ? rank - j : 4;                                  \
            const int64_t own = s >= 0 && a[s] ? ranks[s] - j : 0;                          \
            if (own >= 4 && n == 4 && t + 2 < end && slots[t + 1] == s &&                   \
                slots[t + 2] == s) {                                                        \
                /* the next two tokens read the same slot: one pass over its rows */        \
                const E *aj = (const E *)a[s] + j * a_row;                                  \
                const E *xs[3] = {x + t * x_row, x + (t + 1) * x_row, x + (t + 2) * x_row}; \
                const E *rows[4] = {aj, aj + a_row, aj + 2 * a_row, aj + 3 * a_row};        \
                float three[12];                                                            \
                dot4x3_##E(xs, rows, d_in, three);                                          \
                for (int64_t u = 0; u < 3; ++u)                                             \
                    for (int64_t i = 0; i < 4; ++i) PUT(yt + u * y_row + i, three[4 * u + i]); \
                t += 2;                                                                     \
                continue;                                                                   \
            }                                                                               \
            if (own >= 4 && n == 4 && t + 1 < end && slots[t + 1] == s) {                   \
                /* the next token reads the same slot: one pass over its rows */            \
                const E *aj = (const E *)a[s] + j * a_row;                                  \
                float next[4];                                                              \
                dot4x2_##E(x + t * x_row, x + (t + 1) * x_row, aj, aj + a_row,              \
                           aj + 2 * a_row, aj + 3 * a_row, d_in, sums, next);               \
                for (int64_t i = 0; i < 4; ++i) PUT(yt + i, sums[i]);                       \
                for (int64_t i = 0; i < 4; ++i) PUT(yt + y_row + i, next[i]);               \
                ++t;                                                                        \
                continue;                                                                   \
            }                                                                               \
            if (own > 0) {                                                                  \
                const E *xt = x + t * x_row;                                                \
                const E *aj = (const E *)a[s] + j * a_row;                                  \
                if (n == 4 && own >= 4) {                                                   \
                    dot4_##E(xt, aj, aj + a_row, aj + 2 * a_row, aj + 3 * a_row, d_in,      \
                             sums);                                                         \
                } else {                                                                    \
                    for (int64_t i = 0; i < n && i < own; ++i)                              \
                        sums[i] = dot1_##E(xt, aj + i * a_row, d_in);                       \
                }                                                                           \
            }                                                                               \
            for (int64_t i = 0; i < n; ++i) PUT(yt + i, sums[i]);                           \
        }                                                                                   \
    }                                                                                       \
    static void NAME##_slots(const E *x, int64_t x_row, const void *const *a,                \
                             const int64_t *ranks, int64_t a_row, Y *y, int64_t y_row,      \
                             const int64_t *slots, int64_t num_tokens, int64_t rank,         \
                             int64_t d_in, int32_t threads) {                                \
        const int64_t quads = (rank + 3) / 4;                                               \
        if (threads < 2) {                                                                  \
            for (int64_t first = 0, end; first < num_tokens; first = end) {                 \
                for (end = first + 1; end < num_tokens && slots[end] == slots[first];)      \
                    ++end;                                                                  \
                for (int64_t q = 0; q < quads; ++q)                                         \
                    NAME##_quad(x, x_row, a, ranks, a_row, y, y_row, slots, first, end, q,  \
                                rank, d_in);                                                \
            }                                                                               \
            return;                                                                         \
        }                                                                                   \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                   \
        for (int64_t q = 0; q < quads; ++q)                                                 \
            NAME##_quad(x, x_row, a, ranks, a_row, y, y_row, slots, 0, num_tokens, q, rank, \
                        d_in);                                                              \
    }                                                                                       \
    void NAME(const E *x, int64_t x_row, const E *a, int64_t a_slot, int64_t a_row, Y *y,    \
              int64_t y_row, const int64_t *slots, int64_t num_tokens, int64_t rank,         \
              int64_t d_in, int32_t threads) {                                               \
        slot_table table = stacked_slots((const char *)a, a_slot * (int64_t)sizeof(E), rank, \
                                         slots, num_tokens);                                \
        NAME##_slots(x, x_row, table.at, table.ranks, a_row, y, y_row, slots, num_tokens,    \
                     rank, d_in, threads);                                                  \
        free_slots(table);                                                                  \
    }

DEFINE_SHRINK(lora_shrink_f32, f32, float, put_f32)
DEFINE_SHRINK(lora_shrink_bf16, bf16, bf16, put_bf16)
DEFINE_SHRINK(shrink_bf16_to_f32, bf16, float, put_f32)

/* out[t, o] += scales[slot[t]] * sum_j y[t, j] * bt[slot[t]][j, o]   (bt = B transposed),
 * j below the slot's own rank. The delta is summed in registers, 64 columns at a time, and
 * added once, as (x A^T B^T) * scale is in PEFT, so the base output's low bits are not rounded
 * away rank by rank. scales are float32 whatever E is. The stacked entry point NAME takes
 * bt[s] = bt + s * b_slot and the same rank for every slot. */
#define EXPAND_CHUNK 256
/* Tokens of one slot the expand takes at a time where it finds that many together
 * (NAME##_run): as many as keep twelve or more sums of 4W columns in the registers. */
#if W == 16
#define RUN_TILE 6
#else
#define RUN_TILE 3
#endif

/* A decode row's expand walks its slot's rank rows 64 columns at a time, a row of B apart:
 * at rank 64 and up more streams than the prefetchers follow. In bf16 (vdpbf16ps) each pair
 * of B rows read asks for their next block's lines (EXPAND_AHEAD columns on) while this
 * block's sums run: 1.12-1.18x at ranks 8-128 for 64 rows over 64 slots on a 2-core Xeon
 * (lora_kernel_ab.py; 1.05-1.13x two blocks on). The float32 loops, with twice the lines a
 * block, lost 5-12% with it and go without. Past a row's end a prefetch touches the next
 * row, as a prefetch may. */
#define EXPAND_AHEAD 64
static inline void prefetch_block(const void *at, int64_t element) {
    for (int64_t line = 0; line < 64 * element; line += 64)
        __builtin_prefetch((const char *)at + line);
}

/* The columns from `from` to `last` that a whole 64-column block does not cover, for one
 * token: one column at a time. */
#define DEFINE_EXPAND_TAIL(NAME, E, Y, GET, PUT, GETY)                                      \
    static inline void NAME##_tail(const Y *yt, const E *b, int64_t b_row, int64_t rank,     \
                                   float scale, E *ot, int64_t from, int64_t last) {         \
        for (int64_t o = from; o < last; ++o) {                                             \
            float acc = 0.0f;                                                               \
            for (int64_t j = 0; j < rank; ++j) acc += GETY(yt + j) * GET(b + j * b_row + o);  \
            PUT(ot + o, GET(ot + o) + scale * acc);                                         \
        }                                                                                   \
    }

#define DEFINE_EXPAND(NAME, E, Y, LOAD, STORE, GET, PUT, GETY)                               \
    static inline void NAME##_64(const Y *yt, const E *b, int64_t b_row, int64_t rank,       \
                                 float scale, E *ot) {                                       \
        vf s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};                                         \
        for (int64_t j = 0; j < rank; ++j) {                                                \
            const float c = GETY(yt + j);                                                   \
            const E *bj = b + j * b_row;                                                    \
            s0 += c * LOAD(bj);                                                             \
            s1 += c * LOAD(bj + W);                                                         \
            s2 += c * LOAD(bj + 2 * W);                                                     \
            s3 += c * LOAD(bj + 3 * W);                                                     \
        }                                                                                   \
        STORE(ot, LOAD(ot) + scale * s0);                                                   \
        STORE(ot + W, LOAD(ot + W) + scale * s1);                                           \
        STORE(ot + 2 * W, LOAD(ot + 2 * W) + scale * s2);                                   \
        STORE(ot + 3 * W, LOAD(ot + 3 * W) + scale * s3);                                   \
    }                                                                                       \
    /* _64 for two tokens of one slot: each row of B is loaded once for both. */            \
    static inline void NAME##_64x2(const Y *yt, const Y *yu, const E *b, int64_t b_row,      \
                                   int64_t rank, float scale, E *ot, E *ou) {               \
        vf s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, u0 = {0}, u1 = {0}, u2 = {0}, u3 = {0};  \
        for (int64_t j = 0; j < rank; ++j) {                                                \
            const float c = GETY(yt + j), d = GETY(yu + j);                                 \
            const E *bj = b + j * b_row;                                                    \
            const vf v0 = LOAD(bj), v1 = LOAD(bj + W), v2 = LOAD(bj + 2 * W);               \
            const vf v3 = LOAD(bj + 3 * W);                                                 \
            s0 += c * v0, s1 += c * v1, s2 += c * v2, s3 += c * v3;                         \
            u0 += d * v0, u1 += d * v1, u2 += d * v2, u3 += d * v3;                         \
        }                                                                                   \
        STORE(ot, LOAD(ot) + scale * s0);                                                   \
        STORE(ot + W, LOAD(ot + W) + scale * s1);                                           \
        STORE(ot + 2 * W, LOAD(ot + 2 * W) + scale * s2);                                   \
        STORE(ot + 3 * W, LOAD(ot + 3 * W) + scale * s3);                                   \
        STORE(ou, LOAD(ou) + scale * u0);                                                   \
        STORE(ou + W, LOAD(ou + W) + scale * u1);                                           \
        STORE(ou + 2 * W, LOAD(ou + 2 * W) + scale * u2);                                   \
        STORE(ou + 3 * W, LOAD(ou + 3 * W) + scale * u3);                                   \
    }                                                                                       \
    /* RUN_TILE tokens of one slot by 4W columns: twelve sums or more that never wait on   \
     * each other, each row of B's strip loaded once for all the tile's tokens. The columns \
     * are _64's, each its sum term by term: the results are bit-equal to it (a column     \
     * summed here and one summed by _tail may round differently: the FMAs the compiler     \
     * fuses differ, so the run keeps _64's split of the columns). */                      \
    static inline __attribute__((always_inline)) void NAME##_tile(                          \
        const Y *yt, int64_t y_row, const E *b, int64_t b_row, int64_t rank, float scale,   \
        E *ot, int64_t out_row) {                                                           \
        vf s[RUN_TILE][4];                                                                  \
        for (int64_t t = 0; t < RUN_TILE; ++t)                                              \
            for (int64_t i = 0; i < 4; ++i) s[t][i] = (vf){0};                              \
        for (int64_t j = 0; j < rank; ++j) {                                                \
            const E *bj = b + j * b_row;                                                    \
            const vf v[4] = {LOAD(bj), LOAD(bj + W), LOAD(bj + 2 * W), LOAD(bj + 3 * W)};   \
            _Pragma("GCC unroll 6") for (int64_t t = 0; t < RUN_TILE; ++t) {               \
                const float c = GETY(yt + t * y_row + j);                                   \
                _Pragma("GCC unroll 4") for (int64_t i = 0; i < 4; ++i) s[t][i] += c * v[i]; \
            }                                                                               \
        }                                                                                   \
        for (int64_t t = 0; t < RUN_TILE; ++t) {                                            \
            E *row = ot + t * out_row;                                                      \
            for (int64_t i = 0; i < 4; ++i)                                                 \
                STORE(row + i * W, LOAD(row + i * W) + scale * s[t][i]);                    \
        }                                                                                   \
    }                                                                                       \
    /* A run of `count` tokens of one slot (a prompt chunk's rows), columns from..last-1:   \
     * RUN_TILE tokens at a time through every strip of 4W columns, so each row of B is     \
     * read once per RUN_TILE tokens where it was read once per two; the run's last tokens  \
     * one at a time. */                                                                    \
    static inline void NAME##_run(const Y *yt, int64_t y_row, const E *b, int64_t b_row,     \
                                  int64_t rank, float scale, E *ot, int64_t out_row,        \
                                  int64_t count, int64_t from, int64_t last) {              \
        const int64_t strips = from + (last - from) / (4 * W) * (4 * W);                    \
        for (int64_t t = 0; t < count; t += RUN_TILE) {                                     \
            const int64_t rows = count - t < RUN_TILE ? count - t : RUN_TILE;               \
            for (int64_t o = from; o < strips; o += 4 * W) {                                \
                if (rows == RUN_TILE) {                                                     \
                    NAME##_tile(yt + t * y_row, y_row, b + o, b_row, rank, scale,           \
                                ot + t * out_row + o, out_row);                             \
                    continue;                                                               \
                }                                                                           \
                for (int64_t u = t; u < t + rows; ++u)                                      \
                    NAME##_64(yt + u * y_row, b + o, b_row, rank, scale, ot + u * out_row + o); \
            }                                                                               \
            for (int64_t u = t; u < t + rows; ++u)                                          \
                NAME##_tail(yt + u * y_row, b, b_row, rank, scale, ot + u * out_row, strips, \
                            last);                                                          \
        }                                                                                   \
    }                                                                                       \
    static void NAME##_slots(const Y *y, int64_t y_row, const void *const *bt,               \
                             const int64_t *ranks, int64_t b_row, const float *scales,      \
                             E *out, int64_t out_row, const int64_t *slots,                  \
                             int64_t num_tokens, int64_t d_out, int32_t threads) {           \
        const int64_t chunks = (d_out + EXPAND_CHUNK - 1) / EXPAND_CHUNK;                   \
        _Pragma("omp parallel for num_threads(threads) schedule(static) if (threads > 1)")   \
        for (int64_t chunk = 0; chunk < chunks; ++chunk) {                                  \
            const int64_t first = chunk * EXPAND_CHUNK;                                     \
            const int64_t last = d_out < first + EXPAND_CHUNK ? d_out : first + EXPAND_CHUNK; \
            for (int64_t t = 0; t < num_tokens; ++t) {                                      \
                const int64_t s = slots[t];                                                 \
                if (s < 0 || !bt[s]) continue;                                              \
                const Y *yt = y + t * y_row;                                                \
                const E *bs = (const E *)bt[s];                                             \
                const int64_t rank = ranks[s];                                              \
                E *ot = out + t * out_row;                                                  \
                const float scale = scales[s];                                              \
                int64_t end = t + 1;                                                        \
                while (end < num_tokens && slots[end] == s) ++end;                          \
                if (end - t >= RUN_TILE) {                                                  \
                    NAME##_run(yt, y_row, bs, b_row, rank, scale, ot, out_row, end - t,     \
                               first, last);                                                \
                    t = end - 1;                                                            \
                    continue;                                                               \
                }                                                                           \
                int64_t o = first;                                                          \
                if (t + 1 < num_tokens && slots[t + 1] == s) {                              \
                    /* the next token reads the same slot: one pass over its B rows */      \
                    E *ou = ot + out_row;                                                   \
                    for (; o + 4 * W <= last; o += 4 * W)                                   \
                        NAME##_64x2(yt, yt + y_row, bs + o, b_row, rank, scale, ot + o,     \
                                    ou + o);                                                \
                    NAME##_tail(yt + y_row, bs, b_row, rank, scale, ou, o, last);           \
                    ++t;                                                                    \
                }                                                                           \
                for (; o + 4 * W <= last; o += 4 * W)                                       \
                    NAME##_64(yt, bs + o, b_row, rank, scale, ot + o);                      \
                NAME##_tail(yt, bs, b_row, rank, scale, ot, o, last);                       \
            }                                                                               \
        }                                                                                   \
    }

#define DEFINE_EXPAND_STACKED(NAME, E, Y)                                                   \
    void NAME(const Y *y, int64_t y_row, const E *bt, int64_t b_slot, int64_t b_row,         \
              const float *scales, E *out, int64_t out_row, const int64_t *slots,            \
              int64_t num_tokens, int64_t rank, int64_t d_out, int32_t threads) {            \
        slot_table table = stacked_slots((const char *)bt, b_slot * (int64_t)sizeof(E),      \
                                         rank, slots, num_tokens);                          \
        NAME##_slots(y, y_row, table.at, table.ranks, b_row, scales, out, out_row, slots,    \
                     num_tokens, d_out, threads);                                           \
        free_slots(table);                                                                  \
    }

DEFINE_EXPAND_TAIL(lora_expand_f32, f32, float, get_f32, put_f32, get_f32)
DEFINE_EXPAND(lora_expand_f32, f32, float, load_f32, store_f32, get_f32, put_f32, get_f32)
DEFINE_EXPAND_STACKED(lora_expand_f32, f32, float)
DEFINE_EXPAND_TAIL(lora_expand_bf16, bf16, bf16, get_bf16, put_bf16, get_bf16)
DEFINE_EXPAND(lora_expand_bf16, bf16, bf16, load_bf16, store_bf16, get_bf16, put_bf16, get_bf16)
DEFINE_EXPAND_STACKED(lora_expand_bf16, bf16, bf16)
DEFINE_EXPAND_TAIL(expand_f32_to_bf16, bf16, float, get_bf16, put_bf16, get_f32)
#if defined(__AVX512BF16__)
/* The bf16 model's expand by vdpbf16ps: two rank rows at a time, their B rows interleaved
 * (unpacklo/hi) and multiplied with y's two entries as one bf16 pair. y is rounded to bf16
 * first (as PEFT's bf16 lora_A output is); the sums stay float32. The unpacks interleave
 * within 128-bit lanes, so each pair of accumulators holds its 32 columns out of order
 * until the permutes at the end. */
static inline uint32_t bf16_pair(float low, float high) {
    bf16 l, h;
    put_bf16(&l, low);
    put_bf16(&h, high);
    return (uint32_t)l | (uint32_t)h << 16;
}

static inline void add_scaled_bf16(bf16 *ot, __m512 lo, __m512 hi, float scale) {
    const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21,
                                            22, 23);
    const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28,
                                             29, 30, 31);
    const vf c0 = (vf)_mm512_permutex2var_ps(lo, first, hi);
    const vf c1 = (vf)_mm512_permutex2var_ps(lo, second, hi);
    store_bf16(ot, load_bf16(ot) + scale * c0);
    store_bf16(ot + W, load_bf16(ot + W) + scale * c1);
}

static inline void prefetch_ahead_bf16(const bf16 *r0, int64_t b_row) {
    prefetch_block(r0 + EXPAND_AHEAD, sizeof(bf16));
    prefetch_block(r0 + b_row + EXPAND_AHEAD, sizeof(bf16));
}

static inline void expand_dp_64(const uint32_t *pairs, const bf16 *b, int64_t b_row,
                                int64_t rank, float scale, bf16 *ot) {
    __m512 lo0 = _mm512_setzero_ps(), hi0 = lo0, lo1 = lo0, hi1 = lo0;
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t j = 0; j < rank; j += 2) {
        const __m512bh yy = (__m512bh)_mm512_set1_epi32((int32_t)pairs[j / 2]);
        const bf16 *r0 = b + j * b_row;
        prefetch_ahead_bf16(r0, b_row);
        const __m512i a0 = _mm512_loadu_si512(r0), a1 = _mm512_loadu_si512(r0 + 32);
        const __m512i b0 = j + 1 < rank ? _mm512_loadu_si512(r0 + b_row) : zero;
        const __m512i b1 = j + 1 < rank ? _mm512_loadu_si512(r0 + b_row + 32) : zero;
        lo0 = _mm512_dpbf16_ps(lo0, (__m512bh)_mm512_unpacklo_epi16(a0, b0), yy);
        hi0 = _mm512_dpbf16_ps(hi0, (__m512bh)_mm512_unpackhi_epi16(a0, b0), yy);
        lo1 = _mm512_dpbf16_ps(lo1, (__m512bh)_mm512_unpacklo_epi16(a1, b1), yy);
        hi1 = _mm512_dpbf16_ps(hi1, (__m512bh)_mm512_unpackhi_epi16(a1, b1), yy);
    }
    add_scaled_bf16(ot, lo0, hi0, scale);
    add_scaled_bf16(ot + 32, lo1, hi1, scale);
}

/* expand_dp_64 for two tokens of one slot: each pair of B rows is loaded and interleaved
 * once for both. */
static inline void expand_dp_64x2(const uint32_t *pairs, const uint32_t *pairs2,
                                  const bf16 *b, int64_t b_row, int64_t rank, float scale,
                                  bf16 *ot, bf16 *ou) {
    __m512 lo0 = _mm512_setzero_ps(), hi0 = lo0, lo1 = lo0, hi1 = lo0;
    __m512 ml0 = lo0, mh0 = lo0, ml1 = lo0, mh1 = lo0;
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t j = 0; j < rank; j += 2) {
        const __m512bh yy = (__m512bh)_mm512_set1_epi32((int32_t)pairs[j / 2]);
        const __m512bh zz = (__m512bh)_mm512_set1_epi32((int32_t)pairs2[j / 2]);
        const bf16 *r0 = b + j * b_row;
        prefetch_ahead_bf16(r0, b_row);
        const __m512i a0 = _mm512_loadu_si512(r0), a1 = _mm512_loadu_si512(r0 + 32);
        const __m512i b0 = j + 1 < rank ? _mm512_loadu_si512(r0 + b_row) : zero;
        const __m512i b1 = j + 1 < rank ? _mm512_loadu_si512(r0 + b_row + 32) : zero;
        const __m512bh p0 = (__m512bh)_mm512_unpacklo_epi16(a0, b0);
        const __m512bh q0 = (__m512bh)_mm512_unpackhi_epi16(a0, b0);
        const __m512bh p1 = (__m512bh)_mm512_unpacklo_epi16(a1, b1);
        const __m512bh q1 = (__m512bh)_mm512_unpackhi_epi16(a1, b1);
        lo0 = _mm512_dpbf16_ps(lo0, p0, yy), ml0 = _mm512_dpbf16_ps(ml0, p0, zz);
        hi0 = _mm512_dpbf16_ps(hi0, q0, yy), mh0 = _mm512_dpbf16_ps(mh0, q0, zz);
        lo1 = _mm512_dpbf16_ps(lo1, p1, yy), ml1 = _mm512_dpbf16_ps(ml1, p1, zz);
        hi1 = _mm512_dpbf16_ps(hi1, q1, yy), mh1 = _mm512_dpbf16_ps(mh1, q1, zz);
    }
    add_scaled_bf16(ot, lo0, hi0, scale);
    add_scaled_bf16(ot + 32, lo1, hi1, scale);
    add_scaled_bf16(ou, ml0, mh0, scale);
    add_scaled_bf16(ou + 32, ml1, mh1, scale);
}

static void expand_f32_to_bf16_slots(const float *y, int64_t y_row, const void *const *bt,
                                     const int64_t *ranks, int64_t b_row, const float *scales,
                                     bf16 *out, int64_t out_row, const int64_t *slots,
                                     int64_t num_tokens, int64_t d_out, int32_t threads) {
    const int64_t width = (y_row + 1) / 2;
    uint32_t *pairs = malloc((num_tokens * width + 1) * sizeof(uint32_t));
    for (int64_t t = 0; t < num_tokens; ++t)
        for (int64_t k = 0; k < width; ++k)
            pairs[t * width + k] = bf16_pair(y[t * y_row + 2 * k],
                                             2 * k + 1 < y_row ? y[t * y_row + 2 * k + 1] : 0.0f);
    const int64_t chunks = (d_out + EXPAND_CHUNK - 1) / EXPAND_CHUNK;
    _Pragma("omp parallel for num_threads(threads) schedule(static) if (threads > 1)")
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        const int64_t first = chunk * EXPAND_CHUNK;
        const int64_t last = d_out < first + EXPAND_CHUNK ? d_out : first + EXPAND_CHUNK;
        for (int64_t t = 0; t < num_tokens; ++t) {
            const int64_t s = slots[t];
            if (s < 0 || !bt[s]) continue;
            const bf16 *bs = (const bf16 *)bt[s];
            const int64_t rank = ranks[s];
            const float *yt = y + t * y_row;
            const uint32_t *pt = pairs + t * width;
            bf16 *ot = out + t * out_row;
            int64_t o = first;
            if (t + 1 < num_tokens && slots[t + 1] == s) {
                /* the next token reads the same slot: one pass over its B rows */
                bf16 *ou = ot + out_row;
                for (; o + 64 <= last; o += 64)
                    expand_dp_64x2(pt, pt + width, bs + o, b_row, rank, scales[s], ot + o,
                                   ou + o);
                expand_f32_to_bf16_tail(yt + y_row, bs, b_row, rank, scales[s], ou, o, last);
                ++t;
            }
            for (; o + 64 <= last; o += 64)
                expand_dp_64(pt, bs + o, b_row, rank, scales[s], ot + o);
            expand_f32_to_bf16_tail(yt, bs, b_row, rank, scales[s], ot, o, last);
        }
    }
    free(pairs);
}
#else
DEFINE_EXPAND(expand_f32_to_bf16, bf16, float, load_bf16, store_bf16, get_bf16, put_bf16,
              get_f32)
#endif
DEFINE_EXPAND_STACKED(expand_f32_to_bf16, bf16, float)

/* out += scales[slot] * (x A^T) B^T in one call: the shrink into y (num_tokens x rank, float32
 * scratch), then the expand from it. */
void lora_apply_f32(const float *x, int64_t x_row, const float *a, int64_t a_slot,
                    int64_t a_row, const float *bt, int64_t b_slot, int64_t b_row,
                    const float *scales, float *out, int64_t out_row, const int64_t *slots,
                    int64_t num_tokens, int64_t rank, int64_t d_in, int64_t d_out, float *y,
                    int32_t threads) {
    lora_shrink_f32(x, x_row, a, a_slot, a_row, y, rank, slots, num_tokens, rank, d_in, threads);
    lora_expand_f32(y, rank, bt, b_slot, b_row, scales, out, out_row, slots, num_tokens, rank,
                    d_out, threads);
}

void lora_apply_bf16(const bf16 *x, int64_t x_row, const bf16 *a, int64_t a_slot,
                     int64_t a_row, const bf16 *bt, int64_t b_slot, int64_t b_row,
                     const float *scales, bf16 *out, int64_t out_row, const int64_t *slots,
                     int64_t num_tokens, int64_t rank, int64_t d_in, int64_t d_out, float *y,
                     int32_t threads) {
    shrink_bf16_to_f32(x, x_row, a, a_slot, a_row, y, rank, slots, num_tokens, rank, d_in,
                       threads);
    expand_f32_to_bf16(y, rank, bt, b_slot, b_row, scales, out, out_row, slots, num_tokens,
                       rank, d_out, threads);
}

/* One module of a projection the model fuses (q/k/v, gate/up), over the slots: where each
 * slot's A and B (transposed) rows start (NULL: the slot adds nothing here) and how many rank
 * rows it has (at most the call's rank), the row strides, and where the module's columns
 * start in the fused output. */
typedef struct {
    const void *const *a;
    const void *const *bt;
    const int64_t *ranks;
    int64_t a_row, b_row, d_out, column;
} lora_module;

/* Every module of a fused projection in one call: module m adds its delta to its own
 * columns, out[:, column : column + d_out]. The same shrink and expand as lora_apply, one
 * module after the other, each slot read through its own pointers.
 *
 * The threads split the rows: each takes one contiguous share of the (slot-sorted) rows
 * through every module's shrink and expand, in one parallel region a call with no barrier
 * inside, and mostly reads its own slots' weights. Splitting each module's columns instead
 * costs a parallel region per shrink and per expand (14 a layer of the default model) whose
 * threads wait on each other (a decode step's 192-column k and v give one thread all the
 * work): on a 2-core Xeon, 64 rows over 16 rank-8 slots took 0.27 ms a layer split by rows
 * against 0.33 by columns (benchmarks/lora_kernel_ab.py: 1.2-1.35x from 8 rows up, ranks 8-64,
 * both dtypes). Under TOKENS_PER_THREAD rows a thread the columns are split as before, but
 * for a call of at most SERIAL_ROW_RANKS rows times rank, which one thread does alone (1 row
 * of rank 8: 43 us a layer against 54 by columns; 4 rows of rank 32: 0.75x). Each row's sums
 * are the same whichever thread computes them: the results are bit-equal. */
#define TOKENS_PER_THREAD 2
#define SERIAL_ROW_RANKS 32

/* What a run's first row costs over each further row of it: the first reads the slot's
 * weights from memory (a decode row mostly waits on them), a further row only multiplies
 * them again from cache. Rows weigh their slot's own rank besides. */
#define FIRST_ROW_WEIGHT 8

/* A slot's own rank: the most rank rows it reads in any module (0 for -1, or a slot that
 * adds nothing). */
static inline int64_t own_rank(const lora_module *modules, int64_t num_modules, int64_t s) {
    int64_t own = 0;
    for (int64_t m = 0; s >= 0 && m < num_modules; ++m)
        if (modules[m].a[s] && modules[m].ranks[s] > own) own = modules[m].ranks[s];
    return own;
}

/* The rows' shares of `n` threads: thread i takes rows bounds[i] to bounds[i + 1] - 1, the
 * (slot-sorted) rows cut where each share weighs about as much, a row weighing its slot's
 * own rank (its most rank rows in any module), FIRST_ROW_WEIGHT times that where it starts
 * a run of its slot, nothing where it has no slot (or the tiles took it). Split
 * by count, a decode batch over power-law adapters gave one thread the popular slots' many
 * rows and the other most of the distinct slots, whose weights are what a decode call
 * reads: the first waited for the second (W3 in benchmarks/vs_vllm.py: one thread did 2.7x
 * the other's LoRA work). Each row's sums are the same on either thread. */
static void share_rows(const int64_t *slots, int64_t num_tokens, const lora_module *modules,
                       int64_t num_modules, int64_t n, int64_t *bounds) {
    int64_t total = 0;
    for (int64_t pass = 0; pass < 2; ++pass) {
        int64_t sum = 0, share = 1, own = 0;
        for (int64_t t = 0; t < num_tokens; ++t) {
            const int64_t s = slots[t];
            const int first = !t || s != slots[t - 1];
            if (first) own = own_rank(modules, num_modules, s);
            if (pass) /* thread `share` starts at the first row past its share's weight */
                while (share < n && sum * n >= total * share) bounds[share++] = t;
            sum += own * (first ? FIRST_ROW_WEIGHT : 1);
        }
        if (pass)
            while (share < n) bounds[share++] = num_tokens;
        total = sum;
        if (!total) break;
    }
    bounds[0] = 0, bounds[n] = num_tokens;
    if (!total) /* no row weighs anything: by count */
        for (int64_t i = 1; i < n; ++i) bounds[i] = num_tokens * i / n;
}

/* share_rows as the native call plans it, for a caller to read (tests, benchmarks). */
void lora_share_rows(const int64_t *slots, int64_t num_tokens, const lora_module *modules,
                     int64_t num_modules, int64_t n, int64_t *bounds) {
    share_rows(slots, num_tokens, modules, num_modules, n, bounds);
}

/* The slots the loops take beside the tiles: `slots` with -1 on the whole tiles of 16 rows
 * of each run the tiles take (lora_tiles.h): runs of at least `tile_rows` rows of one slot
 * (0: none) whose rows times the slot's own rank (its most rank rows in any module) reach
 * `tile_row_ranks`, judged on the whole batch before the threads share it out (a 256-row
 * chunk split 132 and 124 with the rows kept only one half over a 128-row rule). A row set
 * to -1 whose slot is not -1 is a tile's. NULL where no run is taken, or d_in is no
 * multiple of a tile's 32 columns; the caller frees it. `scratch`: raised to the most
 * scratch one thread's tiles may need. */
static int64_t *loop_slots(const int64_t *slots, int64_t num_tokens, const lora_module *modules,
                           int64_t num_modules, int64_t d_in, int64_t tile_rows,
                           int64_t tile_row_ranks, size_t *scratch) {
    if (tile_rows <= 0 || d_in % TILE_K) return NULL;
    if (tile_rows < TILE_M) tile_rows = TILE_M;
    int64_t widest = 0;
    for (int64_t m = 0; m < num_modules; ++m)
        if (modules[m].d_out > widest) widest = modules[m].d_out;
    int64_t *rest = NULL;
    for (int64_t first = 0, end; first < num_tokens; first = end) {
        const int64_t s = slots[first];
        for (end = first + 1; end < num_tokens && slots[end] == s;) ++end;
        if (s < 0 || end - first < tile_rows) continue;
        const int64_t own = own_rank(modules, num_modules, s);
        if (!own || (end - first) * own < tile_row_ranks) continue;
        if (!rest) {
            if (!(rest = malloc(num_tokens * sizeof(int64_t)))) return NULL;
            memcpy(rest, slots, num_tokens * sizeof(int64_t));
        }
        const int64_t rows = (end - first) / TILE_M * TILE_M;
        for (int64_t t = first; t < first + rows; ++t) rest[t] = -1;
        const size_t bytes = scratch_bytes(rows, own, d_in, widest);
        if (bytes > *scratch) *scratch = bytes;
    }
    return rest;
}

/* Thread `i` of `n`'s share of the tiles' rows (`rest` -1 where `slots` is not, as
 * loop_slots marks them) through the tiles, every module (bf16), in its own `scratch`:
 * each run's tiles are shared out between the threads (a 32-row run of a prompt gives
 * each of two threads a tile; split with the batch's rows, one thread held most of the run
 * and the other read its weights again for a few rows on the loops). Returns the rows this
 * thread's tiles took. */
static int64_t tile_runs(const bf16 *x, int64_t x_row, const lora_module *modules,
                         int64_t num_modules, const float *scales, bf16 *out, int64_t out_row,
                         const int64_t *slots, int64_t num_tokens, int64_t d_in,
                         const int64_t *rest, int64_t i, int64_t n, char *scratch) {
    int64_t tiled = 0, began = 0;
    for (int64_t first = 0, end; first < num_tokens; first = end) {
        const int64_t s = slots[first];
        for (end = first + 1; end < num_tokens && slots[end] == s;) ++end;
        if (s < 0 || rest[first] >= 0) continue;
        const int64_t tiles = (end - first) / TILE_M;
        const int64_t lo = tiles * i / n, hi = tiles * (i + 1) / n;
        if (hi == lo) continue;
        const int64_t at = first + lo * TILE_M, rows = (hi - lo) * TILE_M;
        if (!began) tiles_begin(), began = 1;
        for (int64_t m = 0; m < num_modules; ++m) {
            const lora_module *mod = modules + m;
            const int64_t r = mod->ranks[s];
            if (!mod->a[s] || r <= 0) continue;
            tile_module(x + at * x_row, x_row, (const bf16 *)mod->a[s], mod->a_row,
                        (const bf16 *)mod->bt[s], mod->b_row, r, scales[s],
                        out + at * out_row + mod->column, out_row, rows, d_in, mod->d_out,
                        scratch);
        }
        tiled += rows;
    }
    if (began) tiles_end();
    return tiled;
}

/* float32 takes no tiles: its loops are the reference. */
static inline int64_t no_tile_runs(const float *x, int64_t x_row, const lora_module *modules,
                                   int64_t num_modules, const float *scales, float *out,
                                   int64_t out_row, const int64_t *slots, int64_t num_tokens,
                                   int64_t d_in, const int64_t *rest, int64_t i, int64_t n,
                                   char *scratch) {
    return 0;
}

#define DEFINE_APPLY_MODULES(SUFFIX, E, SHRINK, EXPAND, RUNS, TILES)                        \
    static void apply_modules_rows_##SUFFIX(const E *x, int64_t x_row,                       \
                                            const lora_module *modules, int64_t num_modules,  \
                                            const float *scales, E *out, int64_t out_row,     \
                                            const int64_t *slots, int64_t num_tokens,         \
                                            int64_t rank, int64_t d_in, float *y,             \
                                            int32_t threads) {                                \
        int64_t left = 0;                                                                   \
        for (int64_t t = 0; t < num_tokens; ++t) left += slots[t] >= 0;                     \
        for (int64_t m = 0; m < num_modules && left; ++m) {                                 \
            const lora_module *mod = modules + m;                                           \
            SHRINK##_slots(x, x_row, mod->a, mod->ranks, mod->a_row, y, rank, slots,        \
                           num_tokens, rank, d_in, threads);                                \
            EXPAND##_slots(y, rank, mod->bt, mod->ranks, mod->b_row, scales,                \
                           out + mod->column, out_row, slots, num_tokens, mod->d_out,       \
                           threads);                                                        \
        }                                                                                   \
    }                                                                                       \
    int64_t lora_apply_modules_##SUFFIX(const E *x, int64_t x_row, const lora_module *modules,  \
                                     int64_t num_modules, const float *scales, E *out,       \
                                     int64_t out_row, const int64_t *slots,                  \
                                     int64_t num_tokens, int64_t rank, int64_t d_in, float *y, \
                                     int32_t threads, int64_t tile_rows,                     \
                                     int64_t tile_row_ranks) {                               \
        const int32_t workers =                                                             \
            threads < 2 || num_tokens < (int64_t)threads * TOKENS_PER_THREAD ? 1 : threads; \
        size_t each = 0;                                                                    \
        int64_t *rest = TILES ? loop_slots(slots, num_tokens, modules, num_modules, d_in,    \
                                           tile_rows, tile_row_ranks, &each)                \
                              : NULL;                                                       \
        /* the tiles' scratch, a slice a worker; the loops take every row without it */     \
        char *scratch = rest ? thread_scratch(each * workers) : NULL;                       \
        if (!scratch) free(rest), rest = NULL;                                              \
        const int64_t *loops = rest ? rest : slots;                                         \
        int64_t tiled = 0;                                                                  \
        if (workers == 1) {                                                                 \
            if (rest)                                                                       \
                tiled = RUNS(x, x_row, modules, num_modules, scales, out, out_row, slots,   \
                             num_tokens, d_in, rest, 0, 1, scratch);                        \
            apply_modules_rows_##SUFFIX(x, x_row, modules, num_modules, scales, out,        \
                                        out_row, loops, num_tokens, rank, d_in, y,          \
                                        num_tokens * rank > SERIAL_ROW_RANKS ? threads : 1); \
        } else {                                                                            \
            int64_t bounds[workers + 1];                                                    \
            share_rows(loops, num_tokens, modules, num_modules, workers, bounds);           \
            _Pragma("omp parallel num_threads(workers) reduction(+ : tiled)") {             \
                const int64_t n = omp_get_num_threads(), i = omp_get_thread_num();          \
                if (rest)                                                                   \
                    tiled += RUNS(x, x_row, modules, num_modules, scales, out, out_row,     \
                                  slots, num_tokens, d_in, rest, i, n, scratch + i * each);  \
                /* shares as planned, or by count where the runtime gave fewer threads */    \
                const int64_t first = n == workers ? bounds[i] : num_tokens * i / n;         \
                const int64_t last = n == workers ? bounds[i + 1] : num_tokens * (i + 1) / n; \
                apply_modules_rows_##SUFFIX(x + first * x_row, x_row, modules, num_modules, \
                                            scales, out + first * out_row, out_row,         \
                                            loops + first, last - first, rank, d_in,        \
                                            y + first * rank, 1);                           \
            }                                                                               \
        }                                                                                   \
        free(rest);                                                                         \
        return tiled;                                                                       \
    }

DEFINE_APPLY_MODULES(f32, f32, lora_shrink_f32, lora_expand_f32, no_tile_runs, 0)
DEFINE_APPLY_MODULES(bf16, bf16, shrink_bf16_to_f32, expand_f32_to_bf16, tile_runs, 1)
