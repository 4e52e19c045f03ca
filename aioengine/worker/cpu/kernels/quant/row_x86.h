/* AVX2 and AVX-512 building blocks of the row-layout kernels that several types share: written
 * once with the type as a constant argument (each type's file calls them with its own id, so
 * the branches on it fold away and each instance is that type's straight-line loop). */
#ifndef QK_ROW_X86_H
#define QK_ROW_X86_H

#include "act_quant.h"
#include "base.h"
#include "blocks.h"

#if QK_X86
#define QK_INLINE static inline __attribute__((always_inline))

/* 8 unsigned bytes at p -> 8 floats */
AVX2 static inline __m256 u8x8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }

/* sum of x[0..32) * nibbles (low nibbles of 16 bytes are values 0..15, high nibbles 16..31) */
AVX2 static inline __m256 nib_dot32(const uint8_t *qs, const float *x) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m128i m = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(q, m);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
    __m256 s = _mm256_mul_ps(u8x8(lo), _mm256_loadu_ps(x));
    s = _mm256_fmadd_ps(u8x8(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), s);
    __m256 t = _mm256_mul_ps(u8x8(hi), _mm256_loadu_ps(x + 16));
    t = _mm256_fmadd_ps(u8x8(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), t);
    return _mm256_add_ps(s, t);
}

/* Dequantize the 32-value blocks with AVX2 (Q8_0, Q4_0, Q4_1; the K-quants and Q5_0 dequantize
 * with the scalar code: the tiled path is compute-bound on the dot products, not on this) */
AVX2 QK_INLINE void deq32_avx2(const int t, const uint8_t *w, int64_t nb, float *out) {
    const __m128i m = _mm_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++) {
        float *o = out + b * 32;
        if (t == T_Q8_0) {
            const uint8_t *p = w + b * 34;
            __m256 d = _mm256_set1_ps(h2f_avx(p));
            for (int j = 0; j < 32; j += 8)
                _mm256_storeu_ps(o + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                              _mm_loadl_epi64((const __m128i *)(p + 2 + j))))));
            continue;
        }
        int q41 = t == T_Q4_1;
        const uint8_t *p = w + b * (q41 ? 20 : 18);
        __m256 d = _mm256_set1_ps(h2f_avx(p));
        __m256 mn = _mm256_set1_ps(q41 ? h2f_avx(p + 2) : -8.0f * h2f_avx(p));
        __m128i q = _mm_loadu_si128((const __m128i *)(p + (q41 ? 4 : 2)));
        __m128i lo = _mm_and_si128(q, m), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
        _mm256_storeu_ps(o, _mm256_fmadd_ps(u8x8(lo), d, mn));
        _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(u8x8(_mm_srli_si128(lo, 8)), d, mn));
        _mm256_storeu_ps(o + 16, _mm256_fmadd_ps(u8x8(hi), d, mn));
        _mm256_storeu_ps(o + 24, _mm256_fmadd_ps(u8x8(_mm_srli_si128(hi, 8)), d, mn));
    }
}

/* int8 activations (Q8_0, Q4_0, Q4_1) */
AVX2 QK_INLINE float dot_i8_avx2(const int t, const uint8_t *w, int64_t nb, const xq_block *xq) {
    __m256 acc = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    float tail = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)xq[b].q);
        __m256i prod;
        float scale;
        if (t == T_Q8_0) {
            const uint8_t *p = w + b * 34;
            __m256i wv = _mm256_loadu_si256((const __m256i *)(p + 2));
            prod = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
            scale = h2f_avx(p) * xq[b].d;
        } else {
            int q41 = t == T_Q4_1;
            const uint8_t *p = w + b * (q41 ? 20 : 18);
            __m128i q = _mm_loadu_si128((const __m128i *)(p + (q41 ? 4 : 2)));
            __m256i wv = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4),
                                          _mm_and_si128(q, m4));
            prod = _mm256_maddubs_epi16(wv, xv);
            float dw = h2f_avx(p);
            scale = dw * xq[b].d;
            tail += q41 ? h2f_avx(p + 2) * xq[b].d * xq[b].sum : -8.0f * scale * xq[b].sum;
        }
        __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(prod, ones));
        acc = _mm256_fmadd_ps(f, _mm256_set1_ps(scale), acc);
    }
    return hsum8(acc) + tail;
}

/* 16 unsigned bytes (values 0..off*2) minus off, times 16 int16 activations: 8 int32 sums */
AVX2 static inline __m256i madd16(__m128i bytes, __m256i off, const int16_t *x) {
    __m256i wv = _mm256_sub_epi16(_mm256_cvtepu8_epi16(bytes), off);
    return _mm256_madd_epi16(wv, _mm256_loadu_si256((const __m256i *)x));
}

