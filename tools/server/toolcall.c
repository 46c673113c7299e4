/* Tool calling and reasoning for /v1/chat/completions (issue 19): the request's tool fields, and the
 * model's text split into reasoning, content and OpenAI tool calls.
 *
 * Two ways a reply becomes tool calls, as in vLLM:
 *   tool_choice auto      the model writes calls in its own format and a parser (--tool-call-parser:
 *                         hermes, llama3_json, mistral) finds them in the finished text;
 *   required / named      the reply is generated under a grammar (the structured-output machinery:
 *                         JSON Schema -> GBNF) whose sentences are the calls' JSON, so any model,
 *                         parser or not, answers with calls whose arguments follow the tool's schema.
 * Reasoning (--reasoning-parser deepseek_r1, qwen3) is split off first; the tool parse sees the rest.
 * Everything below srv_parse_tools is a pure function over text, driven by the unit tests and the
 * libFuzzer target (tests/fuzz/fuzz_toolcall.c). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "osprey_internal.h"
#include "server.h"

/* ---- names --------------------------------------------------------------------------------- */

int srv_tool_parser_from_name(const char *name, srv_tool_parser *out) {
    if (!name) return -1;
    if (!strcmp(name, "hermes")) *out = SRV_TOOL_PARSER_HERMES;
    else if (!strcmp(name, "llama3_json")) *out = SRV_TOOL_PARSER_LLAMA3_JSON;
    else if (!strcmp(name, "mistral")) *out = SRV_TOOL_PARSER_MISTRAL;
    else return -1;
    return 0;
}

int srv_reasoning_parser_from_name(const char *name, srv_reasoning_parser *out) {
    if (!name) return -1;
    if (!strcmp(name, "deepseek_r1")) *out = SRV_REASONING_DEEPSEEK_R1;
    else if (!strcmp(name, "qwen3")) *out = SRV_REASONING_QWEN3;
    else return -1;
    return 0;
}

/* ---- the request's tool fields ------------------------------------------------------------- */

static const json_t *get(const json_t *o, const char *k) {
    const json_t *v = json_object_get(o, k);
    return v && !json_is_null(v) ? v : NULL;
}

/* OpenAI's function names: 1..64 of [A-Za-z0-9_-] (dots and colons too, as vLLM lets them through). */
static bool name_ok(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if (!isalnum((unsigned char)s[n]) && !strchr("_-.:", s[n])) return false;
    return n >= 1 && n <= 64;
}

static const json_t *find_tool(const json_t *tools, const char *name) {
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        if (!strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")), name)) return t;
    }
    return NULL;
}

/* The schema a forced choice is generated under (new ref). named: the function's parameters (an
 * object of any members when it has none); required: an array of 1.. (1 when !parallel) calls, each
 * {"name": one of the tools, "parameters": that tool's schema} (vLLM's _get_json_schema_from_tool). */
static json_t *forced_schema(const json_t *tools, srv_tool_choice choice, const char *name, bool parallel) {
    if (choice == SRV_TOOL_CHOICE_NAMED) {
        const json_t *p = get(json_object_get(find_tool(tools, name), "function"), "parameters");
        return p ? json_deep_copy(p) : json_pack("{s:s}", "type", "object");
    }
    json_t *any = json_array();
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        const json_t *p = get(f, "parameters");
        json_t *one = json_pack("{s:s, s:{s:{s:s, s:[s]}, s:o}, s:[s, s]}", "type", "object", "properties", "name",
                                "type", "string", "enum", json_string_value(json_object_get(f, "name")), "parameters",
                                p ? json_deep_copy(p) : json_pack("{s:s}", "type", "object"), "required", "name",
                                "parameters");
        if (!one || json_array_append_new(any, one)) {
            json_decref(any);
            return NULL;
        }
    }
    json_t *items = json_array_size(any) == 1 ? json_incref(json_array_get(any, 0)) : json_pack("{s:O}", "anyOf", any);
    json_decref(any);
    json_t *s = json_pack("{s:s, s:i, s:o}", "type", "array", "minItems", 1, "items", items);
    if (s && !parallel) json_object_set_new(s, "maxItems", json_integer(1));
    return s;
}

