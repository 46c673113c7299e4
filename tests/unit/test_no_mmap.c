/* osp_model_params.no_mmap (the CPU backend copies the streamed matrices onto 2 MB pages and drops the
 * copied file pages from the process, backend_cpu.c copy_weights):
 *   - the logits are bit-identical to the mapped model's, for a prompt and for one-token decode steps
 *     (the GEMV path), on tied and untied models, in both CPU activation modes;
 *   - the same with QuantSpec's 4-bit draft weights, whose Q4_0 copies the loader made in the heap (sources
 *     outside the mapping, osp_weight_src.mapped false, never dropped);
 *   - on AVX512-VNNI the q8 copies lie in 16-row strips (qdot8b.h): the same again with the kernels capped at
 *     AVX2 after the load (the strips read a row at a time). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/qdot.h"
#include "model/model_exec.h"
#include "osprey/model.h"

static const char *g_root;

enum { NB = 8, BS = 16, N_PROMPT = 9, N_DECODE = 4 };

/* A prompt of N_PROMPT tokens, then N_DECODE one-token steps; the last row's logits of each run, in order,
 * into out [(1 + N_DECODE) x n_vocab]. */
static void run(osp_model *m, float *out) {
    const int32_t V = osp_model_config_get(m)->n_vocab;
    osp_kv_cache *kv;
    assert_int_equal(osp_kv_cache_create(m, NB, BS, OSP_KV_DTYPE_F16, &kv), OSP_OK);
    int32_t ids[N_PROMPT], pos[N_PROMPT], bt[NB];
    for (int i = 0; i < NB; i++) bt[i] = i;
    for (int i = 0; i < N_PROMPT; i++) ids[i] = (i * 37 + 5) % V, pos[i] = i;
    float *lg = malloc(sizeof(float) * (size_t)V);
    for (int step = 0; step <= N_DECODE; step++) {
        const int32_t n = step == 0 ? N_PROMPT : 1, p0 = step == 0 ? 0 : N_PROMPT + step - 1;
        int32_t qsl[2] = {0, n}, sl[1] = {p0 + n}, li[1] = {n - 1}, one_id[1] = {(p0 * 11 + 3) % V}, one_pos[1] = {p0};
        osp_batch b = {.num_tokens = n, .token_ids = step == 0 ? ids : one_id, .positions = step == 0 ? pos : one_pos,
                       .slot_mapping = step == 0 ? pos : one_pos, .num_seqs = 1, .query_start_loc = qsl,
                       .seq_lens = sl, .block_table = bt, .max_blocks_per_seq = NB, .num_logits = 1,
                       .logits_indices = li};
        assert_int_equal(osp_model_forward_hidden(m, kv, &b, lg, NULL), OSP_OK);
        memcpy(out + (size_t)step * V, lg, sizeof(float) * (size_t)V);
    }
    free(lg);
    osp_kv_cache_free(kv);
}

static void check_model(const char *name, bool draft_4bit) {
    char path[600];
    snprintf(path, sizeof path, "%s/tests/models/%s", g_root, name);
    for (int q8 = 0; q8 < 2; q8++) {
        osp_model_params mp = osp_model_default_params();
        mp.n_threads = 2;
        mp.cpu_activations = q8 ? OSP_CPU_ACT_Q8 : OSP_CPU_ACT_TWO_LEVEL;
        mp.draft_4bit_weights = draft_4bit;
        osp_model *mapped, *copied;
        assert_int_equal(osp_model_load(path, &mp, &mapped), OSP_OK);
        mp.no_mmap = true;
        assert_int_equal(osp_model_load(path, &mp, &copied), OSP_OK);
        const size_t n = (size_t)(1 + N_DECODE) * (size_t)osp_model_config_get(mapped)->n_vocab;
        float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
        run(mapped, a);
        run(copied, b);
        for (size_t i = 0; i < n; i++)
            if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
                fail_msg("%s (%s activations%s): logit %zu is %.9g copied, %.9g mapped", name, q8 ? "q8" : "two-level",
                         draft_4bit ? ", 4-bit draft weights" : "", i, (double)b[i], (double)a[i]);
        printf("%s, %s activations%s: %zu logits bit-identical\n", name, q8 ? "q8" : "two-level",
               draft_4bit ? ", 4-bit draft weights" : "", n);
        /* the copy made in 16-row strips on AVX512-VNNI, run after the kernels were capped at AVX2: every
         * row through the unpacked-row path, the same bits */
        if (q8 && osp_qdot_isa_family() == OSP_QDOT_ISA_VNNI && osp_qdot_force_isa("avx2")) {
            run(copied, b);
            assert_true(osp_qdot_force_isa("avx512vnni"));
            for (size_t i = 0; i < n; i++)
                if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
                    fail_msg("%s: logit %zu is %.9g copied under AVX2 kernels, %.9g mapped", name, i, (double)b[i], (double)a[i]);
            printf("%s, q8 activations, strips read by the AVX2 kernels: %zu logits bit-identical\n", name, n);
        }
        free(a);
        free(b);
        osp_model_free(mapped);
        osp_model_free(copied);
    }
}

static void test_tied(void **state) {
    (void)state;
    check_model("tiny-qwen2-q4_1.gguf", false);
}

static void test_untied(void **state) {
    (void)state;
    check_model("tiny-llama-untied-q4_1.gguf", false);
}

static void test_q8_0(void **state) {
    (void)state;
    check_model("tiny-llama-q8_0.gguf", false);
}

/* Q8_0 matrices are requantized to Q4_0 in the heap (loader.c requant_4bit): sources outside the mapping */
static void test_heap_sources(void **state) {
    (void)state;
    check_model("tiny-llama-q8_0.gguf", true);
}

int main(void) {
    g_root = getenv("OSPREY_ROOT");
    if (!g_root) g_root = ".";
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tied),
        cmocka_unit_test(test_untied),
        cmocka_unit_test(test_q8_0),
        cmocka_unit_test(test_heap_sources),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
