/* The router's KV-event index (see kv_index.h): a chained hash map from block hash to the bit set of
 * backends holding it, fed by one ZeroMQ SUB thread; msgpack decoded with msgpack-c from vLLM's
 * schema (maps tagged "type", or positional arrays; hashes as 64-bit integers, or byte strings whose
 * last 8 bytes are read big-endian, as llm-d does). */
#include "kv_index.h"

#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define NB 64
#define BUCKETS (1u << 16)

/* One (hash, medium) pair: a backend may hold a block in its KV pool and in a tier below it (KV offload:
 * "CPU" host memory, "DISK"), each reported and removed on its own; it holds the block while any medium
 * does. */
typedef struct node {
    uint64_t hash, mask;
    uint8_t medium;
    struct node *next;
} node;

struct rt_kv_index {
    int32_t n;
    bool has[NB];
    void *zctx, *sub[NB];
    void *replay[NB];     /* DEALER sockets to the backends' replay endpoints, or NULL */
    pthread_t thread;
    bool started;
    atomic_bool stop;
    pthread_mutex_t mu;
    node *bucket[BUCKETS];
    int64_t size[NB], batches[NB], gaps[NB], replayed[NB];
    int64_t last_seq[NB]; /* -1: none yet */
};

static uint32_t slot(uint64_t h) { return (uint32_t)((h ^ (h >> 29)) * 0x9e3779b97f4a7c15ull >> 48) & (BUCKETS - 1); }

/* mu held */
static void add(rt_kv_index *x, int32_t b, uint64_t h, uint8_t medium) {
    node **pp = &x->bucket[slot(h)];
    for (node *p = *pp; p; p = p->next)
        if (p->hash == h && p->medium == medium) {
            if (!(p->mask >> b & 1)) p->mask |= 1ull << b, x->size[b]++;
            return;
        }
    node *p = malloc(sizeof *p);
    if (!p) return; /* the index only ranks: a lost entry costs a hit, nothing else */
    *p = (node){.hash = h, .mask = 1ull << b, .medium = medium, .next = *pp};
    *pp = p;
    x->size[b]++;
}

static void del(rt_kv_index *x, int32_t b, uint64_t h, uint8_t medium) {
    for (node **pp = &x->bucket[slot(h)]; *pp; pp = &(*pp)->next) {
        node *p = *pp;
        if (p->hash != h || p->medium != medium) continue;
        if (p->mask >> b & 1) p->mask &= ~(1ull << b), x->size[b]--;
        if (!p->mask) *pp = p->next, free(p);
        return;
    }
}

static void clear(rt_kv_index *x, int32_t b) {
    for (uint32_t i = 0; i < BUCKETS; i++)
        for (node **pp = &x->bucket[i]; *pp;) {
            node *p = *pp;
            p->mask &= ~(1ull << b);
            if (!p->mask) *pp = p->next, free(p);
            else pp = &p->next;
        }
    x->size[b] = 0;
}

static bool holds(const rt_kv_index *x, int32_t b, uint64_t h) {
    for (const node *p = x->bucket[slot(h)]; p; p = p->next)
        if (p->hash == h && (p->mask >> b & 1)) return true;
    return false;
}

/* ---- msgpack ---------------------------------------------------------------------------------- */

static bool str_is(const msgpack_object *o, const char *s) {
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) && !memcmp(o->via.str.ptr, s, o->via.str.size);
}

static const msgpack_object *map_get(const msgpack_object *m, const char *key) {
    if (m->type != MSGPACK_OBJECT_MAP) return NULL;
    for (uint32_t i = 0; i < m->via.map.size; i++)
        if (str_is(&m->via.map.ptr[i].key, key)) return &m->via.map.ptr[i].val;
    return NULL;
}

