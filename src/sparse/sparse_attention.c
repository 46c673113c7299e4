/* Block-sparse paged attention, CPU reference (see sparse_attention.h). Plain loops: a (token, head)
 * item walks its row's tiles in table order, scores the kept elements of each tile, reduces the tile to
 * (m_t, l_t, o_t) and merges it into the running state. */
#include "sparse/sparse_attention.h"

#include <math.h>
#include <string.h>

#include "core/status_internal.h"

#define MAX_HEAD_DIM 1024
#define MAX_BLOCK 2048

osp_status osp_sparse_attention_check(const osp_sparse_attn_args *a) {
    if (!a || !a->q || !a->out || !a->kv || !a->L || !a->wt)
        return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: NULL argument");
    const osp_sparse_layout *L = a->L;
    const osp_sparse_wt *wt = a->wt;
    if (a->head_dim < 1 || a->head_dim > MAX_HEAD_DIM)
        return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: head_dim %d not in 1..%d", a->head_dim, MAX_HEAD_DIM);
    if (L->block_size > MAX_BLOCK || wt->block_size != L->block_size || wt->q_tile != L->q_tile ||
        wt->groups != osp_sparse_groups(L) || wt->num_qtiles != osp_sparse_num_qtiles(L) ||
        wt->num_rows != wt->num_qtiles * wt->groups)
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "sparse attention: the work table (%d rows, block %d, q_tile %d) was not built for this "
                             "layout (block %d, q_tile %d)",
                             wt->num_rows, wt->block_size, wt->q_tile, L->block_size, L->q_tile);
    return OSP_OK;
}

/* the query tile holding flat token t */
static int32_t qtile_of(const osp_sparse_wt *wt, int64_t t) {
    int32_t lo = 0, hi = wt->num_qtiles - 1;
    while (lo < hi) {
        const int32_t mid = (lo + hi + 1) / 2;
        if (wt->qtile_start[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

void osp_sparse_attention_cpu(const osp_sparse_attn_args *a, int64_t item_begin, int64_t item_end) {
    const osp_sparse_layout *L = a->L;
    const osp_sparse_wt *wt = a->wt;
    const osp_mask causal = osp_mask_causal();
    const osp_mask *m = a->mask ? a->mask : &causal;
    const int64_t H = L->n_head, HK = L->n_head_kv, D = a->head_dim, grp = H / HK, bs = L->block_size;
    float row[MAX_HEAD_DIM], acc[MAX_HEAD_DIM], o_t[MAX_HEAD_DIM], sc[MAX_BLOCK];
    uint16_t half[MAX_HEAD_DIM];
    for (int64_t item = item_begin; item < item_end; item++) {
        const int64_t t = item / H, h = item % H, kvh = h / grp;
        const int32_t qt = qtile_of(wt, t), s = wt->qtile_seq[qt];
        const int64_t g = L->share == OSP_SPARSE_PER_Q_HEAD ? h : kvh;
        const int64_t r = (int64_t)qt * wt->groups + g;
        const int32_t p = L->positions[t], seq_len = L->seq_lens[s];
        const float *qh = a->q + (t * H + h) * D;
        float mx = -INFINITY, l = 0.0f;
        memset(acc, 0, (size_t)D * sizeof *acc);
        for (int32_t e = wt->indptr[r]; e < wt->indptr[r + 1]; e++) {
            const int32_t j = wt->indices[e], f = wt->flags[e];
            const uint32_t *bits = wt->tmask + (size_t)e * (size_t)wt->mask_words;
            const int64_t base = (int64_t)wt->pages[e] * bs;
            float m_t = -INFINITY;
            for (int64_t i = 0; i < bs; i++) {
                const int32_t kv = (int32_t)(j * bs + i);
                bool keep;
                if (kv >= seq_len) keep = false;
                else if (f & OSP_WT_SELF) keep = kv == p;
                else if (f & OSP_WT_FULL) keep = true;
                else if (!((bits[i / 32] >> (i % 32)) & 1u)) keep = false;
                else if (a->table_masks && m->kind == OSP_MASK_CUSTOM) {
                    const int64_t bit = (int64_t)(t - wt->qtile_start[qt]) * bs + i;
                    keep = wt->emask_off[e] >= 0 && ((wt->emask[wt->emask_off[e] + bit / 32] >> (bit % 32)) & 1u);
                } else keep = osp_mask_keep(m, s, (int32_t)h, p, kv);
                if (!keep) {
                    sc[i] = -INFINITY;
                    continue;
                }
                float x = osp_cpu_dot(qh, osp_cpu_kv_read_row(a->kv, 0, base + i, kvh, HK, D, row, half), D) * a->scale;
                if (m->score_mod) x = m->score_mod(m->score_params, x, s, (int32_t)h, p, kv);
                sc[i] = x;
                if (x > m_t) m_t = x;
            }
            if (m_t == -INFINITY) continue; /* nothing kept in this tile for this query */
            float l_t = 0.0f;
            memset(o_t, 0, (size_t)D * sizeof *o_t);
            for (int64_t i = 0; i < bs; i++) {
                if (sc[i] == -INFINITY) continue;
                const float w = expf(sc[i] - m_t);
                l_t += w;
                const float *vp = osp_cpu_kv_read_row(a->kv, 1, base + i, kvh, HK, D, row, half);
                for (int64_t d = 0; d < D; d++) o_t[d] += w * vp[d];
            }
            /* online-softmax merge of (m_t, l_t, o_t) into (mx, l, acc) */
            const float m_new = m_t > mx ? m_t : mx;
            const float a_old = mx == -INFINITY ? 0.0f : expf(mx - m_new), a_new = expf(m_t - m_new);
            l = l * a_old + l_t * a_new;
            for (int64_t d = 0; d < D; d++) acc[d] = acc[d] * a_old + o_t[d] * a_new;
            mx = m_new;
        }
        float *o = a->out + (t * H + h) * D;
        if (!(l > 0.0f)) { /* no kept key: the query's own position (worktable.h, empty rows) */
            const int64_t slot = (int64_t)L->block_table[(size_t)s * (size_t)L->max_blocks_per_seq + (size_t)(p / bs)] * bs +
                                 p % bs;
            memcpy(o, osp_cpu_kv_read_row(a->kv, 1, slot, kvh, HK, D, row, half), (size_t)D * sizeof *o);
            continue;
        }
        const float inv = 1.0f / l;
        for (int64_t d = 0; d < D; d++) o[d] = acc[d] * inv;
    }
}
