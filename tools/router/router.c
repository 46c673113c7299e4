/* osprey router: one HTTP endpoint in front of many `osprey serve` (or vLLM) replicas on one host or a
 * trusted network, picking a backend per request the way llm-d's endpoint picker does (picker.h).
 *
 *   osprey router --backends http://127.0.0.1:8001,http://127.0.0.1:8002 --port 8000
 *
 * A poller thread scrapes every backend each --poll-interval ms: GET /health (200: healthy; 503 while
 * it drains, or no answer: not a candidate) and GET /metrics (vllm:num_requests_waiting,
 * vllm:num_requests_running, vllm:kv_cache_usage_perc) and GET /v1/models (the model it serves).
 * POST /v1/completions and /v1/chat/completions are proxied: the body is read whole, the backend is
 * picked, the request is forwarded, and the response (status, Content-Type, body) is passed through as
 * it arrives, so an SSE stream reaches the client unbuffered, byte for byte. A backend that refuses the
 * connection is marked unhealthy and the next best is tried (nothing was sent yet); once bytes have
 * been streamed there is no retry: a backend that dies mid-stream ends an SSE response with an error
 * event ("data: {"error": ...}") and a plain one with a cut connection. A client that goes away closes
 * the backend connection, which makes osprey serve abort the request and free its blocks. The client
 * side is libcurl (http_client.h): one connection per exchange, body bytes relayed from its write
 * callback to the libmicrohttpd content reader as they arrive; polls give up after RT_POLL_TIMEOUT_MS.
 *
 * Prefix scoring here is approximate (llm-d's "approximate prefix cache" scorer): the router hashes
 * the request's prompt material (model, then the prompt text or the messages' JSON) in chained chunks
 * of --block-chars bytes and remembers, in a bounded direct-mapped table, which backends it sent each
 * chunk to; a request's prefix score on a backend is the number of its leading chunks found there.
 * Router metrics on GET /metrics: requests, retries and errors per backend, its health and in-flight
 * count (osprey_router_*). GET /health: 200 when some backend is healthy.
 *
 * Prefill/decode disaggregation (--prefill-backends; vLLM's toy_proxy_server, llm-d's routing sidecar,
 * vLLM's NixlConnector field names): a completion goes first to a prefill backend (the same picker over
 * the prefill pool) as {"kv_transfer_params": {"do_remote_decode": true}, "max_tokens": 1, "stream":
 * false}; that backend computes the prompt, holds its KV blocks and answers with kv_transfer_params
 * (where to pull them: remote_host, remote_port, remote_request_id, remote_block_ids, ...; null when
 * nothing is held). The client's own request, with those kv_transfer_params added, then goes to a
 * decode backend (--backends), which pulls the blocks, computes the prompt's last tokens and decodes;
 * its answer streams back as above. A prefill backend refusing the connection: the next is tried; one
 * answering non-2xx: that answer goes to the client as is; one failing mid-request or past
 * --prefill-timeout: 502. Requests a prefill server refuses (n or best_of > 1, several prompts) go straight to the decode
 * pool (kv_consumer servers compute prompts themselves). While the router waits for a backend's answer
 * it watches the client's socket: a client gone closes the backend connection (the backend aborts). */
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "cli.h"
#include "http_client.h"
#include "kv/transfer.h"
#include "kv_index.h"
#include "osprey_internal.h"
#include "picker.h"
#include "tls.h" /* tools/server/tls.h: --ssl-keyfile / --ssl-certfile, as osprey serve takes them */
#include "url.h" /* tools/server/url.h: the same unescaping as osprey serve */

#define RT_MAX_BACKENDS 64
/* the poller's GETs and the precise scorer's /tokenize: a backend that hangs this long is not healthy
   (the proxied requests themselves have no total timeout: a stream lasts as long as generation) */
#define RT_POLL_TIMEOUT_MS 10000L

typedef struct backend {
    char url_text[300];
    rt_url url;
    /* state (mu) */
    bool healthy;
    char model[256];
    double num_waiting, num_running, kv_usage;
    int32_t active;
    long long n_requests, n_retries, n_errors;
} backend;

/* The P/D path's reasons for the decode pool to compute a whole request (osprey_router_pd_fallback_total) */
enum { PD_FALLBACK_N, PD_FALLBACK_PROMPTS, PD_FALLBACK_NO_TRANSFER, PD_FALLBACK_NO_PREFILL, PD_FALLBACK_COUNT };
static const char *const k_fallback_reason[PD_FALLBACK_COUNT] = {"n", "prompts", "no_transfer", "no_prefill"};

typedef struct router {
    backend b[RT_MAX_BACKENDS]; /* [0, n_decode): --backends; [n_decode, n): --prefill-backends */
    int32_t n, n_decode;
    /* P/D (--prefill-backends): prefill requests' whole-exchange bound; counters (mu) */
    bool pd;
    long prefill_timeout_ms;
    long long pd_requests, pd_fallback[PD_FALLBACK_COUNT], pd_prefill_count, pd_prefill_rejected;
    long long pd_released; /* held transfers released because the decode pool refused or missed the request */
    double pd_prefill_seconds;
    rt_weights w;
    int block_chars, poll_ms, connect_timeout_ms;
    size_t max_body;
    pthread_mutex_t mu;
    uint32_t rr;
    /* approximate prefix table: slot = hash & mask; each slot remembers one chunk hash and the backends
       it was routed to (bit i: backend i) */
    uint64_t *tab_hash;
    uint64_t *tab_mask;
    uint32_t tab_slots_mask;
    atomic_bool stop;
    int log_level; /* 0 debug, 1 info */
    /* precise prefix scoring (--kv-events): the backends' KV events, and their block hash */
    rt_kv_index *kvx;
    osp_prefix_hasher hasher;
    int32_t block_size;
} router;

static void rlog(const router *r, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void rlog(const router *r, int level, const char *fmt, ...) {
    if (level < r->log_level) return;
    char ts[32];
    const time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(ts, sizeof ts, "%m-%d %H:%M:%S", &tm);
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s %s router: %s\n", level ? "INFO" : "DEBUG", ts, line);
}

/* ---- the poller ------------------------------------------------------------------------------ */

/* The value of the first sample of gauge `name` in a Prometheus text body, or -1. */
static double metric(const char *body, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = body; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, name, n) || (p[n] != '{' && p[n] != ' ')) continue;
        const char *sp = strchr(p, ' ');
        const char *nl = strchr(p, '\n');
        if (!sp || (nl && sp > nl)) continue;
        if (p[n] == '{') { /* the space after the labels */
            const char *close = strchr(p, '}');
            if (!close || (nl && close > nl)) continue;
            sp = close + 1;
        }
        return strtod(sp, NULL);
    }
    return -1;
}

static char *get(const router *r, const backend *b, const char *path, int *status) {
    rt_http_resp resp;
    *status = 0;
    if (rt_http_request(&b->url, "GET", path, NULL, NULL, 0, r->connect_timeout_ms, RT_POLL_TIMEOUT_MS, &resp) != 0) return NULL;
    *status = resp.status;
    char *body = rt_http_read_all(&resp, 4u << 20, NULL);
    rt_http_close(&resp);
    return body;
}

