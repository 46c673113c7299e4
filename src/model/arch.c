/* The architecture table and the helpers builders share (see arch.h). */
#include "model/arch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"

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

