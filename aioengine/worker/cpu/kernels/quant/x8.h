#ifndef QK_X8_H
#define QK_X8_H

/* The interleaved "x8" layout, made once at load by qk_repack_x8 (gemm_x8.c): 8 weight rows'
 * blocks side by side, so one AVX2 pass computes 8 outputs, one per 32-bit lane, with no
 * horizontal sums and the 8 rows' scales loaded as one vector. Rows are grouped by 8 (the last
 * group padded with zero rows); group g, block b is GB bytes at (g * nb + b) * GB:
 *   fp16 d[8] | Q4_1 and Q5_1 only: fp16 m[8] | payload
 *   Q4 payload (128 bytes): 4 chunks c of 32 bytes, values 8c..8c+7 of the block; lane r (bytes
 *     4r..4r+3) is row r: its two 16-bit words hold values 8c+2i (word 0) and 8c+2i+1 (word 1)
 *     in nibble i (bits 4i..4i+3). A shift by 4i and a mask give 8 rows x 2 int16 values,
 *     multiplied (pmaddwd) by the broadcast activation pair x[8c+2i], x[8c+2i+1].
 *   Q8_0 payload (256 bytes): 8 chunks c of 32 bytes, values 4c..4c+3; lane r holds row r's
 *     int8 values 4c, 4c+2, 4c+1, 4c+3: the low bytes of its words (sign-extended) are the pair
 *     4c, 4c+1 and the high bytes the pair 4c+2, 4c+3.
 *   Q5_0 payload (160 bytes, the file's 22 bytes a row kept): 5 chunks c of 32 bytes; lane r's
 *     word 0 holds values 6c, 6c+2, 6c+4 and word 1 values 6c+1, 6c+3, 6c+5 (bits 5i..5i+4,
 *     stored 0..31); bit 15 of word 0 / word 1 in chunk c is bit c of value 30 / 31. Three shifts
 *     and masks give 8 rows x 3 pairs, the spare bits of the 5 chunks the pair 30, 31.
 *   Q5_1 payload: Q5_0's (192 bytes with the 8 mins, the file's 24 bytes a row kept).
 * Activations: int16 per 32 values (x16_block) as the row-layout int16 path, with integer sums
 * of the int16 activations per block for Q4_0's offset (sum (q-8)x = sum qx - 8 sum x) and the
 * exact float sums for Q4_1's and Q5_1's min. */

/* K-quants in the x8 layout (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): per 8 rows and 256-value super-block, a header
 * then 8 sub-blocks of 32 values whose 4-bit parts use the Q4 nibble arrangement above (Q5_K:
 * the Q5 payload).
 *   Q4_K (1184 bytes, the file's 8 x 144 plus 32): fp16 d[8] | fp16 dmin[8] | u8 sc[8 sub][8 rows]
 *     | u8 mn[8 sub][8 rows] (the 6-bit scales and mins unpacked) | 8 x 128-byte nibble payloads.
 *     x = (d*sc[s]) q - (dmin*mn[s]): the reference's float products, exact.
 *   Q5_K (1440 bytes, the file's 8 x 176 plus 32): Q4_K's header | 8 x 160-byte Q5 payloads.
 *   Q6_K (1680 bytes = 8 x 210): fp16 d[8] | int8 sc[16][8 rows] | 8 x (128-byte payload of the
 *     low 4 bits | 64 bytes of high 2 bits: vector h covers chunks 2h, 2h+1; lane r's word 0 holds
 *     values 8c+2i at bits 2(4(c-2h)+i), word 1 values 8c+2i+1). x = (d*sc) (q - 32), one scale
 *     per 16 values: chunks 0-1 and 2-3 of a sub-block are summed apart.
 *   Q3_K (1168 bytes, the file's 8 x 110 plus 288): Q6_K's header (the scales less 32) | 8 x
 *     128-byte Q4 payloads of the 3-bit values 0..7, x = (d*sc) (q - 4): the third bit widened
 *     to a nibble, so Q3_K shares Q4_K's unpacking (a 3-bit payload would need its own).
 *   Q2_K (800 bytes, the file's 8 x 84 plus 128): fp16 d[8] | fp16 dmin[8] | u8 sc[16][8] |
 *     u8 mn[16][8] | 8 x 64-byte planes of the 2-bit values (Q6_K's high-bit arrangement);
 *     x = (d*sc) q - (dmin*mn), a scale and min per 16 values.
 * The header keeps every bit of the file's scales: unpacking gives the file's rows byte for byte. */

