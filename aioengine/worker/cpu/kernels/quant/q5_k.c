/* Q5_K: 256 values in 176 bytes, fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins (Q4_K's),
 * 32 bytes of fifth bits, 128 bytes of nibbles; sub-block s: x = d*sc[s]*q - dmin*mn[s]
 * (blocks.h). With int16 activations the engine runs it in the x8 layout, whose AVX2 and VNNI
 * kernels it shares with Q4_K and Q6_K (x8_x86.h); the row layout (float32 activations, x8 off)
 * has AVX2 kernels, the AVX-512 path runs them too. */
#include "base.h"
#include "blocks.h"
#include "row_x86.h"
#include "traits.h"
#include "x8.h"
#include "x8_x86.h"

static void q5_k_deq_scalar(const uint8_t *w, int64_t nb, float *out) {
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 176;
        float d = h2f(p), dmin = h2f(p + 2);
        int q[256], sc[8], mn[8];
        q5_k_unpack(p, q, sc, mn);
        for (int s = 0; s < 8; s++) {
            /* the reference's float products, so the values are exactly gguf's */
            float ds = d * sc[s], ms = dmin * mn[s];
            for (int l = 0; l < 32; l++) out[b * 256 + 32 * s + l] = ds * q[32 * s + l] - ms;
        }
    }
}

static float q5_k_dot_scalar(const uint8_t *w, int64_t nb, const float *x, const float *xs) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 176;
        float d = h2f(p), dmin = h2f(p + 2);
        int q[256], sc[8], mn[8];
        q5_k_unpack(p, q, sc, mn);
        for (int s = 0; s < 8; s++) {
            const float *xb = x + b * 256 + 32 * s;
            float a = 0.0f;
            for (int l = 0; l < 32; l++) a += xb[l] * q[32 * s + l];
            acc += d * sc[s] * a - dmin * mn[s] * xs[b * 8 + s];
        }
    }
    return acc;
}

static float q5_k_dot_i16_scalar(const uint8_t *w, int64_t nb, const x16_block *xq,
                                 const float *xs) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 176;
        float d = h2f(p), dmin = h2f(p + 2);
        int q[256], sc[8], mn[8];
        q5_k_unpack(p, q, sc, mn);
        for (int s = 0; s < 8; s++) {
            const x16_block *xb = &xq[b * 8 + s];
            int32_t si = 0;
            for (int l = 0; l < 32; l++) si += q[32 * s + l] * xb->q[l];
            acc += d * sc[s] * xb->d * (float)si - dmin * mn[s] * xs[b * 8 + s];
        }
    }
    return acc;
}

#if QK_X86
AVX2 static void q5_k_deq_avx2(const uint8_t *w, int64_t nb, float *out) {
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 176;
        float d = h2f_avx(p), dmin = h2f_avx(p + 2);
        for (int s = 0; s < 8; s++) {
            int sc, mn;
            k4_scale_min(s, p + 4, &sc, &mn);
            u8x32_affine(q5_k_bytes32(p, s), _mm256_set1_ps(d * sc), _mm256_set1_ps(-(dmin * mn)),
                         out + b * 256 + 32 * s);
        }
    }
}

AVX2 static float q5_k_dot_avx2(const uint8_t *w, int64_t nb, const float *x, const float *xs) {
    __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    float tail = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 176;
        float d = h2f_avx(p), dmin = h2f_avx(p + 2);
        for (int s = 0; s < 8; s += 2) {
            int s1, m1, s2, m2;
            k4_scale_min(s, p + 4, &s1, &m1);
            k4_scale_min(s + 1, p + 4, &s2, &m2);
            const float *xb = x + b * 256 + 32 * s;
            __m256 a = u8x32_dot(q5_k_bytes32(p, s), xb, _mm256_setzero_ps());
            __m256 c = u8x32_dot(q5_k_bytes32(p, s + 1), xb + 32, _mm256_setzero_ps());
            acc = _mm256_fmadd_ps(a, _mm256_set1_ps(d * s1), acc);
            acc2 = _mm256_fmadd_ps(c, _mm256_set1_ps(d * s2), acc2);
            tail -= dmin * (m1 * xs[b * 8 + s] + m2 * xs[b * 8 + s + 1]);
        }
    }
    return hsum8(_mm256_add_ps(acc, acc2)) + tail;
}

AVX2 static float q5_k_dot_i16_avx2(const uint8_t *w, int64_t nb, const x16_block *xq,
                                    const float *xs) {
    __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    float tail = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 176;
        float d = h2f_avx(p), dmin = h2f_avx(p + 2);
        for (int s = 0; s < 8; s += 2) {
            int s1, m1, s2, m2;
            k4_scale_min(s, p + 4, &s1, &m1);
            k4_scale_min(s + 1, p + 4, &s2, &m2);
            const x16_block *a = &xq[b * 8 + s], *c = a + 1;
            __m256i sa = u8x32_madd16(q5_k_bytes32(p, s), a->q);
            __m256i sc = u8x32_madd16(q5_k_bytes32(p, s + 1), c->q);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), _mm256_set1_ps(d * s1 * a->d), acc);
            acc2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sc), _mm256_set1_ps(d * s2 * c->d), acc2);
            tail -= dmin * (m1 * xs[b * 8 + s] + m2 * xs[b * 8 + s + 1]);
        }
    }
    return hsum8(_mm256_add_ps(acc, acc2)) + tail;
}

X8K_SIMD_FNS(q5_k, T_Q5_K)
#endif

/* x8 layout (x8.h): fp16 d[8] | fp16 dmin[8] | u8 sc[8][8] | u8 mn[8][8] | 8 Q5 payloads */
X8K_MIN_FNS(q5_k, 1440, 8, 0, q5_k_unpack, q5_k_pack, q5x_unpack, q5x_pack)

const qk_traits qk_q5_k = {
    .name = "q5_k", .type = T_Q5_K, .block = 256, .bytes = 176, .row_level = QK_AVX512,
    .deq = QK_PER_LEVEL(q5_k_deq_scalar, q5_k_deq_avx2, q5_k_deq_avx2),
    .dot = QK_PER_LEVEL(q5_k_dot_scalar, q5_k_dot_avx2, q5_k_dot_avx2),
    .dot_i16 = QK_PER_LEVEL(q5_k_dot_i16_scalar, q5_k_dot_i16_avx2, q5_k_dot_i16_avx2),
    .x8_group_bytes = 1440,
    .x8_pack = q5_k_x8_pack,
    .x8_unpack = q5_k_x8_unpack,
    .x8_deq = q5_k_x8_deq,
    .x8_group = QK_PER_LEVEL(q5_k_x8_group_scalar, q5_k_x8_group_avx2, q5_k_x8_group_vnni),
};
