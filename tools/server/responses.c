/* /v1/responses (OpenAI's Responses API, issue 19): the request side and the response store.
 *
 * A Responses body is checked field by field and turned into the chat route's terms, so one
 * machinery serves both: `input` items become chat messages (function_call items an assistant
 * message's tool_calls, function_call_output items tool messages), `instructions` a leading system
 * message, the flat function tools {"type": "function", "name", "parameters"} the chat's nested
 * {"type": "function", "function": {...}}, `text.format` the chat's response_format,
 * `max_output_tokens` max_completion_tokens. srv_parse_gen_request then applies every chat rule
 * (sampling ranges, tool_choice, structured output through structured.c and toolcall.c). Nothing
 * here touches the engine or the network, so the libFuzzer target (tests/fuzz/fuzz_responses.c)
 * drives the parser directly. The store (srv_resp_store) keeps the last N responses for
 * previous_response_id: a bounded LRU in memory, lost on restart, one per API server process.
 * Source: OpenAI's API reference, "Create a model response" and "Streaming events" (Responses). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

static const json_t *get(const json_t *o, const char *k) {
    const json_t *v = json_object_get(o, k);
    return v && !json_is_null(v) ? v : NULL;
}

static int oom(srv_error *err) { return srv_fail(err, 500, NULL, "out of memory"); }

/* ---- input items -> chat messages ---------------------------------------------------------- */

/* An item's keys must all be in allowed[] (a field accepted and dropped would be a lie). */
static int only_keys(const json_t *o, const char *const *allowed, size_t n, const char *where, size_t i, srv_error *err) {
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)o, key, v) {
        bool ok = false;
        for (size_t k = 0; k < n && !ok; k++) ok = !strcmp(key, allowed[k]);
        if (!ok && !json_is_null(v))
            return srv_fail(err, 400, "input", "%s[%zu].%.64s is not supported by this server", where, i, key);
    }
    return 0;
}

/* A message item's content -> a chat content: a string stays; input_text / output_text parts become
 * chat text parts (srv_messages_normalize joins them). New reference, or NULL with *err. */
static json_t *message_content(const json_t *c, const char *role, size_t i, srv_error *err) {
    if (json_is_string(c)) return json_string(json_string_value(c));
    if (!json_is_array(c)) {
        srv_fail(err, 400, "input", "input[%zu].content must be a string or a list of input_text parts", i);
        return NULL;
    }
    json_t *parts = json_array();
    if (!parts) {
        oom(err);
        return NULL;
    }
    size_t k;
    const json_t *p;
    json_array_foreach(c, k, p) {
        const char *type = json_string_value(json_object_get(p, "type"));
        const json_t *text = json_object_get(p, "text");
        if (!json_is_object(p) || !type) {
            srv_fail(err, 400, "input", "input[%zu].content[%zu] must be an object with a string 'type'", i, k);
            goto fail;
        }
        const bool assistant = !strcmp(role, "assistant");
        if (!strcmp(type, "input_text") || (assistant && !strcmp(type, "output_text"))) {
            static const char *const keys_in[] = {"type", "text"};
            static const char *const keys_out[] = {"type", "text", "annotations", "logprobs"};
            if (!json_is_string(text)) {
                srv_fail(err, 400, "input", "input[%zu].content[%zu].text must be a string", i, k);
                goto fail;
            }
            /* an output_text given back (response.output in the next input) carries its annotations
             * and logprobs: they describe the text, they do not change it */
            if (only_keys(p, assistant ? keys_out : keys_in, assistant ? 4 : 2, "input[].content", k, err)) goto fail;
            if (json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", text))) {
                oom(err);
                goto fail;
            }
        } else if (!strcmp(type, "output_text")) {
            srv_fail(err, 400, "input", "input[%zu].content[%zu]: output_text is an assistant message's part; use input_text", i, k);
            goto fail;
        } else {
            srv_fail(err, 400, "input", "input[%zu].content[%zu]: '%.40s' is not supported (text input only)", i, k, type);
            goto fail;
        }
    }
    return parts;
fail:
    json_decref(parts);
    return NULL;
}

