/* Block-sparse paged decode attention driven by a work table (issue 15; contract in cuda_ops.h,
 * osp_cuda_sparse_attention_decode; the reference is src/sparse/sparse_attention.c).
 *
 * Why this shape. A sparse decode row reads few keys, scattered: top-k pages (Quest) or single tokens
 * (the DSA indexer's 2,048 of 128k). Reading whole pages for a token-level selection reads ~8x the bytes
 * at 2,048 random tokens of 128k (1 - e^-0.25 = 22 % of the pages are touched), so the kernel gathers
 * the kept keys first and loads only their K / V rows (one row of a KV head: D f16, 16-byte copies):
 *
 *   1. gather: a CTA owns chunk c of row r, entries [c CH, (c + 1) CH) of the row (CH =
 *      osp_cuda_sparse_chunk_entries: a function of the row's own entry count, so a row's arithmetic is
 *      the same in every batch). Its threads evaluate each entry's kept slots (worktable.h's rule: SELF
 *      kv == p, FULL every kv < seq_len, partial tmask bit and kv < seq_len and the built-in mask), count
 *      them, scan the counts over the CTA, and write the chunk's kept physical rows (page * block_size +
 *      slot) in entry order, slot order within an entry, to shared memory: at most 1,024 keys a chunk.
 *   2. attend: the kept keys in 64-key tiles through a cp.async pipeline of 2 K/V tiles (2 .. 4 with
 *      OSPREY_SPARSE_STAGES, for benchmarks; no result bit depends on it) (rows past the
 *      kept count zero-filled, never read), the products of attention_dec.cu (v4) with the keys on the
 *      long side: S^T = K Q^T by mma.sync m16n8k16 (warp w: keys 16 w .. 16 w + 15 of the tile; Q^T's <= 16
 *      columns, the row's query heads, in registers), O^T += V^T P^T (warp w: dimensions
 *      [w D / 4, (w + 1) D / 4); V^T by ldmatrix.trans, P^T in f16 through shared memory). The lane and
 *      fragment mappings are v4's (checked there by a lane-level emulation and its bit tests).
 *      Online softmax in the log2 domain (scores times scale log2 e, ex2), per column: the tile's max
 *      over the 4 warps through shared memory; each thread keeps a running l over its own keys, summed
 *      over the CTA at the chunk's end.
 *   3. a row of one chunk writes out = O / L in bf16 (v at the query's position when nothing was kept);
 *      otherwise the chunk writes (m, l) and O to the workspace and merge_kernel folds the row's chunks
 *      in chunk order (FlashDecoding's log-sum-exp merge: Dao, Haziza, Massa, Sizov 2023).
 * The numerics follow v4 where they can (scores rounded as fp32 products of f16 operands, P in f16 for
 * the PV product, l in fp32 from the unrounded p), but a row's bits are not v2's / v4's (the key order
 * and the chunking differ): the test checks the dense equivalence within tolerance, not bit for bit. */
#include "backend/cuda/cuda_common.cuh" /* OSP_CUDA_LAUNCH_CHECK, OSP_CUDA_TRY, osp_launch, osp_pdl_begin */
#include "backend/cuda/attention_mma.cuh" /* ex2, cp_async16, ldsm_x4 / _t, mma16816, pack_f16x2, smem_u32 */
#include "backend/cuda/cuda_ops.h"

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

