/* The batched sampler inside the engine, on the tiny random models of tests/models/ (f32 weights, f32
 * KV, check_invariants on: block pool and scheduler after every step; every run ends with all blocks
 * free).
 *
 * Asserts: a seeded request (temperature, top-k, top-p, min-p, penalties, bias) gives identical tokens
 * alone and inside batches of varied composition (unseeded requests next to it, different budgets and
 * arrival orders, chunked prefill); different seeds differ; n = 3 children are forked from the prompt's
 * blocks (block counts after the prefill step: the full blocks shared, one copy-on-write block per
 * child, no prefix-cache lookups), child k equals a lone request with the same seed and
 * sample_index + k, outputs name the child; greedy children are identical; logprobs are finite,
 * descending, and the sampled token's logprob (and the top N) match log_softmax of the logits of a
 * direct forward pass; prompt logprobs (also over more than one step's 64 positions) match the same
 * reference; presence and frequency penalties leave the first token alone and shift the second exactly
 * as the reference predicts, repetition penalty changes the first; NaN logits (a token whose embedding
 * row is NaN, in tiny-qwen3-f32 whose lm_head is untied) fail only the requests that contain it, with OSP_FINISH_ERROR and a message. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "osprey/engine.h"
#include "osprey/gguf.h"
#include "osprey/model.h"
#include "gpu_test_models.h"

/* tests/gpu/test_gpu_engine_sampling.c compiles this file again with TEST_DEVICE OSP_DEVICE_CUDA: the
 * same checks with the model, its KV cache and the sampler on the GPU (the reference forward passes
 * too), on a head_dim-32 model (tiny-d32, written at start: the CUDA attention takes head_dim >= 32)
 * instead of tiny-llama-f32. */
#ifndef TEST_DEVICE
#define TEST_DEVICE OSP_DEVICE_CPU
#endif
static const bool g_gpu = TEST_DEVICE == OSP_DEVICE_CUDA;

#define MAXOUT 64
#define MAXSEQ 8

static char g_tiny[512], g_untied[512]; /* tiny-llama-f32 (tied lm_head), tiny-qwen3-f32 (untied) */

typedef struct req {
    osp_request_params p;
    int32_t prompt[256];
    osp_token_bias bias[2];
    /* results per child */
    int32_t out[MAXSEQ][MAXOUT];
    osp_token_logprobs lp[MAXSEQ][MAXOUT];
    osp_token_logprobs plp[256];
    int32_t n_plp;
    int32_t n_out[MAXSEQ];
    osp_finish_reason why[MAXSEQ];
    char error[160];
    bool done[MAXSEQ];
} req;

static osp_engine_params base(void) {
    osp_engine_params p = osp_engine_default_params();
    p.model_path = g_tiny;
    p.n_threads = 2;
    p.kv_dtype = OSP_KV_DTYPE_F32;
    p.max_model_len = 256;
    p.num_blocks = 128;
    p.max_num_seqs = 16;
    p.check_invariants = true;
    p.hash_seed_set = true;
    p.hash_seed = 7;
    p.device = TEST_DEVICE;
    return p;
}

static void init_req(req *r, uint64_t id, int32_t n_prompt, uint32_t pseed) {
    memset(r, 0, sizeof *r);
    r->p = osp_request_default_params();
    r->p.request_id = id;
    srand(pseed);
    for (int i = 0; i < n_prompt; i++) r->prompt[i] = 3 + rand() % 500;
    r->p.prompt = r->prompt;
    r->p.num_prompt = n_prompt;
    r->p.max_tokens = 16;
    r->p.ignore_eos = true;
}

static int nseq(const req *r) { return r->p.n > 1 ? r->p.n : 1; }