int srv_parse_tools(const json_t *root, const srv_parse_limits *lim, srv_gen_request *r, srv_error *err) {
    r->parallel_tool_calls = true;
    r->tool_parser = lim ? lim->tool_parser : SRV_TOOL_PARSER_NONE;
    if (srv_get_bool(root, "parallel_tool_calls", &r->parallel_tool_calls, err)) return -1;
    const json_t *tools = get(root, "tools"), *tc = get(root, "tool_choice");
    if (tools) {
        if (!json_is_array(tools)) return srv_fail(err, 400, "tools", "'tools' must be a list of tools");
        if (json_array_size(tools) > 1024) return srv_fail(err, 400, "tools", "at most 1024 tools");
        size_t i;
        const json_t *t;
        json_array_foreach(tools, i, t) {
            const json_t *type = json_object_get(t, "type"), *f = json_object_get(t, "function");
            if (!json_is_object(t) || !json_is_string(type) || strcmp(json_string_value(type), "function"))
                return srv_fail(err, 400, "tools", "tools[%zu] must be {\"type\": \"function\", \"function\": {...}}", i);
            if (!json_is_object(f)) return srv_fail(err, 400, "tools", "tools[%zu].function must be an object", i);
            const json_t *name = json_object_get(f, "name"), *p = get(f, "parameters"), *d = get(f, "description");
            if (!json_is_string(name) || !name_ok(json_string_value(name)))
                return srv_fail(err, 400, "tools", "tools[%zu].function.name must be 1-64 letters, digits, '_' or '-'", i);
            if (p && !json_is_object(p))
                return srv_fail(err, 400, "tools", "tools[%zu].function.parameters must be a JSON Schema object", i);
            if (d && !json_is_string(d)) return srv_fail(err, 400, "tools", "tools[%zu].function.description must be a string", i);
            const json_t *strict = get(f, "strict");
            if (strict && !json_is_boolean(strict))
                return srv_fail(err, 400, "tools", "tools[%zu].function.strict must be a boolean", i);
            for (size_t k = 0; k < i; k++)
                if (!strcmp(json_string_value(json_object_get(json_object_get(json_array_get(tools, k), "function"), "name")),
                            json_string_value(name)))
                    return srv_fail(err, 400, "tools", "tools[%zu]: the function name '%s' is given twice", i,
                                    json_string_value(name));
        }
        if (json_array_size(tools) > 0 && !(r->tools = json_deep_copy(tools))) return srv_fail(err, 500, NULL, "out of memory");
    }
    /* tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name"}}; absent:
     * auto with tools, none without (OpenAI's defaults) */
    r->tool_choice = r->tools ? SRV_TOOL_CHOICE_AUTO : SRV_TOOL_CHOICE_NONE;
    if (tc) {
        if (json_is_string(tc)) {
            const char *s = json_string_value(tc);
            if (!strcmp(s, "none")) r->tool_choice = SRV_TOOL_CHOICE_NONE;
            else if (!strcmp(s, "auto")) r->tool_choice = SRV_TOOL_CHOICE_AUTO;
            else if (!strcmp(s, "required")) r->tool_choice = SRV_TOOL_CHOICE_REQUIRED;
            else return srv_fail(err, 400, "tool_choice", "'tool_choice' must be none, auto, required or a named function");
        } else if (json_is_object(tc)) {
            const json_t *type = json_object_get(tc, "type"), *f = json_object_get(tc, "function");
            const char *name = json_string_value(json_object_get(f, "name"));
            if (!json_is_string(type) || strcmp(json_string_value(type), "function") || !name)
                return srv_fail(err, 400, "tool_choice", "a named 'tool_choice' is {\"type\": \"function\", \"function\": {\"name\": ...}}");
            r->tool_choice = SRV_TOOL_CHOICE_NAMED;
            if (!(r->tool_name = strdup(name))) return srv_fail(err, 500, NULL, "out of memory");
        } else {
            return srv_fail(err, 400, "tool_choice", "'tool_choice' must be a string or an object");
        }
    }
    if (r->tool_choice != SRV_TOOL_CHOICE_NONE && !r->tools) {
        if (r->tool_choice == SRV_TOOL_CHOICE_AUTO && tc) r->tool_choice = SRV_TOOL_CHOICE_NONE; /* auto, no tools */
        else return srv_fail(err, 400, "tool_choice", "'tool_choice' needs 'tools'");
    }
    if (r->tool_choice == SRV_TOOL_CHOICE_NAMED && !find_tool(r->tools, r->tool_name))
        return srv_fail(err, 400, "tool_choice", "tool_choice names the function '%.64s', which is not in 'tools'", r->tool_name);
    if (r->tool_choice == SRV_TOOL_CHOICE_AUTO && !(lim && lim->auto_tool_choice && lim->tool_parser != SRV_TOOL_PARSER_NONE))
        return srv_fail(err, 400, "tool_choice",
                        "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set");
    if (r->tool_choice != SRV_TOOL_CHOICE_REQUIRED && r->tool_choice != SRV_TOOL_CHOICE_NAMED) return 0;
    if (r->grammar)
        return srv_fail(err, 400, "tool_choice", "tool_choice '%s' and structured output ('response_format', 'guided_*') cannot be combined",
                        r->tool_choice == SRV_TOOL_CHOICE_NAMED ? "named" : "required");
    json_t *schema = forced_schema(r->tools, r->tool_choice, r->tool_name, r->parallel_tool_calls);
    char *text = schema ? json_dumps(schema, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(schema);
    if (!text) return srv_fail(err, 500, NULL, "out of memory");
    char *g = NULL;
    osp_status st = osp_json_schema_to_gbnf(text, strlen(text), &g);
    free(text);
    if (st == OSP_OK) { /* the grammar must compile, so a bad one never reaches the engine */
        osp_grammar *cg = NULL;
        st = osp_grammar_parse(g, strlen(g), NULL, &cg);
        osp_grammar_free(cg);
    }
    if (st != OSP_OK) {
        free(g);
        return srv_fail(err, st == OSP_ERR_NOMEM ? 500 : 400, "tools", "tools: a function's parameters: %s", osp_last_error());
    }
    r->grammar = g;
    return 0;
}

/* ---- reasoning ----------------------------------------------------------------------------- */

static const char k_think[] = "<think>", k_end_think[] = "</think>";

/* The longest proper prefix of `tag` that text[len] ends with (bytes to hold back while streaming). */
static size_t partial_suffix(const char *text, size_t len, const char *tag) {
    const size_t tl = strlen(tag);
    for (size_t k = tl - 1 < len ? tl - 1 : len; k > 0; k--)
        if (!memcmp(text + len - k, tag, k)) return k;
    return 0;
}

void srv_reasoning_split(srv_reasoning_parser p, const char *text, size_t len, bool final, srv_span *reasoning,
                         srv_span *content) {
    *reasoning = (srv_span){0, 0};
    *content = (srv_span){0, len};
    if (p == SRV_REASONING_NONE) return;
    const size_t tl = sizeof k_think - 1, el = sizeof k_end_think - 1;
    size_t start = 0;
    if (len >= tl && !memcmp(text, k_think, tl)) start = tl;
    else if (len < tl && !memcmp(text, k_think, len) && !final) { /* maybe the start of <think>: wait */
        *content = (srv_span){0, 0};
        return;
    } else if (p == SRV_REASONING_QWEN3) {
        return; /* no <think>: all content */
    }
    const char *e = memmem(text + start, len - start, k_end_think, el);
    if (e) {
        const size_t eo = (size_t)(e - text);
        *reasoning = (srv_span){start, eo - start};
        *content = (srv_span){eo + el, len - eo - el};
        return;
    }
    const size_t hold = final ? 0 : partial_suffix(text + start, len - start, k_end_think);
    *reasoning = (srv_span){start, len - start - hold};
    *content = (srv_span){len, 0};
}

/* ---- tool-call output ---------------------------------------------------------------------- */

void srv_tool_result_free(srv_tool_result *r) {
    free(r->content);
    json_decref(r->calls);
    *r = (srv_tool_result){0};
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void srv_tool_call_id(srv_tool_parser p, uint64_t seed, size_t index, char *out, size_t cap) {
    static const char k_alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t x = seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(index + 1));
    const bool mistral = p == SRV_TOOL_PARSER_MISTRAL;
    const size_t n = mistral ? 9 : 24;
    size_t w = 0;
    if (!mistral && cap > 5) memcpy(out, "call_", 5), w = 5;
    for (size_t i = 0; i < n && w + 1 < cap; i++) out[w++] = k_alnum[splitmix64(&x) % 62];
    if (cap) out[w] = 0;
}

/* Appends {"id", "type": "function", "function": {"name", "arguments"}} to calls; args: an object
 * (written as compact JSON text) or a string (kept). 0, or -1. */
static int add_call(json_t *calls, srv_tool_parser p, uint64_t seed, const char *name, const json_t *args) {
    char id[40];
    srv_tool_call_id(p, seed, json_array_size(calls), id, sizeof id);
    char *a = !args ? strdup("{}")
            : json_is_string(args) ? strdup(json_string_value(args))
                                   : json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
    if (!a) return -1;
    json_t *c = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name", name,
                          "arguments", a);
    free(a);
    return c && !json_array_append_new(calls, c) ? 0 : -1;
}

