/* Quest's page scoring and top-k page selection on the GPU (issue 15; Tang et al. 2024, "Quest:
 * Query-Aware Sparsity for Efficient Long-Context LLM Inference", ICML 2024, §3.2-3.3). The reference is
 * src/sparse/quest.c (osp_quest_select): the selection here is the same set of pages, bit for bit in the
 * scores, for every (token, KV head) row. Contract in cuda_ops.h (osp_cuda_quest_select).
 *
 * Two kernels:
 *   quest_score_kernel   a CTA per (row, run of 64 logical pages in [S, n_ctx - R); fewer for a large
 *                        head_dim), one or two threads a page: the pages' min / max key summaries of the
 *                        row's KV head (fp32, or f16 / bf16: the page dtype's values, which min and max keep
 *                        exact) staged in shared memory by cp.async, then read by the page's threads against
 *                        the group's query heads (fp32 from bf16, in shared memory; groups of 4 and 8 heads
 *                        unrolled and split over the page's 2 threads), every head's bound summed in
 *                        dimension order with the reference's operations (a = q m, b = q M rounded products,
 *                        u += a > b ? a : b, no contraction), best = the largest bound (a NaN never wins;
 *                        the two threads' bests combined by the same rule).
 *   quest_topk_kernel    a CTA per row, the row's scores read once into shared memory (up to 16,384 pages):
 *                        the k-th largest score by a radix select (4 passes of 8-bit
 *                        digits over an order-preserving 32-bit key, -0 folded into +0 so equal scores
 *                        are equal keys), then one pass over the pages in ascending order that keeps the
 *                        sinks, the recent pages, every page above the threshold and, of the pages equal
 *                        to it, the lowest-numbered ones (quest.c's tie order: score descending, page
 *                        ascending), writing them ascending. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

namespace {

constexpr int kTopkThreads = 1024;
constexpr int kMaxGroup = 16;
constexpr int kTopkSmemPages = 16384; /* a row's scores staged in shared memory up to this many pages (64 KB) */

