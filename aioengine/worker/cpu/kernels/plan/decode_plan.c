/* A decode step's decoder layers in one C call: the CPU fast path's per-layer sequence
 *
 *   add+RMSNorm -> qkv -> rope+KV write -> paged attention -> o_proj -> add+RMSNorm -> gate_up
 *   -> SiLU*up -> down -> (next layer's) add+RMSNorm
 *
 * recorded once per model (weight pointers, QkSeg arrays, norm weights, KV caches) and run for
 * every layer without returning to Python. The work itself is done by the same compiled
 * functions the per-layer Python loop calls (qkernels' qk_matmul_segs / qk_gemv_f32, cpu_ops'
 * add_rms_norm_f32 / rope_store_* / silu_mul_f32, the paged decode attention kernel), reached
 * through function pointers taken from their own libraries: each keeps its compile flags and
 * numerics (the plan's results are bit-equal to the loop's), and the quantized kernels keep
 * their one thread pool per process. With no Python between the linears, the pool's workers
 * (which spin 200 us after a job) stay awake from one linear to the next.
 *
 * Why: at batch 1 the per-layer loop's Python between and around the C calls was a sizeable
 * share of a step (docs/benchmarks.md, session 8).
 *
 * Plain C11, no torch headers, no threads of its own.
 */

#define _POSIX_C_SOURCE 199309L
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "decode_plan.h"

#define PLAN_MAX_SPLIT 64

typedef struct {
    const plan_step *p;
    const void *cache;
    int64_t pairs, per; /* (sequence, kv head) pairs, sequence-major; per chunk */
    int rc[PLAN_MAX_SPLIT];
} heads_job;

/* chunk c of the layer's attention: pairs [c * per, (c + 1) * per), one call per pair for one
 * sequence and one kv head (and its query heads) */
static void heads_chunk(void *arg, int c, int nchunks) {
    (void)nchunks;
    heads_job *j = arg;
    const plan_step *p = j->p;
    const int64_t width = (p->hq + 2 * p->hkv) * p->d;
    const int64_t end = (c + 1) * j->per < j->pairs ? (c + 1) * j->per : j->pairs;
    int rc = 0;
    for (int64_t k = c * j->per; k < end && !rc; k++) {
        const int64_t b = k / p->hkv, h = k % p->hkv;
        const int64_t row = p->rows ? p->rows[b] : b;
        rc = p->attention_heads(p->qkv, width, &row, p->t, j->cache,
                                p->block_tables + b * p->max_blocks, p->context_lens + b,
                                p->window_starts ? p->window_starts + b : NULL, p->attn, 1,
                                p->hq, p->hkv, p->d, p->block_size, p->num_blocks,
                                p->max_blocks, p->scale, h, h + 1);
    }
    j->rc[c] = rc;
}

/* the layer's attention: one call, or its (sequence, kv head) pairs over the pool (each pair's
 * result is the one call's: sequences and heads are independent). Split by kv head alone, a
 * batch of 8 decodes of SmolLM2 (3 kv heads) left one of two threads idle a third of the time. */
static int attention(const plan_step *p, const void *cache) {
    const int64_t width = (p->hq + 2 * p->hkv) * p->d, pairs = p->b * p->hkv;
    if (p->qthreads > 1 && p->pool_run && p->attention_heads && pairs > 1) {
        heads_job j;
        j.p = p;
        j.cache = cache;
        j.pairs = pairs;
        j.per = (pairs + PLAN_MAX_SPLIT - 1) / PLAN_MAX_SPLIT;
        const int nchunks = (int)((pairs + j.per - 1) / j.per);
        for (int c = 0; c < nchunks; c++) j.rc[c] = 0;
        int rc = p->pool_run(heads_chunk, &j, nchunks, p->qthreads);
        for (int c = 0; c < nchunks && !rc; c++) rc = j.rc[c];
        return rc;
    }
    return p->attention(p->qkv, width, p->rows, p->t, cache, p->block_tables, p->context_lens,
                        p->window_starts, p->attn, p->b, p->hq, p->hkv, p->d, p->block_size,
                        p->num_blocks, p->max_blocks, p->scale);
}

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* with op_ns: the time since *t0 goes to op_ns[op], *t0 moves to now */
static inline void tick(const plan_step *p, int op, int64_t *t0) {
    if (p->op_ns) {
        int64_t t = now_ns();
        p->op_ns[op] += t - *t0;
        *t0 = t;
    }
}

