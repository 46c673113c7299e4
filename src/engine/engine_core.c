/* The engine core (see include/osprey/engine.h): one step = take queued adds and aborts, schedule,
 * run the model runner, update the scheduler, publish outputs. The step thread (the caller of
 * osp_engine_step, or the loop thread) is the only one touching the scheduler, the pool and the
 * runner; other threads meet it at one mutex that guards the pending queues, the request table and
 * each request's published output counters. Tokens are published by count: a request's token array is
 * allocated once at its maximum length and only ever appended to, so pollers copy the published prefix
 * while the step thread writes beyond it. */
#include "osprey/engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/kernel_table.h"
#include "core/status_internal.h"
#include "format/kv_scales.h"
#include "model/model_exec.h"
#include "sparse/engine_hook.h"

/* GPU memory kept out of the KV cache for activations (grown in the first steps), the sampler's
 * scratch (~8 bytes per vocabulary entry per row) and cuBLASLt's workspace. */
#define OSP_GPU_RESERVE_BYTES ((int64_t)3 << 30)
/* the most a CUDA backend's attention workspace takes (OSP_CUDA_ATTN_SPLIT_BUDGET, 128 MiB; its v0 part is
   smaller): counted for a draft model's backend, which loads after the target's cache is sized */
#define OSP_DRAFT_ATTN_WS_BYTES ((int64_t)128 << 20)
#include "engine/engine_internal.h"
#include "engine/model_runner.h"
#include "engine/offload.h"
#include "kv/kv_cache.h"
#include "engine/scheduler.h"
#include "engine/timeline.h"
#include "grammar/grammar.h"
#include "osprey/tokenizer.h"
#include "sample/rng.h"
#include "spec/switch.h"

typedef struct ptr_vec {
    void **v;
    int32_t n, cap;
} ptr_vec;

/* Adaptive k, per request, from its own verification rows only (so never from its batch; and drafts
 * never change outputs, only time). The schedule of HF transformers' assisted generation: all drafts
 * kept, ask for two more next time; any rejected, one fewer (at least 1). Where the moving share of
 * drafts kept falls below OSP_SPEC_OFF_BELOW (a verification row then costs more than its kept
 * tokens save: on 2 CPU cores a 2-token row costs ~1.5 decode steps), the request decodes without
 * drafts for a pause of OSP_SPEC_PAUSE_MIN steps, doubling up to OSP_SPEC_PAUSE_MAX while it keeps
 * failing, then tries again from k = 1. Above that, the engine-wide switch (spec/switch.h) turns
 * speculation off where it measures it slower. */
#define OSP_SPEC_OFF_BELOW 0.3f
#define OSP_SPEC_PAUSE_MIN 8
#define OSP_SPEC_PAUSE_MAX 128

