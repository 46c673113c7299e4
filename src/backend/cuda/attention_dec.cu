/* Paged attention v4: split mode for short query tiles (decode: one token's GQA group; speculative
 * verification: a few tokens of it), on f16 and E4M3 pages at head_dim 64 / 128 (issues 12 and 13).
 *
 * Why: v2's split mode multiplies a 64-row wgmma tile for a decode tile's 4 real rows (one token of a
 * 32/8 group), and every one of its 4 warps runs the softmax of 16 rows x 64 keys a tile: ~1,100
 * instructions a warp a tile (bench/gpu/NOTES.md), so E4M3 pages, half the bytes, ran no faster than
 * f16 pages (bench/kv/NOTES.md). v4 puts the keys, not the query rows, on the long side of the
 * products, so a tile's work scales with its real rows:
 *   S^T = K Q^T   mma.sync m16n8k16, warp w owns keys 16 w .. 16 w + 15 of the 64-key tile (A: the K
 *                 rows from shared memory; B: Q^T, the tile's <= 8 NQ rows as columns, in registers);
 *   O^T += V^T P^T  warp w owns dimensions [w D / 4, (w + 1) D / 4) (A: V^T from shared memory by
 *                 ldmatrix.trans; B: P^T, every warp's probabilities through shared memory).
 * A CTA is 4 warps and serves <= 8 NQ rows (token, head) of one sequence and one KV head
 * (attention_tiles.cuh with dec_rows rows), a run of chunks_per_cta chunks of 256 keys, as v2's split
 * mode; the partials go to the same workspace and attention_mma.cu's merge folds them.
 *
 * Numerics: v2's, element for element, so a row's bits never depend on which kernel served it (the
 * launcher may pick v4 or v2 per launch; test_gpu_attention and test_gpu_kv_quant assert the bits):
 *   - every score is the same products in the same k-steps (dims 16 kk .. 16 kk + 15, k-slot i = dim
 *     16 kk + i) with fp32 accumulation from zero, then times qscale (__fmul_rn), then masked;
 *   - a tile's max per row over its 64 keys (warp maxima exchanged through shared memory; fmax is
 *     exact), m_use and alpha = ex2(m - m_use) as v2, p = ex2(s - m_use);
 *   - the row sum in v2's order: v2's lane tq of a row sums, per tile, the pairs (p[8 n + 2 tq] +
 *     p[8 n + 2 tq + 1]) for n = 0 .. 7 in order and folds l = fma(l, alpha, that); at a chunk's end
 *     the four lanes' l go through quad_sum. Here the pairs are formed where the two keys meet (lanes
 *     g = 2 tq, 2 tq + 1 of the key's warp), written to shared memory, and owner thread (row r, tq)
 *     sums them in n order and keeps that lane's l; the owners of a row are one quad, so quad_sum is
 *     the same shuffles;
 *   - P rounded to f16 per element (round to nearest), O^T's products over keys 16 j .. 16 j + 15 in
 *     k-step j (k-slot i = key 16 j + i), o scaled by alpha before each tile's products.
 * That the tensor core gives an output element the same bits when the two operands trade places
 * (A = K instead of B = K) and under mma.sync instead of wgmma is measured, not documented: the
 * bit tests above are what allow v4 to be the default.
 *
 * E4M3 pages: codes land by cp.async in padded shared rows ([64][D + 16] bytes) and are widened,
 * exactly, straight into the fragments: K's (key g, dims 2c, 2c + 1) pairs by 16-bit loads and
 * cvt e4m3x2 -> f16x2; V^T's by ldmatrix.trans on the bytes (an 8 x 8 matrix of 16-bit elements is 8
 * keys x 16 dims), a PRMT per pair of keys and the same cvt, with O^T's rows permuted (row g is dim
 * 2 g of the 16, row g + 8 dim 2 g + 1: a row permutation changes no sum). The K scale of the KV head
 * folds into qscale and the V scale multiplies the merged output, as in v2. No f16 copy of a tile
 * exists. */
#include "backend/cuda/cuda_common.cuh" /* OSP_CUDA_LAUNCH_CHECK, OSP_CUDA_TRY, osp_launch, osp_pdl_begin */
#include "backend/cuda/attention_dec.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <math.h>
#include <stdint.h>

