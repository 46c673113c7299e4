/* Attention masks as predicates (issue 15), after PyTorch FlexAttention's abstraction (He, Guessous,
 * Liang, Dong, "FlexAttention: The Flexibility of PyTorch with the Performance of FlashAttention",
 * PyTorch blog, 2024; Dong et al., arXiv:2412.05496 §3): a mask is a predicate
 * mask_mod(b, h, q, kv) -> keep?, a score modifier score_mod(score, b, h, q, kv) -> score, and a
 * BlockMask that classifies each (query tile, KV tile) pair as full (every element kept: the predicate
 * is not evaluated), partial (evaluated per element) or empty (not loaded at all).
 *
 * Two forms of one mask:
 *  - the built-in kinds (osp_mask_kind) are an enum with parameters: any code, a GPU kernel included,
 *    evaluates them with osp_mask_builtin_keep() (a pure function of integers), and their tiles are
 *    classified in O(1) from the tile's corners;
 *  - OSP_MASK_CUSTOM carries a C function pointer and its params. It runs on the CPU only; for a GPU
 *    kernel the work-table builder (worktable.h) evaluates it on the host into per-tile element
 *    bitmasks (osp_sparse_wt.emask) that the kernel reads instead.
 *
 * Positions q and kv are logical token positions within sequence b (0-based, as osp_batch.positions);
 * h is the query head. Every built-in mask is causal (kv <= q) except prefix-LM, whose prefix is
 * bidirectional. Every built-in mask keeps the diagonal (kv == q), so no query of a built-in mask is
 * ever left without a key. */
#ifndef OSP_SPARSE_BLOCK_MASK_H
#define OSP_SPARSE_BLOCK_MASK_H

#include <stdbool.h>
#include <stdint.h>

#include "osprey/status.h"

typedef enum osp_mask_kind {
    OSP_MASK_CAUSAL = 0,        /* kv <= q */
    OSP_MASK_SLIDING_WINDOW = 1, /* q - window < kv <= q (Beltagy et al. 2020, Longformer §3.1; Gemma 3's local
                                  * layers: the last `window` positions including q) */
    OSP_MASK_SINK_WINDOW = 2,   /* kv <= q and (kv < sinks or q - window < kv): StreamingLLM's attention sinks
                                 * (Xiao et al. 2023, §3.2) beside a sliding window; window = 0: sinks + q only */
    OSP_MASK_DOCUMENT = 3,      /* kv <= q and doc[kv] == doc[q]: packed sequences, doc ids per position */
    OSP_MASK_PREFIX_LM = 4,     /* kv <= q or kv < prefix_len (bidirectional prefix; Raffel et al. 2020, T5 §3.2.1) */
    OSP_MASK_CUSTOM = 5,        /* mask_mod(params, b, h, q, kv); CPU only, bitmasks for the GPU */
    OSP_MASK_KIND_COUNT
} osp_mask_kind;

/* A predicate and its params. Return true to keep the (q, kv) element. */
typedef bool (*osp_mask_mod_fn)(const void *params, int32_t b, int32_t h, int32_t q, int32_t kv);
/* A score modifier: gets the scaled score q.k * scale and returns the score used in the softmax. It runs
 * on every kept element (full tiles included). NULL: none. */
typedef float (*osp_score_mod_fn)(const void *params, float score, int32_t b, int32_t h, int32_t q, int32_t kv);

typedef struct osp_mask {
    osp_mask_kind kind;
    int32_t window;     /* SLIDING_WINDOW (>= 1), SINK_WINDOW (>= 0) */
    int32_t sinks;      /* SINK_WINDOW: the first `sinks` positions are always kept (>= 0) */
    int32_t prefix_len; /* PREFIX_LM (>= 0) */
    const int32_t *doc_ids; /* DOCUMENT: [num_seqs, doc_stride] document id of each position of each sequence,
                             * borrowed; must cover every position the step reads */
    int32_t doc_stride;
    osp_mask_mod_fn mask_mod; /* CUSTOM */
    const void *mask_params;
    bool head_dependent; /* CUSTOM: mask_mod depends on h (a GQA row shared by a group of heads is then
                          * classified over all its heads) */
    osp_score_mod_fn score_mod; /* any kind; NULL: none */
    const void *score_params;
} osp_mask;

/* The plain causal mask. */
static inline osp_mask osp_mask_causal(void) { return (osp_mask){.kind = OSP_MASK_CAUSAL}; }

/* Checks a mask's parameters: OSP_ERR_INVALID_ARG with a message for an unknown kind, window < 1 for a
 * sliding window, negative sinks / window / prefix_len, DOCUMENT without doc_ids or with doc_stride < 1,
 * CUSTOM without mask_mod. */
osp_status osp_mask_validate(const osp_mask *m);

/* The built-in predicate, for kinds other than CUSTOM (which returns false here): plain integer
 * arithmetic, the form a GPU kernel evaluates. doc: the sequence's row of doc ids (DOCUMENT only). */
static inline bool osp_mask_builtin_keep(osp_mask_kind kind, int32_t window, int32_t sinks, int32_t prefix_len,
                                         const int32_t *doc, int32_t q, int32_t kv) {
    switch (kind) {
    case OSP_MASK_CAUSAL: return kv <= q;
    case OSP_MASK_SLIDING_WINDOW: return kv <= q && kv > q - window;
    case OSP_MASK_SINK_WINDOW: return kv <= q && (kv < sinks || kv > q - window || kv == q);
    case OSP_MASK_DOCUMENT: return kv <= q && doc[kv] == doc[q];
    case OSP_MASK_PREFIX_LM: return kv <= q || kv < prefix_len;
    default: return false;
    }
}

/* mask_mod of any kind: keep element (q, kv) of query head h in sequence b? */
bool osp_mask_keep(const osp_mask *m, int32_t b, int32_t h, int32_t q, int32_t kv);

/* How a block of elements relates to a mask. */
typedef enum osp_tile_class { OSP_TILE_EMPTY = 0, OSP_TILE_PARTIAL = 1, OSP_TILE_FULL = 2 } osp_tile_class;

/* Classifies the block of queries at positions [q0, q1] (inclusive; a query tile's positions are
 * consecutive) against keys [k0, k1] (inclusive) of sequence b, for the heads [h0, h1]. Built-in kinds
 * (DOCUMENT aside) are classified from the corners in O(1); DOCUMENT and CUSTOM evaluate every element.
 * Exact: FULL means every element is kept, EMPTY that none is. */
osp_tile_class osp_mask_classify(const osp_mask *m, int32_t b, int32_t h0, int32_t h1, int32_t q0, int32_t q1,
                                 int32_t k0, int32_t k1);

#endif