/* order-preserving key of a non-NaN float: larger float, larger key; -0 and +0 the same key */
__device__ __forceinline__ uint32_t order_key(float f) {
    uint32_t u = __float_as_uint(f == 0.0f ? 0.0f : f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct QParams {
    const void *kmin, *kmax;    /* [num_blocks, n_head_kv, D] of the summary type */
    const uint16_t *q;          /* [T, n_head, D] bf16 */
    const int32_t *positions, *token_seq, *block_table;
    float *scores;              /* [T * n_head_kv, max_pages] */
    int32_t *pages_out, *counts;
    int max_blocks, block_size, n_head, n_head_kv, D, grp, topk, sink, recent, max_pages;
};

/* summary element -> fp32 (exact: f16 and bf16 widen exactly) */
template <typename TS> __device__ __forceinline__ float sum_f32(TS v);
template <> __device__ __forceinline__ float sum_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float sum_f32<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float sum_f32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

/* A CTA per (row, run of PPC logical pages): the run's min / max summaries of the row's KV head copied into
 * shared memory by 16-byte cp.async (all in flight at once; a page's D values are contiguous, so the copy
 * is coalesced where a thread-per-page read of global memory was not), then thread i scores page j0 + i
 * from shared memory, dimension by dimension in the reference's order. Shared rows padded by 16 bytes: a
 * warp's 16-byte reads of 32 rows are conflict-free. */
/* GRP: the group's query heads, or 0: p.grp (up to kMaxGroup); TPP threads a page, each with GRP / TPP of
 * the heads (the page's best = the best of the threads' bests, exchanged by shuffles) */
template <typename TS, int PPC, int GRP, int TPP = 1>
__global__ void __launch_bounds__(PPC * TPP) quest_score_kernel(const QParams p) {
    static_assert(TPP == 1 || (GRP > 0 && GRP % TPP == 0), "heads split over a page's threads");
    constexpr int NT = PPC * TPP;
    osp_pdl_begin();
    extern __shared__ uint4 qs_smem[];
    float *q_smem = reinterpret_cast<float *>(qs_smem); /* [grp][D] */
    const int D = p.D, RSB = D * (int)sizeof(TS) + 16, CPV = D * (int)sizeof(TS) / 16;
    uint8_t *st = reinterpret_cast<uint8_t *>(q_smem + p.grp * D); /* [PPC][min, max][RSB] */
    const int row = (int)blockIdx.y, t = row / p.n_head_kv, kvh = row % p.n_head_kv, tid = (int)threadIdx.x;
    const int n_ctx = p.positions[t] / p.block_size + 1;
    const int j0 = (int)blockIdx.x * PPC, lo = max(j0, p.sink), hi = min(j0 + PPC, n_ctx - p.recent);
    if (lo >= hi) return; /* uniform: no candidate page here */
    const int32_t *bt = p.block_table + (int64_t)p.token_seq[t] * p.max_blocks;
    const uint8_t *gmin = reinterpret_cast<const uint8_t *>(p.kmin), *gmax = reinterpret_cast<const uint8_t *>(p.kmax);
    const uint32_t st_u = (uint32_t)__cvta_generic_to_shared(st);
    for (int c = tid; c < (hi - lo) * 2 * CPV; c += NT) {
        const int i = c / (2 * CPV), which = (c / CPV) % 2, part = c % CPV, j = lo + i;
        const int64_t off = ((int64_t)bt[j] * p.n_head_kv + kvh) * D * (int64_t)sizeof(TS) + part * 16;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(st_u + (uint32_t)((2 * (j - j0) + which) * RSB + part * 16)),
                     "l"((which ? gmax : gmin) + off));
    }
    asm volatile("cp.async.commit_group;\n" ::);
    for (int i = tid; i < p.grp * D; i += NT) {
        const int h = i / D, d = i % D;
        q_smem[i] = __uint_as_float((uint32_t)p.q[((int64_t)t * p.n_head + kvh * p.grp + h) * D + d] << 16);
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    const int pg = tid / TPP, part = tid % TPP, j = j0 + pg;
    if (j < lo || j >= hi) return; /* a page's TPP threads (adjacent lanes) leave together */
    const TS *mn = reinterpret_cast<const TS *>(st + 2 * pg * RSB), *mx = reinterpret_cast<const TS *>(st + (2 * pg + 1) * RSB);
    constexpr int E = 16 / (int)sizeof(TS); /* values a 16-byte read */
    constexpr int NG = GRP ? GRP / TPP : kMaxGroup;
    const int grp = GRP ? GRP / TPP : p.grp, h0 = part * NG;
    float u[NG];
#pragma unroll
    for (int h = 0; h < NG; h++) u[h] = 0.0f;
    for (int i0 = 0; i0 < D; i0 += E) {
        const uint4 a16 = *reinterpret_cast<const uint4 *>(mn + i0), b16 = *reinterpret_cast<const uint4 *>(mx + i0);
        const TS *av = reinterpret_cast<const TS *>(&a16), *bv = reinterpret_cast<const TS *>(&b16);
        float am[E], bm[E];
#pragma unroll
        for (int e = 0; e < E; e++) am[e] = sum_f32<TS>(av[e]), bm[e] = sum_f32<TS>(bv[e]);
#pragma unroll
        for (int h = 0; h < NG; h++) {
            if (!GRP && h >= grp) break;
            /* the head's E query values: 16-byte shared reads (i0 is a multiple of 4, D of 4) */
            float qv[E];
#pragma unroll
            for (int e4 = 0; e4 < E; e4 += 4) {
                const float4 q4 = *reinterpret_cast<const float4 *>(q_smem + (h0 + h) * D + i0 + e4);
                qv[e4] = q4.x, qv[e4 + 1] = q4.y, qv[e4 + 2] = q4.z, qv[e4 + 3] = q4.w;
            }
#pragma unroll
            for (int e = 0; e < E; e++) {
                const float a = __fmul_rn(qv[e], am[e]), b = __fmul_rn(qv[e], bm[e]);
                u[h] = __fadd_rn(u[h], a > b ? a : b);
            }
        }
    }
    float best = -INFINITY;
#pragma unroll
    for (int h = 0; h < NG; h++)
        if (h < grp && u[h] > best) best = u[h];
#pragma unroll
    for (int off = 1; off < TPP; off <<= 1) { /* no best is NaN; max is exact and order-free */
        const float o = __shfl_xor_sync(__activemask(), best, off);
        if (o > best) best = o;
    }
    if (part == 0) p.scores[(int64_t)row * p.max_pages + j] = best;
}

/* inclusive block scan of v over kTopkThreads threads (sWarp: 32 ints); returns the inclusive sum, total
 * through *total */
__device__ __forceinline__ int block_scan(int v, int *sWarp, int *total) {
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    int x = v;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, off);
        if (lane >= off) x += y;
    }
    if (lane == 31) sWarp[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = sWarp[lane];
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, w, off);
            if (lane >= off) w += y;
        }
        sWarp[lane] = w; /* inclusive over warps */
    }
    __syncthreads();
    const int res = x + (warp ? sWarp[warp - 1] : 0);
    *total = sWarp[31];
    __syncthreads(); /* sWarp reused by the next call */
    return res;
}

