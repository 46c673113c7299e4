/* The elementwise and row kernels of the llama-family forward pass on the GPU (the "ops.cu" part of
 * cuda_ops.h): embedding gather, fused residual add + RMSNorm, gathered RMSNorm, bias + q/k norm +
 * RoPE + KV-page write (f16 / fp32 / fp8 / nvfp4 / int8_hier pages), the SiLU-gated product, argmax, fp32 -> bf16, and the seeded random fill of
 * tools/osprey make-random-model.
 *
 * Why they look like this: every one of them is memory-bound, so each reads and writes its bytes once,
 * coalesced, four values per access (float4 / four bf16 in a uint2) where the shape and the pointers'
 * alignment allow it and a scalar kernel otherwise (any size works). Reductions (the norms, argmax)
 * run one thread block per row with a warp-shuffle + shared-memory tree in a fixed order, so a row's
 * result depends only on that row, never on how many rows share the launch (batch invariance, as the
 * CPU reference). Launchers check shapes on the host, allocate nothing and only enqueue, so every one
 * of them can be captured into a CUDA graph.
 *
 * Agreement with the CPU (src/backend/cpu/ops.c, built as ISO C17, i.e. with -ffp-contract=off):
 * where the result should be bit-identical (the residual add, the fp32 -> bf16 / f16 roundings, the
 * random fill) or as close as the transcendental functions allow (RoPE), the float operations are
 * spelled with __fmul_rn / __fadd_rn, which nvcc never contracts into FMAs. The norms sum squares in
 * fp32 here (double on the CPU): a relative difference of ~1e-7 in the scale, far inside bf16's. */
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/qx.cuh"
#include "backend/cuda/kv_quant.cuh" /* the E4M3 / NVFP4 / INT8_HIER encoders of the quantized KV write */

namespace {

constexpr int kRowThreads = 256;    /* norms: one block per row */
constexpr int kEltThreads = 256;    /* elementwise kernels */
constexpr int kArgmaxThreads = 512; /* argmax: one block per row of a whole vocabulary */
constexpr int kRopeWarps = 4;       /* rope_kv_write: one warp per head, 4 heads per block */
constexpr int kRopeMaxD = 1024;     /* smem: (n_rot + 4 D) floats <= 20 KiB (nvfp4, int8_hier: + 4 D, 36 KiB) */
constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kMaxGridX = 1 << 20; /* beyond it the kernels' grid-stride loops take over */

/* ---- device helpers ----------------------------------------------------------------------------- */

__device__ __forceinline__ float warp_sum(float v) {
    /* butterfly: every lane ends with the same bits (each step adds the same two values) */
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* The sum of v over the block (blockDim.x a multiple of 32), the same value in every thread. red:
 * [32] floats of shared memory, free again when this returns (it ends with a barrier). */
__device__ __forceinline__ float block_sum(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < n_warps ? red[lane] : 0.0f;
    v = warp_sum(v);
    __syncthreads();
    return v;
}

/* Four bf16 values (8 bytes, 8-byte aligned) widened to fp32, and back (round to nearest even). */
__device__ __forceinline__ float4 load_bf16x4(const uint16_t *p) {
    const uint2 u = *reinterpret_cast<const uint2 *>(p);
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
}
__device__ __forceinline__ void store_bf16x4(uint16_t *p, float4 v) {
    uint2 u;
    u.x = (uint32_t)osp_f_to_bf16(v.x) | ((uint32_t)osp_f_to_bf16(v.y) << 16);
    u.y = (uint32_t)osp_f_to_bf16(v.z) | ((uint32_t)osp_f_to_bf16(v.w) << 16);
    *reinterpret_cast<uint2 *>(p) = u;
}

__device__ __forceinline__ int64_t global_thread() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t global_stride() { return (int64_t)gridDim.x * blockDim.x; }

/* ---- embedding ---------------------------------------------------------------------------------- */

/* grid.y walks rows, grid.x columns (in units of VEC values). VEC 4 needs E % 4 == 0. */
template <int VEC>
__global__ void __launch_bounds__(kEltThreads)
    embed_kernel(const uint16_t *__restrict__ table, const int32_t *__restrict__ ids, float *__restrict__ x,
                 int64_t T, int64_t E, float scale) {
    osp_pdl_begin();
    const int64_t n_units = E / VEC;
    for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
        const uint16_t *src = table + (int64_t)ids[t] * E;
        float *dst = x + t * E;
        for (int64_t u = global_thread(); u < n_units; u += global_stride()) {
            if constexpr (VEC == 4) {
                const float4 v = load_bf16x4(src + 4 * u);
                *reinterpret_cast<float4 *>(dst + 4 * u) = make_float4(
                    __fmul_rn(v.x, scale), __fmul_rn(v.y, scale), __fmul_rn(v.z, scale), __fmul_rn(v.w, scale));
            } else {
                dst[u] = __fmul_rn(osp_bf16_to_f(src[u]), scale);
            }
        }
    }
}

/* ---- RMSNorm ------------------------------------------------------------------------------------ */

/* outr = bf16(xr * scale * w) over one row of E values, the threads of the block interleaved as in
 * the sum-of-squares pass (so a thread reads back exactly what it wrote there). */
template <int VEC>
__device__ __forceinline__ void norm_store_row(const float *xr, const float *__restrict__ w, uint16_t *outr,
                                               int64_t E, float scale) {
    const int64_t n_units = E / VEC;
    for (int64_t u = threadIdx.x; u < n_units; u += blockDim.x) {
        if constexpr (VEC == 4) {
            const float4 v = *reinterpret_cast<const float4 *>(xr + 4 * u);
            const float4 g = *reinterpret_cast<const float4 *>(w + 4 * u);
            store_bf16x4(outr + 4 * u,
                         make_float4(v.x * scale * g.x, v.y * scale * g.y, v.z * scale * g.z, v.w * scale * g.w));
        } else {
            outr[u] = osp_f_to_bf16(xr[u] * scale * w[u]);
        }
    }
}

__device__ __forceinline__ float rms_scale(float ss, int64_t E, float eps) {
    return 1.0f / sqrtf(ss / (float)E + eps); /* IEEE division and sqrt (no fast-math) */
}

/* A thread's share of the sum of squares of a row of n_units float4s, v = x (+ float(delta) when dr),
 * kGroup units a thread at a time, every load issued before the first store (x is not __restrict__, so
 * a store would otherwise hold back the next unit's loads: one memory round trip per unit at T = 1); ss
 * adds the units in the same order as one at a time. STORE: x = v in place. add_rmsnorm_kernel and
 * add_rmsnorm_qx_kernel both call this, so their sums are the same bits. */
template <bool STORE>
__device__ __forceinline__ float row_sumsq4(float *xr, const uint16_t *dr, int64_t n_units) {
    constexpr int kGroup = 4;
    float ss = 0.0f;
    for (int64_t u0 = threadIdx.x; u0 < n_units; u0 += kGroup * (int64_t)blockDim.x) {
        float4 v[kGroup], d[kGroup];
#pragma unroll
        for (int k = 0; k < kGroup; k++) {
            const int64_t u = u0 + k * (int64_t)blockDim.x;
            if (u < n_units) {
                v[k] = *reinterpret_cast<const float4 *>(xr + 4 * u);
                if (dr) d[k] = load_bf16x4(dr + 4 * u);
            }
        }
#pragma unroll
        for (int k = 0; k < kGroup; k++) {
            const int64_t u = u0 + k * (int64_t)blockDim.x;
            if (u >= n_units) break;
            if (dr) {
                v[k].x = __fadd_rn(v[k].x, d[k].x), v[k].y = __fadd_rn(v[k].y, d[k].y);
                v[k].z = __fadd_rn(v[k].z, d[k].z), v[k].w = __fadd_rn(v[k].w, d[k].w);
                if (STORE) *reinterpret_cast<float4 *>(xr + 4 * u) = v[k];
            }
            ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
        }
    }
    return ss;
}

/* One block per row: x[t] += float(delta[t]) (when delta), then out[t] = bf16(rmsnorm(x[t]) * w).
 * x is read back after being written by the same thread: no __restrict__ / read-only loads on it. */
template <int VEC>
__global__ void __launch_bounds__(kRowThreads)
    add_rmsnorm_kernel(float *x, const uint16_t *__restrict__ delta, const float *__restrict__ w,
                       uint16_t *__restrict__ out, int64_t T, int64_t E, float eps) {
    osp_pdl_begin();
    __shared__ float red[32];
    const int64_t n_units = E / VEC;
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        float *xr = x + t * E;
        const uint16_t *dr = delta ? delta + t * E : nullptr;
        float ss = 0.0f;
        if constexpr (VEC == 4) {
            ss = row_sumsq4<true>(xr, dr, n_units);
        } else {
            for (int64_t u = threadIdx.x; u < n_units; u += blockDim.x) {
                float v = xr[u];
                if (dr) {
                    v = __fadd_rn(v, osp_bf16_to_f(dr[u]));
                    xr[u] = v;
                }
                ss += v * v;
            }
        }
        if (!out) continue; /* a plain residual add (every thread of the block takes this branch) */
        const float scale = rms_scale(block_sum(ss, red), E, eps);
        norm_store_row<VEC>(xr, w, out + t * E, E, scale);
    }
}

