/* Tiered KV offload, the engine's side (see offload.h). */
#include "engine/offload.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "backend/kv_layout.h"
#include "core/clock.h"
#include "core/status_internal.h"
#include "kv/kv_cache.h"
#include "kv/prefix_cache.h"

#define EMA_WEIGHT 0.25         /* of the newest measurement */
#define PROMPT_STEP_TOKENS 64   /* steps at least this long measure the prompt rate */
#define STAGING_BYTES (256u << 20) /* host buffers of background loads at most (at least one block) */
#define STAGE_BYTES (64u << 20)    /* the page-locked chunk blocks go to and from the device through */

/* where a block of a load comes from; SRC_IPC: a SRC_REMOTE block the loader wrote into its page itself,
   from the producer's arena (CUDA IPC: kv/transfer.h) */
enum { SRC_HOST = 0, SRC_DISK = 1, SRC_REMOTE = 2, SRC_IPC = 3 };

/* A background load: blocks read from disk or fetched from a producer by the loader thread into
 * buffers, written into the pages by the step thread when poll finds it done. */
typedef struct batch {
    uint64_t token;
    int32_t n, n_done;          /* n_done: read so far (loader), under mu */
    bool cancelled;             /* under mu */
    bool copying;               /* the loader is writing its pages (CUDA IPC), under mu: cancel waits */
    int32_t *ids;               /* [n] pool blocks */
    osp_block_hash *h;          /* [n] */
    uint8_t *buf;               /* [n * block_bytes] */
    osp_kv_read_result *res;    /* [n]; a host-tier block is copied (OK) at start */
    uint8_t *src;               /* [n] SRC_* */
    double read_s, remote_s;    /* the loader's seconds on the disk blocks, on the fetches */
    /* the producer of the SRC_REMOTE blocks (a copy of the request's kv_transfer_params) */
    osp_kv_transfer_params remote;
    bool release;               /* this fetch is the request's last: the producer drops its copies */
    char remote_err[240];       /* why a fetch failed (loader; read by poll), or empty */
    bool remote_io;             /* it failed on the network (OSP_ERR_IO), not by the producer's refusal */
    struct batch *next;
} batch;

/* A consumer's release of a producer's copies it did not need to fetch to the end (loader thread) */
typedef struct release {
    osp_kv_transfer_params remote;
    struct release *next;
} release;

struct osp_offload {
    osp_kv_offload *store;      /* NULL without tiers (a transfer role only) */
    void *pinned_arena;         /* the host tier's slots and buf, page-locked by the backend (or NULL) */
    bool pinned_buf;
    /* STAGE_BLOCKS blocks of host memory, page-locked where the backend copies by DMA: a producer's held
       blocks are read through it, and a background load's blocks written through it, a chunk a wait */
    uint8_t *stage;
    int32_t stage_blocks;
    bool pinned_stage;
    osp_kv_role role;
    osp_kv_xfer_server *xsrv;   /* a producer's */
    /* CUDA IPC between processes on one device (OSPREY_KV_IPC not "0", a backend that has it): a producer's
       arena of transfer slots (its server hands out their offsets), a consumer's mapped producer arenas */
    void *arena;
    osp_kv_xfer_peers *peers;
    int64_t recv_ipc_blocks;    /* a consumer's, of recv_blocks: written from a producer's arena (step thread) */
    char xfer_host[256];
    uint64_t engine_id;         /* the transfer identity (identity_hash with content) */
    size_t block_bytes;
    release *releases;          /* under mu */
    int64_t recv_blocks, failed_blocks; /* a consumer's, step thread */
    double recv_s;
    int64_t saved_blocks, host_loaded_blocks; /* osp_offload_stats */
    double save_s, host_load_s;
    double logged_xfer_at;      /* the last transfer warning (0: never) */
    double logged_hold_at;      /* the last "not held" warning (0: never) */
    /* producers whose last fetch failed (connect, a stall, a cut answer): not asked again for
       XFER_BACKOFF_S, their requests computed at once instead of each waiting out the same failure
       (the loader fetches one at a time), step thread */
    struct { char host[256]; int32_t port; double until; } down[8];
    int32_t n_down;
    int64_t logged_xfer_failed;
    osp_kv_cache *kv;
    void *buf;                  /* one block, host */
    /* background loads (a disk tier or a consumer's fetches): the loader thread reads the queue's
       batches in order, and sends releases */
    pthread_t loader;
    bool loader_started, stop;  /* stop under mu */
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_cond_t copied;      /* a batch's copying went false */
    batch *queue, *queue_tail;  /* under mu; each batch stays in the list until poll or cancel takes it */
    uint64_t next_token;
    void (*loaded)(void *ctx);
    void *loaded_ctx;
    void (*log)(void *ctx, const char *line);
    void *log_ctx;
    int64_t logged_io, logged_corrupt, logged_missing; /* counts already reported */
    int64_t logged_dir_lost;           /* the disk directory's losses already reported (each: one line) */
    int64_t logged_full, logged_freed; /* full-disk pauses (each: one line) and blocks freed, already reported */
    double logged_at;                  /* when (0: never) */
    size_t staging_bytes, staging_cap; /* buffers of the batches in the list (step thread) */
    osp_status err;
    bool no_cost_model;
    const osp_kv_event_sink *sink;
    osp_prefix_hash_algo algo;
    double load_s, prefill_s;   /* EMAs: seconds per block loaded, per prompt token computed (0: none yet) */
};

static void ema(double *x, double v) { *x = *x > 0 ? (1 - EMA_WEIGHT) * *x + EMA_WEIGHT * v : v; }

/* ---- hooks ------------------------------------------------------------------------------------ */

/* The pool's evicted blocks into the store: those it holds already (loaded from there) only marked recently
 * used; the others read from the pool in runs of up to EVICT_RUN blocks straight into the host slots they
 * will occupy (page-locked on the GPU: one transfer and one wait a run, no memcpy after), or, without a
 * host tier, one at a time through the bounce buffer to disk. */
