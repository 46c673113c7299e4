/* The CUDA backend (see backend.h): runs an op list on one stream of GPU 0.
 *
 * Weights: every matrix is dequantized on the host (the model's thread pool) and stored as bf16 on
 * the device, stacked parts packed into one matrix (q|k|v, gate|up: one GEMM each); vectors (norms,
 * biases, RoPE tables) stay fp32. Activations live in the op list's declared dtype (fp32 or bf16).
 *
 * A step: one host-to-device copy of the packed int32 inputs (token ids, positions, slot_mapping,
 * query_start_loc, logits_indices, then the batch's rows of the block table) from a pinned buffer,
 * then each op's kernel (ops.cu, attention.cu, gemm.cu) in list order. The logits stay on the device
 * for the sampler (sample.cu).
 *
 * Pure decode batches (one token per sequence, every row's logits) are padded to the next size of a
 * ladder (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256) and replayed from a CUDA graph captured
 * the first time that size runs (after one eager run, which also makes the GEMM plans). Padding rows
 * write no KV (slot -1), read block 0, and their outputs are never read. Graphs are keyed to the op
 * list and the KV cache they were captured with, and to the cache's int8_hier read view (a QuantSpec
 * draft reads the same cache, same id, through a copy with hier_upper_only set: the view is a kernel
 * argument, so a graph of one view is never replayed for the other).
 *
 * Buffers are sized by capacities (tokens, logits rows, sequences, block-table width) and grown only
 * when a batch exceeds them, which also drops the captured graphs (they hold the old pointers); in a
 * running engine that happens in the first steps only, so steady steps allocate nothing.
 *
 * Sparse attention (osp_run_io.dev_sparse, issue 15): every ATTENTION op of a layer without a window
 * first refreshes the Quest summaries of the pages the step wrote (osp_cuda_quest_refresh), runs the dense
 * kernel, then, for the step's tokens whose context exceeds the budget (p / block_size + 1 > topk, the
 * CPU hook's rule, prefill tokens included), gathers their q rows, selects pages (osp_cuda_quest_select),
 * builds the work table (osp_cuda_quest_table), attends over it (osp_cuda_sparse_attention_decode) and
 * scatters the rows over the dense output. The per-token lists (which tokens, which pages to refresh)
 * are built on the host with the other step inputs; a decode graph's launches are sized by its ladder
 * size, so the capture holds for any positions (see run_sparse_plan).
 *
 * With osp_backend_params.time_runs (bench-kernels), a run records an event after the step's inputs are
 * uploaded and another after its ops (the graph replay, or the eager enqueue: never inside a capture);
 * run_device_us reads the time between them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/attention_v1.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_sample.h"
#include "backend/kernel_registry.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/status_internal.h"
#include "core/threadpool.h"
#include "backend/kv_layout.h"
#include "osprey/kv_cache.h"

_Static_assert(OSP_KV_PAGE_F32 == OSP_DTYPE_F32 && OSP_KV_PAGE_F16 == OSP_DTYPE_F16,
               "the kernels' KV page types are the page format's ggml type ids");
_Static_assert(OSP_KV_PAGE_FP8 == OSP_KV_DTYPE_FP8 && OSP_KV_PAGE_NVFP4 == OSP_KV_DTYPE_NVFP4 &&
                   OSP_KV_PAGE_INT8H == OSP_KV_DTYPE_INT8_HIER,
               "the kernels' quantized KV page types are the page format's elem_type (the osp_kv_dtype value)");

#define GEMM_WORKSPACE_BYTES (32u << 20)
#define STAGING_VALUES ((size_t)16 << 20) /* bf16 values per upload chunk (32 MiB pinned) */
#define QX_ROWS 1024 /* activation rows a quantized matmul quantizes at a time (osp_cuda_qx_quantize) */
/* sparse attention: token rows the Quest kernels take at a time (a decode graph's at most: the largest
 * ladder size), which sizes their workspace; a prefill with more sparse tokens loops */
#define SPARSE_ROWS 256

static const int32_t k_graph_sizes[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256};
#define N_GRAPH_SIZES ((int)(sizeof k_graph_sizes / sizeof k_graph_sizes[0]))
#define GRAPH_WAYS 2
/* tokens a sequence in a graphed step: 1 (a decode) .. GRAPH_MAX_WIDTH (a verification row of up to
 * GRAPH_MAX_WIDTH - 1 drafts), every sequence of the step the same (issue 14: graphs that cover the
 * verification widths 1 .. k + 1) */
#define GRAPH_MAX_WIDTH 8

typedef struct cuda_backend {
    osp_backend base;
    void *stream;
    void *side_stream; /* copy_dev_many's side copies (another thread's, while steps run on `stream`) */
    osp_cuda_gemm *gemm;
    osp_threadpool *pool;
    void **weights; /* device allocations made by place */
    int32_t n_weights, cap_weights;
    size_t weight_bytes;
    uint16_t *staging; /* pinned, STAGING_VALUES bf16 (while loading) */
    /* quantized matrices (osp_backend_params.quant_weights): kept in their GGUF blocks and multiplied
     * by osp_cuda_qmatmul at every step size, its activations quantized into qx (sized at load for
     * QX_ROWS rows of the widest such matrix) */
    bool quant_weights;
    void *qx;
    size_t qx_bytes;
    unsigned *d_norm_sync; /* osp_cuda_add_rmsnorm_qx's 8 row barriers (16 unsigned, with qx) */
    float *rowbuf;     /* [n_threads, rowbuf_cols] (while loading) */
    int64_t rowbuf_cols;

    /* activations, shared by the op lists (one runs at a time), sized by the capacities */
    int64_t cap_t, cap_l, cap_s, cap_w, cap_len;
    void *act[OSP_GRAPH_MAX_ACTS];
    size_t act_bytes[OSP_GRAPH_MAX_ACTS];
    /* the widest row (bytes) any op list run so far gave activation i, per row kind: the lists share
     * the buffers by index, so each is sized for all of them (kept across free_acts) */
    size_t row_tok[OSP_GRAPH_MAX_ACTS], row_log[OSP_GRAPH_MAX_ACTS];
    void *attn_ws;
    size_t attn_ws_bytes;
    /* sparse attention: the Quest kernels' workspace (sp_layout_of, SPARSE_ROWS rows at the block-table
     * width cap_w), this run's plan (run_sparse_plan) and the osp_dev_sparse the graphs were captured
     * with (their launches and pointers depend on it) */
    void *sp_ws;
    size_t sp_ws_bytes;
    struct sparse_plan {
        osp_dev_sparse *ds; /* NULL: dense */
        int32_t rows;       /* the gathered rows the Quest launches cover (0: none) */
        int32_t refresh;    /* the summary refresh launch's entries (0: none) */
        /* device lists, in d_in after the block table: seq_lens [S], the dense kernel's positions [T]
         * (0 for a sparse decode row), the rows' tokens / positions / sequences [rows], the refreshed
         * pages and their written slots [refresh] */
        const int32_t *seql, *pdense, *tok, *pos, *seq, *rf_blk, *rf_n;
    } sp;
    const osp_dev_sparse *graphs_sparse;
    int32_t *d_in, *h_in; /* packed inputs, device and pinned host */
    const float *logits;  /* the last run's logits [num_logits, n_vocab] on the device */
    int32_t num_logits;

    /* GRAPH_WAYS graphs a (width, ladder size), each captured at one attention length (attn_len_of), the
     * least recently replayed replaced: a batch whose longest sequence alternates between two length
     * buckets replays both instead of re-capturing every step */
    void *graphs[GRAPH_MAX_WIDTH][N_GRAPH_SIZES][GRAPH_WAYS];
    int64_t graph_len[GRAPH_MAX_WIDTH][N_GRAPH_SIZES][GRAPH_WAYS]; /* the attention length each was captured with */
    uint64_t graph_used[GRAPH_MAX_WIDTH][N_GRAPH_SIZES][GRAPH_WAYS], graph_tick;
    uint64_t graphs_gemm_gen; /* osp_cuda_gemm_generation the graphs were captured at (its workspace) */
    int64_t attn_len;    /* this run's attention length: keys its launches cover (attn_len_of) */
    bool attn_len_cap;   /* OSPREY_CUDA_ATTN_LEN=cap: the block-table capacity instead (the earlier sizing, A/B) */
    const osp_graph *graphs_g; /* the op list and KV cache the graphs were captured with */
    uint64_t graphs_kv;
    int64_t graphs_view; /* and the cache's int8_hier view (cuda_run): 0 full, else full_recent + 1 */
    /* a quantized cache's fixed fp32 scales on the device: [n_layer, per] K then [n_layer, per] V
     * (kv_cache.h's k_fixed / v_fixed), uploaded when a cache of graphs_kv's id is first run */
    float *d_kv_fixed;
    size_t kv_fixed_bytes;
    bool use_graphs;
    int graph_max_width; /* widths graphed: 1 .. this (OSPREY_CUDA_GRAPH_WIDTH) */
    /* a padded verification step (pad_step): the last run's logits row of each wanted row, [num_logits]
     * (NULL: rows are in order); capacity lmap_cap */
    int32_t *lmap;
    int32_t lmap_n, lmap_cap;
    /* osp_backend_params.time_runs: events recorded around each run's ops (run_device_us); timed: the
     * last run recorded both */
    bool time_runs, timed;
    void *ev_start, *ev_end;
    /* the step timeline (timeline_enable): tl_ev = the run's start and end, the sampler's start and
     * the wait's, tl_have which of them this step recorded; tl_ref taken at tl_ref_s on the host clock */
    bool tl_on, tl_have[4];
    /* cuda_sample enqueued copies from its pinned buffers and returned before waiting for them (an
     * error after the enqueue): the next call waits first */
    bool sample_inflight;
    void *tl_ref, *tl_ev[4];
    double tl_ref_s;
    /* OSPREY_CUDA_OP_TIMES=1 (a diagnostic): every eager run's ops each between two events, summed per op
     * kind, apart for pure decode steps [1] and the others [0], and printed to stderr when the backend is
     * freed. Graphs are off then, and each run waits for its ops: a profile, not a serving mode. */
    bool op_times;
    void **op_ev;
    int32_t n_op_ev;
    double op_ms[2][OSP_OP_COUNT];
    int64_t op_calls[2][OSP_OP_COUNT], op_steps[2];

    /* sampler */
    int32_t cap_r, cap_ids, cap_bias;
    void *s_scratch;
    osp_cuda_sample_row *d_srows, *h_srows;
    int32_t *d_ids, *h_ids, *d_bias_ids, *h_bias_ids;
    float *d_bias_vals, *h_bias_vals;
    int32_t *d_tokens, *h_tokens;
    osp_status *d_status, *h_status;
    osp_logprobs *d_lp, *h_lp;
} cuda_backend;

#define CU(be) ((cuda_backend *)(be))

/* Offsets of the packed inputs inside d_in / h_in (int32 elements), from the capacities. */
typedef struct in_layout {
    size_t ids, pos, slot, qsl, bt, lidx, sp, total;
} in_layout;

static in_layout layout_of(const cuda_backend *g) {
    in_layout L;
    L.ids = 0;
    L.pos = L.ids + (size_t)g->cap_t;
    L.slot = L.pos + (size_t)g->cap_t;
    L.qsl = L.slot + (size_t)g->cap_t;
    L.lidx = L.qsl + (size_t)g->cap_s + 1;
    L.bt = L.lidx + (size_t)g->cap_l; /* a step copies only its S rows of it */
    /* sparse attention's lists (struct sparse_plan), packed by the step's sizes: at most S + 6 T */
    L.sp = L.bt + (size_t)g->cap_s * (size_t)g->cap_w;
    L.total = L.sp + (size_t)g->cap_s + 6 * (size_t)g->cap_t;
    return L;
}

/* Byte offsets inside sp_ws for C gathered rows of an ATTENTION op (H, HK, D) at budget K pages of bs
 * slots and block-table width W, each 256-byte aligned: q / o [C, H, D] bf16, scores [C HK, W] fp32, sel
 * [C HK, K], counts [C HK], the table (indptr [C HK + 1]; indices, pages, flags [C HK K]; tmask [C HK K,
 * ceil(bs / 32)]) and the sparse kernel's workspace. */
typedef struct sp_layout {
    size_t q, o, scores, sel, counts, indptr, indices, pages, flags, tmask, att, att_bytes, total;
} sp_layout;

static sp_layout sp_layout_of(int64_t C, int H, int HK, int D, int32_t K, int32_t bs, int64_t W) {
    sp_layout L;
    size_t at = 0;
#define SP_TAKE(field, bytes) (L.field = at, at += ((size_t)(bytes) + 255) / 256 * 256)
    const size_t rows = (size_t)C * (size_t)HK, ent = rows * (size_t)K;
    SP_TAKE(q, (size_t)C * (size_t)H * (size_t)D * 2);
    SP_TAKE(o, (size_t)C * (size_t)H * (size_t)D * 2);
    SP_TAKE(scores, rows * (size_t)W * 4);
    SP_TAKE(sel, ent * 4);
    SP_TAKE(counts, rows * 4);
    SP_TAKE(indptr, (rows + 1) * 4);
    SP_TAKE(indices, ent * 4);
    SP_TAKE(pages, ent * 4);
    SP_TAKE(flags, ent * 4);
    SP_TAKE(tmask, ent * (size_t)((bs + 31) / 32) * 4);
    L.att_bytes = osp_cuda_sparse_workspace_bytes(C, H, D, K, bs);
    SP_TAKE(att, L.att_bytes);
#undef SP_TAKE
    L.total = at;
    return L;
}

static void drop_graphs(cuda_backend *g) {
    for (int x = 0; x < GRAPH_MAX_WIDTH; x++)
        for (int i = 0; i < N_GRAPH_SIZES; i++)
            for (int w = 0; w < GRAPH_WAYS; w++) {
                osp_cuda_graph_destroy(g->graphs[x][i][w]);
                g->graphs[x][i][w] = NULL;
            }
}

