/* Matrix products with GGUF-quantized weights kept quantized in memory.
 *
 *   y[M, N] = x[M, K] @ W^T      x, y float32 row-major; W = N rows of K values, each row the
 *                                GGUF blocks of that row exactly as a .gguf file stores them.
 *
 * Block types (byte layouts as in ggml / the gguf Python package):
 *   Q8_0 (32 values, 34 bytes): fp16 d, int8 q[32];                  x = d*q
 *   Q4_0 (32 values, 18 bytes): fp16 d, u8 qs[16] (nibbles);         x = d*(q-8)
 *   Q4_1 (32 values, 20 bytes): fp16 d, fp16 m, u8 qs[16];           x = d*q + m
 *       value j < 16 is the low nibble of qs[j], value j+16 its high nibble.
 *   Q4_K (256 values, 144 bytes): fp16 d, fp16 dmin, u8 scales[12] (8 6-bit scales and 8
 *       6-bit mins), u8 qs[128]; sub-block s (32 values): x = d*sc[s]*q - dmin*mn[s]; the 64
 *       values of pair p = low then high nibbles of qs[32p .. 32p+32].
 *   Q6_K (256 values, 210 bytes): u8 ql[128] (low 4 bits), u8 qh[64] (high 2 bits),
 *       int8 scales[16] (one per 16 values), fp16 d; x = d*sc*(q-32).
 *
 * Activations stay float32: each weight is dequantized in registers and multiplied by the
 * float activation (no 8-bit rounding of x; see docs/quantization.md for the measured trade).
 * The block offsets are folded out of the inner loop with per-block sums of x
 * (sum x*(q-8) = sum x*q - 8*sum x).
 *
 * Paths: a portable scalar C path (always built, always tested), an x86-64 AVX2+FMA+F16C path
 * and an AVX-512F path, compiled with __attribute__((target)), chosen at run time by CPUID. The file builds with
 * plain -O3 (no -march), so the same object runs on any x86-64 and the dispatch is real.
 *
 * Threads: output rows are split over a small persistent pthread pool (workers spin briefly,
 * then sleep on a futex). No OpenMP: torch already runs its own OpenMP runtime in this process.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#define QK_X86 1
#include <immintrin.h>
#else
#define QK_X86 0
#endif

#define QK_VERSION 2

/* ggml type ids (gguf.GGMLQuantizationType) */
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q8_0 8
#define T_Q4_K 12
#define T_Q6_K 14

#define E_OK 0
#define E_TYPE -1
#define E_SHAPE -2
#define E_ROWBYTES -3
#define E_NOMEM -4
#define E_LEVEL -5
#define E_THREADS -6
#define E_ACT8 -7
#define E_ROW -8

/* ------------------------------------------------------------------------------------------ */
/* fp16 -> fp32, portable */

static inline float h2f(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3FF) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    union { uint32_t u; float f; } v = {bits};
    return v.f;
}

typedef struct { int block; int bytes; } qinfo;

static int type_info(int t, qinfo *qi) {
    switch (t) {
    case T_Q8_0: qi->block = 32; qi->bytes = 34; return 1;
    case T_Q4_0: qi->block = 32; qi->bytes = 18; return 1;
    case T_Q4_1: qi->block = 32; qi->bytes = 20; return 1;
    case T_Q5_0: qi->block = 32; qi->bytes = 22; return 1;
    case T_Q4_K: qi->block = 256; qi->bytes = 144; return 1;
    case T_Q6_K: qi->block = 256; qi->bytes = 210; return 1;
    default: return 0;
    }
}

static inline void k4_scale_min(int j, const uint8_t *q, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* the 32 stored values (0..31) of a Q5_0 block: low nibbles of qs, bit j of qh on top of value j */
static inline void q5_0_vals(const uint8_t *p, int *v) {
    uint32_t qh = (uint32_t)p[2] | (uint32_t)p[3] << 8 | (uint32_t)p[4] << 16 | (uint32_t)p[5] << 24;
    const uint8_t *qs = p + 6;
    for (int j = 0; j < 16; j++) {
        v[j] = (qs[j] & 0xF) | (int)((qh >> j) & 1) << 4;
        v[j + 16] = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* scalar path: dequantize one row; dot of one row with x (xs = per-32 sums of x) */

static void deq_scalar(int t, const uint8_t *w, int64_t nb, float *out) {
    for (int64_t b = 0; b < nb; b++) {
        switch (t) {
        case T_Q8_0: {
            const uint8_t *p = w + b * 34;
            float d = h2f(p);
            const int8_t *q = (const int8_t *)(p + 2);
            for (int j = 0; j < 32; j++) out[b * 32 + j] = d * q[j];
            break;
        }
        case T_Q4_0: {
            const uint8_t *p = w + b * 18;
            float d = h2f(p);
            for (int j = 0; j < 16; j++) {
                out[b * 32 + j] = d * ((p[2 + j] & 0xF) - 8);
                out[b * 32 + j + 16] = d * ((p[2 + j] >> 4) - 8);
            }
            break;
        }
        case T_Q4_1: {
            const uint8_t *p = w + b * 20;
            float d = h2f(p), m = h2f(p + 2);
            for (int j = 0; j < 16; j++) {
                out[b * 32 + j] = d * (p[4 + j] & 0xF) + m;
                out[b * 32 + j + 16] = d * (p[4 + j] >> 4) + m;
            }
            break;
        }
        case T_Q5_0: {
            const uint8_t *p = w + b * 22;
            float d = h2f(p);
            int v[32];
            q5_0_vals(p, v);
            for (int j = 0; j < 32; j++) out[b * 32 + j] = d * (v[j] - 16);
            break;
        }
        case T_Q4_K: {
            const uint8_t *p = w + b * 144;
            float d = h2f(p), dmin = h2f(p + 2);
            const uint8_t *sc = p + 4, *qs = p + 16;
            float *o = out + b * 256;
            for (int pr = 0; pr < 4; pr++) {
                int s1, m1, s2, m2;
                k4_scale_min(2 * pr, sc, &s1, &m1);
                k4_scale_min(2 * pr + 1, sc, &s2, &m2);
                float d1 = d * s1, o1 = dmin * m1, d2 = d * s2, o2 = dmin * m2;
                for (int l = 0; l < 32; l++) o[l] = d1 * (qs[l] & 0xF) - o1;
                for (int l = 0; l < 32; l++) o[32 + l] = d2 * (qs[l] >> 4) - o2;
                o += 64;
                qs += 32;
            }
            break;
        }
        case T_Q6_K: {
            const uint8_t *p = w + b * 210;
            const uint8_t *ql = p, *qh = p + 128;
            const int8_t *sc = (const int8_t *)(p + 192);
            float d = h2f(p + 208);
            float *o = out + b * 256;
            for (int n = 0; n < 2; n++) {
                for (int l = 0; l < 32; l++) {
                    int is = l / 16;
                    int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                    int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    o[l] = d * sc[is + 0] * q1;
                    o[l + 32] = d * sc[is + 2] * q2;
                    o[l + 64] = d * sc[is + 4] * q3;
                    o[l + 96] = d * sc[is + 6] * q4;
                }
                o += 128;
                ql += 64;
                qh += 32;
                sc += 8;
            }
            break;
        }
        }
    }
}

static float dot_scalar(int t, const uint8_t *w, int64_t nb, const float *x, const float *xs) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        switch (t) {
        case T_Q8_0: {
            const uint8_t *p = w + b * 34;
            const int8_t *q = (const int8_t *)(p + 2);
            const float *xb = x + b * 32;
            float s = 0.0f;
            for (int j = 0; j < 32; j++) s += xb[j] * q[j];
            acc += h2f(p) * s;
            break;
        }
        case T_Q4_0:
        case T_Q4_1: {
            int q41 = t == T_Q4_1;
            const uint8_t *p = w + b * (q41 ? 20 : 18);
            const uint8_t *qs = p + (q41 ? 4 : 2);
            const float *xb = x + b * 32;
            float s = 0.0f;
            for (int j = 0; j < 16; j++) s += xb[j] * (qs[j] & 0xF) + xb[j + 16] * (qs[j] >> 4);
            acc += q41 ? h2f(p) * s + h2f(p + 2) * xs[b] : h2f(p) * (s - 8.0f * xs[b]);
            break;
        }
        case T_Q5_0: {
            const uint8_t *p = w + b * 22;
            const float *xb = x + b * 32;
            int v[32];
            q5_0_vals(p, v);
            float s = 0.0f;
            for (int j = 0; j < 32; j++) s += xb[j] * v[j];
            acc += h2f(p) * (s - 16.0f * xs[b]);
            break;
        }
        case T_Q4_K: {
            const uint8_t *p = w + b * 144;
            float d = h2f(p), dmin = h2f(p + 2);
            const uint8_t *sc = p + 4, *qs = p + 16;
            const float *xb = x + b * 256;
            const float *sb = xs + b * 8;
            for (int pr = 0; pr < 4; pr++) {
                int s1, m1, s2, m2;
                k4_scale_min(2 * pr, sc, &s1, &m1);
                k4_scale_min(2 * pr + 1, sc, &s2, &m2);
                float a = 0.0f, c = 0.0f;
                for (int l = 0; l < 32; l++) {
                    a += xb[l] * (qs[l] & 0xF);
                    c += xb[32 + l] * (qs[l] >> 4);
                }
                acc += d * (s1 * a + s2 * c) - dmin * (m1 * sb[2 * pr] + m2 * sb[2 * pr + 1]);
                xb += 64;
                qs += 32;
            }
            break;
        }
        case T_Q6_K: {
            const uint8_t *p = w + b * 210;
            const uint8_t *ql = p, *qh = p + 128;
            const int8_t *sc = (const int8_t *)(p + 192);
            float d = h2f(p + 208);
            const float *xb = x + b * 256;
            float s = 0.0f;
            for (int n = 0; n < 2; n++) {
                float g[8] = {0};
                for (int l = 0; l < 32; l++) {
                    int is = l / 16;
                    int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                    int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    g[is + 0] += xb[l] * q1;
                    g[is + 2] += xb[l + 32] * q2;
                    g[is + 4] += xb[l + 64] * q3;
                    g[is + 6] += xb[l + 96] * q4;
                }
                for (int i = 0; i < 8; i++) s += sc[i] * g[i];
                xb += 128;
                ql += 64;
                qh += 32;
                sc += 8;
            }
            acc += d * s;
            break;
        }
        }
    }
    return acc;
}

/* ------------------------------------------------------------------------------------------ */
/* AVX2 + FMA + F16C path */

#if QK_X86
#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static inline float h2f_avx(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 8 unsigned bytes at p -> 8 floats */
AVX2 static inline __m256 u8x8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }

/* sum of x[0..32) * nibbles (low nibbles of 16 bytes are values 0..15, high nibbles 16..31) */
AVX2 static inline __m256 nib_dot32(const uint8_t *qs, const float *x) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m128i m = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(q, m);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
    __m256 s = _mm256_mul_ps(u8x8(lo), _mm256_loadu_ps(x));
    s = _mm256_fmadd_ps(u8x8(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), s);
    __m256 t = _mm256_mul_ps(u8x8(hi), _mm256_loadu_ps(x + 16));
    t = _mm256_fmadd_ps(u8x8(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), t);
    return _mm256_add_ps(s, t);
}

AVX2 static float dot_avx2(int t, const uint8_t *w, int64_t nb, const float *x,
                           const float *xs) {
    __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    float tail = 0.0f, tail2 = 0.0f;
    switch (t) {
    case T_Q8_0:
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
        break;
    case T_Q4_0:
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = w + b * 18;
            __m256 s = nib_dot32(p + 2, x + b * 32);
            float d = h2f_avx(p);
            if (b & 1) { /* two chains of each sum, so no add waits on the previous one */
                acc2 = _mm256_fmadd_ps(s, _mm256_set1_ps(d), acc2);
                tail2 -= 8.0f * d * xs[b];
            } else {
                acc = _mm256_fmadd_ps(s, _mm256_set1_ps(d), acc);
                tail -= 8.0f * d * xs[b];
            }
        }
        break;
    case T_Q4_1:
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
        break;
    case T_Q4_K:
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = w + b * 144;
            float d = h2f_avx(p), dmin = h2f_avx(p + 2);
            const uint8_t *sc = p + 4, *qs = p + 16;
            const float *xb = x + b * 256;
            const float *sb = xs + b * 8;
            __m128i m = _mm_set1_epi8(0x0F);
            for (int pr = 0; pr < 4; pr++) {
                int s1, m1, s2, m2;
                k4_scale_min(2 * pr, sc, &s1, &m1);
                k4_scale_min(2 * pr + 1, sc, &s2, &m2);
                __m128i q0 = _mm_loadu_si128((const __m128i *)qs);
                __m128i q1 = _mm_loadu_si128((const __m128i *)(qs + 16));
                __m128i l0 = _mm_and_si128(q0, m), l1 = _mm_and_si128(q1, m);
                __m128i h0 = _mm_and_si128(_mm_srli_epi16(q0, 4), m);
                __m128i h1 = _mm_and_si128(_mm_srli_epi16(q1, 4), m);
                __m256 a = _mm256_mul_ps(u8x8(l0), _mm256_loadu_ps(xb));
                a = _mm256_fmadd_ps(u8x8(_mm_srli_si128(l0, 8)), _mm256_loadu_ps(xb + 8), a);
                a = _mm256_fmadd_ps(u8x8(l1), _mm256_loadu_ps(xb + 16), a);
                a = _mm256_fmadd_ps(u8x8(_mm_srli_si128(l1, 8)), _mm256_loadu_ps(xb + 24), a);
                __m256 c = _mm256_mul_ps(u8x8(h0), _mm256_loadu_ps(xb + 32));
                c = _mm256_fmadd_ps(u8x8(_mm_srli_si128(h0, 8)), _mm256_loadu_ps(xb + 40), c);
                c = _mm256_fmadd_ps(u8x8(h1), _mm256_loadu_ps(xb + 48), c);
                c = _mm256_fmadd_ps(u8x8(_mm_srli_si128(h1, 8)), _mm256_loadu_ps(xb + 56), c);
                acc = _mm256_fmadd_ps(a, _mm256_set1_ps(d * s1), acc);
                acc2 = _mm256_fmadd_ps(c, _mm256_set1_ps(d * s2), acc2);
                tail -= dmin * (m1 * sb[2 * pr] + m2 * sb[2 * pr + 1]);
                xb += 64;
                qs += 32;
            }
        }
        break;
    case T_Q6_K:
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = w + b * 210;
            const uint8_t *ql = p, *qh = p + 128;
            const int8_t *sc = (const int8_t *)(p + 192);
            float d = h2f_avx(p + 208);
            const float *xb = x + b * 256;
            const __m256i m4 = _mm256_set1_epi32(0xF), m3 = _mm256_set1_epi32(3);
            const __m256i off = _mm256_set1_epi32(32);
            for (int n = 0; n < 2; n++) {
                for (int l = 0; l < 32; l += 8) {
                    int is = l / 16;
                    __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(ql + l)));
                    __m256i c =
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(ql + l + 32)));
                    __m256i h = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qh + l)));
                    __m256i q1 = _mm256_or_si256(_mm256_and_si256(a, m4),
                                                 _mm256_slli_epi32(_mm256_and_si256(h, m3), 4));
                    __m256i q2 = _mm256_or_si256(
                        _mm256_and_si256(c, m4),
                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 2), m3), 4));
                    __m256i q3 = _mm256_or_si256(
                        _mm256_srli_epi32(a, 4),
                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 4), m3), 4));
                    __m256i q4 = _mm256_or_si256(_mm256_srli_epi32(c, 4),
                                                 _mm256_slli_epi32(_mm256_srli_epi32(h, 6), 4));
                    __m256 f1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(q1, off));
                    __m256 f2 = _mm256_cvtepi32_ps(_mm256_sub_epi32(q2, off));
                    __m256 f3 = _mm256_cvtepi32_ps(_mm256_sub_epi32(q3, off));
                    __m256 f4 = _mm256_cvtepi32_ps(_mm256_sub_epi32(q4, off));
                    acc = _mm256_fmadd_ps(_mm256_mul_ps(f1, _mm256_loadu_ps(xb + l)),
                                          _mm256_set1_ps(d * sc[is]), acc);
                    acc2 = _mm256_fmadd_ps(_mm256_mul_ps(f2, _mm256_loadu_ps(xb + l + 32)),
                                           _mm256_set1_ps(d * sc[is + 2]), acc2);
                    acc = _mm256_fmadd_ps(_mm256_mul_ps(f3, _mm256_loadu_ps(xb + l + 64)),
                                          _mm256_set1_ps(d * sc[is + 4]), acc);
                    acc2 = _mm256_fmadd_ps(_mm256_mul_ps(f4, _mm256_loadu_ps(xb + l + 96)),
                                           _mm256_set1_ps(d * sc[is + 6]), acc2);
                }
                xb += 128;
                ql += 64;
                qh += 32;
                sc += 8;
            }
        }
        break;
    }
    return hsum8(_mm256_add_ps(acc, acc2)) + (tail + tail2);
}