static int vec_push(ptr_vec *a, void *p) {
    if (a->n == a->cap) {
        int32_t cap = a->cap ? a->cap * 2 : 32;
        void **v = realloc(a->v, sizeof *v * (size_t)cap);
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = p;
    return 0;
}

static void vec_del(ptr_vec *a, int32_t i) { a->v[i] = a->v[--a->n]; }

#define OSP_ENGINE_GRAMMAR_CACHE 16

static void timeline_flush(osp_engine *e);

struct osp_engine {
    osp_engine_params p;
    bool step_trace;            /* OSPREY_STEP_TRACE=1 (a diagnostic): a line a step on stderr */
    osp_timeline *timeline;     /* --trace FILE (osp_engine_params.trace_path), or NULL */
    bool tl_pending;            /* tl_step ran and waits for its device times (read before the next run) */
    osp_timeline_step tl_step;
    int64_t tl_steps;
    osp_model *model;
    int32_t n_vocab;
    int32_t *eos, n_eos;        /* end-of-generation ids (min_tokens masks them) */
    osp_scheduler *sched;
    osp_model_runner *runner;
    osp_token_trie *trie;       /* the vocabulary as a byte trie, for structured-output masks (NULL: no vocabulary) */
    /* compiled grammars by text, each as a matcher at its start state: a request with a grammar seen
       before clones it, sharing the automaton and its cached masks (a schema served again starts warm).
       Round-robin replacement; under gmu. */
    struct {
        char *text;
        osp_grammar_matcher *start;
    } gcache[OSP_ENGINE_GRAMMAR_CACHE];
    int32_t gcache_next;
    pthread_mutex_t gmu;
    osp_proposer *proposer;     /* speculative decoding's drafts, or NULL */
    int32_t spec_k;             /* drafts per request and step at most (0: off) */
    osp_spec_seq *spec_seqs;    /* [max_num_seqs] step-thread scratch for the proposer */
    osp_request **spec_reqs;    /* [max_num_seqs] the request of each spec_seqs entry */
    int32_t spec_n;             /* entries listed for this step's proposer call */
    osp_spec_switch sw;         /* speculation on or off by measured decode rate (spec/switch.h) */
    osp_sparse_runtime *sparse; /* sparse attention's hook state, or NULL (dense) */
    osp_offload *offload;       /* tiered KV offload, or NULL */
    bool offload_ready;         /* a background load finished since the loop last looked (under mu) */

    pthread_mutex_t mu;
    pthread_cond_t wake;        /* the loop thread waits for work */
    pthread_cond_t output;      /* pollers wait for outputs */
    ptr_vec table;              /* every request not yet forgotten (osp_request *) */
    ptr_vec pending;            /* added, not yet given to the scheduler */
    int32_t num_unfinished;
    int64_t next_arrival;
    bool thread_running, stop;
    pthread_t thread;
    osp_status loop_status;
    osp_engine_stats stats;     /* counters, under mu */
    ptr_vec publish;            /* step-thread scratch: requests with news this step */
    osp_token_logprobs *cb_lp;  /* step-thread scratch: logprobs handed to callbacks */
    int32_t cb_cap;
};

static void offload_loaded(void *ctx);

osp_engine_params osp_engine_default_params(void) {
    osp_engine_params p;
    memset(&p, 0, sizeof p);
    p.block_size = 16;
    p.kv_cache_memory = 512ll << 20;
    p.kv_dtype = OSP_KV_DTYPE_F16;
    p.max_num_seqs = 256;
    p.max_num_batched_tokens = 2048;
    p.enable_prefix_caching = true;
    p.hash_algo = OSP_PREFIX_HASH_XXH3_128;
    p.policy = OSP_SCHED_FCFS;
    return p;
}

static void log_stderr(void *ctx, const char *line) {
    (void)ctx;
    fprintf(stderr, "osprey: %s\n", line);
}

osp_status osp_engine_create(const osp_engine_params *params, osp_engine **out) {
    *out = NULL;
    if (!params || (!params->model_path && !params->random_weights))
        return osp_set_error(OSP_ERR_INVALID_ARG, "engine: no model_path");
    osp_engine_params p = *params;
    if (p.block_size <= 0 || p.max_num_seqs <= 0 || p.max_num_batched_tokens <= 0 || p.max_model_len < 0 ||
        p.kv_cache_memory < 0 || p.num_blocks < 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "engine: block_size, max_num_seqs and max_num_batched_tokens must "
                                                  "be > 0; max_model_len, kv_cache_memory, num_blocks >= 0");
    if (!p.kv_dtype_v_set) p.kv_dtype_v = p.kv_dtype; /* V pages as K's unless split */
    p.kv_dtype_v_set = true;
    if (!osp_kv_dtype_name(p.kv_dtype)) return osp_set_error(OSP_ERR_INVALID_ARG, "engine: unknown kv_dtype %d", (int)p.kv_dtype);
    if (!osp_kv_dtype_name(p.kv_dtype_v))
        return osp_set_error(OSP_ERR_INVALID_ARG, "engine: unknown kv_dtype_v %d", (int)p.kv_dtype_v);
    OSP_TRY(osp_kv_dtype_available(p.kv_dtype)); /* bf16: refused before anything is loaded */
    OSP_TRY(osp_kv_dtype_available(p.kv_dtype_v));
    if (p.exact && (osp_kv_dtype_quantized(p.kv_dtype) || osp_kv_dtype_quantized(p.kv_dtype_v)))
        return osp_set_error(OSP_ERR_INVALID_ARG, "engine: exact mode needs f32 KV pages, not quantized %s ones",
                             osp_kv_dtype_name(osp_kv_dtype_quantized(p.kv_dtype) ? p.kv_dtype : p.kv_dtype_v));
    OSP_TRY(osp_spec_config_check(&p.speculative));
    OSP_TRY(osp_sparse_config_check(&p.sparse_attention));
    if (p.tensor_parallel_size < 0 || p.tensor_parallel_size > 64)
        return osp_set_error(OSP_ERR_INVALID_ARG, "engine: tensor_parallel_size %d (1..64)", p.tensor_parallel_size);
    if (p.tensor_parallel_size > 1) { /* what reads or moves one rank's KV pages, or splits nothing yet */
        const char *why = p.kv_offload_host_bytes > 0 || p.kv_offload_disk_dir ? "KV offload"
                          : p.kv_role != OSP_KV_ROLE_NONE                       ? "P/D KV transfer"
                          : p.speculative.method == OSP_SPEC_QUANTSPEC          ? "QuantSpec"
                          : p.sparse_attention.method != OSP_SPARSE_NONE        ? "sparse attention"
                          : p.kv_scales_path                                    ? "a KV scales file"
                          : p.random_weights                                    ? "random weights"
                                                                                : NULL;
        if (why)
            return osp_set_error(OSP_ERR_UNSUPPORTED, "engine: tensor parallelism (%d ranks) does not run with %s yet",
                                 p.tensor_parallel_size, why);
    }
    /* the scales file before the model: a bad one fails fast, nothing loaded */
    osp_kv_scales scales = {0};
    if (p.kv_scales_path) OSP_TRY(osp_kv_scales_load(p.kv_scales_path, &scales));
    osp_engine *e = calloc(1, sizeof *e);
    if (!e) {
        osp_kv_scales_free(&scales);
        return osp_set_error(OSP_ERR_NOMEM, "engine: out of memory");
    }
    const char *trace = getenv("OSPREY_STEP_TRACE");
    e->step_trace = trace && strcmp(trace, "1") == 0;
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->gmu, NULL);
    pthread_cond_init(&e->wake, NULL);
    pthread_cond_init(&e->output, NULL);
    int32_t *eos = NULL, n_eos = 0;
    osp_model_params mp = osp_model_default_params();
    mp.n_threads = p.n_threads;
    mp.exact = p.exact;
    mp.cpu_activations = p.cpu_activations;
    mp.no_mmap = p.no_mmap;
    mp.tensor_parallel_size = p.tensor_parallel_size;
    mp.device = p.device;
    mp.gpu_quant_weights = p.gpu_quant_weights;
    mp.progress = p.load_progress;
    mp.progress_ctx = p.load_progress_ctx;
    osp_status s = p.random_weights ? osp_model_load_random(p.random_weights, p.random_seed, &mp, &e->model)
                                    : osp_model_load(p.model_path, &mp, &e->model);
    if (s != OSP_OK) goto fail;
    const osp_model_config *c = osp_model_config_get(e->model);
    e->n_vocab = c->n_vocab;
    /* the kernel selection table, before the first step runs any op (kernel_table.h) */
    if ((s = osp_kernel_table_apply(p.kernel_table, osp_model_device(e->model), c->head_dim, p.kv_dtype,
                                    p.log ? p.log : log_stderr, p.log_ctx)) != OSP_OK)
        goto fail;
    /* the model's shape and backend take the K and V dtypes (CUDA: no split K/V), before sizing */
    if ((s = osp_kv_cache_check(e->model, p.kv_dtype, p.kv_dtype_v)) != OSP_OK) goto fail;
    if (p.kv_scales_path &&
        (s = osp_kv_scales_check_shape(&scales, c->n_layer, c->n_head_kv, c->head_dim)) != OSP_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", osp_last_error());
        s = osp_set_error(s, "%s: %s", p.kv_scales_path, msg);
        goto fail;
    }
    if (p.max_model_len == 0) p.max_model_len = c->n_ctx_train;
    if (p.max_model_len < 2 || p.max_model_len > c->n_ctx_train) {
        s = osp_set_error(OSP_ERR_INVALID_ARG, "engine: max_model_len %d is outside [2, %d] (the model's context)",
                          p.max_model_len, c->n_ctx_train);
        goto fail;
    }
    /* quantspec drafts over the target's own cache, into staging blocks past the pool's */
    const int32_t num_staging = p.speculative.method == OSP_SPEC_QUANTSPEC
                                    ? osp_quantspec_staging_blocks(p.speculative.num_speculative_tokens, p.block_size)
                                    : 0;
    /* on a GPU, sparse attention's page summaries sit beside each block (osp_sparse_runtime_create_device) */
    /* c is rank 0's share under tensor parallelism: every rank's cache lives on this host (the CPU) */
    const int64_t block_bytes =
        osp_kv_cache_bytes_per_token(c, p.kv_dtype, p.kv_dtype_v) * p.block_size *
            (p.tensor_parallel_size > 1 ? p.tensor_parallel_size : 1) +
        (p.sparse_attention.method != OSP_SPARSE_NONE && osp_model_samples_on_device(e->model)
             ? osp_sparse_device_bytes_per_block(c->n_layer, c->n_head_kv, c->head_dim)
             : 0);
    /* a draft model on the GPU loads after the cache and holds a cache of its own with as many blocks: its
       weights come out of the GPU budget first and its block's bytes count with the target's */
    int64_t draft_weights = 0, draft_block_bytes = 0;
    if (p.speculative.method == OSP_SPEC_DRAFT_MODEL && osp_model_samples_on_device(e->model) && !p.kv_cache_memory &&
        p.num_blocks == 0) {
        osp_model_config dc;
        if ((s = osp_model_probe(p.speculative.model, &dc, &draft_weights)) != OSP_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", osp_last_error());
            s = osp_set_error(s, "draft model: %s", msg);
            goto fail;
        }
        /* its own backend's working memory: a fixed allowance (cuBLASLt, the sampler's scratch), the attention
           workspace's bound and fp32 activations of a step's tokens (the FFN's gate / up and a few rows of the
           model width) */
        const int64_t tokens = p.max_num_batched_tokens;
        draft_weights += (256ll << 20) + (int64_t)OSP_DRAFT_ATTN_WS_BYTES +
                         tokens * (2 * (int64_t)dc.n_ff + 8 * (int64_t)dc.n_embd) * 4;
        draft_block_bytes = osp_kv_cache_bytes_per_token(&dc, p.kv_dtype, p.kv_dtype) * p.block_size;
    }
    if (p.num_blocks == 0) {
        int64_t want = p.kv_cache_memory ? p.kv_cache_memory / block_bytes
                                         : (int64_t)p.max_num_seqs * ((p.max_model_len + p.block_size - 1) / p.block_size);
        if (osp_model_samples_on_device(e->model) && !p.kv_cache_memory) {
            /* as vLLM's gpu_memory_utilization: at most that share of the GPU in all, after the weights
             * and a reserve for activations, the sampler's scratch and cuBLASLt */
            size_t fr = 0, tot = 0;
            if ((s = osp_model_mem_info(e->model, &fr, &tot)) != OSP_OK) goto fail;
            const double util = p.gpu_memory_utilization > 0 ? p.gpu_memory_utilization : 0.9;
            /* what is loaded after the cache comes out of the budget first: QuantSpec's 4-bit draft (its weights
               and a workspace allowance) and its staging blocks */
            const int64_t later = p.speculative.method == OSP_SPEC_QUANTSPEC
                                      ? osp_quantspec_draft_device_bytes(e->model) + (int64_t)num_staging * block_bytes
                                      : draft_weights;
            const int64_t budget = (int64_t)(util * (double)tot) - (int64_t)(tot - fr) - OSP_GPU_RESERVE_BYTES - later;
            if (budget / (block_bytes + draft_block_bytes) < want) want = budget / (block_bytes + draft_block_bytes);
            if (want < 1) {
                s = osp_set_error(OSP_ERR_NOMEM, "engine: no GPU memory left for the KV cache (%.1f GiB free of %.1f, "
                                                 "gpu_memory_utilization %.2f)", (double)fr / 1073741824.0,
                                  (double)tot / 1073741824.0, util);
                goto fail;
            }
        }
        /* quantspec's staging blocks come out of a memory budget */
        const int32_t staging = p.kv_cache_memory ? num_staging : 0;
        if (staging > 0 && want - staging < 1) {
            s = osp_set_error(OSP_ERR_INVALID_ARG, "engine: kv_cache_memory %lld bytes holds %lld blocks of %lld bytes, "
                              "and quantspec needs %d of them as staging blocks: give a larger budget",
                              (long long)p.kv_cache_memory, (long long)want, (long long)block_bytes, staging);
            goto fail;
        }
        want -= staging;
        if (want < 1 || want > INT32_MAX) {
            s = osp_set_error(OSP_ERR_INVALID_ARG, "engine: kv_cache_memory %lld bytes holds %lld blocks of %lld bytes",
                              (long long)p.kv_cache_memory, (long long)want, (long long)block_bytes);
            goto fail;
        }
        p.num_blocks = (int32_t)want;
    }
    /* end-of-generation ids from the tokenizer (a model without a vocabulary has none) */
    osp_tokenizer *tok = NULL;
    if (osp_model_gguf(e->model) && osp_tokenizer_load(osp_model_gguf(e->model), &tok) == OSP_OK) {
        eos = malloc(sizeof *eos * 64);
        for (int32_t i = 0; eos && i < c->n_vocab && n_eos < 64; i++)
            if (osp_tokenizer_is_eog(tok, i)) eos[n_eos++] = i;
        /* ~20 ms and a few MB for a 50k vocabulary; without it grammar requests are refused */
        if (osp_tokenizer_n_vocab(tok) == c->n_vocab && osp_token_trie_from_tokenizer(tok, &e->trie) != OSP_OK) e->trie = NULL;
        osp_tokenizer_free(tok);
    }
    const osp_scheduler_config sc = {.max_num_seqs = p.max_num_seqs, .max_num_batched_tokens = p.max_num_batched_tokens,
                                     .max_model_len = p.max_model_len, .block_size = p.block_size,
                                     .num_blocks = p.num_blocks, .policy = p.policy,
                                     .enable_prefix_caching = p.enable_prefix_caching,
                                     .hasher = osp_prefix_hasher_make(p.hash_algo, p.hash_seed_set, p.hash_seed),
                                     .eos_ids = eos, .num_eos = n_eos};
    if ((s = osp_scheduler_create(&sc, &e->sched)) != OSP_OK) goto fail;
    if (p.kv_event_sink) osp_block_pool_set_event_sink(osp_scheduler_pool(e->sched), p.kv_event_sink, p.hash_algo);
    /* speculative decoding: a verification row is one sampler row a position (the drafts before it
       are its outputs), on the host or the GPU sampler alike. QuantSpec's self-draft is a 4-bit copy of
       the target on the target's device, reading the target's pages (int8_hier by their upper halves) */
    if (p.speculative.method != OSP_SPEC_NONE) e->spec_k = p.speculative.num_speculative_tokens;
    if (!(e->spec_seqs = calloc((size_t)p.max_num_seqs, sizeof *e->spec_seqs)) ||
        !(e->spec_reqs = calloc((size_t)p.max_num_seqs, sizeof *e->spec_reqs))) {
        s = osp_set_error(OSP_ERR_NOMEM, "engine: out of memory");
        goto fail;
    }
    const float *k_fixed, *v_fixed;
    osp_kv_scales_for(p.kv_scales_path ? &scales : NULL, p.kv_dtype, p.kv_dtype_v, &k_fixed, &v_fixed);
    if ((s = osp_runner_create(e->model, p.num_blocks + num_staging, p.block_size, p.kv_dtype, p.kv_dtype_v, k_fixed,
                               v_fixed, p.max_num_seqs, p.max_model_len, p.max_num_batched_tokens, e->spec_k,
                               &e->runner)) != OSP_OK)
        goto fail;
    if (p.speculative.method != OSP_SPEC_NONE) {
        const osp_proposer_target pt = {.model = e->model, .n_threads = p.n_threads, .exact = p.exact,
                                        .cpu_activations = p.cpu_activations, .no_mmap = p.no_mmap,
                                        .kv_dtype = p.kv_dtype,
                                        .block_size = p.block_size, .num_blocks = p.num_blocks,
                                        .max_model_len = p.max_model_len,
                                        .max_num_batched_tokens = p.max_num_batched_tokens,
                                        .kv = e->runner->kv, .staging_block0 = p.num_blocks,
                                        .num_staging_blocks = num_staging};
        if ((s = osp_proposer_create(&p.speculative, &pt, &e->proposer)) != OSP_OK) goto fail;
        osp_spec_switch_init(&e->sw);
    }
    if (p.sparse_attention.method != OSP_SPARSE_NONE) {
        if (osp_model_samples_on_device(e->model)) { /* the backend selects and attends (osp_dev_sparse) */
            if ((s = osp_sparse_runtime_create_device(&p.sparse_attention, e->runner->kv, c->n_head, &e->sparse)) !=
                OSP_OK)
                goto fail;
            osp_model_set_dev_sparse(e->model, osp_sparse_runtime_device(e->sparse));
        } else {
            if ((s = osp_sparse_runtime_create(&p.sparse_attention, e->runner->kv, &e->sparse)) != OSP_OK) goto fail;
            osp_model_set_attn_hook(e->model, osp_sparse_runtime_hook(e->sparse));
        }
    }
    if (p.kv_offload_host_bytes != 0 || p.kv_offload_disk_dir || p.kv_role != OSP_KV_ROLE_NONE) {
        const char *what = p.kv_role != OSP_KV_ROLE_NONE ? "KV transfer (--kv-transfer-config)" : "KV offload";
        if (!p.enable_prefix_caching || p.sparse_attention.method != OSP_SPARSE_NONE) {
            s = osp_set_error(OSP_ERR_UNSUPPORTED, "engine: %s needs prefix caching and dense attention (%s)", what,
                              !p.enable_prefix_caching ? "prefix caching is off" : "sparse attention is on");
            goto fail;
        }
        if ((int)p.kv_role < OSP_KV_ROLE_NONE || p.kv_role > OSP_KV_ROLE_BOTH || p.kv_transfer_port < 0 ||
            p.kv_transfer_port > 65535 || p.kv_transfer_buffer_bytes < 0 || p.kv_transfer_timeout_s < 0) {
            s = osp_set_error(OSP_ERR_INVALID_ARG, "engine: bad KV transfer settings (role %d, port %d, buffer %lld bytes, "
                              "timeout %g s)", (int)p.kv_role, p.kv_transfer_port, (long long)p.kv_transfer_buffer_bytes,
                              p.kv_transfer_timeout_s);
            goto fail;
        }
        if (p.kv_offload_host_bytes > 0 && osp_model_device(e->model) == OSP_DEVICE_CPU) {
            s = osp_set_error(OSP_ERR_INVALID_ARG, "engine: a host-memory KV tier (--kv-offloading-size) on the CPU "
                                                   "backend would copy host memory to host memory: give the KV cache "
                                                   "that memory instead (--kv-cache-memory), or offload to disk "
                                                   "(--kv-offload-disk)");
            goto fail;
        }
        if (p.kv_transfer_buffer_bytes == 0) p.kv_transfer_buffer_bytes = (int64_t)1 << 30;
        if (p.kv_transfer_timeout_s == 0) p.kv_transfer_timeout_s = 120.0;
        const size_t xfer_block_bytes = osp_kv_cache_block_bytes(e->runner->kv);
        if ((p.kv_role == OSP_KV_ROLE_PRODUCER || p.kv_role == OSP_KV_ROLE_BOTH) &&
            (size_t)p.kv_transfer_buffer_bytes < xfer_block_bytes) {
            s = osp_set_error(OSP_ERR_INVALID_ARG, "engine: the KV transfer buffer (kv_buffer_size, %lld bytes) holds no "
                              "block (%zu bytes each): a producer could hold nothing", (long long)p.kv_transfer_buffer_bytes,
                              xfer_block_bytes);
            goto fail;
        }
        if (p.kv_role != OSP_KV_ROLE_NONE && !p.hash_seed_set)
            (p.log ? p.log : log_stderr)(p.log_ctx, "kv transfer: no --prefix-caching-hash-seed (or $OSPREY_HASH_SEED / "
                                                    "$PYTHONHASHSEED): this process's block hashes are its own, so no "
                                                    "other server's blocks match (every transfer is recomputed); give "
                                                    "producers and consumers the same seed");
        const osp_offload_config oc = {.tiers = {.host_bytes = p.kv_offload_host_bytes, .disk_dir = p.kv_offload_disk_dir,
                                                 .disk_bytes = p.kv_offload_disk_bytes},
                                       .role = p.kv_role, .xfer_ip = p.kv_transfer_ip, .xfer_port = p.kv_transfer_port,
                                       .xfer_cap_bytes = (size_t)p.kv_transfer_buffer_bytes,
                                       .xfer_timeout_s = p.kv_transfer_timeout_s,
                                       .no_cost_model = p.kv_offload_no_cost_model,
                                       .sink = p.kv_event_sink, .hash_algo = p.hash_algo,
                                       .loaded = offload_loaded, .loaded_ctx = e,
                                       .log = p.log ? p.log : log_stderr, .log_ctx = p.log_ctx};
        const osp_offload_identity oid = {.model_path = p.random_weights ? NULL : p.model_path,
                                          .random_weights = p.random_weights, .random_seed = p.random_seed,
                                          .device = (int)p.device, .exact = p.exact,
                                          .cpu_activations = (int)p.cpu_activations,
                                          .gpu_quant_weights = p.gpu_quant_weights, .hash_algo = p.hash_algo,
                                          .hash_seed = sc.hasher.seed, .hash_seed_set = p.hash_seed_set};
        if ((s = osp_offload_create(&oc, &oid, e->runner->kv, e->sched, &e->offload)) != OSP_OK) goto fail;
        const osp_offload_stats os = osp_offload_get_stats(e->offload); /* blocks found on disk, before any step */
        e->stats.offload_host_blocks = os.store.blocks[OSP_KV_TIER_HOST];
        e->stats.offload_disk_blocks = os.store.blocks[OSP_KV_TIER_DISK];
    }
    if (p.trace_shapes_path && !(e->runner->trace = fopen(p.trace_shapes_path, "a"))) {
        s = osp_set_error(OSP_ERR_IO, "engine: cannot open the shape trace %s: %s", p.trace_shapes_path, strerror(errno));
        goto fail;
    }
    if (p.trace_path) {
        bool dev = false;
        const char *keep[4] = {p.model_path, p.speculative.model[0] ? p.speculative.model : NULL, p.kv_scales_path,
                               p.kernel_table};
        if ((s = osp_model_timeline_enable(e->model, &dev)) != OSP_OK) goto fail;
        if ((s = osp_timeline_open(p.trace_path, dev, keep, 4, &e->timeline)) != OSP_OK) goto fail;
        e->runner->timeline = true;
        char line[512];
        snprintf(line, sizeof line, "trace: writing the step timeline to %s (%s)", p.trace_path,
                 dev ? "host phases and device spans" : "host phases only: this device has no clock of its own");
        (p.log ? p.log : log_stderr)(p.log_ctx, line);
    }
    e->eos = eos;
    e->n_eos = n_eos;
    e->runner->trie = e->trie;
    e->p = p;
    e->stats.num_blocks = p.num_blocks;
    e->stats.num_free_blocks = p.num_blocks; /* every block is free until the first step */
    e->stats.block_size = p.block_size;
    osp_kv_scales_free(&scales); /* the cache holds its own copy */
    *out = e;
    return OSP_OK;
fail:
    free(eos);
    osp_kv_scales_free(&scales);
    osp_engine_free(e);
    return s;
}

