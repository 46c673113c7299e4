/* Proposers for speculative decoding: each step, a proposer drafts up to k tokens that are likely to
 * follow a sequence; the target model then checks them all in one forward pass (verify.h) and keeps
 * the longest prefix it agrees with plus one token of its own. A proposer only guesses: whatever it
 * returns, the output is the target's (a bad proposer costs time, never correctness).
 *
 * The contract every proposer keeps (osp_proposer_ops):
 *   - propose(p, seqs, n) fills, for each of seqs[0..n), draft[0..num_draft) with num_draft in
 *     [0, max_draft]; every drafted id is one the sequence could hold (in [0, vocab), which for the
 *     n-gram proposer holds by construction: it copies ids from the sequence itself).
 *   - Inputs are borrowed for the call only: tokens (the sequence's prompt then its accepted outputs,
 *     never rejected drafts) stays owned by the engine; draft is the caller's buffer of max_draft ids.
 *   - The n-gram proposer keeps no state between calls. The draft-model proposer keeps the draft's KV
 *     of each sequence keyed by uid; release(p, uid) (optional: NULL for a stateless proposer) drops
 *     it when the sequence has finished. Any state is only a cache: a proposer must still propose
 *     correctly for a uid it has never seen or has released (the engine does not tell it about
 *     preemption; a preempted sequence comes back with the same tokens).
 *   - Errors (OSP_ERR_NOMEM, a draft model's forward failing) fail the step; proposing nothing is not
 *     an error.
 * Proposers run on the engine's step thread, one call per step for every decoding sequence. */
#ifndef OSP_SPEC_PROPOSER_H
#define OSP_SPEC_PROPOSER_H

#include <stdint.h>

#include "osprey/model.h"
#include "osprey/spec.h"
#include "osprey/status.h"

/* The id of x's largest value among n (ties: the lowest id): what the model-based proposers draft. */
static inline int32_t osp_spec_argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* One sequence to draft for. */
typedef struct osp_spec_seq {
    uint64_t uid;          /* the sequence (unique per process) */
    const int32_t *tokens; /* [num_tokens] prompt then accepted outputs (borrowed) */
    int32_t num_tokens;
    int32_t num_prompt;
    int32_t max_draft;     /* in [0, OSP_SPEC_MAX_TOKENS] */
    int32_t *draft;        /* [max_draft] out: the drafted ids */
    int32_t num_draft;     /* out: in [0, max_draft] */
    /* the target's KV of the sequence (quantspec reads it; others ignore it): positions
     * [0, num_computed) are in the target's cache, in blocks block_ids[0..num_blocks) (borrowed) */
    const int32_t *block_ids;
    int32_t num_blocks;
    int32_t num_computed;
} osp_spec_seq;

typedef struct osp_proposer osp_proposer;

typedef struct osp_proposer_ops {
    const char *name; /* vLLM's method name ("ngram") */
    osp_status (*propose)(osp_proposer *p, osp_spec_seq *seqs, int32_t n);
    void (*release)(osp_proposer *p, uint64_t uid); /* optional; an unknown uid is fine */
    void (*destroy)(osp_proposer *p);
} osp_proposer_ops;

/* A proposer: implementations embed this as their first member. */
struct osp_proposer {
    const osp_proposer_ops *ops;
};

/* What a proposer may need of the engine it drafts for (a draft model sizes its KV cache by it). */
typedef struct osp_proposer_target {
    const osp_model *model; /* the target (borrowed: its vocabulary and device) */
    int n_threads;          /* the draft model's threads (0: all cores), as the target's */
    bool exact;             /* the draft's matmuls in fp32 activations, as the target's (osp_model_params) */
    osp_cpu_activations cpu_activations; /* the draft's CPU activation mode, as the target's (osp_model_params) */
    bool no_mmap;           /* the draft's weights copied out of the file, as the target's (osp_model_params) */
    osp_kv_dtype kv_dtype;  /* the draft's KV pages (the target's K dtype) */
    int32_t block_size;     /* the draft's KV blocks: block_size tokens each ... */
    int32_t num_blocks;     /* ... num_blocks of them (the target's count: a draft's sequence never holds
                             * more than its target's tokens plus k) */
    int32_t max_model_len;  /* tokens a sequence holds at most */
    int32_t max_num_batched_tokens; /* tokens one draft forward pass takes at most (prompts catch up in chunks) */
    /* quantspec: the target's KV cache (borrowed, outlives the proposer) and the blocks of it no sequence
     * gets, [staging_block0, staging_block0 + num_staging_blocks): the draft writes its candidates' K/V
     * there, never into a sequence's blocks (osp_quantspec_staging_blocks says how many it needs) */
    osp_kv_cache *kv;
    int32_t staging_block0, num_staging_blocks;
} osp_proposer_target;