/* Dequantize with AVX2: only the common 32-blocks are vectorized; K-quants reuse the scalar
 * code (the tiled path is compute-bound on the dot products, not on this). */
AVX2 static void deq_avx2(int t, const uint8_t *w, int64_t nb, float *out) {
    if (t != T_Q4_0 && t != T_Q4_1 && t != T_Q8_0) {
        deq_scalar(t, w, nb, out);
        return;
    }
    const __m128i m = _mm_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++) {
        float *o = out + b * 32;
        if (t == T_Q8_0) {
            const uint8_t *p = w + b * 34;
            __m256 d = _mm256_set1_ps(h2f_avx(p));
            for (int j = 0; j < 32; j += 8)
                _mm256_storeu_ps(o + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                              _mm_loadl_epi64((const __m128i *)(p + 2 + j))))));
            continue;
        }
        int q41 = t == T_Q4_1;
        const uint8_t *p = w + b * (q41 ? 20 : 18);
        __m256 d = _mm256_set1_ps(h2f_avx(p));
        __m256 mn = _mm256_set1_ps(q41 ? h2f_avx(p + 2) : -8.0f * h2f_avx(p));
        __m128i q = _mm_loadu_si128((const __m128i *)(p + (q41 ? 4 : 2)));
        __m128i lo = _mm_and_si128(q, m), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
        _mm256_storeu_ps(o, _mm256_fmadd_ps(u8x8(lo), d, mn));
        _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(u8x8(_mm_srli_si128(lo, 8)), d, mn));
        _mm256_storeu_ps(o + 16, _mm256_fmadd_ps(u8x8(hi), d, mn));
        _mm256_storeu_ps(o + 24, _mm256_fmadd_ps(u8x8(_mm_srli_si128(hi, 8)), d, mn));
    }
}

/* 4 dot products of one x row with 4 dequantized rows (length k, multiple of 32) */
AVX2 static void dot4_f32_avx2(const float *x, const float *w0, int64_t k, float *out) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const float *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
    for (int64_t i = 0; i < k; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w0 + i), a0);
        a1 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w1 + i), a1);
        a2 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w2 + i), a2);
        a3 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w3 + i), a3);
    }
    out[0] = hsum8(a0);
    out[1] = hsum8(a1);
    out[2] = hsum8(a2);
    out[3] = hsum8(a3);
}

static int have_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                 __builtin_cpu_supports("f16c");
    }
    return cached;
}

/* AVX-512 (level 2): 16 floats a vector, and 4-bit values looked up in a 16-entry table of
 * their dequantized floats (vpermps), built once per block or sub-block: d*q+m costs nothing
 * per weight, and the block offsets need no activation sums. Q6_K uses the AVX2 code. */
#define AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

AVX512 static inline __m512 nib_lut_dot32(__m128i q, __m512 lut, const float *x, __m512 acc) {
    const __m128i m = _mm_set1_epi8(0x0F);
    __m512i lo = _mm512_cvtepu8_epi32(_mm_and_si128(q, m));
    __m512i hi = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), m));
    acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(lo, lut), _mm512_loadu_ps(x), acc);
    return _mm512_fmadd_ps(_mm512_permutexvar_ps(hi, lut), _mm512_loadu_ps(x + 16), acc);
}

AVX512 static float dot_avx512(int t, const uint8_t *w, int64_t nb, const float *x,
                               const float *xs) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 acc = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps();
    switch (t) {
    case T_Q4_0: {
        const __m512 iota8 = _mm512_sub_ps(iota, _mm512_set1_ps(8.0f));
        int64_t b = 0;
        for (; b + 1 < nb; b += 2) {
            const uint8_t *p = w + b * 18;
            acc = nib_lut_dot32(_mm_loadu_si128((const __m128i *)(p + 2)),
                                _mm512_mul_ps(iota8, _mm512_set1_ps(h2f_avx(p))), x + b * 32, acc);
            acc2 = nib_lut_dot32(_mm_loadu_si128((const __m128i *)(p + 20)),
                                 _mm512_mul_ps(iota8, _mm512_set1_ps(h2f_avx(p + 18))),
                                 x + b * 32 + 32, acc2);
        }
        for (; b < nb; b++) {
            const uint8_t *p = w + b * 18;
            acc = nib_lut_dot32(_mm_loadu_si128((const __m128i *)(p + 2)),
                                _mm512_mul_ps(iota8, _mm512_set1_ps(h2f_avx(p))), x + b * 32, acc);
        }
        break;
    }
    case T_Q4_1: {
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
        break;
    }
    case T_Q8_0:
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
        break;
    case T_Q4_K:
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = w + b * 144;
            float d = h2f_avx(p), dmin = h2f_avx(p + 2);
            const uint8_t *sc = p + 4, *qs = p + 16;
            const float *xb = x + b * 256;
            const __m128i m = _mm_set1_epi8(0x0F);
            for (int pr = 0; pr < 4; pr++) {
                int s1, m1, s2, m2;
                k4_scale_min(2 * pr, sc, &s1, &m1);
                k4_scale_min(2 * pr + 1, sc, &s2, &m2);
                __m512 lut1 = _mm512_fmadd_ps(iota, _mm512_set1_ps(d * s1),
                                              _mm512_set1_ps(-dmin * m1));
                __m512 lut2 = _mm512_fmadd_ps(iota, _mm512_set1_ps(d * s2),
                                              _mm512_set1_ps(-dmin * m2));
                __m128i q0 = _mm_loadu_si128((const __m128i *)qs);
                __m128i q1 = _mm_loadu_si128((const __m128i *)(qs + 16));
                acc = _mm512_fmadd_ps(
                    _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q0, m)), lut1),
                    _mm512_loadu_ps(xb), acc);
                acc2 = _mm512_fmadd_ps(
                    _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q1, m)), lut1),
                    _mm512_loadu_ps(xb + 16), acc2);
                acc = _mm512_fmadd_ps(
                    _mm512_permutexvar_ps(
                        _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q0, 4), m)), lut2),
                    _mm512_loadu_ps(xb + 32), acc);
                acc2 = _mm512_fmadd_ps(
                    _mm512_permutexvar_ps(
                        _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q1, 4), m)), lut2),
                    _mm512_loadu_ps(xb + 48), acc2);
                xb += 64;
                qs += 32;
            }
        }
        break;
    default:
        return dot_avx2(t, w, nb, x, xs);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc, acc2));
}

static int have_avx512(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = have_avx2() && __builtin_cpu_supports("avx512f");
    }
    return cached;
}
#else
static int have_avx512(void) { return 0; }
static int have_avx2(void) { return 0; }
#endif

static void dot4_f32_scalar(const float *x, const float *w0, int64_t k, float *out) {
    for (int r = 0; r < 4; r++) {
        const float *w = w0 + r * k;
        float s = 0.0f;
        for (int64_t i = 0; i < k; i++) s += x[i] * w[i];
        out[r] = s;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* 8-bit activations (as llama.cpp's CPU backend does): x quantized per 32 values to int8 with
 * one float scale (xd), integer dot products per block. Q8_0, Q4_0 and Q4_1 only; kept for the
 * measured comparison (docs/quantization.md), fp32 activations are the default. */

typedef struct { float d; int32_t sum; int8_t q[32]; } xq_block;

static void quantize_x(const float *x, int64_t nb, xq_block *out) {
    for (int64_t b = 0; b < nb; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) {
            float a = x[b * 32 + i] < 0 ? -x[b * 32 + i] : x[b * 32 + i];
            amax = a > amax ? a : amax;
        }
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < 32; i++) {
            float v = x[b * 32 + i] * id;
            int q = (int)(v < 0 ? v - 0.5f : v + 0.5f); /* roundf */
            out[b].q[i] = (int8_t)q;
            sum += q;
        }
        out[b].d = d;
        out[b].sum = sum;
    }
}

static float dot_i8_scalar(int t, const uint8_t *w, int64_t nb, const xq_block *xq) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const int8_t *q8 = xq[b].q;
        int32_t s = 0;
        if (t == T_Q8_0) {
            const int8_t *wq = (const int8_t *)(w + b * 34 + 2);
            for (int j = 0; j < 32; j++) s += wq[j] * q8[j];
            acc += h2f(w + b * 34) * xq[b].d * s;
        } else {
            int q41 = t == T_Q4_1;
            const uint8_t *p = w + b * (q41 ? 20 : 18), *qs = p + (q41 ? 4 : 2);
            for (int j = 0; j < 16; j++) s += (qs[j] & 0xF) * q8[j] + (qs[j] >> 4) * q8[j + 16];
            if (q41)
                acc += h2f(p) * xq[b].d * s + h2f(p + 2) * xq[b].d * xq[b].sum;
            else
                acc += h2f(p) * xq[b].d * (s - 8 * xq[b].sum);
        }
    }
    return acc;
}

#if QK_X86
AVX2 static float dot_i8_avx2(int t, const uint8_t *w, int64_t nb, const xq_block *xq) {
    __m256 acc = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    float tail = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)xq[b].q);
        __m256i prod;
        float scale;
        if (t == T_Q8_0) {
            const uint8_t *p = w + b * 34;
            __m256i wv = _mm256_loadu_si256((const __m256i *)(p + 2));
            prod = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
            scale = h2f_avx(p) * xq[b].d;
        } else {
            int q41 = t == T_Q4_1;
            const uint8_t *p = w + b * (q41 ? 20 : 18);
            __m128i q = _mm_loadu_si128((const __m128i *)(p + (q41 ? 4 : 2)));
            __m256i wv = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4),
                                          _mm_and_si128(q, m4));
            prod = _mm256_maddubs_epi16(wv, xv);
            float dw = h2f_avx(p);
            scale = dw * xq[b].d;
            tail += q41 ? h2f_avx(p + 2) * xq[b].d * xq[b].sum : -8.0f * scale * xq[b].sum;
        }
        __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(prod, ones));
        acc = _mm256_fmadd_ps(f, _mm256_set1_ps(scale), acc);
    }
    return hsum8(acc) + tail;
}
#endif

/* ------------------------------------------------------------------------------------------ */
/* 16-bit activations: x rounded per 32 values to int16 (scale amax/32767: a relative error of
 * at most 1.5e-5 of the block's largest value, 256x finer than 8 bits, as fine as float32
 * accumulation over a row), integer dot products with pmaddwd, offsets and mins applied with
 * the exact float sums of x. Every type. */

typedef struct { float d; int16_t q[32]; } x16_block;

static void quantize_x16(const float *x, int64_t nb, x16_block *out) {
    for (int64_t b = 0; b < nb; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) {
            float a = x[b * 32 + i] < 0 ? -x[b * 32 + i] : x[b * 32 + i];
            amax = a > amax ? a : amax;
        }
        float d = amax / 32767.0f, id = d ? 1.0f / d : 0.0f;
        for (int i = 0; i < 32; i++) {
            float v = x[b * 32 + i] * id;
            int q = (int)(v < 0 ? v - 0.5f : v + 0.5f);
            out[b].q[i] = (int16_t)(q > 32767 ? 32767 : q < -32767 ? -32767 : q);
        }
        out[b].d = d;
    }
}

/* nb: blocks of the weight type; xq, xs: per 32 values */
static float dot_i16_scalar(int t, const uint8_t *w, int64_t nb, const x16_block *xq,
                            const float *xs) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        switch (t) {
        case T_Q8_0: {
            const int8_t *wq = (const int8_t *)(w + b * 34 + 2);
            int32_t s = 0;
            for (int j = 0; j < 32; j++) s += wq[j] * xq[b].q[j];
            acc += h2f(w + b * 34) * xq[b].d * s;
            break;
        }
        case T_Q4_0:
        case T_Q4_1: {
            int q41 = t == T_Q4_1;
            const uint8_t *p = w + b * (q41 ? 20 : 18), *qs = p + (q41 ? 4 : 2);
            int off = q41 ? 0 : 8;
            int32_t s = 0;
            for (int j = 0; j < 16; j++)
                s += ((qs[j] & 0xF) - off) * xq[b].q[j] + ((qs[j] >> 4) - off) * xq[b].q[j + 16];
            acc += h2f(p) * xq[b].d * s + (q41 ? h2f(p + 2) * xs[b] : 0.0f);
            break;
        }
        case T_Q5_0: {
            const uint8_t *p = w + b * 22;
            int v[32];
            q5_0_vals(p, v);
            int32_t s = 0;
            for (int j = 0; j < 32; j++) s += (v[j] - 16) * xq[b].q[j];
            acc += h2f(p) * xq[b].d * s;
            break;
        }
        case T_Q4_K: {
            const uint8_t *p = w + b * 144;
            float d = h2f(p), dmin = h2f(p + 2);
            const uint8_t *sc = p + 4, *qs = p + 16;
            for (int pr = 0; pr < 4; pr++) {
                int s1, m1, s2, m2;
                k4_scale_min(2 * pr, sc, &s1, &m1);
                k4_scale_min(2 * pr + 1, sc, &s2, &m2);
                const x16_block *a = &xq[b * 8 + 2 * pr], *c = a + 1;
                int32_t sa = 0, sc2 = 0;
                for (int l = 0; l < 32; l++) {
                    sa += (qs[l] & 0xF) * a->q[l];
                    sc2 += (qs[l] >> 4) * c->q[l];
                }
                acc += d * (s1 * a->d * sa + s2 * c->d * sc2) -
                       dmin * (m1 * xs[b * 8 + 2 * pr] + m2 * xs[b * 8 + 2 * pr + 1]);
                qs += 32;
            }
            break;
        }
        case T_Q6_K: {
            const uint8_t *p = w + b * 210;
            const uint8_t *ql = p, *qh = p + 128;
            const int8_t *sc = (const int8_t *)(p + 192);
            float d = h2f(p + 208);
            for (int n = 0; n < 2; n++) {
                const x16_block *xb = &xq[b * 8 + n * 4];
                for (int g = 0; g < 2; g++) { /* l in [16g, 16g+16) */
                    int32_t s1 = 0, s2 = 0, s3 = 0, s4 = 0;
                    for (int l = 16 * g; l < 16 * g + 16; l++) {
                        s1 += (((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32) * xb[0].q[l];
                        s2 += (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32) * xb[1].q[l];
                        s3 += (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32) * xb[2].q[l];
                        s4 += (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32) * xb[3].q[l];
                    }
                    acc += d * (sc[g] * xb[0].d * s1 + sc[g + 2] * xb[1].d * s2 +
                                sc[g + 4] * xb[2].d * s3 + sc[g + 6] * xb[3].d * s4);
                }
                ql += 64;
                qh += 32;
                sc += 8;
            }
            break;
        }
        }
    }
    return acc;
}

