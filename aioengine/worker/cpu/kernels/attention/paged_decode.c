/* Paged decode attention on CPU: one query token per sequence, keys and values read straight
 * out of the block-structured KV cache (no gather, no contiguity requirement).
 *
 * Cache of one layer: [2, Hkv, num_blocks, bs, D] float32 (k, v), or IEEE float16 with
 * paged_decode_attention_f16 (half the bytes to read; each block is widened to float32 in an
 * L1 scratch as it is read, with F16C where the CPU has it); a block of one head is one
 * contiguous [bs, D] matrix. Query head h reads kv head h / (Hq / Hkv) (grouped-query
 * attention): the G query heads of a kv head are done together, so each key and value row is
 * loaded once for all of them.
 *
 * Numerics: fp32 throughout, a two-pass softmax over a scratch row of scores (scores, their
 * max, then exp(s - max) and their sum, then the weighted sum of values), so it is stable for
 * any score range.
 *
 * Single-threaded on purpose: each model process runs one torch intra-op thread here, and an
 * OpenMP version would bring libgomp into a process whose torch already runs its own OpenMP
 * runtime (two spinning pools oversubscribe the cores; mixing the runtimes is unsupported).
 * The only OpenMP used is `#pragma omp simd` under -fopenmp-simd: a vectorization hint that
 * links no runtime. Plain C99, no torch headers: it builds in well under a second.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../common/fast_exp.h"
#include "paged_decode.h"


static inline float dot(const float *restrict a, const float *restrict b, int64_t d) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < d; i++)
        acc += a[i] * b[i];
    return acc;
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define PD_AVX2 1
#endif

/* float16 -> float32 of n values (exact: every half is a float). */
#if defined(__F16C__)
#include <immintrin.h>
static inline void widen_f16(const uint16_t *restrict src, float *restrict dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = _cvtsh_ss(src[i]);
}
#elif defined(__FLT16_MAX__)
static inline void widen_f16(const uint16_t *restrict src, float *restrict dst, int64_t n) {
    const _Float16 *h = (const _Float16 *)src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = (float)h[i];
}
#else
#error "no float16 support in this compiler (neither F16C nor _Float16)"
#endif

/* s[t] = q . k_t for n key rows of D floats at kb. With AVX2+FMA and D a multiple of 8, eight
 * keys at a time: eight independent accumulator chains (one dot product's chain of D/8
 * dependent FMAs waits out each FMA's latency and leaves the units idle; docs/benchmarks.md),
 * then one horizontal-add tree gives the eight sums in one vector. Other keys: `dot`. */
static inline void dot_rows(const float *restrict q, const float *restrict kb, int64_t n,
                            int64_t D, float *restrict s) {
    int64_t t = 0;
#ifdef PD_AVX2
    if (D % 8 == 0) {
        for (; t + 8 <= n; t += 8) {
            const float *k = kb + t * D;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0,
                   a6 = a0, a7 = a0;
            for (int64_t i = 0; i < D; i += 8) {
                __m256 qv = _mm256_loadu_ps(q + i);
                a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + i), a0);
                a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + D + i), a1);
                a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 2 * D + i), a2);
                a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 3 * D + i), a3);
                a4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 4 * D + i), a4);
                a5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 5 * D + i), a5);
                a6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 6 * D + i), a6);
                a7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 7 * D + i), a7);
            }
            /* [a0..a3 partial sums | ...] -> one lane per key */
            __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
            __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
            __m256 lo = _mm256_permute2f128_ps(h0, h1, 0x20);
            __m256 hi = _mm256_permute2f128_ps(h0, h1, 0x31);
            _mm256_storeu_ps(s + t, _mm256_add_ps(lo, hi));
        }
    }
#endif
    for (; t < n; t++)
        s[t] = dot(q, kb + t * D, D);
}

/* s[first .. ctx) <- exp(s - max s) in place; returns their sum (the softmax denominator). */
static inline float softmax_weights(float *restrict s, int64_t first, int64_t ctx) {
    float m = s[first];
#pragma omp simd reduction(max : m)
    for (int64_t i = first + 1; i < ctx; i++)
        m = s[i] > m ? s[i] : m;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = first; i < ctx; i++) {
        float e = exp_clamped(s[i] - m) /* <= 0, or NaN: the low clamp */;
        s[i] = e;
        sum += e;
    }
    return sum;
}

/* Ask for block j + 1 while block j is worked on, when it is not the adjacent one (those the
 * hardware prefetcher streams already): on blocks scattered over the cache the next block's
 * lines are otherwise fetched only on demand, one miss after another, while adjacent runs gain
 * nothing (docs/benchmarks.md). */
