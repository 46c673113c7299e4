/* Sparse attention on the CPU engine path (issue 15): an attention hook (src/backend/backend.h) that
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
 * on its own inputs: a request's outputs never depend on the rest of its batch. */
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
void osp_sparse_runtime_free(osp_sparse_runtime *rt); /* NULL is fine */
/* The hook to pass in osp_run_io (valid while rt lives). */
const osp_attn_hook *osp_sparse_runtime_hook(osp_sparse_runtime *rt);
osp_sparse_runtime_stats osp_sparse_runtime_get_stats(const osp_sparse_runtime *rt);

#endif
