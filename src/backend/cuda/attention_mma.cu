/* Paged attention on tensor cores, FlashAttention-2 style (Dao 2023: a warp owns 16 query rows, S = Q K^T
 * and O += P V stay in registers, the P fragment of S is reused as the A operand of P V), K/V tiles of
 * 64 keys brought to shared memory by cp.async 2 to 4 stages deep (one barrier a tile), for f16 pages
 * and head_dim 32 / 64 / 128, with the two products on one of two instructions:
 *   v1  mma.sync m16n8k16 (f16 in, fp32 accumulate), K/V fragments by ldmatrix from padded rows;
 *   v2  wgmma m64nNk16 (sm_90a; D 64 / 128): the CTA's 4 warps are one warpgroup; S = Q K^T with Q
 *       from registers (mma.sync's A fragments) and K read by descriptor from 128-byte-swizzled shared
 *       memory, O += P V with P from registers and V by descriptor (N-major): K and V never pass
 *       through the registers. o's rescale is skipped where a warp's rows all keep their max.
 * Which one serves a launch depends on the model's shape (head_dim, page type) alone, so a row's
 * bits never depend on its batch. src/backend/cuda/attention.cu (v0, CUDA cores) serves the other
 * shapes and stays the reference.
 *
 * The reduction a row sees is fixed by the row alone (the batch-invariance rule of shared/DESIGN.md):
 *   - keys are cut into chunks of kChunk keys from key 0, chunks into tiles of kKeys keys;
 *   - inside a chunk the row keeps an online softmax (Milakov & Gimelshein 2018) over the tiles in
 *     order: running max m, running sum l, fp32 accumulator o;
 *   - the chunk results (m_c, l_c, o_c) are folded in chunk order, the state starting empty:
 *       M' = max(M, m_c); L = L 2^(M - M') + l_c 2^(m_c - M'); O = O 2^(M - M') + o_c 2^(m_c - M')
 *     (fold_state / fold_elem), and out = O / L.
 * A tile or chunk holding no key of the row leaves every value bit-identical (it is skipped or adds
 * exact zeros), and the rows of an mma are independent, so the result of a row depends only on its
 * own q, keys and position: not on the other rows of its tile, on the tile's length, on the batch or
 * on how the work is spread. Two executions of that one reduction:
 *   fold mode   a CTA walks every chunk of its query tile and folds in registers (prefill, and any
 *               launch with enough CTAs to fill the GPU);
 *   split mode  a CTA per (query tile, run of chunks_per_cta chunks) writes each chunk's (m_c, l_c,
 *               o_c) to the workspace and merge_kernel folds them (FlashDecoding, Dao et al. 2023),
 *               for launches with too few query tiles to fill the GPU: decode. chunks_per_cta spreads
 *               the chunks over one wave of resident CTAs; it changes no partial.
 * Both run the same fold code on the same fp32 values, so they agree bit for bit (test_gpu_attention
 * asserts it, and that a row gives the same bits in any batch and any prefill chunking).
 *
 * CTA: 4 warps, 64 query rows (token, head) of one KV head: all the query heads of a GQA group that
 * fit, times as many tokens as fit (row r: token t0 + r / nh, head h0 + r % nh), so one K/V tile
 * feeds every head of the group (decode packs the group's heads as the rows of one mma tile). Grid:
 * x the query-tile slots and y kv head x head chunk (attention_tiles.cuh, shared with v0), z the
 * chunk run in split mode. Shared memory: K, V [stages][64][D + 8] f16 (v1: a row padded by 16 bytes,
 * ldmatrix conflict free; v2: [stages][D / 64][64][64] in 128-byte swizzle atoms, 1024-byte aligned)
 * and one region that stages Q [64][D + 8] f16 on its way to registers and then, at D = 128 in fold
 * mode, holds the fold state (fp32 [64][128]; in registers it would need more than 255 beside the
 * chunk accumulator): about 100 KiB at D = 128 with 2 stages, two CTAs per SM. Loads skip tiles no
 * row reaches; the causal and window masks run on edge tiles only.
 *
 * Precision: q is rounded from bf16 to f16 (exact for |q| in [2^-14, 65504]; larger values are
 * clamped to +-65504 rather than becoming inf), scores and sums are fp32, P is rounded to f16
 * for the P V product (as in FlashAttention and PyTorch's SDPA), the output to bf16. */
#include "backend/cuda/cuda_common.cuh" /* OSP_CUDA_LAUNCH_CHECK, OSP_CUDA_TRY, osp_f_to_bf16 */
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/attention_tiles.cuh" /* AttnTiling, attn_cta_work */
#include "backend/cuda/attention_v1.h"
#include "backend/cuda/attention_mma.cuh" /* Params, the fold, the PTX wrappers */
#include "backend/cuda/attention_ws.h"  /* v3: fold mode at D 128, warp-specialized */
#include "backend/cuda/attention_dec.h" /* v4: split mode for short query tiles */


#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

