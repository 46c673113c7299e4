/* The CUDA runtime behind cuda_ops.h: device queries, allocations, streams, copies, events and
 * graphs, each turning a CUDA error into an osp_status with CUDA's message (the thread-local error of
 * core/status.c), so the C code above never sees a cudaError_t. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

extern "C" {

bool osp_cuda_built(void) { return true; }

static int g_pdl_default = 0; /* osp_cuda_set_pdl_default */

void osp_cuda_set_pdl_default(bool on) { __atomic_store_n(&g_pdl_default, on ? 1 : 0, __ATOMIC_RELAXED); }

bool osp_cuda_pdl_enabled(void) {
    static const int env = [] { /* -1: unset, 0, 1 */
        const char *e = getenv("OSPREY_CUDA_PDL");
        return !e ? -1 : strcmp(e, "0") == 0 ? 0 : 1;
    }();
    static const bool capable = [] {
        int dev = 0, major = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            return false;
        }
        return major >= 9;
    }();
    if (!capable || env == 0) return false;
    return env == 1 || __atomic_load_n(&g_pdl_default, __ATOMIC_RELAXED) != 0;
}

int osp_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver / no device: clear the sticky error */
        return 0;
    }
    return n;
}

osp_status osp_cuda_device_name(char *buf, size_t n) {
    if (!buf || n == 0) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_device_name: no buffer");
    buf[0] = '\0';
    int dev = 0;
    OSP_CUDA_TRY(cudaGetDevice(&dev));
    cudaDeviceProp p;
    OSP_CUDA_TRY(cudaGetDeviceProperties(&p, dev));
    snprintf(buf, n, "%s, %d SMs, %.1f GiB, sm_%d%d", p.name, p.multiProcessorCount,
             (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), p.major, p.minor);
    return OSP_OK;
}

osp_status osp_cuda_device_props(char *name, size_t n, int *cc_major, int *cc_minor, int *driver_version,
                                 size_t *l2_bytes) {
    if (!name || n == 0 || !cc_major || !cc_minor || !driver_version || !l2_bytes)
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_device_props: NULL argument");
    name[0] = '\0';
    int dev = 0, drv = 0;
    OSP_CUDA_TRY(cudaGetDevice(&dev));
    cudaDeviceProp p;
    OSP_CUDA_TRY(cudaGetDeviceProperties(&p, dev));
    OSP_CUDA_TRY(cudaDriverGetVersion(&drv));
    snprintf(name, n, "%s", p.name);
    *cc_major = p.major, *cc_minor = p.minor, *driver_version = drv;
    *l2_bytes = p.l2CacheSize > 0 ? (size_t)p.l2CacheSize : 0;
    return OSP_OK;
}

osp_status osp_cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
    OSP_CUDA_TRY(cudaMemGetInfo(free_bytes, total_bytes));
    return OSP_OK;
}

osp_status osp_cuda_malloc(void **d_ptr, size_t bytes, const char *what) {
    *d_ptr = NULL;
    if (bytes == 0) bytes = 1;
    cudaError_t e = cudaMalloc(d_ptr, bytes);
    if (e != cudaSuccess) {
        *d_ptr = NULL;
        (void)cudaGetLastError();
        size_t fr = 0, tot = 0;
        (void)cudaMemGetInfo(&fr, &tot);
        return osp_set_error(e == cudaErrorMemoryAllocation ? OSP_ERR_NOMEM : OSP_ERR_INTERNAL,
                             "cuda: cannot allocate %.1f MiB of device memory for %s (%.1f MiB free): %s",
                             (double)bytes / 1048576.0, what ? what : "a buffer", (double)fr / 1048576.0,
                             cudaGetErrorString(e));
    }
    return OSP_OK;
}

void osp_cuda_free(void *d_ptr) {
    if (d_ptr) (void)cudaFree(d_ptr);
}

osp_status osp_cuda_host_alloc(void **ptr, size_t bytes, const char *what) {
    *ptr = NULL;
    if (bytes == 0) bytes = 1;
    cudaError_t e = cudaMallocHost(ptr, bytes);
    if (e != cudaSuccess) {
        *ptr = NULL;
        (void)cudaGetLastError();
        return osp_set_error(OSP_ERR_NOMEM, "cuda: cannot allocate %.1f MiB of pinned host memory for %s: %s",
                             (double)bytes / 1048576.0, what ? what : "a buffer", cudaGetErrorString(e));
    }
    return OSP_OK;
}

