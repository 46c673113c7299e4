/* Sampler behaviour beyond distributions: seeds and batch independence, penalty bookkeeping, logit
 * bias and min_tokens, edge parameters, logprobs, per-row errors. All deterministic (fixed seeds). */
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

#include "sample/rng.h"
#include "sample/sampler.h"

#define V 300

static void fill_logits(float *l, int n, uint64_t salt) {
    for (int i = 0; i < n; i++) l[i] = (float)(6.0 * osp_rng_uniform_at(salt, 0, (uint64_t)i, 0) - 3.0);
}

/* ---- seeds -------------------------------------------------------------------------------- */

/* The seeded row R gives the same tokens alone and inside batches of different sizes, positions
 * and neighbours (seeded and unseeded), with 1 or 2 threads. */
static void test_seed_batch_invariance(void **state) {
    (void)state;
    enum { STEPS = 200, MAXB = 9 };
    static float logits[MAXB * V];
    osp_sampler_row r = osp_sampler_row_default();
    r.temperature = 0.9f, r.top_k = 40, r.top_p = 0.9f, r.min_p = 0.01f, r.seed = 42, r.sample_index = 1;
    float mine[V];
    fill_logits(mine, V, 7);
    int32_t alone[STEPS];
    osp_sampler_workspace *ws1, *ws2;
    assert_int_equal(osp_sampler_workspace_create(MAXB, V, 1, &ws1), OSP_OK);
    assert_int_equal(osp_sampler_workspace_create(MAXB, V, 2, &ws2), OSP_OK);
    osp_status st[MAXB];
    for (int s = 0; s < STEPS; s++) {
        r.output_pos = (uint64_t)s;
        assert_int_equal(osp_sample_batch(ws1, mine, 1, V, &r, &alone[s], NULL, st), OSP_OK);
    }
    for (int trial = 0; trial < 6; trial++) {
        const int b = 2 + trial, at = trial % b;
        osp_sampler_workspace *ws = trial % 2 ? ws2 : ws1;
        osp_sampler_row rows[MAXB];
        for (int s = 0; s < STEPS; s++) {
            for (int i = 0; i < b; i++) {
                if (i == at) {
                    rows[i] = r;
                    memcpy(logits + i * V, mine, sizeof mine);
                } else {
                    rows[i] = osp_sampler_row_default();
                    rows[i].top_k = 5 * i;
                    rows[i].top_p = i % 2 ? 0.8f : 1.0f;
                    /* neighbours: half seeded with other seeds, half "unseeded" (a fresh seed) */
                    rows[i].seed = i % 2 ? (uint64_t)(1000 + i) : osp_rng_entropy_seed();
                    fill_logits(logits + i * V, V, (uint64_t)(trial * 100 + i + s));
                }
                rows[i].output_pos = (uint64_t)s;
            }
            int32_t tok[MAXB];
            assert_int_equal(osp_sample_batch(ws, logits, b, V, rows, tok, NULL, st), OSP_OK);
            assert_int_equal(tok[at], alone[s]);
        }
    }
    /* the caller-threaded entry gives the same tokens as the batch call, slot by slot */
    {
        osp_sampler_row rows[3] = {r, r, r};
        rows[1].seed = 5, rows[2].top_k = 3;
        static float l3[3 * V];
        for (int i = 0; i < 3; i++) memcpy(l3 + i * V, mine, sizeof mine);
        for (int s = 0; s < 50; s++) {
            for (int i = 0; i < 3; i++) rows[i].output_pos = (uint64_t)s;
            int32_t a[3], b[3];
            osp_status sa[3], sb[3];
            assert_int_equal(osp_sample_batch(ws2, l3, 3, V, rows, a, NULL, sa), OSP_OK);
            assert_int_equal(osp_sample_rows(ws2, 1, l3, 0, 2, V, rows, b, NULL, sb), OSP_OK);
            assert_int_equal(osp_sample_rows(ws2, 0, l3, 2, 3, V, rows, b, NULL, sb), OSP_OK);
            for (int i = 0; i < 3; i++) assert_int_equal(a[i], b[i]);
        }
        int32_t b[3];
        osp_status sb[3];
        assert_int_equal(osp_sample_rows(ws2, 2, l3, 0, 1, V, rows, b, NULL, sb), OSP_ERR_INVALID_ARG);
    }
    /* different seeds, or different sample indices of one seed, give different sequences */
    for (int variant = 0; variant < 2; variant++) {
        osp_sampler_row o = r;
        if (variant == 0) o.seed = 43;
        else o.sample_index = 2;
        int same = 0;
        for (int s = 0; s < STEPS; s++) {
            int32_t t;
            o.output_pos = (uint64_t)s;
            assert_int_equal(osp_sample_batch(ws1, mine, 1, V, &o, &t, NULL, st), OSP_OK);
            same += t == alone[s];
        }
        printf("  variant %d: %d of %d tokens equal to seed 42 / sample 1\n", variant, same, STEPS);
        assert_true(same < STEPS / 2);
    }
    osp_sampler_workspace_free(ws1);
    osp_sampler_workspace_free(ws2);
    /* entropy seeds differ */
    assert_true(osp_rng_entropy_seed() != osp_rng_entropy_seed());
}