static void poll_backend(router *r, int32_t i) {
    backend *b = &r->b[i];
    int st_h = 0, st_m = 0, st_v = 0;
    char *h = get(r, b, "/health", &st_h);
    char *m = st_h == 200 ? get(r, b, "/metrics", &st_m) : NULL;
    char *v = st_h == 200 ? get(r, b, "/v1/models", &st_v) : NULL;
    char model[256] = "";
    if (v && st_v == 200) {
        json_t *j = json_loads(v, 0, NULL);
        const char *id = NULL;
        if (j && !json_unpack(json_object_get(j, "data"), "[{s:s}]", "id", &id) && id) snprintf(model, sizeof model, "%s", id);
        json_decref(j);
    }
    pthread_mutex_lock(&r->mu);
    const bool was = b->healthy;
    b->healthy = st_h == 200 && st_m == 200 && m;
    if (b->healthy) {
        b->num_waiting = metric(m, "vllm:num_requests_waiting");
        b->num_running = metric(m, "vllm:num_requests_running");
        b->kv_usage = metric(m, "vllm:kv_cache_usage_perc");
        if (b->num_waiting < 0) b->num_waiting = 0;
        if (b->num_running < 0) b->num_running = 0;
        if (b->kv_usage < 0) b->kv_usage = 0;
        if (model[0]) snprintf(b->model, sizeof b->model, "%s", model);
    }
    const bool now = b->healthy;
    pthread_mutex_unlock(&r->mu);
    if (was != now) rlog(r, 1, "backend %s is %s", b->url_text, now ? "healthy" : "not healthy (a candidate no more)");
    free(h);
    free(m);
    free(v);
}

