/* What every quantized-kernel file needs: the headers, the ISA target attributes, the error
 * codes the Python side maps to words (aioengine/worker/quant/kernel.py), and fp16 -> fp32.
 *
 * The library builds with plain -O3 (no -march): the AVX2 and AVX-512 code is compiled with
 * __attribute__((target)) and chosen at run time by CPUID (isa.h), so one object runs on any
 * x86-64 and the portable scalar path is real, always built and always tested. */
#ifndef QK_BASE_H
#define QK_BASE_H

#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#define QK_X86 1
#include <immintrin.h>
#else
#define QK_X86 0
#endif

#define QK_VERSION 2

#define E_OK 0
#define E_TYPE -1
#define E_SHAPE -2
#define E_ROWBYTES -3
#define E_NOMEM -4
#define E_LEVEL -5
#define E_THREADS -6
#define E_ACT8 -7
#define E_ROW -8

/* code paths, the index of every per-ISA entry of a type's traits */
#define QK_SCALAR 0
#define QK_AVX2 1    /* AVX2 + FMA + F16C */
#define QK_AVX512 2  /* AVX-512F (+ the AVX2 set); x8 kernels: AVX-512 VNNI where present */
#define QK_LEVELS 3

#if QK_X86
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#define VNNI __attribute__((target("avx512f,avx512vl,avx512vnni,avx2,fma,f16c")))
#endif

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

#if QK_X86
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
#endif

#endif
