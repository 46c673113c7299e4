/* Sparse attention on the GPU engine path (--sparse-attention topk:N --device cuda; issue 15): the CUDA
 * backend's ATTENTION op with an osp_dev_sparse (src/backend/cuda/backend_cuda.c) and its two glue
 * kernels (src/backend/cuda/sparse_engine.cu).
 *   - osp_cuda_quest_refresh writes the f16 summaries src/sparse/quest.c's osp_quest_summarize_block
 *     computes (min / max in fp32 of the same f16 keys: the same values, compared bit for bit after
 *     widening), for partial and full pages, padded entries (-1) untouched;
 *   - osp_cuda_rows_copy gathers and scatters rows (zeros for -1 in a gather; -1 skipped in a scatter);
 *   - the engine on SmolLM2-135M (OSPREY_MODEL; head_dim 64, which the block-sparse kernel takes; the
 *     tiny-d32 test models have head_dim 32), f16 pages: a budget covering every context gives exactly
 *     the dense tokens with no sparse (token, layer) pair; a budget of 3 pages reads fewer tiles than
 *     dense, and its tokens are the same for the requests together, each alone, with a token budget of 7
 *     (chunked prefill: prefill tokens past the budget run sparse, as on the CPU) and with CUDA graphs
 *     off (the graphs' fixed-size launches against eager ones);
 *   - f32 pages with sparse attention are refused at start-up with a message;
 *   - printed, not asserted: how many greedy tokens the GPU's sparse run shares with the CPU's sparse run
 *     and with the GPU's dense run (no test asserts GPU == CPU tokens even densely: bf16 activations on
 *     the GPU, fp32 on the CPU).
 * Skipped (77) without a CUDA device; the engine cases skip without the model. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine_jobs.h"

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_ops.h"
#include "core/dtype.h"
#include "osprey/engine.h"
#include "osprey/model.h"
#include "osprey/sparse.h"
#include "sparse/quest.h"

static uint64_t g_rng = 12345;
static float frand(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 11) % 20001) / 10000.0f - 1.0f;
}

/* ---- the glue kernels --------------------------------------------------------------------------- */