namespace {

using namespace osp_attn;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = kWarps * 16; /* query rows per CTA */
constexpr int kPadH = 8;           /* halves of padding per shared-memory row */
/* Keys per tile (part of the numerics, like kChunk), and where the fold-mode state lives: D = 128
 * keeps it in shared memory, where it shares the space Q passed through on its way to the registers. */
template <int D> constexpr int tile_keys() { return 64; }
template <int D> constexpr bool fold_in_smem() { return D == 128; }

/* Shared memory: K, V [stages][tile keys][D + kPadH] f16, then one region that first holds Q
 * [kRows][D + kPadH] f16 (until the fragments are in registers) and then, at D = 128 in fold mode,
 * the fold state. The stage count changes no result (only the tile and chunk lengths are numerics). */
/* K/V shared rows: padded for ldmatrix (mma.sync), or dense in 128-byte-swizzled atoms (wgmma) */
template <int D, bool kWg> constexpr int kv_row_halves() { return kWg ? D : D + kPadH; }
template <int D, bool kFold> constexpr int q_region_bytes() {
    return 2 * kRows * (D + kPadH) > (kFold && fold_in_smem<D>() ? 4 * kRows * D : 0) ? 2 * kRows * (D + kPadH)
                                                                                     : 4 * kRows * D;
}
/* Split mode stages Q in the K half of the last K/V stage, which the prologue leaves empty (it fills
 * stages 0 .. ST - 2) and the first tile's load refills only after the loop's first barrier: no Q
 * region, so 3 stages fit beside a second CTA on an SM. Not with E4M3 pages (the codes' stages follow
 * the Q region) nor wgmma at D = 64 (Q is re-read from shared memory every tile). Q's rows there are
 * unpadded under wgmma (the stage's rows are D halves; the one-time ldmatrix pays bank conflicts). */
template <int D, bool kFold, bool kWg, bool kFp8> constexpr bool q_in_stage() {
    return !kFold && !kFp8 && !(kWg && D == 64);
}
/* kFp8 (E4M3 pages, wgmma only): the f16 K/V region holds one converted tile, and ST stages of the raw
 * codes ([ST][K, V][kKeys][D] bytes) follow the Q region */
template <int D, int ST, bool kFold, bool kWg, bool kFp8 = false> constexpr int smem_bytes() {
    /* wgmma: + 1 KiB to align the swizzled atoms to 1024 bytes */
    return (kFp8 ? 1 : ST) * 4 * tile_keys<D>() * kv_row_halves<D, kWg>() +
           (q_in_stage<D, kFold, kWg, kFp8>() ? 0 : q_region_bytes<D, kFold>()) + (kWg ? 1024 : 0) +
           (kFp8 ? ST * 2 * tile_keys<D>() * D : 0);
}

/* Four E4M3 codes (byte 0 first) -> two f16x2 words, exactly (e4m3x2_to_f16x2 twice) */
__device__ __forceinline__ void e4m3x4_to_f16x4(uint32_t w, uint32_t &lo, uint32_t &hi) {
    lo = e4m3x2_to_f16x2(w);
    hi = e4m3x2_to_f16x2(w >> 16);
}

/* ---- the kernel --------------------------------------------------------------------------------- */

/* D: head_dim; ST: K/V stages in flight (2 ..); kFold: fold mode (else split mode); kWg: the products by
 * wgmma (sm_90a, D 64 / 128) instead of mma.sync; kFp8: E4M3 pages (issue 13): each tile's codes land
 * by cp.async in a staging stage and are converted once, exactly, into the f16 tile the products read
 * (the K/V scales of the KV head factor out of both products: q k scale_k, and the output times
 * scale_v after the fold). */
template <int D, int ST, bool kFold, bool kWg, bool kFp8 = false>
__global__ void __launch_bounds__(kThreads, 2) attn_mma_kernel(const Params p) {
    osp_pdl_begin();
    static_assert(D == 32 || D == 64 || D == 128, "head_dim");
    static_assert(!kWg || D == 64 || D == 128, "wgmma: D 64 or 128");
    static_assert(!kFp8 || kWg, "E4M3 pages: wgmma only");
    static_assert(ST >= 2, "stages");
    constexpr int kKeys = tile_keys<D>();
    constexpr bool kOSmem = kFold && fold_in_smem<D>();
    static_assert(!(kWg && D == 64 && kOSmem), "wgmma at D = 64 reloads Q from sQ every tile");
    constexpr int RS = D + kPadH;   /* shared row stride, halves */
    constexpr int KT = D / 16;      /* k-steps of Q K^T */
    constexpr int NB = kKeys / 8;   /* n-blocks of S */
    constexpr int ND = D / 8;       /* n-blocks of O */
    constexpr int CPR = D / 8;      /* 16-byte chunks per row */
    constexpr int CPT = kKeys * CPR / kThreads; /* chunks per thread per K (or V) tile */
    static_assert(CPT * kThreads == kKeys * CPR, "tile chunking");
    constexpr int KRS = kv_row_halves<D, kWg>(); /* K/V row stride, halves */
    constexpr int SF = kFp8 ? 1 : ST;            /* f16 K/V stages in shared memory */
    /* the K/V loader's 16-byte chunks a row (f16: 8 values, E4M3: 16) and a thread's per K (or V) tile */
    constexpr int LCPR = kFp8 ? D / 16 : CPR, LCPT = kKeys * LCPR / kThreads;
    static_assert(LCPT * kThreads == kKeys * LCPR, "tile chunking");
    extern __shared__ uint4 smem_u4[];
    uint16_t *sK = reinterpret_cast<uint16_t *>(smem_u4); /* [SF][kKeys][KRS]; wgmma: [SF][D / 64][kKeys][64] swizzled */
    if constexpr (kWg) sK += ((1024u - (smem_u32(smem_u4) & 1023u)) & 1023u) / 2;
    uint16_t *sV = sK + SF * kKeys * KRS;                   /* as sK */
    constexpr bool kQStage = q_in_stage<D, kFold, kWg, kFp8>();
    constexpr int QRS = kQStage && kWg ? D : RS; /* Q's row stride, halves */
    static_assert(!kQStage || kRows * QRS <= kKeys * KRS, "Q fits one K stage");
    /* [kRows][QRS], until the fragments are loaded: after the K/V stages, or in K's last stage */
    uint16_t *sQ = kQStage ? sK + (ST - 1) * kKeys * KRS : sV + SF * kKeys * KRS;
    float *sO = reinterpret_cast<float *>(sQ); /* then kOSmem: [ND * 4][kThreads], thread-private */
    /* kFp8: the codes' stages, K [ST][kKeys][D] then V [ST][kKeys][D] bytes */
    const uint32_t s8 = smem_u32(sV + SF * kKeys * KRS) + (uint32_t)q_region_bytes<D, kFold>();

    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tq = lane & 3;

    AttnCtaWork w; /* sequence s, tokens [t0, t0 + ntok), kv head kvh, query heads [h0, h0 + nh) */
    if (!attn_cta_work(p.tl, p.qsl, p.num_seqs, w, kFold && p.heavy_first)) return; /* fold mode: the longest tiles first */
    const int s = w.s, t0 = w.t0, ntok = w.ntok, kvh = w.kvh, nh = w.nh, h0 = w.h0;
    const int rows = ntok * nh;

    int kb, ke; /* the keys this CTA walks (cta_key_range: the tile's reach, split mode's chunk run) */
    if (!cta_key_range<kKeys, !kFold>(p, w, tid, kThreads, kb, ke)) return;

    /* Q rows into shared memory as f16 (rows past the tile: zeros) */
    for (int c = tid; c < kRows * CPR; c += kThreads) {
        const int r = c / CPR, part = c % CPR;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r < rows) {
            const int64_t qrow = (int64_t)(t0 + r / nh) * p.n_head + h0 + r % nh;
            const uint4 b = *reinterpret_cast<const uint4 *>(p.q + qrow * D + part * 8);
            const uint32_t pair[4] = {b.x, b.y, b.z, b.w}; /* two bf16 each, the first in the low half */
            uint32_t o[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float lo_f = __uint_as_float(pair[i] << 16), hi_f = __uint_as_float(pair[i] & 0xffff0000u);
                o[i] = pack_f16x2(clamp_f16_range(lo_f), clamp_f16_range(hi_f));
            }
            v = make_uint4(o[0], o[1], o[2], o[3]);
        }
        *reinterpret_cast<uint4 *>(sQ + r * QRS + part * 8) = v;
    }

    /* K/V tile loader: keys [k0, k0 + kKeys) of kv head kvh into stage st; keys >= ke zero-filled.
     * Thread tid copies the 16-byte chunk part = tid % CPR of keys k0 + tid / CPR + u kThreads / CPR. */
    const int32_t *bt = p.block_table + (int64_t)s * p.max_blocks;
    constexpr int ESZ = kFp8 ? 1 : 2;                    /* bytes a K/V value */
    const int64_t row_bytes = (int64_t)p.n_head_kv * D * ESZ; /* a slot's row of every KV head */
    const int part = tid % LCPR, jrow = tid / LCPR;
    const char *kbase = reinterpret_cast<const char *>(p.k_pages) + ((int64_t)kvh * D + part * (16 / ESZ)) * ESZ,
               *vbase = reinterpret_cast<const char *>(p.v_pages) + ((int64_t)kvh * D + part * (16 / ESZ)) * ESZ;
    /* this thread's chunk in a stage: padded rows, or (wgmma) column group part / 8, row jrow, chunk
     * (part mod 8) xor (jrow mod 8); the rows it copies are jrow + u kThreads / CPR, the same mod 8;
     * kFp8: byte part * 16 of row jrow of a staging stage, rows jrow + u kThreads / LCPR */
    static_assert(!kWg || (kThreads / CPR) % 8 == 0, "swizzle: a thread's rows agree mod 8");
    const uint32_t kv_off = kFp8 ? (uint32_t)(jrow * D + part * 16)
                            : kWg ? (uint32_t)((part / 8) * kKeys * 128 + jrow * 128 + (((part % 8) ^ (jrow % 8)) * 16))
                                  : (uint32_t)((jrow * RS + part * 8) * 2);
    const uint32_t sk0 = (kFp8 ? s8 : smem_u32(sK)) + kv_off,
                   sv0 = (kFp8 ? s8 + (uint32_t)(ST * kKeys * D) : smem_u32(sV)) + kv_off;
    /* The block-table entries of a tile are read one tile ahead of its copies (fetch_slots), so the
     * copies never wait on a dependent table load. slot[u]: the slot of this thread's u-th key, -1 at
     * or past ke. */
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
            const int64_t off = valid ? (int64_t)slot[u] * row_bytes : 0;
            const uint32_t so = kFp8 ? (uint32_t)(st * kKeys * D + u * (kThreads / LCPR) * D)
                                     : (uint32_t)(st * kKeys * KRS * 2 + u * (kThreads / CPR) * (kWg ? 128 : RS * 2));
            cp_async16(sk0 + so, kbase + off, valid);
            cp_async16(sv0 + so, vbase + off, valid);
        }
    };

    /* scores scale (log2 domain); E4M3 pages: times the KV head's K scale, one fp32 product */
    const float qscale = kFp8 ? __fmul_rn(p.qscale, p.k_fixed[kvh]) : p.qscale;
    /* this thread's two rows: warp * 16 + g (A) and + 8 (B) */
    int lim[2], first[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = warp * 16 + g + 8 * i;
        lim[i] = r < rows ? p.positions[t0 + r / nh] + 1 : 0;
        first[i] = p.window > 0 && lim[i] > p.window ? lim[i] - p.window : 0;
    }

    /* prologue: tiles 0 .. ST - 2 in flight (a group each, empty past ke), the slots of tile ST - 1 */
    int slot_next[LCPT];
    fetch_slots(kb, slot_next);
