/* The library's entry points for products with quantized weights (the C side of
 * aioengine/worker/quant/kernel.py; signatures in aioengine/worker/cpu/kernels/library.py).
 * level: the code path (-1 the best this CPU runs, else QK_SCALAR..QK_AVX512); every call
 * returns E_OK or an error code (base.h). */
#ifndef QK_GEMM_H
#define QK_GEMM_H

#include <stdint.h>

/* Row layout (the file's rows): y[m, ldy] (columns 0..n) = x[m, ldx] (columns 0..k) @ W^T;
 * act: 0 float32 activations, 1 int8 (q8_0/q4_0/q4_1 only), 2 int16 */
int qk_matmul(int t, const float *x, int64_t ldx, int64_t m, const uint8_t *w, int64_t row_bytes,
              int64_t n, int64_t k, float *y, int64_t ldy, int nthreads, int level, int act8);
/* out[n, ldo] (columns 0..k) = the dequantized rows of W */
int qk_dequantize(int t, const uint8_t *w, int64_t row_bytes, int64_t n, int64_t k, float *out,
                  int64_t ldo, int nthreads, int level);

/* x8 layout (x8.h): bytes of n rows of k values (0 for a type without one), the repacking
 * (dir 0: rows -> x8, dir 1: back), products with int16 activations, dequantization, and
 * rows ids[0..m) dequantized (an embedding lookup) */
int64_t qk_x8_bytes(int t, int64_t n, int64_t k);
int qk_repack_x8(int t, const uint8_t *src, int64_t row_bytes, int64_t n, int64_t k,
                 uint8_t *dst, int dir);
int qk_matmul_x8(int t, const float *x, int64_t ldx, int64_t m, const uint8_t *w, int64_t n,
                 int64_t k, float *y, int64_t ldy, int nthreads, int level);
int qk_dequantize_x8(int t, const uint8_t *w, int64_t n, int64_t k, float *out, int64_t ldo,
                     int nthreads, int level);
int qk_rows_x8(int t, const uint8_t *w, int64_t n, int64_t k, const int64_t *ids, int64_t m,
               float *out, int64_t ldo);
/* x rows from which x8 products use the two-group tile (A/B; a large value: never) */
void qk_set_x8_tile(int64_t min_m);
int64_t qk_x8_tile(void);

/* One output-row segment of a weight (a fused projection whose parts have different types,
 * or one segment), as QuantizedWeight keeps them; QkSeg in kernel.py. */
typedef struct {
    int32_t t;      /* ggml type */
    int32_t x8;     /* 1: w in the x8 layout (int16 activations) */
    int32_t act;    /* row layout: 0 float32, 1 int8, 2 int16 activations */
    int32_t pad;
    const uint8_t *w;
    int64_t row_bytes; /* row layout: bytes per row */
    int64_t n;         /* output rows */
    int64_t offset;    /* first output column of y */
} qk_seg;

/* y[m, ldy] (columns seg.offset .. seg.offset + seg.n per segment) = x[m, ldx] @ W^T */
int qk_matmul_segs(const qk_seg *segs, int nseg, const float *x, int64_t ldx, int64_t m,
                   int64_t k, float *y, int64_t ldy, int nthreads);

/* The F32 "type" (dense_f32.c): y[m, ldy] (columns 0..n) = x[m, ldx] @ W[n, k]^T, float32 W */
int qk_gemv_f32(const float *x, int64_t ldx, int64_t m, const float *w, int64_t n, int64_t k,
                float *y, int64_t ldy, int nthreads, int level);

#endif
