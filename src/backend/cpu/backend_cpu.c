/* The CPU backend: runs an op list (src/backend/op.h) as one parallel region of the model's thread
 * pool. Every thread walks the whole list, takes its slice of each op (token rows, matmul output
 * rows, attention (token, head) items) and meets the others at a barrier only where the next op reads
 * rows another thread wrote: an op that reads its input by the same row split the previous op wrote
 * with (norms, RoPE, GLU, the quantization of a matmul's input) follows it without one.
 *
 * Weights stay where the loader found them (the GGUF mapping), in their stored type. Matmuls use
 * int8-quantized activations against block-quantized weights (qdot.c) unless `exact`, and fp32
 * otherwise; with emulate_bf16 every value written to a BF16 activation and every weight the GPU keeps
 * in bf16 is rounded to bf16, which makes this backend a reference for the CUDA backend's precision.
 * These op implementations are also the CPU reference every other backend is tested against
 * (tests/ops/). */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/comm.h"
#include "backend/cpu/fgemm.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/qdot.h"
#include "backend/cpu/qdot8b.h"
#include "backend/cpu/qdot8k.h"
#include "core/dtype.h"
#include "core/status_internal.h"
#include "osprey/kv_cache.h"
#include "core/threadpool.h"
#include "backend/kv_layout.h"

typedef struct cpu_backend {
    osp_backend base;
    osp_threadpool *pool;
    int nt;
    bool exact, emulate;
    bool no_mmap; /* matrices copied onto 2 MB pages (osp_backend_params.no_mmap; copy_weights) */
    bool act_q8; /* one-level activations for the parts of a matmul that have them (qdot8k.h: the
                  * K-quants; qdot8b.h: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) */
    osp_comm *comm;  /* tensor parallelism: ALL_REDUCE's ranks (NULL: one rank, the identity) */
    int32_t tp_rank; /* this backend's rank in comm */
    void **allocs; /* host buffers this backend made (concatenated vectors, KV pages) */
    int32_t n_allocs, cap_allocs;
    struct { char *base; size_t len; } *arenas; /* no_mmap: the anonymous mappings weights were copied into */
    int32_t n_arenas, cap_arenas;
    size_t arena_used; /* bytes used of the last arena */
    /* workspace, grown on demand (never on a steady decode step) */
    float *act[OSP_GRAPH_MAX_ACTS];
    size_t act_cap[OSP_GRAPH_MAX_ACTS]; /* floats */
    float *scratch;                      /* [nt, scratch_cols]: each thread's fgemm panel */
    int64_t scratch_cols;
    float *scores; /* [nt, OSP_CPU_ATTN_MAX_TILE, cap_ctx]: attention's per-item scores */
    int64_t cap_ctx;
    osp_q8_block *xq; /* quantized matmul input, 7 rows past the largest input (padded tail tiles) */
    size_t cap_xq;    /* blocks */
    osp_q8k_block *xqk; /* with act_q8: the input quantized in one level, 7 spare rows as xq */
    size_t cap_xqk;     /* blocks of 256 */
    osp_q8b_block *xqb; /* with act_q8: the input quantized in one level per 32 values, 7 spare rows as xq */
    size_t cap_xqb;     /* blocks of 32 */
    osp_q8b_block *xqbt; /* with act_q8: [nt, OSP_Q8B_STRIP_TOKENS, xqbt_nb]: each thread's block-major copy of a strip's tokens */
    int64_t xqbt_nb;
    float *ypad;      /* [nt, ypad_cap]: each thread's padded tail tile outputs, 8 tokens x its rows */
    size_t ypad_cap;
    osp_q8_pack *pack; /* [nt, OSP_CPU_PACK_GROUPS, pack_nb]: each thread's packed token groups (osp_pack_q8) */
    int64_t pack_nb;   /* blocks a thread's pack holds */
    const float *logits; /* the last run's logits [last_logits, n_vocab] (the caller's buffer) */
    int32_t last_logits;
    bool strips; /* no_mmap with one-level activations on AVX512-VNNI: the 32-value block types' matrices are
                  * copied in 16-row strips (qdot8b.h; OSPREY_CPU_STRIPS=0 keeps them as stored) */
    uint8_t *unpack; /* [nt, unpack_cap]: each thread's row unpacked from strips (a matmul's odd row, a lookup) */
    size_t unpack_cap; /* bytes a thread */
    _Atomic uint64_t *mm_claim; /* [nt, mm_claim_stride]: each thread's slice's claims word per op (mm_take) */
    size_t mm_claim_stride;     /* words a thread's row (>= n_ops, a whole number of cache lines) */
    bool fgemm; /* fp32 matmuls in fgemm.h's tiles (OSPREY_CPU_FGEMM=0: one row and token at a time; the
                 * same bits, an A/B switch; the q8 mode's BF16 path does not depend on it) */
} cpu_backend;

#define CPU(be) ((cpu_backend *)(be))
/* token groups of 8 a tile packs at most (osp_qdot_tile_for: 16 tokens) */
#define OSP_CPU_PACK_GROUPS 2

/* ---- memory ------------------------------------------------------------------------------------ */

static osp_status track(cpu_backend *c, void *p) {
    if (c->n_allocs == c->cap_allocs) {
        const int32_t cap = c->cap_allocs ? 2 * c->cap_allocs : 16;
        void **a = realloc(c->allocs, (size_t)cap * sizeof *a);
        if (!a) return osp_set_error(OSP_ERR_NOMEM, "cpu backend: out of memory");
        c->allocs = a;
        c->cap_allocs = cap;
    }
    c->allocs[c->n_allocs++] = p;
    return OSP_OK;
}

static osp_status cpu_buffer_alloc(osp_backend *be, size_t bytes, const char *what, void **out) {
    (void)be;
    *out = calloc(1, bytes ? bytes : 1);
    if (!*out) return osp_set_error(OSP_ERR_NOMEM, "cpu backend: out of memory for %s (%zu bytes)", what, bytes);
    return OSP_OK;
}

static void cpu_buffer_free(osp_backend *be, void *p) {
    (void)be;
    free(p);
}

static osp_status cpu_copy(osp_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memmove(dst, src, bytes);
    return OSP_OK;
}

static osp_status cpu_to_host(osp_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memcpy(dst, src, bytes);
    return OSP_OK;
}

static osp_status cpu_mem_info(osp_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    const long page = sysconf(_SC_PAGESIZE), avail = sysconf(_SC_AVPHYS_PAGES), total = sysconf(_SC_PHYS_PAGES);
    if (page <= 0 || avail < 0 || total <= 0) return osp_set_error(OSP_ERR_INTERNAL, "cpu backend: no memory figures");
    *free_bytes = (size_t)avail * (size_t)page;
    *total_bytes = (size_t)total * (size_t)page;
    return OSP_OK;
}

static size_t cpu_weight_bytes(const osp_backend *be) {
    (void)be;
    return 0; /* the weights stay in the GGUF mapping */
}

/* ---- weights on 2 MB pages (no_mmap) ------------------------------------------------------------ */

#define OSP_CPU_HUGE ((size_t)2 << 20)
#define OSP_CPU_ARENA ((size_t)64 << 20) /* the least a new arena maps */

/* `bytes` (64-byte aligned) of anonymous memory asked onto transparent huge pages: the weights are bumped
 * into arenas of at least 64 MB, each a 2 MB-aligned anonymous mapping with MADV_HUGEPAGE (a hint: the
 * kernel may give 4 KB pages, which changes only the speed). Errors: OSP_ERR_NOMEM. */
