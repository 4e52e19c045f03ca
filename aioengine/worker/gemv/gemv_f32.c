/* Float32 matrix-vector products for CPU decode: y[M, N] = x[M, K] @ W[N, K]^T for small M.
 *
 * Decode at batch 1 reads every weight once per token and does two flops per weight: it is
 * bound by memory bandwidth, not arithmetic. torch's sgemm path for M = 1 reaches about half
 * of this machine's read bandwidth (see docs/benchmarks.md); this kernel streams W once, one
 * row at a time with eight-wide FMAs into four accumulators, x held in L1, and splits the rows
 * over a small persistent thread pool.
 *
 * W is torch's nn.Linear layout (row n = output feature n, K contiguous): no repacking, the
 * same tensor serves torch's GEMM for prefill. For M > 1 each W row is loaded from memory
 * once and reused from L1 for every row of x.
 *
 * Threads: rows are handed out in chunks from an atomic counter (dynamic: a core shared with
 * another process does less, not the whole step late). Workers spin for a short while after a
 * job (the next GEMV of the layer comes within microseconds), then sleep on a futex. No
 * OpenMP: torch runs its own OpenMP runtime in this process; torch's pool is idle while this
 * one runs (decode-sized torch ops stay below its parallel grain), and this one sleeps while
 * torch's runs (prefill takes torch's GEMM).
 *
 * Build: -O3 -march=native (the AVX2/FMA path when the CPU has it, plain C loops the compiler
 * vectorizes otherwise).
 */

#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define GV_AVX2 1
#else
#define GV_AVX2 0
#endif

#define GV_OK 0
#define GV_BAD_SHAPE -1
#define GV_BAD_THREADS -2
#define GV_NO_THREAD -3

#define GV_MAX_THREADS 64
#define GV_CHUNK_ROWS 32 /* rows per grab: 32 x K floats, 72 KB at K = 576 */

int gemv_f32_version(void) { return 1; }
int gemv_f32_has_avx2(void) { return GV_AVX2; }

/* ---- the row kernel ---------------------------------------------------------------------- */

#if GV_AVX2
static inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}
#endif

/* One W row at a time, four independent accumulators over K: a single sequential stream per
 * thread. Measured on the 2-core EPYC (one thread, 700 MB of rows): 24 GB/s, the same as a
 * plain read of the bytes, where interleaving four rows (four streams) gave 14 GB/s and two
 * rows 11 GB/s. For M > 1 the row (K floats, a few KB) is reused from L1 for every x row. */
static void row1(const float *x, int64_t ldx, int64_t m, const float *w, int64_t k, float *y,
                 int64_t ldy, int64_t n) {
    const float *wr = w + n * k;
    for (int64_t mi = 0; mi < m; mi++) {
        const float *xr = x + mi * ldx;
        float s = 0.0f;
        int64_t i = 0;
#if GV_AVX2
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (; i + 32 <= k; i += 32) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i), _mm256_loadu_ps(xr + i), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i + 8), _mm256_loadu_ps(xr + i + 8), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i + 16), _mm256_loadu_ps(xr + i + 16),
                                 a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i + 24), _mm256_loadu_ps(xr + i + 24),
                                 a3);
        }
        for (; i + 8 <= k; i += 8)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i), _mm256_loadu_ps(xr + i), a0);
        s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
#else
        float s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (; i + 4 <= k; i += 4) {
            s += wr[i] * xr[i], s1 += wr[i + 1] * xr[i + 1];
            s2 += wr[i + 2] * xr[i + 2], s3 += wr[i + 3] * xr[i + 3];
        }
        s += s1 + s2 + s3;
#endif
        for (; i < k; i++)
            s += wr[i] * xr[i];
        y[mi * ldy + n] = s;
    }
}

static void rows(const float *x, int64_t ldx, int64_t m, const float *w, int64_t k, float *y,
                 int64_t ldy, int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; n++)
        row1(x, ldx, m, w, k, y, ldy, n);
}

/* ---- the pool ---------------------------------------------------------------------------- */

typedef struct {
    const float *x, *w;
    float *y;
    int64_t ldx, m, n, k, ldy;
} job_t;

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static int pool_workers = 0; /* threads started (besides the callers) */
static job_t pool_job;
static _Atomic int64_t next_chunk;
static _Atomic int64_t num_chunks;
static _Atomic uint32_t generation; /* bumped per job; futex word */
static _Atomic int active_workers;  /* workers that may take part in the current job */
static _Atomic int accepting;       /* 1 while the current job's chunks may still be taken */
static _Atomic int in_job;          /* workers inside a job (joined, not yet left) */
static _Atomic int sleepers;        /* workers in (or about to enter) futex_wait */
static _Atomic int spin_iters = 20000;

static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
#if defined(__linux__)
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
#else
    (void)addr, (void)val;
    sched_yield();
#endif
}