/* The assistant message that collects consecutive function_call items (the last message of msgs
 * when it is one), or a new one appended. Borrowed reference, or NULL when out of memory. */
static json_t *call_holder(json_t *msgs, bool *open) {
    json_t *last = json_array_size(msgs) ? json_array_get(msgs, json_array_size(msgs) - 1) : NULL;
    if (*open && last) return last;
    json_t *m = json_pack("{s:s, s:s, s:[]}", "role", "assistant", "content", "", "tool_calls");
    if (!m || json_array_append_new(msgs, m)) return NULL;
    *open = true;
    return m;
}

/* input (a string or a list of items) -> raw chat messages, then normalized. */
static int parse_input(const json_t *input, json_t **out, srv_error *err) {
    *out = NULL;
    json_t *msgs = json_array();
    if (!msgs) return oom(err);
    if (json_is_string(input)) {
        if (json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", json_string_value(input)))) goto nomem;
    } else if (json_is_array(input)) {
        bool calls_open = false; /* the last message collects function_call items */
        size_t i;
        const json_t *it;
        json_array_foreach(input, i, it) {
            if (!json_is_object(it)) {
                srv_fail(err, 400, "input", "input[%zu] must be an object", i);
                goto fail;
            }
            const json_t *tv = get(it, "type");
            if (tv && !json_is_string(tv)) {
                srv_fail(err, 400, "input", "input[%zu].type must be a string", i);
                goto fail;
            }
            const char *type = tv ? json_string_value(tv) : "message";
            if (!strcmp(type, "message")) {
                static const char *const keys[] = {"type", "role", "content", "id", "status"};
                if (only_keys(it, keys, 5, "input", i, err)) goto fail;
                const char *role = json_string_value(json_object_get(it, "role"));
                if (!role || (strcmp(role, "user") && strcmp(role, "system") && strcmp(role, "developer") && strcmp(role, "assistant"))) {
                    srv_fail(err, 400, "input", "input[%zu].role must be user, system, developer or assistant", i);
                    goto fail;
                }
                json_t *content = message_content(json_object_get(it, "content"), role, i, err);
                if (!content) goto fail;
                if (json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", role, "content", content))) goto nomem;
                calls_open = false;
            } else if (!strcmp(type, "function_call")) {
                static const char *const keys[] = {"type", "call_id", "name", "arguments", "id", "status"};
                if (only_keys(it, keys, 6, "input", i, err)) goto fail;
                const json_t *call_id = get(it, "call_id"), *name = get(it, "name"), *args = get(it, "arguments");
                if (!json_is_string(call_id) || !json_is_string(name) || !json_is_string(args)) {
                    srv_fail(err, 400, "input", "input[%zu]: a function_call item needs string 'call_id', 'name' and 'arguments'", i);
                    goto fail;
                }
                json_t *holder = call_holder(msgs, &calls_open);
                if (!holder || json_array_append_new(json_object_get(holder, "tool_calls"),
                                                     json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", call_id, "type", "function",
                                                               "function", "name", name, "arguments", args)))
                    goto nomem;
            } else if (!strcmp(type, "function_call_output")) {
                static const char *const keys[] = {"type", "call_id", "output", "id", "status"};
                if (only_keys(it, keys, 5, "input", i, err)) goto fail;
                const json_t *call_id = get(it, "call_id"), *output = get(it, "output");
                if (!json_is_string(call_id)) {
                    srv_fail(err, 400, "input", "input[%zu]: a function_call_output item needs a string 'call_id'", i);
                    goto fail;
                }
                json_t *content = output ? message_content(output, "tool", i, err) : NULL;
                if (!content) {
                    if (!output) srv_fail(err, 400, "input", "input[%zu]: a function_call_output item needs 'output'", i);
                    goto fail;
                }
                if (json_array_append_new(msgs, json_pack("{s:s, s:o, s:O}", "role", "tool", "content", content, "tool_call_id", call_id)))
                    goto nomem;
                calls_open = false;
            } else if (!strcmp(type, "reasoning")) {
                /* a reasoning item given back: dropped, as the reasoning models' templates drop past turns' reasoning */
                static const char *const keys[] = {"type", "id", "summary", "content", "encrypted_content", "status"};
                if (only_keys(it, keys, 6, "input", i, err)) goto fail;
                if (get(it, "encrypted_content")) {
                    srv_fail(err, 400, "input", "input[%zu]: encrypted reasoning is not supported", i);
                    goto fail;
                }
            } else {
                srv_fail(err, 400, "input", "input[%zu]: item type '%.40s' is not supported (message, function_call, function_call_output)", i,
                         type);
                goto fail;
            }
        }
    } else {
        srv_fail(err, 400, "input", "'input' must be a string or a list of input items");
        goto fail;
    }
    if (json_array_size(msgs) == 0) {
        srv_fail(err, 400, "input", "'input' must not be empty");
        goto fail;
    }
    json_t *norm = NULL;
    const int rc = srv_messages_normalize(msgs, &norm, err);
    json_decref(msgs);
    if (rc) {
        snprintf(err->param, sizeof err->param, "input");
        return -1;
    }
    *out = norm;
    return 0;
nomem:
    oom(err);
fail:
    json_decref(msgs);
    return -1;
}

/* ---- tools, text.format, metadata ---------------------------------------------------------- */

/* Flat function tools -> the chat's nested shape, into chat["tools"]. */
static int convert_tools(const json_t *tools, json_t *chat, srv_error *err) {
    if (!json_is_array(tools)) return srv_fail(err, 400, "tools", "'tools' must be a list of tools");
    json_t *out = json_array();
    if (!out || json_object_set_new(chat, "tools", out)) return oom(err);
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!json_is_object(t) || !type) return srv_fail(err, 400, "tools", "tools[%zu] must be an object with a string 'type'", i);
        if (strcmp(type, "function"))
            return srv_fail(err, 400, "tools", "tools[%zu]: tool type '%.40s' is not supported (only function tools; no built-in tools)", i, type);
        static const char *const keys[] = {"type", "name", "description", "parameters", "strict"};
        const char *key;
        const json_t *v;
        json_object_foreach((json_t *)t, key, v) {
            bool ok = false;
            for (size_t k = 0; k < 5 && !ok; k++) ok = !strcmp(key, keys[k]);
            if (!ok && !json_is_null(v)) return srv_fail(err, 400, "tools", "tools[%zu].%.64s is not supported", i, key);
        }
        json_t *f = json_object();
        if (!f || json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", f))) return oom(err);
        static const char *const copy[] = {"name", "description", "parameters", "strict"};
        for (size_t k = 0; k < 4; k++) {
            const json_t *x = get(t, copy[k]);
            if (x && json_object_set(f, copy[k], (json_t *)x)) return oom(err);
        }
    }
    return 0;
}

