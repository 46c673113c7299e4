/* osprey serve: streaming replies (stream: true) as server-sent events.
 *
 * libmicrohttpd pulls the body through sse_reader on the connection thread: it hands out what is
 * buffered in j->out, else pumps the job (100 ms at a time) and turns new text into "data: {chunk}"
 * events (the chat's role chunk or the completion's echo first, one finish chunk per choice once its
 * held-back text is out, the usage chunk when asked, then "data: [DONE]"). A quiet stream peeks at the
 * socket so a client that left is noticed and its requests aborted. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "serve_internal.h"

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

/* Turns what the pump produced into SSE events in j->out. */
static void stream_fill(srv_job *j) {
    if (!j->finished_stream && srv_job_core_lost(j)) {
        /* the core process died under the stream: an error event (OpenAI's error object), then [DONE] */
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
            if (j->waiting) { /* from here the client's reading is timed as usual (--connection-timeout) */
                srv_conn_waiting(j->srv, j->conn, false);
                j->waiting = false;
            }
            return (ssize_t)n;
        }
        j->out_len = j->out_off = 0;
        if (j->finished_stream) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!j->waiting) { /* waiting for tokens (a queue, a prefill) is no inactivity of the client's */
            srv_conn_waiting(j->srv, j->conn, true);
            j->waiting = true;
        }
        const bool progress = srv_job_pump(j, 100);
        stream_fill(j);
        if (j->out_len == 0 && !progress && !srv_client_alive(j)) {
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
    j->waiting = true; /* the route set the connection waiting (no timeout) when it started the job */
    const enum MHD_Result ret = srv_queue_response(j->srv, c, 200, r);
    MHD_destroy_response(r);
    return ret;
}
