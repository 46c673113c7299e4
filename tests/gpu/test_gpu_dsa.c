/* The DSA lightning indexer on the GPU (src/backend/cuda/dsa_indexer.cu, issue 15) against the CPU
 * reference osp_dsa_select (src/sparse/dsa_indexer.c) and a plain full-score implementation here (every
 * I(t, s) by osp_dsa_score, then a sort under "score descending, position ascending", NaN as -inf).
 *
 * How the scores are compared. The GPU's dots run on the tensor cores (f16 operands, fp32 accumulation in
 * the hardware's order) and its head sum in another order than osp_dsa_score's, so its scores round
 * differently. Two kinds of inputs:
 *   - exact: integer-valued q (bf16), w, E4M3 codes and power-of-two scales, every product and partial
 *     sum an integer times the scale below 2^24: both sides compute the same real number without rounding,
 *     so the scores must be equal bit for bit and the indices identical to the CPU's. Such inputs have
 *     many equal scores (ties decided by position), and the all-equal and few-distinct-keys cases put far
 *     more than the top-k kernel's shared-memory bin (12,288 keys) into one bin (its global-memory path).
 *   - random: real-valued inputs (keys through osp_dsa_key_write: scale amax / 448). The check: (a) every
 *     GPU score within bound(t, s) of the CPU's, bound = eps sum_j |w_j| sum_i |q_ji k_i| + 2^-25 sum_j |w_j|
 *     sum_i |k_i| (eps = 2 (d_I + H_I + 16) 2^-23: the fp32 accumulations of d_I products on each side and
 *     of H_I head terms, the dequantizing and scaling products; the second term: bf16 q values below f16's
 *     normal range lose bits as f16 operands); (b) the GPU's indices are exactly the top-k of the GPU's own
 *     scores (which the API returns) under the total order; (c) where the GPU's and the CPU's sets differ,
 *     the CPU scores of the differing positions lie within 2 max bound of the CPU's k-th score.
 * Always: counts min(p + 1, k), indices ascending and <= p, the row's tail -1; the scores past p untouched
 * (poisoned buffer); the device work table equal, array for array, to osp_sparse_wt_build's from the GPU's
 * indices; batch invariance (a sequence alone gives the same score and index bits as in its batch).
 * Cases: contexts shorter than k, k, k + 1, 1; several sequences of different lengths; permuted block
 * tables; the causal boundary inside a page with valid, larger keys written after it (which must not be
 * selected); block sizes 16, 64 and 7; k 2,048, 5 and 1; H_I 64 / d_I 128 and 16 / 64.
 * End to end: indexer -> device table -> osp_cuda_sparse_attention_decode against osp_dsa_select ->
 * osp_sparse_wt_build -> osp_sparse_attention_cpu (exact inputs, so the selections are the same), within
 * test_gpu_sparse's tolerance. Each case prints its worst score error / bound and the first differing
 * index, if any. The whole group runs three times: with the one-pass bitmap top-k over a cluster of CTAs
 * a token (the default), with the cluster kernel of 7 cluster barriers (OSPREY_DSA_TOPK=cluster8) and with
 * one CTA a token (OSPREY_DSA_TOPK=cta). Before it, test_topk_kernels runs the three top-k kernels on the
 * same scores written here and asserts identical outputs. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_ops.h"
#include "core/dtype.h"
#include "gpu_test_mem.h"
#include "gpu_test_rng.h"
#include "sparse/dsa_indexer.h"
#include "sparse/sparse_attention.h"
#include "sparse/worktable.h"

#define MAX_SEQS 16

/* OSPREY_TEST_SANITIZER_SUBSET=1: small cases only (compute-sanitizer runs) */
static bool g_subset;

enum { KEYS_RANDOM = 0, KEYS_INT = 1, KEYS_EQUAL = 2, KEYS_FEW = 3 };

typedef struct {
    const char *name;
    int H, DI, bs, K, kind;
    int num_seqs;
    int32_t len[MAX_SEQS]; /* tokens written (seq_len) */
    int32_t pos[MAX_SEQS]; /* query position; -1: len - 1 (otherwise < len: later keys exist, causal cut) */
    bool e2e;
} dcase;

typedef struct {
    const dcase *c;
    int T, max_blocks, num_blocks, max_ctx;
    int32_t *bt, *pos, *seq, *sl;
    uint8_t *codes;
    float *scales, *w, *qf;
    uint16_t *q;
    void *dq, *dw, *dcodes, *dscales, *dpos, *dseq, *dbt, *dsl;
} dscene;

static int32_t pages_of(int32_t n, int32_t bs) { return (n + bs - 1) / bs; }

static float int_val(int lo, int hi) { return (float)(lo + rnd_int(hi - lo + 1)); }