static void test_refresh_kernel(void **state) {
    (void)state;
    enum { NB = 12, BS = 16, HK = 3, D = 64, ROW = HK * D };
    static uint16_t k[NB * BS * ROW];
    static float kf[NB * BS * ROW];
    for (int i = 0; i < NB * BS * ROW; i++) {
        k[i] = osp_fp32_to_fp16(4.0f * frand());
        kf[i] = osp_fp16_to_fp32(k[i]);
    }
    /* pages 2 (1 slot), 5 (full), 7 (9 slots), 11 (16 slots), then two padded entries */
    const int32_t blocks[6] = {2, 5, 7, 11, -1, -1}, nval[6] = {1, 16, 9, 16, 1, 1};
    void *st = NULL, *dk = NULL, *dmin = NULL, *dmax = NULL, *db = NULL, *dn = NULL;
    assert_int_equal(osp_cuda_stream_create(&st), OSP_OK);
    assert_int_equal(osp_cuda_malloc(&dk, sizeof k, "test"), OSP_OK);
    assert_int_equal(osp_cuda_malloc(&dmin, NB * ROW * 2, "test"), OSP_OK);
    assert_int_equal(osp_cuda_malloc(&dmax, NB * ROW * 2, "test"), OSP_OK);
    assert_int_equal(osp_cuda_malloc(&db, sizeof blocks, "test"), OSP_OK);
    assert_int_equal(osp_cuda_malloc(&dn, sizeof nval, "test"), OSP_OK);
    static uint16_t poison[NB * ROW], gmin[NB * ROW], gmax[NB * ROW];
    for (int i = 0; i < NB * ROW; i++) poison[i] = 0x7e00; /* f16 NaN: untouched pages keep it */
    assert_int_equal(osp_cuda_h2d(dk, k, sizeof k, st), OSP_OK);
    assert_int_equal(osp_cuda_h2d(dmin, poison, sizeof poison, st), OSP_OK);
    assert_int_equal(osp_cuda_h2d(dmax, poison, sizeof poison, st), OSP_OK);
    assert_int_equal(osp_cuda_h2d(db, blocks, sizeof blocks, st), OSP_OK);
    assert_int_equal(osp_cuda_h2d(dn, nval, sizeof nval, st), OSP_OK);
    assert_int_equal(osp_cuda_quest_refresh(dk, db, dn, 6, BS, HK, D, dmin, dmax, st), OSP_OK);
    assert_int_equal(osp_cuda_d2h(gmin, dmin, sizeof gmin, st), OSP_OK);
    assert_int_equal(osp_cuda_d2h(gmax, dmax, sizeof gmax, st), OSP_OK);
    assert_int_equal(osp_cuda_stream_sync(st), OSP_OK);
    osp_quest_summaries qs;
    assert_int_equal(osp_quest_create(1, NB, BS, HK, D, &qs), OSP_OK);
    const osp_cpu_kv_pages pg = {.k_type = OSP_DTYPE_F32, .v_type = OSP_DTYPE_F32, .k = kf, .v = kf};
    for (int e = 0; e < 4; e++) osp_quest_summarize_block(&qs, 0, &pg, blocks[e], nval[e]);
    for (int b = 0; b < NB; b++) {
        const bool done = b == 2 || b == 5 || b == 7 || b == 11;
        for (int c = 0; c < ROW; c++) {
            const size_t i = (size_t)b * ROW + (size_t)c;
            if (!done) {
                assert_int_equal(gmin[i], 0x7e00);
                assert_int_equal(gmax[i], 0x7e00);
                continue;
            }
            const float a = osp_fp16_to_fp32(gmin[i]), z = osp_fp16_to_fp32(gmax[i]);
            if (memcmp(&a, &qs.kmin[i], 4) || memcmp(&z, &qs.kmax[i], 4))
                fail_msg("page %d channel %d: gpu [%g, %g] cpu [%g, %g]", b, c, (double)a, (double)z,
                         (double)qs.kmin[i], (double)qs.kmax[i]);
        }
    }
    osp_quest_free(&qs);
    /* rows: gather rows {3, -1, 0} of 4 rows of 48 bytes, scatter them back into a copy at {1, -1, 2} */
    uint8_t src[4 * 48], got[3 * 48], back[4 * 48];
    for (int i = 0; i < 4 * 48; i++) src[i] = (uint8_t)(i * 7 + 1);
    const int32_t gi[3] = {3, -1, 0}, si[3] = {1, -1, 2};
    void *ds = NULL, *dg = NULL, *dgi = NULL, *dsi = NULL;
    assert_int_equal(osp_cuda_malloc(&ds, sizeof src, "test"), OSP_OK);
    assert_int_equal(osp_cuda_malloc(&dg, sizeof got, "test"), OSP_OK);
    assert_int_equal(osp_cuda_malloc(&dgi, sizeof gi, "test"), OSP_OK);
    assert_int_equal(osp_cuda_malloc(&dsi, sizeof si, "test"), OSP_OK);
    assert_int_equal(osp_cuda_h2d(ds, src, sizeof src, st), OSP_OK);
    assert_int_equal(osp_cuda_h2d(dgi, gi, sizeof gi, st), OSP_OK);
    assert_int_equal(osp_cuda_h2d(dsi, si, sizeof si, st), OSP_OK);
    assert_int_equal(osp_cuda_rows_copy(ds, dg, dgi, 3, 48, false, st), OSP_OK);
    assert_int_equal(osp_cuda_d2h(got, dg, sizeof got, st), OSP_OK);
    assert_int_equal(osp_cuda_rows_copy(dg, ds, dsi, 3, 48, true, st), OSP_OK);
    assert_int_equal(osp_cuda_d2h(back, ds, sizeof back, st), OSP_OK);
    assert_int_equal(osp_cuda_stream_sync(st), OSP_OK);
    static const uint8_t zero[48];
    assert_memory_equal(got, src + 3 * 48, 48);
    assert_memory_equal(got + 48, zero, 48);
    assert_memory_equal(got + 96, src, 48);
    assert_memory_equal(back, src, 48);            /* row 0 untouched */
    assert_memory_equal(back + 48, src + 144, 48); /* row 1 <- gathered row 0 (src row 3) */
    assert_memory_equal(back + 96, src, 48);       /* row 2 <- gathered row 2 (src row 0) */
    assert_memory_equal(back + 144, src + 144, 48);
    assert_int_equal(osp_cuda_rows_copy(ds, dg, dgi, 3, 40, false, st), OSP_ERR_INVALID_ARG); /* not 16-byte rows */
    osp_cuda_free(dk), osp_cuda_free(dmin), osp_cuda_free(dmax), osp_cuda_free(db), osp_cuda_free(dn);
    osp_cuda_free(ds), osp_cuda_free(dg), osp_cuda_free(dgi), osp_cuda_free(dsi);
    osp_cuda_stream_destroy(st);
}

