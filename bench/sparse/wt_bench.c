/* wt_bench: what building a work table costs on the host, and what it says a selection reads (issue 15).
 *
 * One decode step of the 8B shape (n_head 32, n_head_kv 8, head_dim 128, f16 pages of 16 tokens) over
 * `seqs` sequences of `ctx` tokens, rows per KV head, with three kinds of candidates per row:
 *   scattered  top-k tokens drawn uniformly from the context (what a token-level indexer may give)
 *   clustered  the same count in aligned runs of 16 (whole pages)
 *   quest      top-k pages: every token of `k / 16` random pages
 * For each: the time to sort the candidates alone (copy + qsort per row, the step the builder starts
 * with), the time of the whole osp_sparse_wt_build (sort, dedup, tile, map pages, classify, order and
 * bucket rows), the logical candidates, the physical tiles and the K + V bytes those tiles read, against
 * dense. Times: the best of `reps` runs (CLOCK_MONOTONIC), single-threaded.
 *
 * usage: wt_bench [--seqs 64] [--ctx 32768] [--k 2048] [--reps 5] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sparse/worktable.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t g_rng = 1;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int32_t seqs = 64, ctx = 32768, k = 2048, reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seqs")) seqs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ctx")) ctx = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--k")) k = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else fprintf(stderr, "wt_bench: unknown option %s\n", argv[i]), exit(2);
    }
    if (seqs < 1 || ctx < 16 || k < 16 || k > ctx || reps < 1) fprintf(stderr, "wt_bench: bad sizes\n"), exit(2);
    const int32_t BS = 16, H = 32, HK = 8, D = 128, maxb = (ctx + BS - 1) / BS;
    const int64_t rows = (int64_t)seqs * HK, kv_head_bytes = D * 2;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)seqs), *qsl = malloc(sizeof(int32_t) * ((size_t)seqs + 1)),
            *sl = malloc(sizeof(int32_t) * (size_t)seqs), *bt = malloc(sizeof(int32_t) * (size_t)seqs * (size_t)maxb);
    int32_t *ci = malloc(sizeof(int32_t) * ((size_t)rows + 1)), *cand = malloc(sizeof(int32_t) * (size_t)rows * (size_t)k),
            *tmp = malloc(sizeof(int32_t) * (size_t)k);
    if (!pos || !qsl || !sl || !bt || !ci || !cand || !tmp) fprintf(stderr, "wt_bench: out of memory\n"), exit(1);
    for (int32_t s = 0; s < seqs; s++) pos[s] = ctx - 1, qsl[s] = s, sl[s] = ctx;
    qsl[seqs] = seqs;
    for (int64_t i = 0; i < (int64_t)seqs * maxb; i++) bt[i] = (int32_t)((i * 7919) % ((int64_t)seqs * maxb));
    const osp_sparse_layout L = {.num_tokens = seqs, .positions = pos, .num_seqs = seqs, .query_start_loc = qsl,
                                 .seq_lens = sl, .block_table = bt, .max_blocks_per_seq = maxb, .block_size = BS,
                                 .n_head = H, .n_head_kv = HK, .share = OSP_SPARSE_PER_KV_HEAD, .q_tile = 1};
    printf("# wt_bench: decode, %d sequences of %d tokens, 8B shape (32 heads, 8 KV heads, head_dim 128, f16 pages of "
           "16), rows per KV head, %d candidate tokens a row, best of %d\n", seqs, ctx, k, reps);
    printf("| candidates | rows | logical candidates | physical tiles | K+V bytes read | vs dense | sort alone, ms | "
           "build (all), ms |\n|---|---|---|---|---|---|---|---|\n");
    const char *kinds[3] = {"scattered", "clustered", "quest"};
    osp_sparse_wt wt = {0};
    for (int kind = 0; kind < 3; kind++) {
        for (int64_t r = 0; r < rows; r++) {
            ci[r] = (int32_t)(r * k);
            int32_t *c = cand + r * k;
            if (kind == 0)
                for (int32_t i = 0; i < k; i++) c[i] = (int32_t)(rnd() % (uint32_t)ctx);
            else
                for (int32_t i = 0; i < k; i += BS) {
                    const int32_t page = (int32_t)(rnd() % (uint32_t)(ctx / BS));
                    for (int32_t o = 0; o < BS && i + o < k; o++) c[i + o] = page * BS + o;
                }
        }
        ci[rows] = (int32_t)(rows * k);
        const osp_sparse_cands C = {ci, cand};
        double best_sort = 1e30, best_build = 1e30;
        for (int rep = 0; rep < reps; rep++) {
            double t0 = now();
            for (int64_t r = 0; r < rows; r++) {
                memcpy(tmp, cand + r * k, sizeof(int32_t) * (size_t)k);
                qsort(tmp, (size_t)k, sizeof *tmp, cmp_i32);
            }
            double t1 = now();
            if (t1 - t0 < best_sort) best_sort = t1 - t0;
            t0 = now();
            if (osp_sparse_wt_build(&wt, &L, &C, NULL, kv_head_bytes) != OSP_OK)
                fprintf(stderr, "wt_bench: %s\n", osp_last_error()), exit(1);
            t1 = now();
            if (t1 - t0 < best_build) best_build = t1 - t0;
        }
        const osp_sparse_wt_stats *st = &wt.stats;
        const int64_t dense_bytes = st->dense_tiles * BS * 2 * kv_head_bytes;
        printf("| %s | %lld | %lld | %lld | %.1f MB | %.3f | %.2f | %.2f |\n", kinds[kind], (long long)rows,
               (long long)st->logical_candidates, (long long)st->physical_tiles, (double)st->bytes_read / 1e6,
               (double)st->bytes_read / (double)dense_bytes, best_sort * 1e3, best_build * 1e3);
    }
    osp_sparse_wt_free(&wt);
    free(pos), free(qsl), free(sl), free(bt), free(ci), free(cand), free(tmp);
    return 0;
}
