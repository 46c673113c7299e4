/* Work tables, BlockMasks and block-sparse attention on the CPU (src/sparse/, issue 15):
 *   - the builder sorts, deduplicates, range-limits and tiles candidates, maps tiles to physical pages
 *     through the block table (logical ids kept apart: a remap after pages move changes pages only),
 *     reports candidates / tiles / bytes, falls back to the query's own position for empty rows, and
 *     orders and buckets rows by length;
 *   - every built-in mask's tile classification agrees with element-by-element evaluation (full: all
 *     kept, empty: none; exact for the band masks and prefix-LM);
 *   - block-sparse attention equals a dense reference that materializes every score of the sequence,
 *     applies the mask and the candidate set, and takes a softmax in double: causal edges, windows,
 *     sinks, documents, prefix-LM, custom predicates and score_mod, duplicates, empty rows, GQA in both
 *     share modes, query tiles of 1 and 4 (decode and prefill shapes), a variable-length batch;
 *   - permuting the tiles of every row changes the output only by rounding. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "core/dtype.h"
#include "sparse/block_mask.h"
#include "sparse/sparse_attention.h"
#include "sparse/worktable.h"

/* ---- a small deterministic generator -------------------------------------------------------------- */

static uint64_t g_rng = 0x12345678u;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}
static float frand(void) { return (float)(rnd() % 20001) / 10000.0f - 1.0f; }

/* ---- work-table unit checks ----------------------------------------------------------------------- */

static void test_worktable_basic(void **state) {
    (void)state;
    /* one sequence, one decode token at position 19, seq_len 20, block_size 4 */
    int32_t pos[1] = {19}, qsl[2] = {0, 1}, sl[1] = {20}, bt[6] = {7, 2, 9, 4, 1, 3};
    osp_sparse_layout L = {.num_tokens = 1, .positions = pos, .num_seqs = 1, .query_start_loc = qsl, .seq_lens = sl,
                           .block_table = bt, .max_blocks_per_seq = 6, .block_size = 4, .n_head = 2, .n_head_kv = 1,
                           .share = OSP_SPARSE_PER_KV_HEAD, .q_tile = 1};
    int32_t ci[2] = {0, 9}, c[9] = {5, 3, 5, 9, 3, 17, 100, -1, 20};
    osp_sparse_cands C = {ci, c};
    osp_sparse_wt wt = {0};
    assert_int_equal(osp_sparse_wt_build(&wt, &L, &C, NULL, 64), OSP_OK);
    assert_int_equal(wt.num_rows, 1);
    assert_int_equal(wt.indptr[1], 4);
    const int32_t want_idx[4] = {0, 1, 2, 4}, want_pg[4] = {7, 2, 9, 1};
    const uint32_t want_bits[4] = {1u << 3, 1u << 1, 1u << 1, 1u << 1};
    for (int e = 0; e < 4; e++) {
        assert_int_equal(wt.indices[e], want_idx[e]);
        assert_int_equal(wt.pages[e], want_pg[e]);
        assert_int_equal(wt.tmask[e], want_bits[e]);
        assert_int_equal(wt.flags[e], 0);
    }
    assert_int_equal(wt.row_cands[0], 4);
    assert_int_equal(wt.stats.logical_candidates, 4);
    assert_int_equal(wt.stats.dropped, 5); /* 5 and 3 repeated, 100, -1, 20 (= seq_len) */
    assert_int_equal(wt.stats.physical_tiles, 4);
    assert_int_equal(wt.stats.bytes_read, 4 * 4 * 2 * 64);
    assert_int_equal(wt.stats.dense_tiles, 5);
    /* pages move: the logical selection stays, the physical pages follow the new block table */
    const uint64_t v = wt.version;
    int32_t bt2[6] = {11, 12, 13, 14, 15, 16};
    assert_int_equal(osp_sparse_wt_map_pages(&wt, bt2, 6), OSP_OK);
    assert_true(wt.version > v);
    for (int e = 0; e < 4; e++) {
        assert_int_equal(wt.indices[e], want_idx[e]);
        assert_int_equal(wt.pages[e], 11 + want_idx[e]);
    }
    bt2[4] = -1;
    assert_int_equal(osp_sparse_wt_map_pages(&wt, bt2, 6), OSP_ERR_INVALID_ARG);

    /* a whole page of candidates below the causal limit is FULL; only out-of-range ones: empty row */
    int32_t ci2[2] = {0, 5}, c2[5] = {3, 2, 1, 0, 2};
    C = (osp_sparse_cands){ci2, c2};
    assert_int_equal(osp_sparse_wt_build(&wt, &L, &C, NULL, 64), OSP_OK);
    assert_int_equal(wt.indptr[1], 1);
    assert_int_equal(wt.flags[0], OSP_WT_FULL);
    assert_int_equal(wt.stats.full_tiles, 1);
    int32_t c3[5] = {20, 21, -5, 99, 20};
    C = (osp_sparse_cands){ci2, c3};
    assert_int_equal(osp_sparse_wt_build(&wt, &L, &C, NULL, 64), OSP_OK);
    assert_int_equal(wt.indptr[1], 1);
    assert_int_equal(wt.flags[0], OSP_WT_SELF);
    assert_int_equal(wt.indices[0], 4);
    assert_int_equal(wt.tmask[0], 1u << 3);
    assert_int_equal(wt.stats.empty_rows, 1);
    assert_int_equal(wt.stats.logical_candidates, 0);

    /* bad shapes say why */
    L.n_head = 3, L.n_head_kv = 2;
    assert_int_equal(osp_sparse_wt_build(&wt, &L, &C, NULL, 64), OSP_ERR_INVALID_ARG);
    L.n_head = 2, L.n_head_kv = 1;
    pos[0] = 20;
    assert_int_equal(osp_sparse_wt_build(&wt, &L, &C, NULL, 64), OSP_ERR_INVALID_ARG);
    pos[0] = 19;
    L.max_blocks_per_seq = 3; /* the self tile (4) lies beyond the block table */
    assert_int_equal(osp_sparse_wt_build(&wt, &L, &C, NULL, 64), OSP_ERR_INVALID_ARG);
    osp_sparse_wt_free(&wt);
}

