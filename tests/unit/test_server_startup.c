/* serve's start-up warning for a KV cache smaller than one max_model_len sequence
 * (srv_kv_capacity_warning, tools/server/serve_startup.c): none when one sequence fits, exactly at the
 * edge included (the last token needs no KV); otherwise one line naming the cache's tokens, max_model_len,
 * the longest request that is served, and the flag to change (--kv-cache-memory with the size that fits,
 * or on an auto-sized GPU cache --gpu-memory-utilization too), and --max-model-len. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "serve_internal.h"

static void test_fits_no_warning(void **state) {
    (void)state;
    char out[512] = "x";
    /* 8192 tokens of max_model_len need ceil(8191 / 16) = 512 blocks */
    assert_int_equal(srv_kv_capacity_warning(out, sizeof out, 512, 16, 8192, 1 << 20, false, 0.9), 0);
    assert_string_equal(out, "");
    assert_int_equal(srv_kv_capacity_warning(out, sizeof out, 4096, 16, 8192, 1 << 20, false, 0.9), 0);
    assert_int_equal(srv_kv_capacity_warning(out, sizeof out, 1, 16, 17, 1 << 20, false, 0.9), 0); /* 16 tokens of KV */
}

static void test_too_small_warns(void **state) {
    (void)state;
    char out[512];
    /* one block short of one sequence: 511 blocks of 16 = 8176 tokens, 1 MiB a block */
    const int n = srv_kv_capacity_warning(out, sizeof out, 511, 16, 8192, 1 << 20, false, 0.9);
    assert_int_equal(n, (int)strlen(out));
    assert_true(n > 0);
    assert_null(strchr(out, '\n'));
    assert_non_null(strstr(out, "holds 8176 tokens (511 blocks of 16)"));
    assert_non_null(strstr(out, "max_model_len sequence (8192 tokens)"));
    assert_non_null(strstr(out, "exceed 8177 tokens will be refused (400)"));
    assert_non_null(strstr(out, "--kv-cache-memory 512M or more (now 511M)"));
    assert_non_null(strstr(out, "--max-model-len to 8177"));
    assert_null(strstr(out, "--gpu-memory-utilization"));
    assert_int_equal(srv_kv_capacity_warning(out, sizeof out, 1, 16, 18, 1 << 20, false, 0.9) > 0, true);
}

static void test_gpu_auto_names_utilization(void **state) {
    (void)state;
    char out[512];
    assert_true(srv_kv_capacity_warning(out, sizeof out, 100, 16, 131072, 2 << 20, true, 0.5) > 0);
    assert_non_null(strstr(out, "--gpu-memory-utilization (now 0.50)"));
    assert_non_null(strstr(out, "--kv-cache-memory 16384M or more")); /* 8192 blocks of 2 MiB */
    /* a short buffer: cut, still terminated, the length of what was written */
    char small[40];
    const int n = srv_kv_capacity_warning(small, sizeof small, 100, 16, 131072, 2 << 20, true, 0.5);
    assert_int_equal(n, (int)strlen(small));
    assert_int_equal(n, (int)sizeof small - 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fits_no_warning),
        cmocka_unit_test(test_too_small_warns),
        cmocka_unit_test(test_gpu_auto_names_utilization),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
