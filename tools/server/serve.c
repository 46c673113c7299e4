/* osprey serve: the OpenAI-compatible HTTP server.
 *
 * Threads: libmicrohttpd runs one thread per connection (MHD_USE_THREAD_PER_CONNECTION), so a handler
 * may block while it waits for tokens; the engine runs on its own loop thread (osp_engine_start). A
 * generation request becomes a job with one engine request per choice (n per prompt). The engine's
 * per-request callback (on the loop thread) appends the new token ids to the choice's inbox under the
 * job's mutex and signals; the connection thread drains the inboxes, detokenizes, checks stop strings
 * and writes the JSON reply or the SSE chunks. A job is reference counted (the connection plus every
 * engine request not yet finished), so a client that disconnects (a failed write, or a peek at its
 * socket while waiting) aborts its engine requests and the job is freed by the last finishing callback.
 *
 * Routes: POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize; GET /v1/models, /health,
 * /metrics. Errors are OpenAI's error JSON (request.c). SIGTERM/SIGINT: stop taking requests (503),
 * finish those in flight, exit 0. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "osprey/engine.h"
#include "osprey/model.h"
#include "server.h"

/* ---- server state -------------------------------------------------------------------------- */

enum { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARNING = 2 };

typedef struct srv_config {
    const char *model_path, *host, *api_key, *served_model_name, *chat_template_path;
    int port, n_threads, log_level;
    osp_device device; /* --device cpu|cuda|auto (default auto) */
    int32_t max_model_len, max_num_seqs, max_num_batched_tokens, block_size;
    int64_t kv_cache_memory;
    bool kv_cache_memory_set;     /* given on the command line (else 1 GiB on the CPU, auto on the GPU) */
    float gpu_memory_utilization; /* --gpu-memory-utilization (0: the engine's 0.9) */
    bool prefix_caching;
    size_t max_body;      /* bytes */
    int max_queue;        /* generation requests in flight (running or waiting) */
    int drain_timeout_s;
} srv_config;

typedef struct srv_server {
    srv_config cfg;
    osp_engine *engine;
    osp_tokenizer *tok;
    const char *model_name;
    int32_t max_model_len, n_vocab;
    srv_chat_env chat;
    srv_metrics *metrics;
    pthread_mutex_t mu;
    pthread_cond_t idle;
    int in_flight;            /* generation requests a connection is serving */
    int live_jobs;            /* jobs not yet freed (an aborted one lives until its engine requests end) */
    uint64_t next_id;
    bool draining;
} srv_server;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void slog(const srv_server *s, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void slog(const srv_server *s, int level, const char *fmt, ...) {
    if (level < s->cfg.log_level) return;
    char ts[32];
    const time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(ts, sizeof ts, "%m-%d %H:%M:%S", &tm);
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s %s %s\n", level == LOG_DEBUG ? "DEBUG" : level == LOG_INFO ? "INFO" : "WARNING", ts, line);
}

/* ---- jobs ---------------------------------------------------------------------------------- */

typedef struct srv_job srv_job;

typedef struct srv_seq {
    srv_job *job;
    int32_t index, prompt_idx;
    uint64_t engine_id;
    bool added;               /* osp_engine_add succeeded */
    /* shared with the engine callback (job->mu) */
    int32_t *inbox;
    int32_t n_inbox, cap_inbox;
    osp_token_logprobs *lp_inbox; /* [cap_inbox] when the request asked for logprobs */
    bool eng_finished;
    osp_finish_reason eng_reason;
    /* connection thread only */
    int32_t *work;
    int32_t cap_work;
    osp_token_logprobs *lp_work;  /* [cap_work] */
    json_t *lp;                   /* logprobs of the consumed tokens: chat [{token, logprob, bytes,
                                     top_logprobs}], completions {tokens, token_logprobs, top_logprobs,
                                     text_offset} */
    size_t lp_sent;               /* entries already streamed */
    bool seen_finished;
    srv_text text;
    int32_t n_out;            /* tokens consumed (counted as completion tokens) */
    bool done;
    const char *finish;       /* "stop", "length", "abort", "error" */
    bool final_sent;
} srv_seq;

struct srv_job {
    srv_server *srv;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                 /* the connection + engine requests not yet finished */
    bool changed;             /* new tokens or a finish since the last drain */
    srv_gen_request req;
    char id[48];
    time_t created;
    double t_arrival, t_first;
    int32_t *prompt_lens;     /* [n_prompts] */
    char **echo;              /* [n_prompts] prompt texts when echo */
    int32_t n_seqs;
    srv_seq *seqs;
    struct MHD_Connection *conn;
    bool http_done, client_gone;
    /* SSE */
    char *out;
    size_t out_len, out_off, out_cap;
    bool started, finished_stream;
};

static void job_free(srv_job *j) {
    srv_server *srv = j->srv;
    pthread_mutex_lock(&srv->mu);
    srv->live_jobs--;
    pthread_cond_broadcast(&srv->idle);
    pthread_mutex_unlock(&srv->mu);
    for (int32_t i = 0; i < j->n_seqs; i++) {
        free(j->seqs[i].inbox);
        free(j->seqs[i].work);
        free(j->seqs[i].lp_inbox);
        free(j->seqs[i].lp_work);
        json_decref(j->seqs[i].lp);
        srv_text_free(&j->seqs[i].text);
    }
    if (j->echo)
        for (int32_t i = 0; i < j->req.n_prompts; i++) free(j->echo[i]);
    free(j->echo);
    free(j->prompt_lens);
    free(j->seqs);
    free(j->out);
    srv_gen_request_free(&j->req);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* Engine loop thread: append the new tokens to the choice's inbox. */
static void on_output(void *user, const osp_request_output *o) {
    srv_seq *s = user;
    srv_job *j = s->job;
    srv_server *srv = j->srv;
    const double t = now_s();
    bool free_it = false;
    pthread_mutex_lock(&j->mu);
    if (o->num_tokens > 0) {
        if (s->n_inbox + o->num_tokens > s->cap_inbox) {
            int32_t cap = s->cap_inbox ? s->cap_inbox : 16;
            while (cap < s->n_inbox + o->num_tokens) cap *= 2;
            int32_t *p = realloc(s->inbox, sizeof(int32_t) * (size_t)cap);
            if (p) s->inbox = p;
            osp_token_logprobs *q = j->req.logprobs >= 0 ? realloc(s->lp_inbox, sizeof *q * (size_t)cap) : NULL;
            if (q) s->lp_inbox = q;
            if (p && (q || j->req.logprobs < 0)) s->cap_inbox = cap;
        }
        if (s->n_inbox + o->num_tokens <= s->cap_inbox) {
            memcpy(s->inbox + s->n_inbox, o->token_ids, sizeof(int32_t) * (size_t)o->num_tokens);
            if (s->lp_inbox && o->logprobs)
                memcpy(s->lp_inbox + s->n_inbox, o->logprobs, sizeof *o->logprobs * (size_t)o->num_tokens);
            s->n_inbox += o->num_tokens;
        }
        if (j->t_first == 0) {
            j->t_first = t;
            srv_metrics_observe_ttft(srv->metrics, t - j->t_arrival);
        }
    }
    if (o->finished) {
        s->eng_finished = true;
        s->eng_reason = o->finish_reason;
        free_it = --j->refs == 0;
    }
    j->changed = true;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (free_it) job_free(j);
}

static const char *finish_name(osp_finish_reason r) {
    switch (r) {
    case OSP_FINISH_STOP: return "stop";
    case OSP_FINISH_LENGTH: return "length";
    case OSP_FINISH_ABORT: return "abort";
    default: return "error";
    }
}

/* A token's text for logprobs: its bytes, with bytes that are not valid UTF-8 on their own (a piece of
 * a character split across tokens) written as U+FFFD so the JSON stays valid. */
static json_t *token_str(const osp_tokenizer *tok, int32_t id, json_t **bytes) {
    char raw[512], txt[3 * 512 + 1];
    size_t n = 0, w = 0;
    if (osp_tokenizer_token_bytes(tok, id, raw, sizeof raw, &n) != OSP_OK) n = 0;
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < n; i++) json_array_append_new(*bytes, json_integer((uint8_t)raw[i]));
    }
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)raw[i];
        const size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; k++) ok = ((unsigned char)raw[i + k] >> 6) == 2;
        if (ok) { /* overlong forms and surrogates: jansson's validator decides */
            json_t *probe = json_stringn(raw + i, len);
            ok = probe != NULL;
            json_decref(probe);
        }
        if (ok) {
            memcpy(txt + w, raw + i, len);
            w += len;
            i += len;
        } else {
            memcpy(txt + w, "\xef\xbf\xbd", 3);
            w += 3;
            i++;
        }
    }
    return json_stringn(txt, w);
}