#define EVICT_RUN 64
static void on_evict(void *ctx, int32_t n, const int32_t *ids, const osp_block_hash *hs) {
    osp_offload *o = ctx;
    const osp_kv_offload_stats cap = osp_kv_offload_get_stats(o->store);
    if (cap.capacity[OSP_KV_TIER_HOST] == 0 && cap.capacity[OSP_KV_TIER_DISK] == 0)
        return; /* the disk tier was turned off (its directory could not be made again) and there is no host tier */
    const double t0 = osp_now_s();
    int32_t run_ids[EVICT_RUN], run_at[EVICT_RUN];
    void *slots[EVICT_RUN];
    for (int32_t i = 0; i < n && o->err == OSP_OK;) {
        int32_t m = 0; /* the next run of blocks the store does not hold */
        for (; i < n && m < EVICT_RUN; i++) {
            if (osp_kv_offload_where(o->store, &hs[i]) >= 0) osp_kv_offload_put(o->store, &hs[i], NULL);
            else run_ids[m] = ids[i], run_at[m++] = i;
        }
        if (m == 0) break;
        int32_t k = osp_kv_offload_host_slots_next(o->store, m, slots);
        if (k == 0) k = 1, slots[0] = o->buf; /* no host tier: through the bounce buffer, a block at a time */
        for (int32_t at = 0; at < m && o->err == OSP_OK; at += k) {
            if (at > 0 && slots[0] != o->buf) k = osp_kv_offload_host_slots_next(o->store, m - at, slots);
            if (k > m - at) k = m - at;
            const osp_status s = osp_kv_cache_blocks_read(o->kv, k, run_ids + at, slots);
            if (s != OSP_OK) {
                o->err = s;
                return;
            }
            for (int32_t j = 0; j < k; j++) osp_kv_offload_put(o->store, &hs[run_at[at + j]], slots[j]);
            o->saved_blocks += k;
        }
    }
    o->save_s += osp_now_s() - t0;
}

static void on_tier_change(void *ctx, const osp_block_hash *h, int tier, bool stored) {
    const osp_offload *o = ctx;
    const char *medium = tier == OSP_KV_TIER_HOST ? "CPU" : "DISK";
    const uint64_t x = osp_block_hash_external(h, o->algo);
    if (stored && o->sink->tier_stored) o->sink->tier_stored(o->sink->ctx, x, medium);
    if (!stored && o->sink->tier_removed) o->sink->tier_removed(o->sink->ctx, x, medium);
}

static bool is_consumer(const osp_offload *o) { return o->role == OSP_KV_ROLE_CONSUMER || o->role == OSP_KV_ROLE_BOTH; }
static bool is_producer(const osp_offload *o) { return o->role == OSP_KV_ROLE_PRODUCER || o->role == OSP_KV_ROLE_BOTH; }

static void log_xfer(osp_offload *o, const char *what) {
    if (!o->log) return;
    const double now = osp_now_s();
    if (o->logged_xfer_at > 0 && now - o->logged_xfer_at < 60.0) return; /* at most one warning a minute */
    char line[600];
    if (!strncmp(what, "kv transfer: ", 13)) what += 13; /* a fetch's own message */
    snprintf(line, sizeof line, "kv transfer: %s; the prompt is computed here instead (%lld blocks so far)", what,
             (long long)o->failed_blocks);
    o->log(o->log_ctx, line);
    o->logged_xfer_at = now;
}

#define XFER_BACKOFF_S 10.0

static bool producer_down(osp_offload *o, const osp_kv_transfer_params *t) {
    const double now = osp_now_s();
    for (int32_t i = 0; i < o->n_down; i++)
        if (o->down[i].until > now && o->down[i].port == t->remote_port && !strcmp(o->down[i].host, t->remote_host))
            return true;
    return false;
}

static void mark_down(osp_offload *o, const osp_kv_transfer_params *t) {
    const double now = osp_now_s();
    int32_t k = -1; /* this producer's slot, else an expired one, else a new one, else the first to expire */
    for (int32_t i = 0; i < o->n_down && k < 0; i++)
        if (o->down[i].port == t->remote_port && !strcmp(o->down[i].host, t->remote_host)) k = i;
    for (int32_t i = 0; i < o->n_down && k < 0; i++)
        if (o->down[i].until <= now) k = i;
    if (k < 0 && o->n_down < 8) k = o->n_down++;
    if (k < 0) {
        k = 0;
        for (int32_t i = 1; i < o->n_down; i++)
            if (o->down[i].until < o->down[k].until) k = i;
    }
    snprintf(o->down[k].host, sizeof o->down[k].host, "%s", t->remote_host);
    o->down[k].port = t->remote_port;
    o->down[k].until = now + XFER_BACKOFF_S;
}

/* Block `index` of r is at r's producer, not yet asked for. A producer of another identity, or one whose
 * last fetch failed in the last XFER_BACKOFF_S, is given up on at the first look (every block counted as
 * failed, the prompt computed here). */
static bool remote_has(osp_offload *o, osp_request *r, int32_t index) {
    if (!is_consumer(o) || !r->has_kv_xfer || !r->kv_xfer.do_remote_prefill) return false;
    const int32_t n = r->kv_xfer.remote_num_blocks;
    if (r->kv_xfer_tried < n && producer_down(o, &r->kv_xfer)) {
        o->failed_blocks += n - r->kv_xfer_tried;
        r->kv_xfer_tried = n;
        char what[400];
        snprintf(what, sizeof what, "the producer %s:%d failed a fetch in the last %.0f s: not asked again yet",
                 r->kv_xfer.remote_host, r->kv_xfer.remote_port, XFER_BACKOFF_S);
        log_xfer(o, what);
    }
    if (r->kv_xfer_tried < n && r->kv_xfer.remote_engine_id != o->engine_id) {
        o->failed_blocks += n - r->kv_xfer_tried;
        r->kv_xfer_tried = n;
        char what[400];
        snprintf(what, sizeof what, "the producer %s:%d has engine id %016llx, this engine %016llx (another model, "
                 "page format, device or --prefix-caching-hash-seed)", r->kv_xfer.remote_host, r->kv_xfer.remote_port,
                 (unsigned long long)r->kv_xfer.remote_engine_id, (unsigned long long)o->engine_id);
        log_xfer(o, what);
    }
    return index >= r->kv_xfer_tried && index < n;
}

static bool tier_contains(void *ctx, osp_request *r, int32_t index, const osp_block_hash *h) {
    osp_offload *o = ctx;
    if (o->err != OSP_OK) return false;
    return (o->store && osp_kv_offload_where(o->store, h) >= 0) || remote_has(o, r, index);
}

static bool tier_worth(void *ctx, const osp_request *r, int32_t n_blocks) {
    (void)n_blocks; /* both sides scale with the count */
    const osp_offload *o = ctx;
    if (is_consumer(o) && r->has_kv_xfer && r->kv_xfer.do_remote_prefill) return true; /* computed already */
    const int32_t bs = o->kv->block_size;
    return o->no_cost_model || o->load_s <= 0 || o->prefill_s <= 0 || o->load_s < (double)bs * o->prefill_s;
}

static void batch_free(batch *b) {
    if (!b) return;
    free(b->ids);
    free(b->h);
    free(b->buf);
    free(b->res);
    free(b->src);
    free(b);
}

/* Writes block i of a finished load into its pool block: false when it did not load. */
static bool write_block(osp_offload *o, const int32_t id, const void *bytes) {
    const osp_status s = osp_kv_cache_block_write(o->kv, id, bytes);
    if (s != OSP_OK && o->err == OSP_OK) o->err = s;
    return s == OSP_OK;
}

#define XFER_TIMEOUT_S 3.0 /* a fetch's connect / send / receive stall limit (its whole: 2 of these plus the
                              payload at 50 MB/s, kv/transfer.h) */

