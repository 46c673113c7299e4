/* The llama-family forward pass on the CUDA backend (see llama_cuda.h).
 *
 * Per step, on one stream:
 *   inputs   one host-to-device copy of the packed int32 inputs (token ids, positions, slot_mapping,
 *            query_start_loc, block_table, logits_indices) from a pinned buffer
 *   embed    x [T, E] fp32 = token_embd[ids]                       (the residual stream stays fp32)
 *   layer l  xn = rmsnorm(x += down_{l-1})                        fused add + norm, bf16 out
 *            qkv [T, QD + 2 KD] fp32 = xn · Wqkv^T                 one GEMM for q, k and v
 *            q = rope(qkv.q), K/V pages[slot_mapping] = rope(qkv.k), qkv.v     (+ bias, q/k norm)
 *            attn = paged attention(q, pages)                      mixed prefill/decode, split-KV
 *            o = attn · Wo^T;  xn = rmsnorm(x += o)
 *            gu [T, 2F] = xn · Wgu^T;  act = silu(gate) * up;  down = act · Wdown^T
 *   logits   rows logits_indices of rmsnorm(x += down) · Wout^T -> [num_logits, V] fp32, kept on the
 *            device for the sampler
 * Pure decode batches (one token per sequence, every row's logits) are padded to the next size of a
 * ladder (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256) and replayed from a CUDA graph captured
 * the first time that size runs (after one eager run, which also makes the GEMM plans). Padding rows
 * write no KV (slot -1), read block 0, and their outputs are never read.
 *
 * Buffers are sized by capacities (tokens, logits rows, sequences, block-table width) and grown only
 * when a batch exceeds them, which also drops the captured graphs (they hold the old pointers); in a
 * running engine that happens in the first steps only, so steady steps allocate nothing. */
#include "model/llama_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"

#ifndef OSPREY_HAVE_CUDA

osp_status osp_llama_cuda_init(osp_model *m, const osp_model_params *p) {
    return osp_set_error(OSP_ERR_UNSUPPORTED, "--device cuda: this osprey was built without CUDA (nvcc not found)");
}
osp_status osp_llama_cuda_init_random(osp_model *m, uint64_t seed, const osp_model_params *p) {
    return osp_set_error(OSP_ERR_UNSUPPORTED, "--random-weights: this osprey was built without CUDA (nvcc not found)");
}
void osp_llama_cuda_free(osp_cuda_model *g) {}
size_t osp_llama_cuda_weight_bytes(const osp_cuda_model *g) { return 0; }
osp_status osp_llama_cuda_kv_alloc(osp_model *m, osp_kv_cache *kv) {
    return osp_set_error(OSP_ERR_UNSUPPORTED, "this osprey was built without CUDA");
}
void osp_llama_cuda_kv_free(osp_kv_cache *kv) {}
osp_status osp_llama_cuda_copy_block(osp_kv_cache *kv, int32_t src, int32_t dst) {
    return osp_set_error(OSP_ERR_UNSUPPORTED, "this osprey was built without CUDA");
}
osp_status osp_llama_cuda_forward(osp_model *m, osp_kv_cache *kv, const osp_batch *b, float *logits) {
    return osp_set_error(OSP_ERR_UNSUPPORTED, "this osprey was built without CUDA");
}
osp_status osp_llama_cuda_logits_to_host(osp_model *m, int32_t row0, int32_t n, float *dst) {
    return osp_set_error(OSP_ERR_UNSUPPORTED, "this osprey was built without CUDA");
}
osp_status osp_llama_cuda_sample(osp_model *m, const osp_sampler_row *rows, const int32_t *logits_rows, int32_t n,
                                 int32_t *tokens, osp_logprobs *logprobs, osp_status *status) {
    return osp_set_error(OSP_ERR_UNSUPPORTED, "this osprey was built without CUDA");
}

#else

#include <omp.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_sample.h"
#include "core/dtype.h"
#include "model/presets.h"

#define GEMM_WORKSPACE_BYTES (32u << 20)
#define STAGING_VALUES ((size_t)16 << 20) /* bf16 values per upload chunk (32 MiB pinned) */

static const int32_t k_graph_sizes[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256};
#define N_GRAPH_SIZES ((int)(sizeof k_graph_sizes / sizeof k_graph_sizes[0]))

typedef struct cuda_layer {
    float *attn_norm, *ffn_norm; /* [E] */
    uint16_t *wqkv;              /* [QD + 2 KD, E] */
    float *bqkv;                 /* [QD + 2 KD] or NULL */
    float *q_norm, *k_norm;      /* [D] or NULL */
    uint16_t *wo;                /* [E, QD] */
    uint16_t *wgu;               /* [2F, E] */
    uint16_t *wdown;             /* [E, F] */
} cuda_layer;

struct osp_cuda_model {
    void *stream;
    osp_cuda_gemm *gemm;
    void *weights; /* one allocation for everything below */
    size_t weight_bytes;
    uint16_t *tok_embd, *output; /* [V, E]; output == tok_embd when tied */
    float *out_norm, *inv_freq;
    cuda_layer *layers;

    /* activations, sized by the capacities */
    int64_t cap_t, cap_l, cap_s, cap_w, cap_len;
    float *x, *qkv, *logits;
    uint16_t *xn, *q, *attn, *o, *gu, *act, *lnorm;
    void *attn_ws;
    int32_t *d_in, *h_in; /* packed inputs, device and pinned host */
    int32_t num_logits;   /* rows of `logits` written by the last forward */

    void *graphs[N_GRAPH_SIZES];
    uint64_t graphs_kv;   /* id of the KV cache the graphs were captured with (they hold its pages) */
    bool use_graphs;

    /* sampler */
    int32_t cap_r, cap_ids, cap_bias;
    void *s_scratch;
    osp_cuda_sample_row *d_srows, *h_srows;
    int32_t *d_ids, *h_ids, *d_bias_ids, *h_bias_ids;
    float *d_bias_vals, *h_bias_vals;
    int32_t *d_tokens, *h_tokens;
    osp_status *d_status, *h_status;
    osp_logprobs *d_lp, *h_lp;
};