static osp_status arena_take(cpu_backend *c, size_t bytes, void **out) {
    bytes = (bytes + 63) / 64 * 64;
    if (c->n_arenas == 0 || c->arenas[c->n_arenas - 1].len - c->arena_used < bytes) {
        if (c->n_arenas == c->cap_arenas) {
            const int32_t cap = c->cap_arenas ? 2 * c->cap_arenas : 8;
            void *a = realloc(c->arenas, (size_t)cap * sizeof *c->arenas);
            if (!a) return osp_set_error(OSP_ERR_NOMEM, "cpu backend: out of memory");
            c->arenas = a;
            c->cap_arenas = cap;
        }
        const size_t len = ((bytes > OSP_CPU_ARENA ? bytes : OSP_CPU_ARENA) + OSP_CPU_HUGE - 1) & ~(OSP_CPU_HUGE - 1);
        /* one huge page more than needed, then the unaligned head and the tail beyond len unmapped */
        char *m = mmap(NULL, len + OSP_CPU_HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return osp_set_error(OSP_ERR_NOMEM, "cpu backend: cannot map %zu bytes for weights", len);
        char *base = (char *)(((uintptr_t)m + OSP_CPU_HUGE - 1) & ~(uintptr_t)(OSP_CPU_HUGE - 1));
        if (base > m) munmap(m, (size_t)(base - m));
        munmap(base + len, (size_t)(m + OSP_CPU_HUGE - base)); /* > 0: base - m < OSP_CPU_HUGE */
#ifdef MADV_HUGEPAGE
        (void)madvise(base, len, MADV_HUGEPAGE);
#endif
        c->arenas[c->n_arenas].base = base;
        c->arenas[c->n_arenas].len = len;
        c->n_arenas++;
        c->arena_used = 0;
    }
    *out = c->arenas[c->n_arenas - 1].base + c->arena_used;
    c->arena_used += bytes;
    return OSP_OK;
}

/* Copies a stored part into an arena; a part in the file mapping then has its whole pages dropped from
 * the process (the page cache may keep them; a later read would fault them back in). */
static osp_status copy_weights(cpu_backend *c, const osp_weight_src *src, int64_t cols, bool strips, const void **out) {
    const size_t bytes = (size_t)src->rows * src->row_bytes;
    void *dst = NULL;
    OSP_TRY(arena_take(c, bytes, &dst));
    if (strips) osp_q8b_strips_pack(src->type, src->data, src->row_bytes, src->rows, cols / OSP_Q8B_BLOCK, dst);
    else memcpy(dst, src->data, bytes);
    if (src->mapped) {
        const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)src->data;
        const uintptr_t lo = (a + pg - 1) / pg * pg, hi = (a + bytes) / pg * pg;
        if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
    }
    *out = dst;
    return OSP_OK;
}

/* Weights stay in place (or, with no_mmap, the parts a step streams are copied onto 2 MB pages); stacked
 * vectors (q/k/v biases) are concatenated into one host buffer. */
static osp_status cpu_place(osp_backend *be, const osp_weight_src *src, int32_t n, int64_t cols, bool f32_exact,
                            osp_tensor *out) {
    cpu_backend *c = CPU(be);
    memset(out, 0, sizeof *out);
    out->cols = cols;
    for (int32_t i = 0; i < n; i++)
        if (!src[i].data) return osp_set_error(OSP_ERR_UNSUPPORTED, "cpu backend: random weights are drawn on the GPU only");
    if (f32_exact && n > 1) {
        float *buf = malloc((size_t)cols * sizeof *buf);
        if (!buf) return osp_set_error(OSP_ERR_NOMEM, "cpu backend: out of memory");
        const osp_status st = track(c, buf);
        if (st != OSP_OK) {
            free(buf);
            return st;
        }
        size_t off = 0;
        for (int32_t i = 0; i < n; i++) {
            memcpy((char *)buf + off, src[i].data, src[i].row_bytes);
            off += src[i].row_bytes;
        }
        out->rows = 1;
        out->n_parts = 1;
        out->parts[0] = (osp_tensor_part){.data = buf, .type = OSP_DTYPE_F32, .rows = 1, .row_bytes = off};
        return OSP_OK;
    }
    out->n_parts = n;
    for (int32_t i = 0; i < n; i++) {
        const void *data = src[i].data;
        /* strips: a part the one-level GEMV streams, with rows as dense as stored (a whole strip at least) */
        const bool strips = c->strips && !f32_exact && !src[i].lookup && osp_q8b_strips_supports(src[i].type) &&
                            cols % OSP_Q8B_BLOCK == 0 && src[i].rows >= OSP_Q8B_STRIP_ROWS &&
                            src[i].row_bytes == osp_dtype_row_size(src[i].type, cols);
        if (c->no_mmap && !f32_exact && !src[i].lookup) OSP_TRY(copy_weights(c, &src[i], cols, strips, &data));
        out->parts[i] = (osp_tensor_part){.data = data, .type = src[i].type, .rows = src[i].rows,
                                          .row_bytes = src[i].row_bytes,
                                          .layout = strips ? OSP_PART_STRIPS16 : OSP_PART_STORED};
        out->rows += src[i].rows;
    }
    out->round_bf16 = c->emulate && !f32_exact;
    return OSP_OK;
}

static void ws_free(cpu_backend *c) {
    for (int i = 0; i < OSP_GRAPH_MAX_ACTS; i++) {
        free(c->act[i]);
        c->act[i] = NULL;
        c->act_cap[i] = 0;
    }
    free(c->scratch);
    free(c->scores);
    free(c->xq);
    free(c->xqk);
    free(c->xqb);
    c->xqb = NULL;
    c->cap_xqb = 0;
    free(c->xqbt);
    c->xqbt = NULL;
    c->xqbt_nb = 0;
    c->scratch = c->scores = NULL;
    c->xq = NULL;
    c->xqk = NULL;
    c->cap_xqk = 0;
    c->scratch_cols = c->cap_ctx = 0;
    c->cap_xq = 0;
    free(c->ypad);
    c->ypad = NULL;
    c->ypad_cap = 0;
    free(c->pack);
    c->pack = NULL;
    c->pack_nb = 0;
    free(c->unpack);
    c->unpack = NULL;
    c->unpack_cap = 0;
}

static void cpu_free(osp_backend *be) {
    cpu_backend *c = CPU(be);
    ws_free(c);
    free(c->mm_claim);
    for (int32_t i = 0; i < c->n_allocs; i++) free(c->allocs[i]);
    free(c->allocs);
    for (int32_t i = 0; i < c->n_arenas; i++) munmap(c->arenas[i].base, c->arenas[i].len);
    free(c->arenas);
    free(c);
}

/* ---- ops --------------------------------------------------------------------------------------- */

/* Whether a part of type t runs on one-level activations: in super-blocks of 256 (qdot8k.h, the
 * K-quants) or in blocks of 32 (qdot8b.h). */
static bool part_q8k(const cpu_backend *c, uint32_t t) { return c->act_q8 && !c->exact && osp_qdot8k_supports(t); }
static bool part_q8b(const cpu_backend *c, uint32_t t) { return c->act_q8 && !c->exact && osp_qdot8b_supports(t); }

/* Whether the matmul of w quantizes its input in two levels (xq: a part on the default quantized
 * path) and in one level (xqk: a part on the one-level path). */
static bool mm_quantizes2(const cpu_backend *c, const osp_tensor *w) {
    if (c->exact) return false;
    for (int32_t i = 0; i < w->n_parts; i++)
        if (osp_qdot_for(w->parts[i].type) && !part_q8k(c, w->parts[i].type) && !part_q8b(c, w->parts[i].type))
            return true;
    return false;
}
static bool mm_quantizes1(const cpu_backend *c, const osp_tensor *w) {
    for (int32_t i = 0; i < w->n_parts; i++)
        if (part_q8k(c, w->parts[i].type)) return true;
    return false;
}
static bool mm_quantizes1b(const cpu_backend *c, const osp_tensor *w) { /* one level in blocks of 32 (xqb) */
    for (int32_t i = 0; i < w->n_parts; i++)
        if (part_q8b(c, w->parts[i].type)) return true;
    return false;
}
/* Whether the matmul of w quantizes its input at all (the fast path has a kernel for one of its parts). */
static bool mm_quantizes(const cpu_backend *c, const osp_tensor *w) {
    return mm_quantizes2(c, w) || mm_quantizes1(c, w) || mm_quantizes1b(c, w);
}

/* How an op reads its input and writes its output across threads: by the standard split of `rows`
 * rows (osp_split), or in another pattern (0). A barrier is needed before an op unless it reads by the
 * split the previous op wrote with. */
typedef struct split { int64_t in, out; } split;

static split op_split(const cpu_backend *c, const osp_op *op, int64_t T, int64_t L) {
    const int64_t R = op->kind == OSP_OP_GATHER_RMSNORM ? L : T;
    switch (op->kind) {
    case OSP_OP_EMBED: return (split){0, T};
    case OSP_OP_ADD_RMSNORM:
    case OSP_OP_ROPE_KV_WRITE:
        return (split){T, T};
    case OSP_OP_GATHER_RMSNORM: return (split){0, R};
    case OSP_OP_MATMUL: return (split){mm_quantizes(c, op->w) ? -1 : 0, 0}; /* -1: rows of its input */
    case OSP_OP_ATTENTION: return (split){0, 0};
    case OSP_OP_ALL_REDUCE:
    case OSP_OP_ALL_GATHER: return (split){0, 0}; /* thread 0 alone, between barriers */
    case OSP_OP_GLU:
    case OSP_OP_ADD:
    case OSP_OP_COPY:
    case OSP_OP_SCALE:
    case OSP_OP_SOFTCAP:
        return (split){-1, -1};
    default: return (split){0, 0};
    }
}

