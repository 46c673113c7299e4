/* What a paged KV cache looks like to the ops that read and write it (RoPE + KV write, attention):
 * the page format and the page pointers of each layer. The cache itself (sizing, allocation on a
 * backend, block copies) is src/kv/kv_cache.c; this header sits in src/backend/ so that backends
 * depend on the layout only, not on the KV manager above them. Internal to src/. */
#ifndef OSP_BACKEND_KV_LAYOUT_H
#define OSP_BACKEND_KV_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "osprey/batch.h"

typedef struct osp_backend osp_backend;
typedef struct osp_kv_cache osp_kv_cache;

/* What one page stores, per layer and per K or V. */
typedef struct osp_kv_page_format {
    osp_kv_dtype dtype;       /* the public name of the format */
    uint32_t elem_type;       /* ggml type id of the stored values (F32, F16) */
    int64_t kv_row;           /* values per token: n_head_kv * head_dim */
    size_t bytes_per_token;   /* bytes of one token's K (or V) row in one layer */
    size_t scale_bytes_per_block; /* bytes of block scales per block, per layer, per K or V (0: none) */
} osp_kv_page_format;

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
    uint64_t id;      /* unique per cache in this process: CUDA graphs captured with one cache's pages
                       * are replayed only with that cache */
};


#endif
