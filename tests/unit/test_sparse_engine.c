/* Sparse attention on the CPU engine path (--sparse-attention, src/sparse/engine_hook.c) and its
 * parts (osprey/sparse.h's parser, src/sparse/quest.c):
 *   - the parser takes topk:PAGES[,recent:R][,sink:S] and off, and refuses, with a message, unknown
 *     methods and keys, signs, spaces, leading zeros, overflow, repeated keys, a zero budget and
 *     recent + sink above the budget;
 *   - Quest's bound is an upper bound of q.k over every key of the page; the selector keeps the sink and
 *     recent pages, fills the rest by descending bound with ties to the lower page, and is dense when
 *     the budget covers the context;
 *   - a budget covering the whole context gives exactly the dense tokens (SmolLM2 and a tiny model),
 *     with the hook counting every (token, layer) pair as dense;
 *   - at small budgets the engine reads fewer tiles than dense and the agreement with dense is printed;
 *     on the tiny model it stays batch-invariant (requests together give the tokens each gives alone)
 *     and token-budget-invariant (chunked prefill). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine_jobs.h"

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "osprey/engine.h"
#include "osprey/sparse.h"
#include "sparse/engine_hook.h"
#include "sparse/quest.h"
#include "sparse/sparse_attention.h"

/* ---- the parser --------------------------------------------------------------------------------- */

static void test_parse(void **state) {
    (void)state;
    osp_sparse_config c = osp_sparse_default_config();
    assert_int_equal(osp_sparse_config_parse("topk:64", &c), OSP_OK);
    assert_int_equal(c.method, OSP_SPARSE_TOPK);
    assert_int_equal(c.topk_pages, 64);
    assert_int_equal(c.recent_pages, 1);
    assert_int_equal(c.sink_pages, 0);
    assert_int_equal(osp_sparse_config_parse("topk:16,sink:2,recent:4", &c), OSP_OK);
    assert_int_equal(c.topk_pages, 16);
    assert_int_equal(c.recent_pages, 4);
    assert_int_equal(c.sink_pages, 2);
    char buf[64];
    osp_sparse_config_format(&c, buf, sizeof buf);
    assert_string_equal(buf, "topk:16,recent:4,sink:2");
    osp_sparse_config d;
    assert_int_equal(osp_sparse_config_parse(buf, &d), OSP_OK);
    assert_memory_equal(&c, &d, sizeof c);
    assert_int_equal(osp_sparse_config_parse("topk:1,recent:0", &c), OSP_OK);
    assert_int_equal(osp_sparse_config_parse("off", &c), OSP_OK);
    assert_int_equal(c.method, OSP_SPARSE_NONE);
    const char *bad[] = {"",           "topk",          "topk:",         "topk:0",        "topk:-3",
                         "topk:+3",    "topk: 3",       "topk:3 ",       "topk:03",       "topk:3,",
                         "topk:3,,",   "topk:3,recent", "topk:3,recent:", "topk:3,recent:x", "topk:3,foo:1",
                         "topk:3,recent:1,recent:1", "topk:3,sink:1,sink:1", "topk:2,recent:2,sink:1",
                         "topk:99999999999999999999", "TOPK:3", "quest:3", "offf", "topk:3;sink:1",
                         "topk:1048577"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        c = (osp_sparse_config){.method = OSP_SPARSE_TOPK, .topk_pages = 77};
        if (osp_sparse_config_parse(bad[i], &c) != OSP_ERR_INVALID_ARG) fail_msg("'%s' was accepted", bad[i]);
        assert_true(osp_last_error()[0] != 0);
        assert_int_equal(c.topk_pages, 77); /* untouched */
    }
    assert_int_equal(osp_sparse_config_parse(NULL, &c), OSP_ERR_INVALID_ARG);
}

/* ---- Quest ------------------------------------------------------------------------------------------ */

static uint64_t g_rng = 99;
static float frand(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 11) % 20001) / 10000.0f - 1.0f;
}

