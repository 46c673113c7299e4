/* Sparse attention on the engine path (issue 15). On the CPU: an attention hook (src/backend/backend.h) that
 * keeps Quest page summaries beside the KV cache, selects pages per query token and KV head
 * (--sparse-attention topk:PAGES[,recent:R][,sink:S], osprey/sparse.h), builds the step's work table
 * and runs block-sparse attention over it.
 *
 * Per ATTENTION op (one layer), prepare:
 *  1. every page this step wrote into gets its summary recomputed from its written slots (so copies,
 *     reuse and prefix-cache hits never leave a stale summary);
 *  2. each query token whose context fits in the budget (p / block_size + 1 <= PAGES) runs the dense
 *     kernel, unchanged (budget at or above the context: dense, by definition); the others get Quest's
 *     pages (quest.h), shared per KV head, as candidates;
 *  3. sliding-window layers (Gemma 3's local layers) run through the BlockMask instead: a dense table
 *     with the sliding-window mask, so only the tiles inside the window are read.
 * The choice is per token, from the token's own position alone, and every row's arithmetic depends only
 * on its own inputs: a request's outputs never depend on the rest of its batch.
 *
 * On a GPU (osp_sparse_runtime_create_device) the runtime only owns the device summaries and the
 * counters; the backend does steps 1-2 with its kernels (osp_dev_sparse in src/backend/backend.h, the
 * CUDA backend's ATTENTION op in src/backend/cuda/backend_cuda.c), sliding-window layers staying dense. */
#ifndef OSP_SPARSE_ENGINE_HOOK_H
#define OSP_SPARSE_ENGINE_HOOK_H

#include <stdint.h>

#include "backend/backend.h"
#include "osprey/sparse.h"
#include "osprey/status.h"

typedef struct osp_sparse_runtime osp_sparse_runtime;

typedef struct osp_sparse_runtime_stats {
    int64_t calls;            /* ATTENTION ops run through the hook */
    int64_t dense_tokens;     /* (token, layer) pairs whose context fit the budget: dense kernel */
    int64_t sparse_tokens;    /* (token, layer) pairs that read selected pages (or a BlockMask) */
    int64_t tiles_read;       /* KV tiles (pages) the sparse pairs read, summed over KV heads */
    int64_t tiles_dense;      /* what dense causal attention of the same pairs would read */
    int64_t bytes_read;       /* K and V bytes of tiles_read */
} osp_sparse_runtime_stats;

/* Creates the runtime for a cache of `kv`'s shape (num_blocks, block_size, n_layer, page format).
 * cfg must pass osp_sparse_config_check and not be OSP_SPARSE_NONE. OSP_ERR_INVALID_ARG, OSP_ERR_NOMEM. */
osp_status osp_sparse_runtime_create(const osp_sparse_config *cfg, const osp_kv_cache *kv, osp_sparse_runtime **out);
/* The device runtime, for a cache whose pages live on a backend with supports_dev_sparse (CUDA): the
 * page summaries are allocated there (kv->be's buffer_alloc: [n_layer, num_blocks, n_head_kv, head_dim]
 * f16 min and max, 4 n_layer n_head_kv head_dim bytes a block, osp_sparse_device_bytes_per_block) and the
 * backend itself refreshes them, selects and runs the block-sparse kernel (osp_dev_sparse,
 * src/backend/backend.h); such a runtime has no hook. n_head: the model's query heads (the kernels'
 * group limits). The runtime keeps a reference to kv's backend until it is freed. Errors:
 * OSP_ERR_INVALID_ARG (cfg, no cache), OSP_ERR_UNSUPPORTED (the backend has no device sparse attention,
 * or not for this cache / head shape: the message says why), OSP_ERR_NOMEM (host or device memory). */
osp_status osp_sparse_runtime_create_device(const osp_sparse_config *cfg, const osp_kv_cache *kv, int32_t n_head,
                                            osp_sparse_runtime **out);
/* Device bytes of the summaries per KV block (both min and max, every layer) for a cache of n_layer
 * layers, n_head_kv KV heads of head_dim: what a device runtime adds to each block's cost. */
int64_t osp_sparse_device_bytes_per_block(int32_t n_layer, int32_t n_head_kv, int32_t head_dim);
void osp_sparse_runtime_free(osp_sparse_runtime *rt); /* NULL is fine */
/* The hook to pass in osp_run_io (valid while rt lives); NULL for a device runtime. */
const osp_attn_hook *osp_sparse_runtime_hook(osp_sparse_runtime *rt);
/* The osp_dev_sparse to pass in osp_run_io (valid while rt lives); NULL for a host runtime. */
osp_dev_sparse *osp_sparse_runtime_device(osp_sparse_runtime *rt);
/* The counters so far (a device runtime: what the backend counted, from each step's positions). */
osp_sparse_runtime_stats osp_sparse_runtime_get_stats(const osp_sparse_runtime *rt);

#endif
