/* The n-gram proposer (prompt lookup decoding; vLLM's "ngram" method): when the text being written
 * repeats text seen before (code being edited, a document being summarized or quoted, a list being
 * continued), the tokens that followed the last occurrence of the current suffix are a good guess for
 * what comes next. No model, no state: a scan of the sequence's own tokens each step.
 *
 * Which match: the longest n in [min_n, max_n] that matches at all, and of its matches the earliest
 * in the sequence (vLLM's choice: in an edit the source text comes first, and it is what the
 * output copies). Also the proposer factory (osp_proposer_create). */
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"
#include "spec/proposer.h"

int32_t osp_ngram_propose(const int32_t *tokens, int32_t num_tokens, int32_t min_n, int32_t max_n, int32_t k,
                          int32_t *draft) {
    if (k <= 0 || min_n < 1 || max_n < min_n) return 0;
    if (max_n > num_tokens - 1) max_n = num_tokens - 1; /* a match needs one token after it */
    for (int32_t n = max_n; n >= min_n; n--) {
        const int32_t *suffix = tokens + num_tokens - n;
        /* starts i with i + n <= num_tokens - 1: the match ends before the last token */
        for (int32_t i = 0; i + n < num_tokens; i++) {
            if (tokens[i] != suffix[0] || memcmp(tokens + i, suffix, sizeof *tokens * (size_t)n) != 0) continue;
            const int32_t start = i + n;
            int32_t cnt = num_tokens - start;
            if (cnt > k) cnt = k;
            memcpy(draft, tokens + start, sizeof *draft * (size_t)cnt);
            return cnt;
        }
    }
    return 0;
}

typedef struct ngram_proposer {
    osp_proposer base;
    int32_t min_n, max_n;
} ngram_proposer;

static osp_status ngram_run(osp_proposer *p, osp_spec_seq *seqs, int32_t n) {
    const ngram_proposer *g = (const ngram_proposer *)p;
    for (int32_t i = 0; i < n; i++)
        seqs[i].num_draft = osp_ngram_propose(seqs[i].tokens, seqs[i].num_tokens, g->min_n, g->max_n,
                                              seqs[i].max_draft, seqs[i].draft);
    return OSP_OK;
}

static void ngram_destroy(osp_proposer *p) { free(p); }

static const osp_proposer_ops ngram_ops = {.name = "ngram", .propose = ngram_run, .destroy = ngram_destroy};

osp_status osp_proposer_create(const osp_spec_config *c, const osp_proposer_target *t, osp_proposer **out) {
    *out = NULL;
    OSP_TRY(osp_spec_config_check(c));
    if (c->method == OSP_SPEC_DRAFT_MODEL) {
        if (!t) return osp_set_error(OSP_ERR_INVALID_ARG, "speculative decoding: a draft model needs its target");
        return osp_draft_proposer_create(c, t, out);
    }
    if (c->method == OSP_SPEC_QUANTSPEC) {
        if (!t) return osp_set_error(OSP_ERR_INVALID_ARG, "speculative decoding: quantspec needs its target");
        return osp_quantspec_proposer_create(c, t, out);
    }
    if (c->method != OSP_SPEC_NGRAM)
        return osp_set_error(OSP_ERR_INVALID_ARG, "speculative decoding: no proposer for method %s",
                             osp_spec_method_name(c->method) ? osp_spec_method_name(c->method) : "?");
    ngram_proposer *g = calloc(1, sizeof *g);
    if (!g) return osp_set_error(OSP_ERR_NOMEM, "speculative decoding: out of memory");
    g->base.ops = &ngram_ops;
    g->min_n = c->prompt_lookup_min;
    g->max_n = c->prompt_lookup_max;
    *out = &g->base;
    return OSP_OK;
}

void osp_proposer_destroy(osp_proposer *p) {
    if (p) p->ops->destroy(p);
}
