/* The local communicator (comm.h): ranks are threads of one process; a reusable barrier (mutex and
 * condition variable, generation counted) orders four phases of an all-reduce: publish each rank's
 * buffer and length; rank 0 sizes the shared sum buffer; each rank sums its slice of the elements over
 * all ranks' buffers in rank order; each rank copies the whole sum back into its buffer. */
#include "backend/comm.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/status_internal.h"

#define OSP_COMM_MAX_WORLD 64

struct osp_comm {
    int32_t world;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t arrived;
    uint64_t generation;
    bool aborted;
    double timeout_s;  /* the watchdog: a rank waits at most this long in one barrier (0: forever) */
    bool timed_out;    /* the watchdog aborted it */
    float *bufs[OSP_COMM_MAX_WORLD];
    int64_t lens[OSP_COMM_MAX_WORLD];
    const float *srcs[OSP_COMM_MAX_WORLD]; /* all-gather: each rank's src, rows and cols, and its cols_r */
    int64_t rows[OSP_COMM_MAX_WORLD], cols[OSP_COMM_MAX_WORLD], cols_r[OSP_COMM_MAX_WORLD];
    float *sum; /* [cap] */
    int64_t cap;
    bool sum_failed; /* rank 0 could not grow sum this call */
};

osp_status osp_comm_local_create(int32_t world, osp_comm **out) {
    if (!out) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_comm_local_create: NULL argument");
    *out = NULL;
    if (world < 1 || world > OSP_COMM_MAX_WORLD)
        return osp_set_error(OSP_ERR_INVALID_ARG, "communicator: %d ranks (1..%d)", world, OSP_COMM_MAX_WORLD);
    osp_comm *c = calloc(1, sizeof *c);
    if (!c) return osp_set_error(OSP_ERR_NOMEM, "communicator: out of memory");
    c->world = world;
    c->timeout_s = OSP_COMM_DEFAULT_TIMEOUT_S;
    const char *e = getenv("OSPREY_COMM_TIMEOUT_S");
    if (e && *e) {
        char *end = NULL;
        const double t = strtod(e, &end);
        if (end && !*end && t >= 0 && isfinite(t)) c->timeout_s = t > OSP_COMM_MAX_TIMEOUT_S ? 0.0 : t;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* the watchdog's deadlines: immune to clock changes */
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    *out = c;
    return OSP_OK;
}

void osp_comm_free(osp_comm *c) {
    if (!c) return;
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c->sum);
    free(c);
}

int32_t osp_comm_world(const osp_comm *c) { return c->world; }

