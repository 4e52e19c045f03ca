/* The decode plan's records (decode_plan.c), mirrored by ctypes structures in
 * aioengine/worker/ops/plan.py (plan_sizeof checks the sizes at load), and the signatures of
 * the compiled functions it calls by pointer: the quantized kernels' (../quant/gemm.h,
 * ../quant/threads.h), the layer ops' (../ops/cpu_ops.h) and the attention's
 * (../attention/paged_decode.h). Each lives in its own library with its own compile flags and
 * numerics; the plan takes their addresses from Python. */
#ifndef AIO_DECODE_PLAN_H
#define AIO_DECODE_PLAN_H

#include <stdint.h>

#define PLAN_OK 0
#define PLAN_BAD_SHAPE -101
#define PLAN_BAD_KIND -102
#define PLAN_BAD_ID -103

typedef int (*segs_fn)(const void *segs, int nseg, const float *x, int64_t ldx, int64_t m,
                       int64_t k, float *y, int64_t ldy, int nthreads);
typedef int (*gemv_fn)(const float *x, int64_t ldx, int64_t m, const float *w, int64_t n,
                       int64_t k, float *y, int64_t ldy, int nthreads, int level);
typedef int (*norm_fn)(const float *x, int64_t ldx, float *residual, int64_t ldr, const float *w,
                       float *out, int64_t ldo, int64_t m, int64_t n, float eps, int offset,
                       int add);
typedef int (*rope_fn)(float *qkv, int64_t ldq, int64_t t, int64_t hq, int64_t hkv, int64_t d,
                       const float *cos_t, const float *sin_t, int64_t half, void *kv,
                       int64_t slots_per_head, const int64_t *slots);
typedef int (*silu_fn)(const float *x, int64_t ldx, float *out, int64_t ldo, int64_t m,
                       int64_t n);
typedef int (*attn_fn)(const float *q, int64_t q_stride, const int64_t *rows, int64_t num_rows,
                       const void *kv, const int64_t *block_tables, const int64_t *context_lens,
                       const int64_t *window_starts, float *out, int64_t B, int64_t Hq,
                       int64_t Hkv, int64_t D, int64_t bs, int64_t num_blocks,
                       int64_t max_blocks, float scale);

typedef int (*attn_heads_fn)(const float *q, int64_t q_stride, const int64_t *rows,
                             int64_t num_rows, const void *kv, const int64_t *block_tables,
                             const int64_t *context_lens, const int64_t *window_starts,
                             float *out, int64_t B, int64_t Hq, int64_t Hkv, int64_t D,
                             int64_t bs, int64_t num_blocks, int64_t max_blocks, float scale,
                             int64_t h0, int64_t h1);
typedef int (*rows_fn)(int t, const uint8_t *w, int64_t n, int64_t k, const int64_t *ids,
                       int64_t m, float *out, int64_t ldo);
typedef void (*job_fn)(void *arg, int chunk, int nchunks);
typedef int (*pool_fn)(job_fn fn, void *arg, int nchunks, int nth);

/* one linear: kind 0 quantized segments (qk_seg array, nseg), kind 1 float32 [n, k] rows */
typedef struct {
    int32_t kind;
    int32_t nseg;
    const void *w;
    int64_t n, k;
} plan_linear;

typedef struct {
    plan_linear qkv, o, gate_up, down;
    const float *in_w, *post_w; /* RMSNorm weights before attention and before the MLP */
    void *cache;                /* [2, Hkv, num_blocks, block_size, D] float32 or float16 */
} plan_layer;

typedef struct {
    /* the compiled functions (pointers from their libraries) */
    segs_fn matmul_segs;
    gemv_fn gemv_f32;
    norm_fn add_rms_norm;
    rope_fn rope_store;
    silu_fn silu_mul;
    attn_fn attention;
    /* the model */
    const plan_layer *layers;
    int64_t nlayers, hidden, hq, hkv, d, inter;
    const float *final_w;
    float eps, scale;
    int32_t norm_offset, pad;
    /* the step: T tokens, one per sequence (decode) */
    int64_t t, half, slots_per_head;
    float *residual;  /* [T, hidden] embeddings in, residual stream out */
    float *x;         /* [T, hidden] normed activations; the final-normed hidden out */
    float *qkv;       /* [T, (hq + 2 hkv) d] */
    float *attn;      /* [T, hq d] */
    float *y;         /* [T, hidden] o_proj and down outputs */
    float *gu;        /* [T, 2 inter] */
    float *act;       /* [T, inter] */
    const float *cos, *sin; /* [T, half] */
    const int64_t *slots;   /* [T] */
    const int64_t *rows, *block_tables, *context_lens, *window_starts;
    int64_t b, block_size, num_blocks, max_blocks;
    int32_t qthreads, fthreads; /* quantized kernels' and F32 GEMV's thread counts */
    int64_t *op_ns; /* NULL, or [11]: nanoseconds per op (`where`'s numbering; 10: LM head) */
    /* NULL, or attention split by kv head over the quantized kernels' pool (qthreads > 1) */
    pool_fn pool_run;
    attn_heads_fn attention_heads;
    /* The decode lane: the whole step from token ids to logits (each part off when NULL).
     * ids: the embedding rows of these [T] token ids become residual (embed_rows: an x8
     * quantized table, qk_rows_x8; else float32 rows [embed_n, hidden] at embed_w).
     * positions: rows [T] of the rotary tables [table_rows, half] are copied to cos/sin.
     * logits: [T, head.n] = the final-normed hidden x @ head^T. */
    const int64_t *ids;
    rows_fn embed_rows;
    const void *embed_w;
    int64_t embed_n;
    int32_t embed_qtype, pad2;
    const int64_t *positions;
    const float *cos_table, *sin_table;
    int64_t table_rows;
    plan_linear head;
    float *logits;
    int64_t *argmax; /* NULL, or [T]: each logits row's first largest value (NaN first) */
    int64_t vocab;   /* the columns argmax looks at (head.n may pad past the vocabulary) */
} plan_step;

/* a step's decoder layers in one call; *where: the layer * 16 + op of a failure */
int plan_run(const plan_step *p, int64_t *where);
/* sizeof(plan_linear), sizeof(plan_layer), sizeof(plan_step) for what = 0, 1, 2 */
int64_t plan_sizeof(int what);

#endif
