/* Activations rounded to integers per 32 values, for integer dot products against the blocks.
 *
 * 8 bits (as llama.cpp's CPU backend does): one float scale per 32 values, integer dot products
 * per block; Q8_0, Q4_0 and Q4_1 only, kept for the measured comparison (docs/quantization.md).
 *
 * 16 bits: scale amax/32767, a relative error of at most 1.5e-5 of the block's largest value,
 * 256x finer than 8 bits, as fine as float32 accumulation over a row; integer dot products
 * with pmaddwd, offsets and mins applied with the exact float sums of x. Every type. */
#ifndef QK_ACT_QUANT_H
#define QK_ACT_QUANT_H

#include <stdint.h>

typedef struct { float d; int32_t sum; int8_t q[32]; } xq_block;
typedef struct { float d; int16_t q[32]; } x16_block;

/* nb blocks of 32 values of x to int8 / int16 */
void quantize_x(const float *x, int64_t nb, xq_block *out);
void quantize_x16(const float *x, int64_t nb, x16_block *out);

/* m rows of x (n32 blocks each) to int16 blocks, with the float sum of every block (Q4_1's
 * min) and the integer sum of its int16 values (Q4_0's offset); on the pool when there are
 * enough rows */
void x16_rows(const float *x, int64_t ldx, int64_t m, int64_t n32, x16_block *xq, float *xs,
              int32_t *xi, int level, int nthreads);

#endif
