/* The paged KV cache (vLLM's PagedAttention, Kwon et al. 2023, §4): per layer, K and V pages
 * [num_blocks, block_size, n_head_kv, head_dim] in a backend's memory, addressed by block ids from
 * the block pool (src/kv/block_pool.c). What a page holds is described by a page format, so quantized
 * pages (FP8 E4M3, NVFP4: E2M1 values with an E4M3 scale per 16 and an FP32 tensor scale) arrive as a
 * new format, with a scale pool beside the data pages addressed by the same block ids, without
 * touching the model code: ops read `fmt` and the page pointers below, nothing else.
 *
 * Internal to src/ (the public face is osprey/model.h's osp_kv_cache_* functions). */
#ifndef OSP_KV_KV_CACHE_H
#define OSP_KV_KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "osprey/model.h"

typedef struct osp_backend osp_backend;

/* What one page stores, per layer and per K or V. */
typedef struct osp_kv_page_format {
    osp_kv_dtype dtype;       /* the public name of the format */
    uint32_t elem_type;       /* ggml type id of the stored values (F32, F16) */
    int64_t kv_row;           /* values per token: n_head_kv * head_dim */
    size_t bytes_per_token;   /* bytes of one token's K (or V) row in one layer */
    size_t scale_bytes_per_block; /* bytes of block scales per block, per layer, per K or V (0: none) */
} osp_kv_page_format;

/* The page format of `dtype` for a model of `c`. OSP_ERR_INVALID_ARG for an unknown dtype,
 * OSP_ERR_UNSUPPORTED when the shapes do not fit it. */
osp_status osp_kv_page_format_of(const osp_model_config *c, osp_kv_dtype dtype, osp_kv_page_format *out);

struct osp_kv_cache {
    int32_t num_blocks, block_size, n_layer;
    osp_kv_page_format fmt;
    void **k;         /* [n_layer] -> pages [num_blocks, block_size, kv_row] of fmt.elem_type */
    void **v;         /* same */
    void **k_scale;   /* [n_layer] -> [num_blocks, scale_bytes_per_block] or NULL (no scales) */
    void **v_scale;
    void *pages;      /* one backend allocation holding every page and scale pool */
    size_t bytes;
    osp_backend *be;  /* where the pages live (the model's backend) */
    const void *owner; /* the model it was made for */
    uint64_t id;      /* unique per cache in this process: CUDA graphs captured with one cache's pages
                       * are replayed only with that cache */
};

/* Creates a cache of num_blocks blocks on backend `be` for the model config `c` (owner: the model).
 * Errors: OSP_ERR_INVALID_ARG (non-positive sizes, unknown dtype), OSP_ERR_NOMEM. */
osp_status osp_kv_cache_create_on(osp_backend *be, const void *owner, const osp_model_config *c, int32_t num_blocks,
                                  int32_t block_size, osp_kv_dtype dtype, osp_kv_cache **out);

#endif
