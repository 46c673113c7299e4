/* The KL-divergence base file of `osprey perplexity` (src/format/kl_base.h): a saved base parses back
 * to the same values; every way a file can be wrong is refused whole with a message saying what. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/status_internal.h"
#include "format/kl_base.h"

/* 2 chunks x 3 scored positions, k = 2, vocabulary 10 */
static osp_kl_base sample(void) {
    static int32_t ids[12] = {3, 7, 1, 2, 9, 0, 4, 5, 5, 6, 8, 9};
    static float lp[12] = {-0.1f, -2.5f, -0.7f, -0.7f, -1.0f, -3.0f, -0.2f, -1.9f, -0.5f, -0.6f, -1.1f, -1.2f};
    static float rest[6] = {-3.0f, -1.5f, -0.9f, -INFINITY, -2.0f, -1.0f};
    static float nll[6] = {0.1f, 2.5f, 0.0f, 4.0f, 0.6f, 1.2f};
    osp_kl_base b = {.n_vocab = 10, .ctx = 8, .n_chunks = 2, .n_scored = 3, .k = 2, .tokens_hash = 0x0123456789abcdefull,
                     .ids = ids, .logprob = lp, .logprob_rest = rest, .nll = nll};
    return b;
}

static uint8_t *save_bytes(const osp_kl_base *b, size_t *n) {
    char path[] = "/tmp/osp_klb_XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(osp_kl_base_save(path, b), OSP_OK);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(*n);
    assert_int_equal(fread(buf, 1, *n, f), *n);
    fclose(f);
    remove(path);
    return buf;
}

static void test_round_trip(void **state) {
    (void)state;
    const osp_kl_base b = sample();
    size_t n;
    uint8_t *buf = save_bytes(&b, &n);
    assert_int_equal(n, osp_kl_base_file_bytes(2, 3, 2));
    assert_int_equal(n, OSP_KLB_HEADER_BYTES + 6 * (8 * 2 + 8));
    assert_memory_equal(buf, "OSPKLB01", 8);
    osp_kl_base r;
    assert_int_equal(osp_kl_base_parse(buf, n, &r), OSP_OK);
    assert_int_equal(r.n_vocab, 10);
    assert_int_equal(r.ctx, 8);
    assert_int_equal(r.n_chunks, 2);
    assert_int_equal(r.n_scored, 3);
    assert_int_equal(r.k, 2);
    assert_true(r.tokens_hash == b.tokens_hash);
    assert_memory_equal(r.ids, b.ids, sizeof(int32_t) * 12);
    assert_memory_equal(r.logprob, b.logprob, sizeof(float) * 12);
    assert_memory_equal(r.logprob_rest, b.logprob_rest, sizeof(float) * 6);
    assert_memory_equal(r.nll, b.nll, sizeof(float) * 6);
    osp_kl_base_free(&r);
    assert_null(r.ids);
    free(buf);
}

/* byte offsets of record i's fields */
static size_t rec(size_t i) { return OSP_KLB_HEADER_BYTES + i * 24; }

static void expect_refused(const uint8_t *buf, size_t n, const char *frag) {
    osp_kl_base r;
    memset(&r, 0x5a, sizeof r);
    assert_int_equal(osp_kl_base_parse(buf, n, &r), OSP_ERR_FORMAT);
    assert_null(r.ids); /* zeroed, nothing half-loaded */
    if (!strstr(osp_last_error(), frag)) fail_msg("'%s' not in: %s", frag, osp_last_error());
}

/* A top-k by logit whose float log-probabilities tie (distinct logits, one rounded value) in the wrong
 * id order: put in the file's order (osprey perplexity --save-kl-base wrote such records before, which
 * --kl-base then refused: a random-weight Q8_0 SmolLM2, record 965 of 6 chunks of 512). */