#if QK_X86
/* 16 unsigned bytes (values 0..off*2) minus off, times 16 int16 activations: 8 int32 sums */
AVX2 static inline __m256i madd16(__m128i bytes, __m256i off, const int16_t *x) {
    __m256i wv = _mm256_sub_epi16(_mm256_cvtepu8_epi16(bytes), off);
    return _mm256_madd_epi16(wv, _mm256_loadu_si256((const __m256i *)x));
}

/* Q8_0 with int16 activations, two blocks per iteration into independent accumulators */
AVX2 static float q8_i16_avx2(const uint8_t *w, int64_t nb, const x16_block *xq) {
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

/* Q4_0 / Q4_1 with int16 activations, two blocks per iteration into independent accumulators
 * (the block offsets' scalar sums too: one chain of float adds per block was the bottleneck) */
AVX2 static inline __attribute__((always_inline)) float q4_i16_avx2(
    const uint8_t *w, int64_t nb, const x16_block *xq, const float *xs, const int q41) {
    const __m256i m4w = _mm256_set1_epi16(0x0F);
    const __m256i off = q41 ? _mm256_setzero_si256() : _mm256_set1_epi16(8);
    const int bytes = q41 ? 20 : 18, qoff = q41 ? 4 : 2;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    float t0 = 0.0f, t1 = 0.0f;
#define Q4BLK(bb, ACC, T)                                                                     \
    {                                                                                         \
        const uint8_t *p = w + (bb) * bytes;                                                  \
        /* bytes to 16-bit lanes once; the low nibble by a mask, the high one by a shift */   \
        __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + qoff)));      \
        __m256i s = _mm256_add_epi32(                                                         \
            _mm256_madd_epi16(_mm256_sub_epi16(_mm256_and_si256(q, m4w), off),                \
                              _mm256_loadu_si256((const __m256i *)xq[bb].q)),                 \
            _mm256_madd_epi16(_mm256_sub_epi16(_mm256_srli_epi16(q, 4), off),                 \
                              _mm256_loadu_si256((const __m256i *)(xq[bb].q + 16))));         \
        ACC = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(h2f_avx(p) * xq[bb].d),   \
                              ACC);                                                           \
        if (q41) T += h2f_avx(p + 2) * xs[bb];                                                \
    }
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        Q4BLK(b, acc0, t0)
        Q4BLK(b + 1, acc1, t1)
    }
    if (b < nb) Q4BLK(b, acc0, t0)
#undef Q4BLK
    return hsum8(_mm256_add_ps(acc0, acc1)) + (t0 + t1);
}

AVX2 static float dot_i16_avx2(int t, const uint8_t *w, int64_t nb, const x16_block *xq,
                               const float *xs) {
    __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(0x0F);
    float tail = 0.0f;
    switch (t) {
    case T_Q8_0:
        return q8_i16_avx2(w, nb, xq);
    case T_Q4_0:
        return q4_i16_avx2(w, nb, xq, xs, 0);
    case T_Q4_1:
        return q4_i16_avx2(w, nb, xq, xs, 1);
    case T_Q4_K:
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = w + b * 144;
            float d = h2f_avx(p), dmin = h2f_avx(p + 2);
            const uint8_t *sc = p + 4, *qs = p + 16;
            for (int pr = 0; pr < 4; pr++) {
                int s1, m1, s2, m2;
                k4_scale_min(2 * pr, sc, &s1, &m1);
                k4_scale_min(2 * pr + 1, sc, &s2, &m2);
                const x16_block *a = &xq[b * 8 + 2 * pr], *c = a + 1;
                const __m256i m4w = _mm256_set1_epi16(0x0F);
                __m256i q0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)qs));
                __m256i q1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(qs + 16)));
#define MADDX(v, ptr) _mm256_madd_epi16((v), _mm256_loadu_si256((const __m256i *)(ptr)))
                __m256i sa = _mm256_add_epi32(MADDX(_mm256_and_si256(q0, m4w), a->q),
                                              MADDX(_mm256_and_si256(q1, m4w), a->q + 16));
                __m256i sb = _mm256_add_epi32(MADDX(_mm256_srli_epi16(q0, 4), c->q),
                                              MADDX(_mm256_srli_epi16(q1, 4), c->q + 16));
#undef MADDX
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), _mm256_set1_ps(d * s1 * a->d), acc);
                acc2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sb), _mm256_set1_ps(d * s2 * c->d),
                                       acc2);
                tail -= dmin * (m1 * xs[b * 8 + 2 * pr] + m2 * xs[b * 8 + 2 * pr + 1]);
                qs += 32;
            }
        }
        break;
    case T_Q6_K: {
        const __m128i m3 = _mm_set1_epi8(3);
        const __m256i off = _mm256_set1_epi16(32);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = w + b * 210;
            const uint8_t *ql = p, *qh = p + 128;
            const int8_t *sc = (const int8_t *)(p + 192);
            float d = h2f_avx(p + 208);
            for (int n = 0; n < 2; n++) {
                const x16_block *xb = &xq[b * 8 + n * 4];
                for (int g = 0; g < 2; g++) {
                    int l = 16 * g;
                    __m128i a = _mm_loadu_si128((const __m128i *)(ql + l));
                    __m128i c = _mm_loadu_si128((const __m128i *)(ql + l + 32));
                    __m128i h = _mm_loadu_si128((const __m128i *)(qh + l));
                    __m128i q1 = _mm_or_si128(_mm_and_si128(a, m4),
                                              _mm_slli_epi16(_mm_and_si128(h, m3), 4));
                    __m128i q2 = _mm_or_si128(
                        _mm_and_si128(c, m4),
                        _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 2), m3), 4));
                    __m128i q3 = _mm_or_si128(
                        _mm_and_si128(_mm_srli_epi16(a, 4), m4),
                        _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 4), m3), 4));
                    __m128i q4 = _mm_or_si128(
                        _mm_and_si128(_mm_srli_epi16(c, 4), m4),
                        _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 6), m3), 4));
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(madd16(q1, off, xb[0].q + l)),
                                          _mm256_set1_ps(d * sc[g] * xb[0].d), acc);
                    acc2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(madd16(q2, off, xb[1].q + l)),
                                           _mm256_set1_ps(d * sc[g + 2] * xb[1].d), acc2);
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(madd16(q3, off, xb[2].q + l)),
                                          _mm256_set1_ps(d * sc[g + 4] * xb[2].d), acc);
                    acc2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(madd16(q4, off, xb[3].q + l)),
                                           _mm256_set1_ps(d * sc[g + 6] * xb[3].d), acc2);
                }
                ql += 64;
                qh += 32;
                sc += 8;
            }
        }
        break;
    }
    }
    return hsum8(_mm256_add_ps(acc, acc2)) + tail;
}
#endif

#if QK_X86
/* 4 rows of int16 activations against one weight row (Q8_0, Q4_0, Q4_1): each weight block is
 * unpacked once and used for the 4 rows (batched decode, short prompts). xq/xs: 4 rows of
 * n32 blocks each, one after another. */
AVX2 static void dot4_i16_avx2(int t, const uint8_t *w, int64_t nb, const x16_block *xq,
                               const float *xs, int64_t n32, float *out) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    float tail[4] = {0, 0, 0, 0};
    const int q41 = t == T_Q4_1, q80 = t == T_Q8_0;
    const int bytes = q80 ? 34 : q41 ? 20 : 18;
    const __m256i off = (q41 || q80) ? _mm256_setzero_si256() : _mm256_set1_epi16(8);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = w + b * bytes;
        __m256i w0, w1;
        if (q80) {
            w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 2)));
            w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 18)));
        } else {
            __m256i q = _mm256_cvtepu8_epi16(
                _mm_loadu_si128((const __m128i *)(p + (q41 ? 4 : 2))));
            w0 = _mm256_sub_epi16(_mm256_and_si256(q, _mm256_set1_epi16(0x0F)), off);
            w1 = _mm256_sub_epi16(_mm256_srli_epi16(q, 4), off);
        }
        float dw = h2f_avx(p);
#define ROW(i, acc)                                                                           \
    {                                                                                         \
        const x16_block *xb = &xq[(i) * n32 + b];                                             \
        __m256i s = _mm256_add_epi32(                                                         \
            _mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)xb->q)),                \
            _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(xb->q + 16))));        \
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * xb->d), acc);        \
    }
        ROW(0, acc0)
        ROW(1, acc1)
        ROW(2, acc2)
        ROW(3, acc3)
#undef ROW
        if (q41) {
            float mw = h2f_avx(p + 2);
            for (int i = 0; i < 4; i++) tail[i] += mw * xs[i * n32 + b];
        }
    }
    out[0] = hsum8(acc0) + tail[0];
    out[1] = hsum8(acc1) + tail[1];
    out[2] = hsum8(acc2) + tail[2];
    out[3] = hsum8(acc3) + tail[3];
}
#endif

/* ------------------------------------------------------------------------------------------ */
/* thread pool: workers spin for a while after each job, then sleep on a futex.
 *
 * A job is split into chunks of output rows that the caller and the workers take from a shared
 * counter, so a worker that is not running (its core busy with another process) costs nothing:
 * the caller takes its chunks. A worker joins a job by claiming it (a CAS on a word holding the
 * job's generation); once the caller has run out of chunks it closes the claims and waits only
 * for the workers that joined, which are running. A late worker sees the closed or newer claim
 * word and never touches the finished job. */

typedef void (*job_fn)(void *arg, int chunk, int nchunks);

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t pool_threads[256];
static int pool_size = 0;
static _Atomic uint32_t pool_gen = 0;    /* bumped per job: wakes the workers */
static _Atomic uint64_t pool_claim = 0;  /* gen << 32 | closed << 31 | workers joined */
static _Atomic int pool_finished = 0;    /* joined workers done with the current job */
static _Atomic int pool_next = 0;        /* next chunk to take */
static _Atomic int pool_sleepers = 0;
static job_fn pool_fn;
static void *pool_arg;
static int pool_nchunks;
static _Atomic long pool_spin_ns = 200000; /* how long an idle worker spins before sleeping */

#define CLAIM_CLOSED (1ull << 31)

static inline void cpu_relax(void) {
#if QK_X86
    _mm_pause();
#endif
}

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
#if defined(__linux__)
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
#else
    (void)addr; (void)val;
    sched_yield();
#endif
}

static void futex_wake_all(_Atomic uint32_t *addr) {
#if defined(__linux__)
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void)addr;
#endif
}

static void take_chunks(job_fn fn, void *arg, int nchunks) {
    for (;;) {
        int c = atomic_fetch_add(&pool_next, 1);
        if (c >= nchunks) return;
        fn(arg, c, nchunks);
    }
}

static void *pool_main(void *p) {
    (void)p;
    uint32_t seen = atomic_load(&pool_gen);
    for (;;) {
        long start = now_ns();
        int spins = 0;
        while (atomic_load_explicit(&pool_gen, memory_order_acquire) == seen) {
            cpu_relax();
            if (++spins == 256) {
                spins = 0;
                if (now_ns() - start > atomic_load_explicit(&pool_spin_ns, memory_order_relaxed)) {
                    atomic_fetch_add(&pool_sleepers, 1);
                    if (atomic_load(&pool_gen) == seen) futex_wait(&pool_gen, seen);
                    atomic_fetch_sub(&pool_sleepers, 1);
                    start = now_ns();
                }
            }
        }
        seen = atomic_load(&pool_gen);
        uint64_t c = atomic_load(&pool_claim);
        /* join only the job of the generation just seen, while its claims are open */
        while ((uint32_t)(c >> 32) == seen && !(c & CLAIM_CLOSED)) {
            if (atomic_compare_exchange_weak(&pool_claim, &c, c + 1)) {
                take_chunks(pool_fn, pool_arg, pool_nchunks);
                atomic_fetch_add_explicit(&pool_finished, 1, memory_order_release);
                break;
            }
        }
    }
    return NULL;
}

static void pool_atfork_child(void) {
    /* threads do not survive fork: start a fresh pool on the next call */
    pthread_mutex_init(&pool_lock, NULL);
    pool_size = 0;
    atomic_store(&pool_sleepers, 0);
}

/* run fn over nchunks chunks on the calling thread and up to nth - 1 pool threads */
static int pool_run(job_fn fn, void *arg, int nchunks, int nth) {
    if (nth <= 1 || nchunks <= 1) {
        for (int c = 0; c < nchunks; c++) fn(arg, c, nchunks);
        return E_OK;
    }
    pthread_mutex_lock(&pool_lock);
    static int atfork_done = 0;
    if (!atfork_done) {
        pthread_atfork(NULL, NULL, pool_atfork_child);
        atfork_done = 1;
    }
    while (pool_size < nth - 1) {
        if (pthread_create(&pool_threads[pool_size], NULL, pool_main, NULL) != 0) break;
        pthread_detach(pool_threads[pool_size]);
        pool_size++;
    }
    pool_fn = fn;
    pool_arg = arg;
    pool_nchunks = nchunks;
    atomic_store(&pool_next, 0);
    atomic_store(&pool_finished, 0);
    uint32_t gen = atomic_load(&pool_gen) + 1;
    atomic_store(&pool_claim, (uint64_t)gen << 32);
    atomic_store(&pool_gen, gen);
    if (atomic_load(&pool_sleepers) > 0) futex_wake_all(&pool_gen);
    take_chunks(fn, arg, nchunks);
    /* close the claims: the workers that joined are running; wait for them only */
    uint64_t c = atomic_load(&pool_claim);
    while (!atomic_compare_exchange_weak(&pool_claim, &c, c | CLAIM_CLOSED)) {
    }
    int joined = (int)(c & 0x7FFFFFFF);
    while (atomic_load_explicit(&pool_finished, memory_order_acquire) < joined) cpu_relax();
    pthread_mutex_unlock(&pool_lock);
    return E_OK;
}

