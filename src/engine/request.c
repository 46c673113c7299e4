/* Request objects (see request.h): creation from the public params, block hashes. */
#include "engine/request.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"
#include "grammar/grammar.h"

static _Atomic uint64_t g_next_uid = 1;

osp_status osp_request_check_sampling(const osp_request_params *rp, int32_t n_vocab) {
    const unsigned long long id = (unsigned long long)rp->request_id;
    const float f[] = {rp->temperature, rp->top_p, rp->min_p, rp->presence_penalty, rp->frequency_penalty,
                       rp->repetition_penalty};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (!isfinite(f[i])) return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: a sampling parameter is not finite", id);
    if (rp->temperature < 0) return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: temperature %g < 0", id, rp->temperature);
    if (rp->top_p < 0 || rp->top_p > 1)
        return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: top_p %g is outside [0, 1]", id, rp->top_p);
    if (rp->min_p < 0 || rp->min_p > 1)
        return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: min_p %g is outside [0, 1]", id, rp->min_p);
    if (rp->repetition_penalty < 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: repetition_penalty %g < 0", id, rp->repetition_penalty);
    if (rp->logprobs > OSP_MAX_LOGPROBS || rp->prompt_logprobs > OSP_MAX_LOGPROBS)
        return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: logprobs %d / prompt_logprobs %d above %d", id,
                             rp->logprobs, rp->prompt_logprobs, OSP_MAX_LOGPROBS);
    if (rp->num_logit_bias < 0 || (rp->num_logit_bias > 0 && !rp->logit_bias))
        return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: bad logit_bias", id);
    for (int32_t i = 0; i < rp->num_logit_bias; i++)
        if (rp->logit_bias[i].token_id < 0 || rp->logit_bias[i].token_id >= n_vocab || !isfinite(rp->logit_bias[i].bias))
            return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: logit_bias[%d] = (%d, %g): id outside the vocabulary "
                                 "(%d) or bias not finite", id, i, rp->logit_bias[i].token_id, rp->logit_bias[i].bias, n_vocab);
    return OSP_OK;
}

/* Allocates r's arrays for its sizes (max_len, num_prompt, stops, bias, logprobs). */
static bool alloc_arrays(osp_request *r, int32_t block_size, int32_t stop_cap) {
    r->cap_blocks = (r->max_len + block_size - 1) / block_size;
    r->tokens = malloc(sizeof *r->tokens * (size_t)r->max_len);
    r->block_ids = malloc(sizeof *r->block_ids * (size_t)r->cap_blocks);
    r->hashes = malloc(sizeof *r->hashes * (size_t)(r->max_len / block_size + 1));
    r->stop_ids = malloc(sizeof *r->stop_ids * (size_t)(stop_cap + 1));
    r->logit_bias = malloc(sizeof *r->logit_bias * (size_t)(r->sampling.n_logit_bias + 1));
    bool ok = r->tokens && r->block_ids && r->hashes && r->stop_ids && r->logit_bias;
    if (ok && r->sampling.num_logprobs >= 0)
        ok = (r->logprobs = malloc(sizeof *r->logprobs * (size_t)(r->max_len - r->num_prompt))) != NULL;
    if (ok && r->prompt_logprobs >= 0 && r->num_prompt > 1)
        ok = (r->prompt_lp = malloc(sizeof *r->prompt_lp * (size_t)(r->num_prompt - 1))) != NULL;
    r->sampling.logit_bias = r->logit_bias;
    r->sampling.stop_token_ids = r->stop_ids;
    return ok;
}

