/* Reference quantizers (src/core/quantize.c): bytes and error bounds.
 *
 * 1. Bit-exactness: for every row of tests/golden/fixtures/dequant.txt that has an fp32 input
 *    (inputs and the block bytes gguf-py's numpy quantizers made from them,
 *    tests/golden/make_dequant_fixtures.py: F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), quantizing the
 *    input here gives the same bytes. gguf-py mirrors ggml's quantize_row_*_ref. It has no Q8_K;
 *    that one is checked by hand in test_edges.
 * 2. Error bounds: on random rows at several scales, quantize -> osp_dequant_row stays within the
 *    type's bound (derived per block below from the scale), for every value.
 * 3. Edges: zero and constant blocks, sign of the Q4_0 scale, the clamp at 15, Q8_K's rounding and
 *    sums, refusals. */
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

#include "core/dtype.h"
#include "fixture_util.h"
#include "core/quantize.h"

static void test_bytes_match_gguf_py(void **state) {
    (void)state;
    char path[4096];
    const char *root = getenv("OSPREY_ROOT");
    snprintf(path, sizeof path, "%s/tests/golden/fixtures/dequant.txt", root ? root : ".");
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char line[1 << 16];
    int rows = 0;
    unsigned types_seen = 0;
    while (fgets(line, sizeof line, f)) {
        char name[16], *p = line;
        int n, off;
        assert_int_equal(sscanf(p, "%15s %d %n", name, &n, &off), 2);
        p += off;
        const uint32_t t = fixture_type_by_name(name);
        assert_true(t != UINT32_MAX);
        if (p[0] == '-') continue; /* block bytes without an fp32 input (types gguf-py cannot quantize) */
        assert_true(osp_dtype_can_quantize(t));
        types_seen |= 1u << t;
        static uint8_t x[4096], q[4096], mine[4096];
        size_t nx = fixture_unhex(p, x, sizeof x);
        p = strchr(p, ' ') + 1;
        size_t nq = fixture_unhex(p, q, sizeof q);
        assert_int_equal(nx, (size_t)n * 4);
        assert_int_equal(nq, osp_dtype_row_size(t, n));
        float in[1024];
        memcpy(in, x, nx);
        assert_int_equal(osp_quantize_row(t, in, mine, n), OSP_OK);
        for (size_t i = 0; i < nq; i++)
            if (mine[i] != q[i])
                fail_msg("%s row %d: byte %zu (block %zu) is 0x%02x, gguf-py 0x%02x", name, rows, i,
                         i / osp_dtype_type_size(t), mine[i], q[i]);
        rows++;
    }
    fclose(f);
    assert_int_equal(__builtin_popcount(types_seen), 7);
    printf("quantize: %d fixture rows of 7 types byte-identical to gguf-py\n", rows);
}

/* ---- error bounds ----------------------------------------------------------------------------- */

static uint64_t g_state = 0x9e3779b97f4a7c15ull;
static double urand(void) { /* splitmix64 -> [0, 1) */
    uint64_t z = (g_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}
static float nrand(void) { return (float)(sqrt(-2.0 * log(1.0 - urand())) * cos(6.283185307179586 * urand())); }

static float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return osp_fp16_to_fp32(h);
}