static void test_worktable_order_buckets(void **state) {
    (void)state;
    /* four decode rows with 1, 5, 2 and 5 tiles */
    int32_t pos[4] = {63, 63, 63, 63}, qsl[5] = {0, 1, 2, 3, 4}, sl[4] = {64, 64, 64, 64}, bt[4 * 16];
    for (int i = 0; i < 64; i++) bt[i] = i;
    osp_sparse_layout L = {.num_tokens = 4, .positions = pos, .num_seqs = 4, .query_start_loc = qsl, .seq_lens = sl,
                           .block_table = bt, .max_blocks_per_seq = 16, .block_size = 4, .n_head = 1, .n_head_kv = 1,
                           .share = OSP_SPARSE_PER_KV_HEAD, .q_tile = 1};
    int32_t ci[5] = {0, 1, 6, 8, 13}, c[13] = {0, 0, 4, 8, 12, 16, 0, 4, 1, 5, 9, 13, 17};
    osp_sparse_cands C = {ci, c};
    osp_sparse_wt wt = {0};
    assert_int_equal(osp_sparse_wt_build(&wt, &L, &C, NULL, 2), OSP_OK);
    const int32_t want_order[4] = {1, 3, 2, 0};
    for (int i = 0; i < 4; i++) assert_int_equal(wt.row_order[i], want_order[i]);
    assert_int_equal(wt.n_buckets, 3); /* {5, 5} (ceil log2 = 3), {2} (1), {1} (0) */
    const int32_t want_ptr[4] = {0, 2, 3, 4};
    for (int i = 0; i < 4; i++) assert_int_equal(wt.bucket_ptr[i], want_ptr[i]);
    osp_sparse_wt_free(&wt);
}

/* ---- masks ---------------------------------------------------------------------------------------- */

static bool custom_mod(const void *p, int32_t b, int32_t h, int32_t q, int32_t kv) {
    const int32_t salt = *(const int32_t *)p;
    if (kv > q) return false;
    return ((q * 7 + kv * 3 + h * 5 + b + salt) % 4) != 0; /* drops some diagonals on purpose */
}

static float bias_mod(const void *p, float score, int32_t b, int32_t h, int32_t q, int32_t kv) {
    (void)p, (void)b;
    return score - 0.05f * (float)(h + 1) * (float)(q - kv); /* ALiBi-like (Press et al. 2022) */
}

static int32_t g_docs[3 * 128];
static int32_t g_salt = 1;

