/* The backend solutions of the proving ground: a case run as a one-op list through the backend
 * interface (src/backend/backend.h), exactly as a model runs it: weights placed through the backend,
 * inputs and outputs through osp_run_io. "cpu" is the CPU backend's fast path (int8 activations
 * against block-quantized weights), "cpu-exact" its fp32 path, "cuda" the CUDA backend.
 *
 * A run includes the host copies of its inputs and outputs (the backend interface's only way in and
 * out); on the CPU those are memcpy-sized beside the op. On the GPU the timed runs are device-resident
 * (run_resident) and timed by the device's clock (device_us: CUDA events around the op's kernels,
 * backend.h run_device_us), so neither the host copies nor the run's host work count. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "bench/kernels/kb_internal.h"
#include "core/dtype.h"
#include "core/threadpool.h"
#include "kv/kv_cache.h"
#include "osprey/status.h"

typedef struct be_state {
    osp_backend *be;
    osp_threadpool *pool;
    osp_kv_cache *kv;
    /* the prepared case */
    osp_graph g;
    bool have_graph;
    osp_tensor w[3];
    int n_w;
    int32_t io_act[2 * KB_MAX_IO];
    bool io_in[2 * KB_MAX_IO];
    int io_idx[2 * KB_MAX_IO]; /* index into c->in or out; -1 - k: poison buffer k */
    int n_io;
    float *poison[KB_MAX_IO];  /* NaN rows written into each output activation before the op runs */
    osp_batch b;
    int32_t *pos, *slot, *ids, *lidx, qsl[2], seq_len;
    /* attention: the sequences' pages, written at prepare */
    osp_kv_cache *kv_attn;
    int32_t *bt, *qsl_b, *lens;
    /* the solution's name taken apart, and the device (its arch for the versions' predicates) */
    kb_solution_spec spec;
    osp_device_info dev;
    /* the cache flush: a copy between two buffers of flush_bytes each, made at the first flush */
    void *flush_a, *flush_b;
    size_t flush_bytes;
    /* the CPU's GEMM ceiling: the weight its matmul op read in place (kept until the backend is freed) */
    float *peak_w;
} be_state;

static bool set_err(char *err, size_t n, const char *what) {
    snprintf(err, n, "%s: %s", what, osp_last_error());
    return false;
}

static void be_release(kb_solution *s) {
    be_state *st = s->state;
    if (st->have_graph) osp_graph_free(&st->g);
    st->have_graph = false;
    free(st->pos), free(st->slot), free(st->ids), free(st->lidx), free(st->bt), free(st->qsl_b), free(st->lens);
    st->pos = st->slot = st->ids = st->lidx = st->bt = st->qsl_b = st->lens = NULL;
    osp_kv_cache_free(st->kv_attn);
    st->kv_attn = NULL;
    st->n_w = 0, st->n_io = 0;
    for (int i = 0; i < KB_MAX_IO; i++) free(st->poison[i]), st->poison[i] = NULL;
}

static bool be_supports(kb_solution *s, const kb_case *c, char *why, size_t n) {
    const be_state *st = s->state;
    if (!kb_kind_of(c->def->kind)) {
        snprintf(why, n, "op kind %s", osp_op_name(c->def->kind));
        return false;
    }
    if (st->spec.only_kind != OSP_OP_COUNT && st->spec.only_kind != c->def->kind) {
        snprintf(why, n, "%s runs %s only", s->name, osp_op_name(st->spec.only_kind));
        return false;
    }
    /* a named version runs as itself or not at all: the backend would put another in its place */
    const osp_kernel_version *v = st->spec.version;
    char pw[200];
    if (v && v->kind == c->def->kind) {
        const osp_kernel_target t = kb_target(c->def, c->dim, st->dev.arch);
        if (!osp_kernel_applies(v, &t, pw, sizeof pw)) {
            snprintf(why, n, "%s does not apply: %s", v->name, pw);
            return false;
        }
    }
    return true;
}

static int32_t add_act(be_state *st, const char *name, uint32_t type, int64_t cols, osp_act_rows rows) {
    int32_t id = -1;
    if (osp_graph_act(&st->g, name, type, cols, rows, &id) != OSP_OK) return -1;
    return id;
}

static void add_io(be_state *st, int32_t act, bool input, int idx) {
    st->io_act[st->n_io] = act, st->io_in[st->n_io] = input, st->io_idx[st->n_io] = idx;
    st->n_io++;
}

/* places host fp32 (or stored-type) rows as a backend tensor; vec: an fp32 vector */
static bool place(be_state *st, const void *data, uint32_t type, int64_t rows, int64_t cols, size_t row_bytes, bool vec,
                  char *err, size_t n) {
    osp_weight_src src = {.data = data, .type = type, .rows = rows, .row_bytes = row_bytes};
    if (st->be->vt->place(st->be, &src, 1, cols, vec, &st->w[st->n_w]) != OSP_OK) return set_err(err, n, "place");
    st->n_w++;
    return true;
}

/* Attention over paged K/V: the pages of B sequences (blocks of 16 in a shuffled order, so the
 * block table is exercised) are written at prepare by a RoPE + KV write op whose rotation is the
 * identity (n_rot 2 at frequency 0: cos 1, sin 0), from K/V values representable in f16, so the
 * pages hold exactly the reference's K/V; the timed run is the attention op alone. The write op has
 * HKV query heads (its q output is discarded; the pages depend on HKV and D only): rows of 3 HKV D
 * values instead of (G + 2) HKV D, which at a long context (B 4 x 16k) is gigabytes less to fill and
 * copy at every prepare. */
