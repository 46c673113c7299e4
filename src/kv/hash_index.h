/* An open-addressing index from block hash to an int32 id whose hash its owner keeps (the block pool's
 * blocks, the offload store's entries): linear probing over a power-of-two table of ids (-1: empty),
 * deletion by backward shift (Knuth, TAOCP vol. 3, 6.4 algorithm R), so there are no tombstones to age.
 * The owner passes, with every call, where an id's hash is: `base` + id * `stride` bytes. Sizing (load
 * at most one half) is the owner's. Header-only: both owners inline it. */
#ifndef OSP_KV_HASH_INDEX_H
#define OSP_KV_HASH_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/block_pool.h"

typedef struct osp_hash_index {
    int32_t *slot;  /* [mask + 1] id or -1 */
    uint32_t mask;  /* capacity - 1, a power of two minus one */
    const char *base; /* the hash of id is at base + id * stride */
    size_t stride;
} osp_hash_index;

static inline bool osp_block_hash_eq(const osp_block_hash *a, const osp_block_hash *b) {
    return a->lo == b->lo && a->hi == b->hi && a->ext[0] == b->ext[0] && a->ext[1] == b->ext[1];
}

static inline const osp_block_hash *osp_hash_index_key(const osp_hash_index *t, int32_t id) {
    return (const osp_block_hash *)(const void *)(t->base + (size_t)id * t->stride);
}

static inline uint32_t osp_hash_index_home(const osp_hash_index *t, const osp_block_hash *h) {
    return (uint32_t)(h->lo ^ (h->hi >> 17) ^ (h->ext[0] >> 31)) & t->mask;
}

/* The slot holding h, or -1. */
static inline int64_t osp_hash_index_find(const osp_hash_index *t, const osp_block_hash *h) {
    for (uint32_t i = osp_hash_index_home(t, h);; i = (i + 1) & t->mask) {
        const int32_t id = t->slot[i];
        if (id < 0) return -1;
        if (osp_block_hash_eq(osp_hash_index_key(t, id), h)) return i;
    }
}

/* Inserts id under its hash (not present yet; the table not full). */
static inline void osp_hash_index_put(osp_hash_index *t, int32_t id) {
    uint32_t i = osp_hash_index_home(t, osp_hash_index_key(t, id));
    while (t->slot[i] >= 0) i = (i + 1) & t->mask;
    t->slot[i] = id;
}

/* Removes slot i, shifting later entries of its probe run back. */
static inline void osp_hash_index_delete_at(osp_hash_index *t, uint32_t i) {
    t->slot[i] = -1;
    for (uint32_t j = i;;) {
        j = (j + 1) & t->mask;
        const int32_t id = t->slot[j];
        if (id < 0) return;
        const uint32_t k = osp_hash_index_home(t, osp_hash_index_key(t, id));
        /* move id to i unless its home k lies cyclically in (i, j] */
        const bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            t->slot[i] = id;
            t->slot[j] = -1;
            i = j;
        }
    }
}

#endif
