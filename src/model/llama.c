/* The llama-shaped decoder family: GGUF architectures `llama` (Llama 1/2/3.x, Mistral, SmolLM),
 * `qwen2` and `qwen3`. Loading hyper-parameters and weights from GGUF, the paged KV cache, and the
 * forward pass on the CPU reference backend.
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
 * Weights stay in the GGUF mapping in their stored type; activations are fp32. */
#include "osprey/model.h"

#include <math.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "backend/cpu/qdot.h"
#include "core/threadpool.h"
#include "core/dtype.h"
#include "core/status_internal.h"
#include "backend/cuda/cuda_ops.h"
#include "model/llama_cuda.h"
#include "model/llama_internal.h"
#include "model/presets.h"

osp_model_params osp_model_default_params(void) {
    osp_model_params p = {.n_threads = 0};
    return p;
}

/* ---- loading ----------------------------------------------------------------------------------- */

static osp_status get_hparam(const osp_gguf *g, const char *arch, const char *name, int32_t *out,
                             bool required, int32_t dflt) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, name);
    uint32_t v;
    osp_status s = osp_gguf_get_u32(g, key, &v);
    if (s == OSP_ERR_NOT_FOUND && !required) {
        *out = dflt;
        return OSP_OK;
    }
    if (s != OSP_OK) return s;
    if (v == 0 || v > (1u << 30))
        return osp_set_error(OSP_ERR_FORMAT, "%s: %s = %u is out of range", osp_gguf_path(g), key, v);
    *out = (int32_t)v;
    return OSP_OK;
}

static osp_status get_hparam_f(const osp_gguf *g, const char *arch, const char *name, float *out,
                               float dflt) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, name);
    osp_status s = osp_gguf_get_f32(g, key, out);
    if (s == OSP_ERR_NOT_FOUND) {
        *out = dflt;
        return OSP_OK;
    }
    return s;
}

/* Binds tensor `name` with ne = [cols, rows] to *w; rows == 1 accepts a 1-d tensor. */
static osp_status bind(const osp_gguf *g, const char *name, int64_t cols, int64_t rows,
                       osp_weight *w, bool optional) {
    const osp_gguf_tensor *t = osp_gguf_find_tensor(g, name);
    if (!t) {
        if (optional) {
            memset(w, 0, sizeof *w);
            return OSP_OK;
        }
        return osp_set_error(OSP_ERR_FORMAT, "%s: tensor '%s' is missing", osp_gguf_path(g), name);
    }
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1)
        return osp_set_error(OSP_ERR_FORMAT,
                             "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                             osp_gguf_path(g), name, (long long)t->ne[0], (long long)t->ne[1],
                             (long long)t->ne[2], (long long)t->ne[3], (long long)cols, (long long)rows);
    if (!osp_dtype_can_dequant(t->type))
        return osp_set_error(OSP_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which osprey cannot compute with yet",
                             osp_gguf_path(g), name, osp_dtype_name(t->type));
    w->data = t->data;
    w->type = t->type;
    w->cols = cols;
    w->rows = rows;
    w->row_bytes = osp_dtype_row_size(t->type, cols);
    return OSP_OK;
}

/* Norm weights are used as float arrays directly: they must be F32 (they are in every GGUF). */
static osp_status bind_norm(const osp_gguf *g, const char *name, int64_t n, const float **out) {
    osp_weight w = {0};
    OSP_TRY(bind(g, name, n, 1, &w, false));
    if (w.type != OSP_DTYPE_F32)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "%s: norm tensor '%s' is %s, expected F32",
                             osp_gguf_path(g), name, osp_dtype_name(w.type));
    if (((uintptr_t)w.data & 3u) != 0)
        return osp_set_error(OSP_ERR_FORMAT, "%s: tensor '%s' is not 4-byte aligned", osp_gguf_path(g), name);
    *out = w.data;
    return OSP_OK;
}

/* <arch>.rope.scaling.type and .factor (older files: <arch>.rope.scale_linear), read as llama.cpp does:
 * a factor without a type is linear. yarn and longrope change more than the angles (attention
 * temperature, per-dimension ramps) and are refused rather than run wrong. */
static osp_status read_rope_scaling(const osp_gguf *g, osp_model_config *c) {
    char key[128];
    float factor = 0.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.factor", c->arch);
    osp_status s = osp_gguf_get_f32(g, key, &factor);
    if (s == OSP_ERR_NOT_FOUND) {
        snprintf(key, sizeof key, "%s.rope.scale_linear", c->arch);
        s = osp_gguf_get_f32(g, key, &factor);
    }
    if (s != OSP_OK && s != OSP_ERR_NOT_FOUND) return s;
    if (s == OSP_ERR_NOT_FOUND) factor = 0.0f;
    osp_gguf_str type = {0};
    snprintf(key, sizeof key, "%s.rope.scaling.type", c->arch);
    s = osp_gguf_get_str(g, key, &type);
    if (s != OSP_OK && s != OSP_ERR_NOT_FOUND) return s;
    const bool none = s == OSP_OK && type.len == 4 && memcmp(type.data, "none", 4) == 0;
    const bool linear = s == OSP_ERR_NOT_FOUND || (type.len == 6 && memcmp(type.data, "linear", 6) == 0);
    if (!none && !linear)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "%s: %s '%.*s' is not supported (none, linear, llama3 factors)",
                             osp_gguf_path(g), key, (int)type.len, type.data);
    if (factor < 0.0f || factor != factor)
        return osp_set_error(OSP_ERR_FORMAT, "%s: rope scaling factor %g is invalid", osp_gguf_path(g), factor);
    c->rope_freq_scale = (linear && factor > 0.0f) ? 1.0f / factor : 1.0f;
    return OSP_OK;
}