typedef struct run_ctx {
    cpu_backend *c;
    const osp_graph *g;
    osp_kv_cache *kv;
    const osp_batch *b;
    float **bufs; /* per activation */
    int64_t T, L;
    const osp_attn_hook *hook; /* io->attn_hook, or NULL */
    osp_status *hook_status;   /* the first prepare error of the run (OSP_OK until then) */
    osp_status *comm_status;   /* the first collective's error of the run (OSP_OK until then) */
} run_ctx;

static int64_t rows_of(const run_ctx *r, int32_t act) {
    return r->g->acts[act].rows == OSP_ROWS_LOGITS ? r->L : r->T;
}

static void round_if(const run_ctx *r, int32_t act, float *p, int64_t n) {
    if (r->c->emulate && r->g->acts[act].type == OSP_DTYPE_BF16) osp_cpu_round_bf16(p, n);
}

static void op_embed(const run_ctx *r, const osp_op *op, int ith, int nth) {
    const osp_tensor *w = op->w;
    const int64_t E = w->cols;
    float *x = r->bufs[op->dst];
    long long t0, t1;
    osp_split(r->T, ith, nth, &t0, &t1);
    const osp_tensor_part *p = &w->parts[0];
    for (long long t = t0; t < t1; t++) {
        float *xr = x + t * E;
        const int64_t id = r->b->token_ids[t];
        const void *row = p->layout == OSP_PART_STRIPS16
                              ? osp_q8b_strips_row(p->type, p->data, p->row_bytes, p->rows, E / OSP_Q8B_BLOCK, id,
                                                   r->c->unpack + (size_t)ith * r->c->unpack_cap)
                              : (const uint8_t *)p->data + (size_t)id * p->row_bytes;
        osp_dequant_row(p->type, row, xr, E);
        if (w->round_bf16) osp_cpu_round_bf16(xr, E);
        if (op->p.embed.scale != 1.0f)
            for (int64_t i = 0; i < E; i++) xr[i] *= op->p.embed.scale;
    }
}

static void op_add_rmsnorm(const run_ctx *r, const osp_op *op, int ith, int nth) {
    const int64_t E = r->g->acts[op->src1].cols;
    float *x = r->bufs[op->src1];
    long long t0, t1;
    osp_split(r->T, ith, nth, &t0, &t1);
    if (op->src0 >= 0) {
        const float *d = r->bufs[op->src0];
        for (long long i = t0 * E; i < t1 * E; i++) x[i] += d[i];
    }
    if (op->dst < 0) return;
    float *out = r->bufs[op->dst];
    osp_cpu_rmsnorm(x + t0 * E, op->w->parts[0].data, out + t0 * E, t1 - t0, E, op->p.norm.eps);
    round_if(r, op->dst, out + t0 * E, (t1 - t0) * E);
}

static void op_gather_rmsnorm(const run_ctx *r, const osp_op *op, int ith, int nth) {
    const int64_t E = r->g->acts[op->src1].cols;
    const float *x = r->bufs[op->src1];
    float *out = r->bufs[op->dst];
    long long l0, l1;
    osp_split(r->L, ith, nth, &l0, &l1);
    for (long long i = l0; i < l1; i++)
        memcpy(out + i * E, x + (int64_t)r->b->logits_indices[i] * E, (size_t)E * sizeof(float));
    osp_cpu_rmsnorm(out + l0 * E, op->w->parts[0].data, out + l0 * E, l1 - l0, E, op->p.norm.eps);
    round_if(r, op->dst, out + l0 * E, (l1 - l0) * E);
}

/* One part's rows rr0..rr1 on one-level activations (xqk for the K-quants, in super-blocks of 256; xqb
 * for Q8_0/Q4_0/Q4_1/Q5_0/Q5_1, in blocks of 32). Blocks of 32 on AVX512-VNNI: the tokens in chunks of
 * up to OSP_Q8B_STRIP_TOKENS, a chunk of one by the GEMV, a larger one by strips of 16 rows (the
 * one-token kernel for the last rows % 16). Otherwise tiles of 16 and 8 tokens, then the last 3-7 in one
 * narrower tile (the K-quants: exactly 3-7 tokens; the blocks of 32 without strips: 4, 6 or 8, reading
 * spare rows past R, whose outputs go to this thread's scratch and are dropped), then 1-2 tokens by GEMV. Every kernel gives the one-token kernel's
 * bits (qdot8k.h, qdot8b.h), so the split is invisible. */
static void matmul_onelevel(cpu_backend *c, const osp_tensor_part *p, int64_t K, int64_t R, int64_t N, int64_t rr0,
                            int64_t rr1, float *yp, int ith) {
    const uint8_t *wb = p->data;
    const bool k8 = osp_qdot8k_supports(p->type); /* else blocks of 32 */
    const int64_t nb = k8 ? K / OSP_Q8K_BLOCK : K / OSP_Q8B_BLOCK;
    const osp_qdot8b_strip_fn strip = k8 ? NULL : osp_qdot8b_strip_for(p->type);
    if (p->layout == OSP_PART_STRIPS16) { /* 16-row strips (cpu_place): their GEMV and strip; rows outside
                                             whole strips one at a time, unpacked */
        const osp_qdot8b_fn one = osp_qdot8b_for(p->type);
        const osp_qdot8b_strip_strips_fn sstrip = osp_qdot8b_strip_strips_for(p->type);
        const osp_qdot8b_gemv_strips_fn gstrips = osp_qdot8b_gemv_strips_for(p->type);
        const bool fast = sstrip && gstrips; /* else (the kernel family changed since the load: tests) row by row */
        uint8_t *ub = c->unpack + (size_t)ith * c->unpack_cap;
        osp_q8b_block *bm = c->xqbt + (size_t)ith * OSP_Q8B_STRIP_TOKENS * (size_t)c->xqbt_nb;
        const int64_t S = OSP_Q8B_STRIP_ROWS, full = p->rows / S * S, up = (rr0 + S - 1) / S * S;
        const int64_t a0 = up < rr1 ? up : rr1, e = (rr1 < full ? rr1 : full) / S * S, a1 = fast && e > a0 ? e : a0;
        const size_t strip_bytes = (size_t)S * p->row_bytes;
        for (int64_t t = 0; t < R; t += OSP_Q8B_STRIP_TOKENS) {
            const int64_t n = R - t < OSP_Q8B_STRIP_TOKENS ? R - t : OSP_Q8B_STRIP_TOKENS;
            if (n == 1 && fast) {
                gstrips(wb, p->row_bytes, p->rows, c->xqb + t * nb, nb, yp + t * N, rr0, rr1, ub);
                continue;
            }
            if (a1 > a0) osp_q8b_block_major(c->xqb + t * nb, nb, nb, n, bm);
            for (int64_t rr = a0; rr < a1; rr += S) sstrip(wb + (size_t)(rr / S) * strip_bytes, nb, bm, n, yp + t * N + rr, N);
            for (int h = 0; h < 2; h++) /* the rows before the whole strips, then those after */
                for (int64_t rr = h ? a1 : rr0; rr < (h ? rr1 : a0); rr++) {
                    const void *wr = osp_q8b_strips_row(p->type, wb, p->row_bytes, p->rows, nb, rr, ub);
                    for (int64_t k = t; k < t + n; k++) yp[k * N + rr] = one(wr, c->xqb + k * nb, nb);
                }
        }
        return;
    }
    if (strip && 15 * p->row_bytes < (size_t)INT32_MAX) { /* strips and GEMV gather scales at int32 offsets */
        const osp_qdot8b_fn one = osp_qdot8b_for(p->type);
        const osp_qdot8b_gemv_fn gemv = osp_qdot8b_gemv_for(p->type);
        osp_q8b_block *bm = c->xqbt + (size_t)ith * OSP_Q8B_STRIP_TOKENS * (size_t)c->xqbt_nb;
        for (int64_t t = 0; t < R; t += OSP_Q8B_STRIP_TOKENS) {
            const int64_t n = R - t < OSP_Q8B_STRIP_TOKENS ? R - t : OSP_Q8B_STRIP_TOKENS;
            if (n == 1) { /* the strips' arithmetic on the weights as they lie */
                gemv(wb + (size_t)rr0 * p->row_bytes, p->row_bytes, c->xqb + t * nb, nb, yp + t * N + rr0, rr1 - rr0);
                continue;
            }
            osp_q8b_block_major(c->xqb + t * nb, nb, nb, n, bm); /* this thread's copy of the n tokens */
            int64_t rr = rr0;
            for (; rr + OSP_Q8B_STRIP_ROWS <= rr1; rr += OSP_Q8B_STRIP_ROWS)
                strip(wb + (size_t)rr * p->row_bytes, p->row_bytes, nb, bm, n, yp + t * N + rr, N);
            for (; rr < rr1; rr++)
                for (int64_t k = t; k < t + n; k++) yp[k * N + rr] = one(wb + (size_t)rr * p->row_bytes, c->xqb + k * nb, nb);
        }
        return;
    }
    /* this thread's share of the pack buffer, made for two 8-token two-level packs (2 x 1088 bytes a block
     * of 32): it holds two one-level packs with room to spare (2 x 2752 bytes a super-block of 256, 2 x 576
     * a block of 32) */
    void *pk = c->pack + (size_t)ith * OSP_CPU_PACK_GROUPS * (size_t)c->pack_nb;
    osp_q8k_pack *pkk = pk;
    osp_q8b_pack *pkb = pk;
    int64_t t = 0;
    for (;;) {
        int nt;
        const osp_qdot8k_tile_fn tk = k8 ? osp_qdot8k_tile_for(p->type, R - t, &nt) : NULL;
        const osp_qdot8b_tile_fn tb = k8 ? NULL : osp_qdot8b_tile_for(p->type, R - t, &nt);
        if (!tk && !tb) break;
        for (int g = 0; g < (nt + 7) / 8; g++) {
            if (k8) osp_pack_q8k(c->xqk + (t + 8 * g) * nb, nb, nb, pkk + g * nb);
            else osp_pack_q8b(p->type, c->xqb + (t + 8 * g) * nb, nb, nb, pkb + g * nb);
        }
        const bool full = R - t >= nt;
        const int64_t nr = rr1 - rr0;
        /* row rr's results: column rr of y's rows t.., or (a padded tile) column rr - rr0 of nt x nr scratch */
        float *yt = full ? yp + t * N + rr0 : c->ypad + (size_t)ith * c->ypad_cap;
        const int64_t ys = full ? N : nr;
        for (int64_t rr = rr0; rr < rr1; rr++) {
            if (k8) tk(wb + (size_t)rr * p->row_bytes, nb, pkk, yt + (rr - rr0), ys);
            else tb(wb + (size_t)rr * p->row_bytes, nb, pkb, yt + (rr - rr0), ys);
        }
        if (full) {
            t += nt;
            continue;
        }
        for (int64_t k = t; k < R; k++) memcpy(yp + k * N + rr0, yt + (k - t) * nr, sizeof(float) * (size_t)nr);
        t = R;
    }
    if (k8) {
        const osp_qdot8k_gemv_fn gemv = osp_qdot8k_gemv_for(p->type);
        for (; t < R; t++) gemv(wb + (size_t)rr0 * p->row_bytes, p->row_bytes, c->xqk + t * nb, nb, yp + t * N + rr0, rr1 - rr0);
    } else {
        const osp_qdot8b_gemv_fn gemv = osp_qdot8b_gemv_for(p->type);
        for (; t < R; t++) gemv(wb + (size_t)rr0 * p->row_bytes, p->row_bytes, c->xqb + t * nb, nb, yp + t * N + rr0, rr1 - rr0);
    }
}