namespace osp_sparse_attn {
namespace {

using namespace osp_attn;

constexpr int kThreads = 128;     /* 4 warps */
constexpr int kKeys = 64;         /* keys a tile */
constexpr int kPS = kKeys + 8;    /* P^T's shared row stride, halves */
constexpr int kStagesDefault = 2; /* K/V tiles in flight (2 .. 4: OSPREY_SPARSE_STAGES; no bit changes): 2 measured
                                   * faster than 3 at batch 8 (70 KB of shared memory, 3 CTAs an SM; H100) */
constexpr int kMaxKeys = 1024;    /* kept keys a chunk at most (entries x block_size) */
constexpr int kTargetChunks = 8; /* a row is cut into at most this many chunks while chunks stay <= kMaxKeys
                                    * (4 .. 64: OSPREY_SPARSE_CHUNKS, for benchmarks; the chunking changes bits).
                                    * 8 measured faster than 16 (H100, 32k pages rows: batch 8 62.5 vs 67.8 us at
                                    * 256 pages, 22.9 vs 27.4 at 64; batch 1 the same or faster); 32, 64 slower */
constexpr int kMaxBlock = 256;
constexpr int kFull = 1, kSelf = 2; /* OSP_WT_FULL, OSP_WT_SELF (src/sparse/worktable.h) */
/* osp_mask_kind (src/sparse/block_mask.h) */
constexpr int kCausal = 0, kSliding = 1, kSinkWin = 2, kPrefixLm = 4;

__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t &r0, uint32_t &r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}

__host__ __device__ inline int floor_pow2(int x) {
    int p = 1;
    while (2 * p <= x) p *= 2;
    return p;
}
__host__ __device__ inline int chunk_entries_of(int n, int bs, int target) {
    const int cmax = floor_pow2(kMaxKeys / bs);
    int cmin = 1;
    while (cmin * bs < kKeys && cmin < cmax) cmin *= 2;
    const int want = (n + target - 1) / target;
    int ch = cmin;
    while (ch < want && ch < cmax) ch *= 2;
    return ch;
}
__host__ __device__ inline int chunks_of(int n, int bs, int target) {
    const int ch = chunk_entries_of(n, bs, target);
    return n <= 0 ? 1 : (n + ch - 1) / ch;
}

/* shared row stride of a staged K/V row, bytes (padded by 16: ldmatrix's 8 rows on distinct banks) */
constexpr int row_bytes_of(int D) { return 2 * D + 16; }
constexpr int smem_of(int D, int NQ, int kStages) {
    return kStages * 2 * kKeys * row_bytes_of(D) + 8 * NQ * kPS * 2 /* sP */ + 2 * 4 * 8 * NQ * 4 /* sMax, sL */ +
           kMaxKeys * 4 /* sSlot */ + 8 * 4 /* scan */;
}

struct SParams {
    const int32_t *indptr, *indices, *pages, *flags;
    const uint32_t *tmask;
    const uint16_t *q, *k_pages, *v_pages;
    uint16_t *out;
    const int32_t *positions, *token_seq, *seq_lens, *block_table;
    float *ws_acc;  /* [T, n_head, ws_stride, D] */
    float2 *ws_ml;  /* [T, n_head, ws_stride] */
    int ws_stride;  /* chunks a row in the workspace */
    int target_chunks; /* kTargetChunks or OSPREY_SPARSE_CHUNKS */
    int groups, mask_words, max_blocks, block_size, n_head, n_head_kv, grp;
    bool per_q_head;
    int mask_kind, window, sinks, prefix_len;
    float qscale; /* scale * log2(e) */
};

__device__ __forceinline__ bool builtin_keep(const SParams &p, int q, int kv) {
    switch (p.mask_kind) {
    case kSliding: return kv <= q && kv > q - p.window;
    case kSinkWin: return kv <= q && (kv < p.sinks || kv > q - p.window || kv == q);
    case kPrefixLm: return kv <= q || kv < p.prefix_len;
    default: return kv <= q;
    }
}

/* bits of word w of entry e that are kept (bit b: slot 32 w + b) */
__device__ __forceinline__ uint32_t kept_word(const SParams &p, int e, int w, int pos, int seq_len) {
    const int bs = p.block_size;
    const int base = p.indices[e] * bs + 32 * w; /* kv of bit 0 */
    const int f = p.flags[e];
    const int nb = min(32, bs - 32 * w);
    const int lim = min(nb, seq_len - base); /* bits [0, lim) lie in the entry and below seq_len */
    if (lim <= 0) return 0u;
    const uint32_t valid = lim >= 32 ? 0xffffffffu : ((1u << lim) - 1u);
    if (f & kSelf) {
        const int b = pos - base;
        return b >= 0 && b < lim ? 1u << b : 0u;
    }
    if (f & kFull) return valid;
    uint32_t bits = p.tmask[(int64_t)e * p.mask_words + w] & valid;
    uint32_t keep = 0u;
    while (bits) {
        const int b = __ffs(bits) - 1;
        bits &= bits - 1u;
        if (builtin_keep(p, pos, base + b)) keep |= 1u << b;
    }
    return keep;
}

/* the bf16 of v at the query's own position, for every row of the CTA (no kept key) */
__device__ __forceinline__ void write_self(const SParams &p, int t, int s, int pos, int kvh, int h0, int nh, int D,
                                           int tid) {
    const int64_t slot = (int64_t)p.block_table[(int64_t)s * p.max_blocks + pos / p.block_size] * p.block_size +
                         pos % p.block_size;
    const uint16_t *vrow = p.v_pages + (slot * p.n_head_kv + kvh) * D;
    for (int i = tid; i < nh * D; i += kThreads) {
        const int r = i / D, d = i % D;
        p.out[((int64_t)t * p.n_head + h0 + r) * D + d] = osp_f_to_bf16(osp_f16_to_f(vrow[d]));
    }
}

template <int D, int NQ, int kStages>
__global__ void __launch_bounds__(kThreads, 2) sparse_dec_kernel(const SParams p) {
    osp_pdl_begin();
    static_assert(D == 64 || D == 128, "head_dim");
    constexpr int R = 8 * NQ;     /* columns (query heads) a CTA */
    constexpr int KT = D / 16;    /* k-steps of S^T */
    constexpr int MB = D / 64;    /* O^T's 16-dimension blocks a warp */
    constexpr int RB = row_bytes_of(D);
    constexpr int TB = kKeys * RB;
    constexpr int LCPR = 2 * D / 16;              /* 16-byte pieces of a row */
    constexpr int RPP = kThreads / LCPR;          /* rows a pass */
    constexpr int LCPT = kKeys / RPP;             /* passes a tile */
    extern __shared__ uint4 sp_smem[];
    char *sKV = reinterpret_cast<char *>(sp_smem);                      /* [kStages][K, V][kKeys][RB] */
    uint16_t *sP = reinterpret_cast<uint16_t *>(sKV + kStages * 2 * TB); /* P^T [R][kPS] f16 */
    float *sMax = reinterpret_cast<float *>(sP + R * kPS);              /* [4 warps][R] */
    float *sL = sMax + 4 * R;                                           /* [4 warps][R] */
    int *sSlot = reinterpret_cast<int *>(sL + 4 * R);                   /* [kMaxKeys] kept physical rows */
    int *sScan = sSlot + kMaxKeys;                                      /* [8] */

    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, c4 = lane & 3;
    const int r = (int)blockIdx.x, c = (int)blockIdx.y;
    const int e_lo = p.indptr[r], n = p.indptr[r + 1] - e_lo;
    const int nch = chunks_of(n, p.block_size, p.target_chunks);
    if (c >= nch) return;
    const int CH = chunk_entries_of(n, p.block_size, p.target_chunks);
    const int eb = e_lo + c * CH, ee = min(eb + CH, e_lo + n);
    const int t = r / p.groups, grp_i = r % p.groups;
    const int h0 = p.per_q_head ? grp_i : grp_i * p.grp, nh = p.per_q_head ? 1 : p.grp;
    const int kvh = p.per_q_head ? grp_i / p.grp : grp_i;
    const int s = p.token_seq[t], pos = p.positions[t], seq_len = p.seq_lens[s];

    uint32_t qb[NQ][KT][2]; /* Q^T (B of S^T): column 8 nq + g is query head h0 + 8 nq + g;
                             * loaded first, its latency under the gather's */
#pragma unroll
    for (int nq = 0; nq < NQ; nq++) {
        const int col = 8 * nq + g;
        const bool ok = col < nh;
        const int64_t qrow = ok ? (int64_t)t * p.n_head + h0 + col : 0;
#pragma unroll
        for (int kk = 0; kk < KT; kk++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const uint32_t pair =
                    ok ? *reinterpret_cast<const uint32_t *>(p.q + qrow * D + 16 * kk + 2 * c4 + 8 * hf) : 0u;
                const float lo_f = __uint_as_float(pair << 16), hi_f = __uint_as_float(pair & 0xffff0000u);
                qb[nq][kk][hf] = pack_f16x2(clamp_f16_range(lo_f), clamp_f16_range(hi_f));
            }
    }

    /* ---- 1. gather the chunk's kept keys: thread tid owns entries [eb + tid per, eb + (tid + 1) per) ---- */
    const int ne = ee - eb, per = (ne + kThreads - 1) / kThreads;
    const int my_b = eb + min(ne, tid * per), my_e = eb + min(ne, (tid + 1) * per);
    int cnt = 0;
    for (int e = my_b; e < my_e; e++)
        for (int w = 0; w < p.mask_words; w++) cnt += __popc(kept_word(p, e, w, pos, seq_len));
    int incl = cnt; /* inclusive scan over the CTA */
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += y;
    }
    if (lane == 31) sScan[warp] = incl;
    __syncthreads();
    int warp_off = 0;
    for (int i = 0; i < warp; i++) warp_off += sScan[i];
    const int nkeys = sScan[0] + sScan[1] + sScan[2] + sScan[3];
    int o_at = warp_off + incl - cnt;
    for (int e = my_b; e < my_e; e++) {
        const int page_row = p.pages[e] * p.block_size;
        for (int w = 0; w < p.mask_words; w++) {
            uint32_t bits = kept_word(p, e, w, pos, seq_len);
            while (bits) {
                const int b = __ffs(bits) - 1;
                bits &= bits - 1u;
                sSlot[o_at++] = page_row + 32 * w + b;
            }
        }
    }
    __syncthreads();

