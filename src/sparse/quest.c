/* Quest page summaries and selection (see quest.h). */
#include "sparse/quest.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"

osp_status osp_quest_create(int32_t n_layer, int32_t num_blocks, int32_t block_size, int32_t n_head_kv,
                            int32_t head_dim, osp_quest_summaries *out) {
    memset(out, 0, sizeof *out);
    if (n_layer < 1 || num_blocks < 1 || block_size < 1 || n_head_kv < 1 || head_dim < 1 || head_dim > 1024)
        return osp_set_error(OSP_ERR_INVALID_ARG, "quest: bad shape (%d layers, %d blocks, %d heads, head_dim %d)",
                             n_layer, num_blocks, n_head_kv, head_dim);
    const unsigned __int128 n = (unsigned __int128)n_layer * (unsigned)num_blocks * (unsigned)n_head_kv * (unsigned)head_dim;
    if (n * sizeof(float) > SIZE_MAX / 4) return osp_set_error(OSP_ERR_INVALID_ARG, "quest: summaries too large");
    out->kmin = malloc((size_t)n * sizeof(float));
    out->kmax = malloc((size_t)n * sizeof(float));
    if (!out->kmin || !out->kmax) {
        osp_quest_free(out);
        return osp_set_error(OSP_ERR_NOMEM, "quest: out of memory for page summaries");
    }
    for (size_t i = 0; i < (size_t)n; i++) out->kmin[i] = INFINITY, out->kmax[i] = -INFINITY;
    *out = (osp_quest_summaries){n_layer, num_blocks, block_size, n_head_kv, head_dim, out->kmin, out->kmax};
    return OSP_OK;
}

void osp_quest_free(osp_quest_summaries *qs) {
    if (!qs) return;
    free(qs->kmin), free(qs->kmax);
    memset(qs, 0, sizeof *qs);
}

void osp_quest_summarize_block(osp_quest_summaries *qs, int32_t layer, const osp_cpu_kv_pages *kv, int32_t block,
                               int32_t n_valid) {
    const int64_t D = qs->head_dim, HK = qs->n_head_kv, bs = qs->block_size;
    float row[1024];
    uint16_t half[1024];
    for (int64_t h = 0; h < HK; h++) {
        const size_t off = (((size_t)layer * (size_t)qs->num_blocks + (size_t)block) * (size_t)HK + (size_t)h) * (size_t)D;
        float *mn = qs->kmin + off, *mx = qs->kmax + off;
        for (int64_t d = 0; d < D; d++) mn[d] = INFINITY, mx[d] = -INFINITY;
        for (int64_t i = 0; i < n_valid && i < bs; i++) {
            const float *k = osp_cpu_kv_read_row(kv, 0, (int64_t)block * bs + i, h, HK, D, row, half);
            for (int64_t d = 0; d < D; d++) {
                if (k[d] < mn[d]) mn[d] = k[d];
                if (k[d] > mx[d]) mx[d] = k[d];
            }
        }
    }
}

float osp_quest_upper_bound(const float *q, const float *kmin, const float *kmax, int64_t head_dim) {
    float u = 0.0f;
    for (int64_t i = 0; i < head_dim; i++) {
        const float a = q[i] * kmin[i], b = q[i] * kmax[i];
        u += a > b ? a : b;
    }
    return u;
}

/* descending score, then ascending page (stable ties) */
static int by_score(const void *x, const void *y) {
    const osp_quest_scored *a = x, *b = y;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    return (a->page > b->page) - (a->page < b->page);
}

static int cmp_i32(const void *x, const void *y) {
    const int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

int32_t osp_quest_select(const osp_quest_summaries *qs, int32_t layer, const int32_t *bt_row, int32_t p,
                         const float *q, int32_t n_q, int32_t kvh, const osp_sparse_config *cfg, osp_quest_scored *ws,
                         int32_t *pages_out) {
    const int32_t bs = qs->block_size, n_ctx = p / bs + 1, D = qs->head_dim;
    if (n_ctx <= cfg->topk_pages) { /* the budget covers the context: dense */
        for (int32_t j = 0; j < n_ctx; j++) pages_out[j] = j;
        return n_ctx;
    }
    const int32_t S = cfg->sink_pages, R = cfg->recent_pages; /* S + R <= topk < n_ctx: no overlap */
    int32_t n = 0, m = 0;
    for (int32_t j = 0; j < S; j++) pages_out[n++] = j;
    for (int32_t j = n_ctx - R; j < n_ctx; j++) pages_out[n++] = j;
    for (int32_t j = S; j < n_ctx - R; j++) {
        const size_t off = (((size_t)layer * (size_t)qs->num_blocks + (size_t)bt_row[j]) * (size_t)qs->n_head_kv +
                            (size_t)kvh) * (size_t)D;
        float best = -INFINITY;
        for (int32_t h = 0; h < n_q; h++) {
            const float u = osp_quest_upper_bound(q + (size_t)h * (size_t)D, qs->kmin + off, qs->kmax + off, D);
            if (u > best) best = u; /* NaN never wins */
        }
        ws[m++] = (osp_quest_scored){best, j};
    }
    qsort(ws, (size_t)m, sizeof *ws, by_score);
    const int32_t k = cfg->topk_pages - S - R;
    for (int32_t i = 0; i < k && i < m; i++) pages_out[n++] = ws[i].page;
    qsort(pages_out, (size_t)n, sizeof *pages_out, cmp_i32);
    return n;
}
