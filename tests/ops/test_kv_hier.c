/* QuantSpec's hierarchical INT8 KV pages, int8_hier (issue 14; core/dtype.c osp_int8h_*, the CPU write
 * and read in src/backend/cpu/kv_quant.c, the layout in src/kv/kv_cache.h):
 *   - a row's codes: the minimum and scale bracket every value (M <= min, M + 15 S >= max, S within one
 *     f16 step of the range / 15), the full value is within S/32 of the value written and the upper-only
 *     value within S/2 (plus fp32 rounding), a constant row decodes exactly, codes are packed value 2i
 *     low nibble / 2i + 1 high nibble (a hand-computed row);
 *   - the pages: a write touches only its own slot's bytes in the pages and in the lower-code pool, and
 *     the upper codes with S and M sit in the pages, the lower codes in the pool (a reader of the pages
 *     alone gets the 4-bit row);
 *   - attention over int8_hier pages (unsplit, and beside fp8 / f16 in a split cache) equals attention
 *     over their dequantized copy bit for bit, for the target's full view and for the draft's view
 *     (upper halves, each query's last R keys in full), R = 0, 3, and beyond the context. */
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
#include "test_rng.h"

static osp_threadpool *g_pool;

static osp_backend *cpu(void) {
    osp_backend_params bp = {.pool = g_pool};
    osp_backend *be;
    assert_int_equal(osp_backend_create(OSP_DEVICE_CPU, &bp, &be), OSP_OK);
    return be;
}

/* Row kinds: centred, all positive with an offset far from 0, one outlier, constant, tiny values. */
static void make_row(float *x, int64_t n, int kind) {
    for (int64_t i = 0; i < n; i++) {
        switch (kind % 5) {
        case 0: x[i] = 3.0f * frand(); break;
        case 1: x[i] = 100.0f + 0.5f * frand(); break;
        case 2: x[i] = i == 5 ? 40.0f : 0.7f * frand(); break;
        case 3: x[i] = -2.375f; break;
        default: x[i] = 1e-4f * frand(); break;
        }
    }
}

static void test_row_bounds(void **state) {
    (void)state;
    const int64_t ns[] = {2, 32, 64, 128};
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
        for (int kind = 0; kind < 50; kind++) {
            const int64_t n = ns[ni];
            float x[128], full[128], up[128];
            uint8_t u[64], l[64];
            uint16_t sm[2];
            make_row(x, n, kind);
            osp_int8h_quantize_row(x, n, u, l, sm);
            osp_int8h_dequantize_row(u, l, sm, full, n);
            osp_int8h_dequantize_row(u, NULL, sm, up, n);
            const float S = osp_fp16_to_fp32(sm[0]), M = osp_fp16_to_fp32(sm[1]);
            float mn = x[0], mx = x[0];
            for (int64_t i = 1; i < n; i++) mn = fminf(mn, x[i]), mx = fmaxf(mx, x[i]);
            assert_true(M <= mn);
            assert_true(S >= 0.0f && M + 15.0f * S >= mx);
            /* M is one f16 step below min at most, S one f16 step above (max - M) / 15 at most */
            assert_true(mn - M <= fabsf(mn) / 1024.0f + 6.0e-8f);
            assert_true(S <= (mx - M) / 15.0f * (1.0f + 1.0f / 1024.0f) + 6.0e-8f);
            const float ulp = 4.0f * 1.2e-7f * (fabsf(M) + 16.0f * S); /* fp32 rounding of M + S32 * int */
            for (int64_t i = 0; i < n; i++) {
                if (fabsf(full[i] - x[i]) > S / 32.0f + ulp)
                    fail_msg("n %lld kind %d: x[%lld] %.9g full %.9g (S %.9g M %.9g)", (long long)n, kind,
                             (long long)i, (double)x[i], (double)full[i], (double)S, (double)M);
                if (fabsf(up[i] - x[i]) > S / 2.0f + ulp)
                    fail_msg("n %lld kind %d: x[%lld] %.9g upper %.9g (S %.9g)", (long long)n, kind, (long long)i,
                             (double)x[i], (double)up[i], (double)S);
            }
            if (kind % 5 == 3) /* constant: S = 0, exact both ways */
                for (int64_t i = 0; i < n; i++) assert_true(S == 0.0f && full[i] == x[i] && up[i] == x[i]);
        }
}

