/* One-level activations for the K-quants (src/backend/cpu/qdot8k.h): the quantizer against its written
 * contract; the portable kernels against a double-precision dot of the dequantized weights (the
 * arithmetic is right) and the original activations (the one-level error bound); and every SIMD kernel
 * of the mode -- the one-token kernel, the GEMV over 1..6 rows, the tiles of 3..8 and 16 tokens with
 * junk rows in the packs past the real tokens -- against the portable kernel bit for bit: a token's result must not
 * depend on the kernel, so it does not depend on how many tokens share the matmul (batch invariance).
 * Deterministic inputs (test_rng.h); kernels the CPU lacks are skipped with a message. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/qdot.h"
#include "backend/cpu/qdot8k.h"
#include "core/dtype.h"
#include "test_rng.h"

static const uint32_t types[] = {OSP_DTYPE_Q2_K, OSP_DTYPE_Q3_K, OSP_DTYPE_Q4_K, OSP_DTYPE_Q5_K, OSP_DTYPE_Q6_K};
#define NTYPES (sizeof types / sizeof types[0])
#define MAX_SB 8 /* super-blocks a test row has at most (2048 values) */

static void put_half(uint8_t *p, float v) {
    const uint16_t h = osp_fp32_to_fp16(v);
    memcpy(p, &h, 2);
}

/* Random codes, scales and mins (random bytes reach the extremes: 6-bit codes 63, Q6_K scale -128),
 * sane fp16 super-block scales (test_qdot's choice). */
static void fill_blocks(uint32_t t, uint8_t *w, int64_t nsb) {
    const size_t ts = osp_dtype_type_size(t);
    for (int64_t b = 0; b < nsb; b++) {
        uint8_t *p = w + b * ts;
        for (size_t i = 0; i < ts; i++) p[i] = (uint8_t)rnd();
        const float dk = 0.0001f + 0.005f * fabsf(frand()), dmin = 0.005f * fabsf(frand());
        switch (t) {
        case OSP_DTYPE_Q4_K: case OSP_DTYPE_Q5_K: put_half(p, dk), put_half(p + 2, dmin); break;
        case OSP_DTYPE_Q6_K: put_half(p + 208, dk); break;
        case OSP_DTYPE_Q3_K: put_half(p + 108, dk); break;
        case OSP_DTYPE_Q2_K: put_half(p + 80, 10.0f * dk), put_half(p + 82, 10.0f * dmin); break;
        default: break;
        }
    }
}

static void fill_x(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * frand() * (rnd() % 50 == 0 ? 30.0f : 1.0f);
}

/* d = max|x| / 127, q = rne(x * 127 / max|x|), bsums the 16-value sums; all zeros give d = 0. */
static void test_quantize_contract(void **state) {
    (void)state;
    static float x[2 * 256];
    static osp_q8k_block q[2];
    for (int trial = 0; trial < 500; trial++) {
        fill_x(x, 512, trial % 7 == 0 ? 1e-30f : 1.0f);
        if (trial % 11 == 0) for (int i = 0; i < 256; i++) x[i] = trial % 2 ? 0.0f : -0.0f;
        osp_quantize_row_q8k(x, q, 512);
        for (int b = 0; b < 2; b++) {
            float amax = 0.0f;
            for (int i = 0; i < 256; i++) amax = fmaxf(amax, fabsf(x[256 * b + i]));
            const float d = amax / 127.0f, id = d != 0.0f ? 127.0f / amax : 0.0f;
            assert_memory_equal(&q[b].d, &d, 4);
            for (int k = 0; k < 16; k++) {
                int s = 0;
                for (int i = 16 * k; i < 16 * k + 16; i++) {
                    const float t = x[256 * b + i] * id;
                    const int qi = (int)nearbyintf(t);
                    if (q[b].qs[i] != qi) fail_msg("trial %d block %d value %d: code %d, contract %d", trial, b, i, q[b].qs[i], qi);
                    s += qi;
                }
                assert_int_equal(q[b].bsums[k], s);
            }
        }
    }
    for (int i = 0; i < 512; i++) x[i] = 0.5f;
    x[300] = NAN;
    osp_quantize_row_q8k(x, q, 512);
    assert_true(q[0].d == 0.5f / 127.0f && isnan(q[1].d));
}

/* The portable kernels: within float rounding of the exact dot of the dequantized weights with the
 * quantized activations, and within the one-level bound (|x - d q| <= d / 2 per value) of the dot
 * with the original activations. */
