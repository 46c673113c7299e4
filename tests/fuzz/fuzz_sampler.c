/* libFuzzer target for the sampler: arbitrary logits (NaN, +-inf, denormals, huge values) and
 * arbitrary parameters (in and out of range) for a few rows of a tiny vocabulary. Whatever the input,
 * osp_sample_batch must not crash, must give every row OSP_OK or OSP_ERR_INVALID_ARG, must never
 * return an id outside the vocabulary, must return finite logprobs in order, and a greedy row must
 * return the argmax. Seeds: tests/fuzz/corpus/sampler/. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sample/sampler.h"

#define MAXR 4
#define MAXV 96

typedef struct reader {
    const uint8_t *p;
    size_t n, at;
} reader;

static uint8_t u8(reader *r) { return r->at < r->n ? r->p[r->at++] : (uint8_t)(r->at++ * 37u); }
static float f32(reader *r) {
    uint32_t b = (uint32_t)u8(r) | (uint32_t)u8(r) << 8 | (uint32_t)u8(r) << 16 | (uint32_t)u8(r) << 24;
    float x;
    memcpy(&x, &b, 4);
    return x;
}
static float pick(reader *r, const float *table, int n) {
    const uint8_t b = u8(r);
    return b % 8 == 7 ? f32(r) : table[b % (uint8_t)n];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    reader rd = {data, size, 0};
    const int nrows = 1 + u8(&rd) % MAXR, vocab = 1 + u8(&rd) % MAXV;
    static const float temps[] = {0.0f, 1e-6f, 1e-3f, 0.7f, 1.0f, 3.0f, -1.0f};
    static const float ps[] = {0.0f, 0.1f, 0.5f, 0.9f, 1.0f, 0.95f, 2.0f};
    static const float pens[] = {0.0f, 0.5f, -1.5f, 2.0f, 1.0f, 1.3f, 0.0f};
    osp_sampler_row rows[MAXR];
    static int32_t ids[MAXR][16], stops[MAXR][2];
    static osp_logit_bias bias[MAXR][2];
    for (int i = 0; i < nrows; i++) {
        osp_sampler_row *r = &rows[i];
        *r = osp_sampler_row_default();
        r->temperature = pick(&rd, temps, 7);
        r->top_k = (int8_t)u8(&rd);
        r->top_p = pick(&rd, ps, 7);
        r->min_p = pick(&rd, ps, 7) * 0.5f;
        r->presence_penalty = pick(&rd, pens, 7);
        r->frequency_penalty = pick(&rd, pens, 7);
        r->repetition_penalty = pick(&rd, pens, 7);
        const int n_ids = u8(&rd) % 17;
        for (int j = 0; j < n_ids && j < 16; j++) ids[i][j] = (int32_t)(u8(&rd) % (vocab + 1)); /* vocab: invalid */
        r->prompt_ids = ids[i], r->n_prompt = n_ids / 2;
        r->output_ids = ids[i] + n_ids / 2, r->n_output = n_ids - n_ids / 2;
        stops[i][0] = u8(&rd) % vocab, stops[i][1] = u8(&rd) % vocab;
        r->stop_token_ids = stops[i], r->n_stop_token_ids = u8(&rd) % 3;
        r->min_tokens = u8(&rd) % 4;
        bias[i][0] = (osp_logit_bias){u8(&rd) % vocab, pick(&rd, pens, 7) * 10.0f};
        bias[i][1] = (osp_logit_bias){u8(&rd) % vocab, pick(&rd, pens, 7)};
        r->logit_bias = bias[i], r->n_logit_bias = u8(&rd) % 3;
        r->seed = u8(&rd);
        r->sample_index = u8(&rd);
        r->output_pos = u8(&rd);
        r->num_logprobs = (int32_t)(u8(&rd) % 23) - 1;
    }
    static float logits[MAXR * MAXV];
    const uint8_t mode = u8(&rd);
    for (int i = 0; i < nrows * vocab; i++)
        logits[i] = mode % 2 ? f32(&rd) : (float)((int)u8(&rd) - 128) * (mode % 4 == 0 ? 0.05f : 2.0f);

    osp_sampler_workspace *ws;
    if (osp_sampler_workspace_create(MAXR, vocab, 1, &ws) != OSP_OK) abort();
    int32_t tok[MAXR];
    osp_status st[MAXR];
    osp_logprobs lp[MAXR];
    const osp_status s = osp_sample_batch(ws, logits, nrows, vocab, rows, tok, lp, st);
    int failed = 0;
    for (int i = 0; i < nrows; i++) {
        if (st[i] != OSP_OK && st[i] != OSP_ERR_INVALID_ARG) abort();
        if (tok[i] < 0 || tok[i] >= vocab) abort();
        failed += st[i] != OSP_OK;
        if (st[i] != OSP_OK) continue;
        const osp_sampler_row *r = &rows[i];
        const float *l = logits + i * vocab;
        if (r->temperature == 0.0f && !r->n_logit_bias && r->presence_penalty == 0.0f &&
            r->frequency_penalty == 0.0f && r->repetition_penalty == 1.0f && r->min_tokens <= r->n_output) {
            int best = 0;
            for (int j = 1; j < vocab; j++) best = l[j] > l[best] ? j : best;
            if (tok[i] != best) abort();
        }
        if (r->num_logprobs >= 0) {
            if (lp[i].token_id != tok[i] || !isfinite(lp[i].logprob) || lp[i].logprob < OSP_LOGPROB_FLOOR ||
                lp[i].logprob > 1e-4f || lp[i].rank < 1 || lp[i].rank > vocab)
                abort();
            if (lp[i].n_top != (r->num_logprobs < vocab ? r->num_logprobs : vocab)) abort();
            for (int j = 0; j < lp[i].n_top; j++) {
                if (!isfinite(lp[i].top_logprobs[j]) || lp[i].top_ids[j] < 0 || lp[i].top_ids[j] >= vocab) abort();
                if (j && lp[i].top_logprobs[j] > lp[i].top_logprobs[j - 1]) abort();
            }
        }
    }
    if ((s == OSP_OK) != (failed == 0)) abort();
    osp_sampler_workspace_free(ws);
    return 0;
}
