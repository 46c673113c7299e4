/* The sampler: one call per engine step turns a batch of logit rows into one token per row.
 *
 * Per row, in vLLM V1's order (vllm/v1/sample/sampler.py):
 *   0. the grammar mask (`allowed`), when the request has structured output: masked tokens -> -inf
 *   1. logit_bias, then min_tokens (the stop ids are masked to -inf while fewer than min_tokens
 *      tokens have been generated)
 *   2. penalties, vLLM's definitions (vllm/model_executor/layers/utils.py apply_penalties):
 *      repetition r over tokens seen in the prompt or the output: logit > 0 -> logit / r, else
 *      logit * r; then frequency f and presence p over output tokens only:
 *      logit -= f * count + p * (count > 0)
 *   3. temperature: below 1e-5 (vLLM's _SAMPLING_EPS) the row is greedy: argmax of the logits after
 *      steps 1-2, lowest id on ties, and steps 4-5 do not apply
 *   4. min-p on softmax(logits / T): keep p_i >= min_p * max p
 *   5. top-k, then top-p on the renormalized top-k distribution; draw from what is kept,
 *      renormalized, by rejection without sorting (reject.c has the algorithm, its source, and the
 *      tie rules: top-k keeps all ties of the k-th value, top-p keeps or drops tie groups whole)
 * Randomness: one Philox4x32-10 stream per sequence addressed by (seed, sample_index, output_pos)
 * (rng.h), so a seeded request draws the same tokens alone or in any batch. Requests without a seed
 * get one at admission from osp_rng_entropy_seed() and keep it.
 * Logprobs come from the raw model distribution, log_softmax(logits) before any of steps 1-5 (vLLM's
 * default "raw_logprobs"), floored at OSP_LOGPROB_FLOOR (-9999.0, the value vLLM's API substitutes for
 * -inf) so they are always finite.
 *
 * Errors are per row: NaN or +-inf in a row's logits, a parameter out of range, or every token
 * masked fail that row only (row_status), which gets token 0 so an unchecked id is still inside the
 * vocabulary; the other rows are sampled as usual. */
#ifndef OSP_SAMPLE_SAMPLER_H
#define OSP_SAMPLE_SAMPLER_H

#include <stdint.h>

#include "osprey/status.h"

#define OSP_MAX_LOGPROBS 20
#define OSP_LOGPROB_FLOOR (-9999.0f)
#define OSP_SAMPLING_EPS 1e-5f

typedef struct osp_logit_bias {
    int32_t token_id;
    float bias; /* added to the logit */
} osp_logit_bias;

/* One row of a step: a sequence (request, or one of its n children) at one output position. */
typedef struct osp_sampler_row {
    float temperature;        /* < 1e-5: greedy */
    int32_t top_k;            /* 0 or -1: off; >= vocab: off */
    float top_p;              /* [0, 1]; 1: off; 0: only the most likely token (ties kept) */
    float min_p;              /* [0, 1]; 0: off */
    float presence_penalty;   /* 0: off (any finite value) */
    float frequency_penalty;  /* 0: off (any finite value) */
    float repetition_penalty; /* > 0; 1: off */
    const osp_logit_bias *logit_bias; /* [n_logit_bias], ids in [0, vocab) */
    int32_t n_logit_bias;
    int32_t min_tokens;             /* stop ids masked while n_output < min_tokens */
    const int32_t *stop_token_ids;  /* [n_stop_token_ids]: EOS and the request's stop ids */
    int32_t n_stop_token_ids;
    const int32_t *prompt_ids;      /* [n_prompt]: for the repetition penalty */
    int32_t n_prompt;
    const int32_t *output_ids;      /* [n_output]: generated so far (penalties, min_tokens) */
    int32_t n_output;
    uint64_t seed;                  /* the request's seed (given, or drawn at admission) */
    uint32_t sample_index;          /* which of the request's n children, 0-based */
    uint64_t output_pos;            /* index of the token being sampled in this child's output */
    int32_t num_logprobs;           /* -1: none; 0: the chosen token's only; 1..20: plus the top N */
    const uint32_t *allowed;        /* [(vocab + 31) / 32] or NULL: a structured-output mask (bit id & 31 of
                                       word id / 32 set = may be sampled; src/grammar/), applied first,
                                       before logit_bias; logprobs stay those of the raw logits */
} osp_sampler_row;
/* Penalty state is the id lists themselves: a row with penalties costs O(n_prompt + n_output) per
 * step (counts are rebuilt in the thread's scratch and cleared after), no per-request map to keep. */

/* Chosen-token and top-N logprobs of one row, from the raw distribution (see above). */
typedef struct osp_logprobs {
    int32_t token_id;                     /* the chosen (or, for prompts, the next) token */
    float logprob;                        /* its logprob, >= OSP_LOGPROB_FLOOR */
    int32_t rank;                         /* 1 + #tokens with a strictly higher logprob */
    int32_t n_top;                        /* entries used below (= num_logprobs, <= vocab) */
    int32_t top_ids[OSP_MAX_LOGPROBS];    /* descending logprob, lower id first on ties */
    float top_logprobs[OSP_MAX_LOGPROBS]; /* >= OSP_LOGPROB_FLOOR */
} osp_logprobs;