#pragma unroll
    for (int i = 0; i < ST - 1; i++) {
        if (kb + i * kKeys < ke) load_tile(slot_next, i);
        cp_async_commit();
        fetch_slots(kb + (i + 1) * kKeys, slot_next);
    }
    __syncthreads(); /* sQ written */

    /* Q fragments (A operand of Q K^T): loaded into registers once (wgmma at D = 64: again each tile, below) */
    uint32_t qf[KT][4];
    const uint32_t q_addr = smem_u32(sQ + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * QRS + (lane >> 4) * 8);
#pragma unroll
    for (int kk = 0; kk < KT; kk++) ldsm_x4(q_addr + kk * 32, qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);
    if constexpr (kOSmem) __syncthreads(); /* every warp has its Q before the region becomes the fold state */

    float o[ND][4];     /* this chunk's accumulator */
    constexpr int NOA = kFold && !kOSmem ? ND : 1;
    float oa[NOA][4];   /* the folded state (fold mode), when in registers */
    float m[2], l[2], Ms[2], Ls[2];
#pragma unroll
    for (int i = 0; i < 2; i++) m[i] = -INFINITY, l[i] = 0.0f, Ms[i] = -INFINITY, Ls[i] = 0.0f;
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[n][e] = 0.0f;
#pragma unroll
    for (int n = 0; n < NOA; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) oa[n][e] = 0.0f;
    if constexpr (kOSmem) {
#pragma unroll
        for (int e = 0; e < ND * 4; e++) sO[e * kThreads + tid] = 0.0f;
    }
    auto oa_ref = [&](int n, int e) -> float & {
        if constexpr (kOSmem) return sO[(n * 4 + e) * kThreads + tid];
        else return oa[n][e];
    };
    /* split mode: chunk c's partial of this thread's rows to the workspace */
    auto write_partial = [&](int c) {
        const float lsum[2] = {quad_sum(l[0]), quad_sum(l[1])}; /* the whole warp shuffles, before any lane leaves */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = warp * 16 + g + 8 * i;
            if (r >= rows) continue;
            const int64_t orow = (int64_t)(t0 + r / nh) * p.n_head + h0 + r % nh;
            const float lc = lsum[i];
            const int64_t pr = orow * p.ws_stride + c;
            float *dst = p.ws_acc + pr * D;
#pragma unroll
            for (int n = 0; n < ND; n++)
                *reinterpret_cast<float2 *>(dst + n * 8 + 2 * tq) = make_float2(o[n][2 * i], o[n][2 * i + 1]);
            if (tq == 0) p.ws_ml[pr] = make_float2(m[i], lc);
        }
    };

    const int krow_l = (lane & 7) + ((lane >> 4) << 3), kcol_l = ((lane >> 3) & 1) * 8; /* K ldmatrix */
    const int vrow_l = (lane & 7) + ((lane >> 3) & 1) * 8, vcol_l = (lane >> 4) * 8;    /* V ldmatrix.trans */
    const uint32_t k_lane = smem_u32(sK + krow_l * RS + kcol_l), v_lane = smem_u32(sV + vrow_l * RS + vcol_l);

    int stage = 0, stage_load = ST - 1;
    for (int k0 = kb; k0 < ke; k0 += kKeys) {
        const bool more = k0 + kKeys < ke;
        cp_async_wait<ST - 2>(); /* this thread's copies of tile k0 have landed */
        if constexpr (kWg) fence_proxy_async(); /* ... and are visible to wgmma */
        __syncthreads();         /* everyone's have, and every warp is done with the stage refilled next */
        if (k0 + (ST - 1) * kKeys < ke) {
            load_tile(slot_next, stage_load);
            fetch_slots(k0 + ST * kKeys, slot_next); /* lands while this tile computes */
        }
        cp_async_commit();
        stage_load = stage_load + 1 == ST ? 0 : stage_load + 1;
        if constexpr (kFp8) {
            /* the tile's codes -> its f16 tile, once: a 16-byte chunk of codes (row r, values 16 pp ..)
             * becomes the f16 chunks 2 pp and 2 pp + 1 of row r, swizzled as the loads of f16 pages are
             * (every warp's products of the previous tile were awaited before the barrier above) */
            const uint32_t ck = s8 + (uint32_t)(stage * kKeys * D), cv = ck + (uint32_t)(ST * kKeys * D);
#pragma unroll
            for (int j = 0; j < kKeys * (D / 16) / kThreads; j++) {
                const int c = tid + kThreads * j, r = c / (D / 16), pp = c % (D / 16);
                const uint32_t src = (uint32_t)(r * D + pp * 16);
                const uint32_t dst = (uint32_t)((pp / 4) * kKeys * 128 + r * 128);
                const uint32_t o0 = (uint32_t)((((2 * pp) % 8) ^ (r % 8)) * 16), o1 = (uint32_t)((((2 * pp + 1) % 8) ^ (r % 8)) * 16);
#pragma unroll
                for (int kv = 0; kv < 2; kv++) {
                    uint32_t w0, w1, w2, w3;
                    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                                 : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3)
                                 : "r"((kv ? cv : ck) + src));
                    uint32_t h[8];
                    e4m3x4_to_f16x4(w0, h[0], h[1]), e4m3x4_to_f16x4(w1, h[2], h[3]);
                    e4m3x4_to_f16x4(w2, h[4], h[5]), e4m3x4_to_f16x4(w3, h[6], h[7]);
                    const uint32_t base = smem_u32(kv ? sV : sK) + dst;
                    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(base + o0), "r"(h[0]), "r"(h[1]),
                                 "r"(h[2]), "r"(h[3])
                                 : "memory");
                    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(base + o1), "r"(h[4]), "r"(h[5]),
                                 "r"(h[6]), "r"(h[7])
                                 : "memory");
                }
            }
            fence_proxy_async(); /* the f16 tile is read by wgmma */
            __syncthreads();
        }

        const uint32_t st_off = kFp8 ? 0u : (uint32_t)(stage * kKeys * KRS * 2);
        const uint32_t tK = k_lane + st_off, tV = v_lane + st_off;
        /* a warp with no rows (decode: one token's heads) only loads, under mma.sync; wgmma needs the
         * whole warpgroup (its rows are zeros and fully masked) */
        if (kWg || warp * 16 < rows) {
        /* S = Q K^T */
        float sc[NB][4];
#pragma unroll
        for (int n = 0; n < NB; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
        if constexpr (kWg) {
            static_assert(NB == 8, "S is m64n64");
            /* k-step kk: d [16 kk, 16 kk + 16) = column group kk / 4, bytes 32 (kk mod 4) of each row */
            const uint32_t kst = smem_u32(sK) + st_off;
            /* At D = 64 ptxas (CUDA 13.0) gave the loop-invariant A registers of this product to other
             * values after the first tile's wait (seen in the SASS: the P fragments and mask temporaries
             * in Q's registers; every tile after the first then multiplied by garbage; D = 128 kept
             * them). Reloading Q from shared memory each tile (sQ is not reused at D = 64) keeps the
             * A registers' life inside one tile. (Q read by descriptor instead, with the fold state in
             * registers, measured 5 % slower at D = 128: bench/gpu/NOTES.md.) */
            if constexpr (D == 64) {
#pragma unroll
                for (int kk = 0; kk < KT; kk++) ldsm_x4(q_addr + kk * 32, qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);
            }
            /* every register a wgmma reads (A: qf, accumulators) is written before the fence, and the
             * A registers stay live until the wait (the products read them asynchronously) */
            wg_fence_operands(sc);
            if constexpr (D == 64) wg_fence_operands(qf);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < KT; kk++)
                wgmma_m64n64<0>(sc, qf[kk], wg_desc(kst + (uint32_t)((kk / 4) * kKeys * 128 + (kk % 4) * 32), 16, 1024), kk > 0);
            wg_commit();
            wg_wait_all();
            wg_fence_operands(sc);
            if constexpr (D == 64) wg_fence_operands(qf); /* the reloaded A registers live to the wait */
        } else {
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
#pragma unroll
            for (int n2 = 0; n2 < NB / 2; n2++) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4(tK + (uint32_t)((n2 * 16 * RS + kk * 16) * 2), b0, b1, b2, b3);
                mma16816(sc[2 * n2], qf[kk], b0, b1);
                mma16816(sc[2 * n2 + 1], qf[kk], b2, b3);
            }
        }
        }
        /* scale, mask, online softmax (rows A: elements 0, 1; B: 2, 3); under wgmma a warp with no rows
         * only takes part in the products, with P = 0 */
        if (!kWg || warp * 16 < rows) {
#pragma unroll
        for (int n = 0; n < NB; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) sc[n][e] = __fmul_rn(sc[n][e], qscale); /* no contraction: same bits everywhere */
        if (k0 + kKeys > min(lim[0], lim[1]) || k0 < max(first[0], first[1])) { /* a causal or window edge */
#pragma unroll
            for (int n = 0; n < NB; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = e >> 1, key = k0 + n * 8 + 2 * tq + (e & 1);
                    if (key >= lim[i] || key < first[i]) sc[n][e] = -INFINITY;
                }
        }
        float alpha[2];
        /* the chunk's o is still all zeros (no key of the row so far in this chunk) */
        const bool o_zero[2] = {m[0] == -INFINITY, m[1] == -INFINITY};
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < NB; n++) mx = fmaxf(mx, fmaxf(sc[n][2 * i], sc[n][2 * i + 1]));
            const float m_new = fmaxf(m[i], quad_max(mx));
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;
            alpha[i] = ex2(m[i] - m_use);
            float ls = 0.0f;