/* 4 rows of int16 activations against one weight row (Q8_0, Q4_0, Q4_1): each weight block is
 * unpacked once and used for the 4 rows (batched decode, short prompts). xq/xs: 4 rows of
 * n32 blocks each, one after another. */
AVX2 QK_INLINE void dot4_i16_avx2(const int t, const uint8_t *w, int64_t nb, const x16_block *xq,
                               const float *xs, int64_t n32, float *out) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    float tail[4] = {0, 0, 0, 0};
    const int q41 = t == T_Q4_1, q80 = t == T_Q8_0;
    const int bytes = q80 ? 34 : q41 ? 20 : 18;
    const __m256i off = (q41 || q80) ? _mm256_setzero_si256() : _mm256_set1_epi16(8);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * bytes;
        __m256i w0, w1;
        if (q80) {
            w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 2)));
            w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 18)));
        } else {
            __m256i q = _mm256_cvtepu8_epi16(
                _mm_loadu_si128((const __m128i *)(p + (q41 ? 4 : 2))));
            w0 = _mm256_sub_epi16(_mm256_and_si256(q, _mm256_set1_epi16(0x0F)), off);
            w1 = _mm256_sub_epi16(_mm256_srli_epi16(q, 4), off);
        }
        float dw = h2f_avx(p);
#define ROW(i, acc)                                                                           \
    {                                                                                         \
        const x16_block *xb = &xq[(i) * n32 + b];                                             \
        __m256i s = _mm256_add_epi32(                                                         \
            _mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)xb->q)),                \
            _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(xb->q + 16))));        \
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * xb->d), acc);        \
    }
        ROW(0, acc0)
        ROW(1, acc1)
        ROW(2, acc2)
        ROW(3, acc3)
#undef ROW
        if (q41) {
            float mw = h2f_avx(p + 2);
            for (int i = 0; i < 4; i++) tail[i] += mw * xs[i * n32 + b];
        }
    }
    out[0] = hsum8(acc0) + tail[0];
    out[1] = hsum8(acc1) + tail[1];
    out[2] = hsum8(acc2) + tail[2];
    out[3] = hsum8(acc3) + tail[3];
}

/* Q4_0 / Q4_1 with int16 activations, two blocks per iteration into independent accumulators
 * (the block offsets' scalar sums too: one chain of float adds per block was the bottleneck) */
AVX2 static inline __attribute__((always_inline)) float q4_i16_avx2(
    const uint8_t *w, int64_t nb, const x16_block *xq, const float *xs, const int q41) {
    const __m256i m4w = _mm256_set1_epi16(0x0F);
    const __m256i off = q41 ? _mm256_setzero_si256() : _mm256_set1_epi16(8);
    const int bytes = q41 ? 20 : 18, qoff = q41 ? 4 : 2;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    float t0 = 0.0f, t1 = 0.0f;
#define Q4BLK(bb, ACC, T)                                                                     \
    {                                                                                         \
        const uint8_t *p = w + (bb) * bytes;                                                  \
        /* bytes to 16-bit lanes once; the low nibble by a mask, the high one by a shift */   \
        __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + qoff)));      \
        __m256i s = _mm256_add_epi32(                                                         \
            _mm256_madd_epi16(_mm256_sub_epi16(_mm256_and_si256(q, m4w), off),                \
                              _mm256_loadu_si256((const __m256i *)xq[bb].q)),                 \
            _mm256_madd_epi16(_mm256_sub_epi16(_mm256_srli_epi16(q, 4), off),                 \
                              _mm256_loadu_si256((const __m256i *)(xq[bb].q + 16))));         \
        ACC = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(h2f_avx(p) * xq[bb].d),   \
                              ACC);                                                           \
        if (q41) T += h2f_avx(p + 2) * xs[bb];                                                \
    }
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        Q4BLK(b, acc0, t0)
        Q4BLK(b + 1, acc1, t1)
    }
    if (b < nb) Q4BLK(b, acc0, t0)
#undef Q4BLK
    return hsum8(_mm256_add_ps(acc0, acc1)) + (t0 + t1);
}

/* the 32 values (0..31) of a Q5_0 / Q5_1 block as bytes in order: the low nibbles of qs
 * (values 0..15), then its high nibbles (16..31), bit j of the 32-bit qh on top of value j (each
 * byte j picks qh's byte j/8, an OR with all bits but j%8 and a compare test bit j) */
