/* The x8 layout's SIMD kernels, written once for the types that share a payload scheme and
 * instantiated by each type's file with its id (X8_SIMD_FNS, X8K_SIMD_FNS): the branches on the
 * type fold away, and each (type, x rows) instance is a straight-line loop with its constants.
 * Layouts in x8.h. */
#ifndef QK_X8_X86_H
#define QK_X8_X86_H

#include "act_quant.h"
#include "base.h"
#include "blocks.h"

#if QK_X86
AVX2 static inline __m256i bcast_pair(const int16_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Software prefetch of the weight stream X8_PF bytes ahead (-D to experiment; 0: none). A
 * batch-1 GEMV reads its weights from memory more slowly than a plain read loop does: the
 * hardware prefetcher alone keeps too few lines in flight for one core (figures in
 * docs/quantization.md). The layout is one sequential stream (groups, then blocks, back to
 * back), so the lines X8_PF bytes past the current block are the ones needed next. */
#ifndef X8_PF
#define X8_PF 2048
#endif
#define X8_PREFETCH(p, lo, hi)                                                                \
    do {                                                                                     \
        if (X8_PF)                                                                           \
            for (int l_ = (lo); l_ < (hi); l_ += 64)                                         \
                _mm_prefetch((const char *)(p) + X8_PF + l_, _MM_HINT_T0);                  \
    } while (0)

/* 8 outputs of group gp for MR x rows (x row i: xq + i*n32 etc.), out[i*8 + r] */
/* NA independent integer accumulators per x row (the sums of a block are otherwise one long
 * dependency chain: vpdpwssd's latency made the VNNI kernel slower than AVX2's before) */
#define X8_KERNEL(NAME, TARGET, MADD_ACC, SPARE, NA1, NA3)                                   \
    TARGET static inline __attribute__((always_inline)) void NAME(                          \
        const int t, const uint8_t *gp, int64_t nb, const x16_block *xq, const float *xs,   \
        const int32_t *xi, int64_t n32, const int MR, float *out) {                         \
        const int gb = t == T_Q4_0 ? 144 : t == T_Q4_1 ? 160 : t == T_Q5_0 ? 176          \
                     : t == T_Q5_1 ? 192 : 272;                                              \
        const int po = X8_HAS_MIN(t) ? 32 : 16;                                              \
        const int NA = MR == 1 ? NA1 : MR == 2 ? (NA1 > 2 ? 2 : NA1) : NA3;                  \
        const __m256i m4 = _mm256_set1_epi16(0x0F);                                          \
        __m256 acc[4], accm[4];                                                              \
        for (int i = 0; i < 4; i++) acc[i] = accm[i] = _mm256_setzero_ps();                  \
        for (int64_t b = 0; b < nb; b++) {                                                   \
            const uint8_t *p = gp + b * gb, *q = p + po;                                     \
            X8_PREFETCH(p, 0, gb);                                                           \
            __m256i s[4][4];                                                                 \
            for (int i = 0; i < MR; i++)                                                     \
                for (int a = 0; a < NA; a++) s[i][a] = _mm256_setzero_si256();               \
            if (t == T_Q5_0 || t == T_Q5_1) {                                                \
                const __m256i m5 = _mm256_set1_epi16(0x1F);                                  \
                __m256i hb = _mm256_setzero_si256();                                         \
                for (int c = 0; c < 5; c++) {                                                \
                    __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * c));           \
                    __m256i u[3] = {_mm256_and_si256(v, m5),                                 \
                                    _mm256_and_si256(_mm256_srli_epi16(v, 5), m5),           \
                                    _mm256_and_si256(_mm256_srli_epi16(v, 10), m5)};         \
                    hb = SPARE(hb, v, c);                                                    \
                    for (int h = 0; h < 3; h++)                                              \
                        for (int i = 0; i < MR; i++) {                                       \
                            int a = (3 * c + h) % NA;                                        \
                            s[i][a] = MADD_ACC(s[i][a], u[h],                                \
                                               bcast_pair(xq[i * n32 + b].q + 6 * c + 2 * h)); \
                        }                                                                    \
                }                                                                            \
                for (int i = 0; i < MR; i++)                                                 \
                    s[i][15 % NA] = MADD_ACC(s[i][15 % NA], hb,                              \
                                             bcast_pair(xq[i * n32 + b].q + 30));            \
            } else if (t == T_Q8_0) {                                                        \
                for (int c = 0; c < 8; c++) {                                                \
                    __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * c));           \
                    __m256i u[2] = {_mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8),           \
                                    _mm256_srai_epi16(v, 8)};                                \
                    for (int h = 0; h < 2; h++)                                              \
                        for (int i = 0; i < MR; i++) {                                       \
                            int a = (2 * c + h) % NA;                                        \
                            s[i][a] = MADD_ACC(s[i][a], u[h],                                \
                                               bcast_pair(xq[i * n32 + b].q + 4 * c + 2 * h)); \
                        }                                                                    \
                }                                                                            \
            } else {                                                                         \
                for (int c = 0; c < 4; c++) {                                                \
                    __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * c));           \
                    __m256i u[4] = {_mm256_and_si256(v, m4),                                 \
                                    _mm256_and_si256(_mm256_srli_epi16(v, 4), m4),           \
                                    _mm256_and_si256(_mm256_srli_epi16(v, 8), m4),           \
                                    _mm256_srli_epi16(v, 12)};                               \
                    for (int h = 0; h < 4; h++)                                              \
                        for (int i = 0; i < MR; i++) {                                       \
                            int a = (4 * c + h) % NA;                                        \
                            s[i][a] = MADD_ACC(s[i][a], u[h],                                \
                                               bcast_pair(xq[i * n32 + b].q + 8 * c + 2 * h)); \
                        }                                                                    \
                }                                                                            \
            }                                                                                \
            __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));               \
            __m256 m8 = X8_HAS_MIN(t) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16))) \
                                    : d8;                                                    \
            for (int i = 0; i < MR; i++) {                                                   \
                __m256i si = s[i][0];                                                        \
                for (int a = 1; a < NA; a++) si = _mm256_add_epi32(si, s[i][a]);             \
                if (t == T_Q4_0 || t == T_Q5_0)                                              \
                    si = _mm256_sub_epi32(si, _mm256_set1_epi32((t == T_Q5_0 ? 16 : 8) *      \
                                                                xi[i * n32 + b]));           \
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si),                             \
                                         _mm256_mul_ps(d8, _mm256_set1_ps(xq[i * n32 + b].d)), \
                                         acc[i]);                                            \
                if (X8_HAS_MIN(t))                                                           \
                    accm[i] = _mm256_fmadd_ps(m8, _mm256_set1_ps(xs[i * n32 + b]), accm[i]); \
            }                                                                                \
        }                                                                                    \
        for (int i = 0; i < MR; i++)                                                         \
            _mm256_storeu_ps(out + 8 * i, _mm256_add_ps(acc[i], accm[i]));                   \
    }

