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
 * code bytes at codes + 64 item, its float4 {d2, s, s_lo, s_hi} at sc[item]. */
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

#endif
