/* Work-table builder (see worktable.h): candidates per row -> sorted, deduplicated, range-limited
 * logical positions -> KV tiles (pages) with per-tile candidate bitmasks, classified against the mask
 * (full / partial / empty) -> CSR over rows, plus the row ordering and length buckets a variable-length
 * launch needs. Everything is int32 / uint32 so the arrays go to a GPU as they are. */
#include "sparse/worktable.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"

/* ---- growing buffers ------------------------------------------------------------------------------ */

static osp_status grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return OSP_OK;
    int64_t n = *cap > 0 ? *cap : 64;
    while (n < need) n *= 2;
    void *q = realloc(*p, (size_t)n * elem);
    if (!q) return osp_set_error(OSP_ERR_NOMEM, "work table: out of memory (%lld entries)", (long long)n);
    *p = q;
    *cap = n;
    return OSP_OK;
}

/* arrays sized by rows, by entries, by query tiles */
static osp_status grow_rows(osp_sparse_wt *wt, int64_t rows) {
    if (rows + 1 <= wt->cap_rows) return OSP_OK;
    int64_t n = rows + 1, c;
#define G(a)                                                                                                           \
    c = wt->cap_rows;                                                                                                  \
    OSP_TRY(grow((void **)&wt->a, &c, n, sizeof *wt->a));
    G(indptr) G(row_tiles) G(row_cands) G(row_order) G(bucket_ptr)
#undef G
    wt->cap_rows = c;
    return OSP_OK;
}

static osp_status grow_nnz(osp_sparse_wt *wt, int64_t nnz) {
    if (nnz <= wt->cap_nnz) return OSP_OK;
    int64_t n = wt->cap_nnz > 0 ? wt->cap_nnz : 64, c;
    while (n < nnz) n *= 2;
#define G(a, m)                                                                                                        \
    c = wt->cap_nnz * (m);                                                                                             \
    OSP_TRY(grow((void **)&wt->a, &c, n * (m), sizeof *wt->a));
    G(indices, 1) G(pages, 1) G(flags, 1) G(emask_off, 1) G(tmask, wt->mask_words)
#undef G
    wt->cap_nnz = n;
    return OSP_OK;
}

/* ---- helpers ---------------------------------------------------------------------------------------- */

int32_t osp_sparse_groups(const osp_sparse_layout *L) {
    return L->share == OSP_SPARSE_PER_Q_HEAD ? L->n_head : L->n_head_kv;
}

