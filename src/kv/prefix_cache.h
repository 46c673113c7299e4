/* Automatic prefix caching: chained block hashes and the longest cached prefix of a request.
 *
 * Block i of a request (tokens [i*B, (i+1)*B)) hashes to H(seed, H_{i-1}, tokens, extra keys), the
 * first block's parent being a fixed "none" value, so equal hashes mean equal whole prefixes (vLLM's
 * hash_block_tokens). Extra keys are a per-request cache salt now and adapter ids later. The seed is
 * random per process unless one is given, so hashes cannot be predicted across processes. */
#ifndef OSP_KV_PREFIX_CACHE_H
#define OSP_KV_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kv/block_pool.h"
#include "osprey/engine.h"

typedef struct osp_prefix_hasher {
    osp_prefix_hash_algo algo;
    uint64_t seed;
} osp_prefix_hasher;

/* A hasher for `algo` seeded with `seed` if seed_set, else with the process's random seed (drawn
 * once from getrandom(); the same for every hasher in the process). */
osp_prefix_hasher osp_prefix_hasher_make(osp_prefix_hash_algo algo, bool seed_set, uint64_t seed);

/* Hash of one block: `parent` is the previous block's hash (NULL for the first block), tokens[0..n)
 * its token ids, extra[0..extra_len) its extra keys (may be NULL with 0). */
osp_block_hash osp_prefix_hash_block(const osp_prefix_hasher *h, const osp_block_hash *parent,
                                     const int32_t *tokens, int32_t n, const void *extra, size_t extra_len);

/* The longest run of cached blocks: for i = 0.. while hashes[i] is cached, ids[i] = its block.
 * Returns how many (0..n). Does not touch the blocks. */
int32_t osp_prefix_cache_match(const osp_block_pool *p, const osp_block_hash *hashes, int32_t n, int32_t *ids);

/* SHA-256 of data[0..len) into out[32] (FIPS 180-4), exposed for the tests. */
void osp_sha256(const void *data, size_t len, uint8_t out[32]);

#endif