/* One call object {"name": str, "arguments"|"parameters": object|string}: appends it; 1 when it is
 * not such an object, -1 when out of memory. */
static int add_call_obj(json_t *calls, srv_tool_parser p, uint64_t seed, const json_t *o) {
    const json_t *name = json_object_get(o, "name");
    if (!json_is_object(o) || !json_is_string(name)) return 1;
    const json_t *args = get(o, "arguments");
    if (!args) args = get(o, "parameters");
    if (args && !json_is_object(args) && !json_is_string(args)) return 1;
    return add_call(calls, p, seed, json_string_value(name), args) ? -1 : 0;
}

static bool all_space(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isspace((unsigned char)s[i])) return false;
    return true;
}

/* content = text[len] unless it is only whitespace; calls kept when non-empty. */
static int finish_result(srv_tool_result *out, const char *content, size_t clen, json_t *calls) {
    if (calls && json_array_size(calls) == 0) {
        json_decref(calls);
        calls = NULL;
    }
    out->calls = calls;
    if (clen && !all_space(content, clen)) {
        if (!(out->content = strndup(content, clen))) return -1;
        if (all_space(out->content, strlen(out->content))) { /* blank up to a NUL byte */
            free(out->content);
            out->content = NULL;
        }
    }
    return 0;
}

