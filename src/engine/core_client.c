/* The frontend's EngineCore client (see core_client.h). Threads meet at one mutex (`mu`) that
 * guards the request table, the ready state and the stats; ZeroMQ sockets are single-threaded, so
 * other threads hand messages to the I/O thread through an inproc PUSH socket (under `send_mu`),
 * and only the I/O thread touches the DEALER. Frames on the inproc pipe: "M" + an encoded message
 * to forward, "L" + epoch + reason (the core died), "Q" (quit). */
#include "engine/core_client.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/clock.h"
#include "core/status_internal.h"

#define NBUCKETS 4096

typedef enum { E_PENDING, E_LIVE, E_REFUSED, E_LOST } entry_state;

typedef struct entry {
    uint64_t id;
    uint32_t gen;
    entry_state state;
    bool aborted;
    bool adding;              /* its adder still holds it (waiting for, or just past, the ACK) */
    bool orphan;              /* ended while adding: the adder frees it */
    osp_core_output_cb cb;
    osp_core_ack_cb ack;      /* osp_core_client_add_async: called once with the core's answer; else NULL */
    double ack_deadline;      /* async, E_PENDING: osp_now_s() past which the add fails (ack_timeout_ms) */
    void *user;
    char error[160];          /* E_REFUSED: the core's reason */
    struct entry *next;       /* bucket chain */
} entry;

struct osp_core_client {
    osp_core_client_params p;
    void *ctx, *dealer, *pull, *push, *mon;
    char inproc[64], inproc_mon[64];
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t send_mu;  /* guards push and sbuf */
    msgpack_sbuffer sbuf;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    entry *buckets[NBUCKETS];
    uint32_t next_gen;
    bool ready;
    uint32_t want_epoch;
    osp_ipc_ready info;
    osp_engine_stats stats;
    int64_t dropped, bad;
    uint64_t lost_seq, lost_done; /* core_lost calls made / handled by the I/O thread */
    int n_async_pending;      /* async adds waiting for their ACK (the I/O thread times them out) */
};

static size_t bucket(uint64_t id) { return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 52); }

static entry **find(osp_core_client *c, uint64_t id, uint32_t gen) { /* under mu */
    entry **pp = &c->buckets[bucket(id)];
    while (*pp && !((*pp)->id == id && (*pp)->gen == gen)) pp = &(*pp)->next;
    return pp;
}

static void remove_entry(osp_core_client *c, entry *e) { /* under mu */
    entry **pp = find(c, e->id, e->gen);
    if (*pp == e) *pp = e->next;
}

/* Hands a frame pair to the I/O thread. */
static int send_frames(osp_core_client *c, char kind, const void *data, size_t len) {
    pthread_mutex_lock(&c->send_mu);
    int rc = zmq_send(c->push, &kind, 1, ZMQ_SNDMORE) < 0 ? -1 : 0;
    if (rc == 0) rc = zmq_send(c->push, data, len, 0) < 0 ? -1 : 0;
    pthread_mutex_unlock(&c->send_mu);
    return rc;
}

/* Encodes with `enc` into the shared buffer and hands it to the I/O thread as an "M" frame. */
static osp_status send_abort(osp_core_client *c, uint64_t id, uint32_t gen) {
    pthread_mutex_lock(&c->send_mu);
    osp_status s = osp_ipc_encode_abort(&c->sbuf, id, gen);
    const char kind = 'M';
    if (s == OSP_OK && (zmq_send(c->push, &kind, 1, ZMQ_SNDMORE) < 0 || zmq_send(c->push, c->sbuf.data, c->sbuf.size, 0) < 0))
        s = osp_set_error(OSP_ERR_IO, "core client: cannot queue a message: %s", zmq_strerror(errno));
    pthread_mutex_unlock(&c->send_mu);
    return s;
}

/* An entry out of the table whose final callback ran: freed, or left to its adder. Under mu. */
static void release(entry *e) {
    if (e->adding) e->orphan = true;
    else free(e);
}

