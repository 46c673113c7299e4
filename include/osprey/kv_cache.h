/* The paged KV cache's handle (created for a model by osprey/model.h's osp_kv_cache_create): its
 * page type and the functions that need no model. Implemented in src/kv/kv_cache.c. */
#ifndef OSPREY_KV_CACHE_H
#define OSPREY_KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "osprey/batch.h"
#include "osprey/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct osp_kv_cache osp_kv_cache;


/* "f32", "f16", "bf16", "fp8", "nvfp4" or "int8_hier", or NULL for an unknown value. */
const char *osp_kv_dtype_name(osp_kv_dtype d);
/* Parses a --kv-cache-dtype value: auto (= f16, the default, so outputs stay as before), f16, bf16,
 * f32, fp8, nvfp4, int8_hier, and vLLM's spellings fp16, float16, bfloat16, float32, fp8_e4m3. Case-sensitive.
 * OSP_ERR_INVALID_ARG (with the accepted list) otherwise; *out unchanged then. Parsing bf16 succeeds;
 * creating bf16 pages is refused (OSP_ERR_UNSUPPORTED) since no backend has them. */
osp_status osp_kv_dtype_parse(const char *name, osp_kv_dtype *out);
/* Whether any backend has pages of dtype d, checked before a model is loaded: OSP_OK, or
 * OSP_ERR_INVALID_ARG for an unknown value, OSP_ERR_UNSUPPORTED for bf16 (no backend has bf16 pages;
 * refused rather than silently stored as something else). */
osp_status osp_kv_dtype_available(osp_kv_dtype d);
/* True for the quantized page types (fp8, nvfp4, int8_hier): not exact, refused with --exact. */
bool osp_kv_dtype_quantized(osp_kv_dtype d);

/* Bytes of the cache's pages (host or device memory); a tensor-parallel driver's cache counts every rank's. */
size_t osp_kv_cache_bytes(const osp_kv_cache *kv);
void osp_kv_cache_free(osp_kv_cache *kv);
int32_t osp_kv_cache_block_size(const osp_kv_cache *kv);
int32_t osp_kv_cache_num_blocks(const osp_kv_cache *kv);
/* The K pages' dtype, and the V pages' (the same unless the cache is split, e.g. K fp8 + V nvfp4). */
osp_kv_dtype osp_kv_cache_dtype(const osp_kv_cache *kv);
osp_kv_dtype osp_kv_cache_dtype_v(const osp_kv_cache *kv);
/* Copies block `src`'s K/V (every layer) into block `dst` (copy-on-write after a fork). On the GPU
 * the copy is enqueued on the model's stream, ahead of the next forward pass. Errors:
 * OSP_ERR_INVALID_ARG for a block outside the cache, OSP_ERR_INTERNAL when the device copy fails. */
osp_status osp_kv_cache_copy_block(osp_kv_cache *kv, int32_t src, int32_t dst);

#ifdef __cplusplus
}
#endif
#endif