osp_status osp_request_create(const osp_request_params *rp, int32_t max_model_len, int32_t block_size,
                              int64_t arrival, osp_request **out) {
    *out = NULL;
    if (!rp->prompt || rp->num_prompt <= 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: the prompt is empty", (unsigned long long)rp->request_id);
    const bool embed = rp->pooling != OSP_POOLING_NONE;
    if (embed && rp->num_prompt > max_model_len)
        return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: input of %d tokens exceeds max_model_len %d",
                             (unsigned long long)rp->request_id, rp->num_prompt, max_model_len);
    if (!embed && rp->num_prompt >= max_model_len)
        return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: prompt of %d tokens leaves no room under max_model_len %d",
                             (unsigned long long)rp->request_id, rp->num_prompt, max_model_len);
    /* an embedding request holds its prompt only: nothing is generated */
    int64_t max_len = embed ? rp->num_prompt : rp->max_tokens > 0 ? (int64_t)rp->num_prompt + rp->max_tokens : max_model_len;
    if (max_len > max_model_len)
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "request %llu: prompt (%d tokens) + max_tokens (%d) exceeds max_model_len %d",
                             (unsigned long long)rp->request_id, rp->num_prompt, rp->max_tokens, max_model_len);
    if (rp->num_stop_token_ids < 0 || (rp->num_stop_token_ids > 0 && !rp->stop_token_ids))
        return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: bad stop_token_ids", (unsigned long long)rp->request_id);
    OSP_TRY(osp_request_check_sampling(rp, INT32_MAX));
    osp_request *r = calloc(1, sizeof *r);
    if (!r) return osp_set_error(OSP_ERR_NOMEM, "request: out of memory");
    r->id = rp->request_id;
    r->uid = g_next_uid++;
    r->arrival = arrival;
    r->priority = rp->priority;
    r->max_len = (int32_t)max_len;
    r->block_size = block_size;
    r->num_prompt = r->num_tokens = rp->num_prompt;
    r->num_cached_tokens = -1;
    osp_sampler_row *sp = &r->sampling;
    *sp = osp_sampler_row_default();
    sp->temperature = rp->temperature;
    sp->top_k = rp->top_k;
    sp->top_p = rp->top_p;
    sp->min_p = rp->min_p;
    sp->presence_penalty = rp->presence_penalty;
    sp->frequency_penalty = rp->frequency_penalty;
    sp->repetition_penalty = rp->repetition_penalty > 0 ? rp->repetition_penalty : 1.0f;
    sp->n_logit_bias = rp->num_logit_bias;
    sp->min_tokens = rp->min_tokens;
    sp->seed = rp->seed;
    sp->sample_index = rp->sample_index;
    sp->num_logprobs = rp->logprobs < 0 ? -1 : rp->logprobs;
    r->prompt_logprobs = rp->prompt_logprobs < 0 ? -1 : rp->prompt_logprobs;
    r->min_tokens = rp->min_tokens;
    r->ignore_eos = rp->ignore_eos;
    r->cache_salt = rp->cache_salt;
    if (rp->kv_transfer && (rp->kv_transfer->do_remote_decode || rp->kv_transfer->do_remote_prefill)) {
        r->has_kv_xfer = true;
        r->kv_xfer = *rp->kv_transfer;
        r->kv_xfer.remote_host[sizeof r->kv_xfer.remote_host - 1] = '\0';
    }
    r->pooling = rp->pooling;
    r->embd_normalize = rp->embd_normalize;
    r->callback = rp->callback;
    r->callback_user = rp->callback_user;
    r->fork_token = -1;
    r->num_stop_ids = rp->num_stop_token_ids;
    if (!alloc_arrays(r, block_size, r->num_stop_ids)) {
        osp_request_destroy(r);
        return osp_set_error(OSP_ERR_NOMEM, "request: out of memory");
    }
    memcpy(r->tokens, rp->prompt, sizeof *r->tokens * (size_t)rp->num_prompt);
    if (r->num_stop_ids) memcpy(r->stop_ids, rp->stop_token_ids, sizeof *r->stop_ids * (size_t)r->num_stop_ids);
    if (sp->n_logit_bias)
        for (int32_t i = 0; i < sp->n_logit_bias; i++)
            r->logit_bias[i] = (osp_logit_bias){.token_id = rp->logit_bias[i].token_id, .bias = rp->logit_bias[i].bias};
    sp->n_stop_token_ids = r->num_stop_ids;
    *out = r;
    return OSP_OK;
}

osp_status osp_request_set_eos(osp_request *r, const int32_t *eos, int32_t n_eos) {
    if (r->ignore_eos || n_eos <= 0) return OSP_OK;
    int32_t *s = realloc(r->stop_ids, sizeof *s * (size_t)(r->num_stop_ids + n_eos + 1));
    if (!s) return osp_set_error(OSP_ERR_NOMEM, "request: out of memory");
    memcpy(s + r->num_stop_ids, eos, sizeof *s * (size_t)n_eos);
    r->stop_ids = s;
    r->num_eos_ids = n_eos;
    r->sampling.stop_token_ids = s;
    r->sampling.n_stop_token_ids = r->num_stop_ids + n_eos;
    return OSP_OK;
}