static size_t skip_space(const char *s, size_t i, size_t len) {
    while (i < len && isspace((unsigned char)s[i])) i++;
    return i;
}

/* hermes: content around <tool_call>JSON</tool_call> blocks (the last may be unterminated). */
static int parse_hermes(const char *text, size_t len, uint64_t seed, srv_tool_result *out, json_t *calls) {
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    const size_t ol = sizeof open - 1, cl = sizeof close - 1;
    char *content = malloc(len + 1);
    if (!content) return -1;
    size_t clen = 0, pos = 0;
    for (;;) {
        const char *o = memmem(text + pos, len - pos, open, ol);
        const size_t before_end = o ? (size_t)(o - text) : len;
        memcpy(content + clen, text + pos, before_end - pos);
        clen += before_end - pos;
        if (!o) break;
        const size_t b = before_end + ol;
        const char *c = memmem(text + b, len - b, close, cl);
        const size_t be = c ? (size_t)(c - text) : len;
        json_error_t je;
        json_t *obj = json_loadb(text + b, be - b, JSON_DECODE_ANY, &je);
        const int rc = obj ? add_call_obj(calls, SRV_TOOL_PARSER_HERMES, seed, obj) : 1;
        json_decref(obj);
        if (rc) { /* a block that is not a call: the whole reply is content */
            free(content);
            json_decref(calls);
            return rc < 0 ? -1 : finish_result(out, text, len, NULL);
        }
        pos = c ? be + cl : len;
    }
    const int rc = finish_result(out, content, clen, calls);
    free(content);
    return rc;
}

