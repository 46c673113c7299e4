/* Masks as predicates and their tile classification (see block_mask.h). The built-in kinds are
 * classified from a tile's corners: each is "kv <= q and (kv in a band below the diagonal, or kv a
 * sink)" or prefix-LM's "kv <= q or kv < P", whose kept sets are unions of intervals per query, so the
 * tile is full or empty exactly when the interval arithmetic says so. Documents and custom predicates
 * depend on data; they are evaluated element by element. */
#include "sparse/block_mask.h"

#include <stddef.h>

#include "core/status_internal.h"

osp_status osp_mask_validate(const osp_mask *m) {
    if (!m) return osp_set_error(OSP_ERR_INVALID_ARG, "mask: NULL");
    switch (m->kind) {
    case OSP_MASK_CAUSAL: return OSP_OK;
    case OSP_MASK_SLIDING_WINDOW:
        if (m->window < 1) return osp_set_error(OSP_ERR_INVALID_ARG, "mask: sliding window %d is not >= 1", m->window);
        return OSP_OK;
    case OSP_MASK_SINK_WINDOW:
        if (m->window < 0 || m->sinks < 0)
            return osp_set_error(OSP_ERR_INVALID_ARG, "mask: sinks %d / window %d must be >= 0", m->sinks, m->window);
        return OSP_OK;
    case OSP_MASK_DOCUMENT:
        if (!m->doc_ids || m->doc_stride < 1)
            return osp_set_error(OSP_ERR_INVALID_ARG, "mask: document mask needs doc_ids and doc_stride >= 1");
        return OSP_OK;
    case OSP_MASK_PREFIX_LM:
        if (m->prefix_len < 0) return osp_set_error(OSP_ERR_INVALID_ARG, "mask: prefix_len %d < 0", m->prefix_len);
        return OSP_OK;
    case OSP_MASK_CUSTOM:
        if (!m->mask_mod) return osp_set_error(OSP_ERR_INVALID_ARG, "mask: custom mask without mask_mod");
        return OSP_OK;
    default: return osp_set_error(OSP_ERR_INVALID_ARG, "mask: unknown kind %d", (int)m->kind);
    }
}

bool osp_mask_keep(const osp_mask *m, int32_t b, int32_t h, int32_t q, int32_t kv) {
    if (m->kind == OSP_MASK_CUSTOM) return m->mask_mod(m->mask_params, b, h, q, kv);
    const int32_t *doc = m->kind == OSP_MASK_DOCUMENT ? m->doc_ids + (size_t)b * (size_t)m->doc_stride : NULL;
    return osp_mask_builtin_keep(m->kind, m->window, m->sinks, m->prefix_len, doc, q, kv);
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Causal band masks: keep iff kv <= q and (kv < S or q - W < kv), with W >= 1 (the diagonal is always
 * in the band). Causal: W = "infinite", S = 0. */
static osp_tile_class classify_band(int64_t S, int64_t W, int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
    if (k0 > q1) return OSP_TILE_EMPTY; /* every key after every query */
    /* full: every key <= the first query, and every key a sink or inside the band of the last query
     * (the band of q is (q - W, q]; its lower end grows with q, so q1 is the binding one) */
    if (k1 <= q0 && (k1 < S || k0 > q1 - W)) return OSP_TILE_FULL;
    /* a band element exists iff some q in [q0, q1] has [max(k0, q - W + 1), min(k1, q)] non-empty */
    const bool band = max64(q0, k0) <= min64(q1, k1 + W - 1);
    const bool sink = k0 < S; /* k0 <= q1 holds here, so key k0 is kept by query q1 */
    return band || sink ? OSP_TILE_PARTIAL : OSP_TILE_EMPTY;
}

osp_tile_class osp_mask_classify(const osp_mask *m, int32_t b, int32_t h0, int32_t h1, int32_t q0, int32_t q1,
                                 int32_t k0, int32_t k1) {
    const int64_t inf = (int64_t)1 << 40;
    switch (m->kind) {
    case OSP_MASK_CAUSAL: return classify_band(0, inf, q0, q1, k0, k1);
    case OSP_MASK_SLIDING_WINDOW: return classify_band(0, m->window, q0, q1, k0, k1);
    case OSP_MASK_SINK_WINDOW: return classify_band(m->sinks, m->window > 0 ? m->window : 1, q0, q1, k0, k1);
    case OSP_MASK_PREFIX_LM:
        if (k1 <= q0 || k1 < m->prefix_len) return OSP_TILE_FULL;
        if (k0 > q1 && k0 >= m->prefix_len) return OSP_TILE_EMPTY;
        return OSP_TILE_PARTIAL;
    default: break;
    }
    /* DOCUMENT, CUSTOM: every element (DOCUMENT does not depend on the head) */
    if (m->kind != OSP_MASK_CUSTOM || !m->head_dependent) h1 = h0;
    int64_t kept = 0, total = 0;
    for (int32_t h = h0; h <= h1; h++)
        for (int32_t q = q0; q <= q1; q++)
            for (int32_t kv = k0; kv <= k1; kv++) {
                kept += osp_mask_keep(m, b, h, q, kv);
                total++;
            }
    return kept == 0 ? OSP_TILE_EMPTY : kept == total ? OSP_TILE_FULL : OSP_TILE_PARTIAL;
}
