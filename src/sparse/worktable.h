/* Work tables (issue 15): the layer between a sparse method's output (per query, the logical token
 * positions to attend to) and an attention kernel over the paged KV cache (which KV tiles each row
 * loads). The seed's pipeline: sort, deduplicate, map logical positions to physical pages through the
 * block table, merge into tiles, emit CSR (indptr / indices, as a block-sparse matrix, and as
 * FlashInfer's paged-KV CSR), so one launch serves a variable-length batch.
 *
 * Terms.
 *  - Query tile: q_tile consecutive query tokens of one sequence (the last tile of a sequence may be
 *    shorter). Decode and per-token selectors use q_tile = 1; a prefill kernel uses its CTA's rows.
 *  - Row: one query tile and one head group. share = OSP_SPARSE_PER_KV_HEAD: G = n_head_kv groups, the
 *    group's n_head / n_head_kv query heads share one candidate set (one K/V read serves them all);
 *    OSP_SPARSE_PER_Q_HEAD: G = n_head, every query head has its own set (reads more bytes). Row
 *    r = qtile * G + g. Query head h belongs to row g = h / (n_head / n_head_kv) or g = h; it reads
 *    KV head h / (n_head / n_head_kv) in both modes.
 *  - KV tile: one page of the cache: block_size consecutive logical positions [j * block_size,
 *    (j + 1) * block_size) of a sequence, its logical tile index j, stored in the physical block
 *    block_table[seq * max_blocks_per_seq + j]. A kernel may load several tiles per iteration.
 *
 * The table (all arrays flat, int32 / uint32, host memory; a GPU kernel gets a device copy of each
 * array and needs no other structure; nnz = indptr[num_rows]):
 *   indptr   [num_rows + 1]   row r's tiles are entries indptr[r] .. indptr[r + 1] - 1
 *   indices  [nnz]            logical tile index j of each entry (ascending within a row)
 *   pages    [nnz]            physical block of each entry (block_table mapped; see osp_sparse_wt_map_pages)
 *   flags    [nnz]            OSP_WT_FULL: every element of the entry is kept for every query of the row
 *                             (no bitmask, no predicate); else partial: an element (q, kv) is kept iff
 *                             its bit in tmask is set, kv < the row's seq_len, and the mask keeps it
 *                             (built-in kinds: osp_mask_builtin_keep; custom: its bit in emask);
 *                             OSP_WT_SELF: a fallback entry (empty row, see below): only kv == q is kept
 *   tmask    [nnz, mask_words] bit i of entry e (word i / 32, bit i % 32): logical position
 *                             j * block_size + i is a candidate of the row (all ones for dense rows)
 *   emask_off[nnz]            custom masks only (else all -1): offset in words into emask of the entry's
 *                             element bitmask, -1 when the entry is FULL; the bitmask has one bit per
 *                             (query of the tile, slot), bit qi * block_size + i, over
 *                             ceil(q_tile_len * block_size / 32) words
 *   emask    [emask_words]    element bitmasks of custom predicates (per row: exact when rows are per query
 *                             head, or the predicate does not depend on the head; head-dependent custom
 *                             masks with shared rows keep the union over the group, and the CPU kernel
 *                             re-evaluates the predicate per head)
 *   row_tiles[num_rows]       tiles per row (indptr[r + 1] - indptr[r])
 *   row_cands[num_rows]       logical candidates per row after sort, dedup and range limits
 *   row_order[num_rows]       rows by descending tile count (stable): longest first for a persistent
 *                             kernel that loops over rows
 *   bucket_ptr[n_buckets + 1] row_order cut into runs of equal ceil(log2(tiles)), longest first: bucket i
 *                             is row_order[bucket_ptr[i] .. bucket_ptr[i + 1] - 1], its tile counts within 2x
 *                             of each other, so a launch per bucket (or a persistent kernel) pads no row
 *                             beyond 2x
 *   qtile_start [num_qtiles + 1] first flat token index of each query tile (query_start_loc coordinates)
 *   qtile_seq   [num_qtiles]  the sequence of each query tile
 *
 * Logical ids and physical pages stay separate: indices (and the candidate bitmasks) are logical, so a
 * cached table survives page moves: after the block manager moves or swaps pages, call
 * osp_sparse_wt_map_pages with the new block table; `version` counts the mappings, so layers that
 * share one selection see when pages changed.
 *
 * Empty rows: a row whose candidates are all out of range (or that has none) would give a softmax over
 * nothing. It falls back to each query's own position: the table gets the tile(s) holding the row's
 * query positions, flagged OSP_WT_SELF, in which only kv == q is kept (the kernel then returns v[q]).
 * A query left with no kept key inside a non-empty row (a custom mask that drops the diagonal, or a
 * query tile whose candidates all lie after one of its queries) gets the same: out = v at its own
 * position, which the kernel reads through the block table.
 *
 * Costs the table reports (osp_sparse_wt_stats): logical candidates, physical tiles, bytes read (K and
 * V of every tile: a selector whose candidates scatter reads more than its token count says). */
#ifndef OSP_SPARSE_WORKTABLE_H
#define OSP_SPARSE_WORKTABLE_H

#include <stddef.h>
#include <stdint.h>