static void make_scene(dscene *sc, const dcase *c) {
    memset(sc, 0, sizeof *sc);
    sc->c = c;
    sc->T = c->num_seqs;
    int32_t used = 0;
    for (int s = 0; s < c->num_seqs; s++) {
        const int32_t nb = pages_of(c->len[s], c->bs);
        if (nb > sc->max_blocks) sc->max_blocks = nb;
        used += nb;
        if (c->len[s] > sc->max_ctx) sc->max_ctx = c->len[s];
    }
    sc->max_ctx += 3; /* not a multiple of anything */
    sc->num_blocks = used + 3;
    int32_t *perm = xmalloc(sizeof(int32_t) * (size_t)sc->num_blocks);
    for (int32_t i = 0; i < sc->num_blocks; i++) perm[i] = i;
    for (int32_t i = sc->num_blocks - 1; i > 0; i--) {
        const int32_t j = rnd_int(i + 1), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    sc->bt = xmalloc(sizeof(int32_t) * (size_t)(c->num_seqs * sc->max_blocks));
    for (int64_t i = 0; i < (int64_t)c->num_seqs * sc->max_blocks; i++) sc->bt[i] = -1;
    const size_t slots = (size_t)sc->num_blocks * (size_t)c->bs;
    sc->codes = xmalloc(slots * (size_t)c->DI);
    sc->scales = xmalloc(slots * sizeof(float));
    memset(sc->codes, 0x7F, slots * (size_t)c->DI); /* E4M3 NaN: never written */
    for (size_t i = 0; i < slots; i++) sc->scales[i] = NAN;
    /* KEYS_FEW: 3 key vectors */
    float few[3][256];
    for (int v = 0; v < 3; v++)
        for (int d = 0; d < c->DI; d++) few[v][d] = int_val(-4, 4);
    float *kv = xmalloc(sizeof(float) * (size_t)c->DI);
    int32_t next = 0;
    for (int s = 0; s < c->num_seqs; s++) {
        for (int32_t j = 0; j < pages_of(c->len[s], c->bs); j++) sc->bt[s * sc->max_blocks + j] = perm[next++];
        const int32_t p = c->pos[s] < 0 ? c->len[s] - 1 : c->pos[s];
        for (int32_t x = 0; x < c->len[s]; x++) {
            const int64_t slot = (int64_t)sc->bt[s * sc->max_blocks + x / c->bs] * c->bs + x % c->bs;
            uint8_t *cd = sc->codes + slot * c->DI;
            if (c->kind == KEYS_RANDOM) {
                for (int d = 0; d < c->DI; d++) kv[d] = rnd_unit() * (x > p ? 8.0f : 1.0f); /* after p: large */
                osp_dsa_key_write(sc->codes, sc->scales, slot, kv, c->DI);
                continue;
            }
            const int which = c->kind == KEYS_FEW ? rnd_int(3) : 0;
            for (int d = 0; d < c->DI; d++) {
                float v = c->kind == KEYS_INT ? int_val(-4, 4) : c->kind == KEYS_EQUAL ? (float)((d % 5) - 1) : few[which][d];
                if (x > p) v = 8.0f; /* after the query: would win every comparison */
                cd[d] = osp_fp32_to_e4m3(v);
            }
            sc->scales[slot] = c->kind == KEYS_INT ? ldexpf(1.0f, rnd_int(3) - 1) : 1.0f;
        }
    }
    free(kv);
    free(perm);
    sc->pos = xmalloc(sizeof(int32_t) * (size_t)sc->T);
    sc->seq = xmalloc(sizeof(int32_t) * (size_t)sc->T);
    sc->sl = xmalloc(sizeof(int32_t) * (size_t)sc->T);
    for (int s = 0; s < sc->T; s++)
        sc->pos[s] = c->pos[s] < 0 ? c->len[s] - 1 : c->pos[s], sc->seq[s] = s, sc->sl[s] = c->len[s];
    const size_t nq = (size_t)sc->T * (size_t)c->H * (size_t)c->DI;
    sc->q = xmalloc(nq * 2), sc->qf = xmalloc(nq * sizeof(float));
    for (size_t i = 0; i < nq; i++) {
        const float v = c->kind == KEYS_RANDOM ? rnd_unit() : c->kind == KEYS_EQUAL ? 1.0f : int_val(-3, 3);
        sc->q[i] = osp_fp32_to_bf16(v);
        sc->qf[i] = osp_bf16_to_fp32(sc->q[i]);
    }
    sc->w = xmalloc(sizeof(float) * (size_t)sc->T * (size_t)c->H);
    for (int i = 0; i < sc->T * c->H; i++) sc->w[i] = c->kind == KEYS_RANDOM ? rnd_unit() : int_val(-2, 3);
    sc->dq = dev_put(sc->q, nq * 2);
    sc->dw = dev_put(sc->w, sizeof(float) * (size_t)sc->T * (size_t)c->H);
    sc->dcodes = dev_put(sc->codes, slots * (size_t)c->DI);
    sc->dscales = dev_put(sc->scales, slots * sizeof(float));
    sc->dpos = dev_put(sc->pos, sizeof(int32_t) * (size_t)sc->T);
    sc->dseq = dev_put(sc->seq, sizeof(int32_t) * (size_t)sc->T);
    sc->dsl = dev_put(sc->sl, sizeof(int32_t) * (size_t)sc->T);
    sc->dbt = dev_put(sc->bt, sizeof(int32_t) * (size_t)(c->num_seqs * sc->max_blocks));
}

static void free_scene(dscene *sc) {
    free(sc->bt), free(sc->pos), free(sc->seq), free(sc->sl), free(sc->codes), free(sc->scales), free(sc->w);
    free(sc->qf), free(sc->q);
    osp_cuda_free(sc->dq), osp_cuda_free(sc->dw), osp_cuda_free(sc->dcodes), osp_cuda_free(sc->dscales);
    osp_cuda_free(sc->dpos), osp_cuda_free(sc->dseq), osp_cuda_free(sc->dsl), osp_cuda_free(sc->dbt);
}

/* the GPU's outputs for tokens [t0, t0 + nt) of the scene */
typedef struct {
    int nt;
    float *scores;  /* [nt, max_ctx] */
    int32_t *idx, *count, *ent_j, *ent_n;
    uint32_t *ent_mask;
    /* the device work table for `groups` rows a token */
    int groups;
    int32_t *indptr, *indices, *pages, *flags;
    uint32_t *tmask;
    void *d_indptr, *d_indices, *d_pages, *d_flags, *d_tmask; /* kept for the end-to-end run */
} gout;

static void run_gpu(const dscene *sc, int t0, int nt, int groups, gout *o) {
    const dcase *c = sc->c;
    const int K = c->K, W = (c->bs + 31) / 32, mc = sc->max_ctx;
    memset(o, 0, sizeof *o);
    o->nt = nt, o->groups = groups;
    void *dsc = dev_alloc_fill(sizeof(float) * (size_t)nt * (size_t)mc, 0xFF);
    void *dh = dev_alloc_fill(sizeof(uint32_t) * (size_t)nt * 4096, 0xFF); /* zeroed by the launcher */
    void *didx = dev_alloc_fill(sizeof(int32_t) * (size_t)nt * K, 0x5A), *dcnt = dev_alloc_fill(sizeof(int32_t) * (size_t)nt, 0x5A);
    void *dej = dev_alloc_fill(sizeof(int32_t) * (size_t)nt * K, 0x5A), *den = dev_alloc_fill(sizeof(int32_t) * (size_t)nt, 0x5A);
    void *dem = dev_alloc_fill(sizeof(uint32_t) * (size_t)nt * K * W, 0x5A);
    const size_t cap = (size_t)nt * (size_t)groups * (size_t)K;
    o->d_indptr = dev_alloc_fill(sizeof(int32_t) * (size_t)(nt * groups + 1), 0x5A);
    o->d_indices = dev_alloc_fill(sizeof(int32_t) * cap, 0x5A), o->d_pages = dev_alloc_fill(sizeof(int32_t) * cap, 0x5A);
    o->d_flags = dev_alloc_fill(sizeof(int32_t) * cap, 0x5A), o->d_tmask = dev_alloc_fill(sizeof(uint32_t) * cap * W, 0x5A);
    const uint16_t *q = (const uint16_t *)sc->dq + (size_t)t0 * (size_t)c->H * (size_t)c->DI;
    const float *w = (const float *)sc->dw + (size_t)t0 * (size_t)c->H;
    const int32_t *pos = (const int32_t *)sc->dpos + t0, *seq = (const int32_t *)sc->dseq + t0;
    osp_status rc = osp_cuda_dsa_score(q, w, sc->dcodes, sc->dscales, pos, seq, sc->dbt, sc->max_blocks, c->bs, nt, c->H,
                                       c->DI, mc, dsc, dh, NULL);
    if (rc == OSP_OK) rc = osp_cuda_dsa_topk(dsc, dh, pos, nt, mc, K, c->bs, didx, dcnt, dej, dem, den, NULL);
    if (rc == OSP_OK)
        rc = osp_cuda_dsa_table(dej, dem, den, K, seq, sc->dbt, sc->max_blocks, c->bs, nt, groups, o->d_indptr,
                                o->d_indices, o->d_pages, o->d_flags, o->d_tmask, NULL);
    if (rc != OSP_OK) printf("  dsa: %s\n", osp_last_error());
    assert_int_equal(rc, OSP_OK);
    o->scores = xmalloc(sizeof(float) * (size_t)nt * (size_t)mc);
    o->idx = xmalloc(sizeof(int32_t) * (size_t)nt * K), o->count = xmalloc(sizeof(int32_t) * (size_t)nt);
    o->ent_j = xmalloc(sizeof(int32_t) * (size_t)nt * K), o->ent_n = xmalloc(sizeof(int32_t) * (size_t)nt);
    o->ent_mask = xmalloc(sizeof(uint32_t) * (size_t)nt * K * W);
    dev_get(o->scores, dsc, sizeof(float) * (size_t)nt * (size_t)mc);
    dev_get(o->idx, didx, sizeof(int32_t) * (size_t)nt * K);
    dev_get(o->count, dcnt, sizeof(int32_t) * (size_t)nt);
    dev_get(o->ent_j, dej, sizeof(int32_t) * (size_t)nt * K);
    dev_get(o->ent_n, den, sizeof(int32_t) * (size_t)nt);
    dev_get(o->ent_mask, dem, sizeof(uint32_t) * (size_t)nt * K * W);
    o->indptr = xmalloc(sizeof(int32_t) * (size_t)(nt * groups + 1));
    dev_get(o->indptr, o->d_indptr, sizeof(int32_t) * (size_t)(nt * groups + 1));
    const int32_t nnz = o->indptr[nt * groups];
    assert_true(nnz >= 0 && (size_t)nnz <= cap);
    o->indices = xmalloc(sizeof(int32_t) * (size_t)nnz + 4), o->pages = xmalloc(sizeof(int32_t) * (size_t)nnz + 4);
    o->flags = xmalloc(sizeof(int32_t) * (size_t)nnz + 4), o->tmask = xmalloc(sizeof(uint32_t) * (size_t)nnz * W + 4);
    dev_get(o->indices, o->d_indices, sizeof(int32_t) * (size_t)nnz);
    dev_get(o->pages, o->d_pages, sizeof(int32_t) * (size_t)nnz);
    dev_get(o->flags, o->d_flags, sizeof(int32_t) * (size_t)nnz);
    dev_get(o->tmask, o->d_tmask, sizeof(uint32_t) * (size_t)nnz * W);
    osp_cuda_free(dsc), osp_cuda_free(dh), osp_cuda_free(didx), osp_cuda_free(dcnt), osp_cuda_free(dej);
    osp_cuda_free(den), osp_cuda_free(dem);
}

static void free_gout(gout *o) {
    free(o->scores), free(o->idx), free(o->count), free(o->ent_j), free(o->ent_n), free(o->ent_mask);
    free(o->indptr), free(o->indices), free(o->pages), free(o->flags), free(o->tmask);
    osp_cuda_free(o->d_indptr), osp_cuda_free(o->d_indices), osp_cuda_free(o->d_pages), osp_cuda_free(o->d_flags);
    osp_cuda_free(o->d_tmask);
}

/* the total order: score descending (NaN as -inf), then position ascending */
static const float *g_sort_scores;
static int cmp_order(const void *pa, const void *pb) {
    const int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    float x = g_sort_scores[a], y = g_sort_scores[b];
    if (isnan(x)) x = -INFINITY;
    if (isnan(y)) y = -INFINITY;
    if (x != y) return x > y ? -1 : 1;
    return (a > b) - (a < b);
}
static int cmp_i32(const void *pa, const void *pb) {
    const int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return (a > b) - (a < b);
}

/* the exact top-k of scores [n] under the order, ascending, into out; returns the count */
static int32_t full_topk(const float *scores, int32_t n, int32_t K, int32_t *out, int32_t *tmp) {
    for (int32_t i = 0; i < n; i++) tmp[i] = i;
    g_sort_scores = scores;
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_order);
    const int32_t m = n < K ? n : K;
    memcpy(out, tmp, sizeof(int32_t) * (size_t)m);
    qsort(out, (size_t)m, sizeof *out, cmp_i32);
    return m;
}