/* The proposer of a config (OSP_SPEC_NGRAM, OSP_SPEC_DRAFT_MODEL, OSP_SPEC_QUANTSPEC; t may be NULL for ngram). Errors:
 * OSP_ERR_INVALID_ARG (osp_spec_config_check, or OSP_SPEC_NONE: nothing to create; a draft model whose
 * vocabulary is not the target's), OSP_ERR_NOMEM, and what loading the draft model returns. The caller
 * owns *out (osp_proposer_destroy). */
osp_status osp_proposer_create(const osp_spec_config *c, const osp_proposer_target *t, osp_proposer **out);
void osp_proposer_destroy(osp_proposer *p); /* NULL is fine */

/* ---- n-gram / prompt lookup (vLLM's "ngram"; Saxena's prompt lookup decoding) ------------------ */

/* Drafts for tokens [num_tokens]: for n from max_n down to min_n, the last n tokens are looked for
 * earlier in the sequence (a match must end before the last token, so at least one token follows it;
 * it may overlap the suffix itself); the first n with a match wins, and of its matches the earliest.
 * The draft is the up to k tokens that followed that match, stopping at the end of the sequence
 * (never wrapping). draft [k]. Returns the number drafted, 0 when nothing matches, num_tokens <=
 * min_n, or k <= 0. O(num_tokens * n) comparisons per n tried; allocates nothing. Requires
 * 1 <= min_n <= max_n. */
int32_t osp_ngram_propose(const int32_t *tokens, int32_t num_tokens, int32_t min_n, int32_t max_n, int32_t k,
                          int32_t *draft);

/* ---- draft model (vLLM's "draft_model") --------------------------------------------------------- */

/* A draft model proposer: loads c->model on the target's device (the CPU: speculation runs there) and
 * checks that its tokenizer is the target's (same number of tokens, every token's text equal;
 * OSP_ERR_INVALID_ARG naming the first difference otherwise). Each step it brings each sequence's
 * draft KV up to the sequence's tokens (rolling back over rejected drafts by the longest common
 * prefix) and drafts the draft model's argmax k times. Called by osp_proposer_create. */
osp_status osp_draft_proposer_create(const osp_spec_config *c, const osp_proposer_target *t, osp_proposer **out);

/* ---- QuantSpec self-speculation ("quantspec"; Tiwari et al. 2025) -------------------------------- */

/* Sequences one quantspec call drafts for at most; the others of the call get no drafts. */
#define OSP_QUANTSPEC_MAX_SEQS 8
/* Keys at the end of a draft query's context read with both halves of int8_hier pages (the paper keeps
 * its most recent tokens in full precision, a buffer of one to two groups of 128). */
#define OSP_QUANTSPEC_FULL_RECENT 128

/* Staging blocks a quantspec proposer needs for k drafts with blocks of block_size tokens: per sequence
 * the copy of its partly filled last block plus room for k candidates, for OSP_QUANTSPEC_MAX_SEQS
 * sequences. The engine creates the target's cache with that many blocks more than its pool hands out. */
int32_t osp_quantspec_staging_blocks(int32_t k, int32_t block_size);

/* The target drafts for itself: it loads the target's GGUF again with 4-bit weights
 * (osp_model_params.draft_4bit_weights: matrices above 5 bits a weight as Q4_0 copies), on the target's
 * device (a GPU: with gpu_quant_weights, its own backend and stream, the target's pages read through
 * osp_kv_cache_view_for after a sync of the target's stream), and runs it over
 * the target's own KV cache t->kv, reading int8_hier pages by their upper halves except the last
 * OSP_QUANTSPEC_FULL_RECENT keys (osp_kv_cache_set_hier_view; other page types it reads as the target
 * does). Each step, per sequence with num_computed == num_tokens - 1: its partly filled last block is
 * copied to a staging block, the draft's block table is the sequence's full blocks then the staging
 * ones, and k single-token passes (one batch over the sequences) draft the draft's argmax, writing
 * their K/V to staging slots only: a rejected candidate never touches a sequence's blocks, so there is
 * nothing to roll back and no state kept between steps. Called by osp_proposer_create; t->kv and
 * t->num_staging_blocks >= osp_quantspec_staging_blocks(k, block_size) are required
 * (OSP_ERR_INVALID_ARG otherwise). */
osp_status osp_quantspec_proposer_create(const osp_spec_config *c, const osp_proposer_target *t, osp_proposer **out);

/* An estimate of the device bytes the self-draft of a target on a GPU takes (the engine sizes the KV cache
 * after subtracting it, since the draft loads after the cache): from the target's GGUF, each matrix as the
 * draft places it with gpu_quant_weights: stored above 5 bits a weight (and rows of whole 32s) as its Q4_0
 * copy, 18 bytes a 32 values; Q4_0 / Q4_1 / Q4_K as stored; other types at 5 bits or fewer (Q2_K, Q3_K, the
 * IQ types, which the quantized kernels lack) widened to bf16; vectors fp32; plus 256 MiB for the draft's
 * activations, GEMM workspace and graphs. 0 for a model without a GGUF (random weights: no draft). */
int64_t osp_quantspec_draft_device_bytes(const osp_model *target);

#endif
