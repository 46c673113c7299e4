/* The batched sampler (see sampler.h for the order of processors and the conventions). Each row:
 * check, copy the logits into the thread's scratch, apply bias / min_tokens / penalties in place,
 * then greedy argmax or softmax with temperature followed by the rejection sampler (reject.c), and
 * the raw logprobs (logprobs.c). Rows run in parallel, one scratch set per OpenMP thread, all sized
 * at workspace creation. */
#include "sample/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"
#include "sample/logprobs.h"
#include "sample/reject.h"
#include "sample/rng.h"

osp_sampler_row osp_sampler_row_default(void) {
    osp_sampler_row r = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                         .repetition_penalty = 1.0f, .num_logprobs = -1};
    return r;
}

/* ---- workspace ---------------------------------------------------------------------------- */

typedef struct thread_scratch {
    float *w;         /* [vocab] processed logits, then weights */
    int32_t *ids;     /* [vocab] candidate ids after compaction */
    uint32_t *counts; /* [vocab] output-token counts; all zero between rows */
    uint8_t *seen;    /* [vocab] 1 if in prompt or output; all zero between rows */
} thread_scratch;

struct osp_sampler_workspace {
    int32_t max_rows, vocab, n_threads;
    thread_scratch *t;   /* [n_threads] */
    const char **why;    /* [max_rows] reason a row failed (static strings) */
    int32_t *why_arg;    /* [max_rows] the offending index or value for the message */
};

void osp_sampler_workspace_free(osp_sampler_workspace *ws) {
    if (!ws) return;
    if (ws->t)
        for (int32_t i = 0; i < ws->n_threads; i++) {
            free(ws->t[i].w);
            free(ws->t[i].ids);
            free(ws->t[i].counts);
            free(ws->t[i].seen);
        }
    free(ws->t);
    free(ws->why);
    free(ws->why_arg);
    free(ws);
}

osp_status osp_sampler_workspace_create(int32_t max_rows, int32_t vocab, int32_t n_threads,
                                        osp_sampler_workspace **out) {
    if (!out || max_rows <= 0 || vocab <= 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "sampler workspace: max_rows %d and vocab %d must be > 0",
                             max_rows, vocab);
    if (n_threads <= 0) n_threads = 1;
    osp_sampler_workspace *ws = calloc(1, sizeof *ws);
    if (!ws) goto nomem;
    ws->max_rows = max_rows, ws->vocab = vocab, ws->n_threads = n_threads;
    ws->t = calloc((size_t)n_threads, sizeof *ws->t);
    ws->why = calloc((size_t)max_rows, sizeof *ws->why);
    ws->why_arg = calloc((size_t)max_rows, sizeof *ws->why_arg);
    if (!ws->t || !ws->why || !ws->why_arg) goto nomem;
    for (int32_t i = 0; i < n_threads; i++) {
        thread_scratch *t = &ws->t[i];
        t->w = malloc(sizeof(float) * (size_t)vocab);
        t->ids = malloc(sizeof(int32_t) * (size_t)vocab);
        t->counts = calloc((size_t)vocab, sizeof(uint32_t));
        t->seen = calloc((size_t)vocab, 1);
        if (!t->w || !t->ids || !t->counts || !t->seen) goto nomem;
    }
    *out = ws;
    return OSP_OK;
nomem:
    osp_sampler_workspace_free(ws);
    return osp_set_error(OSP_ERR_NOMEM, "sampler workspace: out of memory (%d rows, vocab %d, %d threads)",
                         max_rows, vocab, n_threads);
}

/* ---- one row ------------------------------------------------------------------------------ */