/* CPU: every score of token t (osp_dsa_score on the dequantized key) and its bound */
static void cpu_scores(const dscene *sc, int t, float *cs, double *bound) {
    const dcase *c = sc->c;
    const int D = c->DI, H = c->H;
    const double eps = 2.0 * (D + H + 16) * ldexp(1.0, -23);
    const float *q = sc->qf + (size_t)t * (size_t)H * (size_t)D, *w = sc->w + (size_t)t * (size_t)H;
#pragma omp parallel for schedule(static)
    for (int32_t x = 0; x <= sc->pos[t]; x++) {
        float row[256];
        const int64_t slot = (int64_t)sc->bt[sc->seq[t] * sc->max_blocks + x / c->bs] * c->bs + x % c->bs;
        for (int d = 0; d < D; d++) row[d] = osp_e4m3_to_fp32(sc->codes[slot * D + d]) * sc->scales[slot];
        cs[x] = osp_dsa_score(q, w, row, H, D);
        double b = 0.0, b2 = 0.0;
        for (int h = 0; h < H; h++) {
            double a = 0.0, k1 = 0.0;
            for (int d = 0; d < D; d++) a += fabs((double)q[h * D + d] * row[d]), k1 += fabs((double)row[d]);
            b += fabs((double)w[h]) * a, b2 += fabs((double)w[h]) * k1;
        }
        bound[x] = eps * b + ldexp(b2, -25);
    }
}

