/* Automatic prefix caching: chained block hashes and the longest cached prefix of a request.
 *
 * Block i of a request (tokens [i*B, (i+1)*B)) hashes to H(seed, H_{i-1}, tokens, extra keys), the
 * first block's parent being a fixed "none" value, so equal hashes mean equal whole prefixes (vLLM's
 * hash_block_tokens). Extra keys are a per-request cache salt now and adapter ids later. The seed is
 * random per process unless one is given: replicas behind one router share a seed so their hashes
 * agree (and agree with what the router computes from token ids).
 *
 * sha256_cbor is vLLM's algorithm of that name (vllm/utils/hashing.py, kv_cache_utils.py):
 *   NONE_HASH = sha256(cbor(str(seed)))            the seed as a decimal text string (PYTHONHASHSEED)
 *   H_i       = sha256(cbor([H_{i-1} or NONE_HASH as a 32-byte byte string, [token ids...], extra]))
 * with cbor2's canonical encoding (RFC 8949 §4.2.1: shortest heads, definite lengths); extra is CBOR
 * null without extra keys, else [extra as one byte string] (osprey's salt is a 64-bit hash of the
 * request's cache_salt, so salted hashes are osprey's own; vLLM hashes the salt text in block 0).
 * Unseeded, NONE_HASH comes from the random process seed the same way. */
#ifndef OSP_KV_PREFIX_CACHE_H
#define OSP_KV_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kv/block_pool.h"
#include "osprey/engine.h"

typedef struct osp_prefix_hasher {
    osp_prefix_hash_algo algo;
    uint64_t seed;
    uint8_t none_hash[32]; /* sha256_cbor: the first block's parent, sha256(cbor(decimal seed)) */
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

/* The 64-bit form of a block hash that llm-d's KV-event index and vLLM's KV events
 * (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES) carry: the last 8 bytes of the hash's byte string read as a
 * big-endian unsigned integer. Byte strings: xxh3-128 its canonical form (XXH128_canonicalFromHash:
 * high64 then low64, big-endian, so the value is h->lo); osprey's sha256 the 16 kept digest bytes;
 * sha256_cbor the 32 digest bytes. */
uint64_t osp_block_hash_external(const osp_block_hash *h, osp_prefix_hash_algo algo);

/* Appends the head of a CBOR data item (RFC 8949 §3: major type 0-7, argument v) in its shortest
 * form (§4.2.1) to out[0..9); returns its length (1, 2, 3, 5 or 9). Exposed for the tests. */
size_t osp_cbor_head(uint8_t out[9], unsigned major, uint64_t v);

/* SHA-256 of data[0..len) into out[32] (FIPS 180-4), exposed for the tests. */
void osp_sha256(const void *data, size_t len, uint8_t out[32]);

#endif
