/* The CUDA backend when osprey is built without it (OSPREY_CUDA off: no nvcc): no devices, and
 * creating it says why. The one "not built" stub: CMakeLists.txt compiles it instead of
 * src/backend/cuda/ (backend_cuda.c and the kernels) in such builds, so no caller needs an #ifdef. */
#include "backend/backend.h"
#include "backend/kernel_registry.h"
#include "core/status_internal.h"

int osp_backend_cuda_device_count(void) { return 0; }

osp_status osp_backend_cuda_create(const osp_backend_params *p, osp_backend **out) {
    (void)p;
    *out = NULL;
    return osp_set_error(OSP_ERR_UNSUPPORTED, "--device cuda: this osprey was built without CUDA (OSPREY_CUDA off, or nvcc not found)");
}

osp_status osp_backend_cuda_device_info(osp_device_info *out) {
    (void)out;
    return osp_set_error(OSP_ERR_UNSUPPORTED, "cuda: this osprey was built without CUDA");
}

osp_status osp_backend_cuda_gemm_peak_gflops(double *gflops) {
    *gflops = 0.0;
    return osp_set_error(OSP_ERR_UNSUPPORTED, "cuda: this osprey was built without CUDA");
}

bool osp_backend_cuda_attention_env_honoured(char *why, size_t n) {
    (void)why, (void)n;
    return true;
}