static osp_status read_config(const osp_gguf *g, osp_model_config *c) {
    osp_gguf_str arch;
    memset(c, 0, sizeof *c);
    OSP_TRY(osp_gguf_get_str(g, "general.architecture", &arch));
    if (arch.len >= sizeof c->arch) arch.len = sizeof c->arch - 1;
    memcpy(c->arch, arch.data, arch.len);
    c->arch[arch.len] = '\0';
    if (strcmp(c->arch, "llama") != 0 && strcmp(c->arch, "qwen2") != 0 && strcmp(c->arch, "qwen3") != 0)
        return osp_set_error(OSP_ERR_UNSUPPORTED,
                             "%s: general.architecture '%s' is not supported (supported: llama, qwen2, qwen3)",
                             osp_gguf_path(g), c->arch);
    c->rope_type = strcmp(c->arch, "llama") == 0 ? OSP_ROPE_NORM : OSP_ROPE_NEOX;
    const char *a = c->arch;
    OSP_TRY(get_hparam(g, a, "embedding_length", &c->n_embd, true, 0));
    OSP_TRY(get_hparam(g, a, "block_count", &c->n_layer, true, 0));
    OSP_TRY(get_hparam(g, a, "attention.head_count", &c->n_head, true, 0));
    OSP_TRY(get_hparam(g, a, "attention.head_count_kv", &c->n_head_kv, false, c->n_head));
    OSP_TRY(get_hparam(g, a, "feed_forward_length", &c->n_ff, true, 0));
    OSP_TRY(get_hparam(g, a, "context_length", &c->n_ctx_train, false, 2048));
    if (c->n_embd % c->n_head != 0)
        return osp_set_error(OSP_ERR_FORMAT, "%s: %s.embedding_length %d is not a multiple of head_count %d",
                             osp_gguf_path(g), a, c->n_embd, c->n_head);
    OSP_TRY(get_hparam(g, a, "attention.key_length", &c->head_dim, false, c->n_embd / c->n_head));
    OSP_TRY(get_hparam(g, a, "rope.dimension_count", &c->n_rot, false, c->head_dim));
    OSP_TRY(get_hparam_f(g, a, "rope.freq_base", &c->rope_theta, 10000.0f));
    OSP_TRY(get_hparam_f(g, a, "attention.layer_norm_rms_epsilon", &c->rms_eps, 1e-5f));
    if (c->n_head % c->n_head_kv != 0)
        return osp_set_error(OSP_ERR_FORMAT, "%s: head_count %d is not a multiple of head_count_kv %d",
                             osp_gguf_path(g), c->n_head, c->n_head_kv);
    if (c->n_rot > c->head_dim || c->n_rot % 2 != 0)
        return osp_set_error(OSP_ERR_FORMAT, "%s: rope.dimension_count %d must be even and <= head_dim %d",
                             osp_gguf_path(g), c->n_rot, c->head_dim);
    if (!(c->rope_theta > 0.0f) || !(c->rms_eps > 0.0f) || !isfinite(c->rope_theta) || !isfinite(c->rms_eps))
        return osp_set_error(OSP_ERR_FORMAT, "%s: rope.freq_base and layer_norm_rms_epsilon must be finite and > 0",
                             osp_gguf_path(g));
    /* Every block tensor must belong to a layer below block_count: a smaller block_count would
     * otherwise silently run a truncated model (llama.cpp refuses unused tensors too). */
    for (uint64_t i = 0; i < osp_gguf_n_tensors(g); i++) {
        const char *tn = osp_gguf_tensor_at(g, i)->name;
        char *end;
        if (strncmp(tn, "blk.", 4) != 0) continue;
        const long blk = strtol(tn + 4, &end, 10);
        if (end == tn + 4 || blk < 0 || blk >= c->n_layer)
            return osp_set_error(OSP_ERR_FORMAT, "%s: tensor '%s' is outside %s.block_count = %d", osp_gguf_path(g),
                                 tn, c->arch, c->n_layer);
    }
    const osp_gguf_tensor *emb = osp_gguf_find_tensor(g, "token_embd.weight");
    if (!emb) return osp_set_error(OSP_ERR_FORMAT, "%s: tensor 'token_embd.weight' is missing", osp_gguf_path(g));
    if (emb->ne[1] < 1 || emb->ne[1] > INT32_MAX)
        return osp_set_error(OSP_ERR_FORMAT, "%s: token_embd.weight has a bad vocabulary size", osp_gguf_path(g));
    c->n_vocab = (int32_t)emb->ne[1];
    c->tied_output = osp_gguf_find_tensor(g, "output.weight") == NULL;
    c->qkv_bias = osp_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    c->qk_norm = osp_gguf_find_tensor(g, "blk.0.attn_q_norm.weight") != NULL || strcmp(a, "qwen3") == 0;
    c->rope_freq_factors = osp_gguf_find_tensor(g, "rope_freqs.weight") != NULL;
    return read_rope_scaling(g, c);
}

