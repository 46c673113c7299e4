/* The architecture table and the helpers builders share (see arch.h). */
#include "model/arch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"
#include "model/loader.h"

static const osp_arch *const k_archs[] = {&osp_arch_llama, &osp_arch_gemma3};

const osp_arch *osp_arch_find(const char *name) {
    for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++)
        for (const char *const *a = k_archs[i]->gguf_archs; *a; a++)
            if (!strcmp(*a, name)) return k_archs[i];
    return NULL;
}

osp_status osp_arch_get_u32(const osp_gguf *g, const char *arch, const char *name, int32_t *out, bool required,
                            int32_t dflt) {
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

osp_status osp_arch_get_f32(const osp_gguf *g, const char *arch, const char *name, float *out, float dflt) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, name);
    osp_status s = osp_gguf_get_f32(g, key, out);
    if (s == OSP_ERR_NOT_FOUND) {
        *out = dflt;
        return OSP_OK;
    }
    return s;
}

osp_status osp_arch_check_blocks(const osp_gguf *g, const osp_model_config *c) {
    for (uint64_t i = 0; i < osp_gguf_n_tensors(g); i++) {
        const char *tn = osp_gguf_tensor_at(g, i)->name;
        char *end;
        if (strncmp(tn, "blk.", 4) != 0) continue;
        const long blk = strtol(tn + 4, &end, 10);
        if (end == tn + 4 || blk < 0 || blk >= c->n_layer)
            return osp_set_error(OSP_ERR_FORMAT, "%s: tensor '%s' is outside %s.block_count = %d", osp_gguf_path(g),
                                 tn, c->arch, c->n_layer);
    }
    return OSP_OK;
}

osp_status osp_arch_rope_inv_freq(const char *path, float theta, int32_t n_rot, float freq_scale, const float *ff,
                                  float *out) {
    /* (HF computes it in fp32 from an int64 arange; the difference is below one ulp of the angle) */
    for (int32_t i = 0; i < n_rot / 2; i++) {
        double f = 1.0 / pow((double)theta, (2.0 * i) / (double)n_rot);
        if (ff) {
            if (!(ff[i] > 0.0f))
                return osp_set_error(OSP_ERR_FORMAT, "%s: rope_freqs.weight[%d] = %g is not positive", path, i, ff[i]);
            f /= (double)ff[i];
        }
        if (freq_scale != 1.0f) f *= (double)freq_scale;
        out[i] = (float)f;
    }
    return OSP_OK;
}

/* <arch>.rope.scaling.type and .factor (older files: <arch>.rope.scale_linear), read as llama.cpp does:
 * a factor without a type is linear. yarn and longrope change more than the angles (attention
 * temperature, per-dimension ramps) and are refused rather than run wrong. */
