/* libFuzzer target for the work-table builder (src/sparse/worktable.c): the table a GPU kernel trusts.
 *
 * Input: a byte stream read front to back (zeros past its end) that picks a small step (1-3 sequences,
 * block_size 1-40, q_tile 1-4, GQA group and share mode, query lengths, contexts, block table values,
 * sometimes too few block-table columns), a mask kind with its parameters (custom: a parity predicate)
 * and per row 0-9 candidates in [-8, 87] (out-of-range and duplicate ones included), or dense rows.
 * A rejected step must say why. An accepted one must be a well-formed table: indptr from 0 rising to
 * nnz, no empty row, logical tiles strictly ascending in each row, every page equal to its block-table
 * entry, no candidate bit at or past seq_len, FULL entries with every bit set, emask offsets inside
 * emask, row_order a permutation by descending tile count, bucket_ptr rising from 0 to num_rows. A
 * crash, a sanitizer report or a broken invariant is a bug. Seeds: tests/fuzz/corpus/worktable/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "osprey/status.h"
#include "sparse/worktable.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct rd {
    const uint8_t *p;
    size_t n;
} rd;
static uint32_t byte(rd *r) {
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}

static bool parity(const void *params, int32_t b, int32_t h, int32_t q, int32_t kv) {
    (void)params;
    return kv <= q && ((q + kv + h + b) % 3) != 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rd r = {data, size};
    int32_t qsl[4] = {0}, sl[3], pos[16], bt[3 * 8], docs[3 * 128];
    const int32_t nseq = 1 + (int32_t)(byte(&r) % 3), bs = 1 + (int32_t)(byte(&r) % 40);
    const int32_t q_tile = 1 + (int32_t)(byte(&r) % 4), hk = 1 + (int32_t)(byte(&r) % 2), grp = 1 + (int32_t)(byte(&r) % 2);
    const osp_sparse_share share = (osp_sparse_share)(byte(&r) % 2);
    int32_t T = 0;
    for (int32_t s = 0; s < nseq; s++) {
        const int32_t ql = (int32_t)(byte(&r) % 6), extra = (int32_t)(byte(&r) % 64);
        sl[s] = ql + extra;
        if (sl[s] == 0) sl[s] = 1;
        for (int32_t i = 0; i < ql; i++) pos[T++] = sl[s] - ql + i;
        qsl[s + 1] = T;
    }
    int32_t maxb = 1 + (int32_t)(byte(&r) % 8);
    for (int32_t i = 0; i < nseq * maxb; i++) bt[i] = (int32_t)(byte(&r) * 7 + byte(&r));
    for (int32_t i = 0; i < 3 * 128; i++) docs[i] = i / (4 + (int32_t)(data[0] % 9));
    osp_mask m = {.kind = (osp_mask_kind)(byte(&r) % (OSP_MASK_KIND_COUNT + 1))};
    m.window = (int32_t)(byte(&r) % 12) - 1, m.sinks = (int32_t)(byte(&r) % 6) - 1, m.prefix_len = (int32_t)(byte(&r) % 40) - 1;
    m.doc_ids = docs, m.doc_stride = 128, m.mask_mod = parity, m.head_dependent = byte(&r) & 1;
    const osp_sparse_layout L = {.num_tokens = T, .positions = pos, .num_seqs = nseq, .query_start_loc = qsl,
                                 .seq_lens = sl, .block_table = bt, .max_blocks_per_seq = maxb, .block_size = bs,
                                 .n_head = hk * grp, .n_head_kv = hk, .share = share, .q_tile = q_tile};
    const int32_t rows = osp_sparse_num_qtiles(&L) * osp_sparse_groups(&L);
    int32_t ci[16 * 4 + 1], cand[16 * 4 * 9];
    int32_t n = 0;
    ci[0] = 0;
    for (int32_t i = 0; i < rows && i < 64; i++) {
        const int32_t c = (int32_t)(byte(&r) % 10);
        for (int32_t j = 0; j < c; j++) cand[n++] = (int32_t)(byte(&r) % 96) - 8;
        ci[i + 1] = n;
    }
    const bool dense = byte(&r) % 4 == 0;
    const osp_sparse_cands C = {ci, cand};
    osp_sparse_wt wt = {0};
    const osp_status st = osp_sparse_wt_build(&wt, &L, dense ? NULL : &C, &m, 8);
    if (st != OSP_OK) {
        if (!osp_last_error()[0]) abort();
        osp_sparse_wt_free(&wt);
        return 0;
    }
    if (wt.num_rows != rows || wt.indptr[0] != 0 || wt.indptr[rows] != wt.stats.physical_tiles) abort();
    for (int32_t row = 0; row < rows; row++) {
        const int32_t s = wt.qtile_seq[row / wt.groups];
        if (wt.indptr[row + 1] <= wt.indptr[row]) abort(); /* no empty row */
        if (wt.row_tiles[row] != wt.indptr[row + 1] - wt.indptr[row]) abort();
        for (int32_t e = wt.indptr[row]; e < wt.indptr[row + 1]; e++) {
            if (e > wt.indptr[row] && wt.indices[e] <= wt.indices[e - 1]) abort();
            if (wt.indices[e] < 0 || wt.indices[e] >= maxb || wt.pages[e] != bt[s * maxb + wt.indices[e]]) abort();
            for (int32_t i = 0; i < bs; i++) {
                const bool bit = (wt.tmask[(size_t)e * (size_t)wt.mask_words + (size_t)(i / 32)] >> (i % 32)) & 1u;
                if (bit && wt.indices[e] * bs + i >= sl[s]) abort();
                if ((wt.flags[e] & OSP_WT_FULL) && !bit) abort();
            }
            if (wt.emask_off[e] >= 0 && (m.kind != OSP_MASK_CUSTOM || wt.emask_off[e] >= wt.emask_words)) abort();
        }
    }
    bool *seen = calloc((size_t)rows + 1, 1);
    for (int32_t i = 0; i < rows; i++) {
        const int32_t row = wt.row_order[i];
        if (row < 0 || row >= rows || seen[row]) abort();
        seen[row] = true;
        if (i > 0 && wt.row_tiles[row] > wt.row_tiles[wt.row_order[i - 1]]) abort();
    }
    free(seen);
    if (wt.bucket_ptr[0] != 0 || wt.bucket_ptr[wt.n_buckets] != rows) abort();
    for (int32_t i = 0; i < wt.n_buckets; i++)
        if (wt.bucket_ptr[i + 1] <= wt.bucket_ptr[i]) abort();
    osp_sparse_wt_free(&wt);
    return 0;
}
