/* The KV cache scales file (src/format/kv_scales.h, `osprey calibrate-kv -o` / `--kv-scales`): a saved
 * file parses back to the same scales bit for bit; every way a file can be wrong (truncated, too long,
 * magic, version, counts, reserved, checksum, a bad scale, another model's shape) is refused whole with
 * a message saying what; the scales reach the KV cache a model creates with them. */
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
#include "format/kv_scales.h"

/* 3 layers x 2 KV heads, head_dim 32, every scale distinct */
static osp_kv_scales sample(void) {
    osp_kv_scales s;
    assert_int_equal(osp_kv_scales_init(&s, 3, 2, 32), OSP_OK);
    for (int i = 0; i < 6; i++) s.fp8_k[i] = 0.01f * (float)(i + 1), s.fp8_v[i] = 0.003f * (float)(i + 7);
    for (int i = 0; i < 3; i++) s.nvfp4_k[i] = 1.0f / 64 * (float)(i + 1), s.nvfp4_v[i] = 1e-3f * (float)(i + 2);
    return s;
}

static char g_path[64];

static uint8_t *save_bytes(const osp_kv_scales *s, size_t *n) {
    snprintf(g_path, sizeof g_path, "/tmp/osp_kvs_XXXXXX");
    const int fd = mkstemp(g_path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(osp_kv_scales_save(g_path, s), OSP_OK);
    FILE *f = fopen(g_path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(*n);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, *n, f), *n);
    fclose(f);
    return buf;
}

/* FNV-1a 64 over buf[0..n) written into the trailer (for tests that change a field on purpose) */
static void reseal(uint8_t *buf, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n - 8; i++) h = (h ^ buf[i]) * 0x100000001b3ull;
    for (int b = 0; b < 8; b++) buf[n - 8 + (size_t)b] = (uint8_t)(h >> (8 * b));
}

static void test_round_trip(void **st) {
    (void)st;
    osp_kv_scales s = sample(), back;
    size_t n;
    uint8_t *buf = save_bytes(&s, &n);
    assert_int_equal(n, osp_kv_scales_file_bytes(3, 2, 32));
    assert_int_equal(n, 24 + 8 * 3 * 3 + 8);
    assert_memory_equal(buf, "OSPKVS01", 8);
    assert_int_equal(osp_kv_scales_parse(buf, n, &back), OSP_OK);
    assert_int_equal(back.n_layer, 3);
    assert_int_equal(back.n_head_kv, 2);
    assert_int_equal(back.head_dim, 32);
    assert_memory_equal(back.fp8_k, s.fp8_k, 6 * sizeof(float));
    assert_memory_equal(back.fp8_v, s.fp8_v, 6 * sizeof(float));
    assert_memory_equal(back.nvfp4_k, s.nvfp4_k, 3 * sizeof(float));
    assert_memory_equal(back.nvfp4_v, s.nvfp4_v, 3 * sizeof(float));
    osp_kv_scales_free(&back);
    assert_int_equal(osp_kv_scales_load(g_path, &back), OSP_OK);
    assert_true(back.nvfp4_v[2] == s.nvfp4_v[2]);
    /* the dtype picks its arrays */
    const float *k, *v;
    osp_kv_scales_for(&back, OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_FP8, &k, &v);
    assert_ptr_equal(k, back.fp8_k), assert_ptr_equal(v, back.fp8_v);
    osp_kv_scales_for(&back, OSP_KV_DTYPE_NVFP4, OSP_KV_DTYPE_NVFP4, &k, &v);
    assert_ptr_equal(k, back.nvfp4_k), assert_ptr_equal(v, back.nvfp4_v);
    osp_kv_scales_for(&back, OSP_KV_DTYPE_F16, OSP_KV_DTYPE_F16, &k, &v);
    assert_null(k), assert_null(v);
    osp_kv_scales_for(NULL, OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_FP8, &k, &v);
    assert_null(k), assert_null(v);
    /* a split cache: each side from its own dtype's set */
    osp_kv_scales_for(&back, OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_NVFP4, &k, &v);
    assert_ptr_equal(k, back.fp8_k), assert_ptr_equal(v, back.nvfp4_v);
    osp_kv_scales_for(&back, OSP_KV_DTYPE_NVFP4, OSP_KV_DTYPE_F16, &k, &v);
    assert_ptr_equal(k, back.nvfp4_k), assert_null(v);
    osp_kv_scales_free(&back);
    osp_kv_scales_free(&back); /* twice is fine */
    remove(g_path);
    free(buf);
    osp_kv_scales_free(&s);
}

