/* The model runner (see model_runner.h). All buffers are sized at creation: a step allocates nothing
 * beyond what the forward pass's workspace already holds after the first steps. */
#include "engine/model_runner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/status_internal.h"
#include "core/threadpool.h"
#include "grammar/grammar.h"
#include "model/model_exec.h"
#include "spec/verify.h"

/* Samples rows [begin, end) of this step on model thread ith, with the sampler scratch slot ith: the
 * forward pass's threads do the sampling too, so no second set of threads (OpenMP) competes with
 * them for the cores. */
typedef struct sample_ctx {
    osp_model_runner *r;
    int32_t nr;
    osp_status call_status; /* a bad call (not a bad row); written by the thread that saw it */
} sample_ctx;

static void sample_task(void *arg, int ith, int nth) {
    sample_ctx *c = arg;
    osp_model_runner *r = c->r;
    long long b, e;
    osp_split(c->nr, ith, nth, &b, &e);
    if (b == e) return;
    const osp_status st = osp_sample_rows(r->ws, ith, r->logits, (int32_t)b, (int32_t)e, r->n_vocab, r->rows,
                                          r->tokens, r->lp, r->status);
    bool row_failed = false;
    for (long long i = b; i < e; i++) row_failed |= r->status[i] != OSP_OK;
    if (st != OSP_OK && !row_failed) c->call_status = st;
}

osp_status osp_runner_create(osp_model *m, int32_t num_blocks, int32_t block_size, osp_kv_dtype k_dtype, osp_kv_dtype v_dtype,
                             const float *k_fixed, const float *v_fixed,
                             int32_t max_rows, int32_t max_model_len, int32_t max_tokens, int32_t max_spec,
                             osp_model_runner **out) {
    *out = NULL;
    osp_model_runner *r = calloc(1, sizeof *r);
    if (!r) return osp_set_error(OSP_ERR_NOMEM, "model runner: out of memory");
    r->model = m;
    r->n_vocab = osp_model_config_get(m)->n_vocab;
    r->n_embd = osp_model_config_get(m)->n_embd;
    r->max_rows = max_rows;
    osp_status s = osp_kv_cache_create_with_scales(m, num_blocks, block_size, k_dtype, v_dtype, k_fixed, v_fixed, &r->kv);
    if (s == OSP_OK) s = osp_pb_create(max_rows, max_model_len, block_size, max_tokens, max_spec, &r->pb);
    /* a verification row samples each of its positions: up to pb->max_logits sampler rows a step */
    if (s == OSP_OK) r->max_sample = r->pb->max_logits > max_rows ? r->pb->max_logits : max_rows;
    /* one scratch slot per model thread: rows are sampled on the model's thread pool */
    if (s == OSP_OK) s = osp_sampler_workspace_create(r->max_sample, r->n_vocab, osp_model_n_threads(m), &r->ws);
    if (s == OSP_OK) {
        const size_t R = (size_t)r->max_sample, P = OSP_MAX_PROMPT_LP_PER_STEP;
        r->logits = malloc(sizeof(float) * (R + P) * (size_t)r->n_vocab);
        r->rows = malloc(sizeof *r->rows * R);
        r->row_req = malloc(sizeof *r->row_req * R);
        r->row_entry = malloc(sizeof *r->row_entry * R);
        r->tokens = malloc(sizeof *r->tokens * R);
        r->lp = malloc(sizeof *r->lp * R);
        r->status = malloc(sizeof *r->status * (R + P));
        r->plp_next = malloc(sizeof *r->plp_next * P);
        r->lrow = malloc(sizeof *r->lrow * R);
        if (!r->lrow || !r->logits || !r->rows || !r->row_req || !r->row_entry || !r->tokens || !r->lp || !r->status || !r->plp_next)
            s = osp_set_error(OSP_ERR_NOMEM, "model runner: out of memory for logits");
    }
    if (s != OSP_OK) {
        osp_runner_destroy(r);
        return s;
    }
    *out = r;
    return OSP_OK;
}