const osp_kv_cache *osp_engine_kv_cache(const osp_engine *e) { return e->runner->kv; }

void osp_engine_free(osp_engine *e) {
    if (!e) return;
    if (e->thread_running) osp_engine_stop(e);
    for (int32_t i = 0; i < e->table.n; i++) osp_request_destroy(e->table.v[i]);
    free(e->table.v);
    free(e->pending.v);
    free(e->publish.v);
    free(e->cb_lp);
    free(e->eos);
    if (e->sparse) osp_model_set_attn_hook(e->model, NULL), osp_model_set_dev_sparse(e->model, NULL);
    osp_sparse_runtime_free(e->sparse);
    if (e->timeline) {
        timeline_flush(e);
        char line[512];
        osp_timeline_summary(e->timeline, line, sizeof line);
        (e->p.log ? e->p.log : log_stderr)(e->p.log_ctx, line);
        if (osp_timeline_close(e->timeline) != OSP_OK)
            (e->p.log ? e->p.log : log_stderr)(e->p.log_ctx, osp_last_error());
    }
    osp_runner_destroy(e->runner);
    osp_token_trie_free(e->trie);
    for (int32_t i = 0; i < OSP_ENGINE_GRAMMAR_CACHE; i++) {
        free(e->gcache[i].text);
        osp_grammar_matcher_free(e->gcache[i].start);
    }
    pthread_mutex_destroy(&e->gmu);
    osp_proposer_destroy(e->proposer);
    free(e->spec_seqs);
    free(e->spec_reqs);
    osp_offload_destroy(e->offload, e->sched);
    osp_scheduler_destroy(e->sched);
    osp_model_free(e->model);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->wake);
    pthread_cond_destroy(&e->output);
    free(e);
}

