/* A grammar's token bitmask applied to one row of logits, in place: every token whose bit is
 * clear becomes -inf (bit i of 32-bit word w is token 32w + i, llguidance's layout), and so
 * does every token past the mask's words. One pass over the row, no unpacked copy of the
 * mask: a word with all bits set (common inside strings) is skipped whole.
 * Built by kernels/token_mask.py.
 */
#include <math.h>
#include <stdint.h>

#define DEFINE_MASK(NAME, E, NEG_INF)                                                        \
    void NAME(E *logits, int64_t vocab, const uint32_t *words, int64_t num_words) {          \
        for (int64_t w = 0; w < num_words && w * 32 < vocab; ++w) {                         \
            const uint32_t bits = words[w];                                                 \
            if (bits == 0xffffffffu) continue;                                              \
            const int64_t end = vocab - w * 32 < 32 ? vocab - w * 32 : 32;                  \
            E *row = logits + w * 32;                                                       \
            for (int64_t i = 0; i < end; ++i)                                               \
                if (!((bits >> i) & 1u)) row[i] = NEG_INF;                                  \
        }                                                                                   \
        for (int64_t t = num_words * 32; t < vocab; ++t) logits[t] = NEG_INF;               \
    }

DEFINE_MASK(token_mask_f32, float, -INFINITY)
DEFINE_MASK(token_mask_bf16, uint16_t, 0xff80u)

/* The same for several rows of a [n, stride] batch in one call: row rows[r] takes the r-th
 * mask (num_words words each); the batch's other rows are not touched. */
#define DEFINE_MASK_ROWS(NAME, ROW, E)                                                       \
    void NAME(E *logits, int64_t vocab, int64_t stride, const uint32_t *words,               \
              int64_t num_words, const int64_t *rows, int64_t num_rows) {                    \
        for (int64_t r = 0; r < num_rows; ++r)                                              \
            ROW(logits + rows[r] * stride, vocab, words + r * num_words, num_words);        \
    }

DEFINE_MASK_ROWS(token_masks_f32, token_mask_f32, float)
DEFINE_MASK_ROWS(token_masks_bf16, token_mask_bf16, uint16_t)
