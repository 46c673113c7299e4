/* Logprobs from the raw model distribution: log_softmax of the logits as the model produced them,
 * before bias, penalties, temperature and filters (vLLM's default logprobs_mode "raw_logprobs").
 * The top N are found in one pass with a small sorted insertion array (N <= 20), so nothing sorts
 * the vocabulary. Values are floored at -9999.0 (what vLLM's API writes for -inf) so JSON never sees
 * an infinity; with finite logits the floor only bites for logits ~1e4 below the max. */
#include "sample/logprobs.h"

#include <math.h>
#include <stddef.h>

#include "core/status_internal.h"

static float floor_lp(double x) { return x < (double)OSP_LOGPROB_FLOOR ? OSP_LOGPROB_FLOOR : (float)x; }

void osp_logprobs_fill(const float *logits, int32_t vocab, int32_t token, int32_t num_top, osp_logprobs *out) {
    float mx = logits[0];
    for (int32_t i = 1; i < vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0.0;
    const float chosen = logits[token];
    int32_t above = 0;
    if (num_top > vocab) num_top = vocab;
    if (num_top > OSP_MAX_LOGPROBS) num_top = OSP_MAX_LOGPROBS;
    if (num_top < 0) num_top = 0;
    int32_t n = 0; /* entries in the top list, descending value, lower id first on ties */
    for (int32_t i = 0; i < vocab; i++) {
        const float x = logits[i];
        sum += exp((double)(x - mx));
        above += x > chosen;
        if (num_top && (n < num_top || x > out->top_logprobs[n - 1])) {
            int32_t j = n < num_top ? n++ : n - 1;
            while (j > 0 && out->top_logprobs[j - 1] < x) {
                out->top_logprobs[j] = out->top_logprobs[j - 1];
                out->top_ids[j] = out->top_ids[j - 1];
                j--;
            }
            out->top_logprobs[j] = x;
            out->top_ids[j] = i;
        }
    }
    const double lse = (double)mx + log(sum);
    out->token_id = token;
    out->logprob = floor_lp((double)chosen - lse);
    out->rank = above + 1;
    out->n_top = n;
    for (int32_t j = 0; j < n; j++) out->top_logprobs[j] = floor_lp((double)out->top_logprobs[j] - lse);
}

osp_status osp_prompt_logprobs(const float *logits, int32_t num_rows, int32_t vocab, const int32_t *next_ids,
                               int32_t num_top, osp_logprobs *out, osp_status *row_status) {
    if (!logits || !next_ids || !out || !row_status || num_rows < 0 || vocab <= 0 || num_top < 0 ||
        num_top > OSP_MAX_LOGPROBS)
        return osp_set_error(OSP_ERR_INVALID_ARG, "prompt logprobs: bad arguments (num_rows %d, vocab %d, num_top %d)",
                             num_rows, vocab, num_top);
    osp_status first = OSP_OK;
    for (int32_t r = 0; r < num_rows; r++) {
        const float *row = logits + (size_t)r * (size_t)vocab;
        int32_t bad = -1;
        for (int32_t i = 0; i < vocab && bad < 0; i++)
            if (!isfinite(row[i])) bad = i;
        row_status[r] = OSP_OK;
        if (bad >= 0 || next_ids[r] < 0 || next_ids[r] >= vocab) {
            row_status[r] = OSP_ERR_INVALID_ARG;
            out[r] = (osp_logprobs){0};
            if (first == OSP_OK) {
                first = bad >= 0 ? osp_set_error(OSP_ERR_INVALID_ARG, "prompt logprobs: row %d: logit %d is %f", r, bad,
                                                 (double)row[bad])
                                 : osp_set_error(OSP_ERR_INVALID_ARG, "prompt logprobs: row %d: next id %d outside [0, %d)",
                                                 r, next_ids[r], vocab);
            }
            continue;
        }
        osp_logprobs_fill(row, vocab, next_ids[r], num_top, &out[r]);
    }
    return first;
}
