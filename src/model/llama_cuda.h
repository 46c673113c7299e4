/* The llama-family forward pass on the CUDA backend (llama_cuda.c): weights uploaded once in bf16,
 * KV pages on the device, one stream, cuBLASLt GEMMs, decode steps replayed from CUDA graphs, and the
 * sampler on the device so a step copies back only token ids (and logprobs when asked).
 *
 * Internal to src/model and src/engine; plain C (the CUDA types stay in src/backend/cuda/). Every
 * function returns OSP_ERR_UNSUPPORTED when osprey is built without CUDA. */
#ifndef OSP_MODEL_LLAMA_CUDA_H
#define OSP_MODEL_LLAMA_CUDA_H

#include "model/llama_internal.h"
#include "sample/sampler.h"

/* Uploads m's weights (bound on the host by osp_model_load) and makes the stream, the cuBLASLt handle
 * and the GEMM plans' workspace; sets m->gpu. */
osp_status osp_llama_cuda_init(osp_model *m, const osp_model_params *p);
/* The same with the seeded random weights of m's preset (model/presets.h) drawn on the GPU. */
osp_status osp_llama_cuda_init_random(osp_model *m, uint64_t seed, const osp_model_params *p);
void osp_llama_cuda_free(osp_cuda_model *g);
size_t osp_llama_cuda_weight_bytes(const osp_cuda_model *g);

/* Device pages for kv (its sizes already set): one allocation, zeroed. */
osp_status osp_llama_cuda_kv_alloc(osp_model *m, osp_kv_cache *kv);
void osp_llama_cuda_kv_free(osp_kv_cache *kv);
osp_status osp_llama_cuda_copy_block(osp_kv_cache *kv, int32_t src, int32_t dst);

/* Runs the batch (checked by the caller). Logits [num_logits, n_vocab] fp32 stay on the device for
 * osp_llama_cuda_sample; when `logits` is non-NULL they are also copied there (synchronously). */
osp_status osp_llama_cuda_forward(osp_model *m, osp_kv_cache *kv, const osp_batch *b, float *logits);

/* Copies rows [row0, row0 + n) of the last forward's logits to dst [n, n_vocab] (synchronous). */
osp_status osp_llama_cuda_logits_to_host(osp_model *m, int32_t row0, int32_t n, float *dst);

/* Samples rows[i] from row logits_rows[i] of the last forward's logits, on the device, with the CPU
 * sampler's rules (src/sample/sampler.h, backend/cuda/cuda_sample.h). tokens [n], status [n],
 * logprobs [n] (may be NULL; filled for rows with num_logprobs >= 0). Synchronous: returns once the
 * results are on the host. Returns OSP_OK unless the call itself failed (row failures are in status). */
osp_status osp_llama_cuda_sample(osp_model *m, const osp_sampler_row *rows, const int32_t *logits_rows, int32_t n,
                                 int32_t *tokens, osp_logprobs *logprobs, osp_status *status);

#endif
