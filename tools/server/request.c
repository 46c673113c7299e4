/* Request parsing for /v1/completions and /v1/chat/completions: a JSON body becomes a validated
 * srv_gen_request, or an OpenAI-style 400 naming the field.
 *
 * Field meanings follow OpenAI's API and vLLM's extensions (vllm/entrypoints/openai/protocol.py):
 * JSON null means "not given"; integers may also be integral reals (as pydantic's lax mode takes them);
 * a field it does not read is a 400 naming it, but for OpenAI's advisory ones (k_advisory), kept by name
 * for the debug log. Nothing here
 * touches the engine, the tokenizer or the network, so the libFuzzer target drives it directly. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

int srv_fail(srv_error *err, int status, const char *param, const char *fmt, ...) {
    if (!err) return -1;
    err->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    return -1;
}

static const char *error_type(int status) {
    switch (status) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 404: return "NotFoundError";
    case 405: return "MethodNotAllowed";
    case 413: return "RequestEntityTooLarge";
    case 503: return "ServiceUnavailableError";
    default: return "InternalServerError";
    }
}

/* Copies `in` to out[cap] as valid UTF-8: every byte that does not start a well-formed sequence
 * (overlong, surrogate, past U+10FFFF, cut short) becomes U+FFFD. Error messages quote request bytes
 * and may be cut mid-character by snprintf; jansson refuses strings that are not valid UTF-8. */
static void utf8_sanitize(const char *in, char *out, size_t cap) {
    const unsigned char *p = (const unsigned char *)in;
    size_t o = 0;
    while (*p && o + 4 < cap) {
        const unsigned c = p[0];
        size_t len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
                   : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        for (size_t i = 1; i < len; i++)
            if ((p[i] & 0xC0) != 0x80) len = 0;
        if (len == 3 && ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] > 0x9F))) len = 0;
        if (len == 4 && ((c == 0xF0 && p[1] < 0x90) || (c == 0xF4 && p[1] > 0x8F))) len = 0;
        if (len == 0) {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            p++;
        } else {
            memcpy(out + o, p, len);
            o += len;
            p += len;
        }
    }
    out[o] = '\0';
}

