/* The scheduler (vLLM V1 semantics): each step spends a token budget (max_num_batched_tokens) on
 * running requests first, in admission order (a decode costs 1, an unfinished prefill its next chunk),
 * then admits waiting requests (FCFS, or by priority), each prompt chunked to what is left of the
 * budget, up to max_num_seqs running. A waiting request first takes the longest run of its full blocks
 * found in the prefix cache (never its last prompt token). When the pool has no block for a running
 * request, the latest-arrived running request is preempted (blocks freed, recomputed later; it goes to
 * the front of the queue) until the request fits or is itself the one preempted; no new request is
 * admitted in a step that preempted. Requests that could not fit even alone are refused at admission
 * (osp_scheduler_admissible), so the oldest request can always run: no deadlock, no starvation.
 *
 * Host-only: no model. The model runner consumes osp_sched_output and returns one sampled token per
 * scheduled request that reached the end of its tokens; osp_scheduler_update() appends them and checks
 * stops. The scheduler does not own requests (the engine does); it keeps pointers to the live ones. */
#ifndef OSP_ENGINE_SCHEDULER_H
#define OSP_ENGINE_SCHEDULER_H

#include "engine/request.h"

typedef struct osp_scheduler osp_scheduler;

/* Prompt positions whose logprobs one step computes at most (requests with prompt_logprobs prefill in
 * chunks that respect it): bounds the runner's logits buffer. */
#define OSP_MAX_PROMPT_LP_PER_STEP 64

typedef struct osp_scheduler_config {
    int32_t max_num_seqs, max_num_batched_tokens, max_model_len, block_size;
    int32_t num_blocks;
    int32_t max_prompt_logprob_tokens; /* prompt positions with logprobs per step (<= 0 or above:
                                          OSP_MAX_PROMPT_LP_PER_STEP) */
    osp_sched_policy policy;
    bool enable_prefix_caching;
    osp_prefix_hasher hasher;
    const int32_t *eos_ids; /* [num_eos] end-of-generation token ids (copied) */
    int32_t num_eos;
} osp_scheduler_config;

typedef struct osp_sched_entry {
    osp_request *req;
    int32_t num_scheduled_tokens;
    bool is_new;            /* the runner does not hold a row for it (first admission or resumed) */
    int32_t sampled;        /* filled by the runner: the token sampled for it, -1 (mid-prefill) or
                               OSP_SAMPLED_ERROR (its sampling failed: req->error says why) */
    /* speculative decoding: a decode with drafts is a verification row of 1 + num_spec tokens (the last
       token, then req->spec_tokens[0..num_spec)), all in its KV blocks and the token budget */
    int32_t num_spec;       /* drafts scheduled (0: a plain decode or prefill) */
    int32_t num_accepted;   /* filled by the runner: drafts the target agreed with, in [0, num_spec];
                               `sampled` is the target's own token after them */
    int32_t num_new_tokens; /* filled by osp_scheduler_update: output tokens appended (stops cut drafts) */
} osp_sched_entry;

typedef struct osp_sched_output {
    osp_sched_entry *entries;   /* [num_entries] running ones first, then newly admitted */
    int32_t num_entries;
    int32_t total_tokens;
    uint64_t *removed_ids;      /* [num_removed] uids of the rows the runner drops: finished, aborted,
                                   preempted since the previous output */
    int32_t num_removed;
    /* filled by osp_scheduler_update: */
    osp_request **touched;      /* [num_touched] children forked or finished along with their parent */
    int32_t num_touched;
    int32_t *copy_src, *copy_dst; /* [num_copies] KV blocks to copy (copy-on-write of forked children's
                                   partial last blocks) before the next forward pass */
    int32_t num_copies;
} osp_sched_output;

typedef struct osp_scheduler_stats {
    int64_t num_preemptions;
    int64_t prefix_queries_tokens, prefix_hits_tokens;
    int32_t num_running, num_waiting;
    int32_t num_running_without_row; /* forked children not scheduled yet */
    /* speculative decoding (vLLM's spec_decode counters): verification rows, drafts in them, drafts
       accepted, and accepted by position (position i counts rows whose draft i was accepted) */
    int64_t spec_num_drafts, spec_num_draft_tokens, spec_num_accepted_tokens;
    int64_t spec_accepted_per_pos[OSP_SPEC_MAX_TOKENS];
    int64_t tier_hits_tokens;        /* of prefix_hits_tokens, tokens whose blocks a tier loaded back */
    int64_t tier_skipped_tokens;     /* tokens a tier held but the cost model chose to recompute */
} osp_scheduler_stats;

/* KV blocks below the pool (tiered offload, src/engine/offload.c). When a waiting request's prefix
 * continues past its prefix-cache hits into blocks the tier holds, the scheduler, at admission, takes
 * free pool blocks and has the tier load them. A load done at once (host memory) is cached under its
 * hashes and the blocks freed, so the request's prefix match finds them like any cached block. A load
 * in the background (disk) keeps the blocks -- and the request's hits -- out of use and the request
 * waiting (others behind it may be admitted: vLLM's WAITING_FOR_REMOTE_KVS) until `poll` hands it
 * back at the start of a later schedule; then the same. A block that failed to load stays uncached, and
 * that part of the prompt is computed. All callbacks run inside the scheduler's calls. */