static void add_logprobs(srv_job *j, srv_seq *s, const osp_token_logprobs *lp) {
    const osp_tokenizer *tok = j->srv->tok;
    const bool chat = j->req.route == SRV_ROUTE_CHAT;
    if (!s->lp) {
        s->lp = chat ? json_array()
                     : json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
        if (!s->lp) return;
    }
    const int32_t n_top = lp->n_top < j->req.logprobs ? lp->n_top : j->req.logprobs;
    if (chat) {
        json_t *bytes, *top = json_array();
        json_t *tstr = token_str(tok, lp->token_id, &bytes); /* sets bytes: call it before json_pack */
        json_t *e = json_pack("{s:o, s:f, s:o}", "token", tstr, "logprob", (double)lp->logprob, "bytes", bytes);
        for (int32_t k = 0; k < n_top; k++) {
            json_t *b;
            json_t *t = token_str(tok, lp->top_ids[k], &b);
            json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token", t, "logprob", (double)lp->top_logprobs[k], "bytes", b));
        }
        json_object_set_new(e, "top_logprobs", top);
        json_array_append_new(s->lp, e);
    } else {
        json_array_append_new(json_object_get(s->lp, "tokens"), token_str(tok, lp->token_id, NULL));
        json_array_append_new(json_object_get(s->lp, "token_logprobs"), json_real(lp->logprob));
        json_t *top = json_object();
        for (int32_t k = 0; k < n_top; k++) {
            json_t *t = token_str(tok, lp->top_ids[k], NULL);
            if (t) json_object_set_new(top, json_string_value(t), json_real(lp->top_logprobs[k]));
            json_decref(t);
        }
        json_array_append_new(json_object_get(s->lp, "top_logprobs"), top);
        const size_t echo = j->echo ? strlen(j->echo[s->prompt_idx]) : 0;
        json_array_append_new(json_object_get(s->lp, "text_offset"), json_integer((json_int_t)(echo + s->text.len)));
    }
}

/* The logprobs entries [from, end) of a choice, in the route's format (NULL when none were asked). */
static json_t *logprobs_slice(const srv_job *j, const srv_seq *s, size_t from) {
    if (j->req.logprobs < 0) return NULL;
    const bool chat = j->req.route == SRV_ROUTE_CHAT;
    if (chat) {
        json_t *c = json_array();
        for (size_t i = from; s->lp && i < json_array_size(s->lp); i++) json_array_append(c, json_array_get(s->lp, i));
        return json_pack("{s:o}", "content", c);
    }
    static const char *const keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
    json_t *o = json_object();
    for (int k = 0; k < 4; k++) {
        json_t *a = json_array(), *src = s->lp ? json_object_get(s->lp, keys[k]) : NULL;
        for (size_t i = from; src && i < json_array_size(src); i++) json_array_append(a, json_array_get(src, i));
        json_object_set_new(o, keys[k], a);
    }
    return o;
}

static size_t logprobs_count(const srv_job *j, const srv_seq *s) {
    if (!s->lp) return 0;
    return j->req.route == SRV_ROUTE_CHAT ? json_array_size(s->lp) : json_array_size(json_object_get(s->lp, "tokens"));
}

/* Connection thread: waits up to timeout_ms for news, then turns new tokens into text. Returns true
 * when something changed. */
static bool job_pump(srv_job *j, int timeout_ms) {
    srv_server *srv = j->srv;
    pthread_mutex_lock(&j->mu);
    if (!j->changed && timeout_ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        ts.tv_sec += timeout_ms / 1000 + ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        while (!j->changed)
            if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT) break;
    }
    const bool changed = j->changed;
    j->changed = false;
    int32_t counts[SRV_MAX_N];
    for (int32_t i = 0; i < j->n_seqs; i++) {
        srv_seq *s = &j->seqs[i];
        counts[i] = 0;
        if (s->n_inbox > s->cap_work) {
            int32_t *p = realloc(s->work, sizeof(int32_t) * (size_t)s->cap_inbox);
            if (p) s->work = p;
            osp_token_logprobs *q = s->lp_inbox ? realloc(s->lp_work, sizeof *q * (size_t)s->cap_inbox) : NULL;
            if (q) s->lp_work = q;
            if (p && (q || !s->lp_inbox)) s->cap_work = s->cap_inbox;
        }
        if (s->n_inbox <= s->cap_work && s->n_inbox > 0) {
            memcpy(s->work, s->inbox, sizeof(int32_t) * (size_t)s->n_inbox);
            if (s->lp_inbox) memcpy(s->lp_work, s->lp_inbox, sizeof *s->lp_work * (size_t)s->n_inbox);
            counts[i] = s->n_inbox;
            s->n_inbox = 0;
        }
        s->seen_finished = s->eng_finished && s->n_inbox == 0;
    }
    pthread_mutex_unlock(&j->mu);
    if (!changed) return false;

    for (int32_t i = 0; i < j->n_seqs; i++) {
        srv_seq *s = &j->seqs[i];
        if (s->done) continue;
        for (int32_t k = 0; k < counts[i] && !s->done; k++) {
            s->n_out++;
            if (s->lp_work) add_logprobs(j, s, &s->lp_work[k]);
            /* the token that ended the sequence (EOS or a stop id) gives no text, as in vLLM */
            const bool stop_tok = s->seen_finished && s->eng_reason == OSP_FINISH_STOP && k == counts[i] - 1;
            if (stop_tok && !j->req.include_stop_str_in_output) continue;
            const int rc = srv_text_push(&s->text, s->work[k]);
            if (rc == 1) {
                s->done = true;
                s->finish = "stop";
                if (!s->seen_finished) osp_engine_abort(srv->engine, s->engine_id);
            }
        }
        if (!s->done && s->seen_finished) {
            srv_text_finish(&s->text);
            s->done = true;
            s->finish = finish_name(s->eng_reason);
        }
    }
    return true;
}

