/* --speculative-config: vLLM's JSON object (vllm/config/speculative.py) read into osp_spec_config,
 * with vLLM's defaults for the n-gram method and one clear error for anything osprey cannot run. */
#include <jansson.h>
#include <stdbool.h>
#include <string.h>

#include "core/status_internal.h"
#include "osprey/spec.h"

/* Methods vLLM accepts that osprey does not run yet: named so the error says "not yet", not "unknown". */
static const char *const later_methods[] = {"eagle", "eagle3", "medusa", "mlp_speculator", "mtp", "deepseek_mtp",
                                            "suffix"};

osp_spec_config osp_spec_default_config(void) {
    osp_spec_config c;
    memset(&c, 0, sizeof c);
    c.method = OSP_SPEC_NONE;
    return c;
}

const char *osp_spec_method_name(osp_spec_method m) {
    switch (m) {
    case OSP_SPEC_NONE: return "none";
    case OSP_SPEC_NGRAM: return "ngram";
    case OSP_SPEC_DRAFT_MODEL: return "draft_model";
    case OSP_SPEC_QUANTSPEC: return "quantspec";
    }
    return NULL;
}

osp_status osp_spec_config_check(const osp_spec_config *c) {
    if (c->method == OSP_SPEC_NONE) return OSP_OK;
    if (c->method != OSP_SPEC_NGRAM && c->method != OSP_SPEC_DRAFT_MODEL && c->method != OSP_SPEC_QUANTSPEC)
        return osp_set_error(OSP_ERR_INVALID_ARG, "speculative config: unknown method %d", (int)c->method);
    if (c->num_speculative_tokens < 1 || c->num_speculative_tokens > OSP_SPEC_MAX_TOKENS)
        return osp_set_error(OSP_ERR_INVALID_ARG, "speculative config: num_speculative_tokens %d is outside [1, %d]",
                             c->num_speculative_tokens, OSP_SPEC_MAX_TOKENS);
    if (c->method == OSP_SPEC_DRAFT_MODEL) {
        if (!c->model[0] || !memchr(c->model, 0, sizeof c->model))
            return osp_set_error(OSP_ERR_INVALID_ARG, "speculative config: draft_model needs \"model\", the draft's "
                                                      "GGUF path (at most %d bytes)", OSP_SPEC_MODEL_PATH_MAX - 1);
        return OSP_OK;
    }
    if (c->method == OSP_SPEC_QUANTSPEC) return OSP_OK;
    if (c->prompt_lookup_min < 1 || c->prompt_lookup_max < c->prompt_lookup_min)
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "speculative config: prompt_lookup_min %d and prompt_lookup_max %d must satisfy "
                             "1 <= prompt_lookup_min <= prompt_lookup_max",
                             c->prompt_lookup_min, c->prompt_lookup_max);
    return OSP_OK;
}

/* The integer member `key` of o into *v, within [lo, hi]; *v unchanged when the key is absent. A JSON
 * number with no fractional part (3.0) counts as that integer, as vLLM's config takes it (pydantic's lax
 * int); 3.5, strings and booleans are refused. */
static osp_status int_key(json_t *o, const char *key, long long lo, long long hi, int32_t *v) {
    json_t *x = json_object_get(o, key);
    if (!x) return OSP_OK;
    const double r = json_is_real(x) ? json_real_value(x) : 0.0;
    const bool integral_real = json_is_real(x) && r >= (double)lo && r <= (double)hi && r == (double)(long long)r;
    if (!integral_real && (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi))
        return osp_set_error(OSP_ERR_INVALID_ARG, "speculative config: \"%s\" must be an integer in [%lld, %lld]", key,
                             lo, hi);
    *v = integral_real ? (int32_t)r : (int32_t)json_integer_value(x);
    return OSP_OK;
}

