/* Quantized KV pages on the CPU (issue 13; src/backend/cpu/kv_quant.c, src/kv/kv_cache.c):
 *   - attention over fp8 / nvfp4 pages equals attention over their dequantized copy (f32 pages made
 *     with core/dtype.c's decoders, not kv_quant.c's), over the shapes the attention tests use: head_dim
 *     32 / 64 / 128, GQA ratios 1 / 2 / 4 / 8, sliding windows, sequences ending inside a block,
 *     shuffled block tables, several sequences with prefill chunks and decodes mixed. The decoded
 *     values are the same fp32 products and the attention arithmetic is the f32 path's, so the result
 *     is asserted bit-equal (stronger than "within fp32 rounding");
 *   - the KV write stores exactly core/dtype.c's codes (fp8: e4m3(x / s); nvfp4: osp_nvfp4_quantize16
 *     with the layer's tensor scale), with per-head scales that differ;
 *   - a write touches only its own slot's bytes and scales: pages and pools poisoned, one token written,
 *     every other byte unchanged; a decode write after a prefill leaves earlier tokens' bytes as they were;
 *   - the cache: scale pools exist for nvfp4 only, copy_block carries the scales with the data, sizes
 *     and bytes per token, bad scales and shapes refused, dtype names and vLLM's aliases;
 *   - split caches (K and V pages of different dtypes, e.g. K fp8 + V nvfp4): each side is written,
 *     read, sized and copied in its own format (all of the above with K and V differing), and their
 *     attention stays within the error bound derived from each format's rounding (fp8 and nvfp4) of
 *     the f32 reference over the unquantized rows. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/threadpool.h"
#include "kv/kv_cache.h"
#include "osprey/kv_cache.h"

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}
static float urand(void) { return (float)rnd() / 2097152.0f / 1024.0f * 2.0f - 1.0f; } /* [-1, 1) */

static osp_threadpool *g_pool;

static osp_backend *cpu(void) {
    osp_backend_params bp = {.pool = g_pool};
    osp_backend *be;
    assert_int_equal(osp_backend_create(OSP_DEVICE_CPU, &bp, &be), OSP_OK);
    return be;
}

/* A token's K or V row [HK * D]: mostly of magnitude `mag`, sometimes an outlier 20x larger, some
 * exact zeros (micro-blocks of zeros get scale 0). */
static void rand_row(float *x, int64_t n, float mag) {
    for (int64_t i = 0; i < n; i++) {
        const uint32_t r = rnd() % 64;
        x[i] = r == 0 ? 20.0f * mag * urand() : r == 1 ? 0.0f : mag * urand();
    }
    if (rnd() % 4 == 0)
        for (int64_t i = 0; i < 16 && i < n; i++) x[i] = 0.0f; /* an all-zero micro-block */
}

/* The dequantized copy of slot `slot` of kv's layer 0 into f32 pages, with core/dtype.c's decoders,
 * K and V each by their own format. */
static void dequant_slot(const osp_kv_cache *kv, int64_t slot, float *kf, float *vf) {
    const int64_t R = kv->k_fmt.kv_row, D = kv->k_fmt.head_dim;
    for (int w = 0; w < 2; w++) {
        float *dst = (w ? vf : kf) + slot * R;
        const uint8_t *pg = w ? kv->v[0] : kv->k[0];
        const float *fixed = w ? kv->v_fixed : kv->k_fixed;
        const osp_kv_dtype dt = (w ? &kv->v_fmt : &kv->k_fmt)->dtype;
        if (dt == OSP_KV_DTYPE_F32) {
            memcpy(dst, (const float *)(const void *)pg + slot * R, sizeof(float) * (size_t)R);
        } else if (dt == OSP_KV_DTYPE_F16) {
            for (int64_t i = 0; i < R; i++) dst[i] = osp_fp16_to_fp32(((const uint16_t *)(const void *)pg)[slot * R + i]);
        } else if (dt == OSP_KV_DTYPE_FP8) {
            for (int64_t i = 0; i < R; i++) dst[i] = osp_e4m3_to_fp32(pg[slot * R + i]) * fixed[i / D];
        } else {
            const uint8_t *sc = w ? kv->v_scale[0] : kv->k_scale[0];
            for (int64_t j = 0; j < R / 16; j++)
                osp_nvfp4_dequantize16(pg + slot * R / 2 + 8 * j, sc[slot * R / 16 + j], fixed[0], dst + 16 * j);
        }
    }
}

typedef struct attn_case {
    int32_t D, H, HK, window, block_size, n_seq;
    int32_t ctx[4], nq[4]; /* per sequence: tokens in the cache after the step, query tokens of the step */
} attn_case;

static osp_cpu_kv_pages pages_of(const osp_kv_cache *kv) {
    return (osp_cpu_kv_pages){.k_type = kv->k_fmt.elem_type, .v_type = kv->v_fmt.elem_type, .k = kv->k[0],
                              .v = kv->v[0], .k_scale = kv->k_scale[0], .v_scale = kv->v_scale[0],
                              .k_fixed = kv->k_fixed, .v_fixed = kv->v_fixed};
}

/* "fp8" or "fp8/nvfp4" (K/V) for messages. */
static const char *kv_name(osp_kv_dtype dk, osp_kv_dtype dv) {
    static char buf[32];
    if (dk == dv) snprintf(buf, sizeof buf, "%s", osp_kv_dtype_name(dk));
    else snprintf(buf, sizeof buf, "%s/%s", osp_kv_dtype_name(dk), osp_kv_dtype_name(dv));
    return buf;
}

