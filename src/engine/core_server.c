/* The EngineCore loop over ZeroMQ (see core_server.h). One thread: it owns the engine (stepping it
 * itself, no loop thread), the ROUTER socket and the request table. The engine's per-request callback
 * (called inside osp_engine_step, on this thread) encodes each output straight into its frontend's
 * OUTPUTS builder, so a step costs one message per frontend however many requests it advanced. */
#include "engine/core_server.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/clock.h"
#include "core/status_internal.h"
#include "engine/ipc.h"

#define MAX_FRONTENDS 64

typedef struct frontend {
    uint8_t rid[256];          /* ZeroMQ routing id */
    size_t rid_len;
    double last_seen;          /* CLOCK_MONOTONIC seconds of its last message */
    double last_sent;          /* of our last OUTPUTS to it */
    bool alive;
    bool dirty;                /* outputs waiting in `outs` */
    osp_ipc_outputs outs;
} frontend;

typedef struct core_req {
    struct core *core;
    int fe;
    uint64_t wire_id, eng_id;
    uint32_t gen;
    struct core_req *prev, *next; /* the live list */
} core_req;

typedef struct core {
    osp_engine *e;
    void *sock;
    frontend fes[MAX_FRONTENDS];
    int n_fes;
    core_req *live;
    uint64_t next_eng_id;
    msgpack_sbuffer buf;
    osp_status cb_status;      /* an encoding failure inside a callback */
    osp_core_server_counters *ctr;
} core;

static void unlink_req(core *c, core_req *r) {
    if (r->prev) r->prev->next = r->next;
    else c->live = r->next;
    if (r->next) r->next->prev = r->prev;
}

/* The engine's callback (inside osp_engine_step, this thread). */
static void on_output(void *user, const osp_request_output *o) {
    core_req *r = user;
    core *c = r->core;
    frontend *f = &c->fes[r->fe];
    if (f->alive) {
        const osp_status s = osp_ipc_outputs_add(&f->outs, r->wire_id, r->gen, o);
        if (s != OSP_OK && c->cb_status == OSP_OK) c->cb_status = s;
        f->dirty = true;
    }
    if (o->finished) { /* the engine forgets the request after this call */
        unlink_req(c, r);
        free(r);
    }
}

