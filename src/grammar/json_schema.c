/* JSON Schema -> GBNF: one rule per schema (and per $ref target, so recursive schemas work), over a
 * fixed set of JSON rules (value, object, array, string, number, integer, boolean, null, ws).
 *
 * A schema either compiles to a grammar whose every sentence validates against it, or fails naming
 * the keyword it cannot enforce. Keywords that only widen the valid set (additionalProperties: true
 * beside properties, nullable, annotations) are met by generating a subset; keywords that narrow it
 * and have no grammar here (pattern, minimum, multipleOf, uniqueItems, ...) are errors, never ignored.
 *
 * Objects with properties: keys come in the schema's order, required ones always, optional ones
 * maybe, which needs the comma only between present members. With p_1..p_n and "first emitted" /
 * "something emitted before" as the two situations, the members are
 *   A_i = kv_i B_{i+1} | A_{i+1}  (p_i optional)   A_i = kv_i B_{i+1}  (p_i required)
 *   B_i = ("," kv_i)? B_{i+1}     (p_i optional)   B_i = "," kv_i B_{i+1}  (p_i required)
 * B_i is a flat sequence; A_1 has one alternative per optional property before the first required
 * one: O(n^2) elements at worst (n optional properties), fine for real schemas.
 * Source: JSON Schema 2020-12, core (§8.2.3 $ref, §10.2 applicators) and validation (§6). */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"
#include "grammar/grammar_internal.h" /* sbuf */

#define MAX_DEPTH 64 /* schema nesting, $ref chains included */
#define MAX_REFS 1024

/* v is of JSON Schema type `type` (a name or a list of names; NULL: any). "integer" takes integral
 * numbers (1.0 too), "number" any number (JSON Schema 2020-12, section 6.1.1). */
static int value_has_one_type(const json_t *v, const char *t) {
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == (double)(long long)json_real_value(v));
    return 0;
}
static int value_has_type(const json_t *v, const json_t *type) {
    if (!type) return 1;
    if (json_is_string(type)) return value_has_one_type(v, json_string_value(type));
    if (json_is_array(type)) {
        for (size_t i = 0; i < json_array_size(type); i++) {
            const json_t *t = json_array_get(type, i);
            if (json_is_string(t) && value_has_one_type(v, json_string_value(t))) return 1;
        }
        return 0;
    }
    return 1; /* a malformed 'type' is reported where types are compiled */
}

static void sb_fmt(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_fmt(sbuf *b, const char *fmt, ...) {
    char t[256];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    sb_put(b, t, n < (int)sizeof t ? (size_t)n : sizeof t - 1);
}

/* s[0..n) as a GBNF literal, quotes included. */
static void sb_literal(sbuf *b, const char *s, size_t n) {
    sb_str(b, "\"");
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '"') sb_str(b, "\\\"");
        else if (c == '\\') sb_str(b, "\\\\");
        else if (c == '\n') sb_str(b, "\\n");
        else if (c == '\r') sb_str(b, "\\r");
        else if (c == '\t') sb_str(b, "\\t");
        else if (c < 0x20 || c == 0x7F) sb_fmt(b, "\\x%02X", c);
        else sb_put(b, (const char *)&c, 1);
    }
    sb_str(b, "\"");
}

static const char BASE_RULES[] =
    "ws ::= [ \\t\\n]{0,20}\n"
    "value ::= object | array | string | number | boolean | null\n"
    "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? \"}\"\n"
    "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"
    "number ::= integer ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?\n"
    "boolean ::= \"true\" | \"false\"\n"
    "null ::= \"null\"\n";

const char *osp_json_object_gbnf(void) {
    static char text[sizeof BASE_RULES + 32];
    if (!text[0]) snprintf(text, sizeof text, "root ::= object\n%s", BASE_RULES);
    return text;
}

typedef struct jsc {
    json_t *doc;
    sbuf out; /* rules written so far */
    int32_t n_rules;
    struct {
        char *ref;
        int32_t rule;
    } refs[MAX_REFS];
    int32_t n_refs;
    int depth;
    osp_status st;
} jsc;

static int fail(jsc *c, osp_status s, const char *path, const char *fmt, const char *arg) {
    if (c->st != OSP_OK) return -1;
    char what[256];
    snprintf(what, sizeof what, fmt, arg);
    c->st = osp_set_error(s, "json_schema: %s: %s", path, what);
    return -1;
}

static const char *const ANNOTATIONS[] = {"title",    "description", "default",   "examples",   "$schema",
                                          "$id",      "$comment",    "deprecated", "readOnly",  "writeOnly",
                                          "$defs",    "definitions", "nullable",  "discriminator", "$anchor", NULL};