static void free_acts(cuda_backend *g) {
    drop_graphs(g);
    for (int i = 0; i < OSP_GRAPH_MAX_ACTS; i++) {
        osp_cuda_free(g->act[i]);
        g->act[i] = NULL;
        g->act_bytes[i] = 0;
    }
    osp_cuda_free(g->attn_ws);
    osp_cuda_free(g->sp_ws);
    g->sp_ws = NULL;
    g->sp_ws_bytes = 0;
    osp_cuda_free(g->d_in);
    osp_cuda_host_free(g->h_in);
    g->attn_ws = NULL;
    g->attn_ws_bytes = 0;
    g->d_in = g->h_in = NULL;
    g->logits = NULL;
    g->num_logits = 0;
    g->cap_t = g->cap_l = g->cap_s = g->cap_w = g->cap_len = 0;
}

static void free_sampler(cuda_backend *g) {
    osp_cuda_free(g->s_scratch);
    osp_cuda_free(g->d_srows);
    osp_cuda_free(g->d_ids);
    osp_cuda_free(g->d_bias_ids);
    osp_cuda_free(g->d_bias_vals);
    osp_cuda_free(g->d_tokens);
    osp_cuda_free(g->d_status);
    osp_cuda_free(g->d_lp);
    osp_cuda_host_free(g->h_srows);
    osp_cuda_host_free(g->h_ids);
    osp_cuda_host_free(g->h_bias_ids);
    osp_cuda_host_free(g->h_bias_vals);
    osp_cuda_host_free(g->h_tokens);
    osp_cuda_host_free(g->h_status);
    osp_cuda_host_free(g->h_lp);
    g->s_scratch = NULL;
    g->d_srows = g->h_srows = NULL;
    g->d_ids = g->h_ids = g->d_bias_ids = g->h_bias_ids = NULL;
    g->d_bias_vals = g->h_bias_vals = NULL;
    g->d_tokens = g->h_tokens = NULL;
    g->d_status = g->h_status = NULL;
    g->d_lp = g->h_lp = NULL;
    g->cap_r = g->cap_ids = g->cap_bias = 0;
}

static void end_load(cuda_backend *g) {
    osp_cuda_host_free(g->staging);
    free(g->rowbuf);
    g->staging = NULL;
    g->rowbuf = NULL;
    g->rowbuf_cols = 0;
}

/* OSPREY_CUDA_OP_TIMES: the per-kind device time of the ops, decode steps and the others apart. */
static void print_op_times(const cuda_backend *g) {
    static const char *const phase[2] = {"prefill / mixed steps", "decode steps"};
    for (int d = 0; d < 2; d++) {
        double total = 0.0;
        for (int k = 0; k < OSP_OP_COUNT; k++) total += g->op_ms[d][k];
        if (g->op_steps[d] == 0) continue;
        fprintf(stderr, "cuda op times, %s: %lld steps, %.3f ms of ops (%.1f us a step)\n", phase[d],
                (long long)g->op_steps[d], total, 1e3 * total / (double)g->op_steps[d]);
        fprintf(stderr, "  %-16s %10s %12s %12s %7s\n", "op", "calls", "ms", "us a step", "share");
        for (int k = 0; k < OSP_OP_COUNT; k++)
            if (g->op_calls[d][k] > 0)
                fprintf(stderr, "  %-16s %10lld %12.3f %12.1f %6.1f%%\n", osp_op_name((osp_op_kind)k),
                        (long long)g->op_calls[d][k], g->op_ms[d][k], 1e3 * g->op_ms[d][k] / (double)g->op_steps[d],
                        total > 0 ? 100.0 * g->op_ms[d][k] / total : 0.0);
    }
}

static void cuda_free(osp_backend *be) {
    cuda_backend *g = CU(be);
    if (g->stream) (void)osp_cuda_stream_sync(g->stream);
    free_acts(g);
    free_sampler(g);
    osp_cuda_free(g->d_kv_fixed);
    osp_cuda_free(g->qx);
    osp_cuda_free(g->d_norm_sync);
    end_load(g);
    for (int32_t i = 0; i < g->n_weights; i++) osp_cuda_free(g->weights[i]);
    free(g->weights);
    osp_cuda_gemm_destroy(g->gemm);
    osp_cuda_event_destroy(g->ev_start);
    osp_cuda_event_destroy(g->ev_end);
    osp_cuda_event_destroy(g->tl_ref);
    for (int i = 0; i < 4; i++) osp_cuda_event_destroy(g->tl_ev[i]);
    if (g->op_times) print_op_times(g);
    for (int32_t i = 0; i < g->n_op_ev; i++) osp_cuda_event_destroy(g->op_ev[i]);
    free(g->op_ev);
    free(g->lmap);
    osp_cuda_stream_destroy(g->stream);
    osp_cuda_stream_destroy(g->side_stream);
    free(g);
}

/* ---- memory and weights ------------------------------------------------------------------------ */

static osp_status cuda_buffer_alloc(osp_backend *be, size_t bytes, const char *what, void **out) {
    cuda_backend *g = CU(be);
    OSP_TRY(osp_cuda_malloc(out, bytes, what));
    osp_status s = osp_cuda_memset(*out, 0, bytes, g->stream);
    if (s == OSP_OK) s = osp_cuda_stream_sync(g->stream);
    if (s != OSP_OK) {
        osp_cuda_free(*out);
        *out = NULL;
    }
    return s;
}

static void cuda_buffer_free(osp_backend *be, void *p) {
    (void)osp_cuda_stream_sync(CU(be)->stream); /* no kernel of a step may still read it */
    osp_cuda_free(p);
}

static osp_status cuda_copy(osp_backend *be, void *dst, const void *src, size_t bytes) {
    return osp_cuda_d2d(dst, src, bytes, CU(be)->stream); /* ordered before the next step's kernels */
}

static osp_status cuda_to_host(osp_backend *be, void *dst, const void *src, size_t bytes) {
    OSP_TRY(osp_cuda_d2h(dst, src, bytes, CU(be)->stream)); /* after the stream's earlier work */
    return osp_cuda_stream_sync(CU(be)->stream);
}

static osp_status cuda_from_host(osp_backend *be, void *dst, const void *src, size_t bytes) {
    OSP_TRY(osp_cuda_h2d(dst, src, bytes, CU(be)->stream));
    return osp_cuda_stream_sync(CU(be)->stream); /* the host buffer is free again */
}

static osp_status cuda_copy_host_many(osp_backend *be, bool to_host, int32_t n, void *const *dst, const void *const *src,
                                      const size_t *bytes) {
    return osp_cuda_copy_many(to_host, n, dst, src, bytes, CU(be)->stream);
}

static osp_status cuda_host_register(osp_backend *be, void *p, size_t bytes) {
    (void)be;
    return osp_cuda_host_register(p, bytes);
}

static void cuda_host_unregister(osp_backend *be, void *p) {
    (void)be;
    osp_cuda_host_unregister(p);
}

static osp_status cuda_device_uuid(osp_backend *be, uint8_t uuid[OSP_BACKEND_UUID_BYTES]) {
    (void)be;
    return osp_cuda_device_uuid(uuid);
}

static osp_status cuda_ipc_handle(osp_backend *be, void *p, uint8_t handle[OSP_BACKEND_IPC_HANDLE_BYTES]) {
    (void)be;
    return osp_cuda_ipc_handle(p, handle);
}

static osp_status cuda_ipc_open(osp_backend *be, const uint8_t handle[OSP_BACKEND_IPC_HANDLE_BYTES], void **out) {
    (void)be;
    return osp_cuda_ipc_open(handle, out);
}

static void cuda_ipc_close(osp_backend *be, void *p) {
    (void)be;
    osp_cuda_ipc_close(p);
}

static osp_status cuda_copy_dev_many(osp_backend *be, bool side, bool to_host, int32_t n, void *const *dst,
                                     const void *const *src, const size_t *bytes) {
    cuda_backend *g = CU(be);
    void *st = side ? g->side_stream : g->stream;
    if (!to_host) return osp_cuda_copy_many_d2d(n, dst, src, bytes, st);
    for (int32_t i = 0; i < n; i++) OSP_TRY(osp_cuda_d2h(dst[i], src[i], bytes[i], st));
    return osp_cuda_stream_sync(st);
}

static osp_status cuda_mem_info(osp_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    return osp_cuda_mem_info(free_bytes, total_bytes);
}

static size_t cuda_weight_bytes(const osp_backend *be) { return CU(be)->weight_bytes; }

static osp_status device_alloc(cuda_backend *g, size_t bytes, void **out) {
    if (g->n_weights == g->cap_weights) {
        const int32_t cap = g->cap_weights ? 2 * g->cap_weights : 64;
        void **w = realloc(g->weights, (size_t)cap * sizeof *w);
        if (!w) return osp_set_error(OSP_ERR_NOMEM, "cuda: out of memory");
        g->weights = w;
        g->cap_weights = cap;
    }
    OSP_TRY(osp_cuda_malloc(out, bytes, "the model's weights"));
    g->weights[g->n_weights++] = *out;
    g->weight_bytes += (bytes + 255) & ~(size_t)255;
    return OSP_OK;
}

typedef struct dequant_job {
    const osp_weight_src *src;
    int64_t r0, n, cols;
    uint16_t *out;
    float *rowbuf;
    int64_t rowbuf_cols;
    int failed;
} dequant_job;

/* Rows [r0, r0 + n) of a stored matrix, dequantized and rounded to bf16, on the pool's threads. */
static void dequant_task(void *arg, int ith, int nth) {
    dequant_job *j = arg;
    long long a, b;
    osp_split(j->n, ith, nth, &a, &b);
    float *row = j->rowbuf + (size_t)ith * (size_t)j->rowbuf_cols;
    for (long long r = a; r < b; r++) {
        const uint8_t *src = (const uint8_t *)j->src->data + (size_t)(j->r0 + r) * j->src->row_bytes;
        uint16_t *o = j->out + (size_t)r * (size_t)j->cols;
        if (j->src->type == OSP_DTYPE_BF16) {
            memcpy(o, src, (size_t)j->cols * 2);
            continue;
        }
        if (osp_dequant_row(j->src->type, src, row, j->cols) != OSP_OK) j->failed = 1; /* benign race: any 1 */
        for (int64_t c = 0; c < j->cols; c++) o[c] = osp_fp32_to_bf16(row[c]);
    }
}

static osp_status upload_matrix(cuda_backend *g, uint16_t *dst, const osp_weight_src *w, int64_t cols) {
    const int64_t rows_per_chunk = (int64_t)(STAGING_VALUES / (size_t)cols);
    if (rows_per_chunk < 1)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "cuda: a weight row of %lld values is too long", (long long)cols);
    if (!g->staging) OSP_TRY(osp_cuda_host_alloc((void **)&g->staging, STAGING_VALUES * 2, "weight upload staging"));
    const int nt = osp_threadpool_n_threads(g->pool);
    if (cols > g->rowbuf_cols) {
        free(g->rowbuf);
        g->rowbuf = malloc((size_t)nt * (size_t)cols * sizeof(float));
        if (!g->rowbuf) return osp_set_error(OSP_ERR_NOMEM, "cuda: out of memory");
        g->rowbuf_cols = cols;
    }
    for (int64_t r0 = 0; r0 < w->rows; r0 += rows_per_chunk) {
        const int64_t n = w->rows - r0 < rows_per_chunk ? w->rows - r0 : rows_per_chunk;
        dequant_job j = {w, r0, n, cols, g->staging, g->rowbuf, g->rowbuf_cols, 0};
        osp_threadpool_run(g->pool, dequant_task, &j);
        if (j.failed) return osp_set_error(OSP_ERR_FORMAT, "cuda: cannot dequantize a %s weight", osp_dtype_name(w->type));
        OSP_TRY(osp_cuda_h2d(dst + (size_t)r0 * (size_t)cols, g->staging, (size_t)n * (size_t)cols * 2, g->stream));
        OSP_TRY(osp_cuda_stream_sync(g->stream)); /* the staging buffer is reused */
    }
    return OSP_OK;
}

/* A stored matrix whose parts are all of a type and width osp_cuda_qmatmul takes, copied as the
 * file's bytes: the parts one after another in one allocation, each its own osp_tensor part. The
 * activation workspace (qx) grows to fit this matrix's width. */
static bool can_place_quantized(const cuda_backend *g, const osp_weight_src *src, int32_t n, int64_t cols) {
    if (!g->quant_weights) return false;
    for (int32_t i = 0; i < n; i++)
        if (!src[i].data || !osp_cuda_qmatmul_supported(src[i].type, cols)) return false;
    return true;
}

static osp_status place_quantized(cuda_backend *g, const osp_weight_src *src, int32_t n, int64_t cols,
                                  osp_tensor *out) {
    size_t bytes = 0;
    int64_t rows = 0;
    for (int32_t i = 0; i < n; i++) {
        bytes += ((size_t)src[i].rows * src[i].row_bytes + 255) & ~(size_t)255; /* each part 256-byte aligned */
        rows += src[i].rows;
    }
    char *d;
    OSP_TRY(device_alloc(g, bytes, (void **)&d));
    if (!g->staging) OSP_TRY(osp_cuda_host_alloc((void **)&g->staging, STAGING_VALUES * 2, "weight upload staging"));
    size_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        const size_t part = (size_t)src[i].rows * src[i].row_bytes;
        for (size_t c = 0; c < part; c += STAGING_VALUES * 2) { /* the file's pages through pinned memory */
            const size_t len = part - c < STAGING_VALUES * 2 ? part - c : STAGING_VALUES * 2;
            memcpy(g->staging, (const char *)src[i].data + c, len);
            OSP_TRY(osp_cuda_h2d(d + off + c, g->staging, len, g->stream));
            OSP_TRY(osp_cuda_stream_sync(g->stream)); /* the staging buffer is reused */
        }
        out->parts[i] = (osp_tensor_part){.data = d + off, .type = src[i].type, .rows = src[i].rows,
                                          .row_bytes = src[i].row_bytes};
        off += (part + 255) & ~(size_t)255;
    }
    out->cols = cols;
    out->rows = rows;
    out->n_parts = n;
    const size_t need = osp_cuda_qx_workspace_bytes(QX_ROWS, cols);
    if (need > g->qx_bytes) {
        osp_cuda_free(g->qx);
        g->qx = NULL;
        g->qx_bytes = 0;
        OSP_TRY(osp_cuda_malloc(&g->qx, need, "the quantized-activation workspace"));
        g->qx_bytes = need;
    }
    if (!g->d_norm_sync) {
        OSP_TRY(osp_cuda_malloc((void **)&g->d_norm_sync, 16 * sizeof *g->d_norm_sync, "the norm's row barriers"));
        OSP_TRY(osp_cuda_memset(g->d_norm_sync, 0, 16 * sizeof *g->d_norm_sync, NULL));
        OSP_TRY(osp_cuda_stream_sync(NULL));
    }
    return OSP_OK;
}