osp_status osp_model_load(const char *path, const osp_model_params *params, osp_model **out) {
    if (!path || !out) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_model_load: NULL argument");
    *out = NULL;
    osp_model *m = calloc(1, sizeof *m);
    if (!m) return osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", path);
    osp_status s = osp_gguf_open(path, &m->gguf);
    if (s != OSP_OK) goto fail;
    const osp_gguf *g = m->gguf;
    osp_model_config *c = &m->cfg;
    if ((s = read_config(g, c)) != OSP_OK) goto fail;
    m->n_threads = params && params->n_threads > 0 ? params->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (m->n_threads < 1) m->n_threads = 1;
    m->exact = params ? params->exact : false;
    m->emulate_bf16 = params && params->emulate_bf16 && params->device == OSP_DEVICE_CPU;
    if (m->emulate_bf16) m->exact = true;
    if ((s = osp_threadpool_create(m->n_threads, &m->pool)) != OSP_OK) goto fail;

    const int64_t E = c->n_embd, QD = (int64_t)c->n_head * c->head_dim,
                  KD = (int64_t)c->n_head_kv * c->head_dim, F = c->n_ff;
    if ((s = bind(g, "token_embd.weight", E, c->n_vocab, &m->tok_embd, false)) != OSP_OK) goto fail;
    if ((s = bind(g, "output.weight", E, c->n_vocab, &m->output, true)) != OSP_OK) goto fail;
    if (c->tied_output) m->output = m->tok_embd;
    if ((s = bind_norm(g, "output_norm.weight", E, &m->out_norm)) != OSP_OK) goto fail;
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    m->inv_freq = malloc((size_t)(c->n_rot / 2 + 1) * sizeof *m->inv_freq);
    if (!m->layers || !m->inv_freq) {
        s = osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    for (int32_t l = 0; l < c->n_layer; l++) {
        layer_weights *L = &m->layers[l];
        char nm[96];
#define BINDW(suffix, cols, rows, dst)                                                             \
    snprintf(nm, sizeof nm, "blk.%d." suffix ".weight", l);                                        \
    if ((s = bind(g, nm, cols, rows, dst, false)) != OSP_OK) goto fail;
        snprintf(nm, sizeof nm, "blk.%d.attn_norm.weight", l);
        if ((s = bind_norm(g, nm, E, &L->attn_norm)) != OSP_OK) goto fail;
        snprintf(nm, sizeof nm, "blk.%d.ffn_norm.weight", l);
        if ((s = bind_norm(g, nm, E, &L->ffn_norm)) != OSP_OK) goto fail;
        BINDW("attn_q", E, QD, &L->wq);
        BINDW("attn_k", E, KD, &L->wk);
        BINDW("attn_v", E, KD, &L->wv);
        if (c->qkv_bias) {
            snprintf(nm, sizeof nm, "blk.%d.attn_q.bias", l);
            if ((s = bind_norm(g, nm, QD, &L->bq)) != OSP_OK) goto fail;
            snprintf(nm, sizeof nm, "blk.%d.attn_k.bias", l);
            if ((s = bind_norm(g, nm, KD, &L->bk)) != OSP_OK) goto fail;
            snprintf(nm, sizeof nm, "blk.%d.attn_v.bias", l);
            if ((s = bind_norm(g, nm, KD, &L->bv)) != OSP_OK) goto fail;
        }
        if (c->qk_norm) {
            snprintf(nm, sizeof nm, "blk.%d.attn_q_norm.weight", l);
            if ((s = bind_norm(g, nm, c->head_dim, &L->q_norm)) != OSP_OK) goto fail;
            snprintf(nm, sizeof nm, "blk.%d.attn_k_norm.weight", l);
            if ((s = bind_norm(g, nm, c->head_dim, &L->k_norm)) != OSP_OK) goto fail;
        }
        BINDW("attn_output", QD, E, &L->wo);
        BINDW("ffn_gate", E, F, &L->w_gate);
        BINDW("ffn_up", E, F, &L->w_up);
        BINDW("ffn_down", F, E, &L->w_down);
#undef BINDW
    }
    /* inv_freq[i] = theta^(-2i / n_rot) * freq_scale / factor[i], computed in double and rounded once
     * (HF computes it in fp32 from an int64 arange; the difference is below one ulp of the angle). */
    const float *ff = NULL;
    if (c->rope_freq_factors && (s = bind_norm(g, "rope_freqs.weight", c->n_rot / 2, &ff)) != OSP_OK) goto fail;
    for (int32_t i = 0; i < c->n_rot / 2; i++) {
        double f = 1.0 / pow((double)c->rope_theta, (2.0 * i) / (double)c->n_rot);
        if (ff) {
            if (!(ff[i] > 0.0f)) {
                s = osp_set_error(OSP_ERR_FORMAT, "%s: rope_freqs.weight[%d] = %g is not positive", path, i, ff[i]);
                goto fail;
            }
            f /= (double)ff[i];
        }
        if (c->rope_freq_scale != 1.0f) f *= (double)c->rope_freq_scale;
        m->inv_freq[i] = (float)f;
    }
    if (m->emulate_bf16) {
        m->tok_embd.round_bf16 = m->output.round_bf16 = true;
        for (int32_t l = 0; l < c->n_layer; l++) {
            layer_weights *L = &m->layers[l];
            osp_weight *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
            for (int i = 0; i < 7; i++) ws[i]->round_bf16 = true;
        }
    }
    if (params && params->device == OSP_DEVICE_CUDA && (s = osp_llama_cuda_init(m, params)) != OSP_OK) goto fail;
    *out = m;
    return OSP_OK;
fail:
    osp_model_free(m);
    return s;
}

osp_status osp_model_load_random(const char *preset, uint64_t seed, const osp_model_params *params, osp_model **out) {
    if (!out) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_model_load_random: NULL argument");
    *out = NULL;
    const osp_model_preset *p = osp_model_preset_find(preset);
    if (!p) return osp_set_error(OSP_ERR_INVALID_ARG, "--random-weights: unknown preset '%s' (see osprey make-random-model --list-presets)",
                                 preset ? preset : "(null)");
    if (!params || params->device != OSP_DEVICE_CUDA)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "--random-weights fills the weights on the GPU (--device cuda); on the CPU "
                                                  "write a GGUF with osprey make-random-model --preset %s", preset);
    osp_model *m = calloc(1, sizeof *m);
    if (!m) return osp_set_error(OSP_ERR_NOMEM, "out of memory");
    osp_model_config *c = &m->cfg;
    snprintf(c->arch, sizeof c->arch, "%s", p->arch);
    c->n_vocab = p->n_vocab, c->n_embd = p->n_embd, c->n_layer = p->n_layer;
    c->n_head = p->n_head, c->n_head_kv = p->n_head_kv;
    c->head_dim = p->head_dim ? p->head_dim : p->n_embd / p->n_head;
    c->n_ff = p->n_ff, c->n_rot = c->head_dim, c->n_ctx_train = p->n_ctx;
    c->rope_theta = p->rope_theta, c->rms_eps = p->rms_eps, c->tied_output = p->tied;
    c->rope_type = strcmp(p->arch, "llama") == 0 ? OSP_ROPE_NORM : OSP_ROPE_NEOX;
    c->rope_freq_scale = 1.0f;
    c->rope_freq_factors = p->rope.factor > 0.0f;
    c->qkv_bias = p->qkv_bias, c->qk_norm = p->qk_norm;
    m->n_threads = params->n_threads > 0 ? params->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (m->n_threads < 1) m->n_threads = 1;
    osp_status s = osp_threadpool_create(m->n_threads, &m->pool);
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    m->inv_freq = malloc((size_t)(c->n_rot / 2 + 1) * sizeof *m->inv_freq);
    float *ff = malloc((size_t)(c->n_rot / 2 + 1) * sizeof *ff);
    if (s == OSP_OK && (!m->layers || !m->inv_freq || !ff)) s = osp_set_error(OSP_ERR_NOMEM, "out of memory");
    if (s == OSP_OK) {
        if (c->rope_freq_factors) osp_rope_llama3_factors(&p->rope, c->rope_theta, c->n_rot, ff);
        for (int32_t i = 0; i < c->n_rot / 2; i++) { /* as osp_model_load computes it */
            double f = 1.0 / pow((double)c->rope_theta, (2.0 * i) / (double)c->n_rot);
            if (c->rope_freq_factors) f /= (double)ff[i];
            m->inv_freq[i] = (float)f;
        }
        s = osp_llama_cuda_init_random(m, seed, params);
    }
    free(ff);
    if (s != OSP_OK) {
        osp_model_free(m);
        return s;
    }
    *out = m;
    return OSP_OK;
}