static bool prepare_attention(be_state *st, const kb_case *c, char *err, size_t n) {
    const kb_def *d = c->def;
    const int64_t B = c->dim[0], P = c->dim[1], Q = c->dim[2], HKV = c->dim[3], G = c->dim[4], D = c->dim[5];
    const int64_t H = HKV * G, L = P + Q, nb = (L + 15) / 16;
    if (B * L > INT32_MAX / 2 || B * nb > INT32_MAX / 16) return snprintf(err, n, "attention case too large"), false;
    osp_kv_shape cfg = {.n_layer = 1, .n_head_kv = (int32_t)HKV, .head_dim = (int32_t)D};
    if (osp_kv_cache_create_on(st->be, &cfg, (int32_t)(B * nb), 16, OSP_KV_DTYPE_F16, &st->kv_attn) != OSP_OK)
        return set_err(err, n, "kv cache");
    st->bt = malloc(sizeof(int32_t) * (size_t)(B * nb));
    st->qsl_b = malloc(sizeof(int32_t) * (size_t)(B + 1));
    st->lens = malloc(sizeof(int32_t) * (size_t)B);
    for (int64_t i = 0; i < B * nb; i++) st->bt[i] = (int32_t)i;
    uint64_t r = c->seed | 1;
    for (int64_t i = B * nb - 1; i > 0; i--) { /* Fisher-Yates */
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        const int64_t j = (int64_t)(r % (uint64_t)(i + 1));
        const int32_t t = st->bt[i];
        st->bt[i] = st->bt[j], st->bt[j] = t;
    }
    /* the write: every position of every sequence */
    osp_graph pre;
    osp_graph_init(&pre);
    const int64_t QD = H * D, KD = HKV * D, PQD = KD, W = PQD + 2 * KD, TP = B * L;
    int32_t qkv = -1, qd = -1;
    osp_graph_act(&pre, "qkv", OSP_DTYPE_F32, W, OSP_ROWS_TOKENS, &qkv);
    osp_graph_act(&pre, "q", OSP_DTYPE_BF16, PQD, OSP_ROWS_TOKENS, &qd);
    static const float zero_freq[1] = {0.0f};
    if (!place(st, zero_freq, OSP_DTYPE_F32, 1, 1, sizeof zero_freq, true, err, n)) return osp_graph_free(&pre), false;
    osp_op wop = {.kind = OSP_OP_ROPE_KV_WRITE, .dst = qd, .src0 = qkv, .src1 = -1, .layer = 0, .w3 = &st->w[0],
                  .p.rope = {(int32_t)HKV, (int32_t)HKV, (int32_t)D, 2, false, 1e-6f}};
    osp_graph_push(&pre, &wop);
    float *rows = calloc((size_t)(TP * W), sizeof(float));
    int32_t *ppos = malloc(sizeof(int32_t) * (size_t)TP), *pslot = malloc(sizeof(int32_t) * (size_t)TP);
    int32_t *pqsl = malloc(sizeof(int32_t) * (size_t)(B + 1)), *pid = calloc((size_t)TP, sizeof(int32_t));
    if (!rows || !ppos || !pslot || !pqsl || !pid) {
        free(rows), free(ppos), free(pslot), free(pqsl), free(pid), osp_graph_free(&pre);
        return snprintf(err, n, "out of memory"), false;
    }
    for (int64_t b = 0; b < B; b++) {
        pqsl[b] = (int32_t)(b * L);
        st->lens[b] = (int32_t)L;
        for (int64_t t = 0; t < L; t++) {
            const int64_t row = b * L + t;
            ppos[row] = (int32_t)t;
            pslot[row] = st->bt[b * nb + t / 16] * 16 + (int32_t)(t % 16);
            memcpy(rows + row * W + PQD, c->in[1] + row * KD, sizeof(float) * (size_t)KD);
            memcpy(rows + row * W + PQD + KD, c->in[2] + row * KD, sizeof(float) * (size_t)KD);
        }
    }
    pqsl[B] = (int32_t)TP;
    const osp_batch pb = {.num_tokens = (int32_t)TP, .token_ids = pid, .positions = ppos, .slot_mapping = pslot,
                          .num_seqs = (int32_t)B, .query_start_loc = pqsl, .seq_lens = st->lens, .block_table = st->bt,
                          .max_blocks_per_seq = (int32_t)nb, .num_logits = 0, .logits_indices = NULL};
    osp_act_io in = {qkv, rows, true};
    osp_run_io rio = {.acts = &in, .n_acts = 1};
    char why[256];
    bool ok = st->be->vt->supports_op(st->be, &pre, &pre.ops[0], why, sizeof why);
    if (!ok) snprintf(err, n, "%s: %s", osp_op_name(OSP_OP_ROPE_KV_WRITE), why);
    else if (st->be->vt->run(st->be, &pre, st->kv_attn, &pb, &rio) != OSP_OK) ok = set_err(err, n, "kv write");
    free(rows), free(ppos), free(pslot), free(pqsl), free(pid);
    osp_graph_free(&pre);
    if (!ok) return false;
    /* the timed op: attention of the B x Q new tokens */
    const int64_t T = B * Q;
    for (int64_t b = 0; b < B; b++) {
        st->qsl_b[b] = (int32_t)(b * Q);
        for (int64_t j = 0; j < Q; j++) st->pos[b * Q + j] = (int32_t)(P + j), st->slot[b * Q + j] = -1;
    }
    st->qsl_b[B] = (int32_t)T;
    st->b = (osp_batch){.num_tokens = (int32_t)T, .token_ids = st->ids, .positions = st->pos, .slot_mapping = st->slot,
                        .num_seqs = (int32_t)B, .query_start_loc = st->qsl_b, .seq_lens = st->lens, .block_table = st->bt,
                        .max_blocks_per_seq = (int32_t)nb, .num_logits = 0, .logits_indices = NULL};
    const int32_t q = add_act(st, "q", d->in[0].dtype, QD, OSP_ROWS_TOKENS), o = add_act(st, "o", d->out[0].dtype, QD, OSP_ROWS_TOKENS);
    osp_op op = {.kind = OSP_OP_ATTENTION, .dst = o, .src0 = q, .src1 = -1, .layer = 0,
                 .p.attn = {(int32_t)H, (int32_t)HKV, (int32_t)D, d->window, (float)attn_scale(c)}};
    if (osp_graph_push(&st->g, &op) != OSP_OK) return set_err(err, n, "op list");
    add_io(st, q, true, 0), add_io(st, o, false, 0);
    if (!st->be->vt->supports_op(st->be, &st->g, &st->g.ops[0], why, sizeof why)) {
        snprintf(err, n, "attention: %s", why);
        return false;
    }
    return true;
}

