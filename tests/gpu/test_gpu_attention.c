/* osp_cuda_paged_attention, both kernels (v0: CUDA cores; v1: tensor cores, attention_mma.cu, where it
 * applies), against the CPU reference osp_cpu_paged_attention on seeded random
 * batches: mixed prefill chunks and decodes (contexts 1, 2, 15, 16, 17, 100, 1000, 5000, 131072), prefill
 * chunks over a cached prefix, pure decode batches, zero-token sequences, shuffled block tables,
 * GQA groups 1/3/4/8/24, head_dim 32/64/128/256, f16 and fp32 pages, block sizes 1/7/16/32/64 and odd
 * ones, one-split and split-KV launches, and a CUDA graph replayed over new batch contents.
 *
 * Both sides see identical inputs: q is bf16 on the GPU and the same values widened to fp32 for the
 * CPU; the pages are the same bits. Slots no token has written (the tail of each sequence's last
 * block and the spare blocks) hold NaN, and the output is poisoned with 0xFF bytes (bf16 NaN) before
 * every run, plus one guard row after the last token and guard bytes after the workspace: reading a
 * key outside the causal window, leaving an output element unwritten or writing past the end fails.
 *
 * Tolerance, per element: |gpu - cpu| <= 2^-8 |cpu| + 2^-12 vmax (vmax = max |v| in the pages).
 *   - The GPU's fp32 result o is rounded to bf16 (8 significant bits, round to nearest even):
 *     |bf16(o) - o| <= 2^-8 |o|, and o is cpu + delta.
 *   - delta: both sides compute sum_j p_j v_j / sum_j p_j in fp32, in a different order (tiles of 32
 *     keys, split partials merged by log-sum-exp) and with exp2 of log2-scaled scores instead of exp:
 *     a relative error of a few 2^-24 per weight plus n * 2^-24 at worst for n-term sums, times the
 *     weighted mean of |v| <= vmax. For n <= 5000 that worst case is 3e-4 vmax and the typical
 *     (sqrt n) error ~1e-5 vmax; 2^-12 vmax = 2.4e-4 vmax covers it (2^-8 |delta| is negligible).
 *   A wrong key, a lost tile or a missed causal mask changes an output by ~p_j |v| >= 1e-3 vmax at
 *   these context lengths for most rows, well above the bound. NaN never passes (!(err <= tol)).
 *   v1 rounds P to f16 and gets 2^-10 vmax (dev_check says why), plus a bound on the mean error.
 * Batch invariance (v1): one sequence's rows give the same bits in every batching, chunking and mode
 * (test_batch_invariance). Sliding windows in a quarter of the random cases. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <cmocka.h>

#include "backend/cpu/ops.h"
#include "backend/cuda/attention_v1.h"
#include "backend/cuda/cuda_ops.h"
#include "core/dtype.h"
#include "gpu_test_rng.h"

#define MAX_SEQS 128

/* ---- random numbers: gpu_test_rng.h (g_rng, rnd64, rnd_int, rnd_unit) ---------------------------- */

/* ---- one batch ---------------------------------------------------------------------------------- */

typedef struct {
    int n_head, n_kv, D, bs;
    bool f16;
    int num_seqs;
    int32_t prefix[MAX_SEQS]; /* tokens already in the cache */
    int32_t nnew[MAX_SEQS];   /* tokens of this step (0: a sequence with nothing scheduled) */
    float qamp;               /* q values in [-qamp, qamp) */
    int32_t max_seq_len;      /* 0: the longest context of the batch */
    int32_t min_blocks;       /* pool and table sizes at least these (graph replays keep buffers) */
    int32_t min_max_blocks;
    int32_t window;           /* > 0: sliding window (Gemma 3's local layers) */
} acase;

typedef struct {
    acase c;
    int64_t T;
    int32_t max_seq_len, max_blocks, num_blocks, max_ctx;
    int32_t qsl[MAX_SEQS + 1];
    int32_t *positions;   /* [T] */
    int32_t *block_table; /* [num_seqs, max_blocks], -1 past a sequence's blocks */
    uint16_t *q_bf16;     /* [T, n_head, D] */
    float *q_f32;
    void *k, *v;          /* [num_blocks, bs, n_kv, D] f16 or fp32 */
    size_t page_bytes;
    float vmax;
} batch;

static void batch_free(batch *b) {
    free(b->positions);
    free(b->block_table);
    free(b->q_bf16);
    free(b->q_f32);
    free(b->k);
    free(b->v);
    memset(b, 0, sizeof *b);
}