/* {0, 1, 2, 15, 7.25, 7.75}: M = 0, S = 1 exactly; upper codes 0, 1, 2, 15, 7, 8; residuals 0, 0, 0, 0,
 * 0.25, -0.25 give lower codes rint(7.5) = 8 (ties to even), 8, 8, 8, rint(11.5) = 12, rint(3.5) = 4; every
 * full value lands S/32 above x here (the 16 residual steps sit at +-0.5, +-1.5, ... times S/16). */
static void test_row_codes(void **state) {
    (void)state;
    const float x[6] = {0.0f, 1.0f, 2.0f, 15.0f, 7.25f, 7.75f};
    uint8_t u[3], l[3];
    uint16_t sm[2];
    osp_int8h_quantize_row(x, 6, u, l, sm);
    assert_int_equal(sm[0], osp_fp32_to_fp16(1.0f));
    assert_int_equal(sm[1], osp_fp32_to_fp16(0.0f));
    assert_int_equal(u[0], 0x10), assert_int_equal(u[1], 0xF2), assert_int_equal(u[2], 0x87);
    assert_int_equal(l[0], 0x88), assert_int_equal(l[1], 0x88), assert_int_equal(l[2], 0x4C);
    float y[6];
    osp_int8h_dequantize_row(u, l, sm, y, 6);
    const float want[6] = {1.0f / 32, 1.0f + 1.0f / 32, 2.0f + 1.0f / 32, 15.0f + 1.0f / 32, 7.25f + 1.0f / 32,
                           7.75f + 1.0f / 32}; /* l = 4: -3.5 / 16, so 8 - 7/32 */
    for (int i = 0; i < 6; i++) assert_true(y[i] == want[i]);
}

/* Pages and the lower pool poisoned, one token written: only its slot's bytes change; the pages hold
 * per KV head the upper codes then S and M, the pool the lower codes (the row functions' bytes). */
static void test_write_layout(void **state) {
    (void)state;
    const int32_t HK = 3, D = 64, BS = 16, NB = 2;
    osp_backend *be = cpu();
    osp_kv_cache *kv;
    const osp_kv_shape sh = {1, HK, D};
    assert_int_equal(osp_kv_cache_create_on(be, &sh, NB, BS, OSP_KV_DTYPE_INT8_HIER, &kv), OSP_OK);
    const size_t rb = D / 2 + 4;
    assert_int_equal(kv->k_fmt.bytes_per_token, HK * rb);
    assert_int_equal(kv->k_fmt.scale_bytes_per_token, HK * D / 2);
    assert_int_equal(kv->k_fmt.fixed_scales_per_layer, 0);
    assert_true(kv->k_fixed == NULL && kv->v_fixed == NULL && kv->k_scale[0] && kv->v_scale[0]);
    assert_true(kv->k_fmt.k_hadamard); /* rotated like the other quantized K pages (D a power of two) */
    const size_t len[2] = {(size_t)NB * BS * HK * rb, (size_t)NB * BS * HK * D / 2};
    uint8_t *pools[4] = {kv->k[0], kv->v[0], kv->k_scale[0], kv->v_scale[0]};
    for (int i = 0; i < 4; i++) memset(pools[i], 0xA5, len[i / 2]);
    float k[192], v[192];
    for (int i = 0; i < 192; i++) k[i] = 2.0f * frand(), v[i] = 0.5f * frand();
    const osp_cpu_kv_pages pg = {.k_type = OSP_KV_DTYPE_INT8_HIER, .v_type = OSP_KV_DTYPE_INT8_HIER};
    const int32_t slot = 21;
    osp_cpu_kv_write_quant(&pg, kv->k[0], kv->v[0], kv->k_scale[0], kv->v_scale[0], k, v, slot, HK, D);
    osp_cpu_kv_write_quant(&pg, kv->k[0], kv->v[0], kv->k_scale[0], kv->v_scale[0], k, v, -1, HK, D); /* padding */
    for (int w = 0; w < 2; w++) {
        const uint8_t *page = pools[w], *low = pools[2 + w];
        for (size_t b = 0; b < len[0]; b++)
            if (b / (HK * rb) != (size_t)slot && page[b] != 0xA5) fail_msg("page byte %zu of slot %zu written", b, b / (HK * rb));
        for (size_t b = 0; b < len[1]; b++)
            if (b / (HK * D / 2) != (size_t)slot && low[b] != 0xA5) fail_msg("pool byte %zu written", b);
        for (int h = 0; h < HK; h++) {
            uint8_t u[32], l[32];
            uint16_t sm[2], got[2];
            osp_int8h_quantize_row((w ? v : k) + h * D, D, u, l, sm);
            const uint8_t *row = page + ((size_t)slot * HK + (size_t)h) * rb;
            assert_memory_equal(row, u, 32);
            memcpy(got, row + 32, sizeof got);
            assert_int_equal(got[0], sm[0]), assert_int_equal(got[1], sm[1]);
            assert_memory_equal(low + ((size_t)slot * HK + (size_t)h) * (D / 2), l, 32);
        }
    }
    osp_kv_cache_free(kv);
    osp_backend_free(be);
}