/* the checks of one batch (tokens [t0, t0 + nt) run together): returns the number of failing tokens */
static int check_batch(const dscene *sc, int t0, const gout *o) {
    const dcase *c = sc->c;
    const int K = c->K, mc = sc->max_ctx;
    const bool exact = c->kind != KEYS_RANDOM;
    int bad = 0;
    float *cs = xmalloc(sizeof(float) * (size_t)mc);
    double *bound = xmalloc(sizeof(double) * (size_t)mc);
    int32_t *want = xmalloc(sizeof(int32_t) * (size_t)K), *tmp = xmalloc(sizeof(int32_t) * (size_t)mc);
    int32_t *cidx_all = xmalloc(sizeof(int32_t) * (size_t)sc->T * (size_t)K);
    float *csel = xmalloc(sizeof(float) * (size_t)sc->T * (size_t)K);
    osp_dsa_pair *ws = xmalloc(sizeof(osp_dsa_pair) * (size_t)osp_dsa_workspace_pairs(K, c->bs));
    int32_t qsl[MAX_SEQS + 1];
    for (int i = 0; i <= sc->T; i++) qsl[i] = i;
    const osp_dsa_args a = {.q = sc->qf, .w = sc->w, .k_pages = sc->codes, .k_scales = sc->scales, .num_tokens = sc->T,
                            .num_seqs = sc->T, .query_start_loc = qsl, .positions = sc->pos, .block_table = sc->bt,
                            .max_blocks_per_seq = sc->max_blocks, .block_size = c->bs, .n_heads = c->H,
                            .head_dim = c->DI, .top_k = K};
    for (int i = 0; i < o->nt; i++) {
        const int t = t0 + i, p = sc->pos[t], n = p + 1, m = n < K ? n : K;
        const float *gs = o->scores + (size_t)i * (size_t)mc;
        const int32_t *gi = o->idx + (size_t)i * (size_t)K;
        int32_t ccount[MAX_SEQS];
        assert_int_equal(osp_dsa_select(&a, t, t + 1, ws, cidx_all, csel, ccount), OSP_OK);
        const int32_t *cidx = cidx_all + (size_t)t * (size_t)K;
        cpu_scores(sc, t, cs, bound);
        bool ok = o->count[i] == m && ccount[t] == m;
        /* shape: ascending, in range, tail -1 */
        for (int j = 0; j < K; j++) {
            if (j < m) ok = ok && gi[j] >= 0 && gi[j] <= p && (j == 0 || gi[j] > gi[j - 1]);
            else ok = ok && gi[j] == -1;
        }
        /* the scores past p untouched (poison), the scores within the bound (exact: equal) */
        double worst = 0.0;
        int32_t worst_x = -1, untouched_bad = 0;
        for (int32_t x = n; x < mc; x++) {
            uint32_t u;
            memcpy(&u, gs + x, 4);
            untouched_bad += u != 0xFFFFFFFFu;
        }
        for (int32_t x = 0; x < n; x++) {
            const double err = fabs((double)gs[x] - (double)cs[x]);
            const double r = exact ? (gs[x] == cs[x] ? 0.0 : INFINITY) : err / (bound[x] > 0 ? bound[x] : 1e-30);
            if (!(r <= worst)) worst = r, worst_x = x;
        }
        if (isnan(worst) || worst > 1.0 || untouched_bad) ok = false;
        /* the GPU's set = the exact top-k of its own scores */
        const int32_t mg = full_topk(gs, n, K, want, tmp);
        int first_own = -1;
        for (int j = 0; j < mg && first_own < 0; j++)
            if (gi[j] != want[j]) first_own = j;
        if (mg != m || first_own >= 0) ok = false;
        /* against the CPU's indices: equal (exact), or differing only near the k-th score */
        int first_cpu = -1, ndiff = 0;
        for (int j = 0; j < m; j++)
            if (gi[j] != cidx[j] && first_cpu < 0) first_cpu = j;
        if (first_cpu >= 0) {
            if (exact) ok = false;
            else {
                double maxb = 0.0, kth = INFINITY;
                for (int32_t x = 0; x < n; x++) maxb = bound[x] > maxb ? bound[x] : maxb;
                for (int j = 0; j < m; j++) kth = cs[cidx[j]] < kth ? cs[cidx[j]] : kth;
                /* positions in one set only */
                int ia = 0, ib = 0;
                while (ia < m || ib < m) {
                    int32_t x;
                    if (ib >= m || (ia < m && gi[ia] < cidx[ib])) x = gi[ia++];
                    else if (ia >= m || cidx[ib] < gi[ia]) x = cidx[ib++];
                    else {
                        ia++, ib++;
                        continue;
                    }
                    ndiff++;
                    if (!(fabs((double)cs[x] - kth) <= 2.0 * maxb)) ok = false;
                }
            }
        }
        printf("  %-22s t %2d p %6d: count %d, score err/bound %.3g at %d, own top-k %s, cpu %s (%d differ)\n",
               c->name, t, p, o->count[i], worst, worst_x, first_own < 0 ? "ok" : "DIFFERS",
               first_cpu < 0 ? "same" : exact ? "DIFFERS" : "near k-th", ndiff);
        if (!ok) {
            bad++;
            printf("    FAIL: count gpu %d cpu %d want %d; untouched scores overwritten %d", o->count[i], ccount[t], m,
                   untouched_bad);
            if (worst_x >= 0) printf("; worst score at %d: gpu %.9g cpu %.9g bound %.3g", worst_x, (double)gs[worst_x], (double)cs[worst_x], bound[worst_x]);
            if (first_own >= 0) printf("; own top-k [%d]: gpu %d want %d", first_own, gi[first_own], want[first_own]);
            if (first_cpu >= 0) printf("; cpu [%d]: gpu %d cpu %d", first_cpu, gi[first_cpu], cidx[first_cpu]);
            printf("\n");
        }
    }
    free(cs), free(bound), free(want), free(tmp), free(cidx_all), free(csel), free(ws);
    return bad;
}

/* the device table = osp_sparse_wt_build's from the GPU's indices as each row's candidates */
static void check_table(const dscene *sc, int t0, const gout *o, osp_sparse_wt *wt, int n_head, int n_kv) {
    const dcase *c = sc->c;
    const int K = c->K, G = o->groups, nt = o->nt, rows = nt * G, W = (c->bs + 31) / 32;
    int32_t *cip = xmalloc(sizeof(int32_t) * (size_t)(rows + 1)), *cand = xmalloc(sizeof(int32_t) * (size_t)rows * K + 1);
    int64_t m = 0;
    cip[0] = 0;
    for (int r = 0; r < rows; r++) {
        const int i = r / G;
        for (int j = 0; j < o->count[i]; j++) cand[m++] = o->idx[(size_t)i * K + j];
        cip[r + 1] = (int32_t)m;
    }
    int32_t qsl[MAX_SEQS + 1];
    for (int i = 0; i <= nt; i++) qsl[i] = i;
    const osp_sparse_layout L = {.num_tokens = nt, .positions = sc->pos + t0, .num_seqs = nt, .query_start_loc = qsl,
                                 .seq_lens = sc->sl + t0, .block_table = sc->bt + (size_t)t0 * (size_t)sc->max_blocks,
                                 .max_blocks_per_seq = sc->max_blocks, .block_size = c->bs, .n_head = n_head,
                                 .n_head_kv = n_kv, .share = OSP_SPARSE_PER_KV_HEAD, .q_tile = 1};
    const osp_sparse_cands C = {cip, cand};
    assert_int_equal(osp_sparse_wt_build(wt, &L, &C, NULL, 2 * 128), OSP_OK);
    const int32_t nnz = wt->indptr[rows];
    bool same = !memcmp(o->indptr, wt->indptr, sizeof(int32_t) * (size_t)(rows + 1));
    same = same && !memcmp(o->indices, wt->indices, sizeof(int32_t) * (size_t)nnz) &&
           !memcmp(o->pages, wt->pages, sizeof(int32_t) * (size_t)nnz) &&
           !memcmp(o->flags, wt->flags, sizeof(int32_t) * (size_t)nnz) &&
           !memcmp(o->tmask, wt->tmask, sizeof(uint32_t) * (size_t)nnz * W);
    if (!same) {
        for (int r = 0; r <= rows; r++)
            if (o->indptr[r] != wt->indptr[r]) {
                printf("    table: indptr[%d] gpu %d cpu %d\n", r, o->indptr[r], wt->indptr[r]);
                break;
            }
        for (int32_t e = 0; e < nnz; e++)
            if (o->indices[e] != wt->indices[e] || o->pages[e] != wt->pages[e] || o->flags[e] != wt->flags[e] ||
                o->tmask[(size_t)e * W] != wt->tmask[(size_t)e * W]) {
                printf("    table: entry %d gpu (j %d page %d flags %d tmask %08x) cpu (j %d page %d flags %d tmask %08x)\n", e,
                       o->indices[e], o->pages[e], o->flags[e], o->tmask[(size_t)e * W], wt->indices[e], wt->pages[e],
                       wt->flags[e], wt->tmask[(size_t)e * W]);
                break;
            }
    }
    printf("  %-22s table of %d rows, %d entries: %s\n", c->name, rows, nnz, same ? "= osp_sparse_wt_build" : "DIFFERS");
    assert_true(same);
    free(cip), free(cand);
}