/* Polls every child of r once (no wait). */
static void drain(osp_engine *e, req *r) {
    for (int k = 0; k < nseq(r); k++) {
        if (r->done[k]) continue;
        osp_request_output o;
        const uint32_t si = r->p.sample_index + (uint32_t)k;
        if (osp_engine_poll_seq(e, r->p.request_id, si, r->out[k] + r->n_out[k], r->lp[k] + r->n_out[k],
                                MAXOUT - r->n_out[k], r->plp, &o, 0) != OSP_OK)
            fail_msg("poll %llu/%u: %s", (unsigned long long)r->p.request_id, si, osp_last_error());
        assert_int_equal(o.sample_index, si);
        if (o.num_tokens > 0 && r->p.logprobs >= 0) assert_ptr_equal(o.logprobs, r->lp[k] + r->n_out[k]);
        if (o.num_tokens > 0 && r->p.logprobs < 0) assert_null(o.logprobs);
        if (o.num_prompt_logprobs > 0) {
            assert_int_equal(k, 0);
            assert_int_equal(r->n_plp, 0);
            r->n_plp = o.num_prompt_logprobs;
        }
        r->n_out[k] += o.num_tokens;
        if (o.finished) {
            r->done[k] = true;
            r->why[k] = o.finish_reason;
            if (o.finish_reason == OSP_FINISH_ERROR) snprintf(r->error, sizeof r->error, "%s", o.error);
            else assert_int_equal(o.error[0], 0);
            assert_int_equal(o.num_output_tokens, r->n_out[k]);
        }
    }
}

/* Runs requests [0, n) in one engine with params p; returns stats at the end (all blocks free). */
static osp_engine_stats run(const osp_engine_params *p, req **rs, int n) {
    osp_engine *e;
    if (osp_engine_create(p, &e) != OSP_OK) fail_msg("create: %s", osp_last_error());
    for (int i = 0; i < n; i++)
        if (osp_engine_add(e, &rs[i]->p) != OSP_OK) fail_msg("add: %s", osp_last_error());
    int steps = 0;
    while (osp_engine_has_unfinished(e)) {
        if (osp_engine_step(e, NULL) != OSP_OK) fail_msg("step: %s", osp_last_error());
        for (int i = 0; i < n; i++) drain(e, rs[i]);
        assert_true(++steps < 5000);
    }
    for (int i = 0; i < n; i++) drain(e, rs[i]);
    const osp_engine_stats st = osp_engine_get_stats(e);
    assert_int_equal(osp_engine_check_invariants(e), OSP_OK);
    assert_int_equal(st.num_free_blocks, st.num_blocks);
    osp_engine_free(e);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < nseq(rs[i]); k++) assert_true(rs[i]->done[k]);
    return st;
}

static void run1(const osp_engine_params *p, req *r) { run(p, &r, 1); }

static bool same_tokens(const req *a, int ka, const req *b, int kb) {
    return a->n_out[ka] == b->n_out[kb] && !memcmp(a->out[ka], b->out[kb], sizeof(int32_t) * (size_t)a->n_out[ka]);
}

static void sampled_params(req *r, uint64_t seed) {
    r->p.temperature = 0.9f;
    r->p.top_k = 60;
    r->p.top_p = 0.92f;
    r->p.min_p = 0.01f;
    r->p.presence_penalty = 0.3f;
    r->p.frequency_penalty = 0.2f;
    r->p.repetition_penalty = 1.1f;
    r->bias[0] = (osp_token_bias){.token_id = 7, .bias = 2.0f};
    r->p.logit_bias = r->bias;
    r->p.num_logit_bias = 1;
    r->p.has_seed = true;
    r->p.seed = seed;
}