/* ---- penalties, bias, min_tokens ---------------------------------------------------------- */

static int32_t greedy(const float *l, int n, const osp_sampler_row *r) {
    osp_sampler_workspace *ws;
    assert_int_equal(osp_sampler_workspace_create(1, n, 1, &ws), OSP_OK);
    int32_t t = -1;
    osp_status st;
    assert_int_equal(osp_sample_batch(ws, l, 1, n, r, &t, NULL, &st), OSP_OK);
    osp_sampler_workspace_free(ws);
    return t;
}

static void test_penalties(void **state) {
    (void)state;
    float l[16];
    for (int i = 0; i < 16; i++) l[i] = -2.0f + 0.01f * (float)i;
    l[5] = 3.0f, l[7] = 2.5f;
    /* a prompt that repeats one word: token 5 */
    const int32_t prompt[] = {5, 5, 5, 5, 5, 5, 9, 5};
    osp_sampler_row r = osp_sampler_row_default();
    r.temperature = 0.0f;
    r.prompt_ids = prompt, r.n_prompt = 8;
    /* presence and frequency count generated tokens only: the first token is unchanged */
    r.presence_penalty = 2.0f, r.frequency_penalty = 2.0f;
    assert_int_equal(greedy(l, 16, &r), 5);
    /* ... and sampling at T = 1 gives exactly the same draws as without them */
    {
        osp_sampler_row a = r, b = osp_sampler_row_default();
        a.temperature = b.temperature = 1.0f, a.seed = b.seed = 5;
        osp_sampler_workspace *ws;
        assert_int_equal(osp_sampler_workspace_create(2, 16, 1, &ws), OSP_OK);
        for (int s = 0; s < 300; s++) {
            osp_sampler_row rows[2] = {a, b};
            rows[0].output_pos = rows[1].output_pos = (uint64_t)s;
            float l2[32];
            memcpy(l2, l, sizeof l), memcpy(l2 + 16, l, sizeof l);
            int32_t t[2];
            osp_status st[2];
            assert_int_equal(osp_sample_batch(ws, l2, 2, 16, rows, t, NULL, st), OSP_OK);
            assert_int_equal(t[0], t[1]);
        }
        osp_sampler_workspace_free(ws);
    }
    /* the repetition penalty counts the prompt: 3.0 / 1.25 = 2.4 < 2.5 */
    r.presence_penalty = r.frequency_penalty = 0.0f;
    r.repetition_penalty = 1.25f;
    assert_int_equal(greedy(l, 16, &r), 7);
    r.repetition_penalty = 1.1f; /* 2.73 > 2.5 */
    assert_int_equal(greedy(l, 16, &r), 5);
    /* negative logits are multiplied: -1.0 * 1.25 = -1.25 < -1.2 */
    float n[16];
    for (int i = 0; i < 16; i++) n[i] = -5.0f;
    n[5] = -1.0f, n[7] = -1.2f;
    r.repetition_penalty = 1.25f;
    assert_int_equal(greedy(n, 16, &r), 7);
    /* frequency: output [5, 5] -> 3.0 - 2 * 0.3 = 2.4 < 2.5; output [5] -> 2.7 */
    const int32_t out2[] = {5, 5};
    osp_sampler_row f = osp_sampler_row_default();
    f.temperature = 0.0f, f.frequency_penalty = 0.3f, f.output_ids = out2;
    f.n_output = 2;
    assert_int_equal(greedy(l, 16, &f), 7);
    f.n_output = 1;
    assert_int_equal(greedy(l, 16, &f), 5);
    /* presence: output [5] or [5, 5] -> 3.0 - 0.6 = 2.4 either way */
    f.frequency_penalty = 0.0f, f.presence_penalty = 0.6f;
    assert_int_equal(greedy(l, 16, &f), 7);
    f.presence_penalty = 0.4f;
    f.n_output = 2;
    assert_int_equal(greedy(l, 16, &f), 5);
    /* the workspace scratch is left clean: the same row again gives the same answer */
    assert_int_equal(greedy(l, 16, &f), 5);
}