/* RoPE + KV write of T tokens of one sequence from position P into f16 pages (shuffled blocks of 16);
 * the run poisons the T page rows first (NaN through from_host) and reads them back after. */
static bool prepare_rope(be_state *st, const kb_case *c, char *err, size_t n) {
    const kb_def *d = c->def;
    const int64_t T = c->dim[0], P = c->dim[1], HKV = c->dim[2], G = c->dim[3], D = c->dim[4];
    const int64_t H = HKV * G, QD = H * D, KD = HKV * D, L = P + T, nb = (L + 15) / 16, nr = rope_n_rot(c);
    osp_kv_shape cfg = {.n_layer = 1, .n_head_kv = (int32_t)HKV, .head_dim = (int32_t)D};
    if (L > INT32_MAX / 2 || osp_kv_cache_create_on(st->be, &cfg, (int32_t)nb, 16, OSP_KV_DTYPE_F16, &st->kv_attn) != OSP_OK)
        return set_err(err, n, "kv cache");
    st->bt = malloc(sizeof(int32_t) * (size_t)nb);
    st->lens = malloc(sizeof(int32_t));
    for (int64_t i = 0; i < nb; i++) st->bt[i] = (int32_t)(nb - 1 - i); /* blocks in reverse order */
    for (int64_t t = 0; t < T; t++) {
        const int64_t p = P + t;
        st->pos[t] = (int32_t)p;
        st->slot[t] = st->bt[p / 16] * 16 + (int32_t)(p % 16);
    }
    st->lens[0] = (int32_t)L;
    st->b = (osp_batch){.num_tokens = (int32_t)T, .token_ids = st->ids, .positions = st->pos, .slot_mapping = st->slot,
                        .num_seqs = 1, .query_start_loc = st->qsl, .seq_lens = st->lens, .block_table = st->bt,
                        .max_blocks_per_seq = (int32_t)nb, .num_logits = 0, .logits_indices = NULL};
    if (!place(st, c->in[1], OSP_DTYPE_F32, 1, nr / 2, sizeof(float) * (size_t)(nr / 2), true, err, n)) return false;
    const int32_t qkv = add_act(st, "qkv", d->in[0].dtype, QD + 2 * KD, OSP_ROWS_TOKENS);
    const int32_t q = add_act(st, "q", d->out[0].dtype, QD, OSP_ROWS_TOKENS);
    osp_op op = {.kind = OSP_OP_ROPE_KV_WRITE, .dst = q, .src0 = qkv, .src1 = -1, .layer = 0, .w3 = &st->w[0],
                 .p.rope = {(int32_t)H, (int32_t)HKV, (int32_t)D, (int32_t)nr, d->neox, 1e-6f}};
    if (osp_graph_push(&st->g, &op) != OSP_OK) return set_err(err, n, "op list");
    add_io(st, qkv, true, 0), add_io(st, q, false, 0);
    char why[256];
    if (!st->be->vt->supports_op(st->be, &st->g, &st->g.ops[0], why, sizeof why)) {
        snprintf(err, n, "rope_kv_write: %s", why);
        return false;
    }
    return true;
}