/* K pages of dk and V pages of dv (dt = dk = dv: an unsplit cache) */
static void run_attn_case(const attn_case *c, osp_kv_dtype dk, osp_kv_dtype dv) {
    const int32_t D = c->D, H = c->H, HK = c->HK, BS = c->block_size;
    const int64_t R = (int64_t)HK * D;
    int32_t max_blocks = 0, num_blocks = 0, T = 0;
    for (int s = 0; s < c->n_seq; s++) {
        const int32_t nb = (c->ctx[s] + BS - 1) / BS;
        if (nb > max_blocks) max_blocks = nb;
        num_blocks += nb;
        T += c->nq[s];
    }
    /* distinct, shuffled physical blocks */
    int32_t *perm = malloc(sizeof *perm * (size_t)num_blocks), *bt = calloc((size_t)(c->n_seq * max_blocks), sizeof *bt);
    for (int32_t i = 0; i < num_blocks; i++) perm[i] = i;
    for (int32_t i = num_blocks - 1; i > 0; i--) {
        const int32_t j = (int32_t)(rnd() % (uint32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int s = 0, k = 0; s < c->n_seq; s++)
        for (int32_t b = 0; b < (c->ctx[s] + BS - 1) / BS; b++) bt[s * max_blocks + b] = perm[k++];
    /* fixed scales that differ per head (fp8) / per K and V (nvfp4) */
    float ks[8], vs[8];
    for (int h = 0; h < 8; h++) ks[h] = 0.5f + 0.25f * (float)h, vs[h] = 0.03125f * (float)(1 + h);
    osp_backend *be = cpu();
    osp_kv_cache *kv;
    const osp_kv_shape sh = {1, HK, D};
    assert_int_equal(osp_kv_cache_create_scaled(be, &sh, num_blocks, BS, dk, dv, dk == OSP_KV_DTYPE_FP8 ? ks : ks + 2,
                                                dv == OSP_KV_DTYPE_FP8 ? vs : vs + 3, &kv),
                     OSP_OK);
    const osp_cpu_kv_pages pg = pages_of(kv);
    const size_t slots = (size_t)num_blocks * (size_t)BS;
    float *kf = calloc(slots * (size_t)R, sizeof *kf), *vf = calloc(slots * (size_t)R, sizeof *vf);
    float *krow = malloc(sizeof *krow * (size_t)R), *vrow = malloc(sizeof *vrow * (size_t)R);
    /* every position of every sequence written, one token at a time, K larger than V as in models */
    for (int s = 0; s < c->n_seq; s++)
        for (int32_t p = 0; p < c->ctx[s]; p++) {
            rand_row(krow, R, 4.0f);
            rand_row(vrow, R, 0.5f);
            const int32_t slot = bt[s * max_blocks + p / BS] * BS + p % BS;
            osp_cpu_kv_write_quant(&pg, kv->k[0], kv->v[0], kv->k_scale[0], kv->v_scale[0], krow, vrow, slot, HK, D);
            dequant_slot(kv, slot, kf, vf);
        }
    /* the step: each sequence's last nq tokens are its queries */
    int32_t *pos = malloc(sizeof *pos * (size_t)T), qsl[5] = {0};
    for (int s = 0, t = 0; s < c->n_seq; s++) {
        for (int32_t i = 0; i < c->nq[s]; i++) pos[t++] = c->ctx[s] - c->nq[s] + i;
        qsl[s + 1] = t;
    }
    float *q = malloc(sizeof *q * (size_t)T * (size_t)H * (size_t)D);
    for (int64_t i = 0; i < (int64_t)T * H * D; i++) q[i] = urand();
    float *o_q = malloc(sizeof *o_q * (size_t)T * (size_t)H * (size_t)D), *o_f = malloc(sizeof *o_f * (size_t)T * (size_t)H * (size_t)D);
    float *sc = malloc(sizeof *sc * 4096);
    const float scale = 1.0f / sqrtf((float)D);
    /* in two item ranges, as two threads would split them */
    const int64_t items = (int64_t)T * H, mid = items / 3;
    for (int part = 0; part < 2; part++) {
        const int64_t i0 = part ? mid : 0, i1 = part ? items : mid;
        osp_cpu_paged_attention_kv(q, &pg, o_q, c->n_seq, qsl, pos, bt, max_blocks, BS, H, HK, D, scale, c->window, sc,
                                   i0, i1);
        osp_cpu_paged_attention(q, kf, vf, OSP_DTYPE_F32, o_f, c->n_seq, qsl, pos, bt, max_blocks, BS, H, HK, D, scale,
                                c->window, sc, i0, i1);
    }
    /* the tiled kernel the CPU backend runs (a KV head's group at a token shares each row read) gives
     * the same bits for any tile width, also when a thread's range cuts a group */
    float *o_t = malloc(sizeof *o_t * (size_t)T * (size_t)H * (size_t)D);
    float *sct = malloc(sizeof *sct * OSP_CPU_ATTN_MAX_TILE * 4096);
    const int tiles[] = {1, 2, 7, OSP_CPU_ATTN_MAX_TILE}; /* one group, cut groups, query blocks of tokens */
    for (size_t ti = 0; ti < sizeof tiles / sizeof tiles[0]; ti++) {
        const int tile = tiles[ti];
        const int64_t cut = items / 2 + 1;
        for (int part = 0; part < 2; part++)
            osp_cpu_paged_attention_tiled(q, &pg, o_t, c->n_seq, qsl, pos, bt, max_blocks, BS, H, HK, D, scale,
                                          c->window, sct, 4096, tile, part ? cut : 0, part ? items : cut);
        if (memcmp(o_t, o_q, sizeof *o_t * (size_t)(items * D)) != 0)
            fail_msg("%s D %d H %d/%d: tiles of %d differ from one item at a time", kv_name(dk, dv), D, H, HK, tile);
    }
    /* the q8 mode's attention (kv_quant.c, ATTENTION IN Q8 MODE: vexp.h's exp, FMAs): its own bits, the
     * same for every tile width and item split (batch invariance), and within float rounding of the
     * default path's: |difference| <= 1e-4 of the row's largest output (the scores here reach |s| ~ 20
     * with sums of 128 products of magnitude ~4, where fma against a rounded product moves a score by
     * ~1e-5 absolute, so each softmax weight by ~1e-5 relative; measured worst ~2e-5) */
    osp_cpu_kv_pages pg8 = pg;
    pg8.q8_arith = true;
    float *o_8 = malloc(sizeof *o_8 * (size_t)T * (size_t)H * (size_t)D);
    for (size_t ti = 0; ti < sizeof tiles / sizeof tiles[0]; ti++) {
        const int tile = tiles[ti];
        const int64_t cut = ti % 2 ? items / 3 : items / 2 + 1;
        for (int part = 0; part < 2; part++)
            osp_cpu_paged_attention_tiled(q, &pg8, ti ? o_t : o_8, c->n_seq, qsl, pos, bt, max_blocks, BS, H, HK, D,
                                          scale, c->window, sct, 4096, tile, part ? cut : 0, part ? items : cut);
        if (ti && memcmp(o_t, o_8, sizeof *o_t * (size_t)(items * D)) != 0)
            fail_msg("%s D %d H %d/%d: q8 mode, tiles of %d differ from one item at a time", kv_name(dk, dv), D, H, HK,
                     tile);
    }
    float worst = 0.0f;
    for (int64_t it = 0; it < items; it++) {
        float amax = 0.0f;
        for (int64_t d = 0; d < D; d++) amax = fmaxf(amax, fabsf(o_q[it * D + d]));
        for (int64_t d = 0; d < D; d++) worst = fmaxf(worst, fabsf(o_8[it * D + d] - o_q[it * D + d]) / amax);
        for (int64_t d = 0; d < D; d++)
            if (!(fabsf(o_8[it * D + d] - o_q[it * D + d]) <= 1e-4f * amax))
                fail_msg("%s D %d: q8 mode item %lld dim %lld: %.9g, default %.9g", kv_name(dk, dv), D, (long long)it,
                         (long long)d, (double)o_8[it * D + d], (double)o_q[it * D + d]);
    }
    print_message("%s D %d H %d/%d: q8 mode vs default, worst |difference| / row max %.2g\n", kv_name(dk, dv), D, H,
                  HK, (double)worst);
    free(o_8);
    free(o_t), free(sct);
    for (int64_t i = 0; i < items * D; i++) {
        assert_true(isfinite(o_f[i]));
        if (memcmp(&o_q[i], &o_f[i], sizeof(float)) != 0)
            fail_msg("%s D %d H %d/%d window %d: out[%lld] %.9g over the pages, %.9g over their dequantized copy",
                     kv_name(dk, dv), D, H, HK, c->window, (long long)i, (double)o_q[i], (double)o_f[i]);
    }
    free(perm), free(bt), free(kf), free(vf), free(krow), free(vrow), free(pos), free(q), free(o_q), free(o_f), free(sc);
    osp_kv_cache_free(kv);
    osp_backend_free(be);
}

static void test_attention_equals_dequantized(void **state) {
    (void)state;
    const attn_case cases[] = {
        {.D = 64, .H = 4, .HK = 4, .block_size = 16, .n_seq = 1, .ctx = {1}, .nq = {1}},             /* one token */
        {.D = 32, .H = 8, .HK = 4, .block_size = 16, .n_seq = 2, .ctx = {37, 5}, .nq = {37, 1}},     /* prefill + decode */
        {.D = 64, .H = 9, .HK = 3, .block_size = 16, .n_seq = 3, .ctx = {70, 16, 33}, .nq = {1, 16, 4}}, /* SmolLM2's heads */
        {.D = 128, .H = 32, .HK = 8, .block_size = 16, .n_seq = 2, .ctx = {300, 129}, .nq = {1, 9}}, /* Llama-3 8B's */
        {.D = 128, .H = 8, .HK = 1, .block_size = 32, .n_seq = 1, .ctx = {95}, .nq = {95}},          /* ratio 8 */
        {.D = 64, .H = 4, .HK = 2, .window = 7, .block_size = 16, .n_seq = 2, .ctx = {50, 8}, .nq = {50, 2}},
        {.D = 128, .H = 16, .HK = 8, .window = 64, .block_size = 64, .n_seq = 2, .ctx = {200, 65}, .nq = {3, 65}},
        {.D = 32, .H = 2, .HK = 1, .window = 1, .block_size = 1, .n_seq = 1, .ctx = {12}, .nq = {12}}, /* block 1 */
    };
    /* unsplit, then split caches: K fp8 + V nvfp4 (the split bench/RESULTS.md measures), the reverse,
     * and a quantized side next to a plain one */
    const osp_kv_dtype pairs[][2] = {{OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_FP8},   {OSP_KV_DTYPE_NVFP4, OSP_KV_DTYPE_NVFP4},
                                     {OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_NVFP4}, {OSP_KV_DTYPE_NVFP4, OSP_KV_DTYPE_FP8},
                                     {OSP_KV_DTYPE_F16, OSP_KV_DTYPE_NVFP4}, {OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_F32}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) run_attn_case(&cases[i], pairs[p][0], pairs[p][1]);
}

/* The rounding bound of one stored value x of a side of format dt (the side's fixed scale s: fp8's
 * per-head scale, nvfp4's tensor scale T; amax: the absolute maximum of x's micro-block of 16):
 *  fp8 (E4M3, 3 mantissa bits, nearest): half an ulp, 2^-4 |x| for normal codes, and 2^-10 s below
 *    2^-6 s (the subnormal step is 2^-9 s); no saturation at these magnitudes (|x| < 448 s);
 *  nvfp4: the micro-block scale is S = e4m3(amax / 6 / T) T = (amax / 6)(1 + e), |e| <= 2^-4 for a normal
 *    code, plus at most 2^-10 T from a subnormal one; E2M1's widest gap is 2 (between 4 and 6), so a
 *    value rounds by at most S, and one clamped at 6 (S rounded down) loses amax - 6 S <= amax 2^-4 < S.
 *    So |dx| <= amax (1 + 2^-4) / 6 + 6 * 2^-10 T. */
static float round_bound(osp_kv_dtype dt, float x, float amax, float s) {
    if (dt == OSP_KV_DTYPE_FP8) return 0.0625f * fabsf(x) + s / 1024.0f;
    if (dt == OSP_KV_DTYPE_NVFP4) return amax * (1.0f + 0.0625f) / 6.0f + 6.0f * s / 1024.0f;
    return 0.0f; /* f32 */
}

/* A split cache's attention (and an unsplit fp8 / nvfp4 one's) against the f32 reference over the
 * unquantized rows, within the bound derived from each side's rounding (round_bound):
 *  1. every decoded K and V value is within its own format's bound of the value written;
 *  2. with |dk| <= bk, key p's score moves by at most D_p = scale * sum_d |q_d| bk[p][d], so with the
 *     reference weights w_p (softmax of the f32 scores, in double) the new normaliser lies in
 *     [Zlo, Zhi] = [sum_j w_j e^-D_j, sum_j w_j e^D_j], each weight w'_p = w_p e^d_p / Z' within
 *     w_p [e^-D_p / Zhi, e^D_p / Zlo], and |o' - o|_d <= sum_p |w'_p - w_p| |v_pd| + sum_p w'_p bv[p][d]
 *     (|dv| <= bv), plus fp32 rounding of both runs.
 * Each side is bounded by its own format: a side read or written in the other side's format (a swapped
 * type, a shared scale pool) lands far outside. Rows: K ~ 1.5, V ~ 0.5, rare 20x outliers. Measured
 * (x86-64): the V side's part of the bound is tight (worst error / bound 0.87-0.96 with K in f32); the K
 * side's is loose (0.02 for fp8 K, ~0 for nvfp4 K: D_p adds every term's worst case in one direction),
 * so check 1, per value, is what pins K's format; test_attention_equals_dequantized covers the shapes. */
static void test_split_vs_f32_reference(void **state) {
    (void)state;
    const struct { int32_t D, H, HK, ctx, nq; } cases[] = {{64, 9, 3, 100, 4}, {128, 8, 2, 45, 45}, {32, 4, 4, 17, 1}};
    const osp_kv_dtype pairs[][2] = {{OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_NVFP4}, {OSP_KV_DTYPE_NVFP4, OSP_KV_DTYPE_FP8},
                                     {OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_FP8},   {OSP_KV_DTYPE_NVFP4, OSP_KV_DTYPE_NVFP4},
                                     {OSP_KV_DTYPE_F32, OSP_KV_DTYPE_NVFP4}, {OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_F32}};
    osp_backend *be = cpu();
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int32_t D = cases[ci].D, H = cases[ci].H, HK = cases[ci].HK, n = cases[ci].ctx, nq = cases[ci].nq;
        const int32_t BS = 16, NB = (n + BS - 1) / BS, grp = H / HK;
        const int64_t R = (int64_t)HK * D;
        float *k = malloc(sizeof *k * (size_t)(NB * BS * R)), *v = malloc(sizeof *v * (size_t)(NB * BS * R));
        for (int32_t p = 0; p < n; p++) rand_row(k + p * R, R, 1.5f), rand_row(v + p * R, R, 0.5f);
        float *q = malloc(sizeof *q * (size_t)(nq * H * D)), *o_ref = malloc(sizeof *o_ref * (size_t)(nq * H * D)),
              *o = malloc(sizeof *o * (size_t)(nq * H * D)), *sc = malloc(sizeof *sc * 4096);
        for (int64_t i = 0; i < (int64_t)nq * H * D; i++) q[i] = urand();
        int32_t bt[16], pos[64];
        for (int32_t b = 0; b < NB; b++) bt[b] = NB - 1 - b; /* blocks in reverse order */
        for (int32_t i = 0; i < nq; i++) pos[i] = n - nq + i;
        const int32_t qsl[2] = {0, nq};
        const float scale = 1.0f / sqrtf((float)D);
        /* the reference: f32 pages of the unquantized rows, slot = bt[p / BS] * BS + p % BS */
        float *kf = calloc((size_t)(NB * BS * R), sizeof *kf), *vf = calloc((size_t)(NB * BS * R), sizeof *vf);
        float *kd = calloc((size_t)(NB * BS * R), sizeof *kd), *vd = calloc((size_t)(NB * BS * R), sizeof *vd);
        for (int32_t p = 0; p < n; p++) {
            const int64_t slot = (int64_t)bt[p / BS] * BS + p % BS;
            memcpy(kf + slot * R, k + p * R, sizeof(float) * (size_t)R);
            memcpy(vf + slot * R, v + p * R, sizeof(float) * (size_t)R);
        }
        osp_cpu_paged_attention(q, kf, vf, OSP_DTYPE_F32, o_ref, 1, qsl, pos, bt, NB, BS, H, HK, D, scale, 0, sc, 0,
                                (int64_t)nq * H);
        double *bk = malloc(sizeof *bk * (size_t)(n * R)), *bv = malloc(sizeof *bv * (size_t)(n * R));
        double *w = malloc(sizeof *w * (size_t)n), *dl = malloc(sizeof *dl * (size_t)n);
        for (size_t pi = 0; pi < sizeof pairs / sizeof pairs[0]; pi++) {
            const osp_kv_dtype dk = pairs[pi][0], dv = pairs[pi][1];
            osp_kv_cache *kv;
            const osp_kv_shape sh = {1, HK, D};
            assert_int_equal(osp_kv_cache_create_scaled(be, &sh, NB, BS, dk, dv, NULL, NULL, &kv), OSP_OK);
            const osp_cpu_kv_pages pg = pages_of(kv);
            for (int32_t p = 0; p < n; p++)
                osp_cpu_kv_write_quant(&pg, kv->k[0], kv->v[0], kv->k_scale[0], kv->v_scale[0], k + p * R, v + p * R,
                                       bt[p / BS] * BS + p % BS, HK, D);
            osp_cpu_paged_attention_kv(q, &pg, o, 1, qsl, pos, bt, NB, BS, H, HK, D, scale, 0, sc, 0, (int64_t)nq * H);
            /* 1. each side's decoded values within its format's bound (default scales: fp8 1 per head, nvfp4 T) */
            const float sk = dk == OSP_KV_DTYPE_FP8 ? OSP_KV_FP8_DEFAULT_SCALE : OSP_KV_NVFP4_DEFAULT_TENSOR_SCALE;
            const float sv = dv == OSP_KV_DTYPE_FP8 ? OSP_KV_FP8_DEFAULT_SCALE : OSP_KV_NVFP4_DEFAULT_TENSOR_SCALE;
            for (int32_t p = 0; p < n; p++) {
                const int64_t slot = (int64_t)bt[p / BS] * BS + p % BS;
                dequant_slot(kv, slot, kd, vd);
                for (int64_t i = 0; i < R; i++)
                    for (int side = 0; side < 2; side++) {
                        const float *x = (side ? v : k) + p * R;
                        float amax = 0;
                        for (int64_t j = i / 16 * 16; j < i / 16 * 16 + 16; j++) amax = fmaxf(amax, fabsf(x[j]));
                        const double b = round_bound(side ? dv : dk, x[i], amax, side ? sv : sk);
                        const double got = (side ? vd : kd)[slot * R + i];
                        if (!(fabs(got - (double)x[i]) <= b * (1 + 1e-6)))
                            fail_msg("%s: %s[%d][%lld] %.7g decodes to %.7g, beyond %s's bound %.3g", kv_name(dk, dv),
                                     side ? "V" : "K", p, (long long)i, (double)x[i], got,
                                     osp_kv_dtype_name(side ? dv : dk), b);
                        (side ? bv : bk)[p * R + i] = b;
                    }
            }
            /* 2. attention within the propagated bound */
            double worst = 0, err_sum = 0;
            for (int32_t t = 0; t < nq; t++)
                for (int32_t h = 0; h < H; h++) {
                    const int32_t g = h / grp, n_ctx = pos[t] + 1;
                    const float *qh = q + ((int64_t)t * H + h) * D;
                    double mx = -INFINITY, z = 0, zlo = 0, zhi = 0;
                    for (int32_t p = 0; p < n_ctx; p++) {
                        double s_p = 0, d_p = 0;
                        for (int32_t d = 0; d < D; d++) {
                            s_p += (double)qh[d] * k[p * R + (int64_t)g * D + d];
                            d_p += fabs((double)qh[d]) * bk[p * R + (int64_t)g * D + d];
                        }
                        w[p] = s_p * scale, dl[p] = d_p * scale;
                        mx = fmax(mx, w[p]);
                    }
                    for (int32_t p = 0; p < n_ctx; p++) z += (w[p] = exp(w[p] - mx));
                    for (int32_t p = 0; p < n_ctx; p++) {
                        w[p] /= z;
                        zlo += w[p] * exp(-dl[p]), zhi += w[p] * exp(dl[p]);
                    }
                    for (int32_t d = 0; d < D; d++) {
                        double bound = 0;
                        for (int32_t p = 0; p < n_ctx; p++) {
                            const double hi = exp(dl[p]) / zlo, lo = exp(-dl[p]) / zhi; /* w'_p / w_p in [lo, hi] */
                            const double vpd = v[p * R + (int64_t)g * D + d], bvd = bv[p * R + (int64_t)g * D + d];
                            bound += w[p] * (fmax(hi - 1, 1 - lo) * fabs(vpd) + hi * bvd);
                        }
                        const int64_t i = ((int64_t)t * H + h) * D + d;
                        bound += 1e-5 * (1 + fabs((double)o_ref[i]));
                        const double err = fabs((double)o[i] - (double)o_ref[i]);
                        if (!(err <= bound))
                            fail_msg("%s D %d H %d/%d: out[%d][%d][%d] %.7g, f32 reference %.7g: error %.3g over the bound "
                                     "%.3g", kv_name(dk, dv), D, H, HK, t, h, d, (double)o[i], (double)o_ref[i], err, bound);
                        worst = fmax(worst, err / bound);
                        err_sum += err;
                    }
                }
            assert_true(err_sum > 0); /* quantization did happen (an unquantized page would pass any bound) */
            print_message("%s D %d H %d/%d: mean |error| %.3g, worst error / bound %.3f\n", kv_name(dk, dv), D, H, HK,
                          err_sum / ((double)nq * H * D), worst);
            osp_kv_cache_free(kv);
        }
        free(k), free(v), free(q), free(o_ref), free(o), free(sc), free(kf), free(vf), free(kd), free(vd);
        free(bk), free(bv), free(w), free(dl);
    }
    osp_backend_free(be);
}

/* Every code decodes as core/dtype.c decodes it: one key, so attention's output is the V row itself
 * (softmax weight exactly 1). fp8: all 256 E4M3 codes (NaN, subnormals, +-448) in one token's V row;
 * nvfp4: all 256 bytes (every pair of E2M1 nibbles) with micro-block scales over the E4M3 range
 * (zero, subnormal, normal, 448, NaN). */
static void test_decode_every_code(void **state) {
    (void)state;
    osp_backend *be = cpu();
    const osp_kv_shape sh = {1, 2, 128};
    const osp_kv_dtype dts[2] = {OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_NVFP4};
    const uint8_t scale_codes[8] = {0x00, 0x01, 0x07, 0x08, 0x38, 0x7E, 0x7F, 0xB3};
    for (int di = 0; di < 2; di++) {
        osp_kv_cache *kv;
        const float ks[2] = {1.0f, 1.0f}, vs[2] = {0.375f, 3.0f};
        assert_int_equal(osp_kv_cache_create_scaled(be, &sh, 1, 16, dts[di], dts[di], ks, vs, &kv), OSP_OK);
        uint8_t *vp = kv->v[0];
        float want[256];
        if (dts[di] == OSP_KV_DTYPE_FP8) {
            for (int c = 0; c < 256; c++) vp[c] = (uint8_t)c, want[c] = osp_e4m3_to_fp32((uint8_t)c) * vs[c / 128];
        } else {
            uint8_t *vsc = kv->v_scale[0];
            for (int j = 0; j < 16; j++) vsc[j] = scale_codes[j % 8];
            for (int b = 0; b < 128; b++) vp[b] = (uint8_t)(b * 2 + (b >= 64)); /* the 256 bytes over 2 rows */
            for (int j = 0; j < 16; j++) osp_nvfp4_dequantize16(vp + 8 * j, vsc[j], vs[0], want + 16 * j);
        }
        const osp_cpu_kv_pages pg = pages_of(kv);
        float q[2 * 128] = {0}, out[2 * 128], sc[4];
        const int32_t qsl[2] = {0, 1}, pos[1] = {0}, bt[1] = {0};
        osp_cpu_paged_attention_kv(q, &pg, out, 1, qsl, pos, bt, 1, 16, 2, 2, 128, 0.125f, 0, sc, 0, 2);
        for (int i = 0; i < 256; i++)
            if (!(isnan(want[i]) ? isnan(out[i]) : out[i] == want[i])) /* == : o starts at +0, so -0 reads as +0 */
                fail_msg("%s: value %d decodes to %.9g, core/dtype.c gives %.9g", osp_kv_dtype_name(dts[di]), i,
                         (double)out[i], (double)want[i]);
        osp_kv_cache_free(kv);
    }
    osp_backend_free(be);
}

/* The write stores core/dtype.c's codes, per head for fp8, per micro-block for nvfp4, and touches only
 * its own slot: every other byte of the pages and of the scale pools keeps its poison. Split caches too:
 * K and V rows of different sizes, a scale pool on one side only. */
static void test_write_own_slot_only(void **state) {
    (void)state;
    const int32_t HK = 3, D = 64, BS = 16, NB = 4;
    const int64_t R = (int64_t)HK * D;
    const osp_kv_dtype pairs[][2] = {{OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_FP8}, {OSP_KV_DTYPE_NVFP4, OSP_KV_DTYPE_NVFP4},
                                     {OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_NVFP4}, {OSP_KV_DTYPE_NVFP4, OSP_KV_DTYPE_FP8}};
    for (size_t di = 0; di < sizeof pairs / sizeof pairs[0]; di++) {
        const osp_kv_dtype dk = pairs[di][0], dv = pairs[di][1];
        osp_backend *be = cpu();
        osp_kv_cache *kv;
        const osp_kv_shape sh = {1, HK, D};
        const float ks[3] = {0.5f, 2.0f, 8.0f}, vs[3] = {0.25f, 1.0f, 4.0f};
        assert_int_equal(osp_kv_cache_create_scaled(be, &sh, NB, BS, dk, dv, ks, vs, &kv), OSP_OK);
        /* pools: K pages, V pages, K scales, V scales; each with its own row size */
        const size_t row[4] = {kv->k_fmt.bytes_per_token, kv->v_fmt.bytes_per_token, kv->k_fmt.scale_bytes_per_token,
                               kv->v_fmt.scale_bytes_per_token};
        assert_int_equal(row[0], dk == OSP_KV_DTYPE_FP8 ? R : R / 2);
        assert_int_equal(row[1], dv == OSP_KV_DTYPE_FP8 ? R : R / 2);
        assert_true((row[2] > 0) == (dk == OSP_KV_DTYPE_NVFP4) && (row[3] > 0) == (dv == OSP_KV_DTYPE_NVFP4));
        assert_true((kv->k_scale[0] != NULL) == (row[2] > 0) && (kv->v_scale[0] != NULL) == (row[3] > 0));
        uint8_t *pages[4] = {kv->k[0], kv->v[0], kv->k_scale[0], kv->v_scale[0]};
        size_t len[4];
        for (int i = 0; i < 4; i++) len[i] = (size_t)NB * BS * row[i];
        for (int i = 0; i < 4; i++)
            if (len[i]) memset(pages[i], 0xA5, len[i]);
        uint8_t *before[4];
        for (int i = 0; i < 4; i++) before[i] = malloc(len[i] + 1);
        float k[192], v[192];
        const osp_cpu_kv_pages pg = pages_of(kv);
        const int32_t order[3] = {21, 22, 5}; /* a prefill token, the next decode token, one in another block */
        for (int w = 0; w < 3; w++) {
            for (int i = 0; i < 4; i++)
                if (len[i]) memcpy(before[i], pages[i], len[i]);
            rand_row(k, R, 3.0f);
            rand_row(v, R, 0.7f);
            const int32_t slot = order[w];
            osp_cpu_kv_write_quant(&pg, kv->k[0], kv->v[0], kv->k_scale[0], kv->v_scale[0], k, v, slot, HK, D);
            for (int i = 0; i < 4; i++) {
                const size_t r = row[i];
                for (size_t b = 0; b < len[i]; b++) {
                    const bool own = b >= (size_t)slot * r && b < (size_t)(slot + 1) * r;
                    if (!own && pages[i][b] != before[i][b])
                        fail_msg("%s write at slot %d changed byte %zu of pool %d (slot %zu)", kv_name(dk, dv), slot, b,
                                 i, b / r);
                }
            }
            /* the codes are core/dtype.c's, each side in its own format */
            for (int wv = 0; wv < 2; wv++) {
                const float *x = wv ? v : k;
                const uint8_t *pgs = wv ? kv->v[0] : kv->k[0];
                if ((wv ? dv : dk) == OSP_KV_DTYPE_FP8) {
                    for (int64_t i = 0; i < R; i++)
                        assert_int_equal(pgs[(size_t)slot * R + i], osp_fp32_to_e4m3(x[i] / (wv ? vs : ks)[i / D]));
                } else {
                    const uint8_t *scs = wv ? kv->v_scale[0] : kv->k_scale[0];
                    for (int64_t j = 0; j < R / 16; j++) {
                        uint8_t packed[8], s8;
                        osp_nvfp4_quantize16(x + 16 * j, (wv ? vs : ks)[0], packed, &s8);
                        assert_memory_equal(pgs + (size_t)slot * R / 2 + 8 * j, packed, 8);
                        assert_int_equal(scs[(size_t)slot * R / 16 + j], s8);
                    }
                }
            }
        }
        /* a padding row (slot -1) writes nothing */
        for (int i = 0; i < 4; i++)
            if (len[i]) memcpy(before[i], pages[i], len[i]);
        osp_cpu_kv_write_quant(&pg, kv->k[0], kv->v[0], kv->k_scale[0], kv->v_scale[0], k, v, -1, HK, D);
        for (int i = 0; i < 4; i++)
            if (len[i]) assert_memory_equal(before[i], pages[i], len[i]);
        for (int i = 0; i < 4; i++) free(before[i]);
        osp_kv_cache_free(kv);
        osp_backend_free(be);
    }
}

/* copy_block (copy-on-write) moves a block's scales with its data; sizes; bad inputs refused. */
static void test_cache_formats(void **state) {
    (void)state;
    osp_backend *be = cpu();
    const osp_kv_shape sh = {2, 3, 64};
    osp_kv_cache *kv;
    /* bytes per token: data + scales, per layer and K or V */
    osp_kv_page_format f;
    assert_int_equal(osp_kv_page_format_of(&sh, OSP_KV_DTYPE_FP8, &f), OSP_OK);
    assert_int_equal(f.bytes_per_token, 192), assert_int_equal(f.scale_bytes_per_token, 0);
    assert_int_equal(f.fixed_scales_per_layer, 3);
    assert_int_equal(osp_kv_page_format_of(&sh, OSP_KV_DTYPE_NVFP4, &f), OSP_OK);
    assert_int_equal(f.bytes_per_token, 96), assert_int_equal(f.scale_bytes_per_token, 12);
    assert_int_equal(f.fixed_scales_per_layer, 1);
    size_t bytes;
    assert_int_equal(osp_kv_cache_size(&sh, 3, 16, OSP_KV_DTYPE_NVFP4, OSP_KV_DTYPE_NVFP4, &bytes), OSP_OK);
    /* per layer: K, V pages of 3*16*96 = 4608 (256-aligned) and pools of 3*16*12 = 576 -> 768 */
    assert_int_equal(bytes, 2 * 2 * (4608 + 768));
    /* copy-on-write of a block carries its scales (layer 1, so the layer offsets are exercised too) */
    assert_int_equal(osp_kv_cache_create_on(be, &sh, 3, 16, OSP_KV_DTYPE_NVFP4, &kv), OSP_OK);
    assert_true(kv->k_fixed[0] == OSP_KV_NVFP4_DEFAULT_TENSOR_SCALE && kv->v_fixed[1] == OSP_KV_NVFP4_DEFAULT_TENSOR_SCALE);
    const osp_cpu_kv_pages pg = {.k_type = kv->k_fmt.elem_type, .v_type = kv->v_fmt.elem_type, .k_fixed = kv->k_fixed + 1,
                                 .v_fixed = kv->v_fixed + 1};
    float k[192], v[192];
    for (int32_t t = 0; t < 16; t++) {
        rand_row(k, 192, 2.0f), rand_row(v, 192, 1.0f);
        osp_cpu_kv_write_quant(&pg, kv->k[1], kv->v[1], kv->k_scale[1], kv->v_scale[1], k, v, 16 + t, 3, 64);
    }
    assert_int_equal(osp_kv_cache_copy_block(kv, 1, 2), OSP_OK);
    assert_memory_equal((uint8_t *)kv->k[1] + 2 * 16 * 96, (uint8_t *)kv->k[1] + 16 * 96, 16 * 96);
    assert_memory_equal((uint8_t *)kv->v[1] + 2 * 16 * 96, (uint8_t *)kv->v[1] + 16 * 96, 16 * 96);
    assert_memory_equal((uint8_t *)kv->k_scale[1] + 2 * 16 * 12, (uint8_t *)kv->k_scale[1] + 16 * 12, 16 * 12);
    assert_memory_equal((uint8_t *)kv->v_scale[1] + 2 * 16 * 12, (uint8_t *)kv->v_scale[1] + 16 * 12, 16 * 12);
    assert_int_equal(osp_kv_cache_bytes(kv), 2 * 2 * 3 * 16 * (96 + 12));
    osp_kv_cache_free(kv);
    /* fp8: per-head scales given or the default; none in a pool */
    const float ks[6] = {1, 2, 3, 4, 5, 6};
    assert_int_equal(osp_kv_cache_create_scaled(be, &sh, 2, 16, OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_FP8, ks, NULL, &kv), OSP_OK);
    assert_true(kv->k_fixed[5] == 6.0f && kv->v_fixed[5] == OSP_KV_FP8_DEFAULT_SCALE && kv->k_scale[0] == NULL);
    osp_kv_cache_free(kv);
    /* a split cache, K fp8 + V nvfp4: block bytes differ for K and V. Per layer: K pages 3*16*192 = 9216,
     * V pages 3*16*96 = 4608, no K pool, a V pool of 3*16*12 = 576 -> 768 */
    assert_int_equal(osp_kv_cache_size(&sh, 3, 16, OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_NVFP4, &bytes), OSP_OK);
    assert_int_equal(bytes, 2 * (9216 + 4608 + 768));
    assert_int_equal(osp_kv_cache_size(&sh, 3, 16, OSP_KV_DTYPE_NVFP4, OSP_KV_DTYPE_FP8, &bytes), OSP_OK);
    assert_int_equal(bytes, 2 * (4608 + 9216 + 768));
    assert_int_equal(osp_kv_cache_create_scaled(be, &sh, 3, 16, OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_NVFP4, ks, NULL, &kv),
                     OSP_OK);
    assert_int_equal(osp_kv_cache_dtype(kv), OSP_KV_DTYPE_FP8), assert_int_equal(osp_kv_cache_dtype_v(kv), OSP_KV_DTYPE_NVFP4);
    assert_int_equal(kv->bytes, 2 * (9216 + 4608 + 768));
    assert_int_equal(osp_kv_cache_bytes(kv), 2 * 3 * 16 * (192 + 96 + 12));
    /* K's fixed scales per head (fp8, given), V's one tensor scale per layer (nvfp4, the default) */
    assert_int_equal(kv->k_fmt.fixed_scales_per_layer, 3), assert_int_equal(kv->v_fmt.fixed_scales_per_layer, 1);
    assert_true(kv->k_fixed[5] == 6.0f && kv->v_fixed[1] == OSP_KV_NVFP4_DEFAULT_TENSOR_SCALE);
    assert_true(kv->k_scale[0] == NULL && kv->v_scale[0] != NULL && kv->v_scale[1] != NULL);
    /* the layers' regions do not overlap: layer 1 starts after layer 0's V pool */
    assert_true((char *)kv->k[1] >= (char *)kv->v_scale[0] + 768);
    {
        const osp_cpu_kv_pages sp = {.k_type = kv->k_fmt.elem_type, .v_type = kv->v_fmt.elem_type,
                                     .k_fixed = kv->k_fixed + 3, .v_fixed = kv->v_fixed + 1};
        for (int32_t t = 0; t < 16; t++) {
            rand_row(k, 192, 2.0f), rand_row(v, 192, 1.0f);
            osp_cpu_kv_write_quant(&sp, kv->k[1], kv->v[1], kv->k_scale[1], kv->v_scale[1], k, v, 16 + t, 3, 64);
        }
        assert_int_equal(osp_kv_cache_copy_block(kv, 1, 2), OSP_OK); /* K 16*192 bytes, V 16*96 + scales 16*12 */
        assert_memory_equal((uint8_t *)kv->k[1] + 2 * 16 * 192, (uint8_t *)kv->k[1] + 16 * 192, 16 * 192);
        assert_memory_equal((uint8_t *)kv->v[1] + 2 * 16 * 96, (uint8_t *)kv->v[1] + 16 * 96, 16 * 96);
        assert_memory_equal((uint8_t *)kv->v_scale[1] + 2 * 16 * 12, (uint8_t *)kv->v_scale[1] + 16 * 12, 16 * 12);
    }
    osp_kv_cache_free(kv);
    /* a split whose V side the shape cannot take: refused naming the split; bf16 on either side refused */
    const osp_kv_shape odd24 = {1, 2, 24};
    kv = (osp_kv_cache *)1;
    assert_int_equal(osp_kv_cache_create_scaled(be, &odd24, 2, 16, OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_NVFP4, NULL, NULL, &kv),
                     OSP_ERR_UNSUPPORTED);
    assert_null(kv);
    assert_non_null(strstr(osp_last_error(), "multiple of 16"));
    assert_non_null(strstr(osp_last_error(), "split cache: K fp8, V nvfp4"));
    assert_int_equal(osp_kv_cache_size(&odd24, 2, 16, OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_NVFP4, &bytes), OSP_ERR_UNSUPPORTED);
    assert_int_equal(bytes, 0);
    assert_int_equal(osp_kv_cache_create_scaled(be, &sh, 2, 16, OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_BF16, NULL, NULL, &kv),
                     OSP_ERR_UNSUPPORTED);
    assert_non_null(strstr(osp_last_error(), "bf16"));
    assert_int_equal(osp_kv_cache_create_scaled(be, &sh, 2, 16, (osp_kv_dtype)77, OSP_KV_DTYPE_FP8, NULL, NULL, &kv),
                     OSP_ERR_INVALID_ARG);
    /* a bad fixed scale of the V side (nvfp4: one per layer) is refused too */
    const float bad_v[2] = {0.5f, -1.0f};
    assert_int_equal(osp_kv_cache_create_scaled(be, &sh, 2, 16, OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_NVFP4, NULL, bad_v, &kv),
                     OSP_ERR_INVALID_ARG);
    assert_non_null(strstr(osp_last_error(), "V scale 1"));
    /* bad scales, shapes and dtypes: refused before anything is allocated */
    const float bad[3][6] = {{1, 1, 0, 1, 1, 1}, {1, -2, 1, 1, 1, 1}, {1, 1, 1, 1, 1, NAN}};
    for (int i = 0; i < 3; i++) {
        kv = (osp_kv_cache *)1;
        assert_int_equal(osp_kv_cache_create_scaled(be, &sh, 2, 16, OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_FP8, NULL, bad[i], &kv),
                         OSP_ERR_INVALID_ARG);
        assert_null(kv);
    }
    const osp_kv_shape odd = {1, 2, 24};
    assert_int_equal(osp_kv_cache_create_on(be, &odd, 2, 16, OSP_KV_DTYPE_NVFP4, &kv), OSP_ERR_UNSUPPORTED);
    assert_non_null(strstr(osp_last_error(), "multiple of 16"));
    assert_int_equal(osp_kv_cache_create_on(be, &odd, 2, 16, OSP_KV_DTYPE_FP8, &kv), OSP_OK); /* fp8 takes any */
    osp_kv_cache_free(kv);
    assert_int_equal(osp_kv_cache_create_on(be, &sh, 2, 16, OSP_KV_DTYPE_BF16, &kv), OSP_ERR_UNSUPPORTED);
    assert_non_null(strstr(osp_last_error(), "bf16"));
    osp_backend_free(be);
}

static void test_dtype_names(void **state) {
    (void)state;
    const struct { const char *s; osp_kv_dtype d; } ok[] = {
        {"auto", OSP_KV_DTYPE_F16}, {"f16", OSP_KV_DTYPE_F16},       {"fp16", OSP_KV_DTYPE_F16},
        {"f32", OSP_KV_DTYPE_F32},  {"bf16", OSP_KV_DTYPE_BF16},     {"bfloat16", OSP_KV_DTYPE_BF16},
        {"fp8", OSP_KV_DTYPE_FP8},  {"fp8_e4m3", OSP_KV_DTYPE_FP8},  {"nvfp4", OSP_KV_DTYPE_NVFP4},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        osp_kv_dtype d = (osp_kv_dtype)-1;
        assert_int_equal(osp_kv_dtype_parse(ok[i].s, &d), OSP_OK);
        assert_int_equal(d, ok[i].d);
    }
    const char *bad[] = {"", "FP8", "fp8_e5m2", "q4_0", "nvfp4 ", "fp4", NULL};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        osp_kv_dtype d = OSP_KV_DTYPE_F32;
        assert_int_equal(osp_kv_dtype_parse(bad[i], &d), OSP_ERR_INVALID_ARG);
        assert_int_equal(d, OSP_KV_DTYPE_F32);
    }
    assert_string_equal(osp_kv_dtype_name(OSP_KV_DTYPE_NVFP4), "nvfp4");
    assert_string_equal(osp_kv_dtype_name(OSP_KV_DTYPE_FP8), "fp8");
    assert_null(osp_kv_dtype_name((osp_kv_dtype)2));
    assert_true(osp_kv_dtype_quantized(OSP_KV_DTYPE_FP8) && osp_kv_dtype_quantized(OSP_KV_DTYPE_NVFP4));
    assert_false(osp_kv_dtype_quantized(OSP_KV_DTYPE_F16) || osp_kv_dtype_quantized(OSP_KV_DTYPE_F32));
    assert_int_equal(osp_kv_dtype_available(OSP_KV_DTYPE_BF16), OSP_ERR_UNSUPPORTED);
    assert_int_equal(osp_kv_dtype_available(OSP_KV_DTYPE_NVFP4), OSP_OK);
}

