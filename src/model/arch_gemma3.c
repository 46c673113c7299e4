/* Gemma 3 text decoders (GGUF architecture `gemma3`; Gemma Team 2025, "Gemma 3 Technical Report",
 * §2; HF Gemma3ForCausalLM; llama.cpp src/models/gemma3.cpp): hyper-parameters, tensor binding and
 * the op list of a step.
 *
 * Per token (the GGUF converter has already added 1 to every RMSNorm weight, so norms multiply by the
 * stored weight as is):
 *   x = token_embd[t] * sqrt(n_embd)
 *   layer l:  h = rms(x; attn_norm)
 *             q, k, v = Wq h, Wk h, Wv h;  q, k = rms per head (q_norm, k_norm), then NeoX RoPE
 *             a = Wo attention(q, k, v)     (sliding layers: only the last `sliding_window` keys,
 *                                            the query's own included)
 *             x = x + rms(a; post_attention_norm)
 *             f = Wdown (gelu_tanh(Wgate rms(x; ffn_norm)) * Wup rms(x; ffn_norm))
 *             x = x + rms(f; post_ffw_norm)
 *   logits = token_embd · rms(x; output_norm)     (tied, unscaled)
 * Layer l slides unless l % swa_pattern == swa_pattern - 1 (every 6th layer is global). Sliding layers
 * rotate with base rope.freq_base_swa (10000) and no scaling; global layers with rope.freq_base and
 * the linear rope.scaling.factor. The attention scale is 1 / sqrt(head_dim) (query_pre_attn_scalar
 * equals head_dim in every released size but 27B, where llama.cpp uses 1 / sqrt(n_embd / n_head)).
 *
 * The KV of sliding layers is kept full-length for now (every layer shares the block tables); freeing
 * the blocks that fall out of the window per layer group (vLLM's hybrid KV cache manager) is later
 * work. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/status_internal.h"
#include "model/arch.h"

typedef struct gemma3_layer {
    const osp_tensor *attn_norm, *post_attn_norm, *ffn_norm, *post_ffw_norm; /* [E] */
    const osp_tensor *wqkv;           /* [E] -> [QD + 2 KD] */
    const osp_tensor *q_norm, *k_norm; /* [D] */
    const osp_tensor *wo;             /* [QD] -> [E] */
    const osp_tensor *wgu;            /* [E] -> [2F] */
    const osp_tensor *wdown;          /* [F] -> [E] */
} gemma3_layer;

typedef struct gemma3_weights {
    const osp_tensor *tok_embd, *output, *out_norm;
    const osp_tensor *inv_freq_global, *inv_freq_swa;
    gemma3_layer *layers;
} gemma3_weights;

static bool is_swa(const osp_model_config *c, int32_t l) {
    return c->sliding_window > 0 && (c->swa_pattern <= 0 || l % c->swa_pattern < c->swa_pattern - 1);
}

