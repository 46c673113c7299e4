/* The engine: many requests share one model and one paged KV cache in one step loop (vLLM V1's
 * EngineCore). Each step the scheduler spends a token budget on running requests first (decodes and
 * unfinished prefill chunks) and then on waiting ones (first come first served, or by priority),
 * chunking prompts to what is left; the model runner applies the step's diff to its persistent batch,
 * runs one forward pass over the flattened batch and samples one token for every request whose
 * scheduled tokens reach its end; the scheduler appends them and checks stops. Full KV blocks are
 * hashed (chained) so a later request with the same prefix reuses them (automatic prefix caching).
 *
 * Two ways to drive it: call osp_engine_step() yourself (single thread; add/abort/poll from that same
 * thread), or osp_engine_start() a loop thread and add/abort/poll from any thread. Outputs go to a
 * per-request queue that the caller drains with osp_engine_poll(), and optionally to a callback. */
#ifndef OSPREY_ENGINE_H
#define OSPREY_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "osprey/kv_events.h"
#include "osprey/model.h"
#include "osprey/sparse.h"
#include "osprey/spec.h"
#include "osprey/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct osp_engine osp_engine;

typedef enum osp_prefix_hash_algo {
    OSP_PREFIX_HASH_XXH3_128 = 0, /* libxxhash XXH3_128bits_withSeed (default) */
    OSP_PREFIX_HASH_SHA256 = 1,   /* sha256 truncated to 128 bits (FIPS 180-4), osprey's own message */
    OSP_PREFIX_HASH_SHA256_CBOR = 2, /* vLLM's sha256_cbor: sha256 of the canonical CBOR of (parent hash,
                                        token ids, extra keys), 256 bits, the first parent derived from
                                        the seed: equal to vLLM's block hashes under the same seed
                                        (src/kv/prefix_cache.h) */
} osp_prefix_hash_algo;

/* A server's part in prefill/decode disaggregation (vLLM's kv_role) */
typedef enum osp_kv_role {
    OSP_KV_ROLE_NONE = 0,
    OSP_KV_ROLE_PRODUCER = 1, /* kv_producer: computes prompts and serves their KV blocks */
    OSP_KV_ROLE_CONSUMER = 2, /* kv_consumer: loads prompt KV blocks from producers */
    OSP_KV_ROLE_BOTH = 3,     /* kv_both */
} osp_kv_role;

typedef enum osp_sched_policy {
    OSP_SCHED_FCFS = 0,     /* arrival order */
    OSP_SCHED_PRIORITY = 1, /* lower `priority` first, then arrival order */
} osp_sched_policy;