static bool hash_of(const msgpack_object *o, uint64_t *h) {
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) return *h = o->via.u64, true;
    if (o->type == MSGPACK_OBJECT_BIN && o->via.bin.size >= 8) {
        uint64_t v = 0;
        for (uint32_t i = o->via.bin.size - 8; i < o->via.bin.size; i++) v = v << 8 | (uint8_t)o->via.bin.ptr[i];
        return *h = v, true;
    }
    return false;
}

/* A medium's id: "GPU" (or none given) 0, "CPU" 1, "DISK" 2, any other 3. */
static uint8_t medium_id(const msgpack_object *m) {
    if (!m || m->type != MSGPACK_OBJECT_STR) return 0;
    return str_is(m, "GPU") ? 0 : str_is(m, "CPU") ? 1 : str_is(m, "DISK") ? 2 : 3;
}

/* One event: its kind (0 stored, 1 removed, 2 cleared, -1 unknown), its hashes array and its medium
 * (BlockStored's 7th field, BlockRemoved's 3rd in the positional form). */
static int event_kind(const msgpack_object *e, const msgpack_object **hashes, uint8_t *medium) {
    const msgpack_object *tag = NULL, *med = NULL;
    *hashes = NULL;
    if (e->type == MSGPACK_OBJECT_MAP) tag = map_get(e, "type"), *hashes = map_get(e, "block_hashes"), med = map_get(e, "medium");
    else if (e->type == MSGPACK_OBJECT_ARRAY && e->via.array.size >= 1) {
        tag = &e->via.array.ptr[0];
        if (e->via.array.size >= 2) *hashes = &e->via.array.ptr[1];
        const uint32_t at = str_is(tag, "BlockStored") ? 6 : 2;
        if (e->via.array.size > at) med = &e->via.array.ptr[at];
    }
    *medium = medium_id(med);
    if (!tag) return -1;
    if (str_is(tag, "AllBlocksCleared")) return 2;
    if (!*hashes || (*hashes)->type != MSGPACK_OBJECT_ARRAY) return -1;
    return str_is(tag, "BlockStored") ? 0 : str_is(tag, "BlockRemoved") ? 1 : -1;
}

/* Walks the first msgpack object of p[0..n) without building it: true when every length fits in the
 * bytes left and every container's count could be met (each element takes at least one byte).
 * msgpack-c allocates a container's elements from its declared count before reading them, so a
 * 5-byte "array of 4 billion" would otherwise exhaust memory; after this check what it allocates is
 * bounded by the payload's size. Iterative (a count of pending items), so nesting depth costs nothing. */
static bool msgpack_sane(const uint8_t *p, size_t n) {
    size_t i = 0;
    uint64_t pending = 1;
    while (pending > 0) {
        if (i >= n || pending > n - i) return false;
        const uint8_t t = p[i++];
        pending--;
        uint64_t skip = 0, items = 0;
        int lenb = 0; /* bytes of a length / count that follow */
        if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) {
        } else if (t <= 0x8f) items = 2u * (t & 0x0fu);
        else if (t <= 0x9f) items = t & 0x0fu;
        else if (t <= 0xbf) skip = t & 0x1fu;
        else if (t == 0xc1) return false;
        else if (t >= 0xc4 && t <= 0xc6) lenb = 1 << (t - 0xc4);         /* bin 8/16/32 */
        else if (t >= 0xc7 && t <= 0xc9) lenb = 1 << (t - 0xc7), skip = 1; /* ext 8/16/32: + type byte */
        else if (t == 0xca) skip = 4;
        else if (t == 0xcb) skip = 8;
        else if (t >= 0xcc && t <= 0xcf) skip = 1u << (t - 0xcc);
        else if (t >= 0xd0 && t <= 0xd3) skip = 1u << (t - 0xd0);
        else if (t >= 0xd4 && t <= 0xd8) skip = 1 + (1u << (t - 0xd4));  /* fixext 1..16 */
        else if (t >= 0xd9 && t <= 0xdb) lenb = 1 << (t - 0xd9);         /* str 8/16/32 */
        else if (t == 0xdc || t == 0xdd) lenb = t == 0xdc ? 2 : 4, items = 1; /* array 16/32: count below */
        else if (t == 0xde || t == 0xdf) lenb = t == 0xde ? 2 : 4, items = 2; /* map 16/32 */
        if (lenb) {
            if ((size_t)lenb > n - i) return false;
            uint64_t v = 0;
            for (int k = 0; k < lenb; k++) v = v << 8 | p[i + (size_t)k];
            i += (size_t)lenb;
            if (items) items *= v; /* a container: v elements (maps: pairs) */
            else skip += v;        /* bin, ext, str: v bytes */
        }
        if (skip > n - i) return false;
        i += (size_t)skip;
        pending += items;
    }
    return true;
}

