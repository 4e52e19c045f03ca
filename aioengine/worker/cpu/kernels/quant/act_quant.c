#include "base.h"
#include "act_quant.h"
#include "threads.h"

void quantize_x(const float *x, int64_t nb, xq_block *out) {
    for (int64_t b = 0; b < nb; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) {
            float a = x[b * 32 + i] < 0 ? -x[b * 32 + i] : x[b * 32 + i];
            amax = a > amax ? a : amax;
        }
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < 32; i++) {
            float v = x[b * 32 + i] * id;
            int q = (int)(v < 0 ? v - 0.5f : v + 0.5f); /* roundf */
            out[b].q[i] = (int8_t)q;
            sum += q;
        }
        out[b].d = d;
        out[b].sum = sum;
    }
}

void quantize_x16(const float *x, int64_t nb, x16_block *out) {
    for (int64_t b = 0; b < nb; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) {
            float a = x[b * 32 + i] < 0 ? -x[b * 32 + i] : x[b * 32 + i];
            amax = a > amax ? a : amax;
        }
        float d = amax / 32767.0f, id = d ? 1.0f / d : 0.0f;
        for (int i = 0; i < 32; i++) {
            float v = x[b * 32 + i] * id;
            int q = (int)(v < 0 ? v - 0.5f : v + 0.5f);
            out[b].q[i] = (int16_t)(q > 32767 ? 32767 : q < -32767 ? -32767 : q);
        }
        out[b].d = d;
    }
}

/* x rows -> int16 blocks (quantize_x16's rounding and scale), the float sum of every block
 * (Q4_1's min) and the integer sum of its int16 values (Q4_0's offset) */
static void x16_row_scalar(const float *xr, int64_t n32, x16_block *xq, float *xs, int32_t *xi) {
    quantize_x16(xr, n32, xq);
    for (int64_t b = 0; b < n32; b++) {
        float s = 0.0f;
        int32_t si = 0;
        for (int i = 0; i < 32; i++) {
            s += xr[b * 32 + i];
            si += xq[b].q[i];
        }
        xs[b] = s;
        xi[b] = si;
    }
}

#if QK_X86
/* the same with AVX2, branch-free: the scalar loop's data-dependent rounding branch
 * mispredicts on every other value, which made the rounding a large part of a prefill. Values, scale and integer sums are quantize_x16's exactly; the float
 * sum adds in another order (8 lanes, then across). */
AVX2 static void x16_row_avx2(const float *xr, int64_t n32, x16_block *xq, float *xs,
                              int32_t *xi) {
    const __m256 sgn = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f);
    const __m256i lim = _mm256_set1_epi32(32767), nlim = _mm256_set1_epi32(-32767);
    for (int64_t b = 0; b < n32; b++) {
        __m256 v[4], mx = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xr + b * 32 + 8 * i);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sgn, v[i]));
            sum = _mm256_add_ps(sum, v[i]);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float d = amax / 32767.0f, id = d ? 1.0f / d : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i q[4], isum = _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {
            __m256 y = _mm256_mul_ps(v[i], vid);
            y = _mm256_add_ps(y, _mm256_or_ps(half, _mm256_and_ps(sgn, y)));
            q[i] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvttps_epi32(y), lim), nlim);
            isum = _mm256_add_epi32(isum, q[i]);
        }
        __m256i p0 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
        __m256i p1 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);
        _mm256_storeu_si256((__m256i *)xq[b].q, p0);
        _mm256_storeu_si256((__m256i *)(xq[b].q + 16), p1);
        xq[b].d = d;
        xs[b] = hsum8(sum);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(isum), _mm256_extracti128_si256(isum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        xi[b] = _mm_cvtsi128_si32(s4);
    }
}
#endif

typedef struct {
    const float *x;
    int64_t ldx, m, n32;
    x16_block *xq;
    float *xs;
    int32_t *xi;
    int level;
} x16_job_t;

static void x16_rows_job(void *a, int c, int nchunks) {
    x16_job_t *j = a;
    int64_t r0 = j->m * c / nchunks, r1 = j->m * (c + 1) / nchunks;
    for (int64_t mi = r0; mi < r1; mi++) {
        const float *xr = j->x + mi * j->ldx;
        int64_t o = mi * j->n32;
#if QK_X86
        if (j->level >= 1) {
            x16_row_avx2(xr, j->n32, j->xq + o, j->xs + o, j->xi + o);
            continue;
        }
#endif
        x16_row_scalar(xr, j->n32, j->xq + o, j->xs + o, j->xi + o);
    }
}

/* every x row quantized, on the pool when there are enough of them */
void x16_rows(const float *x, int64_t ldx, int64_t m, int64_t n32, x16_block *xq,
                     float *xs, int32_t *xi, int level, int nthreads) {
    x16_job_t j = {x, ldx, m, n32, xq, xs, xi, level};
    int64_t work = m * n32; /* 32-value blocks: too few are not worth waking the pool */
    int nchunks = nthreads <= 1 || work < 2048 ? 1 : (int)(m < 4 * nthreads ? m : 4 * nthreads);
    pool_run(x16_rows_job, &j, nchunks, nthreads);
}

