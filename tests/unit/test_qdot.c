/* Quantized-activation dot products: the run-time-chosen SIMD kernel against the portable reference,
 * and both against the fp32 dot of the dequantized weights with the original activations.
 *
 * Random weight blocks (random bytes, fp16 scales in a sane range) of every type with a kernel, random
 * activations with occasional outliers. SIMD vs reference differ only in float summation order:
 * |diff| <= 1e-5 * sum|w_i a_i|. Quantized vs fp32: the two-level activation error is at most
 * d2/2 = max|x|/508 per value, so |diff| <= sum_blocks sum|w| * max|x_block| / 508 (+ rounding). */
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
#include "core/dtype.h"
#include "test_rng.h"


/* every weight type with a quantized kernel */
static const uint32_t types[] = {OSP_DTYPE_Q4_0, OSP_DTYPE_Q4_1, OSP_DTYPE_Q5_0, OSP_DTYPE_Q5_1, OSP_DTYPE_Q8_0,
                                 OSP_DTYPE_Q2_K, OSP_DTYPE_Q3_K, OSP_DTYPE_Q4_K, OSP_DTYPE_Q5_K, OSP_DTYPE_Q6_K};
#define NTYPES (sizeof types / sizeof types[0])

static void put_half(uint8_t *p, float v) {
    const uint16_t h = osp_fp32_to_fp16(v);
    memcpy(p, &h, 2);
}

/* Random bytes for the codes, sub-block scales and mins; the fp16 fields get sane values (block
 * scales 0.001..0.051, K super-block scales a tenth of that as the 4..6-bit sub-scales multiply them,
 * signed block minimums for Q4_1/Q5_1, positive dmin for the K-quants). */
static void fill_blocks(uint32_t t, uint8_t *w, int64_t nblocks) {
    const size_t ts = osp_dtype_type_size(t);
    for (int64_t b = 0; b < nblocks; b++) {
        uint8_t *p = w + b * ts;
        for (size_t i = 0; i < ts; i++) p[i] = (uint8_t)rnd();
        const float d = 0.001f + 0.05f * fabsf(frand()), dk = 0.1f * d, dmin = 0.005f * fabsf(frand());
        switch (t) {
        case OSP_DTYPE_Q4_1: case OSP_DTYPE_Q5_1: put_half(p, d), put_half(p + 2, 0.1f * frand()); break;
        case OSP_DTYPE_Q4_K: case OSP_DTYPE_Q5_K: put_half(p, dk), put_half(p + 2, dmin); break;
        case OSP_DTYPE_Q6_K: put_half(p + 208, dk); break;
        case OSP_DTYPE_Q3_K: put_half(p + 108, dk); break;
        case OSP_DTYPE_Q2_K: put_half(p + 80, d), put_half(p + 82, 10.0f * dmin); break;
        default: put_half(p, d); break; /* Q4_0, Q5_0, Q8_0 */
        }
    }
}