static void test_order_ties(void **state) {
    (void)state;
    int32_t ids[6] = {9, 4, 7, 2, 5, 1};
    const float lp[6] = {-0.5f, -1.0f, -1.0f, -1.0f, -2.0f, -2.0f};
    osp_kl_base_order_ties(ids, lp, 6);
    const int32_t want[6] = {9, 2, 4, 7, 1, 5};
    assert_memory_equal(ids, want, sizeof want);
    osp_kl_base_order_ties(ids, lp, 0); /* nothing to do */
    osp_kl_base_order_ties(ids, lp, 1);
    assert_memory_equal(ids, want, sizeof want);
}

static void test_refused(void **state) {
    (void)state;
    const osp_kl_base b = sample();
    size_t n;
    uint8_t *good = save_bytes(&b, &n), *buf = malloc(n + 8);
    const float nan = NAN, pos = 0.5f, pinf = INFINITY;
    const int32_t big = 10, neg = -1;
#define MUT(off, val, frag)                                                                                        \
    do {                                                                                                           \
        memcpy(buf, good, n);                                                                                      \
        memcpy(buf + (off), &(val), sizeof(val));                                                                  \
        expect_refused(buf, n, frag);                                                                              \
    } while (0)
    memcpy(buf, good, n);
    expect_refused(buf, n - 1, "bytes");
    expect_refused(buf, 10, "header");
    memcpy(buf + n, "xxxxxxxx", 8);
    expect_refused(buf, n + 8, "bytes");
    const uint32_t zero = 0, one = 1, k65 = 65, huge = 0xffffffffu;
    MUT(0, zero, "magic");
    MUT(8, zero, "vocabulary");
    MUT(12, one, "ctx");
    MUT(20, zero, "scored");
    MUT(20, k65, "scored"); /* n_scored >= ctx */
    MUT(24, k65, "k");
    MUT(16, huge, "bytes"); /* n_chunks: the size no longer matches */
    MUT(28, one, "reserved");
    MUT(rec(0), big, "vocabulary");
    MUT(rec(1), neg, "vocabulary");
    MUT(rec(0) + 8, nan, "log-probability");
    MUT(rec(0) + 8, pos, "log-probability");
    MUT(rec(2) + 12, pos, "log-probability");
    MUT(rec(0) + 12, pos, "log-probability"); /* -2.5 -> 0.5: positive */
    {
        const float up = -0.05f; /* second entry above the first: out of order */
        MUT(rec(0) + 12, up, "order");
    }
    {
        const int32_t dup = 3, tie_lo = 0; /* record 1 has a tie (-0.7, -0.7): ids must rise */
        MUT(rec(0) + 4, dup, "repeated");
        MUT(rec(1) + 4, tie_lo, "order");
    }
    MUT(rec(3) + 16, pos, "rest");
    MUT(rec(3) + 16, nan, "rest");
    MUT(rec(3) + 16, pinf, "rest");
    MUT(rec(5) + 20, nan, "NLL");
    {
        const float negn = -0.5f;
        MUT(rec(5) + 20, negn, "NLL");
    }
#undef MUT
    free(buf);
    free(good);
}

static void test_load_errors(void **state) {
    (void)state;
    osp_kl_base r;
    assert_int_equal(osp_kl_base_load("/nonexistent/base.klb", &r), OSP_ERR_IO);
    assert_non_null(strstr(osp_last_error(), "/nonexistent/base.klb"));
    assert_int_equal(osp_kl_base_file_bytes(0, 3, 2), 0);
    assert_int_equal(osp_kl_base_file_bytes(1, 3, 65), 0);
    assert_int_equal(osp_kl_base_file_bytes(0xffffffffu, 0xffffffffu, 64), 0); /* 2^64 records x 520 bytes: overflow */
    /* FNV-1a 64 of the bytes 01 00 00 00 (id 1), from the offset basis */
    const int32_t one = 1;
    uint64_t h = 0xcbf29ce484222325ull;
    const uint8_t bytes[4] = {1, 0, 0, 0};
    for (int i = 0; i < 4; i++) h = (h ^ bytes[i]) * 0x100000001b3ull;
    assert_true(osp_fnv1a64_ids(OSP_FNV64_OFFSET, &one, 1) == h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_order_ties),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_load_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
