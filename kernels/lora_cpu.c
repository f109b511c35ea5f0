/* Batched LoRA on the CPU for decode-sized batches (Punica's BGMV): each token reads its own
 * slot's weights, so many adapters in one batch cost what one does. torch's grouped matmul
 * pays ~10 us per adapter group per call; these loops pay nothing per group.
 *
 * Threads split the output columns (rank rows for shrink, chunks of d_out for expand) and
 * walk the tokens in order, so when the batch is sorted by slot the weight rows a thread
 * reads stay in cache from one token to the next. Sums run in 16-float vector registers
 * (GCC/Clang vector extensions: AVX-512 with -march=native where the CPU has it).
 *
 * float32 only; the last dimension of every tensor is contiguous, other strides are passed.
 * Rows whose slot is negative (base model only) are skipped: shrink writes zeros there and
 * expand leaves `out` untouched. Built by kernels/lora_cpu.py with -O3 -fopenmp.
 */
#include <stdint.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
#define W 16

static inline v16 load(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store(float *p, v16 v) { memcpy(p, &v, sizeof v); }

static inline float hsum(v16 v) {
    float s = 0.0f;
    for (int i = 0; i < W; ++i) s += v[i];
    return s;
}

/* Four dot products sharing the loads of x: x . a0, x . a1, x . a2, x . a3. */
static inline void dot4(const float *x, const float *a0, const float *a1, const float *a2,
                        const float *a3, int64_t n, float *out) {
    v16 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    int64_t k = 0;
    for (; k + W <= n; k += W) {
        const v16 xv = load(x + k);
        s0 += xv * load(a0 + k);
        s1 += xv * load(a1 + k);
        s2 += xv * load(a2 + k);
        s3 += xv * load(a3 + k);
    }
    float r0 = hsum(s0), r1 = hsum(s1), r2 = hsum(s2), r3 = hsum(s3);
    for (; k < n; ++k) {
        r0 += x[k] * a0[k];
        r1 += x[k] * a1[k];
        r2 += x[k] * a2[k];
        r3 += x[k] * a3[k];
    }
    out[0] = r0, out[1] = r1, out[2] = r2, out[3] = r3;
}

static inline float dot1(const float *x, const float *a, int64_t n) {
    v16 s = {0};
    int64_t k = 0;
    for (; k + W <= n; k += W) s += load(x + k) * load(a + k);
    float r = hsum(s);
    for (; k < n; ++k) r += x[k] * a[k];
    return r;
}

/* y[t, j] = sum_k x[t, k] * a[slot[t], j, k] */
void lora_shrink_f32(const float *x, int64_t x_row, const float *a, int64_t a_slot,
                     int64_t a_row, float *y, int64_t y_row, const int64_t *slots,
                     int64_t num_tokens, int64_t rank, int64_t d_in, int32_t threads) {
    const int64_t quads = (rank + 3) / 4;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t q = 0; q < quads; ++q) {
        const int64_t j = 4 * q;
        for (int64_t t = 0; t < num_tokens; ++t) {
            const int64_t s = slots[t];
            float *yt = y + t * y_row + j;
            if (s < 0) {
                for (int64_t i = 0; i < 4 && j + i < rank; ++i) yt[i] = 0.0f;
                continue;
            }
            const float *xt = x + t * x_row;
            const float *aj = a + s * a_slot + j * a_row;
            if (j + 4 <= rank) {
                dot4(xt, aj, aj + a_row, aj + 2 * a_row, aj + 3 * a_row, d_in, yt);
            } else {
                for (int64_t i = 0; j + i < rank; ++i) yt[i] = dot1(xt, aj + i * a_row, d_in);
            }
        }
    }
}

/* out[t, o] += scales[slot[t]] * sum_j y[t, j] * bt[slot[t], j, o]   (bt = B transposed)
 * The delta is summed in registers, 64 columns at a time, and added once, as
 * (x A^T B^T) * scale is in PEFT, so the base output's low bits are not rounded away rank
 * by rank. */
#define EXPAND_CHUNK 256

static inline void expand64(const float *yt, const float *b, int64_t b_row, int64_t rank,
                            float scale, float *ot) {
    v16 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (int64_t j = 0; j < rank; ++j) {
        const float c = yt[j];
        const float *bj = b + j * b_row;
        s0 += c * load(bj);
        s1 += c * load(bj + W);
        s2 += c * load(bj + 2 * W);
        s3 += c * load(bj + 3 * W);
    }
    store(ot, load(ot) + scale * s0);
    store(ot + W, load(ot + W) + scale * s1);
    store(ot + 2 * W, load(ot + 2 * W) + scale * s2);
    store(ot + 3 * W, load(ot + 3 * W) + scale * s3);
}

static inline void expand_tail(const float *yt, const float *b, int64_t b_row, int64_t rank,
                               float scale, float *ot, int64_t width) {
    for (int64_t o = 0; o < width; ++o) {
        float acc = 0.0f;
        for (int64_t j = 0; j < rank; ++j) acc += yt[j] * b[j * b_row + o];
        ot[o] += scale * acc;
    }
}

void lora_expand_f32(const float *y, int64_t y_row, const float *bt, int64_t b_slot,
                     int64_t b_row, const float *scales, float *out, int64_t out_row,
                     const int64_t *slots, int64_t num_tokens, int64_t rank, int64_t d_out,
                     int32_t threads) {
    const int64_t chunks = (d_out + EXPAND_CHUNK - 1) / EXPAND_CHUNK;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        const int64_t first = chunk * EXPAND_CHUNK;
        const int64_t last = d_out < first + EXPAND_CHUNK ? d_out : first + EXPAND_CHUNK;
        for (int64_t t = 0; t < num_tokens; ++t) {
            const int64_t s = slots[t];
            if (s < 0) continue;
            const float *yt = y + t * y_row;
            const float *bs = bt + s * b_slot;
            float *ot = out + t * out_row;
            const float scale = scales[s];
            int64_t o = first;
            for (; o + 4 * W <= last; o += 4 * W) expand64(yt, bs + o, b_row, rank, scale, ot + o);
            if (o < last) expand_tail(yt, bs + o, b_row, rank, scale, ot + o, last - o);
        }
    }
}

/* out += scales[slot] * (x A^T) B^T in one call: the shrink into y (num_tokens x rank), then
 * the expand from it. */
void lora_apply_f32(const float *x, int64_t x_row, const float *a, int64_t a_slot,
                    int64_t a_row, const float *bt, int64_t b_slot, int64_t b_row,
                    const float *scales, float *out, int64_t out_row, const int64_t *slots,
                    int64_t num_tokens, int64_t rank, int64_t d_in, int64_t d_out, float *y,
                    int32_t threads) {
    lora_shrink_f32(x, x_row, a, a_slot, a_row, y, rank, slots, num_tokens, rank, d_in, threads);
    lora_expand_f32(y, rank, bt, b_slot, b_row, scales, out, out_row, slots, num_tokens, rank,
                    d_out, threads);
}