static void test_kernels(void **state) {
    (void)state;
    const size_t ntypes = NTYPES;
    const char *isas[] = {"avx512vnni", "avx2", "scalar"};
    for (size_t ii = 0; ii < 3; ii++) {
    if (!osp_qdot_force_isa(isas[ii])) {
        printf("qdot kernels: %s not available on this CPU, skipped\n", isas[ii]);
        continue;
    }
    printf("qdot kernels: %s\n", osp_qdot_isa());
    for (size_t ti = 0; ti < ntypes; ti++) {
        const uint32_t t = types[ti];
        osp_qdot_fn fast = osp_qdot_for(t), ref = osp_qdot_ref_for(t);
        assert_non_null(fast);
        assert_non_null(ref);
        for (int trial = 0; trial < 200; trial++) {
            /* nb activation blocks of 32; K-quant rows are whole super-blocks of 256 */
            const int64_t per = osp_dtype_block_size(t) / 32, nb = per * (1 + rnd() % (64 / per)), n = nb * 32;
            uint8_t w[64 * 34]; /* the largest row: 64 Q8_0 blocks (8 Q6_K super-blocks are 1680 bytes) */
            float x[64 * 32], wf[64 * 32];
            osp_q8_block xq[64];
            fill_blocks(t, w, nb / per);
            for (int64_t i = 0; i < n; i++) x[i] = frand() * (rnd() % 50 == 0 ? 30.0f : 1.0f);
            osp_quantize_row_q8(x, xq, n);
            assert_int_equal(osp_dequant_row(t, w, wf, n), OSP_OK);
            double exact = 0, mag = 0, bound = 0;
            for (int64_t b = 0; b < nb; b++) {
                double amax = 0, wsum = 0;
                for (int i = 0; i < 32; i++) {
                    const int64_t k = b * 32 + i;
                    exact += (double)wf[k] * x[k];
                    mag += fabs((double)wf[k] * x[k]);
                    amax = fmax(amax, fabs(x[k]));
                    wsum += fabs(wf[k]);
                }
                bound += wsum * amax / 508.0 * 1.01;
            }
            const float f = fast(w, xq, nb), r = ref(w, xq, nb);
            if (fabs((double)f - r) > 1e-5 * mag + 1e-30)
                fail_msg("%s: simd %.9g vs reference %.9g (mag %g)", osp_dtype_name(t), f, r, mag);
            if (fabs((double)r - exact) > bound + 1e-5 * mag)
                fail_msg("%s: quantized %.9g vs fp32 %.9g exceeds bound %g", osp_dtype_name(t), r, exact, bound);
        }
    }
    }
}

static void test_quantize_edges(void **state) {
    (void)state;
    float x[64] = {0};
    osp_q8_block q[2];
    osp_quantize_row_q8(x, q, 64); /* all zeros: zero scales, zero codes */
    assert_true(q[0].d == 0.0f && q[0].d2 == 0.0f && q[0].s == 0.0f);
    for (int i = 0; i < 32; i++) assert_true(q[0].qs[i] == 0 && q[0].qs2[i] == 0);
    for (int i = 0; i < 64; i++) x[i] = (float)(i - 32) / 7.0f;
    osp_quantize_row_q8(x, q, 64);
    float sums[4] = {0}; /* per 16 values: s0 holds the first half of each block, s the whole block */
    for (int i = 0; i < 64; i++) {
        const osp_q8_block *b = &q[i / 32];
        const float y = b->d * b->qs[i % 32] + b->d2 * b->qs2[i % 32];
        /* half a step of the second level, or one step where a residual of d / 2 saturated at 127 */
        const float step = abs(b->qs2[i % 32]) == 127 ? 1.0f : 0.5f;
        assert_true(fabsf(y - x[i]) <= b->d2 * step * 1.001f + 1e-7f);
        assert_true(b->d == 256.0f * b->d2); /* the kernels combine the levels in int32 on this */
        sums[i / 16] += y;
    }
    for (int b = 0; b < 2; b++) {
        assert_true(fabsf(q[b].s0 - sums[2 * b]) <= 1e-5f);
        assert_true(fabsf(q[b].s - sums[2 * b] - sums[2 * b + 1]) <= 1e-5f);
    }
}

static void test_nonfinite_activations(void **state) {
    (void)state;
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = 0.5f;
    x[3] = NAN;
    x[40] = INFINITY;
    osp_q8_block q[2];
    osp_quantize_row_q8(x, q, 64); /* UBSan: no float->int cast of NaN/inf */
    assert_true(isnan(q[0].d) && isnan(q[1].d));
    uint8_t w[2 * 34] = {0};
    const uint16_t one = osp_fp32_to_fp16(1.0f);
    memcpy(w, &one, 2);
    memcpy(w + 34, &one, 2);
    assert_true(isnan(osp_qdot_ref_for(OSP_DTYPE_Q8_0)(w, q, 2)));
    assert_true(isnan(osp_qdot_for(OSP_DTYPE_Q8_0)(w, q, 2)));
}