/* osp_cpu_dot's contract: 16 interleaved partial sums of rounded products, then the fixed tree
 * (acc[j] += acc[j + w], w = 8, 4, 2, 1) -- whichever path computes it (the AVX512 one for n % 16 == 0,
 * inlined in attention, or the loop). One product and one add per statement: no contraction. */
static void test_dot_contract(void **state) {
    (void)state;
    for (int trial = 0; trial < 300; trial++) {
        const int64_t n = 1 + (int64_t)(rnd() % 300);
        float a[300], b[300], acc[16] = {0};
        for (int64_t i = 0; i < n; i++) a[i] = urand() * 3.0f, b[i] = urand();
        for (int64_t i = 0; i < n; i++) {
            const float p = a[i] * b[i];
            acc[i % 16] = acc[i % 16] + p;
        }
        for (int w = 8; w > 0; w /= 2)
            for (int j = 0; j < w; j++) acc[j] = acc[j] + acc[j + w];
        const float d = osp_cpu_dot(a, b, n), di = osp_cpu_dot_inline(a, b, n);
        if (memcmp(&d, &acc[0], sizeof d) || memcmp(&di, &acc[0], sizeof d))
            fail_msg("n %lld: osp_cpu_dot %.9g, inline %.9g, contract %.9g", (long long)n, d, di, acc[0]);
    }
}