static bool job_all_done(const srv_job *j) {
    for (int32_t i = 0; i < j->n_seqs; i++)
        if (!j->seqs[i].done) return false;
    return true;
}

/* Is the client still there? A peek that reads 0 bytes means it closed its end. */
static bool client_alive(srv_job *j) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(j->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return true;
    char c;
    const ssize_t n = recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    return true;
}

/* The connection is done with the job (reply sent, or client gone): abort what still runs, log the
 * request, drop the connection's reference. */
static void job_http_done(srv_job *j) {
    srv_server *srv = j->srv;
    if (j->http_done) return;
    j->http_done = true;
    const double t = now_s();
    int64_t n_prompt = 0, n_out = 0;
    for (int32_t i = 0; i < j->req.n_prompts; i++) n_prompt += j->prompt_lens ? j->prompt_lens[i] : 0;
    const char *finish = j->n_seqs ? (j->seqs[0].finish ? j->seqs[0].finish : "abort") : "error";
    for (int32_t i = 0; i < j->n_seqs; i++) {
        srv_seq *s = &j->seqs[i];
        n_out += s->n_out;
        if (s->added && !s->done) osp_engine_abort(srv->engine, s->engine_id);
    }
    if (j->client_gone) finish = "abort";
    srv_metrics_request_done(srv->metrics, finish, n_prompt, n_out);
    srv_metrics_observe_e2e(srv->metrics, t - j->t_arrival);
    if (n_out > 1 && j->t_first > 0) srv_metrics_observe_itl(srv->metrics, (t - j->t_first) / (double)(n_out - 1), n_out - 1);
    slog(srv, LOG_INFO, "request %s: %lld prompt tokens, %lld output tokens (%d choice%s), ttft %.1f ms, total %.1f ms, finish %s%s",
         j->id, (long long)n_prompt, (long long)n_out, j->n_seqs, j->n_seqs == 1 ? "" : "s",
         j->t_first > 0 ? (j->t_first - j->t_arrival) * 1e3 : 0.0, (t - j->t_arrival) * 1e3, finish,
         j->client_gone ? " (client disconnected)" : "");
    pthread_mutex_lock(&srv->mu);
    srv->in_flight--;
    pthread_cond_broadcast(&srv->idle);
    pthread_mutex_unlock(&srv->mu);
    pthread_mutex_lock(&j->mu);
    const bool free_it = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (free_it) job_free(j);
}

/* ---- HTTP helpers -------------------------------------------------------------------------- */

typedef struct conn_ctx {
    char *body;
    size_t len, cap;
    bool too_large;
} conn_ctx;

