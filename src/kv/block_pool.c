/* The KV block pool (see block_pool.h): reference counts, one free queue in eviction order (an
 * intrusive doubly linked list over block ids, so taking a block out of the middle on a cache hit is
 * O(1)), and an open-addressing index from block hash to block id (kv/hash_index.h). */
#include "kv/block_pool.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"
#include "kv/hash_index.h"
#include "kv/prefix_cache.h"

typedef struct block {
    int32_t ref_cnt;
    int32_t prev, next; /* free-queue links, -1 at the ends; meaningful only when ref_cnt == 0 */
    bool has_hash;
    osp_block_hash hash;
} block;

struct osp_block_pool {
    int32_t num_blocks, num_free;
    bool caching;
    block *blocks;       /* [num_blocks] */
    int32_t head, tail;  /* free queue: head is evicted first; -1 when empty */
    osp_hash_index index; /* block hash -> block id (the hash in blocks[id].hash) */
    osp_block_pool_stats stats;
    const osp_kv_event_sink *sink; /* KV events, or NULL */
    osp_prefix_hash_algo algo;     /* the 64-bit form of hashes in events */
    osp_block_evict_fn evict_fn;   /* eviction hook, or NULL */
    void *evict_ctx;
    int32_t *evict_ids;            /* [num_blocks] scratch for the hook's batch (with the hook only) */
    osp_block_hash *evict_hashes;  /* [num_blocks] */
};

/* ---- free queue ------------------------------------------------------------------------------ */

static void fq_push_tail(osp_block_pool *p, int32_t id) {
    block *b = &p->blocks[id];
    b->prev = p->tail;
    b->next = -1;
    if (p->tail >= 0) p->blocks[p->tail].next = id;
    else p->head = id;
    p->tail = id;
    p->num_free++;
}

static void fq_remove(osp_block_pool *p, int32_t id) {
    block *b = &p->blocks[id];
    if (b->prev >= 0) p->blocks[b->prev].next = b->next;
    else p->head = b->next;
    if (b->next >= 0) p->blocks[b->next].prev = b->prev;
    else p->tail = b->prev;
    b->prev = b->next = -1;
    p->num_free--;
}

/* ---- hash table (kv/hash_index.h) ----------------------------------------------------------- */

static int64_t table_find(const osp_block_pool *p, const osp_block_hash *h) { return osp_hash_index_find(&p->index, h); }

static void uncache(osp_block_pool *p, int32_t id) {
    block *b = &p->blocks[id];
    if (!b->has_hash) return;
    if (p->sink && p->sink->block_removed) p->sink->block_removed(p->sink->ctx, osp_block_hash_external(&b->hash, p->algo));
    const int64_t i = table_find(p, &b->hash);
    assert(i >= 0 && p->index.slot[i] == id);
    if (i >= 0) osp_hash_index_delete_at(&p->index, (uint32_t)i);
    b->has_hash = false;
    p->stats.num_cached--;
}

/* ---- public ---------------------------------------------------------------------------------- */

osp_status osp_block_pool_create(int32_t num_blocks, bool enable_caching, osp_block_pool **out) {
    *out = NULL;
    if (num_blocks <= 0) return osp_set_error(OSP_ERR_INVALID_ARG, "block pool: num_blocks %d must be > 0", num_blocks);
    osp_block_pool *p = calloc(1, sizeof *p);
    if (!p) return osp_set_error(OSP_ERR_NOMEM, "block pool: out of memory");
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)num_blocks) cap *= 2;
    p->blocks = calloc((size_t)num_blocks, sizeof *p->blocks);
    p->index = (osp_hash_index){.slot = malloc(sizeof(int32_t) * cap), .mask = cap - 1,
                                .base = (const char *)p->blocks + offsetof(block, hash), .stride = sizeof(block)};
    if (!p->blocks || !p->index.slot) {
        osp_block_pool_destroy(p);
        return osp_set_error(OSP_ERR_NOMEM, "block pool: out of memory for %d blocks", num_blocks);
    }
    memset(p->index.slot, 0xff, sizeof(int32_t) * cap);
    p->num_blocks = num_blocks;
    p->caching = enable_caching;
    p->head = p->tail = -1;
    for (int32_t i = 0; i < num_blocks; i++) fq_push_tail(p, i);
    *out = p;
    return OSP_OK;
}

void osp_block_pool_destroy(osp_block_pool *p) {
    if (!p) return;
    free(p->blocks);
    free(p->index.slot);
    free(p->evict_ids);
    free(p->evict_hashes);
    free(p);
}

int32_t osp_block_pool_num_blocks(const osp_block_pool *p) { return p->num_blocks; }
int32_t osp_block_pool_num_free(const osp_block_pool *p) { return p->num_free; }
int32_t osp_block_pool_ref_count(const osp_block_pool *p, int32_t id) { return p->blocks[id].ref_cnt; }
bool osp_block_pool_is_cached(const osp_block_pool *p, int32_t id) { return p->blocks[id].has_hash; }
osp_block_pool_stats osp_block_pool_get_stats(const osp_block_pool *p) { return p->stats; }