/* the pool for other compiled code (the decode plan splits attention heads over it) */
int qk_pool_run(job_fn fn, void *arg, int nchunks, int nth) {
    if (nth < 1 || nth > 256) return E_THREADS;
    return pool_run(fn, arg, nchunks, nth);
}

/* ------------------------------------------------------------------------------------------ */
/* jobs */

typedef struct {
    int t, level;
    const float *x;
    int64_t ldx, m;
    const uint8_t *w;
    int64_t row_bytes, n, k, nb;
    float *y;
    int64_t ldy;
    const float *xs; /* [m, k/32] sums of x per 32 values */
    int failed;
    const xq_block *xq; /* 8-bit activations: x quantized, one row */
    const x16_block *x16; /* 16-bit activations: x quantized, one row (or m4 rows) */
    int64_t m4;           /* > 0: x16/xs hold m4 rows (a multiple of 4) of n32 blocks */
} job_t;

/* chunks a job of n rows is cut into for nth threads: 4 per thread (a descheduled worker's
 * share is taken by the others), at least 16 rows each */
static int chunks_for(int64_t n, int nth) {
    if (nth <= 1) return 1;
    int64_t c = 4 * (int64_t)nth, most = (n + 15) / 16;
    if (c > most) c = most;
    return c < 1 ? 1 : (int)c;
}

static void rows_of(int64_t n, int tid, int nth, int64_t *r0, int64_t *r1) {
    /* contiguous row ranges, multiples of 4 rows except the last */
    int64_t per = ((n + nth - 1) / nth + 3) & ~(int64_t)3;
    *r0 = per * tid < n ? per * tid : n;
    *r1 = per * (tid + 1) < n ? per * (tid + 1) : n;
}

static void gemv_job(void *a, int tid, int nth) {
    job_t *j = a;
    int64_t r0, r1;
    rows_of(j->n, tid, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = j->w + r * j->row_bytes;
        if (j->x16) {
#if QK_X86
            if (j->level >= 1) {
                j->y[r] = dot_i16_avx2(j->t, wr, j->nb, j->x16, j->xs);
                continue;
            }
#endif
            j->y[r] = dot_i16_scalar(j->t, wr, j->nb, j->x16, j->xs);
            continue;
        }
        if (j->xq) {
#if QK_X86
            if (j->level >= 1) {
                j->y[r] = dot_i8_avx2(j->t, wr, j->nb, j->xq);
                continue;
            }
#endif
            j->y[r] = dot_i8_scalar(j->t, wr, j->nb, j->xq);
            continue;
        }
#if QK_X86
        if (j->level == 2) {
            j->y[r] = dot_avx512(j->t, wr, j->nb, j->x, j->xs);
            continue;
        }
        if (j->level >= 1) {
            j->y[r] = dot_avx2(j->t, wr, j->nb, j->x, j->xs);
            continue;
        }
#endif
        j->y[r] = dot_scalar(j->t, wr, j->nb, j->x, j->xs);
    }
}

/* M > 1 with int16 activations: every x row quantized up front; Q8_0/Q4_0/Q4_1 weight rows
 * meet 4 x rows at a time (AVX2), other types and paths one x row at a time */
static void multi16_job(void *a, int tid, int nth) {
    job_t *j = a;
    int64_t r0, r1, n32 = j->k / 32;
    rows_of(j->n, tid, nth, &r0, &r1);
    float out4[4];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = j->w + r * j->row_bytes;
        for (int64_t mi = 0; mi < j->m; mi += 4) {
#if QK_X86
            if (j->level >= 1 && (j->t == T_Q8_0 || j->t == T_Q4_0 || j->t == T_Q4_1)) {
                dot4_i16_avx2(j->t, wr, j->nb, j->x16 + mi * n32, j->xs + mi * n32, n32, out4);
                for (int i = 0; i < 4 && mi + i < j->m; i++) j->y[(mi + i) * j->ldy + r] = out4[i];
                continue;
            }
#endif
            for (int i = 0; i < 4 && mi + i < j->m; i++) {
                const x16_block *xq = j->x16 + (mi + i) * n32;
                const float *xs = j->xs + (mi + i) * n32;
#if QK_X86
                if (j->level >= 1) {
                    j->y[(mi + i) * j->ldy + r] = dot_i16_avx2(j->t, wr, j->nb, xq, xs);
                    continue;
                }
#endif
                j->y[(mi + i) * j->ldy + r] = dot_i16_scalar(j->t, wr, j->nb, xq, xs);
            }
        }
    }
}

/* M > 1: dequantize 4 rows at a time into a scratch and dot them with every x row */
static void tiled_job(void *a, int tid, int nth) {
    job_t *j = a;
    int64_t r0, r1;
    rows_of(j->n, tid, nth, &r0, &r1);
    if (r0 >= r1) return;
    float *scr = aligned_alloc(64, (size_t)(4 * j->k * sizeof(float) + 64) & ~(size_t)63);
    if (!scr) {
        j->failed = 1;
        return;
    }
    float out4[4];
    for (int64_t r = r0; r < r1; r += 4) {
        int rows = r1 - r < 4 ? (int)(r1 - r) : 4;
        for (int i = 0; i < 4; i++) {
            if (i < rows) {
#if QK_X86
                if (j->level >= 1)
                    deq_avx2(j->t, j->w + (r + i) * j->row_bytes, j->nb, scr + i * j->k);
                else
#endif
                    deq_scalar(j->t, j->w + (r + i) * j->row_bytes, j->nb, scr + i * j->k);
            } else {
                memset(scr + i * j->k, 0, j->k * sizeof(float));
            }
        }
        for (int64_t mi = 0; mi < j->m; mi++) {
#if QK_X86
            if (j->level >= 1)
                dot4_f32_avx2(j->x + mi * j->ldx, scr, j->k, out4);
            else
#endif
                dot4_f32_scalar(j->x + mi * j->ldx, scr, j->k, out4);
            for (int i = 0; i < rows; i++) j->y[mi * j->ldy + r + i] = out4[i];
        }
    }
    free(scr);
}

static void deq_job(void *a, int tid, int nth) {
    job_t *j = a;
    int64_t r0, r1;
    rows_of(j->n, tid, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
#if QK_X86
        if (j->level >= 1) {
            deq_avx2(j->t, j->w + r * j->row_bytes, j->nb, j->y + r * j->ldy);
            continue;
        }
#endif
        deq_scalar(j->t, j->w + r * j->row_bytes, j->nb, j->y + r * j->ldy);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Interleaved "x8" layout (Q4_0, Q4_1, Q5_0, Q8_0), made once at load by qk_repack_x8: 8 weight rows'
 * blocks side by side, so one AVX2 pass computes 8 outputs, one per 32-bit lane, with no
 * horizontal sums and the 8 rows' scales loaded as one vector. Rows are grouped by 8 (the last
 * group padded with zero rows); group g, block b is GB bytes at (g * nb + b) * GB:
 *   fp16 d[8] | Q4_1 only: fp16 m[8] | payload
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
 * Activations: int16 per 32 values (x16_block) as the row-layout int16 path, with integer sums
 * of the int16 activations per block for Q4_0's offset (sum (q-8)x = sum qx - 8 sum x) and the
 * exact float sums for Q4_1's min. */

static int x8_group_bytes(int t) {
    return t == T_Q4_0 ? 144 : t == T_Q4_1 ? 160 : t == T_Q8_0 ? 272 : t == T_Q5_0 ? 176
         : t == T_Q4_K ? 1184 : t == T_Q6_K ? 1680 : 0;
}
/* values per x8 block (a group's unit along K) */
static int x8_block_vals(int t) { return t == T_Q4_K || t == T_Q6_K ? 256 : 32; }
static int x8_payload(int t) { return t == T_Q4_1 ? 32 : 16; }

/* the nibbles 0..15 of row r in a 128-byte Q4 x8 payload p (v[32]), and back */
static void nib_unpack(const uint8_t *p, int r, int *v) {
    for (int c = 0; c < 4; c++) {
        const uint8_t *l = p + c * 32 + r * 4;
        unsigned w0 = l[0] | (unsigned)l[1] << 8, w1 = l[2] | (unsigned)l[3] << 8;
        for (int i = 0; i < 4; i++) {
            v[8 * c + 2 * i] = (w0 >> (4 * i)) & 0xF;
            v[8 * c + 2 * i + 1] = (w1 >> (4 * i)) & 0xF;
        }
    }
}

static void nib_pack(uint8_t *p, int r, const int *v) {
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

/* the 32 stored integers (nibbles 0..15, or int8) of row r of one x8 block group */
static void x8_unpack_row(int t, const uint8_t *g, int r, int *v) {
    const uint8_t *p = g + x8_payload(t);
    if (t == T_Q5_0) {
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
        return;
    }
    if (t == T_Q8_0) {
        for (int c = 0; c < 8; c++) {
            const int8_t *l = (const int8_t *)(p + c * 32 + r * 4);
            v[4 * c] = l[0];
            v[4 * c + 2] = l[1];
            v[4 * c + 1] = l[2];
            v[4 * c + 3] = l[3];
        }
        return;
    }
    nib_unpack(p, r, v);
}

/* the 32 stored integers of one row-layout block */
static void row_unpack(int t, const uint8_t *blk, int *v) {
    if (t == T_Q5_0) {
        q5_0_vals(blk, v);
        return;
    }
    if (t == T_Q8_0) {
        for (int j = 0; j < 32; j++) v[j] = ((const int8_t *)(blk + 2))[j];
        return;
    }
    const uint8_t *qs = blk + (t == T_Q4_1 ? 4 : 2);
    for (int j = 0; j < 16; j++) {
        v[j] = qs[j] & 0xF;
        v[j + 16] = qs[j] >> 4;
    }
}

static void x8_pack_row(int t, uint8_t *g, int r, const int *v) {
    uint8_t *p = g + x8_payload(t);
    if (t == T_Q5_0) {
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
        return;
    }
    if (t == T_Q8_0) {
        for (int c = 0; c < 8; c++) {
            uint8_t *l = p + c * 32 + r * 4;
            l[0] = (uint8_t)v[4 * c];
            l[1] = (uint8_t)v[4 * c + 2];
            l[2] = (uint8_t)v[4 * c + 1];
            l[3] = (uint8_t)v[4 * c + 3];
        }
        return;
    }
    nib_pack(p, r, v);
}

static void row_pack(int t, uint8_t *blk, const int *v) {
    if (t == T_Q5_0) {
        uint32_t qh = 0;
        for (int j = 0; j < 32; j++) qh |= (uint32_t)(v[j] >> 4) << j;
        for (int i = 0; i < 4; i++) blk[2 + i] = (uint8_t)(qh >> (8 * i));
        for (int j = 0; j < 16; j++) blk[6 + j] = (uint8_t)((v[j] & 0xF) | (v[j + 16] & 0xF) << 4);
        return;
    }
    if (t == T_Q8_0) {
        for (int j = 0; j < 32; j++) blk[2 + j] = (uint8_t)v[j];
        return;
    }
    uint8_t *qs = blk + (t == T_Q4_1 ? 4 : 2);
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(v[j] | v[j + 16] << 4);
}

/* scalar: 8 outputs of group gp for one x row (out[8]) */
static void x8_dot_scalar(int t, const uint8_t *gp, int64_t nb, const x16_block *xq,
                          const float *xs, const int32_t *xi, float *out) {
    const int gb = x8_group_bytes(t);
    int v[32];
    for (int r = 0; r < 8; r++) out[r] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = gp + b * gb;
        for (int r = 0; r < 8; r++) {
            x8_unpack_row(t, p, r, v);
            int32_t s = 0;
            for (int j = 0; j < 32; j++) s += v[j] * xq[b].q[j];
            if (t == T_Q4_0) s -= 8 * xi[b];
            if (t == T_Q5_0) s -= 16 * xi[b];
            out[r] += h2f(p + 2 * r) * xq[b].d * (float)s;
            if (t == T_Q4_1) out[r] += h2f(p + 16 + 2 * r) * xs[b];
        }
    }
}

/* K-quants in the x8 layout (Q4_K, Q6_K): per 8 rows and 256-value super-block, a header then
 * 8 sub-blocks of 32 values whose 4-bit parts use the Q4 nibble arrangement above.
 *   Q4_K (1184 bytes, the file's 8 x 144 plus 32): fp16 d[8] | fp16 dmin[8] | u8 sc[8 sub][8 rows]
 *     | u8 mn[8 sub][8 rows] (the 6-bit scales and mins unpacked) | 8 x 128-byte nibble payloads.
 *     x = (d*sc[s]) q - (dmin*mn[s]): the reference's float products, exact.
 *   Q6_K (1680 bytes = 8 x 210): fp16 d[8] | int8 sc[16][8 rows] | 8 x (128-byte payload of the
 *     low 4 bits | 64 bytes of high 2 bits: vector h covers chunks 2h, 2h+1; lane r's word 0 holds
 *     values 8c+2i at bits 2(4(c-2h)+i), word 1 values 8c+2i+1). x = (d*sc) (q - 32), one scale
 *     per 16 values: chunks 0-1 and 2-3 of a sub-block are summed apart.
 * The header keeps every bit of the file's scales: unpacking gives the file's rows byte for byte. */

static int x8_is_k(int t) { return t == T_Q4_K || t == T_Q6_K; }

/* the high 2 bits of row r's 32 values in a 64-byte Q6_K high plane (v[32] |= hi << 4), and back */
static void hi2_unpack(const uint8_t *p, int r, int *v) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *l = p + h * 32 + r * 4;
        unsigned w0 = l[0] | (unsigned)l[1] << 8, w1 = l[2] | (unsigned)l[3] << 8;
        for (int c = 2 * h; c < 2 * h + 2; c++)
            for (int i = 0; i < 4; i++) {
                int pos = 2 * (4 * (c - 2 * h) + i);
                v[8 * c + 2 * i] |= ((w0 >> pos) & 3) << 4;
                v[8 * c + 2 * i + 1] |= ((w1 >> pos) & 3) << 4;
            }
    }
}

static void hi2_pack(uint8_t *p, int r, const int *v) {
    for (int h = 0; h < 2; h++) {
        unsigned w0 = 0, w1 = 0;
        for (int c = 2 * h; c < 2 * h + 2; c++)
            for (int i = 0; i < 4; i++) {
                int pos = 2 * (4 * (c - 2 * h) + i);
                w0 |= (unsigned)((v[8 * c + 2 * i] >> 4) & 3) << pos;
                w1 |= (unsigned)((v[8 * c + 2 * i + 1] >> 4) & 3) << pos;
            }
        uint8_t *l = p + h * 32 + r * 4;
        l[0] = w0 & 0xFF;
        l[1] = w0 >> 8;
        l[2] = w1 & 0xFF;
        l[3] = w1 >> 8;
    }
}

/* one row-layout super-block <-> its integers: q[256] (Q4_K 0..15, Q6_K 0..63), sc (Q4_K 8 scales
 * 0..63, Q6_K 16 int8 scales), mn (Q4_K 8 mins); the fp16 d (and dmin) are copied as bytes */