/* y = x W^T for W's (stacked) output rows [r0, r1): int8 dot products on the quantized input rows where
 * the fast path has a kernel for the part's type, else fp32 on x. Every row's result is computed the
 * same way whichever range it is in, so how the rows are split among threads changes no bit. */
static void matmul_rows(const run_ctx *r, const osp_op *op, int64_t r0, int64_t r1, int ith) {
    cpu_backend *c = r->c;
    const osp_tensor *w = op->w;
    const int64_t R = rows_of(r, op->src0), K = w->cols, N = w->rows;
    const float *x = r->bufs[op->src0];
    float *y = r->bufs[op->dst];
    const int64_t nb = K / OSP_Q8_BLOCK;
    float *row = c->scratch + (size_t)ith * (size_t)c->scratch_cols;
    int64_t base = 0; /* first stacked row of part i */
    for (int32_t i = 0; i < w->n_parts; i++) {
        const osp_tensor_part *p = &w->parts[i];
        const int64_t lo = r0 > base ? r0 : base, hi = r1 < base + p->rows ? r1 : base + p->rows;
        if (lo < hi) {
            const osp_qdot_fn dot = c->exact ? NULL : osp_qdot_for(p->type);
            float *yp = y + base; /* column `base` of y: part rows land at their stacked offset */
            if (part_q8k(c, p->type) || part_q8b(c, p->type)) {
                matmul_onelevel(c, p, K, R, N, lo - base, hi - base, yp, ith);
            } else if (!dot) {
                const osp_weight wt = {.data = p->data, .type = p->type, .cols = K, .rows = p->rows,
                                       .row_bytes = p->row_bytes, .round_bf16 = w->round_bf16};
                /* one-level mode: BF16 weights meet bf16 activations (llama.cpp's BF16 dot) */
                if (c->act_q8 && osp_cpu_fgemm_bf16_ok(&wt))
                    osp_cpu_fgemm_bf16_rows(&wt, x, yp, N, R, lo - base, hi - base, row);
                else
                    (c->fgemm ? osp_cpu_fgemm_rows : osp_cpu_matmul_rows)(&wt, x, yp, N, R, lo - base, hi - base, row);
            } else {
                /* Tiles of `nt` tokens (token groups outer: their activation blocks stay in L1 while
                 * the slice's weight rows stream past), then the leftover tokens one at a time; the
                 * tile and the one-token kernel give identical bits, so the split is invisible. */
                const uint8_t *wb = p->data;
                osp_q8_pack *mypack = c->pack + (size_t)ith * OSP_CPU_PACK_GROUPS * (size_t)c->pack_nb;
                int64_t t = 0;
                for (;;) { /* the widest tile that fits the tokens left, then the next */
                    int nt;
                    bool packed;
                    const osp_qdot_tile_fn tile = osp_qdot_tile_for(p->type, R - t, &nt, &packed);
                    int np;
                    const osp_qdot_tile_fn pad = nt < 8 ? osp_qdot_tile_padded_for(p->type, R - t, &np) : NULL;
                    if (pad) { /* the last 3-7 tokens in one weight pass: a tile of np >= R - t tokens
                                  into this thread's scratch (xq has room for the rows past R it packs) */
                        float *yt = c->ypad + (size_t)ith * c->ypad_cap;
                        const int64_t nr = hi - lo;
                        osp_pack_q8(c->xq + t * nb, nb, nb, mypack);
                        for (int64_t rr = lo - base; rr < hi - base; rr++)
                            pad(wb + (size_t)rr * p->row_bytes, c->xq + t * nb, nb, nb, mypack, yt + (rr - (lo - base)), nr);
                        for (int64_t k = t; k < R; k++)
                            memcpy(yp + k * N + (lo - base), yt + (k - t) * nr, sizeof(float) * (size_t)nr);
                        t = R;
                        break;
                    }
                    if (!tile) break;
                    /* this thread's copy of the tile's token groups in its register layout (each
                     * thread packs the groups it uses: about 1 % of its rows' work, and no barrier) */
                    if (packed)
                        for (int g = 0; g < nt / OSP_Q8_PACK_TOKENS; g++)
                            osp_pack_q8(c->xq + (t + OSP_Q8_PACK_TOKENS * g) * nb, nb, nb, mypack + g * nb);
                    for (int64_t rr = lo - base; rr < hi - base; rr++)
                        tile(wb + (size_t)rr * p->row_bytes, c->xq + t * nb, nb, nb, packed ? mypack : NULL,
                             yp + t * N + rr, N);
                    t += nt;
                }
                /* the leftover tokens (a decode step's one) one at a time, on block pairs where the
                 * CPU has a GEMV kernel; the pack buffer's room (nb packs) holds a row's pairs */
                const osp_qdot_gemv_fn gemv = osp_qdot_gemv_for(p->type);
                osp_q8_pair *bp = (osp_q8_pair *)(void *)mypack;
                for (; t < R; t++) {
                    const osp_q8_block *xt = c->xq + t * nb;
                    if (gemv) {
                        osp_pack_q8_row(xt, nb, bp);
                        gemv(wb + (size_t)(lo - base) * p->row_bytes, p->row_bytes, xt, bp, nb, yp + t * N + (lo - base),
                             hi - lo);
                    } else {
                        for (int64_t rr = lo - base; rr < hi - base; rr++)
                            yp[t * N + rr] = dot(wb + (size_t)rr * p->row_bytes, xt, nb);
                    }
                }
            }
            if (c->emulate && r->g->acts[op->dst].type == OSP_DTYPE_BF16)
                for (int64_t t = 0; t < R; t++) osp_cpu_round_bf16(yp + t * N + (lo - base), hi - lo);
        }
        base += p->rows;
    }
}