static void test_seeded_invariance(void **state) {
    (void)state;
    osp_engine_params p = base();
    req *alone = malloc(sizeof *alone), *other = malloc(sizeof *other);
    init_req(alone, 100, 29, 1);
    sampled_params(alone, 4242);
    run1(&p, alone);
    assert_int_equal(alone->n_out[0], 16);

    /* different seed: different tokens */
    init_req(other, 100, 29, 1);
    sampled_params(other, 4243);
    run1(&p, other);
    assert_false(same_tokens(alone, 0, other, 0));

    /* batches: unseeded sampled requests, greedy ones, another copy of the seeded one, the seeded one at
     * different positions, budgets 7 (chunked prefill) and 2048, caching on and off */
    enum { NB = 7 };
    req *b = calloc(NB, sizeof *b);
    for (int variant = 0; variant < 4; variant++) {
        req *rs[NB];
        const int pos = (variant * 3) % NB;
        for (int i = 0; i < NB; i++) {
            init_req(&b[i], (uint64_t)i, 5 + 11 * i, 50 + (uint32_t)i);
            if (i % 3 == 1) b[i].p.temperature = 1.0f; /* unseeded */
            if (i % 3 == 2) b[i].p.logprobs = 3;
            b[i].p.max_tokens = 6 + i;
            rs[i] = &b[i];
        }
        init_req(&b[pos], 100, 29, 1);
        sampled_params(&b[pos], 4242);
        if (variant & 1) b[pos].p.logprobs = 2; /* logprobs do not change the draws */
        init_req(&b[(pos + 2) % NB], 101, 29, 1);
        sampled_params(&b[(pos + 2) % NB], 4242);
        osp_engine_params q = p;
        q.max_num_batched_tokens = variant < 2 ? 7 : 2048;
        q.enable_prefix_caching = variant % 2 == 0;
        run(&q, rs, NB);
        if (!same_tokens(alone, 0, &b[pos], 0)) fail_msg("variant %d: the seeded request differs in a batch", variant);
        assert_true(same_tokens(alone, 0, &b[(pos + 2) % NB], 0));
    }
    /* unseeded requests draw different seeds */
    req *u[2] = {other, alone};
    init_req(u[0], 1, 29, 1);
    init_req(u[1], 2, 29, 1);
    u[0]->p.temperature = u[1]->p.temperature = 1.0f;
    run(&p, u, 2);
    assert_false(same_tokens(u[0], 0, u[1], 0));
    free(b);
    free(alone);
    free(other);
}

static void test_n_children(void **state) {
    (void)state;
    osp_engine_params p = base();
    for (int extra = 0; extra <= 5; extra += 5) { /* 48 tokens: no partial block; 53: copy-on-write */
        req *r = malloc(sizeof *r);
        init_req(r, 9, 48 + extra, 3);
        r->p.temperature = 1.0f;
        r->p.has_seed = true;
        r->p.seed = 77;
        r->p.n = 3;
        r->p.sample_index = 4;
        r->p.logprobs = 1;
        r->p.max_tokens = 12;
        /* block counts after the prefill step */
        osp_engine *e;
        assert_int_equal(osp_engine_create(&p, &e), OSP_OK);
        assert_int_equal(osp_engine_add(e, &r->p), OSP_OK);
        assert_int_equal(osp_engine_step(e, NULL), OSP_OK);
        osp_engine_stats st = osp_engine_get_stats(e);
        assert_int_equal(st.num_running, 3);
        assert_int_equal(st.prefix_hits_tokens, 0);
        assert_int_equal(st.num_blocks - st.num_free_blocks, 3 + (extra ? 1 + 2 : 0)); /* 3 shared (+ cow) */
        assert_int_equal(st.num_generated_tokens, 3);
        while (osp_engine_has_unfinished(e)) {
            assert_int_equal(osp_engine_step(e, NULL), OSP_OK);
            drain(e, r);
        }
        drain(e, r);
        st = osp_engine_get_stats(e);
        assert_int_equal(st.num_free_blocks, st.num_blocks);
        assert_int_equal(st.num_generated_tokens, 36);
        assert_int_equal(osp_engine_check_invariants(e), OSP_OK);
        osp_engine_free(e);
        for (int k = 0; k < 3; k++) {
            assert_int_equal(r->n_out[k], 12);
            assert_int_equal(r->why[k], OSP_FINISH_LENGTH);
            for (int t = 0; t < 12; t++) assert_int_equal(r->lp[k][t].token_id, r->out[k][t]);
        }
        assert_false(same_tokens(r, 0, r, 1));
        assert_false(same_tokens(r, 1, r, 2));
        /* child k alone: seed 77, sample_index 4 + k */
        for (int k = 0; k < 3; k++) {
            req *a = malloc(sizeof *a);
            init_req(a, 10, 48 + extra, 3);
            a->p.temperature = 1.0f;
            a->p.has_seed = true;
            a->p.seed = 77;
            a->p.sample_index = 4 + (uint32_t)k;
            a->p.max_tokens = 12;
            run1(&p, a);
            if (!same_tokens(a, 0, r, k)) fail_msg("child %d differs from its lone request", k);
            free(a);
        }
        free(r);
    }
    /* greedy children are identical; n with other requests and a small budget, aborted siblings */
    req *rs[3];
    for (int i = 0; i < 3; i++) {
        rs[i] = malloc(sizeof *rs[i]);
        init_req(rs[i], (uint64_t)i, 20 + 7 * i, 11 + (uint32_t)i);
        rs[i]->p.n = 2 + i;
    }
    rs[1]->p.temperature = 0.8f;
    osp_engine_params q = p;
    q.max_num_batched_tokens = 9;
    run(&q, rs, 3);
    for (int k = 1; k < 2; k++) assert_true(same_tokens(rs[0], 0, rs[0], k));
    for (int k = 1; k < 4; k++) assert_true(same_tokens(rs[2], 0, rs[2], k));
    for (int i = 0; i < 3; i++) free(rs[i]);
    /* n above max_num_seqs is refused */
    req *big = malloc(sizeof *big);
    init_req(big, 1, 5, 1);
    big->p.n = 17;
    osp_engine *e;
    assert_int_equal(osp_engine_create(&p, &e), OSP_OK);
    assert_int_equal(osp_engine_add(e, &big->p), OSP_ERR_INVALID_ARG);
    osp_engine_free(e);
    free(big);
}

