/* Token sampling for one sequence: greedy, or temperature with top-k and top-p filters.
 *
 * This is the straightforward version (a partial sort of the candidates); the sort-free rejection
 * sampler of the sampler issue replaces its internals behind the same call. Semantics follow vLLM:
 * temperature 0 is greedy (argmax, lowest id on ties); top_k <= 0 is off; top_p >= 1 is off; top-k
 * applies before top-p; the kept tokens are renormalized and one uniform draw picks among them. */
#ifndef OSP_SAMPLE_SAMPLER_H
#define OSP_SAMPLE_SAMPLER_H

#include <stdint.h>

#include "osprey/status.h"

typedef struct osp_sampling_params {
    float temperature; /* 0 = greedy */
    int32_t top_k;     /* <= 0: off */
    float top_p;       /* >= 1: off */
    uint64_t seed;
} osp_sampling_params;

osp_sampling_params osp_sampling_default_params(void);

/* Picks a token from logits [n_vocab] (fp32; not modified). `step` is the index of this token in the
 * output, which addresses the Philox stream so a seeded run is reproducible. `work` is a caller-owned
 * workspace of 2 * n_vocab floats (no allocation per call). Logits that are NaN are never chosen;
 * if every logit is NaN or -inf the call fails with OSP_ERR_INVALID_ARG. */
osp_status osp_sample(const float *logits, int32_t n_vocab, const osp_sampling_params *p, uint64_t step,
                      float *work, int32_t *token);

#endif
