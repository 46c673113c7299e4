/* Element types: ggml's block layouts reproduced bit for bit.
 *
 * The fixture tests/golden/fixtures/dequant.txt was made with the `gguf` Python package (gguf-py's
 * numpy quantizers/dequantizers, tests/golden/make_dequant_fixtures.py): for F16, BF16, Q4_0, Q4_1,
 * Q8_0, Q5_0 and Q5_1 rows it holds the input, the block bytes and the dequantized values; for Q2_K,
 * Q3_K, Q4_K, Q5_K and Q6_K (which gguf-py cannot quantize) random block bytes and their dequantized
 * values. Dequantization must match exactly; so must fp32 -> f16/bf16 rounding. gguf-py lacks Q8_K,
 * so it is checked by hand. Plus the type table's sizes and edge cases of the half-precision
 * conversions. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/dtype.h"
#include "fixture_util.h"

static void test_dequant_matches_gguf_py(void **state) {
    (void)state;
    char path[4096];
    const char *root = getenv("OSPREY_ROOT");
    snprintf(path, sizeof path, "%s/tests/golden/fixtures/dequant.txt", root ? root : ".");
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char line[1 << 16];
    int rows = 0, types_seen = 0, rows_of[OSP_DTYPE_COUNT] = {0};
    uint32_t last_type = UINT32_MAX;
    while (fgets(line, sizeof line, f)) {
        char name[16], *p = line;
        int n, off;
        assert_int_equal(sscanf(p, "%15s %d %n", name, &n, &off), 2);
        p += off;
        const uint32_t t = fixture_type_by_name(name);
        assert_true(t != UINT32_MAX);
        if (t != last_type) types_seen++, last_type = t;
        static uint8_t x[4096], q[4096], y[4096];
        const bool no_input = p[0] == '-'; /* a row made from random block bytes */
        size_t nx = no_input ? 0 : fixture_unhex(p, x, sizeof x);
        p = strchr(p, ' ') + 1;
        size_t nq = fixture_unhex(p, q, sizeof q);
        p = strchr(p, ' ') + 1;
        size_t ny = fixture_unhex(p, y, sizeof y);
        assert_int_equal(nx, no_input ? 0 : (size_t)n * 4);
        assert_int_equal(ny, (size_t)n * 4);
        assert_int_equal(nq, osp_dtype_row_size(t, n));
        float out[1024];
        assert_int_equal(osp_dequant_row(t, q, out, n), OSP_OK);
        if (memcmp(out, y, (size_t)n * 4) != 0) {
            for (int i = 0; i < n; i++) {
                float e;
                memcpy(&e, y + 4 * i, 4);
                if (memcmp(&out[i], &e, 4) != 0) fail_msg("%s row %d value %d: %g, gguf-py %g", name, rows, i, out[i], e);
            }
        }
        if (t == OSP_DTYPE_F16 || t == OSP_DTYPE_BF16) { /* the rounding direction too */
            for (int i = 0; i < n; i++) {
                float xi;
                uint16_t h, ref;
                memcpy(&xi, x + 4 * i, 4);
                memcpy(&ref, q + 2 * i, 2);
                h = t == OSP_DTYPE_F16 ? osp_fp32_to_fp16(xi) : osp_fp32_to_bf16(xi);
                if (h != ref) fail_msg("%s: %g rounds to 0x%04x, gguf-py 0x%04x", name, xi, h, ref);
            }
        }
        rows++;
        rows_of[t]++;
    }
    fclose(f);
    assert_int_equal(types_seen, 12);
    printf("dequant: %d rows of 12 types bit-identical to gguf-py:", rows);
    for (uint32_t t = 0; t < OSP_DTYPE_COUNT; t++)
        if (rows_of[t]) printf(" %s %d", osp_dtype_name(t), rows_of[t]);
    printf("\n");
}