/* ---- the engine ------------------------------------------------------------------------------------ */

#define NREQ 4
static const char *g_smol;

static osp_engine_params params(osp_device dev, const char *sparse) {
    osp_engine_params p = osp_engine_default_params();
    p.model_path = g_smol;
    p.device = dev;
    p.n_threads = 2;
    p.kv_dtype = OSP_KV_DTYPE_F16;
    p.max_model_len = 256;
    p.num_blocks = 96;
    p.check_invariants = true;
    p.hash_seed_set = true;
    p.hash_seed = 5;
    if (sparse) assert_int_equal(osp_sparse_config_parse(sparse, &p.sparse_attention), OSP_OK);
    return p;
}

static void assert_same(const job *a, const job *b, int n, const char *what) {
    for (int i = 0; i < n; i++)
        if (a[i].n_out != b[i].n_out || memcmp(a[i].out, b[i].out, sizeof(int32_t) * (size_t)a[i].n_out))
            fail_msg("%s: request %d differs (%d vs %d tokens, %d the same)", what, i, a[i].n_out, b[i].n_out,
                     same_tokens(&a[i], &b[i], 1));
}

static void test_engine_full_budget(void **state) {
    (void)state;
    if (!g_smol) skip();
    static job dense[NREQ], full[NREQ];
    make_jobs(dense, NREQ, 49152, 60); /* 60 .. 171 tokens: 4 .. 11 pages of 16 */
    memcpy(full, dense, sizeof dense);
    osp_engine_params p = params(OSP_DEVICE_CUDA, NULL);
    const osp_engine_stats sd = run_jobs(&p, dense, NREQ);
    assert_int_equal(sd.sparse_tokens + sd.sparse_dense_tokens, 0);
    p = params(OSP_DEVICE_CUDA, "topk:16"); /* the longest context, 171 + 20 tokens, is 12 pages */
    const osp_engine_stats sf = run_jobs(&p, full, NREQ);
    assert_same(dense, full, NREQ, "a budget covering the context vs dense");
    assert_int_equal(sf.sparse_tokens, 0);
    assert_true(sf.sparse_dense_tokens > 0);
    assert_int_equal(sf.sparse_tiles_read, 0);
}

