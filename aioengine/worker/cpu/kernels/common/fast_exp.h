/* exp(x) for float32, branch-free so the loops around it vectorize; shared by the CPU layer ops
 * (SiLU's e^-g) and the decode attention (softmax's e^(s - max), x <= 0).
 *
 * x is clamped to [-87, 88] so 2^n stays a normal float: below -87 (e^-87 ~ 1e-38) nothing is
 * lost next to a softmax max's weight of 1, and SiLU's g / (1 + e^-g) stays within a float's
 * rounding of the exact value at both ends; a NaN input takes the low bound (both comparisons
 * are false). Then Cody-Waite range reduction x = n ln2 + r, the Cephes expf degree-6
 * polynomial for e^r (~1 ulp), and 2^n put straight into the exponent bits.
 *
 * Static inline in a header: each library compiles it with its own flags (the ops without FMA
 * contraction, the attention with it), so each keeps its own rounding. Both build with
 * -fno-trapping-math, which lets the clamps become vector selects. */
#ifndef AIOENGINE_KERNELS_FAST_EXP_H
#define AIOENGINE_KERNELS_FAST_EXP_H

#include <stdint.h>

static inline float exp_clamped(float x) {
    x = x > -87.0f ? x : -87.0f;
    x = x < 88.0f ? x : 88.0f;
    const float shift = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float t = x * 1.44269504088896341f + shift;
    float n = t - shift;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { float f; int32_t i; } tb = {t}, sb;
    sb.i = (tb.i - 0x4B400000 + 127) << 23; /* n + bias, in the exponent field */
    return p * sb.f;
}

#endif