osp_status osp_block_pool_alloc(osp_block_pool *p, int32_t n, int32_t *ids) {
    if (n < 0 || n > p->num_free)
        return osp_set_error(OSP_ERR_NOMEM, "block pool: %d blocks wanted, %d free", n, p->num_free);
    if (p->evict_fn) { /* the cached blocks this takes, all told at once while their pages still hold them */
        int32_t ne = 0;
        for (int32_t i = 0, id = p->head; i < n; i++, id = p->blocks[id].next)
            if (p->blocks[id].has_hash) p->evict_ids[ne] = id, p->evict_hashes[ne++] = p->blocks[id].hash;
        if (ne > 0) p->evict_fn(p->evict_ctx, ne, p->evict_ids, p->evict_hashes);
    }
    for (int32_t i = 0; i < n; i++) {
        const int32_t id = p->head;
        fq_remove(p, id);
        if (p->blocks[id].has_hash) {
            uncache(p, id);
            p->stats.num_evictions++;
        }
        p->blocks[id].ref_cnt = 1;
        ids[i] = id;
    }
    return OSP_OK;
}

osp_status osp_block_pool_set_evict_hook(osp_block_pool *p, osp_block_evict_fn fn, void *ctx) {
    if (fn && !p->evict_ids) {
        p->evict_ids = malloc(sizeof *p->evict_ids * (size_t)p->num_blocks);
        p->evict_hashes = malloc(sizeof *p->evict_hashes * (size_t)p->num_blocks);
        if (!p->evict_ids || !p->evict_hashes) {
            free(p->evict_ids);
            free(p->evict_hashes);
            p->evict_ids = NULL, p->evict_hashes = NULL;
            return osp_set_error(OSP_ERR_NOMEM, "block pool: out of memory for the eviction hook's %d blocks",
                                 p->num_blocks);
        }
    }
    p->evict_fn = fn;
    p->evict_ctx = ctx;
    return OSP_OK;
}

void osp_block_pool_uncache(osp_block_pool *p, int32_t id) { uncache(p, id); }

void osp_block_pool_release(osp_block_pool *p, const int32_t *ids, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        block *b = &p->blocks[ids[i]];
        assert(b->ref_cnt > 0);
        if (--b->ref_cnt == 0) fq_push_tail(p, ids[i]);
    }
}

void osp_block_pool_touch(osp_block_pool *p, const int32_t *ids, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        block *b = &p->blocks[ids[i]];
        if (b->ref_cnt++ == 0) fq_remove(p, ids[i]);
    }
}

int32_t osp_block_pool_lookup(const osp_block_pool *p, const osp_block_hash *h) {
    if (!p->caching) return -1;
    const int64_t i = table_find(p, h);
    return i < 0 ? -1 : p->index.slot[i];
}

void osp_block_pool_cache(osp_block_pool *p, int32_t id, const osp_block_hash *h) {
    osp_block_pool_cache_block(p, id, h, NULL, NULL, 0);
}

void osp_block_pool_cache_block(osp_block_pool *p, int32_t id, const osp_block_hash *h, const osp_block_hash *parent,
                                const int32_t *tokens, int32_t n_tokens) {
    block *b = &p->blocks[id];
    if (!p->caching || b->has_hash || table_find(p, h) >= 0) return;
    b->hash = *h;
    b->has_hash = true;
    osp_hash_index_put(&p->index, id);
    p->stats.num_cached++;
    if (p->sink && p->sink->block_stored)
        p->sink->block_stored(p->sink->ctx, osp_block_hash_external(h, p->algo), parent != NULL,
                              parent ? osp_block_hash_external(parent, p->algo) : 0, tokens, tokens ? n_tokens : 0);
}

void osp_block_pool_set_event_sink(osp_block_pool *p, const osp_kv_event_sink *sink, osp_prefix_hash_algo algo) {
    p->sink = sink;
    p->algo = algo;
}

bool osp_block_pool_block_hash(const osp_block_pool *p, int32_t id, osp_block_hash *out) {
    if (id < 0 || id >= p->num_blocks || !p->blocks[id].has_hash) return false;
    *out = p->blocks[id].hash;
    return true;
}

void osp_block_pool_reset_cache(osp_block_pool *p) {
    if (p->sink && p->sink->all_cleared && p->stats.num_cached > 0) p->sink->all_cleared(p->sink->ctx);
    for (int32_t i = 0; i < p->num_blocks; i++) p->blocks[i].has_hash = false;
    memset(p->index.slot, 0xff, sizeof(int32_t) * ((size_t)p->index.mask + 1));
    p->stats.num_cached = 0;
}