#pragma unroll
            for (int n = 0; n < NB; n++) {
                sc[n][2 * i] = ex2(__fsub_rn(sc[n][2 * i], m_use));
                sc[n][2 * i + 1] = ex2(__fsub_rn(sc[n][2 * i + 1], m_use));
                ls = __fadd_rn(ls, __fadd_rn(sc[n][2 * i], sc[n][2 * i + 1]));
            }
            l[i] = __fmaf_rn(l[i], alpha[i], ls);
            m[i] = m_new;
        }
        /* o *= alpha, skipped (wgmma) where every row of the warp keeps its max (alpha 1) or has
         * nothing in o yet (o 0): the same bits, 64 multiplies fewer on most tiles of a long row */
        if (!kWg || !__all_sync(0xffffffffu, (alpha[0] == 1.0f || o_zero[0]) && (alpha[1] == 1.0f || o_zero[1]))) {
#pragma unroll
            for (int n = 0; n < ND; n++) {
                o[n][0] = __fmul_rn(o[n][0], alpha[0]), o[n][1] = __fmul_rn(o[n][1], alpha[0]);
                o[n][2] = __fmul_rn(o[n][2], alpha[1]), o[n][3] = __fmul_rn(o[n][3], alpha[1]);
            }
        }
        } else {
#pragma unroll
            for (int n = 0; n < NB; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
        }
        /* O += P V */
        if constexpr (kWg) {
            /* k-step j: keys [16 j, 16 j + 16) = rows 16 j .. of every column group; B is N-major (D
             * contiguous): column groups kKeys * 128 bytes apart, 8-row groups 1024 */
            const uint32_t vst = smem_u32(sV) + st_off;
            uint32_t pa[kKeys / 16][4];
#pragma unroll
            for (int j = 0; j < kKeys / 16; j++) {
                pa[j][0] = pack_f16x2(sc[2 * j][0], sc[2 * j][1]), pa[j][1] = pack_f16x2(sc[2 * j][2], sc[2 * j][3]);
                pa[j][2] = pack_f16x2(sc[2 * j + 1][0], sc[2 * j + 1][1]);
                pa[j][3] = pack_f16x2(sc[2 * j + 1][2], sc[2 * j + 1][3]);
            }
            wg_fence_operands(o);
            wg_fence_operands(pa);
            wg_fence();
#pragma unroll
            for (int j = 0; j < kKeys / 16; j++) {
                const uint64_t dv = wg_desc(vst + (uint32_t)(j * 16 * 128), (uint32_t)(kKeys * 128), 1024);
                if constexpr (D == 128) wgmma_m64n128<1>(o, pa[j], dv, 1);
                else wgmma_m64n64<1>(o, pa[j], dv, 1);
            }
            wg_commit();
            wg_wait_all();
            wg_fence_operands(o);
            wg_fence_operands(pa);
        } else {
#pragma unroll
        for (int j = 0; j < kKeys / 16; j++) {
            const uint32_t a[4] = {pack_f16x2(sc[2 * j][0], sc[2 * j][1]), pack_f16x2(sc[2 * j][2], sc[2 * j][3]),
                                   pack_f16x2(sc[2 * j + 1][0], sc[2 * j + 1][1]),
                                   pack_f16x2(sc[2 * j + 1][2], sc[2 * j + 1][3])};
#pragma unroll
            for (int d2 = 0; d2 < ND / 2; d2++) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4_t(tV + (uint32_t)((j * 16 * RS + d2 * 16) * 2), b0, b1, b2, b3);
                mma16816(o[2 * d2], a, b0, b1);
                mma16816(o[2 * d2 + 1], a, b2, b3);
            }
        }
        }

        /* chunk end: fold (fold mode) or write the chunk's partial (split mode), then a fresh chunk */
        if ((k0 + kKeys) % kChunk == 0 || !more) {
            if constexpr (kFold) {
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    float wA, wc;
                    const float lc = quad_sum(l[i]);
                    if (fold_state(Ms[i], Ls[i], m[i], lc, wA, wc)) {
#pragma unroll
                        for (int n = 0; n < ND; n++) {
                            float &a0 = oa_ref(n, 2 * i), &a1 = oa_ref(n, 2 * i + 1);
                            a0 = fold_elem(a0, wA, o[n][2 * i], wc);
                            a1 = fold_elem(a1, wA, o[n][2 * i + 1], wc);
                        }
                    }
                }
            } else {
                write_partial(k0 / kChunk);
            }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
                for (int n = 0; n < ND; n++) o[n][2 * i] = o[n][2 * i + 1] = 0.0f;
            }
        }
        } /* warp has rows */
        stage = stage + 1 == ST ? 0 : stage + 1;
    }
    cp_async_wait<0>();

    /* fold mode: out = O / L for this thread's rows A and B, columns n * 8 + 2 tq, + 1 */
    if constexpr (kFold) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = warp * 16 + g + 8 * i;
            if (r >= rows) continue;
            const int64_t orow = (int64_t)(t0 + r / nh) * p.n_head + h0 + r % nh;
            const float inv = out_scale(Ls[i]);
            uint16_t *dst = p.out + orow * D;
            /* E4M3 pages: out = (O / L) scale_v, as merge_kernel forms it in split mode */
            auto outv = [&](float a) { return kFp8 ? __fmul_rn(__fmul_rn(a, inv), p.v_fixed[kvh]) : __fmul_rn(a, inv); };
#pragma unroll
            for (int n = 0; n < ND; n++) {
                const uint32_t w = (uint32_t)osp_f_to_bf16(outv(oa_ref(n, 2 * i))) |
                                   ((uint32_t)osp_f_to_bf16(outv(oa_ref(n, 2 * i + 1))) << 16);
                *reinterpret_cast<uint32_t *>(dst + n * 8 + 2 * tq) = w;
            }
        }
    }
}

