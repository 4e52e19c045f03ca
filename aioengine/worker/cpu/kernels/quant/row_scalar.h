/* Portable scalar building blocks of the row-layout kernels that several 32-value types share,
 * written once with the type as a constant argument (see row_x86.h). */
#ifndef QK_ROW_SCALAR_H
#define QK_ROW_SCALAR_H

#include "act_quant.h"
#include "base.h"
#include "blocks.h"

/* Q4_0 (q41 = 0) and Q4_1 (q41 = 1) . float32 x; xs: sums of x per 32 values */
static inline __attribute__((always_inline)) float q4_dot_scalar(
    const int q41, const uint8_t *w, int64_t nb, const float *x, const float *xs) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * (q41 ? 20 : 18);
        const uint8_t *qs = p + (q41 ? 4 : 2);
        const float *xb = x + b * 32;
        float s = 0.0f;
        for (int j = 0; j < 16; j++) s += xb[j] * (qs[j] & 0xF) + xb[j + 16] * (qs[j] >> 4);
        acc += q41 ? h2f(p) * s + h2f(p + 2) * xs[b] : h2f(p) * (s - 8.0f * xs[b]);
    }
    return acc;
}

/* Q4_0 / Q4_1 . int16 x */
static inline __attribute__((always_inline)) float q4_dot_i16_scalar(
    const int q41, const uint8_t *w, int64_t nb, const x16_block *xq, const float *xs) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * (q41 ? 20 : 18), *qs = p + (q41 ? 4 : 2);
        int off = q41 ? 0 : 8;
        int32_t s = 0;
        for (int j = 0; j < 16; j++)
            s += ((qs[j] & 0xF) - off) * xq[b].q[j] + ((qs[j] >> 4) - off) * xq[b].q[j + 16];
        acc += h2f(p) * xq[b].d * s + (q41 ? h2f(p + 2) * xs[b] : 0.0f);
    }
    return acc;
}

/* Q8_0, Q4_0, Q4_1 . int8 x */
static inline __attribute__((always_inline)) float dot_i8_scalar(
    const int t, const uint8_t *w, int64_t nb, const xq_block *xq) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const int8_t *q8 = xq[b].q;
        int32_t s = 0;
        if (t == T_Q8_0) {
            const int8_t *wq = (const int8_t *)(w + b * 34 + 2);
            for (int j = 0; j < 32; j++) s += wq[j] * q8[j];
            acc += h2f(w + b * 34) * xq[b].d * s;
        } else {
            int q41 = t == T_Q4_1;
            const uint8_t *p = w + b * (q41 ? 20 : 18), *qs = p + (q41 ? 4 : 2);
            for (int j = 0; j < 16; j++) s += (qs[j] & 0xF) * q8[j] + (qs[j] >> 4) * q8[j + 16];
            if (q41)
                acc += h2f(p) * xq[b].d * s + h2f(p + 2) * xq[b].d * xq[b].sum;
            else
                acc += h2f(p) * xq[b].d * (s - 8 * xq[b].sum);
        }
    }
    return acc;
}

/* Q2_K and Q3_K, a scale per 16 values: the row entries from PREFIX##_scales(blk, a, b), which
 * gives a[i] = d*sc[i] and b[i] = dmin*mn[i] (Q3_K: 0) of a super-block's 16 scale groups, and
 * PREFIX##_vals(blk, q), its 256 stored values; x = a*(q - OFF) - b, the reference's float
 * products (exact). */
#define K16_ROW_FNS(PREFIX, BYTES, OFF)                                                       \
    static void PREFIX##_deq_scalar(const uint8_t *w, int64_t nb, float *out) {               \
        int q[256];                                                                           \
        float a[16], c[16];                                                                   \
        for (int64_t b = 0; b < nb; b++) {                                                    \
            PREFIX##_scales(w + b * BYTES, a, c);                                             \
            PREFIX##_vals(w + b * BYTES, q);                                                  \
            for (int v = 0; v < 256; v++)                                                     \
                out[b * 256 + v] = a[v / 16] * (float)(q[v] - OFF) - c[v / 16];               \
        }                                                                                     \
    }                                                                                         \
    static float PREFIX##_dot_scalar(const uint8_t *w, int64_t nb, const float *x,            \
                                     const float *xs) {                                       \
        (void)xs; /* per 32 values: the mins need sums per 16 */                              \
        int q[256];                                                                           \
        float a[16], c[16], acc = 0.0f;                                                       \
        for (int64_t b = 0; b < nb; b++) {                                                    \
            PREFIX##_scales(w + b * BYTES, a, c);                                             \
            PREFIX##_vals(w + b * BYTES, q);                                                  \
            for (int i = 0; i < 16; i++) {                                                    \
                const float *xb = x + b * 256 + 16 * i;                                       \
                float s = 0.0f, sx = 0.0f;                                                    \
                for (int l = 0; l < 16; l++) {                                                \
                    s += xb[l] * (float)(q[16 * i + l] - OFF);                                \
                    sx += xb[l];                                                              \
                }                                                                             \
                acc += a[i] * s - c[i] * sx;                                                  \
            }                                                                                 \
        }                                                                                     \
        return acc;                                                                           \
    }                                                                                         \
    static float PREFIX##_dot_i16_scalar(const uint8_t *w, int64_t nb, const x16_block *xq,   \
                                         const float *xs) {                                   \
        (void)xs;                                                                             \
        int q[256];                                                                           \
        float a[16], c[16], acc = 0.0f;                                                       \
        for (int64_t b = 0; b < nb; b++) {                                                    \
            PREFIX##_scales(w + b * BYTES, a, c);                                             \
            PREFIX##_vals(w + b * BYTES, q);                                                  \
            for (int i = 0; i < 16; i++) {                                                    \
                const x16_block *xb = &xq[b * 8 + i / 2];                                     \
                int32_t s = 0, sx = 0;                                                        \
                for (int l = 0; l < 16; l++) {                                                \
                    int32_t xv = xb->q[16 * (i % 2) + l];                                     \
                    s += (q[16 * i + l] - OFF) * xv;                                          \
                    sx += xv;                                                                 \
                }                                                                             \
                acc += xb->d * (a[i] * (float)s - c[i] * (float)sx);                          \
            }                                                                                 \
        }                                                                                     \
        return acc;                                                                           \
    }

#endif
