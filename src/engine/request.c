/* Request objects (see request.h): creation from the public params, block hashes. */
#include "engine/request.h"

#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"

osp_status osp_request_create(const osp_request_params *rp, int32_t max_model_len, int32_t block_size,
                              int64_t arrival, osp_request **out) {
    *out = NULL;
    if (!rp->prompt || rp->num_prompt <= 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: the prompt is empty", (unsigned long long)rp->request_id);
    if (rp->num_prompt >= max_model_len)
        return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: prompt of %d tokens leaves no room under max_model_len %d",
                             (unsigned long long)rp->request_id, rp->num_prompt, max_model_len);
    int64_t max_len = rp->max_tokens > 0 ? (int64_t)rp->num_prompt + rp->max_tokens : max_model_len;
    if (max_len > max_model_len)
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "request %llu: prompt (%d tokens) + max_tokens (%d) exceeds max_model_len %d",
                             (unsigned long long)rp->request_id, rp->num_prompt, rp->max_tokens, max_model_len);
    if (rp->num_stop_token_ids < 0 || (rp->num_stop_token_ids > 0 && !rp->stop_token_ids))
        return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: bad stop_token_ids", (unsigned long long)rp->request_id);
    osp_request *r = calloc(1, sizeof *r);
    if (!r) return osp_set_error(OSP_ERR_NOMEM, "request: out of memory");
    r->id = rp->request_id;
    r->arrival = arrival;
    r->priority = rp->priority;
    r->max_len = (int32_t)max_len;
    r->num_prompt = r->num_tokens = rp->num_prompt;
    r->num_cached_tokens = -1;
    r->sampling = osp_sampling_default_params();
    r->sampling.temperature = rp->temperature;
    r->sampling.top_k = rp->top_k;
    r->sampling.top_p = rp->top_p;
    r->sampling.seed = rp->seed;
    r->min_tokens = rp->min_tokens;
    r->ignore_eos = rp->ignore_eos;
    r->cache_salt = rp->cache_salt;
    r->callback = rp->callback;
    r->callback_user = rp->callback_user;
    r->cap_blocks = (r->max_len + block_size - 1) / block_size;
    r->tokens = malloc(sizeof *r->tokens * (size_t)r->max_len);
    r->block_ids = malloc(sizeof *r->block_ids * (size_t)r->cap_blocks);
    r->hashes = malloc(sizeof *r->hashes * (size_t)(r->max_len / block_size + 1));
    r->num_stop_ids = rp->num_stop_token_ids;
    r->stop_ids = malloc(sizeof *r->stop_ids * (size_t)(r->num_stop_ids + 1));
    if (!r->tokens || !r->block_ids || !r->hashes || !r->stop_ids) {
        osp_request_destroy(r);
        return osp_set_error(OSP_ERR_NOMEM, "request: out of memory");
    }
    memcpy(r->tokens, rp->prompt, sizeof *r->tokens * (size_t)rp->num_prompt);
    if (r->num_stop_ids) memcpy(r->stop_ids, rp->stop_token_ids, sizeof *r->stop_ids * (size_t)r->num_stop_ids);
    *out = r;
    return OSP_OK;
}

void osp_request_destroy(osp_request *r) {
    if (!r) return;
    free(r->tokens);
    free(r->block_ids);
    free(r->hashes);
    free(r->stop_ids);
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

osp_request_params osp_request_default_params(void) {
    osp_request_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    return p;
}