/* Split mode's second kernel: a warp per (output row (t, h), 32 dimensions), lane d owning dimension d,
 * folds the chunks 0 .. ceil((pos + 1) / kChunk) - 1 of its row in order and writes out = O / L. The
 * fold is sequential; its loads are not: the row's partials are contiguous in the workspace ([row]
 * [chunk], Params::ws_stride chunks a row), and rounds of kMergeRound chunks (their accumulators and
 * (m, l)) land by cp.async in shared memory kMergeStages - 1 rounds ahead of the fold (48 KiB in flight
 * a row at D = 128, over 4 SMs: batch-1 decode at 128k folds 512 chunks a row, which waited on 32 dependent load
 * round trips when a warp fetched 32 chunks' (m, l) and only then their accumulators). The weights of a
 * round come from the same values by the same operations as fold_state's (below), so the bits are
 * fold mode's. */
constexpr int kMergeRound = 32, kMergeStages = 4, kMergeDims = 32;
constexpr int kMergeSmem = kMergeStages * kMergeRound * (kMergeDims * (int)sizeof(float) + (int)sizeof(float2));
/* grid (rows, D / kMergeDims), a warp a CTA: CTA (row, y) folds dimensions [32 y, 32 y + 32) of the row
 * (every CTA of the row computes the same weights), so batch-1 decode's 32 rows keep 128 SMs loading */
template <int D>
__global__ void __launch_bounds__(kMergeDims) merge_kernel(const float *ws_acc, const float2 *ws_ml, uint16_t *out,
                                                           const int32_t *positions, int n_head, int ws_stride,
                                                           const float *v_fixed, int group) {
    osp_pdl_begin();
    constexpr int R = kMergeRound, S = kMergeStages, W = kMergeDims;
    static_assert(D % W == 0 && R * W / 4 % W == 0 && R / 2 <= W, "a round's 16-byte copies spread evenly");
    extern __shared__ float4 merge_smem[];
    float *sA = reinterpret_cast<float *>(merge_smem); /* [S][R][W] */
    float2 *sML = reinterpret_cast<float2 *>(sA + S * R * W); /* [S][R] */
    const int lane = (int)threadIdx.x, dim = (int)blockIdx.y * W + lane;
    const int64_t row = (int64_t)blockIdx.x;
    const int nch = (positions[row / n_head] + 1 + kChunk - 1) / kChunk;
    const int rounds = (nch + R - 1) / R;
    const float *arow = ws_acc + row * ws_stride * D + (int)blockIdx.y * W;
    const float2 *mlrow = ws_ml + row * ws_stride; /* 16-byte aligned: ws_stride is even */
    /* round r into stage r mod S; chunks at or past nch are zero-filled (l = 0) and never folded */
    auto issue = [&](int r) {
        const int st = r % S, c0 = r * R;
#pragma unroll
        for (int i = 0; i < R * W / 4 / W; i++) {
            const int idx = lane + i * W, u = idx / (W / 4), part = idx % (W / 4);
            const bool valid = c0 + u < nch;
            cp_async16(smem_u32(sA + (st * R + u) * W + part * 4), valid ? arow + (int64_t)(c0 + u) * D + part * 4 : arow,
                       valid);
        }
        if (lane < R / 2) {
            const bool valid = c0 + 2 * lane < nch;
            cp_async16(smem_u32(sML + st * R + 2 * lane), valid ? mlrow + c0 + 2 * lane : mlrow, valid);
        }
    };
#pragma unroll
    for (int r = 0; r < S - 1; r++) {
        if (r < rounds) issue(r);
        cp_async_commit();
    }
    float M = -INFINITY, L = 0.0f, A = 0.0f;
    for (int r = 0; r < rounds; r++) {
        cp_async_wait<S - 2>(); /* round r has landed (this thread's copies) */
        __syncwarp();           /* everyone's, and every lane is done with round r - 1's stage */
        if (r + S - 1 < rounds) issue(r + S - 1);
        cp_async_commit();
        const int st = r % S, n = min(R, nch - r * R);
        /* The round's weights, a chunk a lane (every warp alike): chunk u's state before it, M_prev =
         * max(M, the valid m of chunks < u) (fmax is exact, so a prefix max by shuffles is the running
         * max of the sequential fold), and fold_state's weights from it, first chunk (M_prev -inf)
         * included. Only the accumulator chains (one FFMA a chunk) stay sequential: with fold_state a
         * chunk at a time, the fold waited on two ex2 and a branch each chunk (43 us of batch-1
         * decode at 128k under ncu). */
        const float2 mlu = sML[st * R + lane];
        const bool valid = lane < n && mlu.y > 0.0f;
        const unsigned vmask = __ballot_sync(0xffffffffu, valid);
        float incl = valid ? mlu.x : -INFINITY;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const float y = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl = fmaxf(incl, y);
        }
        const float excl = __shfl_up_sync(0xffffffffu, incl, 1);
        const float Mprev = lane == 0 ? M : fmaxf(M, excl);
        float wAu = 0.0f, wcu = 1.0f; /* the first chunk: the state becomes the chunk's */
        if (valid && Mprev != -INFINITY) {
            const float Mn = fmaxf(Mprev, mlu.x);
            wAu = ex2(Mprev - Mn), wcu = ex2(mlu.x - Mn);
        }
        M = fmaxf(M, __shfl_sync(0xffffffffu, incl, 31));
        float a[R];
#pragma unroll
        for (int u = 0; u < R; u++) a[u] = sA[(st * R + u) * W + lane];
#pragma unroll
        for (int u = 0; u < R; u++) {
            const float wA = __shfl_sync(0xffffffffu, wAu, u), wc = __shfl_sync(0xffffffffu, wcu, u);
            const float lu = __shfl_sync(0xffffffffu, mlu.y, u);
            if (vmask >> u & 1u) {
                L = __fmaf_rn(L, wA, __fmul_rn(lu, wc)); /* fold_state's L (first: 0 x 0 + l = l) */
                A = fold_elem(A, wA, a[u], wc);
            }
        }
    }
    cp_async_wait<0>();
    const float o = __fmul_rn(A, out_scale(L));
    /* E4M3 pages (v_fixed: the layer's V scales a KV head): times the row's KV head's, as fold mode */
    out[row * D + dim] = osp_f_to_bf16(v_fixed ? __fmul_rn(o, v_fixed[(row % n_head) / group]) : o);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
/* split mode's partials a row in the workspace: the launch's chunk count rounded up to even, so every
 * row's (m, l) starts 16-byte aligned */
int64_t ws_stride_of(int32_t max_seq_len) { return (ceil_div(max_seq_len, kChunk) + 1) / 2 * 2; }

