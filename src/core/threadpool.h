/* A persistent thread pool for one parallel region per forward pass.
 *
 * osp_threadpool_run(pool, fn, ctx) runs fn(ctx, ith, nth) on all nth threads at once (the caller is
 * thread 0) and returns when every thread has returned. Inside fn, threads split each op by rows and
 * meet at osp_threadpool_barrier() between dependent ops, so a whole forward pass costs one wake-up
 * and a few hundred cheap barriers instead of a fork/join per op (shared/DESIGN.md §7: on a 2-core
 * CPU a small model is bound by per-op overhead).
 *
 * Waiting spins with a pause instruction for a bounded time, then yields the core (sched_yield) and
 * finally sleeps on a futex-backed condition variable, so an oversubscribed machine does not livelock
 * and an idle pool costs nothing. */
#ifndef OSP_CORE_THREADPOOL_H
#define OSP_CORE_THREADPOOL_H

#include "osprey/status.h"

typedef struct osp_threadpool osp_threadpool;

/* fn runs on every thread; ith in [0, nth). */
typedef void (*osp_task_fn)(void *ctx, int ith, int nth);

/* Creates a pool of n_threads (>= 1; 1 means the caller alone, no extra threads).
 * Errors: OSP_ERR_INVALID_ARG, OSP_ERR_NOMEM (threads could not be started). */
osp_status osp_threadpool_create(int n_threads, osp_threadpool **out);
/* Stops and joins the threads. NULL is fine. Must not be called from inside fn. */
void osp_threadpool_free(osp_threadpool *p);
int osp_threadpool_n_threads(const osp_threadpool *p);

/* Runs fn on all threads and waits. Not reentrant: one run at a time per pool. */
void osp_threadpool_run(osp_threadpool *p, osp_task_fn fn, void *ctx);

/* Waits until all nth threads of the current run have reached this barrier. Call only from fn,
 * and from every thread the same number of times. Memory written before it is visible after it. */
void osp_threadpool_barrier(osp_threadpool *p);

/* The [begin, end) slice of n items that thread ith of nth owns (contiguous, balanced). */
static inline void osp_split(long long n, int ith, int nth, long long *begin, long long *end) {
    const long long per = n / nth, rem = n % nth;
    *begin = ith * per + (ith < rem ? ith : rem);
    *end = *begin + per + (ith < rem ? 1 : 0);
}

#endif
