/* Paged attention for mixed batches (prefill chunks and decodes in one launch) on CUDA cores, the
 * CUDA counterpart of osp_cpu_paged_attention. FlashAttention-style (Dao et al. 2022): K/V tiles of
 * 32 keys are staged in shared memory as fp32 and every query row keeps an online softmax (Milakov &
 * Gimelshein 2018: running max m, running sum l, fp32 accumulator); long contexts are split over the
 * KV length (FlashDecoding) and the partial results merged by their log-sum-exp in a second kernel.
 *
 * Work decomposition (attention_tiles.cuh): a CTA serves up to kRows = 16 query rows (token, head)
 * of one sequence and one KV head (all the query heads of the GQA group that fit: every K/V load is
 * shared by the group); blockIdx.x is the query tile slot, blockIdx.y kv head x head chunk, and
 * blockIdx.z the KV split. The split length is chosen per tile on the device from the tile's own
 * context (at least kMinChunk keys), so short contexts use few splits; a split with no keys for a row
 * still writes (m = -inf, l = 0) so the merge knows to skip it.
 * A CTA is 4 warps. Per 32-key tile all 128 threads load K and V rows with 16-byte loads (each key's
 * slot looked up through the block table by one lane and shuffled), widen them to fp32 in shared
 * memory (row stride D + 4 floats: conflict-free float4 reads with one key per lane), then each warp
 * works on its own query rows (row r belongs to warp r % 4): lane j scores key j against the row's q
 * (fp32, pre-scaled by scale * log2 e, read from shared memory as a broadcast), the warp max gives
 * the new running max, p_j = 2^(s_j - m) goes through a per-warp shared buffer, and the P V product
 * is done with each lane owning D / 32 output dimensions. All per-thread arrays are indexed by
 * compile-time constants (templates on D, on f16/fp32 pages and on the warp's row count).
 *
 * Quantized pages (issue 13, osp_cuda_paged_attention_q): FP8 E4M3 and NVFP4 tiles are decoded once per
 * tile into the same fp32 shared-memory rows (load_kv_tile_q, kv_quant.cuh's exact decoders: each value
 * one fp32 product with its scale, the CPU read's value), then everything below is the f16 path; no
 * dequantized copy of the cache exists. The launches the tensor-core kernels do not serve run here: fp8
 * outside D 64 / 128 under wgmma (osp_cuda_attention_tc_serves), NVFP4 outside v4's shapes
 * (osp_cuda_attention_v4_nvfp4: D 64 / 128, groups up to 16) or forced to v0. Their reduction is fixed
 * by the row alone, as the tensor-core kernels' is (attention_mma.cu's header): keys in chunks of
 * kQChunk (OSP_CUDA_ATTN_CHUNK) from key 0, an online softmax inside a chunk over its 32-key tiles in
 * order, the chunks' (m, l, o) folded in chunk order by osp_attn::fold_state / fold_elem, out = O / L.
 * Fold mode folds in registers; split mode (decode: too few query tiles to fill the GPU) writes each
 * chunk's partial and osp_cuda_attention_merge_chunks (attention_mma.cu's merge) folds them with the same
 * instructions, so the two agree bit for bit and a row's bits never depend on its batch (test_gpu_kv_quant).
 * INT8_HIER pages (QuantSpec's hierarchical INT8, Tiwari et al. 2025, section 4.1; issue 14) run here
 * always, whatever mode is forced (no tensor-core kernel reads them): load_kv_tile_h decodes each key's
 * K and V rows to its full value M + (S/32)(32 u + 2 l - 15) (upper codes from the pages, lower codes
 * from the second pool) or, under the draft's upper-only view, to M + S u from the pages alone (the
 * lower pool is not read) -- except keys at positions >= full_from, read in full. full_from =
 * seq_len - hier_full_recent, seq_len the sequence's number of keys (its last query token's position
 * + 1), one value per sequence, so every query row of a CTA (one sequence) reads a key the same way
 * and a tile is decoded once. The CPU (src/backend/cpu/kv_quant.c attend_tile) takes the largest n_ctx
 * of its tile's items, which is the same number for one query token a sequence -- QuantSpec's draft
 * passes always are; a multi-token query under the upper-only view (no caller has one) would read its
 * earlier rows' recent keys the sequence's way here.
 *
 * Shared memory per CTA: 2 * 32 * (D + 4) + 16 * D + 16 * 32 floats (D = 128: 43 KiB; D = 256:
 * 83 KiB, opted in with cudaFuncSetAttribute). The partials in d_workspace: fp32 [splits, T, n_head,
 * D] accumulators, then float2 [splits, T, n_head] (m, l), m in the log2 domain. */
#include "backend/cuda/cuda_common.cuh" /* OSP_CUDA_LAUNCH_CHECK, OSP_CUDA_TRY, osp_bf16_to_f, osp_f16_to_f, osp_f_to_bf16 */
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/attention_tiles.cuh" /* AttnTiling, attn_cta_work */
#include "backend/cuda/attention_v1.h"    /* the tensor-core kernel (f16 pages, D <= 128) */
#include "backend/cuda/kv_quant.cuh"      /* E4M3 / E2M1 decoders (quantized pages, issue 13) */
#include "backend/cuda/attention_mma.cuh" /* osp_attn: the chunk fold (fold_state, fold_elem, out_scale) */

#include <math.h>
#include <stdint.h>

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16;                    /* query rows (token, head) per CTA */
constexpr int kRowsPerWarp = kRows / kWarps; /* row r is served by warp r % kWarps */
constexpr int kKeys = 32;                    /* keys per shared-memory tile: one per lane */
constexpr int kPad = 4;                      /* floats of padding per K/V row in shared memory */
constexpr int kMinChunk = 256;               /* the fewest keys a KV split covers */
constexpr int kMaxSplits = 32;
constexpr int64_t kTargetCtas = 1024;        /* split until about this many CTAs (~2 waves on 132 SMs) */
constexpr int64_t kMaxSplitRows = 32768;     /* bound on T * n_head * splits: sizes the workspace */
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kQChunk = OSP_CUDA_ATTN_CHUNK;  /* quantized pages: keys a chunk (the tensor-core kernels' too) */
static_assert(kQChunk % kKeys == 0, "chunks are whole tiles");

/* The page formats the kernel reads (a template parameter): plain values, or codes decoded per tile. */
enum { kKvF32 = 0, kKvF16 = 1, kKvFp8 = 2, kKvNvfp4 = 3, kKvInt8h = 4 };

struct AttnParams {
    const uint16_t *q;           /* [T, n_head, D] bf16 */
    const void *k_pages;         /* [num_blocks, block_size, n_head_kv, D] f16, fp32 or E4M3 codes, or
                                  * [.., D / 2] bytes of E2M1 pairs (nvfp4) */
    const void *v_pages;
    const uint8_t *k_scale;      /* nvfp4: [num_blocks, block_size, n_head_kv, D / 16] E4M3 micro-block scales;
                                  * int8_hier: [.., D / 2] bytes of lower codes (the pages: [.., D / 2 + 4]
                                  * bytes, the upper codes then f16 S and M) */
    const uint8_t *v_scale;
    const float *k_fixed;        /* fp8: [n_head_kv] per-head scales; nvfp4: [1] the tensor scale; else NULL */
    const float *v_fixed;
    uint16_t *out;               /* [T, n_head, D] bf16 */
    const int32_t *qsl;          /* [num_seqs + 1] */
    const int32_t *positions;    /* [T] */
    const int32_t *block_table;  /* [num_seqs, max_blocks] */
    float *ws_acc;               /* [num_splits, T, n_head, D] (num_splits > 1 only); quantized pages in
                                  * split mode: [T, n_head, ws_stride, D] chunk partials (attention_v1.h) */
    float2 *ws_ml;               /* [num_splits, T, n_head]; quantized pages: [T, n_head, ws_stride] */
    int32_t num_seqs, max_blocks, block_size, T;
    int n_head, n_head_kv;
    AttnTiling tl;               /* the query tiles (attention_tiles.cuh, kRows rows a CTA) */
    int num_splits;
    int chunks_per_cta;          /* quantized pages: 0 fold mode, else split mode's chunks a CTA */
    int ws_stride;               /* quantized pages in split mode: chunks a row in the workspace */
    int window;                  /* > 0: a row at position p sees keys p - window + 1 .. p only */
    float qscale;                /* scale * log2(e) */
    bool hier_upper_only;        /* int8_hier: the draft's view (upper halves except the recent keys) */
    int hier_full_recent;        /* >= 0: keys at positions >= seq_len - this are read in full */
};

