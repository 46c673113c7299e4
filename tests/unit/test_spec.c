/* Speculative decoding's pieces without a model (issue 14): the n-gram proposer's choices (longest n
 * first, earliest match, overlap, never past the end, k, short sequences), the --speculative-config
 * parser (vLLM's keys and defaults, one error per kind of mistake), point-mass verification, and the
 * general accept / resample rule, whose output must follow the target distribution p whatever the
 * draft distribution q (chi-square and total variation over many draws, Leviathan et al. 2023 §2.3),
 * with q a point mass giving the same distribution as drawing from p and matching. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "osprey/spec.h"
#include "spec/proposer.h"
#include "spec/switch.h"
#include "spec/verify.h"

static int32_t propose(const int32_t *t, int32_t n, int32_t lo, int32_t hi, int32_t k, int32_t *d) {
    for (int32_t i = 0; i < 8; i++) d[i] = -7;
    return osp_ngram_propose(t, n, lo, hi, k, d);
}

static void test_ngram(void **state) {
    (void)state;
    int32_t d[8];
    /* "1 2 3 4 5 ... 1 2 3": the suffix 1 2 3 matched at 0, drafts 4 5 6 */
    const int32_t a[] = {1, 2, 3, 4, 5, 6, 7, 1, 2, 3};
    assert_int_equal(propose(a, 10, 1, 3, 3, d), 3);
    assert_int_equal(d[0], 4), assert_int_equal(d[1], 5), assert_int_equal(d[2], 6);
    assert_int_equal(d[3], -7); /* nothing past k written */
    /* k larger than what follows the match: stops at the sequence's end, never wraps */
    assert_int_equal(propose(a, 10, 3, 3, 8, d), 7);
    assert_int_equal(d[6], 3);
    /* the longest n wins over an earlier shorter match: "9 3" occurs at 1, "2 3" (n = 2) at 3 */
    const int32_t b[] = {5, 9, 3, 2, 3, 8, 2, 3};
    assert_int_equal(propose(b, 8, 1, 2, 2, d), 2);
    assert_int_equal(d[0], 8), assert_int_equal(d[1], 2);
    /* n = 1 only: the earliest "3", at 2, drafts 2 3 */
    assert_int_equal(propose(b, 8, 1, 1, 2, d), 2);
    assert_int_equal(d[0], 2), assert_int_equal(d[1], 3);
    /* min_n above any match: nothing */
    assert_int_equal(propose(b, 8, 3, 4, 2, d), 0);
    assert_int_equal(d[0], -7);
    /* a repeated token: the match may overlap the suffix ("7 7" at 0, drafts 7 7 7 then the end) */
    const int32_t c[] = {7, 7, 7, 7};
    assert_int_equal(propose(c, 4, 2, 2, 5, d), 2);
    assert_int_equal(d[0], 7), assert_int_equal(d[1], 7);
    /* too short for a match, k <= 0 */
    assert_int_equal(propose(c, 1, 1, 1, 5, d), 0);
    assert_int_equal(propose(c, 2, 2, 2, 5, d), 0);
    assert_int_equal(propose(a, 10, 1, 3, 0, d), 0);
    /* the last token alone must not match itself */
    const int32_t e[] = {1, 2, 3};
    assert_int_equal(propose(e, 3, 1, 3, 4, d), 0);
    /* the proposer object drafts the same */
    osp_spec_config cfg = {.method = OSP_SPEC_NGRAM, .num_speculative_tokens = 3, .prompt_lookup_min = 1,
                           .prompt_lookup_max = 3};
    osp_proposer *p;
    assert_int_equal(osp_proposer_create(&cfg, NULL, &p), OSP_OK);
    assert_string_equal(p->ops->name, "ngram");
    int32_t d2[2][3];
    osp_spec_seq s[2] = {{.uid = 1, .tokens = a, .num_tokens = 10, .num_prompt = 4, .max_draft = 3, .draft = d2[0]},
                         {.uid = 2, .tokens = b, .num_tokens = 8, .num_prompt = 8, .max_draft = 1, .draft = d2[1]}};
    assert_int_equal(p->ops->propose(p, s, 2), OSP_OK);
    assert_int_equal(s[0].num_draft, 3);
    assert_int_equal(d2[0][2], 6);
    assert_int_equal(s[1].num_draft, 1);
    assert_int_equal(d2[1][0], 8);
    osp_proposer_destroy(p);
    cfg.method = OSP_SPEC_NONE;
    assert_int_equal(osp_proposer_create(&cfg, NULL, &p), OSP_ERR_INVALID_ARG);
}