/* Matrices: bf16 on the device, parts packed one after another (one GEMM), or (quant_weights) in their
 * stored block types where every part has kernels. Vectors: fp32. Random sources are drawn on the
 * device (fill_randn: bit-identical to make-random-model's values). */
static osp_status cuda_place(osp_backend *be, const osp_weight_src *src, int32_t n, int64_t cols, bool f32_exact,
                             osp_tensor *out) {
    cuda_backend *g = CU(be);
    memset(out, 0, sizeof *out);
    if (!f32_exact && can_place_quantized(g, src, n, cols)) return place_quantized(g, src, n, cols, out);
    int64_t rows = 0;
    for (int32_t i = 0; i < n; i++) rows += src[i].rows;
    const size_t elem = f32_exact ? 4 : 2;
    /* vectors: n parts of one row each, concatenated into one row of `cols` values */
    const size_t bytes = f32_exact ? (size_t)cols * 4 : (size_t)rows * (size_t)cols * elem;
    void *d;
    OSP_TRY(device_alloc(g, bytes, &d));
    size_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        const osp_weight_src *s = &src[i];
        const int64_t vals = f32_exact ? (int64_t)(s->row_bytes / 4) : s->rows * cols;
        char *dst = (char *)d + off;
        if (!s->data) {
            OSP_TRY(f32_exact ? osp_cuda_fill_randn_f32((float *)dst, vals, s->random_key, 0, s->random_scale,
                                                        s->random_offset, g->stream)
                              : osp_cuda_fill_randn_bf16((uint16_t *)dst, vals, s->random_key, 0, s->random_scale,
                                                         s->random_offset, g->stream));
        } else if (f32_exact) {
            OSP_TRY(osp_cuda_h2d(dst, s->data, s->row_bytes, g->stream));
        } else {
            OSP_TRY(upload_matrix(g, (uint16_t *)dst, s, cols));
        }
        off += (size_t)vals * elem;
    }
    OSP_TRY(osp_cuda_stream_sync(g->stream));
    out->cols = cols;
    out->rows = f32_exact ? 1 : rows;
    out->n_parts = 1;
    out->parts[0] = (osp_tensor_part){.data = d, .type = f32_exact ? OSP_DTYPE_F32 : OSP_DTYPE_BF16,
                                      .rows = out->rows, .row_bytes = (size_t)cols * elem};
    return OSP_OK;
}

/* ---- ops ----------------------------------------------------------------------------------------- */

static bool is(const osp_graph *gr, int32_t act, uint32_t type) {
    return act >= 0 && act < gr->n_acts && gr->acts[act].type == type;
}

/* The KV page types the kernels have (attention*.cu, rope_kv_write): f16, f32, FP8 / NVFP4 (issue 13) and
 * INT8_HIER (issue 14), the quantized ones quantized on write by rope_kv_write and read by the CUDA-core
 * attention kernel (attention.cu; the tensor-core kernels take f16, E4M3 and NVFP4, never INT8_HIER).
 * Block copies, offload and transfer move every pool by block id (kv_cache.c), whatever the type. bf16
 * pages are not written: refused here, once, when the cache is created, so the error comes at start-up
 * and not from the first launch (as are quantized caches with sparse attention: cuda_supports_dev_sparse). */
static bool cuda_supports_kv(osp_backend *be, osp_kv_dtype d, osp_kv_dtype dv, char *why, size_t n) {
    (void)be;
    if (d != dv) { /* rope_kv_write and the attention kernels take one page type for K and V */
        snprintf(why, n, "the CUDA backend has no split K/V page dtypes (K %s, V %s): its kernels take one page type "
                 "for both; use the same --cache-type-k and --cache-type-v, or --device cpu",
                 osp_kv_dtype_name(d) ? osp_kv_dtype_name(d) : "?", osp_kv_dtype_name(dv) ? osp_kv_dtype_name(dv) : "?");
        return false;
    }
    if (d == OSP_KV_DTYPE_F16 || d == OSP_KV_DTYPE_F32 || d == OSP_KV_DTYPE_FP8 || d == OSP_KV_DTYPE_NVFP4 ||
        d == OSP_KV_DTYPE_INT8_HIER)
        return true;
    snprintf(why, n, "the CUDA backend has no %s KV pages (its kernels read f16, f32, fp8, nvfp4 or int8_hier pages)",
             osp_kv_dtype_name(d) ? osp_kv_dtype_name(d) : "such");
    return false;
}

/* What the engine path's sparse kernels take (osp_dev_sparse): f16 K and V pages (the block-sparse kernel
 * reads f16 only), head_dim 64 or 128, query groups of <= 16 heads, pages of <= 256 slots, and
 * SPARSE_ROWS rows of KV heads within the Quest kernels' grid (65,535 rows). */
static bool cuda_supports_dev_sparse(osp_backend *be, const osp_kv_cache *kv, int32_t n_head, char *why, size_t n) {
    (void)be;
    const int32_t D = kv->k_fmt.head_dim, HK = D > 0 ? (int32_t)(kv->k_fmt.kv_row / D) : 0;
    if (kv->k_fmt.elem_type != OSP_KV_PAGE_F16 || kv->v_fmt.elem_type != OSP_KV_PAGE_F16) {
        snprintf(why, n, "the block-sparse kernel reads f16 KV pages only, not %s (use --kv-cache-dtype f16, or --device "
                 "cpu)", osp_kv_dtype_name(kv->k_fmt.dtype) ? osp_kv_dtype_name(kv->k_fmt.dtype) : "these");
        return false;
    }
    if (D != 64 && D != 128) {
        snprintf(why, n, "the block-sparse kernel takes head_dim 64 or 128, not %d", D);
        return false;
    }
    if (HK < 1 || n_head < HK || n_head % HK || n_head / HK > 16 || (int64_t)HK * SPARSE_ROWS > 65535) {
        snprintf(why, n, "the Quest kernels take groups of <= 16 query heads a KV head (%d / %d)", n_head, HK);
        return false;
    }
    if (kv->block_size > 256) {
        snprintf(why, n, "the block-sparse kernel takes block_size <= 256, not %d", kv->block_size);
        return false;
    }
    return true;
}

static bool cuda_supports_op(osp_backend *be, const osp_graph *gr, const osp_op *op, char *why, size_t n) {
    (void)be;
    const uint32_t F32 = OSP_DTYPE_F32, BF16 = OSP_DTYPE_BF16;
    bool ok = true;
    const char *need = "";
    switch (op->kind) {
    case OSP_OP_EMBED: ok = is(gr, op->dst, F32), need = "fp32 output"; break;
    case OSP_OP_ADD_RMSNORM:
        ok = is(gr, op->src1, F32) && (op->src0 < 0 || is(gr, op->src0, BF16)) && is(gr, op->dst, BF16);
        need = "fp32 x, bf16 delta and output";
        break;
    case OSP_OP_GATHER_RMSNORM: ok = is(gr, op->src1, F32) && is(gr, op->dst, BF16), need = "fp32 x, bf16 output"; break;
    case OSP_OP_MATMUL: ok = is(gr, op->src0, BF16) && op->dst >= 0, need = "bf16 input"; break;
    case OSP_OP_ROPE_KV_WRITE: ok = is(gr, op->src0, F32) && is(gr, op->dst, BF16), need = "fp32 qkv, bf16 q"; break;
    case OSP_OP_ATTENTION:
        ok = is(gr, op->src0, BF16) && is(gr, op->dst, BF16) &&
             osp_cuda_attention_supported(op->p.attn.n_head, op->p.attn.n_head_kv, op->p.attn.head_dim);
        need = "bf16 q and output, head_dim 32/64/128/256, n_head a multiple of n_head_kv";
        break;
    case OSP_OP_GLU: ok = is(gr, op->src0, BF16) && is(gr, op->dst, BF16), need = "bf16 input and output"; break;
    case OSP_OP_ADD: ok = is(gr, op->dst, F32) && is(gr, op->src0, BF16), need = "fp32 x += bf16"; break;
    case OSP_OP_SCALE:
    case OSP_OP_SOFTCAP:
        ok = is(gr, op->dst, F32) && is(gr, op->src0, F32) && gr->acts[op->dst].cols == gr->acts[op->src0].cols &&
             gr->acts[op->dst].rows == gr->acts[op->src0].rows && (op->kind == OSP_OP_SCALE || op->p.scale.s > 0.0f);
        need = "fp32 in and out of one shape (and a cap > 0)";
        break;
    case OSP_OP_ALL_REDUCE: ok = op->dst >= 0 && op->dst == op->src0, need = "an in-place all_reduce"; break;
    case OSP_OP_ALL_GATHER: /* one rank (no communicator here): a copy of src0, which has dst's columns */
        ok = op->dst >= 0 && op->src0 >= 0 && op->dst != op->src0 && is(gr, op->dst, F32) && is(gr, op->src0, F32) &&
             gr->acts[op->dst].cols == gr->acts[op->src0].cols && gr->acts[op->dst].rows == gr->acts[op->src0].rows;
        need = "one rank's all_gather: fp32 src0 and another fp32 dst of its shape";
        break;
    case OSP_OP_COPY:
        ok = op->dst >= 0 && op->src0 >= 0 && gr->acts[op->dst].type == gr->acts[op->src0].type &&
             gr->acts[op->dst].cols == gr->acts[op->src0].cols && gr->acts[op->dst].rows == gr->acts[op->src0].rows;
        need = "the same shape and dtype";
        break;
    default: ok = false, need = "a known op kind"; break;
    }
    if (!ok) snprintf(why, n, "the CUDA kernels need %s", need);
    return ok;
}

static int64_t grow(int64_t cap, int64_t need, int64_t floor_) {
    if (need <= cap) return cap;
    int64_t n = cap > floor_ ? cap : floor_;
    while (n < need) n *= 2;
    return n;
}

static size_t act_size(const osp_act *a, int64_t cap_t, int64_t cap_l) {
    const int64_t rows = a->rows == OSP_ROWS_LOGITS ? cap_l : cap_t;
    return (size_t)rows * (size_t)a->cols * (a->type == OSP_DTYPE_BF16 ? 2 : 4);
}

/* The attention workspace for attn_op (NULL: none) at the current capacities (cap_t tokens, cap_len
 * keys), grown when this op list needs more than the ones before it: the capacities can already fit
 * an op list whose attention was never reserved for (bench-kernels runs a copy before an attention),
 * so the check is its own. Growing drops the captured graphs, which hold the old pointer. */
static osp_status reserve_attn_ws(cuda_backend *g, const osp_op *attn_op) {
    if (!attn_op) return OSP_OK;
    const size_t need = osp_cuda_attention_workspace_bytes(g->cap_t, attn_op->p.attn.n_head, attn_op->p.attn.head_dim,
                                                           (int32_t)g->cap_len);
    if (need <= g->attn_ws_bytes) return OSP_OK;
    OSP_TRY(osp_cuda_stream_sync(g->stream));
    drop_graphs(g);
    osp_cuda_free(g->attn_ws);
    g->attn_ws = NULL;
    g->attn_ws_bytes = 0;
    OSP_TRY(osp_cuda_malloc(&g->attn_ws, need, "attention workspace"));
    g->attn_ws_bytes = need;
    return OSP_OK;
}

/* Makes the buffers hold T tokens, L logits rows, S sequences, block tables W wide, for op list gr. */
static osp_status reserve(cuda_backend *g, const osp_graph *gr, int64_t T, int64_t L, int64_t S, int64_t W,
                          int32_t block_size, const osp_op *attn_op) {
    bool fits = T <= g->cap_t && L <= g->cap_l && S <= g->cap_s && W <= g->cap_w;
    for (int32_t a = 0; a < gr->n_acts; a++) {
        const osp_act *ac = &gr->acts[a];
        const size_t rb = (size_t)ac->cols * (ac->type == OSP_DTYPE_BF16 ? 2 : 4);
        size_t *row = ac->rows == OSP_ROWS_LOGITS ? &g->row_log[a] : &g->row_tok[a];
        if (rb > *row) *row = rb;
        fits = fits && act_size(ac, g->cap_t, g->cap_l) <= g->act_bytes[a];
    }
    if (fits) return reserve_attn_ws(g, attn_op);
    const int64_t ct = grow(g->cap_t, T, 256), cl = grow(g->cap_l, L, 256), cs = grow(g->cap_s, S, 256),
                  cw = grow(g->cap_w, W, 16);
    OSP_TRY(osp_cuda_stream_sync(g->stream));
    free_acts(g);
    g->cap_t = ct, g->cap_l = cl, g->cap_s = cs, g->cap_w = cw;
    g->cap_len = cw * block_size;
    osp_status s;
    for (int32_t a = 0; a < OSP_GRAPH_MAX_ACTS; a++) {
        /* sized for every op list seen so far: the lists share the buffers */
        const size_t nt = g->row_tok[a] * (size_t)ct, nl = g->row_log[a] * (size_t)cl;
        const size_t need = nt > nl ? nt : nl;
        if (!need) continue;
        if ((s = osp_cuda_malloc(&g->act[a], need, "activations")) != OSP_OK) goto fail;
        g->act_bytes[a] = need;
    }
    if ((s = reserve_attn_ws(g, attn_op)) != OSP_OK) goto fail;
    const in_layout lay = layout_of(g);
    if ((s = osp_cuda_malloc((void **)&g->d_in, lay.total * 4, "step inputs")) != OSP_OK) goto fail;
    if ((s = osp_cuda_host_alloc((void **)&g->h_in, lay.total * 4, "step inputs")) != OSP_OK) goto fail;
    return OSP_OK;
fail:
    free_acts(g);
    return s;
}

