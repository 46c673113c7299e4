/* The paged KV cache's handle (created for a model by osprey/model.h's osp_kv_cache_create): its
 * page type and the functions that need no model. Implemented in src/kv/kv_cache.c. */
#ifndef OSPREY_KV_CACHE_H
#define OSPREY_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "osprey/batch.h"
#include "osprey/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct osp_kv_cache osp_kv_cache;


/* "f32" / "f16", or NULL for an unknown value. */
const char *osp_kv_dtype_name(osp_kv_dtype d);
/* Parses "f32" / "f16". OSP_ERR_INVALID_ARG otherwise. */
osp_status osp_kv_dtype_parse(const char *name, osp_kv_dtype *out);

/* Bytes of the cache's pages (host or device memory). */
size_t osp_kv_cache_bytes(const osp_kv_cache *kv);
void osp_kv_cache_free(osp_kv_cache *kv);
int32_t osp_kv_cache_block_size(const osp_kv_cache *kv);
int32_t osp_kv_cache_num_blocks(const osp_kv_cache *kv);
osp_kv_dtype osp_kv_cache_dtype(const osp_kv_cache *kv);
/* Copies block `src`'s K/V (every layer) into block `dst` (copy-on-write after a fork). On the GPU
 * the copy is enqueued on the model's stream, ahead of the next forward pass. Errors:
 * OSP_ERR_INVALID_ARG for a block outside the cache, OSP_ERR_INTERNAL when the device copy fails. */
osp_status osp_kv_cache_copy_block(osp_kv_cache *kv, int32_t src, int32_t dst);

#ifdef __cplusplus
}
#endif
#endif
