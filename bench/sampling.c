/* Sampling benchmark: the sorting-free rejection sampler (osp_sample_batch) against a sort-based
 * top-k/top-p sampler in the same run, per row, for vocabularies of 49,152 (SmolLM2) and 128,256
 * (Llama 3) and batches of 1 to 256 rows.
 *
 * Both sides start from a row of logits and do the whole job single-threaded: softmax with
 * temperature, top-k then top-p, renormalize, draw one token. The sort-based side is the textbook
 * one (and what PyTorch-style samplers do): qsort (prob, id) pairs, cut at k, cumulative sum, cut at
 * top_p, renormalize, draw. "softmax+draw" is osp_sample_batch with every filter off: the floor that
 * any exact sampler pays (one exp per logit). Logits are Gaussian, sd 2.5, different per row.
 *
 *   bench/sampling.sh            (builds this against $BUILD/libosprey.a and runs it)
 *   sampling [max_batch] [min_seconds]                                                         */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sample/rng.h"
#include "sample/sampler.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the sort-based reference sampler ----------------------------------------------------- */

typedef struct pair {
    float p;
    int32_t id;
} pair;

static int pair_desc(const void *a, const void *b) {
    const pair *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

static int32_t sort_sample(const float *l, int32_t v, float temp, int32_t k, float top_p, double u, pair *buf) {
    float mx = l[0];
    for (int32_t i = 1; i < v; i++) mx = l[i] > mx ? l[i] : mx;
    const float inv_t = 1.0f / temp;
    for (int32_t i = 0; i < v; i++) buf[i].p = expf((l[i] - mx) * inv_t), buf[i].id = i;
    qsort(buf, (size_t)v, sizeof *buf, pair_desc);
    int32_t n = k > 0 && k < v ? k : v;
    double mass = 0.0;
    for (int32_t i = 0; i < n; i++) mass += buf[i].p;
    double cum = 0.0;
    int32_t keep = 0;
    while (keep < n) {
        cum += buf[keep].p;
        keep++;
        if (cum >= (double)top_p * mass) break;
    }
    const double t = u * cum; /* renormalized over the kept tokens */
    double acc = 0.0;
    for (int32_t i = 0; i < keep; i++) {
        acc += buf[i].p;
        if (acc > t) return buf[i].id;
    }
    return buf[keep - 1].id;
}

/* ---- driver ------------------------------------------------------------------------------- */

typedef struct cfg {
    const char *name;
    int32_t k;
    float p;
} cfg;

int main(int argc, char **argv) {
    const int max_batch = argc > 1 ? atoi(argv[1]) : 256;
    const double min_s = argc > 2 ? atof(argv[2]) : 0.3;
    const int32_t vocabs[] = {49152, 128256};
    const int batches[] = {1, 8, 64, 256};
    const cfg cfgs[] = {{"top_k=50 top_p=0.95", 50, 0.95f}, {"top_k=0 top_p=0.9", 0, 0.9f},
                        {"top_k=1000 top_p=0.8", 1000, 0.8f}, {"top_k=50 (top-k only)", 50, 1.0f}};
    printf("%-7s %-5s %-22s %12s %12s %12s %8s\n", "vocab", "batch", "filter", "osprey us/row", "sort us/row",
           "softmax+draw", "ratio");
    for (size_t vi = 0; vi < 2; vi++) {
        const int32_t v = vocabs[vi];
        float *logits = malloc(sizeof(float) * (size_t)v * (size_t)max_batch);
        pair *buf = malloc(sizeof(pair) * (size_t)v);
        osp_sampler_row *rows = malloc(sizeof(osp_sampler_row) * (size_t)max_batch);
        int32_t *tok = malloc(sizeof(int32_t) * (size_t)max_batch);
        osp_status *st = malloc(sizeof(osp_status) * (size_t)max_batch);
        osp_sampler_workspace *ws;
        if (!logits || !buf || !rows || !tok || !st || osp_sampler_workspace_create(max_batch, v, 1, &ws) != OSP_OK) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        for (size_t i = 0; i < (size_t)v * (size_t)max_batch; i++) { /* Box-Muller from Philox */
            const double a = osp_rng_uniform_at(7, 0, i, 0), b = osp_rng_uniform_at(7, 0, i, 1);
            logits[i] = (float)(2.5 * sqrt(-2.0 * log(1.0 - a)) * cos(6.283185307179586 * b));
        }
        for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++)
            for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
                const int b = batches[bi];
                if (b > max_batch) continue;
                double t_osp = 0.0, t_plain = 0.0, t_sort = 0.0;
                for (int pass = 0; pass < 2; pass++) { /* 0: filtered, 1: every filter off */
                    long iters = 0;
                    const double t0 = now_s();
                    do {
                        for (int r = 0; r < b; r++) {
                            rows[r] = osp_sampler_row_default();
                            rows[r].top_k = pass ? 0 : cfgs[c].k;
                            rows[r].top_p = pass ? 1.0f : cfgs[c].p;
                            rows[r].seed = (uint64_t)r;
                            rows[r].output_pos = (uint64_t)iters;
                        }
                        if (osp_sample_batch(ws, logits, b, v, rows, tok, NULL, st) != OSP_OK) {
                            fprintf(stderr, "sampling failed: %s\n", osp_last_error());
                            return 1;
                        }
                        iters++;
                    } while (now_s() - t0 < min_s);
                    const double per = (now_s() - t0) / (double)(iters * b) * 1e6;
                    if (pass) t_plain = per;
                    else t_osp = per;
                }
                long rows_done = 0;
                const double t0 = now_s();
                volatile int32_t sink = 0;
                do { /* the slow side: at least one full batch, then as long as the budget lasts */
                    for (int r = 0; r < b; r++)
                        sink += sort_sample(logits + (size_t)r * (size_t)v, v, 1.0f, cfgs[c].k, cfgs[c].p,
                                            osp_rng_uniform_at((uint64_t)r, 0, (uint64_t)rows_done, 0), buf);
                    rows_done += b;
                } while (now_s() - t0 < min_s);
                t_sort = (now_s() - t0) / (double)rows_done * 1e6;
                printf("%-7d %-5d %-22s %12.1f %12.1f %12.1f %7.1fx\n", v, b, cfgs[c].name, t_osp, t_sort, t_plain,
                       t_sort / t_osp);
                fflush(stdout);
            }
        osp_sampler_workspace_free(ws);
        free(logits), free(buf), free(rows), free(tok), free(st);
    }
    return 0;
}