typedef struct osp_engine_params {
    const char *model_path;         /* GGUF file */
    const char *random_weights;     /* instead of model_path: a preset's shapes with random weights drawn on
                                       the GPU (osp_model_load_random; device must be OSP_DEVICE_CUDA) */
    uint64_t random_seed;           /* with random_weights */
    int n_threads;                  /* 0 = all cores */
    int32_t block_size;             /* tokens per KV block (16) */
    int64_t kv_cache_memory;        /* KV bytes over all layers (K and V); 0 = enough for max_num_seqs
                                       sequences of max_model_len, on the GPU at most what
                                       gpu_memory_utilization leaves */
    float gpu_memory_utilization;   /* share of the GPU's memory osprey may use in all (weights, KV cache,
                                       a 3 GiB reserve for activations); 0 = 0.9 (vLLM's default); only
                                       when kv_cache_memory is 0 */
    int32_t num_blocks;             /* > 0 overrides kv_cache_memory (tests). The blocks requests get: with
                                       the speculative method quantspec the cache holds
                                       osp_quantspec_staging_blocks more (src/spec/proposer.h: 16 while
                                       k <= block_size; within kv_cache_memory when
                                       the count comes from it, on top of num_blocks when given) */
    osp_kv_dtype kv_dtype;          /* OSP_KV_DTYPE_F16 (default), F32, FP8, NVFP4 or INT8_HIER (CPU and CUDA): the K
                                       pages' dtype, and the V pages' unless kv_dtype_v_set */
    osp_kv_dtype kv_dtype_v;        /* with kv_dtype_v_set: the V pages' dtype (a split cache, e.g. K fp8 +
                                       V nvfp4; llama.cpp's --cache-type-v); CPU only, CUDA refuses a split */
    bool kv_dtype_v_set;            /* false (default): V pages of kv_dtype */
    bool exact;                     /* fp32 activations in every matmul (osp_model_params.exact) */
    osp_cpu_activations cpu_activations; /* osp_model_params.cpu_activations (default two levels) */
    bool no_mmap;                        /* osp_model_params.no_mmap (default off: the weights stay mapped) */
    int32_t tensor_parallel_size;   /* vLLM's --tensor-parallel-size: 0 or 1 off; N > 1 loads the model as N ranks
                                       that one engine drives (osp_model_params.tensor_parallel_size: the CPU
                                       backend only so far, its threads shared among the ranks). Not with KV
                                       offload, P/D transfer, QuantSpec, sparse attention or a KV scales file
                                       (OSP_ERR_UNSUPPORTED) */
    osp_device device;              /* OSP_DEVICE_CPU (default) or OSP_DEVICE_CUDA (osp_model_params.device) */
    bool gpu_quant_weights;         /* osp_model_params.gpu_quant_weights; needs max_num_seqs 1 */
    void (*load_progress)(void *ctx, float fraction); /* osp_model_params.progress; NULL: silent */
    void *load_progress_ctx;
    int32_t max_num_seqs;           /* running requests per step (256) */
    int32_t max_num_batched_tokens; /* token budget per step (2048) */
    int32_t max_model_len;          /* prompt + output tokens; 0 = the model's context length */
    bool enable_prefix_caching;     /* true */
    osp_prefix_hash_algo hash_algo; /* xxh3-128 */
    bool hash_seed_set;             /* false: a random per-process seed */
    uint64_t hash_seed;             /* shared by every replica so their block hashes agree (the CLI's
                                       --prefix-caching-hash-seed, $OSPREY_HASH_SEED, $PYTHONHASHSEED) */
    const osp_kv_event_sink *kv_event_sink; /* KV cache events (osprey/kv_events.h): every block the prefix
                                       cache stores or forgets, reported on the step thread, end_step
                                       after each step; NULL: none. Must outlive the engine */
    osp_sched_policy policy;        /* FCFS */
    bool check_invariants;          /* check the block pool and scheduler after every step (tests) */
    const char *trace_shapes_path;  /* non-NULL: append one JSON line per step with the step's shape
                                       (num_tokens, num_seqs, num_logits, each sequence's query length
                                       and seq_len) to this file: workloads for bench/kernels from real
                                       serving runs. Opening it fails osp_engine_create. */
    const char *trace_path;         /* non-NULL: write the step timeline here (--trace FILE; Chrome trace-event
                                       JSON: each step's host phases and, on the GPU, its device spans;
                                       src/engine/timeline.h) and log the GPU's idle share between decode
                                       steps when the engine is freed. Opening it fails osp_engine_create */
    const char *kernel_table;       /* a kernel selection table (`osprey bench-kernels --make-table`), or
                                       NULL: $OSPREY_KERNEL_TABLE, if set. Applied before the first step
                                       (src/backend/kernel_table.h): a table for another device, arch or
                                       driver major is ignored, a row that does not apply to the model
                                       falls back to the default, each choice is logged; a malformed
                                       table fails osp_engine_create */
    void (*log)(void *ctx, const char *line); /* start-up lines (the kernel choices); NULL: stderr */
    void *log_ctx;
    osp_spec_config speculative;    /* speculative decoding (osprey/spec.h; vLLM's speculative_config): each
                                       step every decoding request proposes up to num_speculative_tokens
                                       drafts, verified in the same forward pass as the rest of the batch;
                                       outputs are the target's own. method OSP_SPEC_NONE (default): off.
                                       ngram and draft_model run on the CPU and the GPU; quantspec on the
                                       CPU only (OSP_ERR_UNSUPPORTED where the model samples on the GPU).
                                       k adapts per request (fewer drafts while they are
                                       rejected, none for a pause when few are kept) unless
                                       speculative_fixed_k */
    bool speculative_fixed_k;       /* every decoding request is offered num_speculative_tokens drafts each
                                       step (tests and measurements; default false: adaptive k) */
    bool speculative_no_switch;     /* adaptive k per request without the engine-wide switch that times
                                       steps with and without drafts (src/spec/switch.h): for tests whose
                                       outcome must not depend on timing (default false: the switch on) */
    osp_sparse_config sparse_attention; /* --sparse-attention (osprey/sparse.h): Quest top-k pages per query
                                       token and KV head; method OSP_SPARSE_NONE (default): dense. On the
                                       GPU: f16 KV pages, head_dim 64 / 128, groups <= 16 heads, else
                                       OSP_ERR_UNSUPPORTED at creation */
    const char *kv_scales_path;     /* a KV scales file (`osprey calibrate-kv -o`, src/format/kv_scales.h) whose
                                       fixed scales an fp8 or nvfp4 cache takes at creation; NULL: the
                                       documented defaults (src/kv/kv_cache.h). Read before the model loads;
                                       a file that does not parse, or was made for another layer / KV head /
                                       head_dim count, fails osp_engine_create. Ignored by f16 / f32 caches
                                       (still checked) */
    /* tiered KV offload (src/kv/offload.h): prefix blocks the pool evicts move to host memory, then to
       local disk, instead of vanishing, and come back for a later request with that prefix when loading
       beats recomputing (measured). Needs enable_prefix_caching; not with sparse attention. Off unless a
       size is given */
    int64_t kv_offload_host_bytes;  /* host-memory tier (vLLM's --kv-offloading-size); 0: none */
    const char *kv_offload_disk_dir; /* disk tier directory; NULL: none */
    int64_t kv_offload_disk_bytes;  /* disk tier capacity, > 0 with kv_offload_disk_dir */
    bool kv_offload_no_cost_model;  /* load every block a tier holds, whatever the measured costs (tests:
                                       outcomes that must not depend on timing); default false */
    /* prefill/decode disaggregation (src/kv/transfer.h; vLLM's --kv-transfer-config): a producer computes
       prompts for requests marked do_remote_decode and keeps copies of their full KV blocks in host memory
       for a consumer to pull over TCP; a consumer loads a do_remote_prefill request's blocks from the
       producer named in it before computing the rest of its prompt. Needs prefix caching (blocks are
       addressed by their hashes: both sides need the same --prefix-caching-hash-seed) and dense attention */
    osp_kv_role kv_role;            /* OSP_KV_ROLE_NONE (default): neither */
    const char *kv_transfer_ip;     /* the producer's listening address (NULL: 127.0.0.1) */
    int32_t kv_transfer_port;       /* its port (0: any free one; osp_engine_kv_transfer_info says which) */
    int64_t kv_transfer_buffer_bytes; /* the producer's held copies at most (0: 1 GiB); the oldest
                                       transfer is dropped for a new one (its consumer recomputes) */
    double kv_transfer_timeout_s;   /* a held transfer no consumer pulled is dropped after this (0: 120 s) */
} osp_engine_params;