static void *poller_main(void *arg) {
    router *r = arg;
    /* main polled every backend once before starting this thread: wait a whole interval first, so the
       next view is --poll-interval after that one, not a second poll at once */
    while (!atomic_load(&r->stop)) {
        for (int slept = 0; slept < r->poll_ms && !atomic_load(&r->stop); slept += 10) { /* stop within 10 ms */
            const int ms = r->poll_ms - slept < 10 ? r->poll_ms - slept : 10;
            struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ms * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (atomic_load(&r->stop)) break;
        for (int32_t i = 0; i < r->n; i++) poll_backend(r, i);
    }
    return NULL;
}

/* ---- approximate prefix index ---------------------------------------------------------------- */

/* Chained hashes of the full --block-chars chunks of s[0..n): h_i = XXH64(chunk_i, seed h_{i-1}). */
static int32_t chunk_hashes(const router *r, const char *s, size_t n, uint64_t *out, int32_t cap) {
    int32_t k = 0;
    uint64_t h = 0x6f73707265790001ull;
    for (size_t off = 0; off + (size_t)r->block_chars <= n && k < cap; off += (size_t)r->block_chars)
        out[k++] = h = XXH64(s + off, (size_t)r->block_chars, h);
    return k;
}

/* r->mu held: how many leading chunks each backend holds (prefix[i]). */
static void prefix_match(const router *r, const uint64_t *h, int32_t k, int32_t *prefix) {
    uint64_t alive = r->n >= 64 ? ~0ull : (1ull << r->n) - 1;
    for (int32_t i = 0; i < r->n; i++) prefix[i] = 0;
    for (int32_t c = 0; c < k && alive; c++) {
        const uint32_t s = (uint32_t)h[c] & r->tab_slots_mask;
        const uint64_t have = r->tab_hash[s] == h[c] ? r->tab_mask[s] : 0;
        alive &= have;
        for (int32_t i = 0; i < r->n; i++)
            if (alive >> i & 1) prefix[i]++;
    }
}

/* r->mu held: records that chunks h[0..k) went to backend i. */
static void prefix_record(router *r, const uint64_t *h, int32_t k, int32_t i) {
    for (int32_t c = 0; c < k; c++) {
        const uint32_t s = (uint32_t)h[c] & r->tab_slots_mask;
        if (r->tab_hash[s] != h[c]) r->tab_hash[s] = h[c], r->tab_mask[s] = 0;
        r->tab_mask[s] |= 1ull << i;
    }
}

/* ---- proxying -------------------------------------------------------------------------------- */

typedef struct conn_ctx {
    char *body;
    size_t len, cap;
    bool too_large;
} conn_ctx;

typedef struct stream_ctx {
    router *r;
    int32_t backend;
    rt_http_resp resp;
    bool sse, failed_sent;
} stream_ctx;

static enum MHD_Result reply_text(struct MHD_Connection *c, unsigned status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static enum MHD_Result reply_text(struct MHD_Connection *c, unsigned status, const char *type, const char *fmt, ...) {
    char *s = NULL;
    va_list ap;
    va_start(ap, fmt);
    const int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0) return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer((size_t)n, s, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", type);
    const enum MHD_Result ret = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* An OpenAI-style error body; with `allow` (a 405) the Allow header RFC 9110 (15.5.6) requires. */
static enum MHD_Result reply_error_allow(struct MHD_Connection *c, unsigned status, const char *msg, const char *allow) {
    json_t *j = json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message", msg, "type",
                          status == 503 ? "ServiceUnavailableError" : status == 502 ? "BadGatewayError" : "BadRequestError",
                          "param", "code", (int)status);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "application/json");
    if (allow) MHD_add_response_header(resp, "Allow", allow);
    const enum MHD_Result ret = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status, const char *msg) {
    return reply_error_allow(c, status, msg, NULL);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_ctx *s = cls;
    const ssize_t k = rt_http_read_body(&s->resp, buf, max);
    if (k > 0) return k;
    if (k == 0) return MHD_CONTENT_READER_END_OF_STREAM;
    if (s->resp.gone) return MHD_CONTENT_READER_END_WITH_ERROR; /* the client went away: nothing to tell it */
    /* the backend went away mid-response */
    pthread_mutex_lock(&s->r->mu);
    s->r->b[s->backend].n_errors++;
    pthread_mutex_unlock(&s->r->mu);
    rlog(s->r, 1, "backend %s failed mid-response (%s)", s->r->b[s->backend].url_text, s->resp.error);
    if (s->sse && !s->failed_sent) {
        s->failed_sent = true;
        s->resp.eof = true;
        const int n = snprintf(buf, max,
                               "data: {\"error\": {\"message\": \"the backend failed while streaming\", \"type\": "
                               "\"BadGatewayError\", \"param\": null, \"code\": 502}}\n\n");
        return n > 0 && (size_t)n < max ? n : MHD_CONTENT_READER_END_WITH_ERROR;
    }
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free(void *cls) {
    stream_ctx *s = cls;
    rt_http_close(&s->resp); /* a client gone mid-stream: the backend sees the close and aborts */
    pthread_mutex_lock(&s->r->mu);
    s->r->b[s->backend].active--;
    pthread_mutex_unlock(&s->r->mu);
    free(s);
}

/* The text the prefix scorer hashes: the model, then the prompt or the messages, in request order. */
static char *prompt_material(json_t *req, size_t *n) {
    json_t *m = json_object_get(req, "model"), *p = json_object_get(req, "prompt"), *msgs = json_object_get(req, "messages");
    char *body = json_is_string(p) ? strdup(json_string_value(p))
                 : p               ? json_dumps(p, JSON_COMPACT | JSON_PRESERVE_ORDER)
                 : msgs            ? json_dumps(msgs, JSON_COMPACT | JSON_PRESERVE_ORDER)
                                   : strdup("");
    char *s = NULL;
    const int k = body ? asprintf(&s, "%s\n%s", json_is_string(m) ? json_string_value(m) : "", body) : -1;
    free(body);
    if (k < 0) return NULL;
    *n = (size_t)k;
    return s;
}

/* The block hashes of the request's full blocks (malloc'd, *n of them; NULL when none): its prompt or
 * messages tokenized by a healthy backend (POST /tokenize, as llm-d's precise scorer tokenizes in the
 * picker), then chained with the backends' algorithm and seed, in the 64-bit form KV events carry. */
static uint64_t *precise_hashes(router *r, const conn_ctx *cx, int32_t *n) {
    *n = 0;
    json_t *req = json_loadb(cx->body ? cx->body : "", cx->len, 0, NULL);
    json_t *tq = json_object();
    const char *keys[] = {"model", "prompt", "messages", "add_special_tokens"};
    for (int i = 0; req && i < 4; i++)
        if (json_object_get(req, keys[i])) json_object_set(tq, keys[i], json_object_get(req, keys[i]));
    char *body = json_dumps(tq, JSON_COMPACT);
    json_decref(tq);
    json_decref(req);
    int32_t b = -1;
    pthread_mutex_lock(&r->mu);
    for (int32_t i = 0; i < r->n_decode && b < 0; i++) /* the decode pool's: the KV events are theirs */
        if (r->b[(r->rr + (uint32_t)i) % (uint32_t)r->n_decode].healthy)
            b = (int32_t)((r->rr + (uint32_t)i) % (uint32_t)r->n_decode);
    pthread_mutex_unlock(&r->mu);
    uint64_t *out = NULL;
    rt_http_resp resp;
    if (!body || b < 0 || rt_http_request(&r->b[b].url, "POST", "/tokenize", NULL, body, strlen(body), r->connect_timeout_ms,
                                          RT_POLL_TIMEOUT_MS, &resp) != 0) {
        free(body);
        return NULL;
    }
    free(body);
    char *text = resp.status == 200 ? rt_http_read_all(&resp, 64u << 20, NULL) : NULL;
    rt_http_close(&resp);
    json_t *j = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    json_t *toks = json_object_get(j, "tokens");
    const size_t nt = json_array_size(toks);
    const int32_t bs = r->block_size, nb = (int32_t)(nt / (size_t)bs);
    int32_t *ids = nb > 0 ? malloc(sizeof *ids * nt) : NULL;
    out = nb > 0 ? malloc(sizeof *out * (size_t)nb) : NULL;
    if (ids && out) {
        for (size_t i = 0; i < nt; i++) ids[i] = (int32_t)json_integer_value(json_array_get(toks, i));
        osp_block_hash prev = {0};
        for (int32_t i = 0; i < nb; i++) {
            const osp_block_hash hb = osp_prefix_hash_block(&r->hasher, i ? &prev : NULL, ids + (size_t)i * bs, bs, NULL, 0);
            out[i] = osp_block_hash_external(&hb, r->hasher.algo);
            prev = hb;
        }
        *n = nb;
    } else {
        free(out);
        out = NULL;
    }
    free(ids);
    json_decref(j);
    return out;
}

/* What the picker knows of one request: its model, its chunk hashes in the approximate index, and (the
 * decode pool, with --kv-events) how many of its blocks each backend holds per its KV events. */
typedef struct route_in {
    char model[256];                  /* "" when the request names none */
    const uint64_t *h;                /* the request's chunk hashes [k] */
    int32_t k;
    int32_t nblk;                     /* its full blocks (0: no precise scoring) */
    int32_t precise[RT_MAX_BACKENDS]; /* decode backend i holds precise[i] leading blocks; -1: no events */
    const char *extra[2];             /* the extra header lines: Authorization passes through */
    int client_fd;                    /* the client's socket, watched while a backend works (-1: none) */
} route_in;

/* The backends of a pool: b[0..n_decode) are --backends (the decode pool, or the only one), and
 * b[n_decode..n) --prefill-backends. */
static void pool_range(const router *r, bool prefill, int32_t *lo, int32_t *hi) {
    *lo = prefill ? r->n_decode : 0;
    *hi = prefill ? r->n : r->n_decode;
}

/* Picks the best backend of a pool not in tried[], counts a request in flight to it and records the
 * request's chunks there (the approximate index). Returns its index, -1 when none passes the filters. */
static int32_t pick_in_pool(router *r, bool prefill, const route_in *in, const bool *tried, bool retry) {
    int32_t lo, hi;
    pool_range(r, prefill, &lo, &hi);
    rt_backend_view v[RT_MAX_BACKENDS];
    int32_t prefix[RT_MAX_BACKENDS];
    /* KV events cover the decode pool only: the prefill pool is scored by the approximate index alone */
    const bool precise = !prefill && in->nblk > 0;
    pthread_mutex_lock(&r->mu);
    prefix_match(r, in->h, in->k, prefix);
    /* with the request's blocks known, a backend with KV events scores by the blocks it holds, one
       without by the share of chunks the approximate index gives it */
    const int32_t total = precise ? in->nblk : in->k;
    if (precise)
        for (int32_t i = lo; i < hi; i++)
            prefix[i] = in->precise[i] >= 0 ? in->precise[i] : in->k > 0 ? (int32_t)((int64_t)prefix[i] * in->nblk / in->k) : 0;
    for (int32_t i = lo; i < hi; i++) {
        const backend *b = &r->b[i];
        v[i - lo] = (rt_backend_view){.healthy = b->healthy && !tried[i],
                                      .serves_model = !in->model[0] || !b->model[0] || !strcmp(in->model, b->model),
                                      .num_waiting = b->num_waiting, .num_running = b->num_running,
                                      .kv_usage = b->kv_usage, .active = b->active, .prefix_blocks = prefix[i]};
    }
    const int32_t p = rt_pick(v, hi - lo, total, &r->w, r->rr++, NULL);
    const int32_t pick = p < 0 ? -1 : lo + p;
    if (pick >= 0) {
        r->b[pick].active++;
        r->b[pick].n_requests++;
        if (retry) r->b[pick].n_retries++;
        prefix_record(r, in->h, in->k, pick);
    }
    pthread_mutex_unlock(&r->mu);
    if (pick >= 0)
        rlog(r, 0, "-> %s%s (prefix %d of %d %s)", prefill ? "prefill " : "", r->b[pick].url_text, prefix[pick], total,
             precise ? "blocks" : "chunks");
    return pick;
}

static void done_with(router *r, int32_t i, bool failed) {
    pthread_mutex_lock(&r->mu);
    r->b[i].active--;
    if (failed) r->b[i].n_errors++;
    pthread_mutex_unlock(&r->mu);
}

/* Sends body[0..len) as POST `path` to the best backend of a pool; one that refuses the connection
 * (nothing was sent) is marked unhealthy and the next best is tried. timeout_ms bounds the whole
 * exchange (0: none). Returns the backend's index with *resp open (at this address for its life: libcurl
 * writes into it) and counted in flight (end that with done_with), or -1: no backend left to try,
 * -2: the chosen one failed after the request was sent (counted; why[] says), -3: the client went away. */
static int32_t send_to_pool(router *r, bool prefill, const char *path, const route_in *in, const char *body, size_t len,
                            long timeout_ms, rt_http_resp *resp, char *why, size_t why_cap) {
    bool tried[RT_MAX_BACKENDS] = {0};
    for (int attempt = 0; attempt < r->n; attempt++) {
        const int32_t pick = pick_in_pool(r, prefill, in, tried, attempt > 0);
        if (pick < 0) return -1;
        const int rc = rt_http_request_watched(&r->b[pick].url, "POST", path, in->extra, body, len, r->connect_timeout_ms,
                                               timeout_ms, in->client_fd, resp);
        if (rc == 0) return pick;
        done_with(r, pick, rc != -3);
        snprintf(why, why_cap, "%s", resp->error);
        tried[pick] = true;
        if (rc == -3) {
            rlog(r, 1, "the client went away while %s%s worked; its request is aborted", prefill ? "prefill backend " : "",
                 r->b[pick].url_text);
            return -3;
        }
        if (rc == -1) {
            pthread_mutex_lock(&r->mu);
            r->b[pick].healthy = false; /* refused: the poller brings it back */
            pthread_mutex_unlock(&r->mu);
            rlog(r, 1, "backend %s refused the connection (%s); trying another", r->b[pick].url_text, why);
            continue;
        }
        rlog(r, 1, "backend %s failed before answering (%s)", r->b[pick].url_text, why);
        return -2;
    }
    return -1;
}

/* Forwards body to the decode pool (the only pool without --prefill-backends) and passes its response
 * through as it arrives. prefill: the prefill backend that served the request (-1: none), named in
 * the X-Osprey-Prefill-Backend header. */
/* A P/D request's held transfer (kv: the prefill's kv_transfer_params) released on its producer, on a thread
 * of its own: the decode pool refused the request or could not be reached, so nobody will pull it. */
typedef struct release_job {
    char host[256];
    int32_t port;
    uint64_t engine_id, transfer_id;
} release_job;

static void *release_main(void *arg) {
    release_job *j = arg;
    osp_kv_xfer_fetch(j->host, j->port, j->engine_id, j->transfer_id, 0, NULL, 0, true, 3.0, NULL, NULL);
    free(j);
    return NULL;
}

static uint64_t hex64(const json_t *v) {
    const char *t = json_string_value(v);
    return t ? strtoull(t, NULL, 16) : 0;
}

static void release_transfer(router *r, const json_t *kv) {
    const char *host = json_string_value(json_object_get(kv, "remote_host"));
    const json_t *port = json_object_get(kv, "remote_port");
    release_job *j = host && json_is_integer(port) ? calloc(1, sizeof *j) : NULL;
    if (!j) return;
    snprintf(j->host, sizeof j->host, "%s", host);
    j->port = (int32_t)json_integer_value(port);
    j->engine_id = hex64(json_object_get(kv, "remote_engine_id"));
    j->transfer_id = hex64(json_object_get(kv, "remote_request_id"));
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, release_main, j) != 0) free(j);
    pthread_attr_destroy(&at);
    pthread_mutex_lock(&r->mu);
    r->pd_released++;
    pthread_mutex_unlock(&r->mu);
}

