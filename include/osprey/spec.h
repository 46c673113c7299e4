/* Speculative decoding's configuration: which proposer drafts tokens for the target model to verify,
 * and how many per step. Spelled as vLLM's --speculative-config JSON (vllm/config/speculative.py):
 *
 *     {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
 *
 *     {"method": "draft_model", "model": "Qwen2.5-Coder-0.5B.gguf", "num_speculative_tokens": 4}
 *
 *     {"method": "quantspec", "num_speculative_tokens": 4}
 *
 * "ngram" (prompt lookup), "draft_model" (a smaller model of the target's vocabulary, run with its
 * own KV cache) and "quantspec" (osprey's own method name, vLLM has none: the target itself with 4-bit
 * weights drafts over the target's KV pages; src/spec/proposer.h) are implemented; the engine verifies the drafts losslessly, so
 * outputs are the target's own (greedy: token for token; sampled: the same distribution, and with a
 * seed the same tokens). */
#ifndef OSPREY_SPEC_H
#define OSPREY_SPEC_H

#include <stdint.h>

#include "osprey/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Draft tokens per request and step at most (num_speculative_tokens). */
#define OSP_SPEC_MAX_TOKENS 16

/* New values are appended. */
typedef enum osp_spec_method {
    OSP_SPEC_NONE = 0,  /* no speculation (the default) */
    OSP_SPEC_NGRAM = 1, /* prompt lookup: the last n tokens matched earlier in prompt + output */
    OSP_SPEC_DRAFT_MODEL = 2, /* a separate, smaller model with the target's tokenizer drafts greedily */
    OSP_SPEC_QUANTSPEC = 3,   /* self-speculation (QuantSpec, Tiwari et al. 2025): the target drafts for itself
                               * with 4-bit weights, reading int8_hier KV pages by their upper halves */
} osp_spec_method;

/* Bytes of osp_spec_config.model, the terminating NUL included. */
#define OSP_SPEC_MODEL_PATH_MAX 1024

typedef struct osp_spec_config {
    osp_spec_method method;
    int32_t num_speculative_tokens; /* k: drafts per request and step, in [1, OSP_SPEC_MAX_TOKENS] */
    int32_t prompt_lookup_min;      /* ngram: shortest n matched, >= 1 */
    int32_t prompt_lookup_max;      /* ngram: longest n matched (tried first), >= prompt_lookup_min */
    char model[OSP_SPEC_MODEL_PATH_MAX]; /* draft_model: the draft's GGUF path (non-empty); "" otherwise */
} osp_spec_config;

/* No speculation. */
osp_spec_config osp_spec_default_config(void);

/* Parses a vLLM speculative_config JSON object into *out. Keys: "method" ("ngram", vLLM's "[ngram]"
 * too, "draft_model" or "quantspec"; absent with "model" given: "draft_model", as vLLM infers it),
 * "num_speculative_tokens" (required, 1..OSP_SPEC_MAX_TOKENS); ngram only: "prompt_lookup_min" and
 * "prompt_lookup_max" (as vLLM: both absent = 5 and 5, one absent = the other); draft_model only:
 * "model" (required, a non-empty path shorter than OSP_SPEC_MODEL_PATH_MAX; whether it loads and
 * shares the target's vocabulary is checked when the engine starts). A method vLLM knows but osprey
 * does not run yet (eagle, ...) is OSP_ERR_UNSUPPORTED; anything else wrong (not JSON, not an object,
 * an unknown key or method, a key of the other method, a value of the wrong type or out of range) is
 * OSP_ERR_INVALID_ARG. Either way the message names the key and the accepted values, and *out is
 * left unchanged. json == NULL or "" gives osp_spec_default_config(). */
osp_status osp_spec_config_parse(const char *json, osp_spec_config *out);

/* OSP_OK if *c is consistent (ranges above; OSP_SPEC_NONE is always fine), else OSP_ERR_INVALID_ARG
 * naming the field. */
osp_status osp_spec_config_check(const osp_spec_config *c);

/* The method's name ("ngram", "draft_model", "quantspec"), "none", or NULL for an unknown value. */
const char *osp_spec_method_name(osp_spec_method m);

#ifdef __cplusplus
}
#endif
#endif