/* Offsets of the packed inputs inside d_in / h_in (int32 elements), from the capacities. */
typedef struct in_layout {
    size_t ids, pos, slot, qsl, bt, lidx, total;
} in_layout;

static in_layout layout_of(const osp_cuda_model *g) {
    in_layout L;
    L.ids = 0;
    L.pos = L.ids + (size_t)g->cap_t;
    L.slot = L.pos + (size_t)g->cap_t;
    L.qsl = L.slot + (size_t)g->cap_t;
    L.lidx = L.qsl + (size_t)g->cap_s + 1;
    L.bt = L.lidx + (size_t)g->cap_l; /* last: a step copies only its S rows of it */
    L.total = L.bt + (size_t)g->cap_s * (size_t)g->cap_w;
    return L;
}

size_t osp_llama_cuda_weight_bytes(const osp_cuda_model *g) { return g ? g->weight_bytes : 0; }

static void drop_graphs(osp_cuda_model *g) {
    for (int i = 0; i < N_GRAPH_SIZES; i++) {
        osp_cuda_graph_destroy(g->graphs[i]);
        g->graphs[i] = NULL;
    }
}

static void free_acts(osp_cuda_model *g) {
    drop_graphs(g);
    void *bufs[] = {g->x, g->qkv, g->logits, g->xn, g->q, g->attn, g->o, g->gu, g->act, g->lnorm, g->attn_ws, g->d_in};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) osp_cuda_free(bufs[i]);
    osp_cuda_host_free(g->h_in);
    g->x = g->qkv = g->logits = NULL;
    g->xn = g->q = g->attn = g->o = g->gu = g->act = g->lnorm = NULL;
    g->attn_ws = NULL;
    g->d_in = g->h_in = NULL;
    g->cap_t = g->cap_l = g->cap_s = g->cap_w = g->cap_len = 0;
}

static void free_sampler(osp_cuda_model *g) {
    osp_cuda_free(g->s_scratch);
    osp_cuda_free(g->d_srows);
    osp_cuda_free(g->d_ids);
    osp_cuda_free(g->d_bias_ids);
    osp_cuda_free(g->d_bias_vals);
    osp_cuda_free(g->d_tokens);
    osp_cuda_free(g->d_status);
    osp_cuda_free(g->d_lp);
    osp_cuda_host_free(g->h_srows);
    osp_cuda_host_free(g->h_ids);
    osp_cuda_host_free(g->h_bias_ids);
    osp_cuda_host_free(g->h_bias_vals);
    osp_cuda_host_free(g->h_tokens);
    osp_cuda_host_free(g->h_status);
    osp_cuda_host_free(g->h_lp);
    g->s_scratch = NULL;
    g->d_srows = g->h_srows = NULL;
    g->d_ids = g->h_ids = g->d_bias_ids = g->h_bias_ids = NULL;
    g->d_bias_vals = g->h_bias_vals = NULL;
    g->d_tokens = g->h_tokens = NULL;
    g->d_status = g->h_status = NULL;
    g->d_lp = g->h_lp = NULL;
    g->cap_r = g->cap_ids = g->cap_bias = 0;
}

void osp_llama_cuda_free(osp_cuda_model *g) {
    if (!g) return;
    if (g->stream) (void)osp_cuda_stream_sync(g->stream);
    free_acts(g);
    free_sampler(g);
    osp_cuda_gemm_destroy(g->gemm);
    osp_cuda_free(g->weights);
    osp_cuda_stream_destroy(g->stream);
    free(g->layers);
    free(g);
}

/* ---- loading ----------------------------------------------------------------------------------- */

typedef struct uploader {
    osp_cuda_model *g;
    uint16_t *staging; /* pinned, STAGING_VALUES */
    float *rowbuf;     /* [n_threads, max cols] */
    int64_t max_cols;
    size_t done, total; /* bytes, for progress */
    const osp_model_params *p;
} uploader;

static void progress(uploader *u, size_t bytes) {
    u->done += bytes;
    if (u->p && u->p->progress && u->total) u->p->progress(u->p->progress_ctx, (float)((double)u->done / (double)u->total));
}

/* Rows [0, w->rows) of w, dequantized and rounded to bf16, to dst [w->rows, w->cols]. */
static osp_status upload_matrix(uploader *u, uint16_t *dst, const osp_weight *w) {
    const int64_t cols = w->cols, rows_per_chunk = (int64_t)(STAGING_VALUES / (size_t)cols);
    if (rows_per_chunk < 1) return osp_set_error(OSP_ERR_UNSUPPORTED, "cuda: a weight row of %lld values is too long", (long long)cols);
    for (int64_t r0 = 0; r0 < w->rows; r0 += rows_per_chunk) {
        const int64_t n = w->rows - r0 < rows_per_chunk ? w->rows - r0 : rows_per_chunk;
        int failed = 0;
#pragma omp parallel for schedule(static) reduction(| : failed)
        for (int64_t r = 0; r < n; r++) {
            float *row = u->rowbuf + (size_t)omp_get_thread_num() * (size_t)u->max_cols;
            const uint8_t *src = (const uint8_t *)w->data + (size_t)(r0 + r) * w->row_bytes;
            if (w->type == OSP_DTYPE_BF16) {
                memcpy(u->staging + (size_t)r * (size_t)cols, src, (size_t)cols * 2);
                continue;
            }
            if (osp_dequant_row(w->type, src, row, cols) != OSP_OK) failed = 1;
            uint16_t *o = u->staging + (size_t)r * (size_t)cols;
            for (int64_t c = 0; c < cols; c++) o[c] = osp_fp32_to_bf16(row[c]);
        }
        if (failed) return osp_set_error(OSP_ERR_FORMAT, "cuda: cannot dequantize a %s weight", osp_dtype_name(w->type));
        const size_t bytes = (size_t)n * (size_t)cols * 2;
        OSP_TRY(osp_cuda_h2d(dst + (size_t)r0 * (size_t)cols, u->staging, bytes, u->g->stream));
        OSP_TRY(osp_cuda_stream_sync(u->g->stream)); /* the staging buffer is reused */
        progress(u, bytes);
    }
    return OSP_OK;
}