static void test_reference_accuracy(void **state) {
    (void)state;
    int tested = 0;
    for (size_t ti = 0; ti < NTYPES; ti++) {
        const uint32_t t = types[ti];
        const osp_qdot8k_fn ref = osp_qdot8k_ref_for(t);
        assert_non_null(ref);
        for (int trial = 0; trial < 200; trial++) {
            const int64_t nsb = 1 + rnd() % MAX_SB, n = nsb * 256;
            static uint8_t w[MAX_SB * 210];
            static float x[MAX_SB * 256], wf[MAX_SB * 256];
            static osp_q8k_block xq[MAX_SB];
            fill_blocks(t, w, nsb);
            fill_x(x, n, 1.0f);
            osp_quantize_row_q8k(x, xq, n);
            assert_int_equal(osp_dequant_row(t, w, wf, n), OSP_OK);
            double exact_q = 0, exact = 0, mag = 0, bound = 0;
            for (int64_t i = 0; i < n; i++) {
                const osp_q8k_block *b = &xq[i / 256];
                exact_q += (double)wf[i] * b->d * b->qs[i % 256];
                exact += (double)wf[i] * x[i];
                mag += fabs((double)wf[i] * x[i]);
                bound += fabs((double)wf[i]) * b->d * 0.5 * 1.001;
            }
            const float r = ref(w, xq, nsb);
            if (fabs((double)r - exact_q) > 2e-6 * mag + 1e-30)
                fail_msg("%s: reference %.9g vs exact %.9g (mag %g)", osp_dtype_name(t), r, exact_q, mag);
            if (fabs((double)r - exact) > bound + 2e-6 * mag)
                fail_msg("%s: one level %.9g vs fp32 %.9g exceeds bound %g", osp_dtype_name(t), r, exact, bound);
            tested++;
        }
    }
    printf("qdot8k reference: %d rows within the bounds\n", tested);
}

/* Weights for the bit tests: random, or all zeros (trial 0: sums of zeros and -0.0 products). */
static void weights(uint32_t t, uint8_t *w, int64_t nsb, int trial) {
    fill_blocks(t, w, nsb);
    if (trial == 0) memset(w, 0, (size_t)nsb * osp_dtype_type_size(t));
}

/* The one-token kernel and the GEMV of every family equal the portable kernel bit for bit. */
static void test_one_token_and_gemv(void **state) {
    (void)state;
    const char *isas[] = {"avx512vnni", "avx2", "scalar"};
    int tested = 0;
    for (size_t ii = 0; ii < 3; ii++) {
        if (!osp_qdot_force_isa(isas[ii])) {
            printf("qdot8k: %s not available on this CPU, skipped\n", isas[ii]);
            continue;
        }
        for (size_t ti = 0; ti < NTYPES; ti++) {
            const uint32_t t = types[ti];
            const osp_qdot8k_fn one = osp_qdot8k_for(t), ref = osp_qdot8k_ref_for(t);
            const osp_qdot8k_gemv_fn gemv = osp_qdot8k_gemv_for(t);
            assert_non_null(one);
            assert_non_null(gemv);
            const int64_t ts = (int64_t)osp_dtype_type_size(t);
            for (int trial = 0; trial < 100; trial++) {
                const int64_t nsb = 1 + rnd() % MAX_SB, nrows = 1 + rnd() % 6, rb = ts * nsb;
                static uint8_t w[6 * MAX_SB * 210];
                static float x[MAX_SB * 256];
                static osp_q8k_block xq[MAX_SB];
                for (int64_t r = 0; r < nrows; r++) weights(t, w + r * rb, nsb, trial);
                fill_x(x, nsb * 256, 1.0f);
                if (trial == 1) for (int64_t i = 0; i < nsb * 256; i++) x[i] = -0.0f;
                osp_quantize_row_q8k(x, xq, nsb * 256);
                float g[6];
                gemv(w, (size_t)rb, xq, nsb, g, nrows);
                for (int64_t r = 0; r < nrows; r++) {
                    const float a = one(w + r * rb, xq, nsb), b = ref(w + r * rb, xq, nsb);
                    if (memcmp(&a, &b, 4) != 0)
                        fail_msg("%s %s nsb %d: one-token %.9g, reference %.9g", isas[ii], osp_dtype_name(t), (int)nsb, a, b);
                    if (memcmp(&a, &g[r], 4) != 0)
                        fail_msg("%s %s nsb %d row %d of %d: GEMV %.9g, one-token %.9g", isas[ii], osp_dtype_name(t),
                                 (int)nsb, (int)r, (int)nrows, g[r], a);
                }
                tested++;
            }
        }
    }
    printf("qdot8k: %d one-token/GEMV row groups matched the reference bit for bit\n", tested);
    assert_true(osp_qdot_force_isa("scalar"));
    float x[256];
    for (int i = 0; i < 256; i++) x[i] = 1.0f;
    x[7] = NAN;
    osp_q8k_block xq;
    osp_quantize_row_q8k(x, &xq, 256);
    uint8_t w[210];
    fill_blocks(OSP_DTYPE_Q6_K, w, 1);
    assert_true(isnan(osp_qdot8k_ref_for(OSP_DTYPE_Q6_K)(w, &xq, 1)));
    if (osp_qdot_force_isa("avx512vnni")) assert_true(isnan(osp_qdot8k_for(OSP_DTYPE_Q6_K)(w, &xq, 1)));
}

/* The tiles: for 1..20 tokens left, the tile osp_qdot8k_tile_for picks (16, 8, or exactly 3..7) gives each real token the one-token kernel's bits whatever the pack's other rows hold
 * (huge values in some trials), writes exactly its n results ys apart, and is NULL below 3 tokens. */