static void test_bias_and_min_tokens(void **state) {
    (void)state;
    float l[V];
    fill_logits(l, V, 3);
    l[11] = 9.0f; /* "EOS" is the most likely token */
    osp_sampler_row r = osp_sampler_row_default();
    r.temperature = 0.0f;
    assert_int_equal(greedy(l, V, &r), 11);
    const osp_logit_bias bias[] = {{42, 20.0f}};
    r.logit_bias = bias, r.n_logit_bias = 1;
    assert_int_equal(greedy(l, V, &r), 42);
    r.n_logit_bias = 0;
    const int32_t stop[] = {11, 12};
    const int32_t out[] = {1, 2, 3};
    r.stop_token_ids = stop, r.n_stop_token_ids = 2, r.min_tokens = 4, r.output_ids = out, r.n_output = 3;
    assert_true(greedy(l, V, &r) != 11);
    r.min_tokens = 3; /* reached */
    assert_int_equal(greedy(l, V, &r), 11);
    /* sampling: the masked ids never appear while below min_tokens */
    r.min_tokens = 10, r.temperature = 1.0f;
    osp_sampler_workspace *ws;
    assert_int_equal(osp_sampler_workspace_create(1, V, 1, &ws), OSP_OK);
    for (int s = 0; s < 2000; s++) {
        int32_t t;
        osp_status st;
        r.output_pos = (uint64_t)s;
        assert_int_equal(osp_sample_batch(ws, l, 1, V, &r, &t, NULL, &st), OSP_OK);
        assert_true(t != 11 && t != 12 && t >= 0 && t < V);
    }
    /* every token masked: the row fails cleanly */
    const int32_t all[3] = {0, 1, 2};
    float l3[3] = {0.0f, 1.0f, 2.0f};
    osp_sampler_row m = osp_sampler_row_default();
    m.stop_token_ids = all, m.n_stop_token_ids = 3, m.min_tokens = 1;
    osp_sampler_workspace *w3;
    assert_int_equal(osp_sampler_workspace_create(1, 3, 1, &w3), OSP_OK);
    int32_t t = -1;
    osp_status st;
    assert_int_equal(osp_sample_batch(w3, l3, 1, 3, &m, &t, NULL, &st), OSP_ERR_INVALID_ARG);
    assert_int_equal(st, OSP_ERR_INVALID_ARG);
    assert_int_equal(t, 0);
    osp_sampler_workspace_free(w3);
    osp_sampler_workspace_free(ws);
}

/* ---- edges -------------------------------------------------------------------------------- */