/* rope_kv_write: the T tokens' page rows, poisoned (poison) or read back into out[1], out[2] */
static bool rope_pages(be_state *st, const kb_case *c, float **out, bool poison, char *err, size_t n) {
    const osp_kv_cache *kv = st->kv_attn;
    const size_t row = kv->k_fmt.bytes_per_token; /* f16 pages, K and V alike */
    const int64_t KD = kv->k_fmt.kv_row;
    uint16_t *buf = malloc(row);
    bool ok = buf != NULL;
    for (int64_t t = 0; ok && t < c->dim[0]; t++) {
        for (int kv_i = 0; ok && kv_i < 2; kv_i++) {
            char *page = (char *)(kv_i ? kv->v[0] : kv->k[0]) + (size_t)st->slot[t] * row;
            if (poison) {
                for (int64_t e = 0; e < KD; e++) buf[e] = 0x7e00; /* f16 NaN */
                ok = st->be->vt->from_host(st->be, page, buf, row) == OSP_OK;
            } else {
                ok = st->be->vt->to_host(st->be, buf, page, row) == OSP_OK;
                for (int64_t e = 0; ok && e < KD; e++) out[1 + kv_i][t * KD + e] = osp_fp16_to_fp32(buf[e]);
            }
        }
    }
    free(buf);
    if (!ok) return set_err(err, n, poison ? "pages from host" : "pages to host");
    return true;
}

/* The gate's coverage check needs the op's own output buffers poisoned, not only the host copies
 * (a backend copies its whole activation back, so an element its kernel skipped would come back
 * stale, not NaN): every output activation that is not also an input gets NaN rows written into it
 * before the op, through one more input io. In-place outputs (add, add_rmsnorm's x) keep their
 * inputs; a skipped element there shows as an error. */
static bool add_poison(be_state *st, const kb_case *c, char *err, size_t n) {
    const int n0 = st->n_io;
    int k = 0;
    for (int i = 0; i < n0; i++) {
        if (st->io_in[i]) continue;
        bool is_input = false;
        for (int j = 0; j < n0; j++) is_input |= st->io_in[j] && st->io_act[j] == st->io_act[i];
        if (is_input) continue;
        if (k == KB_MAX_IO || st->n_io == 2 * KB_MAX_IO) return snprintf(err, n, "too many outputs to poison"), false;
        const size_t cnt = c->out_n[st->io_idx[i]];
        st->poison[k] = malloc(cnt * sizeof(float) + 4);
        if (!st->poison[k]) return snprintf(err, n, "out of memory"), false;
        for (size_t e = 0; e < cnt; e++) st->poison[k][e] = NAN;
        add_io(st, st->io_act[i], true, -1 - k);
        k++;
    }
    return true;
}

static bool be_prepare_case(kb_solution *s, const kb_case *c, char *err, size_t n);

static bool be_prepare(kb_solution *s, const kb_case *c, char *err, size_t n) {
    return be_prepare_case(s, c, err, n) && add_poison(s->state, c, err, n);
}