/* The Quest kernels' workspace for op list gr's ATTENTION ops without a window (the largest of their
 * shapes) at the current block-table width, grown when short (which drops the graphs). */
static osp_status reserve_sparse_ws(cuda_backend *g, const osp_graph *gr, const osp_dev_sparse *ds) {
    size_t need = 0;
    for (int32_t k = 0; k < gr->n_ops; k++) {
        const osp_op *op = &gr->ops[k];
        if (op->kind != OSP_OP_ATTENTION || op->p.attn.window > 0) continue;
        const sp_layout L = sp_layout_of(SPARSE_ROWS, op->p.attn.n_head, op->p.attn.n_head_kv, op->p.attn.head_dim,
                                         ds->topk_pages, ds->block_size, g->cap_w);
        need = L.total > need ? L.total : need;
    }
    if (need <= g->sp_ws_bytes) return OSP_OK;
    OSP_TRY(osp_cuda_stream_sync(g->stream));
    drop_graphs(g);
    osp_cuda_free(g->sp_ws);
    g->sp_ws = NULL;
    g->sp_ws_bytes = 0;
    OSP_TRY(osp_cuda_malloc(&g->sp_ws, need, "the sparse attention workspace"));
    g->sp_ws_bytes = need;
    return OSP_OK;
}

/* An on-by-default switch: false when the environment variable `name` is "0", read once into *cache
 * (-1 before). For the A/B comparisons on a device below; the paths they choose give the same bits. */
static bool env_switch(const char *name, int *cache) {
    if (*cache < 0) {
        const char *e = getenv(name);
        *cache = e && !strcmp(e, "0") ? 0 : 1;
    }
    return *cache == 1;
}

/* OSPREY_QMMA_MERGE_PARTS=0: one launch per part even where parts could share one */
static bool merge_parts(void) {
    static int v = -1;
    return env_switch("OSPREY_QMMA_MERGE_PARTS", &v);
}

/* y [R, w->rows] = x [R, w->cols] w^T for a matrix placed quantized (place_quantized): the rows of x
 * quantized QX_ROWS at a time (osp_cuda_qx_quantize; `ready` when x's producer already wrote them, see
 * fused_qx), then one osp_cuda_qmatmul per part into its columns of y. Every row's bits depend only on
 * its own x row and the weights, at any R. */
static osp_status matmul_quantized(cuda_backend *g, const osp_tensor *w, const void *x, void *y, bool y_f32,
                                   int64_t R, const osp_cuda_qx *ready, void *st) {
    const int64_t N = w->rows, K = w->cols;
    const size_t esz = y_f32 ? 4 : 2;
    for (int64_t r0 = 0; r0 < R; r0 += QX_ROWS) {
        const int64_t rn = R - r0 < QX_ROWS ? R - r0 : QX_ROWS;
        osp_cuda_qx qx = {0};
        if (ready && r0 == 0 && ready->T == rn && ready->K == K)
            qx = *ready; /* x's producer wrote it quantized (fused_qx) */
        int64_t c0 = 0;
        for (int32_t i = 0; i < w->n_parts;) {
            /* the activation group the part's type reads (osp_cuda_qmatmul_group): quantized again
             * only where it changes between parts (a K-quant part beside a Q8_0 one, say) */
            const int32_t group = osp_cuda_qmatmul_group(w->parts[i].type);
            if (qx.group != group)
                OSP_TRY(osp_cuda_qx_quantize((const uint16_t *)x + (size_t)r0 * (size_t)K, rn, K, group, g->qx,
                                             g->qx_bytes, &qx, st));
            /* adjacent parts of one type that lie back to back (place_quantized pads a part to 256 bytes
             * only when its size needs it) run as one launch: more row tiles for the small k / v
             * parts, and the same bits (a row's arithmetic does not depend on its tile) */
            const osp_tensor_part *p = &w->parts[i];
            int64_t rows = p->rows;
            int32_t j = i + 1;
            while (merge_parts() && j < w->n_parts && w->parts[j].type == p->type && w->parts[j].row_bytes == p->row_bytes &&
                   (const char *)w->parts[j].data == (const char *)p->data + (size_t)rows * p->row_bytes)
                rows += w->parts[j++].rows;
            OSP_TRY(osp_cuda_qmatmul(p->type, p->data, p->row_bytes, rows, &qx,
                                     (char *)y + ((size_t)r0 * (size_t)N + (size_t)c0) * esz, N, y_f32, st));
            c0 += rows;
            i = j;
        }
    }
    return OSP_OK;
}

/* OSPREY_CUDA_FUSE_QX=0: neither the GLU nor the residual add + RMSNorm writes its output's quantized
 * form (the quantized matmul then quantizes its input itself; the same bytes, one launch more) */
static bool fuse_qx_enabled(void) {
    static int v = -1;
    return env_switch("OSPREY_CUDA_FUSE_QX", &v);
}

/* The activation group the next op reads (osp_cuda_qmatmul_group) when op k's output (R rows) is what
 * that op, a matmul on a quantized matrix, quantizes, else 0: then op k's kernel (the GLU; the residual add + RMSNorm where osp_cuda_add_rmsnorm_qx takes the shape)
 * writes it quantized into g->qx too and the matmul skips its own quantization (one launch less; the
 * bytes are the same). Only within one QX_ROWS chunk, and only for the very next
 * op, so nothing can overwrite the workspace or the activation in between. */
static int32_t fused_qx(const cuda_backend *g, const osp_graph *gr, int32_t k, int64_t R) {
    if (!g->quant_weights || !fuse_qx_enabled() || k + 1 >= gr->n_ops || R <= 0 || R > QX_ROWS) return 0;
    const osp_op *op = &gr->ops[k], *nx = &gr->ops[k + 1];
    if (nx->kind != OSP_OP_MATMUL || !nx->w || op->dst < 0 || nx->src0 != op->dst ||
        nx->w->parts[0].type == OSP_DTYPE_BF16)
        return 0;
    /* token rows (not the logits rows), so both ops run R = T rows */
    const int32_t group = osp_cuda_qmatmul_group(nx->w->parts[0].type);
    return gr->acts[op->dst].rows != OSP_ROWS_LOGITS && group > 0 && nx->w->cols % group == 0 &&
                   osp_cuda_qx_workspace_bytes(R, nx->w->cols) <= g->qx_bytes
               ? group
               : 0;
}

/* The sparse rows of ATTENTION op `op` (no window; its dense output already in dst): g->sp.rows gathered
 * rows, SPARSE_ROWS at a time: q rows gathered, Quest's pages selected from the layer's summaries, the
 * work table built, block-sparse attention over it, the rows scattered over dst. Every launch is sized
 * by the chunk's row count and the budget only, and each row's bits depend on its own inputs alone (the
 * kernels' contracts in cuda_ops.h), so a token's output does not depend on the rest of its batch. */
static osp_status enqueue_sparse(cuda_backend *g, const osp_op *op, const osp_kv_cache *kv, const void *q, void *dst,
                                 const int32_t *bt) {
    const osp_dev_sparse *ds = g->sp.ds;
    const int H = op->p.attn.n_head, HK = op->p.attn.n_head_kv, D = op->p.attn.head_dim;
    const int32_t K = ds->topk_pages, bs = kv->block_size, W = (int32_t)g->cap_w;
    const sp_layout L = sp_layout_of(SPARSE_ROWS, H, HK, D, K, bs, W);
    if (L.total > g->sp_ws_bytes)
        return osp_set_error(OSP_ERR_INTERNAL, "cuda: the sparse attention workspace is short (%zu of %zu bytes)",
                             g->sp_ws_bytes, L.total);
    char *ws = g->sp_ws;
    const size_t lay = (size_t)op->layer * (size_t)ds->num_blocks * (size_t)ds->n_head_kv * (size_t)ds->head_dim * 2;
    const void *kmin = (const char *)ds->kmin + lay, *kmax = (const char *)ds->kmax + lay;
    const size_t row_bytes = (size_t)H * (size_t)D * 2;
    void *st = g->stream;
    for (int32_t c0 = 0; c0 < g->sp.rows; c0 += SPARSE_ROWS) {
        const int32_t n = g->sp.rows - c0 < SPARSE_ROWS ? g->sp.rows - c0 : SPARSE_ROWS;
        const int32_t *tok = g->sp.tok + c0, *pos = g->sp.pos + c0, *seq = g->sp.seq + c0;
        uint16_t *qg = (uint16_t *)(ws + L.q), *og = (uint16_t *)(ws + L.o);
        int32_t *sel = (int32_t *)(ws + L.sel), *counts = (int32_t *)(ws + L.counts);
        int32_t *indptr = (int32_t *)(ws + L.indptr), *indices = (int32_t *)(ws + L.indices);
        int32_t *pages = (int32_t *)(ws + L.pages), *flags = (int32_t *)(ws + L.flags);
        uint32_t *tmask = (uint32_t *)(ws + L.tmask);
        OSP_TRY(osp_cuda_rows_copy(q, qg, tok, n, row_bytes, false, st));
        OSP_TRY(osp_cuda_quest_select(kmin, kmax, OSP_CUDA_QUEST_F16, qg, pos, seq, bt, W, bs, n, H, HK, D, K,
                                      ds->sink_pages, ds->recent_pages, (float *)(ws + L.scores), sel, counts, st));
        OSP_TRY(osp_cuda_quest_table(sel, counts, K, pos, seq, g->sp.seql, bt, W, bs, n, HK, indptr, indices, pages,
                                     flags, tmask, st));
        const osp_cuda_sparse_table wt = {.d_indptr = indptr, .d_indices = indices, .d_pages = pages, .d_flags = flags,
                                          .d_tmask = tmask, .num_rows = n * HK, .groups = HK,
                                          .mask_words = (bs + 31) / 32, .max_row_tiles = K};
        OSP_TRY(osp_cuda_sparse_attention_decode(&wt, qg, kv->k[op->layer], kv->v[op->layer], OSP_KV_PAGE_F16, og, n,
                                                 pos, seq, g->sp.seql, bt, W, bs, H, HK, D, op->p.attn.scale, NULL,
                                                 L.att_bytes ? ws + L.att : NULL, L.att_bytes, st));
        OSP_TRY(osp_cuda_rows_copy(og, dst, tok, n, row_bytes, true, st));
    }
    return OSP_OK;
}