static enum MHD_Result forward_kv(router *r, struct MHD_Connection *c, const char *url, const route_in *in,
                                  const char *body, size_t len, int32_t prefill, const json_t *kv);

static enum MHD_Result forward(router *r, struct MHD_Connection *c, const char *url, const route_in *in, const char *body,
                               size_t len, int32_t prefill) {
    return forward_kv(r, c, url, in, body, len, prefill, NULL);
}

/* forward, and with kv (a P/D request's transfer) its release when the decode pool refuses the request
 * (non-2xx) or cannot take it. */
static enum MHD_Result forward_kv(router *r, struct MHD_Connection *c, const char *url, const route_in *in,
                                  const char *body, size_t len, int32_t prefill, const json_t *kv) {
    stream_ctx *s = calloc(1, sizeof *s);
    if (!s) return reply_error(c, 500, "out of memory");
    char why[CURL_ERROR_SIZE];
    const int32_t pick = send_to_pool(r, false, url, in, body, len, 0, &s->resp, why, sizeof why);
    if (kv && (pick < 0 || s->resp.status < 200 || s->resp.status > 299)) release_transfer(r, kv);
    if (pick < 0) {
        free(s);
        if (pick == -3) return MHD_NO;
        if (pick == -2) return reply_error(c, 502, "the backend failed before answering");
        return reply_error(c, 503, r->pd ? "no healthy backend serves this model (decode pool)"
                                         : "no healthy backend serves this model");
    }
    s->r = r;
    s->backend = pick;
    s->sse = !strncmp(s->resp.content_type, "text/event-stream", 17);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, s, stream_free);
    if (!resp) {
        stream_free(s);
        return MHD_NO;
    }
    if (s->resp.content_type[0]) MHD_add_response_header(resp, "Content-Type", s->resp.content_type);
    if (s->sse) MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Osprey-Backend", r->b[pick].url_text);
    if (prefill >= 0) MHD_add_response_header(resp, "X-Osprey-Prefill-Backend", r->b[prefill].url_text);
    const enum MHD_Result ret = MHD_queue_response(c, (unsigned)s->resp.status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}


/* What the P/D path cannot do: a prefill server refuses do_remote_decode with n > 1 (one sequence's
 * blocks are held; best_of > 1 likewise) and with several prompts in one completion request (a list of
 * strings or of token lists). Returns the fallback reason, -1 when the request can go the P/D way. */
static int pd_unfit(json_t *req) {
    json_t *n = json_object_get(req, "n"), *bo = json_object_get(req, "best_of"), *p = json_object_get(req, "prompt");
    if ((json_is_integer(n) && json_integer_value(n) > 1) || (json_is_integer(bo) && json_integer_value(bo) > 1))
        return PD_FALLBACK_N;
    if (json_is_array(p) && json_array_size(p) > 1 && !json_is_integer(json_array_get(p, 0))) return PD_FALLBACK_PROMPTS;
    return -1;
}

/* The prefill request (vLLM's toy_proxy_server and llm-d's sidecar send the same): the client's body with
 * kv_transfer_params {"do_remote_decode": true}, one token (max_tokens, and max_completion_tokens when
 * given), no stream, no stream_options, no min_tokens (which could exceed the one token). */
