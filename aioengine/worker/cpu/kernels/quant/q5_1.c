/* Q5_1: 32 values in 24 bytes, fp16 d, fp16 m, u32 qh (the fifth bits), 16 bytes of nibbles;
 * x = d*q + m. With int16 activations the engine runs it in the x8 layout, whose AVX2 and VNNI
 * kernels it shares with Q5_0 (the payload) and Q4_1 (the min) (x8_x86.h); the row layout
 * (float32 activations, x8 off) has AVX2 kernels, the AVX-512 path runs them too. */
#include "base.h"
#include "blocks.h"
#include "row_x86.h"
#include "traits.h"
#include "x8.h"
#include "x8_x86.h"

static void q5_1_deq_scalar(const uint8_t *w, int64_t nb, float *out) {
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 24;
        float d = h2f(p), m = h2f(p + 2);
        int v[32];
        q5_1_vals(p, v);
        for (int j = 0; j < 32; j++) out[b * 32 + j] = d * v[j] + m;
    }
}

static float q5_1_dot_scalar(const uint8_t *w, int64_t nb, const float *x, const float *xs) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 24;
        const float *xb = x + b * 32;
        int v[32];
        q5_1_vals(p, v);
        float s = 0.0f;
        for (int j = 0; j < 32; j++) s += xb[j] * v[j];
        acc += h2f(p) * s + h2f(p + 2) * xs[b];
    }
    return acc;
}

static float q5_1_dot_i16_scalar(const uint8_t *w, int64_t nb, const x16_block *xq,
                                 const float *xs) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 24;
        int v[32];
        q5_1_vals(p, v);
        int32_t s = 0;
        for (int j = 0; j < 32; j++) s += v[j] * xq[b].q[j];
        acc += h2f(p) * xq[b].d * s + h2f(p + 2) * xs[b];
    }
    return acc;
}

#if QK_X86
AVX2 static void q5_1_deq_avx2(const uint8_t *w, int64_t nb, float *out) {
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 24;
        u8x32_affine(q5_bytes32(p + 4, p + 8), _mm256_set1_ps(h2f_avx(p)),
                     _mm256_set1_ps(h2f_avx(p + 2)), out + b * 32);
    }
}

AVX2 static float q5_1_dot_avx2(const uint8_t *w, int64_t nb, const float *x, const float *xs) {
    __m256 acc = _mm256_setzero_ps();
    float tail = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 24;
        __m256 s = u8x32_dot(q5_bytes32(p + 4, p + 8), x + b * 32, _mm256_setzero_ps());
        acc = _mm256_fmadd_ps(s, _mm256_set1_ps(h2f_avx(p)), acc);
        tail += h2f_avx(p + 2) * xs[b];
    }
    return hsum8(acc) + tail;
}

AVX2 static float q5_1_dot_i16_avx2(const uint8_t *w, int64_t nb, const x16_block *xq,
                                    const float *xs) {
    __m256 acc = _mm256_setzero_ps();
    float tail = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 24;
        __m256i s = u8x32_madd16(q5_bytes32(p + 4, p + 8), xq[b].q);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(h2f_avx(p) * xq[b].d), acc);
        tail += h2f_avx(p + 2) * xs[b];
    }
    return hsum8(acc) + tail;
}

X8_SIMD_FNS(q5_1, T_Q5_1)
#endif

/* x8 layout: the Q5 payload after the 8 scales and 8 mins (x8.h) */
static void q5_1_row_pack(uint8_t *blk, const int *v) { q5_pack_vals(blk + 4, blk + 8, v); }

static void q5_1_x8_unpack_row(const uint8_t *g, int r, int *v) { q5x_unpack(g + 32, r, v); }

static void q5_1_x8_pack_row(uint8_t *g, int r, const int *v) { q5x_pack(g + 32, r, v); }

X8_32_FNS(q5_1, T_Q5_1, 192, q5_1_vals, q5_1_row_pack, q5_1_x8_unpack_row, q5_1_x8_pack_row)

const qk_traits qk_q5_1 = {
    .name = "q5_1", .type = T_Q5_1, .block = 32, .bytes = 24, .row_level = QK_AVX512,
    .deq = QK_PER_LEVEL(q5_1_deq_scalar, q5_1_deq_avx2, q5_1_deq_avx2),
    .dot = QK_PER_LEVEL(q5_1_dot_scalar, q5_1_dot_avx2, q5_1_dot_avx2),
    .dot_i16 = QK_PER_LEVEL(q5_1_dot_i16_scalar, q5_1_dot_i16_avx2, q5_1_dot_i16_avx2),
    .x8_group_bytes = 192,
    .x8_pack = q5_1_x8_pack,
    .x8_unpack = q5_1_x8_unpack,
    .x8_deq = q5_1_x8_deq,
    .x8_group = QK_PER_LEVEL(q5_1_x8_group_scalar, q5_1_x8_group_avx2, q5_1_x8_group_vnni),
    .x8_tile2 = QK_PER_LEVEL(q5_1_x8_tile2_scalar, q5_1_x8_tile2_avx2, q5_1_x8_tile2_vnni),
};
