/* Block-sparse decode attention on the GPU against osprey's own dense decode attention, same cache, same
 * process (issue 15's "Fast" rows for the kernel alone). The 8B shape: 32 query heads, 8 KV heads, head_dim
 * 128, f16 pages of 16 tokens handed out in a shuffled order; one query token a sequence at position
 * ctx - 1; rows per KV head (the group's 4 query heads share one K/V read).
 *
 *   pages   ctx 32,768 (2,048 pages a sequence), batch 1 and 8, top-k page budgets 256 and 64 per KV
 *           head: the sink page, the 2 most recent pages, the rest at random (Quest-like selections)
 *   tokens  ctx 131,072, batch 1 and 8, 2,048 tokens per KV head at random (DSA-like: token-level bitmasks,
 *           ~1,800 pages touched, ~1 token each)
 *
 * Each row: the work table built on the host (osp_sparse_wt_build, timed once, host ms), uploaded; then the
 * dense kernel (osp_cuda_paged_attention, its default choice for the shape) and the sparse kernel
 * (osp_cuda_sparse_attention_decode: gather + attend + merge) each timed with CUDA events around
 * `iters` back-to-back launches after a warm-up and a device sync, the median of 5 samples (one launch is one
 * layer's attention). Printed: us a layer, bytes each kernel must read (dense: K and V of every token;
 * sparse: K and V rows of the kept tokens plus the table's 16 bytes an entry) and those bytes over the time
 * (effective GB/s), table entries (pages) and kept tokens, chunks a row, and dense / sparse. Goals (issue
 * 15): >= 4x at 256 pages / 32k, >= 8x at 2,048 tokens / 128k (attention only). Pages rows also time
 * Quest's scoring and top-k on the GPU (osp_cuda_quest_select: fp32 and f16 summaries, sink 1, recent 2) for the
 * same rows, separately, and dense / (Quest + sparse), then the whole step on the device (Quest's
 * selection, osp_cuda_quest_table's work table, the sparse kernel: three launches and the table's two)
 * against dense.
 *
 *   dsa     ctx 131,072, batch 1 and 8: the DSA lightning indexer on the GPU (dsa_indexer.cu; H_I 64, d_I
 *           128, FP8 E4M3 index keys with a scale a token, random q_I / w / keys; k 2,048): scoring, top-k
 *           and the device work table timed apart (the top-k by the default one-pass bitmap kernel, and by
 *           the 7-barrier cluster kernel and the one-CTA kernel for comparison: OSPREY_DSA_TOPK=cluster8 /
 *           cta), the sparse attention on that table, the whole chain
 *           (four launches and a memset), and dense / (indexer + sparse): issue 15's 8x goal.
 *
 * Usage: sparse_decode_bench [pages|tokens|dsa|all] (default all; SPARSE_BENCH_B=1 or 8: that batch only). One JSON object a row on stdout after the
 * table (prefix "json ") for RESULTS.md. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda_ops.h"
#include "core/dtype.h"
#include "osprey/status.h"
#include "sparse/worktable.h"

#define H 32
#define HKV 8
#define D 128
#define BS 16

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "sparse_decode_bench: %s: %s\n", #x, cudaGetErrorString(e_));        \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)
#define OK(x)                                                                                    \
    do {                                                                                         \
        if ((x) != OSP_OK) {                                                                     \
            fprintf(stderr, "sparse_decode_bench: %s: %s\n", #x, osp_last_error());              \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

static uint64_t g_rng = 0x5EED5;
static uint64_t rnd64(void) {
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float rnd_unit(void) { return (float)(rnd64() >> 40) / 8388608.0f - 1.0f; }
static int32_t rnd_int(int32_t n) { return (int32_t)(rnd64() % (uint64_t)n); }

/* n random f16 values in [-1, 1) on the device: a random pattern tiled with an offset (as attn_bench) */
static void *random_pages(size_t n) {
    const size_t pat = 1u << 19;
    uint16_t *h = malloc(pat * 2);
    for (size_t i = 0; i < pat; i++) h[i] = osp_fp32_to_fp16(rnd_unit());
    void *d;
    OK(osp_cuda_malloc(&d, n * 2, "pages"));
    for (size_t off = 0; off < n; off += pat - 7) {
        const size_t m = n - off < pat ? n - off : pat;
        CK(cudaMemcpy((uint16_t *)d + off, h, m * 2, cudaMemcpyHostToDevice));
    }
    free(h);
    return d;
}

static int cmp_f(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* the median us of one launch of `launch` (5 samples of ~20 ms after a warm-up) */
typedef void (*launch_fn)(void *ctx);
static double time_us(launch_fn f, void *ctx) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    f(ctx);
    CK(cudaDeviceSynchronize());
    CK(cudaEventRecord(e0, NULL));
    f(ctx);
    CK(cudaEventRecord(e1, NULL));
    CK(cudaEventSynchronize(e1));
    float one = 0.0f;
    CK(cudaEventElapsedTime(&one, e0, e1));
    int iters = (int)(20.0f / (one > 0.001f ? one : 0.001f));
    if (iters < 1) iters = 1;
    if (iters > 5000) iters = 5000;
    float samples[5];
    for (int r = 0; r < 5; r++) {
        CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(e0, NULL));
        for (int i = 0; i < iters; i++) f(ctx);
        CK(cudaEventRecord(e1, NULL));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        samples[r] = ms / (float)iters;
    }
    qsort(samples, 5, sizeof(float), cmp_f);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return samples[2] * 1e3;
}

