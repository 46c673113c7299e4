/* The paged KV cache (vLLM's PagedAttention, Kwon et al. 2023, §4): per layer, K and V pages
 * [num_blocks, block_size, n_head_kv, head_dim] in a backend's memory, addressed by block ids from
 * the block pool (src/kv/block_pool.c). What a page holds is described by a page format, so quantized
 * pages (FP8 E4M3, NVFP4: E2M1 values with an E4M3 scale per 16 and an FP32 tensor scale) arrive as a
 * new format, with a scale pool beside the data pages addressed by the same block ids, without
 * touching the model code: ops read the format and the page pointers (src/backend/kv_layout.h), nothing
 * else.
 *
 * Internal to src/ (the public face is osprey/model.h's osp_kv_cache_* functions). */
#ifndef OSP_KV_KV_CACHE_H
#define OSP_KV_KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/kv_layout.h"
#include "osprey/kv_cache.h"

/* The attention shape a cache serves (from the model's config). */
typedef struct osp_kv_shape {
    int32_t n_layer, n_head_kv, head_dim;
} osp_kv_shape;

/* The page format of `dtype` for shape `sh`. OSP_ERR_INVALID_ARG for an unknown dtype,
 * OSP_ERR_UNSUPPORTED when the shapes do not fit it. */
osp_status osp_kv_page_format_of(const osp_kv_shape *sh, osp_kv_dtype dtype, osp_kv_page_format *out);

/* Creates a cache of num_blocks blocks on backend `be` for shape `sh`. The cache holds a reference to
 * the backend, so it may be freed after the model. Errors: OSP_ERR_INVALID_ARG (non-positive sizes,
 * unknown dtype, sizes beyond size_t), OSP_ERR_NOMEM. */
osp_status osp_kv_cache_create_on(osp_backend *be, const osp_kv_shape *sh, int32_t num_blocks,
                                  int32_t block_size, osp_kv_dtype dtype, osp_kv_cache **out);

#endif