    /* ---- 2. attend over the kept keys in 64-key tiles (Q^T loaded above) ---- */
    const int ntiles = (nkeys + kKeys - 1) / kKeys;
    const int64_t row_bytes_g = (int64_t)p.n_head_kv * 2 * D;
    const int part = tid % LCPR, jrow = tid / LCPR;
    const char *kbase = reinterpret_cast<const char *>(p.k_pages) + (int64_t)kvh * 2 * D + part * 16,
               *vbase = reinterpret_cast<const char *>(p.v_pages) + (int64_t)kvh * 2 * D + part * 16;
    const uint32_t s0 = smem_u32(sKV) + (uint32_t)(jrow * RB + part * 16);
    auto load_tile = [&](int tile, int st) {
#pragma unroll
        for (int u = 0; u < LCPT; u++) {
            const int key = tile * kKeys + jrow + u * RPP;
            const bool valid = key < nkeys;
            const int64_t off = valid ? (int64_t)sSlot[key] * row_bytes_g : 0;
            const uint32_t so = (uint32_t)(st * 2 * TB + u * RPP * RB);
            cp_async16(s0 + so, kbase + off, valid);
            cp_async16(s0 + so + TB, vbase + off, valid);
        }
    };
#pragma unroll
    for (int i = 0; i < kStages - 1; i++) {
        if (i < ntiles) load_tile(i, i);
        cp_async_commit();
    }

