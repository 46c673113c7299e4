/* Paged attention v4: short query tiles (decode: one token's GQA group; speculative verification: a few
 * tokens of it) in split or fold mode, on f16, E4M3 and NVFP4 pages at head_dim 64 / 128 (issues 12, 13).
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


#include <math.h>
#include <stdint.h>

namespace osp_attn {
namespace {

constexpr int kThreads = 128; /* 4 warps */
constexpr int kKeys = 64;     /* keys a tile: v2's (part of the numerics) */
constexpr int kPS = kKeys + 8; /* P^T's shared row stride, halves (144 bytes: ldmatrix without conflicts) */

/* page formats (template KV): f16, E4M3 (read from the staged codes into the fragments), NVFP4 (each
 * tile's codes and micro-block scales staged, then widened once into an f16 tile the f16 path reads) */
constexpr int kPageF16 = OSP_CUDA_DEC_F16, kPageFp8 = OSP_CUDA_DEC_FP8, kPageNv = OSP_CUDA_DEC_NVFP4;

/* shared row stride of a K/V row the products read, bytes: padded by 16 so ldmatrix's 8 rows hit
 * distinct banks */
constexpr int row_bytes_of(int D, int KV) { return (KV == kPageFp8 ? D : 2 * D) + 16; }
template <int D, int KV> constexpr int row_bytes() { return row_bytes_of(D, KV); }
/* NVFP4: one stage of the codes (K then V, [kKeys][D / 2]) and scales (K then V, [kKeys][D / 16]) */
constexpr int nv_stage_of(int D) { return 2 * kKeys * (D / 2) + 2 * kKeys * (D / 16); }
template <int D> constexpr int nv_stage_bytes() { return nv_stage_of(D); }
/* a CTA's dynamic shared memory (host and device: the launch and the kernel's static check) */
constexpr int smem_of(int D, int KV, int NQ, int ST) {
    const int rb = row_bytes_of(D, KV);
    return (KV == kPageNv ? 2 * kKeys * rb + ST * nv_stage_of(D) : ST * 2 * kKeys * rb) +
           8 * NQ * kPS * 2 /* sP */ + 4 * 8 * NQ * 4 /* sMax */ + 8 * NQ * 32 * 4 /* sPair */ + 8 * NQ * 4 /* sLc */;
}
template <int D, int KV, int NQ, int ST> constexpr int smem_bytes() {
    return smem_of(D, KV, NQ, ST);
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
/* cp.async of 4 or 8 bytes (zero-filled when !valid) */
template <int N> __device__ __forceinline__ void cp_async_small(uint32_t dst, const void *src, bool valid) {
    static_assert(N == 4 || N == 8, "cp.async.ca size");
    const int n = valid ? N : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(N), "r"(n));
}
/* Eight E2M1 codes (a 32-bit word of NVFP4 pairs: value 2 i in the low nibble of byte i, sign in the
 * nibble's bit 3) times one micro-block scale s2 = (s, s) in f16 -> four f16x2 words (values 0, 1 in
 * out[0]), exactly: every E2M1 value is a half (its high byte from an 8-entry table by PRMT, the sign
 * set by bit operations), and the product of an E2M1 value and an E4M3 scale has at most 6
 * significant bits between 2^-10 and 2688, so the f16 product is exact (OCP MX spec v1.0 section 5.3.3,
 * NVIDIA's NVFP4 description; src/kv/kv_cache.h). */
__device__ __forceinline__ void e2m1x8_scaled(uint32_t w, uint32_t s2, uint32_t (&out)[4]) {
    constexpr uint32_t kT0 = 0x3E3C3800u, kT1 = 0x46444240u; /* high bytes of 0, .5, 1, 1.5 | 2, 3, 4, 6 */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint32_t q = h ? w >> 16 : w; /* nibbles 4 h .. 4 h + 3: values 4 h .. 4 h + 3 */
        const uint32_t mag = __byte_perm(kT0, kT1, q & 0x7777u);
        uint32_t a = __byte_perm(mag, 0u, 0x1404u), b = __byte_perm(mag, 0u, 0x3424u);
        a |= ((q << 12) & 0x8000u) | ((q << 24) & 0x80000000u); /* nibble bits 3, 7 -> 15, 31 */
        b |= ((q << 4) & 0x8000u) | ((q << 16) & 0x80000000u);  /* nibble bits 11, 15 -> 15, 31 */
        const __half2 ha = __hmul2(*reinterpret_cast<const __half2 *>(&a), *reinterpret_cast<const __half2 *>(&s2));
        const __half2 hb = __hmul2(*reinterpret_cast<const __half2 *>(&b), *reinterpret_cast<const __half2 *>(&s2));
        out[2 * h] = *reinterpret_cast<const uint32_t *>(&ha);
        out[2 * h + 1] = *reinterpret_cast<const uint32_t *>(&hb);
    }
}