/* A consumer's CUDA IPC write (osp_kv_xfer_fetch_ipc): blocks first.. of batch b straight from the
 * producer's mapped arena into their pages, on the loader thread (a stream apart from the steps'; the
 * blocks are the load's, out of every step's use). A cancelled batch is not written, and cancel waits for
 * a write in progress (the scheduler frees the blocks after it). */
typedef struct ipc_write_ctx {
    osp_offload *o;
    batch *b;
    int32_t first;
} ipc_write_ctx;

static osp_status ipc_write(void *ctx, int32_t n, const void *const *srcs) {
    ipc_write_ctx *w = ctx;
    osp_offload *o = w->o;
    batch *b = w->b;
    int32_t *ids = malloc(sizeof *ids * (size_t)n);
    const void **from = malloc(sizeof *from * (size_t)n);
    if (!ids || !from) {
        free(ids);
        free(from);
        return osp_set_error(OSP_ERR_NOMEM, "kv transfer: out of memory");
    }
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++)
        if (srcs[i]) ids[m] = b->ids[w->first + i], from[m++] = srcs[i];
    pthread_mutex_lock(&o->mu);
    const bool cancelled = b->cancelled;
    b->copying = !cancelled;
    pthread_mutex_unlock(&o->mu);
    osp_status st = cancelled ? osp_set_error(OSP_ERR_INVALID_ARG, "kv transfer: the request went away") : OSP_OK;
    if (!cancelled) st = osp_kv_cache_blocks_write_device(o->kv, m, ids, from);
    pthread_mutex_lock(&o->mu);
    b->copying = false;
    pthread_cond_broadcast(&o->copied);
    pthread_mutex_unlock(&o->mu);
    free(ids);
    free(from);
    return st;
}

