/* Embeddings: the output norm of every token (osp_model_forward_embd) and the engine's prefill-only
 * embedding requests (osp_request_params.pooling).
 *   - The model's per-token output norm equals rmsnorm(h) * output_norm.weight computed here on the host
 *     from the last layer's hidden state (osp_model_forward_hidden) and the file's own F32 norm tensor.
 *   - Asking for it changes no logits (bit-identical).
 *   - The engine's pooled vectors (mean, cls, last; normalized or not) equal that by-hand reference
 *     pooled by hand, also when the prompt is split in chunks, when the request shares its steps with
 *     generation requests and with other embedding requests, and with the prefix cache warm with the
 *     same prompt (an embedding request never takes cached blocks).
 *   - A generation request next to embedding requests produces the tokens it produces alone.
 *   - Bad combinations are refused at add; a prompt may fill max_model_len, but not exceed it. */
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
#include "osprey/engine.h"
#include "osprey/gguf.h"
#include "osprey/model.h"

static char g_path[512];

enum { NB = 8, BS = 16, MAXN = 100 };

/* One prefill of n tokens (positions 0..n-1): logits of every row, the last layer's hidden state and
 * (embd != NULL) the output norm of every token. */
static void run(osp_model *m, const int32_t *ids, int32_t n, float *logits, float *hidden, float *embd) {
    osp_kv_cache *kv;
    assert_int_equal(osp_kv_cache_create(m, NB, BS, OSP_KV_DTYPE_F32, &kv), OSP_OK);
    int32_t pos[NB * BS], li[NB * BS], bt[NB], qsl[2] = {0, n}, sl[1] = {n};
    for (int i = 0; i < NB; i++) bt[i] = i;
    for (int i = 0; i < n; i++) pos[i] = li[i] = i;
    osp_batch b = {.num_tokens = n, .token_ids = ids, .positions = pos, .slot_mapping = pos, .num_seqs = 1,
                   .query_start_loc = qsl, .seq_lens = sl, .block_table = bt, .max_blocks_per_seq = NB,
                   .num_logits = logits ? n : 0, .logits_indices = li};
    float *const hs[1] = {hidden};
    assert_int_equal(osp_model_forward_embd(m, kv, &b, logits, hidden ? hs : NULL, embd), OSP_OK);
    osp_kv_cache_free(kv);
}

static const float *f32_tensor(const osp_gguf *g, const char *name, int64_t n) {
    const osp_gguf_tensor *t = osp_gguf_find_tensor(g, name);
    assert_non_null(t);
    assert_int_equal(t->type, 0); /* F32 */
    assert_int_equal(t->ne[0], n);
    return t->data;
}

/* By hand: the output norm of each of the n tokens of ids, from the last layer's hidden state. */
static void reference_norms(const int32_t *ids, int32_t n, float *out) {
    osp_model_params mp = osp_model_default_params();
    mp.exact = true;
    mp.n_threads = 2;
    osp_model *m0;
    assert_int_equal(osp_model_load(g_path, &mp, &m0), OSP_OK);
    mp.n_hidden_layers = 1;
    mp.hidden_layers[0] = osp_model_config_get(m0)->n_layer - 1;
    osp_model_free(m0);
    osp_model *m;
    assert_int_equal(osp_model_load(g_path, &mp, &m), OSP_OK);
    const osp_model_config *c = osp_model_config_get(m);
    const int E = c->n_embd;
    float *h = malloc(sizeof(float) * (size_t)n * E);
    run(m, ids, n, NULL, h, NULL);
    const float *w = f32_tensor(osp_model_gguf(m), "output_norm.weight", E);
    for (int t = 0; t < n; t++) {
        double ss = 0;
        for (int i = 0; i < E; i++) ss += (double)h[(size_t)t * E + i] * h[(size_t)t * E + i];
        const double sc = 1.0 / sqrt(ss / E + c->rms_eps);
        for (int i = 0; i < E; i++) out[(size_t)t * E + i] = (float)(h[(size_t)t * E + i] * sc * w[i]);
    }
    free(h);
    osp_model_free(m);
}

/* By hand: pooled and (maybe) L2-normalized. */
static void reference_pool(const float *norms, int32_t n, int E, osp_pooling p, bool normalize, float *out) {
    for (int i = 0; i < E; i++) {
        double v = 0;
        if (p == OSP_POOLING_MEAN) {
            for (int t = 0; t < n; t++) v += norms[(size_t)t * E + i];
            v /= n;
        } else {
            v = norms[(size_t)(p == OSP_POOLING_CLS ? 0 : n - 1) * E + i];
        }
        out[i] = (float)v;
    }
    if (!normalize) return;
    double ss = 0;
    for (int i = 0; i < E; i++) ss += (double)out[i] * out[i];
    for (int i = 0; i < E; i++) out[i] = (float)(out[i] / sqrt(ss));
}