#include <string.h>

#include "act_quant.h"
#include "base.h"
#include "blocks.h"

/* the nibbles 0..15 of row r in a 128-byte Q4 x8 payload p (v[32]), and back */
static inline void nib_unpack(const uint8_t *p, int r, int *v) {
    for (int c = 0; c < 4; c++) {
        const uint8_t *l = p + c * 32 + r * 4;
        unsigned w0 = l[0] | (unsigned)l[1] << 8, w1 = l[2] | (unsigned)l[3] << 8;
        for (int i = 0; i < 4; i++) {
            v[8 * c + 2 * i] = (w0 >> (4 * i)) & 0xF;
            v[8 * c + 2 * i + 1] = (w1 >> (4 * i)) & 0xF;
        }
    }
}

static inline void nib_pack(uint8_t *p, int r, const int *v) {
    for (int c = 0; c < 4; c++) {
        unsigned w0 = 0, w1 = 0;
        for (int i = 0; i < 4; i++) {
            w0 |= (unsigned)(v[8 * c + 2 * i] & 0xF) << (4 * i);
            w1 |= (unsigned)(v[8 * c + 2 * i + 1] & 0xF) << (4 * i);
        }
        uint8_t *l = p + c * 32 + r * 4;
        l[0] = w0 & 0xFF;
        l[1] = w0 >> 8;
        l[2] = w1 & 0xFF;
        l[3] = w1 >> 8;
    }
}


/* the 5-bit values 0..31 of row r in a 160-byte Q5 x8 payload p (v[32]), and back */
static inline void q5x_unpack(const uint8_t *p, int r, int *v) {
    int v30 = 0, v31 = 0;
    for (int c = 0; c < 5; c++) {
        const uint8_t *l = p + c * 32 + r * 4;
        unsigned w0 = l[0] | (unsigned)l[1] << 8, w1 = l[2] | (unsigned)l[3] << 8;
        for (int i = 0; i < 3; i++) {
            v[6 * c + 2 * i] = (w0 >> (5 * i)) & 0x1F;
            v[6 * c + 2 * i + 1] = (w1 >> (5 * i)) & 0x1F;
        }
        v30 |= (int)(w0 >> 15) << c;
        v31 |= (int)(w1 >> 15) << c;
    }
    v[30] = v30;
    v[31] = v31;
}

static inline void q5x_pack(uint8_t *p, int r, const int *v) {
    for (int c = 0; c < 5; c++) {
        unsigned w0 = (unsigned)((v[30] >> c) & 1) << 15, w1 = (unsigned)((v[31] >> c) & 1) << 15;
        for (int i = 0; i < 3; i++) {
            w0 |= (unsigned)v[6 * c + 2 * i] << (5 * i);
            w1 |= (unsigned)v[6 * c + 2 * i + 1] << (5 * i);
        }
        uint8_t *l = p + c * 32 + r * 4;
        l[0] = w0 & 0xFF;
        l[1] = w0 >> 8;
        l[2] = w1 & 0xFF;
        l[3] = w1 >> 8;
    }
}

/* The traits entries of a 32-value type from its four decoders of 32 stored integers:
 * ROW_UNPACK(blk, v) / ROW_PACK(blk, v) for a file block, X8_UNPACK(g, r, v) / X8_PACK(g, r, v)
 * for row r of an x8 group block. GB: bytes of a group block. The fp16 scale (Q4_1, Q5_1: and min)
 * of row r sits at g + 2r (g + 16 + 2r); Q4_0 and Q5_0 store values offset by 8 and 16. */