static int linear(const plan_step *p, const plan_linear *l, const float *x, float *y) {
    if (l->kind == 0)
        return p->matmul_segs(l->w, l->nseg, x, l->k, p->t, l->k, y, l->n, p->qthreads);
    if (l->kind == 1)
        return p->gemv_f32(x, l->k, p->t, (const float *)l->w, l->n, l->k, y, l->n, p->fthreads,
                           -1);
    return PLAN_BAD_KIND;
}

/* the step's embedding rows into residual (every id checked before anything is written) */
static int embed(const plan_step *p) {
    const int64_t h = p->hidden;
    for (int64_t i = 0; i < p->t; i++)
        if (p->ids[i] < 0 || p->ids[i] >= p->embed_n) return PLAN_BAD_ID;
    if (p->embed_rows)
        return p->embed_rows(p->embed_qtype, p->embed_w, p->embed_n, h, p->ids, p->t,
                             p->residual, h);
    for (int64_t i = 0; i < p->t; i++)
        memcpy(p->residual + i * h, (const float *)p->embed_w + p->ids[i] * h,
               (size_t)h * sizeof(float));
    return PLAN_OK;
}

/* the rotary tables' rows of the step's positions into cos/sin (the lane's scratch) */
static int rope_rows(const plan_step *p) {
    const int64_t half = p->half;
    for (int64_t i = 0; i < p->t; i++) {
        const int64_t pos = p->positions[i];
        if (pos < 0 || pos >= p->table_rows) return PLAN_BAD_ID;
        memcpy((float *)p->cos + i * half, p->cos_table + pos * half, (size_t)half * 4);
        memcpy((float *)p->sin + i * half, p->sin_table + pos * half, (size_t)half * 4);
    }
    return PLAN_OK;
}

typedef struct {
    const plan_step *p;
    int64_t row, per;       /* the row, and the columns per chunk */
    int64_t at[PLAN_MAX_SPLIT];
    float best[PLAN_MAX_SPLIT];
} argmax_job;

/* the first index of the largest value in x[0..n), a NaN counting as the largest (numpy's) */
static int64_t first_max(const float *x, int64_t n, float *best) {
    int64_t at = 0;
    float b = x[0];
    if (b != b) return *best = b, 0;
    for (int64_t i = 1; i < n; i++) {
        const float v = x[i];
        if (v != v) return *best = v, i;
        if (v > b) b = v, at = i;
    }
    return *best = b, at;
}

static void argmax_chunk(void *arg, int c, int nchunks) {
    (void)nchunks;
    argmax_job *j = arg;
    const int64_t lo = c * j->per, hi = lo + j->per < j->p->vocab ? lo + j->per : j->p->vocab;
    j->at[c] = lo + first_max(j->p->logits + j->row * j->p->head.n + lo, hi - lo, &j->best[c]);
}

/* argmax of every logits row, its columns split over the pool (the LM head's threads wrote
 * them: read back by one thread, the lines written on the other cores come over one miss at a
 * time; docs/benchmarks.md) */
static int argmax_rows(const plan_step *p) {
    const int nth = p->qthreads > 1 && p->pool_run ? p->qthreads : 1;
    const int nchunks = nth < PLAN_MAX_SPLIT ? nth : PLAN_MAX_SPLIT;
    argmax_job j;
    j.p = p;
    j.per = (p->vocab + nchunks - 1) / nchunks;
    for (int64_t r = 0; r < p->t; r++) {
        j.row = r;
        const int used = (int)((p->vocab + j.per - 1) / j.per);
        if (used > 1) {
            int rc = p->pool_run(argmax_chunk, &j, used, nth);
            if (rc) return rc;
        } else {
            argmax_chunk(&j, 0, 1);
        }
        int64_t at = j.at[0];
        float b = j.best[0];
        for (int c = 1; c < used && b == b; c++) /* in order: the first maximum wins */
            if (j.best[c] > b || j.best[c] != j.best[c]) b = j.best[c], at = j.at[c];
        p->argmax[r] = at;
    }
    return PLAN_OK;
}