static osp_status parse_obj(json_t *o, osp_spec_config *out) {
    const char *key;
    json_t *val;
    json_object_foreach(o, key, val) {
        if (strcmp(key, "method") && strcmp(key, "num_speculative_tokens") && strcmp(key, "prompt_lookup_min") &&
            strcmp(key, "prompt_lookup_max") && strcmp(key, "model"))
            return osp_set_error(OSP_ERR_INVALID_ARG,
                                 "speculative config: unknown or unsupported key \"%s\" (osprey takes method, "
                                 "num_speculative_tokens, prompt_lookup_min, prompt_lookup_max for ngram, model for "
                                 "draft_model, nothing else for quantspec)", key);
    }
    json_t *m = json_object_get(o, "method"), *model = json_object_get(o, "model");
    if (!m && !model)
        return osp_set_error(OSP_ERR_INVALID_ARG, "speculative config: \"method\" is required (\"ngram\", "
                                                  "\"draft_model\" or \"quantspec\")");
    if (m && !json_is_string(m))
        return osp_set_error(OSP_ERR_INVALID_ARG, "speculative config: \"method\" must be a string (\"ngram\", "
                                                  "\"draft_model\" or \"quantspec\")");
    const char *ms = m ? json_string_value(m) : "draft_model"; /* vLLM: a model without a method drafts with it */
    osp_spec_config c = osp_spec_default_config();
    c.num_speculative_tokens = -1;
    if (!strcmp(ms, "ngram") || !strcmp(ms, "[ngram]")) {
        c.method = OSP_SPEC_NGRAM;
    } else if (!strcmp(ms, "draft_model")) {
        c.method = OSP_SPEC_DRAFT_MODEL;
    } else if (!strcmp(ms, "quantspec")) {
        c.method = OSP_SPEC_QUANTSPEC;
    } else {
        for (size_t i = 0; i < sizeof later_methods / sizeof later_methods[0]; i++)
            if (!strcmp(ms, later_methods[i]))
                return osp_set_error(OSP_ERR_UNSUPPORTED, "speculative config: method \"%s\" is not implemented yet "
                                                          "(osprey runs \"ngram\", \"draft_model\" and \"quantspec\")", ms);
        return osp_set_error(OSP_ERR_INVALID_ARG, "speculative config: unknown method \"%s\" (osprey runs \"ngram\", "
                                                  "\"draft_model\" and \"quantspec\")", ms);
    }
    if (!json_object_get(o, "num_speculative_tokens"))
        return osp_set_error(OSP_ERR_INVALID_ARG, "speculative config: \"num_speculative_tokens\" is required");
    OSP_TRY(int_key(o, "num_speculative_tokens", 1, OSP_SPEC_MAX_TOKENS, &c.num_speculative_tokens));
    if (c.method == OSP_SPEC_QUANTSPEC) {
        const char *other = json_object_get(o, "prompt_lookup_min")   ? "prompt_lookup_min"
                            : json_object_get(o, "prompt_lookup_max") ? "prompt_lookup_max"
                            : model                                   ? "model"
                                                                      : NULL;
        if (other)
            return osp_set_error(OSP_ERR_INVALID_ARG, "speculative config: \"%s\" is not for method \"quantspec\" "
                                                      "(the target drafts for itself)", other);
    } else if (c.method == OSP_SPEC_DRAFT_MODEL) {
        const char *other = json_object_get(o, "prompt_lookup_min") ? "prompt_lookup_min"
                            : json_object_get(o, "prompt_lookup_max") ? "prompt_lookup_max" : NULL;
        if (other)
            return osp_set_error(OSP_ERR_INVALID_ARG, "speculative config: \"%s\" is for method \"ngram\", not "
                                                      "\"draft_model\"", other);
        if (!model || !json_is_string(model) || !json_string_length(model) ||
            json_string_length(model) >= sizeof c.model || strlen(json_string_value(model)) != json_string_length(model))
            return osp_set_error(OSP_ERR_INVALID_ARG, "speculative config: draft_model needs \"model\": the draft's "
                                                      "GGUF path, a non-empty string of at most %d bytes",
                                 OSP_SPEC_MODEL_PATH_MAX - 1);
        memcpy(c.model, json_string_value(model), json_string_length(model) + 1);
    } else {
        if (model)
            return osp_set_error(OSP_ERR_INVALID_ARG, "speculative config: \"model\" is for method \"draft_model\", "
                                                      "not \"ngram\"");
        c.prompt_lookup_min = c.prompt_lookup_max = -1;
        OSP_TRY(int_key(o, "prompt_lookup_min", 1, 1 << 20, &c.prompt_lookup_min));
        OSP_TRY(int_key(o, "prompt_lookup_max", 1, 1 << 20, &c.prompt_lookup_max));
        /* vLLM's defaults: both absent 5 and 5; one absent takes the other's value */
        if (c.prompt_lookup_min < 0 && c.prompt_lookup_max < 0) c.prompt_lookup_min = c.prompt_lookup_max = 5;
        else if (c.prompt_lookup_min < 0) c.prompt_lookup_min = c.prompt_lookup_max;
        else if (c.prompt_lookup_max < 0) c.prompt_lookup_max = c.prompt_lookup_min;
    }
    OSP_TRY(osp_spec_config_check(&c));
    *out = c;
    return OSP_OK;
}

osp_status osp_spec_config_parse(const char *json, osp_spec_config *out) {
    if (!json || !*json) {
        *out = osp_spec_default_config();
        return OSP_OK;
    }
    json_error_t err;
    json_t *o = json_loads(json, JSON_REJECT_DUPLICATES, &err);
    if (!o) return osp_set_error(OSP_ERR_INVALID_ARG, "speculative config: not JSON: %s (column %d)", err.text, err.column);
    osp_status s = json_is_object(o) ? parse_obj(o, out)
                                     : osp_set_error(OSP_ERR_INVALID_ARG,
                                                     "speculative config: expected a JSON object such as "
                                                     "{\"method\": \"ngram\", \"num_speculative_tokens\": 4}");
    json_decref(o);
    return s;
}
