/* Internals of the llama-family model shared by its CPU forward (llama.c) and its CUDA forward
 * (llama_cuda.c): the weight views, the model and the KV cache structs. Not a public header. */
#ifndef OSP_MODEL_LLAMA_INTERNAL_H
#define OSP_MODEL_LLAMA_INTERNAL_H

#include "backend/cpu/ops.h"
#include "backend/cpu/qdot.h"
#include "core/threadpool.h"
#include "osprey/model.h"

typedef struct osp_cuda_model osp_cuda_model; /* llama_cuda.c: weights, buffers and graphs on the GPU */

typedef struct layer_weights {
    const float *attn_norm; /* [n_embd] */
    osp_weight wq;          /* [n_embd] -> [n_head * head_dim] */
    osp_weight wk;          /* [n_embd] -> [n_head_kv * head_dim] */
    osp_weight wv;          /* [n_embd] -> [n_head_kv * head_dim] */
    const float *bq, *bk, *bv; /* [n_head * head_dim], [n_head_kv * head_dim] x2; NULL without qkv_bias */
    const float *q_norm, *k_norm; /* [head_dim] each; NULL without qk_norm */
    osp_weight wo;          /* [n_head * head_dim] -> [n_embd] */
    const float *ffn_norm;  /* [n_embd] */
    osp_weight w_gate;      /* [n_embd] -> [n_ff] */
    osp_weight w_up;        /* [n_embd] -> [n_ff] */
    osp_weight w_down;      /* [n_ff] -> [n_embd] */
} layer_weights;

/* Activations and scratch for one forward pass, grown on demand (never on a steady decode step). */
typedef struct workspace {
    int64_t cap_tokens, cap_logits, cap_ctx, cap_xq;
    float *x, *xn, *q, *k, *v, *attn, *gate, *up; /* [cap_tokens, ...] */
    float *out_rows;                              /* [cap_logits, n_embd] */
    float *scratch;                               /* [n_threads, max matmul cols] */
    float *scores;                                /* [n_threads, cap_ctx] */
    osp_q8_block *xq;                             /* [cap_tokens, max(E, QD, F) / 32] fast path */
} workspace;

struct osp_model {
    osp_gguf *gguf;
    osp_model_config cfg;
    int n_threads;
    bool exact;             /* fp32 activations everywhere (the reference path) */
    bool emulate_bf16;      /* exact path with the CUDA backend's bf16 roundings (osp_model_params) */
    osp_threadpool *pool;   /* n_threads workers; one parallel region per forward */
    osp_weight tok_embd;    /* [n_embd] x n_vocab rows */
    osp_weight output;      /* lm_head: n_vocab rows of n_embd (== tok_embd when tied) */
    const float *out_norm;  /* [n_embd] */
    layer_weights *layers;  /* [n_layer] */
    float *inv_freq;        /* [n_rot / 2] RoPE inverse frequencies */
    workspace ws;
    osp_cuda_model *gpu;    /* non-NULL when the model runs on the GPU (params.device) */
};

struct osp_kv_cache {
    int32_t num_blocks, block_size, n_layer;
    osp_kv_dtype dtype;
    size_t elem;    /* bytes per element: 4 (f32) or 2 (f16) */
    int64_t kv_row; /* n_head_kv * head_dim elements per slot */
    void **k;       /* [n_layer] -> [num_blocks, block_size, n_head_kv, head_dim] of dtype */
    void **v;       /* same */
    bool on_device; /* k[l], v[l] point into one device allocation (device_pages) */
    void *device_pages;
    void *stream;   /* the model's CUDA stream (device caches) */
    uint64_t id;    /* unique per cache in this process: CUDA graphs captured with one cache's pages
                     * are replayed only with that cache */
};

#endif
