/* The model runner (see model_runner.h). All buffers are sized at creation: a step allocates nothing
 * beyond what the forward pass's workspace already holds after the first steps. */
#include "engine/model_runner.h"

#include <stdlib.h>

#include "core/status_internal.h"

osp_status osp_runner_create(osp_model *m, int32_t num_blocks, int32_t block_size, osp_kv_dtype dtype,
                             int32_t max_rows, int32_t max_model_len, int32_t max_tokens, osp_model_runner **out) {
    *out = NULL;
    osp_model_runner *r = calloc(1, sizeof *r);
    if (!r) return osp_set_error(OSP_ERR_NOMEM, "model runner: out of memory");
    r->model = m;
    r->n_vocab = osp_model_config_get(m)->n_vocab;
    osp_status s = osp_kv_cache_create(m, num_blocks, block_size, dtype, &r->kv);
    if (s == OSP_OK) s = osp_pb_create(max_rows, max_model_len, block_size, max_tokens, &r->pb);
    if (s == OSP_OK) {
        r->logits = malloc(sizeof(float) * (size_t)max_rows * (size_t)r->n_vocab);
        r->work = malloc(sizeof(float) * 2 * (size_t)r->n_vocab);
        if (!r->logits || !r->work) s = osp_set_error(OSP_ERR_NOMEM, "model runner: out of memory for logits");
    }
    if (s != OSP_OK) {
        osp_runner_destroy(r);
        return s;
    }
    *out = r;
    return OSP_OK;
}

void osp_runner_destroy(osp_model_runner *r) {
    if (!r) return;
    osp_kv_cache_free(r->kv);
    osp_pb_destroy(r->pb);
    free(r->logits);
    free(r->work);
    free(r);
}

osp_status osp_runner_execute(osp_model_runner *r, osp_sched_output *out) {
    osp_persistent_batch *pb = r->pb;
    OSP_TRY(osp_pb_apply(pb, out));
    if (out->num_entries == 0) return OSP_OK;
    const int32_t nl = osp_pb_build(pb);
    OSP_TRY(osp_model_forward(r->model, r->kv, &pb->batch, r->logits));
    for (int32_t i = 0; i < nl; i++) {
        const int32_t row = pb->in_logits_row[i];
        const uint64_t out_pos = (uint64_t)(pb->num_tokens[row] - pb->num_prompt[row]);
        int32_t tok;
        OSP_TRY(osp_sample(r->logits + (size_t)i * r->n_vocab, r->n_vocab, &pb->sampling[row], out_pos, r->work, &tok));
        pb->token_ids[(size_t)row * pb->max_model_len + pb->num_tokens[row]++] = tok;
        out->entries[pb->entry[row]].sampled = tok;
    }
    for (int32_t row = 0; row < pb->num_rows; row++) pb->num_computed[row] += pb->num_scheduled[row];
    return OSP_OK;
}