/* A one-token matmul (decode of one sequence) is bound by memory bandwidth, and on a shared bus the
 * threads' equal halves finish at different times. So each thread takes its osp_split slice in chunks of
 * about OSP_CPU_MM_CHUNK_KB of weights from the front (one stream: the GEMV's prefetch past a chunk's end
 * lands in the thread's own next chunk), and a thread done with its slice takes chunks from the back of
 * the others'. A slice's claims are one 64-bit word, rows taken from the front in the low half and from
 * the back in the high half, changed by compare-and-swap (c->mm_claim, zero at a run's start).
 * 0 (or -DOSP_CPU_MM_CHUNK_KB=0): the fixed split alone. */
#ifndef OSP_CPU_MM_CHUNK_KB
#define OSP_CPU_MM_CHUNK_KB 32
#endif

/* The chunk rows for op (whole 16-row strips), or 0 for the fixed split. */
static int64_t mm_chunk(const run_ctx *r, const osp_op *op, int nth) {
    if (OSP_CPU_MM_CHUNK_KB <= 0 || nth < 2 || rows_of(r, op->src0) != 1 || !r->c->mm_claim) return 0;
    const osp_tensor *w = op->w;
    if (w->rows > INT32_MAX) return 0;
    size_t bytes = 0;
    for (int32_t i = 0; i < w->n_parts; i++) bytes += (size_t)w->parts[i].rows * w->parts[i].row_bytes;
    const size_t row_bytes = bytes / (size_t)(w->rows > 0 ? w->rows : 1) + 1;
    const int64_t chunk = ((int64_t)((size_t)OSP_CPU_MM_CHUNK_KB * 1024 / row_bytes) + 15) / 16 * 16;
    return chunk < 16 ? 16 : chunk;
}

/* Claims up to `chunk` rows of slice [s0, s1) whose claims word is *w: from the front or the back.
 * Returns false when the slice has none left. */
static bool mm_take(_Atomic uint64_t *w, int64_t s0, int64_t s1, int64_t chunk, bool front, int64_t *c0, int64_t *c1) {
    uint64_t v = atomic_load_explicit(w, memory_order_relaxed);
    for (;;) {
        const int64_t f = (int64_t)(v & 0xffffffffu), b = (int64_t)(v >> 32), left = (s1 - s0) - f - b;
        if (left <= 0) return false;
        int64_t n = left < chunk ? left : chunk;
        if (!front) { /* from the back: down to a multiple of 16 rows where that is still unclaimed (whole strips) */
            const int64_t lo = (s1 - b - n) / 16 * 16;
            if (lo >= s0 + f) n = s1 - b - lo;
        }
        const uint64_t nv = front ? v + (uint64_t)n : v + ((uint64_t)n << 32);
        if (atomic_compare_exchange_weak_explicit(w, &v, nv, memory_order_relaxed, memory_order_relaxed)) {
            *c0 = front ? s0 + f : s1 - b - n;
            *c1 = *c0 + n;
            return true;
        }
    }
}

/* osp_split of n rows with the boundaries moved down to multiples of 16 (whole strips of a matrix in
 * strips; any split gives the same results, row by row). */
static void split16(long long n, int ith, int nth, long long *begin, long long *end) {
    osp_split(n, ith, nth, begin, end);
    *begin = *begin / 16 * 16;
    *end = *end == n ? n : *end / 16 * 16;
}

/* y = x W^T (matmul_rows) over this thread's rows: its split16 slice, or for one token chunks of it and
 * of the others' slices (mm_take). The input is quantized first, each thread its osp_split rows, then a barrier. */
static void op_matmul(const run_ctx *r, const osp_op *op, int ith, int nth) {
    cpu_backend *c = r->c;
    const osp_tensor *w = op->w;
    const int64_t R = rows_of(r, op->src0), K = w->cols, N = w->rows;
    const float *x = r->bufs[op->src0];
    const bool quant2 = mm_quantizes2(c, w), quant1 = mm_quantizes1(c, w), quant1b = mm_quantizes1b(c, w);
    const int64_t nb = K / OSP_Q8_BLOCK, nsb = K / OSP_Q8K_BLOCK;
    if (quant2 || quant1 || quant1b) { /* my rows of the input, then everyone's */
        long long t0, t1;
        osp_split(R, ith, nth, &t0, &t1);
        if (quant2)
            for (long long t = t0; t < t1; t++) osp_quantize_row_q8(x + t * K, c->xq + t * nb, K);
        if (quant1)
            for (long long t = t0; t < t1; t++) osp_quantize_row_q8k(x + t * K, c->xqk + t * nsb, K);
        if (quant1b)
            for (long long t = t0; t < t1; t++) osp_quantize_row_q8b(x + t * K, c->xqb + t * nb, K);
        osp_threadpool_barrier(c->pool);
    }
    const int64_t chunk = mm_chunk(r, op, nth);
    if (chunk > 0) {
        const size_t k = (size_t)(op - r->g->ops);
        for (int j = 0; j < nth; j++) { /* my slice from the front, then the others' from the back */
            const int owner = (ith + j) % nth;
            long long s0, s1;
            int64_t c0, c1;
            split16(N, owner, nth, &s0, &s1);
            while (mm_take(&c->mm_claim[(size_t)owner * c->mm_claim_stride + k], s0, s1, chunk, j == 0, &c0, &c1))
                matmul_rows(r, op, c0, c1, ith);
        }
        return;
    }
    long long r0, r1;
    split16(N, ith, nth, &r0, &r1);
    matmul_rows(r, op, r0, r1, ith);
}

static void op_rope_kv_write(const run_ctx *r, const osp_op *op, int ith, int nth) {
    const int64_t D = op->p.rope.head_dim, H = op->p.rope.n_head, HK = op->p.rope.n_head_kv;
    const int64_t QD = H * D, KD = HK * D, W = QD + 2 * KD;
    float *qkv = r->bufs[op->src0];
    float *qout = r->bufs[op->dst];
    const osp_kv_cache *kv = r->kv;
    const int l = op->layer;
    const float *bias = op->w ? op->w->parts[0].data : NULL;
    const float *qn = op->w1 ? op->w1->parts[0].data : NULL, *kn = op->w2 ? op->w2->parts[0].data : NULL;
    const float *inv_freq = op->w3->parts[0].data;
    long long t0, t1;
    osp_split(r->T, ith, nth, &t0, &t1);
    for (long long t = t0; t < t1; t++) {
        float *q = qkv + t * W, *k = q + QD, *v = k + KD;
        if (bias)
            for (int64_t j = 0; j < W; j++) q[j] += bias[j];
        if (qn) osp_cpu_rmsnorm(q, qn, q, H, D, op->p.rope.eps);
        if (kn) osp_cpu_rmsnorm(k, kn, k, HK, D, op->p.rope.eps);
        const int32_t *pos = r->b->positions + t;
        if (op->p.rope.neox) {
            osp_cpu_rope_neox(q, pos, 1, H, D, op->p.rope.n_rot, inv_freq);
            osp_cpu_rope_neox(k, pos, 1, HK, D, op->p.rope.n_rot, inv_freq);
        } else {
            osp_cpu_rope_interleaved(q, pos, 1, H, D, op->p.rope.n_rot, inv_freq);
            osp_cpu_rope_interleaved(k, pos, 1, HK, D, op->p.rope.n_rot, inv_freq);
        }
        if (kv->k_fmt.k_hadamard) { /* rotated K pages: q.k = (H q).(H k) (kv_layout.h) */
            osp_cpu_hadamard(q, H, D);
            osp_cpu_hadamard(k, HK, D);
        }
        float *qo = qout + t * QD;
        memcpy(qo, q, (size_t)QD * sizeof(float));
        round_if(r, op->dst, qo, QD);
        /* K and V each in their own page format (kv_layout.h); slot < 0: a padding row, no write */
        const int32_t slot = r->b->slot_mapping[t];
        const int64_t FK = kv->k_fmt.fixed_scales_per_layer, FV = kv->v_fmt.fixed_scales_per_layer;
        osp_cpu_kv_write_row(kv->k_fmt.elem_type, FK ? kv->k_fixed + l * FK : NULL, kv->k[l], kv->k_scale[l], k, slot, HK, D);
        osp_cpu_kv_write_row(kv->v_fmt.elem_type, FV ? kv->v_fixed + l * FV : NULL, kv->v[l], kv->v_scale[l], v, slot, HK, D);
    }
}

/* This layer's pages as the CPU ops see them (ops.h), K and V each in their own format. */
static osp_cpu_kv_pages cpu_pages_of(const osp_kv_cache *kv, int64_t l) {
    const int64_t FK = kv->k_fmt.fixed_scales_per_layer, FV = kv->v_fmt.fixed_scales_per_layer;
    return (osp_cpu_kv_pages){.k_type = kv->k_fmt.elem_type, .v_type = kv->v_fmt.elem_type, .k = kv->k[l],
                              .v = kv->v[l], .k_scale = kv->k_scale[l], .v_scale = kv->v_scale[l],
                              .k_fixed = FK ? kv->k_fixed + l * FK : NULL, .v_fixed = FV ? kv->v_fixed + l * FV : NULL,
                              .hier_upper_only = kv->hier_upper_only, .hier_full_recent = kv->hier_full_recent};
}

