/* A request inside the engine: its tokens (prompt then outputs, one array sized for the most it may
 * ever hold), how many of them are in the KV cache (num_computed_tokens), the KV blocks it holds, the
 * chained hashes of its full blocks, its sampling params and stop conditions, and its state.
 *
 * States (vLLM V1): WAITING (queued, holds no blocks) -> RUNNING (holds blocks) -> FINISHED; a running
 * request that loses its blocks to preemption becomes PREEMPTED (queued again, no blocks, recomputed
 * from scratch when re-admitted, its outputs so far treated as prompt). */
#ifndef OSP_ENGINE_REQUEST_H
#define OSP_ENGINE_REQUEST_H

#include <stdbool.h>
#include <stdint.h>

#include "kv/block_pool.h"
#include "kv/prefix_cache.h"
#include "osprey/engine.h"
#include "sample/sampler.h"

typedef enum osp_req_state {
    OSP_REQ_WAITING = 0,
    OSP_REQ_RUNNING = 1,
    OSP_REQ_PREEMPTED = 2,
    OSP_REQ_FINISHED = 3,
} osp_req_state;

typedef struct osp_request {
    uint64_t id;
    int64_t arrival;            /* admission order, increasing */
    int32_t priority;
    osp_req_state state;
    osp_finish_reason finish_reason;

    int32_t *tokens;            /* [max_len] prompt then outputs */
    int32_t num_prompt, num_tokens, max_len; /* max_len = min(prompt + max_tokens, max_model_len) */
    int32_t num_computed_tokens;
    int32_t num_cached_tokens;  /* prefix-cache hit at first admission; -1 before it */

    osp_sampling_params sampling; /* one row's params for the sampler (src/sample/) */
    int32_t min_tokens;
    bool ignore_eos;
    int32_t *stop_ids;          /* [num_stop_ids] */
    int32_t num_stop_ids;
    uint64_t cache_salt;

    int32_t *block_ids;         /* [cap_blocks] blocks for tokens [0, num_blocks * block_size) */
    int32_t num_blocks, cap_blocks;
    int32_t num_cached_blocks;  /* blocks [0, this) already offered to the prefix cache */
    osp_block_hash *hashes;     /* [max_len / block_size] chained hashes of full token blocks */
    int32_t num_hashes;
    int32_t num_preemptions;

    /* engine-side output bookkeeping (under the engine's lock) */
    osp_output_cb callback;
    void *callback_user;
    int32_t num_published;      /* output tokens visible to pollers */
    int32_t num_delivered;      /* output tokens already handed out by poll */
    bool published_finished;
    osp_finish_reason published_reason;
    bool abort_requested;
} osp_request;

/* Makes a request from the caller's params (arrays copied). max_model_len >= 1. Errors:
 * OSP_ERR_INVALID_ARG (empty prompt, prompt + max_tokens over max_model_len), OSP_ERR_NOMEM. */
osp_status osp_request_create(const osp_request_params *rp, int32_t max_model_len, int32_t block_size,
                              int64_t arrival, osp_request **out);
void osp_request_destroy(osp_request *r); /* NULL is fine */

static inline int32_t osp_request_num_output(const osp_request *r) { return r->num_tokens - r->num_prompt; }

/* Hashes every full block of r->tokens not hashed yet (chained from the previous block, extra key =
 * cache salt). */
void osp_request_update_hashes(osp_request *r, const osp_prefix_hasher *h, int32_t block_size);

#endif
