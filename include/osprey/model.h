/* Models: load a GGUF file's weights (mapped, never copied) and run the forward pass over the
 * flattened variable-length batch of shared/DESIGN.md §1.
 *
 * The batch holds all scheduled tokens of all sequences in one array. Sequence s owns tokens
 * [query_start_loc[s], query_start_loc[s+1]); their keys and values are written to the paged KV cache
 * at slot_mapping[i] (slot = block * block_size + offset), and attention for sequence s reads its
 * first seq_lens[s] positions through block_table row s. Logits are computed only for the rows in
 * logits_indices. */
#ifndef OSPREY_MODEL_H
#define OSPREY_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "osprey/batch.h"
#include "osprey/kv_cache.h"
#include "osprey/gguf.h"
#include "osprey/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct osp_model osp_model;
typedef struct osp_comm osp_comm; /* tensor-parallel ranks' communicator (osp_comm_local_create) */

/* How RoPE pairs the dimensions of a head (ggml's rope types). */
typedef enum osp_rope_type {
    OSP_ROPE_NORM = 0, /* interleaved pairs (x[2i], x[2i+1]): llama (GGUF Q/K rows are permuted for it) */
    OSP_ROPE_NEOX = 2, /* pairs (x[i], x[i + n_rot/2]), HF's rotate_half: qwen2, qwen3 */
} osp_rope_type;

/* Hyper-parameters, all read from GGUF metadata (`<arch>.*` keys) and the presence of tensors.
 * Architectures: llama (Llama 1/2/3.x, Mistral, SmolLM), qwen2 (q/k/v biases), qwen3 (per-head
 * q/k RMSNorm), gemma3 (sliding-window and global layers, GELU MLP, pre- and post-norms). */
typedef struct osp_model_config {
    char arch[32];        /* general.architecture: "llama", "qwen2", "qwen3" or "gemma3" */
    int32_t n_vocab;      /* rows of token_embd */
    int32_t n_embd;       /* <arch>.embedding_length: hidden_size */
    int32_t n_layer;      /* <arch>.block_count */
    int32_t n_head;       /* <arch>.attention.head_count */
    int32_t n_head_kv;    /* <arch>.attention.head_count_kv (defaults to n_head) */
    int32_t head_dim;     /* <arch>.attention.key_length, else n_embd / n_head */
    int32_t n_ff;         /* <arch>.feed_forward_length: intermediate_size */
    int32_t n_rot;        /* <arch>.rope.dimension_count, else head_dim */
    int32_t n_ctx_train;  /* <arch>.context_length */
    float rope_theta;     /* <arch>.rope.freq_base, default 10000 */
    float rms_eps;        /* <arch>.attention.layer_norm_rms_epsilon */
    bool tied_output;     /* no output.weight: the lm_head is token_embd */
    osp_rope_type rope_type; /* by architecture: NORM for llama, NEOX for qwen2 / qwen3 / gemma3 */
    float rope_freq_scale; /* 1 / <arch>.rope.scaling.factor for rope.scaling.type linear, else 1:
                            * every angle is multiplied by it (position interpolation) */
    bool rope_freq_factors; /* rope_freqs.weight [n_rot / 2] present (Llama 3.x rope scaling):
                             * inverse frequency i is divided by its factor */
    bool qkv_bias;        /* blk.N.attn_{q,k,v}.bias present (qwen2) */
    bool qk_norm;         /* blk.N.attn_{q,k}_norm.weight [head_dim]: RMSNorm of each head of q and k
                           * before RoPE (qwen3, gemma3) */
    float attn_scale;     /* softmax scale of q.k: 1 / sqrt(head_dim) (Gemma 3 27B: 1 / sqrt(n_embd / n_head)) */
    float embed_scale;    /* token embeddings are multiplied by it: 1, sqrt(n_embd) for gemma3 */
    int32_t sliding_window; /* gemma3.attention.sliding_window: keys a sliding layer sees (the query's own
                             * included); 0: every layer attends to the whole context */
    int32_t swa_pattern;  /* with sliding_window: layer l slides unless l % swa_pattern == swa_pattern - 1 */
    float rope_theta_swa; /* RoPE base of the sliding layers (gemma3.rope.freq_base_swa, default 10000;
                           * never scaled) */
} osp_model_config;


