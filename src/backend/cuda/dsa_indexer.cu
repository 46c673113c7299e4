/* The DeepSeek Sparse Attention lightning indexer on the GPU, decode shapes (issue 15; DeepSeek-AI,
 * "DeepSeek-V3.2-Exp", 2025, §2.1 eq. 1): I(t, s) = sum_j w(t, j) ReLU(q_I(t, j) . k_I(s)) over the
 * FP8 E4M3 index-key pages (one fp32 scale a token), the exact top-k of each token's causal range under
 * the total order "score descending, then position ascending" (NaN as -inf), and the work table of the
 * selection for osp_cuda_sparse_attention_decode. The reference is src/sparse/dsa_indexer.c
 * (osp_dsa_select); contracts in cuda_ops.h (osp_cuda_dsa_score / _topk / _table).
 *
 * The kernels, each stage launched by its own function so a benchmark times them apart:
 *   dsa_score_wg_kernel  a CTA (one warpgroup) per (token, run of 64-key tiles): wgmma.m64n64k16 with the
 *                     tile's keys as A, their E4M3 codes loaded straight into registers and widened
 *                     exactly to f16 there, and q_I (bf16, exact in f16 in f16's range; heads beyond
 *                     n_heads zero) as B in swizzled shared memory; then per key sum_j w_j ReLU(dot_j)
 *                     over the lane's heads and the quad (a fixed order), times the key's scale (the
 *                     comment above the kernel has the dimension map that makes this work). The scores go
 *                     to d_scores; a 4,096-bin histogram of the top 12 bits of each score's
 *                     order-preserving key (shared memory, flushed by atomics) goes to d_hist for the top-k.
 *   dsa_topk_kernel   a CTA per token (1,024 threads): the bin of the k-th largest key from the histogram,
 *                     the keys of that bin gathered into shared memory (one pass over the scores), the low
 *                     20 bits by a radix select over them (3 passes in shared memory; a bin too big for
 *                     shared memory, e.g. many equal scores, is selected over the scores in global memory
 *                     instead), then one pass over the pages in order: every key above the k-th, the
 *                     first ones (lowest positions) equal to it, written ascending (d_idx), and each page
 *                     holding a selected token as one staged entry with its token bits.
 *   dsa_topk_cluster_kernel  the same selection by a cluster of 8 CTAs a token, each owning a slice of the
 *                     pages (radix histograms summed and slice offsets exchanged through distributed shared
 *                     memory): one SM's L2 bandwidth bounds the one-CTA kernel at 128k (two passes over
 *                     512 KB of scores). Four passes over its slice and 7 cluster barriers: ~32 us at 128k on
 *                     the H100 at batch 1 and 8 alike (latency, not bandwidth). OSPREY_DSA_TOPK=cluster8.
 *   dsa_topk_bitmap_kernel  the default: the same clusters and slices, one pass over the slice's scores
 *                     into a shared bitmap (bins above the k-th's: selected; the k-th's bin: candidates in
 *                     shared memory), every CTA the radix select over all 8 candidate lists gathered through
 *                     distributed shared memory, ties resolved from the lists' ranks, then positions and
 *                     entries from the bitmap alone: 2 cluster barriers and a split one. Falls back to the
 *                     cluster kernel's select for a k-th bin over 12,288 keys, and to the cluster kernel for
 *                     contexts over ~2.1M tokens (a slice's bitmap over 2^18 bits). OSPREY_DSA_TOPK=cta
 *                     selects the one-CTA kernel, =cluster8 the cluster kernel; the same bits from all three.
 *   dsa_table_kernel  a CTA per work-table row (token, head group): the token's staged entries copied to
 *                     its CSR place (indptr from the counts of the tokens before it), pages through the
 *                     block table, FULL when every slot of the page is selected.
 * The scores differ from the CPU's in rounding (tensor-core products and sums in another order), so the
 * indices equal the CPU's when the scores do (tests/gpu/test_gpu_dsa.c: exact on integer-valued inputs;
 * otherwise the GPU's selection is the exact top-k of its own scores, which are within a derived bound of
 * the CPU's). Every key's score is computed by the same instructions whatever its tile, CTA or batch, so a
 * sequence's selection is the same alone and in a batch. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/attention_mma.cuh" /* ldsm_x4, mma16816, smem_u32, e4m3x2_to_f16x2, clamp_f16_range */
#include "backend/cuda/cuda_ops.h"

#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

