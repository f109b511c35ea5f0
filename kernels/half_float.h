/* A little-endian IEEE float16 in a block's bytes, as float32 (exactly: every half is a
 * float). Shared by the block-format kernels (quant_cpu.c, quant_int8_cpu.c): F16C's
 * conversion where the build has it, the bit arithmetic elsewhere. */
#ifndef LORAGATE_HALF_FLOAT_H
#define LORAGATE_HALF_FLOAT_H

#include <stdint.h>
#include <string.h>

#if defined(__F16C__)
#include <immintrin.h>
static inline float half_to_float(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
#else
static inline float half_to_float(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        float f = (float)man * 5.9604644775390625e-8f; /* 2^-24: subnormal halves, exactly */
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
#endif

#endif