__global__ void __launch_bounds__(kTopkThreads) quest_topk_kernel(const QParams p) {
    osp_pdl_begin();
    __shared__ int sHist[256];
    __shared__ int sWarp[32];
    __shared__ int sDigit, sAbove;
    const int row = (int)blockIdx.x, t = row / p.n_head_kv, tid = (int)threadIdx.x;
    const int n_ctx = p.positions[t] / p.block_size + 1;
    int32_t *out = p.pages_out + (int64_t)row * p.topk;
    if (n_ctx <= p.topk) { /* the budget covers the context: every page */
        for (int j = tid; j < n_ctx; j += kTopkThreads) out[j] = j;
        if (tid == 0) p.counts[row] = n_ctx;
        return;
    }
    const int S = p.sink, R = p.recent, lo = S, hi = n_ctx - R; /* candidates [lo, hi) */
    const int k = p.topk - S - R;
    const float *sc = p.scores + (int64_t)row * p.max_pages;
    /* the row's candidate scores read once into shared memory when they fit (the radix passes and the
     * final pass then read shared memory, not L2, five times) */
    extern __shared__ float sSc[];
    if (p.max_pages <= kTopkSmemPages) {
        for (int j = lo + tid; j < hi; j += kTopkThreads) sSc[j] = sc[j];
        __syncthreads();
        sc = sSc;
    }
    /* radix select: prefix / mask of the k-th largest key, krem = how many of the keys equal to it to keep */
    uint32_t prefix = 0u, mask = 0u;
    int krem = k;
    if (k > 0) {
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int i = tid; i < 256; i += kTopkThreads) sHist[i] = 0;
            __syncthreads();
            for (int j = lo + tid; j < hi; j += kTopkThreads) {
                const uint32_t key = order_key(sc[j]);
                if ((key & mask) == prefix) atomicAdd(&sHist[(key >> shift) & 0xFFu], 1);
            }
            __syncthreads();
            if (tid < 32) { /* lane l: bins 8 l .. 8 l + 7; find d with count(> d) < krem <= count(>= d) */
                int loc[8], tot = 0;
#pragma unroll
                for (int b = 0; b < 8; b++) loc[b] = sHist[8 * tid + b], tot += loc[b];
                int suf = tot; /* bins >= 8 lane */
#pragma unroll
                for (int off = 1; off < 32; off <<= 1) {
                    const int y = __shfl_down_sync(0xffffffffu, suf, off);
                    if (tid + off < 32) suf += y;
                }
                const int above = suf - tot; /* bins >= 8 (lane + 1) */
                if (above < krem && krem <= suf) {
                    int acc = above;
                    for (int b = 7; b >= 0; b--) {
                        if (acc + loc[b] >= krem) {
                            sDigit = 8 * tid + b, sAbove = acc;
                            break;
                        }
                        acc += loc[b];
                    }
                }
            }
            __syncthreads();
            prefix |= (uint32_t)sDigit << shift;
            mask |= 0xFFu << shift;
            krem -= sAbove;
            __syncthreads(); /* sDigit / sAbove read by all before the next pass writes them */
        }
    }
    /* one pass in page order: keep sinks, recent pages, keys above the threshold, and the first krem
     * pages equal to it */
    int eq_run = 0, out_run = 0;
    for (int j0 = 0; j0 < n_ctx; j0 += kTopkThreads) {
        const int j = j0 + tid;
        bool gt = false, eq = false;
        if (j >= lo && j < hi && k > 0) {
            const uint32_t key = order_key(sc[j]);
            gt = key > prefix, eq = key == prefix;
        }
        int eq_tot;
        const int eq_incl = block_scan(eq ? 1 : 0, sWarp, &eq_tot);
        const bool keep_eq = eq && eq_run + eq_incl - 1 < krem;
        const bool sel = j < n_ctx && (j < S || (j >= hi) || gt || keep_eq);
        int sel_tot;
        const int sel_incl = block_scan(sel ? 1 : 0, sWarp, &sel_tot);
        if (sel) out[out_run + sel_incl - 1] = j;
        eq_run += eq_tot, out_run += sel_tot;
    }
    if (tid == 0) p.counts[row] = out_run;
}