namespace osp_attn {
namespace {

constexpr int kThreads = 128; /* 4 warps */
constexpr int kKeys = 64;     /* keys a tile: v2's (part of the numerics) */
constexpr int kPS = kKeys + 8; /* P^T's shared row stride, halves (144 bytes: ldmatrix without conflicts) */

/* shared row stride of a K/V row, bytes: padded by 16 so ldmatrix's 8 rows hit distinct banks */
template <int D, bool kFp8> constexpr int row_bytes() { return (kFp8 ? D : 2 * D) + 16; }
template <int D, bool kFp8, int NQ, int ST> constexpr int smem_bytes() {
    return ST * 2 * kKeys * row_bytes<D, kFp8>() + 8 * NQ * kPS * 2 /* sP */ + 4 * 8 * NQ * 4 /* sMax */ +
           8 * NQ * 32 * 4 /* sPair */;
}

__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t &r0, uint32_t &r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2_t(uint32_t addr, uint32_t &r0, uint32_t &r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ uint32_t lds_u16(uint32_t addr) {
    uint16_t v;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr));
    return v;
}
/* two E4M3 codes (the low one in bits 0..7) -> f16x2 (the low one in the low half), exactly */
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t w) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xFFFFu), __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

/* D: head_dim (64, 128); NQ: 8-row blocks of query rows (rows <= 8 NQ); ST: K/V stages in flight;
 * kFp8: E4M3 pages. Split mode only (p.ws_acc, p.ws_ml, p.ws_stride, p.chunks_per_cta). */