static osp_status upload_f32(uploader *u, float *dst, const float *src, int64_t n) {
    OSP_TRY(osp_cuda_h2d(dst, src, (size_t)n * sizeof(float), u->g->stream));
    OSP_TRY(osp_cuda_stream_sync(u->g->stream));
    progress(u, (size_t)n * sizeof(float));
    return OSP_OK;
}

/* Bump allocation inside the one weight buffer, 256-byte aligned. */
static void *carve(char *base, size_t *off, size_t bytes) {
    void *p = base ? base + *off : NULL;
    *off += (bytes + 255) & ~(size_t)255;
    return p;
}

/* Lays the weights out from `base` (NULL: only measures) and returns the bytes needed. */
static size_t lay_out(osp_cuda_model *g, const osp_model *m, char *base) {
    const osp_model_config *c = &m->cfg;
    const size_t E = (size_t)c->n_embd, QD = (size_t)c->n_head * (size_t)c->head_dim,
                 KD = (size_t)c->n_head_kv * (size_t)c->head_dim, F = (size_t)c->n_ff, V = (size_t)c->n_vocab,
                 D = (size_t)c->head_dim;
    size_t off = 0;
    g->tok_embd = carve(base, &off, V * E * 2);
    g->output = c->tied_output ? g->tok_embd : carve(base, &off, V * E * 2);
    g->out_norm = carve(base, &off, E * 4);
    g->inv_freq = carve(base, &off, (size_t)(c->n_rot / 2 + 1) * 4);
    for (int32_t l = 0; l < c->n_layer; l++) {
        cuda_layer *L = &g->layers[l];
        L->attn_norm = carve(base, &off, E * 4);
        L->ffn_norm = carve(base, &off, E * 4);
        L->wqkv = carve(base, &off, (QD + 2 * KD) * E * 2);
        L->bqkv = c->qkv_bias ? carve(base, &off, (QD + 2 * KD) * 4) : NULL;
        L->q_norm = c->qk_norm ? carve(base, &off, D * 4) : NULL;
        L->k_norm = c->qk_norm ? carve(base, &off, D * 4) : NULL;
        L->wo = carve(base, &off, E * QD * 2);
        L->wgu = carve(base, &off, 2 * F * E * 2);
        L->wdown = carve(base, &off, E * F * 2);
    }
    return off;
}

/* Stream, cuBLASLt and the weight buffer laid out (contents not yet written). */
static osp_status setup(osp_model *m, osp_cuda_model **out) {
    const osp_model_config *c = &m->cfg;
    *out = NULL;
    if (osp_cuda_device_count() <= 0)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "--device cuda: no CUDA device is present");
    if (!osp_cuda_attention_supported(c->n_head, c->n_head_kv, c->head_dim))
        return osp_set_error(OSP_ERR_UNSUPPORTED, "cuda: attention with %d heads, %d kv heads, head_dim %d is not supported yet",
                             c->n_head, c->n_head_kv, c->head_dim);
    osp_cuda_model *g = calloc(1, sizeof *g);
    if (!g) return osp_set_error(OSP_ERR_NOMEM, "cuda: out of memory");
    g->layers = calloc((size_t)c->n_layer, sizeof *g->layers);
    const char *ge = getenv("OSPREY_CUDA_GRAPHS");
    g->use_graphs = !(ge && ge[0] == '0');
    osp_status s = OSP_OK;
    if (!g->layers) s = osp_set_error(OSP_ERR_NOMEM, "cuda: out of memory");
    if (s == OSP_OK) s = osp_cuda_stream_create(&g->stream);
    if (s == OSP_OK) s = osp_cuda_gemm_create(GEMM_WORKSPACE_BYTES, &g->gemm);
    if (s == OSP_OK) {
        g->weight_bytes = lay_out(g, m, NULL);
        s = osp_cuda_malloc(&g->weights, g->weight_bytes, "the model's weights");
    }
    if (s != OSP_OK) {
        osp_llama_cuda_free(g);
        return s;
    }
    lay_out(g, m, g->weights);
    *out = g;
    return OSP_OK;
}

osp_status osp_llama_cuda_init(osp_model *m, const osp_model_params *p) {
    const osp_model_config *c = &m->cfg;
    osp_cuda_model *g;
    OSP_TRY(setup(m, &g));
    uploader u = {g, NULL, NULL, 0, 0, 0, p};
    osp_status s = OSP_OK;

    const int64_t E = c->n_embd, QD = (int64_t)c->n_head * c->head_dim, KD = (int64_t)c->n_head_kv * c->head_dim,
                  F = c->n_ff, D = c->head_dim;
    u.total = g->weight_bytes;
    u.max_cols = E > F ? E : F;
    u.max_cols = u.max_cols > QD ? u.max_cols : QD;
    u.rowbuf = malloc((size_t)omp_get_max_threads() * (size_t)u.max_cols * sizeof(float));
    if (!u.rowbuf) {
        s = osp_set_error(OSP_ERR_NOMEM, "cuda: out of memory");
        goto fail;
    }
    if ((s = osp_cuda_host_alloc((void **)&u.staging, STAGING_VALUES * 2, "weight upload staging")) != OSP_OK) goto fail;
#define UP(call)                                                                                   \
    if ((s = (call)) != OSP_OK) goto fail
    UP(upload_matrix(&u, g->tok_embd, &m->tok_embd));
    if (!c->tied_output) UP(upload_matrix(&u, g->output, &m->output));
    UP(upload_f32(&u, g->out_norm, m->out_norm, E));
    UP(upload_f32(&u, g->inv_freq, m->inv_freq, c->n_rot / 2));
    for (int32_t l = 0; l < c->n_layer; l++) {
        const layer_weights *H = &m->layers[l];
        cuda_layer *L = &g->layers[l];
        UP(upload_f32(&u, L->attn_norm, H->attn_norm, E));
        UP(upload_f32(&u, L->ffn_norm, H->ffn_norm, E));
        UP(upload_matrix(&u, L->wqkv, &H->wq));
        UP(upload_matrix(&u, L->wqkv + (size_t)QD * (size_t)E, &H->wk));
        UP(upload_matrix(&u, L->wqkv + (size_t)(QD + KD) * (size_t)E, &H->wv));
        if (L->bqkv) {
            UP(upload_f32(&u, L->bqkv, H->bq, QD));
            UP(upload_f32(&u, L->bqkv + QD, H->bk, KD));
            UP(upload_f32(&u, L->bqkv + QD + KD, H->bv, KD));
        }
        if (L->q_norm) {
            UP(upload_f32(&u, L->q_norm, H->q_norm, D));
            UP(upload_f32(&u, L->k_norm, H->k_norm, D));
        }
        UP(upload_matrix(&u, L->wo, &H->wo));
        UP(upload_matrix(&u, L->wgu, &H->w_gate));
        UP(upload_matrix(&u, L->wgu + (size_t)F * (size_t)E, &H->w_up));
        UP(upload_matrix(&u, L->wdown, &H->w_down));
    }
#undef UP
    osp_cuda_host_free(u.staging);
    free(u.rowbuf);
    /* the byte count stops short of weight_bytes (alignment padding): say "done" once */
    if (p && p->progress) p->progress(p->progress_ctx, 1.0f);
    m->gpu = g;
    return OSP_OK;
fail:
    osp_cuda_host_free(u.staging);
    free(u.rowbuf);
    osp_llama_cuda_free(g);
    return s;
}

