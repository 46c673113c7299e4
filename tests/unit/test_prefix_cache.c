/* Prefix-cache hashing: sha256 against FIPS 180-4 test vectors; the xxh3-128 block hash equals
 * XXH3_128bits_withSeed over the documented message; chaining, salt, seed and algorithm all change
 * the hash; an unset seed is the same random seed for the whole process; longest-run matching. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <xxhash.h>

#include "kv/prefix_cache.h"

static void hex(const uint8_t *d, int n, char *out) {
    for (int i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

static void test_sha256_vectors(void **state) {
    (void)state;
    uint8_t d[32];
    char s[65];
    osp_sha256("", 0, d);
    hex(d, 32, s);
    assert_string_equal(s, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    osp_sha256("abc", 3, d);
    hex(d, 32, s);
    assert_string_equal(s, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    osp_sha256(m, strlen(m), d);
    hex(d, 32, s);
    assert_string_equal(s, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

static void test_xxh3_message_layout(void **state) {
    (void)state;
    const osp_prefix_hasher h = osp_prefix_hasher_make(OSP_PREFIX_HASH_XXH3_128, true, 42);
    const int32_t toks[3] = {1, 258, -1};
    const osp_block_hash got = osp_prefix_hash_block(&h, NULL, toks, 3, NULL, 0);
    uint8_t msg[8 + 1 + 16 + 4 + 12] = {42}; /* seed LE, no parent, n = 3, tokens LE */
    msg[25] = 3;
    const uint8_t tb[12] = {1, 0, 0, 0, 2, 1, 0, 0, 0xff, 0xff, 0xff, 0xff};
    memcpy(msg + 29, tb, 12);
    const XXH128_hash_t want = XXH3_128bits_withSeed(msg, sizeof msg, 42);
    assert_true(got.lo == want.low64 && got.hi == want.high64);
}

static bool eq(osp_block_hash a, osp_block_hash b) {
    return a.lo == b.lo && a.hi == b.hi && a.ext[0] == b.ext[0] && a.ext[1] == b.ext[1];
}

static void test_chaining_salt_seed(void **state) {
    (void)state;
    for (int algo = 0; algo < 3; algo++) { /* xxh3-128, sha256, sha256_cbor */
        const osp_prefix_hasher h = osp_prefix_hasher_make((osp_prefix_hash_algo)algo, true, 7);
        const osp_prefix_hasher h2 = osp_prefix_hasher_make((osp_prefix_hash_algo)algo, true, 8);
        int32_t a[16], b[16];
        for (int i = 0; i < 16; i++) a[i] = b[i] = i * 3;
        const osp_block_hash pa = osp_prefix_hash_block(&h, NULL, a, 16, NULL, 0);
        assert_true(eq(pa, osp_prefix_hash_block(&h, NULL, b, 16, NULL, 0)));
        b[15]++;
        assert_false(eq(pa, osp_prefix_hash_block(&h, NULL, b, 16, NULL, 0)));
        const osp_block_hash c1 = osp_prefix_hash_block(&h, &pa, a, 16, NULL, 0);
        assert_false(eq(c1, pa)); /* the parent is part of the hash */
        const osp_block_hash other_parent = osp_prefix_hash_block(&h, NULL, b, 16, NULL, 0);
        assert_false(eq(c1, osp_prefix_hash_block(&h, &other_parent, a, 16, NULL, 0)));
        const uint64_t salt = 99;
        assert_false(eq(pa, osp_prefix_hash_block(&h, NULL, a, 16, &salt, sizeof salt)));
        assert_false(eq(pa, osp_prefix_hash_block(&h2, NULL, a, 16, NULL, 0)));
    }
    const osp_prefix_hasher x = osp_prefix_hasher_make(OSP_PREFIX_HASH_XXH3_128, true, 7);
    const osp_prefix_hasher y = osp_prefix_hasher_make(OSP_PREFIX_HASH_SHA256, true, 7);
    const int32_t t[2] = {5, 6};
    assert_false(eq(osp_prefix_hash_block(&x, NULL, t, 2, NULL, 0), osp_prefix_hash_block(&y, NULL, t, 2, NULL, 0)));
    /* unseeded: one random seed per process */
    const osp_prefix_hasher r1 = osp_prefix_hasher_make(OSP_PREFIX_HASH_XXH3_128, false, 0);
    const osp_prefix_hasher r2 = osp_prefix_hasher_make(OSP_PREFIX_HASH_XXH3_128, false, 123);
    assert_true(r1.seed == r2.seed);
}

static void test_match_longest_run(void **state) {
    (void)state;
    osp_block_pool *p;
    assert_int_equal(osp_block_pool_create(8, true, &p), OSP_OK);
    const osp_prefix_hasher h = osp_prefix_hasher_make(OSP_PREFIX_HASH_XXH3_128, true, 1);
    osp_block_hash hs[4];
    int32_t toks[64], ids[4], got[4];
    for (int i = 0; i < 64; i++) toks[i] = i;
    for (int i = 0; i < 4; i++) hs[i] = osp_prefix_hash_block(&h, i ? &hs[i - 1] : NULL, toks + 16 * i, 16, NULL, 0);
    assert_int_equal(osp_block_pool_alloc(p, 4, ids), OSP_OK);
    osp_block_pool_cache(p, ids[0], &hs[0]);
    osp_block_pool_cache(p, ids[1], &hs[1]);
    osp_block_pool_cache(p, ids[3], &hs[3]); /* a gap at block 2 */
    assert_int_equal(osp_prefix_cache_match(p, hs, 4, got), 2);
    assert_int_equal(got[0], ids[0]);
    assert_int_equal(got[1], ids[1]);
    assert_int_equal(osp_prefix_cache_match(p, hs, 1, got), 1);
    assert_int_equal(osp_prefix_cache_match(p, hs + 2, 2, got), 0);
    osp_block_pool_destroy(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_vectors),
        cmocka_unit_test(test_xxh3_message_layout),
        cmocka_unit_test(test_chaining_salt_seed),
        cmocka_unit_test(test_match_longest_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