void osp_runner_destroy(osp_model_runner *r) {
    if (!r) return;
    if (r->trace) fclose(r->trace);
    osp_kv_cache_free(r->kv);
    osp_pb_destroy(r->pb);
    osp_sampler_workspace_free(r->ws);
    free(r->logits);
    free(r->embd);
    free(r->gmask);
    free(r->g_rows), free(r->g_lrow), free(r->g_idx), free(r->g_tokens), free(r->g_lp), free(r->g_status);
    free(r->rows);
    free(r->row_req);
    free(r->row_entry);
    free(r->tokens);
    free(r->lp);
    free(r->status);
    free(r->plp_next);
    free(r->lrow);
    free(r);
}

/* Says why a row of logits could not be sampled. */
static void row_error(osp_request *q, const float *logits, int32_t vocab, const char *what, int32_t pos) {
    int32_t bad = -1;
    for (int32_t v = 0; v < vocab && bad < 0; v++)
        if (!isfinite(logits[v])) bad = v;
    if (bad >= 0)
        snprintf(q->error, sizeof q->error, "%s at position %d: the model produced a non-finite logit (%g for token %d)",
                 what, pos, (double)logits[bad], bad);
    else
        snprintf(q->error, sizeof q->error, "%s at position %d: every token is masked or a parameter is invalid", what,
                 pos);
}

/* Prompt positions of row `row` (scheduled from c0, n tokens) that need logprobs: [*lo, *hi). */
static void plp_range(const osp_request *q, int32_t c0, int32_t n, int32_t *lo, int32_t *hi) {
    *lo = *hi = 0;
    if (q->prompt_logprobs < 0 || !q->prompt_lp) return;
    *lo = c0 > q->num_prompt_lp ? c0 : q->num_prompt_lp;
    *hi = c0 + n < q->num_prompt - 1 ? c0 + n : q->num_prompt - 1;
    if (*hi < *lo) *hi = *lo;
}

/* Pools this step's chunk of embedding row `row` (its tokens are rows t0.. of r->embd) into its request;
 * finishes the vector when the chunk ends the prompt. */
static void pool_row(osp_model_runner *r, osp_sched_entry *en, int32_t row, int32_t t0) {
    const osp_persistent_batch *pb = r->pb;
    osp_request *q = en->req;
    const int32_t n = pb->num_scheduled[row], c0 = pb->num_computed[row], E = r->n_embd;
    if (c0 == 0) memset(q->embd_acc, 0, sizeof *q->embd_acc * (size_t)E); /* first chunk (or recomputed) */
    const float *h = r->embd + (size_t)t0 * (size_t)E;
    if (q->pooling == OSP_POOLING_MEAN) {
        for (int32_t t = 0; t < n; t++)
            for (int32_t i = 0; i < E; i++) q->embd_acc[i] += h[(size_t)t * E + i];
    } else if (q->pooling == OSP_POOLING_CLS && c0 == 0) {
        for (int32_t i = 0; i < E; i++) q->embd_acc[i] = h[i];
    }
    if (c0 + n < q->num_prompt) return;
    if (q->pooling == OSP_POOLING_LAST)
        for (int32_t i = 0; i < E; i++) q->embd_acc[i] = h[(size_t)(n - 1) * E + i];
    const double div = q->pooling == OSP_POOLING_MEAN ? (double)q->num_prompt : 1.0;
    double ss = 0;
    for (int32_t i = 0; i < E; i++) {
        const double v = q->embd_acc[i] / div;
        q->embd_acc[i] = v;
        ss += v * v;
    }
    if (!isfinite(ss)) {
        snprintf(q->error, sizeof q->error, "embedding: the model produced a non-finite hidden state");
        en->sampled = OSP_SAMPLED_ERROR;
        return;
    }
    const double scale = q->embd_normalize && ss > 0 ? 1.0 / sqrt(ss) : 1.0;
    for (int32_t i = 0; i < E; i++) q->embd[i] = (float)(q->embd_acc[i] * scale);
}