/* The random weights of a preset (model/presets.h), drawn on the GPU: bit-identical to the GGUF that
 * `osprey make-random-model --dtype bf16` writes for the same preset and seed. */
static osp_status fill(osp_cuda_model *g, void *dst, bool bf16, int64_t n, uint64_t seed, const char *name, bool norm) {
    const uint64_t key = osp_rw_name_key(seed, name);
    const float scale = (float)((norm ? OSP_RW_NORM_NOISE_STD : OSP_RW_WEIGHT_STD) / OSP_RW_IRWIN_HALL_STD);
    const float offset = norm ? 1.0f : 0.0f;
    return bf16 ? osp_cuda_fill_randn_bf16(dst, n, key, 0, scale, offset, g->stream)
                : osp_cuda_fill_randn_f32(dst, n, key, 0, scale, offset, g->stream);
}

osp_status osp_llama_cuda_init_random(osp_model *m, uint64_t seed, const osp_model_params *p) {
    const osp_model_config *c = &m->cfg;
    osp_cuda_model *g;
    OSP_TRY(setup(m, &g));
    const int64_t E = c->n_embd, QD = (int64_t)c->n_head * c->head_dim, KD = (int64_t)c->n_head_kv * c->head_dim,
                  F = c->n_ff, D = c->head_dim, V = c->n_vocab;
    osp_status s = OSP_OK;
    char nm[96];
#define FILL(dst, bf16, n, norm, ...)                                                              \
    do {                                                                                           \
        snprintf(nm, sizeof nm, __VA_ARGS__);                                                      \
        if (s == OSP_OK) s = fill(g, (dst), (bf16), (n), seed, nm, (norm));                        \
    } while (0)
    FILL(g->tok_embd, true, V * E, false, "token_embd.weight");
    if (!c->tied_output) FILL(g->output, true, V * E, false, "output.weight");
    FILL(g->out_norm, false, E, true, "output_norm.weight");
    for (int32_t l = 0; l < c->n_layer; l++) {
        cuda_layer *L = &g->layers[l];
        FILL(L->attn_norm, false, E, true, "blk.%d.attn_norm.weight", l);
        FILL(L->ffn_norm, false, E, true, "blk.%d.ffn_norm.weight", l);
        FILL(L->wqkv, true, QD * E, false, "blk.%d.attn_q.weight", l);
        FILL(L->wqkv + QD * E, true, KD * E, false, "blk.%d.attn_k.weight", l);
        FILL(L->wqkv + (QD + KD) * E, true, KD * E, false, "blk.%d.attn_v.weight", l);
        if (L->bqkv) {
            FILL(L->bqkv, false, QD, false, "blk.%d.attn_q.bias", l);
            FILL(L->bqkv + QD, false, KD, false, "blk.%d.attn_k.bias", l);
            FILL(L->bqkv + QD + KD, false, KD, false, "blk.%d.attn_v.bias", l);
        }
        if (L->q_norm) {
            FILL(L->q_norm, false, D, true, "blk.%d.attn_q_norm.weight", l);
            FILL(L->k_norm, false, D, true, "blk.%d.attn_k_norm.weight", l);
        }
        FILL(L->wo, true, E * QD, false, "blk.%d.attn_output.weight", l);
        FILL(L->wgu, true, F * E, false, "blk.%d.ffn_gate.weight", l);
        FILL(L->wgu + F * E, true, F * E, false, "blk.%d.ffn_up.weight", l);
        FILL(L->wdown, true, E * F, false, "blk.%d.ffn_down.weight", l);
    }
#undef FILL
    if (s == OSP_OK) s = osp_cuda_h2d(g->inv_freq, m->inv_freq, (size_t)(c->n_rot / 2) * sizeof(float), g->stream);
    if (s == OSP_OK) s = osp_cuda_stream_sync(g->stream);
    if (s != OSP_OK) {
        osp_llama_cuda_free(g);
        return s;
    }
    if (p && p->progress) p->progress(p->progress_ctx, 1.0f);
    m->gpu = g;
    return OSP_OK;
}

/* ---- KV cache ---------------------------------------------------------------------------------- */