/* tool_choice: the strings pass; {"type": "function", "name"} becomes the chat's named form. */
static int convert_tool_choice(const json_t *tc, json_t *chat, srv_error *err) {
    if (json_is_string(tc)) return json_object_set(chat, "tool_choice", (json_t *)tc) ? oom(err) : 0;
    const char *type = json_string_value(json_object_get(tc, "type"));
    const json_t *name = json_object_get(tc, "name");
    if (!json_is_object(tc) || !type) return srv_fail(err, 400, "tool_choice", "'tool_choice' must be a string or an object");
    if (strcmp(type, "function"))
        return srv_fail(err, 400, "tool_choice", "tool_choice type '%.40s' is not supported (none, auto, required or a function)", type);
    if (!json_is_string(name) || json_object_size(tc) != 2)
        return srv_fail(err, 400, "tool_choice", "a named 'tool_choice' is {\"type\": \"function\", \"name\": ...}");
    return json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name)) ? oom(err) : 0;
}

/* text: {"format": {"type": "text" | "json_object" | "json_schema", ...}} -> chat["response_format"]. */
static int convert_text(const json_t *text, json_t *chat, srv_error *err) {
    if (!json_is_object(text)) return srv_fail(err, 400, "text", "'text' must be an object");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)text, key, v) {
        if (strcmp(key, "format") && !json_is_null(v)) return srv_fail(err, 400, "text", "'text.%.64s' is not supported", key);
    }
    const json_t *f = get(text, "format");
    if (!f) return 0;
    const char *type = json_string_value(json_object_get(f, "type"));
    if (!json_is_object(f) || !type) return srv_fail(err, 400, "text.format", "'text.format' must be an object with a string 'type'");
    if (!strcmp(type, "text") || !strcmp(type, "json_object")) {
        if (json_object_size(f) != 1) return srv_fail(err, 400, "text.format", "'text.format' of type %s takes no other field", type);
        return json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", type)) ? oom(err) : 0;
    }
    if (strcmp(type, "json_schema"))
        return srv_fail(err, 400, "text.format", "unknown 'text.format' type '%.40s' (text, json_object or json_schema)", type);
    json_t *js = json_object();
    if (!js || json_object_set_new(chat, "response_format", json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js)))
        return oom(err);
    json_object_foreach((json_t *)f, key, v) {
        if (!strcmp(key, "type") || json_is_null(v)) continue;
        if (strcmp(key, "name") && strcmp(key, "schema") && strcmp(key, "strict") && strcmp(key, "description"))
            return srv_fail(err, 400, "text.format", "'text.format.%.64s' is not supported", key);
        if (json_object_set(js, key, (json_t *)v)) return oom(err);
    }
    if (!get(js, "schema")) return srv_fail(err, 400, "text.format", "'text.format' of type json_schema needs 'schema'");
    return 0;
}

