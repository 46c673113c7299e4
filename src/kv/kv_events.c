/* KV cache events in vLLM's wire format (see include/osprey/kv_events.h): the --kv-events-config
 * parser, and the publisher that turns the block pool's callbacks into one msgpack EventBatch per step
 * on a ZeroMQ PUB socket, keeping the last batches for a ROUTER replay endpoint.
 *
 * Events are collected in plain arrays during a step (consecutive stored blocks of one chain become
 * one BlockStored, as vLLM reports a request's new blocks together; consecutive removals one
 * BlockRemoved) and encoded at end_step. The step thread owns the PUB socket and sends; the replay
 * thread owns the ROUTER socket; the replay ring is shared under a mutex.
 *
 * Schema (vllm/distributed/kv_events.py, msgspec structs, tag=True, omit_defaults=True):
 *   EventBatch       {ts: float, events: [...], data_parallel_rank: 0}
 *   BlockStored      {type, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
 *                     lora_name, group_idx}
 *   BlockRemoved     {type, block_hashes, medium, group_idx}
 *   AllBlocksCleared {type}
 * and, with array_like, the older positional form [ts, events] / ["BlockStored", block_hashes,
 * parent_block_hash, token_ids, block_size, lora_id, medium] / ["BlockRemoved", block_hashes, medium] /
 * ["AllBlocksCleared"]. Replay (ZmqEventPublisher._service_replay): a request [identity, "", start
 * sequence as 8 bytes big-endian] gets [identity, "", seq, payload] for every kept batch with
 * seq >= start, then [identity, "", -1 as 8 bytes, ""]. */
#include "osprey/kv_events.h"

#include <jansson.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "core/status_internal.h"

/* ---- config ---------------------------------------------------------------------------------- */

osp_kv_events_config osp_kv_events_default_config(void) {
    osp_kv_events_config c;
    memset(&c, 0, sizeof c);
    strcpy(c.endpoint, "tcp://*:5557");
    c.buffer_steps = 10000;
    c.hwm = 100000;
    c.max_queue_size = 100000;
    return c;
}

static const char *const k_config_keys =
    "enable_kv_cache_events, publisher, endpoint, replay_endpoint, buffer_steps, hwm, max_queue_size, topic";

static osp_status cfg_string(const char *key, json_t *v, bool nullable, char *dst, size_t cap) {
    if (nullable && json_is_null(v)) {
        dst[0] = 0;
        return OSP_OK;
    }
    if (!json_is_string(v))
        return osp_set_error(OSP_ERR_INVALID_ARG, "--kv-events-config: '%s' must be a string%s", key,
                             nullable ? " or null" : "");
    if (json_string_length(v) >= cap || strlen(json_string_value(v)) != json_string_length(v))
        return osp_set_error(OSP_ERR_INVALID_ARG, "--kv-events-config: '%s' is longer than %zu bytes or holds a NUL",
                             key, cap - 1);
    memcpy(dst, json_string_value(v), json_string_length(v) + 1);
    return OSP_OK;
}

static osp_status cfg_int(const char *key, json_t *v, int64_t lo, int64_t hi, int64_t *dst) {
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return osp_set_error(OSP_ERR_INVALID_ARG, "--kv-events-config: '%s' must be an integer in [%lld, %lld]", key,
                             (long long)lo, (long long)hi);
    *dst = json_integer_value(v);
    return OSP_OK;
}