static osp_mask mask_of(int kind) {
    switch (kind) {
    case 0: return osp_mask_causal();
    case 1: return (osp_mask){.kind = OSP_MASK_SLIDING_WINDOW, .window = 5};
    case 2: return (osp_mask){.kind = OSP_MASK_SINK_WINDOW, .window = 4, .sinks = 2};
    case 3: return (osp_mask){.kind = OSP_MASK_SINK_WINDOW, .window = 0, .sinks = 3};
    case 4: return (osp_mask){.kind = OSP_MASK_DOCUMENT, .doc_ids = g_docs, .doc_stride = 128};
    case 5: return (osp_mask){.kind = OSP_MASK_PREFIX_LM, .prefix_len = 12};
    case 6:
        return (osp_mask){.kind = OSP_MASK_CUSTOM, .mask_mod = custom_mod, .mask_params = &g_salt, .head_dependent = true};
    case 7: return (osp_mask){.kind = OSP_MASK_SLIDING_WINDOW, .window = 9, .score_mod = bias_mod};
    default: return (osp_mask){.kind = OSP_MASK_SLIDING_WINDOW, .window = 1};
    }
}
#define N_MASKS 9

static void fill_docs(void) {
    for (int s = 0; s < 3; s++) {
        int32_t d = 0;
        for (int p = 0; p < 128; p++) {
            if (p > 0 && rnd() % 9 == 0) d++;
            g_docs[s * 128 + p] = d;
        }
    }
}

static void test_mask_classify(void **state) {
    (void)state;
    fill_docs();
    for (int k = 0; k < N_MASKS; k++) {
        const osp_mask m = mask_of(k);
        assert_int_equal(osp_mask_validate(&m), OSP_OK);
        for (int it = 0; it < 3000; it++) {
            const int32_t q0 = (int32_t)(rnd() % 100), q1 = q0 + (int32_t)(rnd() % 6);
            const int32_t k0 = (int32_t)(rnd() % 110), k1 = k0 + (int32_t)(rnd() % 8);
            const int32_t b = (int32_t)(rnd() % 3), h0 = (int32_t)(rnd() % 4), h1 = h0 + (int32_t)(rnd() % 2);
            int kept = 0, total = 0;
            for (int32_t h = h0; h <= (m.head_dependent ? h1 : h0); h++)
                for (int32_t q = q0; q <= q1; q++)
                    for (int32_t kv = k0; kv <= k1; kv++) kept += osp_mask_keep(&m, b, h, q, kv), total++;
            const osp_tile_class c = osp_mask_classify(&m, b, h0, h1, q0, q1, k0, k1);
            if (c == OSP_TILE_FULL) assert_int_equal(kept, total);
            if (c == OSP_TILE_EMPTY) assert_int_equal(kept, 0);
            if (c == OSP_TILE_PARTIAL && m.kind != OSP_MASK_SINK_WINDOW) { /* exact for the others */
                assert_true(kept > 0);
                assert_true(kept < total);
            }
        }
    }
    osp_mask bad = {.kind = OSP_MASK_SLIDING_WINDOW, .window = 0};
    assert_int_equal(osp_mask_validate(&bad), OSP_ERR_INVALID_ARG);
    bad = (osp_mask){.kind = OSP_MASK_CUSTOM};
    assert_int_equal(osp_mask_validate(&bad), OSP_ERR_INVALID_ARG);
    bad = (osp_mask){.kind = OSP_MASK_KIND_COUNT};
    assert_int_equal(osp_mask_validate(&bad), OSP_ERR_INVALID_ARG);
}

/* ---- attention against a dense reference ----------------------------------------------------------- */

enum { D = 16, BS = 8, HK = 2, NBLK = 64, MAXB = 20 };

typedef struct scene {
    int32_t num_seqs, num_tokens;
    int32_t qsl[4], sl[3], pos[64], bt[3 * MAXB];
    float *k, *v, *q; /* pages [NBLK, BS, HK, D], q [T, H, D] */
} scene;

/* sequences of 30 (a 20-token chunk at 10..29), 7 (a whole prompt 0..6) and 41 (one decode) tokens,
 * pages scattered over the pool in a shuffled order */