/* "cpu" / "cuda" / "auto" (cuda when a CUDA device is present, else cpu). OSP_ERR_INVALID_ARG otherwise. */
osp_status osp_device_parse(const char *name, osp_device *out);
const char *osp_device_name(osp_device d); /* "cpu" / "cuda" */
/* Devices of that kind this osprey can use now: 1 for the CPU; CUDA GPUs present (0 when built
 * without CUDA). */
int osp_device_count(osp_device d);

/* How the CPU backend quantizes the activations of a matmul with block-quantized weights
 * (osp_model_params.cpu_activations; bench/cpu/NOTES.md has the measured accuracy and speed). */
typedef enum osp_cpu_activations {
    OSP_CPU_ACT_TWO_LEVEL = 0, /* the default: int8 in blocks of 32 with a second level for the residual
                                  (relative error ~1e-5 a value) for every quantized weight type */
    OSP_CPU_ACT_Q8 = 1,        /* one int8 level (~2e-3 a value; llama.cpp's accuracy): one scale per
                                  256 values for K-quant weights (Q2_K..Q6_K; llama.cpp's Q8_K), per 32
                                  for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (its Q8_0/Q8_1 with fp32 scales);
                                  faster prompts, results that differ from the default's (still
                                  batch-invariant); F16/BF16/F32 weights are unaffected */
} osp_cpu_activations;
/* "two-level" -> OSP_CPU_ACT_TWO_LEVEL, "q8" -> OSP_CPU_ACT_Q8; OSP_ERR_INVALID_ARG (with a message
 * naming the accepted values) for anything else, *out untouched. */
osp_status osp_cpu_activations_parse(const char *name, osp_cpu_activations *out);
/* "two-level" / "q8" (NULL for a value outside the enum). */
const char *osp_cpu_activations_name(osp_cpu_activations a);

