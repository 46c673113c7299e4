/* The op list: what an architecture builder (src/model/arch_*.c) emits and a backend
 * (src/backend/backend.h) runs. A model is written once, as a list of these ops over named
 * activations; the CPU backend runs the list in one thread-pool region with barriers between ops,
 * the CUDA backend enqueues it on a stream (and captures it as a CUDA graph). Every op kind has a CPU
 * reference (src/backend/cpu/backend_cpu.c) that tests/ops/ checks every other backend against.
 *
 * Shapes follow ggml: a matrix of ne = [cols, rows] stores `rows` rows of `cols` values; y = x W^T
 * multiplies activation rows x [T, cols] by it into y [T, rows].
 *
 * Activations are declared in the list (osp_graph.acts) with a column count, a row kind (one row per
 * batch token, or one per logits row) and a dtype: the precision the builder asks for. The CUDA
 * backend stores them in that dtype; the CPU backend keeps fp32 and, when emulating (its
 * emulate_bf16 mode), rounds every value written to a BF16 activation, which reproduces the GPU's
 * roundings on the CPU with the same op list. Fused kinds (add + RMSNorm, bias + q/k norm + RoPE +
 * KV write) are the ones the CUDA backend fuses today; the CPU runs them as the plain composition. */
#ifndef OSP_BACKEND_OP_H
#define OSP_BACKEND_OP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "osprey/status.h"

/* One stored matrix or vector on a backend: `rows` rows of `cols` values of ggml type `type`, each
 * row `row_bytes` bytes apart, from `data` (host memory on the CPU: usually inside the GGUF mapping;
 * device memory on the GPU). */
typedef struct osp_tensor_part {
    const void *data;
    uint32_t type;
    int64_t rows;
    size_t row_bytes;
    uint8_t layout; /* osp_part_layout: how the backend that placed the part laid its rows out */
} osp_tensor_part;

/* A part's layout in the placing backend's memory: as stored (rows row_bytes apart), or (the CPU backend,
 * src/backend/cpu/qdot8b.h) in 16-row strips for its one-token GEMV, read back a row at a time through
 * osp_q8b_strips_row. The same bytes either way. */
typedef enum osp_part_layout {
    OSP_PART_STORED = 0,
    OSP_PART_STRIPS16 = 1,
} osp_part_layout;

#define OSP_TENSOR_MAX_PARTS 4

/* A weight or constant, owned by the model (placed by src/model/loader.c through the backend). A
 * matrix may be stacked from several stored tensors along rows (q, k and v; gate and up): parts[i]
 * holds the next parts[i].rows rows, each part in its own type. A backend may pack the parts into one
 * buffer at load (the CUDA backend does: n_parts = 1, bf16); results are the same either way because
 * every output value is one row's dot product. */
typedef struct osp_tensor {
    int64_t cols, rows; /* ne[0], ne[1]: rows is the sum of the parts' rows */
    int32_t n_parts;
    osp_tensor_part parts[OSP_TENSOR_MAX_PARTS];
    bool round_bf16; /* CPU emulate_bf16: the values the GPU holds in bf16; rounded when read */
} osp_tensor;

/* How many rows an activation has in a step. */
typedef enum osp_act_rows {
    OSP_ROWS_TOKENS = 0, /* num_tokens: one per scheduled token */
    OSP_ROWS_LOGITS = 1, /* num_logits: one per logits_indices entry */
} osp_act_rows;

#define OSP_GRAPH_MAX_ACTS 24

typedef struct osp_act {
    const char *name; /* for messages and dumps ("x", "xn", "qkv", ...) */
    uint32_t type;    /* OSP_DTYPE_F32 or OSP_DTYPE_BF16: the precision asked for (see above) */
    int64_t cols;
    osp_act_rows rows;
} osp_act;

typedef enum osp_op_kind {
    /* dst[t] = scale * table[token_ids[t]]: w = table [n_vocab rows of cols]; dst fp32 */
    OSP_OP_EMBED = 0,
    /* x = src1 (the residual stream, fp32): if src0 >= 0, x += src0 in place; then
     * dst = rmsnorm(x) * w (RMSNorm, Zhang & Sennrich 2019; sum of squares in double, as ggml).
     * A plain RMSNorm is src0 = -1. */
    OSP_OP_ADD_RMSNORM,
    /* dst[i] = rmsnorm(src1[logits_indices[i]]) * w: the rows whose logits are wanted */
    OSP_OP_GATHER_RMSNORM,
    /* dst [R, w.rows] = src0 [R, w.cols] * w^T, for every weight type the backend holds */
    OSP_OP_MATMUL,
    /* src0 = qkv [T, QD + 2 KD] (fp32): per token add the biases w (may be NULL) to q, k, v; RMSNorm
     * each head of q and k by w1 / w2 (may be NULL; Qwen3, Gemma 3); rotate the first n_rot dims of
     * each q and k head by positions[t] * inv_freq (w3 [n_rot/2] fp32; RoFormer eq. 34; pairs per
     * rope_neox); dst = q [T, QD]; k and v go to the KV pages of `layer` at slot_mapping[t]
     * (slot < 0: no write). */
    OSP_OP_ROPE_KV_WRITE,
    /* dst [T, QD] = causal paged attention of q = src0 over the pages of `layer`: token t of sequence
     * s attends to positions lo..positions[t] of s, lo = 0, or positions[t] - window + 1 when
     * window > 0 (sliding-window layers: Beltagy et al. 2020; Gemma 3); softmax(q k^T * scale) v,
     * GQA (query head h reads kv head h / (n_head / n_head_kv)). */
    OSP_OP_ATTENTION,
    /* dst [R, F] = act(gate) * up with src0 = [gate | up] [R, 2F] (GLU variants, Shazeer 2020):
     * act = SiLU (x sigmoid(x)) or GELU with the tanh approximation */
    OSP_OP_GLU,
    /* dst += src0, elementwise over [R, cols] */
    OSP_OP_ADD,
    /* dst = src0 (same rows, cols and dtype): a copy of an intermediate the caller reads (hidden
     * states for drafters) */
    OSP_OP_COPY,
    /* dst = scale * src0, elementwise (dst may be src0) */
    OSP_OP_SCALE,
    /* dst = cap * tanh(src0 / cap), elementwise, cap > 0 (logit softcapping: Gemma 2, Team 2024 §2;
     * llama.cpp's final_logit_softcapping; dst may be src0) */
    OSP_OP_SOFTCAP,
    /* dst = src0 (in place, [R, cols] in the activation's dtype) summed over the tensor-parallel ranks of the model, in rank
     * order, so every rank gets the same bits (the all-reduce after a row-parallel projection: Megatron-LM,
     * Shoeybi et al. 2019, §3); through the backend's communicator (src/backend/comm.h). One rank (no
     * communicator): the identity. */
    OSP_OP_ALL_REDUCE,
    /* dst [R, cols] fp32 = every tensor-parallel rank's src0 [R, cols_r] fp32 side by side, rank 0's columns
     * first (the all-gather after a vocabulary-parallel lm_head, each rank's logits for its rows of the
     * output matrix: Megatron-LM, Shoeybi et al. 2019, §3); copies only, so every rank gets the same bits.
     * dst != src0. One rank (no communicator): a copy, src0 having dst's columns. */
    OSP_OP_ALL_GATHER,
    OSP_OP_COUNT
} osp_op_kind;