static void krow_unpack(int t, const uint8_t *blk, int *q, int *sc, int *mn) {
    if (t == T_Q4_K) {
        for (int s = 0; s < 8; s++) k4_scale_min(s, blk + 4, &sc[s], &mn[s]);
        const uint8_t *qs = blk + 16;
        for (int pr = 0; pr < 4; pr++)
            for (int l = 0; l < 32; l++) {
                q[64 * pr + l] = qs[32 * pr + l] & 0xF;
                q[64 * pr + 32 + l] = qs[32 * pr + l] >> 4;
            }
        return;
    }
    const uint8_t *ql = blk, *qh = blk + 128;
    for (int s = 0; s < 16; s++) sc[s] = ((const int8_t *)(blk + 192))[s];
    for (int n = 0; n < 2; n++)
        for (int l = 0; l < 32; l++) {
            int *o = q + 128 * n;
            o[l] = (ql[64 * n + l] & 0xF) | ((qh[32 * n + l] >> 0) & 3) << 4;
            o[l + 32] = (ql[64 * n + l + 32] & 0xF) | ((qh[32 * n + l] >> 2) & 3) << 4;
            o[l + 64] = (ql[64 * n + l] >> 4) | ((qh[32 * n + l] >> 4) & 3) << 4;
            o[l + 96] = (ql[64 * n + l + 32] >> 4) | ((qh[32 * n + l] >> 6) & 3) << 4;
        }
}

static void krow_pack(int t, uint8_t *blk, const int *q, const int *sc, const int *mn) {
    if (t == T_Q4_K) {
        uint8_t *s = blk + 4;
        for (int j = 0; j < 4; j++) {
            s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
            s[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
            s[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | (mn[j + 4] & 0xF) << 4);
        }
        for (int pr = 0; pr < 4; pr++)
            for (int l = 0; l < 32; l++)
                blk[16 + 32 * pr + l] = (uint8_t)(q[64 * pr + l] | q[64 * pr + 32 + l] << 4);
        return;
    }
    for (int s = 0; s < 16; s++) blk[192 + s] = (uint8_t)(int8_t)sc[s];
    for (int n = 0; n < 2; n++)
        for (int l = 0; l < 32; l++) {
            const int *o = q + 128 * n;
            blk[64 * n + l] = (uint8_t)((o[l] & 0xF) | (o[l + 64] & 0xF) << 4);
            blk[64 * n + l + 32] = (uint8_t)((o[l + 32] & 0xF) | (o[l + 96] & 0xF) << 4);
            blk[128 + 32 * n + l] = (uint8_t)((o[l] >> 4) | (o[l + 32] >> 4) << 2 |
                                              (o[l + 64] >> 4) << 4 | (o[l + 96] >> 4) << 6);
        }
}

/* row r of an x8 super-block group <-> the same integers */
static void x8k_unpack_row(int t, const uint8_t *g, int r, int *q, int *sc, int *mn) {
    if (t == T_Q4_K) {
        for (int s = 0; s < 8; s++) {
            sc[s] = g[32 + 8 * s + r];
            mn[s] = g[96 + 8 * s + r];
            nib_unpack(g + 160 + 128 * s, r, q + 32 * s);
        }
        return;
    }
    for (int s = 0; s < 16; s++) sc[s] = ((const int8_t *)g)[16 + 8 * s + r];
    for (int s = 0; s < 8; s++) {
        nib_unpack(g + 144 + 192 * s, r, q + 32 * s);
        hi2_unpack(g + 144 + 192 * s + 128, r, q + 32 * s);
    }
}

static void x8k_pack_row(int t, uint8_t *g, int r, const int *q, const int *sc, const int *mn) {
    if (t == T_Q4_K) {
        for (int s = 0; s < 8; s++) {
            g[32 + 8 * s + r] = (uint8_t)sc[s];
            g[96 + 8 * s + r] = (uint8_t)mn[s];
            nib_pack(g + 160 + 128 * s, r, q + 32 * s);
        }
        return;
    }
    for (int s = 0; s < 16; s++) g[16 + 8 * s + r] = (uint8_t)(int8_t)sc[s];
    for (int s = 0; s < 8; s++) {
        nib_pack(g + 144 + 192 * s, r, q + 32 * s);
        hi2_pack(g + 144 + 192 * s + 128, r, q + 32 * s);
    }
}

/* dequantized row r of one x8 super-block group (out[256]), the reference's float products */
static void x8k_deq_row(int t, const uint8_t *g, int r, float *out) {
    int q[256], sc[16], mn[8];
    x8k_unpack_row(t, g, r, q, sc, mn);
    float d = h2f(g + 2 * r);
    if (t == T_Q4_K) {
        float dmin = h2f(g + 16 + 2 * r);
        for (int s = 0; s < 8; s++) {
            float ds = d * sc[s], ms = dmin * mn[s];
            for (int l = 0; l < 32; l++) out[32 * s + l] = ds * q[32 * s + l] - ms;
        }
        return;
    }
    for (int i = 0; i < 256; i++) out[i] = d * sc[i / 16] * (q[i] - 32);
}

/* scalar: 8 outputs of group gp (nb super-blocks) for one x row */
static void x8k_dot_scalar(int t, const uint8_t *gp, int64_t nb, const x16_block *xq,
                           const float *xs, float *out) {
    const int gb = t == T_Q4_K ? 1184 : 1680;
    int q[256], sc[16], mn[8];
    for (int r = 0; r < 8; r++) out[r] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *g = gp + b * gb;
        for (int r = 0; r < 8; r++) {
            x8k_unpack_row(t, g, r, q, sc, mn);
            float d = h2f(g + 2 * r), acc = 0.0f;
            for (int s = 0; s < 8; s++) {
                const x16_block *xb = &xq[b * 8 + s];
                if (t == T_Q4_K) {
                    int32_t si = 0;
                    for (int l = 0; l < 32; l++) si += q[32 * s + l] * xb->q[l];
                    acc += d * sc[s] * xb->d * (float)si - h2f(g + 16 + 2 * r) * mn[s] * xs[b * 8 + s];
                } else {
                    int32_t s0 = 0, s1 = 0;
                    for (int l = 0; l < 16; l++) {
                        s0 += (q[32 * s + l] - 32) * xb->q[l];
                        s1 += (q[32 * s + 16 + l] - 32) * xb->q[16 + l];
                    }
                    acc += d * xb->d * ((float)sc[2 * s] * s0 + (float)sc[2 * s + 1] * s1);
                }
            }
            out[r] += acc;
        }
    }
}

#if QK_X86
AVX2 static inline __m256i bcast_pair(const int16_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Software prefetch of the weight stream X8_PF bytes ahead (-D to experiment; 0: none). A
 * batch-1 GEMV on the AVX2 EPYC computes at ~30 GB/s from L2 but reads ~10 GB/s from memory,
 * where a plain read loop reaches ~13: the hardware prefetcher alone keeps too few lines in
 * flight for one core. The layout is one sequential stream (groups, then blocks, back to
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
        const int gb = t == T_Q4_0 ? 144 : t == T_Q4_1 ? 160 : t == T_Q5_0 ? 176 : 272;    \
        const int po = t == T_Q4_1 ? 32 : 16;                                                \
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
            if (t == T_Q5_0) {                                                               \
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
            __m256 m8 = t == T_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16))) \
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
                if (t == T_Q4_1)                                                             \
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
#define VNNI __attribute__((target("avx512f,avx512vl,avx512vnni,avx2,fma,f16c")))
#define MADD_VNNI(s, a, b) _mm256_dpwssd_epi32((s), (a), (b))
/* the same in two instructions: hb | (v >> (15 - c) & (1 << c)) as one ternary-logic op */
#define SPARE_VNNI(hb, v, c)                                                                  \
    _mm256_ternarylogic_epi32((hb), _mm256_srli_epi16((v), 15 - (c)), _mm256_set1_epi16(1 << (c)), 0xF8)
X8_KERNEL(x8_kernel_vnni, VNNI, MADD_VNNI, SPARE_VNNI, X8_NA_VNNI, 2)

/* one instantiation per (type, MR) so the loops above unroll with constants */
#define X8_CASES(KERNEL)                                                                      \
    switch (t * 8 + mr) {                                                                    \
    case T_Q4_0 * 8 + 1: KERNEL(T_Q4_0, gp, nb, xq, xs, xi, n32, 1, out); break;            \
    case T_Q4_0 * 8 + 2: KERNEL(T_Q4_0, gp, nb, xq, xs, xi, n32, 2, out); break;            \
    case T_Q4_0 * 8 + 3: KERNEL(T_Q4_0, gp, nb, xq, xs, xi, n32, 3, out); break;            \
    case T_Q4_0 * 8 + 4: KERNEL(T_Q4_0, gp, nb, xq, xs, xi, n32, 4, out); break;            \
    case T_Q4_1 * 8 + 1: KERNEL(T_Q4_1, gp, nb, xq, xs, xi, n32, 1, out); break;            \
    case T_Q4_1 * 8 + 2: KERNEL(T_Q4_1, gp, nb, xq, xs, xi, n32, 2, out); break;            \
    case T_Q4_1 * 8 + 3: KERNEL(T_Q4_1, gp, nb, xq, xs, xi, n32, 3, out); break;            \
    case T_Q4_1 * 8 + 4: KERNEL(T_Q4_1, gp, nb, xq, xs, xi, n32, 4, out); break;            \
    case T_Q8_0 * 8 + 1: KERNEL(T_Q8_0, gp, nb, xq, xs, xi, n32, 1, out); break;            \
    case T_Q8_0 * 8 + 2: KERNEL(T_Q8_0, gp, nb, xq, xs, xi, n32, 2, out); break;            \
    case T_Q8_0 * 8 + 3: KERNEL(T_Q8_0, gp, nb, xq, xs, xi, n32, 3, out); break;            \
    case T_Q8_0 * 8 + 4: KERNEL(T_Q8_0, gp, nb, xq, xs, xi, n32, 4, out); break;            \
    case T_Q5_0 * 8 + 1: KERNEL(T_Q5_0, gp, nb, xq, xs, xi, n32, 1, out); break;            \
    case T_Q5_0 * 8 + 2: KERNEL(T_Q5_0, gp, nb, xq, xs, xi, n32, 2, out); break;            \
    case T_Q5_0 * 8 + 3: KERNEL(T_Q5_0, gp, nb, xq, xs, xi, n32, 3, out); break;            \
    case T_Q5_0 * 8 + 4: KERNEL(T_Q5_0, gp, nb, xq, xs, xi, n32, 4, out); break;            \
    }

AVX2 static void x8_group_avx2(int t, const uint8_t *gp, int64_t nb, const x16_block *xq,
                               const float *xs, const int32_t *xi, int64_t n32, int mr,
                               float *out) {
    X8_CASES(x8_kernel_avx2)
}
VNNI static void x8_group_vnni(int t, const uint8_t *gp, int64_t nb, const x16_block *xq,
                               const float *xs, const int32_t *xi, int64_t n32, int mr,
                               float *out) {
    X8_CASES(x8_kernel_vnni)
}

/* Two x8 groups (16 weight rows) x MR x rows (M > 1: batched decode, prefill): every unpacked
 * weight vector feeds MR x rows and every broadcast activation pair two groups, so a chunk's
 * unpacking is shared by 2*MR integer dot products, and the 2*MR accumulators are independent
 * chains (vpdpwssd's latency hides behind them). The sums and the float steps per block are
 * the one-group kernel's (integer sums are exact in any order; the float updates run in the
 * same order), so the outputs are bit-identical to x8_kernel_* on each group. Both groups'
 * streams are prefetched X8_PF ahead, as the one-group kernel's (weights from memory, 2-core
 * Zen 3, in-process A/B: Q4_1 1.07-1.22x at M = 2..8, Q8_0 0.99-1.08x).
 * out[i*16 + r]: x row i, weight row r of the pair (0..7 group 0, 8..15 group 1). */
#define X8_TILE2(NAME, TARGET, MADD_ACC)                                                     \
    TARGET static inline __attribute__((always_inline)) void NAME(                          \
        const int t, const uint8_t *gp, int64_t nb, const x16_block *xq, const float *xs,   \
        const int32_t *xi, int64_t n32, const int MR, float *out) {                         \
        const int gb = t == T_Q4_0 ? 144 : t == T_Q4_1 ? 160 : t == T_Q5_0 ? 176 : 272;    \
        const int po = t == T_Q4_1 ? 32 : 16;                                                \
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
            if (t == T_Q5_0) {                                                               \
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
                if (t == T_Q4_1) {                                                           \
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

/* two groups from gp on (see X8_TILE2), mr 1..4 x rows */
AVX2 static void x8t2_avx2(int t, const uint8_t *gp, int64_t nb, const x16_block *xq,
                           const float *xs, const int32_t *xi, int64_t n32, int mr, float *out) {
    X8_CASES(x8t2_kernel_avx2)
}
VNNI static void x8t2_vnni(int t, const uint8_t *gp, int64_t nb, const x16_block *xq,
                           const float *xs, const int32_t *xi, int64_t n32, int mr, float *out) {
    X8_CASES(x8t2_kernel_vnni)
}
#undef X8_CASES

/* K-quants: 8 outputs of group gp (nb super-blocks) for MR x rows, out[i*8 + r]. NA integer
 * accumulators per x row and scale group at MR 1 (Q6_K sums the two 16-value halves apart). */
#define X8K_KERNEL(NAME, TARGET, MADD_ACC, NA1)                                               \
    TARGET static inline __attribute__((always_inline)) void NAME(                          \
        const int t, const uint8_t *gp, int64_t nb, const x16_block *xq, const float *xs,   \
        const int32_t *xi, const int32_t *xh, int64_t n32, const int MR, float *out) {      \
        const int q6 = t == T_Q6_K, gb = q6 ? 1680 : 1184;                                  \
        const int NA = MR == 1 ? NA1 : 1;                                                    \
        const __m256i m4 = _mm256_set1_epi16(0x0F), m30 = _mm256_set1_epi16(0x30);          \
        __m256 acc[4], accm[4];                                                              \
        for (int i = 0; i < 4; i++) acc[i] = accm[i] = _mm256_setzero_ps();                  \
        for (int64_t b = 0; b < nb; b++) {                                                   \
            const uint8_t *p = gp + b * gb;                                                  \
            const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));         \
            const __m256 dm8 = q6 ? d8 : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16))); \
            for (int sb = 0; sb < 8; sb++) {                                                 \
                const uint8_t *q = p + (q6 ? 144 + 192 * sb : 160 + 128 * sb);               \
                const int64_t xb = b * 8 + sb;                                               \
                X8_PREFETCH(p, sb * gb / 8 / 64 * 64, (sb + 1) * gb / 8);                    \
                __m256i s[4][2][4];                                                          \
                for (int i = 0; i < MR; i++)                                                 \
                    for (int hf = 0; hf < 2; hf++)                                           \
                        for (int a = 0; a < NA; a++) s[i][hf][a] = _mm256_setzero_si256();   \
                for (int c = 0; c < 4; c++) {                                                \
                    __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * c));           \
                    __m256i hv = q6 ? _mm256_loadu_si256((const __m256i *)(q + 128 + 32 * (c / 2))) \
                                    : v;                                                     \
                    for (int h = 0; h < 4; h++) {                                            \
                        __m256i u = h == 3 ? _mm256_srli_epi16(v, 12)                        \
                                           : _mm256_and_si256(h ? _mm256_srli_epi16(v, 4 * h) : v, m4); \
                        if (q6) {                                                            \
                            const int pos = 2 * (4 * (c % 2) + h);                           \
                            __m256i hb = pos >= 4 ? _mm256_srli_epi16(hv, pos - 4)          \
                                                  : _mm256_slli_epi16(hv, 4 - pos);          \
                            u = _mm256_or_si256(u, _mm256_and_si256(hb, m30));               \
                        }                                                                    \
                        const int hf = q6 ? c / 2 : 0, a = (4 * c + h) % NA;                 \
                        for (int i = 0; i < MR; i++)                                         \
                            s[i][hf][a] = MADD_ACC(s[i][hf][a], u,                           \
                                                   bcast_pair(xq[i * n32 + xb].q + 8 * c + 2 * h)); \
                    }                                                                        \
                }                                                                            \
                if (q6) {                                                                    \
                    const __m256 scA = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(             \
                        _mm_loadl_epi64((const __m128i *)(p + 16 + 16 * sb))));             \
                    const __m256 scB = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(             \
                        _mm_loadl_epi64((const __m128i *)(p + 24 + 16 * sb))));             \
                    const __m256 dA = _mm256_mul_ps(d8, scA), dB = _mm256_mul_ps(d8, scB);   \
                    for (int i = 0; i < MR; i++) {                                           \
                        __m256i sa = s[i][0][0], sbb = s[i][1][0];                           \
                        for (int a = 1; a < NA; a++) {                                       \
                            sa = _mm256_add_epi32(sa, s[i][0][a]);                           \
                            sbb = _mm256_add_epi32(sbb, s[i][1][a]);                         \
                        }                                                                    \
                        const int32_t h0 = xh[i * n32 + xb], h1 = xi[i * n32 + xb] - h0;     \
                        sa = _mm256_sub_epi32(sa, _mm256_set1_epi32(32 * h0));               \
                        sbb = _mm256_sub_epi32(sbb, _mm256_set1_epi32(32 * h1));             \
                        const __m256 xd = _mm256_set1_ps(xq[i * n32 + xb].d);                \
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), _mm256_mul_ps(dA, xd), acc[i]); \
                        accm[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sbb), _mm256_mul_ps(dB, xd), accm[i]); \
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