static void *loader_main(void *arg) {
    osp_offload *o = arg;
    const size_t bb = o->block_bytes;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        batch *b = o->queue;
        while (b && b->n_done == b->n) b = b->next;
        if (!b && o->releases) { /* releases after the loads: a load is someone's first token */
            release *rl = o->releases;
            o->releases = rl->next;
            pthread_mutex_unlock(&o->mu);
            osp_kv_xfer_fetch(rl->remote.remote_host, rl->remote.remote_port, rl->remote.remote_engine_id,
                              rl->remote.remote_request_id, bb, NULL, 0, true, XFER_TIMEOUT_S, NULL, NULL);
            free(rl); /* a failed release: the producer drops the copies at its timeout */
            pthread_mutex_lock(&o->mu);
            continue;
        }
        if (!b) {
            if (o->stop) break;
            pthread_cond_wait(&o->wake, &o->mu);
            continue;
        }
        const int32_t i = b->n_done;
        int32_t m = 1; /* blocks handled now: a run of remote ones goes in one fetch */
        const bool skip = b->cancelled || b->src[i] == SRC_HOST;
        if (!skip && b->src[i] == SRC_REMOTE)
            while (i + m < b->n && b->src[i + m] == SRC_REMOTE) m++;
        pthread_mutex_unlock(&o->mu);
        /* the batch stays listed (poll and cancel only take done ones), so b lives */
        if (!skip && b->src[i] == SRC_DISK) {
            const double t0 = osp_now_s();
            b->res[i] = osp_kv_offload_read(o->store, &b->h[i], b->buf + (size_t)i * bb);
            b->read_s += osp_now_s() - t0;
        } else if (!skip) {
            const double t0 = osp_now_s();
            const bool last = b->release && i + m == b->n;
            ipc_write_ctx wc = {.o = o, .b = b, .first = i};
            bool via_ipc = false;
            const osp_status st = osp_kv_xfer_fetch_ipc(o->peers, b->remote.remote_host, b->remote.remote_port,
                                                        b->remote.remote_engine_id, b->remote.remote_request_id, bb,
                                                        &b->h[i], m, last, XFER_TIMEOUT_S, ipc_write, &wc,
                                                        b->buf + (size_t)i * bb, &b->res[i], &via_ipc);
            for (int32_t k = 0; via_ipc && k < m; k++)
                if (b->res[i + k] == OSP_KV_READ_OK) b->src[i + k] = SRC_IPC; /* in its page already */
            b->remote_s += osp_now_s() - t0;
            if (st != OSP_OK) snprintf(b->remote_err, sizeof b->remote_err, "%s", osp_last_error());
            b->remote_io = st == OSP_ERR_IO;
        }
        pthread_mutex_lock(&o->mu);
        b->n_done += m;
        if (b->n_done == b->n && o->loaded) {
            pthread_mutex_unlock(&o->mu); /* the engine's lock is taken inside: never under ours */
            o->loaded(o->loaded_ctx);
            pthread_mutex_lock(&o->mu);
        }
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

static int32_t tier_start(void *ctx, osp_request *r, const int32_t *ids, const osp_block_hash *hashes, int32_t first,
                          int32_t n, uint64_t *token, int32_t *n_ok) {
    osp_offload *o = ctx;
    *token = 0;
    *n_ok = 0;
    if (o->err != OSP_OK) return 0;
    /* where each block comes from: a tier first, else the producer (tier_contains said one holds it) */
    bool any_bg = false;
    for (int32_t i = 0; i < n && !any_bg; i++)
        any_bg = !(o->store && osp_kv_offload_where(o->store, &hashes[i]) == OSP_KV_TIER_HOST);
    if (!any_bg || !o->loader_started) { /* host memory (or no loader): now, in order, up to the first miss */
        const double t0 = osp_now_s();
        /* the host tier's blocks in place, all written in one go (page-locked on the GPU: DMA) */
        const void **srcs = malloc(sizeof *srcs * (size_t)n);
        int32_t m = 0;
        while (srcs && m < n && o->store && (srcs[m] = osp_kv_offload_host_block(o->store, &hashes[m]))) m++;
        if (m > 0) {
            const osp_status st = osp_kv_cache_blocks_write(o->kv, m, ids, srcs);
            if (st != OSP_OK && o->err == OSP_OK) o->err = st;
            *n_ok = st == OSP_OK ? m : 0;
        }
        free(srcs);
        while (*n_ok == m && *n_ok < n && o->store && osp_kv_offload_get(o->store, &hashes[*n_ok], o->buf) &&
               write_block(o, ids[*n_ok], o->buf)) /* disk blocks without a loader thread: one at a time */
            ++*n_ok, ++m;
        if (*n_ok > 0) ema(&o->load_s, (osp_now_s() - t0) / *n_ok);
        o->host_loaded_blocks += *n_ok;
        o->host_load_s += osp_now_s() - t0;
        return n;
    }
    const size_t bb = o->block_bytes;
    int32_t m = 0; /* blocks the staging room takes (at least one while nothing is staged) */
    while (m < n && (o->staging_bytes + (size_t)(m + 1) * bb <= o->staging_cap || (o->staging_bytes == 0 && m == 0))) m++;
    if (m == 0) return 0; /* the buffers are taken: recomputed */
    batch *b = calloc(1, sizeof *b);
    if (b) {
        b->ids = malloc(sizeof *b->ids * (size_t)m);
        b->h = malloc(sizeof *b->h * (size_t)m);
        b->buf = malloc(bb * (size_t)m);
        b->res = calloc((size_t)m, sizeof *b->res);
        b->src = calloc((size_t)m, sizeof *b->src);
    }
    if (!b || !b->ids || !b->h || !b->buf || !b->res || !b->src) {
        batch_free(b);
        return 0; /* out of memory: recomputed */
    }
    b->n = m;
    memcpy(b->ids, ids, sizeof *ids * (size_t)m);
    memcpy(b->h, hashes, sizeof *hashes * (size_t)m);
    /* a block in no tier comes from the producer only when the request names one: a tier can lose blocks
       between tier_contains and here (a disk directory found removed forgets all of its), and such a block
       is missing, recomputed, not a remote fetch */
    const bool remote = is_consumer(o) && r->has_kv_xfer && r->kv_xfer.do_remote_prefill;
    for (int32_t i = 0; i < m; i++) { /* host-tier blocks now: the tier may reuse their slots meanwhile */
        const int where = o->store ? osp_kv_offload_where(o->store, &hashes[i]) : -1;
        b->src[i] = where == OSP_KV_TIER_HOST ? SRC_HOST
                    : where == OSP_KV_TIER_DISK ? SRC_DISK
                    : remote && first + i < r->kv_xfer.remote_num_blocks ? SRC_REMOTE
                                                                          : SRC_HOST; /* lost: missing below */
        if (b->src[i] == SRC_HOST)
            b->res[i] = where == OSP_KV_TIER_HOST && osp_kv_offload_get_host(o->store, &hashes[i], b->buf + (size_t)i * bb)
                            ? OSP_KV_READ_OK
                            : OSP_KV_READ_MISSING;
        if (b->src[i] == SRC_REMOTE) {
            b->remote = r->kv_xfer;
            if (first + i + 1 > r->kv_xfer_tried) r->kv_xfer_tried = first + i + 1; /* asked for once */
        }
    }
    /* the request's last remote blocks: the producer drops its copies after answering */
    if (b->src[m - 1] == SRC_REMOTE && r->kv_xfer_tried >= r->kv_xfer.remote_num_blocks && !r->kv_xfer_released)
        b->release = r->kv_xfer_released = true;
    b->token = ++o->next_token;
    o->staging_bytes += (size_t)m * bb;
    pthread_mutex_lock(&o->mu);
    if (o->queue_tail) o->queue_tail->next = b;
    else o->queue = b;
    o->queue_tail = b;
    pthread_cond_signal(&o->wake);
    pthread_mutex_unlock(&o->mu);
    *token = b->token;
    return m;
}

/* Takes batch b (done) out of the list; mu held. */
static void unlink_batch(osp_offload *o, batch *b) {
    batch **pp = &o->queue, *prev = NULL;
    while (*pp && *pp != b) prev = *pp, pp = &(*pp)->next;
    if (!*pp) return;
    *pp = b->next;
    if (o->queue_tail == b) o->queue_tail = prev;
    b->next = NULL;
}

/* Blocks ids[0..n) from the contiguous host bytes src, through the stage: a chunk copied in, then written
 * with one wait (from page-locked memory: DMA). */
static osp_status write_staged(osp_offload *o, int32_t n, const int32_t *ids, const uint8_t *src) {
    const size_t bb = o->block_bytes;
    const void *srcs[64];
    for (int32_t at = 0; at < n;) {
        int32_t m = n - at < o->stage_blocks ? n - at : o->stage_blocks;
        if (m > 64) m = 64;
        memcpy(o->stage, src + (size_t)at * bb, (size_t)m * bb);
        for (int32_t i = 0; i < m; i++) srcs[i] = o->stage + (size_t)i * bb;
        OSP_TRY(osp_kv_cache_blocks_write(o->kv, m, ids + at, srcs));
        at += m;
    }
    return OSP_OK;
}

/* A finished batch's remote outcomes into the consumer's counts (and a warning for a failed fetch). */
static void count_remote(osp_offload *o, const batch *b) {
    int32_t ok = 0, bad = 0;
    for (int32_t i = 0; i < b->n; i++) {
        if (b->src[i] == SRC_REMOTE || b->src[i] == SRC_IPC) b->res[i] == OSP_KV_READ_OK ? ok++ : bad++;
        o->recv_ipc_blocks += b->src[i] == SRC_IPC;
    }
    o->recv_blocks += ok;
    o->failed_blocks += bad;
    o->recv_s += b->remote_s;
    if (b->remote_err[0] && b->remote_io) mark_down(o, &b->remote); /* unreachable or stuck, not a refusal */
    if (b->remote_err[0]) log_xfer(o, b->remote_err);
    else if (bad > 0) {
        char what[400];
        snprintf(what, sizeof what, "%d of %d blocks did not come from %s:%d (not held there, or corrupt)", bad,
                 ok + bad, b->remote.remote_host, b->remote.remote_port);
        log_xfer(o, what);
    }
}

static bool tier_poll(void *ctx, uint64_t *token, int32_t *n_ok) {
    osp_offload *o = ctx;
    const size_t bb = o->block_bytes;
    for (;;) {
        pthread_mutex_lock(&o->mu);
        batch *b = o->queue;
        while (b && b->n_done < b->n) b = b->next;
        if (b) unlink_batch(o, b);
        pthread_mutex_unlock(&o->mu);
        if (!b) return false;
        o->staging_bytes -= (size_t)b->n * bb;
        if (b->cancelled) { /* its request went away: nothing is written, the disk outcomes still count */
            for (int32_t i = 0; i < b->n; i++)
                if (b->src[i] == SRC_DISK) osp_kv_offload_settle(o->store, &b->h[i], b->res[i]);
            batch_free(b);
            continue;
        }
        count_remote(o, b);
        int32_t ok = 0, n_disk = 0;
        for (int32_t i = 0; i < b->n; i++) {
            if (b->src[i] == SRC_DISK) osp_kv_offload_settle(o->store, &b->h[i], b->res[i]), n_disk++;
            if (ok == i && b->res[i] == OSP_KV_READ_OK) ok++;
        }
        /* the loaded prefix, through the page-locked stage a chunk at a time (one wait each), but for the
           blocks the loader wrote from a producer's arena (CUDA IPC) */
        for (int32_t at = 0; at < ok;) {
            if (b->src[at] == SRC_IPC) {
                at++;
                continue;
            }
            int32_t end = at;
            while (end < ok && b->src[end] != SRC_IPC) end++;
            const osp_status st = write_staged(o, end - at, b->ids + at, b->buf + (size_t)at * bb);
            if (st != OSP_OK && o->err == OSP_OK) o->err = st;
            if (st != OSP_OK) ok = 0;
            at = end;
        }
        if (n_disk > 0 && b->read_s > 0) ema(&o->load_s, b->read_s / n_disk);
        *token = b->token;
        *n_ok = ok;
        batch_free(b);
        return true;
    }
}

static void tier_cancel(void *ctx, uint64_t token) {
    osp_offload *o = ctx;
    pthread_mutex_lock(&o->mu);
    for (batch *b = o->queue; b; b = b->next)
        if (b->token == token) {
            b->cancelled = true; /* poll frees it once the loader is past it */
            while (b->copying) pthread_cond_wait(&o->copied, &o->mu); /* its pages are the scheduler's after this */
        }
    pthread_mutex_unlock(&o->mu);
}

/* ---- fingerprint ------------------------------------------------------------------------------- */

/* The model's content for a transfer's engine id: its size and XXH3 of its first and last 4 MiB (the GGUF
 * header, metadata and tensor table, and the last tensors' data), so two hosts with copies of one file
 * agree where a path and a modification time would not. 0 when the file cannot be read. */
static uint64_t model_content_hash(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    enum { SPAN = 4 << 20 };
    uint8_t *buf = malloc(SPAN);
    XXH3_state_t *st = XXH3_createState();
    uint64_t h = 0;
    if (buf && st && fseeko(f, 0, SEEK_END) == 0) {
        const off_t size = ftello(f);
        XXH3_64bits_reset(st);
        XXH3_64bits_update(st, &size, sizeof size);
        const off_t tail = size > SPAN ? size - SPAN : 0;
        size_t got = 0;
        if (fseeko(f, 0, SEEK_SET) == 0 && (got = fread(buf, 1, SPAN, f)) > 0) XXH3_64bits_update(st, buf, got);
        if (tail > 0 && fseeko(f, tail, SEEK_SET) == 0 && (got = fread(buf, 1, SPAN, f)) > 0)
            XXH3_64bits_update(st, buf, got);
        h = XXH3_64bits_digest(st);
    }
    XXH3_freeState(st);
    free(buf);
    fclose(f);
    return h;
}

/* Identity of the KV a block holds. The disk tier's fingerprint (content = false) names the model file
 * by real path, size and modification time (cheap at every start; a replaced file starts afresh); a
 * transfer's engine id (content = true) by size and content (model_content_hash), plus the block hashes'
 * algorithm and seed. Both cover the device, the exact / quantized-weights modes, the CPU activations
 * (only when not the default), the page formats and the fixed scales. */
static uint64_t identity_hash(const osp_offload_identity *id, const osp_kv_cache *kv, bool content) {
    char text[PATH_MAX + 640];
    int n = 0;
    if (id->model_path && content) {
        n = snprintf(text, sizeof text, "model-content=%016llx", (unsigned long long)model_content_hash(id->model_path));
    } else if (id->model_path) {
        char real[PATH_MAX];
        struct stat sb = {0};
        const char *path = realpath(id->model_path, real) ? real : id->model_path;
        stat(path, &sb);
        n = snprintf(text, sizeof text, "model=%s size=%lld mtime=%lld.%09ld", path, (long long)sb.st_size,
                     (long long)sb.st_mtim.tv_sec, (long)sb.st_mtim.tv_nsec);
    } else {
        n = snprintf(text, sizeof text, "random=%s seed=%llu", id->random_weights ? id->random_weights : "",
                     (unsigned long long)id->random_seed);
    }
    if (n < 0 || n >= (int)sizeof text) n = (int)sizeof text - 1;
    int m = snprintf(text + n, sizeof text - (size_t)n,
                     " device=%d exact=%d qw=%d layers=%d block=%d k=%d/%zu/%zu/%d v=%d/%zu/%zu/%d", id->device, id->exact,
                     id->gpu_quant_weights, kv->n_layer, kv->block_size, (int)kv->k_fmt.elem_type,
                     kv->k_fmt.bytes_per_token, kv->k_fmt.scale_bytes_per_token, kv->k_fmt.k_hadamard,
                     (int)kv->v_fmt.elem_type, kv->v_fmt.bytes_per_token, kv->v_fmt.scale_bytes_per_token,
                     kv->v_fmt.k_hadamard);
    if (m > 0 && n + m < (int)sizeof text) n += m;
    if (id->cpu_activations && n < (int)sizeof text) { /* the default's fingerprints stay as they were */
        m = snprintf(text + n, sizeof text - (size_t)n, " cpu-act=%d", id->cpu_activations);
        if (m > 0 && n + m < (int)sizeof text) n += m;
    }
    if (content && n < (int)sizeof text)
        snprintf(text + n, sizeof text - (size_t)n, " hash=%d/%016llx", (int)id->hash_algo,
                 (unsigned long long)id->hash_seed);
    XXH3_state_t *st = XXH3_createState();
    uint64_t fp = 0;
    if (st) {
        XXH3_64bits_reset(st);
        XXH3_64bits_update(st, text, strlen(text));
        /* fixed scales: the same codes mean other values under other scales */
        if (kv->k_fixed) XXH3_64bits_update(st, kv->k_fixed, sizeof(float) * (size_t)kv->n_layer * kv->k_fmt.fixed_scales_per_layer);
        if (kv->v_fixed) XXH3_64bits_update(st, kv->v_fixed, sizeof(float) * (size_t)kv->n_layer * kv->v_fmt.fixed_scales_per_layer);
        fp = XXH3_64bits_digest(st);
        XXH3_freeState(st);
    } else {
        fp = XXH3_64bits(text, strlen(text));
    }
    return fp;
}

/* ---- CUDA IPC callbacks (kv/transfer.h), into the KV cache's backend ----------------------------- */

static osp_status arena_to_host(void *ctx, void *dst, const void *src, size_t bytes) {
    return osp_kv_cache_device_to_host(ctx, dst, src, bytes);
}

static osp_status peer_open(void *ctx, const uint8_t handle[OSP_KV_XFER_HANDLE_BYTES], void **base) {
    return osp_kv_cache_ipc_open(ctx, handle, base);
}

static void peer_close(void *ctx, void *base) { osp_kv_cache_ipc_close(ctx, base); }

_Static_assert(OSP_KV_XFER_HANDLE_BYTES == OSP_KV_IPC_HANDLE_BYTES && OSP_KV_XFER_UUID_BYTES == OSP_KV_UUID_BYTES,
               "the transfer's IPC sizes are the KV cache's");

/* ---- public ------------------------------------------------------------------------------------ */

osp_status osp_offload_create(const osp_offload_config *cfg, const osp_offload_identity *id, osp_kv_cache *kv,
                              osp_scheduler *sched, osp_offload **out) {
    *out = NULL;
    osp_offload *o = calloc(1, sizeof *o);
    if (!o) return osp_set_error(OSP_ERR_NOMEM, "kv offload: out of memory");
    o->kv = kv;
    o->no_cost_model = cfg->no_cost_model;
    o->sink = cfg->sink;
    o->algo = cfg->hash_algo;
    o->role = cfg->role;
    o->block_bytes = osp_kv_cache_block_bytes(kv);
    const bool tiers_on = cfg->tiers.host_bytes != 0 || (cfg->tiers.disk_dir && cfg->tiers.disk_dir[0]);
    osp_kv_offload_config tiers = cfg->tiers;
    tiers.listener = o->sink ? on_tier_change : NULL;
    tiers.listener_ctx = o;
    osp_status s = OSP_OK;
    /* the disk tier's directory is the model's and page format's (the fingerprint: LMCache keys its disk
       by model and format too); its blocks are one hash identity's (another seed's are removed) */
    char hid[64];
    snprintf(hid, sizeof hid, "hash=%d/%016llx", (int)id->hash_algo, (unsigned long long)id->hash_seed);
    tiers.hash_id = XXH3_64bits(hid, strlen(hid));
    if (tiers_on) s = osp_kv_offload_create(&tiers, o->block_bytes, identity_hash(id, kv, false), &o->store);
    if (s == OSP_OK && !(o->buf = malloc(o->block_bytes))) s = osp_set_error(OSP_ERR_NOMEM, "kv offload: out of memory");
    o->stage_blocks = (int32_t)(STAGE_BYTES / o->block_bytes);
    if (o->stage_blocks < 1) o->stage_blocks = 1;
    if (o->stage_blocks > 64) o->stage_blocks = 64;
    if (s == OSP_OK && !(o->stage = malloc((size_t)o->stage_blocks * o->block_bytes)))
        s = osp_set_error(OSP_ERR_NOMEM, "kv offload: out of memory");
    if (s == OSP_OK && o->role != OSP_KV_ROLE_NONE) {
        o->engine_id = identity_hash(id, kv, true);
        /* the address a consumer is told: the listening one, unless that is a wildcard, then $POD_IP (as
           the KV events' topic takes it), else the host name */
        const char *ip = cfg->xfer_ip && cfg->xfer_ip[0] ? cfg->xfer_ip : "127.0.0.1";
        if (!strcmp(ip, "0.0.0.0") || !strcmp(ip, "::") || !strcmp(ip, "*")) {
            const char *pod = getenv("POD_IP");
            if (pod && pod[0]) snprintf(o->xfer_host, sizeof o->xfer_host, "%s", pod);
            else if (gethostname(o->xfer_host, sizeof o->xfer_host - 1) != 0) snprintf(o->xfer_host, sizeof o->xfer_host, "%s", ip);
        } else {
            snprintf(o->xfer_host, sizeof o->xfer_host, "%s", ip);
        }
    }
    const char *ipc_env = getenv("OSPREY_KV_IPC");
    const bool ipc = !(ipc_env && !strcmp(ipc_env, "0")) && osp_kv_cache_ipc_capable(kv) && o->role != OSP_KV_ROLE_NONE;
    uint8_t uuid[OSP_KV_UUID_BYTES];
    osp_kv_xfer_device dev = {.to_host = arena_to_host, .ctx = kv};
    if (s == OSP_OK && ipc && osp_kv_cache_device_uuid(kv, uuid) == OSP_OK) {
        memcpy(dev.uuid, uuid, sizeof uuid);
        if (is_producer(o)) { /* the arena: the transfer buffer's size, on the device */
            dev.bytes = cfg->xfer_cap_bytes / o->block_bytes * o->block_bytes;
            const osp_status as = dev.bytes ? osp_kv_cache_arena_create(kv, dev.bytes, &o->arena, dev.handle) : OSP_OK;
            if (as != OSP_OK && cfg->log) {
                char line[600];
                snprintf(line, sizeof line, "kv transfer: no CUDA IPC arena (%s); transfers go through host memory and "
                         "TCP (a smaller kv_buffer_size or --gpu-memory-utilization leaves room)", osp_last_error());
                cfg->log(cfg->log_ctx, line);
            }
            dev.base = o->arena;
            if (as == OSP_OK && o->arena && cfg->log) {
                char line[200];
                snprintf(line, sizeof line, "kv transfer: CUDA IPC arena of %zu MiB on the device (consumers on this GPU copy "
                         "from it; OSPREY_KV_IPC=0 turns it off)", dev.bytes >> 20);
                cfg->log(cfg->log_ctx, line);
            }
        }
        if (is_consumer(o)) {
            osp_kv_xfer_ipc xi = {.open = peer_open, .close = peer_close, .ctx = kv};
            memcpy(xi.uuid, uuid, sizeof uuid);
            s = osp_kv_xfer_peers_create(&xi, &o->peers);
            if (s == OSP_OK && cfg->log)
                cfg->log(cfg->log_ctx, "kv transfer: CUDA IPC on: blocks from a producer on this GPU are copied device to "
                                       "device (OSPREY_KV_IPC=0 turns it off)");
        }
    }
    if (s == OSP_OK && is_producer(o)) {
        const char *bind = !cfg->xfer_ip || !cfg->xfer_ip[0] ? "127.0.0.1" : !strcmp(cfg->xfer_ip, "*") ? "0.0.0.0" : cfg->xfer_ip;
        const osp_kv_xfer_server_config xc = {.ip = bind,
                                              .port = cfg->xfer_port, .block_bytes = o->block_bytes,
                                              .engine_id = o->engine_id, .cap_bytes = cfg->xfer_cap_bytes,
                                              .timeout_s = cfg->xfer_timeout_s,
                                              .device = o->arena ? &dev : NULL};
        s = osp_kv_xfer_server_create(&xc, &o->xsrv);
    }
    if (s != OSP_OK) {
        osp_kv_xfer_peers_destroy(o->peers);
        osp_kv_cache_arena_free(kv, o->arena);
        osp_kv_offload_destroy(o->store);
        free(o->buf);
        free(o->stage);
        free(o);
        return s;
    }
    /* the host tier's slots and the eviction buffer page-locked where the backend copies by DMA (the GPU):
       a block's copies then run at the bus's speed instead of through the driver's staging */
    void *arena = NULL;
    size_t arena_bytes = 0;
    if (o->store) osp_kv_offload_host_arena(o->store, &arena, &arena_bytes);
    if (osp_kv_cache_host_register(kv, arena, arena_bytes)) o->pinned_arena = arena;
    o->pinned_buf = osp_kv_cache_host_register(kv, o->buf, o->block_bytes);
    o->pinned_stage = osp_kv_cache_host_register(kv, o->stage, (size_t)o->stage_blocks * o->block_bytes);
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->wake, NULL);
    pthread_cond_init(&o->copied, NULL);
    o->loaded = cfg->loaded;
    o->loaded_ctx = cfg->loaded_ctx;
    o->log = cfg->log;
    o->log_ctx = cfg->log_ctx;
    if (o->log && o->store) {
        const osp_kv_offload_stats st = osp_kv_offload_get_stats(o->store);
        char line[1200];
        const char *sub = osp_kv_offload_disk_path(o->store);
        if (st.foreign_removed > 0) {
            snprintf(line, sizeof line,
                     "kv offload: removed %lld blocks (%.1f MiB) from %s: %s, so no block hash of this run could ever "
                     "match them%s", (long long)st.foreign_removed, (double)st.foreign_bytes / 1048576.0, sub,
                     st.foreign_unknown ? "written by an older osprey that did not record its prefix-cache hash seed"
                                        : "written under another prefix-cache hash seed or algorithm "
                                          "(--prefix-caching-hash-seed, --prefix-caching-hash-algo)",
                     id->hash_seed_set ? "" : " (without --prefix-caching-hash-seed each start hashes with a seed of "
                                              "its own: give one to keep disk blocks across restarts)");
            o->log(o->log_ctx, line);
        }
        if (st.trimmed > 0) {
            snprintf(line, sizeof line,
                     "kv offload: removed the %lld oldest blocks (%.1f MiB) of an earlier run from %s to fit "
                     "--kv-offload-disk-size (%.3f GiB: %lld blocks); the %lld most recent are kept",
                     (long long)st.trimmed, (double)st.trimmed_bytes / 1048576.0, sub,
                     (double)cfg->tiers.disk_bytes / 1073741824.0, (long long)st.capacity[OSP_KV_TIER_DISK],
                     (long long)st.found_at_start);
            o->log(o->log_ctx, line);
        }
        if (st.unlocked) {
            snprintf(line, sizeof line, "kv offload: WARNING: the file system of %s has no flock, so the directory is "
                     "not locked: make sure no other server uses it", sub);
            o->log(o->log_ctx, line);
        }
        if (st.found_at_start > 0) {
            snprintf(line, sizeof line, "kv offload: %lld blocks of an earlier run found in %s", (long long)st.found_at_start,
                     osp_kv_offload_disk_path(o->store));
            o->log(o->log_ctx, line);
        }
        if (st.other_dirs > 0) {
            snprintf(line, sizeof line,
                     "kv offload: %s also holds %lld directories of other models or page formats (%.1f MiB), never read "
                     "and not counted in --kv-offload-disk-size: remove them when their model is gone",
                     cfg->tiers.disk_dir, (long long)st.other_dirs, (double)st.other_bytes / 1048576.0);
            o->log(o->log_ctx, line);
        }
    }
    o->staging_cap = STAGING_BYTES;
    if ((cfg->tiers.disk_dir && cfg->tiers.disk_dir[0]) || is_consumer(o)) {
        if (pthread_create(&o->loader, NULL, loader_main, o) == 0) o->loader_started = true;
        /* else: disk blocks load on the step thread (tier_start's synchronous path); remote ones are computed */
    }
    if (o->store) {
        const osp_status hs = osp_block_pool_set_evict_hook(osp_scheduler_pool(sched), on_evict, o);
        if (hs != OSP_OK) {
            osp_offload_destroy(o, NULL);
            return hs;
        }
    }
    if (o->store || is_consumer(o)) {
        const osp_sched_tier t = {.ctx = o, .contains = tier_contains, .worth = tier_worth, .start = tier_start,
                                  .poll = tier_poll, .cancel = tier_cancel};
        osp_scheduler_set_tier(sched, &t);
    }
    *out = o;
    return OSP_OK;
}

