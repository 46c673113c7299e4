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
#include "osprey/spec.h"
#include "sample/sampler.h"

typedef enum osp_req_state {
    OSP_REQ_WAITING = 0,
    OSP_REQ_RUNNING = 1,
    OSP_REQ_PREEMPTED = 2,
    OSP_REQ_FINISHED = 3,
} osp_req_state;

#define OSP_SAMPLED_ERROR (-2) /* osp_sched_entry.sampled / fork_token of a sequence whose sampling failed */

typedef struct osp_request {
    uint64_t id;                /* the caller's id, shared by the n children of one request */
    uint64_t uid;               /* unique per sequence (persistent batch rows, removed ids) */
    int32_t child;              /* k in [0, n): which child of the request */
    int64_t arrival;            /* admission order, increasing */
    double t_scheduled;         /* CLOCK_MONOTONIC seconds of the first step that scheduled it (0: none yet) */
    int32_t priority;
    osp_req_state state;
    osp_finish_reason finish_reason;

    int32_t *tokens;            /* [max_len] prompt then outputs */
    int32_t num_prompt, num_tokens, max_len; /* max_len = min(prompt + max_tokens, max_model_len) */
    int32_t num_computed_tokens;
    int32_t num_cached_tokens;  /* prefix-cache hit at first admission; -1 before it */

    osp_sampler_row sampling;   /* the sampler row's parameters (pointers: logit_bias, stop ids; the
                                   token lists are filled per step by the model runner) */
    osp_logit_bias *logit_bias; /* [sampling.n_logit_bias] */
    int32_t min_tokens;
    bool ignore_eos;
    int32_t *stop_ids;          /* [num_stop_ids] the request's stop ids, then EOS ids (unless ignore_eos):
                                   [num_stop_ids + num_eos_ids] is what min_tokens masks */
    int32_t num_stop_ids, num_eos_ids;

    /* n > 1: child 0 runs the prompt; the others wait (state WAITING, in no queue) until its prompt is
       computed, then get its blocks forked (osp_scheduler_update). After that, children = NULL. */
    struct osp_request **children; /* [num_children] children 1..n-1 (child 0 only, before the fork) */
    int32_t num_children;
    int32_t fork_token;         /* set by the runner on children at the fork step: their first token */
    bool needs_row;             /* running, but the runner holds no row for it yet (a forked child) */
    bool tier_loading;          /* waiting while KV offload loads its prefix blocks in the background */
    /* prefill/decode disaggregation (osp_request_params.kv_transfer, copied): a producer's request holds
       its prompt blocks for a consumer when it finishes; a consumer's loads blocks [kv_xfer_tried,
       remote_num_blocks) from the producer at admission (each block is asked for once: one that does
       not load is computed) and releases the producer's copies once admitted (kv_xfer_released) */
    bool has_kv_xfer, kv_xfer_released;
    osp_kv_transfer_params kv_xfer;
    int32_t kv_xfer_tried;
    uint64_t kv_xfer_id;        /* a producer's: the transfer its finished prompt is held under (0: none) */
    int32_t kv_xfer_blocks;     /* and its block count */
    char error[160];            /* with OSP_FINISH_ERROR */

    /* logprobs */
    osp_logprobs *logprobs;      /* [max_len - num_prompt] of each output token, if sampling.num_logprobs >= 0 */
    int32_t prompt_logprobs;     /* < 0: none; else top N of prompt logprobs */
    osp_logprobs *prompt_lp;     /* [num_prompt - 1]: position p is the logprob of token p + 1 */
    int32_t num_prompt_lp;       /* computed so far (positions [0, this)) */
    bool prompt_lp_delivered;
    uint64_t cache_salt;
    struct osp_grammar_matcher *matcher; /* structured output state (owned; children hold clones), or NULL */
    /* an embedding request (pooling != NONE; osp_request_params.pooling): prefill only. The runner pools
       the output norm of each computed chunk into embd_acc (restarted at position 0, so a preempted
       request recomputed from scratch pools afresh) and writes the finished vector to embd when the
       last prompt token is computed; the scheduler then finishes it. Both [n_embd], set at add. */
    osp_pooling pooling;
    bool embd_normalize;
    double *embd_acc;
    float *embd;

    int32_t block_size;
    int32_t *block_ids;         /* [cap_blocks] blocks for tokens [0, num_blocks * block_size) */
    int32_t num_blocks, cap_blocks;
    int32_t num_cached_blocks;  /* blocks [0, this) already offered to the prefix cache */
    osp_block_hash *hashes;     /* [max_len / block_size] chained hashes of full token blocks */
    int32_t num_hashes;
    int32_t num_preemptions;

    /* speculative decoding: drafts for the next step, proposed after this one (src/spec/); they are
       never part of `tokens` until the target accepts them */
    int32_t spec_k;                               /* drafts per step at most (0: no speculation) */
    int32_t spec_tokens[OSP_SPEC_MAX_TOKENS];     /* [num_spec] */
    int32_t num_spec;
    /* adaptive k (engine_core.c adapt_spec): drafts asked for next (1..spec_k), the moving share of
       drafts accepted, decode steps left without drafts after acceptance fell, and the next such pause */
    int32_t spec_k_cur;
    float spec_accept;
    int32_t spec_pause, spec_next_pause;

    /* engine-side output bookkeeping (under the engine's lock) */
    osp_output_cb callback;
    void *callback_user;
    int32_t num_published;      /* output tokens visible to pollers */
    int32_t num_delivered;      /* output tokens already handed out by poll */
    /* num_cached_tokens and t_scheduled as of the last publish: what a poller reads (the loop thread
       writes the live fields outside the lock) */
    int32_t published_cached_tokens;
    double published_t_scheduled;
    bool published_finished;
    osp_finish_reason published_reason;
    bool abort_requested;
} osp_request;

/* Makes a request from the caller's params (arrays copied; the seed as given, has_seed or not; child 0
 * only, n ignored: the engine makes the children with osp_request_make_child). max_model_len >= 1.
 * Errors: OSP_ERR_INVALID_ARG (empty prompt, prompt + max_tokens over max_model_len, sampling params
 * out of range), OSP_ERR_NOMEM. */
osp_status osp_request_create(const osp_request_params *rp, int32_t max_model_len, int32_t block_size,
                              int64_t arrival, osp_request **out);
void osp_request_destroy(osp_request *r); /* NULL is fine */

/* Appends the EOS ids to what min_tokens masks (nothing with ignore_eos). OSP_ERR_NOMEM. */
osp_status osp_request_set_eos(osp_request *r, const int32_t *eos, int32_t n_eos);
/* A copy of child 0 `r` as child k (same id, params, prompt; sample_index + k; own uid). OSP_ERR_NOMEM. */
osp_status osp_request_make_child(const osp_request *r, int32_t k, osp_request **out);
/* Whether the sampling params are valid for a vocabulary of n_vocab (message set otherwise). */
osp_status osp_request_check_sampling(const osp_request_params *rp, int32_t n_vocab);

static inline int32_t osp_request_num_output(const osp_request *r) { return r->num_tokens - r->num_prompt; }

/* Hashes every full block of r->tokens not hashed yet (chained from the previous block, extra key =
 * cache salt). */
void osp_request_update_hashes(osp_request *r, const osp_prefix_hasher *h, int32_t block_size);

#endif
