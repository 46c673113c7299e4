/* One-level activations for the 32-value block types (src/backend/cpu/qdot8b.h): the quantizer against
 * its written contract; the portable kernels against a double-precision dot of the dequantized weights
 * (the arithmetic is right) and the original activations (the one-level error bound); and every other
 * kernel of the mode -- the AVX2 and AVX512-VNNI one-token kernels, the GEMV over 1..40 rows (strips of
 * 16 and the rows left), the AVX2 tiles of 4 and 8 tokens with junk rows past the real tokens, the
 * AVX512-VNNI strips over 1..20 and 64 tokens -- against the portable kernel bit for bit, on random rows of 1..13 blocks (odd counts: the GEMV's half pair), all-zero weights, -0.0 and
 * zero activations, large weight scales and activations: a token's result must not depend on the kernel,
 * so it does not depend on how many tokens share the matmul (batch invariance). Deterministic inputs
 * (test_rng.h); kernels the CPU lacks are skipped with a message. */
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
#include "backend/cpu/qdot8b.h"
#include "core/dtype.h"
#include "test_rng.h"

static const uint32_t types[] = {OSP_DTYPE_Q8_0, OSP_DTYPE_Q4_0, OSP_DTYPE_Q4_1, OSP_DTYPE_Q5_0, OSP_DTYPE_Q5_1};
#define NTYPES (sizeof types / sizeof types[0])
#define MAX_NB 13 /* blocks a test row has at most (416 values) */
#define MAX_TS 34 /* bytes of the largest block (Q8_0) */

static void put_half(uint8_t *p, float v) {
    const uint16_t h = osp_fp32_to_fp16(v);
    memcpy(p, &h, 2);
}

/* Random codes (random bytes reach the extremes: Q8_0's -128 and 127, 5-bit 31), sane fp16 scales and
 * mins, or (big) scales near fp16's largest. */
static void fill_blocks(uint32_t t, uint8_t *w, int64_t nb, bool big) {
    const size_t ts = osp_dtype_type_size(t);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = w + b * ts;
        for (size_t i = 0; i < ts; i++) p[i] = (uint8_t)rnd();
        put_half(p, big ? 60000.0f * frand() : 0.01f * frand());
        if (t == OSP_DTYPE_Q4_1 || t == OSP_DTYPE_Q5_1) put_half(p + 2, big ? -60000.0f * frand() : 0.02f * frand());
    }
}

static void fill_x(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * frand() * (rnd() % 50 == 0 ? 30.0f : 1.0f);
}

/* d = max|x| / 127, q = rne(x * 127 / max|x|), s = d * sum(q), n128 = -128 sum(q); all zeros give d = 0;
 * NaN gives d = s = NaN, n128 = 0. */
static void test_quantize_contract(void **state) {
    (void)state;
    static float x[4 * 32];
    static osp_q8b_block q[4];
    for (int trial = 0; trial < 2000; trial++) {
        fill_x(x, 128, trial % 7 == 0 ? 1e-30f : trial % 13 == 0 ? 1e30f : 1.0f);
        if (trial % 11 == 0) for (int i = 0; i < 32; i++) x[i] = trial % 2 ? 0.0f : -0.0f;
        osp_quantize_row_q8b(x, q, 128);
        for (int b = 0; b < 4; b++) {
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * b + i]));
            const float d = amax / 127.0f, id = d != 0.0f ? 127.0f / amax : 0.0f;
            assert_memory_equal(&q[b].d, &d, 4);
            int s = 0;
            for (int i = 0; i < 32; i++) {
                const int qi = (int)nearbyintf(x[32 * b + i] * id);
                if (q[b].qs[i] != qi) fail_msg("trial %d block %d value %d: code %d, contract %d", trial, b, i, q[b].qs[i], qi);
                s += qi;
            }
            const float sf = d * (float)s;
            assert_memory_equal(&q[b].s, &sf, 4);
            assert_int_equal(q[b].n128, -128 * s);
        }
    }
    for (int i = 0; i < 128; i++) x[i] = 0.5f;
    x[40] = NAN;
    x[100] = -INFINITY;
    osp_quantize_row_q8b(x, q, 128);
    assert_true(q[0].d == 0.5f / 127.0f && isnan(q[1].d) && isnan(q[1].s) && isnan(q[3].d) && q[2].d == q[0].d);
    assert_true(q[1].n128 == 0 && q[3].n128 == 0);
}

