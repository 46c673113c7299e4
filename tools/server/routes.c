/* osprey serve: the HTTP side, libmicrohttpd's request handler.
 *
 * Routes: POST /v1/completions, /v1/chat/completions, /v1/responses, /v1/embeddings, /tokenize,
 * /detokenize; GET and DELETE /v1/responses/{id} (the store, responses.c); GET /v1/models, /health,
 * /metrics, /version (build info: include/osprey/version.h); GET / and /dashboard (the web page) and
 * /webui/<file> (its files, webui.c) unless --no-webui. The body is gathered (413 past
 * --max-request-body), every /v1/ path checks the API key, errors are OpenAI's error JSON (request.c),
 * 503 while draining or past --max-queued-requests. A generation request is parsed, its prompts built
 * and a job started (serve_jobs.c); the handler then parks the connection (park.c) and is called again
 * by libmicrohttpd each time the engine has news, until the reply is complete; or it hands the job to
 * the SSE stream (sse.c). No handler blocks its pool thread: a request over --max-queued-requests with
 * --queue-wait-timeout parks too, woken when a slot frees or its wait ends. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "osprey/version.h"
#include "serve_internal.h"

/* One request's state across libmicrohttpd's calls of the handler. */
typedef enum {
    CX_BODY,    /* headers, then the body being gathered */
    CX_QUEUED,  /* a generation request parked waiting for a --max-queued-requests slot */
    CX_ADMITTING, /* --engine-process: its job waits for the core's answers to its adds */
    CX_RUNNING, /* a non-streamed generation job runs; the handler is called again on its news */
} conn_stage;

typedef struct conn_ctx {
    char *body;
    size_t len, cap;
    bool too_large;
    srv_server *srv;
    bool sending; /* a generation response was queued: counted in srv->sending until it completes */
    conn_stage stage;
    srv_route route;      /* CX_QUEUED: the route */
    srv_gen_request req;  /* CX_QUEUED: the parsed request */
    srv_park park;        /* CX_QUEUED: the connection, parked */
    srv_job *job;         /* CX_ADMITTING, CX_RUNNING: the job (the connection's reference) */
} conn_ctx;

/* Counts the generation response about to be queued on cx's connection (see srv_server.sending). */
static void mark_sending(srv_server *srv, conn_ctx *cx) {
    pthread_mutex_lock(&srv->mu);
    srv->sending++;
    pthread_mutex_unlock(&srv->mu);
    cx->srv = srv;
    cx->sending = true;
}

/* Every response but a CORS preflight's goes out through here: CORS headers for a request with an
 * Origin (access.c), and a 503 (busy, draining, over --max-connections) carries Retry-After and closes
 * its connection, so a client over a limit backs off and frees its slot. */
static void add_header(void *ctx, const char *name, const char *value) { MHD_add_response_header(ctx, name, value); }