template <int D, int NQ, int ST, bool kFp8>
__global__ void __launch_bounds__(kThreads, 3) attn_dec_kernel(const Params p) {
    osp_pdl_begin();
    static_assert(D == 64 || D == 128, "head_dim");
    static_assert(ST >= 2 && ST <= 4, "stages");
    constexpr int R = 8 * NQ;           /* query rows a CTA */
    constexpr int KT = D / 16;          /* k-steps of S^T */
    constexpr int MB = D / 64;          /* O^T's 16-dimension blocks a warp */
    constexpr int RB = row_bytes<D, kFp8>();
    constexpr int TB = kKeys * RB;      /* one K (or V) tile in shared memory */
    constexpr int ESZ = kFp8 ? 1 : 2;   /* bytes a value in the pages */
    constexpr int LCPR = D * ESZ / 16;  /* 16-byte chunks a K/V row */
    constexpr int LCPT = kKeys * LCPR / kThreads; /* chunks a thread per K (or V) tile */
    static_assert(LCPT * kThreads == kKeys * LCPR, "tile chunking");
    extern __shared__ uint4 dec_smem[];
    char *sKV = reinterpret_cast<char *>(dec_smem);                     /* [ST][K, V][kKeys][RB] */
    uint16_t *sP = reinterpret_cast<uint16_t *>(sKV + ST * 2 * TB);     /* P^T [R][kPS] f16 */
    float *sMax = reinterpret_cast<float *>(sP + R * kPS);              /* [4 warps][R] */
    float *sPair = sMax + 4 * R;                                        /* [R][4 tq][8 n] */

    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, c4 = lane & 3;

    AttnCtaWork w; /* sequence s, tokens [t0, t0 + ntok), kv head kvh, query heads [h0, h0 + nh) */
    if (!attn_cta_work(p.tl, p.qsl, p.num_seqs, w)) return;
    const int t0 = w.t0, ntok = w.ntok, kvh = w.kvh, nh = w.nh, h0 = w.h0;
    const int rows = ntok * nh;

    /* the chunk run, as v2's split mode */
    int kv_len = 0, k_first = INT32_MAX;
    for (int i = 0; i < ntok; i++) {
        const int li = p.positions[t0 + i] + 1;
        kv_len = max(kv_len, li);
        k_first = min(k_first, p.window > 0 && li > p.window ? li - p.window : 0);
    }
    int kb = k_first / kKeys * kKeys, ke = kv_len;
    const int c_begin = (int)blockIdx.z * p.chunks_per_cta;
    if (c_begin * kChunk >= kv_len) return;
    const int c_end = min(c_begin + p.chunks_per_cta, (kv_len + kChunk - 1) / kChunk);
    for (int c = c_begin; c < c_end && (c + 1) * kChunk <= kb; c++)
        for (int r = tid; r < rows; r += kThreads) {
            const int64_t orow = (int64_t)(t0 + r / nh) * p.n_head + h0 + r % nh;
            p.ws_ml[orow * p.ws_stride + c] = make_float2(-INFINITY, 0.0f);
        }
    kb = max(kb, c_begin * kChunk);
    ke = min(ke, c_end * kChunk);
    if (kb >= ke) return;

    /* Q^T fragments (B of S^T): column 8 nq + g is row 8 nq + g of the tile; k-step kk's registers hold
     * dims 16 kk + 2 c4, + 1 and 16 kk + 2 c4 + 8, + 9, as f16 (v2's rounding: bf16 -> f16, clamped) */
    uint32_t qb[NQ][KT][2];
#pragma unroll
    for (int nq = 0; nq < NQ; nq++) {
        const int r = 8 * nq + g;
        const bool ok = r < rows;
        const int64_t qrow = ok ? (int64_t)(t0 + r / nh) * p.n_head + h0 + r % nh : 0;
#pragma unroll
        for (int kk = 0; kk < KT; kk++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const uint32_t pair = ok ? *reinterpret_cast<const uint32_t *>(p.q + qrow * D + 16 * kk + 2 * c4 + 8 * hf) : 0u;
                const float lo_f = __uint_as_float(pair << 16), hi_f = __uint_as_float(pair & 0xffff0000u);
                qb[nq][kk][hf] = pack_f16x2(clamp_f16_range(lo_f), clamp_f16_range(hi_f));
            }
    }
    /* this thread's columns (rows of the tile) 8 nq + 2 c4 + ci: causal limit and window start */
    int lim[NQ][2], first[NQ][2];
#pragma unroll
    for (int nq = 0; nq < NQ; nq++)
#pragma unroll
        for (int ci = 0; ci < 2; ci++) {
            const int r = 8 * nq + 2 * c4 + ci;
            lim[nq][ci] = r < rows ? p.positions[t0 + r / nh] + 1 : 0;
            first[nq][ci] = p.window > 0 && lim[nq][ci] > p.window ? lim[nq][ci] - p.window : 0;
        }

    /* K/V loader: v2's (slots one tile ahead; keys >= ke zero-filled), into padded rows */
    const int32_t *bt = p.block_table + (int64_t)w.s * p.max_blocks;
    const int64_t row_bytes_g = (int64_t)p.n_head_kv * D * ESZ;
    const int part = tid % LCPR, jrow = tid / LCPR;
    const char *kbase = reinterpret_cast<const char *>(p.k_pages) + (int64_t)kvh * D * ESZ + part * 16,
               *vbase = reinterpret_cast<const char *>(p.v_pages) + (int64_t)kvh * D * ESZ + part * 16;
    const uint32_t s0 = smem_u32(sKV) + (uint32_t)(jrow * RB + part * 16);
    auto fetch_slots = [&](int k0, int (&slot)[LCPT]) {
#pragma unroll
        for (int u = 0; u < LCPT; u++) {
            const int key = k0 + jrow + u * (kThreads / LCPR);
            const int blk = p.bdiv.div(key);
            slot[u] = key < ke ? bt[blk] * p.block_size + (key - blk * p.block_size) : -1;
        }
    };
    auto load_tile = [&](const int (&slot)[LCPT], int st) {
#pragma unroll
        for (int u = 0; u < LCPT; u++) {
            const bool valid = slot[u] >= 0;
            const int64_t off = valid ? (int64_t)slot[u] * row_bytes_g : 0;
            const uint32_t so = (uint32_t)(st * 2 * TB + u * (kThreads / LCPR) * RB);
            cp_async16(s0 + so, kbase + off, valid);
            cp_async16(s0 + so + TB, vbase + off, valid);
        }
    };

    const float qscale = kFp8 ? __fmul_rn(p.qscale, p.k_fixed[kvh]) : p.qscale;

    /* running state: every thread keeps m of its own columns; owner thread (row orow_r = tid / 4, lane
     * tq = tid % 4 of v2's quad) keeps that lane's l (and m again); o: O^T's fragments of this warp's
     * dimensions */
    const bool owner = tid < 4 * R;
    const int own_r = tid >> 2, own_tq = tid & 3;
    float m[NQ][2], m_own = -INFINITY, l_own = 0.0f;
    float o[MB][NQ][4];
#pragma unroll
    for (int nq = 0; nq < NQ; nq++) m[nq][0] = m[nq][1] = -INFINITY;
#pragma unroll
    for (int mb = 0; mb < MB; mb++)
#pragma unroll
        for (int nq = 0; nq < NQ; nq++) o[mb][nq][0] = o[mb][nq][1] = o[mb][nq][2] = o[mb][nq][3] = 0.0f;

    /* O^T's rows: dimension of fragment row g (+ 8 hf) of block mb */
    auto out_dim = [&](int mb, int hf) {
        const int d0 = warp * (D / 4) + 16 * mb;
        return kFp8 ? d0 + 2 * g + hf : d0 + g + 8 * hf;
    };

    int slot_next[LCPT];
    fetch_slots(kb, slot_next);
#pragma unroll
    for (int i = 0; i < ST - 1; i++) {
        if (kb + i * kKeys < ke) load_tile(slot_next, i);
        cp_async_commit();
        fetch_slots(kb + (i + 1) * kKeys, slot_next);
    }

    /* ldmatrix lane addresses (bytes within a tile) */
    const uint32_t k_lane = kFp8 ? (uint32_t)((16 * warp + g) * RB + 2 * c4)
                                 : (uint32_t)((16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8) * RB + (lane >> 4) * 16);
    const uint32_t v_lane = kFp8 ? (uint32_t)(((lane & 7) + ((lane >> 3) & 1) * 8) * RB + warp * (D / 4))
                                 : (uint32_t)(((lane & 7) + ((lane >> 4) << 3)) * RB + (warp * (D / 4) + ((lane >> 3) & 1) * 8) * 2);
    const uint32_t p_lane = smem_u32(sP) + (uint32_t)(((lane & 7) * kPS + ((lane >> 3) & 1) * 8) * 2);

    int stage = 0, stage_load = ST - 1;
    for (int k0 = kb; k0 < ke; k0 += kKeys) {
        const bool more = k0 + kKeys < ke;
        cp_async_wait<ST - 2>();
        __syncthreads(); /* the tile landed; every warp is done with the stage refilled next and with sP */
        if (k0 + (ST - 1) * kKeys < ke) {
            load_tile(slot_next, stage_load);
            fetch_slots(k0 + ST * kKeys, slot_next);
        }
        cp_async_commit();
        stage_load = stage_load + 1 == ST ? 0 : stage_load + 1;
        const uint32_t sk = smem_u32(sKV) + (uint32_t)(stage * 2 * TB), sv = sk + (uint32_t)TB;

        /* S^T: keys 16 warp + g (elements 0, 1) and + 8 (2, 3), columns 8 nq + 2 c4 (+ 1) */
        float sc[NQ][4];
#pragma unroll
        for (int nq = 0; nq < NQ; nq++) sc[nq][0] = sc[nq][1] = sc[nq][2] = sc[nq][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
            uint32_t a[4];
            if constexpr (kFp8) {
                const uint32_t b = sk + k_lane + 16 * kk;
                a[0] = e4m3x2_to_f16x2(lds_u16(b)), a[1] = e4m3x2_to_f16x2(lds_u16(b + 8 * RB));
                a[2] = e4m3x2_to_f16x2(lds_u16(b + 8)), a[3] = e4m3x2_to_f16x2(lds_u16(b + 8 * RB + 8));
            } else {
                ldsm_x4(sk + k_lane + 32 * kk, a[0], a[1], a[2], a[3]);
            }
#pragma unroll
            for (int nq = 0; nq < NQ; nq++) mma16816(sc[nq], a, qb[nq][kk][0], qb[nq][kk][1]);
        }
        const int key0 = k0 + 16 * warp + g;
#pragma unroll
        for (int nq = 0; nq < NQ; nq++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int ci = e & 1, key = key0 + 8 * (e >> 1);
                const float s = __fmul_rn(sc[nq][e], qscale); /* no contraction: v2's bits */
                sc[nq][e] = key >= lim[nq][ci] || key < first[nq][ci] ? -INFINITY : s;
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
        /* the tile's max, alpha and p (v2's order of operations) */
        float alpha[NQ][2];
#pragma unroll
        for (int nq = 0; nq < NQ; nq++)
#pragma unroll
            for (int ci = 0; ci < 2; ci++) {
                const int col = 8 * nq + 2 * c4 + ci;
                const float tmax = fmaxf(fmaxf(sMax[col], sMax[R + col]), fmaxf(sMax[2 * R + col], sMax[3 * R + col]));
                const float m_new = fmaxf(m[nq][ci], tmax);
                const float m_use = m_new == -INFINITY ? 0.0f : m_new;
                alpha[nq][ci] = ex2(m[nq][ci] - m_use);
                m[nq][ci] = m_new;
                sc[nq][ci] = ex2(__fsub_rn(sc[nq][ci], m_use));
                sc[nq][2 + ci] = ex2(__fsub_rn(sc[nq][2 + ci], m_use));
            }
        /* v2's pairs (keys 8 n + 2 tq, + 1: lanes g = 2 tq and 2 tq + 1 here, n = 2 warp + (e >> 1)),
         * and P^T in f16 */
#pragma unroll
        for (int nq = 0; nq < NQ; nq++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = 8 * nq + 2 * c4 + (e & 1);
                const float odd = __shfl_down_sync(0xffffffffu, sc[nq][e], 4);
                if (!(g & 1)) sPair[(col * 4 + (g >> 1)) * 8 + 2 * warp + (e >> 1)] = __fadd_rn(sc[nq][e], odd);
                sP[col * kPS + 16 * warp + g + 8 * (e >> 1)] = __half_as_ushort(__float2half_rn(sc[nq][e]));
            }
        __syncthreads();
        /* the owners' l: this tile's pairs in n order, folded as v2's lane tq folds them */
        if (owner) {
            const float tmax = fmaxf(fmaxf(sMax[own_r], sMax[R + own_r]), fmaxf(sMax[2 * R + own_r], sMax[3 * R + own_r]));
            const float m_new = fmaxf(m_own, tmax);
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;
            const float al = ex2(m_own - m_use);
            m_own = m_new;
            const float4 x = *reinterpret_cast<const float4 *>(sPair + (own_r * 4 + own_tq) * 8);
            const float4 y = *reinterpret_cast<const float4 *>(sPair + (own_r * 4 + own_tq) * 8 + 4);
            float ls = __fadd_rn(0.0f, x.x);
            ls = __fadd_rn(ls, x.y), ls = __fadd_rn(ls, x.z), ls = __fadd_rn(ls, x.w);
            ls = __fadd_rn(ls, y.x), ls = __fadd_rn(ls, y.y), ls = __fadd_rn(ls, y.z), ls = __fadd_rn(ls, y.w);
            l_own = __fmaf_rn(l_own, al, ls);
        }
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
            for (int nq = 0; nq < NQ; nq++) ldsm_x2(p_lane + (uint32_t)((8 * nq * kPS + 16 * j) * 2), b[nq][0], b[nq][1]);
#pragma unroll
            for (int mb = 0; mb < MB; mb++) {
                uint32_t a[4];
                if constexpr (kFp8) {
                    uint32_t r0, r1;
                    ldsm_x2_t(sv + v_lane + (uint32_t)(16 * j * RB + 16 * mb), r0, r1);
                    a[0] = e4m3x2_to_f16x2(__byte_perm(r0, 0u, 0x0020)), a[1] = e4m3x2_to_f16x2(__byte_perm(r0, 0u, 0x0031));
                    a[2] = e4m3x2_to_f16x2(__byte_perm(r1, 0u, 0x0020)), a[3] = e4m3x2_to_f16x2(__byte_perm(r1, 0u, 0x0031));
                } else {
                    ldsm_x4_t(sv + v_lane + (uint32_t)(16 * j * RB + 32 * mb), a[0], a[1], a[2], a[3]);
                }
#pragma unroll
                for (int nq = 0; nq < NQ; nq++) mma16816(o[mb][nq], a, b[nq][0], b[nq][1]);
            }
        }

        /* chunk end: its partial, v2's bits, then a fresh chunk */
        if ((k0 + kKeys) % kChunk == 0 || !more) {
            const int c = k0 / kChunk;
            if (warp < R / 8) { /* the owner warps: every lane an owner; quads are rows */
                const float lc = quad_sum(l_own);
                if (own_tq == 0 && own_r < rows) {
                    const int64_t orow = (int64_t)(t0 + own_r / nh) * p.n_head + h0 + own_r % nh;
                    p.ws_ml[orow * p.ws_stride + c] = make_float2(m_own, lc);
                }
            }
#pragma unroll
            for (int nq = 0; nq < NQ; nq++)
#pragma unroll
                for (int ci = 0; ci < 2; ci++) {
                    const int r = 8 * nq + 2 * c4 + ci;
                    if (r >= rows) continue;
                    const int64_t orow = (int64_t)(t0 + r / nh) * p.n_head + h0 + r % nh;
                    float *dst = p.ws_acc + (orow * p.ws_stride + c) * D;
#pragma unroll
                    for (int mb = 0; mb < MB; mb++) {
                        dst[out_dim(mb, 0)] = o[mb][nq][ci];
                        dst[out_dim(mb, 1)] = o[mb][nq][2 + ci];
                    }
                }
            m_own = -INFINITY, l_own = 0.0f;
#pragma unroll
            for (int nq = 0; nq < NQ; nq++) m[nq][0] = m[nq][1] = -INFINITY;
#pragma unroll
            for (int mb = 0; mb < MB; mb++)
#pragma unroll
                for (int nq = 0; nq < NQ; nq++) o[mb][nq][0] = o[mb][nq][1] = o[mb][nq][2] = o[mb][nq][3] = 0.0f;
        }
        stage = stage + 1 == ST ? 0 : stage + 1;
    }
    cp_async_wait<0>();
}