/* A sequence of JSON values at text[pos, len), separated by ';' or whitespace: each a call object or a
 * list of them (mistral's form). Returns 0 with the calls appended and *end past the last value, 1
 * when something there is not a call, -1 when out of memory. */
static int parse_json_calls(srv_tool_parser p, const char *text, size_t len, size_t pos, uint64_t seed, json_t *calls,
                            size_t *end) {
    for (;;) {
        pos = skip_space(text, pos, len);
        if (pos >= len || (text[pos] != '{' && text[pos] != '[')) break;
        json_error_t je;
        json_t *v = json_loadb(text + pos, len - pos, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &je);
        if (!v) return 1;
        int rc = 0;
        if (json_is_array(v)) {
            size_t i;
            const json_t *o;
            json_array_foreach(v, i, o) if (!rc) rc = add_call_obj(calls, p, seed, o);
            if (json_array_size(v) == 0) rc = 1;
        } else {
            rc = add_call_obj(calls, p, seed, v);
        }
        json_decref(v);
        if (rc) return rc;
        pos += je.position;
        pos = skip_space(text, pos, len);
        if (pos < len && text[pos] == ';') pos++;
    }
    *end = pos;
    return 0;
}

/* llama3_json: the reply (after an optional <|python_tag|>) is one or more call objects separated
 * by ';'; anything else is content. */
static int parse_llama3(const char *text, size_t len, uint64_t seed, srv_tool_result *out, json_t *calls) {
    static const char tag[] = "<|python_tag|>";
    size_t pos = skip_space(text, 0, len);
    if (len - pos >= sizeof tag - 1 && !memcmp(text + pos, tag, sizeof tag - 1)) pos += sizeof tag - 1;
    pos = skip_space(text, pos, len);
    size_t end = 0;
    const int rc = pos < len && text[pos] == '{' ? parse_json_calls(SRV_TOOL_PARSER_LLAMA3_JSON, text, len, pos, seed, calls, &end) : 1;
    if (rc || json_array_size(calls) == 0) {
        json_decref(calls);
        return rc < 0 ? -1 : finish_result(out, text, len, NULL);
    }
    return finish_result(out, text + end, len - end, calls);
}

/* mistral: content, then [TOOL_CALLS] and a JSON list of calls (older tokenizers), or one or more
 * "[TOOL_CALLS]name[ARGS]{...}" (v11+ tokenizers). */
static int parse_mistral(const char *text, size_t len, uint64_t seed, srv_tool_result *out, json_t *calls) {
    static const char tag[] = "[TOOL_CALLS]", args_tag[] = "[ARGS]";
    const size_t tl = sizeof tag - 1, al = sizeof args_tag - 1;
    const char *t = memmem(text, len, tag, tl);
    if (!t) {
        json_decref(calls);
        return finish_result(out, text, len, NULL);
    }
    const size_t head = (size_t)(t - text);
    size_t pos = head, end = len;
    int rc = 0;
    while (!rc && pos < len) {
        if (len - pos >= tl && !memcmp(text + pos, tag, tl)) pos += tl;
        else break;
        pos = skip_space(text, pos, len);
        if (pos < len && (text[pos] == '[' || text[pos] == '{')) {
            rc = parse_json_calls(SRV_TOOL_PARSER_MISTRAL, text, len, pos, seed, calls, &end);
            pos = end;
            continue;
        }
        const char *a = memmem(text + pos, len - pos, args_tag, al);
        if (!a) {
            rc = 1;
            break;
        }
        size_t nl = (size_t)(a - (text + pos));
        while (nl > 0 && isspace((unsigned char)text[pos + nl - 1])) nl--;
        char *name = strndup(text + pos, nl);
        if (!name) rc = -1;
        else if (!name_ok(name)) rc = 1;
        size_t ap = (size_t)(a - text) + al;
        json_error_t je;
        json_t *v = rc ? NULL : json_loadb(text + ap, len - ap, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &je);
        if (!rc && (!v || !json_is_object(v))) rc = 1;
        if (!rc && add_call(calls, SRV_TOOL_PARSER_MISTRAL, seed, name, v)) rc = -1;
        if (!rc) pos = end = skip_space(text, ap + je.position, len);
        json_decref(v);
        free(name);
    }
    if (rc || json_array_size(calls) == 0) {
        json_decref(calls);
        return rc < 0 ? -1 : finish_result(out, text, len, NULL);
    }
    /* content: before the first [TOOL_CALLS] and whatever follows the calls */
    char *content = malloc(head + (len - end) + 1);
    if (!content) {
        json_decref(calls);
        return -1;
    }
    memcpy(content, text, head);
    memcpy(content + head, text + end, len - end);
    rc = finish_result(out, content, head + (len - end), calls);
    free(content);
    return rc;
}