void osp_offload_destroy(osp_offload *o, osp_scheduler *sched) {
    if (!o) return;
    if (sched) {
        osp_block_pool_set_evict_hook(osp_scheduler_pool(sched), NULL, NULL);
        osp_scheduler_set_tier(sched, NULL);
    }
    if (o->loader_started) {
        pthread_mutex_lock(&o->mu);
        o->stop = true;
        for (batch *b = o->queue; b; b = b->next) b->cancelled = true; /* the loader skips what is left */
        pthread_cond_signal(&o->wake);
        pthread_mutex_unlock(&o->mu);
        pthread_join(o->loader, NULL); /* it sends the releases queued before it stops */
    }
    for (batch *b = o->queue, *next; b; b = next) next = b->next, batch_free(b);
    for (release *rl = o->releases, *next; rl; rl = next) next = rl->next, free(rl);
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->wake);
    pthread_cond_destroy(&o->copied);
    osp_kv_xfer_server_destroy(o->xsrv); /* no answer reads the arena after this */
    osp_kv_cache_arena_free(o->kv, o->arena);
    osp_kv_xfer_peers_destroy(o->peers); /* the loader is gone: nothing copies from the mappings */
    if (o->pinned_arena) osp_kv_cache_host_unregister(o->kv, o->pinned_arena);
    if (o->pinned_buf) osp_kv_cache_host_unregister(o->kv, o->buf);
    if (o->pinned_stage) osp_kv_cache_host_unregister(o->kv, o->stage);
    osp_kv_offload_destroy(o->store);
    free(o->buf);
    free(o->stage);
    free(o);
}

