/* What every AMX tile kernel asks of the CPU and of Linux (lora_tiles.h's bf16 runs,
 * int8_tiles.h's int8 products): the layout of a tile configuration, and the tile state,
 * which Linux lends a process only when asked.
 */
#ifndef LORAGATE_TILE_STATE_H
#define LORAGATE_TILE_STATE_H
#include <stdint.h>

/* ldtilecfg's 64 bytes, palette 1: each tile's rows and bytes a row. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>

/* arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA: granted to the whole process, its threads
 * included; 1 once granted (oneDNN, or another kernel library, may have asked already), 0
 * where refused. */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
static inline int request_tile_state(void) {
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : 0;
}
#else
static inline int request_tile_state(void) { return 0; }
#endif
#endif