static void make_scene(scene *sc, int32_t H) {
    sc->num_seqs = 3;
    const int32_t first[3] = {10, 0, 40}, len[3] = {30, 7, 41};
    int32_t t = 0;
    sc->qsl[0] = 0;
    for (int s = 0; s < 3; s++) {
        sc->sl[s] = len[s];
        for (int32_t p = first[s]; p < len[s]; p++) sc->pos[t++] = p;
        sc->qsl[s + 1] = t;
    }
    sc->num_tokens = t;
    int32_t perm[NBLK];
    for (int i = 0; i < NBLK; i++) perm[i] = i;
    for (int i = NBLK - 1; i > 0; i--) {
        const int j = (int)(rnd() % (uint32_t)(i + 1));
        const int32_t x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    for (int i = 0; i < 3 * MAXB; i++) sc->bt[i] = perm[i];
    sc->k = malloc(sizeof(float) * NBLK * BS * HK * D);
    sc->v = malloc(sizeof(float) * NBLK * BS * HK * D);
    sc->q = malloc(sizeof(float) * (size_t)t * (size_t)H * D);
    for (int i = 0; i < NBLK * BS * HK * D; i++) sc->k[i] = 2.0f * frand(), sc->v[i] = frand();
    for (int i = 0; i < t * H * D; i++) sc->q[i] = 2.0f * frand();
}

static void free_scene(scene *sc) { free(sc->k), free(sc->v), free(sc->q); }

static const float *kv_at(const scene *sc, const float *pages, int32_t s, int32_t p, int32_t kvh) {
    const int64_t slot = (int64_t)sc->bt[s * MAXB + p / BS] * BS + p % BS;
    return pages + (slot * HK + kvh) * D;
}

/* Dense reference for (t, h): every position of the sequence, kept when the mask keeps it and (with
 * candidates) it is one of the row's candidates within [0, key limit]; softmax in double. */
static void reference(const scene *sc, int32_t H, const osp_sparse_layout *L, const osp_sparse_cands *C,
                      const osp_sparse_wt *wt, const osp_mask *m, int32_t t, int32_t h, float *out) {
    int32_t s = 0;
    while (t >= sc->qsl[s + 1]) s++;
    const int32_t grp = H / HK, kvh = h / grp, p = sc->pos[t];
    int32_t qt = 0;
    while (qt + 1 < wt->num_qtiles && wt->qtile_start[qt + 1] <= t) qt++;
    const int32_t g = L->share == OSP_SPARSE_PER_Q_HEAD ? h : kvh;
    const int32_t r = qt * wt->groups + g;
    int32_t t1 = wt->qtile_start[qt] + L->q_tile;
    if (t1 > sc->qsl[s + 1]) t1 = sc->qsl[s + 1];
    int32_t hi = sc->pos[t1 - 1]; /* the row's key limit (as worktable.c) */
    if (m->kind == OSP_MASK_PREFIX_LM && m->prefix_len - 1 > hi) hi = m->prefix_len - 1;
    if (m->kind == OSP_MASK_CUSTOM) hi = sc->sl[s] - 1;
    if (hi > sc->sl[s] - 1) hi = sc->sl[s] - 1;
    double sc_[128];
    bool keep[128];
    double mx = -INFINITY;
    int n = 0;
    for (int32_t kv = 0; kv < sc->sl[s]; kv++) {
        keep[kv] = osp_mask_keep(m, s, h, p, kv);
        if (keep[kv] && C) {
            bool in = false;
            for (int32_t i = C->cand_indptr[r]; i < C->cand_indptr[r + 1] && !in; i++)
                in = C->cand[i] == kv && kv <= hi;
            keep[kv] = in;
        }
        if (!keep[kv]) continue;
        const float *qh = sc->q + ((size_t)t * (size_t)H + (size_t)h) * D;
        const float *kk = kv_at(sc, sc->k, s, kv, kvh);
        double d = 0;
        for (int i = 0; i < D; i++) d += (double)qh[i] * kk[i];
        float x = (float)d * 0.25f;
        if (m->score_mod) x = m->score_mod(m->score_params, x, s, h, p, kv);
        sc_[kv] = x;
        if (x > mx) mx = x;
        n++;
    }
    if (n == 0) { /* the own-position fallback */
        memcpy(out, kv_at(sc, sc->v, s, p, kvh), sizeof(float) * D);
        return;
    }
    double acc[D] = {0}, l = 0;
    for (int32_t kv = 0; kv < sc->sl[s]; kv++) {
        if (!keep[kv]) continue;
        const double w = exp(sc_[kv] - mx);
        l += w;
        const float *vv = kv_at(sc, sc->v, s, kv, kvh);
        for (int i = 0; i < D; i++) acc[i] += w * vv[i];
    }
    for (int i = 0; i < D; i++) out[i] = (float)(acc[i] / l);
}

/* Random candidates per row: duplicates, out-of-range values, some empty rows. */
static void make_cands(const scene *sc, int32_t rows, int32_t *ci, int32_t *c, int32_t cap) {
    int32_t n = 0;
    ci[0] = 0;
    for (int32_t r = 0; r < rows; r++) {
        const uint32_t kind = rnd() % 8;
        int32_t cnt = kind == 0 ? 0 : (int32_t)(rnd() % 24);
        for (int32_t i = 0; i < cnt && n + 2 < cap; i++) {
            int32_t x = (int32_t)(rnd() % 46) - 3;
            if (kind == 1) x = 60 + (int32_t)(rnd() % 10); /* only out of range: an empty row */
            c[n++] = x;
            if (rnd() % 4 == 0) c[n++] = x; /* a duplicate */
        }
        ci[r + 1] = n;
    }
    (void)sc;
}

static void permute_rows(osp_sparse_wt *wt) {
    for (int32_t r = 0; r < wt->num_rows; r++) {
        const int32_t e0 = wt->indptr[r], n = wt->indptr[r + 1] - e0;
        for (int32_t i = n - 1; i > 0; i--) {
            const int32_t a = e0 + i, b = e0 + (int32_t)(rnd() % (uint32_t)(i + 1));
#define SW(arr)                                                                                                        \
    do {                                                                                                               \
        int32_t x_ = wt->arr[a];                                                                                       \
        wt->arr[a] = wt->arr[b], wt->arr[b] = x_;                                                                      \
    } while (0)
            SW(indices);
            SW(pages);
            SW(flags);
            SW(emask_off);
#undef SW
            for (int32_t w = 0; w < wt->mask_words; w++) {
                const uint32_t x = wt->tmask[a * wt->mask_words + w];
                wt->tmask[a * wt->mask_words + w] = wt->tmask[b * wt->mask_words + w];
                wt->tmask[b * wt->mask_words + w] = x;
            }
        }
    }
}

static void check_close(const float *got, const float *want, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        const float tol = 2e-5f + 2e-5f * fabsf(want[i]);
        if (!(fabsf(got[i] - want[i]) <= tol)) {
            print_error("%s: element %d: got %.8g want %.8g\n", what, i, (double)got[i], (double)want[i]);
            fail();
        }
    }
}

