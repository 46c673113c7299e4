/* Block pool: allocation all-or-nothing, eviction order (LRU of freed blocks), cache hits taking blocks
 * out of the free queue, first-wins hashes, fork with copy-on-write of a partial last block, tail
 * rollback, and a randomized run of 20,000 operations against a shadow model with the invariants
 * checked after every one. Host-only, fast. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kv/block_pool.h"

#define OK(expr) assert_int_equal((expr), OSP_OK)
static osp_block_hash H(uint64_t x) { return (osp_block_hash){.lo = x * 0x9e3779b97f4a7c15ull, .hi = x}; }

static void test_alloc_release_order(void **state) {
    (void)state;
    osp_block_pool *p;
    OK(osp_block_pool_create(8, true, &p));
    int32_t ids[8];
    assert_int_equal(osp_block_pool_alloc(p, 9, ids), OSP_ERR_NOMEM); /* all or nothing */
    assert_int_equal(osp_block_pool_num_free(p), 8);
    OK(osp_block_pool_alloc(p, 8, ids));
    for (int i = 0; i < 8; i++) assert_int_equal(ids[i], i);
    assert_int_equal(osp_block_pool_num_free(p), 0);
    OK(osp_block_pool_alloc(p, 0, ids));
    const int32_t rel[3] = {5, 2, 7};
    osp_block_pool_release(p, rel, 3);
    OK(osp_block_pool_check_invariants(p));
    int32_t got[3];
    OK(osp_block_pool_alloc(p, 3, got)); /* freed order is eviction order */
    assert_memory_equal(got, rel, sizeof rel);
    osp_block_pool_destroy(p);
}

/* The eviction hook: one call an allocation, every cached block it takes in the order taken, their hashes
 * still in the pool during the call; uncached blocks and allocations that evict nothing are not reported. */
typedef struct evict_log {
    int calls, n;
    int32_t ids[8];
    osp_block_hash hs[8];
    bool cached_during; /* every reported hash was still looked up to its block inside the call */
    osp_block_pool *p;
} evict_log;

static void log_evict(void *ctx, int32_t n, const int32_t *ids, const osp_block_hash *hs) {
    evict_log *l = ctx;
    l->calls++;
    for (int32_t i = 0; i < n && l->n < 8; i++) {
        l->cached_during &= osp_block_pool_lookup(l->p, &hs[i]) == ids[i];
        l->ids[l->n] = ids[i], l->hs[l->n++] = hs[i];
    }
}

static void test_evict_hook_batched(void **state) {
    (void)state;
    osp_block_pool *p;
    OK(osp_block_pool_create(6, true, &p));
    evict_log l = {.cached_during = true, .p = p};
    OK(osp_block_pool_set_evict_hook(p, log_evict, &l));
    int32_t ids[6];
    OK(osp_block_pool_alloc(p, 6, ids));
    assert_int_equal(l.calls, 0); /* nothing cached yet */
    for (int i = 0; i < 6; i += 2) { /* blocks 0, 2, 4 cached */
        osp_block_hash h = H(i + 1);
        osp_block_pool_cache(p, ids[i], &h);
    }
    osp_block_pool_release(p, (int32_t[]){5, 4, 3, 2, 1, 0}, 6);
    int32_t got[5];
    OK(osp_block_pool_alloc(p, 5, got)); /* takes 5 4 3 2 1: cached among them 4 then 2 */
    assert_int_equal(l.calls, 1);
    assert_int_equal(l.n, 2);
    assert_int_equal(l.ids[0], 4);
    assert_int_equal(l.ids[1], 2);
    osp_block_hash h5 = H(5), h3 = H(3), h1 = H(1);
    assert_memory_equal(&l.hs[0], &h5, sizeof h5);
    assert_memory_equal(&l.hs[1], &h3, sizeof h3);
    assert_true(l.cached_during);
    assert_int_equal(osp_block_pool_lookup(p, &h5), -1); /* dropped after the call */
    assert_int_equal(osp_block_pool_lookup(p, &h1), 0);  /* block 0 not taken */
    assert_int_equal(osp_block_pool_get_stats(p).num_evictions, 2);
    osp_block_pool_release(p, (int32_t[]){3}, 1); /* uncached, behind block 0 */
    int32_t one;
    OK(osp_block_pool_set_evict_hook(p, NULL, NULL));
    OK(osp_block_pool_alloc(p, 1, &one)); /* block 0, cached: no hook now */
    assert_int_equal(one, 0);
    assert_int_equal(l.calls, 1);
    OK(osp_block_pool_set_evict_hook(p, log_evict, &l));
    OK(osp_block_pool_alloc(p, 1, &one)); /* block 3, not cached: no call */
    assert_int_equal(one, 3);
    assert_int_equal(l.calls, 1);
    OK(osp_block_pool_check_invariants(p));
    osp_block_pool_destroy(p);
}