static const char *const HANDLED[] = {"type",     "properties", "required",  "additionalProperties", "items",
                                      "minItems", "maxItems",   "enum",      "const",                "anyOf",
                                      "oneOf",    "allOf",      "$ref",      "minLength",            "maxLength",
                                      "format",   "uniqueItems", NULL};

static int in_list(const char *k, const char *const *l) {
    for (; *l; l++)
        if (strcmp(k, *l) == 0) return 1;
    return 0;
}

static int gen(jsc *c, json_t *s, const char *path, int32_t *rule);

/* A JSON value as a GBNF literal of its compact text. */
static int literal_of(jsc *c, sbuf *b, json_t *v, const char *path) {
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) return fail(c, OSP_ERR_NOMEM, path, "out of memory%s", "");
    sb_literal(b, t, strlen(t));
    free(t);
    return 0;
}

static int64_t get_count(jsc *c, json_t *s, const char *key, int64_t dflt, const char *path) {
    json_t *v = json_object_get(s, key);
    if (!v) return dflt;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > OSP_GRAMMAR_MAX_REPEAT)
        return fail(c, OSP_ERR_UNSUPPORTED, path, "'%s' must be an integer in [0, 100000]", key), -2;
    return json_integer_value(v);
}

static void sb_repeat(sbuf *b, int64_t lo, int64_t hi) {
    if (hi < 0) sb_fmt(b, "{%lld,}", (long long)lo);
    else sb_fmt(b, "{%lld,%lld}", (long long)lo, (long long)hi);
}