const osp_model *osp_engine_model(const osp_engine *e) { return e->model; }
size_t osp_engine_kv_cache_bytes(const osp_engine *e) { return osp_kv_cache_bytes(e->runner->kv); }
const osp_engine_params *osp_engine_params_get(const osp_engine *e) { return &e->p; }

osp_kv_transfer_info osp_engine_kv_transfer_info(const osp_engine *e) { return osp_offload_transfer_info(e->offload); }

static int32_t table_find(const osp_engine *e, uint64_t id) {
    for (int32_t i = 0; i < e->table.n; i++)
        if (((osp_request *)e->table.v[i])->id == id) return i;
    return -1;
}

/* The sequence of request `id` with that sample_index (by_index), or its first child. */
static int32_t table_find_seq(const osp_engine *e, uint64_t id, bool by_index, uint32_t sample_index) {
    for (int32_t i = 0; i < e->table.n; i++) {
        const osp_request *r = e->table.v[i];
        if (r->id == id && (by_index ? r->sampling.sample_index == sample_index : r->child == 0)) return i;
    }
    return -1;
}

/* A matcher at the start of grammar `text`: a clone of the cached one when the text was seen before,
 * else compiled (and cached, replacing the oldest entry). Errors: osp_grammar_parse's, NOMEM. */
static osp_status grammar_matcher(osp_engine *e, const char *text, osp_grammar_matcher **out) {
    pthread_mutex_lock(&e->gmu);
    osp_status s = OSP_ERR_NOT_FOUND;
    for (int32_t i = 0; i < OSP_ENGINE_GRAMMAR_CACHE && s == OSP_ERR_NOT_FOUND; i++)
        if (e->gcache[i].text && strcmp(e->gcache[i].text, text) == 0) s = osp_grammar_matcher_clone(e->gcache[i].start, out);
    pthread_mutex_unlock(&e->gmu);
    if (s != OSP_ERR_NOT_FOUND) return s;
    osp_grammar *g;
    OSP_TRY(osp_grammar_parse(text, strlen(text), NULL, &g));
    osp_grammar_matcher *start;
    OSP_TRY(osp_grammar_matcher_new_owning(g, &start));
    if ((s = osp_grammar_matcher_clone(start, out)) != OSP_OK) {
        osp_grammar_matcher_free(start);
        return s;
    }
    char *copy = strdup(text);
    pthread_mutex_lock(&e->gmu);
    const int32_t k = e->gcache_next;
    if (copy) { /* no copy: simply not cached */
        free(e->gcache[k].text);
        osp_grammar_matcher_free(e->gcache[k].start);
        e->gcache[k].text = copy, e->gcache[k].start = start, start = NULL;
        e->gcache_next = (k + 1) % OSP_ENGINE_GRAMMAR_CACHE;
    }
    pthread_mutex_unlock(&e->gmu);
    osp_grammar_matcher_free(start);
    return OSP_OK;
}

/* A request's kv_transfer_params against the engine's role (osp_request_params.kv_transfer). */
static osp_status check_kv_transfer(const osp_engine *e, const osp_request_params *rp) {
    const osp_kv_transfer_params *t = rp->kv_transfer;
    const unsigned long long id = (unsigned long long)rp->request_id;
    const osp_kv_role role = e->p.kv_role;
    const bool prod = role == OSP_KV_ROLE_PRODUCER || role == OSP_KV_ROLE_BOTH;
    const bool cons = role == OSP_KV_ROLE_CONSUMER || role == OSP_KV_ROLE_BOTH;
    if (t->do_remote_decode && t->do_remote_prefill)
        return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: do_remote_decode and do_remote_prefill together", id);
    if (t->do_remote_decode && !prod)
        return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: do_remote_decode needs a KV producer (kv_role "
                             "kv_producer or kv_both)", id);
    if (t->do_remote_prefill && !cons)
        return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: do_remote_prefill needs a KV consumer (kv_role "
                             "kv_consumer or kv_both)", id);
    /* a grammar or prompt logprobs are fine: the producer computes the prompt either way (a prompt-logprobs
       request's blocks are not in the prefix cache: nothing is held, and its consumer computes it) */
    if (t->do_remote_decode) {
        const char *bad = rp->n > 1 ? "n > 1" : rp->pooling != OSP_POOLING_NONE ? "pooling (an embedding)" : NULL;
        if (bad) return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: do_remote_decode cannot have %s", id, bad);
    }
    if (t->do_remote_prefill &&
        (t->remote_port <= 0 || t->remote_port > 65535 || !t->remote_host[0] || t->remote_num_blocks < 0 ||
         !memchr(t->remote_host, '\0', sizeof t->remote_host)))
        return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: do_remote_prefill needs remote_host, remote_port "
                             "(1..65535) and remote_num_blocks >= 0", id);
    return OSP_OK;
}

