/* Distribution tests of the sampler: every filter and combination against the exact filtered and
 * renormalized distribution.
 *
 * One batch holds rows with different logits and parameters (temperature, top-k, top-p, min-p and
 * their combinations, edge values, ties); each call samples the whole batch at one output position,
 * and N calls give N draws per row from fixed seeds, so the test is deterministic. For each row the
 * counts are compared with the exact distribution computed here in double precision by a plain
 * O(V^2) reference (not the library's code): chi-square over the bins with expected count >= 5 (the
 * rest pooled) against the critical value for p = 1e-6 at that number of degrees of freedom
 * (Wilson-Hilferty), and total variation distance against a bound of 3 standard errors. A token with
 * probability 0 must never appear. The same is done for the rejection sampler alone on a 4096-token
 * vocabulary (compaction, the top-k pivot search, many rounds) and for the exact sorting path. */
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

#include "sample/reject.h"
#include "sample/rng.h"
#include "sample/sampler.h"

#include "sampler_cases.h"

#define MAXV 4096

/* ---- reference: the exact distribution (doubles, by definition, O(V^2)) ------------------- */

static void reference(const float *logits, int v, const osp_sampler_row *p, double *out) {
    static double w[MAXV];
    int best = 0;
    for (int i = 1; i < v; i++)
        if (logits[i] > logits[best]) best = i;
    memset(out, 0, sizeof(double) * (size_t)v);
    if (p->temperature < 1e-5f) {
        out[best] = 1.0;
        return;
    }
    /* the library computes weights in float; use the same weights so ties and thresholds agree */
    for (int i = 0; i < v; i++) w[i] = (double)expf((logits[i] - logits[best]) * (1.0f / p->temperature));
    w[best] = 1.0;
    static char keep[MAXV];
    for (int i = 0; i < v; i++) keep[i] = w[i] > 0.0 && (p->min_p <= 0.0f || w[i] >= (double)p->min_p);
    if (p->top_k > 0) {
        static char k2[MAXV];
        for (int i = 0; i < v; i++) {
            int above = 0;
            for (int j = 0; j < v; j++) above += keep[j] && w[j] > w[i];
            k2[i] = keep[i] && above < p->top_k;
        }
        memcpy(keep, k2, (size_t)v);
    }
    if (p->top_p < 1.0f) {
        double mass = 0.0;
        for (int i = 0; i < v; i++) mass += keep[i] ? w[i] : 0.0;
        static char k3[MAXV];
        for (int i = 0; i < v; i++) {
            double above = 0.0;
            for (int j = 0; j < v; j++) above += keep[j] && w[j] > w[i] ? w[j] : 0.0;
            k3[i] = keep[i] && (above < (double)p->top_p * mass || w[i] == 1.0);
        }
        memcpy(keep, k3, (size_t)v);
    }
    double s = 0.0;
    for (int i = 0; i < v; i++) s += keep[i] ? w[i] : 0.0;
    for (int i = 0; i < v; i++) out[i] = keep[i] ? w[i] / s : 0.0;
}

/* ---- statistics --------------------------------------------------------------------------- */

static void check_fit(const char *name, const fit *f) {
    printf("  %-34s chi2 %8.2f (df %3d, crit %7.2f)  TVD %.5f (bound %.5f)\n", name, f->chi2, f->df, f->crit,
           f->tvd, f->tvd_bound);
    assert_int_equal(f->impossible, 0);
    assert_true(f->chi2 <= f->crit);
    assert_true(f->tvd <= f->tvd_bound);
}

/* ---- the batch ---------------------------------------------------------------------------- */

#define V SAMPLER_CASE_V
#define NROWS SAMPLER_CASE_ROWS
#define NDRAWS 60000
#define CFGS k_sampler_cases
#define make_logits sampler_case_logits

static void test_batch_distributions(void **state) {
    (void)state;
    static float logits[NROWS * V];
    static osp_sampler_row rows[NROWS];
    static long counts[NROWS][V];
    memset(counts, 0, sizeof counts);
    for (int r = 0; r < NROWS; r++) {
        make_logits(CFGS[r].logits, logits + r * V, (uint64_t)r);
        rows[r] = osp_sampler_row_default();
        rows[r].temperature = CFGS[r].t;
        rows[r].top_k = CFGS[r].k;
        rows[r].top_p = CFGS[r].p;
        rows[r].min_p = CFGS[r].minp;
        rows[r].seed = 1000003u * (uint64_t)(r + 1);
    }
    osp_sampler_workspace *ws;
    assert_int_equal(osp_sampler_workspace_create(NROWS, V, 1, &ws), OSP_OK);
    int32_t tok[NROWS];
    osp_status st[NROWS];
    for (long d = 0; d < NDRAWS; d++) {
        for (int r = 0; r < NROWS; r++) rows[r].output_pos = (uint64_t)d;
        assert_int_equal(osp_sample_batch(ws, logits, NROWS, V, rows, tok, NULL, st), OSP_OK);
        for (int r = 0; r < NROWS; r++) {
            assert_true(tok[r] >= 0 && tok[r] < V);
            counts[r][tok[r]]++;
        }
    }
    osp_sampler_workspace_free(ws);
    printf("  batch of %d rows, vocab %d, %d draws each (chi-square p = 1e-6 critical values)\n", NROWS, V, NDRAWS);
    for (int r = 0; r < NROWS; r++) {
        double prob[V];
        reference(logits + r * V, V, &rows[r], prob);
        fit f = compare(counts[r], prob, V, NDRAWS);
        check_fit(CFGS[r].name, &f);
    }
}