osp_status osp_llama_cuda_kv_alloc(osp_model *m, osp_kv_cache *kv) {
    const size_t per_layer = (size_t)kv->num_blocks * (size_t)kv->block_size * (size_t)kv->kv_row * kv->elem;
    OSP_TRY(osp_cuda_malloc(&kv->device_pages, per_layer * 2 * (size_t)kv->n_layer, "the KV cache"));
    kv->on_device = true;
    kv->stream = m->gpu->stream;
    for (int32_t l = 0; l < kv->n_layer; l++) {
        kv->k[l] = (char *)kv->device_pages + (size_t)(2 * l) * per_layer;
        kv->v[l] = (char *)kv->device_pages + (size_t)(2 * l + 1) * per_layer;
    }
    OSP_TRY(osp_cuda_memset(kv->device_pages, 0, per_layer * 2 * (size_t)kv->n_layer, m->gpu->stream));
    return osp_cuda_stream_sync(m->gpu->stream);
}

void osp_llama_cuda_kv_free(osp_kv_cache *kv) {
    osp_cuda_free(kv->device_pages);
    kv->device_pages = NULL;
}

osp_status osp_llama_cuda_copy_block(osp_kv_cache *kv, int32_t src, int32_t dst) {
    const size_t bytes = (size_t)kv->block_size * (size_t)kv->kv_row * kv->elem;
    for (int32_t l = 0; l < kv->n_layer; l++) {
        OSP_TRY(osp_cuda_d2d((char *)kv->k[l] + (size_t)dst * bytes, (const char *)kv->k[l] + (size_t)src * bytes, bytes,
                             kv->stream));
        OSP_TRY(osp_cuda_d2d((char *)kv->v[l] + (size_t)dst * bytes, (const char *)kv->v[l] + (size_t)src * bytes, bytes,
                             kv->stream));
    }
    return OSP_OK; /* ordered before the next step's kernels on the same stream */
}

/* ---- forward ----------------------------------------------------------------------------------- */

static int64_t grow(int64_t cap, int64_t need, int64_t floor_) {
    if (need <= cap) return cap;
    int64_t n = cap > floor_ ? cap : floor_;
    while (n < need) n *= 2;
    return n;
}

/* Makes the activation buffers hold T tokens, L logits rows, S sequences, block tables W wide. */
static osp_status reserve(osp_model *m, int64_t T, int64_t L, int64_t S, int64_t W, int32_t block_size) {
    osp_cuda_model *g = m->gpu;
    if (T <= g->cap_t && L <= g->cap_l && S <= g->cap_s && W <= g->cap_w) return OSP_OK;
    const int64_t ct = grow(g->cap_t, T, 256), cl = grow(g->cap_l, L, 256), cs = grow(g->cap_s, S, 256),
                  cw = grow(g->cap_w, W, 16);
    OSP_TRY(osp_cuda_stream_sync(g->stream));
    free_acts(g);
    g->cap_t = ct, g->cap_l = cl, g->cap_s = cs, g->cap_w = cw;
    g->cap_len = cw * block_size;
    const osp_model_config *c = &m->cfg;
    const size_t E = (size_t)c->n_embd, QD = (size_t)c->n_head * (size_t)c->head_dim,
                 KD = (size_t)c->n_head_kv * (size_t)c->head_dim, F = (size_t)c->n_ff, V = (size_t)c->n_vocab;
    const size_t t = (size_t)ct, l = (size_t)cl;
    osp_status s;
#define ALLOC(ptr, bytes)                                                                          \
    if ((s = osp_cuda_malloc((void **)&(ptr), (bytes), "activations")) != OSP_OK) goto fail
    ALLOC(g->x, t * E * 4);
    ALLOC(g->xn, t * E * 2);
    ALLOC(g->qkv, t * (QD + 2 * KD) * 4);
    ALLOC(g->q, t * QD * 2);
    ALLOC(g->attn, t * QD * 2);
    ALLOC(g->o, t * E * 2);
    ALLOC(g->gu, t * 2 * F * 2);
    ALLOC(g->act, t * F * 2);
    ALLOC(g->lnorm, l * E * 2);
    ALLOC(g->logits, l * V * 4);
    ALLOC(g->attn_ws, osp_cuda_attention_workspace_bytes(ct, c->n_head, c->head_dim, (int32_t)g->cap_len));
#undef ALLOC
    const in_layout lay = layout_of(g);
    if ((s = osp_cuda_malloc((void **)&g->d_in, lay.total * 4, "step inputs")) != OSP_OK) goto fail;
    if ((s = osp_cuda_host_alloc((void **)&g->h_in, lay.total * 4, "step inputs")) != OSP_OK) goto fail;
    return OSP_OK;
fail:
    free_acts(g);
    return s;
}

