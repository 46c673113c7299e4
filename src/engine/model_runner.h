/* The model runner: owns the KV cache pages, the persistent batch and the sampler's workspace; per step
 * it applies the scheduler's diff, builds the flattened batch, runs the forward pass (prefill chunks and
 * decodes together) and samples one token for every row whose scheduled tokens reach its end, all rows
 * in one osp_sample_batch call with each row's own parameters (src/sample/sampler.h). It also computes
 * prompt logprobs for requests that ask (logits of their scheduled prompt positions) and, at the step
 * where a request with n > 1 children finishes its prompt, samples the children's first tokens from the
 * same logits (each with its own sample_index). A row whose sampling fails (NaN or inf logits) fails
 * only its request (OSP_SAMPLED_ERROR, the reason in req->error).
 *
 * Speculative decoding: a verification row (an entry with num_spec drafts) gets one sampler row per
 * position, each sampled exactly as plain decoding would sample that output position (its penalties
 * see the drafts before it as outputs, its random draw is the request's Philox stream at that output
 * position); verification (src/spec/verify.h) keeps the drafts up to the first one the target did not
 * draw, then the target's own token.
 *
 * Embeddings: a row of an embedding request (pooling != NONE) has no logits; in a step with such rows
 * the forward also returns the output norm of every token (osp_model_forward_embd), and each such row's
 * chunk is pooled into its request (mean: summed in double, divided at the end; cls: position 0; last:
 * the last prompt position); at the chunk that computes its last prompt token the vector is finished
 * (L2-normalized when asked) into req->embd. A non-finite value fails the request (OSP_SAMPLED_ERROR). */
#ifndef OSP_ENGINE_MODEL_RUNNER_H
#define OSP_ENGINE_MODEL_RUNNER_H

#include <stdio.h>

#include "engine/persistent_batch.h"

typedef struct osp_model_runner {
    osp_model *model;              /* not owned */
    osp_kv_cache *kv;
    osp_persistent_batch *pb;
    int32_t n_vocab, max_rows;
    int32_t max_sample;            /* sampler rows per step at most: max_rows, or pb->max_logits with drafts */
    float *logits;                 /* [max_sample + OSP_MAX_PROMPT_LP_PER_STEP, n_vocab] */
    osp_sampler_workspace *ws;
    osp_sampler_row *rows;         /* [max_sample] this step's sampler rows */
    osp_request **row_req;         /* [max_sample] the sequence each sampler row samples for */
    int32_t *row_entry;            /* [max_sample] its entry in the step's osp_sched_output, or -1 (a child) */
    int32_t *tokens;               /* [max_sample] */
    osp_logprobs *lp;              /* [max_sample] */
    osp_status *status;            /* [max_sample + OSP_MAX_PROMPT_LP_PER_STEP] */
    int32_t *plp_next;             /* [OSP_MAX_PROMPT_LP_PER_STEP] tokens following the prompt positions */
    int32_t *lrow;                 /* [max_sample] the logits row each sampler row samples from */
    const struct osp_token_trie *trie; /* the vocabulary trie for grammar masks (the engine's), or NULL */
    uint32_t *gmask;               /* [max_sample, (n_vocab + 31) / 32] this step's grammar masks, made at the
                                      first grammar row (indexed by sampler row, which verification rows of
                                      other requests can push past max_rows) */
    /* GPU steps with grammar rows: the rows without a mask, compacted for the GPU sampler, [max_sample]
       each (allocated at the first such step, then kept) */
    osp_sampler_row *g_rows;
    int32_t *g_lrow, *g_idx, *g_tokens;
    osp_logprobs *g_lp;
    osp_status *g_status;
    float *embd;                   /* [pb->max_tokens, n_embd] the output norm of every token of a step with
                                      embedding rows (allocated at the first such step, then kept) */
    int32_t n_embd;
    bool timeline;                 /* the engine's step timeline is on: t_forward is written each step */
    double t_forward[3];           /* CLOCK_MONOTONIC seconds: before the forward, after it returned, after
                                      sampling (engine/timeline.h's prepare / forward / sample boundaries) */
    FILE *trace;                   /* step shapes, one JSON line a step (osp_engine_params.trace_shapes_path), or NULL */
    int64_t trace_step;
} osp_model_runner;

/* The KV cache has K pages of k_dtype and V pages of v_dtype (equal unless split).
 * The sampler runs on the model's thread pool (osp_model_run_parallel). max_spec: drafts per row at
 * most (0: no speculative decoding; > 0 only where the model samples on the host). k_fixed / v_fixed:
 * a quantized cache's fixed scales (osp_kv_cache_create_with_scales: fp8 [n_layer, n_head_kv], nvfp4
 * [n_layer]; copied), NULL for the defaults. Errors: those of osp_kv_cache_create_with_scales,
 * OSP_ERR_NOMEM. */
osp_status osp_runner_create(osp_model *m, int32_t num_blocks, int32_t block_size, osp_kv_dtype k_dtype, osp_kv_dtype v_dtype,
                             const float *k_fixed, const float *v_fixed,
                             int32_t max_rows, int32_t max_model_len, int32_t max_tokens, int32_t max_spec,
                             osp_model_runner **out);
void osp_runner_destroy(osp_model_runner *r);

/* Runs one step for `out` and fills out->entries[i].sampled (-1 for rows still mid-prefill,
 * OSP_SAMPLED_ERROR for a request whose logits could not be sampled), num_accepted of verification
 * rows, and the children's fork_token.
 * Errors: osp_model_forward's; OSP_ERR_INTERNAL for a diff out of sync. */
osp_status osp_runner_execute(osp_model_runner *r, osp_sched_output *out);

#endif