template <int D, int NQ, int ST, bool kFp8> osp_status launch_one(const Params &prm, dim3 grid, cudaStream_t st) {
    constexpr int smem = smem_bytes<D, kFp8, NQ, ST>();
    static_assert(smem <= 227 * 1024, "shared memory of one CTA");
    if (smem > 48 * 1024)
        OSP_CUDA_TRY(cudaFuncSetAttribute(attn_dec_kernel<D, NQ, ST, kFp8>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    osp_launch(attn_dec_kernel<D, NQ, ST, kFp8>, grid, kThreads, smem, st, prm);
    OSP_CUDA_LAUNCH_CHECK("attn_dec_kernel");
    return OSP_OK;
}

template <int D, int NQ, bool kFp8> osp_status launch_st(const Params &prm, dim3 grid, int stages, cudaStream_t st) {
    switch (stages) {
    case 2: return launch_one<D, NQ, 2, kFp8>(prm, grid, st);
    case 4: return launch_one<D, NQ, 4, kFp8>(prm, grid, st);
    default: return launch_one<D, NQ, 3, kFp8>(prm, grid, st);
    }
}

template <int D> osp_status launch_d(const Params &prm, dim3 grid, int nq, bool fp8, int stages, cudaStream_t st) {
    if (fp8) return nq == 2 ? launch_st<D, 2, true>(prm, grid, stages, st) : launch_st<D, 1, true>(prm, grid, stages, st);
    return nq == 2 ? launch_st<D, 2, false>(prm, grid, stages, st) : launch_st<D, 1, false>(prm, grid, stages, st);
}

} // namespace

int dec_rows(int group) { return group <= 8 ? 8 : group <= 16 ? 16 : 0; }

int dec_default_stages(bool fp8) { return fp8 ? 3 : 2; }

int dec_smem_bytes(int D, bool fp8, int rows, int stages) {
    const int nq = rows > 8 ? 2 : 1;
    const int rb = (fp8 ? D : 2 * D) + 16;
    return stages * 2 * kKeys * rb + 8 * nq * kPS * 2 + 4 * 8 * nq * 4 + 8 * nq * 32 * 4;
}

osp_status dec_launch(const Params &prm, unsigned n_groups, int D, bool fp8, int stages, void *stream) {
    const int rows = prm.tl.heads_per_cta * prm.tl.bq;
    const int nq = rows > 8 ? 2 : 1;
    if (stages < 2 || stages > 4) stages = dec_default_stages(fp8);
    const dim3 grid((unsigned)prm.tl.n_tiles, (unsigned)(prm.n_head_kv * prm.tl.head_chunks), n_groups);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    return D == 64 ? launch_d<64>(prm, grid, nq, fp8, stages, st) : launch_d<128>(prm, grid, nq, fp8, stages, st);
}

} // namespace osp_attn
