/* Q4_1: 32 values in 20 bytes, fp16 d, fp16 m, then 16 bytes of nibbles; x = d*q + m. */
#include "base.h"
#include "blocks.h"
#include "row_scalar.h"
#include "row_x86.h"
#include "traits.h"
#include "x8.h"
#include "x8_x86.h"

static void q4_1_deq_scalar(const uint8_t *w, int64_t nb, float *out) {
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 20;
        float d = h2f(p), m = h2f(p + 2);
        for (int j = 0; j < 16; j++) {
            out[b * 32 + j] = d * (p[4 + j] & 0xF) + m;
            out[b * 32 + j + 16] = d * (p[4 + j] >> 4) + m;
        }
    }
}

static float q4_1_dot_scalar(const uint8_t *w, int64_t nb, const float *x, const float *xs) {
    return q4_dot_scalar(1, w, nb, x, xs);
}

static float q4_1_dot_i8_scalar(const uint8_t *w, int64_t nb, const xq_block *xq) {
    return dot_i8_scalar(T_Q4_1, w, nb, xq);
}

static float q4_1_dot_i16_scalar(const uint8_t *w, int64_t nb, const x16_block *xq,
                                 const float *xs) {
    return q4_dot_i16_scalar(1, w, nb, xq, xs);
}

#if QK_X86
AVX2 static void q4_1_deq_avx2(const uint8_t *w, int64_t nb, float *out) {
    deq32_avx2(T_Q4_1, w, nb, out);
}

AVX2 static float q4_1_dot_avx2(const uint8_t *w, int64_t nb, const float *x, const float *xs) {
    __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    float tail = 0.0f, tail2 = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 20;
        __m256 s = nib_dot32(p + 4, x + b * 32);
        if (b & 1) {
            acc2 = _mm256_fmadd_ps(s, _mm256_set1_ps(h2f_avx(p)), acc2);
            tail2 += h2f_avx(p + 2) * xs[b];
        } else {
            acc = _mm256_fmadd_ps(s, _mm256_set1_ps(h2f_avx(p)), acc);
            tail += h2f_avx(p + 2) * xs[b];
        }
    }
    return hsum8(_mm256_add_ps(acc, acc2)) + (tail + tail2);
}

AVX512 static float q4_1_dot_avx512(const uint8_t *w, int64_t nb, const float *x,
                                    const float *xs) {
    (void)xs;
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 acc = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        const uint8_t *p = w + b * 20;
        acc = nib_lut_dot32(_mm_loadu_si128((const __m128i *)(p + 4)),
                            _mm512_fmadd_ps(iota, _mm512_set1_ps(h2f_avx(p)),
                                            _mm512_set1_ps(h2f_avx(p + 2))),
                            x + b * 32, acc);
        acc2 = nib_lut_dot32(_mm_loadu_si128((const __m128i *)(p + 24)),
                             _mm512_fmadd_ps(iota, _mm512_set1_ps(h2f_avx(p + 20)),
                                             _mm512_set1_ps(h2f_avx(p + 22))),
                             x + b * 32 + 32, acc2);
    }
    for (; b < nb; b++) {
        const uint8_t *p = w + b * 20;
        acc = nib_lut_dot32(_mm_loadu_si128((const __m128i *)(p + 4)),
                            _mm512_fmadd_ps(iota, _mm512_set1_ps(h2f_avx(p)),
                                            _mm512_set1_ps(h2f_avx(p + 2))),
                            x + b * 32, acc);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc, acc2));
}

AVX2 static float q4_1_dot_i8_avx2(const uint8_t *w, int64_t nb, const xq_block *xq) {
    return dot_i8_avx2(T_Q4_1, w, nb, xq);
}

AVX2 static float q4_1_dot_i16_avx2(const uint8_t *w, int64_t nb, const x16_block *xq,
                                    const float *xs) {
    return q4_i16_avx2(w, nb, xq, xs, 1);
}

AVX2 static void q4_1_dot4_i16_avx2(const uint8_t *w, int64_t nb, const x16_block *xq,
                                    const float *xs, int64_t n32, float *out) {
    dot4_i16_avx2(T_Q4_1, w, nb, xq, xs, n32, out);
}

X8_SIMD_FNS(q4_1, T_Q4_1)
#endif

/* x8 layout: the Q4 nibble payload (x8.h) after the 8 scales and 8 mins */
static void q4_1_row_unpack(const uint8_t *blk, int *v) {
    const uint8_t *qs = blk + 4;
    for (int j = 0; j < 16; j++) {
        v[j] = qs[j] & 0xF;
        v[j + 16] = qs[j] >> 4;
    }
}

static void q4_1_row_pack(uint8_t *blk, const int *v) {
    uint8_t *qs = blk + 4;
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(v[j] | v[j + 16] << 4);
}

static void q4_1_x8_unpack_row(const uint8_t *g, int r, int *v) { nib_unpack(g + 32, r, v); }

static void q4_1_x8_pack_row(uint8_t *g, int r, const int *v) { nib_pack(g + 32, r, v); }

X8_32_FNS(q4_1, T_Q4_1, 160, q4_1_row_unpack, q4_1_row_pack, q4_1_x8_unpack_row, q4_1_x8_pack_row)

const qk_traits qk_q4_1 = {
    .name = "q4_1", .type = T_Q4_1, .block = 32, .bytes = 20, .row_level = QK_AVX512,
    .deq = QK_PER_LEVEL(q4_1_deq_scalar, q4_1_deq_avx2, q4_1_deq_avx2),
    .dot = QK_PER_LEVEL(q4_1_dot_scalar, q4_1_dot_avx2, q4_1_dot_avx512),
    .dot_i8 = QK_PER_LEVEL(q4_1_dot_i8_scalar, q4_1_dot_i8_avx2, q4_1_dot_i8_avx2),
    .dot_i16 = QK_PER_LEVEL(q4_1_dot_i16_scalar, q4_1_dot_i16_avx2, q4_1_dot_i16_avx2),
    .dot4_i16 = QK_PER_LEVEL(NULL, q4_1_dot4_i16_avx2, q4_1_dot4_i16_avx2),
    .x8_group_bytes = 160,
    .x8_pack = q4_1_x8_pack,
    .x8_unpack = q4_1_x8_unpack,
    .x8_deq = q4_1_x8_deq,
    .x8_group = QK_PER_LEVEL(q4_1_x8_group_scalar, q4_1_x8_group_avx2, q4_1_x8_group_vnni),
    .x8_tile2 = QK_PER_LEVEL(q4_1_x8_tile2_scalar, q4_1_x8_tile2_avx2, q4_1_x8_tile2_vnni),
};
