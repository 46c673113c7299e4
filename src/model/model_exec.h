/* What the engine (src/engine/) needs of a model beyond include/osprey/model.h: the device-side
 * results of the last forward (sampling there, logits copied back on demand) and the device's free
 * memory for sizing the KV cache. Every call goes to the model's backend (src/backend/backend.h); the
 * engine never learns which device that is. Internal to src/. */
#ifndef OSP_MODEL_MODEL_EXEC_H
#define OSP_MODEL_MODEL_EXEC_H

#include <stdbool.h>

#include "backend/backend.h"
#include "backend/op.h"
#include "osprey/model.h"
#include "sample/sampler.h"

/* true when the logits of a forward stay on the model's device (pass logits = NULL to forward, then
 * sample with osp_model_sample); false on the CPU (logits go to the caller's buffer). */
bool osp_model_samples_on_device(const osp_model *m);
/* Samples rows[i] from row logits_rows[i] of the last forward's device logits, with the CPU
 * sampler's rules (src/sample/sampler.h). tokens [n], status [n], logprobs [n] (NULL: none). Returns
 * once the results are on the host; OSP_OK unless the call itself failed (row failures in status).
 * Only when osp_model_samples_on_device. */
osp_status osp_model_sample(osp_model *m, const osp_sampler_row *rows, const int32_t *logits_rows, int32_t n,
                            int32_t *tokens, osp_logprobs *logprobs, osp_status *status);
/* Copies rows [row0, row0 + n) of the last forward's logits to dst [n, n_vocab] (synchronous). */
osp_status osp_model_logits_to_host(osp_model *m, int32_t row0, int32_t n, float *dst);
/* Waits until everything enqueued on the model's device has finished (a no-op on the CPU): timed
 * regions start and end with it. */
osp_status osp_model_sync(osp_model *m);
/* The step timeline (backend.h timeline_enable / timeline_get): false where the model's backend has no
 * device clock (the CPU), and nothing is recorded; else true once enabled (errors: the backend's). */
osp_status osp_model_timeline_enable(osp_model *m, bool *enabled);
/* The last forward's device spans (and its sampler's) on the host's CLOCK_MONOTONIC, in seconds; every
 * field -1 where the timeline is off or the step had none. Waits for them. */
osp_status osp_model_timeline_get(osp_model *m, osp_backend_step_times *t);
/* Free and total bytes of the model's device memory (the host's on the CPU). */
osp_status osp_model_mem_info(osp_model *m, size_t *free_bytes, size_t *total_bytes);
/* osp_model_forward that also copies the hidden states the model was loaded to return
 * (osp_model_params.hidden_layers, in that order) to hidden[i]: fp32 [num_tokens, n_embd] each, on the
 * host (synchronous then). hidden may be NULL (none copied). Errors as osp_model_forward. */
osp_status osp_model_forward_hidden(osp_model *m, osp_kv_cache *kv, const osp_batch *b, float *logits,
                                    float *const *hidden);
/* osp_model_forward_hidden that also writes the output norm of every token of the batch (the RMSNorm
 * with output_norm.weight that the lm_head reads: llama.cpp's "result_norm", what its embeddings pool)
 * to embd: fp32 [num_tokens, n_embd], host, caller-owned (synchronous then). Runs the op list with that
 * norm appended (an extra op over all tokens; the logits tail as usual for num_logits > 0). On the CPU
 * the values are fp32; on the GPU they pass through bf16 as the logits' norm does. embd NULL: exactly
 * osp_model_forward_hidden. Errors as osp_model_forward. */
osp_status osp_model_forward_embd(osp_model *m, osp_kv_cache *kv, const osp_batch *b, float *logits,
                                  float *const *hidden, float *embd);
/* Runs every ATTENTION op of later forwards through `hook` (src/backend/backend.h; sparse attention,
 * src/sparse/engine_hook.h) instead of the backend's own attention; NULL restores it. The hook must
 * outlive its use. Only backends that take hooks (the CPU) run forwards with one: the others return
 * OSP_ERR_UNSUPPORTED from the forward. */
void osp_model_set_attn_hook(osp_model *m, const osp_attn_hook *hook);
/* Runs later forwards with sparse attention on the model's device (osp_run_io.dev_sparse,
 * src/backend/backend.h; made by src/sparse/engine_hook.h's osp_sparse_runtime_create_device); NULL
 * restores dense attention. `ds` must outlive its use; the backend adds to its counters at every forward.
 * Only backends with supports_dev_sparse (CUDA) run forwards with one: the others return
 * OSP_ERR_UNSUPPORTED from the forward. */
void osp_model_set_dev_sparse(osp_model *m, osp_dev_sparse *ds);
/* The op list a forward runs (tests, dumps). */
const osp_graph *osp_model_graph(const osp_model *m, bool with_logits);

#endif