/* ---- small helpers ------------------------------------------------------------------------------- */

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <int J> __device__ __forceinline__ float f4_get(const float4 &v) {
    static_assert(J >= 0 && J < 4, "float4 component");
    if constexpr (J == 0) return v.x;
    else if constexpr (J == 1) return v.y;
    else if constexpr (J == 2) return v.z;
    else return v.w;
}

/* The output dimensions a lane owns: NVEC groups of VW consecutive dims, group c starting at
 * c * 32 * VW + lane * VW (consecutive lanes read consecutive addresses). */
template <int D> struct LaneDims {
    static_assert(D == 32 || D == 64 || D == 128 || D == 256, "head_dim");
    static constexpr int DPL = D / 32;                /* dims per lane */
    static constexpr int VW = DPL < 4 ? DPL : 4;      /* vector width of one group */
    static constexpr int NVEC = DPL / VW;
    static __device__ __forceinline__ int dim(int c, int lane) { return c * 32 * VW + lane * VW; }
};

/* v[c * VW + e] = row[dim(c) + e] from shared memory (fp32). */
template <int D> __device__ __forceinline__ void load_lane_dims(const float *row, int lane, float (&v)[D / 32]) {
    using L = LaneDims<D>;
#pragma unroll
    for (int c = 0; c < L::NVEC; c++) {
        const float *src = row + L::dim(c, lane);
        if constexpr (L::VW == 4) {
            const float4 x = *reinterpret_cast<const float4 *>(src);
            v[c * 4 + 0] = x.x, v[c * 4 + 1] = x.y, v[c * 4 + 2] = x.z, v[c * 4 + 3] = x.w;
        } else if constexpr (L::VW == 2) {
            const float2 x = *reinterpret_cast<const float2 *>(src);
            v[c * 2 + 0] = x.x, v[c * 2 + 1] = x.y;
        } else {
            v[c] = *src;
        }
    }
}

/* dst[dim(c) + e] = bf16(a[c * VW + e] * mul) for the lane's dims (global memory, one row of D). */
template <int D>
__device__ __forceinline__ void store_lane_bf16(uint16_t *dst, int lane, const float (&a)[D / 32], float mul) {
    using L = LaneDims<D>;
#pragma unroll
    for (int c = 0; c < L::NVEC; c++) {
        uint16_t *p = dst + L::dim(c, lane);
#pragma unroll
        for (int e = 0; e < L::VW; e++) p[e] = osp_f_to_bf16(a[c * L::VW + e] * mul);
    }
}

/* dst[dim(c) + e] = a[c * VW + e] (fp32, global memory). */
template <int D> __device__ __forceinline__ void store_lane_f32(float *dst, int lane, const float (&a)[D / 32]) {
    using L = LaneDims<D>;
#pragma unroll
    for (int c = 0; c < L::NVEC; c++) {
        float *p = dst + L::dim(c, lane);
        if constexpr (L::VW == 4) {
            *reinterpret_cast<float4 *>(p) = make_float4(a[c * 4], a[c * 4 + 1], a[c * 4 + 2], a[c * 4 + 3]);
        } else if constexpr (L::VW == 2) {
            *reinterpret_cast<float2 *>(p) = make_float2(a[c * 2], a[c * 2 + 1]);
        } else {
            *p = a[c];
        }
    }
}

/* Widens one 16-byte chunk of a K/V row (8 f16 or 4 fp32) into fp32 shared memory at dst (16-byte
 * aligned). */
template <bool F16> __device__ __forceinline__ void store_chunk(float *dst, const uint4 r) {
    if constexpr (F16) {
        const uint32_t w[4] = {r.x, r.y, r.z, r.w};
        float f[8];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = osp_f16_to_f((uint16_t)(w[i] & 0xffffu));
            f[2 * i + 1] = osp_f16_to_f((uint16_t)(w[i] >> 16));
        }
        reinterpret_cast<float4 *>(dst)[0] = make_float4(f[0], f[1], f[2], f[3]);
        reinterpret_cast<float4 *>(dst)[1] = make_float4(f[4], f[5], f[6], f[7]);
    } else {
        *reinterpret_cast<float4 *>(dst) =
            make_float4(__uint_as_float(r.x), __uint_as_float(r.y), __uint_as_float(r.z), __uint_as_float(r.w));
    }
}

/* ---- one 32-key tile ------------------------------------------------------------------------------- */

/* Loads keys k0 + j (j < 32) of this CTA's kv head into sK / sV (fp32, row stride D + kPad). `slot`
 * is lane j's slot for key k0 + j, or -1 past the split's end (those rows are zero-filled, so a
 * masked key never multiplies garbage). kb / vb point at kv head 0 + kvh * D of slot 0; row_elems =
 * n_head_kv * D. Every 16-byte chunk of the tile is one load; at most 8 K and 8 V chunks per thread
 * are in flight before they are widened and stored. */
template <int D, bool F16>
__device__ __forceinline__ void load_kv_tile(float *sK, float *sV, const void *kb, const void *vb, int slot,
                                             int64_t row_elems, int tid) {
    constexpr int KS = D + kPad;
    constexpr int VEC = F16 ? 8 : 4;                 /* elements per 16 bytes */
    constexpr int EB = F16 ? 2 : 4;                  /* bytes per element */
    constexpr int CPR = D / VEC;                     /* chunks per key row */
    constexpr int CPT = kKeys * CPR / kThreads;      /* chunks per thread per matrix */
    constexpr int GB = CPT < 8 ? CPT : 8;            /* chunks in flight per group */
    static_assert(CPT * kThreads == kKeys * CPR && CPT % GB == 0, "tile chunking");
    const char *kc = static_cast<const char *>(kb);
    const char *vc = static_cast<const char *>(vb);
#pragma unroll
    for (int g = 0; g < CPT; g += GB) {
        uint4 kr[GB], vr[GB];
#pragma unroll
        for (int u = 0; u < GB; u++) {
            const int c = tid + (g + u) * kThreads;
            const int j = c / CPR, part = c % CPR;
            const int sl = __shfl_sync(0xffffffffu, slot, j);
            if (sl >= 0) {
                const int64_t off = ((int64_t)sl * row_elems + (int64_t)part * VEC) * EB;
                kr[u] = __ldg(reinterpret_cast<const uint4 *>(kc + off));
                vr[u] = __ldg(reinterpret_cast<const uint4 *>(vc + off));
            } else {
                kr[u] = make_uint4(0u, 0u, 0u, 0u);
                vr[u] = make_uint4(0u, 0u, 0u, 0u);
            }
        }
#pragma unroll
        for (int u = 0; u < GB; u++) {
            const int c = tid + (g + u) * kThreads;
            const int j = c / CPR, part = c % CPR;
            store_chunk<F16>(sK + j * KS + part * VEC, kr[u]);
            store_chunk<F16>(sV + j * KS + part * VEC, vr[u]);
        }
    }
}

/* The quantized pages' tile (issue 13): keys k0 + j (j < 32) of this CTA's kv head decoded into sK / sV
 * (fp32, row stride D + kPad), once per tile, in shared memory only. A key's K (V) row is RB bytes
 * (fp8: D codes; nvfp4: D / 2 bytes of code pairs) at kb + slot * row_bytes, its nvfp4 micro-block
 * scales D / 16 bytes at ksc + slot * scale_bytes (kb / ksc already offset to kv head kvh). The rows
 * are read in chunks of CB bytes (16, or fewer when a row is short, so that the 32 keys' chunks spread
 * evenly over the 128 threads), each chunk with its one or two scale bytes. A value is one fp32 product:
 * e4m3(code) * kfix (fp8: kfix the head's scale) or e2m1(code) * (e4m3(scale) * kfix) (nvfp4: kfix the
 * tensor scale), exactly the CPU read's and core/dtype.c's dequantized value. `slot` < 0 (past the
 * split's end): zeros, as for f16 pages. */