static void futex_wake_all(_Atomic uint32_t *addr) {
#if defined(__linux__)
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
#else
    (void)addr;
#endif
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void run_chunks(void) {
    const job_t *j = &pool_job;
    int64_t total = atomic_load_explicit(&num_chunks, memory_order_acquire);
    for (;;) {
        int64_t c = atomic_fetch_add_explicit(&next_chunk, 1, memory_order_relaxed);
        if (c >= total)
            return;
        int64_t lo = c * GV_CHUNK_ROWS, hi = lo + GV_CHUNK_ROWS;
        rows(j->x, j->ldx, j->m, j->w, j->k, j->y, j->ldy, lo, hi < j->n ? hi : j->n);
    }
}

static void *worker_main(void *arg) {
    /* index in the low 16 bits, the generation current at creation above them: a worker that
     * starts after the job it was made for was posted still takes part in it */
    uint64_t packed = (uint64_t)(uintptr_t)arg;
    int index = (int)(packed & 0xFFFF);
    uint32_t seen = (uint32_t)(packed >> 16);
    for (;;) {
        uint32_t g;
        int spins = atomic_load_explicit(&spin_iters, memory_order_relaxed);
        while ((g = atomic_load_explicit(&generation, memory_order_acquire)) == seen) {
            if (spins > 0) {
                spins--;
                cpu_relax();
            } else {
                atomic_fetch_add(&sleepers, 1);
                futex_wait(&generation, seen); /* returns at once if generation moved on */
                atomic_fetch_sub(&sleepers, 1);
            }
        }
        seen = g;
        if (index < atomic_load(&active_workers)) {
            /* Join, then look whether the job is still open: a worker that wakes late (its
             * core was busy) finds it closed and leaves; the caller never waits for it. */
            atomic_fetch_add(&in_job, 1);
            if (atomic_load(&accepting))
                run_chunks();
            atomic_fetch_sub(&in_job, 1);
        }
    }
    return NULL;
}

static void pool_atfork_child(void) {
    /* threads do not survive fork: a child starts a fresh pool on its first threaded call */
    pthread_mutex_init(&pool_lock, NULL);
    pool_workers = 0;
}

static int ensure_workers(int want) {
    static int atfork_done = 0;
    if (!atfork_done) {
        pthread_atfork(NULL, NULL, pool_atfork_child);
        atfork_done = 1;
    }
    while (pool_workers < want) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        uint64_t packed = ((uint64_t)atomic_load(&generation) << 16) | (uint64_t)pool_workers;
        int rc = pthread_create(&t, &attr, worker_main, (void *)(uintptr_t)packed);
        pthread_attr_destroy(&attr);
        if (rc != 0)
            return GV_NO_THREAD;
        pool_workers++;
    }
    return GV_OK;
}

/* How long (pause instructions) an idle worker spins before it sleeps. */
void gemv_f32_set_spin(int iters) { atomic_store(&spin_iters, iters < 0 ? 0 : iters); }

int gemv_f32(const float *x, int64_t ldx, int64_t m, const float *w, int64_t n, int64_t k,
             float *y, int64_t ldy, int nthreads) {
    if (m < 1 || n < 1 || k < 1 || ldx < k || ldy < n)
        return GV_BAD_SHAPE;
    if (nthreads < 1 || nthreads > GV_MAX_THREADS)
        return GV_BAD_THREADS;
    int64_t chunks = (n + GV_CHUNK_ROWS - 1) / GV_CHUNK_ROWS;
    if (nthreads > chunks)
        nthreads = (int)chunks;
    if (nthreads == 1) {
        rows(x, ldx, m, w, k, y, ldy, 0, n);
        return GV_OK;
    }
    /* one threaded job at a time (TP ranks are processes; callers here are serial anyway) */
    pthread_mutex_lock(&pool_lock);
    int rc = ensure_workers(nthreads - 1);
    if (rc != GV_OK) {
        pthread_mutex_unlock(&pool_lock);
        return rc;
    }
    pool_job = (job_t){x, w, y, ldx, m, n, k, ldy};
    atomic_store_explicit(&next_chunk, 0, memory_order_relaxed);
    atomic_store_explicit(&num_chunks, chunks, memory_order_relaxed);
    atomic_store(&active_workers, nthreads - 1);
    atomic_store(&accepting, 1);
    atomic_fetch_add(&generation, 1);
    if (atomic_load(&sleepers) > 0) /* spinning workers see the new generation by themselves */
        futex_wake_all(&generation);
    run_chunks();
    /* every chunk is taken: close the job, then wait for the workers still computing theirs
     * (yielding now and then: on a loaded machine one may have lost its core) */
    atomic_store(&accepting, 0);
    for (int spins = 0; atomic_load(&in_job) > 0; spins++) {
        if (spins % 1024 == 1023)
            sched_yield();
        else
            cpu_relax();
    }
    pthread_mutex_unlock(&pool_lock);
    return GV_OK;
}