/* D: head_dim (64, 128); NQ: 8-row blocks of query rows (rows <= 8 NQ); ST: K/V stages in flight;
 * KV: the page format (kPageF16, kPageFp8, kPageNv); kFold: fold mode (a CTA walks every chunk of its tile and folds them as v2's fold
 * mode does: fold_state / fold_elem in chunk order, then out = O / L, times the V scale) instead of
 * split mode (p.ws_acc, p.ws_ml, p.ws_stride, p.chunks_per_cta). */
template <int D, int NQ, int ST, int KV, bool kFold>
__global__ void __launch_bounds__(kThreads, 3) attn_dec_kernel(const Params p) {
    osp_pdl_begin();
    static_assert(D == 64 || D == 128, "head_dim");
    static_assert(ST >= 2 && ST <= 4, "stages");
    constexpr bool kFp8 = KV == kPageFp8, kNvfp4 = KV == kPageNv;
    constexpr int R = 8 * NQ;           /* query rows a CTA */
    constexpr int KT = D / 16;          /* k-steps of S^T */
    constexpr int MB = D / 64;          /* O^T's 16-dimension blocks a warp */
    constexpr int RB = row_bytes<D, KV>();
    constexpr int TB = kKeys * RB;      /* one K (or V) tile the products read */
    /* bytes of a K/V row in the pages and in a staged tile; 16-byte chunks of it; a thread's per tile */
    constexpr int PRB = kNvfp4 ? D / 2 : kFp8 ? D : 2 * D;
    constexpr int LCPR = PRB / 16;
    constexpr int LCPT = kKeys * LCPR / kThreads;
    static_assert(LCPT * kThreads == kKeys * LCPR, "tile chunking");
    constexpr int SRB = kNvfp4 ? PRB : RB; /* staged row stride: NVFP4 codes unpadded (read linearly) */
    constexpr int SB = D / 16;             /* NVFP4: micro-block scale bytes a row */
    /* a stage: [K, V][kKeys][SRB] (+ NVFP4: the scales [K, V][kKeys][SB]) */
    constexpr int STB = kNvfp4 ? nv_stage_bytes<D>() : 2 * TB;
    extern __shared__ uint4 dec_smem[];
    /* NVFP4: the f16 tile [K, V][kKeys][RB] the products read, then the stages; else the stages are
     * what the products read */
    char *sKV = reinterpret_cast<char *>(dec_smem);
    char *sStage = sKV + (kNvfp4 ? 2 * TB : 0);                       /* [ST][STB] */
    uint16_t *sP = reinterpret_cast<uint16_t *>(sStage + ST * STB);  /* P^T [R][kPS] f16 */
    float *sMax = reinterpret_cast<float *>(sP + R * kPS);              /* [4 warps][R] */
    float *sPair = sMax + 4 * R;                                        /* [R][4 tq][8 n] */
    float *sLc = sPair + R * 32;                                        /* fold mode: a chunk's l per row */

    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, c4 = lane & 3;

    AttnCtaWork w; /* sequence s, tokens [t0, t0 + ntok), kv head kvh, query heads [h0, h0 + nh) */
    if (!attn_cta_work(p.tl, p.qsl, p.num_seqs, w)) return;
    const int t0 = w.t0, ntok = w.ntok, kvh = w.kvh, nh = w.nh, h0 = w.h0;
    const int rows = ntok * nh;

    int kb, ke; /* the keys this CTA walks: v2's (cta_key_range) */
    if (!cta_key_range<kKeys, !kFold>(p, w, tid, kThreads, kb, ke)) return;

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

    /* K/V loader: v2's (slots one tile ahead; keys >= ke zero-filled), into padded rows (NVFP4: the
     * codes unpadded, and thread t's key t mod 64's K (t < 64) or V micro-block scales) */
    const int32_t *bt = p.block_table + (int64_t)w.s * p.max_blocks;
    const int64_t row_bytes_g = (int64_t)p.n_head_kv * PRB;
    const int part = tid % LCPR, jrow = tid / LCPR;
    const char *kbase = reinterpret_cast<const char *>(p.k_pages) + (int64_t)kvh * PRB + part * 16,
               *vbase = reinterpret_cast<const char *>(p.v_pages) + (int64_t)kvh * PRB + part * 16;
    const uint32_t s0 = smem_u32(sStage) + (uint32_t)(jrow * SRB + part * 16);
    const int skey = tid & (kKeys - 1);
    const uint8_t *sbase = kNvfp4 ? (tid < kKeys ? p.k_scale : p.v_scale) + (int64_t)kvh * SB : nullptr;
    const uint32_t ss0 = smem_u32(sStage) + (uint32_t)(2 * kKeys * SRB + (tid >= kKeys ? kKeys * SB : 0) + skey * SB);
    auto slot_of = [&](int key) {
        const int blk = p.bdiv.div(key);
        return key < ke ? bt[blk] * p.block_size + (key - blk * p.block_size) : -1;
    };
    constexpr int NSL = LCPT + (kNvfp4 ? 1 : 0); /* slots a thread looks up a tile (NVFP4: + its scale key's) */
    auto fetch_slots = [&](int k0, int (&slot)[NSL]) {
#pragma unroll
        for (int u = 0; u < LCPT; u++) slot[u] = slot_of(k0 + jrow + u * (kThreads / LCPR));
        if constexpr (kNvfp4) slot[LCPT] = slot_of(k0 + skey);
    };
    auto load_tile = [&](const int (&slot)[NSL], int st) {
#pragma unroll
        for (int u = 0; u < LCPT; u++) {
            const bool valid = slot[u] >= 0;
            const int64_t off = valid ? (int64_t)slot[u] * row_bytes_g : 0;
            const uint32_t so = (uint32_t)(st * STB + u * (kThreads / LCPR) * SRB);
            cp_async16(s0 + so, kbase + off, valid);
            cp_async16(s0 + so + kKeys * SRB, vbase + off, valid);
        }
        if constexpr (kNvfp4) {
            const bool valid = slot[LCPT] >= 0;
            cp_async_small<SB>(ss0 + (uint32_t)(st * STB), sbase + (valid ? (int64_t)slot[LCPT] * p.n_head_kv * SB : 0), valid);
        }
    };

    /* scores scale (log2 domain) times the KV head's K scale (E4M3) or the layer's K tensor scale (NVFP4) */
    const float qscale = kFp8 || kNvfp4 ? __fmul_rn(p.qscale, p.k_fixed[p.fixed_per_tensor ? 0 : kvh]) : p.qscale;

    /* running state: every thread keeps m of its own columns; owner thread (row orow_r = tid / 4, lane
     * tq = tid % 4 of v2's quad) keeps that lane's l (and m again); o: O^T's fragments of this warp's
     * dimensions */
    const bool owner = tid < 4 * R;
    const int own_r = tid >> 2, own_tq = tid & 3;
    float m[NQ][2], m_own = -INFINITY, l_own = 0.0f;
    float o[MB][NQ][4];
    /* fold mode: the folded state of this thread's columns (every thread folds its own copy of (M, L),
     * the same instructions on the same values) and of its accumulator elements */
    constexpr int FMB = kFold ? MB : 1;
    float Ms[NQ][2], Ls[NQ][2], oa[FMB][NQ][4];
#pragma unroll
    for (int nq = 0; nq < NQ; nq++) m[nq][0] = m[nq][1] = Ms[nq][0] = Ms[nq][1] = -INFINITY, Ls[nq][0] = Ls[nq][1] = 0.0f;
#pragma unroll
    for (int mb = 0; mb < MB; mb++)
#pragma unroll
        for (int nq = 0; nq < NQ; nq++) o[mb][nq][0] = o[mb][nq][1] = o[mb][nq][2] = o[mb][nq][3] = 0.0f;
#pragma unroll
    for (int mb = 0; mb < FMB; mb++)
#pragma unroll
        for (int nq = 0; nq < NQ; nq++) oa[mb][nq][0] = oa[mb][nq][1] = oa[mb][nq][2] = oa[mb][nq][3] = 0.0f;

    /* O^T's rows: dimension of fragment row g (+ 8 hf) of block mb */
    auto out_dim = [&](int mb, int hf) {
        const int d0 = warp * (D / 4) + 16 * mb;
        return kFp8 ? d0 + 2 * g + hf : d0 + g + 8 * hf;
    };

    int slot_next[NSL];
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
        if constexpr (kNvfp4) {
            /* the stage's codes and scales -> the f16 tile, once: unit (K or V, key, micro-block) is 8
             * code bytes and a scale byte, 16 values, two 16-byte stores (every warp's products of the
             * previous tile were done before the barrier above) */
            const char *cs = sStage + stage * STB;
#pragma unroll
            for (int i = 0; i < 2 * kKeys * SB / kThreads; i++) {
                const int u = tid + kThreads * i, kv = u / (kKeys * SB), key = (u / SB) % kKeys, mb = u % SB;
                const uint2 cw = *reinterpret_cast<const uint2 *>(cs + (kv * kKeys + key) * SRB + 8 * mb);
                const uint32_t sc8 = (uint8_t)cs[2 * kKeys * SRB + (kv * kKeys + key) * SB + mb];
                const uint32_t s2 = e4m3x2_to_f16x2(__byte_perm(sc8, 0u, 0x0000u));
                uint32_t lo[4], hi[4];
                e2m1x8_scaled(cw.x, s2, lo);
                e2m1x8_scaled(cw.y, s2, hi);
                uint4 *dst = reinterpret_cast<uint4 *>(sKV + kv * TB + key * RB + 32 * mb);
                dst[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
                dst[1] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            }
            __syncthreads();
        }
        const uint32_t sk = smem_u32(sKV) + (uint32_t)(kNvfp4 ? 0 : stage * 2 * TB), sv = sk + (uint32_t)TB;

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

        /* chunk end: its partial (split mode) or its fold (fold mode), v2's bits, then a fresh chunk */
        if ((k0 + kKeys) % kChunk == 0 || !more) {
            const int c = k0 / kChunk;
            if (warp < R / 8) { /* the owner warps: every lane an owner; quads are rows */
                const float lc = quad_sum(l_own);
                if constexpr (kFold) {
                    if (own_tq == 0) sLc[own_r] = lc;
                } else if (own_tq == 0 && own_r < rows) {
                    const int64_t orow = (int64_t)(t0 + own_r / nh) * p.n_head + h0 + own_r % nh;
                    p.ws_ml[orow * p.ws_stride + c] = make_float2(m_own, lc);
                }
            }
            if constexpr (kFold) {
                __syncthreads(); /* sLc written; read before the next chunk end's barrier-separated write */
#pragma unroll
                for (int nq = 0; nq < NQ; nq++)
#pragma unroll
                    for (int ci = 0; ci < 2; ci++) {
                        float wA, wc;
                        if (fold_state(Ms[nq][ci], Ls[nq][ci], m[nq][ci], sLc[8 * nq + 2 * c4 + ci], wA, wc)) {
#pragma unroll
                            for (int mb = 0; mb < MB; mb++) {
                                oa[mb][nq][ci] = fold_elem(oa[mb][nq][ci], wA, o[mb][nq][ci], wc);
                                oa[mb][nq][2 + ci] = fold_elem(oa[mb][nq][2 + ci], wA, o[mb][nq][2 + ci], wc);
                            }
                        }
                    }
            } else {
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

    /* fold mode: out = O / L (times the V scale on E4M3 pages, as merge_kernel and v2 form it) */
    if constexpr (kFold) {
#pragma unroll
        for (int nq = 0; nq < NQ; nq++)
#pragma unroll
            for (int ci = 0; ci < 2; ci++) {
                const int r = 8 * nq + 2 * c4 + ci;
                if (r >= rows) continue;
                const int64_t orow = (int64_t)(t0 + r / nh) * p.n_head + h0 + r % nh;
                const float inv = out_scale(Ls[nq][ci]);
                auto outv = [&](float a) {
                    return kFp8 || kNvfp4 ? __fmul_rn(__fmul_rn(a, inv), p.v_fixed[p.fixed_per_tensor ? 0 : kvh])
                                          : __fmul_rn(a, inv);
                };
                uint16_t *dst = p.out + orow * D;
#pragma unroll
                for (int mb = 0; mb < MB; mb++) {
                    dst[out_dim(mb, 0)] = osp_f_to_bf16(outv(oa[mb][nq][ci]));
                    dst[out_dim(mb, 1)] = osp_f_to_bf16(outv(oa[mb][nq][2 + ci]));
                }
            }
    }
}

template <int D, int NQ, int ST, int KV, bool kFold> osp_status launch_one(const Params &prm, dim3 grid, cudaStream_t st) {
    constexpr int smem = smem_bytes<D, KV, NQ, ST>();
    static_assert(smem <= 227 * 1024, "shared memory of one CTA");
    if (smem > 48 * 1024)
        OSP_CUDA_TRY(cudaFuncSetAttribute(attn_dec_kernel<D, NQ, ST, KV, kFold>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          smem));
    osp_launch(attn_dec_kernel<D, NQ, ST, KV, kFold>, grid, kThreads, smem, st, prm);
    OSP_CUDA_LAUNCH_CHECK("attn_dec_kernel");
    return OSP_OK;
}

template <int D, int NQ, int KV, bool kFold>
osp_status launch_st(const Params &prm, dim3 grid, int stages, cudaStream_t st) {
    switch (stages) {
    case 2: return launch_one<D, NQ, 2, KV, kFold>(prm, grid, st);
    case 4: return launch_one<D, NQ, 4, KV, kFold>(prm, grid, st);
    default: return launch_one<D, NQ, 3, KV, kFold>(prm, grid, st);
    }
}

template <int D, int KV, bool kFold> osp_status launch_nq(const Params &prm, dim3 grid, int nq, int stages, cudaStream_t st) {
    return nq == 2 ? launch_st<D, 2, KV, kFold>(prm, grid, stages, st) : launch_st<D, 1, KV, kFold>(prm, grid, stages, st);
}

template <int D, bool kFold>
osp_status launch_d(const Params &prm, dim3 grid, int nq, int kv, int stages, cudaStream_t st) {
    switch (kv) {
    case kPageFp8: return launch_nq<D, kPageFp8, kFold>(prm, grid, nq, stages, st);
    case kPageNv: return launch_nq<D, kPageNv, kFold>(prm, grid, nq, stages, st);
    default: return launch_nq<D, kPageF16, kFold>(prm, grid, nq, stages, st);
    }
}

} // namespace

int dec_rows(int group) { return group <= 8 ? 8 : group <= 16 ? 16 : 0; }

int dec_default_stages(int kv) { return kv == OSP_CUDA_DEC_NVFP4 ? 2 : 3; }

int dec_smem_bytes(int D, int kv, int rows, int stages) { return smem_of(D, kv, rows > 8 ? 2 : 1, stages); }

osp_status dec_launch(const Params &prm, bool fold, unsigned n_groups, int D, int kv, int stages, void *stream) {
    const int rows = prm.tl.heads_per_cta * prm.tl.bq;
    const int nq = rows > 8 ? 2 : 1;
    if (stages < 2 || stages > 4) stages = dec_default_stages(kv);
    if (D != 64 && D != 128) return osp_set_error(OSP_ERR_INVALID_ARG, "attention v4: head_dim %d (64 or 128)", D);
    const dim3 grid((unsigned)prm.tl.n_tiles, (unsigned)(prm.n_head_kv * prm.tl.head_chunks), fold ? 1u : n_groups);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (fold) return D == 64 ? launch_d<64, true>(prm, grid, nq, kv, stages, st) : launch_d<128, true>(prm, grid, nq, kv, stages, st);
    return D == 64 ? launch_d<64, false>(prm, grid, nq, kv, stages, st) : launch_d<128, false>(prm, grid, nq, kv, stages, st);
}

} // namespace osp_attn