/* one configuration: H query heads, share mode, query tile, mask kind, candidates or dense */
static void run_case(int32_t H, osp_sparse_share share, int32_t q_tile, int mk, bool with_cands) {
    scene sc;
    make_scene(&sc, H);
    const osp_mask m = mask_of(mk);
    osp_sparse_layout L = {.num_tokens = sc.num_tokens, .positions = sc.pos, .num_seqs = sc.num_seqs,
                           .query_start_loc = sc.qsl, .seq_lens = sc.sl, .block_table = sc.bt,
                           .max_blocks_per_seq = MAXB, .block_size = BS, .n_head = H, .n_head_kv = HK,
                           .share = share, .q_tile = q_tile};
    const int32_t rows = osp_sparse_num_qtiles(&L) * osp_sparse_groups(&L);
    int32_t *ci = malloc(sizeof(int32_t) * ((size_t)rows + 1)), *c = malloc(sizeof(int32_t) * 64 * (size_t)rows);
    make_cands(&sc, rows, ci, c, 64 * rows);
    osp_sparse_cands C = {ci, c};
    osp_sparse_wt wt = {0};
    assert_int_equal(osp_sparse_wt_build(&wt, &L, with_cands ? &C : NULL, &m, D * 4), OSP_OK);
    const osp_cpu_kv_pages kv = {.k_type = OSP_DTYPE_F32, .v_type = OSP_DTYPE_F32, .k = sc.k, .v = sc.v};
    const size_t n = (size_t)sc.num_tokens * (size_t)H * D;
    float *out = malloc(sizeof(float) * n), *out2 = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n);
    osp_sparse_attn_args a = {.q = sc.q, .out = out, .kv = &kv, .L = &L, .wt = &wt, .mask = &m, .head_dim = D,
                              .scale = 0.25f};
    assert_int_equal(osp_sparse_attention_check(&a), OSP_OK);
    /* in two parts, as threads would split it */
    const int64_t items = (int64_t)sc.num_tokens * H;
    osp_sparse_attention_cpu(&a, 0, items / 3);
    osp_sparse_attention_cpu(&a, items / 3, items);
    for (int32_t t = 0; t < sc.num_tokens; t++)
        for (int32_t h = 0; h < H; h++)
            reference(&sc, H, &L, with_cands ? &C : NULL, &wt, &m, t, h, ref + ((size_t)t * (size_t)H + (size_t)h) * D);
    char what[128];
    snprintf(what, sizeof what, "H %d share %d q_tile %d mask %d cands %d", H, (int)share, q_tile, mk, with_cands);
    check_close(out, ref, (int)n, what);
    /* the tiles in another order: the same up to rounding */
    permute_rows(&wt);
    a.out = out2;
    osp_sparse_attention_cpu(&a, 0, items);
    check_close(out2, out, (int)n, what);
    /* the GPU's form of the masks (enum + emask bits) gives the same bits where the table is exact */
    if (m.kind != OSP_MASK_CUSTOM || share == OSP_SPARSE_PER_Q_HEAD) {
        a.table_masks = true;
        osp_sparse_attention_cpu(&a, 0, items);
        a.table_masks = false;
        check_close(out2, out, (int)n, what);
    }
    /* a table built for another layout is refused */
    L.q_tile = q_tile + 1;
    assert_int_equal(osp_sparse_attention_check(&a), OSP_ERR_INVALID_ARG);
    osp_sparse_wt_free(&wt);
    free(out), free(out2), free(ref), free(ci), free(c);
    free_scene(&sc);
}

