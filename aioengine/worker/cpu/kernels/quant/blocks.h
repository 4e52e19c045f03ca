/* The GGUF block formats the kernels compute, by ggml type id (gguf.GGMLQuantizationType), and
 * the small decoders more than one type's code shares.
 *
 *   y[M, N] = x[M, K] @ W^T      x, y float32 row-major; W = N rows of K values, each row the
 *                                GGUF blocks of that row exactly as a .gguf file stores them.
 *
 * Byte layouts as in ggml / the gguf Python package:
 *   Q8_0 (32 values, 34 bytes): fp16 d, int8 q[32];                  x = d*q
 *   Q4_0 (32 values, 18 bytes): fp16 d, u8 qs[16] (nibbles);         x = d*(q-8)
 *   Q4_1 (32 values, 20 bytes): fp16 d, fp16 m, u8 qs[16];           x = d*q + m
 *       value j < 16 is the low nibble of qs[j], value j+16 its high nibble.
 *   Q5_0 (32 values, 22 bytes): fp16 d, u32 qh (bit j: the fifth bit of value j), u8 qs[16];
 *       x = d*(q-16)
 *   Q5_1 (32 values, 24 bytes): fp16 d, fp16 m, u32 qh, u8 qs[16] (as Q5_0's); x = d*q + m
 *   Q4_K (256 values, 144 bytes): fp16 d, fp16 dmin, u8 scales[12] (8 6-bit scales and 8
 *       6-bit mins), u8 qs[128]; sub-block s (32 values): x = d*sc[s]*q - dmin*mn[s]; the 64
 *       values of pair p = low then high nibbles of qs[32p .. 32p+32].
 *   Q5_K (256 values, 176 bytes): fp16 d, fp16 dmin, u8 scales[12] (as Q4_K's), u8 qh[32],
 *       u8 qs[128] (as Q4_K's); value l of sub-block s takes bit s of qh[l] as its fifth bit.
 *   Q2_K (256 values, 84 bytes): u8 scales[16] (low nibble the 4-bit scale, high nibble the
 *       4-bit min of 16 values), u8 qs[64], fp16 d, fp16 dmin; x = d*sc*q - dmin*mn, q 0..3.
 *   Q3_K (256 values, 110 bytes): u8 hmask[32], u8 qs[64], u8 scales[12] (16 6-bit scales
 *       stored +32), fp16 d; x = d*(sc-32)*(q-4), q 0..7 = two low bits | hmask bit << 2.
 *       Both: value l of 32-value sub-block s takes bits 2(s%4) of qs[32(s/4) + l] as its low
 *       two bits (Q3_K: bit s of hmask[l] as its third), and scale l/16 + 2s.
 *   Q6_K (256 values, 210 bytes): u8 ql[128] (low 4 bits), u8 qh[64] (high 2 bits),
 *       int8 scales[16] (one per 16 values), fp16 d; x = d*sc*(q-32).
 *
 * Each type's kernels live in a file of its own (q8_0.c, ...) and are reached through its row
 * of the traits table (traits.h). */
#ifndef QK_BLOCKS_H
#define QK_BLOCKS_H

#include <stdint.h>
#include <string.h>

#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q2_K 10
#define T_Q3_K 11
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14

/* the 32-value types whose blocks carry an fp16 min after d (x = d*q + m) */
#define X8_HAS_MIN(T) ((T) == T_Q4_1 || (T) == T_Q5_1)

