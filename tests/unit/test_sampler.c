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

/* Upper 1e-6 quantile of chi-square with df degrees of freedom (Wilson-Hilferty; z = 4.7534). */
static double chi2_crit(int df) {
    const double z = 4.7534, d = (double)df, a = 2.0 / (9.0 * d);
    const double c = d * pow(1.0 - a + z * sqrt(a), 3.0);
    return df == 1 ? z * z + 1.0 : c;
}

typedef struct fit {
    double chi2, crit, tvd, tvd_bound;
    int df, impossible;
} fit;

static fit compare(const long *count, const double *prob, int v, long n) {
    fit f = {0};
    double pooled_e = 0.0, pooled_o = 0.0, se = 0.0;
    int bins = 0;
    for (int i = 0; i < v; i++) {
        const double e = prob[i] * (double)n;
        if (prob[i] == 0.0 && count[i]) f.impossible++;
        f.tvd += 0.5 * fabs((double)count[i] / (double)n - prob[i]);
        se += 0.5 * sqrt(prob[i] * (1.0 - prob[i]) / (double)n);
        if (e >= 5.0) {
            f.chi2 += ((double)count[i] - e) * ((double)count[i] - e) / e;
            bins++;
        } else {
            pooled_e += e, pooled_o += (double)count[i];
        }
    }
    if (pooled_e >= 5.0) {
        f.chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
        bins++;
    } else if (pooled_o > pooled_e + 10.0 && pooled_o > 20.0) {
        f.chi2 += 1e9; /* far too many draws of (near-)impossible tokens */
    }
    f.df = bins > 1 ? bins - 1 : 0;
    f.crit = f.df ? chi2_crit(f.df) : 0.0;
    f.tvd_bound = 3.0 * se + 1e-9;
    return f;
}

static void check_fit(const char *name, const fit *f) {
    printf("  %-34s chi2 %8.2f (df %3d, crit %7.2f)  TVD %.5f (bound %.5f)\n", name, f->chi2, f->df, f->crit,
           f->tvd, f->tvd_bound);
    assert_int_equal(f->impossible, 0);
    assert_true(f->chi2 <= f->crit);
    assert_true(f->tvd <= f->tvd_bound);
}

/* ---- the batch ---------------------------------------------------------------------------- */

#define V 48
#define NROWS 20
#define NDRAWS 60000

typedef struct cfg {
    const char *name;
    float t;
    int k;
    float p, minp;
    int logits; /* which logit pattern */
} cfg;

static const cfg CFGS[NROWS] = {
    {"plain T=1", 1.0f, 0, 1.0f, 0.0f, 0},
    {"T=0.5", 0.5f, 0, 1.0f, 0.0f, 0},
    {"T=2.5", 2.5f, 0, 1.0f, 0.0f, 1},
    {"top_k=5", 1.0f, 5, 1.0f, 0.0f, 0},
    {"top_k=-1 (off)", 1.0f, -1, 1.0f, 0.0f, 1},
    {"top_k>vocab (off)", 1.0f, 1000, 1.0f, 0.0f, 0},
    {"top_k=1", 1.0f, 1, 1.0f, 0.0f, 1},
    {"top_p=0.7", 1.0f, 0, 0.7f, 0.0f, 0},
    {"top_p=0.95 T=1.5", 1.5f, 0, 0.95f, 0.0f, 1},
    {"top_p=0 (argmax)", 1.0f, 0, 0.0f, 0.0f, 0},
    {"top_k=12 top_p=0.8", 1.0f, 12, 0.8f, 0.0f, 1},
    {"min_p=0.1", 1.0f, 0, 1.0f, 0.1f, 0},
    {"min_p=1 (max only)", 1.0f, 0, 1.0f, 1.0f, 1},
    {"min_p=.05 k=10 p=.9 T=.7", 0.7f, 10, 0.9f, 0.05f, 0},
    {"min_p=.2 top_p=.6", 1.0f, 0, 0.6f, 0.2f, 1},
    {"ties: top_k=4", 1.0f, 4, 1.0f, 0.0f, 2},
    {"ties: top_p=0.3", 1.0f, 0, 0.3f, 0.0f, 2},
    {"all equal: k=5 p=0.5", 1.0f, 5, 0.5f, 0.0f, 3},
    {"tiny T=1e-3", 1e-3f, 0, 1.0f, 0.0f, 1},
    {"dominant logit", 1.0f, 0, 0.9f, 0.0f, 4},
};

static void make_logits(int pattern, float *l, uint64_t salt) {
    for (int i = 0; i < V; i++) {
        const double u = osp_rng_uniform_at(1234 + salt, 0, (uint64_t)i, 0);
        switch (pattern) {
        case 0: l[i] = (float)(4.0 * u - 2.0); break;             /* spread out */
        case 1: l[i] = (float)(8.0 * u * u - 3.0); break;         /* skewed */
        case 2: l[i] = (float)(i % 6 == 0 ? 2.0 : i % 6 == 1 ? 1.0 : 0.5 * (i % 3)); break; /* tie groups */
        case 3: l[i] = 0.25f; break;                               /* all equal */
        default: l[i] = i == 17 ? 12.0f : (float)u; break;         /* one dominant logit */
        }
    }
}

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