/* Enqueues op list gr for T tokens / S sequences / L logits rows whose inputs are in d_in. */
static osp_status enqueue(cuda_backend *g, const osp_graph *gr, osp_kv_cache *kv, int64_t T, int32_t S, int64_t L) {
    const in_layout lay = layout_of(g);
    const int32_t *ids = g->d_in + lay.ids, *pos = g->d_in + lay.pos, *slot = g->d_in + lay.slot;
    const int32_t *qsl = g->d_in + lay.qsl, *bt = g->d_in + lay.bt, *lidx = g->d_in + lay.lidx;
    /* one page type for K and V: cuda_supports_kv refuses a split cache at creation, so v_fmt == k_fmt */
    const uint32_t kvt = kv->k_fmt.elem_type; /* the kernels check it is a type they have */
    const int32_t per = kv->k_fmt.fixed_scales_per_layer; /* fp8 / nvfp4 pages: their scales, per layer */
    const bool quant = per > 0 || kvt == OSP_KV_PAGE_INT8H; /* pages with an osp_cuda_kv_quant */
    void *st = g->stream;
    osp_cuda_qx qx_ready; /* valid for op k while qx_for == k: written by op k - 1 */
    int32_t qx_for = -1;
    for (int32_t k = 0; k < gr->n_ops; k++) {
        const osp_op *op = &gr->ops[k];
        void *dst = op->dst >= 0 ? g->act[op->dst] : NULL;
        void *s0 = op->src0 >= 0 ? g->act[op->src0] : NULL, *s1 = op->src1 >= 0 ? g->act[op->src1] : NULL;
        const int64_t R = op->src0 >= 0 && gr->acts[op->src0].rows == OSP_ROWS_LOGITS ? L : T;
        const void *w = op->w ? op->w->parts[0].data : NULL;
        osp_cuda_kv_quant kq = {0};
        if (quant && (op->kind == OSP_OP_ROPE_KV_WRITE || op->kind == OSP_OP_ATTENTION)) {
            if (per > 0) {
                const size_t lo = (size_t)op->layer * (size_t)per, vo = (size_t)kv->n_layer * (size_t)per;
                kq.d_k_fixed = g->d_kv_fixed + lo;
                kq.d_v_fixed = g->d_kv_fixed + vo + lo;
            }
            kq.d_k_scale = kv->k_scale[op->layer]; /* nvfp4's scales, int8_hier's lower codes (NULL for fp8) */
            kq.d_v_scale = kv->v_scale[op->layer];
            kq.hier_upper_only = kv->hier_upper_only; /* how attention reads int8_hier pages (kv_layout.h) */
            kq.hier_full_recent = kv->hier_full_recent;
        }
        g->base.launches++; /* one launcher call an op (osp_backend.launches) */
        if (g->op_times) OSP_TRY(osp_cuda_event_record(g->op_ev[k], st));
        switch (op->kind) {
        case OSP_OP_EMBED:
            if (op->w->parts[0].type != OSP_DTYPE_BF16)
                OSP_TRY(osp_cuda_qembed(op->w->parts[0].type, w, op->w->parts[0].row_bytes, ids, dst, T, op->w->cols,
                                        op->p.embed.scale, st));
            else
                OSP_TRY(osp_cuda_embed(w, ids, dst, T, op->w->cols, op->p.embed.scale, st));
            break;
        case OSP_OP_ADD_RMSNORM: {
            const int64_t E = gr->acts[op->src1].cols;
            const int32_t group = fused_qx(g, gr, k, T);
            /* its alignment needs (the unfused kernel falls back to scalar loads instead) */
            const bool aligned = ((uintptr_t)s1 % 16 == 0) && ((uintptr_t)w % 16 == 0) && ((uintptr_t)dst % 8 == 0) &&
                                 ((uintptr_t)s0 % 8 == 0);
            if (group && g->d_norm_sync && aligned && osp_cuda_add_rmsnorm_qx_supported(T, E, group)) {
                /* the norm writes its output quantized too, its row over several CTAs (T <= 8) */
                OSP_TRY(osp_cuda_add_rmsnorm_qx(s1, s0, w, dst, T, E, op->p.norm.eps, group, g->d_norm_sync, g->qx,
                                                g->qx_bytes, &qx_ready, st));
                qx_for = k + 1;
                break;
            }
            OSP_TRY(osp_cuda_add_rmsnorm(s1, s0, w, dst, T, E, op->p.norm.eps, st));
            break;
        }
        case OSP_OP_GATHER_RMSNORM:
            OSP_TRY(osp_cuda_gather_rmsnorm(s1, lidx, w, dst, L, gr->acts[op->src1].cols, op->p.norm.eps, st));
            break;
        case OSP_OP_MATMUL:
            if (op->w->parts[0].type != OSP_DTYPE_BF16)
                OSP_TRY(matmul_quantized(g, op->w, s0, dst, gr->acts[op->dst].type == OSP_DTYPE_F32, R,
                                         qx_for == k ? &qx_ready : NULL, st));
            else
                OSP_TRY(osp_cuda_gemm_bf16(g->gemm, s0, w, dst, gr->acts[op->dst].type == OSP_DTYPE_F32, R,
                                           op->w->rows, op->w->cols, st));
            break;
        case OSP_OP_ROPE_KV_WRITE:
            OSP_TRY(osp_cuda_rope_kv_write_q(s0, w, op->w1 ? op->w1->parts[0].data : NULL,
                                             op->w2 ? op->w2->parts[0].data : NULL, pos, op->w3->parts[0].data, slot,
                                             dst, kv->k[op->layer], kv->v[op->layer], kvt, quant ? &kq : NULL, T,
                                             op->p.rope.n_head, op->p.rope.n_head_kv, op->p.rope.head_dim,
                                             op->p.rope.n_rot, op->p.rope.neox, op->p.rope.eps, st));
            break;
        case OSP_OP_ATTENTION: {
            /* sparse attention (g->sp): layers without a window; sliding-window layers stay dense */
            const bool sparse = g->sp.ds && op->p.attn.window <= 0;
            const osp_dev_sparse *ds = g->sp.ds;
            if (sparse && g->sp.refresh > 0) { /* the summaries of the pages this step wrote, before any read */
                const size_t loff =
                    (size_t)op->layer * (size_t)ds->num_blocks * (size_t)ds->n_head_kv * (size_t)ds->head_dim * 2;
                OSP_TRY(osp_cuda_quest_refresh(kv->k[op->layer], g->sp.rf_blk, g->sp.rf_n, g->sp.refresh,
                                               kv->block_size, op->p.attn.n_head_kv, op->p.attn.head_dim,
                                               (char *)ds->kmin + loff, (char *)ds->kmax + loff, st));
            }
            /* the dense kernel: every token (a sparse decode row at position 0, its output overwritten below) */
            OSP_TRY(osp_cuda_paged_attention_q(s0, kv->k[op->layer], kv->v[op->layer], kvt, quant ? &kq : NULL, dst,
                                               S, qsl, sparse ? g->sp.pdense : pos, bt, (int32_t)g->cap_w,
                                               kv->block_size, T, op->p.attn.n_head, op->p.attn.n_head_kv,
                                               op->p.attn.head_dim, op->p.attn.scale, op->p.attn.window,
                                               (int32_t)g->attn_len, g->attn_ws, st));
            if (sparse && g->sp.rows > 0) OSP_TRY(enqueue_sparse(g, op, kv, s0, dst, bt));
            break;
        }
        case OSP_OP_GLU: {
            const int32_t group = fused_qx(g, gr, k, R);
            if (group) {
                OSP_TRY(osp_cuda_glu_qx(s0, dst, R, gr->acts[op->dst].cols, op->p.glu.act == OSP_GLU_GELU_TANH, group,
                                        g->qx, g->qx_bytes, &qx_ready, st));
                qx_for = k + 1;
                break;
            }
            OSP_TRY(op->p.glu.act == OSP_GLU_GELU_TANH
                        ? osp_cuda_gelu_mul(s0, dst, R, gr->acts[op->dst].cols, st)
                        : osp_cuda_silu_mul(s0, dst, R, gr->acts[op->dst].cols, st));
            break;
        }
        case OSP_OP_ADD:
            OSP_TRY(osp_cuda_add_rmsnorm(dst, s0, NULL, NULL, T, gr->acts[op->dst].cols, 0.0f, st));
            break;
        case OSP_OP_SCALE:
        case OSP_OP_SOFTCAP: {
            const int64_t n = (gr->acts[op->dst].rows == OSP_ROWS_LOGITS ? L : T) * gr->acts[op->dst].cols;
            OSP_TRY(op->kind == OSP_OP_SOFTCAP ? osp_cuda_softcap_f32(s0, dst, n, op->p.scale.s, st)
                                               : osp_cuda_scale_f32(s0, dst, n, op->p.scale.s, st));
            break;
        }
        case OSP_OP_COPY: /* a device-to-device copy on the stream (graph-capturable) */
        case OSP_OP_ALL_GATHER: /* one rank: the same copy */
            OSP_TRY(osp_cuda_d2d(dst, s0, act_size(&gr->acts[op->dst], R, R), st));
            break;
        case OSP_OP_ALL_REDUCE: break; /* one rank (the backend takes no communicator): the identity */
        default: return osp_set_error(OSP_ERR_INTERNAL, "cuda: op kind %d", (int)op->kind);
        }
    }
    if (g->op_times) OSP_TRY(osp_cuda_event_record(g->op_ev[gr->n_ops], st));
    return OSP_OK;
}

/* OSPREY_CUDA_OP_TIMES: events for n ops (n + 1), made as needed. */
static osp_status op_events(cuda_backend *g, int32_t n) {
    if (n + 1 <= g->n_op_ev) return OSP_OK;
    void **ev = realloc(g->op_ev, sizeof *ev * (size_t)(n + 1));
    if (!ev) return osp_set_error(OSP_ERR_NOMEM, "cuda: out of memory for op timing events");
    g->op_ev = ev;
    while (g->n_op_ev < n + 1) {
        OSP_TRY(osp_cuda_event_create(&g->op_ev[g->n_op_ev]));
        g->n_op_ev++;
    }
    return OSP_OK;
}

/* OSPREY_CUDA_OP_TIMES: waits for the run's ops and adds their times to phase d. */
static osp_status op_times_add(cuda_backend *g, const osp_graph *gr, int d) {
    OSP_TRY(osp_cuda_stream_sync(g->stream));
    for (int32_t k = 0; k < gr->n_ops; k++) {
        float ms = 0.0f;
        OSP_TRY(osp_cuda_event_elapsed_ms(g->op_ev[k], g->op_ev[k + 1], &ms));
        g->op_ms[d][gr->ops[k].kind] += (double)ms;
        g->op_calls[d][gr->ops[k].kind]++;
    }
    g->op_steps[d]++;
    return OSP_OK;
}

/* The key count a run's attention launches are sized for: the batch's longest sequence rounded up to a
 * step of an eighth of its power of two (at least 1,024 keys), at most cap_len. The kernels' split-mode
 * grid, chunk runs and merge follow it, so it must cover every sequence; the block-table capacity
 * (cap_len, a power of two of the longest ever seen) overshot a 32.8k context by 2x: half the split grid
 * empty and the merge reading twice the partials (OSPREY_CUDA_OP_TIMES on an H100: attention ~1.5-2x
 * attn_bench's time at the same shape). A row's bits do not depend on it (chunks are fixed key ranges of
 * its own sequence). A graph captured at one length replays only at that length. Measured on an H100
 * (8B, batch 2 at 32k, graphs on): f16 190.5 -> 209.6, nvfp4 190.5 -> 221.1 decode tok/s; the engine GPU
 * tests pass with it. OSPREY_CUDA_ATTN_LEN=cap keeps the capacity (A/B runs). */
static int64_t attn_len_of(const cuda_backend *g, const osp_batch *b) {
    if (g->attn_len_cap) return g->cap_len;
    int64_t n = 1;
    for (int32_t s = 0; s < b->num_seqs; s++) n = b->seq_lens[s] > n ? b->seq_lens[s] : n;
    int64_t p = 1;
    while (p * 2 <= n) p *= 2;
    const int64_t step = p / 8 > 1024 ? p / 8 : 1024;
    const int64_t len = (n + step - 1) / step * step;
    return len < g->cap_len ? len : g->cap_len;
}

/* The graph-ladder size for a pure decode batch of n sequences, or -1. */
static int graph_slot(int32_t n) {
    for (int i = 0; i < N_GRAPH_SIZES; i++)
        if (k_graph_sizes[i] >= n) return i;
    return -1;
}

static bool is_pure_decode(const osp_batch *b) {
    if (b->num_tokens != b->num_seqs || b->num_logits != b->num_tokens) return false;
    for (int32_t i = 0; i < b->num_logits; i++)
        if (b->logits_indices[i] != i) return false;
    return true;
}

/* How step b runs under a graph (cuda_run): at w tokens a sequence (returned), or eagerly (0). Every
 * token's logits must be wanted in order. Sequences all of one length w <= max_w take that w (a decode,
 * w = 1, or verification rows of w - 1 drafts each); otherwise at most kPadSeqs sequences of up to max_w
 * tokens are padded to max_w (*pad; pad_step), where the launches, not the padding's work, are the cost,
 * so one graph a size serves every draft count. With sparse attention decodes only (its graphed lists
 * hold one sparse token a sequence). */
enum { kPadSeqs = 8 };
static int graph_plan(const osp_batch *b, int max_w, bool sparse, bool *pad) {
    *pad = false;
    if (b->num_seqs < 1 || b->num_logits != b->num_tokens) return 0;
    for (int32_t i = 0; i < b->num_logits; i++)
        if (b->logits_indices[i] != i) return 0;
    const int32_t q0 = b->query_start_loc[1] - b->query_start_loc[0];
    int32_t qmax = 0;
    bool uniform = true;
    for (int32_t s = 0; s < b->num_seqs; s++) {
        const int32_t q = b->query_start_loc[s + 1] - b->query_start_loc[s];
        if (q < 1) return 0;
        qmax = q > qmax ? q : qmax;
        uniform &= q == q0;
    }
    if (uniform && q0 == 1) return 1;
    if (sparse || qmax > max_w) return 0;
    if (b->num_seqs > kPadSeqs) return uniform ? (int)q0 : 0;
    *pad = true;
    return max_w;
}

/* Host fp32 rows <-> an activation in its dtype (bf16 converted on the host), synchronous. */
static osp_status act_copy(cuda_backend *g, const osp_graph *gr, const osp_act_io *a, int64_t T, int64_t L) {
    if (a->act < 0 || a->act >= gr->n_acts) return osp_set_error(OSP_ERR_INVALID_ARG, "cuda backend: no activation %d", a->act);
    const osp_act *ac = &gr->acts[a->act];
    const size_t n = (size_t)(ac->rows == OSP_ROWS_LOGITS ? L : T) * (size_t)ac->cols;
    if (ac->type == OSP_DTYPE_F32) {
        OSP_TRY(a->input ? osp_cuda_h2d(g->act[a->act], a->host, n * 4, g->stream)
                         : osp_cuda_d2h(a->host, g->act[a->act], n * 4, g->stream));
        return osp_cuda_stream_sync(g->stream);
    }
    uint16_t *tmp = malloc(n * 2 + 2);
    if (!tmp) return osp_set_error(OSP_ERR_NOMEM, "cuda backend: out of memory");
    osp_status s = OSP_OK;
    if (a->input) {
        for (size_t i = 0; i < n; i++) tmp[i] = osp_fp32_to_bf16(a->host[i]);
        s = osp_cuda_h2d(g->act[a->act], tmp, n * 2, g->stream);
        if (s == OSP_OK) s = osp_cuda_stream_sync(g->stream);
    } else {
        s = osp_cuda_d2h(tmp, g->act[a->act], n * 2, g->stream);
        if (s == OSP_OK) s = osp_cuda_stream_sync(g->stream);
        for (size_t i = 0; s == OSP_OK && i < n; i++) a->host[i] = osp_bf16_to_fp32(tmp[i]);
    }
    free(tmp);
    return s;
}

/* A quantized cache's fixed scales (host, kv_cache.c) onto the device, K then V, into d_kv_fixed (grown
 * when too small); nothing for f16 / f32 caches. Synchronous; called when another cache is first run,
 * never during a graph capture. */
static osp_status upload_kv_fixed(cuda_backend *g, const osp_kv_cache *kv) {
    const int32_t per = kv->k_fmt.fixed_scales_per_layer;
    if (per <= 0) return OSP_OK;
    const size_t n = (size_t)kv->n_layer * (size_t)per, bytes = 2 * n * sizeof(float);
    if (bytes > g->kv_fixed_bytes) {
        osp_cuda_free(g->d_kv_fixed);
        g->d_kv_fixed = NULL;
        g->kv_fixed_bytes = 0;
        OSP_TRY(osp_cuda_malloc((void **)&g->d_kv_fixed, bytes, "KV cache scales"));
        g->kv_fixed_bytes = bytes;
    }
    OSP_TRY(osp_cuda_h2d(g->d_kv_fixed, kv->k_fixed, n * sizeof(float), g->stream));
    OSP_TRY(osp_cuda_h2d(g->d_kv_fixed + n, kv->v_fixed, n * sizeof(float), g->stream));
    return osp_cuda_stream_sync(g->stream);
}