osp_engine_params osp_engine_default_params(void);

/* Where a consumer finds a request's prompt KV (the producer's reply, passed on by the router) */
typedef struct osp_kv_transfer_params {
    bool do_remote_decode;      /* producer side: hold this request's prompt blocks for a consumer */
    bool do_remote_prefill;     /* consumer side: load the prompt's first remote_num_blocks blocks from
                                   remote_host:remote_port before computing the rest */
    char remote_host[256];      /* a numeric address or a host name */
    int32_t remote_port;
    uint64_t remote_engine_id;  /* the producer's KV identity (osp_engine_kv_transfer_info); another
                                   identity than the consumer's own: nothing is loaded (recomputed) */
    uint64_t remote_request_id; /* the producer's transfer id (osp_request_output.kv_transfer_id) */
    int32_t remote_num_blocks;  /* full prompt blocks the producer holds */
} osp_kv_transfer_params;

/* A producer's listener and identity (for the kv_transfer_params it returns). */
typedef struct osp_kv_transfer_info {
    osp_kv_role role;
    char host[256];             /* what consumers are told: kv_transfer_ip, or for a wildcard (0.0.0.0, ::,
                                   *) $POD_IP, else the host name */
    int32_t port;               /* the bound port */
    uint64_t engine_id;         /* the KV identity: model content, page format, device, modes */
} osp_kv_transfer_info;

typedef enum osp_finish_reason {
    OSP_FINISH_NONE = 0,    /* still running */
    OSP_FINISH_STOP = 1,    /* EOS or a stop token */
    OSP_FINISH_LENGTH = 2,  /* max_tokens or max_model_len */
    OSP_FINISH_ABORT = 3,   /* osp_engine_abort() */
    OSP_FINISH_ERROR = 4,   /* this request failed (e.g. NaN or inf logits); osp_request_output.error says why.
                               Other requests are not affected. */
} osp_finish_reason;