static void run_case(const dcase *c, uint64_t seed) {
    g_rng = seed;
    dscene sc;
    make_scene(&sc, c);
    gout o;
    run_gpu(&sc, 0, sc.T, 8, &o);
    const int bad = check_batch(&sc, 0, &o);
    osp_sparse_wt wt = {0};
    check_table(&sc, 0, &o, &wt, 32, 8);
    osp_sparse_wt_free(&wt);
    /* batch invariance: each sequence alone */
    int inv_bad = 0;
    for (int t = 0; t < sc.T && sc.T > 1; t++) {
        gout a;
        run_gpu(&sc, t, 1, 1, &a);
        const size_t mc = (size_t)sc.max_ctx;
        const int n = sc.pos[t] + 1;
        const bool same = !memcmp(a.scores, o.scores + (size_t)t * mc, sizeof(float) * (size_t)n) &&
                          !memcmp(a.idx, o.idx + (size_t)t * (size_t)c->K, sizeof(int32_t) * (size_t)c->K);
        if (!same && inv_bad++ < 3) printf("    batch invariance: token %d differs alone\n", t);
        free_gout(&a);
    }
    if (sc.T > 1) printf("  %-22s batch invariance: %s\n", c->name, inv_bad ? "DIFFERS" : "alone = in the batch");
    free_gout(&o);
    free_scene(&sc);
    assert_int_equal(bad, 0);
    assert_int_equal(inv_bad, 0);
}

static void test_random(void **state) {
    (void)state;
    const dcase c = {.name = "random 64x128 bs16", .H = 64, .DI = 128, .bs = 16, .K = 2048, .kind = KEYS_RANDOM,
                     .num_seqs = 8, .len = {1, 100, 2048, 2049, 5000, 20000, 7, 4100},
                     .pos = {-1, -1, -1, -1, 4990, -1, -1, 4097}};
    if (!g_subset) run_case(&c, 0xD5A1u);
    const dcase c2 = {.name = "random 16x64 bs7 k5", .H = 16, .DI = 64, .bs = 7, .K = 5, .kind = KEYS_RANDOM,
                      .num_seqs = 4, .len = {5, 6, 300, 1000}, .pos = {-1, -1, 250, -1}};
    run_case(&c2, 0xD5A2u);
}

static void test_exact_ties(void **state) {
    (void)state;
    const dcase c = {.name = "int 64x128 bs16", .H = 64, .DI = 128, .bs = 16, .K = 2048, .kind = KEYS_INT,
                     .num_seqs = 8, .len = {1, 100, 2048, 2049, 5000, 20000, 7, 4100},
                     .pos = {-1, -1, -1, -1, 4990, -1, -1, 4097}};
    if (!g_subset) run_case(&c, 0xD5B1u);
    const dcase c2 = {.name = "int 32x128 bs64 k1", .H = 32, .DI = 128, .bs = 64, .K = 1, .kind = KEYS_INT,
                      .num_seqs = 3, .len = {1, 65, 3000}, .pos = {-1, 63, -1}};
    run_case(&c2, 0xD5B2u);
    if (g_subset) return;
    const dcase c3 = {.name = "all equal", .H = 64, .DI = 128, .bs = 16, .K = 2048, .kind = KEYS_EQUAL, .num_seqs = 3,
                      .len = {3000, 2049, 40000}, .pos = {2990, -1, -1}};
    run_case(&c3, 0xD5B3u);
    const dcase c4 = {.name = "3 distinct keys", .H = 64, .DI = 128, .bs = 16, .K = 2048, .kind = KEYS_FEW,
                      .num_seqs = 2, .len = {45000, 5000}, .pos = {-1, 4000}};
    run_case(&c4, 0xD5B4u);
}

/* indexer -> device table -> sparse attention against osp_dsa_select -> osp_sparse_wt_build ->
 * osp_sparse_attention_cpu: 32 query heads, 8 KV heads, D 128, f16 pages */
