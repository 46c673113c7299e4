/* The model runner: owns the KV cache pages and the persistent batch; per step it applies the
 * scheduler's diff, builds the flattened batch, runs the forward pass (prefill chunks and decodes
 * together) and samples one token for every row whose scheduled tokens reach its end. Sampling is per
 * row through the one-row sampler for now (src/sample/sampler.h); the batched sampler takes the
 * persistent batch's per-row params when it lands. */
#ifndef OSP_ENGINE_MODEL_RUNNER_H
#define OSP_ENGINE_MODEL_RUNNER_H

#include "engine/persistent_batch.h"

typedef struct osp_model_runner {
    osp_model *model;              /* not owned */
    osp_kv_cache *kv;
    osp_persistent_batch *pb;
    int32_t n_vocab;
    float *logits;                 /* [max_rows, n_vocab] */
    float *work;                   /* [2 * n_vocab] sampler workspace */
} osp_model_runner;

/* Errors: those of osp_kv_cache_create, OSP_ERR_NOMEM. */
osp_status osp_runner_create(osp_model *m, int32_t num_blocks, int32_t block_size, osp_kv_dtype dtype,
                             int32_t max_rows, int32_t max_model_len, int32_t max_tokens, osp_model_runner **out);
void osp_runner_destroy(osp_model_runner *r);

/* Runs one step for `out` and fills out->entries[i].sampled (-1 for rows still mid-prefill). Errors:
 * osp_model_forward's and osp_sample's; OSP_ERR_INTERNAL for a diff out of sync. */
osp_status osp_runner_execute(osp_model_runner *r, osp_sched_output *out);

#endif