/* Runs every layer; returns 0, or an error code with *where = layer * 16 + op (op: 0 norm,
 * 1 qkv, 2 rope, 3 attention, 4 o, 5 norm, 6 gate_up, 7 silu, 8 down, 9 norm; the lane's
 * parts: 10 embedding, 11 rotary rows, 12 LM head, with layer 0). */
int plan_run(const plan_step *p, int64_t *where) {
    const int64_t t = p->t, h = p->hidden, hq = p->hq, hkv = p->hkv, d = p->d;
    const int64_t width = (hq + 2 * hkv) * d, inter = p->inter;
    *where = -1;
    if (t < 1 || p->nlayers < 1 || h < 1 || d < 1 || inter < 1) return PLAN_BAD_SHAPE;
    int64_t t0 = p->op_ns ? now_ns() : 0;
    int rc;
    if (p->ids && (rc = embed(p))) {
        *where = 10;
        return rc;
    }
    if (p->positions && (rc = rope_rows(p))) {
        *where = 11;
        return rc;
    }
    rc = p->add_rms_norm(p->residual, h, NULL, h, p->layers[0].in_w, p->x, h, t, h, p->eps,
                             p->norm_offset, 0);
    if (rc) {
        *where = 0;
        return rc;
    }
    tick(p, 0, &t0);
    for (int64_t i = 0; i < p->nlayers; i++) {
        const plan_layer *l = p->layers + i;
        const float *next_w = i + 1 < p->nlayers ? p->layers[i + 1].in_w : p->final_w;
        int op = 1;
        if (l->qkv.n != width || l->o.n != h || l->gate_up.n != 2 * inter || l->down.n != h
            || l->qkv.k != h || l->o.k != hq * d || l->gate_up.k != h || l->down.k != inter) {
            rc = PLAN_BAD_SHAPE;
            goto fail;
        }
        if ((rc = linear(p, &l->qkv, p->x, p->qkv))) goto fail;
        tick(p, op, &t0);
        op = 2;
        if ((rc = p->rope_store(p->qkv, width, t, hq, hkv, d, p->cos, p->sin, p->half, l->cache,
                                p->slots_per_head, p->slots)))
            goto fail;
        tick(p, op, &t0);
        op = 3;
        if ((rc = attention(p, l->cache))) goto fail;
        tick(p, op, &t0);
        op = 4;
        if ((rc = linear(p, &l->o, p->attn, p->y))) goto fail;
        tick(p, op, &t0);
        op = 5;
        if ((rc = p->add_rms_norm(p->y, h, p->residual, h, l->post_w, p->x, h, t, h, p->eps,
                                  p->norm_offset, 1)))
            goto fail;
        tick(p, op, &t0);
        op = 6;
        if ((rc = linear(p, &l->gate_up, p->x, p->gu))) goto fail;
        tick(p, op, &t0);
        op = 7;
        if ((rc = p->silu_mul(p->gu, 2 * inter, p->act, inter, t, inter))) goto fail;
        tick(p, op, &t0);
        op = 8;
        if ((rc = linear(p, &l->down, p->act, p->y))) goto fail;
        tick(p, op, &t0);
        op = 9;
        if ((rc = p->add_rms_norm(p->y, h, p->residual, h, next_w, p->x, h, t, h, p->eps,
                                  p->norm_offset, 1)))
            goto fail;
        tick(p, op, &t0);
        continue;
    fail:
        *where = i * 16 + op;
        return rc;
    }
    if (p->logits) {
        if (p->head.k != h) return *where = 12, PLAN_BAD_SHAPE;
        if ((rc = linear(p, &p->head, p->x, p->logits))) return *where = 12, rc;
        if (p->argmax) {
            if (p->vocab < 1 || p->vocab > p->head.n) return *where = 12, PLAN_BAD_SHAPE;
            if ((rc = argmax_rows(p))) return *where = 12, rc;
        }
        tick(p, 10, &t0);
    }
    return PLAN_OK;
}

/* the struct sizes, checked against the ctypes mirrors at load */
int64_t plan_sizeof(int what) {
    return what == 0 ? (int64_t)sizeof(plan_linear)
         : what == 1 ? (int64_t)sizeof(plan_layer)
         : what == 2 ? (int64_t)sizeof(plan_step) : -1;
}
