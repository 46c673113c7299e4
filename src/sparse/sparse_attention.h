/* Block-sparse paged attention on the CPU (issue 15): the reference that the CUDA block-sparse kernels
 * are checked against. It reads only the KV tiles a work table (worktable.h) lists for each row and
 * merges them with the online softmax of FlashAttention (Dao et al. 2022, §3.1; Milakov & Gimelshein
 * 2018): per tile a local max m_t, local sum l_t = sum exp(s - m_t) and local weighted value
 * o_t = sum exp(s - m_t) v; the running state (m, l, o) becomes m' = max(m, m_t),
 * l' = l e^(m - m') + l_t e^(m_t - m'), o' = o e^(m - m') + o_t e^(m_t - m'); out = o / l. The result
 * depends on the set of kept elements, not on the order of the tiles, up to fp32 rounding.
 *
 * An element (query token t at position p, query head h, key position kv) is kept when its tile is in
 * t's row and: the entry is OSP_WT_FULL; or it is OSP_WT_SELF and kv == p; or it is partial, kv's bit
 * is set in the entry's tmask and the mask keeps (b, h, p, kv) (custom predicates are called per head
 * here; the GPU reads the table's emask). The score is q.k * scale, then score_mod when the mask has
 * one. A query with no kept element attends to its own position (out = v[p]), as the work table's
 * empty-row rule says. */
#ifndef OSP_SPARSE_SPARSE_ATTENTION_H
#define OSP_SPARSE_SPARSE_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/cpu/ops.h"
#include "osprey/status.h"
#include "sparse/worktable.h"

typedef struct osp_sparse_attn_args {
    const float *q;            /* [num_tokens, n_head, head_dim] fp32 */
    float *out;                /* [num_tokens, n_head, head_dim] fp32 */
    const osp_cpu_kv_pages *kv; /* one layer's pages [num_blocks, block_size, n_head_kv, head_dim] (ops.h) */
    const osp_sparse_layout *L; /* the layout the table was built for */
    const osp_sparse_wt *wt;
    const osp_mask *mask;      /* the mask the table was built with (NULL: causal) */
    int32_t head_dim;          /* <= 1024 */
    float scale;               /* softmax scale, usually 1 / sqrt(head_dim) */
    bool table_masks;          /* evaluate partial elements as a GPU kernel must: built-in kinds by
                                * osp_mask_builtin_keep, custom predicates from the table's emask bits (no
                                * function pointer); equal to the default when the table is exact (rows per
                                * query head, or a predicate independent of the head) */
} osp_sparse_attn_args;

/* Checks that the table matches the layout (rows, block size, groups) and the shapes:
 * OSP_ERR_INVALID_ARG with a message otherwise. Call once before splitting work over threads. */
osp_status osp_sparse_attention_check(const osp_sparse_attn_args *a);

/* Computes the work items [item_begin, item_end) of the num_tokens * n_head (token, head) pairs
 * (item = t * n_head + h), single-threaded: the caller splits items over a thread pool. Every item's
 * arithmetic is the same whatever the split. Arguments as osp_sparse_attention_check accepts. */
void osp_sparse_attention_cpu(const osp_sparse_attn_args *a, int64_t item_begin, int64_t item_end);

#endif