int32_t osp_sparse_num_qtiles(const osp_sparse_layout *L) {
    if (!L || L->q_tile < 1 || !L->query_start_loc) return 0;
    int64_t n = 0;
    for (int32_t s = 0; s < L->num_seqs; s++) {
        const int64_t len = (int64_t)L->query_start_loc[s + 1] - L->query_start_loc[s];
        if (len > 0) n += (len + L->q_tile - 1) / L->q_tile;
    }
    return n > INT32_MAX ? 0 : (int32_t)n;
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int popcount32(uint32_t x) { return __builtin_popcount(x); }

static int32_t ceil_log2(int32_t c) {
    int32_t k = 0;
    while (((int64_t)1 << k) < c) k++;
    return k;
}

/* The last key position a row can keep under the mask: causal masks stop at the tile's last query;
 * prefix-LM also reaches the prefix; a custom predicate may keep anything in the cache. */
static int32_t key_limit(const osp_mask *m, int32_t qhi, int32_t seq_len) {
    int64_t hi = qhi;
    if (m->kind == OSP_MASK_PREFIX_LM && m->prefix_len - 1 > hi) hi = m->prefix_len - 1;
    if (m->kind == OSP_MASK_CUSTOM) hi = seq_len - 1;
    return (int32_t)(hi < seq_len - 1 ? hi : seq_len - 1);
}

typedef struct row_ctx {
    int32_t s, h0, h1, qlo, qhi, seq_len;
} row_ctx;

/* Appends one entry for logical tile j with candidate bits bits[mask_words] (only bits of positions <
 * seq_len set by the caller), classified against the mask; an empty tile is not appended. Returns the
 * number of candidates the entry keeps (0 when dropped) through *kept. */
static osp_status add_tile(osp_sparse_wt *wt, const osp_sparse_layout *L, const osp_mask *m, const row_ctx *rc,
                           int32_t j, const uint32_t *bits, int32_t flags_in, int64_t *nnz, int64_t *kept) {
    const int32_t bs = L->block_size, W = wt->mask_words;
    const int32_t k0 = j * bs, k1 = (k0 + bs - 1 < rc->seq_len - 1) ? k0 + bs - 1 : rc->seq_len - 1;
    int32_t flags = flags_in;
    *kept = 0;
    if (!(flags & OSP_WT_SELF)) {
        const osp_tile_class c = osp_mask_classify(m, rc->s, rc->h0, rc->h1, rc->qlo, rc->qhi, k0, k1);
        if (c == OSP_TILE_EMPTY) return OSP_OK;
        bool all = k0 + bs <= rc->seq_len;
        for (int32_t i = 0; i < bs && all; i++) all = (bits[i / 32] >> (i % 32)) & 1u;
        if (c == OSP_TILE_FULL && all) flags |= OSP_WT_FULL;
    }
    if (j >= L->max_blocks_per_seq)
        return osp_set_error(OSP_ERR_INVALID_ARG, "work table: tile %d of sequence %d is beyond max_blocks_per_seq %d", j,
                             rc->s, L->max_blocks_per_seq);
    OSP_TRY(grow_nnz(wt, *nnz + 1));
    const int64_t e = *nnz;
    wt->indices[e] = j;
    wt->pages[e] = L->block_table[(size_t)rc->s * (size_t)L->max_blocks_per_seq + (size_t)j];
    wt->flags[e] = flags;
    wt->emask_off[e] = -1;
    memcpy(wt->tmask + e * W, bits, (size_t)W * sizeof *bits);
    for (int32_t w = 0; w < W; w++) *kept += popcount32(bits[w]);
    /* a custom predicate's element bitmask for the GPU (union over the row's heads) */
    if (m->kind == OSP_MASK_CUSTOM && !(flags & (OSP_WT_FULL | OSP_WT_SELF))) {
        const int32_t nq = rc->qhi - rc->qlo + 1;
        const int64_t words = ((int64_t)nq * bs + 31) / 32;
        int64_t cap = wt->cap_emask;
        OSP_TRY(grow((void **)&wt->emask, &cap, wt->emask_words + words, sizeof *wt->emask));
        wt->cap_emask = cap;
        uint32_t *em = wt->emask + wt->emask_words;
        memset(em, 0, (size_t)words * sizeof *em);
        for (int32_t qi = 0; qi < nq; qi++)
            for (int32_t i = 0; i < bs; i++) {
                if (!((bits[i / 32] >> (i % 32)) & 1u)) continue;
                bool keep = false;
                for (int32_t h = rc->h0; h <= rc->h1 && !keep; h++) keep = osp_mask_keep(m, rc->s, h, rc->qlo + qi, k0 + i);
                if (keep) em[(qi * bs + i) / 32] |= 1u << ((qi * bs + i) % 32);
            }
        wt->emask_off[e] = (int32_t)wt->emask_words;
        wt->emask_words += words;
    }
    *nnz = e + 1;
    return OSP_OK;
}

/* ---- the builder ------------------------------------------------------------------------------------ */

static osp_status check_layout(const osp_sparse_layout *L) {
    if (!L || !L->positions || !L->query_start_loc || !L->seq_lens || !L->block_table)
        return osp_set_error(OSP_ERR_INVALID_ARG, "work table: layout arrays missing");
    if (L->block_size < 1 || L->q_tile < 1 || L->n_head_kv < 1 || L->n_head < L->n_head_kv ||
        L->n_head % L->n_head_kv || L->num_seqs < 0 || L->max_blocks_per_seq < 1 || L->num_tokens < 0)
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "work table: bad shape (block_size %d, q_tile %d, n_head %d, n_head_kv %d, "
                             "num_seqs %d, max_blocks_per_seq %d)",
                             L->block_size, L->q_tile, L->n_head, L->n_head_kv, L->num_seqs, L->max_blocks_per_seq);
    if (L->share != OSP_SPARSE_PER_KV_HEAD && L->share != OSP_SPARSE_PER_Q_HEAD)
        return osp_set_error(OSP_ERR_INVALID_ARG, "work table: unknown share mode %d", (int)L->share);
    if (L->query_start_loc[0] != 0 || L->query_start_loc[L->num_seqs] != L->num_tokens)
        return osp_set_error(OSP_ERR_INVALID_ARG, "work table: query_start_loc must run from 0 to num_tokens");
    for (int32_t s = 0; s < L->num_seqs; s++) {
        if (L->query_start_loc[s + 1] < L->query_start_loc[s])
            return osp_set_error(OSP_ERR_INVALID_ARG, "work table: query_start_loc decreases at sequence %d", s);
        for (int32_t t = L->query_start_loc[s]; t < L->query_start_loc[s + 1]; t++) {
            if (L->positions[t] < 0 || L->positions[t] >= L->seq_lens[s])
                return osp_set_error(OSP_ERR_INVALID_ARG, "work table: token %d at position %d, seq_len %d", t,
                                     L->positions[t], L->seq_lens[s]);
            if (t > L->query_start_loc[s] && L->positions[t] != L->positions[t - 1] + 1 && L->q_tile > 1)
                return osp_set_error(OSP_ERR_INVALID_ARG,
                                     "work table: query tiles need consecutive positions (token %d)", t);
        }
    }
    return OSP_OK;
}