static inline void prefetch_next(const void *plane, const int64_t *table, int64_t j,
                                 int64_t nblocks, int64_t block_bytes) {
    if (j + 1 < nblocks && table[j + 1] != table[j] + 1) {
        const char *next = (const char *)plane + table[j + 1] * block_bytes;
        for (int64_t o = 0; o < block_bytes; o += 64) /* one 64-byte line per prefetch */
            __builtin_prefetch(next + o);
    }
}

/* One (sequence, kv head): the G query rows `qs` (already scaled) attend over keys
 * `first` .. `ctx - 1` (`first` > 0 under a sliding window). `scores`: G * ctx floats,
 * indexed by key position; `acc`: D floats. Inlined per head dim so D is a constant. */
static inline __attribute__((always_inline)) void attend_head(
        const float *restrict qs, const float *restrict kplane, const float *restrict vplane,
        const int64_t *restrict table, int64_t first, int64_t ctx, int64_t G, int64_t D,
        int64_t bs, float *restrict scores, float *restrict acc, float *restrict out) {
    int64_t nblocks = (ctx + bs - 1) / bs;
    int64_t j0 = first / bs;
    /* Scores: block by block, for the G query heads in turn (the block from L1 after the
     * first). */
    for (int64_t j = j0; j < nblocks; j++) {
        const float *kb = kplane + table[j] * bs * D;
        int64_t n = ctx - j * bs < bs ? ctx - j * bs : bs;
        prefetch_next(kplane, table, j, nblocks, bs * D * 4);
        int64_t t0 = j == j0 ? first - j * bs : 0;
        for (int64_t g = 0; g < G; g++) /* the block's keys stay in L1 across the G heads */
            dot_rows(qs + g * D, kb + t0 * D, n - t0, D, scores + g * ctx + j * bs + t0);
    }
    for (int64_t g = 0; g < G; g++) {
        float *restrict s = scores + g * ctx;
        float sum = softmax_weights(s, first, ctx);
        /* Weighted sum of the value rows, one query head at a time: its D accumulators stay
         * in registers across the rows (re-reading a block's values per head hits L1). */
        memset(acc, 0, (size_t)D * sizeof(float));
        for (int64_t j = j0; j < nblocks; j++) {
            const float *restrict vb = vplane + table[j] * bs * D;
            const float *restrict p = s + j * bs;
            int64_t n = ctx - j * bs < bs ? ctx - j * bs : bs;
            if (g == 0)
                prefetch_next(vplane, table, j, nblocks, bs * D * 4);
            for (int64_t t = j == j0 ? first - j * bs : 0; t < n; t++) {
#pragma omp simd
                for (int64_t i = 0; i < D; i++)
                    acc[i] += p[t] * vb[t * D + i];
            }
        }
        float inv = 1.0f / sum;
        float *restrict o = out + g * D;
#pragma omp simd
        for (int64_t i = 0; i < D; i++)
            o[i] = acc[i] * inv;
    }
}

/* attend_head over a float16 cache: each block's keys (then values) widened once into `blk`
 * (bs * D floats, stays in L1) and used for all G query heads; the weighted sum of values goes
 * block by block into `acc` (G * D floats), `sums` holds the G softmax denominators. */
static inline __attribute__((always_inline)) void attend_head_f16(
        const float *restrict qs, const uint16_t *restrict kplane,
        const uint16_t *restrict vplane, const int64_t *restrict table, int64_t first,
        int64_t ctx, int64_t G, int64_t D, int64_t bs, float *restrict scores,
        float *restrict acc, float *restrict sums, float *restrict blk, float *restrict out) {
    int64_t nblocks = (ctx + bs - 1) / bs;
    int64_t j0 = first / bs;
    for (int64_t j = j0; j < nblocks; j++) {
        int64_t n = ctx - j * bs < bs ? ctx - j * bs : bs;
        int64_t t0 = j == j0 ? first - j * bs : 0;
        prefetch_next(kplane, table, j, nblocks, bs * D * 2);
        widen_f16(kplane + (table[j] * bs + t0) * D, blk, (n - t0) * D);
        for (int64_t g = 0; g < G; g++)
            dot_rows(qs + g * D, blk, n - t0, D, scores + g * ctx + j * bs + t0);
    }
    for (int64_t g = 0; g < G; g++) {
        sums[g] = softmax_weights(scores + g * ctx, first, ctx);
    }
    memset(acc, 0, (size_t)(G * D) * sizeof(float));
    for (int64_t j = j0; j < nblocks; j++) {
        int64_t n = ctx - j * bs < bs ? ctx - j * bs : bs;
        int64_t t0 = j == j0 ? first - j * bs : 0;
        prefetch_next(vplane, table, j, nblocks, bs * D * 2);
        widen_f16(vplane + (table[j] * bs + t0) * D, blk, (n - t0) * D);
        for (int64_t g = 0; g < G; g++) {
            float *restrict a = acc + g * D;
            const float *restrict p = scores + g * ctx + j * bs;
            for (int64_t t = t0; t < n; t++) {
                const float *restrict vr = blk + (t - t0) * D;
#pragma omp simd
                for (int64_t i = 0; i < D; i++)
                    a[i] += p[t] * vr[i];
            }
        }
    }
    for (int64_t g = 0; g < G; g++) {
        float inv = 1.0f / sums[g];
        float *restrict o = out + g * D;
        const float *restrict a = acc + g * D;
#pragma omp simd
        for (int64_t i = 0; i < D; i++)
            o[i] = a[i] * inv;
    }
}