static void test_engine_small_budget(void **state) {
    (void)state;
    if (!g_smol) skip();
    static job dense[NREQ], small[NREQ], alone[NREQ], chunked[NREQ], eager[NREQ], cpu[NREQ], cpu_dense[NREQ];
    make_jobs(dense, NREQ, 49152, 60); /* 60 .. 171 tokens: 4 .. 11 pages of 16 */
    memcpy(small, dense, sizeof dense), memcpy(alone, dense, sizeof dense), memcpy(chunked, dense, sizeof dense);
    memcpy(eager, dense, sizeof dense), memcpy(cpu, dense, sizeof dense), memcpy(cpu_dense, dense, sizeof dense);
    const char *cfg = "topk:3,recent:1,sink:1";
    osp_engine_params p = params(OSP_DEVICE_CUDA, NULL);
    run_jobs(&p, dense, NREQ);
    p = params(OSP_DEVICE_CUDA, cfg);
    const osp_engine_stats ss = run_jobs(&p, small, NREQ);
    assert_true(ss.sparse_tokens > 0);
    assert_true(ss.sparse_tiles_read > 0);
    assert_true(ss.sparse_tiles_read < ss.sparse_tiles_dense);
    for (int i = 0; i < NREQ; i++) run_jobs(&p, &alone[i], 1);
    assert_same(small, alone, NREQ, "sparse: together vs alone");
    p.max_num_batched_tokens = 7;
    run_jobs(&p, chunked, NREQ);
    assert_same(small, chunked, NREQ, "sparse: token budget 7 (chunked prefill) vs 2048");
    p = params(OSP_DEVICE_CUDA, cfg);
    const char *old = getenv("OSPREY_CUDA_GRAPHS");
    setenv("OSPREY_CUDA_GRAPHS", "0", 1); /* read when the backend is made */
    run_jobs(&p, eager, NREQ);
    if (old) setenv("OSPREY_CUDA_GRAPHS", old, 1);
    else unsetenv("OSPREY_CUDA_GRAPHS");
    assert_same(small, eager, NREQ, "sparse: CUDA graphs vs eager");
    /* the CPU's sparse run and dense run, for the record */
    p = params(OSP_DEVICE_CPU, cfg);
    run_jobs(&p, cpu, NREQ);
    p = params(OSP_DEVICE_CPU, NULL);
    run_jobs(&p, cpu_dense, NREQ);
    printf("SmolLM2-135M %s on the GPU: %d of %d greedy tokens as the GPU's dense run before the first difference, "
           "%d as the CPU's sparse run (the CPU's dense run: %d as the GPU's dense run); tiles read %lld of %lld dense "
           "(%.1f%%), %lld of %lld (token, layer) pairs sparse\n",
           cfg, same_tokens(dense, small, NREQ), total_tokens(small, NREQ), same_tokens(cpu, small, NREQ),
           same_tokens(cpu_dense, dense, NREQ), (long long)ss.sparse_tiles_read, (long long)ss.sparse_tiles_dense,
           100.0 * (double)ss.sparse_tiles_read / (double)ss.sparse_tiles_dense, (long long)ss.sparse_tokens,
           (long long)(ss.sparse_tokens + ss.sparse_dense_tokens));
}

static void test_engine_refusals(void **state) {
    (void)state;
    if (!g_smol) skip();
    osp_engine_params p = params(OSP_DEVICE_CUDA, "topk:4");
    p.kv_dtype = OSP_KV_DTYPE_F32;
    osp_engine *e = NULL;
    assert_int_equal(osp_engine_create(&p, &e), OSP_ERR_UNSUPPORTED);
    assert_null(e);
    assert_non_null(strstr(osp_last_error(), "f16"));
    printf("f32 pages: %s\n", osp_last_error());
}

int main(void) {
    if (osp_device_count(OSP_DEVICE_CUDA) == 0) {
        printf("test_gpu_sparse_engine: skipped: no CUDA device\n");
        return 77;
    }
    g_smol = getenv("OSPREY_MODEL");
    FILE *f = g_smol ? fopen(g_smol, "rb") : NULL;
    if (!f) g_smol = NULL;
    else fclose(f);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refresh_kernel),
        cmocka_unit_test(test_engine_full_budget),
        cmocka_unit_test(test_engine_small_budget),
        cmocka_unit_test(test_engine_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