static void test_edges(void **state) {
    (void)state;
    float l[V];
    fill_logits(l, V, 9);
    int best = 0;
    for (int i = 1; i < V; i++) best = l[i] > l[best] ? i : best;
    osp_sampler_workspace *ws;
    assert_int_equal(osp_sampler_workspace_create(1, V, 1, &ws), OSP_OK);
    /* always the argmax: temperature 0, top_k 1, top_p 0, min_p 1, tiny temperature */
    const struct { float t, p, mp; int k; } am[] = {{0.0f, 1.0f, 0.0f, 0}, {1.0f, 1.0f, 0.0f, 1}, {1.0f, 0.0f, 0.0f, 0},
                                                    {1.0f, 1.0f, 1.0f, 0}, {1e-3f, 1.0f, 0.0f, 0}, {5.0f, 0.0f, 0.0f, 7}};
    for (size_t c = 0; c < sizeof am / sizeof am[0]; c++)
        for (int s = 0; s < 200; s++) {
            osp_sampler_row r = osp_sampler_row_default();
            r.temperature = am[c].t, r.top_p = am[c].p, r.min_p = am[c].mp, r.top_k = am[c].k;
            r.seed = 3, r.output_pos = (uint64_t)s;
            int32_t t;
            osp_status st;
            assert_int_equal(osp_sample_batch(ws, l, 1, V, &r, &t, NULL, &st), OSP_OK);
            assert_int_equal(t, best);
        }
    /* off values are the same stream as no filter: top_k 0, -1, > vocab; top_p 1; min_p 0 */
    for (int s = 0; s < 300; s++) {
        int32_t ref = -1;
        for (int c = 0; c < 5; c++) {
            osp_sampler_row r = osp_sampler_row_default();
            r.seed = 8, r.output_pos = (uint64_t)s;
            if (c == 1) r.top_k = -1;
            if (c == 2) r.top_k = V + 5;
            if (c == 3) r.top_p = 1.0f;
            if (c == 4) r.min_p = 0.0f;
            int32_t t;
            osp_status st;
            assert_int_equal(osp_sample_batch(ws, l, 1, V, &r, &t, NULL, &st), OSP_OK);
            if (c == 0) ref = t;
            assert_int_equal(t, ref);
        }
    }
    /* greedy ties: lowest id */
    float eq[V];
    for (int i = 0; i < V; i++) eq[i] = 0.5f;
    osp_sampler_row g = osp_sampler_row_default();
    g.temperature = 0.0f;
    int32_t t;
    osp_status st;
    assert_int_equal(osp_sample_batch(ws, eq, 1, V, &g, &t, NULL, &st), OSP_OK);
    assert_int_equal(t, 0);
    osp_sampler_workspace_free(ws);
}

/* ---- logprobs ----------------------------------------------------------------------------- */

static void test_logprobs(void **state) {
    (void)state;
    float l[V];
    fill_logits(l, V, 21);
    l[3] = l[4] = 2.9f; /* a tie in the top list */
    double mx = -1e30, sum = 0.0;
    for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < V; i++) sum += exp((double)l[i] - mx);
    const double lse = mx + log(sum);
    osp_sampler_workspace *ws;
    assert_int_equal(osp_sampler_workspace_create(1, V, 1, &ws), OSP_OK);
    osp_sampler_row r = osp_sampler_row_default();
    r.num_logprobs = 20, r.temperature = 0.3f, r.repetition_penalty = 3.0f, r.top_k = 5, r.seed = 1;
    const int32_t prompt[] = {3, 4, 10};
    r.prompt_ids = prompt, r.n_prompt = 3;
    int32_t t;
    osp_status st;
    osp_logprobs lp;
    assert_int_equal(osp_sample_batch(ws, l, 1, V, &r, &t, &lp, &st), OSP_OK);
    /* raw distribution: penalties and temperature do not enter */
    assert_int_equal(lp.token_id, t);
    assert_true(fabs(lp.logprob - ((double)l[t] - lse)) < 1e-5);
    int above = 0;
    for (int i = 0; i < V; i++) above += l[i] > l[t];
    assert_int_equal(lp.rank, above + 1);
    assert_int_equal(lp.n_top, 20);
    for (int j = 0; j < 20; j++) {
        assert_true(fabs(lp.top_logprobs[j] - ((double)l[lp.top_ids[j]] - lse)) < 1e-5);
        if (j) assert_true(lp.top_logprobs[j] < lp.top_logprobs[j - 1] ||
                           (lp.top_logprobs[j] == lp.top_logprobs[j - 1] && lp.top_ids[j] > lp.top_ids[j - 1]));
        int gt = 0;
        for (int i = 0; i < V; i++) gt += l[i] > l[lp.top_ids[j]];
        assert_true(gt <= j); /* it is a true top-20 entry */
    }
    /* floor: a logit 20000 below the max is -9999, never -inf */
    float f[4] = {0.0f, -20000.0f, -1.0f, -3e38f};
    osp_logprobs pl[2];
    const int32_t next[2] = {1, 3};
    osp_status ps[2];
    float f2[8];
    memcpy(f2, f, sizeof f), memcpy(f2 + 4, f, sizeof f);
    assert_int_equal(osp_prompt_logprobs(f2, 2, 4, next, 4, pl, ps), OSP_OK);
    assert_true(pl[0].logprob == OSP_LOGPROB_FLOOR && pl[1].logprob == OSP_LOGPROB_FLOOR);
    assert_int_equal(pl[0].n_top, 4);
    assert_int_equal(pl[0].top_ids[0], 0);
    assert_int_equal(pl[0].top_ids[3], 3);
    assert_true(isfinite(pl[0].top_logprobs[3]) && pl[0].top_logprobs[3] == OSP_LOGPROB_FLOOR);
    assert_int_equal(pl[1].rank, 4);
    /* prompt logprobs: bad next id and non-finite rows fail alone */
    const int32_t bad_next[2] = {7, 0};
    assert_int_equal(osp_prompt_logprobs(f2, 2, 4, bad_next, 2, pl, ps), OSP_ERR_INVALID_ARG);
    assert_int_equal(ps[0], OSP_ERR_INVALID_ARG);
    assert_int_equal(ps[1], OSP_OK);
    assert_int_equal(pl[1].top_ids[0], 0);
    osp_sampler_workspace_free(ws);
}

