/* vLLM's sha256_cbor block hashes (src/kv/prefix_cache.h) against Python's hashlib + cbor2:
 * tests/golden/fixtures/block_hash_sha256_cbor.txt, made by tests/golden/make_block_hash_fixtures.py.
 * Every NONE_HASH (seed as text) and every chained block hash must match byte for byte, and the 64-bit
 * form KV events carry (osp_block_hash_external) must equal int.from_bytes(h[-8:], "big"). Beside the
 * fixture: the CBOR heads at each width boundary (RFC 8949 §3, Appendix A examples). */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture_util.h"
#include "kv/prefix_cache.h"

static void hash_bytes(const osp_block_hash *h, uint8_t out[32]) {
    const uint64_t w[4] = {h->lo, h->hi, h->ext[0], h->ext[1]};
    for (int i = 0; i < 32; i++) out[i] = (uint8_t)(w[i / 8] >> (8 * (i % 8)));
}

static void test_cbor_heads(void **state) {
    (void)state;
    uint8_t b[9];
    /* RFC 8949 Appendix A: 0 -> 00, 23 -> 17, 24 -> 1818, 100 -> 1864, 1000 -> 1903e8,
     * 1000000 -> 1a000f4240, 1000000000000 -> 1b000000e8d4a51000, -1 -> 20, h'' -> 40, [] -> 80 */
    assert_int_equal(osp_cbor_head(b, 0, 0), 1), assert_int_equal(b[0], 0x00);
    assert_int_equal(osp_cbor_head(b, 0, 23), 1), assert_int_equal(b[0], 0x17);
    assert_int_equal(osp_cbor_head(b, 0, 24), 2), assert_memory_equal(b, "\x18\x18", 2);
    assert_int_equal(osp_cbor_head(b, 0, 1000), 3), assert_memory_equal(b, "\x19\x03\xe8", 3);
    assert_int_equal(osp_cbor_head(b, 0, 1000000), 5), assert_memory_equal(b, "\x1a\x00\x0f\x42\x40", 5);
    assert_int_equal(osp_cbor_head(b, 0, 1000000000000ull), 9);
    assert_memory_equal(b, "\x1b\x00\x00\x00\xe8\xd4\xa5\x10\x00", 9);
    assert_int_equal(osp_cbor_head(b, 1, 0), 1), assert_int_equal(b[0], 0x20);
    assert_int_equal(osp_cbor_head(b, 2, 0), 1), assert_int_equal(b[0], 0x40);
    assert_int_equal(osp_cbor_head(b, 4, 0), 1), assert_int_equal(b[0], 0x80);
    assert_int_equal(osp_cbor_head(b, 2, 32), 2), assert_memory_equal(b, "\x58\x20", 2);
}

static void test_fixture(void **state) {
    (void)state;
    const char *root = getenv("OSPREY_ROOT");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/golden/fixtures/block_hash_sha256_cbor.txt", root ? root : ".");
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int n_none = 0, n_hash = 0, n_chain = 0;
    char kind[16];
    while (fscanf(f, "%15s", kind) == 1) {
        if (!strcmp(kind, "NONE")) {
            unsigned long long seed;
            char hex[80];
            assert_int_equal(fscanf(f, "%llu %79s", &seed, hex), 2);
            uint8_t want[32];
            assert_int_equal(fixture_unhex(hex, want, 32), 32);
            const osp_prefix_hasher h = osp_prefix_hasher_make(OSP_PREFIX_HASH_SHA256_CBOR, true, seed);
            assert_memory_equal(h.none_hash, want, 32);
            n_none++;
            continue;
        }
        assert_string_equal(kind, "CHAIN");
        unsigned long long seed;
        int bs, n;
        char extra_hex[64];
        assert_int_equal(fscanf(f, "%llu %d %63s %d", &seed, &bs, extra_hex, &n), 4);
        uint8_t extra[32];
        const size_t extra_len = strcmp(extra_hex, "-") ? fixture_unhex(extra_hex, extra, sizeof extra) : 0;
        int32_t *toks = malloc(sizeof *toks * (size_t)n);
        assert_non_null(toks);
        for (int i = 0; i < n; i++) assert_int_equal(fscanf(f, "%" SCNd32, &toks[i]), 1);
        const osp_prefix_hasher h = osp_prefix_hasher_make(OSP_PREFIX_HASH_SHA256_CBOR, true, seed);
        osp_block_hash parent = {0};
        for (int b = 0; b < n / bs; b++) {
            char hex[80];
            unsigned long long ext;
            assert_int_equal(fscanf(f, "%15s %79s %llu", kind, hex, &ext), 3);
            assert_string_equal(kind, "HASH");
            uint8_t want[32], got[32];
            assert_int_equal(fixture_unhex(hex, want, 32), 32);
            const osp_block_hash hb = osp_prefix_hash_block(&h, b ? &parent : NULL, toks + (size_t)b * bs, bs,
                                                            extra_len ? extra : NULL, extra_len);
            hash_bytes(&hb, got);
            assert_memory_equal(got, want, 32);
            assert_true(osp_block_hash_external(&hb, OSP_PREFIX_HASH_SHA256_CBOR) == (uint64_t)ext);
            parent = hb;
            n_hash++;
        }
        free(toks);
        n_chain++;
    }
    fclose(f);
    assert_int_equal(n_none, 5);
    assert_int_equal(n_chain, 5);
    assert_true(n_hash >= 10);
}

/* The 64-bit form of the other algorithms: xxh3-128's canonical bytes end with its low half; osprey's
 * sha256 keeps digest bytes 0..15, whose last 8 (bytes 8..15, little-endian in hi) read big-endian. */
static void test_external_forms(void **state) {
    (void)state;
    const osp_block_hash h = {.lo = 0x0123456789abcdefull, .hi = 0x1122334455667788ull};
    assert_true(osp_block_hash_external(&h, OSP_PREFIX_HASH_XXH3_128) == 0x0123456789abcdefull);
    assert_true(osp_block_hash_external(&h, OSP_PREFIX_HASH_SHA256) == 0x8877665544332211ull);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cbor_heads),
        cmocka_unit_test(test_fixture),
        cmocka_unit_test(test_external_forms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
