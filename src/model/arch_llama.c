/* The llama-shaped decoder family: GGUF architectures `llama` (Llama 1/2/3.x, Mistral, SmolLM),
 * `qwen2` and `qwen3`: hyper-parameters, tensor binding and the op list of a step.
 *
 * Per layer (Touvron et al. 2023, "LLaMA", §2.2; HF LlamaDecoderLayer):
 *   h   = x + Wo · attn(rope(Wq · rms(x)), rope(Wk · rms(x)), Wv · rms(x))
 *   out = h + Wdown · (silu(Wgate · rms(h)) * (Wup · rms(h)))
 * then a final RMSNorm and the lm_head (token_embd when the output matrix is tied).
 * The variants differ only around RoPE, all per token (batch-invariant):
 *   qwen2: biases added to Wq·x, Wk·x, Wv·x (HF Qwen2Attention, bias=True);
 *   qwen3: each head of q and k RMS-normalized (weights [head_dim]) before RoPE (HF Qwen3Attention);
 *   RoPE pairs: interleaved for llama (GGUF Q/K rows are permuted for it by the converter), NeoX
 *   (i, i + n_rot/2) for qwen2/qwen3 (unpermuted rows); Llama 3.x scaling as per-frequency divisors
 *   (rope_freqs.weight, HF's "llama3" rope_type), linear scaling as a factor on every angle.
 *
 * The op list, per layer:
 *   xn = rmsnorm(x += down_{l-1})            ADD_RMSNORM (bf16 out: the GEMM input)
 *   qkv = xn · [Wq; Wk; Wv]^T                MATMUL (one stacked matrix, fp32 out)
 *   q, K/V pages = rope(qkv + b, q/k norm)   ROPE_KV_WRITE
 *   attn = attention(q, pages)               ATTENTION
 *   o = attn · Wo^T                          MATMUL
 *   xn = rmsnorm(x += o)                     ADD_RMSNORM
 *   gu = xn · [Wgate; Wup]^T                 MATMUL
 *   act = silu(gate) * up                    GLU
 *   down = act · Wdown^T                     MATMUL
 * then x += down; logits = gather_rmsnorm(x, logits_indices) · Wout^T. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/status_internal.h"
#include "model/arch.h"
#include "model/presets.h"

typedef struct llama_layer {
    const osp_tensor *attn_norm, *ffn_norm; /* [E] */
    osp_arch_proj proj;                     /* q|k|v, o, gate|up, down */
    const osp_tensor *bqkv;                 /* [QD + 2 KD] or NULL */
    const osp_tensor *q_norm, *k_norm;      /* [D] or NULL */
} llama_layer;

typedef struct llama_weights {
    osp_arch_io io;
    const osp_tensor *inv_freq;
    llama_layer *layers;
} llama_weights;

static osp_status read_config(const osp_gguf *g, osp_model_config *c) {
    const char *a = c->arch;
    c->rope_type = strcmp(a, "llama") == 0 ? OSP_ROPE_NORM : OSP_ROPE_NEOX;
    OSP_TRY(osp_arch_read_decoder(g, c, 2048, 1e-5f));
    c->qkv_bias = osp_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    c->qk_norm = osp_gguf_find_tensor(g, "blk.0.attn_q_norm.weight") != NULL || strcmp(a, "qwen3") == 0;
    c->rope_freq_factors = osp_gguf_find_tensor(g, "rope_freqs.weight") != NULL;
    c->attn_scale = 1.0f / sqrtf((float)c->head_dim);
    c->embed_scale = 1.0f;
    return osp_arch_read_rope_scaling(g, c);
}

