/* fp32 GEMM tiles (src/backend/cpu/fgemm.h) against osp_cpu_matmul_rows, bit for bit: F32, F16 and BF16
 * weights read in place, a quantized type (Q4_K) and bf16-rounded rows through the dequantized panel;
 * every row count 1..9 past an odd first row (the 1-3 row tails), every token count 1..9 (the 1-3 token
 * tails), reductions of 16..608 values and a row block boundary (rows past 256 KB of weights); all-zero
 * and -0.0 inputs, tiny (subnormal products) and huge values; on every kernel family this CPU has
 * (osp_qdot_force_isa). A reduction that is not a multiple of 16 must take the plain path and still
 * agree. Then the one-level mode's BF16 path (VDPBF16PS): tile-invariant bits and accuracy against a
 * double dot of what it multiplies. Deterministic inputs (test_rng.h); kernel families the CPU lacks are
 * skipped with a message. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/fgemm.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/qdot.h"
#include "core/dtype.h"
#include "core/quantize.h"
#include "test_rng.h"

static float value(int mode) {
    switch (mode) {
    case 1: return 0.0f;
    case 2: return -0.0f;
    case 3: return 1e-30f * frand(); /* products below the normal range */
    case 4: return 1e18f * frand();
    default: return frand() * (rnd() % 40 == 0 ? 50.0f : 1.0f);
    }
}

static void *must_alloc(size_t n) {
    void *p = malloc(n);
    assert_non_null(p);
    return p;
}

/* rows x cols weights of `type` (F32, F16, BF16 or Q4_K, by osp_quantize_row from random floats);
 * returns row bytes. */
static size_t make_weights(uint32_t type, int64_t rows, int64_t cols, int mode, uint8_t **out) {
    const size_t rb = osp_dtype_row_size(type, cols);
    uint8_t *w = must_alloc(rb * (size_t)rows);
    float *f = must_alloc(sizeof(float) * (size_t)cols);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) f[c] = value(mode);
        assert_int_equal(osp_quantize_row(type, f, w + (size_t)r * rb, cols), OSP_OK);
    }
    free(f);
    *out = w;
    return rb;
}

/* One case: every row range [r0, r0 + n) with n = 1..9 and every token count 1..9, plus all rows and
 * 9 tokens; the tiled result must equal the reference's bits (both written into NaN-filled outputs). */
static void check_case(uint32_t type, bool round_bf16, int64_t rows, int64_t cols, int wmode, int xmode) {
    uint8_t *w;
    const size_t rb = make_weights(type, rows, cols, wmode, &w);
    const osp_weight wt = {.data = w, .type = type, .cols = cols, .rows = rows, .row_bytes = rb, .round_bf16 = round_bf16};
    const int64_t T = 9;
    float *x = must_alloc(sizeof(float) * (size_t)(T * cols));
    float *ya = must_alloc(sizeof(float) * (size_t)(T * rows));
    float *yb = must_alloc(sizeof(float) * (size_t)(T * rows));
    float *panel = must_alloc(sizeof(float) * (size_t)osp_cpu_fgemm_panel_floats(cols));
    for (int64_t i = 0; i < T * cols; i++) x[i] = value(xmode);
    for (int64_t n = 1; n <= 10; n++) {
        const int64_t r0 = n == 10 ? 0 : rows > 12 ? 3 : 0;
        const int64_t r1 = n == 10 ? rows : r0 + n < rows ? r0 + n : rows;
        for (int64_t nt = 1; nt <= T; nt++) {
            for (int64_t i = 0; i < T * rows; i++) ya[i] = yb[i] = NAN;
            osp_cpu_matmul_rows(&wt, x, ya, rows, nt, r0, r1, panel);
            osp_cpu_fgemm_rows(&wt, x, yb, rows, nt, r0, r1, panel);
            if (memcmp(ya, yb, sizeof(float) * (size_t)(T * rows)) != 0) {
                for (int64_t i = 0; i < T * rows; i++)
                    if (memcmp(&ya[i], &yb[i], sizeof(float)) != 0) {
                        fail_msg("type %u round_bf16 %d rows [%lld, %lld) of %lld cols %lld tokens %lld: y[%lld] %a vs %a",
                                 type, round_bf16, (long long)r0, (long long)r1, (long long)rows, (long long)cols,
                                 (long long)nt, (long long)i, (double)ya[i], (double)yb[i]);
                    }
            }
        }
    }
    free(panel);
    free(yb);
    free(ya);
    free(x);
    free(w);
}

static void run_all(void) {
    static const uint32_t types[] = {OSP_DTYPE_F32, OSP_DTYPE_F16, OSP_DTYPE_BF16};
    static const int64_t cols[] = {16, 48, 256, 608, 40};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t ci = 0; ci < sizeof cols / sizeof cols[0]; ci++) check_case(types[ti], false, 23, cols[ci], 0, 0);
    /* the panel: a quantized type, and bf16-rounded rows of F32 and F16 */
    check_case(OSP_DTYPE_Q4_K, false, 23, 256, 0, 0);
    check_case(OSP_DTYPE_Q4_K, false, 23, 512, 0, 0);
    check_case(OSP_DTYPE_F32, true, 23, 48, 0, 0);
    check_case(OSP_DTYPE_F16, true, 23, 48, 0, 0);
    /* zeros, -0.0, tiny and huge values */
    for (int wm = 1; wm <= 4; wm++)
        for (int xm = 0; xm <= 4; xm++) check_case(OSP_DTYPE_F32, false, 7, 32, wm, xm);
    check_case(OSP_DTYPE_F16, false, 7, 32, 3, 4);
    check_case(OSP_DTYPE_BF16, false, 7, 32, 4, 4);
    /* more rows than one block holds: 256 KB / (2048 * 2) = 64 rows per F16 block, 32 per F32 block,
     * 16 per panel block */
    check_case(OSP_DTYPE_F16, false, 70, 2048, 0, 0);
    check_case(OSP_DTYPE_F32, false, 70, 2048, 0, 0);
    check_case(OSP_DTYPE_Q4_K, false, 37, 2048, 0, 0);
}