enum MHD_Result srv_queue_response(srv_server *srv, struct MHD_Connection *c, unsigned status, struct MHD_Response *r) {
    srv_cors_simple(&srv->cfg.cors, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin"),
                    MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Cookie") != NULL, add_header, r);
    if (status == 503) {
        MHD_add_response_header(r, "Retry-After", "1");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    }
    return MHD_queue_response(c, status, r);
}

void srv_on_connection(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    (void)c, (void)socket_context; /* libmicrohttpd's callback signature */
    srv_server *srv = cls;
    pthread_mutex_lock(&srv->mu);
    srv->n_connections += code == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1;
    pthread_mutex_unlock(&srv->mu);
}

/* body (malloc'd, owned from here; NULL: a 500 "out of memory") as `type`, with one more header when
 * hdr is not NULL */
static enum MHD_Result reply_hdr(srv_server *srv, struct MHD_Connection *c, int status, const char *type, char *body,
                                 const char *hdr, const char *hdr_value) {
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
    if (hdr) MHD_add_response_header(r, hdr, hdr_value);
    const enum MHD_Result ret = srv_queue_response(srv, c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result reply(srv_server *srv, struct MHD_Connection *c, int status, const char *type, char *body) {
    return reply_hdr(srv, c, status, type, body, NULL, NULL);
}

static enum MHD_Result reply_json(srv_server *srv, struct MHD_Connection *c, int status, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return reply(srv, c, status, "application/json", s);
}

static enum MHD_Result reply_error(srv_server *srv, struct MHD_Connection *c, const srv_error *e) {
    return reply(srv, c, e->status, "application/json", srv_error_json(e));
}

/* 405 with the Allow header RFC 9110 (15.5.6) requires: the methods the path takes */
static enum MHD_Result reply_405(srv_server *srv, struct MHD_Connection *c, const char *method, const char *url,
                                 const char *allow) {
    srv_error e = {.status = 405};
    snprintf(e.message, sizeof e.message, "method %s not allowed on %s", method, url);
    return reply_hdr(srv, c, 405, "application/json", srv_error_json(&e), "Allow", allow);
}

static enum MHD_Result reply_err(srv_server *srv, struct MHD_Connection *c, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static enum MHD_Result reply_err(srv_server *srv, struct MHD_Connection *c, int status, const char *param, const char *fmt, ...) {
    srv_error e = {.status = status};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    snprintf(e.param, sizeof e.param, "%s", param ? param : "");
    return reply_error(srv, c, &e);
}

/* A non-streamed job's connection, each time libmicrohttpd calls the handler for it: turns the news
 * into text; parks the connection again until the next news, or replies once every choice is done. */
static enum MHD_Result run_job(srv_server *srv, struct MHD_Connection *c, conn_ctx *cx) {
    srv_job *j = cx->job;
    for (;;) {
        srv_job_pump(j, 0);
        if (srv_job_all_done(j)) break;
        const srv_park_result pr = srv_park_suspend(srv, &j->park);
        if (pr == SRV_PARK_SUSPENDED) return MHD_YES;
        if (pr == SRV_PARK_AGAIN) continue;
        /* the client left (the watcher saw its socket close), or the server stops: abort */
        j->client_gone = true;
        cx->job = NULL;
        cx->stage = CX_BODY;
        srv_job_http_done(j);
        return MHD_NO;
    }
    cx->job = NULL;
    cx->stage = CX_BODY;
    if (srv_job_core_lost(j)) { /* the core process died under it: an error, not a partial answer */
        mark_sending(srv, cx);
        srv_job_http_done(j);
        return reply_err(srv, c, 503, NULL, "%s", k_core_lost_message);
    }
    if (j->req.route == SRV_ROUTE_EMBEDDINGS) { /* every input's vector, or the engine's error */
        for (int32_t i = 0; i < j->n_seqs; i++)
            if (!j->seqs[i].embd) {
                mark_sending(srv, cx);
                srv_job_http_done(j);
                return reply_err(srv, c, 500, NULL, "the engine produced no embedding for input %d (finish: %s)", i,
                                 j->seqs[i].finish ? j->seqs[i].finish : "none");
            }
    }
    json_t *body = j->req.route == SRV_ROUTE_EMBEDDINGS ? srv_json_embeddings(j) : srv_json_final(j);
    mark_sending(srv, cx); /* before the job lets the drain go on: the reply is not sent yet */
    srv_job_http_done(j);
    return reply_json(srv, c, 200, body);
}

/* A started job (CX_ADMITTING) until the engine admitted all its choices (--engine-process: the
 * core's ACKs, parked for; in process at once): then the SSE stream or run_job; a refusal or a lost
 * core is the request's error reply. */
static enum MHD_Result admit_job(srv_server *srv, struct MHD_Connection *c, conn_ctx *cx) {
    srv_job *j = cx->job;
    srv_error err = {0};
    for (;;) {
        const int a = srv_job_admitted(j, &err);
        if (a > 0) break;
        if (a < 0) {
            cx->job = NULL;
            cx->stage = CX_BODY;
            srv_job_cancel(j);
            return reply_error(srv, c, &err);
        }
        const srv_park_result pr = srv_park_suspend(srv, &j->park);
        if (pr == SRV_PARK_SUSPENDED) return MHD_YES;
        if (pr == SRV_PARK_AGAIN) continue;
        cx->job = NULL; /* the client left (or the server stops) */
        cx->stage = CX_BODY;
        j->client_gone = true;
        srv_job_http_done(j);
        return MHD_NO;
    }
    if (j->req.stream) {
        cx->job = NULL; /* the response holds the job from here (sse.c) */
        cx->stage = CX_BODY;
        mark_sending(srv, cx);
        return srv_sse_queue(j, c);
    }
    cx->stage = CX_RUNNING;
    return run_job(srv, c, cx);
}

/* Leaves the queue wait (CX_QUEUED): the park off the watch list. */
static void leave_queue(srv_server *srv, conn_ctx *cx) {
    if (cx->stage != CX_QUEUED) return;
    srv_park_unwatch(srv, &cx->park);
    cx->stage = CX_BODY;
}

/* A /v1/responses body -> the chat request it runs as (responses.c), with the conversation of its
 * previous_response_id from the store. 0, or -1 with *err. */
static int parse_responses(srv_server *srv, conn_ctx *cx, const srv_parse_limits *lim, srv_gen_request *req, srv_error *err) {
    srv_responses_request rq;
    json_t *history = NULL;
    int rc = -1;
    memset(req, 0, sizeof *req);
    if (srv_responses_parse(cx->body ? cx->body : "", cx->len, &rq, err)) goto done;
    if (rq.previous_response_id && srv_resp_store_get(srv->responses, rq.previous_response_id, NULL, &history)) {
        srv_fail(err, 400, "previous_response_id", "Previous response with id '%.128s' not found.", rq.previous_response_id);
        goto done;
    }
    rc = srv_responses_to_chat(&rq, history, lim, req, err);
done:
    json_decref(history);
    srv_responses_request_free(&rq);
    return rc;
}

static enum MHD_Result handle_generate(srv_server *srv, struct MHD_Connection *c, srv_route route, bool responses, conn_ctx *cx) {
    srv_error err = {0};
    srv_gen_request *req = &cx->req;
    if (cx->stage == CX_BODY) { /* the first call with the whole body (else: a parked wait for a slot) */
        const srv_parse_limits lim = {.n_vocab = srv->n_vocab, .auto_tool_choice = srv->cfg.enable_auto_tool_choice,
                                      .tool_parser = srv->cfg.tool_parser, .reasoning_parser = srv->cfg.reasoning_parser,
                                      .n_embd = srv->n_embd, .kv_role = srv->cfg.kv_transfer.role};
        if (responses ? parse_responses(srv, cx, &lim, req, &err)
                      : srv_parse_gen_request(cx->body ? cx->body : "", cx->len, route, &lim, req, &err)) {
            srv_gen_request_free(req);
            srv_log(srv, SRV_LOG_DEBUG, "rejected request: %d %s", err.status, err.message);
            return reply_error(srv, c, &err);
        }
        if (req->model && strcmp(req->model, srv->model_name)) {
            srv_fail(&err, 404, "model", "The model `%.200s` does not exist.", req->model);
            srv_gen_request_free(req);
            return reply_error(srv, c, &err);
        }
        if (req->n_unknown > 0 && srv->cfg.log_level <= SRV_LOG_DEBUG) {
            char names[512] = "";
            for (int32_t i = 0; i < req->n_unknown; i++) {
                strncat(names, i ? ", " : "", sizeof names - strlen(names) - 1);
                strncat(names, req->unknown[i], sizeof names - strlen(names) - 1);
            }
            srv_log(srv, SRV_LOG_DEBUG, "advisory request fields (no effect): %s", names);
        }
        cx->route = route;
    }
    /* a chat render (its memory and work) counts against --max-queued-requests like a request in flight;
     * full: 503 at once, or with --queue-wait-timeout S park up to S seconds for a slot first (woken
     * when a request ends or a render is done: srv_park_wake_queue) */
    bool expired = false;
    for (;;) {
        pthread_mutex_lock(&srv->mu);
        const bool draining = srv->draining, full = srv->in_flight + srv->rendering >= srv->cfg.max_queue;
        if (!draining && !full) srv->rendering++;
        pthread_mutex_unlock(&srv->mu);
        if (!draining && !full) break;
        if (!draining && srv->cfg.queue_wait_timeout_s > 0 && !expired) {
            if (cx->stage != CX_QUEUED) {
                /* listed before the next look at the counts, so a slot freed in between wakes it */
                srv_park_init(&cx->park, c);
                srv_park_watch(srv, &cx->park, true, srv_now_s() + srv->cfg.queue_wait_timeout_s);
                cx->stage = CX_QUEUED;
                continue;
            }
            const srv_park_result pr = srv_park_suspend(srv, &cx->park);
            if (pr == SRV_PARK_SUSPENDED) return MHD_YES;
            if (pr == SRV_PARK_AGAIN) continue;
            if (pr == SRV_PARK_GONE) { /* the client left while it waited */
                leave_queue(srv, cx);
                srv_gen_request_free(req);
                return MHD_NO;
            }
            expired = true; /* one more look, then the 503 */
            continue;
        }
        leave_queue(srv, cx);
        srv_gen_request_free(req);
        return reply_err(srv, c, 503, NULL, draining ? "the server is shutting down" : "the server is busy (--max-queued-requests %d reached); retry later",
                         srv->cfg.max_queue);
    }
    leave_queue(srv, cx);
    const int built = srv_build_prompts(srv, req, &err);
    pthread_mutex_lock(&srv->mu);
    srv->rendering--;
    pthread_cond_broadcast(&srv->idle); /* the drain waits on it */
    pthread_mutex_unlock(&srv->mu);
    srv_park_wake_queue(srv); /* a slot may be free for a request parked waiting for one */
    if (built) {
        srv_gen_request_free(req);
        return reply_error(srv, c, &err);
    }
    srv_job *j = srv_job_start(srv, req, c, &err);
    srv_gen_request_free(req);
    if (!j) return reply_error(srv, c, &err);
    cx->job = j;
    cx->stage = CX_ADMITTING;
    return admit_job(srv, c, cx);
}

static enum MHD_Result handle_tokenize(srv_server *srv, struct MHD_Connection *c, conn_ctx *cx) {
    json_error_t je;
    json_t *root = json_loadb(cx->body ? cx->body : "", cx->len, 0, &je);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return reply_err(srv, c, 400, NULL, "malformed JSON: %s", root ? "the body must be an object" : je.text);
    }
    srv_error err = {0};
    char *text = NULL;
    bool add_special = true;
    int32_t *ids = NULL;
    size_t n = 0;
    bool have_ids = false; /* a chat is tokenized with its provenance (srv_chat_prompt) */
    const json_t *model = json_object_get(root, "model");
    if (json_is_string(model) && strcmp(json_string_value(model), srv->model_name)) {
        srv_fail(&err, 404, "model", "The model `%.200s` does not exist.", json_string_value(model));
        goto fail;
    }
    if (json_object_get(root, "messages")) {
        srv_gen_request r;
        /* nothing is generated here: tools render whatever tool_choice says (auto needs no parser) */
        const srv_parse_limits lim = {.n_vocab = srv->n_vocab, .auto_tool_choice = true,
                                       .tool_parser = srv->cfg.tool_parser ? srv->cfg.tool_parser : SRV_TOOL_PARSER_HERMES,
                                       .reasoning_parser = srv->cfg.reasoning_parser};
        add_special = false;
        if (srv_get_bool(root, "add_special_tokens", &add_special, &err)) goto fail;
        if (srv_parse_gen_request(cx->body, cx->len, SRV_ROUTE_CHAT, &lim, &r, &err)) {
            srv_gen_request_free(&r);
            goto fail;
        }
        pthread_mutex_lock(&srv->mu); /* a render counts against --max-queued-requests (handle_generate) */
        const bool full = srv->in_flight + srv->rendering >= srv->cfg.max_queue;
        if (!full) srv->rendering++;
        pthread_mutex_unlock(&srv->mu);
        if (full) {
            srv_gen_request_free(&r);
            srv_fail(&err, 503, NULL, "the server is busy (--max-queued-requests %d reached); retry later", srv->cfg.max_queue);
            goto fail;
        }
        const int rc = srv_chat_prompt(&srv->chat, srv->tok, &r, add_special, &text, &ids, &n, &err);
        have_ids = rc == 0;
        pthread_mutex_lock(&srv->mu);
        srv->rendering--;
        pthread_cond_broadcast(&srv->idle);
        pthread_mutex_unlock(&srv->mu);
        srv_park_wake_queue(srv);
        srv_gen_request_free(&r);
        if (rc) goto fail;
    } else {
        const json_t *p = json_object_get(root, "prompt");
        if (!json_is_string(p)) {
            srv_fail(&err, 400, "prompt", "'prompt' (a string) or 'messages' is required");
            goto fail;
        }
        if (srv_get_bool(root, "add_special_tokens", &add_special, &err)) goto fail;
        text = strdup(json_string_value(p));
    }
    if (!text || (!have_ids && osp_tokenizer_encode(srv->tok, text, strlen(text), add_special, true, &ids, &n) != OSP_OK)) {
        srv_fail(&err, 500, NULL, "tokenization failed");
        goto fail;
    }
    json_t *toks = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(toks, json_integer(ids[i]));
    free(ids);
    free(text);
    json_decref(root);
    return reply_json(srv, c, 200, json_pack("{s:I, s:i, s:o, s:n}", "count", (json_int_t)n, "max_model_len", srv->max_model_len,
                                        "tokens", toks, "token_strs"));
fail:
    free(ids);
    free(text);
    json_decref(root);
    return reply_error(srv, c, &err);
}

static enum MHD_Result handle_detokenize(srv_server *srv, struct MHD_Connection *c, conn_ctx *cx) {
    json_error_t je;
    json_t *root = json_loadb(cx->body ? cx->body : "", cx->len, 0, &je);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return reply_err(srv, c, 400, NULL, "malformed JSON: %s", root ? "the body must be an object" : je.text);
    }
    const json_t *t = json_object_get(root, "tokens");
    const json_t *model = json_object_get(root, "model");
    if (json_is_string(model) && strcmp(json_string_value(model), srv->model_name)) {
        json_decref(root);
        return reply_err(srv, c, 404, "model", "The model `%.200s` does not exist.", json_string_value(model));
    }
    if (!json_is_array(t)) {
        json_decref(root);
        return reply_err(srv, c, 400, "tokens", "'tokens' must be a list of token ids");
    }
    const size_t n = json_array_size(t);
    int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));
    for (size_t i = 0; ids && i < n; i++) {
        const json_t *x = json_array_get(t, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= srv->n_vocab) {
            free(ids);
            json_decref(root);
            return reply_err(srv, c, 400, "tokens", "tokens[%zu] is not a token id in [0, %d)", i, srv->n_vocab);
        }
        ids[i] = (int32_t)json_integer_value(x);
    }
    json_decref(root);
    char *s = ids ? srv_detok_all(srv, ids, (int32_t)n) : NULL;
    free(ids);
    json_t *body = s ? json_pack("{s:s}", "prompt", s) : NULL;
    free(s);
    return reply_json(srv, c, 200, body);
}