osp_status osp_request_make_child(const osp_request *p, int32_t k, osp_request **out) {
    *out = NULL;
    osp_request *r = calloc(1, sizeof *r);
    if (!r) return osp_set_error(OSP_ERR_NOMEM, "request: out of memory");
    *r = *p;
    r->uid = g_next_uid++;
    r->child = k;
    r->sampling.sample_index = p->sampling.sample_index + (uint32_t)k;
    r->tokens = NULL, r->block_ids = NULL, r->hashes = NULL, r->stop_ids = NULL, r->logit_bias = NULL;
    r->matcher = NULL;
    if (p->matcher && osp_grammar_matcher_clone(p->matcher, &r->matcher) != OSP_OK) {
        osp_request_destroy(r);
        return osp_set_error(OSP_ERR_NOMEM, "request: out of memory");
    }
    r->logprobs = NULL, r->prompt_lp = NULL, r->children = NULL;
    r->num_children = 0;
    r->prompt_logprobs = -1; /* child 0 reports them */
    if (!alloc_arrays(r, p->block_size, p->num_stop_ids + p->num_eos_ids)) {
        osp_request_destroy(r);
        return osp_set_error(OSP_ERR_NOMEM, "request: out of memory");
    }
    memcpy(r->tokens, p->tokens, sizeof *r->tokens * (size_t)p->num_prompt);
    memcpy(r->stop_ids, p->stop_ids, sizeof *r->stop_ids * (size_t)(p->num_stop_ids + p->num_eos_ids));
    if (p->sampling.n_logit_bias)
        memcpy(r->logit_bias, p->logit_bias, sizeof *r->logit_bias * (size_t)p->sampling.n_logit_bias);
    r->num_tokens = p->num_prompt;
    *out = r;
    return OSP_OK;
}

void osp_request_destroy(osp_request *r) {
    if (!r) return;
    free(r->tokens);
    free(r->block_ids);
    free(r->hashes);
    free(r->stop_ids);
    free(r->logit_bias);
    free(r->logprobs);
    free(r->prompt_lp);
    free(r->children);
    free(r->embd_acc);
    free(r->embd);
    osp_grammar_matcher_free(r->matcher);
    free(r);
}

void osp_request_update_hashes(osp_request *r, const osp_prefix_hasher *h, int32_t block_size) {
    const int32_t full = r->num_tokens / block_size;
    for (int32_t i = r->num_hashes; i < full; i++) {
        r->hashes[i] = osp_prefix_hash_block(h, i ? &r->hashes[i - 1] : NULL, r->tokens + (size_t)i * block_size,
                                             block_size, r->cache_salt ? &r->cache_salt : NULL,
                                             r->cache_salt ? sizeof r->cache_salt : 0);
    }
    if (full > r->num_hashes) r->num_hashes = full;
}

osp_status osp_pooling_parse(const char *name, osp_pooling *out) {
    static const struct { const char *name; osp_pooling p; } k[] = {
        {"mean", OSP_POOLING_MEAN}, {"cls", OSP_POOLING_CLS}, {"last", OSP_POOLING_LAST}};
    for (size_t i = 0; name && i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(name, k[i].name)) {
            *out = k[i].p;
            return OSP_OK;
        }
    return osp_set_error(OSP_ERR_INVALID_ARG, "pooling '%s' is not one of mean, cls, last", name ? name : "(null)");
}

const char *osp_pooling_name(osp_pooling p) {
    switch (p) {
    case OSP_POOLING_MEAN: return "mean";
    case OSP_POOLING_CLS: return "cls";
    case OSP_POOLING_LAST: return "last";
    default: return "none";
    }
}

osp_request_params osp_request_default_params(void) {
    osp_request_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    p.n = 1;
    p.logprobs = -1;
    p.prompt_logprobs = -1;
    p.embd_normalize = true;
    return p;
}