/* ---- the rejection sampler alone on a larger vocabulary ----------------------------------- */

typedef struct big_cfg {
    const char *name;
    int k;
    float p, minp;
} big_cfg;

/* mode 0: rejection; 1: the sorting path; 2: rejection with 1 round, then the fallback */
static void run_big(int mode) {
    const bool sorted = mode == 1;
    enum { BV = 4096 };
    const long BN = mode == 1 ? 2000 : mode == 2 ? 6000 : 20000; /* sorting is slow by design */
    static float base[BV], w0[BV], w[BV];
    static int32_t ids[BV];
    static double prob[BV];
    static long count[BV];
    /* Gaussian-ish logits (sum of uniforms), sd ~ 2, so the mass is spread over hundreds of tokens */
    float mx = -1e30f;
    for (int i = 0; i < BV; i++) {
        double s = 0.0;
        for (int j = 0; j < 4; j++) s += osp_rng_uniform_at(77, 0, (uint64_t)i, (uint32_t)j);
        base[i] = (float)((s - 2.0) * 3.5);
        mx = base[i] > mx ? base[i] : mx;
    }
    static const big_cfg cfgs[] = {
        {"V=4096 top_k=50", 50, 1.0f, 0.0f},    {"V=4096 top_k=700", 700, 1.0f, 0.0f},
        {"V=4096 top_p=0.9", 0, 0.9f, 0.0f},   {"V=4096 top_p=0.5", 0, 0.5f, 0.0f},
        {"V=4096 top_k=300 top_p=0.8", 300, 0.8f, 0.0f}, {"V=4096 min_p=0.01", 0, 1.0f, 0.01f},
        {"V=4096 min_p=.002 k=400 p=.95", 400, 0.95f, 0.002f},
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        osp_sampler_row row = osp_sampler_row_default();
        row.top_k = cfgs[c].k, row.top_p = cfgs[c].p, row.min_p = cfgs[c].minp;
        reference(base, BV, &row, prob);
        memset(count, 0, sizeof count);
        long rounds_total = 0, fallbacks = 0;
        for (int i = 0; i < BV; i++) w0[i] = expf(base[i] - mx);
        for (long d = 0; d < BN; d++) {
            memcpy(w, w0, sizeof w); /* the samplers overwrite their input */
            const osp_rng_addr a = {99 + c, 0, (uint64_t)d};
            int32_t rounds = 0, t;
            if (sorted) t = osp_reject_sample_sorted(w, ids, BV, row.top_k, row.top_p, row.min_p, &a);
            else if (mode == 2) t = osp_reject_sample_ex(w, ids, BV, row.top_k, row.top_p, row.min_p, &a, 1, &rounds);
            else t = osp_reject_sample(w, ids, BV, row.top_k, row.top_p, row.min_p, &a, &rounds);
            assert_true(t >= 0 && t < BV);
            count[t]++;
            rounds_total += rounds;
            fallbacks += rounds > (mode == 2 ? 1 : OSP_REJECT_MAX_ROUNDS);
        }
        int kept = 0;
        for (int i = 0; i < BV; i++) kept += prob[i] > 0.0;
        char name[96];
        snprintf(name, sizeof name, "%s%s (%d kept)", mode == 1 ? "sorted " : mode == 2 ? "1 round+fallback " : "",
                 cfgs[c].name, kept);
        if (mode != 1) printf("  %-40s mean rounds %.2f, fallbacks %ld\n", cfgs[c].name, (double)rounds_total / (double)BN, fallbacks);
        fit f = compare(count, prob, BV, BN);
        check_fit(name, &f);
    }
}

static void test_rejection_large_vocab(void **state) {
    (void)state;
    run_big(0);
}

static void test_sorted_fallback_large_vocab(void **state) {
    (void)state;
    run_big(1);
}

static void test_fallback_midway(void **state) {
    (void)state;
    run_big(2);
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_distributions),
        cmocka_unit_test(test_rejection_large_vocab),
        cmocka_unit_test(test_sorted_fallback_large_vocab),
        cmocka_unit_test(test_fallback_midway),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