/* OpenAI's limits on metadata: at most 16 pairs, keys up to 64 characters, string values up to 512. */
static int check_metadata(const json_t *m, srv_error *err) {
    if (!json_is_object(m)) return srv_fail(err, 400, "metadata", "'metadata' must be an object of strings");
    if (json_object_size(m) > 16) return srv_fail(err, 400, "metadata", "'metadata' has at most 16 pairs");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)m, key, v) {
        if (strlen(key) > 64) return srv_fail(err, 400, "metadata", "metadata keys have at most 64 characters");
        if (!json_is_string(v) || json_string_length(v) > 512)
            return srv_fail(err, 400, "metadata", "metadata['%.64s'] must be a string of at most 512 characters", key);
    }
    return 0;
}

/* ---- the request --------------------------------------------------------------------------- */

/* Fields refused with a reason of their own (the rest: "not supported by this server"). */
static const struct {
    const char *field, *why;
} k_refused[] = {
    {"reasoning", "reasoning effort is not supported (use --reasoning-parser for reasoning models)"},
    {"background", "background responses are not supported"},
    {"conversation", "conversations are not supported (use previous_response_id)"},
    {"prompt", "prompt templates are not supported"},
    {"max_tool_calls", "'max_tool_calls' is not supported"},
    {"top_logprobs", "logprobs are not supported on /v1/responses (use /v1/chat/completions)"},
    {"stream_options", "'stream_options' is not supported on /v1/responses"},
};

/* Passed to the chat request as they are (the chat parser checks them). */
static const char *const k_pass[] = {"model", "temperature", "top_p", "stream", "user", "parallel_tool_calls"};
/* Accepted with no effect (README: "Fields accepted with no effect"). */
static const char *const k_advisory[] = {"service_tier", "safety_identifier", "prompt_cache_key"};