/* The portable kernels: within float rounding of the exact dot of the dequantized weights with the
 * quantized activations, and within the one-level bound (|x - d q| <= d / 2 per value) of the dot
 * with the original activations. */
static void test_reference_accuracy(void **state) {
    (void)state;
    int tested = 0;
    for (size_t ti = 0; ti < NTYPES; ti++) {
        const uint32_t t = types[ti];
        const osp_qdot8b_fn ref = osp_qdot8b_ref_for(t);
        assert_non_null(ref);
        for (int trial = 0; trial < 300; trial++) {
            const int64_t nb = 1 + rnd() % MAX_NB, n = nb * 32;
            static uint8_t w[MAX_NB * MAX_TS];
            static float x[MAX_NB * 32], wf[MAX_NB * 32];
            static osp_q8b_block xq[MAX_NB];
            fill_blocks(t, w, nb, false);
            fill_x(x, n, 1.0f);
            osp_quantize_row_q8b(x, xq, n);
            assert_int_equal(osp_dequant_row(t, w, wf, n), OSP_OK);
            double exact_q = 0, exact = 0, mag = 0, bound = 0;
            for (int64_t i = 0; i < n; i++) {
                const osp_q8b_block *b = &xq[i / 32];
                exact_q += (double)wf[i] * b->d * b->qs[i % 32];
                exact += (double)wf[i] * x[i];
                mag += fabs((double)wf[i] * x[i]);
                bound += fabs((double)wf[i]) * b->d * 0.5 * 1.001;
            }
            const float r = ref(w, xq, nb);
            if (fabs((double)r - exact_q) > 2e-6 * mag + 1e-30)
                fail_msg("%s: reference %.9g vs exact %.9g (mag %g)", osp_dtype_name(t), r, exact_q, mag);
            if (fabs((double)r - exact) > bound + 2e-6 * mag)
                fail_msg("%s: one level %.9g vs fp32 %.9g exceeds bound %g", osp_dtype_name(t), r, exact, bound);
            tested++;
        }
    }
    assert_null(osp_qdot8b_ref_for(OSP_DTYPE_Q4_K));
    assert_null(osp_qdot8b_for(OSP_DTYPE_F32));
    printf("qdot8b reference: %d rows within the bounds\n", tested);
}

/* Weights for the bit tests: random (large scales in every fifth trial), or all zeros (trial 0). */
static void weights(uint32_t t, uint8_t *w, int64_t nb, int trial) {
    fill_blocks(t, w, nb, trial % 5 == 4);
    if (trial == 0) memset(w, 0, (size_t)nb * osp_dtype_type_size(t));
}
/* Activations for the bit tests: random, -0.0 (trial 1), zeros in every other block (trial 2), large. */
static void activations(float *x, int64_t n, int trial, float junk) {
    fill_x(x, n, junk != 0.0f ? junk : trial % 7 == 6 ? 1e4f : 1.0f);
    if (trial == 1) for (int64_t i = 0; i < n; i++) x[i] = -0.0f;
    if (trial == 2) for (int64_t i = 0; i < n; i++) if ((i / 32) % 2) x[i] = 0.0f;
}