__device__ __forceinline__ unsigned ld_acquire_u32(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* add_rmsnorm_kernel<4> for T <= 8 rows, each split over gridDim.x CTAs of `slice` values (whole
 * GROUPs), that also writes its slice of out quantized for qmma (qx.cuh: the bytes osp_cuda_qx_quantize
 * writes for out). Every CTA of a row computes the whole row's sum of squares with add_rmsnorm_kernel's
 * code (row_sumsq4), so out's bits are that kernel's. x is updated in place, so a CTA writes its slice
 * of x only once every CTA of the row has read the row: a barrier per row over sync[2t] (arrivals) and
 * sync[2t + 1] (its generation): the last CTA to arrive sets the count back to 0 and bumps the
 * generation, the others wait for the bump (so any number of CTAs a row, launch after launch). A row's
 * CTAs are resident together: at most 8 x gridDim.x small CTAs, and the kernel after this one launches
 * only once all of them have started (osp_pdl_begin). Rows t in [T, Tp) quantize zeros. */
template <int GROUP>
__global__ void __launch_bounds__(kRowThreads)
    add_rmsnorm_qx_kernel(float *x, const uint16_t *delta, const float *__restrict__ w, uint16_t *out, int64_t T,
                          int64_t Tp, int64_t E, float eps, int64_t slice, unsigned *sync,
                          int8_t *__restrict__ qc, float4 *__restrict__ qs) {
    osp_pdl_begin();
    __shared__ float red[32];
    const int64_t t = blockIdx.y, c0 = (int64_t)blockIdx.x * slice, c1 = c0 + slice < E ? c0 + slice : E;
    if (t < T) {
        float *xr = x + t * E;
        const uint16_t *dr = delta ? delta + t * E : nullptr;
        const float scale = rms_scale(block_sum(row_sumsq4<false>(xr, dr, E / 4), red), E, eps);
        if (dr) { /* block_sum ended in a barrier: this CTA's reads of the row are done */
            if (threadIdx.x == 0) {
                unsigned *count = sync + 2 * t, *gen = count + 1;
                const unsigned g0 = ld_acquire_u32(gen);
                __threadfence();
                if (atomicAdd(count, 1u) == gridDim.x - 1) {
                    atomicExch(count, 0u);
                    __threadfence();
                    atomicAdd(gen, 1u);
                } else {
                    while (ld_acquire_u32(gen) == g0) __nanosleep(32);
                }
            }
            __syncthreads();
        }
        for (int64_t u = c0 / 4 + threadIdx.x; u < c1 / 4; u += blockDim.x) {
            float4 v = *reinterpret_cast<const float4 *>(xr + 4 * u);
            if (dr) {
                const float4 d = load_bf16x4(dr + 4 * u);
                v.x = __fadd_rn(v.x, d.x), v.y = __fadd_rn(v.y, d.y), v.z = __fadd_rn(v.z, d.z), v.w = __fadd_rn(v.w, d.w);
                *reinterpret_cast<float4 *>(xr + 4 * u) = v;
            }
            const float4 g = *reinterpret_cast<const float4 *>(w + 4 * u);
            store_bf16x4(out + t * E + 4 * u, make_float4(v.x * scale * g.x, v.y * scale * g.y, v.z * scale * g.z,
                                                          v.w * scale * g.w));
        }
    }
    __syncthreads(); /* this CTA's slice of out is written */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
    const uint16_t *orow = out + t * E;
    if constexpr (GROUP == 256) {
        for (int64_t gi = c0 / 256 + warp; gi < c1 / 256; gi += n_warps) {
            float v[8];
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = t < T ? osp_bf16_to_f(orow[gi * 256 + 8 * lane + k]) : 0.0f;
            const int64_t it = osp_qx_item(8 * gi, t, Tp);
            osp_qx_group256(v, lane, qc + it * 64, qs + it, Tp);
        }
    } else {
        for (int64_t b = c0 / 32 + warp; b < c1 / 32; b += n_warps) {
            const float v = t < T ? osp_bf16_to_f(orow[b * 32 + lane]) : 0.0f;
            const int64_t it = osp_qx_item(b, t, Tp);
            osp_qx_block(v, lane, qc + it * 64, qs + it);
        }
    }
}

/* One block per output row i: out[i] = bf16(rmsnorm(x[idx[i]]) * w). */
template <int VEC>
__global__ void __launch_bounds__(kRowThreads)
    gather_rmsnorm_kernel(const float *__restrict__ x, const int32_t *__restrict__ idx, const float *__restrict__ w,
                          uint16_t *__restrict__ out, int64_t n, int64_t E, float eps) {
    osp_pdl_begin();
    __shared__ float red[32];
    const int64_t n_units = E / VEC;
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const float *xr = x + (int64_t)idx[i] * E;
        float ss = 0.0f;
        for (int64_t u = threadIdx.x; u < n_units; u += blockDim.x) {
            if constexpr (VEC == 4) {
                const float4 v = *reinterpret_cast<const float4 *>(xr + 4 * u);
                ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            } else {
                const float v = xr[u];
                ss += v * v;
            }
        }
        const float scale = rms_scale(block_sum(ss, red), E, eps);
        norm_store_row<VEC>(xr, w, out + i * E, E, scale);
    }
}