static enum MHD_Result reply(struct MHD_Connection *c, int status, const char *type, char *body) {
    if (!body) {
        status = 500;
        body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}");
        type = "application/json";
        if (!body) return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    const enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result reply_json(struct MHD_Connection *c, int status, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return reply(c, status, "application/json", s);
}

static enum MHD_Result reply_error(struct MHD_Connection *c, const srv_error *e) {
    return reply(c, e->status, "application/json", srv_error_json(e));
}

static enum MHD_Result reply_err(struct MHD_Connection *c, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static enum MHD_Result reply_err(struct MHD_Connection *c, int status, const char *param, const char *fmt, ...) {
    srv_error e = {.status = status};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    snprintf(e.param, sizeof e.param, "%s", param ? param : "");
    return reply_error(c, &e);
}

/* ---- generation ---------------------------------------------------------------------------- */

static uint64_t salt_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h ? h : 1;
}

/* Tokenizes the prompts (or renders and tokenizes the chat) and fills j->prompt ids. */
static int build_prompts(srv_server *srv, srv_gen_request *r, srv_error *err) {
    if (r->route == SRV_ROUTE_CHAT) {
        char *text;
        if (srv_chat_render(&srv->chat, r, &text, err)) return -1;
        r->prompts = calloc(1, sizeof(srv_prompt));
        if (!r->prompts) {
            free(text);
            return srv_fail(err, 500, NULL, "out of memory");
        }
        r->prompts[0].text = text;
        r->n_prompts = 1;
    }
    for (int32_t i = 0; i < r->n_prompts; i++) {
        srv_prompt *p = &r->prompts[i];
        if (p->ids) continue;
        int32_t *ids;
        size_t n;
        /* a chat prompt already holds its special tokens; a completion prompt gets BOS as usual */
        if (osp_tokenizer_encode(srv->tok, p->text, strlen(p->text), r->route == SRV_ROUTE_COMPLETIONS, true, &ids, &n) != OSP_OK)
            return srv_fail(err, 500, NULL, "tokenization failed: %s", osp_last_error());
        p->ids = ids;
        p->n_ids = (int32_t)n;
        if (n == 0) return srv_fail(err, 400, "prompt", "the prompt is empty after tokenization");
    }
    return 0;
}

static char *detok_all(srv_server *srv, const int32_t *ids, int32_t n) {
    srv_text t;
    char *none[1] = {NULL};
    if (srv_text_init(&t, srv->tok, false, none, 0, false)) {
        srv_text_free(&t);
        return NULL;
    }
    for (int32_t i = 0; i < n; i++) srv_text_push(&t, ids[i]);
    srv_text_finish(&t);
    char *s = strdup(t.buf ? t.buf : "");
    srv_text_free(&t);
    return s;
}

/* Creates the job and queues its engine requests. On error nothing runs and *err is set. */
static srv_job *job_start(srv_server *srv, srv_gen_request *r, struct MHD_Connection *conn, srv_error *err) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j) {
        srv_fail(err, 500, NULL, "out of memory");
        return NULL;
    }
    j->srv = srv;
    pthread_mutex_lock(&srv->mu);
    srv->live_jobs++;
    pthread_mutex_unlock(&srv->mu);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->req = *r;
    memset(r, 0, sizeof *r);
    r = &j->req;
    j->conn = conn;
    j->t_arrival = now_s();
    j->created = time(NULL);
    j->refs = 1;
    pthread_mutex_lock(&srv->mu);
    const uint64_t first_id = srv->next_id;
    srv->next_id += (uint64_t)r->n * (uint64_t)r->n_prompts + 1;
    pthread_mutex_unlock(&srv->mu);
    snprintf(j->id, sizeof j->id, "%s-%016llx%04x", r->route == SRV_ROUTE_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)first_id * 0x9E3779B97F4A7C15ull, (unsigned)(first_id & 0xffff));

    j->prompt_lens = calloc((size_t)r->n_prompts, sizeof(int32_t));
    j->n_seqs = r->n * r->n_prompts;
    j->seqs = calloc((size_t)j->n_seqs, sizeof(srv_seq));
    if (!j->prompt_lens || !j->seqs) {
        srv_fail(err, 500, NULL, "out of memory");
        goto fail;
    }
    for (int32_t p = 0; p < r->n_prompts; p++) {
        const int32_t np = r->prompts[p].n_ids;
        j->prompt_lens[p] = np;
        const int32_t max_tokens = r->max_tokens > 0 ? r->max_tokens
                                   : r->route == SRV_ROUTE_COMPLETIONS ? 16
                                                                       : srv->max_model_len - np;
        if (np >= srv->max_model_len || (int64_t)np + max_tokens > srv->max_model_len) {
            srv_fail(err, 400, r->route == SRV_ROUTE_CHAT ? "messages" : "prompt",
                     "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in the %s, %d in the completion). Please reduce the length of the %s or completion.",
                     srv->max_model_len, (long long)np + (max_tokens > 0 ? max_tokens : 0), np,
                     r->route == SRV_ROUTE_CHAT ? "messages" : "prompt", max_tokens > 0 ? max_tokens : 0,
                     r->route == SRV_ROUTE_CHAT ? "messages" : "prompt");
            goto fail;
        }
        if (r->min_tokens > max_tokens) {
            srv_fail(err, 400, "min_tokens", "'min_tokens' (%d) exceeds the tokens left for the completion (%d)", r->min_tokens,
                     max_tokens);
            goto fail;
        }
    }
    if (r->echo && r->route == SRV_ROUTE_COMPLETIONS) {
        j->echo = calloc((size_t)r->n_prompts, sizeof(char *));
        if (!j->echo) goto oom;
        for (int32_t p = 0; p < r->n_prompts; p++) {
            j->echo[p] = r->prompts[p].text && r->prompts[p].text[0] ? strdup(r->prompts[p].text)
                                                                      : detok_all(srv, r->prompts[p].ids, r->prompts[p].n_ids);
            if (!j->echo[p]) goto oom;
        }
    }
    for (int32_t i = 0; i < j->n_seqs; i++) {
        srv_seq *s = &j->seqs[i];
        s->job = j;
        s->index = i;
        s->prompt_idx = i / r->n;
        s->engine_id = first_id + (uint64_t)i;
        if (srv_text_init(&s->text, srv->tok, r->skip_special_tokens, r->stop, r->n_stop, r->include_stop_str_in_output))
            goto oom;
    }
    osp_token_bias bias[1024];
    for (int32_t b = 0; b < r->n_bias && b < 1024; b++) bias[b] = (osp_token_bias){r->bias_ids[b], r->bias_values[b]};
    /* queue the engine requests; the callbacks may start as soon as the first add returns */
    for (int32_t i = 0; i < j->n_seqs; i++) {
        srv_seq *s = &j->seqs[i];
        const srv_prompt *p = &r->prompts[s->prompt_idx];
        osp_request_params rp = osp_request_default_params();
        rp.request_id = s->engine_id;
        rp.prompt = p->ids;
        rp.num_prompt = p->n_ids;
        rp.temperature = r->temperature;
        rp.top_k = r->top_k;
        rp.top_p = r->top_p;
        rp.min_p = r->min_p;
        rp.presence_penalty = r->presence_penalty;
        rp.frequency_penalty = r->frequency_penalty;
        rp.repetition_penalty = r->repetition_penalty;
        rp.logit_bias = bias;
        rp.num_logit_bias = r->n_bias;
        /* choice k of a prompt is the engine's child k: (seed, sample_index k), so a seeded request
           gives the same choices as the engine's own n would */
        rp.has_seed = r->seed_set;
        rp.seed = r->seed;
        rp.sample_index = (uint32_t)(i % r->n);
        rp.logprobs = r->logprobs;
        rp.max_tokens = r->max_tokens > 0 ? r->max_tokens : r->route == SRV_ROUTE_COMPLETIONS ? 16 : 0;
        rp.min_tokens = r->min_tokens;
        rp.ignore_eos = r->ignore_eos;
        rp.stop_token_ids = r->stop_token_ids;
        rp.num_stop_token_ids = r->n_stop_token_ids;
        rp.cache_salt = r->cache_salt ? salt_hash(r->cache_salt) : 0;
        rp.callback = on_output;
        rp.callback_user = s;
        pthread_mutex_lock(&j->mu);
        j->refs++;
        pthread_mutex_unlock(&j->mu);
        if (osp_engine_add(srv->engine, &rp) != OSP_OK) {
            srv_fail(err, 400, NULL, "%s", osp_last_error());
            pthread_mutex_lock(&j->mu);
            j->refs--;
            pthread_mutex_unlock(&j->mu);
            for (int32_t k = 0; k < i; k++) osp_engine_abort(srv->engine, j->seqs[k].engine_id);
            for (int32_t k = i; k < j->n_seqs; k++) j->seqs[k].done = true, j->seqs[k].finish = "error";
            goto fail_started;
        }
        s->added = true;
    }
    pthread_mutex_lock(&srv->mu);
    srv->in_flight++;
    pthread_mutex_unlock(&srv->mu);
    return j;
oom:
    srv_fail(err, 500, NULL, "out of memory");
fail:
    job_free(j);
    return NULL;
fail_started: /* the added requests hold references; the last finishing callback frees the job */
    j->http_done = true;
    pthread_mutex_lock(&j->mu);
    const bool free_it = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (free_it) job_free(j);
    return NULL;
}

static json_t *usage_json(const srv_job *j) {
    int64_t np = 0, nc = 0;
    for (int32_t i = 0; i < j->req.n_prompts; i++) np += j->prompt_lens[i];
    for (int32_t i = 0; i < j->n_seqs; i++) nc += j->seqs[i].n_out;
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)np, "completion_tokens", (json_int_t)nc,
                     "total_tokens", (json_int_t)(np + nc));
}