static void test_cache_hit_and_eviction(void **state) {
    (void)state;
    osp_block_pool *p;
    OK(osp_block_pool_create(4, true, &p));
    int32_t ids[4];
    OK(osp_block_pool_alloc(p, 4, ids));
    for (int i = 0; i < 4; i++) osp_block_pool_cache(p, ids[i], &(osp_block_hash){.lo = H(i + 1).lo, .hi = H(i + 1).hi});
    osp_block_hash h1 = H(1);
    osp_block_pool_cache(p, 3, &h1); /* block 3 already has a hash; h1 already owned by block 0 */
    assert_int_equal(osp_block_pool_lookup(p, &h1), 0);
    osp_block_pool_release(p, (int32_t[]){3, 2, 1, 0}, 4); /* last first */
    OK(osp_block_pool_check_invariants(p));
    for (int i = 0; i < 4; i++) {
        osp_block_hash h = H(i + 1);
        assert_int_equal(osp_block_pool_lookup(p, &h), i); /* free blocks keep their hash */
    }
    /* a hit takes block 1 out of the free queue; the next two allocations evict 3 then 2 (LRU) */
    osp_block_pool_touch(p, (int32_t[]){1}, 1);
    assert_int_equal(osp_block_pool_num_free(p), 3);
    int32_t got[2];
    OK(osp_block_pool_alloc(p, 2, got));
    assert_int_equal(got[0], 3);
    assert_int_equal(got[1], 2);
    osp_block_hash h3 = H(3), h4 = H(4), h2 = H(2);
    assert_int_equal(osp_block_pool_lookup(p, &h4), -1);
    assert_int_equal(osp_block_pool_lookup(p, &h3), -1);
    assert_int_equal(osp_block_pool_lookup(p, &h2), 1);
    assert_int_equal(osp_block_pool_get_stats(p).num_evictions, 2);
    OK(osp_block_pool_check_invariants(p));
    osp_block_pool_reset_cache(p);
    assert_int_equal(osp_block_pool_lookup(p, &h2), -1);
    OK(osp_block_pool_check_invariants(p));
    osp_block_pool_destroy(p);

    OK(osp_block_pool_create(2, false, &p)); /* caching off: never a hit */
    OK(osp_block_pool_alloc(p, 1, ids));
    osp_block_pool_cache(p, ids[0], &h1);
    assert_int_equal(osp_block_pool_lookup(p, &h1), -1);
    OK(osp_block_pool_check_invariants(p));
    osp_block_pool_destroy(p);
}

static void test_fork_and_free_tail(void **state) {
    (void)state;
    osp_block_pool *p;
    OK(osp_block_pool_create(8, true, &p));
    int32_t parent[3], child[3], src, dst;
    OK(osp_block_pool_alloc(p, 3, parent)); /* 40 tokens, block size 16: 2 full + 1 partial */
    assert_int_equal(osp_block_pool_fork(p, parent, 2, 40, 16, child, &src, &dst), OSP_ERR_INVALID_ARG);
    OK(osp_block_pool_fork(p, parent, 3, 40, 16, child, &src, &dst));
    assert_int_equal(child[0], parent[0]);
    assert_int_equal(child[1], parent[1]);
    assert_int_not_equal(child[2], parent[2]);
    assert_int_equal(src, parent[2]);
    assert_int_equal(dst, child[2]);
    assert_int_equal(osp_block_pool_ref_count(p, parent[0]), 2);
    assert_int_equal(osp_block_pool_ref_count(p, parent[2]), 1);
    OK(osp_block_pool_check_invariants(p));
    int32_t c2[2];
    OK(osp_block_pool_fork(p, parent, 2, 32, 16, c2, &src, &dst)); /* no partial block: nothing to copy */
    assert_int_equal(src, -1);
    assert_int_equal(osp_block_pool_ref_count(p, parent[1]), 3);
    /* rollback: the child keeps 17 tokens -> 2 blocks; its second block is shared, so it cannot be
     * rolled into; the parent's own partial block can */
    int32_t n = 3;
    assert_int_equal(osp_block_pool_free_tail(p, child, &n, 17, 16), OSP_ERR_INVALID_ARG);
    assert_int_equal(n, 3);
    OK(osp_block_pool_free_tail(p, child, &n, 32, 16));
    assert_int_equal(n, 2);
    osp_block_hash h = H(9);
    osp_block_pool_cache(p, parent[2], &h);
    n = 3;
    OK(osp_block_pool_free_tail(p, parent, &n, 36, 16)); /* its last block becomes partial: hash dropped */
    assert_int_equal(n, 3);
    assert_false(osp_block_pool_is_cached(p, parent[2]));
    OK(osp_block_pool_check_invariants(p));
    osp_block_pool_release(p, child, 2);
    osp_block_pool_release(p, c2, 2);
    osp_block_pool_release(p, parent, 3);
    assert_int_equal(osp_block_pool_num_free(p), 8);
    OK(osp_block_pool_check_invariants(p));
    osp_block_pool_destroy(p);
}

