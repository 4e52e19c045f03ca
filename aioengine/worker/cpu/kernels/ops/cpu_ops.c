/* The per-token work of a decoder layer outside its linears, for CPU float32: the residual add
 * fused with RMSNorm, rotary embedding fused with the KV-cache write, and SiLU-and-multiply.
 * At batch 1 torch runs each of these as several ops with a dispatch and a temporary apiece
 * (RMSNorm is a composite of six ops; rope is slices, four multiplies and a cat; the KV write an
 * index_copy_), over only a few KB of data, so the per-op overhead dominated; here each is one
 * pass (the measurements: docs/benchmarks.md, "Measurements behind design choices").
 *
 * Numerics: float32 throughout, each product rounded as torch rounds it (built with
 * -ffp-contract=off: no FMA contraction), so rope and the norm's scaling match torch's
 * element-wise ops bit for bit; the norm's sum of squares and SiLU's exp differ from torch's in
 * the last bits (summation order; a ~1 ulp polynomial exp).
 *
 * Single-threaded (called from the worker's one Python thread; the linears have the thread
 * pools); `#pragma omp simd` under -fopenmp-simd only vectorizes, it links no OpenMP runtime.
 * Plain C11, no torch headers.
 */

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_ops.h"
#include "../common/fast_exp.h"

/* float32 -> float16 of n values, rounded to nearest even (as torch's .half() rounds). */
#if defined(__F16C__)
#include <immintrin.h>
static inline void narrow_f16(const float *restrict src, uint16_t *restrict dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}
#elif defined(__FLT16_MAX__)
static inline void narrow_f16(const float *restrict src, uint16_t *restrict dst, int64_t n) {
    _Float16 *h = (_Float16 *)dst;
    for (int64_t i = 0; i < n; i++)
        h[i] = (_Float16)src[i];
}
#else
#error "no float16 support in this compiler (neither F16C nor _Float16)"
#endif


/* out[i] = norm(r_i) * w, r_i = x[i] + residual[i] (stored back into residual) when add, else
 * r_i = x[i] (residual untouched, may be NULL). offset: Gemma's (1 + w). Rows of n floats with
 * leading dimensions ldx, ldr, ldo (out may alias x). */
int add_rms_norm_f32(const float *x, int64_t ldx, float *residual, int64_t ldr, const float *w,
                     float *out, int64_t ldo, int64_t m, int64_t n, float eps, int offset,
                     int add) {
    if (m < 0 || n < 1 || ldx < n || ldo < n || (add && (!residual || ldr < n)))
        return OPS_BAD_SHAPE;
    for (int64_t i = 0; i < m; i++) {
        const float *xi = x + i * ldx;
        float *oi = out + i * ldo;
        const float *src = xi;
        if (add) {
            float *ri = residual + i * ldr;
#pragma omp simd
            for (int64_t j = 0; j < n; j++)
                ri[j] = xi[j] + ri[j];
            src = ri;
        }
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < n; j++)
            ss += src[j] * src[j];
        float inv = 1.0f / sqrtf(ss / (float)n + eps);
        if (offset) {
#pragma omp simd
            for (int64_t j = 0; j < n; j++)
                oi[j] = (src[j] * inv) * (1.0f + w[j]);
        } else {
#pragma omp simd
            for (int64_t j = 0; j < n; j++)
                oi[j] = (src[j] * inv) * w[j];
        }
    }
    return OPS_OK;
}

/* Rotary embedding in place on the q and k heads of t rows of a fused qkv output (row i at
 * qkv + i * ldq: hq query heads, hkv key heads, hkv value heads of d floats), "rotate half"
 * layout over the first 2 * half dims of each head (the rest pass through), with cos/sin rows
 * of `half` floats per token (cos + i * half). Then, when kv is not NULL, each token's k
 * (rotated) and v are stored at its slot: kv is [2, hkv, slots_per_head, d] (k then v), float32
 * (rope_store_f32) or float16 (rope_store_f16: rounded to nearest even). */
