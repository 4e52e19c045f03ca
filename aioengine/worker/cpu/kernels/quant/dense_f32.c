/* The F32 "type": y[M, N] = x[M, K] @ W[N, K]^T for float32 W in torch's nn.Linear layout (no
 * repacking; the same tensor serves torch's GEMM), for decode-sized M and, where this pool has
 * more threads than torch's, for prefill too (aioengine/worker/gemv). Batch-1 decode reads
 * every weight once and does two flops per weight: memory-bound. One W row at a time, a single
 * sequential stream per thread (interleaving two or four rows' streams read memory more
 * slowly; docs/benchmarks.md); for M > 1 a tile of x rows shares each load of a W row
 * (f32_rows_tiled_avx2). Rows go over the same pool as the quantized kernels in chunks of 32
 * (one pool per process: never oversubscribe the cores). */

#include "base.h"
#include "gemm.h"
#include "isa.h"
#include "threads.h"


#define F32_CHUNK_ROWS 32

static void f32_row_scalar(const float *x, int64_t ldx, int64_t m, const float *wr, int64_t k,
                           float *y, int64_t ldy) {
    for (int64_t mi = 0; mi < m; mi++) {
        const float *xr = x + mi * ldx;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        int64_t i = 0;
        for (; i + 4 <= k; i += 4) {
            s0 += wr[i] * xr[i];
            s1 += wr[i + 1] * xr[i + 1];
            s2 += wr[i + 2] * xr[i + 2];
            s3 += wr[i + 3] * xr[i + 3];
        }
        float s = s0 + s1 + s2 + s3;
        for (; i < k; i++) s += wr[i] * xr[i];
        y[mi * ldy] = s;
    }
}

#if QK_X86
/* AVX2 (level 1) and AVX-512 (level 2): rows in groups of 8. Each row is one sequential pass, 32
 * floats a step into four (AVX2) or two (AVX-512) accumulators folded to 8 lanes that wait, and
 * the group's 8 rows are reduced together by one hadd tree to one 8-float store: no horizontal
 * sum per row on the stream's path, which brings a decode pass close to a plain read's speed
 * (software prefetch ahead of the stream did not help; docs/benchmarks.md). Called for M = 1: more x rows take f32_rows_tiled_avx2. */
AVX2 static inline __m256 f32_red8(const __m256 *v) {
    __m256 h0 = _mm256_hadd_ps(v[0], v[1]), h1 = _mm256_hadd_ps(v[2], v[3]);
    __m256 h2 = _mm256_hadd_ps(v[4], v[5]), h3 = _mm256_hadd_ps(v[6], v[7]);
    h0 = _mm256_hadd_ps(h0, h1);
    h2 = _mm256_hadd_ps(h2, h3);
    return _mm256_add_ps(_mm256_permute2f128_ps(h0, h2, 0x20),
                         _mm256_permute2f128_ps(h0, h2, 0x31));
}

AVX512 static inline __m256 f32_dot8_avx512(const float *xr, const float *wr, int64_t k) {
    const int64_t k32 = k & ~(int64_t)31, k16 = k & ~(int64_t)15;
    const __mmask16 tail = (__mmask16)((1u << (k & 15)) - 1);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i < k32; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(wr + i), _mm512_loadu_ps(xr + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(wr + i + 16), _mm512_loadu_ps(xr + i + 16), a1);
    }
    if (i < k16) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(wr + i), _mm512_loadu_ps(xr + i), a0);
        i += 16;
    }
    if (tail)
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, wr + i),
                             _mm512_maskz_loadu_ps(tail, xr + i), a1);
    a0 = _mm512_add_ps(a0, a1);
    return _mm256_add_ps(_mm512_castps512_ps256(a0),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a0), 1)));
}

AVX2 static inline __m256 f32_dot8_avx2(const float *xr, const float *wr, int64_t k) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i), _mm256_loadu_ps(xr + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i + 8), _mm256_loadu_ps(xr + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i + 16), _mm256_loadu_ps(xr + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i + 24), _mm256_loadu_ps(xr + i + 24), a3);
    }
    for (; i + 8 <= k; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i), _mm256_loadu_ps(xr + i), a0);
    if (i < k) {
        const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(k - i)),
                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        a1 = _mm256_fmadd_ps(_mm256_maskload_ps(wr + i, tail), _mm256_maskload_ps(xr + i, tail),
                             a1);
    }
    return _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
}

