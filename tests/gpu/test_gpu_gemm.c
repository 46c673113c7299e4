/* Batch invariance of the bf16 GEMM (src/backend/cuda/gemm.cu, cuBLASLt): a row of y = x w^T must have
 * the same bits whatever the number of rows T computed with it, because a request's rows are computed
 * in steps whose size depends on the rest of the batch (and on its prefix-cache hits). Checked on the
 * 8B model's shapes (q/k/v fused, o, gate/up fused, down) and a SmolLM2 one: the first rows of T =
 * 1, 2, 3, 8, 11, 16, 64, 256, 2048 against T = 2048's, bit for bit. OSPREY_CUDA_GEMM_LOG=1 prints the
 * algorithm, tile and split-K count cuBLASLt picked for each T. Skipped (77) without a CUDA device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cuda/cuda_ops.h"
#include "osprey/model.h"

static uint16_t bf16_of(uint32_t x) { /* a value in [-1, 1) as bf16 from a hash */
    x ^= x >> 16, x *= 0x7feb352d, x ^= x >> 15, x *= 0x846ca68b, x ^= x >> 16;
    const float f = (float)(int32_t)(x >> 8) / 8388608.0f - 1.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

#define TMAX 2048

static void check_shape(int64_t N, int64_t K) {
    static const int64_t Ts[] = {1, 2, 3, 8, 11, 16, 64, 256};
    void *stream = NULL, *dx = NULL, *dw = NULL, *dy = NULL;
    assert_int_equal(osp_cuda_stream_create(&stream), OSP_OK);
    uint16_t *x = malloc(sizeof *x * (size_t)(TMAX * K)), *w = malloc(sizeof *w * (size_t)(N * K));
    float *ref = malloc(sizeof *ref * (size_t)(TMAX * N)), *got = malloc(sizeof *got * (size_t)(256 * N));
    assert_true(x && w && ref && got);
    for (int64_t i = 0; i < TMAX * K; i++) x[i] = bf16_of((uint32_t)i * 2u + 1u);
    for (int64_t i = 0; i < N * K; i++) w[i] = bf16_of((uint32_t)i * 2u);
    assert_int_equal(osp_cuda_malloc(&dx, sizeof *x * (size_t)(TMAX * K), "x"), OSP_OK);
    assert_int_equal(osp_cuda_malloc(&dw, sizeof *w * (size_t)(N * K), "w"), OSP_OK);
    assert_int_equal(osp_cuda_malloc(&dy, sizeof *ref * (size_t)(TMAX * N), "y"), OSP_OK);
    assert_int_equal(osp_cuda_h2d(dx, x, sizeof *x * (size_t)(TMAX * K), stream), OSP_OK);
    assert_int_equal(osp_cuda_h2d(dw, w, sizeof *w * (size_t)(N * K), stream), OSP_OK);
    osp_cuda_gemm *g = NULL;
    const char *wsmb = getenv("OSPREY_CUDA_GEMM_WS_MB"); /* the backend's knob: room for split-K partials */
    assert_int_equal(osp_cuda_gemm_create(wsmb && atoi(wsmb) > 0 ? (size_t)atoi(wsmb) << 20 : 32u << 20, &g), OSP_OK);
    assert_int_equal(osp_cuda_gemm_bf16(g, dx, dw, dy, true, TMAX, N, K, stream), OSP_OK);
    assert_int_equal(osp_cuda_d2h(ref, dy, sizeof *ref * (size_t)(TMAX * N), stream), OSP_OK);
    assert_int_equal(osp_cuda_stream_sync(stream), OSP_OK);
    int bad = 0;
    for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++) {
        const int64_t T = Ts[t];
        assert_int_equal(osp_cuda_gemm_bf16(g, dx, dw, dy, true, T, N, K, stream), OSP_OK);
        assert_int_equal(osp_cuda_d2h(got, dy, sizeof *got * (size_t)(T * N), stream), OSP_OK);
        assert_int_equal(osp_cuda_stream_sync(stream), OSP_OK);
        int64_t diff = 0;
        for (int64_t i = 0; i < T * N; i++) diff += memcmp(&got[i], &ref[i], 4) != 0;
        if (diff) {
            fprintf(stderr, "N %lld K %lld: T = %lld gives %lld of %lld values other bits than T = %d\n", (long long)N,
                    (long long)K, (long long)T, (long long)diff, (long long)(T * N), TMAX);
            bad++;
        }
    }
    osp_cuda_gemm_destroy(g);
    osp_cuda_free(dx);
    osp_cuda_free(dw);
    osp_cuda_free(dy);
    free(x), free(w), free(ref), free(got);
    assert_int_equal(bad, 0);
}

static void test_8b_qkv(void **state) { (void)state, check_shape(6144, 4096); }
static void test_8b_o(void **state) { (void)state, check_shape(4096, 4096); }
static void test_8b_gate_up(void **state) { (void)state, check_shape(28672, 4096); }
static void test_8b_down(void **state) { (void)state, check_shape(4096, 14336); }
static void test_smollm2_gate_up(void **state) { (void)state, check_shape(3072, 576); }

int main(void) {
    if (osp_device_count(OSP_DEVICE_CUDA) == 0) {
        printf("test_gpu_gemm: skipped: no CUDA device\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_8b_qkv),     cmocka_unit_test(test_8b_o),           cmocka_unit_test(test_8b_gate_up),
        cmocka_unit_test(test_8b_down),    cmocka_unit_test(test_smollm2_gate_up),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