typedef struct osp_model_params {
    osp_device device; /* default OSP_DEVICE_CPU */
    /* Called during loading with the fraction done (0..1] of the weights placed on the device; NULL:
     * silent. On the library's thread; must not call back into the model. */
    void (*progress)(void *ctx, float fraction);
    void *progress_ctx;
    int n_threads; /* 0 = all available cores */
    bool emulate_bf16; /* implies exact, on the CPU: round weights and activations to bf16 where the CUDA
                        * backend stores them in bf16 (a reference that isolates its kernels from its
                        * precision; tests only, slow) */
    /* Hidden states to return (speculative decoding's EAGLE-style drafters read them): the residual
     * stream after each listed layer (0-based; n_layer - 1 is the final stream before the output
     * norm), fp32 [num_tokens, n_embd], through osp_model_forward_hidden (src/model/model_exec.h). At
     * most 8, in increasing order; OSP_ERR_INVALID_ARG from loading otherwise. */
    int32_t n_hidden_layers;
    int32_t hidden_layers[8];
    bool exact;    /* true: fp32 activations in every matmul (the reference path the golden tests use);
                    * false (default): int8-quantized activations for block-quantized weights (faster;
                    * per-row quantization keeps results batch-invariant). CPU only: the GPU
                    * ignores it (bf16 operands, fp32 accumulation) */
    osp_cpu_activations cpu_activations; /* CPU, without exact: OSP_CPU_ACT_TWO_LEVEL (default) or
                                          * OSP_CPU_ACT_Q8 (see the enum). The GPU ignores it */
    bool gpu_quant_weights; /* CUDA: keep Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K matrices in their GGUF blocks on
                             * the device (src/backend/cuda/qmatmul.cu: 3.3x less memory for Q4_K_M, faster
                             * batch-1 decode) instead of dequantizing every matrix to bf16 at load (the
                             * default). Steps of <= 8 rows then use one kernel and larger ones another,
                             * so a row's bits depend on the step's size: the engine takes it only with
                             * max_num_seqs 1 (osp_engine_create). The CPU ignores it. */
    bool draft_4bit_weights; /* QuantSpec's self-draft (speculative method "quantspec"): every matrix stored at
                              * more than 5 bits a weight (F16, BF16, F32, Q8_0, Q5_*, Q6_K) is computed from
                              * a Q4_0 copy made at load (src/model/loader.c), whose rows are whole blocks of
                              * 32; 4- and 4.5-bit matrices (Q4_0, Q4_1, Q4_K, ...) stay as stored. On the
                              * GPU only with gpu_quant_weights (OSP_ERR_UNSUPPORTED otherwise: the copies
                              * would be widened to bf16); types its quantized kernels lack (Q2_K, Q3_K, IQ*)
                              * are then bf16 as usual. */
    bool no_mmap; /* CPU: copy every matrix that a step reads whole out of the GGUF mapping into anonymous
                   * memory on 2 MB pages (madvise MADV_HUGEPAGE where the kernel has transparent huge
                   * pages), as llama.cpp's --no-mmap copies it, dropping the copied file pages from the
                   * process, the mapping faulted in with small pages only (osp_gguf_advise_copy_out), so
                   * peak RSS stays about the same (433 against 431 MB on Qwen2.5-0.5B: bench/cpu/NOTES.md,
                   * twelfth pass; the page cache may keep the file). Fewer TLB
                   * misses for decode, which streams every matrix once a token: about +7% tg on an AMD
                   * EPYC (bench/cpu/NOTES.md, twelfth pass); load takes a copy longer, and the weights can
                   * no longer be dropped by the kernel under memory pressure. Untied embedding tables
                   * stay mapped (a step reads a few rows). Results are unchanged. The GPU ignores it. */
    /* Tensor parallelism (vLLM's --tensor-parallel-size; Megatron-LM's split, Shoeybi et al. 2019, §3):
     * load this model as rank tensor_parallel_rank of tensor_parallel_size (0 or 1: off), its weights
     * views of the file's: q, k, v (and their biases) and gate / up by heads and columns, o and down by
     * their input columns, followed by an all-reduce over `comm` (one communicator shared by the ranks,
     * osp_comm_local_create); embeddings, norms and the lm_head are whole on every rank, so every rank
     * computes the same logits. The model's config (osp_model_config_get) is then the rank's: n_head,
     * n_head_kv and n_ff are its share, and its KV caches hold its KV heads only. Each rank's forward
     * runs on its own thread, all ranks on the same batch (the collectives must be called in the same
     * order; each rank of a communicator loaded once). Needs n_head, n_head_kv and n_ff divisible by the
     * size and the split columns whole blocks of the weight types; llama / qwen2 / qwen3 on the CPU backend
     * only (not with no_mmap, whose copies are made whole, nor QuantSpec draft weights): OSP_ERR_UNSUPPORTED
     * otherwise, with the reason. Without a communicator (tensor_parallel_rank 0) the loaded model drives
     * all the ranks itself: it loads the others, runs each on a thread of its own (n_threads split among
     * them), and its KV caches hold every rank's; its callers see one model. */
    int32_t tensor_parallel_size;
    int32_t tensor_parallel_rank;
    osp_comm *comm;
} osp_model_params;

osp_model_params osp_model_default_params(void);

/* A communicator for `world` tensor-parallel ranks that run as threads of this process (the CPU
 * backend): each rank's model gets the same one (osp_model_params.comm). Collectives sum in rank order,
 * so every rank gets the same bits. osp_comm_abort wakes every rank waiting in a collective with an
 * error (a rank whose forward failed calls it, so the others never hang); the communicator stays
 * aborted. A watchdog bounds every wait: a rank that waits more than the timeout for the others at one
 * collective (default 600 s, torch.distributed's; $OSPREY_COMM_TIMEOUT_S seconds at creation, a
 * malformed value keeping the default, or osp_comm_set_timeout; 0 or more than 1e9: none) aborts the
 * communicator, and every rank's collective returns OSP_ERR_INTERNAL saying the watchdog fired (the
 * clock runs on while a debugger holds the process). Free it after the models that use it. Errors:
 * osp_comm_local_create OSP_ERR_INVALID_ARG (world outside 1..64), OSP_ERR_NOMEM; osp_comm_set_timeout
 * OSP_ERR_INVALID_ARG (NULL, a negative or non-finite timeout). */