bool rt_kv_index_apply(rt_kv_index *x, int32_t b, const char *payload, size_t len) {
    if (b < 0 || b >= x->n || !msgpack_sane((const uint8_t *)payload, len)) return false;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    bool ok = msgpack_unpack_next(&u, payload, len, &off) == MSGPACK_UNPACK_SUCCESS;
    const msgpack_object *events = NULL;
    if (ok) {
        const msgpack_object *root = &u.data;
        if (root->type == MSGPACK_OBJECT_MAP) events = map_get(root, "events");
        else if (root->type == MSGPACK_OBJECT_ARRAY && root->via.array.size >= 2) events = &root->via.array.ptr[1];
        ok = events && events->type == MSGPACK_OBJECT_ARRAY;
    }
    if (ok) {
        pthread_mutex_lock(&x->mu);
        for (uint32_t i = 0; i < events->via.array.size; i++) {
            const msgpack_object *hs;
            uint8_t medium;
            const int kind = event_kind(&events->via.array.ptr[i], &hs, &medium);
            if (kind == 2) clear(x, b);
            else if (kind >= 0)
                for (uint32_t j = 0; j < hs->via.array.size; j++) {
                    uint64_t h;
                    if (!hash_of(&hs->via.array.ptr[j], &h)) continue;
                    if (kind == 0) add(x, b, h, medium);
                    else del(x, b, h, medium);
                }
        }
        pthread_mutex_unlock(&x->mu);
    }
    msgpack_unpacked_destroy(&u);
    return ok;
}

/* ---- replay of missed batches ------------------------------------------------------------------ */

#define REPLAY_TIMEOUT_MS 1000

/* Asks backend b's replay endpoint for the batches from `from` on and applies those before `upto` in
 * order (the publisher's protocol: ["", start seq] in, ["", seq, payload] per kept batch and
 * ["", -1, ""] at the end out; kv_events.c). Returns the last sequence number applied, or from - 1 when
 * none came within REPLAY_TIMEOUT_MS. Subscriber thread only. */
static int64_t replay_range(rt_kv_index *x, int32_t b, int64_t from, int64_t upto) {
    void *d = x->replay[b];
    uint8_t start[8];
    for (int i = 0; i < 8; i++) start[i] = (uint8_t)((uint64_t)from >> (56 - 8 * i));
    if (zmq_send(d, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 || zmq_send(d, start, 8, ZMQ_DONTWAIT) < 0) return from - 1;
    int64_t last = from - 1;
    for (;;) {
        zmq_pollitem_t it = {.socket = d, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, REPLAY_TIMEOUT_MS) <= 0) break; /* no answer: the gap stays */
        zmq_msg_t f[3];
        int nf = 0, more = 1;
        size_t ms = sizeof more;
        while (more) {
            zmq_msg_t tmp;
            zmq_msg_init(&tmp);
            if (zmq_msg_recv(&tmp, d, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&tmp);
                break;
            }
            if (nf < 3) f[nf++] = tmp;
            else zmq_msg_close(&tmp);
            if (zmq_getsockopt(d, ZMQ_RCVMORE, &more, &ms) != 0) more = 0;
        }
        bool end = nf != 3 || zmq_msg_size(&f[1]) != 8;
        if (!end) {
            const uint8_t *q = zmq_msg_data(&f[1]);
            uint64_t seq = 0;
            for (int i = 0; i < 8; i++) seq = seq << 8 | q[i];
            end = seq == UINT64_MAX;
            if (!end && (int64_t)seq == last + 1 && (int64_t)seq < upto &&
                rt_kv_index_apply(x, b, zmq_msg_data(&f[2]), zmq_msg_size(&f[2])))
                last = (int64_t)seq;
        }
        for (int i = 0; i < nf; i++) zmq_msg_close(&f[i]);
        if (end) break;
    }
    return last;
}

