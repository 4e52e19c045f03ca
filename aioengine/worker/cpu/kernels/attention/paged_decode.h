/* Paged decode attention on CPU (paged_decode.c): one query token per sequence over the
 * block-structured KV cache, float32 or float16. Python's side:
 * aioengine/worker/attention/cpu_kernel/kernel.py; the decode plan calls them by pointer. */
#ifndef AIO_PAGED_DECODE_H
#define AIO_PAGED_DECODE_H

#include <stdint.h>

#define PD_OK 0
#define PD_BAD_CONTEXT_LEN -1
#define PD_BAD_BLOCK_ID -2
#define PD_NO_MEMORY -3
#define PD_BAD_SHAPE -4
#define PD_BAD_ROW -5
#define PD_BAD_WINDOW -6

int paged_decode_attention(const float *q, int64_t q_stride, const int64_t *rows,
                           int64_t num_rows, const float *kv, const int64_t *block_tables,
                           const int64_t *context_lens, const int64_t *window_starts,
                           float *out, int64_t B, int64_t Hq,
                           int64_t Hkv, int64_t D, int64_t bs, int64_t num_blocks,
                           int64_t max_blocks, float scale);

/* The same over a float16 cache (IEEE binary16 bits, e.g. a torch.float16 tensor). */
int paged_decode_attention_f16(const float *q, int64_t q_stride, const int64_t *rows,
                               int64_t num_rows, const uint16_t *kv,
                               const int64_t *block_tables, const int64_t *context_lens,
                               const int64_t *window_starts, float *out, int64_t B,
                               int64_t Hq, int64_t Hkv, int64_t D, int64_t bs,
                               int64_t num_blocks, int64_t max_blocks, float scale);

/* The same for kv heads h0 .. h1 - 1 only (and their query heads): the decode plan splits a
 * layer's heads over the quantized kernels' thread pool. Each head is computed exactly as in
 * the whole call. */
int paged_decode_attention_heads(const float *q, int64_t q_stride, const int64_t *rows,
                                 int64_t num_rows, const float *kv, const int64_t *block_tables,
                                 const int64_t *context_lens, const int64_t *window_starts,
                                 float *out, int64_t B, int64_t Hq, int64_t Hkv, int64_t D,
                                 int64_t bs, int64_t num_blocks, int64_t max_blocks, float scale,
                                 int64_t h0, int64_t h1);

int paged_decode_attention_heads_f16(const float *q, int64_t q_stride, const int64_t *rows,
                                     int64_t num_rows, const uint16_t *kv,
                                     const int64_t *block_tables, const int64_t *context_lens,
                                     const int64_t *window_starts, float *out, int64_t B,
                                     int64_t Hq, int64_t Hkv, int64_t D, int64_t bs,
                                     int64_t num_blocks, int64_t max_blocks, float scale,
                                     int64_t h0, int64_t h1);

#endif
