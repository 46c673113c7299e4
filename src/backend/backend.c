/* Backend selection by device (see backend.h). */
#include "backend/backend.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/status_internal.h"

osp_status osp_backend_create(osp_device device, const osp_backend_params *p, osp_backend **out) {
    *out = NULL;
    osp_status s;
    switch (device) {
    case OSP_DEVICE_CPU: s = osp_backend_cpu_create(p, out); break;
    case OSP_DEVICE_CUDA: s = osp_backend_cuda_create(p, out); break;
    default: return osp_set_error(OSP_ERR_INVALID_ARG, "backend: unknown device %d", (int)device);
    }
    if (s == OSP_OK) (*out)->refs = 1;
    return s;
}

void osp_backend_retain(osp_backend *be) {
    if (be) be->refs++;
}

void osp_backend_free(osp_backend *be) {
    if (be && --be->refs == 0) be->vt->free(be);
}

int osp_backend_device_count(osp_device device) {
    return device == OSP_DEVICE_CPU ? 1 : device == OSP_DEVICE_CUDA ? osp_backend_cuda_device_count() : 0;
}

osp_status osp_backend_gemm_peak_gflops(osp_device d, double *gflops) {
    if (!gflops) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_backend_gemm_peak_gflops: NULL");
    *gflops = 0.0;
    if (d == OSP_DEVICE_CUDA) return osp_backend_cuda_gemm_peak_gflops(gflops);
    return osp_set_error(OSP_ERR_UNSUPPORTED, "backend: no GEMM peak measurement for device %d (time its matmul op)", (int)d);
}

osp_status osp_backend_device_info(osp_device d, osp_device_info *out) {
    if (!out) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_backend_device_info: NULL");
    memset(out, 0, sizeof *out);
    if (d == OSP_DEVICE_CUDA) return osp_backend_cuda_device_info(out);
    if (d != OSP_DEVICE_CPU) return osp_set_error(OSP_ERR_INVALID_ARG, "backend: unknown device %d", (int)d);
    out->device = OSP_DEVICE_CPU;
    snprintf(out->name, sizeof out->name, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
                const char *v = strchr(line, ':') + 1;
                while (*v == ' ') v++;
                snprintf(out->name, sizeof out->name, "%.*s", (int)strcspn(v, "\n"), v);
                break;
            }
        fclose(f);
    }
#ifdef _SC_LEVEL3_CACHE_SIZE
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (l3 > 0) out->cache_bytes = (size_t)l3;
#endif
    return OSP_OK;
}