static void test_tiles(void **state) {
    (void)state;
    if (!osp_qdot_force_isa("avx512vnni")) {
        int n = 0;
        for (size_t ti = 0; ti < NTYPES; ti++) assert_null(osp_qdot8k_tile_for(types[ti], 8, &n));
        printf("qdot8k tiles: no AVX512-VNNI here, skipped\n");
        return;
    }
    int tested = 0;
    for (size_t ti = 0; ti < NTYPES; ti++) {
        const uint32_t t = types[ti];
        const osp_qdot8k_fn one = osp_qdot8k_for(t);
        for (int64_t n_left = 1; n_left <= 20; n_left++) {
            int n = 0;
            const osp_qdot8k_tile_fn tile = osp_qdot8k_tile_for(t, n_left, &n);
            const bool want = (t == OSP_DTYPE_Q4_K || t == OSP_DTYPE_Q5_K || t == OSP_DTYPE_Q6_K) && n_left >= 3;
            if (!tile) {
                if (want) fail_msg("%s: no tile for %d tokens", osp_dtype_name(t), (int)n_left);
                assert_int_equal(n, 1);
                continue;
            }
            assert_true(want);
            assert_int_equal(n, n_left >= 16 ? 16 : n_left >= 8 ? 8 : n_left);
            const int real = n_left < n ? (int)n_left : n;
            for (int trial = 0; trial < 30; trial++) {
                const int64_t nsb = 1 + rnd() % MAX_SB, stride = nsb + rnd() % 3;
                static uint8_t w[MAX_SB * 210];
                static float x[MAX_SB * 256];
                static osp_q8k_block xq[16 * (MAX_SB + 2)];
                static _Alignas(64) osp_q8k_pack pk[2 * MAX_SB];
                weights(t, w, nsb, trial);
                for (int j = 0; j < 16; j++) {
                    fill_x(x, nsb * 256, j >= real && trial % 2 ? 1e30f : 1.0f);
                    if (trial == 1 && j == 1) for (int64_t i = 0; i < nsb * 256; i++) x[i] = -0.0f;
                    osp_quantize_row_q8k(x, xq + j * stride, nsb * 256);
                }
                for (int g = 0; g < 2; g++) osp_pack_q8k(xq + 8 * g * stride, stride, nsb, pk + g * nsb);
                float y[16 * 3];
                for (int j = 0; j < 16 * 3; j++) y[j] = 12345.0f;
                tile(w, nsb, pk, y, 3);
                for (int j = 0; j < 16; j++) {
                    if (j < real) {
                        const float r = one(w, xq + j * stride, nsb);
                        if (memcmp(&r, &y[j * 3], sizeof r) != 0)
                            fail_msg("%s: tile of %d for %d tokens, token %d gives %.9g, one-token kernel %.9g",
                                     osp_dtype_name(t), n, (int)n_left, j, y[j * 3], r);
                    }
                    if (j >= n) assert_true(y[j * 3] == 12345.0f);
                    assert_true(y[j * 3 + 1] == 12345.0f && y[j * 3 + 2] == 12345.0f);
                }
                tested++;
            }
        }
    }
    printf("qdot8k tiles: %d tiles matched the one-token kernels bit for bit\n", tested);
}

/* osp_pack_q8k writes what its contract says. */
static void test_pack_layout(void **state) {
    (void)state;
    enum { NSB = 3, STRIDE = 5 };
    static float x[NSB * 256];
    static osp_q8k_block xq[8 * STRIDE];
    static _Alignas(64) osp_q8k_pack pk[NSB];
    for (int j = 0; j < 8; j++) {
        fill_x(x, NSB * 256, 1.0f);
        osp_quantize_row_q8k(x, xq + j * STRIDE, NSB * 256);
    }
    osp_pack_q8k(xq, STRIDE, NSB, pk);
    for (int s = 0; s < NSB; s++)
        for (int j = 0; j < 8; j++) {
            const osp_q8k_block *b = xq + j * STRIDE + s;
            const osp_q8k_pack *p = pk + s;
            for (int sub = 0; sub < 8; sub++) assert_memory_equal(p->qs[sub][j / 2] + 32 * (j % 2), b->qs + 32 * sub, 32);
            for (int l = 0; l < 8; l++) assert_true(p->dp[j / 2][8 * (j % 2) + l] == b->d);
            assert_true(p->d[j] == b->d);
            for (int i = 0; i < 8; i++) {
                assert_int_equal((int16_t)(p->s16[i][j] & 0xffff), b->bsums[2 * i]);
                assert_int_equal((int16_t)((uint32_t)p->s16[i][j] >> 16), b->bsums[2 * i + 1]);
            }
            for (int i = 0; i < 4; i++) {
                assert_int_equal((int16_t)(p->s32[i][j] & 0xffff), b->bsums[4 * i] + b->bsums[4 * i + 1]);
                assert_int_equal((int16_t)((uint32_t)p->s32[i][j] >> 16), b->bsums[4 * i + 2] + b->bsums[4 * i + 3]);
            }
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_contract),
        cmocka_unit_test(test_reference_accuracy),
        cmocka_unit_test(test_one_token_and_gemv),
        cmocka_unit_test(test_tiles),
        cmocka_unit_test(test_pack_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