static void batch_build(batch *b, const acase *c, uint64_t seed) {
    memset(b, 0, sizeof *b);
    b->c = *c;
    g_rng = seed;
    assert_true(c->num_seqs >= 1 && c->num_seqs <= MAX_SEQS);
    int64_t T = 0, blocks = 0;
    int32_t max_ctx = 1, max_nb = 1;
    b->qsl[0] = 0;
    for (int s = 0; s < c->num_seqs; s++) {
        const int32_t len = c->prefix[s] + c->nnew[s];
        const int32_t nb = (len + c->bs - 1) / c->bs;
        T += c->nnew[s];
        b->qsl[s + 1] = (int32_t)T;
        blocks += nb;
        if (nb > max_nb) max_nb = nb;
        if (c->nnew[s] > 0 && len > max_ctx) max_ctx = len;
    }
    b->T = T;
    b->max_ctx = max_ctx;
    b->max_seq_len = c->max_seq_len > 0 ? c->max_seq_len : max_ctx;
    assert_true(b->max_seq_len >= max_ctx);
    b->max_blocks = max_nb + 2 > c->min_max_blocks ? max_nb + 2 : c->min_max_blocks;
    b->num_blocks = (int32_t)blocks + 3 > c->min_blocks ? (int32_t)blocks + 3 : c->min_blocks;

    /* blocks handed out in a random order: block tables are not contiguous */
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)b->num_blocks);
    assert_non_null(perm);
    for (int32_t i = 0; i < b->num_blocks; i++) perm[i] = i;
    for (int32_t i = b->num_blocks - 1; i > 0; i--) {
        const int32_t j = rnd_int(i + 1), tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    b->block_table = malloc(sizeof(int32_t) * (size_t)c->num_seqs * (size_t)b->max_blocks);
    b->positions = malloc(sizeof(int32_t) * (size_t)(T > 0 ? T : 1));
    assert_non_null(b->block_table);
    assert_non_null(b->positions);
    int32_t next = 0;
    for (int s = 0; s < c->num_seqs; s++) {
        const int32_t len = c->prefix[s] + c->nnew[s], nb = (len + c->bs - 1) / c->bs;
        for (int32_t i = 0; i < b->max_blocks; i++)
            b->block_table[(size_t)s * b->max_blocks + i] = i < nb ? perm[next + i] : -1;
        next += nb;
        for (int32_t i = 0; i < c->nnew[s]; i++) b->positions[b->qsl[s] + i] = c->prefix[s] + i;
    }

    /* pages: every slot NaN, then the written positions of each sequence random in [-1, 1) */
    const int64_t row = (int64_t)c->n_kv * c->D, slots = (int64_t)b->num_blocks * c->bs;
    const size_t esz = c->f16 ? 2 : 4;
    b->page_bytes = (size_t)(slots * row) * esz;
    b->k = malloc(b->page_bytes);
    b->v = malloc(b->page_bytes);
    assert_non_null(b->k);
    assert_non_null(b->v);
    uint16_t *k16 = b->k, *v16 = b->v;
    float *k32 = b->k, *v32 = b->v;
    for (int64_t i = 0; i < slots * row; i++) {
        if (c->f16) k16[i] = v16[i] = 0x7E00; /* f16 NaN */
        else k32[i] = v32[i] = NAN;
    }
    float vmax = 0.0f;
    for (int s = 0; s < c->num_seqs; s++) {
        const int32_t len = c->prefix[s] + c->nnew[s];
        for (int32_t p = 0; p < len; p++) {
            const int64_t slot = (int64_t)b->block_table[(size_t)s * b->max_blocks + p / c->bs] * c->bs + p % c->bs;
            for (int64_t e = 0; e < row; e++) {
                const int64_t i = slot * row + e;
                const float kf = rnd_unit(), vf = rnd_unit();
                if (c->f16) {
                    k16[i] = osp_fp32_to_fp16(kf);
                    v16[i] = osp_fp32_to_fp16(vf);
                    if (fabsf(osp_fp16_to_fp32(v16[i])) > vmax) vmax = fabsf(osp_fp16_to_fp32(v16[i]));
                } else {
                    k32[i] = kf;
                    v32[i] = vf;
                    if (fabsf(vf) > vmax) vmax = fabsf(vf);
                }
            }
        }
    }
    b->vmax = vmax;
    free(perm);

    const int64_t nq = T * c->n_head * c->D;
    b->q_bf16 = malloc(sizeof(uint16_t) * (size_t)(nq > 0 ? nq : 1));
    b->q_f32 = malloc(sizeof(float) * (size_t)(nq > 0 ? nq : 1));
    assert_non_null(b->q_bf16);
    assert_non_null(b->q_f32);
    for (int64_t i = 0; i < nq; i++) {
        b->q_bf16[i] = osp_fp32_to_bf16(rnd_unit() * c->qamp);
        b->q_f32[i] = osp_bf16_to_fp32(b->q_bf16[i]);
    }
}

static float batch_scale(const batch *b) { return 1.0f / sqrtf((float)b->c.D); }

/* The CPU reference over all (token, head) items, spread over OpenMP threads. */
static void cpu_reference(const batch *b, float *ref) {
    const acase *c = &b->c;
    const int64_t items = b->T * c->n_head;
    const float scale = batch_scale(b);
#ifdef _OPENMP
#pragma omp parallel
#endif
    {
        float *sc = malloc(sizeof(float) * (size_t)b->max_ctx);
        if (sc) {
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (int64_t it = 0; it < items; it += 8) {
                const int64_t end = it + 8 < items ? it + 8 : items;
                osp_cpu_paged_attention(b->q_f32, b->k, b->v, c->f16 ? OSP_DTYPE_F16 : OSP_DTYPE_F32, ref, c->num_seqs, b->qsl, b->positions,
                                        b->block_table, b->max_blocks, c->bs, c->n_head, c->n_kv, c->D, scale, c->window, sc,
                                        it, end);
            }
            free(sc);
        }
    }
}

/* ---- device side -------------------------------------------------------------------------------- */

#define WS_GUARD 4096

typedef struct {
    uint16_t *q, *out;
    void *k, *v, *ws;
    int32_t *qsl, *positions, *block_table;
    size_t out_bytes, ws_bytes, page_bytes, q_bytes, bt_bytes, pos_bytes;
} dev_bufs;

static void dev_alloc(dev_bufs *d, const batch *b, int64_t max_tokens_for_ws) {
    const acase *c = &b->c;
    memset(d, 0, sizeof *d);
    const int64_t T = b->T;
    d->q_bytes = sizeof(uint16_t) * (size_t)(T * c->n_head * c->D);
    d->out_bytes = sizeof(uint16_t) * (size_t)((T + 1) * c->n_head * c->D); /* + one guard row */
    d->page_bytes = b->page_bytes;
    d->bt_bytes = sizeof(int32_t) * (size_t)c->num_seqs * (size_t)b->max_blocks;
    d->pos_bytes = sizeof(int32_t) * (size_t)(T > 0 ? T : 1);
    d->ws_bytes = osp_cuda_attention_workspace_bytes(max_tokens_for_ws, c->n_head, c->D, b->max_seq_len);
    assert_int_equal(osp_cuda_malloc((void **)&d->q, d->q_bytes > 0 ? d->q_bytes : 16, "q"), OSP_OK);
    assert_int_equal(osp_cuda_malloc((void **)&d->out, d->out_bytes, "out"), OSP_OK);
    assert_int_equal(osp_cuda_malloc(&d->k, d->page_bytes, "k pages"), OSP_OK);
    assert_int_equal(osp_cuda_malloc(&d->v, d->page_bytes, "v pages"), OSP_OK);
    assert_int_equal(osp_cuda_malloc(&d->ws, d->ws_bytes + WS_GUARD, "workspace"), OSP_OK);
    assert_int_equal(osp_cuda_malloc((void **)&d->qsl, sizeof(int32_t) * (MAX_SEQS + 1), "qsl"), OSP_OK);
    assert_int_equal(osp_cuda_malloc((void **)&d->positions, d->pos_bytes, "positions"), OSP_OK);
    assert_int_equal(osp_cuda_malloc((void **)&d->block_table, d->bt_bytes, "block table"), OSP_OK);
}

static void dev_free(dev_bufs *d) {
    osp_cuda_free(d->q);
    osp_cuda_free(d->out);
    osp_cuda_free(d->k);
    osp_cuda_free(d->v);
    osp_cuda_free(d->ws);
    osp_cuda_free(d->qsl);
    osp_cuda_free(d->positions);
    osp_cuda_free(d->block_table);
    memset(d, 0, sizeof *d);
}

