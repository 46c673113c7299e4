/* Persistent thread pool with a sense-reversing spin barrier (see threadpool.h).
 *
 * Workers wait for a new run by watching `generation`; the barrier counts arrivals in `arrived` and
 * flips `phase` when the last thread arrives (Mellor-Crummey & Scott, "Algorithms for scalable
 * synchronization on shared-memory multiprocessors", 1991, §3: sense-reversing centralized barrier).
 * Spinning backs off to sched_yield and then to a condition variable, so waiting threads give the
 * cores back when the machine is oversubscribed or the pool is idle. */
#include "core/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "core/status_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define SPIN_PAUSES 2000 /* ~10-50 us of pause before yielding the core */
#define SPIN_YIELDS 200   /* then yields before sleeping */

struct osp_threadpool {
    int n_threads;
    pthread_t *threads;
    /* run dispatch */
    _Atomic unsigned generation; /* bumped for every run and for shutdown */
    _Atomic int done;            /* workers finished with the current run */
    _Atomic bool stop;
    osp_task_fn fn;
    void *ctx;
    /* barrier */
    _Atomic int arrived;
    _Atomic unsigned phase;
    /* sleeping */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic int sleepers;
};

typedef struct worker_arg {
    osp_threadpool *p;
    int ith;
} worker_arg;

/* Waits until *v != old; returns the new value. Sleeps on the pool's condvar after spinning. */
static unsigned wait_change(osp_threadpool *p, _Atomic unsigned *v, unsigned old) {
    unsigned cur;
    for (int i = 0; i < SPIN_PAUSES; i++) {
        if ((cur = atomic_load_explicit(v, memory_order_acquire)) != old) return cur;
        CPU_RELAX();
    }
    for (int i = 0; i < SPIN_YIELDS; i++) {
        if ((cur = atomic_load_explicit(v, memory_order_acquire)) != old) return cur;
        sched_yield();
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    /* seq_cst pairs with the waker's seq_cst bump + sleepers load (Dekker): either it sees us or we
     * see its new value. */
    while ((cur = atomic_load(v)) == old) pthread_cond_wait(&p->cv, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return cur;
}

/* Publishes a change of *v (already stored) to sleepers. */
static void wake_all(osp_threadpool *p) {
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    osp_threadpool *p = wa->p;
    const int ith = wa->ith;
    free(wa);
    unsigned gen = 0;
    for (;;) {
        gen = wait_change(p, &p->generation, gen);
        if (atomic_load(&p->stop)) break;
        p->fn(p->ctx, ith, p->n_threads);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel);
    }
    return NULL;
}

osp_status osp_threadpool_create(int n_threads, osp_threadpool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return osp_set_error(OSP_ERR_INVALID_ARG, "threadpool: %d threads is out of range", n_threads);
    osp_threadpool *p = calloc(1, sizeof *p);
    if (!p) return osp_set_error(OSP_ERR_NOMEM, "threadpool: out of memory");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        osp_threadpool_free(p);
        return osp_set_error(OSP_ERR_NOMEM, "threadpool: out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa || pthread_create(&p->threads[i], NULL, worker_main, (wa->p = p, wa->ith = i, wa)) != 0) {
            free(wa);
            p->n_threads = i; /* join only the started ones */
            osp_threadpool_free(p);
            return osp_set_error(OSP_ERR_NOMEM, "threadpool: cannot start thread %d", i);
        }
    }
    *out = p;
    return OSP_OK;
}

void osp_threadpool_free(osp_threadpool *p) {
    if (!p) return;
    if (p->threads) {
        atomic_store(&p->stop, true);
        atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
        free(p->threads);
    }
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int osp_threadpool_n_threads(const osp_threadpool *p) { return p->n_threads; }

void osp_threadpool_run(osp_threadpool *p, osp_task_fn fn, void *ctx) {
    if (p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_fetch_add(&p->generation, 1);
    wake_all(p);
    fn(ctx, 0, p->n_threads);
    /* wait for the workers */
    const int want = p->n_threads - 1;
    for (long i = 0; atomic_load_explicit(&p->done, memory_order_acquire) < want; i++) {
        if (i < SPIN_PAUSES) CPU_RELAX();
        else sched_yield();
    }
}

void osp_threadpool_barrier(osp_threadpool *p) {
    if (p->n_threads == 1) return;
    const unsigned ph = atomic_load_explicit(&p->phase, memory_order_acquire);
    if (atomic_fetch_add_explicit(&p->arrived, 1, memory_order_acq_rel) == p->n_threads - 1) {
        atomic_store_explicit(&p->arrived, 0, memory_order_relaxed);
        atomic_fetch_add(&p->phase, 1);
        wake_all(p);
        return;
    }
    wait_change(p, &p->phase, ph);
}
