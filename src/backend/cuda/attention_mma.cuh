/* What the two tensor-core paged-attention kernels share (attention_mma.cu: v1 / v2, one warpgroup a
 * CTA; attention_ws.cu: v3, warp-specialized): the launch parameters, the fold's arithmetic (the same
 * instructions on the same values everywhere, so every kernel and mode folds to the same bits) and the
 * PTX wrappers. Internal to the CUDA backend. */
#ifndef OSP_BACKEND_CUDA_ATTENTION_MMA_CUH
#define OSP_BACKEND_CUDA_ATTENTION_MMA_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h> /* E4M3 -> f16 (pages of issue 13) */
#include <math.h>
#include <stdint.h>

#include "backend/cuda/attention_tiles.cuh" /* AttnTiling */
#include "backend/cuda/attention_v1.h"      /* OSP_CUDA_ATTN_CHUNK */

namespace osp_attn {

constexpr int kChunk = OSP_CUDA_ATTN_CHUNK; /* keys per chunk: a multiple of the tile */
constexpr float kLog2e = 1.4426950408889634f;

static_assert(kChunk % 64 == 0, "chunks are whole tiles");

/* n / d for 0 <= n < 2^31 and a divisor d >= 1 fixed for the launch, by a multiply-high and a shift
 * (Granlund & Montgomery 1994, "Division by invariant integers using multiplication", section 4):
 * with l = ceil(log2 d) and m = floor(2^32 (2^l - d) / d) + 1, n / d = (umulhi(m, n) + n) >> l. */
struct FastDiv {
    uint32_t m;
    int l;
    static FastDiv make(int d) {
        FastDiv f;
        f.l = 0;
        while ((1ll << f.l) < d) f.l++;
        f.m = (uint32_t)((((1ull << f.l) - (uint64_t)d) << 32) / (uint64_t)d + 1);
        return f;
    }
    __device__ __forceinline__ int div(int n) const {
        return (int)((__umulhi(m, (uint32_t)n) + (uint32_t)n) >> l);
    }
};

struct Params {
    const uint16_t *q;          /* [T, n_head, D] bf16 */
    const uint16_t *k_pages;    /* [num_blocks, block_size, n_head_kv, D] f16, or E4M3 codes (bytes) */
    const uint16_t *v_pages;
    const float *k_fixed, *v_fixed; /* E4M3 pages: the layer's scales, [n_head_kv] fp32; NVFP4 pages: the
                                     * layer's tensor scales, [1] fp32 (fixed_per_tensor); else NULL */
    const uint8_t *k_scale, *v_scale; /* NVFP4 pages (v4 only): the E4M3 micro-block scale pools,
                                       * [num_blocks, block_size, n_head_kv, D / 16]; else NULL */
    bool fixed_per_tensor;      /* k_fixed / v_fixed hold one scale (NVFP4) rather than one a KV head */
    uint16_t *out;              /* [T, n_head, D] bf16 */
    const int32_t *qsl;         /* [num_seqs + 1] */
    const int32_t *positions;   /* [T] */
    const int32_t *block_table; /* [num_seqs, max_blocks] */
    float *ws_acc;              /* split mode: [T, n_head, ws_stride, D] (a row's partials contiguous) */
    float2 *ws_ml;              /* split mode: [T, n_head, ws_stride] (m, l) */
    int ws_stride;              /* split mode: chunks a row in the workspace (the launch's, rounded up to even) */
    int32_t num_seqs, max_blocks, block_size, T;
    int n_head, n_head_kv;
    AttnTiling tl; /* the query tiles (attention_tiles.cuh, kRows rows a CTA) */
    FastDiv bdiv;  /* key / block_size */
    int window;
    int chunks_per_cta; /* split mode: consecutive chunks one CTA computes (each its own partial) */
    float qscale; /* scale * log2(e) */
    bool heavy_first; /* fold mode: the query tiles in reverse slot order (attn_cta_work) */
};

/* ---- the keys a CTA walks (every kernel: part of the numerics) ---------------------------------- */

/* The key range [kb, ke) a CTA of query tile w walks in tiles of KEYS keys from key 0: kb the tile
 * holding the earliest window start of the tile's rows (0 without a window), ke the longest row's
 * position + 1. Split mode (SPLIT) narrows it to the CTA's chunk run (blockIdx.z x p.chunks_per_cta
 * chunks: a launch choice; every chunk's partial is the same whichever CTA computes it) after writing
 * (-inf, 0) partials for the run's chunks wholly before every row's window (the merge reads them);
 * threads tid of nthreads share those writes. false: nothing for this CTA (uniform over it). */
template <int KEYS, bool SPLIT>
__device__ __forceinline__ bool cta_key_range(const Params &p, const AttnCtaWork &w, int tid, int nthreads, int &kb,
                                              int &ke) {
    int kv_len = 0, k_first = INT32_MAX;
    for (int i = 0; i < w.ntok; i++) {
        const int li = p.positions[w.t0 + i] + 1;
        kv_len = max(kv_len, li);
        k_first = min(k_first, p.window > 0 && li > p.window ? li - p.window : 0);
    }
    kb = k_first / KEYS * KEYS, ke = kv_len;
    if constexpr (SPLIT) {
        const int c_begin = (int)blockIdx.z * p.chunks_per_cta;
        if (c_begin * kChunk >= kv_len) return false; /* no row of the tile reaches these chunks: never read */
        const int c_end = min(c_begin + p.chunks_per_cta, (kv_len + kChunk - 1) / kChunk);
        const int rows = w.ntok * w.nh;
        for (int c = c_begin; c < c_end && (c + 1) * kChunk <= kb; c++)
            for (int r = tid; r < rows; r += nthreads) {
                const int64_t orow = (int64_t)(w.t0 + r / w.nh) * p.n_head + w.h0 + r % w.nh;
                p.ws_ml[orow * p.ws_stride + c] = make_float2(-INFINITY, 0.0f);
            }
        kb = max(kb, c_begin * kChunk);
        ke = min(ke, c_end * kChunk);
    }
    return kb < ke;
}

/* ---- the fold (shared by both modes: the same instructions on the same values) --------------- */

/* 2^x: one MUFU.EX2 (flushes subnormal results to 0); every path uses it, so the same bits everywhere */
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Folds chunk state (m, l) into (M, L); returns the two weights for the accumulators through wA, wc.
 * false: the chunk holds nothing (l == 0) and the state is unchanged; *first: the state was empty
 * and becomes the chunk's exactly (wA = 0, wc = 1). The state is empty exactly while M is -inf (it
 * starts at (-inf, 0); a chunk with l > 0 has a finite m, and from then on L >= min(L, l) > 0 and M is
 * finite): tested on M, whose chain is one fmax a chunk, rather than on L, whose chain runs through
 * two ex2 (the merge folding 512 chunks waited on that chain: bench/gpu/NOTES.md). */
