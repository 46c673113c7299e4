/* The persistent batch (see persistent_batch.h). Removal leaves a hole that condense() fills with the
 * last row, so occupied rows stay dense; row order is otherwise stable from step to step. */
#include "engine/persistent_batch.h"

#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"

osp_status osp_pb_create(int32_t max_rows, int32_t max_model_len, int32_t block_size, int32_t max_tokens,
                         int32_t max_spec, osp_persistent_batch **out) {
    osp_persistent_batch *pb = calloc(1, sizeof *pb);
    if (!pb) return osp_set_error(OSP_ERR_NOMEM, "persistent batch: out of memory");
    pb->max_rows = max_rows;
    pb->max_model_len = max_model_len;
    pb->block_size = block_size;
    pb->max_blocks = (max_model_len + block_size - 1) / block_size;
    pb->max_tokens = max_tokens;
    const size_t R = (size_t)max_rows;
    /* drafts count in the token budget, so the logits of drafts never outnumber max_tokens */
    int64_t ml = (int64_t)max_rows * (1 + (max_spec > 0 ? max_spec : 0));
    if (max_spec > 0 && ml > (int64_t)max_rows + max_tokens) ml = (int64_t)max_rows + max_tokens;
    pb->max_logits = (int32_t)ml;
    const size_t NL = (size_t)ml;
    pb->req_id = calloc(R, sizeof *pb->req_id);
    pb->token_ids = calloc(R * (size_t)max_model_len, sizeof *pb->token_ids);
    pb->num_tokens = calloc(R, sizeof(int32_t));
    pb->num_prompt = calloc(R, sizeof(int32_t));
    pb->num_computed = calloc(R, sizeof(int32_t));
    pb->block_table = calloc(R * (size_t)pb->max_blocks, sizeof(int32_t));
    pb->num_blocks = calloc(R, sizeof(int32_t));
    pb->sampling = calloc(R, sizeof *pb->sampling);
    pb->num_scheduled = calloc(R, sizeof(int32_t));
    pb->entry = calloc(R, sizeof(int32_t));
    pb->pooling = calloc(R, sizeof(int32_t));
    pb->num_spec = calloc(R, sizeof(int32_t));
    pb->in_tokens = calloc((size_t)max_tokens, sizeof(int32_t));
    pb->in_positions = calloc((size_t)max_tokens, sizeof(int32_t));
    pb->in_slots = calloc((size_t)max_tokens, sizeof(int32_t));
    pb->in_qsl = calloc(R + 1, sizeof(int32_t));
    pb->in_seq_lens = calloc(R, sizeof(int32_t));
    pb->in_block_table = calloc(R * (size_t)pb->max_blocks, sizeof(int32_t));
    pb->in_logits_idx = calloc(NL + OSP_MAX_PROMPT_LP_PER_STEP, sizeof(int32_t));
    pb->in_logits_row = calloc(NL, sizeof(int32_t));
    pb->in_logits_pos = calloc(NL, sizeof(int32_t));
    if (!pb->req_id || !pb->token_ids || !pb->num_tokens || !pb->num_prompt || !pb->num_computed ||
        !pb->block_table || !pb->num_blocks || !pb->sampling || !pb->num_scheduled || !pb->entry || !pb->in_tokens ||
        !pb->in_positions || !pb->in_slots || !pb->in_qsl || !pb->in_seq_lens || !pb->in_block_table ||
        !pb->in_logits_idx || !pb->in_logits_row || !pb->num_spec || !pb->in_logits_pos || !pb->pooling) {
        osp_pb_destroy(pb);
        return osp_set_error(OSP_ERR_NOMEM, "persistent batch: out of memory for %d rows of %d tokens", max_rows,
                             max_model_len);
    }
    *out = pb;
    return OSP_OK;
}

void osp_pb_destroy(osp_persistent_batch *pb) {
    if (!pb) return;
    void *bufs[] = {pb->req_id, pb->token_ids, pb->num_tokens, pb->num_prompt, pb->num_computed, pb->block_table,
                    pb->num_blocks, pb->sampling, pb->num_scheduled, pb->entry, pb->in_tokens, pb->in_positions,
                    pb->in_slots, pb->in_qsl, pb->in_seq_lens, pb->in_block_table, pb->in_logits_idx,
                    pb->in_logits_row, pb->num_spec, pb->in_logits_pos, pb->pooling};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(pb);
}

int32_t osp_pb_find(const osp_persistent_batch *pb, uint64_t id) {
    for (int32_t r = 0; r < pb->num_rows; r++)
        if (pb->req_id[r] == id) return r;
    return -1;
}

static void move_row(osp_persistent_batch *pb, int32_t from, int32_t to) {
    const size_t L = (size_t)pb->max_model_len, B = (size_t)pb->max_blocks;
    pb->req_id[to] = pb->req_id[from];
    memcpy(pb->token_ids + to * L, pb->token_ids + from * L, sizeof(int32_t) * (size_t)pb->num_tokens[from]);
    pb->num_tokens[to] = pb->num_tokens[from];
    pb->num_prompt[to] = pb->num_prompt[from];
    pb->num_computed[to] = pb->num_computed[from];
    memcpy(pb->block_table + to * B, pb->block_table + from * B, sizeof(int32_t) * (size_t)pb->num_blocks[from]);
    pb->num_blocks[to] = pb->num_blocks[from];
    pb->sampling[to] = pb->sampling[from];
    pb->pooling[to] = pb->pooling[from];
    pb->num_moves++;
}

