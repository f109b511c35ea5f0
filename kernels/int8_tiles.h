/* The AMX-INT8 tile operations of quant_int8_cpu.c's tile path: tdpbssd multiplies a tile
 * of 16 rows by 32 signed bytes (activations) by a tile of 8 rows by 16 groups of 4 signed
 * bytes (weights, 4 consecutive along k a group: the "VNNI" layout) into 16 x 16 int32 sums,
 * 8,192 products an instruction.
 *
 * Where the compiler targets AMX-INT8 (-march=native on such a CPU) the operations are the
 * instructions, once the process has the tile state (tile_state.h). Elsewhere, and always
 * with Q8_TILES_EMULATED defined, they are emulated on a tile file in memory, honouring the
 * configuration's rows and bytes a row as the CPU does (loads zero the rest of a tile) and
 * refusing (abort) a product whose shapes the CPU would fault on: the same packing, tiling
 * and scaling code runs, and is tested, on every CPU.
 *
 * The tiles as quant_int8_cpu.c configures them (two sets, so that one block's sums can be
 * read out while the next block's product runs): 0 and 3 the int32 sums (16 rows of 64
 * bytes), 1 and 4 the activations (16 rows of 32 bytes: one block of each row), 2 and 5
 * the weights (8 rows of 64 bytes: one block of 16 outputs).
 */
#ifndef LORAGATE_INT8_TILES_H
#define LORAGATE_INT8_TILES_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tile_state.h"

#define Q8_TILE 16       /* rows of a tile of sums, and the outputs in each */
#define Q8_TILE_BYTES 64 /* bytes in a full tile row */

/* Palette 1 with the six tiles above. */
static inline tile_config q8_tile_config(void) {
    tile_config config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int set = 0; set < 2; ++set) {
        const int sums = 3 * set, left = sums + 1, right = sums + 2;
        config.rows[sums] = Q8_TILE, config.colsb[sums] = Q8_TILE_BYTES;
        config.rows[left] = Q8_TILE, config.colsb[left] = 32;
        config.rows[right] = 8, config.colsb[right] = Q8_TILE_BYTES;
    }
    return config;
}

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && !defined(Q8_TILES_EMULATED)
#include <immintrin.h>

#define Q8_TILES_NATIVE 1
#define q8_tile_zero(t) _tile_zero(t)
/* GCC's tileloadd names no memory it reads: the barrier keeps the stores before it (the
 * packed weights, the padded rows) ahead of it. */
#define q8_tile_load(t, base, stride)          \
    do {                                       \
        __asm__ volatile("" ::: "memory");     \
        _tile_loadd(t, base, stride);          \
    } while (0)
#define q8_tile_store(t, base, stride) _tile_stored(t, base, stride)
#define q8_tile_dot(c, a, b) _tile_dpbssd(c, a, b)

static inline void q8_tiles_begin(void) {
    const tile_config config = q8_tile_config();
    _tile_loadconfig(&config);
}

static inline void q8_tiles_end(void) { _tile_release(); }
#else
#define Q8_TILES_NATIVE 0
/* Eight tiles of up to 16 rows by 64 bytes, and their configuration, one set a thread. */
static _Thread_local unsigned char q8_tile_file[8][Q8_TILE * Q8_TILE_BYTES];
static _Thread_local tile_config q8_config;

static inline void q8_tiles_begin(void) { q8_config = q8_tile_config(); }
static inline void q8_tiles_end(void) { memset(&q8_config, 0, sizeof q8_config); }

static inline void q8_tile_zero(int t) { memset(q8_tile_file[t], 0, sizeof q8_tile_file[t]); }

static inline void q8_tile_load(int t, const void *base, int64_t stride) {
    q8_tile_zero(t);
    for (int m = 0; m < q8_config.rows[t]; ++m)
        memcpy(q8_tile_file[t] + m * Q8_TILE_BYTES, (const char *)base + m * stride,
               q8_config.colsb[t]);
}

static inline void q8_tile_store(int t, void *base, int64_t stride) {
    for (int m = 0; m < q8_config.rows[t]; ++m)
        memcpy((char *)base + m * stride, q8_tile_file[t] + m * Q8_TILE_BYTES, q8_config.colsb[t]);
}

/* c[m][n] += sum over groups g of a[m][4g + i] * b[g][4n + i], i = 0..3, all signed bytes,
 * int32 sums (wrapping as the CPU's do), for the rows and columns the configuration gives. */
static inline void q8_tile_dot(int c, int a, int b) {
    const int rows = q8_config.rows[c], cols = q8_config.colsb[c] / 4;
    const int groups = q8_config.colsb[a] / 4;
    if (!rows || q8_config.rows[a] != rows || q8_config.rows[b] != groups ||
        q8_config.colsb[b] != q8_config.colsb[c])
        abort(); /* the CPU faults on these (#UD) */
    int32_t sums[Q8_TILE * Q8_TILE];
    memcpy(sums, q8_tile_file[c], sizeof sums);
    const int8_t *left = (const int8_t *)q8_tile_file[a], *right = (const int8_t *)q8_tile_file[b];
    for (int m = 0; m < rows; ++m)
        for (int n = 0; n < cols; ++n) {
            uint32_t s = (uint32_t)sums[m * Q8_TILE + n];
            for (int g = 0; g < groups; ++g)
                for (int i = 0; i < 4; ++i)
                    s += (uint32_t)(left[m * Q8_TILE_BYTES + 4 * g + i] *
                                    right[g * Q8_TILE_BYTES + 4 * n + i]);
            sums[m * Q8_TILE + n] = (int32_t)s;
        }
    memcpy(q8_tile_file[c], sums, sizeof sums);
}
#endif
#endif
