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

/* Programmatic dependent launch (CUDA C++ Programming Guide, "Programmatic Dependent Launch and
 * Synchronization"; PTX ISA "griddepcontrol", sm_90+). Every kernel of this backend is launched through
 * osp_launch, which lets the next kernel in the stream (or the CUDA graph captured from it) be launched
 * while this one still runs, so a kernel's launch latency and CTA start overlap its predecessor's tail.
 *
 * Contract, for every __global__ function launched by osp_launch: every thread executes osp_pdl_begin()
 * unconditionally before any access to memory a kernel may write (activations, the KV cache, outputs,
 * workspaces); only loads of model weights, which no kernel writes, may come before it (qmma's
 * persistent kernel issues its first weight loads first). griddepcontrol.wait returns
 * once every grid this one depends on has completed and its writes are visible, so nothing a kernel
 * reads or writes can race with its predecessors (read-after-write and write-after-read alike), and the
 * arithmetic, hence every bit, is unchanged. launch_dependents then allows the next kernel's launch; it
 * is issued only after the wait, so at most one kernel waits resident behind a running one. On a
 * device or launch without the attribute both instructions return at once. */
static __device__ __forceinline__ void osp_pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Whether launches carry the programmatic-serialization attribute (runtime.cu): compute capability
 * 9.0 or later, and OSPREY_CUDA_PDL=1, or the variable unset and osp_cuda_set_pdl_default(true) called
 * (the CUDA backend does when its matrices are quantized). Measured on the H200 (bench/gpu/DECODE.md):
 * +1 % on the 8B Q4_K_M decode, whose kernels are all ours, but -3 % on the 8B bf16 decode, where
 * cuBLASLt's GEMMs sit between them (also with the attribute left off after each GEMM). Only speed
 * depends on it: osp_pdl_begin() is correct either way. */
extern "C" bool osp_cuda_pdl_enabled(void);

/* Launch `kernel` on `st` like kernel<<<grid, block, smem, st>>>(args...), with programmatic
 * dependent launch when osp_cuda_pdl_enabled() (the kernel must keep osp_pdl_begin()'s contract).
 * Errors are left for OSP_CUDA_LAUNCH_CHECK (cudaGetLastError), as with <<<>>>. */
template <typename... KArgs, typename... Args>
static inline void osp_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                              Args &&...args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = osp_cuda_pdl_enabled() ? 1 : 0;
    (void)cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...);
}

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