template <int D, int KV>
__device__ __forceinline__ void load_kv_tile_q(float *sK, float *sV, const uint8_t *kb, const uint8_t *vb,
                                               const uint8_t *ksc, const uint8_t *vsc, float kfix, float vfix,
                                               int slot, int64_t row_bytes, int64_t scale_bytes, int tid) {
    static_assert(KV == kKvFp8 || KV == kKvNvfp4, "quantized pages");
    constexpr bool FP8 = KV == kKvFp8;
    constexpr int KS = D + kPad;
    constexpr int RB = FP8 ? D : D / 2;           /* bytes of one key's row */
    constexpr int CB = RB / 4 < 16 ? RB / 4 : 16; /* bytes per chunk */
    constexpr int W = CB / 4;                     /* 32-bit words per chunk */
    constexpr int VPC = FP8 ? CB : 2 * CB;        /* values per chunk */
    constexpr int NSC = VPC >= 16 ? VPC / 16 : 1; /* nvfp4 scale bytes per chunk */
    constexpr int CPR = RB / CB;                  /* chunks per key row */
    constexpr int CPT = kKeys * CPR / kThreads;   /* chunks per thread per matrix */
    static_assert(CB >= 4 && CB % 4 == 0 && CPT >= 1 && CPT * kThreads == kKeys * CPR && VPC % 8 == 0, "tile chunking");
#pragma unroll
    for (int g = 0; g < CPT; g++) {
        const int c = tid + g * kThreads;
        const int j = c / CPR, part = c % CPR;
        const int sl = __shfl_sync(0xffffffffu, slot, j);
        uint32_t kw[W], vw[W], ks[NSC], vs[NSC];
        if (sl >= 0) {
            const int64_t off = (int64_t)sl * row_bytes + (int64_t)part * CB;
            if constexpr (W == 4) {
                const uint4 a = __ldg(reinterpret_cast<const uint4 *>(kb + off));
                const uint4 b = __ldg(reinterpret_cast<const uint4 *>(vb + off));
                kw[0] = a.x, kw[1] = a.y, kw[2] = a.z, kw[3] = a.w;
                vw[0] = b.x, vw[1] = b.y, vw[2] = b.z, vw[3] = b.w;
            } else if constexpr (W == 2) {
                const uint2 a = __ldg(reinterpret_cast<const uint2 *>(kb + off));
                const uint2 b = __ldg(reinterpret_cast<const uint2 *>(vb + off));
                kw[0] = a.x, kw[1] = a.y;
                vw[0] = b.x, vw[1] = b.y;
            } else {
                kw[0] = __ldg(reinterpret_cast<const uint32_t *>(kb + off));
                vw[0] = __ldg(reinterpret_cast<const uint32_t *>(vb + off));
            }
            if constexpr (!FP8) {
                const int64_t soff = (int64_t)sl * scale_bytes + (int64_t)part * VPC / 16;
#pragma unroll
                for (int i = 0; i < NSC; i++) ks[i] = __ldg(ksc + soff + i), vs[i] = __ldg(vsc + soff + i);
            }
        } else {
#pragma unroll
            for (int i = 0; i < W; i++) kw[i] = vw[i] = 0u;
#pragma unroll
            for (int i = 0; i < NSC; i++) ks[i] = vs[i] = 0u;
        }
        float *dk = sK + j * KS + part * VPC, *dv = sV + j * KS + part * VPC;
        if constexpr (FP8) {
            /* word i holds values 4i .. 4i + 3, the lowest byte first */
#pragma unroll
            for (int i = 0; i < W; i++) {
                const float2 k01 = osp_dev_e4m3x2_to_float2(kw[i]), k23 = osp_dev_e4m3x2_to_float2(kw[i] >> 16);
                const float2 v01 = osp_dev_e4m3x2_to_float2(vw[i]), v23 = osp_dev_e4m3x2_to_float2(vw[i] >> 16);
                reinterpret_cast<float4 *>(dk)[i] = make_float4(__fmul_rn(k01.x, kfix), __fmul_rn(k01.y, kfix),
                                                                __fmul_rn(k23.x, kfix), __fmul_rn(k23.y, kfix));
                reinterpret_cast<float4 *>(dv)[i] = make_float4(__fmul_rn(v01.x, vfix), __fmul_rn(v01.y, vfix),
                                                                __fmul_rn(v23.x, vfix), __fmul_rn(v23.y, vfix));
            }
        } else {
            /* word i holds values 8i .. 8i + 7, value 8i + n in nibble n; micro-block b of the chunk is
             * values 16b .. 16b + 15, i.e. words 2b and 2b + 1 */
            float kbs[NSC], vbs[NSC];
#pragma unroll
            for (int i = 0; i < NSC; i++) {
                kbs[i] = __fmul_rn(osp_dev_e4m3_to_fp32(ks[i]), kfix);
                vbs[i] = __fmul_rn(osp_dev_e4m3_to_fp32(vs[i]), vfix);
            }
#pragma unroll
            for (int i = 0; i < W; i++) {
                const float kscl = kbs[i / 2 < NSC ? i / 2 : NSC - 1], vscl = vbs[i / 2 < NSC ? i / 2 : NSC - 1];
                float kf[8], vf[8];
#pragma unroll
                for (int n = 0; n < 8; n++) {
                    kf[n] = __fmul_rn(osp_dev_e2m1_to_fp32(kw[i] >> (4 * n)), kscl);
                    vf[n] = __fmul_rn(osp_dev_e2m1_to_fp32(vw[i] >> (4 * n)), vscl);
                }
                reinterpret_cast<float4 *>(dk)[2 * i] = make_float4(kf[0], kf[1], kf[2], kf[3]);
                reinterpret_cast<float4 *>(dk)[2 * i + 1] = make_float4(kf[4], kf[5], kf[6], kf[7]);
                reinterpret_cast<float4 *>(dv)[2 * i] = make_float4(vf[0], vf[1], vf[2], vf[3]);
                reinterpret_cast<float4 *>(dv)[2 * i + 1] = make_float4(vf[4], vf[5], vf[6], vf[7]);
            }
        }
    }
}

/* The int8_hier pages' tile (issue 14): keys k0 + j (j < 32) of this CTA's kv head decoded into sK / sV
 * (fp32, row stride D + kPad). A key's K (V) row is D / 2 bytes of upper codes then its f16 S and M at
 * kb + slot * row_bytes (kb already offset to kv head kvh), its lower codes D / 2 bytes at
 * klo + slot * lo_bytes. `full` (lane j's, for key k0 + j): both halves, M + S32 (32 u + 2 l - 15) with
 * S32 = S / 32; else the upper codes alone, M + S u, and the lower pool is not touched (the draft's
 * saving). Each value is osp_int8h_dequantize_row's fp32 value, bit for bit (kv_quant.cuh). The codes
 * are read in chunks of CB bytes (16, or fewer when a row is short, so that the 32 keys' chunks spread
 * evenly over the 128 threads): the upper ones by 32-bit loads (a page row of D / 2 + 4 bytes is only
 * 4-byte aligned), the lower ones by one vector load; each chunk's thread reads its row's S and M (one
 * 32-bit load). `slot` < 0: zeros (S = M = 0), as for f16 pages. */
