/* One 32-value block of an activation row quantized for qmma (cuda_ops.h, osp_cuda_qx): the layout
 * of the workspace and the per-block arithmetic, shared by qx_kernel (qmatmul.cu) and the producer
 * that writes its output's quantized form directly (ops.cu: the GLU kernel when a quantized matmul
 * reads its output next), so every path gives the same bytes. */
#ifndef OSP_BACKEND_CUDA_QX_CUH
#define OSP_BACKEND_CUDA_QX_CUH

#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"

/* Block b of row t (t < Tp, the rows rounded up to 8; rows past T are zeros) is item b Tp + t: its 64
 * code bytes at codes + 64 item, its float4 scales at sc[item] (either group). */
static __device__ __forceinline__ int64_t osp_qx_item(int64_t b, int64_t t, int64_t Tp) { return b * Tp + t; }

/* Called by all 32 lanes of a warp, lane l holding value l of the block (the bf16 activation widened):
 * the CPU's osp_quantize_row_q8 arithmetic (round to nearest even, the second level saturated at
 * +-127). A block with a non-finite value gets zero codes and a NaN d2 (its outputs are NaN, as on
 * the CPU). */
static __device__ __forceinline__ void osp_qx_block(float v, int lane, int8_t *__restrict__ out,
                                                    float4 *__restrict__ sc) {
    const bool bad = __any_sync(0xffffffffu, !isfinite(v));
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = __fdiv_rn(amax, 127.0f), id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    const float d2 = d * (1.0f / 256.0f), id2 = d != 0.0f ? __fdiv_rn(256.0f, d) : 0.0f;
    int q = 0, q2 = 0;
    if (!bad) {
        q = __float2int_rn(__fmul_rn(v, id));
        q2 = __float2int_rn(__fmul_rn(__fsub_rn(v, __fmul_rn(d, (float)q)), id2));
        q2 = q2 > 127 ? 127 : q2 < -127 ? -127 : q2;
    }
    out[lane] = (int8_t)q;
    out[32 + lane] = (int8_t)q2;
    int s1 = q, s2 = q2; /* sums over each half of the block (lanes 0-15, 16-31) */
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) {
        s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        s2 += __shfl_xor_sync(0xffffffffu, s2, o);
    }
    const int h1 = __shfl_sync(0xffffffffu, s1, 16), h2 = __shfl_sync(0xffffffffu, s2, 16);
    if (lane == 0) {
        const float lo = fmaf(d2, (float)s2, __fmul_rn(d, (float)s1));
        const float hi = fmaf(d2, (float)h2, __fmul_rn(d, (float)h1));
        *sc = bad ? make_float4(__int_as_float(0x7fc00000), 0.0f, 0.0f, 0.0f) : make_float4(d2, lo + hi, lo, hi);
    }
}

/* One 256-value group of an activation row quantized for the K-quant types (cuda_ops.h, osp_cuda_qx
 * with group 256): the same two levels as osp_qx_block, but one d = amax / 127 for the whole group, so
 * that qmma can fold a K-quant super-block's sub-block sums in integers (qmatmul.cu). Called by all 32
 * lanes of a warp, lane l holding values 8l .. 8l + 7 of the group (the bf16 activations widened):
 * their codes go to bytes 8(l % 4) .. + 7 of block l / 4 (level 1; level 2 at + 32), the block's
 * float4 {d2, S, S_lo, S_hi} to sc[l / 4] from lane 4(l / 4), with S = 256 s1 + s2 the block's code
 * sums as int32 bits (S_lo over values 0..15, S_hi over 16..31). out / sc: the group's first block
 * of this row (osp_qx_item), the next blocks Tp items on. A group with a non-finite value gets zero
 * codes and sums and a NaN d2. */
static __device__ __forceinline__ void osp_qx_group256(const float v[8], int lane, int8_t *__restrict__ out,
                                                       float4 *__restrict__ sc, int64_t Tp) {
    bool fin = true;
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) fin = fin && isfinite(v[i]), amax = fmaxf(amax, fabsf(v[i]));
    const bool bad = __any_sync(0xffffffffu, !fin);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = __fdiv_rn(amax, 127.0f), id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    const float d2 = d * (1.0f / 256.0f), id2 = d != 0.0f ? __fdiv_rn(256.0f, d) : 0.0f;
    uint32_t w1[2] = {0u, 0u}, w2[2] = {0u, 0u};
    int s1 = 0, s2 = 0;
    if (!bad) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int q = __float2int_rn(__fmul_rn(v[i], id));
            int q2 = __float2int_rn(__fmul_rn(__fsub_rn(v[i], __fmul_rn(d, (float)q)), id2));
            q2 = q2 > 127 ? 127 : q2 < -127 ? -127 : q2;
            w1[i >> 2] |= ((uint32_t)q & 0xffu) << (8 * (i & 3));
            w2[i >> 2] |= ((uint32_t)q2 & 0xffu) << (8 * (i & 3));
            s1 += q, s2 += q2;
        }
    }
    int8_t *o = out + (lane >> 2) * Tp * 64 + 8 * (lane & 3);
    *reinterpret_cast<uint2 *>(o) = make_uint2(w1[0], w1[1]);
    *reinterpret_cast<uint2 *>(o + 32) = make_uint2(w2[0], w2[1]);
    /* a half of the block is two lanes (l % 4 in {0, 1}: values 0..15; {2, 3}: 16..31) */
    int h = 256 * s1 + s2;
    h += __shfl_xor_sync(0xffffffffu, h, 1);
    const int hi = __shfl_xor_sync(0xffffffffu, h, 2);
    if ((lane & 3) == 0)
        sc[(lane >> 2) * Tp] =
            make_float4(bad ? __int_as_float(0x7fc00000) : d2, __int_as_float(h + hi), __int_as_float(h), __int_as_float(hi));
}

#endif
