/* The KV block pool: which of the cache's `num_blocks` pages are in use, by how many requests, and
 * which free pages still hold a cached prefix that a later request may reuse.
 *
 * Every block has a reference count. A block with count 0 is "free" and sits in one free queue in
 * eviction order: the head is taken first by osp_block_pool_alloc(). Freed blocks go to the tail, so
 * the least recently used cached block is evicted first (vLLM V1's FreeKVCacheBlockQueue). A full
 * block may carry a block hash (src/kv/prefix_cache.h); the pool maps hash -> block so a request
 * whose prefix hashes match can take the block back ("touch") instead of recomputing it. A cached
 * block is only forgotten when it is reallocated (evicted) or the cache is reset.
 *
 * Host-only (no model, no device); osp_block_pool_check_invariants() is the sanity checker that
 * tests and debug builds call after every step. Not thread-safe: the engine's step thread owns it. */
#ifndef OSP_KV_BLOCK_POOL_H
#define OSP_KV_BLOCK_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "osprey/engine.h"
#include "osprey/kv_events.h"
#include "osprey/status.h"

/* A block hash: 128 bits (xxh3-128, or the first 16 bytes of osprey's sha256) in lo, hi with ext
 * zero, or 256 bits (sha256_cbor: digest bytes 0-7, 8-15, 16-23, 24-31 as little-endian words in lo,
 * hi, ext[0], ext[1]). Equal hashes: all four words equal. */
typedef struct osp_block_hash {
    uint64_t lo, hi;
    uint64_t ext[2];
} osp_block_hash;

typedef struct osp_block_pool osp_block_pool;

typedef struct osp_block_pool_stats {
    int64_t num_evictions; /* cached blocks whose hash was dropped because the block was reused */
    int64_t num_cached;    /* blocks that carry a hash now (in use or free) */
} osp_block_pool_stats;

/* Creates a pool of `num_blocks` free blocks (ids 0..num_blocks-1, queued in id order).
 * enable_caching false makes osp_block_pool_cache() a no-op and lookups always miss.
 * Errors: OSP_ERR_INVALID_ARG (num_blocks <= 0), OSP_ERR_NOMEM. */
osp_status osp_block_pool_create(int32_t num_blocks, bool enable_caching, osp_block_pool **out);
void osp_block_pool_destroy(osp_block_pool *p); /* NULL is fine */

int32_t osp_block_pool_num_blocks(const osp_block_pool *p);
int32_t osp_block_pool_num_free(const osp_block_pool *p); /* ref count 0, cached or not */
int32_t osp_block_pool_ref_count(const osp_block_pool *p, int32_t id);
bool osp_block_pool_is_cached(const osp_block_pool *p, int32_t id);
osp_block_pool_stats osp_block_pool_get_stats(const osp_block_pool *p);

/* Takes `n` blocks from the head of the free queue into ids[0..n) with ref count 1; a taken block
 * that was cached loses its hash (eviction). All or nothing: OSP_ERR_NOMEM (message set) when fewer
 * than n blocks are free, and then nothing changes. n == 0 succeeds. */
osp_status osp_block_pool_alloc(osp_block_pool *p, int32_t n, int32_t *ids);

/* Drops one reference from each of ids[0..n). Blocks reaching 0 join the tail of the free queue in
 * the order given (so pass a request's blocks last-first: its tail is evicted before its shared
 * prefix). Cached blocks keep their hash. Each block must have a positive ref count (checked by
 * assert only). */
void osp_block_pool_release(osp_block_pool *p, const int32_t *ids, int32_t n);

/* Adds one reference to each of ids[0..n) (a prefix-cache hit or a fork). A free block leaves the
 * free queue. */
void osp_block_pool_touch(osp_block_pool *p, const int32_t *ids, int32_t n);

/* The block cached under `h`, or -1. Never changes the pool. */
int32_t osp_block_pool_lookup(const osp_block_pool *p, const osp_block_hash *h);

/* Records that block `id` (in use, full) holds the content hashed by `h`. If another block already
 * carries `h`, or `id` already carries a hash, nothing changes (the first block wins). */
void osp_block_pool_cache(osp_block_pool *p, int32_t id, const osp_block_hash *h);

