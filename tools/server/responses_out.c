/* /v1/responses (issue 19): the response object and its stream of typed events.
 *
 * A Responses request runs as a chat job (responses.c turned it into one); only its output differs.
 * The finished choice goes through the chat's own parts (srv_job_chat_parts: the reasoning split and
 * the tool-call parse), so a message, function calls and reasoning come out exactly as the chat
 * route would give them, as output items: {"type": "message", "content": [{"type": "output_text"}]},
 * {"type": "function_call", "call_id", "name", "arguments"}, {"type": "reasoning"}. Streaming follows
 * OpenAI's event order with a sequence_number on each: plain text streams as output_text.delta
 * events while it is generated, and so do a named tool_choice's arguments (function_call_arguments
 * deltas: the text is the arguments); output that needs a parse (tool_choice required or auto,
 * --reasoning-parser) goes out as whole items once the choice is done (one arguments delta per call). The stored conversation (for
 * previous_response_id) is the request's, then the output as an assistant message, in the chat's
 * normalized form. Only builds JSON and SSE text: the connection thread owns the job here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_internal.h"

/* The 32 hex digits of the job id ("resp_<hex>"), for the ids of its items. */
static const char *id_hex(const srv_job *j) {
    const char *u = strchr(j->id, '_');
    return u ? u + 1 : j->id;
}

static json_t *usage_json(srv_job *j) {
    const srv_seq *s = &j->seqs[0];
    pthread_mutex_lock(&j->mu);
    const int32_t cached = s->n_cached;
    pthread_mutex_unlock(&j->mu);
    const int64_t in = j->prompt_lens[0], out = s->n_out;
    return json_pack("{s:I, s:{s:i}, s:I, s:{s:i}, s:I}", "input_tokens", (json_int_t)in, "input_tokens_details", "cached_tokens",
                     cached, "output_tokens", (json_int_t)out, "output_tokens_details", "reasoning_tokens", 0,
                     "total_tokens", (json_int_t)(in + out));
}

/* The response object around `output` (stolen): status, the request's echoed fields, usage (or null). */
static json_t *response_object(srv_job *j, const char *status, json_t *output, bool usage) {
    json_t *r = json_pack("{s:s, s:s, s:I, s:s, s:n, s:n, s:s, s:o}", "id", j->id, "object", "response", "created_at",
                          (json_int_t)j->created, "status", status, "error", "incomplete_details", "model",
                          j->srv->model_name, "output", output ? output : json_array());
    if (!r) return NULL;
    json_object_update(r, j->req.resp_echo);
    json_object_set_new(r, "usage", usage ? usage_json(j) : json_null());
    return r;
}

static json_t *message_item(const srv_job *j, const char *text, size_t len, const char *status) {
    char id[64];
    snprintf(id, sizeof id, "msg_%s", id_hex(j));
    json_t *content = json_array();
    if (text) json_array_append_new(content, json_pack("{s:s, s:s%, s:[], s:[]}", "type", "output_text", "text", text, len,
                                                       "annotations", "logprobs"));
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", id, "type", "message", "status", status, "role", "assistant", "content",
                     content);
}