typedef struct {
    int B, ctx;
    int32_t nb_seq;
    void *k, *v, *ws_dense, *ws_sparse;
    int32_t *d_qsl, *d_pos, *d_bt, *d_sl, *d_tok;
    uint16_t *d_q, *d_out;
    size_t ws_sparse_bytes;
    osp_cuda_sparse_table tab;
    /* Quest on the GPU (pages rows): summaries [nblocks, HKV, D] (fp32, and the same values in f16, the
     * pages' dtype), scores, pages, counts; qsum: the type launch_quest reads */
    void *d_kmin, *d_kmax, *d_kmin16, *d_kmax16;
    osp_cuda_quest_summary qsum;
    float *d_scores;
    int32_t *d_qpages, *d_qcounts;
    int topk;
    osp_cuda_sparse_table qtab; /* the table of Quest's selection, built on the device */
    int32_t *d_qip, *d_qind, *d_qpg, *d_qfl;
    uint32_t *d_qtm;
    void *ws_q;
    size_t ws_q_bytes;
} bench_ctx;

static void launch_dense(void *p) {
    bench_ctx *c = p;
    OK(osp_cuda_paged_attention(c->d_q, c->k, c->v, OSP_KV_PAGE_F16, c->d_out, c->B, c->d_qsl, c->d_pos, c->d_bt,
                                c->nb_seq, BS, c->B, H, HKV, D, 0.08838834764f, 0, c->ctx, c->ws_dense, NULL));
}
static void launch_sparse(void *p) {
    bench_ctx *c = p;
    OK(osp_cuda_sparse_attention_decode(&c->tab, c->d_q, c->k, c->v, OSP_KV_PAGE_F16, c->d_out, c->B, c->d_pos,
                                        c->d_tok, c->d_sl, c->d_bt, c->nb_seq, BS, H, HKV, D, 0.08838834764f, NULL,
                                        c->ws_sparse, c->ws_sparse_bytes, NULL));
}

static void launch_quest(void *p) {
    bench_ctx *c = p;
    const bool f32 = c->qsum == OSP_CUDA_QUEST_F32;
    OK(osp_cuda_quest_select(f32 ? c->d_kmin : c->d_kmin16, f32 ? c->d_kmax : c->d_kmax16, c->qsum, c->d_q, c->d_pos, c->d_tok, c->d_bt, c->nb_seq, BS, c->B, H, HKV, D,
                             c->topk, 1, 2, c->d_scores, c->d_qpages, c->d_qcounts, NULL));
}

/* the whole top-k step on the device: Quest's scores and top-k, its work table, the sparse attention */
static void launch_pipeline(void *p) {
    bench_ctx *c = p;
    launch_quest(c);
    OK(osp_cuda_quest_table(c->d_qpages, c->d_qcounts, c->topk, c->d_pos, c->d_tok, c->d_sl, c->d_bt, c->nb_seq, BS, c->B,
                            HKV, c->d_qip, c->d_qind, c->d_qpg, c->d_qfl, c->d_qtm, NULL));
    OK(osp_cuda_sparse_attention_decode(&c->qtab, c->d_q, c->k, c->v, OSP_KV_PAGE_F16, c->d_out, c->B, c->d_pos, c->d_tok,
                                        c->d_sl, c->d_bt, c->nb_seq, BS, H, HKV, D, 0.08838834764f, NULL, c->ws_q,
                                        c->ws_q_bytes, NULL));
}