typedef struct hcase {
    int32_t D, H, HK, window, block_size, n_seq;
    int32_t ctx[3], nq[3];
} hcase;

/* Writes every position of every sequence (K of dk, V of dv, at least one int8_hier), then runs
 * attention over the pages in the view (upper_only, recent) and over an f32 copy of the values that view
 * reads. With upper_only the copy differs per query (which keys are recent), so such cases have one
 * query a sequence (drafts are decodes) and the copy is made per sequence. */
static void run_case(const hcase *c, osp_kv_dtype dk, osp_kv_dtype dv, bool upper_only, int32_t recent) {
    const int32_t D = c->D, H = c->H, HK = c->HK, BS = c->block_size;
    const int64_t R = (int64_t)HK * D;
    int32_t max_blocks = 0, NB = 0, T = 0;
    for (int s = 0; s < c->n_seq; s++) {
        const int32_t nb = (c->ctx[s] + BS - 1) / BS;
        max_blocks = nb > max_blocks ? nb : max_blocks, NB += nb, T += c->nq[s];
        if (upper_only) assert_int_equal(c->nq[s], 1);
    }
    int32_t *bt = calloc((size_t)(c->n_seq * max_blocks), sizeof *bt);
    for (int s = 0, k = 0; s < c->n_seq; s++) /* blocks in reverse order */
        for (int32_t b = 0; b < (c->ctx[s] + BS - 1) / BS; b++) bt[s * max_blocks + b] = NB - 1 - k++;
    osp_backend *be = cpu();
    osp_kv_cache *kv;
    const osp_kv_shape sh = {1, HK, D};
    const float fx[8] = {0.5f, 1.0f, 2.0f, 4.0f, 0.5f, 1.0f, 2.0f, 4.0f};
    assert_int_equal(osp_kv_cache_create_scaled(be, &sh, NB, BS, dk, dv, fx, fx, &kv), OSP_OK);
    osp_cpu_kv_pages pg = {.k_type = kv->k_fmt.elem_type, .v_type = kv->v_fmt.elem_type, .k = kv->k[0], .v = kv->v[0],
                           .k_scale = kv->k_scale[0], .v_scale = kv->v_scale[0], .k_fixed = kv->k_fixed,
                           .v_fixed = kv->v_fixed, .hier_upper_only = upper_only, .hier_full_recent = recent};
    const size_t slots = (size_t)NB * (size_t)BS;
    float *kf[2] = {calloc(slots * (size_t)R, sizeof(float)), calloc(slots * (size_t)R, sizeof(float))}; /* full */
    float *vf[2] = {calloc(slots * (size_t)R, sizeof(float)), calloc(slots * (size_t)R, sizeof(float))}; /* upper */
    float krow[1024], vrow[1024];
    for (int s = 0; s < c->n_seq; s++)
        for (int32_t p = 0; p < c->ctx[s]; p++) {
            for (int64_t i = 0; i < R; i++) krow[i] = 2.0f * frand() + (i % 7 == 0 ? 3.0f : 0.0f), vrow[i] = 0.5f * frand();
            const int32_t slot = bt[s * max_blocks + p / BS] * BS + p % BS;
            osp_cpu_kv_write_quant(&pg, kv->k[0], kv->v[0], kv->k_scale[0], kv->v_scale[0], krow, vrow, slot, HK, D);
            /* the values each view reads, by the row decoders of core/dtype.c (f16 / fp8 sides likewise) */
            for (int w = 0; w < 2; w++) {
                const osp_kv_page_format *f = w ? &kv->v_fmt : &kv->k_fmt;
                const uint8_t *page = w ? kv->v[0] : kv->k[0], *low = w ? kv->v_scale[0] : kv->k_scale[0];
                for (int view = 0; view < 2; view++) {
                    float *dst = (w ? vf : kf)[view] + (size_t)slot * (size_t)R;
                    for (int32_t h = 0; h < HK; h++) {
                        if (f->dtype == OSP_KV_DTYPE_INT8_HIER) {
                            const uint8_t *row = page + ((size_t)slot * HK + (size_t)h) * (size_t)(D / 2 + 4);
                            uint16_t sm[2];
                            memcpy(sm, row + D / 2, sizeof sm);
                            osp_int8h_dequantize_row(row, view ? NULL : low + ((size_t)slot * R + (size_t)h * D) / 2, sm,
                                                     dst + h * D, D);
                        } else if (f->dtype == OSP_KV_DTYPE_FP8) {
                            for (int32_t d = 0; d < D; d++)
                                dst[h * D + d] = osp_e4m3_to_fp32(page[(size_t)slot * R + h * D + d]) * fx[h];
                        } else { /* f16 */
                            const uint16_t *hp = (const uint16_t *)(const void *)page;
                            for (int32_t d = 0; d < D; d++) dst[h * D + d] = osp_fp16_to_fp32(hp[(size_t)slot * R + h * D + d]);
                        }
                    }
                }
            }
        }
    int32_t *pos = malloc(sizeof *pos * (size_t)T), qsl[4] = {0};
    for (int s = 0, t = 0; s < c->n_seq; s++) {
        for (int32_t i = 0; i < c->nq[s]; i++) pos[t++] = c->ctx[s] - c->nq[s] + i;
        qsl[s + 1] = t;
    }
    const int64_t items = (int64_t)T * H;
    float *q = malloc(sizeof *q * (size_t)(items * D)), *o = malloc(sizeof *o * (size_t)(items * D)),
          *o_ref = malloc(sizeof *o_ref * (size_t)(items * D));
    for (int64_t i = 0; i < items * D; i++) q[i] = frand();
    float *sc = malloc(sizeof *sc * OSP_CPU_ATTN_MAX_TILE * 4096);
    const float scale = 1.0f / sqrtf((float)D);
    osp_cpu_paged_attention_tiled(q, &pg, o, c->n_seq, qsl, pos, bt, max_blocks, BS, H, HK, D, scale, c->window, sc,
                                  4096, OSP_CPU_ATTN_MAX_TILE, 0, items);
    /* the reference: the full copy, or per sequence a copy mixing the views at its recent boundary */
    float *mk = malloc(sizeof *mk * slots * (size_t)R), *mv = malloc(sizeof *mv * slots * (size_t)R);
    for (int s = 0; s < c->n_seq; s++) {
        const int32_t n_ctx = c->ctx[s];
        for (int32_t p = 0; p < n_ctx; p++) {
            const size_t slot = (size_t)bt[s * max_blocks + p / BS] * BS + (size_t)(p % BS);
            const int view = upper_only && p < n_ctx - recent ? 1 : 0;
            memcpy(mk + slot * (size_t)R, kf[view] + slot * (size_t)R, sizeof(float) * (size_t)R);
            memcpy(mv + slot * (size_t)R, vf[view] + slot * (size_t)R, sizeof(float) * (size_t)R);
        }
        osp_cpu_paged_attention(q, mk, mv, OSP_DTYPE_F32, o_ref, c->n_seq, qsl, pos, bt, max_blocks, BS, H, HK, D,
                                scale, c->window, sc, (int64_t)qsl[s] * H, (int64_t)qsl[s + 1] * H);
    }
    for (int64_t i = 0; i < items * D; i++)
        if (memcmp(&o[i], &o_ref[i], sizeof(float)) != 0)
            fail_msg("K %s V %s D %d H %d/%d view %s recent %d: out[%lld] %.9g over the pages, %.9g over the copy",
                     osp_kv_dtype_name(dk), osp_kv_dtype_name(dv), D, H, HK, upper_only ? "upper" : "full", recent,
                     (long long)i, (double)o[i], (double)o_ref[i]);
    /* the draft's view really reads fewer bits: it differs from the full view somewhere */
    if (upper_only && recent < c->ctx[0]) {
        pg.hier_upper_only = false;
        float *o_full = malloc(sizeof *o_full * (size_t)(items * D));
        osp_cpu_paged_attention_tiled(q, &pg, o_full, c->n_seq, qsl, pos, bt, max_blocks, BS, H, HK, D, scale,
                                      c->window, sc, 4096, OSP_CPU_ATTN_MAX_TILE, 0, items);
        assert_true(memcmp(o_full, o, sizeof(float) * (size_t)(items * D)) != 0);
        free(o_full);
    }
    free(bt), free(kf[0]), free(kf[1]), free(vf[0]), free(vf[1]), free(pos), free(q), free(o), free(o_ref), free(sc);
    free(mk), free(mv);
    osp_kv_cache_free(kv);
    osp_backend_free(be);
}