static void fill_output(const osp_ipc_output *x, osp_request_output *o) {
    memset(o, 0, sizeof *o);
    o->request_id = x->id;
    o->token_ids = x->tokens;
    o->num_tokens = x->num_tokens;
    o->logprobs = x->logprobs;
    o->prompt_logprobs = x->prompt_logprobs;
    o->num_prompt_logprobs = x->num_prompt_logprobs;
    o->num_output_tokens = x->num_output_tokens;
    o->num_prompt_tokens = x->num_prompt_tokens;
    o->num_cached_tokens = x->num_cached_tokens;
    o->first_scheduled_s = x->first_scheduled_s;
    o->finished = x->finished;
    o->finish_reason = x->finish_reason;
    memcpy(o->error, x->error, sizeof o->error);
    o->embedding = x->embedding;
    o->n_embd = x->n_embd;
    o->kv_transfer_id = x->kv_transfer_id;
    o->kv_transfer_num_blocks = x->kv_transfer_num_blocks;
}

/* I/O thread: one message from the core. */
static void on_core_message(osp_core_client *c, const void *data, size_t len) {
    osp_ipc_msg m;
    if (osp_ipc_decode(data, len, NULL, &m) != OSP_OK) {
        pthread_mutex_lock(&c->mu);
        c->bad++;
        pthread_mutex_unlock(&c->mu);
        return;
    }
    pthread_mutex_lock(&c->mu);
    switch (m.type) {
    case OSP_IPC_READY:
        if (m.ready.epoch >= c->want_epoch) {
            c->ready = true;
            c->info = m.ready;
            c->want_epoch = m.ready.epoch;
            pthread_cond_broadcast(&c->cv);
        }
        break;
    case OSP_IPC_ACK: {
        entry *e = *find(c, m.id, m.gen);
        if (e && e->state == E_PENDING && e->ack) { /* an async add: its answer through its ack */
            const osp_core_ack_cb ack = e->ack;
            void *user = e->user;
            e->ack = NULL;
            c->n_async_pending--;
            char why[160];
            snprintf(why, sizeof why, "%s", m.error[0] ? m.error : "refused by the engine core");
            if (m.ok) e->state = E_LIVE; /* its outputs come after this message, on this thread */
            else remove_entry(c, e);
            pthread_mutex_unlock(&c->mu);
            ack(user, m.ok ? OSP_OK : OSP_ERR_INVALID_ARG, m.ok ? "" : why);
            if (!m.ok) free(e);
            pthread_mutex_lock(&c->mu);
        } else if (e && e->state == E_PENDING) {
            e->state = m.ok ? E_LIVE : E_REFUSED;
            snprintf(e->error, sizeof e->error, "%s", m.error[0] ? m.error : "refused by the engine core");
            pthread_cond_broadcast(&c->cv);
        } else {
            c->dropped++;
        }
        break;
    }
    case OSP_IPC_OUTPUTS:
        if (m.has_stats) c->stats = m.stats;
        for (int32_t i = 0; i < m.n_outs; i++) {
            osp_ipc_output *x = &m.outs[i];
            entry *e = *find(c, x->id, x->gen);
            if (!e || e->state != E_LIVE) { /* a late output of an ended request: never anyone else's */
                c->dropped++;
                continue;
            }
            bool bad_tok = false;
            for (int32_t k = 0; k < x->num_tokens && !bad_tok; k++) bad_tok = x->tokens[k] >= c->info.n_vocab;
            bool abort_it = false;
            if (bad_tok) { /* a broken core: end the request with an error rather than pass the ids on */
                c->bad++;
                x->finished = true;
                x->finish_reason = OSP_FINISH_ERROR;
                snprintf(x->error, sizeof x->error, "the engine core sent a token id outside the vocabulary");
                abort_it = true;
            }
            const osp_core_output_cb cb = e->cb;
            void *user = e->user;
            const uint32_t gen = e->gen;
            if (x->finished) remove_entry(c, e);
            pthread_mutex_unlock(&c->mu);
            osp_request_output o;
            fill_output(x, &o);
            if (bad_tok) o.num_tokens = 0, o.logprobs = NULL;
            cb(user, &o, false);
            if (abort_it) send_abort(c, x->id, gen);
            pthread_mutex_lock(&c->mu);
            if (x->finished) release(e);
        }
        break;
    default: /* HELLO, ADD, ABORT, HEARTBEAT go the other way */
        c->bad++;
        break;
    }
    pthread_mutex_unlock(&c->mu);
    osp_ipc_msg_free(&m);
}