osp_status osp_sparse_wt_build(osp_sparse_wt *wt, const osp_sparse_layout *L, const osp_sparse_cands *cands,
                               const osp_mask *mask, int64_t kv_head_bytes) {
    const osp_mask causal = osp_mask_causal();
    const osp_mask *m = mask ? mask : &causal;
    OSP_TRY(check_layout(L));
    OSP_TRY(osp_mask_validate(m));
    const int32_t G = osp_sparse_groups(L), bs = L->block_size, W = (bs + 31) / 32;
    const int32_t nqt = osp_sparse_num_qtiles(L), grp = L->n_head / L->n_head_kv;
    const int64_t rows = (int64_t)nqt * G;
    if (rows > INT32_MAX / 2) return osp_set_error(OSP_ERR_INVALID_ARG, "work table: %lld rows", (long long)rows);
    if (wt->mask_words != W) { /* the bitmask stride changed: the entry arrays restart */
        free(wt->tmask);
        wt->tmask = NULL;
        wt->cap_nnz = 0;
        free(wt->indices), free(wt->pages), free(wt->flags), free(wt->emask_off);
        wt->indices = wt->pages = wt->flags = wt->emask_off = NULL;
    }
    wt->mask_words = W;
    wt->block_size = bs;
    wt->q_tile = L->q_tile;
    wt->groups = G;
    wt->num_rows = (int32_t)rows;
    wt->num_qtiles = nqt;
    wt->emask_words = 0;
    memset(&wt->stats, 0, sizeof wt->stats);
    OSP_TRY(grow_rows(wt, rows));
    {
        int64_t c = wt->cap_qtiles, c2 = wt->cap_qtiles;
        OSP_TRY(grow((void **)&wt->qtile_start, &c, nqt + 1, sizeof *wt->qtile_start));
        OSP_TRY(grow((void **)&wt->qtile_seq, &c2, nqt + 1, sizeof *wt->qtile_seq));
        wt->cap_qtiles = c < c2 ? c : c2;
    }
    int32_t qt = 0;
    for (int32_t s = 0; s < L->num_seqs; s++)
        for (int32_t t = L->query_start_loc[s]; t < L->query_start_loc[s + 1]; t += L->q_tile) {
            wt->qtile_start[qt] = t;
            wt->qtile_seq[qt++] = s;
        }
    wt->qtile_start[nqt] = L->num_tokens;

    uint32_t bits[64]; /* block_size <= 2048 */
    if (W > 64) return osp_set_error(OSP_ERR_INVALID_ARG, "work table: block_size %d > 2048", bs);
    int64_t nnz = 0;
    for (int64_t r = 0; r < rows; r++) {
        const int32_t q = (int32_t)(r / G), g = (int32_t)(r % G), s = wt->qtile_seq[q];
        const int32_t t0 = wt->qtile_start[q];
        int32_t t1 = t0 + L->q_tile;
        if (t1 > L->query_start_loc[s + 1]) t1 = L->query_start_loc[s + 1];
        row_ctx rc = {.s = s, .qlo = L->positions[t0], .qhi = L->positions[t1 - 1], .seq_len = L->seq_lens[s]};
        rc.h0 = L->share == OSP_SPARSE_PER_Q_HEAD ? g : g * grp;
        rc.h1 = L->share == OSP_SPARSE_PER_Q_HEAD ? g : g * grp + grp - 1;
        const int32_t hi = key_limit(m, rc.qhi, rc.seq_len);
        wt->indptr[r] = (int32_t)nnz;
        wt->stats.dense_tiles += rc.qhi / bs + 1;
        int64_t row_kept = 0;
        if (!cands) { /* dense row: every tile up to the key limit, the mask decides */
            for (int32_t j = 0; j <= hi / bs; j++) {
                memset(bits, 0, sizeof bits);
                for (int32_t i = 0; i < bs && j * bs + i <= hi; i++) bits[i / 32] |= 1u << (i % 32);
                int64_t kept;
                OSP_TRY(add_tile(wt, L, m, &rc, j, bits, 0, &nnz, &kept));
                row_kept += kept;
            }
        } else {
            const int32_t c0 = cands->cand_indptr[r], c1 = cands->cand_indptr[r + 1];
            if (c1 < c0 || c0 < 0)
                return osp_set_error(OSP_ERR_INVALID_ARG, "work table: cand_indptr decreases at row %lld", (long long)r);
            int64_t cs = wt->cap_scratch;
            OSP_TRY(grow((void **)&wt->scratch, &cs, (int64_t)(c1 - c0) + 1, sizeof *wt->scratch));
            wt->cap_scratch = cs;
            int32_t n = 0;
            for (int32_t i = c0; i < c1; i++) /* range limits: [0, the key limit] */
                if (cands->cand[i] >= 0 && cands->cand[i] <= hi) wt->scratch[n++] = cands->cand[i];
            qsort(wt->scratch, (size_t)n, sizeof *wt->scratch, cmp_i32);
            int32_t u = 0;
            for (int32_t i = 0; i < n; i++) /* deduplicate */
                if (u == 0 || wt->scratch[i] != wt->scratch[u - 1]) wt->scratch[u++] = wt->scratch[i];
            int64_t cand_kept = 0;
            for (int32_t i = 0; i < u;) { /* merge by tile */
                const int32_t j = wt->scratch[i] / bs;
                memset(bits, 0, sizeof bits);
                int32_t cnt = 0;
                for (; i < u && wt->scratch[i] / bs == j; i++, cnt++) {
                    const int32_t o = wt->scratch[i] % bs;
                    bits[o / 32] |= 1u << (o % 32);
                }
                int64_t kept;
                OSP_TRY(add_tile(wt, L, m, &rc, j, bits, 0, &nnz, &kept));
                cand_kept += kept;
            }
            row_kept = cand_kept;
            wt->stats.dropped += (c1 - c0) - cand_kept;
        }
        if (nnz == wt->indptr[r]) { /* empty row: each query's own position (see the header) */
            wt->stats.empty_rows++;
            for (int32_t j = rc.qlo / bs; j <= rc.qhi / bs; j++) {
                memset(bits, 0, sizeof bits);
                for (int32_t i = 0; i < bs; i++)
                    if (j * bs + i >= rc.qlo && j * bs + i <= rc.qhi) bits[i / 32] |= 1u << (i % 32);
                int64_t kept;
                OSP_TRY(add_tile(wt, L, m, &rc, j, bits, OSP_WT_SELF, &nnz, &kept));
                (void)kept;
            }
            row_kept = 0;
        }
        wt->row_tiles[r] = (int32_t)(nnz - wt->indptr[r]);
        wt->row_cands[r] = (int32_t)row_kept;
        wt->stats.logical_candidates += row_kept;
    }
    wt->indptr[rows] = (int32_t)nnz;
    for (int64_t e = 0; e < nnz; e++) {
        if (wt->flags[e] & OSP_WT_SELF) wt->stats.self_tiles++;
        else if (wt->flags[e] & OSP_WT_FULL) wt->stats.full_tiles++;
        else wt->stats.partial_tiles++;
    }
    wt->stats.physical_tiles = nnz;
    wt->stats.bytes_read = nnz * bs * 2 * kv_head_bytes;

    /* rows by descending tile count, stable (counting sort over the counts), then buckets by
     * ceil(log2(tiles)) */
    int32_t max_tiles = 0;
    for (int64_t r = 0; r < rows; r++)
        if (wt->row_tiles[r] > max_tiles) max_tiles = wt->row_tiles[r];
    int64_t cs = wt->cap_scratch;
    OSP_TRY(grow((void **)&wt->scratch, &cs, (int64_t)max_tiles + 2, sizeof *wt->scratch));
    wt->cap_scratch = cs;
    int32_t *cnt = wt->scratch;
    memset(cnt, 0, ((size_t)max_tiles + 2) * sizeof *cnt);
    for (int64_t r = 0; r < rows; r++) cnt[max_tiles - wt->row_tiles[r] + 1]++;
    for (int32_t i = 1; i <= max_tiles + 1; i++) cnt[i] += cnt[i - 1];
    for (int64_t r = 0; r < rows; r++) wt->row_order[cnt[max_tiles - wt->row_tiles[r]]++] = (int32_t)r;
    wt->n_buckets = 0;
    for (int64_t i = 0; i < rows; i++) {
        const int32_t k = ceil_log2(wt->row_tiles[wt->row_order[i]]);
        if (i == 0 || k != ceil_log2(wt->row_tiles[wt->row_order[i - 1]])) wt->bucket_ptr[wt->n_buckets++] = (int32_t)i;
    }
    wt->bucket_ptr[wt->n_buckets] = (int32_t)rows;
    wt->version++;
    return OSP_OK;
}