/* log_softmax of the model's logits (raw: the logits) at every position of `prompt` (a direct forward
 * pass). */
static float *reference(const int32_t *prompt, int32_t n, int32_t *vocab, bool raw) {
    osp_model_params mp = osp_model_default_params();
    mp.n_threads = 2;
    mp.device = TEST_DEVICE;
    osp_model *m;
    assert_int_equal(osp_model_load(g_tiny, &mp, &m), OSP_OK);
    const int32_t V = osp_model_config_get(m)->n_vocab, bs = 16, nb = (n + bs - 1) / bs;
    osp_kv_cache *kv;
    assert_int_equal(osp_kv_cache_create(m, nb, bs, OSP_KV_DTYPE_F32, &kv), OSP_OK);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *bt = malloc(sizeof(int32_t) * (size_t)nb);
    for (int32_t i = 0; i < n; i++) pos[i] = i;
    for (int32_t i = 0; i < nb; i++) bt[i] = i;
    const int32_t qsl[2] = {0, n};
    const osp_batch b = {.num_tokens = n, .token_ids = prompt, .positions = pos, .slot_mapping = pos, .num_seqs = 1,
                         .query_start_loc = qsl, .seq_lens = &n, .block_table = bt, .max_blocks_per_seq = nb,
                         .num_logits = n, .logits_indices = pos};
    float *lg = malloc(sizeof(float) * (size_t)n * (size_t)V);
    assert_int_equal(osp_model_forward(m, kv, &b, lg), OSP_OK);
    for (int32_t i = 0; i < n && !raw; i++) {
        float *row = lg + (size_t)i * V;
        double mx = row[0], sum = 0;
        for (int32_t v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
        for (int32_t v = 0; v < V; v++) sum += exp((double)row[v] - mx);
        const double lse = mx + log(sum);
        for (int32_t v = 0; v < V; v++) row[v] = (float)((double)row[v] - lse);
    }
    free(pos);
    free(bt);
    osp_kv_cache_free(kv);
    osp_model_free(m);
    *vocab = V;
    return lg;
}

static float *reference_logprobs(const int32_t *prompt, int32_t n, int32_t *vocab) {
    return reference(prompt, n, vocab, false);
}

static void check_lp(const osp_token_logprobs *l, const float *ref, int32_t V, int32_t n_top, int32_t token) {
    assert_int_equal(l->token_id, token);
    assert_int_equal(l->n_top, n_top);
    assert_true(isfinite(l->logprob) && l->logprob <= 0);
    if (fabsf(l->logprob - ref[token]) > 1e-4f) fail_msg("logprob %g, reference %g", l->logprob, ref[token]);
    int32_t rank = 1;
    for (int32_t v = 0; v < V; v++) rank += ref[v] > ref[token] + 1e-5f;
    assert_true(abs(l->rank - rank) <= 1);
    for (int32_t i = 0; i < n_top; i++) {
        assert_true(isfinite(l->top_logprobs[i]));
        if (i) assert_true(l->top_logprobs[i] <= l->top_logprobs[i - 1]);
        assert_true(fabsf(l->top_logprobs[i] - ref[l->top_ids[i]]) <= 1e-4f);
        int32_t better = 0; /* tokens clearly above the i-th: at most i */
        for (int32_t v = 0; v < V; v++) better += ref[v] > ref[l->top_ids[i]] + 1e-4f;
        assert_true(better <= i);
    }
    if (l->token_id == l->top_ids[0] && n_top > 0) assert_int_equal(l->rank, 1);
}

static void test_logprobs(void **state) {
    (void)state;
    osp_engine_params p = base();
    for (int np = 0; np < 2; np++) {
        const int32_t n = np ? 150 : 21; /* 149 prompt logprobs need three steps of 64 */
        req *r = malloc(sizeof *r);
        init_req(r, 5, n, 21);
        r->p.temperature = 0.7f;
        r->p.top_k = 20;
        r->p.has_seed = true;
        r->p.seed = 3;
        r->p.logprobs = 5;
        r->p.prompt_logprobs = np ? 0 : 3;
        r->p.max_tokens = 1;
        req *other = malloc(sizeof *other); /* same prompt, cached first: the logprob request must skip it */
        init_req(other, 6, n, 21);
        req *rs[2] = {other, r};
        osp_engine_params q = p;
        q.max_num_batched_tokens = np ? 2048 : 8;
        run(&q, rs, 1);
        run(&q, rs, 2);
        int32_t V;
        float *ref = reference_logprobs(r->prompt, n, &V);
        assert_int_equal(r->n_out[0], 1);
        check_lp(&r->lp[0][0], ref + (size_t)(n - 1) * V, V, 5, r->out[0][0]);
        assert_int_equal(r->n_plp, n - 1);
        for (int32_t i = 0; i < n - 1; i++) check_lp(&r->plp[i], ref + (size_t)i * V, V, np ? 0 : 3, r->prompt[i + 1]);
        free(ref);
        free(r);
        free(other);
    }
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void test_penalties(void **state) {
    (void)state;
    osp_engine_params p = base();
    /* a repeated-word prompt whose greedy next token is in the prompt and loses to a repetition penalty
     * (vLLM's rule on the raw logits of prompt tokens: positive / r, negative * r) */
    int32_t prompt[40], V = 0, n = 36, t0 = -1, t_rep = -1;
    float *ref = NULL;
    const float rep = 3.0f;
    for (uint32_t cand = 0; cand < 300 && t0 < 0; cand++) {
        srand(cand);
        int32_t word[4];
        for (int i = 0; i < 4; i++) word[i] = 3 + rand() % 500;
        for (int i = 0; i < n; i++) prompt[i] = word[i % 4];
        free(ref);
        ref = reference(prompt, n, &V, true);
        float *last = ref + (size_t)(n - 1) * V;
        const int32_t g = argmax(last, V);
        bool in_prompt = false;
        for (int i = 0; i < 4; i++) in_prompt |= word[i] == g;
        if (!in_prompt) continue;
        for (int i = 0; i < 4; i++) {
            float *x = &last[word[i]];
            if (i && word[i] == word[0]) continue;
            bool dup = false;
            for (int j = 0; j < i; j++) dup |= word[j] == word[i];
            if (!dup) *x = *x > 0 ? *x / rep : *x * rep;
        }
        const int32_t gr = argmax(last, V);
        if (gr != g) t0 = g, t_rep = gr;
    }
    assert_true(t0 >= 0);
    free(ref);
    ref = reference_logprobs(prompt, n, &V);
    req *r = malloc(sizeof *r);
    int32_t first[4], second[4];
    for (int kind = 0; kind < 4; kind++) { /* none, presence, frequency, repetition */
        init_req(r, 1, n, 0);
        memcpy(r->prompt, prompt, sizeof(int32_t) * (size_t)n);
        r->p.max_tokens = 2;
        if (kind == 1) r->p.presence_penalty = 1.5f;
        if (kind == 2) r->p.frequency_penalty = 1.5f;
        if (kind == 3) r->p.repetition_penalty = rep;
        run1(&p, r);
        first[kind] = r->out[0][0];
        second[kind] = r->out[0][1];
    }
    assert_int_equal(first[0], t0);
    assert_int_equal(first[1], t0); /* presence / frequency count generated tokens only */
    assert_int_equal(first[2], t0);
    /* the second token: reference logits after prompt + t0, minus the penalty on t0 */
    int32_t P2[41];
    memcpy(P2, prompt, sizeof(int32_t) * (size_t)n);
    P2[n] = t0;
    int32_t V2;
    float *ref2 = reference_logprobs(P2, n + 1, &V2);
    float *l2 = ref2 + (size_t)n * V2;
    assert_int_equal(second[0], argmax(l2, V2));
    l2[t0] -= 1.5f;
    assert_int_equal(second[1], argmax(l2, V2));
    assert_int_equal(second[2], argmax(l2, V2));
    assert_int_equal(first[3], t_rep); /* repetition counts the prompt: the first token changes */
    free(ref2);
    free(ref);
    free(r);
}

/* A copy of the untied f32 model whose token `bad`'s embedding row is NaN (with a tied lm_head every
 * request would get a NaN logit for `bad`). */
static void make_nan_model(char *path, size_t cap, int32_t bad) {
    snprintf(path, cap, "/tmp/osp_nan_model_%d.gguf", (int)getpid());
    FILE *in = fopen(g_untied, "rb"), *out = fopen(path, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[1 << 16];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, in)) > 0) assert_int_equal(fwrite(buf, 1, k, out), k);
    fclose(in);
    osp_gguf *g;
    assert_int_equal(osp_gguf_open(g_untied, &g), OSP_OK);
    assert_non_null(osp_gguf_find_tensor(g, "output.weight"));
    const osp_gguf_tensor *t = osp_gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->type, 0); /* f32 */
    const uint64_t off = osp_gguf_data_offset(g) + t->offset + (uint64_t)bad * (uint64_t)t->ne[0] * 4;
    const int64_t E = t->ne[0];
    osp_gguf_close(g);
    assert_int_equal(fseek(out, (long)off, SEEK_SET), 0);
    const float nan = NAN;
    for (int64_t i = 0; i < E; i++) assert_int_equal(fwrite(&nan, 4, 1, out), 1);
    fclose(out);
}