/* The one-token kernel and the GEMV of every family equal the portable kernel bit for bit. */
static void test_one_token_and_gemv(void **state) {
    (void)state;
    const char *isas[] = {"avx512vnni", "avx2", "scalar"};
    int tested = 0;
    for (size_t ii = 0; ii < 3; ii++) {
        if (!osp_qdot_force_isa(isas[ii])) {
            printf("qdot8b: %s not available on this CPU, skipped\n", isas[ii]);
            continue;
        }
        for (size_t ti = 0; ti < NTYPES; ti++) {
            const uint32_t t = types[ti];
            const osp_qdot8b_fn one = osp_qdot8b_for(t), ref = osp_qdot8b_ref_for(t);
            const osp_qdot8b_gemv_fn gemv = osp_qdot8b_gemv_for(t);
            assert_non_null(one);
            assert_non_null(gemv);
            const int64_t ts = (int64_t)osp_dtype_type_size(t);
            for (int trial = 0; trial < 200; trial++) {
                const int64_t nb = trial < 2 * MAX_NB ? 1 + trial % MAX_NB : 1 + (int64_t)(rnd() % MAX_NB);
                const int64_t nrows = trial % 4 == 3 ? 1 + rnd() % 40 : 1 + rnd() % 6, rb = ts * nb;
                static uint8_t w[40 * MAX_NB * MAX_TS];
                static float x[MAX_NB * 32];
                static osp_q8b_block xq[MAX_NB];
                for (int64_t r = 0; r < nrows; r++) weights(t, w + r * rb, nb, trial);
                activations(x, nb * 32, trial, 0.0f);
                osp_quantize_row_q8b(x, xq, nb * 32);
                float g[40];
                gemv(w, (size_t)rb, xq, nb, g, nrows);
                for (int64_t r = 0; r < nrows; r++) {
                    const float a = one(w + r * rb, xq, nb), b = ref(w + r * rb, xq, nb);
                    if (memcmp(&a, &b, 4) != 0)
                        fail_msg("%s %s nb %d trial %d: one-token %.9g, reference %.9g", isas[ii], osp_dtype_name(t),
                                 (int)nb, trial, a, b);
                    if (memcmp(&a, &g[r], 4) != 0)
                        fail_msg("%s %s nb %d row %d of %d trial %d: GEMV %.9g, one-token %.9g", isas[ii],
                                 osp_dtype_name(t), (int)nb, (int)r, (int)nrows, trial, g[r], a);
                }
                tested++;
            }
        }
    }
    printf("qdot8b: %d one-token/GEMV row groups matched the reference bit for bit\n", tested);
    /* a NaN activation gives NaN from every kernel */
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = 1.0f;
    x[40] = NAN;
    osp_q8b_block xq[2];
    osp_quantize_row_q8b(x, xq, 64);
    for (size_t ti = 0; ti < NTYPES; ti++) {
        uint8_t w[2 * MAX_TS];
        fill_blocks(types[ti], w, 2, false);
        for (size_t ii = 0; ii < 3; ii++)
            if (osp_qdot_force_isa(isas[ii])) assert_true(isnan(osp_qdot8b_for(types[ti])(w, xq, 2)));
    }
    assert_true(osp_qdot_force_isa("scalar"));
}

/* The AVX2 tiles: for 1..20 tokens left, the tile osp_qdot8b_tile_for picks (4 for 3-4, else 8) gives
 * each real token the portable kernel's bits whatever the pack's other rows hold (huge values in some
 * trials), writes exactly its n results ys apart, and is NULL below 3 tokens, on the portable family and
 * on AVX512-VNNI (which has the strips). */
static int tiles_on(const char *isa) {
    int tested = 0, n = 0;
    assert_null(osp_qdot8b_tile_for(OSP_DTYPE_Q4_K, 16, &n));
    for (size_t ti = 0; ti < NTYPES; ti++) {
        const uint32_t t = types[ti];
        const osp_qdot8b_fn ref = osp_qdot8b_ref_for(t);
        for (int64_t n_left = 1; n_left <= 20; n_left++) {
            const osp_qdot8b_tile_fn tile = osp_qdot8b_tile_for(t, n_left, &n);
            if (!tile) {
                if (n_left >= 3) fail_msg("%s %s: no tile for %d tokens", isa, osp_dtype_name(t), (int)n_left);
                assert_int_equal(n, 1);
                continue;
            }
            assert_true(n_left >= 3);
            assert_int_equal(n, n_left <= 4 ? 4 : 8);
            const int real = n_left < n ? (int)n_left : n;
            for (int trial = 0; trial < 40; trial++) {
                const int64_t nb = trial < MAX_NB ? 1 + trial : 1 + (int64_t)(rnd() % MAX_NB), stride = nb + (int64_t)(rnd() % 3);
                static uint8_t w[MAX_NB * MAX_TS];
                static float x[MAX_NB * 32];
                static osp_q8b_block xq[16 * (MAX_NB + 2)];
                static _Alignas(64) osp_q8b_pack pk[2 * MAX_NB];
                weights(t, w, nb, trial);
                for (int j = 0; j < 16; j++) {
                    activations(x, nb * 32, j == 1 ? trial : trial == 1 ? 3 : trial, j >= real && trial % 2 ? 1e30f : 0.0f);
                    osp_quantize_row_q8b(x, xq + j * stride, nb * 32);
                }
                for (int g = 0; g < 2; g++) osp_pack_q8b(t, xq + 8 * g * stride, stride, nb, pk + g * nb);
                float y[16 * 3];
                for (int j = 0; j < 16 * 3; j++) y[j] = 12345.0f;
                tile(w, nb, pk, y, 3);
                for (int j = 0; j < 16; j++) {
                    if (j < real) {
                        const float r = ref(w, xq + j * stride, nb);
                        if (memcmp(&r, &y[j * 3], sizeof r) != 0)
                            fail_msg("%s %s: tile of %d for %d tokens, nb %d, token %d gives %.9g, reference %.9g", isa,
                                     osp_dtype_name(t), n, (int)n_left, (int)nb, j, y[j * 3], r);
                    }
                    if (j >= n) assert_true(y[j * 3] == 12345.0f);
                    assert_true(y[j * 3 + 1] == 12345.0f && y[j * 3 + 2] == 12345.0f);
                }
                tested++;
            }
        }
    }
    return tested;
}

