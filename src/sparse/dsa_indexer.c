/* DSA lightning indexer, CPU reference (see dsa_indexer.h): scores per page, sorted per page, merged
 * into a running top-k. */
#include "sparse/dsa_indexer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/status_internal.h"

int64_t osp_dsa_workspace_pairs(int32_t top_k, int32_t block_size) { return 3 * (int64_t)top_k + block_size; }

float osp_dsa_score(const float *q, const float *w, const float *k, int32_t n_heads, int32_t head_dim) {
    float s = 0.0f;
    for (int32_t j = 0; j < n_heads; j++) {
        const float d = osp_cpu_dot(q + (size_t)j * (size_t)head_dim, k, head_dim);
        s += w[j] * (d > 0.0f ? d : 0.0f);
    }
    return s;
}

void osp_dsa_key_write(void *k_pages, float *k_scales, int64_t slot, const float *k, int32_t head_dim) {
    if (!k_scales) {
        memcpy((float *)k_pages + slot * head_dim, k, sizeof(float) * (size_t)head_dim);
        return;
    }
    float amax = 0.0f;
    for (int32_t d = 0; d < head_dim; d++) amax = fabsf(k[d]) > amax ? fabsf(k[d]) : amax;
    const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
    uint8_t *c = (uint8_t *)k_pages + slot * head_dim;
    for (int32_t d = 0; d < head_dim; d++) c[d] = osp_fp32_to_e4m3(k[d] / s);
    k_scales[slot] = s;
}

/* the order: score descending (NaN as -inf), then position ascending */
static int before(osp_dsa_pair a, osp_dsa_pair b) {
    const float x = isnan(a.score) ? -INFINITY : a.score, y = isnan(b.score) ? -INFINITY : b.score;
    if (x != y) return x > y;
    return a.pos < b.pos;
}

static int cmp_pair(const void *pa, const void *pb) {
    const osp_dsa_pair a = *(const osp_dsa_pair *)pa, b = *(const osp_dsa_pair *)pb;
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

static int cmp_pos(const void *pa, const void *pb) {
    const osp_dsa_pair a = *(const osp_dsa_pair *)pa, b = *(const osp_dsa_pair *)pb;
    return (a.pos > b.pos) - (a.pos < b.pos);
}

osp_status osp_dsa_select(const osp_dsa_args *a, int32_t t_begin, int32_t t_end, osp_dsa_pair *ws, int32_t *idx,
                          float *scores, int32_t *count) {
    if (!a || !a->q || !a->w || !a->k_pages || !a->positions || !a->query_start_loc || !a->block_table || !ws || !idx ||
        !count || a->n_heads < 1 || a->head_dim < 1 || a->head_dim > 1024 || a->top_k < 1 || a->block_size < 1 ||
        a->max_blocks_per_seq < 1 || a->num_seqs < 1 || t_begin < 0 || t_end > a->num_tokens || t_begin > t_end)
        return osp_set_error(OSP_ERR_INVALID_ARG, "dsa indexer: bad arguments");
    const int32_t K = a->top_k, bs = a->block_size, D = a->head_dim;
    osp_dsa_pair *best = ws, *tile = ws + K, *merged = ws + K + bs; /* merged: [2K] */
    float row[1024];
    int32_t s = 0;
    for (int32_t t = t_begin; t < t_end; t++) {
        while (s < a->num_seqs - 1 && t >= a->query_start_loc[s + 1]) s++;
        const int32_t p = a->positions[t];
        if (p < 0 || p / bs >= a->max_blocks_per_seq)
            return osp_set_error(OSP_ERR_INVALID_ARG, "dsa indexer: token %d at position %d is outside the block table", t, p);
        const int32_t *bt = a->block_table + (size_t)s * (size_t)a->max_blocks_per_seq;
        const float *qt = a->q + (size_t)t * (size_t)a->n_heads * (size_t)D, *wt = a->w + (size_t)t * (size_t)a->n_heads;
        int32_t n = 0; /* entries in best, sorted by the order */
        for (int32_t j = 0; j <= p / bs; j++) {
            int32_t m = 0;
            for (int32_t i = 0; i < bs && j * bs + i <= p; i++) {
                const int64_t slot = (int64_t)bt[j] * bs + i;
                const float *k;
                if (a->k_scales) {
                    const uint8_t *c = (const uint8_t *)a->k_pages + slot * D;
                    for (int32_t d = 0; d < D; d++) row[d] = osp_e4m3_to_fp32(c[d]) * a->k_scales[slot];
                    k = row;
                } else k = (const float *)a->k_pages + slot * D;
                tile[m++] = (osp_dsa_pair){osp_dsa_score(qt, wt, k, a->n_heads, D), j * bs + i};
            }
            qsort(tile, (size_t)m, sizeof *tile, cmp_pair);
            /* merge best [n] and tile [m], keep the first K */
            int32_t x = 0, y = 0, z = 0;
            while (z < K && (x < n || y < m)) merged[z++] = (y >= m || (x < n && before(best[x], tile[y]))) ? best[x++] : tile[y++];
            memcpy(best, merged, sizeof *best * (size_t)z);
            n = z;
        }
        qsort(best, (size_t)n, sizeof *best, cmp_pos);
        for (int32_t i = 0; i < K; i++) {
            idx[(size_t)t * (size_t)K + (size_t)i] = i < n ? best[i].pos : -1;
            if (scores) scores[(size_t)t * (size_t)K + (size_t)i] = i < n ? best[i].score : 0.0f;
        }
        count[t] = n;
    }
    return OSP_OK;
}