static osp_status preset_config(const osp_model_preset *p, osp_model_config *c) {
    c->n_vocab = p->n_vocab, c->n_embd = p->n_embd, c->n_layer = p->n_layer;
    c->n_head = p->n_head, c->n_head_kv = p->n_head_kv;
    c->head_dim = p->head_dim ? p->head_dim : p->n_embd / p->n_head;
    c->n_ff = p->n_ff, c->n_rot = c->head_dim, c->n_ctx_train = p->n_ctx;
    c->rope_theta = p->rope_theta, c->rms_eps = p->rms_eps, c->tied_output = p->tied;
    c->rope_type = strcmp(p->arch, "llama") == 0 ? OSP_ROPE_NORM : OSP_ROPE_NEOX;
    c->rope_freq_scale = 1.0f;
    c->rope_freq_factors = p->rope.factor > 0.0f;
    c->qkv_bias = p->qkv_bias, c->qk_norm = p->qk_norm;
    c->attn_scale = 1.0f / sqrtf((float)c->head_dim);
    c->embed_scale = 1.0f;
    return OSP_OK;
}

static void free_weights(void *wp) {
    llama_weights *w = wp;
    if (!w) return;
    free(w->layers);
    free(w);
}

static osp_status bind(osp_loader *ld, const osp_model_config *c, void **out) {
    *out = NULL;
    llama_weights *w = calloc(1, sizeof *w);
    if (!w) return osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", ld->path);
    w->layers = calloc((size_t)c->n_layer, sizeof *w->layers);
    float *ff_buf = malloc((size_t)(c->n_rot / 2 + 1) * sizeof *ff_buf);
    osp_status s = OSP_OK;
    if (!w->layers || !ff_buf) {
        s = osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", ld->path);
        goto done;
    }
    const int64_t E = c->n_embd, QD = (int64_t)c->n_head * c->head_dim, KD = (int64_t)c->n_head_kv * c->head_dim,
                  D = c->head_dim;
#define TRY(call)                                                                                  \
    if ((s = (call)) != OSP_OK) goto done
    TRY(osp_arch_bind_io(ld, c, &w->io));
    for (int32_t l = 0; l < c->n_layer; l++) {
        llama_layer *L = &w->layers[l];
        TRY(osp_arch_bind_vec(ld, "blk.%d.attn_norm.weight", l, E, true, &L->attn_norm));
        TRY(osp_arch_bind_vec(ld, "blk.%d.ffn_norm.weight", l, E, true, &L->ffn_norm));
        TRY(osp_arch_bind_proj(ld, c, l, &L->proj));
        if (c->qkv_bias) {
            char n0[96], n1[96], n2[96];
            const char *names[3] = {n0, n1, n2};
            const int64_t lens[3] = {QD, KD, KD};
            snprintf(n0, sizeof n0, "blk.%d.attn_q.bias", l);
            snprintf(n1, sizeof n1, "blk.%d.attn_k.bias", l);
            snprintf(n2, sizeof n2, "blk.%d.attn_v.bias", l);
            TRY(osp_loader_vectors(ld, names, lens, 3, &L->bqkv));
        }
        if (c->qk_norm) {
            TRY(osp_arch_bind_vec(ld, "blk.%d.attn_q_norm.weight", l, D, true, &L->q_norm));
            TRY(osp_arch_bind_vec(ld, "blk.%d.attn_k_norm.weight", l, D, true, &L->k_norm));
        }
    }
    const float *ff = NULL;
    if (c->rope_freq_factors && ld->gguf) {
        ff = osp_loader_host_f32(ld, "rope_freqs.weight", c->n_rot / 2);
        if (!ff) {
            s = osp_set_error(OSP_ERR_FORMAT, "%s: tensor 'rope_freqs.weight' must be F32 [%d]", ld->path, c->n_rot / 2);
            goto done;
        }
    } else if (c->rope_freq_factors && ld->preset) {
        osp_rope_llama3_factors(&ld->preset->rope, c->rope_theta, c->n_rot, ff_buf);
        ff = ff_buf;
    }
    TRY(osp_arch_rope_table(ld, c->rope_theta, c->n_rot, c->rope_freq_scale, ff, &w->inv_freq));
#undef TRY
done:
    free(ff_buf);
    if (s != OSP_OK) {
        free_weights(w);
        return s;
    }
    *out = w;
    return OSP_OK;
}