/* The GEMM tiles (osp_qdot_tile_for) give every token the one-token kernel's bits, whatever the
 * token's place in the tile and the activation stride: what keeps prompts, batches and single decode
 * steps identical. Zero weights exercise the signed-zero case (Q8_0 returns -0.0 sums as they are). */
static void test_tiles_match_one_token(void **state) {
    (void)state;
    const char *isas[] = {"avx512vnni", "avx2", "scalar"};
    int tested = 0;
    for (size_t ii = 0; ii < 3; ii++) {
        if (!osp_qdot_force_isa(isas[ii])) continue;
        for (size_t ti = 0; ti < NTYPES; ti++) {
            const uint32_t t = types[ti];
            const int64_t widths[] = {16, 8, 4}; /* the widest tile of at most this many tokens */
            for (size_t wi = 0; wi < 3; wi++) {
                int n = 0;
                bool packed = true;
                const osp_qdot_tile_fn tile = osp_qdot_tile_for(t, widths[wi], &n, &packed);
                const osp_qdot_fn one = osp_qdot_for(t);
                if (!tile) {
                    assert_int_equal(n, 1);
                    assert_false(packed);
                    /* every SIMD family has a tile for every type; narrower than 8 tokens AVX512-VNNI
                     * has them only for Q2_K and Q3_K (its other types run such leftovers by GEMV) */
                    if (strcmp(osp_qdot_isa(), "scalar") && widths[wi] >= 8)
                        fail_msg("%s %s: no tile of <= %d tokens", osp_qdot_isa(), osp_dtype_name(t), (int)widths[wi]);
                    continue;
                }
                assert_true(n >= 2 && n <= widths[wi]);
                for (int trial = 0; trial < 50; trial++) {
                    const int64_t per = osp_dtype_block_size(t) / 32, nb = per * (1 + rnd() % (64 / per));
                    const int64_t stride = nb + rnd() % 3; /* rows of the activation matrix, maybe padded */
                    static uint8_t w[64 * 34];
                    static float x[16 * 67 * 32];
                    static osp_q8_block xq[16 * 67];
                    fill_blocks(t, w, nb / per);
                    if (trial == 0) memset(w, 0, sizeof w);
                    for (int j = 0; j < n; j++) {
                        for (int64_t i = 0; i < nb * 32; i++) x[i] = frand() * (rnd() % 50 == 0 ? 30.0f : 1.0f);
                        if (trial == 1 && j == 1) for (int64_t i = 0; i < nb * 32; i++) x[i] = -0.0f;
                        osp_quantize_row_q8(x, xq + j * stride, nb * 32);
                    }
                    float y[16 * 3];
                    for (int j = 0; j < 16 * 3; j++) y[j] = 12345.0f;
                    static _Alignas(64) osp_q8_pack pk[2 * 64];
                    if (packed) {
                        assert_int_equal(n % OSP_Q8_PACK_TOKENS, 0);
                        for (int g = 0; g < n / OSP_Q8_PACK_TOKENS; g++)
                            osp_pack_q8(xq + g * OSP_Q8_PACK_TOKENS * stride, stride, nb, pk + g * nb);
                    }
                    tile(w, xq, nb, stride, packed ? pk : NULL, y, 3);
                    for (int j = 0; j < n; j++) {
                        const float r = one(w, xq + j * stride, nb);
                        if (memcmp(&r, &y[j * 3], sizeof r) != 0)
                            fail_msg("%s %s: tile of %d, token %d gives %.9g, one-token kernel %.9g", osp_qdot_isa(),
                                     osp_dtype_name(t), n, j, y[j * 3], r);
                        assert_true(y[j * 3 + 1] == 12345.0f && y[j * 3 + 2] == 12345.0f); /* only y[j * ys] */
                    }
                    tested++;
                }
            }
        }
    }
    printf("qdot tiles: %d tiles matched the one-token kernels bit for bit\n", tested);
}

/* The padded tail tiles (osp_qdot_tile_padded_for): n_left tokens' results are the one-token kernel's
 * bits whatever the pack holds past them (junk rows, NaN-free or not), the tile writes exactly its
 * n results ys apart, and its width is the smallest of 4, 6, 8 that holds n_left. */
