/* osp_cuda_sparse_attention_decode (src/backend/cuda/attention_sparse.cu, issue 15) against the CPU
 * block-sparse reference osp_sparse_attention_cpu (table_masks: the masks read as a kernel must) on
 * seeded random paged decode batches: shuffled block tables, sequences of different lengths (partial last
 * blocks, 1-token sequences), per row a random selection (top-k pages from 1 page to all pages, with the
 * sink and the recent page; token-level selections sparse within a page, DSA-like; every position; only
 * out-of-range candidates: empty rows, which fall back to the query's own position), duplicate
 * candidates, GQA ratios 1 / 4 / 8 (and per-query-head rows), head_dim 64 and 128, block sizes 16, 32 and
 * 7, entries permuted within rows, tables with holes (entries whose bits were cleared: chunks and
 * whole rows with nothing kept), and the built-in masks the kernel evaluates on partial entries (sliding
 * window; sinks beside a window). Then Quest on the GPU: osp_cuda_quest_select's pages against
 * osp_quest_select's, and osp_cuda_quest_table's arrays against osp_sparse_wt_build's.
 *
 * Both sides see the same inputs: q bf16 on the GPU and the same values as fp32 on the CPU; f16 pages,
 * the same bits. Slots no token has written hold f16 NaN and the output (one guard row past the end) and
 * the workspace (guard bytes past its end) are poisoned before every run: a read of an unselected slot
 * past seq_len, an unwritten output element or a write out of bounds fails.
 *
 * Tolerance, per element (test_gpu_attention's for the tensor-core kernels, which round P to f16 as this
 * kernel does): |gpu - cpu| <= 2^-8 |cpu| + 2^-10 vmax, vmax = max |v| in the pages. Dense rows (every
 * page) are also compared with osp_cuda_paged_attention (the dense decode kernel) within the sum of the
 * two kernels' tolerances. Batch invariance: one sequence's rows give the same bits run alone as in its
 * batch. Each case prints its table's shape and its worst err / tol with where it happened. */
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
#include "sparse/quest.h"
#include "sparse/sparse_attention.h"
#include "sparse/worktable.h"

#define MAX_SEQS 16
#define WS_GUARD 256

/* OSPREY_TEST_SANITIZER_SUBSET=1: the first case of each group only (compute-sanitizer runs) */
static bool g_subset;

enum { SEL_PAGES = 1, SEL_TOKENS = 2, SEL_EMPTY = 4, SEL_ALL = 8 };

typedef struct {
    const char *name;
    int n_head, n_kv, D, bs;
    osp_sparse_share share;
    int num_seqs;
    int32_t seq_len[MAX_SEQS];
    int sel;       /* SEL_* kinds a row may draw */
    bool dense;    /* no candidates: every page (compared with the dense kernel too) */
    bool holes;    /* clear the bits of random entries (and of every entry of some rows) */
    bool permute;  /* entries in random order within their rows */
    float qamp;    /* q values in [-qamp, qamp) */
    int mask_kind; /* a built-in osp_mask_kind (0: causal) with */
    int window, sinks; /* its window and sinks */
} tcase;

static osp_mask mask_of(const tcase *c) {
    return (osp_mask){.kind = (osp_mask_kind)c->mask_kind, .window = c->window, .sinks = c->sinks};
}

/* one batch on both sides */
typedef struct {
    const tcase *c;
    int32_t T, max_blocks, num_blocks, G, rows;
    int32_t *bt, *qsl, *pos, *tok_seq, *sl;
    uint16_t *k, *v, *q; /* f16 pages, bf16 q */
    float *qf, vmax;
    int32_t *cand_ip, *cand;
    void *dk, *dv, *dq, *dbt, *dqsl, *dpos, *dtok, *dsl;
} scene;

static int32_t pages_of(int32_t n, int32_t bs) { return (n + bs - 1) / bs; }