/* ---- bias + q/k norm + RoPE + KV write ---------------------------------------------------------- */

/* grid.y walks tokens; each block first puts cos / sin of token t's n_rot / 2 angles in shared memory
 * (the CPU's angle: float(pos) * inv_freq[i], sincosf in fp32), then each of its warps takes one head
 * unit: unit < n_head is a q head, then n_head_kv k heads, then n_head_kv v heads (blockIdx.x picks
 * the units). A warp stages its head's D values in its own shared-memory row (bias added, RMS-
 * normalized for q / k when asked), because a rotated value needs its pair partner from another lane,
 * then writes q_out (bf16) or the pages at slot_mapping[t] (k / v skipped when negative): f16 / fp32
 * values, or quantized (issue 13; kv_quant.cuh): fp8 codes e4m3(x / fixed[h]) one per lane as the values
 * come, nvfp4 through a second staging row of the finished values, from which lane j quantizes
 * micro-block j (16 values: one E4M3 scale byte, 8 code bytes in one 8-byte store), int8_hier through
 * the same staging row, which the warp quantizes as one row (osp_dev_int8h_quantize_row_warp: min / max
 * by warp reductions, S and M, then the codes; the upper codes, S and M into the page row of
 * D / 2 + 4 bytes, the lower codes into the second pool, k_scale / v_scale, D / 2 bytes a row). K is
 * quantized after RoPE, V as it is, one row per token and KV head, as the CPU's write does (no Hadamard
 * rotation: the CUDA backend's kv_k_hadamard is false).
 * The rotation's products and sums are __fmul_rn / __fsub_rn / __fadd_rn: the CPU's exact operations.
 * shared memory: [n_rot / 2] cos, [n_rot / 2] sin, then [kRopeWarps][D] staging rows, then (nvfp4,
 * int8_hier) [kRopeWarps][D] rows of finished values. kv: the page kind, KvPage. */
enum KvPage { kPageF32 = 0, kPageF16 = 1, kPageFp8 = 2, kPageNvfp4 = 3, kPageInt8h = 4 };
__global__ void __launch_bounds__(kRopeWarps * 32)
    rope_kv_kernel(const float *__restrict__ qkv, const float *__restrict__ bias, const float *__restrict__ q_norm,
                   const float *__restrict__ k_norm, const int32_t *__restrict__ positions,
                   const float *__restrict__ inv_freq, const int32_t *__restrict__ slot_mapping,
                   uint16_t *__restrict__ q_out, void *__restrict__ k_pages, void *__restrict__ v_pages, int kv,
                   const float *__restrict__ k_fixed, const float *__restrict__ v_fixed, uint8_t *__restrict__ k_scale,
                   uint8_t *__restrict__ v_scale, int64_t T, int n_head, int n_head_kv, int D, int n_rot, bool neox,
                   float eps) {
    osp_pdl_begin();
    extern __shared__ float smem[];
    const int half = n_rot / 2;
    float *cos_t = smem, *sin_t = smem + half;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *buf = smem + n_rot + warp * D;
    float *obuf = smem + n_rot + (kRopeWarps + warp) * D; /* nvfp4 and int8_hier only */
    const int n_units = n_head + 2 * n_head_kv;
    const int unit = blockIdx.x * kRopeWarps + warp;
    const int64_t QD = (int64_t)n_head * D, KD = (int64_t)n_head_kv * D, row = QD + 2 * KD;

    /* what this warp's unit is: 0 = q, 1 = k, 2 = v; head h of its kind; column in a qkv row */
    int kind = 0, h = unit;
    if (unit >= n_head + n_head_kv) kind = 2, h = unit - n_head - n_head_kv;
    else if (unit >= n_head) kind = 1, h = unit - n_head;
    const int64_t col = kind == 0 ? (int64_t)h * D : kind == 1 ? QD + (int64_t)h * D : QD + KD + (int64_t)h * D;
    const float *nw = kind == 0 ? q_norm : kind == 1 ? k_norm : nullptr;
    const bool rotate = kind != 2;
    /* the quantized pages' fixed scale of this unit: fp8 its head's, nvfp4 the tensor scale */
    float fix = 1.0f;
    if (kind != 0 && unit < n_units && (kv == kPageFp8 || kv == kPageNvfp4)) {
        const float *f = kind == 1 ? k_fixed : v_fixed;
        fix = f[kv == kPageFp8 ? h : 0];
    }

    for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
        __syncthreads(); /* the previous token's table and staging rows are no longer read */
        const float pos = (float)positions[t];
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            float s, c;
            sincosf(__fmul_rn(pos, inv_freq[i]), &s, &c);
            cos_t[i] = c;
            sin_t[i] = s;
        }
        __syncthreads();
        if (unit >= n_units) continue; /* warp-uniform from here on */
        const int32_t slot = slot_mapping[t];
        if (kind != 0 && slot < 0) continue; /* a padding row: no KV write */

        const float *src = qkv + t * row + col;
        float ss = 0.0f;
        for (int d = lane; d < D; d += 32) {
            float v = src[d];
            if (bias) v = __fadd_rn(v, bias[col + d]);
            buf[d] = v;
            ss += v * v;
        }
        if (nw) {
            const float scale = rms_scale(warp_sum(ss), D, eps);
            for (int d = lane; d < D; d += 32) buf[d] = buf[d] * scale * nw[d];
        }
        __syncwarp();

        for (int d = lane; d < D; d += 32) {
            float v = buf[d];
            if (rotate && d < n_rot) {
                int i, lo, hi;
                bool first;
                if (neox) { /* pairs (i, i + n_rot / 2) */
                    first = d < half;
                    i = first ? d : d - half;
                    lo = i, hi = i + half;
                } else { /* pairs (2i, 2i + 1) */
                    first = (d & 1) == 0;
                    i = d >> 1;
                    lo = 2 * i, hi = 2 * i + 1;
                }
                const float x0 = buf[lo], x1 = buf[hi], c = cos_t[i], s = sin_t[i];
                v = first ? __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s))
                          : __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
            }
            if (kind == 0) {
                q_out[t * QD + (int64_t)h * D + d] = osp_f_to_bf16(v);
            } else {
                const int64_t e = ((int64_t)slot * n_head_kv + h) * D + d;
                void *pages = kind == 1 ? k_pages : v_pages;
                if (kv == kPageF16)
                    static_cast<uint16_t *>(pages)[e] = osp_f_to_f16(v);
                else if (kv == kPageF32)
                    static_cast<float *>(pages)[e] = v;
                else if (kv == kPageFp8) /* a NaN keeps its sign (the GPU's division would return the
                                          * canonical +NaN; the CPU's x86 division propagates the input) */
                    static_cast<uint8_t *>(pages)[e] = (uint8_t)osp_dev_fp32_to_e4m3(isnan(v) ? v : __fdiv_rn(v, fix));
                else
                    obuf[d] = v;
            }
        }
        if (kind != 0 && kv == kPageNvfp4) { /* the row is in obuf: lane j quantizes micro-block j */
            __syncwarp();
            const int64_t row0 = ((int64_t)slot * n_head_kv + h) * D; /* value index of the row's first value */
            uint8_t *pages = static_cast<uint8_t *>(kind == 1 ? k_pages : v_pages);
            uint8_t *scales = kind == 1 ? k_scale : v_scale;
            for (int j = lane; j < D / 16; j += 32) {
                uint32_t lo, hi, sc;
                osp_dev_nvfp4_quantize16(obuf + 16 * j, fix, lo, hi, sc);
                *reinterpret_cast<uint2 *>(pages + (row0 + 16 * j) / 2) = make_uint2(lo, hi);
                scales[(row0 + 16 * j) / 16] = (uint8_t)sc;
            }
        }
        if (kind != 0 && kv == kPageInt8h) { /* the row is in obuf: the warp quantizes it */
            __syncwarp();
            const int64_t r = (int64_t)slot * n_head_kv + h; /* the (token, KV head) row */
            uint8_t *pages = static_cast<uint8_t *>(kind == 1 ? k_pages : v_pages) + r * (D / 2 + 4);
            uint8_t *lower = (kind == 1 ? k_scale : v_scale) + r * (D / 2);
            osp_dev_int8h_quantize_row_warp(obuf, D, pages, pages + D / 2, lower, lane);
        }
    }
}

