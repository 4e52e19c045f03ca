/* Q6_K: 256 values in 210 bytes, 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales
 * (one per 16 values), fp16 d; x = d*sc*(q-32). Its AVX-512 row kernel is the AVX2 one. */
#include "base.h"
#include "blocks.h"
#include "row_x86.h"
#include "traits.h"
#include "x8.h"
#include "x8_x86.h"

static void q6_k_deq_scalar(const uint8_t *w, int64_t nb, float *out) {
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 210;
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = h2f(p + 208);
        float *o = out + b * 256;
        for (int n = 0; n < 2; n++) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                o[l] = d * sc[is + 0] * q1;
                o[l + 32] = d * sc[is + 2] * q2;
                o[l + 64] = d * sc[is + 4] * q3;
                o[l + 96] = d * sc[is + 6] * q4;
            }
            o += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

static float q6_k_dot_scalar(const uint8_t *w, int64_t nb, const float *x, const float *xs) {
    (void)xs;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 210;
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = h2f(p + 208);
        const float *xb = x + b * 256;
        float s = 0.0f;
        for (int n = 0; n < 2; n++) {
            float g[8] = {0};
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                g[is + 0] += xb[l] * q1;
                g[is + 2] += xb[l + 32] * q2;
                g[is + 4] += xb[l + 64] * q3;
                g[is + 6] += xb[l + 96] * q4;
            }
            for (int i = 0; i < 8; i++) s += sc[i] * g[i];
            xb += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
        acc += d * s;
    }
    return acc;
}

static float q6_k_dot_i16_scalar(const uint8_t *w, int64_t nb, const x16_block *xq,
                                 const float *xs) {
    (void)xs;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 210;
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = h2f(p + 208);
        for (int n = 0; n < 2; n++) {
            const x16_block *xb = &xq[b * 8 + n * 4];
            for (int g = 0; g < 2; g++) { /* l in [16g, 16g+16) */
                int32_t s1 = 0, s2 = 0, s3 = 0, s4 = 0;
                for (int l = 16 * g; l < 16 * g + 16; l++) {
                    s1 += (((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32) * xb[0].q[l];
                    s2 += (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32) * xb[1].q[l];
                    s3 += (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32) * xb[2].q[l];
                    s4 += (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32) * xb[3].q[l];
                }
                acc += d * (sc[g] * xb[0].d * s1 + sc[g + 2] * xb[1].d * s2 +
                            sc[g + 4] * xb[2].d * s3 + sc[g + 6] * xb[3].d * s4);
            }
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
    return acc;
}

#if QK_X86
AVX2 static float q6_k_dot_avx2(const uint8_t *w, int64_t nb, const float *x, const float *xs) {
    (void)xs;
    __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    float tail = 0.0f, tail2 = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 210;
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = h2f_avx(p + 208);
        const float *xb = x + b * 256;
        const __m256i m4 = _mm256_set1_epi32(0xF), m3 = _mm256_set1_epi32(3);
        const __m256i off = _mm256_set1_epi32(32);
        for (int n = 0; n < 2; n++) {
            for (int l = 0; l < 32; l += 8) {
                int is = l / 16;
                __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(ql + l)));
                __m256i c =
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(ql + l + 32)));
                __m256i h = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qh + l)));
                __m256i q1 = _mm256_or_si256(_mm256_and_si256(a, m4),
                                             _mm256_slli_epi32(_mm256_and_si256(h, m3), 4));
                __m256i q2 = _mm256_or_si256(
                    _mm256_and_si256(c, m4),
                    _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 2), m3), 4));
                __m256i q3 = _mm256_or_si256(
                    _mm256_srli_epi32(a, 4),
                    _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 4), m3), 4));
                __m256i q4 = _mm256_or_si256(_mm256_srli_epi32(c, 4),
                                             _mm256_slli_epi32(_mm256_srli_epi32(h, 6), 4));
                __m256 f1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(q1, off));
                __m256 f2 = _mm256_cvtepi32_ps(_mm256_sub_epi32(q2, off));
                __m256 f3 = _mm256_cvtepi32_ps(_mm256_sub_epi32(q3, off));
                __m256 f4 = _mm256_cvtepi32_ps(_mm256_sub_epi32(q4, off));
                acc = _mm256_fmadd_ps(_mm256_mul_ps(f1, _mm256_loadu_ps(xb + l)),
                                      _mm256_set1_ps(d * sc[is]), acc);
                acc2 = _mm256_fmadd_ps(_mm256_mul_ps(f2, _mm256_loadu_ps(xb + l + 32)),
                                       _mm256_set1_ps(d * sc[is + 2]), acc2);
                acc = _mm256_fmadd_ps(_mm256_mul_ps(f3, _mm256_loadu_ps(xb + l + 64)),
                                      _mm256_set1_ps(d * sc[is + 4]), acc);
                acc2 = _mm256_fmadd_ps(_mm256_mul_ps(f4, _mm256_loadu_ps(xb + l + 96)),
                                       _mm256_set1_ps(d * sc[is + 6]), acc2);
            }
            xb += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
    return hsum8(_mm256_add_ps(acc, acc2)) + (tail + tail2);
}