static void make_scene(scene *sc, const tcase *c) {
    memset(sc, 0, sizeof *sc);
    sc->c = c;
    sc->T = c->num_seqs;
    sc->G = c->share == OSP_SPARSE_PER_Q_HEAD ? c->n_head : c->n_kv;
    sc->rows = sc->T * sc->G;
    int32_t used = 0;
    for (int s = 0; s < c->num_seqs; s++) {
        const int32_t nb = pages_of(c->seq_len[s], c->bs);
        if (nb > sc->max_blocks) sc->max_blocks = nb;
        used += nb;
    }
    sc->num_blocks = used + 5; /* spares nobody owns: NaN */
    int32_t *perm = xmalloc(sizeof(int32_t) * (size_t)sc->num_blocks);
    for (int32_t i = 0; i < sc->num_blocks; i++) perm[i] = i;
    for (int32_t i = sc->num_blocks - 1; i > 0; i--) {
        const int32_t j = rnd_int(i + 1), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    sc->bt = xmalloc(sizeof(int32_t) * (size_t)(c->num_seqs * sc->max_blocks));
    for (int64_t i = 0; i < (int64_t)c->num_seqs * sc->max_blocks; i++) sc->bt[i] = -1;
    const size_t row = (size_t)c->n_kv * (size_t)c->D, nval = (size_t)sc->num_blocks * (size_t)c->bs * row;
    sc->k = xmalloc(nval * 2), sc->v = xmalloc(nval * 2);
    for (size_t i = 0; i < nval; i++) sc->k[i] = sc->v[i] = 0x7FFF; /* f16 NaN: unwritten */
    int32_t next = 0;
    sc->vmax = 0.0f;
    for (int s = 0; s < c->num_seqs; s++) {
        const int32_t n = c->seq_len[s];
        for (int32_t j = 0; j < pages_of(n, c->bs); j++) sc->bt[s * sc->max_blocks + j] = perm[next++];
        for (int32_t p = 0; p < n; p++) {
            const size_t slot = (size_t)sc->bt[s * sc->max_blocks + p / c->bs] * (size_t)c->bs + (size_t)(p % c->bs);
            for (size_t i = 0; i < row; i++) {
                sc->k[slot * row + i] = osp_fp32_to_fp16(rnd_unit());
                const float vv = rnd_unit() * 2.0f;
                sc->v[slot * row + i] = osp_fp32_to_fp16(vv);
                const float a = fabsf(osp_fp16_to_fp32(sc->v[slot * row + i]));
                if (a > sc->vmax) sc->vmax = a;
            }
        }
    }
    free(perm);
    sc->qsl = xmalloc(sizeof(int32_t) * (size_t)(sc->T + 1));
    sc->pos = xmalloc(sizeof(int32_t) * (size_t)sc->T);
    sc->tok_seq = xmalloc(sizeof(int32_t) * (size_t)sc->T);
    sc->sl = xmalloc(sizeof(int32_t) * (size_t)sc->T);
    for (int s = 0; s <= sc->T; s++) sc->qsl[s] = s;
    for (int s = 0; s < sc->T; s++) sc->pos[s] = c->seq_len[s] - 1, sc->tok_seq[s] = s, sc->sl[s] = c->seq_len[s];
    const size_t nq = (size_t)sc->T * (size_t)c->n_head * (size_t)c->D;
    sc->q = xmalloc(nq * 2), sc->qf = xmalloc(nq * sizeof(float));
    for (size_t i = 0; i < nq; i++) {
        sc->q[i] = osp_fp32_to_bf16(rnd_unit() * c->qamp);
        sc->qf[i] = osp_bf16_to_fp32(sc->q[i]);
    }
    /* candidates per row */
    int64_t cap = 16;
    for (int s = 0; s < c->num_seqs; s++) cap += (int64_t)sc->G * (2 * (int64_t)pages_of(c->seq_len[s], c->bs) * c->bs + 700);
    sc->cand_ip = xmalloc(sizeof(int32_t) * (size_t)(sc->rows + 1));
    sc->cand = xmalloc(sizeof(int32_t) * (size_t)cap);
    int64_t m = 0;
    sc->cand_ip[0] = 0;
    for (int32_t r = 0; r < sc->rows; r++) {
        const int32_t n = c->seq_len[r / sc->G], np = pages_of(n, c->bs);
        int kind = SEL_ALL; /* dense cases (sel 0) build without candidates: these are unused */
        if (c->sel)
            do kind = 1 << rnd_int(4);
            while (!(c->sel & kind));
        if (kind == SEL_PAGES) {
            static const int budgets[] = {1, 2, 4, 16, 64, 1 << 30};
            int32_t B = budgets[rnd_int(6)];
            if (B > np) B = np;
            uint8_t *pick = calloc((size_t)np, 1);
            int32_t got = 0;
            if (B >= 2) pick[0] = pick[np - 1] = 1, got = np > 1 ? 2 : 1; /* sink and recent */
            while (got < B) {
                const int32_t j = rnd_int(np);
                if (!pick[j]) pick[j] = 1, got++;
            }
            for (int32_t j = 0; j < np; j++) {
                if (!pick[j]) continue;
                const int reps = rnd_int(6) == 0 ? 2 : 1; /* a page listed twice */
                for (int rep = 0; rep < reps; rep++)
                    for (int32_t i = 0; i < c->bs; i++) sc->cand[m++] = j * c->bs + i; /* past seq_len: dropped */
            }
            free(pick);
        } else if (kind == SEL_TOKENS) {
            static const int ks[] = {1, 3, 8, 64, 300};
            const int k = ks[rnd_int(5)];
            for (int i = 0; i < k; i++) {
                const int32_t x = rnd_int(n);
                sc->cand[m++] = x;
                if (rnd_int(4) == 0) sc->cand[m++] = x; /* duplicates */
            }
        } else if (kind == SEL_EMPTY) {
            const int k = rnd_int(4);
            for (int i = 0; i < k; i++) sc->cand[m++] = n + rnd_int(50); /* all out of range */
        } else {
            for (int32_t x = n - 1; x >= 0; x--) sc->cand[m++] = x;
        }
        assert_true(m <= cap);
        sc->cand_ip[r + 1] = (int32_t)m;
    }
    sc->dk = dev_put(sc->k, nval * 2), sc->dv = dev_put(sc->v, nval * 2);
    sc->dq = dev_put(sc->q, nq * 2);
    sc->dbt = dev_put(sc->bt, sizeof(int32_t) * (size_t)(c->num_seqs * sc->max_blocks));
    sc->dqsl = dev_put(sc->qsl, sizeof(int32_t) * (size_t)(sc->T + 1));
    sc->dpos = dev_put(sc->pos, sizeof(int32_t) * (size_t)sc->T);
    sc->dtok = dev_put(sc->tok_seq, sizeof(int32_t) * (size_t)sc->T);
    sc->dsl = dev_put(sc->sl, sizeof(int32_t) * (size_t)sc->T);
}

static void free_scene(scene *sc) {
    free(sc->bt), free(sc->qsl), free(sc->pos), free(sc->tok_seq), free(sc->sl), free(sc->k), free(sc->v);
    free(sc->q), free(sc->qf), free(sc->cand_ip), free(sc->cand);
    osp_cuda_free(sc->dk), osp_cuda_free(sc->dv), osp_cuda_free(sc->dq), osp_cuda_free(sc->dbt);
    osp_cuda_free(sc->dqsl), osp_cuda_free(sc->dpos), osp_cuda_free(sc->dtok), osp_cuda_free(sc->dsl);
}

/* The layout of sequences [s0, s0 + ns) of the scene (all of it: 0, T), pointing into its arrays. */
static osp_sparse_layout layout_of(const scene *sc, int s0, int ns, int32_t *qsl_buf) {
    for (int i = 0; i <= ns; i++) qsl_buf[i] = i;
    return (osp_sparse_layout){.num_tokens = ns, .positions = sc->pos + s0, .num_seqs = ns,
                               .query_start_loc = qsl_buf, .seq_lens = sc->sl + s0,
                               .block_table = sc->bt + (size_t)s0 * (size_t)sc->max_blocks,
                               .max_blocks_per_seq = sc->max_blocks, .block_size = sc->c->bs,
                               .n_head = sc->c->n_head, .n_head_kv = sc->c->n_kv, .share = sc->c->share, .q_tile = 1};
}

static void holes_and_order(osp_sparse_wt *wt, const tcase *c) {
    if (c->holes) {
        for (int32_t r = 0; r < wt->num_rows; r++) {
            const bool all = rnd_int(5) == 0; /* the whole row: nothing kept, v at the query's position */
            for (int32_t e = wt->indptr[r]; e < wt->indptr[r + 1]; e++) {
                if (!all && rnd_int(3)) continue;
                wt->flags[e] = 0; /* partial, no bit: nothing of the entry is kept */
                for (int32_t w = 0; w < wt->mask_words; w++) wt->tmask[(size_t)e * (size_t)wt->mask_words + w] = 0;
            }
        }
    }
    if (c->permute) {
        for (int32_t r = 0; r < wt->num_rows; r++) {
            const int32_t e0 = wt->indptr[r], n = wt->indptr[r + 1] - e0;
            for (int32_t i = n - 1; i > 0; i--) {
                const int32_t a = e0 + i, b = e0 + rnd_int(i + 1);
                int32_t x;
                x = wt->indices[a], wt->indices[a] = wt->indices[b], wt->indices[b] = x;
                x = wt->pages[a], wt->pages[a] = wt->pages[b], wt->pages[b] = x;
                x = wt->flags[a], wt->flags[a] = wt->flags[b], wt->flags[b] = x;
                for (int32_t w = 0; w < wt->mask_words; w++) {
                    uint32_t *ta = wt->tmask + (size_t)a * (size_t)wt->mask_words + w,
                             *tb = wt->tmask + (size_t)b * (size_t)wt->mask_words + w;
                    const uint32_t y = *ta;
                    *ta = *tb, *tb = y;
                }
            }
        }
    }
}

typedef struct {
    void *indptr, *indices, *pages, *flags, *tmask;
    osp_cuda_sparse_table t;
} dev_table;

static void table_put(dev_table *d, const osp_sparse_wt *wt) {
    const int32_t nnz = wt->indptr[wt->num_rows];
    d->indptr = dev_put(wt->indptr, sizeof(int32_t) * (size_t)(wt->num_rows + 1));
    d->indices = dev_put(wt->indices, sizeof(int32_t) * (size_t)nnz);
    d->pages = dev_put(wt->pages, sizeof(int32_t) * (size_t)nnz);
    d->flags = dev_put(wt->flags, sizeof(int32_t) * (size_t)nnz);
    d->tmask = dev_put(wt->tmask, sizeof(uint32_t) * (size_t)nnz * (size_t)wt->mask_words);
    int32_t mx = 0;
    for (int32_t r = 0; r < wt->num_rows; r++)
        if (wt->indptr[r + 1] - wt->indptr[r] > mx) mx = wt->indptr[r + 1] - wt->indptr[r];
    d->t = (osp_cuda_sparse_table){.d_indptr = d->indptr, .d_indices = d->indices, .d_pages = d->pages,
                                   .d_flags = d->flags, .d_tmask = d->tmask, .num_rows = wt->num_rows,
                                   .groups = wt->groups, .mask_words = wt->mask_words, .max_row_tiles = mx};
}
static void table_free(dev_table *d) {
    osp_cuda_free(d->indptr), osp_cuda_free(d->indices), osp_cuda_free(d->pages), osp_cuda_free(d->flags);
    osp_cuda_free(d->tmask);
}

/* Runs the sparse kernel on sequences [s0, s0 + ns) with table d into got [ns * n_head * D] (poisoned
 * output and workspace, guards checked). */
static void run_gpu(const scene *sc, const dev_table *d, int s0, int ns, uint16_t *got) {
    const tcase *c = sc->c;
    const size_t rowv = (size_t)c->n_head * (size_t)c->D, n = (size_t)ns * rowv;
    const size_t ws = osp_cuda_sparse_workspace_bytes(ns, c->n_head, c->D, d->t.max_row_tiles, c->bs);
    void *dout = dev_alloc_fill((n + rowv) * 2, 0xFF);
    void *dws = dev_alloc_fill(ws + WS_GUARD, 0xAB);
    int32_t zero_seq[MAX_SEQS];
    for (int i = 0; i < ns; i++) zero_seq[i] = i;
    void *dtok = dev_put(zero_seq, sizeof(int32_t) * (size_t)ns);
    const size_t qoff = (size_t)s0 * rowv;
    const osp_cuda_sparse_mask gm = {.kind = c->mask_kind, .window = c->window, .sinks = c->sinks};
    const osp_status rc = osp_cuda_sparse_attention_decode(
        &d->t, (const uint16_t *)sc->dq + qoff, sc->dk, sc->dv, OSP_KV_PAGE_F16, dout, ns, (const int32_t *)sc->dpos + s0,
        dtok, (const int32_t *)sc->dsl + s0, (const int32_t *)sc->dbt + (size_t)s0 * (size_t)sc->max_blocks,
        sc->max_blocks, c->bs, c->n_head, c->n_kv, c->D, 1.0f / sqrtf((float)c->D), &gm, ws ? dws : NULL, ws, NULL);
    if (rc != OSP_OK) printf("  sparse decode: %s\n", osp_last_error());
    assert_int_equal(rc, OSP_OK);
    uint16_t *buf = xmalloc((n + rowv) * 2);
    uint8_t guard[WS_GUARD];
    dev_get(buf, dout, (n + rowv) * 2);
    dev_get(guard, (const char *)dws + ws, WS_GUARD);
    int64_t gbad = 0, wbad = 0;
    for (size_t i = n; i < n + rowv; i++) gbad += buf[i] != 0xFFFF;
    for (int i = 0; i < WS_GUARD; i++) wbad += guard[i] != 0xAB;
    if (gbad || wbad) printf("  out-of-bounds writes: %lld past the output, %lld past the workspace\n", (long long)gbad, (long long)wbad);
    assert_int_equal(gbad, 0);
    assert_int_equal(wbad, 0);
    memcpy(got, buf, n * 2);
    free(buf);
    osp_cuda_free(dout), osp_cuda_free(dws), osp_cuda_free(dtok);
}

static void cpu_ref(const scene *sc, const osp_sparse_layout *L, const osp_sparse_wt *wt, float *ref) {
    const tcase *c = sc->c;
    const osp_mask m = mask_of(c);
    const osp_cpu_kv_pages kv = {.k_type = OSP_DTYPE_F16, .v_type = OSP_DTYPE_F16, .k = sc->k, .v = sc->v};
    osp_sparse_attn_args a = {.q = sc->qf, .out = ref, .kv = &kv, .L = L, .wt = wt, .mask = &m, .head_dim = c->D,
                              .scale = 1.0f / sqrtf((float)c->D), .table_masks = true};
    assert_int_equal(osp_sparse_attention_check(&a), OSP_OK);
    const int64_t items = (int64_t)L->num_tokens * c->n_head;
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t i = 0; i < items; i++) osp_sparse_attention_cpu(&a, i, i + 1);
}

