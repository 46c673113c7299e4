/* The DSA lightning indexer (src/sparse/dsa_indexer.c) against a plain full-score implementation:
 * every score of the causal range at once, one full sort under "score descending, position
 * ascending", the first k. Checked: the score formula against a double-precision evaluation of
 * sum_j w * ReLU(q . k); the tiled top-k equals the full sort exactly (ties included: small-integer
 * inputs make many), on a variable-length batch with scattered pages, at the causal boundary (no index
 * after the query; a context of k or fewer tokens comes back whole), with fp32 and FP8 index keys
 * (the FP8 reference reads the dequantized keys), and once at DeepSeek-V3.2's shapes (64 heads of 128,
 * k = 2048) around the k boundary; and the selection through the work table into block-sparse attention
 * equals a softmax over exactly the selected positions. */
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
#include "sparse/dsa_indexer.h"
#include "sparse/sparse_attention.h"
#include "sparse/worktable.h"

static uint64_t g_rng = 4242;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}

typedef struct pr {
    float s;
    int32_t p;
} pr;

static int cmp_ref(const void *a, const void *b) {
    const pr x = *(const pr *)a, y = *(const pr *)b;
    const float xs = isnan(x.s) ? -INFINITY : x.s, ys = isnan(y.s) ? -INFINITY : y.s;
    if (xs != ys) return xs > ys ? -1 : 1;
    return (x.p > y.p) - (x.p < y.p);
}
static int cmp_int(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* the plain implementation over fp32 key pages */
static void reference(const osp_dsa_args *a, const float *kf, int32_t t, int32_t *idx, int32_t *n) {
    int32_t s = 0;
    while (t >= a->query_start_loc[s + 1]) s++;
    const int32_t p = a->positions[t], D = a->head_dim;
    pr *all = malloc(sizeof(pr) * (size_t)(p + 1));
    for (int32_t x = 0; x <= p; x++) {
        const int64_t slot = (int64_t)a->block_table[s * a->max_blocks_per_seq + x / a->block_size] * a->block_size +
                             x % a->block_size;
        all[x] = (pr){osp_dsa_score(a->q + (size_t)t * (size_t)a->n_heads * (size_t)D, a->w + (size_t)t * (size_t)a->n_heads,
                                    kf + slot * D, a->n_heads, D),
                      x};
    }
    qsort(all, (size_t)p + 1, sizeof *all, cmp_ref);
    *n = p + 1 < a->top_k ? p + 1 : a->top_k;
    for (int32_t i = 0; i < *n; i++) idx[i] = all[i].p;
    qsort(idx, (size_t)*n, sizeof *idx, cmp_int);
    free(all);
}

static void run(int32_t H, int32_t D, int32_t K, int32_t bs, const int32_t *ctx, const int32_t *qlen, int32_t nseq,
                bool fp8, bool ties) {
    int32_t qsl[8] = {0}, T = 0, maxb = 0;
    for (int s = 0; s < nseq; s++) {
        T += qlen[s];
        qsl[s + 1] = T;
        const int32_t nb = (ctx[s] + bs - 1) / bs;
        maxb = nb > maxb ? nb : maxb;
    }
    const int32_t nblk = maxb * nseq;
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)nblk), *pos = malloc(sizeof(int32_t) * (size_t)T);
    for (int i = 0; i < nblk; i++) bt[i] = i;
    for (int i = nblk - 1; i > 0; i--) { /* scattered pages */
        const int j = (int)(rnd() % (uint32_t)(i + 1));
        const int32_t x = bt[i];
        bt[i] = bt[j], bt[j] = x;
    }
    for (int s = 0, t = 0; s < nseq; s++)
        for (int i = 0; i < qlen[s]; i++) pos[t++] = ctx[s] - qlen[s] + i;
    const size_t nkey = (size_t)nblk * (size_t)bs;
    float *q = malloc(sizeof(float) * (size_t)T * (size_t)H * (size_t)D), *w = malloc(sizeof(float) * (size_t)T * (size_t)H);
    float *kf = calloc(nkey * (size_t)D, sizeof(float)), *scales = fp8 ? calloc(nkey, sizeof(float)) : NULL;
    uint8_t *k8 = fp8 ? calloc(nkey * (size_t)D, 1) : NULL;
    for (size_t i = 0; i < (size_t)T * (size_t)H * (size_t)D; i++)
        q[i] = ties ? (float)((int)(rnd() % 3) - 1) : (float)(rnd() % 2001) / 1000.0f - 1.0f;
    for (size_t i = 0; i < (size_t)T * (size_t)H; i++) w[i] = ties ? (float)(rnd() % 2) : (float)(rnd() % 1001) / 1000.0f;
    float krow[128];
    for (size_t slot = 0; slot < nkey; slot++) {
        for (int d = 0; d < D; d++) krow[d] = ties ? (float)((int)(rnd() % 3) - 1) : (float)(rnd() % 2001) / 1000.0f - 1.0f;
        if (fp8) {
            osp_dsa_key_write(k8, scales, (int64_t)slot, krow, D);
            for (int d = 0; d < D; d++) kf[slot * (size_t)D + (size_t)d] = osp_e4m3_to_fp32(k8[slot * (size_t)D + (size_t)d]) * scales[slot];
        } else osp_dsa_key_write(kf, NULL, (int64_t)slot, krow, D);
    }
    const osp_dsa_args a = {.q = q, .w = w, .k_pages = fp8 ? (const void *)k8 : (const void *)kf, .k_scales = scales,
                            .num_tokens = T, .num_seqs = nseq, .query_start_loc = qsl, .positions = pos,
                            .block_table = bt, .max_blocks_per_seq = maxb, .block_size = bs, .n_heads = H,
                            .head_dim = D, .top_k = K};
    osp_dsa_pair *ws = malloc(sizeof(osp_dsa_pair) * (size_t)osp_dsa_workspace_pairs(K, bs));
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)T * (size_t)K), *cnt = malloc(sizeof(int32_t) * (size_t)T);
    int32_t *want = malloc(sizeof(int32_t) * (size_t)K);
    /* in two halves, as threads would split it */
    assert_int_equal(osp_dsa_select(&a, 0, T / 2, ws, idx, NULL, cnt), OSP_OK);
    assert_int_equal(osp_dsa_select(&a, T / 2, T, ws, idx, NULL, cnt), OSP_OK);
    for (int32_t t = 0; t < T; t++) {
        int32_t n;
        reference(&a, kf, t, want, &n);
        assert_int_equal(cnt[t], n);
        for (int32_t i = 0; i < n; i++) {
            if (idx[(size_t)t * (size_t)K + (size_t)i] != want[i])
                fail_msg("H %d D %d k %d fp8 %d ties %d: token %d entry %d: %d, want %d", H, D, K, fp8, ties, t, i,
                         idx[(size_t)t * (size_t)K + (size_t)i], want[i]);
            assert_true(want[i] <= pos[t]); /* causal */
        }
        for (int32_t i = n; i < K; i++) assert_int_equal(idx[(size_t)t * (size_t)K + (size_t)i], -1);
    }
    free(bt), free(pos), free(q), free(w), free(kf), free(scales), free(k8), free(ws), free(idx), free(cnt), free(want);
}