/* The cost of one attention item (token t, one head): its key count (positions[t] + 1, or the window)
 * plus 32 for its fixed work. */
static inline long long attn_item_cost(const osp_batch *b, int64_t t, int32_t window) {
    long long keys = (long long)b->positions[t] + 1;
    if (window > 0 && keys > window) keys = window;
    return keys + 32;
}

/* The first attention item (t, h), h fastest, whose cost prefix reaches `target`. */
static long long attn_item_at(const osp_batch *b, int64_t T, int64_t H, int32_t window, long long target) {
    long long acc = 0;
    for (int64_t t = 0; t < T; t++) {
        const long long w = attn_item_cost(b, t, window);
        if (acc + w * H > target) return (long long)(t * H) + (target - acc + w - 1) / w;
        acc += w * H;
    }
    return (long long)(T * H);
}

/* This thread's items of an attention op: equal shares of the keys read, not of the items, so the
 * late tokens of a causal prompt (which read the most keys) do not all land on the last thread. Only
 * which thread computes an item changes, never its arithmetic. */
static void attn_split(const osp_batch *b, int64_t T, int64_t H, int32_t window, int ith, int nth, long long *i0,
                       long long *i1) {
    long long total = 0;
    for (int64_t t = 0; t < T; t++) total += attn_item_cost(b, t, window) * H;
    *i0 = ith == 0 ? 0 : attn_item_at(b, T, H, window, total / nth * ith + total % nth * ith / nth);
    *i1 = ith == nth - 1 ? (long long)(T * H)
                         : attn_item_at(b, T, H, window, total / nth * (ith + 1) + total % nth * (ith + 1) / nth);
}

static void op_attention(const run_ctx *r, const osp_op *op, int ith, int nth) {
    const osp_batch *b = r->b;
    const osp_kv_cache *kv = r->kv;
    const int64_t H = op->p.attn.n_head, D = op->p.attn.head_dim;
    float *out = r->bufs[op->dst];
    long long i0, i1;
    osp_split(r->T * H, ith, nth, &i0, &i1);
    if (r->hook) { /* a replacement attention (backend.h): prepare on one thread, then every thread's items */
        const osp_attn_call call = {.op = op, .b = b, .kv = kv, .q = r->bufs[op->src0], .out = out, .n_threads = nth};
        if (ith == 0 && *r->hook_status == OSP_OK) *r->hook_status = r->hook->prepare(r->hook->ctx, &call);
        osp_threadpool_barrier(r->c->pool);
        if (*r->hook_status == OSP_OK) r->hook->run(r->hook->ctx, &call, ith, i0, i1);
        if (r->c->emulate && r->g->acts[op->dst].type == OSP_DTYPE_BF16 && i1 > i0)
            osp_cpu_round_bf16(out + i0 * D, (i1 - i0) * D);
        return;
    }
    attn_split(b, r->T, H, op->p.attn.window, ith, nth, &i0, &i1);
    osp_cpu_kv_pages pg = cpu_pages_of(kv, op->layer);
    pg.q8_arith = r->c->act_q8; /* the q8 mode's softmax: vexp.h and FMAs (kv_quant.c) */
    osp_cpu_paged_attention_tiled(r->bufs[op->src0], &pg, out, b->num_seqs, b->query_start_loc, b->positions,
                                  b->block_table, b->max_blocks_per_seq, kv->block_size, H, op->p.attn.n_head_kv, D,
                                  op->p.attn.scale, op->p.attn.window,
                                  r->c->scores + (size_t)ith * OSP_CPU_ATTN_MAX_TILE * (size_t)r->c->cap_ctx,
                                  r->c->cap_ctx, OSP_CPU_ATTN_MAX_TILE, i0, i1);
    if (r->c->emulate && r->g->acts[op->dst].type == OSP_DTYPE_BF16 && i1 > i0)
        osp_cpu_round_bf16(out + i0 * D, (i1 - i0) * D);
}

static void op_glu(const run_ctx *r, const osp_op *op, int ith, int nth) {
    const int64_t F = r->g->acts[op->dst].cols, R = rows_of(r, op->dst);
    const float *gu = r->bufs[op->src0];
    float *out = r->bufs[op->dst];
    long long t0, t1;
    osp_split(R, ith, nth, &t0, &t1);
    for (long long t = t0; t < t1; t++) {
        const float *g = gu + t * 2 * F;
        if (op->p.glu.act == OSP_GLU_GELU_TANH) osp_cpu_gelu_mul(g, g + F, out + t * F, F);
        else if (r->c->act_q8) osp_cpu_silu_mul_q8(g, g + F, out + t * F, F); /* vexp.h: the mode's exp */
        else osp_cpu_silu_mul(g, g + F, out + t * F, F);
    }
    round_if(r, op->dst, out + t0 * F, (t1 - t0) * F);
}

static void op_add(const run_ctx *r, const osp_op *op, int ith, int nth) {
    const int64_t n = r->g->acts[op->dst].cols, R = rows_of(r, op->dst);
    float *x = r->bufs[op->dst];
    const float *d = r->bufs[op->src0];
    long long t0, t1;
    osp_split(R, ith, nth, &t0, &t1);
    for (long long i = t0 * n; i < t1 * n; i++) x[i] += d[i];
    round_if(r, op->dst, x + t0 * n, (t1 - t0) * n);
}

static void op_copy(const run_ctx *r, const osp_op *op, int ith, int nth) {
    const int64_t n = r->g->acts[op->dst].cols, R = rows_of(r, op->dst);
    long long t0, t1;
    osp_split(R, ith, nth, &t0, &t1);
    if (t1 > t0) memcpy(r->bufs[op->dst] + t0 * n, r->bufs[op->src0] + t0 * n, (size_t)((t1 - t0) * n) * sizeof(float));
}

/* ALL_REDUCE (in place): thread 0 runs the collective while the others wait at the next barrier. After a
 * failed one (a rank aborted) the rest of the run computes on junk and the run returns the error. */
static void op_all_reduce(const run_ctx *r, const osp_op *op, int ith) {
    if (!r->c->comm || ith != 0 || *r->comm_status != OSP_OK) return;
    const int64_t n = r->g->acts[op->dst].cols * rows_of(r, op->dst);
    *r->comm_status = osp_comm_all_reduce_f32(r->c->comm, r->c->tp_rank, r->bufs[op->dst], n);
    round_if(r, op->dst, r->bufs[op->dst], n); /* a bf16 activation is summed and stored in bf16 on the GPU */
}

/* ALL_GATHER: thread 0 runs the collective (one rank: a copy) while the others wait at the next barrier. */
static void op_all_gather(const run_ctx *r, const osp_op *op, int ith) {
    if (ith != 0 || *r->comm_status != OSP_OK) return;
    const int64_t R = rows_of(r, op->dst), cols = r->g->acts[op->dst].cols, cols_r = r->g->acts[op->src0].cols;
    if (!r->c->comm) { /* one rank: src0 has dst's columns (cpu_supports_op) */
        memcpy(r->bufs[op->dst], r->bufs[op->src0], (size_t)(R * cols) * sizeof(float));
        return;
    }
    *r->comm_status = osp_comm_all_gather_f32(r->c->comm, r->c->tp_rank, r->bufs[op->src0], R, cols_r,
                                              r->bufs[op->dst], cols);
}

/* SCALE and SOFTCAP: elementwise over my rows (dst may be src0) */
static void op_scale(const run_ctx *r, const osp_op *op, int ith, int nth) {
    const int64_t n = r->g->acts[op->dst].cols, R = rows_of(r, op->dst);
    const float *x = r->bufs[op->src0];
    float *y = r->bufs[op->dst];
    const float s = op->p.scale.s;
    long long t0, t1;
    osp_split(R, ith, nth, &t0, &t1);
    if (op->kind == OSP_OP_SOFTCAP)
        for (long long i = t0 * n; i < t1 * n; i++) y[i] = s * tanhf(x[i] / s);
    else
        for (long long i = t0 * n; i < t1 * n; i++) y[i] = s * x[i];
    round_if(r, op->dst, y + t0 * n, (t1 - t0) * n);
}

/* The activation an op reads at rows other threads own while writing its own output by the row
 * split (GATHER_RMSNORM reads rows logits_indices of x), or -1. The next op may not overwrite it
 * without a barrier (a write-after-read hazard). */
static int32_t read_across(const osp_op *op) { return op->kind == OSP_OP_GATHER_RMSNORM ? op->src1 : -1; }