/* err / tol over n elements: fails (after printing the worst elements) if any exceeds 1 */
static void compare(const char *what, const tcase *c, const uint16_t *got, const float *ref, int64_t n, float abs_tol,
                    const osp_sparse_wt *wt) {
    float worst = 0.0f;
    int64_t worst_i = -1, bad = 0;
    const int64_t rowv = (int64_t)c->n_head * c->D;
    for (int64_t i = 0; i < n; i++) {
        const float r = ref[i], g = osp_bf16_to_fp32(got[i]);
        const float tol = ldexpf(fabsf(r), -8) + abs_tol, err = fabsf(g - r);
        if (!(err <= tol)) {
            if (bad++ < 8) {
                const int64_t t = i / rowv, h = (i % rowv) / c->D;
                const int64_t g_ = c->share == OSP_SPARSE_PER_Q_HEAD ? h : h / (c->n_head / c->n_kv);
                const int64_t rr = t * (c->share == OSP_SPARSE_PER_Q_HEAD ? c->n_head : c->n_kv) + g_;
                printf("  %s: t %lld head %lld dim %lld (row %lld: %d entries, seq_len %d): gpu %.6g cpu %.6g (tol %.3g)\n",
                       what, (long long)t, (long long)h, (long long)(i % c->D), (long long)rr,
                       wt ? wt->indptr[rr + 1] - wt->indptr[rr] : -1, c->seq_len[t], (double)g, (double)r, (double)tol);
            }
        } else if (err / tol > worst) {
            worst = err / tol, worst_i = i;
        }
    }
    printf("  %-10s err/tol %.3f (worst at t %lld head %lld dim %lld), %lld bad of %lld\n", what, (double)worst,
           (long long)(worst_i >= 0 ? worst_i / rowv : -1), (long long)(worst_i >= 0 ? (worst_i % rowv) / c->D : -1),
           (long long)(worst_i >= 0 ? worst_i % c->D : -1), (long long)bad, (long long)n);
    assert_int_equal(bad, 0);
}