osp_status osp_arch_read_rope_scaling(const osp_gguf *g, osp_model_config *c) {
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


osp_status osp_arch_read_decoder(const osp_gguf *g, osp_model_config *c, int32_t ctx_default, float eps_default) {
    const char *a = c->arch, *path = osp_gguf_path(g);
    OSP_TRY(osp_arch_get_u32(g, a, "embedding_length", &c->n_embd, true, 0));
    OSP_TRY(osp_arch_get_u32(g, a, "block_count", &c->n_layer, true, 0));
    OSP_TRY(osp_arch_get_u32(g, a, "attention.head_count", &c->n_head, true, 0));
    OSP_TRY(osp_arch_get_u32(g, a, "attention.head_count_kv", &c->n_head_kv, false, c->n_head));
    OSP_TRY(osp_arch_get_u32(g, a, "feed_forward_length", &c->n_ff, true, 0));
    OSP_TRY(osp_arch_get_u32(g, a, "context_length", &c->n_ctx_train, false, ctx_default));
    char key[128];
    snprintf(key, sizeof key, "%s.attention.key_length", a);
    if (c->n_embd % c->n_head != 0 && !osp_gguf_find(g, key))
        return osp_set_error(OSP_ERR_FORMAT, "%s: %s.embedding_length %d is not a multiple of head_count %d", path, a,
                             c->n_embd, c->n_head);
    OSP_TRY(osp_arch_get_u32(g, a, "attention.key_length", &c->head_dim, false, c->n_embd / c->n_head));
    OSP_TRY(osp_arch_get_u32(g, a, "rope.dimension_count", &c->n_rot, false, c->head_dim));
    OSP_TRY(osp_arch_get_f32(g, a, "rope.freq_base", &c->rope_theta, 10000.0f));
    OSP_TRY(osp_arch_get_f32(g, a, "attention.layer_norm_rms_epsilon", &c->rms_eps, eps_default));
    if (c->n_head % c->n_head_kv != 0)
        return osp_set_error(OSP_ERR_FORMAT, "%s: head_count %d is not a multiple of head_count_kv %d", path, c->n_head,
                             c->n_head_kv);
    if (c->n_rot > c->head_dim || c->n_rot % 2 != 0)
        return osp_set_error(OSP_ERR_FORMAT, "%s: rope.dimension_count %d must be even and <= head_dim %d", path,
                             c->n_rot, c->head_dim);
    if (!(c->rope_theta > 0.0f) || !(c->rms_eps > 0.0f) || !isfinite(c->rope_theta) || !isfinite(c->rms_eps))
        return osp_set_error(OSP_ERR_FORMAT, "%s: rope.freq_base and layer_norm_rms_epsilon must be finite and > 0",
                             path);
    OSP_TRY(osp_arch_check_blocks(g, c));
    c->tied_output = osp_gguf_find_tensor(g, "output.weight") == NULL;
    return OSP_OK;
}

osp_status osp_arch_bind_io(osp_loader *ld, const osp_model_config *c, osp_arch_io *io) {
    const int64_t E = c->n_embd, V = c->n_vocab;
    const char *emb = "token_embd.weight", *outw = "output.weight";
    if (c->tied_output) OSP_TRY(osp_loader_matrix(ld, &emb, &V, 1, E, false, &io->tok_embd)); /* also the output */
    else OSP_TRY(osp_loader_table(ld, emb, V, E, &io->tok_embd));
    if (c->tied_output) io->output = io->tok_embd;
    else OSP_TRY(osp_loader_matrix(ld, &outw, &V, 1, E, false, &io->output));
    return osp_loader_vector(ld, "output_norm.weight", E, true, false, &io->out_norm);
}

osp_status osp_arch_bind_proj(osp_loader *ld, const osp_model_config *c, int32_t l, osp_arch_proj *p) {
    const int64_t E = c->n_embd, QD = (int64_t)c->n_head * c->head_dim, KD = (int64_t)c->n_head_kv * c->head_dim,
                  F = c->n_ff;
    char n0[96], n1[96], n2[96];
    const char *names[3] = {n0, n1, n2};
    const int64_t qkv_rows[3] = {QD, KD, KD}, gu_rows[2] = {F, F};
    snprintf(n0, sizeof n0, "blk.%d.attn_q.weight", l);
    snprintf(n1, sizeof n1, "blk.%d.attn_k.weight", l);
    snprintf(n2, sizeof n2, "blk.%d.attn_v.weight", l);
    OSP_TRY(osp_loader_matrix(ld, names, qkv_rows, 3, E, false, &p->wqkv));
    snprintf(n0, sizeof n0, "blk.%d.attn_output.weight", l);
    OSP_TRY(osp_loader_matrix(ld, names, &E, 1, QD, false, &p->wo));
    snprintf(n0, sizeof n0, "blk.%d.ffn_gate.weight", l);
    snprintf(n1, sizeof n1, "blk.%d.ffn_up.weight", l);
    OSP_TRY(osp_loader_matrix(ld, names, gu_rows, 2, E, false, &p->wgu));
    snprintf(n0, sizeof n0, "blk.%d.ffn_down.weight", l);
    return osp_loader_matrix(ld, names, &E, 1, F, false, &p->wdown);
}

osp_status osp_arch_bind_vec(osp_loader *ld, const char *fmt, int32_t l, int64_t n, bool norm, const osp_tensor **out) {
    char name[96];
    snprintf(name, sizeof name, fmt, l);
    return osp_loader_vector(ld, name, n, norm, false, out);
}

osp_status osp_arch_rope_table(osp_loader *ld, float theta, int32_t n_rot, float freq_scale, const float *factors,
                               const osp_tensor **out) {
    float *t = malloc((size_t)(n_rot / 2 + 1) * sizeof *t);
    if (!t) return osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", ld->path);
    osp_status s = osp_arch_rope_inv_freq(ld->path, theta, n_rot, freq_scale, factors, t);
    if (s == OSP_OK) s = osp_loader_constant(ld, t, n_rot / 2, out);
    free(t);
    return s;
}

bool osp_build_wants_hidden(const osp_build_opts *o, int32_t l) {
    for (int32_t i = 0; o && i < o->n_hidden_layers; i++)
        if (o->hidden_layers[i] == l) return true;
    return false;
}