static void test_end_to_end(void **state) {
    (void)state;
    if (g_subset) return;
    const dcase c = {.name = "e2e int", .H = 64, .DI = 128, .bs = 16, .K = 2048, .kind = KEYS_INT, .num_seqs = 4,
                     .len = {3000, 100, 9000, 2049}, .pos = {-1, -1, 8000, -1}};
    g_rng = 0xD5C1u;
    dscene sc;
    make_scene(&sc, &c);
    const int NH = 32, NKV = 8, D = 128;
    gout o;
    run_gpu(&sc, 0, sc.T, NKV, &o);
    assert_int_equal(check_batch(&sc, 0, &o), 0);
    /* the CPU's selection and table */
    int32_t qsl[MAX_SEQS + 1];
    for (int i = 0; i <= sc.T; i++) qsl[i] = i;
    const osp_dsa_args a = {.q = sc.qf, .w = sc.w, .k_pages = sc.codes, .k_scales = sc.scales, .num_tokens = sc.T,
                            .num_seqs = sc.T, .query_start_loc = qsl, .positions = sc.pos, .block_table = sc.bt,
                            .max_blocks_per_seq = sc.max_blocks, .block_size = c.bs, .n_heads = c.H, .head_dim = c.DI,
                            .top_k = c.K};
    int32_t *cidx = xmalloc(sizeof(int32_t) * (size_t)sc.T * c.K), cnt[MAX_SEQS];
    osp_dsa_pair *ws = xmalloc(sizeof(osp_dsa_pair) * (size_t)osp_dsa_workspace_pairs(c.K, c.bs));
    assert_int_equal(osp_dsa_select(&a, 0, sc.T, ws, cidx, NULL, cnt), OSP_OK);
    const int rows = sc.T * NKV;
    int32_t *cip = xmalloc(sizeof(int32_t) * (size_t)(rows + 1)), *cand = xmalloc(sizeof(int32_t) * (size_t)rows * c.K);
    int64_t m = 0;
    cip[0] = 0;
    for (int r = 0; r < rows; r++) {
        for (int j = 0; j < cnt[r / NKV]; j++) cand[m++] = cidx[(size_t)(r / NKV) * c.K + j];
        cip[r + 1] = (int32_t)m;
    }
    const osp_sparse_layout L = {.num_tokens = sc.T, .positions = sc.pos, .num_seqs = sc.T, .query_start_loc = qsl,
                                 .seq_lens = sc.sl, .block_table = sc.bt, .max_blocks_per_seq = sc.max_blocks,
                                 .block_size = c.bs, .n_head = NH, .n_head_kv = NKV, .share = OSP_SPARSE_PER_KV_HEAD,
                                 .q_tile = 1};
    const osp_sparse_cands C = {cip, cand};
    osp_sparse_wt wt = {0};
    assert_int_equal(osp_sparse_wt_build(&wt, &L, &C, NULL, 2 * D), OSP_OK);
    /* KV pages and attention queries */
    const size_t slots = (size_t)sc.num_blocks * (size_t)c.bs, rowkv = (size_t)NKV * D;
    uint16_t *k = xmalloc(slots * rowkv * 2), *v = xmalloc(slots * rowkv * 2);
    float vmax = 0.0f;
    for (size_t i = 0; i < slots * rowkv; i++) {
        k[i] = osp_fp32_to_fp16(rnd_unit());
        v[i] = osp_fp32_to_fp16(2.0f * rnd_unit());
        const float av = fabsf(osp_fp16_to_fp32(v[i]));
        vmax = av > vmax ? av : vmax;
    }
    const size_t nq = (size_t)sc.T * NH * D;
    uint16_t *q = xmalloc(nq * 2);
    float *qf = xmalloc(nq * sizeof(float)), *ref = xmalloc(nq * sizeof(float));
    for (size_t i = 0; i < nq; i++) q[i] = osp_fp32_to_bf16(rnd_unit() * 2.0f), qf[i] = osp_bf16_to_fp32(q[i]);
    const osp_cpu_kv_pages kv = {.k_type = OSP_DTYPE_F16, .v_type = OSP_DTYPE_F16, .k = k, .v = v};
    const osp_sparse_attn_args sa = {.q = qf, .out = ref, .kv = &kv, .L = &L, .wt = &wt, .mask = NULL, .head_dim = D,
                                     .scale = 1.0f / sqrtf((float)D), .table_masks = true};
    assert_int_equal(osp_sparse_attention_check(&sa), OSP_OK);
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t i = 0; i < (int64_t)sc.T * NH; i++) osp_sparse_attention_cpu(&sa, i, i + 1);
    void *dk = dev_put(k, slots * rowkv * 2), *dv = dev_put(v, slots * rowkv * 2), *dq = dev_put(q, nq * 2);
    void *dout = dev_alloc_fill(nq * 2, 0xFF);
    const osp_cuda_sparse_table tab = {.d_indptr = o.d_indptr, .d_indices = o.d_indices, .d_pages = o.d_pages,
                                       .d_flags = o.d_flags, .d_tmask = o.d_tmask, .num_rows = rows, .groups = NKV,
                                       .mask_words = (c.bs + 31) / 32, .max_row_tiles = c.K};
    const size_t wsb = osp_cuda_sparse_workspace_bytes(sc.T, NH, D, c.K, c.bs);
    void *dws = wsb ? dev_alloc_fill(wsb, 0xAB) : NULL;
    const osp_status rc = osp_cuda_sparse_attention_decode(&tab, dq, dk, dv, OSP_KV_PAGE_F16, dout, sc.T, sc.dpos, sc.dseq,
                                                           sc.dsl, sc.dbt, sc.max_blocks, c.bs, NH, NKV, D,
                                                           1.0f / sqrtf((float)D), NULL, dws, wsb, NULL);
    if (rc != OSP_OK) printf("  sparse decode: %s\n", osp_last_error());
    assert_int_equal(rc, OSP_OK);
    uint16_t *got = xmalloc(nq * 2);
    dev_get(got, dout, nq * 2);
    float worst = 0.0f;
    int64_t bad = 0, worst_i = 0;
    for (size_t i = 0; i < nq; i++) {
        const float r = ref[i], g = osp_bf16_to_fp32(got[i]);
        const float tol = ldexpf(fabsf(r), -8) + ldexpf(vmax, -10), err = fabsf(g - r);
        if (!(err <= tol)) {
            if (bad++ < 6)
                printf("    e2e: t %zu head %zu dim %zu: gpu %.6g cpu %.6g (tol %.3g)\n", i / (NH * D), (i / D) % NH, i % D,
                       (double)g, (double)r, (double)tol);
        } else if (err / tol > worst) worst = err / tol, worst_i = (int64_t)i;
    }
    printf("  e2e: indexer -> table -> sparse attention vs CPU select -> wt_build -> attention: %lld bad, worst err/tol "
           "%.3f at %lld (%d entries)\n",
           (long long)bad, (double)worst, (long long)worst_i, wt.indptr[rows]);
    assert_int_equal(bad, 0);
    free(got), free(k), free(v), free(q), free(qf), free(ref), free(cip), free(cand), free(cidx), free(ws);
    osp_sparse_wt_free(&wt);
    osp_cuda_free(dk), osp_cuda_free(dv), osp_cuda_free(dq), osp_cuda_free(dout), osp_cuda_free(dws);
    free_gout(&o);
    free_scene(&sc);
}