static void test_attention_full_view(void **state) {
    (void)state;
    const hcase cases[] = {
        {.D = 64, .H = 9, .HK = 3, .block_size = 16, .n_seq = 3, .ctx = {70, 16, 33}, .nq = {1, 16, 4}},
        {.D = 128, .H = 8, .HK = 2, .block_size = 16, .n_seq = 2, .ctx = {129, 40}, .nq = {9, 40}},
        {.D = 32, .H = 4, .HK = 2, .window = 7, .block_size = 8, .n_seq = 1, .ctx = {50}, .nq = {50}},
        {.D = 2, .H = 2, .HK = 1, .block_size = 1, .n_seq = 1, .ctx = {12}, .nq = {3}}, /* one value pair a row */
    };
    const osp_kv_dtype pairs[][2] = {{OSP_KV_DTYPE_INT8_HIER, OSP_KV_DTYPE_INT8_HIER},
                                     {OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_INT8_HIER},
                                     {OSP_KV_DTYPE_INT8_HIER, OSP_KV_DTYPE_F16}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) run_case(&cases[i], pairs[p][0], pairs[p][1], false, 0);
}

static void test_attention_draft_view(void **state) {
    (void)state;
    const hcase cases[] = {
        {.D = 64, .H = 9, .HK = 3, .block_size = 16, .n_seq = 3, .ctx = {70, 16, 33}, .nq = {1, 1, 1}},
        {.D = 128, .H = 8, .HK = 2, .block_size = 16, .n_seq = 2, .ctx = {129, 5}, .nq = {1, 1}},
        {.D = 32, .H = 4, .HK = 4, .window = 9, .block_size = 4, .n_seq = 1, .ctx = {30}, .nq = {1}},
    };
    const int32_t recents[] = {0, 3, 1000};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (size_t r = 0; r < sizeof recents / sizeof recents[0]; r++) {
            run_case(&cases[i], OSP_KV_DTYPE_INT8_HIER, OSP_KV_DTYPE_INT8_HIER, true, recents[r]);
            run_case(&cases[i], OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_INT8_HIER, true, recents[r]);
        }
}