static json_t *final_json(srv_job *j) {
    const bool chat = j->req.route == SRV_ROUTE_CHAT;
    json_t *choices = json_array();
    for (int32_t i = 0; i < j->n_seqs; i++) {
        srv_seq *s = &j->seqs[i];
        const char *text = s->text.buf ? s->text.buf : "";
        json_t *c;
        if (chat) {
            json_t *lp = logprobs_slice(j, s, 0);
            c = json_pack("{s:i, s:{s:s, s:s%}, s:o, s:s}", "index", i, "message", "role", "assistant", "content", text,
                          s->text.len, "logprobs", lp ? lp : json_null(), "finish_reason", s->finish ? s->finish : "abort");
        } else {
            json_t *t;
            if (j->echo) {
                const size_t el = strlen(j->echo[s->prompt_idx]);
                char *both = malloc(el + s->text.len + 1);
                if (both) {
                    memcpy(both, j->echo[s->prompt_idx], el);
                    memcpy(both + el, text, s->text.len);
                    both[el + s->text.len] = 0;
                }
                t = both ? json_stringn(both, el + s->text.len) : NULL;
                free(both);
            } else {
                t = json_stringn(text, s->text.len);
            }
            json_t *lp = logprobs_slice(j, s, 0);
            c = json_pack("{s:i, s:o, s:o, s:s}", "index", i, "text", t, "logprobs", lp ? lp : json_null(), "finish_reason",
                          s->finish ? s->finish : "abort");
        }
        json_array_append_new(choices, c);
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", j->id, "object", chat ? "chat.completion" : "text_completion",
                     "created", (json_int_t)j->created, "model", j->srv->model_name, "choices", choices, "usage",
                     usage_json(j));
}

/* ---- SSE ----------------------------------------------------------------------------------- */

static void out_put(srv_job *j, const char *s, size_t n) {
    if (j->out_len + n > j->out_cap) {
        size_t cap = j->out_cap ? j->out_cap : 4096;
        while (cap < j->out_len + n) cap *= 2;
        char *p = realloc(j->out, cap);
        if (!p) return;
        j->out = p;
        j->out_cap = cap;
    }
    memcpy(j->out + j->out_len, s, n);
    j->out_len += n;
}

static void out_event(srv_job *j, json_t *chunk) {
    if (!chunk) return;
    char *s = json_dumps(chunk, JSON_COMPACT);
    json_decref(chunk);
    if (!s) return;
    out_put(j, "data: ", 6);
    out_put(j, s, strlen(s));
    out_put(j, "\n\n", 2);
    free(s);
}

/* A chunk for choice i: text piece (or NULL) and finish reason (or NULL). */
static json_t *chunk_json(srv_job *j, int32_t i, const char *text, size_t len, const char *finish, bool role) {
    const bool chat = j->req.route == SRV_ROUTE_CHAT;
    srv_seq *s = &j->seqs[i];
    json_t *choice, *lp = NULL;
    if (!role && j->req.logprobs >= 0) { /* the logprobs of the tokens consumed since the last chunk */
        const size_t n = logprobs_count(j, s);
        if (n > s->lp_sent) lp = logprobs_slice(j, s, s->lp_sent);
        s->lp_sent = n;
    }
    if (chat) {
        json_t *delta = json_object();
        if (role) json_object_set_new(delta, "role", json_string("assistant"));
        if (text) json_object_set_new(delta, "content", json_stringn(text, len));
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", i, "delta", delta, "logprobs", lp ? lp : json_null(),
                           "finish_reason", finish ? json_string(finish) : json_null());
    } else {
        choice = json_pack("{s:i, s:s%, s:o, s:o}", "index", i, "text", text ? text : "", text ? len : 0, "logprobs",
                           lp ? lp : json_null(), "finish_reason", finish ? json_string(finish) : json_null());
    }
    json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", j->id, "object",
                          chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)j->created, "model",
                          j->srv->model_name, "choices", choice);
    if (c && j->req.include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

/* Turns what the pump produced into SSE events in j->out. */
static void stream_fill(srv_job *j) {
    if (!j->started) {
        j->started = true;
        for (int32_t i = 0; i < j->n_seqs; i++) {
            if (j->req.route == SRV_ROUTE_CHAT) out_event(j, chunk_json(j, i, "", 0, NULL, true));
            else if (j->echo) out_event(j, chunk_json(j, i, j->echo[j->seqs[i].prompt_idx], strlen(j->echo[j->seqs[i].prompt_idx]), NULL, false));
        }
    }
    bool all_final = true;
    for (int32_t i = 0; i < j->n_seqs; i++) {
        srv_seq *s = &j->seqs[i];
        const size_t ready = srv_text_ready(&s->text);
        if (ready > s->text.sent) {
            out_event(j, chunk_json(j, i, s->text.buf + s->text.sent, ready - s->text.sent, NULL, false));
            s->text.sent = ready;
        }
        if (s->done && !s->final_sent && s->text.sent == s->text.len) {
            out_event(j, chunk_json(j, i, j->req.route == SRV_ROUTE_CHAT ? NULL : "", 0, s->finish, false));
            s->final_sent = true;
        }
        all_final &= s->final_sent;
    }
    if (all_final && !j->finished_stream) {
        if (j->req.include_usage) {
            json_t *u = json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", j->id, "object",
                                  j->req.route == SRV_ROUTE_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                                  (json_int_t)j->created, "model", j->srv->model_name, "choices", "usage", usage_json(j));
            out_event(j, u);
        }
        out_put(j, "data: [DONE]\n\n", 14);
        j->finished_stream = true;
    }
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    srv_job *j = cls;
    for (;;) {
        if (j->out_off < j->out_len) {
            size_t n = j->out_len - j->out_off;
            if (n > max) n = max;
            memcpy(buf, j->out + j->out_off, n);
            j->out_off += n;
            return (ssize_t)n;
        }
        j->out_len = j->out_off = 0;
        if (j->finished_stream) return MHD_CONTENT_READER_END_OF_STREAM;
        const bool progress = job_pump(j, 100);
        stream_fill(j);
        if (j->out_len == 0 && !progress && !client_alive(j)) {
            j->client_gone = true;
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void sse_free(void *cls) {
    srv_job *j = cls;
    if (!j->finished_stream) j->client_gone = true;
    job_http_done(j);
}

/* ---- routes -------------------------------------------------------------------------------- */

static enum MHD_Result handle_generate(srv_server *srv, struct MHD_Connection *c, srv_route route, conn_ctx *cx) {
    srv_error err = {0};
    srv_gen_request req;
    const srv_parse_limits lim = {.n_vocab = srv->n_vocab};
    if (srv_parse_gen_request(cx->body ? cx->body : "", cx->len, route, &lim, &req, &err)) {
        srv_gen_request_free(&req);
        slog(srv, LOG_DEBUG, "rejected request: %d %s", err.status, err.message);
        return reply_error(c, &err);
    }
    if (req.model && strcmp(req.model, srv->model_name)) {
        srv_fail(&err, 404, "model", "The model `%.200s` does not exist.", req.model);
        srv_gen_request_free(&req);
        return reply_error(c, &err);
    }
    if (req.n_unknown > 0 && srv->cfg.log_level <= LOG_DEBUG) {
        char names[512] = "";
        for (int32_t i = 0; i < req.n_unknown; i++) {
            strncat(names, i ? ", " : "", sizeof names - strlen(names) - 1);
            strncat(names, req.unknown[i], sizeof names - strlen(names) - 1);
        }
        slog(srv, LOG_DEBUG, "ignored unknown request fields: %s", names);
    }
    pthread_mutex_lock(&srv->mu);
    const bool draining = srv->draining, full = srv->in_flight >= srv->cfg.max_queue;
    pthread_mutex_unlock(&srv->mu);
    if (draining || full) {
        srv_gen_request_free(&req);
        return reply_err(c, 503, NULL, draining ? "the server is shutting down" : "the server is busy (%d requests in flight); retry later",
                         srv->cfg.max_queue);
    }
    if (build_prompts(srv, &req, &err)) {
        srv_gen_request_free(&req);
        return reply_error(c, &err);
    }
    srv_job *j = job_start(srv, &req, c, &err);
    srv_gen_request_free(&req);
    if (!j) return reply_error(c, &err);

    if (j->req.stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_reader, j, sse_free);
        if (!r) {
            job_http_done(j);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        const enum MHD_Result ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return ret;
    }
    while (!job_all_done(j)) {
        if (!job_pump(j, 100) && !client_alive(j)) {
            j->client_gone = true;
            job_http_done(j);
            return MHD_NO;
        }
    }
    json_t *body = final_json(j);
    job_http_done(j);
    return reply_json(c, 200, body);
}

static enum MHD_Result handle_tokenize(srv_server *srv, struct MHD_Connection *c, conn_ctx *cx) {
    json_error_t je;
    json_t *root = json_loadb(cx->body ? cx->body : "", cx->len, 0, &je);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return reply_err(c, 400, NULL, "malformed JSON: %s", root ? "the body must be an object" : je.text);
    }
    srv_error err = {0};
    char *text = NULL;
    bool add_special = true;
    const json_t *model = json_object_get(root, "model");
    if (json_is_string(model) && strcmp(json_string_value(model), srv->model_name)) {
        srv_fail(&err, 404, "model", "The model `%.200s` does not exist.", json_string_value(model));
        goto fail;
    }
    if (json_object_get(root, "messages")) {
        srv_gen_request r;
        const srv_parse_limits lim = {.n_vocab = srv->n_vocab};
        add_special = false;
        if (srv_get_bool(root, "add_special_tokens", &add_special, &err)) goto fail;
        if (srv_parse_gen_request(cx->body, cx->len, SRV_ROUTE_CHAT, &lim, &r, &err) || srv_chat_render(&srv->chat, &r, &text, &err)) {
            srv_gen_request_free(&r);
            goto fail;
        }
        srv_gen_request_free(&r);
    } else {
        const json_t *p = json_object_get(root, "prompt");
        if (!json_is_string(p)) {
            srv_fail(&err, 400, "prompt", "'prompt' (a string) or 'messages' is required");
            goto fail;
        }
        if (srv_get_bool(root, "add_special_tokens", &add_special, &err)) goto fail;
        text = strdup(json_string_value(p));
    }
    int32_t *ids = NULL;
    size_t n = 0;
    if (!text || osp_tokenizer_encode(srv->tok, text, strlen(text), add_special, true, &ids, &n) != OSP_OK) {
        srv_fail(&err, 500, NULL, "tokenization failed");
        goto fail;
    }
    json_t *toks = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(toks, json_integer(ids[i]));
    free(ids);
    free(text);
    json_decref(root);
    return reply_json(c, 200, json_pack("{s:I, s:i, s:o, s:n}", "count", (json_int_t)n, "max_model_len", srv->max_model_len,
                                        "tokens", toks, "token_strs"));
fail:
    free(text);
    json_decref(root);
    return reply_error(c, &err);
}

static enum MHD_Result handle_detokenize(srv_server *srv, struct MHD_Connection *c, conn_ctx *cx) {
    json_error_t je;
    json_t *root = json_loadb(cx->body ? cx->body : "", cx->len, 0, &je);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return reply_err(c, 400, NULL, "malformed JSON: %s", root ? "the body must be an object" : je.text);
    }
    const json_t *t = json_object_get(root, "tokens");
    const json_t *model = json_object_get(root, "model");
    if (json_is_string(model) && strcmp(json_string_value(model), srv->model_name)) {
        json_decref(root);
        return reply_err(c, 404, "model", "The model `%.200s` does not exist.", json_string_value(model));
    }
    if (!json_is_array(t)) {
        json_decref(root);
        return reply_err(c, 400, "tokens", "'tokens' must be a list of token ids");
    }
    const size_t n = json_array_size(t);
    int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));
    for (size_t i = 0; ids && i < n; i++) {
        const json_t *x = json_array_get(t, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= srv->n_vocab) {
            free(ids);
            json_decref(root);
            return reply_err(c, 400, "tokens", "tokens[%zu] is not a token id in [0, %d)", i, srv->n_vocab);
        }
        ids[i] = (int32_t)json_integer_value(x);
    }
    json_decref(root);
    char *s = ids ? detok_all(srv, ids, (int32_t)n) : NULL;
    free(ids);
    json_t *body = s ? json_pack("{s:s}", "prompt", s) : NULL;
    free(s);
    return reply_json(c, 200, body);
}