osp_status osp_block_pool_fork(osp_block_pool *p, const int32_t *ids, int32_t n_blocks, int32_t num_tokens,
                               int32_t block_size, int32_t *child_ids, int32_t *cow_src, int32_t *cow_dst) {
    if (num_tokens < 0 || block_size <= 0 || n_blocks != (num_tokens + block_size - 1) / block_size)
        return osp_set_error(OSP_ERR_INVALID_ARG, "block pool fork: %d blocks do not hold %d tokens of block size %d",
                             n_blocks, num_tokens, block_size);
    const bool partial = num_tokens % block_size != 0;
    const int32_t shared = partial ? n_blocks - 1 : n_blocks;
    *cow_src = *cow_dst = -1;
    if (partial) {
        OSP_TRY(osp_block_pool_alloc(p, 1, &child_ids[n_blocks - 1]));
        *cow_src = ids[n_blocks - 1];
        *cow_dst = child_ids[n_blocks - 1];
    }
    memcpy(child_ids, ids, sizeof *ids * (size_t)shared);
    osp_block_pool_touch(p, ids, shared);
    return OSP_OK;
}

osp_status osp_block_pool_free_tail(osp_block_pool *p, int32_t *ids, int32_t *n_blocks, int32_t new_num_tokens,
                                    int32_t block_size) {
    const int32_t keep = (new_num_tokens + block_size - 1) / block_size;
    if (new_num_tokens < 0 || keep > *n_blocks)
        return osp_set_error(OSP_ERR_INVALID_ARG, "block pool free_tail: %d tokens need %d blocks, request holds %d",
                             new_num_tokens, keep, *n_blocks);
    const bool partial = new_num_tokens % block_size != 0;
    if (partial && p->blocks[ids[keep - 1]].ref_cnt > 1)
        return osp_set_error(OSP_ERR_INVALID_ARG, "block pool free_tail: block %d is shared and would be overwritten",
                             ids[keep - 1]);
    for (int32_t i = *n_blocks - 1; i >= keep; i--) osp_block_pool_release(p, &ids[i], 1);
    if (partial) uncache(p, ids[keep - 1]);
    *n_blocks = keep;
    return OSP_OK;
}

osp_status osp_block_pool_check_invariants(const osp_block_pool *p) {
    int32_t n_zero = 0, n_hashed = 0;
    for (int32_t i = 0; i < p->num_blocks; i++) {
        const block *b = &p->blocks[i];
        if (b->ref_cnt < 0) return osp_set_error(OSP_ERR_INTERNAL, "block pool: block %d has ref count %d", i, b->ref_cnt);
        n_zero += b->ref_cnt == 0;
        if (b->has_hash) {
            n_hashed++;
            const int64_t s = table_find(p, &b->hash);
            if (s < 0 || p->index.slot[s] != i)
                return osp_set_error(OSP_ERR_INTERNAL, "block pool: cached block %d is not in the hash table", i);
        }
    }
    if (n_zero != p->num_free)
        return osp_set_error(OSP_ERR_INTERNAL, "block pool: %d blocks have ref count 0 but num_free is %d", n_zero,
                             p->num_free);
    int32_t walked = 0, prev = -1;
    for (int32_t id = p->head; id >= 0; id = p->blocks[id].next) {
        if (id >= p->num_blocks || walked > p->num_blocks)
            return osp_set_error(OSP_ERR_INTERNAL, "block pool: free queue is corrupt at block %d", id);
        if (p->blocks[id].ref_cnt != 0)
            return osp_set_error(OSP_ERR_INTERNAL, "block pool: block %d is in the free queue with ref count %d", id,
                                 p->blocks[id].ref_cnt);
        if (p->blocks[id].prev != prev)
            return osp_set_error(OSP_ERR_INTERNAL, "block pool: free queue back link of block %d is wrong", id);
        prev = id;
        walked++;
    }
    if (prev != p->tail || walked != p->num_free)
        return osp_set_error(OSP_ERR_INTERNAL, "block pool: free queue holds %d blocks, num_free is %d", walked,
                             p->num_free);
    int32_t in_table = 0;
    for (uint32_t s = 0; s <= p->index.mask; s++) {
        const int32_t id = p->index.slot[s];
        if (id < 0) continue;
        in_table++;
        if (id >= p->num_blocks || !p->blocks[id].has_hash)
            return osp_set_error(OSP_ERR_INTERNAL, "block pool: hash table slot %u names block %d, which has no hash", s, id);
    }
    if (in_table != n_hashed || n_hashed != p->stats.num_cached)
        return osp_set_error(OSP_ERR_INTERNAL, "block pool: %d table entries, %d hashed blocks, %lld counted", in_table,
                             n_hashed, (long long)p->stats.num_cached);
    return OSP_OK;
}