static void test_nan_logits(void **state) {
    (void)state;
    char path[256];
    const int32_t bad = 2; /* init_req draws ids >= 3 */
    make_nan_model(path, sizeof path, bad);
    osp_engine_params p = base();
    p.model_path = path;
    p.exact = true; /* fp32 activations: the int8 quantizer's float-to-int conversion of NaN is UB (UBSan) */
    req *rs[4];
    for (int i = 0; i < 4; i++) {
        rs[i] = malloc(sizeof *rs[i]);
        init_req(rs[i], (uint64_t)i, 10 + i, 30 + (uint32_t)i);
        rs[i]->p.temperature = i % 2 ? 1.0f : 0.0f;
        rs[i]->p.logprobs = i == 1 ? 2 : -1;
    }
    /* The requests that must succeed may not sample the NaN token themselves (the sampled ones draw
     * an entropy seed each run): a -100 bias removes it from their distribution. */
    const osp_token_bias no_bad = {bad, -100.0f};
    for (int i = 0; i < 4; i += 3) {
        rs[i]->p.logit_bias = &no_bad;
        rs[i]->p.num_logit_bias = 1;
    }
    rs[1]->prompt[4] = bad; /* a sampled request and one with children fail */
    rs[2]->prompt[9] = bad;
    rs[2]->p.n = 2;
    run(&p, rs, 4);
    for (int i = 0; i < 4; i++) {
        const bool fails = i == 1 || i == 2;
        for (int k = 0; k < nseq(rs[i]); k++) {
            if (rs[i]->why[k] != (fails ? OSP_FINISH_ERROR : OSP_FINISH_LENGTH))
                fail_msg("request %d child %d: finish %d (%s), %d tokens", i, k, rs[i]->why[k], rs[i]->error, rs[i]->n_out[k]);
            assert_int_equal(rs[i]->n_out[k], fails ? 0 : 16);
        }
        if (fails && !strstr(rs[i]->error, "non-finite")) fail_msg("error message: '%s'", rs[i]->error);
    }
    /* prompt logprobs over the NaN position fail the request as well */
    req *q = rs[1];
    init_req(q, 8, 12, 3);
    q->prompt[3] = bad;
    q->p.prompt_logprobs = 1;
    run(&p, &q, 1);
    assert_int_equal(q->why[0], OSP_FINISH_ERROR);
    for (int i = 0; i < 4; i++) free(rs[i]);
    unlink(path);
}

