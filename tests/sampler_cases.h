/* Shared by the sampler's distribution tests on the CPU (tests/unit/test_sampler.c) and the GPU
 * (tests/gpu/test_gpu_sampler.c): the goodness-of-fit statistics and the batch of 20 filter settings
 * over a 48-token vocabulary. Header-only (static functions); needs <math.h> and sample/rng.h. */
#ifndef OSP_TESTS_SAMPLER_CASES_H
#define OSP_TESTS_SAMPLER_CASES_H

#include <math.h>
#include <stdint.h>

#include "sample/rng.h"

/* Upper 1e-6 quantile of chi-square with df degrees of freedom (Wilson-Hilferty; z = 4.7534). */
static double chi2_crit(int df) {
    const double z = 4.7534, d = (double)df, a = 2.0 / (9.0 * d);
    return df == 1 ? z * z + 1.0 : d * pow(1.0 - a + z * sqrt(a), 3.0);
}

typedef struct fit {
    double chi2, crit, tvd, tvd_bound;
    int df;
    long impossible; /* draws of tokens whose probability is 0 */
} fit;

/* Chi-square (bins with expected count < 5 pooled) and total variation distance of n draws (count [v])
 * against the distribution prob [v]; the TVD bound is 3 standard errors. */
static fit compare(const long *count, const double *prob, int32_t v, long n) {
    fit f = {0};
    double pooled_e = 0.0, pooled_o = 0.0, se = 0.0;
    int bins = 0;
    for (int32_t i = 0; i < v; i++) {
        const double e = prob[i] * (double)n;
        if (prob[i] == 0.0 && count[i]) f.impossible += count[i];
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

/* ---- the batch of 20 rows over 48 tokens ------------------------------------------------------------ */

#define SAMPLER_CASE_V 48
#define SAMPLER_CASE_ROWS 20

typedef struct sampler_case {
    const char *name;
    float t;
    int k;
    float p, minp;
    int logits; /* which logit pattern (sampler_case_logits) */
} sampler_case;

static const sampler_case k_sampler_cases[SAMPLER_CASE_ROWS] = {
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

/* Logits [SAMPLER_CASE_V] of pattern 0..4, drawn from Philox stream 1234 + salt. */
static void sampler_case_logits(int pattern, float *l, uint64_t salt) {
    for (int i = 0; i < SAMPLER_CASE_V; i++) {
        const double u = osp_rng_uniform_at(1234 + salt, 0, (uint64_t)i, 0);
        switch (pattern) {
        case 0: l[i] = (float)(4.0 * u - 2.0); break;                                       /* spread out */
        case 1: l[i] = (float)(8.0 * u * u - 3.0); break;                                   /* skewed */
        case 2: l[i] = (float)(i % 6 == 0 ? 2.0 : i % 6 == 1 ? 1.0 : 0.5 * (i % 3)); break; /* tie groups */
        case 3: l[i] = 0.25f; break;                                                        /* all equal */
        default: l[i] = i == 17 ? 12.0f : (float)u; break;                                  /* one dominant logit */
        }
    }
}

#endif