/* ---- SiLU-gated product ------------------------------------------------------------------------- */

__device__ __forceinline__ float silu_mul1(float g, float u) { return g / (1.0f + expf(-g)) * u; }
/* GELU, tanh approximation: 0.5 x (1 + tanh z), z = sqrt(2 / pi) (x + 0.044715 x^3), computed as the
 * identical x / (1 + e^(-2z)) (1 + tanh z = 2 / (1 + e^(-2z))). The tanh form cancels where z < -9:
 * tanhf rounds to -1 and the product becomes 0 however large u is (the kernel gate's dependence
 * check found it: gelu(-5.5) * u stayed 0 while u changed); this form keeps the relative precision
 * of expf there. osp_cpu_gelu_mul keeps the tanh form (llama.cpp's, which the CPU matches). */
__device__ __forceinline__ float gelu_mul1(float x, float u) {
    const float z = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return x / (1.0f + expf(-2.0f * z)) * u;
}
template <bool GELU> __device__ __forceinline__ float glu1(float g, float u) {
    if constexpr (GELU)
        return gelu_mul1(g, u);
    else
        return silu_mul1(g, u);
}

template <int VEC, bool GELU>
__global__ void __launch_bounds__(kEltThreads)
    silu_mul_kernel(const uint16_t *__restrict__ gu, uint16_t *__restrict__ out, int64_t T, int64_t F) {
    osp_pdl_begin();
    const int64_t n_units = F / VEC;
    for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
        const uint16_t *g = gu + t * 2 * F, *up = g + F;
        uint16_t *o = out + t * F;
        for (int64_t u = global_thread(); u < n_units; u += global_stride()) {
            if constexpr (VEC == 4) {
                const float4 a = load_bf16x4(g + 4 * u), b = load_bf16x4(up + 4 * u);
                store_bf16x4(o + 4 * u, make_float4(glu1<GELU>(a.x, b.x), glu1<GELU>(a.y, b.y),
                                                    glu1<GELU>(a.z, b.z), glu1<GELU>(a.w, b.w)));
            } else {
                o[u] = osp_f_to_bf16(glu1<GELU>(osp_bf16_to_f(g[u]), osp_bf16_to_f(up[u])));
            }
        }
    }
}

/* The GLU product with its quantized form for qmma (qx.cuh): a warp per (32-value block b, row t < Tp),
 * qx_kernel's geometry; lane l computes out[t, 32 b + l] (silu_mul_kernel's arithmetic, so its bits),
 * stores it and quantizes the bf16 value; rows t >= T quantize zeros. */
template <bool GELU>
__global__ void __launch_bounds__(kEltThreads)
    glu_qx_kernel(const uint16_t *__restrict__ gu, uint16_t *__restrict__ out, int64_t T, int64_t Tp, int64_t F,
                  int8_t *__restrict__ qc, float4 *__restrict__ qs) {
    osp_pdl_begin();
    const int lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (item >= F / 32 * Tp) return;
    const int64_t b = item / Tp, t = item % Tp;
    float v = 0.0f;
    if (t < T) {
        const int64_t i = b * 32 + lane;
        const uint16_t *g = gu + t * 2 * F;
        const uint16_t h = osp_f_to_bf16(glu1<GELU>(osp_bf16_to_f(g[i]), osp_bf16_to_f(g[F + i])));
        out[t * F + i] = h;
        v = osp_bf16_to_f(h);
    }
    osp_qx_block(v, lane, qc + item * 64, qs + item);
}

/* The same for group 256 (qx.cuh's osp_qx_group256, qx256_kernel's geometry): a warp per (256-value
 * group, row t < Tp), lane l computing values 8l .. 8l + 7 of the group. */
template <bool GELU>
__global__ void __launch_bounds__(kEltThreads)
    glu_qx256_kernel(const uint16_t *__restrict__ gu, uint16_t *__restrict__ out, int64_t T, int64_t Tp, int64_t F,
                     int8_t *__restrict__ qc, float4 *__restrict__ qs) {
    osp_pdl_begin();
    const int lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (item >= F / 256 * Tp) return;
    const int64_t gi = item / Tp, t = item % Tp;
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (t < T) {
        const int64_t i0 = gi * 256 + 8 * lane;
        const uint16_t *g = gu + t * 2 * F;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const uint16_t h = osp_f_to_bf16(glu1<GELU>(osp_bf16_to_f(g[i0 + k]), osp_bf16_to_f(g[F + i0 + k])));
            out[t * F + i0 + k] = h;
            v[k] = osp_bf16_to_f(h);
        }
    }
    const int64_t it = osp_qx_item(8 * gi, t, Tp);
    osp_qx_group256(v, lane, qc + it * 64, qs + it, Tp);
}

