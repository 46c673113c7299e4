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

/* What one page stores, per layer and per K or V. The quantized layouts (FP8, NVFP4, INT8_HIER) and
 * their second pools are described in src/kv/kv_cache.h. */
typedef struct osp_kv_page_format {
    osp_kv_dtype dtype;       /* the public name of the format */
    uint32_t elem_type;       /* ggml type id of the stored values (F32, F16), or the osp_kv_dtype value
                               * for the quantized formats (OSP_KV_DTYPE_FP8, _NVFP4, _INT8_HIER) */
    int64_t kv_row;           /* values per token: n_head_kv * head_dim */
    int32_t head_dim;         /* values per KV head */
    size_t bytes_per_token;   /* bytes of one token's K (or V) data row in one layer (NVFP4: kv_row / 2;
                               * INT8_HIER: n_head_kv * (head_dim / 2 + 4)) */
    size_t scale_bytes_per_token; /* bytes of one token's K (or V) micro-block scales in one layer (NVFP4:
                                   * kv_row / 16 E4M3 codes; INT8_HIER: kv_row / 2 bytes of lower
                                   * 4-bit codes; 0: no second pool) */
    int32_t fixed_scales_per_layer; /* fp32 scales fixed at creation, per layer, per K or V: FP8 n_head_kv,
                                     * NVFP4 1 (the tensor scale), 0 for f16 / f32 */
    bool k_hadamard;          /* K rows are stored rotated: each KV head's post-RoPE row k becomes H k, H the
                               * orthonormal Walsh-Hadamard matrix of order head_dim (Sylvester's
                               * construction, scaled by 1/sqrt(head_dim); H = H^T = H^-1), and the
                               * RoPE+KV-write op rotates every query head the same way, so q.k is kept
                               * (up to fp32 rounding) while the quantization error of q.k spreads over
                               * all head_dim terms instead of landing on K's outlier channels (QuaRot,
                               * Ashkboos et al. 2024, section 4). V and the attention output are not
                               * rotated. Set at creation for fp8 / nvfp4 pages when head_dim is a power
                               * of two and the backend's RoPE+KV-write op rotates (osp_backend_vtable.
                               * kv_k_hadamard); false for f16 / f32. */
} osp_kv_page_format;

/* K and V pages each have their own format (llama.cpp's --cache-type-k / --cache-type-v): k_fmt and
 * v_fmt share kv_row and head_dim but may differ in dtype, bytes per token, scale pool and fixed
 * scales, e.g. K in fp8 (rotated) with V in nvfp4. v_fmt.k_hadamard is always false. */
struct osp_kv_cache {
    int32_t num_blocks, block_size, n_layer;
    osp_kv_page_format k_fmt, v_fmt;
    void **k;         /* [n_layer] -> pages [num_blocks, block_size, n_head_kv, head_dim] of k_fmt.elem_type
                       * (NVFP4: [.., head_dim / 2] bytes, two values a byte) */
    void **v;         /* same, of v_fmt.elem_type */
    void **k_scale;   /* [n_layer] -> pool [num_blocks, block_size, n_head_kv, head_dim / 16] of E4M3
                       * codes (k_fmt NVFP4), or NULL (no scale pool) */
    void **v_scale;   /* same, for v_fmt */
    float *k_fixed;   /* host [n_layer, k_fmt.fixed_scales_per_layer] fp32, or NULL (f16 / f32) */
    float *v_fixed;   /* host [n_layer, v_fmt.fixed_scales_per_layer] fp32, or NULL */
    void *pages;      /* one backend allocation holding every page and scale pool */
    size_t bytes;
    osp_backend *be;  /* where the pages live (the model's backend) */
    bool hier_upper_only; /* int8_hier pages read through this struct give the upper 4-bit halves only
                           * (QuantSpec's draft view: a shallow copy of the target's cache with this set),
                           * except each query's last hier_full_recent positions, read in full (QuantSpec
                           * keeps its most recent tokens in full precision; the CUDA kernel takes each
                           * sequence's last ones, the same for one query token a sequence: attention.cu);
                           * false (every cache as created): both halves everywhere. Writes ignore it. */
    int32_t hier_full_recent;
    uint64_t id;      /* unique per cache in this process: CUDA graphs captured with one cache's pages
                       * are replayed only with that cache */
    /* A cache made for a tensor-parallel driver model (osp_model_params.tensor_parallel_size without a
     * communicator): this struct holds rank 0's KV heads, tp_ranks[r] (1 <= r < tp_n) rank r's, owned and
     * freed with it; the same blocks and slots in every rank's cache. NULL / 0 otherwise. */
    struct osp_kv_cache **tp_ranks;
    int32_t tp_n;
};

#endif