char *srv_error_json(const srv_error *err) {
    char msg[sizeof err->message * 3 + 4], param[sizeof err->param * 3 + 4];
    utf8_sanitize(err->message, msg, sizeof msg);
    utf8_sanitize(err->param, param, sizeof param);
    json_t *e = json_pack("{s:s, s:s, s:o, s:i}", "message", msg, "type", error_type(err->status),
                          "param", param[0] ? json_string(param) : json_null(), "code", err->status);
    json_t *root = json_pack("{s:o}", "error", e);
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

/* ---- typed field getters ------------------------------------------------------------------- */

static const json_t *field(const json_t *obj, const char *key) {
    const json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

int srv_get_int(const json_t *obj, const char *key, long long lo, long long hi, long long *out, srv_error *err) {
    const json_t *v = field(obj, key);
    if (!v) return 0;
    long long x;
    if (json_is_integer(v)) {
        x = (long long)json_integer_value(v);
    } else if (json_is_real(v)) {
        const double d = json_real_value(v);
        if (!(d == floor(d)) || d < -9.2e18 || d > 9.2e18)
            return srv_fail(err, 400, key, "'%s' must be an integer", key);
        x = (long long)d;
    } else {
        return srv_fail(err, 400, key, "'%s' must be an integer", key);
    }
    if (x < lo || x > hi) return srv_fail(err, 400, key, "'%s' must be in [%lld, %lld], got %lld", key, lo, hi, x);
    *out = x;
    return 0;
}

static int get_float(const json_t *obj, const char *key, double lo, double hi, bool lo_open, float *out,
                     srv_error *err) {
    const json_t *v = field(obj, key);
    if (!v) return 0;
    if (!json_is_number(v)) return srv_fail(err, 400, key, "'%s' must be a number", key);
    const double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
        return srv_fail(err, 400, key, "'%s' must be in %s%g, %g], got %g", key, lo_open ? "(" : "[", lo, hi, x);
    *out = (float)x;
    return 0;
}

int srv_get_bool(const json_t *obj, const char *key, bool *out, srv_error *err) {
    const json_t *v = field(obj, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return srv_fail(err, 400, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

static int get_string(const json_t *obj, const char *key, char **out, srv_error *err) {
    const json_t *v = field(obj, key);
    if (!v) return 0;
    if (!json_is_string(v)) return srv_fail(err, 400, key, "'%s' must be a string", key);
    *out = strdup(json_string_value(v));
    return *out ? 0 : srv_fail(err, 500, NULL, "out of memory");
}

/* An array of token ids, each in [0, n_vocab). */
static int get_ids(const json_t *arr, const char *key, int32_t n_vocab, bool allow_empty, int32_t **ids, int32_t *n,
                   srv_error *err) {
    const size_t len = json_array_size(arr);
    if (len == 0 && !allow_empty) return srv_fail(err, 400, key, "'%s' must not be empty", key);
    if (len > (1u << 24)) return srv_fail(err, 400, key, "'%s' is too long", key);
    *ids = malloc(sizeof(int32_t) * (len ? len : 1));
    if (!*ids) return srv_fail(err, 500, NULL, "out of memory");
    *n = (int32_t)len;
    for (size_t i = 0; i < len; i++) {
        const json_t *x = json_array_get(arr, i);
        if (!json_is_integer(x)) return srv_fail(err, 400, key, "'%s' must hold integer token ids", key);
        const json_int_t id = json_integer_value(x);
        if (id < 0 || id >= n_vocab)
            return srv_fail(err, 400, key, "token id %lld in '%s' is outside the vocabulary [0, %d)", (long long)id, key,
                            n_vocab);
        (*ids)[i] = (int32_t)id;
    }
    return 0;
}

/* ---- prompt, messages, stop, logit_bias ---------------------------------------------------- */

/* `key` ("prompt", or "input" for embeddings): a string, a list of strings, token ids, or lists of
 * token ids -> r->prompts. */
static int parse_prompt(const json_t *root, const char *key, const srv_parse_limits *lim, srv_gen_request *r, srv_error *err) {
    const json_t *p = field(root, key);
    if (!p) return srv_fail(err, 400, key, "'%s' is required", key);
    if (json_is_string(p)) {
        if (json_string_length(p) == 0) return srv_fail(err, 400, key, "'%s' must not be empty", key);
        r->prompts = calloc(1, sizeof(srv_prompt));
        if (!r->prompts || !(r->prompts[0].text = strdup(json_string_value(p))))
            return srv_fail(err, 500, NULL, "out of memory");
        r->n_prompts = 1;
        return 0;
    }
    if (!json_is_array(p)) return srv_fail(err, 400, key, "'%s' must be a string, a list of strings or token ids", key);
    const size_t n = json_array_size(p);
    if (n == 0) return srv_fail(err, 400, key, "'%s' must not be empty", key);
    const json_t *first = json_array_get(p, 0);
    if (json_is_integer(first)) { /* one prompt as token ids */
        r->prompts = calloc(1, sizeof(srv_prompt));
        if (!r->prompts) return srv_fail(err, 500, NULL, "out of memory");
        r->n_prompts = 1;
        return get_ids(p, key, lim->n_vocab, false, &r->prompts[0].ids, &r->prompts[0].n_ids, err);
    }
    if (n > SRV_MAX_N) return srv_fail(err, 400, key, "at most %d %ss per request", SRV_MAX_N, key);
    r->prompts = calloc(n, sizeof(srv_prompt));
    if (!r->prompts) return srv_fail(err, 500, NULL, "out of memory");
    r->n_prompts = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(p, i);
        if (json_is_string(x)) {
            if (json_string_length(x) == 0) return srv_fail(err, 400, key, "'%s' must not hold empty strings", key);
            if (!(r->prompts[i].text = strdup(json_string_value(x)))) return srv_fail(err, 500, NULL, "out of memory");
        } else if (json_is_array(x)) {
            if (get_ids(x, key, lim->n_vocab, false, &r->prompts[i].ids, &r->prompts[i].n_ids, err)) return -1;
        } else {
            return srv_fail(err, 400, key, "'%s' must be a string, a list of strings or token ids", key);
        }
    }
    return 0;
}

static int norm_tool_fields(const json_t *msg, const char *role, size_t i, json_t *norm, srv_error *err);

static int parse_messages(const json_t *root, srv_gen_request *r, srv_error *err) {
    const json_t *m = field(root, "messages");
    if (!m) return srv_fail(err, 400, "messages", "'messages' is required");
    if (!json_is_array(m)) return srv_fail(err, 400, "messages", "'messages' must be a list");
    if (json_array_size(m) == 0) return srv_fail(err, 400, "messages", "'messages' must not be empty");
    return srv_messages_normalize(m, &r->messages, err);
}

static int normalize_into(const json_t *m, json_t *out, srv_error *err);

int srv_messages_normalize(const json_t *m, json_t **out, srv_error *err) {
    *out = NULL;
    if (!json_is_array(m)) return srv_fail(err, 400, "messages", "'messages' must be a list");
    json_t *norm = json_array();
    if (!norm) return srv_fail(err, 500, NULL, "out of memory");
    if (normalize_into(m, norm, err)) {
        json_decref(norm);
        return -1;
    }
    *out = norm;
    return 0;
}

/* Appends the normalized form of each message of m to out (see srv_messages_normalize). */
static int normalize_into(const json_t *m, json_t *out, srv_error *err) {
    size_t i;
    const json_t *msg;
    json_array_foreach(m, i, msg) {
        if (!json_is_object(msg)) return srv_fail(err, 400, "messages", "messages[%zu] must be an object", i);
        const json_t *role = json_object_get(msg, "role");
        if (!json_is_string(role)) return srv_fail(err, 400, "messages", "messages[%zu].role must be a string", i);
        const char *rs = json_string_value(role);
        if (strcmp(rs, "system") && strcmp(rs, "developer") && strcmp(rs, "user") && strcmp(rs, "assistant") &&
            strcmp(rs, "tool"))
            return srv_fail(err, 400, "messages", "messages[%zu].role '%.40s' is not system, developer, user, assistant or tool",
                            i, rs);
        const json_t *c = json_object_get(msg, "content");
        json_t *text = NULL;
        if (json_is_string(c)) {
            text = json_string(json_string_value(c));
        } else if (json_is_array(c)) {
            size_t j, total = 0;
            const json_t *part;
            json_array_foreach(c, j, part) {
                const json_t *type = json_object_get(part, "type"), *t = json_object_get(part, "text");
                if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") ||
                    !json_is_string(t))
                    return srv_fail(err, 400, "messages", "messages[%zu].content[%zu] must be a text part {\"type\": \"text\", \"text\": ...}",
                                    i, j);
                total += json_string_length(t) + 1;
            }
            char *buf = malloc(total + 1), *w = buf;
            if (!buf) return srv_fail(err, 500, NULL, "out of memory");
            json_array_foreach(c, j, part) {
                const json_t *t = json_object_get(part, "text");
                if (j) *w++ = '\n';
                memcpy(w, json_string_value(t), json_string_length(t));
                w += json_string_length(t);
            }
            *w = 0;
            text = json_stringn(buf, (size_t)(w - buf));
            free(buf);
        } else if ((c == NULL || json_is_null(c)) && !strcmp(rs, "assistant")) {
            text = json_string("");
        } else {
            return srv_fail(err, 400, "messages", "messages[%zu].content must be a string or a list of text parts", i);
        }
        json_t *norm = json_object();
        if (!text || !norm || json_object_set_new(norm, "role", json_string(rs)) ||
            json_object_set_new(norm, "content", text) || json_array_append_new(out, norm)) {
            json_decref(norm);
            return srv_fail(err, 500, NULL, "out of memory");
        }
        const json_t *name = json_object_get(msg, "name");
        if (json_is_string(name)) json_object_set_new(norm, "name", json_string(json_string_value(name)));
        if (norm_tool_fields(msg, rs, i, norm, err)) return -1;
    }
    return 0;
}

/* The tool fields of a message, copied into its normalized form: an assistant's tool_calls
 * [{"id", "type": "function", "function": {"name", "arguments"}}] with arguments given as JSON text
 * turned into the object (templates iterate over them, as vLLM hands them over), and a tool
 * message's tool_call_id. */
static int norm_tool_fields(const json_t *msg, const char *role, size_t i, json_t *norm, srv_error *err) {
    const json_t *tcid = json_object_get(msg, "tool_call_id");
    if (tcid && !json_is_null(tcid)) {
        if (!json_is_string(tcid)) return srv_fail(err, 400, "messages", "messages[%zu].tool_call_id must be a string", i);
        json_object_set_new(norm, "tool_call_id", json_string(json_string_value(tcid)));
    }
    const json_t *calls = json_object_get(msg, "tool_calls");
    if (!calls || json_is_null(calls)) return 0;
    if (strcmp(role, "assistant") || !json_is_array(calls))
        return srv_fail(err, 400, "messages", "messages[%zu].tool_calls must be a list, on an assistant message", i);
    json_t *out = json_array();
    if (!out || json_object_set_new(norm, "tool_calls", out)) return srv_fail(err, 500, NULL, "out of memory");
    size_t k;
    const json_t *c;
    json_array_foreach(calls, k, c) {
        const json_t *f = json_object_get(c, "function"), *id = json_object_get(c, "id"), *type = json_object_get(c, "type");
        const json_t *name = json_object_get(f, "name"), *args = json_object_get(f, "arguments");
        if (!json_is_object(c) || !json_is_object(f) || !json_is_string(name) ||
            (type && !json_is_null(type) && (!json_is_string(type) || strcmp(json_string_value(type), "function"))) ||
            (id && !json_is_null(id) && !json_is_string(id)) || (args && !json_is_string(args) && !json_is_object(args)))
            return srv_fail(err, 400, "messages",
                            "messages[%zu].tool_calls[%zu] must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}", i, k);
        json_t *a;
        if (json_is_string(args)) {
            json_error_t je;
            a = json_loads(json_string_value(args), 0, &je);
            if (!json_is_object(a)) {
                json_decref(a);
                return srv_fail(err, 400, "messages", "messages[%zu].tool_calls[%zu].function.arguments is not a JSON object", i, k);
            }
        } else {
            a = args ? json_deep_copy(args) : json_object();
        }
        json_t *e = json_pack("{s:s, s:{s:s, s:o}}", "type", "function", "function", "name", json_string_value(name),
                              "arguments", a);
        if (e && json_is_string(id)) json_object_set_new(e, "id", json_string(json_string_value(id)));
        if (!e || json_array_append_new(out, e)) return srv_fail(err, 500, NULL, "out of memory");
    }
    return 0;
}

static int parse_stop(const json_t *root, srv_gen_request *r, srv_error *err) {
    const json_t *s = field(root, "stop");
    if (!s) return 0;
    size_t n = 1;
    if (json_is_array(s)) n = json_array_size(s);
    else if (!json_is_string(s)) return srv_fail(err, 400, "stop", "'stop' must be a string or a list of strings");
    if (n > SRV_MAX_STOPS) return srv_fail(err, 400, "stop", "at most %d stop strings", SRV_MAX_STOPS);
    r->stop = calloc(n ? n : 1, sizeof(char *));
    if (!r->stop) return srv_fail(err, 500, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_is_array(s) ? json_array_get(s, i) : s;
        if (!json_is_string(x)) return srv_fail(err, 400, "stop", "'stop' must be a string or a list of strings");
        if (json_string_length(x) == 0) continue; /* an empty stop string can never be meant */
        if (json_string_length(x) > SRV_MAX_STOP_LEN)
            return srv_fail(err, 400, "stop", "stop strings are at most %d bytes", SRV_MAX_STOP_LEN);
        if (!(r->stop[r->n_stop++] = strdup(json_string_value(x)))) return srv_fail(err, 500, NULL, "out of memory");
    }
    return 0;
}

static int parse_logit_bias(const json_t *root, const srv_parse_limits *lim, srv_gen_request *r, srv_error *err) {
    const json_t *b = field(root, "logit_bias");
    if (!b) return 0;
    if (!json_is_object(b)) return srv_fail(err, 400, "logit_bias", "'logit_bias' must be an object of token id -> bias");
    const size_t n = json_object_size(b);
    if (n > 1024) return srv_fail(err, 400, "logit_bias", "at most 1024 logit_bias entries");
    r->bias_ids = malloc(sizeof(int32_t) * (n ? n : 1));
    r->bias_values = malloc(sizeof(float) * (n ? n : 1));
    if (!r->bias_ids || !r->bias_values) return srv_fail(err, 500, NULL, "out of memory");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)b, key, v) {
        char *end;
        const long long id = strtoll(key, &end, 10);
        if (end == key || *end || id < 0 || id >= lim->n_vocab)
            return srv_fail(err, 400, "logit_bias", "logit_bias key '%.32s' is not a token id in [0, %d)", key, lim->n_vocab);
        if (!json_is_number(v) || !isfinite(json_number_value(v)))
            return srv_fail(err, 400, "logit_bias", "logit_bias values must be numbers");
        double x = json_number_value(v);
        x = x < -100 ? -100 : x > 100 ? 100 : x; /* OpenAI's range; vLLM clamps the same way */
        r->bias_ids[r->n_bias] = (int32_t)id;
        r->bias_values[r->n_bias++] = (float)x;
    }
    return 0;
}

/* ---- the request --------------------------------------------------------------------------- */

/* OpenAI's fields that only inform (they change no token of the reply): accepted, logged at debug level */
static const char *const k_advisory[] = {"metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key"};

static const char *const k_known[] = {
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
    "min_p", "seed", "n", "stop", "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens",
    "logit_bias", "stream", "stream_options", "logprobs", "top_logprobs", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "echo", "skip_special_tokens", "add_generation_prompt",
    "continue_final_message", "chat_template", "chat_template_kwargs", "user", "cache_salt",
    "response_format", "guided_json", "guided_grammar", "guided_choice", "guided_regex", "guided_decoding_backend",
    "guided_whitespace_pattern", "structured_outputs", "kv_transfer_params",
};

/* /v1/embeddings (the request's fields: server.h). */
static int parse_embeddings(const json_t *root, const srv_parse_limits *lim, srv_gen_request *r, srv_error *err) {
    if (parse_prompt(root, "input", lim, r, err)) return -1;
    const json_t *ef = field(root, "encoding_format");
    if (ef) {
        const char *f = json_is_string(ef) ? json_string_value(ef) : NULL;
        if (!f || (strcmp(f, "float") && strcmp(f, "base64")))
            return srv_fail(err, 400, "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
        r->embd_base64 = !strcmp(f, "base64");
    }
    long long x = 0;
    if (srv_get_int(root, "dimensions", 1, INT32_MAX, &x, err)) return -1;
    if (field(root, "dimensions"))
        return srv_fail(err, 400, "dimensions",
                        "'dimensions' is not supported by this model: its embeddings have a fixed size of %d (it was "
                        "not trained with Matryoshka representations, so a shortened vector would lose quality)",
                        lim->n_embd);
    if (get_string(root, "user", &r->user, err)) return -1;
    static const char *const known[] = {"model", "input", "encoding_format", "dimensions", "user"};
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)root, key, v) {
        bool ok = json_is_null(v);
        for (size_t k = 0; k < sizeof known / sizeof *known && !ok; k++) ok = !strcmp(key, known[k]);
        if (!ok) return srv_fail(err, 400, key, "'%.100s' is not supported by this server on /v1/embeddings", key);
    }
    return 0;
}