X8K_KERNEL(x8k_kernel_avx2, AVX2, MADD_AVX2, 2)
X8K_KERNEL(x8k_kernel_vnni, VNNI, MADD_VNNI, 2)

#define X8K_CASES(KERNEL)                                                                     \
    switch (t * 8 + mr) {                                                                    \
    case T_Q4_K * 8 + 1: KERNEL(T_Q4_K, gp, nb, xq, xs, xi, xh, n32, 1, out); break;        \
    case T_Q4_K * 8 + 2: KERNEL(T_Q4_K, gp, nb, xq, xs, xi, xh, n32, 2, out); break;        \
    case T_Q4_K * 8 + 3: KERNEL(T_Q4_K, gp, nb, xq, xs, xi, xh, n32, 3, out); break;        \
    case T_Q4_K * 8 + 4: KERNEL(T_Q4_K, gp, nb, xq, xs, xi, xh, n32, 4, out); break;        \
    case T_Q6_K * 8 + 1: KERNEL(T_Q6_K, gp, nb, xq, xs, xi, xh, n32, 1, out); break;        \
    case T_Q6_K * 8 + 2: KERNEL(T_Q6_K, gp, nb, xq, xs, xi, xh, n32, 2, out); break;        \
    case T_Q6_K * 8 + 3: KERNEL(T_Q6_K, gp, nb, xq, xs, xi, xh, n32, 3, out); break;        \
    case T_Q6_K * 8 + 4: KERNEL(T_Q6_K, gp, nb, xq, xs, xi, xh, n32, 4, out); break;        \
    }

AVX2 static void x8k_group_avx2(int t, const uint8_t *gp, int64_t nb, const x16_block *xq,
                                const float *xs, const int32_t *xi, const int32_t *xh,
                                int64_t n32, int mr, float *out) {
    X8K_CASES(x8k_kernel_avx2)
}
VNNI static void x8k_group_vnni(int t, const uint8_t *gp, int64_t nb, const x16_block *xq,
                                const float *xs, const int32_t *xi, const int32_t *xh,
                                int64_t n32, int mr, float *out) {
    X8K_CASES(x8k_kernel_vnni)
}
#undef X8K_CASES

static int have_vnni(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = have_avx512() && __builtin_cpu_supports("avx512vl") &&
                 __builtin_cpu_supports("avx512vnni");
    }
    return cached;
}
#endif

typedef struct {
    int t, level;
    const uint8_t *w; /* x8 groups */
    int64_t n, nb, ngroups, n32, m;
    const x16_block *xq;
    const float *xs;
    const int32_t *xi;
    float *y;
    int64_t ldy;
    float *deq; /* dequantize: out [n, ldo] */
    int64_t ldo;
    const int32_t *xh; /* integer sums of the first 16 int16 activations per 32 (Q6_K) */
} x8_job_t;

/* groups of chunk c out of nchunks: contiguous, an even number of groups (16 rows, 64 bytes of
 * y per x row) except the last, so two threads never write one cache line of y */
static void x8_groups_of(int64_t ngroups, int c, int nchunks, int64_t *g0, int64_t *g1) {
    int64_t per = ((ngroups + nchunks - 1) / nchunks + 1) & ~(int64_t)1;
    *g0 = per * c < ngroups ? per * c : ngroups;
    *g1 = per * (c + 1) < ngroups ? per * (c + 1) : ngroups;
}

/* x rows from which the two-group tile (X8_TILE2) computes M > 1 (qk_set_x8_tile; a large
 * value keeps the one-group kernel for every M: A/B and the bit-identity tests). Weights from
 * memory on the 2-core Zen 3 (SmolLM2's 3072 x 576, one and two threads, in-process A/B): at
 * M = 2 the one-group kernel took 0.60-0.83x the tile's time (the tile cost about what it
 * costs at M = 3-4), at M = 3 0.75-1.05x, at M >= 4 the tile is ahead (up to 1.25x at M = 8). */
static _Atomic int64_t x8_tile_min_m = 3;

/* the int16 activations of M-blocks of this many x rows (76 bytes per 32 values with their
 * sums) fill about 256 KiB, so they stay in L2 while a chunk's weight groups pass them */
static int64_t x8_m_block(int64_t m, int64_t n32) {
    int64_t mc = (262144 / (n32 * 76)) & ~(int64_t)3;
    mc = mc < 16 ? 16 : mc;
    return m < mc ? m : mc;
}

static void x8_matmul_job(void *a, int c, int nchunks) {
    x8_job_t *j = a;
    int64_t g0, g1;
    x8_groups_of(j->ngroups, c, nchunks, &g0, &g1);
    const int64_t gsz = j->nb * x8_group_bytes(j->t);
    /* the two-group tile covers the 32-value types; K-quants run one group at a time */
    const int tile = !x8_is_k(j->t) &&
                     j->m >= atomic_load_explicit(&x8_tile_min_m, memory_order_relaxed);
    const int64_t mc = x8_m_block(j->m, j->n32);
    float out[64];
    for (int64_t m0 = 0; m0 < j->m; m0 += mc) {
        const int64_t m1 = m0 + mc < j->m ? m0 + mc : j->m;
        for (int64_t g = g0; g < g1;) {
            const uint8_t *gp = j->w + g * gsz;
            const int ng = tile && g + 1 < g1 ? 2 : 1; /* groups this pass computes */
            int64_t left = j->n - g * 8;
            int rows = left < 8 * ng ? (int)left : 8 * ng;
            for (int64_t mi = m0; mi < m1; mi += 4) {
                int mr = m1 - mi < 4 ? (int)(m1 - mi) : 4;
                const x16_block *xq = j->xq + mi * j->n32;
                const float *xs = j->xs + mi * j->n32;
                const int32_t *xi = j->xi + mi * j->n32;
                if (x8_is_k(j->t)) {
                    const int32_t *xh = j->xh + mi * j->n32;
#if QK_X86
                    if (j->level >= 2 && have_vnni())
                        x8k_group_vnni(j->t, gp, j->nb, xq, xs, xi, xh, j->n32, mr, out);
                    else if (j->level >= 1)
                        x8k_group_avx2(j->t, gp, j->nb, xq, xs, xi, xh, j->n32, mr, out);
                    else
#endif
                        for (int i = 0; i < mr; i++)
                            x8k_dot_scalar(j->t, gp, j->nb, xq + i * j->n32, xs + i * j->n32,
                                           out + 8 * i);
                } else
#if QK_X86
                if (ng == 2 && j->level >= 2 && have_vnni())
                    x8t2_vnni(j->t, gp, j->nb, xq, xs, xi, j->n32, mr, out);
                else if (ng == 2 && j->level >= 1)
                    x8t2_avx2(j->t, gp, j->nb, xq, xs, xi, j->n32, mr, out);
                else if (ng == 2)
#else
                if (ng == 2)
#endif
                    for (int i = 0; i < mr; i++)
                        for (int e = 0; e < 2; e++)
                            x8_dot_scalar(j->t, gp + e * gsz, j->nb, xq + i * j->n32,
                                          xs + i * j->n32, xi + i * j->n32, out + 16 * i + 8 * e);
#if QK_X86
                else if (j->level >= 2 && have_vnni())
                    x8_group_vnni(j->t, gp, j->nb, xq, xs, xi, j->n32, mr, out);
                else if (j->level >= 1)
                    x8_group_avx2(j->t, gp, j->nb, xq, xs, xi, j->n32, mr, out);
#endif
                else
                    for (int i = 0; i < mr; i++)
                        x8_dot_scalar(j->t, gp, j->nb, xq + i * j->n32, xs + i * j->n32,
                                      xi + i * j->n32, out + 8 * ng * i);
                for (int i = 0; i < mr; i++) {
                    float *yr = j->y + (mi + i) * j->ldy + g * 8;
                    memcpy(yr, out + 8 * ng * i, (size_t)rows * sizeof(float));
                }
            }
            g += ng;
        }
    }
}

/* row r (0..7) of the x8 group block at p, dequantized into o (one block's values) */
static void x8_deq_block_row(int t, const uint8_t *p, int r, float *o) {
    if (x8_is_k(t)) {
        x8k_deq_row(t, p, r, o);
        return;
    }
    int v[32];
    float d = h2f(p + 2 * r), mn = t == T_Q4_1 ? h2f(p + 16 + 2 * r) : 0.0f;
    float off = t == T_Q4_0 ? 8.0f : t == T_Q5_0 ? 16.0f : 0.0f;
    x8_unpack_row(t, p, r, v);
    for (int i = 0; i < 32; i++) o[i] = d * ((float)v[i] - off) + mn;
}