/* Max |error| allowed for value x of the block starting at blk (quantized bytes) / xs (inputs). */
static double bound(uint32_t t, const float *xs, int bs, const uint8_t *blk, float x) {
    const double h = 0x1p-11; /* half-precision relative rounding of a stored scale */
    double amax = 0, mn = FLT_MAX, mx = -FLT_MAX;
    for (int j = 0; xs && j < bs; j++) {
        amax = fmax(amax, fabs(xs[j]));
        mn = fmin(mn, xs[j]);
        mx = fmax(mx, xs[j]);
    }
    /* a stored half is off by at most half an ulp, or half the smallest subnormal step (2^-25) when
     * the scale underflows: tiny blocks lose precision in ggml's formats too */
#define HALF_ERR(v) fmax(fabs(v) * h, 0x1p-25)
    switch (t) {
    case OSP_DTYPE_F16: return HALF_ERR(x);
    case OSP_DTYPE_BF16: return fabs(x) * 0x1p-8;
    case OSP_DTYPE_Q8_0: { /* |q d - x| <= d/2, plus |q| <= 127 times the stored scale's error */
        const double d = amax / 127;
        return d * 0.5 + 127 * HALF_ERR(d) + amax * 1e-6;
    }
    case OSP_DTYPE_Q4_0: { /* round to the grid, but the side opposite the max is clamped at q = 15,
                              one step short: up to a whole step d there */
        const double d = amax / 8;
        (void)blk;
        return d + 8 * HALF_ERR(d) + amax * 1e-6;
    }
    case OSP_DTYPE_Q5_0: { /* as Q4_0 with 16 steps each side */
        const double d = amax / 16;
        return d + 16 * HALF_ERR(d) + amax * 1e-6;
    }
    case OSP_DTYPE_Q5_1: { /* as Q4_1 with 31 steps */
        const double d = (mx - mn) / 31;
        return d * 0.5 + 31 * HALF_ERR(d) + HALF_ERR(mn) + (mx - mn) * 1e-6;
    }
    case OSP_DTYPE_Q8_K: /* fp32 scale: round to the grid, d/2 */
        return amax / 127 * 0.5 + amax * 1e-6;
    /* Q4_K, Q6_K: the fitted sub-block scales and mins are themselves quantized to 6 (8) bits, and
     * values can be clamped, so there is no tight closed form; these are sanity bounds over the
     * super-block (the worst seen is about 0.7 of them). Exactness against ggml is a separate
     * matter: gguf-py has no quantizer for these types to compare with. */
    case OSP_DTYPE_Q4_K: return (mx - mn) / 15;
    case OSP_DTYPE_Q6_K: return amax / 31 * 0.75;
    default: { /* Q4_1: d/2, plus the errors of the stored d (|q| <= 15) and min */
        const double d = (mx - mn) / 15;
        return d * 0.5 + 15 * HALF_ERR(d) + HALF_ERR(mn) + (mx - mn) * 1e-6;
    }
    }
#undef HALF_ERR
}

static void test_error_bounds(void **state) {
    (void)state;
    const uint32_t types[] = {OSP_DTYPE_F32,  OSP_DTYPE_F16,  OSP_DTYPE_BF16, OSP_DTYPE_Q8_0, OSP_DTYPE_Q4_0,
                              OSP_DTYPE_Q4_1, OSP_DTYPE_Q5_0, OSP_DTYPE_Q5_1, OSP_DTYPE_Q8_K,
                              OSP_DTYPE_Q4_K, OSP_DTYPE_Q6_K};
    enum { N = 4096 };
    static float x[N], y[N];
    static uint8_t q[N * 4];
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t t = types[ti];
        double worst = 0; /* largest error / bound seen */
        const bool k_quant = t == OSP_DTYPE_Q4_K || t == OSP_DTYPE_Q6_K;
        for (int scale_exp = -6; scale_exp <= 2; scale_exp += 2) {
            /* their fp16 super-block scale (max sub-block scale / 63 or / 128) underflows for small
             * magnitudes: ggml's format, so only magnitudes where it is a normal half are checked */
            if (k_quant && scale_exp < -2) continue;
            const float scale = powf(10.0f, (float)scale_exp);
            for (int i = 0; i < N; i++) x[i] = nrand() * scale + (i % 97 == 0 ? 3.0f * scale : 0.0f);
            assert_int_equal(osp_quantize_row(t, x, q, N), OSP_OK);
            assert_int_equal(osp_dequant_row(t, q, y, N), OSP_OK);
            const size_t ts = osp_dtype_type_size(t);
            for (int i = 0; i < N; i++) {
                const int bs = (int)osp_dtype_block_size(t), blk = bs > 1 ? i / bs : -1;
                double e = fabs((double)y[i] - x[i]);
                double b = t == OSP_DTYPE_F32 ? 0.0
                           : blk >= 0       ? bound(t, x + blk * bs, bs, q + (size_t)blk * ts, x[i])
                                            : bound(t, NULL, 0, NULL, x[i]);
                if (e > b)
                    fail_msg("%s scale 1e%d value %d: %.9g -> %.9g, error %.3g > bound %.3g", osp_dtype_name(t),
                             scale_exp, i, x[i], y[i], e, b);
                if (b > 0 && e / b > worst) worst = e / b;
            }
        }
        printf("quantize %-4s: worst error %.2f of its bound\n", osp_dtype_name(t), worst);
    }
}