/* Row failure reasons (the message gets the row index and why_arg). */
static const char *check_params(const osp_sampler_row *p, int32_t vocab, int32_t *arg) {
    if (!(p->temperature >= 0.0f) || isinf(p->temperature)) return "temperature must be finite and >= 0";
    if (p->top_k < -1) return "top_k must be -1, 0 or positive";
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f)) return "top_p must be in [0, 1]";
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) return "min_p must be in [0, 1]";
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty)) return "presence and frequency penalties must be finite";
    if (!(p->repetition_penalty > 0.0f) || isinf(p->repetition_penalty)) return "repetition_penalty must be finite and > 0";
    if (p->num_logprobs < -1 || p->num_logprobs > OSP_MAX_LOGPROBS) return "num_logprobs must be in [-1, 20]";
    if (p->n_logit_bias < 0 || (p->n_logit_bias && !p->logit_bias)) return "logit_bias array missing";
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        *arg = p->logit_bias[i].token_id;
        if (p->logit_bias[i].token_id < 0 || p->logit_bias[i].token_id >= vocab) return "logit_bias token id outside the vocabulary";
        if (!isfinite(p->logit_bias[i].bias)) return "logit_bias value must be finite";
    }
    if (p->n_stop_token_ids < 0 || (p->n_stop_token_ids && !p->stop_token_ids)) return "stop_token_ids missing";
    if (p->n_prompt < 0 || (p->n_prompt && !p->prompt_ids)) return "prompt_ids missing";
    if (p->n_output < 0 || (p->n_output && !p->output_ids)) return "output_ids missing";
    for (int32_t i = 0; i < p->n_stop_token_ids; i++)
        if ((*arg = p->stop_token_ids[i]) < 0 || p->stop_token_ids[i] >= vocab) return "stop token id outside the vocabulary";
    for (int32_t i = 0; i < p->n_prompt; i++)
        if ((*arg = p->prompt_ids[i]) < 0 || p->prompt_ids[i] >= vocab) return "prompt id outside the vocabulary";
    for (int32_t i = 0; i < p->n_output; i++)
        if ((*arg = p->output_ids[i]) < 0 || p->output_ids[i] >= vocab) return "output id outside the vocabulary";
    return NULL;
}

/* Bias, min_tokens and penalties on w [vocab] (a copy of the logits), in place. counts/seen are
 * all-zero scratch, restored to zero before returning; they may be NULL when no penalty is on. */
static void process_logits(float *w, int32_t vocab, const osp_sampler_row *p, uint32_t *counts, uint8_t *seen) {
    if (p->allowed)
        for (int32_t i = 0; i < vocab; i++)
            if (!((p->allowed[i >> 5] >> (i & 31)) & 1)) w[i] = -INFINITY;
    for (int32_t i = 0; i < p->n_logit_bias; i++) w[p->logit_bias[i].token_id] += p->logit_bias[i].bias;
    if (p->n_output < p->min_tokens)
        for (int32_t i = 0; i < p->n_stop_token_ids; i++) {
            w[p->stop_token_ids[i]] = -INFINITY;
        }
    const bool rep = p->repetition_penalty != 1.0f;
    const bool freq = p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
    if (!rep && !freq) return;
    for (int32_t i = 0; i < p->n_output; i++) counts[p->output_ids[i]]++, seen[p->output_ids[i]] = 1;
    if (rep) {
        for (int32_t i = 0; i < p->n_prompt; i++) seen[p->prompt_ids[i]] = 1;
        /* each seen token once: clear `seen` as it is applied */
        const float r = p->repetition_penalty;
        for (int32_t pass = 0; pass < 2; pass++) {
            const int32_t *ids = pass ? p->output_ids : p->prompt_ids;
            const int32_t n = pass ? p->n_output : p->n_prompt;
            for (int32_t i = 0; i < n; i++) {
                const int32_t id = ids[i];
                if (!seen[id]) continue;
                seen[id] = 0;
                w[id] = w[id] > 0.0f ? w[id] / r : w[id] * r;
            }
        }
    }
    for (int32_t i = 0; i < p->n_output; i++) {
        const int32_t id = p->output_ids[i];
        if (!counts[id]) continue; /* already applied */
        if (freq) w[id] -= p->frequency_penalty * (float)counts[id] + p->presence_penalty;
        counts[id] = 0;
        seen[id] = 0;
    }
}