static void test_tiles(void **state) {
    (void)state;
    int n = 0;
    if (!osp_qdot_force_isa("avx2")) printf("qdot8b tiles: avx2 not available on this CPU, skipped\n");
    else printf("qdot8b tiles (avx2): %d tiles matched the reference bit for bit\n", tiles_on("avx2"));
    if (osp_qdot_force_isa("avx512vnni"))
        for (size_t ti = 0; ti < NTYPES; ti++)
            for (int64_t k = 1; k <= 20; k++) assert_null(osp_qdot8b_tile_for(types[ti], k, &n));
    assert_true(osp_qdot_force_isa("scalar"));
    for (size_t ti = 0; ti < NTYPES; ti++) assert_null(osp_qdot8b_tile_for(types[ti], 8, &n));
}

/* The AVX512-VNNI strips: 16 rows against 1..20 and 64 tokens (made block-major by osp_q8b_block_major
 * from rows a_stride >= nb blocks apart; outputs ys >= 16 apart) give every (row, token) the portable
 * kernel's bits and write nothing else; NULL on the other families and for types without the mode. */
static void test_strips(void **state) {
    (void)state;
    if (!osp_qdot_force_isa("avx512vnni")) {
        printf("qdot8b strips: avx512vnni not available on this CPU, skipped\n");
        assert_true(osp_qdot_force_isa("scalar"));
        return;
    }
    assert_null(osp_qdot8b_strip_for(OSP_DTYPE_Q4_K));
    enum { MAXT = 64 };
    int tested = 0;
    for (size_t ti = 0; ti < NTYPES; ti++) {
        const uint32_t t = types[ti];
        const osp_qdot8b_strip_fn strip = osp_qdot8b_strip_for(t);
        const osp_qdot8b_fn ref = osp_qdot8b_ref_for(t);
        assert_non_null(strip);
        const int64_t ts = (int64_t)osp_dtype_type_size(t);
        for (int64_t n = 1; n <= 21; n++) {
            const int64_t nt = n == 21 ? MAXT : n;
            for (int trial = 0; trial < 16; trial++) {
                const int64_t nb = trial < MAX_NB ? 1 + trial : 1 + (int64_t)(rnd() % MAX_NB);
                const int64_t as = nb + (int64_t)(rnd() % 3), ys = 16 + (int64_t)(rnd() % 5), rb = ts * nb + (int64_t)(rnd() % 3);
                static uint8_t w[16 * (MAX_NB * MAX_TS + 2)];
                static float x[MAX_NB * 32];
                static osp_q8b_block xq[MAXT * (MAX_NB + 2)], bm[MAXT * MAX_NB];
                static float y[MAXT * 21 + 16];
                for (int r = 0; r < 16; r++) weights(t, w + r * rb, nb, trial);
                for (int64_t j = 0; j < nt; j++) {
                    activations(x, nb * 32, j == 0 ? trial : trial == 1 ? 3 : trial, 0.0f);
                    osp_quantize_row_q8b(x, xq + j * as, nb * 32);
                }
                for (size_t i = 0; i < sizeof y / sizeof y[0]; i++) y[i] = 12345.0f;
                osp_q8b_block_major(xq, as, nb, nt, bm);
                for (int64_t j = 0; j < nt; j++)
                    for (int64_t b = 0; b < nb; b++) assert_memory_equal(&bm[b * nt + j], &xq[j * as + b], sizeof bm[0]);
                strip(w, (size_t)rb, nb, bm, nt, y, ys);
                for (int64_t j = 0; j < nt; j++)
                    for (int64_t r = 0; r < ys; r++) {
                        if (r >= 16) {
                            assert_true(y[j * ys + r] == 12345.0f);
                            continue;
                        }
                        const float e = ref(w + r * rb, xq + j * as, nb);
                        if (memcmp(&e, &y[j * ys + r], 4) != 0)
                            fail_msg("%s: strip of %d tokens, nb %d, row %d token %d gives %.9g, reference %.9g",
                                     osp_dtype_name(t), (int)nt, (int)nb, (int)r, (int)j, y[j * ys + r], e);
                    }
                for (size_t i = (size_t)(nt * ys); i < sizeof y / sizeof y[0]; i++) assert_true(y[i] == 12345.0f);
                tested++;
            }
        }
    }
    printf("qdot8b strips: %d strips matched the reference bit for bit\n", tested);
    for (size_t ii = 0; ii < 2; ii++)
        if (osp_qdot_force_isa(ii ? "scalar" : "avx2")) assert_null(osp_qdot8b_strip_for(OSP_DTYPE_Q4_1));
    assert_true(osp_qdot_force_isa("scalar"));
}