/* Whether op writes activation a (ADD_RMSNORM also updates its residual stream src1 in place). */
static bool writes(const osp_op *op, int32_t a) {
    return a >= 0 && (op->dst == a || (op->kind == OSP_OP_ADD_RMSNORM && op->src0 >= 0 && op->src1 == a));
}

static void run_task(void *arg, int ith, int nth) {
    const run_ctx *r = arg;
    int64_t prev_out = 0;
    for (int32_t k = 0; k < r->g->n_ops; k++) {
        const osp_op *op = &r->g->ops[k];
        split sp = op_split(r->c, op, r->T, r->L);
        const int64_t rows = op->src0 >= 0 ? rows_of(r, op->src0) : op->dst >= 0 ? rows_of(r, op->dst) : r->T;
        if (sp.in < 0) sp.in = rows;
        if (sp.out < 0) sp.out = rows;
        /* no barrier only when this op reads by the split the previous one wrote with (each thread
         * reads rows it wrote itself) and does not overwrite what the previous one read across rows */
        const bool same_split = sp.in > 0 && sp.in == prev_out;
        if (k > 0 && (!same_split || writes(op, read_across(&r->g->ops[k - 1])))) osp_threadpool_barrier(r->c->pool);
        prev_out = sp.out;
        switch (op->kind) {
        case OSP_OP_EMBED: op_embed(r, op, ith, nth); break;
        case OSP_OP_ADD_RMSNORM: op_add_rmsnorm(r, op, ith, nth); break;
        case OSP_OP_GATHER_RMSNORM: op_gather_rmsnorm(r, op, ith, nth); break;
        case OSP_OP_MATMUL: op_matmul(r, op, ith, nth); break;
        case OSP_OP_ROPE_KV_WRITE: op_rope_kv_write(r, op, ith, nth); break;
        case OSP_OP_ATTENTION: op_attention(r, op, ith, nth); break;
        case OSP_OP_GLU: op_glu(r, op, ith, nth); break;
        case OSP_OP_ADD: op_add(r, op, ith, nth); break;
        case OSP_OP_COPY: op_copy(r, op, ith, nth); break;
        case OSP_OP_SCALE:
        case OSP_OP_SOFTCAP: op_scale(r, op, ith, nth); break;
        case OSP_OP_ALL_REDUCE: op_all_reduce(r, op, ith); break;
        case OSP_OP_ALL_GATHER: op_all_gather(r, op, ith); break;
        default: break;
        }
    }
}

/* K and V pages are written and read each in their own format, so any pair of the five is served. */
static bool cpu_supports_kv(osp_backend *be, osp_kv_dtype dk, osp_kv_dtype dv, char *why, size_t n) {
    (void)be;
    for (int i = 0; i < 2; i++) {
        const osp_kv_dtype d = i ? dv : dk;
        if (d == OSP_KV_DTYPE_F32 || d == OSP_KV_DTYPE_F16 || d == OSP_KV_DTYPE_FP8 || d == OSP_KV_DTYPE_NVFP4 ||
            d == OSP_KV_DTYPE_INT8_HIER)
            continue;
        snprintf(why, n, "the CPU backend has f32, f16, fp8, nvfp4 and int8_hier KV pages, not %s (%s)",
                 osp_kv_dtype_name(d) ? osp_kv_dtype_name(d) : "this dtype", i ? "V" : "K");
        return false;
    }
    return true;
}

static bool cpu_supports_op(osp_backend *be, const osp_graph *g, const osp_op *op, char *why, size_t n) {
    if ((unsigned)op->kind >= OSP_OP_COUNT) {
        snprintf(why, n, "unknown op kind %d", (int)op->kind);
        return false;
    }
    if (op->kind == OSP_OP_SOFTCAP && !(op->p.scale.s > 0.0f)) {
        snprintf(why, n, "softcap %g is not > 0", (double)op->p.scale.s);
        return false;
    }
    if (op->kind == OSP_OP_ALL_REDUCE && (op->dst < 0 || op->dst != op->src0)) {
        snprintf(why, n, "all_reduce runs in place (dst == src0)");
        return false;
    }
    if (op->kind == OSP_OP_ALL_GATHER &&
        (op->dst < 0 || op->src0 < 0 || op->dst == op->src0 || g->acts[op->dst].type != OSP_DTYPE_F32 ||
         g->acts[op->src0].type != OSP_DTYPE_F32 || g->acts[op->src0].rows != g->acts[op->dst].rows ||
         g->acts[op->src0].cols > g->acts[op->dst].cols || (!CPU(be)->comm && g->acts[op->src0].cols != g->acts[op->dst].cols))) {
        snprintf(why, n, "all_gather takes fp32 src0 [R, cols_r] into another fp32 dst [R, cols] (one rank: cols_r == cols)");
        return false;
    }
    if (op->kind == OSP_OP_ATTENTION && op->p.attn.head_dim > 1024) {
        snprintf(why, n, "head_dim %d > 1024", op->p.attn.head_dim);
        return false;
    }
    return true;
}

/* Grows the workspace for this step's shapes. */
static osp_status reserve(cpu_backend *c, const osp_graph *g, const osp_batch *b, float *logits, float **bufs) {
    const int64_t T = b->num_tokens, L = b->num_logits;
    int64_t max_ctx = 0, max_cols = 0;
    size_t need_xq = 0, need_xqk = 0, need_xqb = 0, need_ypad = 0, need_unpack = 0;
    for (int32_t s = 0; s < b->num_seqs; s++) max_ctx = b->seq_lens[s] > max_ctx ? b->seq_lens[s] : max_ctx;
    for (int32_t k = 0; k < g->n_ops; k++) {
        const osp_op *op = &g->ops[k];
        if ((op->kind == OSP_OP_MATMUL || op->kind == OSP_OP_EMBED) && op->w) /* a row unpacked from strips */
            for (int32_t i = 0; i < op->w->n_parts; i++)
                if (op->w->parts[i].layout == OSP_PART_STRIPS16 && op->w->parts[i].row_bytes > need_unpack)
                    need_unpack = op->w->parts[i].row_bytes;
        if (op->kind != OSP_OP_MATMUL) continue;
        max_cols = op->w->cols > max_cols ? op->w->cols : max_cols;
        const int64_t R = g->acts[op->src0].rows == OSP_ROWS_LOGITS ? L : T;
        /* + 7 rows: a padded tail tile packs 8 rows (osp_qdot_tile_padded_for) */
        const size_t nxq = (size_t)(R + 7) * (size_t)(op->w->cols / OSP_Q8_BLOCK);
        const size_t yrows = (size_t)((op->w->rows + c->nt - 1) / c->nt + 16); /* a thread's slice at most (split16) */
        need_ypad = 8 * yrows > need_ypad ? 8 * yrows : need_ypad;
        need_xq = nxq > need_xq ? nxq : need_xq;
        const size_t nxqk = c->act_q8 ? (size_t)(R + 7) * (size_t)(op->w->cols / OSP_Q8K_BLOCK) : 0;
        need_xqk = nxqk > need_xqk ? nxqk : need_xqk;
        const size_t nxqb = mm_quantizes1b(c, op->w) ? nxq : 0; /* only where a part has the 32-value mode */
        need_xqb = nxqb > need_xqb ? nxqb : need_xqb;
    }
    for (int32_t a = 0; a < g->n_acts; a++) {
        if (a == g->logits) {
            bufs[a] = logits;
            continue;
        }
        const size_t need = (size_t)(g->acts[a].rows == OSP_ROWS_LOGITS ? L : T) * (size_t)g->acts[a].cols;
        if (need > c->act_cap[a]) {
            free(c->act[a]);
            c->act[a] = malloc(need * sizeof(float));
            if (!c->act[a]) goto nomem;
            c->act_cap[a] = need;
        }
        bufs[a] = c->act[a];
    }
    if (need_xq > c->cap_xq) {
        free(c->xq);
        c->xq = calloc(need_xq, sizeof *c->xq); /* zeros: rows a padded tile packs past R start defined */
        if (!c->xq) goto nomem;
        c->cap_xq = need_xq;
    }
    if (need_xqk > c->cap_xqk) {
        free(c->xqk);
        c->xqk = calloc(need_xqk, sizeof *c->xqk); /* zeros: the spare rows a narrow tile packs */
        if (!c->xqk) goto nomem;
        c->cap_xqk = need_xqk;
    }
    if (need_xqb > c->cap_xqb) {
        free(c->xqb);
        c->xqb = calloc(need_xqb, sizeof *c->xqb); /* zeros: the spare rows a narrow tile packs */
        if (!c->xqb) goto nomem;
        c->cap_xqb = need_xqb;
    }
    if (need_xqb && max_cols / OSP_Q8B_BLOCK > c->xqbt_nb) {
        free(c->xqbt);
        c->xqbt_nb = 0;
        const size_t bytes = (size_t)c->nt * OSP_Q8B_STRIP_TOKENS * (size_t)(max_cols / OSP_Q8B_BLOCK) * sizeof(osp_q8b_block);
        c->xqbt = aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (!c->xqbt) goto nomem;
        c->xqbt_nb = max_cols / OSP_Q8B_BLOCK;
    }
    if (need_unpack > c->unpack_cap) {
        free(c->unpack);
        c->unpack_cap = 0;
        const size_t cap = (need_unpack + 63) / 64 * 64;
        c->unpack = aligned_alloc(64, (size_t)c->nt * cap);
        if (!c->unpack) goto nomem;
        c->unpack_cap = cap;
    }
    if (need_ypad > c->ypad_cap) {
        free(c->ypad);
        c->ypad = malloc((size_t)c->nt * need_ypad * sizeof(float));
        if (!c->ypad) goto nomem;
        c->ypad_cap = need_ypad;
    }
    if (max_cols / OSP_Q8_BLOCK > c->pack_nb) {
        free(c->pack);
        c->pack_nb = 0;
        const size_t bytes =
            (size_t)c->nt * OSP_CPU_PACK_GROUPS * (size_t)(max_cols / OSP_Q8_BLOCK) * sizeof(osp_q8_pack);
        c->pack = aligned_alloc(64, bytes); /* bytes: a multiple of 64 */
        if (!c->pack) goto nomem;
        c->pack_nb = max_cols / OSP_Q8_BLOCK;
    }
    if (osp_cpu_fgemm_panel_floats(max_cols) > c->scratch_cols) {
        free(c->scratch);
        const int64_t panel = osp_cpu_fgemm_panel_floats(max_cols);
        c->scratch = malloc((size_t)c->nt * (size_t)panel * sizeof(float));
        if (!c->scratch) goto nomem;
        c->scratch_cols = panel;
    }
    if (max_ctx > c->cap_ctx) {
        const int64_t cap = max_ctx < 256 ? 256 : max_ctx * 2;
        free(c->scores);
        c->scores = malloc((size_t)c->nt * OSP_CPU_ATTN_MAX_TILE * (size_t)cap * sizeof(float));
        if (!c->scores) goto nomem;
        c->cap_ctx = cap;
    }
    return OSP_OK;
nomem:
    ws_free(c);
    return osp_set_error(OSP_ERR_NOMEM, "forward: out of memory for a batch of %lld tokens", (long long)T);
}