static char *prefill_body(json_t *req) {
    json_t *p = json_deep_copy(req);
    if (!p) return NULL;
    json_object_set_new(p, "kv_transfer_params", json_pack("{s:b}", "do_remote_decode", 1));
    json_object_set_new(p, "max_tokens", json_integer(1));
    if (json_object_get(p, "max_completion_tokens")) json_object_set_new(p, "max_completion_tokens", json_integer(1));
    json_object_set_new(p, "stream", json_false());
    json_object_del(p, "stream_options");
    json_object_del(p, "min_tokens");
    char *s = json_dumps(p, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(p);
    return s;
}

static void pd_count_fallback(router *r, int reason) {
    pthread_mutex_lock(&r->mu);
    r->pd_fallback[reason]++;
    pthread_mutex_unlock(&r->mu);
}

/* The P/D path (--prefill-backends): the prefill request to the prefill pool, its kv_transfer_params
 * onto the client's request, that to the decode pool. req: the client's request (owned by the caller). */
static enum MHD_Result proxy_pd(router *r, struct MHD_Connection *c, const char *url, const route_in *in, json_t *req,
                                const conn_ctx *cx) {
    /* the router owns kv_transfer_params on this path: a client's own (which could point a decode server
       at any host) is dropped */
    const bool client_params = json_object_get(req, "kv_transfer_params") != NULL;
    json_object_del(req, "kv_transfer_params");
    const int unfit = pd_unfit(req);
    if (unfit >= 0) {
        pd_count_fallback(r, unfit);
        rlog(r, 0, "%s: straight to the decode pool (%s)", url, k_fallback_reason[unfit]);
        if (!client_params) return forward(r, c, url, in, cx->body, cx->len, -1);
        char *b = json_dumps(req, JSON_COMPACT | JSON_PRESERVE_ORDER);
        const enum MHD_Result ret = b ? forward(r, c, url, in, b, strlen(b), -1) : reply_error(c, 500, "out of memory");
        free(b);
        return ret;
    }
    char *pb = prefill_body(req);
    if (!pb) return reply_error(c, 500, "out of memory");
    pthread_mutex_lock(&r->mu);
    r->pd_requests++;
    pthread_mutex_unlock(&r->mu);
    const double t0 = now_s();
    rt_http_resp pr;
    char why[CURL_ERROR_SIZE];
    const int32_t pp = send_to_pool(r, true, url, in, pb, strlen(pb), r->prefill_timeout_ms, &pr, why, sizeof why);
    free(pb);
    if (pp == -3) return MHD_NO;
    if (pp == -1) { /* no healthy prefill backend: the decode pool computes the prompt itself (slower, not down) */
        pd_count_fallback(r, PD_FALLBACK_NO_PREFILL);
        rlog(r, 0, "%s: straight to the decode pool (no healthy prefill backend)", url);
        char *b = json_dumps(req, JSON_COMPACT | JSON_PRESERVE_ORDER);
        const enum MHD_Result ret = b ? forward(r, c, url, in, b, strlen(b), -1) : reply_error(c, 500, "out of memory");
        free(b);
        return ret;
    }
    if (pp == -2) {
        char msg[CURL_ERROR_SIZE + 64];
        snprintf(msg, sizeof msg, "the prefill backend failed (%s)", why);
        return reply_error(c, 502, msg);
    }
    size_t n = 0;
    char *text = rt_http_read_all(&pr, 64u << 20, &n);
    if (!text) {
        const bool gone = pr.gone;
        snprintf(why, sizeof why, "%s", pr.error[0] ? pr.error : "its answer is larger than 64 MiB");
        rt_http_close(&pr);
        done_with(r, pp, !gone);
        if (gone) return MHD_NO;
        rlog(r, 1, "prefill backend %s failed mid-response (%s)", r->b[pp].url_text, why);
        char msg[CURL_ERROR_SIZE + 64];
        snprintf(msg, sizeof msg, "the prefill backend failed mid-response (%s)", why);
        return reply_error(c, 502, msg);
    }
    const int status = pr.status;
    char ctype[128];
    snprintf(ctype, sizeof ctype, "%s", pr.content_type[0] ? pr.content_type : "application/json");
    rt_http_close(&pr);
    done_with(r, pp, false);
    if (status < 200 || status > 299) { /* the client's error (a 400) or the prefill server's (an overload): as is */
        rlog(r, 1, "prefill backend %s answered %d; passed to the client", r->b[pp].url_text, status);
        pthread_mutex_lock(&r->mu);
        r->pd_prefill_rejected++;
        pthread_mutex_unlock(&r->mu);
        const enum MHD_Result ret = reply_text(c, (unsigned)status, ctype, "%s", text);
        free(text);
        return ret;
    }
    json_t *ans = json_loadb(text, n, 0, NULL);
    free(text);
    json_t *kv = json_object_get(ans, "kv_transfer_params");
    if (!json_is_object(ans) || (kv && !json_is_object(kv) && !json_is_null(kv))) {
        json_decref(ans);
        rlog(r, 1, "prefill backend %s answered no JSON object with kv_transfer_params", r->b[pp].url_text);
        pthread_mutex_lock(&r->mu);
        r->b[pp].n_errors++;
        pthread_mutex_unlock(&r->mu);
        return reply_error(c, 502, "the prefill backend's answer is not a completion with kv_transfer_params");
    }
    const double dt = now_s() - t0;
    pthread_mutex_lock(&r->mu);
    r->pd_prefill_seconds += dt;
    r->pd_prefill_count++;
    pthread_mutex_unlock(&r->mu);
    enum MHD_Result ret;
    if (json_is_object(kv)) {
        json_object_set(req, "kv_transfer_params", kv);
        char *db = json_dumps(req, JSON_COMPACT | JSON_PRESERVE_ORDER);
        ret = db ? forward_kv(r, c, url, in, db, strlen(db), pp, kv) : reply_error(c, 500, "out of memory");
        free(db);
    } else { /* null or absent: nothing held (a prompt shorter than a block): the decode server computes it */
        pd_count_fallback(r, PD_FALLBACK_NO_TRANSFER);
        char *db = client_params ? json_dumps(req, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        ret = !client_params ? forward(r, c, url, in, cx->body, cx->len, pp)
              : db           ? forward(r, c, url, in, db, strlen(db), pp)
                             : reply_error(c, 500, "out of memory");
        free(db);
    }
    json_decref(ans);
    rlog(r, 0, "%s: prefill on %s took %.3f s", url, r->b[pp].url_text, dt);
    return ret;
}

static enum MHD_Result proxy(router *r, struct MHD_Connection *c, const char *url, conn_ctx *cx) {
    json_error_t je;
    json_t *req = json_loadb(cx->body ? cx->body : "", cx->len, 0, &je);
    if (!json_is_object(req)) {
        json_decref(req);
        return reply_error(c, 400, "the request body is not a JSON object");
    }
    route_in *in = calloc(1, sizeof *in);
    if (!in) {
        json_decref(req);
        return reply_error(c, 500, "out of memory");
    }
    const char *model = json_is_string(json_object_get(req, "model")) ? json_string_value(json_object_get(req, "model")) : NULL;
    if (model) snprintf(in->model, sizeof in->model, "%s", model);
    size_t pn = 0;
    char *pm = prompt_material(req, &pn);
    enum { MAXC = 4096 };
    uint64_t *h = malloc(sizeof *h * MAXC);
    in->h = h;
    in->k = pm && h ? chunk_hashes(r, pm, pn, h, MAXC) : 0;
    free(pm);
    /* Authorization passes through (the backends may want their key) */
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    char auth_line[1200] = "";
    if (auth && strlen(auth) < 1000 && !strpbrk(auth, "\r\n")) snprintf(auth_line, sizeof auth_line, "Authorization: %s", auth);
    in->extra[0] = auth_line[0] ? auth_line : NULL;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    in->client_fd = ci ? ci->connect_fd : -1;
    /* precise: the request's block hashes, from its tokens as a backend tokenizes them */
    uint64_t *bh = r->kvx ? precise_hashes(r, cx, &in->nblk) : NULL;
    for (int32_t i = 0; i < RT_MAX_BACKENDS; i++) in->precise[i] = -1;
    if (bh) rt_kv_index_match(r->kvx, bh, in->nblk, in->precise);
    free(bh);
    const enum MHD_Result ret = r->pd ? proxy_pd(r, c, url, in, req, cx) : forward(r, c, url, in, cx->body, cx->len, -1);
    json_decref(req);
    free(h);
    free(in);
    return ret;
}

static char *render_metrics(router *r) {
    char *out = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&out, &n);
    if (!f) return NULL;
    fputs("# HELP osprey_router_requests Requests routed to a backend.\n# TYPE osprey_router_requests counter\n", f);
    pthread_mutex_lock(&r->mu);
    for (int32_t i = 0; i < r->n; i++)
        fprintf(f, "osprey_router_requests_total{backend=\"%s\"} %lld\n", r->b[i].url_text, r->b[i].n_requests);
    fputs("# HELP osprey_router_retries Requests sent to a backend after another refused the connection.\n"
          "# TYPE osprey_router_retries counter\n", f);
    for (int32_t i = 0; i < r->n; i++)
        fprintf(f, "osprey_router_retries_total{backend=\"%s\"} %lld\n", r->b[i].url_text, r->b[i].n_retries);
    fputs("# HELP osprey_router_errors Connections to a backend that failed.\n# TYPE osprey_router_errors counter\n", f);
    for (int32_t i = 0; i < r->n; i++)
        fprintf(f, "osprey_router_errors_total{backend=\"%s\"} %lld\n", r->b[i].url_text, r->b[i].n_errors);
    fputs("# HELP osprey_router_backend_healthy 1 when the backend is a candidate.\n"
          "# TYPE osprey_router_backend_healthy gauge\n", f);
    for (int32_t i = 0; i < r->n; i++)
        fprintf(f, "osprey_router_backend_healthy{backend=\"%s\"} %d\n", r->b[i].url_text, r->b[i].healthy);
    fputs("# HELP osprey_router_backend_active Requests in flight from this router.\n"
          "# TYPE osprey_router_backend_active gauge\n", f);
    for (int32_t i = 0; i < r->n; i++)
        fprintf(f, "osprey_router_backend_active{backend=\"%s\"} %d\n", r->b[i].url_text, r->b[i].active);
    if (r->pd) {
        fputs("# HELP osprey_router_backend_pool The pool a backend is in (1): prefill (--prefill-backends) or decode.\n"
              "# TYPE osprey_router_backend_pool gauge\n", f);
        for (int32_t i = 0; i < r->n; i++)
            fprintf(f, "osprey_router_backend_pool{backend=\"%s\",pool=\"%s\"} 1\n", r->b[i].url_text,
                    i < r->n_decode ? "decode" : "prefill");
        fprintf(f,
                "# HELP osprey_router_pd_requests Requests sent the P/D way (a prefill request first).\n"
                "# TYPE osprey_router_pd_requests counter\n"
                "osprey_router_pd_requests_total %lld\n"
                "# HELP osprey_router_pd_prefill_seconds Prefill requests answered 2xx: time from sending to the whole "
                "answer.\n"
                "# TYPE osprey_router_pd_prefill_seconds summary\n"
                "osprey_router_pd_prefill_seconds_sum %.6f\n"
                "osprey_router_pd_prefill_seconds_count %lld\n"
                "# HELP osprey_router_pd_prefill_rejected Prefill requests answered non-2xx (passed to the client as is).\n"
                "# TYPE osprey_router_pd_prefill_rejected counter\n"
                "osprey_router_pd_prefill_rejected_total %lld\n"
                "# HELP osprey_router_pd_released Transfers the router released on their producer: the decode pool "
                "refused the request (non-2xx) or could not take it, so nobody pulls them.\n"
                "# TYPE osprey_router_pd_released counter\n"
                "osprey_router_pd_released_total %lld\n"
                "# HELP osprey_router_pd_fallback Requests the decode pool computed whole: n (n or best_of > 1, "
                "straight there), prompts (several in one request, straight there), no_transfer (the prefill held nothing: a short "
                "prompt), no_prefill (no healthy prefill backend).\n"
                "# TYPE osprey_router_pd_fallback counter\n",
                r->pd_requests, r->pd_prefill_seconds, r->pd_prefill_count, r->pd_prefill_rejected, r->pd_released);
        for (int k = 0; k < PD_FALLBACK_COUNT; k++)
            fprintf(f, "osprey_router_pd_fallback_total{reason=\"%s\"} %lld\n", k_fallback_reason[k], r->pd_fallback[k]);
    }
    pthread_mutex_unlock(&r->mu);
    if (r->kvx) {
        fputs("# HELP osprey_router_kv_blocks Blocks a backend holds per its KV events, one per medium (a block in the "
              "KV pool and in an offload tier counts twice).\n"
              "# TYPE osprey_router_kv_blocks gauge\n", f);
        for (int32_t i = 0; i < r->n_decode; i++)
            if (rt_kv_index_has(r->kvx, i))
                fprintf(f, "osprey_router_kv_blocks{backend=\"%s\"} %lld\n", r->b[i].url_text, (long long)rt_kv_index_size(r->kvx, i));
        fputs("# HELP osprey_router_kv_event_gaps Batches lost in a backend's KV-event sequence.\n"
              "# TYPE osprey_router_kv_event_gaps counter\n", f);
        int64_t nbat, gaps, replayed;
        for (int32_t i = 0; i < r->n_decode; i++) {
            rt_kv_index_counts(r->kvx, i, &nbat, &gaps, &replayed);
            if (rt_kv_index_has(r->kvx, i))
                fprintf(f, "osprey_router_kv_event_gaps_total{backend=\"%s\"} %lld\n", r->b[i].url_text, (long long)gaps);
        }
        fputs("# HELP osprey_router_kv_event_replayed Batches recovered from a backend's replay endpoint.\n"
              "# TYPE osprey_router_kv_event_replayed counter\n", f);
        for (int32_t i = 0; i < r->n_decode; i++) {
            rt_kv_index_counts(r->kvx, i, &nbat, &gaps, &replayed);
            if (rt_kv_index_has(r->kvx, i))
                fprintf(f, "osprey_router_kv_event_replayed_total{backend=\"%s\"} %lld\n", r->b[i].url_text,
                        (long long)replayed);
        }
    }
    fclose(f);
    return out;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    router *r = cls;
    conn_ctx *cx = *con_cls;
    if (!cx) {
        if (!(cx = calloc(1, sizeof *cx))) return MHD_NO;
        *con_cls = cx;
        return MHD_YES;
    }
    if (*upload_size) {
        if (cx->len + *upload_size > r->max_body) cx->too_large = true;
        if (!cx->too_large) {
            if (cx->len + *upload_size + 1 > cx->cap) {
                size_t cap = cx->cap ? cx->cap : 4096;
                while (cap < cx->len + *upload_size + 1) cap *= 2;
                char *p = realloc(cx->body, cap);
                if (!p) return MHD_NO;
                cx->body = p, cx->cap = cap;
            }
            memcpy(cx->body + cx->len, upload_data, *upload_size);
            cx->len += *upload_size;
            cx->body[cx->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cx->too_large) return reply_error(c, 413, "the request body is too large");
    /* HEAD is served wherever GET is (libmicrohttpd sends the headers only), as osprey serve does */
    const bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (get && !strcmp(url, "/health")) {
        /* some decode backend (P/D: without a prefill backend the decode pool computes prompts itself) */
        bool any = false;
        pthread_mutex_lock(&r->mu);
        for (int32_t i = 0; i < r->n_decode; i++) any |= r->b[i].healthy;
        pthread_mutex_unlock(&r->mu);
        return reply_text(c, any ? 200 : 503, "application/json", "{\"status\": \"%s\"}", any ? "ok" : "no healthy backend");
    }
    if (get && !strcmp(url, "/metrics")) {
        char *m = render_metrics(r);
        const enum MHD_Result ret = reply_text(c, m ? 200 : 500, "text/plain; version=0.0.4; charset=utf-8", "%s", m ? m : "");
        free(m);
        return ret;
    }
    if (get && !strcmp(url, "/v1/models")) {
        json_t *data = json_array();
        pthread_mutex_lock(&r->mu);
        for (int32_t i = 0; i < r->n; i++) {
            bool dup = !r->b[i].model[0];
            for (int32_t j = 0; j < i && !dup; j++) dup = !strcmp(r->b[j].model, r->b[i].model);
            if (!dup) json_array_append_new(data, json_pack("{s:s, s:s, s:s}", "id", r->b[i].model, "object", "model", "owned_by", "osprey"));
        }
        pthread_mutex_unlock(&r->mu);
        json_t *j = json_pack("{s:s, s:o}", "object", "list", "data", data);
        char *s = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        const enum MHD_Result ret = reply_text(c, 200, "application/json", "%s", s ? s : "{}");
        free(s);
        return ret;
    }
    const bool proxied = !strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions");
    if (post && proxied) return proxy(r, c, url, cx);
    /* a known path with another method: 405 and the methods it takes */
    if (proxied) return reply_error_allow(c, 405, "method not allowed", "POST");
    if (!strcmp(url, "/health") || !strcmp(url, "/metrics") || !strcmp(url, "/v1/models"))
        return reply_error_allow(c, 405, "method not allowed", "GET, HEAD");
    return reply_error(c, 404, "not found");
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    conn_ctx *cx = *con_cls;
    if (cx) free(cx->body);
    free(cx);
    *con_cls = NULL;
}

/* ---- flags and main -------------------------------------------------------------------------- */

static const char *k_usage =
    "usage: osprey router --backends URL,URL,... [options]\n"
    "  --backends LIST        http://host:port of each osprey serve (or vLLM) replica, comma-separated; with\n"
    "                         --prefill-backends: the decode pool (kv_consumer or kv_both servers)\n"
    "  --prefill-backends LIST  prefill/decode disaggregation (vLLM's toy proxy, llm-d's sidecar): the prefill\n"
    "                         pool (kv_producer or kv_both servers, the same model and --prefix-caching-hash-seed).\n"
    "                         Each completion first goes to a prefill backend as a one-token, non-streaming request\n"
    "                         with kv_transfer_params {\"do_remote_decode\": true}; the kv_transfer_params of its\n"
    "                         answer are added to the client's request, which goes to a decode backend (that pulls\n"
    "                         the prompt's KV blocks) and streams back. A prefill answering non-2xx: its answer as\n"
    "                         is; failing mid-request: 502; n or best_of > 1, or several prompts in one\n"
    "                         request, or no healthy prefill backend: straight to the decode pool (it computes the\n"
    "                         prompt itself). Both pools are scored alike (--kv-events is for the decode pool\n"
    "                         only); /health is 200 when some decode backend is healthy; a client's own\n"
    "                         kv_transfer_params are dropped\n"
    "  --prefill-timeout S    a prefill request's whole-exchange limit (300; 0: none): past it, 502\n"
    "  --host HOST            address to listen on (127.0.0.1)\n"
    "  --port N               port (8000; 0 = any free port)\n"
    "  --ssl-keyfile FILE     serve HTTPS with this PEM private key (needs --ssl-certfile; off). Clients only:\n"
    "                         the backends are still reached over http://\n"
    "  --ssl-certfile FILE    the PEM certificate (chain, leaf first) of --ssl-keyfile (off)\n"
    "  --weights LIST         scorer weights, e.g. prefix=3,queue=2,kv=1,active=1 (those)\n"
    "  --hot-queue N          a backend with more waiting requests than N scores no prefix (8; -1: never)\n"
    "  --block-chars N        prompt bytes per chunk of the approximate prefix index (64)\n"
    "  --poll-interval MS     how often each backend's /health and /metrics are read (200)\n"
    "  --kv-events LIST       each backend's KV-event PUB endpoint (tcp://host:port, '-' for none), in\n"
    "                         --backends order: precise prefix scoring from the blocks each one holds (with\n"
    "                         --prefill-backends: the decode pool's; the prefill pool has the approximate index)\n"
    "  --kv-replay LIST       each backend's KV-event replay endpoint ('-' for none), in --backends order:\n"
    "                         batches missed in the stream are asked for there and applied in order\n"
    "  --prefix-caching-hash-algo A, --prefix-caching-hash-seed N, --block-size N\n"
    "                         the backends' block hash (as given to osprey serve; seed also from\n"
    "                         $OSPREY_HASH_SEED / $PYTHONHASHSEED; block size 16)\n"
    "  --log-level debug|info (info; debug logs every routing decision)\n";

static void parse_weights(const char *v, rt_weights *w) {
    char buf[256];
    if (!v || strlen(v) >= sizeof buf) cli_die(OSP_OK, "--weights needs name=value pairs");
    strcpy(buf, v);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        if (!eq) cli_die(OSP_OK, "--weights: '%s' is not name=value", t);
        *eq = 0;
        const double x = cli_float("--weights", eq + 1, 0, 1000);
        if (!strcmp(t, "prefix")) w->prefix = x;
        else if (!strcmp(t, "queue")) w->queue = x;
        else if (!strcmp(t, "kv")) w->kv = x;
        else if (!strcmp(t, "active")) w->active = x;
        else cli_die(OSP_OK, "--weights: unknown scorer '%s' (prefix, queue, kv, active)", t);
    }
}

/* Appends the backends of a comma-separated list (flag names it in errors); one URL in both pools is
 * refused (its metrics would be two series of one name). */
static void add_backends(router *r, const char *flag, const char *v) {
    char list[8192];
    if (strlen(v) >= sizeof list) cli_die(OSP_OK, "%s: the list is too long", flag);
    strcpy(list, v);
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (r->n == RT_MAX_BACKENDS) cli_die(OSP_OK, "%s: at most %d backends in all", flag, RT_MAX_BACKENDS);
        backend *b = &r->b[r->n];
        if (strlen(t) >= sizeof b->url_text || !rt_url_parse(t, &b->url))
            cli_die(OSP_OK, "%s: '%s' is not http://host:port", flag, t);
        for (int32_t j = 0; j < r->n; j++)
            if (!strcmp(r->b[j].url.base, b->url.base))
                cli_die(OSP_OK, "%s: '%s' is given twice%s", flag, t,
                        r->n_decode && j < r->n_decode ? " (one backend in both pools is not supported)" : "");
        snprintf(b->url_text, sizeof b->url_text, "%s", t);
        r->n++;
    }
}

int cmd_router(int argc, char **argv) {
    router *r = calloc(1, sizeof *r);
    if (!r) cli_die(OSP_OK, "out of memory");
    r->w = rt_default_weights();
    r->prefill_timeout_ms = 300000;
    r->block_chars = 64, r->poll_ms = 200, r->connect_timeout_ms = 2000, r->max_body = 16u << 20, r->log_level = 1;
    const char *host = "127.0.0.1", *backends = NULL, *prefill_backends = NULL, *kv_events = NULL, *kv_replay = NULL, *ssl_keyfile = NULL, *ssl_certfile = NULL;
    cli_engine_args hash = cli_engine_args_default();
    r->block_size = 16;
    int port = 8000;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(k_usage, stdout);
            exit(0);
        }
        if (!v) cli_die(OSP_OK, "%s needs a value (see osprey router --help)", f);
        if (!strcmp(f, "--prefix-caching-hash-algo") || !strcmp(f, "--prefix-caching-hash-seed")) {
            cli_engine_arg(&hash, 0, argc, argv, &i); /* the server's parser: one meaning, one message */
            continue;
        }
        if (!strcmp(f, "--backends")) backends = v;
        else if (!strcmp(f, "--prefill-backends")) prefill_backends = v;
        else if (!strcmp(f, "--prefill-timeout")) r->prefill_timeout_ms = (long)(cli_float(f, v, 0, 86400) * 1000);
        else if (!strcmp(f, "--kv-events")) kv_events = v;
        else if (!strcmp(f, "--kv-replay")) kv_replay = v;
        else if (!strcmp(f, "--block-size")) r->block_size = (int32_t)cli_int(f, v, 1, 1024);
        else if (!strcmp(f, "--host")) host = v;
        else if (!strcmp(f, "--port")) port = (int)cli_int(f, v, 0, 65535);
        else if (!strcmp(f, "--ssl-keyfile")) ssl_keyfile = v;
        else if (!strcmp(f, "--ssl-certfile")) ssl_certfile = v;
        else if (!strcmp(f, "--ssl-ca-certs"))
            cli_die(OSP_OK, "--ssl-ca-certs (client certificate verification) is not implemented");
        else if (!strcmp(f, "--weights")) parse_weights(v, &r->w);
        else if (!strcmp(f, "--hot-queue")) r->w.hot_queue = cli_float(f, v, -1, 1e9);
        else if (!strcmp(f, "--block-chars")) r->block_chars = (int)cli_int(f, v, 1, 1 << 20);
        else if (!strcmp(f, "--poll-interval")) r->poll_ms = (int)cli_int(f, v, 10, 600000);
        else if (!strcmp(f, "--log-level")) {
            if (!strcmp(v, "debug")) r->log_level = 0;
            else if (!strcmp(v, "info")) r->log_level = 1;
            else cli_die(OSP_OK, "--log-level: '%s' is not debug or info", v);
        } else cli_die(OSP_OK, "router: unknown option '%s' (see osprey router --help)", f);
        i++;
    }
    if (!backends) cli_die(OSP_OK, "router needs --backends URL,URL,...");
    srv_tls tls; /* checked before anything starts (tools/server/tls.h) */
    char tls_why[768];
    if (srv_tls_load(&tls, ssl_keyfile, ssl_certfile, tls_why, sizeof tls_why)) cli_die(OSP_OK, "%s", tls_why);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) cli_die(OSP_OK, "cannot initialize libcurl");
    add_backends(r, "--backends", backends);
    if (r->n == 0) cli_die(OSP_OK, "--backends: no backend given");
    r->n_decode = r->n;
    if (prefill_backends) {
        add_backends(r, "--prefill-backends", prefill_backends);
        if (r->n == r->n_decode) cli_die(OSP_OK, "--prefill-backends: no backend given");
        r->pd = true;
    }
    if (kv_replay && !kv_events) cli_die(OSP_OK, "--kv-replay needs --kv-events (the streams whose gaps it fills)");
    if (kv_events) {
        cli_engine_env_seed(&hash);
        if (!hash.hash_seed_set)
            cli_die(OSP_OK, "--kv-events needs the backends' hash seed (--prefix-caching-hash-seed N, $OSPREY_HASH_SEED or "
                            "$PYTHONHASHSEED): without one their block hashes are random per process");
        r->hasher = osp_prefix_hasher_make(hash.hash_algo, true, hash.hash_seed);
        static char eps[8192];
        if (strlen(kv_events) >= sizeof eps) cli_die(OSP_OK, "--kv-events: the list is too long");
        strcpy(eps, kv_events);
        const char *ep[RT_MAX_BACKENDS] = {0};
        int32_t m = 0;
        for (char *save = NULL, *t = strtok_r(eps, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (m == r->n_decode) cli_die(OSP_OK, "--kv-events: more endpoints than --backends");
            ep[m++] = strcmp(t, "-") ? t : NULL;
        }
        if (m != r->n_decode) cli_die(OSP_OK, "--kv-events: %d endpoints for %d backends (use '-' for one without)", m, r->n_decode);
        const char *rp[RT_MAX_BACKENDS] = {0};
        if (kv_replay) {
            static char rps[8192];
            if (strlen(kv_replay) >= sizeof rps) cli_die(OSP_OK, "--kv-replay: the list is too long");
            strcpy(rps, kv_replay);
            int32_t k = 0;
            for (char *save = NULL, *t = strtok_r(rps, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (k == r->n_decode) cli_die(OSP_OK, "--kv-replay: more endpoints than --backends");
                rp[k++] = strcmp(t, "-") ? t : NULL;
            }
            if (k != r->n_decode) cli_die(OSP_OK, "--kv-replay: %d endpoints for %d backends (use '-' for one without)", k, r->n_decode);
            for (int32_t b = 0; b < r->n_decode; b++)
                if (rp[b] && !ep[b])
                    cli_die(OSP_OK, "--kv-replay: backend %d has a replay endpoint but no --kv-events endpoint (nothing to "
                                    "fill)", (int)b + 1);
        }
        char why[512];
        if (!(r->kvx = rt_kv_index_start(ep, rp, r->n_decode, why, sizeof why)))
            cli_die(OSP_OK, "%s: %s", strstr(why, "replay endpoint") ? "--kv-replay" : "--kv-events", why);
    }
    r->tab_slots_mask = (1u << 16) - 1;
    r->tab_hash = calloc((size_t)r->tab_slots_mask + 1, sizeof *r->tab_hash);
    r->tab_mask = calloc((size_t)r->tab_slots_mask + 1, sizeof *r->tab_mask);
    if (!r->tab_hash || !r->tab_mask) cli_die(OSP_OK, "out of memory");
    pthread_mutex_init(&r->mu, NULL);

    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    for (int32_t i = 0; i < r->n; i++) poll_backend(r, i); /* a first view before taking requests */
    pthread_t poller;
    if (pthread_create(&poller, NULL, poller_main, r) != 0) cli_die(OSP_OK, "cannot start the poller thread");

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    if (getaddrinfo(host, ps, &hints, &ai) != 0 || !ai) cli_die(OSP_OK, "--host: cannot resolve '%s'", host);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                     srv_tls_daemon_flags(&tls);
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, r, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                            MHD_OPTION_UNESCAPE_CALLBACK, srv_unescape, NULL,
                                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, r, MHD_OPTION_ARRAY,
                                            srv_tls_daemon_options(&tls), MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) cli_die(OSP_OK, "cannot listen on %s:%d (%s)", host, port, strerror(errno));
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    if (r->pd) rlog(r, 1, "P/D: %d prefill backends, %d decode backends", r->n - r->n_decode, r->n_decode);
    rlog(r, 1, "routing to %d backends on %s://%s:%u (weights prefix %g queue %g kv %g active %g, hot queue %g)", r->n,
         srv_tls_scheme(&tls), host, di ? (unsigned)di->port : (unsigned)port, r->w.prefix, r->w.queue, r->w.kv, r->w.active, r->w.hot_queue);
    int sig = 0;
    sigwait(&sigs, &sig);
    rlog(r, 1, "%s: stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    MHD_stop_daemon(d);
    srv_tls_free(&tls);
    atomic_store(&r->stop, true);
    pthread_join(poller, NULL);
    rt_kv_index_stop(r->kvx);
    free(r->tab_hash);
    free(r->tab_mask);
    pthread_mutex_destroy(&r->mu);
    free(r);
    curl_global_cleanup();
    return 0;
}