/* ---- argmax ------------------------------------------------------------------------------------- */

/* (v, i) beats (bv, bi): i valid (>= 0, never a NaN), and bv invalid, or v larger, or equal and earlier.
 * A strict total order on the valid candidates, so the tree below finds one winner in every lane. */
__device__ __forceinline__ bool argmax_beats(float v, int32_t i, float bv, int32_t bi) {
    if (i < 0) return false;
    if (bi < 0) return true;
    return v > bv || (v == bv && i < bi);
}

/* A thread scans increasing indices, so a tie keeps the earlier one; NaN is never taken. */
__device__ __forceinline__ void argmax_scan(float v, int32_t i, float &bv, int32_t &bi) {
    if (!isnan(v) && (bi < 0 || v > bv)) bv = v, bi = i;
}

template <int VEC>
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_kernel(const float *__restrict__ logits, int32_t *__restrict__ out, int64_t R, int64_t V) {
    osp_pdl_begin();
    __shared__ float red_v[32];
    __shared__ int32_t red_i[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const int64_t n_units = V / VEC;
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        const float *row = logits + r * V;
        float bv = -INFINITY;
        int32_t bi = -1;
        for (int64_t u = threadIdx.x; u < n_units; u += blockDim.x) {
            if constexpr (VEC == 4) {
                const float4 v = *reinterpret_cast<const float4 *>(row + 4 * u);
                const int32_t i = (int32_t)(4 * u);
                argmax_scan(v.x, i, bv, bi);
                argmax_scan(v.y, i + 1, bv, bi);
                argmax_scan(v.z, i + 2, bv, bi);
                argmax_scan(v.w, i + 3, bv, bi);
            } else {
                argmax_scan(row[u], (int32_t)u, bv, bi);
            }
        }
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
            const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, off);
            if (argmax_beats(ov, oi, bv, bi)) bv = ov, bi = oi;
        }
        if (lane == 0) red_v[warp] = bv, red_i[warp] = bi;
        __syncthreads();
        if (warp == 0) {
            bv = lane < n_warps ? red_v[lane] : -INFINITY;
            bi = lane < n_warps ? red_i[lane] : -1;
            for (int off = 16; off > 0; off >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
                const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, off);
                if (argmax_beats(ov, oi, bv, bi)) bv = ov, bi = oi;
            }
            if (lane == 0) out[r] = bi;
        }
        __syncthreads(); /* red_* are reused by the next row */
    }
}

/* ---- conversions and random fill ---------------------------------------------------------------- */

/* n values; VEC 4 handles whole groups of four, then a scalar tail of n % 4. */
template <int VEC>
__global__ void __launch_bounds__(kEltThreads)
    f32_to_bf16_kernel(const float *__restrict__ in, uint16_t *__restrict__ out, int64_t n) {
    osp_pdl_begin();
    const int64_t n_units = n / VEC;
    for (int64_t u = global_thread(); u < n_units; u += global_stride()) {
        if constexpr (VEC == 4)
            store_bf16x4(out + 4 * u, *reinterpret_cast<const float4 *>(in + 4 * u));
        else
            out[u] = osp_f_to_bf16(in[u]);
    }
    for (int64_t i = n_units * VEC + global_thread(); i < n; i += global_stride()) out[i] = osp_f_to_bf16(in[i]);
}

/* out[i] = scale * in[i] (SOFTCAP false) or cap * tanh(in[i] / cap) (SOFTCAP true, cap = scale), fp32;
 * in may equal out. */
template <bool SOFTCAP>
__global__ void __launch_bounds__(kEltThreads)
    scale_f32_kernel(const float *in, float *out, int64_t n, float scale) {
    osp_pdl_begin();
    for (int64_t i = global_thread(); i < n; i += global_stride()) {
        const float x = in[i];
        out[i] = SOFTCAP ? scale * tanhf(x / scale) : scale * x;
    }
}

/* tools/osprey/cmd_make_random_model.c's mix64() and randn(), operation for operation, plus the
 * tool's `offset + randn(...)`; __fmul_rn / __fadd_rn keep nvcc from fusing them into one FMA, which
 * the tool (ISO C, no contraction) does not do. */
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
__device__ __forceinline__ float randn_at(uint64_t key, uint64_t i, float scale, float offset) {
    const uint64_t r = mix64(key + (i + 1) * 0x9e3779b97f4a7c15ull);
    const int32_t s = (int32_t)(r & 0xffff) + (int32_t)((r >> 16) & 0xffff) + (int32_t)((r >> 32) & 0xffff) +
                      (int32_t)(r >> 48) - 131070;
    return __fadd_rn(offset, __fmul_rn((float)s, scale));
}

/* out[i] = offset + randn(key, base + i, scale) as bf16 (BF16) or fp32; VEC as f32_to_bf16_kernel. */
template <int VEC, bool BF16>
__global__ void __launch_bounds__(kEltThreads)
    fill_randn_kernel(void *__restrict__ out, int64_t n, uint64_t key, uint64_t base, float scale, float offset) {
    osp_pdl_begin();
    const int64_t n_units = n / VEC;
    for (int64_t u = global_thread(); u < n_units; u += global_stride()) {
        const uint64_t i = base + (uint64_t)(VEC * u);
        if constexpr (VEC == 4) {
            const float4 v = make_float4(randn_at(key, i, scale, offset), randn_at(key, i + 1, scale, offset),
                                         randn_at(key, i + 2, scale, offset), randn_at(key, i + 3, scale, offset));
            if constexpr (BF16)
                store_bf16x4(static_cast<uint16_t *>(out) + 4 * u, v);
            else
                reinterpret_cast<float4 *>(out)[u] = v;
        } else {
            const float v = randn_at(key, i, scale, offset);
            if constexpr (BF16)
                static_cast<uint16_t *>(out)[u] = osp_f_to_bf16(v);
            else
                static_cast<float *>(out)[u] = v;
        }
    }
    for (int64_t j = n_units * VEC + global_thread(); j < n; j += global_stride()) {
        const float v = randn_at(key, base + (uint64_t)j, scale, offset);
        if constexpr (BF16)
            static_cast<uint16_t *>(out)[j] = osp_f_to_bf16(v);
        else
            static_cast<float *>(out)[j] = v;
    }
}

/* ---- host helpers ------------------------------------------------------------------------------- */

bool aligned(const void *p, uintptr_t a) { return ((uintptr_t)p % a) == 0; }

