/* osprey serve: streaming replies (stream: true) as server-sent events.
 *
 * libmicrohttpd pulls the body through sse_reader on the connection's pool thread: it hands out what
 * is buffered in j->out, else pumps the job (without waiting) and turns new text into "data: {chunk}"
 * events (the chat's role chunk or the completion's echo first, one finish chunk per choice once its
 * held-back text is out, the usage chunk when asked, then "data: [DONE]"). With nothing to send it
 * parks the connection (park.c) and returns 0; the engine callback resumes it when tokens come, and
 * the watcher when the client leaves (then the stream ends with an error and the requests abort). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "serve_internal.h"

static void out_put(srv_job *j, const char *s, size_t n);

void srv_sse_put(srv_job *j, const char *s, size_t n) { out_put(j, s, n); }

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

/* One event whose delta is {key: text[n]}. */
static void delta_text(srv_job *j, int32_t i, const char *key, const char *text, size_t n) {
    out_event(j, srv_json_chunk_delta(j, i, json_pack("{s:s%}", key, text, n), NULL));
}

/* One event whose delta is {"tool_calls": [{"index": k, ...call}]}. */
static void delta_call(srv_job *j, int32_t i, size_t k, json_t *call) {
    if (call) json_object_set_new(call, "index", json_integer((json_int_t)k));
    out_event(j, srv_json_chunk_delta(j, i, json_pack("{s:[o]}", "tool_calls", call), NULL));
}

/* A chat choice through the reasoning and tool parsers (--reasoning-parser, tools): the split of the
 * text ready so far is recomputed and what grew since the last call goes out as deltas, reasoning
 * ("reasoning_content") first, then content; tool calls as OpenAI streams them (a first delta with the
 * call's index, id, type and name and empty arguments, then argument fragments). A named tool_choice
 * streams its arguments as they are generated; with required or auto, content goes out up to where a
 * call may start and the calls when the choice is done (srv_job_chat_parts, so the stream equals the
 * non-streamed reply). */
static void stream_parsed(srv_job *j, int32_t i) {
    srv_seq *s = &j->seqs[i];
    const char *buf = s->text.buf ? s->text.buf : "";
    const size_t ready = srv_text_ready(&s->text);
    const bool done = s->done && ready == s->text.len;
    srv_span rs, cs;
    srv_reasoning_split(j->req.reasoning_parser, buf, ready, done, &rs, &cs);
    s->text.sent = ready;
    if (rs.len > s->r_sent) {
        delta_text(j, i, "reasoning_content", buf + rs.off + s->r_sent, rs.len - s->r_sent);
        s->r_sent = rs.len;
    }
    const char *c = buf + cs.off;
    const char *finish = s->finish;
    if (!srv_job_tool_mode(j)) {
        if (cs.len > s->c_sent) delta_text(j, i, "content", c + s->c_sent, cs.len - s->c_sent);
        if (cs.len > s->c_sent) s->c_sent = cs.len;
    } else if (j->req.tool_choice == SRV_TOOL_CHOICE_NAMED) {
        if (!s->tool_head_sent && (cs.len > 0 || done)) {
            char id[40];
            srv_tool_call_id(SRV_TOOL_PARSER_NONE, srv_job_call_seed(j, i), 0, id, sizeof id);
            delta_call(j, i, 0, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name",
                                          j->req.tool_name, "arguments", ""));
            s->tool_head_sent = true;
        }
        if (cs.len > s->c_sent) {
            delta_call(j, i, 0, json_pack("{s:{s:s%}}", "function", "arguments", c + s->c_sent, cs.len - s->c_sent));
            s->c_sent = cs.len;
        }
        /* a named function keeps "stop" (OpenAI, vLLM) */
    } else if (!done) {
        const size_t safe = j->req.tool_choice == SRV_TOOL_CHOICE_AUTO ? srv_tool_content_prefix(j->req.tool_parser, c, cs.len) : 0;
        if (safe > s->c_sent) {
            delta_text(j, i, "content", c + s->c_sent, safe - s->c_sent);
            s->c_sent = safe;
        }
    } else if (!s->final_sent) {
        char *content = NULL, *reasoning = NULL;
        json_t *calls = NULL;
        if (srv_job_chat_parts(j, i, &content, &reasoning, &calls, &finish)) finish = "error";
        const size_t cl = content ? strlen(content) : 0;
        if (cl > s->c_sent && !memcmp(content, c, s->c_sent)) delta_text(j, i, "content", content + s->c_sent, cl - s->c_sent);
        size_t k;
        json_t *call;
        json_array_foreach(calls, k, call) {
            const json_t *f = json_object_get(call, "function");
            delta_call(j, i, k, json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", json_object_get(call, "id"), "type", "function",
                                          "function", "name", json_object_get(f, "name"), "arguments", ""));
            delta_call(j, i, k, json_pack("{s:{s:O}}", "function", "arguments", json_object_get(f, "arguments")));
        }
        free(content);
        free(reasoning);
        json_decref(calls);
    }
    if (done && !s->final_sent) {
        out_event(j, srv_json_chunk_delta(j, i, NULL, finish));
        s->final_sent = true;
    }
}