#define OSP_ENGINE_MAX_LOGPROBS 20

/* One token's logprobs, from the raw model distribution (log_softmax of the logits, before logit bias,
 * penalties, temperature and filtering, as vLLM's default), floored at -9999 so always finite. */
typedef struct osp_token_logprobs {
    int32_t token_id;                           /* the sampled token (prompt: the token that follows) */
    float logprob;
    int32_t rank;                               /* 1 + number of tokens with a strictly higher logprob */
    int32_t n_top;                              /* entries used below (the request's logprobs, <= vocab) */
    int32_t top_ids[OSP_ENGINE_MAX_LOGPROBS];   /* descending logprob, lower id first on ties */
    float top_logprobs[OSP_ENGINE_MAX_LOGPROBS];
} osp_token_logprobs;

/* A logit_bias entry: bias is added to the logit of token_id. */
typedef struct osp_token_bias {
    int32_t token_id;
    float bias;
} osp_token_bias;

typedef struct osp_request_output osp_request_output;
/* Called on the step thread after each step that produced tokens for the request, and once when it
 * finishes; `out` is valid during the call only. Must not call back into the engine. A request with a
 * callback is not polled: its outputs go to the callback only, and the engine forgets it when it
 * finishes. */
typedef void (*osp_output_cb)(void *user, const osp_request_output *out);

/* How an embedding request turns the output norms of its prompt's tokens into one vector (the values
 * of llama.cpp's llama_pooling_type and of the GGUF key <arch>.pooling_type). */
typedef enum osp_pooling {
    OSP_POOLING_NONE = 0, /* not an embedding request: generate */
    OSP_POOLING_MEAN = 1, /* the mean over every prompt token */
    OSP_POOLING_CLS = 2,  /* the first token's */
    OSP_POOLING_LAST = 3, /* the last token's */
} osp_pooling;

/* "mean" / "cls" / "last" -> *out; OSP_ERR_INVALID_ARG otherwise. */
osp_status osp_pooling_parse(const char *name, osp_pooling *out);
const char *osp_pooling_name(osp_pooling p); /* "none", "mean", "cls", "last" */