namespace osp_dsa {
namespace {

using namespace osp_attn;

constexpr int kBins = 4096;        /* top 12 bits of the order key */
constexpr int kTopkThreads = 1024;
constexpr int kCand = 12288;       /* keys of the k-th's bin held in shared memory (48 KB) */
constexpr int kMaxWords = 8;       /* block_size <= 256 */

/* order-preserving key: larger score, larger key; NaN as -inf; -0 as +0 */
__device__ __forceinline__ uint32_t order_key(float f) {
    if (f != f) f = -INFINITY;
    const uint32_t u = __float_as_uint(f == 0.0f ? 0.0f : f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct ScoreParams {
    const uint16_t *q;       /* [T, H, DI] bf16 */
    const float *w;          /* [T, H] */
    const uint8_t *codes;    /* [num_blocks, block_size, DI] */
    const float *scales;     /* [num_blocks, block_size] */
    const int32_t *positions, *token_seq, *block_table;
    float *scores;           /* [T, max_ctx] */
    uint32_t *hist;          /* [T, kBins] */
    int max_blocks, block_size, max_ctx, tiles_per_cta;
    int n_heads;             /* dsa_score_wg_kernel: index heads (<= 64; the rest of its 64 columns are zero) */
};

/* ---- the scoring kernel: wgmma, keys straight from global memory into A registers ----
 * A CTA is one warpgroup; per 64-key tile, warp w holds keys 16 w .. 16 w + 15 as the A operand of
 * wgmma.m64n64k16 (mma.m16n8k16's A fragment: lane (g, c4) rows g and g + 8) and q_I (the 64 index heads,
 * zero beyond n_heads) is B, K-major in 128-byte-swizzled shared memory, read by descriptor. The dot
 * product's dimension order is permuted so that a lane's A fragments of all DI / 16 k-steps are whole
 * 16-byte pieces of its two keys' codes: logical k = 16 kk + 8 hi + 2 c4 + e of k-step kk maps to the
 * byte 16 (c4 + 4 (kk / 4)) + 4 (kk mod 4) + 2 hi + e of the key (a bijection on [0, DI)); q_I is stored
 * under the same map, so every product q_j(d) k(d) is still summed once. A lane loads its 2 keys' DI / 4
 * bytes (16-byte loads; 4 lanes read a key's 64-byte half contiguously), converts E4M3 -> f16 in registers
 * (exact), and the next tile's loads are in flight during this one's products and sums. No shared memory
 * for the keys and no barrier in the loop. Per key: sum over the lane's 16 heads (ascending) of
 * w_j ReLU(dot_j), then the quad, times the key's scale: the same instructions for every key whatever its
 * tile, CTA or batch. (An mma.sync kernel with the keys widened into shared memory came first: 131 vs 69 us
 * at batch 8, 128k, H100; bench/sparse/NOTES.md.) */
constexpr int kWgKeys = 64;

template <int DI>
__global__ void __launch_bounds__(128) dsa_score_wg_kernel(const ScoreParams p) {
    osp_pdl_begin();
    constexpr int KT = DI / 16, GROUPS = DI / 64;
    extern __shared__ uint4 wg_smem[];
    uint8_t *base = reinterpret_cast<uint8_t *>(wg_smem);
    base += (1024u - (smem_u32(base) & 1023u)) & 1023u;
    uint16_t *sQ = reinterpret_cast<uint16_t *>(base);                       /* [GROUPS][64 heads][64] f16, swizzled */
    uint32_t *sHist = reinterpret_cast<uint32_t *>(base + GROUPS * 8192);     /* [kBins] */

    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c4 = lane & 3;
    const int t = (int)blockIdx.y;
    const int n = min(p.positions[t] + 1, p.max_ctx); /* keys [0, n) */
    const int tile_lo = (int)blockIdx.x * p.tiles_per_cta;
    const int tile_hi = min(tile_lo + p.tiles_per_cta, (n + kWgKeys - 1) / kWgKeys);
    if (tile_lo >= tile_hi) return; /* uniform */
    const int s = p.token_seq[t];
    const int32_t *bt = p.block_table + (int64_t)s * p.max_blocks;
    const int H = p.n_heads;

    for (int i = tid; i < kBins; i += 128) sHist[i] = 0u;
    /* q_I: uint4 u = head h, physical dims 8 m .. 8 m + 7; each bf16 pair (2 hi + e, e = 0, 1) lands on
     * logical k = 16 kk + 8 hi + 2 cc + e with G = m / 8, cc = (m mod 8) / 2, kk = 4 G + 2 (m mod 2) + (pair / 2) */
    for (int u = tid; u < 64 * DI / 8; u += 128) {
        const int h = u / (DI / 8), m = u % (DI / 8);
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (h < H) v = __ldg(reinterpret_cast<const uint4 *>(p.q + ((int64_t)t * H + h) * DI) + m);
        const uint32_t in[4] = {v.x, v.y, v.z, v.w};
        const int G = m / 8, cc = (m % 8) / 2;
#pragma unroll
        for (int pr = 0; pr < 4; pr++) { /* physical dims 8 m + 2 pr, + 1 */
            const int kk = 4 * G + 2 * (m % 2) + pr / 2, hi = pr % 2;
            const int k = 16 * kk + 8 * hi + 2 * cc, kc = k % 64;
            const float lo = __uint_as_float(in[pr] << 16), hv = __uint_as_float(in[pr] & 0xffff0000u);
            const uint32_t off = (uint32_t)((k / 64) * 8192 + h * 128 + (((kc / 8) ^ (h % 8)) * 16) + (kc % 8) * 2);
            *reinterpret_cast<uint32_t *>(reinterpret_cast<uint8_t *>(sQ) + off) =
                pack_f16x2(clamp_f16_range(lo), clamp_f16_range(hv));
        }
    }
    /* the lane's 16 heads' weights: head 8 nt + 2 c4 + e */
    float wr[8][2];
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int h = 8 * nt + 2 * c4 + e;
            wr[nt][e] = h < H ? p.w[(int64_t)t * H + h] : 0.0f;
        }
    fence_proxy_async(); /* sQ's generic-proxy stores, visible to wgmma */
    __syncthreads();

    uint4 raw[2][GROUPS];
    float rs[2];
    auto load = [&](int tile) { /* rows g, g + 8 of this warp's 16 keys: bytes 16 (c4 + 4 G) .. + 15 */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int pos = tile * kWgKeys + 16 * warp + 8 * r + g;
            rs[r] = 0.0f;
#pragma unroll
            for (int G = 0; G < GROUPS; G++) raw[r][G] = make_uint4(0u, 0u, 0u, 0u);
            if (pos < n) {
                const int64_t row = (int64_t)bt[pos / p.block_size] * p.block_size + pos % p.block_size;
                const uint4 *src = reinterpret_cast<const uint4 *>(p.codes + row * DI);
#pragma unroll
                for (int G = 0; G < GROUPS; G++) raw[r][G] = __ldg(src + c4 + 4 * G);
                rs[r] = __ldg(p.scales + row);
            }
        }
    };
    load(tile_lo);
    const uint32_t sQ_u = smem_u32(sQ);
    float *out = p.scores + (int64_t)t * p.max_ctx;

    for (int tile = tile_lo; tile < tile_hi; tile++) {
        uint32_t a[KT][4];
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
            const int G = kk / 4, wd = kk % 4;
            const uint32_t w0 = wd == 0 ? raw[0][G].x : wd == 1 ? raw[0][G].y : wd == 2 ? raw[0][G].z : raw[0][G].w;
            const uint32_t w1 = wd == 0 ? raw[1][G].x : wd == 1 ? raw[1][G].y : wd == 2 ? raw[1][G].z : raw[1][G].w;
            a[kk][0] = e4m3x2_to_f16x2(w0), a[kk][1] = e4m3x2_to_f16x2(w1);
            a[kk][2] = e4m3x2_to_f16x2(w0 >> 16), a[kk][3] = e4m3x2_to_f16x2(w1 >> 16);
        }
        const float sc0 = rs[0], sc1 = rs[1];
        if (tile + 1 < tile_hi) load(tile + 1); /* in flight during the products */

        float acc[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
        wg_fence_operands(acc);
        wg_fence_operands(a);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < KT; kk++)
            wgmma_m64n64<0>(acc, a[kk], wg_desc(sQ_u + (uint32_t)((kk / 4) * 8192 + (kk % 4) * 32), 16, 1024), kk > 0);
        wg_commit();
        wg_wait_all();
        wg_fence_operands(acc);
        wg_fence_operands(a);

#pragma unroll
        for (int r = 0; r < 2; r++) {
            float part = 0.0f;
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float d = acc[nt][2 * r + e];
                    part = __fmaf_rn(wr[nt][e], d > 0.0f ? d : 0.0f, part);
                }
            part = quad_sum(part);
            const int pos = tile * kWgKeys + 16 * warp + 8 * r + g;
            if (c4 == r && pos < n) {
                const float sc = __fmul_rn(part, r ? sc1 : sc0);
                out[pos] = sc;
                atomicAdd(&sHist[order_key(sc) >> 20], 1u);
            }
        }
    }
    __syncthreads(); /* every key of the CTA counted */
    uint32_t *gh = p.hist + (int64_t)t * kBins;
    for (int i = tid; i < kBins; i += 128)
        if (sHist[i]) atomicAdd(gh + i, sHist[i]);
}

/* inclusive scan of v over the CTA's kTopkThreads threads (sWarp: 32 ints); the total through *total */
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
        sWarp[lane] = w;
    }
    __syncthreads();
    const int res = x + (warp ? sWarp[warp - 1] : 0);
    *total = sWarp[31];
    __syncthreads();
    return res;
}

/* the bin walk both digit finders end in: the thread or lane that owns bins b0 .. b0 + n - 1, with
 * count(bins >= b0 + n) = above and count(bins >= b0) = ge, writes the digit d of its range with
 * count(> d) < krem <= count(>= d) to sRes[0] and count(> d) to sRes[1], if d is in its range */
__device__ __forceinline__ void walk_bins(const uint32_t *h, int b0, int n, int above, int ge, int krem, int *sRes) {
    if (above >= krem || krem > ge) return;
    int acc = above;
    for (int b = n - 1; b >= 0; b--) {
        if (acc + (int)h[b0 + b] >= krem) {
            sRes[0] = b0 + b, sRes[1] = acc;
            return;
        }
        acc += (int)h[b0 + b];
    }
}

/* the digit d of a histogram h [nbins] (nbins a power of two, <= 4 kTopkThreads) with count(> d) < krem <=
 * count(>= d), for 1 <= krem <= count(all): sRes[0] = d, sRes[1] = count(> d) */
__device__ __forceinline__ void find_digit(const uint32_t *h, int nbins, int krem, int *sWarp, int *sRes) {
    const int tid = (int)threadIdx.x;
    const int bpt = nbins > kTopkThreads ? nbins / kTopkThreads : 1, b0 = tid * bpt;
    int loc = 0;
    if (b0 < nbins)
        for (int b = 0; b < bpt; b++) loc += (int)h[b0 + b];
    int tot;
    const int incl = block_scan(loc, sWarp, &tot);
    const int ge = tot - (incl - loc), above = ge - loc; /* counts of bins >= b0 and >= b0 + bpt */
    if (b0 < nbins) walk_bins(h, b0, bpt, above, ge, krem, sRes);
    __syncthreads();
}