int srv_tool_parse(srv_tool_parser p, const char *text, size_t len, uint64_t id_seed, srv_tool_result *out) {
    *out = (srv_tool_result){0};
    json_t *calls = json_array();
    if (!calls) return -1;
    switch (p) {
    case SRV_TOOL_PARSER_HERMES: return parse_hermes(text, len, id_seed, out, calls);
    case SRV_TOOL_PARSER_LLAMA3_JSON: return parse_llama3(text, len, id_seed, out, calls);
    case SRV_TOOL_PARSER_MISTRAL: return parse_mistral(text, len, id_seed, out, calls);
    default: json_decref(calls); return finish_result(out, text, len, NULL);
    }
}

int srv_tool_parse_forced(srv_tool_choice choice, const char *name, const char *text, size_t len, uint64_t id_seed,
                          srv_tool_result *out) {
    *out = (srv_tool_result){0};
    json_t *calls = json_array();
    if (!calls) return -1;
    if (choice == SRV_TOOL_CHOICE_NAMED) {
        json_t *args = json_stringn(text, len); /* the generated arguments, as they are */
        if (!args) { /* not UTF-8 (never from the detokenizer): no call */
            json_decref(calls);
            return finish_result(out, text, len, NULL);
        }
        const int rc = name ? add_call(calls, SRV_TOOL_PARSER_NONE, id_seed, name, args) : -1;
        json_decref(args);
        if (rc) {
            json_decref(calls);
            return -1;
        }
        out->calls = calls;
        return 0;
    }
    json_error_t je;
    json_t *v = json_loadb(text, len, 0, &je);
    int rc = json_is_array(v) && json_array_size(v) > 0 ? 0 : 1;
    size_t i;
    const json_t *o;
    if (!rc) json_array_foreach(v, i, o) if (!rc) rc = add_call_obj(calls, SRV_TOOL_PARSER_NONE, id_seed, o);
    json_decref(v);
    if (rc) {
        json_decref(calls);
        return rc < 0 ? -1 : finish_result(out, text, len, NULL);
    }
    return finish_result(out, NULL, 0, calls);
}

size_t srv_tool_content_prefix(srv_tool_parser p, const char *text, size_t len) {
    const char *tag = p == SRV_TOOL_PARSER_HERMES ? "<tool_call>" : p == SRV_TOOL_PARSER_MISTRAL ? "[TOOL_CALLS]" : NULL;
    if (tag) {
        const char *t = memmem(text, len, tag, strlen(tag));
        return t ? (size_t)(t - text) : len - partial_suffix(text, len, tag);
    }
    if (p == SRV_TOOL_PARSER_LLAMA3_JSON) { /* a reply that opens with '{' or <|python_tag|> may be calls */
        static const char tag3[] = "<|python_tag|>";
        const size_t pos = skip_space(text, 0, len);
        if (pos == len || text[pos] == '{') return 0;
        const size_t rest = len - pos < sizeof tag3 - 1 ? len - pos : sizeof tag3 - 1;
        if (!memcmp(text + pos, tag3, rest)) return 0;
        return len;
    }
    return len;
}