osp_status osp_pb_apply(osp_persistent_batch *pb, const osp_sched_output *out) {
    const size_t L = (size_t)pb->max_model_len, B = (size_t)pb->max_blocks;
    /* removed rows: fill each hole with the last row */
    for (int32_t i = 0; i < out->num_removed; i++) {
        const int32_t r = osp_pb_find(pb, out->removed_ids[i]);
        if (r < 0) continue; /* finished before it ever got a row (aborted while waiting) */
        if (r != pb->num_rows - 1) move_row(pb, pb->num_rows - 1, r);
        pb->num_rows--;
    }
    for (int32_t r = 0; r < pb->num_rows; r++) pb->num_scheduled[r] = pb->num_spec[r] = 0;
    for (int32_t e = 0; e < out->num_entries; e++) {
        const osp_sched_entry *en = &out->entries[e];
        const osp_request *q = en->req;
        int32_t r;
        if (en->is_new) {
            if (osp_pb_find(pb, q->uid) >= 0 || pb->num_rows == pb->max_rows)
                return osp_set_error(OSP_ERR_INTERNAL, "persistent batch: cannot add request %llu",
                                     (unsigned long long)q->id);
            r = pb->num_rows++;
            pb->req_id[r] = q->uid;
            memcpy(pb->token_ids + r * L, q->tokens, sizeof(int32_t) * (size_t)q->num_tokens);
            pb->num_tokens[r] = q->num_tokens;
            pb->num_prompt[r] = q->num_prompt;
            pb->num_blocks[r] = 0;
            pb->sampling[r] = q->sampling;
            pb->pooling[r] = (int32_t)q->pooling;
        } else {
            r = osp_pb_find(pb, q->uid);
            if (r < 0 || pb->num_tokens[r] != q->num_tokens)
                return osp_set_error(OSP_ERR_INTERNAL, "persistent batch: request %llu is out of sync",
                                     (unsigned long long)q->id);
        }
        pb->num_computed[r] = q->num_computed_tokens;
        /* the diff of the block table: ids past what the row holds, and past the computed tokens' blocks
           (a rollback of rejected drafts may have released and since reallocated those) */
        int32_t from = (q->num_computed_tokens + pb->block_size - 1) / pb->block_size;
        if (from > pb->num_blocks[r]) from = pb->num_blocks[r];
        if (from > q->num_blocks) from = q->num_blocks;
        memcpy(pb->block_table + r * B + from, q->block_ids + from, sizeof(int32_t) * (size_t)(q->num_blocks - from));
        pb->num_blocks[r] = q->num_blocks;
        pb->num_scheduled[r] = en->num_scheduled_tokens;
        pb->num_spec[r] = 0; /* a new row may sit where a removed row with drafts was */
        pb->entry[r] = e;
        if (en->num_spec > 0) { /* drafts go past the tokens: read by build, overwritten when rejected */
            if (en->num_spec > OSP_SPEC_MAX_TOKENS || q->num_tokens + en->num_spec > pb->max_model_len ||
                en->num_scheduled_tokens != 1 + en->num_spec || q->num_computed_tokens != q->num_tokens - 1)
                return osp_set_error(OSP_ERR_INTERNAL, "persistent batch: request %llu: bad verification row",
                                     (unsigned long long)q->id);
            memcpy(pb->token_ids + r * L + q->num_tokens, q->spec_tokens, sizeof(int32_t) * (size_t)en->num_spec);
            pb->num_spec[r] = en->num_spec;
        }
    }
    return OSP_OK;
}

int32_t osp_pb_build(osp_persistent_batch *pb) {
    const size_t L = (size_t)pb->max_model_len, B = (size_t)pb->max_blocks;
    const int32_t bs = pb->block_size;
    int32_t t = 0, s = 0, nl = 0;
    pb->in_qsl[0] = 0;
    for (int32_t r = 0; r < pb->num_rows; r++) {
        const int32_t n = pb->num_scheduled[r];
        if (n == 0) continue;
        const int32_t *bt = pb->block_table + r * B, c0 = pb->num_computed[r];
        for (int32_t j = 0; j < n; j++, t++) {
            const int32_t p = c0 + j;
            pb->in_tokens[t] = pb->token_ids[r * L + (size_t)p];
            pb->in_positions[t] = p;
            pb->in_slots[t] = bt[p / bs] * bs + p % bs;
        }
        memcpy(pb->in_block_table + (size_t)s * B, bt, sizeof(int32_t) * (size_t)pb->num_blocks[r]);
        pb->in_seq_lens[s] = c0 + n;
        pb->in_qsl[++s] = t;
        const int32_t ns = pb->num_spec[r];
        if (c0 + n == pb->num_tokens[r] + ns && pb->pooling[r] == OSP_POOLING_NONE) /* reaches the end: sample
                                                                               (each draft's position too) */
            for (int32_t j = 0; j <= ns; j++, nl++) {
                pb->in_logits_idx[nl] = t - 1 - ns + j;
                pb->in_logits_row[nl] = r;
                pb->in_logits_pos[nl] = j;
            }
    }
    pb->batch = (osp_batch){.num_tokens = t, .token_ids = pb->in_tokens, .positions = pb->in_positions,
                            .slot_mapping = pb->in_slots, .num_seqs = s, .query_start_loc = pb->in_qsl,
                            .seq_lens = pb->in_seq_lens, .block_table = pb->in_block_table,
                            .max_blocks_per_seq = pb->max_blocks, .num_logits = nl, .logits_indices = pb->in_logits_idx};
    return nl;
}