static srv_metrics_gauges gauges(srv_server *srv) {
    const osp_engine_stats st = srv_engine_stats(srv);
    srv_metrics_gauges g = {.num_running = st.num_running, .num_waiting = st.num_waiting, .num_blocks = st.num_blocks,
                            .num_free_blocks = st.num_free_blocks, .prefix_queries = st.prefix_queries_tokens,
                            .prefix_hits = st.prefix_hits_tokens, .num_preemptions = st.num_preemptions,
                            .num_steps = st.num_steps, .num_scheduled_tokens = st.num_scheduled_tokens};
    memcpy(g.iteration_tokens, st.iteration_tokens, sizeof g.iteration_tokens);
    g.offload = srv->cfg.kv_offload_host_bytes > 0 || srv->cfg.kv_offload_disk;
    g.offload_host_blocks = st.offload_host_blocks, g.offload_disk_blocks = st.offload_disk_blocks;
    g.offload_stored = st.offload_stored_blocks, g.offload_loaded = st.offload_loaded_blocks;
    g.offload_corrupt = st.offload_corrupt_blocks, g.offload_hits_tokens = st.offload_hits_tokens;
    g.offload_skipped_tokens = st.offload_skipped_tokens, g.offload_write_errors = st.offload_write_errors;
    g.offload_missing = st.offload_missing_blocks;
    g.kv_transfer = srv->cfg.kv_transfer.role != OSP_KV_ROLE_NONE;
    g.kv_transfer_held = st.kv_transfer_held, g.kv_transfer_held_blocks = st.kv_transfer_held_blocks;
    g.kv_transfer_sent_blocks = st.kv_transfer_sent_blocks, g.kv_transfer_dropped = st.kv_transfer_dropped;
    g.kv_transfer_recv_blocks = st.kv_transfer_recv_blocks, g.kv_transfer_failed_blocks = st.kv_transfer_failed_blocks;
    g.kv_transfer_ipc_blocks = st.kv_transfer_ipc_blocks;
    g.kv_transfer_recv_seconds = st.kv_transfer_recv_seconds;
    const osp_spec_config *sc = srv->engine ? &osp_engine_params_get(srv->engine)->speculative : &srv->cfg.spec;
    if (sc->method != OSP_SPEC_NONE) {
        g.spec_k = sc->num_speculative_tokens;
        g.spec_drafts = st.spec_num_drafts;
        g.spec_draft_tokens = st.spec_num_draft_tokens;
        g.spec_accepted_tokens = st.spec_num_accepted_tokens;
        memcpy(g.spec_accepted_per_pos, st.spec_accepted_per_pos, sizeof g.spec_accepted_per_pos);
    }
    pthread_mutex_lock(&srv->mu);
    g.in_flight = srv->in_flight;
    g.connections = srv->n_connections;
    pthread_mutex_unlock(&srv->mu);
    g.engine_process = srv->core != NULL;
    g.core_restarts = srv->core ? srv_core_restarts(srv) : 0;
    return g;
}