#ifndef X8_NA_AVX2 /* accumulators per x row at MR 1 (-D to experiment) */
#define X8_NA_AVX2 2
#endif
#ifndef X8_NA_VNNI
#define X8_NA_VNNI 4
#endif
#define MADD_AVX2(s, a, b) _mm256_add_epi32((s), _mm256_madd_epi16((a), (b)))
/* Q5_0's spare bit 15 of chunk c's words into bit c of hb (values 30, 31) */
#define SPARE_AVX2(hb, v, c) _mm256_or_si256((hb), _mm256_slli_epi16(_mm256_srli_epi16((v), 15), (c)))
X8_KERNEL(x8_kernel_avx2, AVX2, MADD_AVX2, SPARE_AVX2, X8_NA_AVX2, 1)
#define MADD_VNNI(s, a, b) _mm256_dpwssd_epi32((s), (a), (b))
/* the same in two instructions: hb | (v >> (15 - c) & (1 << c)) as one ternary-logic op */
#define SPARE_VNNI(hb, v, c)                                                                  \
    _mm256_ternarylogic_epi32((hb), _mm256_srli_epi16((v), 15 - (c)), _mm256_set1_epi16(1 << (c)), 0xF8)
X8_KERNEL(x8_kernel_vnni, VNNI, MADD_VNNI, SPARE_VNNI, X8_NA_VNNI, 2)