/* (sampler.h) w[i] = exp((w[i] - mx) * inv_t) for w[i] <= mx (and -inf -> 0), in place. A vectorizable expf
 * (Cephes' polynomial, Cody-Waite reduction, exponent by bit arithmetic; within 2 ulp of libm's
 * expf for arguments >= -87, 0 below): libm's scalar expf made this one pass cost most of the row. */
void osp_sampler_exp_shifted(float *restrict w, int32_t n, float mx, float inv_t) {
    for (int32_t i = 0; i < n; i++) {
        float x = (w[i] - mx) * inv_t;
        const int32_t under = !(x >= -87.0f); /* also -inf and NaN */
        x = under ? 0.0f : x;
        const float t = x * 1.44269504088896341f + 12582912.0f; /* round(x / ln 2) in the low bits */
        const float nf = t - 12582912.0f;
        int32_t tb;
        memcpy(&tb, &t, 4);
        const int32_t ni = tb - 0x4B400000; /* the integer n */
        const float r = (x - nf * 0.693359375f) + nf * 2.12194440e-4f;
        float q = 1.9875691500e-4f;
        q = q * r + 1.3981999507e-3f;
        q = q * r + 8.3334519073e-3f;
        q = q * r + 4.1665795894e-2f;
        q = q * r + 1.6666665459e-1f;
        q = q * r + 5.0000001201e-1f;
        q = q * r * r + r + 1.0f;
        const int32_t eb = (ni + 127) << 23;
        float scale;
        memcpy(&scale, &eb, 4);
        w[i] = under ? 0.0f : q * scale;
    }
}

/* Samples one row into *token. Returns NULL, or why the row failed (with *arg set). */
static const char *sample_row(const float *logits, int32_t vocab, const osp_sampler_row *p, float *w, int32_t *ids,
                              uint32_t *counts, uint8_t *seen, int32_t *token, osp_logprobs *lp, int32_t *arg) {
    *token = 0;
    const char *why = check_params(p, vocab, arg);
    if (why) return why;
    int32_t bad = 0; /* copy and check in one pass: |x| <= FLT_MAX fails for NaN and +-inf */
    for (int32_t i = 0; i < vocab; i++) {
        const float x = logits[i];
        w[i] = x;
        bad |= !(fabsf(x) <= 3.40282347e38f);
    }
    if (bad)
        for (int32_t i = 0; i < vocab; i++)
            if (!isfinite(logits[i])) return *arg = i, "logit is NaN or infinite";
    process_logits(w, vocab, p, counts, seen);
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; i++) best = w[i] > w[best] ? i : best;
    if (w[best] == -INFINITY) return *arg = vocab, "every token is masked (grammar mask, min_tokens stop ids)";
    if (isinf(w[best]) || isnan(w[best])) return *arg = best, "penalties or bias made a logit infinite";
    if (p->temperature < OSP_SAMPLING_EPS) {
        *token = best;
    } else {
        /* softmax numerator with max exactly 1.0f; exp(-inf) = 0 for masked tokens */
        osp_sampler_exp_shifted(w, vocab, w[best], 1.0f / p->temperature);
        w[best] = 1.0f;
        const osp_rng_addr rng = {p->seed, p->sample_index, p->output_pos};
        *token = osp_reject_sample(w, ids, vocab, p->top_k, p->top_p, p->min_p, &rng, NULL);
    }
    if (lp && p->num_logprobs >= 0) osp_logprobs_fill(logits, vocab, *token, p->num_logprobs, lp);
    return NULL;
}

/* ---- the batch ---------------------------------------------------------------------------- */

