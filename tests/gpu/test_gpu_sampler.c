/* The GPU sampler (src/backend/cuda/sample.cu) against the CPU sampler, which is its spec.
 *
 * Distributions (tests/unit/test_sampler.c's method): batches of rows with different parameters,
 * each row repeated at many output positions (a different Philox stream per draw), the counts
 * compared with the exact filtered and renormalized distribution computed here in double by sorting
 * (not the library's code): chi-square over the bins with expected count >= 5 (the rest pooled)
 * against the p = 1e-6 critical value (Wilson-Hilferty), total variation distance against 3 standard
 * errors, and a token of probability 0 never drawn. Vocabularies 48 (the CPU test's 20 rows: every
 * filter, combination, edge value and tie pattern), 1003, 49152 and 128256.
 *
 * Agreement: the GPU computes bit-identical weights and draws the same Philox uniforms, so its token
 * equals the CPU's except where a mass summed in another order (double tree here, float lanes there)
 * lands across a boundary. Seeded rows on well-separated random logits must agree >= 99% (reported);
 * greedy rows, penalties, logit_bias and min_tokens included, exactly. The exact fallback (after 32
 * rounds; forced after 0 or 1 with osp_cuda_sample_ex) against osp_reject_sample_ex on the same
 * weights, token and rounds, and in distribution.
 *
 * Also: logprobs against osp_logprobs_fill (values within 1e-4, ids and ranks exact, the -9999
 * floor), per-row errors (NaN / inf logits, each bad parameter, every token masked: that row alone
 * fails, token 0, logprobs untouched), batch invariance (a seeded row gives bitwise the same token and
 * logprobs alone, in any batch, at any position, and again), and the launcher's host checks.
 * Exits 77 (skipped) without a CUDA device. */
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_sample.h"
#include "osprey/status.h"
#include "sample/logprobs.h"
#include "sample/reject.h"
#include "sample/rng.h"
#include "sample/sampler.h"
#include "sampler_cases.h"

/* Built without CUDA (OSPREY_CUDA off) the launcher does not exist: the test only skips. */
#ifdef OSPREY_HAVE_CUDA