osp_status osp_comm_local_create(int32_t world, osp_comm **out);
osp_status osp_comm_set_timeout(osp_comm *c, double seconds);
void osp_comm_abort(osp_comm *c);
void osp_comm_free(osp_comm *c); /* NULL is fine */

/* Loads `path`. The model keeps the GGUF mapping open; on the CPU weights are views into it; on the
 * GPU (params->device OSP_DEVICE_CUDA) every matrix is dequantized to fp32 and stored as bf16 there
 * (q/k/v and gate/up fused into one matrix each), norms, biases and RoPE frequencies as fp32.
 * OSP_ERR_UNSUPPORTED also when CUDA is asked for but not built or no device is present, or when the
 * model's shapes are outside what the CUDA kernels support (head_dim, GQA); OSP_ERR_NOMEM when the GPU
 * lacks memory (the message gives the sizes).
 * Errors: everything osp_gguf_open() returns; OSP_ERR_UNSUPPORTED for an architecture other than
 * llama, qwen2, qwen3, gemma3, a rope scaling other than none / linear / llama3 factors (yarn, longrope), or a
 * tensor type that cannot be computed with (message names file, tensor and type);
 * OSP_ERR_FORMAT for missing tensors, tensors of the wrong shape, or missing hyper-parameters. */
osp_status osp_model_load(const char *path, const osp_model_params *params, osp_model **out);
void osp_model_free(osp_model *m); /* NULL is fine */

/* The config osp_model_load would give `path` (n_vocab from token_embd, the family's hyper-parameters),
 * read from the file's metadata without loading a weight, and, when device_bytes is not NULL, the bytes
 * the GPU's default load takes for the weights: every matrix as bf16, every vector as fp32 (an upper
 * bound: the loader's fused copies hold the same elements). For budgeting what loads later (a draft
 * model beside the target's KV cache). Errors (*cfg zeroed then): OSP_ERR_INVALID_ARG (NULL path or cfg),
 * those of osp_gguf_open, OSP_ERR_UNSUPPORTED (an architecture osprey does not load), OSP_ERR_FORMAT (no
 * token_embd, a bad vocabulary size, missing hyper-parameters), the family config reader's. */
osp_status osp_model_probe(const char *path, osp_model_config *cfg, int64_t *device_bytes);

/* A model of a preset's shapes (osprey make-random-model --list-presets: smollm2-135m, llama-3.1-8b,
 * qwen3-8b, tiny...) with seeded random weights drawn directly on the GPU (params->device must be
 * OSP_DEVICE_CUDA): no file, for speed measurements of big shapes. The weights are bit-identical to
 * those of `osprey make-random-model --preset P --dtype bf16 --seed S`. The model has no GGUF
 * (osp_model_gguf returns NULL: no tokenizer). Errors: OSP_ERR_INVALID_ARG for an unknown preset,
 * OSP_ERR_UNSUPPORTED on the CPU or without CUDA, and those of loading on the GPU. */
osp_status osp_model_load_random(const char *preset, uint64_t seed, const osp_model_params *params, osp_model **out);

const osp_model_config *osp_model_config_get(const osp_model *m);
osp_device osp_model_device(const osp_model *m); /* where m's forward pass and its KV caches are */
/* Bytes of device memory the weights take (0 on the CPU). */
size_t osp_model_device_weight_bytes(const osp_model *m);
const osp_gguf *osp_model_gguf(const osp_model *m); /* owned by the model */

/* The model's worker threads (the forward pass's thread pool), lent to other per-step work such as
 * sampling so the step uses one set of threads: fn(ctx, ith, nth) runs on all nth threads and the
 * call returns when all have. Not while a forward pass runs; not reentrant. */
int osp_model_n_threads(const osp_model *m);
void osp_model_run_parallel(osp_model *m, void (*fn)(void *ctx, int ith, int nth), void *ctx);


/* Bytes of K (pages of k_dtype) and V (pages of v_dtype; equal unless split) for one token over all
 * layers, scales included: n_layer * (K data + K scale + V data + V scale bytes of one token's row),
 * data = n_head_kv * head_dim * elem bytes (fp8: 1, nvfp4: 1/2), scales = n_head_kv * head_dim / 16 E4M3
 * bytes for an nvfp4 side, 0 otherwise. 0 for a dtype the shape cannot take. The per-layer 256-byte
 * alignment of each pool is not in it: osp_kv_cache_bytes_for. */