static void test_model_output_norm(void **state) {
    (void)state;
    osp_model_params mp = osp_model_default_params();
    mp.exact = true;
    mp.n_threads = 2;
    osp_model *m;
    assert_int_equal(osp_model_load(g_path, &mp, &m), OSP_OK);
    const osp_model_config *c = osp_model_config_get(m);
    const int E = c->n_embd, V = c->n_vocab, n = 13;
    int32_t ids[13];
    for (int i = 0; i < n; i++) ids[i] = (i * 53 + 7) % V;
    float *lg = malloc(sizeof(float) * (size_t)n * V), *lg0 = malloc(sizeof(float) * (size_t)n * V);
    float *e = malloc(sizeof(float) * (size_t)n * E), *e2 = malloc(sizeof(float) * (size_t)n * E);
    float *ref = malloc(sizeof(float) * (size_t)n * E);
    run(m, ids, n, lg, NULL, e);
    run(m, ids, n, lg0, NULL, NULL);
    assert_memory_equal(lg, lg0, sizeof(float) * (size_t)n * V); /* the extra output changes no logits */
    run(m, ids, n, NULL, NULL, e2); /* without the logits tail: the same norms */
    assert_memory_equal(e, e2, sizeof(float) * (size_t)n * E);
    reference_norms(ids, n, ref);
    double worst = 0;
    for (size_t i = 0; i < (size_t)n * E; i++) {
        const double d = fabs((double)e[i] - ref[i]) / (1.0 + fabs(ref[i]));
        worst = d > worst ? d : worst;
    }
    printf("embeddings: the model's output norm within %.2e of rmsnorm(h_last) * output_norm by hand\n", worst);
    assert_true(worst < 1e-5);
    free(lg), free(lg0), free(e), free(e2), free(ref);
    osp_model_free(m);
}

/* ---- the engine ------------------------------------------------------------------------------ */

typedef struct got {
    bool done;
    osp_finish_reason reason;
    int32_t n_embd;
    float v[512];
    int32_t toks[64];
    int32_t n_toks;
} got;

static void on_output(void *user, const osp_request_output *o) {
    got *g = user;
    for (int32_t i = 0; i < o->num_tokens && g->n_toks < 64; i++) g->toks[g->n_toks++] = o->token_ids[i];
    if (!o->finished) return;
    g->done = true;
    g->reason = o->finish_reason;
    if (o->embedding) {
        assert_true(o->n_embd <= 512);
        g->n_embd = o->n_embd;
        memcpy(g->v, o->embedding, sizeof(float) * (size_t)o->n_embd);
    }
}

static osp_engine *make_engine(int32_t budget, int32_t max_model_len) {
    osp_engine_params p = osp_engine_default_params();
    p.model_path = g_path;
    p.n_threads = 2;
    p.exact = true;
    p.kv_dtype = OSP_KV_DTYPE_F32;
    p.max_model_len = max_model_len;
    p.num_blocks = 64;
    p.block_size = BS;
    p.max_num_batched_tokens = budget;
    p.check_invariants = true;
    osp_engine *e;
    assert_int_equal(osp_engine_create(&p, &e), OSP_OK);
    return e;
}

static void add(osp_engine *e, uint64_t id, const int32_t *ids, int32_t n, osp_pooling p, bool norm, got *g) {
    osp_request_params rp = osp_request_default_params();
    rp.request_id = id;
    rp.prompt = ids;
    rp.num_prompt = n;
    rp.pooling = p;
    rp.embd_normalize = norm;
    rp.max_tokens = p == OSP_POOLING_NONE ? 8 : 0;
    rp.ignore_eos = true;
    rp.callback = on_output;
    rp.callback_user = g;
    memset(g, 0, sizeof *g);
    assert_int_equal(osp_engine_add(e, &rp), OSP_OK);
}

static void drain(osp_engine *e) {
    for (int guard = 0; osp_engine_has_unfinished(e) && guard < 10000; guard++) {
        bool did;
        assert_int_equal(osp_engine_step(e, &did), OSP_OK);
    }
    assert_false(osp_engine_has_unfinished(e));
}

static double max_diff(const float *a, const float *b, int n) {
    double w = 0;
    for (int i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        w = d > w ? d : w;
    }
    return w;
}