/* osp_block_pool_cache, and when a sink is set and the block was cached, reports BlockStored: parent
 * is the previous block's hash (NULL for a first block), tokens[0..n_tokens) the block's token ids. */
void osp_block_pool_cache_block(osp_block_pool *p, int32_t id, const osp_block_hash *h, const osp_block_hash *parent,
                                const int32_t *tokens, int32_t n_tokens);

/* Reports every change of the cached set to `sink` from now on (NULL: none): a block cached
 * (osp_block_pool_cache_block; plain osp_block_pool_cache reports no tokens), a hash dropped (eviction
 * on alloc, free_tail), the cache reset. Hashes go out in their 64-bit form for `algo`
 * (osp_block_hash_external). The sink must outlive the pool or be replaced. */
void osp_block_pool_set_event_sink(osp_block_pool *p, const osp_kv_event_sink *sink, osp_prefix_hash_algo algo);

/* Called by osp_block_pool_alloc once per allocation that evicts: ids[0..n) are the cached blocks it takes,
 * in the order taken, hashes[0..n) the hashes they carry (both arrays the pool's, valid during the call),
 * before any hash is dropped. The blocks' pages still hold the hashes' KV then (nothing has written them
 * since they were freed), so a tiered store (src/kv/offload.h) can copy them out, all in one transfer. */
typedef void (*osp_block_evict_fn)(void *ctx, int32_t n, const int32_t *ids, const osp_block_hash *hashes);
/* NULL fn: none. OSP_ERR_NOMEM when the hook's scratch arrays (num_blocks ids and hashes) cannot be had;
 * the hook is then unchanged. */
osp_status osp_block_pool_set_evict_hook(osp_block_pool *p, osp_block_evict_fn fn, void *ctx);

/* Drops the hash block `id` carries (a BlockRemoved event), if any; the block stays where it is. For
 * blocks whose pages will never hold the hash's KV (a request preempted before the step that would
 * have computed them). */
void osp_block_pool_uncache(osp_block_pool *p, int32_t id);

/* The hash block `id` carries: true and *out, or false when it carries none. */
bool osp_block_pool_block_hash(const osp_block_pool *p, int32_t id, osp_block_hash *out);

/* Forgets every hash (free blocks stay free). */
void osp_block_pool_reset_cache(osp_block_pool *p);

/* Fork for n > 1 children: a request holding blocks ids[0..n_blocks) for `num_tokens` tokens gives
 * the child the same blocks for every full block (one more reference each) and a fresh block for a
 * partial last block (copy-on-write: the caller copies the K/V of block *cow_src into *cow_dst before
 * either writes to it). Without a partial last block *cow_src = *cow_dst = -1.
 * child_ids: [n_blocks]. Errors: OSP_ERR_NOMEM if the fresh block is not available (nothing changes),
 * OSP_ERR_INVALID_ARG if n_blocks != ceil(num_tokens / block_size). */
osp_status osp_block_pool_fork(osp_block_pool *p, const int32_t *ids, int32_t n_blocks, int32_t num_tokens,
                               int32_t block_size, int32_t *child_ids, int32_t *cow_src, int32_t *cow_dst);

/* Rollback (e.g. rejected speculative tokens): a request holding ids[0..*n_blocks) keeps only what
 * `new_num_tokens` tokens need; the blocks beyond are released (last first) and *n_blocks shrinks. A
 * kept last block that becomes partial and is held only by this request loses its hash; one shared
 * with others cannot be rolled into (OSP_ERR_INVALID_ARG, nothing changes). */
osp_status osp_block_pool_free_tail(osp_block_pool *p, int32_t *ids, int32_t *n_blocks, int32_t new_num_tokens,
                                    int32_t block_size);

/* Checks every invariant: ref counts >= 0; the free queue is a consistent doubly linked list holding
 * exactly the blocks with ref count 0, num_free of them; every hash-table entry points at a block that
 * carries that hash and every hashed block is in the table once. Returns OSP_OK or OSP_ERR_INTERNAL
 * with a message naming the first violation. O(num_blocks). */
osp_status osp_block_pool_check_invariants(const osp_block_pool *p);

#endif
