/* The DeepSeek Sparse Attention (DSA) lightning indexer as a CPU reference operator (DeepSeek-AI,
 * "DeepSeek-V3.2-Exp: Boosting Long-Context Efficiency with DeepSeek Sparse Attention", 2025, §2.1,
 * eq. 1): for query token t and preceding token s,
 *
 *     I(t, s) = sum_{j < H_I} w(t, j) * ReLU(q_I(t, j) . k_I(s))
 *
 * with H_I index heads (64 in DeepSeek-V3.2) of dimension d_I (128), one index key k_I(s) per token
 * shared by the heads, and per-head weights w(t, j) computed from the query token. Each query then
 * attends to the top-k (2048) tokens by I(t, s) among s <= positions[t] (the causal range).
 *
 * Index keys live in their own paged cache, [num_blocks, block_size, d_I], addressed through the same
 * block table as the KV cache: f32, or FP8 E4M3 codes with one fp32 scale per token ([num_blocks,
 * block_size]: DeepSeek keeps FP8 index keys with a scale per 128 values, i.e. per token at d_I = 128),
 * written by osp_dsa_key_write (scale = amax / 448, codes = e4m3(k / scale), nearest even).
 *
 * The top-k is tiled: scores are made one KV tile (page) at a time, each tile's entries are sorted and
 * merged into the running top-k (the serial form of a hierarchical merge), under the total order
 * "score descending, then position ascending" (stable ties; a NaN score counts as -inf). The result is
 * the exact top-k of that order, whatever the tiling. A context of at most k tokens is returned whole
 * (attention is then dense). Indices come out ascending, ready for the work table (worktable.h) as one
 * candidate list per query token (DeepSeek's MLA has one latent KV head; for GQA models give every KV
 * head row the same list). */
#ifndef OSP_SPARSE_DSA_INDEXER_H
#define OSP_SPARSE_DSA_INDEXER_H

#include <stdint.h>

#include "osprey/status.h"

typedef struct osp_dsa_args {
    const float *q;         /* [num_tokens, n_heads, head_dim] index queries q_I */
    const float *w;         /* [num_tokens, n_heads] head weights w(t, j) */
    const void *k_pages;    /* [num_blocks, block_size, head_dim] index keys: fp32, or E4M3 codes */
    const float *k_scales;  /* fp8: [num_blocks, block_size] per-token scales; NULL: fp32 keys */
    int32_t num_tokens, num_seqs;
    const int32_t *query_start_loc; /* [num_seqs + 1] */
    const int32_t *positions;       /* [num_tokens] */
    const int32_t *block_table;     /* [num_seqs, max_blocks_per_seq] */
    int32_t max_blocks_per_seq, block_size;
    int32_t n_heads, head_dim, top_k;
} osp_dsa_args;

/* Per token t: count[t] = min(positions[t] + 1, top_k) selected positions, ascending, in
 * idx[t * top_k ..] (the rest of the row is -1); scores (may be NULL) gets I(t, s) of each. Tokens
 * [t_begin, t_end) only (the caller splits tokens over threads). ws: 3 * top_k + block_size
 * (score, position) pairs of workspace (osp_dsa_workspace_pairs). Errors: OSP_ERR_INVALID_ARG for bad
 * shapes (sizes < 1, a position beyond the block table). */
typedef struct osp_dsa_pair {
    float score;
    int32_t pos;
} osp_dsa_pair;

int64_t osp_dsa_workspace_pairs(int32_t top_k, int32_t block_size);
osp_status osp_dsa_select(const osp_dsa_args *a, int32_t t_begin, int32_t t_end, osp_dsa_pair *ws, int32_t *idx,
                          float *scores, int32_t *count);

/* Writes index key k [head_dim] at slot `slot` of FP8 pages (codes [.., head_dim] and scales [..]) or,
 * with scales NULL, of fp32 pages. */
void osp_dsa_key_write(void *k_pages, float *k_scales, int64_t slot, const float *k, int32_t head_dim);

/* I(t, s) for one query (q [n_heads, head_dim], w [n_heads]) and one key row k [head_dim] (fp32), in
 * the operator's summation order. */
float osp_dsa_score(const float *q, const float *w, const float *k, int32_t n_heads, int32_t head_dim);

#endif