void srv_responses_request_free(srv_responses_request *rq) {
    if (!rq) return;
    json_decref(rq->chat);
    json_decref(rq->input);
    free(rq->instructions);
    free(rq->previous_response_id);
    json_decref(rq->echo);
    memset(rq, 0, sizeof *rq);
}

int srv_responses_parse(const char *body, size_t len, srv_responses_request *out, srv_error *err) {
    memset(out, 0, sizeof *out);
    out->store = true;
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!root) return srv_fail(err, 400, NULL, "malformed JSON: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
    int rc = -1;
    if (!json_is_object(root)) {
        srv_fail(err, 400, NULL, "the request body must be a JSON object");
        goto done;
    }
    out->chat = json_object();
    out->echo = json_object();
    if (!out->chat || !out->echo) {
        oom(err);
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (json_is_null(v)) continue; /* null: not given */
        bool handled = false;
        for (size_t k = 0; k < sizeof k_pass / sizeof *k_pass && !handled; k++)
            if (!strcmp(key, k_pass[k])) {
                handled = true;
                if (json_object_set(out->chat, key, v)) {
                    oom(err);
                    goto done;
                }
            }
        for (size_t k = 0; k < sizeof k_advisory / sizeof *k_advisory && !handled; k++) handled = !strcmp(key, k_advisory[k]);
        for (size_t k = 0; k < sizeof k_refused / sizeof *k_refused; k++)
            if (!strcmp(key, k_refused[k].field)) {
                srv_fail(err, 400, key, "%s", k_refused[k].why);
                goto done;
            }
        if (handled) continue;
        if (!strcmp(key, "input")) {
            if (parse_input(v, &out->input, err)) goto done;
        } else if (!strcmp(key, "instructions")) {
            if (!json_is_string(v)) {
                srv_fail(err, 400, key, "'instructions' must be a string");
                goto done;
            }
            if (!(out->instructions = strdup(json_string_value(v)))) {
                oom(err);
                goto done;
            }
        } else if (!strcmp(key, "previous_response_id")) {
            if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > 128) {
                srv_fail(err, 400, key, "'previous_response_id' must be a response id");
                goto done;
            }
            if (!(out->previous_response_id = strdup(json_string_value(v)))) {
                oom(err);
                goto done;
            }
        } else if (!strcmp(key, "max_output_tokens")) {
            if (json_object_set(out->chat, "max_completion_tokens", v)) {
                oom(err);
                goto done;
            }
        } else if (!strcmp(key, "store")) {
            if (!json_is_boolean(v)) {
                srv_fail(err, 400, key, "'store' must be a boolean");
                goto done;
            }
            out->store = json_is_true(v);
        } else if (!strcmp(key, "metadata")) {
            if (check_metadata(v, err)) goto done;
        } else if (!strcmp(key, "tools")) {
            if (convert_tools(v, out->chat, err)) goto done;
        } else if (!strcmp(key, "tool_choice")) {
            if (convert_tool_choice(v, out->chat, err)) goto done;
        } else if (!strcmp(key, "text")) {
            if (convert_text(v, out->chat, err)) goto done;
        } else if (!strcmp(key, "truncation")) {
            if (!json_is_string(v) || strcmp(json_string_value(v), "disabled")) {
                srv_fail(err, 400, key, "'truncation' must be \"disabled\" (a prompt past the context is a 400)");
                goto done;
            }
        } else if (!strcmp(key, "include")) {
            if (!json_is_array(v) || json_array_size(v) > 0) {
                srv_fail(err, 400, key, "'include' is not supported (only an empty list)");
                goto done;
            }
        } else {
            srv_fail(err, 400, key, "'%.100s' is not supported by this server", key);
            goto done;
        }
    }
    if (!out->input) {
        srv_fail(err, 400, "input", "'input' is required");
        goto done;
    }
    /* what the response object repeats (OpenAI's defaults where absent) */
    const json_t *x;
    json_t *e = out->echo;
    json_object_set_new(e, "instructions", out->instructions ? json_string(out->instructions) : json_null());
    json_object_set_new(e, "max_output_tokens", (x = get(root, "max_output_tokens")) ? json_deep_copy(x) : json_null());
    json_object_set_new(e, "metadata", (x = get(root, "metadata")) ? json_deep_copy(x) : json_object());
    json_object_set_new(e, "parallel_tool_calls", (x = get(root, "parallel_tool_calls")) ? json_deep_copy(x) : json_true());
    json_object_set_new(e, "previous_response_id", out->previous_response_id ? json_string(out->previous_response_id) : json_null());
    json_object_set_new(e, "store", json_boolean(out->store));
    json_object_set_new(e, "temperature", (x = get(root, "temperature")) ? json_deep_copy(x) : json_real(1.0));
    json_object_set_new(e, "top_p", (x = get(root, "top_p")) ? json_deep_copy(x) : json_real(1.0));
    json_object_set_new(e, "tool_choice", (x = get(root, "tool_choice")) ? json_deep_copy(x) : json_string("auto"));
    json_object_set_new(e, "tools", (x = get(root, "tools")) ? json_deep_copy(x) : json_array());
    json_object_set_new(e, "text", (x = get(get(root, "text"), "format")) ? json_pack("{s:O}", "format", x)
                                                                          : json_pack("{s:{s:s}}", "format", "type", "text"));
    json_object_set_new(e, "truncation", json_string("disabled"));
    json_object_set_new(e, "user", (x = get(root, "user")) ? json_deep_copy(x) : json_null());
    if (json_object_size(e) != 13) {
        oom(err);
        goto done;
    }
    rc = 0;