static void test_attention_vs_dense(void **state) {
    (void)state;
    fill_docs();
    const int32_t heads[2] = {2, 4}; /* MHA (H = HK) and GQA groups of 2 */
    for (int hi = 0; hi < 2; hi++)
        for (int sh = 0; sh < 2; sh++)
            for (int qt = 0; qt < 2; qt++)
                for (int mk = 0; mk < N_MASKS; mk++)
                    for (int wc = 0; wc < 2; wc++)
                        run_case(heads[hi], (osp_sparse_share)sh, qt ? 4 : 1, mk, wc != 0);
}

/* Dense BlockMask tables skip what the mask empties: a sliding window loads O(window) tiles per row. */
static void test_blockmask_skips(void **state) {
    (void)state;
    scene sc;
    make_scene(&sc, 2);
    osp_sparse_layout L = {.num_tokens = sc.num_tokens, .positions = sc.pos, .num_seqs = sc.num_seqs,
                           .query_start_loc = sc.qsl, .seq_lens = sc.sl, .block_table = sc.bt,
                           .max_blocks_per_seq = MAXB, .block_size = BS, .n_head = 2, .n_head_kv = HK,
                           .share = OSP_SPARSE_PER_KV_HEAD, .q_tile = 1};
    const osp_mask win = {.kind = OSP_MASK_SLIDING_WINDOW, .window = 5};
    osp_sparse_wt wt = {0};
    assert_int_equal(osp_sparse_wt_build(&wt, &L, NULL, &win, 4), OSP_OK);
    for (int32_t r = 0; r < wt.num_rows; r++) assert_true(wt.row_tiles[r] <= 2); /* 5 keys span <= 2 pages of 8 */
    assert_true(wt.stats.physical_tiles < wt.stats.dense_tiles);
    const osp_mask causal = osp_mask_causal();
    assert_int_equal(osp_sparse_wt_build(&wt, &L, NULL, &causal, 4), OSP_OK);
    assert_int_equal(wt.stats.physical_tiles, wt.stats.dense_tiles);
    assert_true(wt.stats.full_tiles > 0 && wt.stats.partial_tiles > 0);
    osp_sparse_wt_free(&wt);
    free_scene(&sc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worktable_basic),
        cmocka_unit_test(test_worktable_order_buckets),
        cmocka_unit_test(test_mask_classify),
        cmocka_unit_test(test_attention_vs_dense),
        cmocka_unit_test(test_blockmask_skips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