/* Copies the batch's inputs (the buffers must be at least as large), poisons out and the guards. */
static void dev_upload(dev_bufs *d, const batch *b, void *stream) {
    const acase *c = &b->c;
    const size_t q_bytes = sizeof(uint16_t) * (size_t)(b->T * c->n_head * c->D);
    assert_true(q_bytes <= d->q_bytes && b->page_bytes <= d->page_bytes);
    if (q_bytes) assert_int_equal(osp_cuda_h2d(d->q, b->q_bf16, q_bytes, stream), OSP_OK);
    assert_int_equal(osp_cuda_h2d(d->k, b->k, b->page_bytes, stream), OSP_OK);
    assert_int_equal(osp_cuda_h2d(d->v, b->v, b->page_bytes, stream), OSP_OK);
    assert_int_equal(osp_cuda_h2d(d->qsl, b->qsl, sizeof(int32_t) * (size_t)(c->num_seqs + 1), stream), OSP_OK);
    if (b->T) assert_int_equal(osp_cuda_h2d(d->positions, b->positions, sizeof(int32_t) * (size_t)b->T, stream), OSP_OK);
    assert_int_equal(osp_cuda_h2d(d->block_table, b->block_table,
                                  sizeof(int32_t) * (size_t)c->num_seqs * (size_t)b->max_blocks, stream),
                     OSP_OK);
    assert_int_equal(osp_cuda_memset(d->out, 0xFF, d->out_bytes, stream), OSP_OK);
    assert_int_equal(osp_cuda_memset((char *)d->ws + d->ws_bytes, 0xAB, WS_GUARD, stream), OSP_OK);
    assert_int_equal(osp_cuda_stream_sync(stream), OSP_OK); /* the host buffers may go after this */
}

/* The kernel every launch of this test uses (osp_cuda_attention_force_mode): each case runs under v0,
 * v1 (mma.sync), v2 (wgmma, where it applies) and v3 (D 128) (run_case, test_graph_replay), the invariance test
 * under the tensor-core kernel's modes with each instruction. */
static int g_mode = OSP_CUDA_ATTN_V0;
/* the test's name for v3 (attention_ws.cu): fold mode under wgmma with the warp-specialized kernel and
 * ping-pong, every launch (decode batches too, which auto mode would split); D 128, f16 pages */
#define TEST_V3 100
/* the test's name for v4 (attention_dec.cu): split mode with the keys on the long side of the products,
 * every launch it can serve (prefills too); D 64 / 128, f16 pages, groups up to 16 */
#define TEST_V4 101
static const int k_kernels[] = {OSP_CUDA_ATTN_V0, OSP_CUDA_ATTN_V1, OSP_CUDA_ATTN_V2, TEST_V3, TEST_V4};
static const char *mode_name(int m) {
    return m == OSP_CUDA_ATTN_V0   ? "v0"
           : m == OSP_CUDA_ATTN_V1 ? "v1"
           : m == OSP_CUDA_ATTN_V2 ? "v2"
           : m == TEST_V3 ? "v3"
           : m == TEST_V4 ? "v4"
           : m == OSP_CUDA_ATTN_FOLD ? "fold"
                                     : "split";
}
/* false where kernel k of k_kernels would only repeat another's launch (v2 where wgmma does not apply) */
static bool kernel_applies(int mode, const acase *c) {
    const uint32_t kvt = c->f16 ? OSP_KV_PAGE_F16 : OSP_KV_PAGE_F32;
    if (mode == OSP_CUDA_ATTN_V0) return true;
    if (mode == TEST_V3) return c->f16 && c->D == 128;
    if (mode == TEST_V4) return c->f16 && (c->D == 64 || c->D == 128) && c->n_head / c->n_kv <= 16;
    if (!osp_cuda_attention_uses_v1(mode, kvt, c->D)) return false;
    return mode != OSP_CUDA_ATTN_V2 || osp_cuda_attention_v2_supported(kvt, c->D);
}

static osp_status dev_launch(const dev_bufs *d, const batch *b, void *stream) {
    const acase *c = &b->c;
    const bool v3 = g_mode == TEST_V3, v4 = g_mode == TEST_V4;
    osp_cuda_attention_force_mode(v3 ? OSP_CUDA_ATTN_FOLD : v4 ? OSP_CUDA_ATTN_V2 : g_mode);
    if (v3) { /* fold mode by v3 for every launch, then back to the defaults */
        osp_cuda_attention_force_mma(OSP_CUDA_ATTN_MMA_WGMMA);
        osp_cuda_attention_ws(OSP_CUDA_ATTN_WS_PINGPONG, 0);
    }
    /* v4 for every launch it serves (split mode: max_seq_len > 256); v2 otherwise; nothing else v4 */
    osp_cuda_attention_dec(v4 ? OSP_CUDA_ATTN_DEC_ALL : OSP_CUDA_ATTN_DEC_OFF);
    const osp_status st = osp_cuda_paged_attention(d->q, d->k, d->v, c->f16 ? OSP_KV_PAGE_F16 : OSP_KV_PAGE_F32, d->out,
                                                   c->num_seqs, d->qsl, d->positions, d->block_table, b->max_blocks,
                                                   c->bs, b->T, c->n_head, c->n_kv, c->D, batch_scale(b), c->window,
                                                   b->max_seq_len, d->ws, stream);
    if (v3) {
        osp_cuda_attention_ws(-1, 0);
        osp_cuda_attention_force_mma(OSP_CUDA_ATTN_MMA_AUTO);
    }
    osp_cuda_attention_dec(-1);
    return st;
}