/* ---- the subscriber thread -------------------------------------------------------------------- */

static void *sub_main(void *arg) {
    rt_kv_index *x = arg;
    zmq_pollitem_t items[NB];
    int32_t which[NB], m = 0;
    for (int32_t b = 0; b < x->n; b++)
        if (x->has[b]) items[m] = (zmq_pollitem_t){.socket = x->sub[b], .events = ZMQ_POLLIN}, which[m++] = b;
    while (!atomic_load(&x->stop)) {
        if (zmq_poll(items, m, 100) <= 0) continue;
        for (int32_t k = 0; k < m; k++) {
            if (!(items[k].revents & ZMQ_POLLIN)) continue;
            const int32_t b = which[k];
            zmq_msg_t f[3];
            int nf = 0, more = 1;
            size_t ms = sizeof more;
            while (more) { /* [topic, seq, payload]; extra frames are read and dropped */
                zmq_msg_t tmp;
                zmq_msg_init(&tmp);
                if (zmq_msg_recv(&tmp, x->sub[b], ZMQ_DONTWAIT) < 0) {
                    zmq_msg_close(&tmp);
                    break;
                }
                if (nf < 3) f[nf++] = tmp;
                else zmq_msg_close(&tmp);
                if (zmq_getsockopt(x->sub[b], ZMQ_RCVMORE, &more, &ms) != 0) more = 0;
            }
            if (nf == 3 && zmq_msg_size(&f[1]) == 8) {
                const uint8_t *s = zmq_msg_data(&f[1]);
                int64_t seq = 0;
                for (int i = 0; i < 8; i++) seq = (int64_t)((uint64_t)seq << 8 | s[i]);
                pthread_mutex_lock(&x->mu);
                const int64_t prev = x->last_seq[b];
                pthread_mutex_unlock(&x->mu);
                /* batches missed (a slow subscriber, a reconnect): from the replay endpoint first, in order */
                const int64_t got = prev >= 0 && seq > prev + 1 && x->replay[b] ? replay_range(x, b, prev + 1, seq) : prev;
                pthread_mutex_lock(&x->mu);
                if (got > prev) x->replayed[b] += got - prev;
                if (prev >= 0 && seq != got + 1) {
                    x->gaps[b]++;
                    fprintf(stderr, "WARNING router: KV events of backend %d: sequence %lld after %lld (batches lost%s; "
                                    "its prefix index may be stale)\n", (int)b, (long long)seq, (long long)got,
                            x->replay[b] ? ", not all replayed" : "");
                }
                x->last_seq[b] = seq;
                x->batches[b]++;
                pthread_mutex_unlock(&x->mu);
                rt_kv_index_apply(x, b, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
            }
            for (int i = 0; i < nf; i++) zmq_msg_close(&f[i]);
        }
    }
    return NULL;
}

rt_kv_index *rt_kv_index_start(const char *const *endpoints, const char *const *replay, int32_t n, char *why,
                               size_t why_cap) {
    if (n < 0 || n > NB) {
        snprintf(why, why_cap, "at most %d backends", NB);
        return NULL;
    }
    rt_kv_index *x = calloc(1, sizeof *x);
    if (!x) {
        snprintf(why, why_cap, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&x->mu, NULL);
    x->n = n;
    for (int32_t b = 0; b < n; b++) x->last_seq[b] = -1;
    if (!(x->zctx = zmq_ctx_new())) {
        snprintf(why, why_cap, "cannot create a ZeroMQ context");
        goto fail;
    }
    const int linger = 0;
    bool any = false;
    for (int32_t b = 0; b < n; b++) {
        if (!endpoints[b] || !endpoints[b][0]) continue;
        if (!(x->sub[b] = zmq_socket(x->zctx, ZMQ_SUB)) || zmq_setsockopt(x->sub[b], ZMQ_SUBSCRIBE, "", 0) != 0 ||
            zmq_setsockopt(x->sub[b], ZMQ_LINGER, &linger, sizeof linger) != 0 || zmq_connect(x->sub[b], endpoints[b]) != 0) {
            snprintf(why, why_cap, "cannot subscribe to '%s': %s", endpoints[b], zmq_strerror(zmq_errno()));
            goto fail;
        }
        x->has[b] = any = true;
        if (replay && replay[b] && replay[b][0] &&
            (!(x->replay[b] = zmq_socket(x->zctx, ZMQ_DEALER)) ||
             zmq_setsockopt(x->replay[b], ZMQ_LINGER, &linger, sizeof linger) != 0 || zmq_connect(x->replay[b], replay[b]) != 0)) {
            snprintf(why, why_cap, "cannot connect to the replay endpoint '%s': %s", replay[b], zmq_strerror(zmq_errno()));
            goto fail;
        }
    }
    if (any) {
        if (pthread_create(&x->thread, NULL, sub_main, x) != 0) {
            snprintf(why, why_cap, "cannot start the KV-event thread");
            goto fail;
        }
        x->started = true;
    }
    return x;
fail:
    rt_kv_index_stop(x);
    return NULL;
}

void rt_kv_index_stop(rt_kv_index *x) {
    if (!x) return;
    atomic_store(&x->stop, true);
    if (x->started) pthread_join(x->thread, NULL);
    for (int32_t b = 0; b < x->n; b++)
        if (x->sub[b]) zmq_close(x->sub[b]);
    for (int32_t b = 0; b < x->n; b++)
        if (x->replay[b]) zmq_close(x->replay[b]);
    if (x->zctx) zmq_ctx_term(x->zctx);
    for (uint32_t i = 0; i < BUCKETS; i++)
        for (node *p = x->bucket[i], *q; p; p = q) q = p->next, free(p);
    pthread_mutex_destroy(&x->mu);
    free(x);
}

bool rt_kv_index_has(const rt_kv_index *x, int32_t b) { return x && b >= 0 && b < x->n && x->has[b]; }

void rt_kv_index_match(rt_kv_index *x, const uint64_t *hashes, int32_t k, int32_t *prefix) {
    pthread_mutex_lock(&x->mu);
    for (int32_t b = 0; b < x->n; b++) {
        if (!x->has[b]) {
            prefix[b] = -1;
            continue;
        }
        int32_t m = 0;
        while (m < k && holds(x, b, hashes[m])) m++;
        prefix[b] = m;
    }
    pthread_mutex_unlock(&x->mu);
}

int64_t rt_kv_index_size(rt_kv_index *x, int32_t b) {
    pthread_mutex_lock(&x->mu);
    const int64_t s = b >= 0 && b < x->n ? x->size[b] : 0;
    pthread_mutex_unlock(&x->mu);
    return s;
}

void rt_kv_index_counts(rt_kv_index *x, int32_t b, int64_t *batches, int64_t *gaps, int64_t *replayed) {
    pthread_mutex_lock(&x->mu);
    *batches = b >= 0 && b < x->n ? x->batches[b] : 0;
    *gaps = b >= 0 && b < x->n ? x->gaps[b] : 0;
    *replayed = b >= 0 && b < x->n ? x->replayed[b] : 0;
    pthread_mutex_unlock(&x->mu);
}
