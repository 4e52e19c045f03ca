/* Q5_1: 32 values in 24 bytes, fp16 d, fp16 m, u32 qh (the fifth bits), 16 bytes of nibbles;
 * x = d*q + m. Its row-layout kernels are scalar only: the engine runs Q5_1 in the x8 layout,
 * whose AVX2 and VNNI kernels it shares with Q5_0 (the payload) and Q4_1 (the min) (x8_x86.h). */
#include "base.h"
#include "blocks.h"
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
X8_SIMD_FNS(q5_1, T_Q5_1)
#endif

/* x8 layout: the Q5 payload after the 8 scales and 8 mins (x8.h) */
static void q5_1_row_pack(uint8_t *blk, const int *v) { q5_pack_vals(blk + 4, blk + 8, v); }

static void q5_1_x8_unpack_row(const uint8_t *g, int r, int *v) { q5x_unpack(g + 32, r, v); }

static void q5_1_x8_pack_row(uint8_t *g, int r, const int *v) { q5x_pack(g + 32, r, v); }

X8_32_FNS(q5_1, T_Q5_1, 192, q5_1_vals, q5_1_row_pack, q5_1_x8_unpack_row, q5_1_x8_pack_row)

const qk_traits qk_q5_1 = {
    .name = "q5_1", .type = T_Q5_1, .block = 32, .bytes = 24, .row_level = QK_SCALAR,
    .deq = QK_PER_LEVEL(q5_1_deq_scalar, q5_1_deq_scalar, q5_1_deq_scalar),
    .dot = QK_PER_LEVEL(q5_1_dot_scalar, q5_1_dot_scalar, q5_1_dot_scalar),
    .dot_i16 = QK_PER_LEVEL(q5_1_dot_i16_scalar, q5_1_dot_i16_scalar, q5_1_dot_i16_scalar),
    .x8_group_bytes = 192,
    .x8_pack = q5_1_x8_pack,
    .x8_unpack = q5_1_x8_unpack,
    .x8_deq = q5_1_x8_deq,
    .x8_group = QK_PER_LEVEL(q5_1_x8_group_scalar, q5_1_x8_group_avx2, q5_1_x8_group_vnni),
    .x8_tile2 = QK_PER_LEVEL(q5_1_x8_tile2_scalar, q5_1_x8_tile2_avx2, q5_1_x8_tile2_vnni),
};