#include "osprey/status.h"
#include "sparse/block_mask.h"

typedef enum osp_sparse_share {
    OSP_SPARSE_PER_KV_HEAD = 0, /* a row per KV head: the query heads of a group share the candidates */
    OSP_SPARSE_PER_Q_HEAD = 1,  /* a row per query head */
} osp_sparse_share;

enum { OSP_WT_FULL = 1, OSP_WT_SELF = 2 };

/* The step's shape, in osp_batch's terms (all borrowed). */
typedef struct osp_sparse_layout {
    int32_t num_tokens;
    const int32_t *positions;       /* [num_tokens] */
    int32_t num_seqs;
    const int32_t *query_start_loc; /* [num_seqs + 1] */
    const int32_t *seq_lens;        /* [num_seqs] tokens in the cache (each query's position < its seq_len) */
    const int32_t *block_table;     /* [num_seqs, max_blocks_per_seq] */
    int32_t max_blocks_per_seq;
    int32_t block_size;
    int32_t n_head, n_head_kv;
    osp_sparse_share share;
    int32_t q_tile;                 /* queries per query tile, >= 1 */
} osp_sparse_layout;

/* Candidates: per row (r = qtile * G + g), logical token positions in the row's sequence, in any
 * order, duplicates allowed (they are merged, never counted twice). cand[cand_indptr[r] ..
 * cand_indptr[r + 1] - 1]. Positions < 0, >= the sequence's seq_len, or after the row's key limit are
 * dropped (the limit: the last query position of the row's tile, the causal limit; prefix-LM also keeps
 * the prefix, a custom mask everything below seq_len), and so are candidates in tiles the mask empties;
 * stats.dropped counts them with the duplicates. */
typedef struct osp_sparse_cands {
    const int32_t *cand_indptr; /* [num_rows + 1] */
    const int32_t *cand;        /* [cand_indptr[num_rows]] */
} osp_sparse_cands;

typedef struct osp_sparse_wt_stats {
    int64_t logical_candidates; /* kept candidate positions (dense rows: every position the mask allows) */
    int64_t dropped;            /* candidates dropped: duplicates and out-of-range positions */
    int64_t physical_tiles;     /* nnz */
    int64_t full_tiles, partial_tiles, self_tiles;
    int64_t empty_rows;         /* rows that fell back to their own positions */
    int64_t bytes_read;         /* nnz * block_size * 2 (K and V) * kv_head_bytes, per the caller's page format */
    int64_t dense_tiles;        /* what dense causal attention of the same rows would load, for comparison */
} osp_sparse_wt_stats;

typedef struct osp_sparse_wt {
    int32_t num_rows, num_qtiles, groups, block_size, mask_words, q_tile, n_buckets;
    int32_t *indptr, *indices, *pages, *flags, *emask_off, *row_tiles, *row_cands, *row_order, *bucket_ptr;
    uint32_t *tmask, *emask;
    int32_t *qtile_start, *qtile_seq;
    int64_t emask_words;
    uint64_t version;
    osp_sparse_wt_stats stats;
    /* capacities (the table grows only when a step needs more; a steady state allocates nothing) */
    int64_t cap_rows, cap_nnz, cap_emask, cap_qtiles, cap_scratch;
    int32_t *scratch;
} osp_sparse_wt;

/* Number of query tiles of a layout (the rows are this times G). */
int32_t osp_sparse_num_qtiles(const osp_sparse_layout *L);
/* Head groups per query tile: n_head_kv or n_head by L->share. */
int32_t osp_sparse_groups(const osp_sparse_layout *L);

/* Builds the work table of one step into wt (which must be zeroed or built before; its arrays are
 * reused and grown). cands: the candidates per row, or NULL for dense rows (every KV tile of the
 * sequence up to the tile's last query, then classified by the mask: a BlockMask). mask: the predicate
 * every element must also satisfy (NULL: causal); with candidates, tiles the mask empties are dropped.
 * kv_head_bytes: bytes of one token's K (or V) for one KV head in the page format, for
 * stats.bytes_read. Errors: OSP_ERR_INVALID_ARG (with a message) for bad shapes (n_head not a
 * multiple of n_head_kv, q_tile < 1, block_size < 1, a query position >= its seq_len, a tile beyond
 * max_blocks_per_seq) or a mask osp_mask_validate refuses; OSP_ERR_NOMEM. On error wt keeps its
 * buffers (free them with osp_sparse_wt_free) and its contents are unspecified. */
osp_status osp_sparse_wt_build(osp_sparse_wt *wt, const osp_sparse_layout *L, const osp_sparse_cands *cands,
                               const osp_mask *mask, int64_t kv_head_bytes);

/* Re-maps every entry's physical page from block_table [num_seqs, max_blocks_per_seq] (after pages
 * moved), and bumps wt->version. OSP_ERR_INVALID_ARG if a tile lies beyond max_blocks_per_seq or a
 * block id is negative. */
osp_status osp_sparse_wt_map_pages(osp_sparse_wt *wt, const int32_t *block_table, int32_t max_blocks_per_seq);

/* Frees the table's arrays (wt itself is the caller's) and zeroes it. */
void osp_sparse_wt_free(osp_sparse_wt *wt);

#endif
