/* Structured-output fields of a generation request -> one GBNF grammar for the engine (issue 19).
 *
 * Accepted, as OpenAI and vLLM name them (at most one kind per request):
 *   response_format: {"type": "text"} (nothing), {"type": "json_object"} (any JSON object),
 *                    {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}
 *   vLLM: guided_json (a schema, object or string), guided_grammar (GBNF text), guided_choice (a list of
 *         strings), and structured_outputs {"json" | "grammar" | "choice" | "json_object": true}
 *         (guided_decoding_backend is accepted and has no effect: there is one backend)
 * Refused with a 400 naming the field: guided_regex / structured_outputs.regex (no regex compiler yet),
 * guided_whitespace_pattern, unknown response_format types, schemas with keywords the compiler cannot
 * enforce (src/grammar/json_schema.c), grammars that do not parse. The grammar is compiled here once so
 * a bad one never reaches the engine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "osprey_internal.h"
#include "server.h"

static const json_t *get(const json_t *o, const char *k) {
    const json_t *v = json_object_get(o, k);
    return v && !json_is_null(v) ? v : NULL;
}

/* GBNF for "one of these strings" (guided_choice): root ::= "a" | "b" ... */
static char *choice_gbnf(const json_t *arr, srv_error *err, const char *param) {
    if (!json_is_array(arr) || json_array_size(arr) == 0) {
        srv_fail(err, 400, param, "'%s' must be a non-empty list of strings", param);
        return NULL;
    }
    size_t cap = 16;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const char *s = json_string_value(json_array_get(arr, i));
        if (!s) {
            srv_fail(err, 400, param, "'%s' must be a non-empty list of strings", param);
            return NULL;
        }
        cap += strlen(s) * 4 + 8;
    }
    char *g = malloc(cap), *w = g;
    if (!g) {
        srv_fail(err, 500, NULL, "out of memory");
        return NULL;
    }
    w += sprintf(w, "root ::=");
    for (size_t i = 0; i < json_array_size(arr); i++) {
        w += sprintf(w, i ? " | \"" : " \"");
        for (const unsigned char *s = (const unsigned char *)json_string_value(json_array_get(arr, i)); *s; s++) {
            if (*s == '"' || *s == '\\') *w++ = '\\', *w++ = (char)*s;
            else if (*s < 0x20 || *s == 0x7F) w += sprintf(w, "\\x%02X", *s);
            else *w++ = (char)*s;
        }
        *w++ = '"';
    }
    *w++ = '\n';
    *w = 0;
    return g;
}

/* GBNF of a JSON schema given as an object or as a JSON string. */
static char *schema_gbnf(const json_t *schema, srv_error *err, const char *param) {
    char *text = json_is_string(schema) ? strdup(json_string_value(schema))
                                        : json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
    if (!text) {
        srv_fail(err, 500, NULL, "out of memory");
        return NULL;
    }
    char *g = NULL;
    const osp_status st = osp_json_schema_to_gbnf(text, strlen(text), &g);
    free(text);
    if (st != OSP_OK) {
        srv_fail(err, st == OSP_ERR_NOMEM ? 500 : 400, param, "%s", osp_last_error());
        return NULL;
    }
    return g;
}

static char *dup_or_fail(const char *s, srv_error *err) {
    char *d = strdup(s);
    if (!d) srv_fail(err, 500, NULL, "out of memory");
    return d;
}