/* One line of the shape trace: what the forward pass of this step sees (the kernels' workload). */
static void trace_step(osp_model_runner *r, const osp_batch *b) {
    int32_t max_len = 0;
    for (int32_t s = 0; s < b->num_seqs; s++) max_len = b->seq_lens[s] > max_len ? b->seq_lens[s] : max_len;
    fprintf(r->trace, "{\"step\": %lld, \"num_tokens\": %d, \"num_seqs\": %d, \"num_logits\": %d, \"max_seq_len\": %d, "
                      "\"q_lens\": [", (long long)r->trace_step++, b->num_tokens, b->num_seqs, b->num_logits, max_len);
    for (int32_t s = 0; s < b->num_seqs; s++)
        fprintf(r->trace, "%s%d", s ? ", " : "", b->query_start_loc[s + 1] - b->query_start_loc[s]);
    fputs("], \"seq_lens\": [", r->trace);
    for (int32_t s = 0; s < b->num_seqs; s++) fprintf(r->trace, "%s%d", s ? ", " : "", b->seq_lens[s]);
    fputs("]}\n", r->trace);
    fflush(r->trace);
}

/* The verification row whose sampler rows start at i0 (positions 0..num_spec): keeps the drafts up to
 * the first the target did not draw, then the target's draw there (verify.h); logprobs are the
 * target's at each kept position. A failed sampler row within the kept positions fails the request
 * after the drafts before it. Returns the row's number of sampler rows. */
static int32_t verify_row(osp_model_runner *r, osp_sched_output *out, int32_t i0) {
    osp_persistent_batch *pb = r->pb;
    const size_t V = (size_t)r->n_vocab, L = (size_t)pb->max_model_len;
    osp_sched_entry *en = &out->entries[r->row_entry[i0]];
    osp_request *q = en->req;
    const int32_t ns = en->num_spec, row = pb->in_logits_row[i0];
    int32_t a = osp_spec_verify_point(q->spec_tokens, ns, r->tokens + i0);
    for (int32_t j = 0; j <= a; j++) /* the first failure among the kept positions ends the row there */
        if (r->status[i0 + j] != OSP_OK) {
            row_error(q, r->logits + (size_t)(i0 + j) * V, r->n_vocab, "sampling", q->num_tokens + j);
            a = j;
            break;
        }
    for (int32_t j = 0; j <= a && j <= ns; j++)
        if (r->status[i0 + j] == OSP_OK && r->rows[i0 + j].num_logprobs >= 0 && q->logprobs)
            q->logprobs[r->rows[i0 + j].n_output] = r->lp[i0 + j];
    if (q->matcher && r->status[i0 + a] == OSP_OK) { /* the kept drafts, then the target's token */
        for (int32_t j = 0; j <= a; j++)
            if (osp_grammar_matcher_accept_token(q->matcher, r->trie, j < a ? q->spec_tokens[j] : r->tokens[i0 + a]) !=
                OSP_OK) {
                snprintf(q->error, sizeof q->error, "structured output at position %d: %s", q->num_tokens + j,
                         osp_last_error());
                r->status[i0 + j] = OSP_ERR_INVALID_ARG;
                a = j;
                break;
            }
    }
    en->num_accepted = a;
    if (r->status[i0 + a] != OSP_OK) {
        en->sampled = OSP_SAMPLED_ERROR;
    } else {
        en->sampled = r->tokens[i0 + a];
        /* the row's tokens: the accepted drafts are in place already, the target's token after them */
        pb->token_ids[(size_t)row * L + pb->num_tokens[row] + a] = en->sampled;
        pb->num_tokens[row] += a + 1;
    }
    pb->num_scheduled[row] -= ns - a; /* the rejected drafts were not computed */
    return ns + 1;
}

/* GPU sampling with some rows under a grammar mask: the unmasked rows, compacted in order, through the GPU
 * sampler; each masked row's logits to the host and through the CPU sampler (the same steps, the mask
 * being step 0; sampler.h). */