/* f16: the cache holds float16 (kv is a const uint16_t *), else float32; a constant at every
 * call site, so each copy keeps one path. */
static inline __attribute__((always_inline)) void run_batch(
        const float *restrict q, int64_t q_stride, const int64_t *restrict rows,
        const void *restrict kv, int f16, const int64_t *restrict block_tables,
        const int64_t *restrict context_lens, const int64_t *restrict window_starts,
        float *restrict out, int64_t B, int64_t Hq, int64_t Hkv, int64_t D, int64_t bs,
        int64_t num_blocks, int64_t max_blocks, float scale, float *restrict scratch,
        int64_t max_ctx, int64_t h0, int64_t h1) {
    int64_t G = Hq / Hkv;
    float *qs = scratch;
    float *acc = qs + G * D; /* G * D floats (float16: all heads at once; float32: one) */
    float *sums = acc + G * D;
    float *blk = sums + G;
    float *scores = blk + bs * D;
    int64_t plane = num_blocks * bs * D; /* one head's k (or v) of every block */
    (void)max_ctx;
    for (int64_t b = 0; b < B; b++) {
        int64_t row = rows ? rows[b] : b;
        const float *qrow = q + row * q_stride;
        float *orow = out + row * Hq * D;
        const int64_t *table = block_tables + b * max_blocks;
        for (int64_t h = h0; h < h1; h++) {
            const float *qh = qrow + h * G * D;
#pragma omp simd
            for (int64_t i = 0; i < G * D; i++)
                qs[i] = qh[i] * scale;
            int64_t first = window_starts ? window_starts[b] : 0;
            if (f16) {
                const uint16_t *kvh = kv;
                attend_head_f16(qs, kvh + h * plane, kvh + (Hkv + h) * plane, table, first,
                                context_lens[b], G, D, bs, scores, acc, sums, blk,
                                orow + h * G * D);
            } else {
                const float *kvf = kv;
                attend_head(qs, kvf + h * plane, kvf + (Hkv + h) * plane, table, first,
                            context_lens[b], G, D, bs, scores, acc, orow + h * G * D);
            }
        }
    }
}

/* q: num_rows rows of [Hq, D] floats, row r at q + r * q_stride; out: num_rows contiguous
 * rows of [Hq, D]. Sequence b reads query row rows[b] and writes output row rows[b] (rows may
 * be NULL: row b).
 * block_tables: [B, max_blocks] block ids; context_lens: [B] keys per sequence (its new token
 * included); window_starts: NULL, or [B] first key attended (sliding window: blocks wholly
 * before it are never read, so they may have been freed and reused).
 * Every id and length is checked before anything is read: returns PD_OK, or a
 * negative PD_* code (nothing written) naming what was wrong. */