/* osp_cpu_hadamard against the explicit matrix H[i][j] = (-1)^popcount(i & j) / sqrt(n) (Sylvester's
 * order), and H H x = x; then which caches store K rotated: fp8 / nvfp4 with a power-of-two head_dim on
 * the CPU, never f16 / f32, never head_dim 48, never with OSPREY_KV_HADAMARD=0. */
static void test_hadamard(void **state) {
    (void)state;
    float x[256], y[256], ref[256];
    for (int64_t n = 1; n <= 256; n *= 2) {
        for (int64_t i = 0; i < n; i++) x[i] = (float)((i * 37 + 11) % 23) - 11.0f;
        memcpy(y, x, sizeof(float) * (size_t)n);
        osp_cpu_hadamard(y, 1, n);
        for (int64_t i = 0; i < n; i++) {
            double acc = 0;
            for (int64_t j = 0; j < n; j++) acc += (__builtin_popcountll((unsigned long long)(i & j)) & 1 ? -1.0 : 1.0) * x[j];
            ref[i] = (float)(acc / sqrt((double)n));
            assert_true(fabsf(y[i] - ref[i]) <= 1e-4f * (1.0f + fabsf(ref[i])));
        }
        osp_cpu_hadamard(y, 1, n);
        for (int64_t i = 0; i < n; i++) assert_true(fabsf(y[i] - x[i]) <= 1e-4f * (1.0f + fabsf(x[i])));
    }
    osp_backend *be = cpu();
    const struct { int32_t head_dim; osp_kv_dtype dt; bool rotated; } cases[] = {
        {64, OSP_KV_DTYPE_FP8, true}, {64, OSP_KV_DTYPE_NVFP4, true}, {128, OSP_KV_DTYPE_FP8, true},
        {64, OSP_KV_DTYPE_F16, false}, {64, OSP_KV_DTYPE_F32, false}, {48, OSP_KV_DTYPE_FP8, false},
        {48, OSP_KV_DTYPE_NVFP4, false}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const osp_kv_shape sh = {2, 2, cases[c].head_dim};
        osp_kv_cache *kv;
        assert_int_equal(osp_kv_cache_create_on(be, &sh, 2, 16, cases[c].dt, &kv), OSP_OK);
        assert_int_equal(kv->k_fmt.k_hadamard, cases[c].rotated);
        osp_kv_cache_free(kv);
    }
    /* split caches: K's format decides (V is never rotated) */
    const struct { osp_kv_dtype k, v; bool rotated; } split[] = {
        {OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_NVFP4, true}, {OSP_KV_DTYPE_NVFP4, OSP_KV_DTYPE_FP8, true},
        {OSP_KV_DTYPE_F16, OSP_KV_DTYPE_NVFP4, false}, {OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_F16, true}};
    for (size_t c = 0; c < sizeof split / sizeof split[0]; c++) {
        const osp_kv_shape sh = {2, 2, 64};
        osp_kv_cache *kv;
        assert_int_equal(osp_kv_cache_create_scaled(be, &sh, 2, 16, split[c].k, split[c].v, NULL, NULL, &kv), OSP_OK);
        assert_int_equal(kv->k_fmt.k_hadamard, split[c].rotated);
        assert_false(kv->v_fmt.k_hadamard);
        osp_kv_cache_free(kv);
    }
    setenv("OSPREY_KV_HADAMARD", "0", 1);
    const osp_kv_shape sh = {2, 2, 64};
    osp_kv_cache *kv;
    assert_int_equal(osp_kv_cache_create_on(be, &sh, 2, 16, OSP_KV_DTYPE_FP8, &kv), OSP_OK);
    assert_false(kv->k_fmt.k_hadamard);
    osp_kv_cache_free(kv);
    unsetenv("OSPREY_KV_HADAMARD");
    osp_backend_free(be);
}