static void test_config(void **state) {
    (void)state;
    osp_spec_config c = {.method = (osp_spec_method)99};
    assert_int_equal(osp_spec_config_parse(NULL, &c), OSP_OK);
    assert_int_equal(c.method, OSP_SPEC_NONE);
    assert_int_equal(osp_spec_config_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 4}", &c), OSP_OK);
    assert_int_equal(c.method, OSP_SPEC_NGRAM);
    assert_int_equal(c.num_speculative_tokens, 4);
    assert_int_equal(c.prompt_lookup_min, 5); /* vLLM: both absent = 5, 5 */
    assert_int_equal(c.prompt_lookup_max, 5);
    assert_int_equal(osp_spec_config_parse("{\"method\":\"[ngram]\",\"num_speculative_tokens\":2,\"prompt_lookup_max\":3}",
                                           &c), OSP_OK);
    assert_int_equal(c.prompt_lookup_min, 3); /* one absent = the other */
    assert_int_equal(c.prompt_lookup_max, 3);
    assert_int_equal(osp_spec_config_parse("{\"method\":\"ngram\",\"num_speculative_tokens\":2,\"prompt_lookup_min\":2}",
                                           &c), OSP_OK);
    assert_int_equal(c.prompt_lookup_max, 2);
    /* quantspec: k only (the target drafts for itself) */
    assert_int_equal(osp_spec_config_parse("{\"method\": \"quantspec\", \"num_speculative_tokens\": 5}", &c), OSP_OK);
    assert_int_equal(c.method, OSP_SPEC_QUANTSPEC);
    assert_int_equal(c.num_speculative_tokens, 5);
    assert_string_equal(c.model, "");
    assert_string_equal(osp_spec_method_name(c.method), "quantspec");
    assert_int_equal(osp_spec_config_check(&c), OSP_OK);
    /* a number without a fractional part is that integer (vLLM's config takes 3.0); 2.5 is refused below */
    assert_int_equal(osp_spec_config_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 3.0, "
                                           "\"prompt_lookup_max\": 4.0}", &c), OSP_OK);
    assert_int_equal(c.num_speculative_tokens, 3);
    assert_int_equal(c.prompt_lookup_max, 4);
    assert_int_equal(osp_spec_config_parse("{\"method\":\"ngram\",\"num_speculative_tokens\":7,\"prompt_lookup_min\":1,"
                                           "\"prompt_lookup_max\":4}", &c), OSP_OK);
    assert_int_equal(c.num_speculative_tokens, 7);
    assert_int_equal(c.prompt_lookup_min, 1);
    assert_int_equal(c.prompt_lookup_max, 4);
    assert_string_equal(osp_spec_method_name(c.method), "ngram");
    /* draft_model: the path kept; a model without a method is a draft model (vLLM infers it) */
    assert_int_equal(osp_spec_config_parse("{\"method\": \"draft_model\", \"model\": \"/m/d.gguf\", "
                                           "\"num_speculative_tokens\": 3}", &c), OSP_OK);
    assert_int_equal(c.method, OSP_SPEC_DRAFT_MODEL);
    assert_string_equal(c.model, "/m/d.gguf");
    assert_int_equal(c.num_speculative_tokens, 3);
    assert_string_equal(osp_spec_method_name(c.method), "draft_model");
    assert_int_equal(osp_spec_config_parse("{\"model\": \"d.gguf\", \"num_speculative_tokens\": 2}", &c), OSP_OK);
    assert_int_equal(c.method, OSP_SPEC_DRAFT_MODEL);
    assert_string_equal(c.model, "d.gguf");
    {
        char big[OSP_SPEC_MODEL_PATH_MAX + 80];
        int n = snprintf(big, sizeof big, "{\"model\": \"");
        for (int i = 0; i < OSP_SPEC_MODEL_PATH_MAX; i++) big[n++] = 'a';
        snprintf(big + n, sizeof big - (size_t)n, "\", \"num_speculative_tokens\": 2}");
        const osp_spec_config before = c;
        assert_int_equal(osp_spec_config_parse(big, &c), OSP_ERR_INVALID_ARG);
        assert_memory_equal(&before, &c, sizeof c);
    }
    assert_int_equal(osp_spec_config_parse("{\"method\":\"ngram\",\"num_speculative_tokens\":7,\"prompt_lookup_min\":1,"
                                           "\"prompt_lookup_max\":4}", &c), OSP_OK);
    /* each mistake: one error naming it, *out unchanged */
    const struct {
        const char *json, *needle;
        osp_status st;
    } bad[] = {
        {"{\"method\": \"ngram\"", "not JSON", OSP_ERR_INVALID_ARG},
        {"[1, 2]", "JSON object", OSP_ERR_INVALID_ARG},
        {"{\"num_speculative_tokens\": 4}", "\"method\" is required", OSP_ERR_INVALID_ARG},
        {"{\"method\": 3, \"num_speculative_tokens\": 4}", "must be a string", OSP_ERR_INVALID_ARG},
        {"{\"method\": \"ngrams\", \"num_speculative_tokens\": 4}", "unknown method \"ngrams\"", OSP_ERR_INVALID_ARG},
        {"{\"method\": \"draft_model\", \"num_speculative_tokens\": 4}", "draft_model needs \"model\"",
         OSP_ERR_INVALID_ARG},
        {"{\"method\": \"draft_model\", \"num_speculative_tokens\": 4, \"model\": \"\"}", "draft_model needs \"model\"",
         OSP_ERR_INVALID_ARG},
        {"{\"method\": \"draft_model\", \"num_speculative_tokens\": 4, \"model\": 7}", "draft_model needs \"model\"",
         OSP_ERR_INVALID_ARG},
        {"{\"method\": \"draft_model\", \"num_speculative_tokens\": 4, \"model\": \"d.gguf\", \"prompt_lookup_max\": 3}",
         "\"prompt_lookup_max\" is for method \"ngram\"", OSP_ERR_INVALID_ARG},
        {"{\"model\": \"d.gguf\"}", "\"num_speculative_tokens\" is required", OSP_ERR_INVALID_ARG},
        {"{\"method\": \"draft_model\", \"num_speculative_tokens\": 4, \"model\": \"d.gguf\", \"draft_tensor_parallel_size\": 1}",
         "unknown or unsupported key \"draft_tensor_parallel_size\"", OSP_ERR_INVALID_ARG},
        {"{\"method\": \"eagle\", \"num_speculative_tokens\": 4}", "not implemented yet", OSP_ERR_UNSUPPORTED},
        {"{\"method\": \"quantspec\", \"num_speculative_tokens\": 4, \"model\": \"d.gguf\"}",
         "\"model\" is not for method \"quantspec\"", OSP_ERR_INVALID_ARG},
        {"{\"method\": \"quantspec\", \"num_speculative_tokens\": 4, \"prompt_lookup_min\": 2}",
         "\"prompt_lookup_min\" is not for method \"quantspec\"", OSP_ERR_INVALID_ARG},
        {"{\"method\": \"quantspec\"}", "\"num_speculative_tokens\" is required", OSP_ERR_INVALID_ARG},
        {"{\"method\": \"quantspec\", \"num_speculative_tokens\": 4, \"recent\": 64}", "unknown or unsupported key",
         OSP_ERR_INVALID_ARG},
        {"{\"method\": \"ngram\"}", "\"num_speculative_tokens\" is required", OSP_ERR_INVALID_ARG},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 0}", "num_speculative_tokens", OSP_ERR_INVALID_ARG},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 17}", "num_speculative_tokens", OSP_ERR_INVALID_ARG},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 2.5}", "num_speculative_tokens", OSP_ERR_INVALID_ARG},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 17.0}", "num_speculative_tokens", OSP_ERR_INVALID_ARG},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 1e300}", "num_speculative_tokens", OSP_ERR_INVALID_ARG},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": true}", "num_speculative_tokens", OSP_ERR_INVALID_ARG},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": \"4\"}", "num_speculative_tokens", OSP_ERR_INVALID_ARG},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_min\": 0}", "prompt_lookup_min",
         OSP_ERR_INVALID_ARG},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_min\": 4, \"prompt_lookup_max\": 3}",
         "prompt_lookup_min <= prompt_lookup_max", OSP_ERR_INVALID_ARG},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"model\": \"x\"}", "\"model\" is for method \"draft_model\"",
         OSP_ERR_INVALID_ARG},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"temperature\": 1}", "unknown or unsupported key \"temperature\"",
         OSP_ERR_INVALID_ARG},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"num_speculative_tokens\": 5}", "not JSON",
         OSP_ERR_INVALID_ARG},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        osp_spec_config before = c;
        const osp_status st = osp_spec_config_parse(bad[i].json, &c);
        if (st != bad[i].st || !strstr(osp_last_error(), bad[i].needle))
            fail_msg("%s: status %d, message '%s' (wanted %d, '%s')", bad[i].json, st, osp_last_error(), bad[i].st,
                     bad[i].needle);
        assert_memory_equal(&before, &c, sizeof c);
    }
    osp_spec_config x = {.method = OSP_SPEC_NGRAM, .num_speculative_tokens = 2, .prompt_lookup_min = 1,
                         .prompt_lookup_max = 1};
    assert_int_equal(osp_spec_config_check(&x), OSP_OK);
    x.num_speculative_tokens = 0;
    assert_int_equal(osp_spec_config_check(&x), OSP_ERR_INVALID_ARG);
}

