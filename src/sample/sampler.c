/* Greedy / temperature / top-k / top-p sampling over one row of logits (see sampler.h). */
#include "sample/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"
#include "sample/rng.h"

osp_sampling_params osp_sampling_default_params(void) {
    osp_sampling_params p = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    return p;
}

typedef struct cand {
    float p;
    int32_t id;
} cand;

static int cand_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id;
}

osp_status osp_sample(const float *logits, int32_t n_vocab, const osp_sampling_params *p, uint64_t step,
                      float *work, int32_t *token) {
    int32_t best = -1;
    for (int32_t i = 0; i < n_vocab; i++)
        if (!isnan(logits[i]) && logits[i] > -INFINITY && (best < 0 || logits[i] > logits[best])) best = i;
    if (best < 0) return osp_set_error(OSP_ERR_INVALID_ARG, "sampling: every logit is NaN or -inf");
    if (!(p->temperature > 0.0f) || p->top_k == 1) {
        *token = best;
        return OSP_OK;
    }
    /* softmax(logits / T) into candidates */
    cand *c = (cand *)(void *)work;
    const float mx = logits[best], inv_t = 1.0f / p->temperature;
    int32_t n = 0;
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; i++) {
        if (isnan(logits[i]) || logits[i] == -INFINITY) continue;
        const float e = expf((logits[i] - mx) * inv_t);
        c[n].p = e;
        c[n].id = i;
        sum += e;
        n++;
    }
    const bool filter = (p->top_k > 0 && p->top_k < n) || p->top_p < 1.0f;
    if (filter) {
        qsort(c, (size_t)n, sizeof *c, cand_desc);
        if (p->top_k > 0 && p->top_k < n) n = p->top_k;
        sum = 0.0;
        for (int32_t i = 0; i < n; i++) sum += c[i].p;
        if (p->top_p < 1.0f) {
            double cum = 0.0, target = (double)p->top_p * sum;
            int32_t keep = 1;
            for (int32_t i = 0; i < n; i++) {
                cum += c[i].p;
                keep = i + 1;
                if (cum >= target) break;
            }
            n = keep;
            sum = cum;
        }
    }
    const double u = (double)osp_rng_uniform(p->seed, step, 0) * sum;
    double acc = 0.0;
    for (int32_t i = 0; i < n; i++) {
        acc += c[i].p;
        if (u < acc) {
            *token = c[i].id;
            return OSP_OK;
        }
    }
    *token = c[n - 1].id;
    return OSP_OK;
}