/* One request. Arrays are copied by osp_engine_add(); the caller keeps ownership. */
typedef struct osp_request_params {
    uint64_t request_id;        /* unique among unfinished-and-unpolled requests */
    const int32_t *prompt;      /* [num_prompt] token ids */
    int32_t num_prompt;
    /* sampling (src/sample/sampler.h; vLLM V1's order: logit_bias and min_tokens, penalties,
       temperature, min-p, top-k, top-p) */
    float temperature;          /* < 1e-5 = greedy (default 0) */
    int32_t top_k;              /* <= 0: off */
    float top_p;                /* in [0, 1]; 1: off; 0: the most likely token only */
    float min_p;                /* in [0, 1]; 0: off */
    float presence_penalty;     /* 0: off; over generated tokens */
    float frequency_penalty;    /* 0: off; over generated tokens */
    float repetition_penalty;   /* > 0; 1: off (0 is read as 1); over prompt and generated tokens */
    const osp_token_bias *logit_bias; /* [num_logit_bias] (copied), ids in the vocabulary */
    int32_t num_logit_bias;
    bool has_seed;              /* false: the engine draws a seed at admission (osp_rng_entropy_seed) */
    uint64_t seed;              /* with has_seed */
    int32_t n;                  /* sequences sampled from the prompt (<= 1: one). With n > 1 the prompt is
                                   computed once and its KV blocks forked to n children (copy-on-write of a
                                   partial last block); each child has its own outputs, stops and logprobs
                                   and is polled by (request_id, sample_index) */
    uint32_t sample_index;      /* Philox sample index of the first child (0); child k uses sample_index + k,
                                   so (seed, sample_index + k) reproduces child k as a request of its own */
    int32_t logprobs;           /* < 0: none (default); 0: the sampled token's logprob; 1..20: plus the top N */
    int32_t prompt_logprobs;    /* < 0: none (default); 0..20: logprobs of prompt tokens 1.. (plus the top N);
                                   such a request skips the prefix cache and prefills in chunks of at most
                                   64 tokens per step */
    /* stops */
    int32_t max_tokens;         /* <= 0: up to max_model_len */
    int32_t min_tokens;         /* EOS and stop tokens are ignored (and masked in sampling) before this many
                                   outputs */
    bool ignore_eos;
    const int32_t *stop_token_ids; /* [num_stop_token_ids] */
    int32_t num_stop_token_ids;
    /* scheduling and caching */
    int32_t priority;           /* OSP_SCHED_PRIORITY: lower runs first */
    uint64_t cache_salt;        /* extra key of the block hashes: requests see each other's cached
                                   prefixes only with the same salt (0 = none) */
    osp_output_cb callback;     /* optional */
    void *callback_user;
    /* structured output: a GBNF grammar (llama.cpp's format, start rule "root"; copied and compiled at
       add) that every sequence's output must follow: tokens that cannot continue it are masked before
       sampling, and end-of-generation is allowed only once it is complete (src/grammar/grammar.h).
       NULL: none. The engine keeps its last 16 compiled grammars by text: a request whose grammar was
       seen before shares that automaton and its cached masks. osp_engine_add fails with
       OSP_ERR_FORMAT for a bad grammar and OSP_ERR_UNSUPPORTED where the model samples on the GPU (not
       yet masked there) or has no vocabulary. */
    const char *grammar;
    /* embeddings: pooling other than OSP_POOLING_NONE makes this a prefill-only request. Its prompt runs
       through the model with the other requests of each step (chunked as any prompt, never served from
       the prefix cache: every token's hidden state is needed); the output norm of its tokens (the
       RMSNorm the lm_head reads, llama.cpp's embeddings' "result_norm") is pooled as `pooling` says,
       L2-normalized when embd_normalize, and the request finishes (OSP_FINISH_STOP, no tokens) with
       osp_request_output.embedding set. The prompt may fill max_model_len. Sampling fields, max_tokens,
       stops and n are not used; osp_engine_add refuses n > 1, logprobs, prompt_logprobs and a grammar
       with it (OSP_ERR_INVALID_ARG). */
    osp_pooling pooling;
    bool embd_normalize;
    /* prefill/decode disaggregation (osp_engine_params.kv_role): NULL, or (copied at add)
       do_remote_decode on a producer / do_remote_prefill on a consumer; osp_engine_add refuses it
       (OSP_ERR_INVALID_ARG) on an engine without that role, and do_remote_decode with n > 1, a grammar,
       prompt logprobs or an embedding */
    const osp_kv_transfer_params *kv_transfer;
} osp_request_params;

osp_request_params osp_request_default_params(void); /* greedy, no limits, no callback, no logprobs */

struct osp_request_output {
    uint64_t request_id;
    uint32_t sample_index;      /* which child (the request's sample_index + k for child k) */
    const int32_t *token_ids;   /* new tokens since the last output (engine-owned in callbacks;
                                   the caller's buffer in osp_engine_poll) */
    const osp_token_logprobs *logprobs; /* [num_tokens] with logprobs >= 0 (engine-owned in callbacks; the
                                   caller's buffer in osp_engine_poll_seq), else NULL */
    const osp_token_logprobs *prompt_logprobs; /* [num_prompt_logprobs] for prompt tokens 1..num_prompt-1,
                                   given once, in the first output after they are all computed (engine-owned
                                   in callbacks; the caller's buffer in osp_engine_poll_seq); else NULL */
    int32_t num_prompt_logprobs;
    int32_t num_tokens;
    int32_t num_output_tokens;  /* total generated so far */
    int32_t num_prompt_tokens;
    int32_t num_cached_tokens;  /* prompt tokens served from the prefix cache at first admission */
    double first_scheduled_s;   /* CLOCK_MONOTONIC seconds when a step first scheduled the request (0:
                                   not yet); the queue time is this minus the time it was added */
    bool finished;
    osp_finish_reason finish_reason;
    char error[160];            /* with OSP_FINISH_ERROR: why; else empty */
    /* an embedding request (osp_request_params.pooling), in its finishing output only: [n_embd] fp32.
       Engine-owned, valid during the callback; osp_engine_poll gives NULL (use a callback) */
    const float *embedding;
    int32_t n_embd;
    /* a do_remote_decode request's finishing output (STOP or LENGTH): kv_transfer_num_blocks > 0 when its
       prompt's full blocks are held for a consumer under kv_transfer_id (0 blocks: nothing held: a prompt
       shorter than a block, or no room) */
    uint64_t kv_transfer_id;
    int32_t kv_transfer_num_blocks;
};