static osp_status cpu_run(osp_backend *be, const osp_graph *g, osp_kv_cache *kv, const osp_batch *b,
                          const osp_run_io *io) {
    cpu_backend *c = CPU(be);
    float *bufs[OSP_GRAPH_MAX_ACTS] = {0};
    float *logits = io ? io->logits : NULL;
    c->last_logits = 0;
    if (io && io->dev_sparse) /* the CPU runs sparse attention through an osp_attn_hook */
        return osp_set_error(OSP_ERR_UNSUPPORTED, "cpu backend: device sparse attention is the CUDA backend's; the "
                                                  "CPU takes an attention hook (src/sparse/engine_hook.h)");
    if (b->num_logits > 0 && g->logits >= 0 && !logits)
        return osp_set_error(OSP_ERR_INVALID_ARG, "cpu backend: logits must go to the host");
    OSP_TRY(reserve(c, g, b, logits, bufs));
    osp_status hook_status = OSP_OK, comm_status = OSP_OK;
    run_ctx r = {c, g, kv, b, bufs, b->num_tokens, b->num_logits, io ? io->attn_hook : NULL, &hook_status, &comm_status};
    for (int32_t i = 0; io && i < io->n_acts; i++) {
        const osp_act_io *a = &io->acts[i];
        if (a->act < 0 || a->act >= g->n_acts) return osp_set_error(OSP_ERR_INVALID_ARG, "cpu backend: no activation %d", a->act);
        if (a->input) memcpy(bufs[a->act], a->host, sizeof(float) * (size_t)rows_of(&r, a->act) * (size_t)g->acts[a->act].cols);
    }
    if ((size_t)g->n_ops > c->mm_claim_stride) {
        free(c->mm_claim);
        c->mm_claim_stride = 0;
        const size_t stride = ((size_t)g->n_ops + 7) / 8 * 8;
        c->mm_claim = aligned_alloc(64, (size_t)c->nt * stride * sizeof *c->mm_claim);
        if (!c->mm_claim) return osp_set_error(OSP_ERR_NOMEM, "cpu backend: out of memory for %d ops' claims", (int)g->n_ops);
        c->mm_claim_stride = stride;
    }
    for (size_t i = 0; i < (size_t)c->nt * c->mm_claim_stride; i++) atomic_init(&c->mm_claim[i], 0);
    be->launches++; /* one region a run */
    osp_threadpool_run(c->pool, run_task, &r);
    for (int32_t i = 0; io && i < io->n_acts; i++) {
        const osp_act_io *a = &io->acts[i];
        if (!a->input) memcpy(a->host, bufs[a->act], sizeof(float) * (size_t)rows_of(&r, a->act) * (size_t)g->acts[a->act].cols);
    }
    if (hook_status != OSP_OK) return hook_status; /* its message is set (on the thread that prepared) */
    if (comm_status != OSP_OK) return comm_status; /* likewise (thread 0) */
    c->logits = logits;
    c->last_logits = g->logits >= 0 ? b->num_logits : 0;
    return OSP_OK;
}

static osp_status cpu_sample(osp_backend *be, const osp_sampler_row *rows, const int32_t *logits_rows, int32_t n,
                             int32_t *tokens, osp_logprobs *logprobs, osp_status *status) {
    (void)be, (void)rows, (void)logits_rows, (void)n, (void)tokens, (void)logprobs, (void)status;
    return osp_set_error(OSP_ERR_UNSUPPORTED,
                         "cpu backend: logits are on the host; the engine samples them there (src/sample/)");
}

static osp_status cpu_logits_to_host(osp_backend *be, int32_t row0, int32_t n, float *dst) {
    cpu_backend *c = CPU(be);
    if (row0 < 0 || n < 0 || row0 + n > c->last_logits)
        return osp_set_error(OSP_ERR_INVALID_ARG, "logits rows [%d, %d) are outside the last step's %d", row0, row0 + n,
                             c->last_logits);
    if (dst != c->logits + (size_t)row0 * (size_t)be->n_vocab)
        memmove(dst, c->logits + (size_t)row0 * (size_t)be->n_vocab, (size_t)n * (size_t)be->n_vocab * sizeof(float));
    return OSP_OK;
}

static osp_status cpu_sync(osp_backend *be) {
    (void)be;
    return OSP_OK; /* every run returns when it is done */
}

static const osp_backend_vtable k_cpu_vt = {
    .name = "cpu",
    .device = OSP_DEVICE_CPU,
    .free = cpu_free,
    .place = cpu_place,
    .weight_bytes = cpu_weight_bytes,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .copy = cpu_copy,
    .to_host = cpu_to_host,
    .from_host = cpu_to_host, /* host memory both ways */
    .mem_info = cpu_mem_info,
    .supports_op = cpu_supports_op,
    .supports_kv = cpu_supports_kv,
    .kv_k_hadamard = true,
    .run = cpu_run,
    .sample = cpu_sample,
    .logits_to_host = cpu_logits_to_host,
    .sync = cpu_sync,
    .run_device_us = NULL, /* no device clock: a run's wall time is its time */
};

osp_status osp_backend_cpu_create(const osp_backend_params *p, osp_backend **out) {
    *out = NULL;
    if (!p || !p->pool) return osp_set_error(OSP_ERR_INVALID_ARG, "cpu backend: no thread pool");
    cpu_backend *c = calloc(1, sizeof *c);
    if (!c) return osp_set_error(OSP_ERR_NOMEM, "cpu backend: out of memory");
    c->base.vt = &k_cpu_vt;
    c->pool = p->pool;
    c->nt = osp_threadpool_n_threads(p->pool);
    c->exact = p->exact || p->emulate_bf16;
    c->emulate = p->emulate_bf16;
    c->act_q8 = p->act_q8 && !c->exact;
    c->no_mmap = p->no_mmap;
    c->comm = p->comm;
    c->tp_rank = p->tp_rank;
    (void)osp_qdot_isa(); /* picks the kernel family now, before any worker thread asks for it */
    const char *e = getenv("OSPREY_CPU_STRIPS"); /* 0: keep the copies as stored (an A/B switch) */
    c->strips = c->no_mmap && c->act_q8 && !c->emulate && !(e && strcmp(e, "0") == 0);
    e = getenv("OSPREY_CPU_FGEMM");
    c->fgemm = !(e && strcmp(e, "0") == 0);
    *out = &c->base;
    return OSP_OK;
}