osp_status osp_sparse_wt_map_pages(osp_sparse_wt *wt, const int32_t *block_table, int32_t max_blocks_per_seq) {
    for (int32_t r = 0; r < wt->num_rows; r++) {
        const int32_t s = wt->qtile_seq[r / wt->groups];
        for (int32_t e = wt->indptr[r]; e < wt->indptr[r + 1]; e++) {
            if (wt->indices[e] >= max_blocks_per_seq)
                return osp_set_error(OSP_ERR_INVALID_ARG, "work table: tile %d beyond max_blocks_per_seq %d",
                                     wt->indices[e], max_blocks_per_seq);
            const int32_t p = block_table[(size_t)s * (size_t)max_blocks_per_seq + (size_t)wt->indices[e]];
            if (p < 0) return osp_set_error(OSP_ERR_INVALID_ARG, "work table: tile %d maps to block %d", wt->indices[e], p);
            wt->pages[e] = p;
        }
    }
    wt->version++;
    return OSP_OK;
}

void osp_sparse_wt_free(osp_sparse_wt *wt) {
    if (!wt) return;
    free(wt->indptr), free(wt->indices), free(wt->pages), free(wt->flags), free(wt->emask_off);
    free(wt->row_tiles), free(wt->row_cands), free(wt->row_order), free(wt->bucket_ptr);
    free(wt->tmask), free(wt->emask), free(wt->qtile_start), free(wt->qtile_seq), free(wt->scratch);
    memset(wt, 0, sizeof *wt);
}
