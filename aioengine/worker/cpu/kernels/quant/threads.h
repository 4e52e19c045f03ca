/* The kernels' one thread pool per process, and how a job's output rows are cut into chunks.
 *
 * No OpenMP: torch already runs its own OpenMP runtime in this process. The decode plan runs
 * its attention heads over the same pool (qk_pool_run), so the process never oversubscribes. */
#ifndef QK_THREADS_H
#define QK_THREADS_H

#include <stdint.h>

typedef void (*job_fn)(void *arg, int chunk, int nchunks);

/* run fn over nchunks chunks on the calling thread and up to nth - 1 pool threads */
int pool_run(job_fn fn, void *arg, int nchunks, int nth);
/* the same, for other compiled code (checks nth: E_THREADS outside 1..256) */
int qk_pool_run(job_fn fn, void *arg, int nchunks, int nth);
void qk_set_spin_ns(long ns);
int qk_pool_size(void);

/* chunks a job of n rows is cut into for nth threads: 4 per thread (a descheduled worker's
 * share is taken by the others), at least 16 rows each */
static inline int chunks_for(int64_t n, int nth) {
    if (nth <= 1) return 1;
    int64_t c = 4 * (int64_t)nth, most = (n + 15) / 16;
    if (c > most) c = most;
    return c < 1 ? 1 : (int)c;
}

static inline void rows_of(int64_t n, int tid, int nth, int64_t *r0, int64_t *r1) {
    /* contiguous row ranges, multiples of 4 rows except the last */
    int64_t per = ((n + nth - 1) / nth + 3) & ~(int64_t)3;
    *r0 = per * tid < n ? per * tid : n;
    *r1 = per * (tid + 1) < n ? per * (tid + 1) : n;
}

/* groups of chunk c out of nchunks: contiguous, an even number of groups (16 rows, 64 bytes of
 * y per x row) except the last, so two threads never write one cache line of y */
static inline void x8_groups_of(int64_t ngroups, int c, int nchunks, int64_t *g0, int64_t *g1) {
    int64_t per = ((ngroups + nchunks - 1) / nchunks + 1) & ~(int64_t)1;
    *g0 = per * c < ngroups ? per * c : ngroups;
    *g1 = per * (c + 1) < ngroups ? per * (c + 1) : ngroups;
}

/* at most one thread per 4 output rows */
static inline int threads_for_rows(int nthreads, int64_t n) {
    if ((int64_t)nthreads * 4 > n) nthreads = (int)((n + 3) / 4) > 0 ? (int)((n + 3) / 4) : 1;
    return nthreads;
}

#endif