/* ---- Quest's pages -> the work table (osp_cuda_quest_table) ---- */

/* indptr: the exclusive prefix sums of counts over rows, one CTA */
__global__ void __launch_bounds__(kTopkThreads) quest_indptr_kernel(const int32_t *counts, int32_t *indptr, int rows) {
    osp_pdl_begin();
    __shared__ int sWarp[32];
    int run = 0;
    for (int r0 = 0; r0 < rows; r0 += kTopkThreads) {
        const int r = r0 + (int)threadIdx.x;
        int tot;
        const int incl = block_scan(r < rows ? counts[r] : 0, sWarp, &tot);
        if (r < rows) indptr[r + 1] = run + incl;
        run += tot;
    }
    if (threadIdx.x == 0) indptr[0] = 0;
}

struct TParams {
    const int32_t *sel, *counts, *positions, *token_seq, *seq_lens, *block_table, *indptr;
    int32_t *indices, *pages, *flags;
    uint32_t *tmask;
    int topk, max_blocks, block_size, n_head_kv, mask_words;
};

/* a CTA per row: entry i is selected page j; tmask the positions j bs + o <= min(p, seq_len - 1); FULL
 * when the whole page lies below both (osp_sparse_wt_build's classification under the causal mask) */
__global__ void __launch_bounds__(128) quest_fill_kernel(const TParams p) {
    osp_pdl_begin();
    const int r = (int)blockIdx.x, t = r / p.n_head_kv;
    const int s = p.token_seq[t], pos = p.positions[t], sl = p.seq_lens[s];
    const int hi = min(pos, sl - 1), n = p.counts[r], e0 = p.indptr[r];
    for (int i = (int)threadIdx.x; i < n; i += (int)blockDim.x) {
        const int j = p.sel[(int64_t)r * p.topk + i], k0 = j * p.block_size, e = e0 + i;
        p.indices[e] = j;
        p.pages[e] = p.block_table[(int64_t)s * p.max_blocks + j];
        p.flags[e] = k0 + p.block_size <= sl && k0 + p.block_size - 1 <= hi ? 1 /* OSP_WT_FULL */ : 0;
        for (int w = 0; w < p.mask_words; w++) {
            const int lim = hi - k0 - 32 * w + 1; /* bits [0, lim) of this word */
            const int nb = min(32, p.block_size - 32 * w);
            const int b = min(lim, nb);
            p.tmask[(int64_t)e * p.mask_words + w] = b <= 0 ? 0u : b >= 32 ? 0xffffffffu : (1u << b) - 1u;
        }
    }
}

} // namespace

template <typename TS, int PPC> size_t score_smem(int grp, int D) {
    return (size_t)grp * (size_t)D * sizeof(float) + (size_t)PPC * 2 * ((size_t)D * sizeof(TS) + 16);
}

