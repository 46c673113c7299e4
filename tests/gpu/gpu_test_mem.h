/* Host and device buffers for the GPU kernel tests (test_gpu_kv_quant, test_gpu_qmatmul): allocations
 * that fail the test instead of returning NULL, device buffers filled with a byte (0xff: NaN poison),
 * copies to and from the device that wait for it. Header-only, static; include after <cmocka.h> and
 * backend/cuda/cuda_ops.h. */
#ifndef OSPREY_TESTS_GPU_GPU_TEST_MEM_H
#define OSPREY_TESTS_GPU_GPU_TEST_MEM_H

#include <stdlib.h>

static void *xmalloc(size_t n) {
    void *p = malloc(n > 0 ? n : 1);
    assert_non_null(p);
    return p;
}
static void *dev_alloc_fill(size_t n, int byte) {
    void *d = NULL;
    assert_int_equal(osp_cuda_malloc(&d, n > 0 ? n : 16, "test buffer"), OSP_OK);
    assert_int_equal(osp_cuda_memset(d, byte, n > 0 ? n : 16, NULL), OSP_OK);
    return d;
}
static void *dev_put(const void *h, size_t n) {
    void *d = dev_alloc_fill(n, 0);
    if (n) assert_int_equal(osp_cuda_h2d(d, h, n, NULL), OSP_OK);
    return d;
}
static void dev_get(void *h, const void *d, size_t n) {
    assert_int_equal(osp_cuda_d2h(h, d, n, NULL), OSP_OK);
    assert_int_equal(osp_cuda_stream_sync(NULL), OSP_OK);
}

#endif