osp_status osp_kv_events_config_parse(const char *text, osp_kv_events_config *out) {
    json_error_t jerr;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return osp_set_error(OSP_ERR_INVALID_ARG, "--kv-events-config: not JSON (%s at line %d column %d)", jerr.text,
                             jerr.line, jerr.column);
    osp_status s = OSP_OK;
    osp_kv_events_config c = osp_kv_events_default_config();
    int publisher = -1; /* -1: unset (zmq when enabled, as vLLM's __post_init__), 0 null, 1 zmq */
    if (!json_is_object(root)) {
        s = osp_set_error(OSP_ERR_INVALID_ARG, "--kv-events-config: must be a JSON object, e.g. "
                                               "'{\"enable_kv_cache_events\": true, \"endpoint\": \"tcp://*:5557\"}'");
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "enable_kv_cache_events")) {
            if (!json_is_boolean(v)) {
                s = osp_set_error(OSP_ERR_INVALID_ARG, "--kv-events-config: 'enable_kv_cache_events' must be true or false");
                goto done;
            }
            c.enable_kv_cache_events = json_is_true(v);
        } else if (!strcmp(key, "publisher")) {
            const char *p = json_is_string(v) ? json_string_value(v) : NULL;
            if (json_is_null(v)) publisher = -1;
            else if (p && !strcmp(p, "zmq") && json_string_length(v) == 3) publisher = 1;
            else if (p && !strcmp(p, "null") && json_string_length(v) == 4) publisher = 0;
            else {
                s = osp_set_error(OSP_ERR_INVALID_ARG, "--kv-events-config: 'publisher' must be \"zmq\" or \"null\"");
                goto done;
            }
        } else if (!strcmp(key, "endpoint")) s = cfg_string(key, v, false, c.endpoint, sizeof c.endpoint);
        else if (!strcmp(key, "replay_endpoint")) s = cfg_string(key, v, true, c.replay_endpoint, sizeof c.replay_endpoint);
        else if (!strcmp(key, "topic")) s = cfg_string(key, v, false, c.topic, sizeof c.topic), c.topic_set = true;
        else if (!strcmp(key, "buffer_steps")) s = cfg_int(key, v, 1, 1 << 24, &c.buffer_steps);
        else if (!strcmp(key, "hwm")) s = cfg_int(key, v, 0, INT32_MAX, &c.hwm);
        else if (!strcmp(key, "max_queue_size")) s = cfg_int(key, v, 1, INT32_MAX, &c.max_queue_size);
        else {
            s = osp_set_error(OSP_ERR_INVALID_ARG, "--kv-events-config: unknown key '%.64s' (vLLM's KVEventsConfig has %s)",
                              key, k_config_keys);
            goto done;
        }
        if (s != OSP_OK) goto done;
    }
    if (!c.endpoint[0]) {
        s = osp_set_error(OSP_ERR_INVALID_ARG, "--kv-events-config: 'endpoint' must not be empty");
        goto done;
    }
    c.publisher_zmq = publisher == 1 || (publisher == -1 && c.enable_kv_cache_events);
    *out = c;
done:
    json_decref(root);
    return s;
}

/* ---- publisher -------------------------------------------------------------------------------- */

enum { EV_STORED, EV_REMOVED, EV_CLEARED };

typedef struct kv_ev {
    int kind;
    int32_t h0, nh; /* hashes[h0 .. h0 + nh) */
    bool has_parent;
    uint64_t parent;
    int32_t t0, nt; /* toks[t0 .. t0 + nt) */
    const char *medium; /* NULL: the publisher's; else a tier's ("CPU", "DISK": static strings) */
} kv_ev;

typedef struct kept {
    uint64_t seq;
    char *data; /* msgpack payload (malloc'd), NULL for an empty slot */
    size_t len;
} kept;

struct osp_kv_publisher {
    osp_kv_event_sink sink;
    osp_kv_events_config cfg;
    int32_t block_size;
    char medium[16];
    bool array_like;
    char topic[256];
    /* this step's events (step thread) */
    kv_ev *evs;
    int32_t n_evs, cap_evs;
    uint64_t *hashes;
    int32_t n_hashes, cap_hashes;
    int32_t *toks;
    int32_t n_toks, cap_toks;
    bool oom; /* an append failed: the batch is dropped (and a gap in nothing: seq is not spent) */
    /* ZeroMQ */
    void *zctx, *pub, *router;
    pthread_t replay_thread;
    bool replay_started;
    atomic_bool stop;
    /* replay ring (mu) */
    pthread_mutex_t mu;
    kept *ring; /* [cfg.buffer_steps] */
    uint64_t next_seq;
};