#define CHECK(call)                                                                                \
    do {                                                                                           \
        const osp_status check_s_ = (call);                                                        \
        if (check_s_ != OSP_OK) fail_msg("%s: %s", #call, osp_last_error());                       \
    } while (0)

static double uni(uint64_t seed, uint64_t i, uint32_t j) { return osp_rng_uniform_at(seed, 0, i, j); }

/* ---- the GPU side: one scratch, device buffers grown on demand ------------------------------------ */

#define SCRATCH_BYTES ((size_t)3 << 30)
#define MAX_LAUNCH_ROWS 65536

typedef struct dbuf {
    void *p;
    size_t cap; /* bytes */
} dbuf;

static struct {
    void *stream, *scratch;
    int32_t layout_vocab; /* the vocab the zeroed count arrays are laid out for */
    dbuf logits, rows, tokens, status, lp, rounds, ids, bias_ids, bias_vals;
} G;

static void *dev(dbuf *b, size_t bytes, const char *what) {
    if (b->p && bytes <= b->cap) return b->p;
    osp_cuda_free(b->p);
    b->p = NULL;
    b->cap = bytes < 4096 ? 4096 : bytes;
    CHECK(osp_cuda_malloc(&b->p, b->cap, what));
    return b->p;
}

static int32_t npos(int32_t n) { return n > 0 ? n : 0; }

/* Samples rows [num_rows] on the GPU: row r reads logits row lrow[r] (r when lrow is NULL) of
 * logits [n_lrows, vocab]. lp (may be NULL) is copied to the device first, so entries the kernel does
 * not write come back as they were. rounds may be NULL. Launches of at most what the scratch holds. */
static void gpu_sample(const float *logits, int32_t n_lrows, int32_t vocab, const osp_sampler_row *rows,
                       const int32_t *lrow, int32_t num_rows, int32_t max_rounds, int32_t *tokens, osp_status *status,
                       osp_logprobs *lp, int32_t *rounds) {
    const size_t per_row = osp_cuda_sample_scratch_bytes(1, vocab);
    assert_true(per_row > 0);
    if (G.layout_vocab != vocab) { /* the layout follows vocab: zero the count arrays again */
        CHECK(osp_cuda_memset(G.scratch, 0, SCRATCH_BYTES, G.stream));
        G.layout_vocab = vocab;
    }
    int32_t max_rows = (int32_t)(SCRATCH_BYTES / per_row);
    if (max_rows > MAX_LAUNCH_ROWS) max_rows = MAX_LAUNCH_ROWS;
    const size_t lbytes = sizeof(float) * (size_t)n_lrows * (size_t)vocab;
    float *d_logits = dev(&G.logits, lbytes, "logits");
    CHECK(osp_cuda_h2d(d_logits, logits, lbytes, G.stream));
    for (int32_t b0 = 0; b0 < num_rows; b0 += max_rows) {
        const int32_t n = num_rows - b0 < max_rows ? num_rows - b0 : max_rows;
        size_t n_ids = 0, n_bias = 0;
        for (int32_t r = 0; r < n; r++) {
            const osp_sampler_row *p = &rows[b0 + r];
            n_ids += (size_t)npos(p->n_stop_token_ids) + (size_t)npos(p->n_prompt) + (size_t)npos(p->n_output);
            n_bias += (size_t)npos(p->n_logit_bias);
        }
        osp_cuda_sample_row *cr = calloc((size_t)n, sizeof *cr);
        int32_t *ids = malloc(sizeof(int32_t) * (n_ids + 1)), *bids = malloc(sizeof(int32_t) * (n_bias + 1));
        float *bvals = malloc(sizeof(float) * (n_bias + 1));
        assert_true(cr && ids && bids && bvals);
        int32_t io = 0, bo = 0;
        for (int32_t r = 0; r < n; r++) {
            const osp_sampler_row *p = &rows[b0 + r];
            osp_cuda_sample_row *c = &cr[r];
            c->temperature = p->temperature, c->top_p = p->top_p, c->min_p = p->min_p;
            c->presence_penalty = p->presence_penalty, c->frequency_penalty = p->frequency_penalty;
            c->repetition_penalty = p->repetition_penalty;
            c->top_k = p->top_k, c->min_tokens = p->min_tokens, c->num_logprobs = p->num_logprobs;
            c->sample_index = p->sample_index, c->seed = p->seed, c->output_pos = p->output_pos;
            c->logits_row = lrow ? lrow[b0 + r] : b0 + r;
            c->bias_off = bo, c->n_bias = p->n_logit_bias;
            for (int32_t i = 0; i < npos(p->n_logit_bias); i++, bo++)
                bids[bo] = p->logit_bias[i].token_id, bvals[bo] = p->logit_bias[i].bias;
            c->stop_off = io, c->n_stop = p->n_stop_token_ids;
            for (int32_t i = 0; i < npos(p->n_stop_token_ids); i++) ids[io++] = p->stop_token_ids[i];
            c->prompt_off = io, c->n_prompt = p->n_prompt;
            for (int32_t i = 0; i < npos(p->n_prompt); i++) ids[io++] = p->prompt_ids[i];
            c->output_off = io, c->n_output = p->n_output;
            for (int32_t i = 0; i < npos(p->n_output); i++) ids[io++] = p->output_ids[i];
        }
        void *d_rows = dev(&G.rows, sizeof *cr * (size_t)n, "rows");
        void *d_tok = dev(&G.tokens, sizeof(int32_t) * (size_t)n, "tokens");
        void *d_st = dev(&G.status, sizeof(osp_status) * (size_t)n, "status");
        void *d_rounds = dev(&G.rounds, sizeof(int32_t) * (size_t)n, "rounds");
        void *d_lp = lp ? dev(&G.lp, sizeof(osp_logprobs) * (size_t)n, "logprobs") : NULL;
        void *d_ids = n_ids ? dev(&G.ids, sizeof(int32_t) * n_ids, "ids") : NULL;
        void *d_bids = n_bias ? dev(&G.bias_ids, sizeof(int32_t) * n_bias, "bias ids") : NULL;
        void *d_bvals = n_bias ? dev(&G.bias_vals, sizeof(float) * n_bias, "bias values") : NULL;
        CHECK(osp_cuda_h2d(d_rows, cr, sizeof *cr * (size_t)n, G.stream));
        if (n_ids) CHECK(osp_cuda_h2d(d_ids, ids, sizeof(int32_t) * n_ids, G.stream));
        if (n_bias) CHECK(osp_cuda_h2d(d_bids, bids, sizeof(int32_t) * n_bias, G.stream));
        if (n_bias) CHECK(osp_cuda_h2d(d_bvals, bvals, sizeof(float) * n_bias, G.stream));
        if (lp) CHECK(osp_cuda_h2d(d_lp, lp + b0, sizeof(osp_logprobs) * (size_t)n, G.stream));
        CHECK(osp_cuda_sample_ex(d_logits, vocab, d_rows, n, d_ids, d_bids, d_bvals, G.scratch, d_tok, d_st, d_lp,
                                 max_rounds, d_rounds, G.stream));
        CHECK(osp_cuda_d2h(tokens + b0, d_tok, sizeof(int32_t) * (size_t)n, G.stream));
        CHECK(osp_cuda_d2h(status + b0, d_st, sizeof(osp_status) * (size_t)n, G.stream));
        if (lp) CHECK(osp_cuda_d2h(lp + b0, d_lp, sizeof(osp_logprobs) * (size_t)n, G.stream));
        if (rounds) CHECK(osp_cuda_d2h(rounds + b0, d_rounds, sizeof(int32_t) * (size_t)n, G.stream));
        CHECK(osp_cuda_stream_sync(G.stream));
        free(cr), free(ids), free(bids), free(bvals);
    }
}

/* ---- the CPU side: osp_sample_rows one row at a time over the workspace's threads ------------------ */

static osp_sampler_workspace *g_ws;
static int32_t g_ws_vocab;

static void cpu_sample(const float *logits, int32_t vocab, const osp_sampler_row *rows, const int32_t *lrow,
                       int32_t num_rows, int32_t *tokens, osp_status *status, osp_logprobs *lp) {
    if (!g_ws || g_ws_vocab != vocab) {
        osp_sampler_workspace_free(g_ws);
        g_ws = NULL;
        CHECK(osp_sampler_workspace_create(1, vocab, omp_get_max_threads(), &g_ws));
        g_ws_vocab = vocab;
    }
#pragma omp parallel for schedule(dynamic, 16)
    for (int32_t r = 0; r < num_rows; r++) {
        const float *row = logits + (size_t)(lrow ? lrow[r] : r) * (size_t)vocab;
        (void)osp_sample_rows(g_ws, omp_get_thread_num(), row, 0, 1, vocab, &rows[r], &tokens[r], lp ? &lp[r] : NULL,
                              &status[r]);
    }
}

/* ---- reference distribution (double, by sorting) and the statistics ------------------------------- */

typedef struct wid {
    double w;
    int32_t i;
} wid;

static int by_weight_desc(const void *a, const void *b) {
    const wid *x = a, *y = b;
    if (x->w != y->w) return x->w > y->w ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* out [v]: the probability of each token under p's temperature, min-p, top-k, top-p (no penalties). */
static void reference(const float *logits, int32_t v, const osp_sampler_row *p, double *out) {
    int32_t best = 0;
    for (int32_t i = 1; i < v; i++)
        if (logits[i] > logits[best]) best = i;
    memset(out, 0, sizeof(double) * (size_t)v);
    if (p->temperature < 1e-5f) {
        out[best] = 1.0;
        return;
    }
    wid *a = malloc(sizeof *a * (size_t)v);
    assert_non_null(a);
    /* float weights as the library computes them (expf here, within 2 ulp of its polynomial) */
    for (int32_t i = 0; i < v; i++)
        a[i] = (wid){i == best ? 1.0 : (double)expf((logits[i] - logits[best]) * (1.0f / p->temperature)), i};
    qsort(a, (size_t)v, sizeof *a, by_weight_desc);
    int32_t L = 0;
    while (L < v && a[L].w > 0.0 && (p->min_p <= 0.0f || a[L].w >= (double)p->min_p)) L++;
    if (p->top_k > 0 && p->top_k < L) {
        int32_t e = p->top_k;
        while (e < L && a[e].w == a[p->top_k - 1].w) e++;
        L = e;
    }
    if (p->top_p < 1.0f) {
        double mass = 0.0, above = 0.0;
        for (int32_t i = 0; i < L; i++) mass += a[i].w;
        int32_t i = 0;
        while (i < L) { /* whole tie groups: kept while the mass strictly above is < top_p * mass */
            int32_t g = i;
            double gm = 0.0;
            while (g < L && a[g].w == a[i].w) gm += a[g].w, g++;
            if (i > 0 && !(above < (double)p->top_p * mass)) break;
            above += gm;
            i = g;
        }
        L = i;
    }
    double s = 0.0;
    for (int32_t i = 0; i < L; i++) s += a[i].w;
    for (int32_t i = 0; i < L; i++) out[a[i].i] = a[i].w / s;
    free(a);
}

static void check_fit(const char *name, const fit *f, double agree) {
    printf("  %-40s chi2 %9.2f (df %4d, crit %8.2f)  TVD %.5f (bound %.5f)  cpu agree %.4f\n", name, f->chi2, f->df,
           f->crit, f->tvd, f->tvd_bound, agree);
    if (f->impossible) fail_msg("%s: %ld draws of tokens with probability 0", name, f->impossible);
    if (f->df > 0 && !(f->chi2 <= f->crit)) fail_msg("%s: chi-square %.2f > %.2f", name, f->chi2, f->crit);
    if (!(f->tvd <= f->tvd_bound)) fail_msg("%s: TVD %.5f > %.5f", name, f->tvd, f->tvd_bound);
}

/* ---- vocabulary 48: the CPU test's batch ---------------------------------------------------------- */

#define SV SAMPLER_CASE_V
#define SROWS SAMPLER_CASE_ROWS
#define SDRAWS 60000
#define SCFGS k_sampler_cases
#define make_small_logits sampler_case_logits

/* Draws every row of base [nb] (logits row r) ndraws times (output positions 0..ndraws-1) in one
 * batch, checks each row's distribution and its agreement with the CPU on the first n_cpu draws. */
static void run_distributions(const char *tag, const float *logits, int32_t vocab, const osp_sampler_row *base,
                              const char *const *names, int32_t nb, int32_t ndraws, int32_t n_cpu,
                              double min_agree) {
    const int32_t n = nb * ndraws;
    osp_sampler_row *rows = malloc(sizeof *rows * (size_t)n);
    int32_t *lrow = malloc(sizeof(int32_t) * (size_t)n), *tok = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *rounds = malloc(sizeof(int32_t) * (size_t)n);
    osp_status *st = malloc(sizeof(osp_status) * (size_t)n);
    long *count = calloc((size_t)vocab, sizeof(long));
    double *prob = malloc(sizeof(double) * (size_t)vocab);
    assert_true(rows && lrow && tok && rounds && st && count && prob);
    for (int32_t d = 0; d < ndraws; d++)
        for (int32_t r = 0; r < nb; r++) {
            const int32_t i = d * nb + r; /* draws of one row spread over the batch */
            rows[i] = base[r];
            rows[i].output_pos = (uint64_t)d;
            lrow[i] = r;
        }
    gpu_sample(logits, nb, vocab, rows, lrow, n, OSP_REJECT_MAX_ROUNDS, tok, st, NULL, rounds);
    /* the CPU on the first n_cpu draws of every row */
    const int32_t nc = nb * n_cpu;
    int32_t *ctok = malloc(sizeof(int32_t) * (size_t)nc);
    osp_status *cst = malloc(sizeof(osp_status) * (size_t)nc);
    assert_true(ctok && cst);
    cpu_sample(logits, vocab, rows, lrow, nc, ctok, cst, NULL);
    printf("  %s: %d rows x %d draws (vocab %d), CPU agreement on the first %d draws of each\n", tag, nb, ndraws, vocab,
           n_cpu);
    long agree_all = 0;
    for (int32_t r = 0; r < nb; r++) {
        memset(count, 0, sizeof(long) * (size_t)vocab);
        long rsum = 0, fallbacks = 0, agree = 0;
        for (int32_t d = 0; d < ndraws; d++) {
            const int32_t i = d * nb + r;
            if (st[i] != OSP_OK) fail_msg("%s row %d draw %d: status %d", names[r], r, d, (int)st[i]);
            assert_true(tok[i] >= 0 && tok[i] < vocab);
            count[tok[i]]++;
            rsum += rounds[i];
            fallbacks += rounds[i] > OSP_REJECT_MAX_ROUNDS;
            if (d < n_cpu) {
                assert_int_equal(cst[i], OSP_OK);
                agree += ctok[i] == tok[i];
            }
        }
        agree_all += agree;
        reference(logits + (size_t)r * (size_t)vocab, vocab, &base[r], prob);
        const fit f = compare(count, prob, vocab, ndraws);
        char name[96];
        snprintf(name, sizeof name, "%s (rounds %.2f, fb %ld)", names[r], (double)rsum / ndraws, fallbacks);
        check_fit(name, &f, (double)agree / n_cpu);
    }
    const double a = (double)agree_all / (double)nc;
    printf("  %s: GPU token == CPU token for %.4f of %d seeded rows\n", tag, a, nc);
    if (!(a >= min_agree)) fail_msg("%s: agreement %.4f < %.2f", tag, a, min_agree);
    free(rows), free(lrow), free(tok), free(rounds), free(st), free(count), free(prob), free(ctok), free(cst);
}

static void test_distributions_vocab48(void **state) {
    (void)state;
    static float logits[SROWS * SV];
    osp_sampler_row base[SROWS];
    const char *names[SROWS];
    for (int r = 0; r < SROWS; r++) {
        make_small_logits(SCFGS[r].logits, logits + r * SV, (uint64_t)r);
        base[r] = osp_sampler_row_default();
        base[r].temperature = SCFGS[r].t;
        base[r].top_k = SCFGS[r].k;
        base[r].top_p = SCFGS[r].p;
        base[r].min_p = SCFGS[r].minp;
        base[r].seed = 1000003u * (uint64_t)(r + 1);
        names[r] = SCFGS[r].name;
    }
    run_distributions("vocab 48", logits, SV, base, names, SROWS, SDRAWS, SDRAWS, 0.99);
}

/* ---- large vocabularies ---------------------------------------------------------------------------- */

/* Well-separated logits with a head: a Gaussian-ish body (sd ~1) over the vocabulary and about
 * min(300, V/8) tokens raised by 6..12, so the head holds most of the mass and top-p / min-p cut
 * inside it while the body keeps a long tail. */
static void make_head_logits(float *l, int32_t v, uint64_t salt) {
    const double head = (v / 8 < 300 ? v / 8 : 300) / (double)v;
    for (int32_t i = 0; i < v; i++) {
        double s = 0.0;
        for (uint32_t j = 0; j < 4; j++) s += uni(salt, (uint64_t)i, j);
        s = (s - 2.0) * 1.7;
        if (uni(salt, (uint64_t)i, 4) < head) s += 6.0 + 6.0 * uni(salt, (uint64_t)i, 5);
        l[i] = (float)s;
    }
}

typedef struct big_cfg {
    const char *name;
    float t;
    int k;
    float p, minp;
} big_cfg;

static const big_cfg BCFGS[] = {
    {"plain T=1", 1.0f, 0, 1.0f, 0.0f},
    {"top_k=50", 1.0f, 50, 1.0f, 0.0f},
    {"top_p=0.9", 1.0f, 0, 0.9f, 0.0f},
    {"top_k=200 top_p=0.8", 1.0f, 200, 0.8f, 0.0f},
    {"min_p=0.02", 1.0f, 0, 1.0f, 0.02f},
    {"min_p=.005 k=150 p=.95 T=.8", 0.8f, 150, 0.95f, 0.005f},
    {"T=1.5 top_p=0.95", 1.5f, 0, 0.95f, 0.0f},
    {"top_k=1000 T=0.7", 0.7f, 1000, 1.0f, 0.0f},
};
#define NBCFG ((int32_t)(sizeof BCFGS / sizeof BCFGS[0]))

static void large_vocab(int32_t vocab) {
    float *logits = malloc(sizeof(float) * (size_t)NBCFG * (size_t)vocab);
    assert_non_null(logits);
    osp_sampler_row base[NBCFG];
    const char *names[NBCFG];
    for (int32_t r = 0; r < NBCFG; r++) {
        make_head_logits(logits + (size_t)r * (size_t)vocab, vocab, 500 + (uint64_t)r + (uint64_t)vocab);
        base[r] = osp_sampler_row_default();
        base[r].temperature = BCFGS[r].t;
        base[r].top_k = BCFGS[r].k;
        base[r].top_p = BCFGS[r].p;
        base[r].min_p = BCFGS[r].minp;
        base[r].seed = 0x5eed0000u + 7919u * (uint64_t)r + (uint64_t)vocab;
        base[r].sample_index = (uint32_t)(r % 3);
        names[r] = BCFGS[r].name;
    }
    char tag[32];
    snprintf(tag, sizeof tag, "vocab %d", vocab);
    run_distributions(tag, logits, vocab, base, names, NBCFG, 20000, vocab > 50000 ? 300 : 1000, 0.99);
    free(logits);
}

static void test_distributions_vocab1003(void **state) {
    (void)state;
    large_vocab(1003);
}
static void test_distributions_vocab49152(void **state) {
    (void)state;
    large_vocab(49152);
}
static void test_distributions_vocab128256(void **state) {
    (void)state;
    large_vocab(128256);
}

/* ---- the sliced passes' candidate lists (sample.cu: slices of 4096, lists of at most 512) -------------- */

/* the library's weight, bit for bit */
static float lib_exp(float w, float mx, float inv_t) {
    osp_sampler_exp_shifted(&w, 1, mx, inv_t);
    return w;
}

/* Rows built to land on each path of the select kernel's last CTA at vocab 128256 (32 slices): lists
 * that cover the filtered set (top-k boundary ties spread over slices, a small min-p set, top_k at
 * and past the lists' depth, top_k = 1 and top_p = 0 over planted ties), lists that overflow (40,000
 * tokens tied at the maximum: ~1,250 a slice), and one-draw rows whose mass is spread over every slice.
 * The last row is for the one pass (OSPREY_SAMPLE_ONE_PASS=1, sample.cu), whose lists are chosen on
 * weights against each slice's own maximum: in slice 0, 49 logits at a, one at b and one at c (a > b > c,
 * distinct weights against a) all round to the same weight against the row's maximum 1024 in slice 1,
 * so slice 0's list of 50 ends at b while top-k's threshold is that common weight and c is a candidate
 * (the finisher must see that a weight left out of a list ties with the edge).
 * The two rows after it are for the tau lists (OSPREY_SAMPLE_TAU=1, sample.cu "tau lists"), cut at a
 * threshold read off a sample of the row (the first 256 values of each slice): one whose sample holds 20
 * values above the 100 that tie at the k-th weight elsewhere (tau lands above the k-th value: U is too
 * small), and one whose sampled values tie at b, with c just under tau but of b's weight against the
 * maximum (T = 256), so only the guard puts c into the top-k set.
 * Same checks as the distributions above: the exact distribution and the CPU's tokens. */
static void test_slice_lists(void **state) {
    (void)state;
    enum { V = 128256, NR = 12 };
    static const big_cfg cfgs[NR] = {
        {"40000 ties at the max, top_k=50 top_p=0.9", 1.0f, 50, 0.9f, 0.0f},
        {"ties at the k-th across slices, top_k=50 top_p=0.95", 1.0f, 50, 0.95f, 0.0f},
        {"min_p=0.3 over ~40 tokens, top_p=0.8", 1.0f, 0, 0.8f, 0.3f},
        {"top_k=256 top_p=0.8 (the lists' depth)", 1.0f, 256, 0.8f, 0.0f},
        {"top_k=257 top_p=0.8 (past it)", 1.0f, 257, 0.8f, 0.0f},
        {"top_k=1 over 3 ties", 1.0f, 1, 1.0f, 0.0f},
        {"top_p=0 over 3 ties", 1.0f, 0, 0.0f, 0.0f},
        {"min_p=0.9 T=1", 1.0f, 0, 1.0f, 0.9f},
        {"T=0.5 over a flat row", 0.5f, 0, 1.0f, 0.0f},
        {"a tie across a list's edge, T=256 top_k=50 top_p=0.999", 256.0f, 50, 0.999f, 0.0f},
        {"the sample's top above the k-th, top_k=50 top_p=0.9", 1.0f, 50, 0.9f, 0.0f},
        {"a tie across tau's edge, T=256 top_k=50 top_p=0.999", 256.0f, 50, 0.999f, 0.0f},
    };
    float *logits = malloc(sizeof(float) * (size_t)NR * V);
    assert_non_null(logits);
    osp_sampler_row base[NR];
    const char *names[NR];
    for (int r = 0; r < NR; r++) {
        float *l = logits + (size_t)r * V;
        const uint64_t salt = 9100 + (uint64_t)r;
        if (r == 10) { /* 20 tens in sampled places, 100 nines in unsampled ones */
            for (int32_t i = 0; i < V; i++) l[i] = (float)(6.0 * uni(salt, (uint64_t)i, 0) - 4.0);
            for (int j = 0; j < 20; j++) l[j * 4096 + 17] = 10.0f;
            for (int j = 0; j < 100; j++) l[(j % 31) * 4096 + 300 + 29 * j] = 9.0f;
        } else if (r == 11) {
            const float b = -0.01f, c = b - 5e-5f, inv_t = 1.0f / 256.0f;
            for (int32_t i = 0; i < V; i++) l[i] = (float)(-2048.0 + 100.0 * uni(salt, (uint64_t)i, 0));
            l[5000] = 1024.0f;                                                      /* unsampled */
            for (int j = 0; j < 100; j++) l[(j % 32) * 4096 + 8 * (j / 32) + 1] = b; /* sampled */
            l[3 * 4096 + 3000] = c;                                                 /* unsampled */
            assert_true(lib_exp(c, 1024.0f, inv_t) == lib_exp(b, 1024.0f, inv_t));
            assert_true(c < b && b - c > 1e-5f); /* tau, b's 20-bit key prefix's floor, lies above c */
        } else if (r == 9) {
            const float b = -8.0f, a = b + 4e-5f, c = b - 4e-5f, inv_t = 1.0f / 256.0f;
            for (int32_t i = 0; i < V; i++) l[i] = (float)(-2048.0 + 100.0 * uni(salt, (uint64_t)i, 0));
            l[5000] = 1024.0f; /* the row's maximum, in slice 1 */
            for (int j = 0; j < 49; j++) l[10 + 7 * j] = a;
            l[600] = b, l[900] = c;
            /* the construction holds: one weight against the row's maximum, three against slice 0's */
            assert_true(lib_exp(a, 1024.0f, inv_t) == lib_exp(b, 1024.0f, inv_t));
            assert_true(lib_exp(c, 1024.0f, inv_t) == lib_exp(b, 1024.0f, inv_t));
            assert_true(lib_exp(b, a, inv_t) < 1.0f && lib_exp(c, a, inv_t) < lib_exp(b, a, inv_t));
        } else if (r == 0 || r == 8) {
            for (int32_t i = 0; i < V; i++) l[i] = (float)(6.0 * uni(salt, (uint64_t)i, 0) - 4.0);
            if (r == 0)
                for (int32_t i = 0; i < V; i++)
                    if (uni(salt, (uint64_t)i, 1) < 40000.0 / V) l[i] = 3.0f;
        } else if (r == 1) {
            for (int32_t i = 0; i < V; i++) l[i] = (float)(5.0 * uni(salt, (uint64_t)i, 0) - 3.0);
            for (int j = 0; j < 130; j++) l[(int32_t)(uni(salt, (uint64_t)j, 2) * V)] = j < 30 ? 6.0f : 5.0f;
        } else if (r == 2) {
            for (int32_t i = 0; i < V; i++) l[i] = (float)(4.0 * uni(salt, (uint64_t)i, 0) - 6.0);
            for (int j = 0; j < 40; j++) l[(int32_t)(uni(salt, (uint64_t)j, 2) * V)] = (float)(1.2 * uni(salt, (uint64_t)j, 3));
        } else {
            make_head_logits(l, V, salt);
            if (r == 5 || r == 6) {
                float mx = l[0];
                for (int32_t i = 1; i < V; i++) mx = l[i] > mx ? l[i] : mx;
                for (int j = 0; j < 3; j++) l[(int32_t)(uni(salt, (uint64_t)j, 2) * V)] = mx + 0.5f;
            }
        }
        base[r] = osp_sampler_row_default();
        base[r].temperature = cfgs[r].t;
        base[r].top_k = cfgs[r].k;
        base[r].top_p = cfgs[r].p;
        base[r].min_p = cfgs[r].minp;
        base[r].seed = 0x51ce0000u + 104729u * (uint64_t)r;
        names[r] = cfgs[r].name;
    }
    run_distributions("slice lists", logits, V, base, names, NR, 20000, 300, 0.99);
    free(logits);
}

/* ---- the exact fallback and the rounds, against osp_reject_sample_ex -------------------------------- */

static void test_fallback_and_rounds(void **state) {
    (void)state;
    enum { BV = 4096, ND = 20000 };
    static float base[BV], w0[BV], w[BV];
    static int32_t ids[BV];
    static double prob[BV];
    static long count[BV];
    /* the CPU test's Gaussian-ish logits (sd ~ 2): the mass spread over hundreds of tokens */
    int32_t best = 0;
    for (int i = 0; i < BV; i++) {
        double s = 0.0;
        for (uint32_t j = 0; j < 4; j++) s += uni(77, (uint64_t)i, j);
        base[i] = (float)((s - 2.0) * 3.5);
        if (base[i] > base[best]) best = i;
    }
    for (int i = 0; i < BV; i++) w0[i] = i == best ? 1.0f : lib_exp(base[i], base[best], 1.0f);
    static const big_cfg cfgs[] = {
        {"top_k=50", 1.0f, 50, 1.0f, 0.0f},          {"top_k=700", 1.0f, 700, 1.0f, 0.0f},
        {"top_p=0.9", 1.0f, 0, 0.9f, 0.0f},          {"top_p=0.5", 1.0f, 0, 0.5f, 0.0f},
        {"top_k=300 top_p=0.8", 1.0f, 300, 0.8f, 0.0f}, {"min_p=.002 k=400 p=.95", 1.0f, 400, 0.95f, 0.002f},
    };
    const int32_t nc = (int32_t)(sizeof cfgs / sizeof cfgs[0]);
    osp_sampler_row *rows = malloc(sizeof *rows * (size_t)ND);
    int32_t *tok = malloc(sizeof(int32_t) * ND), *rounds = malloc(sizeof(int32_t) * ND);
    int32_t *lrow = calloc(ND, sizeof(int32_t)); /* every draw reads the one logits row */
    osp_status *st = malloc(sizeof(osp_status) * ND);
    assert_true(rows && tok && rounds && lrow && st);
    static const int32_t modes[] = {OSP_REJECT_MAX_ROUNDS, 1, 0};
    for (int mi = 0; mi < 3; mi++) {
        const int32_t mr = modes[mi];
        const int32_t n_cpu = mr == OSP_REJECT_MAX_ROUNDS ? 4000 : 500; /* the CPU's fallback sorts */
        long agree_all = 0, rounds_agree_all = 0;
        for (int32_t c = 0; c < nc; c++) {
            for (int32_t d = 0; d < ND; d++) {
                rows[d] = osp_sampler_row_default();
                rows[d].top_k = cfgs[c].k, rows[d].top_p = cfgs[c].p, rows[d].min_p = cfgs[c].minp;
                rows[d].seed = 99 + (uint64_t)c;
                rows[d].output_pos = (uint64_t)d;
            }
            gpu_sample(base, 1, BV, rows, lrow, ND, mr, tok, st, NULL, rounds);
            memset(count, 0, sizeof count);
            long agree = 0, rounds_agree = 0, rsum = 0, fb = 0;
            for (int32_t d = 0; d < ND; d++) {
                assert_int_equal(st[d], OSP_OK);
                assert_true(tok[d] >= 0 && tok[d] < BV);
                count[tok[d]]++;
                rsum += rounds[d];
                fb += rounds[d] > mr;
                if (d < n_cpu) {
                    memcpy(w, w0, sizeof w);
                    const osp_rng_addr a = {rows[d].seed, 0, (uint64_t)d};
                    int32_t cr = 0;
                    const int32_t ct = osp_reject_sample_ex(w, ids, BV, cfgs[c].k, cfgs[c].p, cfgs[c].minp, &a, mr, &cr);
                    agree += ct == tok[d];
                    rounds_agree += cr == rounds[d];
                }
            }
            agree_all += agree, rounds_agree_all += rounds_agree;
            reference(base, BV, &rows[0], prob);
            char name[96];
            snprintf(name, sizeof name, "V=4096 %s, %d rounds (mean %.2f, fb %ld)", cfgs[c].name, mr, (double)rsum / ND,
                     fb);
            const fit f = compare(count, prob, BV, ND);
            check_fit(name, &f, (double)agree / n_cpu);
            if (mr < OSP_REJECT_MAX_ROUNDS) assert_true(fb > 0); /* the fallback was exercised */
        }
        const double a = (double)agree_all / (double)(nc * n_cpu), ra = (double)rounds_agree_all / (double)(nc * n_cpu);
        printf("  max_rounds %d: token agreement with osp_reject_sample_ex %.4f, rounds agreement %.4f\n", mr, a, ra);
        if (!(a >= 0.99) || !(ra >= 0.99)) fail_msg("max_rounds %d: agreement %.4f / rounds %.4f < 0.99", mr, a, ra);
    }
    free(rows), free(tok), free(rounds), free(lrow), free(st);
}

/* ---- greedy, penalties, logit_bias, min_tokens: exactly the CPU's tokens ----------------------------- */

static void test_greedy_ties(void **state) {
    (void)state;
    static const int32_t vocabs[] = {1003, 49152, 128256};
    enum { NR = 12 };
    for (int vi = 0; vi < 3; vi++) {
        const int32_t V = vocabs[vi];
        float *logits = malloc(sizeof(float) * NR * (size_t)V);
        assert_non_null(logits);
        osp_sampler_row rows[NR];
        int32_t expect[NR], tok[NR], ctok[NR];
        osp_status st[NR], cst[NR];
        for (int r = 0; r < NR; r++) {
            float *l = logits + (size_t)r * (size_t)V;
            for (int32_t i = 0; i < V; i++) l[i] = (float)(8.0 * uni(31 + (uint64_t)r, (uint64_t)i, 0) - 4.0);
            /* the maximum planted at 1 + r % 4 ids (ties); the lowest must win */
            expect[r] = V;
            for (int j = 0; j <= r % 4; j++) {
                const int32_t id = (int32_t)(uni(57 + (uint64_t)r, (uint64_t)j, 0) * V);
                l[id] = 4.5f;
                expect[r] = id < expect[r] ? id : expect[r];
            }
            if (r == NR - 1) { /* all equal: token 0 */
                for (int32_t i = 0; i < V; i++) l[i] = -1.25f;
                expect[r] = 0;
            }
            rows[r] = osp_sampler_row_default();
            rows[r].temperature = r % 3 == 0 ? 0.0f : r % 3 == 1 ? 5e-6f : 1e-9f; /* all below 1e-5: greedy */
            rows[r].top_k = r % 2 ? 5 : 0; /* filters do not apply to greedy rows */
            rows[r].top_p = r % 2 ? 0.3f : 1.0f;
            rows[r].seed = (uint64_t)r;
        }
        gpu_sample(logits, NR, V, rows, NULL, NR, OSP_REJECT_MAX_ROUNDS, tok, st, NULL, NULL);
        cpu_sample(logits, V, rows, NULL, NR, ctok, cst, NULL);
        for (int r = 0; r < NR; r++) {
            assert_int_equal(st[r], OSP_OK);
            assert_int_equal(cst[r], OSP_OK);
            if (tok[r] != expect[r] || ctok[r] != expect[r])
                fail_msg("vocab %d row %d: gpu %d cpu %d expected %d", V, r, tok[r], ctok[r], expect[r]);
        }
        free(logits);
    }
}

/* Rows with penalties, logit_bias (repeated ids included) and min_tokens over logits whose top 24
 * tokens sit within 0.6 of each other, so the processing decides the argmax. */
typedef struct pen_rows {
    osp_sampler_row *rows;
    osp_logit_bias *bias;
    int32_t *ids;
} pen_rows;

static pen_rows make_penalty_rows(float *logits, int32_t V, int32_t nr, uint64_t salt) {
    enum { TOP = 24 };
    pen_rows p = {calloc((size_t)nr, sizeof(osp_sampler_row)), calloc((size_t)nr * 8, sizeof(osp_logit_bias)),
                  calloc((size_t)nr * 700, sizeof(int32_t))};
    assert_true(p.rows && p.bias && p.ids);
    for (int32_t r = 0; r < nr; r++) {
        float *l = logits + (size_t)r * (size_t)V;
        int32_t top[TOP];
        for (int32_t i = 0; i < V; i++) l[i] = (float)(4.0 * uni(salt + (uint64_t)r, (uint64_t)i, 0) - 2.0);
        for (int j = 0; j < TOP; j++) {
            top[j] = (int32_t)(uni(salt + 1000 + (uint64_t)r, (uint64_t)j, 0) * V);
            l[top[j]] = (float)(6.0 + 0.6 * uni(salt + 2000 + (uint64_t)r, (uint64_t)j, 0)) * (j % 5 == 4 ? -1.0f : 1.0f);
        }
        /* a negative logit among the top is raised so the repetition penalty's sign rule matters */
        l[top[TOP - 1]] = -0.05f;
        osp_sampler_row *row = &p.rows[r];
        *row = osp_sampler_row_default();
        row->temperature = 0.0f;
        uint32_t q = 0;
#define U() uni(salt + 3000 + (uint64_t)r, q++, 0)
        static const float reps[] = {1.0f, 1.3f, 0.7f, 2.0f}, freqs[] = {0.0f, 0.4f, -0.5f},
                           press[] = {0.0f, 0.6f, -0.3f};
        row->repetition_penalty = reps[(int)(U() * 4)];
        row->frequency_penalty = freqs[(int)(U() * 3)];
        row->presence_penalty = press[(int)(U() * 3)];
        int32_t *ids = p.ids + (size_t)r * 700;
        const int32_t n_prompt = (int32_t)(U() * 300), n_output = (int32_t)(U() * 120);
        for (int32_t i = 0; i < n_prompt + n_output; i++) /* half from the top tokens: repeats */
            ids[i] = U() < 0.5 ? top[(int)(U() * TOP)] : (int32_t)(U() * V);
        row->prompt_ids = ids, row->n_prompt = n_prompt;
        row->output_ids = ids + n_prompt, row->n_output = n_output;
        osp_logit_bias *b = p.bias + (size_t)r * 8;
        const int32_t nb = (int32_t)(U() * 7);
        for (int32_t i = 0; i < nb; i++) {
            b[i].token_id = i > 0 && U() < 0.3 ? b[i - 1].token_id : top[(int)(U() * TOP)]; /* repeated ids too */
            b[i].bias = (float)(8.0 * U() - 4.0);
        }
        row->logit_bias = b, row->n_logit_bias = nb;
        int32_t *stop = ids + n_prompt + n_output;
        const int32_t ns = 1 + (int32_t)(U() * 3);
        for (int32_t i = 0; i < ns; i++) stop[i] = top[(int)(U() * TOP)];
        row->stop_token_ids = stop, row->n_stop_token_ids = ns;
        const double m = U();
        row->min_tokens = m < 0.4 ? n_output + 1 : m < 0.7 ? n_output : 0; /* active, just inactive, off */
        row->seed = salt * 131 + (uint64_t)r;
        row->output_pos = (uint64_t)n_output;
#undef U
    }
    return p;
}

static void test_penalties_bias_min_tokens(void **state) {
    (void)state;
    static const int32_t vocabs[] = {1003, 49152, 128256};
    static const int32_t nrs[] = {600, 300, 150};
    for (int vi = 0; vi < 3; vi++) {
        const int32_t V = vocabs[vi], NR = nrs[vi];
        float *logits = malloc(sizeof(float) * (size_t)NR * (size_t)V);
        int32_t *tok = malloc(sizeof(int32_t) * (size_t)NR), *tok2 = malloc(sizeof(int32_t) * (size_t)NR);
        int32_t *ctok = malloc(sizeof(int32_t) * (size_t)NR);
        osp_status *st = malloc(sizeof(osp_status) * (size_t)NR), *cst = malloc(sizeof(osp_status) * (size_t)NR);
        assert_true(logits && tok && tok2 && ctok && st && cst);
        pen_rows p = make_penalty_rows(logits, V, NR, 7000 + (uint64_t)V);
        /* greedy: exactly the CPU's token, and the same again (the count arrays were left zeroed) */
        gpu_sample(logits, NR, V, p.rows, NULL, NR, OSP_REJECT_MAX_ROUNDS, tok, st, NULL, NULL);
        gpu_sample(logits, NR, V, p.rows, NULL, NR, OSP_REJECT_MAX_ROUNDS, tok2, st, NULL, NULL);
        cpu_sample(logits, V, p.rows, NULL, NR, ctok, cst, NULL);
        int32_t changed = 0;
        for (int32_t r = 0; r < NR; r++) {
            assert_int_equal(cst[r], OSP_OK);
            assert_int_equal(st[r], OSP_OK);
            if (tok[r] != ctok[r] || tok2[r] != ctok[r])
                fail_msg("vocab %d greedy row %d: gpu %d / %d, cpu %d", V, r, tok[r], tok2[r], ctok[r]);
            const float *l = logits + (size_t)r * (size_t)V;
            int32_t am = 0;
            for (int32_t i = 1; i < V; i++) am = l[i] > l[am] ? i : am;
            changed += am != ctok[r];
        }
        printf("  vocab %d: %d greedy rows with penalties/bias/min_tokens equal the CPU (%d of them moved off the raw argmax)\n",
               V, NR, changed);
        assert_true(changed > NR / 5); /* the processing mattered */
        /* sampled: seeded, some with filters; agreement with the CPU */
        for (int32_t r = 0; r < NR; r++) {
            p.rows[r].temperature = r % 2 ? 0.8f : 1.0f;
            p.rows[r].top_k = r % 3 == 0 ? 10 : 0;
            p.rows[r].top_p = r % 4 == 1 ? 0.9f : 1.0f;
            p.rows[r].min_p = r % 5 == 2 ? 0.05f : 0.0f;
        }
        gpu_sample(logits, NR, V, p.rows, NULL, NR, OSP_REJECT_MAX_ROUNDS, tok, st, NULL, NULL);
        cpu_sample(logits, V, p.rows, NULL, NR, ctok, cst, NULL);
        int32_t agree = 0;
        for (int32_t r = 0; r < NR; r++) {
            assert_int_equal(st[r], OSP_OK);
            agree += tok[r] == ctok[r];
        }
        printf("  vocab %d: sampled rows with penalties: GPU == CPU for %d of %d\n", V, agree, NR);
        assert_true(agree >= NR * 99 / 100);
        free(p.rows), free(p.bias), free(p.ids);
        free(logits), free(tok), free(tok2), free(ctok), free(st), free(cst);
    }
}

/* ---- per-row errors ------------------------------------------------------------------------------- */

static void test_row_errors(void **state) {
    (void)state;
    enum { V = 1003, NR = 40 };
    static float logits[NR * V];
    static int32_t all_ids[V];
    static osp_sampler_row rows[NR];
    static osp_logprobs lp[NR], clp[NR];
    int32_t tok[NR], ctok[NR];
    osp_status st[NR], cst[NR];
    static const osp_logit_bias bad_bias_id[] = {{5, 1.0f}, {V, 1.0f}}, nan_bias[] = {{5, NAN}},
                                huge_bias[] = {{3, 3e38f}, {3, 3e38f}};
    static const int32_t bad_stop[] = {-1}, bad_prompt[] = {V}, bad_output[] = {2, V + 5}, ok_ids[] = {1, 2, 3};
    for (int32_t i = 0; i < V; i++) all_ids[i] = i;
    for (int r = 0; r < NR; r++) {
        for (int32_t i = 0; i < V; i++) logits[r * V + i] = (float)(6.0 * uni(900 + (uint64_t)r, (uint64_t)i, 0) - 3.0);
        rows[r] = osp_sampler_row_default();
        rows[r].temperature = r % 2 ? 0.0f : 1.0f;
        rows[r].seed = 4242 + (uint64_t)r;
        rows[r].num_logprobs = 3;
    }
    int bad[NR] = {0};
    int r = 1;
    logits[r * V + 17] = NAN, bad[r] = 1, r += 2;
    logits[r * V + 0] = NAN, bad[r] = 1, r += 2; /* a NaN at index 0 */
    logits[r * V + V - 1] = INFINITY, bad[r] = 1, r += 2;
    logits[r * V + 500] = -INFINITY, bad[r] = 1, r += 2;
    rows[r].temperature = -1.0f, bad[r] = 1, r += 2;
    rows[r].temperature = NAN, bad[r] = 1, r += 2;
    rows[r].temperature = INFINITY, bad[r] = 1, r += 2;
    rows[r].top_k = -2, bad[r] = 1, r += 2;
    rows[r].top_p = 1.5f, bad[r] = 1, r += 2;
    rows[r].min_p = -0.1f, bad[r] = 1, r += 2;
    rows[r].repetition_penalty = 0.0f, bad[r] = 1, r += 2;
    rows[r].repetition_penalty = INFINITY, bad[r] = 1, r += 2;
    rows[r].frequency_penalty = NAN, bad[r] = 1, r += 2;
    rows[r].num_logprobs = 21, bad[r] = 1, r += 2;
    rows[r].logit_bias = bad_bias_id, rows[r].n_logit_bias = 2, bad[r] = 1, r += 2;
    rows[r].logit_bias = nan_bias, rows[r].n_logit_bias = 1, bad[r] = 1, r += 2;
    rows[r].stop_token_ids = bad_stop, rows[r].n_stop_token_ids = 1, bad[r] = 1, r += 2;
    rows[r].prompt_ids = bad_prompt, rows[r].n_prompt = 1, rows[r].repetition_penalty = 1.2f, bad[r] = 1, r += 2;
    rows[r].output_ids = bad_output, rows[r].n_output = 2, bad[r] = 1, r += 2;
    assert_true(r < NR);
    /* row 2: a finite logit pushed to +inf by two huge biases */
    logits[2 * V + 3] = 3.0f;
    rows[2].logit_bias = huge_bias, rows[2].n_logit_bias = 2, bad[2] = 1;
    /* every token masked: min_tokens with all ids as stop ids */
    rows[NR - 2].min_tokens = 1, rows[NR - 2].stop_token_ids = all_ids, rows[NR - 2].n_stop_token_ids = V;
    bad[NR - 2] = 1;
    /* negative list length */
    rows[NR - 4].output_ids = ok_ids, rows[NR - 4].n_output = -1, bad[NR - 4] = 1;
    /* stop ids all masked but min_tokens reached: fine */
    rows[NR - 6].min_tokens = 2, rows[NR - 6].output_ids = ok_ids, rows[NR - 6].n_output = 3;
    rows[NR - 6].stop_token_ids = all_ids, rows[NR - 6].n_stop_token_ids = V;
    memset(lp, 0x5A, sizeof lp);
    memset(clp, 0x5A, sizeof clp);
    gpu_sample(logits, NR, V, rows, NULL, NR, OSP_REJECT_MAX_ROUNDS, tok, st, lp, NULL);
    cpu_sample(logits, V, rows, NULL, NR, ctok, cst, clp);
    osp_logprobs poison;
    memset(&poison, 0x5A, sizeof poison);
    int nbad = 0;
    for (int i = 0; i < NR; i++) {
        if (cst[i] != (bad[i] ? OSP_ERR_INVALID_ARG : OSP_OK)) fail_msg("row %d: the CPU says %d", i, (int)cst[i]);
        if (st[i] != cst[i]) fail_msg("row %d: gpu status %d, cpu %d", i, (int)st[i], (int)cst[i]);
        if (bad[i]) {
            nbad++;
            assert_int_equal(tok[i], 0);
            if (memcmp(&lp[i], &poison, sizeof poison) != 0) fail_msg("row %d failed but its logprobs were written", i);
        } else if (rows[i].temperature == 0.0f) {
            if (tok[i] != ctok[i]) fail_msg("greedy row %d: gpu %d cpu %d", i, tok[i], ctok[i]);
        }
        if (!bad[i]) assert_int_equal(lp[i].token_id, tok[i]);
    }
    printf("  %d of %d rows failed alone (status and token 0 as the CPU), the rest sampled\n", nbad, NR);
}

/* ---- logprobs ------------------------------------------------------------------------------------- */

static void check_lp(const char *what, const osp_logprobs *g, const osp_logprobs *ref) {
    if (g->token_id != ref->token_id || g->rank != ref->rank || g->n_top != ref->n_top ||
        !(fabsf(g->logprob - ref->logprob) <= 1e-4f))
        fail_msg("%s: token %d/%d rank %d/%d n_top %d/%d logprob %.7f/%.7f", what, g->token_id, ref->token_id, g->rank,
                 ref->rank, g->n_top, ref->n_top, (double)g->logprob, (double)ref->logprob);
    for (int j = 0; j < ref->n_top; j++)
        if (g->top_ids[j] != ref->top_ids[j] || !(fabsf(g->top_logprobs[j] - ref->top_logprobs[j]) <= 1e-4f))
            fail_msg("%s: top %d: id %d/%d logprob %.7f/%.7f", what, j, g->top_ids[j], ref->top_ids[j],
                     (double)g->top_logprobs[j], (double)ref->top_logprobs[j]);
}

static void test_logprobs(void **state) {
    (void)state;
    static const int32_t vocabs[] = {7, 1003, 49152, 128256};
    static const int32_t nlps[] = {-1, 0, 1, 5, 20};
    enum { NR = 20 };
    for (int vi = 0; vi < 4; vi++) {
        const int32_t V = vocabs[vi];
        float *logits = malloc(sizeof(float) * NR * (size_t)V);
        assert_non_null(logits);
        osp_sampler_row rows[NR];
        osp_logprobs lp[NR], clp[NR], ref;
        int32_t tok[NR], ctok[NR];
        osp_status st[NR], cst[NR];
        osp_logit_bias force = {0, 30000.0f};
        for (int r = 0; r < NR; r++) {
            float *l = logits + (size_t)r * (size_t)V;
            for (int32_t i = 0; i < V; i++) l[i] = (float)(10.0 * uni(61 + (uint64_t)r, (uint64_t)i, 0) - 5.0);
            if (r % 4 == 2 && V > 20) /* ties among the top values: lower id first */
                for (int j = 0; j < 6; j++) l[(int32_t)(uni(67 + (uint64_t)r, (uint64_t)j, 0) * V)] = j < 3 ? 5.5f : 5.25f;
            rows[r] = osp_sampler_row_default();
            rows[r].num_logprobs = nlps[r % 5];
            rows[r].temperature = r % 2 ? 0.0f : 1.0f;
            rows[r].top_p = r % 3 == 0 ? 0.9f : 1.0f;
            rows[r].seed = 8080 + (uint64_t)r;
            if (r == NR - 1) { /* a token 20000 below the max, forced by a bias: its logprob floors */
                l[V / 2] = -20000.0f;
                force.token_id = V / 2;
                rows[r].logit_bias = &force, rows[r].n_logit_bias = 1;
                rows[r].temperature = 0.0f, rows[r].num_logprobs = 20;
            }
        }
        memset(lp, 0x5A, sizeof lp);
        gpu_sample(logits, NR, V, rows, NULL, NR, OSP_REJECT_MAX_ROUNDS, tok, st, lp, NULL);
        cpu_sample(logits, V, rows, NULL, NR, ctok, cst, clp);
        osp_logprobs poison;
        memset(&poison, 0x5A, sizeof poison);
        for (int r = 0; r < NR; r++) {
            char what[64];
            snprintf(what, sizeof what, "vocab %d row %d (n %d)", V, r, rows[r].num_logprobs);
            assert_int_equal(st[r], OSP_OK);
            if (rows[r].num_logprobs < 0) {
                if (memcmp(&lp[r], &poison, sizeof poison) != 0) fail_msg("%s: logprobs written", what);
                continue;
            }
            osp_logprobs_fill(logits + (size_t)r * (size_t)V, V, tok[r], rows[r].num_logprobs, &ref);
            check_lp(what, &lp[r], &ref);
            if (tok[r] == ctok[r]) check_lp(what, &lp[r], &clp[r]);
            if (r == NR - 1) {
                assert_int_equal(tok[r], V / 2);
                assert_true(lp[r].logprob == OSP_LOGPROB_FLOOR);
                assert_int_equal(lp[r].rank, V);
            }
        }
        free(logits);
    }
    printf("  logprobs equal osp_logprobs_fill's (1e-4) for vocab 7, 1003, 49152, 128256, N = 0..20, ties, floor\n");
}

/* ---- batch invariance ----------------------------------------------------------------------------- */

static void test_batch_invariance(void **state) {
    (void)state;
    enum { V = 49152, NR = 48 };
    float *logits = malloc(sizeof(float) * NR * (size_t)V), *shuffled = malloc(sizeof(float) * 2 * NR * (size_t)V);
    assert_true(logits && shuffled);
    pen_rows p = make_penalty_rows(logits, V, NR, 0xBA7C);
    for (int r = 0; r < NR; r++) {
        osp_sampler_row *row = &p.rows[r];
        row->temperature = r % 4 == 0 ? 0.0f : 0.6f + 0.1f * (float)(r % 7);
        row->top_k = r % 3 == 1 ? 40 : 0;
        row->top_p = r % 5 < 2 ? 0.85f : 1.0f;
        row->min_p = r % 7 == 3 ? 0.01f : 0.0f;
        if (r % 2) row->repetition_penalty = 1.0f, row->frequency_penalty = 0.0f, row->presence_penalty = 0.0f;
        row->num_logprobs = r % 6 == 0 ? 5 : -1;
        row->sample_index = (uint32_t)(r % 3);
    }
    osp_sampler_row mix[2 * NR];
    int32_t mix_lrow[2 * NR], a_tok[NR], b_tok[NR], c_tok[2 * NR], d_tok[NR];
    osp_status a_st[NR], b_st[NR], c_st[2 * NR], d_st[NR];
    static osp_logprobs a_lp[NR], b_lp[NR], c_lp[2 * NR], d_lp[NR];
    memset(a_lp, 0, sizeof a_lp), memset(b_lp, 0, sizeof b_lp), memset(c_lp, 0, sizeof c_lp), memset(d_lp, 0, sizeof d_lp);
    /* (a) one batch */
    gpu_sample(logits, NR, V, p.rows, NULL, NR, OSP_REJECT_MAX_ROUNDS, a_tok, a_st, a_lp, NULL);
    /* (b) each row alone */
    for (int r = 0; r < NR; r++)
        gpu_sample(logits + (size_t)r * V, 1, V, &p.rows[r], NULL, 1, OSP_REJECT_MAX_ROUNDS, &b_tok[r], &b_st[r],
                   &b_lp[r], NULL);
    /* (c) reversed, interleaved with fillers, the logits rows stored in another order */
    for (int r = 0; r < NR; r++) {
        memcpy(shuffled + (size_t)(2 * NR - 1 - r) * V, logits + (size_t)r * V, sizeof(float) * V);
        memcpy(shuffled + (size_t)r * V, logits + (size_t)r * V, sizeof(float) * V);
    }
    for (int r = 0; r < NR; r++) {
        mix[2 * r] = p.rows[NR - 1 - r]; /* the row under test */
        mix_lrow[2 * r] = NR + r;        /* = shuffled row 2NR-1-(NR-1-r), holding logits row NR-1-r */
        mix[2 * r + 1] = p.rows[r];      /* a filler: another row's parameters on logits row r */
        mix[2 * r + 1].seed ^= 0xF111;
        mix[2 * r + 1].temperature = 1.0f;
        mix_lrow[2 * r + 1] = r;
    }
    gpu_sample(shuffled, 2 * NR, V, mix, mix_lrow, 2 * NR, OSP_REJECT_MAX_ROUNDS, c_tok, c_st, c_lp, NULL);
    /* (d) (a) again */
    gpu_sample(logits, NR, V, p.rows, NULL, NR, OSP_REJECT_MAX_ROUNDS, d_tok, d_st, d_lp, NULL);
    for (int r = 0; r < NR; r++) {
        const int c = 2 * (NR - 1 - r);
        assert_int_equal(a_st[r], OSP_OK);
        assert_int_equal(b_st[r], OSP_OK);
        assert_int_equal(c_st[c], OSP_OK);
        assert_int_equal(d_st[r], OSP_OK);
        if (a_tok[r] != b_tok[r] || a_tok[r] != c_tok[c] || a_tok[r] != d_tok[r])
            fail_msg("row %d: batch %d, alone %d, mixed %d, again %d", r, a_tok[r], b_tok[r], c_tok[c], d_tok[r]);
        if (p.rows[r].num_logprobs >= 0 &&
            (memcmp(&a_lp[r], &b_lp[r], sizeof a_lp[r]) || memcmp(&a_lp[r], &c_lp[c], sizeof a_lp[r]) ||
             memcmp(&a_lp[r], &d_lp[r], sizeof a_lp[r])))
            fail_msg("row %d: logprobs differ between batch compositions", r);
    }
    printf("  %d seeded rows: the same tokens and logprobs alone, batched, reordered among fillers, and again\n", NR);
    free(p.rows), free(p.bias), free(p.ids), free(logits), free(shuffled);
}

/* ---- host checks ---------------------------------------------------------------------------------- */

static void test_invalid_calls(void **state) {
    (void)state;
    assert_int_equal(osp_cuda_sample_scratch_bytes(0, 100), 0);
    assert_int_equal(osp_cuda_sample_scratch_bytes(4, 0), 0);
    assert_true(osp_cuda_sample_scratch_bytes(1, 1003) >= 2 * 1003 * 4);
    float *d = dev(&G.logits, 4096 * sizeof(float), "logits");
    int32_t *t = dev(&G.tokens, 4096, "tokens");
    osp_status *s = dev(&G.status, 4096, "status");
    osp_cuda_sample_row *rw = dev(&G.rows, sizeof(osp_cuda_sample_row) * 4, "rows");
    void *sc = G.scratch;
    assert_int_equal(osp_cuda_sample(d, 0, rw, 1, NULL, NULL, NULL, sc, t, s, NULL, G.stream), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_sample(d, 10, rw, -1, NULL, NULL, NULL, sc, t, s, NULL, G.stream), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_sample(NULL, 10, rw, 1, NULL, NULL, NULL, sc, t, s, NULL, G.stream), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_sample(d, 10, NULL, 1, NULL, NULL, NULL, sc, t, s, NULL, G.stream), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_sample(d, 10, rw, 1, NULL, NULL, NULL, NULL, t, s, NULL, G.stream), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_sample(d, 10, rw, 1, NULL, NULL, NULL, sc, NULL, s, NULL, G.stream), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_sample(d, 10, rw, 1, NULL, NULL, NULL, sc, t, NULL, NULL, G.stream), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_sample(d, 10, rw, 1, NULL, NULL, NULL, (char *)sc + 4, t, s, NULL, G.stream),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_sample_ex(d, 10, rw, 1, NULL, NULL, NULL, sc, t, s, NULL, OSP_REJECT_MAX_ROUNDS + 1, NULL,
                                        G.stream),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_sample(d, 10, rw, 0, NULL, NULL, NULL, sc, t, s, NULL, G.stream), OSP_OK);
    CHECK(osp_cuda_stream_sync(G.stream));
}

int main(int argc, char **argv) {
    if (osp_cuda_device_count() == 0) {
        printf("test_gpu_sampler: skipped: no CUDA device\n");
        return 77;
    }
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    char name[256];
    if (osp_cuda_device_name(name, sizeof name) == OSP_OK) printf("test_gpu_sampler: %s\n", name);
    if (osp_cuda_stream_create(&G.stream) != OSP_OK || osp_cuda_malloc(&G.scratch, SCRATCH_BYTES, "scratch") != OSP_OK) {
        fprintf(stderr, "test_gpu_sampler: %s\n", osp_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invalid_calls),
        cmocka_unit_test(test_greedy_ties),
        cmocka_unit_test(test_row_errors),
        cmocka_unit_test(test_penalties_bias_min_tokens),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_distributions_vocab48),
        cmocka_unit_test(test_distributions_vocab1003),
        cmocka_unit_test(test_distributions_vocab49152),
        cmocka_unit_test(test_distributions_vocab128256),
        cmocka_unit_test(test_fallback_and_rounds),
        cmocka_unit_test(test_slice_lists),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    dbuf *bufs[] = {&G.logits, &G.rows, &G.tokens, &G.status, &G.lp, &G.rounds, &G.ids, &G.bias_ids, &G.bias_vals};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) osp_cuda_free(bufs[i]->p);
    osp_cuda_free(G.scratch);
    osp_cuda_stream_destroy(G.stream);
    osp_sampler_workspace_free(g_ws);
    return rc;
}

#else

int main(void) {
    printf("test_gpu_sampler: skipped: osprey was built without CUDA\n");
    return 77;
}

#endif
