/* Sparse attention's configuration (issue 15): which selector picks the KV pages each query reads.
 * Spelled on the command line as --sparse-attention VALUE:
 *
 *     topk:PAGES[,recent:R][,sink:S]
 *
 * Quest-style training-free top-k page selection (Tang et al. 2024, "Quest: Query-Aware Sparsity for
 * Efficient Long-Context LLM Inference", §3): every query token reads at most PAGES KV pages (of
 * block_size tokens) per KV head: the S first pages of its sequence (attention sinks, Xiao et al.
 * 2023), the R last pages up to its own (the recent window; R = 1 is the page holding the query), and
 * the best-scoring others by Quest's upper bound. Defaults: recent 1, sink 0. "off" turns it off.
 * Budget at or above the context: a query whose context fits in PAGES pages attends densely (the same
 * arithmetic as without sparse attention), by definition. On the CPU through an attention hook
 * (src/sparse/engine_hook.h); on a GPU by the backend itself (f16 KV pages, head_dim 64 or 128). */
#ifndef OSPREY_SPARSE_H
#define OSPREY_SPARSE_H

#include <stdint.h>

#include "osprey/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* New values are appended. */
typedef enum osp_sparse_method {
    OSP_SPARSE_NONE = 0, /* dense attention (the default) */
    OSP_SPARSE_TOPK = 1, /* Quest top-k pages per KV head */
} osp_sparse_method;

/* The largest page count any field takes (a budget beyond it is meaningless: 2^20 pages of 16 tokens
 * are 16M tokens). */
#define OSP_SPARSE_MAX_PAGES (1 << 20)

typedef struct osp_sparse_config {
    osp_sparse_method method;
    int32_t topk_pages;   /* PAGES: pages per query token and KV head, in [1, OSP_SPARSE_MAX_PAGES] */
    int32_t recent_pages; /* R: always read, in [0, PAGES - S] */
    int32_t sink_pages;   /* S: always read, in [0, PAGES - R] */
} osp_sparse_config;

/* Sparse attention off. */
osp_sparse_config osp_sparse_default_config(void);

/* Parses a --sparse-attention value (see above) into *out. Strict: lowercase keys, decimal digits only
 * (no sign, no spaces, no leading zeros beyond "0" itself), each key at most once, topk first.
 * OSP_ERR_INVALID_ARG with a message that names the problem (unknown method or key, a malformed or
 * out-of-range number, a budget of zero pages, recent + sink above the budget); *out is unchanged then. */
osp_status osp_sparse_config_parse(const char *value, osp_sparse_config *out);

/* Writes the canonical spelling ("off", "topk:64,recent:1,sink:0") into buf (always terminated). */
void osp_sparse_config_format(const osp_sparse_config *c, char *buf, int32_t n);

/* Checks a config made in code: the same rules as the parser. */
osp_status osp_sparse_config_check(const osp_sparse_config *c);

#ifdef __cplusplus
}
#endif
#endif
