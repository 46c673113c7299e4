/* The KV cache's life and its checks (src/kv/kv_cache.c, osprey/kv_cache.h):
 *   - a cache may be freed after the model it was made for (it keeps the backend alive: under ASan a
 *     use-after-free here fails the test);
 *   - sizes whose byte count would overflow are refused, not wrapped into a small allocation;
 *   - on the CPU a cache serves another model of the same shape, and a model of another shape is
 *     refused with a message that says so;
 *   - copy_block copies every layer's K and V of a block, and refuses blocks outside the cache. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "osprey/model.h"

static char g_llama[512], g_qwen3[512];

static osp_model *load(const char *path) {
    osp_model_params mp = osp_model_default_params();
    mp.exact = true;
    mp.n_threads = 2;
    osp_model *m = NULL;
    assert_int_equal(osp_model_load(path, &mp, &m), OSP_OK);
    return m;
}

/* logits of a 5-token prefill at positions 0..4 in blocks 0.. of kv */
static osp_status prefill(osp_model *m, osp_kv_cache *kv, float *logits) {
    int32_t ids[5] = {1, 7, 3, 9, 4}, pos[5] = {0, 1, 2, 3, 4}, bt[4] = {0, 1, 2, 3}, qsl[2] = {0, 5}, sl[1] = {5},
            li[1] = {4};
    osp_batch b = {.num_tokens = 5, .token_ids = ids, .positions = pos, .slot_mapping = pos, .num_seqs = 1,
                   .query_start_loc = qsl, .seq_lens = sl, .block_table = bt, .max_blocks_per_seq = 4,
                   .num_logits = 1, .logits_indices = li};
    return osp_model_forward(m, kv, &b, logits);
}

static void test_free_after_model(void **state) {
    (void)state;
    osp_model *m = load(g_llama);
    osp_kv_cache *kv;
    assert_int_equal(osp_kv_cache_create(m, 4, 16, OSP_KV_DTYPE_F16, &kv), OSP_OK);
    osp_model_free(m);
    assert_int_equal(osp_kv_cache_copy_block(kv, 0, 1), OSP_OK); /* still usable without its model */
    osp_kv_cache_free(kv);
}

static void test_overflow_refused(void **state) {
    (void)state;
    osp_model *m = load(g_llama);
    osp_kv_cache *kv = (osp_kv_cache *)1;
    assert_int_equal(osp_kv_cache_create(m, 1 << 30, 1 << 27, OSP_KV_DTYPE_F16, &kv), OSP_ERR_INVALID_ARG);
    assert_null(kv);
    assert_int_equal(osp_kv_cache_create(m, 0, 16, OSP_KV_DTYPE_F16, &kv), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_kv_cache_create(m, 4, 16, (osp_kv_dtype)77, &kv), OSP_ERR_INVALID_ARG);
    osp_model_free(m);
}

static void test_shared_and_foreign(void **state) {
    (void)state;
    osp_model *a = load(g_llama), *b = load(g_llama), *q = load(g_qwen3);
    const int V = osp_model_config_get(a)->n_vocab;
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V);
    float *lq = malloc(sizeof(float) * (size_t)osp_model_config_get(q)->n_vocab);
    osp_kv_cache *kv;
    assert_int_equal(osp_kv_cache_create(a, 4, 16, OSP_KV_DTYPE_F32, &kv), OSP_OK);
    assert_int_equal(prefill(a, kv, la), OSP_OK);
    assert_int_equal(prefill(b, kv, lb), OSP_OK); /* same shape on the CPU: the same logits */
    assert_memory_equal(la, lb, sizeof(float) * (size_t)V);
    const osp_model_config *ca = osp_model_config_get(a), *cq = osp_model_config_get(q);
    assert_true(ca->n_head_kv * ca->head_dim != cq->n_head_kv * cq->head_dim); /* the fixture's point */
    assert_int_equal(prefill(q, kv, lq), OSP_ERR_INVALID_ARG);
    assert_non_null(strstr(osp_last_error(), "another shape"));
    osp_kv_cache_free(kv);
    free(la), free(lb), free(lq);
    osp_model_free(a), osp_model_free(b), osp_model_free(q);
}

static void test_copy_block(void **state) {
    (void)state;
    osp_model *m = load(g_llama);
    const int V = osp_model_config_get(m)->n_vocab;
    float *l0 = malloc(sizeof(float) * (size_t)V), *l1 = malloc(sizeof(float) * (size_t)V);
    osp_kv_cache *kv;
    assert_int_equal(osp_kv_cache_create(m, 8, 16, OSP_KV_DTYPE_F16, &kv), OSP_OK);
    assert_int_equal(prefill(m, kv, l0), OSP_OK);
    /* block 0 copied to block 5; a decode at position 5 through a table that starts with block 5
     * reads the copy and must see what a table starting with block 0 sees */
    assert_int_equal(osp_kv_cache_copy_block(kv, 0, 5), OSP_OK);
    int32_t id[1] = {2}, pos[1] = {5}, qsl[2] = {0, 1}, sl[1] = {6}, li[1] = {0};
    int32_t bt0[4] = {0, 1, 2, 3}, bt5[4] = {5, 1, 2, 3}, s0[1] = {5}, s5[1] = {5 * 16 + 5};
    osp_batch b = {.num_tokens = 1, .token_ids = id, .positions = pos, .slot_mapping = s0, .num_seqs = 1,
                   .query_start_loc = qsl, .seq_lens = sl, .block_table = bt0, .max_blocks_per_seq = 4,
                   .num_logits = 1, .logits_indices = li};
    assert_int_equal(osp_model_forward(m, kv, &b, l0), OSP_OK);
    b.block_table = bt5, b.slot_mapping = s5;
    assert_int_equal(osp_model_forward(m, kv, &b, l1), OSP_OK);
    assert_memory_equal(l0, l1, sizeof(float) * (size_t)V);
    assert_int_equal(osp_kv_cache_copy_block(kv, 0, 8), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_kv_cache_copy_block(kv, -1, 2), OSP_ERR_INVALID_ARG);
    osp_kv_cache_free(kv);
    free(l0), free(l1);
    osp_model_free(m);
}

int main(void) {
    const char *root = getenv("OSPREY_ROOT");
    snprintf(g_llama, sizeof g_llama, "%s/tests/models/tiny-llama-f32.gguf", root ? root : ".");
    snprintf(g_qwen3, sizeof g_qwen3, "%s/tests/models/tiny-qwen3-f32.gguf", root ? root : ".");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_free_after_model),
        cmocka_unit_test(test_overflow_refused),
        cmocka_unit_test(test_shared_and_foreign),
        cmocka_unit_test(test_copy_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