osp_status osp_sample_batch(osp_sampler_workspace *ws, const float *logits, int32_t num_rows, int32_t vocab,
                            const osp_sampler_row *rows, int32_t *out_tokens, osp_logprobs *out_logprobs,
                            osp_status *row_status) {
    if (!ws || !logits || !rows || !out_tokens || !row_status || num_rows < 0 || num_rows > ws->max_rows ||
        vocab != ws->vocab)
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "sample_batch: bad call (num_rows %d of max %d, vocab %d, workspace vocab %d)",
                             num_rows, ws ? ws->max_rows : 0, vocab, ws ? ws->vocab : 0);
    /* on the calling thread (the engine spreads rows over the model's thread pool with
     * osp_sample_rows instead: one threading model, no second set of threads) */
    for (int32_t r = 0; r < num_rows; r++) {
        thread_scratch *t = &ws->t[0];
        ws->why_arg[r] = 0;
        ws->why[r] = sample_row(logits + (size_t)r * (size_t)vocab, vocab, &rows[r], t->w, t->ids, t->counts, t->seen,
                                &out_tokens[r], out_logprobs ? &out_logprobs[r] : NULL, &ws->why_arg[r]);
        row_status[r] = ws->why[r] ? OSP_ERR_INVALID_ARG : OSP_OK;
    }
    for (int32_t r = 0; r < num_rows; r++)
        if (ws->why[r])
            return osp_set_error(OSP_ERR_INVALID_ARG, "sampler: row %d: %s (%d)", r, ws->why[r], ws->why_arg[r]);
    return OSP_OK;
}

osp_status osp_sample_rows(osp_sampler_workspace *ws, int32_t slot, const float *logits, int32_t row_begin,
                           int32_t row_end, int32_t vocab, const osp_sampler_row *rows, int32_t *out_tokens,
                           osp_logprobs *out_logprobs, osp_status *row_status) {
    if (!ws || !logits || !rows || !out_tokens || !row_status || slot < 0 || slot >= ws->n_threads || row_begin < 0 ||
        row_end < row_begin || row_end > ws->max_rows || vocab != ws->vocab)
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "sample_rows: bad call (slot %d of %d, rows [%d, %d) of max %d, vocab %d, workspace vocab %d)",
                             slot, ws ? ws->n_threads : 0, row_begin, row_end, ws ? ws->max_rows : 0, vocab,
                             ws ? ws->vocab : 0);
    thread_scratch *t = &ws->t[slot];
    osp_status first = OSP_OK;
    for (int32_t r = row_begin; r < row_end; r++) {
        int32_t arg = 0;
        const char *why = sample_row(logits + (size_t)r * (size_t)vocab, vocab, &rows[r], t->w, t->ids, t->counts,
                                     t->seen, &out_tokens[r], out_logprobs ? &out_logprobs[r] : NULL, &arg);
        row_status[r] = why ? OSP_ERR_INVALID_ARG : OSP_OK;
        if (why && first == OSP_OK) first = osp_set_error(OSP_ERR_INVALID_ARG, "sampler: row %d: %s (%d)", r, why, arg);
    }
    return first;
}

/* ---- one row for `osprey generate` -------------------------------------------------------- */

osp_sampling_params osp_sampling_default_params(void) {
    osp_sampling_params p = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    return p;
}

osp_status osp_sample(const float *logits, int32_t n_vocab, const osp_sampling_params *p, uint64_t step,
                      float *work, int32_t *token) {
    osp_sampler_row row = osp_sampler_row_default();
    row.temperature = p->temperature;
    row.top_k = p->top_k < 0 ? 0 : p->top_k;
    row.top_p = p->top_p > 1.0f ? 1.0f : p->top_p;
    row.seed = p->seed;
    row.output_pos = step;
    int32_t arg = 0;
    const char *why = sample_row(logits, n_vocab, &row, work, (int32_t *)(void *)(work + n_vocab), NULL, NULL, token,
                                 NULL, &arg);
    return why ? osp_set_error(OSP_ERR_INVALID_ARG, "sampling: %s (%d)", why, arg) : OSP_OK;
}