/* The 16-row strips layout (osp_q8b_strips_pack): every row unpacks to its stored bytes; the strips GEMV
 * over any [r0, r1) of a matrix of 1..53 rows (whole strips, partial strips at both ends, the rows past the
 * last strip) gives each row the portable kernel's bits and writes nothing outside [r0, r1); the strips'
 * multi-token kernel (1..21 and 64 tokens) gives every (row, token) of every whole strip those bits; the
 * layout and its kernels are absent without AVX512-VNNI. */
static void test_strips_layout(void **state) {
    (void)state;
    if (!osp_qdot_force_isa("avx512vnni")) {
        printf("qdot8b strips layout: avx512vnni not available on this CPU, skipped\n");
        assert_true(osp_qdot_force_isa("scalar"));
        assert_false(osp_q8b_strips_supports(OSP_DTYPE_Q8_0));
        assert_null(osp_qdot8b_gemv_strips_for(OSP_DTYPE_Q8_0));
        return;
    }
    assert_false(osp_q8b_strips_supports(OSP_DTYPE_Q4_K));
    assert_null(osp_qdot8b_gemv_strips_for(OSP_DTYPE_Q4_K));
    enum { MAXR = 53 };
    int tested = 0;
    for (size_t ti = 0; ti < NTYPES; ti++) {
        const uint32_t t = types[ti];
        assert_true(osp_q8b_strips_supports(t));
        const osp_qdot8b_gemv_strips_fn gemv = osp_qdot8b_gemv_strips_for(t);
        const osp_qdot8b_strip_strips_fn strip = osp_qdot8b_strip_strips_for(t);
        const osp_qdot8b_fn ref = osp_qdot8b_ref_for(t);
        assert_non_null(gemv);
        assert_non_null(strip);
        const int64_t ts = (int64_t)osp_dtype_type_size(t);
        for (int trial = 0; trial < 60; trial++) {
            const int64_t nb = trial < MAX_NB ? 1 + trial : 1 + (int64_t)(rnd() % MAX_NB), rb = ts * nb;
            const int64_t rows = trial % 3 == 0 ? 16 * (1 + (trial / 3) % 3) : 1 + (int64_t)(rnd() % MAXR);
            static uint8_t w[MAXR * MAX_NB * MAX_TS], sw[MAXR * MAX_NB * MAX_TS], buf[MAX_NB * MAX_TS];
            static float x[MAX_NB * 32];
            static osp_q8b_block xq[MAX_NB];
            static float y[MAXR + 2];
            for (int64_t r = 0; r < rows; r++) weights(t, w + r * rb, nb, trial + (int)r);
            osp_q8b_strips_pack(t, w, (size_t)rb, rows, nb, sw);
            for (int64_t r = 0; r < rows; r++)
                assert_memory_equal(osp_q8b_strips_row(t, sw, (size_t)rb, rows, nb, r, buf), w + r * rb, (size_t)rb);
            /* the multi-token strip on each whole strip, 1 + trial % 21 tokens (64 for trials 20, 41) */
            {
                const int64_t nt = trial % 21 == 20 ? 64 : 1 + trial % 21;
                static float xs[64 * MAX_NB * 32];
                static osp_q8b_block tq[64 * MAX_NB], bm[64 * MAX_NB];
                static float ys[64 * 16];
                for (int64_t j = 0; j < nt; j++) {
                    activations(xs, nb * 32, trial + (int)j, 0.0f);
                    osp_quantize_row_q8b(xs, tq + j * nb, nb * 32);
                }
                osp_q8b_block_major(tq, nb, nb, nt, bm);
                for (int64_t st = 0; st < rows / 16; st++) {
                    strip(sw + (size_t)(st * nb) * 16 * (size_t)ts, nb, bm, nt, ys, 16);
                    for (int64_t j = 0; j < nt; j++)
                        for (int r = 0; r < 16; r++) {
                            const float e = ref(w + (16 * st + r) * rb, tq + j * nb, nb);
                            if (memcmp(&e, &ys[j * 16 + r], 4) != 0)
                                fail_msg("%s: strips strip %d of %d rows, %d tokens, nb %d, row %d token %d gives %.9g, reference %.9g",
                                         osp_dtype_name(t), (int)st, (int)rows, (int)nt, (int)nb, r, (int)j, ys[j * 16 + r], e);
                        }
                    tested++;
                }
            }
            activations(x, nb * 32, trial, 0.0f);
            osp_quantize_row_q8b(x, xq, nb * 32);
            for (int k = 0; k < 6; k++) {
                const int64_t r0 = k == 0 ? 0 : (int64_t)(rnd() % (uint64_t)rows), r1 = k == 0 ? rows : r0 + (int64_t)(rnd() % (uint64_t)(rows - r0 + 1));
                for (int64_t i = 0; i < MAXR + 2; i++) y[i] = 12345.0f;
                gemv(sw, (size_t)rb, rows, xq, nb, y + 1, r0, r1, buf);
                assert_true(y[0] == 12345.0f);
                for (int64_t r = 0; r < MAXR + 1; r++) {
                    if (r < r0 || r >= r1) {
                        assert_true(y[1 + r] == 12345.0f);
                        continue;
                    }
                    const float e = ref(w + r * rb, xq, nb);
                    if (memcmp(&e, &y[1 + r], 4) != 0)
                        fail_msg("%s: strips GEMV, %d rows, nb %d, rows [%d, %d), row %d gives %.9g, reference %.9g",
                                 osp_dtype_name(t), (int)rows, (int)nb, (int)r0, (int)r1, (int)r, y[1 + r], e);
                }
                tested++;
            }
        }
    }
    printf("qdot8b strips layout: %d GEMV row ranges and strips matched the reference bit for bit\n", tested);
    assert_true(osp_qdot_force_isa("scalar"));
    assert_false(osp_q8b_strips_supports(OSP_DTYPE_Q8_0));
}