/* One file of the web page (webui.c): from the binary's own bytes, never copied; revalidated on each
 * load (no-cache + ETag: a conditional GET gets 304, and a rebuilt binary's new files are seen at once).
 * The page is served without the API key (it holds no secret); its own API calls send the key the user
 * types. The CSP keeps the page to its own origin: no inline script, nothing loaded from elsewhere. */
static enum MHD_Result serve_asset(srv_server *srv, struct MHD_Connection *c, const srv_webui_asset *a) {
    const bool fresh = srv_webui_etag_match(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "If-None-Match"), a->etag);
    struct MHD_Response *r = MHD_create_response_from_buffer(fresh ? 0 : a->len, fresh ? NULL : (void *)a->bytes,
                                                             MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    if (!fresh) MHD_add_response_header(r, "Content-Type", a->content_type);
    MHD_add_response_header(r, "ETag", a->etag);
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                            "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'");
    const enum MHD_Result ret = srv_queue_response(srv, c, fresh ? 304 : 200, r);
    MHD_destroy_response(r);
    return ret;
}

static bool authorized(srv_server *srv, struct MHD_Connection *c) {
    return srv_bearer_ok(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"), srv->cfg.api_key);
}

/* A CORS preflight (OPTIONS with Origin and Access-Control-Request-Method), answered on any path and
 * before the API key, as vLLM's CORS middleware does. */
typedef struct header_list {
    int n;
    const char *name[8];
    char *value[8];
} header_list;

static void collect_header(void *ctx, const char *name, const char *value) {
    header_list *h = ctx;
    if (h->n < 8 && (h->value[h->n] = strdup(value))) h->name[h->n++] = name;
}

static enum MHD_Result preflight(srv_server *srv, struct MHD_Connection *c, const char *origin, const char *method) {
    char body[128];
    header_list h = {0};
    const int status = srv_cors_preflight(&srv->cfg.cors, origin, method,
                                          MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers"),
                                          collect_header, &h, body, sizeof body);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_COPY);
    for (int i = 0; i < h.n; i++) {
        if (r) MHD_add_response_header(r, h.name[i], h.value[i]);
        free(h.value[i]);
    }
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/plain; charset=utf-8");
    const enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result srv_on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version; /* libmicrohttpd's callback signature */
    srv_server *srv = cls;
    conn_ctx *cx = *con_cls;
    if (!cx) {
        cx = calloc(1, sizeof *cx);
        if (!cx) return MHD_NO;
        *con_cls = cx;
        cx->srv = srv;
        const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
        const char *acrm = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Method");
        if (!strcmp(method, "OPTIONS") && origin && acrm) {
            cx->too_large = true; /* a body, if any, is dropped */
            return preflight(srv, c, origin, acrm);
        }
        /* over --max-connections: generation and tokenizer routes get 503 + Retry-After at once (body
         * unread, connection closed); /health, /metrics and /version stay answered for probes */
        pthread_mutex_lock(&srv->mu);
        const int open_conns = srv->n_connections;
        pthread_mutex_unlock(&srv->mu);
        if (open_conns > srv->cfg.max_connections && strcmp(url, "/health") && strcmp(url, "/metrics") && strcmp(url, "/version")) {
            cx->too_large = true; /* the body, if any, is dropped */
            return reply_err(srv, c, 503, NULL, "too many connections (%d open, --max-connections %d); retry later", open_conns,
                             srv->cfg.max_connections);
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > srv->cfg.max_body) {
            cx->too_large = true;
            return reply_err(srv, c, 413, NULL, "the request body is larger than %zu bytes", srv->cfg.max_body);
        }
        return MHD_YES;
    }
    /* called again after a park (park.c): the job's news, or a queue slot */
    if (cx->stage == CX_RUNNING) return run_job(srv, c, cx);
    if (cx->stage == CX_ADMITTING) return admit_job(srv, c, cx);
    if (cx->stage == CX_QUEUED) return handle_generate(srv, c, cx->route, false, cx); /* parsed already */
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
    if (cx->too_large) return reply_err(srv, c, 413, NULL, "the request body is larger than %zu bytes", srv->cfg.max_body);

    /* HEAD is GET without the body (RFC 9110 9.3.2; libmicrohttpd leaves the body out) */
    const bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (!strncmp(url, "/v1/", 4) && !authorized(srv, c)) return reply_err(srv, c, 401, NULL, "invalid or missing API key");
    if (!strcmp(url, "/health")) {
        if (!get) return reply_405(srv, c, method, url, "GET, HEAD");
        const srv_metrics_gauges g = gauges(srv);
        pthread_mutex_lock(&srv->mu);
        const bool draining = srv->draining;
        pthread_mutex_unlock(&srv->mu);
        const bool ready = srv_engine_ready(srv); /* --engine-process: not while the core restarts */
        return reply_json(srv, c, draining || !ready ? 503 : 200,
                          json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "status", draining ? "draining" : ready ? "ok" : "engine core restarting",
                                    "kv_cache_free_blocks", g.num_free_blocks, "kv_cache_total_blocks", g.num_blocks,
                                    "num_requests_running", g.num_running, "num_requests_waiting", g.num_waiting,
                                    "requests_in_flight", g.in_flight));
    }
    if (!strcmp(url, "/metrics")) {
        if (!get) return reply_405(srv, c, method, url, "GET, HEAD");
        const srv_metrics_gauges g = gauges(srv);
        return reply(srv, c, 200, "text/plain; version=0.0.4; charset=utf-8", srv_metrics_render(srv->metrics, srv->model_name, &g));
    }
    if (!strcmp(url, "/version")) { /* as vLLM's /version: outside /v1/, so no API key */
        if (!get) return reply_405(srv, c, method, url, "GET, HEAD");
        return reply_json(srv, c, 200, json_loads(osp_build_info_json(), 0, NULL));
    }
    if (!strcmp(url, "/v1/models")) {
        if (!get) return reply_405(srv, c, method, url, "GET, HEAD");
        return reply_json(srv, c, 200, json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:s, s:i, s:s}]}", "object", "list", "data", "id",
                                            srv->model_name, "object", "model", "created", (json_int_t)time(NULL), "owned_by",
                                            "osprey", "root", srv->cfg.model_path, "max_model_len", srv->max_model_len,
                                            "version", osp_version_string()));
    }
    if (!strncmp(url, "/v1/responses/", 14) && !strchr(url + 14, '/')) { /* a stored response: GET it, DELETE it */
        const char *id = url + 14;
        json_t *r = NULL;
        if (!strcmp(method, "GET") && !srv_resp_store_get(srv->responses, id, &r, NULL)) return reply_json(srv, c, 200, r);
        if (!strcmp(method, "DELETE") && !srv_resp_store_delete(srv->responses, id))
            return reply_json(srv, c, 200, json_pack("{s:s, s:s, s:b}", "id", id, "object", "response", "deleted", 1));
        if (strcmp(method, "GET") && strcmp(method, "DELETE")) return reply_405(srv, c, method, url, "GET, DELETE");
        return reply_err(srv, c, 404, NULL, "Response with id '%.128s' not found.", id);
    }
    struct {
        const char *path;
        int kind;
    } const routes[] = {{"/v1/completions", 0}, {"/v1/chat/completions", 1}, {"/tokenize", 2}, {"/detokenize", 3},
                        {"/v1/responses", 4}, {"/v1/embeddings", 5}};
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
        if (strcmp(url, routes[i].path)) continue;
        if (!post) return reply_405(srv, c, method, url, "POST");
        switch (routes[i].kind) {
        case 0: return handle_generate(srv, c, SRV_ROUTE_COMPLETIONS, false, cx);
        case 1: return handle_generate(srv, c, SRV_ROUTE_CHAT, false, cx);
        case 4: return handle_generate(srv, c, SRV_ROUTE_CHAT, true, cx);
        case 5: return handle_generate(srv, c, SRV_ROUTE_EMBEDDINGS, false, cx);
        case 2: return handle_tokenize(srv, c, cx);
        default: return handle_detokenize(srv, c, cx);
        }
    }
    const srv_webui_asset *asset = srv->cfg.no_webui ? NULL : srv_webui_find(url);
    if (asset) {
        if (!get) return reply_405(srv, c, method, url, "GET, HEAD");
        return serve_asset(srv, c, asset);
    }
    return reply_err(srv, c, 404, NULL, "no route %s %.200s", method, url);
}

void srv_on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)c, (void)toe; /* libmicrohttpd's callback signature */
    srv_server *srv = cls;
    conn_ctx *cx = *con_cls;
    if (!cx) return;
    /* the connection ended before its reply (the client left, a timeout, the daemon stops) */
    if (cx->stage == CX_QUEUED) {
        leave_queue(srv, cx);
        srv_gen_request_free(&cx->req);
    }
    if (cx->job) {
        cx->job->client_gone = true;
        srv_job_http_done(cx->job);
        cx->job = NULL;
    }
    if (cx->sending) { /* the generation response is done (sent, or the connection ended) */
        pthread_mutex_lock(&srv->mu);
        srv->sending--;
        pthread_cond_broadcast(&srv->idle);
        pthread_mutex_unlock(&srv->mu);
    }
    srv_park_destroy(&cx->park);
    free(cx->body);
    free(cx);
    *con_cls = NULL;
}