static void test_edges(void **state) {
    (void)state;
    float x[32] = {0}, y[32];
    uint8_t q[64];
    /* zero blocks: scale 0, dequantize to zeros */
    const uint32_t qt[] = {OSP_DTYPE_Q8_0, OSP_DTYPE_Q4_0, OSP_DTYPE_Q4_1, OSP_DTYPE_Q5_0, OSP_DTYPE_Q5_1};
    for (int k = 0; k < 5; k++) {
        assert_int_equal(osp_quantize_row(qt[k], x, q, 32), OSP_OK);
        assert_true(half_at(q) == 0.0f);
        assert_int_equal(osp_dequant_row(qt[k], q, y, 32), OSP_OK);
        for (int i = 0; i < 32; i++) assert_true(y[i] == 0.0f);
    }
    /* a constant block is exact in Q4_1 (d = 0, m = the value when it is a half) */
    for (int i = 0; i < 32; i++) x[i] = -1.25f;
    assert_int_equal(osp_quantize_row(OSP_DTYPE_Q4_1, x, q, 32), OSP_OK);
    assert_true(half_at(q) == 0.0f && half_at(q + 2) == -1.25f);
    /* Q4_0: the largest-magnitude value is exact (q = 0), its sign sets d's sign; the first wins on
     * ties; the opposite extreme is clamped to q = 15 */
    for (int i = 0; i < 32; i++) x[i] = (float)(i - 16) / 16.0f; /* -1 .. 0.9375 */
    x[5] = 1.0f;                                             /* ties |x[0]| = 1, comes later */
    assert_int_equal(osp_quantize_row(OSP_DTYPE_Q4_0, x, q, 32), OSP_OK);
    assert_true(half_at(q) == 0.125f); /* max = x[0] = -1, d = -1/-8 */
    assert_int_equal(q[2] & 0x0f, 0);  /* x[0] */
    assert_int_equal(q[2 + 5] & 0x0f, 15); /* x[5] = +1 would be 16: clamped */
    assert_int_equal(osp_dequant_row(OSP_DTYPE_Q4_0, q, y, 32), OSP_OK);
    assert_true(y[0] == -1.0f && y[5] == 0.875f);
    /* Q8_0: round half away from zero; the extreme maps to +-127 */
    for (int i = 0; i < 32; i++) x[i] = 0.0f;
    x[0] = 127.0f, x[1] = 2.5f, x[2] = -2.5f, x[3] = -127.0f;
    assert_int_equal(osp_quantize_row(OSP_DTYPE_Q8_0, x, q, 32), OSP_OK);
    assert_true(half_at(q) == 1.0f);
    assert_int_equal((int8_t)q[2], 127);
    assert_int_equal((int8_t)q[3], 3);
    assert_int_equal((int8_t)q[4], -3);
    assert_int_equal((int8_t)q[5], -127);
    /* NaN does not crash (the bytes are unspecified) */
    x[7] = NAN;
    for (int k = 0; k < 5; k++) assert_int_equal(osp_quantize_row(qt[k], x, q, 32), OSP_OK);
    /* refusals */
    assert_int_equal(osp_quantize_row(OSP_DTYPE_Q4_0, x, q, 31), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_quantize_row(OSP_DTYPE_Q3_K, x, q, 256), OSP_ERR_UNSUPPORTED);
    assert_int_equal(osp_quantize_row(OSP_DTYPE_Q8_0, NULL, q, 32), OSP_ERR_INVALID_ARG);
    assert_false(osp_dtype_can_quantize(OSP_DTYPE_Q2_K));
    assert_false(osp_dtype_can_quantize(UINT32_MAX));
}