/* Downloads out and compares with the CPU reference; checks the guard row and workspace guard. */
static void dev_check(const dev_bufs *d, const batch *b, void *stream, const char *what) {
    const acase *c = &b->c;
    const int64_t n = b->T * c->n_head * c->D, row = (int64_t)c->n_head * c->D;
    uint16_t *got = malloc(d->out_bytes);
    float *ref = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    uint8_t *guard = malloc(WS_GUARD);
    assert_non_null(got);
    assert_non_null(ref);
    assert_non_null(guard);
    assert_int_equal(osp_cuda_d2h(got, d->out, d->out_bytes, stream), OSP_OK);
    assert_int_equal(osp_cuda_d2h(guard, (const char *)d->ws + d->ws_bytes, WS_GUARD, stream), OSP_OK);
    assert_int_equal(osp_cuda_stream_sync(stream), OSP_OK);
    cpu_reference(b, ref);

    /* v1 (tensor cores: f16 pages, D <= 128) rounds P to f16 for the P V product: each weight p_j
     * carries a relative error up to 2^-11 that the fp32 denominator does not, so the result moves by
     * sum_j w_j eps_j v_j <= 2^-11 vmax at worst; 2^-10 vmax allows that and the fp32 terms above. */
    const bool v1 = g_mode == TEST_V3 || g_mode == TEST_V4 || osp_cuda_attention_uses_v1(g_mode, c->f16 ? OSP_KV_PAGE_F16 : OSP_KV_PAGE_F32, c->D);
    const float abs_tol = ldexpf(b->vmax, v1 ? -10 : -12);
    double err_sum = 0.0, ref_sum = 0.0;
    int64_t bad = 0, exact = 0; /* exact: gpu == bf16(cpu), a measure of the fp32 agreement */
    float worst = 0.0f;         /* largest err / tol */
    for (int64_t i = 0; i < n; i++) {
        const float r = ref[i], g = osp_bf16_to_fp32(got[i]);
        const float tol = ldexpf(fabsf(r), -8) + abs_tol, err = fabsf(g - r);
        exact += got[i] == osp_fp32_to_bf16(r);
        err_sum += fabs((double)g - (double)r);
        ref_sum += fabs((double)r);
        if (!isfinite(r)) {
            if (bad++ < 5) printf("  %s: reference not finite at %lld (test bug)\n", what, (long long)i);
            continue;
        }
        if (!(err <= tol)) {
            if (bad++ < 8) {
                const int64_t t = i / row, h = (i % row) / c->D, dd = i % c->D;
                int s = 0;
                while (s < c->num_seqs - 1 && t >= b->qsl[s + 1]) s++;
                printf("  %s: t %lld (seq %d, pos %d) head %lld dim %lld: gpu %.6g cpu %.6g (tol %.3g)\n", what,
                       (long long)t, s, (int)b->positions[t], (long long)h, (long long)dd, (double)g, (double)r,
                       (double)tol);
            }
        } else if (err / tol > worst) {
            worst = err / tol;
        }
    }
    int64_t guard_bad = 0;
    for (int64_t i = n; i < n + row; i++) guard_bad += got[i] != 0xFFFF;
    int64_t ws_bad = 0;
    for (int i = 0; i < WS_GUARD; i++) ws_bad += guard[i] != 0xAB;
    /* and on average: a wrong key or a lost tile moves many elements of its rows by ~p_j |v|, which
     * at long contexts can hide under the per-element bound but not under the mean one (measured
     * mean error: ~2^-10 of the mean |ref|, the bf16 rounding of the output) */
    const double mean_err = n ? err_sum / (double)n : 0.0, mean_ref = n ? ref_sum / (double)n : 0.0;
    const bool mean_bad = !(mean_err <= ldexp(mean_ref, -8) + ldexp((double)b->vmax, -14));
    printf("%-8s %-32s T %5lld seqs %3d heads %2d/%d D %3d %s bs %2d max_seq_len %6d win %4d: err/tol %.3f, "
           "bf16-exact %.4f, mean err/|ref| %.2e%s\n",
           v1 ? mode_name(g_mode) : "v0", what, (long long)b->T, c->num_seqs, c->n_head, c->n_kv, c->D,
           c->f16 ? "f16" : "f32", c->bs, (int)b->max_seq_len, (int)c->window, (double)worst, n ? (double)exact / (double)n : 1.0,
           mean_ref > 0 ? mean_err / mean_ref : 0.0, bad || mean_bad ? "  FAILED" : "");
    if (guard_bad) printf("  %s: %lld elements written past the last token\n", what, (long long)guard_bad);
    if (ws_bad) printf("  %s: %lld bytes written past the workspace\n", what, (long long)ws_bad);
    free(got);
    free(ref);
    free(guard);
    assert_int_equal(bad, 0);
    assert_false(mean_bad);
    assert_int_equal(guard_bad, 0);
    assert_int_equal(ws_bad, 0);
}

/* One batch: build, upload, launch on the legacy stream, compare. */
static void run_case(const acase *c, uint64_t seed, const char *what) {
    batch b;
    batch_build(&b, c, seed);
    for (size_t k = 0; k < sizeof k_kernels / sizeof k_kernels[0]; k++) {
        g_mode = k_kernels[k];
        if (!kernel_applies(g_mode, c)) continue;
        /* v2 is v2 here: its fold mode at D 128 is v3's by default */
        osp_cuda_attention_ws(OSP_CUDA_ATTN_WS_OFF, 0);
        dev_bufs d;
        dev_alloc(&d, &b, b.T > 0 ? b.T : 1);
        dev_upload(&d, &b, NULL);
        const osp_status st = dev_launch(&d, &b, NULL);
        if (st != OSP_OK) printf("  %s: %s\n", what, osp_last_error());
        assert_int_equal(st, OSP_OK);
        dev_check(&d, &b, NULL, what);
        dev_free(&d);
    }
    g_mode = OSP_CUDA_ATTN_V0;
    osp_cuda_attention_ws(-1, 0);
    batch_free(&b);
}

/* ---- tests -------------------------------------------------------------------------------------- */

typedef struct {
    int n_head, n_kv, D;
} head_cfg;

/* GQA 3 (SmolLM2), 4 (Llama-3-8B), 1 (MHA), 8, 4 at D 256, 1 at D 32, 24 (two head chunks per kv head) */
static const head_cfg k_heads[] = {{9, 3, 64}, {32, 8, 128}, {8, 8, 64}, {16, 2, 128},
                                   {8, 2, 256}, {4, 4, 32},   {24, 1, 64}};
#define N_HEADS (sizeof k_heads / sizeof k_heads[0])

/* Mixed batch: decodes at contexts 1, 2, 16, 1000, 5000, 17; a zero-token sequence; prefill chunks
 * of 17 tokens over a 100-token prefix, 15 tokens from 0 and 40 tokens over a 1000-token prefix. */
static void test_mixed_batches(void **state) {
    (void)state;
    static const int32_t prefix[] = {0, 1, 37, 15, 100, 999, 0, 4999, 1000, 16};
    static const int32_t nnew[] = {1, 1, 0, 1, 17, 1, 15, 1, 40, 1};
    static const int bss[] = {16, 7, 1};
    int n = 0;
    for (size_t hi = 0; hi < N_HEADS; hi++)
        for (int fi = 0; fi < 2; fi++)
            for (int bi = 0; bi < 3; bi++) {
                acase c = {0};
                c.n_head = k_heads[hi].n_head;
                c.n_kv = k_heads[hi].n_kv;
                c.D = k_heads[hi].D;
                c.f16 = fi == 0;
                c.bs = bss[bi];
                c.num_seqs = (int)(sizeof prefix / sizeof prefix[0]);
                memcpy(c.prefix, prefix, sizeof prefix);
                memcpy(c.nnew, nnew, sizeof nnew);
                c.qamp = 2.0f;
                run_case(&c, 1000u + (uint64_t)n++, "mixed");
            }
}

/* Pure decode batches: 24 sequences at random contexts up to 3000 plus one at 5000; single decodes
 * at 5000 (the most splits); max_seq_len far above the contexts (a graph sized for max_model_len). */
/* OSPREY_TEST_SANITIZER_SUBSET=1 (scripts/gpu-test.sh sets it under racecheck, ~50x slower): a
 * quarter of the random cases and two of the invariance shapes, every kernel and mode still run. */