#define X8_32_FNS(PREFIX, T, GB, ROW_UNPACK, ROW_PACK, X8_UNPACK, X8_PACK)                     \
    static void PREFIX##_x8_pack(const uint8_t *blk, uint8_t *g, int r) {                     \
        int v[32];                                                                            \
        memcpy(g + 2 * r, blk, 2);                                                            \
        if (X8_HAS_MIN(T)) memcpy(g + 16 + 2 * r, blk + 2, 2);                                \
        ROW_UNPACK(blk, v);                                                                   \
        X8_PACK(g, r, v);                                                                     \
    }                                                                                         \
    static void PREFIX##_x8_unpack(const uint8_t *g, int r, uint8_t *blk) {                   \
        int v[32];                                                                            \
        memcpy(blk, g + 2 * r, 2);                                                            \
        if (X8_HAS_MIN(T)) memcpy(blk + 2, g + 16 + 2 * r, 2);                                \
        X8_UNPACK(g, r, v);                                                                   \
        ROW_PACK(blk, v);                                                                     \
    }                                                                                         \
    static void PREFIX##_x8_deq(const uint8_t *g, int64_t nb, int r, float *out) {            \
        for (int64_t b = 0; b < nb; b++) {                                                    \
            const uint8_t *p = g + b * GB;                                                    \
            float *o = out + b * 32;                                                          \
            int v[32];                                                                        \
            float d = h2f(p + 2 * r), mn = X8_HAS_MIN(T) ? h2f(p + 16 + 2 * r) : 0.0f;       \
            float off = T == T_Q4_0 ? 8.0f : T == T_Q5_0 ? 16.0f : 0.0f;                      \
            X8_UNPACK(p, r, v);                                                               \
            for (int i = 0; i < 32; i++) o[i] = d * ((float)v[i] - off) + mn;                 \
        }                                                                                     \
    }                                                                                         \
    /* scalar: 8 outputs of group gp for one x row (out[8]) */                                \
    static void PREFIX##_x8_dot_scalar(const uint8_t *gp, int64_t nb, const x16_block *xq,    \
                                       const float *xs, const int32_t *xi, float *out) {      \
        int v[32];                                                                            \
        for (int r = 0; r < 8; r++) out[r] = 0.0f;                                            \
        for (int64_t b = 0; b < nb; b++) {                                                    \
            const uint8_t *p = gp + b * GB;                                                   \
            for (int r = 0; r < 8; r++) {                                                     \
                X8_UNPACK(p, r, v);                                                           \
                int32_t s = 0;                                                                \
                for (int j = 0; j < 32; j++) s += v[j] * xq[b].q[j];                          \
                if (T == T_Q4_0) s -= 8 * xi[b];                                              \
                if (T == T_Q5_0) s -= 16 * xi[b];                                             \
                out[r] += h2f(p + 2 * r) * xq[b].d * (float)s;                                \
                if (X8_HAS_MIN(T)) out[r] += h2f(p + 16 + 2 * r) * xs[b];                    \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    static void PREFIX##_x8_group_scalar(const uint8_t *gp, int64_t nb, const x16_block *xq,  \
                                         const float *xs, const int32_t *xi,                 \
                                         const int32_t *xh, int64_t n32, int mr,             \
                                         float *out) {                                        \
        (void)xh;                                                                             \
        for (int i = 0; i < mr; i++)                                                          \
            PREFIX##_x8_dot_scalar(gp, nb, xq + i * n32, xs + i * n32, xi + i * n32,          \
                                   out + 8 * i);                                              \
    }                                                                                         \
    static void PREFIX##_x8_tile2_scalar(const uint8_t *gp, int64_t nb, const x16_block *xq,  \
                                         const float *xs, const int32_t *xi,                 \
                                         const int32_t *xh, int64_t n32, int mr,             \
                                         float *out) {                                        \
        (void)xh;                                                                             \
        const int64_t gsz = nb * GB;                                                          \
        for (int i = 0; i < mr; i++)                                                          \
            for (int e = 0; e < 2; e++)                                                       \
                PREFIX##_x8_dot_scalar(gp + e * gsz, nb, xq + i * n32, xs + i * n32,          \
                                       xi + i * n32, out + 16 * i + 8 * e);                   \
    }