/* I/O thread: the core died. */
static void on_lost(osp_core_client *c, uint32_t next_epoch, const char *why) {
    pthread_mutex_lock(&c->mu);
    c->ready = false;
    if (next_epoch > c->want_epoch) c->want_epoch = next_epoch;
    entry *failed = NULL, *unacked = NULL;
    for (size_t b = 0; b < NBUCKETS; b++) {
        entry **pp = &c->buckets[b];
        while (*pp) {
            entry *e = *pp;
            if (e->state == E_PENDING && e->ack) { /* an async add never admitted: its ack says so */
                *pp = e->next;
                e->next = unacked;
                unacked = e;
                c->n_async_pending--;
                continue;
            }
            if (e->state != E_LIVE) { /* its adder holds it and removes it */
                if (e->state == E_PENDING) e->state = E_LOST;
                pp = &e->next;
                continue;
            }
            *pp = e->next;
            e->next = failed;
            failed = e;
        }
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    while (unacked) {
        entry *e = unacked;
        unacked = e->next;
        e->ack(e->user, OSP_ERR_IO, "the engine core died before admitting the request");
        free(e);
    }
    while (failed) {
        entry *e = failed;
        failed = e->next;
        osp_request_output o;
        memset(&o, 0, sizeof o);
        o.request_id = e->id;
        o.finished = true;
        o.finish_reason = OSP_FINISH_ERROR;
        snprintf(o.error, sizeof o.error, "%s", why);
        e->cb(e->user, &o, true);
        pthread_mutex_lock(&c->mu);
        release(e);
        pthread_mutex_unlock(&c->mu);
    }
}

/* I/O thread: async adds past their ACK deadline fail (OSP_ERR_IO); the core, should it admit one
 * after all, is told to abort it. */
static void expire_async(osp_core_client *c) {
    pthread_mutex_lock(&c->mu);
    if (c->n_async_pending == 0) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    const double t = osp_now_s();
    entry *late = NULL;
    for (size_t b = 0; b < NBUCKETS; b++) {
        entry **pp = &c->buckets[b];
        while (*pp) {
            entry *e = *pp;
            if (e->state == E_PENDING && e->ack && t >= e->ack_deadline) {
                *pp = e->next;
                e->next = late;
                late = e;
                c->n_async_pending--;
            } else {
                pp = &e->next;
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
    while (late) {
        entry *e = late;
        late = e->next;
        send_abort(c, e->id, e->gen);
        e->ack(e->user, OSP_ERR_IO, "the engine core did not answer in time");
        free(e);
    }
}

static void *io_main(void *arg) {
    osp_core_client *c = arg;
    msgpack_sbuffer hb;
    msgpack_sbuffer_init(&hb);
    double last_hb = 0;
    const int hb_ms = c->p.heartbeat_ms > 0 ? c->p.heartbeat_ms : 200;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        const bool ready = c->ready;
        pthread_mutex_unlock(&c->mu);
        const double every = ready ? hb_ms / 1000.0 : 0.05;
        const double t = osp_now_s();
        if (t - last_hb >= every) { /* HELLO until READY, then HEARTBEAT; a full pipe just drops it */
            if ((ready ? osp_ipc_encode_heartbeat(&hb) : osp_ipc_encode_hello(&hb, c->p.fe)) == OSP_OK)
                zmq_send(c->dealer, hb.data, hb.size, ZMQ_DONTWAIT);
            last_hb = t;
        }
        zmq_pollitem_t it[3] = {{.socket = c->pull, .events = ZMQ_POLLIN}, {.socket = c->dealer, .events = ZMQ_POLLIN},
                                {.socket = c->mon, .events = ZMQ_POLLIN}};
        int wait_ms = (int)((last_hb + every - osp_now_s()) * 1000.0) + 1;
        if (wait_ms < 0) wait_ms = 0;
        if (zmq_poll(it, c->mon ? 3 : 2, wait_ms) < 0 && errno != EINTR) break;
        while (c->mon) { /* the core's connection closed: it died (watch_disconnect) */
            zmq_msg_t ev, addr;
            zmq_msg_init(&ev);
            if (zmq_msg_recv(&ev, c->mon, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&ev);
                break;
            }
            uint16_t event = 0;
            if (zmq_msg_size(&ev) >= 2) memcpy(&event, zmq_msg_data(&ev), 2);
            zmq_msg_init(&addr);
            if (zmq_msg_more(&ev)) zmq_msg_recv(&addr, c->mon, 0);
            zmq_msg_close(&ev);
            zmq_msg_close(&addr);
            pthread_mutex_lock(&c->mu);
            const bool was_ready = c->ready;
            const uint32_t next = c->info.epoch + 1;
            pthread_mutex_unlock(&c->mu);
            if (event == ZMQ_EVENT_DISCONNECTED && was_ready) on_lost(c, next, "the engine core process went away");
        }
        bool quit = false;
        for (;;) { /* from the other threads */
            zmq_msg_t k, body;
            zmq_msg_init(&k);
            if (zmq_msg_recv(&k, c->pull, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&k);
                break;
            }
            zmq_msg_init(&body);
            zmq_msg_recv(&body, c->pull, 0);
            const char kind = zmq_msg_size(&k) ? *(const char *)zmq_msg_data(&k) : 0;
            if (kind == 'M') {
                zmq_send(c->dealer, zmq_msg_data(&body), zmq_msg_size(&body), ZMQ_DONTWAIT);
            } else if (kind == 'L' && zmq_msg_size(&body) >= 4) {
                uint32_t ep;
                memcpy(&ep, zmq_msg_data(&body), 4);
                char why[160];
                const size_t n = zmq_msg_size(&body) - 4 < sizeof why - 1 ? zmq_msg_size(&body) - 4 : sizeof why - 1;
                memcpy(why, (const char *)zmq_msg_data(&body) + 4, n);
                why[n] = 0;
                on_lost(c, ep, why);
                pthread_mutex_lock(&c->mu);
                c->lost_done++;
                pthread_cond_broadcast(&c->cv);
                pthread_mutex_unlock(&c->mu);
            } else if (kind == 'Q') {
                quit = true;
            }
            zmq_msg_close(&k);
            zmq_msg_close(&body);
        }
        if (quit) break;
        for (;;) { /* from the core */
            zmq_msg_t msg;
            zmq_msg_init(&msg);
            if (zmq_msg_recv(&msg, c->dealer, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&msg);
                break;
            }
            const bool more = zmq_msg_more(&msg);
            if (!more) on_core_message(c, zmq_msg_data(&msg), zmq_msg_size(&msg));
            zmq_msg_close(&msg);
            while (zmq_msg_more(&msg)) { /* a multi-frame message is not ours: drain it */
                zmq_msg_init(&msg);
                zmq_msg_recv(&msg, c->dealer, 0);
                const bool again = zmq_msg_more(&msg);
                zmq_msg_close(&msg);
                if (!again) break;
            }
            if (more) {
                pthread_mutex_lock(&c->mu);
                c->bad++;
                pthread_mutex_unlock(&c->mu);
            }
        }
        expire_async(c);
    }
    msgpack_sbuffer_destroy(&hb);
    return NULL;
}

osp_status osp_core_client_create(const osp_core_client_params *p, osp_core_client **out) {
    *out = NULL;
    if (!p || !p->endpoint || p->fe > 255) return osp_set_error(OSP_ERR_INVALID_ARG, "core client: no endpoint, or fe > 255");
    osp_core_client *c = calloc(1, sizeof *c);
    if (!c) return osp_set_error(OSP_ERR_NOMEM, "core client: out of memory");
    c->p = *p;
    c->next_gen = 1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->send_mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    msgpack_sbuffer_init(&c->sbuf);
    osp_status s = OSP_OK;
    const int zero = 0, one = 1, ivl = 20;
    char rid[32];
    snprintf(rid, sizeof rid, "fe%u-%d", p->fe, (int)getpid());
    snprintf(c->inproc, sizeof c->inproc, "inproc://osp-core-client-%p", (void *)c);
    if (!(c->ctx = zmq_ctx_new()) || !(c->dealer = zmq_socket(c->ctx, ZMQ_DEALER)) || !(c->pull = zmq_socket(c->ctx, ZMQ_PULL)) ||
        !(c->push = zmq_socket(c->ctx, ZMQ_PUSH))) {
        s = osp_set_error(OSP_ERR_IO, "core client: cannot make ZeroMQ sockets: %s", zmq_strerror(errno));
        goto fail;
    }
    zmq_setsockopt(c->dealer, ZMQ_ROUTING_ID, rid, strlen(rid));
    zmq_setsockopt(c->dealer, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(c->dealer, ZMQ_IMMEDIATE, &one, sizeof one); /* nothing queued for a core not (yet) there */
    zmq_setsockopt(c->dealer, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    zmq_setsockopt(c->dealer, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(c->dealer, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(c->pull, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(c->push, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(c->push, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(c->pull, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(c->pull, c->inproc) != 0 || zmq_connect(c->push, c->inproc) != 0 || zmq_connect(c->dealer, p->endpoint) != 0) {
        s = osp_set_error(OSP_ERR_IO, "core client: cannot connect %s: %s", p->endpoint, zmq_strerror(errno));
        goto fail;
    }
    if (p->watch_disconnect) {
        snprintf(c->inproc_mon, sizeof c->inproc_mon, "inproc://osp-core-client-mon-%p", (void *)c);
        if (zmq_socket_monitor(c->dealer, c->inproc_mon, ZMQ_EVENT_DISCONNECTED) != 0 || !(c->mon = zmq_socket(c->ctx, ZMQ_PAIR)) ||
            zmq_setsockopt(c->mon, ZMQ_LINGER, &zero, sizeof zero) != 0 || zmq_connect(c->mon, c->inproc_mon) != 0) {
            s = osp_set_error(OSP_ERR_IO, "core client: cannot monitor the connection: %s", zmq_strerror(errno));
            goto fail;
        }
    }
    if (pthread_create(&c->thread, NULL, io_main, c) != 0) {
        s = osp_set_error(OSP_ERR_NOMEM, "core client: cannot start the I/O thread");
        goto fail;
    }
    c->thread_started = true;
    *out = c;
    return OSP_OK;
fail:
    osp_core_client_free(c);
    return s;
}

void osp_core_client_free(osp_core_client *c) {
    if (!c) return;
    if (c->thread_started) {
        send_frames(c, 'Q', "", 0);
        pthread_join(c->thread, NULL);
    }
    if (c->dealer) zmq_close(c->dealer);
    if (c->pull) zmq_close(c->pull);
    if (c->push) zmq_close(c->push);
    if (c->mon) zmq_close(c->mon);
    if (c->ctx) zmq_ctx_term(c->ctx);
    for (size_t b = 0; b < NBUCKETS; b++)
        for (entry *e = c->buckets[b], *nx; e; e = nx) {
            nx = e->next;
            free(e);
        }
    msgpack_sbuffer_destroy(&c->sbuf);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->send_mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

static void deadline_in(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) ts->tv_sec++, ts->tv_nsec -= 1000000000L;
}

bool osp_core_client_wait_ready(osp_core_client *c, int timeout_ms, osp_ipc_ready *info) {
    struct timespec ts;
    deadline_in(&ts, timeout_ms < 0 ? 0 : timeout_ms);
    pthread_mutex_lock(&c->mu);
    while (!c->ready) {
        const int rc = timeout_ms < 0 ? pthread_cond_wait(&c->cv, &c->mu) : pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        if (rc == ETIMEDOUT) break;
    }
    const bool r = c->ready;
    if (r && info) *info = c->info;
    pthread_mutex_unlock(&c->mu);
    return r;
}

osp_kv_transfer_info osp_core_client_kv_transfer_info(osp_core_client *c) {
    pthread_mutex_lock(&c->mu);
    const osp_kv_transfer_info kv = c->info.kv;
    pthread_mutex_unlock(&c->mu);
    return kv;
}

bool osp_core_client_ready(osp_core_client *c) {
    pthread_mutex_lock(&c->mu);
    const bool r = c->ready;
    pthread_mutex_unlock(&c->mu);
    return r;
}

/* A new entry for request rp, a copy of *proto with the request's id, the next generation and state
 * PENDING, linked into its bucket (and counted in n_async_pending when it has an ack). *out is the
 * entry, owned by the client's table, and *gen its generation, read under the lock (an async entry
 * may be answered and freed by the I/O thread as soon as the lock is let go); OSP_ERR_IO while the
 * core is not ready, OSP_ERR_NOMEM. */
static osp_status register_entry(osp_core_client *c, const osp_request_params *rp, const entry *proto, entry **out,
                                 uint32_t *gen) {
    *out = NULL;
    entry *e = calloc(1, sizeof *e);
    if (!e) return osp_set_error(OSP_ERR_NOMEM, "core client: out of memory");
    pthread_mutex_lock(&c->mu);
    if (!c->ready) {
        pthread_mutex_unlock(&c->mu);
        free(e);
        return osp_set_error(OSP_ERR_IO, "the engine core is not ready (it is starting or restarting)");
    }
    *e = *proto;
    e->id = rp->request_id, e->gen = c->next_gen++, e->state = E_PENDING;
    if (c->next_gen == 0) c->next_gen = 1;
    entry **slot = &c->buckets[bucket(e->id)];
    e->next = *slot;
    *slot = e;
    if (e->ack) c->n_async_pending++;
    *gen = e->gen;
    pthread_mutex_unlock(&c->mu);
    *out = e;
    return OSP_OK;
}

/* The ADD message of request (id, gen) to the core; OSP_ERR_IO when ZeroMQ cannot queue it. */
static osp_status send_add(osp_core_client *c, uint64_t id, uint32_t gen, const osp_request_params *rp) {
    pthread_mutex_lock(&c->send_mu);
    osp_status s = osp_ipc_encode_add(&c->sbuf, id, gen, rp);
    const char kind = 'M';
    if (s == OSP_OK && (zmq_send(c->push, &kind, 1, ZMQ_SNDMORE) < 0 || zmq_send(c->push, c->sbuf.data, c->sbuf.size, 0) < 0))
        s = osp_set_error(OSP_ERR_IO, "core client: cannot queue a message: %s", zmq_strerror(errno));
    pthread_mutex_unlock(&c->send_mu);
    return s;
}

osp_status osp_core_client_add(osp_core_client *c, const osp_request_params *rp, osp_core_output_cb cb, void *user) {
    if (!c || !rp || !cb) return osp_set_error(OSP_ERR_INVALID_ARG, "core client add: NULL argument");
    entry *e;
    uint32_t gen0;
    OSP_TRY(register_entry(c, rp, &(entry){.adding = true, .cb = cb, .user = user}, &e, &gen0));
    osp_status s = send_add(c, rp->request_id, gen0, rp); /* an adding entry is freed only here */

    struct timespec ts;
    deadline_in(&ts, c->p.ack_timeout_ms > 0 ? c->p.ack_timeout_ms : 60000);
    pthread_mutex_lock(&c->mu);
    while (s == OSP_OK && e->state == E_PENDING)
        if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) == ETIMEDOUT) break;
    const entry_state st = e->state;
    e->adding = false;
    if (st == E_LIVE) { /* admitted; it may even have ended already (then it is ours to free) */
        if (e->orphan) free(e);
        pthread_mutex_unlock(&c->mu);
        return OSP_OK;
    }
    remove_entry(c, e);
    pthread_mutex_unlock(&c->mu);
    const uint32_t gen = e->gen;
    char why[160];
    snprintf(why, sizeof why, "%s", e->error);
    free(e);
    if (s != OSP_OK) return s;
    if (st == E_REFUSED) return osp_set_error(OSP_ERR_INVALID_ARG, "%s", why);
    if (st == E_PENDING) send_abort(c, rp->request_id, gen); /* the core may still admit it: stop it */
    return osp_set_error(OSP_ERR_IO, "the engine core %s", st == E_LOST ? "died before admitting the request" : "did not answer in time");
}

osp_status osp_core_client_add_async(osp_core_client *c, const osp_request_params *rp, osp_core_output_cb cb,
                                     osp_core_ack_cb ack, void *user) {
    if (!c || !rp || !cb || !ack) return osp_set_error(OSP_ERR_INVALID_ARG, "core client add: NULL argument");
    entry *e;
    const double deadline = osp_now_s() + (c->p.ack_timeout_ms > 0 ? c->p.ack_timeout_ms : 60000) / 1000.0;
    uint32_t gen;
    OSP_TRY(register_entry(c, rp, &(entry){.cb = cb, .ack = ack, .user = user, .ack_deadline = deadline}, &e, &gen));
    const uint64_t id = rp->request_id; /* e may be the I/O thread's already: nothing of it is read here */
    const osp_status s = send_add(c, id, gen, rp);
    if (s == OSP_OK) return OSP_OK;
    /* not sent: take it back, unless the I/O thread already answered it (core lost): then its ack ran */
    pthread_mutex_lock(&c->mu);
    entry **pp = find(c, id, gen);
    const bool ours = *pp && (*pp)->state == E_PENDING && (*pp)->ack;
    if (ours) {
        e = *pp;
        *pp = e->next;
        c->n_async_pending--;
    }
    pthread_mutex_unlock(&c->mu);
    if (!ours) return OSP_OK;
    free(e);
    return s;
}

osp_status osp_core_client_abort(osp_core_client *c, uint64_t id) {
    uint32_t gens[16];
    int n = 0;
    pthread_mutex_lock(&c->mu);
    for (entry *e = c->buckets[bucket(id)]; e && n < 16; e = e->next)
        if (e->id == id && e->state == E_LIVE && !e->aborted) {
            e->aborted = true;
            gens[n++] = e->gen;
        }
    pthread_mutex_unlock(&c->mu);
    if (n == 0) return osp_set_error(OSP_ERR_NOT_FOUND, "abort: request %llu is not live", (unsigned long long)id);
    for (int i = 0; i < n; i++) OSP_TRY(send_abort(c, id, gens[i]));
    return OSP_OK;
}

void osp_core_client_core_lost(osp_core_client *c, uint32_t next_epoch, const char *why) {
    char body[4 + 160];
    memcpy(body, &next_epoch, 4);
    const size_t n = strnlen(why ? why : "", 159);
    memcpy(body + 4, why ? why : "", n);
    pthread_mutex_lock(&c->mu);
    const uint64_t ticket = ++c->lost_seq;
    c->ready = false; /* adds fail from now on, not only once the I/O thread got here */
    if (next_epoch > c->want_epoch) c->want_epoch = next_epoch;
    pthread_mutex_unlock(&c->mu);
    if (send_frames(c, 'L', body, 4 + n) != 0) return;
    pthread_mutex_lock(&c->mu);
    while (c->lost_done < ticket) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

osp_engine_stats osp_core_client_stats(osp_core_client *c) {
    pthread_mutex_lock(&c->mu);
    const osp_engine_stats s = c->stats;
    pthread_mutex_unlock(&c->mu);
    return s;
}

int64_t osp_core_client_dropped(osp_core_client *c) {
    pthread_mutex_lock(&c->mu);
    const int64_t n = c->dropped;
    pthread_mutex_unlock(&c->mu);
    return n;
}

int64_t osp_core_client_bad_messages(osp_core_client *c) {
    pthread_mutex_lock(&c->mu);
    const int64_t n = c->bad;
    pthread_mutex_unlock(&c->mu);
    return n;
}