done:
    json_decref(root);
    return rc;
}

/* A chat parser's param, in Responses terms. */
static void responses_param(srv_error *err) {
    static const struct {
        const char *chat, *resp;
    } map[] = {{"messages", "input"}, {"max_completion_tokens", "max_output_tokens"}, {"max_tokens", "max_output_tokens"},
               {"response_format", "text.format"}, {"prompt", "input"}};
    for (size_t k = 0; k < sizeof map / sizeof *map; k++)
        if (!strcmp(err->param, map[k].chat)) {
            snprintf(err->param, sizeof err->param, "%s", map[k].resp);
            return;
        }
}

int srv_responses_to_chat(const srv_responses_request *rq, const json_t *history, const srv_parse_limits *lim,
                          srv_gen_request *req, srv_error *err) {
    memset(req, 0, sizeof *req);
    json_t *conv = json_array(), *msgs = json_array(), *chat = json_copy(rq->chat);
    char *body = NULL;
    int rc = -1;
    if (!conv || !msgs || !chat) {
        oom(err);
        goto done;
    }
    if (history && (!json_is_array(history) || json_array_extend(conv, (json_t *)history))) {
        srv_fail(err, 500, NULL, "the stored conversation is not a list");
        goto done;
    }
    if (json_array_extend(conv, rq->input)) {
        oom(err);
        goto done;
    }
    if (rq->instructions && json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", rq->instructions))) {
        oom(err);
        goto done;
    }
    if (json_array_extend(msgs, conv) || json_object_set(chat, "messages", msgs) ||
        !(body = json_dumps(chat, JSON_COMPACT))) {
        oom(err);
        goto done;
    }
    if (srv_parse_gen_request(body, strlen(body), SRV_ROUTE_CHAT, lim, req, err)) {
        responses_param(err);
        goto done;
    }
    req->responses = true;
    req->resp_store = rq->store;
    req->resp_conversation = conv;
    conv = NULL;
    if (!(req->resp_echo = json_copy(rq->echo))) {
        oom(err);
        goto done;
    }
    rc = 0;
done:
    free(body);
    json_decref(conv);
    json_decref(msgs);
    json_decref(chat);
    return rc;
}

/* ---- the store ----------------------------------------------------------------------------- */