static osp_status build(const osp_model_config *c, const void *wp, bool with_logits, const osp_build_opts *opts,
                        osp_graph *g) {
    const llama_weights *w = wp;
    const int64_t E = c->n_embd, D = c->head_dim, QD = (int64_t)c->n_head * D, KD = (int64_t)c->n_head_kv * D,
                  F = c->n_ff, V = c->n_vocab;
    int32_t x, xn, qkv, q, attn, o, gu, act, lnorm, logits;
    OSP_ACT("x", OSP_DTYPE_F32, E, OSP_ROWS_TOKENS, &x);
    OSP_ACT("xn", OSP_DTYPE_BF16, E, OSP_ROWS_TOKENS, &xn);
    OSP_ACT("qkv", OSP_DTYPE_F32, QD + 2 * KD, OSP_ROWS_TOKENS, &qkv);
    OSP_ACT("q", OSP_DTYPE_BF16, QD, OSP_ROWS_TOKENS, &q);
    OSP_ACT("attn", OSP_DTYPE_BF16, QD, OSP_ROWS_TOKENS, &attn);
    OSP_ACT("o", OSP_DTYPE_BF16, E, OSP_ROWS_TOKENS, &o);
    OSP_ACT("gu", OSP_DTYPE_BF16, 2 * F, OSP_ROWS_TOKENS, &gu);
    OSP_ACT("act", OSP_DTYPE_BF16, F, OSP_ROWS_TOKENS, &act);
    const float scale = c->attn_scale;
    OSP_PUSH(OSP_OP_EMBED, x, -1, -1, .w = w->io.tok_embd, .p.embed.scale = 1.0f);
    int32_t pending = -1; /* the last layer's MLP output, added to x by the next norm (fused) */
    for (int32_t l = 0; l < c->n_layer; l++) {
        const llama_layer *L = &w->layers[l];
        OSP_PUSH(OSP_OP_ADD_RMSNORM, xn, pending, x, .w = L->attn_norm, .p.norm.eps = c->rms_eps);
        OSP_PUSH(OSP_OP_MATMUL, qkv, xn, -1, .w = L->proj.wqkv);
        OSP_PUSH(OSP_OP_ROPE_KV_WRITE, q, qkv, -1, .layer = l, .w = L->bqkv, .w1 = L->q_norm, .w2 = L->k_norm,
                 .w3 = w->inv_freq,
                 .p.rope = {c->n_head, c->n_head_kv, c->head_dim, c->n_rot, c->rope_type == OSP_ROPE_NEOX, c->rms_eps});
        OSP_PUSH(OSP_OP_ATTENTION, attn, q, -1, .layer = l,
                 .p.attn = {c->n_head, c->n_head_kv, c->head_dim, 0, scale});
        OSP_PUSH(OSP_OP_MATMUL, o, attn, -1, .w = L->proj.wo);
        if (opts && opts->tp_world > 1) OSP_PUSH(OSP_OP_ALL_REDUCE, o, o, -1);
        OSP_PUSH(OSP_OP_ADD_RMSNORM, xn, o, x, .w = L->ffn_norm, .p.norm.eps = c->rms_eps);
        OSP_PUSH(OSP_OP_MATMUL, gu, xn, -1, .w = L->proj.wgu);
        OSP_PUSH(OSP_OP_GLU, act, gu, -1, .p.glu.act = OSP_GLU_SILU);
        OSP_PUSH(OSP_OP_MATMUL, o, act, -1, .w = L->proj.wdown);
        if (opts && opts->tp_world > 1) OSP_PUSH(OSP_OP_ALL_REDUCE, o, o, -1);
        pending = o;
        if (l == c->n_layer - 1 || osp_build_wants_hidden(opts, l)) { /* the stream after this layer is read */
            OSP_PUSH(OSP_OP_ADD, x, o, -1, .layer = 0);
            pending = -1;
            OSP_TRY(osp_graph_hidden(g, opts, l, x, E));
        }
    }
    OSP_TRY(osp_graph_final_norm(g, opts, x, E, w->io.out_norm, c->rms_eps));
    if (!with_logits) return OSP_OK;
    OSP_ACT("lnorm", OSP_DTYPE_BF16, E, OSP_ROWS_LOGITS, &lnorm);
    OSP_ACT("logits", OSP_DTYPE_F32, V, OSP_ROWS_LOGITS, &logits);
    OSP_PUSH(OSP_OP_GATHER_RMSNORM, lnorm, -1, x, .w = w->io.out_norm, .p.norm.eps = c->rms_eps);
    if (opts && opts->tp_world > 1) { /* a rank's rows of the lm_head (shard), its logits gathered */
        int32_t part;
        OSP_ACT("logits_part", OSP_DTYPE_F32, w->io.output->rows, OSP_ROWS_LOGITS, &part);
        OSP_PUSH(OSP_OP_MATMUL, part, lnorm, -1, .w = w->io.output);
        OSP_PUSH(OSP_OP_ALL_GATHER, logits, part, -1);
    } else {
        OSP_PUSH(OSP_OP_MATMUL, logits, lnorm, -1, .w = w->io.output);
    }
    g->logits = logits;
    return OSP_OK;
}