int srv_parse_gen_request(const char *body, size_t len, srv_route route, const srv_parse_limits *lim,
                          srv_gen_request *r, srv_error *err) {
    memset(r, 0, sizeof *r);
    r->route = route;
    r->max_tokens = -1;
    r->n = 1;
    r->temperature = 1.0f;
    r->top_p = 1.0f;
    r->top_k = -1;
    r->repetition_penalty = 1.0f;
    r->skip_special_tokens = true;
    r->add_generation_prompt = true;
    r->logprobs = -1;

    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!root) return srv_fail(err, 400, NULL, "malformed JSON: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
    int rc = -1;
    if (!json_is_object(root)) {
        srv_fail(err, 400, NULL, "the request body must be a JSON object");
        goto done;
    }
    long long x;
    if (get_string(root, "model", &r->model, err)) goto done;
    if (route == SRV_ROUTE_EMBEDDINGS) {
        rc = parse_embeddings(root, lim, r, err);
        goto done;
    }
    if (route == SRV_ROUTE_COMPLETIONS ? parse_prompt(root, "prompt", lim, r, err) : parse_messages(root, r, err)) goto done;

    x = -1;
    /* 0 only with echo on /v1/completions (checked below, once echo is read): the prompt alone */
    if (srv_get_int(root, "max_tokens", 0, INT32_MAX, &x, err)) goto done;
    if (srv_get_int(root, "max_completion_tokens", 1, INT32_MAX, &x, err)) goto done;
    r->max_tokens = (int32_t)x;
    x = 1;
    if (srv_get_int(root, "n", 1, SRV_MAX_N, &x, err)) goto done;
    r->n = (int32_t)x;
    if ((long long)r->n * (r->n_prompts ? r->n_prompts : 1) > SRV_MAX_N) {
        srv_fail(err, 400, "n", "n times the number of prompts must be at most %d", SRV_MAX_N);
        goto done;
    }
    if (get_float(root, "temperature", 0, 100, false, &r->temperature, err)) goto done;
    if (get_float(root, "top_p", 0, 1, true, &r->top_p, err)) goto done;
    if (get_float(root, "min_p", 0, 1, false, &r->min_p, err)) goto done;
    if (get_float(root, "presence_penalty", -2, 2, false, &r->presence_penalty, err)) goto done;
    if (get_float(root, "frequency_penalty", -2, 2, false, &r->frequency_penalty, err)) goto done;
    if (get_float(root, "repetition_penalty", 0, 100, true, &r->repetition_penalty, err)) goto done;
    x = -1;
    if (srv_get_int(root, "top_k", -1, INT32_MAX, &x, err)) goto done;
    r->top_k = (int32_t)x;
    if (field(root, "seed")) {
        if (srv_get_int(root, "seed", INT64_MIN, INT64_MAX, &x, err)) goto done;
        r->seed = (uint64_t)x;
        r->seed_set = true;
    }
    if (parse_stop(root, r, err)) goto done;
    const json_t *sti = field(root, "stop_token_ids");
    if (sti) {
        if (!json_is_array(sti)) {
            srv_fail(err, 400, "stop_token_ids", "'stop_token_ids' must be a list of token ids");
            goto done;
        }
        if (get_ids(sti, "stop_token_ids", lim->n_vocab, true, &r->stop_token_ids, &r->n_stop_token_ids, err)) goto done;
    }
    if (srv_get_bool(root, "include_stop_str_in_output", &r->include_stop_str_in_output, err)) goto done;
    if (srv_get_bool(root, "ignore_eos", &r->ignore_eos, err)) goto done;
    if (srv_get_bool(root, "skip_special_tokens", &r->skip_special_tokens, err)) goto done;
    if (srv_get_bool(root, "echo", &r->echo, err)) goto done;
    if (srv_get_bool(root, "stream", &r->stream, err)) goto done;
    if (srv_get_bool(root, "add_generation_prompt", &r->add_generation_prompt, err)) goto done;
    if (srv_get_bool(root, "continue_final_message", &r->continue_final_message, err)) goto done;
    if (r->add_generation_prompt && r->continue_final_message && field(root, "add_generation_prompt")) {
        srv_fail(err, 400, "continue_final_message", "'continue_final_message' and 'add_generation_prompt' cannot both be true");
        goto done;
    }
    if (r->continue_final_message) r->add_generation_prompt = false;
    x = 0;
    if (srv_get_int(root, "min_tokens", 0, INT32_MAX, &x, err)) goto done;
    r->min_tokens = (int32_t)x;
    if (r->max_tokens == 0 && !(r->echo && route == SRV_ROUTE_COMPLETIONS)) {
        srv_fail(err, 400, "max_tokens", "'max_tokens' must be at least 1 (0 only with 'echo' on /v1/completions)");
        goto done;
    }
    if (r->max_tokens >= 0 && r->min_tokens > r->max_tokens) {
        srv_fail(err, 400, "min_tokens", "'min_tokens' (%d) must not exceed 'max_tokens' (%d)", r->min_tokens, r->max_tokens);
        goto done;
    }
    const json_t *so = field(root, "stream_options");
    if (so) {
        if (!json_is_object(so)) {
            srv_fail(err, 400, "stream_options", "'stream_options' must be an object");
            goto done;
        }
        if (!r->stream) {
            srv_fail(err, 400, "stream_options", "'stream_options' is only allowed when 'stream' is true");
            goto done;
        }
        if (srv_get_bool(so, "include_usage", &r->include_usage, err)) goto done;
    }
    if (parse_logit_bias(root, lim, r, err)) goto done;
    if (srv_parse_structured(root, r, err)) goto done;
    if (route == SRV_ROUTE_CHAT) {
        if (srv_parse_tools(root, lim, r, err)) goto done;
        r->reasoning_parser = lim->reasoning_parser;
        /* mistral's [TOOL_CALLS] is a special token: keep it in the text for the parser (as vLLM) */
        if (r->tool_choice == SRV_TOOL_CHOICE_AUTO && r->tool_parser == SRV_TOOL_PARSER_MISTRAL) r->skip_special_tokens = false;
    }
    /* logprobs: an integer 0..20 for completions; a boolean plus top_logprobs 0..20 for chat */
    if (route == SRV_ROUTE_COMPLETIONS) {
        x = -1;
        if (srv_get_int(root, "logprobs", 0, SRV_MAX_LOGPROBS, &x, err)) goto done;
        r->logprobs = (int32_t)x;
    } else {
        bool lp = false;
        if (srv_get_bool(root, "logprobs", &lp, err)) goto done;
        x = 0;
        if (srv_get_int(root, "top_logprobs", 0, SRV_MAX_LOGPROBS, &x, err)) goto done;
        if (x > 0 && !lp) {
            srv_fail(err, 400, "top_logprobs", "'top_logprobs' needs 'logprobs' to be true");
            goto done;
        }
        r->logprobs = lp ? (int32_t)x : -1;
    }
    if (get_string(root, "user", &r->user, err)) goto done;
    if (get_string(root, "cache_salt", &r->cache_salt, err)) goto done;
    if (get_string(root, "chat_template", &r->chat_template, err)) goto done;
    const json_t *kw = field(root, "chat_template_kwargs");
    if (kw) {
        if (!json_is_object(kw)) {
            srv_fail(err, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
            goto done;
        }
        r->chat_template_kwargs = json_deep_copy(kw);
    }
    if (r->cache_salt && !r->cache_salt[0]) {
        srv_fail(err, 400, "cache_salt", "'cache_salt' must not be empty");
        goto done;
    }
    if (srv_parse_kv_transfer_params(root, lim->kv_role, r, err)) goto done; /* after stream, n, the prompts */

    /* Fields this parser does not read: a 400 naming the field (a field accepted and ignored would change
     * what the client asked for without a word: tools, best_of, ...), except OpenAI's advisory fields,
     * which change no output (README: "Fields accepted with no effect"), kept for the debug log; a null
     * value is "not given"; the tool fields are the chat route's (on /v1/completions only "no tools",
     * tools [] or tool_choice "none", passes). */
    const char *key;
    json_t *v;
    r->unknown = calloc(json_object_size(root) + 1, sizeof(char *));
    if (!r->unknown) {
        srv_fail(err, 500, NULL, "out of memory");
        goto done;
    }
    json_object_foreach(root, key, v) {
        bool known = false, advisory = false;
        for (size_t k = 0; k < sizeof k_known / sizeof *k_known && !known; k++) known = !strcmp(key, k_known[k]);
        for (size_t k = 0; k < sizeof k_advisory / sizeof *k_advisory && !advisory; k++)
            advisory = !strcmp(key, k_advisory[k]);
        if (known) continue;
        const bool tool_field = !strcmp(key, "tools") || !strcmp(key, "tool_choice") || !strcmp(key, "parallel_tool_calls");
        if (tool_field && route == SRV_ROUTE_CHAT) continue; /* srv_parse_tools read them */
        const bool no_tools = (!strcmp(key, "tools") && json_is_array(v) && json_array_size(v) == 0) ||
                              (!strcmp(key, "tool_choice") && json_is_string(v) && !strcmp(json_string_value(v), "none"));
        if (!advisory && !json_is_null(v) && !no_tools) {
            srv_fail(err, 400, key, "'%.100s' is not supported by this server", key);
            goto done;
        }
        r->unknown[r->n_unknown++] = strdup(key);
    }
    rc = 0;
done:
    json_decref(root);
    return rc;
}

void srv_gen_request_free(srv_gen_request *r) {
    if (!r) return;
    free(r->model);
    for (int32_t i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    json_decref(r->messages);
    free(r->chat_template);
    json_decref(r->chat_template_kwargs);
    for (int32_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->stop_token_ids);
    free(r->bias_ids);
    free(r->bias_values);
    free(r->user);
    free(r->cache_salt);
    free(r->grammar);
    json_decref(r->tools);
    free(r->tool_name);
    for (int32_t i = 0; i < r->n_unknown; i++) free(r->unknown[i]);
    free(r->unknown);
    json_decref(r->resp_echo);
    json_decref(r->resp_conversation);
    memset(r, 0, sizeof *r);
}