template <int D>
__device__ __forceinline__ void load_kv_tile_h(float *sK, float *sV, const uint8_t *kb, const uint8_t *vb,
                                               const uint8_t *klo, const uint8_t *vlo, int slot, bool full,
                                               int64_t row_bytes, int64_t lo_bytes, int tid) {
    constexpr int KS = D + kPad;
    constexpr int RB = D / 2;                     /* bytes of one key's upper (and lower) codes */
    constexpr int CB = RB / 4 < 16 ? RB / 4 : 16; /* code bytes per chunk */
    constexpr int W = CB / 4;                     /* 32-bit words per chunk */
    constexpr int VPC = 2 * CB;                   /* values per chunk */
    constexpr int CPR = RB / CB;                  /* chunks per key row */
    constexpr int CPT = kKeys * CPR / kThreads;   /* chunks per thread per matrix */
    static_assert(CB >= 4 && CB % 4 == 0 && CPT >= 1 && CPT * kThreads == kKeys * CPR && VPC % 8 == 0, "tile chunking");
#pragma unroll
    for (int g = 0; g < CPT; g++) {
        const int c = tid + g * kThreads;
        const int j = c / CPR, part = c % CPR;
        const int sl = __shfl_sync(0xffffffffu, slot, j);
        const bool fl = __shfl_sync(0xffffffffu, (int)full, j) != 0;
        uint32_t ku[W], vu[W], kl[W], vl[W], ksm = 0u, vsm = 0u;
#pragma unroll
        for (int i = 0; i < W; i++) ku[i] = vu[i] = kl[i] = vl[i] = 0u;
        if (sl >= 0) {
            const int64_t off = (int64_t)sl * row_bytes;
#pragma unroll
            for (int i = 0; i < W; i++) {
                ku[i] = __ldg(reinterpret_cast<const uint32_t *>(kb + off + part * CB + 4 * i));
                vu[i] = __ldg(reinterpret_cast<const uint32_t *>(vb + off + part * CB + 4 * i));
            }
            ksm = __ldg(reinterpret_cast<const uint32_t *>(kb + off + RB));
            vsm = __ldg(reinterpret_cast<const uint32_t *>(vb + off + RB));
            if (fl) {
                const int64_t lo = (int64_t)sl * lo_bytes + (int64_t)part * CB;
                if constexpr (W == 4) {
                    const uint4 a = __ldg(reinterpret_cast<const uint4 *>(klo + lo));
                    const uint4 b = __ldg(reinterpret_cast<const uint4 *>(vlo + lo));
                    kl[0] = a.x, kl[1] = a.y, kl[2] = a.z, kl[3] = a.w;
                    vl[0] = b.x, vl[1] = b.y, vl[2] = b.z, vl[3] = b.w;
                } else if constexpr (W == 2) {
                    const uint2 a = __ldg(reinterpret_cast<const uint2 *>(klo + lo));
                    const uint2 b = __ldg(reinterpret_cast<const uint2 *>(vlo + lo));
                    kl[0] = a.x, kl[1] = a.y;
                    vl[0] = b.x, vl[1] = b.y;
                } else {
                    kl[0] = __ldg(reinterpret_cast<const uint32_t *>(klo + lo));
                    vl[0] = __ldg(reinterpret_cast<const uint32_t *>(vlo + lo));
                }
            }
        }
        const float kS = osp_dev_f16_bits_to_fp32(ksm & 0xFFFFu), kM = osp_dev_f16_bits_to_fp32(ksm >> 16);
        const float vS = osp_dev_f16_bits_to_fp32(vsm & 0xFFFFu), vM = osp_dev_f16_bits_to_fp32(vsm >> 16);
        const float kS32 = __fmul_rn(kS, 0.03125f), vS32 = __fmul_rn(vS, 0.03125f);
        float *dk = sK + j * KS + part * VPC, *dv = sV + j * KS + part * VPC;
        /* word i holds values 8i .. 8i + 7 of the chunk, value 8i + n in nibble n */
#pragma unroll
        for (int i = 0; i < W; i++) {
            float kf[8], vf[8];
#pragma unroll
            for (int n = 0; n < 8; n++) {
                const uint32_t uk = (ku[i] >> (4 * n)) & 0xFu, uv = (vu[i] >> (4 * n)) & 0xFu;
                if (fl) {
                    kf[n] = osp_dev_int8h_full(uk, (kl[i] >> (4 * n)) & 0xFu, kS32, kM);
                    vf[n] = osp_dev_int8h_full(uv, (vl[i] >> (4 * n)) & 0xFu, vS32, vM);
                } else {
                    kf[n] = osp_dev_int8h_upper(uk, kS, kM);
                    vf[n] = osp_dev_int8h_upper(uv, vS, vM);
                }
            }
            reinterpret_cast<float4 *>(dk)[2 * i] = make_float4(kf[0], kf[1], kf[2], kf[3]);
            reinterpret_cast<float4 *>(dk)[2 * i + 1] = make_float4(kf[4], kf[5], kf[6], kf[7]);
            reinterpret_cast<float4 *>(dv)[2 * i] = make_float4(vf[0], vf[1], vf[2], vf[3]);
            reinterpret_cast<float4 *>(dv)[2 * i + 1] = make_float4(vf[4], vf[5], vf[6], vf[7]);
        }
    }
}

/* One warp, its first NR rows (row i of the warp = CTA row i * kWarps + warp), one tile: scores of
 * key k0 + lane, online-softmax update, then acc += P V. Keys at or past `ke`, past a row's own
 * limit (positions[t] + 1: causal) or before its first key (sliding window) get probability 0. */
template <int D, int NR>
__device__ __forceinline__ void tile_rows(const float *sK, const float *sV, const float *sQ, float *sPw, int warp,
                                          int lane, int k0, int ke, const int (&first)[kRowsPerWarp],
                                          const int (&lim)[kRowsPerWarp],
                                          float (&m)[kRowsPerWarp], float (&l)[kRowsPerWarp],
                                          float (&acc)[kRowsPerWarp][D / 32]) {
    static_assert(NR >= 1 && NR <= kRowsPerWarp, "rows per warp");
    constexpr int KS = D + kPad;
    constexpr int DPL = D / 32;

    /* s_i = q_i . k_lane, four partial sums per row for ILP */
    float sx[NR], sy[NR], sz[NR], sw[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) sx[i] = sy[i] = sz[i] = sw[i] = 0.0f;
    const float *krow = sK + lane * KS;
#pragma unroll 8
    for (int d = 0; d < D; d += 4) {
        const float4 kv = *reinterpret_cast<const float4 *>(krow + d);
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const float4 qv = *reinterpret_cast<const float4 *>(sQ + (i * kWarps + warp) * D + d);
            sx[i] = fmaf(qv.x, kv.x, sx[i]);
            sy[i] = fmaf(qv.y, kv.y, sy[i]);
            sz[i] = fmaf(qv.z, kv.z, sz[i]);
            sw[i] = fmaf(qv.w, kv.w, sw[i]);
        }
    }

    const int key = k0 + lane;
#pragma unroll
    for (int i = 0; i < NR; i++) {
        const float s =
            (key < ke && key < lim[i] && key >= first[i]) ? (sx[i] + sy[i]) + (sz[i] + sw[i]) : -INFINITY;
        const float m_new = fmaxf(m[i], warp_max(s));
        const float m_use = m_new == -INFINITY ? 0.0f : m_new; /* no key yet: keep everything 0 */
        const float alpha = exp2f(m[i] - m_use);                 /* 0 when m[i] = -inf */
        const float pj = exp2f(s - m_use);                       /* 0 for masked keys */
        l[i] = l[i] * alpha + pj;                                /* per-lane partial sum */
        m[i] = m_new;
#pragma unroll
        for (int e = 0; e < DPL; e++) acc[i][e] *= alpha;
        sPw[i * kKeys + lane] = pj;
    }
    __syncwarp();

    /* acc_i[dims] += sum_j p_ij v_j[dims] */