/* Two x8 groups (16 weight rows) x MR x rows (M > 1: batched decode, prefill): every unpacked
 * weight vector feeds MR x rows and every broadcast activation pair two groups, so a chunk's
 * unpacking is shared by 2*MR integer dot products, and the 2*MR accumulators are independent
 * chains (vpdpwssd's latency hides behind them). The sums and the float steps per block are
 * the one-group kernel's (integer sums are exact in any order; the float updates run in the
 * same order), so the outputs are bit-identical to x8_kernel_* on each group. Both groups'
 * streams are prefetched X8_PF ahead, as the one-group kernel's.
 * out[i*16 + r]: x row i, weight row r of the pair (0..7 group 0, 8..15 group 1). */
#define X8_TILE2(NAME, TARGET, MADD_ACC)                                                     \
    TARGET static inline __attribute__((always_inline)) void NAME(                          \
        const int t, const uint8_t *gp, int64_t nb, const x16_block *xq, const float *xs,   \
        const int32_t *xi, int64_t n32, const int MR, float *out) {                         \
        const int gb = t == T_Q4_0 ? 144 : t == T_Q4_1 ? 160 : t == T_Q5_0 ? 176          \
                     : t == T_Q5_1 ? 192 : 272;                                              \
        const int po = X8_HAS_MIN(t) ? 32 : 16;                                              \
        const int64_t gs = nb * gb; /* the second group */                                   \
        const __m256i m4 = _mm256_set1_epi16(0x0F);                                          \
        __m256 acc[4][2], accm[4][2];                                                        \
        for (int i = 0; i < 4; i++)                                                          \
            for (int e = 0; e < 2; e++) acc[i][e] = accm[i][e] = _mm256_setzero_ps();        \
        for (int64_t b = 0; b < nb; b++) {                                                   \
            const uint8_t *p0 = gp + b * gb, *p1 = p0 + gs;                                  \
            const uint8_t *q0 = p0 + po, *q1 = p1 + po;                                      \
            X8_PREFETCH(p0, 0, gb);                                                          \
            X8_PREFETCH(p1, 0, gb);                                                          \
            __m256i s[4][2];                                                                 \
            for (int i = 0; i < MR; i++) s[i][0] = s[i][1] = _mm256_setzero_si256();          \
            const int16_t *xb[4];                                                            \
            for (int i = 0; i < MR; i++) xb[i] = xq[i * n32 + b].q;                          \
            if (t == T_Q5_0 || t == T_Q5_1) {                                                \
                const __m256i m5 = _mm256_set1_epi16(0x1F);                                  \
                __m256i hb0 = _mm256_setzero_si256(), hb1 = _mm256_setzero_si256();          \
                for (int c = 0; c < 5; c++) {                                                \
                    __m256i v0 = _mm256_loadu_si256((const __m256i *)(q0 + 32 * c));         \
                    __m256i v1 = _mm256_loadu_si256((const __m256i *)(q1 + 32 * c));         \
                    hb0 = _mm256_or_si256(hb0, _mm256_slli_epi16(_mm256_srli_epi16(v0, 15), c)); \
                    hb1 = _mm256_or_si256(hb1, _mm256_slli_epi16(_mm256_srli_epi16(v1, 15), c)); \
                    for (int h = 0; h < 3; h++) {                                            \
                        __m256i u0 = _mm256_and_si256(h ? _mm256_srli_epi16(v0, 5 * h) : v0, m5); \
                        __m256i u1 = _mm256_and_si256(h ? _mm256_srli_epi16(v1, 5 * h) : v1, m5); \
                        for (int i = 0; i < MR; i++) {                                       \
                            __m256i xp = bcast_pair(xb[i] + 6 * c + 2 * h);                  \
                            s[i][0] = MADD_ACC(s[i][0], u0, xp);                             \
                            s[i][1] = MADD_ACC(s[i][1], u1, xp);                             \
                        }                                                                    \
                    }                                                                        \
                }                                                                            \
                for (int i = 0; i < MR; i++) {                                               \
                    __m256i xp = bcast_pair(xb[i] + 30);                                     \
                    s[i][0] = MADD_ACC(s[i][0], hb0, xp);                                    \
                    s[i][1] = MADD_ACC(s[i][1], hb1, xp);                                    \
                }                                                                            \
            } else if (t == T_Q8_0) {                                                        \
                for (int c = 0; c < 8; c++) {                                                \
                    __m256i v0 = _mm256_loadu_si256((const __m256i *)(q0 + 32 * c));         \
                    __m256i v1 = _mm256_loadu_si256((const __m256i *)(q1 + 32 * c));         \
                    for (int h = 0; h < 2; h++) {                                            \
                        __m256i u0 = h ? _mm256_srai_epi16(v0, 8)                            \
                                       : _mm256_srai_epi16(_mm256_slli_epi16(v0, 8), 8);     \
                        __m256i u1 = h ? _mm256_srai_epi16(v1, 8)                            \
                                       : _mm256_srai_epi16(_mm256_slli_epi16(v1, 8), 8);     \
                        for (int i = 0; i < MR; i++) {                                       \
                            __m256i xp = bcast_pair(xb[i] + 4 * c + 2 * h);                  \
                            s[i][0] = MADD_ACC(s[i][0], u0, xp);                             \
                            s[i][1] = MADD_ACC(s[i][1], u1, xp);                             \
                        }                                                                    \
                    }                                                                        \
                }                                                                            \
            } else {                                                                         \
                for (int c = 0; c < 4; c++) {                                                \
                    __m256i v0 = _mm256_loadu_si256((const __m256i *)(q0 + 32 * c));         \
                    __m256i v1 = _mm256_loadu_si256((const __m256i *)(q1 + 32 * c));         \
                    for (int h = 0; h < 4; h++) {                                            \
                        __m256i u0 = h == 3 ? _mm256_srli_epi16(v0, 12)                      \
                                   : _mm256_and_si256(h ? _mm256_srli_epi16(v0, 4 * h) : v0, m4); \
                        __m256i u1 = h == 3 ? _mm256_srli_epi16(v1, 12)                      \
                                   : _mm256_and_si256(h ? _mm256_srli_epi16(v1, 4 * h) : v1, m4); \
                        for (int i = 0; i < MR; i++) {                                       \
                            __m256i xp = bcast_pair(xb[i] + 8 * c + 2 * h);                  \
                            s[i][0] = MADD_ACC(s[i][0], u0, xp);                             \
                            s[i][1] = MADD_ACC(s[i][1], u1, xp);                             \
                        }                                                                    \
                    }                                                                        \
                }                                                                            \
            }                                                                                \
            __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p0));              \
            __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p1));              \
            for (int i = 0; i < MR; i++) {                                                   \
                __m256 xd = _mm256_set1_ps(xq[i * n32 + b].d);                               \
                __m256i s0 = s[i][0], s1 = s[i][1];                                          \
                if (t == T_Q4_0 || t == T_Q5_0) {                                            \
                    __m256i o = _mm256_set1_epi32((t == T_Q5_0 ? 16 : 8) * xi[i * n32 + b]); \
                    s0 = _mm256_sub_epi32(s0, o);                                            \
                    s1 = _mm256_sub_epi32(s1, o);                                            \
                }                                                                            \
                acc[i][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_mul_ps(d0, xd),  \
                                            acc[i][0]);                                      \
                acc[i][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_mul_ps(d1, xd),  \
                                            acc[i][1]);                                      \
                if (X8_HAS_MIN(t)) {                                                         \
                    __m256 xsb = _mm256_set1_ps(xs[i * n32 + b]);                            \
                    accm[i][0] = _mm256_fmadd_ps(                                            \
                        _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p0 + 16))), xsb,   \
                        accm[i][0]);                                                         \
                    accm[i][1] = _mm256_fmadd_ps(                                            \
                        _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p1 + 16))), xsb,   \
                        accm[i][1]);                                                         \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        for (int i = 0; i < MR; i++) {                                                       \
            _mm256_storeu_ps(out + 16 * i, _mm256_add_ps(acc[i][0], accm[i][0]));            \
            _mm256_storeu_ps(out + 16 * i + 8, _mm256_add_ps(acc[i][1], accm[i][1]));        \
        }                                                                                    \
    }

