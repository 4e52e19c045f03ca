/* The per-token work of a decoder layer outside its linears (cpu_ops.c): the residual add
 * fused with RMSNorm, rotary embedding fused with the KV-cache write, SiLU-and-multiply.
 * Python's side: aioengine/worker/ops/__init__.py; the decode plan calls them by pointer. */
#ifndef AIO_CPU_OPS_H
#define AIO_CPU_OPS_H

#include <stdint.h>

#define OPS_OK 0
#define OPS_BAD_SHAPE -1
#define OPS_BAD_SLOT -2

/* out[i] = norm(r_i) * w, r_i = x[i] + residual[i] (stored back into residual) when add, else
 * r_i = x[i] (residual untouched, may be NULL). offset: Gemma's (1 + w). Rows of n floats with
 * leading dimensions ldx, ldr, ldo (out may alias x). */
int add_rms_norm_f32(const float *x, int64_t ldx, float *residual, int64_t ldr, const float *w,
                     float *out, int64_t ldo, int64_t m, int64_t n, float eps, int offset,
                     int add);

int rope_store_f32(float *qkv, int64_t ldq, int64_t t, int64_t hq, int64_t hkv, int64_t d,
                   const float *cos_t, const float *sin_t, int64_t half, float *kv,
                   int64_t slots_per_head, const int64_t *slots);

int rope_store_f16(float *qkv, int64_t ldq, int64_t t, int64_t hq, int64_t hkv, int64_t d,
                   const float *cos_t, const float *sin_t, int64_t half, uint16_t *kv,
                   int64_t slots_per_head, const int64_t *slots);

int silu_mul_f32(const float *x, int64_t ldx, float *out, int64_t ldo, int64_t m, int64_t n);

#endif