#pragma unroll 2
    for (int j = 0; j < kKeys; j += 4) {
        float4 pv[NR];
#pragma unroll
        for (int i = 0; i < NR; i++) pv[i] = *reinterpret_cast<const float4 *>(sPw + i * kKeys + j);
        float v[DPL];
        load_lane_dims<D>(sV + (j + 0) * KS, lane, v);
#pragma unroll
        for (int i = 0; i < NR; i++)
#pragma unroll
            for (int e = 0; e < DPL; e++) acc[i][e] = fmaf(f4_get<0>(pv[i]), v[e], acc[i][e]);
        load_lane_dims<D>(sV + (j + 1) * KS, lane, v);
#pragma unroll
        for (int i = 0; i < NR; i++)
#pragma unroll
            for (int e = 0; e < DPL; e++) acc[i][e] = fmaf(f4_get<1>(pv[i]), v[e], acc[i][e]);
        load_lane_dims<D>(sV + (j + 2) * KS, lane, v);
#pragma unroll
        for (int i = 0; i < NR; i++)
#pragma unroll
            for (int e = 0; e < DPL; e++) acc[i][e] = fmaf(f4_get<2>(pv[i]), v[e], acc[i][e]);
        load_lane_dims<D>(sV + (j + 3) * KS, lane, v);
#pragma unroll
        for (int i = 0; i < NR; i++)
#pragma unroll
            for (int e = 0; e < DPL; e++) acc[i][e] = fmaf(f4_get<3>(pv[i]), v[e], acc[i][e]);
    }
    __syncwarp(); /* sPw is rewritten by the next tile */
}

/* A warp's rows' softmax state emptied: max -inf, sum 0, accumulators 0 (a chunk's state, or fold mode's). */
template <int D>
__device__ __forceinline__ void clear_rows(float (&m)[kRowsPerWarp], float (&l)[kRowsPerWarp],
                                           float (&acc)[kRowsPerWarp][D / 32]) {
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int e = 0; e < D / 32; e++) acc[i][e] = 0.0f;
    }
}

/* ---- kernels ------------------------------------------------------------------------------------------ */

template <int D> constexpr size_t attn_smem_bytes() {
    return sizeof(float) * (size_t)(2 * kKeys * (D + kPad) + kRows * D + kRows * kKeys);
}

template <int D, int KV> __global__ void __launch_bounds__(kThreads) paged_attention_kernel(const AttnParams p) {
    osp_pdl_begin();
    extern __shared__ float4 smem_f4[];
    constexpr int KS = D + kPad;
    constexpr int DPL = D / 32;
    float *sK = reinterpret_cast<float *>(smem_f4); /* [kKeys][KS] */
    float *sV = sK + kKeys * KS;                    /* [kKeys][KS] */
    float *sQ = sV + kKeys * KS;                    /* [kRows][D], pre-scaled by scale * log2 e */
    float *sP = sQ + kRows * D;                     /* [kWarps][kRowsPerWarp][kKeys] */

    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;

    AttnCtaWork w;
    if (!attn_cta_work(p.tl, p.qsl, p.num_seqs, w)) return; /* uniform over the CTA */
    const int s = w.s, t0 = w.t0, ntok = w.ntok, kvh = w.kvh, nh = w.nh, h0 = w.h0;
    const int rows = ntok * nh;                                           /* <= kRows; row r: token t0 + r / nh, head h0 + r % nh */
    /* CTA row r's row of q / out ([T, n_head]) */
    auto out_row = [&](int r) { return (int64_t)(t0 + r / nh) * p.n_head + h0 + r % nh; };

    int kv_len = 0; /* keys any row of the tile sees */
    for (int i = 0; i < ntok; i++) kv_len = max(kv_len, p.positions[t0 + i] + 1);

    /* quantized pages walk the keys in chunks of kQChunk from key 0 and fold them (fold mode) or write
     * each chunk's partial for merge_chunks (split mode): the same bits either way (header) */
    constexpr bool kChunked = KV != kKvF32 && KV != kKvF16;

    /* this split's key range [ks, ke) (f32 / f16 pages; quantized pages: every key of the tile) */
    const int split = (int)blockIdx.z;
    int64_t chunk = kv_len;
    if (!kChunked && p.num_splits > 1) {
        chunk = ((int64_t)kv_len + p.num_splits - 1) / p.num_splits;
        chunk = (chunk + kKeys - 1) / kKeys * kKeys;
        if (chunk < kMinChunk) chunk = kMinChunk;
    }
    const int64_t ks64 = kChunked ? 0 : (int64_t)split * chunk;
    if (ks64 >= kv_len) {
        /* no keys here: a sentinel partial per row (or, with one split and no keys at all, which only
         * an invalid position can cause, zeros) */
        if (kChunked && p.chunks_per_cta > 0) return; /* the merge folds no chunk of such a row: zeros */
        for (int r = tid; r < rows; r += kThreads) {
            const int64_t orow = out_row(r);
            if (!kChunked && p.num_splits > 1) {
                p.ws_ml[(int64_t)split * p.T * p.n_head + orow] = make_float2(-INFINITY, 0.0f);
            } else {
                for (int d = 0; d < D; d++) p.out[orow * D + d] = 0;
            }
        }
        return;
    }
    const int ks = (int)ks64;
    const int ke = (int)min((int64_t)kv_len, ks64 + chunk);
    /* quantized pages: this CTA's chunks [c_begin, c_end) */
    const int n_chunks = (kv_len + kQChunk - 1) / kQChunk;
    int c_begin = 0, c_end = n_chunks;
    if (kChunked && p.chunks_per_cta > 0) {
        c_begin = split * p.chunks_per_cta;
        if (c_begin >= n_chunks) return; /* no row of the tile reaches these chunks: never read */
        c_end = min(c_begin + p.chunks_per_cta, n_chunks);
    }

    /* q rows into shared memory (fp32, times scale * log2 e) */
    for (int idx = tid; idx < rows * D; idx += kThreads) {
        const int r = idx / D, d = idx % D;
        const int64_t qrow = out_row(r);
        sQ[idx] = osp_bf16_to_f(p.q[qrow * D + d]) * p.qscale;
    }

    /* this warp's rows: i < nv, CTA row i * kWarps + warp */
    const int nv = rows > warp ? (rows - warp + kWarps - 1) / kWarps : 0;
    int lim[kRowsPerWarp], first[kRowsPerWarp];
    float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][DPL];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; i++) {
        const int r = i * kWarps + warp;
        lim[i] = i < nv ? p.positions[t0 + r / nh] + 1 : 0;
        first[i] = p.window > 0 && lim[i] > p.window ? lim[i] - p.window : 0;
    }
    clear_rows<D>(m, l, acc);

    const int32_t *bt = p.block_table + (int64_t)s * p.max_blocks;
    const int64_t row_elems = (int64_t)p.n_head_kv * D;
    /* bytes of one value (nvfp4: counted in half bytes below; int8_hier: a head's row is D / 2 + 4 bytes) */
    const size_t eb = KV == kKvF32 ? 4 : KV == kKvF16 ? 2 : 1;
    const size_t kvh_off = KV == kKvNvfp4   ? (size_t)kvh * D / 2
                           : KV == kKvInt8h ? (size_t)kvh * (D / 2 + 4)
                                            : (size_t)kvh * D * eb;
    const void *kb = static_cast<const char *>(p.k_pages) + kvh_off;
    const void *vb = static_cast<const char *>(p.v_pages) + kvh_off;
    /* quantized pages: a key's row bytes, its scale (int8_hier: lower code) bytes, this head's fixed scales */
    const int64_t row_bytes = KV == kKvNvfp4   ? row_elems / 2
                              : KV == kKvInt8h ? (int64_t)p.n_head_kv * (D / 2 + 4)
                                               : row_elems;
    const int64_t scale_bytes = KV == kKvInt8h ? row_elems / 2 : row_elems / 16;
    const uint8_t *ksc = nullptr, *vsc = nullptr;
    float kfix = 1.0f, vfix = 1.0f;
    if constexpr (KV == kKvFp8) {
        kfix = p.k_fixed[kvh];
        vfix = p.v_fixed[kvh];
    } else if constexpr (KV == kKvNvfp4) {
        kfix = p.k_fixed[0];
        vfix = p.v_fixed[0];
        ksc = p.k_scale + (size_t)kvh * (D / 16);
        vsc = p.v_scale + (size_t)kvh * (D / 16);
    } else if constexpr (KV == kKvInt8h) {
        ksc = p.k_scale + (size_t)kvh * (D / 2);
        vsc = p.v_scale + (size_t)kvh * (D / 2);
    }
    /* int8_hier: keys from full_from on are read in full (all of them but under the draft's view, where
     * full_from = seq_len - hier_full_recent: the header says why seq_len) */
    [[maybe_unused]] int full_from = 0;
    if constexpr (KV == kKvInt8h)
        if (p.hier_upper_only) full_from = p.positions[p.qsl[s + 1] - 1] + 1 - p.hier_full_recent;
    float *sPw = sP + warp * kRowsPerWarp * kKeys;

    /* tiles wholly before every row's window hold nothing for this CTA: start at the tile of the
     * earliest first key */
    int k_first = 0;
    if (p.window > 0) {
        int kmin = kv_len;
        for (int i = 0; i < ntok; i++) {
            const int li = p.positions[t0 + i] + 1;
            kmin = min(kmin, li > p.window ? li - p.window : 0);
        }
        k_first = kmin / kKeys * kKeys;
    }
    /* the tiles of keys [k_begin, k_end) (k_begin a multiple of kKeys) into m, l, acc */
    auto walk = [&](int k_begin, int k_end) {
        for (int k0 = k_begin; k0 < k_end; k0 += kKeys) {
            const int key = k0 + lane;
            int slot = -1;
            if (key < k_end) slot = bt[key / p.block_size] * p.block_size + key % p.block_size;
            if constexpr (KV == kKvF32 || KV == kKvF16)
                load_kv_tile<D, KV == kKvF16>(sK, sV, kb, vb, slot, row_elems, tid);
            else if constexpr (KV == kKvInt8h)
                load_kv_tile_h<D>(sK, sV, static_cast<const uint8_t *>(kb), static_cast<const uint8_t *>(vb), ksc,
                                  vsc, slot, key >= full_from, row_bytes, scale_bytes, tid);
            else
                load_kv_tile_q<D, KV>(sK, sV, static_cast<const uint8_t *>(kb), static_cast<const uint8_t *>(vb), ksc,
                                      vsc, kfix, vfix, slot, row_bytes, scale_bytes, tid);
            __syncthreads(); /* tile (and, the first time, sQ) visible to all warps */
            switch (nv) {
            case 1: tile_rows<D, 1>(sK, sV, sQ, sPw, warp, lane, k0, k_end, first, lim, m, l, acc); break;
            case 2: tile_rows<D, 2>(sK, sV, sQ, sPw, warp, lane, k0, k_end, first, lim, m, l, acc); break;
            case 3: tile_rows<D, 3>(sK, sV, sQ, sPw, warp, lane, k0, k_end, first, lim, m, l, acc); break;
            case 4: tile_rows<D, 4>(sK, sV, sQ, sPw, warp, lane, k0, k_end, first, lim, m, l, acc); break;
            default: break;
            }
            __syncthreads(); /* every warp done with sK / sV before the next tile overwrites them */
        }
    };

    if constexpr (kChunked) {
        /* fold mode's state a row: (M, L, O), empty while M is -inf (osp_attn::fold_state) */
        float M[kRowsPerWarp], L[kRowsPerWarp], O[kRowsPerWarp][DPL];
        clear_rows<D>(M, L, O);
        const bool split_mode = p.chunks_per_cta > 0;
        for (int c = c_begin; c < c_end; c++) {
            if (c > c_begin) clear_rows<D>(m, l, acc);
            walk(max(c * kQChunk, k_first), min(kv_len, (c + 1) * kQChunk));
#pragma unroll
            for (int i = 0; i < kRowsPerWarp; i++) {
                if (i >= nv) break;
                const float lsum = warp_sum(l[i]);
                if (split_mode) {
                    /* chunk c's partial of the row (rows that do not reach chunk c are never read) */
                    const int r = i * kWarps + warp;
                    const int64_t pr = out_row(r) * p.ws_stride + c;
                    if (lsum > 0.0f) store_lane_f32<D>(p.ws_acc + pr * D, lane, acc[i]);
                    if (lane == 0) p.ws_ml[pr] = make_float2(m[i], lsum);
                } else {
                    float wA, wc;
                    if (osp_attn::fold_state(M[i], L[i], m[i], lsum, wA, wc)) {
#pragma unroll
                        for (int e = 0; e < DPL; e++) O[i][e] = osp_attn::fold_elem(O[i][e], wA, acc[i][e], wc);
                    }
                }
            }
        }
        if (!split_mode) {
#pragma unroll
            for (int i = 0; i < kRowsPerWarp; i++) {
                if (i >= nv) break;
                const int r = i * kWarps + warp;
                const int64_t orow = out_row(r);
                store_lane_bf16<D>(p.out + orow * D, lane, O[i], osp_attn::out_scale(L[i]));
            }
        }
        return;
    }

    walk(max(ks, k_first), ke);
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; i++) {
        if (i >= nv) break;
        const int r = i * kWarps + warp;
        const int64_t orow = out_row(r);
        const float lsum = warp_sum(l[i]);
        if (p.num_splits == 1) {
            store_lane_bf16<D>(p.out + orow * D, lane, acc[i], lsum > 0.0f ? 1.0f / lsum : 0.0f);
        } else {
            const int64_t pr = (int64_t)split * p.T * p.n_head + orow;
            if (lsum > 0.0f) store_lane_f32<D>(p.ws_acc + pr * D, lane, acc[i]);
            if (lane == 0) p.ws_ml[pr] = make_float2(m[i], lsum);
        }
    }
}