static void test_padded_tail_tiles(void **state) {
    (void)state;
    if (!osp_qdot_force_isa("avx512vnni")) {
        printf("padded tail tiles: no AVX512-VNNI here, skipped\n");
        return;
    }
    int tested = 0;
    for (size_t ti = 0; ti < NTYPES; ti++) {
        const uint32_t t = types[ti];
        for (int64_t n_left = 1; n_left <= 9; n_left++) {
            int n = 0;
            const osp_qdot_tile_fn tile = osp_qdot_tile_padded_for(t, n_left, &n);
            const bool pair_type = t == OSP_DTYPE_Q8_0 || t == OSP_DTYPE_Q4_0 || t == OSP_DTYPE_Q4_1 ||
                                   t == OSP_DTYPE_Q5_0 || t == OSP_DTYPE_Q5_1 || t == OSP_DTYPE_Q4_K ||
                                   t == OSP_DTYPE_Q5_K || t == OSP_DTYPE_Q6_K;
            const bool want = pair_type && n_left >= (t == OSP_DTYPE_Q8_0 ? 4 : OSP_QDOT_PAD_MIN) && n_left <= 8;
            if (!tile) {
                if (want) fail_msg("%s: no padded tile for %d tokens", osp_dtype_name(t), (int)n_left);
                assert_int_equal(n, 1);
                continue;
            }
            assert_true(want);
            assert_int_equal(n, n_left <= 4 ? 4 : n_left <= 6 ? 6 : 8);
            const osp_qdot_fn one = osp_qdot_for(t);
            for (int trial = 0; trial < 20; trial++) {
                const int64_t per = osp_dtype_block_size(t) / 32, nb = per * (1 + rnd() % (64 / per));
                static uint8_t w[64 * 34];
                static float x[67 * 32];
                static osp_q8_block xq[8 * 64];
                fill_blocks(t, w, nb / per);
                for (int j = 0; j < 8; j++) { /* rows past n_left: other activations, sometimes huge */
                    for (int64_t i = 0; i < nb * 32; i++)
                        x[i] = frand() * (j >= n_left && trial % 2 ? 1e30f : rnd() % 50 == 0 ? 30.0f : 1.0f);
                    osp_quantize_row_q8(x, xq + j * nb, nb * 32);
                }
                static _Alignas(64) osp_q8_pack pk[64];
                osp_pack_q8(xq, nb, nb, pk);
                float y[8 * 3];
                for (int j = 0; j < 8 * 3; j++) y[j] = 12345.0f;
                tile(w, xq, nb, nb, pk, y, 3);
                for (int j = 0; j < 8; j++) {
                    if (j < n_left) {
                        const float r = one(w, xq + j * nb, nb);
                        if (memcmp(&r, &y[j * 3], sizeof r) != 0)
                            fail_msg("%s: padded tile of %d for %d tokens, token %d gives %.9g, one-token kernel %.9g",
                                     osp_dtype_name(t), n, (int)n_left, j, y[j * 3], r);
                    }
                    if (j >= n) assert_true(y[j * 3] == 12345.0f); /* nothing past its n results */
                    assert_true(y[j * 3 + 1] == 12345.0f && y[j * 3 + 2] == 12345.0f);
                }
                tested++;
            }
        }
    }
    printf("padded tail tiles: %d matched the one-token kernels bit for bit\n", tested);
}

/* AVX2 and AVX512-VNNI form the same exact int32 lane sums (4 products a lane, whatever the
 * instructions: vpmaddubsw + vpmaddwd, vpdpbusd, vpdpbusd + vpmulld for the K-quants' 16-value scales)
 * and then the same float operations in the same order, so the two families agree bit for bit on
 * every type: rewriting a kernel's integer part for one family must not move a result. Random bytes
 * reach the extremes (Q8_0 code -128, Q6_K scale -128, 6-bit codes 63); outlier activations saturate
 * the second level. Skipped where the CPU lacks AVX512-VNNI. */
