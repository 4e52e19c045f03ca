/* Products with weights in the row layout (each row the file's blocks): the jobs that split
 * output rows over the pool and call the type's kernels (traits.h) per row.
 *
 * Activations stay float32 by default: each weight is dequantized in registers and multiplied
 * by the float activation (no rounding of x; see docs/quantization.md for the measured trade).
 * The block offsets are folded out of the inner loop with per-block sums of x
 * (sum x*(q-8) = sum x*q - 8*sum x). M > 1 with float activations dequantizes 4 rows at a
 * time into a scratch and dots them with every x row. */
#include "base.h"
#include "gemm.h"
#include "isa.h"
#include "threads.h"
#include "traits.h"

typedef struct {
    const qk_traits *tr;
    int level;
    const float *x;
    int64_t ldx, m;
    const uint8_t *w;
    int64_t row_bytes, n, k, nb;
    float *y;
    int64_t ldy;
    const float *xs; /* [m, k/32] sums of x per 32 values */
    int failed;
    const xq_block *xq; /* 8-bit activations: x quantized, one row */
    const x16_block *x16; /* 16-bit activations: x quantized, one row (or m4 rows) */
    int64_t m4;           /* > 0: x16/xs hold m4 rows (a multiple of 4) of n32 blocks */
} job_t;

static void gemv_job(void *a, int tid, int nth) {
    job_t *j = a;
    int64_t r0, r1;
    rows_of(j->n, tid, nth, &r0, &r1);
    if (j->x16) {
        const qk_dot_i16_fn dot = j->tr->dot_i16[j->level];
        for (int64_t r = r0; r < r1; r++)
            j->y[r] = dot(j->w + r * j->row_bytes, j->nb, j->x16, j->xs);
    } else if (j->xq) {
        const qk_dot_i8_fn dot = j->tr->dot_i8[j->level];
        for (int64_t r = r0; r < r1; r++) j->y[r] = dot(j->w + r * j->row_bytes, j->nb, j->xq);
    } else {
        const qk_dot_fn dot = j->tr->dot[j->level];
        for (int64_t r = r0; r < r1; r++)
            j->y[r] = dot(j->w + r * j->row_bytes, j->nb, j->x, j->xs);
    }
}

/* M > 1 with int16 activations: every x row quantized up front; types with a 4-row kernel
 * meet 4 x rows at a time, the others one x row at a time */
static void multi16_job(void *a, int tid, int nth) {
    job_t *j = a;
    int64_t r0, r1, n32 = j->k / 32;
    rows_of(j->n, tid, nth, &r0, &r1);
    const qk_dot4_i16_fn dot4 = j->tr->dot4_i16[j->level];
    const qk_dot_i16_fn dot = j->tr->dot_i16[j->level];
    float out4[4];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = j->w + r * j->row_bytes;
        for (int64_t mi = 0; mi < j->m; mi += 4) {
            if (dot4) {
                dot4(wr, j->nb, j->x16 + mi * n32, j->xs + mi * n32, n32, out4);
                for (int i = 0; i < 4 && mi + i < j->m; i++) j->y[(mi + i) * j->ldy + r] = out4[i];
                continue;
            }
            for (int i = 0; i < 4 && mi + i < j->m; i++)
                j->y[(mi + i) * j->ldy + r] =
                    dot(wr, j->nb, j->x16 + (mi + i) * n32, j->xs + (mi + i) * n32);
        }
    }
}

/* 4 dot products of one x row with 4 dequantized rows (length k, multiple of 32) */
static void dot4_f32_scalar(const float *x, const float *w0, int64_t k, float *out) {
    for (int r = 0; r < 4; r++) {
        const float *w = w0 + r * k;
        float s = 0.0f;
        for (int64_t i = 0; i < k; i++) s += x[i] * w[i];
        out[r] = s;
    }
}

