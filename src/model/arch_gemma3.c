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
    osp_arch_proj proj;                /* q|k|v, o, gate|up, down */
    const osp_tensor *q_norm, *k_norm; /* [D] */
} gemma3_layer;

typedef struct gemma3_weights {
    osp_arch_io io;
    const osp_tensor *inv_freq_global, *inv_freq_swa;
    gemma3_layer *layers;
} gemma3_weights;

static bool is_swa(const osp_model_config *c, int32_t l) {
    return c->sliding_window > 0 && (c->swa_pattern <= 0 || l % c->swa_pattern < c->swa_pattern - 1);
}

static osp_status read_config(const osp_gguf *g, osp_model_config *c) {
    const char *a = c->arch, *path = osp_gguf_path(g);
    c->rope_type = OSP_ROPE_NEOX;
    OSP_TRY(osp_arch_read_decoder(g, c, 8192, 1e-6f));
    int32_t vlen;
    OSP_TRY(osp_arch_get_u32(g, a, "attention.value_length", &vlen, false, c->head_dim));
    if (vlen != c->head_dim)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "%s: gemma3 value_length %d != key_length %d", path, vlen, c->head_dim);
    OSP_TRY(osp_arch_get_f32(g, a, "rope.freq_base_swa", &c->rope_theta_swa, 10000.0f));
    uint32_t win = 0; /* 0 or absent: every layer global (as llama.cpp) */
    const osp_status ws = osp_gguf_get_u32(g, "gemma3.attention.sliding_window", &win);
    if (ws != OSP_OK && ws != OSP_ERR_NOT_FOUND) return ws;
    if (win > (1u << 30))
        return osp_set_error(OSP_ERR_FORMAT, "%s: gemma3.attention.sliding_window = %u is out of range", path, win);
    c->sliding_window = (int32_t)win;
    OSP_TRY(osp_arch_get_u32(g, a, "attention.sliding_window_pattern", &c->swa_pattern, false, 6));
    if (!(c->rope_theta_swa > 0.0f) || !isfinite(c->rope_theta_swa))
        return osp_set_error(OSP_ERR_FORMAT, "%s: gemma3.rope.freq_base_swa must be finite and > 0", path);
    /* softcapping changes the math (Gemma 2); Gemma 3 has none: refuse rather than run it wrong */
    if (osp_gguf_find(g, "gemma3.final_logit_softcapping") || osp_gguf_find(g, "gemma3.attn_logit_softcapping"))
        return osp_set_error(OSP_ERR_UNSUPPORTED, "%s: gemma3 with logit softcapping is not supported", path);
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
    osp_status s = w->layers ? OSP_OK : osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", ld->path);
    const int64_t E = c->n_embd, D = c->head_dim;
#define TRY(call)                                                                                  \
    if (s == OSP_OK) s = (call)
    TRY(osp_arch_bind_io(ld, c, &w->io));
    for (int32_t l = 0; s == OSP_OK && l < c->n_layer; l++) {
        gemma3_layer *L = &w->layers[l];
        TRY(osp_arch_bind_vec(ld, "blk.%d.attn_norm.weight", l, E, true, &L->attn_norm));
        TRY(osp_arch_bind_vec(ld, "blk.%d.post_attention_norm.weight", l, E, true, &L->post_attn_norm));
        TRY(osp_arch_bind_vec(ld, "blk.%d.ffn_norm.weight", l, E, true, &L->ffn_norm));
        TRY(osp_arch_bind_vec(ld, "blk.%d.post_ffw_norm.weight", l, E, true, &L->post_ffw_norm));
        TRY(osp_arch_bind_vec(ld, "blk.%d.attn_q_norm.weight", l, D, true, &L->q_norm));
        TRY(osp_arch_bind_vec(ld, "blk.%d.attn_k_norm.weight", l, D, true, &L->k_norm));
        TRY(osp_arch_bind_proj(ld, c, l, &L->proj));
    }
    TRY(osp_arch_rope_table(ld, c->rope_theta, c->n_rot, c->rope_freq_scale, NULL, &w->inv_freq_global));
    TRY(osp_arch_rope_table(ld, c->rope_theta_swa, c->n_rot, 1.0f, NULL, &w->inv_freq_swa));
#undef TRY
    if (s != OSP_OK) {
        free_weights(w);
        return s;
    }
    *out = w;
    return OSP_OK;
}