#define OSP_ENGINE_ITERATION_BUCKETS 13
typedef struct osp_engine_stats {
    int64_t num_steps;              /* steps that ran a forward pass */
    int64_t num_preemptions;
    int64_t prefix_queries_tokens;  /* tokens looked up in the prefix cache */
    int64_t prefix_hits_tokens;     /* of which served from it */
    int64_t num_generated_tokens;
    int64_t num_scheduled_tokens;   /* tokens that went through the model (prefill + decode) */
    int32_t num_blocks, num_free_blocks, block_size;
    int32_t num_running, num_waiting;
    /* steps by scheduled tokens: iteration_tokens[b] counts the steps with at most
       osp_engine_iteration_token_buckets[b] tokens (and more than bucket b-1's); the last entry the
       steps above every bucket (vLLM's vllm:iteration_tokens_total buckets) */
    int64_t iteration_tokens[OSP_ENGINE_ITERATION_BUCKETS + 1];
    /* speculative decoding (vLLM's vllm:spec_decode_* counters): verification rows run, drafts in them,
       drafts accepted, and per draft position the rows that accepted it (mean acceptance length =
       1 + spec_num_accepted_tokens / spec_num_drafts tokens per row) */
    int64_t spec_num_drafts, spec_num_draft_tokens, spec_num_accepted_tokens;
    int64_t spec_accepted_per_pos[OSP_SPEC_MAX_TOKENS];
    /* speculation's costs (the draft and verify time per round): proposer calls that drafted and
       the seconds they took; steps that verified drafts and their seconds (the forward pass with its
       sampling and verification, wall time on the step thread) */
    int64_t spec_propose_calls, spec_verify_steps;
    double spec_propose_seconds, spec_verify_seconds;
    /* sparse attention (osp_engine_params.sparse_attention), over (token, layer) pairs: pairs whose context
       fit the budget (dense), pairs that read selected pages; KV tiles those read (summed over KV heads)
       and what dense attention of the same pairs would have read, and the K + V bytes read */
    int64_t sparse_dense_tokens, sparse_tokens, sparse_tiles_read, sparse_tiles_dense, sparse_bytes_read;
    /* tiered KV offload: blocks held now in host memory and on disk; blocks stored into a tier (evicted
       from the pool, or moved down), loaded back, found corrupt on disk (recomputed); prompt tokens served
       by loads (part of prefix_hits_tokens) and tokens a tier held that the cost model recomputed */
    int64_t offload_host_blocks, offload_disk_blocks, offload_stored_blocks, offload_loaded_blocks;
    int64_t offload_corrupt_blocks, offload_hits_tokens, offload_skipped_tokens;
    int64_t offload_write_errors;   /* disk writes that failed (the block dropped; a full or removed disk) */
    int64_t offload_missing_blocks; /* disk blocks whose file was gone (removed under the server): forgotten,
                                       recomputed */
    /* prefill/decode disaggregation (osp_engine_params.kv_role). Producer: transfers held now and their
       blocks, blocks sent, transfers dropped unpulled (timed out or pushed out by newer ones). Consumer:
       blocks loaded from producers, blocks asked for that did not load (recomputed), and the seconds the
       loads took (connect to the last byte) */
    int64_t kv_transfer_held, kv_transfer_held_blocks, kv_transfer_sent_blocks, kv_transfer_dropped;
    int64_t kv_transfer_recv_blocks, kv_transfer_failed_blocks;
    double kv_transfer_recv_seconds;
    /* of the blocks sent (producer) or loaded (consumer), those that moved by CUDA IPC (device to device
       between two processes on one GPU: kv/transfer.h), not over TCP */
    int64_t kv_transfer_ipc_blocks;
} osp_engine_stats;

/* The upper bounds of osp_engine_stats.iteration_tokens' buckets: 1, 8, 16, ..., 16384. */
extern const int32_t osp_engine_iteration_token_buckets[OSP_ENGINE_ITERATION_BUCKETS];

/* Loads the model and sizes the KV cache. Errors: everything osp_model_load() returns;
 * OSP_ERR_INVALID_ARG for out-of-range params (message names the field; e.g. a budget that holds no
 * block, max_model_len above the model's context, a bad speculative config); OSP_ERR_UNSUPPORTED for
 * speculative decoding where the model samples on the GPU; OSP_ERR_NOMEM. */
