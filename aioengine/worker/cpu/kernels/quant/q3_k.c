/* Q3_K: 256 values in 110 bytes, 32 bytes of third bits, 64 bytes of low 2 bits, 12 bytes of
 * 16 6-bit scales, fp16 d; x = d*(sc-32)*(q-4) (blocks.h). With int16 activations the engine
 * runs it in the x8 layout, whose AVX2 and VNNI kernel it shares with the other K-quants
 * (x8_x86.h); the row layout (float32 activations, x8 off) has AVX2 kernels, the AVX-512 path
 * runs them too. */
#include "base.h"
#include "blocks.h"
#include "row_scalar.h"
#include "row_x86.h"
#include "traits.h"
#include "x8.h"
#include "x8_x86.h"

/* d*(sc-32) of each 16 values and no min, and the stored values 0..7 (K16_ROW_FNS) */
static inline __attribute__((always_inline)) void q3_k_scales(const uint8_t *p, float *a,
                                                               float *b) {
    int sc[16];
    float d = h2f(p + 108);
    q3_k_unpack_scales(p + 96, sc);
    for (int i = 0; i < 16; i++) {
        a[i] = d * sc[i];
        b[i] = 0.0f;
    }
}

static void q3_k_vals(const uint8_t *p, int *q) {
    int sc[16];
    q3_k_unpack(p, q, sc);
}

K16_ROW_FNS(q3_k, 110, 4)

#if QK_X86
AVX2 static inline __m256i q3_k_bytes32(const uint8_t *p, int s) {
    return k2_bytes32(p + 32, p, s);
}

K16_ROW_AVX2_FNS(q3_k, 110, 4)
X8K_SIMD_FNS(q3_k, T_Q3_K)
#endif

/* x8 layout (x8.h): fp16 d[8] | int8 sc[16][8] | 8 x 128-byte Q4 payloads of the 3-bit values */
X8K_SYM_FNS(q3_k, 1168, 108, 4, q3_k_unpack, q3_k_pack, nib_unpack, nib_pack)

const qk_traits qk_q3_k = {
    .name = "q3_k", .type = T_Q3_K, .block = 256, .bytes = 110, .row_level = QK_AVX512,
    .deq = QK_PER_LEVEL(q3_k_deq_scalar, q3_k_deq_avx2, q3_k_deq_avx2),
    .dot = QK_PER_LEVEL(q3_k_dot_scalar, q3_k_dot_avx2, q3_k_dot_avx2),
    .dot_i16 = QK_PER_LEVEL(q3_k_dot_i16_scalar, q3_k_dot_i16_avx2, q3_k_dot_i16_avx2),
    .x8_group_bytes = 1168,
    .x8_half_sums = 1,
    .x8_pack = q3_k_x8_pack,
    .x8_unpack = q3_k_x8_unpack,
    .x8_deq = q3_k_x8_deq,
    .x8_group = QK_PER_LEVEL(q3_k_x8_group_scalar, q3_k_x8_group_avx2, q3_k_x8_group_vnni),
};