void osp_cuda_host_free(void *ptr) {
    if (ptr) (void)cudaFreeHost(ptr);
}

osp_status osp_cuda_host_register(void *ptr, size_t bytes) {
    const cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return osp_set_error(OSP_ERR_NOMEM, "cuda: cannot page-lock %.1f MiB of host memory: %s", (double)bytes / 1048576.0,
                             cudaGetErrorString(e));
    }
    return OSP_OK;
}

void osp_cuda_host_unregister(void *ptr) {
    if (ptr) (void)cudaHostUnregister(ptr);
}

osp_status osp_cuda_stream_create(void **stream) {
    cudaStream_t s;
    OSP_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *stream = s;
    return OSP_OK;
}

void osp_cuda_stream_destroy(void *stream) {
    if (stream) (void)cudaStreamDestroy((cudaStream_t)stream);
}

osp_status osp_cuda_stream_sync(void *stream) {
    OSP_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream));
    return OSP_OK;
}

osp_status osp_cuda_h2d(void *d_dst, const void *src, size_t bytes, void *stream) {
    if (bytes == 0) return OSP_OK;
    OSP_CUDA_TRY(cudaMemcpyAsync(d_dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream));
    return OSP_OK;
}

osp_status osp_cuda_d2h(void *dst, const void *d_src, size_t bytes, void *stream) {
    if (bytes == 0) return OSP_OK;
    OSP_CUDA_TRY(cudaMemcpyAsync(dst, d_src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream));
    return OSP_OK;
}

osp_status osp_cuda_d2d(void *d_dst, const void *d_src, size_t bytes, void *stream) {
    if (bytes == 0) return OSP_OK;
    OSP_CUDA_TRY(cudaMemcpyAsync(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream));
    return OSP_OK;
}

osp_status osp_cuda_memset(void *d_dst, int byte, size_t bytes, void *stream) {
    if (bytes == 0) return OSP_OK;
    OSP_CUDA_TRY(cudaMemsetAsync(d_dst, byte, bytes, (cudaStream_t)stream));
    return OSP_OK;
}

osp_status osp_cuda_event_create(void **ev) {
    cudaEvent_t e;
    OSP_CUDA_TRY(cudaEventCreate(&e));
    *ev = e;
    return OSP_OK;
}

void osp_cuda_event_destroy(void *ev) {
    if (ev) (void)cudaEventDestroy((cudaEvent_t)ev);
}

osp_status osp_cuda_event_record(void *ev, void *stream) {
    OSP_CUDA_TRY(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream));
    return OSP_OK;
}

osp_status osp_cuda_event_elapsed_ms(void *start, void *end, float *ms) {
    OSP_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)end));
    OSP_CUDA_TRY(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end));
    return OSP_OK;
}

osp_status osp_cuda_graph_begin(void *stream) {
    OSP_CUDA_TRY(cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal));
    return OSP_OK;
}

osp_status osp_cuda_graph_end(void *stream, void **graph_exec) {
    *graph_exec = NULL;
    cudaGraph_t g = NULL;
    OSP_CUDA_TRY(cudaStreamEndCapture((cudaStream_t)stream, &g));
    cudaGraphExec_t ge = NULL;
    cudaError_t e = cudaGraphInstantiate(&ge, g, 0);
    (void)cudaGraphDestroy(g);
    if (e != cudaSuccess)
        return osp_set_error(OSP_ERR_INTERNAL, "cuda: instantiating a graph failed: %s", cudaGetErrorString(e));
    *graph_exec = ge;
    return OSP_OK;
}

osp_status osp_cuda_graph_launch(void *graph_exec, void *stream) {
    OSP_CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)graph_exec, (cudaStream_t)stream));
    return OSP_OK;
}

void osp_cuda_graph_destroy(void *graph_exec) {
    if (graph_exec) (void)cudaGraphExecDestroy((cudaGraphExec_t)graph_exec);
}

} /* extern "C" */