static void test_families_agree(void **state) {
    (void)state;
    if (!osp_qdot_force_isa("avx512vnni")) {
        printf("qdot families: avx512vnni not available on this CPU, skipped\n");
        return;
    }
    int tested = 0;
    for (size_t ti = 0; ti < NTYPES; ti++) {
        const uint32_t t = types[ti];
        for (int trial = 0; trial < 200; trial++) {
            const int64_t per = osp_dtype_block_size(t) / 32, nb = per * (1 + rnd() % (64 / per));
            uint8_t w[64 * 34];
            float x[64 * 32];
            osp_q8_block xq[64];
            fill_blocks(t, w, nb / per);
            for (int64_t i = 0; i < nb * 32; i++) x[i] = frand() * (rnd() % 50 == 0 ? 30.0f : 1.0f);
            osp_quantize_row_q8(x, xq, nb * 32);
            assert_true(osp_qdot_force_isa("avx512vnni"));
            const float v = osp_qdot_for(t)(w, xq, nb);
            assert_true(osp_qdot_force_isa("avx2"));
            const float a = osp_qdot_for(t)(w, xq, nb);
            if (memcmp(&v, &a, sizeof v) != 0)
                fail_msg("%s: avx512vnni %.9g, avx2 %.9g", osp_dtype_name(t), v, a);
            tested++;
        }
    }
    printf("qdot families: %d rows agreed bit for bit between avx512vnni and avx2\n", tested);
}

/* The activation quantizer (SIMD where the build has it) against the contract written out in scalar
 * C: d = max|x| / 127, q = rne(x * 127 / max|x|), r = x - d q, q2 = rne(r * 256 / d) saturated. */
static void test_quantize_contract(void **state) {
    (void)state;
    for (int trial = 0; trial < 2000; trial++) {
        float x[64];
        for (int i = 0; i < 64; i++) x[i] = frand() * (rnd() % 20 == 0 ? 100.0f : 1.0f) * (trial % 7 == 0 ? 1e-30f : 1.0f);
        if (trial % 11 == 0) for (int i = 0; i < 32; i++) x[i] = trial % 2 ? 0.0f : -0.0f;
        osp_q8_block q[2];
        osp_quantize_row_q8(x, q, 64);
        for (int b = 0; b < 2; b++) {
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * b + i]));
            const float d = amax / 127.0f, id = d != 0.0f ? 127.0f / amax : 0.0f;
            const float d2 = d * (1.0f / 256.0f), id2 = d != 0.0f ? 256.0f / d : 0.0f;
            assert_true(memcmp(&q[b].d, &d, 4) == 0 && memcmp(&q[b].d2, &d2, 4) == 0);
            for (int i = 0; i < 32; i++) {
                const float xi = x[32 * b + i], t = xi * id;
                const int qi = (int)nearbyintf(t);
                const float dq = d * (float)qi, r = xi - dq, t2 = r * id2;
                int q2 = (int)nearbyintf(t2);
                q2 = q2 > 127 ? 127 : q2 < -127 ? -127 : q2;
                if (q[b].qs[i] != qi || q[b].qs2[i] != q2)
                    fail_msg("trial %d block %d value %d (%.9g): codes %d/%d, contract %d/%d", trial, b, i, xi,
                             q[b].qs[i], q[b].qs2[i], qi, q2);
            }
        }
    }
}

/* osp_pack_q8 holds exactly what its contract says (qdot.h): each pair's codes side by side, d2 8 times
 * each, the Q8_0 bias -128 (256 L1 + L2) of every 4-code lane, the 8 tokens' s and s0; and the
 * AVX512 packer (picked on AVX512-VNNI) writes the same bytes as the portable one (AVX2 and below).
 * Full-scale codes (-127, 127: the int32 extremes of the bias) come from outlier-only blocks. */