/* rows r0..r1 of y = x W^T, in groups of 8, through one of the dot8 functions above */
#define F32_ROWS(NAME, TARGET, DOT8)                                                           \
    TARGET static void NAME(const float *x, int64_t ldx, int64_t m, const float *w, int64_t k, \
                            float *y, int64_t ldy, int64_t r0, int64_t r1) {                  \
        __m256 v[8][8]; /* [x row][W row of the group] */                                     \
        for (int64_t r = r0; r < r1; r += 8) {                                                 \
            const int rows = r1 - r < 8 ? (int)(r1 - r) : 8;                                   \
            for (int64_t m0 = 0; m0 < m; m0 += 8) {                                            \
                const int ms = m - m0 < 8 ? (int)(m - m0) : 8;                                 \
                for (int q = 0; q < 8; q++) {                                                  \
                    for (int mi = 0; mi < ms; mi++)                                            \
                        v[mi][q] = q < rows ? DOT8(x + (m0 + mi) * ldx, w + (r + q) * k, k)    \
                                            : _mm256_setzero_ps();                             \
                }                                                                              \
                for (int mi = 0; mi < ms; mi++) {                                              \
                    __m256 s = f32_red8(v[mi]);                                                \
                    float *yr = y + (m0 + mi) * ldy + r;                                       \
                    if (rows == 8) {                                                           \
                        _mm256_storeu_ps(yr, s);                                               \
                    } else {                                                                   \
                        float o[8];                                                            \
                        _mm256_storeu_ps(o, s);                                                \
                        for (int q = 0; q < rows; q++) yr[q] = o[q];                           \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }

F32_ROWS(f32_rows_avx2, AVX2, f32_dot8_avx2)
F32_ROWS(f32_rows_avx512, AVX512, f32_dot8_avx512)

/* AVX2, M >= 2 x rows (batched decode, prefill): a tile of R W rows (1 or 2) against M x rows
 * (up to 8) at once. Each 8-float piece of a W row is loaded once and multiplied into every x
 * row's accumulator, and each x piece into every W row's: R + M loads per R * M FMAs, where a
 * dot product per (x row, W row) pair (f32_rows_avx2) loads both again: 2 per FMA, which bounds
 * it at half the FMA rate. Small tiles unroll k (U pieces at once) so that at least 8
 * independent FMA chains hide the FMA latency. R and M are constants in each call (see
 * F32_TILE_CALL), so the loops unroll and the accumulators stay in registers. out[mi * 8 + r]
 * gets (or, with add, gains) x row mi's 8-lane partial sums against W row r. */
#define F32_TILE_MAX 8
#define F32_TILE_K 512 /* floats of k per pass: 8 x rows' pieces, 16 KB, stay in L1 */
AVX2 static inline __attribute__((always_inline)) void
f32_tile_avx2(const float *x, int64_t ldx, const float *w, int64_t ldw, int64_t k, __m256 *out,
              const int R, const int M, const int add) {
    const int U = R * M >= 5 ? 1 : R * M >= 3 ? 2 : 4;
    __m256 acc[4][2][F32_TILE_MAX];
#pragma GCC unroll 4
    for (int u = 0; u < U; u++)
#pragma GCC unroll 2
        for (int r = 0; r < R; r++)
#pragma GCC unroll 8
            for (int mi = 0; mi < M; mi++) acc[u][r][mi] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 * U <= k; i += 8 * U) {
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) {
            __m256 wv[2];
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) wv[r] = _mm256_loadu_ps(w + r * ldw + i + 8 * u);
#pragma GCC unroll 8
            for (int mi = 0; mi < M; mi++) {
                __m256 xv = _mm256_loadu_ps(x + mi * ldx + i + 8 * u);
                if (R > 1) /* one load for both W rows: else GCC folds it into each FMA */
                    __asm__("" : "+x"(xv));
#pragma GCC unroll 2
                for (int r = 0; r < R; r++)
                    acc[u][r][mi] = _mm256_fmadd_ps(wv[r], xv, acc[u][r][mi]);
            }
        }
    }
    for (; i < k; i += 8) {  /* what is left: 8 floats a step, the last one masked */
        const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(k - i)),
                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 wv[2];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) wv[r] = _mm256_maskload_ps(w + r * ldw + i, keep);
#pragma GCC unroll 8
        for (int mi = 0; mi < M; mi++) {
            const __m256 xv = _mm256_maskload_ps(x + mi * ldx + i, keep);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++)
                acc[0][r][mi] = _mm256_fmadd_ps(wv[r], xv, acc[0][r][mi]);
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int mi = 0; mi < M; mi++) {
            __m256 s = acc[0][r][mi];
#pragma GCC unroll 4
            for (int u = 1; u < U; u++) s = _mm256_add_ps(s, acc[u][r][mi]);
            __m256 *o = out + mi * 8 + r;
            *o = add ? _mm256_add_ps(*o, s) : s;
        }
}

#define F32_TILE_CALL(R, MS)                                                                   \
    switch (MS) {                                                                              \
    case 1: f32_tile_avx2(xm, ldx, wr, k, kn, &v[0][q], R, 1, add); break;                    \
    case 2: f32_tile_avx2(xm, ldx, wr, k, kn, &v[0][q], R, 2, add); break;                    \
    case 3: f32_tile_avx2(xm, ldx, wr, k, kn, &v[0][q], R, 3, add); break;                    \
    case 4: f32_tile_avx2(xm, ldx, wr, k, kn, &v[0][q], R, 4, add); break;                    \
    case 5: f32_tile_avx2(xm, ldx, wr, k, kn, &v[0][q], R, 5, add); break;                    \
    case 6: f32_tile_avx2(xm, ldx, wr, k, kn, &v[0][q], R, 6, add); break;                    \
    case 7: f32_tile_avx2(xm, ldx, wr, k, kn, &v[0][q], R, 7, add); break;                    \
    default: f32_tile_avx2(xm, ldx, wr, k, kn, &v[0][q], R, 8, add); break;                   \
    }