/* key appended to cand[] (at most kCand kept) when take: one shared-memory atomic a warp, not a lane (the
 * k-th's bin can hold thousands of a slice's keys: a lane an atomic on one counter serializes them). Every
 * lane of the warp calls it. The slots' order is not the keys' order; only counts are read from cand. */
__device__ __forceinline__ void append_cand(bool take, uint32_t key, int *cnt, uint32_t *cand) {
    const unsigned m = __ballot_sync(0xffffffffu, take);
    if (!m) return;
    const int lane = (int)threadIdx.x & 31, leader = __ffs((int)m) - 1;
    int slot = 0;
    if (lane == leader) slot = atomicAdd(cnt, __popc(m));
    slot = __shfl_sync(0xffffffffu, slot, leader) + __popc(m & ((1u << lane) - 1u));
    if (take && slot < kCand) cand[slot] = key;
}

struct TopkParams {
    const float *scores;      /* [T, max_ctx] */
    const uint32_t *hist;     /* [T, kBins] */
    const int32_t *positions;
    int32_t *idx, *count;     /* [T, K], [T] */
    int32_t *ent_j, *ent_n;   /* [T, K], [T] */
    uint32_t *ent_mask;       /* [T, K, W] */
    int max_ctx, K, block_size, W;
    int bm_words;             /* dsa_topk_bitmap_kernel: a slice's bitmap words at most (max_ctx's slice) */
};

/* One page's selected positions (the set bits of gt, W words) into idx from index o in ascending order,
 * and the page as work-table entry e: its logical index j in ej, its bitmask in em. Both top-k kernels. */
__device__ __forceinline__ void emit_page(const uint32_t (&gt)[kMaxWords], int W, int k0, int j, int o, int e,
                                          int32_t *idx, int32_t *ej, uint32_t *em) {
#pragma unroll
    for (int w = 0; w < kMaxWords; w++) {
        uint32_t b = gt[w];
        while (b) {
            const int i = __ffs(b) - 1;
            b &= b - 1u;
            idx[o++] = k0 + 32 * w + i;
        }
    }
    ej[e] = j;
#pragma unroll
    for (int w = 0; w < kMaxWords; w++)
        if (w < W) em[(int64_t)e * W + w] = gt[w];
}

__global__ void __launch_bounds__(kTopkThreads) dsa_topk_kernel(const TopkParams p) {
    osp_pdl_begin();
    __shared__ uint32_t sHist[kBins];
    extern __shared__ uint32_t sCand[]; /* [kCand] (dynamic: 48 KB) */
    __shared__ int sWarp[32], sRes[2], sCnt;
    const int tid = (int)threadIdx.x, t = (int)blockIdx.x;
    const int n = min(p.positions[t] + 1, p.max_ctx), K = p.K, bs = p.block_size, W = p.W;
    const float *sc = p.scores + (int64_t)t * p.max_ctx;
    const bool all = n <= K;
    uint32_t thr = 0u; /* the k-th key */
    int krem = 0;      /* keys equal to thr to keep (the lowest positions) */
    if (!all) {
        for (int i = tid; i < kBins; i += kTopkThreads) sHist[i] = p.hist[(int64_t)t * kBins + i];
        if (tid == 0) sCnt = 0;
        __syncthreads();
        find_digit(sHist, kBins, K, sWarp, sRes);
        const uint32_t b1 = (uint32_t)sRes[0];
        krem = K - sRes[1];
        const bool in_smem = (int)sHist[b1] <= kCand;
        __syncthreads(); /* sHist reused below */
        if (in_smem) {
            constexpr int U = 8; /* loads in flight a thread (one SM reads the token's n scores) */
            for (int i0 = 0; i0 < n; i0 += U * kTopkThreads) {
                float v[U];
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int i = i0 + u * kTopkThreads + tid;
                    v[u] = i < n ? sc[i] : 0.0f;
                }
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const uint32_t key = order_key(v[u]);
                    append_cand(i0 + u * kTopkThreads + tid < n && (key >> 20) == b1, key, &sCnt, sCand);
                }
            }
            __syncthreads();
        }
        const int nc = in_smem ? min(sCnt, kCand) : n;
        uint32_t prefix = b1 << 20, mask = 0xFFF00000u;
        const int shifts[3] = {12, 4, 0}, widths[3] = {8, 8, 4};
#pragma unroll
        for (int ps = 0; ps < 3; ps++) {
            const int shift = shifts[ps], nb = 1 << widths[ps];
            for (int i = tid; i < nb; i += kTopkThreads) sHist[i] = 0u;
            __syncthreads();
            for (int i = tid; i < nc; i += kTopkThreads) {
                const uint32_t key = in_smem ? sCand[i] : order_key(sc[i]);
                if ((key & mask) == prefix) atomicAdd(&sHist[(key >> shift) & (uint32_t)(nb - 1)], 1u);
            }
            __syncthreads();
            find_digit(sHist, nb, krem, sWarp, sRes);
            prefix |= (uint32_t)sRes[0] << shift;
            mask |= (uint32_t)(nb - 1) << shift;
            krem -= sRes[1];
            __syncthreads();
        }
        thr = prefix;
    }
    /* one pass over the pages in order: a thread a page */
    int32_t *idx = p.idx + (int64_t)t * K;
    int32_t *ej = p.ent_j + (int64_t)t * K;
    uint32_t *em = p.ent_mask + (int64_t)t * K * W;
    const int np = (n + bs - 1) / bs;
    int eq_run = 0, out_run = 0, ent_run = 0;
    for (int j0 = 0; j0 < np; j0 += kTopkThreads) {
        const int j = j0 + tid, k0 = j * bs, cnt = j < np ? min(bs, n - k0) : 0;
        uint32_t gt[kMaxWords], eq[kMaxWords];
        int eqc = 0;
#pragma unroll
        for (int w = 0; w < kMaxWords; w++) {
            gt[w] = eq[w] = 0u;
            if (32 * w < cnt) {
                const int m = min(32, cnt - 32 * w);
                if (all) {
                    gt[w] = m >= 32 ? 0xffffffffu : (1u << m) - 1u;
                } else {
                    float v[32]; /* the word's scores: independent loads, all in flight */
#pragma unroll
                    for (int b = 0; b < 32; b++) v[b] = b < m ? sc[k0 + 32 * w + b] : 0.0f;
#pragma unroll
                    for (int b = 0; b < 32; b++) {
                        const uint32_t key = order_key(v[b]);
                        gt[w] |= (b < m && key > thr ? 1u : 0u) << b;
                        eq[w] |= (b < m && key == thr ? 1u : 0u) << b;
                    }
                }
                eqc += __popc(eq[w]);
            }
        }
        int eq_tot;
        const int eq_incl = block_scan(eqc, sWarp, &eq_tot);
        int keep = krem - (eq_run + eq_incl - eqc); /* equal keys of this page still to keep, in position order */
        int selc = 0;
#pragma unroll
        for (int w = 0; w < kMaxWords; w++) {
            uint32_t e = eq[w];
            while (e) {
                const uint32_t low = e & (0u - e);
                if (keep > 0) gt[w] |= low, keep--;
                e ^= low;
            }
            selc += __popc(gt[w]);
        }
        int sel_tot, ent_tot;
        const int sel_incl = block_scan(selc, sWarp, &sel_tot);
        const int ent_incl = block_scan(selc > 0 ? 1 : 0, sWarp, &ent_tot);
        if (selc > 0) {
            emit_page(gt, W, k0, j, out_run + sel_incl - selc, ent_run + ent_incl - 1, idx, ej, em);
        }
        eq_run += eq_tot, out_run += sel_tot, ent_run += ent_tot;
    }
    for (int i = out_run + tid; i < K; i += kTopkThreads) idx[i] = -1;
    if (tid == 0) p.count[t] = out_run, p.ent_n[t] = ent_run;
}