static bool grow(void **v, int32_t *cap, int32_t need, size_t elem) {
    if (need <= *cap) return true;
    int32_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *p = realloc(*v, (size_t)c * elem);
    if (!p) return false;
    *v = p, *cap = c;
    return true;
}

static kv_ev *last_ev(osp_kv_publisher *p, int kind) {
    return p->n_evs > 0 && p->evs[p->n_evs - 1].kind == kind ? &p->evs[p->n_evs - 1] : NULL;
}

static kv_ev *new_ev(osp_kv_publisher *p, int kind) {
    if (!grow((void **)&p->evs, &p->cap_evs, p->n_evs + 1, sizeof *p->evs)) return p->oom = true, NULL;
    kv_ev *e = &p->evs[p->n_evs++];
    memset(e, 0, sizeof *e);
    e->kind = kind;
    e->h0 = p->n_hashes, e->t0 = p->n_toks;
    return e;
}

static void on_stored(void *ctx, uint64_t hash, bool has_parent, uint64_t parent, const int32_t *tokens, int32_t n) {
    osp_kv_publisher *p = ctx;
    if (p->oom) return;
    if (!grow((void **)&p->hashes, &p->cap_hashes, p->n_hashes + 1, sizeof *p->hashes) ||
        !grow((void **)&p->toks, &p->cap_toks, p->n_toks + n, sizeof *p->toks)) {
        p->oom = true;
        return;
    }
    kv_ev *e = last_ev(p, EV_STORED);
    /* the next block of the same chain joins the previous BlockStored */
    if (!(e && !e->medium && has_parent && p->hashes[e->h0 + e->nh - 1] == parent)) {
        if (!(e = new_ev(p, EV_STORED))) return;
        e->has_parent = has_parent, e->parent = parent;
    }
    p->hashes[p->n_hashes++] = hash, e->nh++;
    if (n > 0) memcpy(p->toks + p->n_toks, tokens, sizeof *tokens * (size_t)n);
    p->n_toks += n, e->nt += n;
}

static void on_removed(void *ctx, uint64_t hash) {
    osp_kv_publisher *p = ctx;
    if (p->oom) return;
    if (!grow((void **)&p->hashes, &p->cap_hashes, p->n_hashes + 1, sizeof *p->hashes)) {
        p->oom = true;
        return;
    }
    kv_ev *e = last_ev(p, EV_REMOVED);
    if (e && e->medium) e = NULL; /* a tier's removals are an event of their own */
    if (!e && !(e = new_ev(p, EV_REMOVED))) return;
    p->hashes[p->n_hashes++] = hash, e->nh++;
}

/* A tier's event: joins the previous event of the same kind and medium (tier blocks have no chain). */
static void on_tier(osp_kv_publisher *p, int kind, uint64_t hash, const char *medium) {
    if (p->oom) return;
    if (!grow((void **)&p->hashes, &p->cap_hashes, p->n_hashes + 1, sizeof *p->hashes)) {
        p->oom = true;
        return;
    }
    static const char *const known[] = {"CPU", "DISK"}; /* kept as static strings until the batch is packed */
    const char *m = !strcmp(medium, known[0]) ? known[0] : known[1];
    kv_ev *e = last_ev(p, kind);
    if (!(e && e->medium == m && !e->has_parent && e->nt == 0)) {
        if (!(e = new_ev(p, kind))) return;
        e->medium = m;
    }
    p->hashes[p->n_hashes++] = hash, e->nh++;
}
static void on_tier_stored(void *ctx, uint64_t hash, const char *medium) { on_tier(ctx, EV_STORED, hash, medium); }
static void on_tier_removed(void *ctx, uint64_t hash, const char *medium) { on_tier(ctx, EV_REMOVED, hash, medium); }

static void on_cleared(void *ctx) {
    osp_kv_publisher *p = ctx;
    if (!p->oom) new_ev(p, EV_CLEARED);
}