int64_t osp_kv_cache_bytes_per_token(const osp_model_config *c, osp_kv_dtype k_dtype, osp_kv_dtype v_dtype);
/* The exact bytes osp_kv_cache_create allocates for num_blocks blocks of block_size tokens (pages and
 * scale pools, each padded to 256 bytes per layer); the fixed fp32 scales (fp8: n_layer * n_head_kv * 2,
 * nvfp4: n_layer * 2 floats) live on the host and are not counted. 0 on bad sizes or dtype. */
int64_t osp_kv_cache_bytes_for(const osp_model_config *c, osp_kv_dtype k_dtype, osp_kv_dtype v_dtype, int32_t num_blocks,
                               int32_t block_size);

/* A paged KV cache for one model: per layer K and V pages [num_blocks, block_size, n_head_kv,
 * head_dim] of `dtype`, in host memory, or in one device allocation when `m` runs on the GPU (such a
 * cache is for `m` only; a host cache serves any model of the same shape). The cache may be freed
 * before or after the model. fp8 / nvfp4 caches take the default fixed scales (src/kv/kv_cache.h).
 * Errors: OSP_ERR_INVALID_ARG (non-positive sizes, unknown dtype, sizes beyond memory),
 * OSP_ERR_UNSUPPORTED (a dtype the model's backend has no pages for, e.g. fp8 on CUDA, or bf16),
 * OSP_ERR_NOMEM (host or device memory). */
osp_status osp_kv_cache_create(const osp_model *m, int32_t num_blocks, int32_t block_size, osp_kv_dtype dtype,
                               osp_kv_cache **out);
/* As osp_kv_cache_create, with K pages of k_dtype and V pages of v_dtype (equal: as osp_kv_cache_create;
 * different: a split cache, e.g. K fp8 + V nvfp4, llama.cpp's --cache-type-k / --cache-type-v; the CPU
 * backend has every pair, CUDA none: OSP_ERR_UNSUPPORTED), and a quantized side's fixed fp32 scales
 * given (what a scales file holds): k_fixed [n_layer, per_layer of K's dtype], v_fixed [n_layer,
 * per_layer of V's dtype], per_layer = n_head_kv for fp8 (one scale per layer and KV head), 1 for nvfp4
 * (the tensor scale of the layer's K or V); copied; NULL takes the default (src/kv/kv_cache.h). Ignored
 * for an f16 / f32 side. OSP_ERR_INVALID_ARG for a scale that is not finite and > 0. */
osp_status osp_kv_cache_create_with_scales(const osp_model *m, int32_t num_blocks, int32_t block_size,
                                           osp_kv_dtype k_dtype, osp_kv_dtype v_dtype, const float *k_fixed,
                                           const float *v_fixed, osp_kv_cache **out);
/* Whether m can have a KV cache of K pages of k_dtype and V pages of v_dtype (both page formats fit its
 * shape, its backend has the pair), without allocating anything: the errors osp_kv_cache_create_with_scales
 * would give (OSP_ERR_INVALID_ARG, OSP_ERR_UNSUPPORTED with the reason). */
osp_status osp_kv_cache_check(const osp_model *m, osp_kv_dtype k_dtype, osp_kv_dtype v_dtype);
/* (the cache's other functions: osprey/kv_cache.h) */


/* Runs the model on `batch`, writing K/V into `kv` and logits [num_logits, n_vocab] (fp32,
 * caller-owned) into `logits`; on the GPU `logits` may be NULL: they then stay on the device (for the
 * device sampler), and the call returns without waiting for this step to finish. Errors:
 * OSP_ERR_INVALID_ARG for an inconsistent batch (token id out of the vocabulary, slot or block id out
 * of the cache, positions beyond seq_lens, ...) or a cache made for another model or device; the
 * cache is not modified then. On the GPU also OSP_ERR_NOMEM / OSP_ERR_INTERNAL from CUDA. Not
 * thread-safe per model: one forward at a time. */
osp_status osp_model_forward(osp_model *m, osp_kv_cache *kv, const osp_batch *batch, float *logits);

#ifdef __cplusplus
}
#endif
#endif
