/* Q8_0: 32 values in 34 bytes, fp16 d then int8 q[32]; x = d*q. */
#include "base.h"
#include "blocks.h"
#include "row_scalar.h"
#include "row_x86.h"
#include "traits.h"
#include "x8.h"
#include "x8_x86.h"

static void q8_0_deq_scalar(const uint8_t *w, int64_t nb, float *out) {
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 34;
        float d = h2f(p);
        const int8_t *q = (const int8_t *)(p + 2);
        for (int j = 0; j < 32; j++) out[b * 32 + j] = d * q[j];
    }
}

static float q8_0_dot_scalar(const uint8_t *w, int64_t nb, const float *x, const float *xs) {
    (void)xs;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 34;
        const int8_t *q = (const int8_t *)(p + 2);
        const float *xb = x + b * 32;
        float s = 0.0f;
        for (int j = 0; j < 32; j++) s += xb[j] * q[j];
        acc += h2f(p) * s;
    }
    return acc;
}

static float q8_0_dot_i8_scalar(const uint8_t *w, int64_t nb, const xq_block *xq) {
    return dot_i8_scalar(T_Q8_0, w, nb, xq);
}

static float q8_0_dot_i16_scalar(const uint8_t *w, int64_t nb, const x16_block *xq,
                                 const float *xs) {
    (void)xs;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const int8_t *wq = (const int8_t *)(w + b * 34 + 2);
        int32_t s = 0;
        for (int j = 0; j < 32; j++) s += wq[j] * xq[b].q[j];
        acc += h2f(w + b * 34) * xq[b].d * s;
    }
    return acc;
}

#if QK_X86
AVX2 static void q8_0_deq_avx2(const uint8_t *w, int64_t nb, float *out) {
    deq32_avx2(T_Q8_0, w, nb, out);
}

AVX2 static float q8_0_dot_avx2(const uint8_t *w, int64_t nb, const float *x, const float *xs) {
    (void)xs;
    __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    float tail = 0.0f, tail2 = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 34;
        const float *xb = x + b * 32;
        __m256 s = _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 2)))),
            _mm256_loadu_ps(xb));
        for (int j = 8; j < 32; j += 8)
            s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                    _mm_loadl_epi64((const __m128i *)(p + 2 + j)))),
                                _mm256_loadu_ps(xb + j), s);
        if (b & 1)
            acc2 = _mm256_fmadd_ps(s, _mm256_set1_ps(h2f_avx(p)), acc2);
        else
            acc = _mm256_fmadd_ps(s, _mm256_set1_ps(h2f_avx(p)), acc);
    }
    return hsum8(_mm256_add_ps(acc, acc2)) + (tail + tail2);
}

AVX512 static float q8_0_dot_avx512(const uint8_t *w, int64_t nb, const float *x,
                                    const float *xs) {
    (void)xs;
    __m512 acc = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 34;
        const float *xb = x + b * 32;
        __m512 s = _mm512_mul_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 2)))),
            _mm512_loadu_ps(xb));
        s = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 18)))),
            _mm512_loadu_ps(xb + 16), s);
        if (b & 1)
            acc2 = _mm512_fmadd_ps(s, _mm512_set1_ps(h2f_avx(p)), acc2);
        else
            acc = _mm512_fmadd_ps(s, _mm512_set1_ps(h2f_avx(p)), acc);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc, acc2));
}

AVX2 static float q8_0_dot_i8_avx2(const uint8_t *w, int64_t nb, const xq_block *xq) {
    return dot_i8_avx2(T_Q8_0, w, nb, xq);
}

