/* The CUDA runtime behind cuda_ops.h: device queries, allocations, streams, copies, events and
 * graphs, each turning a CUDA error into an osp_status with CUDA's message (the thread-local error of
 * core/status.c), so the C code above never sees a cudaError_t. */
#include <pthread.h>
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

/* Registered host ranges that the device can address (osp_cuda_copy_many's kernel path): the host range,
 * the device address of its first byte (cudaHostGetDevicePointer). */
typedef struct mapped_range {
    uintptr_t host, dev;
    size_t bytes;
} mapped_range;

static pthread_mutex_t g_map_mu = PTHREAD_MUTEX_INITIALIZER;
static mapped_range *g_map;
static int32_t g_n_map, g_cap_map;

static void map_add(void *ptr, size_t bytes) {
    void *d = NULL;
    if (cudaHostGetDevicePointer(&d, ptr, 0) != cudaSuccess || !d) {
        (void)cudaGetLastError();
        return; /* page-locked but not addressable: its copies stay cudaMemcpyAsync */
    }
    pthread_mutex_lock(&g_map_mu);
    if (g_n_map == g_cap_map) {
        const int32_t cap = g_cap_map ? 2 * g_cap_map : 16;
        mapped_range *m = (mapped_range *)realloc(g_map, sizeof *m * (size_t)cap);
        if (!m) {
            pthread_mutex_unlock(&g_map_mu);
            return;
        }
        g_map = m;
        g_cap_map = cap;
    }
    g_map[g_n_map++] = mapped_range{(uintptr_t)ptr, (uintptr_t)d, bytes};
    pthread_mutex_unlock(&g_map_mu);
}

static void map_remove(void *ptr) {
    pthread_mutex_lock(&g_map_mu);
    for (int32_t i = 0; i < g_n_map; i++)
        if (g_map[i].host == (uintptr_t)ptr) {
            g_map[i] = g_map[--g_n_map];
            break;
        }
    pthread_mutex_unlock(&g_map_mu);
}

/* The device address of host bytes [p, p + n) when one registered range holds them all, else 0. Under
 * g_map_mu. */
static uintptr_t map_find(const void *p, size_t n) {
    const uintptr_t a = (uintptr_t)p;
    for (int32_t i = 0; i < g_n_map; i++)
        if (a >= g_map[i].host && n <= g_map[i].bytes && a - g_map[i].host <= g_map[i].bytes - n)
            return g_map[i].dev + (a - g_map[i].host);
    return 0;
}

osp_status osp_cuda_host_register(void *ptr, size_t bytes) {
    /* mapped as well as locked, so osp_cuda_copy_many's kernel can read and write it in place */
    cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    bool mapped = e == cudaSuccess;
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        e = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return osp_set_error(OSP_ERR_NOMEM, "cuda: cannot page-lock %.1f MiB of host memory: %s", (double)bytes / 1048576.0,
                             cudaGetErrorString(e));
    }
    if (mapped) map_add(ptr, bytes);
    return OSP_OK;
}

