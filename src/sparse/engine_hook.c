/* The sparse-attention hook of the CPU engine path (see engine_hook.h). prepare runs on one thread:
 * summaries, selection, work table; run splits (token, head) items over the pool like the dense op. */
#include "sparse/engine_hook.h"

#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "core/status_internal.h"
#include "sparse/quest.h"
#include "sparse/sparse_attention.h"
#include "sparse/worktable.h"

struct osp_sparse_runtime {
    osp_sparse_config cfg;
    /* a device runtime: the backend's summaries and counters (dev.kmin: one allocation holding both);
     * be retained while they live. Everything below dev is the host runtime's. */
    bool device;
    osp_dev_sparse dev;
    osp_backend *be;
    osp_attn_hook hook;
    osp_quest_summaries qs;
    osp_sparse_wt wt;
    osp_sparse_runtime_stats stats;
    /* this op's state, set by prepare and read by run */
    osp_sparse_layout L;
    osp_mask mask;
    osp_cpu_kv_pages pages;
    uint8_t *dense_tok;   /* [cap_tokens] 1: the token runs the dense kernel */
    int32_t *cand_indptr; /* [cap_rows + 1] */
    int32_t *cand;        /* [cap_cand] */
    int32_t *sel;         /* [cap_pages] one query's selected pages */
    osp_quest_scored *ws; /* [cap_pages] */
    float *scores;        /* [n_threads, cap_ctx] the dense kernel's workspace */
    int64_t cap_tokens, cap_rows, cap_cand, cap_pages, cap_ws, cap_ctx, cap_threads;
};

static osp_status grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return OSP_OK;
    int64_t n = *cap > 0 ? *cap : 256;
    while (n < need) n *= 2;
    void *q = realloc(*p, (size_t)n * elem);
    if (!q) return osp_set_error(OSP_ERR_NOMEM, "sparse attention: out of memory");
    *p = q;
    *cap = n;
    return OSP_OK;
}

static osp_status prepare(void *ctx, const osp_attn_call *c);
static void run(void *ctx, const osp_attn_call *c, int ith, int64_t i0, int64_t i1);

osp_status osp_sparse_runtime_create(const osp_sparse_config *cfg, const osp_kv_cache *kv, osp_sparse_runtime **out) {
    *out = NULL;
    OSP_TRY(osp_sparse_config_check(cfg));
    if (cfg->method == OSP_SPARSE_NONE) return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: the config is off");
    if (!kv || kv->k_fmt.head_dim < 1) return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: no KV cache");
    osp_sparse_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) return osp_set_error(OSP_ERR_NOMEM, "sparse attention: out of memory");
    rt->cfg = *cfg;
    const osp_status s = osp_quest_create(kv->n_layer, kv->num_blocks, kv->block_size,
                                          (int32_t)(kv->k_fmt.kv_row / kv->k_fmt.head_dim), kv->k_fmt.head_dim, &rt->qs);
    if (s != OSP_OK) {
        free(rt);
        return s;
    }
    rt->hook = (osp_attn_hook){prepare, run, rt};
    *out = rt;
    return OSP_OK;
}

int64_t osp_sparse_device_bytes_per_block(int32_t n_layer, int32_t n_head_kv, int32_t head_dim) {
    return 2 * 2 * (int64_t)n_layer * n_head_kv * head_dim; /* min and max, f16 */
}