AVX2 static float q6_k_dot_i16_avx2(const uint8_t *w, int64_t nb, const x16_block *xq,
                                    const float *xs) {
    (void)xs;
    __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(0x0F);
    float tail = 0.0f;
    const __m128i m3 = _mm_set1_epi8(3);
    const __m256i off = _mm256_set1_epi16(32);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 210;
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = h2f_avx(p + 208);
        for (int n = 0; n < 2; n++) {
            const x16_block *xb = &xq[b * 8 + n * 4];
            for (int g = 0; g < 2; g++) {
                int l = 16 * g;
                __m128i a = _mm_loadu_si128((const __m128i *)(ql + l));
                __m128i c = _mm_loadu_si128((const __m128i *)(ql + l + 32));
                __m128i h = _mm_loadu_si128((const __m128i *)(qh + l));
                __m128i q1 = _mm_or_si128(_mm_and_si128(a, m4),
                                          _mm_slli_epi16(_mm_and_si128(h, m3), 4));
                __m128i q2 = _mm_or_si128(
                    _mm_and_si128(c, m4),
                    _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 2), m3), 4));
                __m128i q3 = _mm_or_si128(
                    _mm_and_si128(_mm_srli_epi16(a, 4), m4),
                    _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 4), m3), 4));
                __m128i q4 = _mm_or_si128(
                    _mm_and_si128(_mm_srli_epi16(c, 4), m4),
                    _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 6), m3), 4));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(madd16(q1, off, xb[0].q + l)),
                                      _mm256_set1_ps(d * sc[g] * xb[0].d), acc);
                acc2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(madd16(q2, off, xb[1].q + l)),
                                       _mm256_set1_ps(d * sc[g + 2] * xb[1].d), acc2);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(madd16(q3, off, xb[2].q + l)),
                                      _mm256_set1_ps(d * sc[g + 4] * xb[2].d), acc);
                acc2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(madd16(q4, off, xb[3].q + l)),
                                       _mm256_set1_ps(d * sc[g + 6] * xb[3].d), acc2);
            }
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
    return hsum8(_mm256_add_ps(acc, acc2)) + tail;
}

X8K_SIMD_FNS(q6_k, T_Q6_K)
#endif

/* x8 layout (x8.h): fp16 d[8] | int8 sc[16][8] | 8 x (nibble payload | high 2-bit plane) */

/* row r of a sub-block's payload: the nibbles, then the high 2 bits */
static void q6x_unpack(const uint8_t *p, int r, int *v) {
    nib_unpack(p, r, v);
    b2x_unpack(p + 128, r, v, 4);
}

static void q6x_pack(uint8_t *p, int r, const int *v) {
    nib_pack(p, r, v);
    b2x_pack(p + 128, r, v, 4);
}

static void q6_k_krow_unpack(const uint8_t *blk, int *q, int *sc) {
    const uint8_t *ql = blk, *qh = blk + 128;
    for (int s = 0; s < 16; s++) sc[s] = ((const int8_t *)(blk + 192))[s];
    for (int n = 0; n < 2; n++)
        for (int l = 0; l < 32; l++) {
            int *o = q + 128 * n;
            o[l] = (ql[64 * n + l] & 0xF) | ((qh[32 * n + l] >> 0) & 3) << 4;
            o[l + 32] = (ql[64 * n + l + 32] & 0xF) | ((qh[32 * n + l] >> 2) & 3) << 4;
            o[l + 64] = (ql[64 * n + l] >> 4) | ((qh[32 * n + l] >> 4) & 3) << 4;
            o[l + 96] = (ql[64 * n + l + 32] >> 4) | ((qh[32 * n + l] >> 6) & 3) << 4;
        }
}

static void q6_k_krow_pack(uint8_t *blk, const int *q, const int *sc) {
    for (int s = 0; s < 16; s++) blk[192 + s] = (uint8_t)(int8_t)sc[s];
    for (int n = 0; n < 2; n++)
        for (int l = 0; l < 32; l++) {
            const int *o = q + 128 * n;
            blk[64 * n + l] = (uint8_t)((o[l] & 0xF) | (o[l + 64] & 0xF) << 4);
            blk[64 * n + l + 32] = (uint8_t)((o[l + 32] & 0xF) | (o[l + 96] & 0xF) << 4);
            blk[128 + 32 * n + l] = (uint8_t)((o[l] >> 4) | (o[l + 32] >> 4) << 2 |
                                              (o[l + 64] >> 4) << 4 | (o[l + 96] >> 4) << 6);
        }
}

X8K_SYM_FNS(q6_k, 1680, 208, 32, q6_k_krow_unpack, q6_k_krow_pack, q6x_unpack, q6x_pack)

const qk_traits qk_q6_k = {
    .name = "q6_k", .type = T_Q6_K, .block = 256, .bytes = 210, .row_level = QK_AVX512,
    .deq = QK_PER_LEVEL(q6_k_deq_scalar, q6_k_deq_scalar, q6_k_deq_scalar),
    .dot = QK_PER_LEVEL(q6_k_dot_scalar, q6_k_dot_avx2, q6_k_dot_avx2),
    .dot_i16 = QK_PER_LEVEL(q6_k_dot_i16_scalar, q6_k_dot_i16_avx2, q6_k_dot_i16_avx2),
    .x8_group_bytes = 1680,
    .x8_half_sums = 1,
    .x8_pack = q6_k_x8_pack,
    .x8_unpack = q6_k_x8_unpack,
    .x8_deq = q6_k_x8_deq,
    .x8_group = QK_PER_LEVEL(q6_k_x8_group_scalar, q6_k_x8_group_avx2, q6_k_x8_group_vnni),
};