static void test_bad_params(void **state) {
    (void)state;
    osp_engine_params p = base();
    osp_engine *e;
    assert_int_equal(osp_engine_create(&p, &e), OSP_OK);
    req *r = malloc(sizeof *r);
    for (int c = 0; c < 7; c++) {
        init_req(r, 1, 5, 1);
        switch (c) {
        case 0: r->p.top_p = 1.5f; break;
        case 1: r->p.min_p = -0.1f; break;
        case 2: r->p.temperature = NAN; break;
        case 3: r->p.logprobs = 21; break;
        case 4: r->p.prompt_logprobs = 99; break;
        case 5:
            r->bias[0] = (osp_token_bias){.token_id = 1 << 20, .bias = 1};
            r->p.logit_bias = r->bias;
            r->p.num_logit_bias = 1;
            break;
        default: r->p.repetition_penalty = -1; break;
        }
        assert_int_equal(osp_engine_add(e, &r->p), OSP_ERR_INVALID_ARG);
    }
    assert_false(osp_engine_has_unfinished(e));
    osp_engine_free(e);
    free(r);
}

int main(void) {
    const char *root = getenv("OSPREY_ROOT");
    if (!root) root = ".";
    snprintf(g_tiny, sizeof g_tiny, "%s/tests/models/tiny-llama-f32.gguf", root);
    if (g_gpu && osp_device_count(OSP_DEVICE_CUDA) == 0) {
        printf("test_gpu_engine_sampling: skipped: no CUDA device\n");
        return 77;
    }
    if (g_gpu && gpu_test_model("gpu-sampling", "f32", g_tiny, sizeof g_tiny) != 0) return 1;
    FILE *f = fopen(g_tiny, "rb");
    if (!f) {
        fprintf(stderr, "SKIP: %s missing\n", g_tiny);
        return 77;
    }
    fclose(f);
    snprintf(g_untied, sizeof g_untied, "%s/tests/models/tiny-qwen3-f32.gguf", root);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seeded_invariance), cmocka_unit_test(test_n_children),
        cmocka_unit_test(test_logprobs),          cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_nan_logits),        cmocka_unit_test(test_bad_params),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (g_gpu) remove(g_tiny);
    return rc;
}
