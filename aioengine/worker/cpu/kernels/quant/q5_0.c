/* Q5_0: 32 values in 22 bytes, fp16 d, u32 qh (the fifth bits), 16 bytes of nibbles;
 * x = d*(q-16). Its row-layout kernels are scalar only: the engine runs Q5_0 in the x8 layout,
 * whose AVX2 and VNNI kernels it shares with Q4_0, Q4_1 and Q8_0 (x8_x86.h). */
#include "base.h"
#include "blocks.h"
#include "traits.h"
#include "x8.h"
#include "x8_x86.h"

static void q5_0_deq_scalar(const uint8_t *w, int64_t nb, float *out) {
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 22;
        float d = h2f(p);
        int v[32];
        q5_0_vals(p, v);
        for (int j = 0; j < 32; j++) out[b * 32 + j] = d * (v[j] - 16);
    }
}

static float q5_0_dot_scalar(const uint8_t *w, int64_t nb, const float *x, const float *xs) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 22;
        const float *xb = x + b * 32;
        int v[32];
        q5_0_vals(p, v);
        float s = 0.0f;
        for (int j = 0; j < 32; j++) s += xb[j] * v[j];
        acc += h2f(p) * (s - 16.0f * xs[b]);
    }
    return acc;
}

static float q5_0_dot_i16_scalar(const uint8_t *w, int64_t nb, const x16_block *xq,
                                 const float *xs) {
    (void)xs;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 22;
        int v[32];
        q5_0_vals(p, v);
        int32_t s = 0;
        for (int j = 0; j < 32; j++) s += (v[j] - 16) * xq[b].q[j];
        acc += h2f(p) * xq[b].d * s;
    }
    return acc;
}

#if QK_X86
X8_SIMD_FNS(q5_0, T_Q5_0)
#endif

/* x8 layout: the Q5 payload after the 8 scales (x8.h) */
static void q5_0_row_pack(uint8_t *blk, const int *v) { q5_pack_vals(blk + 2, blk + 6, v); }

static void q5_0_x8_unpack_row(const uint8_t *g, int r, int *v) { q5x_unpack(g + 16, r, v); }

static void q5_0_x8_pack_row(uint8_t *g, int r, const int *v) { q5x_pack(g + 16, r, v); }

X8_32_FNS(q5_0, T_Q5_0, 176, q5_0_vals, q5_0_row_pack, q5_0_x8_unpack_row, q5_0_x8_pack_row)

const qk_traits qk_q5_0 = {
    .name = "q5_0", .type = T_Q5_0, .block = 32, .bytes = 22, .row_level = QK_SCALAR,
    .deq = QK_PER_LEVEL(q5_0_deq_scalar, q5_0_deq_scalar, q5_0_deq_scalar),
    .dot = QK_PER_LEVEL(q5_0_dot_scalar, q5_0_dot_scalar, q5_0_dot_scalar),
    .dot_i16 = QK_PER_LEVEL(q5_0_dot_i16_scalar, q5_0_dot_i16_scalar, q5_0_dot_i16_scalar),
    .x8_group_bytes = 176,
    .x8_pack = q5_0_x8_pack,
    .x8_unpack = q5_0_x8_unpack,
    .x8_deq = q5_0_x8_deq,
    .x8_group = QK_PER_LEVEL(q5_0_x8_group_scalar, q5_0_x8_group_avx2, q5_0_x8_group_vnni),
    .x8_tile2 = QK_PER_LEVEL(q5_0_x8_tile2_scalar, q5_0_x8_tile2_avx2, q5_0_x8_tile2_vnni),
};
