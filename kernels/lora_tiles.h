/* Runs of one slot's rows as tile products (bfloat16): a prompt chunk's LoRA on AMX.
 *
 * A prompt chunk's rows of one adapter lie together in a step's batch, and the per-token
 * loops of lora_cpu.c take them a few rows at a time on vdpbf16ps (32 products a vector).
 * On a CPU with AMX one tdpbf16ps multiplies a 16 x 32 bf16 tile by a 32 x 16 one into
 * 16 x 16 float32 sums, 8,192 products, so the runs go through the tiles here instead,
 * 16 rows at a time, inside the native call: no per-product cost as through oneDNN
 * (40-100 us a product for these small shapes on a 2-core Xeon), so runs of 64 rows gain
 * too. Rows past a run's last whole tile of 16 stay with the loops, and the threads share
 * out each run's tiles (lora_cpu.c: tile_runs), each packing the run's weights for itself.
 *
 * For each module of the run's slot:
 *   - A [r, d_in] is packed into tdpbf16ps's B layout (pairs of columns of A^T, that is a
 *     transpose of 32-bit words), zero past the slot's rank;
 *   - the shrink: x's rows (loaded straight from x as tiles of 16 rows by 32 columns) by the
 *     packed A, into float32 sums, rounded to bf16 as the loops' bf16 expand rounds them
 *     (and as PEFT's bf16 lora_A output is);
 *   - Bt [r, d_out] is packed into pairs of its rows, zero past the rank and d_out;
 *   - the expand: the rounded intermediate by the packed Bt, 32 rows by 32 columns a pass
 *     (2 x 2 tiles), each sum added once to out as out + scale * sum, rounded to bf16 (the
 *     loops' rule).
 * The sums run in another order than the loops': results agree within the bf16 rule, not
 * bit for bit. float32 never comes here (its loops stay the reference, bit-equal as before).
 *
 * Where the compiler targets AMX (-march=native on such a CPU) the tile operations are the
 * instructions, once the process has asked Linux for the tile state (lora_tiles_ready).
 * Elsewhere they are emulated, operation by operation, on a tile file in memory (slow): the
 * same packing, tiling and epilogue code then runs, and is tested, on every CPU (and on an
 * AMX CPU too, built with LORA_TILES_EMULATED defined); the Python side only turns the tiles
 * on by default where the CPU has AMX.
 */
#ifndef LORAGATE_LORA_TILES_H
#define LORAGATE_LORA_TILES_H
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_simd.h"
#include "tile_state.h"

#define TILE_M 16     /* rows of a tile */
#define TILE_N 16     /* float32 sums in a row of the result tile */
#define TILE_K 32     /* bf16 columns of a row of the left tile */
#define TILE_BYTES 64 /* bytes in any tile's row */
#define OUT_AHEAD 128 /* elements of out prefetched ahead of the epilogue, a row at a time */

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && !defined(LORA_TILES_EMULATED)
#include <immintrin.h>

#define TILES_NATIVE 1
#define tile_zero(t) _tile_zero(t)
#define tile_load(t, base, stride) _tile_loadd(t, base, stride)
#define tile_store(t, base, stride) _tile_stored(t, base, stride)
#define tile_dot(c, a, b) _tile_dpbf16ps(c, a, b)

/* Palette 1, tiles 0-7 each 16 rows of 64 bytes. */
static inline void tiles_begin(void) {
    tile_config config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; ++t) config.colsb[t] = TILE_BYTES, config.rows[t] = TILE_M;
    _tile_loadconfig(&config);
}

static inline void tiles_end(void) { _tile_release(); }

/* 1 once Linux lends the tile state (tile_state.h), 0 where it refused. */
int lora_tiles_ready(void) { return request_tile_state(); }
#else
#define TILES_NATIVE 0
/* Eight tiles of 16 rows by 64 bytes in memory, one file a thread. */
static _Thread_local unsigned char tile_file[8][TILE_M * TILE_BYTES];

static inline void tile_zero(int t) { memset(tile_file[t], 0, sizeof tile_file[t]); }

static inline void tile_load(int t, const void *base, int64_t stride) {
    for (int m = 0; m < TILE_M; ++m)
        memcpy(tile_file[t] + m * TILE_BYTES, (const char *)base + m * stride, TILE_BYTES);
}

static inline void tile_store(int t, void *base, int64_t stride) {
    for (int m = 0; m < TILE_M; ++m)
        memcpy((char *)base + m * stride, tile_file[t] + m * TILE_BYTES, TILE_BYTES);
}

