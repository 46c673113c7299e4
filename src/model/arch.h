/* Architectures: each family is one file (arch_llama.c: llama, mistral, smollm, qwen2, qwen3;
 * arch_gemma3.c) that reads its hyper-parameters, binds its tensors through the loader, and builds
 * the op list (src/backend/op.h) of a step. Nothing here knows which backend runs the list.
 *
 * Adding a family: a new arch_<name>.c with an osp_arch, listed in model.c's table, and, only if it
 * needs new math, a new op kind in op.h (with its CPU reference and the other backends' kernels). */
#ifndef OSP_MODEL_ARCH_H
#define OSP_MODEL_ARCH_H

#include "backend/op.h"
#include "model/loader.h"
#include "osprey/gguf.h"
#include "osprey/model.h"

typedef struct osp_model_preset osp_model_preset;

typedef struct osp_arch {
    const char *name;                 /* "llama", "gemma3" */
    const char *const *gguf_archs;    /* general.architecture values it loads, NULL-terminated */
    /* Fills c (c->arch already set) from the file's metadata and tensor list. OSP_ERR_FORMAT /
     * OSP_ERR_UNSUPPORTED with a message naming file and key. */
    osp_status (*read_config)(const osp_gguf *g, osp_model_config *c);
    /* The config of a preset (random weights, no file). NULL: presets unsupported. */
    osp_status (*preset_config)(const osp_model_preset *p, osp_model_config *c);
    /* Binds the weights through `ld` into an arch-owned struct *weights (freed with free_weights). */
    osp_status (*bind)(osp_loader *ld, const osp_model_config *c, void **weights);
    void (*free_weights)(void *weights);
    /* Tensor parallelism (Megatron-LM's split, Shoeybi et al. 2019, §3): replaces the matrices `bind`
     * placed for the whole model c with rank `rank`'s views of them (column-parallel q/k/v and gate/up,
     * row-parallel o and down; osp_loader_view_rows / _cols) and writes the rank's config to *rc (its
     * n_head, n_head_kv and n_ff; n_head_kv 1 where the ranks outnumber the KV heads and each holds a copy
     * of its group's). OSP_ERR_UNSUPPORTED with the reason when the shapes do not split.
     * NULL: the family has no split. */
    osp_status (*shard)(osp_loader *ld, const osp_model_config *c, int32_t rank, int32_t world, void *weights,
                        osp_model_config *rc);
    /* Builds the op list of a step into g (initialized, empty): with the logits tail when
     * with_logits (num_logits > 0), else without; plus the outputs opts asks for. */
    osp_status (*build)(const osp_model_config *c, const void *weights, bool with_logits, const osp_build_opts *opts,
                        osp_graph *g);
} osp_arch;

extern const osp_arch osp_arch_llama;
extern const osp_arch osp_arch_gemma3;

/* The family that loads general.architecture `name`, or NULL. */
const osp_arch *osp_arch_find(const char *name);

/* Shared hparam helpers for builders: `<arch>.<name>` as u32 (required or default) / f32. */
osp_status osp_arch_get_u32(const osp_gguf *g, const char *arch, const char *name, int32_t *out, bool required,
                            int32_t dflt);
osp_status osp_arch_get_f32(const osp_gguf *g, const char *arch, const char *name, float *out, float dflt);
/* <arch>.rope.scaling.{type,factor} into c->rope_freq_scale: none or linear; others refused. */
osp_status osp_arch_read_rope_scaling(const osp_gguf *g, osp_model_config *c);
/* The hparams every decoder here shares, `<arch>.*`: embedding_length, block_count,
 * attention.head_count(_kv), feed_forward_length, context_length (default ctx_default),
 * attention.key_length (default n_embd / n_head), rope.dimension_count (default head_dim),
 * rope.freq_base (10000), attention.layer_norm_rms_epsilon (eps_default); checked (GQA ratio, rope
 * dims, finite values, blk.N within block_count); tied_output from the tensor list. */
osp_status osp_arch_read_decoder(const osp_gguf *g, osp_model_config *c, int32_t ctx_default, float eps_default);

/* The tensors around the layers: token_embd, output (token_embd when tied), output_norm. */
typedef struct osp_arch_io {
    const osp_tensor *tok_embd, *output, *out_norm;
} osp_arch_io;
osp_status osp_arch_bind_io(osp_loader *ld, const osp_model_config *c, osp_arch_io *io);

/* Layer l's projections: q|k|v stacked into one matrix, o, gate|up stacked, down. */
typedef struct osp_arch_proj {
    const osp_tensor *wqkv; /* [E] -> [QD + 2 KD] */
    const osp_tensor *wo;   /* [QD] -> [E] */
    const osp_tensor *wgu;  /* [E] -> [2F] */
    const osp_tensor *wdown; /* [F] -> [E] */
} osp_arch_proj;
osp_status osp_arch_bind_proj(osp_loader *ld, const osp_model_config *c, int32_t l, osp_arch_proj *p);

/* The fp32 vector of n values named printf(fmt, l) (norm: random values are 1 + noise). */
osp_status osp_arch_bind_vec(osp_loader *ld, const char *fmt, int32_t l, int64_t n, bool norm, const osp_tensor **out);

/* The RoPE table of osp_arch_rope_inv_freq placed as a constant [n_rot / 2]. */
osp_status osp_arch_rope_table(osp_loader *ld, float theta, int32_t n_rot, float freq_scale, const float *factors,
                               const osp_tensor **out);

/* Op-list construction in builders: ACT declares an activation, PUSH(kind, dst, src0, src1, other
 * fields...) appends an op (activation ids, -1 for none); both return from the builder on error. */
#define OSP_ACT(name, type, cols, rows, id) OSP_TRY(osp_graph_act(g, name, type, cols, rows, id))
#define OSP_PUSH(k, d, s0, s1, ...)                                                                \
    do {                                                                                           \
        osp_op op_ = {.kind = (k), .dst = (d), .src0 = (s0), .src1 = (s1), __VA_ARGS__};           \
        OSP_TRY(osp_graph_push(g, &op_));                                                          \
    } while (0)
/* Whether opts asks for the hidden state after layer l. */
bool osp_build_wants_hidden(const osp_build_opts *opts, int32_t l);

/* Every blk.N tensor has N < n_layer (a smaller block_count would silently run a truncated model). */
osp_status osp_arch_check_blocks(const osp_gguf *g, const osp_model_config *c);
/* RoPE inverse frequencies inv_freq[i] = theta^(-2i / n_rot) * freq_scale / factor[i] (factors may be
 * NULL), computed in double and rounded once. out: [n_rot / 2]. */
osp_status osp_arch_rope_inv_freq(const char *path, float theta, int32_t n_rot, float freq_scale, const float *factors,
                                  float *out);

#endif