void osp_cuda_host_unregister(void *ptr) {
    if (!ptr) return;
    map_remove(ptr);
    (void)cudaHostUnregister(ptr);
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

/* ---- many small copies in one kernel ------------------------------------------------------------- */

typedef struct copy_seg {
    const uint8_t *src;
    uint8_t *dst;
    unsigned long long bytes;
} copy_seg;

/* One CTA a segment (grid-stride over them): 16-byte words when both ends and the length allow, four in
 * flight a thread (reads of host memory cross PCIe: the latency wants many outstanding), bytes otherwise. */
__global__ void __launch_bounds__(256) copy_many_kernel(const copy_seg *segs, int32_t n) {
    for (int32_t s = blockIdx.x; s < n; s += gridDim.x) {
        const copy_seg g = segs[s];
        const unsigned bd = blockDim.x;
        if ((((uintptr_t)g.src | (uintptr_t)g.dst | (uintptr_t)g.bytes) & 15) == 0) {
            const uint4 *src = (const uint4 *)g.src;
            uint4 *dst = (uint4 *)g.dst;
            const size_t n16 = (size_t)(g.bytes / 16);
            size_t i = threadIdx.x;
            for (; i + 3 * (size_t)bd < n16; i += 4 * (size_t)bd) {
                const uint4 a = src[i], b = src[i + bd], c = src[i + 2 * (size_t)bd], d = src[i + 3 * (size_t)bd];
                dst[i] = a;
                dst[i + bd] = b;
                dst[i + 2 * (size_t)bd] = c;
                dst[i + 3 * (size_t)bd] = d;
            }
            for (; i < n16; i += bd) dst[i] = src[i];
        } else {
            for (size_t i = threadIdx.x; i < (size_t)g.bytes; i += bd) g.dst[i] = g.src[i];
        }
    }
}

/* The descriptors' buffers (pinned host, device), grown as needed; under g_copy_mu, which also keeps one
 * osp_cuda_copy_many at a time (the descriptors live until its kernel is done). */
static pthread_mutex_t g_copy_mu = PTHREAD_MUTEX_INITIALIZER;
static copy_seg *g_seg_host, *g_seg_dev;
static int32_t g_seg_cap;

static bool copy_kernel_enabled(void) {
    static const bool on = [] {
        const char *e = getenv("OSPREY_CUDA_COPY_KERNEL");
        return !(e && strcmp(e, "0") == 0);
    }();
    return on;
}

/* g_seg_host / g_seg_dev hold at least n descriptors; under g_copy_mu. */
static osp_status ensure_segs(int32_t n) {
    if (n <= g_seg_cap) return OSP_OK;
    int32_t cap = g_seg_cap ? g_seg_cap : 1024;
    while (cap < n) cap = cap > INT32_MAX / 2 ? n : 2 * cap;
    if (g_seg_host) (void)cudaFreeHost(g_seg_host);
    if (g_seg_dev) (void)cudaFree(g_seg_dev);
    g_seg_host = g_seg_dev = NULL;
    g_seg_cap = 0;
    OSP_CUDA_TRY(cudaMallocHost((void **)&g_seg_host, sizeof(copy_seg) * (size_t)cap));
    OSP_CUDA_TRY(cudaMalloc((void **)&g_seg_dev, sizeof(copy_seg) * (size_t)cap));
    g_seg_cap = cap;
    return OSP_OK;
}

/* Enqueues the kernel over g_seg_host[0..m) on st (m > 0); under g_copy_mu. */
static osp_status launch_segs(int32_t m, cudaStream_t st) {
    OSP_CUDA_TRY(cudaMemcpyAsync(g_seg_dev, g_seg_host, sizeof(copy_seg) * (size_t)m, cudaMemcpyHostToDevice, st));
    static int sms = 0; /* the device's SM count, asked once (under g_copy_mu) */
    if (!sms) {
        int dev = 0;
        OSP_CUDA_TRY(cudaGetDevice(&dev));
        OSP_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    }
    const int grid = m < 8 * sms ? m : 8 * sms;
    copy_many_kernel<<<grid, 256, 0, st>>>(g_seg_dev, m);
    OSP_CUDA_LAUNCH_CHECK("copy_many_kernel");
    return OSP_OK;
}

/* The kernel path: false (nothing enqueued) when some host side is outside the mapped ranges. */
static osp_status copy_many_kernel_path(bool to_host, int32_t n, void *const *dst, const void *const *src,
                                        const size_t *bytes, cudaStream_t st, bool *done) {
    *done = false;
    OSP_TRY(ensure_segs(n));
    pthread_mutex_lock(&g_map_mu);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        if (bytes[i] == 0) continue;
        const uintptr_t h = map_find(to_host ? dst[i] : src[i], bytes[i]);
        if (!h) {
            pthread_mutex_unlock(&g_map_mu);
            return OSP_OK;
        }
        g_seg_host[m].src = to_host ? (const uint8_t *)src[i] : (const uint8_t *)h;
        g_seg_host[m].dst = to_host ? (uint8_t *)h : (uint8_t *)dst[i];
        g_seg_host[m].bytes = bytes[i];
        m++;
    }
    pthread_mutex_unlock(&g_map_mu);
    *done = true;
    if (m == 0) return OSP_OK;
    return launch_segs(m, st);
}