/* Defaults: temperature 1, every filter and penalty off, seed 0, no logprobs. */
osp_sampler_row osp_sampler_row_default(void);

typedef struct osp_sampler_workspace osp_sampler_workspace;

/* Allocates everything the sampler needs for batches of up to max_rows rows over `vocab` tokens,
 * with scratch for n_threads threads (slots of osp_sample_rows; <= 0: 1). Per thread: 2 floats/ints of
 * scratch and a 4-byte counter plus a flag byte per vocabulary entry. Returns OSP_ERR_INVALID_ARG or
 * OSP_ERR_NOMEM; on success the caller owns *out and frees it with osp_sampler_workspace_free. */
osp_status osp_sampler_workspace_create(int32_t max_rows, int32_t vocab, int32_t n_threads,
                                        osp_sampler_workspace **out);
void osp_sampler_workspace_free(osp_sampler_workspace *ws);

/* Samples one token per row.
 * logits [num_rows, vocab] fp32, row-major, not modified. rows [num_rows]. vocab and num_rows must
 * fit the workspace. out_tokens [num_rows]: token ids in [0, vocab). out_logprobs [num_rows] or NULL
 * (then num_logprobs is ignored); filled for rows with num_logprobs >= 0. row_status [num_rows]:
 * OSP_OK, or OSP_ERR_INVALID_ARG for a row with non-finite logits, bad parameters or every token
 * masked (its token is 0).
 * Returns OSP_OK if every row succeeded; otherwise the first failing row's status, with
 * osp_last_error() naming the row and the reason (rows with OSP_OK are valid either way); or
 * OSP_ERR_INVALID_ARG for a bad call (NULL pointers, sizes beyond the workspace), writing nothing.
 * out_logprobs of failed rows are left as they were. Allocates nothing. Rows run one after another
 * on the calling thread (scratch slot 0); one call at a time per workspace. */
osp_status osp_sample_batch(osp_sampler_workspace *ws, const float *logits, int32_t num_rows, int32_t vocab,
                            const osp_sampler_row *rows, int32_t *out_tokens, osp_logprobs *out_logprobs,
                            osp_status *row_status);

/* The same for rows [row_begin, row_end) of the arrays above, on the calling thread only, with the
 * workspace's scratch set `slot` (in [0, n_threads) of the workspace): for callers that split rows
 * over their own threads (e.g. inside osp_threadpool_run, slot = ith), each thread its own slot.
 * Returns OSP_OK or the first failing row's status (message on this thread). */
osp_status osp_sample_rows(osp_sampler_workspace *ws, int32_t slot, const float *logits, int32_t row_begin,
                           int32_t row_end, int32_t vocab, const osp_sampler_row *rows, int32_t *out_tokens,
                           osp_logprobs *out_logprobs, osp_status *row_status);

/* Logprobs of prompt tokens: for each of num_rows positions, the raw distribution logits
 * [num_rows, vocab] and the token that actually follows, next_ids [num_rows]; num_top in [0, 20]
 * (top-N entries besides the next token's own). out [num_rows]; row_status [num_rows] as above
 * (non-finite logits or a next id outside the vocabulary fail the row). Returns as osp_sample_batch.
 * Allocates nothing; single-threaded. */
osp_status osp_prompt_logprobs(const float *logits, int32_t num_rows, int32_t vocab, const int32_t *next_ids,
                               int32_t num_top, osp_logprobs *out, osp_status *row_status);

/* The sampler's weights: w[i] = exp((w[i] - mx) * inv_t), in place, for w [n] with every w[i] <= mx
 * (-inf and anything below exp's range give 0). A vectorizable expf (Cephes' polynomial, Cody-Waite
 * reduction) within 2 ulp of libm's; exported so the GPU sampler's tests can compute the same weights
 * bit for bit. */
void osp_sampler_exp_shifted(float *w, int32_t n, float mx, float inv_t);

/* ---- the one-row call used by `osprey generate` ------------------------------------------- */

typedef struct osp_sampling_params {
    float temperature; /* 0 = greedy */
    int32_t top_k;     /* <= 0: off */
    float top_p;       /* >= 1: off */
    uint64_t seed;
} osp_sampling_params;

osp_sampling_params osp_sampling_default_params(void);

/* Picks a token from logits [n_vocab] (fp32; not modified) with the rules above (no penalties, no
 * min-p). `step` is the index of this token in the output (the output position of the Philox
 * stream, sample index 0). `work` is a caller-owned workspace of 2 * n_vocab floats (no allocation
 * per call). Fails with OSP_ERR_INVALID_ARG if a logit is NaN or +-inf or a parameter is out of range. */
osp_status osp_sample(const float *logits, int32_t n_vocab, const osp_sampling_params *p, uint64_t step,
                      float *work, int32_t *token);

#endif