/* Builds the finished output: items, status, and the assistant message for the stored conversation. */
static int build_output(srv_job *j, json_t **items, json_t **assistant, const char **status, const char **why) {
    const srv_seq *s = &j->seqs[0];
    char *content = NULL, *reasoning = NULL;
    json_t *calls = NULL;
    const char *finish = s->finish ? s->finish : "abort";
    const bool parsed = srv_job_tool_mode(j) || j->req.reasoning_parser != SRV_REASONING_NONE;
    *items = json_array();
    *assistant = NULL;
    if (!*items) return -1;
    if (parsed) {
        if (srv_job_chat_parts(j, 0, &content, &reasoning, &calls, &finish)) goto nomem;
    } else if (!(content = strndup(s->text.buf ? s->text.buf : "", s->text.len))) {
        goto nomem;
    }
    *why = NULL;
    if (!strcmp(finish, "stop") || !strcmp(finish, "tool_calls")) *status = "completed";
    else if (!strcmp(finish, "length")) *status = "incomplete", *why = "max_output_tokens";
    else *status = "failed";
    const char *item_status = !strcmp(*status, "failed") ? "incomplete" : *status;
    if (reasoning) {
        char id[64];
        snprintf(id, sizeof id, "rs_%s", id_hex(j));
        json_array_append_new(*items, json_pack("{s:s, s:s, s:[], s:[{s:s, s:s}], s:s}", "id", id, "type", "reasoning", "summary",
                                                "content", "type", "reasoning_text", "text", reasoning, "status", item_status));
    }
    /* a message when there is text, or when there is nothing else to say */
    if ((content && content[0]) || !calls) {
        const char *t = content ? content : "";
        json_array_append_new(*items, message_item(j, t, strlen(t), item_status));
    }
    size_t k;
    json_t *call;
    json_array_foreach(calls, k, call) {
        const json_t *f = json_object_get(call, "function");
        char id[80];
        snprintf(id, sizeof id, "fc_%s%zu", id_hex(j), k);
        json_array_append_new(*items, json_pack("{s:s, s:s, s:s, s:O, s:O, s:O}", "id", id, "type", "function_call", "status",
                                                item_status, "call_id", json_object_get(call, "id"), "name",
                                                json_object_get(f, "name"), "arguments", json_object_get(f, "arguments")));
    }
    /* the turn as the chat route would carry it on (normalized below with the rest) */
    *assistant = json_pack("{s:s, s:s}", "role", "assistant", "content", content ? content : "");
    if (*assistant && calls) json_object_set(*assistant, "tool_calls", calls);
    free(content);
    free(reasoning);
    json_decref(calls);
    return *assistant ? 0 : -1;
nomem:
    free(content);
    free(reasoning);
    json_decref(calls);
    json_decref(*items);
    *items = NULL;
    return -1;
}

json_t *srv_responses_final(srv_job *j) {
    if (j->resp_final) return json_incref(j->resp_final);
    json_t *items = NULL, *assistant = NULL;
    const char *status = "failed", *why = NULL;
    if (build_output(j, &items, &assistant, &status, &why)) {
        json_decref(items);
        json_decref(assistant);
        return NULL;
    }
    json_t *r = response_object(j, status, items, true);
    if (!r) {
        json_decref(assistant);
        return NULL;
    }
    if (why) json_object_set_new(r, "incomplete_details", json_pack("{s:s}", "reason", why));
    if (!strcmp(status, "completed")) json_object_set_new(r, "completed_at", json_integer((json_int_t)time(NULL)));
    if (!strcmp(status, "failed"))
        json_object_set_new(r, "error", json_pack("{s:s, s:s}", "code", "server_error", "message", "the generation failed"));
    if (j->req.resp_store && strcmp(status, "failed") && j->srv->responses) {
        /* the conversation this response ends: shared message objects, one new array */
        json_t *turn = json_array(), *norm = NULL, *conv = json_copy(j->req.resp_conversation);
        srv_error err = {0};
        if (turn && conv && !json_array_append(turn, assistant) && !srv_messages_normalize(turn, &norm, &err) &&
            !json_array_extend(conv, norm)) {
            if (srv_resp_store_put(j->srv->responses, j->id, json_deep_copy(r), conv))
                srv_log(j->srv, SRV_LOG_WARNING, "response %s: out of memory storing it", j->id);
            conv = NULL;
        } else {
            srv_log(j->srv, SRV_LOG_WARNING, "response %s not stored: %s", j->id, err.message[0] ? err.message : "out of memory");
        }
        json_decref(turn);
        json_decref(norm);
        json_decref(conv);
    }
    json_decref(assistant);
    j->resp_final = r;
    return json_incref(r);
}