typedef struct store_entry {
    char *id;
    json_t *response, *conversation;
    struct store_entry *prev, *next; /* most recently used first */
} store_entry;

struct srv_resp_store {
    pthread_mutex_t mu;
    int32_t capacity, size;
    store_entry *head, *tail;
};

srv_resp_store *srv_resp_store_new(int32_t capacity) {
    srv_resp_store *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    pthread_mutex_init(&st->mu, NULL);
    st->capacity = capacity > 0 ? capacity : 0;
    return st;
}

static void entry_free(store_entry *e) {
    free(e->id);
    json_decref(e->response);
    json_decref(e->conversation);
    free(e);
}

static void unlink_entry(srv_resp_store *st, store_entry *e) {
    if (e->prev) e->prev->next = e->next;
    else st->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else st->tail = e->prev;
    e->prev = e->next = NULL;
    st->size--;
}

static void push_front(srv_resp_store *st, store_entry *e) {
    e->prev = NULL;
    e->next = st->head;
    if (st->head) st->head->prev = e;
    st->head = e;
    if (!st->tail) st->tail = e;
    st->size++;
}

/* A linear look-up: N is a flag (hundreds to thousands), and a request does one. */
static store_entry *find(srv_resp_store *st, const char *id) {
    for (store_entry *e = st->head; e; e = e->next)
        if (!strcmp(e->id, id)) return e;
    return NULL;
}

void srv_resp_store_free(srv_resp_store *st) {
    if (!st) return;
    for (store_entry *e = st->head, *n; e; e = n) {
        n = e->next;
        entry_free(e);
    }
    pthread_mutex_destroy(&st->mu);
    free(st);
}

int srv_resp_store_put(srv_resp_store *st, const char *id, json_t *response, json_t *conversation) {
    store_entry *e = calloc(1, sizeof *e);
    if (!e || !(e->id = strdup(id))) {
        free(e);
        json_decref(response);
        json_decref(conversation);
        return -1;
    }
    e->response = response;
    e->conversation = conversation;
    pthread_mutex_lock(&st->mu);
    store_entry *old = find(st, id);
    if (old) {
        unlink_entry(st, old);
        entry_free(old);
    }
    store_entry *drop = NULL;
    if (st->capacity == 0) {
        drop = e;
    } else {
        push_front(st, e);
        if (st->size > st->capacity) {
            drop = st->tail;
            unlink_entry(st, drop);
        }
    }
    pthread_mutex_unlock(&st->mu);
    if (drop) entry_free(drop);
    return 0;
}

int srv_resp_store_get(srv_resp_store *st, const char *id, json_t **response, json_t **conversation) {
    pthread_mutex_lock(&st->mu);
    store_entry *e = find(st, id);
    if (e) {
        unlink_entry(st, e);
        push_front(st, e);
        /* deep copies, made under the lock: what a request holds is its own (entries share message
         * objects with each other, and jansson's reference counts are all that guards them) */
        if (response) *response = json_deep_copy(e->response);
        if (conversation) *conversation = json_deep_copy(e->conversation);
    }
    pthread_mutex_unlock(&st->mu);
    if (e && ((response && !*response) || (conversation && !*conversation))) {
        if (response) json_decref(*response), *response = NULL;
        if (conversation) json_decref(*conversation), *conversation = NULL;
        return -1;
    }
    return e ? 0 : -1;
}

int srv_resp_store_delete(srv_resp_store *st, const char *id) {
    pthread_mutex_lock(&st->mu);
    store_entry *e = find(st, id);
    if (e) unlink_entry(st, e);
    pthread_mutex_unlock(&st->mu);
    if (!e) return -1;
    entry_free(e);
    return 0;
}

int32_t srv_resp_store_size(srv_resp_store *st) {
    pthread_mutex_lock(&st->mu);
    const int32_t n = st->size;
    pthread_mutex_unlock(&st->mu);
    return n;
}