template <typename TS, int PPC, int GRP> osp_status launch_grp(const QParams &prm, int64_t rows, cudaStream_t st) {
    constexpr int TPP = GRP >= 2 ? 2 : 1; /* 2 threads a page where the heads split */
    const size_t smem = score_smem<TS, PPC>(prm.grp, prm.D);
    OSP_CUDA_TRY(cudaFuncSetAttribute(quest_score_kernel<TS, PPC, GRP, TPP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    osp_launch(quest_score_kernel<TS, PPC, GRP, TPP>, dim3((unsigned)((prm.max_pages + PPC - 1) / PPC), (unsigned)rows), PPC * TPP,
               smem, st, prm);
    OSP_CUDA_LAUNCH_CHECK("quest_score_kernel");
    return OSP_OK;
}
/* groups of 4 and 8 query heads (Llama 3 8B / 70B, Qwen2.5 7B) with the heads unrolled; others generic */
template <typename TS, int PPC> osp_status launch_ppc(const QParams &prm, int64_t rows, cudaStream_t st) {
    if (prm.grp == 4) return launch_grp<TS, PPC, 4>(prm, rows, st);
    if (prm.grp == 8) return launch_grp<TS, PPC, 8>(prm, rows, st);
    return launch_grp<TS, PPC, 0>(prm, rows, st);
}

/* the score kernel with the most pages a CTA (64, 32, 16) whose shared memory fits 200 KiB;
 * OSPREY_QUEST_PPC=16 / 32 forces one where it fits (benchmarks; no score depends on it; 128 measured no
 * faster than 64 on the H100) */
template <typename TS> osp_status launch_score(const QParams &prm, int64_t rows, cudaStream_t st) {
    static int forced = -1;
    if (forced < 0) {
        const char *e = getenv("OSPREY_QUEST_PPC");
        forced = e ? atoi(e) : 0;
    }
    const size_t lim = 200 * 1024;
    if (forced == 32 && score_smem<TS, 32>(prm.grp, prm.D) <= lim) return launch_ppc<TS, 32>(prm, rows, st);
    if (forced == 16) return launch_ppc<TS, 16>(prm, rows, st);
    if (score_smem<TS, 64>(prm.grp, prm.D) <= lim) return launch_ppc<TS, 64>(prm, rows, st);
    if (score_smem<TS, 32>(prm.grp, prm.D) <= lim) return launch_ppc<TS, 32>(prm, rows, st);
    return launch_ppc<TS, 16>(prm, rows, st);
}

extern "C" osp_status osp_cuda_quest_select(const void *d_kmin, const void *d_kmax, osp_cuda_quest_summary summary,
                                            const uint16_t *d_q,
                                            const int32_t *d_positions, const int32_t *d_token_seq,
                                            const int32_t *d_block_table, int32_t max_blocks, int32_t block_size,
                                            int64_t T, int n_head, int n_head_kv, int D, int32_t topk, int32_t sink,
                                            int32_t recent, float *d_scores, int32_t *d_pages_out, int32_t *d_counts,
                                            void *stream) {
    if (!d_kmin || !d_kmax || !d_q || !d_positions || !d_token_seq || !d_block_table || !d_scores || !d_pages_out ||
        !d_counts)
        return osp_set_error(OSP_ERR_INVALID_ARG, "quest select: NULL argument");
    if (summary != OSP_CUDA_QUEST_F32 && summary != OSP_CUDA_QUEST_F16 && summary != OSP_CUDA_QUEST_BF16)
        return osp_set_error(OSP_ERR_INVALID_ARG, "quest select: summary type %d", (int)summary);
    const int es = summary == OSP_CUDA_QUEST_F32 ? 4 : 2;
    if (D < 4 || (D * es) % 16 || D > 1024 || n_head_kv < 1 || n_head % n_head_kv || n_head / n_head_kv > kMaxGroup)
        return osp_set_error(OSP_ERR_INVALID_ARG, "quest select: head_dim %d (a multiple of 4, of 8 with 16-bit summaries) or heads %d / %d", D, n_head,
                             n_head_kv);
    if (block_size < 1 || max_blocks < 1 || topk < 1 || sink < 0 || recent < 0 || sink + recent > topk)
        return osp_set_error(OSP_ERR_INVALID_ARG, "quest select: block %d, topk %d, sink %d, recent %d", block_size, topk,
                             sink, recent);
    if ((((uintptr_t)d_kmin) | ((uintptr_t)d_kmax)) & 15u)
        return osp_set_error(OSP_ERR_INVALID_ARG, "quest select: summaries must be 16-byte aligned");
    if (T <= 0) return OSP_OK;
    if (T * n_head_kv > 65535) return osp_set_error(OSP_ERR_INVALID_ARG, "quest select: %lld rows (at most 65,535)", (long long)(T * n_head_kv));
    QParams prm = {};
    prm.kmin = d_kmin, prm.kmax = d_kmax, prm.q = d_q, prm.positions = d_positions, prm.token_seq = d_token_seq;
    prm.block_table = d_block_table, prm.scores = d_scores, prm.pages_out = d_pages_out, prm.counts = d_counts;
    prm.max_blocks = max_blocks, prm.block_size = block_size, prm.n_head = n_head, prm.n_head_kv = n_head_kv, prm.D = D;
    prm.grp = n_head / n_head_kv, prm.topk = topk, prm.sink = sink, prm.recent = recent, prm.max_pages = max_blocks;
    const int64_t rows = T * n_head_kv;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const osp_status ss = summary == OSP_CUDA_QUEST_F32   ? launch_score<float>(prm, rows, st)
                          : summary == OSP_CUDA_QUEST_F16 ? launch_score<__half>(prm, rows, st)
                                                          : launch_score<__nv_bfloat16>(prm, rows, st);
    if (ss != OSP_OK) return ss;
    const size_t tsm = max_blocks <= kTopkSmemPages ? (size_t)max_blocks * sizeof(float) : 0;
    if (tsm > 48 * 1024) OSP_CUDA_TRY(cudaFuncSetAttribute(quest_topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tsm));
    osp_launch(quest_topk_kernel, dim3((unsigned)rows), kTopkThreads, tsm, st, prm);
    OSP_CUDA_LAUNCH_CHECK("quest_topk_kernel");
    return OSP_OK;
}

extern "C" osp_status osp_cuda_quest_table(const int32_t *d_sel, const int32_t *d_counts, int32_t topk,
                                           const int32_t *d_positions, const int32_t *d_token_seq,
                                           const int32_t *d_seq_lens, const int32_t *d_block_table, int32_t max_blocks,
                                           int32_t block_size, int64_t T, int n_head_kv, int32_t *d_indptr,
                                           int32_t *d_indices, int32_t *d_pages, int32_t *d_flags, uint32_t *d_tmask,
                                           void *stream) {
    if (!d_sel || !d_counts || !d_positions || !d_token_seq || !d_seq_lens || !d_block_table || !d_indptr ||
        !d_indices || !d_pages || !d_flags || !d_tmask)
        return osp_set_error(OSP_ERR_INVALID_ARG, "quest table: NULL argument");
    if (topk < 1 || block_size < 1 || max_blocks < 1 || n_head_kv < 1 || T < 0 || T * n_head_kv > INT32_MAX / 2)
        return osp_set_error(OSP_ERR_INVALID_ARG, "quest table: topk %d, block %d, %lld x %d rows", topk, block_size,
                             (long long)T, n_head_kv);
    if (T == 0) return OSP_OK;
    const int rows = (int)(T * n_head_kv);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    osp_launch(quest_indptr_kernel, dim3(1), kTopkThreads, 0, st, d_counts, d_indptr, rows);
    OSP_CUDA_LAUNCH_CHECK("quest_indptr_kernel");
    TParams prm = {};
    prm.sel = d_sel, prm.counts = d_counts, prm.positions = d_positions, prm.token_seq = d_token_seq;
    prm.seq_lens = d_seq_lens, prm.block_table = d_block_table, prm.indptr = d_indptr;
    prm.indices = d_indices, prm.pages = d_pages, prm.flags = d_flags, prm.tmask = d_tmask;
    prm.topk = topk, prm.max_blocks = max_blocks, prm.block_size = block_size, prm.n_head_kv = n_head_kv;
    prm.mask_words = (block_size + 31) / 32;
    osp_launch(quest_fill_kernel, dim3((unsigned)rows), 128, 0, st, prm);
    OSP_CUDA_LAUNCH_CHECK("quest_fill_kernel");
    return OSP_OK;
}