/* Enqueues the forward pass for T tokens / S sequences / L logits rows whose inputs are in d_in. */
static osp_status enqueue_forward(osp_model *m, osp_kv_cache *kv, int64_t T, int32_t S, int64_t L) {
    osp_cuda_model *g = m->gpu;
    const osp_model_config *c = &m->cfg;
    const in_layout lay = layout_of(g);
    const int32_t *ids = g->d_in + lay.ids, *pos = g->d_in + lay.pos, *slot = g->d_in + lay.slot,
                  *qsl = g->d_in + lay.qsl, *bt = g->d_in + lay.bt, *lidx = g->d_in + lay.lidx;
    const int64_t E = c->n_embd, D = c->head_dim, QD = (int64_t)c->n_head * D, KD = (int64_t)c->n_head_kv * D,
                  F = c->n_ff, V = c->n_vocab;
    const bool f16 = kv->dtype == OSP_KV_DTYPE_F16;
    const float scale = 1.0f / sqrtf((float)D);
    void *st = g->stream;
    OSP_TRY(osp_cuda_embed(g->tok_embd, ids, g->x, T, E, st));
    for (int32_t l = 0; l < c->n_layer; l++) {
        const cuda_layer *W = &g->layers[l];
        OSP_TRY(osp_cuda_add_rmsnorm(g->x, l == 0 ? NULL : g->o, W->attn_norm, g->xn, T, E, c->rms_eps, st));
        OSP_TRY(osp_cuda_gemm_bf16(g->gemm, g->xn, W->wqkv, g->qkv, true, T, QD + 2 * KD, E, st));
        OSP_TRY(osp_cuda_rope_kv_write(g->qkv, W->bqkv, W->q_norm, W->k_norm, pos, g->inv_freq, slot, g->q, kv->k[l],
                                       kv->v[l], f16, T, c->n_head, c->n_head_kv, (int)D, c->n_rot,
                                       c->rope_type == OSP_ROPE_NEOX, c->rms_eps, st));
        OSP_TRY(osp_cuda_paged_attention(g->q, kv->k[l], kv->v[l], f16, g->attn, S, qsl, pos, bt, (int32_t)g->cap_w,
                                         kv->block_size, T, c->n_head, c->n_head_kv, (int)D, scale,
                                         (int32_t)g->cap_len, g->attn_ws, st));
        OSP_TRY(osp_cuda_gemm_bf16(g->gemm, g->attn, W->wo, g->o, false, T, E, QD, st));
        OSP_TRY(osp_cuda_add_rmsnorm(g->x, g->o, W->ffn_norm, g->xn, T, E, c->rms_eps, st));
        OSP_TRY(osp_cuda_gemm_bf16(g->gemm, g->xn, W->wgu, g->gu, false, T, 2 * F, E, st));
        OSP_TRY(osp_cuda_silu_mul(g->gu, g->act, T, F, st));
        OSP_TRY(osp_cuda_gemm_bf16(g->gemm, g->act, W->wdown, g->o, false, T, E, F, st));
    }
    if (L == 0) return OSP_OK;
    /* the last residual add (its normalized output is not used), then the logits rows */
    OSP_TRY(osp_cuda_add_rmsnorm(g->x, g->o, g->out_norm, g->xn, T, E, c->rms_eps, st));
    OSP_TRY(osp_cuda_gather_rmsnorm(g->x, lidx, g->out_norm, g->lnorm, L, E, c->rms_eps, st));
    return osp_cuda_gemm_bf16(g->gemm, g->lnorm, g->output, g->logits, true, L, V, E, st);
}

/* The graph-ladder size for a pure decode batch of n sequences, or -1. */
static int graph_slot(int32_t n) {
    for (int i = 0; i < N_GRAPH_SIZES; i++)
        if (k_graph_sizes[i] >= n) return i;
    return -1;
}

static bool is_pure_decode(const osp_batch *b) {
    if (b->num_tokens != b->num_seqs || b->num_logits != b->num_tokens) return false;
    for (int32_t i = 0; i < b->num_logits; i++)
        if (b->logits_indices[i] != i) return false;
    return true;
}

osp_status osp_llama_cuda_forward(osp_model *m, osp_kv_cache *kv, const osp_batch *b, float *logits) {
    osp_cuda_model *g = m->gpu;
    if (!kv->on_device) return osp_set_error(OSP_ERR_INVALID_ARG, "forward: the KV cache is not on the GPU");
    g->num_logits = 0; /* until this step's logits are enqueued: a failed step leaves none to read */
    const int gi = g->use_graphs && is_pure_decode(b) ? graph_slot(b->num_seqs) : -1;
    /* padded sizes: a decode batch runs at its ladder size (eager or graph alike, so the same kernels
     * and GEMM plans see the same shapes either way) */
    const int32_t S = gi >= 0 ? k_graph_sizes[gi] : b->num_seqs;
    const int64_t T = gi >= 0 ? S : b->num_tokens, L = gi >= 0 ? S : b->num_logits;
    /* the block table travels only as wide as the longest sequence needs (capacity doubling), not
     * max_model_len / block_size columns per row */
    int64_t need_w = 1;
    for (int32_t s = 0; s < b->num_seqs; s++) {
        const int64_t w = (b->seq_lens[s] + kv->block_size - 1) / kv->block_size;
        need_w = w > need_w ? w : need_w;
    }
    if (g->graphs_kv != kv->id) { /* another cache: the graphs point at the old one's pages, and the
                                    * block size sizes the buffers: start over */
        OSP_TRY(osp_cuda_stream_sync(g->stream));
        free_acts(g);
        g->graphs_kv = kv->id;
    }
    OSP_TRY(reserve(m, T, L, S, need_w, kv->block_size));
    const int64_t copy_w = g->cap_w < b->max_blocks_per_seq ? g->cap_w : b->max_blocks_per_seq;
    const in_layout lay = layout_of(g);
    int32_t *h = g->h_in;
    OSP_TRY(osp_cuda_stream_sync(g->stream)); /* h_in may still be in flight from the last step */
    const int32_t n = b->num_tokens;
    memcpy(h + lay.ids, b->token_ids, (size_t)n * 4);
    memcpy(h + lay.pos, b->positions, (size_t)n * 4);
    memcpy(h + lay.slot, b->slot_mapping, (size_t)n * 4);
    memcpy(h + lay.qsl, b->query_start_loc, (size_t)(b->num_seqs + 1) * 4);
    for (int32_t s = 0; s < b->num_seqs; s++)
        memcpy(h + lay.bt + (size_t)s * (size_t)g->cap_w, b->block_table + (size_t)s * (size_t)b->max_blocks_per_seq,
               (size_t)copy_w * 4);
    if (b->num_logits > 0) memcpy(h + lay.lidx, b->logits_indices, (size_t)b->num_logits * 4);
    for (int32_t i = n; i < T; i++) { /* padding rows: token 0 at position 0 of block 0, no KV write */
        h[lay.ids + i] = 0;
        h[lay.pos + i] = 0;
        h[lay.slot + i] = -1;
        h[lay.qsl + i + 1] = i + 1;
        memset(h + lay.bt + (size_t)i * (size_t)g->cap_w, 0, (size_t)g->cap_w * 4);
        h[lay.lidx + i] = i;
    }
    /* one copy: everything before the block table, and the table's first S rows */
    OSP_TRY(osp_cuda_h2d(g->d_in, h, (lay.bt + (size_t)S * (size_t)g->cap_w) * 4, g->stream));
    if (gi >= 0 && g->graphs[gi]) {
        OSP_TRY(osp_cuda_graph_launch(g->graphs[gi], g->stream));
    } else {
        OSP_TRY(enqueue_forward(m, kv, T, S, L));
        if (gi >= 0) { /* capture this size now that its GEMM plans exist */
            OSP_TRY(osp_cuda_graph_begin(g->stream));
            osp_status s = enqueue_forward(m, kv, T, S, L);
            void *ge = NULL;
            osp_status s2 = osp_cuda_graph_end(g->stream, &ge);
            if (s != OSP_OK) {
                osp_cuda_graph_destroy(ge);
                return s;
            }
            OSP_TRY(s2);
            g->graphs[gi] = ge;
        }
    }
    g->num_logits = b->num_logits;
    if (logits && b->num_logits > 0) {
        OSP_TRY(osp_cuda_d2h(logits, g->logits, (size_t)b->num_logits * (size_t)m->cfg.n_vocab * 4, g->stream));
        OSP_TRY(osp_cuda_stream_sync(g->stream));
    }
    return OSP_OK;
}