static bool sanitizer_subset(void) {
    const char *e = getenv("OSPREY_TEST_SANITIZER_SUBSET");
    return e && e[0] == '1';
}

static void test_decode_batches(void **state) {
    (void)state;
    int n = 0;
    for (size_t hi = 0; hi < N_HEADS; hi++) {
        for (int variant = 0; variant < 3; variant++) {
            acase c = {0};
            c.n_head = k_heads[hi].n_head;
            c.n_kv = k_heads[hi].n_kv;
            c.D = k_heads[hi].D;
            c.f16 = variant != 1;
            c.bs = variant == 2 ? 7 : 16;
            c.qamp = variant == 2 ? 6.0f : 2.0f;
            g_rng = 77u + (uint64_t)n;
            if (variant == 1) {
                c.num_seqs = 1;
                c.prefix[0] = 4999;
                c.nnew[0] = 1;
            } else {
                c.num_seqs = 25;
                for (int s = 0; s < 24; s++) c.prefix[s] = rnd_int(3000), c.nnew[s] = 1;
                c.prefix[24] = 4999, c.nnew[24] = 1;
            }
            c.max_seq_len = variant == 2 ? 131072 : 0;
            run_case(&c, 2000u + (uint64_t)n++, variant == 1 ? "decode (one, 5000)" : "decode batch");
        }
    }
    /* 128 decodes of 8 kv heads: enough CTAs that the launch does not split (long contexts in one CTA) */
    acase c = {0};
    c.n_head = 8, c.n_kv = 8, c.D = 64, c.f16 = true, c.bs = 16, c.num_seqs = 128, c.qamp = 2.0f;
    g_rng = 2999;
    for (int s = 0; s < c.num_seqs; s++) c.prefix[s] = rnd_int(1500), c.nnew[s] = 1;
    run_case(&c, 2999, "decode batch of 128 (one split)");
    /* the 8B shape at the longest context, and the block sizes the engine is run with */
    if (!sanitizer_subset()) {
        acase l = {0};
        l.n_head = 32, l.n_kv = 8, l.D = 128, l.f16 = true, l.bs = 64, l.num_seqs = 2, l.qamp = 2.0f;
        l.prefix[0] = 131071, l.nnew[0] = 1, l.prefix[1] = 70000, l.nnew[1] = 1;
        run_case(&l, 2998, "decode at 131,072 keys (8B shape, blocks of 64)");
    }
    static const int bss[] = {32, 64};
    for (int i = 0; i < 2; i++) {
        acase b = {0};
        b.n_head = 32, b.n_kv = 8, b.D = 128, b.f16 = true, b.bs = bss[i], b.num_seqs = 3, b.qamp = 2.0f;
        b.prefix[0] = 3000, b.nnew[0] = 1, b.prefix[1] = 100, b.nnew[1] = 37, b.prefix[2] = 0, b.nnew[2] = 65;
        run_case(&b, 2997u - (uint64_t)i, bss[i] == 32 ? "mixed batch, blocks of 32" : "mixed batch, blocks of 64");
    }
}

/* Long prefills: 2048 tokens from position 0 in one sequence (SmolLM2 shape: enough tiles that the
 * launch does not split), and 300 tokens over a 3000-token prefix (split). */
static void test_long_prefill(void **state) {
    (void)state;
    acase c = {0};
    c.n_head = 9, c.n_kv = 3, c.D = 64, c.f16 = true, c.bs = 16, c.num_seqs = 1, c.qamp = 3.0f;
    c.prefix[0] = 0, c.nnew[0] = 2048;
    run_case(&c, 3001, "prefill 2048 from 0");
    c.n_head = 8, c.n_kv = 2, c.D = 128, c.f16 = false, c.bs = 7;
    c.prefix[0] = 3000, c.nnew[0] = 300;
    run_case(&c, 3002, "prefill 300 over 3000");
    c.n_head = 8, c.n_kv = 1, c.D = 128, c.f16 = true, c.bs = 1, c.num_seqs = 2;
    c.prefix[0] = 0, c.nnew[0] = 100, c.prefix[1] = 250, c.nnew[1] = 129;
    run_case(&c, 3003, "two prefills, GQA 8, bs 1");
}

/* Random shapes: any supported head_dim, group sizes, block sizes 1..40, 1..12 sequences each with
 * a random prefix (0..700, or 0..200 in every third case so that max_seq_len allows no split) and
 * 0..40 new tokens, max_seq_len sometimes much larger than needed. */
static void test_random_batches(void **state) {
    (void)state;
    static const head_cfg heads[] = {{9, 3, 64},  {32, 8, 128}, {8, 8, 64},  {16, 2, 128}, {8, 2, 256},
                                     {4, 4, 32},  {24, 1, 64},  {6, 2, 128}, {12, 4, 32},  {2, 1, 256},
                                     {14, 2, 64}, {40, 8, 128}, {17, 1, 64}, {4, 1, 128}};
    static const int dims[] = {32, 64, 128, 256};
    for (int n = 0; n < (sanitizer_subset() ? 15 : 60); n++) {
        g_rng = 0xA77E + (uint64_t)n * 7919u;
        acase c = {0};
        const head_cfg h = heads[rnd_int((int)(sizeof heads / sizeof heads[0]))];
        c.n_head = h.n_head;
        c.n_kv = h.n_kv;
        c.D = rnd_int(3) == 0 ? dims[rnd_int(4)] : h.D;
        c.f16 = rnd_int(2) == 0;
        c.bs = rnd_int(3) == 0 ? 1 + rnd_int(40) : (rnd_int(2) ? 16 : 7);
        c.num_seqs = 1 + rnd_int(12);
        const bool short_ctx = n % 3 == 0; /* contexts <= 240 and max_seq_len too: never split */
        int64_t T = 0;
        for (int s = 0; s < c.num_seqs; s++) {
            c.prefix[s] = rnd_int(4) == 0 ? 0 : rnd_int(short_ctx ? 200 : 700);
            c.nnew[s] = rnd_int(5) == 0 ? 0 : (rnd_int(2) ? 1 : 1 + rnd_int(40));
            T += c.nnew[s];
        }
        if (T == 0) c.nnew[0] = 1;
        c.qamp = 0.5f + 4.0f * (rnd_unit() + 1.0f);
        c.max_seq_len = !short_ctx && rnd_int(3) == 0 ? 800 + rnd_int(40000) : 0;
        c.window = rnd_int(4) == 0 ? 1 + rnd_int(300) : 0;
        run_case(&c, 4000u + (uint64_t)n, "random");
    }
}

/* A CUDA graph captured once (fixed T, num_seqs, max_seq_len, buffers) and replayed over batches of
 * different contents: other contexts, another split of the same T over the sequences. */