/* ---- errors ------------------------------------------------------------------------------- */

static void test_bad_rows(void **state) {
    (void)state;
    enum { B = 7 };
    static float l[B * V];
    osp_sampler_row rows[B];
    for (int i = 0; i < B; i++) {
        fill_logits(l + i * V, V, (uint64_t)i);
        rows[i] = osp_sampler_row_default();
        rows[i].top_k = 10, rows[i].seed = (uint64_t)i, rows[i].num_logprobs = 3;
    }
    l[1 * V + 17] = NAN;
    l[2 * V + 0] = INFINITY;
    l[3 * V + V - 1] = -INFINITY;
    rows[4].top_p = 1.5f;
    rows[5].temperature = -1.0f;
    osp_sampler_workspace *ws;
    assert_int_equal(osp_sampler_workspace_create(B, V, 2, &ws), OSP_OK);
    int32_t t[B];
    osp_status st[B];
    osp_logprobs lp[B];
    assert_int_equal(osp_sample_batch(ws, l, B, V, rows, t, lp, st), OSP_ERR_INVALID_ARG);
    printf("  last error: %s\n", osp_last_error());
    assert_non_null(strstr(osp_last_error(), "row 1"));
    const osp_status want[B] = {OSP_OK, OSP_ERR_INVALID_ARG, OSP_ERR_INVALID_ARG, OSP_ERR_INVALID_ARG,
                                OSP_ERR_INVALID_ARG, OSP_ERR_INVALID_ARG, OSP_OK};
    for (int i = 0; i < B; i++) {
        assert_int_equal(st[i], want[i]);
        assert_true(t[i] >= 0 && t[i] < V);
    }
    /* bad calls write nothing and fail */
    assert_int_equal(osp_sample_batch(ws, l, B + 1, V, rows, t, lp, st), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_sample_batch(ws, l, B, V + 1, rows, t, lp, st), OSP_ERR_INVALID_ARG);
    osp_sampler_workspace_free(ws);
    /* the one-row call */
    float w[2 * V];
    osp_sampling_params p = osp_sampling_default_params();
    p.top_k = 40, p.top_p = 0.95f, p.temperature = 0.8f;
    int32_t tok = -1;
    assert_int_equal(osp_sample(l, V, &p, 0, w, &tok), OSP_OK);
    assert_true(tok >= 0 && tok < V);
    assert_int_equal(osp_sample(l + V, V, &p, 0, w, &tok), OSP_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_batch_invariance), cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_bias_and_min_tokens),   cmocka_unit_test(test_edges),
        cmocka_unit_test(test_logprobs),              cmocka_unit_test(test_bad_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