/* Rank `rank` of `world` (arch.h's shard): query heads [rank H / W, (rank + 1) H / W) and their KV heads
 * (GQA groups stay whole because both head counts divide by W), FFN columns [rank F / W, ...). q, k, v
 * and their biases, gate and up are cut by output rows (FFN columns in whole blocks of down's type, the shares
 * unequal by a block where they must); o and down by input columns, each rank's partial
 * product summed by the ALL_REDUCE the builder adds. The lm_head by vocabulary rows [rank V / W,
 * (rank + 1) V / W) (the parallel output embedding; a view, so a tied token_embd stays whole for the
 * lookup), each rank's logits joined by the ALL_GATHER the builder adds. Norms and embeddings stay whole.
 * Fewer KV heads than ranks (W > n_head_kv, W a multiple of it: vLLM's rule, Megatron-LM's GQA
 * replication): each rank holds the one KV head its query heads read, kv = rank / (W / n_head_kv), so
 * W / n_head_kv ranks hold copies of each KV head (its k / v rows and biases, and its KV cache pages). */
static osp_status shard(osp_loader *ld, const osp_model_config *c, int32_t rank, int32_t world, void *wp,
                        osp_model_config *rc) {
    llama_weights *w = wp;
    const bool rep = world > c->n_head_kv; /* KV heads replicated */
    const bool kv_bad = rep ? world % c->n_head_kv != 0 : c->n_head_kv % world != 0;
    if (c->n_head % world || kv_bad) {
        const char *what = c->n_head % world ? "n_head" : "n_head_kv";
        const int32_t v = c->n_head % world ? c->n_head : c->n_head_kv;
        return osp_set_error(OSP_ERR_UNSUPPORTED,
                             "%s: tensor parallelism over %d ranks: %s (%d) does not fit (n_head, %d, must be a multiple "
                             "of the ranks, and n_head_kv, %d, a multiple or a divisor of them: KV heads are then copied)",
                             ld->path, world, what, v, c->n_head, c->n_head_kv);
    }
    /* FFN columns in units of U, the largest block of any layer's down matrix (every rank's columns of down
     * whole blocks, one split for all layers): rank r's units [r n / W, (r + 1) n / W) of n = F / U, so
     * the shares differ by a unit where W does not divide n (Qwen2.5-1.5B Q4_K_M, F 8,960 = 35 x 256, over 2
     * ranks: 4,352 and 4,608) */
    int64_t U = 1;
    for (int32_t l = 0; l < c->n_layer; l++)
        for (int32_t p = 0; p < w->layers[l].proj.wdown->n_parts; p++) {
            const int64_t bs = osp_dtype_block_size(w->layers[l].proj.wdown->parts[p].type);
            U = bs > U ? bs : U;
        }
    const int64_t n_units = c->n_ff % U ? 0 : c->n_ff / U;
    if (n_units < world)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "%s: tensor parallelism over %d ranks splits n_ff (%d) in whole blocks "
                             "of %lld (the down matrix's), and there are %lld of them", ld->path, world, c->n_ff,
                             (long long)U, (long long)n_units);
    const int64_t D = c->head_dim, QD = (int64_t)c->n_head * D, KD = (int64_t)c->n_head_kv * D, F = c->n_ff;
    const int64_t qd = QD / world, kd = rep ? D : KD / world;
    const int64_t f0 = n_units * rank / world * U, f = n_units * (rank + 1) / world * U - f0; /* my FFN columns */
    /* the first K (and V) row of this rank's KV heads */
    const int64_t k0 = rep ? (int64_t)(rank / (world / c->n_head_kv)) * D : rank * kd;
    float *bias = c->qkv_bias ? malloc((size_t)(qd + 2 * kd) * sizeof *bias) : NULL;
    if (c->qkv_bias && !bias) return osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", ld->path);
    osp_status s = OSP_OK;
    for (int32_t l = 0; l < c->n_layer && s == OSP_OK; l++) {
        llama_layer *L = &w->layers[l];
        const int64_t qkv0[3] = {rank * qd, QD + k0, QD + KD + k0}, qkvn[3] = {qd, kd, kd};
        const int64_t gu0[2] = {f0, F + f0}, gun[2] = {f, f};
        if ((s = osp_loader_view_rows(ld, L->proj.wqkv, 3, qkv0, qkvn, &L->proj.wqkv)) != OSP_OK ||
            (s = osp_loader_view_cols(ld, L->proj.wo, rank * qd, qd, &L->proj.wo)) != OSP_OK ||
            (s = osp_loader_view_rows(ld, L->proj.wgu, 2, gu0, gun, &L->proj.wgu)) != OSP_OK ||
            (s = osp_loader_view_cols(ld, L->proj.wdown, f0, f, &L->proj.wdown)) != OSP_OK)
            break;
        if (!c->qkv_bias) continue;
        /* the biases from the file's fp32 vectors, cut like their rows */
        static const char *const fmt[3] = {"blk.%d.attn_q.bias", "blk.%d.attn_k.bias", "blk.%d.attn_v.bias"};
        const int64_t len[3] = {QD, KD, KD}, off[3] = {rank * qd, k0, k0};
        float *dst = bias;
        for (int i = 0; i < 3 && s == OSP_OK; dst += qkvn[i], i++) {
            char name[96];
            snprintf(name, sizeof name, fmt[i], l);
            const float *v = osp_loader_host_f32(ld, name, len[i]);
            if (!v) s = osp_set_error(OSP_ERR_UNSUPPORTED, "%s: tensor parallelism reads '%s' as F32 from the file "
                                      "(random-weight presets with biases do not split)", ld->path, name);
            else memcpy(dst, v + off[i], (size_t)qkvn[i] * sizeof *dst);
        }
        if (s == OSP_OK) s = osp_loader_constant(ld, bias, qd + 2 * kd, &L->bqkv);
    }
    free(bias);
    if (s != OSP_OK) return s;
    const int64_t v0 = (int64_t)c->n_vocab * rank / world, vn = (int64_t)c->n_vocab * (rank + 1) / world - v0;
    OSP_TRY(osp_loader_view_rows(ld, w->io.output, 1, &v0, &vn, &w->io.output));
    *rc = *c;
    rc->n_head /= world, rc->n_head_kv = rep ? 1 : c->n_head_kv / world, rc->n_ff = (int32_t)f;
    return OSP_OK;
}

static const char *const k_gguf_archs[] = {"llama", "qwen2", "qwen3", NULL};

const osp_arch osp_arch_llama = {
    .name = "llama",
    .gguf_archs = k_gguf_archs,
    .read_config = read_config,
    .preset_config = preset_config,
    .bind = bind,
    .free_weights = free_weights,
    .shard = shard,
    .build = build,
};