/* osp_pack_q8b writes what its contract says. */
static void test_pack_layout(void **state) {
    (void)state;
    enum { NB = 3, STRIDE = 5 };
    static float x[NB * 32];
    static osp_q8b_block xq[8 * STRIDE];
    static _Alignas(64) osp_q8b_pack pk[NB];
    for (int j = 0; j < 8; j++) {
        fill_x(x, NB * 32, 1.0f);
        osp_quantize_row_q8b(x, xq + j * STRIDE, NB * 32);
    }
    for (size_t ti = 0; ti < NTYPES; ti++) {
        const uint32_t t = types[ti];
        const uint8_t xo = t == OSP_DTYPE_Q8_0 || t == OSP_DTYPE_Q4_0 || t == OSP_DTYPE_Q5_0 ? 0x80 : 0;
        osp_pack_q8b(t, xq, STRIDE, NB, pk);
        for (int b = 0; b < NB; b++)
            for (int j = 0; j < 8; j++) {
                const osp_q8b_block *blk = xq + j * STRIDE + b;
                const osp_q8b_pair *pr = &pk[b].pair[j / 2];
                const int h = j % 2;
                for (int i = 0; i < 32; i++) assert_int_equal((uint8_t)pr->qs[32 * h + i], (uint8_t)blk->qs[i] ^ xo);
                for (int l = 0; l < 8; l++) assert_true(pr->d[8 * h + l] == blk->d);
                assert_true(pk[b].s[j] == blk->s);
            }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_contract),
        cmocka_unit_test(test_reference_accuracy),
        cmocka_unit_test(test_one_token_and_gemv),
        cmocka_unit_test(test_tiles),
        cmocka_unit_test(test_strips),
        cmocka_unit_test(test_strips_layout),
        cmocka_unit_test(test_pack_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