/* Blocks to cover `units` work items with `threads` each, at least 1, at most `cap`. */
unsigned blocks_for(int64_t units, int threads, int64_t cap) {
    int64_t b = (units + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > cap) b = cap;
    return (unsigned)b;
}
unsigned rows_grid(int64_t rows, int64_t cap) { return (unsigned)(rows < cap ? rows : cap); }

} // namespace

/* ---- launchers ---------------------------------------------------------------------------------- */

extern "C" {

osp_status osp_cuda_embed(const uint16_t *d_table, const int32_t *d_ids, float *d_x, int64_t T, int64_t E,
                          float scale, void *stream) {
    if (T < 0 || E <= 0 || (T > 0 && (!d_table || !d_ids || !d_x)))
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_embed: T %lld, E %lld or a NULL pointer",
                             (long long)T, (long long)E);
    if (T == 0) return OSP_OK;
    cudaStream_t st = (cudaStream_t)stream;
    const bool vec = E % 4 == 0 && aligned(d_table, 8) && aligned(d_x, 16);
    const int vw = vec ? 4 : 1;
    const dim3 grid(blocks_for(E / vw, kEltThreads, kMaxGridX), rows_grid(T, kMaxGridY));
    if (vec)
        osp_launch(embed_kernel<4>, grid, kEltThreads, 0, st, d_table, d_ids, d_x, T, E, scale);
    else
        osp_launch(embed_kernel<1>, grid, kEltThreads, 0, st, d_table, d_ids, d_x, T, E, scale);
    OSP_CUDA_LAUNCH_CHECK("embed_kernel");
    return OSP_OK;
}

osp_status osp_cuda_add_rmsnorm(float *d_x, const uint16_t *d_delta, const float *d_w, uint16_t *d_out, int64_t T,
                                int64_t E, float eps, void *stream) {
    if (T < 0 || E <= 0 || E > (1LL << 24) || (T > 0 && (!d_x || (d_out && !d_w) || (!d_out && !d_delta))))
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_add_rmsnorm: T %lld, E %lld or a NULL pointer",
                             (long long)T, (long long)E);
    if (T == 0) return OSP_OK;
    cudaStream_t st = (cudaStream_t)stream;
    const bool vec = E % 4 == 0 && aligned(d_x, 16) && (!d_out || (aligned(d_w, 16) && aligned(d_out, 8))) &&
                     (!d_delta || aligned(d_delta, 8));
    const unsigned grid = rows_grid(T, kMaxGridX);
    if (vec)
        osp_launch(add_rmsnorm_kernel<4>, grid, kRowThreads, 0, st, d_x, d_delta, d_w, d_out, T, E, eps);
    else
        osp_launch(add_rmsnorm_kernel<1>, grid, kRowThreads, 0, st, d_x, d_delta, d_w, d_out, T, E, eps);
    OSP_CUDA_LAUNCH_CHECK("add_rmsnorm_kernel");
    return OSP_OK;
}

bool osp_cuda_add_rmsnorm_qx_supported(int64_t T, int64_t E, int32_t group) {
    return T > 0 && T <= 8 && (group == 32 || group == 256) && E > 0 && E % group == 0 && E % 4 == 0 &&
           E <= (1LL << 24);
}

osp_status osp_cuda_add_rmsnorm_qx(float *d_x, const uint16_t *d_delta, const float *d_w, uint16_t *d_out, int64_t T,
                                   int64_t E, float eps, int32_t group, unsigned *d_sync, void *d_ws,
                                   size_t ws_bytes, osp_cuda_qx *qx, void *stream) {
    if (!osp_cuda_add_rmsnorm_qx_supported(T, E, group) || !d_x || !d_w || !d_out || !d_sync || !qx ||
        !aligned(d_x, 16) || !aligned(d_w, 16) || !aligned(d_out, 8) || (d_delta && !aligned(d_delta, 8)) ||
        !aligned(d_sync, 8))
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_add_rmsnorm_qx: T %lld, E %lld, group %d, or a pointer",
                             (long long)T, (long long)E, (int)group);
    osp_cuda_qx q;
    OSP_TRY(osp_cuda_qx_layout(d_ws, ws_bytes, T, E, group, &q));
    /* slices of whole groups, at most 8 a row (a row is re-read by each: 8 x its bytes from L2) */
    const int64_t groups = E / group, per = (groups + 7) / 8, slice = per * group;
    const dim3 grid((unsigned)((E + slice - 1) / slice), (unsigned)q.Tp);
    cudaStream_t st = (cudaStream_t)stream;
    if (group == 256)
        osp_launch(add_rmsnorm_qx_kernel<256>, grid, kRowThreads, 0, st, d_x, d_delta, d_w, d_out, T, q.Tp, E, eps, slice,
                   d_sync, (int8_t *)q.codes, (float4 *)q.scales);
    else
        osp_launch(add_rmsnorm_qx_kernel<32>, grid, kRowThreads, 0, st, d_x, d_delta, d_w, d_out, T, q.Tp, E, eps, slice,
                   d_sync, (int8_t *)q.codes, (float4 *)q.scales);
    OSP_CUDA_LAUNCH_CHECK("add_rmsnorm_qx_kernel");
    *qx = q;
    return OSP_OK;
}

osp_status osp_cuda_gather_rmsnorm(const float *d_x, const int32_t *d_idx, const float *d_w, uint16_t *d_out,
                                   int64_t n, int64_t E, float eps, void *stream) {
    if (n < 0 || E <= 0 || E > (1LL << 24) || (n > 0 && (!d_x || !d_idx || !d_w || !d_out)))
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_gather_rmsnorm: n %lld, E %lld or a NULL pointer",
                             (long long)n, (long long)E);
    if (n == 0) return OSP_OK;
    cudaStream_t st = (cudaStream_t)stream;
    const bool vec = E % 4 == 0 && aligned(d_x, 16) && aligned(d_w, 16) && aligned(d_out, 8);
    const unsigned grid = rows_grid(n, kMaxGridX);
    if (vec)
        osp_launch(gather_rmsnorm_kernel<4>, grid, kRowThreads, 0, st, d_x, d_idx, d_w, d_out, n, E, eps);
    else
        osp_launch(gather_rmsnorm_kernel<1>, grid, kRowThreads, 0, st, d_x, d_idx, d_w, d_out, n, E, eps);
    OSP_CUDA_LAUNCH_CHECK("gather_rmsnorm_kernel");
    return OSP_OK;
}

osp_status osp_cuda_rope_kv_write(const float *d_qkv, const float *d_bias, const float *d_q_norm,
                                  const float *d_k_norm, const int32_t *d_positions, const float *d_inv_freq,
                                  const int32_t *d_slot_mapping, uint16_t *d_q_out, void *d_k_pages,
                                  void *d_v_pages, uint32_t kv_type, int64_t T, int n_head, int n_head_kv, int D,
                                  int n_rot, bool neox, float eps, void *stream) {
    if (kv_type != OSP_KV_PAGE_F16 && kv_type != OSP_KV_PAGE_F32)
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_rope_kv_write: KV page type %u is not f32 or f16", kv_type);
    return osp_cuda_rope_kv_write_q(d_qkv, d_bias, d_q_norm, d_k_norm, d_positions, d_inv_freq, d_slot_mapping, d_q_out,
                                    d_k_pages, d_v_pages, kv_type, NULL, T, n_head, n_head_kv, D, n_rot, neox, eps,
                                    stream);
}

