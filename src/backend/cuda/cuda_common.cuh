/* Shared by the .cu files of the CUDA backend: launch checks that turn a failed launch into an
 * osp_status with a message, and bf16 / f16 conversions on uint16_t bit patterns (the types the C
 * interface uses), so kernels and host code agree on rounding. */
#ifndef OSP_BACKEND_CUDA_COMMON_CUH
#define OSP_BACKEND_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/status_internal.h"

/* After a launch: OSP_ERR_INTERNAL naming the kernel if it failed to launch. */
#define OSP_CUDA_LAUNCH_CHECK(name)                                                                \
    do {                                                                                           \
        cudaError_t osp_e_ = cudaGetLastError();                                                   \
        if (osp_e_ != cudaSuccess)                                                                 \
            return osp_set_error(OSP_ERR_INTERNAL, "cuda: launching %s failed: %s", (name),        \
                                 cudaGetErrorString(osp_e_));                                      \
    } while (0)

/* A runtime call: OSP_ERR_INTERNAL with CUDA's message if it failed. */
#define OSP_CUDA_TRY(call)                                                                         \
    do {                                                                                           \
        cudaError_t osp_e_ = (call);                                                               \
        if (osp_e_ != cudaSuccess)                                                                 \
            return osp_set_error(OSP_ERR_INTERNAL, "cuda: %s failed: %s", #call,                   \
                                 cudaGetErrorString(osp_e_));                                      \
    } while (0)

static __device__ __forceinline__ float osp_bf16_load(const uint16_t *p) {
    return __uint_as_float((uint32_t)*p << 16);
}
static __device__ __forceinline__ float osp_bf16_to_f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
/* Round to nearest even, NaN kept a (quiet) NaN: the same as core/dtype.c's osp_fp32_to_bf16. */
static __device__ __forceinline__ uint16_t osp_f_to_bf16(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
static __device__ __forceinline__ float osp_f16_to_f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
static __device__ __forceinline__ uint16_t osp_f_to_f16(float f) { return __half_as_ushort(__float2half_rn(f)); }

#endif