osp_status osp_engine_add(osp_engine *e, const osp_request_params *rp) {
    if (!e || !rp) return osp_set_error(OSP_ERR_INVALID_ARG, "engine add: NULL argument");
    for (int32_t i = 0; i < rp->num_prompt && rp->prompt; i++)
        if (rp->prompt[i] < 0 || rp->prompt[i] >= e->n_vocab)
            return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: prompt token %d is %d, outside the vocabulary (%d)",
                                 (unsigned long long)rp->request_id, i, rp->prompt[i], e->n_vocab);
    OSP_TRY(osp_request_check_sampling(rp, e->n_vocab));
    if (rp->pooling != OSP_POOLING_NONE) {
        const char *bad = rp->pooling != OSP_POOLING_MEAN && rp->pooling != OSP_POOLING_CLS && rp->pooling != OSP_POOLING_LAST
                              ? "an unknown pooling"
                          : rp->n > 1                ? "n > 1"
                          : rp->logprobs >= 0        ? "logprobs"
                          : rp->prompt_logprobs >= 0 ? "prompt_logprobs"
                          : rp->grammar              ? "a grammar"
                                                     : NULL;
        if (bad)
            return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: an embedding request (pooling %d) cannot have %s",
                                 (unsigned long long)rp->request_id, (int)rp->pooling, bad);
    }
    if (rp->kv_transfer && (rp->kv_transfer->do_remote_decode || rp->kv_transfer->do_remote_prefill))
        OSP_TRY(check_kv_transfer(e, rp));
    const int32_t n = rp->n > 1 ? rp->n : 1;
    if (n > e->p.max_num_seqs)
        return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: n = %d exceeds max_num_seqs %d",
                             (unsigned long long)rp->request_id, rp->n, e->p.max_num_seqs);
    osp_request *r;
    OSP_TRY(osp_request_create(rp, e->p.max_model_len, e->p.block_size, 0, &r));
    if (!rp->has_seed) r->sampling.seed = osp_rng_entropy_seed();
    /* children copy it; a request under a grammar drafts too: its drafts are the grammar's forced
       continuation or the proposer's cut at the first token the grammar refuses (propose_drafts), and
       each verification position samples under the mask of the drafts before it (model_runner.c) */
    r->spec_k = rp->pooling != OSP_POOLING_NONE ? 0 : e->spec_k; /* an embedding decodes nothing */
    r->spec_k_cur = r->spec_k;
    r->spec_accept = 1.0f;
    r->spec_next_pause = OSP_SPEC_PAUSE_MIN;
    osp_status s = osp_request_set_eos(r, e->eos, e->n_eos);
    if (s == OSP_OK && r->pooling != OSP_POOLING_NONE) {
        const size_t E = (size_t)osp_model_config_get(e->model)->n_embd;
        r->embd_acc = calloc(E, sizeof *r->embd_acc);
        r->embd = calloc(E, sizeof *r->embd);
        if (!r->embd_acc || !r->embd) s = osp_set_error(OSP_ERR_NOMEM, "engine: out of memory");
    }
    if (s == OSP_OK && rp->grammar) {
        if (!e->trie)
            s = osp_set_error(OSP_ERR_UNSUPPORTED, "request %llu: structured output needs the model's vocabulary",
                              (unsigned long long)rp->request_id);
        else s = grammar_matcher(e, rp->grammar, &r->matcher);
    }
    if (s == OSP_OK && n > 1) {
        r->children = calloc((size_t)(n - 1), sizeof *r->children);
        if (!r->children) s = osp_set_error(OSP_ERR_NOMEM, "engine: out of memory");
        for (int32_t k = 1; k < n && s == OSP_OK; k++)
            if ((s = osp_request_make_child(r, k, &r->children[k - 1])) == OSP_OK) r->num_children = k;
    }
    if (s == OSP_OK) s = osp_scheduler_admissible(e->sched, r); /* reads only constants of the scheduler */
    pthread_mutex_lock(&e->mu);
    if (s == OSP_OK && table_find(e, rp->request_id) >= 0)
        s = osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: the id is already in use", (unsigned long long)rp->request_id);
    if (s == OSP_OK) {
        r->arrival = e->next_arrival++;
        const int32_t n0 = e->table.n;
        bool ok = vec_push(&e->table, r) == 0;
        for (int32_t k = 0; k < r->num_children && ok; k++) ok = vec_push(&e->table, r->children[k]) == 0;
        if (!ok || vec_push(&e->pending, r)) {
            e->table.n = n0;
            s = osp_set_error(OSP_ERR_NOMEM, "engine: out of memory");
        } else {
            e->num_unfinished += n;
            pthread_cond_signal(&e->wake);
        }
    }
    pthread_mutex_unlock(&e->mu);
    if (s != OSP_OK) {
        for (int32_t k = 0; k < r->num_children; k++) osp_request_destroy(r->children[k]);
        osp_request_destroy(r);
    }
    return s;
}

osp_status osp_engine_abort(osp_engine *e, uint64_t id) {
    pthread_mutex_lock(&e->mu);
    bool any = false;
    for (int32_t i = 0; i < e->table.n; i++) {
        osp_request *r = e->table.v[i];
        if (r->id != id || r->published_finished || r->abort_requested) continue;
        r->abort_requested = true;
        any = true;
    }
    osp_status s = OSP_OK;
    if (any) pthread_cond_signal(&e->wake);
    else s = osp_set_error(OSP_ERR_NOT_FOUND, "abort: request %llu is unknown or finished", (unsigned long long)id);
    pthread_mutex_unlock(&e->mu);
    return s;
}

bool osp_engine_has_unfinished(osp_engine *e) {
    pthread_mutex_lock(&e->mu);
    const bool b = e->num_unfinished > 0;
    pthread_mutex_unlock(&e->mu);
    return b;
}

static void mark(osp_engine *e, osp_request *r) {
    /* a finished request's draft state (a draft model's KV) goes back now, not when evicted */
    if (r->state == OSP_REQ_FINISHED && e->proposer && e->proposer->ops->release)
        e->proposer->ops->release(e->proposer, r->uid);
    for (int32_t i = 0; i < e->publish.n; i++)
        if (e->publish.v[i] == r) return;
    vec_push(&e->publish, r);
}

static void to_public(const osp_logprobs *a, osp_token_logprobs *b) {
    b->token_id = a->token_id;
    b->logprob = a->logprob;
    b->rank = a->rank;
    b->n_top = a->n_top;
    memcpy(b->top_ids, a->top_ids, sizeof b->top_ids);
    memcpy(b->top_logprobs, a->top_logprobs, sizeof b->top_logprobs);
}

/* Outputs of r from output token `from`, n of them: tokens and logprobs into the given buffers (lp may
 * be NULL), and the prompt logprobs into plp once (if not NULL and ready). */
static void fill_output(osp_request *r, int32_t from, int32_t n, int32_t *toks, osp_token_logprobs *lp,
                        osp_token_logprobs *plp, bool finished, bool embd_ok, int32_t n_embd, osp_request_output *o) {
    memset(o, 0, sizeof *o);
    o->request_id = r->id;
    o->sample_index = r->sampling.sample_index;
    if (n > 0 && toks != r->tokens + r->num_prompt + from)
        memcpy(toks, r->tokens + r->num_prompt + from, sizeof *toks * (size_t)n);
    o->token_ids = toks;
    if (lp && r->logprobs) {
        for (int32_t i = 0; i < n; i++) to_public(&r->logprobs[from + i], &lp[i]);
        o->logprobs = lp;
    }
    if (plp && r->prompt_lp && !r->prompt_lp_delivered && r->num_published > 0) {
        for (int32_t i = 0; i < r->num_prompt - 1; i++) to_public(&r->prompt_lp[i], &plp[i]);
        o->prompt_logprobs = plp;
        o->num_prompt_logprobs = r->num_prompt - 1;
        r->prompt_lp_delivered = true;
    }
    /* the published state only (set under the lock in step 3 of the loop): a poller holds the lock
     * while the loop thread appends tokens and schedules without it (TSan: a race on num_tokens) */
    o->num_tokens = n;
    o->num_output_tokens = r->num_published;
    o->num_prompt_tokens = r->num_prompt;
    o->num_cached_tokens = r->published_cached_tokens > 0 ? r->published_cached_tokens : 0;
    o->first_scheduled_s = r->published_t_scheduled;
    o->finished = finished;
    o->finish_reason = finished ? r->published_reason : OSP_FINISH_NONE;
    if (finished && r->published_reason == OSP_FINISH_ERROR) snprintf(o->error, sizeof o->error, "%s", r->error);
    if (finished) o->kv_transfer_id = r->kv_xfer_id, o->kv_transfer_num_blocks = r->kv_xfer_blocks;
    if (finished && r->published_reason == OSP_FINISH_STOP && r->embd && embd_ok) {
        o->embedding = r->embd;
        o->n_embd = n_embd;
    }
}

const int32_t osp_engine_iteration_token_buckets[OSP_ENGINE_ITERATION_BUCKETS] = {1, 8, 16, 32, 64, 128, 256,
                                                                                   512, 1024, 2048, 4096, 8192, 16384};
/* Speculative decoding: after a step, every request of it that is about to decode gets drafts for the
 * next one (vLLM V1's order: propose after sampling), at most what leaves room under max_len for the
 * target's token after them; one proposer call for all. Drafts of a request not scheduled next step
 * stay valid (its tokens have not changed); the scheduler drops them on preemption. */
