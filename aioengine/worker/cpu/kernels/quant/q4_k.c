/* Q4_K: 256 values in 144 bytes, fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128
 * bytes of nibbles; sub-block s (32 values): x = d*sc[s]*q - dmin*mn[s] (blocks.h). */
#include "base.h"
#include "blocks.h"
#include "row_x86.h"
#include "traits.h"
#include "x8.h"
#include "x8_x86.h"

static void q4_k_deq_scalar(const uint8_t *w, int64_t nb, float *out) {
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 144;
        float d = h2f(p), dmin = h2f(p + 2);
        const uint8_t *sc = p + 4, *qs = p + 16;
        float *o = out + b * 256;
        for (int pr = 0; pr < 4; pr++) {
            int s1, m1, s2, m2;
            k4_scale_min(2 * pr, sc, &s1, &m1);
            k4_scale_min(2 * pr + 1, sc, &s2, &m2);
            float d1 = d * s1, o1 = dmin * m1, d2 = d * s2, o2 = dmin * m2;
            for (int l = 0; l < 32; l++) o[l] = d1 * (qs[l] & 0xF) - o1;
            for (int l = 0; l < 32; l++) o[32 + l] = d2 * (qs[l] >> 4) - o2;
            o += 64;
            qs += 32;
        }
    }
}

static float q4_k_dot_scalar(const uint8_t *w, int64_t nb, const float *x, const float *xs) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 144;
        float d = h2f(p), dmin = h2f(p + 2);
        const uint8_t *sc = p + 4, *qs = p + 16;
        const float *xb = x + b * 256;
        const float *sb = xs + b * 8;
        for (int pr = 0; pr < 4; pr++) {
            int s1, m1, s2, m2;
            k4_scale_min(2 * pr, sc, &s1, &m1);
            k4_scale_min(2 * pr + 1, sc, &s2, &m2);
            float a = 0.0f, c = 0.0f;
            for (int l = 0; l < 32; l++) {
                a += xb[l] * (qs[l] & 0xF);
                c += xb[32 + l] * (qs[l] >> 4);
            }
            acc += d * (s1 * a + s2 * c) - dmin * (m1 * sb[2 * pr] + m2 * sb[2 * pr + 1]);
            xb += 64;
            qs += 32;
        }
    }
    return acc;
}

static float q4_k_dot_i16_scalar(const uint8_t *w, int64_t nb, const x16_block *xq,
                                 const float *xs) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 144;
        float d = h2f(p), dmin = h2f(p + 2);
        const uint8_t *sc = p + 4, *qs = p + 16;
        for (int pr = 0; pr < 4; pr++) {
            int s1, m1, s2, m2;
            k4_scale_min(2 * pr, sc, &s1, &m1);
            k4_scale_min(2 * pr + 1, sc, &s2, &m2);
            const x16_block *a = &xq[b * 8 + 2 * pr], *c = a + 1;
            int32_t sa = 0, sc2 = 0;
            for (int l = 0; l < 32; l++) {
                sa += (qs[l] & 0xF) * a->q[l];
                sc2 += (qs[l] >> 4) * c->q[l];
            }
            acc += d * (s1 * a->d * sa + s2 * c->d * sc2) -
                   dmin * (m1 * xs[b * 8 + 2 * pr] + m2 * xs[b * 8 + 2 * pr + 1]);
            qs += 32;
        }
    }
    return acc;
}