osp_status osp_llama_cuda_logits_to_host(osp_model *m, int32_t row0, int32_t n, float *dst) {
    osp_cuda_model *g = m->gpu;
    if (row0 < 0 || n < 0 || row0 + n > g->num_logits)
        return osp_set_error(OSP_ERR_INVALID_ARG, "logits rows [%d, %d) are outside the last step's %d", row0, row0 + n,
                             g->num_logits);
    const size_t V = (size_t)m->cfg.n_vocab;
    OSP_TRY(osp_cuda_d2h(dst, g->logits + (size_t)row0 * V, (size_t)n * V * 4, g->stream));
    return osp_cuda_stream_sync(g->stream);
}

/* ---- sampling ---------------------------------------------------------------------------------- */

static osp_status sampler_reserve(osp_model *m, int32_t rows, int32_t ids, int32_t bias) {
    osp_cuda_model *g = m->gpu;
    osp_status s = OSP_OK;
    if (rows > g->cap_r) {
        const int32_t cap = (int32_t)grow(g->cap_r, rows, 64);
        osp_cuda_free(g->s_scratch), osp_cuda_free(g->d_srows), osp_cuda_free(g->d_tokens);
        osp_cuda_free(g->d_status), osp_cuda_free(g->d_lp);
        osp_cuda_host_free(g->h_srows), osp_cuda_host_free(g->h_tokens), osp_cuda_host_free(g->h_status);
        osp_cuda_host_free(g->h_lp);
        g->s_scratch = NULL, g->d_srows = g->h_srows = NULL, g->d_tokens = g->h_tokens = NULL;
        g->d_status = g->h_status = NULL, g->d_lp = g->h_lp = NULL;
        g->cap_r = 0;
        const size_t scratch = osp_cuda_sample_scratch_bytes(cap, m->cfg.n_vocab);
        if ((s = osp_cuda_malloc(&g->s_scratch, scratch, "sampler scratch")) != OSP_OK ||
            (s = osp_cuda_memset(g->s_scratch, 0, scratch, g->stream)) != OSP_OK ||
            (s = osp_cuda_malloc((void **)&g->d_srows, sizeof *g->d_srows * (size_t)cap, "sampler rows")) != OSP_OK ||
            (s = osp_cuda_malloc((void **)&g->d_tokens, 4 * (size_t)cap, "sampler rows")) != OSP_OK ||
            (s = osp_cuda_malloc((void **)&g->d_status, sizeof(osp_status) * (size_t)cap, "sampler rows")) != OSP_OK ||
            (s = osp_cuda_malloc((void **)&g->d_lp, sizeof(osp_logprobs) * (size_t)cap, "sampler rows")) != OSP_OK ||
            (s = osp_cuda_host_alloc((void **)&g->h_srows, sizeof *g->h_srows * (size_t)cap, "sampler rows")) != OSP_OK ||
            (s = osp_cuda_host_alloc((void **)&g->h_tokens, 4 * (size_t)cap, "sampler rows")) != OSP_OK ||
            (s = osp_cuda_host_alloc((void **)&g->h_status, sizeof(osp_status) * (size_t)cap, "sampler rows")) != OSP_OK ||
            (s = osp_cuda_host_alloc((void **)&g->h_lp, sizeof(osp_logprobs) * (size_t)cap, "sampler rows")) != OSP_OK) {
            free_sampler(g);
            return s;
        }
        g->cap_r = cap;
    }
    if (ids > g->cap_ids) {
        const int32_t cap = (int32_t)grow(g->cap_ids, ids, 4096);
        osp_cuda_free(g->d_ids), osp_cuda_host_free(g->h_ids);
        g->d_ids = g->h_ids = NULL, g->cap_ids = 0;
        if ((s = osp_cuda_malloc((void **)&g->d_ids, 4 * (size_t)cap, "sampler ids")) != OSP_OK ||
            (s = osp_cuda_host_alloc((void **)&g->h_ids, 4 * (size_t)cap, "sampler ids")) != OSP_OK)
            return s;
        g->cap_ids = cap;
    }
    if (bias > g->cap_bias) {
        const int32_t cap = (int32_t)grow(g->cap_bias, bias, 256);
        osp_cuda_free(g->d_bias_ids), osp_cuda_free(g->d_bias_vals);
        osp_cuda_host_free(g->h_bias_ids), osp_cuda_host_free(g->h_bias_vals);
        g->d_bias_ids = g->h_bias_ids = NULL, g->d_bias_vals = g->h_bias_vals = NULL, g->cap_bias = 0;
        if ((s = osp_cuda_malloc((void **)&g->d_bias_ids, 4 * (size_t)cap, "logit bias")) != OSP_OK ||
            (s = osp_cuda_malloc((void **)&g->d_bias_vals, 4 * (size_t)cap, "logit bias")) != OSP_OK ||
            (s = osp_cuda_host_alloc((void **)&g->h_bias_ids, 4 * (size_t)cap, "logit bias")) != OSP_OK ||
            (s = osp_cuda_host_alloc((void **)&g->h_bias_vals, 4 * (size_t)cap, "logit bias")) != OSP_OK)
            return s;
        g->cap_bias = cap;
    }
    return OSP_OK;
}