/* two blocks per iteration into independent accumulators */
AVX2 static float q8_0_dot_i16_avx2(const uint8_t *w, int64_t nb, const x16_block *xq,
                                    const float *xs) {
    (void)xs;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
#define Q8BLK(bb, ACC)                                                                        \
    {                                                                                         \
        const uint8_t *p = w + (bb) * 34;                                                     \
        __m256i s = _mm256_add_epi32(                                                         \
            _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 2))), \
                              _mm256_loadu_si256((const __m256i *)xq[bb].q)),                 \
            _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 18))), \
                              _mm256_loadu_si256((const __m256i *)(xq[bb].q + 16))));         \
        ACC = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(h2f_avx(p) * xq[bb].d),   \
                              ACC);                                                           \
    }
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        Q8BLK(b, acc0)
        Q8BLK(b + 1, acc1)
    }
    if (b < nb) Q8BLK(b, acc0)
#undef Q8BLK
    return hsum8(_mm256_add_ps(acc0, acc1));
}

AVX2 static void q8_0_dot4_i16_avx2(const uint8_t *w, int64_t nb, const x16_block *xq,
                                    const float *xs, int64_t n32, float *out) {
    dot4_i16_avx2(T_Q8_0, w, nb, xq, xs, n32, out);
}

X8_SIMD_FNS(q8_0, T_Q8_0)
#endif

/* x8 layout: 8 chunks c of 32 bytes after the 8 scales, values 4c..4c+3; lane r holds row r's
 * int8 values 4c, 4c+2, 4c+1, 4c+3 */
static void q8_0_row_unpack(const uint8_t *blk, int *v) {
    for (int j = 0; j < 32; j++) v[j] = ((const int8_t *)(blk + 2))[j];
}

static void q8_0_row_pack(uint8_t *blk, const int *v) {
    for (int j = 0; j < 32; j++) blk[2 + j] = (uint8_t)v[j];
}

static void q8_0_x8_unpack_row(const uint8_t *g, int r, int *v) {
    const uint8_t *p = g + 16;
    for (int c = 0; c < 8; c++) {
        const int8_t *l = (const int8_t *)(p + c * 32 + r * 4);
        v[4 * c] = l[0];
        v[4 * c + 2] = l[1];
        v[4 * c + 1] = l[2];
        v[4 * c + 3] = l[3];
    }
}

static void q8_0_x8_pack_row(uint8_t *g, int r, const int *v) {
    uint8_t *p = g + 16;
    for (int c = 0; c < 8; c++) {
        uint8_t *l = p + c * 32 + r * 4;
        l[0] = (uint8_t)v[4 * c];
        l[1] = (uint8_t)v[4 * c + 2];
        l[2] = (uint8_t)v[4 * c + 1];
        l[3] = (uint8_t)v[4 * c + 3];
    }
}

X8_32_FNS(q8_0, T_Q8_0, 272, q8_0_row_unpack, q8_0_row_pack, q8_0_x8_unpack_row,
          q8_0_x8_pack_row)

const qk_traits qk_q8_0 = {
    .name = "q8_0", .type = T_Q8_0, .block = 32, .bytes = 34, .row_level = QK_AVX512,
    .deq = QK_PER_LEVEL(q8_0_deq_scalar, q8_0_deq_avx2, q8_0_deq_avx2),
    .dot = QK_PER_LEVEL(q8_0_dot_scalar, q8_0_dot_avx2, q8_0_dot_avx512),
    .dot_i8 = QK_PER_LEVEL(q8_0_dot_i8_scalar, q8_0_dot_i8_avx2, q8_0_dot_i8_avx2),
    .dot_i16 = QK_PER_LEVEL(q8_0_dot_i16_scalar, q8_0_dot_i16_avx2, q8_0_dot_i16_avx2),
    .dot4_i16 = QK_PER_LEVEL(NULL, q8_0_dot4_i16_avx2, q8_0_dot4_i16_avx2),
    .x8_group_bytes = 272,
    .x8_pack = q8_0_x8_pack,
    .x8_unpack = q8_0_x8_unpack,
    .x8_deq = q8_0_x8_deq,
    .x8_group = QK_PER_LEVEL(q8_0_x8_group_scalar, q8_0_x8_group_avx2, q8_0_x8_group_vnni),
    .x8_tile2 = QK_PER_LEVEL(q8_0_x8_tile2_scalar, q8_0_x8_tile2_avx2, q8_0_x8_tile2_vnni),
};
