/* Raw-distribution logprobs of one row (the chosen token's, its rank, and the top N). */
#ifndef OSP_SAMPLE_LOGPROBS_H
#define OSP_SAMPLE_LOGPROBS_H

#include <stdint.h>

#include "sample/sampler.h"

/* logits [vocab], all finite (the caller checked); token in [0, vocab); num_top in [0, 20].
 * Fills out with log_softmax(logits) values floored at OSP_LOGPROB_FLOOR. Two passes, no allocation. */
void osp_logprobs_fill(const float *logits, int32_t vocab, int32_t token, int32_t num_top, osp_logprobs *out);

#endif