static osp_status sample_masked_on_host(osp_model_runner *r, int32_t nr) {
    const size_t V = (size_t)r->n_vocab, M = (size_t)r->max_sample;
    if (!r->g_rows) {
        r->g_rows = malloc(sizeof *r->g_rows * M);
        r->g_lrow = malloc(sizeof *r->g_lrow * M);
        r->g_idx = malloc(sizeof *r->g_idx * M);
        r->g_tokens = malloc(sizeof *r->g_tokens * M);
        r->g_lp = malloc(sizeof *r->g_lp * M);
        r->g_status = malloc(sizeof *r->g_status * M);
        if (!r->g_rows || !r->g_lrow || !r->g_idx || !r->g_tokens || !r->g_lp || !r->g_status) {
            free(r->g_rows), free(r->g_lrow), free(r->g_idx), free(r->g_tokens), free(r->g_lp), free(r->g_status);
            r->g_rows = NULL;
            return osp_set_error(OSP_ERR_NOMEM, "model runner: out of memory");
        }
    }
    int32_t ng = 0;
    for (int32_t i = 0; i < nr; i++) {
        if (r->rows[i].allowed) continue;
        r->g_rows[ng] = r->rows[i];
        r->g_lrow[ng] = r->lrow[i];
        r->g_idx[ng++] = i;
    }
    if (ng > 0) {
        OSP_TRY(osp_model_sample(r->model, r->g_rows, r->g_lrow, ng, r->g_tokens, r->g_lp, r->g_status));
        for (int32_t k = 0; k < ng; k++) {
            const int32_t i = r->g_idx[k];
            r->tokens[i] = r->g_tokens[k];
            r->lp[i] = r->g_lp[k];
            r->status[i] = r->g_status[k];
        }
    }
    for (int32_t i = 0; i < nr; i++) {
        if (!r->rows[i].allowed) continue;
        OSP_TRY(osp_model_logits_to_host(r->model, r->lrow[i], 1, r->logits + (size_t)i * V));
        const osp_status st = osp_sample_rows(r->ws, 0, r->logits, i, i + 1, r->n_vocab, r->rows, r->tokens, r->lp,
                                              r->status);
        if (st != OSP_OK && r->status[i] == OSP_OK) return st; /* a bad call, not a bad row */
    }
    return OSP_OK;
}