/* ---- the top-k over a cluster of kCluster CTAs a token (OSPREY_DSA_TOPK=cluster8; the default is the
 * bitmap kernel below, which also runs this one's select for a token whose k-th bin is too big for its
 * shared memory; =cta: the kernel above). The same selection: each CTA owns a slice of the token's pages (ascending by rank); the radix
 * histograms are summed over the cluster through distributed shared memory, every CTA finds the same
 * digits; the emission runs per slice with the running counts (equal keys, positions, entries) of the
 * slices before it, exchanged the same way: three short passes over the slice instead of two over the
 * whole history on one SM. */
constexpr int kCluster = 8;

/* The selection over pages [pg_lo, pg_hi): keys > thr, and keys == thr while the equal keys before them
 * (from eq_run, in position order) number < krem. write: positions to idx from out_run, entries to ej / em
 * from ent_run; the slice's counts through *sel_n, *ent_n, *eq_n. */
__device__ __forceinline__ void emit_pages(const float *sc, int n, int bs, int W, bool all, uint32_t thr, int krem,
                                           int pg_lo, int pg_hi, bool write, int eq_run, int out_run, int ent_run,
                                           int32_t *idx, int32_t *ej, uint32_t *em, int *sWarp, int *sel_n,
                                           int *ent_n) {
    const int tid = (int)threadIdx.x;
    int sel_sum = 0, ent_sum = 0;
    for (int j0 = pg_lo; j0 < pg_hi; j0 += kTopkThreads) {
        const int j = j0 + tid, k0 = j * bs, cnt = j < pg_hi ? min(bs, n - k0) : 0;
        uint32_t gt[kMaxWords], eq[kMaxWords];
        int eqc = 0;
#pragma unroll
        for (int w = 0; w < kMaxWords; w++) {
            gt[w] = eq[w] = 0u;
            if (32 * w < cnt) {
                const int m = min(32, cnt - 32 * w);
                if (all) {
                    gt[w] = m >= 32 ? 0xffffffffu : (1u << m) - 1u;
                } else {
                    float v[32];
#pragma unroll
                    for (int b = 0; b < 32; b++) v[b] = b < m ? sc[k0 + 32 * w + b] : 0.0f;
#pragma unroll
                    for (int b = 0; b < 32; b++) {
                        const uint32_t key = order_key(v[b]);
                        gt[w] |= (b < m && key > thr ? 1u : 0u) << b;
                        eq[w] |= (b < m && key == thr ? 1u : 0u) << b;
                    }
                }
                eqc += __popc(eq[w]);
            }
        }
        int eq_tot;
        const int eq_incl = block_scan(eqc, sWarp, &eq_tot);
        int keep = krem - (eq_run + eq_incl - eqc);
        int selc = 0;
#pragma unroll
        for (int w = 0; w < kMaxWords; w++) {
            uint32_t e = eq[w];
            while (e) {
                const uint32_t low = e & (0u - e);
                if (keep > 0) gt[w] |= low, keep--;
                e ^= low;
            }
            selc += __popc(gt[w]);
        }
        int sel_tot, ent_tot;
        const int sel_incl = block_scan(selc, sWarp, &sel_tot);
        const int ent_incl = block_scan(selc > 0 ? 1 : 0, sWarp, &ent_tot);
        if (write && selc > 0) {
            emit_page(gt, W, k0, j, out_run + sel_incl - selc, ent_run + ent_incl - 1, idx, ej, em);
        }
        eq_run += eq_tot, out_run += sel_tot, ent_run += ent_tot, sel_sum += sel_tot, ent_sum += ent_tot;
    }
    *sel_n = sel_sum, *ent_n = ent_sum;
}

/* The cluster kernel's work for token blockIdx.y, over shared buffers the caller provides (the same
 * offsets in every CTA of the cluster): sHist [kBins], sPass [2][256] (this CTA's radix histogram, read by
 * the cluster; double-buffered), sWarp [32], sRes [2], sCnt, sBefore [3], sEx [3] (this slice's equal keys,
 * selected positions, entries; read by the cluster), sCand [kCand]. dsa_topk_cluster_kernel, and
 * dsa_topk_bitmap_kernel for a token whose k-th bin does not fit its shared memory. Every thread of the
 * cluster calls it (7 cluster barriers, the last one before it returns). */
__device__ __forceinline__ void cluster_topk_body(const TopkParams &p, uint32_t *sHist, uint32_t (*sPass)[256],
                                                  int *sWarp, int *sRes, int *sCnt_, int *sBefore, int *sEx,
                                                  uint32_t *sCand) {
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    int &sCnt = *sCnt_;
    const int tid = (int)threadIdx.x, t = (int)blockIdx.y, rank = (int)cl.block_rank();
    const int n = min(p.positions[t] + 1, p.max_ctx), K = p.K, bs = p.block_size, W = p.W;
    const float *sc = p.scores + (int64_t)t * p.max_ctx;
    const bool all = n <= K;
    const int np = (n + bs - 1) / bs, pp = (np + kCluster - 1) / kCluster;
    const int pg_lo = min(np, rank * pp), pg_hi = min(np, pg_lo + pp);
    const int x_lo = min(n, pg_lo * bs), x_hi = min(n, pg_hi * bs);
    uint32_t thr = 0u;
    int krem = 0;
    if (!all) {
        for (int i = tid; i < kBins; i += kTopkThreads) sHist[i] = p.hist[(int64_t)t * kBins + i];
        if (tid == 0) sCnt = 0;
        __syncthreads();
        find_digit(sHist, kBins, K, sWarp, sRes);
        const uint32_t b1 = (uint32_t)sRes[0];
        krem = K - sRes[1];
        const bool in_smem = (int)sHist[b1] <= kCand; /* the same in every CTA of the cluster */
        __syncthreads();
        if (in_smem) {
            constexpr int U = 8;
            for (int i0 = x_lo; i0 < x_hi; i0 += U * kTopkThreads) {
                float v[U];
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int i = i0 + u * kTopkThreads + tid;
                    v[u] = i < x_hi ? sc[i] : 0.0f;
                }
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const uint32_t key = order_key(v[u]);
                    append_cand(i0 + u * kTopkThreads + tid < x_hi && (key >> 20) == b1, key, &sCnt, sCand);
                }
            }
            __syncthreads();
        }
        const int nc = in_smem ? min(sCnt, kCand) : x_hi - x_lo;
        uint32_t prefix = b1 << 20, mask = 0xFFF00000u;