static void test_quest(void **state) {
    (void)state;
    enum { BS = 4, NB = 12, HK = 2, D = 8 };
    float k[NB * BS * HK * D], v[NB * BS * HK * D];
    for (int i = 0; i < NB * BS * HK * D; i++) k[i] = 3.0f * frand(), v[i] = 0;
    const osp_cpu_kv_pages kv = {.k_type = 0 /* f32 */, .v_type = 0 /* f32 */, .k = k, .v = v};
    osp_quest_summaries qs;
    assert_int_equal(osp_quest_create(1, NB, BS, HK, D, &qs), OSP_OK);
    for (int b = 0; b < NB; b++) osp_quest_summarize_block(&qs, 0, &kv, b, b == NB - 1 ? 2 : BS);
    /* the bound holds for every key of every page */
    for (int it = 0; it < 200; it++) {
        float q[D];
        for (int d = 0; d < D; d++) q[d] = frand();
        for (int b = 0; b < NB; b++)
            for (int h = 0; h < HK; h++) {
                const size_t off = ((size_t)b * HK + (size_t)h) * D;
                const float u = osp_quest_upper_bound(q, qs.kmin + off, qs.kmax + off, D);
                for (int i = 0; i < (b == NB - 1 ? 2 : BS); i++) {
                    float dot = 0;
                    for (int d = 0; d < D; d++) dot += q[d] * k[((b * BS + i) * HK + h) * D + d];
                    assert_true(dot <= u + 1e-4f);
                }
            }
    }
    /* selection over a shuffled block table: sinks, recent, then by bound */
    int32_t bt[NB];
    for (int j = 0; j < NB; j++) bt[j] = (j * 5) % NB;
    float q[2 * D];
    for (int d = 0; d < 2 * D; d++) q[d] = frand();
    osp_quest_scored ws[NB];
    int32_t sel[NB];
    const int32_t p = NB * BS - 1; /* 12 context pages */
    osp_sparse_config cfg = {.method = OSP_SPARSE_TOPK, .topk_pages = 5, .recent_pages = 2, .sink_pages = 1};
    const int32_t n = osp_quest_select(&qs, 0, bt, p, q, 2, 1, &cfg, ws, sel);
    assert_int_equal(n, 5);
    /* expected: page 0, pages 10 and 11, and the 2 best of 1..9 by max over the 2 heads */
    float sc[NB];
    for (int j = 1; j <= 9; j++) {
        const size_t off = ((size_t)bt[j] * HK + 1) * D;
        const float a = osp_quest_upper_bound(q, qs.kmin + off, qs.kmax + off, D);
        const float b = osp_quest_upper_bound(q + D, qs.kmin + off, qs.kmax + off, D);
        sc[j] = a > b ? a : b;
    }
    int best1 = 1, best2 = -1;
    for (int j = 2; j <= 9; j++)
        if (sc[j] > sc[best1]) best1 = j;
    for (int j = 1; j <= 9; j++)
        if (j != best1 && (best2 < 0 || sc[j] > sc[best2])) best2 = j;
    int32_t want[5] = {0, best1, best2, 10, 11};
    if (want[1] > want[2]) want[1] = best2, want[2] = best1;
    for (int i = 0; i < 5; i++) assert_int_equal(sel[i], want[i]);
    /* ties go to the lower page: all-zero keys give equal bounds */
    memset(k, 0, sizeof k);
    for (int b = 0; b < NB; b++) osp_quest_summarize_block(&qs, 0, &kv, b, BS);
    cfg = (osp_sparse_config){.method = OSP_SPARSE_TOPK, .topk_pages = 3, .recent_pages = 0, .sink_pages = 0};
    assert_int_equal(osp_quest_select(&qs, 0, bt, p, q, 2, 0, &cfg, ws, sel), 3);
    for (int i = 0; i < 3; i++) assert_int_equal(sel[i], i);
    /* a budget covering the context: every page */
    cfg.topk_pages = 12;
    assert_int_equal(osp_quest_select(&qs, 0, bt, p, q, 2, 0, &cfg, ws, sel), 12);
    for (int i = 0; i < 12; i++) assert_int_equal(sel[i], i);
    osp_quest_free(&qs);
    assert_int_equal(osp_quest_create(0, NB, BS, HK, D, &qs), OSP_ERR_INVALID_ARG);
}

/* ---- the hook at the op level ------------------------------------------------------------------------ */

enum { HB = 8, HH = 4, HHK = 2, HD = 16, HNB = 24, HMAXB = 12 };

