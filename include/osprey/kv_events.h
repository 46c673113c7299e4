/* KV cache events: every block the prefix cache stores or forgets, published so that a router (llm-d's
 * KV-cache indexer, NVIDIA Dynamo's KV router, `osprey router`) knows which replica holds which prefix.
 *
 * Two layers. The engine's block pool reports to an osp_kv_event_sink (callbacks on the engine's step
 * thread; the engine knows nothing of transports). osp_kv_publisher is the sink that speaks vLLM's
 * wire format (vllm/distributed/kv_events.py): one msgpack EventBatch per engine step that changed the
 * cache, sent on a ZeroMQ PUB socket as three frames [topic, 8-byte big-endian sequence number,
 * payload], with an optional ROUTER endpoint that replays the last `buffer_steps` batches from a
 * requested sequence number. Its configuration is vLLM's --kv-events-config JSON (KVEventsConfig). */
#ifndef OSPREY_KV_EVENTS_H
#define OSPREY_KV_EVENTS_H

#include <stdbool.h>
#include <stdint.h>

#include "osprey/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Callbacks from the block pool, all on the engine's step thread, in the order the cache changed.
 * Hashes are the 64-bit form llm-d reads (the last 8 bytes of the block hash, big-endian; see
 * osp_block_hash_external in src/kv/prefix_cache.h). Any callback may be NULL. */
typedef struct osp_kv_event_sink {
    void *ctx;
    /* A full block entered the prefix cache: its hash, its parent's (has_parent false for a first
     * block), tokens[0..n_tokens) its token ids (valid during the call only). */
    void (*block_stored)(void *ctx, uint64_t hash, bool has_parent, uint64_t parent, const int32_t *tokens,
                         int32_t n_tokens);
    /* A cached block was forgotten (evicted for reuse, or rolled back into). */
    void (*block_removed)(void *ctx, uint64_t hash);
    /* A block entered / left a tier below the cache (KV offload, src/kv/offload.h), whose medium is
     * "CPU" (host memory) or "DISK". Offloaded blocks carry no parent and no tokens: the pool's
     * block_stored gave them when the block was computed. NULL: tier changes are not reported. */
    void (*tier_stored)(void *ctx, uint64_t hash, const char *medium);
    void (*tier_removed)(void *ctx, uint64_t hash, const char *medium);
    /* Every cached block was forgotten at once (a cache reset). */
    void (*all_cleared)(void *ctx);
    /* The engine finished a step: what was reported since the last call is one batch. */
    void (*end_step)(void *ctx);
} osp_kv_event_sink;

/* vLLM's KVEventsConfig (vllm/config/kv_events.py), key for key. */
typedef struct osp_kv_events_config {
    bool enable_kv_cache_events; /* false: no events at all (default) */
    bool publisher_zmq;          /* "publisher": "zmq" (default when enabled) or "null" (events dropped) */
    char endpoint[256];          /* PUB address, tcp://(star):5557 by default; bound when it has '*', '::', ipc:// or
                                    inproc://, else connected (vLLM's rule) */
    char replay_endpoint[256];   /* ROUTER address for replays, "" (null) for none; always bound */
    int64_t buffer_steps;        /* batches kept for replay (10000), >= 1 */
    int64_t hwm;                 /* PUB high-water mark in messages (100000), >= 0 */
    int64_t max_queue_size;      /* accepted for compatibility (100000), >= 1; batches are sent from the
                                    step thread, so nothing queues */
    char topic[256];             /* first frame; "" is a valid topic */
    bool topic_set;              /* false: the caller picks (osprey serve: "kv@<pod>@<model>") */
} osp_kv_events_config;

/* The defaults above (events off). */
osp_kv_events_config osp_kv_events_default_config(void);

/* Parses vLLM's --kv-events-config JSON object into *out (starting from the defaults). Unknown keys,
 * wrong types, out-of-range numbers, strings too long for the fields and a "publisher" other than
 * "null" or "zmq" are errors: OSP_ERR_INVALID_ARG with a message naming the key; *out is then left
 * unchanged. text: NUL-terminated. */
osp_status osp_kv_events_config_parse(const char *text, osp_kv_events_config *out);

typedef struct osp_kv_publisher osp_kv_publisher;

typedef struct osp_kv_publisher_params {
    int32_t block_size;       /* BlockStored.block_size */
    const char *medium;       /* BlockStored/BlockRemoved.medium: "GPU" (vLLM's) or "CPU" */
    bool array_like;          /* the older positional form: events as [tag, fields...] arrays and the
                                 batch as [ts, events, data_parallel_rank] (msgspec array_like=True);
                                 false: maps tagged "type" (vLLM's current form) */
    const char *topic;        /* overrides cfg->topic when cfg->topic_set is false; NULL: "" */
} osp_kv_publisher_params;

/* Opens the sockets (binding/connecting now, so a bad endpoint fails here) and starts the replay
 * thread when cfg->replay_endpoint is set. With cfg->publisher_zmq false the publisher drops every
 * batch (vLLM's NullEventPublisher) but still counts them. Errors: OSP_ERR_INVALID_ARG (bad params),
 * OSP_ERR_IO (ZeroMQ refused an endpoint; the message names it), OSP_ERR_NOMEM. */
osp_status osp_kv_publisher_create(const osp_kv_events_config *cfg, const osp_kv_publisher_params *p,
                                   osp_kv_publisher **out);
/* Stops the replay thread and closes the sockets (unsent messages dropped). NULL is fine. */
void osp_kv_publisher_free(osp_kv_publisher *pub);
/* The sink to hand to osp_engine_params.kv_event_sink; valid while pub lives. */
const osp_kv_event_sink *osp_kv_publisher_sink(osp_kv_publisher *pub);
/* Batches published so far (the next sequence number). Thread-safe. */
uint64_t osp_kv_publisher_num_batches(osp_kv_publisher *pub);

#ifdef __cplusplus
}
#endif

#endif