static void test_score_formula(void **state) {
    (void)state;
    enum { H = 5, D = 24 };
    float q[H * D], w[H], k[D];
    for (int it = 0; it < 100; it++) {
        for (int i = 0; i < H * D; i++) q[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
        for (int i = 0; i < H; i++) w[i] = (float)(rnd() % 1001) / 500.0f - 1.0f;
        for (int i = 0; i < D; i++) k[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
        double want = 0;
        for (int j = 0; j < H; j++) {
            double d = 0;
            for (int i = 0; i < D; i++) d += (double)q[j * D + i] * k[i];
            want += w[j] * (d > 0 ? d : 0);
        }
        assert_true(fabs(osp_dsa_score(q, w, k, H, D) - want) <= 1e-5 * (1 + fabs(want)));
    }
}

static void test_topk_small(void **state) {
    (void)state;
    const int32_t ctx[3] = {53, 7, 40}, qlen[3] = {20, 7, 1}; /* a prefill chunk, a whole prompt, a decode */
    for (int f = 0; f < 2; f++)
        for (int ties = 0; ties < 2; ties++)
            for (int k = 0; k < 4; k++) {
                const int32_t K = (int32_t[]){1, 5, 16, 64}[k];
                run(4, 16, K, 8, ctx, qlen, 3, f != 0, ties != 0);
                run(3, 8, K, 3, ctx, qlen, 3, f != 0, ties != 0); /* tiles smaller than k and odd */
            }
}

static void test_topk_deepseek_shape(void **state) {
    (void)state;
    /* positions 2046, 2047 (context == k: whole), 2048 (k + 1) and 2599 */
    const int32_t ctx[2] = {2049, 2600}, qlen[2] = {3, 1};
    run(64, 128, 2048, 64, ctx, qlen, 2, true, false);
}

/* The indexer's top-k tokens to the work table to block-sparse attention: equal (fp32 rounding) to a
 * softmax over exactly the selected positions, for a prefill chunk and a decode of two sequences with
 * GQA (every KV head's row gets the token's list). */
static void test_pipeline(void **state) {
    (void)state;
    enum { BS = 8, H = 4, HK = 2, D = 16, HI = 3, DI = 8, K = 12, MAXB = 8, NB = 16 };
    int32_t qsl[3] = {0, 10, 11}, sl[2] = {50, 37}, pos[11], bt[2 * MAXB];
    for (int i = 0; i < 10; i++) pos[i] = 40 + i;
    pos[10] = 36;
    for (int i = 0; i < 2 * MAXB; i++) bt[i] = (i * 5 + 3) % NB;
    static float k[NB * BS * HK * D], v[NB * BS * HK * D], ik[NB * BS * DI], q[11 * H * D], qi[11 * HI * DI], w[11 * HI];
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) k[i] = (float)(rnd() % 2001) / 500.0f - 2.0f, v[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
    for (size_t i = 0; i < sizeof ik / sizeof *ik; i++) ik[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
    for (size_t i = 0; i < sizeof q / sizeof *q; i++) q[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
    for (size_t i = 0; i < sizeof qi / sizeof *qi; i++) qi[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
    for (size_t i = 0; i < sizeof w / sizeof *w; i++) w[i] = (float)(rnd() % 1001) / 1000.0f;
    const osp_dsa_args a = {.q = qi, .w = w, .k_pages = ik, .num_tokens = 11, .num_seqs = 2, .query_start_loc = qsl,
                            .positions = pos, .block_table = bt, .max_blocks_per_seq = MAXB, .block_size = BS,
                            .n_heads = HI, .head_dim = DI, .top_k = K};
    osp_dsa_pair ws[3 * K + BS];
    int32_t idx[11 * K], cnt[11];
    assert_int_equal(osp_dsa_select(&a, 0, 11, ws, idx, NULL, cnt), OSP_OK);
    int32_t ci[11 * HK + 1], cand[11 * HK * K], n = 0;
    ci[0] = 0;
    for (int t = 0; t < 11; t++)
        for (int g = 0; g < HK; g++) {
            for (int i = 0; i < cnt[t]; i++) cand[n++] = idx[t * K + i];
            ci[t * HK + g + 1] = n;
        }
    const osp_sparse_layout L = {.num_tokens = 11, .positions = pos, .num_seqs = 2, .query_start_loc = qsl,
                                 .seq_lens = sl, .block_table = bt, .max_blocks_per_seq = MAXB, .block_size = BS,
                                 .n_head = H, .n_head_kv = HK, .share = OSP_SPARSE_PER_KV_HEAD, .q_tile = 1};
    const osp_sparse_cands C = {ci, cand};
    osp_sparse_wt wt = {0};
    assert_int_equal(osp_sparse_wt_build(&wt, &L, &C, NULL, D * 4), OSP_OK);
    assert_int_equal(wt.stats.logical_candidates, 11 * HK * K);
    assert_int_equal(wt.stats.dropped, 0);
    const osp_cpu_kv_pages pg = {.k_type = OSP_DTYPE_F32, .v_type = OSP_DTYPE_F32, .k = k, .v = v};
    static float out[11 * H * D];
    const osp_sparse_attn_args sa = {.q = q, .out = out, .kv = &pg, .L = &L, .wt = &wt, .head_dim = D, .scale = 0.25f};
    assert_int_equal(osp_sparse_attention_check(&sa), OSP_OK);
    osp_sparse_attention_cpu(&sa, 0, 11 * H);
    for (int t = 0; t < 11; t++) {
        const int s = t < 10 ? 0 : 1;
        for (int h = 0; h < H; h++) {
            const int kvh = h / (H / HK);
            double sc[K], mx = -INFINITY, l = 0, acc[D] = {0};
            for (int i = 0; i < K; i++) {
                const int p = idx[t * K + i];
                const float *kk = k + (((size_t)bt[s * MAXB + p / BS] * BS + (size_t)(p % BS)) * HK + (size_t)kvh) * D;
                double d = 0;
                for (int j = 0; j < D; j++) d += (double)q[(t * H + h) * D + j] * kk[j];
                sc[i] = d * 0.25;
                mx = sc[i] > mx ? sc[i] : mx;
            }
            for (int i = 0; i < K; i++) {
                const int p = idx[t * K + i];
                const float *vv = v + (((size_t)bt[s * MAXB + p / BS] * BS + (size_t)(p % BS)) * HK + (size_t)kvh) * D;
                const double e = exp(sc[i] - mx);
                l += e;
                for (int j = 0; j < D; j++) acc[j] += e * vv[j];
            }
            for (int j = 0; j < D; j++) {
                const double want = acc[j] / l, got = out[(t * H + h) * D + j];
                if (fabs(got - want) > 2e-5 + 2e-5 * fabs(want)) fail_msg("token %d head %d: %g vs %g", t, h, got, want);
            }
        }
    }
    osp_sparse_wt_free(&wt);
}

static void test_bad_args(void **state) {
    (void)state;
    const osp_dsa_args a = {0};
    osp_dsa_pair ws[4];
    int32_t idx[4], cnt[1];
    assert_int_equal(osp_dsa_select(&a, 0, 1, ws, idx, NULL, cnt), OSP_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_score_formula),
        cmocka_unit_test(test_topk_small),
        cmocka_unit_test(test_topk_deepseek_shape),
        cmocka_unit_test(test_pipeline),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