/* rows r0..r1 of y = x W^T for m >= 2, in groups of 8 W rows as f32_rows_avx2. Up to 8 x rows
 * (decode) take one W row at a time, so each W row is read from memory once, in one sequential
 * stream; more x rows (prefill) take them in chunks of 6 against W rows in pairs (12
 * accumulators), the group's W rows reused from L1 for every chunk. k goes in passes of
 * F32_TILE_K so that a chunk's x pieces stay in L1 over the group's W rows. */
AVX2 static void f32_rows_tiled_avx2(const float *x, int64_t ldx, int64_t m, const float *w,
                                     int64_t k, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    __m256 v[F32_TILE_MAX][8]; /* [x row][W row of the group] */
    const int chunk = m <= F32_TILE_MAX ? F32_TILE_MAX : 6;
    for (int64_t r = r0; r < r1; r += 8) {
        const int rows = r1 - r < 8 ? (int)(r1 - r) : 8;
        for (int64_t m0 = 0; m0 < m; m0 += chunk) {
            const int ms = m - m0 < chunk ? (int)(m - m0) : chunk;
            for (int q = rows; q < 8; q++)
                for (int mi = 0; mi < ms; mi++) v[mi][q] = _mm256_setzero_ps();
            for (int64_t k0 = 0; k0 < k; k0 += F32_TILE_K) {
                const int64_t kn = k - k0 < F32_TILE_K ? k - k0 : F32_TILE_K;
                const float *xm = x + m0 * ldx + k0;
                const int add = k0 > 0;
                for (int q = 0; q < rows;) {
                    const float *wr = w + (r + q) * k + k0;
                    if (chunk < F32_TILE_MAX && q + 1 < rows) {
                        F32_TILE_CALL(2, ms)
                        q += 2;
                    } else {
                        F32_TILE_CALL(1, ms)
                        q += 1;
                    }
                }
            }
            for (int mi = 0; mi < ms; mi++) {
                __m256 s = f32_red8(v[mi]);
                float *yr = y + (m0 + mi) * ldy + r;
                if (rows == 8) {
                    _mm256_storeu_ps(yr, s);
                } else {
                    float o[8];
                    _mm256_storeu_ps(o, s);
                    for (int q = 0; q < rows; q++) yr[q] = o[q];
                }
            }
        }
    }
}
#endif

typedef struct {
    const float *x, *w;
    float *y;
    int64_t ldx, m, n, k, ldy;
    int level;
} f32_job_t;

static void f32_job(void *a, int c, int nchunks) {
    (void)nchunks;
    f32_job_t *j = a;
    int64_t lo = (int64_t)c * F32_CHUNK_ROWS, hi = lo + F32_CHUNK_ROWS < j->n ? lo + F32_CHUNK_ROWS
                                                                               : j->n;
#if QK_X86
    if (j->level >= 1 && j->m > 1) { /* AVX-512 CPUs too (not measured there): half the loads */
        f32_rows_tiled_avx2(j->x, j->ldx, j->m, j->w, j->k, j->y, j->ldy, lo, hi);
        return;
    }
    if (j->level >= 2) {
        f32_rows_avx512(j->x, j->ldx, j->m, j->w, j->k, j->y, j->ldy, lo, hi);
        return;
    }
    if (j->level == 1) {
        f32_rows_avx2(j->x, j->ldx, j->m, j->w, j->k, j->y, j->ldy, lo, hi);
        return;
    }
#endif
    for (int64_t r = lo; r < hi; r++)
        f32_row_scalar(j->x, j->ldx, j->m, j->w + r * j->k, j->k, j->y + r, j->ldy);
}

/* y[m, ldy] (columns 0..n) = x[m, ldx] (columns 0..k) @ W[n, k]^T, float32 W */
int qk_gemv_f32(const float *x, int64_t ldx, int64_t m, const float *w, int64_t n, int64_t k,
                float *y, int64_t ldy, int nthreads, int level) {
    if (m < 0 || n < 0 || k < 1 || ldx < k || ldy < n) return E_SHAPE;
    if (nthreads < 1 || nthreads > 256) return E_THREADS;
    if (level < 0) level = qk_best_level();
    if (level > qk_best_level()) return E_LEVEL;
    if (m == 0 || n == 0) return E_OK;
    f32_job_t j = {x, w, y, ldx, m, n, k, ldy, level};
    int64_t chunks = (n + F32_CHUNK_ROWS - 1) / F32_CHUNK_ROWS;
    if (nthreads > chunks) nthreads = (int)chunks;
    return pool_run(f32_job, &j, (int)chunks, nthreads);
}