static void pack_cstr(msgpack_packer *pk, const char *s) {
    const size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_u64s(msgpack_packer *pk, const uint64_t *v, int32_t n) {
    msgpack_pack_array(pk, (size_t)n);
    for (int32_t i = 0; i < n; i++) msgpack_pack_uint64(pk, v[i]);
}

static void pack_event(const osp_kv_publisher *p, msgpack_packer *pk, const kv_ev *e) {
    static const char *const tag[] = {"BlockStored", "BlockRemoved", "AllBlocksCleared"};
    const bool a = p->array_like;
    if (e->kind == EV_STORED) {
        if (a) msgpack_pack_array(pk, 7);
        else msgpack_pack_map(pk, 9), pack_cstr(pk, "type");
        pack_cstr(pk, tag[e->kind]);
        if (!a) pack_cstr(pk, "block_hashes");
        pack_u64s(pk, p->hashes + e->h0, e->nh);
        if (!a) pack_cstr(pk, "parent_block_hash");
        if (e->has_parent) msgpack_pack_uint64(pk, e->parent);
        else msgpack_pack_nil(pk);
        if (!a) pack_cstr(pk, "token_ids");
        msgpack_pack_array(pk, (size_t)e->nt);
        for (int32_t i = 0; i < e->nt; i++) msgpack_pack_int32(pk, p->toks[e->t0 + i]);
        if (!a) pack_cstr(pk, "block_size");
        msgpack_pack_int32(pk, p->block_size);
        if (!a) pack_cstr(pk, "lora_id");
        msgpack_pack_nil(pk);
        if (!a) pack_cstr(pk, "medium");
        pack_cstr(pk, e->medium ? e->medium : p->medium);
        if (!a) {
            pack_cstr(pk, "lora_name"), msgpack_pack_nil(pk);
            pack_cstr(pk, "group_idx"), msgpack_pack_int32(pk, 0);
        }
    } else if (e->kind == EV_REMOVED) {
        if (a) msgpack_pack_array(pk, 3);
        else msgpack_pack_map(pk, 4), pack_cstr(pk, "type");
        pack_cstr(pk, tag[e->kind]);
        if (!a) pack_cstr(pk, "block_hashes");
        pack_u64s(pk, p->hashes + e->h0, e->nh);
        if (!a) pack_cstr(pk, "medium");
        pack_cstr(pk, e->medium ? e->medium : p->medium);
        if (!a) pack_cstr(pk, "group_idx"), msgpack_pack_int32(pk, 0);
    } else {
        if (a) msgpack_pack_array(pk, 1);
        else msgpack_pack_map(pk, 1), pack_cstr(pk, "type");
        pack_cstr(pk, tag[e->kind]);
    }
}

static void put_be64(uint8_t *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (56 - 8 * i));
}

/* A batch that could not be built (out of memory) still spends its sequence number, with nothing kept
 * for replay, so subscribers see a gap instead of silently missing events. */
static void spend_seq(osp_kv_publisher *p) {
    pthread_mutex_lock(&p->mu);
    const uint64_t seq = p->next_seq++;
    kept *k = &p->ring[seq % (uint64_t)p->cfg.buffer_steps];
    free(k->data);
    k->seq = seq, k->data = NULL, k->len = 0;
    pthread_mutex_unlock(&p->mu);
}