/* parse must fail with OSP_ERR_FORMAT, a message containing `what`, and a zeroed output */
static void refused(const uint8_t *buf, size_t n, const char *what) {
    osp_kv_scales out;
    memset(&out, 0xab, sizeof out);
    assert_int_equal(osp_kv_scales_parse(buf, n, &out), OSP_ERR_FORMAT);
    if (!strstr(osp_last_error(), what)) fail_msg("'%s' not in '%s'", what, osp_last_error());
    assert_null(out.fp8_k), assert_null(out.nvfp4_v);
    assert_int_equal(out.n_layer, 0);
}

static void test_refused(void **st) {
    (void)st;
    osp_kv_scales s = sample();
    size_t n;
    uint8_t *good = save_bytes(&s, &n);
    remove(g_path);
    uint8_t *b = malloc(n + 16);
    assert_non_null(b);
    /* truncated: every shorter length, the empty file included */
    for (size_t len = 0; len < n; len++) {
        memcpy(b, good, n);
        osp_kv_scales out;
        assert_int_equal(osp_kv_scales_parse(b, len, &out), OSP_ERR_FORMAT);
        assert_null(out.fp8_k);
    }
    memcpy(b, good, n);
    refused(b, n - 1, "truncated");
    memcpy(b, good, n), memset(b + n, 0, 16);
    refused(b, n + 4, "too long");
    memcpy(b, good, n), b[0] = 'G';
    refused(b, n, "magic");
    memcpy(b, good, n), b[7] = '2';
    refused(b, n, "version '02'");
    memcpy(b, good, n), memset(b + 8, 0, 4); /* 0 layers */
    refused(b, n, "out of range");
    memcpy(b, good, n), b[20] = 1, reseal(b, n);
    refused(b, n, "reserved");
    /* one flipped bit anywhere in header or body: the checksum (or a field check) catches it */
    for (size_t i = 0; i < n - 8; i++) {
        memcpy(b, good, n), b[i] ^= 0x10;
        osp_kv_scales out;
        assert_int_equal(osp_kv_scales_parse(b, n, &out), OSP_ERR_FORMAT);
    }
    memcpy(b, good, n), b[24 + 4] ^= 1;
    refused(b, n, "corrupt");
    /* bad scales with a valid checksum: each array, NaN, inf, zero, negative, subnormal-small */
    const float bad[] = {NAN, INFINITY, 0.0f, -1.0f, 1e-38f, 1e31f};
    const char *names[] = {"fp8 K scale of layer 0 head 1", "fp8 V", "nvfp4 K", "nvfp4 V scale of layer 2"};
    const size_t offs[] = {24 + 4, 24 + 6 * 4, 24 + 12 * 4, 24 + 15 * 4 + 2 * 4};
    for (size_t k = 0; k < 4; k++)
        for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) {
            memcpy(b, good, n);
            memcpy(b + offs[k], &bad[j], 4);
            reseal(b, n);
            refused(b, n, names[k]);
        }
    free(b), free(good);
    osp_kv_scales_free(&s);
}

static void test_load_errors(void **st) {
    (void)st;
    osp_kv_scales out;
    assert_int_equal(osp_kv_scales_load("/nonexistent/kv.scales", &out), OSP_ERR_IO);
    assert_non_null(strstr(osp_last_error(), "/nonexistent/kv.scales"));
    assert_null(out.fp8_k);
    /* a parse error names the file */
    char path[] = "/tmp/osp_kvs_bad_XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "OSPKVS01", 8), 8);
    close(fd);
    assert_int_equal(osp_kv_scales_load(path, &out), OSP_ERR_FORMAT);
    assert_non_null(strstr(osp_last_error(), path));
    assert_non_null(strstr(osp_last_error(), "truncated"));
    remove(path);
    /* counts out of range, and a bad scale, are refused by save without writing */
    osp_kv_scales s;
    assert_int_equal(osp_kv_scales_init(&s, 0, 1, 1), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_kv_scales_file_bytes(1, 1, 0), 0);
    assert_int_equal(osp_kv_scales_file_bytes(4097, 1, 1), 0);
    s = sample();
    s.fp8_v[3] = -2.0f;
    assert_int_equal(osp_kv_scales_save("/tmp/osp_kvs_never", &s), OSP_ERR_INVALID_ARG);
    assert_int_equal(access("/tmp/osp_kvs_never", F_OK), -1);
    osp_kv_scales_free(&s);
}

static void test_shape_check(void **st) {
    (void)st;
    osp_kv_scales s = sample();
    assert_int_equal(osp_kv_scales_check_shape(&s, 3, 2, 32), OSP_OK);
    assert_int_equal(osp_kv_scales_check_shape(&s, 30, 2, 32), OSP_ERR_INVALID_ARG);
    assert_non_null(strstr(osp_last_error(), "another model"));
    assert_int_equal(osp_kv_scales_check_shape(&s, 3, 3, 32), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_kv_scales_check_shape(&s, 3, 2, 64), OSP_ERR_INVALID_ARG);
    osp_kv_scales_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_shape_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