/* c[m][n] += sum over pairs p of a[m][2p] b[p][2n] + a[m][2p+1] b[p][2n+1], float32 sums. */
static inline void tile_dot(int c, int a, int b) {
    float sums[TILE_M * TILE_N];
    bf16 left[TILE_M * TILE_K], right[TILE_M * TILE_K];
    memcpy(sums, tile_file[c], sizeof sums);
    memcpy(left, tile_file[a], sizeof left);
    memcpy(right, tile_file[b], sizeof right);
    for (int m = 0; m < TILE_M; ++m)
        for (int n = 0; n < TILE_N; ++n) {
            float s = sums[m * TILE_N + n];
            for (int p = 0; p < TILE_K / 2; ++p)
                s += get_bf16(left + m * TILE_K + 2 * p) * get_bf16(right + p * TILE_K + 2 * n) +
                     get_bf16(left + m * TILE_K + 2 * p + 1) *
                         get_bf16(right + p * TILE_K + 2 * n + 1);
            sums[m * TILE_N + n] = s;
        }
    memcpy(tile_file[c], sums, sizeof sums);
}

static inline void tiles_begin(void) {}
static inline void tiles_end(void) {}
int lora_tiles_ready(void) { return 2; /* emulated */ }
#endif

static inline int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

/* A [r, d_in] (rows a_row apart) as the right operand of x A^T: for each 16 rank rows and
 * 32 columns of d_in, a block of 16 rows (column pairs) by 16 words (rank rows), each word
 * the pair A[j][k], A[j][k + 1]; zero past rank r up to `ranks` (a multiple of 16). Each row
 * of A is read front to back (one stream the prefetchers follow; block by block, 16 rows at
 * once, the reads waited on memory) and its words scattered into its blocks' column. */
static void pack_a(const bf16 *a, int64_t a_row, int64_t r, int64_t ranks, int64_t d_in,
                   uint32_t *packed) {
    const int64_t depth = d_in / TILE_K, block = TILE_M * TILE_N;
    for (int64_t j = 0; j < ranks; ++j) {
        const int64_t q = j / TILE_N, n = j % TILE_N;
        uint32_t *column = packed + q * depth * block + n;
        if (j >= r) {
            for (int64_t w = 0; w < depth * TILE_M; ++w) column[w / TILE_M * block + w % TILE_M * TILE_N] = 0;
            continue;
        }
        const bf16 *row = a + j * a_row;
        for (int64_t k = 0; k < depth; ++k) {
            uint32_t words[TILE_M];
            memcpy(words, row + k * TILE_K, sizeof words);
            for (int64_t p = 0; p < TILE_M; ++p) column[k * block + p * TILE_N] = words[p];
        }
    }
}

/* Bt [r, d_out] (rows b_row apart) as the right operand of y Bt: for each 32 rank rows and
 * 16 columns, a block of 16 rows by 16 words, each word the pair Bt[2p][o], Bt[2p + 1][o];
 * zero past rank r (up to `ranks`, a multiple of 32) and past d_out (up to a multiple of
 * 16). Each pair of rows is read front to back, W columns at a time, their words made by
 * vector (the even row's element low, the odd row's high). */
static void pack_bt(const bf16 *bt, int64_t b_row, int64_t r, int64_t ranks, int64_t d_out,
                    uint32_t *packed) {
    const int64_t blocks = round_up(d_out, TILE_N) / TILE_N, depth = ranks / TILE_K;
    const int64_t block = TILE_M * TILE_N, whole = d_out / W * W;
    const bf16 zero_row[W] = {0};
    for (int64_t j = 0; j < ranks; j += 2) {
        const int64_t k = j / TILE_K, p = j % TILE_K / 2;
        const bf16 *even = j < r ? bt + j * b_row : NULL;
        const bf16 *odd = j + 1 < r ? bt + (j + 1) * b_row : NULL;
        uint32_t *row = packed + k * block + p * TILE_N; /* column block c at c * depth */
        int64_t o = 0;
        for (; o < whole; o += W) {
            vh lo, hi;
            memcpy(&lo, even ? even + o : zero_row, sizeof lo);
            memcpy(&hi, odd ? odd + o : zero_row, sizeof hi);
            const vu words = __builtin_convertvector(lo, vu) | __builtin_convertvector(hi, vu) << 16;
            memcpy(row + o / TILE_N * depth * block + o % TILE_N, &words, sizeof words);
        }
        for (; o < blocks * TILE_N; ++o) {
            const uint32_t lo = even && o < d_out ? even[o] : 0;
            const uint32_t hi = odd && o < d_out ? odd[o] : 0;
            row[o / TILE_N * depth * block + o % TILE_N] = lo | hi << 16;
        }
    }
}

/* Result tiles 0-3 as a 2 x 2 block: tile 2i + j sums left tile i (16 rows, the second
 * `left_stride` * 16 bytes after the first) times right block j (`step` words after the
 * first), over `depth` left tiles (`left_step` bytes apart along the row; the right blocks
 * advance by one block per left tile). `rows2`, `cols2`: 1 or 2, the block's tiles that
 * exist. Each right block loaded serves two products, as does each left tile. */
