/* The model presets and the Llama 3 rope-scaling factors (see presets.h). */
#include "model/presets.h"

#include <math.h>
#include <string.h>

/* Hyper-parameters as in the models' config.json (HF): hidden_size, num_hidden_layers,
 * num_attention_heads, num_key_value_heads, intermediate_size, vocab_size,
 * max_position_embeddings, rope_theta, rms_norm_eps, tie_word_embeddings. */
static const osp_model_preset k_presets[] = {
    {"smollm2-135m", "SmolLM2-135M shapes", 576, 30, 9, 3, 1536, 49152, 8192, 100000.0f, 1e-5f, true, "llama", 0,
     false, false, {0, 0, 0, 0}},
    {"llama-3.1-8b", "Llama-3.1-8B shapes, llama3 rope scaling", 4096, 32, 32, 8, 14336, 128256, 131072,
     500000.0f, 1e-5f, false, "llama", 0, false, false, {8.0f, 1.0f, 4.0f, 8192}},
    {"qwen3-8b", "Qwen3-8B shapes (q/k norm, head_dim 128)", 4096, 36, 32, 8, 12288, 151936, 40960, 1000000.0f,
     1e-6f, false, "qwen3", 128, false, true, {0, 0, 0, 0}},
    {"tiny", "2 layers, hidden 64, SmolLM2's vocabulary size, tied", 64, 2, 4, 2, 128, 49152, 2048, 100000.0f,
     1e-5f, true, "llama", 0, false, false, {0, 0, 0, 0}},
    {"tiny-d32", "2 layers, hidden 128, head_dim 32 (the smallest the CUDA attention takes), untied", 128, 2, 4, 2,
     256, 49152, 2048, 100000.0f, 1e-5f, false, "llama", 0, false, false, {0, 0, 0, 0}},
    {"tiny-untied", "as tiny, with an output.weight", 64, 2, 4, 2, 128, 49152, 2048, 100000.0f, 1e-5f, false,
     "llama", 0, false, false, {0, 0, 0, 0}},
    {"tiny-llama3", "as tiny-untied, llama3 rope scaling (original context 256)", 64, 2, 4, 2, 128, 49152, 2048,
     500000.0f, 1e-5f, false, "llama", 0, false, false, {8.0f, 1.0f, 4.0f, 256}},
    {"tiny-qwen2", "as tiny, qwen2 (q/k/v biases, NeoX rope)", 64, 2, 4, 2, 128, 49152, 2048, 1000000.0f, 1e-6f,
     true, "qwen2", 0, true, false, {0, 0, 0, 0}},
    {"tiny-qwen3", "as tiny-untied, qwen3 (q/k norm, head_dim 32)", 64, 2, 4, 2, 128, 49152, 2048, 1000000.0f,
     1e-6f, false, "qwen3", 32, false, true, {0, 0, 0, 0}},
    {"tiny-ffn96", "as tiny-untied, ffn 96 (three blocks of 32: a tensor-parallel split of unequal shares)", 64, 2, 4,
     2, 96, 49152, 2048, 100000.0f, 1e-5f, false, "llama", 0, false, false, {0, 0, 0, 0}},
};

size_t osp_model_preset_count(void) { return sizeof k_presets / sizeof k_presets[0]; }
const osp_model_preset *osp_model_preset_at(size_t i) { return i < osp_model_preset_count() ? &k_presets[i] : NULL; }

const osp_model_preset *osp_model_preset_find(const char *name) {
    for (size_t i = 0; name && i < osp_model_preset_count(); i++)
        if (!strcmp(k_presets[i].name, name)) return &k_presets[i];
    return NULL;
}

/* 1 for wavelengths below orig / high, factor above orig / low, and in between
 * 1 / ((1 - smooth) / factor + smooth), smooth = (orig / wavelength - low) / (high - low). */
void osp_rope_llama3_factors(const osp_rope_llama3 *r, float theta, int dim, float *out) {
    const double pi = 3.14159265358979323846;
    for (int i = 0; i < dim / 2; i++) {
        const float freq = (float)(1.0 / pow((double)theta, (double)(2 * i) / (double)dim));
        const double wavelen = 2.0 * pi / (double)freq, orig = (double)r->orig_ctx;
        if (wavelen < orig / r->high_freq_factor) out[i] = 1.0f;
        else if (wavelen > orig / r->low_freq_factor) out[i] = r->factor;
        else {
            const double smooth = (orig / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
            out[i] = (float)(1.0 / ((1.0 - smooth) / r->factor + smooth));
        }
    }
}