static void test_engine_pooling(void **state) {
    (void)state;
    enum { N = 70 };
    int32_t ids[N], other[40];
    osp_engine *e = make_engine(32, 256); /* a 32-token budget: N's prompt runs in 3 chunks */
    const osp_model_config *c = osp_model_config_get(osp_engine_model(e));
    const int E = c->n_embd;
    assert_true(E <= 512);
    for (int i = 0; i < N; i++) ids[i] = (i * 31 + 3) % c->n_vocab;
    for (int i = 0; i < 40; i++) other[i] = (i * 17 + 11) % c->n_vocab;
    float *norms = malloc(sizeof(float) * N * (size_t)E), ref[512];
    reference_norms(ids, N, norms);

    /* a generation request alone, for comparison below */
    got gen_alone, gen;
    add(e, 1, other, 40, OSP_POOLING_NONE, false, &gen_alone);
    drain(e);
    assert_int_equal(gen_alone.n_toks, 8);

    const osp_pooling pools[3] = {OSP_POOLING_MEAN, OSP_POOLING_CLS, OSP_POOLING_LAST};
    double worst = 0;
    for (int norm = 0; norm < 2; norm++) {
        got g[3];
        add(e, 10, other, 40, OSP_POOLING_NONE, false, &gen); /* shares the steps */
        for (int k = 0; k < 3; k++) add(e, 100 + (uint64_t)k, ids, N, pools[k], norm, &g[k]);
        drain(e);
        assert_true(gen.done);
        assert_int_equal(gen.n_toks, 8);
        assert_memory_equal(gen.toks, gen_alone.toks, sizeof(int32_t) * 8);
        for (int k = 0; k < 3; k++) {
            assert_true(g[k].done);
            assert_int_equal(g[k].reason, OSP_FINISH_STOP);
            assert_int_equal(g[k].n_embd, E);
            assert_int_equal(g[k].n_toks, 0);
            reference_pool(norms, N, E, pools[k], norm, ref);
            const double d = max_diff(g[k].v, ref, E);
            worst = d > worst ? d : worst;
            if (norm) {
                double ss = 0;
                for (int i = 0; i < E; i++) ss += (double)g[k].v[i] * g[k].v[i];
                assert_true(fabs(ss - 1.0) < 1e-5);
            }
        }
    }
    printf("embeddings: engine's pooled vectors within %.2e of the hand-pooled reference\n", worst);
    assert_true(worst < 1e-4);

    /* the same prompt again, the prefix cache now holding its blocks: the same vector */
    got again, first;
    add(e, 200, ids, N, OSP_POOLING_MEAN, true, &first);
    drain(e);
    add(e, 201, ids, N, OSP_POOLING_MEAN, true, &again);
    drain(e);
    assert_memory_equal(first.v, again.v, sizeof(float) * (size_t)E);
    /* a prefix of it pooled alone equals the reference over that prefix (causal attention) */
    add(e, 202, ids, 20, OSP_POOLING_MEAN, false, &again);
    drain(e);
    reference_pool(norms, 20, E, OSP_POOLING_MEAN, false, ref);
    assert_true(max_diff(again.v, ref, E) < 1e-4);
    free(norms);
    osp_engine_free(e);
}

static void test_engine_refusals(void **state) {
    (void)state;
    osp_engine *e = make_engine(64, 48);
    int32_t ids[49];
    for (int i = 0; i < 49; i++) ids[i] = i + 1;
    got g;
    /* a prompt of exactly max_model_len: fine for an embedding (nothing is generated) */
    add(e, 1, ids, 48, OSP_POOLING_LAST, true, &g);
    drain(e);
    assert_int_equal(g.reason, OSP_FINISH_STOP);
    osp_request_params rp = osp_request_default_params();
    rp.prompt = ids;
    rp.num_prompt = 49; /* one over */
    rp.pooling = OSP_POOLING_MEAN;
    rp.request_id = 2;
    assert_int_equal(osp_engine_add(e, &rp), OSP_ERR_INVALID_ARG);
    rp.num_prompt = 4;
    rp.n = 2;
    assert_int_equal(osp_engine_add(e, &rp), OSP_ERR_INVALID_ARG);
    rp.n = 1;
    rp.logprobs = 0;
    assert_int_equal(osp_engine_add(e, &rp), OSP_ERR_INVALID_ARG);
    rp.logprobs = -1;
    rp.prompt_logprobs = 1;
    assert_int_equal(osp_engine_add(e, &rp), OSP_ERR_INVALID_ARG);
    rp.prompt_logprobs = -1;
    rp.grammar = "root ::= \"a\"";
    assert_int_equal(osp_engine_add(e, &rp), OSP_ERR_INVALID_ARG);
    rp.grammar = NULL;
    rp.pooling = (osp_pooling)7;
    assert_int_equal(osp_engine_add(e, &rp), OSP_ERR_INVALID_ARG);
    rp.num_prompt = 0;
    rp.pooling = OSP_POOLING_MEAN;
    assert_int_equal(osp_engine_add(e, &rp), OSP_ERR_INVALID_ARG);
    osp_engine_free(e);

    osp_pooling p;
    assert_int_equal(osp_pooling_parse("mean", &p), OSP_OK);
    assert_int_equal(p, OSP_POOLING_MEAN);
    assert_int_equal(osp_pooling_parse("cls", &p), OSP_OK);
    assert_int_equal(p, OSP_POOLING_CLS);
    assert_int_equal(osp_pooling_parse("last", &p), OSP_OK);
    assert_int_equal(p, OSP_POOLING_LAST);
    assert_int_equal(osp_pooling_parse("none", &p), OSP_ERR_INVALID_ARG);
    assert_string_equal(osp_pooling_name(OSP_POOLING_LAST), "last");
}

int main(void) {
    const char *root = getenv("OSPREY_ROOT");
    snprintf(g_path, sizeof g_path, "%s/tests/models/tiny-llama-f32.gguf", root ? root : ".");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_output_norm),
        cmocka_unit_test(test_engine_pooling),
        cmocka_unit_test(test_engine_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