static void on_end_step(void *ctx) {
    osp_kv_publisher *p = ctx;
    if (p->oom) spend_seq(p);
    if (p->oom || p->n_evs == 0) goto reset;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const double now = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    if (p->array_like) msgpack_pack_array(&pk, 2);
    else msgpack_pack_map(&pk, 3), pack_cstr(&pk, "ts");
    msgpack_pack_double(&pk, now);
    if (!p->array_like) pack_cstr(&pk, "events");
    msgpack_pack_array(&pk, (size_t)p->n_evs);
    for (int32_t i = 0; i < p->n_evs; i++) pack_event(p, &pk, &p->evs[i]);
    if (!p->array_like) pack_cstr(&pk, "data_parallel_rank"), msgpack_pack_int32(&pk, 0);
    if (!sb.data) { /* msgpack's buffer could not grow */
        spend_seq(p);
        goto reset;
    }
    pthread_mutex_lock(&p->mu);
    const uint64_t seq = p->next_seq++;
    kept *k = &p->ring[seq % (uint64_t)p->cfg.buffer_steps];
    free(k->data);
    k->seq = seq, k->len = sb.size, k->data = msgpack_sbuffer_release(&sb);
    pthread_mutex_unlock(&p->mu);
    if (p->pub) {
        uint8_t sq[8];
        put_be64(sq, seq);
        zmq_send(p->pub, p->topic, strlen(p->topic), ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(p->pub, sq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(p->pub, k->data, k->len, ZMQ_DONTWAIT); /* k->data: only this thread replaces it */
    }
    msgpack_sbuffer_destroy(&sb);
reset:
    p->n_evs = p->n_hashes = p->n_toks = 0;
    p->oom = false;
}

static void *replay_main(void *arg) {
    osp_kv_publisher *p = arg;
    while (!atomic_load(&p->stop)) {
        zmq_pollitem_t it = {.socket = p->router, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 100) <= 0 || !(it.revents & ZMQ_POLLIN)) continue;
        /* [identity, "", start seq]: anything else is read to its end and ignored */
        uint8_t id[256], f[3][16];
        int nid = -1, nf = 0, len[3] = {0};
        int more = 1;
        size_t ms = sizeof more;
        while (more) {
            uint8_t junk[16];
            uint8_t *dst = nid < 0 ? id : nf < 3 ? f[nf] : junk;
            const size_t cap = nid < 0 ? sizeof id : 16;
            const int n = zmq_recv(p->router, dst, cap, 0);
            if (n < 0) break;
            if (nid < 0) nid = n;
            else if (nf < 3) len[nf++] = n;
            else nf++;
            if (zmq_getsockopt(p->router, ZMQ_RCVMORE, &more, &ms) != 0) more = 0;
        }
        if (nid < 0 || nid > (int)sizeof id || nf != 2 || len[0] != 0 || len[1] != 8) continue;
        uint64_t start = 0;
        for (int i = 0; i < 8; i++) start = start << 8 | f[1][i];
        pthread_mutex_lock(&p->mu);
        const uint64_t n = (uint64_t)p->cfg.buffer_steps;
        const uint64_t first = p->next_seq > n ? p->next_seq - n : 0;
        for (uint64_t s = start > first ? start : first; s < p->next_seq; s++) {
            const kept *k = &p->ring[s % n];
            if (!k->data) continue; /* a batch lost to memory: the gap stays */
            uint8_t sq[8];
            put_be64(sq, k->seq);
            zmq_send(p->router, id, (size_t)nid, ZMQ_SNDMORE | ZMQ_DONTWAIT);
            zmq_send(p->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
            zmq_send(p->router, sq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
            zmq_send(p->router, k->data, k->len, ZMQ_DONTWAIT);
        }
        pthread_mutex_unlock(&p->mu);
        static const uint8_t end[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}; /* -1: the end */
        zmq_send(p->router, id, (size_t)nid, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(p->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(p->router, end, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(p->router, "", 0, ZMQ_DONTWAIT);
    }
    return NULL;
}

/* vLLM's rule: bind a wildcard, IPv6 any, ipc:// or inproc:// address; connect to anything else. */
static bool should_bind(const char *ep) {
    return strchr(ep, '*') || strstr(ep, "::") || !strncmp(ep, "ipc://", 6) || !strncmp(ep, "inproc://", 9);
}

osp_status osp_kv_publisher_create(const osp_kv_events_config *cfg, const osp_kv_publisher_params *pp,
                                   osp_kv_publisher **out) {
    *out = NULL;
    if (pp->block_size <= 0 || cfg->buffer_steps < 1 || !pp->medium || strlen(pp->medium) >= 16)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv events: block_size %d, buffer_steps %lld, medium %s", pp->block_size,
                             (long long)cfg->buffer_steps, pp->medium ? pp->medium : "(null)");
    osp_kv_publisher *p = calloc(1, sizeof *p);
    if (!p) return osp_set_error(OSP_ERR_NOMEM, "kv events: out of memory");
    pthread_mutex_init(&p->mu, NULL);
    p->cfg = *cfg;
    p->block_size = pp->block_size;
    strcpy(p->medium, pp->medium);
    p->array_like = pp->array_like;
    snprintf(p->topic, sizeof p->topic, "%s", cfg->topic_set ? cfg->topic : pp->topic ? pp->topic : "");
    p->sink = (osp_kv_event_sink){.ctx = p, .block_stored = on_stored, .block_removed = on_removed,
                                  .tier_stored = on_tier_stored, .tier_removed = on_tier_removed,
                                  .all_cleared = on_cleared, .end_step = on_end_step};
    osp_status s = OSP_OK;
    if (!(p->ring = calloc((size_t)cfg->buffer_steps, sizeof *p->ring))) {
        s = osp_set_error(OSP_ERR_NOMEM, "kv events: out of memory for %lld replay slots", (long long)cfg->buffer_steps);
        goto fail;
    }
    if (cfg->publisher_zmq) {
        const int hwm = (int)cfg->hwm, linger = 0;
        if (!(p->zctx = zmq_ctx_new()) || !(p->pub = zmq_socket(p->zctx, ZMQ_PUB))) {
            s = osp_set_error(OSP_ERR_IO, "kv events: cannot create a ZeroMQ socket: %s", zmq_strerror(zmq_errno()));
            goto fail;
        }
        zmq_setsockopt(p->pub, ZMQ_SNDHWM, &hwm, sizeof hwm);
        zmq_setsockopt(p->pub, ZMQ_LINGER, &linger, sizeof linger);
        const int rc = should_bind(cfg->endpoint) ? zmq_bind(p->pub, cfg->endpoint) : zmq_connect(p->pub, cfg->endpoint);
        if (rc != 0) {
            s = osp_set_error(OSP_ERR_IO, "kv events: cannot %s the endpoint '%s': %s",
                              should_bind(cfg->endpoint) ? "bind" : "connect to", cfg->endpoint, zmq_strerror(zmq_errno()));
            goto fail;
        }
        if (cfg->replay_endpoint[0]) {
            if (!(p->router = zmq_socket(p->zctx, ZMQ_ROUTER))) {
                s = osp_set_error(OSP_ERR_IO, "kv events: cannot create a ZeroMQ socket: %s", zmq_strerror(zmq_errno()));
                goto fail;
            }
            zmq_setsockopt(p->router, ZMQ_LINGER, &linger, sizeof linger);
            if (zmq_bind(p->router, cfg->replay_endpoint) != 0) {
                s = osp_set_error(OSP_ERR_IO, "kv events: cannot bind the replay endpoint '%s': %s", cfg->replay_endpoint,
                                  zmq_strerror(zmq_errno()));
                goto fail;
            }
            if (pthread_create(&p->replay_thread, NULL, replay_main, p) != 0) {
                s = osp_set_error(OSP_ERR_NOMEM, "kv events: cannot start the replay thread");
                goto fail;
            }
            p->replay_started = true;
        }
    }
    *out = p;
    return OSP_OK;
fail:
    osp_kv_publisher_free(p);
    return s;
}

void osp_kv_publisher_free(osp_kv_publisher *p) {
    if (!p) return;
    atomic_store(&p->stop, true);
    if (p->replay_started) pthread_join(p->replay_thread, NULL);
    if (p->router) zmq_close(p->router);
    if (p->pub) zmq_close(p->pub);
    if (p->zctx) zmq_ctx_term(p->zctx);
    if (p->ring)
        for (int64_t i = 0; i < p->cfg.buffer_steps; i++) free(p->ring[i].data);
    free(p->ring);
    free(p->evs);
    free(p->hashes);
    free(p->toks);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

const osp_kv_event_sink *osp_kv_publisher_sink(osp_kv_publisher *p) { return &p->sink; }

uint64_t osp_kv_publisher_num_batches(osp_kv_publisher *p) {
    pthread_mutex_lock(&p->mu);
    const uint64_t n = p->next_seq;
    pthread_mutex_unlock(&p->mu);
    return n;
}
