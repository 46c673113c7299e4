/* The router's KV-event index (tools/router/kv_index.h) fed by hand-made msgpack batches in both of
 * vLLM's forms (maps tagged "type"; positional arrays), hashes as integers and as byte strings (last
 * 8 bytes, big-endian): stored blocks are found per backend, the leading-run match stops at the first
 * missing block, removals and AllBlocksCleared take blocks out of one backend only, and payloads that
 * are not an EventBatch are refused without changing anything. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>

#include "kv_index.h"

static void pstr(msgpack_packer *pk, const char *s) {
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

static const char *g_medium; /* batch(): a medium field in the map form (NULL: none); the array form's ("GPU" if NULL) */

/* A batch with one event of kind tag over hashes[0..n) in the map or the array form. */
static void batch(msgpack_sbuffer *sb, bool array_like, const char *tag, const uint64_t *h, int n) {
    msgpack_sbuffer_clear(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    const bool stored = !strcmp(tag, "BlockStored"), cleared = !strcmp(tag, "AllBlocksCleared");
    if (array_like) {
        msgpack_pack_array(&pk, 2);
        msgpack_pack_double(&pk, 1.0);
        msgpack_pack_array(&pk, 1);
        msgpack_pack_array(&pk, cleared ? 1 : stored ? 7 : 3);
        pstr(&pk, tag);
        if (cleared) return;
        msgpack_pack_array(&pk, (size_t)n);
        for (int i = 0; i < n; i++) msgpack_pack_uint64(&pk, h[i]);
        if (stored) {
            msgpack_pack_nil(&pk);
            msgpack_pack_array(&pk, 0);
            msgpack_pack_int(&pk, 16);
            msgpack_pack_nil(&pk);
        }
        pstr(&pk, g_medium ? g_medium : "GPU");
        return;
    }
    msgpack_pack_map(&pk, 2);
    pstr(&pk, "ts"), msgpack_pack_double(&pk, 1.0);
    pstr(&pk, "events"), msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, cleared ? 1 : g_medium ? 3 : 2);
    pstr(&pk, "type"), pstr(&pk, tag);
    if (cleared) return;
    if (g_medium) pstr(&pk, "medium"), pstr(&pk, g_medium);
    pstr(&pk, "block_hashes");
    msgpack_pack_array(&pk, (size_t)n);
    for (int i = 0; i < n; i++) { /* odd positions as 32-byte strings ending in the hash, big-endian */
        if (i % 2) {
            uint8_t b[32] = {0};
            for (int k = 0; k < 8; k++) b[24 + k] = (uint8_t)(h[i] >> (56 - 8 * k));
            msgpack_pack_bin(&pk, 32);
            msgpack_pack_bin_body(&pk, b, 32);
        } else msgpack_pack_uint64(&pk, h[i]);
    }
}

static void test_both_forms(void **state) {
    (void)state;
    const char *eps[2] = {NULL, NULL};
    char why[128];
    rt_kv_index *x = rt_kv_index_start(eps, 2, why, sizeof why);
    assert_non_null(x);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    const uint64_t h[4] = {0xffffffffffffffffull, 2, 3, 0x8000000000000001ull};
    for (int form = 0; form < 2; form++) {
        batch(&sb, form, "BlockStored", h, 3);
        assert_true(rt_kv_index_apply(x, form, sb.data, sb.size));
        assert_int_equal(rt_kv_index_size(x, form), 3);
    }
    int32_t pre[2];
    rt_kv_index_match(x, h, 4, pre);
    assert_int_equal(pre[0], -1); /* no event source: the caller falls back */
    batch(&sb, false, "BlockRemoved", h + 1, 1);
    assert_true(rt_kv_index_apply(x, 0, sb.data, sb.size));
    assert_int_equal(rt_kv_index_size(x, 0), 2);
    assert_int_equal(rt_kv_index_size(x, 1), 3); /* the other backend keeps block 2 */
    batch(&sb, true, "AllBlocksCleared", NULL, 0);
    assert_true(rt_kv_index_apply(x, 1, sb.data, sb.size));
    assert_int_equal(rt_kv_index_size(x, 1), 0);
    assert_int_equal(rt_kv_index_size(x, 0), 2);
    /* refused: not msgpack, not a batch, a backend out of range; nothing changes */
    assert_false(rt_kv_index_apply(x, 0, "\xc1", 1));
    assert_false(rt_kv_index_apply(x, 0, "\x93\x01\x02\x03", 4)); /* [1, 2, 3]: events is not an array */
    assert_false(rt_kv_index_apply(x, 0, "\x80", 1));
    batch(&sb, false, "BlockStored", h, 1);
    assert_false(rt_kv_index_apply(x, 5, sb.data, sb.size));
    assert_int_equal(rt_kv_index_size(x, 0), 2);
    msgpack_sbuffer_destroy(&sb);
    rt_kv_index_stop(x);
}

/* A block in the pool and in offload tiers ("CPU", "DISK") is one entry per medium: removing it from one
 * medium leaves the others (a backend holds it while any medium does). */
static void test_media(void **state) {
    (void)state;
    const char *eps[1] = {NULL};
    char why[128];
    rt_kv_index *x = rt_kv_index_start(eps, 1, why, sizeof why);
    assert_non_null(x);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    const uint64_t h[1] = {77};
    static const char *const media[3] = {"GPU", "CPU", "DISK"};
    for (int form = 0; form < 2; form++) {
        for (int m = 0; m < 3; m++) {
            g_medium = media[m];
            batch(&sb, form, "BlockStored", h, 1);
            assert_true(rt_kv_index_apply(x, 0, sb.data, sb.size));
        }
        assert_int_equal(rt_kv_index_size(x, 0), 3);
        for (int m = 0; m < 3; m++) {
            g_medium = media[(m + form) % 3];
            batch(&sb, !form, "BlockRemoved", h, 1);
            assert_true(rt_kv_index_apply(x, 0, sb.data, sb.size));
            assert_int_equal(rt_kv_index_size(x, 0), 2 - m);
        }
    }
    g_medium = NULL;
    msgpack_sbuffer_destroy(&sb);
    rt_kv_index_stop(x);
}

static void test_leading_run(void **state) {
    (void)state;
    /* a source makes match count: an endpoint nobody publishes on is fine for a SUB socket */
    const char *eps[2] = {"tcp://127.0.0.1:9", NULL};
    char why[128];
    rt_kv_index *x = rt_kv_index_start(eps, 2, why, sizeof why);
    assert_non_null(x);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    const uint64_t h[4] = {10, 11, 12, 13};
    batch(&sb, false, "BlockStored", h, 2);
    assert_true(rt_kv_index_apply(x, 0, sb.data, sb.size));
    batch(&sb, false, "BlockStored", h + 3, 1);
    assert_true(rt_kv_index_apply(x, 0, sb.data, sb.size));
    int32_t pre[2];
    rt_kv_index_match(x, h, 4, pre);
    assert_int_equal(pre[0], 2); /* 10, 11 held; 12 missing stops the run before 13 */
    assert_int_equal(pre[1], -1);
    msgpack_sbuffer_destroy(&sb);
    rt_kv_index_stop(x);
    const char *bad[1] = {"nonsense://x"};
    assert_null(rt_kv_index_start(bad, 1, why, sizeof why));
    assert_non_null(strstr(why, "nonsense://x"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_both_forms),
        cmocka_unit_test(test_leading_run),
        cmocka_unit_test(test_media),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