/* adapt_spec: adaptive k after a step (the rule at the top) */
static void adapt_spec(osp_request *r, const osp_sched_entry *en) {
    if (en->num_spec <= 0 || en->sampled == -1) {
        if (r->spec_pause > 0 && en->num_new_tokens > 0) r->spec_pause--;
        return;
    }
    const int32_t a = en->num_accepted < 0 ? 0 : en->num_accepted > en->num_spec ? en->num_spec : en->num_accepted;
    r->spec_accept = 0.7f * r->spec_accept + 0.3f * (float)a / (float)en->num_spec;
    r->spec_k_cur = a == en->num_spec ? r->spec_k_cur + 2 : r->spec_k_cur - 1;
    if (r->spec_k_cur > r->spec_k) r->spec_k_cur = r->spec_k;
    if (r->spec_k_cur < 1) r->spec_k_cur = 1;
    if (r->spec_accept < OSP_SPEC_OFF_BELOW) {
        r->spec_pause = r->spec_next_pause;
        r->spec_next_pause = r->spec_next_pause * 2 > OSP_SPEC_PAUSE_MAX ? OSP_SPEC_PAUSE_MAX : r->spec_next_pause * 2;
        r->spec_accept = 0.5f; /* the retry starts between off and on */
        r->spec_k_cur = 1;
    } else if (a > 0) {
        r->spec_next_pause = OSP_SPEC_PAUSE_MIN;
    }
}

static void collect_drafts(osp_engine *e, const osp_sched_output *so) {
    int32_t n = 0;
    for (int32_t i = 0; i < so->num_entries; i++) {
        osp_request *r = so->entries[i].req;
        if (r->spec_k > 0 && !e->p.speculative_fixed_k) adapt_spec(r, &so->entries[i]);
        r->num_spec = 0;
        if (e->sw.off && !e->p.speculative_fixed_k && !e->p.speculative_no_switch) continue;
        int32_t k = r->max_len - r->num_tokens - 1;
        if (k > r->spec_k) k = r->spec_k;
        if (!e->p.speculative_fixed_k) {
            if (r->spec_pause > 0) continue;
            if (k > r->spec_k_cur) k = r->spec_k_cur;
        }
        /* not a parent whose children fork at its first token: the fork follows a plain sampled row
           (a verification row there would skip the fork; a chunked prompt can end one token short) */
        if (r->state != OSP_REQ_RUNNING || k <= 0 || r->num_computed_tokens != r->num_tokens - 1 || r->children) continue;
        e->spec_reqs[n] = r;
        e->spec_seqs[n++] = (osp_spec_seq){.uid = r->uid, .tokens = r->tokens, .num_tokens = r->num_tokens,
                                           .num_prompt = r->num_prompt, .max_draft = k, .draft = r->spec_tokens,
                                           .block_ids = r->block_ids, .num_blocks = r->num_blocks,
                                           .num_computed = r->num_computed_tokens};
    }
    e->spec_n = n;
}

/* The drafts of a request under a grammar, in r->spec_tokens[0..returned): the proposer's nd drafts up to
 * the first one the grammar refuses (a refused draft could never be accepted: the target samples under
 * the mask), then the grammar's forced continuation from there (bytes only the grammar allows, cut into
 * whole tokens: the target accepts them unless it would cut them otherwise), at most max_draft in all.
 * JSON's whitespace is free, so forced runs are short (a key after its quote); the n-gram proposer's
 * copy of the text's own layout (",\n  \"") bridges them. Proposer drafts that lead to no forced run are
 * dropped for the forced run from the current state (inside a value they were accepted ~1 time in 3 on
 * Qwen2.5-0.5B, 49 % overall with them against 82 % without: bench/spec/NOTES.md). Drafts are guesses:
 * a failure here only drafts less. */
static int32_t grammar_drafts(osp_engine *e, osp_request *r, int32_t max_draft, int32_t nd) {
    if (!e->trie || max_draft <= 0) return 0;
    osp_grammar_matcher *m;
    if (osp_grammar_matcher_clone(r->matcher, &m) != OSP_OK) return 0;
    int32_t ok = 0;
    while (ok < nd && osp_grammar_matcher_accept_token(m, e->trie, r->spec_tokens[ok]) == OSP_OK) ok++;
    const int32_t nf = osp_grammar_matcher_forced_tokens(m, e->trie, r->spec_tokens + ok, max_draft - ok);
    osp_grammar_matcher_free(m);
    if (nf > 0 || ok == 0) return ok + nf;
    /* the proposer's drafts lead to no forced run: inside a value (a name, a number) they are guesses
       that were accepted about a third of the time (bench/spec/NOTES.md): only the forced run from here */
    return osp_grammar_matcher_forced_tokens(r->matcher, e->trie, r->spec_tokens, max_draft);
}

/* The proposer's call for the requests collect_drafts listed (all running: none is freed in between). */
static osp_status propose_drafts(osp_engine *e) {
    const int32_t n = e->spec_n;
    e->spec_n = 0;
    if (n == 0) return OSP_OK;
    OSP_TRY(e->proposer->ops->propose(e->proposer, e->spec_seqs, n));
    for (int32_t j = 0; j < n; j++) {
        osp_request *r = e->spec_reqs[j];
        int32_t nd = e->spec_seqs[j].num_draft;
        for (int32_t t = 0; t < nd; t++)
            if (r->spec_tokens[t] < 0 || r->spec_tokens[t] >= e->n_vocab)
                return osp_set_error(OSP_ERR_INTERNAL, "speculative decoding: proposer %s drafted token %d outside the "
                                     "vocabulary (%d)", e->proposer->ops->name, r->spec_tokens[t], e->n_vocab);
        nd = nd < 0 ? 0 : nd > r->spec_k ? r->spec_k : nd;
        if (r->matcher) nd = grammar_drafts(e, r, e->spec_seqs[j].max_draft, nd);
        r->num_spec = nd;
    }
    return OSP_OK;
}

osp_status osp_engine_set_proposer(osp_engine *e, osp_proposer *p, int32_t k) {
    if (!e->proposer || !p || k < 1 || k > e->spec_k)
        return osp_set_error(OSP_ERR_INVALID_ARG, "engine: a custom proposer needs a speculative config and k in "
                                                  "[1, %d], not %d", e->spec_k, k);
    osp_proposer_destroy(e->proposer);
    e->proposer = p;
    e->spec_k = k;
    return OSP_OK;
}