#if QK_X86
AVX2 static void dot4_f32_avx2(const float *x, const float *w0, int64_t k, float *out) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const float *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
    for (int64_t i = 0; i < k; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w0 + i), a0);
        a1 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w1 + i), a1);
        a2 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w2 + i), a2);
        a3 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w3 + i), a3);
    }
    out[0] = hsum8(a0);
    out[1] = hsum8(a1);
    out[2] = hsum8(a2);
    out[3] = hsum8(a3);
}
#endif

/* M > 1: dequantize 4 rows at a time into a scratch and dot them with every x row */
static void tiled_job(void *a, int tid, int nth) {
    job_t *j = a;
    int64_t r0, r1;
    rows_of(j->n, tid, nth, &r0, &r1);
    if (r0 >= r1) return;
    float *scr = aligned_alloc(64, (size_t)(4 * j->k * sizeof(float) + 64) & ~(size_t)63);
    if (!scr) {
        j->failed = 1;
        return;
    }
    const qk_deq_fn deq = j->tr->deq[j->level];
    float out4[4];
    for (int64_t r = r0; r < r1; r += 4) {
        int rows = r1 - r < 4 ? (int)(r1 - r) : 4;
        for (int i = 0; i < 4; i++) {
            if (i < rows)
                deq(j->w + (r + i) * j->row_bytes, j->nb, scr + i * j->k);
            else
                memset(scr + i * j->k, 0, j->k * sizeof(float));
        }
        for (int64_t mi = 0; mi < j->m; mi++) {
#if QK_X86
            if (j->level >= QK_AVX2)
                dot4_f32_avx2(j->x + mi * j->ldx, scr, j->k, out4);
            else
#endif
                dot4_f32_scalar(j->x + mi * j->ldx, scr, j->k, out4);
            for (int i = 0; i < rows; i++) j->y[mi * j->ldy + r + i] = out4[i];
        }
    }
    free(scr);
}

static void deq_job(void *a, int tid, int nth) {
    job_t *j = a;
    int64_t r0, r1;
    rows_of(j->n, tid, nth, &r0, &r1);
    const qk_deq_fn deq = j->tr->deq[j->level];
    for (int64_t r = r0; r < r1; r++) deq(j->w + r * j->row_bytes, j->nb, j->y + r * j->ldy);
}

static int check(const qk_traits *tr, int64_t n, int64_t k, int64_t row_bytes, int nthreads,
                 int *level, int64_t *nb) {
    if (!tr) return E_TYPE;
    if (n < 0 || k <= 0 || k % tr->block) return E_SHAPE;
    *nb = k / tr->block;
    if (row_bytes != *nb * tr->bytes) return E_ROWBYTES;
    if (nthreads < 1 || nthreads > 256) return E_THREADS;
    if (*level < 0) *level = qk_best_level();
    if (*level > qk_best_level()) return E_LEVEL;
    if (*level > tr->row_level) *level = tr->row_level;
    return E_OK;
}

/* the float sum of every 32 values of x's row (the block offsets and mins) */
static void block_sums(const float *x, int64_t n32, float *xs) {
    for (int64_t b = 0; b < n32; b++) {
        float s = 0.0f;
        for (int i = 0; i < 32; i++) s += x[b * 32 + i];
        xs[b] = s;
    }
}