static void test_tiles_every_isa(void **state) {
    (void)state;
    static const char *isas[] = {"avx512vnni", "avx2", "scalar"};
    for (size_t i = 0; i < 3; i++) {
        if (!osp_qdot_force_isa(isas[i])) {
            printf("# %s: not on this CPU, skipped\n", isas[i]);
            continue;
        }
        run_all();
    }
    assert_true(osp_qdot_force_isa("scalar"));
    if (!osp_qdot_force_isa("avx512vnni")) (void)osp_qdot_force_isa("avx2"); /* back to the best */
}

/* The one-level mode's BF16 path (VDPBF16PS on bf16-rounded activations): every tile shape and row split
 * gives the bits of one token and one row at a time (batch invariance), and each output is within float
 * summation error of the double-precision dot of the bf16 weights and the bf16-rounded activations. */
static void check_bf16(int64_t rows, int64_t cols, int wmode, int xmode) {
    uint8_t *w;
    const size_t rb = make_weights(OSP_DTYPE_BF16, rows, cols, wmode, &w);
    const osp_weight wt = {.data = w, .type = OSP_DTYPE_BF16, .cols = cols, .rows = rows, .row_bytes = rb};
    assert_true(osp_cpu_fgemm_bf16_ok(&wt));
    const int64_t T = 13;
    float *x = must_alloc(sizeof(float) * (size_t)(T * cols));
    float *ya = must_alloc(sizeof(float) * (size_t)(T * rows));
    float *yb = must_alloc(sizeof(float) * (size_t)(T * rows));
    float *panel = must_alloc(sizeof(float) * (size_t)osp_cpu_fgemm_panel_floats(cols));
    for (int64_t i = 0; i < T * cols; i++) x[i] = value(xmode);
    for (int64_t t = 0; t < T; t++) /* one token, one row at a time */
        for (int64_t r = 0; r < rows; r++) osp_cpu_fgemm_bf16_rows(&wt, x + t * cols, ya + t * rows, rows, 1, r, r + 1, panel);
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < rows; r++) {
            double ref = 0.0, mag = 0.0;
            for (int64_t c = 0; c < cols; c++) {
                uint16_t h;
                memcpy(&h, w + (size_t)r * rb + 2 * (size_t)c, 2);
                const double p = (double)osp_bf16_to_fp32(h) * (double)osp_bf16_to_fp32(osp_fp32_to_bf16(x[t * cols + c]));
                ref += p;
                mag += fabs(p);
            }
            const double got = ya[t * rows + r];
            if (!(fabs(got - ref) <= 4e-7 * (double)cols * mag + 1e-30))
                fail_msg("bf16 path, %lld cols, row %lld token %lld: %.9g against %.9g (sum |products| %.3g)",
                         (long long)cols, (long long)r, (long long)t, got, ref, mag);
        }
    for (int64_t nt = 1; nt <= T; nt++)
        for (int64_t r0 = 0; r0 < 4 && r0 < rows; r0 += 3) {
            for (int64_t i = 0; i < T * rows; i++) yb[i] = NAN;
            osp_cpu_fgemm_bf16_rows(&wt, x, yb, rows, nt, r0, rows, panel);
            for (int64_t t = 0; t < nt; t++)
                for (int64_t r = r0; r < rows; r++)
                    if (memcmp(&ya[t * rows + r], &yb[t * rows + r], sizeof(float)) != 0)
                        fail_msg("bf16 path, %lld cols, %lld tokens from row %lld: row %lld token %lld %a, alone %a",
                                 (long long)cols, (long long)nt, (long long)r0, (long long)r, (long long)t,
                                 (double)yb[t * rows + r], (double)ya[t * rows + r]);
        }
    free(panel);
    free(yb);
    free(ya);
    free(x);
    free(w);
}

static void test_bf16_products(void **state) {
    (void)state;
    const osp_weight probe = {.type = OSP_DTYPE_BF16, .cols = 64, .rows = 1, .row_bytes = 128};
    if (!osp_cpu_fgemm_bf16_ok(&probe)) {
        printf("# the BF16 path: this CPU has no AVX512-BF16 (or no avx512vnni family), skipped\n");
        return;
    }
    check_bf16(23, 32, 0, 0);
    check_bf16(23, 608, 0, 0);
    check_bf16(70, 2048, 0, 0); /* past one row block (64 rows of 2,048 bf16) */
    for (int m = 1; m <= 4; m++) check_bf16(7, 64, m, m == 1 ? 0 : m);
    const osp_weight odd = {.type = OSP_DTYPE_BF16, .cols = 48, .rows = 1, .row_bytes = 96};
    assert_false(osp_cpu_fgemm_bf16_ok(&odd)); /* 48 % 32: the exact tiles take it */
    const osp_weight f16 = {.type = OSP_DTYPE_F16, .cols = 64, .rows = 1, .row_bytes = 128};
    assert_false(osp_cpu_fgemm_bf16_ok(&f16));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiles_every_isa),
        cmocka_unit_test(test_bf16_products),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