static inline __attribute__((always_inline)) int decode(
        const float *q, int64_t q_stride, const int64_t *rows, int64_t num_rows,
        const void *kv, int f16, const int64_t *block_tables, const int64_t *context_lens,
        const int64_t *window_starts, float *out, int64_t B, int64_t Hq, int64_t Hkv, int64_t D,
        int64_t bs, int64_t num_blocks, int64_t max_blocks, float scale, int64_t h0,
        int64_t h1) {
    if (B < 0 || Hkv < 1 || Hq < Hkv || Hq % Hkv || D < 1 || bs < 1 || max_blocks < 0
        || h0 < 0 || h1 > Hkv || h0 >= h1)
        return PD_BAD_SHAPE;
    if (!rows && B > num_rows)
        return PD_BAD_ROW;
    int64_t max_ctx = 1;
    for (int64_t b = 0; b < B; b++) {
        if (rows && (rows[b] < 0 || rows[b] >= num_rows))
            return PD_BAD_ROW;
        int64_t ctx = context_lens[b];
        if (ctx < 1 || ctx > max_blocks * bs)
            return PD_BAD_CONTEXT_LEN;
        int64_t first = window_starts ? window_starts[b] : 0;
        if (first < 0 || first >= ctx)
            return PD_BAD_WINDOW;
        max_ctx = ctx > max_ctx ? ctx : max_ctx;
        const int64_t *table = block_tables + b * max_blocks;
        for (int64_t j = first / bs; j < (ctx + bs - 1) / bs; j++)
            if (table[j] < 0 || table[j] >= num_blocks)
                return PD_BAD_BLOCK_ID;
    }
    int64_t G = Hq / Hkv;
    float *scratch = malloc((size_t)(2 * G * D + G + bs * D + G * max_ctx) * sizeof(float));
    if (!scratch)
        return PD_NO_MEMORY;
    /* Common head dims get their own copy with D a constant (unrolled, no remainder loops). */
#define PD_RUN(DIM) run_batch(q, q_stride, rows, kv, f16, block_tables, context_lens, \
                              window_starts, out, B, Hq, Hkv, DIM, bs, num_blocks, max_blocks, \
                              scale, scratch, max_ctx, h0, h1)
    switch (D) {
    case 32: PD_RUN(32); break;
    case 64: PD_RUN(64); break;
    case 128: PD_RUN(128); break;
    default: PD_RUN(D); break;
    }
#undef PD_RUN
    free(scratch);
    return PD_OK;
}

int paged_decode_attention(const float *q, int64_t q_stride, const int64_t *rows,
                           int64_t num_rows, const float *kv, const int64_t *block_tables,
                           const int64_t *context_lens, const int64_t *window_starts,
                           float *out, int64_t B, int64_t Hq,
                           int64_t Hkv, int64_t D, int64_t bs, int64_t num_blocks,
                           int64_t max_blocks, float scale) {
    return decode(q, q_stride, rows, num_rows, kv, 0, block_tables, context_lens,
                  window_starts, out, B, Hq, Hkv, D, bs, num_blocks, max_blocks, scale, 0, Hkv);
}

/* The same over a float16 cache (IEEE binary16 bits, e.g. a torch.float16 tensor). */
int paged_decode_attention_f16(const float *q, int64_t q_stride, const int64_t *rows,
                               int64_t num_rows, const uint16_t *kv,
                               const int64_t *block_tables, const int64_t *context_lens,
                               const int64_t *window_starts, float *out, int64_t B,
                               int64_t Hq, int64_t Hkv, int64_t D, int64_t bs,
                               int64_t num_blocks, int64_t max_blocks, float scale) {
    return decode(q, q_stride, rows, num_rows, kv, 1, block_tables, context_lens,
                  window_starts, out, B, Hq, Hkv, D, bs, num_blocks, max_blocks, scale, 0, Hkv);
}

/* The same for kv heads h0 .. h1 - 1 only (and their query heads): the decode plan splits a
 * layer's heads over the quantized kernels' thread pool. Each head is computed exactly as in
 * the whole call. */
int paged_decode_attention_heads(const float *q, int64_t q_stride, const int64_t *rows,
                                 int64_t num_rows, const float *kv, const int64_t *block_tables,
                                 const int64_t *context_lens, const int64_t *window_starts,
                                 float *out, int64_t B, int64_t Hq, int64_t Hkv, int64_t D,
                                 int64_t bs, int64_t num_blocks, int64_t max_blocks, float scale,
                                 int64_t h0, int64_t h1) {
    return decode(q, q_stride, rows, num_rows, kv, 0, block_tables, context_lens,
                  window_starts, out, B, Hq, Hkv, D, bs, num_blocks, max_blocks, scale, h0, h1);
}

int paged_decode_attention_heads_f16(const float *q, int64_t q_stride, const int64_t *rows,
                                     int64_t num_rows, const uint16_t *kv,
                                     const int64_t *block_tables, const int64_t *context_lens,
                                     const int64_t *window_starts, float *out, int64_t B,
                                     int64_t Hq, int64_t Hkv, int64_t D, int64_t bs,
                                     int64_t num_blocks, int64_t max_blocks, float scale,
                                     int64_t h0, int64_t h1) {
    return decode(q, q_stride, rows, num_rows, kv, 1, block_tables, context_lens,
                  window_starts, out, B, Hq, Hkv, D, bs, num_blocks, max_blocks, scale, h0, h1);
}
