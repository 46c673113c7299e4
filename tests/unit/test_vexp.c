/* The q8 mode's vector exp (src/backend/cpu/vexp.h) and the ops built on it (ops.h: osp_cpu_vexp_row,
 * osp_cpu_silu_mul_q8): the error against a correctly rounded reference ((float)exp((double)x), within
 * 1 ulp of the true value itself) over a dense sweep of every float bit pattern in [-104, 89] and in
 * [-1, 1], the special values (+-0, +-inf, NaN, the overflow and underflow edges), and -- in AVX512
 * builds -- that the 16-lane kernel gives the scalar kernel's bits lane for lane, so every path of the
 * mode computes the same value and a token's result never depends on its batch. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/ops.h"
#include "backend/cpu/vexp.h"
#include "test_rng.h"

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Distance in units in the last place between two finite non-negative floats (the count of floats
 * between them: subnormals are evenly spaced, so it is the ulp count there too). */
static int64_t ulp_dist(float a, float b) { return llabs((int64_t)bits_of(a) - (int64_t)bits_of(b)); }

/* The largest ulp distance over the floats with bit patterns lo..hi (inclusive, one sign) stepping by
 * `step`, and the scalar kernel's bits against osp_cpu_vexp_row's (the AVX512 kernel where built). */
#define CHUNK 4096
static int64_t sweep(uint32_t lo, uint32_t hi, uint32_t step, double *worst_x) {
    static float x[CHUNK], y[CHUNK];
    int64_t worst = 0;
    uint64_t u = lo;
    while (u <= hi) {
        int n = 0;
        for (; n < CHUNK && u <= hi; n++, u += step) x[n] = float_of((uint32_t)u);
        osp_cpu_vexp_row(x, y, n);
        for (int i = 0; i < n; i++) {
            const float s = osp_vexp_scalar(x[i]);
            if (bits_of(s) != bits_of(y[i])) fail_msg("row kernel %a != scalar %a at x = %a", y[i], s, x[i]);
            const float ref = (float)exp((double)x[i]);
            const int64_t d = ulp_dist(s, ref);
            if (d > worst) worst = d, *worst_x = x[i];
        }
    }
    return worst;
}

static void test_ulp_sweep(void **state) {
    (void)state;
    double wx = 0;
    /* negative floats: bit patterns 0x80000000 (-0) .. bits(-104); positive: 0 .. bits(89) */
    const int64_t neg = sweep(0x80000000u, bits_of(OSP_VEXP_LO), 61, &wx);
    print_message("vexp: max %lld ulp over [-104, 0] (at %a)\n", (long long)neg, wx);
    const int64_t pos = sweep(0u, bits_of(OSP_VEXP_HI), 61, &wx);
    print_message("vexp: max %lld ulp over [0, 89] (at %a)\n", (long long)pos, wx);
    /* every float in [-1, 1] with step 7: softmax's and SiLU's common arguments */
    const int64_t near0 = sweep(bits_of(-0.0f), bits_of(-1.0f), 7, &wx);
    const int64_t near1 = sweep(bits_of(0.0f), bits_of(1.0f), 7, &wx);
    print_message("vexp: max %lld / %lld ulp over [-1, 0] / [0, 1]\n", (long long)near0, (long long)near1);
    assert_true(neg <= 1);
    assert_true(pos <= 1);
    assert_true(near0 <= 1 && near1 <= 1);
}

static void test_special_values(void **state) {
    (void)state;
    struct { float x, want; } cases[] = {
        {0.0f, 1.0f},          {-0.0f, 1.0f},       {-INFINITY, 0.0f},    {INFINITY, INFINITY},
        {-104.0f, 0.0f},       {-1000.0f, 0.0f},    {-FLT_MAX, 0.0f},     {89.0f, INFINITY},
        {88.73f, INFINITY},    {1000.0f, INFINITY}, {FLT_MAX, INFINITY},  {1e-30f, 1.0f},
        {-1e-30f, 1.0f},       {1.0f, 2.71828175f}, {-1.0f, 0.36787945f}, {88.72f, expf(88.72f)},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const float y = osp_vexp_scalar(cases[i].x);
        if (bits_of(y) != bits_of(cases[i].want) && ulp_dist(y, cases[i].want) > 1)
            fail_msg("vexp(%a) = %a, want %a", cases[i].x, y, cases[i].want);
        float v;
        osp_cpu_vexp_row(&cases[i].x, &v, 1);
        assert_int_equal(bits_of(v), bits_of(y));
    }
    assert_true(isfinite(osp_vexp_scalar(88.72f)) && osp_vexp_scalar(88.72f) > 3e38f);
    /* the subnormal range: e^-100 = 3.72e-44 (26.6 times 2^-149), within 1 ulp */
    assert_true(ulp_dist(osp_vexp_scalar(-100.0f), (float)exp(-100.0)) <= 1);
    assert_true(osp_vexp_scalar(-100.0f) > 0.0f);
    /* NaN in, NaN out (the same quiet NaN from every kernel), either sign */
    const float nans[] = {NAN, -NAN, float_of(0x7fa00001u) /* signalling */};
    for (size_t i = 0; i < 3; i++) {
        const float y = osp_vexp_scalar(nans[i]);
        assert_true(isnan(y));
        float v;
        osp_cpu_vexp_row(&nans[i], &v, 1);
        assert_true(isnan(v));
        assert_int_equal(bits_of(v), bits_of(y));
    }
}

/* Rows of every length 1..40 (the 16-lane body and each masked tail), random values over softmax's
 * and SiLU's ranges with specials mixed in: the row kernels give the scalar definitions' bits. */
static void test_rows_match_scalar(void **state) {
    (void)state;
    float x[40], u[40], y[40], z[40];
    for (int trial = 0; trial < 400; trial++) {
        const int n = 1 + trial % 40;
        const float scale = trial % 3 == 0 ? 1.0f : trial % 3 == 1 ? 20.0f : 120.0f;
        for (int i = 0; i < n; i++) {
            x[i] = scale * frand();
            u[i] = 2.0f * frand();
            if (rnd() % 37 == 0) x[i] = (rnd() & 1) ? INFINITY : -INFINITY;
            if (rnd() % 41 == 0) x[i] = (rnd() & 1) ? 0.0f : -0.0f;
        }
        osp_cpu_vexp_row(x, y, n);
        osp_cpu_silu_mul_q8(x, u, z, n);
        for (int i = 0; i < n; i++) {
            assert_int_equal(bits_of(y[i]), bits_of(osp_vexp_scalar(x[i])));
            const float e = osp_vexp_scalar(-x[i]);
            const float d = 1.0f + e;
            const float s = x[i] / d;
            const float want = s * u[i];
            if (bits_of(z[i]) != bits_of(want)) fail_msg("silu_mul_q8(%a) = %a, want %a", x[i], z[i], want);
            /* and near the default path's silu (expf): a few ulp of the product, where finite */
            const float ref = x[i] / (1.0f + expf(-x[i])) * u[i];
            if (isfinite(ref) && fabsf(ref) > 1e-30f) assert_true(fabsf(z[i] - ref) <= 4e-7f * fabsf(ref));
        }
        /* in place (out aliases gate) */
        memcpy(y, x, sizeof x);
        osp_cpu_silu_mul_q8(y, u, y, n);
        assert_memory_equal(y, z, (size_t)n * sizeof(float));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ulp_sweep),
        cmocka_unit_test(test_special_values),
        cmocka_unit_test(test_rows_match_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