#if QK_X86
AVX2 static float q4_k_dot_avx2(const uint8_t *w, int64_t nb, const float *x, const float *xs) {
    __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    float tail = 0.0f, tail2 = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 144;
        float d = h2f_avx(p), dmin = h2f_avx(p + 2);
        const uint8_t *sc = p + 4, *qs = p + 16;
        const float *xb = x + b * 256;
        const float *sb = xs + b * 8;
        __m128i m = _mm_set1_epi8(0x0F);
        for (int pr = 0; pr < 4; pr++) {
            int s1, m1, s2, m2;
            k4_scale_min(2 * pr, sc, &s1, &m1);
            k4_scale_min(2 * pr + 1, sc, &s2, &m2);
            __m128i q0 = _mm_loadu_si128((const __m128i *)qs);
            __m128i q1 = _mm_loadu_si128((const __m128i *)(qs + 16));
            __m128i l0 = _mm_and_si128(q0, m), l1 = _mm_and_si128(q1, m);
            __m128i h0 = _mm_and_si128(_mm_srli_epi16(q0, 4), m);
            __m128i h1 = _mm_and_si128(_mm_srli_epi16(q1, 4), m);
            __m256 a = _mm256_mul_ps(u8x8(l0), _mm256_loadu_ps(xb));
            a = _mm256_fmadd_ps(u8x8(_mm_srli_si128(l0, 8)), _mm256_loadu_ps(xb + 8), a);
            a = _mm256_fmadd_ps(u8x8(l1), _mm256_loadu_ps(xb + 16), a);
            a = _mm256_fmadd_ps(u8x8(_mm_srli_si128(l1, 8)), _mm256_loadu_ps(xb + 24), a);
            __m256 c = _mm256_mul_ps(u8x8(h0), _mm256_loadu_ps(xb + 32));
            c = _mm256_fmadd_ps(u8x8(_mm_srli_si128(h0, 8)), _mm256_loadu_ps(xb + 40), c);
            c = _mm256_fmadd_ps(u8x8(h1), _mm256_loadu_ps(xb + 48), c);
            c = _mm256_fmadd_ps(u8x8(_mm_srli_si128(h1, 8)), _mm256_loadu_ps(xb + 56), c);
            acc = _mm256_fmadd_ps(a, _mm256_set1_ps(d * s1), acc);
            acc2 = _mm256_fmadd_ps(c, _mm256_set1_ps(d * s2), acc2);
            tail -= dmin * (m1 * sb[2 * pr] + m2 * sb[2 * pr + 1]);
            xb += 64;
            qs += 32;
        }
    }
    return hsum8(_mm256_add_ps(acc, acc2)) + (tail + tail2);
}

AVX512 static float q4_k_dot_avx512(const uint8_t *w, int64_t nb, const float *x,
                                    const float *xs) {
    (void)xs;
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 acc = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 144;
        float d = h2f_avx(p), dmin = h2f_avx(p + 2);
        const uint8_t *sc = p + 4, *qs = p + 16;
        const float *xb = x + b * 256;
        const __m128i m = _mm_set1_epi8(0x0F);
        for (int pr = 0; pr < 4; pr++) {
            int s1, m1, s2, m2;
            k4_scale_min(2 * pr, sc, &s1, &m1);
            k4_scale_min(2 * pr + 1, sc, &s2, &m2);
            __m512 lut1 = _mm512_fmadd_ps(iota, _mm512_set1_ps(d * s1),
                                          _mm512_set1_ps(-dmin * m1));
            __m512 lut2 = _mm512_fmadd_ps(iota, _mm512_set1_ps(d * s2),
                                          _mm512_set1_ps(-dmin * m2));
            __m128i q0 = _mm_loadu_si128((const __m128i *)qs);
            __m128i q1 = _mm_loadu_si128((const __m128i *)(qs + 16));
            acc = _mm512_fmadd_ps(
                _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q0, m)), lut1),
                _mm512_loadu_ps(xb), acc);
            acc2 = _mm512_fmadd_ps(
                _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q1, m)), lut1),
                _mm512_loadu_ps(xb + 16), acc2);
            acc = _mm512_fmadd_ps(
                _mm512_permutexvar_ps(
                    _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q0, 4), m)), lut2),
                _mm512_loadu_ps(xb + 32), acc);
            acc2 = _mm512_fmadd_ps(
                _mm512_permutexvar_ps(
                    _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q1, 4), m)), lut2),
                _mm512_loadu_ps(xb + 48), acc2);
            xb += 64;
            qs += 32;
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc, acc2));
}

