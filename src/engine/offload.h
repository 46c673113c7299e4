/* The engine's side of tiered KV offload (src/kv/offload.h holds the blocks): blocks the pool evicts
 * are copied out of the KV cache into the store, and a waiting request's blocks found in the store are
 * loaded back into pool blocks at admission (the scheduler's osp_sched_tier) when the measured cost
 * model says loading beats recomputing.
 *
 * Cost model: loading one block takes the measured mean seconds of the last loads (an exponential
 * moving average of each load's wall time, from the store's read to the pages being written);
 * recomputing it takes block_size times the measured seconds per token of recent prompt-heavy steps
 * (steps of at least 64 tokens). Until both have been measured, loading is chosen. */
#ifndef OSP_ENGINE_OFFLOAD_H
#define OSP_ENGINE_OFFLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/scheduler.h"
#include "kv/offload.h"
#include "kv/transfer.h"
#include "osprey/kv_cache.h"
#include "osprey/kv_events.h"

typedef struct osp_offload osp_offload;

/* Identity of the KV a block holds, beyond its hash: the files of a disk tier are read only by an engine
 * with the same fingerprint. */
typedef struct osp_offload_identity {
    const char *model_path;     /* the GGUF file (its real path, size and modification time count for the
                                   disk tier; its size and content for a transfer's engine id), or NULL */
    const char *random_weights; /* with random_seed, instead of a file */
    uint64_t random_seed;
    int device;                 /* osp_device: the CPU and CUDA kernels round differently */
    bool exact, gpu_quant_weights;
    int cpu_activations;        /* osp_cpu_activations: one-level activations compute other KV values */
    osp_prefix_hash_algo hash_algo; /* the block hashes' algorithm and seed (a transfer's engine id: a */
    uint64_t hash_seed;             /* consumer with another seed finds no block, so it is refused early; */
    bool hash_seed_set;             /* the disk tier's hash identity: a directory's blocks of another are
                                       removed at start); false: the seed is this process's own */
} osp_offload_identity;

/* How the store is used: the tiers, and whether the cost model decides (false: every held block is
 * loaded). */
typedef struct osp_offload_config {
    osp_kv_offload_config tiers;  /* its listener is the engine's own (set here); no host_bytes and no
                                     disk_dir: no tiers (a transfer role only) */
    osp_kv_role role;             /* prefill/decode disaggregation; NONE: none */
    const char *xfer_ip;          /* a producer's listening address and port (kv/transfer.h) */
    int32_t xfer_port;
    size_t xfer_cap_bytes;        /* its held copies at most */
    double xfer_timeout_s;        /* and how long one waits for its consumer */
    bool no_cost_model;
    const osp_kv_event_sink *sink; /* KV events of the tiers (tier_stored / tier_removed), or NULL */
    osp_prefix_hash_algo hash_algo; /* the 64-bit form of hashes in events */
    void (*loaded)(void *ctx);     /* called by the loader thread when a background load is ready for
                                      the next schedule (the engine's idle loop waits for it); NULL: none */
    void *loaded_ctx;
    void (*log)(void *ctx, const char *line); /* warnings (failed disk writes, corrupt or missing blocks: at
                                      most one a minute, with counts; the disk directory found removed or
                                      replaced: one line each time, saying whether it was made again or the
                                      tier is off; a full disk that paused disk writes: one line each pause),
                                      on the step thread; at creation, one line each for the blocks of another
                                      hash identity and those over a smaller size removed from the directory;
                                      NULL: none */
    void *log_ctx;
} osp_offload_config;

/* Creates the store for `kv` (block bytes from osp_kv_cache_block_bytes) and hooks it to the scheduler's
 * pool (evictions) and admission (loads). Errors: those of osp_kv_offload_create, OSP_ERR_NOMEM. */
osp_status osp_offload_create(const osp_offload_config *cfg, const osp_offload_identity *id, osp_kv_cache *kv,
                              osp_scheduler *sched, osp_offload **out);
/* A producer: holds the prompt blocks of r, a do_remote_decode request that just finished (its block ids
 * still name its pages: call right after the step that finished it), for its consumer; sets
 * r->kv_xfer_id / kv_xfer_blocks (0 blocks: nothing held: a prompt shorter than a block, or no room).
 * Errors: a block copy the backend refused. */
osp_status osp_offload_hold(osp_offload *o, osp_request *r);
/* A consumer: r (do_remote_prefill) was admitted; its producer's copies are released (in the background)
 * unless its last load already did. */
void osp_offload_admitted(osp_offload *o, osp_request *r);
/* A producer's server (its stats may be read from any thread), or NULL. */
osp_kv_xfer_server *osp_offload_producer(const osp_offload *o);
/* The transfer role, listener and engine id (role NONE without one); o may be NULL. */
osp_kv_transfer_info osp_offload_transfer_info(const osp_offload *o);

/* Unhooks and frees (the scheduler must still exist). NULL is fine. */
void osp_offload_destroy(osp_offload *o, osp_scheduler *sched);

/* A step of `tokens` tokens took `seconds` (the cost model's prompt rate). */
void osp_offload_note_step(osp_offload *o, int32_t tokens, double seconds);

/* Whether background loads are in flight or waiting to be collected by the scheduler. */
bool osp_offload_busy(osp_offload *o);

/* The first error a hook met (a block copy the backend refused), or OSP_OK; the engine fails the step
 * with it, as any backend error. */
osp_status osp_offload_status(const osp_offload *o);

typedef struct osp_offload_stats {
    osp_kv_offload_stats store;   /* zero without tiers */
    osp_kv_xfer_server_stats producer; /* zero unless a producer */
    int64_t recv_blocks, failed_blocks; /* a consumer's: blocks loaded from producers, asked for but not loaded */
    int64_t recv_ipc_blocks;      /* of recv_blocks, those copied from a producer's device arena (CUDA IPC) */
    double recv_s;                /* the seconds those loads took */
    double load_s_per_block, prefill_s_per_token; /* the cost model's figures (0: not measured yet) */
    int64_t saved_blocks;         /* blocks copied out of the pool into the store at eviction */
    double save_s;                /* the seconds those copies took (on the step thread) */
    int64_t host_loaded_blocks;   /* blocks written into the pool from the host tier on the step thread */
    double host_load_s;           /* the seconds those writes took */
} osp_offload_stats;
osp_offload_stats osp_offload_get_stats(const osp_offload *o);

#endif