osp_status osp_cuda_rope_kv_write_q(const float *d_qkv, const float *d_bias, const float *d_q_norm,
                                    const float *d_k_norm, const int32_t *d_positions, const float *d_inv_freq,
                                    const int32_t *d_slot_mapping, uint16_t *d_q_out, void *d_k_pages,
                                    void *d_v_pages, uint32_t kv_type, const osp_cuda_kv_quant *kq, int64_t T,
                                    int n_head, int n_head_kv, int D, int n_rot, bool neox, float eps, void *stream) {
    int kv;
    switch (kv_type) {
    case OSP_KV_PAGE_F32: kv = kPageF32; break;
    case OSP_KV_PAGE_F16: kv = kPageF16; break;
    case OSP_KV_PAGE_FP8: kv = kPageFp8; break;
    case OSP_KV_PAGE_NVFP4: kv = kPageNvfp4; break;
    case OSP_KV_PAGE_INT8H: kv = kPageInt8h; break;
    default:
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "osp_cuda_rope_kv_write: KV page type %u is not f32, f16, fp8, nvfp4 or int8_hier",
                             kv_type);
    }
    const bool quant = kv == kPageFp8 || kv == kPageNvfp4; /* fixed scales */
    if (T < 0 || n_head < 1 || n_head_kv < 1 || n_head > (1 << 16) || n_head_kv > (1 << 16) || D < 1 ||
        D > kRopeMaxD || n_rot < 0 || n_rot > D || n_rot % 2 != 0 || (kv == kPageNvfp4 && D % 16 != 0) ||
        (kv == kPageInt8h && D % 2 != 0))
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "osp_cuda_rope_kv_write: unsupported shape T %lld, n_head %d, n_head_kv %d, head_dim %d "
                             "(1..%d; nvfp4 pages: a multiple of 16; int8_hier pages: even), n_rot %d (even, <= "
                             "head_dim)",
                             (long long)T, n_head, n_head_kv, D, kRopeMaxD, n_rot);
    if (T > 0 && (!d_qkv || !d_positions || !d_slot_mapping || !d_q_out || !d_k_pages || !d_v_pages ||
                  (n_rot > 0 && !d_inv_freq)))
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_rope_kv_write: a NULL pointer");
    if (quant && (!kq || !kq->d_k_fixed || !kq->d_v_fixed ||
                  (kv == kPageNvfp4 && (!kq->d_k_scale || !kq->d_v_scale))))
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_rope_kv_write: %s pages without their scales",
                             kv == kPageFp8 ? "fp8" : "nvfp4");
    if (kv == kPageInt8h && (!kq || !kq->d_k_scale || !kq->d_v_scale))
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "osp_cuda_rope_kv_write: int8_hier pages without their lower-code pools (kq->d_k_scale, "
                             "d_v_scale)");
    if (kv == kPageNvfp4 && (((uintptr_t)d_k_pages | (uintptr_t)d_v_pages) & 7u))
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_rope_kv_write: nvfp4 pages must be 8-byte aligned");
    if (T == 0) return OSP_OK;
    cudaStream_t st = (cudaStream_t)stream;
    const int n_units = n_head + 2 * n_head_kv;
    const dim3 grid((unsigned)((n_units + kRopeWarps - 1) / kRopeWarps), rows_grid(T, kMaxGridY));
    const bool staged = kv == kPageNvfp4 || kv == kPageInt8h; /* a second staging row a warp */
    const size_t smem = (size_t)(n_rot + (staged ? 2 : 1) * kRopeWarps * D) * sizeof(float);
    const bool pools = kv == kPageNvfp4 || kv == kPageInt8h; /* the second pool: scales, or lower codes */
    osp_launch(rope_kv_kernel, grid, kRopeWarps * 32, smem, st,
        d_qkv, d_bias, d_q_norm, d_k_norm, d_positions, d_inv_freq, d_slot_mapping, d_q_out, d_k_pages, d_v_pages, kv,
        quant ? kq->d_k_fixed : nullptr, quant ? kq->d_v_fixed : nullptr, pools ? kq->d_k_scale : nullptr,
        pools ? kq->d_v_scale : nullptr, T, n_head, n_head_kv, D, n_rot, neox, eps);
    OSP_CUDA_LAUNCH_CHECK("rope_kv_kernel");
    return OSP_OK;
}

static osp_status glu_launch(const uint16_t *d_gu, uint16_t *d_out, int64_t T, int64_t F, bool gelu, void *stream) {
    if (T < 0 || F <= 0 || (T > 0 && (!d_gu || !d_out)))
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_%s_mul: T %lld, F %lld or a NULL pointer",
                             gelu ? "gelu" : "silu", (long long)T, (long long)F);
    if (T == 0) return OSP_OK;
    cudaStream_t st = (cudaStream_t)stream;
    const bool vec = F % 4 == 0 && aligned(d_gu, 8) && aligned(d_out, 8);
    const int vw = vec ? 4 : 1;
    const dim3 grid(blocks_for(F / vw, kEltThreads, kMaxGridX), rows_grid(T, kMaxGridY));
    if (vec && gelu)
        osp_launch(silu_mul_kernel<4, true>, grid, kEltThreads, 0, st, d_gu, d_out, T, F);
    else if (vec)
        osp_launch(silu_mul_kernel<4, false>, grid, kEltThreads, 0, st, d_gu, d_out, T, F);
    else if (gelu)
        osp_launch(silu_mul_kernel<1, true>, grid, kEltThreads, 0, st, d_gu, d_out, T, F);
    else
        osp_launch(silu_mul_kernel<1, false>, grid, kEltThreads, 0, st, d_gu, d_out, T, F);
    OSP_CUDA_LAUNCH_CHECK("silu_mul_kernel");
    return OSP_OK;
}

osp_status osp_cuda_silu_mul(const uint16_t *d_gu, uint16_t *d_out, int64_t T, int64_t F, void *stream) {
    return glu_launch(d_gu, d_out, T, F, false, stream);
}

osp_status osp_cuda_gelu_mul(const uint16_t *d_gu, uint16_t *d_out, int64_t T, int64_t F, void *stream) {
    return glu_launch(d_gu, d_out, T, F, true, stream);
}