/* Where the rotation of fp8 K pages is undone does not matter beyond fp32 rounding: for the same E4M3
 * codes c = e4m3(H k), the score the pages give, (H q) . dec(c) (the shipped path: rope_kv_write rotates
 * q), and the score of undoing the rotation on the page side, q . (H dec(c)), differ by fp32 rounding
 * only, at least 1000x below the quantization's own error of the score (q . dec(c)-side vs q . k). Rows
 * with a few large channels, as post-RoPE K has. This is why the "page-side" simulation's perplexity
 * (15.6863) and the real pages' (15.7144) differ: not the rotation's side but which codes later layers
 * round to, after fp32-rounding-sized differences reach them (RESULTS.md, "the realization spread"). */
static void test_hadamard_side_fp32_only(void **state) {
    (void)state;
    for (int64_t n = 32; n <= 128; n *= 2) {
        double worst_ratio = 0, sum_side = 0, sum_quant = 0;
        for (int trial = 0; trial < 2000; trial++) {
            float q[128], k[128], hq[128], hk[128], deq[128], back[128];
            for (int64_t i = 0; i < n; i++) q[i] = urand() * 3.0f, k[i] = urand() * 2.0f;
            for (int64_t o = 0; o < 3; o++) { /* outlier channels, shared by q and k as RoPE'd heads have */
                const int64_t i = (int64_t)(rnd() % (uint32_t)(n / 3)) * 3 + o; /* three distinct channels */
                q[i] *= 12.0f, k[i] *= 20.0f;
            }
            memcpy(hq, q, sizeof(float) * (size_t)n), memcpy(hk, k, sizeof(float) * (size_t)n);
            osp_cpu_hadamard(hq, 1, n), osp_cpu_hadamard(hk, 1, n);
            for (int64_t i = 0; i < n; i++) deq[i] = osp_e4m3_to_fp32(osp_fp32_to_e4m3(hk[i]));
            memcpy(back, deq, sizeof(float) * (size_t)n);
            osp_cpu_hadamard(back, 1, n);
            const float s_pages = osp_cpu_dot(hq, deq, n), s_side = osp_cpu_dot(q, back, n), s_exact = osp_cpu_dot(q, k, n);
            double qq = 0, dd = 0;
            for (int64_t i = 0; i < n; i++) qq += (double)q[i] * q[i], dd += (double)deq[i] * deq[i];
            const double tol = 1e-5 * sqrt(qq * dd); /* log2(n) + n roundings of 2^-24, with room */
            const double side = fabs((double)s_pages - s_side);
            if (side > tol) fail_msg("n %lld trial %d: pages %.9g, page side %.9g", (long long)n, trial, s_pages, s_side);
            if (side / tol > worst_ratio) worst_ratio = side / tol;
            sum_side += side, sum_quant += fabs((double)s_side - s_exact);
        }
        if (!(sum_quant > 1000.0 * sum_side))
            fail_msg("n %lld: mean quantization error %.3g not >> mean side difference %.3g", (long long)n, sum_quant / 2000,
                     sum_side / 2000);
        print_message("hadamard side n %lld: side diff %.3g, quant err %.3g (mean), worst side/tol %.3f\n", (long long)n,
                      sum_side / 2000, sum_quant / 2000, worst_ratio);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dot_contract),
        cmocka_unit_test(test_attention_equals_dequantized),
        cmocka_unit_test(test_split_vs_f32_reference),
        cmocka_unit_test(test_decode_every_code),
        cmocka_unit_test(test_write_own_slot_only),
        cmocka_unit_test(test_cache_formats),
        cmocka_unit_test(test_hadamard),
        cmocka_unit_test(test_hadamard_side_fp32_only),
        cmocka_unit_test(test_dtype_names),
    };
    if (osp_threadpool_create(1, &g_pool) != OSP_OK) return 1;
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    osp_threadpool_free(g_pool);
    return rc;
}