__device__ __forceinline__ bool fold_state(float &M, float &L, float m, float l, float &wA, float &wc) {
    if (!(l > 0.0f)) return false;
    if (M == -INFINITY) {
        M = m, L = l, wA = 0.0f, wc = 1.0f;
        return true;
    }
    const float Mn = fmaxf(M, m);
    wA = ex2(M - Mn);
    wc = ex2(m - Mn);
    L = __fmaf_rn(L, wA, __fmul_rn(l, wc));
    M = Mn;
    return true;
}
__device__ __forceinline__ float fold_elem(float A, float wA, float c, float wc) {
    return __fmaf_rn(A, wA, __fmul_rn(c, wc));
}
__device__ __forceinline__ float out_scale(float L) { return L > 0.0f ? __fdiv_rn(1.0f, L) : 0.0f; }

/* ---- PTX wrappers ------------------------------------------------------------------------------- */

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
    const int n = valid ? 16 : 0; /* 0: zero-fill */
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
/* d = a b + d, m16n8k16, f16 operands, fp32 accumulators (PTX ISA, "Matrix Fragments for mma.m16n8k16") */
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* ---- wgmma (sm_90a; PTX ISA 9.7.15 "Asynchronous Warpgroup Level Matrix Multiply-Accumulate") ----
 * A warpgroup (the CTA's 4 warps) issues one m64nNk16 over all 64 rows; warp w owns rows 16 w .. 16 w +
 * 15 of A and of the accumulator, in exactly mma.m16n8k16's fragment layout (A: 4 f16x2 registers;
 * accumulator: element [n][e] is row g + 8 (e >> 1), column 8 n + 2 tq + (e & 1)), so the softmax
 * code is the same for both instructions. B is read from shared memory through a descriptor (9.7.15.5.1.2):
 * 128-byte swizzle, rows of 64 f16 (128 bytes), 8-row atoms of 1024 bytes (1024-byte aligned), the
 * 16-byte chunk j of row r stored at chunk j ^ (r mod 8). */
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* generic-proxy writes to shared memory (cp.async, st.shared) made visible to wgmma's async proxy */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* keeps the compiler from moving uses of an accumulator across the asynchronous instructions */
template <int N> __device__ __forceinline__ void wg_fence_operands(float (&d)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[n][e])::"memory");
}
template <int N> __device__ __forceinline__ void wg_fence_operands(uint32_t (&a)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(a[n][e])::"memory");
}
/* Shared-memory matrix descriptor, 128-byte swizzle: start address, leading-dimension byte offset (N-major:
 * the stride between 64-element column groups; unused for K-major), stride-dimension byte offset (the
 * stride between 8-row groups: 1024 here), all >> 4. */
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFFu) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
/* d (+)= a b, m64n64k16, A from registers (mma.sync's A fragment per warp), B by descriptor;
 * TB: B is N-major (V: keys x D with D contiguous) rather than K-major (K: keys x D as the N x K B) */
template <int TB> __device__ __forceinline__ void wgmma_m64n64(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                   "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                   "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                   "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                   "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(TB));
}

/* d (+)= a b, m64n128k16, A from registers (mma.sync's A fragment per warp), B by descriptor;
 * TB: B is N-major (V: keys x D with D contiguous) rather than K-major (K: keys x D as the N x K B) */
template <int TB> __device__ __forceinline__ void wgmma_m64n128(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                   "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                   "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                   "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                   "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
                   "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
                   "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
                   "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
                   "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
                   "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
                   "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
                   "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
                   "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(TB));
}

/* two E4M3 codes (the low one in bits 0..7) -> f16x2 (the low one in the low half), exactly (every E4M3
 * number is a half; NaN codes give NaN), by the hardware conversion (sm_89+) */
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t w) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xFFFFu), __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}
/* x clamped to f16's finite range (NaN stays NaN) */
__device__ __forceinline__ float clamp_f16_range(float x) { return fabsf(x) > 65504.0f ? copysignf(65504.0f, x) : x; }
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) { /* the same bits in all 4 lanes (a + b == b + a) */
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

} // namespace osp_attn

#endif