AVX2 static inline __m256i q5_bytes32(const uint8_t *qh4, const uint8_t *qs) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                             0x0101010101010101, 0);
    __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
    bits = _mm256_cmpeq_epi8(_mm256_or_si256(bits, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                             _mm256_set1_epi64x(-1));
    const __m128i m = _mm_set1_epi8(0x0F);
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
    return _mm256_or_si256(nib, _mm256_and_si256(bits, _mm256_set1_epi8(0x10)));
}

/* the 32 values (0..31) of sub-block s of the Q5_K super-block p as bytes: pair s/2's low or
 * high nibbles, bit s of qh[l] on top of value l */
AVX2 static inline __m256i q5_k_bytes32(const uint8_t *p, int s) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    __m256i qs = _mm256_loadu_si256((const __m256i *)(p + 48 + 32 * (s / 2)));
    __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 16));
    __m256i nib = _mm256_and_si256(s & 1 ? _mm256_srli_epi16(qs, 4) : qs, m4);
    __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, s), one); /* bit s of each byte */
    return _mm256_or_si256(nib, _mm256_slli_epi16(hb, 4));
}

/* acc + the 32 unsigned bytes of v times x[0..32) (8 partial sums) */
AVX2 static inline __m256 u8x32_dot(__m256i v, const float *x, __m256 acc) {
    __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    acc = _mm256_fmadd_ps(u8x8(lo), _mm256_loadu_ps(x), acc);
    acc = _mm256_fmadd_ps(u8x8(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), acc);
    acc = _mm256_fmadd_ps(u8x8(hi), _mm256_loadu_ps(x + 16), acc);
    return _mm256_fmadd_ps(u8x8(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), acc);
}

/* the 32 unsigned bytes of v times 32 int16 activations: 8 int32 partial sums */
AVX2 static inline __m256i u8x32_madd16(__m256i v, const int16_t *x) {
    __m256i a = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(v));
    __m256i b = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(v, 1));
    return _mm256_add_epi32(_mm256_madd_epi16(a, _mm256_loadu_si256((const __m256i *)x)),
                            _mm256_madd_epi16(b, _mm256_loadu_si256((const __m256i *)(x + 16))));
}

/* out[0..32) = d * v + m for the 32 unsigned bytes of v. With d an fp16 scale (Q5_K: times a
 * 6-bit one) and v 5 bits, d * v fits float32's 24 bits: the FMA's one rounding gives the
 * reference's d*q + m (two roundings) exactly. */
AVX2 static inline void u8x32_affine(__m256i v, __m256 d, __m256 m, float *out) {
    __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    _mm256_storeu_ps(out, _mm256_fmadd_ps(u8x8(lo), d, m));
    _mm256_storeu_ps(out + 8, _mm256_fmadd_ps(u8x8(_mm_srli_si128(lo, 8)), d, m));
    _mm256_storeu_ps(out + 16, _mm256_fmadd_ps(u8x8(hi), d, m));
    _mm256_storeu_ps(out + 24, _mm256_fmadd_ps(u8x8(_mm_srli_si128(hi, 8)), d, m));
}

/* the 32 stored values of sub-block s of a Q2_K (hm NULL) or Q3_K super-block as bytes: bits
 * 2(s%4) of the 32 bytes at qs + 32(s/4), and Q3_K's bit s of hm[l] on top as bit 2 */
AVX2 static inline __m256i k2_bytes32(const uint8_t *qs, const uint8_t *hm, int s) {
    __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * (s / 4)));
    v = _mm256_and_si256(_mm256_srli_epi16(v, 2 * (s % 4)), _mm256_set1_epi8(3));
    if (!hm) return v;
    __m256i h = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)hm), s),
                                 _mm256_set1_epi8(1));
    return _mm256_or_si256(v, _mm256_slli_epi16(h, 2));
}

/* Q2_K and Q3_K in the row layout with AVX2, from the type's PREFIX##_scales (row_scalar.h's
 * K16_ROW_FNS) and PREFIX##_bytes32(p, s), sub-block s's 32 stored values as bytes; one
 * always-inline loop, OP the entry (0 dequantize, 1 float32 dot, 2 int16 dot) folded per
 * instance. x = a*(q - OFF) - b per 16 values: the dot products take a * sum(x q) - (b + OFF a)
 * * sum(x) (int16: Q2_K's min from the sum of the int16 activations); a*q is exact in float32
 * (an fp16 d times a 6-bit scale times a 3-bit value), so the dequantization's FMA rounds once
 * as the reference's a*q - b does. */