static void test_graph_replay(void **state) {
    (void)state;
    static const head_cfg cfgs[] = {{32, 8, 128}, {9, 3, 64}};
    for (int run = 0; run < 10; run++) { /* v0, v1, v2, v3, v4 on each shape */
        const int ci = run % 2;
        g_mode = k_kernels[run / 2];
        if (g_mode == TEST_V3 && cfgs[ci].D != 128) continue;
        osp_cuda_attention_ws(OSP_CUDA_ATTN_WS_OFF, 0); /* v2 is v2 (TEST_V3 sets its own) */
        acase a = {0};
        a.n_head = cfgs[ci].n_head, a.n_kv = cfgs[ci].n_kv, a.D = cfgs[ci].D;
        a.f16 = true, a.bs = 16, a.num_seqs = 5, a.qamp = 2.0f, a.max_seq_len = 8192;
        a.min_blocks = 5 * 8192 / 16 + 8, a.min_max_blocks = 8192 / 16 + 2;
        acase b = a, e = a;
        const int32_t pa[] = {10, 300, 0, 2000, 5}, na[] = {1, 1, 5, 1, 0};
        const int32_t pb[] = {3000, 0, 100, 17, 4000}, nb[] = {1, 2, 4, 0, 1};
        const int32_t pe[] = {0, 0, 0, 0, 7000}, ne[] = {0, 0, 0, 0, 8};
        memcpy(a.prefix, pa, sizeof pa), memcpy(a.nnew, na, sizeof na);
        memcpy(b.prefix, pb, sizeof pb), memcpy(b.nnew, nb, sizeof nb);
        memcpy(e.prefix, pe, sizeof pe), memcpy(e.nnew, ne, sizeof ne);

        void *stream = NULL, *graph = NULL;
        assert_int_equal(osp_cuda_stream_create(&stream), OSP_OK);
        batch ba;
        batch_build(&ba, &a, 5000u + (uint64_t)ci);
        dev_bufs d;
        dev_alloc(&d, &ba, ba.T);
        dev_upload(&d, &ba, stream);
        assert_int_equal(osp_cuda_graph_begin(stream), OSP_OK);
        const osp_status st = dev_launch(&d, &ba, stream);
        void *g_tmp = NULL;
        const osp_status st_end = osp_cuda_graph_end(stream, &g_tmp);
        if (st != OSP_OK || st_end != OSP_OK) printf("  graph: %s\n", osp_last_error());
        assert_int_equal(st, OSP_OK);
        assert_int_equal(st_end, OSP_OK);
        graph = g_tmp;

        assert_int_equal(osp_cuda_graph_launch(graph, stream), OSP_OK);
        dev_check(&d, &ba, stream, "graph replay 1");
        const acase *next[] = {&b, &e};
        for (int k = 0; k < 2; k++) {
            batch bb;
            batch_build(&bb, next[k], 5100u + (uint64_t)(ci * 2 + k));
            assert_true(bb.T == ba.T && bb.max_blocks == ba.max_blocks && bb.num_blocks == ba.num_blocks);
            dev_upload(&d, &bb, stream);
            assert_int_equal(osp_cuda_graph_launch(graph, stream), OSP_OK);
            dev_check(&d, &bb, stream, k == 0 ? "graph replay 2" : "graph replay 3");
            batch_free(&bb);
        }
        osp_cuda_graph_destroy(graph);
        dev_free(&d);
        batch_free(&ba);
        osp_cuda_stream_destroy(stream);
    }
    g_mode = OSP_CUDA_ATTN_V0;
    osp_cuda_attention_ws(-1, 0);
}

/* ---- batch invariance (v1) ------------------------------------------------------------------------- */

/* Runs batch b under force mode `mode` with v4 in mode `dec` (OSP_CUDA_ATTN_DEC_*) and returns its
 * output bits (T * n_head * D, caller frees). */
static uint16_t *run_bits(const batch *b, int mode, int dec) {
    dev_bufs d;
    dev_alloc(&d, b, b->T);
    dev_upload(&d, b, NULL);
    g_mode = mode;
    osp_cuda_attention_force_mode(mode);
    osp_cuda_attention_dec(dec);
    const osp_status st = osp_cuda_paged_attention(d.q, d.k, d.v, b->c.f16 ? OSP_KV_PAGE_F16 : OSP_KV_PAGE_F32, d.out,
                                                   b->c.num_seqs, d.qsl, d.positions, d.block_table, b->max_blocks,
                                                   b->c.bs, b->T, b->c.n_head, b->c.n_kv, b->c.D, batch_scale(b),
                                                   b->c.window, b->max_seq_len, d.ws, NULL);
    osp_cuda_attention_dec(-1);
    g_mode = OSP_CUDA_ATTN_V0;
    if (st != OSP_OK) printf("  run_bits: %s\n", osp_last_error());
    assert_int_equal(st, OSP_OK);
    const size_t n = sizeof(uint16_t) * (size_t)(b->T * b->c.n_head * b->c.D);
    uint16_t *out = malloc(n > 0 ? n : 2);
    assert_non_null(out);
    assert_int_equal(osp_cuda_d2h(out, d.out, n, NULL), OSP_OK);
    assert_int_equal(osp_cuda_stream_sync(NULL), OSP_OK);
    dev_free(&d);
    return out;
}

/* A batch over the pages of `full` (one sequence X of full->T tokens from position 0): sequence i
 * takes X's positions [start[i], start[i] + count[i]) through X's own block table (as a shared
 * prefix would), with X's q for sequence 0 and fresh random q for the others. The pages are shared
 * with `full` (not freed by derived_free). */
static void derive(batch *dst, const batch *full, int nseq, const int32_t *start, const int32_t *count,
                   uint64_t seed) {
    const acase *c = &full->c;
    memset(dst, 0, sizeof *dst);
    dst->c = *c;
    dst->c.num_seqs = nseq;
    const int64_t hd = (int64_t)c->n_head * c->D;
    int64_t T = 0;
    for (int i = 0; i < nseq; i++) T += count[i];
    dst->T = T;
    dst->max_blocks = full->max_blocks;
    dst->num_blocks = full->num_blocks;
    dst->page_bytes = full->page_bytes;
    dst->k = full->k, dst->v = full->v, dst->vmax = full->vmax;
    dst->positions = malloc(sizeof(int32_t) * (size_t)T);
    dst->block_table = malloc(sizeof(int32_t) * (size_t)nseq * (size_t)full->max_blocks);
    dst->q_bf16 = malloc(sizeof(uint16_t) * (size_t)(T * hd));
    dst->q_f32 = malloc(sizeof(float) * (size_t)(T * hd));
    assert_true(dst->positions && dst->block_table && dst->q_bf16 && dst->q_f32);
    g_rng = seed;
    int64_t t = 0;
    dst->max_ctx = 1;
    dst->qsl[0] = 0;
    for (int i = 0; i < nseq; i++) {
        memcpy(dst->block_table + (size_t)i * full->max_blocks, full->block_table,
               sizeof(int32_t) * (size_t)full->max_blocks);
        for (int32_t j = 0; j < count[i]; j++, t++) {
            dst->positions[t] = start[i] + j;
            for (int64_t e = 0; e < hd; e++) {
                const int64_t src = (int64_t)(start[i] + j) * hd + e;
                dst->q_bf16[t * hd + e] = i == 0 ? full->q_bf16[src] : osp_fp32_to_bf16(rnd_unit() * c->qamp);
                dst->q_f32[t * hd + e] = osp_bf16_to_fp32(dst->q_bf16[t * hd + e]);
            }
        }
        dst->qsl[i + 1] = (int32_t)t;
        if (count[i] > 0 && start[i] + count[i] > dst->max_ctx) dst->max_ctx = start[i] + count[i];
        dst->c.prefix[i] = start[i], dst->c.nnew[i] = count[i];
    }
    dst->max_seq_len = full->max_seq_len;
}