#pragma unroll
        for (int ps = 0; ps < 3; ps++) {
            const int shift = ps == 0 ? 12 : ps == 1 ? 4 : 0, nb = ps == 2 ? 16 : 256;
            uint32_t *mine = sPass[ps & 1];
            for (int i = tid; i < 256; i += kTopkThreads) mine[i] = 0u;
            __syncthreads();
            for (int i = tid; i < nc; i += kTopkThreads) {
                const uint32_t key = in_smem ? sCand[i] : order_key(sc[x_lo + i]);
                if ((key & mask) == prefix) atomicAdd(&mine[(key >> shift) & (uint32_t)(nb - 1)], 1u);
            }
            cl.sync(); /* every CTA's histogram of this pass is complete */
            if (tid < nb) {
                uint32_t sum = 0u;
                for (int q = 0; q < kCluster; q++) sum += cl.map_shared_rank(mine, q)[tid];
                sHist[tid] = sum;
            }
            __syncthreads();
            find_digit(sHist, nb, krem, sWarp, sRes);
            prefix |= (uint32_t)sRes[0] << shift;
            mask |= (uint32_t)(nb - 1) << shift;
            krem -= sRes[1];
            __syncthreads();
        }
        thr = prefix;
    }
    int32_t *idx = p.idx + (int64_t)t * K;
    int32_t *ej = p.ent_j + (int64_t)t * K;
    uint32_t *em = p.ent_mask + (int64_t)t * K * W;
    /* 1. this slice's equal keys, then the cluster's before it */
    int eq_slice = 0;
    if (!all) {
        int c = 0;
        constexpr int U = 8; /* loads in flight a thread */
        for (int i0 = x_lo; i0 < x_hi; i0 += U * kTopkThreads) {
            float v[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int i = i0 + u * kTopkThreads + tid;
                v[u] = i < x_hi ? sc[i] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < U; u++) c += i0 + u * kTopkThreads + tid < x_hi && order_key(v[u]) == thr;
        }
        block_scan(c, sWarp, &eq_slice);
    }
    if (tid == 0) sEx[0] = eq_slice;
    cl.sync();
    if (tid == 0) {
        int b = 0;
        for (int q = 0; q < rank; q++) b += *cl.map_shared_rank(&sEx[0], q);
        sBefore[0] = b;
    }
    __syncthreads();
    const int eq_before = sBefore[0];
    /* 2. this slice's selected positions and entries, then the cluster's before it */
    int sel_n, ent_n;
    emit_pages(sc, n, bs, W, all, thr, krem, pg_lo, pg_hi, false, eq_before, 0, 0, idx, ej, em, sWarp, &sel_n, &ent_n);
    if (tid == 0) sEx[1] = sel_n, sEx[2] = ent_n;
    cl.sync();
    if (tid == 0) {
        int a = 0, b = 0;
        for (int q = 0; q < rank; q++) a += *cl.map_shared_rank(&sEx[1], q), b += *cl.map_shared_rank(&sEx[2], q);
        sBefore[1] = a, sBefore[2] = b;
    }
    __syncthreads();
    const int out_before = sBefore[1], ent_before = sBefore[2];
    /* 3. write */
    emit_pages(sc, n, bs, W, all, thr, krem, pg_lo, pg_hi, true, eq_before, out_before, ent_before, idx, ej, em, sWarp,
               &sel_n, &ent_n);
    if (rank == kCluster - 1) {
        const int total = out_before + sel_n;
        for (int i = total + tid; i < K; i += kTopkThreads) idx[i] = -1;
        if (tid == 0) p.count[t] = total, p.ent_n[t] = ent_before + ent_n;
    }
    cl.sync(); /* no CTA leaves while another may still read its shared memory */
}

__global__ void __launch_bounds__(kTopkThreads) dsa_topk_cluster_kernel(const TopkParams p) {
    osp_pdl_begin();
    __shared__ uint32_t sHist[kBins];
    __shared__ uint32_t sPass[2][256];
    __shared__ int sWarp[32], sRes[2], sCnt, sBefore[3], sEx[3];
    extern __shared__ uint32_t sCand[]; /* [kCand] */
    cluster_topk_body(p, sHist, sPass, sWarp, sRes, &sCnt, sBefore, sEx, sCand);
}

/* ---- the default top-k: one pass over the scores, the selection as a bitmap (OSPREY_DSA_TOPK=cluster8: the
 * cluster kernel above; =cta: the one-CTA kernel). A cluster of kCluster CTAs a token, each owning the same
 * slice of pages as in dsa_topk_cluster_kernel, positions [x_lo, x_hi): bit i of its shared bitmap sSel is
 * position x_lo + i.
 *   1. one pass over the slice's scores (coalesced: a warp's load is 32 consecutive positions, one bitmap
 *      word by ballot; the first loads issued before the histogram is read): bin (top 12 bits of the key)
 *      above b1, the k-th largest key's bin, -> its bit set (selected for sure); bin b1 -> (key, position)
 *      appended to the slice's candidate list (warp-aggregated).
 *   2. cluster barrier; every CTA copies all kCluster candidate lists (distributed shared memory, by rank)
 *      into its own shared memory and finds the k-th key thr and krem (keys equal to it kept) by the radix
 *      select of the low 20 bits there (3 passes, CTA barriers only; every CTA the same digits); the last
 *      pass also counts the keys equal to thr in the lists of lower ranks (lower positions) and in its own.
 *   3. its own candidates above thr -> their bits; equal to thr -> their bits while the equal keys of lower
 *      ranks and positions number < krem (ties to the lowest positions): all, none, or (in at most one CTA)
 *      the lowest ones by a scan of an equal-key bitmap. The bitmap is now the slice's selection.
 *   4. from the bitmap alone: the slice's selected positions and pages (entries) -> a cluster barrier for
 *      the counts of the lower ranks -> idx ascending and the entries at their offsets; the last rank writes
 *      count / ent_n and the -1 tail. A CTA leaves only after every CTA has read the others' counts.
 * 1 pass over the scores (the cluster kernel: 4) and 2 full cluster barriers plus a split one (7). The same
 * selection, bit for bit. Fallbacks: n <= K (every position, no select); a token whose b1 bin holds more
 * than kCand keys (its candidates would not fit) runs cluster_topk_body (its global-memory select); a
 * max_ctx whose slice exceeds kBitmapMaxBits is launched as dsa_topk_cluster_kernel by the host. */
constexpr int kBitmapMaxBits = 1 << 18; /* a slice's positions at most (2 bitmaps of 32 KB; ~2.1M-token contexts) */
constexpr int kPassU = 16;              /* bitmap words (32 positions each) a warp has in flight in the pass */

/* (key, pos) appended to keys / poss when take (at most kCand kept), warp-aggregated as append_cand; every
 * lane of the warp calls it */
__device__ __forceinline__ void append_cand_pos(bool take, uint32_t key, uint32_t pos, int *cnt, uint32_t *keys,
                                                uint32_t *poss) {
    const unsigned m = __ballot_sync(0xffffffffu, take);
    if (!m) return;
    const int lane = (int)threadIdx.x & 31, leader = __ffs((int)m) - 1;
    int slot = 0;
    if (lane == leader) slot = atomicAdd(cnt, __popc(m));
    slot = __shfl_sync(0xffffffffu, slot, leader) + __popc(m & ((1u << lane) - 1u));
    if (take && slot < kCand) keys[slot] = key, poss[slot] = pos;
}

/* find_digit by one warp for nb <= 256 bins (nb a power of two): sRes[0] = d, sRes[1] = count(> d) with
 * count(> d) < krem <= count(>= d); every lane of the warp calls it; no barrier */
__device__ __forceinline__ void warp_find_digit(const uint32_t *h, int nb, int krem, int *sRes) {
    const int lane = (int)threadIdx.x & 31;
    const int bpl = nb >= 32 ? nb / 32 : 1, b0 = lane * bpl;
    int loc = 0;
    if (b0 < nb)
        for (int b = 0; b < bpl; b++) loc += (int)h[b0 + b];
    int ge = loc; /* bins >= b0: a suffix sum over the lanes */
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int y = __shfl_down_sync(0xffffffffu, ge, off);
        if (lane + off < 32) ge += y;
    }
    if (b0 < nb) walk_bins(h, b0, bpl, ge - loc, ge, krem, sRes);
}

/* inclusive scan of the pair (a, b) over the CTA (sWarp: 64 ints); the totals through *total */
__device__ __forceinline__ int2 block_scan2(int a, int b, int *sWarp, int2 *total) {
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int ya = __shfl_up_sync(0xffffffffu, a, off), yb = __shfl_up_sync(0xffffffffu, b, off);
        if (lane >= off) a += ya, b += yb;
    }
    if (lane == 31) sWarp[warp] = a, sWarp[32 + warp] = b;
    __syncthreads();
    if (warp == 0) {
        int wa = sWarp[lane], wb = sWarp[32 + lane];
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int ya = __shfl_up_sync(0xffffffffu, wa, off), yb = __shfl_up_sync(0xffffffffu, wb, off);
            if (lane >= off) wa += ya, wb += yb;
        }
        sWarp[lane] = wa, sWarp[32 + lane] = wb;
    }
    __syncthreads();
    const int2 res = make_int2(a + (warp ? sWarp[warp - 1] : 0), b + (warp ? sWarp[32 + warp - 1] : 0));
    *total = make_int2(sWarp[31], sWarp[63]);
    __syncthreads();
    return res;
}

