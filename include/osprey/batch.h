/* The words a model and a backend share: where a forward pass runs (osp_device), what KV pages hold
 * (osp_kv_dtype) and one step's inputs (osp_batch: the flattened variable-length batch of
 * shared/DESIGN.md §1). Included by osprey/model.h and osprey/kv_cache.h; the backends
 * (src/backend/) include this alone, so they know the step's shape but nothing of models or of the
 * KV manager. */
#ifndef OSPREY_BATCH_H
#define OSPREY_BATCH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where the forward pass runs. */
typedef enum osp_device {
    OSP_DEVICE_CPU = 0,  /* the CPU backend (src/backend/cpu): weights stay in the GGUF mapping */
    OSP_DEVICE_CUDA = 1, /* the CUDA backend (src/backend/cuda): weights in bf16 on GPU 0, KV pages there */
} osp_device;


/* Element type of the KV cache pages. Values of the plain types are ggml type ids; the quantized
 * ones (no ggml id) take ids of their own above ggml's range. New values are appended. The layouts
 * of the quantized pages and their scale pools: src/kv/kv_cache.h. */
typedef enum osp_kv_dtype {
    OSP_KV_DTYPE_F32 = 0,    /* exact: what the exactness tests use */
    OSP_KV_DTYPE_F16 = 1,    /* default on the CPU (as llama.cpp); K/V rounded to nearest even on write */
    OSP_KV_DTYPE_BF16 = 30,  /* named so it can be refused clearly: no backend has bf16 pages yet */
    OSP_KV_DTYPE_FP8 = 128,  /* FP8 E4M3 values, one fixed fp32 scale per layer and KV head */
    OSP_KV_DTYPE_NVFP4 = 129, /* E2M1 values, an E4M3 scale per 16, one fixed fp32 scale per layer (K, V) */
    OSP_KV_DTYPE_INT8_HIER = 130, /* QuantSpec's hierarchical INT8: a 4-bit upper and a 4-bit lower half per
                                   * value, an f16 scale and minimum per token and KV head; readable as
                                   * 8-bit (both halves) or 4-bit (upper halves only: a self-draft's view) */
} osp_kv_dtype;

/* One step's inputs, the flattened variable-length batch (all arrays caller-owned). */
typedef struct osp_batch {
    int32_t num_tokens;
    const int32_t *token_ids;       /* [num_tokens] */
    const int32_t *positions;       /* [num_tokens] position of each token in its sequence */
    const int32_t *slot_mapping;    /* [num_tokens] KV slot each token's K/V is written to */
    int32_t num_seqs;
    const int32_t *query_start_loc; /* [num_seqs + 1], query_start_loc[0] = 0, last = num_tokens */
    const int32_t *seq_lens;        /* [num_seqs] tokens in the KV cache after this step */
    const int32_t *block_table;     /* [num_seqs, max_blocks_per_seq] block ids */
    int32_t max_blocks_per_seq;
    int32_t num_logits;
    const int32_t *logits_indices;  /* [num_logits] rows of the batch whose logits are wanted */
} osp_batch;

#ifdef __cplusplus
}
#endif
#endif