static void derived_free(batch *b) {
    free(b->positions), free(b->block_table), free(b->q_bf16), free(b->q_f32);
    memset(b, 0, sizeof *b);
}

/* Sequence X's rows give the same bits however its tokens are batched: one prefill of all of X
 * (reference), X in prefill chunks of other lengths beside other sequences' prefills and decodes,
 * X's last tokens as decodes alone and in batches, each in auto, fold and split mode and under other
 * launch shapes (stages, chunks per split CTA). This is the batch-invariance rule (shared/DESIGN.md)
 * at the kernel: the scheduler's chunking of a prompt depends on the batch, so a row's numbers may not. X spans several chunks (1500 tokens > 256). */
static void test_batch_invariance(void **state) {
    (void)state;
    typedef struct { int n_head, n_kv, D, window; } inv_cfg;
    /* the last: a group of 16 (v4's 16-row tiles) */
    static const inv_cfg cfgs[] = {{32, 8, 128, 0}, {9, 3, 64, 0}, {4, 4, 32, 0}, {16, 2, 128, 300}, {8, 1, 64, 0},
                                   {16, 1, 128, 0}};
    const int32_t N = 1500;
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        if (sanitizer_subset() && ci != 0 && ci != 3) continue; /* D 128, with and without a window */
        acase c = {0};
        c.n_head = cfgs[ci].n_head, c.n_kv = cfgs[ci].n_kv, c.D = cfgs[ci].D, c.window = cfgs[ci].window;
        c.f16 = true, c.bs = ci % 2 ? 7 : 16, c.num_seqs = 1, c.qamp = 3.0f;
        c.prefix[0] = 0, c.nnew[0] = N;
        c.max_seq_len = 4096;
        batch full;
        batch_build(&full, &c, 7000u + ci);
        if (!osp_cuda_attention_v1_supported(OSP_KV_PAGE_F16, c.D)) skip();
        /* each instruction on its own: mma.sync (v1) and, where it applies, wgmma (v2) need not round
         * alike, and which one serves a row depends on the model's shape alone */
        for (int wg = 0; wg < 2; wg++) {
        if (wg && !osp_cuda_attention_v2_supported(OSP_KV_PAGE_F16, c.D)) continue;
        const int base_mode = wg ? OSP_CUDA_ATTN_V2 : OSP_CUDA_ATTN_V1;
        osp_cuda_attention_force_mma(wg ? OSP_CUDA_ATTN_MMA_WGMMA : OSP_CUDA_ATTN_MMA_SYNC);
        {   /* the reference itself is right */
            g_mode = base_mode;
            dev_bufs d;
            dev_alloc(&d, &full, full.T);
            dev_upload(&d, &full, NULL);
            assert_int_equal(dev_launch(&d, &full, NULL), OSP_OK);
            dev_check(&d, &full, NULL, "invariance reference");
            dev_free(&d);
            g_mode = OSP_CUDA_ATTN_V0;
        }
        uint16_t *ref = run_bits(&full, base_mode, OSP_CUDA_ATTN_DEC_OFF);
        const int64_t hd = (int64_t)c.n_head * c.D;
        /* X's token ranges as sequence 0, with company */
        typedef struct { int n; int32_t start[4], count[4]; } layout;
        static const layout lays[] = {
            {3, {0, 1499, 200}, {64, 1, 37}},   {3, {64, 30, 1000}, {636, 1, 1}},  {2, {700, 5}, {800, 3}},
            {1, {1499}, {1}},                   {4, {1499, 1200, 17, 900}, {1, 1, 1, 1}},
            {3, {1200, 0, 1498}, {17, 400, 2}}, {1, {1480}, {20}},
        };
        /* modes, v1's launch shapes (osp_cuda_attention_v1_tune: fold stages, split stages, split
         * waves, chunks per split CTA; 0 the default) and fold mode's CTA order (the last: slot order,
         * not longest first): none may change a bit */
        const int modes[] = {base_mode,          OSP_CUDA_ATTN_FOLD,  OSP_CUDA_ATTN_SPLIT, OSP_CUDA_ATTN_SPLIT,
                             OSP_CUDA_ATTN_FOLD, OSP_CUDA_ATTN_FOLD,  OSP_CUDA_ATTN_FOLD,  OSP_CUDA_ATTN_FOLD,
                             base_mode,          OSP_CUDA_ATTN_SPLIT, base_mode,           OSP_CUDA_ATTN_FOLD};
        static const int tunes[][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 3, 0, 3},
                                       {4, 4, 0, 2}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0},
                                       {0, 0, 0, 0}, {0, 4, 0, 3}, {0, 2, 0, 0}, {3, 0, 0, 0}};
        /* the last two: fold mode by v3 (D 128 under wgmma; elsewhere the same launches as mode 1)
         * with ping-pong and 4 stages, and without it with 3: v3's rows must be v2's bits */
        static const int ws_modes[][2] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0},
                                          {OSP_CUDA_ATTN_WS_PINGPONG, 4}, {OSP_CUDA_ATTN_WS_ON, 3},
                                          {0, 0}, {0, 0}, {0, 0}, {0, 0}};
        /* v4 (under wgmma; elsewhere the same launches as v1's): every launch it serves, by default
         * shape, in split mode with 4 stages and 3 chunks a CTA, decode launches only with 2
         * stages, and every launch in fold mode with 3: v4's rows must be v2's bits too */
        static const int dec_modes[] = {OSP_CUDA_ATTN_DEC_OFF, OSP_CUDA_ATTN_DEC_OFF, OSP_CUDA_ATTN_DEC_OFF,
                                        OSP_CUDA_ATTN_DEC_OFF, OSP_CUDA_ATTN_DEC_OFF, OSP_CUDA_ATTN_DEC_OFF,
                                        OSP_CUDA_ATTN_DEC_OFF, OSP_CUDA_ATTN_DEC_OFF, OSP_CUDA_ATTN_DEC_ALL,
                                        OSP_CUDA_ATTN_DEC_ALL, OSP_CUDA_ATTN_DEC_DECODE, OSP_CUDA_ATTN_DEC_ALL};
        const int n_modes = (int)(sizeof modes / sizeof modes[0]);
        int64_t compared = 0;
        for (size_t li = 0; li < sizeof lays / sizeof lays[0]; li++)
            for (int mi = 0; mi < n_modes; mi++) {
                /* under a sanitizer (racecheck runs ~1000x slower): two layouts, the base mode, split
                 * mode and v3, so the test finishes inside one device call */
                if (sanitizer_subset() && (li > 1 || (mi != 0 && mi != 2 && mi != 6 && mi != 8))) continue;
                batch b;
                derive(&b, &full, lays[li].n, lays[li].start, lays[li].count, 7100u + li);
                osp_cuda_attention_v1_tune(tunes[mi][0], tunes[mi][1], tunes[mi][2], tunes[mi][3]);
                osp_cuda_attention_tile_order(mi != 5);
                osp_cuda_attention_ws(ws_modes[mi][0] ? ws_modes[mi][0] : OSP_CUDA_ATTN_WS_OFF, ws_modes[mi][1]);
                uint16_t *got = run_bits(&b, modes[mi], dec_modes[mi]);
                osp_cuda_attention_ws(-1, 0);
                osp_cuda_attention_tile_order(1);
                osp_cuda_attention_v1_tune(0, 0, 0, 0);
                const int32_t x0 = lays[li].start[0], nx = lays[li].count[0];
                const size_t bytes = sizeof(uint16_t) * (size_t)(nx * hd);
                const int diff = memcmp(got, ref + (int64_t)x0 * hd, bytes);
                if (diff) {
                    int64_t first = 0;
                    while (got[first] == ref[x0 * hd + first]) first++;
                    printf("  invariance: heads %d/%d D %d layout %zu mode %d (tune %d %d %d %d, %s order, v3 %d/%d, v4 "
                           "%d): X's tokens %d.. differ from the one-prefill bits (first at row %lld: %04x vs %04x)\n",
                           c.n_head, c.n_kv, c.D, li, modes[mi], tunes[mi][0], tunes[mi][1], tunes[mi][2],
                           tunes[mi][3], mi == 5 ? "slot" : "longest-first", ws_modes[mi][0], ws_modes[mi][1],
                           dec_modes[mi], (int)x0, (long long)(first / hd), got[first], ref[x0 * hd + first]);
                }
                assert_int_equal(diff, 0);
                compared += nx;
                free(got);
                derived_free(&b);
            }
        printf("invariance %s heads %2d/%d D %3d win %3d bs %2d: %lld rows bit-identical to the one-prefill run\n",
               wg ? "wgmma" : "mma.sync", c.n_head, c.n_kv, c.D, c.window, c.bs, (long long)compared);
        free(ref);
        }
        osp_cuda_attention_force_mma(OSP_CUDA_ATTN_MMA_AUTO);
        batch_free(&full);
    }
}