static void x8_deq_job(void *a, int c, int nchunks) {
    x8_job_t *j = a;
    int64_t g0, g1;
    x8_groups_of(j->ngroups, c, nchunks, &g0, &g1);
    const int gb = x8_group_bytes(j->t), bv = x8_block_vals(j->t);
    for (int64_t g = g0; g < g1; g++) {
        int rows = j->n - g * 8 < 8 ? (int)(j->n - g * 8) : 8;
        for (int64_t b = 0; b < j->nb; b++)
            for (int r = 0; r < rows; r++)
                x8_deq_block_row(j->t, j->w + (g * j->nb + b) * gb, r,
                                 j->deq + (g * 8 + r) * j->ldo + b * bv);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* exported API */

int qk_version(void) { return QK_VERSION; }

/* best level this CPU runs: 0 scalar, 1 AVX2+FMA+F16C, 2 AVX-512F (+ the AVX2 set) */
static _Atomic int max_level = 2; /* qk_set_max_level: a cap for A/B (AIOENGINE_QUANT_ISA) */
int qk_best_level(void) {
    int best = have_avx512() ? 2 : have_avx2() ? 1 : 0, cap = atomic_load(&max_level);
    return best < cap ? best : cap;
}

/* cap every call's code path at level (0 scalar, 1 AVX2, 2 AVX-512): forcing the AVX2 path on an
 * AVX-512 machine measures what AVX2-only CPUs run */
void qk_set_max_level(int level) { atomic_store(&max_level, level < 0 ? 0 : level > 2 ? 2 : level); }

void qk_set_spin_ns(long ns) { atomic_store(&pool_spin_ns, ns); }

/* M from which x8 products use the two-group tile (A/B; a large value: never) */
void qk_set_x8_tile(int64_t min_m) { atomic_store(&x8_tile_min_m, min_m < 1 ? 1 : min_m); }
int64_t qk_x8_tile(void) { return atomic_load(&x8_tile_min_m); }

int qk_pool_size(void) { return pool_size; }

static int check(int t, int64_t n, int64_t k, int64_t row_bytes, int nthreads, int *level,
                 int64_t *nb) {
    qinfo qi;
    if (!type_info(t, &qi)) return E_TYPE;
    if (n < 0 || k <= 0 || k % qi.block) return E_SHAPE;
    *nb = k / qi.block;
    if (row_bytes != *nb * qi.bytes) return E_ROWBYTES;
    if (nthreads < 1 || nthreads > 256) return E_THREADS;
    if (*level < 0) *level = qk_best_level();
    if (*level > qk_best_level()) return E_LEVEL;
    return E_OK;
}

/* y[m, ldy] (columns 0..n) = x[m, ldx] (columns 0..k) @ W^T; level -1: best for this CPU. */
/* act: 0 float32 activations, 1 int8 (q8_0/q4_0/q4_1 only), 2 int16 */
int qk_matmul(int t, const float *x, int64_t ldx, int64_t m, const uint8_t *w, int64_t row_bytes,
              int64_t n, int64_t k, float *y, int64_t ldy, int nthreads, int level, int act8) {
    int64_t nb;
    int rc = check(t, n, k, row_bytes, nthreads, &level, &nb);
    if (rc) return rc;
    if (t == T_Q5_0) level = 0; /* Q5_0 rows: scalar only (the engine runs Q5_0 in x8) */
    if (m < 0 || ldx < k || ldy < n) return E_SHAPE;
    if (act8 < 0 || act8 > 2) return E_ACT8;
    if (act8 == 1 && t != T_Q8_0 && t != T_Q4_0 && t != T_Q4_1) return E_ACT8;
    if (m == 0 || n == 0) return E_OK;
    job_t j = {t, level, x, ldx, m, w, row_bytes, n, k, nb, y, ldy, NULL, 0, NULL, NULL, 0};
    if ((int64_t)nthreads * 4 > n) nthreads = (int)((n + 3) / 4) > 0 ? (int)((n + 3) / 4) : 1;
    if (act8 == 2) { /* x's rows to int16 blocks and exact sums, then one job over W */
        int64_t n32 = k / 32, m4 = (m + 3) & ~(int64_t)3;
        x16_block *xq = calloc(m4 * n32, sizeof(x16_block)); /* padding rows: zeros */
        float *xs = calloc(m4 * n32, sizeof(float));
        if (!xq || !xs) {
            free(xq);
            free(xs);
            return E_NOMEM;
        }
        for (int64_t mi = 0; mi < m; mi++) {
            const float *xr = x + mi * ldx;
            quantize_x16(xr, n32, xq + mi * n32);
            for (int64_t b = 0; b < n32; b++) {
                float s = 0.0f;
                for (int i = 0; i < 32; i++) s += xr[b * 32 + i];
                xs[mi * n32 + b] = s;
            }
        }
        j.x16 = xq;
        j.xs = xs;
        j.m4 = m4;
        if (m == 1)
            pool_run(gemv_job, &j, chunks_for(n, nthreads), nthreads);
        else
            pool_run(multi16_job, &j, chunks_for(n, nthreads), nthreads);
        free(xq);
        free(xs);
        return E_OK;
    }
    if (act8) { /* row by row: quantize x's row, one GEMV */
        xq_block *xq = malloc(nb * sizeof(xq_block));
        if (!xq) return E_NOMEM;
        for (int64_t mi = 0; mi < m; mi++) {
            quantize_x(x + mi * ldx, nb, xq);
            job_t r = j;
            r.x = x + mi * ldx;
            r.y = y + mi * ldy;
            r.xq = xq;
            pool_run(gemv_job, &r, chunks_for(n, nthreads), nthreads);
        }
        free(xq);
        return E_OK;
    }
    if (m == 1) {
        int64_t ns = k / 32;
        float *xs = malloc(ns * sizeof(float));
        if (!xs) return E_NOMEM;
        for (int64_t b = 0; b < ns; b++) {
            float s = 0.0f;
            for (int i = 0; i < 32; i++) s += x[b * 32 + i];
            xs[b] = s;
        }
        j.xs = xs;
        if ((int64_t)nthreads * 4 > n) nthreads = (int)((n + 3) / 4) > 0 ? (int)((n + 3) / 4) : 1;
        pool_run(gemv_job, &j, chunks_for(n, nthreads), nthreads);
        free(xs);
        return E_OK;
    }
    if ((int64_t)nthreads * 4 > n) nthreads = (int)((n + 3) / 4) > 0 ? (int)((n + 3) / 4) : 1;
    pool_run(tiled_job, &j, chunks_for(n, nthreads), nthreads);
    return j.failed ? E_NOMEM : E_OK;
}

/* out[n, ldo] (columns 0..k) = the dequantized rows of W */
int qk_dequantize(int t, const uint8_t *w, int64_t row_bytes, int64_t n, int64_t k, float *out,
                  int64_t ldo, int nthreads, int level) {
    int64_t nb;
    int rc = check(t, n, k, row_bytes, nthreads, &level, &nb);
    if (rc) return rc;
    if (t == T_Q5_0) level = 0;
    if (ldo < k) return E_SHAPE;
    if (n == 0) return E_OK;
    job_t j = {t, level, NULL, 0, 0, w, row_bytes, n, k, nb, out, ldo, NULL, 0, NULL, NULL, 0};
    if ((int64_t)nthreads * 4 > n) nthreads = (int)((n + 3) / 4) > 0 ? (int)((n + 3) / 4) : 1;
    pool_run(deq_job, &j, chunks_for(n, nthreads), nthreads);
    return E_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* x8 layout API (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K) */

static int x8_check(int t, int64_t n, int64_t k, int nthreads, int *level) {
    if (!x8_group_bytes(t)) return E_TYPE;
    if (n < 0 || k <= 0 || k % x8_block_vals(t)) return E_SHAPE;
    if (nthreads < 1 || nthreads > 256) return E_THREADS;
    if (*level < 0) *level = qk_best_level();
    if (*level > qk_best_level()) return E_LEVEL;
    return E_OK;
}

/* bytes of the x8 layout of n rows of k values (0 for a type without one) */
int64_t qk_x8_bytes(int t, int64_t n, int64_t k) {
    if (!x8_group_bytes(t) || n < 0 || k <= 0 || k % x8_block_vals(t)) return 0;
    return (n + 7) / 8 * (k / x8_block_vals(t)) * x8_group_bytes(t);
}

/* row layout (n rows of row_bytes) -> x8 layout (qk_x8_bytes(t, n, k) bytes); dir 1: back */
int qk_repack_x8(int t, const uint8_t *src, int64_t row_bytes, int64_t n, int64_t k,
                 uint8_t *dst, int dir) {
    int level = 0;
    int rc = x8_check(t, n, k, 1, &level);
    if (rc) return rc;
    qinfo qi = {0, 0};
    type_info(t, &qi);
    int64_t nb = k / qi.block;
    if (row_bytes != nb * qi.bytes) return E_ROWBYTES;
    const int gb = x8_group_bytes(t);
    int v[32], kq[256], ksc[16], kmn[8];
    if (dir == 0) memset(dst, 0, (size_t)qk_x8_bytes(t, n, k));
    for (int64_t row = 0; row < n; row++) {
        int64_t g = row / 8;
        int r = (int)(row % 8);
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk = (uint8_t *)(dir ? dst : src) + row * row_bytes + b * qi.bytes;
            uint8_t *gp = (uint8_t *)(dir ? src : dst) + (g * nb + b) * gb;
            if (x8_is_k(t)) { /* fp16 d (and dmin): Q4_K at the block's start, Q6_K at 208 */
                int doff = t == T_Q4_K ? 0 : 208;
                if (dir == 0) {
                    memcpy(gp + 2 * r, blk + doff, 2);
                    if (t == T_Q4_K) memcpy(gp + 16 + 2 * r, blk + 2, 2);
                    krow_unpack(t, blk, kq, ksc, kmn);
                    x8k_pack_row(t, gp, r, kq, ksc, kmn);
                } else {
                    memcpy(blk + doff, gp + 2 * r, 2);
                    if (t == T_Q4_K) memcpy(blk + 2, gp + 16 + 2 * r, 2);
                    x8k_unpack_row(t, gp, r, kq, ksc, kmn);
                    krow_pack(t, blk, kq, ksc, kmn);
                }
                continue;
            }
            if (dir == 0) {
                memcpy(gp + 2 * r, blk, 2);
                if (t == T_Q4_1) memcpy(gp + 16 + 2 * r, blk + 2, 2);
                row_unpack(t, blk, v);
                x8_pack_row(t, gp, r, v);
            } else {
                memcpy(blk, gp + 2 * r, 2);
                if (t == T_Q4_1) memcpy(blk + 2, gp + 16 + 2 * r, 2);
                x8_unpack_row(t, gp, r, v);
                row_pack(t, blk, v);
            }
        }
    }
    return E_OK;
}

/* x rows -> int16 blocks (quantize_x16's rounding and scale), the float sum of every block
 * (Q4_1's min) and the integer sum of its int16 values (Q4_0's offset) */
static void x16_row_scalar(const float *xr, int64_t n32, x16_block *xq, float *xs, int32_t *xi) {
    quantize_x16(xr, n32, xq);
    for (int64_t b = 0; b < n32; b++) {
        float s = 0.0f;
        int32_t si = 0;
        for (int i = 0; i < 32; i++) {
            s += xr[b * 32 + i];
            si += xq[b].q[i];
        }
        xs[b] = s;
        xi[b] = si;
    }
}

#if QK_X86
/* the same with AVX2, branch-free: the scalar loop's data-dependent rounding branch
 * mispredicted on every other value (22 ns a value at K=1536, 17 ms of activations per
 * prefill-512 linear). Values, scale and integer sums are quantize_x16's exactly; the float
 * sum adds in another order (8 lanes, then across). */
AVX2 static void x16_row_avx2(const float *xr, int64_t n32, x16_block *xq, float *xs,
                              int32_t *xi) {
    const __m256 sgn = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f);
    const __m256i lim = _mm256_set1_epi32(32767), nlim = _mm256_set1_epi32(-32767);
    for (int64_t b = 0; b < n32; b++) {
        __m256 v[4], mx = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xr + b * 32 + 8 * i);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sgn, v[i]));
            sum = _mm256_add_ps(sum, v[i]);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float d = amax / 32767.0f, id = d ? 1.0f / d : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i q[4], isum = _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {
            __m256 y = _mm256_mul_ps(v[i], vid);
            y = _mm256_add_ps(y, _mm256_or_ps(half, _mm256_and_ps(sgn, y)));
            q[i] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvttps_epi32(y), lim), nlim);
            isum = _mm256_add_epi32(isum, q[i]);
        }
        __m256i p0 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
        __m256i p1 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);
        _mm256_storeu_si256((__m256i *)xq[b].q, p0);
        _mm256_storeu_si256((__m256i *)(xq[b].q + 16), p1);
        xq[b].d = d;
        xs[b] = hsum8(sum);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(isum), _mm256_extracti128_si256(isum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        xi[b] = _mm_cvtsi128_si32(s4);
    }
}
#endif

typedef struct {
    const float *x;
    int64_t ldx, m, n32;
    x16_block *xq;
    float *xs;
    int32_t *xi;
    int level;
} x16_job_t;

static void x16_rows_job(void *a, int c, int nchunks) {
    x16_job_t *j = a;
    int64_t r0 = j->m * c / nchunks, r1 = j->m * (c + 1) / nchunks;
    for (int64_t mi = r0; mi < r1; mi++) {
        const float *xr = j->x + mi * j->ldx;
        int64_t o = mi * j->n32;
#if QK_X86
        if (j->level >= 1) {
            x16_row_avx2(xr, j->n32, j->xq + o, j->xs + o, j->xi + o);
            continue;
        }
#endif
        x16_row_scalar(xr, j->n32, j->xq + o, j->xs + o, j->xi + o);
    }
}

/* every x row quantized, on the pool when there are enough of them */
static void x16_rows(const float *x, int64_t ldx, int64_t m, int64_t n32, x16_block *xq,
                     float *xs, int32_t *xi, int level, int nthreads) {
    x16_job_t j = {x, ldx, m, n32, xq, xs, xi, level};
    int64_t work = m * n32; /* 32-value blocks: ~20 ns each with AVX2 */
    int nchunks = nthreads <= 1 || work < 2048 ? 1 : (int)(m < 4 * nthreads ? m : 4 * nthreads);
    pool_run(x16_rows_job, &j, nchunks, nthreads);
}

/* y[m, ldy] (columns 0..n) = x[m, ldx] @ W^T, W in the x8 layout, int16 activations */
int qk_matmul_x8(int t, const float *x, int64_t ldx, int64_t m, const uint8_t *w, int64_t n,
                 int64_t k, float *y, int64_t ldy, int nthreads, int level) {
    int rc = x8_check(t, n, k, nthreads, &level);
    if (rc) return rc;
    if (m < 0 || ldx < k || ldy < n) return E_SHAPE;
    if (m == 0 || n == 0) return E_OK;
    int64_t n32 = k / 32;
    x16_block *xq = malloc(m * n32 * sizeof(x16_block));
    float *xs = malloc(m * n32 * sizeof(float));
    int32_t *xi = malloc(m * n32 * sizeof(int32_t));
    int32_t *xh = malloc(m * n32 * sizeof(int32_t));
    if (!xq || !xs || !xi || !xh) {
        free(xq);
        free(xs);
        free(xi);
        free(xh);
        return E_NOMEM;
    }
    x16_rows(x, ldx, m, n32, xq, xs, xi, level, nthreads);
    if (x8_is_k(t)) /* Q6_K's halves: the integer sum of the first 16 values of every block */
        for (int64_t b = 0; b < m * n32; b++) {
            int32_t sh = 0;
            for (int i = 0; i < 16; i++) sh += xq[b].q[i];
            xh[b] = sh;
        }
    x8_job_t j = {t, level, w, n, k / x8_block_vals(t), (n + 7) / 8, n32, m, xq, xs, xi, y, ldy,
                  NULL, 0, xh};
    int64_t pairs = (j.ngroups + 1) / 2;
    int nchunks = nthreads <= 1 ? 1 : (int)(pairs < 4 * nthreads ? pairs : 4 * nthreads);
    pool_run(x8_matmul_job, &j, nchunks < 1 ? 1 : nchunks, nthreads);
    free(xq);
    free(xs);
    free(xi);
    free(xh);
    return E_OK;
}

/* out[n, ldo] (columns 0..k) = the dequantized rows of W in the x8 layout */
int qk_dequantize_x8(int t, const uint8_t *w, int64_t n, int64_t k, float *out, int64_t ldo,
                     int nthreads, int level) {
    int rc = x8_check(t, n, k, nthreads, &level);
    if (rc) return rc;
    if (ldo < k) return E_SHAPE;
    if (n == 0) return E_OK;
    x8_job_t j = {t, level, w, n, k / x8_block_vals(t), (n + 7) / 8, k / 32, 0, NULL, NULL, NULL,
                  NULL, 0, out, ldo, NULL};
    int64_t pairs = (j.ngroups + 1) / 2;
    int nchunks = nthreads <= 1 ? 1 : (int)(pairs < 4 * nthreads ? pairs : 4 * nthreads);
    pool_run(x8_deq_job, &j, nchunks < 1 ? 1 : nchunks, nthreads);
    return E_OK;
}

/* out[i, 0..k) = row ids[i] of n rows of W in the x8 layout, dequantized as qk_dequantize_x8
 * dequantizes it (an embedding lookup: one call instead of a gather of 8-row groups, their
 * dequantization and a gather of lanes, ~10 torch calls of Python glue). Every id is checked
 * before anything is written. */