static osp_status read_config(const osp_gguf *g, osp_model_config *c) {
    const char *a = c->arch, *path = osp_gguf_path(g);
    c->rope_type = OSP_ROPE_NEOX;
    OSP_TRY(osp_arch_get_u32(g, a, "embedding_length", &c->n_embd, true, 0));
    OSP_TRY(osp_arch_get_u32(g, a, "block_count", &c->n_layer, true, 0));
    OSP_TRY(osp_arch_get_u32(g, a, "attention.head_count", &c->n_head, true, 0));
    OSP_TRY(osp_arch_get_u32(g, a, "attention.head_count_kv", &c->n_head_kv, false, c->n_head));
    OSP_TRY(osp_arch_get_u32(g, a, "feed_forward_length", &c->n_ff, true, 0));
    OSP_TRY(osp_arch_get_u32(g, a, "context_length", &c->n_ctx_train, false, 8192));
    if (c->n_embd % c->n_head != 0 && !osp_gguf_find(g, "gemma3.attention.key_length"))
        return osp_set_error(OSP_ERR_FORMAT, "%s: gemma3.embedding_length %d is not a multiple of head_count %d", path,
                             c->n_embd, c->n_head);
    OSP_TRY(osp_arch_get_u32(g, a, "attention.key_length", &c->head_dim, false, c->n_embd / c->n_head));
    int32_t vlen;
    OSP_TRY(osp_arch_get_u32(g, a, "attention.value_length", &vlen, false, c->head_dim));
    if (vlen != c->head_dim)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "%s: gemma3 value_length %d != key_length %d", path, vlen, c->head_dim);
    OSP_TRY(osp_arch_get_u32(g, a, "rope.dimension_count", &c->n_rot, false, c->head_dim));
    OSP_TRY(osp_arch_get_f32(g, a, "rope.freq_base", &c->rope_theta, 10000.0f));
    OSP_TRY(osp_arch_get_f32(g, a, "rope.freq_base_swa", &c->rope_theta_swa, 10000.0f));
    OSP_TRY(osp_arch_get_f32(g, a, "attention.layer_norm_rms_epsilon", &c->rms_eps, 1e-6f));
    uint32_t win = 0; /* 0 or absent: every layer global (as llama.cpp) */
    const osp_status ws = osp_gguf_get_u32(g, "gemma3.attention.sliding_window", &win);
    if (ws != OSP_OK && ws != OSP_ERR_NOT_FOUND) return ws;
    if (win > (1u << 30)) return osp_set_error(OSP_ERR_FORMAT, "%s: gemma3.attention.sliding_window = %u is out of range", path, win);
    c->sliding_window = (int32_t)win;
    OSP_TRY(osp_arch_get_u32(g, a, "attention.sliding_window_pattern", &c->swa_pattern, false, 6));
    if (c->n_head % c->n_head_kv != 0)
        return osp_set_error(OSP_ERR_FORMAT, "%s: head_count %d is not a multiple of head_count_kv %d", path, c->n_head,
                             c->n_head_kv);
    if (c->n_rot > c->head_dim || c->n_rot % 2 != 0)
        return osp_set_error(OSP_ERR_FORMAT, "%s: rope.dimension_count %d must be even and <= head_dim %d", path,
                             c->n_rot, c->head_dim);
    if (!(c->rope_theta > 0.0f) || !(c->rope_theta_swa > 0.0f) || !(c->rms_eps > 0.0f) || !isfinite(c->rope_theta) ||
        !isfinite(c->rope_theta_swa) || !isfinite(c->rms_eps))
        return osp_set_error(OSP_ERR_FORMAT, "%s: rope bases and layer_norm_rms_epsilon must be finite and > 0", path);
    /* softcapping changes the math (Gemma 2); Gemma 3 has none: refuse rather than run it wrong */
    if (osp_gguf_find(g, "gemma3.final_logit_softcapping") || osp_gguf_find(g, "gemma3.attn_logit_softcapping"))
        return osp_set_error(OSP_ERR_UNSUPPORTED, "%s: gemma3 with logit softcapping is not supported", path);
    OSP_TRY(osp_arch_check_blocks(g, c));
    c->tied_output = osp_gguf_find_tensor(g, "output.weight") == NULL;
    c->qkv_bias = false;
    c->qk_norm = true;
    c->rope_freq_factors = false;
    /* llama.cpp's rule: 1 / sqrt(head_dim), except the 27B (62 layers): 1 / sqrt(n_embd / n_head) */
    c->attn_scale = 1.0f / sqrtf(c->n_layer == 62 ? (float)(c->n_embd / c->n_head) : (float)c->head_dim);
    c->embed_scale = sqrtf((float)c->n_embd);
    return osp_arch_read_rope_scaling(g, c);
}

static void free_weights(void *wp) {
    gemma3_weights *w = wp;
    if (!w) return;
    free(w->layers);
    free(w);
}