/* kind 'p': budget pages a KV head (sink, 2 recent, random); kind 't': budget tokens at random */
static void run(char kind, int B, int ctx, int budget, const char *label) {
    bench_ctx c = {.B = B, .ctx = ctx};
    c.nb_seq = (ctx + BS - 1) / BS;
    const int64_t nblocks = (int64_t)B * c.nb_seq;
    const size_t nval = (size_t)nblocks * BS * HKV * D;
    c.k = random_pages(nval), c.v = random_pages(nval);
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)nblocks);
    for (int64_t i = 0; i < nblocks; i++) bt[i] = (int32_t)i;
    for (int64_t i = nblocks - 1; i > 0; i--) {
        const int64_t j = (int64_t)(rnd64() % (uint64_t)(i + 1));
        const int32_t t = bt[i];
        bt[i] = bt[j], bt[j] = t;
    }
    int32_t *qsl = malloc(sizeof(int32_t) * (size_t)(B + 1)), *pos = malloc(sizeof(int32_t) * (size_t)B),
            *sl = malloc(sizeof(int32_t) * (size_t)B), *tok = malloc(sizeof(int32_t) * (size_t)B);
    for (int s = 0; s <= B; s++) qsl[s] = s;
    for (int s = 0; s < B; s++) pos[s] = ctx - 1, sl[s] = ctx, tok[s] = s;
    uint16_t *q = malloc(sizeof(uint16_t) * (size_t)B * H * D);
    for (int64_t i = 0; i < (int64_t)B * H * D; i++) q[i] = osp_fp32_to_bf16(rnd_unit() * 2.0f);

    /* candidates a row (t * HKV + g) */
    const int32_t rows = B * HKV;
    const int64_t per_row = kind == 'p' ? (int64_t)budget * BS : budget;
    int32_t *ci = malloc(sizeof(int32_t) * (size_t)(rows + 1)), *cand = malloc(sizeof(int32_t) * (size_t)(rows * per_row));
    uint8_t *pick = malloc((size_t)c.nb_seq);
    int64_t m = 0;
    ci[0] = 0;
    for (int32_t r = 0; r < rows; r++) {
        if (kind == 'p') {
            memset(pick, 0, (size_t)c.nb_seq);
            pick[0] = pick[c.nb_seq - 1] = pick[c.nb_seq - 2] = 1;
            int got = 3;
            while (got < budget) {
                const int32_t j = rnd_int(c.nb_seq);
                if (!pick[j]) pick[j] = 1, got++;
            }
            for (int32_t j = 0; j < c.nb_seq; j++)
                if (pick[j])
                    for (int i = 0; i < BS; i++) cand[m++] = j * BS + i;
        } else {
            for (int i = 0; i < budget; i++) cand[m++] = rnd_int(ctx); /* duplicates are merged by the builder */
        }
        ci[r + 1] = (int32_t)m;
    }
    free(pick);
    osp_sparse_layout L = {.num_tokens = B, .positions = pos, .num_seqs = B, .query_start_loc = qsl, .seq_lens = sl,
                           .block_table = bt, .max_blocks_per_seq = c.nb_seq, .block_size = BS, .n_head = H,
                           .n_head_kv = HKV, .share = OSP_SPARSE_PER_KV_HEAD, .q_tile = 1};
    osp_sparse_cands C = {ci, cand};
    osp_sparse_wt wt = {0};
    const double t0 = now_ms();
    OK(osp_sparse_wt_build(&wt, &L, &C, NULL, (int64_t)D * 2));
    const double build_ms = now_ms() - t0;
    const int32_t nnz = wt.indptr[wt.num_rows];
    int32_t mx = 0;
    for (int32_t r = 0; r < wt.num_rows; r++)
        if (wt.indptr[r + 1] - wt.indptr[r] > mx) mx = wt.indptr[r + 1] - wt.indptr[r];
    int64_t kept = 0;
    for (int32_t e = 0; e < nnz; e++) {
        const int32_t base = wt.indices[e] * BS;
        for (int i = 0; i < BS; i++) kept += base + i < ctx && (wt.flags[e] & OSP_WT_FULL || (wt.tmask[e] >> i & 1u));
    }

    /* device copies */
    void *d_ip, *d_ind, *d_pg, *d_fl, *d_tm;
    OK(osp_cuda_malloc(&d_ip, sizeof(int32_t) * (size_t)(rows + 1), "indptr"));
    OK(osp_cuda_malloc(&d_ind, sizeof(int32_t) * (size_t)nnz, "indices"));
    OK(osp_cuda_malloc(&d_pg, sizeof(int32_t) * (size_t)nnz, "pages"));
    OK(osp_cuda_malloc(&d_fl, sizeof(int32_t) * (size_t)nnz, "flags"));
    OK(osp_cuda_malloc(&d_tm, sizeof(uint32_t) * (size_t)nnz * (size_t)wt.mask_words, "tmask"));
    CK(cudaMemcpy(d_ip, wt.indptr, sizeof(int32_t) * (size_t)(rows + 1), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_ind, wt.indices, sizeof(int32_t) * (size_t)nnz, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_pg, wt.pages, sizeof(int32_t) * (size_t)nnz, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_fl, wt.flags, sizeof(int32_t) * (size_t)nnz, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_tm, wt.tmask, sizeof(uint32_t) * (size_t)nnz * (size_t)wt.mask_words, cudaMemcpyHostToDevice));
    c.tab = (osp_cuda_sparse_table){.d_indptr = d_ip, .d_indices = d_ind, .d_pages = d_pg, .d_flags = d_fl,
                                    .d_tmask = d_tm, .num_rows = rows, .groups = HKV, .mask_words = wt.mask_words,
                                    .max_row_tiles = mx};
    OK(osp_cuda_malloc((void **)&c.d_qsl, sizeof(int32_t) * (size_t)(B + 1), "qsl"));
    OK(osp_cuda_malloc((void **)&c.d_pos, sizeof(int32_t) * (size_t)B, "pos"));
    OK(osp_cuda_malloc((void **)&c.d_sl, sizeof(int32_t) * (size_t)B, "seq_lens"));
    OK(osp_cuda_malloc((void **)&c.d_tok, sizeof(int32_t) * (size_t)B, "token_seq"));
    OK(osp_cuda_malloc((void **)&c.d_bt, sizeof(int32_t) * (size_t)nblocks, "bt"));
    OK(osp_cuda_malloc((void **)&c.d_q, sizeof(uint16_t) * (size_t)B * H * D, "q"));
    OK(osp_cuda_malloc((void **)&c.d_out, sizeof(uint16_t) * (size_t)B * H * D, "out"));
    CK(cudaMemcpy(c.d_qsl, qsl, sizeof(int32_t) * (size_t)(B + 1), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c.d_pos, pos, sizeof(int32_t) * (size_t)B, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c.d_sl, sl, sizeof(int32_t) * (size_t)B, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c.d_tok, tok, sizeof(int32_t) * (size_t)B, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c.d_bt, bt, sizeof(int32_t) * (size_t)nblocks, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c.d_q, q, sizeof(uint16_t) * (size_t)B * H * D, cudaMemcpyHostToDevice));
    const size_t wsd = osp_cuda_attention_workspace_bytes(B, H, D, ctx);
    if (wsd) OK(osp_cuda_malloc(&c.ws_dense, wsd, "ws dense"));
    c.ws_sparse_bytes = osp_cuda_sparse_workspace_bytes(B, H, D, mx, BS);
    if (c.ws_sparse_bytes) OK(osp_cuda_malloc(&c.ws_sparse, c.ws_sparse_bytes, "ws sparse"));

    const double us_d = time_us(launch_dense, &c), us_s = time_us(launch_sparse, &c);
    double us_q = 0.0; /* Quest's scoring and top-k for the same rows (pages rows), f16 summaries */
    if (kind == 'p') {
        const size_t ns = (size_t)nblocks * HKV * D;
        float *h = malloc(ns * sizeof(float) * 2);
        uint16_t *h16 = malloc(ns * sizeof(uint16_t) * 2);
        for (size_t i = 0; i < ns; i++) { /* values of f16 keys: the f16 summaries equal the fp32 ones */
            const float x = osp_fp16_to_fp32(osp_fp32_to_fp16(rnd_unit())), y = osp_fp16_to_fp32(osp_fp32_to_fp16(rnd_unit()));
            h[i] = x < y ? x : y, h[ns + i] = x < y ? y : x;
            h16[i] = osp_fp32_to_fp16(h[i]), h16[ns + i] = osp_fp32_to_fp16(h[ns + i]);
        }
        OK(osp_cuda_malloc(&c.d_kmin, ns * sizeof(float), "kmin"));
        OK(osp_cuda_malloc(&c.d_kmax, ns * sizeof(float), "kmax"));
        OK(osp_cuda_malloc(&c.d_kmin16, ns * sizeof(uint16_t), "kmin f16"));
        OK(osp_cuda_malloc(&c.d_kmax16, ns * sizeof(uint16_t), "kmax f16"));
        OK(osp_cuda_malloc((void **)&c.d_scores, sizeof(float) * (size_t)rows * (size_t)c.nb_seq, "scores"));
        OK(osp_cuda_malloc((void **)&c.d_qpages, sizeof(int32_t) * (size_t)rows * (size_t)budget, "pages"));
        OK(osp_cuda_malloc((void **)&c.d_qcounts, sizeof(int32_t) * (size_t)rows, "counts"));
        CK(cudaMemcpy(c.d_kmin, h, ns * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(c.d_kmax, h + ns, ns * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(c.d_kmin16, h16, ns * sizeof(uint16_t), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(c.d_kmax16, h16 + ns, ns * sizeof(uint16_t), cudaMemcpyHostToDevice));
        free(h), free(h16);
        c.topk = budget;
        c.qsum = OSP_CUDA_QUEST_F32;
        const double us_q32 = time_us(launch_quest, &c);
        c.qsum = OSP_CUDA_QUEST_F16;
        us_q = time_us(launch_quest, &c);
        printf("quest   B %d ctx %6d budget %4d        | scores + top-k: fp32 summaries %7.1f us (%.1f MB: %6.0f GB/s), "
               "f16 %7.1f us (%.1f MB: %6.0f GB/s) | f16 quest + sparse %7.1f us | dense / (quest + sparse) %5.2fx\n",
               B, ctx, budget, us_q32, 2.0 * ns * 4 / 1e6, 2.0 * ns * 4 / (us_q32 * 1e3), us_q, 2.0 * ns * 2 / 1e6,
               2.0 * ns * 2 / (us_q * 1e3), us_q + us_s, us_d / (us_q + us_s));
        /* the pipeline: selection, device-built table, attention */
        const size_t cap = (size_t)rows * (size_t)budget;
        OK(osp_cuda_malloc((void **)&c.d_qip, sizeof(int32_t) * (size_t)(rows + 1), "q indptr"));
        OK(osp_cuda_malloc((void **)&c.d_qind, sizeof(int32_t) * cap, "q indices"));
        OK(osp_cuda_malloc((void **)&c.d_qpg, sizeof(int32_t) * cap, "q pages"));
        OK(osp_cuda_malloc((void **)&c.d_qfl, sizeof(int32_t) * cap, "q flags"));
        OK(osp_cuda_malloc((void **)&c.d_qtm, sizeof(uint32_t) * cap, "q tmask"));
        c.qtab = (osp_cuda_sparse_table){.d_indptr = c.d_qip, .d_indices = c.d_qind, .d_pages = c.d_qpg,
                                         .d_flags = c.d_qfl, .d_tmask = c.d_qtm, .num_rows = rows, .groups = HKV,
                                         .mask_words = 1, .max_row_tiles = budget};
        c.ws_q_bytes = osp_cuda_sparse_workspace_bytes(B, H, D, budget, BS);
        if (c.ws_q_bytes) OK(osp_cuda_malloc(&c.ws_q, c.ws_q_bytes, "ws pipeline"));
        const double us_p = time_us(launch_pipeline, &c);
        printf("step    B %d ctx %6d budget %4d        | quest + table + sparse on the device %7.1f us | dense / step %5.2fx\n",
               B, ctx, budget, us_p, us_d / us_p);
        osp_cuda_free(c.d_qip), osp_cuda_free(c.d_qind), osp_cuda_free(c.d_qpg), osp_cuda_free(c.d_qfl);
        osp_cuda_free(c.d_qtm), osp_cuda_free(c.ws_q);
        osp_cuda_free(c.d_kmin), osp_cuda_free(c.d_kmax), osp_cuda_free(c.d_scores), osp_cuda_free(c.d_qpages);
        osp_cuda_free(c.d_kmin16), osp_cuda_free(c.d_kmax16);
        osp_cuda_free(c.d_qcounts);
    }
    const double bytes_d = (double)B * ctx * HKV * D * 2.0 * 2.0;
    const double bytes_s = (double)kept * D * 2.0 * 2.0 + (double)nnz * 16.0 + (double)(rows + 1) * 4.0;
    const int chunks = osp_cuda_sparse_max_chunks(mx, BS);
    printf("%-7s B %d ctx %6d budget %4d %-6s | dense %8.1f us %6.0f GB/s | sparse %7.1f us %6.0f GB/s %7.2f MB | "
           "entries %6d (%5.0f a row) kept %7lld chunks/row %3d | build %6.2f ms | dense/sparse %5.2fx\n",
           kind == 'p' ? "pages" : "tokens", B, ctx, budget, label, us_d, bytes_d / (us_d * 1e3), us_s,
           bytes_s / (us_s * 1e3), bytes_s / 1e6, nnz, (double)nnz / rows, (long long)kept, chunks, build_ms, us_d / us_s);
    printf("json {\"kind\": \"%s\", \"B\": %d, \"ctx\": %d, \"budget\": %d, \"dense_us\": %.2f, \"sparse_us\": %.2f, "
           "\"dense_gbps\": %.1f, \"sparse_gbps\": %.1f, \"sparse_bytes\": %.0f, \"entries\": %d, \"kept\": %lld, "
           "\"chunks_per_row\": %d, \"build_ms\": %.3f, \"ratio\": %.3f, \"quest_us\": %.2f}\n",
           kind == 'p' ? "pages" : "tokens", B, ctx, budget, us_d, us_s, bytes_d / (us_d * 1e3), bytes_s / (us_s * 1e3),
           bytes_s, nnz, (long long)kept, chunks, build_ms, us_d / us_s, us_q);
    fflush(stdout);

    osp_cuda_free(d_ip), osp_cuda_free(d_ind), osp_cuda_free(d_pg), osp_cuda_free(d_fl), osp_cuda_free(d_tm);
    osp_cuda_free(c.d_qsl), osp_cuda_free(c.d_pos), osp_cuda_free(c.d_sl), osp_cuda_free(c.d_tok);
    osp_cuda_free(c.d_bt), osp_cuda_free(c.d_q), osp_cuda_free(c.d_out), osp_cuda_free(c.ws_dense);
    osp_cuda_free(c.ws_sparse), osp_cuda_free(c.k), osp_cuda_free(c.v);
    osp_sparse_wt_free(&wt);
    free(bt), free(qsl), free(pos), free(sl), free(tok), free(q), free(ci), free(cand);
}

/* ---- the DSA path: indexer (score, top-k, table) -> sparse attention, against dense ---- */
#define HI 64
#define DI 128
#define TOPK 2048

typedef struct {
    bench_ctx *c;
    const uint16_t *d_qi;
    const float *d_w, *d_scales;
    const uint8_t *d_codes;
    float *d_scores;
    uint32_t *d_hist, *d_em;
    int32_t *d_idx, *d_cnt, *d_ej, *d_en;
    int32_t *d_ip, *d_ind, *d_pg, *d_fl;
    uint32_t *d_tm;
} dsa_ctx;

static void launch_dsa_score(void *p) {
    dsa_ctx *x = p;
    bench_ctx *c = x->c;
    OK(osp_cuda_dsa_score(x->d_qi, x->d_w, x->d_codes, x->d_scales, c->d_pos, c->d_tok, c->d_bt, c->nb_seq, BS, c->B, HI,
                          DI, c->ctx, x->d_scores, x->d_hist, NULL));
}
static void launch_dsa_topk(void *p) {
    dsa_ctx *x = p;
    bench_ctx *c = x->c;
    OK(osp_cuda_dsa_topk(x->d_scores, x->d_hist, c->d_pos, c->B, c->ctx, TOPK, BS, x->d_idx, x->d_cnt, x->d_ej, x->d_em,
                         x->d_en, NULL));
}
static void launch_dsa_table(void *p) {
    dsa_ctx *x = p;
    bench_ctx *c = x->c;
    OK(osp_cuda_dsa_table(x->d_ej, x->d_em, x->d_en, TOPK, c->d_tok, c->d_bt, c->nb_seq, BS, c->B, HKV, x->d_ip, x->d_ind,
                          x->d_pg, x->d_fl, x->d_tm, NULL));
}
static void launch_dsa_indexer(void *p) {
    launch_dsa_score(p), launch_dsa_topk(p), launch_dsa_table(p);
}
static void launch_dsa_sparse(void *p) { launch_sparse(((dsa_ctx *)p)->c); }
static void launch_dsa_step(void *p) {
    launch_dsa_indexer(p);
    launch_dsa_sparse(p);
}

static void run_dsa(int B, int ctx) {
    bench_ctx c = {.B = B, .ctx = ctx};
    c.nb_seq = (ctx + BS - 1) / BS;
    const int64_t nblocks = (int64_t)B * c.nb_seq;
    const size_t nval = (size_t)nblocks * BS * HKV * D;
    c.k = random_pages(nval), c.v = random_pages(nval);
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)nblocks);
    for (int64_t i = 0; i < nblocks; i++) bt[i] = (int32_t)i;
    for (int64_t i = nblocks - 1; i > 0; i--) {
        const int64_t j = (int64_t)(rnd64() % (uint64_t)(i + 1));
        const int32_t t = bt[i];
        bt[i] = bt[j], bt[j] = t;
    }
    int32_t qsl[9], pos[8], sl[8], tok[8];
    for (int s = 0; s <= B; s++) qsl[s] = s;
    for (int s = 0; s < B; s++) pos[s] = ctx - 1, sl[s] = ctx, tok[s] = s;
    uint16_t *q = malloc(sizeof(uint16_t) * (size_t)B * H * D);
    for (int64_t i = 0; i < (int64_t)B * H * D; i++) q[i] = osp_fp32_to_bf16(rnd_unit() * 2.0f);
    /* index keys: random E4M3 codes of values in [-1, 1) (a random pattern tiled), scales ~1/448 */
    const size_t slots = (size_t)nblocks * BS, ncodes = slots * DI, pat = 1u << 24; /* few repeats: few ties */
    uint8_t *hc = malloc(pat);
    for (size_t i = 0; i < pat; i++) hc[i] = osp_fp32_to_e4m3(rnd_unit() * 448.0f);
    dsa_ctx x = {.c = &c};
    OK(osp_cuda_malloc((void **)&x.d_codes, ncodes, "index codes"));
    for (size_t off = 0; off < ncodes; off += pat - 64) {
        const size_t m = ncodes - off < pat ? ncodes - off : pat;
        CK(cudaMemcpy((uint8_t *)x.d_codes + off, hc, m, cudaMemcpyHostToDevice));
    }
    free(hc);
    float *hs = malloc(sizeof(float) * slots);
    for (size_t i = 0; i < slots; i++) hs[i] = (1.0f + 0.25f * rnd_unit()) / 448.0f;
    OK(osp_cuda_malloc((void **)&x.d_scales, sizeof(float) * slots, "index scales"));
    CK(cudaMemcpy((void *)x.d_scales, hs, sizeof(float) * slots, cudaMemcpyHostToDevice));
    free(hs);
    uint16_t *hq = malloc(sizeof(uint16_t) * (size_t)B * HI * DI);
    for (int64_t i = 0; i < (int64_t)B * HI * DI; i++) hq[i] = osp_fp32_to_bf16(rnd_unit());
    float *hw = malloc(sizeof(float) * (size_t)B * HI);
    for (int64_t i = 0; i < (int64_t)B * HI; i++) hw[i] = rnd_unit();
    OK(osp_cuda_malloc((void **)&x.d_qi, sizeof(uint16_t) * (size_t)B * HI * DI, "q_I"));
    OK(osp_cuda_malloc((void **)&x.d_w, sizeof(float) * (size_t)B * HI, "w"));
    CK(cudaMemcpy((void *)x.d_qi, hq, sizeof(uint16_t) * (size_t)B * HI * DI, cudaMemcpyHostToDevice));
    CK(cudaMemcpy((void *)x.d_w, hw, sizeof(float) * (size_t)B * HI, cudaMemcpyHostToDevice));
    free(hq), free(hw);
    const int rows = B * HKV;
    OK(osp_cuda_malloc((void **)&x.d_scores, sizeof(float) * (size_t)B * ctx, "scores"));
    OK(osp_cuda_malloc((void **)&x.d_hist, sizeof(uint32_t) * (size_t)B * 4096, "hist"));
    OK(osp_cuda_malloc((void **)&x.d_idx, sizeof(int32_t) * (size_t)B * TOPK, "idx"));
    OK(osp_cuda_malloc((void **)&x.d_cnt, sizeof(int32_t) * (size_t)B, "count"));
    OK(osp_cuda_malloc((void **)&x.d_ej, sizeof(int32_t) * (size_t)B * TOPK, "ent_j"));
    OK(osp_cuda_malloc((void **)&x.d_em, sizeof(uint32_t) * (size_t)B * TOPK, "ent_mask"));
    OK(osp_cuda_malloc((void **)&x.d_en, sizeof(int32_t) * (size_t)B, "ent_n"));
    const size_t cap = (size_t)rows * TOPK;
    OK(osp_cuda_malloc((void **)&x.d_ip, sizeof(int32_t) * (size_t)(rows + 1), "indptr"));
    OK(osp_cuda_malloc((void **)&x.d_ind, sizeof(int32_t) * cap, "indices"));
    OK(osp_cuda_malloc((void **)&x.d_pg, sizeof(int32_t) * cap, "pages"));
    OK(osp_cuda_malloc((void **)&x.d_fl, sizeof(int32_t) * cap, "flags"));
    OK(osp_cuda_malloc((void **)&x.d_tm, sizeof(uint32_t) * cap, "tmask"));
    OK(osp_cuda_malloc((void **)&c.d_qsl, sizeof(int32_t) * (size_t)(B + 1), "qsl"));
    OK(osp_cuda_malloc((void **)&c.d_pos, sizeof(int32_t) * (size_t)B, "pos"));
    OK(osp_cuda_malloc((void **)&c.d_sl, sizeof(int32_t) * (size_t)B, "seq_lens"));
    OK(osp_cuda_malloc((void **)&c.d_tok, sizeof(int32_t) * (size_t)B, "token_seq"));
    OK(osp_cuda_malloc((void **)&c.d_bt, sizeof(int32_t) * (size_t)nblocks, "bt"));
    OK(osp_cuda_malloc((void **)&c.d_q, sizeof(uint16_t) * (size_t)B * H * D, "q"));
    OK(osp_cuda_malloc((void **)&c.d_out, sizeof(uint16_t) * (size_t)B * H * D, "out"));
    CK(cudaMemcpy(c.d_qsl, qsl, sizeof(int32_t) * (size_t)(B + 1), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c.d_pos, pos, sizeof(int32_t) * (size_t)B, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c.d_sl, sl, sizeof(int32_t) * (size_t)B, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c.d_tok, tok, sizeof(int32_t) * (size_t)B, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c.d_bt, bt, sizeof(int32_t) * (size_t)nblocks, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c.d_q, q, sizeof(uint16_t) * (size_t)B * H * D, cudaMemcpyHostToDevice));
    const size_t wsd = osp_cuda_attention_workspace_bytes(B, H, D, ctx);
    if (wsd) OK(osp_cuda_malloc(&c.ws_dense, wsd, "ws dense"));
    c.tab = (osp_cuda_sparse_table){.d_indptr = x.d_ip, .d_indices = x.d_ind, .d_pages = x.d_pg, .d_flags = x.d_fl,
                                    .d_tmask = x.d_tm, .num_rows = rows, .groups = HKV, .mask_words = 1,
                                    .max_row_tiles = TOPK};
    c.ws_sparse_bytes = osp_cuda_sparse_workspace_bytes(B, H, D, TOPK, BS);
    if (c.ws_sparse_bytes) OK(osp_cuda_malloc(&c.ws_sparse, c.ws_sparse_bytes, "ws sparse"));

    launch_dsa_indexer(&x); /* the table the sparse kernel reads, then the selection's shape */
    CK(cudaDeviceSynchronize());
    int32_t hip[65], hcnt[8], hen[8];
    CK(cudaMemcpy(hip, x.d_ip, sizeof(int32_t) * (size_t)(rows + 1), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hcnt, x.d_cnt, sizeof(int32_t) * (size_t)B, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hen, x.d_en, sizeof(int32_t) * (size_t)B, cudaMemcpyDeviceToHost));
    int kept = 0, ents = 0;
    for (int s = 0; s < B; s++) kept += hcnt[s], ents += hen[s];

    const double us_d = time_us(launch_dense, &c);
    const double us_sc = time_us(launch_dsa_score, &x), us_tk = time_us(launch_dsa_topk, &x);
    setenv("OSPREY_DSA_TOPK", "cluster8", 1); /* the 7-barrier cluster top-k, for comparison */
    const double us_tk8 = time_us(launch_dsa_topk, &x);
    setenv("OSPREY_DSA_TOPK", "cta", 1); /* the one-CTA-a-token top-k, for comparison */
    const double us_tk1 = time_us(launch_dsa_topk, &x);
    unsetenv("OSPREY_DSA_TOPK");
    const double us_tb = time_us(launch_dsa_table, &x), us_ix = time_us(launch_dsa_indexer, &x);
    const double us_sp = time_us(launch_dsa_sparse, &x), us_st = time_us(launch_dsa_step, &x);
    const double key_bytes = (double)B * ctx * (DI + 4); /* codes + scales */
    const double bytes_s = (double)kept * HKV * D * 2.0 * 2.0 + (double)hip[rows] * 16.0;
    const double bytes_d = (double)B * ctx * HKV * D * 2.0 * 2.0;
    printf("dsa     B %d ctx %6d k %d | score %7.1f us (%.1f MB keys: %5.0f GB/s) | top-k %6.1f us (cluster8 %6.1f, 1 CTA a token %6.1f) | table %5.1f us | "
           "indexer %7.1f us | sparse %6.1f us (%d tokens, %.0f pages a token) | indexer + sparse %7.1f us, chained %7.1f us "
           "| dense %8.1f us (%5.0f GB/s) | dense / (indexer + sparse) %5.2fx, dense / chained %5.2fx, dense / sparse %5.2fx\n",
           B, ctx, TOPK, us_sc, key_bytes / 1e6, key_bytes / (us_sc * 1e3), us_tk, us_tk8, us_tk1, us_tb, us_ix, us_sp, kept,
           (double)ents / B, us_ix + us_sp, us_st, us_d, bytes_d / (us_d * 1e3), us_d / (us_ix + us_sp), us_d / us_st,
           us_d / us_sp);
    printf("json {\"kind\": \"dsa\", \"B\": %d, \"ctx\": %d, \"topk\": %d, \"score_us\": %.2f, \"topk_us\": %.2f, "
           "\"topk_cluster8_us\": %.2f, \"topk_1cta_us\": %.2f, \"table_us\": %.2f, \"indexer_us\": %.2f, \"sparse_us\": %.2f, \"step_us\": %.2f, \"dense_us\": %.2f, "
           "\"key_bytes\": %.0f, \"sparse_bytes\": %.0f, \"entries\": %d, \"kept\": %d, \"ratio\": %.3f}\n",
           B, ctx, TOPK, us_sc, us_tk, us_tk8, us_tk1, us_tb, us_ix, us_sp, us_st, us_d, key_bytes, bytes_s, hip[rows], kept,
           us_d / (us_ix + us_sp));
    fflush(stdout);
    osp_cuda_free((void *)x.d_codes), osp_cuda_free((void *)x.d_scales), osp_cuda_free((void *)x.d_qi);
    osp_cuda_free((void *)x.d_w), osp_cuda_free(x.d_scores), osp_cuda_free(x.d_hist), osp_cuda_free(x.d_idx);
    osp_cuda_free(x.d_cnt), osp_cuda_free(x.d_ej), osp_cuda_free(x.d_em), osp_cuda_free(x.d_en);
    osp_cuda_free(x.d_ip), osp_cuda_free(x.d_ind), osp_cuda_free(x.d_pg), osp_cuda_free(x.d_fl), osp_cuda_free(x.d_tm);
    osp_cuda_free(c.d_qsl), osp_cuda_free(c.d_pos), osp_cuda_free(c.d_sl), osp_cuda_free(c.d_tok);
    osp_cuda_free(c.d_bt), osp_cuda_free(c.d_q), osp_cuda_free(c.d_out), osp_cuda_free(c.ws_dense);
    osp_cuda_free(c.ws_sparse), osp_cuda_free(c.k), osp_cuda_free(c.v);
    free(bt), free(q);
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "all";
    if (osp_cuda_device_count() == 0) {
        fprintf(stderr, "sparse_decode_bench: no CUDA device\n");
        return 1;
    }
    char name[128];
    OK(osp_cuda_device_name(name, sizeof name));
    printf("device: %s\n", name);
    const bool all = !strcmp(what, "all");
    /* SPARSE_BENCH_B=1 or 8: that batch only (a profiler run of one shape) */
    const char *eb = getenv("SPARSE_BENCH_B");
    const int only_b = eb ? atoi(eb) : 0;
#define B_ON(b) (only_b == 0 || only_b == (b))
    if (all || !strcmp(what, "pages")) {
        const int Bs[] = {1, 8}, budgets[] = {256, 64};
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++)
                if (B_ON(Bs[i])) run('p', Bs[i], 32768, budgets[j], "pages");
    }
    if (all || !strcmp(what, "tokens")) {
        if (B_ON(1)) run('t', 1, 131072, 2048, "tokens");
        if (B_ON(8)) run('t', 8, 131072, 2048, "tokens");
    }
    if (all || !strcmp(what, "dsa")) {
        if (B_ON(1)) run_dsa(1, 131072);
        if (B_ON(8)) run_dsa(8, 131072);
    }
#undef B_ON
    return 0;
}