osp_status osp_sparse_runtime_create_device(const osp_sparse_config *cfg, const osp_kv_cache *kv, int32_t n_head,
                                            osp_sparse_runtime **out) {
    *out = NULL;
    OSP_TRY(osp_sparse_config_check(cfg));
    if (cfg->method == OSP_SPARSE_NONE) return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: the config is off");
    if (!kv || !kv->be || kv->k_fmt.head_dim < 1 || kv->n_layer < 1 || kv->num_blocks < 1)
        return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: no KV cache");
    osp_backend *be = kv->be;
    char why[256] = "";
    if (!be->vt->supports_dev_sparse)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "sparse attention: the %s backend has no device sparse attention",
                             be->vt->name);
    if (!be->vt->supports_dev_sparse(be, kv, n_head, why, sizeof why))
        return osp_set_error(OSP_ERR_UNSUPPORTED, "sparse attention on the %s: %s", be->vt->name, why);
    const int32_t HK = (int32_t)(kv->k_fmt.kv_row / kv->k_fmt.head_dim), D = kv->k_fmt.head_dim;
    const unsigned __int128 half = (unsigned __int128)osp_sparse_device_bytes_per_block(kv->n_layer, HK, D) / 2 *
                                   (unsigned)kv->num_blocks;
    if (half > SIZE_MAX / 4) return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: summaries too large");
    osp_sparse_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) return osp_set_error(OSP_ERR_NOMEM, "sparse attention: out of memory");
    rt->cfg = *cfg;
    rt->device = true;
    void *mem = NULL;
    const osp_status s = be->vt->buffer_alloc(be, 2 * (size_t)half, "the Quest page summaries (sparse attention)", &mem);
    if (s != OSP_OK) {
        free(rt);
        return s;
    }
    osp_backend_retain(be);
    rt->be = be;
    rt->dev = (osp_dev_sparse){.topk_pages = cfg->topk_pages, .recent_pages = cfg->recent_pages,
                               .sink_pages = cfg->sink_pages, .n_layer = kv->n_layer, .num_blocks = kv->num_blocks,
                               .block_size = kv->block_size, .n_head_kv = HK, .head_dim = D, .kv_id = kv->id,
                               .kmin = mem, .kmax = (char *)mem + (size_t)half};
    *out = rt;
    return OSP_OK;
}

void osp_sparse_runtime_free(osp_sparse_runtime *rt) {
    if (!rt) return;
    if (rt->device) {
        rt->be->vt->buffer_free(rt->be, rt->dev.kmin);
        osp_backend_free(rt->be);
        free(rt);
        return;
    }
    osp_quest_free(&rt->qs);
    osp_sparse_wt_free(&rt->wt);
    free(rt->dense_tok), free(rt->cand_indptr), free(rt->cand), free(rt->sel), free(rt->ws), free(rt->scores);
    free(rt);
}

const osp_attn_hook *osp_sparse_runtime_hook(osp_sparse_runtime *rt) { return rt->device ? NULL : &rt->hook; }

osp_dev_sparse *osp_sparse_runtime_device(osp_sparse_runtime *rt) { return rt->device ? &rt->dev : NULL; }

osp_sparse_runtime_stats osp_sparse_runtime_get_stats(const osp_sparse_runtime *rt) {
    if (!rt->device) return rt->stats;
    return (osp_sparse_runtime_stats){.calls = rt->dev.calls,
                                      .dense_tokens = rt->dev.dense_tokens, .sparse_tokens = rt->dev.sparse_tokens,
                                      .tiles_read = rt->dev.tiles_read, .tiles_dense = rt->dev.tiles_dense,
                                      .bytes_read = rt->dev.bytes_read};
}

