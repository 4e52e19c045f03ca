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

/* the high 2 bits of row r's 32 values in a 64-byte Q6_K high plane (v[32] |= hi << 4), and back */
static void hi2_unpack(const uint8_t *p, int r, int *v) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *l = p + h * 32 + r * 4;
        unsigned w0 = l[0] | (unsigned)l[1] << 8, w1 = l[2] | (unsigned)l[3] << 8;
        for (int c = 2 * h; c < 2 * h + 2; c++)
            for (int i = 0; i < 4; i++) {
                int pos = 2 * (4 * (c - 2 * h) + i);
                v[8 * c + 2 * i] |= ((w0 >> pos) & 3) << 4;
                v[8 * c + 2 * i + 1] |= ((w1 >> pos) & 3) << 4;
            }
    }
}

static void hi2_pack(uint8_t *p, int r, const int *v) {
    for (int h = 0; h < 2; h++) {
        unsigned w0 = 0, w1 = 0;
        for (int c = 2 * h; c < 2 * h + 2; c++)
            for (int i = 0; i < 4; i++) {
                int pos = 2 * (4 * (c - 2 * h) + i);
                w0 |= (unsigned)((v[8 * c + 2 * i] >> 4) & 3) << pos;
                w1 |= (unsigned)((v[8 * c + 2 * i + 1] >> 4) & 3) << pos;
            }
        uint8_t *l = p + h * 32 + r * 4;
        l[0] = w0 & 0xFF;
        l[1] = w0 >> 8;
        l[2] = w1 & 0xFF;
        l[3] = w1 >> 8;
    }
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

static void q6_k_x8k_unpack_row(const uint8_t *g, int r, int *q, int *sc) {
    for (int s = 0; s < 16; s++) sc[s] = ((const int8_t *)g)[16 + 8 * s + r];
    for (int s = 0; s < 8; s++) {
        nib_unpack(g + 144 + 192 * s, r, q + 32 * s);
        hi2_unpack(g + 144 + 192 * s + 128, r, q + 32 * s);
    }
}

static void q6_k_x8k_pack_row(uint8_t *g, int r, const int *q, const int *sc) {
    for (int s = 0; s < 16; s++) g[16 + 8 * s + r] = (uint8_t)(int8_t)sc[s];
    for (int s = 0; s < 8; s++) {
        nib_pack(g + 144 + 192 * s, r, q + 32 * s);
        hi2_pack(g + 144 + 192 * s + 128, r, q + 32 * s);
    }
}

static void q6_k_x8_pack(const uint8_t *blk, uint8_t *g, int r) {
    int q[256], sc[16];
    memcpy(g + 2 * r, blk + 208, 2);
    q6_k_krow_unpack(blk, q, sc);
    q6_k_x8k_pack_row(g, r, q, sc);
}

static void q6_k_x8_unpack(const uint8_t *g, int r, uint8_t *blk) {
    int q[256], sc[16];
    memcpy(blk + 208, g + 2 * r, 2);
    q6_k_x8k_unpack_row(g, r, q, sc);
    q6_k_krow_pack(blk, q, sc);
}

/* row r of the groups from g on, the reference's float products */
static void q6_k_x8_deq(const uint8_t *g0, int64_t nb, int r, float *out0) {
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *g = g0 + b * 1680;
        float *out = out0 + b * 256;
        int q[256], sc[16];
        q6_k_x8k_unpack_row(g, r, q, sc);
        float d = h2f(g + 2 * r);
        for (int i = 0; i < 256; i++) out[i] = d * sc[i / 16] * (q[i] - 32);
    }
}

/* scalar: 8 outputs of group gp (nb super-blocks) for one x row */
static void q6_k_x8_dot_scalar(const uint8_t *gp, int64_t nb, const x16_block *xq,
                               const float *xs, float *out) {
    (void)xs;
    int q[256], sc[16];
    for (int r = 0; r < 8; r++) out[r] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *g = gp + b * 1680;
        for (int r = 0; r < 8; r++) {
            q6_k_x8k_unpack_row(g, r, q, sc);
            float d = h2f(g + 2 * r), acc = 0.0f;
            for (int s = 0; s < 8; s++) {
                const x16_block *xb = &xq[b * 8 + s];
                int32_t s0 = 0, s1 = 0;
                for (int l = 0; l < 16; l++) {
                    s0 += (q[32 * s + l] - 32) * xb->q[l];
                    s1 += (q[32 * s + 16 + l] - 32) * xb->q[16 + l];
                }
                acc += d * xb->d * ((float)sc[2 * s] * s0 + (float)sc[2 * s + 1] * s1);
            }
            out[r] += acc;
        }
    }
}

X8K_SCALAR_GROUP(q6_k)

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