typedef struct osp_sched_tier {
    void *ctx;
    /* block `index` of r's prompt (hash h) is held below the pool now (no I/O): in a tier, or at r's
       producer (prefill/decode disaggregation) */
    bool (*contains)(void *ctx, osp_request *r, int32_t index, const osp_block_hash *h);
    bool (*worth)(void *ctx, const osp_request *r, int32_t n_blocks); /* loading beats recomputing them */
    /* Loads blocks first..first+n of r (hashes[0..n)) into pool blocks ids[0..n). Returns how many it took
     * on (a prefix of the n; the rest are not loaded). *token == 0: done now, *n_ok of them loaded (a
     * prefix, pages written); *token != 0: loading in the background, the blocks must stay out of use
     * until poll returns the token. */
    int32_t (*start)(void *ctx, osp_request *r, const int32_t *ids, const osp_block_hash *hashes, int32_t first,
                     int32_t n, uint64_t *token, int32_t *n_ok);
    /* A finished background load: true with its token and *n_ok (the prefix whose pages are written),
     * false when none is finished. */
    bool (*poll)(void *ctx, uint64_t *token, int32_t *n_ok);
    /* Forgets a background load (its request went away): poll never returns it, no page is written. */
    void (*cancel)(void *ctx, uint64_t token);
} osp_sched_tier;

/* Errors: OSP_ERR_INVALID_ARG (sizes <= 0), OSP_ERR_NOMEM. */
osp_status osp_scheduler_create(const osp_scheduler_config *cfg, osp_scheduler **out);
void osp_scheduler_destroy(osp_scheduler *s); /* does not free requests */

osp_block_pool *osp_scheduler_pool(osp_scheduler *s);

/* Consults `t` (copied; NULL: no tier) at admission; needs prefix caching. */
void osp_scheduler_set_tier(osp_scheduler *s, const osp_sched_tier *t);

/* OSP_OK if `r` could run alone in the whole pool; else OSP_ERR_INVALID_ARG with a message. */
osp_status osp_scheduler_admissible(const osp_scheduler *s, const osp_request *r);
/* Queues a new request (state WAITING). Call osp_scheduler_admissible first. OSP_ERR_NOMEM. */
osp_status osp_scheduler_add(osp_scheduler *s, osp_request *r);
/* Finishes a waiting or running request with `reason` (an abort): it leaves the queues, its blocks
 * are released. No-op for a finished one. */
void osp_scheduler_finish(osp_scheduler *s, osp_request *r, osp_finish_reason reason);

/* Plans one step into *out (valid until the next call). out->num_entries may be 0. A running request
 * about to decode with drafts (req->num_spec > 0, proposed after its last step) is scheduled with
 * them, as many as the budget and max_len - 1 leave room for (the target's own token after the drafts
 * must fit too); when the pool cannot hold the drafts' slots they are dropped before anything is
 * preempted, so speculation never causes a preemption. */
osp_status osp_scheduler_schedule(osp_scheduler *s, osp_sched_output **out);
/* After the runner filled entries[i].sampled: advances num_computed_tokens, appends sampled tokens
 * (a verification row: its num_accepted drafts, then the sampled token; num_computed_tokens counts
 * only the kept ones, and the blocks past what they need (filled only by rejected drafts) go back to
 * the pool, so rejected KV slots are never read and get written again by the next step),
 * checks stops (max_tokens / max_model_len -> LENGTH; then, from min_tokens on, EOS unless
 * ignore_eos and stop token ids -> STOP; OSP_SAMPLED_ERROR -> ERROR) and releases finished requests'
 * blocks. A request with children (n > 1) whose prompt is now computed forks them: each child takes
 * its fork_token (set by the runner) and the parent's blocks through osp_block_pool_fork (it runs from
 * the next step; without a free block for the copy-on-write it is queued as preempted instead, to be
 * recomputed with the prefix cache's help). Admission reserves max_num_seqs seats for the children. */
void osp_scheduler_update(osp_scheduler *s, osp_sched_output *out);

bool osp_scheduler_has_unfinished(const osp_scheduler *s);
osp_scheduler_stats osp_scheduler_get_stats(const osp_scheduler *s);

/* Pool invariants plus: running <= max_num_seqs; waiting requests hold no blocks; every block's ref
 * count equals the number of running requests that hold it; a running request holds exactly the
 * blocks its computed tokens need (after a rollback too: none left holding only rejected drafts),
 * num_computed < num_tokens (its last token is still to compute), its drafts within its spec_k.
 * O(blocks + tokens). */
osp_status osp_scheduler_check_invariants(const osp_scheduler *s);

#endif