static osp_status bind(osp_loader *ld, const osp_model_config *c, void **out) {
    *out = NULL;
    gemma3_weights *w = calloc(1, sizeof *w);
    if (!w) return osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", ld->path);
    w->layers = calloc((size_t)c->n_layer, sizeof *w->layers);
    float *inv_freq = malloc((size_t)(c->n_rot / 2 + 1) * sizeof *inv_freq);
    osp_status s = OSP_OK;
    if (!w->layers || !inv_freq) {
        s = osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", ld->path);
        goto done;
    }
    const int64_t E = c->n_embd, QD = (int64_t)c->n_head * c->head_dim, KD = (int64_t)c->n_head_kv * c->head_dim,
                  F = c->n_ff, D = c->head_dim, V = c->n_vocab;
#define TRY(call)                                                                                  \
    if ((s = (call)) != OSP_OK) goto done
    const char *emb = "token_embd.weight", *outw = "output.weight";
    TRY(osp_loader_matrix(ld, &emb, &V, 1, E, false, &w->tok_embd));
    if (c->tied_output) w->output = w->tok_embd;
    else TRY(osp_loader_matrix(ld, &outw, &V, 1, E, false, &w->output));
    TRY(osp_loader_vector(ld, "output_norm.weight", E, true, false, &w->out_norm));
    for (int32_t l = 0; l < c->n_layer; l++) {
        gemma3_layer *L = &w->layers[l];
        char n0[96], n1[96], n2[96];
        const char *names[3] = {n0, n1, n2};
#define VEC(dst, n, fmt)                                                                           \
    snprintf(n0, sizeof n0, fmt, l);                                                               \
    TRY(osp_loader_vector(ld, n0, n, true, false, dst))
        VEC(&L->attn_norm, E, "blk.%d.attn_norm.weight");
        VEC(&L->post_attn_norm, E, "blk.%d.post_attention_norm.weight");
        VEC(&L->ffn_norm, E, "blk.%d.ffn_norm.weight");
        VEC(&L->post_ffw_norm, E, "blk.%d.post_ffw_norm.weight");
        VEC(&L->q_norm, D, "blk.%d.attn_q_norm.weight");
        VEC(&L->k_norm, D, "blk.%d.attn_k_norm.weight");
#undef VEC
        const int64_t qkv_rows[3] = {QD, KD, KD};
        snprintf(n0, sizeof n0, "blk.%d.attn_q.weight", l);
        snprintf(n1, sizeof n1, "blk.%d.attn_k.weight", l);
        snprintf(n2, sizeof n2, "blk.%d.attn_v.weight", l);
        TRY(osp_loader_matrix(ld, names, qkv_rows, 3, E, false, &L->wqkv));
        snprintf(n0, sizeof n0, "blk.%d.attn_output.weight", l);
        TRY(osp_loader_matrix(ld, names, &E, 1, QD, false, &L->wo));
        const int64_t gu_rows[2] = {F, F};
        snprintf(n0, sizeof n0, "blk.%d.ffn_gate.weight", l);
        snprintf(n1, sizeof n1, "blk.%d.ffn_up.weight", l);
        TRY(osp_loader_matrix(ld, names, gu_rows, 2, E, false, &L->wgu));
        snprintf(n0, sizeof n0, "blk.%d.ffn_down.weight", l);
        TRY(osp_loader_matrix(ld, names, &E, 1, F, false, &L->wdown));
    }
    TRY(osp_arch_rope_inv_freq(ld->path, c->rope_theta, c->n_rot, c->rope_freq_scale, NULL, inv_freq));
    TRY(osp_loader_constant(ld, inv_freq, c->n_rot / 2, &w->inv_freq_global));
    TRY(osp_arch_rope_inv_freq(ld->path, c->rope_theta_swa, c->n_rot, 1.0f, NULL, inv_freq));
    TRY(osp_loader_constant(ld, inv_freq, c->n_rot / 2, &w->inv_freq_swa));
#undef TRY
done:
    free(inv_freq);
    if (s != OSP_OK) {
        free_weights(w);
        return s;
    }
    *out = w;
    return OSP_OK;
}

#define ACT(name, type, cols, rows, id) OSP_TRY(osp_graph_act(g, name, type, cols, rows, id))
/* PUSH(kind, dst, src0, src1, other fields...): activation ids, -1 for none */
#define PUSH(k, d, s0, s1, ...)                                                                    \
    do {                                                                                           \
        osp_op op_ = {.kind = (k), .dst = (d), .src0 = (s0), .src1 = (s1), __VA_ARGS__};           \
        OSP_TRY(osp_graph_push(g, &op_));                                                          \
    } while (0)