/* One layer's ATTENTION op through the hook, against the dense kernel / the selection it should make.
 * Two sequences of 70 and 33 tokens (pages scattered); step 1 is their whole prefill (every page
 * summarized), step 2 one decode token each whose K was written into its page (only that page is
 * re-summarized). */
static void test_hook_op(void **state) {
    (void)state;
    static float k[HNB * HB * HHK * HD], v[HNB * HB * HHK * HD];
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) k[i] = 2.0f * frand(), v[i] = frand();
    void *kl[1] = {k}, *vl[1] = {v}, *sl_[1] = {NULL};
    osp_kv_cache kv = {.num_blocks = HNB, .block_size = HB, .n_layer = 1, .k = kl, .v = vl, .k_scale = sl_, .v_scale = sl_};
    kv.k_fmt = (osp_kv_page_format){.dtype = OSP_KV_DTYPE_F32, .elem_type = OSP_DTYPE_F32, .kv_row = HHK * HD,
                                    .head_dim = HD, .bytes_per_token = HHK * HD * 4};
    kv.v_fmt = kv.k_fmt;
    int32_t bt[2 * HMAXB];
    for (int i = 0; i < 2 * HMAXB; i++) bt[i] = (i * 7) % HNB; /* 24 distinct blocks, scattered */
    const int32_t len[2] = {70, 33};
    /* step 1: the whole prefill */
    int32_t pos[103], slot[103], qsl[3] = {0, 70, 103}, seql[2] = {70, 33};
    for (int s = 0, t = 0; s < 2; s++)
        for (int p = 0; p < len[s]; p++, t++) pos[t] = p, slot[t] = bt[s * HMAXB + p / HB] * HB + p % HB;
    osp_batch b1 = {.num_tokens = 103, .positions = pos, .slot_mapping = slot, .num_seqs = 2, .query_start_loc = qsl,
                    .seq_lens = seql, .block_table = bt, .max_blocks_per_seq = HMAXB};
    static float q[103 * HH * HD], out[103 * HH * HD], ref[103 * HH * HD], sc[2 * 128];
    for (size_t i = 0; i < sizeof q / sizeof *q; i++) q[i] = 2.0f * frand();
    const osp_cpu_kv_pages pg = {.k_type = OSP_DTYPE_F32, .v_type = OSP_DTYPE_F32, .k = k, .v = v};
    for (int w = 0; w < 3; w++) {
        /* w 0: sliding window 5 (BlockMask); 1: a budget covering the context (dense); 2: Quest top-k */
        osp_op op = {.kind = OSP_OP_ATTENTION, .layer = 0, .p.attn = {HH, HHK, HD, w == 0 ? 5 : 0, 0.25f}};
        osp_sparse_config cfg;
        assert_int_equal(osp_sparse_config_parse(w == 2 ? "topk:3,recent:0,sink:0" : "topk:9", &cfg), OSP_OK);
        osp_sparse_runtime *rt;
        assert_int_equal(osp_sparse_runtime_create(&cfg, &kv, &rt), OSP_OK);
        const osp_attn_hook *hk = osp_sparse_runtime_hook(rt);
        osp_attn_call c = {.op = &op, .b = &b1, .kv = &kv, .q = q, .out = out, .n_threads = 2};
        assert_int_equal(hk->prepare(hk->ctx, &c), OSP_OK);
        hk->run(hk->ctx, &c, 0, 0, 200);
        hk->run(hk->ctx, &c, 1, 200, 103 * HH);
        osp_cpu_paged_attention_kv(q, &pg, ref, 2, qsl, pos, bt, HMAXB, HB, HH, HHK, HD, 0.25f, op.p.attn.window, sc, 0,
                                   103 * HH);
        if (w == 1) assert_memory_equal(out, ref, sizeof(float) * 103 * HH * HD); /* dense, bit for bit */
        if (w == 0)
            for (int i = 0; i < 103 * HH * HD; i++) assert_true(fabsf(out[i] - ref[i]) <= 2e-5f + 2e-5f * fabsf(ref[i]));
        /* step 2: one decode token per sequence at positions 69 and 32, K rows rewritten in place */
        int32_t pos2[2] = {69, 32}, slot2[2], qsl2[3] = {0, 1, 2};
        for (int s = 0; s < 2; s++) {
            slot2[s] = bt[s * HMAXB + pos2[s] / HB] * HB + pos2[s] % HB;
            for (int i = 0; i < HHK * HD; i++) k[(size_t)slot2[s] * HHK * HD + (size_t)i] = 3.0f * frand();
        }
        osp_batch b2 = {.num_tokens = 2, .positions = pos2, .slot_mapping = slot2, .num_seqs = 2, .query_start_loc = qsl2,
                        .seq_lens = seql, .block_table = bt, .max_blocks_per_seq = HMAXB};
        c.b = &b2;
        const osp_sparse_runtime_stats st1 = osp_sparse_runtime_get_stats(rt);
        assert_int_equal(hk->prepare(hk->ctx, &c), OSP_OK);
        hk->run(hk->ctx, &c, 0, 0, 2 * HH);
        if (w == 2) { /* the pages Quest picks from freshly made summaries, through the block-sparse kernel */
            osp_quest_summaries qs;
            assert_int_equal(osp_quest_create(1, HNB, HB, HHK, HD, &qs), OSP_OK);
            for (int s = 0; s < 2; s++)
                for (int j = 0; j <= pos2[s] / HB; j++)
                    osp_quest_summarize_block(&qs, 0, &pg, bt[s * HMAXB + j], j < pos2[s] / HB ? HB : pos2[s] % HB + 1);
            int32_t ci[5] = {0}, cand[4 * 3 * HB], sel[HMAXB];
            osp_quest_scored ws[HMAXB];
            int32_t n = 0;
            for (int s = 0; s < 2; s++)
                for (int g = 0; g < HHK; g++) {
                    const int32_t m = osp_quest_select(&qs, 0, bt + s * HMAXB, pos2[s], q + ((size_t)s * HH + (size_t)g * 2) * HD,
                                                       2, g, &cfg, ws, sel);
                    assert_int_equal(m, 3);
                    for (int i = 0; i < m; i++)
                        for (int o = 0; o < HB && sel[i] * HB + o <= pos2[s]; o++) cand[n++] = sel[i] * HB + o;
                    ci[s * HHK + g + 1] = n;
                }
            osp_sparse_layout L = {.num_tokens = 2, .positions = pos2, .num_seqs = 2, .query_start_loc = qsl2,
                                   .seq_lens = seql, .block_table = bt, .max_blocks_per_seq = HMAXB, .block_size = HB,
                                   .n_head = HH, .n_head_kv = HHK, .share = OSP_SPARSE_PER_KV_HEAD, .q_tile = 1};
            osp_sparse_wt wt = {0};
            const osp_sparse_cands C = {ci, cand};
            assert_int_equal(osp_sparse_wt_build(&wt, &L, &C, NULL, HD * 4), OSP_OK);
            const osp_sparse_attn_args a = {.q = q, .out = ref, .kv = &pg, .L = &L, .wt = &wt, .head_dim = HD, .scale = 0.25f};
            osp_sparse_attention_cpu(&a, 0, 2 * HH);
            assert_memory_equal(out, ref, sizeof(float) * 2 * HH * HD);
            const osp_sparse_runtime_stats st = osp_sparse_runtime_get_stats(rt);
            assert_int_equal(st.tiles_read - st1.tiles_read, 2 * HHK * 3); /* 3 pages per KV head and token */
            assert_int_equal(st.sparse_tokens - st1.sparse_tokens, 2);
            osp_sparse_wt_free(&wt);
            osp_quest_free(&qs);
        } else {
            osp_cpu_paged_attention_kv(q, &pg, ref, 2, qsl2, pos2, bt, HMAXB, HB, HH, HHK, HD, 0.25f, op.p.attn.window, sc,
                                       0, 2 * HH);
            for (int i = 0; i < 2 * HH * HD; i++) assert_true(fabsf(out[i] - ref[i]) <= 2e-5f + 2e-5f * fabsf(ref[i]));
        }
        /* a runtime made for another cache shape refuses the call */
        kv.num_blocks = HNB - 1;
        assert_int_equal(hk->prepare(hk->ctx, &c), OSP_ERR_INVALID_ARG);
        kv.num_blocks = HNB;
        osp_sparse_runtime_free(rt);
    }
}

