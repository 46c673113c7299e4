/* Quest's page summaries and top-k page selection (Tang et al. 2024, "Quest: Query-Aware Sparsity for
 * Efficient Long-Context LLM Inference", ICML 2024, §3.2-3.3): beside the paged cache, every page
 * keeps, per layer and KV head, the channel-wise minimum m and maximum M of its keys. For a query q
 * the page's score is the upper bound  U = sum_i max(q_i m_i, q_i M_i)  of q.k over any key k in the
 * page; the pages with the highest bounds are read. Training-free; works for any model.
 *
 * Summaries are indexed by physical block id (like the pages), so they move with copy-on-write and
 * prefix-cache reuse as long as every write goes through osp_quest_summarize_block: the engine hook
 * recomputes a page's summary from its pages whenever a step writes into it (sparse/engine_hook.c). */
#ifndef OSP_SPARSE_QUEST_H
#define OSP_SPARSE_QUEST_H

#include <stdint.h>

#include "backend/cpu/ops.h"
#include "osprey/sparse.h"
#include "osprey/status.h"

typedef struct osp_quest_summaries {
    int32_t n_layer, num_blocks, block_size, n_head_kv, head_dim;
    float *kmin, *kmax; /* [n_layer, num_blocks, n_head_kv, head_dim] each; a block never summarized holds
                         * kmin = +inf, kmax = -inf (its bound is +inf, or NaN where some q_i = 0: such a
                         * page is never one of a sequence's written pages) */
} osp_quest_summaries;

/* Allocates the summaries (every page empty). OSP_ERR_INVALID_ARG for non-positive sizes or a size
 * beyond size_t, OSP_ERR_NOMEM. */
osp_status osp_quest_create(int32_t n_layer, int32_t num_blocks, int32_t block_size, int32_t n_head_kv,
                            int32_t head_dim, osp_quest_summaries *out);
void osp_quest_free(osp_quest_summaries *qs);

/* Recomputes block `block`'s summary in `layer` from its first n_valid slots (1..block_size) of the
 * K pages in kv (any page type: rows are read as attention reads them). */
void osp_quest_summarize_block(osp_quest_summaries *qs, int32_t layer, const osp_cpu_kv_pages *kv, int32_t block,
                               int32_t n_valid);

/* Quest's upper bound of q.k over a page with channel bounds kmin, kmax [head_dim]. */
float osp_quest_upper_bound(const float *q, const float *kmin, const float *kmax, int64_t head_dim);

/* Selection workspace for one query: at least the number of context pages. */
typedef struct osp_quest_scored {
    float score;
    int32_t page;
} osp_quest_scored;

/* The logical pages a query at position p reads from its sequence (block table row bt_row) in KV head
 * kvh of `layer`, under cfg (topk_pages, recent_pages, sink_pages):
 *  - n_ctx = p / block_size + 1 context pages; n_ctx <= topk_pages: every page (dense);
 *  - else the sink pages [0, S), the recent pages [n_ctx - R, n_ctx), and the topk - S - R others with
 *    the highest score, the score of a page being the largest Quest bound over the query heads q
 *    [n_q, head_dim] (the KV head's group: the pages are shared per KV head); ties go to the lower page
 *    index (stable), a NaN score counts as -inf.
 * Writes the pages ascending into pages_out [min(n_ctx, topk_pages)] and returns their count. ws:
 * [n_ctx] workspace. */
int32_t osp_quest_select(const osp_quest_summaries *qs, int32_t layer, const int32_t *bt_row, int32_t p,
                         const float *q, int32_t n_q, int32_t kvh, const osp_sparse_config *cfg, osp_quest_scored *ws,
                         int32_t *pages_out);

#endif