    /* ldmatrix lane addresses (v4's, f16 pages) */
    const uint32_t k_lane = (uint32_t)((16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8) * RB + (lane >> 4) * 16);
    const uint32_t v_lane =
        (uint32_t)(((lane & 7) + ((lane >> 4) << 3)) * RB + (warp * (D / 4) + ((lane >> 3) & 1) * 8) * 2);
    const uint32_t p_lane = smem_u32(sP) + (uint32_t)(((lane & 7) * kPS + ((lane >> 3) & 1) * 8) * 2);

    float m[NQ][2], lp[NQ][2]; /* per column 8 nq + 2 c4 + ci: running max (same in every thread of the
                                * column) and this thread's running sum over its own keys */
    float o[MB][NQ][4];
#pragma unroll
    for (int nq = 0; nq < NQ; nq++) {
        m[nq][0] = m[nq][1] = -INFINITY;
        lp[nq][0] = lp[nq][1] = 0.0f;
#pragma unroll
        for (int mb = 0; mb < MB; mb++) o[mb][nq][0] = o[mb][nq][1] = o[mb][nq][2] = o[mb][nq][3] = 0.0f;
    }

    for (int tile = 0; tile < ntiles; tile++) {
        const int st = tile % kStages;
        cp_async_wait<kStages - 2>();
        __syncthreads(); /* the tile landed; every warp is done with the stage refilled next, sP and sMax */
        if (tile + kStages - 1 < ntiles) load_tile(tile + kStages - 1, (tile + kStages - 1) % kStages);
        cp_async_commit();
        const uint32_t sk = smem_u32(sKV) + (uint32_t)(st * 2 * TB), sv = sk + (uint32_t)TB;

        /* S^T: keys 16 warp + g (elements 0, 1) and + 8 (2, 3), columns 8 nq + 2 c4 (+ 1) */
        float sc[NQ][4];
#pragma unroll
        for (int nq = 0; nq < NQ; nq++) sc[nq][0] = sc[nq][1] = sc[nq][2] = sc[nq][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
            uint32_t a[4];
            ldsm_x4(sk + k_lane + 32 * kk, a[0], a[1], a[2], a[3]);
#pragma unroll
            for (int nq = 0; nq < NQ; nq++) mma16816(sc[nq], a, qb[nq][kk][0], qb[nq][kk][1]);
        }
        const int key0 = tile * kKeys + 16 * warp + g;
#pragma unroll
        for (int nq = 0; nq < NQ; nq++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float sv_ = __fmul_rn(sc[nq][e], p.qscale);
                sc[nq][e] = key0 + 8 * (e >> 1) < nkeys ? sv_ : -INFINITY;
            }
        /* the warp's max of each column over its 16 keys, to shared memory */
#pragma unroll
        for (int nq = 0; nq < NQ; nq++)
#pragma unroll
            for (int ci = 0; ci < 2; ci++) {
                float v = fmaxf(sc[nq][ci], sc[nq][2 + ci]);
                v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
                v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
                v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
                if (g == 0) sMax[warp * R + 8 * nq + 2 * c4 + ci] = v;
            }
        __syncthreads();
        float alpha[NQ][2];
#pragma unroll
        for (int nq = 0; nq < NQ; nq++)
#pragma unroll
            for (int ci = 0; ci < 2; ci++) {
                const int col = 8 * nq + 2 * c4 + ci;
                const float tmax = fmaxf(fmaxf(sMax[col], sMax[R + col]), fmaxf(sMax[2 * R + col], sMax[3 * R + col]));
                const float m_new = fmaxf(m[nq][ci], tmax); /* finite: a tile holds >= 1 kept key */
                alpha[nq][ci] = ex2(m[nq][ci] - m_new);     /* ex2(-inf) = 0 on the first tile */
                m[nq][ci] = m_new;
                sc[nq][ci] = ex2(__fsub_rn(sc[nq][ci], m_new));
                sc[nq][2 + ci] = ex2(__fsub_rn(sc[nq][2 + ci], m_new));
                lp[nq][ci] = __fmaf_rn(lp[nq][ci], alpha[nq][ci], __fadd_rn(sc[nq][ci], sc[nq][2 + ci]));
            }
#pragma unroll
        for (int nq = 0; nq < NQ; nq++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                sP[(8 * nq + 2 * c4 + (e & 1)) * kPS + 16 * warp + g + 8 * (e >> 1)] =
                    __half_as_ushort(__float2half_rn(sc[nq][e]));
        __syncthreads();
        /* O^T = O^T alpha + V^T P^T over this warp's dimensions */
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
#pragma unroll
            for (int nq = 0; nq < NQ; nq++)
#pragma unroll
                for (int e = 0; e < 4; e++) o[mb][nq][e] = __fmul_rn(o[mb][nq][e], alpha[nq][e & 1]);
#pragma unroll
        for (int j = 0; j < kKeys / 16; j++) {
            uint32_t b[NQ][2];
#pragma unroll
            for (int nq = 0; nq < NQ; nq++)
                ldsm_x2(p_lane + (uint32_t)((8 * nq * kPS + 16 * j) * 2), b[nq][0], b[nq][1]);
#pragma unroll
            for (int mb = 0; mb < MB; mb++) {
                uint32_t a[4];
                ldsm_x4_t(sv + v_lane + (uint32_t)(16 * j * RB + 32 * mb), a[0], a[1], a[2], a[3]);
#pragma unroll
                for (int nq = 0; nq < NQ; nq++) mma16816(o[mb][nq], a, b[nq][0], b[nq][1]);
            }
        }
    }
    cp_async_wait<0>();

    /* ---- 3. the chunk's l per column: this thread's keys, then the warp's 8 key lanes, then 4 warps ---- */
#pragma unroll
    for (int nq = 0; nq < NQ; nq++)
#pragma unroll
        for (int ci = 0; ci < 2; ci++) {
            float v = lp[nq][ci];
            v += __shfl_xor_sync(0xffffffffu, v, 4);
            v += __shfl_xor_sync(0xffffffffu, v, 8);
            v += __shfl_xor_sync(0xffffffffu, v, 16);
            if (g == 0) sL[warp * R + 8 * nq + 2 * c4 + ci] = v;
        }
    __syncthreads();
    if (nch == 1 && nkeys == 0) { /* nothing kept in the whole row: v at the query's position */
        write_self(p, t, s, pos, kvh, h0, nh, D, tid);
        return;
    }
#pragma unroll
    for (int nq = 0; nq < NQ; nq++)
#pragma unroll
        for (int ci = 0; ci < 2; ci++) {
            const int col = 8 * nq + 2 * c4 + ci;
            if (col >= nh) continue;
            const float l = __fadd_rn(__fadd_rn(sL[col], sL[R + col]), __fadd_rn(sL[2 * R + col], sL[3 * R + col]));
            const int64_t orow = (int64_t)t * p.n_head + h0 + col;
            if (nch == 1) {
                const float inv = __fdiv_rn(1.0f, l);
                uint16_t *dst = p.out + orow * D;
#pragma unroll
                for (int mb = 0; mb < MB; mb++) {
                    const int d0 = warp * (D / 4) + 16 * mb + g;
                    dst[d0] = osp_f_to_bf16(__fmul_rn(o[mb][nq][ci], inv));
                    dst[d0 + 8] = osp_f_to_bf16(__fmul_rn(o[mb][nq][2 + ci], inv));
                }
            } else {
                if (warp == 0 && g == 0) p.ws_ml[orow * p.ws_stride + c] = make_float2(nkeys ? m[nq][ci] : -INFINITY, nkeys ? l : 0.0f);
                if (nkeys) {
                    float *dst = p.ws_acc + (orow * p.ws_stride + c) * D;
#pragma unroll
                    for (int mb = 0; mb < MB; mb++) {
                        const int d0 = warp * (D / 4) + 16 * mb + g;
                        dst[d0] = o[mb][nq][ci];
                        dst[d0 + 8] = o[mb][nq][2 + ci];
                    }
                }
            }
        }
}

/* Folds the chunk partials of each output row (t, h) whose row has more than one chunk, in chunk order:
 * CTA = one output row, thread d = dimension d. A row whose chunks kept nothing gets v at the query's
 * own position. */
template <int D> __global__ void __launch_bounds__(D) sparse_merge_kernel(const SParams p) {
    osp_pdl_begin();
    const int64_t orow = blockIdx.x;
    const int d = (int)threadIdx.x;
    const int t = (int)(orow / p.n_head), h = (int)(orow % p.n_head);
    const int grp_i = p.per_q_head ? h : h / p.grp;
    const int r = t * p.groups + grp_i;
    const int n = p.indptr[r + 1] - p.indptr[r];
    const int nch = chunks_of(n, p.block_size, p.target_chunks);
    if (nch <= 1) return; /* written by the chunk's CTA */
    const float2 *ml = p.ws_ml + orow * p.ws_stride;
    const float *acc = p.ws_acc + orow * p.ws_stride * D + d;
    float M = -INFINITY, L = 0.0f, A = 0.0f;
#pragma unroll 4
    for (int c = 0; c < nch; c++) {
        const float2 x = ml[c];
        if (!(x.y > 0.0f)) continue;
        const float a = acc[(int64_t)c * D];
        if (M == -INFINITY) {
            M = x.x, L = x.y, A = a;
            continue;
        }
        const float Mn = fmaxf(M, x.x);
        const float wA = ex2(M - Mn), wc = ex2(x.x - Mn);
        L = __fmaf_rn(L, wA, __fmul_rn(x.y, wc));
        A = __fmaf_rn(A, wA, __fmul_rn(a, wc));
        M = Mn;
    }
    if (L > 0.0f) {
        p.out[orow * D + d] = osp_f_to_bf16(__fmul_rn(A, __fdiv_rn(1.0f, L)));
        return;
    }
    const int s = p.token_seq[t], pos = p.positions[t];
    const int kvh = h / p.grp;
    const int64_t slot = (int64_t)p.block_table[(int64_t)s * p.max_blocks + pos / p.block_size] * p.block_size +
                         pos % p.block_size;
    p.out[orow * D + d] = osp_f_to_bf16(osp_f16_to_f(p.v_pages[(slot * p.n_head_kv + kvh) * D + d]));
}

template <int D, int NQ, int ST> osp_status launch_dec(const SParams &prm, dim3 grid, cudaStream_t st) {
    constexpr int smem = smem_of(D, NQ, ST);
    static_assert(smem <= 227 * 1024, "shared memory of one CTA");
    if (smem > 48 * 1024)
        OSP_CUDA_TRY(cudaFuncSetAttribute(sparse_dec_kernel<D, NQ, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    osp_launch(sparse_dec_kernel<D, NQ, ST>, grid, kThreads, smem, st, prm);
    OSP_CUDA_LAUNCH_CHECK("sparse_dec_kernel");
    return OSP_OK;
}

/* chunks a row at most: OSPREY_SPARSE_CHUNKS=4, 8, 16, 32 or 64 (read once), else kTargetChunks */
int target_chunks() {
    static int cached = 0;
    if (!cached) {
        const char *e = getenv("OSPREY_SPARSE_CHUNKS");
        const int v = e ? atoi(e) : 0;
        cached = v == 4 || v == 8 || v == 16 || v == 32 || v == 64 ? v : kTargetChunks;
    }
    return cached;
}

/* K/V stages: OSPREY_SPARSE_STAGES=2..4 (read once), else the default */
int stages() {
    static int cached = 0;
    if (!cached) {
        const char *e = getenv("OSPREY_SPARSE_STAGES");
        const int v = e ? atoi(e) : 0;
        cached = v >= 2 && v <= 4 ? v : kStagesDefault;
    }
    return cached;
}

template <int D, int NQ> osp_status launch_st(const SParams &prm, dim3 grid, cudaStream_t st) {
    switch (stages()) {
    case 2: return launch_dec<D, NQ, 2>(prm, grid, st);
    case 4: return launch_dec<D, NQ, 4>(prm, grid, st);
    default: return launch_dec<D, NQ, 3>(prm, grid, st);
    }
}

template <int D> osp_status launch_d(const SParams &prm, dim3 grid, int nq, int64_t out_rows, bool merge, cudaStream_t st) {
    const osp_status rc = nq == 2 ? launch_st<D, 2>(prm, grid, st) : launch_st<D, 1>(prm, grid, st);
    if (rc != OSP_OK || !merge) return rc;
    osp_launch(sparse_merge_kernel<D>, dim3((unsigned)out_rows), D, 0, st, prm);
    OSP_CUDA_LAUNCH_CHECK("sparse_merge_kernel");
    return OSP_OK;
}

} // namespace
} // namespace osp_sparse_attn

using namespace osp_sparse_attn;

extern "C" int32_t osp_cuda_sparse_chunk_entries(int32_t row_tiles, int32_t block_size) {
    if (block_size < 1 || block_size > kMaxBlock) return 0;
    return chunk_entries_of(row_tiles, block_size, target_chunks());
}

extern "C" int32_t osp_cuda_sparse_max_chunks(int32_t max_row_tiles, int32_t block_size) {
    if (block_size < 1 || block_size > kMaxBlock) return 0;
    /* chunks_of is not monotone in n (a longer row may take a larger chunk): the largest over n <= max */
    int32_t best = 1;
    const int cmax = floor_pow2(kMaxKeys / block_size);
    /* within one chunk size the count grows with n; the largest n of each chunk size is enough */
    for (int ch = 1; ch <= cmax; ch *= 2) {
        /* the largest n <= max_row_tiles whose chunk size is ch */
        int lo = 0, hi = max_row_tiles, found = -1;
        /* chunk_entries_of is monotone non-decreasing in n: binary search its last n with size <= ch */
        while (lo <= hi) {
            const int mid = lo + (hi - lo) / 2;
            if (chunk_entries_of(mid, block_size, target_chunks()) <= ch) found = mid, lo = mid + 1;
            else hi = mid - 1;
        }
        if (found >= 0 && chunks_of(found, block_size, target_chunks()) > best) best = chunks_of(found, block_size, target_chunks());
    }
    return best;
}

extern "C" size_t osp_cuda_sparse_workspace_bytes(int64_t T, int n_head, int D, int32_t max_row_tiles, int32_t block_size) {
    const int32_t nch = osp_cuda_sparse_max_chunks(max_row_tiles, block_size);
    if (nch <= 1 || T <= 0 || n_head <= 0 || D <= 0) return 0;
    const size_t stride = (size_t)(nch + 1) / 2 * 2;
    const size_t rows = (size_t)T * (size_t)n_head;
    return rows * stride * (size_t)D * sizeof(float) + rows * stride * sizeof(float2);
}

extern "C" osp_status osp_cuda_sparse_attention_decode(const osp_cuda_sparse_table *wt, const uint16_t *d_q,
                                                       const void *d_k_pages, const void *d_v_pages, uint32_t kv_type,
                                                       uint16_t *d_out, int64_t T, const int32_t *d_positions,
                                                       const int32_t *d_token_seq, const int32_t *d_seq_lens,
                                                       const int32_t *d_block_table, int32_t max_blocks,
                                                       int32_t block_size, int n_head, int n_head_kv, int D, float scale,
                                                       const osp_cuda_sparse_mask *mask, void *d_workspace,
                                                       size_t workspace_bytes, void *stream) {
    if (!wt || !d_q || !d_k_pages || !d_v_pages || !d_out || !d_positions || !d_token_seq || !d_seq_lens ||
        !d_block_table || !wt->d_indptr || !wt->d_indices || !wt->d_pages || !wt->d_flags || !wt->d_tmask)
        return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: NULL argument");
    if (kv_type != OSP_KV_PAGE_F16)
        return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: f16 pages only (kv_type %u)", kv_type);
    if (D != 64 && D != 128) return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: head_dim %d (64 or 128)", D);
    if (n_head_kv < 1 || n_head < n_head_kv || n_head % n_head_kv || n_head / n_head_kv > 16)
        return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: heads %d / %d (a group of <= 16)", n_head, n_head_kv);
    if (block_size < 1 || block_size > kMaxBlock || max_blocks < 1)
        return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: block_size %d (1 .. %d)", block_size, kMaxBlock);
    if (wt->groups != n_head_kv && wt->groups != n_head)
        return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: %d groups (n_head_kv %d or n_head %d)", wt->groups,
                             n_head_kv, n_head);
    if (T < 0 || (int64_t)wt->num_rows != T * wt->groups || wt->mask_words != (block_size + 31) / 32 ||
        wt->max_row_tiles < 0)
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "sparse attention: table of %d rows, %d mask words for T %lld x %d groups, block %d",
                             wt->num_rows, wt->mask_words, (long long)T, wt->groups, block_size);
    const int kind = mask ? mask->kind : kCausal;
    if (kind != kCausal && kind != kSliding && kind != kSinkWin && kind != kPrefixLm)
        return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: mask kind %d (causal, sliding window, sink window "
                             "or prefix-LM on the GPU)", kind);
    if (((uintptr_t)d_q | (uintptr_t)d_k_pages | (uintptr_t)d_v_pages | (uintptr_t)d_out | (uintptr_t)d_workspace) & 15u)
        return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: pointers must be 16-byte aligned");
    if (T == 0) return OSP_OK;
    const int32_t nch = osp_cuda_sparse_max_chunks(wt->max_row_tiles, block_size);
    const size_t need = osp_cuda_sparse_workspace_bytes(T, n_head, D, wt->max_row_tiles, block_size);
    if (need > 0 && (!d_workspace || workspace_bytes < need))
        return osp_set_error(OSP_ERR_INVALID_ARG, "sparse attention: workspace of %zu bytes (%zu needed)", workspace_bytes,
                             need);
    SParams prm = {};
    prm.indptr = wt->d_indptr, prm.indices = wt->d_indices, prm.pages = wt->d_pages, prm.flags = wt->d_flags;
    prm.tmask = wt->d_tmask;
    prm.q = d_q, prm.k_pages = static_cast<const uint16_t *>(d_k_pages), prm.v_pages = static_cast<const uint16_t *>(d_v_pages);
    prm.out = d_out;
    prm.positions = d_positions, prm.token_seq = d_token_seq, prm.seq_lens = d_seq_lens, prm.block_table = d_block_table;
    prm.ws_stride = (nch + 1) / 2 * 2;
    prm.target_chunks = target_chunks();
    const size_t rows = (size_t)T * (size_t)n_head;
    prm.ws_acc = need ? static_cast<float *>(d_workspace) : nullptr;
    prm.ws_ml = need ? reinterpret_cast<float2 *>(prm.ws_acc + rows * (size_t)prm.ws_stride * (size_t)D) : nullptr;
    prm.groups = wt->groups, prm.mask_words = wt->mask_words, prm.max_blocks = max_blocks, prm.block_size = block_size;
    prm.n_head = n_head, prm.n_head_kv = n_head_kv, prm.grp = n_head / n_head_kv;
    prm.per_q_head = wt->groups == n_head && n_head != n_head_kv;
    prm.mask_kind = kind, prm.window = mask ? mask->window : 0, prm.sinks = mask ? mask->sinks : 0;
    prm.prefix_len = mask ? mask->prefix_len : 0;
    prm.qscale = scale * kLog2e;
    const int cols = prm.per_q_head ? 1 : prm.grp;
    const int nq = cols > 8 ? 2 : 1;
    const dim3 grid((unsigned)wt->num_rows, (unsigned)nch);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    return D == 64 ? launch_d<64>(prm, grid, nq, (int64_t)rows, nch > 1, st)
                   : launch_d<128>(prm, grid, nq, (int64_t)rows, nch > 1, st);
}