static void send_to(core *c, int fe, const void *data, size_t len) {
    frontend *f = &c->fes[fe];
    /* a peer that went away: EHOSTUNREACH (ROUTER_MANDATORY); nothing to do but drop it */
    if (zmq_send(c->sock, f->rid, f->rid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return;
    zmq_send(c->sock, data, len, ZMQ_DONTWAIT);
}

static int find_fe(core *c, const uint8_t *rid, size_t n) {
    for (int i = 0; i < c->n_fes; i++)
        if (c->fes[i].rid_len == n && memcmp(c->fes[i].rid, rid, n) == 0) return i;
    if (c->n_fes == MAX_FRONTENDS || n == 0 || n > sizeof c->fes[0].rid) return -1;
    frontend *f = &c->fes[c->n_fes];
    memcpy(f->rid, rid, n);
    f->rid_len = n;
    osp_ipc_outputs_init(&f->outs);
    return c->n_fes++;
}

static void send_ready(core *c, int fe, uint32_t epoch) {
    const osp_engine_params *p = osp_engine_params_get(c->e);
    const osp_ipc_ready r = {.epoch = epoch, .max_model_len = p->max_model_len,
                             .n_vocab = osp_model_config_get(osp_engine_model(c->e))->n_vocab,
                             .num_blocks = p->num_blocks, .block_size = p->block_size, .pid = (int64_t)getpid(),
                             .kv = osp_engine_kv_transfer_info(c->e)};
    if (osp_ipc_encode_ready(&c->buf, &r) == OSP_OK) send_to(c, fe, c->buf.data, c->buf.size);
}

static void ack(core *c, int fe, uint64_t id, uint32_t gen, bool ok, const char *why) {
    if (osp_ipc_encode_ack(&c->buf, id, gen, ok, why) == OSP_OK) send_to(c, fe, c->buf.data, c->buf.size);
}

static void handle(core *c, int fe, const osp_ipc_msg *m, uint32_t epoch) {
    switch (m->type) {
    case OSP_IPC_HELLO: send_ready(c, fe, epoch); break;
    case OSP_IPC_HEARTBEAT: break;
    case OSP_IPC_ADD: {
        if (m->rp.n > 1) { /* one engine request per choice over IPC: one callback owner per request */
            ack(c, fe, m->id, m->gen, false, "n > 1 is not taken over IPC: send one request per choice");
            break;
        }
        core_req *r = calloc(1, sizeof *r);
        if (!r) {
            ack(c, fe, m->id, m->gen, false, "engine core: out of memory");
            break;
        }
        *r = (core_req){.core = c, .fe = fe, .wire_id = m->id, .gen = m->gen, .eng_id = c->next_eng_id++};
        osp_request_params rp = m->rp;
        rp.request_id = r->eng_id;
        rp.callback = on_output;
        rp.callback_user = r;
        if (osp_engine_add(c->e, &rp) != OSP_OK) {
            ack(c, fe, m->id, m->gen, false, osp_last_error());
            free(r);
            break;
        }
        r->next = c->live;
        if (c->live) c->live->prev = r;
        c->live = r;
        ack(c, fe, m->id, m->gen, true, NULL);
        break;
    }
    case OSP_IPC_ABORT:
        for (core_req *r = c->live; r; r = r->next)
            if (r->fe == fe && r->wire_id == m->id && r->gen == m->gen) {
                osp_engine_abort(c->e, r->eng_id); /* NOT_FOUND: it finished in the meantime */
                break;
            }
        break;
    default: /* READY, ACK, OUTPUTS go the other way */
        if (c->ctr) atomic_fetch_add(&c->ctr->bad_messages, 1);
        break;
    }
}

/* Reads every queued message (non-blocking). */
static void drain(core *c, uint32_t epoch, const osp_ipc_limits *lim) {
    for (;;) {
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        if (zmq_msg_recv(&id, c->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&id);
            return;
        }
        zmq_msg_init(&body);
        bool ok = zmq_msg_more(&id) && zmq_msg_recv(&body, c->sock, 0) >= 0;
        while (ok && zmq_msg_more(&body)) { /* extra frames: not ours; swallow them */
            zmq_msg_t extra;
            zmq_msg_init(&extra);
            zmq_msg_recv(&extra, c->sock, 0);
            const bool more = zmq_msg_more(&extra);
            zmq_msg_close(&extra);
            ok = false;
            if (!more) break;
        }
        const int fe = ok ? find_fe(c, zmq_msg_data(&id), zmq_msg_size(&id)) : -1;
        osp_ipc_msg m;
        if (fe >= 0 && osp_ipc_decode(zmq_msg_data(&body), zmq_msg_size(&body), lim, &m) == OSP_OK) {
            c->fes[fe].last_seen = osp_now_s();
            c->fes[fe].alive = true;
            handle(c, fe, &m, epoch);
            osp_ipc_msg_free(&m);
        } else if (c->ctr) {
            atomic_fetch_add(&c->ctr->bad_messages, 1);
        }
        zmq_msg_close(&id);
        zmq_msg_close(&body);
    }
}

osp_status osp_core_serve(osp_engine *e, const osp_core_server_params *p, osp_core_server_counters *ctr) {
    core *c = calloc(1, sizeof *c);
    if (!c) return osp_set_error(OSP_ERR_NOMEM, "engine core: out of memory");
    c->e = e;
    c->ctr = ctr;
    c->next_eng_id = 1;
    msgpack_sbuffer_init(&c->buf);
    osp_status s = OSP_OK;
    const double timeout = (p->frontend_timeout_ms > 0 ? p->frontend_timeout_ms : 5000) / 1000.0;
    const double stats_every = (p->idle_stats_ms > 0 ? p->idle_stats_ms : 250) / 1000.0;
    const osp_ipc_limits lim = osp_ipc_default_limits();
    void *ctx = zmq_ctx_new();
    c->sock = ctx ? zmq_socket(ctx, ZMQ_ROUTER) : NULL;
    const int zero = 0, one = 1;
    if (!c->sock) {
        s = osp_set_error(OSP_ERR_IO, "engine core: cannot make a ZeroMQ socket: %s", zmq_strerror(errno));
        goto done;
    }
    zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(c->sock, ZMQ_SNDHWM, &zero, sizeof zero); /* never drop an output to a live frontend */
    zmq_setsockopt(c->sock, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(c->sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    if (zmq_bind(c->sock, p->endpoint) != 0) {
        s = osp_set_error(OSP_ERR_IO, "engine core: cannot bind %s: %s", p->endpoint, zmq_strerror(errno));
        goto done;
    }
    if (p->bound) atomic_store(p->bound, 1);
    while (!(p->stop && atomic_load(p->stop))) {
        const bool busy = osp_engine_has_unfinished(e);
        zmq_pollitem_t it = {.socket = c->sock, .events = ZMQ_POLLIN};
        zmq_poll(&it, 1, busy ? 0 : 50);
        drain(c, p->epoch, &lim);
        const double t = osp_now_s();
        for (int i = 0; i < c->n_fes; i++) { /* frontend death: heartbeats stopped */
            frontend *f = &c->fes[i];
            if (!f->alive || t - f->last_seen <= timeout) continue;
            f->alive = false;
            f->dirty = false;
            osp_ipc_outputs_begin(&f->outs);
            if (ctr) atomic_fetch_add(&ctr->frontends_expired, 1);
            for (core_req *r = c->live; r; r = r->next)
                if (r->fe == i && osp_engine_abort(e, r->eng_id) == OSP_OK && ctr) atomic_fetch_add(&ctr->aborted_for_expiry, 1);
        }
        if (osp_engine_has_unfinished(e)) {
            bool did;
            if ((s = osp_engine_step(e, &did)) != OSP_OK) goto done;
            if (c->cb_status != OSP_OK) {
                s = c->cb_status;
                goto done;
            }
        }
        const osp_engine_stats st = osp_engine_get_stats(e);
        for (int i = 0; i < c->n_fes; i++) {
            frontend *f = &c->fes[i];
            if (!f->alive || (!f->dirty && t - f->last_sent < stats_every)) continue;
            if (osp_ipc_outputs_finish(&f->outs, &st, &c->buf) == OSP_OK) send_to(c, i, c->buf.data, c->buf.size);
            osp_ipc_outputs_begin(&f->outs);
            f->dirty = false;
            f->last_sent = t;
        }
    }
done:
    /* requests still in the engine keep a callback into c: the engine must be freed, not stepped */
    for (core_req *r = c->live, *nx; r; r = nx) {
        nx = r->next;
        free(r);
    }
    if (c->sock) zmq_close(c->sock);
    if (ctx) zmq_ctx_term(ctx);
    for (int i = 0; i < c->n_fes; i++) osp_ipc_outputs_destroy(&c->fes[i].outs);
    msgpack_sbuffer_destroy(&c->buf);
    free(c);
    return s;
}