/* One warp per output row (t, h): out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s over the
 * splits with l_s > 0 (M: their largest m). rows = T * n_head; partial row of split s: s * rows + row. */
template <int D>
__global__ void __launch_bounds__(kThreads)
    paged_attention_merge_kernel(const float *ws_acc, const float2 *ws_ml, uint16_t *out, int64_t rows,
                                 int num_splits) {
    osp_pdl_begin();
    constexpr int DPL = D / 32;
    using L = LaneDims<D>;
    const int lane = (int)threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * kWarps + ((int)threadIdx.x >> 5);
    if (row >= rows) return;
    float mx = -INFINITY;
    for (int sp = 0; sp < num_splits; sp++) {
        const float2 ml = ws_ml[(int64_t)sp * rows + row];
        if (ml.y > 0.0f) mx = fmaxf(mx, ml.x);
    }
    float acc[DPL], lsum = 0.0f;
#pragma unroll
    for (int e = 0; e < DPL; e++) acc[e] = 0.0f;
    for (int sp = 0; sp < num_splits; sp++) {
        const int64_t pr = (int64_t)sp * rows + row;
        const float2 ml = ws_ml[pr];
        if (!(ml.y > 0.0f)) continue;
        const float w = exp2f(ml.x - mx);
        lsum = fmaf(w, ml.y, lsum);
        const float *a = ws_acc + pr * D;
#pragma unroll
        for (int c = 0; c < L::NVEC; c++) {
            const float *src = a + L::dim(c, lane);
#pragma unroll
            for (int e = 0; e < L::VW; e++) acc[c * L::VW + e] = fmaf(w, src[e], acc[c * L::VW + e]);
        }
    }
    store_lane_bf16<D>(out + row * D, lane, acc, lsum > 0.0f ? 1.0f / lsum : 0.0f);
}

/* ---- host side ------------------------------------------------------------------------------------------ */