static bool has_penalties(const osp_sampler_row *r) {
    return r->presence_penalty != 0.0f || r->frequency_penalty != 0.0f || r->repetition_penalty != 1.0f;
}

osp_status osp_llama_cuda_sample(osp_model *m, const osp_sampler_row *rows, const int32_t *logits_rows, int32_t n,
                                 int32_t *tokens, osp_logprobs *logprobs, osp_status *status) {
    osp_cuda_model *g = m->gpu;
    if (n <= 0) return OSP_OK;
    /* sizes of the packed lists: stop ids while min_tokens is pending, id histories for penalties */
    int64_t nids = 0, nbias = 0;
    bool want_lp = false;
    for (int32_t i = 0; i < n; i++) {
        const osp_sampler_row *r = &rows[i];
        if (logits_rows[i] < 0 || logits_rows[i] >= g->num_logits)
            return osp_set_error(OSP_ERR_INVALID_ARG, "sample: logits row %d is outside the last step's %d", logits_rows[i],
                                 g->num_logits);
        const bool min_pending = r->n_output < r->min_tokens;
        if (min_pending) nids += r->n_stop_token_ids;
        if (has_penalties(r)) nids += r->n_prompt;
        if (has_penalties(r) || min_pending) nids += r->n_output;
        nbias += r->n_logit_bias;
        want_lp |= r->num_logprobs >= 0;
    }
    if (nids > INT32_MAX / 2 || nbias > INT32_MAX / 2) return osp_set_error(OSP_ERR_INVALID_ARG, "sample: id lists too long");
    OSP_TRY(sampler_reserve(m, n, (int32_t)nids, (int32_t)nbias));
    OSP_TRY(osp_cuda_stream_sync(g->stream)); /* the pinned buffers may still be read by the last step */
    int32_t io = 0, bo = 0;
    for (int32_t i = 0; i < n; i++) {
        const osp_sampler_row *r = &rows[i];
        osp_cuda_sample_row *d = &g->h_srows[i];
        memset(d, 0, sizeof *d);
        d->temperature = r->temperature, d->top_p = r->top_p, d->min_p = r->min_p;
        d->presence_penalty = r->presence_penalty, d->frequency_penalty = r->frequency_penalty;
        d->repetition_penalty = r->repetition_penalty;
        /* The id lists travel only when used: the output ids for penalties or a pending min_tokens
         * (the kernel compares n_output with min_tokens and checks every listed id), the prompt ids
         * for penalties, the stop ids while min_tokens is pending (min_tokens is 0 once it is met). */
        const bool pen = has_penalties(r), min_pending = r->n_output < r->min_tokens;
        d->top_k = r->top_k, d->min_tokens = min_pending ? r->min_tokens : 0, d->num_logprobs = r->num_logprobs;
        d->sample_index = r->sample_index, d->seed = r->seed, d->output_pos = r->output_pos;
        d->logits_row = logits_rows[i];
        d->bias_off = bo, d->n_bias = r->n_logit_bias;
        for (int32_t k = 0; k < r->n_logit_bias; k++, bo++) {
            g->h_bias_ids[bo] = r->logit_bias[k].token_id;
            g->h_bias_vals[bo] = r->logit_bias[k].bias;
        }
        d->stop_off = io;
        if (min_pending) {
            d->n_stop = r->n_stop_token_ids;
            memcpy(g->h_ids + io, r->stop_token_ids, (size_t)r->n_stop_token_ids * 4);
            io += r->n_stop_token_ids;
        }
        d->prompt_off = io;
        if (pen) {
            d->n_prompt = r->n_prompt;
            memcpy(g->h_ids + io, r->prompt_ids, (size_t)r->n_prompt * 4);
            io += r->n_prompt;
        }
        d->output_off = io;
        if (pen || min_pending) {
            d->n_output = r->n_output;
            memcpy(g->h_ids + io, r->output_ids, (size_t)r->n_output * 4);
            io += r->n_output;
        }
    }
    void *st = g->stream;
    OSP_TRY(osp_cuda_h2d(g->d_srows, g->h_srows, sizeof *g->h_srows * (size_t)n, st));
    if (io) OSP_TRY(osp_cuda_h2d(g->d_ids, g->h_ids, 4 * (size_t)io, st));
    if (bo) {
        OSP_TRY(osp_cuda_h2d(g->d_bias_ids, g->h_bias_ids, 4 * (size_t)bo, st));
        OSP_TRY(osp_cuda_h2d(g->d_bias_vals, g->h_bias_vals, 4 * (size_t)bo, st));
    }
    OSP_TRY(osp_cuda_sample(g->logits, m->cfg.n_vocab, g->d_srows, n, g->d_ids, g->d_bias_ids, g->d_bias_vals,
                            g->s_scratch, g->d_tokens, g->d_status, want_lp ? g->d_lp : NULL, st));
    OSP_TRY(osp_cuda_d2h(g->h_tokens, g->d_tokens, 4 * (size_t)n, st));
    OSP_TRY(osp_cuda_d2h(g->h_status, g->d_status, sizeof(osp_status) * (size_t)n, st));
    if (want_lp && logprobs) OSP_TRY(osp_cuda_d2h(g->h_lp, g->d_lp, sizeof(osp_logprobs) * (size_t)n, st));
    OSP_TRY(osp_cuda_stream_sync(st));
    memcpy(tokens, g->h_tokens, 4 * (size_t)n);
    memcpy(status, g->h_status, sizeof(osp_status) * (size_t)n);
    if (want_lp && logprobs)
        for (int32_t i = 0; i < n; i++)
            if (rows[i].num_logprobs >= 0 && status[i] == OSP_OK) logprobs[i] = g->h_lp[i];
    return OSP_OK;
}

#endif /* OSPREY_HAVE_CUDA */
