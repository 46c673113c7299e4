/* Model presets (real architectures' shapes) and the seeded random weights that both
 * `osprey make-random-model` (writing a GGUF) and the CUDA loader (filling the GPU directly, no file)
 * draw, so the two give bit-identical models: weight i of tensor T (row-major index over the whole
 * tensor) is randn(name_key(seed, T), i, scale), a function of (seed, name, i) only.
 *
 * randn: the sum of four uniform 16-bit draws of splitmix64(key + (i + 1) * golden ratio), minus its
 * mean, times scale (Irwin-Hall, bounded at +-3.5 sigma): an exact integer times one float constant, so
 * the same bits on every machine and on the GPU. Matrices and embeddings: std 0.02; norm weights:
 * 1 + noise of std 0.01; qwen2 biases as matrices. */
#ifndef OSP_MODEL_PRESETS_H
#define OSP_MODEL_PRESETS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct osp_rope_llama3 { /* HF rope_scaling {"rope_type": "llama3", ...}; factor 0 = none */
    float factor, low_freq_factor, high_freq_factor;
    int orig_ctx;
} osp_rope_llama3;

typedef struct osp_model_preset {
    const char *name, *desc;
    int n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    float rope_theta, rms_eps;
    bool tied;        /* no output.weight: the output projection reuses token_embd.weight */
    const char *arch; /* general.architecture */
    int head_dim;     /* 0 = n_embd / n_head */
    bool qkv_bias, qk_norm;
    osp_rope_llama3 rope;
} osp_model_preset;

/* The preset called `name`, or NULL. */
const osp_model_preset *osp_model_preset_find(const char *name);
size_t osp_model_preset_count(void);
const osp_model_preset *osp_model_preset_at(size_t i);

#define OSP_RW_IRWIN_HALL_STD 37837.227 /* std of the sum of four uniform draws from {0..65535} */
#define OSP_RW_WEIGHT_STD 0.02
#define OSP_RW_NORM_NOISE_STD 0.01

static inline uint64_t osp_rw_mix64(uint64_t z) { /* splitmix64's finalizer */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The stream key of tensor `name`: FNV-1a of the name, mixed with the seed. */
static inline uint64_t osp_rw_name_key(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    return osp_rw_mix64(h ^ osp_rw_mix64(seed + 0x9e3779b97f4a7c15ull));
}

/* Value i of the stream `key`: mean 0, std `scale` * OSP_RW_IRWIN_HALL_STD. */
static inline float osp_rw_randn(uint64_t key, uint64_t i, float scale) {
    const uint64_t r = osp_rw_mix64(key + (i + 1) * 0x9e3779b97f4a7c15ull);
    const int32_t s = (int32_t)(r & 0xffff) + (int32_t)((r >> 16) & 0xffff) + (int32_t)((r >> 32) & 0xffff) +
                      (int32_t)(r >> 48) - 131070; /* 4 * 65535 / 2 */
    return (float)s * scale;
}

/* rope_freqs (Llama 3.x rope scaling), as llama.cpp's converter computes it: out[i] for i < dim / 2 is
 * the divisor of inverse frequency theta^(-2i / dim). */
void osp_rope_llama3_factors(const osp_rope_llama3 *r, float theta, int dim, float *out);

#endif