/* Turns what the pump produced into SSE events in j->out. */
static void stream_fill(srv_job *j) {
    if (!j->finished_stream && srv_job_core_lost(j)) {
        /* the core process died under the stream: an error event (OpenAI's error object), then [DONE];
         * a Responses stream ends with its own "error" event */
        if (j->req.responses) {
            srv_responses_stream_error(j, k_core_lost_message);
            return;
        }
        srv_error e = {.status = 503};
        snprintf(e.message, sizeof e.message, "%s", k_core_lost_message);
        char *body = srv_error_json(&e);
        if (body) {
            out_put(j, "data: ", 6);
            out_put(j, body, strlen(body));
            out_put(j, "\n\n", 2);
            free(body);
        }
        out_put(j, "data: [DONE]\n\n", 14);
        j->finished_stream = true;
        return;
    }
    if (j->req.responses) { /* /v1/responses: typed events, no [DONE] (responses_out.c) */
        srv_responses_stream_fill(j);
        return;
    }
    if (!j->started) {
        j->started = true;
        for (int32_t i = 0; i < j->n_seqs; i++) {
            if (j->req.route == SRV_ROUTE_CHAT) out_event(j, srv_json_chunk(j, i, "", 0, NULL, true));
            else if (j->echo) out_event(j, srv_json_chunk(j, i, j->echo[j->seqs[i].prompt_idx], strlen(j->echo[j->seqs[i].prompt_idx]), NULL, false));
        }
    }
    bool all_final = true;
    for (int32_t i = 0; i < j->n_seqs; i++) {
        srv_seq *s = &j->seqs[i];
        if (j->req.route == SRV_ROUTE_CHAT && (srv_job_tool_mode(j) || j->req.reasoning_parser != SRV_REASONING_NONE)) {
            stream_parsed(j, i);
            all_final &= s->final_sent;
            continue;
        }
        const size_t ready = srv_text_ready(&s->text);
        if (ready > s->text.sent) {
            out_event(j, srv_json_chunk(j, i, s->text.buf + s->text.sent, ready - s->text.sent, NULL, false));
            s->text.sent = ready;
        }
        if (s->done && !s->final_sent && s->text.sent == s->text.len) {
            out_event(j, srv_json_chunk(j, i, j->req.route == SRV_ROUTE_CHAT ? NULL : "", 0, s->finish, false));
            s->final_sent = true;
        }
        all_final &= s->final_sent;
    }
    if (all_final && !j->finished_stream) {
        if (j->req.include_usage) {
            out_event(j, srv_json_usage_chunk(j));
        }
        out_put(j, "data: [DONE]\n\n", 14);
        j->finished_stream = true;
    }
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos; /* libmicrohttpd's callback signature: the stream is read in order */
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
        if (srv_park_gone(j->srv, &j->park)) { /* tokens flow, yet the watcher saw the client leave */
            j->client_gone = true;
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        srv_job_pump(j, 0);
        stream_fill(j);
        if (j->out_len > 0 || j->finished_stream) continue;
        /* nothing to send: park until the engine (or the watcher) has news; libmicrohttpd calls
         * again after the resume (a suspended connection is not timed out meanwhile) */
        switch (srv_park_suspend(j->srv, &j->park)) {
        case SRV_PARK_SUSPENDED: return 0;
        case SRV_PARK_AGAIN: continue;
        default: /* the client left, or the server stops */
            j->client_gone = true;
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void sse_free(void *cls) {
    srv_job *j = cls;
    if (!j->finished_stream) j->client_gone = true;
    srv_job_http_done(j);
}

enum MHD_Result srv_sse_queue(srv_job *j, struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_reader, j, sse_free);
    if (!r) {
        srv_job_http_done(j);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    const enum MHD_Result ret = srv_queue_response(j->srv, c, 200, r);
    MHD_destroy_response(r);
    return ret;
}
