/* Q2_K: 256 values in 84 bytes, 16 bytes of 4-bit scales and mins (one pair per 16 values), 64
 * bytes of 2-bit values, fp16 d, fp16 dmin; x = d*sc*q - dmin*mn (blocks.h). With int16
 * activations the engine runs it in the x8 layout, whose AVX2 and VNNI kernel it shares with
 * the other K-quants (x8_x86.h); the row layout (float32 activations, x8 off) has AVX2 kernels,
 * the AVX-512 path runs them too. */
#include "base.h"
#include "blocks.h"
#include "row_scalar.h"
#include "row_x86.h"
#include "traits.h"
#include "x8.h"
#include "x8_x86.h"

/* d*sc and dmin*mn of each 16 values, and the stored values (K16_ROW_FNS) */
static inline __attribute__((always_inline)) void q2_k_scales(const uint8_t *p, float *a,
                                                               float *b) {
    float d = h2f(p + 80), dmin = h2f(p + 82);
    for (int i = 0; i < 16; i++) {
        a[i] = d * (p[i] & 0xF);
        b[i] = dmin * (p[i] >> 4);
    }
}

static void q2_k_vals(const uint8_t *p, int *q) { k2_lows(p + 16, q); }

K16_ROW_FNS(q2_k, 84, 0)

#if QK_X86
AVX2 static inline __m256i q2_k_bytes32(const uint8_t *p, int s) {
    return k2_bytes32(p + 16, NULL, s);
}

K16_ROW_AVX2_FNS(q2_k, 84, 0)
X8K_SIMD_FNS(q2_k, T_Q2_K)
#endif

/* row r of a sub-block's x8 payload: the 2-bit plane alone */
static void q2x_unpack(const uint8_t *p, int r, int *v) {
    for (int i = 0; i < 32; i++) v[i] = 0;
    b2x_unpack(p, r, v, 0);
}

static void q2x_pack(uint8_t *p, int r, const int *v) { b2x_pack(p, r, v, 0); }

/* x8 layout (x8.h): fp16 d[8] | fp16 dmin[8] | u8 sc[16][8] | u8 mn[16][8] | 8 x 2-bit planes */
X8K_MIN_FNS(q2_k, 800, 16, 80, q2_k_unpack, q2_k_pack, q2x_unpack, q2x_pack)

const qk_traits qk_q2_k = {
    .name = "q2_k", .type = T_Q2_K, .block = 256, .bytes = 84, .row_level = QK_AVX512,
    .deq = QK_PER_LEVEL(q2_k_deq_scalar, q2_k_deq_avx2, q2_k_deq_avx2),
    .dot = QK_PER_LEVEL(q2_k_dot_scalar, q2_k_dot_avx2, q2_k_dot_avx2),
    .dot_i16 = QK_PER_LEVEL(q2_k_dot_i16_scalar, q2_k_dot_i16_avx2, q2_k_dot_i16_avx2),
    .x8_group_bytes = 800,
    .x8_half_sums = 1,
    .x8_pack = q2_k_x8_pack,
    .x8_unpack = q2_k_x8_unpack,
    .x8_deq = q2_k_x8_deq,
    .x8_group = QK_PER_LEVEL(q2_k_x8_group_scalar, q2_k_x8_group_avx2, q2_k_x8_group_vnni),
};