static srv_metrics_gauges gauges(srv_server *srv) {
    const osp_engine_stats st = osp_engine_get_stats(srv->engine);
    srv_metrics_gauges g = {.num_running = st.num_running, .num_waiting = st.num_waiting, .num_blocks = st.num_blocks,
                            .num_free_blocks = st.num_free_blocks, .prefix_queries = st.prefix_queries_tokens,
                            .prefix_hits = st.prefix_hits_tokens, .num_preemptions = st.num_preemptions};
    pthread_mutex_lock(&srv->mu);
    g.in_flight = srv->in_flight;
    pthread_mutex_unlock(&srv->mu);
    return g;
}

static bool authorized(srv_server *srv, struct MHD_Connection *c) {
    if (!srv->cfg.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return false;
    return !strcmp(h + 7, srv->cfg.api_key);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    srv_server *srv = cls;
    conn_ctx *cx = *con_cls;
    if (!cx) {
        cx = calloc(1, sizeof *cx);
        if (!cx) return MHD_NO;
        *con_cls = cx;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > srv->cfg.max_body) {
            cx->too_large = true;
            return reply_err(c, 413, NULL, "the request body is larger than %zu bytes", srv->cfg.max_body);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cx->too_large && cx->len + *upload_size > srv->cfg.max_body) {
            cx->too_large = true;
            free(cx->body);
            cx->body = NULL;
            cx->len = cx->cap = 0;
        }
        if (!cx->too_large) {
            if (cx->len + *upload_size + 1 > cx->cap) {
                size_t cap = cx->cap ? cx->cap : 4096;
                while (cap < cx->len + *upload_size + 1) cap *= 2;
                char *p = realloc(cx->body, cap);
                if (!p) return MHD_NO;
                cx->body = p;
                cx->cap = cap;
            }
            memcpy(cx->body + cx->len, upload_data, *upload_size);
            cx->len += *upload_size;
            cx->body[cx->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cx->too_large) return reply_err(c, 413, NULL, "the request body is larger than %zu bytes", srv->cfg.max_body);

    const bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strncmp(url, "/v1/", 4) && !authorized(srv, c)) return reply_err(c, 401, NULL, "invalid or missing API key");
    if (!strcmp(url, "/health")) {
        if (!get) return reply_err(c, 405, NULL, "method %s not allowed on %s", method, url);
        const srv_metrics_gauges g = gauges(srv);
        pthread_mutex_lock(&srv->mu);
        const bool draining = srv->draining;
        pthread_mutex_unlock(&srv->mu);
        return reply_json(c, draining ? 503 : 200,
                          json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "status", draining ? "draining" : "ok",
                                    "kv_cache_free_blocks", g.num_free_blocks, "kv_cache_total_blocks", g.num_blocks,
                                    "num_requests_running", g.num_running, "num_requests_waiting", g.num_waiting,
                                    "requests_in_flight", g.in_flight));
    }
    if (!strcmp(url, "/metrics")) {
        if (!get) return reply_err(c, 405, NULL, "method %s not allowed on %s", method, url);
        const srv_metrics_gauges g = gauges(srv);
        return reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", srv_metrics_render(srv->metrics, srv->model_name, &g));
    }
    if (!strcmp(url, "/v1/models")) {
        if (!get) return reply_err(c, 405, NULL, "method %s not allowed on %s", method, url);
        return reply_json(c, 200, json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:s, s:i}]}", "object", "list", "data", "id",
                                            srv->model_name, "object", "model", "created", (json_int_t)time(NULL), "owned_by",
                                            "osprey", "root", srv->cfg.model_path, "max_model_len", srv->max_model_len));
    }
    struct {
        const char *path;
        int kind;
    } const routes[] = {{"/v1/completions", 0}, {"/v1/chat/completions", 1}, {"/tokenize", 2}, {"/detokenize", 3}};
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
        if (strcmp(url, routes[i].path)) continue;
        if (!post) return reply_err(c, 405, NULL, "method %s not allowed on %s", method, url);
        switch (routes[i].kind) {
        case 0: return handle_generate(srv, c, SRV_ROUTE_COMPLETIONS, cx);
        case 1: return handle_generate(srv, c, SRV_ROUTE_CHAT, cx);
        case 2: return handle_tokenize(srv, c, cx);
        default: return handle_detokenize(srv, c, cx);
        }
    }
    return reply_err(c, 404, NULL, "no route %s %.200s", method, url);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    conn_ctx *cx = *con_cls;
    if (cx) {
        free(cx->body);
        free(cx);
        *con_cls = NULL;
    }
}

