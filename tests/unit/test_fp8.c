/* FP8 E4M3, FP4 E2M1 and NVFP4 micro-blocks (src/core/dtype.c) against ml_dtypes (Google's numpy
 * float8_e4m3fn / float4_e2m1fn, written independently of osprey): tests/golden/fixtures/fp8.txt, made
 * by tests/golden/make_fp8_fixtures.py, every row bit-exact. Beyond the fixture: saturation where
 * ml_dtypes gives NaN (osprey's E4M3 writer saturates at +-448, as CUDA's __NV_SATFINITE), every code
 * surviving a round trip, and NVFP4's reconstruction error within half an E2M1 step of its scale. */
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

static float from_bits(uint32_t b) {
    float f;
    memcpy(&f, &b, 4);
    return f;
}
static uint32_t to_bits(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}
static bool same(float a, float b) { return (isnan(a) && isnan(b)) || to_bits(a) == to_bits(b); }

static void test_golden(void **state) {
    (void)state;
    const char *root = getenv("OSPREY_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/tests/golden/fixtures/fp8.txt", root ? root : ".");
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    char line[1024];
    int counts[5] = {0};
    while (fgets(line, sizeof line, f)) {
        char kind[16];
        unsigned a, b;
        if (sscanf(line, "%15s", kind) != 1) continue;
        if (!strcmp(kind, "E4M3_DEC") || !strcmp(kind, "E2M1_DEC")) {
            assert_int_equal(sscanf(line, "%*s %x %x", &a, &b), 2);
            const float got = kind[1] == '4' ? osp_e4m3_to_fp32((uint8_t)a) : osp_e2m1_to_fp32((uint8_t)a);
            if (!same(got, from_bits(b))) fail_msg("%s %02x: %g, ml_dtypes %g", kind, a, got, from_bits(b));
            counts[kind[1] == '4' ? 0 : 2]++;
        } else if (!strcmp(kind, "E4M3_ENC") || !strcmp(kind, "E2M1_ENC")) {
            assert_int_equal(sscanf(line, "%*s %x %x", &a, &b), 2);
            const float x = from_bits(a);
            const unsigned got = kind[1] == '4' ? osp_fp32_to_e4m3(x) : osp_fp32_to_e2m1(x);
            if (got != b) fail_msg("%s %.9g: code %02x, ml_dtypes %02x", kind, x, got, b);
            counts[kind[1] == '4' ? 1 : 3]++;
        } else if (!strcmp(kind, "NVFP4")) {
            const char *p = line + 6;
            unsigned v[17], sc;
            char hex[17];
            int off = 0;
            for (int i = 0; i < 17; i++) {
                assert_int_equal(sscanf(p, "%x%n", &v[i], &off), 1);
                p += off;
            }
            assert_int_equal(sscanf(p, "%x %16s", &sc, hex), 2);
            float x[16];
            for (int i = 0; i < 16; i++) x[i] = from_bits(v[i + 1]);
            uint8_t packed[8], scale;
            osp_nvfp4_quantize16(x, from_bits(v[0]), packed, &scale);
            char got[17];
            for (int i = 0; i < 8; i++) snprintf(got + 2 * i, 3, "%02x", packed[i]);
            if (scale != sc || strcmp(got, hex)) fail_msg("NVFP4 row %d: scale %02x values %s, ml_dtypes %02x %s", counts[4], scale, got, sc, hex);
            counts[4]++;
        }
    }
    fclose(f);
    printf("ml_dtypes rows: E4M3 %d decodes, %d encodes; E2M1 %d decodes, %d encodes; NVFP4 %d micro-blocks\n",
           counts[0], counts[1], counts[2], counts[3], counts[4]);
    assert_int_equal(counts[0], 256);
    assert_int_equal(counts[2], 16);
    assert_true(counts[1] > 1000 && counts[3] > 100 && counts[4] > 50);
}

