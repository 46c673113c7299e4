/* The CUDA runtime interface when osprey is built without CUDA (OSPREY_CUDA off: no nvcc). Device
 * count 0, every other call OSP_ERR_UNSUPPORTED, so callers need no #ifdef. CMakeLists.txt leaves this
 * file out of CUDA builds (runtime.cu and the kernels define these names there). */
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_sample.h"
#include "core/status_internal.h"

#define NO_CUDA osp_set_error(OSP_ERR_UNSUPPORTED, "this osprey was built without CUDA (nvcc not found)")

bool osp_cuda_built(void) { return false; }
int osp_cuda_device_count(void) { return 0; }
osp_status osp_cuda_device_name(char *buf, size_t n) {
    if (buf && n) buf[0] = '\0';
    return NO_CUDA;
}
osp_status osp_cuda_mem_info(size_t *f, size_t *t) {
    *f = *t = 0;
    return NO_CUDA;
}
osp_status osp_cuda_malloc(void **p, size_t b, const char *w) {
    *p = NULL;
    return NO_CUDA;
}
void osp_cuda_free(void *p) {}
osp_status osp_cuda_host_alloc(void **p, size_t b, const char *w) {
    *p = NULL;
    return NO_CUDA;
}
void osp_cuda_host_free(void *p) {}
osp_status osp_cuda_stream_create(void **s) {
    *s = NULL;
    return NO_CUDA;
}
void osp_cuda_stream_destroy(void *s) {}
osp_status osp_cuda_stream_sync(void *s) { return NO_CUDA; }
osp_status osp_cuda_h2d(void *d, const void *s, size_t b, void *st) { return NO_CUDA; }
osp_status osp_cuda_d2h(void *d, const void *s, size_t b, void *st) { return NO_CUDA; }
osp_status osp_cuda_d2d(void *d, const void *s, size_t b, void *st) { return NO_CUDA; }
osp_status osp_cuda_memset(void *d, int v, size_t b, void *st) { return NO_CUDA; }
osp_status osp_cuda_event_create(void **e) {
    *e = NULL;
    return NO_CUDA;
}
void osp_cuda_event_destroy(void *e) {}
osp_status osp_cuda_event_record(void *e, void *s) { return NO_CUDA; }
osp_status osp_cuda_event_elapsed_ms(void *a, void *b, float *ms) { return NO_CUDA; }
osp_status osp_cuda_graph_begin(void *s) { return NO_CUDA; }
osp_status osp_cuda_graph_end(void *s, void **g) {
    *g = NULL;
    return NO_CUDA;
}
osp_status osp_cuda_graph_launch(void *g, void *s) { return NO_CUDA; }
void osp_cuda_graph_destroy(void *g) {}