static void ws_free(workspace *w) {
    float **bufs[] = {&w->x, &w->xn, &w->q, &w->k, &w->v, &w->attn, &w->gate, &w->up,
                      &w->out_rows, &w->scratch, &w->scores};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        free(*bufs[i]);
        *bufs[i] = NULL;
    }
    free(w->xq);
    w->xq = NULL;
    w->cap_tokens = w->cap_logits = w->cap_ctx = w->cap_xq = 0;
}

void osp_model_free(osp_model *m) {
    if (!m) return;
    ws_free(&m->ws);
    osp_llama_cuda_free(m->gpu);
    osp_threadpool_free(m->pool);
    free(m->layers);
    free(m->inv_freq);
    osp_gguf_close(m->gguf);
    free(m);
}

const osp_model_config *osp_model_config_get(const osp_model *m) { return &m->cfg; }
osp_device osp_model_device(const osp_model *m) { return m->gpu ? OSP_DEVICE_CUDA : OSP_DEVICE_CPU; }
size_t osp_model_device_weight_bytes(const osp_model *m) { return osp_llama_cuda_weight_bytes(m->gpu); }

const char *osp_device_name(osp_device d) { return d == OSP_DEVICE_CUDA ? "cuda" : "cpu"; }

osp_status osp_device_parse(const char *name, osp_device *out) {
    if (name && !strcmp(name, "cpu")) *out = OSP_DEVICE_CPU;
    else if (name && !strcmp(name, "cuda")) *out = OSP_DEVICE_CUDA;
    else if (name && !strcmp(name, "auto")) *out = osp_cuda_device_count() > 0 ? OSP_DEVICE_CUDA : OSP_DEVICE_CPU;
    else return osp_set_error(OSP_ERR_INVALID_ARG, "device '%s' is not one of cpu, cuda, auto", name ? name : "(null)");
    return OSP_OK;
}
const osp_gguf *osp_model_gguf(const osp_model *m) { return m->gguf; }
int osp_model_n_threads(const osp_model *m) { return m->n_threads; }
void osp_model_run_parallel(osp_model *m, void (*fn)(void *ctx, int ith, int nth), void *ctx) {
    osp_threadpool_run(m->pool, fn, ctx);
}

/* ---- KV cache ---------------------------------------------------------------------------------- */

const char *osp_kv_dtype_name(osp_kv_dtype d) {
    return d == OSP_KV_DTYPE_F32 ? "f32" : d == OSP_KV_DTYPE_F16 ? "f16" : NULL;
}

osp_status osp_kv_dtype_parse(const char *name, osp_kv_dtype *out) {
    if (name && !strcmp(name, "f32")) *out = OSP_KV_DTYPE_F32;
    else if (name && !strcmp(name, "f16")) *out = OSP_KV_DTYPE_F16;
    else return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache dtype '%s' is not one of f32, f16", name ? name : "(null)");
    return OSP_OK;
}