static osp_status build(const osp_model_config *c, const void *wp, bool with_logits, const osp_build_opts *opts,
                        osp_graph *g) {
    const gemma3_weights *w = wp;
    const int64_t E = c->n_embd, D = c->head_dim, QD = (int64_t)c->n_head * D, KD = (int64_t)c->n_head_kv * D,
                  F = c->n_ff, V = c->n_vocab;
    const float eps = c->rms_eps;
    int32_t x, xn, qkv, q, attn, a, o, gu, act, lnorm, logits;
    ACT("x", OSP_DTYPE_F32, E, OSP_ROWS_TOKENS, &x);
    ACT("xn", OSP_DTYPE_BF16, E, OSP_ROWS_TOKENS, &xn);
    ACT("qkv", OSP_DTYPE_F32, QD + 2 * KD, OSP_ROWS_TOKENS, &qkv);
    ACT("q", OSP_DTYPE_BF16, QD, OSP_ROWS_TOKENS, &q);
    ACT("attn", OSP_DTYPE_BF16, QD, OSP_ROWS_TOKENS, &attn);
    ACT("a", OSP_DTYPE_F32, E, OSP_ROWS_TOKENS, &a); /* a block's output before its post-norm */
    ACT("o", OSP_DTYPE_BF16, E, OSP_ROWS_TOKENS, &o); /* ... and after it: added to the stream */
    ACT("gu", OSP_DTYPE_BF16, 2 * F, OSP_ROWS_TOKENS, &gu);
    ACT("act", OSP_DTYPE_BF16, F, OSP_ROWS_TOKENS, &act);
    PUSH(OSP_OP_EMBED, x, -1, -1, .w = w->tok_embd, .p.embed.scale = c->embed_scale);
    int32_t pending = -1; /* the last layer's post-normed MLP output, added to x by the next norm */
    for (int32_t l = 0; l < c->n_layer; l++) {
        const gemma3_layer *L = &w->layers[l];
        const bool swa = is_swa(c, l);
        PUSH(OSP_OP_ADD_RMSNORM, xn, pending, x, .w = L->attn_norm, .p.norm.eps = eps);
        PUSH(OSP_OP_MATMUL, qkv, xn, -1, .w = L->wqkv);
        PUSH(OSP_OP_ROPE_KV_WRITE, q, qkv, -1, .layer = l, .w1 = L->q_norm, .w2 = L->k_norm,
             .w3 = swa ? w->inv_freq_swa : w->inv_freq_global,
             .p.rope = {c->n_head, c->n_head_kv, c->head_dim, c->n_rot, true, eps});
        PUSH(OSP_OP_ATTENTION, attn, q, -1, .layer = l,
             .p.attn = {c->n_head, c->n_head_kv, c->head_dim, swa ? c->sliding_window : 0, c->attn_scale});
        PUSH(OSP_OP_MATMUL, a, attn, -1, .w = L->wo);
        PUSH(OSP_OP_ADD_RMSNORM, o, -1, a, .w = L->post_attn_norm, .p.norm.eps = eps);
        PUSH(OSP_OP_ADD_RMSNORM, xn, o, x, .w = L->ffn_norm, .p.norm.eps = eps);
        PUSH(OSP_OP_MATMUL, gu, xn, -1, .w = L->wgu);
        PUSH(OSP_OP_GLU, act, gu, -1, .p.glu.act = OSP_GLU_GELU_TANH);
        PUSH(OSP_OP_MATMUL, a, act, -1, .w = L->wdown);
        PUSH(OSP_OP_ADD_RMSNORM, o, -1, a, .w = L->post_ffw_norm, .p.norm.eps = eps);
        pending = o;
        bool wanted = l == c->n_layer - 1;
        for (int32_t i = 0; opts && i < opts->n_hidden_layers; i++) wanted |= opts->hidden_layers[i] == l;
        if (wanted) { /* the stream after this layer is read */
            PUSH(OSP_OP_ADD, x, o, -1, .layer = 0);
            pending = -1;
            OSP_TRY(osp_graph_hidden(g, opts, l, x, E));
        }
    }
    if (!with_logits) return OSP_OK;
    ACT("lnorm", OSP_DTYPE_BF16, E, OSP_ROWS_LOGITS, &lnorm);
    ACT("logits", OSP_DTYPE_F32, V, OSP_ROWS_LOGITS, &logits);
    PUSH(OSP_OP_GATHER_RMSNORM, lnorm, -1, x, .w = w->out_norm, .p.norm.eps = eps);
    PUSH(OSP_OP_MATMUL, logits, lnorm, -1, .w = w->output);
    g->logits = logits;
    return OSP_OK;
}

static const char *const k_gguf_archs[] = {"gemma3", NULL};

const osp_arch osp_arch_gemma3 = {
    .name = "gemma3",
    .gguf_archs = k_gguf_archs,
    .read_config = read_config,
    .preset_config = NULL,
    .bind = bind,
    .free_weights = free_weights,
    .build = build,
};
