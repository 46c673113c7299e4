/* The persistent batch (the Model Runner V2 idea): the runner's per-row state, kept across steps so
 * that each step only applies its diff (rows removed for finished / aborted / preempted requests, rows
 * added for new or resumed ones, new block ids appended, holes filled by moving the last row) and then
 * builds the flattened model inputs in one pass over the rows.
 *
 * Row r holds one running request: its tokens (prompt + outputs, [max_model_len]), num_computed_tokens,
 * its block-table row ([max_blocks]) and its sampling params. Rows [0, num_rows) are occupied. */
#ifndef OSP_ENGINE_PERSISTENT_BATCH_H
#define OSP_ENGINE_PERSISTENT_BATCH_H

#include "engine/scheduler.h"
#include "osprey/model.h"

typedef struct osp_persistent_batch {
    int32_t max_rows, max_model_len, max_blocks, block_size, max_tokens;
    int32_t num_rows;
    uint64_t *req_id;             /* [max_rows] the request's uid (one per sequence) */
    int32_t *token_ids;           /* [max_rows, max_model_len] */
    int32_t *num_tokens;          /* [max_rows] */
    int32_t *num_prompt;          /* [max_rows] */
    int32_t *num_computed;        /* [max_rows] */
    int32_t *block_table;         /* [max_rows, max_blocks] */
    int32_t *num_blocks;          /* [max_rows] */
    osp_sampler_row *sampling;    /* [max_rows] the sampler row's params (src/sample/sampler.h): copied from
                                     the request when the row is added; the runner points prompt_ids /
                                     output_ids at the row's token_ids and sets n_output / output_pos each
                                     step (no allocation) */
    int32_t *num_scheduled;       /* [max_rows] this step's tokens, 0 = not scheduled */
    int32_t *num_spec;            /* [max_rows] drafts among them (a verification row), written into
                                     token_ids past num_tokens; 0 = none */
    int32_t *entry;               /* [max_rows] index of the row's osp_sched_entry this step */
    int32_t *pooling;             /* [max_rows] the request's osp_pooling: not NONE for an embedding request
                                     (prefill only: no logits, its hidden states pooled by the runner) */
    int64_t num_moves;            /* rows moved to fill holes, over the batch's life */

    /* model inputs built by osp_pb_build (sized for max_tokens / max_rows) */
    int32_t *in_tokens, *in_positions, *in_slots; /* [max_tokens] */
    int32_t *in_qsl;              /* [max_rows + 1] */
    int32_t *in_seq_lens;         /* [max_rows] */
    int32_t *in_block_table;      /* [max_rows, max_blocks] rows of the scheduled requests */
    int32_t max_logits;           /* sampled logits per step at most: max_rows * (1 + max_spec), capped */
    int32_t *in_logits_idx;       /* [max_logits + OSP_MAX_PROMPT_LP_PER_STEP] sampled rows, then the
                                     runner's prompt-logprob positions */
    int32_t *in_logits_row;       /* [max_logits] the row each logit belongs to */
    int32_t *in_logits_pos;       /* [max_logits] its place in the row's verification window: 0 for the
                                     last token, j for draft j (j = 1..num_spec); 0 without drafts */
    osp_batch batch;
} osp_persistent_batch;

/* max_spec: drafts per row at most (0 without speculative decoding). Errors: OSP_ERR_NOMEM. */
osp_status osp_pb_create(int32_t max_rows, int32_t max_model_len, int32_t block_size, int32_t max_tokens,
                         int32_t max_spec, osp_persistent_batch **out);
void osp_pb_destroy(osp_persistent_batch *pb);

/* Applies the step's diff: drops the rows of out->removed_ids, adds rows for entries with is_new
 * (copying the request's tokens, blocks, params), copies block ids of the others from the first one
 * past their computed tokens (earlier ones never change; later ones may have been rolled back and
 * reallocated), condenses, and records each row's scheduled tokens and drafts (copied past its
 * tokens). Errors: OSP_ERR_INTERNAL on an inconsistent diff. */
osp_status osp_pb_apply(osp_persistent_batch *pb, const osp_sched_output *out);

/* Builds pb->batch for the scheduled rows, in row order: one logit for a row reaching its end (none for
 * an embedding row), 1 + num_spec for a verification row (its last token's and each draft's). Returns
 * the number of logits. */
int32_t osp_pb_build(osp_persistent_batch *pb);

/* Row of a request uid, or -1. */
int32_t osp_pb_find(const osp_persistent_batch *pb, uint64_t id);

#endif