/* Seconds from a to b (CLOCK_MONOTONIC readings). */
static double seconds(struct timespec a, struct timespec b) {
    return (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
}

static double secs(struct timespec t) { return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec; } /* a reading in osp_now_s's units */

/* Writes the pending step to the timeline with its device times. Called before the next run (whose
 * events replace the last run's) and at the end, so a step's own wait is never added: its device work
 * has long finished by then in a busy loop. A device error here is logged, not the step's. */
static void timeline_flush(osp_engine *e) {
    if (!e->tl_pending) return;
    e->tl_pending = false;
    if (osp_model_timeline_get(e->model, &e->tl_step.dev) != OSP_OK)
        (e->p.log ? e->p.log : log_stderr)(e->p.log_ctx, osp_last_error());
    osp_timeline_add(e->timeline, &e->tl_step);
}

static osp_status step_locked_out(osp_engine *e, bool *did_work) {
    e->publish.n = 0;
    /* 1. take adds and aborts */
    pthread_mutex_lock(&e->mu);
    osp_status s = OSP_OK;
    for (int32_t i = 0; i < e->pending.n && s == OSP_OK; i++) s = osp_scheduler_add(e->sched, e->pending.v[i]);
    e->pending.n = 0;
    for (int32_t i = 0; i < e->table.n; i++) {
        osp_request *r = e->table.v[i];
        if (r->abort_requested && !r->published_finished) { /* a parent may have finished it already */
            osp_scheduler_finish(e->sched, r, OSP_FINISH_ABORT);
            mark(e, r);
        }
    }
    pthread_mutex_unlock(&e->mu);
    OSP_TRY(s);
    /* 2. schedule, run, update */
    osp_sched_output *so;
    struct timespec tsch;
    clock_gettime(CLOCK_MONOTONIC, &tsch);
    const osp_offload_stats os0 = e->step_trace && e->offload ? osp_offload_get_stats(e->offload) : (osp_offload_stats){0};
    OSP_TRY(osp_scheduler_schedule(e->sched, &so));
    if (e->offload) OSP_TRY(osp_offload_status(e->offload)); /* a block copy the backend refused */
    for (int32_t i = 0; e->offload && i < so->num_entries; i++) /* a consumer's producer copies not needed now */
        osp_offload_admitted(e->offload, so->entries[i].req);
    if (so->num_entries > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        const double now = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
        for (int32_t i = 0; i < so->num_entries; i++)
            if (so->entries[i].req->t_scheduled == 0) so->entries[i].req->t_scheduled = now;
    }
    struct timespec ts0, ts1;
    clock_gettime(CLOCK_MONOTONIC, &ts0);
    bool decode_only = so->num_entries > 0, drafted = false; /* for the speculation switch: every row a decode */
    for (int32_t i = 0; i < so->num_entries && decode_only; i++) {  /* or a verification row */
        decode_only = so->entries[i].num_scheduled_tokens == 1 + so->entries[i].num_spec;
        drafted |= so->entries[i].num_spec > 0;
    }
    if (e->timeline) timeline_flush(e); /* the last step's device times, before this run records its own */
    OSP_TRY(osp_runner_execute(e->runner, so));
    osp_scheduler_update(e->sched, so);
    /* a producer's finished prompts: held for their consumers now, while the freed blocks still hold
       their pages (nothing is allocated before the next schedule) */
    for (int32_t i = 0; e->offload && i < so->num_entries; i++) {
        osp_request *r = so->entries[i].req;
        if (r->state == OSP_REQ_FINISHED && r->has_kv_xfer && r->kv_xfer.do_remote_decode && r->kv_xfer_id == 0 &&
            (r->finish_reason == OSP_FINISH_STOP || r->finish_reason == OSP_FINISH_LENGTH))
            OSP_TRY(osp_offload_hold(e->offload, r));
    }
    if (e->p.kv_event_sink && e->p.kv_event_sink->end_step) e->p.kv_event_sink->end_step(e->p.kv_event_sink->ctx);
    int64_t gen = 0;
    for (int32_t i = 0; i < so->num_entries; i++) gen += so->entries[i].num_new_tokens;
    if (e->offload) OSP_TRY(osp_offload_status(e->offload)); /* evictions by forks save before the copies */
    for (int32_t i = 0; i < so->num_copies; i++) /* copy-on-write of forked children's partial blocks */
        OSP_TRY(osp_kv_cache_copy_block(e->runner->kv, so->copy_src[i], so->copy_dst[i]));
    if (e->p.check_invariants) OSP_TRY(osp_engine_check_invariants(e));
    /* drafts for the next step: the requests listed now, the proposer called once the outputs are out
       (a draft model's catch-up over a new prompt must not delay that prompt's first token) */
    if (e->proposer) collect_drafts(e, so);
    clock_gettime(CLOCK_MONOTONIC, &ts1);
    if (e->timeline && so->num_entries > 0) {
        osp_timeline_step *t = &e->tl_step;
        memset(t, 0, sizeof *t);
        t->step = e->tl_steps++;
        t->rows = so->num_entries, t->tokens = so->total_tokens, t->decode_only = decode_only;
        t->host[OSP_TL_SCHEDULE] = secs(tsch), t->host[OSP_TL_PREPARE] = secs(ts0);
        t->host[OSP_TL_FORWARD] = e->runner->t_forward[0], t->host[OSP_TL_SAMPLE] = e->runner->t_forward[1];
        t->host[OSP_TL_UPDATE] = e->runner->t_forward[2], t->host[OSP_TL_PHASES] = secs(ts1);
        e->tl_pending = true;
    }
    if (e->offload) osp_offload_note_step(e->offload, so->total_tokens, seconds(ts0, ts1));
    if (e->step_trace) { /* steps that ran rows, or moved blocks (a request waiting for its disk loads runs none) */
        const osp_offload_stats os1 = e->offload ? osp_offload_get_stats(e->offload) : (osp_offload_stats){0};
        const long long saved = (long long)(os1.saved_blocks - os0.saved_blocks),
                        host = (long long)(os1.host_loaded_blocks - os0.host_loaded_blocks),
                        disk = (long long)(os1.store.loaded[OSP_KV_TIER_DISK] - os0.store.loaded[OSP_KV_TIER_DISK]);
        if (so->num_entries > 0 || saved > 0 || host > 0 || disk > 0)
            fprintf(stderr,
                    "step trace: %d rows, %d tokens; schedule %.3f ms (offload: %lld blocks copied out of the pool "
                    "%.3f ms, %lld loaded from host memory %.3f ms, %lld disk loads finished), run %.3f ms\n",
                    so->num_entries, so->total_tokens, 1e3 * seconds(tsch, ts0), saved, 1e3 * (os1.save_s - os0.save_s),
                    host, 1e3 * (os1.host_load_s - os0.host_load_s), disk, 1e3 * seconds(ts0, ts1));
    }
    for (int32_t i = 0; i < so->num_entries; i++) /* sampled, or an embedding request finished */
        if (so->entries[i].sampled != -1 || so->entries[i].req->state == OSP_REQ_FINISHED) mark(e, so->entries[i].req);
    for (int32_t i = 0; i < so->num_touched; i++) {
        gen += osp_request_num_output(so->touched[i]);
        mark(e, so->touched[i]);
    }
    *did_work = so->num_entries > 0 || e->publish.n > 0;
    /* 3. publish */
    pthread_mutex_lock(&e->mu);
    const osp_scheduler_stats ss = osp_scheduler_get_stats(e->sched);
    if (so->num_entries > 0) {
        e->stats.num_steps++;
        int b = 0;
        while (b < OSP_ENGINE_ITERATION_BUCKETS && so->total_tokens > osp_engine_iteration_token_buckets[b]) b++;
        e->stats.iteration_tokens[b]++;
    }
    e->stats.num_generated_tokens += gen;
    e->stats.num_scheduled_tokens += so->total_tokens;
    if (e->sparse) {
        const osp_sparse_runtime_stats sp = osp_sparse_runtime_get_stats(e->sparse);
        e->stats.sparse_dense_tokens = sp.dense_tokens, e->stats.sparse_tokens = sp.sparse_tokens;
        e->stats.sparse_tiles_read = sp.tiles_read, e->stats.sparse_tiles_dense = sp.tiles_dense;
        e->stats.sparse_bytes_read = sp.bytes_read;
    }
    if (e->offload) {
        const osp_offload_stats os = osp_offload_get_stats(e->offload);
        e->stats.offload_host_blocks = os.store.blocks[OSP_KV_TIER_HOST];
        e->stats.offload_disk_blocks = os.store.blocks[OSP_KV_TIER_DISK];
        e->stats.offload_stored_blocks = os.store.stored[OSP_KV_TIER_HOST] + os.store.stored[OSP_KV_TIER_DISK];
        e->stats.offload_loaded_blocks = os.store.loaded[OSP_KV_TIER_HOST] + os.store.loaded[OSP_KV_TIER_DISK];
        e->stats.offload_corrupt_blocks = os.store.corrupt;
        e->stats.offload_hits_tokens = ss.tier_hits_tokens;
        e->stats.offload_skipped_tokens = ss.tier_skipped_tokens;
        e->stats.offload_write_errors = os.store.io_errors;
        e->stats.offload_missing_blocks = os.store.missing;
        e->stats.kv_transfer_held = os.producer.held;
        e->stats.kv_transfer_held_blocks = os.producer.held_blocks;
        e->stats.kv_transfer_sent_blocks = os.producer.sent_blocks;
        e->stats.kv_transfer_dropped = os.producer.dropped;
        e->stats.kv_transfer_recv_blocks = os.recv_blocks;
        e->stats.kv_transfer_failed_blocks = os.failed_blocks;
        e->stats.kv_transfer_recv_seconds = os.recv_s;
        e->stats.kv_transfer_ipc_blocks = os.recv_ipc_blocks; /* a producer's: osp_engine_get_stats adds them */
    }
    e->stats.num_preemptions = ss.num_preemptions;
    e->stats.prefix_queries_tokens = ss.prefix_queries_tokens;
    e->stats.prefix_hits_tokens = ss.prefix_hits_tokens;
    e->stats.num_running = ss.num_running;
    e->stats.num_waiting = ss.num_waiting;
    e->stats.num_free_blocks = osp_block_pool_num_free(osp_scheduler_pool(e->sched));
    e->stats.spec_num_drafts = ss.spec_num_drafts;
    e->stats.spec_num_draft_tokens = ss.spec_num_draft_tokens;
    e->stats.spec_num_accepted_tokens = ss.spec_num_accepted_tokens;
    memcpy(e->stats.spec_accepted_per_pos, ss.spec_accepted_per_pos, sizeof ss.spec_accepted_per_pos);
    int32_t n_cb = 0; /* keep only callback requests: a poller may free the others once unlocked */
    for (int32_t i = 0; i < e->publish.n; i++) {
        osp_request *r = e->publish.v[i];
        r->num_published = osp_request_num_output(r);
        r->published_cached_tokens = r->num_cached_tokens;
        r->published_t_scheduled = r->t_scheduled;
        if (r->state == OSP_REQ_FINISHED && !r->published_finished) {
            r->published_finished = true;
            r->published_reason = r->finish_reason;
            e->num_unfinished--;
        }
        if (r->callback) e->publish.v[n_cb++] = r;
    }
    e->publish.n = n_cb;
    pthread_cond_broadcast(&e->output);
    pthread_mutex_unlock(&e->mu);
    /* 4. callbacks (outside the lock); callback requests are forgotten when finished */
    for (int32_t i = 0; i < e->publish.n; i++) {
        osp_request *r = e->publish.v[i];
        const int32_t from = r->num_delivered, n = r->num_published - from;
        osp_request_output o;
        osp_token_logprobs *lp = NULL, *plp = NULL;
        const int32_t need = n + (r->prompt_lp ? r->num_prompt : 0);
        if ((r->logprobs || r->prompt_lp) && need > e->cb_cap) {
            osp_token_logprobs *b = realloc(e->cb_lp, sizeof *b * (size_t)need);
            if (b) e->cb_lp = b, e->cb_cap = need;
        }
        if (e->cb_lp && need <= e->cb_cap) lp = e->cb_lp, plp = e->cb_lp + n; /* no arithmetic on NULL */
        fill_output(r, from, n, r->tokens + r->num_prompt + from, r->logprobs ? lp : NULL, plp, r->published_finished,
                    true, osp_model_config_get(e->model)->n_embd, &o);
        r->num_delivered = r->num_published;
        r->callback(r->callback_user, &o);
        if (r->published_finished) {
            pthread_mutex_lock(&e->mu);
            const int32_t k = table_find(e, r->id);
            if (k >= 0) vec_del(&e->table, k);
            pthread_mutex_unlock(&e->mu);
            osp_request_destroy(r);
        }
    }
    if (e->proposer) {
        struct timespec ts2, ts3;
        clock_gettime(CLOCK_MONOTONIC, &ts2);
        const int32_t listed = e->spec_n;
        OSP_TRY(propose_drafts(e));
        clock_gettime(CLOCK_MONOTONIC, &ts3);
        const double step_sec = seconds(ts0, ts1), propose_sec = seconds(ts2, ts3);
        pthread_mutex_lock(&e->mu); /* the stats are read under it (osp_engine_get_stats) */
        if (listed > 0) e->stats.spec_propose_calls++, e->stats.spec_propose_seconds += propose_sec;
        if (drafted) e->stats.spec_verify_steps++, e->stats.spec_verify_seconds += step_sec;
        pthread_mutex_unlock(&e->mu);
        /* the switch times the step and the proposer, not the publishing between */
        if (decode_only && !e->p.speculative_fixed_k && !e->p.speculative_no_switch)
            osp_spec_switch_step(&e->sw, step_sec + propose_sec, gen, drafted);
    }
    return OSP_OK;
}

osp_status osp_engine_step(osp_engine *e, bool *did_work) {
    bool dummy;
    if (!did_work) did_work = &dummy;
    *did_work = false;
    if (e->thread_running) return osp_set_error(OSP_ERR_INVALID_ARG, "engine step: the loop thread is running");
    return step_locked_out(e, did_work);
}

/* The loader thread: a background KV load is ready for the next schedule. */
static void offload_loaded(void *ctx) {
    osp_engine *e = ctx;
    pthread_mutex_lock(&e->mu);
    e->offload_ready = true;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
}

static void *loop_main(void *arg) {
    osp_engine *e = arg;
    bool idle = false; /* the last step ran nothing while KV offload loads were in flight */
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop && e->num_unfinished == 0) pthread_cond_wait(&e->wake, &e->mu);
        if (idle) { /* wait for a load, a new request or an abort (each signals wake); 20 ms at most */
            struct timespec dl;
            clock_gettime(CLOCK_REALTIME, &dl);
            dl.tv_nsec += 20 * 1000000L;
            if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
            while (!e->stop && !e->offload_ready && e->pending.n == 0 &&
                   pthread_cond_timedwait(&e->wake, &e->mu, &dl) == 0) {
            }
        }
        e->offload_ready = false;
        const bool stop = e->stop;
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        bool did;
        osp_status s = step_locked_out(e, &did);
        idle = s == OSP_OK && !did && e->offload && osp_offload_busy(e->offload);
        if (s != OSP_OK) {
            pthread_mutex_lock(&e->mu);
            e->loop_status = s;
            e->stop = true;
            pthread_cond_broadcast(&e->output);
            pthread_mutex_unlock(&e->mu);
            break;
        }
    }
    return NULL;
}