static bool be_prepare_case(kb_solution *s, const kb_case *c, char *err, size_t n) {
    be_state *st = s->state;
    be_release(s);
    const kb_def *d = c->def;
    osp_graph_init(&st->g);
    st->have_graph = true;
    const int64_t T = c->T;
    st->pos = calloc((size_t)T + 1, sizeof(int32_t)), st->slot = calloc((size_t)T + 1, sizeof(int32_t));
    st->ids = calloc((size_t)T + 1, sizeof(int32_t)), st->lidx = calloc((size_t)(c->R > 0 ? c->R : 1), sizeof(int32_t));
    for (int64_t t = 0; t < T; t++) st->pos[t] = (int32_t)t, st->slot[t] = -1, st->ids[t] = c->ids ? c->ids[t] : 0;
    for (int64_t r = 0; r < c->R; r++) st->lidx[r] = c->lidx ? c->lidx[r] : (int32_t)r;
    st->qsl[0] = 0, st->qsl[1] = (int32_t)T, st->seq_len = (int32_t)T;
    static int32_t bt0 = 0;
    st->b = (osp_batch){.num_tokens = (int32_t)T, .token_ids = st->ids, .positions = st->pos, .slot_mapping = st->slot,
                        .num_seqs = 1, .query_start_loc = st->qsl, .seq_lens = &st->seq_len, .block_table = &bt0,
                        .max_blocks_per_seq = 1, .num_logits = (int32_t)c->R, .logits_indices = st->lidx};
    if (d->kind == OSP_OP_ATTENTION) return prepare_attention(st, c, err, n);
    if (d->kind == OSP_OP_ROPE_KV_WRITE) return prepare_rope(st, c, err, n);
    int64_t E = 0;
    osp_op op = {.kind = d->kind, .dst = -1, .src0 = -1, .src1 = -1};
    const uint32_t in0 = d->in[0].dtype, o0 = d->out[0].dtype;
    switch (d->kind) {
    case OSP_OP_EMBED: {
        E = c->dim[2];
        const int32_t x = add_act(st, "x", o0, E, OSP_ROWS_TOKENS);
        if (!place(st, c->in[0], OSP_DTYPE_F32, c->dim[1], E, (size_t)E * 4, false, err, n)) return false;
        op.dst = x, op.w = &st->w[0], op.p.embed.scale = (float)d->scale;
        add_io(st, x, false, 0);
        break;
    }
    case OSP_OP_ADD_RMSNORM: {
        E = c->dim[1];
        const int32_t x = add_act(st, "x", in0, E, OSP_ROWS_TOKENS), dd = add_act(st, "d", d->in[1].dtype, E, OSP_ROWS_TOKENS);
        const int32_t y = add_act(st, "y", d->out[1].dtype, E, OSP_ROWS_TOKENS);
        if (!place(st, c->in[2], OSP_DTYPE_F32, 1, E, (size_t)E * 4, true, err, n)) return false;
        op.dst = y, op.src0 = dd, op.src1 = x, op.w = &st->w[0], op.p.norm.eps = (float)d->eps;
        add_io(st, x, true, 0), add_io(st, dd, true, 1), add_io(st, x, false, 0), add_io(st, y, false, 1);
        break;
    }
    case OSP_OP_GATHER_RMSNORM: {
        E = c->dim[2];
        const int32_t x = add_act(st, "x", in0, E, OSP_ROWS_TOKENS), y = add_act(st, "y", o0, E, OSP_ROWS_LOGITS);
        if (!place(st, c->in[1], OSP_DTYPE_F32, 1, E, (size_t)E * 4, true, err, n)) return false;
        op.dst = y, op.src1 = x, op.w = &st->w[0], op.p.norm.eps = (float)d->eps;
        add_io(st, x, true, 0), add_io(st, y, false, 0);
        break;
    }
    case OSP_OP_MATMUL: {
        const int64_t K = c->dim[1], N = c->dim[2];
        const int32_t x = add_act(st, "x", in0, K, OSP_ROWS_TOKENS), y = add_act(st, "y", o0, N, OSP_ROWS_TOKENS);
        if (!place(st, c->wq, d->wtype, N, K, c->wq_row_bytes, false, err, n)) return false;
        op.dst = y, op.src0 = x, op.w = &st->w[0];
        add_io(st, x, true, 0), add_io(st, y, false, 0);
        break;
    }
    case OSP_OP_GLU: {
        const int64_t F = c->dim[1];
        const int32_t gu = add_act(st, "gu", in0, 2 * F, OSP_ROWS_TOKENS), y = add_act(st, "y", o0, F, OSP_ROWS_TOKENS);
        op.dst = y, op.src0 = gu, op.p.glu.act = (osp_glu_act)d->act;
        add_io(st, gu, true, 0), add_io(st, y, false, 0);
        break;
    }
    case OSP_OP_ADD: {
        E = c->dim[1];
        const int32_t x = add_act(st, "x", in0, E, OSP_ROWS_TOKENS), dd = add_act(st, "d", d->in[1].dtype, E, OSP_ROWS_TOKENS);
        op.dst = x, op.src0 = dd;
        add_io(st, x, true, 0), add_io(st, dd, true, 1), add_io(st, x, false, 0);
        break;
    }
    case OSP_OP_ALL_REDUCE: { /* in place, one rank */
        E = c->dim[1];
        const int32_t x = add_act(st, "x", in0, E, OSP_ROWS_TOKENS);
        op.dst = x, op.src0 = x;
        add_io(st, x, true, 0), add_io(st, x, false, 0);
        break;
    }
    case OSP_OP_COPY: {
        E = c->dim[1];
        const int32_t x = add_act(st, "x", in0, E, OSP_ROWS_TOKENS), y = add_act(st, "y", o0, E, OSP_ROWS_TOKENS);
        op.dst = y, op.src0 = x;
        add_io(st, x, true, 0), add_io(st, y, false, 0);
        break;
    }
    case OSP_OP_SCALE:
    case OSP_OP_SOFTCAP:
    case OSP_OP_ALL_GATHER: { /* all_gather: one rank, the logits rows copied whole */
        const int64_t V = c->dim[1];
        const int32_t x = add_act(st, "x", in0, V, OSP_ROWS_LOGITS), y = add_act(st, "y", o0, V, OSP_ROWS_LOGITS);
        op.dst = y, op.src0 = x;
        if (d->kind != OSP_OP_ALL_GATHER) op.p.scale.s = (float)d->scale;
        add_io(st, x, true, 0), add_io(st, y, false, 0);
        break;
    }
    default: snprintf(err, n, "no backend op for kind %s", osp_op_name(d->kind)); return false;
    }
    if (osp_graph_push(&st->g, &op) != OSP_OK) return set_err(err, n, "op list");
    char why[256];
    if (!st->be->vt->supports_op(st->be, &st->g, &st->g.ops[0], why, sizeof why)) {
        snprintf(err, n, "%s does not run %s: %s", s->name, osp_op_name(d->kind), why);
        return false;
    }
    return true;
}

static bool be_run(kb_solution *s, const kb_case *c, float **out, char *err, size_t n) {
    be_state *st = s->state;
    const bool rope = c->def->kind == OSP_OP_ROPE_KV_WRITE;
    if (rope && !rope_pages(st, c, out, true, err, n)) return false;
    osp_act_io ios[2 * KB_MAX_IO];
    for (int i = 0; i < st->n_io; i++)
        ios[i] = (osp_act_io){st->io_act[i],
                              st->io_idx[i] < 0 ? st->poison[-1 - st->io_idx[i]]
                              : st->io_in[i]    ? c->in[st->io_idx[i]]
                                                : out[st->io_idx[i]],
                              st->io_in[i]};
    osp_run_io rio = {.acts = ios, .n_acts = st->n_io};
    if (st->be->vt->run(st->be, &st->g, st->kv_attn ? st->kv_attn : st->kv, &st->b, &rio) != OSP_OK)
        return set_err(err, n, "run");
    return !rope || rope_pages(st, c, out, false, err, n);
}

/* kb_solution.run_resident: the op list again on the activations and pages the last be_run left on
 * the device (an engine step's shape: only the batch's metadata travels), then a device sync */