/* Lays b out with every sequence at w tokens (sequence s's tokens at rows s w ..): a sequence's real
 * tokens first, then padding tokens that repeat its last token's position (so they read only keys that
 * exist) with token 0 and no KV write; their rows are computed and ignored. A row's result does not
 * depend on the rows beside it (GEMM rows, attention per row), so the real rows get their eager bits.
 * g->lmap maps each wanted row to its padded row for sample and the logits copies. Overwrites the ids,
 * positions, slots, query starts and logits indices h holds for b's sequences. */
static osp_status pad_step(cuda_backend *g, const osp_batch *b, int w, int32_t *h, const in_layout *lay) {
    if (b->num_tokens > g->lmap_cap) {
        int32_t *m = realloc(g->lmap, sizeof *m * (size_t)b->num_tokens);
        if (!m) return osp_set_error(OSP_ERR_NOMEM, "cuda backend: out of memory for a padded step's row map");
        g->lmap = m, g->lmap_cap = b->num_tokens;
    }
    for (int32_t s = 0; s < b->num_seqs; s++) {
        const int32_t q0 = b->query_start_loc[s], q = b->query_start_loc[s + 1] - q0;
        for (int32_t j = 0; j < w; j++) {
            const int32_t r = s * w + j, t = q0 + (j < q ? j : q - 1);
            h[lay->ids + r] = j < q ? b->token_ids[t] : 0;
            h[lay->pos + r] = b->positions[t];
            h[lay->slot + r] = j < q ? b->slot_mapping[t] : -1;
            h[lay->lidx + r] = r;
            if (j < q) g->lmap[t] = r;
        }
        h[lay->qsl + s + 1] = (s + 1) * w;
    }
    g->lmap_n = b->num_tokens;
    return OSP_OK;
}

/* the step timeline's events (cuda_timeline_enable): a run's start starts a step's set over */
enum { TL_RUN0, TL_RUN1, TL_SAMPLE0, TL_WAIT };
static osp_status tl_mark(cuda_backend *g, int which) {
    if (!g->tl_on) return OSP_OK;
    if (which == TL_RUN0) memset(g->tl_have, 0, sizeof g->tl_have);
    OSP_TRY(osp_cuda_event_record(g->tl_ev[which], g->stream));
    g->tl_have[which] = true;
    return OSP_OK;
}

/* This run's sparse attention plan (g->sp) for batch b padded to S sequences / T tokens, its lists
 * written into h_in at lay.sp (packed by this run's sizes; returns their int32 count, 0 when dense), on
 * the host from the step's own inputs, as the CPU hook (src/sparse/engine_hook.c) decides:
 *  - a token at position p is sparse when p / block_size + 1 > topk: prefill tokens included, so a
 *    token's path depends on its position only, never on how its prompt was chunked or batched; a
 *    sparse token that is its sequence's only token in the step (a decode) gets position 0 in the dense
 *    kernel's list (a one-key attention, overwritten), the others keep theirs (the dense kernel then does
 *    work that is thrown away: prefill chunks past the budget pay for both);
 *  - the pages to refresh: for each token t writing a slot, its page when no later token of its sequence
 *    writes the same page, with positions[t] % block_size + 1 written slots.
 * Returns -1 (nothing planned) if the lists would not fit their launch sizes. Launch sizes: eager, the counts; a decode graph (gi >= 0), fixed by its key: S rows when its attention
 * length attn_len exceeds the budget's keys (every sparse token has p < attn_len), else none, and T
 * refresh entries, the unused ones padded (token -1, position 0, sequence 0; block -1). So a replay reads
 * the same device addresses with this step's values. */
static int64_t run_sparse_plan(cuda_backend *g, const osp_batch *b, const osp_kv_cache *kv, osp_dev_sparse *ds, int gi,
                               int32_t S, int64_t T, const in_layout *lay) {
    g->sp = (struct sparse_plan){.ds = ds};
    if (!ds) return 0;
    const int32_t bs = kv->block_size, K = ds->topk_pages, n = b->num_tokens;
    int32_t n_sp = 0, n_rf = 0;
    for (int32_t t = 0; t < n; t++) n_sp += b->positions[t] / bs + 1 > K;
    for (int32_t t = 0; t < n; t++) n_rf += b->slot_mapping[t] >= 0;
    const int32_t rows = gi >= 0 ? (g->attn_len > (int64_t)K * bs ? S : 0) : n_sp;
    const int32_t rf = gi >= 0 ? (int32_t)T : n_rf; /* n_rf: an upper bound of the pages in eager runs */
    if (n_sp > rows || n_rf > rf) return -1; /* cannot happen (see above); refused rather than overrun */
    int32_t *h = g->h_in + lay->sp;
    int32_t *seql = h, *pd = seql + S, *tok = pd + T, *pos = tok + rows, *seq = pos + rows, *rfb = seq + rows,
            *rfn = rfb + rf;
    const int32_t *d = g->d_in + lay->sp;
    g->sp.seql = d, g->sp.pdense = d + (pd - h), g->sp.tok = d + (tok - h), g->sp.pos = d + (pos - h);
    g->sp.seq = d + (seq - h), g->sp.rf_blk = d + (rfb - h), g->sp.rf_n = d + (rfn - h);
    for (int32_t i = 0; i < S; i++) seql[i] = i < b->num_seqs ? b->seq_lens[i] : 1;
    int32_t m = 0, r = 0;
    for (int32_t t = 0, s = 0; t < n; t++) {
        while (s < b->num_seqs - 1 && t >= b->query_start_loc[s + 1]) s++;
        const int32_t p = b->positions[t], slot = b->slot_mapping[t], end = b->query_start_loc[s + 1];
        const bool sp = p / bs + 1 > K, alone = end - b->query_start_loc[s] == 1;
        pd[t] = sp && alone ? 0 : p;
        if (sp) tok[m] = t, pos[m] = p, seq[m] = s, m++;
        if (slot >= 0 && !(t + 1 < end && b->slot_mapping[t + 1] >= 0 && b->slot_mapping[t + 1] / bs == slot / bs))
            rfb[r] = slot / bs, rfn[r] = p % bs + 1, r++;
    }
    for (int32_t t = n; t < T; t++) pd[t] = 0; /* padding rows: position 0 (as in pos) */
    for (; m < rows; m++) tok[m] = -1, pos[m] = 0, seq[m] = 0;
    for (; r < rf; r++) rfb[r] = -1, rfn[r] = 1;
    g->sp.rows = rows;
    g->sp.refresh = rf;
    return (int64_t)(pd - h) + T + 3 * (int64_t)rows + 2 * (int64_t)rf;
}

/* Adds a successful run's sparse counters to ds (osp_sparse_runtime_stats' meaning): per ATTENTION op
 * without a window, its sparse tokens read topk pages a KV head (the selection is exact in count: n_ctx >
 * topk), the others are dense; sliding-window layers run dense here (the CPU hook reads them through a
 * BlockMask and counts them as sparse). */
static void count_sparse(const osp_graph *gr, const osp_batch *b, const osp_kv_cache *kv, osp_dev_sparse *ds) {
    int64_t ops = 0, global = 0;
    for (int32_t k = 0; k < gr->n_ops; k++)
        if (gr->ops[k].kind == OSP_OP_ATTENTION) ops++, global += gr->ops[k].p.attn.window <= 0;
    const int32_t bs = kv->block_size, K = ds->topk_pages, HK = ds->n_head_kv;
    int64_t n_sp = 0, ctx_pages = 0;
    for (int32_t t = 0; t < b->num_tokens; t++) {
        const int32_t pages = b->positions[t] / bs + 1;
        if (pages > K) n_sp++, ctx_pages += pages;
    }
    ds->calls += ops;
    ds->sparse_tokens += n_sp * global;
    ds->dense_tokens += (int64_t)b->num_tokens * ops - n_sp * global;
    ds->tiles_read += n_sp * HK * K * global;
    ds->tiles_dense += ctx_pages * HK * global;
    ds->bytes_read = ds->tiles_read * bs * (int64_t)((kv->k_fmt.bytes_per_token + kv->v_fmt.bytes_per_token) / (size_t)HK);
}

