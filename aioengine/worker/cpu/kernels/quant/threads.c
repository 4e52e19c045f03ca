#include "base.h"
#include "threads.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

/* The pool: workers spin for a while after each job, then sleep on a futex.
 *
 * A job is split into chunks of output rows that the caller and the workers take from a shared
 * counter, so a worker that is not running (its core busy with another process) costs nothing:
 * the caller takes its chunks. A worker joins a job by claiming it (a CAS on a word holding the
 * job's generation); once the caller has run out of chunks it closes the claims and waits only
 * for the workers that joined, which are running. A late worker sees the closed or newer claim
 * word and never touches the finished job. */

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
int pool_run(job_fn fn, void *arg, int nchunks, int nth) {
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

void qk_set_spin_ns(long ns) { atomic_store(&pool_spin_ns, ns); }

int qk_pool_size(void) { return pool_size; }