/* ---- the engine ------------------------------------------------------------------------------------ */

#define NREQ 4
static char g_tiny[512];
static const char *g_smol;

static osp_engine_params params(const char *model, const char *sparse) {
    osp_engine_params p = osp_engine_default_params();
    p.model_path = model;
    p.n_threads = 2;
    p.kv_dtype = OSP_KV_DTYPE_F32;
    p.max_model_len = 640;
    p.num_blocks = 256;
    p.check_invariants = true;
    p.hash_seed_set = true;
    p.hash_seed = 5;
    if (sparse) assert_int_equal(osp_sparse_config_parse(sparse, &p.sparse_attention), OSP_OK);
    return p;
}

/* Dense, a budget covering the context, a small budget; with `invariance` the small budget also alone
 * and with a token budget of 7 (chunked prefill). */
static void check_model(const char *model, int32_t vocab, int32_t base_len, const char *name, bool invariance, int nreq) {
    static job dense[NREQ], full[NREQ], small[NREQ], alone[NREQ], chunked[NREQ];
    make_jobs(dense, nreq, vocab, base_len);
    memcpy(full, dense, sizeof dense), memcpy(small, dense, sizeof dense);
    memcpy(alone, dense, sizeof dense), memcpy(chunked, dense, sizeof dense);
    osp_engine_params p = params(model, NULL);
    const osp_engine_stats sd = run_jobs(&p, dense, nreq);
    assert_int_equal(sd.sparse_tokens + sd.sparse_dense_tokens, 0);
    /* longest context: base_len + 3 * 37 + 21 tokens < 40 pages of 16 */
    p = params(model, "topk:40");
    const osp_engine_stats sf = run_jobs(&p, full, nreq);
    assert_int_equal(same_tokens(dense, full, nreq), total_tokens(dense, nreq));
    assert_int_equal(sf.sparse_tokens, 0);
    assert_true(sf.sparse_dense_tokens > 0);
    /* a small budget: fewer tiles than dense; the same tokens together, alone and chunked */
    p = params(model, "topk:3,recent:1,sink:1");
    const osp_engine_stats ss = run_jobs(&p, small, nreq);
    assert_true(ss.sparse_tokens > 0);
    assert_true(ss.sparse_tiles_read < ss.sparse_tiles_dense);
    if (invariance) {
        for (int i = 0; i < nreq; i++) run_jobs(&p, &alone[i], 1);
        assert_int_equal(same_tokens(small, alone, nreq), total_tokens(small, nreq));
        p.max_num_batched_tokens = 7;
        run_jobs(&p, chunked, nreq);
        assert_int_equal(same_tokens(small, chunked, nreq), total_tokens(small, nreq));
    }
    printf("%s: topk:3,recent:1,sink:1: %d of %d greedy tokens as dense before the first difference; "
           "tiles read %lld of %lld dense (%.1f%%), %lld of %lld (token, layer) pairs sparse\n",
           name, same_tokens(dense, small, nreq), total_tokens(dense, nreq), (long long)ss.sparse_tiles_read,
           (long long)ss.sparse_tiles_dense, 100.0 * (double)ss.sparse_tiles_read / (double)ss.sparse_tiles_dense,
           (long long)ss.sparse_tokens, (long long)(ss.sparse_tokens + ss.sparse_dense_tokens));
}

static void test_engine_tiny(void **state) {
    (void)state;
    check_model(g_tiny, 512, 60, "tiny-llama-f32", true, NREQ);
}

static void test_engine_smollm2(void **state) {
    (void)state;
    if (!g_smol) skip();
    check_model(g_smol, 49152, 60, "SmolLM2-135M", false, 2); /* kept small for the sanitizer build; invariance: the tiny model */
}

int main(void) {
    const char *root = getenv("OSPREY_ROOT");
    if (!root) root = ".";
    snprintf(g_tiny, sizeof g_tiny, "%s/tests/models/tiny-llama-f32.gguf", root);
    FILE *f = fopen(g_tiny, "rb");
    if (!f) {
        fprintf(stderr, "SKIP: %s missing\n", g_tiny);
        return 77;
    }
    fclose(f);
    g_smol = getenv("OSPREY_MODEL");
    if (g_smol && !(f = fopen(g_smol, "rb"))) g_smol = NULL;
    if (f && g_smol) fclose(f);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_quest),
        cmocka_unit_test(test_hook_op),
        cmocka_unit_test(test_engine_tiny),
        cmocka_unit_test(test_engine_smollm2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