#define K16_ROW_AVX2_FNS(PREFIX, BYTES, OFF)                                                  \
    AVX2 QK_INLINE float PREFIX##_k16_avx2(const int op, const uint8_t *w, int64_t nb,        \
                                           const float *x, const x16_block *xq, float *out) { \
        float a[16], c[16];                                                                   \
        const __m256i off32 = _mm256_set1_epi32(OFF), off16 = _mm256_set1_epi16(OFF);        \
        __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();                         \
        for (int64_t b = 0; b < nb; b++) {                                                    \
            const uint8_t *p = w + b * BYTES;                                                 \
            PREFIX##_scales(p, a, c);                                                         \
            for (int s = 0; s < 8; s++) {                                                     \
                __m256i v = PREFIX##_bytes32(p, s);                                           \
                __m128i h[2] = {_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)};   \
                for (int k = 0; k < 2; k++) {                                                 \
                    const int i = 2 * s + k; /* values 16i..16i+15 of the super-block */     \
                    if (op == 0) {                                                            \
                        for (int j = 0; j < 2; j++) {                                         \
                            __m128i q8 = j ? _mm_srli_si128(h[k], 8) : h[k];                  \
                            __m256 q = _mm256_cvtepi32_ps(                                    \
                                _mm256_sub_epi32(_mm256_cvtepu8_epi32(q8), off32));           \
                            _mm256_storeu_ps(out + b * 256 + 16 * i + 8 * j,                  \
                                             _mm256_fmadd_ps(q, _mm256_set1_ps(a[i]),         \
                                                             _mm256_set1_ps(-c[i])));         \
                        }                                                                     \
                    } else if (op == 1) {                                                     \
                        const float *xb = x + b * 256 + 16 * i;                               \
                        __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);        \
                        __m256 sq = _mm256_fmadd_ps(u8x8(_mm_srli_si128(h[k], 8)), x1,        \
                                                    _mm256_mul_ps(u8x8(h[k]), x0));           \
                        acc = _mm256_fmadd_ps(sq, _mm256_set1_ps(a[i]), acc);                 \
                        accm = _mm256_fmadd_ps(_mm256_add_ps(x0, x1),                         \
                                               _mm256_set1_ps(c[i] + OFF * a[i]), accm);      \
                    } else {                                                                  \
                        const x16_block *xb = &xq[b * 8 + s];                                 \
                        __m256 sq = _mm256_cvtepi32_ps(madd16(h[k], off16, xb->q + 16 * k)); \
                        acc = _mm256_fmadd_ps(sq, _mm256_set1_ps(a[i] * xb->d), acc);         \
                        if (OFF == 0) {                                                       \
                            __m256i sx = _mm256_madd_epi16(                                   \
                                _mm256_set1_epi16(1),                                         \
                                _mm256_loadu_si256((const __m256i *)(xb->q + 16 * k)));       \
                            accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sx),                    \
                                                   _mm256_set1_ps(c[i] * xb->d), accm);       \
                        }                                                                     \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        return hsum8(_mm256_sub_ps(acc, accm));                                               \
    }                                                                                         \
    AVX2 static void PREFIX##_deq_avx2(const uint8_t *w, int64_t nb, float *out) {            \
        PREFIX##_k16_avx2(0, w, nb, NULL, NULL, out);                                         \
    }                                                                                         \
    AVX2 static float PREFIX##_dot_avx2(const uint8_t *w, int64_t nb, const float *x,         \
                                        const float *xs) {                                    \
        (void)xs;                                                                             \
        return PREFIX##_k16_avx2(1, w, nb, x, NULL, NULL);                                    \
    }                                                                                         \
    AVX2 static float PREFIX##_dot_i16_avx2(const uint8_t *w, int64_t nb, const x16_block *xq, \
                                            const float *xs) {                                \
        (void)xs;                                                                             \
        return PREFIX##_k16_avx2(2, w, nb, NULL, xq, NULL);                                   \
    }

/* AVX-512: 4-bit values looked up in a 16-entry table of their dequantized floats (vpermps) */
AVX512 static inline __m512 nib_lut_dot32(__m128i q, __m512 lut, const float *x, __m512 acc) {
    const __m128i m = _mm_set1_epi8(0x0F);
    __m512i lo = _mm512_cvtepu8_epi32(_mm_and_si128(q, m));
    __m512i hi = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), m));
    acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(lo, lut), _mm512_loadu_ps(x), acc);
    return _mm512_fmadd_ps(_mm512_permutexvar_ps(hi, lut), _mm512_loadu_ps(x + 16), acc);
}
#endif

#endif