/* a K-quant's scalar x8_group entry from its PREFIX##_x8_dot_scalar (one x row) */
#define X8K_SCALAR_GROUP(PREFIX)                                                              \
    static void PREFIX##_x8_group_scalar(const uint8_t *gp, int64_t nb, const x16_block *xq,  \
                                         const float *xs, const int32_t *xi,                 \
                                         const int32_t *xh, int64_t n32, int mr,             \
                                         float *out) {                                        \
        (void)xi;                                                                             \
        (void)xh;                                                                             \
        for (int i = 0; i < mr; i++)                                                          \
            PREFIX##_x8_dot_scalar(gp, nb, xq + i * n32, xs + i * n32, out + 8 * i);          \
    }

/* The x8 entries of a K-quant with scales and mins (Q4_K, Q5_K: 8 of 6 bits; Q2_K: NS = 16 of 4
 * bits): fp16 d[8] | fp16 dmin[8] | u8 sc[NS][8] | u8 mn[NS][8] | 8 payloads of 32 values.
 * ROW_UNPACK(blk, q, sc, mn) / ROW_PACK for a file block (fp16 d, dmin at DOFF), PAY_UNPACK(p, r,
 * v) / PAY_PACK for row r of a sub-block's payload. GB: bytes of a group block. */
#define X8K_MIN_FNS(PREFIX, GB, NS, DOFF, ROW_UNPACK, ROW_PACK, PAY_UNPACK, PAY_PACK)                  \
    static void PREFIX##_x8k_unpack_row(const uint8_t *g, int r, int *q, int *sc, int *mn) {  \
        for (int i = 0; i < NS; i++) {                                                        \
            sc[i] = g[32 + 8 * i + r];                                                        \
            mn[i] = g[32 + 8 * NS + 8 * i + r];                                               \
        }                                                                                     \
        for (int s = 0; s < 8; s++)                                                           \
            PAY_UNPACK(g + 32 + 16 * NS + (GB - 32 - 16 * NS) / 8 * s, r, q + 32 * s);        \
    }                                                                                         \
    static void PREFIX##_x8_pack(const uint8_t *blk, uint8_t *g, int r) {                     \
        int q[256], sc[NS], mn[NS];                                                           \
        memcpy(g + 2 * r, blk + DOFF, 2);                                      \
        memcpy(g + 16 + 2 * r, blk + DOFF + 2, 2);                                 \
        ROW_UNPACK(blk, q, sc, mn);                                                           \
        for (int i = 0; i < NS; i++) {                                                        \
            g[32 + 8 * i + r] = (uint8_t)sc[i];                                               \
            g[32 + 8 * NS + 8 * i + r] = (uint8_t)mn[i];                                      \
        }                                                                                     \
        for (int s = 0; s < 8; s++)                                                           \
            PAY_PACK(g + 32 + 16 * NS + (GB - 32 - 16 * NS) / 8 * s, r, q + 32 * s);          \
    }                                                                                         \
    static void PREFIX##_x8_unpack(const uint8_t *g, int r, uint8_t *blk) {                   \
        int q[256], sc[NS], mn[NS];                                                           \
        memcpy(blk + DOFF, g + 2 * r, 2);                                      \
        memcpy(blk + DOFF + 2, g + 16 + 2 * r, 2);                                 \
        PREFIX##_x8k_unpack_row(g, r, q, sc, mn);                                             \
        ROW_PACK(blk, q, sc, mn);                                                             \
    }                                                                                         \
    /* row r of the groups from g on, the reference's float products */                       \
    static void PREFIX##_x8_deq(const uint8_t *g0, int64_t nb, int r, float *out0) {          \
        for (int64_t b = 0; b < nb; b++) {                                                    \
            const uint8_t *g = g0 + b * GB;                                                   \
            float *out = out0 + b * 256;                                                      \
            int q[256], sc[NS], mn[NS];                                                       \
            PREFIX##_x8k_unpack_row(g, r, q, sc, mn);                                         \
            float d = h2f(g + 2 * r), dmin = h2f(g + 16 + 2 * r);                             \
            for (int i = 0; i < NS; i++) {                                                    \
                float ds = d * sc[i], ms = dmin * mn[i];                                      \
                for (int l = 0; l < 256 / NS; l++)                                            \
                    out[256 / NS * i + l] = ds * q[256 / NS * i + l] - ms;                    \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    /* scalar: 8 outputs of group gp (nb super-blocks) for one x row; the mins take the exact  \
     * float sums per 32 values, or (NS 16) the int16 ones per 16 as the SIMD kernel does */  \
    static void PREFIX##_x8_dot_scalar(const uint8_t *gp, int64_t nb, const x16_block *xq,    \
                                       const float *xs, float *out) {                         \
        int q[256], sc[NS], mn[NS];                                                           \
        const int n = 256 / NS;                                                               \
        for (int r = 0; r < 8; r++) out[r] = 0.0f;                                            \
        for (int64_t b = 0; b < nb; b++) {                                                    \
            const uint8_t *g = gp + b * GB;                                                   \
            for (int r = 0; r < 8; r++) {                                                     \
                PREFIX##_x8k_unpack_row(g, r, q, sc, mn);                                     \
                float d = h2f(g + 2 * r), dmin = h2f(g + 16 + 2 * r), acc = 0.0f;            \
                for (int i = 0; i < NS; i++) {                                                \
                    const x16_block *xb = &xq[b * 8 + n * i / 32];                            \
                    const int16_t *xv = xb->q + n * i % 32;                                   \
                    int32_t si = 0, sx = 0;                                                   \
                    for (int l = 0; l < n; l++) {                                             \
                        si += q[n * i + l] * xv[l];                                           \
                        sx += xv[l];                                                          \
                    }                                                                         \
                    float xm = NS == 8 ? xs[b * 8 + i] : xb->d * (float)sx;                   \
                    acc += d * sc[i] * xb->d * (float)si - dmin * mn[i] * xm;                 \
                }                                                                             \
                out[r] += acc;                                                                \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    X8K_SCALAR_GROUP(PREFIX)

/* row r's 2-bit values in a 64-byte x8 plane p (Q6_K's high bits, Q2_K's values): v[32] |=
 * bits << SH; and back from bits SH..SH+1 of v. Vector h covers chunks 2h, 2h+1 as the Q4 payload
 * does; lane r's word 0 holds values 8c+2i at bits 2(4(c-2h)+i), word 1 values 8c+2i+1. */
static inline void b2x_unpack(const uint8_t *p, int r, int *v, int sh) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *l = p + h * 32 + r * 4;
        unsigned w0 = l[0] | (unsigned)l[1] << 8, w1 = l[2] | (unsigned)l[3] << 8;
        for (int c = 2 * h; c < 2 * h + 2; c++)
            for (int i = 0; i < 4; i++) {
                int pos = 2 * (4 * (c - 2 * h) + i);
                v[8 * c + 2 * i] |= ((w0 >> pos) & 3) << sh;
                v[8 * c + 2 * i + 1] |= ((w1 >> pos) & 3) << sh;
            }
    }
}

static inline void b2x_pack(uint8_t *p, int r, const int *v, int sh) {
    for (int h = 0; h < 2; h++) {
        unsigned w0 = 0, w1 = 0;
        for (int c = 2 * h; c < 2 * h + 2; c++)
            for (int i = 0; i < 4; i++) {
                int pos = 2 * (4 * (c - 2 * h) + i);
                w0 |= (unsigned)((v[8 * c + 2 * i] >> sh) & 3) << pos;
                w1 |= (unsigned)((v[8 * c + 2 * i + 1] >> sh) & 3) << pos;
            }
        uint8_t *l = p + h * 32 + r * 4;
        l[0] = w0 & 0xFF;
        l[1] = w0 >> 8;
        l[2] = w1 & 0xFF;
        l[3] = w1 >> 8;
    }
}

/* The x8 entries of a K-quant with a signed scale per 16 values and no min (Q6_K, Q3_K):
 * fp16 d[8] | int8 sc[16][8] | 8 payloads of 32 values, x = d*sc*(q - OFF). ROW_UNPACK(blk, q,
 * sc) / ROW_PACK for a file block (fp16 d at DOFF), PAY_UNPACK(p, r, v) / PAY_PACK for row r of
 * a sub-block's payload. GB: bytes of a group block. */
#define X8K_SYM_FNS(PREFIX, GB, DOFF, OFF, ROW_UNPACK, ROW_PACK, PAY_UNPACK, PAY_PACK)           \
    static void PREFIX##_x8k_unpack_row(const uint8_t *g, int r, int *q, int *sc) {           \
        for (int s = 0; s < 16; s++) sc[s] = ((const int8_t *)g)[16 + 8 * s + r];             \
        for (int s = 0; s < 8; s++) PAY_UNPACK(g + 144 + (GB - 144) / 8 * s, r, q + 32 * s);  \
    }                                                                                         \
    static void PREFIX##_x8_pack(const uint8_t *blk, uint8_t *g, int r) {                     \
        int q[256], sc[16];                                                                   \
        memcpy(g + 2 * r, blk + DOFF, 2);                                                     \
        ROW_UNPACK(blk, q, sc);                                                               \
        for (int s = 0; s < 16; s++) g[16 + 8 * s + r] = (uint8_t)(int8_t)sc[s];              \
        for (int s = 0; s < 8; s++) PAY_PACK(g + 144 + (GB - 144) / 8 * s, r, q + 32 * s);    \
    }                                                                                         \
    static void PREFIX##_x8_unpack(const uint8_t *g, int r, uint8_t *blk) {                   \
        int q[256], sc[16];                                                                   \
        memcpy(blk + DOFF, g + 2 * r, 2);                                                     \
        PREFIX##_x8k_unpack_row(g, r, q, sc);                                                 \
        ROW_PACK(blk, q, sc);                                                                 \
    }                                                                                         \
    /* row r of the groups from g on, the reference's float products */                       \
    static void PREFIX##_x8_deq(const uint8_t *g0, int64_t nb, int r, float *out0) {          \
        for (int64_t b = 0; b < nb; b++) {                                                    \
            const uint8_t *g = g0 + b * GB;                                                   \
            float *out = out0 + b * 256;                                                      \
            int q[256], sc[16];                                                               \
            PREFIX##_x8k_unpack_row(g, r, q, sc);                                             \
            float d = h2f(g + 2 * r);                                                         \
            for (int i = 0; i < 256; i++) out[i] = d * sc[i / 16] * (q[i] - OFF);             \
        }                                                                                     \
    }                                                                                         \
    /* scalar: 8 outputs of group gp (nb super-blocks) for one x row */                       \
    static void PREFIX##_x8_dot_scalar(const uint8_t *gp, int64_t nb, const x16_block *xq,    \
                                       const float *xs, float *out) {                         \
        (void)xs;                                                                             \
        int q[256], sc[16];                                                                   \
        for (int r = 0; r < 8; r++) out[r] = 0.0f;                                            \
        for (int64_t b = 0; b < nb; b++) {                                                    \
            const uint8_t *g = gp + b * GB;                                                   \
            for (int r = 0; r < 8; r++) {                                                     \
                PREFIX##_x8k_unpack_row(g, r, q, sc);                                         \
                float d = h2f(g + 2 * r), acc = 0.0f;                                         \
                for (int s = 0; s < 8; s++) {                                                 \
                    const x16_block *xb = &xq[b * 8 + s];                                     \
                    int32_t s0 = 0, s1 = 0;                                                   \
                    for (int l = 0; l < 16; l++) {                                            \
                        s0 += (q[32 * s + l] - OFF) * xb->q[l];                               \
                        s1 += (q[32 * s + 16 + l] - OFF) * xb->q[16 + l];                     \
                    }                                                                         \
                    acc += d * xb->d * ((float)sc[2 * s] * s0 + (float)sc[2 * s + 1] * s1);   \
                }                                                                             \
                out[r] += acc;                                                                \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    X8K_SCALAR_GROUP(PREFIX)

#endif