struct Plan {
    AttnTiling tl;
    int num_splits;     /* the grid's z */
    int chunks_per_cta; /* quantized pages: 0 fold mode, else split mode (chunk partials, then the merge) */
    int ws_stride;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int max_splits_for(int32_t max_seq_len) {
    const int64_t n = ceil_div(max_seq_len > 0 ? max_seq_len : 1, kMinChunk);
    return (int)(n < kMaxSplits ? n : kMaxSplits);
}

/* Depends only on host scalars (the grid of a captured graph is fixed by them). f32 / f16 pages: splits
 * of a length that follows the batch (their older policy). Quantized pages (one_split here) are cut into
 * chunks of kQChunk keys from key 0 whatever the batch, and plan_chunks picks how the chunks are spread. */
Plan make_plan(int64_t T, int32_t num_seqs, int n_head, int n_head_kv, int32_t max_seq_len, bool one_split) {
    Plan pl;
    pl.tl = attn_tiling(T, num_seqs, n_head, n_head_kv, kRows);
    pl.chunks_per_cta = 0;
    pl.ws_stride = 0;
    if (one_split) {
        pl.num_splits = 1;
        return pl;
    }
    const int64_t base = pl.tl.n_tiles * n_head_kv * pl.tl.head_chunks;
    int64_t ns = base >= kTargetCtas ? 1 : ceil_div(kTargetCtas, base);
    const int cap = max_splits_for(max_seq_len);
    if (ns > cap) ns = cap;
    if (ns > 1 && T * n_head * ns > kMaxSplitRows) ns = kMaxSplitRows / (T * n_head);
    pl.num_splits = ns < 1 ? 1 : (int)ns;
    return pl;
}

bool aligned16(const void *ptr) { return ((uintptr_t)ptr & 15u) == 0; }

/* Quantized pages: fold mode (a CTA walks all its tile's chunks) or split mode (a CTA a run of chunks,
 * each chunk's partial to the workspace, then osp_cuda_attention_merge_chunks); the same bits either way,
 * so the choice may follow the launch: split when the query tiles alone leave the GPU under-filled
 * (fewer than kTargetCtas / 2 CTAs), there are two chunks or more and the partials fit the budget
 * osp_cuda_attention_workspace_bytes allocates. OSPREY_CUDA_ATTENTION=fold / split force a mode (split
 * still only where the workspace allows). */
void plan_chunks(Plan &pl, int64_t T, int n_head, int n_head_kv, int D, int32_t max_seq_len, bool have_ws) {
    const int64_t n_chunks = ceil_div(max_seq_len, kQChunk);
    const int64_t base = pl.tl.n_tiles * n_head_kv * pl.tl.head_chunks;
    const size_t need = osp_cuda_attention_v1_split_bytes(T, n_head, D, max_seq_len);
    const int forced = osp_cuda_attention_forced_mode();
    const bool split = have_ws && n_chunks > 1 && n_chunks <= 65535 && need > 0 && need <= OSP_CUDA_ATTN_SPLIT_BUDGET &&
                       forced != OSP_CUDA_ATTN_FOLD && (forced == OSP_CUDA_ATTN_SPLIT || 2 * base < kTargetCtas);
    if (!split) return;
    int64_t runs = forced == OSP_CUDA_ATTN_SPLIT ? n_chunks : ceil_div(kTargetCtas, base);
    if (runs > n_chunks) runs = n_chunks;
    const int64_t per = ceil_div(n_chunks, runs);
    pl.chunks_per_cta = (int)per;
    pl.num_splits = (int)ceil_div(n_chunks, per);
    pl.ws_stride = (int)osp_cuda_attention_chunk_stride(max_seq_len);
}

template <int D, int KV> osp_status launch(const AttnParams &prm, const Plan &pl, cudaStream_t st) {
    constexpr size_t smem = attn_smem_bytes<D>();
    if (smem > 48 * 1024)
        OSP_CUDA_TRY(cudaFuncSetAttribute(paged_attention_kernel<D, KV>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid((unsigned)pl.tl.n_tiles, (unsigned)(prm.n_head_kv * pl.tl.head_chunks), (unsigned)pl.num_splits);
    osp_launch(paged_attention_kernel<D, KV>, grid, kThreads, smem, st, prm);
    OSP_CUDA_LAUNCH_CHECK("paged_attention_kernel");
    if (pl.chunks_per_cta > 0)
        return osp_cuda_attention_merge_chunks(prm.ws_acc, prm.ws_ml, prm.out, prm.positions, prm.T, prm.n_head, D,
                                               pl.ws_stride, st);
    if (pl.num_splits > 1) {
        const int64_t rows = (int64_t)prm.T * prm.n_head;
        osp_launch(paged_attention_merge_kernel<D>, (unsigned)ceil_div(rows, kWarps), kThreads, 0, st, prm.ws_acc,
                   prm.ws_ml, prm.out, rows, pl.num_splits);
        OSP_CUDA_LAUNCH_CHECK("paged_attention_merge_kernel");
    }
    return OSP_OK;
}

} // namespace

extern "C" bool osp_cuda_attention_supported(int n_head, int n_head_kv, int D) {
    return n_head > 0 && n_head_kv > 0 && n_head % n_head_kv == 0 && (D == 32 || D == 64 || D == 128 || D == 256);
}

extern "C" size_t osp_cuda_attention_workspace_bytes(int64_t max_tokens, int n_head, int D, int32_t max_seq_len) {
    if (max_tokens <= 0 || n_head <= 0 || D <= 0) return 0;
    const int cap = max_splits_for(max_seq_len);
    /* v0: make_plan keeps T * n_head * splits <= kMaxSplitRows whenever it splits, and splits <= cap */
    int64_t rows = cap <= 1 ? 0 : max_tokens * n_head * cap;
    if (rows > kMaxSplitRows) rows = kMaxSplitRows;
    const size_t v0 = (size_t)rows * ((size_t)D * sizeof(float) + sizeof(float2));
    /* v1: split mode runs only when its partials fit OSP_CUDA_ATTN_SPLIT_BUDGET */
    size_t v1 = osp_cuda_attention_v1_split_bytes(max_tokens, n_head, D, max_seq_len);
    if (v1 > OSP_CUDA_ATTN_SPLIT_BUDGET) v1 = OSP_CUDA_ATTN_SPLIT_BUDGET;
    return v0 > v1 ? v0 : v1;
}

namespace {

template <int D> osp_status launch_kv(uint32_t kv_type, const AttnParams &prm, const Plan &pl, cudaStream_t st) {
    switch (kv_type) {
    case OSP_KV_PAGE_F16: return launch<D, kKvF16>(prm, pl, st);
    case OSP_KV_PAGE_FP8: return launch<D, kKvFp8>(prm, pl, st);
    case OSP_KV_PAGE_NVFP4: return launch<D, kKvNvfp4>(prm, pl, st);
    case OSP_KV_PAGE_INT8H: return launch<D, kKvInt8h>(prm, pl, st);
    default: return launch<D, kKvF32>(prm, pl, st);
    }
}

} // namespace

extern "C" osp_status osp_cuda_paged_attention(const uint16_t *d_q, const void *d_k_pages, const void *d_v_pages,
                                               uint32_t kv_type, uint16_t *d_out, int32_t num_seqs,
                                               const int32_t *d_query_start_loc, const int32_t *d_positions,
                                               const int32_t *d_block_table, int32_t max_blocks, int32_t block_size,
                                               int64_t T, int n_head, int n_head_kv, int D, float scale,
                                               int32_t window, int32_t max_seq_len, void *d_workspace,
                                               void *stream) {
    if (kv_type != OSP_KV_PAGE_F16 && kv_type != OSP_KV_PAGE_F32)
        return osp_set_error(OSP_ERR_INVALID_ARG, "cuda paged attention: KV page type %u is not f32 or f16 (quantized "
                                                  "pages go through osp_cuda_paged_attention_q)", kv_type);
    return osp_cuda_paged_attention_q(d_q, d_k_pages, d_v_pages, kv_type, NULL, d_out, num_seqs, d_query_start_loc,
                                      d_positions, d_block_table, max_blocks, block_size, T, n_head, n_head_kv, D, scale,
                                      window, max_seq_len, d_workspace, stream);
}

extern "C" osp_status osp_cuda_paged_attention_q(const uint16_t *d_q, const void *d_k_pages, const void *d_v_pages,
                                                 uint32_t kv_type, const osp_cuda_kv_quant *kq, uint16_t *d_out,
                                                 int32_t num_seqs, const int32_t *d_query_start_loc,
                                                 const int32_t *d_positions, const int32_t *d_block_table,
                                                 int32_t max_blocks, int32_t block_size, int64_t T, int n_head,
                                                 int n_head_kv, int D, float scale, int32_t window,
                                                 int32_t max_seq_len, void *d_workspace, void *stream) {
    const bool hier = kv_type == OSP_KV_PAGE_INT8H;
    const bool fixed = kv_type == OSP_KV_PAGE_FP8 || kv_type == OSP_KV_PAGE_NVFP4; /* fixed scales */
    const bool quant = fixed || hier;
    if (kv_type != OSP_KV_PAGE_F16 && kv_type != OSP_KV_PAGE_F32 && !quant)
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "cuda paged attention: KV page type %u is not f32, f16, fp8, nvfp4 or int8_hier", kv_type);
    if (fixed && (!kq || !kq->d_k_fixed || !kq->d_v_fixed ||
                  (kv_type == OSP_KV_PAGE_NVFP4 && (!kq->d_k_scale || !kq->d_v_scale))))
        return osp_set_error(OSP_ERR_INVALID_ARG, "cuda paged attention: %s pages without their scales",
                             kv_type == OSP_KV_PAGE_FP8 ? "fp8" : "nvfp4");
    if (hier && (!kq || !kq->d_k_scale || !kq->d_v_scale))
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "cuda paged attention: int8_hier pages without their lower-code pools");
    if (hier && kq->hier_upper_only && kq->hier_full_recent < 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "cuda paged attention: int8_hier full_recent %d (must be >= 0)",
                             (int)kq->hier_full_recent);
    if (!osp_cuda_attention_supported(n_head, n_head_kv, D))
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "cuda paged attention: unsupported shape n_head %d, n_head_kv %d, head_dim %d "
                             "(head_dim 32/64/128/256, n_head a multiple of n_head_kv)",
                             n_head, n_head_kv, D);
    if (T < 0 || T > INT32_MAX / 2 || num_seqs < 0 || (T > 0 && num_seqs == 0) || block_size < 1 ||
        max_blocks < 1 || max_seq_len < 1 || !isfinite(scale))
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "cuda paged attention: bad arguments (T %lld, num_seqs %d, block_size %d, max_blocks "
                             "%d, max_seq_len %d, scale %g)",
                             (long long)T, (int)num_seqs, (int)block_size, (int)max_blocks, (int)max_seq_len,
                             (double)scale);
    if (T == 0) return OSP_OK;
    if (!d_q || !d_k_pages || !d_v_pages || !d_out || !d_query_start_loc || !d_positions || !d_block_table)
        return osp_set_error(OSP_ERR_INVALID_ARG, "cuda paged attention: NULL device pointer");
    if (!aligned16(d_q) || !aligned16(d_k_pages) || !aligned16(d_v_pages) || !aligned16(d_out))
        return osp_set_error(OSP_ERR_INVALID_ARG, "cuda paged attention: q, out and the pages must be 16-byte aligned");
    /* v4 copies a row's NVFP4 micro-block scales (D / 16 bytes) in one piece */
    if (kv_type == OSP_KV_PAGE_NVFP4 &&
        (((uintptr_t)kq->d_k_scale | (uintptr_t)kq->d_v_scale) & (uintptr_t)(D / 16 - 1)) != 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "cuda paged attention: nvfp4 scale pools must be %d-byte aligned", D / 16);
    /* int8_hier's lower codes are read 16 bytes at a time */
    if (hier && (!aligned16(kq->d_k_scale) || !aligned16(kq->d_v_scale)))
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "cuda paged attention: int8_hier lower-code pools must be 16-byte aligned");

    /* the tensor-core kernels take f16 pages, E4M3 pages under wgmma (osp_cuda_attention_tc_serves) and
     * NVFP4 pages at D 64 / 128 (v4, osp_cuda_attention_v4_nvfp4); the rest, INT8_HIER always, runs here
     * whatever mode is forced */
    const bool nv_tc = kv_type == OSP_KV_PAGE_NVFP4 &&
                       osp_cuda_attention_v4_nvfp4(osp_cuda_attention_forced_mode(), D, n_head / n_head_kv);
    if (!hier && (nv_tc || osp_cuda_attention_tc_serves(kv_type, D)))
        return osp_cuda_paged_attention_v1(d_q, d_k_pages, d_v_pages, kv_type, fixed ? kq->d_k_fixed : NULL,
                                           fixed ? kq->d_v_fixed : NULL, nv_tc ? kq->d_k_scale : NULL,
                                           nv_tc ? kq->d_v_scale : NULL, d_out, num_seqs, d_query_start_loc, d_positions,
                                           d_block_table, max_blocks, block_size, T, n_head, n_head_kv, D, scale,
                                           window, max_seq_len, d_workspace, stream);
    Plan pl = make_plan(T, num_seqs, n_head, n_head_kv, max_seq_len, quant);
    if (quant) plan_chunks(pl, T, n_head, n_head_kv, D, max_seq_len, d_workspace && aligned16(d_workspace));
    if (pl.tl.n_tiles > INT32_MAX || (int64_t)n_head_kv * pl.tl.head_chunks > 65535)
        return osp_set_error(OSP_ERR_INVALID_ARG, "cuda paged attention: batch too large for one launch");
    AttnParams prm;
    prm.q = d_q;
    prm.k_pages = d_k_pages;
    prm.v_pages = d_v_pages;
    prm.k_scale = quant ? kq->d_k_scale : nullptr;
    prm.v_scale = quant ? kq->d_v_scale : nullptr;
    prm.k_fixed = fixed ? kq->d_k_fixed : nullptr;
    prm.v_fixed = fixed ? kq->d_v_fixed : nullptr;
    prm.hier_upper_only = hier && kq->hier_upper_only;
    prm.hier_full_recent = hier && kq->hier_upper_only ? (int)kq->hier_full_recent : 0;
    prm.out = d_out;
    prm.qsl = d_query_start_loc;
    prm.positions = d_positions;
    prm.block_table = d_block_table;
    prm.ws_acc = nullptr;
    prm.ws_ml = nullptr;
    prm.window = window > 0 ? window : 0;
    prm.chunks_per_cta = pl.chunks_per_cta;
    prm.ws_stride = pl.ws_stride;
    if (pl.chunks_per_cta > 0) {
        prm.ws_acc = static_cast<float *>(d_workspace);
        prm.ws_ml = reinterpret_cast<float2 *>(prm.ws_acc + (size_t)pl.ws_stride * (size_t)T * n_head * D);
    } else if (pl.num_splits > 1) {
        if (!d_workspace || !aligned16(d_workspace))
            return osp_set_error(OSP_ERR_INVALID_ARG,
                                 "cuda paged attention: a 16-byte aligned workspace of "
                                 "osp_cuda_attention_workspace_bytes() is needed (max_seq_len %d)",
                                 (int)max_seq_len);
        prm.ws_acc = static_cast<float *>(d_workspace);
        prm.ws_ml = reinterpret_cast<float2 *>(prm.ws_acc + (size_t)pl.num_splits * (size_t)T * n_head * D);
    }
    prm.num_seqs = num_seqs;
    prm.max_blocks = max_blocks;
    prm.block_size = block_size;
    prm.T = (int32_t)T;
    prm.n_head = n_head;
    prm.n_head_kv = n_head_kv;
    prm.tl = pl.tl;
    prm.num_splits = pl.num_splits;
    prm.qscale = scale * kLog2e;

    cudaStream_t st = static_cast<cudaStream_t>(stream);
    switch (D) {
    case 32: return launch_kv<32>(kv_type, prm, pl, st);
    case 64: return launch_kv<64>(kv_type, prm, pl, st);
    case 128: return launch_kv<128>(kv_type, prm, pl, st);
    default: return launch_kv<256>(kv_type, prm, pl, st);
    }
}