static void test_pack_layout(void **state) {
    (void)state;
    enum { NB = 9, STRIDE = 11 };
    static float x[8 * STRIDE * 32];
    static osp_q8_block xq[8 * STRIDE];
    static _Alignas(64) osp_q8_pack a[NB], b[NB];
    int checked = 0;
    for (int trial = 0; trial < 20; trial++) {
        for (int j = 0; j < 8; j++) {
            for (int64_t i = 0; i < NB * 32; i++) x[i] = frand() * (rnd() % 40 == 0 ? 50.0f : 1.0f);
            if (trial == 0) for (int64_t i = 0; i < NB * 32; i++) x[i] = (i & 1) ? 1.0f : -1.0f;
            osp_quantize_row_q8(x, xq + j * STRIDE, NB * 32);
        }
        const char *isas[] = {"avx512vnni", "avx2"};
        for (int ii = 0; ii < 2; ii++) {
            osp_q8_pack *out = ii ? b : a;
            memset(out, 0x5a, sizeof a);
            if (!osp_qdot_force_isa(isas[ii])) osp_qdot_force_isa("scalar"); /* then both are portable */
            osp_pack_q8(xq, STRIDE, NB, out);
        }
        if (!osp_qdot_force_isa("avx512vnni") && !osp_qdot_force_isa("avx2")) osp_qdot_force_isa("scalar");
        assert_memory_equal(a, b, sizeof a);
        for (int blk = 0; blk < NB; blk++)
            for (int j = 0; j < 8; j++) {
                const osp_q8_block *q = xq + j * STRIDE + blk;
                const osp_q8_pair *pr = &a[blk].pair[j / 2];
                const int h = j % 2;
                assert_memory_equal(pr->qs + 32 * h, q->qs, 32);
                assert_memory_equal(pr->qs2 + 32 * h, q->qs2, 32);
                assert_true(a[blk].s[j] == q->s && a[blk].s0[j] == q->s0);
                for (int l = 0; l < 8; l++) {
                    int32_t l1 = 0, l2 = 0;
                    for (int i = 0; i < 4; i++) l1 += q->qs[4 * l + i], l2 += q->qs2[4 * l + i];
                    assert_true(pr->d2[8 * h + l] == q->d2);
                    assert_int_equal(pr->bias[8 * h + l], -128 * (256 * l1 + l2));
                }
                checked++;
            }
    }
    printf("qdot packs: %d token blocks packed as specified, both packers alike\n", checked);
}

/* The GEMV kernels (osp_qdot_gemv_for: block pairs in 512-bit vectors) give the one-token kernel's
 * bits for every type they cover, odd block counts (a masked last block) and zero weights (-0.0 sums)
 * included; the row packer writes what its contract says and both packers agree. Skipped where the
 * CPU lacks AVX512-VNNI (no GEMV kernels: osp_qdot_gemv_for is NULL there, which is checked). */
