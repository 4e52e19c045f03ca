/* Products with weights in the x8 layout (x8.h), made once at load: the jobs that split 8-row
 * groups over the pool and call the type's group kernels (traits.h) per group and 4 x rows. */
#include <stdatomic.h>

#include "base.h"
#include "gemm.h"
#include "isa.h"
#include "threads.h"
#include "traits.h"

typedef struct {
    const qk_traits *tr;
    int isa; /* the group kernels' index: QK_AVX512 is the VNNI kernel, run where VNNI is */
    const uint8_t *w; /* x8 groups */
    int64_t n, nb, ngroups, n32, m;
    const x16_block *xq;
    const float *xs;
    const int32_t *xi;
    float *y;
    int64_t ldy;
    float *deq; /* dequantize: out [n, ldo] */
    int64_t ldo;
    const int32_t *xh; /* integer sums of the first 16 int16 activations per 32 (Q6_K) */
} x8_job_t;

/* x rows from which the two-group tile (X8_TILE2) computes M > 1 (qk_set_x8_tile; a large
 * value keeps the one-group kernel for every M: A/B and the bit-identity tests). With weights
 * from memory the tile costs at M = 2 about what it costs at M = 3-4, so the one-group kernel
 * is faster there; from M = 3 on the tile is (docs/quantization.md). */
static _Atomic int64_t x8_tile_min_m = 3;

/* the int16 activations of M-blocks of this many x rows (76 bytes per 32 values with their
 * sums) fill about 256 KiB, so they stay in L2 while a chunk's weight groups pass them */
static int64_t x8_m_block(int64_t m, int64_t n32) {
    int64_t mc = (262144 / (n32 * 76)) & ~(int64_t)3;
    mc = mc < 16 ? 16 : mc;
    return m < mc ? m : mc;
}

static void x8_matmul_job(void *a, int c, int nchunks) {
    x8_job_t *j = a;
    int64_t g0, g1;
    x8_groups_of(j->ngroups, c, nchunks, &g0, &g1);
    const int64_t gsz = j->nb * j->tr->x8_group_bytes;
    const qk_x8_group_fn group = j->tr->x8_group[j->isa], tile2 = j->tr->x8_tile2[j->isa];
    /* the two-group tile where the type has one (the 32-value types) */
    const int tile = tile2 && j->m >= atomic_load_explicit(&x8_tile_min_m, memory_order_relaxed);
    const int64_t mc = x8_m_block(j->m, j->n32);
    float out[64];
    for (int64_t m0 = 0; m0 < j->m; m0 += mc) {
        const int64_t m1 = m0 + mc < j->m ? m0 + mc : j->m;
        for (int64_t g = g0; g < g1;) {
            const uint8_t *gp = j->w + g * gsz;
            const int ng = tile && g + 1 < g1 ? 2 : 1; /* groups this pass computes */
            int64_t left = j->n - g * 8;
            int rows = left < 8 * ng ? (int)left : 8 * ng;
            for (int64_t mi = m0; mi < m1; mi += 4) {
                int mr = m1 - mi < 4 ? (int)(m1 - mi) : 4;
                const int64_t o = mi * j->n32;
                (ng == 2 ? tile2 : group)(gp, j->nb, j->xq + o, j->xs + o, j->xi + o, j->xh + o,
                                          j->n32, mr, out);
                for (int i = 0; i < mr; i++) {
                    float *yr = j->y + (mi + i) * j->ldy + g * 8;
                    memcpy(yr, out + 8 * ng * i, (size_t)rows * sizeof(float));
                }
            }
            g += ng;
        }
    }
}

static void x8_deq_job(void *a, int c, int nchunks) {
    x8_job_t *j = a;
    int64_t g0, g1;
    x8_groups_of(j->ngroups, c, nchunks, &g0, &g1);
    const int64_t gsz = j->nb * j->tr->x8_group_bytes;
    for (int64_t g = g0; g < g1; g++) {
        int rows = j->n - g * 8 < 8 ? (int)(j->n - g * 8) : 8;
        for (int r = 0; r < rows; r++)
            j->tr->x8_deq(j->w + g * gsz, j->nb, r, j->deq + (g * 8 + r) * j->ldo);
    }
}

void qk_set_x8_tile(int64_t min_m) { atomic_store(&x8_tile_min_m, min_m < 1 ? 1 : min_m); }
int64_t qk_x8_tile(void) { return atomic_load(&x8_tile_min_m); }

static const qk_traits *x8_traits(int t) {
    const qk_traits *tr = qk_traits_of(t);
    return tr && tr->x8_group_bytes ? tr : NULL;
}

static int x8_check(const qk_traits *tr, int64_t n, int64_t k, int nthreads, int *level) {
    if (!tr) return E_TYPE;
    if (n < 0 || k <= 0 || k % tr->block) return E_SHAPE;
    if (nthreads < 1 || nthreads > 256) return E_THREADS;
    if (*level < 0) *level = qk_best_level();
    if (*level > qk_best_level()) return E_LEVEL;
    return E_OK;
}

static int x8_isa(int level) {
    return level >= QK_AVX512 && qk_have_vnni() ? QK_AVX512 : level >= QK_AVX2 ? QK_AVX2
                                                                              : QK_SCALAR;
}