static void test_verify_point(void **state) {
    (void)state;
    const int32_t d[4] = {5, 6, 7, 8};
    const int32_t all[5] = {5, 6, 7, 8, 9}, none[5] = {4, 6, 7, 8, 9}, two[5] = {5, 6, 1, 8, 9};
    assert_int_equal(osp_spec_verify_point(d, 4, all), 4);
    assert_int_equal(osp_spec_verify_point(d, 4, none), 0);
    assert_int_equal(osp_spec_verify_point(d, 4, two), 2);
    assert_int_equal(osp_spec_verify_point(d, 0, none), 0);
}

/* splitmix64 uniforms in [0, 1) */
static uint64_t g_s = 12345;
static double unif(void) {
    uint64_t z = (g_s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

static int32_t sample(const float *w, int32_t n) {
    double u = unif(), acc = 0;
    for (int32_t i = 0; i < n; i++)
        if (u < (acc += w[i])) return i;
    return n - 1;
}

/* chi-square of counts [n] against p (cells with expected >= 5), and the total variation distance */
static void check_dist(const int64_t *cnt, const float *p, int32_t n, int64_t draws, const char *what) {
    double chi = 0, tv = 0;
    int dof = -1;
    for (int32_t i = 0; i < n; i++) {
        const double e = p[i] * (double)draws;
        tv += fabs((double)cnt[i] / (double)draws - p[i]) / 2;
        if (e < 5) {
            if (p[i] == 0) assert_int_equal(cnt[i], 0); /* never a token the target excludes */
            continue;
        }
        chi += ((double)cnt[i] - e) * ((double)cnt[i] - e) / e;
        dof++;
    }
    /* the 99.9% quantile of chi-square with dof degrees of freedom, Wilson-Hilferty */
    const double z = 3.09, k = dof, q = k * pow(1 - 2 / (9 * k) + z * sqrt(2 / (9 * k)), 3);
    printf("%s: chi2 %.1f (dof %d, 99.9%% %.1f), TV %.4f\n", what, chi, dof, q, tv);
    assert_true(chi < q);
    assert_true(tv < 0.01);
}

static void test_accept_or_resample(void **state) {
    (void)state;
    enum { V = 12 };
    const int64_t draws = 400000;
    float p[V], q[V];
    /* a target with a zero, a draft that misses some tokens and overweights others */
    const float pw[V] = {8, 5, 3, 0, 1, 2, 6, 0.5f, 4, 1, 2, 7}, qw[V] = {1, 9, 0, 3, 1, 0, 2, 6, 4, 1, 0, 3};
    float sp = 0, sq = 0;
    for (int i = 0; i < V; i++) sp += pw[i], sq += qw[i];
    for (int i = 0; i < V; i++) p[i] = pw[i] / sp, q[i] = qw[i] / sq;
    int64_t cnt[V] = {0}, acc = 0;
    for (int64_t t = 0; t < draws; t++) {
        bool ok;
        const int32_t x = sample(q, V);
        const int32_t y = osp_spec_accept_or_resample(p, q, V, x, unif(), unif(), &ok);
        cnt[y]++;
        acc += ok;
    }
    check_dist(cnt, p, V, draws, "general draft");
    /* acceptance rate is sum min(p, q) */
    double expect = 0;
    for (int i = 0; i < V; i++) expect += p[i] < q[i] ? p[i] : q[i];
    printf("acceptance %.4f, expected %.4f\n", (double)acc / (double)draws, expect);
    assert_true(fabs((double)acc / (double)draws - expect) < 0.005);
    /* q a point mass at d (the n-gram case): the general rule and "draw y ~ p, accept iff y == d" give
       the same distribution p and the same acceptance p(d) */
    for (int32_t d = 0; d < V; d += 3) {
        float pm[V] = {0};
        pm[d] = 1;
        int64_t c1[V] = {0}, c2[V] = {0}, a1 = 0, a2 = 0;
        for (int64_t t = 0; t < draws / 4; t++) {
            bool ok;
            c1[osp_spec_accept_or_resample(p, pm, V, d, unif(), unif(), &ok)]++;
            a1 += ok;
            const int32_t y = sample(p, V);
            const int32_t target[2] = {y, -1};
            const int32_t a = osp_spec_verify_point(&d, 1, target);
            c2[a ? d : y]++;
            a2 += a;
        }
        char what[64];
        snprintf(what, sizeof what, "point mass at %d, general rule", d);
        check_dist(c1, p, V, draws / 4, what);
        snprintf(what, sizeof what, "point mass at %d, draw and match", d);
        check_dist(c2, p, V, draws / 4, what);
        assert_true(fabs((double)a1 / (double)(draws / 4) - p[d]) < 0.01);
        assert_true(fabs((double)a2 / (double)(draws / 4) - p[d]) < 0.01);
    }
    /* p == q: always accepted */
    bool ok;
    assert_int_equal(osp_spec_accept_or_resample(p, p, V, 6, 0.999, 0.5, &ok), 6);
    assert_true(ok);
}


/* The engine-wide switch (spec/switch.h): the phases' lengths, the unmeasured first step of each, the
 * verdict following the measured rates, phases doubling for a mode that keeps winning, and an on phase
 * judged by its own undrafted steps without an off probe. */
static void run_steps(osp_spec_switch *w, int n, double on_rate, double off_rate, bool drafted, int *steps_off) {
    for (int i = 0; i < n; i++) {
        *steps_off += w->off;
        /* one token a step; the first step of a phase is poisoned (it would flip any verdict) */
        const double rate = w->off || !drafted ? off_rate : on_rate;
        osp_spec_switch_step(w, w->transition ? 1000.0 : 1.0 / rate, 1, !w->off && drafted);
    }
}

static void test_switch(void **state) {
    (void)state;
    osp_spec_switch w;
    osp_spec_switch_init(&w);
    assert_true(w.off && !w.probe);
    assert_int_equal(w.left, OSP_SPEC_FIRST_OFF);
    int off_steps = 0;
    /* speculation a little slower (14 vs 15 tokens/s: not an early exit): the first look (4 off, then the
       8-step on probe), off wins and its main phase doubles */
    run_steps(&w, OSP_SPEC_FIRST_OFF, 14.0, 15.0, true, &off_steps);
    assert_true(!w.off && w.probe);
    run_steps(&w, OSP_SPEC_ON_PROBE, 14.0, 15.0, true, &off_steps);
    assert_true(w.off && !w.probe);
    assert_int_equal(w.left, 2 * OSP_SPEC_OFF_STEPS);
    assert_int_equal(w.decisions, 1);
    assert_int_equal(w.decisions_off, 1);
    assert_int_equal(w.early_exits, 0);
    run_steps(&w, 2 * OSP_SPEC_OFF_STEPS, 14.0, 15.0, true, &off_steps);
    assert_true(!w.off && w.probe); /* the on probe */
    /* now speculation loses by a third: the probe ends after its transition step and 3 measured steps */
    run_steps(&w, 1 + OSP_SPEC_EARLY_STEPS - 1, 10.0, 15.0, true, &off_steps);
    assert_true(!w.off && w.probe);
    run_steps(&w, 1, 10.0, 15.0, true, &off_steps);
    assert_true(w.off && !w.probe);
    assert_int_equal(w.early_exits, 1);
    assert_int_equal(w.decisions, 2);
    assert_int_equal(w.decisions_off, 2);
    assert_int_equal(w.left, 2 * OSP_SPEC_OFF_STEPS); /* judged from the on side: off's length kept */
    assert_int_equal(off_steps, OSP_SPEC_FIRST_OFF + 2 * OSP_SPEC_OFF_STEPS);
    /* now speculation pays: the next on probe wins, the main phase is on, off's length resets */
    run_steps(&w, 2 * OSP_SPEC_OFF_STEPS, 20.0, 15.0, true, &off_steps);
    run_steps(&w, OSP_SPEC_ON_PROBE, 20.0, 15.0, true, &off_steps);
    assert_true(!w.off && !w.probe);
    assert_int_equal(w.left, OSP_SPEC_ON_STEPS);
    assert_int_equal(w.decisions, 3);
    assert_int_equal(w.decisions_off, 2);
    run_steps(&w, OSP_SPEC_ON_STEPS, 20.0, 15.0, true, &off_steps);
    assert_true(w.off && w.probe);
    run_steps(&w, OSP_SPEC_OFF_PROBE, 20.0, 15.0, true, &off_steps);
    assert_true(!w.off && !w.probe);
    assert_int_equal(w.left, 2 * OSP_SPEC_ON_STEPS); /* on won twice */
    assert_int_equal(w.early_exits, 1);
    /* an on phase with undrafted steps (they measure plain decoding) is judged without an off probe:
       here its drafted steps are slow, so it goes off directly (mildly slow overall: 2 of every 3 steps
       plain, so no early exit) */
    const int64_t before = w.decisions;
    for (int i = 0; i < 2 * OSP_SPEC_ON_STEPS; i++) {
        const bool drafted = i % 3 == 0;
        osp_spec_switch_step(&w, w.transition ? 1000.0 : drafted ? 1.0 / 10.0 : 1.0 / 15.0, 1, drafted);
    }
    assert_int_equal(w.decisions, before + 1);
    assert_int_equal(w.early_exits, 1);
    assert_true(w.off && !w.probe);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_verify_point),
        cmocka_unit_test(test_accept_or_resample),
        cmocka_unit_test(test_switch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