static bool be_run_resident(kb_solution *s, const kb_case *c, char *err, size_t n) {
    be_state *st = s->state;
    (void)c;
    osp_run_io rio = {.acts = NULL, .n_acts = 0};
    if (st->be->vt->run(st->be, &st->g, st->kv_attn ? st->kv_attn : st->kv, &st->b, &rio) != OSP_OK)
        return set_err(err, n, "run");
    if (st->be->vt->sync(st->be) != OSP_OK) return set_err(err, n, "sync");
    return true;
}

static void be_close(kb_solution *s) {
    be_state *st = s->state;
    if (!st) return;
    be_release(s);
    osp_kv_cache_free(st->kv);
    if (st->flush_a) st->be->vt->buffer_free(st->be, st->flush_a);
    if (st->flush_b) st->be->vt->buffer_free(st->be, st->flush_b);
    osp_backend_free(st->be);
    osp_threadpool_free(st->pool);
    free(st->peak_w);
    free(st);
    s->state = NULL;
}

/* The backend's copy bandwidth (read + write counted), in GB/s: the ceiling a memory-bound op's
 * bytes/s is compared with. 64 MiB copied 5 times after a warm-up (256 MiB on a GPU). */
static double be_copy_gbps(kb_solution *s) {
    be_state *st = s->state;
    const size_t bytes = (size_t)(strcmp(s->device, "cuda") ? 64 : 256) << 20;
    void *a = NULL, *b = NULL;
    double gbps = 0.0;
    if (st->be->vt->buffer_alloc(st->be, bytes, "copy bandwidth", &a) == OSP_OK &&
        st->be->vt->buffer_alloc(st->be, bytes, "copy bandwidth", &b) == OSP_OK &&
        st->be->vt->copy(st->be, b, a, bytes) == OSP_OK && st->be->vt->sync(st->be) == OSP_OK) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        bool ok = true;
        for (int i = 0; i < 5 && ok; i++) ok = st->be->vt->copy(st->be, i % 2 ? a : b, i % 2 ? b : a, bytes) == OSP_OK;
        ok = ok && st->be->vt->sync(st->be) == OSP_OK;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        const double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (ok && dt > 0.0) gbps = 2.0 * 5.0 * (double)bytes / dt / 1e9;
    }
    if (a) st->be->vt->buffer_free(st->be, a);
    if (b) st->be->vt->buffer_free(st->be, b);
    return gbps;
}

/* The CPU backend's own matmul op, the solution's path (cpu: the fast path, cpu-exact: fp32): x bf16
 * [128, 1024] times fp32 weights [1024, 1024] (pseudo-random values in [-1, 1)) into fp32, through the
 * interface (x's host copy included: 0.5 MiB beside 268 MFLOP), one warm-up then 5 runs timed with the
 * wall clock. GFLOP/s (2 T N K per run), 0 on any failure. */
static double cpu_matmul_gflops(be_state *st) {
    const int64_t T = 128, K = 1024, N = 1024;
    float *x = malloc(sizeof(float) * (size_t)(T * K));
    int32_t *ids = calloc((size_t)T, sizeof(int32_t)), *pos = malloc(sizeof(int32_t) * (size_t)T);
    int32_t *slot = malloc(sizeof(int32_t) * (size_t)T);
    if (!st->peak_w) st->peak_w = malloc(sizeof(float) * (size_t)(N * K));
    double gflops = 0.0;
    osp_graph g;
    osp_graph_init(&g);
    int32_t xa = -1, ya = -1;
    if (!x || !ids || !pos || !slot || !st->peak_w || osp_graph_act(&g, "x", OSP_DTYPE_BF16, K, OSP_ROWS_TOKENS, &xa) != OSP_OK ||
        osp_graph_act(&g, "y", OSP_DTYPE_F32, N, OSP_ROWS_TOKENS, &ya) != OSP_OK)
        goto done;
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < N * K + T * K; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        const float v = (float)((int32_t)(r >> 40) - 8388608) * (1.0f / 8388608.0f);
        if (i < N * K) st->peak_w[i] = v;
        else x[i - N * K] = v;
    }
    for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)t, slot[t] = -1;
    osp_tensor w;
    const osp_weight_src src = {.data = st->peak_w, .type = OSP_DTYPE_F32, .rows = N, .row_bytes = sizeof(float) * (size_t)K};
    if (st->be->vt->place(st->be, &src, 1, K, false, &w) != OSP_OK) goto done;
    const osp_op op = {.kind = OSP_OP_MATMUL, .dst = ya, .src0 = xa, .src1 = -1, .w = &w};
    char why[256];
    if (osp_graph_push(&g, &op) != OSP_OK || !st->be->vt->supports_op(st->be, &g, &g.ops[0], why, sizeof why)) goto done;
    int32_t qsl[2] = {0, (int32_t)T}, len = (int32_t)T, bt0 = 0;
    const osp_batch b = {.num_tokens = (int32_t)T, .token_ids = ids, .positions = pos, .slot_mapping = slot, .num_seqs = 1,
                         .query_start_loc = qsl, .seq_lens = &len, .block_table = &bt0, .max_blocks_per_seq = 1,
                         .num_logits = 0, .logits_indices = NULL};
    const osp_act_io in = {xa, x, true};
    const osp_run_io rio = {.acts = &in, .n_acts = 1};
    if (st->be->vt->run(st->be, &g, st->kv, &b, &rio) != OSP_OK || st->be->vt->sync(st->be) != OSP_OK) goto done;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    bool ok = true;
    for (int i = 0; i < 5 && ok; i++) ok = st->be->vt->run(st->be, &g, st->kv, &b, &rio) == OSP_OK;
    ok = ok && st->be->vt->sync(st->be) == OSP_OK;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (ok && dt > 0.0) gflops = 2.0 * (double)(T * N * K) * 5.0 / dt / 1e9;