X8_TILE2(x8t2_kernel_avx2, AVX2, MADD_AVX2)
X8_TILE2(x8t2_kernel_vnni, VNNI, MADD_VNNI)


/* K-quants: 8 outputs of group gp (nb super-blocks) for MR x rows, out[i*8 + r]. NA integer
 * accumulators per x row and scale group at MR 1 (Q6_K, Q3_K, Q2_K: a scale per 16 values, the
 * two halves of a sub-block summed apart). Q5_K's sub-blocks are Q5_0's payload (SPARE as
 * X8_KERNEL's), its scales and mins Q4_K's; Q3_K is Q6_K without the high plane and offset 4;
 * Q2_K's values are Q6_K's high plane alone, its mins taken with the int16 sums per half. */
#define X8K_KERNEL(NAME, TARGET, MADD_ACC, SPARE, NA1)                                        \
    TARGET static inline __attribute__((always_inline)) void NAME(                          \
        const int t, const uint8_t *gp, int64_t nb, const x16_block *xq, const float *xs,   \
        const int32_t *xi, const int32_t *xh, int64_t n32, const int MR, float *out) {      \
        const int q6 = t == T_Q6_K, q5 = t == T_Q5_K, q3 = t == T_Q3_K, q2 = t == T_Q2_K;    \
        const int s16 = q6 || q3 || q2, off = q6 ? 32 : q3 ? 4 : 0;                          \
        const int gb = q6 ? 1680 : q5 ? 1440 : q3 ? 1168 : q2 ? 800 : 1184;                  \
        const int NA = MR == 1 ? NA1 : 1;                                                    \
        const __m256i m4 = _mm256_set1_epi16(0x0F), m30 = _mm256_set1_epi16(0x30);          \
        const __m256i m3 = _mm256_set1_epi16(3);                                             \
        __m256 acc[4], accm[4];                                                              \
        for (int i = 0; i < 4; i++) acc[i] = accm[i] = _mm256_setzero_ps();                  \
        for (int64_t b = 0; b < nb; b++) {                                                   \
            const uint8_t *p = gp + b * gb;                                                  \
            const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));         \
            const __m256 dm8 = q6 || q3 ? d8 : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16))); \
            for (int sb = 0; sb < 8; sb++) {                                                 \
                const uint8_t *q = p + (q6 ? 144 + 192 * sb : q5 ? 160 + 160 * sb : q3 ? 144 + 128 * sb \
                                        : q2 ? 288 + 64 * sb : 160 + 128 * sb);             \
                const int64_t xb = b * 8 + sb;                                               \
                X8_PREFETCH(p, sb * gb / 8 / 64 * 64, (sb + 1) * gb / 8);                    \
                __m256i s[4][2][4];                                                          \
                for (int i = 0; i < MR; i++)                                                 \
                    for (int hf = 0; hf < 2; hf++)                                           \
                        for (int a = 0; a < NA; a++) s[i][hf][a] = _mm256_setzero_si256();   \
                if (q5) {                                                                    \
                    const __m256i m5 = _mm256_set1_epi16(0x1F);                              \
                    __m256i hb = _mm256_setzero_si256();                                     \
                    for (int c = 0; c < 5; c++) {                                            \
                        __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * c));       \
                        hb = SPARE(hb, v, c);                                                \
                        for (int h = 0; h < 3; h++) {                                        \
                            __m256i u = _mm256_and_si256(h ? _mm256_srli_epi16(v, 5 * h) : v, m5); \
                            const int a = (3 * c + h) % NA;                                  \
                            for (int i = 0; i < MR; i++)                                     \
                                s[i][0][a] = MADD_ACC(s[i][0][a], u,                         \
                                                      bcast_pair(xq[i * n32 + xb].q + 6 * c + 2 * h)); \
                        }                                                                    \
                    }                                                                        \
                    for (int i = 0; i < MR; i++)                                             \
                        s[i][0][15 % NA] = MADD_ACC(s[i][0][15 % NA], hb,                    \
                                                    bcast_pair(xq[i * n32 + xb].q + 30));    \
                }                                                                            \
                for (int c = 0; c < (q5 ? 0 : 4); c++) {                                     \
                    __m256i hv = q6 || q2 ? _mm256_loadu_si256((const __m256i *)(q + (q6 ? 128 : 0) + 32 * (c / 2))) \
                                          : _mm256_setzero_si256();                          \
                    __m256i v = q2 ? hv : _mm256_loadu_si256((const __m256i *)(q + 32 * c));  \
                    for (int h = 0; h < 4; h++) {                                            \
                        __m256i u;                                                           \
                        if (q2) {                                                            \
                            const int pos = 2 * (4 * (c % 2) + h);                           \
                            u = _mm256_and_si256(pos ? _mm256_srli_epi16(hv, pos) : hv, m3); \
                        } else {                                                             \
                            u = h == 3 ? _mm256_srli_epi16(v, 12)                            \
                                       : _mm256_and_si256(h ? _mm256_srli_epi16(v, 4 * h) : v, m4); \
                        }                                                                    \
                        if (q6) {                                                            \
                            const int pos = 2 * (4 * (c % 2) + h);                           \
                            __m256i hb = pos >= 4 ? _mm256_srli_epi16(hv, pos - 4)          \
                                                  : _mm256_slli_epi16(hv, 4 - pos);          \
                            u = _mm256_or_si256(u, _mm256_and_si256(hb, m30));               \
                        }                                                                    \
                        const int hf = s16 ? c / 2 : 0, a = (4 * c + h) % NA;                \
                        for (int i = 0; i < MR; i++)                                         \
                            s[i][hf][a] = MADD_ACC(s[i][hf][a], u,                           \
                                                   bcast_pair(xq[i * n32 + xb].q + 8 * c + 2 * h)); \
                    }                                                                        \
                }                                                                            \
                if (s16) {                                                                   \
                    /* Q2_K: u8 scales at 32 and mins at 160; Q6_K, Q3_K: int8 scales at 16 */  \
                    const uint8_t *ps = p + (q2 ? 32 : 16) + 16 * sb;                       \
                    const __m128i rA = _mm_loadl_epi64((const __m128i *)ps);                 \
                    const __m128i rB = _mm_loadl_epi64((const __m128i *)(ps + 8));           \
                    const __m256 scA = _mm256_cvtepi32_ps(q2 ? _mm256_cvtepu8_epi32(rA) : _mm256_cvtepi8_epi32(rA)); \
                    const __m256 scB = _mm256_cvtepi32_ps(q2 ? _mm256_cvtepu8_epi32(rB) : _mm256_cvtepi8_epi32(rB)); \
                    const __m256 dA = _mm256_mul_ps(d8, scA), dB = _mm256_mul_ps(d8, scB);   \
                    __m256 mA = dA, mB = dB;                                                 \
                    if (q2) {                                                                \
                        mA = _mm256_mul_ps(dm8, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(    \
                                 _mm_loadl_epi64((const __m128i *)(ps + 128)))));           \
                        mB = _mm256_mul_ps(dm8, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(    \
                                 _mm_loadl_epi64((const __m128i *)(ps + 136)))));           \
                    }                                                                        \
                    for (int i = 0; i < MR; i++) {                                           \
                        __m256i sa = s[i][0][0], sbb = s[i][1][0];                           \
                        for (int a = 1; a < NA; a++) {                                       \
                            sa = _mm256_add_epi32(sa, s[i][0][a]);                           \
                            sbb = _mm256_add_epi32(sbb, s[i][1][a]);                         \
                        }                                                                    \
                        const int32_t h0 = xh[i * n32 + xb], h1 = xi[i * n32 + xb] - h0;     \
                        sa = _mm256_sub_epi32(sa, _mm256_set1_epi32(off * h0));              \
                        sbb = _mm256_sub_epi32(sbb, _mm256_set1_epi32(off * h1));            \
                        const __m256 xd = _mm256_set1_ps(xq[i * n32 + xb].d);                \
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), _mm256_mul_ps(dA, xd), acc[i]); \
                        accm[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sbb), _mm256_mul_ps(dB, xd), accm[i]); \
                        if (q2) {                                                            \
                            acc[i] = _mm256_fnmadd_ps(mA, _mm256_mul_ps(xd, _mm256_set1_ps((float)h0)), acc[i]); \
                            accm[i] = _mm256_fnmadd_ps(mB, _mm256_mul_ps(xd, _mm256_set1_ps((float)h1)), accm[i]); \
                        }                                                                    \
                    }                                                                        \
                } else {                                                                     \
                    const __m256 sc8 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(             \
                        _mm_loadl_epi64((const __m128i *)(p + 32 + 8 * sb))));              \
                    const __m256 mn8 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(             \
                        _mm_loadl_epi64((const __m128i *)(p + 96 + 8 * sb))));              \
                    const __m256 ds = _mm256_mul_ps(d8, sc8), ms = _mm256_mul_ps(dm8, mn8);  \
                    for (int i = 0; i < MR; i++) {                                           \
                        __m256i si = s[i][0][0];                                             \
                        for (int a = 1; a < NA; a++) si = _mm256_add_epi32(si, s[i][0][a]);  \
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si),                     \
                                                 _mm256_mul_ps(ds, _mm256_set1_ps(xq[i * n32 + xb].d)), \
                                                 acc[i]);                                    \
                        accm[i] = _mm256_fnmadd_ps(ms, _mm256_set1_ps(xs[i * n32 + xb]), accm[i]); \
                    }                                                                        \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        for (int i = 0; i < MR; i++)                                                         \
            _mm256_storeu_ps(out + 8 * i, _mm256_add_ps(acc[i], accm[i]));                   \
    }