/* the page's bits [o, o + cnt) of the bitmap bm as W words (cnt <= 32 kMaxWords; the word after the bit
 * o + cnt - 1 exists: a slice's bitmap has one word of padding) */
__device__ __forceinline__ void page_bits(const uint32_t *bm, int o, int cnt, uint32_t (&gt)[kMaxWords]) {
#pragma unroll
    for (int w = 0; w < kMaxWords; w++) {
        gt[w] = 0u;
        if (32 * w < cnt) {
            const int b = o + 32 * w, wi = b >> 5, sh = b & 31, m = min(32, cnt - 32 * w);
            uint32_t x = bm[wi] >> sh;
            if (sh) x |= bm[wi + 1] << (32 - sh);
            gt[w] = m >= 32 ? x : x & ((1u << m) - 1u);
        }
    }
}

__global__ void __launch_bounds__(kTopkThreads) dsa_topk_bitmap_kernel(const TopkParams p) {
    osp_pdl_begin();
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    extern __shared__ uint32_t bm_smem[];
    uint32_t *sHist = bm_smem;               /* [kBins] the token's histogram, then the radix passes' */
    uint32_t *sKeys = sHist + kBins;         /* [kCand] this slice's candidates (read by the cluster) */
    uint32_t *sPos = sKeys + kCand;          /* [kCand] their positions in the slice */
    uint32_t *sAll = sPos + kCand;           /* [kCand] the cluster's candidates, by rank */
    uint32_t *sSel = sAll + kCand;           /* [bm_words + 1] the slice's selection (bit i: position x_lo + i) */
    uint32_t *sEq = sSel + p.bm_words + 1;   /* [bm_words + 1] own candidates equal to the k-th (a partial keep) */
    __shared__ int sWarp[64], sRes[2], sCnt, sBefore[3], sEx[3]; /* sEx: read by the cluster */
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, t = (int)blockIdx.y;
    const int rank = (int)cl.block_rank();
    const int n = min(p.positions[t] + 1, p.max_ctx), K = p.K, bs = p.block_size, W = p.W;
    const float *sc = p.scores + (int64_t)t * p.max_ctx;
    const bool all = n <= K;
    const int np = (n + bs - 1) / bs, pp = (np + kCluster - 1) / kCluster;
    const int pg_lo = min(np, rank * pp), pg_hi = min(np, pg_lo + pp);
    const int x_lo = min(n, pg_lo * bs), x_hi = min(n, pg_hi * bs);
    const int L = x_hi - x_lo, nw = (L + 31) >> 5; /* the slice's positions, bitmap words */
    for (int i = tid; i <= nw; i += kTopkThreads) sEq[i] = 0u;
    if (tid == 0) sSel[nw] = 0u, sCnt = 0;

    /* the first round of the pass's loads, in flight while the histogram is read: warp w's words w, w + 32, .. */
    float v[kPassU];
    auto load = [&](int w0) {
#pragma unroll
        for (int u = 0; u < kPassU; u++) {
            const int i = 32 * (w0 + 32 * u) + lane;
            v[u] = i < L ? sc[x_lo + i] : 0.0f;
        }
    };
    load(warp);
    uint32_t b1 = 0u; /* the k-th key's bin */
    int krem = 0;     /* keys of bin b1, then of each digit's prefix, to keep */
    if (!all) {
        for (int i = tid; i < kBins; i += kTopkThreads) sHist[i] = p.hist[(int64_t)t * kBins + i];
        __syncthreads();
        find_digit(sHist, kBins, K, sWarp, sRes);
        b1 = (uint32_t)sRes[0];
        krem = K - sRes[1];
        if ((int)sHist[b1] > kCand) { /* the same in every CTA of the cluster: the cluster kernel's select */
            __syncthreads();          /* sHist and sRes read before the body rewrites them */
            cluster_topk_body(p, sHist, reinterpret_cast<uint32_t (*)[256]>(sPos), sWarp, sRes, &sCnt, sBefore, sEx,
                              sKeys);
            return;
        }
    }
    /* 1. the one pass */
    for (int w0 = warp; w0 < nw; w0 += 32 * kPassU) { /* warp-uniform */
        if (w0 != warp) load(w0);
#pragma unroll
        for (int u = 0; u < kPassU; u++) {
            const int w = w0 + 32 * u, i = 32 * w + lane;
            const bool in = i < L;
            const uint32_t key = order_key(v[u]), bin = key >> 20;
            const unsigned word = __ballot_sync(0xffffffffu, in && (all || bin > b1));
            if (lane == 0 && w < nw) sSel[w] = word;
            if (!all) append_cand_pos(in && bin == b1, key, (uint32_t)i, &sCnt, sKeys, sPos);
        }
    }
    if (!all) {
        cl.sync(); /* every slice's candidates complete */
        /* 2. the cluster's candidates, by rank, into sAll */
        const int cq = lane < kCluster ? min(*cl.map_shared_rank(&sCnt, lane), kCand) : 0;
        int incl = cq;
#pragma unroll
        for (int off = 1; off < kCluster; off <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += y;
        }
        int offs[kCluster + 1]; /* the ranks' first slots in sAll */
        offs[0] = 0;
#pragma unroll
        for (int q = 0; q < kCluster; q++) offs[q + 1] = __shfl_sync(0xffffffffu, incl, q);
        const int total = min(offs[kCluster], kCand);
        const int mine_lo = __shfl_sync(0xffffffffu, incl - cq, rank), mine_n = __shfl_sync(0xffffffffu, cq, rank);
        for (int i = tid; i < 544; i += kTopkThreads) sHist[i] = 0u; /* radix bins [2][256], below [16], mine [16] */
        constexpr int G = 4;
        for (int g0 = tid; g0 < total; g0 += G * kTopkThreads) {
            uint32_t kv[G];
#pragma unroll
            for (int u = 0; u < G; u++) {
                const int g = g0 + u * kTopkThreads;
                int q = 0, base = 0;
#pragma unroll
                for (int r = 1; r < kCluster; r++)
                    if (g >= offs[r]) q = r, base = offs[r];
                kv[u] = g < total ? cl.map_shared_rank(sKeys, q)[g - base] : 0u;
            }
#pragma unroll
            for (int u = 0; u < G; u++)
                if (g0 + u * kTopkThreads < total) sAll[g0 + u * kTopkThreads] = kv[u];
        }
        __syncthreads();
        /* the low 20 bits: 3 radix passes over sAll */
        uint32_t prefix = b1 << 20, mask = 0xFFF00000u;
        uint32_t *hb = sHist + 512, *hm = sHist + 528;
        int eq_before = 0, eq_here = 0;
#pragma unroll
        for (int ps = 0; ps < 3; ps++) {
            const int shift = ps == 0 ? 12 : ps == 1 ? 4 : 0, nb = ps == 2 ? 16 : 256;
            uint32_t *h = sHist + (ps & 1) * 256;
            if (ps == 1 && tid < 256) sHist[tid] = 0u; /* pass 0's bins, pass 2's (read before the last barrier) */
            for (int i = tid; i < total; i += kTopkThreads) {
                const uint32_t key = sAll[i];
                if ((key & mask) == prefix) {
                    const uint32_t d = (key >> shift) & (uint32_t)(nb - 1);
                    atomicAdd(&h[d], 1u);
                    if (ps == 2) {
                        if (i < mine_lo) atomicAdd(&hb[d], 1u);
                        else if (i < mine_lo + mine_n) atomicAdd(&hm[d], 1u);
                    }
                }
            }
            __syncthreads();
            if (warp == 0) warp_find_digit(h, nb, krem, sRes);
            __syncthreads();
            const uint32_t d = (uint32_t)sRes[0];
            prefix |= d << shift;
            mask |= (uint32_t)(nb - 1) << shift;
            krem -= sRes[1];
            if (ps == 2) eq_before = (int)hb[d], eq_here = (int)hm[d];
        }
        const uint32_t thr = prefix; /* the k-th key; krem of the keys equal to it kept, lowest positions first */
        /* 3. own candidates: above thr, and equal to it as the lower ranks leave room */
        const int keep = min(max(krem - eq_before, 0), eq_here);
        const bool partial = keep > 0 && keep < eq_here; /* CTA-uniform */
        for (int i = tid; i < mine_n; i += kTopkThreads) {
            const uint32_t key = sKeys[i], pos = sPos[i];
            if (key > thr || (key == thr && keep == eq_here)) atomicOr(&sSel[pos >> 5], 1u << (pos & 31));
            else if (key == thr && partial) atomicOr(&sEq[pos >> 5], 1u << (pos & 31));
        }
        if (partial) { /* the keep lowest positions of sEq: a thread a run of words, in order */
            __syncthreads();
            const int cpt = (nw + kTopkThreads - 1) / kTopkThreads, w_lo = min(nw, tid * cpt), w_hi = min(nw, w_lo + cpt);
            int c = 0;
            for (int w = w_lo; w < w_hi; w++) c += __popc(sEq[w]);
            int tot;
            const int incl_c = block_scan(c, sWarp, &tot);
            int left = keep - (incl_c - c);
            for (int w = w_lo; w < w_hi && left > 0; w++) {
                uint32_t e = sEq[w];
                if (__popc(e) <= left) {
                    left -= __popc(e);
                } else {
                    uint32_t take = 0u;
                    for (; left > 0; left--) take |= e & (0u - e), e &= e - 1u;
                    e = take;
                }
                sSel[w] |= e;
            }
        }
    }
    __syncthreads(); /* sSel final */
    /* 4. the slice's positions and entries: a thread a run of pages, in order */
    const int npg = pg_hi - pg_lo, ppt = (npg + kTopkThreads - 1) / kTopkThreads;
    const int j_lo = pg_lo + min(npg, tid * ppt), j_hi = pg_lo + min(npg, (tid + 1) * ppt);
    int selc = 0, entc = 0;
    for (int j = j_lo; j < j_hi; j++) {
        uint32_t gt[kMaxWords];
        page_bits(sSel, j * bs - x_lo, min(bs, n - j * bs), gt);
        int c = 0;
#pragma unroll
        for (int w = 0; w < kMaxWords; w++) c += __popc(gt[w]);
        selc += c, entc += c > 0;
    }
    int2 tot;
    const int2 incl = block_scan2(selc, entc, sWarp, &tot);
    if (tid == 0) sEx[0] = tot.x, sEx[1] = tot.y;
    cl.sync(); /* every slice's counts */
    int out_before = 0, ent_before = 0;
    if (lane < rank) out_before = *cl.map_shared_rank(&sEx[0], lane), ent_before = *cl.map_shared_rank(&sEx[1], lane);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        out_before += __shfl_xor_sync(0xffffffffu, out_before, off);
        ent_before += __shfl_xor_sync(0xffffffffu, ent_before, off);
    }
    __cluster_barrier_arrive(); /* this CTA reads no other's shared memory from here on */
    int32_t *idx = p.idx + (int64_t)t * K;
    int32_t *ej = p.ent_j + (int64_t)t * K;
    uint32_t *em = p.ent_mask + (int64_t)t * K * W;
    int o = out_before + incl.x - selc, e = ent_before + incl.y - entc;
    for (int j = j_lo; j < j_hi; j++) {
        uint32_t gt[kMaxWords];
        page_bits(sSel, j * bs - x_lo, min(bs, n - j * bs), gt);
        int c = 0;
#pragma unroll
        for (int w = 0; w < kMaxWords; w++) c += __popc(gt[w]);
        if (c > 0) {
            emit_page(gt, W, j * bs, j, o, e, idx, ej, em);
            o += c, e++;
        }
    }
    if (rank == kCluster - 1) {
        const int total = out_before + tot.x;
        for (int i = total + tid; i < K; i += kTopkThreads) idx[i] = -1;
        if (tid == 0) p.count[t] = total, p.ent_n[t] = ent_before + tot.y;
    }
    __cluster_barrier_wait(); /* no CTA leaves while another may still read its shared memory */
}