static void run_case(const tcase *c, uint64_t seed) {
    g_rng = seed;
    scene sc;
    make_scene(&sc, c);
    int32_t qsl_buf[MAX_SEQS + 1];
    osp_sparse_layout L = layout_of(&sc, 0, sc.T, qsl_buf);
    osp_sparse_cands C = {sc.cand_ip, sc.cand};
    osp_sparse_wt wt = {0};
    const osp_mask mk = mask_of(c);
    assert_int_equal(osp_sparse_wt_build(&wt, &L, c->dense ? NULL : &C, &mk, (int64_t)c->D * 2), OSP_OK);
    holes_and_order(&wt, c);
    dev_table d;
    table_put(&d, &wt);
    printf("%-28s heads %2d/%d D %3d bs %2d %s seqs %2d: %lld entries (full %lld, partial %lld, self %lld), "
           "longest row %d entries, %d chunks a row at most\n",
           c->name, c->n_head, c->n_kv, c->D, c->bs, c->share == OSP_SPARSE_PER_Q_HEAD ? "per-q " : "per-kv", c->num_seqs,
           (long long)wt.stats.physical_tiles, (long long)wt.stats.full_tiles, (long long)wt.stats.partial_tiles,
           (long long)wt.stats.self_tiles, d.t.max_row_tiles, osp_cuda_sparse_max_chunks(d.t.max_row_tiles, c->bs));
    const int64_t rowv = (int64_t)c->n_head * c->D, n = sc.T * rowv;
    uint16_t *got = xmalloc((size_t)n * 2), *got2 = xmalloc((size_t)n * 2);
    float *ref = xmalloc((size_t)n * sizeof(float));
    run_gpu(&sc, &d, 0, sc.T, got);
    cpu_ref(&sc, &L, &wt, ref);
    const float abs_tol = ldexpf(sc.vmax, -10);
    compare("vs cpu", c, got, ref, n, abs_tol, &wt);

    /* the same launch again: the same bits (no race, nothing left from the poison) */
    run_gpu(&sc, &d, 0, sc.T, got2);
    assert_memory_equal(got, got2, (size_t)n * 2);

    if (c->dense) { /* every page: the dense decode kernel's result within both tolerances (causal or a window) */
        assert_true(c->mask_kind == 0 || c->mask_kind == 1);
        int32_t maxlen = 0;
        for (int s = 0; s < sc.T; s++) maxlen = c->seq_len[s] > maxlen ? c->seq_len[s] : maxlen;
        const size_t ws = osp_cuda_attention_workspace_bytes(sc.T, c->n_head, c->D, maxlen);
        void *dws = ws ? dev_alloc_fill(ws, 0) : NULL, *dout = dev_alloc_fill((size_t)n * 2, 0xFF);
        assert_int_equal(osp_cuda_paged_attention(sc.dq, sc.dk, sc.dv, OSP_KV_PAGE_F16, dout, sc.T, sc.dqsl, sc.dpos,
                                                  sc.dbt, sc.max_blocks, c->bs, sc.T, c->n_head, c->n_kv, c->D,
                                                  1.0f / sqrtf((float)c->D), c->mask_kind == 1 ? c->window : 0, maxlen, dws,
                                                  NULL),
                         OSP_OK);
        uint16_t *dense = xmalloc((size_t)n * 2);
        dev_get(dense, dout, (size_t)n * 2);
        compare("dense/cpu", c, dense, ref, n, abs_tol, NULL);
        float *densef = xmalloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++) densef[i] = osp_bf16_to_fp32(dense[i]);
        /* sparse vs dense: each is within 2^-8 |ref| + abs_tol of ref */
        compare("vs dense", c, got, densef, n, 2.0f * abs_tol + ldexpf(sc.vmax, -7), &wt);
        free(dense), free(densef);
        osp_cuda_free(dws), osp_cuda_free(dout);
    }

    /* batch invariance: each of two sequences alone gives its rows' bits in the batch */
    for (int k = 0; k < 2 && sc.T > 1; k++) {
        const int s0 = k == 0 ? 0 : sc.T - 1;
        /* the table of the sequence alone: the batch's entries of its rows (what a build for it alone gives) */
        const int32_t e0 = wt.indptr[s0 * sc.G];
        osp_sparse_wt w2 = {.groups = wt.groups, .mask_words = wt.mask_words};
        int32_t *ipr = xmalloc(sizeof(int32_t) * (size_t)(sc.G + 1));
        for (int g = 0; g <= sc.G; g++) ipr[g] = wt.indptr[s0 * sc.G + g] - e0;
        w2.indptr = ipr, w2.indices = wt.indices + e0, w2.pages = wt.pages + e0, w2.flags = wt.flags + e0;
        w2.tmask = wt.tmask + (size_t)e0 * (size_t)wt.mask_words;
        w2.num_rows = sc.G;
        dev_table d1;
        table_put(&d1, &w2);
        uint16_t *alone = xmalloc((size_t)rowv * 2);
        run_gpu(&sc, &d1, s0, 1, alone);
        const bool same = memcmp(alone, got + (size_t)s0 * (size_t)rowv, (size_t)rowv * 2) == 0;
        if (!same) {
            int64_t diff = 0;
            for (int64_t i = 0; i < rowv; i++) diff += alone[i] != got[(size_t)s0 * (size_t)rowv + (size_t)i];
            printf("  batch invariance: sequence %d alone differs from the batch in %lld of %lld elements\n", s0,
                   (long long)diff, (long long)rowv);
        }
        assert_true(same);
        free(alone), free(ipr);
        table_free(&d1);
    }
    printf("  batch invariance: ok\n");
    free(got), free(got2), free(ref);
    table_free(&d);
    osp_sparse_wt_free(&wt);
    free_scene(&sc);
}