/* ---- prefill/decode transfer ------------------------------------------------------------------- */

typedef struct hold_ctx {
    osp_offload *o;
    const osp_request *r;
    int32_t n, first, count; /* the request's n blocks; blocks first..first+count are in the stage */
} hold_ctx;

/* Block i of the request (asked in order): from the stage, which is refilled a chunk at a time with one
 * wait (page-locked on the GPU: DMA instead of a staged copy a segment). */
static osp_status hold_read(void *ctx, int32_t i, void *dst) {
    hold_ctx *h = ctx;
    osp_offload *o = h->o;
    if (i < h->first || i >= h->first + h->count) {
        int32_t m = h->n - i < o->stage_blocks ? h->n - i : o->stage_blocks;
        if (m > 64) m = 64;
        void *dsts[64];
        for (int32_t k = 0; k < m; k++) dsts[k] = o->stage + (size_t)k * o->block_bytes;
        OSP_TRY(osp_kv_cache_blocks_read(o->kv, m, h->r->block_ids + i, dsts));
        h->first = i, h->count = m;
    }
    memcpy(dst, o->stage + (size_t)(i - h->first) * o->block_bytes, o->block_bytes);
    return OSP_OK;
}

/* The request's n blocks into arena slots dsts[0..n) (device to device, after the step that computed them). */
static osp_status hold_copy(void *ctx, int32_t n, void *const *dsts) {
    hold_ctx *h = ctx;
    return osp_kv_cache_blocks_read_device(h->o->kv, n, h->r->block_ids, dsts);
}