static inline void tile_quad(const void *left, int64_t left_stride, int64_t left_step,
                             int64_t depth, const uint32_t *right, int64_t step, int rows2,
                             int cols2) {
    tile_zero(0);
    if (cols2 > 1) tile_zero(1);
    if (rows2 > 1) tile_zero(2);
    if (rows2 > 1 && cols2 > 1) tile_zero(3);
    const char *first = left, *second = first + TILE_M * left_stride;
    for (int64_t k = 0; k < depth; ++k) {
        const uint32_t *r = right + k * TILE_M * TILE_N;
        tile_load(4, first + k * left_step, left_stride);
        tile_load(6, r, TILE_BYTES);
        tile_dot(0, 4, 6);
        if (cols2 > 1) {
            tile_load(7, r + step, TILE_BYTES);
            tile_dot(1, 4, 7);
        }
        if (rows2 > 1) {
            tile_load(5, second + k * left_step, left_stride);
            tile_dot(2, 5, 6);
            if (cols2 > 1) tile_dot(3, 5, 7);
        }
    }
}

/* tile_quad's sums to `sums` (rows `stride` bytes apart). */
static inline void store_quad(float *sums, int64_t stride, int rows2, int cols2) {
    char *second = (char *)sums + TILE_M * stride;
    tile_store(0, sums, stride);
    if (cols2 > 1) tile_store(1, sums + TILE_N, stride);
    if (rows2 > 1) tile_store(2, second, stride);
    if (rows2 > 1 && cols2 > 1) tile_store(3, second + TILE_N * sizeof(float), stride);
}

/* out[t, o] = bf16(out[t, o] + scale * sums[t, o]) for `rows` rows, `width` columns. */
static inline void add_sums(const float *sums, int64_t stride, bf16 *out, int64_t out_row,
                            int64_t rows, int64_t width, float scale) {
    for (int64_t t = 0; t < rows; ++t) {
        const float *st = sums + t * stride;
        bf16 *ot = out + t * out_row;
        /* the row's columns a few blocks on: 32 rows' streams outrun the prefetchers */
        __builtin_prefetch(ot + OUT_AHEAD, 1);
        int64_t o = 0;
        for (; o + W <= width; o += W) store_bf16(ot + o, load_bf16(ot + o) + scale * load_f32(st + o));
        for (; o < width; ++o) put_bf16(ot + o, get_bf16(ot + o) + scale * st[o]);
    }
}

/* Scratch for one module of one run: the packed A and Bt, the shrink's sums and their bf16
 * rounding for all the run's rows, and two tiles' rows of the expand's sums. */
typedef struct {
    uint32_t *a, *bt;
    float *y, *sums;
    bf16 *yb;
} tile_scratch;

/* The calling thread's scratch memory, kept from call to call and grown as needed (freed
 * when the thread ends), from which each worker of a call takes its slice: a few hundred
 * KB a thread, which malloc would map afresh and the kernel fault in on every call. */
typedef struct {
    char *at;
    size_t size;
} scratch_memory;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void free_scratch(void *memory) {
    free(((scratch_memory *)memory)->at);
    free(memory);
}

static void make_scratch_key(void) { pthread_key_create(&scratch_key, free_scratch); }

/* `bytes` of this thread's scratch (64-byte aligned), or NULL where memory ran out. */
static char *thread_scratch(size_t bytes) {
    pthread_once(&scratch_once, make_scratch_key);
    scratch_memory *memory = pthread_getspecific(scratch_key);
    if (!memory) {
        memory = calloc(1, sizeof *memory);
        if (!memory || pthread_setspecific(scratch_key, memory)) {
            free(memory);
            return NULL;
        }
    }
    if (memory->size < bytes) {
        free(memory->at);
        memory->size = (size_t)round_up((int64_t)bytes, 4096);
        memory->at = aligned_alloc(64, memory->size);
        if (!memory->at) memory->size = 0;
    }
    return memory->at;
}

/* The bytes of each piece of one module's scratch for a run of `rows` rows at rank r. */
static void scratch_sizes(int64_t rows, int64_t r, int64_t d_in, int64_t d_out, size_t *sizes) {
    const int64_t shrink_ranks = round_up(r, TILE_N), expand_ranks = round_up(r, TILE_K);
    sizes[0] = (size_t)round_up(shrink_ranks / 2 * d_in * sizeof(uint32_t), 64);
    sizes[1] = (size_t)round_up(expand_ranks / 2 * round_up(d_out, TILE_N) * sizeof(uint32_t), 64);
    sizes[2] = (size_t)round_up(rows * shrink_ranks * sizeof(float), 64);
    sizes[3] = (size_t)round_up(2 * TILE_M * 2 * TILE_N * sizeof(float), 64);
    sizes[4] = (size_t)round_up(rows * expand_ranks * sizeof(bf16), 64);
}