done:
    osp_graph_free(&g);
    free(x), free(ids), free(pos), free(slot);
    return gflops;
}

/* The device's bf16 GEMM rate, GFLOP/s: the compute ceiling a matmul's or attention's FLOP/s is compared
 * with. CUDA: cuBLASLt on 8192^3 (osp_backend_gemm_peak_gflops); CPU: cpu_matmul_gflops. 0: unknown. */
static double be_gemm_gflops(kb_solution *s) {
    be_state *st = s->state;
    double g = 0.0;
    if (st->dev.device == OSP_DEVICE_CUDA) return osp_backend_gemm_peak_gflops(OSP_DEVICE_CUDA, &g) == OSP_OK ? g : 0.0;
    return cpu_matmul_gflops(st);
}

osp_kernel_target kb_target(const kb_def *d, const int64_t *dims, int32_t arch) {
    osp_kernel_target t = {.arch = arch, .head_dim = 0, .kv_dtype = OSP_KV_DTYPE_F16}; /* the harness's pages */
    for (int k = 0; k < d->n_dims; k++)
        if (!strcmp(d->dims[k].name, "D")) t.head_dim = (int32_t)dims[k];
    return t;
}

bool kb_solution_parse(const char *name, kb_solution_spec *spec, char *err, size_t errn) {
    memset(spec, 0, sizeof *spec);
    spec->only_kind = OSP_OP_COUNT;
    const size_t bl = strcspn(name, "+:");
    spec->settings = name + strcspn(name, "+");
    if (bl >= sizeof spec->base) goto unknown;
    snprintf(spec->base, sizeof spec->base, "%.*s", (int)bl, name);
    if (!strcmp(spec->base, "cuda")) spec->device = OSP_DEVICE_CUDA;
    else if (!strcmp(spec->base, "cpu") || !strcmp(spec->base, "cpu-exact")) spec->device = OSP_DEVICE_CPU;
    else goto unknown;
    if (name[bl] == ':') {
        if (strcmp(spec->base, "cpu") && strcmp(spec->base, "cuda")) goto unknown; /* cpu-exact:... */
        char what[64];
        const size_t wl = strcspn(name + bl + 1, "+");
        if (wl == 0 || wl >= sizeof what) goto unknown;
        snprintf(what, sizeof what, "%.*s", (int)wl, name + bl + 1);
        spec->only_kind = osp_kernel_kind_of(what);
        if (spec->only_kind == OSP_OP_COUNT) {
            snprintf(err, errn, "solution '%s': no op kind '%.*s' (osprey bench-kernels --list)", name, (int)strcspn(what, "/"), what);
            return false;
        }
        if (strchr(what, '/')) {
            spec->version = osp_kernel_find(spec->device, what);
            if (!spec->version) {
                snprintf(err, errn, "solution '%s': %s has no version '%s' (osprey bench-kernels --list)", name, spec->base, what);
                return false;
            }
            if (spec->version->cpu_exact) snprintf(spec->base, sizeof spec->base, "cpu-exact");
        } else if (strlen(what) != strlen(osp_op_name(spec->only_kind))) {
            goto unknown;
        }
    }
    for (const char *p = spec->settings; *p == '+';) {
        const char *kv = p + 1, *next = strchr(kv, '+'), *eq = strchr(kv, '=');
        const size_t len = next ? (size_t)(next - kv) : strlen(kv);
        if (!eq || (next && eq > next) || eq == kv || len >= 128) {
            snprintf(err, errn, "solution '%s': '+' must be followed by KEY=VALUE", name);
            return false;
        }
        p = kv + len;
    }
    return true;
unknown:
    snprintf(err, errn, "unknown solution '%s' (cpu, cpu-exact, cuda, or DEVICE:KIND/vN as osprey bench-kernels --list "
                        "names them, each with optional +KEY=VALUE)", name);
    return false;
}

bool kb_solution_version(const char *solution, const kb_def *d, const int64_t *dims, int32_t arch, char *out, size_t n) {
    out[0] = 0;
    kb_solution_spec sp;
    char err[256];
    if (!kb_solution_parse(solution, &sp, err, sizeof err)) return false;
    const osp_kernel_target t = kb_target(d, dims, arch);
    const osp_kernel_version *v = sp.version && sp.version->kind == d->kind ? sp.version : NULL;
    for (int i = 0; !v && i < osp_kernel_registry_count(); i++) { /* a setting naming a version, or cpu-exact */
        const osp_kernel_version *r = osp_kernel_registry_at(i);
        if (r->device != sp.device || r->kind != d->kind) continue;
        if (r->cpu_exact && !strcmp(sp.base, "cpu-exact")) v = r;
        if (r->env_key && r->env_value) {
            char kv[160];
            snprintf(kv, sizeof kv, "+%s=%s", r->env_key, r->env_value);
            const char *at = strstr(sp.settings, kv);
            if (at && (at[strlen(kv)] == 0 || at[strlen(kv)] == '+')) v = r;
        }
    }
    if (!v) v = osp_kernel_default(sp.device, d->kind, &t);
    if (!v) return false;
    snprintf(out, n, "%s", v->name);
    return true;
}