static void test_format_and_names(void **state) {
    (void)state;
    osp_kv_dtype d = OSP_KV_DTYPE_F32;
    assert_int_equal(osp_kv_dtype_parse("int8_hier", &d), OSP_OK);
    assert_int_equal(d, OSP_KV_DTYPE_INT8_HIER);
    assert_string_equal(osp_kv_dtype_name(OSP_KV_DTYPE_INT8_HIER), "int8_hier");
    assert_true(osp_kv_dtype_quantized(OSP_KV_DTYPE_INT8_HIER));
    osp_kv_page_format f;
    const osp_kv_shape odd = {2, 2, 63}, big = {2, 2, 2048}, ok = {2, 3, 64};
    assert_int_equal(osp_kv_page_format_of(&odd, OSP_KV_DTYPE_INT8_HIER, &f), OSP_ERR_UNSUPPORTED);
    assert_int_equal(osp_kv_page_format_of(&big, OSP_KV_DTYPE_INT8_HIER, &f), OSP_ERR_UNSUPPORTED);
    assert_int_equal(osp_kv_page_format_of(&ok, OSP_KV_DTYPE_INT8_HIER, &f), OSP_OK);
    /* 68 bytes per token and head (f16: 128): the draft reads 36 of them */
    size_t bytes = 0;
    assert_int_equal(osp_kv_cache_size(&ok, 4, 16, OSP_KV_DTYPE_INT8_HIER, OSP_KV_DTYPE_INT8_HIER, &bytes), OSP_OK);
    assert_int_equal(bytes, 2 * 2 * (((size_t)4 * 16 * 3 * 36 + 255) / 256 * 256 + ((size_t)4 * 16 * 3 * 32 + 255) / 256 * 256));
    /* copy_block carries the lower codes with the pages */
    osp_backend *be = cpu();
    osp_kv_cache *kv;
    assert_int_equal(osp_kv_cache_create_on(be, &ok, 4, 16, OSP_KV_DTYPE_INT8_HIER, &kv), OSP_OK);
    const size_t pb = 16 * kv->k_fmt.bytes_per_token, lb = 16 * kv->k_fmt.scale_bytes_per_token;
    for (int32_t l = 0; l < 2; l++) {
        for (size_t i = 0; i < pb; i++) ((uint8_t *)kv->k[l])[pb + i] = (uint8_t)(i * 7 + l);
        for (size_t i = 0; i < lb; i++) ((uint8_t *)kv->v_scale[l])[lb + i] = (uint8_t)(i * 5 + l);
    }
    assert_int_equal(osp_kv_cache_copy_block(kv, 1, 3), OSP_OK);
    for (int32_t l = 0; l < 2; l++) {
        assert_memory_equal((uint8_t *)kv->k[l] + 3 * pb, (uint8_t *)kv->k[l] + pb, pb);
        assert_memory_equal((uint8_t *)kv->v_scale[l] + 3 * lb, (uint8_t *)kv->v_scale[l] + lb, lb);
    }
    osp_kv_cache_free(kv);
    osp_backend_free(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row_bounds),          cmocka_unit_test(test_row_codes),
        cmocka_unit_test(test_write_layout),        cmocka_unit_test(test_attention_full_view),
        cmocka_unit_test(test_attention_draft_view), cmocka_unit_test(test_format_and_names),
    };
    if (osp_threadpool_create(1, &g_pool) != OSP_OK) return 1;
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    osp_threadpool_free(g_pool);
    return rc;
}
