/* The router's precise prefix index: which backend holds which KV block, rebuilt from the backends'
 * KV events (include/osprey/kv_events.h: vLLM's ZeroMQ stream, both msgpack forms). One subscriber
 * thread reads every backend's PUB endpoint; BlockStored adds its hashes to that backend's set,
 * BlockRemoved removes them, AllBlocksCleared empties it. Each medium counts on its own (the KV pool,
 * "GPU" or "CPU", and the offload tiers below it, "CPU" and "DISK"): a backend holds a block while any
 * of its media does. A sequence gap (a batch lost) is counted and
 * logged; the set may then be stale until the blocks change again (the router's picker only ranks
 * with it, it never trusts it for correctness). */
#ifndef OSPREY_TOOLS_ROUTER_KV_INDEX_H
#define OSPREY_TOOLS_ROUTER_KV_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rt_kv_index rt_kv_index;

/* Subscribes to endpoints[0..n) (NULL or "" for a backend without events; at most 64). replay (NULL, or
 * [n] with NULL / "" for none) are the backends' replay endpoints (--kv-events-config's replay_endpoint):
 * when a backend's sequence numbers jump, the batches in between are asked for there and applied in
 * order before the new one (waiting up to a second); only what is still missing then counts as a gap.
 * Returns NULL with *why set when ZeroMQ refuses an endpoint or memory runs out. */
rt_kv_index *rt_kv_index_start(const char *const *endpoints, const char *const *replay, int32_t n, char *why,
                               size_t why_cap);
void rt_kv_index_stop(rt_kv_index *x); /* NULL is fine */

/* Whether backend b has an event source. */
bool rt_kv_index_has(const rt_kv_index *x, int32_t b);

/* For each backend b with an event source: prefix[b] = how many of hashes[0..k) it holds, counting
 * from the first until one is missing. Backends without a source get -1. Thread-safe. */
void rt_kv_index_match(rt_kv_index *x, const uint64_t *hashes, int32_t k, int32_t *prefix);

/* Applies one msgpack EventBatch (either form) to backend b's set; false when the payload does not
 * decode as one (nothing applied). Exposed for the tests; the thread calls it. */
bool rt_kv_index_apply(rt_kv_index *x, int32_t b, const char *payload, size_t len);

/* Blocks backend b holds now (a block in two media counts twice); batches seen, gaps left in their
 * sequence numbers, and batches recovered from the replay endpoint. */
int64_t rt_kv_index_size(rt_kv_index *x, int32_t b);
void rt_kv_index_counts(rt_kv_index *x, int32_t b, int64_t *batches, int64_t *gaps, int64_t *replayed);

#endif