int64_t osp_kv_cache_bytes_per_token(const osp_model_config *c, osp_kv_dtype d) {
    return 2 * (int64_t)c->n_layer * c->n_head_kv * c->head_dim * (d == OSP_KV_DTYPE_F16 ? 2 : 4);
}

osp_status osp_kv_cache_create(const osp_model *m, int32_t num_blocks, int32_t block_size, osp_kv_dtype dtype,
                               osp_kv_cache **out) {
    *out = NULL;
    if (num_blocks <= 0 || block_size <= 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache: num_blocks %d and block_size %d must be > 0",
                             num_blocks, block_size);
    if (!osp_kv_dtype_name(dtype)) return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache: unknown dtype %d", (int)dtype);
    if (dtype == OSP_KV_DTYPE_F16 && m->cfg.head_dim > 1024)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "kv cache: f16 pages need head_dim <= 1024 (model has %d)",
                             m->cfg.head_dim);
    osp_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) return osp_set_error(OSP_ERR_NOMEM, "kv cache: out of memory");
    static _Atomic uint64_t next_id = 1;
    kv->id = next_id++;
    kv->num_blocks = num_blocks;
    kv->block_size = block_size;
    kv->dtype = dtype;
    kv->elem = dtype == OSP_KV_DTYPE_F16 ? 2 : 4;
    kv->n_layer = m->cfg.n_layer;
    kv->kv_row = (int64_t)m->cfg.n_head_kv * m->cfg.head_dim;
    kv->k = calloc((size_t)kv->n_layer, sizeof *kv->k);
    kv->v = calloc((size_t)kv->n_layer, sizeof *kv->v);
    if (!kv->k || !kv->v) goto nomem;
    if (m->gpu) {
        osp_status s = osp_llama_cuda_kv_alloc((osp_model *)m, kv);
        if (s != OSP_OK) {
            osp_kv_cache_free(kv);
            return s;
        }
        *out = kv;
        return OSP_OK;
    }
    size_t n = (size_t)num_blocks * (size_t)block_size * (size_t)kv->kv_row;
    for (int32_t l = 0; l < kv->n_layer; l++) {
        kv->k[l] = calloc(n, kv->elem);
        kv->v[l] = calloc(n, kv->elem);
        if (!kv->k[l] || !kv->v[l]) goto nomem;
    }
    *out = kv;
    return OSP_OK;
nomem:
    osp_kv_cache_free(kv);
    return osp_set_error(OSP_ERR_NOMEM, "kv cache: out of memory for %d blocks of %d tokens",
                         num_blocks, block_size);
}