int64_t qk_x8_bytes(int t, int64_t n, int64_t k) {
    const qk_traits *tr = x8_traits(t);
    if (!tr || n < 0 || k <= 0 || k % tr->block) return 0;
    return (n + 7) / 8 * (k / tr->block) * tr->x8_group_bytes;
}

int qk_repack_x8(int t, const uint8_t *src, int64_t row_bytes, int64_t n, int64_t k,
                 uint8_t *dst, int dir) {
    const qk_traits *tr = x8_traits(t);
    int level = 0;
    int rc = x8_check(tr, n, k, 1, &level);
    if (rc) return rc;
    int64_t nb = k / tr->block;
    if (row_bytes != nb * tr->bytes) return E_ROWBYTES;
    const int gb = tr->x8_group_bytes;
    if (dir == 0) memset(dst, 0, (size_t)qk_x8_bytes(t, n, k));
    for (int64_t row = 0; row < n; row++) {
        int64_t g = row / 8;
        int r = (int)(row % 8);
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk = (uint8_t *)(dir ? dst : src) + row * row_bytes + b * tr->bytes;
            uint8_t *gp = (uint8_t *)(dir ? src : dst) + (g * nb + b) * gb;
            if (dir == 0)
                tr->x8_pack(blk, gp, r);
            else
                tr->x8_unpack(gp, r, blk);
        }
    }
    return E_OK;
}

int qk_matmul_x8(int t, const float *x, int64_t ldx, int64_t m, const uint8_t *w, int64_t n,
                 int64_t k, float *y, int64_t ldy, int nthreads, int level) {
    const qk_traits *tr = x8_traits(t);
    int rc = x8_check(tr, n, k, nthreads, &level);
    if (rc) return rc;
    if (m < 0 || ldx < k || ldy < n) return E_SHAPE;
    if (m == 0 || n == 0) return E_OK;
    int64_t n32 = k / 32;
    x16_block *xq = malloc(m * n32 * sizeof(x16_block));
    float *xs = malloc(m * n32 * sizeof(float));
    int32_t *xi = malloc(m * n32 * sizeof(int32_t));
    int32_t *xh = malloc(m * n32 * sizeof(int32_t));
    if (!xq || !xs || !xi || !xh) {
        free(xq);
        free(xs);
        free(xi);
        free(xh);
        return E_NOMEM;
    }
    x16_rows(x, ldx, m, n32, xq, xs, xi, level, nthreads);
    if (tr->x8_half_sums) /* Q6_K's halves: the integer sum of the first 16 values of every block */
        for (int64_t b = 0; b < m * n32; b++) {
            int32_t sh = 0;
            for (int i = 0; i < 16; i++) sh += xq[b].q[i];
            xh[b] = sh;
        }
    x8_job_t j = {tr, x8_isa(level), w, n, k / tr->block, (n + 7) / 8, n32, m, xq, xs, xi, y,
                  ldy, NULL, 0, xh};
    int64_t pairs = (j.ngroups + 1) / 2;
    int nchunks = nthreads <= 1 ? 1 : (int)(pairs < 4 * nthreads ? pairs : 4 * nthreads);
    pool_run(x8_matmul_job, &j, nchunks < 1 ? 1 : nchunks, nthreads);
    free(xq);
    free(xs);
    free(xi);
    free(xh);
    return E_OK;
}

int qk_dequantize_x8(int t, const uint8_t *w, int64_t n, int64_t k, float *out, int64_t ldo,
                     int nthreads, int level) {
    const qk_traits *tr = x8_traits(t);
    int rc = x8_check(tr, n, k, nthreads, &level);
    if (rc) return rc;
    if (ldo < k) return E_SHAPE;
    if (n == 0) return E_OK;
    x8_job_t j = {tr, x8_isa(level), w, n, k / tr->block, (n + 7) / 8, k / 32, 0, NULL, NULL,
                  NULL, NULL, 0, out, ldo, NULL};
    int64_t pairs = (j.ngroups + 1) / 2;
    int nchunks = nthreads <= 1 ? 1 : (int)(pairs < 4 * nthreads ? pairs : 4 * nthreads);
    pool_run(x8_deq_job, &j, nchunks < 1 ? 1 : nchunks, nthreads);
    return E_OK;
}

/* out[i, 0..k) = row ids[i] of n rows of W in the x8 layout, dequantized as qk_dequantize_x8
 * dequantizes it (an embedding lookup: one call instead of a gather of 8-row groups, their
 * dequantization and a gather of lanes, ~10 torch calls of Python glue). Every id is checked
 * before anything is written. */
int qk_rows_x8(int t, const uint8_t *w, int64_t n, int64_t k, const int64_t *ids, int64_t m,
               float *out, int64_t ldo) {
    const qk_traits *tr = x8_traits(t);
    int level = -1;
    int rc = x8_check(tr, n, k, 1, &level);
    if (rc) return rc;
    if (m < 0 || ldo < k) return E_SHAPE;
    for (int64_t i = 0; i < m; i++)
        if (ids[i] < 0 || ids[i] >= n) return E_ROW;
    const int64_t nb = k / tr->block, gsz = nb * tr->x8_group_bytes;
    for (int64_t i = 0; i < m; i++)
        tr->x8_deq(w + ids[i] / 8 * gsz, nb, (int)(ids[i] % 8), out + i * ldo);
    return E_OK;
}
