/* osprey serve: the OpenAI response objects of a job, as the openai client and vLLM expect them.
 *
 * text_completion and chat.completion replies, their .chunk stream events, usage, and logprobs in
 * each route's format (completions: {tokens, token_logprobs, top_logprobs, text_offset}; chat:
 * {content: [{token, logprob, bytes, top_logprobs}]}). Token texts that are pieces of a UTF-8
 * character come out as U+FFFD so the JSON stays valid. Only builds JSON: no HTTP, no locking (the
 * connection thread owns what it reads here). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve_internal.h"

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

void srv_json_add_logprobs(srv_job *j, srv_seq *s, const osp_token_logprobs *lp) {
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

void srv_json_add_prompt_logprobs(srv_job *j, srv_seq *s, const int32_t *ids, const osp_token_logprobs *plp, int32_t n) {
    const osp_tokenizer *tok = j->srv->tok;
    if (j->req.route == SRV_ROUTE_CHAT || s->lp || n < 0) return;
    s->lp = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
    if (!s->lp) return;
    json_t *toks = json_object_get(s->lp, "tokens"), *lps = json_object_get(s->lp, "token_logprobs"),
           *tops = json_object_get(s->lp, "top_logprobs"), *offs = json_object_get(s->lp, "text_offset");
    size_t off = 0;
    for (int32_t i = -1; i < n; i++) {
        const int32_t id = i < 0 ? ids[0] : plp[i].token_id;
        json_t *t = token_str(tok, id, NULL);
        const size_t len = t ? json_string_length(t) : 0;
        json_array_append_new(toks, t ? t : json_string(""));
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += len;
        if (i < 0) {
            json_array_append_new(lps, json_null());
            json_array_append_new(tops, json_null());
            continue;
        }
        json_array_append_new(lps, json_real(plp[i].logprob));
        json_t *top = json_object();
        const int32_t n_top = plp[i].n_top < j->req.logprobs ? plp[i].n_top : j->req.logprobs;
        for (int32_t k = 0; k < n_top; k++) {
            json_t *tt = token_str(tok, plp[i].top_ids[k], NULL);
            if (tt) json_object_set_new(top, json_string_value(tt), json_real(plp[i].top_logprobs[k]));
            json_decref(tt);
        }
        json_t *self = token_str(tok, id, NULL);
        if (self && !json_object_get(top, json_string_value(self)))
            json_object_set_new(top, json_string_value(self), json_real(plp[i].logprob));
        json_decref(self);
        json_array_append_new(tops, top);
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

static json_t *usage_json(const srv_job *j) {
    int64_t np = 0, nc = 0;
    for (int32_t i = 0; i < j->req.n_prompts; i++) np += j->prompt_lens[i];
    for (int32_t i = 0; i < j->n_seqs; i++) nc += j->seqs[i].n_out;
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)np, "completion_tokens", (json_int_t)nc,
                     "total_tokens", (json_int_t)(np + nc));
}

bool srv_job_tool_mode(const srv_job *j) {
    const srv_gen_request *r = &j->req;
    return r->route == SRV_ROUTE_CHAT &&
           (r->tool_choice == SRV_TOOL_CHOICE_REQUIRED || r->tool_choice == SRV_TOOL_CHOICE_NAMED ||
            (r->tool_choice == SRV_TOOL_CHOICE_AUTO && r->tool_parser != SRV_TOOL_PARSER_NONE));
}

uint64_t srv_job_call_seed(const srv_job *j, int32_t i) {
    uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a over the job id, then the choice */
    for (const char *p = j->id; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001B3ull;
    return (h ^ (uint64_t)i) * 0x100000001B3ull;
}

int srv_job_chat_parts(const srv_job *j, int32_t i, char **content, char **reasoning, json_t **calls, const char **finish) {
    const srv_seq *s = &j->seqs[i];
    const char *text = s->text.buf ? s->text.buf : "";
    *content = *reasoning = NULL;
    *calls = NULL;
    *finish = s->finish ? s->finish : "abort";
    srv_span rs, cs;
    srv_reasoning_split(j->req.reasoning_parser, text, s->text.len, true, &rs, &cs);
    if (rs.len && !(*reasoning = strndup(text + rs.off, rs.len))) return -1;
    if (!srv_job_tool_mode(j)) {
        if ((cs.len || j->req.reasoning_parser == SRV_REASONING_NONE) && !(*content = strndup(text + cs.off, cs.len))) return -1;
        return 0;
    }
    srv_tool_result res;
    const uint64_t seed = srv_job_call_seed(j, i);
    const int rc = j->req.tool_choice == SRV_TOOL_CHOICE_AUTO
                       ? srv_tool_parse(j->req.tool_parser, text + cs.off, cs.len, seed, &res)
                       : srv_tool_parse_forced(j->req.tool_choice, j->req.tool_name, text + cs.off, cs.len, seed, &res);
    if (rc) return -1;
    /* parallel_tool_calls false: the first call only (forced choices have it from the grammar) */
    while (res.calls && !j->req.parallel_tool_calls && json_array_size(res.calls) > 1)
        json_array_remove(res.calls, json_array_size(res.calls) - 1);
    *content = res.content;
    *calls = res.calls;
    /* "tool_calls" for auto and required; a named function keeps "stop", as OpenAI and vLLM answer */
    if (res.calls && !strcmp(*finish, "stop") && j->req.tool_choice != SRV_TOOL_CHOICE_NAMED) *finish = "tool_calls";
    return 0;
}