AVX2 static float q4_k_dot_i16_avx2(const uint8_t *w, int64_t nb, const x16_block *xq,
                                    const float *xs) {
    __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    float tail = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 144;
        float d = h2f_avx(p), dmin = h2f_avx(p + 2);
        const uint8_t *sc = p + 4, *qs = p + 16;
        for (int pr = 0; pr < 4; pr++) {
            int s1, m1, s2, m2;
            k4_scale_min(2 * pr, sc, &s1, &m1);
            k4_scale_min(2 * pr + 1, sc, &s2, &m2);
            const x16_block *a = &xq[b * 8 + 2 * pr], *c = a + 1;
            const __m256i m4w = _mm256_set1_epi16(0x0F);
            __m256i q0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)qs));
            __m256i q1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(qs + 16)));
#define MADDX(v, ptr) _mm256_madd_epi16((v), _mm256_loadu_si256((const __m256i *)(ptr)))
            __m256i sa = _mm256_add_epi32(MADDX(_mm256_and_si256(q0, m4w), a->q),
                                          MADDX(_mm256_and_si256(q1, m4w), a->q + 16));
            __m256i sb = _mm256_add_epi32(MADDX(_mm256_srli_epi16(q0, 4), c->q),
                                          MADDX(_mm256_srli_epi16(q1, 4), c->q + 16));
#undef MADDX
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), _mm256_set1_ps(d * s1 * a->d), acc);
            acc2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sb), _mm256_set1_ps(d * s2 * c->d),
                                   acc2);
            tail -= dmin * (m1 * xs[b * 8 + 2 * pr] + m2 * xs[b * 8 + 2 * pr + 1]);
            qs += 32;
        }
    }
    return hsum8(_mm256_add_ps(acc, acc2)) + tail;
}

X8K_SIMD_FNS(q4_k, T_Q4_K)
#endif

/* x8 layout (x8.h): fp16 d[8] | fp16 dmin[8] | u8 sc[8][8] | u8 mn[8][8] | 8 nibble payloads */
static void q4_k_krow_unpack(const uint8_t *blk, int *q, int *sc, int *mn) {
    for (int s = 0; s < 8; s++) k4_scale_min(s, blk + 4, &sc[s], &mn[s]);
    const uint8_t *qs = blk + 16;
    for (int pr = 0; pr < 4; pr++)
        for (int l = 0; l < 32; l++) {
            q[64 * pr + l] = qs[32 * pr + l] & 0xF;
            q[64 * pr + 32 + l] = qs[32 * pr + l] >> 4;
        }
}

static void q4_k_krow_pack(uint8_t *blk, const int *q, const int *sc, const int *mn) {
    k4_pack_scales(blk + 4, sc, mn);
    for (int pr = 0; pr < 4; pr++)
        for (int l = 0; l < 32; l++)
            blk[16 + 32 * pr + l] = (uint8_t)(q[64 * pr + l] | q[64 * pr + 32 + l] << 4);
}

X8K_MIN_FNS(q4_k, 1184, 8, 0, q4_k_krow_unpack, q4_k_krow_pack, nib_unpack, nib_pack)

const qk_traits qk_q4_k = {
    .name = "q4_k", .type = T_Q4_K, .block = 256, .bytes = 144, .row_level = QK_AVX512,
    .deq = QK_PER_LEVEL(q4_k_deq_scalar, q4_k_deq_scalar, q4_k_deq_scalar),
    .dot = QK_PER_LEVEL(q4_k_dot_scalar, q4_k_dot_avx2, q4_k_dot_avx512),
    .dot_i16 = QK_PER_LEVEL(q4_k_dot_i16_scalar, q4_k_dot_i16_avx2, q4_k_dot_i16_avx2),
    .x8_group_bytes = 1184,
    .x8_half_sums = 1,
    .x8_pack = q4_k_x8_pack,
    .x8_unpack = q4_k_x8_unpack,
    .x8_deq = q4_k_x8_deq,
    .x8_group = QK_PER_LEVEL(q4_k_x8_group_scalar, q4_k_x8_group_avx2, q4_k_x8_group_vnni),
};