struct TableParams {
    const int32_t *ent_j, *ent_n, *token_seq, *block_table;
    const uint32_t *ent_mask;
    int32_t *indptr, *indices, *pages, *flags;
    uint32_t *tmask;
    int K, W, groups, max_blocks, block_size;
};

/* a CTA per row r = t * groups + g: the token's staged entries at their CSR place (1,024 threads: a row's
 * ~2,000 entries in two rounds of dependent loads, entry -> block table) */
constexpr int kTableThreads = 1024;
__global__ void __launch_bounds__(kTableThreads) dsa_table_kernel(const TableParams p) {
    osp_pdl_begin();
    __shared__ int sSum[kTableThreads / 32];
    const int r = (int)blockIdx.x, t = r / p.groups, g = r % p.groups, tid = (int)threadIdx.x;
    int part = 0;
    for (int i = tid; i < t; i += kTableThreads) part += p.ent_n[i];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
    if ((tid & 31) == 0) sSum[tid >> 5] = part;
    __syncthreads();
    int before = 0;
#pragma unroll
    for (int i = 0; i < kTableThreads / 32; i++) before += sSum[i];
    const int n = p.ent_n[t], e0 = p.groups * before + g * n;
    if (tid == 0) {
        p.indptr[r + 1] = e0 + n;
        if (r == 0) p.indptr[0] = 0;
    }
    const int s = p.token_seq[t];
    for (int i = tid; i < n; i += kTableThreads) {
        const int j = p.ent_j[(int64_t)t * p.K + i], e = e0 + i;
        p.indices[e] = j;
        p.pages[e] = p.block_table[(int64_t)s * p.max_blocks + j];
        bool full = true;
        for (int w = 0; w < p.W; w++) {
            const uint32_t m = p.ent_mask[((int64_t)t * p.K + i) * p.W + w];
            const int nb = min(32, p.block_size - 32 * w);
            full = full && m == (nb >= 32 ? 0xffffffffu : (1u << nb) - 1u);
            p.tmask[(int64_t)e * p.W + w] = m;
        }
        p.flags[e] = full ? 1 /* OSP_WT_FULL */ : 0;
    }
}

template <int DI> osp_status launch_score_wg(const ScoreParams &prm, dim3 grid, cudaStream_t st) {
    const int smem = (DI / 64) * 8192 + kBins * 4 + 1024; /* + 1 KiB: the swizzled q_I 1024-byte aligned */
    OSP_CUDA_TRY(cudaFuncSetAttribute(dsa_score_wg_kernel<DI>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    osp_launch(dsa_score_wg_kernel<DI>, grid, 128, (size_t)smem, st, prm);
    OSP_CUDA_LAUNCH_CHECK("dsa_score_wg_kernel");
    return OSP_OK;
}

} // namespace
} // namespace osp_dsa

using namespace osp_dsa;

