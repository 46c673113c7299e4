/* The work decomposition both paged-attention kernels (attention.cu: v0, attention_mma.cu: v1) share.
 * A CTA serves up to `rows` query rows (token, head) of ONE sequence and ONE KV head: the query heads
 * of the KV head's GQA group that fit (groups wider than `rows` are cut into head chunks) times as many
 * tokens as fit (bq). Grid x: the query-tile slots, grid y: kv head x head chunk. Sequence s owns the
 * tile slots [qsl[s] / bq + s, qsl[s + 1] / bq + s + 1): enough for ceil(n_s / bq) tiles, so the grid
 * is T / bq + num_seqs (host scalars only: one captured graph serves every batch of the same T and
 * num_seqs) and a CTA finds its sequence by binary search of query_start_loc; slots past a sequence's
 * last tile (and zero-token sequences) have no work. */
#ifndef OSP_BACKEND_CUDA_ATTENTION_TILES_CUH
#define OSP_BACKEND_CUDA_ATTENTION_TILES_CUH

#include <stdint.h>

struct AttnTiling {
    int group;         /* n_head / n_head_kv */
    int heads_per_cta; /* query heads of one group served by one CTA (<= rows) */
    int head_chunks;   /* ceil(group / heads_per_cta) */
    int bq;            /* tokens per query tile: rows / heads_per_cta */
    int64_t n_tiles;   /* grid x: T / bq + num_seqs */
};

static inline AttnTiling attn_tiling(int64_t T, int32_t num_seqs, int n_head, int n_head_kv, int rows) {
    AttnTiling t;
    t.group = n_head / n_head_kv;
    t.head_chunks = (t.group + rows - 1) / rows;
    t.heads_per_cta = (t.group + t.head_chunks - 1) / t.head_chunks;
    t.bq = rows / t.heads_per_cta;
    t.n_tiles = T / t.bq + num_seqs;
    return t;
}

/* What CTA (blockIdx.x, blockIdx.y) serves: sequence s, tokens [t0, t0 + ntok), kv head kvh and its
 * query heads [h0, h0 + nh); row r of the CTA is token t0 + r / nh, head h0 + r % nh. */
struct AttnCtaWork {
    int s, t0, ntok, kvh, h0, nh;
};

/* false: this tile slot has no work (uniform over the CTA, so the CTA may return). heavy_first: slot
 * gridDim.x - 1 - blockIdx.x instead of blockIdx.x, so a causal prefill starts its longest query tiles
 * (the last ones, which see the most keys) first and the launch ends on short ones (the GPU starts
 * CTAs in block-index order; longest-first leaves a shorter tail). Which CTA serves a tile changes no
 * result. */
static __device__ __forceinline__ bool attn_cta_work(const AttnTiling &tl, const int32_t *qsl, int num_seqs,
                                                     AttnCtaWork &w, bool heavy_first = false) {
    /* the sequence of this tile slot: the last s with qsl[s] / bq + s <= x (strictly increasing in s) */
    const int x = heavy_first ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    int lo = 0, hi = num_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (qsl[mid] / tl.bq + mid <= x) lo = mid;
        else hi = mid - 1;
    }
    const int q_begin = qsl[lo], q_end = qsl[lo + 1];
    const int tile = x - (q_begin / tl.bq + lo);
    if (tile < 0 || (int64_t)tile * tl.bq >= (int64_t)q_end - q_begin) return false;
    w.s = lo;
    w.t0 = q_begin + tile * tl.bq;
    w.ntok = min(tl.bq, q_end - w.t0);
    const int hc = (int)blockIdx.y % tl.head_chunks;
    w.kvh = (int)blockIdx.y / tl.head_chunks;
    w.nh = min(tl.heads_per_cta, tl.group - hc * tl.heads_per_cta);
    w.h0 = w.kvh * tl.group + hc * tl.heads_per_cta;
    return true;
}

#endif