/* ---- flags and main ------------------------------------------------------------------------ */

static const char *k_serve_usage =
    "usage: osprey serve -m FILE [options]\n"
    "  -m, --model FILE                 GGUF model\n"
    "  --host HOST                      address to listen on (127.0.0.1)\n"
    "  --port N                         port (8000; 0 = any free port)\n"
    "  --api-key KEY                    require 'Authorization: Bearer KEY' on /v1/*\n"
    "  --served-model-name NAME         the model's name in the API (the file name)\n"
    "  --max-model-len N                prompt + output tokens (the model's context length)\n"
    "  --max-num-seqs N                 running sequences per step (64)\n"
    "  --max-num-batched-tokens N       token budget per step (2048)\n"
    "  --block-size N                   tokens per KV block (16)\n"
    "  --kv-cache-memory BYTES          KV cache size, K/M/G suffixes (CPU: 1G; GPU: what\n"
    "                                   --gpu-memory-utilization leaves)\n"
    "  --gpu-memory-utilization F       share of GPU memory for weights + KV cache + activations (0.9)\n"
    "  --enable-prefix-caching / --no-enable-prefix-caching   (on)\n"
    "  --chat-template FILE             Jinja chat template instead of the model's\n"
    "  -t, --threads N                  compute threads (all cores)\n"
    "  --device cpu|cuda|auto           where the model runs (auto: cuda when a GPU is present)\n"
    "  --max-request-body BYTES         request body limit, K/M suffixes (4M)\n"
    "  --max-queued-requests N          generation requests in flight before 503 (1024)\n"
    "  --drain-timeout S                on SIGTERM, wait this long for requests in flight (60)\n"
    "  --log-level debug|info|warning   (info)\n";

static long long parse_bytes(const char *flag, const char *v) {
    if (!v) cli_die(OSP_OK, "%s needs a value", flag);
    char *end;
    errno = 0;
    const double x = strtod(v, &end);
    double mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1024.0, end++;
    else if (*end == 'm' || *end == 'M') mul = 1024.0 * 1024, end++;
    else if (*end == 'g' || *end == 'G') mul = 1024.0 * 1024 * 1024, end++;
    if (*end == 'i' || *end == 'B' || *end == 'b') end++;
    if (errno || end == v || *end || !(x >= 0) || x * mul > 9e18) cli_die(OSP_OK, "%s: '%s' is not a byte count", flag, v);
    return (long long)(x * mul);
}

static srv_config parse_flags(int argc, char **argv) {
    srv_config c = {.host = "127.0.0.1", .port = 8000, .log_level = LOG_INFO, .max_num_seqs = 64,
                    .max_num_batched_tokens = 2048, .block_size = 16, .kv_cache_memory = 1ll << 30,
                    .prefix_caching = true, .max_body = 4u << 20, .max_queue = 1024, .drain_timeout_s = 60};
    c.device = cli_device("--device", "auto");
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(k_serve_usage, stdout);
            exit(0);
        } else if (!strcmp(f, "-m") || !strcmp(f, "--model")) c.model_path = v, i++;
        else if (!strcmp(f, "--host")) c.host = v, i++;
        else if (!strcmp(f, "--port")) c.port = (int)cli_int(f, v, 0, 65535), i++;
        else if (!strcmp(f, "--api-key")) c.api_key = v, i++;
        else if (!strcmp(f, "--served-model-name")) c.served_model_name = v, i++;
        else if (!strcmp(f, "--max-model-len")) c.max_model_len = (int32_t)cli_int(f, v, 1, INT32_MAX), i++;
        else if (!strcmp(f, "--max-num-seqs")) c.max_num_seqs = (int32_t)cli_int(f, v, 1, 1 << 16), i++;
        else if (!strcmp(f, "--max-num-batched-tokens")) c.max_num_batched_tokens = (int32_t)cli_int(f, v, 1, 1 << 24), i++;
        else if (!strcmp(f, "--block-size")) c.block_size = (int32_t)cli_int(f, v, 1, 1024), i++;
        else if (!strcmp(f, "--kv-cache-memory") || !strcmp(f, "--kv-cache-memory-bytes")) c.kv_cache_memory = parse_bytes(f, v), c.kv_cache_memory_set = true, i++;
        else if (!strcmp(f, "--gpu-memory-utilization")) c.gpu_memory_utilization = (float)cli_float(f, v, 0.01, 1.0), i++;
        else if (!strcmp(f, "--enable-prefix-caching")) c.prefix_caching = true;
        else if (!strcmp(f, "--no-enable-prefix-caching")) c.prefix_caching = false;
        else if (!strcmp(f, "--chat-template")) c.chat_template_path = v, i++;
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) c.n_threads = (int)cli_int(f, v, 1, 1024), i++;
        else if (!strcmp(f, "--device")) c.device = cli_device(f, v), i++;
        else if (!strcmp(f, "--max-request-body")) c.max_body = (size_t)parse_bytes(f, v), i++;
        else if (!strcmp(f, "--max-queued-requests")) c.max_queue = (int)cli_int(f, v, 1, 1 << 20), i++;
        else if (!strcmp(f, "--drain-timeout")) c.drain_timeout_s = (int)cli_int(f, v, 0, 86400), i++;
        else if (!strcmp(f, "--log-level")) {
            if (v && !strcmp(v, "debug")) c.log_level = LOG_DEBUG;
            else if (v && !strcmp(v, "info")) c.log_level = LOG_INFO;
            else if (v && (!strcmp(v, "warning") || !strcmp(v, "warn"))) c.log_level = LOG_WARNING;
            else cli_die(OSP_OK, "--log-level: '%s' is not debug, info or warning", v ? v : "");
            i++;
        } else cli_die(OSP_OK, "serve: unknown option '%s' (see osprey serve --help)", f);
        if (i >= argc) cli_die(OSP_OK, "%s needs a value", f);
    }
    if (!c.model_path) cli_die(OSP_OK, "serve needs -m FILE");
    if (!c.host) cli_die(OSP_OK, "--host needs a value");
    return c;
}