osp_status osp_cuda_copy_many(bool to_host, int32_t n, void *const *dst, const void *const *src, const size_t *bytes,
                              void *stream) {
    if (n < 0 || (n > 0 && (!dst || !src || !bytes)))
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_copy_many: %d copies without their arrays", n);
    cudaStream_t st = (cudaStream_t)stream;
    pthread_mutex_lock(&g_copy_mu);
    bool done = false;
    osp_status s = copy_kernel_enabled() && n > 0 ? copy_many_kernel_path(to_host, n, dst, src, bytes, st, &done) : OSP_OK;
    for (int32_t i = 0; s == OSP_OK && !done && i < n; i++)
        s = to_host ? osp_cuda_d2h(dst[i], src[i], bytes[i], stream) : osp_cuda_h2d(dst[i], src[i], bytes[i], stream);
    if (s == OSP_OK) s = osp_cuda_stream_sync(stream);
    pthread_mutex_unlock(&g_copy_mu);
    return s;
}

osp_status osp_cuda_copy_many_d2d(int32_t n, void *const *dst, const void *const *src, const size_t *bytes,
                                  void *stream) {
    if (n < 0 || (n > 0 && (!dst || !src || !bytes)))
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_copy_many_d2d: %d copies without their arrays", n);
    cudaStream_t st = (cudaStream_t)stream;
    pthread_mutex_lock(&g_copy_mu);
    osp_status s = OSP_OK;
    if (copy_kernel_enabled() && n > 0) {
        s = ensure_segs(n);
        int32_t m = 0;
        for (int32_t i = 0; s == OSP_OK && i < n; i++) {
            if (bytes[i] == 0) continue;
            g_seg_host[m++] = copy_seg{(const uint8_t *)src[i], (uint8_t *)dst[i], (unsigned long long)bytes[i]};
        }
        if (s == OSP_OK && m > 0) s = launch_segs(m, st);
    } else {
        for (int32_t i = 0; s == OSP_OK && i < n; i++) s = osp_cuda_d2d(dst[i], src[i], bytes[i], stream);
    }
    if (s == OSP_OK) s = osp_cuda_stream_sync(stream);
    pthread_mutex_unlock(&g_copy_mu);
    return s;
}

osp_status osp_cuda_device_uuid(uint8_t uuid[OSP_CUDA_UUID_BYTES]) {
    int dev = 0;
    OSP_CUDA_TRY(cudaGetDevice(&dev));
    cudaDeviceProp p;
    OSP_CUDA_TRY(cudaGetDeviceProperties(&p, dev));
    static_assert(sizeof p.uuid == OSP_CUDA_UUID_BYTES, "cudaUUID_t is 16 bytes");
    memcpy(uuid, &p.uuid, OSP_CUDA_UUID_BYTES);
    return OSP_OK;
}

osp_status osp_cuda_ipc_handle(void *d_ptr, uint8_t handle[OSP_CUDA_IPC_HANDLE_BYTES]) {
    cudaIpcMemHandle_t h;
    static_assert(sizeof h == OSP_CUDA_IPC_HANDLE_BYTES, "cudaIpcMemHandle_t is 64 bytes");
    OSP_CUDA_TRY(cudaIpcGetMemHandle(&h, d_ptr));
    memcpy(handle, &h, sizeof h);
    return OSP_OK;
}

osp_status osp_cuda_ipc_open(const uint8_t handle[OSP_CUDA_IPC_HANDLE_BYTES], void **d_ptr) {
    *d_ptr = NULL;
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof h);
    const cudaError_t e = cudaIpcOpenMemHandle(d_ptr, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        *d_ptr = NULL;
        (void)cudaGetLastError();
        return osp_set_error(OSP_ERR_INTERNAL, "cuda: cannot map the producer's KV arena (cudaIpcOpenMemHandle): %s",
                             cudaGetErrorString(e));
    }
    return OSP_OK;
}

void osp_cuda_ipc_close(void *d_ptr) {
    if (d_ptr && cudaIpcCloseMemHandle(d_ptr) != cudaSuccess) (void)cudaGetLastError();
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