static osp_status cuda_run(osp_backend *be, const osp_graph *gr, osp_kv_cache *kv, const osp_batch *b,
                           const osp_run_io *io) {
    cuda_backend *g = CU(be);
    if (io && io->attn_hook)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "cuda backend: attention hooks run on the CPU only (sparse attention "
                                                  "on the GPU goes through osp_run_io.dev_sparse)");
    osp_dev_sparse *ds = io ? io->dev_sparse : NULL;
    if (ds && (ds->kv_id != kv->id || ds->num_blocks != kv->num_blocks || ds->block_size != kv->block_size ||
               ds->n_layer != kv->n_layer || ds->head_dim != kv->k_fmt.head_dim ||
               (int64_t)ds->n_head_kv * ds->head_dim != kv->k_fmt.kv_row || kv->k_fmt.elem_type != OSP_KV_PAGE_F16 ||
               kv->v_fmt.elem_type != OSP_KV_PAGE_F16))
        return osp_set_error(OSP_ERR_INVALID_ARG, "cuda backend: the sparse attention summaries were made for another "
                                                  "KV cache (or its pages are not f16)");
    /* the upper-only int8_hier view reads each sequence's last hier_full_recent keys in full (attention.cu),
       the CPU's rule for one query token a sequence (QuantSpec's draft passes); several query tokens of a
       sequence would each need their own window */
    if (kv->hier_upper_only && kv->k_fmt.elem_type == OSP_KV_PAGE_INT8H)
        for (int32_t s = 0; s < b->num_seqs; s++)
            if (b->query_start_loc[s + 1] - b->query_start_loc[s] > 1)
                return osp_set_error(OSP_ERR_UNSUPPORTED, "cuda backend: the upper-only int8_hier view takes one query "
                                                          "token a sequence (sequence %d has %d)", s,
                                     b->query_start_loc[s + 1] - b->query_start_loc[s]);
    float *logits = io ? io->logits : NULL;
    const bool has_io = io && io->n_acts > 0;
    g->num_logits = 0; /* until this step's logits are enqueued: a failed step leaves none to read */
    g->logits = NULL;
    g->timed = false; /* until both events of this run are recorded */
    /* a graphed step: w tokens a sequence (graph_plan) */
    bool pad = false;
    const int gwidth = g->use_graphs && !has_io ? graph_plan(b, g->graph_max_width, ds != NULL, &pad) : 0;
    const int gi = gwidth > 0 ? graph_slot(b->num_seqs) : -1;
    const int wi = gi >= 0 ? gwidth - 1 : 0;
    /* padded sizes: a graphed batch runs at its ladder size (eager or graph alike, so the same kernels
     * and GEMM plans see the same shapes either way) */
    const int32_t S = gi >= 0 ? k_graph_sizes[gi] : b->num_seqs;
    const int64_t T = gi >= 0 ? (int64_t)S * gwidth : b->num_tokens, L = gi >= 0 ? T : b->num_logits;
    /* the block table travels only as wide as the longest sequence needs (capacity doubling), not
     * max_model_len / block_size columns per row */
    int64_t need_w = 1;
    for (int32_t s = 0; s < b->num_seqs; s++) {
        const int64_t w = (b->seq_lens[s] + kv->block_size - 1) / kv->block_size;
        need_w = w > need_w ? w : need_w;
    }
    if (g->graphs_kv != kv->id) { /* another cache: the graphs point at the old one's pages, and the
                                    * block size sizes the buffers: start over */
        OSP_TRY(osp_cuda_stream_sync(g->stream));
        free_acts(g);
        g->graphs_kv = 0; /* until its fixed scales are on the device */
        g->graphs_g = NULL;
        OSP_TRY(upload_kv_fixed(g, kv));
        g->graphs_kv = kv->id;
    }
    const osp_op *attn_op = NULL;
    for (int32_t k = 0; k < gr->n_ops && !attn_op; k++)
        if (gr->ops[k].kind == OSP_OP_ATTENTION) attn_op = &gr->ops[k];
    OSP_TRY(reserve(g, gr, T, L, S, need_w, kv->block_size, attn_op));
    if (ds) OSP_TRY(reserve_sparse_ws(g, gr, ds));
    if (gi >= 0 && g->graphs_g != gr) { /* graphs of another op list */
        drop_graphs(g);
        g->graphs_g = gr;
    }
    /* the int8_hier view goes into the attention launches' arguments: graphs captured with another view
     * (the target's full one for a draft's upper-only copy of the same cache, or another recent window)
     * are dropped, never replayed */
    const int64_t view = kv->k_fmt.elem_type == OSP_KV_PAGE_INT8H && kv->hier_upper_only
                             ? (int64_t)kv->hier_full_recent + 1
                             : 0;
    if (gi >= 0 && g->graphs_view != view) {
        OSP_TRY(osp_cuda_stream_sync(g->stream));
        drop_graphs(g);
        g->graphs_view = view;
    }
    if (gi >= 0 && g->graphs_sparse != ds) { /* graphs captured with sparse attention on / off / another config */
        OSP_TRY(osp_cuda_stream_sync(g->stream));
        drop_graphs(g);
        g->graphs_sparse = ds;
    }
    if (osp_cuda_gemm_generation(g->gemm) != g->graphs_gemm_gen) { /* the GEMM workspace moved */
        OSP_TRY(osp_cuda_stream_sync(g->stream));
        drop_graphs(g);
        g->graphs_gemm_gen = osp_cuda_gemm_generation(g->gemm);
    }
    g->attn_len = attn_len_of(g, b);
    /* gw: this size's graph captured at this length, or the way a new capture takes (an empty one, else
     * the least recently replayed, destroyed first) */
    int gw = -1;
    if (gi >= 0) {
        for (int w = 0; w < GRAPH_WAYS && gw < 0; w++)
            if (g->graphs[wi][gi][w] && g->graph_len[wi][gi][w] == g->attn_len) gw = w;
        if (gw < 0) {
            gw = 0;
            for (int w = 0; w < GRAPH_WAYS; w++) {
                if (!g->graphs[wi][gi][w]) {
                    gw = w;
                    break;
                }
                if (g->graph_used[wi][gi][w] < g->graph_used[wi][gi][gw]) gw = w;
            }
            if (g->graphs[wi][gi][gw]) {
                OSP_TRY(osp_cuda_stream_sync(g->stream));
                osp_cuda_graph_destroy(g->graphs[wi][gi][gw]);
                g->graphs[wi][gi][gw] = NULL;
            }
        }
        g->graph_used[wi][gi][gw] = ++g->graph_tick;
    }
    const int64_t copy_w = g->cap_w < b->max_blocks_per_seq ? g->cap_w : b->max_blocks_per_seq;
    const in_layout lay = layout_of(g);
    int32_t *h = g->h_in;
    OSP_TRY(osp_cuda_stream_sync(g->stream)); /* h_in may still be in flight from the last step */
    const int32_t n = b->num_tokens;
    memcpy(h + lay.ids, b->token_ids, (size_t)n * 4);
    memcpy(h + lay.pos, b->positions, (size_t)n * 4);
    memcpy(h + lay.slot, b->slot_mapping, (size_t)n * 4);
    memcpy(h + lay.qsl, b->query_start_loc, (size_t)(b->num_seqs + 1) * 4);
    for (int32_t s = 0; s < b->num_seqs; s++)
        memcpy(h + lay.bt + (size_t)s * (size_t)g->cap_w, b->block_table + (size_t)s * (size_t)b->max_blocks_per_seq,
               (size_t)copy_w * 4);
    if (b->num_logits > 0) memcpy(h + lay.lidx, b->logits_indices, (size_t)b->num_logits * 4);
    g->lmap_n = 0;
    if (pad && gi >= 0) OSP_TRY(pad_step(g, b, gwidth, h, &lay));
    /* padding sequences (a graphed step's ladder): w tokens each at positions 0 .. w - 1 of block 0, token
     * 0, no KV write, their logits rows past the real ones */
    for (int64_t i = pad && gi >= 0 ? (int64_t)b->num_seqs * gwidth : n; i < T; i++) {
        h[lay.ids + i] = 0;
        h[lay.pos + i] = (int32_t)(i % (gi >= 0 ? gwidth : 1));
        h[lay.slot + i] = -1;
        h[lay.lidx + i] = (int32_t)i;
    }
    for (int32_t s = b->num_seqs; s < S; s++) {
        h[lay.qsl + s + 1] = (s + 1) * (gi >= 0 ? gwidth : 1);
        memset(h + lay.bt + (size_t)s * (size_t)g->cap_w, 0, (size_t)g->cap_w * 4);
    }
    /* one copy: everything before the block table, and the table's first S rows */
    OSP_TRY(tl_mark(g, TL_RUN0));
    OSP_TRY(osp_cuda_h2d(g->d_in, h, (lay.bt + (size_t)S * (size_t)g->cap_w) * 4, g->stream));
    const int64_t sp_n = run_sparse_plan(g, b, kv, ds, gi, S, T, &lay); /* after attn_len, which sizes it */
    if (sp_n < 0)
        return osp_set_error(OSP_ERR_INTERNAL, "cuda backend: a decode graph's sparse rows do not cover the step");
    if (sp_n > 0) OSP_TRY(osp_cuda_h2d(g->d_in + lay.sp, h + lay.sp, (size_t)sp_n * 4, g->stream));
    for (int32_t i = 0; has_io && i < io->n_acts; i++)
        if (io->acts[i].input) OSP_TRY(act_copy(g, gr, &io->acts[i], T, L));
    /* time_runs: the ops' device time between two events, both outside any capture (the eager run
     * before a capture is the one timed; the capture itself runs nothing) */
    if (g->time_runs) OSP_TRY(osp_cuda_event_record(g->ev_start, g->stream));
    if (gi >= 0 && g->graphs[wi][gi][gw]) {
        g->base.launches++;
        OSP_TRY(osp_cuda_graph_launch(g->graphs[wi][gi][gw], g->stream));
        if (g->time_runs) OSP_TRY(osp_cuda_event_record(g->ev_end, g->stream));
        OSP_TRY(tl_mark(g, TL_RUN1));
        g->timed = g->time_runs;
    } else {
        if (g->op_times) OSP_TRY(op_events(g, gr->n_ops));
        OSP_TRY(enqueue(g, gr, kv, T, S, L));
        if (g->time_runs) OSP_TRY(osp_cuda_event_record(g->ev_end, g->stream));
        OSP_TRY(tl_mark(g, TL_RUN1));
        g->timed = g->time_runs;
        if (g->op_times) OSP_TRY(op_times_add(g, gr, is_pure_decode(b) ? 1 : 0));
        if (gi >= 0 && osp_cuda_gemm_generation(g->gemm) != g->graphs_gemm_gen) { /* this run's plans moved the
                                                                                     GEMM workspace */
            OSP_TRY(osp_cuda_stream_sync(g->stream));
            drop_graphs(g);
            g->graphs_gemm_gen = osp_cuda_gemm_generation(g->gemm);
        }
        if (gi >= 0) { /* capture this size now that its GEMM plans exist */
            OSP_TRY(osp_cuda_graph_begin(g->stream));
            osp_status s = enqueue(g, gr, kv, T, S, L);
            void *ge = NULL;
            osp_status s2 = osp_cuda_graph_end(g->stream, &ge);
            if (s != OSP_OK) {
                osp_cuda_graph_destroy(ge);
                return s;
            }
            OSP_TRY(s2);
            g->graphs[wi][gi][gw] = ge;
            g->graph_len[wi][gi][gw] = g->attn_len;
        }
    }
    if (gr->logits >= 0) {
        g->logits = g->act[gr->logits];
        g->num_logits = b->num_logits;
    }
    for (int32_t i = 0; has_io && i < io->n_acts; i++)
        if (!io->acts[i].input) OSP_TRY(act_copy(g, gr, &io->acts[i], T, L));
    if (logits && b->num_logits > 0) {
        OSP_TRY(tl_mark(g, TL_SAMPLE0));
        const size_t V = (size_t)be->n_vocab;
        if (g->lmap_n)
            for (int32_t i = 0; i < b->num_logits; i++)
                OSP_TRY(osp_cuda_d2h(logits + (size_t)i * V, g->logits + (size_t)g->lmap[i] * V, V * 4, g->stream));
        else
            OSP_TRY(osp_cuda_d2h(logits, g->logits, (size_t)b->num_logits * V * 4, g->stream));
        OSP_TRY(tl_mark(g, TL_WAIT));
        OSP_TRY(osp_cuda_stream_sync(g->stream));
    }
    if (ds) count_sparse(gr, b, kv, ds);
    return OSP_OK;
}

static osp_status cuda_logits_to_host(osp_backend *be, int32_t row0, int32_t n, float *dst) {
    cuda_backend *g = CU(be);
    if (row0 < 0 || n < 0 || row0 + n > g->num_logits)
        return osp_set_error(OSP_ERR_INVALID_ARG, "logits rows [%d, %d) are outside the last step's %d", row0, row0 + n,
                             g->num_logits);
    const size_t V = (size_t)be->n_vocab;
    if (!g->tl_have[TL_SAMPLE0]) OSP_TRY(tl_mark(g, TL_SAMPLE0));
    if (g->lmap_n)
        for (int32_t i = 0; i < n; i++)
            OSP_TRY(osp_cuda_d2h(dst + (size_t)i * V, g->logits + (size_t)g->lmap[row0 + i] * V, V * 4, g->stream));
    else
        OSP_TRY(osp_cuda_d2h(dst, g->logits + (size_t)row0 * V, (size_t)n * V * 4, g->stream));
    OSP_TRY(tl_mark(g, TL_WAIT));
    return osp_cuda_stream_sync(g->stream);
}

static osp_status cuda_sync(osp_backend *be) { return osp_cuda_stream_sync(CU(be)->stream); }

static osp_status cuda_run_device_us(osp_backend *be, double *us) {
    cuda_backend *g = CU(be);
    *us = 0.0;
    if (!g->time_runs)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "cuda: run timing is off (osp_backend_params.time_runs)");
    if (!g->timed) return osp_set_error(OSP_ERR_INVALID_ARG, "cuda: the last run was not timed (none ran, or it failed)");
    float ms = 0.0f;
    OSP_TRY(osp_cuda_event_elapsed_ms(g->ev_start, g->ev_end, &ms)); /* waits for the end event */
    *us = 1e3 * (double)ms;
    return OSP_OK;
}

/* ---- the step timeline ------------------------------------------------------------------------- */

static osp_status cuda_timeline_enable(osp_backend *be) {
    cuda_backend *g = CU(be);
    if (g->tl_on) return OSP_OK;
    if (!g->tl_ref) OSP_TRY(osp_cuda_event_create(&g->tl_ref));
    for (int i = 0; i < 4; i++)
        if (!g->tl_ev[i]) OSP_TRY(osp_cuda_event_create(&g->tl_ev[i]));
    /* the stream idle, the reference event completes as it is recorded: its host time is the midpoint
       of the clock read before the record and after the wait (a few microseconds apart) */
    OSP_TRY(osp_cuda_stream_sync(g->stream));
    const double t0 = osp_now_s();
    OSP_TRY(osp_cuda_event_record(g->tl_ref, g->stream));
    OSP_TRY(osp_cuda_stream_sync(g->stream));
    g->tl_ref_s = 0.5 * (t0 + osp_now_s());
    memset(g->tl_have, 0, sizeof g->tl_have);
    g->tl_on = true;
    return OSP_OK;
}

static osp_status cuda_timeline_get(osp_backend *be, osp_backend_step_times *t) {
    cuda_backend *g = CU(be);
    t->run[0] = t->run[1] = t->sample[0] = t->sample[1] = -1.0;
    if (!g->tl_on) return osp_set_error(OSP_ERR_INVALID_ARG, "cuda: the step timeline is off (timeline_enable)");
    double *out[4] = {&t->run[0], &t->run[1], &t->sample[0], &t->sample[1]};
    for (int i = 0; i < 4; i++) {
        if (!g->tl_have[i]) continue;
        float ms = 0.0f;
        OSP_TRY(osp_cuda_event_elapsed_ms(g->tl_ref, g->tl_ev[i], &ms)); /* waits for the event */
        *out[i] = g->tl_ref_s + 1e-3 * (double)ms;
    }
    if (t->sample[0] >= 0 && t->sample[1] < 0) t->sample[0] = -1.0;
    return OSP_OK;
}

/* ---- sampling ---------------------------------------------------------------------------------- */

static osp_status sampler_reserve(cuda_backend *g, int32_t rows, int32_t ids, int32_t bias) {
    osp_status s = OSP_OK;
    if (rows > g->cap_r) {
        const int32_t cap = (int32_t)grow(g->cap_r, rows, 64);
        osp_cuda_free(g->s_scratch), osp_cuda_free(g->d_srows), osp_cuda_free(g->d_tokens);
        osp_cuda_free(g->d_status), osp_cuda_free(g->d_lp);
        osp_cuda_host_free(g->h_srows), osp_cuda_host_free(g->h_tokens), osp_cuda_host_free(g->h_status);
        osp_cuda_host_free(g->h_lp);
        g->s_scratch = NULL, g->d_srows = g->h_srows = NULL, g->d_tokens = g->h_tokens = NULL;
        g->d_status = g->h_status = NULL, g->d_lp = g->h_lp = NULL;
        g->cap_r = 0;
        const size_t scratch = osp_cuda_sample_scratch_bytes(cap, (int32_t)g->base.n_vocab);
        if ((s = osp_cuda_malloc(&g->s_scratch, scratch, "sampler scratch")) != OSP_OK ||
            (s = osp_cuda_memset(g->s_scratch, 0, scratch, g->stream)) != OSP_OK ||
            (s = osp_cuda_malloc((void **)&g->d_srows, sizeof *g->d_srows * (size_t)cap, "sampler rows")) != OSP_OK ||
            (s = osp_cuda_malloc((void **)&g->d_tokens, 4 * (size_t)cap, "sampler rows")) != OSP_OK ||
            (s = osp_cuda_malloc((void **)&g->d_status, sizeof(osp_status) * (size_t)cap, "sampler rows")) != OSP_OK ||
            (s = osp_cuda_malloc((void **)&g->d_lp, sizeof(osp_logprobs) * (size_t)cap, "sampler rows")) != OSP_OK ||
            (s = osp_cuda_host_alloc((void **)&g->h_srows, sizeof *g->h_srows * (size_t)cap, "sampler rows")) != OSP_OK ||
            (s = osp_cuda_host_alloc((void **)&g->h_tokens, 4 * (size_t)cap, "sampler rows")) != OSP_OK ||
            (s = osp_cuda_host_alloc((void **)&g->h_status, sizeof(osp_status) * (size_t)cap, "sampler rows")) != OSP_OK ||
            (s = osp_cuda_host_alloc((void **)&g->h_lp, sizeof(osp_logprobs) * (size_t)cap, "sampler rows")) != OSP_OK) {
            free_sampler(g);
            return s;
        }
        g->cap_r = cap;
    }
    if (ids > g->cap_ids) {
        const int32_t cap = (int32_t)grow(g->cap_ids, ids, 4096);
        osp_cuda_free(g->d_ids), osp_cuda_host_free(g->h_ids);
        g->d_ids = g->h_ids = NULL, g->cap_ids = 0;
        if ((s = osp_cuda_malloc((void **)&g->d_ids, 4 * (size_t)cap, "sampler ids")) != OSP_OK ||
            (s = osp_cuda_host_alloc((void **)&g->h_ids, 4 * (size_t)cap, "sampler ids")) != OSP_OK)
            return s;
        g->cap_ids = cap;
    }
    if (bias > g->cap_bias) {
        const int32_t cap = (int32_t)grow(g->cap_bias, bias, 256);
        osp_cuda_free(g->d_bias_ids), osp_cuda_free(g->d_bias_vals);
        osp_cuda_host_free(g->h_bias_ids), osp_cuda_host_free(g->h_bias_vals);
        g->d_bias_ids = g->h_bias_ids = NULL, g->d_bias_vals = g->h_bias_vals = NULL, g->cap_bias = 0;
        if ((s = osp_cuda_malloc((void **)&g->d_bias_ids, 4 * (size_t)cap, "logit bias")) != OSP_OK ||
            (s = osp_cuda_malloc((void **)&g->d_bias_vals, 4 * (size_t)cap, "logit bias")) != OSP_OK ||
            (s = osp_cuda_host_alloc((void **)&g->h_bias_ids, 4 * (size_t)cap, "logit bias")) != OSP_OK ||
            (s = osp_cuda_host_alloc((void **)&g->h_bias_vals, 4 * (size_t)cap, "logit bias")) != OSP_OK)
            return s;
        g->cap_bias = cap;
    }
    return OSP_OK;
}