static inline __attribute__((always_inline)) int rope_store(
        float *qkv, int64_t ldq, int64_t t, int64_t hq, int64_t hkv, int64_t d,
        const float *cos_t, const float *sin_t, int64_t half, void *kv, int f16,
        int64_t slots_per_head, const int64_t *slots) {
    if (t < 0 || hq < 1 || hkv < 1 || d < 1 || half < 0 || 2 * half > d
        || ldq < (hq + 2 * hkv) * d)
        return OPS_BAD_SHAPE;
    if (kv) {
        for (int64_t i = 0; i < t; i++)
            if (slots[i] < 0 || slots[i] >= slots_per_head)
                return OPS_BAD_SLOT;
    }
    for (int64_t i = 0; i < t; i++) {
        float *row = qkv + i * ldq;
        const float *c = cos_t + i * half;
        const float *s = sin_t + i * half;
        for (int64_t h = 0; h < hq + hkv; h++) {
            float *x1 = row + h * d;
            float *x2 = x1 + half;
#pragma omp simd
            for (int64_t j = 0; j < half; j++) {
                float a = x1[j], b = x2[j];
                x1[j] = a * c[j] - b * s[j];
                x2[j] = b * c[j] + a * s[j];
            }
        }
        if (kv) {
            int64_t slot = slots[i];
            for (int64_t h = 0; h < hkv; h++) {
                int64_t ko = (h * slots_per_head + slot) * d;
                int64_t vo = ((hkv + h) * slots_per_head + slot) * d;
                if (f16) {
                    narrow_f16(row + (hq + h) * d, (uint16_t *)kv + ko, d);
                    narrow_f16(row + (hq + hkv + h) * d, (uint16_t *)kv + vo, d);
                } else {
                    memcpy((float *)kv + ko, row + (hq + h) * d, (size_t)d * sizeof(float));
                    memcpy((float *)kv + vo, row + (hq + hkv + h) * d,
                           (size_t)d * sizeof(float));
                }
            }
        }
    }
    return OPS_OK;
}

int rope_store_f32(float *qkv, int64_t ldq, int64_t t, int64_t hq, int64_t hkv, int64_t d,
                   const float *cos_t, const float *sin_t, int64_t half, float *kv,
                   int64_t slots_per_head, const int64_t *slots) {
    return rope_store(qkv, ldq, t, hq, hkv, d, cos_t, sin_t, half, kv, 0, slots_per_head,
                      slots);
}

int rope_store_f16(float *qkv, int64_t ldq, int64_t t, int64_t hq, int64_t hkv, int64_t d,
                   const float *cos_t, const float *sin_t, int64_t half, uint16_t *kv,
                   int64_t slots_per_head, const int64_t *slots) {
    return rope_store(qkv, ldq, t, hq, hkv, d, cos_t, sin_t, half, kv, 1, slots_per_head,
                      slots);
}

/* out[i, j] = silu(x[i, j]) * x[i, n + j] for rows of 2n floats (gate, then up). The
 * exponentials of a chunk go to a scratch first, then the quotients: in one loop GCC split the
 * clamps into branches that each divide (two vdivps and three blends a vector), much slower
 * than the two loops (docs/benchmarks.md); the results are bit-identical. `out` may be x's
 * gate columns (each g[j] is read before o[j] is written). */
#define SILU_CHUNK 256
int silu_mul_f32(const float *x, int64_t ldx, float *out, int64_t ldo, int64_t m, int64_t n) {
    if (m < 0 || n < 1 || ldx < 2 * n || ldo < n)
        return OPS_BAD_SHAPE;
    float e[SILU_CHUNK];
    for (int64_t i = 0; i < m; i++) {
        const float *g = x + i * ldx;
        const float *u = g + n;
        float *o = out + i * ldo;
        for (int64_t j0 = 0; j0 < n; j0 += SILU_CHUNK) {
            const int64_t c = n - j0 < SILU_CHUNK ? n - j0 : SILU_CHUNK;
#pragma omp simd
            for (int64_t j = 0; j < c; j++)
                e[j] = exp_clamped(-g[j0 + j]);
#pragma omp simd
            for (int64_t j = 0; j < c; j++)
                o[j0 + j] = g[j0 + j] / (1.0f + e[j]) * u[j0 + j];
        }
    }
    return OPS_OK;
}