static void test_saturation_and_specials(void **state) {
    (void)state;
    assert_int_equal(osp_fp32_to_e4m3(448.0f), 0x7E);
    assert_int_equal(osp_fp32_to_e4m3(463.99f), 0x7E);
    assert_int_equal(osp_fp32_to_e4m3(464.0f), 0x7E); /* rounds to 480: saturates */
    assert_int_equal(osp_fp32_to_e4m3(1e30f), 0x7E);
    assert_int_equal(osp_fp32_to_e4m3(INFINITY), 0x7E);
    assert_int_equal(osp_fp32_to_e4m3(-INFINITY), 0xFE);
    assert_int_equal(osp_fp32_to_e4m3(NAN) & 0x7F, 0x7F);
    assert_true(isnan(osp_e4m3_to_fp32(0x7F)) && isnan(osp_e4m3_to_fp32(0xFF)));
    assert_int_equal(osp_fp32_to_e4m3(0x1p-10f), 0x00); /* half the smallest subnormal: to even (0) */
    assert_int_equal(osp_fp32_to_e4m3(0x1.8p-10f), 0x01);
    assert_int_equal(osp_fp32_to_e2m1(6.5f), 0x7);
    assert_int_equal(osp_fp32_to_e2m1(-1e30f), 0xF);
    assert_int_equal(osp_fp32_to_e2m1(INFINITY), 0x7);
    assert_int_equal(osp_fp32_to_e2m1(5.0f), 0x6); /* tie between 4 and 6: even */
    /* every finite code survives a round trip */
    for (int c = 0; c < 256; c++)
        if ((c & 0x7F) != 0x7F) assert_int_equal(osp_fp32_to_e4m3(osp_e4m3_to_fp32((uint8_t)c)), c);
    for (int c = 0; c < 16; c++) assert_int_equal(osp_fp32_to_e2m1(osp_e2m1_to_fp32((uint8_t)c)), c);
}

/* dequantize(quantize(x)) is within half an E2M1 step at the block's scale where that scale is a
 * normal E4M3 number: the step between neighbours is at most 2 (between 4 and 6) times the scale; a
 * value clipped at 6 is off by the scale's own E4M3 rounding (2^-4 relative). A block too small for
 * the tensor scale (its scale an E4M3 subnormal or 0) is coarse or zero, one too large clips at
 * 6 x 448 x tensor_scale: the tensor scale is chosen per tensor so neither happens to real blocks. */
static void test_nvfp4_roundtrip(void **state) {
    (void)state;
    uint64_t s = 42;
    for (int k = 0; k < 2000; k++) {
        float x[16], y[16];
        double amax = 0;
        const float mag = ldexpf(1.0f, (int)(k % 24) - 12);
        for (int i = 0; i < 16; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = mag * ((float)(s >> 40) / 8388608.0f - 1.0f) * ((s & 31) == 0 ? 30.0f : 1.0f);
            amax = fmax(amax, fabs(x[i]));
        }
        const float ts = k % 3 == 0 ? 1.0f : ldexpf(1.0f, (int)(k % 7) - 3);
        uint8_t packed[8], scale;
        osp_nvfp4_quantize16(x, ts, packed, &scale);
        osp_nvfp4_dequantize16(packed, scale, ts, y);
        const double S = osp_e4m3_to_fp32(scale) * ts;
        if (amax / 6.0 / ts < 0x1p-6) { /* the scale is an E4M3 subnormal or 0: coarse, or all zero */
            if (scale == 0)
                for (int i = 0; i < 16; i++) assert_true(y[i] == 0.0f);
            continue;
        }
        if (amax / 6.0 / ts >= 464.0) { /* the scale saturates at 448: values clip at 6 x 448 x ts */
            assert_int_equal(scale, 0x7E);
            for (int i = 0; i < 16; i++) assert_true(fabs(y[i]) <= 6.0 * 448.0 * ts);
            continue;
        }
        for (int i = 0; i < 16; i++) {
            const double err = fabs((double)y[i] - x[i]);
            /* inside the range: half a step (<= 1 S); clipped at 6 S: the scale's rounding */
            const double bound = 1.0 * S + fabs((double)x[i]) * 0.0625 + 1e-30;
            if (!(err <= bound)) fail_msg("block %d value %d: %g -> %g (scale %g, bound %g)", k, i, x[i], y[i], S, bound);
        }
        assert_true(S <= amax / 6.0 * 1.0625);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_saturation_and_specials),
        cmocka_unit_test(test_nvfp4_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