static osp_status prepare(void *ctx, const osp_attn_call *c) {
    osp_sparse_runtime *rt = ctx;
    const osp_batch *b = c->b;
    const osp_kv_cache *kv = c->kv;
    const int32_t layer = c->op->layer, H = c->op->p.attn.n_head, HK = c->op->p.attn.n_head_kv;
    const int32_t D = c->op->p.attn.head_dim, window = c->op->p.attn.window, bs = kv->block_size;
    const int32_t T = b->num_tokens, grp = H / HK;
    const int64_t FK = kv->k_fmt.fixed_scales_per_layer, FV = kv->v_fmt.fixed_scales_per_layer;
    if (kv->num_blocks != rt->qs.num_blocks || bs != rt->qs.block_size || HK != rt->qs.n_head_kv || D != rt->qs.head_dim ||
        layer < 0 || layer >= rt->qs.n_layer)
        return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: the runtime was made for another KV cache shape");
    rt->pages = (osp_cpu_kv_pages){.k_type = kv->k_fmt.elem_type, .v_type = kv->v_fmt.elem_type, .k = kv->k[layer],
                                   .v = kv->v[layer], .k_scale = kv->k_scale[layer], .v_scale = kv->v_scale[layer],
                                   .k_fixed = FK ? kv->k_fixed + layer * FK : NULL,
                                   .v_fixed = FV ? kv->v_fixed + layer * FV : NULL};
    /* one token's K + V bytes for one KV head (K and V may have different formats) */
    const int64_t kv_head_bytes2 = (int64_t)(kv->k_fmt.bytes_per_token + kv->v_fmt.bytes_per_token) / HK;
    rt->stats.calls++;
    /* 1. summaries of the pages this step wrote (the last write into each page covers the earlier ones) */
    int32_t s = 0;
    for (int32_t t = 0; t < T; t++) {
        while (s < b->num_seqs - 1 && t >= b->query_start_loc[s + 1]) s++;
        const int32_t slot = b->slot_mapping[t];
        if (slot < 0) continue;
        const bool later_same_page = t + 1 < b->query_start_loc[s + 1] && b->slot_mapping[t + 1] >= 0 &&
                                     b->slot_mapping[t + 1] / bs == slot / bs;
        if (!later_same_page) osp_quest_summarize_block(&rt->qs, layer, &rt->pages, slot / bs, b->positions[t] % bs + 1);
    }
    /* 2. per token: dense or selected pages (sliding-window layers: the BlockMask) */
    OSP_TRY(grow((void **)&rt->dense_tok, &rt->cap_tokens, T, 1));
    int64_t max_ctx = 0;
    for (int32_t i = 0; i < b->num_seqs; i++) max_ctx = b->seq_lens[i] > max_ctx ? b->seq_lens[i] : max_ctx;
    if (max_ctx > rt->cap_ctx || c->n_threads > rt->cap_threads) { /* each thread's slice is cap_ctx floats */
        const int64_t ctx_n = max_ctx > rt->cap_ctx ? max_ctx : rt->cap_ctx;
        const int64_t thr_n = c->n_threads > rt->cap_threads ? c->n_threads : rt->cap_threads;
        free(rt->scores);
        rt->scores = malloc((size_t)(ctx_n * thr_n > 0 ? ctx_n * thr_n : 1) * sizeof(float));
        if (!rt->scores) {
            rt->cap_ctx = rt->cap_threads = 0;
            return osp_set_error(OSP_ERR_NOMEM, "sparse attention: out of memory");
        }
        rt->cap_ctx = ctx_n, rt->cap_threads = thr_n;
    }
    const int64_t rows = (int64_t)T * HK;
    OSP_TRY(grow((void **)&rt->cand_indptr, &rt->cap_rows, rows + 1, sizeof *rt->cand_indptr));
    const int64_t max_pages = (max_ctx + bs - 1) / bs + 1;
    OSP_TRY(grow((void **)&rt->sel, &rt->cap_pages, max_pages, sizeof *rt->sel));
    OSP_TRY(grow((void **)&rt->ws, &rt->cap_ws, max_pages, sizeof *rt->ws));
    rt->mask = window > 0 ? (osp_mask){.kind = OSP_MASK_SLIDING_WINDOW, .window = window} : osp_mask_causal();
    int64_t nc = 0;
    s = 0;
    for (int32_t t = 0; t < T; t++) {
        while (s < b->num_seqs - 1 && t >= b->query_start_loc[s + 1]) s++;
        const int32_t p = b->positions[t];
        rt->dense_tok[t] = window <= 0 && p / bs + 1 <= rt->cfg.topk_pages;
        for (int32_t g = 0; g < HK; g++) {
            rt->cand_indptr[(int64_t)t * HK + g] = (int32_t)nc;
            if (rt->dense_tok[t] || window > 0) continue;
            const int32_t n = osp_quest_select(&rt->qs, layer, b->block_table + (size_t)s * (size_t)b->max_blocks_per_seq,
                                               p, c->q + ((size_t)t * (size_t)H + (size_t)g * (size_t)grp) * (size_t)D,
                                               grp, g, &rt->cfg, rt->ws, rt->sel);
            OSP_TRY(grow((void **)&rt->cand, &rt->cap_cand, nc + (int64_t)n * bs, sizeof *rt->cand));
            for (int32_t i = 0; i < n; i++)
                for (int32_t o = 0; o < bs && rt->sel[i] * bs + o <= p; o++) rt->cand[nc++] = rt->sel[i] * bs + o;
        }
    }
    rt->cand_indptr[rows] = (int32_t)nc;
    /* 3. the work table (rows of dense tokens stay empty: their self fallback is never read) */
    rt->L = (osp_sparse_layout){.num_tokens = T, .positions = b->positions, .num_seqs = b->num_seqs,
                                .query_start_loc = b->query_start_loc, .seq_lens = b->seq_lens,
                                .block_table = b->block_table, .max_blocks_per_seq = b->max_blocks_per_seq,
                                .block_size = bs, .n_head = H, .n_head_kv = HK, .share = OSP_SPARSE_PER_KV_HEAD,
                                .q_tile = 1};
    const osp_sparse_cands cands = {rt->cand_indptr, rt->cand};
    OSP_TRY(osp_sparse_wt_build(&rt->wt, &rt->L, window > 0 ? NULL : &cands, &rt->mask,
                                kv_head_bytes2 / 2));
    const osp_sparse_attn_args a = {.q = c->q, .out = c->out, .kv = &rt->pages, .L = &rt->L, .wt = &rt->wt,
                                    .mask = &rt->mask, .head_dim = D, .scale = c->op->p.attn.scale};
    OSP_TRY(osp_sparse_attention_check(&a));
    for (int32_t t = 0; t < T; t++) {
        if (rt->dense_tok[t]) {
            rt->stats.dense_tokens++;
            continue;
        }
        rt->stats.sparse_tokens++;
        for (int32_t g = 0; g < HK; g++) rt->stats.tiles_read += rt->wt.row_tiles[(int64_t)t * HK + g];
        rt->stats.tiles_dense += (int64_t)(b->positions[t] / bs + 1) * HK;
    }
    rt->stats.bytes_read = rt->stats.tiles_read * bs * kv_head_bytes2;
    return OSP_OK;
}

static void run(void *ctx, const osp_attn_call *c, int ith, int64_t i0, int64_t i1) {
    osp_sparse_runtime *rt = ctx;
    const osp_batch *b = c->b;
    const int64_t H = c->op->p.attn.n_head;
    const osp_sparse_attn_args a = {.q = c->q, .out = c->out, .kv = &rt->pages, .L = &rt->L, .wt = &rt->wt,
                                    .mask = &rt->mask, .head_dim = c->op->p.attn.head_dim, .scale = c->op->p.attn.scale};
    for (int64_t item = i0; item < i1; item++) {
        if (rt->dense_tok[item / H])
            osp_cpu_paged_attention_kv(c->q, &rt->pages, c->out, b->num_seqs, b->query_start_loc, b->positions,
                                       b->block_table, b->max_blocks_per_seq, c->kv->block_size, H,
                                       c->op->p.attn.n_head_kv, c->op->p.attn.head_dim, c->op->p.attn.scale,
                                       c->op->p.attn.window, rt->scores + (size_t)ith * (size_t)rt->cap_ctx, item,
                                       item + 1);
        else osp_sparse_attention_cpu(&a, item, item + 1);
    }
}