/* The scratch `tile_module` needs for `rows` rows at rank r (at most: the same for fewer
 * rows, a lower rank or a narrower module). */
static size_t scratch_bytes(int64_t rows, int64_t r, int64_t d_in, int64_t d_out) {
    size_t sizes[5];
    scratch_sizes(rows, r, d_in, d_out, sizes);
    return sizes[0] + sizes[1] + sizes[2] + sizes[3] + sizes[4];
}

/* One module's delta for `rows` rows (a multiple of 16) of one slot: x [rows, d_in] (rows
 * x_row apart, d_in a multiple of 32), A [r, d_in], Bt [r, d_out], out [rows, d_out];
 * `scratch`: scratch_bytes(rows, r, d_in, d_out) of 64-byte aligned memory.
 *
 * The shrink and then the expand go 32 rows at a time through 2 x 2 blocks of tiles, so
 * each packed block loaded (from L2: Bt's packing is up to 400 KB) serves two tiles of
 * rows, and out is walked row segment by row segment. One tile of rows by four blocks
 * waited on those loads; the expand column group by column group through the whole run
 * (the group's blocks kept in L1) waited on out's rows, read a column group at a time
 * (perf, a 2-core Xeon: two thirds of its time loading out). */
static void tile_module(const bf16 *x, int64_t x_row, const bf16 *a, int64_t a_row,
                        const bf16 *bt, int64_t b_row, int64_t r, float scale, bf16 *out,
                        int64_t out_row, int64_t rows, int64_t d_in, int64_t d_out,
                        char *scratch) {
    const int64_t shrink_ranks = round_up(r, TILE_N), expand_ranks = round_up(r, TILE_K);
    const int64_t columns = round_up(d_out, TILE_N), block = TILE_M * TILE_N;
    const int64_t pair = 2 * TILE_N; /* columns of a 2 x 2 block */
    size_t sizes[5];
    scratch_sizes(rows, r, d_in, d_out, sizes);
    char *at = scratch;
    const tile_scratch s = {
        (uint32_t *)at,
        (uint32_t *)(at + sizes[0]),
        (float *)(at + sizes[0] + sizes[1]),
        (float *)(at + sizes[0] + sizes[1] + sizes[2]),
        (bf16 *)(at + sizes[0] + sizes[1] + sizes[2] + sizes[3]),
    };
    pack_a(a, a_row, r, shrink_ranks, d_in, s.a);
    pack_bt(bt, b_row, r, expand_ranks, d_out, s.bt);
    const int64_t a_blocks = shrink_ranks / TILE_N, depth_in = d_in / TILE_K;
    const int64_t b_blocks = columns / TILE_N, depth_r = expand_ranks / TILE_K;
    /* the shrink: y [rows, shrink_ranks] = x A^T */
    for (int64_t t = 0; t < rows; t += 2 * TILE_M) {
        const int rows2 = rows - t > TILE_M ? 2 : 1;
        for (int64_t q = 0; q < a_blocks; q += 2) {
            const int cols2 = a_blocks - q > 1 ? 2 : 1;
            tile_quad(x + t * x_row, x_row * (int64_t)sizeof(bf16), TILE_BYTES, depth_in,
                      s.a + q * depth_in * block, depth_in * block, rows2, cols2);
            store_quad(s.y + t * shrink_ranks + q * TILE_N,
                       shrink_ranks * (int64_t)sizeof(float), rows2, cols2);
        }
    }
    for (int64_t m = 0; m < rows; ++m)
        for (int64_t j = 0; j < expand_ranks; ++j)
            if (j < r)
                put_bf16(s.yb + m * expand_ranks + j, s.y[m * shrink_ranks + j]);
            else
                s.yb[m * expand_ranks + j] = 0;
    /* the expand: out [rows, d_out] += scale * yb Bt */
    for (int64_t t = 0; t < rows; t += 2 * TILE_M) {
        const int rows2 = rows - t > TILE_M ? 2 : 1;
        for (int64_t c = 0; c < b_blocks; c += 2) {
            const int cols2 = b_blocks - c > 1 ? 2 : 1;
            tile_quad(s.yb + t * expand_ranks, expand_ranks * (int64_t)sizeof(bf16), TILE_BYTES,
                      depth_r, s.bt + c * depth_r * block, depth_r * block, rows2, cols2);
            store_quad(s.sums, pair * (int64_t)sizeof(float), rows2, cols2);
            const int64_t first = c * TILE_N;
            const int64_t width = d_out - first < cols2 * TILE_N ? d_out - first : cols2 * TILE_N;
            add_sums(s.sums, pair, out + t * out_row + first, out_row, rows2 * TILE_M, width,
                     scale);
        }
    }
}
#endif