/* The rule body for one "type" name with the schema's other keywords. */
static int gen_type(jsc *c, json_t *s, const char *type, const char *path, sbuf *b) {
    char sub[512];
    if (strcmp(type, "null") == 0 || strcmp(type, "boolean") == 0 || strcmp(type, "integer") == 0 ||
        strcmp(type, "number") == 0) {
        sb_str(b, type);
        return 0;
    }
    if (strcmp(type, "string") == 0) {
        json_t *fmt = json_object_get(s, "format");
        if (fmt) {
            const char *f = json_string_value(fmt);
            if (!f) return fail(c, OSP_ERR_INVALID_ARG, path, "'format' must be a string%s", "");
            static const char DATE[] = "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] )";
            static const char TIME[] = "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,9} )? ( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )";
            if (strcmp(f, "date") == 0) sb_fmt(b, "\"\\\"\" %s \"\\\"\"", DATE);
            else if (strcmp(f, "time") == 0) sb_str(b, "\"\\\"\" "), sb_str(b, TIME), sb_str(b, " \"\\\"\"");
            else if (strcmp(f, "date-time") == 0)
                sb_fmt(b, "\"\\\"\" %s \"T\" ", DATE), sb_str(b, TIME), sb_str(b, " \"\\\"\"");
            else if (strcmp(f, "uuid") == 0)
                sb_str(b, "\"\\\"\" [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
                          "[0-9a-fA-F]{12} \"\\\"\"");
            else return fail(c, OSP_ERR_UNSUPPORTED, path, "unsupported string format '%s'", f);
            return 0;
        }
        const int64_t lo = get_count(c, s, "minLength", 0, path), hi = get_count(c, s, "maxLength", -1, path);
        if (lo < -1 || hi < -1) return -1;
        if (hi >= 0 && hi < lo) return fail(c, OSP_ERR_UNSUPPORTED, path, "maxLength below minLength%s", "");
        if (lo == 0 && hi < 0) sb_str(b, "string");
        else {
            sb_str(b, "\"\\\"\" char");
            sb_repeat(b, lo, hi);
            sb_str(b, " \"\\\"\"");
        }
        return 0;
    }
    if (strcmp(type, "array") == 0) {
        json_t *u = json_object_get(s, "uniqueItems");
        if (u && !json_is_false(u)) return fail(c, OSP_ERR_UNSUPPORTED, path, "unsupported keyword '%s'", "uniqueItems");
        const int64_t lo = get_count(c, s, "minItems", 0, path), hi = get_count(c, s, "maxItems", -1, path);
        if (lo < -1 || hi < -1) return -1;
        if (hi >= 0 && hi < lo) return fail(c, OSP_ERR_UNSUPPORTED, path, "maxItems below minItems%s", "");
        json_t *items = json_object_get(s, "items");
        char item[32] = "value";
        if (items) {
            int32_t r;
            snprintf(sub, sizeof sub, "%s/items", path);
            if (gen(c, items, sub, &r)) return -1;
            snprintf(item, sizeof item, "s%d", r);
        }
        if (hi == 0) {
            sb_str(b, "\"[\" ws \"]\"");
            return 0;
        }
        sb_fmt(b, "\"[\" ws ( %s ws ( \",\" ws %s ws )", item, item);
        sb_repeat(b, lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
        sb_str(b, lo > 0 ? " ) \"]\"" : " )? \"]\"");
        return 0;
    }
    if (strcmp(type, "object") == 0) {
        json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
        json_t *addl = json_object_get(s, "additionalProperties");
        if (props && !json_is_object(props)) return fail(c, OSP_ERR_INVALID_ARG, path, "'properties' must be an object%s", "");
        if (req && !json_is_array(req)) return fail(c, OSP_ERR_INVALID_ARG, path, "'required' must be an array%s", "");
        for (size_t i = 0; req && i < json_array_size(req); i++) {
            const char *k = json_string_value(json_array_get(req, i));
            if (!k) return fail(c, OSP_ERR_INVALID_ARG, path, "'required' must list strings%s", "");
            if (!props || !json_object_get(props, k))
                return fail(c, OSP_ERR_UNSUPPORTED, path, "required property '%s' has no schema in 'properties'", k);
        }
        if (!props || json_object_size(props) == 0) {
            if (json_is_false(addl)) sb_str(b, "\"{\" ws \"}\"");
            else if (!addl || json_is_true(addl)) sb_str(b, "object");
            else {
                int32_t r;
                snprintf(sub, sizeof sub, "%s/additionalProperties", path);
                if (gen(c, addl, sub, &r)) return -1;
                sb_fmt(b, "\"{\" ws ( string ws \":\" ws s%d ws ( \",\" ws string ws \":\" ws s%d ws )* )? \"}\"", r, r);
            }
            return 0;
        }
        /* kv_i rules, then A_1 as above */
        const size_t n = json_object_size(props);
        int32_t *kv = malloc(n * sizeof *kv);
        uint8_t *is_req = calloc(n, 1);
        if (!kv || !is_req) return free(kv), free(is_req), fail(c, OSP_ERR_NOMEM, path, "out of memory%s", "");
        const char *key;
        json_t *ps;
        size_t i = 0;
        json_object_foreach(props, key, ps) {
            for (size_t k = 0; req && k < json_array_size(req); k++)
                if (strcmp(json_string_value(json_array_get(req, k)), key) == 0) is_req[i] = 1;
            int32_t r;
            snprintf(sub, sizeof sub, "%s/properties/%.200s", path, key);
            if (gen(c, ps, sub, &r)) return free(kv), free(is_req), -1;
            kv[i] = c->n_rules++;
            sbuf line = {0};
            sb_fmt(&line, "s%d ::= ", kv[i]);
            json_t *ks = json_string(key);
            literal_of(c, &line, ks, path);
            json_decref(ks);
            sb_fmt(&line, " ws \":\" ws s%d ws\n", r);
            if (line.oom) c->st = osp_set_error(OSP_ERR_NOMEM, "json_schema: out of memory");
            else sb_str(&c->out, line.p);
            free(line.p);
            i++;
        }
        sb_str(b, "\"{\" ws ( ");
        size_t first_req = n;
        for (i = 0; i < n; i++)
            if (is_req[i]) {
                first_req = i;
                break;
            }
        for (i = 0; i < n && i <= first_req; i++) {
            if (i) sb_str(b, " | ");
            sb_fmt(b, "s%d", kv[i]);
            for (size_t j = i + 1; j < n; j++) sb_fmt(b, is_req[j] ? " \",\" ws s%d" : " ( \",\" ws s%d )?", kv[j]);
        }
        sb_str(b, first_req == n ? " )? \"}\"" : " ) \"}\"");
        free(kv);
        free(is_req);
        return 0;
    }
    return fail(c, OSP_ERR_UNSUPPORTED, path, "unknown type '%s'", type);
}

/* Writes a rule for schema s; *rule is its number (the rule is named "s<number>"). */
static int gen(jsc *c, json_t *s, const char *path, int32_t *rule) {
    if (c->st != OSP_OK) return -1;
    if (++c->depth > MAX_DEPTH) return fail(c, OSP_ERR_UNSUPPORTED, path, "schema nested too deep%s", "");
    sbuf body = {0};
    char sub[512];
    int rc = 0;
    const int32_t me = c->n_rules++;
    if (json_is_true(s)) {
        sb_str(&body, "value");
        goto done;
    }
    if (json_is_false(s)) {
        rc = fail(c, OSP_ERR_UNSUPPORTED, path, "the schema 'false' accepts nothing%s", "");
        goto done;
    }
    if (!json_is_object(s)) {
        rc = fail(c, OSP_ERR_INVALID_ARG, path, "a schema must be an object or a boolean%s", "");
        goto done;
    }
    const char *key;
    json_t *v;
    int n_constraints = 0;
    json_object_foreach(s, key, v) {
        if (in_list(key, ANNOTATIONS)) continue;
        if (!in_list(key, HANDLED)) {
            rc = fail(c, OSP_ERR_UNSUPPORTED, path, "unsupported keyword '%s'", key);
            goto done;
        }
        n_constraints++;
    }
    json_t *ref = json_object_get(s, "$ref"), *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    json_t *any = json_object_get(s, "anyOf");
    if (!any) any = json_object_get(s, "oneOf");
    json_t *all = json_object_get(s, "allOf");
    if (ref || cst || en || any || all) {
        const char *kw = ref ? "$ref" : cst ? "const" : en ? "enum" : json_object_get(s, "anyOf") ? "anyOf"
                                                        : any ? "oneOf" : "allOf";
        /* const / enum beside "type" are fine: the values carry their type */
        const int allowed = 1 + ((cst || en) && json_object_get(s, "type") ? 1 : 0);
        if (n_constraints > allowed) {
            json_object_foreach(s, key, v) {
                if (in_list(key, ANNOTATIONS) || strcmp(key, kw) == 0 || (allowed == 2 && strcmp(key, "type") == 0)) continue;
                char what[160];
                snprintf(what, sizeof what, "'%.60s' beside '%s' is not supported", key, kw);
                rc = fail(c, OSP_ERR_UNSUPPORTED, path, "%s", what);
                break;
            }
            goto done;
        }
    }
    if (ref) {
        const char *r = json_string_value(ref);
        if (!r || r[0] != '#') {
            rc = fail(c, OSP_ERR_UNSUPPORTED, path, "only '$ref' within the schema ('#...') is supported, not '%s'", r ? r : "?");
            goto done;
        }
        int32_t target = -1;
        for (int32_t i = 0; i < c->n_refs; i++)
            if (strcmp(c->refs[i].ref, r) == 0) target = c->refs[i].rule;
        if (target < 0) {
            json_t *t = c->doc;
            /* JSON pointer (RFC 6901) after '#': /a/b with ~1 = '/', ~0 = '~' */
            for (const char *p = r + 1; *p && t;) {
                if (*p != '/') {
                    t = NULL;
                    break;
                }
                p++;
                char tok[256];
                size_t n = 0;
                for (; *p && *p != '/' && n + 1 < sizeof tok; p++) {
                    if (p[0] == '~' && p[1] == '1') tok[n++] = '/', p++;
                    else if (p[0] == '~' && p[1] == '0') tok[n++] = '~', p++;
                    else tok[n++] = *p;
                }
                tok[n] = 0;
                if (json_is_object(t)) t = json_object_get(t, tok);
                else if (json_is_array(t)) t = json_array_get(t, (size_t)strtoul(tok, NULL, 10));
                else t = NULL;
            }
            if (!t) {
                rc = fail(c, OSP_ERR_INVALID_ARG, path, "'$ref' '%s' points at nothing", r);
                goto done;
            }
            if (c->n_refs == MAX_REFS) {
                rc = fail(c, OSP_ERR_UNSUPPORTED, path, "more than %s distinct $ref targets", "1024");
                goto done;
            }
            /* reserve the target's rule first so recursion finds it */
            target = c->n_rules++;
            c->refs[c->n_refs].ref = strdup(r);
            if (!c->refs[c->n_refs].ref) {
                rc = fail(c, OSP_ERR_NOMEM, path, "out of memory%s", "");
                goto done;
            }
            c->refs[c->n_refs++].rule = target;
            int32_t inner;
            if (gen(c, t, r, &inner)) {
                rc = -1;
                goto done;
            }
            sb_fmt(&c->out, "s%d ::= s%d\n", target, inner);
        }
        sb_fmt(&body, "s%d", target);
        goto done;
    }
    /* const / enum beside "type": only the values of that type (JSON Schema: both must hold) */
    json_t *ty = json_object_get(s, "type");
    if (cst) {
        if (!value_has_type(cst, ty)) {
            rc = fail(c, OSP_ERR_UNSUPPORTED, path, "'const' is not of the schema's 'type': it accepts nothing%s", "");
            goto done;
        }
        rc = literal_of(c, &body, cst, path);
        goto done;
    }
    if (en) {
        if (!json_is_array(en) || json_array_size(en) == 0) {
            rc = fail(c, OSP_ERR_INVALID_ARG, path, "'enum' must be a non-empty array%s", "");
            goto done;
        }
        int n_kept = 0;
        for (size_t i = 0; i < json_array_size(en) && !rc; i++) {
            if (!value_has_type(json_array_get(en, i), ty)) continue;
            if (n_kept++) sb_str(&body, " | ");
            rc = literal_of(c, &body, json_array_get(en, i), path);
        }
        if (!rc && n_kept == 0)
            rc = fail(c, OSP_ERR_UNSUPPORTED, path, "no 'enum' value is of the schema's 'type': it accepts nothing%s", "");
        goto done;
    }
    if (any || all) {
        json_t *list = any ? any : all;
        const char *kw = any ? (json_object_get(s, "anyOf") ? "anyOf" : "oneOf") : "allOf";
        if (!json_is_array(list) || json_array_size(list) == 0) {
            rc = fail(c, OSP_ERR_INVALID_ARG, path, "'%s' must be a non-empty array", kw);
            goto done;
        }
        if (all && json_array_size(list) != 1) {
            rc = fail(c, OSP_ERR_UNSUPPORTED, path, "'allOf' with more than one schema%s", "");
            goto done;
        }
        for (size_t i = 0; i < json_array_size(list); i++) {
            int32_t r;
            snprintf(sub, sizeof sub, "%s/%s/%zu", path, kw, i);
            if (gen(c, json_array_get(list, i), sub, &r)) {
                rc = -1;
                goto done;
            }
            sb_fmt(&body, i ? " | s%d" : "s%d", r);
        }
        goto done;
    }
    json_t *type = json_object_get(s, "type");
    if (json_is_string(type)) rc = gen_type(c, s, json_string_value(type), path, &body);
    else if (json_is_array(type) && json_array_size(type) > 0) {
        for (size_t i = 0; i < json_array_size(type) && !rc; i++) {
            const char *t = json_string_value(json_array_get(type, i));
            if (!t) {
                rc = fail(c, OSP_ERR_INVALID_ARG, path, "'type' must list strings%s", "");
                break;
            }
            if (i) sb_str(&body, " | ");
            sb_str(&body, "( ");
            rc = gen_type(c, s, t, path, &body);
            sb_str(&body, " )");
        }
    } else if (type) rc = fail(c, OSP_ERR_INVALID_ARG, path, "'type' must be a string or an array of strings%s", "");
    else if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties") || json_object_get(s, "required"))
        rc = gen_type(c, s, "object", path, &body);
    else if (json_object_get(s, "items") || json_object_get(s, "minItems") || json_object_get(s, "maxItems"))
        rc = gen_type(c, s, "array", path, &body);
    else if (json_object_get(s, "minLength") || json_object_get(s, "maxLength") || json_object_get(s, "format"))
        rc = gen_type(c, s, "string", path, &body);
    else sb_str(&body, "value");
done:
    c->depth--;
    if (!rc && c->st == OSP_OK) {
        if (body.oom) rc = fail(c, OSP_ERR_NOMEM, path, "out of memory%s", "");
        else sb_fmt(&c->out, "s%d ::= ", me), sb_str(&c->out, body.p), sb_str(&c->out, "\n");
    }
    free(body.p);
    *rule = me;
    return rc || c->st != OSP_OK ? -1 : 0;
}

osp_status osp_json_schema_to_gbnf(const char *schema, size_t len, char **gbnf) {
    if ((!schema && len) || !gbnf) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_json_schema_to_gbnf: NULL argument");
    json_error_t je;
    json_t *doc = json_loadb(schema ? schema : "", len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!doc) return osp_set_error(OSP_ERR_INVALID_ARG, "json_schema: not JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    jsc *c = calloc(1, sizeof *c);
    if (!c) {
        json_decref(doc);
        return osp_set_error(OSP_ERR_NOMEM, "json_schema: out of memory");
    }
    c->doc = doc;
    int32_t root;
    const int rc = gen(c, doc, "#", &root);
    osp_status st = c->st;
    if (rc && st == OSP_OK) st = osp_set_error(OSP_ERR_INTERNAL, "json_schema: failed without a reason");
    if (st == OSP_OK) {
        sbuf all = {0};
        sb_fmt(&all, "root ::= s%d\n", root);
        sb_str(&all, BASE_RULES);
        sb_str(&all, c->out.p ? c->out.p : "");
        if (all.oom || c->out.oom) {
            free(all.p);
            st = osp_set_error(OSP_ERR_NOMEM, "json_schema: out of memory");
        } else *gbnf = all.p;
    }
    for (int32_t i = 0; i < c->n_refs; i++) free(c->refs[i].ref);
    free(c->out.p);
    free(c);
    json_decref(doc);
    return st;
}
