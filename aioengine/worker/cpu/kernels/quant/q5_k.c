/* Q5_K: 256 values in 176 bytes, fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins (Q4_K's),
 * 32 bytes of fifth bits, 128 bytes of nibbles; sub-block s: x = d*sc[s]*q - dmin*mn[s]
 * (blocks.h). Its row-layout kernels are scalar only: the engine runs Q5_K in the x8 layout,
 * whose AVX2 and VNNI kernels it shares with Q4_K and Q6_K (x8_x86.h). */
#include "base.h"
#include "blocks.h"
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
X8K_SIMD_FNS(q5_k, T_Q5_K)
#endif

/* x8 layout (x8.h): fp16 d[8] | fp16 dmin[8] | u8 sc[8][8] | u8 mn[8][8] | 8 Q5 payloads */
X8K_MIN_FNS(q5_k, 1440, q5_k_unpack, q5_k_pack, q5x_unpack, q5x_pack)

const qk_traits qk_q5_k = {
    .name = "q5_k", .type = T_Q5_K, .block = 256, .bytes = 176, .row_level = QK_SCALAR,
    .deq = QK_PER_LEVEL(q5_k_deq_scalar, q5_k_deq_scalar, q5_k_deq_scalar),
    .dot = QK_PER_LEVEL(q5_k_dot_scalar, q5_k_dot_scalar, q5_k_dot_scalar),
    .dot_i16 = QK_PER_LEVEL(q5_k_dot_i16_scalar, q5_k_dot_i16_scalar, q5_k_dot_i16_scalar),
    .x8_group_bytes = 1440,
    .x8_pack = q5_k_x8_pack,
    .x8_unpack = q5_k_x8_unpack,
    .x8_deq = q5_k_x8_deq,
    .x8_group = QK_PER_LEVEL(q5_k_x8_group_scalar, q5_k_x8_group_avx2, q5_k_x8_group_vnni),
};