json_t *srv_json_final(srv_job *j) {
    if (j->req.responses) return srv_responses_final(j);
    const bool chat = j->req.route == SRV_ROUTE_CHAT;
    json_t *choices = json_array();
    for (int32_t i = 0; i < j->n_seqs; i++) {
        srv_seq *s = &j->seqs[i];
        const char *text = s->text.buf ? s->text.buf : "";
        json_t *c;
        if (chat && (srv_job_tool_mode(j) || j->req.reasoning_parser != SRV_REASONING_NONE)) {
            char *content = NULL, *reasoning = NULL;
            json_t *calls = NULL;
            const char *finish = NULL;
            json_t *msg = NULL;
            if (!srv_job_chat_parts(j, i, &content, &reasoning, &calls, &finish)) {
                msg = json_pack("{s:s, s:o}", "role", "assistant", "content", content ? json_string(content) : json_null());
                if (msg && j->req.reasoning_parser != SRV_REASONING_NONE)
                    json_object_set_new(msg, "reasoning_content", reasoning ? json_string(reasoning) : json_null());
                if (msg && calls) json_object_set(msg, "tool_calls", calls);
            }
            json_t *lp = logprobs_slice(j, s, 0);
            c = json_pack("{s:i, s:o, s:o, s:s}", "index", i, "message", msg ? msg : json_null(), "logprobs",
                          lp ? lp : json_null(), "finish_reason", finish ? finish : "error");
            free(content);
            free(reasoning);
            json_decref(calls);
        } else if (chat) {
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
    json_t *root = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", j->id, "object", chat ? "chat.completion" : "text_completion",
                             "created", (json_int_t)j->created, "model", j->srv->model_name, "choices", choices, "usage",
                             usage_json(j));
    /* a prefill server's answer to do_remote_decode: where the decode server finds the prompt's KV
       (null: nothing held); the request has one choice (srv_parse_kv_transfer_params) */
    if (root && j->req.kv_transfer_set && j->req.kv_transfer.do_remote_decode && j->n_seqs == 1) {
        const osp_kv_transfer_info ki = srv_engine_kv_transfer_info(j->srv);
        pthread_mutex_lock(&j->mu);
        const uint64_t tid = j->seqs[0].kv_transfer_id;
        const int32_t nb = j->seqs[0].kv_transfer_num_blocks;
        pthread_mutex_unlock(&j->mu);
        json_object_set_new(root, "kv_transfer_params", srv_json_kv_transfer_params(&ki, tid, nb));
    }
    return root;
}

/* The logprobs of the tokens consumed since choice i's last chunk (NULL: none or not asked). */
static json_t *lp_since(srv_job *j, srv_seq *s) {
    json_t *lp = NULL;
    if (j->req.logprobs >= 0) {
        const size_t n = logprobs_count(j, s);
        if (n > s->lp_sent) lp = logprobs_slice(j, s, s->lp_sent);
        s->lp_sent = n;
    }
    return lp;
}

static json_t *chunk_of(srv_job *j, json_t *choice) {
    const bool chat = j->req.route == SRV_ROUTE_CHAT;
    json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", j->id, "object",
                          chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)j->created, "model",
                          j->srv->model_name, "choices", choice);
    if (c && j->req.include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

json_t *srv_json_chunk_delta(srv_job *j, int32_t i, json_t *delta, const char *finish) {
    json_t *lp = lp_since(j, &j->seqs[i]);
    return chunk_of(j, json_pack("{s:i, s:o, s:o, s:o}", "index", i, "delta", delta ? delta : json_object(), "logprobs",
                                 lp ? lp : json_null(), "finish_reason", finish ? json_string(finish) : json_null()));
}

/* A chunk for choice i: text piece (or NULL) and finish reason (or NULL). */
json_t *srv_json_chunk(srv_job *j, int32_t i, const char *text, size_t len, const char *finish, bool role) {
    const bool chat = j->req.route == SRV_ROUTE_CHAT;
    srv_seq *s = &j->seqs[i];
    json_t *choice, *lp = NULL;
    if (chat) {
        json_t *delta = json_object();
        if (role) json_object_set_new(delta, "role", json_string("assistant"));
        if (text) json_object_set_new(delta, "content", json_stringn(text, len));
        if (role) return chunk_of(j, json_pack("{s:i, s:o, s:n, s:n}", "index", i, "delta", delta, "logprobs", "finish_reason"));
        return srv_json_chunk_delta(j, i, delta, finish);
    }
    if (!role) lp = lp_since(j, s); /* the logprobs of the tokens consumed since the last chunk */
    {
        choice = json_pack("{s:i, s:s%, s:o, s:o}", "index", i, "text", text ? text : "", text ? len : 0, "logprobs",
                           lp ? lp : json_null(), "finish_reason", finish ? json_string(finish) : json_null());
    }
    return chunk_of(j, choice);
}

json_t *srv_json_usage_chunk(const srv_job *j) {
    return json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", j->id, "object",
                     j->req.route == SRV_ROUTE_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)j->created, "model", j->srv->model_name, "choices", "usage", usage_json(j));
}