typedef enum osp_glu_act { OSP_GLU_SILU = 0, OSP_GLU_GELU_TANH = 1 } osp_glu_act;

typedef struct osp_op {
    osp_op_kind kind;
    int32_t dst;  /* activation ids (index into osp_graph.acts), -1: none */
    int32_t src0;
    int32_t src1;
    int32_t layer; /* KV cache layer (ROPE_KV_WRITE, ATTENTION) */
    const osp_tensor *w, *w1, *w2, *w3; /* weights / constants, by kind (NULL: none) */
    union {
        struct { float scale; } embed;
        struct { float eps; } norm;
        struct { int32_t n_head, n_head_kv, head_dim, n_rot; bool neox; float eps; } rope;
        struct { int32_t n_head, n_head_kv, head_dim, window; float scale; } attn;
        struct { osp_glu_act act; } glu;
        struct { float s; } scale; /* SCALE: the factor; SOFTCAP: the cap */
    } p;
} osp_op;

/* A model's forward pass for one kind of step: ops in order over declared activations. Built by the
 * architecture (osp_arch.build), owned by the model, read by backends (never changed by them). */
typedef struct osp_graph {
    int32_t n_ops, cap_ops;
    osp_op *ops;
    int32_t n_acts;
    osp_act acts[OSP_GRAPH_MAX_ACTS];
    int32_t logits; /* activation holding the logits [num_logits, n_vocab] fp32, -1 when none */
    int32_t n_hidden; /* hidden-state outputs (osp_build_opts.hidden_layers), fp32 [num_tokens, n_embd] */
    int32_t hidden[8];
    int32_t embd; /* osp_build_opts.final_norm: the output norm of every token [num_tokens, n_embd]
                   * (bf16 where the backend stores bf16; fp32 on the CPU), -1 when none */
} osp_graph;

/* What a builder adds to the op list beyond the logits. */
typedef struct osp_build_opts {
    int32_t n_hidden_layers;
    const int32_t *hidden_layers; /* copy the residual stream after these layers to outputs */
    bool final_norm; /* also the output norm (RMSNorm with output_norm.weight, the norm the lm_head
                      * reads) of every token, not only of the logits rows: pooled embeddings */
    int32_t tp_world; /* > 1: the weights are one tensor-parallel rank's share (osp_arch.shard); an
                       * ALL_REDUCE follows every row-parallel projection */
} osp_build_opts;

/* One step's inputs, in host memory, as the engine built them (osprey/model.h osp_batch). */
typedef struct osp_batch osp_batch;

/* Graph construction (builders). Errors: OSP_ERR_NOMEM; OSP_ERR_INTERNAL past OSP_GRAPH_MAX_ACTS. */
osp_status osp_graph_init(osp_graph *g);
void osp_graph_free(osp_graph *g);
/* Declares an activation; returns its id in *id. */
osp_status osp_graph_act(osp_graph *g, const char *name, uint32_t type, int64_t cols, osp_act_rows rows, int32_t *id);
/* When `layer` is one of o's hidden layers: a COPY of the residual stream x [num_tokens, n_embd]
 * (fp32) into a new output activation, listed in g->hidden. Builders call it after each layer, once
 * the layer's residual adds are done. */
osp_status osp_graph_hidden(osp_graph *g, const osp_build_opts *o, int32_t layer, int32_t x, int64_t n_embd);
/* With o->final_norm: an ADD_RMSNORM (no add) of the final residual stream x [num_tokens, n_embd]
 * with out_norm into a new activation "embd" (bf16 type, ROWS_TOKENS), recorded in g->embd. Builders
 * call it after the last layer. Without: nothing. */
osp_status osp_graph_final_norm(osp_graph *g, const osp_build_opts *o, int32_t x, int64_t n_embd,
                                const struct osp_tensor *out_norm, float eps);
/* Appends a copy of *op. */
osp_status osp_graph_push(osp_graph *g, const osp_op *op);
/* "embed", "add_rmsnorm", ... */
const char *osp_op_name(osp_op_kind k);

#endif