#define ALLSEL (SEL_PAGES | SEL_TOKENS | SEL_EMPTY | SEL_ALL)

static void test_gqa_and_dims(void **state) {
    (void)state;
    const tcase cases[] = {
        {"gqa1 D64", 8, 8, 64, 16, OSP_SPARSE_PER_KV_HEAD, 5, {1, 17, 300, 1000, 2049}, ALLSEL, false, false, false, 2.0f, 0, 0, 0},
        {"gqa4 D128", 32, 8, 128, 16, OSP_SPARSE_PER_KV_HEAD, 6, {16, 15, 700, 4096, 5000, 33}, ALLSEL, false, false, false, 2.0f, 0, 0, 0},
        {"gqa8 D128", 32, 4, 128, 16, OSP_SPARSE_PER_KV_HEAD, 4, {3000, 1, 129, 4100}, ALLSEL, false, false, false, 4.0f, 0, 0, 0},
        {"gqa8 D64", 16, 2, 64, 16, OSP_SPARSE_PER_KV_HEAD, 4, {2500, 64, 65, 17}, ALLSEL, false, false, false, 4.0f, 0, 0, 0},
        {"gqa16 D128", 16, 1, 128, 16, OSP_SPARSE_PER_KV_HEAD, 3, {1500, 300, 2}, ALLSEL, false, false, false, 2.0f, 0, 0, 0},
        {"gqa4 per-q-head D128", 32, 8, 128, 16, OSP_SPARSE_PER_Q_HEAD, 3, {1200, 77, 3001}, ALLSEL, false, false, false, 2.0f, 0, 0, 0},
        {"gqa4 D128 bs32", 32, 8, 128, 32, OSP_SPARSE_PER_KV_HEAD, 4, {1000, 31, 33, 2500}, ALLSEL, false, false, false, 2.0f, 0, 0, 0},
        {"gqa4 D64 bs7", 8, 2, 64, 7, OSP_SPARSE_PER_KV_HEAD, 4, {1000, 6, 8, 700}, ALLSEL, false, false, false, 2.0f, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !(g_subset && i > 0); i++) run_case(&cases[i], 0x5A55u + i * 7919u);
}

static void test_selections(void **state) {
    (void)state;
    const tcase cases[] = {
        {"pages only", 32, 8, 128, 16, OSP_SPARSE_PER_KV_HEAD, 8, {4096, 4000, 100, 17, 8000, 1, 2000, 300}, SEL_PAGES, false, false, false, 2.0f, 0, 0, 0},
        {"tokens only (DSA-like)", 32, 8, 128, 16, OSP_SPARSE_PER_KV_HEAD, 6, {8192, 5000, 64, 1, 3333, 12000}, SEL_TOKENS, false, false, false, 4.0f, 0, 0, 0},
        {"empty rows", 32, 8, 64, 16, OSP_SPARSE_PER_KV_HEAD, 4, {100, 1, 16, 17}, SEL_EMPTY | SEL_TOKENS, false, false, false, 2.0f, 0, 0, 0},
        {"permuted entries", 32, 8, 128, 16, OSP_SPARSE_PER_KV_HEAD, 5, {3000, 500, 4097, 16, 900}, ALLSEL, false, false, true, 2.0f, 0, 0, 0},
        {"holes", 32, 8, 128, 16, OSP_SPARSE_PER_KV_HEAD, 5, {3000, 500, 4097, 16, 900}, ALLSEL, false, true, false, 2.0f, 0, 0, 0},
        {"holes per-q-head D64", 16, 4, 64, 16, OSP_SPARSE_PER_Q_HEAD, 3, {2000, 40, 700}, ALLSEL, false, true, true, 2.0f, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!g_subset || i == 1 || i == 4) run_case(&cases[i], 0xB0D6u + i * 104729u); /* subset: tokens, holes */
}

/* built-in masks evaluated in the kernel on partial entries (the table drops the tiles they empty and
 * marks the ones they keep whole FULL): a sliding window, and sinks beside a window, over page and token
 * selections and dense rows */
static void test_masks(void **state) {
    (void)state;
    const tcase cases[] = {
        {"sliding window 300", 32, 8, 128, 16, OSP_SPARSE_PER_KV_HEAD, 5, {3000, 100, 301, 17, 1200}, ALLSEL, false, false, false, 2.0f, 1, 300, 0},
        {"sinks 20 + window 100", 32, 8, 64, 16, OSP_SPARSE_PER_KV_HEAD, 5, {3000, 100, 301, 17, 1200}, ALLSEL, false, false, true, 2.0f, 2, 100, 20},
        {"dense sliding window 77", 16, 4, 128, 16, OSP_SPARSE_PER_Q_HEAD, 4, {2000, 50, 78, 700}, 0, true, false, false, 2.0f, 1, 77, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !(g_subset && i > 0); i++) run_case(&cases[i], 0x3A5Cu + i * 17u);
}

/* every page: the dense decode kernel's result (and the CPU's) */
static void test_all_pages_is_dense(void **state) {
    (void)state;
    const tcase cases[] = {
        {"dense gqa4 D128", 32, 8, 128, 16, OSP_SPARSE_PER_KV_HEAD, 6, {1, 16, 17, 1000, 5000, 9000}, 0, true, false, false, 2.0f, 0, 0, 0},
        {"dense gqa1 D64", 8, 8, 64, 16, OSP_SPARSE_PER_KV_HEAD, 4, {3000, 31, 256, 4100}, 0, true, false, false, 2.0f, 0, 0, 0},
        {"dense gqa8 D128", 32, 4, 128, 16, OSP_SPARSE_PER_KV_HEAD, 3, {6000, 2, 800}, 0, true, false, false, 4.0f, 0, 0, 0},
        {"dense gqa8 D64 per-q", 16, 2, 64, 16, OSP_SPARSE_PER_Q_HEAD, 3, {2100, 7, 640}, 0, true, false, false, 2.0f, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!g_subset || i == 1) run_case(&cases[i], 0xDE45u + i * 31u); /* subset: the smallest */
}

static void test_arguments(void **state) {
    (void)state;
    const osp_cuda_sparse_table t = {.d_indptr = (const int32_t *)16, .d_indices = (const int32_t *)16,
                                     .d_pages = (const int32_t *)16, .d_flags = (const int32_t *)16,
                                     .d_tmask = (const uint32_t *)16, .num_rows = 8, .groups = 8, .mask_words = 1,
                                     .max_row_tiles = 4};
    const void *p = (const void *)16;
    int32_t *ip = (int32_t *)16;
    uint16_t *o = (uint16_t *)16;
#define CALL(tab, kvt, D_, bs_, nh, nkv, mask)                                                                          \
    osp_cuda_sparse_attention_decode(tab, p, p, p, kvt, o, 1, ip, ip, ip, ip, 4, bs_, nh, nkv, D_, 0.1f, mask, NULL, 0, NULL)
    assert_int_equal(CALL(&t, OSP_KV_PAGE_F32, 128, 16, 32, 8, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(CALL(&t, OSP_KV_PAGE_F16, 96, 16, 32, 8, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(CALL(&t, OSP_KV_PAGE_F16, 128, 16, 32, 1, NULL), OSP_ERR_INVALID_ARG); /* group 32 */
    assert_int_equal(CALL(&t, OSP_KV_PAGE_F16, 128, 0, 32, 8, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(CALL(&t, OSP_KV_PAGE_F16, 128, 64, 32, 8, NULL), OSP_ERR_INVALID_ARG); /* mask words */
    const osp_cuda_sparse_mask doc = {.kind = 3};
    assert_int_equal(CALL(&t, OSP_KV_PAGE_F16, 128, 16, 32, 8, &doc), OSP_ERR_INVALID_ARG);
    osp_cuda_sparse_table t2 = t;
    t2.num_rows = 7;
    assert_int_equal(CALL(&t2, OSP_KV_PAGE_F16, 128, 16, 32, 8, NULL), OSP_ERR_INVALID_ARG);
    t2 = t, t2.max_row_tiles = 1000; /* needs a workspace */
    assert_int_equal(CALL(&t2, OSP_KV_PAGE_F16, 128, 16, 32, 8, NULL), OSP_ERR_INVALID_ARG);
#undef CALL
    /* the chunking: a function of the row alone, <= 8 chunks while chunks hold <= 1,024 keys */
    assert_int_equal(osp_cuda_sparse_chunk_entries(256, 16), 32);
    assert_int_equal(osp_cuda_sparse_chunk_entries(64, 16), 8);
    assert_int_equal(osp_cuda_sparse_chunk_entries(1, 16), 4);
    assert_int_equal(osp_cuda_sparse_chunk_entries(2048, 16), 64);
    assert_int_equal(osp_cuda_sparse_max_chunks(256, 16), 8);
    assert_int_equal(osp_cuda_sparse_max_chunks(4, 16), 1);
    assert_int_equal(osp_cuda_sparse_max_chunks(8192, 16), 128);
}

/* osp_cuda_quest_select against osp_quest_select (src/sparse/quest.c): the same pages for every (token,
 * KV head) row. Summaries on a coarse grid (multiples of 1/4) and q on a coarse grid too, so many pages
 * tie and the tie order (lower page first) is exercised; some blocks never summarized (+inf / -inf:
 * bounds of +inf, or NaN where a q component is 0, which never wins); contexts below, at and above the
 * budget; budgets with and without sinks and recent pages. */
static void quest_case(int n_head, int n_kv, int D, int bs, int num_seqs, const int32_t *lens, int topk, int sink,
                       int recent, bool coarse, uint64_t seed, osp_cuda_quest_summary summary) {
    g_rng = seed;
    int32_t maxb = 0, used = 0;
    for (int s = 0; s < num_seqs; s++) {
        const int32_t nb = pages_of(lens[s], bs);
        maxb = nb > maxb ? nb : maxb, used += nb;
    }
    const int32_t nblocks = used + 3;
    int32_t *perm = xmalloc(sizeof(int32_t) * (size_t)nblocks), *bt = xmalloc(sizeof(int32_t) * (size_t)(num_seqs * maxb));
    for (int32_t i = 0; i < nblocks; i++) perm[i] = i;
    for (int32_t i = nblocks - 1; i > 0; i--) {
        const int32_t j = rnd_int(i + 1), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    int32_t next = 0;
    for (int s = 0; s < num_seqs; s++)
        for (int32_t j = 0; j < maxb; j++) bt[s * maxb + j] = j < pages_of(lens[s], bs) ? perm[next++] : 0;
    osp_quest_summaries qs;
    assert_int_equal(osp_quest_create(1, nblocks, bs, n_kv, D, &qs), OSP_OK);
    for (int32_t b = 0; b < nblocks; b++) {
        if (rnd_int(20) == 0) continue; /* never summarized: +inf / -inf */
        for (int h = 0; h < n_kv; h++)
            for (int d = 0; d < D; d++) {
                float x = rnd_unit() * 2.0f, y = rnd_unit() * 2.0f;
                if (coarse) x = roundf(x * 4.0f) / 4.0f, y = roundf(y * 4.0f) / 4.0f;
                const size_t o = ((size_t)b * (size_t)n_kv + (size_t)h) * (size_t)D + (size_t)d;
                qs.kmin[o] = x < y ? x : y, qs.kmax[o] = x < y ? y : x;
            }
    }
    const size_t nq = (size_t)num_seqs * (size_t)n_head * (size_t)D;
    uint16_t *q = xmalloc(nq * 2);
    float *qf = xmalloc(nq * sizeof(float));
    for (size_t i = 0; i < nq; i++) {
        float x = rnd_unit() * 2.0f;
        if (coarse) x = roundf(x * 2.0f) / 2.0f; /* zeros included */
        q[i] = osp_fp32_to_bf16(x);
        qf[i] = osp_bf16_to_fp32(q[i]);
    }
    int32_t pos[MAX_SEQS], seqs[MAX_SEQS];
    for (int s = 0; s < num_seqs; s++) pos[s] = lens[s] - 1, seqs[s] = s;
    /* 16-bit summaries: the values rounded to that type first (as a cache of f16 / bf16 pages has them), the
     * reference reading the rounded values as fp32 */
    const size_t nsum = (size_t)nblocks * (size_t)n_kv * (size_t)D;
    void *dmin, *dmax;
    if (summary == OSP_CUDA_QUEST_F32) {
        dmin = dev_put(qs.kmin, nsum * sizeof(float)), dmax = dev_put(qs.kmax, nsum * sizeof(float));
    } else {
        uint16_t *h16 = xmalloc(nsum * 2 * sizeof(uint16_t));
        for (size_t i = 0; i < 2 * nsum; i++) {
            float *v = i < nsum ? &qs.kmin[i] : &qs.kmax[i - nsum];
            h16[i] = summary == OSP_CUDA_QUEST_F16 ? osp_fp32_to_fp16(*v) : osp_fp32_to_bf16(*v);
            *v = summary == OSP_CUDA_QUEST_F16 ? osp_fp16_to_fp32(h16[i]) : osp_bf16_to_fp32(h16[i]);
        }
        dmin = dev_put(h16, nsum * 2), dmax = dev_put(h16 + nsum, nsum * 2);
        free(h16);
    }
    void *dq = dev_put(q, nq * 2);
    void *dpos = dev_put(pos, sizeof(int32_t) * (size_t)num_seqs), *dseq = dev_put(seqs, sizeof(int32_t) * (size_t)num_seqs);
    void *dbt = dev_put(bt, sizeof(int32_t) * (size_t)(num_seqs * maxb));
    const int rows = num_seqs * n_kv;
    void *dsc = dev_alloc_fill(sizeof(float) * (size_t)rows * (size_t)maxb, 0xFF);
    void *dpages = dev_alloc_fill(sizeof(int32_t) * (size_t)rows * (size_t)topk, 0xFF);
    void *dcnt = dev_alloc_fill(sizeof(int32_t) * (size_t)rows, 0xFF);
    assert_int_equal(osp_cuda_quest_select(dmin, dmax, summary, dq, dpos, dseq, dbt, maxb, bs, num_seqs, n_head, n_kv, D, topk,
                                           sink, recent, dsc, dpages, dcnt, NULL),
                     OSP_OK);
    int32_t *gp = xmalloc(sizeof(int32_t) * (size_t)rows * (size_t)topk), *gc = xmalloc(sizeof(int32_t) * (size_t)rows);
    dev_get(gp, dpages, sizeof(int32_t) * (size_t)rows * (size_t)topk);
    dev_get(gc, dcnt, sizeof(int32_t) * (size_t)rows);
    const osp_sparse_config cfg = {.method = OSP_SPARSE_TOPK, .topk_pages = topk, .recent_pages = recent, .sink_pages = sink};
    osp_quest_scored *ws = xmalloc(sizeof(osp_quest_scored) * (size_t)maxb);
    int32_t *want = xmalloc(sizeof(int32_t) * (size_t)maxb);
    int bad = 0;
    for (int s = 0; s < num_seqs; s++)
        for (int h = 0; h < n_kv; h++) {
            const int grp = n_head / n_kv, row = s * n_kv + h;
            const int32_t n = osp_quest_select(&qs, 0, bt + s * maxb, pos[s], qf + ((size_t)s * (size_t)n_head + (size_t)h * (size_t)grp) * (size_t)D,
                                               grp, h, &cfg, ws, want);
            const bool same = gc[row] == n && !memcmp(want, gp + (size_t)row * (size_t)topk, sizeof(int32_t) * (size_t)n);
            if (!same && bad++ < 4) {
                printf("  quest row %d (seq %d, kv head %d, %d pages): gpu %d pages, cpu %d; first differences:", row, s, h,
                       pages_of(lens[s], bs), gc[row], n);
                int shown = 0;
                for (int32_t i = 0; i < n && shown < 6; i++)
                    if (i >= gc[row] || gp[(size_t)row * (size_t)topk + (size_t)i] != want[i])
                        printf(" [%d] gpu %d cpu %d", i, i < gc[row] ? gp[(size_t)row * (size_t)topk + (size_t)i] : -1, want[i]), shown++;
                printf("\n");
            }
        }
    printf("quest heads %d/%d D %d bs %d topk %d sink %d recent %d coarse %d summaries %s: %d of %d rows differ\n", n_head,
           n_kv, D, bs, topk, sink, recent, (int)coarse,
           summary == OSP_CUDA_QUEST_F32 ? "f32" : summary == OSP_CUDA_QUEST_F16 ? "f16" : "bf16", bad, rows);
    assert_int_equal(bad, 0);

    /* the device-built work table of the selection = osp_sparse_wt_build's from the engine hook's candidates */
    const int mw = (bs + 31) / 32;
    const size_t cap = (size_t)rows * (size_t)topk;
    void *dip = dev_alloc_fill(sizeof(int32_t) * (size_t)(rows + 1), 0xFF), *dind = dev_alloc_fill(sizeof(int32_t) * cap, 0xFF);
    void *dpg = dev_alloc_fill(sizeof(int32_t) * cap, 0xFF), *dfl = dev_alloc_fill(sizeof(int32_t) * cap, 0xFF);
    void *dtm = dev_alloc_fill(sizeof(uint32_t) * cap * (size_t)mw, 0xFF);
    int32_t sls[MAX_SEQS];
    for (int i = 0; i < num_seqs; i++) sls[i] = lens[i];
    void *dsl = dev_put(sls, sizeof(int32_t) * (size_t)num_seqs);
    assert_int_equal(osp_cuda_quest_table(dpages, dcnt, topk, dpos, dseq, dsl, dbt, maxb, bs, num_seqs, n_kv, dip, dind, dpg,
                                          dfl, dtm, NULL),
                     OSP_OK);
    int32_t *cip = xmalloc(sizeof(int32_t) * (size_t)(rows + 1)), *cc = xmalloc(sizeof(int32_t) * cap * (size_t)bs + 1);
    int64_t ncand = 0;
    cip[0] = 0;
    for (int r = 0; r < rows; r++) {
        const int sq = r / n_kv;
        for (int32_t i = 0; i < gc[r]; i++)
            for (int o = 0; o < bs && gp[(size_t)r * (size_t)topk + (size_t)i] * bs + o <= pos[sq]; o++)
                cc[ncand++] = gp[(size_t)r * (size_t)topk + (size_t)i] * bs + o;
        cip[r + 1] = (int32_t)ncand;
    }
    int32_t qsl[MAX_SEQS + 1];
    for (int i = 0; i <= num_seqs; i++) qsl[i] = i;
    const osp_sparse_layout L = {.num_tokens = num_seqs, .positions = pos, .num_seqs = num_seqs, .query_start_loc = qsl,
                                 .seq_lens = sls, .block_table = bt, .max_blocks_per_seq = maxb, .block_size = bs,
                                 .n_head = n_head, .n_head_kv = n_kv, .share = OSP_SPARSE_PER_KV_HEAD, .q_tile = 1};
    const osp_sparse_cands C = {cip, cc};
    osp_sparse_wt wt = {0};
    assert_int_equal(osp_sparse_wt_build(&wt, &L, &C, NULL, 2 * D), OSP_OK);
    const int32_t nnz = wt.indptr[rows];
    int32_t *hip = xmalloc(sizeof(int32_t) * (size_t)(rows + 1)), *hx = xmalloc(sizeof(int32_t) * cap + 4);
    uint32_t *htm = xmalloc(sizeof(uint32_t) * cap * (size_t)mw + 4);
    dev_get(hip, dip, sizeof(int32_t) * (size_t)(rows + 1));
    assert_memory_equal(hip, wt.indptr, sizeof(int32_t) * (size_t)(rows + 1));
    dev_get(hx, dind, sizeof(int32_t) * (size_t)nnz);
    assert_memory_equal(hx, wt.indices, sizeof(int32_t) * (size_t)nnz);
    dev_get(hx, dpg, sizeof(int32_t) * (size_t)nnz);
    assert_memory_equal(hx, wt.pages, sizeof(int32_t) * (size_t)nnz);
    dev_get(hx, dfl, sizeof(int32_t) * (size_t)nnz);
    assert_memory_equal(hx, wt.flags, sizeof(int32_t) * (size_t)nnz);
    dev_get(htm, dtm, sizeof(uint32_t) * (size_t)nnz * (size_t)mw);
    assert_memory_equal(htm, wt.tmask, sizeof(uint32_t) * (size_t)nnz * (size_t)mw);
    printf("  quest table on the device = osp_sparse_wt_build's (%d entries)\n", nnz);
    osp_sparse_wt_free(&wt);
    free(cip), free(cc), free(hip), free(hx), free(htm);
    osp_cuda_free(dip), osp_cuda_free(dind), osp_cuda_free(dpg), osp_cuda_free(dfl), osp_cuda_free(dtm), osp_cuda_free(dsl);
    free(ws), free(want), free(gp), free(gc), free(perm), free(bt), free(q), free(qf);
    osp_quest_free(&qs);
    osp_cuda_free(dmin), osp_cuda_free(dmax), osp_cuda_free(dq), osp_cuda_free(dpos), osp_cuda_free(dseq);
    osp_cuda_free(dbt), osp_cuda_free(dsc), osp_cuda_free(dpages), osp_cuda_free(dcnt);
}

static void test_quest_select(void **state) {
    (void)state;
    const int32_t lens[] = {4096, 16, 1000, 33000, 257, 2048, 8192, 5};
    quest_case(32, 8, 128, 16, 8, lens, 64, 1, 2, false, 0x9E57u, OSP_CUDA_QUEST_F32);
    quest_case(32, 8, 128, 16, 8, lens, 64, 1, 2, false, 0x9E57u, OSP_CUDA_QUEST_BF16);
    if (g_subset) return;
    quest_case(32, 8, 128, 16, 8, lens, 64, 1, 2, false, 0x9E5Cu, OSP_CUDA_QUEST_F16);
    quest_case(32, 8, 128, 16, 8, lens, 256, 0, 0, true, 0x9E58u, OSP_CUDA_QUEST_F32);
    quest_case(32, 8, 128, 16, 8, lens, 256, 0, 0, true, 0x9E58u, OSP_CUDA_QUEST_BF16);
    quest_case(32, 8, 128, 16, 8, lens, 16, 4, 12, true, 0x9E59u, OSP_CUDA_QUEST_F32); /* k = 0: sinks and recent pages only */
    quest_case(8, 8, 64, 16, 8, lens, 100, 2, 1, true, 0x9E5Au, OSP_CUDA_QUEST_F32);
    quest_case(8, 8, 64, 16, 8, lens, 100, 2, 1, true, 0x9E5Au, OSP_CUDA_QUEST_F16);
    quest_case(16, 2, 64, 32, 8, lens, 40, 1, 1, true, 0x9E5Bu, OSP_CUDA_QUEST_F32);
    quest_case(16, 2, 512, 16, 8, lens, 40, 1, 1, false, 0x9E5Du, OSP_CUDA_QUEST_F32); /* 32 pages a CTA */
    quest_case(8, 1, 1024, 16, 8, lens, 40, 1, 1, false, 0x9E5Eu, OSP_CUDA_QUEST_F32); /* 16 pages a CTA, 8 heads */
}

int main(void) {
    if (osp_cuda_device_count() == 0) {
        printf("test_gpu_sparse: skipped: no CUDA device\n");
        return 77;
    }
    const char *sub = getenv("OSPREY_TEST_SANITIZER_SUBSET");
    g_subset = sub && sub[0] == '1';
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_gqa_and_dims),
        cmocka_unit_test(test_selections),
        cmocka_unit_test(test_all_pages_is_dense),
        cmocka_unit_test(test_masks),
        cmocka_unit_test(test_quest_select),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