osp_status osp_engine_create(const osp_engine_params *params, osp_engine **out);
/* Stops the loop thread if running, finishes nothing further, frees everything. NULL is fine. */
void osp_engine_free(osp_engine *e);

const osp_model *osp_engine_model(const osp_engine *e);
/* Bytes of the engine's KV cache pages (on the model's device). */
size_t osp_engine_kv_cache_bytes(const osp_engine *e);
const osp_engine_params *osp_engine_params_get(const osp_engine *e); /* resolved values */
/* The engine's KV transfer role, listener and identity; role OSP_KV_ROLE_NONE when it has none. Fixed
 * at create: any thread may call it. */
osp_kv_transfer_info osp_engine_kv_transfer_info(const osp_engine *e);

/* Queues a request (thread-safe). Admission checks happen here, synchronously:
 * OSP_ERR_INVALID_ARG for an empty prompt, a token outside the vocabulary, a duplicate id,
 * prompt + max_tokens > max_model_len, a request that could not fit in the KV cache even alone, or
 * sampling parameters out of range (temperature < 0, top_p or min_p outside [0, 1], repetition_penalty
 * < 0, a non-finite value, a logit_bias id outside the vocabulary, logprobs or prompt_logprobs > 20, n
 * above max_num_seqs).
 * Nothing is queued on error. */
osp_status osp_engine_add(osp_engine *e, const osp_request_params *rp);

/* Aborts a request (thread-safe), every child of it: it finishes with OSP_FINISH_ABORT at the start of the next step and
 * its blocks are freed. OSP_ERR_NOT_FOUND if the id is unknown or already finished. */
osp_status osp_engine_abort(osp_engine *e, uint64_t request_id);

/* Runs one step: takes queued adds/aborts, schedules, runs the model, samples, publishes outputs.
 * *did_work = false when there was nothing to run. Not while the loop thread runs (OSP_ERR_INVALID_ARG).
 * Errors from the forward pass or the sampler are returned (OSP_ERR_INTERNAL and others); the engine
 * should then be freed. */
osp_status osp_engine_step(osp_engine *e, bool *did_work);

/* True while any request is queued, waiting or running (thread-safe). */
bool osp_engine_has_unfinished(osp_engine *e);

/* Starts / stops the loop thread. start: OSP_ERR_INVALID_ARG if already running. stop joins it;
 * unfinished requests stay where they are. A failing step stops the loop; osp_engine_stop() returns
 * its status. */
osp_status osp_engine_start(osp_engine *e);
osp_status osp_engine_stop(osp_engine *e);

/* Takes the request's pending output (thread-safe): up to `cap` new tokens are copied to `tokens`
 * and described in *out (out->token_ids = tokens). Waits up to timeout_ms (0: don't wait, < 0:
 * forever) for something new. Returns OSP_OK with out->num_tokens possibly 0 on timeout; the last
 * poll of a finished request has out->finished set, after which the id is forgotten.
 * OSP_ERR_NOT_FOUND for an unknown id or a request with a callback. */
osp_status osp_engine_poll(osp_engine *e, uint64_t request_id, int32_t *tokens, int32_t cap,
                           osp_request_output *out, int timeout_ms);
/* The same for one child of a request (sample_index as in osp_request_output; a request with n = 1
 * has only its sample_index), also copying logprobs: logprobs [cap] (or NULL) receives the logprobs
 * of the tokens copied (when the request asked for them); prompt_logprobs [num_prompt - 1] (or NULL)
 * receives the prompt logprobs once (out->num_prompt_logprobs > 0 then; child 0 only). osp_engine_poll
 * is this with the request's first child and NULL buffers. */
osp_status osp_engine_poll_seq(osp_engine *e, uint64_t request_id, uint32_t sample_index, int32_t *tokens,
                               osp_token_logprobs *logprobs, int32_t cap, osp_token_logprobs *prompt_logprobs,
                               osp_request_output *out, int timeout_ms);

osp_engine_stats osp_engine_get_stats(osp_engine *e); /* thread-safe snapshot */

/* Checks block pool and scheduler invariants (every request's blocks are referenced, free blocks
 * plus used blocks add up, ...). OSP_ERR_INTERNAL with a message. Not while the loop thread runs. */
osp_status osp_engine_check_invariants(osp_engine *e);

#ifdef __cplusplus
}
#endif
#endif