/* Q4_K's 6-bit scale and min of sub-block j from the 12 packed bytes q */
static inline void k4_scale_min(int j, const uint8_t *q, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q4_K's and Q5_K's 12 packed bytes q from the 8 6-bit scales and mins */
static inline void k4_pack_scales(uint8_t *q, const int *sc, const int *mn) {
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        q[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        q[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | (mn[j + 4] & 0xF) << 4);
    }
}

/* the 32 stored values (0..31) of a Q5_0 / Q5_1 block from its u32 qh and 16 bytes qs: low
 * nibbles of qs, bit j of qh on top of value j; and back */
static inline void q5_vals(const uint8_t *qh4, const uint8_t *qs, int *v) {
    uint32_t qh = (uint32_t)qh4[0] | (uint32_t)qh4[1] << 8 | (uint32_t)qh4[2] << 16 |
                  (uint32_t)qh4[3] << 24;
    for (int j = 0; j < 16; j++) {
        v[j] = (qs[j] & 0xF) | (int)((qh >> j) & 1) << 4;
        v[j + 16] = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
    }
}

static inline void q5_pack_vals(uint8_t *qh4, uint8_t *qs, const int *v) {
    uint32_t qh = 0;
    for (int j = 0; j < 32; j++) qh |= (uint32_t)(v[j] >> 4) << j;
    for (int i = 0; i < 4; i++) qh4[i] = (uint8_t)(qh >> (8 * i));
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((v[j] & 0xF) | (v[j + 16] & 0xF) << 4);
}

static inline void q5_0_vals(const uint8_t *p, int *v) { q5_vals(p + 2, p + 6, v); }
static inline void q5_1_vals(const uint8_t *p, int *v) { q5_vals(p + 4, p + 8, v); }

/* a Q5_K super-block's 256 stored values (0..31) in order, and its scales and mins; and back */
static inline void q5_k_unpack(const uint8_t *blk, int *q, int *sc, int *mn) {
    const uint8_t *qh = blk + 16, *qs = blk + 48;
    for (int s = 0; s < 8; s++) {
        k4_scale_min(s, blk + 4, &sc[s], &mn[s]);
        const uint8_t *l4 = qs + 32 * (s / 2);
        for (int l = 0; l < 32; l++)
            q[32 * s + l] = ((s & 1 ? l4[l] >> 4 : l4[l] & 0xF)) | ((qh[l] >> s) & 1) << 4;
    }
}

static inline void q5_k_pack(uint8_t *blk, const int *q, const int *sc, const int *mn) {
    k4_pack_scales(blk + 4, sc, mn);
    uint8_t *qh = blk + 16, *qs = blk + 48;
    for (int l = 0; l < 32; l++) {
        int h = 0;
        for (int s = 0; s < 8; s++) h |= (q[32 * s + l] >> 4) << s;
        qh[l] = (uint8_t)h;
    }
    for (int pr = 0; pr < 4; pr++)
        for (int l = 0; l < 32; l++)
            qs[32 * pr + l] = (uint8_t)((q[64 * pr + l] & 0xF) | (q[64 * pr + 32 + l] & 0xF) << 4);
}

/* the low two bits of a Q2_K / Q3_K super-block's 256 values from its 64 bytes qs; and back
 * (q[i] |= ...: the caller zeroes q; pack takes bits 0-1 of q) */
static inline void k2_lows(const uint8_t *qs, int *q) {
    for (int s = 0; s < 8; s++)
        for (int l = 0; l < 32; l++) q[32 * s + l] = (qs[32 * (s / 4) + l] >> (2 * (s % 4))) & 3;
}

static inline void k2_pack_lows(uint8_t *qs, const int *q) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            int b = 0;
            for (int j = 0; j < 4; j++) b |= (q[128 * h + 32 * j + l] & 3) << (2 * j);
            qs[32 * h + l] = (uint8_t)b;
        }
}

/* a Q2_K super-block's 256 values (0..3), 16 scales and 16 mins; and back */
static inline void q2_k_unpack(const uint8_t *blk, int *q, int *sc, int *mn) {
    for (int i = 0; i < 16; i++) {
        sc[i] = blk[i] & 0xF;
        mn[i] = blk[i] >> 4;
    }
    k2_lows(blk + 16, q);
}

static inline void q2_k_pack(uint8_t *blk, const int *q, const int *sc, const int *mn) {
    for (int i = 0; i < 16; i++) blk[i] = (uint8_t)(sc[i] | mn[i] << 4);
    k2_pack_lows(blk + 16, q);
}

/* a Q3_K super-block's 16 scales less 32 (-32..31) from its 12 packed bytes s: scale i's low 4
 * bits are the low (i < 8) or high nibble of byte i%8, its high 2 bits bits 2(i/4) of byte
 * 8 + i%4; four 32-bit words at a time (ggml's own decode: per-scale branches and shifts were
 * most of the AVX2 row kernels' time) */
static inline void q3_k_unpack_scales(const uint8_t *s, int *sc) {
    uint32_t w[4], t;
    memcpy(w, s, 12);
    t = w[2];
    w[2] = ((w[0] >> 4) & 0x0F0F0F0F) | (((t >> 4) & 0x03030303) << 4);
    w[3] = ((w[1] >> 4) & 0x0F0F0F0F) | (((t >> 6) & 0x03030303) << 4);
    w[0] = (w[0] & 0x0F0F0F0F) | ((t & 0x03030303) << 4);
    w[1] = (w[1] & 0x0F0F0F0F) | (((t >> 2) & 0x03030303) << 4);
    const uint8_t *u = (const uint8_t *)w;
    for (int i = 0; i < 16; i++) sc[i] = u[i] - 32;
}

/* a Q3_K super-block's 256 stored values (0..7) and its 16 scales less 32; and back */
static inline void q3_k_unpack(const uint8_t *blk, int *q, int *sc) {
    const uint8_t *hm = blk;
    k2_lows(blk + 32, q);
    for (int v = 0; v < 256; v++) q[v] |= ((hm[v % 32] >> (v / 32)) & 1) << 2;
    q3_k_unpack_scales(blk + 96, sc);
}

static inline void q3_k_pack(uint8_t *blk, const int *q, const int *sc) {
    uint8_t *hm = blk, *s = blk + 96;
    k2_pack_lows(blk + 32, q);
    for (int l = 0; l < 32; l++) {
        int h = 0;
        for (int j = 0; j < 8; j++) h |= (q[32 * j + l] >> 2 & 1) << j;
        hm[l] = (uint8_t)h;
    }
    for (int i = 0; i < 12; i++) s[i] = 0;
    for (int i = 0; i < 16; i++) {
        int u = sc[i] + 32;
        s[i % 8] |= (uint8_t)((u & 0xF) << (i < 8 ? 0 : 4));
        s[8 + i % 4] |= (uint8_t)((u >> 4) << (2 * (i / 4)));
    }
}

#endif
