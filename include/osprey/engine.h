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

#include "osprey/model.h"
#include "osprey/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct osp_engine osp_engine;

typedef enum osp_prefix_hash_algo {
    OSP_PREFIX_HASH_XXH3_128 = 0, /* libxxhash XXH3_128bits_withSeed (default) */
    OSP_PREFIX_HASH_SHA256 = 1,   /* sha256 truncated to 128 bits (FIPS 180-4) */
} osp_prefix_hash_algo;

typedef enum osp_sched_policy {
    OSP_SCHED_FCFS = 0,     /* arrival order */
    OSP_SCHED_PRIORITY = 1, /* lower `priority` first, then arrival order */
} osp_sched_policy;

typedef struct osp_engine_params {
    const char *model_path;         /* GGUF file */
    int n_threads;                  /* 0 = all cores */
    int32_t block_size;             /* tokens per KV block (16) */
    int64_t kv_cache_memory;        /* KV bytes over all layers (K and V); 0 = enough for max_num_seqs
                                       sequences of max_model_len */
    int32_t num_blocks;             /* > 0 overrides kv_cache_memory (tests) */
    osp_kv_dtype kv_dtype;          /* OSP_KV_DTYPE_F16 (default) or F32 */
    bool exact;                     /* fp32 activations in every matmul (osp_model_params.exact) */
    int32_t max_num_seqs;           /* running requests per step (256) */
    int32_t max_num_batched_tokens; /* token budget per step (2048) */
    int32_t max_model_len;          /* prompt + output tokens; 0 = the model's context length */
    bool enable_prefix_caching;     /* true */
    osp_prefix_hash_algo hash_algo; /* xxh3-128 */
    bool hash_seed_set;             /* false: a random per-process seed */
    uint64_t hash_seed;
    osp_sched_policy policy;        /* FCFS */
    bool check_invariants;          /* check the block pool and scheduler after every step (tests) */
} osp_engine_params;

osp_engine_params osp_engine_default_params(void);

typedef enum osp_finish_reason {
    OSP_FINISH_NONE = 0,    /* still running */
    OSP_FINISH_STOP = 1,    /* EOS or a stop token */
    OSP_FINISH_LENGTH = 2,  /* max_tokens or max_model_len */
    OSP_FINISH_ABORT = 3,   /* osp_engine_abort() */
} osp_finish_reason;

typedef struct osp_request_output osp_request_output;
/* Called on the step thread after each step that produced tokens for the request, and once when it
 * finishes; `out` is valid during the call only. Must not call back into the engine. A request with a
 * callback is not polled: its outputs go to the callback only, and the engine forgets it when it
 * finishes. */
typedef void (*osp_output_cb)(void *user, const osp_request_output *out);

/* One request. Arrays are copied by osp_engine_add(); the caller keeps ownership. */
typedef struct osp_request_params {
    uint64_t request_id;        /* unique among unfinished-and-unpolled requests */
    const int32_t *prompt;      /* [num_prompt] token ids */
    int32_t num_prompt;
    /* sampling (as src/sample/sampler.h; the full sampler's fields are added here) */
    float temperature;          /* 0 = greedy */
    int32_t top_k;              /* <= 0: off */
    float top_p;                /* >= 1: off */
    uint64_t seed;
    /* stops */
    int32_t max_tokens;         /* <= 0: up to max_model_len */
    int32_t min_tokens;         /* EOS and stop tokens are ignored before this many outputs */
    bool ignore_eos;
    const int32_t *stop_token_ids; /* [num_stop_token_ids] */
    int32_t num_stop_token_ids;
    /* scheduling and caching */
    int32_t priority;           /* OSP_SCHED_PRIORITY: lower runs first */
    uint64_t cache_salt;        /* extra key of the block hashes: requests see each other's cached
                                   prefixes only with the same salt (0 = none) */
    osp_output_cb callback;     /* optional */
    void *callback_user;
} osp_request_params;

osp_request_params osp_request_default_params(void); /* greedy, no limits, no callback */

struct osp_request_output {
    uint64_t request_id;
    const int32_t *token_ids;   /* new tokens since the last output (engine-owned in callbacks;
                                   the caller's buffer in osp_engine_poll) */
    int32_t num_tokens;
    int32_t num_output_tokens;  /* total generated so far */
    int32_t num_prompt_tokens;
    int32_t num_cached_tokens;  /* prompt tokens served from the prefix cache at first admission */
    bool finished;
    osp_finish_reason finish_reason;
};

typedef struct osp_engine_stats {
    int64_t num_steps;              /* steps that ran a forward pass */
    int64_t num_preemptions;
    int64_t prefix_queries_tokens;  /* tokens looked up in the prefix cache */
    int64_t prefix_hits_tokens;     /* of which served from it */
    int64_t num_generated_tokens;
    int64_t num_scheduled_tokens;   /* tokens that went through the model (prefill + decode) */
    int32_t num_blocks, num_free_blocks, block_size;
    int32_t num_running, num_waiting;
} osp_engine_stats;

/* Loads the model and sizes the KV cache. Errors: everything osp_model_load() returns;
 * OSP_ERR_INVALID_ARG for out-of-range params (message names the field; e.g. a budget that holds no
 * block, max_model_len above the model's context); OSP_ERR_NOMEM. */
osp_status osp_engine_create(const osp_engine_params *params, osp_engine **out);
/* Stops the loop thread if running, finishes nothing further, frees everything. NULL is fine. */
void osp_engine_free(osp_engine *e);

const osp_model *osp_engine_model(const osp_engine *e);
const osp_engine_params *osp_engine_params_get(const osp_engine *e); /* resolved values */

/* Queues a request (thread-safe). Admission checks happen here, synchronously:
 * OSP_ERR_INVALID_ARG for an empty prompt, a token outside the vocabulary, a duplicate id,
 * prompt + max_tokens > max_model_len, or a request that could not fit in the KV cache even alone.
 * Nothing is queued on error. */
osp_status osp_engine_add(osp_engine *e, const osp_request_params *rp);

/* Aborts a request (thread-safe): it finishes with OSP_FINISH_ABORT at the start of the next step and
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

osp_engine_stats osp_engine_get_stats(osp_engine *e); /* thread-safe snapshot */

/* Checks block pool and scheduler invariants (every request's blocks are referenced, free blocks
 * plus used blocks add up, ...). OSP_ERR_INTERNAL with a message. Not while the loop thread runs. */
osp_status osp_engine_check_invariants(osp_engine *e);

#ifdef __cplusplus
}
#endif
#endif
