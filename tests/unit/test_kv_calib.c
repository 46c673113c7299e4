/* The KV scale calibrator (src/kv/kv_calib.h, `osprey calibrate-kv`): statistics of known rows
 * (absmax, percentiles, outlier share, NVFP4 micro-block scale rates), the exact reconstruction error
 * it reports against a direct computation, and the scales each rule picks: the least-error rule moves
 * fp8's scale off the default when the default would push small values into E4M3's subnormals, and
 * the range rules put the largest value (or micro-block) on E4M3's 448. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/dtype.h"
#include "core/status_internal.h"
#include "kv/kv_calib.h"

#define L 2
#define H 2
#define D 32
#define T 200

/* rows [T, H, D]: K of layer 0 head 0 ~ a few units with an outlier of 40 every 10th token, head 1 tiny
 * (1e-3 scale); V of layer 0 constant 0.5 */
static void fill(float *k, float *v) {
    uint32_t x = 12345;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) {
                x = x * 1664525u + 1013904223u;
                const float u = (float)(x >> 8) / 16777216.0f * 2.0f - 1.0f; /* [-1, 1) */
                const size_t i = ((size_t)t * H + (size_t)h) * D + (size_t)d;
                k[i] = h == 0 ? (d == 5 && t % 10 == 0 ? 40.0f : 3.0f * u) : 1e-3f * u;
                v[i] = 0.5f;
            }
}

static void test_stats_and_rules(void **st) {
    (void)st;
    static float k[T * H * D], v[T * H * D];
    fill(k, v);
    osp_kv_calib *c;
    assert_int_equal(osp_kv_calib_create(L, H, D, &c), OSP_OK);
    osp_kv_scales s;
    assert_int_equal(osp_kv_calib_choose(c, OSP_KVC_RULE_MSE, &s), OSP_ERR_INVALID_ARG); /* nothing seen */
    for (int l = 0; l < L; l++) osp_kv_calib_add_rows(c, l, 0, k, T), osp_kv_calib_add_rows(c, l, 1, v, T);
    osp_kv_calib_stats a;
    osp_kv_calib_stats_of(c, 0, 0, 0, &a);
    assert_int_equal(a.n, T * D);
    assert_true(a.absmax == 40.0);
    /* 1 value in 320 is 40: the 99.9th percentile is 40 too (upper bin edge, within 2.2 %) */
    assert_true(a.p999 >= 40.0 * 0.978 && a.p999 <= 40.0);
    assert_true(fabs(a.outlier_share - 1.0 / 320) < 1e-9); /* 40 > 6 x rms (~2.8), 3 x u is not */
    osp_kv_calib_stats_of(c, 0, 1, -1, &a);
    assert_true(a.absmax == 0.5 && fabs(a.rms - 0.5) < 1e-9 && a.outlier_share == 0.0);
    /* nvfp4 micro-block scales of V (amax 0.5): 0.5 / 6 / t; subnormal (< 2^-6) from t > 5.33 */
    osp_kv_calib_nvfp4_rates r;
    osp_kv_calib_nvfp4_rates_of(c, 0, 1, 1.0f, &r);
    assert_true(r.saturated == 0 && r.subnormal == 0 && r.zero == 0);
    osp_kv_calib_nvfp4_rates_of(c, 0, 1, 8.0f, &r);
    assert_true(r.saturated == 0 && r.subnormal == 1.0 && r.zero == 0);
    osp_kv_calib_nvfp4_rates_of(c, 0, 1, 1.0f / 8192, &r); /* 0.5 / 6 * 8192 = 683 > 448 */
    assert_true(r.saturated == 1.0);
    /* the reported fp8 error is the direct one (head 1 of K at scale 1: values ~1e-3, deep in E4M3's
     * subnormals, step 2^-9 ~ 2e-3) */
    float one[H] = {1.0f, 1.0f};
    double e = 0, x2 = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) {
                const float x = k[((size_t)t * H + (size_t)h) * D + (size_t)d];
                const double q = osp_e4m3_to_fp32(osp_fp32_to_e4m3(x));
                e += (x - q) * (x - q), x2 += (double)x * x;
            }
    assert_true(fabs(osp_kv_calib_fp8_rel_err(c, 0, 0, one) - e / x2) <= 1e-9 * (e / x2));
    float bad[H] = {0.3f, 1.0f};
    assert_true(isnan(osp_kv_calib_fp8_rel_err(c, 0, 0, bad))); /* not a candidate */
    /* least error: head 1's scale drops far below 1 (its values become normal E4M3 numbers), head 0's
     * stays where 40 does not saturate */
    assert_int_equal(osp_kv_calib_choose(c, OSP_KVC_RULE_MSE, &s), OSP_OK);
    assert_true(s.fp8_k[1] <= 1.0f / 64);
    assert_true(40.0f / s.fp8_k[0] <= 448.0f);
    const double chosen = osp_kv_calib_fp8_rel_err(c, 0, 0, s.fp8_k);
    assert_true(chosen < 0.01 * osp_kv_calib_fp8_rel_err(c, 0, 0, one) + 1e-3);
    for (int l = 0; l < L; l++) assert_true(s.nvfp4_k[l] > 0 && s.nvfp4_v[l] > 0);
    osp_kv_scales_free(&s);
    /* range rules */
    assert_int_equal(osp_kv_calib_choose(c, OSP_KVC_RULE_ABSMAX, &s), OSP_OK);
    assert_true(fabsf(s.fp8_k[0] - 40.0f / 448) < 1e-6f);
    assert_true(fabsf(s.fp8_v[0] - 0.5f / 448) < 1e-6f);
    /* V's micro-blocks all have amax 0.5: T = 0.5 / 2688 within one bin (2.2 %) */
    assert_true(s.nvfp4_v[0] >= 0.5f / 2688 && s.nvfp4_v[0] <= 0.5f / 2688 * 1.03f);
    osp_kv_scales_free(&s);
    assert_int_equal(osp_kv_calib_choose(c, OSP_KVC_RULE_P9999, &s), OSP_OK);
    assert_true(s.fp8_k[0] <= 40.0f / 448 + 1e-6f);
    osp_kv_scales_free(&s);
    assert_int_equal(osp_kv_calib_choose(c, (osp_kv_calib_rule)7, &s), OSP_ERR_INVALID_ARG);
    osp_kv_calib_free(c);
    assert_int_equal(osp_kv_calib_create(1, 1, 24, &c), OSP_ERR_INVALID_ARG); /* head_dim not a multiple of 16 */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stats_and_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