static void test_arguments(void **state) {
    (void)state;
    void *d = dev_alloc_fill(1 << 16, 0);
    /* unsupported shapes are refused before any launch */
    assert_int_equal(osp_cuda_dsa_score(d, d, d, d, d, d, d, 1, 16, 1, 48, 128, 16, d, d, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_dsa_score(d, d, d, d, d, d, d, 1, 16, 1, 64, 96, 16, d, d, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_dsa_score(NULL, d, d, d, d, d, d, 1, 16, 1, 64, 128, 16, d, d, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_dsa_topk(d, d, d, 1, 16, 0, 16, d, d, d, d, d, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_dsa_topk(d, d, d, 1, 16, 4, 300, d, d, d, d, d, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_dsa_table(d, d, d, 4, d, d, 1, 16, 1, 0, d, d, d, d, d, NULL), OSP_ERR_INVALID_ARG);
    /* T = 0: nothing to do */
    assert_int_equal(osp_cuda_dsa_score(d, d, d, d, d, d, d, 1, 16, 0, 64, 128, 16, d, d, NULL), OSP_OK);
    osp_cuda_free(d);
}

/* ---- the top-k kernels against each other on scores written here (no scoring kernel): the one-pass
 * bitmap kernel (the default), the 7-barrier cluster kernel (OSPREY_DSA_TOPK=cluster8) and the one-CTA
 * kernel (=cta) must give the same bits in every output (idx, count, ent_j, ent_mask, ent_n; the buffers
 * poisoned alike), and idx must be the exact top-k under the total order (full_topk) and the entries its
 * pages. The scores exercise each path of the bitmap kernel: 128k random (ties from 24-bit values), a k-th
 * bin crowded with 10,000 keys across every slice (the gathered select), one with ~18,000 (> 12,288: the
 * cluster kernel's select inside the bitmap kernel), 3,000 keys equal to the k-th (the partial keep of
 * equal keys, split between slices), NaN / +-0 / +-inf / subnormals, all equal, n <= k, k 1 and 5, block
 * sizes 7, 16, 48, 64 and 256, and contexts of 1M (the bitmap at 4,096 words a slice) and 2.2M (over the
 * bitmap's limit: the host launches the cluster kernel). */
enum { TS_RANDOM = 0, TS_CROWDED = 1, TS_OVERFULL = 2, TS_TIES = 3, TS_SPECIAL = 4, TS_EQUAL = 5 };

typedef struct {
    const char *name;
    int bs, K, kind, T;
    int32_t max_ctx;
    int32_t pos[MAX_SEQS];
} tkcase;

/* dsa_indexer.cu's order key: NaN as -inf, -0 as +0 */
static uint32_t host_order_key(float f) {
    if (isnan(f)) f = -INFINITY;
    if (f == 0.0f) f = 0.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static float special_score(void) {
    const int r = rnd_int(100);
    if (r < 20) return NAN;
    if (r < 35) return -0.0f;
    if (r < 50) return 0.0f;
    if (r < 52) return INFINITY;
    if (r < 62) return -INFINITY;
    if (r < 67) return ldexpf(1.0f + (float)rnd_int(8), -140); /* subnormal */
    return rnd_unit();
}

static void fill_topk_scores(const tkcase *c, float *sc, int32_t n) {
    for (int32_t x = 0; x < n; x++) {
        switch (c->kind) {
        case TS_SPECIAL: sc[x] = special_score(); break;
        case TS_EQUAL: sc[x] = 0.25f; break;
        case TS_RANDOM: sc[x] = rnd_unit(); break;
        default: sc[x] = rnd_unit() * 0.5f - 0.5f; break; /* below the planted keys */
        }
    }
    if (c->kind == TS_CROWDED || c->kind == TS_OVERFULL || c->kind == TS_TIES) {
        /* 1,500 keys in [2, 4) above the k-th's bin; then the bin of [1, 1.125) crowded, or 3,000 keys of 1.5 */
        for (int i = 0; i < 1500; i++) sc[rnd_int(n)] = 2.0f + 2.0f * (float)(rnd64() >> 41) / 8388608.0f;
        const int m = c->kind == TS_CROWDED ? 10000 : c->kind == TS_OVERFULL ? 20000 : 3000;
        for (int i = 0; i < m; i++) {
            int32_t x = rnd_int(n);
            while (sc[x] >= 1.0f) x = rnd_int(n); /* keep the planted keys above */
            sc[x] = c->kind == TS_TIES ? 1.5f : 1.0f + 0.125f * (float)(rnd64() >> 41) / 8388608.0f;
        }
    }
}

typedef struct {
    int32_t *idx, *count, *ent_j, *ent_n;
    uint32_t *ent_mask;
} tkout;

static void run_topk_variant(const char *variant, const tkcase *c, void *dsc, void *dh, void *dpos, tkout *o) {
    const int K = c->K, T = c->T, W = (c->bs + 31) / 32;
    if (variant) setenv("OSPREY_DSA_TOPK", variant, 1);
    else unsetenv("OSPREY_DSA_TOPK");
    void *didx = dev_alloc_fill(sizeof(int32_t) * (size_t)T * K, 0x5A), *dcnt = dev_alloc_fill(sizeof(int32_t) * (size_t)T, 0x5A);
    void *dej = dev_alloc_fill(sizeof(int32_t) * (size_t)T * K, 0x5A), *den = dev_alloc_fill(sizeof(int32_t) * (size_t)T, 0x5A);
    void *dem = dev_alloc_fill(sizeof(uint32_t) * (size_t)T * K * W, 0x5A);
    const osp_status rc = osp_cuda_dsa_topk(dsc, dh, dpos, T, c->max_ctx, K, c->bs, didx, dcnt, dej, dem, den, NULL);
    if (rc != OSP_OK) printf("  dsa top-k (%s): %s\n", variant ? variant : "default", osp_last_error());
    assert_int_equal(rc, OSP_OK);
    o->idx = xmalloc(sizeof(int32_t) * (size_t)T * K), o->count = xmalloc(sizeof(int32_t) * (size_t)T);
    o->ent_j = xmalloc(sizeof(int32_t) * (size_t)T * K), o->ent_n = xmalloc(sizeof(int32_t) * (size_t)T);
    o->ent_mask = xmalloc(sizeof(uint32_t) * (size_t)T * K * W);
    dev_get(o->idx, didx, sizeof(int32_t) * (size_t)T * K);
    dev_get(o->count, dcnt, sizeof(int32_t) * (size_t)T);
    dev_get(o->ent_j, dej, sizeof(int32_t) * (size_t)T * K);
    dev_get(o->ent_n, den, sizeof(int32_t) * (size_t)T);
    dev_get(o->ent_mask, dem, sizeof(uint32_t) * (size_t)T * K * W);
    osp_cuda_free(didx), osp_cuda_free(dcnt), osp_cuda_free(dej), osp_cuda_free(den), osp_cuda_free(dem);
}

static void free_tkout(tkout *o) { free(o->idx), free(o->count), free(o->ent_j), free(o->ent_n), free(o->ent_mask); }

static void run_topk_case(const tkcase *c, uint64_t seed) {
    g_rng = seed;
    const int K = c->K, T = c->T, W = (c->bs + 31) / 32;
    const size_t mc = (size_t)c->max_ctx;
    float *sc = xmalloc(sizeof(float) * (size_t)T * mc);
    uint32_t *hist = xmalloc(sizeof(uint32_t) * (size_t)T * 4096);
    memset(hist, 0, sizeof(uint32_t) * (size_t)T * 4096);
    for (int t = 0; t < T; t++) {
        const int32_t n = c->pos[t] + 1;
        float *row = sc + (size_t)t * mc;
        fill_topk_scores(c, row, n);
        for (size_t x = (size_t)n; x < mc; x++) row[x] = INFINITY; /* past the causal limit: never selected */
        for (int32_t x = 0; x < n; x++) hist[(size_t)t * 4096 + (host_order_key(row[x]) >> 20)]++;
    }
    void *dsc = dev_put(sc, sizeof(float) * (size_t)T * mc), *dh = dev_put(hist, sizeof(uint32_t) * (size_t)T * 4096);
    void *dpos = dev_put(c->pos, sizeof(int32_t) * (size_t)T);
    static const char *variants[] = {NULL, "cluster8", "cta"};
    tkout o[3];
    for (int v = 0; v < 3; v++) run_topk_variant(variants[v], c, dsc, dh, dpos, &o[v]);
    unsetenv("OSPREY_DSA_TOPK");
    /* the variants: the same bits */
    bool same = true;
    for (int v = 1; v < 3; v++) {
        const bool s = !memcmp(o[v].idx, o[0].idx, sizeof(int32_t) * (size_t)T * K) &&
                       !memcmp(o[v].count, o[0].count, sizeof(int32_t) * (size_t)T) &&
                       !memcmp(o[v].ent_j, o[0].ent_j, sizeof(int32_t) * (size_t)T * K) &&
                       !memcmp(o[v].ent_n, o[0].ent_n, sizeof(int32_t) * (size_t)T) &&
                       !memcmp(o[v].ent_mask, o[0].ent_mask, sizeof(uint32_t) * (size_t)T * K * W);
        if (!s) {
            for (int t = 0; t < T; t++) {
                int first = -1;
                for (int j = 0; j < K && first < 0; j++)
                    if (o[v].idx[(size_t)t * K + j] != o[0].idx[(size_t)t * K + j]) first = j;
                printf("    %s: token %d: count %d / %d, ent_n %d / %d, first idx difference %d\n",
                       variants[v], t, o[0].count[t], o[v].count[t], o[0].ent_n[t], o[v].ent_n[t], first);
            }
        }
        same = same && s;
    }
    /* the default against the exact top-k and its pages */
    int bad = 0;
    int32_t *want = xmalloc(sizeof(int32_t) * (size_t)K), *tmp = xmalloc(sizeof(int32_t) * mc);
    for (int t = 0; t < T; t++) {
        const int32_t n = c->pos[t] + 1, *gi = o[0].idx + (size_t)t * K;
        const int32_t m = full_topk(sc + (size_t)t * mc, n, K, want, tmp);
        bool ok = o[0].count[t] == m;
        for (int j = 0; j < K; j++) ok = ok && gi[j] == (j < m ? want[j] : -1);
        int32_t e = 0;
        for (int j = 0; j < m && ok; e++) {
            const int32_t pg = want[j] / c->bs;
            uint32_t mask[8] = {0};
            for (; j < m && want[j] / c->bs == pg; j++) mask[(want[j] - pg * c->bs) / 32] |= 1u << ((want[j] - pg * c->bs) % 32);
            ok = ok && e < o[0].ent_n[t] && o[0].ent_j[(size_t)t * K + e] == pg &&
                 !memcmp(o[0].ent_mask + ((size_t)t * K + e) * W, mask, sizeof(uint32_t) * (size_t)W);
        }
        ok = ok && o[0].ent_n[t] == e;
        if (!ok) bad++;
        const uint32_t *hh = hist + (size_t)t * 4096;
        int32_t above = 0, b1 = 4095;
        while (b1 > 0 && above + (int32_t)hh[b1] < (m < K ? m : K)) above += (int32_t)hh[b1--];
        printf("  %-26s t %d n %7d: count %d, %d pages, k-th bin %u keys: %s\n", c->name, t, n, o[0].count[t],
               o[0].ent_n[t], hh[b1], ok ? "exact top-k" : "WRONG");
    }
    printf("  %-26s kernels: %s\n", c->name, same ? "bitmap = cluster8 = cta" : "DIFFER");
    for (int v = 0; v < 3; v++) free_tkout(&o[v]);
    free(want), free(tmp), free(sc), free(hist);
    osp_cuda_free(dsc), osp_cuda_free(dh), osp_cuda_free(dpos);
    assert_true(same);
    assert_int_equal(bad, 0);
}

static void test_topk_kernels(void **state) {
    (void)state;
    const tkcase small[] = {
        {"special k5 bs64", 64, 5, TS_SPECIAL, 3, 1003, {999, 5, 4}},
        {"special k2048 bs16", 16, 2048, TS_SPECIAL, 2, 20003, {19999, 5999}},
        {"random k1 bs7", 7, 1, TS_RANDOM, 3, 3003, {2999, 0, 1500}},
    };
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) run_topk_case(&small[i], 0xD5D0u + i);
    if (g_subset) return;
    const tkcase big[] = {
        {"random 128k bs16", 16, 2048, TS_RANDOM, 4, 131077, {131071, 100000, 2047, 2048}},
        {"random 128k bs256", 256, 2048, TS_RANDOM, 2, 131077, {131071, 65536}},
        {"crowded bin bs16", 16, 2048, TS_CROWDED, 2, 131075, {131071, 50000}},
        {"overfull bin bs16", 16, 2048, TS_OVERFULL, 1, 131075, {131071}},
        {"ties at k-th bs48", 48, 2048, TS_TIES, 2, 70003, {70000, 9000}},
        {"ties at k-th bs7", 7, 2048, TS_TIES, 1, 40003, {40000}},
        {"all equal bs16", 16, 2048, TS_EQUAL, 2, 40003, {39999, 3000}},
        {"random 1M bs16", 16, 2048, TS_RANDOM, 1, 1048579, {1048575}},
        {"random 2.2M bs16 (limit)", 16, 2048, TS_RANDOM, 1, 2200003, {2199999}},
    };
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) run_topk_case(&big[i], 0xD5E0u + i);
}

int main(void) {
    if (osp_cuda_device_count() == 0) {
        printf("test_gpu_dsa: skipped: no CUDA device\n");
        return 77;
    }
    const char *sub = getenv("OSPREY_TEST_SANITIZER_SUBSET");
    g_subset = sub && sub[0] == '1';
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_exact_ties),
        cmocka_unit_test(test_random),
        cmocka_unit_test(test_end_to_end),
    };
    /* the three top-k kernels on the same scores, then the whole group with each: the one-pass bitmap
     * kernel (the default), the 7-barrier cluster kernel, one CTA a token */
    const struct CMUnitTest topk_tests[] = {cmocka_unit_test(test_topk_kernels)};
    int rc = cmocka_run_group_tests(topk_tests, NULL, NULL);
    static const char *variants[] = {"bitmap", "cluster8", "cta"};
    for (int v = 0; v < 3; v++) {
        setenv("OSPREY_DSA_TOPK", variants[v], 1);
        printf("test_gpu_dsa: top-k kernel: %s\n", variants[v]);
        rc |= cmocka_run_group_tests(tests, NULL, NULL);
    }
    return rc;
}