osp_status osp_offload_hold(osp_offload *o, osp_request *r) {
    r->kv_xfer_id = 0;
    r->kv_xfer_blocks = 0;
    if (!o->xsrv) return OSP_OK;
    int32_t n = r->num_prompt / o->kv->block_size; /* full prompt blocks: those the consumer can match */
    if (n > r->num_hashes) n = r->num_hashes;
    if (n <= 0) return OSP_OK;
    hold_ctx h = {.o = o, .r = r, .n = n};
    osp_status err = OSP_OK;
    /* in the device arena (one batched device copy, no host memory), else in host memory */
    uint64_t id = o->arena ? osp_kv_xfer_server_hold_device(o->xsrv, r->hashes, n, hold_copy, &h, &err) : 0;
    if (err != OSP_OK) return err;
    if (id == 0) id = osp_kv_xfer_server_hold(o->xsrv, r->hashes, n, hold_read, &h, &err);
    if (err != OSP_OK) return err;
    if (id != 0) r->kv_xfer_id = id, r->kv_xfer_blocks = n;
    if (id == 0 && o->log) { /* too big for the buffer (or out of memory): its consumer computes it */
        const double now = osp_now_s();
        if (o->logged_hold_at == 0 || now - o->logged_hold_at >= 60.0) {
            char line[300];
            snprintf(line, sizeof line, "kv transfer: a prompt of %d blocks (%.1f MiB) was not held: larger than the "
                     "transfer buffer (kv_buffer_size), or out of memory; its consumer computes it", n,
                     (double)n * (double)o->block_bytes / 1048576.0);
            o->log(o->log_ctx, line);
            o->logged_hold_at = now;
        }
    }
    return OSP_OK;
}