/* Evicts the last-level cache: a copy between two buffers of twice its size each (64 MiB at least
 * on a GPU: H200's L2 is 50 MiB; 32 MiB on a CPU whose L3 is unknown), then a sync. */
static bool be_flush(kb_solution *s, size_t *bytes, char *err, size_t n) {
    be_state *st = s->state;
    if (!st->flush_a) {
        const size_t floor = st->dev.device == OSP_DEVICE_CUDA ? (size_t)64 << 20 : (size_t)32 << 20;
        size_t want = 2 * st->dev.cache_bytes;
        st->flush_bytes = want > floor ? want : floor;
        if (st->be->vt->buffer_alloc(st->be, st->flush_bytes, "cache flush", &st->flush_a) != OSP_OK ||
            st->be->vt->buffer_alloc(st->be, st->flush_bytes, "cache flush", &st->flush_b) != OSP_OK)
            return set_err(err, n, "cache flush buffers");
    }
    if (st->be->vt->copy(st->be, st->flush_b, st->flush_a, st->flush_bytes) != OSP_OK ||
        st->be->vt->sync(st->be) != OSP_OK)
        return set_err(err, n, "cache flush");
    *bytes = st->flush_bytes;
    return true;
}

/* kb_solution.device_us: the backend's device time of its last run (CUDA events around the ops) */
static bool be_device_us(kb_solution *s, double *us, char *err, size_t n) {
    be_state *st = s->state;
    if (st->be->vt->run_device_us(st->be, us) != OSP_OK) return set_err(err, n, "device time");
    return true;
}

static uint64_t be_launches(kb_solution *s) {
    const be_state *st = s->state;
    return st->be->launches;
}

bool kb_solution_backend(const char *name, kb_solution *s, char *err, size_t errn) {
    memset(s, 0, sizeof *s);
    kb_solution_spec sp;
    if (!kb_solution_parse(name, &sp, err, errn)) return false;
    const bool cuda = sp.device == OSP_DEVICE_CUDA, exact = !strcmp(sp.base, "cpu-exact");
    /* the environment a backend reads at start: the version's selection (OSPREY_CUDA_ATTENTION=v1),
     * then the "+KEY=VALUE" settings, set in this process before the backend is made */
    if (sp.version && sp.version->env_key) setenv(sp.version->env_key, sp.version->env_value, 1);
    for (const char *p = sp.settings; *p == '+';) {
        const char *kv = p + 1, *next = strchr(kv, '+'), *eq = strchr(kv, '=');
        const size_t len = next ? (size_t)(next - kv) : strlen(kv);
        char key[128], val[128];
        snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
        snprintf(val, sizeof val, "%.*s", (int)(len - (size_t)(eq - kv) - 1), eq + 1);
        setenv(key, val, 1);
        p = kv + len;
    }
    be_state *st = calloc(1, sizeof *st);
    if (!st) return snprintf(err, errn, "out of memory"), false;
    s->state = st;
    st->spec = sp;
    s->name = name;
    s->device = cuda ? "cuda" : "cpu";
    s->supports = be_supports, s->prepare = be_prepare, s->run = be_run, s->release = be_release, s->close = be_close;
    s->copy_gbps = be_copy_gbps, s->gemm_gflops = be_gemm_gflops;
    s->flush = be_flush, s->launches = be_launches;
    /* On the GPU the timed runs keep their inputs on the device: through the interface each run would
     * otherwise copy its activations in and out, which for a small op is most of the time. The CUDA
     * graphs stay off so that a resident decode-shaped run is timed at its own size, not the padded
     * size of the graph ladder. (On the CPU a host copy is the activation itself: whole runs.) */
    if (cuda) {
        setenv("OSPREY_CUDA_GRAPHS", "0", 1);
        s->run_resident = be_run_resident;
    }
    const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (osp_threadpool_create(ncpu > 0 ? (int)ncpu : 1, &st->pool) != OSP_OK) return set_err(err, errn, "thread pool"), be_close(s), false;
    /* time_runs: a backend with a device clock times each run's ops (kb_time prefers that clock) */
    osp_backend_params bp = {.pool = st->pool, .exact = exact, .time_runs = true};
    if (osp_backend_create(cuda ? OSP_DEVICE_CUDA : OSP_DEVICE_CPU, &bp, &st->be) != OSP_OK)
        return set_err(err, errn, "backend"), be_close(s), false;
    if (st->be->vt->run_device_us) s->device_us = be_device_us;
    if (osp_backend_device_info(sp.device, &st->dev) != OSP_OK) return set_err(err, errn, "device"), be_close(s), false;
    char why[256];
    if (cuda && getenv("OSPREY_CUDA_ATTENTION") && !osp_backend_cuda_attention_env_honoured(why, sizeof why)) {
        snprintf(err, errn, "solution '%s': %s", name, why);
        return be_close(s), false;
    }
    /* the interface takes a KV cache; these op kinds never touch it */
    osp_kv_shape cfg = {.n_layer = 1, .n_head_kv = 1, .head_dim = 32};
    if (osp_kv_cache_create_on(st->be, &cfg, 1, 16, OSP_KV_DTYPE_F32, &st->kv) != OSP_OK)
        return set_err(err, errn, "kv cache"), be_close(s), false;
    return true;
}