static void test_type_table(void **state) {
    (void)state;
    /* sizes from ggml-common.h static_asserts */
    assert_int_equal(osp_dtype_type_size(OSP_DTYPE_Q4_0), 18);
    assert_int_equal(osp_dtype_type_size(OSP_DTYPE_Q4_1), 20);
    assert_int_equal(osp_dtype_type_size(OSP_DTYPE_Q8_0), 34);
    assert_int_equal(osp_dtype_type_size(OSP_DTYPE_Q4_K), 144);
    assert_int_equal(osp_dtype_type_size(OSP_DTYPE_Q6_K), 210);
    assert_int_equal(osp_dtype_type_size(OSP_DTYPE_Q8_K), 292);
    assert_int_equal(osp_dtype_block_size(OSP_DTYPE_Q2_K), 256);
    assert_int_equal(osp_dtype_row_size(OSP_DTYPE_Q4_1, 576), 18 * 20);
    assert_null(osp_dtype_name(4)); /* removed Q4_2 */
    assert_null(osp_dtype_name(OSP_DTYPE_COUNT));
    assert_null(osp_dtype_name(UINT32_MAX));
    assert_int_equal(osp_dtype_type_size(OSP_DTYPE_Q5_0), 22);
    assert_int_equal(osp_dtype_type_size(OSP_DTYPE_Q5_1), 24);
    assert_int_equal(osp_dtype_type_size(OSP_DTYPE_Q2_K), 84);
    assert_int_equal(osp_dtype_type_size(OSP_DTYPE_Q3_K), 110);
    assert_int_equal(osp_dtype_type_size(OSP_DTYPE_Q5_K), 176);
    assert_false(osp_dtype_can_dequant(OSP_DTYPE_IQ2_XXS));
    assert_false(osp_dtype_can_dequant(OSP_DTYPE_Q8_1));
    assert_true(osp_dtype_can_dequant(OSP_DTYPE_Q2_K));
    float out[256];
    uint8_t zeros[512] = {0};
    assert_int_equal(osp_dequant_row(OSP_DTYPE_IQ2_XXS, zeros, out, 256), OSP_ERR_UNSUPPORTED);
    assert_int_equal(osp_dequant_row(OSP_DTYPE_Q6_K, zeros, out, 128), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_dequant_row(OSP_DTYPE_Q4_0, zeros, out, 31), OSP_ERR_INVALID_ARG);
}

/* Q8_K { float d; int8 qs[256]; int16 bsums[16]; }: x = d*q, bsums ignored. gguf-py has no Q8_K,
 * so this builds blocks by hand: every int8 value, a negative and a subnormal float d. */
static void test_q8_k(void **state) {
    (void)state;
    static uint8_t b[2 * 292];
    const float ds[2] = {-0.0371f, 0x1p-140f};
    for (int k = 0; k < 2; k++) {
        memcpy(b + 292 * k, &ds[k], 4);
        for (int j = 0; j < 256; j++) b[292 * k + 4 + j] = (uint8_t)(j * 37 + k);
        memset(b + 292 * k + 260, 0xab, 32); /* bsums: not read */
    }
    float y[512];
    assert_int_equal(osp_dequant_row(OSP_DTYPE_Q8_K, b, y, 512), OSP_OK);
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 256; j++) {
            const float want = ds[k] * (float)(int8_t)(uint8_t)(j * 37 + k);
            assert_memory_equal(&y[256 * k + j], &want, 4);
        }
}

static void test_half_edges(void **state) {
    (void)state;
    /* every half converts to float and back unchanged (NaN payloads stay NaN) */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = osp_fp16_to_fp32((uint16_t)h);
        if (isnan(f)) {
            assert_true(isnan(osp_fp16_to_fp32(osp_fp32_to_fp16(f))));
            continue;
        }
        assert_int_equal(osp_fp32_to_fp16(f), h);
        assert_true(osp_bf16_to_fp32(osp_fp32_to_bf16(f)) == f || fabsf(f) < 1e-37f || isinf(f) ||
                    fabsf(osp_bf16_to_fp32(osp_fp32_to_bf16(f)) - f) <= fabsf(f) * 0x1p-8f);
    }
    assert_true(osp_fp16_to_fp32(0x3c00) == 1.0f);
    assert_true(osp_fp16_to_fp32(0x0001) == 0x1p-24f);      /* smallest subnormal */
    assert_int_equal(osp_fp32_to_fp16(65520.0f), 0x7c00);  /* rounds up to inf */
    assert_int_equal(osp_fp32_to_fp16(65519.0f), 0x7bff);  /* max finite */
    assert_int_equal(osp_fp32_to_fp16(0x1p-25f), 0x0000);  /* tie to even: 0 */
    assert_int_equal(osp_fp32_to_fp16(0x1.8p-25f), 0x0001);
    assert_int_equal(osp_fp32_to_bf16(1.0f + 0x1p-8f), 0x3f80); /* tie to even */
    assert_int_equal(osp_fp32_to_bf16(1.0f + 0x1.8p-8f), 0x3f81);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_matches_gguf_py),
        cmocka_unit_test(test_type_table),
        cmocka_unit_test(test_q8_k),
        cmocka_unit_test(test_half_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