int sm_count() {
    static int cached[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
    if (!cached[dev]) {
        int n = 0;
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 132;
        cached[dev] = n;
    }
    return cached[dev];
}

/* Stage counts a launch may use (K/V tiles in flight); each one instantiated for both modes. */
constexpr int kMaxStages = 4;

/* kind of the K/V tile path: mma.sync on f16 pages, wgmma on f16 pages, wgmma on E4M3 pages */
enum { kKindSync = 0, kKindWg = 1, kKindWgFp8 = 2 };

template <int D, int ST, bool kFold, int kKind> osp_status launch_kernel(const Params &prm, dim3 grid, cudaStream_t st) {
    constexpr bool kWg = kKind != kKindSync, kFp8 = kKind == kKindWgFp8;
    constexpr int smem = smem_bytes<D, ST, kFold, kWg, kFp8>();
    static_assert(smem <= 227 * 1024, "shared memory of one CTA");
    if (smem > 48 * 1024)
        OSP_CUDA_TRY(cudaFuncSetAttribute(attn_mma_kernel<D, ST, kFold, kWg, kFp8>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    osp_launch(attn_mma_kernel<D, ST, kFold, kWg, kFp8>, grid, kThreads, smem, st, prm);
    OSP_CUDA_LAUNCH_CHECK("attn_mma_kernel");
    return OSP_OK;
}

template <int D, bool kFold, int kKind> osp_status launch_stages(const Params &prm, dim3 grid, int stages, cudaStream_t st) {
    switch (stages) {
    case 3: return launch_kernel<D, 3, kFold, kKind>(prm, grid, st);
    case 4: return launch_kernel<D, 4, kFold, kKind>(prm, grid, st);
    default: return launch_kernel<D, 2, kFold, kKind>(prm, grid, st);
    }
}

template <int D, int kKind> int smem_of_kind(int stages, bool fold) {
    constexpr bool kWg = kKind != kKindSync, kFp8 = kKind == kKindWgFp8;
    switch (stages) {
    case 3: return fold ? smem_bytes<D, 3, true, kWg, kFp8>() : smem_bytes<D, 3, false, kWg, kFp8>();
    case 4: return fold ? smem_bytes<D, 4, true, kWg, kFp8>() : smem_bytes<D, 4, false, kWg, kFp8>();
    default: return fold ? smem_bytes<D, 2, true, kWg, kFp8>() : smem_bytes<D, 2, false, kWg, kFp8>();
    }
}
template <int D> int smem_of(int stages, bool fold, int kind) {
    if constexpr (D >= 64) {
        if (kind == kKindWg) return smem_of_kind<D, kKindWg>(stages, fold);
        if (kind == kKindWgFp8) return smem_of_kind<D, kKindWgFp8>(stages, fold);
    }
    return smem_of_kind<D, kKindSync>(stages, fold);
}

template <int D, int kKind>
osp_status launch_mode(const Params &prm, dim3 grid, int stages, bool split, cudaStream_t st) {
    return split ? launch_stages<D, false, kKind>(prm, grid, stages, st) : launch_stages<D, true, kKind>(prm, grid, stages, st);
}

/* split mode's merge of the partials in prm's workspace into prm.out */
template <int D> osp_status merge_launch(const Params &prm, cudaStream_t st) {
    const int64_t nrow = (int64_t)prm.T * prm.n_head;
    static_assert(kMergeSmem <= 48 * 1024, "the merge's shared memory");
    osp_launch(merge_kernel<D>, dim3((unsigned)nrow, D / kMergeDims), kMergeDims, kMergeSmem, st, prm.ws_acc,
               prm.ws_ml, prm.out, prm.positions, prm.n_head, prm.ws_stride, prm.v_fixed,
               prm.fixed_per_tensor ? prm.n_head : prm.n_head / prm.n_head_kv); /* per tensor: index 0 always */
    OSP_CUDA_LAUNCH_CHECK("attention merge_kernel");
    return OSP_OK;
}

template <int D>
osp_status launch(const Params &prm, unsigned n_tiles, unsigned n_groups, int stages, bool split, int kind, cudaStream_t st) {
    const dim3 grid(n_tiles, (unsigned)(prm.n_head_kv * prm.tl.head_chunks), split ? n_groups : 1u);
    osp_status rc;
    if constexpr (D >= 64)
        rc = kind == kKindWgFp8 ? launch_mode<D, kKindWgFp8>(prm, grid, stages, split, st)
             : kind == kKindWg  ? launch_mode<D, kKindWg>(prm, grid, stages, split, st)
                                : launch_mode<D, kKindSync>(prm, grid, stages, split, st);
    else rc = launch_mode<D, kKindSync>(prm, grid, stages, split, st);
    if (rc != OSP_OK || !split) return rc;
    return merge_launch<D>(prm, st);
}

/* CTAs of one launch resident on an SM: shared memory (228 KiB an SM, 1 KiB reserved a CTA) and
 * registers (__launch_bounds__: 2) */
int ctas_per_sm(int smem) {
    const int n = (228 * 1024) / (smem + 1024);
    return n < 1 ? 1 : n > 2 ? 2 : n;
}

/* launch tuning (osp_cuda_attention_v1_tune; 0: the default) */
int g_fold_stages = 0, g_split_stages = 0, g_split_waves = 0, g_chunks_per_cta = 0;
constexpr int kFoldStages = 2, kSplitStages = 2, kSplitWaves = 1;

/* fold mode's CTA order (osp_cuda_attention_tile_order) */
bool g_heavy_first = true;

/* v3 (osp_cuda_attention_ws): -1 not read yet; then OSP_CUDA_ATTN_WS_* (OSPREY_CUDA_ATTN_WS=off / on /
 * pingpong, unset: the default); and its K/V stages (0: the default) */
int g_ws_mode = -1, g_ws_stages = 0;
constexpr int kWsStages = 4;
int ws_mode() {
    if (g_ws_mode < 0) {
        const char *e = getenv("OSPREY_CUDA_ATTN_WS");
        g_ws_mode = !e ? OSP_CUDA_ATTN_WS_DEFAULT
                    : !strcmp(e, "off") ? OSP_CUDA_ATTN_WS_OFF
                    : !strcmp(e, "on") ? OSP_CUDA_ATTN_WS_ON
                    : !strcmp(e, "pingpong") ? OSP_CUDA_ATTN_WS_PINGPONG
                                             : OSP_CUDA_ATTN_WS_DEFAULT;
    }
    return g_ws_mode;
}

/* v4 (osp_cuda_attention_dec): -1 not read yet; then OSP_CUDA_ATTN_DEC_* (OSPREY_CUDA_ATTN_DEC=off / auto
 * / decode / all, unset: the default) */
int g_dec_mode = -1;
int dec_mode() {
    if (g_dec_mode < 0) {
        const char *e = getenv("OSPREY_CUDA_ATTN_DEC");
        g_dec_mode = !e ? OSP_CUDA_ATTN_DEC_DEFAULT
                     : !strcmp(e, "off") ? OSP_CUDA_ATTN_DEC_OFF
                     : !strcmp(e, "auto") ? OSP_CUDA_ATTN_DEC_AUTO
                     : !strcmp(e, "decode") ? OSP_CUDA_ATTN_DEC_DECODE
                     : !strcmp(e, "all") ? OSP_CUDA_ATTN_DEC_ALL
                                         : OSP_CUDA_ATTN_DEC_DEFAULT;
    }
    return g_dec_mode;
}

/* -1: not read yet; then the mode OSPREY_CUDA_ATTENTION names (v0 / v1 / v2 / fold / split; unset: auto)
 * or the one a test forced */
int g_force_mode = -1;
/* the matrix instruction of auto, fold and split mode (osp_cuda_attention_force_mma) */
int g_force_mma = OSP_CUDA_ATTN_MMA_AUTO;

} // namespace

extern "C" void osp_cuda_attention_force_mode(int mode) { g_force_mode = mode; }
extern "C" void osp_cuda_attention_force_mma(int mma) { g_force_mma = mma; }
extern "C" void osp_cuda_attention_tile_order(int heavy_first) { g_heavy_first = heavy_first != 0; }
extern "C" void osp_cuda_attention_ws(int mode, int stages) {
    g_ws_mode = mode >= OSP_CUDA_ATTN_WS_OFF && mode <= OSP_CUDA_ATTN_WS_PINGPONG ? mode : -1;
    g_ws_stages = stages == 3 || stages == 4 ? stages : 0;
}
extern "C" void osp_cuda_attention_dec(int mode) {
    g_dec_mode = mode >= OSP_CUDA_ATTN_DEC_OFF && mode <= OSP_CUDA_ATTN_DEC_ALL ? mode : -1;
}
extern "C" void osp_cuda_attention_v1_tune(int fold_stages, int split_stages, int split_waves, int chunks_per_cta) {
    g_fold_stages = fold_stages >= 2 && fold_stages <= kMaxStages ? fold_stages : 0;
    g_split_stages = split_stages >= 2 && split_stages <= kMaxStages ? split_stages : 0;
    g_split_waves = split_waves > 0 ? split_waves : 0;
    g_chunks_per_cta = chunks_per_cta > 0 ? chunks_per_cta : 0;
}
extern "C" int osp_cuda_attention_forced_mode(void) {
    if (g_force_mode < 0) {
        const char *e = getenv("OSPREY_CUDA_ATTENTION");
        g_force_mode = !e ? OSP_CUDA_ATTN_AUTO
                       : !strcmp(e, "v0") ? OSP_CUDA_ATTN_V0
                       : !strcmp(e, "v1") ? OSP_CUDA_ATTN_V1
                       : !strcmp(e, "v2") ? OSP_CUDA_ATTN_V2
                       : !strcmp(e, "fold") ? OSP_CUDA_ATTN_FOLD
                       : !strcmp(e, "split") ? OSP_CUDA_ATTN_SPLIT
                                             : OSP_CUDA_ATTN_AUTO;
    }
    return g_force_mode;
}

extern "C" bool osp_cuda_attention_v1_supported(uint32_t kv_type, int D) {
    return (kv_type == OSP_KV_PAGE_F16 && (D == 32 || D == 64 || D == 128)) ||
           (kv_type == OSP_KV_PAGE_FP8 && (D == 64 || D == 128));
}

extern "C" bool osp_cuda_attention_v2_supported(uint32_t kv_type, int D) {
    return (kv_type == OSP_KV_PAGE_F16 || kv_type == OSP_KV_PAGE_FP8) && (D == 64 || D == 128);
}

extern "C" bool osp_cuda_attention_tc_serves(uint32_t kv_type, int D) {
    const int mode = osp_cuda_attention_forced_mode();
    if (kv_type == OSP_KV_PAGE_FP8) return osp_cuda_attention_uses_wgmma(mode, g_force_mma, kv_type, D);
    return osp_cuda_attention_uses_v1(mode, kv_type, D);
}

extern "C" bool osp_cuda_attention_uses_v1(int mode, uint32_t kv_type, int D) {
    const bool v1 = mode == OSP_CUDA_ATTN_V1 || mode == OSP_CUDA_ATTN_V2 || mode == OSP_CUDA_ATTN_FOLD ||
                    mode == OSP_CUDA_ATTN_SPLIT || (mode == OSP_CUDA_ATTN_AUTO && OSP_CUDA_ATTN_V1_DEFAULT);
    return v1 && osp_cuda_attention_v1_supported(kv_type, D);
}

extern "C" bool osp_cuda_attention_uses_wgmma(int mode, int mma, uint32_t kv_type, int D) {
    if (!osp_cuda_attention_uses_v1(mode, kv_type, D) || !osp_cuda_attention_v2_supported(kv_type, D)) return false;
    if (mode == OSP_CUDA_ATTN_V1) return false;
    if (mode == OSP_CUDA_ATTN_V2) return true;
    return mma == OSP_CUDA_ATTN_MMA_WGMMA || (mma == OSP_CUDA_ATTN_MMA_AUTO && OSP_CUDA_ATTN_V2_DEFAULT);
}

extern "C" size_t osp_cuda_attention_v1_split_bytes(int64_t tokens, int n_head, int D, int32_t max_seq_len) {
    if (tokens <= 0 || n_head <= 0 || D <= 0 || max_seq_len <= kChunk) return 0;
    const int64_t chunks = ws_stride_of(max_seq_len);
    return (size_t)(tokens * n_head * chunks) * ((size_t)D * sizeof(float) + sizeof(float2));
}

extern "C" int64_t osp_cuda_attention_chunk_stride(int32_t max_seq_len) { return ws_stride_of(max_seq_len); }

extern "C" osp_status osp_cuda_attention_merge_chunks(const float *d_ws_acc, const void *d_ws_ml, uint16_t *d_out,
                                                      const int32_t *d_positions, int64_t T, int n_head, int D,
                                                      int64_t ws_stride, void *stream) {
    if (T <= 0) return OSP_OK;
    if (!d_ws_acc || !d_ws_ml || !d_out || !d_positions || n_head <= 0 || ws_stride < 1 || (ws_stride & 1) ||
        (D != 32 && D != 64 && D != 128 && D != 256))
        return osp_set_error(OSP_ERR_INVALID_ARG, "cuda attention merge: bad arguments (T %lld, n_head %d, D %d, "
                                                  "stride %lld)", (long long)T, n_head, D, (long long)ws_stride);
    Params prm;
    memset(&prm, 0, sizeof prm);
    prm.ws_acc = const_cast<float *>(d_ws_acc);
    prm.ws_ml = static_cast<float2 *>(const_cast<void *>(d_ws_ml));
    prm.out = d_out;
    prm.positions = d_positions;
    prm.T = (int32_t)T;
    prm.n_head = n_head;
    prm.n_head_kv = n_head;
    prm.ws_stride = (int)ws_stride;
    prm.v_fixed = nullptr;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    switch (D) {
    case 32: return merge_launch<32>(prm, st);
    case 64: return merge_launch<64>(prm, st);
    case 128: return merge_launch<128>(prm, st);
    default: return merge_launch<256>(prm, st);
    }
}

extern "C" bool osp_cuda_attention_v4_nvfp4(int mode, int D, int group) {
    return mode != OSP_CUDA_ATTN_V0 && (D == 64 || D == 128) && dec_rows(group) > 0;
}

extern "C" osp_status osp_cuda_paged_attention_v1(const uint16_t *d_q, const void *d_k_pages, const void *d_v_pages,
                                                  uint32_t kv_type, const float *d_k_fixed, const float *d_v_fixed,
                                                  const uint8_t *d_k_scale, const uint8_t *d_v_scale,
                                                  uint16_t *d_out, int32_t num_seqs, const int32_t *d_query_start_loc,
                                                  const int32_t *d_positions, const int32_t *d_block_table,
                                                  int32_t max_blocks, int32_t block_size, int64_t T, int n_head,
                                                  int n_head_kv, int D, float scale, int32_t window,
                                                  int32_t max_seq_len, void *d_workspace, void *stream) {
    Params prm;
    prm.tl = attn_tiling(T, num_seqs, n_head, n_head_kv, kRows);
    const int64_t n_tiles = prm.tl.n_tiles;
    const int64_t ctas = n_tiles * n_head_kv * prm.tl.head_chunks;
    if (n_tiles > INT32_MAX || (int64_t)n_head_kv * prm.tl.head_chunks > 65535)
        return osp_set_error(OSP_ERR_INVALID_ARG, "cuda paged attention: batch too large for one launch");
    const int64_t n_chunks = ceil_div(max_seq_len, kChunk);
    const size_t need = osp_cuda_attention_v1_split_bytes(T, n_head, D, max_seq_len);
    /* split when the query tiles alone leave the GPU (2 CTAs per SM) under-filled and the partials fit
     * the workspace budget (osp_cuda_attention_workspace_bytes allocates at most that) */
    const bool can_split = n_chunks > 1 && n_chunks <= 65535 && need <= OSP_CUDA_ATTN_SPLIT_BUDGET;
    const int forced = osp_cuda_attention_forced_mode();
    const bool fp8 = kv_type == OSP_KV_PAGE_FP8, nv = kv_type == OSP_KV_PAGE_NVFP4;
    const int group = n_head / n_head_kv;
    if (nv && (!osp_cuda_attention_v4_nvfp4(forced, D, group) || !d_k_fixed || !d_v_fixed || !d_k_scale || !d_v_scale))
        return osp_set_error(OSP_ERR_INVALID_ARG, "cuda paged attention: nvfp4 pages on tensor cores need v4 (D 64 / 128, "
                                                  "GQA groups up to 16) and their scales");
    const bool wg = osp_cuda_attention_uses_wgmma(forced, g_force_mma, kv_type, D);
    if (fp8 && (!wg || !d_k_fixed || !d_v_fixed))
        return osp_set_error(OSP_ERR_INVALID_ARG, "cuda paged attention: fp8 pages on tensor cores need wgmma (D 64 / "
                                                  "128) and their scales");
    const int kind = fp8 ? kKindWgFp8 : wg ? kKindWg : kKindSync;
    /* v4 (v2's bits) under the wgmma family where enabled: every launch it can serve (ALL), or launches
     * of at most 4 query tokens a sequence on average (decode, speculative verification; prefill is
     * v2's / v3's) on any page (DECODE) or on E4M3 pages (AUTO); NVFP4 pages always. In split mode
     * unless fold mode is forced or the partials cannot be kept, or its own tiles fill the GPU 4 times
     * over (8 .. 16 rows a CTA, up to 4 CTAs an SM) */
    const int dmode = dec_mode();
    const bool short_q = T <= 4 * (int64_t)num_seqs;
    const bool dec = nv || (wg && dec_rows(group) > 0 &&
                            (dmode == OSP_CUDA_ATTN_DEC_ALL || (dmode == OSP_CUDA_ATTN_DEC_DECODE && short_q) ||
                             (dmode == OSP_CUDA_ATTN_DEC_AUTO && short_q && fp8)));
    const AttnTiling dec_tl = attn_tiling(T, num_seqs, n_head, n_head_kv, dec ? dec_rows(group) : kRows);
    const int64_t dec_ctas = dec_tl.n_tiles * n_head_kv * dec_tl.head_chunks;
    const bool split = dec ? can_split && (forced == OSP_CUDA_ATTN_SPLIT ||
                                           (forced != OSP_CUDA_ATTN_FOLD && dec_ctas < 4 * (int64_t)sm_count()))
                       : forced == OSP_CUDA_ATTN_SPLIT ? can_split
                       : forced == OSP_CUDA_ATTN_FOLD  ? false
                                                       : can_split && ctas < 2 * sm_count();
    if (split && (!d_workspace || ((uintptr_t)d_workspace & 15u)))
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "cuda paged attention: a 16-byte aligned workspace of "
                             "osp_cuda_attention_workspace_bytes() is needed (max_seq_len %d)",
                             (int)max_seq_len);
    prm.q = d_q;
    prm.k_pages = static_cast<const uint16_t *>(d_k_pages);
    prm.v_pages = static_cast<const uint16_t *>(d_v_pages);
    prm.k_fixed = fp8 || nv ? d_k_fixed : nullptr;
    prm.v_fixed = fp8 || nv ? d_v_fixed : nullptr;
    prm.k_scale = nv ? d_k_scale : nullptr;
    prm.v_scale = nv ? d_v_scale : nullptr;
    prm.fixed_per_tensor = nv;
    prm.out = d_out;
    prm.qsl = d_query_start_loc;
    prm.positions = d_positions;
    prm.block_table = d_block_table;
    prm.ws_acc = split ? static_cast<float *>(d_workspace) : nullptr;
    prm.ws_stride = (int)ws_stride_of(max_seq_len);
    prm.ws_ml = split ? reinterpret_cast<float2 *>(prm.ws_acc + (size_t)prm.ws_stride * (size_t)T * n_head * D) : nullptr;
    prm.num_seqs = num_seqs;
    prm.max_blocks = max_blocks;
    prm.block_size = block_size;
    prm.T = (int32_t)T;
    prm.n_head = n_head;
    prm.n_head_kv = n_head_kv;
    prm.window = window > 0 ? window : 0;
    prm.bdiv = FastDiv::make(block_size);
    prm.qscale = scale * kLog2e;
    prm.heavy_first = g_heavy_first;
    /* split mode: each CTA computes chunks_per_cta consecutive chunks (a partial each); the count
     * minimizes the launch's time in chunk-times, waves x (chunks a CTA + half a chunk of a CTA's own
     * start and end), kSplitWaves x the resident CTAs a wave (host scalars only; the fewest chunks a
     * CTA among equals). At the 8B shape, B = 2 at 32,833 keys (129 chunks, 16 query tiles): 4 chunks
     * a CTA, 528 CTAs in two full waves, where spreading 2,064 chunks evenly over 264 resident CTAs
     * (8 a CTA) made 272 CTAs: a second wave of 8 (predicted to cost a whole wave; not yet measured). The shapes bench/gpu/tune.sh
     * measured (B 1 / 2 / 8 / 64 at 1k .. 128k) keep the counts they were measured with. */
    if (dec) {
        const int dkv = nv ? OSP_CUDA_DEC_NVFP4 : fp8 ? OSP_CUDA_DEC_FP8 : OSP_CUDA_DEC_F16;
        prm.tl = dec_tl;
        if (prm.tl.n_tiles > INT32_MAX || (int64_t)n_head_kv * prm.tl.head_chunks > 65535)
            return osp_set_error(OSP_ERR_INVALID_ARG, "cuda paged attention: batch too large for one launch");
        const int dstages = (split ? g_split_stages : g_fold_stages) ? (split ? g_split_stages : g_fold_stages)
                                                                     : dec_default_stages(dkv);
        int64_t per = n_chunks;
        if (split && !(per = g_chunks_per_cta)) {
            /* as below: the fewest chunk-times over the waves, ends of a CTA's run counted */
            const int dsmem = dec_smem_bytes(D, dkv, dec_rows(group), dstages);
            const int64_t res = (int64_t)sm_count() * (int64_t)min(4, 228 * 1024 / (dsmem + 1024)) *
                                (g_split_waves ? g_split_waves : kSplitWaves);
            /* the CTAs with work: a decode launch (one token a sequence) has one tile a sequence, not the
             * grid's tile slots (T / bq + num_seqs: with 2 tokens a tile, half the slots are empty, and
             * counting them put 2 CTAs an SM where 3 fit: SMs 27 % idle, ncu on an H100, fp8 B 8 at 32k) */
            const int64_t work = T == num_seqs ? (int64_t)num_seqs * n_head_kv * dec_tl.head_chunks : dec_ctas;
            int64_t best = INT64_MAX;
            for (int64_t c = 1; c <= n_chunks && 2 * c + 1 < best; c++) {
                const int64_t cost = ceil_div(ceil_div(n_chunks, c) * work, res) * (2 * c + 1);
                if (cost < best) best = cost, per = c;
            }
        }
        per = per < 1 ? 1 : per > n_chunks ? n_chunks : per;
        prm.chunks_per_cta = (int)per;
        cudaStream_t dst = static_cast<cudaStream_t>(stream);
        const osp_status rc = dec_launch(prm, !split, (unsigned)ceil_div(n_chunks, per), D, dkv, dstages, dst);
        if (rc != OSP_OK || !split) return rc;
        return D == 64 ? merge_launch<64>(prm, dst) : merge_launch<128>(prm, dst);
    }
    /* v3: fold mode at D 128 under wgmma, where enabled; its rows are v2's bits */
    if (!split && wg && !fp8 && D == 128 && ws_mode() != OSP_CUDA_ATTN_WS_OFF) {
        prm.tl = attn_tiling(T, num_seqs, n_head, n_head_kv, ws_rows());
        if (prm.tl.n_tiles > INT32_MAX)
            return osp_set_error(OSP_ERR_INVALID_ARG, "cuda paged attention: batch too large for one launch");
        prm.chunks_per_cta = 1;
        return ws_launch(prm, g_ws_stages ? g_ws_stages : kWsStages, ws_mode() == OSP_CUDA_ATTN_WS_PINGPONG, stream);
    }
    const int stages = split ? (g_split_stages ? g_split_stages : kSplitStages) : (g_fold_stages ? g_fold_stages : kFoldStages);
    const int smem = D == 32   ? smem_of<32>(stages, !split, kKindSync)
                     : D == 64 ? smem_of<64>(stages, !split, kind)
                               : smem_of<128>(stages, !split, kind);
    const int64_t resident = (int64_t)sm_count() * ctas_per_sm(smem) * (g_split_waves ? g_split_waves : kSplitWaves);
    int64_t per = g_chunks_per_cta;
    if (!per) {
        int64_t best = INT64_MAX;
        for (int64_t c = 1; c <= n_chunks && 2 * c + 1 < best; c++) {
            const int64_t cost = ceil_div(ceil_div(n_chunks, c) * ctas, resident) * (2 * c + 1);
            if (cost < best) best = cost, per = c;
        }
    }
    if (per < 1) per = 1;
    if (per > n_chunks) per = n_chunks;
    prm.chunks_per_cta = (int)per;
    const int64_t n_groups = ceil_div(n_chunks, per);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    switch (D) {
    case 32: return launch<32>(prm, (unsigned)n_tiles, (unsigned)n_groups, stages, split, kKindSync, st);
    case 64: return launch<64>(prm, (unsigned)n_tiles, (unsigned)n_groups, stages, split, kind, st);
    default: return launch<128>(prm, (unsigned)n_tiles, (unsigned)n_groups, stages, split, kind, st);
    }
}