int cmd_serve(int argc, char **argv) {
    srv_server srv = {.cfg = parse_flags(argc, argv)};
    const srv_config *cfg = &srv.cfg;
    /* SIGTERM/SIGINT are taken by sigwait() below; every thread started from here inherits the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    const char *base = strrchr(cfg->model_path, '/');
    srv.model_name = cfg->served_model_name ? cfg->served_model_name : base ? base + 1 : cfg->model_path;
    slog(&srv, LOG_INFO, "loading model %s ...", cfg->model_path);
    const double t0 = now_s();
    osp_engine_params ep = osp_engine_default_params();
    ep.model_path = cfg->model_path;
    ep.n_threads = cfg->n_threads;
    ep.block_size = cfg->block_size;
    /* on the GPU without --kv-cache-memory: sized from free memory (gpu_memory_utilization) */
    ep.kv_cache_memory = cfg->device == OSP_DEVICE_CUDA && !cfg->kv_cache_memory_set ? 0 : cfg->kv_cache_memory;
    ep.gpu_memory_utilization = cfg->gpu_memory_utilization;
    ep.max_num_seqs = cfg->max_num_seqs;
    ep.max_num_batched_tokens = cfg->max_num_batched_tokens;
    ep.max_model_len = cfg->max_model_len;
    ep.enable_prefix_caching = cfg->prefix_caching;
    ep.device = cfg->device;
    osp_status s = osp_engine_create(&ep, &srv.engine);
    if (s != OSP_OK) cli_die(s, "cannot start the engine");
    cli_report_device(srv.engine);
    const osp_gguf *g = osp_model_gguf(osp_engine_model(srv.engine));
    s = osp_tokenizer_load(g, &srv.tok);
    if (s != OSP_OK) cli_die(s, "cannot load the tokenizer");
    srv.max_model_len = osp_engine_params_get(srv.engine)->max_model_len;
    srv.n_vocab = osp_tokenizer_n_vocab(srv.tok);
    const osp_model_config *mc = osp_model_config_get(osp_engine_model(srv.engine));
    if (mc->n_vocab < srv.n_vocab) srv.n_vocab = mc->n_vocab;

    if (srv_chat_env_load(&srv.chat, g, srv.tok, cfg->chat_template_path))
        cli_die(OSP_OK, "--chat-template: cannot read '%s'", cfg->chat_template_path);
    if (srv.chat.parse_error)
        slog(&srv, LOG_WARNING, "the chat template does not parse (chat requests will fail): %s", srv.chat.parse_error);
    else if (!srv.chat.template_text)
        slog(&srv, LOG_WARNING, "the model has no chat template: /v1/chat/completions needs --chat-template");

    srv.metrics = srv_metrics_new();
    pthread_mutex_init(&srv.mu, NULL);
    pthread_cond_init(&srv.idle, NULL);
    srv.next_id = 1;
    const osp_engine_stats st = osp_engine_get_stats(srv.engine);
    slog(&srv, LOG_INFO, "model loaded in %.2f s: %s, vocab %d, max_model_len %d, KV cache %d blocks of %d tokens, prefix caching %s",
         now_s() - t0, mc->arch, srv.n_vocab, srv.max_model_len, st.num_blocks, st.block_size, cfg->prefix_caching ? "on" : "off");
    if ((s = osp_engine_start(srv.engine)) != OSP_OK) cli_die(s, "cannot start the engine loop");

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    if (getaddrinfo(cfg->host, port, &hints, &ai) != 0 || !ai) cli_die(OSP_OK, "--host: cannot resolve '%s'", cfg->host);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, &srv, MHD_OPTION_SOCK_ADDR,
                                            ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, &srv,
                                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)4096, MHD_OPTION_CONNECTION_TIMEOUT,
                                            (unsigned)600, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) cli_die(OSP_OK, "cannot listen on %s:%d (%s)", cfg->host, cfg->port, strerror(errno));
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    slog(&srv, LOG_INFO, "serving %s on http://%s:%u", srv.model_name, cfg->host, di ? (unsigned)di->port : (unsigned)cfg->port);

    int sig = 0;
    sigwait(&sigs, &sig);
    slog(&srv, LOG_INFO, "%s: draining %d requests in flight", sig == SIGTERM ? "SIGTERM" : "SIGINT", srv.in_flight);
    pthread_mutex_lock(&srv.mu);
    srv.draining = true;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += cfg->drain_timeout_s;
    /* requests in flight finish; aborted ones end in the engine (their jobs are freed then) */
    while (srv.in_flight > 0 || srv.live_jobs > 0)
        if (pthread_cond_timedwait(&srv.idle, &srv.mu, &until) == ETIMEDOUT) break;
    const int left = srv.in_flight + srv.live_jobs;
    pthread_mutex_unlock(&srv.mu);
    if (left) slog(&srv, LOG_WARNING, "drain timeout: %d requests still in flight", left);
    MHD_stop_daemon(d);
    const osp_status ls = osp_engine_stop(srv.engine);
    slog(&srv, LOG_INFO, "stopped");
    osp_engine_free(srv.engine);
    osp_tokenizer_free(srv.tok);
    srv_metrics_free(srv.metrics);
    srv_chat_env_free(&srv.chat);
    return ls == OSP_OK ? 0 : 1;
}