osp_status osp_runner_execute(osp_model_runner *r, osp_sched_output *out) {
    osp_persistent_batch *pb = r->pb;
    const size_t V = (size_t)r->n_vocab, L = (size_t)pb->max_model_len;
    if (r->timeline) r->t_forward[0] = r->t_forward[1] = r->t_forward[2] = osp_now_s(); /* phases a step skips: empty */
    OSP_TRY(osp_pb_apply(pb, out));
    if (out->num_entries == 0) return OSP_OK;
    const int32_t nl = osp_pb_build(pb);

    /* prompt-logprob positions after the sampled rows (the scheduler keeps them within the bound) */
    int32_t np = 0;
    int32_t *idx = pb->in_logits_idx;
    for (int32_t row = 0, t0 = 0; row < pb->num_rows; row++) {
        const int32_t n = pb->num_scheduled[row], c0 = pb->num_computed[row];
        if (n == 0) continue;
        const osp_request *q = out->entries[pb->entry[row]].req;
        int32_t lo, hi;
        plp_range(q, c0, n, &lo, &hi);
        if (np + hi - lo > OSP_MAX_PROMPT_LP_PER_STEP)
            return osp_set_error(OSP_ERR_INTERNAL, "model runner: too many prompt-logprob positions in one step");
        for (int32_t p = lo; p < hi; p++, np++) {
            idx[nl + np] = t0 + (p - c0);
            r->plp_next[np] = q->tokens[p + 1];
        }
        t0 += n;
    }
    pb->batch.num_logits = nl + np;
    if (r->trace) trace_step(r, &pb->batch);
    /* On the GPU the logits stay there: only prompt-logprob rows (and rows that fail) come back. */
    const bool gpu = osp_model_samples_on_device(r->model);
    bool any_embd = false;
    for (int32_t row = 0; row < pb->num_rows && !any_embd; row++)
        any_embd = pb->num_scheduled[row] > 0 && pb->pooling[row] != OSP_POOLING_NONE;
    if (any_embd && !r->embd && !(r->embd = malloc(sizeof *r->embd * (size_t)pb->max_tokens * (size_t)r->n_embd)))
        return osp_set_error(OSP_ERR_NOMEM, "model runner: out of memory for embeddings");
    if (r->timeline) r->t_forward[0] = osp_now_s();
    OSP_TRY(osp_model_forward_embd(r->model, r->kv, &pb->batch, gpu ? NULL : r->logits, NULL, any_embd ? r->embd : NULL));
    if (r->timeline) r->t_forward[1] = osp_now_s();
    for (int32_t row = 0, t0 = 0; any_embd && row < pb->num_rows; row++) {
        if (pb->num_scheduled[row] == 0) continue;
        if (pb->pooling[row] != OSP_POOLING_NONE) pool_row(r, &out->entries[pb->entry[row]], row, t0);
        t0 += pb->num_scheduled[row];
    }
    if (gpu && np > 0) OSP_TRY(osp_model_logits_to_host(r->model, nl, np, r->logits + (size_t)nl * V));

    if (np > 0) {
        int32_t j = 0;
        for (int32_t row = 0; row < pb->num_rows; row++) {
            const int32_t n = pb->num_scheduled[row], c0 = pb->num_computed[row];
            if (n == 0) continue;
            osp_sched_entry *en = &out->entries[pb->entry[row]];
            osp_request *q = en->req;
            int32_t lo, hi;
            plp_range(q, c0, n, &lo, &hi);
            if (hi == lo) continue;
            const float *lg = r->logits + (size_t)(nl + j) * V;
            (void)osp_prompt_logprobs(lg, hi - lo, r->n_vocab, r->plp_next + j, q->prompt_logprobs, q->prompt_lp + lo,
                                      r->status);
            for (int32_t i = 0; i < hi - lo; i++)
                if (r->status[i] != OSP_OK) {
                    row_error(q, lg + (size_t)i * V, r->n_vocab, "prompt logprobs", lo + i);
                    en->sampled = OSP_SAMPLED_ERROR;
                    break;
                }
            q->num_prompt_lp = hi;
            j += hi - lo;
        }
    }

    /* one sampler row per row reaching its end (a verification row: one per position, each seeing the
       drafts before it as outputs), then the first tokens of children being forked */
    int32_t nr = 0;
    for (int32_t i = 0; i < nl; i++) {
        const int32_t row = pb->in_logits_row[i];
        osp_sampler_row *sr = &r->rows[nr];
        *sr = pb->sampling[row];
        sr->prompt_ids = pb->token_ids + (size_t)row * L;
        sr->n_prompt = pb->num_prompt[row];
        sr->output_ids = sr->prompt_ids + sr->n_prompt;
        sr->n_output = pb->num_tokens[row] - pb->num_prompt[row] + pb->in_logits_pos[i];
        sr->output_pos = (uint64_t)sr->n_output;
        r->row_req[nr] = out->entries[pb->entry[row]].req;
        r->lrow[nr] = i;
        r->row_entry[nr++] = pb->entry[row];
    }
    /* structured output: each grammar row's mask (children being forked share their parent's: the
     * same state, no token yet). Position j of a verification row samples under the mask after the
     * row's drafts 0 .. j - 1 (a clone of the matcher walks them; the drafts were cut at the first the
     * grammar refuses, and a position past a refused one is never kept, so its mask is left empty). */
    const size_t W = (size_t)(r->n_vocab + 31) / 32;
    osp_grammar_matcher *walk = NULL; /* the current verification row's clone */
    bool walk_ok = false;
    for (int32_t i = 0; i < nl; i++) {
        osp_request *q = r->row_req[i];
        if (!q->matcher) continue;
        if (!r->gmask && !(r->gmask = malloc(sizeof *r->gmask * W * (size_t)r->max_sample))) {
            osp_grammar_matcher_free(walk);
            return osp_set_error(OSP_ERR_NOMEM, "model runner: out of memory for grammar masks");
        }
        uint32_t *mk = r->gmask + W * (size_t)i;
        const int32_t j = pb->in_logits_pos[i], ns = out->entries[r->row_entry[i]].num_spec;
        osp_grammar_matcher *m = q->matcher;
        if (ns > 0 && j == 0) { /* a verification row starts */
            osp_grammar_matcher_free(walk);
            walk = NULL;
            walk_ok = osp_grammar_matcher_clone(q->matcher, &walk) == OSP_OK;
        } else if (ns > 0) {
            walk_ok = walk_ok && osp_grammar_matcher_accept_token(walk, r->trie, q->spec_tokens[j - 1]) == OSP_OK;
            m = walk_ok ? walk : NULL;
        }
        if (!r->trie || !m || osp_grammar_matcher_fill_mask(m, r->trie, mk) != OSP_OK)
            memset(mk, 0, sizeof *mk * W); /* the row fails as "every token is masked" */
        r->rows[i].allowed = mk;
    }
    osp_grammar_matcher_free(walk);
    for (int32_t i = 0; i < nl; i++) {
        const osp_request *q = r->row_req[i];
        if (!q->children || r->rows[i].n_output != 0) continue;
        for (int32_t k = 0; k < q->num_children; k++) {
            osp_request *c = q->children[k];
            if (c->state == OSP_REQ_FINISHED) continue;
            if (nr == r->max_sample) return osp_set_error(OSP_ERR_INTERNAL, "model runner: no sampler row for a child");
            if (!gpu) memcpy(r->logits + (size_t)nr * V, r->logits + (size_t)i * V, sizeof(float) * V);
            r->lrow[nr] = i;
            r->rows[nr] = r->rows[i];
            r->rows[nr].sample_index = c->sampling.sample_index;
            r->rows[nr].num_logprobs = c->sampling.num_logprobs;
            r->row_req[nr] = c;
            r->row_entry[nr++] = -1;
        }
    }
    if (nr > 0 && gpu) {
        /* rows under a grammar mask are sampled on the host (their logits come back; the GPU sampler
           applies no masks): the GPU sampler takes the others, the whole list when none has a mask */
        int32_t nm = 0;
        for (int32_t i = 0; i < nr; i++) nm += r->rows[i].allowed != NULL;
        if (nm == 0) {
            OSP_TRY(osp_model_sample(r->model, r->rows, r->lrow, nr, r->tokens, r->lp, r->status));
        } else {
            OSP_TRY(sample_masked_on_host(r, nr));
        }
        for (int32_t i = 0; i < nr; i++) /* a failed row's logits, for its error message */
            if (r->status[i] != OSP_OK && !r->rows[i].allowed)
                OSP_TRY(osp_model_logits_to_host(r->model, r->lrow[i], 1, r->logits + (size_t)i * V));
    } else if (nr > 0) {
        sample_ctx sc = {r, nr, OSP_OK};
        osp_model_run_parallel(r->model, sample_task, &sc);
        const osp_status st = sc.call_status;
        bool row_failed = false;
        for (int32_t i = 0; i < nr; i++) row_failed |= r->status[i] != OSP_OK;
        if (st != OSP_OK && !row_failed) return st; /* a bad call, not a bad row */
    }
    if (r->timeline) r->t_forward[2] = osp_now_s();
    for (int32_t i = 0; i < nr; i++) {
        osp_request *q = r->row_req[i];
        if (r->row_entry[i] >= 0 && out->entries[r->row_entry[i]].num_spec > 0) {
            i += verify_row(r, out, i) - 1;
            continue;
        }
        const bool ok = r->status[i] == OSP_OK;
        const int32_t tok = r->tokens[i];
        if (!ok) row_error(q, r->logits + (size_t)i * V, r->n_vocab, "sampling", q->num_tokens);
        if (ok && q->matcher && osp_grammar_matcher_accept_token(q->matcher, r->trie, tok) != OSP_OK) {
            snprintf(q->error, sizeof q->error, "structured output at position %d: %s", q->num_tokens, osp_last_error());
            if (r->row_entry[i] < 0) q->fork_token = OSP_SAMPLED_ERROR;
            else out->entries[r->row_entry[i]].sampled = OSP_SAMPLED_ERROR;
            continue;
        }
        if (ok && r->rows[i].num_logprobs >= 0 && q->logprobs) q->logprobs[r->rows[i].n_output] = r->lp[i];
        if (r->row_entry[i] < 0) { /* a child being forked */
            q->fork_token = ok ? tok : OSP_SAMPLED_ERROR;
            continue;
        }
        osp_sched_entry *en = &out->entries[r->row_entry[i]];
        if (en->sampled == OSP_SAMPLED_ERROR) continue; /* its prompt logprobs failed */
        if (!ok) {
            en->sampled = OSP_SAMPLED_ERROR;
            continue;
        }
        const int32_t row = pb->in_logits_row[i];
        pb->token_ids[(size_t)row * L + pb->num_tokens[row]++] = tok;
        en->sampled = tok;
    }
    for (int32_t row = 0; row < pb->num_rows; row++) pb->num_computed[row] += pb->num_scheduled[row];
    return OSP_OK;
}