static void test_gemv_match_one_token(void **state) {
    (void)state;
    if (!osp_qdot_force_isa("avx512vnni")) {
        for (size_t ti = 0; ti < NTYPES; ti++) assert_null(osp_qdot_gemv_for(types[ti]));
        skip();
    }
    int tested = 0;
    for (size_t ti = 0; ti < NTYPES; ti++) {
        const uint32_t t = types[ti];
        const osp_qdot_gemv_fn gemv = osp_qdot_gemv_for(t);
        if (!gemv) {
            assert_true(t == OSP_DTYPE_Q2_K || t == OSP_DTYPE_Q3_K);
            continue;
        }
        const osp_qdot_fn one = osp_qdot_for(t);
        for (int trial = 0; trial < 200; trial++) {
            const int64_t per = osp_dtype_block_size(t) / 32, nb = per * (1 + rnd() % (64 / per));
            static float x[64 * 32];
            static osp_q8_block xq[64];
            static _Alignas(64) osp_q8_pair bp[34], bq[34]; /* 32 pairs and 64 sums */
            for (int64_t i = 0; i < nb * 32; i++) x[i] = frand() * (rnd() % 50 == 0 ? 30.0f : 1.0f);
            if (trial == 1) for (int64_t i = 0; i < nb * 32; i++) x[i] = -0.0f;
            osp_quantize_row_q8(x, xq, nb * 32);
            osp_pack_q8_row(xq, nb, bp);
            osp_qdot_force_isa("avx2"); /* the portable packer */
            osp_pack_q8_row(xq, nb, bq);
            osp_qdot_force_isa("avx512vnni");
            assert_memory_equal(bp, bq, (size_t)(nb + 1) / 2 * sizeof bp[0] + (size_t)nb * sizeof(float));
            for (int64_t b = 0; b < nb; b++) assert_true(((const float *)(const void *)(bp + (nb + 1) / 2))[b] == xq[b].s);
            for (int64_t b = 0; b < nb; b++)
                for (int l = 0; l < 8; l++) {
                    const osp_q8_pair *pr = &bp[b / 2];
                    const int h = (int)(b % 2);
                    assert_memory_equal(pr->qs + 32 * h, xq[b].qs, 32);
                    assert_true(pr->d2[8 * h + l] == xq[b].d2);
                }
            /* rows of the test's weights: nrows = 1..6 covers a group of 4 and the single rows */
            const int64_t nrows = 1 + rnd() % 6, rb = (int64_t)osp_dtype_type_size(t) * (nb / per);
            static uint8_t wr[6 * 64 * 34];
            for (int64_t r = 0; r < nrows; r++) {
                fill_blocks(t, wr + r * rb, nb / per);
                if (trial == 0) memset(wr + r * rb, 0, (size_t)rb);
            }
            float g[6];
            gemv(wr, (size_t)rb, xq, bp, nb, g, nrows);
            for (int64_t r = 0; r < nrows; r++) {
                const float o = one(wr + r * rb, xq, nb);
                if (memcmp(&o, &g[r], sizeof o) != 0)
                    fail_msg("%s nb %d row %d of %d: GEMV gives %.9g, one-token kernel %.9g", osp_dtype_name(t),
                             (int)nb, (int)r, (int)nrows, g[r], o);
            }
            tested++;
        }
    }
    printf("qdot GEMV: %d row groups matched the one-token kernels bit for bit\n", tested);

    /* A last odd block updates the low half alone: with an infinite scale there, adding the padded
     * high half (zeros times inf * 0) would turn the one-token kernel's +inf into NaN. */
    static float x[3 * 32];
    static osp_q8_block xq[3];
    static _Alignas(64) osp_q8_pair bp[4];
    static uint8_t w[4][3 * 34];
    for (int i = 0; i < 3 * 32; i++) x[i] = 0.5f + 0.01f * (float)i; /* all positive */
    osp_quantize_row_q8(x, xq, 3 * 32);
    osp_pack_q8_row(xq, 3, bp);
    for (int r = 0; r < 4; r++)
        for (int b = 0; b < 3; b++) {
            put_half(w[r] + 34 * b, 1.0f);
            memset(w[r] + 34 * b + 2, 1 + r, 32); /* positive codes */
        }
    const uint16_t inf = 0x7C00;
    memcpy(w[3] + 34 * 2, &inf, 2);
    float g[4];
    osp_qdot_gemv_for(OSP_DTYPE_Q8_0)(w, sizeof w[0], xq, bp, 3, g, 4);
    for (int r = 0; r < 4; r++) {
        const float o = osp_qdot_for(OSP_DTYPE_Q8_0)(w[r], xq, 3);
        assert_memory_equal(&o, &g[r], sizeof o);
    }
    assert_true(isinf(g[3]) && g[3] > 0.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels),
        cmocka_unit_test(test_quantize_edges),
        cmocka_unit_test(test_quantize_contract),
        cmocka_unit_test(test_nonfinite_activations),
        cmocka_unit_test(test_tiles_match_one_token),
        cmocka_unit_test(test_padded_tail_tiles),
        cmocka_unit_test(test_families_agree),
        cmocka_unit_test(test_pack_layout),
        cmocka_unit_test(test_gemv_match_one_token),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