void osp_kv_cache_free(osp_kv_cache *kv) {
    if (!kv) return;
    if (kv->on_device) {
        osp_llama_cuda_kv_free(kv);
        free(kv->k);
        free(kv->v);
        free(kv);
        return;
    }
    for (int32_t l = 0; l < kv->n_layer; l++) {
        if (kv->k) free(kv->k[l]);
        if (kv->v) free(kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    free(kv);
}

int32_t osp_kv_cache_block_size(const osp_kv_cache *kv) { return kv->block_size; }
int32_t osp_kv_cache_num_blocks(const osp_kv_cache *kv) { return kv->num_blocks; }
osp_kv_dtype osp_kv_cache_dtype(const osp_kv_cache *kv) { return kv->dtype; }

size_t osp_kv_cache_bytes(const osp_kv_cache *kv) {
    return 2 * (size_t)kv->n_layer * (size_t)kv->num_blocks * (size_t)kv->block_size * (size_t)kv->kv_row * kv->elem;
}

osp_status osp_kv_cache_copy_block(osp_kv_cache *kv, int32_t src, int32_t dst) {
    if (src < 0 || src >= kv->num_blocks || dst < 0 || dst >= kv->num_blocks)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache: copy of block %d to %d outside the %d blocks", src, dst,
                             kv->num_blocks);
    if (kv->on_device) return osp_llama_cuda_copy_block(kv, src, dst);
    const size_t bytes = (size_t)kv->block_size * (size_t)kv->kv_row * kv->elem;
    for (int32_t l = 0; l < kv->n_layer; l++) {
        memcpy((char *)kv->k[l] + (size_t)dst * bytes, (const char *)kv->k[l] + (size_t)src * bytes, bytes);
        memcpy((char *)kv->v[l] + (size_t)dst * bytes, (const char *)kv->v[l] + (size_t)src * bytes, bytes);
    }
    return OSP_OK;
}

/* ---- forward ----------------------------------------------------------------------------------- */

static osp_status ws_reserve(osp_model *m, int64_t n_tokens, int64_t n_logits, int64_t max_ctx) {
    workspace *w = &m->ws;
    const osp_model_config *c = &m->cfg;
    const int64_t E = c->n_embd, QD = (int64_t)c->n_head * c->head_dim,
                  KD = (int64_t)c->n_head_kv * c->head_dim, F = c->n_ff;
    const int nt = m->n_threads;
    int64_t max_cols = E > F ? E : F;
    max_cols = max_cols > QD ? max_cols : QD;
    const int64_t need_xq = n_tokens > n_logits ? n_tokens : n_logits;
    if (need_xq > w->cap_xq) {
        free(w->xq);
        w->xq = malloc((size_t)need_xq * (size_t)(max_cols / OSP_Q8_BLOCK) * sizeof *w->xq);
        if (!w->xq) goto nomem;
        w->cap_xq = need_xq;
    }
    if (n_tokens > w->cap_tokens) {
        float **bufs[] = {&w->x, &w->xn, &w->q, &w->k, &w->v, &w->attn, &w->gate, &w->up};
        const int64_t widths[] = {E, E > QD ? E : QD, QD, KD, KD, QD, F, F};
        for (size_t i = 0; i < 8; i++) {
            free(*bufs[i]);
            *bufs[i] = malloc((size_t)n_tokens * (size_t)widths[i] * sizeof(float));
            if (!*bufs[i]) goto nomem;
        }
        w->cap_tokens = n_tokens;
    }
    if (n_logits > w->cap_logits) {
        free(w->out_rows);
        w->out_rows = malloc((size_t)n_logits * (size_t)E * sizeof(float));
        if (!w->out_rows) goto nomem;
        w->cap_logits = n_logits;
    }
    if (!w->scratch) {
        w->scratch = malloc((size_t)nt * (size_t)max_cols * sizeof(float));
        if (!w->scratch) goto nomem;
    }
    if (max_ctx > w->cap_ctx) {
        int64_t cap = max_ctx < 256 ? 256 : max_ctx * 2;
        free(w->scores);
        w->scores = malloc((size_t)nt * (size_t)cap * sizeof(float));
        if (!w->scores) goto nomem;
        w->cap_ctx = cap;
    }
    return OSP_OK;
nomem:
    ws_free(w);
    return osp_set_error(OSP_ERR_NOMEM, "forward: out of memory for a batch of %lld tokens",
                         (long long)n_tokens);
}

static osp_status check_batch(const osp_model *m, const osp_kv_cache *kv, const osp_batch *b,
                              int64_t *max_ctx) {
    const int64_t n_slots = (int64_t)kv->num_blocks * kv->block_size;
    if (b->num_tokens <= 0 || b->num_seqs <= 0 || b->num_logits < 0 || b->max_blocks_per_seq <= 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "batch: empty or negative sizes");
    if (b->query_start_loc[0] != 0 || b->query_start_loc[b->num_seqs] != b->num_tokens)
        return osp_set_error(OSP_ERR_INVALID_ARG, "batch: query_start_loc must run from 0 to num_tokens");
    *max_ctx = 0;
    for (int32_t s = 0; s < b->num_seqs; s++) {
        const int32_t lo = b->query_start_loc[s], hi = b->query_start_loc[s + 1];
        if (hi <= lo) return osp_set_error(OSP_ERR_INVALID_ARG, "batch: sequence %d has no tokens", s);
        const int32_t len = b->seq_lens[s];
        if (len < hi - lo || (int64_t)len > (int64_t)b->max_blocks_per_seq * kv->block_size)
            return osp_set_error(OSP_ERR_INVALID_ARG, "batch: seq_lens[%d] = %d is out of range", s, len);
        if (len > *max_ctx) *max_ctx = len;
        for (int32_t i = 0; i < (len + kv->block_size - 1) / kv->block_size; i++) {
            const int32_t blk = b->block_table[(size_t)s * b->max_blocks_per_seq + i];
            if (blk < 0 || blk >= kv->num_blocks)
                return osp_set_error(OSP_ERR_INVALID_ARG, "batch: block_table[%d][%d] = %d is not a block", s, i, blk);
        }
        for (int32_t t = lo; t < hi; t++) {
            if (b->positions[t] < 0 || b->positions[t] >= len)
                return osp_set_error(OSP_ERR_INVALID_ARG, "batch: position %d of token %d is outside seq_lens %d",
                                     b->positions[t], t, len);
            const int32_t p = b->positions[t];
            const int64_t slot = (int64_t)b->block_table[(size_t)s * b->max_blocks_per_seq + p / kv->block_size] *
                                     kv->block_size + p % kv->block_size;
            if (b->slot_mapping[t] != slot)
                return osp_set_error(OSP_ERR_INVALID_ARG,
                                     "batch: slot_mapping[%d] = %d does not match block_table (%lld)", t,
                                     b->slot_mapping[t], (long long)slot);
        }
    }
    for (int32_t t = 0; t < b->num_tokens; t++) {
        if (b->token_ids[t] < 0 || b->token_ids[t] >= m->cfg.n_vocab)
            return osp_set_error(OSP_ERR_INVALID_ARG, "batch: token id %d is outside the vocabulary (%d)",
                                 b->token_ids[t], m->cfg.n_vocab);
        if (b->slot_mapping[t] < 0 || b->slot_mapping[t] >= n_slots)
            return osp_set_error(OSP_ERR_INVALID_ARG, "batch: slot_mapping[%d] = %d is outside the cache", t,
                                 b->slot_mapping[t]);
    }
    for (int32_t i = 0; i < b->num_logits; i++)
        if (b->logits_indices[i] < 0 || b->logits_indices[i] >= b->num_tokens)
            return osp_set_error(OSP_ERR_INVALID_ARG, "batch: logits_indices[%d] = %d is out of range", i,
                                 b->logits_indices[i]);
    return OSP_OK;
}

/* One forward pass as a single parallel region: every thread walks the whole layer loop, takes its
 * slice of each op (matmul rows, attention (token, head) items, token rows) and meets the others at
 * a barrier where the next op reads what this one wrote. */
typedef struct fwd_ctx {
    osp_model *m;
    osp_kv_cache *kv;
    const osp_batch *b;
    float *logits;
} fwd_ctx;

/* y = x W^T over this thread's slice of W's rows: int8 dot products on the quantized rows xq when
 * the fast path has a kernel for W's type, else the fp32 reference on x. */
static void mm(const osp_model *m, const osp_weight *w, const float *x, const osp_q8_block *xq, float *y,
               int64_t T, int ith, int nth) {
    long long r0, r1;
    osp_split(w->rows, ith, nth, &r0, &r1);
    const osp_qdot_fn dot = m->exact ? NULL : osp_qdot_for(w->type);
    if (!dot) {
        osp_cpu_matmul_rows(w, x, y, T, r0, r1, m->ws.scratch + (size_t)ith * (size_t)w->cols);
        return;
    }
    const int64_t nb = w->cols / OSP_Q8_BLOCK;
    const uint8_t *base = w->data;
    for (int64_t r = r0; r < r1; r++) {
        const void *wr = base + (size_t)r * w->row_bytes;
        for (int64_t t = 0; t < T; t++) y[t * w->rows + r] = dot(wr, xq + t * nb, nb);
    }
}

/* Quantizes this thread's share of the T rows of x [T, n] into xq (fast path only). */
static void quant_rows(const osp_model *m, const float *x, osp_q8_block *xq, int64_t T, int64_t n, int ith,
                       int nth) {
    if (m->exact) return;
    long long t0, t1;
    osp_split(T, ith, nth, &t0, &t1);
    for (long long t = t0; t < t1; t++) osp_quantize_row_q8(x + t * n, xq + t * (n / OSP_Q8_BLOCK), n);
}

static void forward_task(void *arg, int ith, int nth) {
    fwd_ctx *ctx = arg;
    osp_model *m = ctx->m;
    osp_kv_cache *kv = ctx->kv;
    const osp_batch *b = ctx->b;
    const osp_model_config *c = &m->cfg;
    osp_threadpool *pool = m->pool;
    workspace *w = &m->ws;
    const int64_t T = b->num_tokens, E = c->n_embd, D = c->head_dim, F = c->n_ff;
    const int64_t QD = (int64_t)c->n_head * D, KD = (int64_t)c->n_head_kv * D;
    const float scale = 1.0f / sqrtf((float)D);
    float *scores = w->scores + (size_t)ith * (size_t)w->cap_ctx;
    long long t0, t1, i0, i1;
    osp_split(T, ith, nth, &t0, &t1);

    /* embedding gather, then the first RMSNorm */
    const osp_weight *emb = &m->tok_embd;
    for (long long t = t0; t < t1; t++)
        osp_dequant_row(emb->type, (const uint8_t *)emb->data + (size_t)b->token_ids[t] * emb->row_bytes,
                        w->x + t * E, E);
    /* bf16 emulation (tests): round where the CUDA backend stores bf16: the embedding table, every
     * GEMM input (norm outputs, attention output, silu(gate) * up) and output that it keeps in bf16
     * (o-proj, gate/up, down), and q after RoPE */
    const bool bf = m->emulate_bf16;
    if (bf) osp_cpu_round_bf16(w->x + t0 * E, (t1 - t0) * E);

    for (int32_t l = 0; l < c->n_layer; l++) {
        const layer_weights *L = &m->layers[l];
        /* attention block: norm (+ quantize) of my rows */
        osp_cpu_rmsnorm(w->x + t0 * E, L->attn_norm, w->xn + t0 * E, t1 - t0, E, c->rms_eps);
        if (bf) osp_cpu_round_bf16(w->xn + t0 * E, (t1 - t0) * E);
        quant_rows(m, w->xn, w->xq, T, E, ith, nth); /* same token split as the norm: no barrier */
        osp_threadpool_barrier(pool);
        mm(m, &L->wq, w->xn, w->xq, w->q, T, ith, nth);
        mm(m, &L->wk, w->xn, w->xq, w->k, T, ith, nth);
        mm(m, &L->wv, w->xn, w->xq, w->v, T, ith, nth);
        osp_threadpool_barrier(pool);
        /* biases, q/k norms, rope + KV write for my tokens */
        if (L->bq) {
            for (long long t = t0; t < t1; t++) {
                for (int64_t j = 0; j < QD; j++) w->q[t * QD + j] += L->bq[j];
                for (int64_t j = 0; j < KD; j++) w->k[t * KD + j] += L->bk[j];
                for (int64_t j = 0; j < KD; j++) w->v[t * KD + j] += L->bv[j];
            }
        }
        if (L->q_norm) {
            osp_cpu_rmsnorm(w->q + t0 * QD, L->q_norm, w->q + t0 * QD, (t1 - t0) * c->n_head, D, c->rms_eps);
            osp_cpu_rmsnorm(w->k + t0 * KD, L->k_norm, w->k + t0 * KD, (t1 - t0) * c->n_head_kv, D, c->rms_eps);
        }
        if (c->rope_type == OSP_ROPE_NEOX) {
            osp_cpu_rope_neox(w->q + t0 * QD, b->positions + t0, t1 - t0, c->n_head, D, c->n_rot, m->inv_freq);
            osp_cpu_rope_neox(w->k + t0 * KD, b->positions + t0, t1 - t0, c->n_head_kv, D, c->n_rot, m->inv_freq);
        } else {
            osp_cpu_rope_interleaved(w->q + t0 * QD, b->positions + t0, t1 - t0, c->n_head, D, c->n_rot, m->inv_freq);
            osp_cpu_rope_interleaved(w->k + t0 * KD, b->positions + t0, t1 - t0, c->n_head_kv, D, c->n_rot,
                                     m->inv_freq);
        }
        if (bf) osp_cpu_round_bf16(w->q + t0 * QD, (t1 - t0) * QD);
        if (kv->dtype == OSP_KV_DTYPE_F16) {
            osp_cpu_kv_write_f16(w->k + t0 * KD, w->v + t0 * KD, kv->k[l], kv->v[l], b->slot_mapping + t0, t1 - t0, KD);
        } else {
            for (long long t = t0; t < t1; t++) {
                const size_t slot = (size_t)b->slot_mapping[t];
                memcpy((float *)kv->k[l] + slot * KD, w->k + t * KD, (size_t)KD * sizeof(float));
                memcpy((float *)kv->v[l] + slot * KD, w->v + t * KD, (size_t)KD * sizeof(float));
            }
        }
        osp_threadpool_barrier(pool);
        osp_split(T * c->n_head, ith, nth, &i0, &i1);
        osp_cpu_paged_attention(w->q, kv->k[l], kv->v[l], kv->dtype == OSP_KV_DTYPE_F16, w->attn, b->num_seqs,
                                b->query_start_loc, b->positions, b->block_table, b->max_blocks_per_seq,
                                kv->block_size, c->n_head, c->n_head_kv, D, scale, scores, i0, i1);
        osp_threadpool_barrier(pool);
        if (bf) osp_cpu_round_bf16(w->attn + t0 * QD, (t1 - t0) * QD);
        quant_rows(m, w->attn, w->xq, T, QD, ith, nth);
        osp_threadpool_barrier(pool);
        mm(m, &L->wo, w->attn, w->xq, w->xn, T, ith, nth);
        osp_threadpool_barrier(pool);
        /* residual, MLP norm (+ quantize) of my rows */
        if (bf) osp_cpu_round_bf16(w->xn + t0 * E, (t1 - t0) * E);
        for (long long i = t0 * E; i < t1 * E; i++) w->x[i] += w->xn[i];
        osp_cpu_rmsnorm(w->x + t0 * E, L->ffn_norm, w->xn + t0 * E, t1 - t0, E, c->rms_eps);
        if (bf) osp_cpu_round_bf16(w->xn + t0 * E, (t1 - t0) * E);
        quant_rows(m, w->xn, w->xq, T, E, ith, nth);
        osp_threadpool_barrier(pool);
        mm(m, &L->w_gate, w->xn, w->xq, w->gate, T, ith, nth);
        mm(m, &L->w_up, w->xn, w->xq, w->up, T, ith, nth);
        osp_threadpool_barrier(pool);
        if (bf) {
            osp_cpu_round_bf16(w->gate + t0 * F, (t1 - t0) * F);
            osp_cpu_round_bf16(w->up + t0 * F, (t1 - t0) * F);
        }
        osp_cpu_silu_mul(w->gate + t0 * F, w->up + t0 * F, w->gate + t0 * F, (t1 - t0) * F);
        if (bf) osp_cpu_round_bf16(w->gate + t0 * F, (t1 - t0) * F);
        quant_rows(m, w->gate, w->xq, T, F, ith, nth);
        osp_threadpool_barrier(pool);
        mm(m, &L->w_down, w->gate, w->xq, w->xn, T, ith, nth);
        osp_threadpool_barrier(pool);
        if (bf) osp_cpu_round_bf16(w->xn + t0 * E, (t1 - t0) * E);
        for (long long i = t0 * E; i < t1 * E; i++) w->x[i] += w->xn[i];
        /* the next layer's norm reads only my rows: no barrier needed here */
    }
    if (b->num_logits == 0) return;
    osp_threadpool_barrier(pool); /* logits rows may come from other threads' tokens */
    long long l0, l1;
    osp_split(b->num_logits, ith, nth, &l0, &l1);
    for (long long i = l0; i < l1; i++)
        memcpy(w->out_rows + i * E, w->x + (int64_t)b->logits_indices[i] * E, (size_t)E * sizeof(float));
    osp_cpu_rmsnorm(w->out_rows + l0 * E, m->out_norm, w->out_rows + l0 * E, l1 - l0, E, c->rms_eps);
    if (bf) osp_cpu_round_bf16(w->out_rows + l0 * E, (l1 - l0) * E);
    quant_rows(m, w->out_rows, w->xq, b->num_logits, E, ith, nth);
    osp_threadpool_barrier(pool);
    mm(m, &m->output, w->out_rows, w->xq, ctx->logits, b->num_logits, ith, nth);
}

osp_status osp_model_forward(osp_model *m, osp_kv_cache *kv, const osp_batch *b, float *logits) {
    const osp_model_config *c = &m->cfg;
    int64_t max_ctx = 0;
    if (!kv || !b || (b->num_logits > 0 && !logits && !m->gpu)) /* on the GPU NULL keeps them there */
        return osp_set_error(OSP_ERR_INVALID_ARG, "forward: NULL argument");
    if (kv->n_layer != c->n_layer || kv->kv_row != (int64_t)c->n_head_kv * c->head_dim)
        return osp_set_error(OSP_ERR_INVALID_ARG, "forward: the KV cache was made for another model");
    if (kv->on_device != (m->gpu != NULL)) /* the CPU path would dereference device pages */
        return osp_set_error(OSP_ERR_INVALID_ARG, "forward: the KV cache is on the %s, the model on the %s",
                             kv->on_device ? "GPU" : "CPU", m->gpu ? "GPU" : "CPU");
    OSP_TRY(check_batch(m, kv, b, &max_ctx));
    if (m->gpu) return osp_llama_cuda_forward(m, kv, b, logits);
    OSP_TRY(ws_reserve(m, b->num_tokens, b->num_logits, max_ctx));
    fwd_ctx ctx = {m, kv, b, logits};
    osp_threadpool_run(m->pool, forward_task, &ctx);
    return OSP_OK;
}