X8K_KERNEL(x8k_kernel_avx2, AVX2, MADD_AVX2, SPARE_AVX2, 2)
X8K_KERNEL(x8k_kernel_vnni, VNNI, MADD_VNNI, SPARE_VNNI, 2)


/* the traits entries of a 32-value type: one group (x8_group) and two groups (x8_tile2) of
 * mr (1..4) x rows, AVX2 and AVX-512 VNNI; one instance per mr so the loops unroll */
#define X8_MR_CASES(KERNEL, T)                                                                \
    switch (mr) {                                                                             \
    case 1: KERNEL(T, gp, nb, xq, xs, xi, n32, 1, out); break;                                \
    case 2: KERNEL(T, gp, nb, xq, xs, xi, n32, 2, out); break;                                \
    case 3: KERNEL(T, gp, nb, xq, xs, xi, n32, 3, out); break;                                \
    case 4: KERNEL(T, gp, nb, xq, xs, xi, n32, 4, out); break;                                \
    }
#define X8_SIMD_FN(NAME, TARGET, KERNEL, T)                                                   \
    TARGET static void NAME(const uint8_t *gp, int64_t nb, const x16_block *xq,               \
                            const float *xs, const int32_t *xi, const int32_t *xh,            \
                            int64_t n32, int mr, float *out) {                                \
        (void)xh;                                                                             \
        X8_MR_CASES(KERNEL, T)                                                                \
    }