int qk_rows_x8(int t, const uint8_t *w, int64_t n, int64_t k, const int64_t *ids, int64_t m,
               float *out, int64_t ldo) {
    int level = -1;
    int rc = x8_check(t, n, k, 1, &level);
    if (rc) return rc;
    if (m < 0 || ldo < k) return E_SHAPE;
    for (int64_t i = 0; i < m; i++)
        if (ids[i] < 0 || ids[i] >= n) return E_ROW;
    const int64_t bv = x8_block_vals(t), nb = k / bv, gb = x8_group_bytes(t);
    for (int64_t i = 0; i < m; i++) {
        const uint8_t *g = w + ids[i] / 8 * nb * gb;
        for (int64_t b = 0; b < nb; b++)
            x8_deq_block_row(t, g + b * gb, (int)(ids[i] % 8), out + i * ldo + b * bv);
    }
    return E_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Segments: one call for every output-row segment of a weight (a fused projection whose parts
 * have different types, or one segment), as QuantizedWeight keeps them. Built once in Python
 * (ctypes array), so a decode step's linear is one C call with five varying arguments instead
 * of a Python loop of checked calls (about 6 us of Python per linear, 121 per SmolLM2 token). */

typedef struct {
    int32_t t;      /* ggml type */
    int32_t x8;     /* 1: w in the x8 layout (int16 activations) */
    int32_t act;    /* row layout: 0 float32, 1 int8, 2 int16 activations */
    int32_t pad;
    const uint8_t *w;
    int64_t row_bytes; /* row layout: bytes per row */
    int64_t n;         /* output rows */
    int64_t offset;    /* first output column of y */
} qk_seg;

/* y[m, ldy] (columns seg.offset .. seg.offset + seg.n per segment) = x[m, ldx] @ W^T */
int qk_matmul_segs(const qk_seg *segs, int nseg, const float *x, int64_t ldx, int64_t m,
                   int64_t k, float *y, int64_t ldy, int nthreads) {
    for (int i = 0; i < nseg; i++) {
        const qk_seg *s = segs + i;
        if (s->offset < 0 || s->offset + s->n > ldy) return E_SHAPE;
        int rc = s->x8 ? qk_matmul_x8(s->t, x, ldx, m, s->w, s->n, k, y + s->offset, ldy,
                                      nthreads, -1)
                       : qk_matmul(s->t, x, ldx, m, s->w, s->row_bytes, s->n, k, y + s->offset,
                                   ldy, nthreads, -1, s->act);
        if (rc) return rc;
    }
    return E_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* The F32 "type": y[M, N] = x[M, K] @ W[N, K]^T for float32 W in torch's nn.Linear layout (no
 * repacking; the same tensor serves torch's GEMM), for decode-sized M and, where this pool has
 * more threads than torch's, for prefill too (aioengine/worker/gemv). Batch-1 decode reads
 * every weight once and does two flops per weight: memory-bound. One W row at a time, a single
 * sequential stream per thread (measured on the 2-core EPYC: four rows interleaved gave 14 GB/s
 * where one row at a time gave 24, a plain read's speed; two rows interleaved lost too); for
 * M > 1 a tile of x rows shares each load of a W row (f32_rows_tiled_avx2). Rows go over the
 * same pool as the quantized kernels in chunks of 32 (one pool per process: the issue's "never
 * oversubscribe"). Formerly its own library, aioengine/worker/gemv/gemv_f32.c. */

#define F32_CHUNK_ROWS 32

static void f32_row_scalar(const float *x, int64_t ldx, int64_t m, const float *wr, int64_t k,
                           float *y, int64_t ldy) {
    for (int64_t mi = 0; mi < m; mi++) {
        const float *xr = x + mi * ldx;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        int64_t i = 0;
        for (; i + 4 <= k; i += 4) {
            s0 += wr[i] * xr[i];
            s1 += wr[i + 1] * xr[i + 1];
            s2 += wr[i + 2] * xr[i + 2];
            s3 += wr[i + 3] * xr[i + 3];
        }
        float s = s0 + s1 + s2 + s3;
        for (; i < k; i++) s += wr[i] * xr[i];
        y[mi * ldy] = s;
    }
}

#if QK_X86
/* AVX2 (level 1) and AVX-512 (level 2): rows in groups of 8. Each row is one sequential pass, 32
 * floats a step into four (AVX2) or two (AVX-512) accumulators folded to 8 lanes that wait, and
 * the group's 8 rows are reduced together by one hadd tree to one 8-float store: no horizontal
 * sum per row on the stream's path. Measured over SmolLM2's decode pass (huge pages, one
 * thread): on an AVX-512 EPYC 31 GB/s where a one-row AVX2 loop with a horizontal sum per row
 * gave 26 and a plain vector sum of the same bytes 32.5; on an AVX2-only EPYC the grouped AVX2
 * loop ran 1.07-1.12x that one-row loop at one thread and 1.16x at two (software prefetch
 * ahead of the stream lost 0-10%). Called for M = 1: more x rows take f32_rows_tiled_avx2. */
AVX2 static inline __m256 f32_red8(const __m256 *v) {
    __m256 h0 = _mm256_hadd_ps(v[0], v[1]), h1 = _mm256_hadd_ps(v[2], v[3]);
    __m256 h2 = _mm256_hadd_ps(v[4], v[5]), h3 = _mm256_hadd_ps(v[6], v[7]);
    h0 = _mm256_hadd_ps(h0, h1);
    h2 = _mm256_hadd_ps(h2, h3);
    return _mm256_add_ps(_mm256_permute2f128_ps(h0, h2, 0x20),
                         _mm256_permute2f128_ps(h0, h2, 0x31));
}

AVX512 static inline __m256 f32_dot8_avx512(const float *xr, const float *wr, int64_t k) {
    const int64_t k32 = k & ~(int64_t)31, k16 = k & ~(int64_t)15;
    const __mmask16 tail = (__mmask16)((1u << (k & 15)) - 1);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i < k32; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(wr + i), _mm512_loadu_ps(xr + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(wr + i + 16), _mm512_loadu_ps(xr + i + 16), a1);
    }
    if (i < k16) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(wr + i), _mm512_loadu_ps(xr + i), a0);
        i += 16;
    }
    if (tail)
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, wr + i),
                             _mm512_maskz_loadu_ps(tail, xr + i), a1);
    a0 = _mm512_add_ps(a0, a1);
    return _mm256_add_ps(_mm512_castps512_ps256(a0),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a0), 1)));
}

AVX2 static inline __m256 f32_dot8_avx2(const float *xr, const float *wr, int64_t k) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i), _mm256_loadu_ps(xr + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i + 8), _mm256_loadu_ps(xr + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i + 16), _mm256_loadu_ps(xr + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i + 24), _mm256_loadu_ps(xr + i + 24), a3);
    }
    for (; i + 8 <= k; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i), _mm256_loadu_ps(xr + i), a0);
    if (i < k) {
        const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(k - i)),
                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        a1 = _mm256_fmadd_ps(_mm256_maskload_ps(wr + i, tail), _mm256_maskload_ps(xr + i, tail),
                             a1);
    }
    return _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
}

/* rows r0..r1 of y = x W^T, in groups of 8, through one of the dot8 functions above */
#define F32_ROWS(NAME, TARGET, DOT8)                                                           \
    TARGET static void NAME(const float *x, int64_t ldx, int64_t m, const float *w, int64_t k, \
                            float *y, int64_t ldy, int64_t r0, int64_t r1) {                  \
        __m256 v[8][8]; /* [x row][W row of the group] */                                     \
        for (int64_t r = r0; r < r1; r += 8) {                                                 \
            const int rows = r1 - r < 8 ? (int)(r1 - r) : 8;                                   \
            for (int64_t m0 = 0; m0 < m; m0 += 8) {                                            \
                const int ms = m - m0 < 8 ? (int)(m - m0) : 8;                                 \
                for (int q = 0; q < 8; q++) {                                                  \
                    for (int mi = 0; mi < ms; mi++)                                            \
                        v[mi][q] = q < rows ? DOT8(x + (m0 + mi) * ldx, w + (r + q) * k, k)    \
                                            : _mm256_setzero_ps();                             \
                }                                                                              \
                for (int mi = 0; mi < ms; mi++) {                                              \
                    __m256 s = f32_red8(v[mi]);                                                \
                    float *yr = y + (m0 + mi) * ldy + r;                                       \
                    if (rows == 8) {                                                           \
                        _mm256_storeu_ps(yr, s);                                               \
                    } else {                                                                   \
                        float o[8];                                                            \
                        _mm256_storeu_ps(o, s);                                                \
                        for (int q = 0; q < rows; q++) yr[q] = o[q];                           \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }

F32_ROWS(f32_rows_avx2, AVX2, f32_dot8_avx2)
F32_ROWS(f32_rows_avx512, AVX512, f32_dot8_avx512)

/* AVX2, M >= 2 x rows (batched decode, prefill): a tile of R W rows (1 or 2) against M x rows
 * (up to 8) at once. Each 8-float piece of a W row is loaded once and multiplied into every x
 * row's accumulator, and each x piece into every W row's: R + M loads per R * M FMAs, where a
 * dot product per (x row, W row) pair (f32_rows_avx2) loads both again: 2 per FMA, which bounds
 * it at half the FMA rate. Small tiles unroll k (U pieces at once) so that at least 8
 * independent FMA chains hide the FMA latency. R and M are constants in each call (see
 * F32_TILE_CALL), so the loops unroll and the accumulators stay in registers. out[mi * 8 + r]
 * gets (or, with add, gains) x row mi's 8-lane partial sums against W row r. */
#define F32_TILE_MAX 8
#define F32_TILE_K 512 /* floats of k per pass: 8 x rows' pieces, 16 KB, stay in L1 */
AVX2 static inline __attribute__((always_inline)) void
f32_tile_avx2(const float *x, int64_t ldx, const float *w, int64_t ldw, int64_t k, __m256 *out,
              const int R, const int M, const int add) {
    const int U = R * M >= 5 ? 1 : R * M >= 3 ? 2 : 4;
    __m256 acc[4][2][F32_TILE_MAX];
#pragma GCC unroll 4
    for (int u = 0; u < U; u++)
#pragma GCC unroll 2
        for (int r = 0; r < R; r++)
#pragma GCC unroll 8
            for (int mi = 0; mi < M; mi++) acc[u][r][mi] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 * U <= k; i += 8 * U) {
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) {
            __m256 wv[2];
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) wv[r] = _mm256_loadu_ps(w + r * ldw + i + 8 * u);
#pragma GCC unroll 8
            for (int mi = 0; mi < M; mi++) {
                __m256 xv = _mm256_loadu_ps(x + mi * ldx + i + 8 * u);
                if (R > 1) /* one load for both W rows: else GCC folds it into each FMA */
                    __asm__("" : "+x"(xv));
#pragma GCC unroll 2
                for (int r = 0; r < R; r++)
                    acc[u][r][mi] = _mm256_fmadd_ps(wv[r], xv, acc[u][r][mi]);
            }
        }
    }
    for (; i < k; i += 8) {  /* what is left: 8 floats a step, the last one masked */
        const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(k - i)),
                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 wv[2];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) wv[r] = _mm256_maskload_ps(w + r * ldw + i, keep);
#pragma GCC unroll 8
        for (int mi = 0; mi < M; mi++) {
            const __m256 xv = _mm256_maskload_ps(x + mi * ldx + i, keep);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++)
                acc[0][r][mi] = _mm256_fmadd_ps(wv[r], xv, acc[0][r][mi]);
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int mi = 0; mi < M; mi++) {
            __m256 s = acc[0][r][mi];
#pragma GCC unroll 4
            for (int u = 1; u < U; u++) s = _mm256_add_ps(s, acc[u][r][mi]);
            __m256 *o = out + mi * 8 + r;
            *o = add ? _mm256_add_ps(*o, s) : s;
        }
}

#define F32_TILE_CALL(R, MS)                                                                   \
    switch (MS) {                                                                              \
    case 1: f32_tile_avx2(xm, ldx, wr, k, kn, &v[0][q], R, 1, add); break;                    \
    case 2: f32_tile_avx2(xm, ldx, wr, k, kn, &v[0][q], R, 2, add); break;                    \
    case 3: f32_tile_avx2(xm, ldx, wr, k, kn, &v[0][q], R, 3, add); break;                    \
    case 4: f32_tile_avx2(xm, ldx, wr, k, kn, &v[0][q], R, 4, add); break;                    \
    case 5: f32_tile_avx2(xm, ldx, wr, k, kn, &v[0][q], R, 5, add); break;                    \
    case 6: f32_tile_avx2(xm, ldx, wr, k, kn, &v[0][q], R, 6, add); break;                    \
    case 7: f32_tile_avx2(xm, ldx, wr, k, kn, &v[0][q], R, 7, add); break;                    \
    default: f32_tile_avx2(xm, ldx, wr, k, kn, &v[0][q], R, 8, add); break;                   \
    }

/* rows r0..r1 of y = x W^T for m >= 2, in groups of 8 W rows as f32_rows_avx2. Up to 8 x rows
 * (decode) take one W row at a time, so each W row is read from memory once, in one sequential
 * stream; more x rows (prefill) take them in chunks of 6 against W rows in pairs (12
 * accumulators), the group's W rows reused from L1 for every chunk. k goes in passes of
 * F32_TILE_K so that a chunk's x pieces stay in L1 over the group's W rows. */
AVX2 static void f32_rows_tiled_avx2(const float *x, int64_t ldx, int64_t m, const float *w,
                                     int64_t k, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    __m256 v[F32_TILE_MAX][8]; /* [x row][W row of the group] */
    const int chunk = m <= F32_TILE_MAX ? F32_TILE_MAX : 6;
    for (int64_t r = r0; r < r1; r += 8) {
        const int rows = r1 - r < 8 ? (int)(r1 - r) : 8;
        for (int64_t m0 = 0; m0 < m; m0 += chunk) {
            const int ms = m - m0 < chunk ? (int)(m - m0) : chunk;
            for (int q = rows; q < 8; q++)
                for (int mi = 0; mi < ms; mi++) v[mi][q] = _mm256_setzero_ps();
            for (int64_t k0 = 0; k0 < k; k0 += F32_TILE_K) {
                const int64_t kn = k - k0 < F32_TILE_K ? k - k0 : F32_TILE_K;
                const float *xm = x + m0 * ldx + k0;
                const int add = k0 > 0;
                for (int q = 0; q < rows;) {
                    const float *wr = w + (r + q) * k + k0;
                    if (chunk < F32_TILE_MAX && q + 1 < rows) {
                        F32_TILE_CALL(2, ms)
                        q += 2;
                    } else {
                        F32_TILE_CALL(1, ms)
                        q += 1;
                    }
                }
            }
            for (int mi = 0; mi < ms; mi++) {
                __m256 s = f32_red8(v[mi]);
                float *yr = y + (m0 + mi) * ldy + r;
                if (rows == 8) {
                    _mm256_storeu_ps(yr, s);
                } else {
                    float o[8];
                    _mm256_storeu_ps(o, s);
                    for (int q = 0; q < rows; q++) yr[q] = o[q];
                }
            }
        }
    }
}
#endif

typedef struct {
    const float *x, *w;
    float *y;
    int64_t ldx, m, n, k, ldy;
    int level;
} f32_job_t;

static void f32_job(void *a, int c, int nchunks) {
    (void)nchunks;
    f32_job_t *j = a;
    int64_t lo = (int64_t)c * F32_CHUNK_ROWS, hi = lo + F32_CHUNK_ROWS < j->n ? lo + F32_CHUNK_ROWS
                                                                               : j->n;
#if QK_X86
    if (j->level >= 1 && j->m > 1) { /* AVX-512 CPUs too (not measured there): half the loads */
        f32_rows_tiled_avx2(j->x, j->ldx, j->m, j->w, j->k, j->y, j->ldy, lo, hi);
        return;
    }
    if (j->level >= 2) {
        f32_rows_avx512(j->x, j->ldx, j->m, j->w, j->k, j->y, j->ldy, lo, hi);
        return;
    }
    if (j->level == 1) {
        f32_rows_avx2(j->x, j->ldx, j->m, j->w, j->k, j->y, j->ldy, lo, hi);
        return;
    }
#endif
    for (int64_t r = lo; r < hi; r++)
        f32_row_scalar(j->x, j->ldx, j->m, j->w + r * j->k, j->k, j->y + r, j->ldy);
}

/* y[m, ldy] (columns 0..n) = x[m, ldx] (columns 0..k) @ W[n, k]^T, float32 W */
int qk_gemv_f32(const float *x, int64_t ldx, int64_t m, const float *w, int64_t n, int64_t k,
                float *y, int64_t ldy, int nthreads, int level) {
    if (m < 0 || n < 0 || k < 1 || ldx < k || ldy < n) return E_SHAPE;
    if (nthreads < 1 || nthreads > 256) return E_THREADS;
    if (level < 0) level = qk_best_level();
    if (level > qk_best_level()) return E_LEVEL;
    if (m == 0 || n == 0) return E_OK;
    f32_job_t j = {x, w, y, ldx, m, n, k, ldy, level};
    int64_t chunks = (n + F32_CHUNK_ROWS - 1) / F32_CHUNK_ROWS;
    if (nthreads > chunks) nthreads = (int)chunks;
    return pool_run(f32_job, &j, (int)chunks, nthreads);
}
