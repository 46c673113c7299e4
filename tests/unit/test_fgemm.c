/* fp32 GEMM tiles (src/backend/cpu/fgemm.h) against osp_cpu_matmul_rows, bit for bit: F32, F16 and BF16
 * weights read in place, a quantized type (Q4_K) and bf16-rounded rows through the dequantized panel;
 * every row count 1..9 past an odd first row (the 1-3 row tails), every token count 1..9 (the 1-3 token
 * tails), reductions of 16..608 values and a row block boundary (rows past 256 KB of weights); all-zero
 * and -0.0 inputs, tiny (subnormal products) and huge values; on every kernel family this CPU has
 * (osp_qdot_force_isa). A reduction that is not a multiple of 16 must take the plain path and still
 * agree. Deterministic inputs (test_rng.h); families the CPU lacks are skipped with a message. */
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

/* rows x cols weights of `type` (F32, F16, BF16 or Q4_K from random floats); returns row bytes. */
static size_t make_weights(uint32_t type, int64_t rows, int64_t cols, int mode, uint8_t **out) {
    const size_t rb = osp_dtype_row_size(type, cols);
    uint8_t *w = malloc(rb * (size_t)rows);
    float *f = malloc(sizeof(float) * (size_t)cols);
    assert_non_null(w);
    assert_non_null(f);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) f[c] = value(mode);
        uint8_t *p = w + (size_t)r * rb;
        switch (type) {
        case OSP_DTYPE_F32: memcpy(p, f, rb); break;
        case OSP_DTYPE_F16:
            for (int64_t c = 0; c < cols; c++) {
                const uint16_t h = osp_fp32_to_fp16(f[c]);
                memcpy(p + 2 * c, &h, 2);
            }
            break;
        case OSP_DTYPE_BF16:
            for (int64_t c = 0; c < cols; c++) {
                const uint16_t h = osp_fp32_to_bf16(f[c]);
                memcpy(p + 2 * c, &h, 2);
            }
            break;
        default: assert_int_equal(osp_quantize_row(type, f, p, cols), OSP_OK); break;
        }
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
    float *x = malloc(sizeof(float) * (size_t)(T * cols));
    float *ya = malloc(sizeof(float) * (size_t)(T * rows));
    float *yb = malloc(sizeof(float) * (size_t)(T * rows));
    float *panel = malloc(sizeof(float) * (size_t)osp_cpu_fgemm_panel_floats(cols));
    assert_non_null(x);
    assert_non_null(ya);
    assert_non_null(yb);
    assert_non_null(panel);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiles_every_isa),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