/* ---- streaming ----------------------------------------------------------------------------- */

/* One event: "event: TYPE\ndata: {"type": TYPE, "sequence_number": n, ...ev}\n\n"; ev is stolen. */
static void emit(srv_job *j, const char *type, json_t *ev) {
    if (!ev) return;
    json_object_set_new(ev, "type", json_string(type));
    json_object_set_new(ev, "sequence_number", json_integer(j->resp_seq++));
    char *s = json_dumps(ev, JSON_COMPACT);
    json_decref(ev);
    if (!s) return;
    srv_sse_put(j, "event: ", 7);
    srv_sse_put(j, type, strlen(type));
    srv_sse_put(j, "\ndata: ", 7);
    srv_sse_put(j, s, strlen(s));
    srv_sse_put(j, "\n\n", 2);
    free(s);
}

/* An item as output_item.added shows it: in progress, its text or arguments not yet there. */
static json_t *item_opening(const json_t *item) {
    json_t *o = json_deep_copy(item);
    if (!o) return NULL;
    json_object_set_new(o, "status", json_string("in_progress"));
    const char *type = json_string_value(json_object_get(o, "type"));
    if (!strcmp(type, "message")) json_object_set_new(o, "content", json_array());
    else if (!strcmp(type, "function_call")) json_object_set_new(o, "arguments", json_string(""));
    return o;
}

/* The events of a whole finished item at output_index idx, after its output_item.added (text-mode
 * messages were opened and streamed already: opened = true, only their closing events). */
static void emit_item(srv_job *j, size_t idx, const json_t *item, bool opened) {
    const char *type = json_string_value(json_object_get(item, "type"));
    const json_t *id = json_object_get(item, "id");
    if (!opened) emit(j, "response.output_item.added", json_pack("{s:I, s:o}", "output_index", (json_int_t)idx, "item", item_opening(item)));
    if (!strcmp(type, "message")) {
        const json_t *part = json_array_get(json_object_get(item, "content"), 0);
        const json_t *text = json_object_get(part, "text");
        if (!opened) {
            emit(j, "response.content_part.added", json_pack("{s:O, s:I, s:i, s:{s:s, s:s, s:[], s:[]}}", "item_id", id, "output_index",
                                                            (json_int_t)idx, "content_index", 0, "part", "type", "output_text",
                                                            "text", "", "annotations", "logprobs"));
            if (json_string_length(text) > 0)
                emit(j, "response.output_text.delta", json_pack("{s:O, s:I, s:i, s:O, s:[]}", "item_id", id, "output_index",
                                                               (json_int_t)idx, "content_index", 0, "delta", text, "logprobs"));
        }
        emit(j, "response.output_text.done", json_pack("{s:O, s:I, s:i, s:O, s:[]}", "item_id", id, "output_index", (json_int_t)idx,
                                                      "content_index", 0, "text", text, "logprobs"));
        emit(j, "response.content_part.done", json_pack("{s:O, s:I, s:i, s:O}", "item_id", id, "output_index", (json_int_t)idx,
                                                       "content_index", 0, "part", part));
    } else if (!strcmp(type, "function_call")) {
        const json_t *args = json_object_get(item, "arguments");
        if (!opened && json_string_length(args) > 0)
            emit(j, "response.function_call_arguments.delta",
                 json_pack("{s:O, s:I, s:O}", "item_id", id, "output_index", (json_int_t)idx, "delta", args));
        emit(j, "response.function_call_arguments.done", json_pack("{s:O, s:I, s:O, s:O}", "item_id", id, "output_index",
                                                                  (json_int_t)idx, "name", json_object_get(item, "name"),
                                                                  "arguments", args));
    }
    emit(j, "response.output_item.done", json_pack("{s:I, s:O}", "output_index", (json_int_t)idx, "item", item));
}