int srv_parse_structured(const json_t *root, srv_gen_request *r, srv_error *err) {
    const char *kind = NULL; /* the field that set the grammar, for "only one" */
    char *g = NULL;
    const json_t *v;
#define ONE(name)                                                                                                      \
    do {                                                                                                               \
        if (kind) {                                                                                                    \
            free(g);                                                                                                   \
            return srv_fail(err, 400, name, "'%s' and '%s' both ask for structured output; give one", kind, name);     \
        }                                                                                                              \
        kind = name;                                                                                                   \
    } while (0)
    if ((v = get(root, "guided_regex"))) return srv_fail(err, 400, "guided_regex", "'guided_regex' is not supported yet");
    if ((v = get(root, "guided_whitespace_pattern")))
        return srv_fail(err, 400, "guided_whitespace_pattern", "'guided_whitespace_pattern' is not supported");
    if ((v = get(root, "guided_decoding_backend")) && !json_is_string(v))
        return srv_fail(err, 400, "guided_decoding_backend", "'guided_decoding_backend' must be a string");
    if ((v = get(root, "response_format"))) {
        const char *t = json_is_object(v) ? json_string_value(json_object_get(v, "type")) : NULL;
        if (!t) return srv_fail(err, 400, "response_format", "'response_format' must be an object with a string 'type'");
        if (strcmp(t, "text") == 0) {
        } else if (strcmp(t, "json_object") == 0) {
            ONE("response_format");
            if (!(g = dup_or_fail(osp_json_object_gbnf(), err))) return -1;
        } else if (strcmp(t, "json_schema") == 0) {
            const json_t *js = get(v, "json_schema");
            if (!json_is_object(js) || !get(js, "schema"))
                return srv_fail(err, 400, "response_format", "'response_format' of type json_schema needs 'json_schema': {'name', 'schema'}");
            const json_t *strict = get(js, "strict");
            if (strict && !json_is_boolean(strict)) return srv_fail(err, 400, "response_format", "'json_schema.strict' must be a boolean");
            ONE("response_format");
            if (!(g = schema_gbnf(get(js, "schema"), err, "response_format"))) return -1;
        } else
            return srv_fail(err, 400, "response_format", "unknown 'response_format' type '%.64s' (text, json_object or json_schema)", t);
    }
    if ((v = get(root, "guided_json"))) {
        ONE("guided_json");
        if (!(g = schema_gbnf(v, err, "guided_json"))) return -1;
    }
    if ((v = get(root, "guided_grammar"))) {
        ONE("guided_grammar");
        if (!json_is_string(v)) return srv_fail(err, 400, "guided_grammar", "'guided_grammar' must be a string (GBNF)");
        if (!(g = dup_or_fail(json_string_value(v), err))) return -1;
    }
    if ((v = get(root, "guided_choice"))) {
        ONE("guided_choice");
        if (!(g = choice_gbnf(v, err, "guided_choice"))) return -1;
    }
    if ((v = get(root, "structured_outputs"))) {
        if (!json_is_object(v)) {
            free(g);
            return srv_fail(err, 400, "structured_outputs", "'structured_outputs' must be an object");
        }
        const char *key;
        const json_t *x;
        json_object_foreach((json_t *)v, key, x) {
            if (json_is_null(x)) continue;
            if (strcmp(key, "json") == 0) {
                ONE("structured_outputs.json");
                if (!(g = schema_gbnf(x, err, "structured_outputs"))) return -1;
            } else if (strcmp(key, "grammar") == 0) {
                ONE("structured_outputs.grammar");
                if (!json_is_string(x)) return srv_fail(err, 400, "structured_outputs", "'structured_outputs.grammar' must be a string (GBNF)");
                if (!(g = dup_or_fail(json_string_value(x), err))) return -1;
            } else if (strcmp(key, "choice") == 0) {
                ONE("structured_outputs.choice");
                if (!(g = choice_gbnf(x, err, "structured_outputs"))) return -1;
            } else if (strcmp(key, "json_object") == 0) {
                if (!json_is_boolean(x)) {
                    free(g);
                    return srv_fail(err, 400, "structured_outputs", "'structured_outputs.json_object' must be a boolean");
                }
                if (json_is_true(x)) {
                    ONE("structured_outputs.json_object");
                    if (!(g = dup_or_fail(osp_json_object_gbnf(), err))) return -1;
                }
            } else {
                free(g);
                return srv_fail(err, 400, "structured_outputs", "'structured_outputs.%.64s' is not supported", key);
            }
        }
    }
#undef ONE
    if (!g) return 0;
    osp_grammar *cg = NULL;
    const osp_status st = osp_grammar_parse(g, strlen(g), NULL, &cg);
    osp_grammar_free(cg);
    if (st != OSP_OK) {
        srv_fail(err, st == OSP_ERR_NOMEM ? 500 : 400, kind, "%s", osp_last_error());
        free(g);
        return -1;
    }
    r->grammar = g;
    return 0;
}
