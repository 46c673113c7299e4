/* osp_model_probe: a model's config from its GGUF metadata without loading a weight (what the engine budgets a
 * GPU draft model's cache and weights with before loading it):
 *   - on every fixture model (llama, qwen2, qwen3; tied and untied; f32, q8_0, q4_1) the config equals the one
 *     osp_model_load gives, field for field, and so do the KV bytes a token the engine sizes the cache with;
 *   - the device bytes are the GPU's bf16 widening: under the f32 file's tensor bytes (matrices halve), over
 *     1.5x the q8_0 file's (8.5 bits a weight become 16);
 *   - a missing file and a vocabulary-only GGUF (no token_embd) are errors that leave the config zeroed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "osprey/gguf.h"
#include "osprey/model.h"

static const char *g_root;

static void model_path(char *out, size_t n, const char *name) { snprintf(out, n, "%s/tests/models/%s", g_root, name); }

/* the bytes of the file's tensor data (every tensor's nbytes) */
static int64_t tensor_bytes(const char *path) {
    osp_gguf *g = NULL;
    assert_int_equal(osp_gguf_open(path, &g), OSP_OK);
    int64_t n = 0;
    for (uint64_t i = 0; i < osp_gguf_n_tensors(g); i++) n += (int64_t)osp_gguf_tensor_at(g, i)->nbytes;
    osp_gguf_close(g);
    return n;
}

static void test_matches_load(void **state) {
    (void)state;
    static const char *names[] = {"tiny-llama-f32.gguf", "tiny-llama-q8_0.gguf", "tiny-llama-untied-q4_1.gguf",
                                  "tiny-llama3-q8_0.gguf", "tiny-qwen2-q4_1.gguf", "tiny-qwen3-f32.gguf",
                                  "tiny-llama-ffn96-q8_0.gguf"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[600];
        model_path(path, sizeof path, names[i]);
        osp_model_config pc;
        int64_t dev = -1;
        assert_int_equal(osp_model_probe(path, &pc, &dev), OSP_OK);
        osp_model_params mp = osp_model_default_params();
        mp.n_threads = 1;
        osp_model *m = NULL;
        assert_int_equal(osp_model_load(path, &mp, &m), OSP_OK);
        const osp_model_config *lc = osp_model_config_get(m);
        assert_string_equal(pc.arch, lc->arch);
        assert_int_equal(pc.n_vocab, lc->n_vocab);
        assert_int_equal(pc.n_embd, lc->n_embd);
        assert_int_equal(pc.n_layer, lc->n_layer);
        assert_int_equal(pc.n_head, lc->n_head);
        assert_int_equal(pc.n_head_kv, lc->n_head_kv);
        assert_int_equal(pc.head_dim, lc->head_dim);
        assert_int_equal(pc.n_ff, lc->n_ff);
        assert_int_equal(pc.n_ctx_train, lc->n_ctx_train);
        assert_int_equal(pc.tied_output, lc->tied_output);
        for (int k = 0; k < 3; k++) {
            const osp_kv_dtype t = k == 0 ? OSP_KV_DTYPE_F16 : k == 1 ? OSP_KV_DTYPE_FP8 : OSP_KV_DTYPE_INT8_HIER;
            assert_true(osp_kv_cache_bytes_per_token(&pc, t, t) == osp_kv_cache_bytes_per_token(lc, t, t));
        }
        const int64_t file = tensor_bytes(path);
        printf("%-28s %s: %d layers, %d/%d heads of %d, device %lld bytes (tensor data %lld)\n", names[i], pc.arch,
               pc.n_layer, pc.n_head, pc.n_head_kv, pc.head_dim, (long long)dev, (long long)file);
        if (strstr(names[i], "f32")) assert_true(dev < file);
        if (strstr(names[i], "q8_0")) assert_true(dev > file * 3 / 2);
        assert_true(dev > 0);
        osp_model_free(m);
    }
}

static void test_errors(void **state) {
    (void)state;
    osp_model_config c;
    memset(&c, 0x5A, sizeof c);
    int64_t dev = 7;
    char path[600];
    model_path(path, sizeof path, "no-such-model.gguf");
    assert_int_not_equal(osp_model_probe(path, &c, &dev), OSP_OK);
    assert_int_equal(c.n_layer, 0);
    assert_int_equal(dev, 0);
    assert_int_equal(osp_model_probe(NULL, &c, NULL), OSP_ERR_INVALID_ARG);
    /* a vocabulary-only GGUF (the tokenizer tests' fixtures): metadata, no tensors */
    snprintf(path, sizeof path, "%s/../shared/testdata/vocab/ggml-vocab-llama-spm.gguf", g_root);
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("test_model_probe: %s absent: the vocabulary-only case skipped\n", path);
        return;
    }
    fclose(f);
    memset(&c, 0x5A, sizeof c);
    assert_int_equal(osp_model_probe(path, &c, &dev), OSP_ERR_FORMAT);
    assert_int_equal(c.n_vocab, 0);
    assert_int_equal(c.arch[0], 0);
}

int main(void) {
    g_root = getenv("OSPREY_ROOT");
    if (!g_root) g_root = ".";
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_load),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