/* Shapes the kernel does not handle are refused on the host, before any launch. */
static void test_arguments(void **state) {
    (void)state;
    assert_true(osp_cuda_attention_supported(9, 3, 64));
    assert_true(osp_cuda_attention_supported(32, 8, 128));
    assert_true(osp_cuda_attention_supported(8, 2, 256));
    assert_true(osp_cuda_attention_supported(4, 4, 32));
    assert_false(osp_cuda_attention_supported(9, 3, 96));
    assert_false(osp_cuda_attention_supported(10, 4, 64));
    assert_false(osp_cuda_attention_supported(0, 1, 64));
    assert_int_equal(osp_cuda_attention_workspace_bytes(64, 32, 128, 256), 0); /* one split at most */
    assert_true(osp_cuda_attention_workspace_bytes(1, 32, 128, 8192) > 0);

    uint16_t *q = NULL, *out = NULL;
    int32_t *idx = NULL;
    assert_int_equal(osp_cuda_malloc((void **)&q, 4096, "q"), OSP_OK);
    assert_int_equal(osp_cuda_malloc((void **)&out, 4096, "out"), OSP_OK);
    assert_int_equal(osp_cuda_malloc((void **)&idx, 4096, "idx"), OSP_OK);
    assert_int_equal(osp_cuda_memset(idx, 0, 4096, NULL), OSP_OK);
    /* head_dim 96, a group that does not divide, block size 0, T > 0 without sequences, misaligned q */
    assert_int_equal(osp_cuda_paged_attention(q, out, out, OSP_KV_PAGE_F16, out, 1, idx, idx, idx, 1, 16, 1, 3, 1, 96, 0.1f, 0,
                                              16, NULL, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_paged_attention(q, out, out, OSP_KV_PAGE_F16, out, 1, idx, idx, idx, 1, 16, 1, 10, 4, 64, 0.1f, 0,
                                              16, NULL, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_paged_attention(q, out, out, OSP_KV_PAGE_F16, out, 1, idx, idx, idx, 1, 0, 1, 4, 4, 64, 0.1f, 0, 16,
                                              NULL, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_paged_attention(q, out, out, OSP_KV_PAGE_F16, out, 0, idx, idx, idx, 1, 16, 1, 4, 4, 64, 0.1f, 0,
                                              16, NULL, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_paged_attention(q + 1, out, out, OSP_KV_PAGE_F16, out, 1, idx, idx, idx, 1, 16, 1, 4, 4, 64,
                                              0.1f, 0, 16, NULL, NULL),
                     OSP_ERR_INVALID_ARG);
    /* T = 0 is nothing to do */
    assert_int_equal(osp_cuda_paged_attention(q, out, out, OSP_KV_PAGE_F16, out, 1, idx, idx, idx, 1, 16, 0, 4, 4, 64, 0.1f, 0, 16,
                                              NULL, NULL),
                     OSP_OK);
    assert_int_equal(osp_cuda_stream_sync(NULL), OSP_OK);
    osp_cuda_free(q);
    osp_cuda_free(out);
    osp_cuda_free(idx);
}

int main(void) {
    if (osp_cuda_device_count() == 0) {
        printf("test_gpu_attention: skipped: no CUDA device\n");
        return 77;
    }
    char name[256];
    if (osp_cuda_device_name(name, sizeof name) == OSP_OK) printf("device: %s\n", name);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arguments),      cmocka_unit_test(test_mixed_batches),
        cmocka_unit_test(test_decode_batches), cmocka_unit_test(test_long_prefill),
        cmocka_unit_test(test_random_batches), cmocka_unit_test(test_graph_replay),
        cmocka_unit_test(test_batch_invariance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