void srv_responses_stream_error(srv_job *j, const char *message) {
    emit(j, "error", json_pack("{s:s, s:s, s:n}", "code", "server_error", "message", message, "param"));
    j->resp_stage = 3;
    j->finished_stream = true;
}

void srv_responses_stream_fill(srv_job *j) {
    srv_seq *s = &j->seqs[0];
    const bool parsed = srv_job_tool_mode(j) || j->req.reasoning_parser != SRV_REASONING_NONE;
    char msg_id[64];
    snprintf(msg_id, sizeof msg_id, "msg_%s", id_hex(j));
    if (j->resp_stage == 0) {
        emit(j, "response.created", json_pack("{s:o}", "response", response_object(j, "in_progress", NULL, false)));
        emit(j, "response.in_progress", json_pack("{s:o}", "response", response_object(j, "in_progress", NULL, false)));
        j->resp_stage = 1;
    }
    const size_t ready = srv_text_ready(&s->text);
    /* a named tool_choice: the text is the call's arguments (srv_tool_parse_forced), streamed as they come */
    const bool named = j->req.tool_choice == SRV_TOOL_CHOICE_NAMED && j->req.reasoning_parser == SRV_REASONING_NONE;
    if (named) {
        char fc_id[80], call_id[40];
        snprintf(fc_id, sizeof fc_id, "fc_%s0", id_hex(j));
        if (j->resp_stage == 1) {
            srv_tool_call_id(SRV_TOOL_PARSER_NONE, srv_job_call_seed(j, 0), 0, call_id, sizeof call_id);
            emit(j, "response.output_item.added",
                 json_pack("{s:i, s:{s:s, s:s, s:s, s:s, s:s, s:s}}", "output_index", 0, "item", "id", fc_id, "type", "function_call",
                           "status", "in_progress", "call_id", call_id, "name", j->req.tool_name, "arguments", ""));
            j->resp_stage = 2;
        }
        if (ready > s->text.sent) {
            emit(j, "response.function_call_arguments.delta", json_pack("{s:s, s:i, s:s%}", "item_id", fc_id, "output_index", 0, "delta",
                                                                       s->text.buf + s->text.sent, ready - s->text.sent));
            s->text.sent = ready;
        }
    } else if (!parsed) {
        /* plain text: the message item opens at once and its text streams as it is decided */
        if (j->resp_stage == 1) {
            json_t *m = message_item(j, NULL, 0, "in_progress");
            emit(j, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", 0, "item", m));
            emit(j, "response.content_part.added", json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[], s:[]}}", "item_id", msg_id,
                                                            "output_index", 0, "content_index", 0, "part", "type",
                                                            "output_text", "text", "", "annotations", "logprobs"));
            j->resp_stage = 2;
        }
        if (ready > s->text.sent) {
            emit(j, "response.output_text.delta", json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", msg_id, "output_index", 0,
                                                           "content_index", 0, "delta", s->text.buf + s->text.sent,
                                                           ready - s->text.sent, "logprobs"));
            s->text.sent = ready;
        }
    } else {
        s->text.sent = ready; /* parsed output goes out whole, once the choice is done */
    }
    if (!s->done || ready != s->text.len || j->resp_stage == 3) return;
    json_t *r = srv_responses_final(j);
    if (!r) { /* out of memory: end the stream with what OpenAI sends for an error */
        srv_responses_stream_error(j, "out of memory");
        return;
    }
    const json_t *items = json_object_get(r, "output");
    size_t k;
    const json_t *item;
    json_array_foreach(items, k, item) emit_item(j, k, item, (!parsed || named) && k == 0);
    const char *status = json_string_value(json_object_get(r, "status"));
    const char *type = !strcmp(status, "completed") ? "response.completed" : !strcmp(status, "incomplete") ? "response.incomplete" : "response.failed";
    emit(j, type, json_pack("{s:o}", "response", r));
    j->resp_stage = 3;
    j->finished_stream = true;
}