/* Q8_K, which gguf-py lacks: scale, sign, half-to-even rounding, the clamp, bsums, zero blocks. */
static void test_q8_k(void **state) {
    (void)state;
    static float x[512], y[512];
    static uint8_t q[2 * 292];
    for (int j = 0; j < 256; j++) x[j] = (float)(j % 64 - 32) * 0.5f; /* -16 .. 15.5 */
    x[3] = 127.0f;                                                     /* largest: maps to -127 */
    x[4] = -127.0f;                                                    /* ties, comes later: +127 */
    x[10] = 2.5f, x[11] = 3.5f, x[12] = -2.5f;                         /* halves round to even */
    for (int j = 256; j < 512; j++) x[j] = 0.0f;                       /* a zero block */
    memset(q, 0x5a, sizeof q);
    assert_int_equal(osp_quantize_row(OSP_DTYPE_Q8_K, x, q, 512), OSP_OK);
    float d;
    memcpy(&d, q, 4);
    assert_true(d == -1.0f); /* 1 / (-127 / 127) */
    const int8_t *qs = (const int8_t *)(q + 4);
    assert_int_equal(qs[3], -127);
    assert_int_equal(qs[4], 127);
    assert_int_equal(qs[10], -2);
    assert_int_equal(qs[11], -4);
    assert_int_equal(qs[12], 2);
    for (int j = 0; j < 256; j++)
        if (j < 3 || j > 12) assert_true((float)qs[j] == -x[j] || fabsf((float)qs[j] + x[j]) == 0.5f);
    for (int k = 0; k < 16; k++) {
        int sum = 0;
        int16_t got;
        for (int j = 0; j < 16; j++) sum += qs[16 * k + j];
        memcpy(&got, q + 260 + 2 * k, 2);
        assert_int_equal(got, sum);
    }
    for (int j = 0; j < 292; j++) assert_int_equal(q[292 + j], 0); /* zero block: all zero */
    assert_int_equal(osp_dequant_row(OSP_DTYPE_Q8_K, q, y, 512), OSP_OK);
    assert_true(y[3] == 127.0f && y[4] == -127.0f && y[11] == 4.0f && y[300] == 0.0f);
    assert_int_equal(osp_quantize_row(OSP_DTYPE_Q8_K, x, q, 32), OSP_ERR_INVALID_ARG);
}

/* Q4_K and Q6_K: zero blocks are all zero, blocks of two values are exact, NaN is memory-safe. */
static void test_q4_k_q6_k(void **state) {
    (void)state;
    static float x[256], y[256];
    static uint8_t q[256];
    const uint32_t kt[] = {OSP_DTYPE_Q4_K, OSP_DTYPE_Q6_K};
    for (int k = 0; k < 2; k++) {
        const uint32_t t = kt[k];
        memset(x, 0, sizeof x);
        memset(q, 0x5a, sizeof q);
        assert_int_equal(osp_quantize_row(t, x, q, 256), OSP_OK);
        assert_int_equal(osp_dequant_row(t, q, y, 256), OSP_OK);
        for (int i = 0; i < 256; i++) assert_true(y[i] == 0.0f);
        if (t == OSP_DTYPE_Q6_K)
            for (size_t i = 0; i < osp_dtype_type_size(t); i++) assert_int_equal(q[i], 0);
        /* two values, 0 and 1 (Q4_K) or 0 and -1 (Q6_K), come back within rounding of the scales */
        for (int i = 0; i < 256; i++) x[i] = i % 3 == 0 ? (t == OSP_DTYPE_Q4_K ? 1.0f : -1.0f) : 0.0f;
        assert_int_equal(osp_quantize_row(t, x, q, 256), OSP_OK);
        assert_int_equal(osp_dequant_row(t, q, y, 256), OSP_OK);
        for (int i = 0; i < 256; i++)
            if (fabsf(y[i] - x[i]) > 1e-3f) fail_msg("%s value %d: %g -> %g", osp_dtype_name(t), i, x[i], y[i]);
        x[9] = NAN;
        assert_int_equal(osp_quantize_row(t, x, q, 256), OSP_OK);
        assert_int_equal(osp_quantize_row(t, x, q, 128), OSP_ERR_INVALID_ARG);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_match_gguf_py),
        cmocka_unit_test(test_error_bounds),
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_q8_k),
        cmocka_unit_test(test_q4_k_q6_k),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