osp_status osp_cuda_glu_qx(const uint16_t *d_gu, uint16_t *d_out, int64_t T, int64_t F, bool gelu, int32_t group,
                           void *d_ws, size_t ws_bytes, osp_cuda_qx *qx, void *stream) {
    if (T <= 0 || F <= 0 || !d_gu || !d_out || !qx)
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_glu_qx: T %lld, F %lld or a NULL pointer", (long long)T,
                             (long long)F);
    osp_cuda_qx q;
    OSP_TRY(osp_cuda_qx_layout(d_ws, ws_bytes, T, F, group, &q));
    const int64_t items = F / group * q.Tp;
    const unsigned grid = (unsigned)((items + kEltThreads / 32 - 1) / (kEltThreads / 32));
    int8_t *qc = (int8_t *)q.codes;
    float4 *qs = (float4 *)q.scales;
    cudaStream_t st = (cudaStream_t)stream;
    if (group == 256) {
        if (gelu) osp_launch(glu_qx256_kernel<true>, grid, kEltThreads, 0, st, d_gu, d_out, T, q.Tp, F, qc, qs);
        else osp_launch(glu_qx256_kernel<false>, grid, kEltThreads, 0, st, d_gu, d_out, T, q.Tp, F, qc, qs);
    } else if (gelu) osp_launch(glu_qx_kernel<true>, grid, kEltThreads, 0, st, d_gu, d_out, T, q.Tp, F, qc, qs);
    else osp_launch(glu_qx_kernel<false>, grid, kEltThreads, 0, st, d_gu, d_out, T, q.Tp, F, qc, qs);
    OSP_CUDA_LAUNCH_CHECK("glu_qx_kernel");
    *qx = q;
    return OSP_OK;
}

osp_status osp_cuda_argmax(const float *d_logits, int32_t *d_out, int64_t R, int64_t V, void *stream) {
    if (R < 0 || V <= 0 || V > INT32_MAX || (R > 0 && (!d_logits || !d_out)))
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_argmax: R %lld, V %lld (1..2^31-1) or a NULL pointer",
                             (long long)R, (long long)V);
    if (R == 0) return OSP_OK;
    cudaStream_t st = (cudaStream_t)stream;
    const bool vec = V % 4 == 0 && aligned(d_logits, 16);
    const unsigned grid = rows_grid(R, kMaxGridX);
    if (vec)
        osp_launch(argmax_kernel<4>, grid, kArgmaxThreads, 0, st, d_logits, d_out, R, V);
    else
        osp_launch(argmax_kernel<1>, grid, kArgmaxThreads, 0, st, d_logits, d_out, R, V);
    OSP_CUDA_LAUNCH_CHECK("argmax_kernel");
    return OSP_OK;
}

osp_status osp_cuda_f32_to_bf16(const float *d_in, uint16_t *d_out, int64_t n, void *stream) {
    if (n < 0 || (n > 0 && (!d_in || !d_out)))
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_f32_to_bf16: n %lld or a NULL pointer", (long long)n);
    if (n == 0) return OSP_OK;
    cudaStream_t st = (cudaStream_t)stream;
    const bool vec = aligned(d_in, 16) && aligned(d_out, 8);
    const unsigned grid = blocks_for(vec ? (n + 3) / 4 : n, kEltThreads, kMaxGridX);
    if (vec)
        osp_launch(f32_to_bf16_kernel<4>, grid, kEltThreads, 0, st, d_in, d_out, n);
    else
        osp_launch(f32_to_bf16_kernel<1>, grid, kEltThreads, 0, st, d_in, d_out, n);
    OSP_CUDA_LAUNCH_CHECK("f32_to_bf16_kernel");
    return OSP_OK;
}

static osp_status scale_launch(const float *d_in, float *d_out, int64_t n, float s, bool softcap, void *stream) {
    if (n < 0 || (n > 0 && (!d_in || !d_out)) || !isfinite(s) || (softcap && !(s > 0.0f)))
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_%s_f32: n %lld, %s %g or a NULL pointer",
                             softcap ? "softcap" : "scale", (long long)n, softcap ? "cap" : "scale", (double)s);
    if (n == 0) return OSP_OK;
    cudaStream_t st = (cudaStream_t)stream;
    const unsigned grid = blocks_for(n, kEltThreads, kMaxGridX);
    if (softcap)
        osp_launch(scale_f32_kernel<true>, grid, kEltThreads, 0, st, d_in, d_out, n, s);
    else
        osp_launch(scale_f32_kernel<false>, grid, kEltThreads, 0, st, d_in, d_out, n, s);
    OSP_CUDA_LAUNCH_CHECK("scale_f32_kernel");
    return OSP_OK;
}

osp_status osp_cuda_scale_f32(const float *d_in, float *d_out, int64_t n, float scale, void *stream) {
    return scale_launch(d_in, d_out, n, scale, false, stream);
}

osp_status osp_cuda_softcap_f32(const float *d_in, float *d_out, int64_t n, float cap, void *stream) {
    return scale_launch(d_in, d_out, n, cap, true, stream);
}

osp_status osp_cuda_fill_randn_bf16(uint16_t *d_out, int64_t n, uint64_t key, uint64_t base, float scale,
                                    float offset, void *stream) {
    if (n < 0 || (n > 0 && !d_out))
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_fill_randn_bf16: n %lld or a NULL pointer",
                             (long long)n);
    if (n == 0) return OSP_OK;
    cudaStream_t st = (cudaStream_t)stream;
    const bool vec = aligned(d_out, 8);
    const unsigned grid = blocks_for(vec ? (n + 3) / 4 : n, kEltThreads, kMaxGridX);
    if (vec)
        osp_launch(fill_randn_kernel<4, true>, grid, kEltThreads, 0, st, d_out, n, key, base, scale, offset);
    else
        osp_launch(fill_randn_kernel<1, true>, grid, kEltThreads, 0, st, d_out, n, key, base, scale, offset);
    OSP_CUDA_LAUNCH_CHECK("fill_randn_kernel (bf16)");
    return OSP_OK;
}

osp_status osp_cuda_fill_randn_f32(float *d_out, int64_t n, uint64_t key, uint64_t base, float scale, float offset,
                                   void *stream) {
    if (n < 0 || (n > 0 && !d_out))
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_fill_randn_f32: n %lld or a NULL pointer",
                             (long long)n);
    if (n == 0) return OSP_OK;
    cudaStream_t st = (cudaStream_t)stream;
    const bool vec = aligned(d_out, 16);
    const unsigned grid = blocks_for(vec ? (n + 3) / 4 : n, kEltThreads, kMaxGridX);
    if (vec)
        osp_launch(fill_randn_kernel<4, false>, grid, kEltThreads, 0, st, d_out, n, key, base, scale, offset);
    else
        osp_launch(fill_randn_kernel<1, false>, grid, kEltThreads, 0, st, d_out, n, key, base, scale, offset);
    OSP_CUDA_LAUNCH_CHECK("fill_randn_kernel (f32)");
    return OSP_OK;
}

} /* extern "C" */
