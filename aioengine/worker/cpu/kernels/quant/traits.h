/* One row per tensor type, as ggml-cpu's type_traits: its block size and bytes, and its
 * kernels per code path (index QK_SCALAR, QK_AVX2, QK_AVX512). The drivers (gemm_rows.c,
 * gemm_x8.c) look a type up once per call and call its entries per row or per 8-row group; the
 * per-block loops live inside each type's functions, where the compiler inlines them.
 *
 * A new type: a file with its functions and its row (q8_0.c is the smallest example), its id
 * in blocks.h, one line in traits.c, and its row in QTYPES (aioengine/worker/quant/kernel.py;
 * the library checks that table against this one when it loads). */
#ifndef QK_TRAITS_H
#define QK_TRAITS_H

#include <stdint.h>

#include "act_quant.h"
#include "base.h"

/* Row layout (the GGUF file's rows), one row of nb blocks: */
/* out[nb * block] = the row's values */
typedef void (*qk_deq_fn)(const uint8_t *w, int64_t nb, float *out);
/* the row . x, float32 activations; xs: sums of x per 32 values */
typedef float (*qk_dot_fn)(const uint8_t *w, int64_t nb, const float *x, const float *xs);
/* the row . x with x rounded to int8 / int16 per 32 values (act_quant.h) */
typedef float (*qk_dot_i8_fn)(const uint8_t *w, int64_t nb, const xq_block *xq);
typedef float (*qk_dot_i16_fn)(const uint8_t *w, int64_t nb, const x16_block *xq,
                               const float *xs);
/* the row . 4 x rows at once (x row i at xq + i * n32), out[4] */
typedef void (*qk_dot4_i16_fn)(const uint8_t *w, int64_t nb, const x16_block *xq,
                               const float *xs, int64_t n32, float *out);

/* x8 layout (8 rows' blocks interleaved, x8.h): */
/* one block of a row <-> row r (0..7) of the x8 block group g */
typedef void (*qk_x8_pack_fn)(const uint8_t *blk, uint8_t *g, int r);
typedef void (*qk_x8_unpack_fn)(const uint8_t *g, int r, uint8_t *blk);
/* row r of the x8 groups from g on (nb blocks), dequantized: out[nb * block] */
typedef void (*qk_x8_deq_fn)(const uint8_t *g, int64_t nb, int r, float *out);
/* 8 outputs of the group at gp (tile2: 16 outputs of the two groups from gp on) for mr (1..4)
 * x rows: out[i * 8 + r] (tile2: out[i * 16 + r]); xq, xs, xi, xh: x row i at + i * n32 */
typedef void (*qk_x8_group_fn)(const uint8_t *gp, int64_t nb, const x16_block *xq,
                               const float *xs, const int32_t *xi, const int32_t *xh,
                               int64_t n32, int mr, float *out);

typedef struct {
    const char *name;
    int type;           /* ggml type id */
    int block, bytes;   /* values and bytes per block */
    int row_level;      /* the best path its row-layout kernels have (Q5_0: scalar only) */
    qk_deq_fn deq[QK_LEVELS];
    qk_dot_fn dot[QK_LEVELS];
    qk_dot_i8_fn dot_i8[QK_LEVELS];     /* NULL: no int8 activations */
    qk_dot_i16_fn dot_i16[QK_LEVELS];
    qk_dot4_i16_fn dot4_i16[QK_LEVELS]; /* NULL: one x row at a time */
    int x8_group_bytes;                 /* bytes of one block of 8 rows; 0: no x8 layout */
    int x8_half_sums;                   /* its x8 kernels read xh (sums of 16 int16 values) */
    qk_x8_pack_fn x8_pack;
    qk_x8_unpack_fn x8_unpack;
    qk_x8_deq_fn x8_deq;
    qk_x8_group_fn x8_group[QK_LEVELS]; /* QK_AVX512: the AVX-512 VNNI kernel */
    qk_x8_group_fn x8_tile2[QK_LEVELS]; /* NULL: one group at a time */
} qk_traits;

/* a type's row, NULL for a type the kernels do not compute */
const qk_traits *qk_traits_of(int t);

/* an entry per code path: the x86 kernels where they are built */
#if QK_X86
#define QK_PER_LEVEL(scalar, avx2, avx512) {scalar, avx2, avx512}
#else
#define QK_PER_LEVEL(scalar, avx2, avx512) {scalar, scalar, scalar}
#endif

extern const qk_traits qk_q8_0, qk_q4_0, qk_q4_1, qk_q5_0, qk_q5_1, qk_q2_k, qk_q3_k, qk_q4_k,
    qk_q5_k, qk_q6_k;

#endif
