/* Backend selection by device (see backend.h). */
#include "backend/backend.h"

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
