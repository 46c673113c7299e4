/* Hidden states out of the forward pass (osp_model_params.hidden_layers, osp_model_forward_hidden):
 * what speculative decoding's EAGLE-style drafters read.
 *   - The last layer's hidden state is the stream the logits come from: rmsnorm(h) * output_norm,
 *     times the lm_head, computed here on the host from the file's own F32 tensors, equals the
 *     model's logits (exact mode: the same fp32 operations, so to ~1e-5).
 *   - Asking for hidden states changes nothing else: the logits are bit-identical to a model loaded
 *     without them, and a hidden state of a token does not depend on the batch it ran in.
 *   - Bad layer lists are refused at load. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/model_exec.h"
#include "osprey/gguf.h"
#include "osprey/model.h"

static char g_path[512];

enum { NB = 8, BS = 16 };

/* One prefill of `n` tokens of sequence ids (positions 0..n-1), every row's logits and hidden states. */
static void run(osp_model *m, const int32_t *ids, int32_t n, float *logits, float *const *hidden) {
    osp_kv_cache *kv;
    assert_int_equal(osp_kv_cache_create(m, NB, BS, OSP_KV_DTYPE_F32, &kv), OSP_OK);
    int32_t pos[NB * BS], li[NB * BS], bt[NB], qsl[2] = {0, n}, sl[1] = {n};
    for (int i = 0; i < NB; i++) bt[i] = i;
    for (int i = 0; i < n; i++) pos[i] = li[i] = i;
    osp_batch b = {.num_tokens = n, .token_ids = ids, .positions = pos, .slot_mapping = pos, .num_seqs = 1,
                   .query_start_loc = qsl, .seq_lens = sl, .block_table = bt, .max_blocks_per_seq = NB,
                   .num_logits = n, .logits_indices = li};
    assert_int_equal(osp_model_forward_hidden(m, kv, &b, logits, hidden), OSP_OK);
    osp_kv_cache_free(kv);
}

static const float *f32_tensor(const osp_gguf *g, const char *name, int64_t n) {
    const osp_gguf_tensor *t = osp_gguf_find_tensor(g, name);
    if (!t) return NULL;
    assert_int_equal(t->type, 0); /* F32 */
    assert_int_equal(t->ne[0] * (t->n_dims > 1 ? t->ne[1] : 1), n);
    return t->data;
}

static void test_last_hidden_gives_logits(void **state) {
    (void)state;
    osp_model_params mp = osp_model_default_params();
    mp.exact = true;
    osp_model *plain;
    assert_int_equal(osp_model_load(g_path, &mp, &plain), OSP_OK);
    const osp_model_config *c = osp_model_config_get(plain);
    mp.n_hidden_layers = 2;
    mp.hidden_layers[0] = 0;
    mp.hidden_layers[1] = c->n_layer - 1;
    osp_model *m;
    assert_int_equal(osp_model_load(g_path, &mp, &m), OSP_OK);
    const int E = c->n_embd, V = c->n_vocab, n = 11;
    int32_t ids[11];
    for (int i = 0; i < n; i++) ids[i] = (i * 37 + 5) % V;
    float *lg = malloc(sizeof(float) * (size_t)n * V), *lg0 = malloc(sizeof(float) * (size_t)n * V);
    float *h0 = malloc(sizeof(float) * (size_t)n * E), *h1 = malloc(sizeof(float) * (size_t)n * E);
    float *hs[2] = {h0, h1};
    run(m, ids, n, lg, hs);
    run(plain, ids, n, lg0, NULL);
    assert_memory_equal(lg, lg0, sizeof(float) * (size_t)n * V); /* outputs change no arithmetic */

    const osp_gguf *g = osp_model_gguf(m);
    const float *norm = f32_tensor(g, "output_norm.weight", E);
    const float *out = f32_tensor(g, "output.weight", (int64_t)E * V);
    if (!out) out = f32_tensor(g, "token_embd.weight", (int64_t)E * V);
    assert_non_null(norm);
    assert_non_null(out);
    double worst = 0;
    for (int t = 0; t < n; t++) {
        const float *h = h1 + (size_t)t * E;
        double ss = 0;
        for (int i = 0; i < E; i++) ss += (double)h[i] * h[i];
        const double sc = 1.0 / sqrt(ss / E + c->rms_eps);
        for (int v = 0; v < V; v++) {
            double z = 0;
            for (int i = 0; i < E; i++) z += h[i] * sc * norm[i] * out[(size_t)v * E + i];
            const double d = fabs(z - lg[(size_t)t * V + v]);
            worst = d > worst ? d : worst;
        }
        /* layer 0's stream is another value, finite */
        bool differs = false;
        for (int i = 0; i < E; i++) {
            assert_true(isfinite(h0[(size_t)t * E + i]));
            differs |= h0[(size_t)t * E + i] != h[i];
        }
        assert_true(differs);
    }
    printf("hidden states: logits from the last layer's hidden state within %.2e of the model's\n", worst);
    assert_true(worst < 1e-4);

    /* a token's hidden state is the same alone and in a longer prefill */
    float *a0 = malloc(sizeof(float) * (size_t)3 * E), *a1 = malloc(sizeof(float) * (size_t)3 * E);
    float *as[2] = {a0, a1};
    run(m, ids, 3, lg, as);
    assert_memory_equal(a1, h1, sizeof(float) * (size_t)3 * E);
    assert_memory_equal(a0, h0, sizeof(float) * (size_t)3 * E);
    free(a0), free(a1), free(h0), free(h1), free(lg), free(lg0);
    osp_model_free(m);
    osp_model_free(plain);
}

static void test_bad_layer_lists(void **state) {
    (void)state;
    osp_model_params mp = osp_model_default_params();
    osp_model *m = NULL;
    mp.n_hidden_layers = 1;
    mp.hidden_layers[0] = 1000;
    assert_int_equal(osp_model_load(g_path, &mp, &m), OSP_ERR_INVALID_ARG);
    assert_null(m);
    mp.n_hidden_layers = 2;
    mp.hidden_layers[0] = 1, mp.hidden_layers[1] = 0; /* not increasing */
    assert_int_equal(osp_model_load(g_path, &mp, &m), OSP_ERR_INVALID_ARG);
    mp.n_hidden_layers = 9;
    assert_int_equal(osp_model_load(g_path, &mp, &m), OSP_ERR_INVALID_ARG);
}

int main(void) {
    const char *root = getenv("OSPREY_ROOT");
    snprintf(g_path, sizeof g_path, "%s/tests/models/tiny-llama-f32.gguf", root ? root : ".");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_last_hidden_gives_logits),
        cmocka_unit_test(test_bad_layer_lists),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