osp_status osp_engine_start(osp_engine *e) {
    if (e->thread_running) return osp_set_error(OSP_ERR_INVALID_ARG, "engine start: already running");
    e->stop = false;
    e->loop_status = OSP_OK;
    if (pthread_create(&e->thread, NULL, loop_main, e) != 0)
        return osp_set_error(OSP_ERR_NOMEM, "engine start: cannot create the loop thread");
    e->thread_running = true;
    return OSP_OK;
}

osp_status osp_engine_stop(osp_engine *e) {
    if (!e->thread_running) return OSP_OK;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->thread_running = false;
    if (e->loop_status != OSP_OK) return osp_set_error(e->loop_status, "engine: the loop stopped on an error");
    return OSP_OK;
}

static osp_status poll_impl(osp_engine *e, uint64_t id, bool by_index, uint32_t sample_index, int32_t *tokens,
                            osp_token_logprobs *logprobs, int32_t cap, osp_token_logprobs *prompt_logprobs,
                            osp_request_output *out, int timeout_ms) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    if (timeout_ms > 0) {
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&e->mu);
    osp_status s = OSP_OK;
    for (;;) {
        const int32_t i = table_find_seq(e, id, by_index, sample_index);
        if (i < 0) {
            s = osp_set_error(OSP_ERR_NOT_FOUND, "poll: request %llu (sample %u) is unknown", (unsigned long long)id,
                              by_index ? sample_index : 0u);
            break;
        }
        osp_request *r = e->table.v[i];
        if (r->callback) {
            s = osp_set_error(OSP_ERR_NOT_FOUND, "poll: request %llu delivers to its callback", (unsigned long long)id);
            break;
        }
        const int32_t avail = r->num_published - r->num_delivered;
        if (avail > 0 || r->published_finished || timeout_ms == 0 || e->stop) {
            const int32_t n = avail < cap ? avail : (cap > 0 ? cap : 0);
            const bool done = r->published_finished && r->num_delivered + n == r->num_published;
            fill_output(r, r->num_delivered, n, tokens, logprobs, prompt_logprobs, done, false, 0, out);
            r->num_delivered += n;
            if (done) {
                vec_del(&e->table, i);
                osp_request_destroy(r);
            }
            break;
        }
        int rc = timeout_ms < 0 ? pthread_cond_wait(&e->output, &e->mu)
                                : pthread_cond_timedwait(&e->output, &e->mu, &deadline);
        if (rc == ETIMEDOUT) timeout_ms = 0;
    }
    pthread_mutex_unlock(&e->mu);
    return s;
}

osp_status osp_engine_poll(osp_engine *e, uint64_t id, int32_t *tokens, int32_t cap, osp_request_output *out,
                           int timeout_ms) {
    return poll_impl(e, id, false, 0, tokens, NULL, cap, NULL, out, timeout_ms);
}

osp_status osp_engine_poll_seq(osp_engine *e, uint64_t request_id, uint32_t sample_index, int32_t *tokens,
                               osp_token_logprobs *logprobs, int32_t cap, osp_token_logprobs *prompt_logprobs,
                               osp_request_output *out, int timeout_ms) {
    return poll_impl(e, request_id, true, sample_index, tokens, logprobs, cap, prompt_logprobs, out, timeout_ms);
}

osp_engine_stats osp_engine_get_stats(osp_engine *e) {
    pthread_mutex_lock(&e->mu);
    osp_engine_stats st = e->stats;
    pthread_mutex_unlock(&e->mu);
    osp_kv_xfer_server *xs = e->offload ? osp_offload_producer(e->offload) : NULL;
    if (xs) { /* a producer's transfers time out while no step runs: read them now (the server locks) */
        const osp_kv_xfer_server_stats ps = osp_kv_xfer_server_get_stats(xs);
        st.kv_transfer_held = ps.held, st.kv_transfer_held_blocks = ps.held_blocks;
        st.kv_transfer_sent_blocks = ps.sent_blocks, st.kv_transfer_dropped = ps.dropped;
        st.kv_transfer_ipc_blocks += ps.ipc_blocks; /* the step keeps the consumer's part */
    }
    return st;
}

osp_status osp_engine_check_invariants(osp_engine *e) {
    OSP_TRY(osp_scheduler_check_invariants(e->sched));
    const osp_scheduler_stats ss = osp_scheduler_get_stats(e->sched);
    const osp_persistent_batch *pb = e->runner->pb;
    if (pb->num_rows < ss.num_running - ss.num_running_without_row)
        return osp_set_error(OSP_ERR_INTERNAL, "engine: %d batch rows for %d running requests", pb->num_rows,
                             ss.num_running);
    return OSP_OK;
}