int qk_matmul(int t, const float *x, int64_t ldx, int64_t m, const uint8_t *w, int64_t row_bytes,
              int64_t n, int64_t k, float *y, int64_t ldy, int nthreads, int level, int act8) {
    const qk_traits *tr = qk_traits_of(t);
    int64_t nb;
    int rc = check(tr, n, k, row_bytes, nthreads, &level, &nb);
    if (rc) return rc;
    if (m < 0 || ldx < k || ldy < n) return E_SHAPE;
    if (act8 < 0 || act8 > 2) return E_ACT8;
    if (act8 == 1 && !tr->dot_i8[QK_SCALAR]) return E_ACT8;
    if (m == 0 || n == 0) return E_OK;
    job_t j = {tr, level, x, ldx, m, w, row_bytes, n, k, nb, y, ldy, NULL, 0, NULL, NULL, 0};
    nthreads = threads_for_rows(nthreads, n);
    if (act8 == 2) { /* x's rows to int16 blocks and exact sums, then one job over W */
        int64_t n32 = k / 32, m4 = (m + 3) & ~(int64_t)3;
        x16_block *xq = calloc(m4 * n32, sizeof(x16_block)); /* padding rows: zeros */
        float *xs = calloc(m4 * n32, sizeof(float));
        if (!xq || !xs) {
            free(xq);
            free(xs);
            return E_NOMEM;
        }
        for (int64_t mi = 0; mi < m; mi++) {
            const float *xr = x + mi * ldx;
            quantize_x16(xr, n32, xq + mi * n32);
            block_sums(xr, n32, xs + mi * n32);
        }
        j.x16 = xq;
        j.xs = xs;
        j.m4 = m4;
        if (m == 1)
            pool_run(gemv_job, &j, chunks_for(n, nthreads), nthreads);
        else
            pool_run(multi16_job, &j, chunks_for(n, nthreads), nthreads);
        free(xq);
        free(xs);
        return E_OK;
    }
    if (act8) { /* row by row: quantize x's row, one GEMV */
        xq_block *xq = malloc(nb * sizeof(xq_block));
        if (!xq) return E_NOMEM;
        for (int64_t mi = 0; mi < m; mi++) {
            quantize_x(x + mi * ldx, nb, xq);
            job_t r = j;
            r.x = x + mi * ldx;
            r.y = y + mi * ldy;
            r.xq = xq;
            pool_run(gemv_job, &r, chunks_for(n, nthreads), nthreads);
        }
        free(xq);
        return E_OK;
    }
    if (m == 1) {
        float *xs = malloc(k / 32 * sizeof(float));
        if (!xs) return E_NOMEM;
        block_sums(x, k / 32, xs);
        j.xs = xs;
        pool_run(gemv_job, &j, chunks_for(n, nthreads), nthreads);
        free(xs);
        return E_OK;
    }
    pool_run(tiled_job, &j, chunks_for(n, nthreads), nthreads);
    return j.failed ? E_NOMEM : E_OK;
}

int qk_dequantize(int t, const uint8_t *w, int64_t row_bytes, int64_t n, int64_t k, float *out,
                  int64_t ldo, int nthreads, int level) {
    const qk_traits *tr = qk_traits_of(t);
    int64_t nb;
    int rc = check(tr, n, k, row_bytes, nthreads, &level, &nb);
    if (rc) return rc;
    if (ldo < k) return E_SHAPE;
    if (n == 0) return E_OK;
    job_t j = {tr, level, NULL, 0, 0, w, row_bytes, n, k, nb, out, ldo, NULL, 0, NULL, NULL, 0};
    nthreads = threads_for_rows(nthreads, n);
    pool_run(deq_job, &j, chunks_for(n, nthreads), nthreads);
    return E_OK;
}

/* Segments: one call for every output-row segment of a weight, built once in Python (a ctypes
 * array), so a decode step's linear is one C call with five varying arguments instead of a
 * Python loop of checked calls. */
int qk_matmul_segs(const qk_seg *segs, int nseg, const float *x, int64_t ldx, int64_t m,
                   int64_t k, float *y, int64_t ldy, int nthreads) {
    for (int i = 0; i < nseg; i++) {
        const qk_seg *s = segs + i;
        if (s->offset < 0 || s->offset + s->n > ldy) return E_SHAPE;
        int rc = s->x8 ? qk_matmul_x8(s->t, x, ldx, m, s->w, s->n, k, y + s->offset, ldy,
                                      nthreads, -1)
                       : qk_matmul(s->t, x, ldx, m, s->w, s->row_bytes, s->n, k, y + s->offset,
                                   ldy, nthreads, -1, s->act);
        if (rc) return rc;
    }
    return E_OK;
}