void osp_comm_abort(osp_comm *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->aborted = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

osp_status osp_comm_set_timeout(osp_comm *c, double seconds) {
    if (!c || !(seconds >= 0) || !isfinite(seconds))
        return osp_set_error(OSP_ERR_INVALID_ARG, "communicator: a timeout of %g s (0 or more; 0: none)", seconds);
    pthread_mutex_lock(&c->mu);
    c->timeout_s = seconds > OSP_COMM_MAX_TIMEOUT_S ? 0.0 : seconds; /* beyond a deadline's range: none */
    pthread_mutex_unlock(&c->mu);
    return OSP_OK;
}

/* Waits for every rank; false once aborted (before or while waiting), or when the watchdog fires: a rank
 * that waited timeout_s for the others aborts the communicator (every waiting rank wakes with the error). */
static bool barrier(osp_comm *c) {
    pthread_mutex_lock(&c->mu);
    const uint64_t gen = c->generation;
    if (!c->aborted && ++c->arrived == c->world) {
        c->arrived = 0;
        c->generation++;
        pthread_cond_broadcast(&c->cv);
    } else if (c->timeout_s > 0) {
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        const double whole = floor(c->timeout_s);
        dl.tv_sec += (time_t)whole;
        dl.tv_nsec += (long)((c->timeout_s - whole) * 1e9);
        if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
        while (!c->aborted && c->generation == gen) {
            if (pthread_cond_timedwait(&c->cv, &c->mu, &dl) == ETIMEDOUT && !c->aborted && c->generation == gen) {
                c->aborted = true;
                c->timed_out = true;
                pthread_cond_broadcast(&c->cv);
            }
        }
    } else {
        while (!c->aborted && c->generation == gen) pthread_cond_wait(&c->cv, &c->mu);
    }
    const bool ok = !c->aborted;
    pthread_mutex_unlock(&c->mu);
    return ok;
}

static osp_status aborted_error(osp_comm *c) {
    pthread_mutex_lock(&c->mu);
    const bool wd = c->timed_out;
    const double t = c->timeout_s;
    pthread_mutex_unlock(&c->mu);
    if (wd)
        return osp_set_error(OSP_ERR_INTERNAL, "communicator: aborted by the watchdog (a rank waited %g s for the others "
                                               "at a collective: one is stuck or gone; OSPREY_COMM_TIMEOUT_S sets the "
                                               "limit)", t);
    return osp_set_error(OSP_ERR_INTERNAL, "communicator: aborted (a rank failed)");
}

osp_status osp_comm_all_reduce_f32(osp_comm *c, int32_t rank, float *buf, int64_t n) {
    if (!c || rank < 0 || rank >= c->world) /* not a rank of c: it cannot join the others */
        return osp_set_error(OSP_ERR_INVALID_ARG, "all-reduce: rank %d of %d", rank, c ? c->world : 0);
    /* a rank's own bad arguments still cross the barrier (as length -1), so every rank returns the error */
    const bool bad = n < 0 || (n > 0 && !buf);
    if (bad && c->world == 1)
        return osp_set_error(OSP_ERR_INVALID_ARG, "all-reduce: %lld values at %p", (long long)n, (void *)buf);
    if (c->world == 1) return OSP_OK;
    c->bufs[rank] = buf;
    c->lens[rank] = bad ? -1 : n;
    if (!barrier(c)) return aborted_error(c);
    for (int32_t r = 0; r < c->world; r++)
        if (c->lens[r] != c->lens[0] || c->lens[r] < 0) {
            const int64_t n0 = c->lens[0], nr = c->lens[r];
            if (!barrier(c)) return aborted_error(c); /* nobody rewrites lens until all have read them */
            if (nr < 0 || n0 < 0)
                return osp_set_error(OSP_ERR_INVALID_ARG, "all-reduce: rank %d passed a negative length or a NULL buffer",
                                     nr < 0 ? r : 0);
            return osp_set_error(OSP_ERR_INVALID_ARG, "all-reduce: rank 0 has %lld values, rank %d %lld",
                                 (long long)n0, r, (long long)nr);
        }
    if (rank == 0) {
        c->sum_failed = false;
        if (n > c->cap) {
            float *s = realloc(c->sum, (size_t)n * sizeof *s);
            if (s) c->sum = s, c->cap = n;
            else c->sum_failed = true;
        }
    }
    if (!barrier(c)) return aborted_error(c);
    if (c->sum_failed) {
        if (!barrier(c)) return aborted_error(c);
        return osp_set_error(OSP_ERR_NOMEM, "all-reduce: out of memory for %lld values", (long long)n);
    }
    const int64_t i0 = n * rank / c->world, i1 = n * (rank + 1) / c->world;
    for (int64_t i = i0; i < i1; i++) {
        float s = c->bufs[0][i];
        for (int32_t r = 1; r < c->world; r++) s += c->bufs[r][i];
        c->sum[i] = s;
    }
    if (!barrier(c)) return aborted_error(c);
    if (n > 0) memcpy(buf, c->sum, (size_t)n * sizeof *buf);
    if (!barrier(c)) return aborted_error(c); /* sum and bufs are rewritten by the next call */
    return OSP_OK;
}

osp_status osp_comm_all_gather_f32(osp_comm *c, int32_t rank, const float *src, int64_t rows, int64_t cols_r, float *dst,
                                   int64_t cols) {
    if (!c || rank < 0 || rank >= c->world) /* not a rank of c: it cannot join the others */
        return osp_set_error(OSP_ERR_INVALID_ARG, "all-gather: rank %d of %d", rank, c ? c->world : 0);
    /* a rank's own bad arguments still cross the barrier (as a -1 share), so every rank returns the error */
    const bool bad = rows < 0 || cols_r < 0 || cols < cols_r || (rows > 0 && ((cols_r > 0 && !src) || (cols > 0 && !dst)));
    if (bad && c->world == 1)
        return osp_set_error(OSP_ERR_INVALID_ARG, "all-gather: %lld rows of %lld of %lld columns", (long long)rows,
                             (long long)cols_r, (long long)cols);
    if (c->world == 1) {
        if (cols_r != cols)
            return osp_set_error(OSP_ERR_INVALID_ARG, "all-gather: one rank with %lld of %lld columns", (long long)cols_r,
                                 (long long)cols);
        if (rows > 0 && cols > 0 && dst != src) memmove(dst, src, (size_t)rows * (size_t)cols * sizeof *dst);
        return OSP_OK;
    }
    c->srcs[rank] = src, c->rows[rank] = rows, c->cols[rank] = cols, c->cols_r[rank] = bad ? -1 : cols_r;
    if (!barrier(c)) return aborted_error(c);
    int64_t total = 0;
    bool same = true;
    for (int32_t r = 0; r < c->world; r++) {
        total += c->cols_r[r];
        same = same && c->cols_r[r] >= 0 && c->rows[r] == c->rows[0] && c->cols[r] == c->cols[0];
    }
    if (!same || total != c->cols[0]) {
        if (!barrier(c)) return aborted_error(c); /* nobody rewrites them until all have read them */
        return osp_set_error(OSP_ERR_INVALID_ARG, "all-gather: the ranks' rows, columns or shares disagree (%lld "
                             "columns, shares summing to %lld)", (long long)cols, (long long)total);
    }
    int64_t off = 0;
    for (int32_t r = 0; r < c->world; off += c->cols_r[r], r++)
        for (int64_t t = 0; t < rows && c->cols_r[r] > 0; t++)
            memcpy(dst + t * cols + off, c->srcs[r] + t * c->cols_r[r], (size_t)c->cols_r[r] * sizeof *dst);
    if (!barrier(c)) return aborted_error(c); /* the srcs are read until here */
    return OSP_OK;
}