void osp_offload_admitted(osp_offload *o, osp_request *r) {
    if (!is_consumer(o) || !r->has_kv_xfer || !r->kv_xfer.do_remote_prefill || r->kv_xfer_released) return;
    r->kv_xfer_released = true;
    if (!o->loader_started) return; /* the producer drops its copies at its timeout */
    release *rl = calloc(1, sizeof *rl);
    if (!rl) return;
    rl->remote = r->kv_xfer;
    pthread_mutex_lock(&o->mu);
    release **pp = &o->releases;
    while (*pp) pp = &(*pp)->next;
    *pp = rl;
    pthread_cond_signal(&o->wake);
    pthread_mutex_unlock(&o->mu);
}

osp_kv_xfer_server *osp_offload_producer(const osp_offload *o) { return o->xsrv; }

osp_kv_transfer_info osp_offload_transfer_info(const osp_offload *o) {
    osp_kv_transfer_info info = {.role = o ? o->role : OSP_KV_ROLE_NONE};
    if (!o || o->role == OSP_KV_ROLE_NONE) return info;
    snprintf(info.host, sizeof info.host, "%s", o->xfer_host);
    info.port = o->xsrv ? osp_kv_xfer_server_port(o->xsrv) : 0;
    info.engine_id = o->engine_id;
    return info;
}

/* ---- step bookkeeping -------------------------------------------------------------------------- */

void osp_offload_note_step(osp_offload *o, int32_t tokens, double seconds) {
    if (tokens >= PROMPT_STEP_TOKENS && seconds > 0) ema(&o->prefill_s, seconds / tokens);
    if (!o->log || !o->store) return;
    const osp_kv_offload_stats st = osp_kv_offload_get_stats(o->store);
    const char *dir = osp_kv_offload_disk_path(o->store) ? osp_kv_offload_disk_path(o->store) : "(no disk tier)";
    char line[1200];
    if (st.dir_lost != o->logged_dir_lost) { /* the directory removed or replaced: one line each time, at once */
        const long long forgotten = (long long)(st.missing - o->logged_missing);
        if (st.disk_off)
            snprintf(line, sizeof line,
                     "kv offload: the disk tier's directory %s was removed or replaced while serving and cannot be "
                     "made again (%s): disk tier off until restart; %lld disk blocks forgotten (recomputed when needed)",
                     dir, osp_kv_offload_disk_error(o->store) ? osp_kv_offload_disk_error(o->store) : "?", forgotten);
        else
            snprintf(line, sizeof line,
                     "kv offload: the disk tier's directory %s was removed or replaced while serving: made it again; "
                     "%lld disk blocks forgotten (recomputed when needed)", dir, forgotten);
        o->log(o->log_ctx, line);
        /* the writes that failed with it are explained by this line; later ones get the warning below */
        o->logged_dir_lost = st.dir_lost, o->logged_missing = st.missing, o->logged_io = st.io_errors;
    }
    if (st.disk_full != o->logged_full) { /* writes paused by a full disk: one line a pause, at once */
        snprintf(line, sizeof line,
                 "kv offload: the disk under %s is full (%s) even after removing %lld of the tier's oldest blocks: "
                 "no disk writes for %.0f s (its blocks are still loaded; blocks not saved meanwhile are dropped, "
                 "counted in osprey:kv_offload_write_errors_total, and recomputed when needed)", dir,
                 osp_kv_offload_full_error(o->store) ? osp_kv_offload_full_error(o->store) : "?",
                 (long long)(st.full_freed - o->logged_freed), st.full_pause_s);
        o->log(o->log_ctx, line);
        o->logged_full = st.disk_full, o->logged_freed = st.full_freed, o->logged_io = st.io_errors;
    }
    if (st.io_errors == o->logged_io && st.corrupt == o->logged_corrupt && st.missing == o->logged_missing &&
        st.full_freed == o->logged_freed)
        return;
    const double now = osp_now_s();
    if (o->logged_at > 0 && now - o->logged_at < 60.0) return; /* at most one warning a minute */
    snprintf(line, sizeof line,
             "kv offload: %lld disk writes failed (blocks dropped), %lld disk blocks failed their checks and %lld were "
             "missing (both recomputed), %lld removed to make room on a full disk so far, in %s",
             (long long)st.io_errors, (long long)st.corrupt, (long long)st.missing, (long long)st.full_freed, dir);
    o->log(o->log_ctx, line);
    o->logged_io = st.io_errors, o->logged_corrupt = st.corrupt, o->logged_missing = st.missing, o->logged_at = now;
    o->logged_freed = st.full_freed;
}

osp_status osp_offload_status(const osp_offload *o) { return o->err; }

bool osp_offload_busy(osp_offload *o) {
    pthread_mutex_lock(&o->mu);
    const bool busy = o->queue != NULL;
    pthread_mutex_unlock(&o->mu);
    return busy;
}

osp_offload_stats osp_offload_get_stats(const osp_offload *o) {
    osp_offload_stats st = {.load_s_per_block = o->load_s, .prefill_s_per_token = o->prefill_s,
                            .recv_blocks = o->recv_blocks, .recv_ipc_blocks = o->recv_ipc_blocks,
                            .failed_blocks = o->failed_blocks, .recv_s = o->recv_s,
                            .saved_blocks = o->saved_blocks, .save_s = o->save_s,
                            .host_loaded_blocks = o->host_loaded_blocks, .host_load_s = o->host_load_s};
    if (o->store) st.store = osp_kv_offload_get_stats(o->store);
    if (o->xsrv) st.producer = osp_kv_xfer_server_get_stats(o->xsrv);
    return st;
}