#define X8_SIMD_FNS(PREFIX, T)                                                                \
    X8_SIMD_FN(PREFIX##_x8_group_avx2, AVX2, x8_kernel_avx2, T)                               \
    X8_SIMD_FN(PREFIX##_x8_group_vnni, VNNI, x8_kernel_vnni, T)                               \
    X8_SIMD_FN(PREFIX##_x8_tile2_avx2, AVX2, x8t2_kernel_avx2, T)                             \
    X8_SIMD_FN(PREFIX##_x8_tile2_vnni, VNNI, x8t2_kernel_vnni, T)

/* the same for a K-quant (one group at a time) */
#define X8K_SIMD_FN(NAME, TARGET, KERNEL, T)                                                  \
    TARGET static void NAME(const uint8_t *gp, int64_t nb, const x16_block *xq,               \
                            const float *xs, const int32_t *xi, const int32_t *xh,            \
                            int64_t n32, int mr, float *out) {                                \
        switch (mr) {                                                                         \
        case 1: KERNEL(T, gp, nb, xq, xs, xi, xh, n32, 1, out); break;                        \
        case 2: KERNEL(T, gp, nb, xq, xs, xi, xh, n32, 2, out); break;                        \
        case 3: KERNEL(T, gp, nb, xq, xs, xi, xh, n32, 3, out); break;                        \
        case 4: KERNEL(T, gp, nb, xq, xs, xi, xh, n32, 4, out); break;                        \
        }                                                                                     \
    }
#define X8K_SIMD_FNS(PREFIX, T)                                                               \
    X8K_SIMD_FN(PREFIX##_x8_group_avx2, AVX2, x8k_kernel_avx2, T)                             \
    X8K_SIMD_FN(PREFIX##_x8_group_vnni, VNNI, x8k_kernel_vnni, T)
#endif

#endif