/* Random alloc / release / touch / cache against a shadow of ref counts; invariants every op. */
static void test_randomized(void **state) {
    (void)state;
    enum { NB = 64, OPS = 20000 };
    osp_block_pool *p;
    OK(osp_block_pool_create(NB, true, &p));
    int32_t shadow[NB] = {0};
    int32_t held[4 * NB], n_held = 0; /* one entry per reference we hold */
    srand(12345);
    for (int op = 0; op < OPS; op++) {
        const int kind = rand() % 4;
        if (kind == 0) {
            int32_t want = rand() % 6, ids[8];
            const int32_t free_before = osp_block_pool_num_free(p);
            osp_status s = osp_block_pool_alloc(p, want, ids);
            assert_int_equal(s, want <= free_before ? OSP_OK : OSP_ERR_NOMEM);
            if (s == OSP_OK)
                for (int i = 0; i < want; i++) {
                    assert_int_equal(shadow[ids[i]], 0);
                    shadow[ids[i]] = 1;
                    held[n_held++] = ids[i];
                }
        } else if (kind == 1 && n_held > 0) {
            const int i = rand() % n_held;
            const int32_t id = held[i];
            held[i] = held[--n_held];
            osp_block_pool_release(p, &id, 1);
            shadow[id]--;
        } else if (kind == 2) {
            /* a cache hit: look up a random hash; touch what is found */
            osp_block_hash h = H((uint64_t)(rand() % 200));
            const int32_t id = osp_block_pool_lookup(p, &h);
            if (id >= 0 && n_held < 4 * NB - 1) {
                osp_block_pool_touch(p, &id, 1);
                shadow[id]++;
                held[n_held++] = id;
            }
        } else if (n_held > 0) {
            osp_block_hash h = H((uint64_t)(rand() % 200));
            osp_block_pool_cache(p, held[rand() % n_held], &h);
        }
        for (int b = 0; b < NB; b++) assert_int_equal(osp_block_pool_ref_count(p, b), shadow[b]);
        osp_status s = osp_block_pool_check_invariants(p);
        if (s != OSP_OK) fail_msg("op %d: %s", op, osp_last_error());
    }
    osp_block_pool_release(p, held, n_held);
    assert_int_equal(osp_block_pool_num_free(p), NB);
    OK(osp_block_pool_check_invariants(p));
    osp_block_pool_destroy(p);
}

/* 256-bit hashes (sha256_cbor) that agree in their first 128 bits are different blocks. */
static void test_wide_hashes_distinct(void **state) {
    (void)state;
    osp_block_pool *p;
    assert_int_equal(osp_block_pool_create(4, true, &p), OSP_OK);
    int32_t ids[2];
    assert_int_equal(osp_block_pool_alloc(p, 2, ids), OSP_OK);
    const osp_block_hash a = {.lo = 1, .hi = 2, .ext = {3, 4}}, b = {.lo = 1, .hi = 2, .ext = {3, 5}};
    osp_block_pool_cache(p, ids[0], &a);
    osp_block_pool_cache(p, ids[1], &b);
    assert_int_equal(osp_block_pool_lookup(p, &a), ids[0]);
    assert_int_equal(osp_block_pool_lookup(p, &b), ids[1]);
    assert_int_equal(osp_block_pool_lookup(p, &(osp_block_hash){.lo = 1, .hi = 2}), -1);
    assert_int_equal(osp_block_pool_check_invariants(p), OSP_OK);
    osp_block_pool_destroy(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wide_hashes_distinct),
        cmocka_unit_test(test_alloc_release_order),
        cmocka_unit_test(test_cache_hit_and_eviction),
        cmocka_unit_test(test_evict_hook_batched),
        cmocka_unit_test(test_fork_and_free_tail),
        cmocka_unit_test(test_randomized),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