extern "C" osp_status osp_cuda_dsa_score(const uint16_t *d_q, const float *d_w, const uint8_t *d_k_codes,
                                         const float *d_k_scales, const int32_t *d_positions, const int32_t *d_token_seq,
                                         const int32_t *d_block_table, int32_t max_blocks, int32_t block_size, int64_t T,
                                         int n_heads, int head_dim, int32_t max_ctx, float *d_scores, uint32_t *d_hist,
                                         void *stream) {
    if (!d_q || !d_w || !d_k_codes || !d_k_scales || !d_positions || !d_token_seq || !d_block_table || !d_scores || !d_hist)
        return osp_set_error(OSP_ERR_INVALID_ARG, "dsa score: NULL argument");
    if ((head_dim != 64 && head_dim != 128) || (n_heads != 16 && n_heads != 32 && n_heads != 64))
        return osp_set_error(OSP_ERR_INVALID_ARG, "dsa score: %d heads of %d (16 / 32 / 64 heads of 64 / 128)", n_heads,
                             head_dim);
    if (block_size < 1 || max_blocks < 1 || max_ctx < 1 || T < 0 || T > 65535)
        return osp_set_error(OSP_ERR_INVALID_ARG, "dsa score: block %d, %d blocks, max_ctx %d, T %lld", block_size,
                             max_blocks, max_ctx, (long long)T);
    if (((uintptr_t)d_q | (uintptr_t)d_k_codes) & 15u)
        return osp_set_error(OSP_ERR_INVALID_ARG, "dsa score: q and the key pages must be 16-byte aligned");
    if (T == 0) return OSP_OK;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    OSP_CUDA_TRY(cudaMemsetAsync(d_hist, 0, sizeof(uint32_t) * (size_t)T * kBins, st));
    ScoreParams prm = {};
    prm.q = d_q, prm.w = d_w, prm.codes = d_k_codes, prm.scales = d_k_scales, prm.positions = d_positions;
    prm.token_seq = d_token_seq, prm.block_table = d_block_table, prm.scores = d_scores, prm.hist = d_hist;
    prm.max_blocks = max_blocks, prm.block_size = block_size, prm.max_ctx = max_ctx;
    prm.n_heads = n_heads;
    static int sms = 0;
    if (!sms) {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && v > 0)
            sms = v;
        else sms = 132;
    }
    /* tiles a CTA: one wave of the CTAs an SM holds over the launch (a CTA's fixed cost, q_I and the
     * histogram, is paid once per run of tiles; no bit depends on it) */
    const int64_t tiles = (max_ctx + kWgKeys - 1) / kWgKeys, slots = 4 * (int64_t)sms;
    int64_t tpc = (tiles * T + slots - 1) / slots;
    tpc = tpc < 2 ? 2 : tpc > 128 ? 128 : tpc;
    prm.tiles_per_cta = (int)tpc;
    const dim3 grid((unsigned)((tiles + tpc - 1) / tpc), (unsigned)T);
    return head_dim == 128 ? launch_score_wg<128>(prm, grid, st) : launch_score_wg<64>(prm, grid, st);
}

extern "C" osp_status osp_cuda_dsa_topk(const float *d_scores, const uint32_t *d_hist, const int32_t *d_positions,
                                        int64_t T, int32_t max_ctx, int32_t top_k, int32_t block_size, int32_t *d_idx,
                                        int32_t *d_count, int32_t *d_ent_j, uint32_t *d_ent_mask, int32_t *d_ent_n,
                                        void *stream) {
    if (!d_scores || !d_hist || !d_positions || !d_idx || !d_count || !d_ent_j || !d_ent_mask || !d_ent_n)
        return osp_set_error(OSP_ERR_INVALID_ARG, "dsa top-k: NULL argument");
    if (top_k < 1 || max_ctx < 1 || block_size < 1 || block_size > 32 * kMaxWords || T < 0 || T > INT32_MAX / 2)
        return osp_set_error(OSP_ERR_INVALID_ARG, "dsa top-k: top_k %d, max_ctx %d, block %d (1 .. 256), T %lld", top_k,
                             max_ctx, block_size, (long long)T);
    if (T == 0) return OSP_OK;
    TopkParams prm = {};
    prm.scores = d_scores, prm.hist = d_hist, prm.positions = d_positions, prm.idx = d_idx, prm.count = d_count;
    prm.ent_j = d_ent_j, prm.ent_n = d_ent_n, prm.ent_mask = d_ent_mask;
    prm.max_ctx = max_ctx, prm.K = top_k, prm.block_size = block_size, prm.W = (block_size + 31) / 32;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    /* "cta": one CTA a token; "cluster8": the cluster kernel of 7 cluster barriers; else (unset, "bitmap") the
     * one-pass bitmap kernel, or the cluster kernel where max_ctx's slice is over kBitmapMaxBits */
    const char *v = getenv("OSPREY_DSA_TOPK");
    if (v && !strcmp(v, "cta")) {
        const int smem = kCand * (int)sizeof(uint32_t);
        OSP_CUDA_TRY(cudaFuncSetAttribute(dsa_topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        osp_launch(dsa_topk_kernel, dim3((unsigned)T), kTopkThreads, (size_t)smem, st, prm);
        OSP_CUDA_LAUNCH_CHECK("dsa_topk_kernel");
        return OSP_OK;
    }
    if (T > 65535) return osp_set_error(OSP_ERR_INVALID_ARG, "dsa top-k: T %lld (at most 65,535)", (long long)T);
    const int64_t pages = ((int64_t)max_ctx + block_size - 1) / block_size;
    const int64_t slice_bits = (pages + kCluster - 1) / kCluster * block_size; /* the longest slice's positions */
    const bool bitmap = !(v && !strcmp(v, "cluster8")) && slice_bits <= kBitmapMaxBits;
    void (*kernel)(TopkParams) = bitmap ? dsa_topk_bitmap_kernel : dsa_topk_cluster_kernel;
    int smem = kCand * (int)sizeof(uint32_t);
    if (bitmap) {
        prm.bm_words = (int)((slice_bits + 31) / 32);
        /* sHist, sKeys, sPos, sAll, two bitmaps: 160 KB + 8 (bm_words + 1) bytes (168 KB at 128k / 16) */
        smem = (kBins + 3 * kCand + 2 * (prm.bm_words + 1)) * (int)sizeof(uint32_t);
    }
    OSP_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kCluster, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(kCluster, (unsigned)T);
    cfg.blockDim = dim3(kTopkThreads);
    cfg.dynamicSmemBytes = (size_t)smem;
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = osp_cuda_pdl_enabled() ? 2 : 1;
    (void)cudaLaunchKernelEx(&cfg, kernel, prm);
    OSP_CUDA_LAUNCH_CHECK(bitmap ? "dsa_topk_bitmap_kernel" : "dsa_topk_cluster_kernel");
    return OSP_OK;
}

extern "C" osp_status osp_cuda_dsa_table(const int32_t *d_ent_j, const uint32_t *d_ent_mask, const int32_t *d_ent_n,
                                         int32_t top_k, const int32_t *d_token_seq, const int32_t *d_block_table,
                                         int32_t max_blocks, int32_t block_size, int64_t T, int groups,
                                         int32_t *d_indptr, int32_t *d_indices, int32_t *d_pages, int32_t *d_flags,
                                         uint32_t *d_tmask, void *stream) {
    if (!d_ent_j || !d_ent_mask || !d_ent_n || !d_token_seq || !d_block_table || !d_indptr || !d_indices || !d_pages ||
        !d_flags || !d_tmask)
        return osp_set_error(OSP_ERR_INVALID_ARG, "dsa table: NULL argument");
    if (top_k < 1 || block_size < 1 || block_size > 32 * kMaxWords || max_blocks < 1 || groups < 1 || T < 0 ||
        T * groups > INT32_MAX / 2)
        return osp_set_error(OSP_ERR_INVALID_ARG, "dsa table: top_k %d, block %d, %lld x %d rows", top_k, block_size,
                             (long long)T, groups);
    if (T == 0) return OSP_OK;
    TableParams prm = {};
    prm.ent_j = d_ent_j, prm.ent_n = d_ent_n, prm.token_seq = d_token_seq, prm.block_table = d_block_table;
    prm.ent_mask = d_ent_mask, prm.indptr = d_indptr, prm.indices = d_indices, prm.pages = d_pages, prm.flags = d_flags;
    prm.tmask = d_tmask, prm.K = top_k, prm.W = (block_size + 31) / 32, prm.groups = groups, prm.max_blocks = max_blocks;
    prm.block_size = block_size;
    osp_launch(dsa_table_kernel, dim3((unsigned)(T * groups)), kTableThreads, 0, static_cast<cudaStream_t>(stream), prm);
    OSP_CUDA_LAUNCH_CHECK("dsa_table_kernel");
    return OSP_OK;
}