static bool has_penalties(const osp_sampler_row *r) {
    return r->presence_penalty != 0.0f || r->frequency_penalty != 0.0f || r->repetition_penalty != 1.0f;
}

static osp_status cuda_sample(osp_backend *be, const osp_sampler_row *rows, const int32_t *logits_rows, int32_t n,
                              int32_t *tokens, osp_logprobs *logprobs, osp_status *status) {
    cuda_backend *g = CU(be);
    if (n <= 0) return OSP_OK;
    /* sizes of the packed lists: stop ids while min_tokens is pending, id histories for penalties */
    int64_t nids = 0, nbias = 0;
    bool want_lp = false;
    for (int32_t i = 0; i < n; i++) {
        const osp_sampler_row *r = &rows[i];
        if (logits_rows[i] < 0 || logits_rows[i] >= g->num_logits)
            return osp_set_error(OSP_ERR_INVALID_ARG, "sample: logits row %d is outside the last step's %d", logits_rows[i],
                                 g->num_logits);
        if (r->allowed) /* the engine refuses grammar requests on the device; never ignore a mask */
            return osp_set_error(OSP_ERR_UNSUPPORTED, "sample: grammar masks are not applied on the GPU yet");
        const bool min_pending = r->n_output < r->min_tokens;
        if (min_pending) nids += r->n_stop_token_ids;
        if (has_penalties(r)) nids += r->n_prompt;
        if (has_penalties(r) || min_pending) nids += r->n_output;
        nbias += r->n_logit_bias;
        want_lp |= r->num_logprobs >= 0;
    }
    if (nids > INT32_MAX / 2 || nbias > INT32_MAX / 2) return osp_set_error(OSP_ERR_INVALID_ARG, "sample: id lists too long");
    /* The pinned buffers are free: every call waits for its copies before it returns, except one that
     * failed after enqueuing them. No wait here for the step's forward, so the rows are packed while
     * it runs (a wait here left the GPU idle for the packing: 21 us a step at batch 1, 78 us at 256
     * on an H100, bench/gpu/DECODE.md). */
    if (g->sample_inflight) OSP_TRY(osp_cuda_stream_sync(g->stream));
    g->sample_inflight = false;
    OSP_TRY(sampler_reserve(g, n, (int32_t)nids, (int32_t)nbias));
    int32_t io = 0, bo = 0;
    for (int32_t i = 0; i < n; i++) {
        const osp_sampler_row *r = &rows[i];
        osp_cuda_sample_row *d = &g->h_srows[i];
        memset(d, 0, sizeof *d);
        d->temperature = r->temperature, d->top_p = r->top_p, d->min_p = r->min_p;
        d->presence_penalty = r->presence_penalty, d->frequency_penalty = r->frequency_penalty;
        d->repetition_penalty = r->repetition_penalty;
        /* The id lists travel only when used: the output ids for penalties or a pending min_tokens
         * (the kernel compares n_output with min_tokens and checks every listed id), the prompt ids
         * for penalties, the stop ids while min_tokens is pending (min_tokens is 0 once it is met). */
        const bool pen = has_penalties(r), min_pending = r->n_output < r->min_tokens;
        d->top_k = r->top_k, d->min_tokens = min_pending ? r->min_tokens : 0, d->num_logprobs = r->num_logprobs;
        d->sample_index = r->sample_index, d->seed = r->seed, d->output_pos = r->output_pos;
        d->logits_row = g->lmap_n ? g->lmap[logits_rows[i]] : logits_rows[i];
        d->bias_off = bo, d->n_bias = r->n_logit_bias;
        for (int32_t k = 0; k < r->n_logit_bias; k++, bo++) {
            g->h_bias_ids[bo] = r->logit_bias[k].token_id;
            g->h_bias_vals[bo] = r->logit_bias[k].bias;
        }
        d->stop_off = io;
        if (min_pending) {
            d->n_stop = r->n_stop_token_ids;
            memcpy(g->h_ids + io, r->stop_token_ids, (size_t)r->n_stop_token_ids * 4);
            io += r->n_stop_token_ids;
        }
        d->prompt_off = io;
        if (pen) {
            d->n_prompt = r->n_prompt;
            memcpy(g->h_ids + io, r->prompt_ids, (size_t)r->n_prompt * 4);
            io += r->n_prompt;
        }
        d->output_off = io;
        if (pen || min_pending) {
            d->n_output = r->n_output;
            memcpy(g->h_ids + io, r->output_ids, (size_t)r->n_output * 4);
            io += r->n_output;
        }
    }
    void *st = g->stream;
    if (!g->tl_have[TL_SAMPLE0]) OSP_TRY(tl_mark(g, TL_SAMPLE0));
    g->sample_inflight = true;
    OSP_TRY(osp_cuda_h2d(g->d_srows, g->h_srows, sizeof *g->h_srows * (size_t)n, st));
    if (io) OSP_TRY(osp_cuda_h2d(g->d_ids, g->h_ids, 4 * (size_t)io, st));
    if (bo) {
        OSP_TRY(osp_cuda_h2d(g->d_bias_ids, g->h_bias_ids, 4 * (size_t)bo, st));
        OSP_TRY(osp_cuda_h2d(g->d_bias_vals, g->h_bias_vals, 4 * (size_t)bo, st));
    }
    OSP_TRY(osp_cuda_sample(g->logits, (int32_t)be->n_vocab, g->d_srows, n, g->d_ids, g->d_bias_ids, g->d_bias_vals,
                            g->s_scratch, g->d_tokens, g->d_status, want_lp ? g->d_lp : NULL, st));
    OSP_TRY(osp_cuda_d2h(g->h_tokens, g->d_tokens, 4 * (size_t)n, st));
    OSP_TRY(osp_cuda_d2h(g->h_status, g->d_status, sizeof(osp_status) * (size_t)n, st));
    if (want_lp && logprobs) OSP_TRY(osp_cuda_d2h(g->h_lp, g->d_lp, sizeof(osp_logprobs) * (size_t)n, st));
    OSP_TRY(tl_mark(g, TL_WAIT));
    OSP_TRY(osp_cuda_stream_sync(st));
    g->sample_inflight = false;
    memcpy(tokens, g->h_tokens, 4 * (size_t)n);
    memcpy(status, g->h_status, sizeof(osp_status) * (size_t)n);
    if (want_lp && logprobs)
        for (int32_t i = 0; i < n; i++)
            if (rows[i].num_logprobs >= 0 && status[i] == OSP_OK) logprobs[i] = g->h_lp[i];
    return OSP_OK;
}

/* ---- creation ---------------------------------------------------------------------------------- */

static const osp_backend_vtable k_cuda_vt = {
    .name = "cuda",
    .device = OSP_DEVICE_CUDA,
    .free = cuda_free,
    .place = cuda_place,
    .weight_bytes = cuda_weight_bytes,
    .buffer_alloc = cuda_buffer_alloc,
    .buffer_free = cuda_buffer_free,
    .copy = cuda_copy,
    .to_host = cuda_to_host,
    .copy_host_many = cuda_copy_host_many,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .from_host = cuda_from_host,
    .mem_info = cuda_mem_info,
    .device_uuid = cuda_device_uuid,
    .ipc_handle = cuda_ipc_handle,
    .ipc_open = cuda_ipc_open,
    .ipc_close = cuda_ipc_close,
    .copy_dev_many = cuda_copy_dev_many,
    .supports_op = cuda_supports_op,
    .supports_kv = cuda_supports_kv,
    .supports_dev_sparse = cuda_supports_dev_sparse,
    .run = cuda_run,
    .sample = cuda_sample,
    .logits_to_host = cuda_logits_to_host,
    .sync = cuda_sync,
    .run_device_us = cuda_run_device_us,
    .timeline_enable = cuda_timeline_enable,
    .timeline_get = cuda_timeline_get,
};

int osp_backend_cuda_device_count(void) { return osp_cuda_device_count(); }

osp_status osp_backend_cuda_device_info(osp_device_info *out) {
    memset(out, 0, sizeof *out);
    out->device = OSP_DEVICE_CUDA;
    if (osp_cuda_device_count() <= 0) return osp_set_error(OSP_ERR_UNSUPPORTED, "cuda: no CUDA device is present");
    int major = 0, minor = 0, drv = 0;
    size_t l2 = 0;
    OSP_TRY(osp_cuda_device_props(out->name, sizeof out->name, &major, &minor, &drv, &l2));
    out->arch = major * 10 + minor;
    out->driver_major = drv / 1000;
    out->cache_bytes = l2;
    return OSP_OK;
}

osp_status osp_backend_cuda_gemm_peak_gflops(double *gflops) {
    *gflops = 0.0;
    if (osp_cuda_device_count() <= 0) return osp_set_error(OSP_ERR_UNSUPPORTED, "cuda: no CUDA device is present");
    return osp_cuda_gemm_peak_gflops(8192, 8192, 8192, 20, gflops);
}

bool osp_backend_cuda_attention_env_honoured(char *why, size_t n) {
    const char *e = getenv("OSPREY_CUDA_ATTENTION");
    const int mode = osp_cuda_attention_forced_mode();
    /* the modes this file knows by name; any other value (a newer kernel) must have left AUTO */
    const int want = !e || !e[0] || !strcmp(e, "auto") ? OSP_CUDA_ATTN_AUTO
                     : !strcmp(e, "v0")                ? OSP_CUDA_ATTN_V0
                     : !strcmp(e, "v1")                ? OSP_CUDA_ATTN_V1
                     : !strcmp(e, "fold")              ? OSP_CUDA_ATTN_FOLD
                     : !strcmp(e, "split")             ? OSP_CUDA_ATTN_SPLIT
                                                       : -1;
    const bool ok = want >= 0 ? mode == want
                              : mode != OSP_CUDA_ATTN_AUTO && mode != OSP_CUDA_ATTN_V0 && mode != OSP_CUDA_ATTN_V1 &&
                                    mode != OSP_CUDA_ATTN_FOLD && mode != OSP_CUDA_ATTN_SPLIT;
    if (!ok && why && n)
        snprintf(why, n, want >= 0 ? "OSPREY_CUDA_ATTENTION=%s, but this process already runs attention mode %d"
                                   : "OSPREY_CUDA_ATTENTION=%s names no kernel of this build (mode %d runs)",
                 e ? e : "", mode);
    return ok;
}

osp_status osp_backend_cuda_create(const osp_backend_params *p, osp_backend **out) {
    *out = NULL;
    if (osp_cuda_device_count() <= 0) return osp_set_error(OSP_ERR_UNSUPPORTED, "--device cuda: no CUDA device is present");
    if (!p || !p->pool) return osp_set_error(OSP_ERR_INVALID_ARG, "cuda backend: no thread pool");
    if (p->comm) return osp_set_error(OSP_ERR_UNSUPPORTED, "cuda backend: tensor parallelism needs NCCL collectives, not built yet");
    cuda_backend *g = calloc(1, sizeof *g);
    if (!g) return osp_set_error(OSP_ERR_NOMEM, "cuda: out of memory");
    g->base.vt = &k_cuda_vt;
    g->pool = p->pool;
    const char *ge = getenv("OSPREY_CUDA_GRAPHS"), *ot = getenv("OSPREY_CUDA_OP_TIMES");
    g->op_times = ot && ot[0] && strcmp(ot, "0") != 0;
    g->use_graphs = !(ge && ge[0] == '0') && !g->op_times; /* events inside a capture would time nothing */
    /* OSPREY_CUDA_GRAPH_WIDTH=W (1 .. 8, default 8): verification steps graphed up to W tokens a sequence,
     * small ones padded to W (pad_step); 1: decode steps only, verification rows eager (the earlier
     * behaviour, for A/B runs: bench/spec/NOTES.md) */
    const char *gw = getenv("OSPREY_CUDA_GRAPH_WIDTH");
    g->graph_max_width = gw && gw[0] >= '1' && gw[0] <= '8' && !gw[1] ? gw[0] - '0' : GRAPH_MAX_WIDTH;
    const char *al = getenv("OSPREY_CUDA_ATTN_LEN");
    g->attn_len_cap = al && !strcmp(al, "cap");
    g->time_runs = p->time_runs;
    g->quant_weights = p->quant_weights;
    osp_cuda_set_pdl_default(p->quant_weights);
    osp_status s = osp_cuda_stream_create(&g->stream);
    if (s == OSP_OK) s = osp_cuda_stream_create(&g->side_stream);
    const char *wsmb = getenv("OSPREY_CUDA_GEMM_WS_MB"); /* a diagnostic: the cuBLASLt workspace in MiB */
    const size_t ws = wsmb && atoi(wsmb) > 0 ? (size_t)atoi(wsmb) << 20 : GEMM_WORKSPACE_BYTES;
    if (s == OSP_OK) s = osp_cuda_gemm_create(ws, &g->gemm);
    if (s == OSP_OK && g->time_runs) s = osp_cuda_event_create(&g->ev_start);
    if (s == OSP_OK && g->time_runs) s = osp_cuda_event_create(&g->ev_end);
    if (s != OSP_OK) {
        cuda_free(&g->base);
        return s;
    }
    *out = &g->base;
    return OSP_OK;
}