static osp_status build(const osp_model_config *c, const void *wp, bool with_logits, const osp_build_opts *opts,
                        osp_graph *g) {
    const gemma3_weights *w = wp;
    const int64_t E = c->n_embd, D = c->head_dim, QD = (int64_t)c->n_head * D, KD = (int64_t)c->n_head_kv * D,
                  F = c->n_ff, V = c->n_vocab;
    const float eps = c->rms_eps;
    int32_t x, xn, qkv, q, attn, a, o, gu, act, lnorm, logits;
    OSP_ACT("x", OSP_DTYPE_F32, E, OSP_ROWS_TOKENS, &x);
    OSP_ACT("xn", OSP_DTYPE_BF16, E, OSP_ROWS_TOKENS, &xn);
    OSP_ACT("qkv", OSP_DTYPE_F32, QD + 2 * KD, OSP_ROWS_TOKENS, &qkv);
    OSP_ACT("q", OSP_DTYPE_BF16, QD, OSP_ROWS_TOKENS, &q);
    OSP_ACT("attn", OSP_DTYPE_BF16, QD, OSP_ROWS_TOKENS, &attn);
    OSP_ACT("a", OSP_DTYPE_F32, E, OSP_ROWS_TOKENS, &a); /* a block's output before its post-norm */
    OSP_ACT("o", OSP_DTYPE_BF16, E, OSP_ROWS_TOKENS, &o); /* ... and after it: added to the stream */
    OSP_ACT("gu", OSP_DTYPE_BF16, 2 * F, OSP_ROWS_TOKENS, &gu);
    OSP_ACT("act", OSP_DTYPE_BF16, F, OSP_ROWS_TOKENS, &act);
    OSP_PUSH(OSP_OP_EMBED, x, -1, -1, .w = w->io.tok_embd, .p.embed.scale = c->embed_scale);
    int32_t pending = -1; /* the last layer's post-normed MLP output, added to x by the next norm */
    for (int32_t l = 0; l < c->n_layer; l++) {
        const gemma3_layer *L = &w->layers[l];
        const bool swa = is_swa(c, l);
        OSP_PUSH(OSP_OP_ADD_RMSNORM, xn, pending, x, .w = L->attn_norm, .p.norm.eps = eps);
        OSP_PUSH(OSP_OP_MATMUL, qkv, xn, -1, .w = L->proj.wqkv);
        OSP_PUSH(OSP_OP_ROPE_KV_WRITE, q, qkv, -1, .layer = l, .w1 = L->q_norm, .w2 = L->k_norm,
             .w3 = swa ? w->inv_freq_swa : w->inv_freq_global,
             .p.rope = {c->n_head, c->n_head_kv, c->head_dim, c->n_rot, true, eps});
        OSP_PUSH(OSP_OP_ATTENTION, attn, q, -1, .layer = l,
             .p.attn = {c->n_head, c->n_head_kv, c->head_dim, swa ? c->sliding_window : 0, c->attn_scale});
        OSP_PUSH(OSP_OP_MATMUL, a, attn, -1, .w = L->proj.wo);
        OSP_PUSH(OSP_OP_ADD_RMSNORM, o, -1, a, .w = L->post_attn_norm, .p.norm.eps = eps);
        OSP_PUSH(OSP_OP_ADD_RMSNORM, xn, o, x, .w = L->ffn_norm, .p.norm.eps = eps);
        OSP_PUSH(OSP_OP_MATMUL, gu, xn, -1, .w = L->proj.wgu);
        OSP_PUSH(OSP_OP_GLU, act, gu, -1, .p.glu.act = OSP_GLU_GELU_TANH);
        OSP_PUSH(OSP_OP_MATMUL, a, act, -1, .w = L->proj.wdown);
        OSP_PUSH(OSP_OP_ADD_RMSNORM, o, -1, a, .w = L->post_ffw_norm, .p.norm.eps = eps);
        pending = o;
        if (l == c->n_layer - 1 || osp_build_wants_hidden(opts, l)) { /* the stream after this layer is read */
            OSP_PUSH(OSP_OP_ADD, x, o, -1, .layer = 0);
            pending = -1;
            OSP_TRY(osp_graph_hidden(g, opts, l, x, E));
        }
    }
    OSP_TRY(osp_graph_final_norm(g, opts, x, E, w->io.out_norm, eps));
    if (!with_logits) return OSP_OK;
    OSP_ACT("lnorm", OSP_DTYPE_BF16, E, OSP_ROWS_LOGITS, &lnorm);
    OSP_ACT("logits", OSP_DTYPE_F32, V, OSP_ROWS_LOGITS, &logits);
    OSP_PUSH(OSP_OP_GATHER_RMSNORM, lnorm, -1, x, .w = w->io.out_norm, .p.norm.eps = eps);
    OSP_PUSH(OSP_OP_MATMUL, logits, lnorm, -1, .w = w->io.output);
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
