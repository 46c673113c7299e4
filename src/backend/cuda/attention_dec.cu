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
 * folds into qscale and the V scale multiplies the merged output, as in v2.
 *
 * NVFP4 pages the same way: the E2M1 codes land in padded shared rows ([64][D / 2 + 16] bytes), the
 * E4M3 micro-block scales ([64][D / 16]) beside them, and both widen in registers, straight into the
 * fragments, each f16 the exact product of the E2M1 value and its micro-block's scale (so the mma
 * inputs are the values the pages hold, whatever the route to them): K's from 16-byte loads a quad
 * shares, a PRMT for the thread's two code bytes of a micro-block, a PRMT table for the magnitudes and
 * a sign-replicating PRMT for the signs (E4M3 bytes), the cvt, times the key's scale; V^T's by
 * ldmatrix.trans on the code bytes (a key's 16 bytes: 32 dims), a PRMT for one code byte of 4 keys,
 * shifts and masks making E4M3 bytes worth 2^-6 of each value, the cvt, times the keys' scales x 64
 * (an f16 table each tile builds once), with O^T's rows permuted so that rows g and g + 8 are the low
 * and high nibble of one code byte (out_dim). The tensor scales factor out as E4M3's head scales do.
 * Neither format makes an f16 copy of a tile: one made NVFP4 decode shared-memory bound (~85 KB of
 * shared traffic a tile against E4M3's ~32 KB; bench/kv/NOTES.md). */
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

/* page formats (template KV): f16, E4M3 and NVFP4 (both read from the staged codes into the fragments) */
constexpr int kPageF16 = OSP_CUDA_DEC_F16, kPageFp8 = OSP_CUDA_DEC_FP8, kPageNv = OSP_CUDA_DEC_NVFP4;

/* shared row stride of a staged K/V row, bytes: padded by 16 so the 8 rows of an ldmatrix (or of a
 * warp's 16-byte loads of NVFP4 K rows) hit distinct banks */
constexpr int row_bytes_of(int D, int KV) { return (KV == kPageNv ? D / 2 : KV == kPageFp8 ? D : 2 * D) + 16; }
template <int D, int KV> constexpr int row_bytes() { return row_bytes_of(D, KV); }
/* one stage: K then V, [kKeys][row_bytes] (+ NVFP4: the micro-block scales, K then V, [kKeys][D / 16]) */
constexpr int stage_of(int D, int KV) { return 2 * kKeys * row_bytes_of(D, KV) + (KV == kPageNv ? 2 * kKeys * (D / 16) : 0); }
/* NVFP4: the tile's V scales times 64 as f16, laid out for the V fragments (see the kernel) */
constexpr int vscale_of(int D, int KV) { return KV == kPageNv ? kKeys * (D / 16) * 2 : 0; }
/* a CTA's dynamic shared memory (host and device: the launch and the kernel's static check) */
constexpr int smem_of(int D, int KV, int NQ, int ST) {
    return ST * stage_of(D, KV) + vscale_of(D, KV) + 8 * NQ * kPS * 2 /* sP */ + 4 * 8 * NQ * 4 /* sMax */ +
           8 * NQ * 32 * 4 /* sPair */ + 8 * NQ * 4 /* sLc */;
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
/* PTX prmt in its default mode: a selector nibble with bit 3 set gives its byte's sign (bit 7) in all
 * 8 bits, which __byte_perm does not promise */
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}
__device__ __forceinline__ uint32_t hmul2_u32(uint32_t a, uint32_t b) {
    const __half2 h = __hmul2(*reinterpret_cast<const __half2 *>(&a), *reinterpret_cast<const __half2 *>(&b));
    return *reinterpret_cast<const uint32_t *>(&h);
}
__device__ __forceinline__ uint32_t hmul2_lo(uint32_t a, uint32_t b) { /* a times (b.lo, b.lo) */
    const __half2 h = __hmul2(*reinterpret_cast<const __half2 *>(&a), __low2half2(*reinterpret_cast<const __half2 *>(&b)));
    return *reinterpret_cast<const uint32_t *>(&h);
}
__device__ __forceinline__ uint32_t hmul2_hi(uint32_t a, uint32_t b) { /* a times (b.hi, b.hi) */
    const __half2 h = __hmul2(*reinterpret_cast<const __half2 *>(&a), __high2half2(*reinterpret_cast<const __half2 *>(&b)));
    return *reinterpret_cast<const uint32_t *>(&h);
}
/* the E4M3 pair in the high half of w -> f16x2 (the cvt reads the half in place) */
__device__ __forceinline__ uint32_t e4m3x2_hi_to_f16x2(uint32_t w) {
    uint32_t d;
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(d) : "r"(w));
    return d;
}
/* v in a register for the whole kernel: PRMT takes one immediate source, and left to itself ptxas
 * rebuilds a constant table word before every PRMT that reads it (one IMAD each, even through an asm
 * mov); threadIdx.y is 0 (the blocks are one-dimensional) but not a constant to it */
__device__ __forceinline__ uint32_t reg_const(uint32_t v) { return v + threadIdx.y; }
/* NVFP4 -> the A fragments, every value E2M1 x E4M3 micro-block scale as an exact f16 (the product has
 * at most 6 significant bits between 2^-10 and 2688: OCP MX spec v1.0 section 5.3.3, NVIDIA's NVFP4
 * description; src/kv/kv_cache.h), by way of E4M3 bytes and the hardware's exact cvt e4m3x2 -> f16x2.
 *
 * K: x holds four codes, (dims 2 c, 2 c + 1) in byte 0 and (2 c + 8, 2 c + 9) in byte 1, one key, one
 * micro-block. An 8-entry PRMT table (t0: its low word, kNvT0, in a register) gives each code's
 * magnitude as an E4M3 byte in dim order; a PRMT in sign-replicate mode spreads each code's sign
 * (nibble bit 3: the byte msb of x << 4 for low nibbles, of x for high ones) over its byte, one LOP3
 * merges them. Each cvt gives one register's pair, times the key's scale in both halves (sp: the f16x2
 * of two micro-blocks' scales, hi: the high one). */
constexpr uint32_t kNvT0 = 0x3C383000u, kNvT1 = 0x4C484440u; /* E4M3 0, .5, 1, 1.5 | 2, 3, 4, 6 */
__device__ __forceinline__ void nv_k_frag(uint32_t x, uint32_t t0, uint32_t sp, bool hi, uint32_t &r0, uint32_t &r1) {
    const uint32_t mag = prmt(t0, kNvT1, x & 0x7777u), neg = prmt(x, x << 4, 0x9D8Cu);
    const uint32_t e = mag | (neg & 0x80808080u);
    const uint32_t f0 = e4m3x2_to_f16x2(e), f1 = e4m3x2_hi_to_f16x2(e);
    r0 = hi ? hmul2_hi(f0, sp) : hmul2_lo(f0, sp);
    r1 = hi ? hmul2_hi(f1, sp) : hmul2_lo(f1, sp);
}
/* V: z holds one code byte (dims 2 i, 2 i + 1 in its low, high nibble) of each of keys 2 c, 2 c + 1,
 * 2 c + 8, 2 c + 9 of a k-step, in that order. Here the pairs run over keys (two nibbles of the same
 * significance in adjacent bytes), so shifts and masks make the E4M3 bytes: code s e1 e0 m as the byte
 * s 000 e1 e0 m 00 is exactly the E2M1 value times 2^-6 (subnormal codes included: exponent 0 is
 * E4M3's subnormal range too), and the scales come times 64 (s64_ab: the f16x2 (64 s_2c, 64 s_2c+1),
 * s64_cd the other two keys'), exact in f16 (64 x 448 < 65504), so each f16 product is the same exact
 * E2M1 x E4M3 value. a0 / a2: the low nibbles (O^T row g), a1 / a3: the high ones (row g + 8). */
__device__ __forceinline__ void nv_v_frag(uint32_t z, uint32_t s64_ab, uint32_t s64_cd, uint32_t (&a)[4]) {
    const uint32_t lo = ((z << 4) & 0x80808080u) | ((z << 2) & 0x1C1C1C1Cu);
    const uint32_t hi = (z & 0x80808080u) | ((z >> 2) & 0x1C1C1C1Cu);
    a[0] = hmul2_u32(e4m3x2_to_f16x2(lo), s64_ab), a[1] = hmul2_u32(e4m3x2_to_f16x2(hi), s64_ab);
    a[2] = hmul2_u32(e4m3x2_hi_to_f16x2(lo), s64_cd), a[3] = hmul2_u32(e4m3x2_hi_to_f16x2(hi), s64_cd);
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
    constexpr int TB = kKeys * RB;      /* one staged K (or V) tile */
    /* bytes of a K/V row in the pages; 16-byte chunks of it; a thread's per tile */
    constexpr int PRB = kNvfp4 ? D / 2 : kFp8 ? D : 2 * D;
    constexpr int LCPR = PRB / 16;
    constexpr int LCPT = kKeys * LCPR / kThreads;
    static_assert(LCPT * kThreads == kKeys * LCPR, "tile chunking");
    constexpr int SB = D / 16;             /* NVFP4: micro-block scale bytes a row */
    constexpr int STB = stage_of(D, KV);   /* a stage: [K, V][kKeys][RB] (+ NVFP4: the scales [K, V][kKeys][SB]) */
    extern __shared__ uint4 dec_smem[];
    char *sStage = reinterpret_cast<char *>(dec_smem);                 /* [ST][STB] */
    char *sVs = sStage + ST * STB;                                      /* NVFP4: [2][SB][4][16 bytes] */
    uint16_t *sP = reinterpret_cast<uint16_t *>(sVs + vscale_of(D, KV)); /* P^T [R][kPS] f16 */
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

    /* K/V loader: v2's (slots one tile ahead; keys >= ke zero-filled), into padded rows (NVFP4: also
     * thread t's key t mod 64's K (t < 64) or V micro-block scales) */
    const int32_t *bt = p.block_table + (int64_t)w.s * p.max_blocks;
    const int64_t row_bytes_g = (int64_t)p.n_head_kv * PRB;
    const int part = tid % LCPR, jrow = tid / LCPR;
    const char *kbase = reinterpret_cast<const char *>(p.k_pages) + (int64_t)kvh * PRB + part * 16,
               *vbase = reinterpret_cast<const char *>(p.v_pages) + (int64_t)kvh * PRB + part * 16;
    const uint32_t s0 = smem_u32(sStage) + (uint32_t)(jrow * RB + part * 16);
    const int skey = tid & (kKeys - 1);
    const uint8_t *sbase = kNvfp4 ? (tid < kKeys ? p.k_scale : p.v_scale) + (int64_t)kvh * SB : nullptr;
    const uint32_t ss0 = smem_u32(sStage) + (uint32_t)(2 * TB + (tid >= kKeys ? kKeys * SB : 0) + skey * SB);
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
            const uint32_t so = (uint32_t)(st * STB + u * (kThreads / LCPR) * RB);
            cp_async16(s0 + so, kbase + off, valid);
            cp_async16(s0 + so + TB, vbase + off, valid);
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

    /* NVFP4: this warp's V dimensions lie in [32 vq, 32 vq + 32); PRMT selectors of its K code bytes (c4,
     * 4 + c4 of a micro-block) and V code bytes (of the 16-bit elements of 4 keys, byte 0 or 1) */
    const int vq = D == 128 ? warp : warp >> 1;
    const uint32_t nv_t0 = kNvfp4 ? reg_const(kNvT0) : 0u;
    const uint32_t selk = (uint32_t)(c4 | (c4 + 4) << 4), selv = 0x6420u + 0x1111u * (D == 128 ? 0u : (uint32_t)(warp & 1));
    /* O^T's rows: dimension of fragment row g (+ 8 hf) of block mb */
    auto out_dim = [&](int mb, int hf) {
        const int d0 = warp * (D / 4) + 16 * mb;
        if constexpr (kNvfp4) return 32 * vq + 4 * g + 2 * (D == 128 ? mb : warp & 1) + hf;
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

    /* ldmatrix lane addresses (bytes within a tile). NVFP4's V: rows are keys 16 (lane >> 4) + lane mod 16
     * (x4: k-steps j, j + 1), the 16 bytes are the dimensions [32 vq, 32 vq + 32) of this warp's pair of
     * micro-blocks (D 64: two warps share them, each taking one byte of every 16-bit element) */
    const uint32_t k_lane = kFp8 ? (uint32_t)((16 * warp + g) * RB + 2 * c4)
                                 : (uint32_t)((16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8) * RB + (lane >> 4) * 16);
    const uint32_t v_lane = kFp8     ? (uint32_t)(((lane & 7) + ((lane >> 3) & 1) * 8) * RB + warp * (D / 4))
                            : kNvfp4 ? (uint32_t)(((lane & 15) + (lane >> 4) * 16) * RB + 16 * vq)
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
        const char *stg = sStage + stage * STB;
        if constexpr (kNvfp4) {
            /* the tile's V scales times 64 as f16 into sVs (read after the softmax's barriers; every read
             * of the previous tile's was before the barrier above): entry t (8 bytes) = ((h SB + mbk) 4 +
             * c) 2 + jl holds micro-block mbk's f16x2 of keys (2 c, 2 c + 1) and (2 c + 8, 2 c + 9) of
             * k-step 2 h + jl, so a lane's two k-steps are one conflict-free 16-byte load */
            if (tid < 16 * SB) {
                const int jl = tid & 1, c = (tid >> 1) & 3, mbk = (tid >> 3) % SB, h = tid / (8 * SB);
                const uint8_t *vs = reinterpret_cast<const uint8_t *>(stg + 2 * TB + kKeys * SB) + (16 * (2 * h + jl) + 2 * c) * SB + mbk;
                const uint32_t ab = vs[0] | (uint32_t)vs[SB] << 8, cd = vs[8 * SB] | (uint32_t)vs[9 * SB] << 8;
                constexpr uint32_t k64 = 0x54005400u; /* f16x2 (64, 64) */
                *reinterpret_cast<uint2 *>(sVs + 8 * tid) =
                    make_uint2(hmul2_u32(e4m3x2_to_f16x2(ab), k64), hmul2_u32(e4m3x2_to_f16x2(cd), k64));
            }
        }
        const uint32_t sk = smem_u32(sStage) + (uint32_t)(stage * STB), sv = sk + (uint32_t)TB;

        /* S^T: keys 16 warp + g (elements 0, 1) and + 8 (2, 3), columns 8 nq + 2 c4 (+ 1) */
        float sc[NQ][4];
#pragma unroll
        for (int nq = 0; nq < NQ; nq++) sc[nq][0] = sc[nq][1] = sc[nq][2] = sc[nq][3] = 0.0f;
        /* NVFP4: the two keys' micro-block scales (byte kk: k-step kk's) and codes (16 bytes: k-steps
         * kk, kk + 1; a quad's lanes load the same words) */
        const char *k_nv = stg + (16 * warp + g) * RB;
        uint32_t ksc[2][(SB + 3) / 4], ksp[2];
        uint4 kcw[2];
        if constexpr (kNvfp4) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const char *q = stg + 2 * TB + (16 * warp + g + 8 * h) * SB;
                if constexpr (SB == 8) {
                    const uint2 t = *reinterpret_cast<const uint2 *>(q);
                    ksc[h][0] = t.x, ksc[h][1] = t.y;
                } else {
                    ksc[h][0] = *reinterpret_cast<const uint32_t *>(q);
                }
            }
        }
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
            uint32_t a[4];
            if constexpr (kFp8) {
                const uint32_t b = sk + k_lane + 16 * kk;
                a[0] = e4m3x2_to_f16x2(lds_u16(b)), a[1] = e4m3x2_to_f16x2(lds_u16(b + 8 * RB));
                a[2] = e4m3x2_to_f16x2(lds_u16(b + 8)), a[3] = e4m3x2_to_f16x2(lds_u16(b + 8 * RB + 8));
            } else if constexpr (kNvfp4) {
                const bool odd = kk & 1;
#pragma unroll
                for (int h = 0; h < 2; h++) { /* key 16 warp + g + 8 h: a[h], a[2 + h] */
                    if (!odd) {
                        kcw[h] = *reinterpret_cast<const uint4 *>(k_nv + 8 * h * RB + 8 * kk);
                        ksp[h] = kk & 2 ? e4m3x2_hi_to_f16x2(ksc[h][kk >> 2]) : e4m3x2_to_f16x2(ksc[h][kk >> 2]); /* (s_kk, s_kk+1) */
                    }
                    const uint32_t x = prmt(odd ? kcw[h].z : kcw[h].x, odd ? kcw[h].w : kcw[h].y, selk);
                    nv_k_frag(x, nv_t0, ksp[h], odd, a[h], a[2 + h]);
                }
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
        uint32_t vr[4]; /* NVFP4: V codes of k-steps j (vr[0], vr[1]) and j + 1 (vr[2], vr[3]), j even */
        uint4 vs4;      /* NVFP4: their scale pairs (sVs entries) */
#pragma unroll
        for (int j = 0; j < kKeys / 16; j++) {
            uint32_t b[NQ][2];
#pragma unroll
            for (int nq = 0; nq < NQ; nq++) ldsm_x2(p_lane + (uint32_t)((8 * nq * kPS + 16 * j) * 2), b[nq][0], b[nq][1]);
            if constexpr (kNvfp4) {
                if (!(j & 1)) {
                    ldsm_x4_t(sv + v_lane + (uint32_t)(16 * j * RB), vr[0], vr[1], vr[2], vr[3]);
                    vs4 = *reinterpret_cast<const uint4 *>(sVs + ((j >> 1) * SB + 2 * vq + (g >> 2)) * 64 + 16 * c4);
                }
            }
#pragma unroll
            for (int mb = 0; mb < MB; mb++) {
                uint32_t a[4];
                if constexpr (kFp8) {
                    uint32_t r0, r1;
                    ldsm_x2_t(sv + v_lane + (uint32_t)(16 * j * RB + 16 * mb), r0, r1);
                    a[0] = e4m3x2_to_f16x2(__byte_perm(r0, 0u, 0x0020)), a[1] = e4m3x2_to_f16x2(__byte_perm(r0, 0u, 0x0031));
                    a[2] = e4m3x2_to_f16x2(__byte_perm(r1, 0u, 0x0020)), a[3] = e4m3x2_to_f16x2(__byte_perm(r1, 0u, 0x0031));
                } else if constexpr (kNvfp4) {
                    /* byte 2 g + (D 128: mb; D 64: warp mod 2) of the 16-bit elements of keys 2 c4, + 1
                     * (vr[2 (j & 1)]) and 2 c4 + 8, + 9 (vr[2 (j & 1) + 1]) */
                    const uint32_t z = prmt(vr[2 * (j & 1)], vr[2 * (j & 1) + 1], selv + 0x1111u * (D == 128 ? mb : 0));
                    nv_v_frag(z, j & 1 ? vs4.z : vs4.x, j & 1 ? vs4.w : vs4.y, a);
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

int dec_default_stages(int kv) { return kv == OSP_CUDA_DEC_NVFP4 ? 4 : 3; }

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
